"""`model.fused_projections` against the unfused model: forward + backward of one batch (loss
inside forward, as the trainer runs it), tokens per CPU second of each, interleaved rounds,
medians.

Timed in the process's CPU time (all its threads; 1 by default), not wall time: on a shared
machine other processes' load takes wall time from both sides unevenly, by more than the
difference measured. No Trainer around it (bench/trainer_overhead.py's options table has that,
in wall time).

    .venv/bin/python bench/fused_projections.py [--dim 512 --layers 2 --heads 8 --kv-heads 4]
        [--ffn 1344 --vocab 1024 --seq 256 --batch 4] [--reps 3 --rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kiln.model import ModelConfig, Transformer


def seconds_per_step(cfg: ModelConfig, tokens: torch.Tensor, precision: str, reps: int) -> float:
    torch.manual_seed(0)
    model = Transformer(cfg)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")

    def step() -> float:
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = model(tokens[:, :-1], labels=tokens[:, 1:])
        loss.backward()
        return loss.item()

    step()  # warm-up
    start = time.process_time()
    for _ in range(reps):
        step()
    return (time.process_time() - start) / reps


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, default in (
        ("dim", 512),
        ("layers", 2),
        ("heads", 8),
        ("kv-heads", 4),
        ("ffn", 1344),
        ("vocab", 1024),
        ("seq", 256),
        ("batch", 4),
        ("reps", 3),
        ("rounds", 5),
        ("threads", 1),
    ):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = dict(
        vocab_size=args.vocab,
        dim=args.dim,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        ffn_hidden_dim=args.ffn,
        max_seq_len=args.seq,
    )
    plain_cfg, fused_cfg = (ModelConfig(**shape, fused_projections=f) for f in (False, True))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    n_tokens = args.batch * args.seq
    print(
        f"model: {plain_cfg.num_params() / 1e6:.1f}M params, batch {args.batch}x{args.seq}, "
        f"{args.reps} steps x {args.rounds} rounds, {args.threads} threads"
    )
    print(f"{'precision':<10}{'unfused tok/cpu-s':>18}{'fused tok/cpu-s':>17}{'ratio':>7}")
    for precision in ("fp32", "bf16"):
        plain, fused = [], []
        for _ in range(args.rounds):  # interleaved: load from other processes hits both alike
            plain.append(seconds_per_step(plain_cfg, tokens, precision, args.reps))
            fused.append(seconds_per_step(fused_cfg, tokens, precision, args.reps))
        p, f = n_tokens / statistics.median(plain), n_tokens / statistics.median(fused)
        print(f"{precision:<10}{p:>18.0f}{f:>17.0f}{f / p:>7.2f}")


if __name__ == "__main__":
    main()
