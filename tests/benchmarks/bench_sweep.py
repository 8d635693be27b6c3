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
    parser.add_argument("--forked-only", action="store_true", help="skip the fresh path")
    args = parser.parse_args()
    print(f"{args.points}-point width sweep, validate and log included, on {args.device}")
    walls, medians = {}, {}
    for name in ("forked",) if args.forked_only else ("forked", "fresh"):
        walls[name], per_point = one_sweep(args.device, args.points, fork=name == "forked")
        medians[name] = statistics.median(per_point)
        print(
            f"  {name:8s} per point median {medians[name]:.3f} s (min {min(per_point):.3f}, "
            f"max {max(per_point):.3f}); whole sweep {walls[name]:.2f} s"
        )
    print(
        f"  targets: per point <= 0.5 s ({'met' if medians['forked'] <= 0.5 else 'MISSED'}), "
        f"whole sweep <= 15 s ({'met' if walls['forked'] <= 15 else 'MISSED'})"
    )
    if "fresh" in walls:
        print(
            f"  ratio fresh/forked: per point {medians['fresh'] / medians['forked']:.2f}, "
            f"whole sweep {walls['fresh'] / walls['forked']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
