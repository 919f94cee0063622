"""Curator memory benchmark: peak memory of `kiln curate` as the corpus grows, against the size
of the same corpus as one pandas DataFrame.

For each size, the corpus of bench/curator.py (real English and Japanese paragraphs from
../shared/corpora, with planted exact and near duplicates) is written as JSONL, then the full
pipeline (read, clean, filter, exact + fuzzy dedup, shuffled shards) runs as `kiln curate` in a
fresh process with its own Ray. Memory is sampled every 0.2 s over that process and all its
descendants (Ray's GCS, raylet and workers), as PSS: shared pages (Ray's object store, shared
libraries) count once, split between the processes that map them. The driver's own peak RSS is
shown apart: the Dask dedup of the compact keys runs there.

Streaming bounds the per-document work (read, clean, filter, MinHash) to a few batches in
flight per worker, whatever the corpus size, and the dedup shuffles spill to disk past partd's
1 GB buffer; what still grows is the texts of candidate documents held for verification and the
row lists of the output pass. The script fits that growth and prints where the corpus would no
longer fit in this machine's RAM as a DataFrame, and kiln's memory there.

    .venv/bin/python bench/curator_memory.py --sizes 100000 400000 1000000   # ~25 min on 2 cores

`--memory-cap GIB` runs each `kiln curate` inside a cgroup (v1, needs root) limited to that much
memory with no swap: a machine that small, whose RAM the largest corpus as a DataFrame exceeds.
The run either completes under the cap or is killed by the kernel's OOM killer; the cgroup's own
peak (`memory.max_usage_in_bytes`, page cache of the files it writes included) is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from curator import PeakMemory


def pandas_bytes(docs: list[dict]) -> int:
    """What `pd.DataFrame(docs)[["id", "text"]].memory_usage(deep=True).sum()` reports, without
    building it: an 8-byte pointer per cell plus each string object's `sys.getsizeof`."""
    return sum(16 + sys.getsizeof(d["id"]) + sys.getsizeof(d["text"]) for d in docs)


