"""Decoder sweeps without a GPU: each point a decoder.py run through the launcher, replayed from
synthesised measurements (runfixtures.decoder_measurement: each row as predicted, out of memory
past a limit); fit.py and report.py on such sweeps; the allocator settings a decoder file
carries. The GPU tests at the end run a real decoder sweep to out of memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import runfixtures
from conftest import run_script

from pipeline.artefacts import validate
from pipeline.predicting import gpu_calibration
from pipeline.stages import fit, report, sweep

REGISTRY = validate.load_registry()
EIGHT_B = ["--workload", "decoder", "--preset", "llama-3.1-8b", "--prompt", "2048"]
EIGHT_B += ["--new-tokens", "3", "--dtype", "bfloat16"]
BATCHES = ["--vary", "batch", "--start", "8", "--factor", "2"]


# ---------------------------------------------------------------- allocator settings


def test_a_decoder_file_at_the_default_allocator_settings_says_its_prediction_applies():
    document = runfixtures.decoder_measurement(runfixtures.TINY_DECODER)
    assert document["summary"]["prediction"]["applicable"] is True
    assert "not_applicable_because" not in document["summary"]["prediction"]
    assert validate.validate_document(document, REGISTRY) == []


def test_expandable_segments_void_a_decoder_prediction_and_the_file_says_why():
    allocator = dict(runfixtures.DEFAULT_ALLOCATOR, expandable_segments=True)
    document = runfixtures.decoder_measurement(runfixtures.TINY_DECODER, allocator=allocator)
    prediction = document["summary"]["prediction"]
    assert prediction["applicable"] is False
    assert prediction["not_applicable_because"] == (
        "allocator settings differ from the modelled defaults: expandable_segments=True"
    )
    assert validate.validate_document(document, REGISTRY) == []
    del prediction["not_applicable_because"]  # a void prediction must say why
    assert validate.validate_document(document, REGISTRY) != []


# ---------------------------------------------------------------- a decoder sweep, replayed


class Measured:
    """A finished point's child handle."""

    def __init__(self, code):
        self.code = code

    def result(self):
        return self.code

    def wait(self):
        return self.code


class DecoderReplay:
    """Stands in for the launcher: each point is the decoder measurement the H200 would write
    if it did as predicted (runfixtures.decoder_measurement), out of memory past its usable
    memory. It keeps the argv and script of every point."""

    mode = sweep.launcher.FORKED

    def __init__(self):
        self.started = []

    def start(self, argv, after=None, script="mesure_memoire.py"):
        self.started.append((script, list(argv)))
        assert argv[:3] == ["measure", "--device", "cuda:0"]
        output = Path(argv[argv.index("--output") + 1])
        flags = [a for i, a in enumerate(argv[3:], 3) if "--output" not in argv[i - 1 : i + 1]]
        document = runfixtures.decoder_measurement(flags)
        output.write_text(json.dumps(document, indent=2) + "\n")
        return Measured(3 if document["status"] == "out_of_memory" else 0)


def decoder_sweep(runs_dir: Path, argv: list[str]):
    """sweep.main on the replay; returns the replay and sweep.json's document and path."""
    runner = DecoderReplay()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep.launcher, "Launcher", lambda fork=True: runner)
        code = sweep.main(["--device", "cuda:0", *argv, "--runs-dir", str(runs_dir)])
    summaries = list(runs_dir.glob("*-sweep/sweep.json"))
    document = json.loads(summaries[0].read_text()) if summaries else None
    return code, runner, document, summaries[0] if summaries else None


def decoder_log_runs(runs_dir: Path) -> list[str]:
    data = (runs_dir / "resultats-decoder.csv").read_bytes()
    parsed, problems = validate.parse_log(data, validate.decoder_header())
    assert problems == []
    return [row["run_id"] for _, row in parsed]


# The tests that share the 8B sweep below run on one test process: its points' traces (a few
# seconds each) are then made once (runfixtures.predicted_on_h200 keeps them).
ONE_PROCESS = pytest.mark.xdist_group("decoder-8b-sweep")


