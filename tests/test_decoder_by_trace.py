"""tests/benchmarks/decoder_by_trace.py, which compares `decoder.py estimate --gpu` with every
committed decoder measurement: its comparison, and its points for a probe sweep."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import RUNS

torch = pytest.importorskip("torch")
import decoder_by_trace  # noqa: E402

from pipeline.predicting import gpu_calibration  # noqa: E402
from pipeline.predicting import trace_prediction as tp  # noqa: E402
from pipeline.predicting.trace_prediction import PredictionStatus  # noqa: E402

GRID = RUNS / "20261203T093850Z-decoder-grid" / "grid"


def predicted(name: str):
    calibration, facts = gpu_calibration.load("h200")
    target = gpu_calibration.target(facts)
    document = json.loads((GRID / name).read_text(encoding="utf-8"))
    prediction = decoder_by_trace.trace_point(torch, document, target, calibration)
    return prediction, decoder_by_trace.compare(prediction, document["phases"])


def test_a_bfloat16_decoder_is_traced_to_the_h200s_bytes_on_every_counter():
    prediction, found = predicted("bfloat16-gqa4-l2-w256.json")
    assert [row["phase"] for row in tp.prediction_rows(prediction)] == [
        "model_load", "inputs_and_cache", "prefill", "warmup", "decode", "decode", "decode",
    ]  # fmt: skip
    assert found["equal"], found["differences"]
    assert found["broken"] == []


def test_a_float16_decoder_is_traced_to_the_h200s_bytes_and_said_exact():
    """Its calls were probed on the H200 (runs/20261205T023519Z-h200-probe-decoder), the
    first float16 matrix products among them: nothing is borrowed or unknown any more (the
    borrowing is tested on synthetic traces in test_prediction_bounds.py)."""
    prediction, found = predicted("float16-gqa4-l2-w256.json")
    assert prediction.status == PredictionStatus.EXACT, prediction.unknown
    assert found["equal"], found["differences"]


def test_the_comparison_sees_a_difference_and_a_broken_bound():
    measured = [{"phase": "p", **dict.fromkeys(decoder_by_trace.COUNTER_KEYS, 512)}]
    row = {"phase": "p", **dict.fromkeys(decoder_by_trace.COUNTER_KEYS, 512)}
    row["peak_reserved_bytes"] = 1024
    prediction = tp.Prediction(PredictionStatus.APPROXIMATE, [row], [], [])
    prediction.bounds = [{"peak_reserved_bytes": (600, 2048)}]
    found = decoder_by_trace.compare(prediction, measured)
    assert found["differences"] == [("p", None, "peak_reserved_bytes", 512)]
    assert found["broken"] == [("p", None, "peak_reserved_bytes", 512, 600, 2048)]
    assert not found["equal"]


def test_every_committed_point_becomes_a_probe_line_of_its_own_run():
    """--points: the lines a probe sweep reads, each giving back the committed shape and run."""
    from pipeline.measuring import decoder, probe_sweep

    paths = decoder_by_trace.committed()
    lines = [decoder_by_trace.points_line(p, json.loads(p.read_text("utf-8"))) for p in paths]
    points = probe_sweep.read_points("\n".join(lines))
    assert len(points) == len(paths) >= 46
    for path, (_, argv) in zip(paths, points, strict=True):
        configuration = json.loads(path.read_text("utf-8"))["configuration"]
        args = probe_sweep.parsed(argv)
        shape, preset = decoder.shape_from_args(args)
        assert preset == configuration["preset"]
        assert dataclasses.asdict(shape) == configuration["shape"], path
        assert decoder.run_configuration(args) == {
            key: configuration[key] for key in decoder.RUN_DEFAULTS
        }
