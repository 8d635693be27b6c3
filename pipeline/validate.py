"""Validate pipeline artefacts against the JSON Schemas in schemas/, then check the facts a
schema cannot state. Reads files, writes nothing.

    python pipeline/validate.py runs/<run-id>/ more.json runs/resultats-bruts.csv ...

A folder stands for the artefacts inside it (environment.json, measurement.json). A JSON file
says which schema it follows in its "schema" key. A .csv file is a results log: its header
must be the kit grid's (data/resultats-bruts.csv) and every row is checked. Exit 0 all valid,
1 any file invalid (each error printed with its JSON path), 2 unusable input (a path that
does not exist, jsonschema missing from this Python).

record.py and merge.py import this module, so every rule lives here once. It runs after each
measurement, so it stays cheap to start: no torch, schemas loaded without re-checking them
(the tests do that), and pyyaml imported only for rows that carry quality values.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import fcntl
import functools
import hashlib
import io
import json
import re
import statistics
import sys
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

try:
    from jsonschema import Draft202012Validator, FormatChecker
    from referencing import Registry, Resource
except ImportError as exc:  # the GPU host's Python may lack them: say what to install
    print(
        f"{Path(sys.argv[0]).name}: error: {exc.name} is not installed for {sys.executable}: "
        "python3 -m pip install jsonschema referencing pyyaml",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"
KIT_GRID = ROOT / "data" / "resultats-bruts.csv"  # the kit's empty grid: the logs' header
PROTOCOL = ROOT / "data" / "protocole-qualite.md"
RUN_ARTEFACTS = ("environment.json", "measurement.json")
MEASUREMENTS = ("urn:iteragpu-lab:schema:measurement:v1", "urn:iteragpu-lab:schema:measurement:v2")
RESULTS_ROW = "urn:iteragpu-lab:schema:results-row:v1"
FIXED_PHASES = ("model_load", "inputs", "cold_forward", "warmup")
QUALITY = ("useful_work", "accepted_results", "threshold_met")


class Usage(Exception):
    """Unusable input: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise Usage(message)


# ---------------------------------------------------------------- schemas


def load_registry(folder: Path = SCHEMAS) -> Registry:
    """Every schema under its $id, so that $ref between files resolves without a network."""
    resources = []
    for path in sorted(folder.glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resources.append((contents["$id"], Resource.from_contents(contents)))
    return Registry().with_resources(resources)


def _is_datetime(instance: object) -> bool:
    """RFC 3339 date-time. jsonschema checks this format only when the optional
    rfc3339-validator package is installed; checking it here judges a file the same way on
    every host."""
    if not isinstance(instance, str):
        return True
    if not re.fullmatch(r"[0-9-]{10}T[0-9:]{8}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})", instance):
        return False
    datetime.datetime.strptime(instance[:19], "%Y-%m-%dT%H:%M:%S")  # a real calendar day
    return True


FORMATS = FormatChecker(Draft202012Validator.FORMAT_CHECKER.checkers)
FORMATS.checks("date-time", raises=ValueError)(_is_datetime)


def json_path(parts) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def schema_errors(document, schema_id: str, registry: Registry) -> list[str]:
    validator = Draft202012Validator(
        registry.contents(schema_id), registry=registry, format_checker=FORMATS
    )
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path)))
    return [f"{json_path(e.absolute_path)}: {e.message}" for e in errors]


# ---------------------------------------------------------------- measurement facts


def _counter_facts(where: str, row: dict) -> list[str]:
    """Spec rule 23: allocated is part of reserved; a peak is at least the start and the end."""
    errors = []
    for prefix in ("baseline_", "", "peak_"):
        allocated, reserved = row[f"{prefix}allocated_bytes"], row[f"{prefix}reserved_bytes"]
        if allocated > reserved:
            errors.append(
                f"{where}: {prefix}allocated_bytes {allocated} > {prefix}reserved_bytes "
                f"{reserved} (allocated is part of reserved)"
            )
    for kind in ("allocated", "reserved"):
        peak = row[f"peak_{kind}_bytes"]
        for start in (f"baseline_{kind}_bytes", f"{kind}_bytes"):
            if peak < row[start]:
                errors.append(f"{where}: peak_{kind}_bytes {peak} < {start} {row[start]}")
    return errors


