"""A bare install (`pip install -e .`, no extras) runs everything Kiln advertises.

The packages only an extra brings (pytest, transformers, peft, megatron, openai, schemathesis,
lm-eval, ...: every extra's requirements and what they pull in, minus what the base dependencies
pull in) are computed from pyproject.toml and the installed distributions. A child process hides
them (its import system finds them no more than an install without them would), then builds
every shipped pipeline and every command's `--help`; `kiln eval`, whose harness is the `eval`
extra, must stop with one line naming it. A static check finds any import of those packages
anywhere in kiln/, inside functions too, where a missing base dependency would hide until run.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PIPELINES = sorted((REPO / "kiln" / "pipelines").glob("*.yaml"))

# kiln modules allowed to import an extra's package, and the extra whose one-line error
# (kiln.platform.extras.require_extra) is raised before they run
GUARDED_EXTRA_IMPORTS = {
    "kiln/evaluate/harness_main.py": "eval",  # the child process `evaluate` starts after the check
    "kiln/curator/filters/japanese.py": "ja",  # fugashi imported after require_extra("ja", ...)
    "kiln/training/float8.py": "gpu",  # torchao, after the trainer's require_extra("gpu", ...)
}


def _closure(requirements: list[str]) -> set[str]:
    """Canonical names of the installed distributions these requirements pull in."""
    seen: set[str] = set()
    queue = [(Requirement(r), "") for r in requirements]
    while queue:
        req, via_extra = queue.pop()
        if req.marker and not req.marker.evaluate({"extra": via_extra}):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (the gpu extra on a CPU machine)
        first_visit = name not in seen
        seen.add(name)
        for extra in [""] + sorted(req.extras) if first_visit else sorted(req.extras):
            queue += [(Requirement(r), extra) for r in dist.requires or []]
    return seen


def extra_only_modules() -> dict[str, str]:
    """Top-level import names whose every distribution only an extra installs, each with the
    folder it is installed in (a library may vendor its own copy elsewhere: Ray's colorama)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _closure(project["dependencies"])
    extras = _closure([r for reqs in project["optional-dependencies"].values() for r in reqs])
    only_extra = extras - base
    # pip installs the extras into this environment's site-packages; a copy a library vendors
    # (Ray's colorama in ray/thirdparty_files, on sys.path once ray is imported) stays visible
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    return {
        module: site
        for module, dists in metadata.packages_distributions().items()
        if all(canonicalize_name(d) in only_extra for d in dists)
    }


def test_the_extras_own_the_test_packages_and_the_base_owns_what_kiln_runs():
    hidden = extra_only_modules()
    for name in ("pytest", "transformers", "peft", "megatron", "openai", "schemathesis", "lm_eval"):
        assert name in hidden, name
    # the quickstart's GGUF reader and what every stage imports stay importable
    for name in ("gguf", "torch", "ray", "numpy", "tokenizers", "yaml", "pydantic", "fasttext"):
        assert name not in hidden, name


def _imported_top_level_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_kiln_imports_no_extra_package_outside_a_guarded_module():
    hidden = set(extra_only_modules())
    found = {}
    for path in sorted((REPO / "kiln").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        names = _imported_top_level_names(ast.parse(path.read_text(), rel)) & hidden
        if names:
            found[rel] = sorted(names)
    unguarded = {rel: names for rel, names in found.items() if rel not in GUARDED_EXTRA_IMPORTS}
    assert not unguarded, (
        f"a bare install cannot import these (make them base or guard them): {unguarded}"
    )
    assert set(found) == set(GUARDED_EXTRA_IMPORTS), "a guarded module no longer imports an extra"


PROBE = r"""
import contextlib, importlib.machinery, io, json, os, sys
hidden = json.loads(sys.argv[1])  # top-level name -> the folder its extra installed it in

class WithoutExtras(importlib.machinery.PathFinder):
    # the path finder, blind to the extras' packages: find_spec None, import ModuleNotFoundError
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = super().find_spec(name, path, target)
        if spec is not None and name in hidden:
            places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
            where = os.path.join(hidden[name], name)
            if any(os.path.realpath(p).startswith(where) for p in places):
                return None
        return spec

sys.meta_path[:] = [
    WithoutExtras if f is importlib.machinery.PathFinder else f for f in sys.meta_path
]
report = {"pipelines": {}, "commands": [], "failures": []}
try:
    import transformers  # noqa: F401
    report["failures"].append("transformers still importable: the probe hides nothing")
except ModuleNotFoundError:
    pass

from kiln.platform.extras import MissingExtraError
from kiln.platform.spec import load_pipeline

for path in sys.argv[2:]:
    try:
        pipeline = load_pipeline(path)
        report["pipelines"][os.path.basename(path)] = [type(s).__name__ for s in pipeline.stages]
    except MissingExtraError as e:
        report["pipelines"][os.path.basename(path)] = f"extra: {e}"
    except Exception as e:
        report["failures"].append(f"{path}: {type(e).__name__}: {e}")

import argparse
from kiln.platform.cli import build_parser, main

def commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action._name_parser_map.items():  # choices may be a custom set
                yield (*prefix, name)
                yield from commands(sub, (*prefix, name))

parser = build_parser()
for command in commands(parser):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            parser.parse_args([*command, "--help"])
    except SystemExit as e:
        if e.code != 0:
            report["failures"].append(f"kiln {' '.join(command)} --help exited {e.code}")
    except Exception as e:
        report["failures"].append(f"kiln {' '.join(command)} --help: {type(e).__name__}: {e}")
    report["commands"].append(" ".join(command))

err = io.StringIO()
eval_out = os.environ["PROBE_EVAL_OUT"]
with contextlib.redirect_stderr(err):
    report["eval_rc"] = main(["eval", "model", "--url", "http://127.0.0.1:9", "--out", eval_out])
report["eval_stderr"] = err.getvalue()
report["eval_out_created"] = os.path.exists(eval_out)
print("PROBE " + json.dumps(report))
"""


@pytest.mark.slow  # a child process importing torch and Ray's modules (~10 s)
def test_every_pipeline_and_command_loads_without_the_extras(tmp_path):
    hidden = extra_only_modules()
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(hidden), *map(str, PIPELINES)],
        cwd=REPO,  # the shipped specs name their data relative to the repository
        env={**os.environ, "PROBE_EVAL_OUT": str(tmp_path / "eval")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    report = json.loads(lines[-1].removeprefix("PROBE "))
    assert report["failures"] == []
    assert set(report["pipelines"]) == {p.name for p in PIPELINES}
    for name, stages in report["pipelines"].items():
        if name == "evaluate_smollm2.yaml":  # lm-eval is the `eval` extra: one line naming it
            assert stages.startswith("extra: ") and "evaluate.tasks" in stages
            assert "kiln[eval]" in stages
        else:
            assert isinstance(stages, list) and stages, name
    assert {"run", "serve", "import-hf", "eval", "train", "curate"} <= set(report["commands"])
    # `kiln eval` stops before any work: one line, exit 2, no results folder
    assert report["eval_rc"] == 2
    assert report["eval_stderr"].count("\n") == 1 and "kiln[eval]" in report["eval_stderr"]
    assert not report["eval_out_created"]
