"""The export stage and `kiln export`: a checkpoint (+ tokenizer) -> hf/ and triton/."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from kiln.model.formats.weights import write_model_checkpoint
from kiln.platform.artifact import Artifact
from kiln.platform.stage import StageContext
from kiln.serving.export.stages import ExportStage
from tests.engine.tiny import tiny_model, train_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")


@pytest.fixture(scope="module")
def checkpoint_and_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    tok = train_tokenizer()
    (root / "tokenizer").mkdir()
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    model = tiny_model("mistral", tok.get_vocab_size())
    write_model_checkpoint(str(root / "ckpt"), model.cfg.model_dump(), model.state_dict(), step=7)
    return str(root / "ckpt"), str(root / "tokenizer")


def test_export_stage_writes_hf_and_triton(checkpoint_and_tokenizer, tmp_path):
    ckpt, tokenizer = checkpoint_and_tokenizer
    stage = ExportStage(
        {"model_name": "tiny", "triton": {"max_batch_size": 2, "instance_kind": "KIND_GPU"}}
    )
    out = Artifact(str(tmp_path / "model"), "ExportedModel")
    os.makedirs(out.path)
    ctx = StageContext(
        stage=stage,
        run_dir=tmp_path,
        stage_dir=tmp_path,
        inputs={
            "checkpoint": Artifact(ckpt, "Checkpoint"),
            "tokenizer": Artifact(tokenizer, "Tokenizer"),
        },
        outputs={"model": out},
        runtime=None,
        log=logging.getLogger("test"),
    )
    metrics = stage.run(ctx)
    assert metrics["parameters"] == out.counts["parameters"] > 0
    assert out.meta["architecture"] == "MistralForCausalLM" and out.meta["model_name"] == "tiny"
    config = json.loads(Path(out.path, "hf", "config.json").read_text())
    assert config["sliding_window"] == 5
    pbtxt = Path(out.path, "triton", "tiny", "config.pbtxt").read_text()
    assert "max_batch_size: 2" in pbtxt and "KIND_GPU" in pbtxt
    assert Path(out.path, "triton", "tiny", "1", "model.py").exists()


def test_kiln_export_cli(checkpoint_and_tokenizer, tmp_path, capsys):
    from kiln.engine.generator import Generator
    from kiln.platform.cli import main

    ckpt, tokenizer = checkpoint_and_tokenizer
    out = str(tmp_path / "out")
    assert (
        main(
            [
                "export",
                ckpt,
                "--format",
                "hf",
                "--out",
                out,
                "--tokenizer",
                tokenizer,
                "--model-name",
                "m1",
            ]
        )
        == 0
    )
    assert sorted(os.listdir(out)) == ["hf"]
    assert (
        Generator.load(out).model_name == "m1"
    )  # an ExportedModel dir, as the serve stage passes it

    assert main(["export", ckpt, "--format", "onnx", "--out", out]) == 2
    assert "--format" in capsys.readouterr().err
    # text in, text out: Triton needs a tokenizer (none sits next to this checkpoint)
    assert main(["export", ckpt, "--format", "triton", "--out", str(tmp_path / "t")]) == 2
    assert "tokenizer" in capsys.readouterr().err


def test_kiln_export_cli_writes_gguf_from_a_kiln_checkpoint(tmp_path, capsys):
    from kiln.model.formats.gguf import read_gguf
    from kiln.model.formats.gguf_tokenizer import build_tokenizer
    from kiln.platform.cli import main

    tok = train_tokenizer()
    tok.save(str(tmp_path / "tokenizer.json"))
    model = tiny_model("llama", tok.get_vocab_size())
    ckpt = str(tmp_path / "ckpt")
    write_model_checkpoint(ckpt, model.cfg.model_dump(), model.state_dict(), step=3)
    out = str(tmp_path / "out")
    argv = ["export", ckpt, "--format", "gguf", "--gguf-type", "f32", "--out", out]
    assert main([*argv, "--tokenizer", str(tmp_path), "--model-name", "m1"]) == 0
    assert "gguf file: " in capsys.readouterr().out
    assert os.listdir(out) == ["gguf"] and os.listdir(os.path.join(out, "gguf")) == ["m1.f32.gguf"]
    cfg, state, meta = read_gguf(os.path.join(out, "gguf", "m1.f32.gguf"))
    assert (cfg.n_layers, cfg.dim, cfg.n_kv_heads) == (
        model.cfg.n_layers,
        model.cfg.dim,
        model.cfg.n_kv_heads,
    )
    for name, weight in model.state_dict().items():
        assert state[name].equal(weight), name
    assert build_tokenizer(meta).encode("hello kiln").ids == tok.encode("hello kiln").ids


def test_gguf_export_of_a_sliding_window_model_names_the_field(
    checkpoint_and_tokenizer, tmp_path, capsys
):
    from kiln.platform.cli import main

    ckpt, tokenizer = checkpoint_and_tokenizer  # Mistral-shaped, sliding_window 5
    argv = ["export", ckpt, "--format", "gguf", "--out", str(tmp_path / "o")]
    assert main([*argv, "--tokenizer", tokenizer]) == 2
    assert "sliding_window" in capsys.readouterr().err
