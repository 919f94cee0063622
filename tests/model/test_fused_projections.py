"""model.fused_projections: wq/wk/wv as one `wqkv` and w1/w3 as one `w13`, fused in memory only.
The same seed gives the same weights, loss and gradients (by unfused name) as the unfused model;
state dicts, kiln checkpoints and HF/GGUF exports keep the unfused names and bytes."""

from __future__ import annotations

import os

import pytest
import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.checkpoint import read_checkpoint, write_checkpoint
from kiln.model.formats.weights import build_model
from kiln.model.fused_projections import Fusion, fused_modules, split_entries, to_shard_blocks
from kiln.model.lora import LoRAConfig, apply_lora
from kiln.model.transformer import Transformer
from kiln.platform.errors import ConfigError
from kiln.serving.export.gguf import export_gguf
from kiln.serving.export.hf import export_hf
from kiln.training.config import TrainConfig
from kiln.training.plan import cpu_stand_in, plan_rank
from kiln.training.stages import continue_from_model
from tests.training.parallel._trainer_cases import DEEPSEEK, GEMMA3, QWEN3

SHAPES = {
    "llama_gqa": {},
    "qwen2_bias": {"qkv_bias": True},
    "qwen3_qk_norm": QWEN3,
    "gemma3": GEMMA3,
    "deepseek_mla_moe_mtp": {**DEEPSEEK, "mtp_depth": 1},
}


def _pair(shape: dict, **extra) -> tuple[Transformer, Transformer]:
    """(unfused, fused) models of one shape, each built from seed 0."""
    models = []
    for fused in (False, True):
        torch.manual_seed(0)
        cfg = ModelConfig.preset("tiny", n_layers=2, fused_projections=fused, **shape, **extra)
        models.append(Transformer(cfg))
    return models[0], models[1]