@pytest.fixture(scope="module")
def oom_sweep(tmp_path_factory):
    """The 8B preset from batch 8, doubling until the H200 would run out of memory."""
    runs_dir = tmp_path_factory.mktemp("decoder-sweep") / "runs"
    runs_dir.mkdir()
    from contextlib import redirect_stdout
    from io import StringIO

    out = StringIO()
    with redirect_stdout(out):
        code, runner, summary, path = decoder_sweep(runs_dir, [*EIGHT_B, *BATCHES, "--until-oom"])
    return code, runner, summary, path, runs_dir, out.getvalue().splitlines()


@ONE_PROCESS
def test_a_decoder_sweep_runs_each_point_as_decoder_py_until_out_of_memory(oom_sweep):
    code, runner, summary, path, runs_dir, _ = oom_sweep
    assert code == 0  # an out-of-memory point ends a sweep normally
    points = summary["points"]
    assert [p["configuration"]["batch"] for p in points] == [8, 16, 32, 64, 128, 256, 512]
    assert [p["status"] for p in points] == ["completed"] * 6 + ["out_of_memory"]
    assert summary["stopped_because"] == "the GPU ran out of memory at batch 512"
    assert summary["largest_fitted"] == points[5]
    assert [script for script, _ in runner.started] == ["decoder.py"] * 7
    assert runner.started[0][1][5:] == [
        "--preset",
        "llama-3.1-8b",
        "--batch=8",
        "--prompt=2048",
        "--new-tokens=3",
        "--dtype=bfloat16",
        "--warmup=1",
        "--tokens-per-row=1",
    ]
    # each point whole, in its own folder, recorded in the decoder's log and nowhere else
    assert decoder_log_runs(runs_dir) == [p["run"] for p in points]
    assert all((runs_dir / p["run"] / "measurement.json").is_file() for p in points)
    assert not (runs_dir / "resultats-bruts.csv").exists()
    assert not list(runs_dir.glob(".*partial"))
    # predicted beside measured, the fixture's rows being the prediction itself
    assert [p["predicted_peak_reserved_bytes"] for p in points[:6]] == [
        p["peak_reserved_bytes"] for p in points[:6]
    ]
    assert validate.validate_json(path.read_bytes(), REGISTRY) == []


@ONE_PROCESS
def test_a_decoder_sweep_json_records_the_workload_and_the_decoder_configuration(oom_sweep):
    summary = oom_sweep[2]
    plan = summary["plan"]
    assert plan["workload"] == "decoder"
    assert plan["vary"] == "batch"
    assert plan["base"] == {
        "preset": "llama-3.1-8b",
        "shape": {
            "layers": 32,
            "width": 4096,
            "heads": 32,
            "kv_heads": 8,
            "head_dim": 128,
            "ffn": 14336,
            "vocab": 128256,
            "tie_embeddings": False,
            "qkv_bias": False,
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
        },
        "batch": 1,
        "prompt": 2048,
        "new_tokens": 3,
        "dtype": "bfloat16",
        "warmup": 1,
        "tokens_per_row": 1,
    }
    assert summary["points"][0]["configuration"] == dict(plan["base"], batch=8)


@ONE_PROCESS
def test_a_decoder_sweep_says_its_progress_and_ends_in_a_sentence(oom_sweep):
    out, path = oom_sweep[5], oom_sweep[3]
    assert out[0] == (
        "sweep of batch on cuda:0 (decoder llama-3.1-8b, bfloat16): "
        "loading PyTorch, once for every point..."
    )
    progress = [line for line in out if line.startswith("[")]
    assert len(progress) == 7
    assert progress[0].startswith(
        "[1] batch 8: completed, peak reserved 18.55 GiB (predicted 18.55 GiB), "
    )
    assert progress[-1].startswith("[7] batch 512: out of memory, peak reserved ")
    assert out[-1] == (
        "sweep of batch: 7 points measured, largest that fitted batch 256 at 121.24 GiB peak "
        "reserved; stopped because the GPU ran out of memory at batch 512; summary in "
        f"{path}"
    )


