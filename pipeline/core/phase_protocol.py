"""The measurement protocol every workload follows, phase by phase, and what its rows hold.

run_phase is one phase: synchronise, baseline, peak reset, run, synchronise, end values; an
out-of-memory inside raises OutOfMemory with the row read after it, a real observation.
COUNTER_KEYS, CLOCKS and COUNTERS say what a row holds and what each number covers;
check_gpu refuses before a GPU is touched; spread and prediction_summary summarise the rows
of any workload, the seed network's, the decoder's or a user's model.

A core module of the kit script (make_kit_script.py says how): standard library only,
Python >= 3.10, PyTorch imported inside the functions that need it.
"""

from __future__ import annotations

import re
import statistics
import time

from pipeline.core.allocator_model import prediction_applicability
from pipeline.core.arguments import UsageError

COUNTER_KEYS = (
    "baseline_allocated_bytes",
    "baseline_reserved_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
)

CLOCKS = {
    "wall_time_ns": (
        "time.perf_counter_ns() (host, monotonic), from just after the pre-operation "
        "synchronisation, baseline reading and peak reset to just after the post-operation "
        "synchronisation: includes Python overhead, kernel launches and the synchronisation."
    ),
    "event_time_ns": (
        "torch.cuda.Event elapsed_time between two events recorded on the device's current "
        "stream around the operation, converted from milliseconds (about 0.5 us resolution): "
        "the GPU timeline, including any idle gap while the host prepared work. "
        "Not an isolated kernel time."
    ),
}
COUNTERS = (
    "PyTorch caching-allocator counters (memory_allocated, memory_reserved, "
    "max_memory_allocated, max_memory_reserved) of this process on the chosen GPU only: not "
    "the whole GPU memory, not the CUDA context or driver, not other processes, not other "
    "GPUs. allocated is part of reserved: never add them. The two peaks are separate maxima: "
    "never subtract one from the other. Values depend on the allocator and software versions "
    "recorded in 'environment'."
)


def check_gpu(torch, index: int, requested: str) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise UsageError("no GPU is visible to PyTorch: measure needs one and never uses the CPU")
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageError(f"{requested} does not exist: PyTorch sees {count} GPU(s)")


class OutOfMemory(Exception):
    """The GPU refused an allocation inside a phase: a real observation."""

    def __init__(self, row: dict, message: str):
        super().__init__(message)
        self.row = row

    def failure(self) -> dict:
        """The document's `failure`: the phase, what was asked for, the counters after it."""
        return {
            "phase": self.row["phase"],
            "repetition": self.row.get("repetition"),
            "error": oom_summary(str(self)),
            "counters_after_failure": {k: v for k, v in self.row.items() if k.endswith("_bytes")},
        }


def oom_summary(message: str) -> str:
    """Keep what was asked for; drop process lists and totals that name other processes."""
    match = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", message)
    return f"CUDA out of memory: tried to allocate {match.group(1)}" if match else "out of memory"


def phase_row(name: str, repetition: int | None, passes: int) -> dict:
    """A phase row's first keys, measured or traced alike."""
    row: dict = {"phase": name}
    if repetition is not None:
        row["repetition"] = repetition
    row["passes"] = passes
    return row


def run_phase(cuda, device, name: str, operation, repetition: int | None = None, passes: int = 1):
    """One phase under the protocol: synchronise, baseline, peak reset, run, synchronise, end
    values. Returns (row, what the operation returned); the caller keeps what it needs (the
    model, the input) and drops a pass's output at once, after the end values were read.
    An out-of-memory inside the operation raises OutOfMemory with the row read after it."""
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    cuda.synchronize(device)
    row = phase_row(name, repetition, passes)
    row["baseline_allocated_bytes"] = cuda.memory_allocated(device)
    row["baseline_reserved_bytes"] = cuda.memory_reserved(device)
    cuda.reset_peak_memory_stats(device)
    failure, result = None, None
    t0 = time.perf_counter_ns()
    start.record()
    try:
        result = operation()
    except cuda.OutOfMemoryError as exc:
        failure = str(exc)
    end.record()
    cuda.synchronize(device)
    t1 = time.perf_counter_ns()
    row["wall_time_ns"] = t1 - t0
    row["event_time_ns"] = round(start.elapsed_time(end) * 1_000_000)
    row["allocated_bytes"] = cuda.memory_allocated(device)
    row["reserved_bytes"] = cuda.memory_reserved(device)
    row["peak_allocated_bytes"] = cuda.max_memory_allocated(device)
    row["peak_reserved_bytes"] = cuda.max_memory_reserved(device)
    if failure is not None:
        raise OutOfMemory(row, failure)
    return row, result


def peaks_summary(phases: list[dict]) -> dict:
    """The first keys of every workload's summary: how many rows, and their largest peaks."""
    return {
        "phases_completed": len(phases),
        "largest_peak_allocated_bytes": max((r["peak_allocated_bytes"] for r in phases), default=0),
        "largest_peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in phases), default=0),
    }


def spread(values: list[int]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def prediction_summary(document: dict, model: str | None = None) -> dict:
    """Predicted against measured over every row, per counter, and whether the prediction is
    a claim at all (the allocator's backend and settings); shared by every workload."""
    phases = document["phases"]
    differences = {
        key: max((abs(row[key] - row["predicted"][key]) for row in phases), default=0)
        for key in COUNTER_KEYS
    }
    prediction = {
        "largest_abs_difference_allocated_bytes": max(
            differences[key] for key in COUNTER_KEYS if "allocated" in key
        ),
        "largest_abs_difference_reserved_bytes": max(
            differences[key] for key in COUNTER_KEYS if "reserved" in key
        ),
        "by_counter": differences,
    }
    if model is not None:
        prediction["model"] = model
    applicable, because = prediction_applicability(document["environment"])
    prediction["applicable"] = applicable
    if not applicable:
        prediction["not_applicable_because"] = because
    return prediction
