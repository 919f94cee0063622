"""The learned classifier (MiniLM sentence embeddings + a head) against fastText and against NeMo
Curator's CPU equivalent, on the real corpus (../shared/corpora/corpus.jsonl: 593 Python doc
pages in English, 914 Japanese man pages): held-out accuracy on the same seeded split, and
scoring docs/s and docs per CPU-second over the whole corpus, in one run.

Label rule (a domain classifier, two classes, both languages): `reference` when the document
documents a command or an API (pydoc `library/` and `c-api/`, man sections 1 and 8), `other`
otherwise (tutorials, HOWTOs, what's new, language reference; man sections 4-7: devices, file
formats, games, overviews).

NeMo Curator 1.4's model classifiers (quality, domain, FineWeb-Edu: DeBERTa `ModelStage`s) and
its embedders declare `Resources(gpus=1)`: on CPU its model-based scoring is
`FastTextQualityFilter` (in a `Score` stage here: every document scored and written, as
Kiln's `keep: all`). Its fastText model is trained here, in NeMo's venv,
on the same training rows (NeMo's preprocessing: newlines to spaces; Kiln's fastText settings),
and the pipeline JsonlReader -> Score -> JsonlWriter runs on its `RayDataExecutor` with a
local Ray of `--cpus` CPUs in its own process (imports and Ray's start not timed; CPU time of
its whole process tree, Ray's workers included). Kiln scores in this process (`kiln classify`:
read JSONL + score + write Parquet; CPU time of this process). Scoring runs are interleaved
(fastText, learned, NeMo, ...) and the best of each is kept.

  .venv/bin/python bench/curator_classify.py [--max-tokens 128] [--threads 1] [--cpus 2]
  .venv/bin/python bench/curator_classify.py --make-venv   # NeMo Curator + fasttext, once

NeMo Curator runs in KILN_NEMOVENV (default /tmp/nemovenv; `--make-venv` installs
nemo-curator and fasttext==0.9.3, its `text_cpu` extra's pin, from PyPI).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.curator_nemo import NEMO_REQUIREMENT, NEMOVENV, _env, load, run_child  # noqa: E402
from kiln.curator.classify import ClassifyConfig, classify  # noqa: E402
from kiln.curator.classify.config import FastTextConfig  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
REFERENCE = ("pydoc:library/", "pydoc:c-api/", "manja:man1/", "manja:man8/")
HELD_OUT, SEED, FILES = 0.2, 0, 4

# NeMo's side: train its fastText model on the training rows, measure it on the held-out rows
# with FastTextQualityFilter's own score (P(reference)), then (argv "score") time its pipeline.
NEMO = """
import glob, json, sys, time
mode, work, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
from nemo_curator.stages.text.filters.fasttext import FastTextQualityFilter
model = f"{work}/nemo-fasttext.bin"
if mode == "train":
    import fasttext
    t0 = time.perf_counter()
    fasttext.train_supervised(input=f"{work}/nemo-train.txt", thread=1, verbose=0,
                              **json.loads(sys.argv[4])).save_model(model)
    train_s = time.perf_counter() - t0
    f = FastTextQualityFilter(model_path=model, label="__label__reference")
    f.load_model()
    rows = [json.loads(l) for l in open(f"{work}/held-out.jsonl")]
    right = sum((f.score_document(r["text"]) >= 0.5) == (r["label"] == "reference") for r in rows)
    print("TRAIN", train_s, right / len(rows), flush=True)
    sys.exit()
import ray
from nemo_curator.backends.ray_data import RayDataExecutor
from nemo_curator.pipeline import Pipeline
from nemo_curator.stages.text.filters.score_filter import Score
from nemo_curator.stages.text.io.reader import JsonlReader
from nemo_curator.stages.text.io.writer import JsonlWriter
out = sys.argv[4]
score = FastTextQualityFilter(model_path=model, label="__label__reference")
stages = [JsonlReader(file_paths=f"{work}/corpus", files_per_partition=1, fields=["id", "text"]),
          Score(score_fn=score, score_field="score", text_field="text"),
          JsonlWriter(path=out)]
