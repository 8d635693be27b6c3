"""The recorder's poll before each operator (Recorder.__torch_dispatch__): a storage whose
last reference went between two operators is freed in the trace before the next operator
allocates, as the caching allocator frees it in a real run, so the next block can reuse it.

Expected sizes by hand: 3 Mi float32 elements are 12 MiB, a request of 10 MiB or more gets
a segment of its own rounded up to 2 MiB, so each tensor is one 12 MiB block and segment."""

from __future__ import annotations

import pytest

from pipeline.predicting import trace_prediction as tp

torch = pytest.importorskip("torch")

MIB = 2**20
ELEMENTS = 3 * MIB  # float32: 12 MiB
BLOCK = 4 * ELEMENTS


def traced(step):
    return tp.run_trace(torch, "meta", lambda phase: phase("step", step))


def test_a_tensor_deleted_between_two_operators_is_freed_before_the_next_one():
    """Guards the poll at the top of __torch_dispatch__: without it `a`'s free is recorded
    only at the phase's end, after `c` was allocated, and `c` cannot take `a`'s block."""

    def step():
        a = torch.ones(ELEMENTS, device="meta")
        b = a * 2
        del a
        c = b * 3
        return c  # b dies on return: freed by the phase's last poll, before its end

    trace = traced(step)
    assert trace.stopped is None
    events = [
        ("op", event[1].name, [nbytes for *_, nbytes in event[1].outputs])
        if event[0] == "op"
        else event
        for event in trace.events
    ]
    assert events == [
        ("start", "step", None, 1),
        ("op", "aten.ones.default", [BLOCK]),  # a: storage 0
        ("op", "aten.mul.Tensor", [BLOCK]),  # b: storage 1
        ("free", 0),  # a, deleted: freed before c is made
        ("op", "aten.mul.Tensor", [BLOCK]),  # c: storage 2
        ("free", 1),
        ("end",),
    ]
    (row,) = tp.predict(trace).rows
    # c takes a's freed block: never more than two blocks, nor two segments.
    assert row["peak_allocated_bytes"] == 2 * BLOCK
    assert row["peak_reserved_bytes"] == 2 * BLOCK
    assert row["allocated_bytes"] == BLOCK  # c, returned
    assert row["reserved_bytes"] == 2 * BLOCK


@pytest.mark.parametrize("steps", [2, 4])
def test_a_rebound_name_frees_its_old_tensor_before_the_next_operator(steps):
    """`x = x * 2` in a loop: each old x dies when the name is rebound, after its operator
    returned; a real run holds at most two such tensors at once (the next product reuses
    the block freed before it), whatever the number of steps. Without the poll before each
    operator the trace would hold all steps + 1 of them."""

    def step():
        x = torch.ones(ELEMENTS, device="meta")
        for _ in range(steps):
            x = x * 2
        return x

    (row,) = tp.predict(traced(step)).rows
    assert row["peak_allocated_bytes"] == 2 * BLOCK
    assert row["peak_reserved_bytes"] == 2 * BLOCK
    assert row["allocated_bytes"] == BLOCK
