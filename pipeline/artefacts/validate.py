"""Validate pipeline artefacts and results logs against the JSON Schemas in schemas/, and the
facts a schema cannot state; nothing is written.

    python -m pipeline.artefacts.validate runs/                  # the whole tree of evidence
    python -m pipeline.artefacts.validate runs/<run-id>/ more.json runs/resultats-bruts.csv

A folder is walked. Each *.json file in it is an artefact that names its schema in its
"schema" key (a file named environment.json or measurement.json must be that kind); each
*.csv file is a results log, whose header is the kit grid's (data/resultats-bruts.csv) and
whose rows are each checked; any other file is listed as skipped, with the reason, and so is
a symbolic link (never followed) and a sweep point's unfinished folder (.<run id>.partial: a
sweep still measuring, or one interrupted; not read, no failure: the runs beside it are
whole). A file named on the command line is an artefact, or a log if it ends in .csv. The
last line counts the files: "N valid, M invalid, K skipped".

Exit 0 all valid, 1 any file invalid (each error with its JSON path or line), 2 unusable
input (a path that does not exist, a folder with nothing to validate, jsonschema missing).
record.py and merge.py import this module: every rule lives here once.
"""

from __future__ import annotations

import codecs
import csv
import datetime
import fcntl
import functools
import hashlib
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Iterator
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

try:
    from jsonschema import Draft202012Validator, FormatChecker, validators
    from referencing import Registry, Resource
except ImportError as exc:  # the GPU host's Python may lack them: say what to install
    print(
        f"{Path(sys.argv[0]).name}: error: {exc.name} is not installed for {sys.executable}: "
        "python3 -m pip install jsonschema referencing pyyaml",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

from pipeline.core import cli, json_input, phase_protocol, places, run_folders, workload_kinds
from pipeline.core.prediction_status import PredictionStatus
from pipeline.core.run_status import RunStatus
from pipeline.core.workload_kinds import Kind
from pipeline.workloads import decoder_rules, own_model_facts, seed_network

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = places.folder("schemas")
KIT_GRID = places.folder("data") / "resultats-bruts.csv"  # the kit's empty grid: the logs' header
PROTOCOL = places.folder("data") / "protocole-qualite.md"
ENVIRONMENT = "urn:iteragpu-lab:schema:environment:v1"
MEASUREMENTS = workload_kinds.NETWORK.schemas
DECODER = decoder_rules.SCHEMA
OWN_MODEL = workload_kinds.OWN.schemas[0]
RESULTS_ROW = "urn:iteragpu-lab:schema:results-row:v1"
PHASE_PREDICTION = "urn:iteragpu-lab:schema:phase-prediction:v1"  # estimate --phases --json
SWEEP = "urn:iteragpu-lab:schema:sweep:v1"
CALIBRATION = decoder_rules.CALIBRATION_SCHEMA
HF_ZOO = "urn:iteragpu-lab:schema:hf-zoo-grid:v1"  # tests/benchmarks/hf_zoo_grid.py
# A run folder's files: their names promise their kind.
NAMED_KINDS = {
    "environment.json": ((ENVIRONMENT,), "an environment"),
    "measurement.json": (workload_kinds.MEASUREMENT_SCHEMAS, "a measurement"),
}
QUALITY = ("useful_work", "accepted_results", "threshold_met")
# The decoder log's header is the kit's, then these, in this order (results-row schema); the
# own-model log's is the decoder log's, then the own model's: one log can then hold every
# workload, and merge.py unites logs of the three headers.
DECODER_COLUMNS = workload_kinds.DECODER.columns
OWN_COLUMNS = workload_kinds.OWN.columns
HEADERS_NAMED = ", ".join(f"nor the {k.log_title} log's" for k in workload_kinds.KINDS[1:])
# What a walk meets besides artefacts and logs, and why it is not validated.
SKIPPED_SUFFIXES = {
    ".png": "a picture, drawn from the artefacts beside it: no schema",
    ".txt": "text for people: no schema",
    ".md": "text for people: no schema",
    ".gz": "an archive of raw records (traces), read by their tools: no schema",
    ".py": "the script that wrote the files beside it, kept as it ran: no schema",
    ".log": "what a script printed as it ran: no schema",
    ".sh": "the script a GPU call ran, kept as it ran: no schema",
    ".compare": "a script's printout of a history against its replay: no schema",
    ".pickle": "an allocator history as measure --memory-history pickled it, never unpickled "
    "by validate: no schema",
}
ARTEFACT, LOG, SKIPPED = "artefact", "log", "skipped"
# An artefact is read whole: none the lab writes comes near (the largest committed, 7 MB).
MAX_ARTEFACT_BYTES = 64 << 20
GPU_PROBE = "urn:iteragpu-lab:schema:gpu-probe:v1"
SDPA_CHOICES = "urn:iteragpu-lab:schema:sdpa-choices:v1"
SEGMENT_ADDRESSES = "urn:iteragpu-lab:schema:segment-addresses:v1"


def schema_by_place(path: Path) -> str | None:
    """The schema of a raw record written on a GPU without a schema key, named by where it
    lies: probes/<name>.json in a runs/<stamp>-<gpu>-probe(s|-sweep...)/ folder,
    sdpa-choices.json, and the segment records of a runs/<stamp>-<gpu>-segment-addresses/
    folder (segments-<seed>.json), and <name>.segments.json wherever it lies (the segment
    events of a measurement, hf_zoo_grid.py measure --segments)."""
    if path.parent.name == "probes" and "-probe" in path.parent.parent.name:
        return GPU_PROBE
    if path.name == "sdpa-choices.json":
        return SDPA_CHOICES
    folders = {path.parent.name, path.parent.parent.name}
    if path.name.endswith(".segments.json") or (
        any(name.endswith("-segment-addresses") for name in folders)
        and path.name.startswith("segments-")
    ):
        return SEGMENT_ADDRESSES
    return None


# ---------------------------------------------------------------- JSON and schemas


def load_json(data: bytes | str):
    """Standard JSON only (json_input.py): NaN and Infinity are refused, and so are a key given
    twice in one object and nesting deeper than Python can parse: each raises ValueError, as
    any other text that is not JSON does."""
    return json_input.loads(data, max_depth=None)


def load_registry(folder: Path = SCHEMAS) -> Registry:
    """Every schema under its $id, so that $ref between files resolves without a network.
    They are not re-checked against the meta-schema here: the tests do that."""
    resources = []
    for path in sorted(folder.glob("*.schema.json")):
        contents = load_json(path.read_bytes())
        resources.append((contents["$id"], Resource.from_contents(contents)))
    return Registry().with_resources(resources)


def _is_datetime(instance: object) -> bool:
    """RFC 3339 date-time. jsonschema checks this format only when the optional
    rfc3339-validator package is installed; checking it here judges a file the same way on
    every host."""
    if not isinstance(instance, str):
        return True
    shape = (
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})"
    )
    if not re.fullmatch(shape, instance):
        return False
    try:
        datetime.date.fromisoformat(instance[:10])  # a real calendar day
    except ValueError:
        return False
    hour, minute, second = int(instance[11:13]), int(instance[14:16]), int(instance[17:19])
    return hour < 24 and minute < 60 and second < 62  # 60 and 61: leap seconds


