"""Which catalogue GPU holds a measured or predicted peak on one GPU, and what it costs.

    python3 -m pipeline.stages.fit runs/<run-id>/ --days 7 [--accepted-results 40] [--json]
    python3 -m pipeline.stages.fit runs/<id>-sweep/ --days 30      # its largest completed point
                                                # (the seed network's or a decoder's)
    python3 -m pipeline.stages.fit prediction.json --days 3        # from estimate --phases --json
    python3 -m pipeline.stages.fit decoder-prediction.json --days 7  # decoder.py estimate --json
    python3 -m pipeline.stages.fit own-prediction.json --days 7  # own_model.py estimate --json

One GPU holds a peak when the peak reserved by PyTorch's allocator plus the CUDA context fits
in the total memory PyTorch reports for that GPU. Where runs in the runs directory (or the
source itself) were measured on a model, its figures are measured; for any other model they
are calcul_forfaits' cautious reading of the vendor figure, and the output says which. Several
GPUs sharing one peak is not modelled. Prices are calcul_forfaits' (whole lots, integer
cents). Writes nothing. Exit 0 answered (also when nothing fits), 2 bad input, 1 the reader
closed the pipe early.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pipeline import calcul_forfaits
from pipeline.artefacts import validate
from pipeline.core import cli, run_folders, workload_kinds
from pipeline.core.prediction_status import PredictionStatus
from pipeline.core.run_status import RunStatus
from pipeline.core.workload_kinds import Kind

GIB = 2**30
# The names PyTorch gives catalogue models where they differ from the catalogue's own name,
# as seen in the runs committed here: add a model's name when it is first measured.
DEVICE_NAMES = {"NVIDIA H200": "h200"}
RUN_FILES = ("environment.json", "measurement.json")


class Record(NamedTuple):
    """What PyTorch said of one GPU in one run: its name, total and free memory at start."""

    gpu: str
    total: int
    free: int
    run: str  # the run folder (or file) it was read from


class Basis(str, enum.Enum):
    """Where a figure comes from: a run on a GPU, a prediction, a vendor's datasheet. An
    enum of str: `fit --json` writes its words."""

    MEASURED = "measured"
    PREDICTION = "prediction"
    VENDOR = "vendor figure"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Need:
    """The peak reserved a configuration needs, and where that figure comes from."""

    peak_reserved_bytes: int
    basis: Basis  # MEASURED or PREDICTION
    source: str  # the folder or file name, never a full path
    what: str  # the configuration, in words
    gpu_name: str | None  # the GPU it was measured on
    notes: tuple[str, ...] = ()
    record: tuple[Path, Record] | None = None  # the memory PyTorch reported there
    approximate: str | None = None  # what a prediction leaves out, when it is not exact
    point_bytes: int | None = None  # an approximate prediction's own figure, sized by its bound


@dataclass(frozen=True)
class Memory:
    """What PyTorch sees on one GPU of a model, and what the CUDA context keeps of it."""

    total_bytes: int
    context_bytes: int
    basis: Basis  # MEASURED or VENDOR
    detail: str
    runs: tuple[Record, ...] = ()  # the records a measured figure comes from
    total_from: str | None = None  # the run that gave the total
    context_from: str | None = None  # the run that gave the smallest context

    @property
    def usable_bytes(self) -> int:
        return self.total_bytes - self.context_bytes


MEASUREMENTS = workload_kinds.MEASUREMENT_SCHEMAS


def read_checked(path: Path, kinds: tuple[str, ...], what: str, **where) -> dict:
    """A file fit reads, checked as validate.py checks it: one line (exit 2) if not."""
    return validate.checked(path, kinds, what, **where).document


PREDICTIONS = ", ".join(kind.estimate for kind in workload_kinds.KINDS)


def configuration_text(configuration: dict) -> str:
    if "shape" in configuration:  # a decoder's: its model, then what it generates
        shape = configuration["shape"]
        model = configuration["preset"] or (
            f"decoder of {shape['layers']} layers, width {shape['width']}, {shape['heads']}/"
            f"{shape['kv_heads']} heads, vocab {shape['vocab']}"
        )
        keys = ("batch", "prompt", "new_tokens", "dtype")  # a sweep's point: less the varied one
        return f"{model}, " + ", ".join(
            f"{k} {configuration[k]}" for k in keys if k in configuration
        )
    if "function" in configuration:  # a workload file's sweep point: its dimensions by name
        keys = ("batch", *configuration["dimensions"], "dtype")
        return f"{configuration['file']}:{configuration['function']}, " + ", ".join(
            f"{k} {configuration[k]}" for k in keys if k in configuration
        )
    keys = ("batch", "context", "width", "dtype")
    return ", ".join(f"{k} {configuration[k]}" for k in keys if k in configuration)


def need_of(source: Path) -> Need:
    """The peak a run folder, a sweep folder or a prediction file stands for, from files that
    validate as validate.py validates them: a file it rejects is refused, never answered."""
    if not source.exists():
        raise cli.UsageError(f"{source} does not exist")
    if (source / "sweep.json").is_file():
        return sweep_need(source)
    if (source / "measurement.json").is_file():
        if (source / "environment.json").is_file():
            read_checked(source / "environment.json", (validate.ENVIRONMENT,), "an environment")
        return measured_need(source / "measurement.json", source.name)
    if source.is_file():
        document = read_checked(
            source,
            (*MEASUREMENTS, validate.PHASE_PREDICTION),
            f"a measurement or a prediction ({PREDICTIONS})",
            schema=validate.PHASE_PREDICTION,
        )
        if "schema" in document:
            return measured_need(source, source.name, document)
        return predicted_need(document, source.name)
    raise cli.UsageError(f"{source}: neither a run folder, a sweep folder nor a prediction file")


def decoder_prediction_need(document: dict, name: str) -> Need:
    """`decoder.py estimate --json`: the traced counters (traced_prediction_need); a file
    written before the decoder was traced (its standard-library replay, `exact` and
    `not_predicted`) is read as it says."""
    prediction = document["prediction"]
    if "status" in prediction:
        return traced_prediction_need(document, name, configuration_text(document["configuration"]))
    calibration = prediction["calibration"]
    notes = [
        f"calibration {calibration['file']} ({calibration['gpu']}, torch {calibration['torch']})"
        if calibration
        else "no calibration: the kernels' own blocks (cuBLAS workspaces, attention buffers) "
        "are left out"
    ]
    notes += [f"not predicted: {gap['what']}: {gap['why']}" for gap in prediction["not_predicted"]]
    gaps = ", ".join(gap["what"] for gap in prediction["not_predicted"])
    peak = document["summary"]["largest_peak_reserved_bytes"]
    left_out = None if prediction["exact"] else f"it leaves out {gaps}"
    what = configuration_text(document["configuration"])
    return prediction_need(name, what, peak, notes, left_out)


def prediction_need(
    name: str,
    what: str,
    peak: int,
    notes: list[str],
    approximate: str | None = None,
    point: int | None = None,
) -> Need:
    """A prediction's need: `approximate` says why it is not exact, `point` is the predicted
    peak where the need is sized by a bound instead."""
    return Need(
        peak_reserved_bytes=peak,
        basis=Basis.PREDICTION,
        source=name,
        what=what,
        gpu_name=None,
        notes=tuple(notes),
        approximate=approximate,
        point_bytes=point,
    )


def own_model_text(document: dict) -> str:
    """An own-model configuration: the file and function (never a path), what it runs, its
    dimensions, then the batch and dtype."""
    workload, configuration = document["workload"], document["configuration"]
    dims = ", ".join(f"{k} {v}" for k, v in configuration["dims"].items())
    mode = f"{workload['kind']}{'; ' + dims if dims else ''}"
    return (
        f"{workload['file']}:{workload['function']} ({mode}), batch {configuration['batch']}, "
        f"dtype {configuration['dtype']}"
    )


def own_model_prediction_note(document: dict) -> str:
    """What the traced prediction beside an own-model measurement is worth."""
    prediction = document["summary"]["prediction"]
    if prediction["status"] == PredictionStatus.NOT_PREDICTED:
        return "its traced prediction: not predicted (the trace could not follow the code)"
    unknown = ", ".join(entry["op"] for entry in document["prediction"]["unknown"])
    return (
        f"its traced prediction: {prediction['status']}"
        + (f" ({unknown})" if unknown else "")
        + f", off by {prediction['largest_abs_difference_reserved_bytes']:,} bytes at most on"
        f" the reserved counters, {prediction['largest_abs_difference_allocated_bytes']:,} on"
        " the allocated ones"
    )


def own_model_prediction_need(document: dict, name: str) -> Need:
    """`own_model.py estimate --json`."""
    return traced_prediction_need(document, name, own_model_text(document))


def traced_prediction_need(document: dict, name: str, what: str) -> Need:
    """A traced prediction (every workload's `estimate --json`): its counters; an approximate
    one is sized by its upper bound and says so, one the trace could not follow gives no
    figure."""
    prediction = document["prediction"]
    if prediction["status"] == PredictionStatus.NOT_PREDICTED:
        why = prediction.get("reason", "the trace could not follow the code")
        raise cli.UsageError(f"{name}: not predicted ({why}): no figure to fit; measure it instead")
    notes, approximate, point = [], None, None
    peak = prediction["largest_peak_reserved_bytes"]
    calibration = prediction.get("calibration")
    if calibration:
        notes.append(
            f"predicted for the GPU of its calibration, {calibration}; on every other model "
            "the same peak is assumed, derived, not measured: the attention kernel PyTorch "
            "picks there, its libraries' workspaces and (on AMD GPUs) the whole software "
            "stack may differ"
        )
    else:
        notes.append(
            "predicted without a GPU calibration: the blocks each GPU's kernels allocate "
            "besides their outputs are not in it, on any model"
        )
    if prediction["status"] == PredictionStatus.APPROXIMATE:
        unknown = "; ".join(f"{entry['op']}: {entry['why']}" for entry in prediction["unknown"])
        notes.append(f"approximate, what the prediction does not know: {unknown}")
        ops = ", ".join(entry["op"] for entry in prediction["unknown"])
        approximate = f"the trace does not know {ops}"
        if "bounds" in prediction:  # sized by the most it can take, never the middle
            rows = prediction["bounds"]["phases"]
            upper = max(row["peak_reserved_bytes"]["upper"] for row in rows)
            lower = max(row["peak_reserved_bytes"]["lower"] for row in rows)
            approximate += (
                f"; sized by its upper bound, {upper:,} B (predicted {peak:,} B, at least "
                f"{lower:,} B)"
            )
            point, peak = peak, upper
        elif "unbounded" in prediction:
            approximate += f"; {prediction['unbounded']}"
    return prediction_need(name, what, peak, notes, approximate, point)


@dataclass(frozen=True)
class Reading:
    """How fit reads one kind's measurement.json (the kind's code; which schema is whose is
    workload_kinds' data): what it names, what it notes, and, for a kind whose `estimate
    --json` writes a measurement with status "predicted", the need it stands for."""

    what: Callable[[dict], str]
    notes: Callable[[dict], tuple[str, ...]] = lambda document: ()
    prediction: Callable[[dict, str], Need] | None = None


READINGS = {
    Kind.NETWORK: Reading(what=lambda document: configuration_text(document["configuration"])),
    Kind.DECODER: Reading(
        what=lambda document: configuration_text(document["configuration"]),
        prediction=decoder_prediction_need,
    ),
    Kind.OWN: Reading(
        what=own_model_text,
        notes=lambda document: (own_model_prediction_note(document),),
        prediction=own_model_prediction_need,
    ),
}


def measured_need(path: Path, name: str, document: dict | None = None) -> Need:
    if document is None:
        document = read_checked(path, MEASUREMENTS, "a measurement")
    reading = READINGS[workload_kinds.of_schema(document["schema"]).kind]
    if reading.prediction is not None and document.get("status") == RunStatus.PREDICTED:
        return reading.prediction(document, name)
    if document["status"] == RunStatus.FAILED:
        raise cli.UsageError(
            f"{path}: the workload's own code raised {document['failure']['exception_type']}: "
            "a failed run is not a measurement"
        )
    if document["status"] != RunStatus.COMPLETED:
        raise cli.UsageError(
            f"{path}: the run ended {document['status']}: its peak is what the GPU held when it "
            f"stopped, not what the configuration needs; fit a prediction instead ({PREDICTIONS})"
        )
    return Need(
        peak_reserved_bytes=document["summary"]["largest_peak_reserved_bytes"],
        basis=Basis.MEASURED,
        source=name,
        what=reading.what(document),
        gpu_name=document["environment"]["gpu"].get("name"),
        notes=reading.notes(document),
        record=(evidence_key(path), gpu_record(document["environment"], name)),
    )


def sweep_need(folder: Path) -> Need:
    """The sweep's largest completed point: the largest configuration known to fit. Its run
    folder, where it lies beside the sweep's, must say the same peak."""
    sweep = read_checked(folder / "sweep.json", (validate.SWEEP,), "a sweep summary")
    point = sweep["largest_fitted"]
    if point is None:
        raise cli.UsageError(f"{folder}: no point of this sweep completed")
    vary = sweep["plan"]["vary"]
    point_file = folder.parent / point["run"] / "measurement.json"
    gpu_name = record = None
    if os.path.lexists(point_file):  # the point's run folder, beside the sweep's
        document = read_checked(point_file, MEASUREMENTS, "a measurement", inside=folder.parent)
        peak = document["summary"]["largest_peak_reserved_bytes"]
        if peak != point["peak_reserved_bytes"]:
            raise cli.UsageError(
                f"{folder}/sweep.json: its largest point's peak reserved "
                f"{point['peak_reserved_bytes']:,} bytes is not its run's, {peak:,} ({point_file})"
            )
        gpu_name = document["environment"]["gpu"].get("name")
        record = (evidence_key(point_file), gpu_record(document["environment"], point["run"]))
    notes = [f"the sweep stopped because {sweep['stopped_because']}"]
    return Need(
        peak_reserved_bytes=point["peak_reserved_bytes"],
        basis=Basis.MEASURED,
        source=folder.name,
        what=f"its largest completed point, {vary} {point['configuration'][vary]} ("
        + configuration_text({k: v for k, v in point["configuration"].items() if k != vary})
        + ")",
        gpu_name=gpu_name,
        notes=tuple(notes),
        record=record,
    )


def predicted_need(document: dict, name: str) -> Need:
    """`mesure_memoire.py estimate --phases --json`: the allocator model's counters."""
    peak = max(row["peak_reserved_bytes"] for row in document["phases"])
    notes = []
    if not document["library_blocks"]:
        notes.append(
            "the prediction has no --library-block: the cuBLAS workspaces are left out "
            "(33 MiB + 1 MiB on the H200)"
        )
    left_out = None if document["library_blocks"] else "it leaves out the cuBLAS workspaces"
    what = configuration_text(document["configuration"])
    return prediction_need(name, what, peak, notes, left_out)


def gpu_record(environment: dict, run: str) -> Record | None:
    """What PyTorch reported of the GPU an environment names, or None where it saw no GPU."""
    gpu = environment["gpu"]
    if not gpu.get("available"):
        return None
    return Record(gpu["name"], gpu["total_memory_bytes"], gpu["free_memory_bytes_at_start"], run)


def evidence_key(path: Path) -> Path:
    """A run folder's environment.json and measurement.json are one record of its GPU."""
    return path.resolve().parent if path.name in RUN_FILES else path.resolve()


@dataclass
class Evidence:
    """The GPU records fit may use, by file, and the run folders it did not trust, each with
    the one line validate.py's rules give against it."""

    records: dict[Path, Record] = field(default_factory=dict)
    untrusted: list[str] = field(default_factory=list)


def gpu_records(runs_dir: Path) -> Evidence:
    """What PyTorch reported of its GPU in every run folder of the runs directory: from its
    environment.json, else its measurement.json, once the environment there validates (its
    schema and its facts). A folder whose environment does not, or which a symbolic link places
    outside the runs directory, is left out and named: one impossible figure (free memory over
    the total, say) would change every answer for its GPU."""
    found = Evidence()
    for folder in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else ():
        if not run_folders.RUN_ID.fullmatch(folder.name):
            continue
        for name in RUN_FILES:
            path = folder / name
            if not os.path.lexists(path):
                continue
            try:
                environment = validate.checked_environment(path, runs_dir)
                if disagreement := validate.beside_facts(path):
                    raise cli.UsageError(f"{path}: {disagreement[0]}")
            except cli.UsageError as exc:
                found.untrusted.append(str(exc))
                break
            record = gpu_record(environment, folder.name)
            if record is not None:
                found.records[evidence_key(path)] = record
            break
    return found


def measured_memory(name: str, records: list[Record]) -> Memory:
    """The smallest total and the smallest context seen: other processes only add to it."""
    total = min(records, key=lambda r: (r.total, r.run))
    at_start = min(records, key=lambda r: (r.total - r.free, r.run))
    context = at_start.total - at_start.free + calcul_forfaits.KERNELS_LOADED_LATER_BYTES
    return Memory(
        total_bytes=total.total,
        context_bytes=context,
        basis=Basis.MEASURED,
        detail=f"{name}, {len(records)} run(s): total {total.total:,} bytes "
        f"({gib(total.total)} GiB) as PyTorch reports it, less the CUDA context: "
        f"{at_start.total - at_start.free:,} bytes at the start (total minus free) + "
        f"{calcul_forfaits.KERNELS_LOADED_LATER_BYTES:,} bytes of kernels loaded later "
        "(measured on the H200)",
        runs=tuple(sorted(records, key=lambda r: r.run)),
        total_from=total.run,
        context_from=at_start.run,
    )


def memory_name(name: str | None) -> str | None:
    """The catalogue model of a GPU name PyTorch gives, where known."""
    return DEVICE_NAMES.get(name or "")


def catalogue_memory(catalogue: dict, records: list[Record]) -> dict[str, Memory]:
    """Memory per catalogue model: measured where runs name it, else the vendor figure."""
    names = {catalogue["tariffs"][gpu, 3]["name"]: gpu for gpu in catalogue["models"]}
    names.update(DEVICE_NAMES)
    measured: dict[str, list[Record]] = {}
    for record in records:
        if names.get(record.gpu) in catalogue["models"]:
            measured.setdefault(names[record.gpu], []).append(record)
    memory = {}
    for gpu in catalogue["models"]:
        if gpu in measured:
            memory[gpu] = measured_memory(measured[gpu][0].gpu, measured[gpu])
        else:
            row = catalogue["tariffs"][gpu, 3]
            memory[gpu] = Memory(
                total_bytes=int(row["memory_gib_per_gpu"]) * calcul_forfaits.VENDOR_BYTES_PER_GIB,
                context_bytes=calcul_forfaits.CONTEXT_ROOM_BYTES,
                basis=Basis.VENDOR,
                detail=calcul_forfaits.MEMORY_RULE,
            )
    return memory


def gib(nbytes: int) -> str:
    """GiB to 0.01, rounded down."""
    return calcul_forfaits.gib_floor_text(nbytes)


def gib_up(nbytes: int) -> str:
    """GiB to 0.01, rounded up: a need is never shown smaller than it is."""
    hundredths = -(-nbytes * 100 // GIB)
    return f"{hundredths // 100}.{hundredths % 100:02d}"


MARGIN_FLOOR_BYTES = GIB  # headroom under the larger of these two is marginal
MARGIN_SHARE = 20  # 1/20: 5% of the peak


def margin_bytes(peak: int) -> int:
    """The headroom under which a fit is marginal: the larger of 1 GiB and 5% of the peak.
    Below it, what fit cannot see decides: another GPU's library workspaces, fragmentation,
    another process, the caution of a vendor figure, an approximate prediction."""
    return max(MARGIN_FLOOR_BYTES, -(-peak // MARGIN_SHARE))


def fit(need: Need, catalogue: dict, memory: dict, days: int, accepted: int | None) -> dict:
    """Every catalogue model: does one GPU hold the need, and a one-lot package's price."""
    rows = []
    for gpu in catalogue["models"]:
        held = memory[gpu]
        quote = calcul_forfaits.quote(catalogue, gpu, days, lots=1, accepted=accepted)
        rows.append(
            {
                "gpu": gpu,
                "name": quote["name"],
                "fits": need.peak_reserved_bytes <= held.usable_bytes,
                "memory_basis": held.basis,
                "total_memory_bytes": held.total_bytes,
                "context_room_bytes": held.context_bytes,
                "usable_memory_bytes": held.usable_bytes,
                "headroom_bytes": held.usable_bytes - need.peak_reserved_bytes,
                "marginal": 0
                <= held.usable_bytes - need.peak_reserved_bytes
                < margin_bytes(need.peak_reserved_bytes),
                "gpus_per_lot": quote["gpus_per_lot"],
                "total_cents": quote["total_cents"],
                "unit_cost_cents": quote["unit_cost_cents"],
            }
        )
    # what fits, cheapest first; then what does not, closest first
    rows.sort(
        key=lambda r: (
            (0, r["total_cents"], r["gpu"]) if r["fits"] else (1, -r["headroom_bytes"], r["gpu"])
        )
    )
    bases = {held.basis: held.detail for held in sorted(memory.values(), key=lambda m: m.basis)}
    measured_on = memory_name(need.gpu_name) if need.basis == Basis.MEASURED else None
    return {
        "peak_reserved_bytes": need.peak_reserved_bytes,
        "peak_basis": need.basis,
        "approximate": need.approximate,
        "if_the_prediction_holds": point_answer(need.point_bytes, rows),
        "margin_bytes": margin_bytes(need.peak_reserved_bytes),
        # the one model on which the answer is a measurement; on every other, a prediction
        "peak_measured_on_model": measured_on,
        "source": need.source,
        "configuration": need.what,
        "measured_on": need.gpu_name,
        "notes": list(need.notes)
        + (
            [f"on models other than the {need.gpu_name}, its libraries' workspaces may differ"]
            if need.gpu_name
            else []
        ),
        "rule": "one GPU holds the peak when peak reserved + CUDA context <= the total memory "
        "PyTorch reports; several GPUs sharing one peak is not modelled",
        "memory_bases": bases,
        "measured_memory": {
            gpu: {
                "total_from": held.total_from,
                "context_from": held.context_from,
                "runs": [record._asdict() for record in held.runs],
            }
            for gpu, held in memory.items()
            if held.basis == Basis.MEASURED
        },
        "days": days,
        "accepted_results": accepted,
        **calcul_forfaits.tariff_source(catalogue),
        "rows": rows,
    }


def point_answer(point: int | None, rows: list[dict]) -> dict | None:
    """Where a prediction is sized by its upper bound: the cheapest model that would hold the
    prediction's own figure, shown beside the answer, never as it."""
    if point is None:
        return None
    holding = [r for r in rows if point <= r["usable_memory_bytes"]]
    best = min(holding, key=lambda r: (r["total_cents"], r["gpu"]), default=None)
    return {
        "peak_reserved_bytes": point,
        "gpu": best and best["gpu"],
        "gpus_per_lot": best and best["gpus_per_lot"],
        "total_cents": best and best["total_cents"],
    }


def lot_text(row: dict) -> str:
    return f"lot of {row['gpus_per_lot']} GPUs" if row["gpus_per_lot"] > 1 else "1 GPU"


def explain(result: dict) -> list[str]:
    """Which run gave each measured figure: every record, the total's and the context's."""
    lines = []
    for gpu, found in result["measured_memory"].items():
        lines.append(
            f"  {gpu}: the total from run {found['total_from']}, the smallest context from run "
            f"{found['context_from']}; the {len(found['runs'])} run(s) by what they reported:"
        )
        alike: dict[tuple, list[str]] = {}
        for record in found["runs"]:
            alike.setdefault((record["gpu"], record["total"], record["free"]), []).append(
                record["run"]
            )
        for (name, total, free), runs in alike.items():
            named = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
            lines.append(
                f"    {name}: total {total:,}, free at start {free:,}, context "
                f"{total - free:,} bytes: {named}"
            )
    return lines


def headline(result: dict) -> list[str]:
    """The answer first, with how sure it is: the cheapest model that holds the peak, a
    MARGINAL line when its headroom is thin, an APPROXIMATE line when the peak is a prediction
    that leaves something out."""
    fitting = [row for row in result["rows"] if row["fits"]]
    peak = f"{gib_up(result['peak_reserved_bytes'])} GiB"
    if not fitting:
        lines = [f"answer: no catalogue model holds {peak} on one GPU"]
    else:
        best = fitting[0]
        price = calcul_forfaits.dollars(best["total_cents"])
        lines = [
            f"answer: {best['gpu']} ({lot_text(best)}), {price}"
            f" for {result['days']} days, holds {peak} with {gib(best['headroom_bytes'])} GiB "
            f"headroom ({best['memory_basis']})"
        ]
        if best["marginal"]:
            roomy = next((row for row in fitting if not row["marginal"]), None)
            lines.append(
                f"  MARGINAL: under {gib_up(result['margin_bytes'])} GiB of headroom (the larger of"
                " 1 GiB and 5% of the peak) what fit cannot see decides: other libraries' "
                "workspaces, fragmentation, the caution of a vendor figure; "
                + (
                    f"the cheapest with room: {roomy['gpu']} ({lot_text(roomy)}), "
                    f"{calcul_forfaits.dollars(roomy['total_cents'])}"
                    if roomy
                    else "no model holds it with room"
                )
            )
    if result["approximate"]:
        lines.append(
            f"  APPROXIMATE: the peak is a prediction that is not exact ({result['approximate']}):"
            " measure it before you rent"
        )
    point = result.get("if_the_prediction_holds")
    if point is not None:
        figure = f"{gib_up(point['peak_reserved_bytes'])} GiB"
        lines.append(
            f"  if the prediction itself holds ({figure}, not a bound): "
            + (
                f"{point['gpu']} ({lot_text(point)}), "
                f"{calcul_forfaits.dollars(point['total_cents'])}"
                if point["gpu"]
                else "no model holds it on one GPU"
            )
        )
    return lines


def render(result: dict, explained: bool = False) -> str:
    where = f"measured on {result['measured_on']}" if result["measured_on"] else "GPU unknown"
    basis = where if result["peak_basis"] == Basis.MEASURED else result["peak_basis"]
    lines = [
        *headline(result),
        f"peak reserved {gib_up(result['peak_reserved_bytes'])} GiB "
        f"({result['peak_reserved_bytes']:,} bytes, {basis}): "
        f"{result['source']}, {result['configuration']}",
        *(f"  note: {note}" for note in result["notes"]),
        *(
            f"  warning: a run folder left out of the GPU memory figures: {line}"
            for line in result.get("untrusted_runs", [])
        ),
        f"rule: {result['rule']}",
        f"{result['days']}-day package, one lot per model, "
        + (
            "ILLUSTRATIVE PRICES, not IteraGPU's catalogue"
            if result["price_status"] == "illustrative"
            else f"catalogue prices of {result['snapshot_date']}"
        ),
    ]
    per_result = result["accepted_results"] is not None
    fitting = [r for r in result["rows"] if r["fits"]]
    short = [r for r in result["rows"] if not r["fits"]]
    table = [["model", "for PyTorch", "memory source", "headroom", "lot", "total USD"]]
    if per_result:
        table[0].append(f"per accepted result ({result['accepted_results']})")
    for row in fitting:
        cells = [
            row["gpu"],
            f"{gib(row['usable_memory_bytes'])} GiB",
            row["memory_basis"],
            f"{gib(row['headroom_bytes'])} GiB" + (" MARGINAL" if row["marginal"] else ""),
            lot_text(row),
            calcul_forfaits.dollars(row["total_cents"]),
        ]
        if per_result:
            cells.append(calcul_forfaits._dollars_fine(row["unit_cost_cents"]))
        table.append(cells)
    for row in short:
        table.append(
            [
                row["gpu"],
                f"{gib(row['usable_memory_bytes'])} GiB",
                row["memory_basis"],
                f"short by {gib_up(-row['headroom_bytes'])} GiB",
                lot_text(row),
                "does not fit",
            ]
        )
    widths = [max(len(r[i]) for r in table if i < len(r)) for i in range(len(table[0]))]
    for number, row in enumerate(table):
        if number == len(fitting) + 1 and short:
            lines.append("  does not fit on one GPU:")
        cells = [cell.ljust(width) for cell, width in zip(row, widths[: len(row)], strict=True)]
        lines.append(("  " + "  ".join(cells)).rstrip())
    if not fitting:
        largest = short[0]
        lines.append(
            f"No catalogue model holds {gib_up(result['peak_reserved_bytes'])} GiB on one GPU "
            f"(the most for PyTorch: {largest['gpu']}, {gib(largest['usable_memory_bytes'])} GiB, "
            f"{largest['memory_basis']}); several GPUs sharing one peak is not modelled."
        )
    lines.append("memory sources:")
    lines += [f"  {basis}: {detail}" for basis, detail in result["memory_bases"].items()]
    if explained:
        lines += explain(result) or ["  no model's memory is measured in these runs"]
    lines.append(
        f"tariffs: {result['tariffs_file']}, price_status {result['price_status']}, "
        f"snapshot {result['snapshot_date']}, sha256 {result['tariffs_sha256']}"
    )
    return "\n".join(lines)


def evidence(runs_dir: Path, needs: list[Need]) -> Evidence:
    """The runs directory's records and the sources' own, each file counted once."""
    found = gpu_records(runs_dir)
    found.records.update(
        need.record for need in needs if need.record is not None and need.record[1] is not None
    )
    return found


def load_catalogue(tariffs: str | None) -> dict:
    try:
        if tariffs is None:
            path = calcul_forfaits.default_tariffs()
            return calcul_forfaits.load_tariffs(path, os.path.basename(path))
        return calcul_forfaits.load_tariffs(tariffs)
    except calcul_forfaits.InputError as exc:
        raise cli.UsageError(str(exc)) from None


def parser() -> cli.Parser:
    parser = cli.Parser(prog="fit.py", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("source", type=Path, help="a run folder, a sweep folder or a prediction")
    calcul_forfaits.add_days(parser)
    calcul_forfaits.add_accepted_results(
        parser, "distinct useful results accepted: gives the cost per accepted result"
    )
    parser.add_argument(
        "--tariffs", metavar="PATH", help="tariff file (default: data/tarifs-forfaits.csv)"
    )
    parser.add_argument(
        "--runs-dir",
        metavar="DIR",
        help="where measured memory is looked for (default: $ITERAGPU_RUNS_DIR, else runs/)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="name the runs each measured memory figure comes from",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def fit_command(args: argparse.Namespace) -> int:
    """The source's need, the evidence under runs/, the packages that hold it."""
    need = need_of(args.source)
    if need.basis == Basis.PREDICTION and need.peak_reserved_bytes < 1:  # nothing allocated
        raise cli.UsageError(f"{args.source}: a peak of 0 bytes reserved: nothing to fit")
    catalogue = load_catalogue(args.tariffs)
    runs_dir = run_folders.runs_directory(args.runs_dir)
    found = evidence(runs_dir, [need])
    memory = catalogue_memory(catalogue, list(found.records.values()))
    result = fit(need, catalogue, memory, args.days, args.accepted_results)
    result["untrusted_runs"] = found.untrusted
    text = json.dumps(result, indent=2) if args.json else render(result, args.explain)
    print(text, flush=True)  # a reader that stops early: cli.run ends quietly, exit 1
    return cli.OK


def main(argv: list[str] | None = None) -> int:
    return cli.run("fit.py", lambda: fit_command(parser().parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
