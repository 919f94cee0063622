"""Curator benchmark: kiln vs HF datatrove's MinHash pipeline vs datasketch MinHashLSH.

Real text (../shared/corpora/corpus.jsonl: Python docs in English, man pages in Japanese) is cut
into paragraphs and recombined into documents, with planted exact copies and near-duplicates
(word/character replacement at several rates), to any size. Every tool runs on the same 2 cores.

  .venv/bin/python bench/curator.py --docs 200000

Prints documents/s per tool and the ratio to kiln, precision/recall of near-duplicate removal
against brute-force character 24-gram Jaccard (>= 0.8) on a sample of lineage groups, and the
peak memory (RSS summed over the process tree) of each run. datatrove and datasketch live in a
separate environment (they need numpy 2): KILN_BENCHVENV (default /tmp/benchvenv), made with
  python -m venv /tmp/benchvenv && /tmp/benchvenv/bin/pip install 'datatrove>=0.10,<0.11' \
      'datasketch>=2.0,<3' regex 'spacy>=3.7,<4' tokenizers 'xxhash<4' psutil
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import tempfile
import textwrap
import threading
import time

import numpy as np

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
BENCHVENV = os.environ.get("KILN_BENCHVENV", "/tmp/benchvenv")
THRESHOLD = 0.8


# -- corpus ------------------------------------------------------------------------------------


def _paragraphs(path: str) -> dict[str, list[str]]:
    pools: dict[str, list[str]] = {"en": [], "ja": []}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            for p in d["text"].split("\n\n"):
                if 80 <= len(p) <= 1500:
                    pools[d["lang"]].append(p)
    return pools


def _mutate(rng: random.Random, text: str, rate: float) -> str:
    """Replace a share of the words (characters for Japanese) with others from the same text."""
    if " " in text[:200]:
        words = text.split(" ")
        return " ".join(rng.choice(words) if rng.random() < rate else w for w in words)
    chars = list(text)
    return "".join(rng.choice(chars) if rng.random() < rate / 3 else c for c in chars)


def make_corpus(n: int, seed: int, out_dir: str, n_files: int = 8) -> list[dict]:
    rng = random.Random(seed)
    pools = _paragraphs(CORPUS)
    docs: list[dict] = []
    for i in range(n):
        r = rng.random()
        if i > 100 and r < 0.05:  # exact copy
            src = docs[rng.randrange(len(docs))]
            docs.append({"id": f"d{i:07d}", "text": src["text"], "group": src["group"]})
        elif i > 100 and r < 0.25:  # near duplicate at one of several distances
            src = docs[rng.randrange(len(docs))]
            text = _mutate(rng, src["text"], rng.choice([0.003, 0.01, 0.03, 0.1]))
            docs.append({"id": f"d{i:07d}", "text": text, "group": src["group"]})
        else:
            lang = "ja" if rng.random() < 0.35 else "en"
            text = "\n\n".join(rng.sample(pools[lang], rng.randint(2, 4)))
            docs.append({"id": f"d{i:07d}", "text": text, "group": i})
    os.makedirs(out_dir, exist_ok=True)
    for k in range(n_files):
        with open(os.path.join(out_dir, f"part-{k}.jsonl"), "w") as f:
            f.writelines(
                json.dumps({"id": d["id"], "text": d["text"]}, ensure_ascii=False) + "\n"
                for d in docs[k::n_files]
            )
    return docs


# -- ground truth ------------------------------------------------------------------------------


def true_pairs(docs: list[dict], n_groups: int, seed: int) -> tuple[set[str], set[tuple[str, str]]]:
    """(sample ids, pairs with char-24-gram Jaccard >= THRESHOLD), all pairs brute force."""
    import scipy.sparse as sp

    from kiln.curator.dedup.shingles import shingle_hashes

    groups: dict[int, list[dict]] = {}
    for d in docs:
        groups.setdefault(d["group"], []).append(d)
    dup_groups = [g for g, m in groups.items() if len(m) > 1]
    rng = random.Random(seed)
    chosen = rng.sample(dup_groups, min(n_groups, len(dup_groups))) + rng.sample(
        list(groups), n_groups
    )
    sample = {d["id"]: d["text"] for g in set(chosen) for d in groups[g]}
    ids = sorted(sample)
    h, doc = shingle_hashes([sample[i] for i in ids], 24)
    keys = np.unique(np.stack([doc, np.searchsorted(np.unique(h), h)]), axis=1)
    m = sp.csr_matrix((np.ones(keys.shape[1], dtype=np.float32), (keys[0], keys[1])))
    sizes = np.asarray(m.sum(axis=1)).ravel()
    inter = (m @ m.T).tocoo()
    jac = inter.data / (sizes[inter.row] + sizes[inter.col] - inter.data)
    keep = (inter.row < inter.col) & (jac >= THRESHOLD)
    return set(ids), {
        (ids[a], ids[b]) for a, b in zip(inter.row[keep], inter.col[keep], strict=True)
    }


def precision_recall(
    removed: set[str], sample: set[str], pairs: set[tuple[str, str]]
) -> tuple[float, float]:
    """Recall: share of true pairs with a member removed. Precision: share of removed sample
    documents that have a true near-duplicate partner."""
    partner = {x for p in pairs for x in p}
    hit = [a in removed or b in removed for a, b in pairs]
    removed_here = removed & sample
    recall = sum(hit) / max(len(hit), 1)
    precision = len(removed_here & partner) / max(len(removed_here), 1)
    return precision, recall


# -- measuring ---------------------------------------------------------------------------------


class PeakMemory:
    """Peak memory summed over a process and all its descendants (Ray workers included),
    sampled every 0.2 s, and the peak RSS of the process itself.

    `metric="rss"` counts shared pages (Ray's object store) once per process that maps them;
    `metric="pss"` splits them between those processes, so the sum counts them once."""

    def __init__(self, pid: int | None = None, metric: str = "rss"):
        import psutil

        self.proc = psutil.Process(pid or os.getpid())
        self.metric = metric
        self.peak = self.peak_root = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self, p) -> int:
        return p.memory_full_info().pss if self.metric == "pss" else p.memory_info().rss

    def _run(self):
        import psutil

        while not self._stop.is_set():
            total = 0
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    total += self._size(p)
                    if p.pid == self.proc.pid:
                        self.peak_root = max(self.peak_root, p.memory_info().rss)
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_kiln(inputs: str, out: str, dedup_only: bool, rows: int = 13) -> dict:
    import glob

    import pyarrow.parquet as pq

    from kiln.curator import CurateConfig, curate

    body = {
        "input": [inputs],
        "actors": 2,
        "output": {"shard_docs": 100_000},
        "dedup": {"fuzzy": {"rows": rows}},
    }
    if dedup_only:  # the same work datatrove's MinHash pipeline does
        none = {
            k: None
            for k in (
                "min_words",
                "max_words",
                "min_mean_word_length",
                "max_mean_word_length",
                "max_symbol_word_ratio",
                "max_bullet_line_ratio",
                "max_ellipsis_line_ratio",
                "min_alpha_word_ratio",
                "max_non_alnum_ratio",
                "max_digit_ratio",
                "max_dup_line_fraction",
                "max_dup_line_char_fraction",
                "max_dup_para_fraction",
                "max_dup_para_char_fraction",
                "top_ngram_char_fraction",
                "dup_ngram_char_fraction",
                "min_terminal_punct_line_ratio",
                "max_javascript_line_ratio",
                "max_curly_brace_ratio",
                "max_url_char_ratio",
                "languages",
            )
        }
        body["filters"] = none | {"lorem_ipsum": False}
        body["clean"] = {
            "fix_unicode": False,
            "normalization": "none",
            "remove_control_chars": False,
            "normalize_whitespace": False,
            "boilerplate_lines": False,
        }
    t0 = time.perf_counter()
    with PeakMemory() as mem:
        report = curate(CurateConfig.model_validate(body), out)
    seconds = time.perf_counter() - t0
    rej = pq.read_table(
        glob.glob(f"{out}/rejected/*.parquet"), columns=["id", "reason"]
    ).to_pydict()
    removed = {
        i
        for i, r in zip(rej["id"], rej["reason"], strict=True)
        if r in ("exact_duplicate", "fuzzy_duplicate")
    }
    return {
        "seconds": seconds,
        "docs": report["documents_in"],
        "removed": removed,
        "peak_rss": mem.peak,
        "report": report,
    }


DATATROVE = """
import sys, time
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup import (
    MinhashDedupSignature, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter)
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
def run(steps, tasks, name, work):
    LocalPipelineExecutor(
        pipeline=steps, tasks=tasks, workers=2, logging_dir=f"{work}/logs/{name}").run()
if __name__ == "__main__":  # datatrove's worker pool spawns: it re-imports this file
    inp, work = sys.argv[1], sys.argv[2]
    cfg = MinhashConfig()  # datatrove defaults: word 5-grams, 14 buckets x 8 hashes
    t0 = time.perf_counter()
    sigs = MinhashDedupSignature(output_folder=f"{work}/sigs", config=cfg)
    run([JsonlReader(inp), sigs], 8, "sig", work)
    buckets = MinhashDedupBuckets(
        input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=cfg)
    run([buckets], cfg.num_buckets, "buckets", work)
    clusters = MinhashDedupCluster(
        input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=cfg)
    run([clusters], 1, "cluster", work)
    dedup = MinhashDedupFilter(input_folder=f"{work}/remove_ids",
                               exclusion_writer=JsonlWriter(f"{work}/removed", compression=None))
    run([JsonlReader(inp), dedup, JsonlWriter(f"{work}/kept")], 8, "filter", work)
    print("SECONDS", time.perf_counter() - t0)
"""

DATASKETCH = """
import json, sys, time, glob
import numpy as np
from datasketch import MinHash, MinHashLSH
inp, n = sys.argv[1], int(sys.argv[2])
docs = []
for path in sorted(glob.glob(inp + "/*.jsonl")):
    docs += [json.loads(l) for l in open(path)]
docs = sorted(docs, key=lambda d: d["id"])[:n]
t0 = time.perf_counter()
lsh = MinHashLSH(num_perm=260, params=(20, 13))
removed = []
for d in docs:
    t = d["text"]
    m = MinHash(num_perm=260)
    m.update_batch([t[i:i + 24].encode() for i in range(max(len(t) - 23, 1))])
    if lsh.query(m):
        removed.append(d["id"])
    else:
        lsh.insert(d["id"], m)
print("SECONDS", time.perf_counter() - t0)
print("REMOVED", json.dumps(removed))
"""


def run_venv(script: str, *args: str) -> tuple[str, int]:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(script))
    proc = subprocess.Popen(
        [f"{BENCHVENV}/bin/python", f.name, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with PeakMemory(proc.pid) as mem:
        out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{script.split(chr(10))[1]} failed:\n{err[-3000:]}")
    return out, mem.peak


# -- classification row ------------------------------------------------------------------------


def perplexity_rows(paths: dict[str, str], docs: list[dict], work: str) -> list[tuple]:
    """Perplexity scoring docs/s on one CPU thread (= per core) with a Llama-style model of
    4 x 256 (untrained: throughput does not depend on the weights) and a BPE of 8k trained here."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from kiln.curator.classify import ClassifyConfig, classify
    from kiln.model.config import ModelConfig
    from kiln.model.formats.checkpoint import write_checkpoint
    from kiln.model.transformer import Transformer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [d["text"] for d in docs],
        trainers.BpeTrainer(vocab_size=8192, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tok.save(os.path.join(work, "tokenizer.json"))
    cfg = ModelConfig(vocab_size=8192, dim=256, n_layers=4, n_heads=8, ffn_hidden_dim=704,
                      max_seq_len=512)  # fmt: skip
    ckpt = write_checkpoint(os.path.join(work, "lm"), Transformer(cfg).eval())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    for lang, path in sorted(paths.items()):
        ppl = {"model": ckpt, "tokenizer": os.path.join(work, "tokenizer.json")}
        r = classify(
            ClassifyConfig(input=[path], kind="perplexity", perplexity=ppl),
            os.path.join(work, f"ppl-{lang}"),
        )
        rows.append(
            (f"perplexity 4x256, 1 core ({lang})", r["documents_in"], r["seconds"]["score"])
        )
    torch.set_num_threads(threads)
    return rows


def bench_classify(
    corpus: str, work: str, copies: int, perplexity: bool = True, repeats: int = 2
) -> None:
    """fastText quality scoring and perplexity docs/s on the real English and Japanese text,
    beside the whole curate pipeline's docs/s, and curate with the quality filter step vs without
    (one process each: stream inline, Dask threads)."""
    from kiln.curator import CurateConfig, curate
    from kiln.curator.classify import ClassifyConfig, classify

    with open(corpus, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    by_lang: dict[str, list[dict]] = {}
    for c in range(copies):  # copies carry a marker line so that dedup keeps them
        for d in docs:
            text = d["text"] if c == 0 else f"{d['text']}\n\n(copy {c})"
            by_lang.setdefault(d["lang"], []).append({"id": f"{d['id']}#{c}", "text": text})
    paths = {}
    for lang, rows in by_lang.items():
        paths[lang] = os.path.join(work, f"real-{lang}.jsonl")
        with open(paths[lang], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    hq = os.path.join(work, "hq.jsonl")  # every 4th real document stands in for a reference set
    with open(hq, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d["text"]}, ensure_ascii=False) + "\n" for d in docs[::4])
    trained = classify(  # 5 epochs: training cost is not what this row measures
        ClassifyConfig(
            input=list(paths.values()),
            high_quality=[hq],
            keep={"method": "all"},
            fasttext={"epoch": 5},
            sample_docs=1000,
        ),
        os.path.join(work, "cls-train"),
    )
    model = trained["model"]["path"]
    print(
        f"fastText trained on {trained['model']['train_docs']} docs in "
        f"{trained['seconds']['train']:.1f}s, held-out accuracy "
        f"{trained['model']['held_out_accuracy']:.3f} (reference = every 4th doc)"
    )
    rows = []
    for lang, path in sorted(paths.items()):
        r = classify(
            ClassifyConfig(input=[path], model=model, keep={"method": "all"}),
            os.path.join(work, f"cls-{lang}"),
        )
        rows.append((f"fastText scoring ({lang})", r["documents_in"], r["seconds"]["score"]))
    if perplexity:
        rows += perplexity_rows(paths, docs, work)
    base = {"input": list(paths.values()), "stream": "inline", "output": {"plot": False}}
    seconds: dict[str, float] = {}
    runs = (("curate", {}), ("curate + quality filter", {"quality_model": model}))
    for r in range(repeats):  # interleaved, best of each: a busy machine's load drifts
        for name, extra in runs:
            cfg = CurateConfig.model_validate(base | {"filters": extra})
            t0 = time.perf_counter()
            report = curate(cfg, os.path.join(work, f"{name.replace(' ', '')}-{r}"))
            seconds[name] = min(seconds.get(name, float("inf")), time.perf_counter() - t0)
    rows += [(name, report["documents_in"], seconds[name]) for name, _ in runs]
    print(f"\n{'step':28} {'docs':>7} {'seconds':>8} {'docs/s':>9}")
    for name, n, sec in rows:
        print(f"{name:28} {n:7,} {sec:8.2f} {n / sec:9.0f}")
    score_s = sum(sec for name, _, sec in rows if name.startswith("fastText scoring"))
    print(
        f"fastText scoring alone = {score_s / seconds['curate']:.1%} of curate time; the quality"
        f" filter step adds {seconds['curate + quality filter'] / seconds['curate'] - 1:+.1%}"
        " (target <= 25%)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument(
        "--datasketch-docs", type=int, default=20_000, help="datasketch is pure Python: a prefix"
    )
    ap.add_argument("--sample-groups", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None)
    ap.add_argument(
        "--kiln-rows", type=int, default=0, help="also run kiln with 20 bands of this many rows"
    )
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["datatrove", "datasketch", "kiln-full"]
    )
    ap.add_argument(
        "--classify",
        action="store_true",
        help="only the classification row: fastText docs/s on the real text vs curate's",
    )
    ap.add_argument("--copies", type=int, default=1, help="--classify: copies of the real corpus")
    ap.add_argument("--repeats", type=int, default=2, help="--classify: curate runs, best kept")
    ap.add_argument("--no-perplexity", action="store_true", help="--classify: skip perplexity")
    args = ap.parse_args()
    import glob

    if args.classify:
        work = args.work or tempfile.mkdtemp(prefix="kiln-bench-cls-")
        bench_classify(CORPUS, work, args.copies, not args.no_perplexity, args.repeats)
        return

    work = args.work or tempfile.mkdtemp(prefix="kiln-bench-curator-")
    inputs = os.path.join(work, "input")
    t = time.perf_counter()
    docs = make_corpus(args.docs, args.seed, inputs)
    size = sum(len(d["text"]) for d in docs)
    print(
        f"corpus: {len(docs):,} docs, {size / 1e6:.0f}M chars, "
        f"in {time.perf_counter() - t:.0f}s -> {inputs}"
    )
    sample, pairs = true_pairs(docs, args.sample_groups, args.seed)
    print(
        f"ground truth: {len(sample):,} sampled docs, "
        f"{len(pairs):,} pairs with Jaccard >= {THRESHOLD} (brute force)"
    )
    import pandas as pd

    in_pandas = (
        pd.DataFrame([{"id": d["id"], "text": d["text"]} for d in docs])
        .memory_usage(deep=True)
        .sum()
    )
    print(f"the corpus as one pandas DataFrame: {in_pandas / 2**20:.0f} MiB")
    rows = []

    def row(name, seconds, n, removed, peak, sample_ids=sample, true=pairs):
        p, r = precision_recall(removed, sample_ids, true)
        rows.append((name, n / seconds, p, r, peak, seconds, n))

    from kiln.platform.runtime import Runtime

    t = time.perf_counter()
    runtime = Runtime().ensure()  # one Ray for all kiln runs (its start is reported, not counted)
    print(f"Ray started in {time.perf_counter() - t:.1f}s")
    kd = run_kiln(inputs, os.path.join(work, "kiln-dedup"), dedup_only=True)
    row("kiln exact+fuzzy", kd["seconds"], kd["docs"], kd["removed"], kd["peak_rss"])
    if args.kiln_rows:
        kr = run_kiln(
            inputs, os.path.join(work, "kiln-dedup-rows"), dedup_only=True, rows=args.kiln_rows
        )
        row(
            f"kiln exact+fuzzy 20x{args.kiln_rows}",
            kr["seconds"],
            kr["docs"],
            kr["removed"],
            kr["peak_rss"],
        )
    if "kiln-full" not in args.skip:
        kf = run_kiln(inputs, os.path.join(work, "kiln-full"), dedup_only=False)
        rows.append(
            (
                "kiln clean+filter+exact+fuzzy",
                kf["docs"] / kf["seconds"],
                float("nan"),
                float("nan"),
                kf["peak_rss"],
                kf["seconds"],
                kf["docs"],
            )
        )
        print("kiln full funnel:", json.dumps(kf["report"]["removed_by_reason"]))
    runtime.shutdown()
    if "datatrove" not in args.skip:
        out, peak = run_venv(DATATROVE, inputs, os.path.join(work, "datatrove"))
        seconds = float(re.search(r"SECONDS (\S+)", out).group(1))
        removed = set()
        for path in glob.glob(os.path.join(work, "datatrove", "removed", "*")):
            with open(path) as f:
                removed |= {json.loads(line)["id"] for line in f}
        row("datatrove MinHash", seconds, len(docs), removed, peak)
    if "datasketch" not in args.skip:
        n = min(args.datasketch_docs, len(docs))
        out, peak = run_venv(DATASKETCH, inputs, str(n))
        seconds = float(re.search(r"SECONDS (\S+)", out).group(1))
        removed = set(json.loads(re.search(r"REMOVED (.*)", out).group(1)))
        prefix = {d["id"] for d in docs[:n]}
        row(
            "datasketch MinHashLSH",
            seconds,
            n,
            removed,
            peak,
            sample & prefix,
            {p for p in pairs if p[0] in prefix and p[1] in prefix},
        )
    base = rows[0][1]
    print(
        f"\n{'tool':32} {'docs/s':>9} {'vs kiln':>8} {'precision':>9} {'recall':>7} "
        f"{'peak RSS':>9} {'seconds':>8} {'docs':>8}"
    )
    for name, rate, p, r, peak, seconds, n in rows:
        print(
            f"{name:32} {rate:9.0f} {base / rate:7.2f}x {p:9.3f} {r:7.3f} "
            f"{peak / 2**30:8.2f}G {seconds:8.1f} {n:8,}"
        )


if __name__ == "__main__":
    main()