def unfused_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient under its unfused name (fused ones split into row blocks)."""
    grads = {name: p.grad for name, p in model.named_parameters()}
    for name, module in fused_modules(model).items():
        split_entries(grads, module.fusion, [f"{name}.{{}}.weight", f"{name}.{{}}.bias"])
    return grads


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_same_seed_same_weights_loss_and_gradients(shape):
    plain, fused = _pair(shape)
    names = dict(fused.named_modules())
    mla = "mla" in shape
    assert ("layers.0.attention.wqkv" in names) is not mla  # MLA attention stays unfused
    assert "layers.0.feed_forward.w13" in names and "layers.0.feed_forward.w1" not in names
    want, got = plain.state_dict(), fused.state_dict()
    assert list(got) == list(want)  # same names, in the same order
    for name in want:
        assert torch.equal(got[name], want[name]), name

    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (plain, fused):
        loss = model(tokens[:, :-1], labels=tokens[:, 1:], mtp_labels=tokens[:, 1:])
        if model.mtp_loss is not None:
            loss = loss + model.mtp_loss
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) <= 1e-6
    want, got = unfused_grads(plain), unfused_grads(fused)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=0, msg=name)


def test_state_dicts_load_across_layouts():
    plain, fused = _pair({"qkv_bias": True})
    with torch.no_grad():  # different weights from the fused model's
        for p in plain.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    tokens = torch.randint(0, 256, (2, 16))
    fused.load_state_dict(plain.state_dict())  # strict: every fused entry found
    torch.testing.assert_close(fused(tokens), plain(tokens), atol=1e-6, rtol=0)
    other, _ = _pair({"qkv_bias": True})
    other.load_state_dict(fused.state_dict())
    for name, value in plain.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name


def test_checkpoint_saved_fused_loads_unfused_and_the_reverse(tmp_path):
    plain, fused = _pair({"qkv_bias": True})
    path = write_checkpoint(str(tmp_path / "fused"), fused)
    cfg, state = read_checkpoint(path)
    assert not cfg.fused_projections  # the checkpoint records the shape, not the layout
    assert list(state) == list(plain.state_dict())
    tokens = torch.randint(0, 256, (2, 16))
    unfused = build_model(cfg, state, device="cpu")
    torch.testing.assert_close(unfused(tokens), plain.eval()(tokens), atol=1e-6, rtol=0)

    path = write_checkpoint(str(tmp_path / "plain"), plain)
    cfg, state = read_checkpoint(path)
    refused = build_model(cfg.model_copy(update={"fused_projections": True}), state, device="cpu")
    assert "layers.0.attention.wqkv" in dict(refused.named_modules())
    torch.testing.assert_close(refused(tokens), plain(tokens), atol=1e-6, rtol=0)


def test_continued_run_takes_its_own_layout(tmp_path):
    """A checkpoint records the shape; a run continuing from it fuses or not as it says."""
    _, fused = _pair({})
    path = write_checkpoint(str(tmp_path / "ckpt"), fused)
    for wanted in (False, True):
        cfg = TrainConfig(model={"preset": "tiny", "fused_projections": wanted}, seq_len=64)
        assert continue_from_model(cfg, path).model.fused_projections is wanted


def _files(folder: str) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}


@pytest.mark.parametrize("shape", [{"qkv_bias": True}, GEMMA3], ids=["qwen2", "gemma3"])
def test_hf_and_gguf_exports_are_byte_identical(tmp_path, shape):
    plain, fused = _pair(shape)
    export_hf(plain, str(tmp_path / "plain"))
    export_hf(fused, str(tmp_path / "fused"))
    want, got = _files(str(tmp_path / "plain")), _files(str(tmp_path / "fused"))
    assert "model.safetensors" in want and got == want
    if "qkv_bias" in shape:  # a llama-architecture GGUF (Gemma's is not written)
        export_gguf(plain, str(tmp_path / "plain.gguf"))
        export_gguf(fused, str(tmp_path / "fused.gguf"))
        plain_gguf = (tmp_path / "plain.gguf").read_bytes()
        assert (tmp_path / "fused.gguf").read_bytes() == plain_gguf


def test_shard_blocks_give_each_rank_its_parts_rows():
    """Under tp=2 the rows [q; k; v] become [q_0; k_0; v_0; q_1; k_1; v_1]: a plain row split in
    halves gives rank r its own heads' q, k and v; splitting the blocked rows gives the parts."""
    q, k, v = torch.arange(8.0), 10 + torch.arange(4.0), 20 + torch.arange(4.0)
    fusion = Fusion("wqkv", ("wq", "wk", "wv"), (8, 4, 4), shards=2)
    blocked = to_shard_blocks(torch.cat([q, k, v]), fusion)
    rank0, rank1 = blocked.chunk(2)
    assert torch.equal(rank0, torch.cat([q[:4], k[:2], v[:2]]))
    assert torch.equal(rank1, torch.cat([q[4:], k[2:], v[2:]]))
    assert [p.tolist() for p in rank1.split(list(fusion.block_sizes))] == [
        q[4:].tolist(),
        k[2:].tolist(),
        v[2:].tolist(),
    ]
    state = {"wqkv.weight": torch.stack([blocked, -blocked], dim=1)}  # 2-D: rows move whole
    split_entries(state, fusion, ["{}.weight"])
    assert list(state) == ["wq.weight", "wk.weight", "wv.weight"]
    for name, part in zip(("wq", "wk", "wv"), (q, k, v), strict=True):
        assert torch.equal(state[f"{name}.weight"], torch.stack([part, -part], dim=1)), name


def test_refused_with_lora():
    _, fused = _pair({})
    with pytest.raises(ConfigError, match="lora with model.fused_projections"):
        apply_lora(fused, LoRAConfig(rank=2))


def _plan(parallel: dict, **model) -> dict:
    cfg = TrainConfig(model={"preset": "tiny", "n_layers": 2, **model}, parallel=parallel)
    return plan_rank(cpu_stand_in(cfg.model_copy(update={"seq_len": 32})), 0, 2)


def test_tensor_parallel_refusals_on_fake_ranks():
    """tp > 1 builds fused (tp=2 on PyTorch's fake ranks); what it still refuses: fewer KV heads
    than ranks, as unfused (no KV-head replication either way), and a feed-forward hidden size
    the ranks do not divide (each rank's block holds 1/tp of gate and of up)."""
    assert _plan({"tp": 2}, fused_projections=True)["local_params"] > 0
    for fused in (False, True):
        with pytest.raises(ConfigError, match=r"parallel.tp=2 must divide .*n_kv_heads \(1\)"):
            _plan({"tp": 2}, n_kv_heads=1, fused_projections=fused)
    with pytest.raises(ConfigError, match=r"feed_forward's w1/w3 \(65, 65\) .*fused_projections"):
        _plan({"tp": 2}, ffn_hidden_dim=65, fused_projections=True)
