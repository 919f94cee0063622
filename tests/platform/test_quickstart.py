"""The quickstart: its SDK twin builds the same pipeline, and the whole pipeline (fewer steps) runs
as a Ray job through `kiln submit` on a real local head node, leaving every promised file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kiln.pipelines.quickstart import build
from kiln.platform.spec import load_pipeline
from tests.conftest import free_port
from tests.platform.headnode import BIN, HeadNode

REPO = Path(__file__).resolve().parents[2]
SPEC = "kiln/pipelines/quickstart.yaml"


def test_sdk_twin_equals_the_yaml(tmp_path):
    from_yaml = load_pipeline(REPO / SPEC, runs_dir=str(tmp_path))
    from_sdk = build()
    assert [s.name for s in from_sdk.stages] == [s.name for s in from_yaml.stages]
    for a, b in zip(from_sdk.stages, from_yaml.stages, strict=False):
        assert type(a) is type(b)
        assert a.config.model_dump() == b.config.model_dump(), a.name
    assert from_sdk.wiring == from_yaml.wiring


@pytest.mark.slow
def test_quickstart_runs_through_kiln_submit_on_a_head_node(tmp_path):
    runs = tmp_path / "runs"
    overrides = [
        "train.steps=4",
        "train.checkpoint.interval_steps=2",
        "train.log_every=1",
        f"serve.port={free_port()}",
        "complete.max_tokens=8",
    ]
    cmd = [str(BIN / "kiln"), "submit", SPEC, "--wait", "--runs-dir", str(runs)]
    for o in overrides:
        cmd += ["--set", o]
    with HeadNode(num_cpus=8) as head:
        out = subprocess.run(
            check=False,
            args=[*cmd, "--address", head.dashboard_url],
            cwd=REPO,
            env=head.env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    (run_dir,) = [p for p in (runs / "quickstart").iterdir() if not p.name.startswith(".")]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert all(s["status"] == "done" for s in record["stages"].values()), record["stages"]
    report = json.loads((run_dir / "curate" / "corpus" / "report.json").read_text())
    assert report["documents_in"] == report["kept"] + report["rejected"]
    for path in (
        "curate/corpus/funnel.png",
        "train/loss.png",
        "train/checkpoint/latest",
        "export/model/hf/config.json",
        "export/model/hf/model.safetensors",
        "export/model/triton/kiln-quickstart/config.pbtxt",
    ):
        assert (run_dir / path).exists(), path
    steps = sorted(p.name for p in (run_dir / "train" / "checkpoint").glob("step-*"))
    assert steps == ["step-00000002", "step-00000004"]
    completions = json.loads(
        (run_dir / "complete" / "completions" / "completions.json").read_text()
    )
    assert [c["prompt"] for c in completions] == ["The Python language", "Pythonは"]
    assert "The Python language" in out.stdout  # the completion was printed in the job's log