def measurement_facts(document: dict) -> list[str]:
    """Cross-field rules of spec 19-24, each error with its JSON path."""
    errors = []
    phases = document["phases"]
    for i, row in enumerate(phases):
        errors += _counter_facts(f"$.phases[{i}]", row)
    configuration = document["configuration"]
    repeats = configuration["repeats"]
    expected = [*FIXED_PHASES, *(["warm_forward"] * repeats)]
    names = [row["phase"] for row in phases]
    if document["status"] == "completed" and names != expected:
        errors.append(
            f"$.phases: {len(names)} rows, expected {len(expected)} for repeats={repeats}"
        )
    if document["status"] == "out_of_memory":
        failure = document["failure"]
        counters = failure["counters_after_failure"]
        errors += _counter_facts("$.failure.counters_after_failure", counters)
        if names != expected[: len(names)] or len(names) >= len(expected):
            errors.append("$.phases: rows of an out-of-memory run must be a prefix of the plan")
        elif expected[len(names)] != failure["phase"]:
            errors.append(
                f"$.failure.phase: {failure['phase']!r}, but the next planned phase is "
                f"{expected[len(names)]!r}"
            )
        else:
            done = names.count("warm_forward")
            want = done + 1 if failure["phase"] == "warm_forward" else None
            if failure["repetition"] != want:
                errors.append(f"$.failure.repetition: {failure['repetition']}, expected {want}")
    repetitions = [row.get("repetition") for row in phases if row["phase"] == "warm_forward"]
    if repetitions != list(range(1, len(repetitions) + 1)):
        errors.append(f"$.phases: warm_forward repetitions {repetitions} are not 1, 2, ...")
    for i, row in enumerate(phases):
        if row["phase"] != "warm_forward" and "repetition" in row:
            errors.append(f"$.phases[{i}]: only warm_forward rows carry a repetition")
        want = configuration["warmup"] if row["phase"] == "warmup" else 1
        if row["passes"] != want:
            errors.append(f"$.phases[{i}].passes: {row['passes']}, expected {want}")
    shape = [configuration["batch"], configuration["context"], configuration["width"]]
    if configuration["input_shape"] != shape:
        errors.append("$.configuration.input_shape: not [batch, context, width]")
    gpu = document["environment"]["gpu"]
    if not document["environment"]["torch"]["available"]:
        errors.append("$.environment.torch.available: a measurement needs the PyTorch it used")
    if not gpu["available"]:
        errors.append("$.environment.gpu.available: a measurement needs the GPU it measured")
    elif configuration["device"] != f"cuda:{gpu['index']}":
        errors.append(f"$.environment.gpu.index: {gpu['index']}, not {configuration['device']}")
    return errors + summary_facts(document["summary"], phases)


def summary_facts(summary: dict, phases: list[dict]) -> list[str]:
    """The summary is what the results log copies: it must say what the phases say."""
    warm = [row for row in phases if row["phase"] == "warm_forward"]

    def median(key: str):
        return statistics.median(row[key] for row in warm) if warm else None

    expected = {
        "phases_completed": len(phases),
        "largest_peak_allocated_bytes": max((r["peak_allocated_bytes"] for r in phases), default=0),
        "largest_peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in phases), default=0),
        "warm_forward_median_event_time_ns": median("event_time_ns"),
        "warm_forward_median_wall_time_ns": median("wall_time_ns"),
    }
    return [
        f"$.summary.{key}: {summary[key]}, but the phases give {value}"
        for key, value in expected.items()
        if summary[key] != value
    ]


def prediction_facts(document: dict) -> list[str]:
    """Version 2: the summary's differences and each row's overhead follow from the rows."""
    phases = document["phases"]
    if "prediction" not in document["summary"]:
        return []
    errors = []
    for i, row in enumerate(phases):
        if row["harness_overhead_ns"] != row["wall_time_ns"] - row["event_time_ns"]:
            errors.append(f"$.phases[{i}].harness_overhead_ns: not wall_time_ns - event_time_ns")
    for key, value in document["summary"]["prediction"]["by_counter"].items():
        largest = max((abs(row[key] - row["predicted"][key]) for row in phases), default=0)
        if value != largest:
            errors.append(
                f"$.summary.prediction.by_counter.{key}: {value}, the rows give {largest}"
            )
    return errors


