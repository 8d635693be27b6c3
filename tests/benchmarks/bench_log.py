"""How record, validate and merge scale with the results log, against their targets.

    python tests/benchmarks/bench_log.py                  # 100,000 rows; merge 10 x 10,000
    python tests/benchmarks/bench_log.py --rows 20000 --merge-logs 4 --merge-rows 5000

The logs are built in a temporary folder from the rows of the committed runs/resultats-bruts.csv,
each copy under a run id and a measurement SHA-256 of its own, so that every row is a valid
one, as record.py would have appended it. Each stage runs in a fresh interpreter, as a user
runs it; it reports its own time and peak resident memory (ru_maxrss). record is measured
twice side by side, into the header-only log and into the long one: the difference is what
the log's length costs, and the time inside append_row is the time the exclusive lock is held.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root

from pipeline.artefacts import validate  # noqa: E402
from pipeline.stages import record  # noqa: E402

COMMITTED_LOG = ROOT / "runs" / "resultats-bruts.csv"
# Run in the child: the stage's work, timed from inside, and the child's own peak memory.
DRIVER = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
{block}
from pipeline.artefacts import validate
from pipeline.stages import merge, record
started = time.perf_counter()
if {stage!r} == "append":
    import json as j
    from pathlib import Path
    folder = Path({argv!r}[0])
    data = (folder / "measurement.json").read_bytes()
    protocol, registry = validate.Protocol(), validate.load_registry()
    row = record.build_row(folder.name, data, j.loads(data), protocol.sha256)
    started = time.perf_counter()
    record.append_row(folder.parent / "resultats-bruts.csv", row, registry, protocol)
    code = 0
else:
    mains = {{"record": record.main, "validate": validate.main, "merge": merge.main}}
    code = mains[{stage!r}]({argv!r})
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"code": code, "seconds": seconds, "peak_bytes": peak}}), file=sys.__stderr__)
"""


def committed_rows() -> list[dict]:
    rows, errors = validate.parse_log(COMMITTED_LOG.read_bytes(), validate.kit_header())
    if errors or not rows:
        raise SystemExit(f"{COMMITTED_LOG}: {errors or 'no rows'}")
    return [row for _, row in rows]


def write_log(path: Path, rows: list[dict], first: int, count: int) -> Path:
    """`count` rows, numbered from `first`: each a committed row, with its own run id (the
    time part of the row's own, then the number in hex) and its own measurement SHA-256."""
    header = validate.kit_header()
    lines = [record.csv_line(header)]
    for n in range(first, first + count):
        row = dict(rows[n % len(rows)])
        row["run_id"] = f"{row['run_id'][:16]}-{n:06x}"
        row["measurement_sha256"] = hashlib.sha256(f"bench {n}".encode()).hexdigest()
        lines.append(record.csv_line(row[column] for column in header))
    with path.open("wb") as handle:
        handle.write(b"".join(lines))
        os.fsync(handle.fileno())  # on disk, as a log is: record's own fsync is then its row's
    return path


def run_folder(runs: Path) -> Path:
    """A committed run folder copied under a run id no built log holds."""
    source = next(p.parent for p in sorted((ROOT / "runs").glob("*/environment.json")))
    folder = runs / "20261203T000000Z-ffffff"
    shutil.copytree(source, folder)
    return folder


def stage(name: str, argv: list[str], *, without_fast: bool = False) -> dict:
    """Run one stage in a fresh interpreter; its figures, and the whole process's wall time."""
    block = "sys.modules['fastjsonschema'] = None" if without_fast else ""
    program = DRIVER.format(root=str(ROOT), block=block, stage=name, argv=argv)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    wall = time.perf_counter() - started
    figures = json.loads(result.stderr.strip().splitlines()[-1])
    if figures["code"] != 0:
        raise SystemExit(f"{name} {argv} exited {figures['code']}: {result.stderr}")
    return figures | {"process_seconds": wall}


def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "MISSED"


def show(label: str, figures: dict, seconds_target: float, memory_target_mb=None) -> None:
    mb = figures["peak_bytes"] / 1e6
    line = (
        f"{label:44s} {figures['seconds']:7.3f} s (target <= {seconds_target} s: "
        f"{verdict(figures['seconds'], seconds_target)}), whole process "
        f"{figures['process_seconds']:6.3f} s, peak RSS {mb:6.1f} MB"
    )
    if memory_target_mb is not None:
        line += f" (target <= {memory_target_mb} MB: {verdict(mb, memory_target_mb)})"
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_log.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the long log")
    parser.add_argument("--merge-logs", type=int, default=10)
    parser.add_argument("--merge-rows", type=int, default=10_000, help="rows of each merged log")
    parser.add_argument(
        "--jsonschema-rows", type=int, default=2_000, help="rows validated without fastjsonschema"
    )
    args = parser.parse_args(argv)
    rows = committed_rows()
    with tempfile.TemporaryDirectory(prefix="bench-log-") as temp:
        temp = Path(temp)
        print(f"rows built from the {len(rows)} rows of {COMMITTED_LOG.relative_to(ROOT)}")
        for label, size in (("header-only log", 0), (f"{args.rows:,}-row log", args.rows)):
            runs = temp / f"runs-{size}"
            runs.mkdir()
            write_log(runs / "resultats-bruts.csv", rows, 0, size)
            folder = run_folder(runs)
            held = stage("append", [str(folder)])
            show(f"record into the {label}: lock held", held, 0.2, 200)
            (runs / "resultats-bruts.csv").unlink()
            write_log(runs / "resultats-bruts.csv", rows, 0, size)
            show(f"record into the {label}: record.main", stage("record", [str(folder)]), 0.2, 200)
        long_log = write_log(temp / "long.csv", rows, 0, args.rows)
        show(f"validate {args.rows:,} rows", stage("validate", [str(long_log)]), 10)
        short = write_log(temp / "short.csv", rows, 0, args.jsonschema_rows)
        alone = stage("validate", [str(short)], without_fast=True)
        print(
            f"validate {args.jsonschema_rows:,} rows with jsonschema alone (no fastjsonschema): "
            f"{alone['seconds']:.3f} s, {alone['seconds'] / args.jsonschema_rows * 1e3:.3f} ms a "
            f"row; with it, {stage('validate', [str(short)])['seconds']:.3f} s"
        )
        logs = [
            str(write_log(temp / f"machine-{i}.csv", rows, i * args.merge_rows, args.merge_rows))
            for i in range(args.merge_logs)
        ]
        merged = stage("merge", [*logs, "--output", str(temp / "team.csv")])
        show(f"merge {args.merge_logs} x {args.merge_rows:,} rows", merged, 10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
