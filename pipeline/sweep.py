"""Raise one dimension at a time (spec rule 14) until the GPU runs out of memory or a bound.

    python3 pipeline/sweep.py --device cuda:0 --vary width --start 64 --factor 2 --until-oom
    python3 pipeline/sweep.py --device cuda:0 --plan data/plans/width-until-oom.yaml

Each point is a fresh measurement process (forked by launcher.py) with its own run folder
under runs/, validated and appended to runs/resultats-bruts.csv while the next point
measures (its process starts as the previous one exits: launcher.py). A point's folder appears
only once it is whole (it is built under a hidden name, then renamed), so Ctrl-C leaves
whole runs only. The sweep itself is summarised in runs/<id>-sweep/sweep.json: the largest
configuration that fitted, its peaks, and predicted against measured counters per point.
Exit 0 done (an out-of-memory point ends a sweep normally), 1 a point failed validation,
2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

import launcher
import mesure_memoire
import record
import run_folders
import validate
import yaml

DIMENSIONS = ("batch", "context", "width")
SIZES = ("batch", "context", "width", "dtype", "warmup", "repeats")
HARD_CAP = 64  # --until-oom on a card larger than any today still stops
INTERRUPTED = "interrupted (Ctrl-C): every point listed is a whole run"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SystemExit(usage_error(message))


def usage_error(message: str) -> int:
    print(f"sweep.py: error: {message}", file=sys.stderr)
    return 2


def factor(text: str) -> float:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) or float(text) <= 1:
        raise argparse.ArgumentTypeError(f"expected a number > 1, got {text!r}")
    return float(text)


def fraction(text: str) -> float:
    if not re.fullmatch(r"0?\.[0-9]+|1(\.0+)?", text):
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cuda:N")
    parser.add_argument("--plan", help="a YAML plan under data/plans/ (instead of the flags)")
    parser.add_argument("--vary", choices=DIMENSIONS)
    parser.add_argument("--start", type=mesure_memoire.positive_int)
    parser.add_argument("--factor", type=factor, help="next = ceil(current x factor)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--until-oom", action="store_true")
    stop.add_argument("--max-steps", type=mesure_memoire.positive_int)
    stop.add_argument(
        "--memory-fraction",
        type=fraction,
        help="stop before a point whose predicted peak reserved exceeds X x memory",
    )
    for name, default in (
        ("batch", 1),
        ("context", 16),
        ("width", 64),
        ("warmup", 1),
        ("repeats", 2),
    ):
        parser.add_argument(f"--{name}", type=mesure_memoire.positive_int, default=default)
    parser.add_argument("--dtype", choices=sorted(mesure_memoire.DTYPE_BYTES), default="float32")
    parser.add_argument("--runs-dir", default=str(run_folders.RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--no-fork", action="store_true", help="fresh interpreters instead")
    return parser


def load_plan(path: str, registry) -> dict:
    """A YAML plan, checked against schemas/sweep-plan.schema.json before anything runs."""
    try:
        plan = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: cannot read the plan ({first})") from None
    if not isinstance(plan, dict):
        raise ValueError(f"{path}: a plan is a mapping")
    plan.setdefault("schema", "urn:iteragpu-lab:schema:sweep-plan:v1")
    errors = validate.validate_document(plan, registry)
    if errors:
        raise ValueError(f"{path}: {errors[0]}")
    return plan


def plan_from(args: argparse.Namespace, registry) -> dict:
    if args.plan:
        return load_plan(args.plan, registry)
    if not (args.vary and args.start and args.factor):
        raise ValueError("give --plan, or --vary, --start and --factor")
    if not (args.until_oom or args.max_steps or args.memory_fraction):
        raise ValueError("give a bound: --until-oom, --max-steps K or --memory-fraction X")
    stop = (
        {"until_oom": True}
        if args.until_oom
        else {"max_steps": args.max_steps}
        if args.max_steps
        else {"memory_fraction": args.memory_fraction}
    )
    base = {name: getattr(args, name) for name in SIZES}
    return {
        "schema": "urn:iteragpu-lab:schema:sweep-plan:v1",
        "vary": args.vary,
        "start": args.start,
        "factor": args.factor,
        "stop": stop,
        "base": base,
    }


def progress(step: int, total: int | None, text: str) -> None:
    if total:
        filled = round(20 * step / total)
        bar = "#" * filled + "." * (20 - filled)
        print(f"[{bar}] {step}/{total} {text}", flush=True)
    else:
        print(f"[{step}] {text}", flush=True)


def predicted_peak_reserved(configuration: dict, blocks: list[dict]) -> int:
    rows = mesure_memoire.predict_phases(configuration, blocks)
    return max(row["peak_reserved_bytes"] for row in rows)


class Point:
    """One point: a fresh measurement process writing into a hidden folder, renamed to
    <runs>/<id>/ once whole. Started `after` the previous point, its CUDA driver start-up
    overlaps that process's exit; its row is appended while the next point measures."""

    def __init__(self, runner, runs_dir: Path, device: str, configuration: dict, after=None):
        self.run_id = run_folders.new_run_id()
        self.folder = runs_dir / f".{self.run_id}.partial"
        self.folder.mkdir()
        argv = ["measure", "--device", device, "--output", str(self.folder / "measurement.json")]
        for name in SIZES:
            argv += [f"--{name}", str(configuration[name])]
        try:
            self.handle = runner.start(argv, after=after.handle if after else None)
        except BaseException:
            shutil.rmtree(self.folder)
            raise

    def finish(self) -> int:
        """The exit code once the files are written; the folder is then whole, or removed."""
        try:
            code = self.handle.result()
        except BaseException:
            self.discard()
            raise
        if (self.folder / "measurement.json").exists():
            whole = self.folder.parent / self.run_id
            os.rename(self.folder, whole)
            self.folder = whole
        else:
            self.discard()
        return code

    def discard(self) -> None:
        """Not kept: wait for the process, then remove the hidden folder it wrote into."""
        self.handle.wait()
        if self.folder.name.endswith(".partial"):  # never a whole run
            shutil.rmtree(self.folder, ignore_errors=True)


