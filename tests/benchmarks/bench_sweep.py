"""What a fresh process per measurement costs: forked from a torch-loaded server, or a fresh
interpreter. Runs the same 20-point sweep both ways, one after the other, in scratch runs
directories, and prints per-point medians, whole-sweep wall times and their ratios.

    python3 tests/benchmarks/bench_sweep.py [--device cuda:0] [--points 20]

Not a test: it needs a GPU. Exit 2 with one line when the first point cannot run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = Path(__file__).resolve().parents[2] / "pipeline" / "sweep.py"


def one_sweep(device: str, points: int, fork: bool) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as scratch:
        argv = [
            sys.executable,
            str(SWEEP),
            "--device",
            device,
            "--vary",
            "width",
            "--start",
            "8",
            "--factor",
            "1.2",
            "--max-steps",
            str(points),
            "--runs-dir",
            scratch,
        ]
        started = time.perf_counter()
        done = subprocess.run(
            argv + ([] if fork else ["--no-fork"]), capture_output=True, text=True
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise SystemExit(f"bench_sweep.py: error: the sweep exited {done.returncode}: {last}")
        [summary] = Path(scratch).glob("*-sweep/sweep.json")
        per_point = [p["wall_seconds"] for p in json.loads(summary.read_text())["points"]]
    return wall, per_point


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench_sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--points", type=int, default=20)
    args = parser.parse_args()
    forked_wall, forked = one_sweep(args.device, args.points, fork=True)
    fresh_wall, fresh = one_sweep(args.device, args.points, fork=False)
    print(f"{args.points}-point width sweep, validate and log included, on {args.device}")
    print(
        f"  forked   per point median {statistics.median(forked):.3f} s "
        f"(min {min(forked):.3f}, max {max(forked):.3f}); whole sweep {forked_wall:.2f} s"
    )
    print(
        f"  fresh    per point median {statistics.median(fresh):.3f} s "
        f"(min {min(fresh):.3f}, max {max(fresh):.3f}); whole sweep {fresh_wall:.2f} s"
    )
    print(
        f"  ratio fresh/forked: per point "
        f"{statistics.median(fresh) / statistics.median(forked):.2f}"
        f", whole sweep {fresh_wall / forked_wall:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