@ONE_PROCESS
def test_a_decoder_sweep_stops_before_a_point_predicted_too_large(tmp_path):
    """--memory-fraction 0.25 of the H200's 150109880320 bytes: batch 64's peak reserved, as
    `decoder.py estimate --gpu h200` predicts it, is over it. That prediction is approximate
    (cuDNN attention at batch 64 was never probed): the check takes its upper bound, as fit
    sizes an approximate prediction, never the central figure (41.74 GiB)."""
    argv = [*EIGHT_B, *BATCHES, "--memory-fraction", "0.25"]
    code, runner, summary, _ = decoder_sweep(tmp_path, argv)
    assert code == 0
    assert [p["configuration"]["batch"] for p in summary["points"]] == [8, 16, 32]
    assert summary["stopped_because"] == (
        "the next point's predicted peak reserved, 54.75 GiB (58787364864 bytes), "
        "exceeds 0.25 of the GPU's memory (139.80 GiB)"
    )
    assert len(runner.started) == 3


def test_on_a_gpu_without_a_calibration_the_stop_rule_says_once_it_cannot_predict(
    capsys, monkeypatch
):
    """--memory-fraction on a GPU the lab has no calibration for (an H100 here): the next
    point cannot be predicted before it starts; the sweep goes on, and says so once."""
    monkeypatch.setattr(sweep, "UNPREDICTED", set())
    environment = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "torch": {"version": "2.11.0+cu130"}}
    for _ in range(2):
        assert sweep.decoder_predicted_peak({}, environment) is None
    assert capsys.readouterr().err.splitlines() == [
        "sweep.py: --memory-fraction: no committed calibration for NVIDIA H100 80GB HBM3 with "
        "PyTorch 2.11.0+cu130, so no point is predicted before it starts: the sweep goes on "
        "until one does not fit"
    ]


def test_a_decoder_sweep_bounded_by_steps_stops_there(tmp_path):
    tiny = ["--workload", "decoder", *runfixtures.TINY_DECODER]
    argv = [*tiny, "--vary", "new-tokens", "--start", "2", "--factor", "3", "--max-steps", "3"]
    code, runner, summary, _ = decoder_sweep(tmp_path, argv)
    assert code == 0
    assert [p["configuration"]["new_tokens"] for p in summary["points"]] == [2, 6, 18]
    assert summary["stopped_because"] == "--max-steps 3 was reached"
    assert runner.started[0][1][5:12] == [
        "--layers=2",
        "--width=64",
        "--heads=4",
        "--kv-heads=2",
        "--ffn=160",
        "--vocab=1000",
        "--head-dim=16",
    ]
    assert decoder_log_runs(tmp_path) == [p["run"] for p in summary["points"]]


def test_a_decoder_sweep_stops_before_a_point_over_the_estimate_budget(tmp_path, monkeypatch):
    """Each point's prediction (its `measure`, the --memory-fraction check) traces
    layers x (new tokens + 1) layer passes: the sweep stops before one over the budget (here
    100, so that the test traces little), its earlier points whole and logged."""
    monkeypatch.setattr(sweep.decoder, "ESTIMATE_BUDGET", 100)
    tiny = ["--workload", "decoder", *runfixtures.TINY_DECODER]
    argv = [*tiny, "--vary", "new-tokens", "--start", "2", "--factor", "3", "--until-oom"]
    code, runner, summary, _ = decoder_sweep(tmp_path, argv)
    assert code == 0
    assert [p["configuration"]["new_tokens"] for p in summary["points"]] == [2, 6, 18]
    assert summary["stopped_because"] == (
        "the next point is not started: the prediction would trace 110 layer passes "
        "(2 layers x (54 new tokens + 1)), over the estimate budget of 100 (--estimate-budget)"
    )
    assert len(runner.started) == 3
    assert decoder_log_runs(tmp_path) == [p["run"] for p in summary["points"]]


