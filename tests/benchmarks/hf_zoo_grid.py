"""Published Hugging Face configs (the zoo) predicted without a GPU, measured on one, compared.

    python3 tests/benchmarks/hf_zoo_grid.py predict   --points POINTS.txt --out DIR
    python3 tests/benchmarks/hf_zoo_grid.py measure   --points POINTS.txt --out DIR \\
        [--device cuda:0] [--only NAME,NAME] [--shard I/N] [--deadline-s 510]
    python3 tests/benchmarks/hf_zoo_grid.py summarise --out DIR

POINTS.txt holds one point a line, `#` starting a comment:

    NAME CONFIG TASK FLAGS... [| ESTIMATE-ONLY FLAGS...]
    @estimate FLAGS...        (estimate-only flags for every point below, e.g. --gpu h200)

CONFIG is a path, or a file name under tests/data/hf-configs/; or a workload of one's own,
FILE.py:FUNCTION (`own_model.py --workload`), whose TASK (training or inference) says what
the function runs and is not passed on. FLAGS go to both
`own_model.py estimate` and `own_model.py measure` (--batch, --dtype, --dim sequence=S,
--new-tokens, --lora-rank, --gradient-checkpointing...); the flags after `|`, and those of
the last `@estimate` line, go to the estimate only: this script knows no flag of its own
beyond NAME, CONFIG and TASK.

- predict (no GPU): for each point `own_model.py estimate ... --json` into DIR/cpu/NAME.json,
  one line per point in DIR/cpu/timings.txt; refuses to start if any of its files is there.
- measure (a GPU, after gpu_guard's check): for each point of the selection
  `own_model.py measure --device cuda:0 ... --output DIR/h200/NAME.json`, one fresh process
  each, a point already measured skipped; a failed point is recorded (exit, last stderr
  line) in DIR/h200/measure-SELECTION.txt, its whole stderr in DIR/h200/NAME.stderr.txt,
  and the next one runs; no new point is started
  past --deadline-s. Exit 1 if a point of the selection is not measured.
- summarise: DIR/summary.json (schemas/hf-zoo-grid.schema.json; validate.py checks its
  totals) and DIR/comparison.md, from DIR/points.txt, cpu/ and h200/ (`--measured-in
  FOLDER`, for both measure and summarise, names another folder, e.g. after another GPU).
  A point predicted and never run on the GPU (no measurement, and no line in a measure log
  or one saying it was not started) is `not_measured`; one that ran and left no completed
  measurement, or has no prediction, crashed.

Both predict and measure copy POINTS.txt to DIR/points.txt (refusing a different one there).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
CONFIGS = ROOT / "tests" / "data" / "hf-configs"
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root
# the commands it starts find it the same way (`python -m pipeline...`)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
)
from kit import mesure_memoire  # noqa: E402
from pipeline.measuring import own_model as own_model_cli  # noqa: E402

SCHEMA = "urn:iteragpu-lab:schema:hf-zoo-grid:v1"
COUNTERS = mesure_memoire.COUNTER_KEYS
PEAKS = ("peak_allocated_bytes", "peak_reserved_bytes")
TASKS = ("inference", "generate", "training", "lora", "qlora")
CRASH, NOT_MEASURED = "crash", "not_measured"
NOT_STARTED = "not started:"  # a measure log's line for a point the deadline left out
EXACT_HELD, FALSE_EXACT = "exact_held", "false_exact"
BOUNDS_HELD, BOUNDS_BROKEN, NO_CLAIM = "bounds_held", "bounds_broken", "no_claim"
LOG = re.compile(r"^(?P<name>\S+) exit (?P<exit>-?\d+) (?P<seconds>[0-9.]+) s: (?P<last>.*)$")


class Point(NamedTuple):
    name: str
    config: str
    task: str
    flags: tuple[str, ...]
    estimate_flags: tuple[str, ...]


class PointsError(ValueError):
    pass


# ---------------------------------------------------------------- points


def read_points(text: str) -> list[Point]:
    points, names, estimate_default = [], set(), ()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("@estimate"):
            estimate_default = tuple(shlex.split(line[len("@estimate") :]))
            continue
        both, _, only = line.partition("|")
        words = shlex.split(both)
        if len(words) < 3:
            raise PointsError(f"line {number}: want NAME CONFIG TASK [FLAGS] [| FLAGS]")
        name, config, task, *flags = words
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise PointsError(f"line {number}: {name!r} is not a usable file name")
        if name in names:
            raise PointsError(f"line {number}: {name} named twice")
        if task not in TASKS:
            raise PointsError(f"line {number}: task {task!r} is not one of {', '.join(TASKS)}")
        if workload_of(config) is not None and task not in ("training", "inference"):
            raise PointsError(f"line {number}: a workload's task is training or inference")
        names.add(name)
        points.append(
            Point(name, config, task, tuple(flags), estimate_default + tuple(shlex.split(only)))
        )
    if not points:
        raise PointsError("no point")
    return points


def config_path(config: str) -> Path:
    for candidate in (Path(config), ROOT / config, CONFIGS / config):
        if candidate.is_file():
            return candidate
    return CONFIGS / config


def flag_settings(flags) -> dict:
    """dtype, batch and sequence as the flags give them (None where absent)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--dtype")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--dim", action="append", default=[])
    known, _ = parser.parse_known_args(list(flags))
    dims = dict(item.split("=", 1) for item in known.dim if "=" in item)
    sequence = dims.get("sequence")
    return {
        "dtype": known.dtype,
        "batch": known.batch,
        "sequence": int(sequence) if sequence and sequence.isdigit() else None,
    }


