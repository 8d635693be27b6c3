"""probe_sweep.py without a GPU: the calls it records for a calibration (the matrix products
among them, which the scripts copied into earlier probe folders left out, so no bfloat16 bmm
form was ever probed), its points file, and its refusals, each before anything is written."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_script

from pipeline.measuring import probe_sweep
from pipeline.predicting import gpu_calibration

BMM = (
    "import torch\nfrom own_model import Workload\n\n"
    "def scores(config, *, heads=4, length=32, width=16):\n"
    "    model = torch.nn.Linear(width, width).to(device=config.device, dtype=config.dtype)\n"
    "    def make_inputs():\n"
    "        return torch.randn(config.batch * heads, length, width,\n"
    "                           device=config.device, dtype=config.dtype)\n"
    "    def step(model, x):\n"
    "        y = model(x)\n"
    "        return torch.bmm(y, y.transpose(1, 2)).float().mean()\n"
    "    return Workload(model, make_inputs, step)\n"
)


def points_file(tmp_path, text: str):
    path = tmp_path / "points.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_matrix_products_are_recorded_with_the_rest(tmp_path):
    """A bfloat16 bmm and its linear (an addmm over the flattened input) are recorded, with
    their leaves (the form the calibration's patterns key on); views and output-only calls,
    such as the cast to float32, are not."""
    workload = tmp_path / "scores.py"
    workload.write_text(BMM, encoding="utf-8")
    argv = ["--workload", f"{workload}:scores", "--dtype", "bfloat16", "--batch", "2"]
    trace, stopped = probe_sweep.trace_point(torch, argv, probe_sweep.TARGETS["h200"])
    assert stopped is None
    assert trace.device == "meta"
    calls = probe_sweep.recorded(trace)
    names = {entry["name"] for entry in calls.values()}
    assert names == {"aten.addmm.default", "aten.bmm.default", "aten.mean.default"}
    assert names & gpu_calibration.GENERALISED == {"aten.addmm.default", "aten.bmm.default"}
    assert not any(entry["view"] for entry in calls.values())
    (bmm,) = [entry for entry in calls.values() if entry["name"] == "aten.bmm.default"]
    assert bmm["calls"] == 1 + 1 + 2  # cold step, warm-up, two repeats: one bmm each
    assert "bfloat16" in bmm["leaves"]
    assert "(8, 32, 16)" in bmm["leaves"]  # batch 2 x 4 heads, 32 x 16
    assert json.loads(json.dumps(calls)) == calls  # what the probe file holds


def test_points_are_checked_by_the_estimates_own_parser(tmp_path):
    text = "# comment\n\na --workload m.py:f --batch 2  # trailing\nb --workload m.py:f\n"
    assert probe_sweep.read_points(text) == [
        ("a", ["--workload", "m.py:f", "--batch", "2"]),
        ("b", ["--workload", "m.py:f"]),
    ]


def test_a_decoder_line_is_read_by_the_decoders_parser_and_traced_as_it_measures():
    """`NAME decoder ARGS`: decoder.py estimate's arguments; the trace is the one its
    measure makes (model_load, inputs_and_cache, prefill, decode rows), and the calls the
    trace cannot cover without a probe (the RMSNorm's vector norm, the products) are the
    ones recorded."""
    line = "d decoder --layers 1 --width 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 512"
    line += " --prompt 8 --new-tokens 3 --dtype float16\n"
    [(name, argv)] = probe_sweep.read_points(line)
    assert (name, argv[0], argv[-1]) == ("d", "decoder", "float16")
    trace, stopped = probe_sweep.trace_point(torch, argv, probe_sweep.TARGETS["h200"])
    assert stopped is None
    phases = [event[1] for event in trace.events if event[0] == "start"]
    assert phases == ["model_load", "inputs_and_cache", "prefill", "warmup", "decode"]
    names = {entry["name"] for entry in probe_sweep.recorded(trace).values()}
    assert "aten.linalg_vector_norm.default" in names
    assert "aten.linear.default" in names or "aten.mm.default" in names
    leaves = " ".join(entry["leaves"] for entry in probe_sweep.recorded(trace).values())
    assert "float16" in leaves


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a decoder --layers 2 --heads 4 --kv-heads 3\n", "line 1 (a): "),
        ("a decoder --preset no-such-model\n", "line 1 (a): argument --preset"),
        ("a --workload m.py:f\na --workload m.py:f\n", "line 2: a named twice"),
        ("../a --workload m.py:f\n", "line 1: '../a' is not a usable file name"),
        ("a --workload m.py:f --batch two\n", "line 1 (a): argument --batch"),
        ("# nothing\n", "no workload in the points file"),
    ],
)
def test_a_bad_points_file_is_one_line_exit_2_and_nothing_written(tmp_path, text, said):
    points = points_file(tmp_path, text)
    out = tmp_path / "out"
    out.mkdir()
    result = run_script("probe_sweep.py", str(points), "--out", str(out))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("probe_sweep.py: error: ")
    assert said in result.stderr
    assert list(out.iterdir()) == []


def test_an_existing_probe_file_is_refused_and_kept(tmp_path):
    points = points_file(tmp_path, "a --workload m.py:f\nb --workload m.py:f\n")
    (tmp_path / "probes").mkdir()
    kept = tmp_path / "probes" / "b.json"
    kept.write_bytes(b"{}\n")
    result = run_script("probe_sweep.py", str(points), "--out", str(tmp_path))
    assert result.returncode == 2
    assert "b.json already exists" in result.stderr
    assert kept.read_bytes() == b"{}\n"
    assert sorted(p.name for p in (tmp_path / "probes").iterdir()) == ["b.json"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path):
    points = points_file(tmp_path, "a --workload m.py:f\n")
    result = run_script("probe_sweep.py", str(points), "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == (
        "probe_sweep.py: error: no CUDA GPU is visible: probes run on the GPU they calibrate\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["points.txt"]


@pytest.mark.gpu
def test_on_the_gpu_two_bfloat16_bmm_shapes_make_a_pattern_the_calibration_keeps(tmp_path):
    """The reason the stage exists: probe files of two workloads whose bfloat16 bmm differs
    in shape give `gpu_calibration.build` a pattern for the form bmm(bfloat16, bfloat16)."""
    workload = tmp_path / "scores.py"
    workload.write_text(BMM, encoding="utf-8")
    spec = f"{workload}:scores --dtype bfloat16"
    points = points_file(
        tmp_path, f"b2 --workload {spec} --batch 2\nb3 --workload {spec} --batch 3\n"
    )
    result = run_script("probe_sweep.py", str(points), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    documents = [json.loads((tmp_path / "probes" / f"{n}.json").read_text()) for n in ("b2", "b3")]
    built = gpu_calibration.build(documents)
    assert "aten.bmm.default(bfloat16, bfloat16)" in built["patterns"]