def _is_integer(checker, instance: object) -> bool:
    """An int, and not 1.0, which JSON Schema counts as an integer: measure never writes one,
    and a log cell would read "1.0", so validate and record refuse it alike."""
    return isinstance(instance, int) and not isinstance(instance, bool)


FORMATS = FormatChecker(Draft202012Validator.FORMAT_CHECKER.checkers)
FORMATS.checks("date-time")(_is_datetime)
Validator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def json_path(parts) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def schema_errors(document, schema_id: str, registry: Registry) -> list[str]:
    validator = Validator(registry.contents(schema_id), registry=registry, format_checker=FORMATS)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path)))
    return [f"{json_path(e.absolute_path)}: {e.message}" for e in errors]


# ---------------------------------------------------------------- measurement facts


def gpu_facts(gpu: dict, device: str) -> list[str]:
    """A measurement names the GPU it measured, as its configuration's device."""
    if not gpu["available"]:
        return ["$.environment.gpu.available: a measurement needs the GPU it measured"]
    if device != f"cuda:{gpu['index']}":
        return [f"$.environment.gpu.index: {gpu['index']}, not {device}"]
    return []


def measurement_facts(document: dict) -> list[str]:
    """What the counters, the phase plan and the configuration imply together, each error with
    its JSON path: the phases run in the fixed order, then one warm_forward row per repetition;
    an out-of-memory run stops at the next planned phase; the GPU measured is the one named."""
    errors = []
    phases = document["phases"]
    for i, row in enumerate(phases):
        errors += own_model_facts.counter_facts(f"$.phases[{i}]", row)
    configuration = document["configuration"]
    repeats = configuration["repeats"]
    names = [row["phase"] for row in phases]
    planned = len(seed_network.FIXED_PHASES) + repeats  # counted: a file may claim billions
    expected = [*seed_network.FIXED_PHASES, *(["warm_forward"] * min(repeats, len(names)))]
    if document["status"] == RunStatus.COMPLETED and (
        len(names) != planned or names != expected[: len(names)]
    ):
        errors.append(f"$.phases: {len(names)} rows, expected {planned} for repeats={repeats}")
    if document["status"] == RunStatus.OUT_OF_MEMORY:
        failure = document["failure"]
        counters = failure["counters_after_failure"]
        errors += own_model_facts.counter_facts("$.failure.counters_after_failure", counters)
        if names != expected[: len(names)] or len(names) >= planned:
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
    errors += own_model_facts.repetition_facts(phases, "warm_forward", configuration["warmup"])
    shape = [configuration["batch"], configuration["context"], configuration["width"]]
    if configuration["input_shape"] != shape:
        errors.append("$.configuration.input_shape: not [batch, context, width]")
    if not document["environment"]["torch"]["available"]:
        errors.append("$.environment.torch.available: a measurement needs the PyTorch it used")
    errors += gpu_facts(document["environment"]["gpu"], configuration["device"])
    return errors + summary_facts(document["summary"], phases)


def summary_facts(summary: dict, phases: list[dict]) -> list[str]:
    """The summary is what the results log copies: it must say what the phases say."""
    warm = [row for row in phases if row["phase"] == "warm_forward"]

    def median(key: str):
        return statistics.median(row[key] for row in warm) if warm else None

    expected = {
        # recomputed here, apart from phase_protocol.peaks_summary: the check is independent
        "phases_completed": len(phases),
        "largest_peak_allocated_bytes": max((r["peak_allocated_bytes"] for r in phases), default=0),
        "largest_peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in phases), default=0),
        "warm_forward_median_event_time_ns": median("event_time_ns"),
        "warm_forward_median_wall_time_ns": median("wall_time_ns"),
    }
    return own_model_facts.mismatches("$.summary", summary, expected, "but the phases give")


def prediction_facts(document: dict) -> list[str]:
    """Version 2: the summary's differences and each row's overhead follow from the rows."""
    phases = document["phases"]
    if "prediction" not in document["summary"]:
        return []
    errors = []
    for i, row in enumerate(phases):
        if row["harness_overhead_ns"] != row["wall_time_ns"] - row["event_time_ns"]:
            errors.append(f"$.phases[{i}].harness_overhead_ns: not wall_time_ns - event_time_ns")
    by_counter = document["summary"]["prediction"]["by_counter"]
    largest = {
        key: max((abs(row[key] - row["predicted"][key]) for row in phases), default=0)
        for key in by_counter
    }
    return errors + own_model_facts.mismatches(
        "$.summary.prediction.by_counter", by_counter, largest
    )


def decoder_facts(document: dict) -> list[str]:
    """What a decoder file's rows, plan and summary imply together: counters consistent in
    every row (measured and predicted), the rows in the plan's order (an out-of-memory run a
    prefix of it, stopped at the next planned row), the cache's size from the configuration,
    and a summary that says what the rows say."""
    errors = []
    phases, configuration = document["phases"], document["configuration"]
    predicted_only = document["status"] == RunStatus.PREDICTED
    for i, row in enumerate(phases):
        if not predicted_only:
            errors += own_model_facts.counter_facts(f"$.phases[{i}]", row)
            if row["harness_overhead_ns"] != row["wall_time_ns"] - row["event_time_ns"]:
                errors.append(
                    f"$.phases[{i}].harness_overhead_ns: not wall_time_ns - event_time_ns"
                )
        errors += own_model_facts.counter_facts(f"$.phases[{i}].predicted", row["predicted"])
    rows = [
        (r["phase"], r.get("repetition"), r["tokens"], r["passes"], r["first_position"])
        for r in phases
    ]
    planned = decoder_rules.planned_rows(configuration)
    plan = decoder_rules.written_rows(configuration, len(rows) + 1)
    if document["status"] == RunStatus.OUT_OF_MEMORY:
        failure = document["failure"]
        errors += own_model_facts.counter_facts(
            "$.failure.counters_after_failure", failure["counters_after_failure"]
        )
        if len(rows) >= planned or rows != plan[: len(rows)]:
            errors.append("$.phases: rows of an out-of-memory run must be a prefix of the plan")
        elif (failure["phase"], failure["repetition"]) != plan[len(rows)][:2]:
            errors.append(
                f"$.failure: {failure['phase']!r} repetition {failure['repetition']}, but the "
                f"next planned row is {plan[len(rows)][0]!r} repetition {plan[len(rows)][1]}"
            )
    elif len(rows) != planned or rows != plan[: len(rows)]:
        first = next((i for i, (a, b) in enumerate(zip(rows, plan, strict=False)) if a != b), None)
        where = (
            f"row {first} is {rows[first]}, the plan's {plan[first]}" if first is not None else ""
        )
        errors.append(
            f"$.phases: {len(rows)} rows, the plan of prompt {configuration['prompt']}, "
            f"new_tokens {configuration['new_tokens']}, warmup {configuration['warmup']}, "
            f"tokens_per_row {configuration['tokens_per_row']} has {planned}"
            + (f" ({where})" if where else "")
        )
    cache = document["cache"]
    positions = configuration["prompt"] + configuration["new_tokens"]
    if cache["positions"] != positions:
        errors.append(
            f"$.cache.positions: {cache['positions']}, not prompt + new_tokens {positions}"
        )
    if cache["bytes"] != cache["tensors"] * cache["bytes_per_tensor"]:
        errors.append("$.cache.bytes: not tensors x bytes_per_tensor")
    if cache["tensors"] != 2 * configuration["shape"]["layers"]:
        errors.append("$.cache.tensors: not one K and one V tensor per layer")
    summary = document["summary"]
    source = [row["predicted"] for row in phases] if predicted_only else phases
    expected = {
        "largest_peak_allocated_bytes": max((r["peak_allocated_bytes"] for r in source), default=0),
        "largest_peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in source), default=0),
        ("phases" if predicted_only else "phases_completed"): len(phases),
    }
    errors += own_model_facts.mismatches("$.summary", summary, expected, "but the rows give")
    if decoder_rules.traced(document["prediction"]):
        errors += traced_decoder_facts(document)
    if not predicted_only:
        errors += decoder_prediction_facts(summary["prediction"], phases)
        errors += gpu_facts(document["environment"]["gpu"], configuration["device"])
    return errors


