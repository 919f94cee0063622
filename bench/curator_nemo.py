"""Kiln's heuristic filters against NeMo Curator's, on the same English documents, rules,
thresholds and cores, in one run.

The 23 heuristic rules both have, at the thresholds of NeMo Curator's shipped
`heuristic_filter_english_pipeline.yaml`: word count, mean word length, symbol/word ratio,
bullet lines, ellipsis lines, words with a letter, non-alphanumeric share, digit share,
repeated lines and paragraphs (by count and by characters), top n-grams (n = 2..4), duplicate
n-grams (n = 5..10), lines without terminal punctuation and URL share. NeMo's five rules Kiln
lacks (white space, parentheses, boilerplate strings, common English words, long words) are left
out of its pipeline; Kiln's cleaning, language id, C4 extras and dedup are switched off.

Corpus: the real English Python docs of ../shared/corpora/corpus.jsonl (593 pages) plus documents
recombined from their paragraphs, to `--docs`, in `--files` JSONL files.

  .venv/bin/python bench/curator_nemo.py --make-venv     # once: NeMo Curator into KILN_NEMOVENV
  .venv/bin/python bench/curator_nemo.py --docs 50000 [--repeats 2]

NeMo Curator 1.4 runs in its own environment, KILN_NEMOVENV (default /tmp/nemovenv; never Kiln's
.venv): the plain `nemo-curator` package is its CPU part (its text stages, Ray Data; cuDF is only
imported by GPU dedup), with its `RayDataExecutor` (the Xenna executor refuses 2 cores). Each side
runs in a fresh process with a fresh local Ray of the same CPUs; imports and Ray's start are not
timed, the pipeline run is (Kiln's includes writing its shards and report). Runs are
interleaved (Kiln, NeMo, Kiln, NeMo, ...) and the best of each is kept. Prints docs/s, docs per
CPU-second (user + system time of the whole process tree, Ray's workers included; each run's
line splits it into the driver, Ray's worker processes and Ray's own), kept counts and how many
documents the two keep differently, and the ratio, beside the load average. Children run in the
temporary folder: Ray's workers import from the driver's working folder first, so a checkout
there would shadow `--kiln-baseline`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
NEMOVENV = os.environ.get("KILN_NEMOVENV", "/tmp/nemovenv")
NEMO_REQUIREMENT = "nemo-curator>=1.4,<1.5"

# NeMo Curator's shipped English thresholds for the rules both have, as Kiln's filter config.
KILN_FILTERS = {
    "min_words": 50,
    "max_words": 100_000,
    "min_mean_word_length": 3.0,
    "max_mean_word_length": 10.0,
    "max_symbol_word_ratio": 0.1,
    "max_bullet_line_ratio": 0.9,
    "max_ellipsis_line_ratio": 0.3,
    "min_alpha_word_ratio": 0.8,
    "max_non_alnum_ratio": 0.25,
    "max_digit_ratio": 0.15,
    "max_dup_line_fraction": 0.3,  # NeMo: unique lines / lines >= 0.7
    "max_dup_line_char_fraction": 0.2,  # NeMo: unique lines' chars / chars >= 0.8
    "max_dup_para_fraction": 0.3,
    "max_dup_para_char_fraction": 0.2,
    "top_ngram_char_fraction": {2: 0.20, 3: 0.18, 4: 0.16},
    "dup_ngram_char_fraction": {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
    "min_terminal_punct_line_ratio": 0.15,  # NeMo: lines without an end mark <= 0.85
    "max_url_char_ratio": 0.2,
    # Kiln rules NeMo's English pipeline does not have
    "lorem_ipsum": False,
    "max_javascript_line_ratio": None,
    "max_curly_brace_ratio": None,
    "languages": None,
}
RULES = 23

NEMO = """
import glob, json, os, sys, time
import ray
from nemo_curator.backends.ray_data import RayDataExecutor
from nemo_curator.pipeline import Pipeline
from nemo_curator.stages.text.filters.heuristic.repetition import (
    RepeatedLinesByCharFilter, RepeatedLinesFilter, RepeatedParagraphsByCharFilter,
    RepeatedParagraphsFilter, RepeatingDuplicateNGramsFilter, RepeatingTopNGramsFilter)
