"""The serve stage with the triton backend: a real tritonserver over the exported repository,
reached over gRPC from the Serve replica; REST answers equal in-process generation."""

from __future__ import annotations

import shutil

import httpx
import pytest

pytestmark = pytest.mark.slow  # a tritonserver process behind a Serve replica


@pytest.fixture
def exported_model(tiny_model_dir, tmp_path) -> str:
    """An ExportedModel artifact: hf/ plus a Triton repository triton/tiny."""
    from kiln.platform.artifact import Artifact
    from kiln.serving.export.triton import export_triton

    root = tmp_path / "exported"
    shutil.copytree(tiny_model_dir, root / "hf")
    export_triton(tiny_model_dir, str(root / "triton"), model_name="tiny", torch_threads=1)
    Artifact(uri=str(root), kind="ExportedModel").commit()
    return str(root)


def test_serve_stage_triton_backend(endpoint, exported_model, generator, tmp_path):
    import openai

    from kiln.engine.sampler import SamplingParams
    from kiln.platform.artifact import Artifact
    from kiln.platform.pipeline import Pipeline
    from kiln.serving import launch as rest_launch
    from kiln.serving.stages import ServeStage

    stage = ServeStage(
        name="serve",
        inputs={"model": exported_model},
        backend="triton",
        app_name="triton-test",
        route_prefix="/triton",
        deployment={"num_cpus": 0.5},
    )
    try:
        result = Pipeline("serve-test", [stage], runs_dir=tmp_path / "runs").run(shutdown=False)
        art = Artifact.load(result.artifact("serve.endpoint").uri)
        assert art.kind == "Endpoint" and art.meta["backend"] == "triton"
        url = art.meta["url"]
        assert url.endswith("/triton") and art.meta["model"] == "tiny"

        prompts = ["the quick brown fox", "a kiln fires clay"]
        expected = [c.text for c in generator.generate(prompts, SamplingParams(max_new_tokens=8))]
        with openai.OpenAI(
            base_url=art.meta["openai_base_url"], api_key="unused", max_retries=0
        ) as client:
            r = client.completions.create(model="tiny", prompt=prompts, max_tokens=8, temperature=0)
        assert [c.text for c in r.choices] == expected
        assert r.usage.completion_tokens == sum(
            len(c.token_ids) for c in generator.generate(prompts, SamplingParams(max_new_tokens=8))
        )

        body = {
            "inputs": [
                {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompts[0]]}
            ],
            "parameters": {"max_tokens": 8},
        }
        r = httpx.post(f"{url}/v2/models/tiny/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == expected[:1]
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
    finally:
        rest_launch.stop("triton-test")
    assert "triton-test" not in rest_launch.RUNNING