def traced_decoder_facts(document: dict) -> list[str]:
    """A traced prediction (decoder.py 2): its rows are the plan's, each row's predicted
    counters are its, and a measurement's verdict (status, held, bounds held) is what the
    rows give."""
    prediction, phases = document["prediction"], document["phases"]
    errors = own_model_facts.prediction_peak_facts(prediction)
    rows, configuration = prediction["phases"], document["configuration"]
    plan = [row[:2] for row in decoder_rules.written_rows(configuration, len(rows) + 1)]
    if (
        len(rows) != decoder_rules.planned_rows(configuration)
        or [(row["phase"], row.get("repetition")) for row in rows] != plan[: len(rows)]
    ):
        errors.append("$.prediction.phases: not the rows of the configuration's plan")
    for i, (row, expected) in enumerate(zip(phases, rows, strict=False)):
        if row["predicted"] != {key: expected[key] for key in phase_protocol.COUNTER_KEYS}:
            errors.append(f"$.phases[{i}].predicted: not $.prediction.phases[{i}]")
    if document["status"] != RunStatus.PREDICTED:
        summary = document["summary"]["prediction"]
        by_counter = phase_protocol.prediction_summary(document)["by_counter"]
        expected = own_model_facts.verdict(document, by_counter)
        errors += own_model_facts.mismatches("$.summary.prediction", summary, expected)
    return errors


def decoder_prediction_facts(prediction: dict, phases: list[dict]) -> list[str]:
    """summary.prediction: the largest |measured - predicted| per counter, from the rows."""
    by_counter = {
        key: max((abs(row[key] - row["predicted"][key]) for row in phases), default=0)
        for key in phase_protocol.COUNTER_KEYS
    }
    largest = {
        f"largest_abs_difference_{kind}_bytes": max(v for k, v in by_counter.items() if kind in k)
        for kind in ("allocated", "reserved")
    }
    return own_model_facts.mismatches(
        "$.summary.prediction.by_counter", prediction["by_counter"], by_counter
    ) + own_model_facts.mismatches("$.summary.prediction", prediction, largest)


# What a GPU's total memory can be, as PyTorch reports it: at least MIN_GPU_MEMORY_BYTES (no
# GPU the lab measures has less; a MIG slice has 10 GB) and at most the nominal memory of its
# model taken as GiB (PyTorch saw 139.80 GiB of the H200's nominal 141 and 79.19 of the
# H100's 80): the figure in its name ("NVIDIA H100 80GB HBM3"), else GPU_NOMINAL_GIB's,
# else MAX_GPU_MEMORY_BYTES for a model the lab does not know (the largest has 288 GB).
MIN_GPU_MEMORY_BYTES, MAX_GPU_MEMORY_BYTES = 1 << 30, 1 << 40
GPU_NOMINAL_GIB = {
    "H200": 141, "B200": 180, "B300": 288, "H100": 94, "GH200": 144, "A100": 80, "H20": 96,
    "L40S": 48, "L40": 48, "L4": 24, "A10G": 24, "A10": 24, "T4": 16, "V100": 32,
    "MI300X": 192, "MI325X": 256, "MI355X": 288, "MI250X": 128,
}  # fmt: skip


def gpu_memory_limit(name: str) -> tuple[int, str]:
    """The most total memory a GPU of this name can report, and where that figure is from."""
    stated = re.search(r"(?<![0-9])([0-9]{1,4})GB\b", name, re.IGNORECASE)
    if stated:
        return int(stated.group(1)) << 30, f"the {stated.group(1)} GB its name states"
    for model, gib in GPU_NOMINAL_GIB.items():
        if re.search(rf"(?<![A-Z0-9]){model}(?![A-Z0-9])", name.upper()):
            return gib << 30, f"a {model}'s nominal {gib} GB"
    return MAX_GPU_MEMORY_BYTES, "any GPU's (1 TiB)"


def environment_facts(where: str, environment: dict) -> list[str]:
    """What PyTorch reported of its GPU must be possible: free memory is part of the total, so
    the CUDA context (total minus free) is never negative, and the total is one a GPU of its
    model can have (gpu_memory_limit). fit.py sizes every GPU from these two figures: one
    impossible figure would change every answer for that GPU."""
    gpu = environment["gpu"]
    if not gpu.get("available"):
        return []
    total, free = gpu["total_memory_bytes"], gpu["free_memory_bytes_at_start"]
    limit, source = gpu_memory_limit(gpu["name"])
    if not MIN_GPU_MEMORY_BYTES <= total <= limit:
        return [
            f"{where}.gpu.total_memory_bytes: {total} is not a {gpu['name']}'s: a GPU's total is "
            f"from {MIN_GPU_MEMORY_BYTES} bytes (1 GiB) to {limit} ({source})"
        ]
    if free > total:
        return [
            f"{where}.gpu.free_memory_bytes_at_start: {free} > total_memory_bytes {total} "
            "(free memory is part of the total)"
        ]
    return []


def beside_facts(path: Path) -> list[str]:
    """A run folder's environment.json and the environment its measurement.json records are
    one record of one process: they must be the same (fit.py reads the first, record.py the
    second). Errors name the first key that differs; a file that is not JSON is left to its
    own verdict."""
    other = path.with_name(
        "measurement.json" if path.name == "environment.json" else "environment.json"
    )
    if path.name not in NAMED_KINDS or not other.is_file() or not path.is_file():
        return []
    try:
        environments = [load_json(read_limited(p)).get("environment") for p in (path, other)]
    except (ValueError, AttributeError, OSError):
        return []
    if environments[0] == environments[1] or not all(isinstance(e, dict) for e in environments):
        return []
    mine, theirs = environments
    for key in sorted(mine.keys() | theirs.keys()):
        if mine.get(key) != theirs.get(key):
            inner = mine.get(key), theirs.get(key)
            if all(isinstance(value, dict) for value in inner):
                key += "." + next(k for k in sorted(inner[0].keys() | inner[1].keys())
                                  if inner[0].get(k) != inner[1].get(k))  # fmt: skip
            return [
                f"$.environment.{key}: differs from the environment {other.name} beside it "
                "records (one run, one environment)"
            ]
    return []


