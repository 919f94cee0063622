"""Adapter-only LoRA checkpoints: a fraction of the base's size, resume gives the uninterrupted
run's losses, export merges the adapters onto the referenced base, a changed base is refused."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from kiln.model.lora import merged_state_dict
from kiln.platform.errors import InputError
from kiln.training.post.trainer import PostTrainer
from tests.training.post.test_post_trainer import _cfg, data  # noqa: F401 (fixture)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")


def _size(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def _losses(trainer: PostTrainer) -> list[float]:
    return [m["loss"] for m in trainer.train()]


def _wide_base(root: str) -> str:
    """A base whose weights outweigh the fixed part of a checkpoint (optimizer groups, RNG)."""
    from kiln.model.formats.weights import write_model_checkpoint
    from kiln.serving.export.hf import export_hf
    from tests.engine.tiny import tiny_model
    from tests.training.post.lora_helpers import VOCAB

    model = tiny_model("llama", VOCAB, dim=256, ffn_hidden_dim=512, n_heads=4, n_kv_heads=2)
    write_model_checkpoint(f"{root}/ckpt", model.cfg.model_dump(), model.state_dict())
    export_hf(f"{root}/ckpt", f"{root}/hf")
    return f"{root}/hf"


@pytest.mark.slow
def test_adapter_checkpoint_is_small_resumes_and_exports(data, tmp_path):  # noqa: F811
    from kiln.model.formats.checkpoint import read_sidecar, resolve
    from kiln.model.formats.weights import read_weights

    data = {**data, "hf": _wide_base(str(tmp_path))}
    ckpt = str(tmp_path / "ck")
    torch.manual_seed(0)
    whole = _losses(PostTrainer(_cfg(data, steps=3)))
    torch.manual_seed(0)
    first = _losses(PostTrainer(_cfg(data, steps=1, checkpoint={"dir": ckpt})))
    step_dir = resolve(ckpt)
    base_bytes = os.path.getsize(os.path.join(data["hf"], "model.safetensors"))
    assert _size(step_dir) < base_bytes / 4  # adapters + their Adam moments, no base weights
    ref = read_sidecar(step_dir)["adapter_only"]
    assert ref["base"] == os.path.abspath(data["hf"]) and len(ref["base_sha256"]) == 64

    resumed = PostTrainer(_cfg(data, steps=3, checkpoint={"dir": ckpt}))
    assert first + _losses(resumed) == pytest.approx(whole, abs=1e-6)

    # export (read_weights of the checkpoint) = the referenced base with the adapters merged
    trained = {k: v.detach() for k, v in resumed.model_parts[0].state_dict().items()}
    _, _, exported = read_weights(ckpt)
    expected = merged_state_dict(trained, resumed.cfg.lora.scaling)
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)


def test_adapter_checkpoint_refuses_another_base(data, tmp_path):  # noqa: F811
    from safetensors.torch import load_file, save_file

    base = str(tmp_path / "base")
    shutil.copytree(data["hf"], base)
    ckpt = str(tmp_path / "ck")
    PostTrainer(_cfg(data, base=base, steps=1, checkpoint={"dir": ckpt})).train()
    weights = os.path.join(base, "model.safetensors")
    state = load_file(weights)
    first = next(iter(state))
    state[first] = state[first] + 1.0
    save_file(state, weights, {"format": "pt"})
    from kiln.training.post import adapter_checkpoint

    adapter_checkpoint.base_fingerprint.cache_clear()
    with pytest.raises(InputError, match="trained on base"):
        PostTrainer(_cfg(data, base=base, steps=2, checkpoint={"dir": ckpt})).setup()
