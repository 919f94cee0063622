"""The export stage's `quantize`: the Triton model carries it (its model.py quantizes as it
loads); a format list without triton is told where quantization lives instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kiln.engine.generator import Generator
from kiln.model.formats.weights import write_model_checkpoint
from kiln.model.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear
from kiln.platform.errors import ConfigError
from kiln.serving.export.stages import ExportConfig, export_model
from tests.engine.tiny import tiny_model, train_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("export-q")
    tok = train_tokenizer()
    model = tiny_model("llama", tok.get_vocab_size())
    ckpt = str(root / "ckpt")
    write_model_checkpoint(ckpt, model.cfg.model_dump(), model.state_dict(), step=1)
    tok.save(str(root / "ckpt" / "tokenizer.json"))
    return ckpt


def _parameters(pbtxt: str) -> dict[str, str]:
    pairs = re.findall(r'key: "([^"]+)" value: \{ string_value: "([^"]*)" \}', pbtxt)
    return dict(pairs)


def test_triton_export_carries_quantize_to_the_model_it_loads(checkpoint, tmp_path):
    cfg = ExportConfig(formats=["triton"], model_name="tiny", quantize="int4", check_tokens=0)
    export_model(checkpoint, str(tmp_path / "out"), cfg)
    model_dir = tmp_path / "out" / "triton" / "tiny"
    params = _parameters((model_dir / "config.pbtxt").read_text())
    assert params["quantize"] == "int4" and params["quantize_group_size"] == "32"
    assert params["dtype"] == "float32"  # the files keep their dtype
    # as model.py loads it
    gen = Generator.load(
        str(model_dir / "1" / "hf"),
        quantize=params["quantize"] or None,
        quantize_group_size=int(params["quantize_group_size"]),
    )
    layers = [m for m in gen.model.modules() if isinstance(m, Int4WeightOnlyLinear)]
    assert len(layers) == 2 * 7  # 2 blocks x (q, k, v, o, w1, w2, w3)
    assert isinstance(gen.model.output, Int8WeightOnlyLinear)  # int4's head stays at 8 bits
    assert Path(model_dir, "1", "runtime", "kiln", "model", "quantize.py").exists()
    [completion] = gen.generate(["the quick brown fox"])
    assert completion.completion_tokens > 0


def test_quantize_without_a_format_that_carries_it_names_the_field(checkpoint, tmp_path):
    cfg = ExportConfig(formats=["hf", "gguf"], quantize="int8")
    with pytest.raises(ConfigError, match="export.quantize: int8 is carried by the triton format"):
        export_model(checkpoint, str(tmp_path / "out"), cfg)
