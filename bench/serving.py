"""Serving benchmark: one run, every figure next to its comparison and the ratio.

    .venv/bin/python bench/serving.py            # ~3-5 min on 2 CPU cores
    .venv/bin/python bench/serving.py --quick    # smaller counts, for a smoke run

1. generated tokens/s with the KV cache vs without it (in-process, 256 new tokens);
2. requests/s through REST at 16 concurrent clients: dynamic batching vs batch size 1;
3. p50/p99 latency of one request (greedy, --max-tokens new tokens), sequentially:
   in-process `Generator.generate`, Triton directly (tritonclient gRPC to the real tritonserver
   over the exported repository) and REST (Ray Serve, local backend).
The continuous-batching engine (Poisson arrivals at 16/64 clients against the request batcher,
and against `transformers.generate` at batch 1/8 on a 125M shape) is bench/serving_engine.py.
The model is a random Llama of --dim/--layers with a byte-level BPE tokenizer trained here;
torch uses one thread everywhere (the Serve replica and the Triton instance get one CPU each).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPT = "the quick brown fox jumps over the lazy dog and"
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a kiln fires clay into something that lasts",
    "serving a model means answering requests quickly and correctly",
] * 20


def make_model(out_dir: str, dim: int, layers: int, vocab: int) -> str:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from kiln.engine.generator import Generator
    from kiln.model.config import ModelConfig
    from kiln.model.transformer import Transformer
    from kiln.serving.export.hf import export_hf

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    heads = max(dim // 64, 1)
    cfg = ModelConfig(
        vocab_size=tok.get_vocab_size(),
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=max(heads // 2, 1),
        ffn_hidden_dim=dim * 8 // 3 // 64 * 64 or 64,
        max_seq_len=1024,
    )
    torch.manual_seed(0)
    gen = Generator(
        Transformer(cfg).eval(), tok, model_name="bench", eos_token_ids=[]
    )  # never stops early
    export_hf(gen, out_dir)
    return out_dir


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def latency(fn, n: int, warmup: int = 2) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return pct(times, 50) * 1e3, pct(times, 99) * 1e3


async def _drive(send, total: int, clients: int) -> float:
    """`clients` concurrent loops share `total` requests; returns requests/s."""
    left = [total]

    async def worker():
        while left[0] > 0:
            left[0] -= 1
            await send()

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return total / (time.perf_counter() - t)


def rest_throughput(url: str, total: int, clients: int, max_tokens: int) -> float:
    import httpx

    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}

    async def run() -> float:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:

            async def send():
                r = await client.post("/v1/completions", json=body)
                r.raise_for_status()

            await _drive(send, clients, clients)  # warm-up
            return await _drive(send, total, clients)

    return asyncio.run(run())


def replica_stats(ep) -> tuple[int, int]:
    """(prompts completed, generate() calls) so far, from the endpoint's stats route."""
    import httpx

    st = httpx.get(f"{ep.url}/v2/models/{ep.model_name}/stats").json()["model_stats"][0]
    return st["inference_count"], st["execution_count"]


def triton_throughput(grpc_url: str, total: int, clients: int, inputs) -> float:
    import tritonclient.grpc.aio as grpcclient

    async def run() -> float:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:

            async def send():
                await client.infer("bench", inputs(grpcclient))

            await _drive(send, clients, clients)
            return await _drive(send, total, clients)
        finally:
            await client.close()

    return asyncio.run(run())


def triton_inputs(max_tokens: int):
    import numpy as np

    def build(mod):
        text = mod.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[PROMPT.encode()]], dtype=np.object_))
        mt = mod.InferInput("max_tokens", [1, 1], "INT32")
        mt.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
        return [text, mt]

    return build