def record_point(point: Point, points: list[dict]) -> str | None:
    """Let its process go, then validate and append its row (record.py); a point that does
    not record leaves the summary too. None when done, else why not."""
    point.handle.wait()
    if record.main([str(point.folder)]) != 0:
        points.pop()
        return f"{point.folder.name} did not validate or record"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    registry = validate.load_registry()
    try:
        plan = plan_from(args, registry)
    except ValueError as exc:
        return usage_error(str(exc))
    if not re.fullmatch(r"cuda:[0-9]+", args.device):
        return usage_error(f"--device: expected cuda:N, got {args.device!r}")
    runs_dir = Path(args.runs_dir)
    stop = plan["stop"]
    total = stop.get("max_steps")
    runner = launcher.Launcher(fork=not args.no_fork)
    sweep_dir = runs_dir / f"{run_folders.new_run_id()}-sweep"
    configuration = dict(plan["base"], **{plan["vary"]: plan["start"]})
    points, reason, exit_code = [], None, 0
    started = last = time.perf_counter()
    measured = running = None  # measured: summarised, its row not yet appended
    try:
        for step in range(1, (total or HARD_CAP) + 1):
            if "memory_fraction" in stop and points and points[-1]["library_blocks"] is not None:
                limit = stop["memory_fraction"] * points[-1]["total_memory_bytes"]
                expected = predicted_peak_reserved(configuration, points[-1]["library_blocks"])
                if expected > limit:
                    reason = (
                        f"the next point's predicted peak reserved, {expected} bytes, "
                        f"exceeds {stop['memory_fraction']} of the GPU's memory"
                    )
                    break
            running = Point(runner, runs_dir, args.device, configuration, after=measured)
            if measured is not None:
                failure, measured = record_point(measured, points), None
                if failure:
                    reason, exit_code = failure, 1
                    break
            code = running.finish()
            finished, running = running, None
            if code not in (0, 3):
                finished.handle.wait()
                reason, exit_code = f"the measurement exited {code}", code
                break
            now = time.perf_counter()
            point = summarise_point(finished.folder, configuration, now - last)
            points.append(point)
            measured, last = finished, now
            progress(
                step,
                total,
                f"{plan['vary']}={configuration[plan['vary']]} "
                f"{point['status']} peak allocated {point['peak_allocated_bytes']} B "
                f"(predicted {point['predicted_peak_allocated_bytes']}) "
                f"{point['wall_seconds']:.2f} s",
            )
            if point["status"] == "out_of_memory":
                reason = "the GPU ran out of memory"
                break
            current = configuration[plan["vary"]]
            configuration[plan["vary"]] = max(current + 1, math.ceil(current * plan["factor"]))
        else:
            reason = f"{total or HARD_CAP} steps done"
    except KeyboardInterrupt:
        reason, exit_code = INTERRUPTED, 130
    try:
        if running is not None:
            running.discard()  # started, then not kept: a sweep that stops leaves no half run
        if measured is not None:
            failure = record_point(measured, points)
            if failure:
                reason, exit_code = failure, 1
    except KeyboardInterrupt:
        reason, exit_code = INTERRUPTED, 130
    if not points and exit_code not in (0, 130):
        print(
            f"sweep.py: error: the first point failed ({reason}): nothing written", file=sys.stderr
        )
        return exit_code
    write_summary(
        sweep_dir, plan, args.device, runner.mode, points, reason, time.perf_counter() - started
    )
    return exit_code


