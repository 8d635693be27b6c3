"""The facts of an own-model measurement that validate.py checks, below both: the summary and
the comparison with the prediction that own_model.py writes and validate.py recomputes, and
what a schema cannot state. own_model.py re-exports every name; validate.py imports this
module for own-model files only.
"""

from __future__ import annotations

import itertools
import statistics

from pipeline.core import allocator_model, phase_protocol
from pipeline.core.prediction_status import PEAK_KEYS, PredictionStatus
from pipeline.core.run_status import RunStatus

SCHEMA = "urn:iteragpu-lab:schema:own-model-measurement:v1"


def compare(document: dict) -> None:
    """Each measured row gets its predicted counters; the summary the largest differences."""
    predicted = document["prediction"]["phases"]
    phases = document["phases"]
    for row, expected in itertools.zip_longest(phases, predicted[: len(phases)]):
        row["predicted"] = (
            {k: expected[k] for k in phase_protocol.COUNTER_KEYS} if expected else None
        )
    summary = document["summary"]["prediction"]
    if document["prediction"]["status"] == PredictionStatus.NOT_PREDICTED or not phases:
        summary.update(by_counter=None, held=None, bounds_held=None)
        summary["largest_abs_difference_allocated_bytes"] = None
        summary["largest_abs_difference_reserved_bytes"] = None
        return
    by_counter = {
        key: max(abs(row[key] - row["predicted"][key]) for row in phases)
        for key in phase_protocol.COUNTER_KEYS
    }
    summary["by_counter"] = by_counter
    summary["largest_abs_difference_allocated_bytes"] = max(
        v for k, v in by_counter.items() if "allocated" in k
    )
    summary["largest_abs_difference_reserved_bytes"] = max(
        v for k, v in by_counter.items() if "reserved" in k
    )
    found = verdict(document, by_counter)
    summary["held"], summary["bounds_held"] = found["held"], found["bounds_held"]


def bounds_held(document: dict) -> bool | None:
    """Every measured row's peaks inside its predicted bounds; None without bounds."""
    bounds = document["prediction"].get("bounds")
    if bounds is None:
        return None
    return all(
        found[key]["lower"] <= row[key] <= found[key]["upper"]
        for row, found in zip(document["phases"], bounds["phases"], strict=False)
        for key in PEAK_KEYS
    )


def verdict(document: dict, by_counter: dict) -> dict:
    """A measurement's verdict on the prediction beside its rows, from the largest difference
    per counter: the claim, whether an exact one is equal on every counter of every row,
    whether the measured peaks lie inside an approximate one's bounds (None where it does not
    apply)."""
    exact = document["prediction"]["status"] == PredictionStatus.EXACT
    return {
        "status": document["prediction"]["status"],
        "held": not any(by_counter.values()) if exact else None,
        "bounds_held": bounds_held(document),
    }


def summarise(document: dict) -> dict:
    phases = document["phases"]
    warm = [row for row in phases if row["phase"] == "warm_step"]
    summary = {
        **phase_protocol.peaks_summary(phases),
        "warm_step_median_event_time_ns": (
            statistics.median(r["event_time_ns"] for r in warm) if warm else None
        ),
        "warm_step_median_wall_time_ns": (
            statistics.median(r["wall_time_ns"] for r in warm) if warm else None
        ),
    }
    applicable, because = allocator_model.prediction_applicability(document["environment"])
    summary["prediction"] = {"status": document["prediction"]["status"], "applicable": applicable}
    if not applicable:
        summary["prediction"]["not_applicable_because"] = because
    return summary


# ---------------------------------------------------------------- facts a schema cannot state


