"""SFT and DPO objectives against their peers: transformers' loss with -100 labels, TRL's DPO
formula (and its gradient w.r.t. LoRA parameters, on peft), packed == unpacked per document."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kiln.model.lora import LoRAConfig, adapters_disabled, apply_lora
from kiln.training.parallel.loss import cross_entropy_loss
from kiln.training.post.chat_dataset import ChatDataset
from kiln.training.post.dpo import dpo_loss, split_pairs
from kiln.training.post.objectives import sequence_logps
from kiln.training.post.packed_attention import document_masking
from kiln.training.post.prepare import prepare_chat, prepare_preference
from tests.training.post.helpers import CONVERSATION, chat_tokenizer, per_document_losses
from tests.training.post.lora_helpers import (
    adapter_grads,
    export_base,
    peft_model,
    random_adapters,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")
SEQ = 64


@pytest.fixture(scope="module")
def base_export(tmp_path_factory):
    return export_base(str(tmp_path_factory.mktemp("objectives")))


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return str(path)


def _chat_rows(n: int = 12) -> list[dict]:
    rows = [{"messages": CONVERSATION}]
    rows += [
        {"prompt": f"q{i} " * (1 + i % 4), "response": f"paris {i} " * (1 + i % 3)}
        for i in range(n)
    ]
    return rows


def _batch(prefix) -> tuple[torch.Tensor, ...]:
    ds = ChatDataset(prefix)
    return tuple(torch.from_numpy(a) for a in ds.gather_rows(np.arange(len(ds))))


def test_sft_loss_equals_transformers_loss_with_ignored_labels(base_export, tmp_path):
    from transformers import AutoModelForCausalLM

    model, hf_dir = base_export
    src = _jsonl(tmp_path / "c.jsonl", _chat_rows())
    prepare_chat(src, tmp_path / "d", tokenizer=chat_tokenizer(), seq_len=SEQ, packing=False)
    tokens, labels, _, _ = _batch(tmp_path / "d" / "train")
    assert (labels == -100).any() and (labels != -100).any()
    # transformers shifts labels itself (its labels[t] is the target of position t - 1) and so
    # has no target for the last position
    hf_labels = torch.cat([torch.full_like(labels[:, :1], -100), labels[:, :-1]], 1)
    labels[:, -1] = -100
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(tokens, labels=hf_labels).loss
        ours = cross_entropy_loss(model(tokens), labels)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_packed_rows_give_each_document_its_unpacked_loss(base_export, tmp_path):
    model, _ = base_export
    tok, rows = chat_tokenizer(), _chat_rows(16)
    src = _jsonl(tmp_path / "c.jsonl", rows)
    packed = prepare_chat(src, tmp_path / "p", tokenizer=tok, seq_len=SEQ)
    prepare_chat(src, tmp_path / "u", tokenizer=tok, seq_len=SEQ, packing=False)
    assert packed["rows"] < len(rows)

    def losses(prefix):
        ds = ChatDataset(prefix)
        tokens, labels, positions, docs = (
            torch.from_numpy(a) for a in ds.gather_rows(np.arange(len(ds)))
        )
        tokens, labels = tokens % 300, torch.where(labels >= 0, labels % 300, -100)
        with torch.no_grad(), document_masking(model, docs):
            logits = model(tokens, positions=positions)
        by_doc = per_document_losses(logits, labels, docs)
        keys = {(r, d): tuple(ds.sequences(r)[d][0].tolist()) for r, d in by_doc}
        return {keys[k]: v for k, v in by_doc.items()}, logits

    ours, packed_logits = losses(tmp_path / "p" / "train")
    alone, _ = losses(tmp_path / "u" / "train")
    assert sorted(ours) == sorted(alone) and len(ours) == len(rows)
    for key, loss in ours.items():
        torch.testing.assert_close(loss, alone[key], rtol=0, atol=1e-5)
    # without the document mask, packing would change the losses (the test can fail)
    ds = ChatDataset(tmp_path / "p" / "train")
    tokens, labels, positions, docs = (
        torch.from_numpy(a) for a in ds.gather_rows(np.arange(len(ds)))
    )
    with torch.no_grad():
        leaky = model(tokens % 300, positions=positions)
    assert (leaky - packed_logits).abs().max() > 1e-3


def _trl_dpo(chosen, rejected, ref_chosen, ref_rejected, n_chosen, n_rejected, beta, loss_type):
    """TRL's DPOTrainer._compute_loss, huggingface/trl@f2cd577 trl/trainer/dpo_trainer.py
    L1397-1451 (log-ratios; sigmoid L1434-1435; ipo L1440-1451, scores averaged over completion
    tokens) and L1633-1649 (rewards/chosen, rejected, accuracies, margins). sigmoid_norm is
    open-instruct's `dpo_norm` (allenai/open-instruct dpo_utils.py): sigmoid on the four
    log-probs each divided by its completion length."""
    chosen_logratios, rejected_logratios = chosen - ref_chosen, rejected - ref_rejected
    if loss_type == "sigmoid_norm":
        chosen_logratios = chosen / n_chosen - ref_chosen / n_chosen
        rejected_logratios = rejected / n_rejected - ref_rejected / n_rejected
    delta_score = chosen_logratios - rejected_logratios
    if loss_type in ("sigmoid", "sigmoid_norm"):
        per_sequence_loss = -F.logsigmoid(beta * delta_score)
    else:
        ipo_delta = chosen_logratios / n_chosen.clamp(
            min=1.0
        ) - rejected_logratios / n_rejected.clamp(min=1.0)
        per_sequence_loss = (ipo_delta - 1 / (2 * beta)) ** 2
    chosen_rewards, rejected_rewards = (
        beta * chosen_logratios.detach(),
        beta * rejected_logratios.detach(),
    )
    return per_sequence_loss.mean(), {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
    }


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "sigmoid_norm"])
def test_dpo_loss_and_metrics_equal_trl_formula(loss_type):
    g = torch.Generator().manual_seed(0)
    logps = [-torch.rand(16, generator=g, dtype=torch.float64) * 40 for _ in range(4)]
    counts = [torch.randint(1, 30, (16,), generator=g).double() for _ in range(2)]
    ours, ours_m = dpo_loss(*logps, *counts, beta=0.3, loss_type=loss_type)
    theirs, theirs_m = _trl_dpo(*logps, *counts, 0.3, loss_type)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    for k in theirs_m:
        torch.testing.assert_close(ours_m[k], theirs_m[k], rtol=0, atol=1e-12)
    assert 0 < ours_m["rewards/accuracies"] < 1


def test_dpo_loss_and_lora_gradients_equal_trl_on_peft(base_export, tmp_path):
    """kiln: LoRA model, summed log-probs of the loader's pairs, reference = adapters disabled.
    TRL: the same computation on peft's model of the HF export (selective log-softmax on shifted
    logits, completion mask, reference with peft's adapters disabled), then TRL's loss."""
    base, hf_dir = base_export
    rows = [
        {
            "prompt": f"question {i}",
            "chosen": f"paris {i}",
            "rejected": f"tokyo fox {i} " * (1 + i % 2),
        }
        for i in range(6)
    ]
    prepare_preference(
        _jsonl(tmp_path / "p.jsonl", rows), tmp_path / "p", tokenizer=chat_tokenizer(), seq_len=SEQ
    )
    tokens, labels, _, _ = _batch(tmp_path / "p" / "train")
    cfg = LoRAConfig(rank=4, alpha=8)
    model = copy.deepcopy(base)
    apply_lora(model, cfg)
    random_adapters(model, seed=3)

    logps, n = sequence_logps(model(tokens), labels)
    with torch.no_grad(), adapters_disabled(model):
        ref_logps, _ = sequence_logps(model(tokens), labels)
    ours, _ = dpo_loss(*split_pairs(logps), *split_pairs(ref_logps), *split_pairs(n), beta=0.2)
    ours.backward()

    peft = peft_model(hf_dir, cfg, model)
    # TRL's batch, from the stored sequences: [chosen; rejected] ids and their completion masks
    ds = ChatDataset(tmp_path / "p" / "train")
    pairs = [ds.sequences(r) for r in range(len(ds))]
    input_ids = torch.zeros(2 * len(pairs), SEQ + 1, dtype=torch.long)
    completion_mask = torch.zeros_like(input_ids)
    for i, (ids, mask) in enumerate([p[0] for p in pairs] + [p[1] for p in pairs]):
        input_ids[i, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
        completion_mask[i, : len(ids)] = torch.from_numpy(mask.astype(np.int64))

    def trl_logps(logits):
        per_token = torch.gather(logits[:, :-1].log_softmax(-1), -1, input_ids[:, 1:, None])[..., 0]
        return (per_token * completion_mask[:, 1:]).sum(1)

    policy = trl_logps(peft(input_ids).logits)
    with torch.no_grad(), peft.disable_adapter():
        reference = trl_logps(peft(input_ids).logits)
    n_tokens = completion_mask.sum(1).double()
    theirs, _ = _trl_dpo(*policy.chunk(2), *reference.chunk(2), *n_tokens.chunk(2), 0.2, "sigmoid")
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    ours_g, theirs_g = adapter_grads(model, peft=False), adapter_grads(peft, peft=True)
    assert sorted(ours_g) == sorted(theirs_g) and len(ours_g) == 4 * 7
    for name, grad in ours_g.items():
        torch.testing.assert_close(grad, theirs_g[name], rtol=1e-3, atol=1e-5)  # fp32 sums
