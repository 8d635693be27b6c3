"""Append one row per validated run to the results log beside the run folders.

    python pipeline/record.py runs/<run-id>/ [more run folders]
    python pipeline/record.py runs/<run-id>/ --useful-work 400 --accepted-results 388 \
        --threshold-met yes

A run folder <runs>/<id>/ is recorded in <runs>/resultats-bruts.csv. The log is created from
the header of data/resultats-bruts.csv (the kit's empty grid, which stays empty). A run is
recorded only if its files validate (validate.py, imported: no extra interpreter) and only
once. The quality columns stay empty unless given here, and are refused while the decisions
of data/protocole-qualite.md are blank; every row records that protocol's SHA-256.

Why the log is valid CSV after a crash or kill -9: each row is one os.write() of the whole
encoded line on an O_APPEND descriptor, under an exclusive flock, then fsync. A process
killed before that write left nothing; after it, a whole row. The same lock makes "is this
run already recorded?" and the append one step across processes. Should a power cut tear the
last line anyway, the next append refuses to write after it (exit 2) and validate.py names
the line: nothing is repaired behind your back.

Exit 0 recorded; 1 a run's files do not validate (nothing appended for it); 2 bad input: not
a run folder, already recorded, quality values refused, a log that is not a results log.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import hashlib
import io
import json
import os
import re
import sys
from decimal import Decimal
from pathlib import Path

import mesure_memoire
import run_folders
import validate

CONFIGURATION = ("batch", "context", "width", "dtype", "warmup", "repeats", "seed")


class Refused(Exception):
    """Bad input or a would-be duplicate: one line on stderr, exit 2, nothing written."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise Refused(message)


def count(text: str) -> str:
    """Digits only, kept as the text the log will hold."""
    if not re.fullmatch(r"0|[1-9][0-9]{0,17}", text):
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return text


# ---------------------------------------------------------------- the row


def median_text(value: float | None) -> str:
    """A median of integer nanoseconds (an int, or a float ending in .5) as exact text."""
    return "" if value is None else format(Decimal(value).normalize(), "f")


def build_row(run_id: str, data: bytes, measurement: dict, protocol_sha256: str) -> dict:
    """The log's columns from a validated measurement.json (its bytes are hashed as read)."""
    environment, configuration = measurement["environment"], measurement["configuration"]
    summary = measurement["summary"]
    first_rows: dict[str, dict] = {}
    for phase in measurement["phases"]:
        first_rows.setdefault(phase["phase"], phase)
    row = {
        "run_id": run_id,
        "measured_utc": measurement["created_utc"],
        "status": measurement["status"],
        "failed_phase": measurement.get("failure", {}).get("phase", ""),
        "device": configuration["device"],
        "gpu_name": environment["gpu"]["name"],
        "driver_version": environment["driver"]["version"] or "",
        "python_version": environment["python"]["version"],
        "torch_version": environment["torch"]["version"],
        "cuda_build": environment["torch"]["cuda_build"] or "",
        "hip_build": environment["torch"]["hip_build"] or "",
    }
    row.update({name: str(configuration[name]) for name in CONFIGURATION})
    for name in validate.FIXED_PHASES:  # a phase an out-of-memory run never reached stays empty
        row[f"{name}_wall_ns"] = str(first_rows[name]["wall_time_ns"]) if name in first_rows else ""
    row["warm_forward_median_wall_ns"] = median_text(summary["warm_forward_median_wall_time_ns"])
    row["warm_forward_median_event_ns"] = median_text(summary["warm_forward_median_event_time_ns"])
    row["largest_peak_allocated_bytes"] = str(summary["largest_peak_allocated_bytes"])
    row["largest_peak_reserved_bytes"] = str(summary["largest_peak_reserved_bytes"])
    row["measurement_sha256"] = hashlib.sha256(data).hexdigest()
    row["protocol_sha256"] = protocol_sha256
    row.update(dict.fromkeys(validate.QUALITY, ""))
    return row