def calibration_facts(document: dict) -> list[str]:
    """An own-model measurement's calibration: every block its operators allocated fits on the
    GPU it names (--calibration believes them; one of 10**30 bytes would be every peak)."""
    calibration = document.get("calibration")
    environment = document.get("environment")
    if not isinstance(calibration, dict) or not isinstance(environment, dict):
        return []
    total = environment["gpu"].get("total_memory_bytes")
    if not isinstance(total, int):
        return []
    for i, entry in enumerate(calibration["operators"]):
        for j, step in enumerate(entry["template"]):
            if step.get("bytes", 0) > total:
                return [
                    f"$.calibration.operators[{i}].template[{j}].bytes: {step['bytes']} is more "
                    f"than the GPU's total memory {total}: not a block it can allocate"
                ]
    return []


def calibration_run_facts(document: dict) -> list[str]:
    """A decoder measurement's calibration was measured on the GPU model and PyTorch it ran
    with: kernels' own blocks belong to one GPU model and one PyTorch."""
    calibration = document["prediction"]["calibration"]
    traced = decoder_rules.traced(document["prediction"])  # its probes: this process's own
    if traced or calibration is None or document["status"] == RunStatus.PREDICTED:
        return []
    ran = {
        "gpu": document["environment"]["gpu"].get("name"),
        "torch": document["environment"]["torch"].get("version"),
    }
    return own_model_facts.mismatches(
        "$.prediction.calibration", calibration, ran, "but the run used"
    )


PASSES_CHECKED = 100_000  # warm-up and repeats a phase prediction may have to be re-derived


def phase_prediction_facts(document: dict) -> list[str]:
    """`estimate --phases --json` is derived from its configuration and library blocks alone:
    its rows must be what the allocator model gives for them, to the byte."""
    configuration = document["configuration"]
    passes = configuration["warmup"] + configuration["repeats"]
    if passes > PASSES_CHECKED:
        return [
            f"$.configuration: warmup + repeats {passes} is over {PASSES_CHECKED:,}, too many "
            "passes to re-derive the prediction"
        ]
    expected = seed_network.predict_phases(configuration, document["library_blocks"])
    if len(document["phases"]) != len(expected):
        return [
            f"$.phases: {len(document['phases'])} rows, the configuration gives {len(expected)}"
        ]
    for i, (row, want) in enumerate(zip(document["phases"], expected, strict=True)):
        for key, value in want.items():
            if row[key] != value:
                return [
                    f"$.phases[{i}].{key}: {row[key]!r}, but the allocator model gives "
                    f"{value!r} for this configuration"
                ]
    return []


def sweep_facts(document: dict) -> list[str]:
    """The sweep's answer is its last completed point, and each point's counters agree."""
    points = document["points"]
    errors = []
    for i, point in enumerate(points):
        if point["peak_allocated_bytes"] > point["peak_reserved_bytes"]:
            errors.append(f"$.points[{i}]: peak_allocated_bytes > peak_reserved_bytes")
    runs = [point["run"] for point in points]
    if len(set(runs)) != len(runs):
        errors.append("$.points: a run folder is named twice")
    completed = [point for point in points if point["status"] == RunStatus.COMPLETED]
    if document["largest_fitted"] != (completed[-1] if completed else None):
        errors.append("$.largest_fitted: not the last completed point of $.points")
    return errors


def hf_zoo_point_facts(where: str, point: dict) -> list[str]:
    """A point's comparison is its phases' own, and its verdicts follow from it."""
    comparison, prediction = point["comparison"], point["prediction"]
    if comparison is None:
        return []
    if prediction is None or point["measurement"] is None:
        return [f"{where}.comparison: without both a prediction and a measurement"]
    predicted, measured = prediction["phases"], point["measurement"]["phases"]
    errors = []
    aligned = len(predicted) == len(measured)
    largest = dict.fromkeys(phase_protocol.COUNTER_KEYS, 0)
    broken, checked = [], 0
    for i, (p, m) in enumerate(zip(predicted, measured, strict=False)):
        aligned = aligned and p["phase"] == m["phase"]
        for key in phase_protocol.COUNTER_KEYS:
            if key in p["counters"] and key in m["counters"]:
                difference = abs(m["counters"][key] - p["counters"][key])
                largest[key] = max(largest[key], difference)
            else:
                aligned = False
        for key, bound in sorted((p["bounds"] or {}).items()):
            if key not in m["counters"]:
                continue
            checked += 1
            value, lower, upper = m["counters"][key], bound["lower"], bound["upper"]
            if (lower is not None and value < lower) or (upper is not None and value > upper):
                broken.append((i, key))
    if comparison["largest_abs_difference"] != largest:
        errors.append(f"{where}.comparison.largest_abs_difference: not its phases' differences")
    if comparison["phases_aligned"] != aligned:
        errors.append(f"{where}.comparison.phases_aligned: {comparison['phases_aligned']}, "
                      f"its phases say {aligned}")  # fmt: skip
    equal = aligned and not any(largest.values())
    if comparison["equal_to_the_byte"] != equal:
        errors.append(f"{where}.comparison.equal_to_the_byte: its phases say {equal}")
    listed = [(b["phase_index"], b["counter"]) for b in comparison["bounds_broken"]]
    if comparison["bounds_checked"] != checked or listed != broken:
        errors.append(f"{where}.comparison: bounds checked or broken are not its phases' own")
    verdicts = []
    if prediction["status"] == PredictionStatus.EXACT:
        verdicts.append("exact_held" if equal else "false_exact")
    if checked:
        verdicts.append("bounds_broken" if broken else "bounds_held")
    if point["verdicts"] != (verdicts or ["no_claim"]):
        errors.append(f"{where}.verdicts: {point['verdicts']}, its comparison gives "
                      f"{verdicts or ['no_claim']}")  # fmt: skip
    return errors


def hf_zoo_facts(document: dict) -> list[str]:
    """The zoo grid's totals count its points' verdicts; each point's verdicts are its own."""
    points = document["points"]
    errors = []
    names = [point["name"] for point in points]
    if len(set(names)) != len(names):
        errors.append("$.points: a name is given twice")
    for i, point in enumerate(points):
        errors += hf_zoo_point_facts(f"$.points[{i}]", point)
    compared = [point for point in points if point["comparison"] is not None]
    equal = sum(point["comparison"]["equal_to_the_byte"] for point in compared)
    not_measured = sum("not_measured" in point["verdicts"] for point in points)
    expected = {
        "points": len(points),
        "crashes": len(points) - len(compared) - not_measured,
        **({"not_measured": not_measured} if "not_measured" in document["totals"] else {}),
        **{
            verdict: sum(verdict in point["verdicts"] for point in points)
            for verdict in ("exact_held", "false_exact", "bounds_held", "bounds_broken", "no_claim")
        },
        "equal_to_the_byte": equal,
    }
    totals = document["totals"]
    errors += own_model_facts.mismatches("$.totals", totals, expected, "the points give")
    share = totals["share_exact_to_the_byte"]
    if (share is None) != (not compared) or (
        compared and abs(share - equal / len(compared)) > 1e-6
    ):
        errors.append("$.totals.share_exact_to_the_byte: not equal_to_the_byte over the points "
                      "compared")  # fmt: skip
    return errors


