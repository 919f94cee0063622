"""Kiln's layers (docs/architecture.md), checked from the code's own imports, module-level and
inside functions alike: platform < text < model (+ model.formats) < engine < the areas curator,
training, serving, evaluate (which never import each other) < the composition root."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kiln

PACKAGE = Path(kiln.__file__).parent
AREAS = ("curator", "training", "serving", "evaluate")
RANK = {"platform": 0, "text": 1, "model": 2, "engine": 3, **dict.fromkeys(AREAS, 4), "root": 5}
ROOT_MODULES = {"kiln", "kiln.__main__", "kiln.stages", "kiln.cli"}

# Known violations, each named (importer, imported); none left, and it only shrinks.
ALLOWED: set[tuple[str, str]] = set()


def layer(module: str) -> str:
    """The layer a `kiln...` module belongs to."""
    if module in ROOT_MODULES or module.startswith("kiln.pipelines"):
        return "root"
    part = module.split(".")[1]
    if part not in RANK:
        raise AssertionError(f"{module}: in no layer (add it to docs/architecture.md and here)")
    return part


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_path_module(text: str) -> str | None:
    """The module of a "kiln.x.y:attr" import path (a lazy export, a command's handler)."""
    module, sep, attr = text.partition(":")
    if sep and attr.isidentifier() and module.startswith("kiln.") and " " not in module:
        return module
    return None


def kiln_imports(path: Path) -> set[str]:
    """Every `kiln...` module `path` imports, wherever the import statement stands, and every
    module it names by import path ("kiln.x.y:attr") to import later."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(import_path_module(node.value) or "")
    return {m for m in found if m == "kiln" or m.startswith("kiln.")}


def function_local_imports(path: Path) -> list[str]:
    """`kiln` import statements inside function bodies: each hides a dependency from a reader
    (and from the Triton repository's vendoring), so there are none."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if not node.level else ["kiln"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(name.startswith("kiln") for name in names):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def allowed(importer: str, imported: str) -> bool:
    a, b = layer(importer), layer(imported)
    if a == b:
        return True
    if a == "root":
        return True
    if RANK[a] == RANK[b]:  # two areas
        return False
    return RANK[b] < RANK[a]


def violations() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        for imported in kiln_imports(path):
            if not allowed(importer, imported):
                found.add((importer, imported))
    return found


def test_every_import_respects_the_layers():
    found = violations()
    new = sorted(found - ALLOWED)
    assert not new, "imports that break the layers:\n" + "\n".join(f"{a} -> {b}" for a, b in new)


def test_the_allow_list_holds_no_fixed_violation():
    stale = sorted(ALLOWED - violations())
    assert not stale, "fixed: remove from ALLOWED:\n" + "\n".join(f"{a} -> {b}" for a, b in stale)


def test_the_checker_sees_a_breach(tmp_path):
    assert not allowed("kiln.model.transformer", "kiln.training.trainer")
    assert not allowed("kiln.training.stages", "kiln.serving.export.hf")
    assert not allowed("kiln.platform.registry", "kiln.text.tokenizer")
    assert allowed("kiln.engine.generator", "kiln.model.formats.weights")
    assert allowed("kiln.stages", "kiln.curator.stages")


def test_no_function_local_kiln_imports():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in function_local_imports(path)]
    assert not found, "kiln imports inside functions (hoist them):\n" + "\n".join(found)


def test_the_local_import_check_sees_one(tmp_path):
    hidden = PACKAGE / "training" / "_layers_probe.py"
    hidden.write_text("def f():\n    from kiln.model import Transformer\n    return Transformer\n")
    try:
        assert function_local_imports(hidden) == ["kiln/training/_layers_probe.py:2"]
    finally:
        hidden.unlink()


def test_import_paths_count_as_imports():
    assert import_path_module("kiln.curator.pipeline:curate") == "kiln.curator.pipeline"
    assert import_path_module("see kiln.area.commands:run") is None
    lazy = PACKAGE / "curator" / "__init__.py"
    assert "kiln.curator.pipeline" in kiln_imports(lazy)


def test_the_floor_loads_no_area():
    """`import kiln.model, kiln.model.formats, kiln.engine` runs no area's code."""
    code = (
        "import sys, kiln.model, kiln.model.formats, kiln.engine.engine, kiln.engine.generator; "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('kiln.')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    assert not loaded & set(AREAS), loaded
