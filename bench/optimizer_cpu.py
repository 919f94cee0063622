"""The AdamW step over plain CPU tensors: `optimizer.implementation: auto` (the fused kernel)
against `foreach` (the CPU default before it), on a SmolLM2-135M-shaped model (the quickstart's),
the same gradients for both. Prints the seconds of the first step (the states are allocated) and
the mean of the next ones, the ratios, and the largest parameter difference after the steps.

    .venv/bin/python bench/optimizer_cpu.py [--steps 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from kiln.model import ModelConfig, Transformer
from kiln.training.config import OptimizerConfig
from kiln.training.optimizer import build_optimizer

SMOLLM2_135M = dict(
    vocab_size=49152,
    dim=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    ffn_hidden_dim=1536,
    max_seq_len=2048,
    tie_embeddings=True,
)


def run(impl: str, steps: int, grads: dict[str, torch.Tensor]) -> tuple[list[float], dict]:
    """(seconds of each step, the final parameters) of `steps` optimizer steps."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SMOLLM2_135M))
    opt = build_optimizer(model, OptimizerConfig(lr=1e-4, implementation=impl))
    times = []
    for _ in range(steps):
        for name, param in model.named_parameters():
            param.grad = grads[name].clone()
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
        opt.zero_grad(set_to_none=True)
    return times, {k: v.detach() for k, v in model.named_parameters()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="a Ray Train worker on 0.5 CPU has 1")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = Transformer(ModelConfig(**SMOLLM2_135M))
    model(torch.randint(0, 49152, (1, 32))).float().square().mean().backward()
    grads = {k: v.grad for k, v in model.named_parameters()}
    del model
    ours, ours_params = run("auto", args.steps, grads)
    theirs, theirs_params = run("foreach", args.steps, grads)
    diff = max((ours_params[k] - theirs_params[k]).abs().max().item() for k in ours_params)

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    print(f"ours   auto (fused): first step {ours[0]:.2f} s, then {mean(ours[1:]):.2f} s/step")
    print(f"theirs foreach:      first step {theirs[0]:.2f} s, then {mean(theirs[1:]):.2f} s/step")
    print(
        f"ratio foreach/auto: first {theirs[0] / ours[0]:.2f}x, then "
        f"{mean(theirs[1:]) / mean(ours[1:]):.2f}x; max |param diff| {diff:.1e} "
        f"after {args.steps} steps ({args.threads} thread(s))"
    )


if __name__ == "__main__":
    main()
