"""Print the pip requirements kiln needs on top of an NGC PyTorch image, one per line.

The image owns torch, numpy, Transformer Engine and flash-attn (NVIDIA builds them together and
pins them in /etc/pip/constraint.txt): they are left out, so pip never replaces them. RAPIDS comes
as the wheels of the image's CUDA major (`-cu13` on CUDA 13). nvidia-pytriton is left out: it pins
numpy < 2 and Triton runs in its own image (deploy/triton).

    python deploy/docker/requirements.py --cuda-major 13 > /tmp/kiln-requirements.txt
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import tomllib
from pathlib import Path

IMAGE_OWNED = {"torch", "numpy", "transformer-engine", "flash-attn"}
LEFT_OUT = {"nvidia-pytriton"}
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement string."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def image_requirements(pyproject: Path = PYPROJECT, cuda_major: int = 13) -> list[str]:
    """kiln's runtime dependencies and `gpu` extra, minus what the image owns."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["gpu"]]
    out = []
    for req in wanted:
        base = requirement_name(req)
        if base in IMAGE_OWNED or base in LEFT_OUT:
            continue
        out.append(re.sub(r"-cu\d+", f"-cu{cuda_major}", req))
    return out


def torch_range(pyproject: Path = PYPROJECT) -> str:
    """The version range kiln's pyproject gives torch (e.g. '>=2.13,<2.15')."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    spec = next(d for d in deps if requirement_name(d) == "torch")
    return spec[len("torch") :].strip()


def check_image(installed: dict[str, str], pyproject: Path = PYPROJECT) -> list[str]:
    """Problems with the image's own packages (`installed`: distribution -> version)."""
    from packaging.specifiers import SpecifierSet

    problems = []
    torch = installed.get("torch")
    allowed = SpecifierSet(torch_range(pyproject))
    # NGC's torch is a pre-release build of the next version (2.14.0a0+...nv26.08)
    if torch is None or not allowed.contains(torch.split("+")[0], prereleases=True):
        problems.append(f"torch {torch} is outside kiln's range {torch_range(pyproject)}")
    problems += [f"{name} is missing" for name in IMAGE_OWNED - {"torch"} if name not in installed]
    return problems


def _installed() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in IMAGE_OWNED:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda-major", type=int, default=13)
    parser.add_argument("--check", action="store_true", help="check the image's own packages")
    args = parser.parse_args(argv)
    if args.check:
        problems = check_image(_installed())
        print("\n".join(problems) or f"image packages fit kiln: {_installed()}")
        return 1 if problems else 0
    else:
        print("\n".join(image_requirements(cuda_major=args.cuda_major)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