def summarise_point(folder: Path, configuration: dict, seconds: float) -> dict:
    document = json.loads((folder / "measurement.json").read_text())
    phases = document["phases"]
    calibration = document.get("calibration", {})
    return {
        "run": folder.name,
        "configuration": dict(configuration),
        "status": document["status"],
        "wall_seconds": round(seconds, 3),
        "peak_allocated_bytes": document["summary"]["largest_peak_allocated_bytes"],
        "peak_reserved_bytes": document["summary"]["largest_peak_reserved_bytes"],
        "predicted_peak_allocated_bytes": max(
            (row["predicted"]["peak_allocated_bytes"] for row in phases), default=0
        ),
        "predicted_peak_reserved_bytes": max(
            (row["predicted"]["peak_reserved_bytes"] for row in phases), default=0
        ),
        "largest_abs_difference_allocated_bytes": document["summary"]["prediction"][
            "largest_abs_difference_allocated_bytes"
        ],
        "library_blocks": calibration.get("blocks") if "error" not in calibration else None,
        "total_memory_bytes": document["environment"]["gpu"].get("total_memory_bytes"),
    }


def write_summary(sweep_dir, plan, device, mode, points, reason, seconds) -> None:
    fitted = [p for p in points if p["status"] == "completed"]
    summary = {
        "schema": "urn:iteragpu-lab:schema:sweep:v1",
        "plan": plan,
        "device": device,
        "process_start": mode,
        "stopped_because": reason,
        "wall_seconds": round(seconds, 3),
        "largest_fitted": fitted[-1] if fitted else None,
        "points": points,
    }
    sweep_dir.mkdir()
    with open(sweep_dir / "sweep.json", "x", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    print(f"{sweep_dir}: {len(points)} points; stopped because {reason}")
    if fitted:
        best = fitted[-1]
        print(
            f"largest that fitted: {best['configuration']} peak allocated "
            f"{best['peak_allocated_bytes']} B, peak reserved {best['peak_reserved_bytes']} B"
        )


if __name__ == "__main__":
    raise SystemExit(main())
