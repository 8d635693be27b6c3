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
from conftest import RUNS, run_script

from pipeline.core import run_folders

matplotlib = pytest.importorskip("matplotlib")
from pipeline.artefacts import validate  # noqa: E402
from pipeline.core import cli  # noqa: E402
from pipeline.stages import fit, report  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def close_figures():
    """Tests that draw without report.png (which closes its figure) leave theirs open;
    closed after each, or pyplot warns past 20 and keeps them all in memory."""
    yield
    report.pyplot().close("all")


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
    records = list(
        fit.evidence(runs, [report.read_source(runs / CONTEXT_SWEEP).need]).records.values()
    )
    others = report.catalogue_lines(fit.load_catalogue(None), records)
    assert document["usable_memory_lines"] == [
        {
            "gpu": "NVIDIA H200",
            "usable_bytes": H200_USABLE,
            "label": "NVIDIA H200: 139.13 GiB usable by PyTorch = 139.80 GiB total - 0.67 GiB "
            "CUDA context (measured)",
        },
        *[line for line in others if line["gpu"] != "h200"],  # every other line drawn
    ]
    assert len(document["usable_memory_lines"]) == len(others)
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
    run_main = "from pipeline.stages import report; raise SystemExit(report.main())"
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
    oom = curves["out of memory: the point tried, at the memory it could not fit in"]
    assert (list(oom.get_xdata()), oom.get_linestyle()) == ([8_388_608], "None")
    assert list(oom.get_ydata()) == [H200_USABLE / 2**30]  # on the line it could not fit under
    gpu = curves[
        "NVIDIA H200: 139.13 GiB usable by PyTorch = 139.80 GiB total - 0.67 GiB CUDA context "
        "(measured)"
    ]
    assert list(gpu.get_ydata()) == [H200_USABLE / 2**30] * 2
    assert "139.13 GiB usable by PyTorch" in texts(figure)
    assert (
        "out of memory at 8,388,608:\nneeds more than\n139.13 GiB\n(32.02 GiB held at the stop)"
    ) in texts(figure)
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
    assert " ".join(figure.axes[0].get_title().splitlines()[1:]) == (  # wrapped to the width
        f"run {folder.name}: resnet_cnn.py:resnet, batch 2, blocks 1, classes 10, image 16, "
        "stages 2, width 8, float32"
    )


# ---------------------------------------------------------------- every sweep, read as a user

OWN_SWEEP_FOLDER = RUNS / "20261203T131539Z-own-model-sweep"
OWN_SWEEP = OWN_SWEEP_FOLDER / "20261203T131539Z-19e4e1-sweep"
DECODER_SWEEP_SUMMARY = DECODER_SWEEP / "20261203T094114Z-facc9f-sweep"
OWN_RUN = OWN_SWEEP_FOLDER / "20261203T131539Z-bbb316"  # the longest title: a user's model


def drawn_sweep(folder: Path, runs: Path):
    """The sweep's picture as report.py draws it, with the catalogue as plan() gives it."""
    sweep = report.read_source(folder)
    records = list(fit.evidence(runs, [sweep.need]).records.values())
    catalogue = report.catalogue_lines(fit.load_catalogue(None), records)
    if sweep.document["plan"].get("workload") == "decoder":
        figure = report.sweep_picture(sweep, records, catalogue)
    else:
        figure = report.sweep_picture(sweep, records, catalogue=catalogue)
    figure.canvas.draw()
    return figure, catalogue


SWEEPS = {
    "own-model": (OWN_SWEEP, OWN_SWEEP_FOLDER),
    "kit context": (RUNS / CONTEXT_SWEEP, RUNS),
    "decoder": (DECODER_SWEEP_SUMMARY, DECODER_SWEEP),
}


