"""Copy the part of kiln that generation needs (engine, model, weight formats, tokenizer, chat
template) into a folder.

A Triton model repository ships with that copy so its `model.py` runs without Ray, pandas or the
rest of the platform, and without kiln installed. The files are found by following every
`import kiln...` statement from the roots, at module level and inside functions (not under
`if TYPE_CHECKING:`); packages get an empty `__init__.py` unless something imports from the
package.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil

ROOTS = ("kiln.engine.generator",)  # it imports the engine, the model and its weight formats


def _module_file(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ModuleNotFoundError, ValueError):
        return None
    return spec.origin if spec and spec.origin and spec.origin.endswith(".py") else None


def _import_path_module(text: str) -> str:
    """The module of a "kiln.x.y:attr" import path; "" for any other string."""
    module, sep, attr = text.partition(":")
    return module if sep and attr.isidentifier() and module.startswith("kiln.") else ""


def kiln_imports(path: str, module: str) -> set[str]:
    """kiln modules `path` imports, anywhere in it but `if TYPE_CHECKING:` blocks."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(_import_path_module(node.value))  # lazy_exports' "module:attr"
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parent = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)  # submodules, if any
            else:  # function and class bodies, if/try/with/for blocks, ...
                visit(ast.iter_child_nodes(node))

    visit(tree.body)
    return {m for m in found if m == "kiln" or m.startswith("kiln.")}


def runtime_files(roots=ROOTS) -> dict[str, str]:
    """module name -> source file, for the import closure of `roots`."""
    files: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in files:
            continue
        path = _module_file(name)
        if path is None:
            continue  # an attribute, not a module
        files[name] = path
        todo.extend(kiln_imports(path, name))
        parts = name.split(".")
        for i in range(1, len(parts)):  # parent packages must exist; their __init__ stays empty
            files.setdefault(".".join(parts[:i]) + ".__pkg__", "")
    return files


def copy_runtime(dst: str, roots=ROOTS) -> list[str]:
    """Write the closure under `dst/kiln/...`; returns the relative paths written."""
    written = []
    files = runtime_files(roots)
    for name, src in sorted(files.items()):
        if name.endswith(".__pkg__"):
            pkg = name[: -len(".__pkg__")]
            if pkg in files:  # imported itself: its real __init__ is copied below
                continue
            rel = os.path.join(*pkg.split("."), "__init__.py")
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            open(os.path.join(dst, rel), "w").close()
        else:
            is_pkg = src.endswith("__init__.py")
            rel = (
                os.path.join(*name.split("."), "__init__.py")
                if is_pkg
                else os.path.join(*name.split(".")) + ".py"
            )
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copyfile(src, os.path.join(dst, rel))
        written.append(rel)
    return sorted(written)
