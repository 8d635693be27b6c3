"""Whole-process wall time of verify.py, Python start-up included, against `python -c pass`.

    python tests/benchmarks/bench_verify.py                          # verifies the built zip
    python tests/benchmarks/bench_verify.py -n 30 -- dist/iteragpu-lab-v1.zip

Issue #5's target is 0.5 s for verifying the zip. Each run is a fresh interpreter, as a user
or CI runs it; the median of N runs is printed for verify and for an empty interpreter, so
the difference is what verify itself costs on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def median_wall(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - started)
        if result.returncode != 0:
            raise SystemExit(f"{command} exited {result.returncode}: {result.stderr.decode()}")
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_verify.py", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=20)
    parser.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    parser.add_argument("verify_args", nargs="*", default=["dist/iteragpu-lab-v1.zip"])
    args = parser.parse_args(argv)
    verify = [args.python, "-m", "pipeline.kit.verify", *args.verify_args]  # run in ROOT
    median_wall(verify, 2)  # warm the file cache and the bytecode cache first
    empty = median_wall([args.python, "-c", "pass"], args.runs)
    full = median_wall(verify, args.runs)
    print(f"python -c pass      median {empty * 1000:7.1f} ms over {args.runs} runs")
    what = " ".join(args.verify_args) or "(the repo)"
    print(f"verify.py {what}  median {full * 1000:7.1f} ms over {args.runs} runs")
    print(f"verify's own cost   {(full - empty) * 1000:7.1f} ms (target: whole process <= 500 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