def copy_points(points_file: Path, out: Path) -> None:
    text = points_file.read_text()
    target = out / "points.txt"
    if target.exists() and target.read_text() != text:
        raise SystemExit(f"hf_zoo_grid.py: error: {target} is there and differs from {points_file}")
    out.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.write_text(text)


# ---------------------------------------------------------------- running


def workload_of(config: str) -> tuple[Path, str] | None:
    """(FILE, FUNCTION) of a workload function, as own_model.py --workload reads it; None for
    a Hugging Face config."""
    try:
        return own_model_cli.workload_argument(config)
    except argparse.ArgumentTypeError:
        return None


def own_model(verb: str, point: Point, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "pipeline.measuring.own_model", verb]
    workload = workload_of(point.config)
    if workload is not None:
        argv += ["--workload", f"{config_path(str(workload[0]))}:{workload[1]}"]
    else:
        argv += ["--hf-config", str(config_path(point.config)), "--task", point.task]
    return argv + list(point.flags) + list(extra)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def predict(args) -> int:
    points = read_points(Path(args.points).read_text())
    out = Path(args.out)
    cpu = out / "cpu"
    there = [cpu / f"{p.name}.json" for p in points] + [cpu / "timings.txt"]
    there = [path for path in there if path.exists()]
    if there:
        print(f"hf_zoo_grid.py: error: {there[0]} is there: refusing to overwrite", file=sys.stderr)
        return 2
    copy_points(Path(args.points), out)
    cpu.mkdir(parents=True, exist_ok=True)
    failed = 0
    for i, point in enumerate(points, 1):
        argv = own_model("estimate", point, *point.estimate_flags, "--json")
        started = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        target = cpu / f"{point.name}.json"
        if result.returncode == 0:
            target.write_text(result.stdout)
            said = f"{target.name}: written"
        else:
            failed += 1
            said = last_line(result.stderr) or "no output"
        line = f"{point.name} exit {result.returncode} {seconds:.1f} s: {said}"
        with (cpu / "timings.txt").open("a") as handle:
            handle.write(line + "\n")
        print(f"[{i}/{len(points)}] {line}", flush=True)
    return 1 if failed else 0


