"""Append one row per validated run to the results log beside the run folders.

    python -m pipeline.stages.record runs/<run-id>/ [more run folders]
    python -m pipeline.stages.record runs/<run-id>/ --useful-work 400 --accepted-results 388 \
        --threshold-met yes

A run folder <runs>/<id>/ is recorded in <runs>/resultats-bruts.csv. The log is created from
the header of data/resultats-bruts.csv (the kit's empty grid, which stays empty). A decoder
run (decoder.py measure) is recorded in <runs>/resultats-decoder.csv instead, whose header is
the kit's followed by the decoder's columns (validate.DECODER_COLUMNS), and an own-model run
(own_model.py measure: your own workload file) in <runs>/resultats-own.csv, whose header is
the decoder log's followed by the own model's columns (validate.OWN_COLUMNS): a log written
before keeps its bytes and stays valid, and merge.py unites logs of the three headers. A run
whose workload code raised (status "failed") is not a measurement and is never recorded. A
run is
recorded only if its files pass validate.py's checks (imported: the same rules, no extra
interpreter), and once: neither its run id nor its measurement (the same measurement.json
under another folder name) may be in the log already. The quality columns stay empty unless
given here, and are refused while the decisions of data/protocole-qualite.md are blank;
every row records that protocol's SHA-256.

Why the log is valid CSV after a crash or kill -9: it is created whole (an unnamed file,
linked to its name once written), and each row is one os.write() of the whole encoded line
on an O_APPEND descriptor, under an exclusive flock, then fsync. A process killed before
that write left nothing; after it, a whole row. The same lock makes "is this run already
recorded?" and the append one step across processes. A log broken since (a torn last line
after a power cut, an edit by hand) is never appended to (exit 2), as
validate.append_refusal says: nothing is repaired behind your back.

Exit 0 recorded; 1 a run's files do not validate (nothing appended for it); 2 bad input: not
a run folder, already recorded, quality values refused, a log that is not a results log.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import io
import os
import sys
from decimal import Decimal
from pathlib import Path

from pipeline.artefacts import validate
from pipeline.core import arguments, cli, run_folders, workload_kinds
from pipeline.core.run_status import RunStatus
from pipeline.core.workload_kinds import Kind
from pipeline.workloads import seed_network

CONFIGURATION = ("batch", "context", "width", "dtype", "warmup", "repeats", "seed")
DECODER_LOG_NAME = workload_kinds.DECODER.log_name
OWN_MODEL_LOG_NAME = workload_kinds.OWN.log_name
SHAPE = ("layers", "heads", "kv_heads", "head_dim", "ffn", "vocab")


# ---------------------------------------------------------------- the row


def median_text(value: float | None) -> str:
    """A median of integer nanoseconds (an int, or a float ending in .5) as exact text."""
    return "" if value is None else format(Decimal(value).normalize(), "f")


def identity_cells(run_id: str, measurement: dict) -> dict:
    """The columns both logs open with: which run, when, how it ended, on what."""
    environment, configuration = measurement["environment"], measurement["configuration"]
    return {
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


def kit_cells(configuration: dict, wall, *, context="", width="", repeats="", inputs=""):
    """The kit's columns that a decoder or own-model row fills where they mean the same; the
    seed network's own phase times stay empty."""
    return {
        "batch": str(configuration["batch"]),
        "context": context,
        "width": width,
        "dtype": configuration["dtype"],
        "warmup": str(configuration["warmup"]),
        "repeats": repeats,
        "seed": text(configuration["seed"]),
        "model_load_wall_ns": wall("model_load"),
        "inputs_wall_ns": inputs,
        "cold_forward_wall_ns": "",
        "warmup_wall_ns": wall("warmup"),
        "warm_forward_median_wall_ns": "",
        "warm_forward_median_event_ns": "",
    }


def evidence_cells(data: bytes, summary: dict, protocol_sha256: str) -> dict:
    """The columns every log has after the workload's own: the peaks, what was measured
    (the file's bytes, hashed as read) under which protocol, and the quality flags, empty."""
    return {
        "largest_peak_allocated_bytes": str(summary["largest_peak_allocated_bytes"]),
        "largest_peak_reserved_bytes": str(summary["largest_peak_reserved_bytes"]),
        "measurement_sha256": hashlib.sha256(data).hexdigest(),
        "protocol_sha256": protocol_sha256,
        **dict.fromkeys(validate.QUALITY, ""),
    }


def build_row(run_id: str, data: bytes, measurement: dict, protocol_sha256: str) -> dict:
    """The log's columns from a validated measurement.json (its bytes are hashed as read)."""
    configuration = measurement["configuration"]
    summary = measurement["summary"]
    wall = first_walls(measurement["phases"])
    row = identity_cells(run_id, measurement)
    row.update({name: str(configuration[name]) for name in CONFIGURATION})
    for name in seed_network.FIXED_PHASES:  # a phase an out-of-memory run never reached: ""
        row[f"{name}_wall_ns"] = wall(name)
    row["warm_forward_median_wall_ns"] = median_text(summary["warm_forward_median_wall_time_ns"])
    row["warm_forward_median_event_ns"] = median_text(summary["warm_forward_median_event_time_ns"])
    row.update(evidence_cells(data, summary, protocol_sha256))
    return row


