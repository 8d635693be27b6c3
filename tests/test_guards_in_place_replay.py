"""replay's operators made in place (OpCall.reuses): one block for two storages, freed with
the last of them. Traces built by hand; every expected counter worked out from the caching
allocator's rules (mesure_memoire.AllocatorModel), not read back from the code under test.

The sizes are 12 MiB: a request of 10 MiB or more gets a segment of its own, rounded up to
2 MiB, so one block is exactly one 12 MiB segment and a second block shows in `reserved`."""

from __future__ import annotations

import pytest

from pipeline.predicting import trace_prediction as tp

MIB = 2**20
BLOCK = 12 * MIB  # one request, one block, one segment (>= 10 MiB: rounded to 2 MiB only)
INPUT, OUTPUT, PROBE, LATER = 0, 1, 2, 3  # storage ids


def op(name: str, sid: int, reuses: int | None = None) -> tuple:
    return ("op", tp.OpCall(name, tp.CALLER, name, ((0, sid, BLOCK),), reuses=reuses))


def phase(name: str, *events: tuple) -> list:
    return [("start", name, None, 1), *events, ("end",)]


def counters(row: dict) -> tuple:
    keys = ("baseline_allocated_bytes", "baseline_reserved_bytes", "allocated_bytes")
    keys += ("reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes")
    return tuple(row[key] for key in keys)


def made_in_place(reuses: int | None) -> list:
    """An input, then an add whose output a real run writes into the input's block."""
    return [op("aten.empty.memory_format", INPUT), op("aten.add.Tensor", OUTPUT, reuses)]


@pytest.mark.parametrize(
    ("reuses", "blocks"),
    [
        (INPUT, 1),  # in place: the output is the input's block
        (None, 2),  # the control: out of place, a block of its own
        (99, 2),  # a storage the trace never allocated: nothing to share, a block of its own
    ],
    ids=["in-place", "out-of-place", "unknown-storage"],
)
def test_an_output_made_in_place_is_not_allocated_a_second_block(reuses, blocks):
    """Guards `if op.reuses in blocks:` in replay: without it the add allocates a second
    12 MiB segment, which a real run (add_ into the input) never does."""
    trace = tp.Trace("meta", "cpu-only", "test")
    trace.events = phase("step", *made_in_place(reuses))
    (row,), log, mismatches, _ = tp.replay(trace, None)
    held = blocks * BLOCK
    assert counters(row) == (0, 0, held, held, held, held)
    assert [entry for entry in log if entry[0] == "alloc"] == [
        ("alloc", BLOCK, "aten.empty.memory_format"),
        *[("alloc", BLOCK, "aten.add.Tensor")] * (blocks - 1),
    ]
    assert not mismatches


@pytest.mark.parametrize(
    ("first", "second"), [(INPUT, OUTPUT), (OUTPUT, INPUT)], ids=["input-first", "output-first"]
)
def test_the_shared_block_is_freed_with_the_last_of_its_two_storages(first, second):
    """Guards the in-place branch and its share count (`sharing`, `release`): the block
    stays allocated, and cannot be handed out, until both storages are freed, in either
    order; then it is free and reused without a new segment.

    By hand, in bytes of 12 MiB (allocated / reserved, peaks reset at each phase's start):
    made: one block, one segment: 1 / 1, peaks 1 / 1.
    one_freed: the first free leaves the block held: 1 / 1; a new 12 MiB request finds no
    free block, so a second segment: 2 / 2; freed again: 1 / 2, peaks 2 / 2.
    both_freed: the second free frees the shared block: 0 / 2, peaks 1 / 2 (the start's).
    reused: a 12 MiB request takes one of the two free blocks: 1 / 2, peaks 1 / 2."""
    trace = tp.Trace("meta", "cpu-only", "test")
    trace.events = [
        *phase("made", *made_in_place(INPUT)),
        *phase(
            "one_freed",
            ("free", first),
            op("aten.empty.memory_format", PROBE),
            ("free", PROBE),
        ),
        *phase("both_freed", ("free", second)),
        *phase("reused", op("aten.empty.memory_format", LATER)),
    ]
    rows, log, _, _ = tp.replay(trace, None)
    assert [row["phase"] for row in rows] == ["made", "one_freed", "both_freed", "reused"]
    assert [tuple(n // BLOCK for n in counters(row)) for row in rows] == [
        (0, 0, 1, 1, 1, 1),
        (1, 1, 1, 2, 2, 2),
        (1, 2, 0, 2, 1, 2),
        (0, 2, 1, 2, 1, 2),
    ]
    assert all(n % BLOCK == 0 for row in rows for n in counters(row))
    # The shared block is freed once, by the second storage's free: the log's only other
    # free is the probe's.
    frees = [entry for entry in log if entry[0] in ("free", "phase")]
    assert frees == [
        ("phase", 0, "made"),
        ("phase", 0, "one_freed"),
        ("free", BLOCK, "storage"),  # the probe
        ("phase", 0, "both_freed"),
        ("free", BLOCK, "storage"),  # the shared block, with its last storage
        ("phase", 0, "reused"),
    ]