ray.init(address="local", num_cpus=cpus, include_dashboard=False)
print("START", flush=True)
t0 = time.perf_counter()
Pipeline(name="fasttext_quality", stages=stages).run(RayDataExecutor())
print("SECONDS", time.perf_counter() - t0, flush=True)
kept = [json.loads(l)["id"] for p in sorted(glob.glob(out + "/*.jsonl")) for l in open(p)]
print("KEPT", json.dumps(kept), flush=True)
ray.shutdown()
"""


def label(doc_id: str) -> str:
    return "reference" if doc_id.startswith(REFERENCE) else "other"


def write_inputs(corpus: str, work: str) -> tuple[str, dict[str, int]]:
    """The labelled JSONL (Kiln's training input), the corpus in FILES JSONL files (both sides
    score it), and NeMo's fastText training file and held-out rows, split exactly as Kiln's
    classifiers split the labelled rows (`random.Random(seed).shuffle`, the first `held_out`)."""
    with open(corpus, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    rows = [{"id": d["id"], "text": d["text"], "label": label(d["id"])} for d in docs]
    labelled = os.path.join(work, "labelled.jsonl")
    with open(labelled, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    os.makedirs(os.path.join(work, "corpus"))
    for i in range(FILES):
        with open(os.path.join(work, "corpus", f"part{i}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(
                json.dumps({"id": r["id"], "text": r["text"]}, ensure_ascii=False) + "\n"
                for r in rows[i::FILES]
            )
    order = list(range(len(rows)))
    random.Random(SEED).shuffle(order)
    n_test = max(1, int(len(order) * HELD_OUT))
    with open(os.path.join(work, "held-out.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(rows[i], ensure_ascii=False) + "\n" for i in order[:n_test])
    with open(os.path.join(work, "nemo-train.txt"), "w", encoding="utf-8") as f:
        for i in order[n_test:]:  # NeMo's filter reads text.replace("\n", " ")
            f.write(f"__label__{rows[i]['label']} {rows[i]['text'].replace(chr(10), ' ')}\n")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["label"]] = counts.get(r["label"], 0) + 1
    return labelled, counts


def kiln_train(name: str, extra: dict, labelled: str, work: str) -> dict:
    base = {"kind": "domain", "labelled": labelled, "held_out": HELD_OUT, "seed": SEED}
    # scores only the held-out rows here: the corpus is scored by kiln_score, timed
    cfg = base | {"input": [os.path.join(work, "held-out.jsonl")], "keep": {"method": "all"}}
    cfg |= extra
    trained = classify(ClassifyConfig.model_validate(cfg), os.path.join(work, f"{name}-train"))
    return {
        "model": trained["model"]["path"],
        "accuracy": trained["model"]["held_out_accuracy"],
        "held_out": trained["model"]["held_out_docs"],
        "train_s": trained["seconds"]["train"],
    }


def kiln_score(model: str, work: str, out: str) -> dict:
    """Score the corpus with a saved classifier here: wall and CPU seconds of the scoring."""
    before = load()
    cfg = {"input": [os.path.join(work, "corpus")], "model": model, "kind": "domain"}
    cfg["keep"] = {"method": "all"}
    cpu = time.process_time()
    report = classify(ClassifyConfig.model_validate(cfg), out)
    return {
        "docs": report["documents_in"],
        "seconds": report["seconds"]["score"],
        "cpu": time.process_time() - cpu,  # the whole call, reading and writing included
        "load": f"{before}-{load()}",
    }


def nemo(argv: list[str]) -> subprocess.CompletedProcess:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(NEMO))
    return [f"{NEMOVENV}/bin/python", f.name, *argv]


def nemo_train(work: str) -> dict:
    ft = FastTextConfig()  # Kiln's fastText defaults, in fasttext's own names
    params = {"dim": ft.dim, "epoch": ft.epoch, "lr": ft.lr, "wordNgrams": ft.word_ngrams,
              "minn": ft.minn, "maxn": ft.maxn, "bucket": ft.bucket}  # fmt: skip
    out = subprocess.run(
        nemo(["train", work, "1", json.dumps(params)]),
        capture_output=True,
        text=True,
        env=_env(),
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("TRAIN ")]
    if out.returncode or not line:
        sys.exit(f"NeMo's fastText training failed:\n{out.stderr[-3000:]}")
    _, train_s, acc = line[0].split()
    return {"train_s": float(train_s), "accuracy": float(acc)}


def nemo_score(work: str, out: str, cpus: int, docs: int) -> dict:
    res = run_child(nemo(["score", work, str(cpus), out]), _env())
    assert len(res["kept"]) == docs, (len(res["kept"]), docs)  # Score writes every document
    return res | {"docs": docs}


def make_venv() -> None:
    subprocess.run([sys.executable, "-m", "venv", NEMOVENV], check=True)
    pip = [f"{NEMOVENV}/bin/python", "-m", "pip", "install"]
    subprocess.run([*pip, NEMO_REQUIREMENT, "fasttext==0.9.3"], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens of each doc embedded")
    ap.add_argument("--hidden", type=int, default=64, help="MLP head width (0: logistic)")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the encoder")
    # 2: with 1 CPU, NeMo's fused reader + scorer actor holds it and the writer never runs
    ap.add_argument("--cpus", type=int, default=2, help="NeMo's local Ray CPUs (>= 2)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved scoring runs, best kept")
    ap.add_argument("--make-venv", action="store_true", help="install NeMo Curator + fasttext")
    args = ap.parse_args()
    if args.make_venv:
        make_venv()
        return
    if not os.path.exists(f"{NEMOVENV}/bin/python"):
        sys.exit(f"{NEMOVENV}: no NeMo Curator venv (run with --make-venv, or set KILN_NEMOVENV)")
    torch.set_num_threads(args.threads)
    emb = {"precision": args.precision}
    emb |= {} if args.max_tokens is None else {"max_tokens": args.max_tokens}
    emb |= {"hidden": args.hidden}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-classify-") as work:
        labelled, counts = write_inputs(args.corpus, work)
        print(f"labels: {counts} (rule: commands and APIs are `reference`); load {load()}")
        models = {
            "fastText": kiln_train("fasttext", {}, labelled, work),
            "learned": kiln_train(
                "embedding", {"classifier": "embedding", "embedding": emb}, labelled, work
            ),  # fmt: skip
        }
        nemo_fit = nemo_train(work)
        with open(os.path.join(models["learned"]["model"], "meta.json")) as f:
            cfg = json.load(f)["embedding"]
        best: dict[str, dict] = {}
        for r in range(args.repeats):  # interleaved: the load drifts
            runs = {
                name: kiln_score(m["model"], work, os.path.join(work, f"{name}-{r}"))
                for name, m in models.items()
            }
            runs["nemo"] = nemo_score(
                work, os.path.join(work, f"nemo-{r}"), args.cpus, runs["fastText"]["docs"]
            )
            for name, res in runs.items():
                print(
                    f"run {r} {name}: {res['docs'] / res['seconds']:.1f} docs/s, "
                    f"{res['docs'] / res['cpu']:.1f} docs/CPU-s (load {res['load']})"
                )
                if name not in best or res["seconds"] < best[name]["seconds"]:
                    best[name] = res
    head = f"MLP {cfg['hidden']}" if cfg["hidden"] else "logistic regression"
    rows = [
        ("Kiln fastText (1 thread)", models["fastText"], best["fastText"]),
        (f"Kiln MiniLM-{cfg['max_tokens']} {cfg['precision']} + {head} "
         f"({args.threads} thr.)", models["learned"], best["learned"]),
        (f"NeMo FastTextQualityFilter ({args.cpus} Ray CPU)", nemo_fit, best["nemo"]),
    ]  # fmt: skip
    print(f"\n{'classifier':56} {'acc':>6} {'train s':>8} {'docs/s':>8} {'docs/CPU-s':>10} load")
    for name, fit, res in rows:
        print(
            f"{name:56} {fit['accuracy']:6.3f} {fit['train_s']:8.1f} "
            f"{res['docs'] / res['seconds']:8.1f} {res['docs'] / res['cpu']:10.1f} {res['load']}"
        )
    n = models["fastText"]["held_out"]
    k, f, m = (best[x] for x in ("learned", "fastText", "nemo"))
    print(
        f"\nheld-out accuracy on the same {n} docs; learned / NeMo: "
        f"{m['seconds'] / k['seconds']:.3f}x docs/s, {m['cpu'] / k['cpu']:.3f}x docs/CPU-s; "
        f"learned / Kiln fastText: {f['seconds'] / k['seconds']:.3f}x docs/s; "
        f"Kiln fastText / NeMo: {m['seconds'] / f['seconds']:.2f}x docs/s"
    )


if __name__ == "__main__":
    main()