def csv_line(cells) -> bytes:
    """One CSV record, encoded: what a single write() appends."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue().encode("utf-8")


# ---------------------------------------------------------------- files


write_new = mesure_memoire.write_new  # whole file or nothing, never over an existing one


def read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def append_row(log: Path, row: dict) -> int:
    """Append `row` to the log (created from the kit header if new); returns its line number.
    Refuses a run already in the log and a log that is not a whole results log."""
    header = validate.kit_header()
    if not log.exists():
        with contextlib.suppress(FileExistsError):  # another process won the race: keep theirs
            write_new(log, csv_line(header))
    line = csv_line(row[column] for column in header)
    fd = os.open(log, os.O_RDWR | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed
        existing = read_all(fd)
        rows, problems = validate.parse_log(existing, header)
        if problems:
            raise Refused(f"{log}: {problems[0]}; nothing appended (validate.py lists all)")
        if any(old["run_id"] == row["run_id"] for _, old in rows):
            raise Refused(f"{row['run_id']} is already recorded in {log}: a run is recorded once")
        written = os.write(fd, line)
        if written != len(line):  # a full disk: take the partial line back while we hold the lock
            os.ftruncate(fd, len(existing))
            raise OSError(f"{log}: only {written} of {len(line)} bytes written; undone")
        os.fsync(fd)
        return len(rows) + 2
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one run


def record_run(folder: Path, registry, protocol: validate.Protocol, quality: dict) -> int:
    """Validate a run folder, then append its row; 0 recorded, 1 invalid. Raises Refused."""
    if not folder.is_dir() or not run_folders.RUN_ID.fullmatch(folder.name):
        raise Refused(f"{folder}: not a run folder (<runs>/<UTC time>-<random>/)")
    path = folder / "measurement.json"
    if not path.is_file():
        raise Refused(f"{folder}: no measurement.json, nothing to record")
    data = path.read_bytes()
    errors = [f"{path}: {error}" for error in validate.validate_json(data, registry)]
    environment = folder / "environment.json"
    if environment.is_file():
        problems = validate.validate_json(environment.read_bytes(), registry)
        errors += [f"{environment}: {error}" for error in problems]
    measurement = None if errors else json.loads(data)
    if measurement is not None and measurement["schema"] not in validate.MEASUREMENTS:
        errors.append(f"{path}: $.schema: {measurement['schema']!r} is not a measurement")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        print(f"record.py: {folder} does not validate: nothing appended", file=sys.stderr)
        return 1
    row = build_row(folder.name, data, measurement, protocol.sha256)
    row.update(quality)
    errors = validate.schema_errors(row, validate.RESULTS_ROW, registry)
    if errors:
        print("\n".join(f"{folder}: row {error}" for error in errors), file=sys.stderr)
        return 1
    refusals = validate.quality_errors(row, protocol)
    if refusals:
        raise Refused(f"quality values refused: {'; '.join(refusals)}")
    log = folder.parent / run_folders.LOG_NAME
    line = append_row(log, row)
    print(f"{folder}: recorded in {log}, line {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="record.py", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, metavar="RUN_DIR", help="run folders")
    quality = parser.add_argument_group("quality (protocole-qualite.md; all three or none)")
    quality.add_argument("--useful-work", type=count, metavar="N", help="units of useful work")
    quality.add_argument("--accepted-results", type=count, metavar="N", help="distinct accepted")
    quality.add_argument("--threshold-met", choices=("yes", "no"))
    try:
        args = parser.parse_args(argv)
        values = {column: getattr(args, column) or "" for column in validate.QUALITY}
        given = [column for column, value in values.items() if value]
        if given and len(given) < len(values):
            raise Refused("--useful-work, --accepted-results and --threshold-met go together")
        if given and len(args.folders) > 1:
            raise Refused("quality values describe one run: give one RUN_DIR")
        protocol = validate.Protocol()
    except (Refused, OSError) as exc:
        print(f"record.py: error: {exc}", file=sys.stderr)
        return 2
    registry = validate.load_registry()
    worst = 0
    for folder in args.folders:
        try:
            code = record_run(folder, registry, protocol, values)
        except (Refused, OSError) as exc:
            print(f"record.py: error: {exc}", file=sys.stderr)
            code = 2
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