def document_facts(document: dict) -> list[str]:
    """For validate.py: the rows follow the plan, their counters are consistent, and the
    summary and the predictions beside them say what the rows say. Each error has its path."""
    if document["status"] == RunStatus.PREDICTED:
        return prediction_peak_facts(document["prediction"])
    errors = []
    rows, record = document["phases"], document["workload"]
    names = [row["phase"] for row in rows]
    planned = record["phases_planned"] or []
    if record["phases_run"] != names:
        errors.append("$.workload.phases_run: not the phases of the rows")
    if names != planned[: len(names)]:
        errors.append(f"$.phases: {names} do not follow the plan {planned}")
    status = document["status"]
    if status == RunStatus.COMPLETED and names != planned:
        errors.append(f"$.phases: {len(names)} rows, the plan has {len(planned)}")
    if status != RunStatus.COMPLETED:
        failure = document["failure"]
        expected = (
            "import" if failure["phase"] == "import" else planned[len(names) : len(names) + 1]
        )
        if failure["phase"] == "import" and names:
            errors.append("$.failure.phase: import, but phases ran")
        elif failure["phase"] != "import" and [failure["phase"]] != expected and planned:
            errors.append(f"$.failure.phase: {failure['phase']!r}, the next planned is {expected}")
    errors += repetition_facts(rows, "warm_step", document["configuration"]["warmup"])
    for i, row in enumerate(rows):
        errors += counter_facts(f"$.phases[{i}]", row)
    if status == RunStatus.FAILED:
        return errors
    errors += prediction_peak_facts(document["prediction"])
    predicted = document["prediction"]["phases"]
    for i, row in enumerate(rows):
        if row["harness_overhead_ns"] != row["wall_time_ns"] - row["event_time_ns"]:
            errors.append(f"$.phases[{i}].harness_overhead_ns: not wall_time_ns - event_time_ns")
        expected = None
        if i < len(predicted):
            expected = {key: predicted[i][key] for key in phase_protocol.COUNTER_KEYS}
        if row["predicted"] != expected:
            errors.append(f"$.phases[{i}].predicted: not $.prediction.phases[{i}]")
    summary = document["summary"]
    expected_summary = summarise(document)
    keys = ("phases_completed", "largest_peak_allocated_bytes", "largest_peak_reserved_bytes")
    errors += mismatches("$.summary", summary, {key: expected_summary[key] for key in keys})
    copy = {"phases": [dict(row) for row in rows], "prediction": document["prediction"]}
    copy["summary"] = {"prediction": {}}
    compare(copy)
    # bounds_held: absent in older files, whose rows give None for it
    return errors + mismatches(
        "$.summary.prediction", summary["prediction"], copy["summary"]["prediction"]
    )


def mismatches(where: str, found: dict, expected: dict, source: str = "the rows give") -> list[str]:
    """`WHERE.KEY: FOUND, SOURCE EXPECTED` for each key whose recorded value is not what the
    file's own rows (or run, or points) give: the one wording of every derived-value fact."""
    return [
        f"{where}.{key}: {found.get(key)!r}, {source} {value!r}"
        for key, value in expected.items()
        if found.get(key) != value
    ]


def repetition_facts(rows: list[dict], repeated: str, warmup: int) -> list[str]:
    """Only the repeated phase's rows carry a repetition, numbered 1, 2, ...; the warm-up row
    holds all the warm-up passes, every other row one pass."""
    errors = []
    numbers = [row.get("repetition") for row in rows if row["phase"] == repeated]
    if numbers != list(range(1, len(numbers) + 1)):
        errors.append(f"$.phases: {repeated} repetitions {numbers} are not 1, 2, ...")
    for i, row in enumerate(rows):
        if row["phase"] != repeated and "repetition" in row:
            errors.append(f"$.phases[{i}]: only {repeated} rows carry a repetition")
        want = warmup if row["phase"] == "warmup" else 1
        if row["passes"] != want:
            errors.append(f"$.phases[{i}].passes: {row['passes']}, expected {want}")
    return errors


def counter_facts(where: str, row: dict) -> list[str]:
    """Allocated is part of reserved; a peak is at least the counter at the phase's start and
    at its end: of every row any workload measures or predicts."""
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


def prediction_peak_facts(prediction: dict) -> list[str]:
    errors = []
    for i, row in enumerate(prediction["phases"]):
        errors += counter_facts(f"$.prediction.phases[{i}]", row)
    for kind in ("allocated", "reserved"):
        largest = max((r[f"peak_{kind}_bytes"] for r in prediction["phases"]), default=None)
        if prediction[f"largest_peak_{kind}_bytes"] != largest:
            errors.append(f"$.prediction.largest_peak_{kind}_bytes: not the phases' largest")
    return errors + bounds_facts(prediction)


def bounds_facts(prediction: dict) -> list[str]:
    """Bounds, one per predicted row, of that row, around its predicted peaks."""
    if "bounds" not in prediction:
        return []
    found, rows = prediction["bounds"]["phases"], prediction["phases"]
    if len(found) != len(rows):
        return [f"$.prediction.bounds.phases: {len(found)} rows, the prediction has {len(rows)}"]
    errors = []
    for i, (bound, row) in enumerate(zip(found, rows, strict=True)):
        where = f"$.prediction.bounds.phases[{i}]"
        if (bound["phase"], bound.get("repetition")) != (row["phase"], row.get("repetition")):
            errors.append(f"{where}: not the row of $.prediction.phases[{i}]")
        for key in PEAK_KEYS:
            if not bound[key]["lower"] <= row[key] <= bound[key]["upper"]:
                errors.append(f"{where}.{key}: the prediction {row[key]} is outside its bounds")
    return errors
