"""deploy/: every manifest parses, has the fields KubeRay / Kubernetes require, and names real
kiln commands, specs and Serve import paths."""

from __future__ import annotations

import importlib
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kiln.platform.cli import build_parser
from kiln.platform.imports import import_object

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _check_pod_template(template: dict, where: str) -> None:
    containers = template["spec"]["containers"]
    assert containers, f"{where}: no containers"
    for c in containers:
        assert c.get("name") and c.get("image"), f"{where}: container needs name and image"
    mounts = {m["name"] for c in containers for m in c.get("volumeMounts", [])}
    volumes = {v["name"] for v in template["spec"].get("volumes", [])}
    assert mounts <= volumes, f"{where}: volumeMounts {mounts - volumes} have no volume"


def _check_ray_cluster_spec(spec: dict, where: str) -> None:
    head = spec["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict)
    _check_pod_template(head["template"], f"{where}.headGroupSpec")
    for group in spec.get("workerGroupSpecs", []):
        assert group["groupName"] and isinstance(group["rayStartParams"], dict)
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
        _check_pod_template(group["template"], f"{where}.{group['groupName']}")


def _check_kiln_command(command: str) -> None:
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "kiln"], command
    args = build_parser().parse_args(argv[3:])
    assert callable(import_object(args.handler))
    if argv[3] == "run":
        from kiln.platform.spec import load_pipeline

        spec = REPO / args.spec
        assert spec.is_file(), f"{args.spec} does not exist"
        load_pipeline(spec, args.overrides)  # every stage and field of the spec is valid


def _meta(doc: dict, api: str, kind: str) -> None:
    assert doc["apiVersion"] == api and doc["kind"] == kind and doc["metadata"]["name"]


def test_raycluster():
    (doc,) = _docs(DEPLOY / "kuberay" / "raycluster.yaml")
    _meta(doc, "ray.io/v1", "RayCluster")
    _check_ray_cluster_spec(doc["spec"], "RayCluster")


def test_rayjob_runs_a_real_pipeline():
    (doc,) = _docs(DEPLOY / "kuberay" / "rayjob-pretrain.yaml")
    _meta(doc, "ray.io/v1", "RayJob")
    _check_ray_cluster_spec(doc["spec"]["rayClusterSpec"], "RayJob")
    _check_kiln_command(doc["spec"]["entrypoint"])


def test_rayservice_import_path_builds_the_app():
    (doc,) = _docs(DEPLOY / "kuberay" / "rayservice.yaml")
    _meta(doc, "ray.io/v1", "RayService")
    _check_ray_cluster_spec(doc["spec"]["rayClusterConfig"], "RayService")
    serve_cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
    for app in serve_cfg["applications"]:
        module, _, attr = app["import_path"].partition(":")
        builder = getattr(importlib.import_module(module), attr)
        assert builder(app.get("args", {})) is not None  # binds the deployment; loads no model


def test_triton_deployment_and_service():
    deployment, service = _docs(DEPLOY / "triton" / "triton.yaml")
    _meta(deployment, "apps/v1", "Deployment")
    _meta(service, "v1", "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    _check_pod_template(deployment["spec"]["template"], "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert any(a.startswith("--model-repository=") for a in container["args"])
    named = {p["name"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= named


def test_dockerfile_installs_the_gpu_extra_and_runs_kiln():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1)
    assert base.startswith("nvcr.io/nvidia/pytorch:") and "FROM ${BASE_IMAGE}" in text
    assert "requirements.py --cuda-major 13" in text and "--no-deps -e ." in text
    cmd = [line for line in text.splitlines() if line.startswith("CMD")][-1]
    assert '"kiln"' in cmd


def test_dockerfile_keeps_the_images_torch_and_it_fits_pyproject():
    """The base image's torch (a label) is inside pyproject's range; pip never installs torch,
    numpy, Transformer Engine or flash-attn over the image's builds; the gpu extra comes along."""
    sys.path.insert(0, str(DEPLOY / "docker"))
    try:
        import requirements as image_reqs
    finally:
        sys.path.pop(0)
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    torch_label = re.search(r'kiln\.base\.torch="([^"]+)"', text).group(1)
    owned = set(image_reqs.IMAGE_OWNED)
    everything = {"torch": torch_label, **{name: "1" for name in owned - {"torch"}}}
    assert image_reqs.check_image(everything) == []
    too_old = {**everything, "torch": "2.11.0a0+nv26.01"}  # a base image older than the pin
    assert image_reqs.check_image(too_old) == [
        f"torch 2.11.0a0+nv26.01 is outside kiln's range {image_reqs.torch_range()}"
    ]
    reqs = image_reqs.image_requirements(cuda_major=13)
    names = {image_reqs.requirement_name(r) for r in reqs}
    assert not names & owned
    assert {"ray", "cudf-cu13", "dask-cudf-cu13", "dask-cuda", "cugraph-cu13"} <= names
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"torch{image_reqs.torch_range()}" in pyproject["dependencies"]


@pytest.mark.parametrize(
    "spec", sorted((REPO / "kiln" / "pipelines").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_pipelines_load(spec):
    from kiln.platform.spec import load_pipeline

    load_pipeline(spec)
