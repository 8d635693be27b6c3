"""report.py: pictures in a new folder of their own, never in the evidence; what they show.

The sources are committed H200 runs copied into a temporary runs directory: the larger proposed
run, the context sweep (it ran out of memory) and the 20-point width sweep.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import run_folders
from conftest import PIPELINE, RUNS, run_script

matplotlib = pytest.importorskip("matplotlib")
import cli  # noqa: E402
import fit  # noqa: E402
import report  # noqa: E402
import validate  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
LARGE_RUN = "20261202T112323Z-50900d"
CONTEXT_SWEEP = "20261202T113219Z-8f4a88-sweep"
ITS_LARGEST_POINT = "20261202T113227Z-29fdbe"
WIDTH_SWEEP = "20261202T125841Z-8537a8-sweep"
WIDTH_SWEEP_LAST_POINT = "20261202T125856Z-40be06"
H200_USABLE = 150_109_880_320 - 552_402_944 - 165_675_008


def runs_with(tmp_path, *run_ids) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    for run_id in run_ids:
        shutil.copytree(RUNS / run_id, runs / run_id)
    return runs


def snapshot(folder: Path) -> dict:
    return {p: (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def reports(runs: Path) -> list[Path]:
    return sorted(p for p in runs.iterdir() if p.name.endswith("-report"))


def test_pictures_go_into_a_new_report_folder_never_into_the_runs(tmp_path):
    runs = runs_with(tmp_path, LARGE_RUN, CONTEXT_SWEEP, ITS_LARGEST_POINT)
    before = snapshot(runs)
    argv = [str(runs / LARGE_RUN), str(runs / CONTEXT_SWEEP), "--days", "7"]
    result = run_script("report.py", *argv, "--accepted-results", "40", "--runs-dir", str(runs))
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    [folder] = reports(runs)
    assert run_folders.RUN_ID.fullmatch(folder.name.removesuffix("-report"))
    assert {p: b for p, b in snapshot(runs).items() if folder not in p.parents and p != folder} == (
        before
    )
    pictures = {f"memory-{LARGE_RUN}.png", f"peaks-{CONTEXT_SWEEP}.png", "cost-7d-40.png"}
    assert {p.name for p in folder.iterdir()} == {*pictures, "report.json"}
    for name in pictures:
        assert (folder / name).read_bytes().startswith(PNG)
    order = [f"memory-{LARGE_RUN}.png", f"peaks-{CONTEXT_SWEEP}.png", "cost-7d-40.png"]
    assert result.stdout.splitlines() == [
        f"{folder / name}: written" for name in [*order, "report.json"]
    ]


def test_report_json_names_each_source_and_picture_by_its_sha256(tmp_path):
    runs = runs_with(tmp_path, LARGE_RUN, CONTEXT_SWEEP, ITS_LARGEST_POINT)
    argv = [str(runs / CONTEXT_SWEEP), str(runs / LARGE_RUN), "--days", "7"]
    result = run_script("report.py", *argv, "--accepted-results", "40", "--runs-dir", str(runs))
    assert result.returncode == 0, result.stderr
    [folder] = reports(runs)
    document = json.loads((folder / "report.json").read_text())

    def sha(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    assert document["sources"] == [
        {
            "folder": CONTEXT_SWEEP,
            "file": "sweep.json",
            "sha256": sha(runs / CONTEXT_SWEEP / "sweep.json"),
        },
        {
            "folder": LARGE_RUN,
            "file": "measurement.json",
            "sha256": sha(runs / LARGE_RUN / "measurement.json"),
        },
    ]
    assert {p["file"]: p["sha256"] for p in document["pictures"]} == {
        p.name: sha(p) for p in folder.iterdir() if p.suffix == ".png"
    }
    assert {p["file"]: p["from"] for p in document["pictures"]}["cost-7d-40.png"] == [CONTEXT_SWEEP]
    assert document["cost"]["peak_reserved_bytes"] == 77_366_034_432  # the sweep's, the largest
    assert document["usable_memory_lines"] == [
        {
            "gpu": "NVIDIA H200",
            "usable_bytes": H200_USABLE,
            "label": "NVIDIA H200: 139.13 GiB usable by PyTorch = 139.80 GiB total - 0.67 GiB "
            "CUDA context (measured)",
        }
    ]
    assert str(tmp_path) not in (folder / "report.json").read_text()  # no path, no user name
    # `validate runs/` walks report folders too: their report.json must be an artefact.
    assert validate.validate_document(document, validate.load_registry()) == []


def test_the_report_folder_goes_under_iteragpu_runs_dir_or_into_a_new_output(tmp_path):
    runs = runs_with(tmp_path, LARGE_RUN)
    env = {**os.environ, "ITERAGPU_RUNS_DIR": str(runs)}
    result = run_script("report.py", str(runs / LARGE_RUN), env=env)
    assert result.returncode == 0, result.stderr
    [folder] = reports(runs)
    assert sorted(p.name for p in folder.iterdir()) == [f"memory-{LARGE_RUN}.png", "report.json"]
    result = run_script("report.py", str(runs / LARGE_RUN), "--output", str(tmp_path / "mine"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [
        f"memory-{LARGE_RUN}.png",
        "report.json",
    ]


@pytest.mark.parametrize("kind", ["folder", "file", "dangling-symlink", "run-folder"])
def test_an_output_that_exists_is_refused_and_left_as_it_was(tmp_path, kind):
    runs = runs_with(tmp_path, LARGE_RUN)
    output = {
        "folder": tmp_path / "out",
        "file": tmp_path / "out",
        "dangling-symlink": tmp_path / "out",
        "run-folder": runs / LARGE_RUN,
    }[kind]
    if kind == "folder":
        output.mkdir()
    elif kind == "file":
        output.write_bytes(b"earlier")
    elif kind == "dangling-symlink":
        output.symlink_to(tmp_path / "nowhere")
    before = snapshot(tmp_path)
    result = run_script("report.py", str(runs / LARGE_RUN), "--output", str(output))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"report.py: error: {output} already exists: a report goes into a new folder\n"
    )
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "nowhere").exists()


def bad_inputs(tmp_path, runs: Path, case: str) -> list[str]:
    run = runs / LARGE_RUN
    data = (run / "measurement.json").read_bytes()
    if case == "truncated":
        (run / "measurement.json").write_bytes(data[: len(data) // 3])
    elif case == "nan":
        nan = data.replace(b'"achieved_tflops": 14.504', b'"achieved_tflops": NaN')
        assert nan != data
        (run / "measurement.json").write_bytes(nan)
    elif case == "not-a-run":
        return [str(tmp_path)]
    elif case == "missing":
        return [str(tmp_path / "nowhere")]
    elif case == "twice":
        return [str(run), str(run)]
    return [str(run)]


COUNT = "must be a positive integer from 1 to 999999999999, got"
BAD = [
    ("days-alone", ["--days", "7"], "--days and --accepted-results go together"),
    ("zero-results", ["--accepted-results", "0"], f"argument --accepted-results: {COUNT} '0'"),
    ("zero-results-with-days", ["--days", "7", "--accepted-results", "0"], f"{COUNT} '0'"),
    (
        "bad-days",
        ["--days", "14", "--accepted-results", "4"],
        "argument --days: must be 3, 7 or 30",
    ),
    ("truncated", [], "measurement.json: not valid JSON (Expecting "),
    ("nan", [], "measurement.json: not valid JSON (NaN is not a JSON number)"),
    ("not-a-run", [], "neither a run folder nor a sweep folder"),
    ("missing", [], "nowhere does not exist"),
    ("twice", [], "two sources share a folder name: their pictures would too"),
]


@pytest.mark.parametrize(("case", "argv", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_exit_2_and_nothing_is_written(tmp_path, case, argv, message):
    runs = runs_with(tmp_path, LARGE_RUN)
    sources = bad_inputs(tmp_path, runs, case)
    before = snapshot(tmp_path)
    result = run_script("report.py", *sources, *argv, "--runs-dir", str(runs))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("report.py: error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert snapshot(tmp_path) == before


def test_a_name_taken_while_writing_leaves_none_of_this_calls_files(tmp_path):
    """Another process links a name in the new folder first: what this call wrote goes."""
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "b.png").symlink_to(tmp_path / "nowhere")
    with pytest.raises(cli.UsageError, match=r"b\.png: File exists: nothing was written"):
        report.write_all(folder, {"a.png": b"one", "b.png": b"two", "report.json": b"{}"})
    assert [p.name for p in folder.iterdir()] == ["b.png"]
    assert os.readlink(folder / "b.png") == str(tmp_path / "nowhere")


def test_help_and_usage_errors_need_no_matplotlib(tmp_path):
    """The picture library is imported when a picture is drawn, not before."""
    block = "import sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'report.py'; "
    run_main = (
        f"sys.path.insert(0, {str(PIPELINE)!r}); import report; raise SystemExit(report.main())"
    )
    helped = run_script_code(block + run_main, "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: report.py ")
    runs = runs_with(tmp_path, LARGE_RUN)
    drawn = run_script_code(block + run_main, str(runs / LARGE_RUN), "--runs-dir", str(runs))
    assert (drawn.returncode, drawn.stdout) == (2, "")
    assert drawn.stderr == (
        "report.py: error: matplotlib is not installed for this Python: python3 -m pip install "
        "matplotlib==3.11.2, or run nox -s report\n"
    )
    assert reports(runs) == []


def run_script_code(code: str, *argv: str):
    import subprocess

    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300
    )


# ---------------------------------------------------------------- what the pictures show


def source(runs: Path, name: str) -> report.Source:
    return report.read_source(runs / name)


def texts(figure) -> list[str]:
    return [t.get_text() for t in figure.findobj(matplotlib.text.Text)]


def test_peaks_of_the_context_sweep_keep_the_out_of_memory_point_off_the_curve(tmp_path):
    runs = runs_with(tmp_path, CONTEXT_SWEEP, ITS_LARGEST_POINT)
    sweep = source(runs, CONTEXT_SWEEP)
    figure = report.sweep_picture(sweep, list(fit.evidence(runs, [sweep.need]).records.values()))
    [axes] = figure.axes
    curves = {line.get_label(): line for line in axes.get_lines()}
    measured = curves["peak reserved (measured)"]
    assert list(measured.get_xdata()) == [128 * 4**k for k in range(8)]  # 8,388,608 is not on it
    oom = curves["out of memory: peak reserved when it stopped"]
    assert (list(oom.get_xdata()), oom.get_linestyle()) == ([8_388_608], "None")
    gpu = curves[
        "NVIDIA H200: 139.13 GiB usable by PyTorch = 139.80 GiB total - 0.67 GiB CUDA context "
        "(measured)"
    ]
    assert list(gpu.get_ydata()) == [H200_USABLE / 2**30] * 2
    assert "139.13 GiB usable by PyTorch" in texts(figure)
    assert "out of memory\nat 8,388,608:\n32.02 GiB\nreserved" in texts(figure)
    assert axes.get_title().startswith("Peak memory against context: NVIDIA H200\n")
    assert "{" not in axes.get_title()
    assert axes.get_ylabel() == "GiB (2^30 bytes): PyTorch allocator, this process"


def test_peaks_of_the_20_point_width_sweep_are_scaled_to_the_data(tmp_path):
    runs = runs_with(tmp_path, WIDTH_SWEEP, WIDTH_SWEEP_LAST_POINT)
    sweep = source(runs, WIDTH_SWEEP)
    figure = report.sweep_picture(sweep, list(fit.evidence(runs, [sweep.need]).records.values()))
    [axes] = figure.axes
    assert axes.get_ylabel() == "MiB (2^20 bytes): PyTorch allocator, this process"
    assert axes.get_yscale() == "linear"
    assert axes.get_ylim() == (0, 56_623_104 / 2**20 * 1.25)  # the largest peak, 54 MiB
    assert len(axes.get_lines()[0].get_xdata()) == 20
    assert (
        "far above this scale: NVIDIA H200: 139.13 GiB usable by PyTorch = 139.80 GiB total - "
        "0.67 GiB CUDA context (measured);\nthe largest peak here is 0.04% of it"
    ) in texts(figure)


def test_the_cost_picture_shows_values_source_and_that_prices_are_illustrative(tmp_path):
    runs = runs_with(tmp_path, CONTEXT_SWEEP, ITS_LARGEST_POINT)
    sweep = source(runs, CONTEXT_SWEEP)
    catalogue = fit.load_catalogue(None)
    memory = fit.catalogue_memory(
        catalogue, list(fit.evidence(runs, [sweep.need]).records.values())
    )
    figure = report.cost_picture(fit.fit(sweep.need, catalogue, memory, 7, 40), sweep.need)
    [axes] = figure.axes
    labels = [t.get_text() for t in axes.get_yticklabels()]
    assert labels == [
        "NVIDIA A100 80GB (memory: vendor)",
        "AMD Instinct MI300X (memory: vendor)",
        "NVIDIA GH200 Grace Hopper 96GB (memory: vendor)",
        "NVIDIA H100 SXM (memory: vendor)",
        "AMD Instinct MI325X (memory: vendor)",
        "NVIDIA H200 SXM (memory measured)",
        "NVIDIA B200 ×2 lot (memory: vendor)",
    ]
    values = [t.get_text() for t in axes.texts]
    assert values == [
        "$5.7540",
        "$8.4420",
        "$8.8620",
        "$9.6180",
        "$11.5500",
        "$14.2380",
        "$42.4200",
    ]
    assert figure.get_suptitle() == (
        "ILLUSTRATIVE PRICES, not IteraGPU's catalogue: do not budget with them"
    )
    assert f"from {CONTEXT_SWEEP}: its largest completed point" in axes.get_title()


def test_memory_picture_legend_has_human_names_outside_the_bars(tmp_path):
    runs = runs_with(tmp_path, LARGE_RUN)
    figure = report.run_picture(source(runs, LARGE_RUN))
    [axes] = figure.axes
    assert axes.get_legend() is None  # the legend is the figure's, below the axes
    [legend] = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "predicted by the allocator model",
        "allocated at the phase's start",
        "allocated at its end",
        "peak allocated",
        "reserved at the phase's start",
        "reserved at its end",
        "peak reserved",
    ]
    assert axes.get_title() == (
        f"Memory per phase: NVIDIA H200\nrun {LARGE_RUN}: batch 2, context 128, width 1024, float32"
    )


def test_a_prediction_that_does_not_apply_says_so_in_the_legend():
    """Measured on an H200 with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: reserved
    counters leave the model (8,388,608 bytes off), and the picture must not pass the black
    marks off as a prediction."""
    expandable = RUNS / "20261203T070426Z-pipeline-check" / "20261203T070431Z-974944"
    figure = report.run_picture(report.read_source(expandable))
    [legend] = figure.legends
    assert legend.get_texts()[0].get_text() == (
        "predicted by the allocator model (NOT APPLICABLE: allocator settings differ from "
        "the modelled defaults: expandable_segments=True)"
    )


def test_an_approximate_prediction_names_what_it_does_not_know_in_the_legend():
    """The decoder example's AdamW step in float32 on the H200: the prediction is approximate
    because the order of the segments' addresses moves its allocated counters."""
    run = RUNS / "20261203T131050Z-own-model-chain" / "20261203T131050Z-74623e"
    figure = report.run_picture(report.read_source(run))
    [legend] = figure.legends
    assert legend.get_texts()[0].get_text() == (
        "predicted by the allocator model (APPROXIMATE: segment address order)"
    )


