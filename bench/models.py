"""Per architecture (Llama 3.2, Qwen3, Qwen3-MoE, Gemma 3, DeepSeek-V3), on the same small
config loaded by both from one HF folder, fp32 on CPU with the same threads:

- training tokens/s of kiln's model vs transformers' in the same loop (forward, cross-entropy,
  backward, AdamW step; the same batches; steps interleaved, median step time; target >= 1.0);
- decode tokens/s of kiln's engine (`Generator.generate_ids`: KV-cache slots, batched greedy
  decoding) vs `transformers.generate` (its dynamic cache, greedy), the same prompts and new
  tokens, fresh copies of the same weights, runs interleaved (median), and whether both
  decoded the same tokens.

Training also reports tokens per CPU-second of the process (its OpenMP workers included) and
the load average around it. Idle OpenMP workers sleep (OMP_WAIT_POLICY=passive, unless the
environment sets it): spinning ones, OpenMP's default, burn the time slices their peers need
on a machine busy with other work: there one step's time ranged 5-11x within a run and the
kiln/transformers ratio 0.7-1.7 between runs (docs/benchmarks.md, the DeepSeek-V3 row of 0.20).
OMP_WAIT_POLICY=active measures the default.

Prints kiln's figure, transformers' and the ratio for each; then KV-cache bytes per token of MLA
(the latent and the RoPE key) against full attention of the same widths (every head's key and
value), for the bench's DeepSeek shape and the real DeepSeek-V3 one.

    .venv/bin/python bench/models.py [--threads 2] [--steps 8] [--seq 256] [--batch 4]
        [--decode-batch 4] [--prompt 32] [--new-tokens 64] [--decode-runs 3] [--arch qwen3 ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

# Read once, when torch starts OpenMP: it must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.model.config import ModelConfig  # noqa: E402
from kiln.model.formats.hf import read_hf_dir  # noqa: E402
from kiln.model.formats.weights import build_model  # noqa: E402
from kiln.model.kv_cache import KVCache  # noqa: E402

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


ARCHITECTURES = ("llama3.2", "qwen3", "qwen3_moe", "gemma3", "deepseek_v3")
# MLA, YaRN, 8 experts of 192 (top 2 in 1 of 2 groups) plus a shared one, first layer dense.
DEEPSEEK = {
    "kv_lora_rank": 64,
    "q_lora_rank": 128,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "moe_intermediate_size": 192,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 128,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}


def _hf_config(arch: str):
    from transformers import (
        DeepseekV3Config,
        Gemma3TextConfig,
        LlamaConfig,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    if arch == "deepseek_v3":
        shape = {**SHAPE, "num_key_value_heads": SHAPE["num_attention_heads"]}
        shape.pop("head_dim")
        return DeepseekV3Config(**shape, **DEEPSEEK)

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
    if arch == "qwen3_moe":  # 8 experts of a quarter width, 2 per token: the dense FLOPs / 2
        moe = {"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True}
        return Qwen3MoeConfig(**SHAPE, moe_intermediate_size=SHAPE["intermediate_size"] // 4, **moe)
    kinds = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    return Gemma3TextConfig(**SHAPE, sliding_window=64, layer_types=kinds)


class _Loop:
    """One model's training step: forward, cross-entropy, backward, AdamW."""

    def __init__(self, model, logits_of):
        self.model, self.logits_of = model.train(), logits_of
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step(self, tokens: torch.Tensor) -> tuple[float, float]:
        """(wall seconds, CPU seconds of the whole process) of one step."""
        start, cpu = time.perf_counter(), time.process_time()
        logits = self.logits_of(self.model, tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start, time.process_time() - cpu


def _tokens_per_s(ours: _Loop, theirs: _Loop, batches) -> tuple[float, float, float, float]:
    """(kiln, transformers) tokens per wall second, then per CPU-second: median step of each,
    their steps interleaved so both see the same machine load; the first step of each
    (allocations, optimizer state) is not counted."""
    times: tuple[list[tuple[float, float]], ...] = ([], [])
    for step, tokens in enumerate(batches):
        for loop, record in ((ours, times[0]), (theirs, times[1])):
            elapsed = loop.step(tokens)
            if step:
                record.append(elapsed)
    n = batches[0][:, :-1].numel()
    wall = tuple(n / statistics.median(w for w, _ in t) for t in times)
    cpu = tuple(n / statistics.median(c for _, c in t) for t in times)
    return (*wall, *cpu)


def _load() -> str:
    """The 1-minute load average: other work on the machine moves the wall-clock figures."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def _decode_tokens_per_s(kiln, hf, prompts: torch.Tensor, new: int, runs: int):
    """(kiln tok/s, transformers tok/s, same tokens) for greedy decoding of `new` tokens after
    each prompt row; one untimed warm-up each, then `runs` interleaved runs (median)."""
    gen = Generator(kiln, None, eos_token_ids=[])
    params = SamplingParams(max_new_tokens=new, temperature=0.0)
    rows = prompts.tolist()
    hf.generation_config.pad_token_id = 0
    # Every prompt token is real: without a mask, generate takes a prompt's token 0 (the pad
    # id) for padding and masks it out, and the two sides decode different tokens.
    mask = torch.ones_like(prompts)

    def ours():
        return gen.generate_ids(rows, params)

    def theirs():
        out = hf.generate(
            prompts,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
        )
        return out[:, prompts.shape[1] :].tolist()

    same = ours() == theirs()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        for run, record in ((ours, times[0]), (theirs, times[1])):
            start = time.perf_counter()
            run()
            record.append(time.perf_counter() - start)
    n = prompts.shape[0] * new
    kiln_rate, hf_rate = (n / statistics.median(t) for t in times)
    return kiln_rate, hf_rate, same


def main() -> None:
    from transformers import AutoModelForCausalLM

    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--decode-batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--decode-runs", type=int, default=3)
    p.add_argument("--arch", nargs="+", choices=ARCHITECTURES, default=list(ARCHITECTURES))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, SHAPE["vocab_size"], (args.batch, args.seq + 1), generator=g)
        for _ in range(args.steps + 1)
    ]
    prompts = torch.randint(0, SHAPE["vocab_size"], (args.decode_batch, args.prompt), generator=g)
    print(
        f"threads={args.threads} fp32; train: batch={args.batch} seq={args.seq} "
        f"steps={args.steps}; decode: batch={args.decode_batch} prompt={args.prompt} "
        f"new={args.new_tokens} runs={args.decode_runs}; "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    )
    for arch in args.arch:
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            hf = AutoModelForCausalLM.from_config(_hf_config(arch), attn_implementation="sdpa")
            hf.save_pretrained(tmp)
            _, cfg, state = read_hf_dir(tmp)
            kiln = build_model(cfg, state, device="cpu")
            before = _load()
            ours, theirs, ours_cpu, theirs_cpu = _tokens_per_s(
                _Loop(kiln, lambda m, t: m(t)), _Loop(hf, lambda m, t: m(t).logits), batches
            )
            print(
                f"{arch:9s} train  tokens/s  kiln {ours:8.0f}  transformers {theirs:8.0f}  "
                f"ratio {ours / theirs:.2f}"
            )
            print(
                f"{arch:9s} train  tokens/CPU-s  kiln {ours_cpu:8.0f}  "
                f"transformers {theirs_cpu:8.0f}  ratio {ours_cpu / theirs_cpu:.2f}  "
                f"(before: {before}; after: {_load()})"
            )
            # decoding: fresh copies of the saved weights (training moved both models)
            hf = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="sdpa").eval()
            kiln = build_model(cfg, read_hf_dir(tmp)[2], device="cpu").eval()
        ours, theirs, same = _decode_tokens_per_s(
            kiln, hf, prompts, args.new_tokens, args.decode_runs
        )
        print(
            f"{arch:9s} decode tokens/s  kiln {ours:8.0f}  transformers {theirs:8.0f}  "
            f"ratio {ours / theirs:.2f}  same tokens: {'yes' if same else 'no'}"
        )
        if arch == "deepseek_v3":
            _print_cache_bytes("bench shape", cfg)
    _print_cache_bytes("DeepSeek-V3 (671B)", ModelConfig.preset("deepseek_v3"))


def _print_cache_bytes(name: str, cfg: ModelConfig) -> None:
    """bf16 KV-cache bytes per token, all layers: MLA's latent + RoPE key vs every head's key
    (qk_nope + qk_rope wide) and value (v_head_dim wide)."""
    mla = KVCache.for_model(cfg, batch=1, max_len=1, dtype=torch.bfloat16).bytes_per_token()
    m = cfg.mla
    full = KVCache(
        cfg.n_layers,
        1,
        cfg.n_heads,
        m.qk_head_dim,
        1,
        v_head_dim=m.v_head_dim,
        dtype=torch.bfloat16,
    ).bytes_per_token()
    formula = cfg.n_layers * m.cache_width() * 2
    assert mla == formula, (mla, formula)
    print(
        f"{name}: KV cache bytes/token (bf16)  MLA {mla:,}  full attention {full:,}  "
        f"ratio {full / mla:.1f}x smaller"
    )


if __name__ == "__main__":
    main()
