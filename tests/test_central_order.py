"""The central replay's order of segment addresses (trace_prediction.DriverOrder,
segment_order's model of the driver): a hand-worked replay where it and the plain order
choose differently, and a prediction where they disagree is never exact."""

from __future__ import annotations

import itertools

from pipeline.predicting import segment_order as so
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

MiB = so.MiB


def hand_worked(allocator) -> int:
    """Segment A (32 MiB, full); segment B (20 MiB, 4 + 16, full): the model puts B in a
    span of its own below A, the plain order above. Freed and refilled so that A and B each
    hold one free 4 MiB block; a 4 MiB request takes the lower one; then a 30 MiB request
    fits A's 32 MiB (B's 4 taken: A's 4 and 28 merge) or makes a segment (A's 4 taken:
    28 and 20 free). Returns the reserved bytes."""
    x = allocator.malloc(32 * MiB)
    p, q = allocator.malloc(4 * MiB), allocator.malloc(16 * MiB)
    allocator.free(x)
    r, s = allocator.malloc(4 * MiB), allocator.malloc(28 * MiB)
    allocator.free(p)
    allocator.free(r)
    allocator.malloc(4 * MiB)
    allocator.free(q)
    allocator.free(s)
    allocator.malloc(30 * MiB)
    return allocator.reserved


def test_hand_worked_model_and_plain_orders_differ():
    model = tp.DriverOrder()
    assert hand_worked(model) == 52 * MiB
    assert model.address_choice
    assert hand_worked(tp.IndexedAllocator()) == 82 * MiB
    assert hand_worked(tp.RankedSegments(lambda n: n)) == 82 * MiB


def test_model_and_plain_disagreeing_is_never_exact():
    """The same steps as a trace: predict's rows are the model's (52 MiB reserved), the
    plain order is among those compared (82 MiB): approximate, by 30 MiB."""
    trace = tp.Trace("meta", "cpu-only", "2.13.0")
    ids = itertools.count()

    def alloc(nbytes: int) -> int:
        sid = next(ids)
        call = tp.OpCall("aten.empty.memory_format", tp.CALLER, "s", ((0, sid, nbytes),))
        trace.events.append(("op", call))
        return sid

    def free(*sids: int) -> None:
        trace.events.extend(("free", sid) for sid in sids)

    trace.events.append(("start", "cold_step", None, 1))
    x = alloc(32 * MiB)
    p, q = alloc(4 * MiB), alloc(16 * MiB)
    free(x)
    r, s = alloc(4 * MiB), alloc(28 * MiB)
    free(p, r)
    alloc(4 * MiB)
    free(q, s)
    alloc(30 * MiB)
    trace.events.append(("end",))
    prediction = tp.predict(trace)
    (row,) = prediction.rows
    assert row["reserved_bytes"] == 52 * MiB
    assert prediction.address_orders["largest_difference_bytes"]["reserved_bytes"] == 30 * MiB
    assert prediction.status == PredictionStatus.APPROXIMATE
    assert [entry["op"] for entry in prediction.unknown] == [tp.ADDRESS_ORDER]