def validate_document(document, registry: Registry) -> list[str]:
    """Schema errors first (with paths); facts only once the shape is known to be right."""
    if not isinstance(document, dict) or not isinstance(document.get("schema"), str):
        return ['$: not an artefact: no "schema" key naming its schema']
    if document["schema"] == RESULTS_ROW or document["schema"] not in registry:
        return [f"$.schema: unknown artefact schema {document['schema']!r}"]
    errors = schema_errors(document, document["schema"], registry)
    if errors:
        return errors
    if document["schema"] in MEASUREMENTS:
        return measurement_facts(document) + prediction_facts(document)
    return []


def validate_json(data: bytes, registry: Registry) -> list[str]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        return [f"$: not valid JSON ({exc})"]
    return validate_document(document, registry)


# ---------------------------------------------------------------- the quality protocol


class Protocol:
    """protocole-qualite.md: its SHA-256 (every row records it) and the decisions in its YAML
    front matter, which a team writes before any run."""

    def __init__(self, path: Path = PROTOCOL):
        self.path = path
        self.data = path.read_bytes()
        self.sha256 = hashlib.sha256(self.data).hexdigest()

    @functools.cached_property
    def decisions(self) -> dict:
        import yaml  # only rows carrying quality values need it: keeps start-up low

        text = self.data.decode("utf-8")
        end = text.find("\n---\n", 3)
        if not text.startswith("---\n") or end < 0:
            raise ValueError(f"{self.path.name} has no YAML front matter between '---' lines")
        try:
            decisions = yaml.safe_load(text[4:end])
        except yaml.YAMLError as exc:
            raise ValueError(f"{self.path.name}: the front matter is not YAML ({exc})") from None
        if not isinstance(decisions, dict):
            raise ValueError(f"{self.path.name}: the front matter is not a mapping")
        return decisions

    @property
    def rate(self) -> Decimal | None:
        """minimum_acceptance_rate as an exact decimal in (0, 1], or None."""
        value = self.decisions.get("minimum_acceptance_rate")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return None
        try:
            rate = Decimal(str(value).strip())
        except InvalidOperation:
            return None
        return rate if rate.is_finite() and 0 < rate <= 1 else None

    @property
    def decided_on(self) -> datetime.date | None:
        value = self.decisions.get("decided_on")
        if isinstance(value, datetime.datetime):  # YAML reads unquoted dates and times itself
            return value.date()
        if isinstance(value, datetime.date):
            return value
        try:
            return datetime.date.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            return None

    def undecided(self) -> list[str]:
        """The decisions still blank (or unreadable): quality values wait for none."""
        criteria = self.decisions.get("acceptance_criteria")
        blank = {
            "useful_unit": not _written(self.decisions.get("useful_unit")),
            "acceptance_criteria": not (
                isinstance(criteria, list) and criteria and all(map(_written, criteria))
            ),
            "minimum_acceptance_rate": self.rate is None,
            "decided_on": self.decided_on is None,
            "decided_by": not _written(self.decisions.get("decided_by")),
        }
        return [name for name, missing in blank.items() if missing]


def _written(value) -> bool:
    return isinstance(value, str) and value.strip() != ""


def quality_errors(row: dict[str, str], protocol: Protocol) -> list[str]:
    """The quality columns are filled all three or none, under the protocol the row names, once
    its decisions are written and dated no later than the run (spec rule 25: before testing)."""
    filled = [column for column in QUALITY if row[column]]
    if not filled:
        return []
    if len(filled) < len(QUALITY):
        return [
            f"$.{c}: empty, but other quality columns are filled" for c in QUALITY if not row[c]
        ]
    if row["protocol_sha256"] != protocol.sha256:
        return [
            f"$.protocol_sha256: quality values are judged under the protocol the row was "
            f"recorded with, and {protocol.path.name} is another version"
        ]
    try:
        blank = protocol.undecided()
    except (ValueError, UnicodeDecodeError) as exc:
        return [f"$.protocol_sha256: the protocol cannot be read ({exc})"]
    if blank:
        return [
            f"$.useful_work: the protocol's decisions are still blank ({', '.join(blank)}): "
            f"write them in {protocol.path.name} before any run"
        ]
    errors = []
    measured = datetime.date.fromisoformat(row["measured_utc"][:10])
    if measured < protocol.decided_on:
        errors.append(
            f"$.measured_utc: the run ({measured}) predates the protocol's decisions "
            f"(decided_on {protocol.decided_on})"
        )
    useful, accepted = int(row["useful_work"]), int(row["accepted_results"])
    if accepted > useful:
        errors.append(f"$.accepted_results: {accepted} accepted out of {useful} units of work")
    met = useful > 0 and Fraction(accepted, useful) >= Fraction(protocol.rate)  # exact
    if (row["threshold_met"] == "yes") != met:
        errors.append(
            f"$.threshold_met: {row['threshold_met']!r}, but {accepted} accepted out of "
            f"{useful} {'meets' if met else 'does not meet'} the minimum acceptance rate "
            f"{protocol.rate}"
        )
    return errors