def text(value) -> str:
    """A cell: None is empty, a boolean yes or no, a number as JSON writes it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def first_walls(phases: list[dict]):
    """The wall time of each phase's first row as a log writes it: "" for a phase not run."""
    first: dict[str, dict] = {}
    for row in phases:
        first.setdefault(row["phase"], row)
    return lambda name: str(first[name]["wall_time_ns"]) if name in first else ""


def build_decoder_row(run_id: str, data: bytes, measurement: dict, protocol_sha256: str) -> dict:
    """The decoder log's columns from a validated decoder measurement.json: the kit's
    columns where they mean the same (context: the positions the cache holds), the seed
    network's phase times and repeats empty, then the decoder's own."""
    configuration = measurement["configuration"]
    summary, shape = measurement["summary"], configuration["shape"]
    wall = first_walls(measurement["phases"])

    timing = summary["timing"] or {}
    decode = [row["wall_time_ns"] for row in measurement["phases"] if row["phase"] == "decode"]
    differences = summary["prediction"]["by_counter"].values()
    row = {
        **identity_cells(run_id, measurement),
        **kit_cells(
            configuration,
            wall,
            context=str(configuration["prompt"] + configuration["new_tokens"]),
            width=str(shape["width"]),
        ),
        **evidence_cells(data, summary, protocol_sha256),
        "workload": Kind.DECODER.value,
        "preset": configuration["preset"] or "",
        **{name: str(shape[name]) for name in SHAPE},
        "tie_embeddings": text(shape["tie_embeddings"]),
        "qkv_bias": text(shape["qkv_bias"]),
        "prompt": str(configuration["prompt"]),
        "new_tokens": str(configuration["new_tokens"]),
        "tokens_per_row": str(configuration["tokens_per_row"]),
        "inputs_and_cache_wall_ns": wall("inputs_and_cache"),
        "prefill_wall_ns": wall("prefill"),
        "decode_wall_ns": str(sum(decode)) if decode else "",
        "prefill_tokens_per_second": text(timing.get("prefill_tokens_per_second")),
        "decode_tokens_per_second": text(timing.get("decode_tokens_per_second")),
        "largest_abs_difference_bytes": str(max(differences)),
    }
    return row


def build_own_model_row(run_id: str, data: bytes, measurement: dict, protocol_sha256: str):
    """The own-model log's columns from a validated own_model.py measurement.json: the kit's
    columns where a phase has the kit's name, context and width empty (a user's model has
    neither), the decoder's empty but the largest prediction difference, then the workload's:
    what was run (the file's name and SHA-256, never its path), and what was predicted."""
    configuration, workload = measurement["configuration"], measurement["workload"]
    summary = measurement["summary"]
    wall = first_walls(measurement["phases"])

    by_counter = summary["prediction"].get("by_counter")
    parameters = workload["parameters"] or {}
    return {
        **identity_cells(run_id, measurement),
        **kit_cells(
            configuration, wall, repeats=str(configuration["repeats"]), inputs=wall("inputs")
        ),
        **evidence_cells(data, summary, protocol_sha256),
        "workload": Kind.OWN.value,
        **dict.fromkeys(validate.DECODER_COLUMNS[1:], ""),
        "largest_abs_difference_bytes": text(max(by_counter.values()) if by_counter else None),
        "workload_file": workload["file"],
        "workload_sha256": workload["sha256"],
        "workload_function": workload["function"],
        "workload_dims": " ".join(f"{k}={v}" for k, v in configuration["dims"].items()),
        "workload_mode": workload["kind"] or "",
        "parameter_count": text(parameters.get("count")),
        "parameter_bytes": text(parameters.get("bytes")),
        "cold_step_wall_ns": wall("cold_step"),
        "optimizer_state_wall_ns": wall("optimizer_state"),
        "warm_step_median_wall_ns": median_text(summary["warm_step_median_wall_time_ns"]),
        "warm_step_median_event_ns": median_text(summary["warm_step_median_event_time_ns"]),
        "prediction_status": summary["prediction"]["status"],
    }


# How each kind's measurement becomes its log's row (the kind's code; which log is whose is
# workload_kinds' data).
BUILDERS = {
    Kind.NETWORK: build_row,
    Kind.DECODER: build_decoder_row,
    Kind.OWN: build_own_model_row,
}


