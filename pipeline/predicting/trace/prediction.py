"""A prediction: the trace replayed (`predict`), with the other orders of segment addresses
replayed beside it, in forked workers for a long trace (`address_order_spread`), and the
record every prediction is written as (`prediction_record`).

Torch is never imported here."""

from __future__ import annotations

import dataclasses
import os
import random

from pipeline.core import phase_protocol
from pipeline.core.prediction_status import PredictionStatus
from pipeline.predicting.trace import replay
from pipeline.predicting.trace.bounds import BOUNDS_METHOD, assess, bounds
from pipeline.predicting.trace.calibration import Calibration
from pipeline.predicting.trace.model import Trace

# Written into every prediction, in the words committed predictions hold (the kit script
# carries the same AllocatorModel as allocator_model.py).
METHOD = (
    "the workload traced once under torch FakeTensorMode (no memory, no GPU) by a dispatch "
    "mode: each new device storage an allocation of its bytes, each expired storage a free, "
    "in order; replayed phase by phase through mesure_memoire.AllocatorModel, with each "
    "operator's own blocks from the calibration"
)


@dataclasses.dataclass
class Prediction:
    status: PredictionStatus
    rows: list
    unknown: list  # [{"op", "calls", "why"}]
    log: list  # the replayed allocations and frees, to compare with a GPU's history
    reason: str | None = None
    mismatches: dict = dataclasses.field(default_factory=dict)
    address_orders: dict | None = None  # {"orders": n, "largest_difference_bytes": {...}}
    bounds: list | None = None  # per row: {counter: (lower, upper)} for the peak counters
    unbounded: str | None = None  # why an approximate prediction has no bounds


def predict(trace: Trace, calibration: Calibration | None = None) -> Prediction:
    """The six counters of every traced phase, and how far they can be trusted."""
    if trace.stopped is not None:
        return Prediction(PredictionStatus.NOT_PREDICTED, [], [], [], reason=trace.stopped)
    allocator = replay.DriverOrder()
    rows, log, mismatches, per_thread_used = replay.replay(trace, calibration, allocator=allocator)
    unknown = assess(trace, calibration, mismatches, per_thread_used)
    spread = address_order_spread(trace, calibration, rows, allocator.address_choice)
    if any(spread.values()):
        unknown.append({"op": replay.ADDRESS_ORDER, "calls": 0, "why": address_order_why(spread)})
    prediction = Prediction(
        PredictionStatus.APPROXIMATE if unknown else PredictionStatus.EXACT,
        rows,
        unknown,
        log,
        mismatches=mismatches,
        address_orders={"orders": len(OTHER_ADDRESS_ORDERS), "largest_difference_bytes": spread},
    )
    if unknown:
        prediction.bounds, prediction.unbounded = bounds(trace, calibration, rows, spread, unknown)
    return prediction


# Other orders of the segments' addresses to replay under (RankedSegments), besides the
# central one (DriverOrder): the plain order (a later segment above an earlier), the
# reverse, then seeded shuffles. Each is a function of the segment's
# creation index (the same index always gets the same rank, in one replay).
def shuffled(seed: int):
    ranks: dict = {}
    generator = random.Random(seed)
    return lambda n: ranks.setdefault(n, generator.getrandbits(40))


OTHER_ADDRESS_ORDERS = (
    lambda: lambda n: n,
    lambda: lambda n: -n,
    *(lambda s=s: shuffled(s) for s in range(1, 8)),
)


def address_order_spread(
    trace: Trace, calibration, rows: list[dict], address_choice: bool = True
) -> dict:
    """Per counter, the largest difference from `rows` over the replays under other orders
    of the segments' addresses. Zero everywhere: the order, which only the driver knows,
    does not matter to this workload. Without an `address_choice` in the replay of `rows`
    (IndexedAllocator), every other order makes the same choices: zero, without replaying."""
    spread = dict.fromkeys(phase_protocol.COUNTER_KEYS, 0)
    orders = range(len(OTHER_ADDRESS_ORDERS)) if address_choice else ()
    forked = len(trace.events) >= FORKED_REPLAYS
    for other in side_by_side(partial_replay, (trace, calibration), orders, forked):
        for row, alternative in zip(rows, other, strict=True):
            for key in spread:
                spread[key] = max(spread[key], abs(alternative[key] - row[key]))
    return spread


