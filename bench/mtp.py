"""Multi-token prediction's training cost: kiln's Trainer step time on a small DeepSeek-V3 shape
(MLA, YaRN, 8 experts + 1 shared, a dense first layer) with `mtp_depth` modules vs without,
fp32 on CPU with the same threads, the same synthetic batches and init; steps of the two
trainers interleaved, median step time after a warm-up step.

Prints both step times and their ratio, beside the ratio `flops_per_token` (what `kiln plan`
and MFU use) predicts, so a module that costs more than its FLOPs shows.

    .venv/bin/python bench/mtp.py [--threads 2] [--steps 6] [--seq 256] [--batch 4] [--depth 1]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from kiln.training.config import TrainConfig
from kiln.training.metrics import flops_per_token
from kiln.training.trainer import Trainer

MODEL = {
    "vocab_size": 4096,
    "dim": 256,
    "n_layers": 4,
    "n_heads": 8,
    "ffn_hidden_dim": 768,
    "max_seq_len": 1024,
    "mla": {
        "kv_lora_rank": 64,
        "q_lora_rank": 128,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
    },
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_seq_len": 256,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "n_experts": 8,
    "top_k": 2,
    "moe_hidden_dim": 192,
    "n_shared_experts": 1,
    "first_dense_layers": 1,
    "router_score": "sigmoid",
    "n_expert_groups": 2,
    "topk_groups": 1,
    "routed_scaling_factor": 2.5,
    "moe_aux_loss_coef": 0.0,
}


def _trainer(args, depth: int) -> Trainer:
    cfg = TrainConfig(
        model={**MODEL, "mtp_depth": depth},
        seq_len=args.seq,
        global_batch_size=args.batch,
        micro_batch_size=args.batch,
        steps=args.steps + 1,
        device="cpu",
        precision="fp32",
        data={"synthetic": True, "prefetch": 0},
        log_every=10**6,
    )
    return Trainer(cfg).setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--depth", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plain, mtp = _trainer(args, 0), _trainer(args, args.depth)
    times: dict[str, list[float]] = {"plain": [], "mtp": []}
    for step in range(args.steps + 1):
        for name, trainer in (("plain", plain), ("mtp", mtp)):
            metrics = trainer.train_step()
            if step:  # the first step warms up allocators and kernels
                times[name].append(metrics["step_time_s"])
    ours, base = statistics.median(times["mtp"]), statistics.median(times["plain"])
    flops = flops_per_token(mtp.cfg.model, args.seq) / flops_per_token(plain.cfg.model, args.seq)
    print(
        f"DeepSeek-V3 small (d={MODEL['dim']}, {MODEL['n_layers']} layers), seq {args.seq} x "
        f"batch {args.batch}, {args.threads} threads, median of {args.steps} steps"
    )
    print(f"step time with mtp_depth={args.depth}: {ours * 1e3:.1f} ms")
    print(f"step time without MTP:     {base * 1e3:.1f} ms")
    print(f"ratio (MTP / plain):       {ours / base:.3f}  (FLOPs ratio {flops:.3f})")
    print(f"last losses: main {metrics['loss']:.4f}, mtp {metrics.get('mtp_loss', 0):.4f}")


if __name__ == "__main__":
    main()