def document_facts(document: dict) -> list[str]:
    """The facts of a document whose schema holds: each kind's own, then its environment's."""
    schema = document["schema"]
    if schema == SWEEP:
        return sweep_facts(document)
    if schema == HF_ZOO:
        return hf_zoo_facts(document)
    if schema == CALIBRATION:
        return decoder_rules.calibration_facts(document)
    if schema == ENVIRONMENT:
        return environment_facts("$.environment", document["environment"])
    if schema == PHASE_PREDICTION:
        return phase_prediction_facts(document)
    kind = workload_kinds.of_schema(schema)
    if kind is None:
        return []
    errors = MEASUREMENT_FACTS[kind.kind](document) + bounds_said_facts(document)
    if isinstance(document.get("environment"), dict):  # a prediction has none
        errors += environment_facts("$.environment", document["environment"])
    return errors


# Since this time (commit 35dada1), every approximate traced prediction carries its bounds or
# says why it has none ("unbounded"); the files written before it have neither, and are read
# as they are (their predicted peak, said approximate). created_utc's pattern, one fixed
# width in UTC, orders its text as its time.
BOUNDS_SINCE = "2026-12-03T21:34:47Z"


def bounds_said_facts(document: dict) -> list[str]:
    """An approximate traced prediction written since BOUNDS_SINCE has its bounds or says why
    not: without them fit would size a GPU by its central figure, under what it may need."""
    prediction = document.get("prediction")
    if (
        not isinstance(prediction, dict)
        or prediction.get("status") != PredictionStatus.APPROXIMATE
        or "bounds" in prediction
        or "unbounded" in prediction
    ):
        return []
    if document["created_utc"] < BOUNDS_SINCE:
        return []
    return [
        '$.prediction: approximate, with neither its bounds nor "unbounded" saying why it has '
        f"none (every approximate prediction written since {BOUNDS_SINCE} has one or the "
        "other): its predicted peak is not the most it may need"
    ]


def own_model_document_facts(document: dict) -> list[str]:
    return own_model_facts.document_facts(document) + calibration_facts(document)


# What each kind's measurement.json implies beyond its schema (the kind's code; which schema
# is whose is workload_kinds' data).
MEASUREMENT_FACTS = {
    Kind.NETWORK: lambda document: measurement_facts(document) + prediction_facts(document),
    Kind.DECODER: lambda document: decoder_facts(document) + calibration_run_facts(document),
    Kind.OWN: own_model_document_facts,
}


def validate_document(document, registry: Registry, schema: str | None = None) -> list[str]:
    """Schema errors first (with paths); facts only once the shape is known to be right.
    `schema` names the schema of a document that carries none (a phase prediction)."""
    if schema is not None and isinstance(document, dict) and "schema" not in document:
        document = {"schema": schema, **document}
    elif schema is not None and isinstance(document, list):  # a raw list of records
        document = {"schema": schema, "records": document}
    if not isinstance(document, dict) or not isinstance(document.get("schema"), str):
        return ['$: not an artefact: no "schema" key naming its schema']
    if document["schema"] == RESULTS_ROW or document["schema"] not in registry:
        return [f"$.schema: unknown artefact schema {document['schema']!r}"]
    try:
        errors = schema_errors(document, document["schema"], registry)
        return errors or document_facts(document)
    except RecursionError:  # a value nested hundreds deep where the schema wants a number
        return ["$: nested too deeply to check"]


def validate_json(data: bytes, registry: Registry) -> list[str]:
    """The errors of an artefact given as bytes (read_artefact also checks its file name)."""
    try:
        document = load_json(data)
    except ValueError as exc:  # UnicodeDecodeError included
        return [f"$: not valid JSON ({exc})"]
    return validate_document(document, registry)


class Artefact(NamedTuple):
    data: bytes
    document: object
    errors: list[str]


def read_limited(path: Path) -> bytes:
    """An artefact's bytes, at most MAX_ARTEFACT_BYTES, refused from its size unread."""
    try:
        return json_input.read_limited(path, MAX_ARTEFACT_BYTES)
    except json_input.JsonInputError as exc:
        raise ValueError(f"not read: {exc}") from None


def read_artefact(path: Path, registry: Registry) -> Artefact:
    """A file's bytes, its document and its errors: the schema it names, the facts, and the
    kind its name promises (record.py appends a row only for an artefact without errors)."""
    if path.is_dir():
        return Artefact(b"", None, ["$: a folder, not a file"])
    try:
        data = read_limited(path)
    except ValueError as exc:
        return Artefact(b"", None, [f"$: {exc}"])
    try:
        document = load_json(data)
    except ValueError as exc:
        return Artefact(data, None, [f"$: not valid JSON ({exc})"])
    placed = schema_by_place(path)
    errors = validate_document(document, registry, placed)
    if errors:
        return Artefact(data, None, errors)
    named = document.get("schema", placed) if isinstance(document, dict) else placed
    kinds, kind = NAMED_KINDS.get(path.name, ((named,), ""))
    if named not in kinds:
        errors = [f"$.schema: {named!r} is not {kind}, which {path.name} holds"]
    return Artefact(data, document, errors)


# ---------------------------------------------------------------- reading at the edge


@functools.cache
def registry() -> Registry:
    """The schemas, loaded once per process for the stages that read artefacts."""
    return load_registry()


def outside(path: Path, folder: Path) -> bool:
    """Whether `path`, its links followed, lies outside `folder`: a link there reads or
    writes a file the runs folder does not hold."""
    return not path.resolve().is_relative_to(folder.resolve())


def read_json_file(path: Path, inside: Path | None = None) -> tuple[bytes, object]:
    """A file's bytes and its JSON, or one line saying why not; with `inside`, a file that a
    symbolic link places outside that folder is refused unread."""
    if inside is not None and outside(path, inside):
        raise cli.UsageError(f"{path}: a symbolic link out of {inside}: not read")
    if not path.is_file():
        why = "not a file" if path.exists() else "no such file or directory"
        raise cli.UsageError(f"{path}: {why}")
    try:
        data = read_limited(path)
    except ValueError as exc:
        raise cli.UsageError(f"{path}: {exc}") from None
    try:
        return data, load_json(data)
    except ValueError as exc:
        raise cli.UsageError(f"{path}: not valid JSON ({exc})") from None