from nemo_curator.stages.text.filters.heuristic.string import (
    BulletsFilter, EllipsisFilter, MeanWordLengthFilter, NonAlphaNumericFilter, NumbersFilter,
    PunctuationFilter, SymbolsToWordsFilter, UrlsFilter, WordCountFilter,
    WordsWithoutAlphabetsFilter)
from nemo_curator.stages.text.filters.score_filter import ScoreFilter
from nemo_curator.stages.text.io.reader import JsonlReader
from nemo_curator.stages.text.io.writer import JsonlWriter

inp, out, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
# the shipped English pipeline's order and thresholds, less the five rules Kiln lacks
filters = [
    NonAlphaNumericFilter(max_non_alpha_numeric_to_text_ratio=0.25),
    SymbolsToWordsFilter(max_symbol_to_word_ratio=0.1),
    NumbersFilter(max_number_to_text_ratio=0.15),
    UrlsFilter(max_url_to_text_ratio=0.2),
    RepeatedLinesFilter(max_repeated_line_fraction=0.7),
    RepeatedParagraphsFilter(max_repeated_paragraphs_ratio=0.7),
    RepeatedLinesByCharFilter(max_repeated_lines_char_ratio=0.8),
    RepeatedParagraphsByCharFilter(max_repeated_paragraphs_char_ratio=0.8),
    WordCountFilter(min_words=50, max_words=100000),
    PunctuationFilter(max_num_sentences_without_endmark_ratio=0.85),
    WordsWithoutAlphabetsFilter(min_words_with_alphabets=0.8),
    MeanWordLengthFilter(min_mean_word_length=3, max_mean_word_length=10),
    EllipsisFilter(max_num_lines_ending_with_ellipsis_ratio=0.3),
    *[RepeatingTopNGramsFilter(n=n, max_repeating_ngram_ratio=r)
      for n, r in ((2, 0.20), (3, 0.18), (4, 0.16))],
    *[RepeatingDuplicateNGramsFilter(n=n, max_repeating_duplicate_ngram_ratio=r)
      for n, r in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))],
    BulletsFilter(max_bullet_lines_ratio=0.9),
]
assert len(filters) == 23
stages = [JsonlReader(file_paths=inp, files_per_partition=1, fields=["id", "text"])]
stages += [ScoreFilter(filter_obj=f, text_field="text") for f in filters]
stages.append(JsonlWriter(path=out))
ray.init(address="local", num_cpus=cpus, include_dashboard=False)  # the executor's init: no-op
print("START", flush=True)  # the parent counts CPU time from here
t0 = time.perf_counter()
Pipeline(name="heuristic_en", stages=stages).run(RayDataExecutor())
seconds = time.perf_counter() - t0
kept = [json.loads(l)["id"] for p in sorted(glob.glob(out + "/*.jsonl")) for l in open(p)]
print("SECONDS", seconds, flush=True)
print("KEPT", json.dumps(kept), flush=True)
ray.shutdown()
"""


# Each NeMo rule's decision per document, in plain Python (no Ray): which rules the two sides
# define differently. Kiln's rule (the name in its report) for each of NeMo's 23.
NEMO_RULES = """
import json, sys
from nemo_curator.stages.text.filters.heuristic.repetition import (
    RepeatedLinesByCharFilter, RepeatedLinesFilter, RepeatedParagraphsByCharFilter,
    RepeatedParagraphsFilter, RepeatingDuplicateNGramsFilter, RepeatingTopNGramsFilter)
from nemo_curator.stages.text.filters.heuristic.string import (
    BulletsFilter, EllipsisFilter, MeanWordLengthFilter, NonAlphaNumericFilter, NumbersFilter,
    PunctuationFilter, SymbolsToWordsFilter, UrlsFilter, WordCountFilter,
    WordsWithoutAlphabetsFilter)
