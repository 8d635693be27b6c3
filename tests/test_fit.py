"""fit.py: which catalogue GPU holds a peak on one GPU, judged on the memory PyTorch sees.

Figures come from the committed H200 runs: the context sweep's largest completed point and
the larger proposed configuration (batch 2, context 128, width 1024), measured and predicted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import runfixtures
from conftest import ROOT, RUNS, call_main, outside_python, run_script, run_unread
from hypothesis import example, given
from hypothesis import strategies as st

from pipeline.measuring import decoder
from pipeline.stages import fit

CONTEXT_SWEEP = "20261202T113219Z-8f4a88-sweep"
ITS_LARGEST_POINT = "20261202T113227Z-29fdbe"  # context 2097152, completed
ITS_OOM_POINT = "20261202T113228Z-e07683"  # context 8388608, out of memory
LARGE_RUN = "20261202T112323Z-50900d"  # batch 2, context 128, width 1024, float32
H200_TOTAL = 150_109_880_320  # total_memory_bytes in every committed H200 run
H200_AT_START = 150_109_880_320 - 149_557_477_376  # total minus free when the process starts
GIB = 2**30
KERNELS_LATER = 165_675_008  # measured on the H200 after the first forward passes
H200_USABLE = H200_TOTAL - H200_AT_START - KERNELS_LATER  # 149,391,802,368
SWEEP_PEAK = 77_366_034_432
HOLD_72_GIB = ["a100-80", "mi300x", "gh200", "h100", "mi325x", "h200", "b200"]  # cheapest first
PREDICT = [
    "estimate",
    "--phases",
    "--batch",
    "2",
    "--context",
    "128",
    "--width",
    "1024",
    "--warmup",
    "3",
    "--repeats",
    "5",
    "--library-block",
    "0:33554432",
    "--library-block",
    "0:1048576",
    "--json",
]


def copy_run(runs: Path, run_id: str) -> Path:
    runs.mkdir(exist_ok=True)
    return Path(shutil.copytree(RUNS / run_id, runs / run_id))


def context_sweep(runs: Path) -> Path:
    """The committed context sweep with its largest completed point beside it."""
    copy_run(runs, ITS_LARGEST_POINT)
    return copy_run(runs, CONTEXT_SWEEP)


def fit_json(*argv, env=None):
    result = run_script("fit.py", *argv, "--json", env=env)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return json.loads(result.stdout)


def prediction(tmp_path, *argv) -> Path:
    result = run_script("mesure_memoire.py", *argv)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "prediction.json"
    path.write_text(result.stdout)
    return path


def test_the_context_sweep_fits_where_its_peak_and_the_context_fit(tmp_path):
    sweep = context_sweep(tmp_path / "runs")
    result = fit_json(
        str(sweep), "--days", "7", "--accepted-results", "40", "--runs-dir", str(tmp_path / "runs")
    )
    assert (result["peak_reserved_bytes"], result["peak_basis"]) == (SWEEP_PEAK, "measured")
    assert result["measured_on"] == "NVIDIA H200"
    assert [row["gpu"] for row in result["rows"] if row["fits"]] == HOLD_72_GIB
    h200 = next(row for row in result["rows"] if row["gpu"] == "h200")
    assert h200 == {
        "gpu": "h200",
        "name": "NVIDIA H200 SXM",
        "fits": True,
        "memory_basis": "measured",
        "total_memory_bytes": H200_TOTAL,
        "context_room_bytes": H200_AT_START + KERNELS_LATER,
        "usable_memory_bytes": 149_391_802_368,
        "headroom_bytes": 149_391_802_368 - SWEEP_PEAK,
        "marginal": False,
        "gpus_per_lot": 1,
        "total_cents": 56952,
        "unit_cost_cents": "1423.80",
    }
    b200 = next(row for row in result["rows"] if row["gpu"] == "b200")
    assert (b200["memory_basis"], b200["gpus_per_lot"], b200["total_cents"]) == (
        "vendor figure",
        2,
        169680,
    )
    assert result["memory_bases"]["measured"] == (
        "NVIDIA H200, 1 run(s): total 150,109,880,320 bytes (139.80 GiB) as PyTorch reports it, "
        "less the CUDA context: 552,402,944 bytes at the start (total minus free) + 165,675,008 "
        "bytes of kernels loaded later (measured on the H200)"
    )


def test_the_text_names_the_peak_its_source_and_which_memory_was_used(tmp_path):
    sweep = context_sweep(tmp_path / "runs")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    argv = [str(sweep), "--days", "7", "--accepted-results", "40"]
    result = run_script("fit.py", *argv, "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "answer: a100-80 (1 GPU), $230.16 for 7 days, holds 72.06 GiB with 1.78 GiB headroom "
        "(vendor figure)"
    )
    assert lines[1].startswith("  MARGINAL: under 3.61 GiB of headroom")
    assert lines[1].endswith("the cheapest with room: mi300x (1 GPU), $337.68")
    assert lines[2] == (
        "peak reserved 72.06 GiB (77,366,034,432 bytes, measured on NVIDIA H200): "
        f"{CONTEXT_SWEEP}, its largest completed point, context 2097152 "
        "(batch 2, width 1024, dtype bfloat16)"
    )
    assert "  note: the sweep stopped because the GPU ran out of memory" in lines
    assert (
        "7-day package, one lot per model, ILLUSTRATIVE PRICES, not IteraGPU's catalogue" in lines
    )
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  ")}
    assert " ".join(rows["h200"]) == "h200 139.13 GiB measured 67.07 GiB 1 GPU $569.52 $14.2380"
    assert " ".join(rows["b200"][-6:]) == "lot of 2 GPUs $1,696.80 $42.4200"
    assert (
        " ".join(rows["a100-80"])
        == "a100-80 73.83 GiB vendor figure 1.78 GiB MARGINAL 1 GPU $230.16 $5.7540"
    )
    assert (
        " ".join(rows["l4"]) == "l4 21.68 GiB vendor figure short by 50.37 GiB 1 GPU does not fit"
    )
    assert "  does not fit on one GPU:" in lines
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_a_model_never_measured_here_is_judged_on_the_vendor_figure(tmp_path):
    """A prediction of the larger proposed run, with no H200 run in the runs directory."""
    path = prediction(tmp_path, *PREDICT)
    (tmp_path / "runs").mkdir()
    result = fit_json(str(path), "--days", "3", "--runs-dir", str(tmp_path / "runs"))
    assert (result["peak_reserved_bytes"], result["peak_basis"]) == (92_274_688, "prediction")
    assert result["measured_on"] is None
    assert {row["memory_basis"] for row in result["rows"]} == {"vendor figure"}
    h200 = next(row for row in result["rows"] if row["gpu"] == "h200")
    assert (h200["total_memory_bytes"], h200["usable_memory_bytes"]) == (
        141 * 10**9,
        140_281_922_048,
    )
    assert list(result["memory_bases"]) == ["vendor figure"]
    assert all(row["fits"] for row in result["rows"])
    assert result["rows"][0]["gpu"] == "l4"  # the cheapest 3-day package: $32.40
    assert result["rows"][0]["total_cents"] == 3240


def test_the_measured_run_gives_its_own_gpu_and_the_same_peak_as_predicted(tmp_path):
    folder = copy_run(tmp_path / "elsewhere", LARGE_RUN)
    (tmp_path / "runs").mkdir()
    result = fit_json(str(folder), "--days", "3", "--runs-dir", str(tmp_path / "runs"))
    assert result["peak_reserved_bytes"] == 92_274_688  # what the prediction said
    h200 = next(row for row in result["rows"] if row["gpu"] == "h200")
    assert (h200["memory_basis"], h200["usable_memory_bytes"]) == ("measured", H200_USABLE)
    assert result["memory_bases"]["measured"].startswith("NVIDIA H200, 1 run(s): ")
    inside = copy_run(tmp_path / "runs", LARGE_RUN)  # its environment.json and measurement.json
    result = fit_json(str(inside), "--days", "3", "--runs-dir", str(tmp_path / "runs"))
    assert result["memory_bases"]["measured"].startswith("NVIDIA H200, 1 run(s): ")


def test_several_runs_of_a_model_give_its_smallest_total_and_smallest_context():
    """Other processes on the GPU only ever add to total minus free: the least is the context."""
    memory = fit.measured_memory(
        "NVIDIA H200",
        [
            fit.Record("NVIDIA H200", 100 * 2**30, 99 * 2**30, "a"),
            fit.Record("NVIDIA H200", 101 * 2**30, 90 * 2**30, "b"),
        ],
    )
    assert (memory.total_bytes, memory.context_bytes) == (100 * 2**30, 2**30 + KERNELS_LATER)
    assert memory.usable_bytes == 99 * 2**30 - KERNELS_LATER


def test_the_runs_directory_comes_from_iteragpu_runs_dir_as_for_the_other_stages(tmp_path):
    path = prediction(tmp_path, *PREDICT)
    copy_run(tmp_path / "runs", LARGE_RUN)
    env = {**os.environ, "ITERAGPU_RUNS_DIR": str(tmp_path / "runs")}
    h200 = next(
        row for row in fit_json(str(path), "--days", "3", env=env)["rows"] if row["gpu"] == "h200"
    )
    assert h200["memory_basis"] == "measured"
    (tmp_path / "empty").mkdir()
    env["ITERAGPU_RUNS_DIR"] = str(tmp_path / "empty")
    h200 = next(
        row for row in fit_json(str(path), "--days", "3", env=env)["rows"] if row["gpu"] == "h200"
    )
    assert h200["memory_basis"] == "vendor figure"


def test_when_nothing_holds_the_peak_on_one_gpu_it_says_so(tmp_path):
    path = prediction(
        tmp_path,
        "estimate",
        "--phases",
        "--batch",
        "64",
        "--context",
        "1000000",
        "--width",
        "1024",
        "--json",
    )
    (tmp_path / "runs").mkdir()
    result = run_script("fit.py", str(path), "--days", "30", "--runs-dir", str(tmp_path / "runs"))
    assert (result.returncode, result.stderr) == (0, "")
    assert (
        "(the most for PyTorch: mi325x, 237.74 GiB, vendor figure); several GPUs sharing one "
        "peak is not modelled.\n"
    ) in result.stdout
    assert "No catalogue model holds " in result.stdout
    assert "  note: the prediction has no --library-block: the cuBLAS workspaces are left out" in (
        result.stdout
    )


@given(peak=st.integers(0, 300 * 2**30))
@example(peak=H200_USABLE)  # exactly the room there is: it fits
@example(peak=H200_USABLE + 1)
@example(peak=140_281_922_048 + 1)  # one byte over the vendor-figure H200
def test_one_gpu_holds_a_peak_exactly_when_peak_plus_context_fit_in_its_total(peak):
    catalogue = fit.load_catalogue(None)
    records = [fit.Record("NVIDIA H200", H200_TOTAL, H200_TOTAL - H200_AT_START, "run")]
    memory = fit.catalogue_memory(catalogue, records)
    need = fit.Need(peak, "prediction", "p.json", "", None)
    result = fit.fit(need, catalogue, memory, 7, 40)
    rows = {row["gpu"]: row for row in result["rows"]}
    assert rows["h200"]["fits"] == (peak + H200_AT_START + KERNELS_LATER <= H200_TOTAL)
    for row in rows.values():
        assert row["fits"] == (peak + row["context_room_bytes"] <= row["total_memory_bytes"])
        assert row["headroom_bytes"] == row["total_memory_bytes"] - row["context_room_bytes"] - peak
    fitting = [row for row in result["rows"] if row["fits"]]
    assert result["rows"][: len(fitting)] == fitting
    assert [row["total_cents"] for row in fitting] == sorted(row["total_cents"] for row in fitting)


BAD = [
    ("truncated", "not valid JSON (Expecting"),
    ("nan", "not valid JSON (NaN is not a JSON number)"),
    ("deep", "not valid JSON (nested too deeply)"),
    ("oom", "the run ended out_of_memory: its peak is what the GPU held when it stopped"),
    ("missing", "does not exist"),
    ("not-a-run", "neither a run folder, a sweep folder nor a prediction file"),
]


@pytest.mark.parametrize(("case", "message"), BAD, ids=[case for case, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, message):
    runs = tmp_path / "runs"
    source = copy_run(runs, ITS_OOM_POINT if case == "oom" else LARGE_RUN)
    data = (source / "measurement.json").read_bytes()
    if case == "truncated":
        (source / "measurement.json").write_bytes(data[: len(data) // 2])
    elif case == "nan":
        (source / "measurement.json").write_bytes(
            data.replace(b'"achieved_tflops": ', b'"x": NaN, "y": ')
        )
    elif case == "deep":
        (source / "measurement.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    elif case == "missing":
        source = tmp_path / "nowhere"
    elif case == "not-a-run":
        source = runs
    result = run_script("fit.py", str(source), "--days", "7", "--runs-dir", str(runs))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("fit.py: error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_runs_directory_that_does_not_exist_is_refused(tmp_path):
    folder = copy_run(tmp_path / "runs", LARGE_RUN)
    result = run_script("fit.py", str(folder), "--days", "7", "--runs-dir", str(tmp_path / "no"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"fit.py: error: {tmp_path / 'no'} is not an existing folder\n"


@pytest.mark.skipif(importlib.util.find_spec("nox") is None, reason="nox is not installed here")
def test_nox_fit_runs_the_stage_and_ends_with_its_exit_code(tmp_path):
    runs = tmp_path / "runs"
    folder = copy_run(runs, LARGE_RUN)
    python = outside_python(tmp_path)
    env = {**os.environ, "ITERAGPU_PYTHON": str(python), "ITERAGPU_RUNS_DIR": str(runs)}
    command = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "fit", "--"]
    done = subprocess.run(
        [*command, str(folder), "--days", "7"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith(
        "peak reserved 0.09 GiB (92,274,688 bytes, measured on NVIDIA H200)"
    )
    refused = subprocess.run(
        [*command, str(tmp_path / "nowhere"), "--days", "7"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert refused.returncode == 2
    assert (
        f"fit.py: error: {tmp_path / 'nowhere'} does not exist" in refused.stdout + refused.stderr
    )


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    folder = copy_run(tmp_path / "runs", LARGE_RUN)
    assert run_unread("fit.py", str(folder), "--days", "7") == (b"", 1)


# ---------------------------------------------------------------- the decoder workload


def test_a_decoder_run_is_fitted_from_its_measured_peak(tmp_path):

    folder = runfixtures.make_decoder_run(tmp_path / "runs", 1)
    result = run_script(
        "fit.py", str(folder), "--days", "7", "--json", "--runs-dir", str(tmp_path / "runs")
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["peak_reserved_bytes"] == 35651584
    assert answer["peak_basis"] == "measured"
    assert answer["configuration"] == (
        "decoder of 2 layers, width 64, 4/2 heads, vocab 1000, batch 2, prompt 16, "
        "new_tokens 4, dtype bfloat16"
    )
    assert answer["peak_measured_on_model"] == "h200"  # on every other model: a prediction


def test_a_decoder_prediction_says_it_is_one_and_when_nothing_fits(tmp_path):
    estimate = call_main(
        decoder.main,
        "estimate",
        "--preset",
        "llama-3.1-8b",
        "--batch",
        "256",
        "--prompt",
        "8192",
        "--new-tokens",
        "2",
        "--json",
    )
    assert estimate.returncode == 0, estimate.stderr
    prediction = tmp_path / "prediction.json"
    prediction.write_text(estimate.stdout)
    result = run_script("fit.py", str(prediction), "--days", "3", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    answer = run_script(
        "fit.py", str(prediction), "--days", "3", "--json", "--runs-dir", str(tmp_path)
    )
    assert json.loads(answer.stdout)["peak_measured_on_model"] is None
    headline, approximate, first = result.stdout.splitlines()[:3]
    assert headline.startswith("answer: no catalogue model holds ")
    assert approximate == (
        "  APPROXIMATE: the peak is a prediction that is not exact (the trace does not know "
        "aten.argmax, aten.linalg_vector_norm, aten.linear, aten.scaled_dot_product_attention, "
        "scaled_dot_product_attention; no bounds: the GPU may take another kernel or another way "
        "through the code than the trace at scaled_dot_product_attention): measure it before you "
        "rent"
    )
    assert first.startswith("peak reserved ")
    assert "bytes, prediction): prediction.json, llama-3.1-8b, batch 256, prompt 8192" in first
    assert "  note: predicted without a GPU calibration: the blocks each GPU's" in result.stdout
    assert "GiB on one GPU (the most for PyTorch: " in result.stdout
    assert "several GPUs sharing one peak is not modelled." in result.stdout


def test_an_out_of_memory_decoder_run_is_refused(tmp_path):

    folder = runfixtures.make_decoder_run(tmp_path, 1, memory_bytes=1_000_000)
    result = run_script("fit.py", str(folder), "--days", "7", "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert "the run ended out_of_memory: its peak is what the GPU held" in result.stderr


# ---------------------------------------------------------------- your own model


def fit_answer(capsys, *argv: str) -> dict:
    """fit.py --json in this process: its answer."""
    assert fit.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_own_model_run_is_fitted_from_its_measured_peak_and_names_its_prediction(
    tmp_path, capsys
):
    pytest.importorskip("torch")
    folder = runfixtures.make_own_model_run(tmp_path / "runs", 1)
    document = json.loads((folder / "measurement.json").read_bytes())
    capsys.readouterr()
    answer = fit_answer(capsys, str(folder), "--days", "7", "--runs-dir", str(tmp_path / "runs"))
    assert answer["peak_reserved_bytes"] == document["summary"]["largest_peak_reserved_bytes"]
    assert answer["peak_basis"] == "measured"
    assert answer["configuration"] == (
        "resnet_cnn.py:resnet (inference; image 16, width 8, stages 2, blocks 1, classes 10), "
        "batch 2, dtype float32"
    )
    assert answer["peak_measured_on_model"] == "h200"
    summary = document["summary"]["prediction"]
    unknown = ", ".join(entry["op"] for entry in document["prediction"]["unknown"])
    assert unknown
    assert (
        f"its traced prediction: approximate ({unknown}), off by "
        f"{summary['largest_abs_difference_reserved_bytes']:,} bytes at most on the reserved "
        f"counters, {summary['largest_abs_difference_allocated_bytes']:,} on the allocated ones"
    ) in answer["notes"]
    assert str(tmp_path) not in json.dumps(answer)


def test_an_own_model_prediction_that_is_approximate_says_so(tmp_path, capsys):
    from pipeline.measuring import own_model

    pytest.importorskip("torch")
    spec = f"{ROOT / 'pipeline' / 'workloads' / 'resnet_cnn.py'}:resnet"
    assert own_model.main(["estimate", "--workload", spec, "--batch", "2", "--json"]) == 0
    prediction = tmp_path / "own-prediction.json"
    prediction.write_text(capsys.readouterr().out)
    document = json.loads(prediction.read_text())
    answer = fit_answer(capsys, str(prediction), "--days", "3", "--runs-dir", str(tmp_path))
    assert answer["peak_basis"] == "prediction"
    assert answer["peak_reserved_bytes"] == document["prediction"]["largest_peak_reserved_bytes"]
    assert answer["peak_measured_on_model"] is None
    uncalibrated, note = answer["notes"]
    assert uncalibrated.startswith("predicted without a GPU calibration")
    first = document["prediction"]["unknown"][0]
    assert note.startswith(
        f"approximate, what the prediction does not know: {first['op']}: {first['why']}"
    )
    document["prediction"]["status"] = "not predicted"
    document["prediction"]["reason"] = "the trace itself failed (RuntimeError): not predicted"
    document["prediction"].update(
        phases=[], largest_peak_allocated_bytes=None, largest_peak_reserved_bytes=None
    )
    prediction.write_text(json.dumps(document))
    assert fit.main([str(prediction), "--days", "3", "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "fit.py: error: own-prediction.json: not predicted (the trace itself failed "
        "(RuntimeError): not predicted): no figure to fit; measure it instead\n"
    )


def test_a_failed_own_model_run_is_refused(tmp_path, capsys):
    pytest.importorskip("torch")
    workload = tmp_path / "failing.py"
    workload.write_text("def broken(config):\n    raise KeyError('no model')\n", encoding="utf-8")
    folder = tmp_path / "runs" / runfixtures.run_id(2)
    folder.mkdir(parents=True)
    assert runfixtures.own_model_run(folder, ["--workload", f"{workload}:broken"]) == 1
    capsys.readouterr()
    assert fit.main([str(folder), "--days", "7", "--runs-dir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == (
        f"fit.py: error: {folder / 'measurement.json'}: the workload's own code raised "
        "KeyError: a failed run is not a measurement\n"
    )


def answer_text(peak: int, approximate: str | None = None) -> tuple[dict, list[str]]:
    catalogue = fit.load_catalogue(None)
    records = [fit.Record("NVIDIA H200", H200_TOTAL, H200_TOTAL - H200_AT_START, "run")]
    memory = fit.catalogue_memory(catalogue, records)
    need = fit.Need(peak, "prediction", "p.json", "", None, approximate=approximate)
    result = fit.fit(need, catalogue, memory, 7, None)
    return result, fit.render(result).splitlines()


def test_thin_headroom_is_marginal_in_the_headline_and_its_row():
    """0.26 GiB over a vendor figure is no answer to rent on: the headline says so and names
    the cheapest model that holds the peak with room."""
    l4 = next(row for row in answer_text(1)[0]["rows"] if row["gpu"] == "l4")
    peak = l4["usable_memory_bytes"] - int(0.265 * GIB)
    result, lines = answer_text(peak)
    rows = {row["gpu"]: row for row in result["rows"]}
    assert rows["l4"]["marginal"]
    assert rows["l4"]["fits"]
    assert not rows["a6000"]["marginal"]
    assert lines[0] == (
        f"answer: l4 (1 GPU), $68.88 for 7 days, holds {fit.gib_up(peak)} GiB with 0.26 GiB "
        "headroom (vendor figure)"
    )
    margin = fit.gib_up(-(-peak // 20))  # 5% of the peak: over 1 GiB here
    assert lines[1].startswith(f"  MARGINAL: under {margin} GiB of headroom (the larger of 1 GiB")
    assert lines[1].endswith("the cheapest with room: a6000 (1 GPU), $90.72")
    assert any(line.startswith("  l4 ") and "0.26 GiB MARGINAL" in line for line in lines)


def test_headroom_of_at_least_the_margin_is_not_marginal():
    result, lines = answer_text(2**30)
    assert not any(row["marginal"] for row in result["rows"])
    assert not any("MARGINAL" in line for line in lines)
    peak = 100 * GIB  # 5% of it, 5 GiB, is the margin
    rows = {row["gpu"]: row for row in answer_text(peak)[0]["rows"]}
    assert rows["h200"]["headroom_bytes"] >= 5 * GIB
    assert not rows["h200"]["marginal"]
    squeezed = rows["h200"]["usable_memory_bytes"] - 5 * GIB + 1
    rows = {row["gpu"]: row for row in answer_text(squeezed)[0]["rows"]}
    assert rows["h200"]["marginal"] == (rows["h200"]["headroom_bytes"] < -(-squeezed // 20))


def test_an_approximate_prediction_says_so_in_the_headline(tmp_path):
    _, lines = answer_text(GIB, approximate="the trace does not know aten.foo")
    assert lines[1] == (
        "  APPROXIMATE: the peak is a prediction that is not exact (the trace does not know "
        "aten.foo): measure it before you rent"
    )
    path = prediction(tmp_path, "estimate", "--phases", "--width", "256", "--json")
    text = run_script("fit.py", str(path), "--days", "7", "--runs-dir", str(tmp_path)).stdout
    assert (
        "  APPROXIMATE: the peak is a prediction that is not exact (it leaves out the cuBLAS"
        in (text)
    )


def test_a_prediction_for_a_gpu_says_the_other_models_are_derived(tmp_path, capsys):
    """A prediction made with a GPU's calibration is that GPU's; fit says the peak on every
    other model is derived from it, not measured."""
    source = ROOT / "runs" / "20261203T214000Z-hf-zoo" / "builtins" / "cpu" / "linear-fp32.json"
    answer = fit_answer(capsys, str(source), "--days", "3", "--runs-dir", str(tmp_path))
    assert answer["peak_basis"] == "prediction"
    assert answer["peak_measured_on_model"] is None
    [note] = answer["notes"]
    assert note.startswith(
        "predicted for the GPU of its calibration, nvidia-h200-torch-2.11.0+cu130.json "
        "(sha256 11ef767d5f3f655e; NVIDIA H200, torch 2.11.0+cu130); on every other model "
        "the same peak is assumed, derived, not measured"
    )


def test_a_bounded_prediction_is_sized_by_its_upper_bound_and_shows_its_own_figure(
    tmp_path, capsys
):
    """The answer holds the upper bound; beside it, never as it, the cheapest model that
    would hold the prediction's own figure (a Llama-3.1-8B LoRA step, predicted for the H200,
    which measured it equal to the byte)."""
    source = (
        RUNS / "20261204T100000Z-hf-zoo-repredicted" / "cpu" / "llama-3.1-8b-lora-b2-s2048.json"
    )
    answer = fit_answer(capsys, str(source), "--days", "3", "--runs-dir", str(tmp_path))
    assert answer["peak_reserved_bytes"] == 96_198_459_392  # the largest upper bound
    point = answer["if_the_prediction_holds"]
    assert point["peak_reserved_bytes"] == 46_605_008_896  # the prediction's own peak
    held = [row for row in answer["rows"] if row["usable_memory_bytes"] >= 46_605_008_896]
    cheapest = min(held, key=lambda row: (row["total_cents"], row["gpu"]))
    assert (point["gpu"], point["total_cents"]) == (cheapest["gpu"], cheapest["total_cents"])
    assert answer["rows"][0]["gpu"] != point["gpu"]  # the bound asks for more
    assert fit.main([str(source), "--days", "3", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        f"  if the prediction itself holds (43.41 GiB, not a bound): {point['gpu']} (1 GPU)" in out
    )


def test_the_margin_and_the_fit_hold_at_their_boundaries_to_the_byte():
    """Headroom equal to the margin is not marginal, a byte less is; a peak equal to the
    usable memory fits, a byte more does not."""
    usable = next(r for r in answer_text(1)[0]["rows"] if r["gpu"] == "h200")["usable_memory_bytes"]
    peak = usable * 20 // 21  # where the headroom is about 5% of the peak: over 1 GiB
    while usable - peak > fit.margin_bytes(peak):
        peak += 1
    while usable - peak < fit.margin_bytes(peak):
        peak -= 1
    assert usable - peak == fit.margin_bytes(peak)
    row = lambda p: next(r for r in answer_text(p)[0]["rows"] if r["gpu"] == "h200")  # noqa: E731
    assert not row(peak)["marginal"]
    assert row(peak + 1)["marginal"]
    assert (row(usable)["fits"], row(usable)["marginal"]) == (True, True)
    assert not row(usable + 1)["fits"]