def checked(
    path: Path,
    kinds: tuple[str, ...],
    what: str,
    schema: str | None = None,
    inside: Path | None = None,
) -> Artefact:
    """The one reader of every file a stage reads: the schema it names (or `schema`, for a
    file that names none) must be one of `kinds`, and the schema and the facts validate.py
    applies must hold; otherwise one line, as a UsageError (exit 2, nothing written). With
    `inside`, a file that a symbolic link places outside that folder is refused unread."""
    data, document = read_json_file(path, inside)
    named = document.get("schema", schema) if isinstance(document, dict) else None
    if named not in kinds:
        raise cli.UsageError(f"{path}: not {what} (schema {named!r})")
    errors = validate_document(document, registry(), schema)
    if errors:
        first = errors[0] if len(errors[0]) <= 300 else errors[0][:299] + "…"
        more = f" (and {len(errors) - 1} more: validate.py lists them)" if len(errors) > 1 else ""
        raise cli.UsageError(f"{path}: {first}{more}")
    return Artefact(data, document, [])


def checked_environment(path: Path, inside: Path) -> dict:
    """The environment a run folder's environment.json or measurement.json records, checked by
    the environment schema and its facts, as `checked` would check it, without the rest of a
    measurement: fit.py reads only this part of every folder of the runs directory, and
    validating whole measurements there would cost 25 ms each."""
    _, document = read_json_file(path, inside)
    named = document.get("schema") if isinstance(document, dict) else None
    if named not in (ENVIRONMENT, *workload_kinds.MEASUREMENT_SCHEMAS):
        raise cli.UsageError(f"{path}: not an environment or a measurement (schema {named!r})")
    environment = document.get("environment")
    reference = {"$ref": f"{ENVIRONMENT}#/$defs/environment"}
    validator = Validator(reference, registry=registry(), format_checker=FORMATS)
    errors = [
        f"$.environment{json_path(e.absolute_path)[1:]}: {e.message}"
        for e in validator.iter_errors(environment)
    ]
    errors = errors or environment_facts("$.environment", environment)
    if errors:
        raise cli.UsageError(f"{path}: {errors[0]}")
    return environment


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
    its decisions are written and dated no later than the run: a team decides what counts as
    an accepted result before any run, never after seeing the results."""
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


# ---------------------------------------------------------------- results rows, fast

# Keywords that draft 7 reads as 2020-12 does, as the row schema uses them.
SAME_IN_DRAFT_7 = {"title", "description", "type", "required", "enum", "const", "pattern"}
SAME_IN_DRAFT_7 |= {"minLength", "maxLength", "format", "minimum", "maximum"}


CELL_MEMORY = 4096


def as_draft_7(node: dict | bool) -> dict | bool:
    """A 2020-12 schema as draft 7 states it, for fastjsonschema: $defs become definitions,
    and a $ref beside other keywords (draft 7 ignores them) goes into an allOf with them.
    ValueError for a keyword whose meaning differs between the drafts."""
    if isinstance(node, bool):
        return node
    out: dict = {}
    for key, value in node.items():
        if key in ("properties", "$defs"):
            out["definitions" if key == "$defs" else key] = {
                name: as_draft_7(sub) for name, sub in value.items()
            }
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [as_draft_7(sub) for sub in value]
        elif key in ("if", "then", "else", "not"):
            out[key] = as_draft_7(value)
        elif key == "$ref" and value.startswith("#/$defs/"):
            out[key] = "#/definitions/" + value.removeprefix("#/$defs/")
        elif key in SAME_IN_DRAFT_7 or (key == "additionalProperties" and value is False):
            out[key] = value
        else:
            raise ValueError(f"{key!r} is not read alike by draft 7")
    if "$ref" in out and len(out) > 1:
        return {"allOf": [{"$ref": out.pop("$ref")}, out]}
    return out


@functools.cache
def _compiled_row_check(schema_text: str) -> Callable[[dict], bool] | None:
    """fastjsonschema's compiled form of the row schema, or None without fastjsonschema.

    A row is valid exactly when the schema holds with each property's own schema replaced by
    `true` (what is left only looks at the names and at the rules across cells), and each
    cell holds its property's schema: that is all "properties" asks. Cells repeat from row to
    row (GPU, versions, configuration), so the values found valid are remembered, up to
    CELL_MEMORY a column: a repeated value is then a set lookup."""
    try:
        import fastjsonschema
    except ImportError:
        return None
    schema = load_json(schema_text)
    body = {key: value for key, value in schema.items() if key not in ("$schema", "$id")}
    properties = body.get("properties", {})
    across = dict(body, properties=dict.fromkeys(properties, True))
    each = {"properties": properties, "$defs": body.get("$defs", {})}
    try:
        across_check, cell_check = (
            fastjsonschema.compile(
                {"$schema": "http://json-schema.org/draft-07/schema#", **as_draft_7(part)},
                formats={"date-time": _is_datetime},
            )
            for part in (across, each)
        )
    except ValueError:
        return None
    valid: dict[str, set] = {name: set() for name in properties}

    def check(row: dict) -> bool:
        try:
            across_check(row)
            for name, value in row.items():
                known = valid.get(name)
                if known is not None and value not in known:
                    cell_check({name: value})
                    if len(known) < CELL_MEMORY:
                        known.add(value)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return check


def row_screen(registry: Registry) -> Callable[[dict], bool]:
    """A quick yes for a valid row, before jsonschema is asked why a row is not. jsonschema
    needs about 1 ms a row; the row schema compiled by fastjsonschema, about 0.07 ms. A yes
    from it is a yes from jsonschema (the tests hold them to the same verdicts; it is the
    stricter of the two on a cell ending in a line end, which the row schema refuses anyway)."""
    check = _compiled_row_check(json.dumps(registry.contents(RESULTS_ROW)))
    if check is not None:
        return check
    schema = registry.contents(RESULTS_ROW)
    return Validator(schema, registry=registry, format_checker=FORMATS).is_valid


def row_errors(row: dict[str, str], registry: Registry, protocol: Protocol, screen=None):
    """The row schema's errors, else the quality rules'. `screen` (row_screen) spares
    jsonschema the rows it passes."""
    if screen is None or not screen(row):
        errors = schema_errors(row, RESULTS_ROW, registry)
        if errors:
            return errors
    return quality_errors(row, protocol)


# ---------------------------------------------------------------- results logs


@functools.cache
def kit_header(grid: Path = KIT_GRID) -> tuple[str, ...]:
    """The columns of the seed network's results log: the header of the kit's empty grid."""
    with grid.open(newline="", encoding="utf-8") as handle:
        return tuple(next(csv.reader(handle)))


def header_of(kind: workload_kinds.WorkloadKind) -> tuple[str, ...]:
    """The columns of a kind's log: the kit's, then the columns of each kind up to this one,
    in the registry's order. A log with a narrower header (every log written before the
    kind) stays a valid log as it is."""
    upto = workload_kinds.KINDS[: workload_kinds.KINDS.index(kind) + 1]
    return kit_header() + tuple(column for entry in upto for column in entry.columns)


def decoder_header() -> tuple[str, ...]:
    """The columns of the decoder log: the kit's, then the decoder's."""
    return header_of(workload_kinds.DECODER)


def own_model_header() -> tuple[str, ...]:
    """The columns of the own-model log: the decoder log's, then the own model's."""
    return header_of(workload_kinds.OWN)


def headers() -> tuple[tuple[str, ...], ...]:
    """The logs' headers, each the one before it and more columns."""
    return tuple(header_of(kind) for kind in workload_kinds.KINDS)