rules = {
    "non_alphanumeric": [NonAlphaNumericFilter(0.25)],
    "symbol_word_ratio": [SymbolsToWordsFilter(0.1)],
    "digits": [NumbersFilter(0.15)],
    "url_ratio": [UrlsFilter(0.2)],
    "duplicate_lines": [RepeatedLinesFilter(0.7), RepeatedLinesByCharFilter(0.8)],
    "duplicate_paragraphs": [RepeatedParagraphsFilter(0.7), RepeatedParagraphsByCharFilter(0.8)],
    "word_count": [WordCountFilter(50, 100000)],
    "terminal_punctuation": [PunctuationFilter(0.85)],
    "alpha_words": [WordsWithoutAlphabetsFilter(0.8)],
    "mean_word_length": [MeanWordLengthFilter(3, 10)],
    "ellipsis_lines": [EllipsisFilter(0.3)],
    "top_ngrams": [RepeatingTopNGramsFilter(n, r) for n, r in ((2, .2), (3, .18), (4, .16))],
    "duplicate_ngrams": [RepeatingDuplicateNGramsFilter(n, r) for n, r in
                         ((5, .15), (6, .14), (7, .13), (8, .12), (9, .11), (10, .10))],
    "bullet_lines": [BulletsFilter(0.9)],
}
def keeps(f, text):
    try:
        return bool(f.keep_document(f.score_document(text)))
    except ZeroDivisionError:
        return False
texts = [json.loads(line)["text"] for line in open(sys.argv[1])]
print(json.dumps({name: [all(keeps(f, t) for f in fs) for t in texts]
                  for name, fs in rules.items()}))
"""


def rule_agreement(path: str) -> None:
    """Each rule's decisions on Kiln and NeMo over the documents of one input file."""
    import numpy as np

    from kiln.curator.config import FilterConfig
    from kiln.curator.filters import DocBatch, build_filters

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(NEMO_RULES))
    out = subprocess.run(
        [f"{NEMOVENV}/bin/python", f.name, path], capture_output=True, text=True, check=True
    )
    nemo = {k: np.array(v) for k, v in json.loads(out.stdout).items()}
    with open(path, encoding="utf-8") as f:
        batch = DocBatch([json.loads(line)["text"] for line in f])
    kiln = {
        f.name: np.asarray(f.keep(batch), bool) for f in build_filters(FilterConfig(**KILN_FILTERS))
    }
    print(f"\neach rule on {len(batch):,} docs ({os.path.basename(path)}): rejected by")
    print(f"{'rule':22} {'kiln':>6} {'NeMo':>6} {'kiln only':>9} {'NeMo only':>9}")
    for name, keep in nemo.items():
        k = kiln[name]
        print(
            f"{name:22} {(~k).sum():6} {(~keep).sum():6} {(~k & keep).sum():9} "
            f"{(k & ~keep).sum():9}"
        )