def partial_replay(trace: Trace, calibration, order: int) -> list[dict]:
    """The rows of the replay under OTHER_ADDRESS_ORDERS[order], without its log."""
    return replay.replay(trace, calibration, OTHER_ADDRESS_ORDERS[order](), logged=False)[0]


# Events from which the other orders' replays go to forked workers: below, a replay takes
# about as long as forking a process (a 1B-class decoder's 16 tokens make 20,000 events; the
# 8B-class estimate's 128 tokens, hundreds of thousands).
FORKED_REPLAYS = 50_000

# What side_by_side's forked workers read: set just before they are forked, so that they
# inherit it instead of receiving the trace (hundreds of thousands of events) by pickle.
_SHARED: tuple = ()


def _shared_call(item):
    function, arguments = _SHARED
    return function(*arguments, item)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return 1


def side_by_side(function, arguments: tuple, items, forked: bool = True) -> list:
    """[function(*arguments, item) for item in items], in that order, computed by workers
    forked from this process where it may fork and more than one CPU is usable: the
    replays are independent, pure Python and each as long as the central one. Elsewhere,
    not `forked`, or for fewer than two items, one after the other here."""
    global _SHARED
    import multiprocessing

    items = list(items)
    workers = min(usable_cpus(), len(items)) if forked else 1
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [function(*arguments, item) for item in items]
    _SHARED = (function, arguments)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return pool.map(_shared_call, items, chunksize=1)
    finally:
        _SHARED = ()


def address_order_why(spread: dict) -> str:
    largest = max(spread.values())
    counters = ", ".join(key.removesuffix("_bytes") for key, value in spread.items() if value)
    return (
        f"among free blocks of one size the allocator takes the lowest address, and the "
        f"driver's addresses of its segments are not known: replayed under "
        f"{len(OTHER_ADDRESS_ORDERS)} other orders of them, the counters move by up to "
        f"{largest:,} bytes ({counters}); the real order may move them further"
    )


def prediction_rows(prediction: Prediction) -> list[dict]:
    keys = ("phase", "repetition", "passes", *phase_protocol.COUNTER_KEYS)
    return [{key: row[key] for key in keys if key in row} for row in prediction.rows]


def prediction_record(trace: Trace, prediction: Prediction, calibration_source: str | None) -> dict:
    """What every measurement and estimate file says of its prediction (one record for every
    workload): the claim, what it does not know, the trace, the rows, the bounds."""
    rows = prediction_rows(prediction)
    record = {
        "status": prediction.status,
        "unknown": prediction.unknown,
        "method": METHOD,
        "trace": {
            "torch": trace.torch_version,
            "build": trace.build,
            "device": trace.device,
            "operator_calls": trace.operator_calls,
            "distinct_calls": len(trace.signatures),
        },
        "calibration": calibration_source,
        "phases": rows,
        "largest_peak_allocated_bytes": max(
            (r["peak_allocated_bytes"] for r in rows), default=None
        ),
        "largest_peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in rows), default=None),
    }
    if prediction.address_orders is not None:
        record["address_orders"] = prediction.address_orders
    if prediction.bounds is not None:
        record["bounds"] = {
            "method": BOUNDS_METHOD,
            "phases": [
                {
                    **{key: row[key] for key in ("phase", "repetition") if key in row},
                    **{key: {"lower": low, "upper": high} for key, (low, high) in found.items()},
                }
                for row, found in zip(rows, prediction.bounds, strict=True)
            ],
        }
    if prediction.unbounded is not None:
        record["unbounded"] = prediction.unbounded
    if prediction.reason is not None:
        record["reason"] = prediction.reason
    return record