def test_the_gpu_line_is_drawn_while_the_peaks_keep_two_fifths_of_the_axis(tmp_path):
    """The H200 sweep of 2026-12-03 peaks at 72.06 GiB, 52% of the 139.13 GiB usable: the
    line belongs on the axis, not in a note that says it is far above."""
    check = RUNS / "20261203T070426Z-pipeline-check"
    sweep_name = "20261203T070434Z-0ef94c-sweep"
    runs = tmp_path / "runs"
    shutil.copytree(check, runs)
    sweep = source(runs, sweep_name)
    figure = report.sweep_picture(sweep, list(fit.evidence(runs, [sweep.need]).records.values()))
    [axes] = figure.axes
    labels = [line.get_label() for line in axes.get_lines()]
    assert (
        "NVIDIA H200: 139.13 GiB usable by PyTorch = 139.80 GiB total - 0.67 GiB CUDA context "
        "(measured)"
    ) in labels
    assert not [t for t in texts(figure) if t.startswith("far above this scale")]
    assert axes.get_ylim()[1] > H200_USABLE / 2**30  # the axis reaches the line


DECODER_SWEEP = RUNS / "20261203T094114Z-decoder-sweep"


def test_a_decoder_run_draws_each_phase_once_and_its_token_rows_as_their_largest():
    """The H200's llama-3.1-8b batch-8 run has 126 decode rows: the picture shows decode 1,
    then one bar per counter of the largest over the other 125, measured and predicted."""
    folder = DECODER_SWEEP / "20261203T094114Z-588a67"
    document = json.loads((folder / "measurement.json").read_bytes())
    figure = report.run_picture(report.read_source(folder))
    [axes] = figure.axes
    labels = [t.get_text() for t in axes.get_xticklabels()]
    assert labels == [
        "model_load", "inputs_and_cache", "prefill", "warmup", "decode 1", "decode 2-126, largest"
    ]  # fmt: skip
    decode = [row for row in document["phases"] if row["phase"] == "decode"][1:]
    peak_reserved_bars = axes.containers[5]  # the sixth counter: peak reserved
    assert peak_reserved_bars[5].get_height() * report.GIB == pytest.approx(
        max(row["peak_reserved_bytes"] for row in decode), abs=1
    )
    assert axes.get_title().splitlines()[1] == (
        "run 20261203T094114Z-588a67: llama-3.1-8b, batch 8, prompt 2048, new_tokens 128, "
        "dtype bfloat16"
    )