class MemoryCap:
    """A cgroup v1 memory limit for a child process and everything it starts (Ray included)."""

    ROOT = "/sys/fs/cgroup/memory"

    def __init__(self, gib: float):
        self.path = os.path.join(self.ROOT, f"kiln-bench-{os.getpid()}-{time.monotonic_ns()}")
        os.mkdir(self.path)
        self._write("memory.limit_in_bytes", str(int(gib * 2**30)))
        self._write("memory.swappiness", "0")

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def _read(self, name: str) -> int:
        with open(os.path.join(self.path, name)) as f:
            return int(f.read().split()[0])

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd`, run by a shell that first moves itself into the cgroup, then execs it."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *cmd]

    def stats(self) -> dict:
        oom = 0
        with open(os.path.join(self.path, "memory.oom_control")) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    oom = int(line.split()[1])
        return {"cgroup_peak": self._read("memory.max_usage_in_bytes"), "oom_kills": oom}

    def close(self) -> None:
        for _ in range(100):  # Ray's processes may outlive the driver by a moment
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.2)


def write_corpus(n: int, seed: int, inputs: str) -> dict:
    """Write the corpus in a child process (its documents, several GB at millions, are gone when
    it exits) and return its character count and DataFrame size."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from curator import make_corpus;"  # the same corpus generator as bench/curator.py
        "from curator_memory import pandas_bytes;"
        "docs = make_corpus(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]);"
        "print(json.dumps({'chars': sum(len(d['text']) for d in docs),"
        " 'pandas': pandas_bytes(docs)}))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", code, here, str(n), str(seed), inputs],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_size(n: int, work: str, seed: int, cap_gib: float | None = None) -> dict:
    inputs = os.path.join(work, f"input-{n}")
    t = time.perf_counter()
    made = write_corpus(n, seed, inputs)
    chars, in_pandas = made["chars"], made["pandas"]
    on_disk = sum(os.path.getsize(os.path.join(inputs, f)) for f in os.listdir(inputs))
    print(
        f"\n{n:,} docs: {chars / 1e6:.0f}M chars, {on_disk / 2**20:.0f} MiB of JSONL, "
        f"{in_pandas / 2**20:.0f} MiB as a DataFrame (made in {time.perf_counter() - t:.0f}s)",
        flush=True,
    )
    out = os.path.join(work, f"out-{n}")
    cmd = [sys.executable, "-m", "kiln", "curate", "--input", inputs, "--output", out]
    cap = MemoryCap(cap_gib) if cap_gib else None
    t = time.perf_counter()
    proc = subprocess.Popen(
        cap.wrap(cmd) if cap else cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with PeakMemory(proc.pid, metric="pss") as mem:
        _, stderr = proc.communicate()
    seconds = time.perf_counter() - t
    if cap:
        capped = cap.stats()
        cap.close()
        print(
            f"  under a {cap_gib:g} GiB cap: cgroup peak {capped['cgroup_peak'] / 2**30:.2f} GiB "
            f"(page cache included), OOM kills {capped['oom_kills']}",
            flush=True,
        )
    if proc.returncode:
        raise RuntimeError(f"kiln curate failed on {n} docs:\n{stderr[-3000:]}")
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    assert report["invariant_holds"], report
    row = {
        "docs": n,
        "pandas": in_pandas,
        "peak_tree": mem.peak,
        "peak_driver": mem.peak_root,
        "seconds": seconds,
    }
    print(
        f"  kiln curate: {seconds:.0f}s ({n / seconds:.0f} docs/s incl. Ray start), kept "
        f"{report['kept']:,}; peak PSS of the process tree {mem.peak / 2**30:.2f} GiB, "
        f"driver peak RSS {mem.peak_root / 2**30:.2f} GiB",
        flush=True,
    )
    for d in (inputs, out):
        shutil.rmtree(d)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 400_000, 1_000_000])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None)
    ap.add_argument(
        "--memory-cap",
        type=float,
        default=None,
        metavar="GIB",
        help="run kiln inside a cgroup limited to this much memory (root, cgroup v1)",
    )
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="kiln-bench-curator-memory-")
    rows = [run_size(n, work, args.seed, args.memory_cap) for n in args.sizes]

    gib = 2**30
    print(
        f"\n{'docs':>10} {'DataFrame':>10} {'kiln tree PSS':>14} {'kiln driver':>12} "
        f"{'kiln/DataFrame':>15} {'docs/s':>7}"
    )
    for r in rows:
        print(
            f"{r['docs']:>10,} {r['pandas'] / gib:9.2f}G {r['peak_tree'] / gib:13.2f}G "
            f"{r['peak_driver'] / gib:11.2f}G {r['peak_tree'] / r['pandas']:14.2f}x "
            f"{r['docs'] / r['seconds']:7.0f}"
        )
    docs = np.array([r["docs"] for r in rows], dtype=float)
    tree = np.array([r["peak_tree"] for r in rows], dtype=float)
    frame = np.array([r["pandas"] for r in rows], dtype=float)
    if len(rows) >= 2:
        k_slope, k_base = np.polyfit(docs, tree, 1)
        f_slope = np.polyfit(docs, frame, 1)[0]
        ram = psutil.virtual_memory().total
        n_ram = ram / f_slope  # documents whose DataFrame alone fills RAM
        print(
            f"\ngrowth per million documents: DataFrame {f_slope * 1e6 / gib:.2f} GiB, "
            f"kiln {k_slope * 1e6 / gib:.2f} GiB (ratio {f_slope / k_slope:.1f}x) "
            f"over a fixed {k_base / gib:.2f} GiB"
        )
        print(
            f"this machine's RAM ({ram / gib:.0f} GiB) holds the corpus as a DataFrame up to "
            f"~{n_ram / 1e6:.1f}M documents; kiln's fitted peak there: "
            f"{(k_base + k_slope * n_ram) / gib:.1f} GiB"
        )


if __name__ == "__main__":
    main()
