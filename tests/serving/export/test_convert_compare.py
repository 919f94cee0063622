"""`kiln convert` between a Kiln checkpoint, an HF folder and a GGUF file, and `kiln
compare-models`: lossless conversions pass, a corrupted checkpoint (one matrix transposed, or
scaled) exits 1 naming the first layer that differs."""

from __future__ import annotations

import os

import pytest

from kiln.model.formats.weights import write_model_checkpoint
from kiln.platform.cli import main
from tests.engine.tiny import tiny_model, train_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny Llama (GQA, tied embeddings) as a Kiln checkpoint with its tokenizer beside it."""
    root = tmp_path_factory.mktemp("convert")
    tok = train_tokenizer()
    model = tiny_model("llama", tok.get_vocab_size())
    ckpt = str(root / "ckpt")
    write_model_checkpoint(ckpt, model.cfg, model.state_dict(), step=5)
    tok.save(os.path.join(ckpt, "tokenizer.json"))
    return ckpt, model


def _compare(a: str, b: str, capsys, *extra: str) -> tuple[int, str]:
    code = main(["compare-models", a, b, "--greedy-tokens", "4", *extra])
    return code, capsys.readouterr().out


def test_checkpoint_to_gguf_to_hf_to_checkpoint_compares_equal(source, tmp_path, capsys):
    ckpt, _ = source
    gguf = str(tmp_path / "m.gguf")
    assert main(["convert", ckpt, gguf, "--to", "gguf"]) == 0
    assert main(["convert", gguf, str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert os.path.exists(tmp_path / "hf" / "tokenizer.json")
    back = str(tmp_path / "back")
    assert main(["convert", str(tmp_path / "hf"), back, "--to", "checkpoint"]) == 0
    capsys.readouterr()
    for other in (gguf, str(tmp_path / "hf"), back):
        code, out = _compare(ckpt, other, capsys, "--tolerance", "1e-5")
        assert code == 0, out
        lines = out.splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "max logit diff",
            "mean logit diff",
            "top-1 agreement",
            "greedy text equal",
            "first layer differing",
        ]
        assert lines[2] == "top-1 agreement: 100.0%" and lines[3] == "greedy text equal: yes"
        assert lines[4] == "first layer differing: none"


@pytest.mark.parametrize(
    "corruption,layer",
    [("transposed", "layers.1.attention.wo.weight"), ("scaled", "layers.0.feed_forward.w2.weight")],
)
def test_corrupted_checkpoint_exits_non_zero_naming_the_layer(
    corruption, layer, source, tmp_path, capsys
):
    ckpt, model = source
    state = {k: v.clone() for k, v in model.state_dict().items()}
    weight = state[layer]  # wo is square: dim x (heads * head_dim)
    state[layer] = weight.T.contiguous() if corruption == "transposed" else weight * 1.5
    bad = str(tmp_path / "bad")
    write_model_checkpoint(bad, model.cfg, state)
    code, out = _compare(ckpt, bad, capsys, "--prompt", "hello world", "--tokenizer", ckpt)
    assert code == 1
    block = ".".join(layer.split(".")[:2])
    assert f"first layer differing: {block} (max hidden diff" in out
    assert float(out.splitlines()[0].split()[3]) > 1e-3  # "max logit diff: X (tolerance ..)"


def test_models_of_different_shapes_are_an_input_error(source, tmp_path, capsys):
    ckpt, model = source
    other = tiny_model("llama", model.cfg.vocab_size, n_layers=3)
    path = str(tmp_path / "other")
    write_model_checkpoint(path, other.cfg, other.state_dict())
    assert main(["compare-models", ckpt, path, "--tokenizer", ckpt]) == 2
    assert "n_layers" in capsys.readouterr().err