def selection(points: list[Point], only: str | None, shard: str | None) -> list[Point]:
    chosen = points
    if only:
        wanted = [name for name in only.split(",") if name]
        unknown = sorted(set(wanted) - {p.name for p in points})
        if unknown:
            raise PointsError(f"--only: no point named {', '.join(unknown)}")
        chosen = [p for p in chosen if p.name in wanted]
    if shard:
        match = re.fullmatch(r"(\d+)/(\d+)", shard)
        if not match or not 1 <= int(match[1]) <= int(match[2]):
            raise PointsError(f"--shard {shard}: want I/N with 1 <= I <= N")
        i, n = int(match[1]), int(match[2])
        chosen = [p for k, p in enumerate(chosen) if k % n == i - 1]
    return chosen


def measure(args) -> int:
    points = read_points(Path(args.points).read_text())
    chosen = selection(points, args.only, args.shard)
    import gpu_guard

    gpu_guard.require_gpu("hf_zoo_grid.py", args.device)
    out = Path(args.out)
    copy_points(Path(args.points), out)
    h200 = out / args.measured_in
    h200.mkdir(parents=True, exist_ok=True)
    tag = (args.shard or "").replace("/", "of") or ("only" if args.only else "all")
    log = h200 / f"measure-{tag}.txt"
    started_all, missing = time.perf_counter(), []
    for i, point in enumerate(chosen, 1):
        target = h200 / f"{point.name}.json"
        if target.exists():
            print(f"[{i}/{len(chosen)}] {point.name}: already measured, skipped", flush=True)
            continue
        if time.perf_counter() - started_all > args.deadline_s:
            missing.append(point.name)
            line = f"{point.name} exit -1 0.0 s: {NOT_STARTED} past --deadline-s {args.deadline_s}"
        else:
            argv = own_model("measure", point, "--device", args.device, "--output", str(target))
            history = h200 / f"{point.name}.history.pickle"
            if args.segments:
                argv += ["--memory-history", str(history)]
            started = time.perf_counter()
            try:
                result = subprocess.run(
                    argv, capture_output=True, text=True, timeout=args.timeout_s, check=False
                )
                code = result.returncode
                # its status line (stdout) when it ran; else its last words, the whole
                # traceback kept beside: a warning's last line says nothing of the point
                said = last_line(result.stdout) if code == 0 else last_line(result.stderr)
                if code != 0 and result.stderr.strip():
                    (h200 / f"{point.name}.stderr.txt").write_text(result.stderr)
                said = said or last_line(result.stderr) or last_line(result.stdout)
            except subprocess.TimeoutExpired:
                code, said = -9, f"killed after --timeout-s {args.timeout_s}"
            seconds = time.perf_counter() - started
            if args.segments and history.exists():
                keep_segments(history, h200 / f"{point.name}.segments.json")
            if code != 0 or not target.exists():
                missing.append(point.name)
            line = f"{point.name} exit {code} {seconds:.1f} s: {said or 'no output'}"
        with log.open("a") as handle:
            handle.write(line + "\n")
        print(f"[{i}/{len(chosen)}] {line}", flush=True)
    if missing:
        print(f"not measured: {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0


def keep_segments(history: Path, target: Path) -> None:
    """Of a measurement's allocator history (megabytes), what the driver's placement of
    segments needs (kilobytes): each segment event's action, size and address, in order."""
    import pickle

    events = pickle.loads(history.read_bytes())["snapshot"]["device_traces"][0]
    segments = [
        {"action": e["action"], "size": e["size"], "address": e["addr"]}
        for e in events
        if e["action"] in ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
    ]
    target.write_text(json.dumps({"segments": segments}) + "\n")
    history.unlink()


# ---------------------------------------------------------------- summarising


def read_log(folder: Path, pattern: str) -> dict[str, dict]:
    """The last line recorded for each point in the folder's logs."""
    entries = {}
    for path in sorted(folder.glob(pattern)):
        for raw in path.read_text().splitlines():
            match = LOG.match(raw.strip())
            if match:
                entries[match["name"]] = {
                    "exit": int(match["exit"]),
                    "seconds": float(match["seconds"]),
                    "last_line": match["last"],
                }
    return entries


def read_document(path: Path):
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def counters_of(row: dict) -> dict:
    return {key: row[key] for key in COUNTERS if isinstance(row.get(key), int)}


def row_bounds(row: dict) -> dict:
    """Per-row bounds written as <stem>_lower_bytes / <stem>_upper_bytes."""
    found = {}
    for key in COUNTERS:
        stem = key[: -len("_bytes")]
        lower, upper = row.get(f"{stem}_lower_bytes"), row.get(f"{stem}_upper_bytes")
        if isinstance(lower, int) or isinstance(upper, int):
            found[key] = {"lower": lower, "upper": upper}
    return found


def one_bound(value):
    if isinstance(value, dict):
        return {"lower": value.get("lower"), "upper": value.get("upper")}
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return {"lower": value[0], "upper": value[1]}
    return None


def bounds_of(prediction: dict, count: int) -> list[dict] | None:
    """Each predicted phase's bounds, {counter: {lower, upper}}, from per-row keys or from
    prediction.bounds (a list by phase, or {"phases": [...]}); None when there are none."""
    phases = prediction.get("phases") or []
    rows = [row_bounds(row) if isinstance(row, dict) else {} for row in phases]
    listed = prediction.get("bounds")
    if isinstance(listed, dict) and isinstance(listed.get("phases"), list):
        listed = listed["phases"]
    if isinstance(listed, list):
        for i, entry in enumerate(listed[:count]):
            if not isinstance(entry, dict):
                continue
            merged = row_bounds(entry)
            for key in COUNTERS:
                if key in entry and one_bound(entry[key]) is not None:
                    merged[key] = one_bound(entry[key])
            if i < len(rows):
                rows[i].update(merged)
    return rows if any(rows) else None


def compare(predicted: list[dict], measured: list[dict], bounds: list[dict] | None) -> dict:
    aligned = len(predicted) == len(measured) and all(
        p.get("phase") == m.get("phase") for p, m in zip(predicted, measured, strict=False)
    )
    largest = dict.fromkeys(COUNTERS, 0)
    for p, m in zip(predicted, measured, strict=False):
        for key in COUNTERS:
            if key in p["counters"] and key in m["counters"]:
                largest[key] = max(largest[key], abs(m["counters"][key] - p["counters"][key]))
            else:
                aligned = False
    broken, checked = [], 0
    for i, (m, phase_bounds) in enumerate(zip(measured, bounds or [], strict=False)):
        for key, bound in sorted(phase_bounds.items()):
            value = m["counters"].get(key)
            if value is None:
                continue
            checked += 1
            lower, upper = bound.get("lower"), bound.get("upper")
            if (isinstance(lower, int) and value < lower) or (
                isinstance(upper, int) and value > upper
            ):
                broken.append(
                    {"phase_index": i, "phase": m["phase"], "counter": key,
                     "lower": lower, "upper": upper, "measured": value}
                )  # fmt: skip
    return {
        "phases_aligned": aligned,
        "largest_abs_difference": largest,
        "equal_to_the_byte": aligned and not any(largest.values()),
        "bounds_checked": checked,
        "bounds_broken": broken,
    }


def verdicts_of(status: str | None, comparison: dict | None, run: bool = True) -> list[str]:
    """run: the point was run on the GPU (a measurement, or a line in the measure log)."""
    if comparison is None:
        return [CRASH] if run else [NOT_MEASURED]
    verdicts = []
    if status == "exact":
        verdicts.append(EXACT_HELD if comparison["equal_to_the_byte"] else FALSE_EXACT)
    if comparison["bounds_checked"]:
        verdicts.append(BOUNDS_BROKEN if comparison["bounds_broken"] else BOUNDS_HELD)
    return verdicts or [NO_CLAIM]


def started(log: dict) -> bool:
    """Did the measure log's last line for a point say it ran (whatever its end)?"""
    return bool(log) and not (log["last_line"] or "").startswith(NOT_STARTED)


def summarise_point(
    point: Point, out: Path, predict_log: dict, measure_log: dict, measured_in: str = "h200"
) -> dict:
    workload = workload_of(point.config)
    path = config_path(str(workload[0]) if workload else point.config)
    cpu = read_document(out / "cpu" / f"{point.name}.json")
    h200 = read_document(out / measured_in / f"{point.name}.json")
    settings = flag_settings(point.flags)
    for document in (cpu, h200):
        configuration = (document or {}).get("configuration") or {}
        if isinstance(configuration.get("dtype"), str):
            settings["dtype"] = configuration["dtype"]
        if isinstance(configuration.get("batch"), int):
            settings["batch"] = configuration["batch"]
        if isinstance((configuration.get("dims") or {}).get("sequence"), int):
            settings["sequence"] = configuration["dims"]["sequence"]
    sha = None
    for document in (cpu, h200):
        if isinstance(((document or {}).get("workload") or {}).get("sha256"), str):
            sha = document["workload"]["sha256"]
    if sha is None and path.is_file():
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
    entry = {
        "name": point.name,
        "config": point.config,
        "config_sha256": sha,
        "task": point.task,
        **settings,
        "flags": list(point.flags),
        "estimate_flags": list(point.estimate_flags),
        "prediction": None,
        "measurement": None,
        "comparison": None,
    }
    prediction = (cpu or {}).get("prediction")
    reasons = []
    if isinstance(prediction, dict) and isinstance(prediction.get("phases"), list):
        rows = [row for row in prediction["phases"] if isinstance(row, dict)]
        bounds = bounds_of(prediction, len(rows))
        entry["prediction"] = {
            "status": prediction.get("status"),
            "phases": [
                {"phase": row.get("phase"), "counters": counters_of(row),
                 "bounds": (bounds[i] or None) if bounds and i < len(bounds) else None}
                for i, row in enumerate(rows)
            ],
        }  # fmt: skip
    else:
        bounds = None
        said = predict_log.get(point.name, {}).get("last_line") or "no cpu/NAME.json"
        reasons.append(f"no prediction: {said}")
    log = measure_log.get(point.name, {})
    if h200 is not None:
        entry["measurement"] = {
            "status": h200.get("status"),
            "exit": log.get("exit"),
            "last_line": log.get("last_line"),
            "phases": [
                {"phase": row.get("phase"), "counters": counters_of(row)}
                for row in h200.get("phases") or []
                if isinstance(row, dict)
            ],
        }
    if h200 is None or h200.get("status") != "completed":
        status = (h200 or {}).get("status", "no h200/NAME.json")
        reasons.append(f"no measurement: {status}; {log.get('last_line') or 'not run'}")
    if not reasons:
        entry["comparison"] = compare(
            entry["prediction"]["phases"], entry["measurement"]["phases"], bounds
        )
    entry["crash_reason"] = "; ".join(reasons) or None
    entry["verdicts"] = verdicts_of(
        entry["prediction"] and entry["prediction"]["status"],
        entry["comparison"],
        run=h200 is not None or started(log) or entry["prediction"] is None,
    )
    return entry


def totals_of(points: list[dict]) -> dict:
    def count(verdict):
        return sum(verdict in p["verdicts"] for p in points)

    compared = [p for p in points if p["comparison"] is not None]
    equal = sum(p["comparison"]["equal_to_the_byte"] for p in compared)
    return {
        "points": len(points),
        "crashes": count(CRASH),
        "not_measured": count(NOT_MEASURED),
        "exact_held": count(EXACT_HELD),
        "false_exact": count(FALSE_EXACT),
        "bounds_held": count(BOUNDS_HELD),
        "bounds_broken": count(BOUNDS_BROKEN),
        "no_claim": count(NO_CLAIM),
        "equal_to_the_byte": equal,
        "share_exact_to_the_byte": round(equal / len(compared), 6) if compared else None,
    }


def summary_of(out: Path, measured_in: str = "h200") -> dict:
    points = read_points((out / "points.txt").read_text())
    predict_log = read_log(out / "cpu", "timings*.txt")
    measure_log = read_log(out / measured_in, "measure*.txt")
    entries = [summarise_point(p, out, predict_log, measure_log, measured_in) for p in points]
    return {"schema": SCHEMA, "points": entries, "totals": totals_of(entries)}


def largest(phases: list[dict], key: str):
    values = [row["counters"][key] for row in phases if key in row["counters"]]
    return max(values) if values else None


def comparison_md(summary: dict, measured_in: str = "h200") -> str:
    lines = [
        "Largest peak reserved over the phases, bytes: the GPU-free prediction (cpu/) against "
        f"the measurement ({measured_in}/). Verdicts as in summary.json.",
        "",
        "point | task | dtype | batch × sequence | prediction | predicted | measured | "
        "predicted / measured | largest abs difference (any counter) | verdicts",
        "--- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---",
    ]
    for p in summary["points"]:
        predicted = (
            largest(p["prediction"]["phases"], "peak_reserved_bytes") if p["prediction"] else None
        )
        measured = (
            largest(p["measurement"]["phases"], "peak_reserved_bytes") if p["measurement"] else None
        )
        ratio = f"{predicted / measured:.3f}" if predicted is not None and measured else ""
        diff = max(p["comparison"]["largest_abs_difference"].values()) if p["comparison"] else None
        shape = f"{p['batch']} × {p['sequence']}" if p["sequence"] else f"{p['batch']}"
        status = p["prediction"]["status"] if p["prediction"] else "none"
        lines.append(
            f"{p['name']} | {p['task']} | {p['dtype']} | {shape} | {status} | "
            f"{'' if predicted is None else f'{predicted:,}'} | "
            f"{'' if measured is None else f'{measured:,}'} | {ratio} | "
            f"{'' if diff is None else f'{diff:,}'} | {', '.join(p['verdicts'])}"
        )
    t = summary["totals"]
    share = "n/a" if t["share_exact_to_the_byte"] is None else f"{t['share_exact_to_the_byte']:.3f}"
    lines += [
        "",
        f"{t['points']} points: {t['crashes']} crashed, {t['not_measured']} not measured, "
        f"{t['false_exact']} false exact, "
        f"{t['exact_held']} exact held, {t['bounds_broken']} with a bound broken, "
        f"{t['bounds_held']} within their bounds, {t['no_claim']} claiming neither; "
        f"equal to the byte: {t['equal_to_the_byte']} (share {share}).",
    ]
    for p in summary["points"]:
        if p["crash_reason"]:
            lines.append(f"- {p['name']}: {p['crash_reason']}")
    return "\n".join(lines) + "\n"


def summarise(args) -> int:
    out = Path(args.out)
    if not (out / "points.txt").is_file():
        print(f"hf_zoo_grid.py: error: {out}/points.txt: no such file", file=sys.stderr)
        return 2
    summary = summary_of(out, args.measured_in)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "comparison.md").write_text(comparison_md(summary, args.measured_in))
    t = summary["totals"]
    print(
        f"{t['points']} points, {t['crashes']} crashes, {t['false_exact']} false exact, "
        f"{t['bounds_broken']} bounds broken, share exact to the byte "
        f"{t['share_exact_to_the_byte']}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf_zoo_grid.py", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("predict", help="GPU-free estimates into DIR/cpu/")
    p.add_argument("--points", required=True)
    p.add_argument("--out", required=True)
    m = verbs.add_parser("measure", help="measurements into DIR/h200/ (or --measured-in)")
    m.add_argument("--points", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--device", default="cuda:0")
    m.add_argument("--only", help="NAME,NAME: these points only")
    m.add_argument("--shard", help="I/N: every N-th point from the I-th (1-based)")
    m.add_argument("--deadline-s", type=float, default=510.0, help="no new point after this")
    m.add_argument("--timeout-s", type=float, default=300.0, help="one point's limit")
    m.add_argument(
        "--segments", action="store_true",
        help="also record where the driver put the allocator's segments (NAME.segments.json)",
    )  # fmt: skip
    s = verbs.add_parser("summarise", help="DIR/summary.json and DIR/comparison.md")
    s.add_argument("--out", required=True)
    for verb in (m, s):
        verb.add_argument(
            "--measured-in", default="h200", metavar="FOLDER",
            help="DIR/FOLDER holds the measurements (default h200; name it after the GPU used)",
        )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        return {"predict": predict, "measure": measure, "summarise": summarise}[args.verb](args)
    except PointsError as exc:
        print(f"hf_zoo_grid.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
