"""How long a whole quote takes, as a user pays it: a fresh `python -I` process, start to exit.

    python tests/benchmarks/bench_calcul_forfaits.py [--runs 60] [--python PATH]

Runs, alternating so that drift and noise hit all alike, N times each:
  pass    python -I -c pass                          (the interpreter's own start-up)
  floor   python -I -c "import argparse, csv, ..."   (the stdlib modules the script needs)
  quote   python -I pipeline/calcul_forfaits.py --gpu b200 --days 7 --lots 2
and prints each median and the ratio quote / pass (target: at most 2). This is a
measurement, not a test: it never fails on a slow machine. It writes no file.
"""

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "pipeline" / "calcul_forfaits.py"
TARGET = 2.0


def commands(python):
    return {
        "pass": [python, "-I", "-c", "pass"],
        "floor": [python, "-I", "-c", "import argparse, csv, datetime, decimal, hashlib"],
        "quote": [python, "-I", str(SCRIPT), "--gpu", "b200", "--days", "7", "--lots", "2"],
    }


def elapsed_ms(command):
    start = time.perf_counter_ns()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter_ns() - start) / 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="bench_calcul_forfaits.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=60, help="runs of each command (default 60)")
    parser.add_argument("--python", default=sys.executable, help="interpreter to time")
    args = parser.parse_args(argv)
    if args.runs < 3:
        parser.error("--runs must be at least 3")

    runs = commands(args.python)
    times = {name: [] for name in runs}
    for command in runs.values():  # one untimed round: file caches, .pyc of the stdlib
        elapsed_ms(command)
    for _ in range(args.runs):
        for name, command in runs.items():
            times[name].append(elapsed_ms(command))

    version = subprocess.run(
        [args.python, "-I", "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.runs} alternating runs each, Python {version}, {platform.machine()}")
    for name, command in runs.items():
        shown = " ".join(command[1:]).replace(str(SCRIPT), "pipeline/calcul_forfaits.py")
        print(f"  {name:5}  median {median[name]:6.1f} ms  min {min(times[name]):6.1f} ms  {shown}")
    ratio = median["quote"] / median["pass"]
    floor = median["floor"] / median["pass"]
    verdict = "within" if ratio <= TARGET else "above"
    print(f"  ratio quote / pass {ratio:.2f} ({verdict} the {TARGET:g}x target)")
    print(f"  ratio floor / pass {floor:.2f} (the imports alone, before any line of the script)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
