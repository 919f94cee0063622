"""DeepSeek-V3's multi-token prediction (mtp_depth D): the modules' loss equals a hand-written
computation from the same weights (on sequences cut short, not shifted and masked as the model
does), the main model's output and init are untouched by them, `kiln plan`'s counts include
them, and Hugging Face export/import carries them as DeepSeek's `model.layers.{L + k}`."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from kiln.model.config import ModelConfig
from kiln.model.formats.hf import read_hf_dir, write_hf_dir
from kiln.model.formats.weights import build_model
from kiln.model.transformer import Transformer
from kiln.training.metrics import flops_per_token
from tests.training.parallel._trainer_cases import DEEPSEEK

VOCAB = 96


def _cfg(depth: int, **overrides) -> ModelConfig:
    return ModelConfig.preset(
        "tiny", vocab_size=VOCAB, n_layers=2, mtp_depth=depth, **{**DEEPSEEK, **overrides}
    )


def _batch(seq: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (2, seq + 1), generator=g)
    labels = tokens[:, 1:].clone()
    labels[0, 4] = labels[1, 9] = -100  # ignored targets stay ignored at every depth
    return tokens[:, :-1], labels


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


def _reference_mtp_loss(model: Transformer, tokens: torch.Tensor, labels: torch.Tensor):
    """DeepSeek-V3's equations, written out: depth k sees positions 0..S-1-k only."""
    cos, sin = model.rope_cos, model.rope_sin
    h = model.tok_embeddings(tokens)
    for layer in model.layers.values():
        h = layer(h, cos, sin)
    h = _rms(h, model.norm)
    losses = []
    for k, module in enumerate(model.mtp, start=1):
        n = tokens.shape[1] - k
        e = _rms(model.tok_embeddings(tokens[:, k:]), module.enorm)
        x = module.eh_proj(torch.cat([e, _rms(h[:, :n], module.hnorm)], dim=-1))
        h = _rms(module.block(x, cos, sin), module.norm)
        logits = h @ model.output.weight.T
        target = labels[:, k:]
        losses.append(F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1)))
    return torch.stack(losses).mean()