def test_folded_rows_keep_the_largest_of_each_counter_on_each_side():
    values = [5, 2, 9, 7] + [1] * 10
    rows = [{"phase": "warm_step", **dict.fromkeys(report.COUNTERS, n)} for n in values]
    for n, row in enumerate(rows):
        row["predicted"] = dict.fromkeys(report.COUNTERS, 100 + (n % 3))
    cold = {**rows[0], "phase": "cold_step"}
    drawn, folded = report.drawn_rows([cold, *rows])
    assert folded
    assert [r["phase"] for r in drawn] == ["cold_step", "warm_step", "warm_step 2-14, largest"]
    assert drawn[1] is rows[0]
    assert {drawn[2][key] for key in report.COUNTERS} == {9}  # row 3's: not row 1's, nor 2's
    assert set(drawn[2]["predicted"].values()) == {102}  # row 3's prediction, not row 2's
    assert report.drawn_rows(rows[:12]) == (rows[:12], False)  # up to 12 rows: all drawn


def test_an_own_model_run_is_titled_by_its_file_function_and_dimensions(tmp_path):
    import runfixtures

    folder = runfixtures.make_own_model_run(tmp_path / "runs")
    figure = report.run_picture(report.read_source(folder))
    assert figure.axes[0].get_title().splitlines()[1] == (
        f"run {folder.name}: resnet_cnn.py:resnet, batch 2, blocks 1, classes 10, image 16, "
        "stages 2, width 8, float32"
    )
