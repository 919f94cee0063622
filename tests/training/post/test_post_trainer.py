"""SFT and DPO on the trainer: LoRA trains adapters only, DPO's precomputed reference equals the
adapters-disabled one, FSDP (dp_shard=2) equals one process, unsupported layouts are refused."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

from kiln.platform.errors import ConfigError
from kiln.training.data.config import DataConfig
from kiln.training.post.config import PostTrainConfig
from kiln.training.post.prepare import prepare_chat, prepare_preference
from kiln.training.post.run import train_post
from kiln.training.post.trainer import PostTrainer
from tests.training.distributed import run_distributed
from tests.training.post.helpers import chat_tokenizer
from tests.training.post.lora_helpers import export_base

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")
SEQ = 64


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny base model (HF export), a packed SFT set and a preference set."""
    root = tmp_path_factory.mktemp("post")
    _, hf = export_base(str(root))
    sft = [{"prompt": f"what is fact {i}?", "response": f"fact {i} is paris"} for i in range(20)]
    pref = [
        {"prompt": f"what is fact {i}?", "chosen": f"fact {i} is paris", "rejected": f"{i} tokyo"}
        for i in range(16)
    ]
    for name, rows in (("sft", sft), ("pref", pref)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = chat_tokenizer()
    prepare_chat(root / "sft.jsonl", root / "chat", tokenizer=tok, seq_len=SEQ)
    prepare_preference(root / "pref.jsonl", root / "pref", tokenizer=tok, seq_len=SEQ)
    return {"hf": hf, "chat": str(root / "chat"), "pref": str(root / "pref")}


def _cfg(data, objective="sft", **over) -> PostTrainConfig:
    fields = {
        "objective": objective,
        "base": data["hf"],
        "lora": {"rank": 4, "alpha": 8},
        "seq_len": SEQ,
        "global_batch_size": 4,
        "micro_batch_size": 2,
        "steps": 4,
        "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
        "schedule": {"kind": "constant"},
        "data": DataConfig(paths=[data["chat" if objective == "sft" else "pref"]]),
        "device": "cpu",
        **over,
    }
    return PostTrainConfig(**fields)


def test_lora_sft_trains_only_adapters_on_the_base(data, tmp_path):
    from kiln.model.formats.weights import read_weights

    trainer = PostTrainer(_cfg(data, checkpoint={"dir": str(tmp_path / "ck"), "interval_steps": 2}))
    history = trainer.train()
    assert history[-1]["loss"] < history[0]["loss"] - 0.5
    _, _, base = read_weights(data["hf"])
    state = trainer.model_parts[0].state_dict()
    adapters = [k for k in state if k.endswith(("lora_a", "lora_b"))]
    assert len(adapters) == 2 * 7 * 2  # 2 layers x 7 linears x (A, B)
    for name, tensor in base.items():  # frozen base: bit-identical after training
        assert torch.equal(state[name], tensor), name
    # a resumed run continues from the checkpoint with the adapters it trained
    resumed = PostTrainer(_cfg(data, steps=6, checkpoint={"dir": str(tmp_path / "ck")}))
    resumed.setup()
    assert resumed.step == 4
    for k in adapters:
        assert torch.equal(resumed.model_parts[0].state_dict()[k], state[k])


@pytest.mark.slow  # 5-7 s here: `make test` runs it, test-fast does not
def test_a_resumed_in_process_run_says_from_which_step(data, tmp_path, caplog):
    """`sft`/`dpo` in the driver's process print the resume line too, as train on Ray does."""
    ck = {"dir": str(tmp_path / "ck"), "interval_steps": 2}
    with caplog.at_level(logging.INFO, logger="kiln.train"):
        first = train_post(_cfg(data, steps=2, checkpoint=ck))
        assert first["resumed_from_step"] is None
        assert "resuming" not in caplog.text
        resumed = train_post(_cfg(data, steps=3, checkpoint=ck))
    assert resumed["resumed_from_step"] == 2
    assert resumed["steps"] == 3
    assert "resuming from checkpoint step 2" in caplog.text


def test_dpo_precomputed_reference_equals_adapters_disabled(data, tmp_path):
    runs = {}
    for ref in ("precomputed", "adapters_disabled"):
        cfg = _cfg(
            data,
            "dpo",
            dpo={"beta": 0.5, "reference": ref},
            checkpoint={"dir": str(tmp_path / ref)},
        )
        runs[ref] = PostTrainer(cfg).train()
    assert (tmp_path / "precomputed" / "reference_logps.npy").is_file()
    for a, b in zip(runs["precomputed"], runs["adapters_disabled"], strict=True):
        for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins"):
            assert a[key] == pytest.approx(b[key], abs=1e-5)
    first, last = runs["precomputed"][0], runs["precomputed"][-1]
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)  # B = 0: policy == reference
    assert last["rewards/accuracies"] == 1.0 and last["rewards/margins"] > 0


