"""The kiln copy a Triton model repository ships imports with nothing else on the path: every
module model.py needs is in it, found from the real imports (inside functions too)."""

from __future__ import annotations

import os
import subprocess
import sys

from kiln.serving.export import runtime, triton

MODEL_PY = triton.TRITON_MODEL_PY


def test_vendored_runtime_imports_alone(tmp_path):
    roots = sorted(runtime.kiln_imports(MODEL_PY, "kiln.serving.triton.model"))
    assert "kiln.engine" in roots and "kiln.text.chat_template" in roots
    written = runtime.copy_runtime(str(tmp_path), roots=roots)
    assert os.path.join("kiln", "model", "formats", "weights.py") in written
    assert not any(p.startswith(os.path.join("kiln", "training")) for p in written)
    modules = [
        p[: -len(".py")].replace(os.sep, ".").removesuffix(".__init__")
        for p in written
        if p.endswith(".py")
    ]
    code = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import kiln\n"
        f"assert kiln.__file__.startswith({str(tmp_path)!r}), kiln.__file__\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(len(sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
