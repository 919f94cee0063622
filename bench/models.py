"""Training tokens/s of kiln's model vs transformers' on the same small config, per
architecture (Llama 3.2, Qwen3, Gemma 3): the same HF folder loaded by both, the same
batches, the same loop (forward, cross-entropy, backward, AdamW step), fp32 on CPU with the
same threads, steps interleaved (median step time). Prints kiln's figure, transformers' and
the ratio (target >= 1.0).

    .venv/bin/python bench/models.py [--threads 2] [--steps 8] [--seq 256] [--batch 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from kiln.model.formats.hf import read_hf_dir
from kiln.model.formats.weights import build_model

SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 1024,
}


def _hf_config(arch: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config

    if arch == "llama3.2":
        scaling = {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        }
        return LlamaConfig(
            **SHAPE, rope_parameters={"rope_theta": 5e5, **scaling}, tie_word_embeddings=True
        )
    if arch == "qwen3":
        return Qwen3Config(**SHAPE, tie_word_embeddings=True)
    kinds = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    return Gemma3TextConfig(**SHAPE, sliding_window=64, layer_types=kinds)


class _Loop:
    """One model's training step: forward, cross-entropy, backward, AdamW."""

    def __init__(self, model, logits_of):
        self.model, self.logits_of = model.train(), logits_of
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step(self, tokens: torch.Tensor) -> float:
        start = time.perf_counter()
        logits = self.logits_of(self.model, tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def _tokens_per_s(ours: _Loop, theirs: _Loop, batches) -> tuple[float, float]:
    """Median step time of each, their steps interleaved so both see the same machine load;
    the first step of each (allocations, optimizer state) is not counted."""
    times: tuple[list[float], list[float]] = ([], [])
    for step, tokens in enumerate(batches):
        for loop, record in ((ours, times[0]), (theirs, times[1])):
            elapsed = loop.step(tokens)
            if step:
                record.append(elapsed)
    n = batches[0][:, :-1].numel()
    return tuple(n / statistics.median(t) for t in times)


def main() -> None:
    from transformers import AutoModelForCausalLM

    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, SHAPE["vocab_size"], (args.batch, args.seq + 1), generator=g)
        for _ in range(args.steps + 1)
    ]
    print(f"threads={args.threads} batch={args.batch} seq={args.seq} steps={args.steps} fp32")
    for arch in ("llama3.2", "qwen3", "gemma3"):
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            hf = AutoModelForCausalLM.from_config(_hf_config(arch), attn_implementation="sdpa")
            hf.save_pretrained(tmp)
            _, cfg, state = read_hf_dir(tmp)
        kiln = build_model(cfg, state, device="cpu")
        ours, theirs = _tokens_per_s(
            _Loop(kiln, lambda m, t: m(t)), _Loop(hf, lambda m, t: m(t).logits), batches
        )
        print(
            f"{arch:9s} train tokens/s  kiln {ours:8.0f}  transformers {theirs:8.0f}  "
            f"ratio {ours / theirs:.2f}"
        )


if __name__ == "__main__":
    main()