def test_dpo_loss_comes_from_the_train_spec_pair_loss_hook(data, tmp_path):
    """DPO's loss is its TrainSpec's `pair_loss` (none for SFT): a hook that scales it is what
    the trainer reports."""
    cfg = _cfg(data, "dpo", steps=1, checkpoint={"dir": str(tmp_path / "dpo")})
    plain = PostTrainer(cfg)
    assert plain.spec.pair_loss is not None and PostTrainer(_cfg(data)).spec.pair_loss is None
    [reference] = plain.train()
    trainer = PostTrainer(_cfg(data, "dpo", steps=1, checkpoint={"dir": str(tmp_path / "x")}))
    dpo, seen = trainer.spec.pair_loss, []

    def tripled(*args):
        loss, metrics = dpo(*args)
        seen.append(float(loss))
        return 3 * loss, metrics

    trainer.spec = dataclasses.replace(trainer.spec, pair_loss=tripled)
    [hooked] = trainer.train()
    assert len(seen) == 2  # global 4 / micro 2: both micro-batches through the hook
    assert hooked["loss"] == pytest.approx(3 * reference["loss"], rel=1e-5)


def _lora_sft_run(data: dict, dp_shard: int) -> list[float]:
    torch.manual_seed(0)
    cfg = _cfg(data, steps=3, parallel={"dp_shard": dp_shard}, micro_batch_size=4 // dp_shard)
    return [m["loss"] for m in PostTrainer(cfg).train()]


def _two_rank_runs(data: dict, ckpt: str) -> dict:
    """Every 2-rank run of this module in one gloo group (one pair of processes, not four):
    LoRA at dp_shard=2, full SFT/DPO at tp=2, LoRA at tp=2 checkpointed, resumed at dp_shard=2."""
    return {
        "fsdp": _lora_sft_run(data, 2),
        "full_tp": _full_runs(data, 2),
        "lora_tp": _lora_layout_run(data, {"tp": 2, "dp_shard": 1}, ckpt, 3),
        "lora_resumed": _lora_layout_run(data, {"dp_shard": 2}, ckpt, 6),
    }


@pytest.fixture(scope="module")
def two_ranks(data, tmp_path_factory) -> list[dict]:
    ckpt = str(tmp_path_factory.mktemp("lora_tp") / "ckpt")
    return run_distributed(_two_rank_runs, 2, data, ckpt)


@pytest.mark.slow
def test_lora_sft_under_fsdp_equals_one_process(data, two_ranks):
    one = _lora_sft_run(data, 1)
    two = [rank["fsdp"] for rank in two_ranks]
    assert two[0] == two[1]
    assert two[0] == pytest.approx(one, abs=1e-5)


@pytest.mark.parametrize(
    ("objective", "over", "message"),
    [
        ("dpo", {"parallel": {"pp": 2}}, "dpo with parallel.pp"),
        ("dpo", {"lora": None, "dpo": {"reference": "adapters_disabled"}}, "adapters_disabled"),
    ],
)
def test_unsupported_combinations_are_config_errors(data, objective, over, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(data, objective, **over)


def _full_runs(data: dict, tp: int) -> dict[str, list[float]]:
    out = {}
    for objective in ("sft", "dpo"):  # packed SFT rows (document masks) and preference pairs
        torch.manual_seed(0)
        cfg = _cfg(
            data,
            objective,
            lora=None,
            steps=3,
            parallel={"tp": tp, "dp_shard": 1},
            micro_batch_size=4,
            optimizer={"lr": 1e-3, "weight_decay": 0.0},
        )
        out[objective] = [m["loss"] for m in PostTrainer(cfg).train()]
    return out


@pytest.mark.slow
def test_full_sft_and_dpo_under_tp_equal_one_process(data, two_ranks):
    one, two = _full_runs(data, 1), two_ranks[0]["full_tp"]
    for objective in ("sft", "dpo"):
        assert two[objective] == pytest.approx(one[objective], abs=1e-5), objective


def _lora_layout_run(data: dict, parallel: dict, ckpt: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    cfg = _cfg(
        data,
        steps=steps,
        parallel=parallel,
        micro_batch_size=4 // parallel.get("dp_shard", 1),
        checkpoint={"dir": ckpt} if ckpt else {},
    )
    return [m["loss"] for m in PostTrainer(cfg).train()]


@pytest.mark.slow
def test_lora_under_tp_equals_one_process_and_resumes_at_dp_shard(data, two_ranks):
    """A/B sharded like their base weight at tp=2: the same 3 steps as one process; that
    checkpoint resumed at dp_shard=2 continues as the uninterrupted run."""
    one = _lora_layout_run(data, {"dp_shard": 1}, "", 6)
    assert two_ranks[0]["lora_tp"] == pytest.approx(one[:3], abs=1e-5)
    assert two_ranks[0]["lora_resumed"] == pytest.approx(one[3:], abs=1e-5)


@pytest.mark.parametrize("lora", [{"rank": 4, "alpha": 8}, None], ids=["lora", "full"])
def test_head_on_trained_tokens_only_equals_full_logits(data, lora, monkeypatch):
    """The output layer run on labelled positions only gives the full-logits run's losses and
    weights (packed rows, tied embeddings: the head's gradient is the embedding's too)."""
    runs = {}
    for only in (True, False):
        monkeypatch.setattr(PostTrainer, "trained_tokens_only", only)
        torch.manual_seed(0)
        trainer = PostTrainer(_cfg(data, steps=1, lora=lora))
        losses = [m["loss"] for m in trainer.train()]
        assert trainer._head_on_trained_tokens() is only
        runs[only] = losses, trainer.model_parts[0].state_dict()
    assert runs[True][0] == pytest.approx(runs[False][0], abs=1e-5)
    for name, tensor in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], tensor, rtol=0, atol=1e-5, msg=name)