def row(
    name: str, ours: float, theirs: float, unit: str, ours_label: str, theirs_label: str
) -> None:
    ratio = ours / theirs if theirs else float("nan")
    ours_part = f"{ours_label} {ours:10.1f} {unit:<6}"
    theirs_part = f"{theirs_label} {theirs:10.1f} {unit:<6}"
    print(f"{name:<44} {ours_part} | {theirs_part} | ratio {ratio:6.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument(
        "--new-tokens", type=int, default=256, help="tokens for the KV-cache comparison"
    )
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens per REST/Triton request")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=96, help="requests per throughput measurement")
    ap.add_argument("--latency-requests", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=16, help="dynamic batching max_batch_size")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.new_tokens, args.requests, args.latency_requests = 64, 32, 10

    import torch

    torch.set_num_threads(1)
    from kiln.engine.generator import Generator
    from kiln.engine.sampler import SamplingParams
    from tests.engine.uncached import uncached_generate  # the no-KV-cache baseline

    results: list[tuple] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-serving-") as tmp:
        hf_dir = make_model(os.path.join(tmp, "hf"), args.dim, args.layers, args.vocab)
        gen = Generator.load(hf_dir, model_name="bench")
        gen.eos_token_ids = set()  # the random model must run every token
        n_params = sum(p.numel() for p in gen.model.parameters())
        print(
            f"model: dim {args.dim}, {args.layers} layers, {n_params / 1e6:.1f} M parameters; "
            "torch threads 1"
        )

        # 1. KV cache
        params = SamplingParams(max_new_tokens=args.new_tokens)
        tps = {}
        for use_cache in (True, False):
            run = gen.generate if use_cache else partial(uncached_generate, gen)
            run([PROMPT], SamplingParams(max_new_tokens=4))
            t = time.perf_counter()
            out = run([PROMPT], params)[0]
            tps[use_cache] = out.completion_tokens / (time.perf_counter() - t)
        results.append(
            (
                f"tokens/s, {args.new_tokens} new tokens",
                tps[True],
                tps[False],
                "tok/s",
                "KV cache",
                "no cache",
            )
        )

        # 3a. in-process latency
        req = SamplingParams(max_new_tokens=args.max_tokens)
        inproc = latency(lambda: gen.generate([PROMPT], req), args.latency_requests)

        # 2 + 3b. REST on Ray Serve
        import httpx
        import ray
        from ray import serve

        from kiln.serving.launch import launch
        from tests.conftest import free_port

        ray.init(
            address="local",
            num_cpus=8,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            configure_logging=False,
            log_to_driver=False,
        )
        rps, mean_batch = {}, {}
        try:
            port = free_port()
            for bs in (args.batch_size, 1):
                settings = {
                    "limits": {"max_new_tokens": max(args.max_tokens, 64)},
                    "batching": {"max_batch_size": bs},
                    "deployment": {
                        "num_cpus": 1,
                        "max_ongoing_requests": max(64, 2 * args.clients),
                    },
                }
                ep = launch(hf_dir, settings, port=port, app_name=f"bench-bs{bs}")
                try:
                    if bs == args.batch_size:
                        body = {"prompt": PROMPT, "max_tokens": args.max_tokens, "temperature": 0}
                        with httpx.Client(base_url=ep.url, timeout=600) as c:

                            def one(c=c, body=body):
                                return c.post("/v1/completions", json=body).raise_for_status()

                            rest = latency(one, args.latency_requests)
                    before = replica_stats(ep)
                    rps[bs] = rest_throughput(ep.url, args.requests, args.clients, args.max_tokens)
                    after = replica_stats(ep)
                    mean_batch[bs] = (after[0] - before[0]) / max(after[1] - before[1], 1)
                finally:
                    ep.close()
        finally:
            serve.shutdown()
            ray.shutdown()
        results.append(
            (
                f"requests/s through REST, {args.clients} clients",
                rps[args.batch_size],
                rps[1],
                "req/s",
                f"batch<={args.batch_size:<3}",
                "batch=1  ",
            )
        )

        # 3c. Triton directly
        from kiln.serving.export.triton import export_triton
        from kiln.serving.triton.server import TritonServer

        repo = os.path.join(tmp, "triton")
        export_triton(
            hf_dir, repo, model_name="bench", max_batch_size=args.batch_size, torch_threads=1
        )
        import tritonclient.grpc as grpcclient

        build = triton_inputs(args.max_tokens)
        with TritonServer(repo) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            try:
                triton = latency(
                    lambda: client.infer("bench", build(grpcclient)), args.latency_requests
                )
            finally:
                client.close()
            triton_rps = triton_throughput(server.grpc_url, args.requests, args.clients, build)

    results.append(
        (
            "requests/s, REST (Serve) vs Triton directly",
            rps[args.batch_size],
            triton_rps,
            "req/s",
            "REST     ",
            "Triton   ",
        )
    )
    results.append(
        ("p50 latency, REST vs in-process", rest[0], inproc[0], "ms", "REST     ", "in-proc  ")
    )
    results.append(
        ("p99 latency, REST vs in-process", rest[1], inproc[1], "ms", "REST     ", "in-proc  ")
    )
    results.append(
        ("p50 latency, REST vs Triton directly", rest[0], triton[0], "ms", "REST     ", "Triton   ")
    )
    results.append(
        ("p99 latency, REST vs Triton directly", rest[1], triton[1], "ms", "REST     ", "Triton   ")
    )
    results.append(
        (
            "p50 latency, Triton directly vs in-process",
            triton[0],
            inproc[0],
            "ms",
            "Triton   ",
            "in-proc  ",
        )
    )
    print(
        f"\nlatency: one request, {args.max_tokens} new tokens, "
        f"{args.latency_requests} sequential requests"
    )
    print(
        f"  in-process p50 {inproc[0]:.1f} ms p99 {inproc[1]:.1f} ms "
        f"| Triton p50 {triton[0]:.1f} ms p99 {triton[1]:.1f} ms "
        f"| REST p50 {rest[0]:.1f} ms p99 {rest[1]:.1f} ms"
    )
    print(
        f"throughput: {args.requests} requests x {args.max_tokens} new tokens, "
        f"{args.clients} concurrent clients; mean batch through REST "
        f"{mean_batch[args.batch_size]:.1f} (max {args.batch_size}) vs {mean_batch[1]:.1f}\n"
    )
    for r in results:
        row(*r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