@pytest.mark.parametrize("kind", SWEEPS)
def test_every_sweep_draws_every_catalogue_gpu_it_reaches(kind):
    """Not the H200 alone: each catalogue model whose usable memory is on the axis is a line
    with its label, whatever the workload (the sweep's own GPU may stand for its model)."""
    figure, catalogue = drawn_sweep(*SWEEPS[kind])
    [axes] = figure.axes
    heights = {round(line.get_ydata()[0], 6) for line in axes.get_lines() if len(line.get_ydata())}
    shown = texts(figure)
    for line in catalogue:
        height = round(line["usable_bytes"] / 2**30, 6)
        assert height in heights or line["gpu"] == "h200", line["label"]
        assert line["label"] in shown or line["gpu"] == "h200", line["label"]  # the sweep's GPU
    assert len(catalogue) >= 9


@pytest.mark.parametrize(
    ("kind", "scale"), [("own-model", "linear"), ("decoder", "linear"), ("kit context", "log")]
)
def test_one_rule_for_the_axis_the_completed_peaks(kind, scale):
    """Linear unless the completed peaks span more than 30 times (the kit's context sweep:
    0.05 to 72 GiB); what a stopped point held never sets the scale (the own-model sweep's
    0.22 GiB at batch 256 made it logarithmic, unlike the decoder's)."""
    figure, _ = drawn_sweep(*SWEEPS[kind])
    assert figure.axes[0].get_yscale() == scale


@pytest.mark.parametrize("kind", SWEEPS)
def test_the_out_of_memory_mark_is_where_the_point_was_tried_and_its_label_inside(kind):
    """At the value tried, on the usable memory it did not fit in (above every completed
    peak), not at the few GiB held when it stopped; its label whole inside the axes."""
    folder, _ = SWEEPS[kind]
    document = json.loads((folder / "sweep.json").read_bytes())
    vary = document["plan"]["vary"]
    [tried] = [p for p in document["points"] if p["status"] == "out_of_memory"]
    figure, _ = drawn_sweep(*SWEEPS[kind])
    [axes] = figure.axes
    [mark] = [line for line in axes.get_lines() if line.get_marker() == "X"]
    assert list(mark.get_xdata()) == [tried["configuration"][vary]]
    sweep = report.read_source(folder)
    usable, _ = report.usable_line(
        sweep, list(fit.evidence(SWEEPS[kind][1], [sweep.need]).records.values())
    )
    assert list(mark.get_ydata()) == [usable / 2**30]
    assert usable / 2**30 == pytest.approx(139.13, abs=0.01)  # the H200's
    completed = [p["peak_reserved_bytes"] for p in document["points"] if p["status"] == "completed"]
    assert mark.get_ydata()[0] > max(completed) / 2**30
    low, high = axes.get_ylim()
    assert low < mark.get_ydata()[0] < high
    [label] = [t for t in axes.texts if t.get_text().startswith("out of memory at ")]
    inside = axes.get_window_extent()
    box = label.get_window_extent()
    assert inside.x0 <= box.x0
    assert box.x1 <= inside.x1
    assert inside.y0 <= box.y0
    assert box.y1 <= inside.y1


def test_the_six_counters_have_six_colours_a_reader_tells_apart():
    figure = report.run_picture(report.read_source(OWN_RUN))
    [axes] = figure.axes
    colours = [matplotlib.colors.to_hex(bars[0].get_facecolor()) for bars in axes.containers]
    assert len(colours) == 6
    assert len(set(colours)) == 6
    hues = [matplotlib.colors.rgb_to_hsv(matplotlib.colors.to_rgb(c))[0] for c in colours]
    assert len({round(h * 12) % 12 for h in hues}) >= 4  # not shades of two hues
    assert [bars[0].get_hatch() or "" for bars in axes.containers] == [""] * 3 + ["//"] * 3


@pytest.mark.parametrize("folder", [OWN_RUN, RUNS / LARGE_RUN], ids=lambda p: p.name)
def test_a_title_never_makes_the_picture_wider_than_the_figure(folder):
    figure = report.run_picture(report.read_source(folder))
    width = round(figure.get_figwidth() * report.DPI)
    figure.canvas.draw()
    assert figure.axes[0].title.get_window_extent().width <= figure.bbox.width
    data = report.png(figure)
    pad = round(2 * 0.1 * report.DPI)  # bbox_inches="tight" pads 0.1 inch each side
    assert int.from_bytes(data[16:20], "big") <= width + pad  # the PNG's own width (IHDR)
