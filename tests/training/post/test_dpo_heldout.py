"""DPO learns a preference rule the SFT model does not follow, and it generalises: on held-out
pairs (prompts never trained on) the DPO model prefers the chosen reply more often than the SFT
model it started from, and its implicit reward (beta x log-ratio to the SFT model) ranks them."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.training.data.config import DataConfig
from kiln.training.post.config import PostTrainConfig
from kiln.training.post.prepare import prepare_chat, prepare_preference
from kiln.training.post.run import train_post
from tests.training.post.helpers import chat_tokenizer
from tests.training.post.lora_helpers import export_base

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")
SEQ = 32


def _pairs(numbers) -> list[dict]:
    """The rule: the preferred reply names paris, the rejected one tokyo."""
    return [
        {"prompt": f"what is fact {i}?", "chosen": f"fact {i} is paris", "rejected": f"{i} tokyo"}
        for i in numbers
    ]


def _pair_logps(model_dir: str, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed reply log-probs (chosen, rejected) of every pair of a prepared preference set."""
    import numpy as np

    from kiln.model.formats.weights import build_model, read_weights
    from kiln.training.post.chat_dataset import ChatDataset
    from kiln.training.post.dpo import split_pairs
    from kiln.training.post.objectives import sequence_logps

    _, cfg, state = read_weights(model_dir)
    model = build_model(cfg, state, device="cpu")
    dataset = ChatDataset(f"{prefix}/train")
    tokens, labels, _, _ = (
        torch.from_numpy(a) for a in dataset.gather_rows(np.arange(len(dataset)))
    )
    with torch.no_grad():
        return split_pairs(sequence_logps(model(tokens), labels)[0])


def _cfg(objective: str, base: str, data: str, **over) -> PostTrainConfig:
    fields = {
        "objective": objective,
        "base": base,
        "seq_len": SEQ,
        "global_batch_size": 8,
        "micro_batch_size": 8,
        "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
        "schedule": {"kind": "constant"},
        "data": DataConfig(paths=[data]),
        "device": "cpu",
        **over,
    }
    return PostTrainConfig(**fields)


@pytest.mark.slow
def test_dpo_held_out_reward_accuracy_beats_the_sft_model(tmp_path):
    tok = chat_tokenizer()
    _, base = export_base(str(tmp_path))
    # SFT leans the other way: two of three facts answered tokyo
    answers = {0: "fact {} is paris", 1: "{} tokyo", 2: "{} tokyo"}
    sft_rows = [
        {"prompt": f"what is fact {i}?", "response": answers[i % 3].format(i)} for i in range(24)
    ]
    for name, rows in (
        ("sft", sft_rows),
        ("train", _pairs(range(24))),
        ("held", _pairs(range(50, 66))),
    ):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_chat(tmp_path / "sft.jsonl", tmp_path / "chat", tokenizer=tok, seq_len=SEQ)
    for name in ("train", "held"):
        prepare_preference(
            tmp_path / f"{name}.jsonl", tmp_path / f"p_{name}", tokenizer=tok, seq_len=SEQ
        )

    train_post(_cfg("sft", base, str(tmp_path / "chat"), steps=12), str(tmp_path / "sft"))
    sft = str(tmp_path / "sft" / "hf")
    dpo_cfg = _cfg(
        "dpo", sft, str(tmp_path / "p_train"), steps=12, lora={"rank": 8, "alpha": 16},
        dpo={"beta": 0.1}, checkpoint={"dir": str(tmp_path / "dpo_ck")},
    )  # fmt: skip
    summary = train_post(dpo_cfg, str(tmp_path / "dpo"))
    assert summary["final"]["rewards/accuracies"] == 1.0  # on its training pairs

    sft_chosen, sft_rejected = _pair_logps(sft, str(tmp_path / "p_held"))
    dpo_chosen, dpo_rejected = _pair_logps(str(tmp_path / "dpo" / "hf"), str(tmp_path / "p_held"))
    sft_accuracy = (sft_chosen > sft_rejected).float().mean().item()
    dpo_accuracy = (dpo_chosen > dpo_rejected).float().mean().item()
    reward_margin = 0.1 * ((dpo_chosen - sft_chosen) - (dpo_rejected - sft_rejected))
    reward_accuracy = (reward_margin > 0).float().mean().item()  # TRL's rewards/accuracies
    assert sft_accuracy < 0.5, sft_accuracy
    assert dpo_accuracy > sft_accuracy and dpo_accuracy >= 0.9, (sft_accuracy, dpo_accuracy)
    assert reward_accuracy >= 0.9, reward_accuracy
