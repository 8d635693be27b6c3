"""The allocator model behind the predicted counters: hand-checked cases and properties.

The byte-for-byte comparison with real counters is in the committed H200 runs (every row
carries `predicted` beside the measured values) and in tests/test_gpu_prediction.py."""

from __future__ import annotations

import json

import mesure_memoire as mm
import pytest
from conftest import RUNS, run_script
from hypothesis import given
from hypothesis import strategies as st

MIB = 2**20


@pytest.mark.parametrize(
    ("request_bytes", "block", "segment"),
    [
        (1, 512, 2 * MIB),  # every block is a multiple of 512 bytes
        (513, 1024, 2 * MIB),
        (MIB, MIB, 2 * MIB),  # 1 MiB is still "small"
        (MIB + 1, MIB + 512, 20 * MIB),  # 1-10 MiB: a 20 MiB segment, split
        (10 * MIB, 10 * MIB, 10 * MIB),  # >= 10 MiB: the segment is rounded to 2 MiB
        (10 * MIB + 512 * 1024, 10 * MIB + 512 * 1024, 12 * MIB),  # rest 1.5 MiB: split
        (11 * MIB + 512 * 1024, 12 * MIB, 12 * MIB),  # rest 0.5 MiB: handed out unsplit
    ],
)
def test_one_allocation_on_a_fresh_allocator(request_bytes, block, segment):
    allocator = mm.AllocatorModel()
    allocator.malloc(request_bytes)
    assert allocator.allocated == block
    assert allocator.reserved == segment


def test_a_freed_block_is_reused_best_fit_and_handed_out_whole_when_the_rest_is_small():
    allocator = mm.AllocatorModel()
    big = allocator.malloc(16 * MIB)
    allocator.free(big)
    allocator.malloc(15 * MIB + 512)  # rest 1 MiB - 512 <= 1 MiB: the whole 16 MiB block
    assert allocator.allocated == 16 * MIB
    assert allocator.reserved == 16 * MIB


def test_spec_small_configuration_matches_the_h200_counters():
    """Counters read on an H200 (PyTorch 2.11, CUDA 13.0) for the spec's first command,
    with cuBLAS's 32 MiB and cuBLASLt's 1 MiB workspaces as the library blocks."""
    configuration = {
        "batch": 1,
        "context": 16,
        "width": 64,
        "dtype": "float32",
        "warmup": 1,
        "repeats": 2,
    }
    library = [{"layer": "0", "requested_bytes": 32 * MIB}, {"layer": "0", "requested_bytes": MIB}]
    rows = mm.predict_phases(configuration, library)
    assert [
        (r["allocated_bytes"], r["peak_allocated_bytes"], r["reserved_bytes"]) for r in rows
    ] == [
        (132608, 132608, 2097152),
        (136704, 136704, 2097152),
        (34743808, 34772480, 35651584),
        (34743808, 34772480, 35651584),
        (34743808, 34772480, 35651584),
        (34743808, 34772480, 35651584),
    ]
    assert rows[3]["baseline_allocated_bytes"] == 34739712  # the output freed between phases


@given(
    st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=64 * MIB)), max_size=40)
)
def test_counters_stay_consistent_whatever_the_sequence(operations):
    allocator = mm.AllocatorModel()
    live = []
    for allocate, size in operations:
        if allocate or not live:
            live.append(allocator.malloc(size))
        else:
            allocator.free(live.pop(size % len(live)))
        assert 0 <= allocator.allocated <= allocator.reserved
        assert allocator.peak_allocated >= allocator.allocated
        assert allocator.allocated % 512 == 0
    for block in live:
        allocator.free(block)
    assert allocator.allocated == 0
    # every segment is one free block again: splits merged back
    assert all(b["prev"] is None and b["next"] is None for b in allocator.free_blocks)
    assert sum(b["size"] for b in allocator.free_blocks) == allocator.reserved


def test_estimate_phases_on_the_command_line():
    result = run_script(
        "mesure_memoire.py",
        "estimate",
        "--phases",
        "--width",
        "1024",
        "--batch",
        "2",
        "--context",
        "128",
        "--library-block",
        "0:33554432",
        "--library-block",
        "0:1048576",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["phases"]
    assert rows[2]["peak_allocated_bytes"] == 77615104
    assert rows[2]["allocated_bytes"] == 70275072


def committed_v2_runs():
    return sorted(
        p
        for p in RUNS.glob("*/measurement.json")
        if '"urn:iteragpu-lab:schema:measurement:v2"' in p.read_text()
    )


@pytest.mark.parametrize("path", committed_v2_runs(), ids=lambda p: str(p.relative_to(RUNS)))
def test_committed_runs_carry_the_prediction_the_model_gives_today(path):
    document = json.loads(path.read_text())
    rows = mm.predict_phases(document["configuration"], document["calibration"]["blocks"])
    for row, expected in zip(document["phases"], rows, strict=False):
        assert row["predicted"] == {key: expected[key] for key in mm.COUNTER_KEYS}