def make_venv() -> None:
    """NeMo Curator's CPU part (the plain package: text stages on Ray Data) in its own venv."""
    subprocess.run([sys.executable, "-m", "venv", NEMOVENV], check=True)
    pip = [f"{NEMOVENV}/bin/python", "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "-U", "pip"], check=True)
    subprocess.run([*pip, NEMO_REQUIREMENT], check=True)
    print(f"NeMo Curator installed in {NEMOVENV}")


# -- corpus ------------------------------------------------------------------------------------


def make_corpus(n: int, seed: int, out_dir: str, n_files: int) -> int:
    """The real English pages, then documents of 2-12 of their paragraphs, to `n`; returns the
    characters written."""
    with open(CORPUS, encoding="utf-8") as f:
        pages = [d["text"] for d in map(json.loads, f) if d["lang"] == "en"]
    paragraphs = [p for t in pages for p in t.split("\n\n") if p.strip()]
    rng = random.Random(seed)
    texts = pages[:n]
    while len(texts) < n:
        texts.append("\n\n".join(rng.sample(paragraphs, rng.randint(2, 12))))
    os.makedirs(out_dir, exist_ok=True)
    for k in range(n_files):
        with open(os.path.join(out_dir, f"part-{k:02d}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(
                json.dumps({"id": f"d{i:07d}", "text": texts[i]}, ensure_ascii=False) + "\n"
                for i in range(k, n, n_files)
            )
    return sum(map(len, texts))


# -- measuring ---------------------------------------------------------------------------------


def process_kind(p, root_pid: int) -> str:
    """driver (the side's own process), workers (Ray worker processes: actors, tasks) or ray
    (Ray's own: GCS, raylet, agents, log monitor)."""
    if p.pid == root_pid:
        return "driver"
    try:
        cmd = " ".join(p.cmdline())
    except Exception:  # gone, or not ours to read
        return "ray"
    return "workers" if "default_worker.py" in cmd else "ray"


class CpuTime:
    """User + system CPU seconds of a process tree (Ray's raylet and workers are its children),
    sampled every 0.1 s: each process's last reading, summed, less the readings at the start;
    `by_kind` splits them by `process_kind`."""

    def __init__(self, pid: int | None = None):
        import psutil

        self.root = psutil.Process(pid or os.getpid())
        self.last: dict[tuple[int, float], float] = {}
        self.kind: dict[tuple[int, float], str] = {}
        self.start = self._sample()
        self.frozen: float | None = None
        self.frozen_last: dict | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict:
        import psutil

        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return {}
        for p in procs:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                self.last[key] = t.user + t.system
                if key not in self.kind:
                    self.kind[key] = process_kind(p, self.root.pid)
            except psutil.Error:
                pass
        return dict(self.last)

    def _run(self):
        while not self._stop.wait(0.1):
            self._sample()

    def restart(self) -> None:
        """Count from now on (what the process did before is not counted)."""
        self.start = self._sample()

    def freeze(self) -> None:
        """Stop counting here (`seconds` keeps this reading)."""
        self._sample()
        self.frozen = self.seconds
        self.frozen_last = dict(self.last)

    @property
    def seconds(self) -> float:
        if self.frozen is not None:
            return self.frozen
        return sum(v - self.start.get(k, 0.0) for k, v in self.last.items())

    def by_kind(self) -> dict[str, float]:
        """CPU seconds per process kind, over the same span as `seconds`."""
        out: dict[str, float] = {}
        for k, v in (self.frozen_last or self.last).items():
            kind = self.kind.get(k, "ray")
            out[kind] = out.get(kind, 0.0) + v - self.start.get(k, 0.0)
        return out

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._sample()
        self._stop.set()
        self._thread.join()


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def kiln_child(inputs: str, out: str, cpus: int) -> None:
    """One Kiln run, in its own process as NeMo's: imports and Ray's start before START."""
    import pyarrow.parquet as pq

    from kiln.curator import CurateConfig, curate
    from kiln.platform.runtime import Runtime

    cfg = CurateConfig.model_validate(
        {
            "input": [inputs],
            "actors": cpus,
            "clean": {
                "fix_unicode": False,
                "normalization": "none",
                "remove_control_chars": False,
                "normalize_whitespace": False,
                "boilerplate_lines": False,
            },
            "filters": KILN_FILTERS,
            "dedup": {"exact": False, "fuzzy": {"enabled": False}},
            "output": {"plot": False},
        }
    )
    runtime = Runtime(num_cpus=cpus).ensure()
    print("START", flush=True)
    t0 = time.perf_counter()
    report = curate(cfg, out, runtime=runtime)
    print("SECONDS", time.perf_counter() - t0, flush=True)
    runtime.shutdown()
    shards = glob.glob(f"{out}/shard-*.parquet")
    kept = pq.read_table(shards, columns=["id"])["id"].to_pylist() if shards else []
    assert len(kept) == report["kept"], (len(kept), report["kept"])
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in report["seconds"].items() if k != "total")
    print("STEPS", steps, flush=True)
    print("KEPT", json.dumps(kept), flush=True)


def run_child(argv: list[str], env: dict) -> dict:
    """Run one side's process; wall time and CPU time of its process tree from its START line
    (after imports and Ray's start) to its SECONDS line (the pipeline done)."""
    before = load()
    with tempfile.TemporaryFile("w+") as log:
        # cwd: not a checkout, whose kiln Ray's workers would import before PYTHONPATH's
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=tempfile.gettempdir()
        )
        lines = {}
        with CpuTime(proc.pid) as cpu:
            for line in proc.stdout:
                word, _, rest = line.partition(" ")
                if word == "START":
                    cpu.restart()
                elif word == "SECONDS":
                    cpu.freeze()
                lines[word] = rest.strip()
            proc.wait()
        if proc.returncode or "KEPT" not in lines:
            log.seek(0)
            raise RuntimeError(f"{argv[1]} failed:\n{log.read()[-3000:]}")
    return {
        "seconds": float(lines["SECONDS"]),
        "cpu": cpu.seconds,
        "cpu_by_kind": cpu.by_kind(),
        "kept": set(json.loads(lines["KEPT"])),
        "load": f"{before}-{load()}",
        "steps": f"; {lines['STEPS']}" if "STEPS" in lines else "",
    }


def _env() -> dict:
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"))
    env.pop("RAY_ADDRESS", None)  # each side starts its own local Ray
    return env


