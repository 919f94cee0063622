"""Kiln's layers (docs/architecture.md), checked from the code's own imports, module-level and
inside functions alike: platform < text < model (+ model.formats) < engine < the areas curator,
training, serving, evaluate (which never import each other) < the composition root."""

from __future__ import annotations

import ast
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


def kiln_imports(path: Path) -> set[str]:
    """Every `kiln...` module `path` imports, wherever the import statement stands."""
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
    return {m for m in found if m == "kiln" or m.startswith("kiln.")}


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