def log_header(data: bytes) -> tuple[str, ...]:
    """The header a log's first line claims: the decoder or own-model log's when it is
    exactly that, else the kit's (log_records then says the line is not it)."""
    first = data[: data.find(b"\n") + 1 or len(data)].rstrip(b"\r\n")
    for header in headers()[1:]:
        if first == ",".join(header).encode():
            return header
    return kit_header()


def header_for(row: dict) -> tuple[str, ...]:
    """The narrowest header that holds `row`'s workload: the log a new one is created with."""
    return header_of(workload_kinds.of_name(row.get("workload")))


def as_header(row: dict, header: tuple[str, ...]) -> dict:
    """A row with the columns of `header`: a seed-network row in a longer header gets
    workload "network", and every row empty cells for the columns it lacks."""
    if header == kit_header():
        return {column: row[column] for column in header}
    return {column: row.get(column, "network" if column == "workload" else "") for column in header}


def log_records(data: bytes, header: tuple[str, ...]) -> Iterator[tuple[int, dict | None, str]]:
    """(line, row, "") for each row as a dict of strings, or (line, None, error) for what
    breaks the file's shape: a torn last line, not UTF-8, a header that is not the kit's, a
    row with the wrong number of cells, CSV that does not parse. Rows are read one by one,
    so that a long log is never held as dicts."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield 0, None, f"$: not UTF-8 ({exc})"
        return
    if data and not data.endswith(b"\n"):
        yield 0, None, "$: the last line has no line end (a torn append, or an edit by hand)"
    if data.startswith(codecs.BOM_UTF8):  # said plainly: its header looks right on screen
        yield (
            1,
            None,
            (
                "line 1: starts with a UTF-8 byte-order mark, which no log the pipeline writes has "
                "(a spreadsheet's 'CSV UTF-8' export adds it): save it as plain UTF-8"
            ),
        )
        return
    # bytes.splitlines ends lines where csv's universal newlines do: \n, \r\n and \r
    lines = (line.decode("utf-8") for line in data.splitlines(keepends=True))
    reader = csv.reader(lines, strict=True)
    try:
        first = next(reader, None)
        if first is None or tuple(first) != header:
            yield 1, None, f"line 1: not the header of {KIT_GRID.name} ({HEADERS_NAMED})"
            return
        for cells in reader:
            if len(cells) != len(header):
                yield (
                    reader.line_num,
                    None,
                    (f"line {reader.line_num}: {len(cells)} cells, expected {len(header)}"),
                )
            else:
                yield reader.line_num, dict(zip(header, cells, strict=True)), ""
    except csv.Error as exc:
        yield reader.line_num, None, f"line {reader.line_num}: not CSV ({exc})"


def parse_log(data: bytes, header: tuple[str, ...]) -> tuple[list[tuple[int, dict]], list[str]]:
    """(line, row) for each row, and the errors of the file's shape (log_records)."""
    rows, errors = [], []
    for line, row, error in log_records(data, header):
        if row is None:
            errors.append(error)
        else:
            rows.append((line, row))
    return rows, errors


def check_log(
    data: bytes, registry: Registry, protocol: Protocol, keep_rows: bool = False
) -> tuple[list[tuple[int, dict]], list[str]]:
    """Every row checked, no run and no measurement recorded twice; the rows are returned
    only with keep_rows (merge.py needs them, validate.py does not)."""
    screen = row_screen(registry)
    rows, errors = [], []
    run_lines: dict[str, int] = {}
    measurement_lines: dict[str, int] = {}
    for line, row, error in log_records(data, log_header(data)):
        if row is None:
            errors.append(error)
            continue
        errors += [f"line {line}: {e}" for e in row_errors(row, registry, protocol, screen)]
        first = run_lines.setdefault(row["run_id"], line)
        if first != line:
            errors.append(_repeated("run_id", line, row["run_id"], first))
        elif (first := measurement_lines.setdefault(row["measurement_sha256"], line)) != line:
            errors.append(_repeated("measurement_sha256", line, "", first))
        if keep_rows:
            rows.append((line, row))
    return rows, errors


def log_errors(data: bytes, registry: Registry, protocol: Protocol) -> list[str]:
    return check_log(data, registry, protocol)[1]


# A plain log is printable ASCII without a quote, and line ends: each line is then one row
# split at its commas (csv.writer quotes no cell of such a row). Deleting PLAIN_TEXT from it
# leaves its separators alone, and whatever is not plain.
PLAIN = bytes(range(0x20, 0x7F)).replace(b'"', b"") + b"\n"
PLAIN_TEXT = PLAIN.replace(b",", b"").replace(b"\n", b"")


def append_refusal(data: bytes, row: dict, registry: Registry, protocol: Protocol) -> str:
    """Why `row` may not be appended to the log `data`, or "" if it may.

    Each row in a log was checked when it was appended. What a later hand or a torn write can
    break is checked in the whole log at the speed of bytes, without reading it into rows:
    its header, its last line end, each line's cells, each run id once, the last row's
    contents as validate checks a row, and that neither `row`'s run id nor its measurement is
    there already. A log that is not plain (a quoted cell, a control character, a byte
    outside printable ASCII) is checked row by row, as validate.py checks it."""
    header = log_header(data)
    kind = workload_kinds.of_name(row.get("workload"))
    if data and len(header) < len(header_of(kind)):  # a log without the kind's columns
        return kind.misplaced
    if data and not data.endswith(b"\n"):
        return "$: the last line has no line end (a torn append, or an edit by hand)"
    separators = data.translate(None, PLAIN_TEXT)  # one pass over the log: its commas
    shape = b"," * (len(header) - 1) + b"\n"
    lines = len(separators) // len(shape)
    plain = separators == shape * lines or not data.translate(None, PLAIN)
    if not plain:
        return _refusal_row_by_row(data, row, registry, protocol)
    if data[: data.find(b"\n")].decode("ascii").split(",") != list(header):
        return f"line 1: not the header of {KIT_GRID.name} ({HEADERS_NAMED})"
    if separators != shape * lines:
        records = data.split(b"\n")
        i = next(i for i, r in enumerate(records) if r.count(b",") != len(header) - 1)
        cells = records[i].count(b",") + 1 if records[i] else 0  # csv reads "" as no cell
        return f"line {i + 1}: {cells} cells, expected {len(header)}"
    lines -= 1  # the header
    run_ids = re.findall(rb"\n([^,]*)", data)[:-1]  # the first cell of each line
    if len(set(run_ids)) != len(run_ids):
        return _first_repeat("run_id", [run_id.decode() for run_id in run_ids])
    if lines:
        last = data[data.rindex(b"\n", 0, len(data) - 1) + 1 : -1].decode().split(",")
        errors = row_errors(dict(zip(header, last, strict=True)), registry, protocol)
        if errors:
            return f"line {lines + 1}: {errors[0]}"
    at = data.find(b"\n" + row["run_id"].encode() + b",")
    if at >= 0:
        line = data.count(b"\n", 0, at + 1) + 1
        return (
            f"$.run_id: {row['run_id']} is already recorded, at line {line}: a run is recorded once"
        )
    column = header.index("measurement_sha256")
    cell = b"," + row["measurement_sha256"].encode() + b","
    at = data.find(cell)
    while at >= 0:  # the same 64 hex digits could be another column's: count the commas
        start = data.rfind(b"\n", 0, at) + 1
        if data.count(b",", start, at + 1) == column:
            line = data.count(b"\n", 0, at) + 1
            run_id = data[start : data.index(b",", start)].decode()
            return _measurement_again(line, run_id)
        at = data.find(cell, at + 1)
    return ""