# ---------------------------------------------------------------- refused before anything runs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [*EIGHT_B, "--vary", "context", "--start", "8", "--factor", "2", "--until-oom"],
            "argument --vary: invalid choice: 'context'",
        ),
        (
            [*EIGHT_B, "--layers", "2", *BATCHES, "--until-oom"],
            "--preset llama-3.1-8b takes no shape options (--layers)",
        ),
        (
            ["--workload", "decoder", "--layers", "2", *BATCHES, "--until-oom"],
            "give --preset NAME or all of the shape options: missing --width, --heads",
        ),
        (
            [*EIGHT_B, "--vary", "new-tokens", "--start", "1", "--factor", "2", "--until-oom"],
            "--new-tokens 1: the prefill makes the first token and --warmup 1 decode step(s)",
        ),
        (
            [*EIGHT_B, *BATCHES, "--until-oom", "--calibration", "c.json"],
            "unrecognized arguments: --calibration c.json",
        ),
        (
            [*EIGHT_B, "--vary", "batch", "--start", "8", "--factor", "2"],
            "give a bound: --until-oom, --max-steps K or --memory-fraction X",
        ),
        (
            [*EIGHT_B, "--context", "8", *BATCHES, "--until-oom"],
            "unrecognized arguments: --context 8",
        ),
        (
            [*EIGHT_B, "--vary", "new-tokens", "--start", "4000", "--factor", "2", "--until-oom"],
            "the prediction would trace 128032 layer passes (32 layers x (4000 new tokens + 1)), "
            "over the estimate budget of 5000 (--estimate-budget)",
        ),
    ],
)
def test_bad_decoder_sweep_flags_are_one_line_exit_2_and_nothing_runs(tmp_path, argv, message):
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("sweep.py: error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "vary: context\nbase: {preset: llama-3.1-8b, batch: 1, prompt: 8, new_tokens: 4, "
            "dtype: bfloat16, warmup: 1, tokens_per_row: 1}\n",
            "'context' is not one of",
        ),
        (
            "vary: batch\nbase: {preset: llama-3.1-8b, shape: {layers: 2, width: 64, heads: 4, "
            "kv_heads: 2, ffn: 160, vocab: 1000}, batch: 1, prompt: 8, new_tokens: 4, "
            "dtype: bfloat16, warmup: 1, tokens_per_row: 1}\n",
            "give a preset or a shape, not both",
        ),
        (
            "vary: batch\nbase: {preset: llama-9, batch: 1, prompt: 8, new_tokens: 4, "
            "dtype: bfloat16, warmup: 1, tokens_per_row: 1}\n",
            "invalid choice: 'llama-9'",
        ),
    ],
)
def test_a_bad_decoder_plan_is_one_line_exit_2(tmp_path, text, message):
    plan = tmp_path / "plan.yaml"
    plan.write_text("workload: decoder\nstart: 8\nfactor: 2\nstop: {until_oom: true}\n" + text)
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = ["--device", "cuda:0", "--workload", "decoder", "--plan", str(plan)]
    result = run_script("sweep.py", *argv, "--runs-dir", str(runs))
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert list(runs.iterdir()) == []


