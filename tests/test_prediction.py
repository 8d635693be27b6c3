"""The allocator model behind the predicted counters: hand-checked cases and properties.

Against real counters: every measurement committed under runs/ (run folders, sweeps and
grids, all measured on an H200) carries `predicted` beside the measured values, and the
tests below hold both to the byte. tests/test_gpu_measure.py does the same for new runs."""

from __future__ import annotations

import json

import pytest
from conftest import RUNS, run_script
from hypothesis import given
from hypothesis import strategies as st

from kit import mesure_memoire as mm

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
        (11 * MIB, 12 * MIB, 12 * MIB),  # rest exactly 1 MiB: split only above 1 MiB
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


def test_the_small_first_configuration_matches_the_h200_counters():
    """Counters read on an H200 (PyTorch 2.11, CUDA 13.0) for the default configuration,
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


def committed_measurements():
    """Every measurement document under runs/, in run folders, sweeps and grids alike."""
    found = []
    for path in sorted(RUNS.rglob("*.json")):
        with path.open(encoding="utf-8") as handle:
            head = handle.read(400)
        if f'"{mm.MEASUREMENT_SCHEMA}"' in head:
            found.append(path)
    return found


COMMITTED = committed_measurements()


def test_the_committed_evidence_is_all_found():
    """257 measurement documents were committed by 2026-12-02 and 80 more on 2026-12-03;
    more may come, never fewer."""
    assert len(COMMITTED) >= 337


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(RUNS)))
def test_committed_runs_were_predicted_to_the_byte_and_still_are(path):
    document = json.loads(path.read_text())
    assert document["phases"], "a measurement with no phase row proves nothing"
    today = mm.predict_phases(document["configuration"], document["calibration"]["blocks"])
    applies = document["summary"]["prediction"].get("applicable", True)
    assert applies == mm.prediction_applicability(document["environment"])[0] or (
        "applicable" not in document["summary"]["prediction"]  # written before the flag
    )
    for row, expected in zip(document["phases"], today, strict=False):
        measured = {key: row[key] for key in mm.COUNTER_KEYS}
        assert row["predicted"] == {key: expected[key] for key in mm.COUNTER_KEYS}, row["phase"]
        if applies:  # under other allocator settings the file says it is no claim
            assert row["predicted"] == measured, row["phase"]


def test_non_default_allocator_settings_do_break_the_prediction():
    """Why the flag exists, on the H200: with expandable segments the allocated counters
    still follow the model and the reserved ones do not."""
    path = RUNS / "20261203T070426Z-pipeline-check" / "20261203T070431Z-974944"
    prediction = json.loads((path / "measurement.json").read_text())["summary"]["prediction"]
    assert prediction["applicable"] is False
    assert prediction["largest_abs_difference_allocated_bytes"] == 0
    assert prediction["largest_abs_difference_reserved_bytes"] == 8_388_608


# ------------------------------------------------------------------ allocator settings

SETTINGS = json.loads((RUNS.parent / "tests/data/h200/allocator-settings.json").read_text())


def environment_with(settings: dict, backend: str = "native") -> dict:
    return {"gpu": {"allocator_backend": backend, "allocator_settings": settings}}


def test_the_defaults_an_h200_reports_are_the_modelled_ones():
    default = SETTINGS["settings"]["default"]["reported"]
    assert mm.prediction_applicability(environment_with(default)) == (True, None)


@pytest.mark.parametrize(
    ("case", "because"),
    [
        (
            "expandable_segments",
            "allocator settings differ from the modelled defaults: expandable_segments=True",
        ),
        (
            "split_gc_rounding",
            "allocator settings differ from the modelled defaults: max_split_size=268435456, "
            "garbage_collection_threshold=0.6, roundup_power2_divisions={'1': 4, '2': 4, "
            "'4': 4, '8': 4, '16': 4, '32': 4, '64': 4, '128': 4, '256': 4, '512': 4, "
            "'1024': 4, '2048': 4, '4096': 4, '8192': 4, '16384': 4, '32768': 4}",
        ),
    ],
)
def test_settings_an_h200_reported_under_a_user_conf_make_the_prediction_not_applicable(
    case, because
):
    reported = SETTINGS["settings"][case]["reported"]
    assert mm.prediction_applicability(environment_with(reported)) == (False, because)


def test_another_backend_or_unreadable_settings_make_the_prediction_not_applicable():
    default = SETTINGS["settings"]["default"]["reported"]
    assert mm.prediction_applicability(environment_with(default, "cudaMallocAsync")) == (
        False,
        "allocator backend 'cudaMallocAsync': the model is of the native allocator",
    )
    unread = {"error": "not reported by this PyTorch (AttributeError)"}
    assert mm.prediction_applicability(environment_with(unread)) == (
        False,
        "allocator settings not reported by this PyTorch (AttributeError): defaults not confirmed",
    )


def test_the_measurement_says_whether_its_prediction_applies():
    document = json.loads((RUNS / "20261202T125825Z-ff807b" / "measurement.json").read_text())
    assert mm.summarise(document)["prediction"]["applicable"] is False  # settings unrecorded
    document["environment"]["gpu"]["allocator_settings"] = SETTINGS["settings"]["default"][
        "reported"
    ]
    prediction = mm.summarise(document)["prediction"]
    assert prediction["applicable"] is True
    assert "not_applicable_because" not in prediction
    document["environment"]["gpu"]["allocator_settings"] = SETTINGS["settings"][
        "expandable_segments"
    ]["reported"]
    prediction = mm.summarise(document)["prediction"]
    assert prediction["applicable"] is False
    assert prediction["not_applicable_because"].endswith("expandable_segments=True")