@torch.no_grad()
def _perturb(model: Transformer) -> Transformer:
    """Norm weights away from 1 (a norm applied twice would show) and a real router bias."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.uniform_(0.5, 1.5)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.uniform_(-0.3, 0.3)
    return model


@pytest.mark.parametrize("depth", [1, 2])
def test_mtp_loss_equals_the_written_out_equations(depth):
    torch.manual_seed(0)
    model = _perturb(Transformer(_cfg(depth)))
    tokens, labels = _batch()
    main = model(tokens, labels=labels, mtp_labels=labels, loss_chunk_tokens=7)
    want = _reference_mtp_loss(model, tokens, labels)
    assert model.mtp_loss.item() == pytest.approx(want.item(), abs=1e-5)
    # the gradients of the modules' loss reach the main model's weights, as in the paper
    model.mtp_loss.backward()
    assert copy.deepcopy(model).mtp_loss == model.mtp_loss  # a copy keeps the value only
    assert model.layers["0"].attention.wkv_a.weight.grad.abs().sum() > 0
    assert model.mtp[depth - 1].eh_proj.weight.grad.abs().sum() > 0
    # the return value is the main model's loss, the same as a model without MTP
    plain = Transformer(_cfg(0))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "mtp." not in k})
    assert torch.equal(main, plain(tokens, labels=labels, loss_chunk_tokens=7))


def test_mtp_leaves_the_main_model_bit_identical():
    """The modules draw their init after the output head: the main weights, the logits and the
    loss of a depth-2 model are those of depth 0, bit for bit; without mtp_labels no MTP runs."""
    torch.manual_seed(0)
    plain = Transformer(_cfg(0))
    torch.manual_seed(0)
    mtp = Transformer(_cfg(2))
    extra = {k for k in mtp.state_dict() if k.startswith("mtp.")}
    assert set(mtp.state_dict()) - extra == set(plain.state_dict()) and extra
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, mtp.state_dict()[name]), name
    tokens, labels = _batch()
    assert torch.equal(plain(tokens), mtp(tokens)) and mtp.mtp_loss is None
    assert torch.equal(
        F.cross_entropy(plain(tokens).flatten(0, 1), labels.flatten()),
        F.cross_entropy(mtp(tokens).flatten(0, 1), labels.flatten()),
    )


def test_plan_counts_the_mtp_modules():
    """num_params (what `kiln plan` and the FLOP count read) counts each module's block,
    norms and projection once, the shared embedding and head not again."""
    cfg = _cfg(2)
    assert sum(p.numel() for p in Transformer(cfg).parameters()) == cfg.num_params()
    assert flops_per_token(cfg, 32) > flops_per_token(_cfg(0), 32)
    # DeepSeek-V3's one MTP module: "14B" beside the 671B main model (the paper's 685B), its
    # checkpoint's own copies of the embedding and head included
    main = ModelConfig.preset("deepseek_v3")
    full = main.model_copy(update={"mtp_depth": 1})
    copies = 2 * full.vocab_size * full.dim
    assert 13e9 < full.num_params() - main.num_params() + copies < 14.5e9


def test_hf_export_and_import_keep_the_mtp_weights(tmp_path):
    """kiln -> HF writes DeepSeek's names and num_nextn_predict_layers; HF -> kiln gives back
    every tensor; HF -> kiln -> HF the same bytes; transformers loads the folder (skipping
    the MTP layers) with the main model's logits; serving builds the main model alone."""
    from transformers import AutoModelForCausalLM

    cfg = _cfg(2, rope_scaling=None)
    torch.manual_seed(0)
    model = _perturb(Transformer(cfg))
    state = model.state_dict()
    out = str(tmp_path / "hf")
    write_hf_dir(cfg, state, out)
    with open(f"{out}/config.json") as f:
        assert json.load(f)["num_nextn_predict_layers"] == 2
    hf_state = load_file(f"{out}/model.safetensors")
    for k in (2, 3):  # n_layers + k
        for own in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head"):
            assert f"model.layers.{k}.{own}.weight" in hf_state
        assert f"model.layers.{k}.mlp.experts.3.down_proj.weight" in hf_state
        assert torch.equal(
            hf_state[f"model.layers.{k}.embed_tokens.weight"], state["tok_embeddings.weight"]
        )
    assert torch.equal(hf_state["model.layers.3.eh_proj.weight"], state["mtp.1.eh_proj.weight"])
    assert torch.equal(
        hf_state["model.layers.2.shared_head.norm.weight"], state["mtp.0.norm.weight"]
    )

    _, back_cfg, back = read_hf_dir(out)
    assert back_cfg.mtp_depth == 2
    assert sorted(back) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(tensor, back[name]), name
    again = str(tmp_path / "again")
    write_hf_dir(back_cfg, back, again)
    twice = load_file(f"{again}/model.safetensors")
    assert sorted(twice) == sorted(hf_state)
    assert all(torch.equal(hf_state[k], twice[k]) for k in hf_state)

    served = build_model(back_cfg, back, device="cpu")
    assert served.mtp is None and served.cfg.mtp_depth == 0
    hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens, _ = _batch()
    with torch.no_grad():
        want = hf(tokens).logits
        assert torch.allclose(served(tokens), want, atol=1e-4)
        assert torch.allclose(model.eval()(tokens), want, atol=1e-4)


def test_other_architectures_export_the_main_model_alone(tmp_path):
    cfg = ModelConfig.preset("tiny", vocab_size=VOCAB, n_layers=2, mtp_depth=1)
    model = Transformer(cfg)
    write_hf_dir(cfg, model.state_dict(), str(tmp_path))
    names = load_file(f"{tmp_path}/model.safetensors")
    assert (
        not any(".layers.2." in n for n in names) and "model.layers.1.mlp.up_proj.weight" in names
    )


def test_imported_mtp_modules_continue_training(tmp_path):
    """`kiln import-hf` of a DeepSeek-V3 folder with MTP layers writes a checkpoint that holds
    them, and `train` from it (init_from) starts from those weights and trains them."""
    from kiln.model.formats.weights import import_model, read_weights
    from kiln.training.config import TrainConfig
    from kiln.training.trainer import Trainer

    cfg = _cfg(1, rope_scaling=None)
    torch.manual_seed(0)
    state = _perturb(Transformer(cfg)).state_dict()
    write_hf_dir(cfg, state, str(tmp_path / "hf"))
    step_dir = import_model(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    _, got_cfg, got = read_weights(step_dir)
    assert got_cfg.mtp_depth == 1 and sorted(got) == sorted(state)
    assert all(torch.equal(state[k], got[k]) for k in state)
    train = TrainConfig(
        model=got_cfg.model_dump(),
        checkpoint={"init_from": step_dir},
        seq_len=16,
        global_batch_size=2,
        micro_batch_size=2,
        steps=1,
        device="cpu",
        precision="fp32",
        data={"synthetic": True, "prefetch": 0},
    )
    trainer = Trainer(train).setup()
    loaded = trainer.model_parts[0].state_dict()
    assert torch.equal(loaded["mtp.0.eh_proj.weight"], state["mtp.0.eh_proj.weight"])
    (metrics,) = trainer.train()
    assert metrics["mtp_loss"] > 0
    assert not torch.equal(
        trainer.model_parts[0].mtp[0].eh_proj.weight, state["mtp.0.eh_proj.weight"]
    )