def test_a_network_plan_is_refused_for_the_decoder(tmp_path):
    plan = Path(__file__).resolve().parent.parent / "data" / "plans" / "context-until-oom.yaml"
    argv = ["--device", "cuda:0", "--workload", "decoder", "--plan", str(plan)]
    result = run_script("sweep.py", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == f"sweep.py: error: {plan}: a network plan, not --workload decoder\n"


def test_a_decoder_plan_runs_as_its_flags_would(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "workload: decoder\nvary: batch\nstart: 8\nfactor: 2\nstop: {max_steps: 2}\n"
        "base: {preset: llama-3.1-8b, batch: 1, prompt: 2048, new_tokens: 3, "
        "dtype: bfloat16, warmup: 1, tokens_per_row: 1}\n"
    )
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = ["--workload", "decoder", "--plan", str(plan)]
    code, runner, summary, _ = decoder_sweep(runs, argv)
    assert code == 0
    flags = runner.started[0][1][5:]
    runs2 = tmp_path / "runs2"
    runs2.mkdir()
    _, by_flags, summary2, _ = decoder_sweep(runs2, [*EIGHT_B, *BATCHES, "--max-steps", "2"])
    assert flags == by_flags.started[0][1][5:]
    assert summary["plan"]["base"] == summary2["plan"]["base"]


# ---------------------------------------------------------------- fit.py on a decoder sweep


@ONE_PROCESS
def test_fit_prices_a_decoder_sweep_by_its_largest_completed_point(oom_sweep, capsys):
    summary, path, runs_dir = oom_sweep[2], oom_sweep[3], oom_sweep[4]
    argv = [str(path.parent), "--days", "7", "--accepted-results", "40", "--json"]
    assert fit.main([*argv, "--runs-dir", str(runs_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["peak_reserved_bytes"] == summary["points"][5]["peak_reserved_bytes"]
    assert result["peak_reserved_bytes"] == 130182807552
    assert result["peak_basis"] == "measured"
    assert result["measured_on"] == "NVIDIA H200"
    assert result["configuration"] == (
        "its largest completed point, batch 256 "
        "(llama-3.1-8b, prompt 2048, new_tokens 3, dtype bfloat16)"
    )
    assert result["notes"][0] == (
        "the sweep stopped because the GPU ran out of memory at batch 512"
    )
    rows = {row["gpu"]: row for row in result["rows"]}
    # the H200's memory from the sweep's own seven runs; the 96 GB GH200's a vendor figure
    assert rows["h200"]["memory_basis"] == "measured"
    assert rows["h200"]["usable_memory_bytes"] == 150109880320 - 552402944 - 165675008
    assert rows["h200"]["fits"] is True
    assert rows["gh200"]["memory_basis"] == "vendor figure"
    assert rows["gh200"]["fits"] is False


# ---------------------------------------------------------------- report.py on a decoder sweep

H200_USABLE = 150109880320 - 552402944 - 165675008  # the sweep's runs, fit.py's rule
CATALOGUE_LINES = [
    ("a10, l4, rtx4090", "a10 / l4 / rtx4090: 21.68 GiB (vendor figure)"),
    ("rtx5090", "rtx5090: 29.13 GiB (vendor figure)"),
    ("a100-40", "a100-40: 36.58 GiB (vendor figure)"),
    ("a6000, l40s, rtx6000-ada", "a6000 / l40s / rtx6000-ada: 44.03 GiB (vendor figure)"),
    ("a100-80, h100", "a100-80 / h100: 73.83 GiB (vendor figure)"),
    ("gh200", "gh200: 88.73 GiB (vendor figure)"),
    ("h200", "h200: 139.13 GiB (measured)"),
    ("b200", "b200: 166.96 GiB (vendor figure)"),
    ("mi300x", "mi300x: 178.14 GiB (vendor figure)"),
    ("mi325x", "mi325x: 237.74 GiB (vendor figure)"),
]


@ONE_PROCESS
def test_a_decoder_sweeps_picture_draws_every_catalogue_models_usable_memory(oom_sweep, tmp_path):
    path, runs_dir = oom_sweep[3], oom_sweep[4]
    out = tmp_path / "report"
    assert report.main([str(path.parent), "--runs-dir", str(runs_dir), "--output", str(out)]) == 0
    assert (out / f"peaks-{path.parent.name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "report.json").read_text())
    assert [(line["gpu"], line["label"]) for line in summary["usable_memory_lines"]] == (
        CATALOGUE_LINES
    )
    h200 = [line for line in summary["usable_memory_lines"] if line["gpu"] == "h200"]
    assert h200[0]["usable_bytes"] == H200_USABLE
    assert validate.validate_json((out / "report.json").read_bytes(), REGISTRY) == []


@ONE_PROCESS
def test_the_lines_are_labelled_on_the_picture_and_the_out_of_memory_point_apart(oom_sweep):
    path, runs_dir = oom_sweep[3], oom_sweep[4]
    source = report.read_source(path.parent)
    records = list(fit.evidence(runs_dir, [source.need]).records.values())
    lines = report.catalogue_lines(fit.load_catalogue(None), records)
    figure = report.sweep_picture(source, records, lines)
    axes = figure.axes[0]
    texts = [text.get_text() for text in axes.texts]
    assert [label for _, label in CATALOGUE_LINES] == [t for t in texts if "GiB (" in t]
    dashed = sorted(
        round(line.get_ydata()[0], 2)
        for line in axes.lines
        if line.get_ls() == "--" and len(line.get_ydata())  # not the legend's sample
    )
    assert len(dashed) == len(CATALOGUE_LINES)
    assert dashed[6] == round(H200_USABLE / 2**30, 2)  # drawn at the height its label says
    assert (
        "out of memory at 512:\nneeds more than\n139.13 GiB\n(15.08 GiB held at the stop)" in texts
    )
    assert axes.get_ylim()[1] >= 237.74  # the highest line within the picture
    assert axes.get_title().startswith("Peak memory against batch: NVIDIA H200\n")
    assert "decoder llama-3.1-8b, prompt 2048, new_tokens 3, dtype bfloat16" in (
        axes.get_title().replace("\n", " ")
    )


# ---------------------------------------------------------------- on a GPU (marked `gpu`)

# One layer, a long prompt: memory grows with batch fast enough that batch x4 runs out of
# memory within four points on an H200 (predicted peaks 6.6, 24.6, 96.6 then 384.7 GiB).
OOM_SHAPE = ["--workload", "decoder", "--layers", "1", "--width", "1024", "--heads", "8"]
OOM_SHAPE += ["--kv-heads", "2", "--ffn", "4096", "--vocab", "131072", "--prompt", "4096"]
OOM_SHAPE += ["--new-tokens", "2", "--dtype", "bfloat16"]


@pytest.mark.gpu
@pytest.mark.gpu_whole
@pytest.mark.parametrize("fork", [[], ["--no-fork"]], ids=["forked", "fresh"])
def test_a_decoder_sweep_on_the_gpu_runs_to_out_of_memory(tmp_path, fork):
    argv = [*OOM_SHAPE, "--vary", "batch", "--start", "64", "--factor", "4", "--until-oom"]
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--runs-dir", str(tmp_path), *fork)
    assert result.returncode == 0, result.stderr
    [path] = tmp_path.glob("*-sweep/sweep.json")
    summary = json.loads(path.read_text())
    assert validate.validate_json(path.read_bytes(), REGISTRY) == []
    assert summary["plan"]["workload"] == "decoder"
    points = summary["points"]
    batches = [p["configuration"]["batch"] for p in points]
    assert batches == [64 * 4**k for k in range(len(points))]
    assert [p["status"] for p in points] == ["completed"] * (len(points) - 1) + ["out_of_memory"]
    assert summary["stopped_because"] == f"the GPU ran out of memory at batch {batches[-1]}"
    assert summary["largest_fitted"] == points[-2]
    assert result.stdout.splitlines()[-1].startswith(
        f"sweep of batch: {len(points)} points measured, largest that fitted batch "
        f"{batches[-2]} at "
    )
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and p != path.parent)
    assert folders == sorted(p["run"] for p in points)
    for point in points:
        data = (tmp_path / point["run"] / "measurement.json").read_bytes()
        assert validate.validate_json(data, REGISTRY) == []
        assert json.loads(data)["environment"]["process_start"].startswith(
            "fresh" if fork else "forked"
        )
    assert decoder_log_runs(tmp_path) == [p["run"] for p in points]
    assert validate.main([str(tmp_path / "resultats-decoder.csv")]) == 0
    assert not (tmp_path / "resultats-bruts.csv").exists()
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.gpu
@pytest.mark.gpu_whole
def test_a_decoder_sweep_on_the_gpu_stops_before_the_point_predicted_not_to_fit(
    tmp_path,
):
    argv = [*OOM_SHAPE, "--vary", "batch", "--start", "64", "--factor", "4"]
    argv += ["--memory-fraction", "0.5"]
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [path] = tmp_path.glob("*-sweep/sweep.json")
    summary = json.loads(path.read_text())
    environment = json.loads(next(tmp_path.glob("*/measurement.json")).read_text())["environment"]
    known = gpu_calibration.name_for(environment["gpu"]["name"], environment["torch"]["version"])
    if known is None:  # a GPU the lab cannot predict for: it goes on, and says so
        assert "no point is predicted before it starts" in result.stderr
        assert summary["stopped_because"].startswith("the GPU ran out of memory at batch ")
        return
    assert all(p["status"] == "completed" for p in summary["points"])
    assert summary["stopped_because"].startswith("the next point's predicted peak reserved, ")
    assert " exceeds 0.5 of the GPU's memory (" in summary["stopped_because"]