# ---------------------------------------------------------------- results logs


@functools.cache
def kit_header(grid: Path = KIT_GRID) -> tuple[str, ...]:
    """The columns of every results log: the header of the kit's empty grid."""
    with grid.open(newline="", encoding="utf-8") as handle:
        return tuple(next(csv.reader(handle)))


def parse_log(data: bytes, header: tuple[str, ...]) -> tuple[list[tuple[int, dict]], list[str]]:
    """(line number, row as a dict of strings) for each row, and the errors of the file's shape:
    a header that is not the kit's, a row with the wrong number of cells, a torn last line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [f"$: not UTF-8 ({exc})"]
    errors = []
    if text and not text.endswith("\n"):
        errors.append("$: the last line has no line end (a torn append, or an edit by hand)")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows = []
    try:
        first = next(reader, None)
        if first is None or tuple(first) != header:
            return [], [*errors, f"line 1: not the header of {KIT_GRID.name}"]
        for cells in reader:
            if len(cells) != len(header):
                errors.append(f"line {reader.line_num}: {len(cells)} cells, expected {len(header)}")
            else:
                rows.append((reader.line_num, dict(zip(header, cells, strict=True))))
    except csv.Error as exc:
        errors.append(f"line {reader.line_num}: not CSV ({exc})")
    return rows, errors


def row_errors(row: dict[str, str], registry: Registry, protocol: Protocol) -> list[str]:
    return schema_errors(row, RESULTS_ROW, registry) or quality_errors(row, protocol)


def log_errors(data: bytes, registry: Registry, protocol: Protocol) -> list[str]:
    """Every row checked, and no run recorded twice."""
    rows, errors = parse_log(data, kit_header())
    seen: dict[str, int] = {}
    for line, row in rows:
        errors += [f"line {line}: {e}" for e in row_errors(row, registry, protocol)]
        first = seen.setdefault(row["run_id"], line)
        if first != line:
            errors.append(f"line {line}: $.run_id: {row['run_id']} is already at line {first}")
    return errors


def read_shared(path: Path) -> bytes:
    """A log's bytes under a shared lock, so that no append is half-seen."""
    with path.open("rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        return handle.read()


# ---------------------------------------------------------------- command line


def expand(paths: list[str]) -> list[Path]:
    """Run folders stand for their artefacts; a missing path is unusable input."""
    files = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = [path / name for name in RUN_ARTEFACTS if (path / name).is_file()]
            if not found:
                raise Usage(f"{path}: no {' or '.join(RUN_ARTEFACTS)} inside")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise Usage(f"{path}: no such file or folder")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="validate.py", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="artefacts, run folders, logs")
    try:
        files = expand(parser.parse_args(argv).paths)
        logs = any(path.suffix == ".csv" for path in files)
        protocol = Protocol() if logs else None  # quality columns are judged against it
    except (Usage, OSError) as exc:
        print(f"validate.py: error: {exc}", file=sys.stderr)
        return 2
    registry = load_registry()
    invalid = 0
    for path in files:
        if path.suffix == ".csv":
            errors = log_errors(read_shared(path), registry, protocol)
        else:
            errors = validate_json(path.read_bytes(), registry)
        for error in errors:
            print(f"{path}: {error}", file=sys.stderr)
        invalid += bool(errors)
        if not errors:
            print(f"{path}: valid")
    return 1 if invalid else 0


if __name__ == "__main__":
    raise SystemExit(main())