def csv_line(cells) -> bytes:
    """One CSV record, encoded: what a single write() appends."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue().encode("utf-8")


# ---------------------------------------------------------------- the log


def read_all(fd: int) -> bytes:
    """The whole file from its start, read into one buffer sized from its length."""
    with open(fd, "rb", buffering=0, closefd=False) as handle:
        handle.seek(0)
        return handle.readall()


def append_row(log: Path, row: dict, registry, protocol: validate.Protocol) -> int:
    """Append `row` to the log (created from the kit header if new, the decoder log's for a
    decoder row, the own-model log's for an own-model row); returns its line number. Refuses
    what validate.append_refusal refuses: a duplicate, a log validate.py rejects, a row in a
    log without its workload's columns."""
    if not os.path.lexists(log):
        header = validate.header_for(row)
        with contextlib.suppress(FileExistsError):  # another process won the race: keep theirs
            cli.write_new(log, csv_line(header))
    fd = os.open(log, os.O_RDWR | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed
        existing = read_all(fd)
        refusal = validate.append_refusal(existing, row, registry, protocol)
        if refusal:
            raise cli.UsageError(f"{log}: {refusal}; nothing appended")
        header = validate.log_header(existing)
        line = csv_line(validate.as_header(row, header).values())
        written = os.write(fd, line)
        if written != len(line):  # a full disk: take the partial line back while we hold the lock
            os.ftruncate(fd, len(existing))
            raise OSError(f"{log}: only {written} of {len(line)} bytes written; undone")
        os.fsync(fd)
        return existing.count(b"\n") + 1
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one run


def record_run(folder: Path, registry, protocol: validate.Protocol, quality: dict) -> int:
    """Check a run folder's files as validate.py does, then append its row; 0 recorded,
    1 invalid. Raises UsageError for what is not a recordable run."""
    if not folder.is_dir() or not run_folders.RUN_ID.fullmatch(folder.name):
        raise cli.UsageError(f"{folder}: not a run folder (<runs>/<UTC time>-<random>/)")
    path = folder / "measurement.json"
    if not os.path.lexists(path):
        raise cli.UsageError(f"{folder}: no measurement.json, nothing to record")
    environment = folder / "environment.json"
    for read in (folder, path, environment):
        if os.path.lexists(read) and validate.outside(read, folder.parent):
            # validate.py never follows a link: a row whose evidence it cannot check is refused
            raise cli.UsageError(f"{read}: a symbolic link out of {folder.parent}: not recorded")
    measurement = validate.read_artefact(path, registry)
    errors = [f"{path}: {error}" for error in measurement.errors]
    if os.path.lexists(environment):
        problems = validate.read_artefact(environment, registry).errors
        problems = problems or validate.beside_facts(environment)
        errors += [f"{environment}: {error}" for error in problems]
    if errors:
        return cli.refused(errors, f"record.py: {folder} does not validate: nothing appended")
    kind = workload_kinds.of_schema(measurement.document["schema"])
    status = measurement.document["status"]
    if status == RunStatus.PREDICTED:
        raise cli.UsageError(f"{path}: a prediction ({kind.script} estimate), not a measurement")
    if status == RunStatus.FAILED:
        raised = measurement.document["failure"]["exception_type"]
        raise cli.UsageError(
            f"{path}: the workload's own code raised {raised}: a failed run is not a "
            "measurement, never recorded"
        )
    row = BUILDERS[kind.kind](folder.name, measurement.data, measurement.document, protocol.sha256)
    row.update(quality)
    errors = validate.schema_errors(row, validate.RESULTS_ROW, registry)
    if errors:
        print("\n".join(f"{folder}: row {error}" for error in errors), file=sys.stderr)
        return cli.INVALID
    refusals = validate.quality_errors(row, protocol)
    if refusals:
        raise cli.UsageError(f"quality values refused: {'; '.join(refusals)}")
    log = folder.parent / kind.log_name
    if os.path.lexists(log) and validate.outside(log, folder.parent):
        raise cli.UsageError(f"{log}: a symbolic link out of {folder.parent}: nothing appended")
    line = append_row(log, row, registry, protocol)
    print(f"{folder}: recorded in {log}, line {line}")
    return cli.OK


def quality_columns(args) -> dict[str, str]:
    """The three quality columns as the log holds them: all three given, or none."""
    values = {
        "useful_work": "" if args.useful_work is None else str(args.useful_work),
        "accepted_results": "" if args.accepted_results is None else str(args.accepted_results),
        "threshold_met": args.threshold_met or "",
    }
    given = [column for column, value in values.items() if value]
    if given and len(given) < len(values):
        raise cli.UsageError("--useful-work, --accepted-results and --threshold-met go together")
    if given and len(args.folders) > 1:
        raise cli.UsageError("quality values describe one run: give one RUN_DIR")
    return values


def record_all(args) -> int:
    """Each folder in turn; the exit code is the highest of theirs."""
    quality = quality_columns(args)
    protocol = validate.Protocol()
    registry = validate.load_registry()
    exit_code = cli.OK
    for folder in args.folders:
        try:
            code = record_run(folder, registry, protocol, quality)
        except (cli.UsageError, OSError) as exc:
            print(f"record.py: error: {cli.os_message(exc)}", file=sys.stderr)
            code = cli.USAGE
        exit_code = max(exit_code, code)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(prog="record.py", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, metavar="RUN_DIR", help="run folders")
    quality = parser.add_argument_group("quality (protocole-qualite.md; all three or none)")
    count = arguments.non_negative_int
    quality.add_argument("--useful-work", type=count, metavar="N", help="units of useful work")
    quality.add_argument("--accepted-results", type=count, metavar="N", help="distinct accepted")
    quality.add_argument("--threshold-met", choices=("yes", "no"))
    return cli.run("record.py", lambda: record_all(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
