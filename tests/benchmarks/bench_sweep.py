"""What a fresh process per sweep point costs, and whether a change to the pipeline kept it.

    python3 tests/benchmarks/bench_sweep.py [--device cuda:0] [--points 20] [--forked-only]
    python3 tests/benchmarks/bench_sweep.py --baseline-pipeline DIR [--rounds 3] [--points 20]

The same N-point width sweep (start 8, factor 1.2, validation and log included), each in a
scratch runs directory. Without --baseline-pipeline: forked from the torch-loaded server,
then in fresh interpreters; per-point medians, whole-sweep times and their ratio. With
--baseline-pipeline DIR (an older pipeline/ folder, e.g. `git archive 929ccc9 pipeline |
tar -x -C /tmp/old`, then DIR=/tmp/old/pipeline): this pipeline and that one alternately,
new, old, new, old..., --rounds times each, in one run, so that drift touches both alike;
per-point medians per round and over all rounds, and the new/old ratio (target <= 1.10).
The first point of every sweep also waits for PyTorch to load: it is left out of the
per-point figures. Not a test: it needs a GPU. Exit 2 with one line when a sweep fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpu_guard

ROOT = Path(__file__).resolve().parents[2]
TARGET = 1.10  # new per point <= 1.10 x old


class Failed(Exception):
    """A sweep did not succeed: one line saying what."""


def one_sweep(pipeline: Path, device: str, points: int, fork: bool) -> tuple[float, list[float]]:
    """Run pipeline/stages/sweep.py once in a scratch runs directory: its wall time, and each
    point's seconds but the first."""
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        argv = [sys.executable, *sweep_command(pipeline), "--device", device]
        argv += ["--vary", "width", "--start", "8", "--factor", "1.2", "--max-steps", str(points)]
        argv += ["--runs-dir", scratch, *([] if fork else ["--no-fork"])]
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=pipeline.parent)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            # Every error line, in order: the cause is often a stage's line before the sweep's.
            said = [line for line in done.stderr.splitlines() if ": error: " in line]
            said = said or (done.stderr.strip().splitlines() or ["no message"])[-1:]
            raise Failed(f"{pipeline}'s sweep exited {done.returncode}: {' / '.join(said)}")
        [summary] = Path(scratch).glob("*-sweep/sweep.json")
        seconds = [p["wall_seconds"] for p in json.loads(summary.read_text())["points"]]
    return wall, seconds[1:] or seconds


def sweep_command(pipeline: Path) -> list[str]:
    """The sweep of a pipeline folder, run from the folder above it: a script of its own
    before the package's floors (pipeline/sweep.py), a module since."""
    if (pipeline / "sweep.py").is_file():
        return [str(pipeline / "sweep.py")]
    return ["-m", "pipeline.stages.sweep"]


def has_sweep(pipeline: Path) -> bool:
    return (pipeline / "sweep.py").is_file() or (pipeline / "stages" / "sweep.py").is_file()


def baseline_tree(folder: Path, scratch: Path) -> Path:
    """The older pipeline beside schemas/ and data/ (its own, if DIR has them as siblings,
    else this repository's): its scripts find them next to their own folder."""
    folder = folder.resolve()  # the links below are made in another folder
    pipeline = folder / "pipeline" if has_sweep(folder / "pipeline") else folder
    if not has_sweep(pipeline):
        raise Failed(f"{folder}: no sweep.py there, nor in {folder / 'pipeline'}")
    tree = scratch / "baseline"
    shutil.copytree(pipeline, tree / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("schemas", "data"):
        own = pipeline.parent / name
        (tree / name).symlink_to(own if own.is_dir() else ROOT / name)
    return tree / "pipeline"


def compare(args: argparse.Namespace) -> None:
    """New and old alternately, forked both; prints each round, then the medians and ratio."""
    with tempfile.TemporaryDirectory(prefix="bench-sweep-baseline-") as scratch:
        pipelines = {"new": ROOT / "pipeline", "old": baseline_tree(args.baseline, Path(scratch))}
        seconds: dict[str, list[float]] = {"new": [], "old": []}
        walls: dict[str, list[float]] = {"new": [], "old": []}
        for round_ in range(1, args.rounds + 1):
            for name, pipeline in pipelines.items():
                wall, per_point = one_sweep(pipeline, args.device, args.points, fork=True)
                seconds[name] += per_point
                walls[name].append(wall)
                print(
                    f"round {round_} {name}: per point median {statistics.median(per_point):.3f} s,"
                    f" whole {wall:.2f} s",
                    flush=True,
                )
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name in pipelines:
        print(
            f"{name}: per point median {medians[name]:.3f} s over {len(seconds[name])} points; "
            f"whole sweeps {[round(w, 2) for w in walls[name]]}"
        )
    ratio = medians["new"] / medians["old"]
    whole = statistics.median(walls["new"]) / statistics.median(walls["old"])
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(
        f"per point new/old {ratio:.3f} (target <= {TARGET}: {verdict}); whole new/old {whole:.3f}"
    )


def forked_and_fresh(args: argparse.Namespace) -> None:
    walls, medians = {}, {}
    for name in ("forked",) if args.forked_only else ("forked", "fresh"):
        walls[name], per_point = one_sweep(
            ROOT / "pipeline", args.device, args.points, fork=name == "forked"
        )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--forked-only", action="store_true", help="skip the fresh path")
    parser.add_argument("--baseline-pipeline", type=Path, dest="baseline", metavar="DIR")
    parser.add_argument("--rounds", type=int, default=3, help="with a baseline (default 3)")
    args = parser.parse_args(argv)
    gpu_guard.require_gpu("bench_sweep.py", args.device)
    print(f"{args.points}-point width sweep, validate and log included, on {args.device}")
    try:
        if args.baseline is not None:
            compare(args)
        else:
            forked_and_fresh(args)
    except Failed as failed:
        print(f"bench_sweep.py: error: {failed}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
