"""What the measure chain costs on top of the floor every GPU measurement pays.

    python3 tests/benchmarks/bench_measure_chain.py [--rounds 5] [--device cuda:0]

Times, by wall clock, three commands, alternating A, B, C in every round so that drift (file
cache, clocks, other tenants) touches all three alike, after one untimed round:

  A  nox -s measure -- --device cuda:0        the whole chain (environment, measurement,
                                              validation and log), small configuration, its
                                              run folders in a temporary directory
                                              (ITERAGPU_RUNS_DIR): never in runs/
  B  python3 kit/mesure_memoire.py measure --device cuda:0 --batch 1 --context 16
         --width 64 --dtype float32 --warmup 1 --repeats 2 --output <temporary file>
  C  python3 -c "import torch; torch.cuda.init(); torch.empty(1, device='cuda:0')"   the floor

Prints each round, the medians, then a/c and b/c against the targets (chain <= 1.1 x the
floor, kit script <= 1.15 x). The GPU commands run with $ITERAGPU_PYTHON, else python3 on
PATH (the noxfile's rule); nox runs as `<this Python> -m nox`. Exit 0 measured, 1 a command
failed, 2 no usable GPU or no nox (one line).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--batch", "1", "--context", "16", "--width", "64", "--dtype", "float32"]
SMALL += ["--warmup", "1", "--repeats", "2"]
TARGETS = {"chain": 1.1, "kit script": 1.15}


class Failed(Exception):
    """A command did not succeed: (exit status, one line saying what)."""


def run(command: list[str], env: dict) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise Failed(
            result.returncode, f"{' '.join(command[:4])}... exited {result.returncode}: {last}"
        )
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_measure_chain.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)
    python = os.environ.get("ITERAGPU_PYTHON") or shutil.which("python3") or sys.executable
    if importlib.util.find_spec("nox") is None:
        print(
            f"bench_measure_chain.py: error: nox is not installed for {sys.executable}",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-measure-chain-") as scratch:
        runs_dir = Path(scratch) / "runs"
        runs_dir.mkdir()
        env = {**os.environ, "ITERAGPU_RUNS_DIR": str(runs_dir), "ITERAGPU_PYTHON": python}
        floor = [
            python,
            "-c",
            f"import torch; torch.cuda.init(); torch.empty(1, device={args.device!r})",
        ]
        try:
            run(floor, env)
        except Failed as failed:
            print(
                f"bench_measure_chain.py: error: no usable GPU: {failed.args[1]}", file=sys.stderr
            )
            return 2
        kit = [
            python,
            str(ROOT / "pipeline" / "mesure_memoire.py"),
            "measure",
            "--device",
            args.device,
            *SMALL,
        ]
        commands = {
            "chain": [
                sys.executable,
                "-m",
                "nox",
                "-f",
                str(ROOT / "noxfile.py"),
                "-s",
                "measure",
                "--",
                "--device",
                args.device,
            ],
            "kit script": kit,
            "floor": floor,
        }
        outputs = (Path(scratch) / f"kit-{n}.json" for n in range(args.rounds + 1))
        times: dict[str, list[float]] = {name: [] for name in commands}
        try:
            for round_ in range(args.rounds + 1):  # round 0 is untimed: caches, first loads
                commands["kit script"] = [*kit, "--output", str(next(outputs))]
                seconds = {name: run(command, env) for name, command in commands.items()}
                if round_ == 0:
                    continue
                for name, value in seconds.items():
                    times[name].append(value)
                print(f"round {round_}: " + "  ".join(f"{n} {s:.3f} s" for n, s in seconds.items()))
        except Failed as failed:
            print(f"bench_measure_chain.py: error: {failed.args[1]}", file=sys.stderr)
            return 1
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"medians of {args.rounds} rounds on {args.device} with {python}: "
        + ", ".join(f"{n} {m:.3f} s" for n, m in medians.items())
    )
    for letter, name in (("a", "chain"), ("b", "kit script")):
        ratio = medians[name] / medians["floor"]
        verdict = "met" if ratio <= TARGETS[name] else "MISSED"
        print(f"{letter}/c = {ratio:.3f}  ({name} / floor; target <= {TARGETS[name]}: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