def _refusal_row_by_row(data: bytes, row: dict, registry: Registry, protocol: Protocol) -> str:
    """append_refusal for a log that is not plain: every row read and checked."""
    errors = log_errors(data, registry, protocol)
    if errors:
        return errors[0]
    for line, old, _ in log_records(data, log_header(data)):
        if old["run_id"] == row["run_id"]:
            return (
                f"$.run_id: {row['run_id']} is already recorded, at line {line}: "
                "a run is recorded once"
            )
        if old["measurement_sha256"] == row["measurement_sha256"]:
            return _measurement_again(line, old["run_id"])
    return ""


def _measurement_again(line: int, run_id: str) -> str:
    return (
        f"$.measurement_sha256: this measurement is already recorded, at line {line} "
        f"(run {run_id}): a measurement is recorded once"
    )


def _first_repeat(name: str, values: list[str]) -> str:
    """check_log's error for the first value of a column seen twice (line = index + 2)."""
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        if value in seen:
            return _repeated(name, i + 2, value, seen[value] + 2)
        seen[value] = i
    raise AssertionError("no value repeats")


def _repeated(name: str, line: int, value: str, first: int) -> str:
    if name == "run_id":
        return f"line {line}: $.run_id: {value} is already at line {first}"
    return (
        f"line {line}: $.measurement_sha256: the measurement of line {first} again "
        "(a measurement is recorded once, under one run id)"
    )


def read_shared(path: Path) -> bytes:
    """A log's bytes under a shared lock, so that no append is half-seen."""
    with path.open("rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        return handle.read()


# ---------------------------------------------------------------- the tree and the command line


MODEL_CONFIG = "a model's config.json, the input of the workloads traced: no schema"


def model_config(path: Path) -> bool:
    """configs/<name>.json in a runs/<stamp>-<gpu>-probe.../ or <stamp>-hf-zoo.../ folder, or
    in a zoo grid's folder (one holding the grid's points.txt): a Hugging Face config, the
    input of the probes or of a grid's points."""
    folder = path.parent.parent
    return (
        path.suffix == ".json"
        and path.parent.name == "configs"
        and (
            any(mark in folder.name for mark in ("-probe", "-hf-zoo"))
            or (folder / "points.txt").is_file()
        )
    )


# The hidden folder a sweep's point measures into (.<run id>.partial), renamed to its run id
# once whole: one found is a point still measuring, or what an interrupted sweep left.
UNFINISHED = re.compile(rf"\.{run_folders.RUN_ID.pattern}\.partial")
UNFINISHED_RUN = (
    "a sweep point's folder never made whole: a sweep still measuring it, or one interrupted "
    "(killed, its machine lost) whose point is no run; not read"
)


def walk(folder: Path) -> Iterator[tuple[Path, str, str]]:
    """(path, ARTEFACT | LOG | SKIPPED, why skipped) for each file below `folder`, by name.
    A folder named like a file (measurement.json/) is that file, found invalid; a symbolic
    link is never followed, so a walk ends and stays inside the tree; a sweep point's
    unfinished folder is named, once, and not read."""
    with os.scandir(folder) as entries:
        ordered = sorted(entries, key=lambda entry: entry.name)
    for entry in ordered:
        path = Path(entry.path)
        if entry.is_symlink():
            yield path, SKIPPED, "a symbolic link, not followed"
        elif entry.is_dir() and UNFINISHED.fullmatch(entry.name):
            yield path, SKIPPED, UNFINISHED_RUN
        elif entry.is_dir() and path.suffix not in (".json", ".csv"):
            yield from walk(path)
        elif not (entry.is_dir() or entry.is_file()):
            yield path, SKIPPED, "not a regular file"
        elif model_config(path):
            yield path, SKIPPED, MODEL_CONFIG
        elif path.suffix in (".json", ".csv"):
            yield path, LOG if path.suffix == ".csv" else ARTEFACT, ""
        else:
            kind = f"*{path.suffix} files" if path.suffix else "files without a suffix"
            yield path, SKIPPED, SKIPPED_SUFFIXES.get(path.suffix, f"no schema for {kind}")


def expand(text: str) -> list[tuple[Path, str, str]]:
    """What a command-line path stands for: a folder, the files of its walk; a file, itself
    (a log if it ends in .csv). A path that is not there, or a folder with nothing to
    validate, is unusable input."""
    path = Path(text)
    if not os.path.lexists(path):
        raise cli.UsageError(f"{path}: no such file or folder")
    if path.is_dir() and path.suffix not in (".json", ".csv"):
        found = list(walk(path))
        if all(kind == SKIPPED for _, kind, _ in found):
            raise cli.UsageError(
                f"{path}: nothing to validate inside (no *.json artefact, no *.csv results log)"
            )
        return found
    if not (path.is_dir() or path.is_file()):
        raise cli.UsageError(f"{path}: not a file or a folder")
    return [(path, LOG if path.suffix == ".csv" else ARTEFACT, "")]


def file_errors(path: Path, kind: str, registry: Registry, protocol: Protocol | None):
    if kind == ARTEFACT:
        errors = read_artefact(path, registry).errors
        return errors or (beside_facts(path) if path.name == "environment.json" else [])
    if path.is_dir():
        return ["$: a folder, not a file"]
    return log_errors(read_shared(path), registry, protocol)


def validate_paths(texts: list[str]) -> int:
    """Each file's verdict, then the counts: valid and skipped on stdout, errors on stderr."""
    files = [found for text in texts for found in expand(text)]
    logs = any(kind == LOG for _, kind, _ in files)
    protocol = Protocol() if logs else None  # quality columns are judged against it
    registry = load_registry()
    counts = {"valid": 0, "invalid": 0, "skipped": 0}
    for path, kind, reason in files:
        if kind == SKIPPED:
            print(f"{path}: skipped ({reason})")
            counts["skipped"] += 1
            continue
        errors = file_errors(path, kind, registry, protocol)
        for error in errors:
            print(f"{path}: {error}", file=sys.stderr)
        if not errors:
            print(f"{path}: valid")
        counts["invalid" if errors else "valid"] += 1
    print(", ".join(f"{n} {what}" for what, n in counts.items()))
    return cli.INVALID if counts["invalid"] else cli.OK


def main(argv: list[str] | None = None) -> int:
    description = " ".join(__doc__.split("\n\n")[0].split())
    parser = cli.Parser(prog="validate.py", description=description)
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="artefacts (.json), results logs (.csv), folders to walk (runs/, a run folder...)",
    )
    return cli.run("validate.py", lambda: validate_paths(parser.parse_args(argv).paths))


if __name__ == "__main__":
    raise SystemExit(main())