def run_kiln(inputs: str, out: str, cpus: int, checkout: str | None = None) -> dict:
    """Kiln as imported here, or from another `checkout` (its folder first on PYTHONPATH)."""
    env = _env()
    if checkout:
        env["PYTHONPATH"] = os.pathsep.join([checkout, env.get("PYTHONPATH", "")])
    script = os.path.abspath(__file__)
    return run_child([sys.executable, script, "--kiln-child", inputs, out, str(cpus)], env)


def run_nemo(inputs: str, out: str, cpus: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(NEMO))
    return run_child([f"{NEMOVENV}/bin/python", f.name, inputs, out, str(cpus)], _env())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--make-venv", action="store_true", help=f"install {NEMO_REQUIREMENT}")
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--files", type=int, default=8, help="JSONL files (= tasks on each side)")
    ap.add_argument("--cpus", type=int, default=2, help="Ray CPUs and Kiln actors, both sides")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved runs, best of each kept")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None)
    ap.add_argument(
        "--kiln-baseline",
        default=None,
        help="also run Kiln from this checkout (e.g. main before a change), interleaved",
    )
    ap.add_argument("--kiln-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kiln_child:
        kiln_child(args.kiln_child[0], args.kiln_child[1], int(args.kiln_child[2]))
        return
    if args.make_venv:
        make_venv()
        return
    if not os.path.exists(f"{NEMOVENV}/bin/python"):
        sys.exit(f"{NEMOVENV}: no NeMo Curator venv (run with --make-venv, or set KILN_NEMOVENV)")
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="kiln-bench-nemo-"))
    inputs = os.path.join(work, "input")
    chars = make_corpus(args.docs, args.seed, inputs, args.files)
    print(f"corpus: {args.docs:,} English docs, {chars / 1e6:.0f}M chars -> {inputs}")
    best: dict[str, dict] = {}
    sides = [("kiln", run_kiln), ("nemo", run_nemo)]
    if args.kiln_baseline:
        base = os.path.abspath(args.kiln_baseline)
        sides.insert(1, ("kiln-baseline", lambda i, o, c: run_kiln(i, o, c, base)))
    for r in range(args.repeats):
        for name, fn in sides:
            res = fn(inputs, os.path.join(work, f"{name}-{r}"), args.cpus)
            kinds = ", ".join(f"{k} {v:.1f}" for k, v in sorted(res["cpu_by_kind"].items()))
            print(
                f"run {r} {name}: {res['seconds']:.1f}s wall, {res['cpu']:.1f} CPU-s ({kinds}), "
                f"{len(res['kept']):,} kept (load {res['load']}{res.get('steps', '')})"
            )
            if name not in best or res["seconds"] < best[name]["seconds"]:
                best[name] = res
    k, n = best["kiln"], best["nemo"]
    print(f"\n{'':24} {'docs/s':>8} {'docs/CPU-s':>10} {'kept':>7} {'load':>9}")
    rows = [("kiln", k), ("NeMo Curator 1.4", n)]
    if "kiln-baseline" in best:
        rows.insert(1, (f"kiln at {os.path.basename(args.kiln_baseline)}", best["kiln-baseline"]))
    for name, res in rows:
        print(
            f"{name:24} {args.docs / res['seconds']:8.0f} {args.docs / res['cpu']:10.0f} "
            f"{len(res['kept']):7,} {res['load']:>9}"
        )
    only_k, only_n = len(k["kept"] - n["kept"]), len(n["kept"] - k["kept"])
    print(
        f"kept by one side only: {only_k} kiln, {only_n} NeMo "
        f"({(only_k + only_n) / args.docs:.2%} of {args.docs:,} docs; {RULES} rules)"
    )
    print(
        f"kiln / NeMo: {n['seconds'] / k['seconds']:.2f}x docs/s, "
        f"{n['cpu'] / k['cpu']:.2f}x docs per CPU-second"
    )
    if "kiln-baseline" in best:
        b = best["kiln-baseline"]
        assert b["kept"] == k["kept"], "the baseline keeps other documents"
        print(
            f"kiln / kiln baseline: {b['seconds'] / k['seconds']:.2f}x docs/s, "
            f"{b['cpu'] / k['cpu']:.2f}x docs per CPU-second (the same kept set)"
        )
    rule_agreement(sorted(glob.glob(os.path.join(inputs, "*.jsonl")))[0])


if __name__ == "__main__":
    main()
