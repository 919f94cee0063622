"""What the platform adds around a stage.

1. A no-op stage (one Ray task) run through a kiln Pipeline, against a bare `ray.init()` + one
   task + `ray.shutdown()`. Each side runs in a fresh process, timed from process start.
2. A cached re-run of the same pipeline against its first run.

    python bench/platform_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

BARE = """
import ray
ray.init(
    address="local", include_dashboard=False, _node_ip_address="127.0.0.1", configure_logging=False
)
assert ray.get(ray.remote(num_cpus=0.1)(lambda: 1).remote()) == 1
ray.shutdown()
"""

KILN = """
import sys
from kiln import Pipeline, stage_class
Pipeline("bench", [stage_class("noop")(tag=sys.argv[2])], runs_dir=sys.argv[1]).run()
"""


def timed(code: str, *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    bare, first, cached = [], [], []
    with tempfile.TemporaryDirectory() as runs:
        for i in range(args.repeats):
            bare.append(timed(BARE))
            first.append(timed(KILN, runs, f"run{i}"))
            cached.append(timed(KILN, runs, f"run{i}"))
    b, f, c = (statistics.median(x) for x in (bare, first, cached))
    print(f"{'measure':<44}{'seconds':>10}")
    print(f"{'bare ray.init + 1 task + shutdown':<44}{b:>10.2f}")
    print(f"{'kiln pipeline, no-op stage (1 task)':<44}{f:>10.2f}")
    print(f"{'platform overhead (kiln - bare)':<44}{f - b:>10.2f}   ratio kiln/bare = {f / b:.2f}x")
    print(
        f"{'kiln cached re-run (no Ray started)':<44}{c:>10.2f}   "
        f"ratio cached/first = {c / f:.2f}x ({f / c:.1f}x faster)"
    )


if __name__ == "__main__":
    main()
