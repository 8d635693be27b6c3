"""Sweeps of your own model: `sweep.py --workload FILE.py:FUNCTION --vary batch|DIMENSION`,
each point `own_model.py measure` through the launcher. On the CPU the points run in this
process with the CPU standing in for the GPU (runfixtures.host_gpu: zero counters) and a
workload that raises PyTorch's out-of-memory error past a batch, as a full GPU would; the GPU
test at the end sweeps a real example to out of memory."""

from __future__ import annotations

import hashlib
import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
import runfixtures
from conftest import ROOT, call_main, run_script

from pipeline.artefacts import validate
from pipeline.stages import sweep

REGISTRY = validate.load_registry()
FULL_AT = 16  # the stand-in GPU "runs out of memory" at this batch
WORKLOAD = f"""import torch
from pipeline.measuring.own_model import Workload


def mlp(config, *, width=8, depth=2):
    layers = [torch.nn.Linear(width, width) for _ in range(depth)]
    model = torch.nn.Sequential(*layers).to(config.device, config.dtype)

    def make_inputs():
        if config.batch * width >= {FULL_AT} * 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return torch.zeros(config.batch, width, device=config.device, dtype=config.dtype)

    return Workload(model, make_inputs)
"""


class Finished:
    def __init__(self, code: int) -> None:
        self.code = code

    def result(self) -> int:
        return self.code

    def wait(self) -> int:
        return self.code


class InProcess:
    """Stands in for the launcher: each point is own_model.main in this process on the CPU."""

    mode = sweep.launcher.FORKED

    def __init__(self) -> None:
        self.started: list[tuple[str, list[str]]] = []

    def start(self, argv, after=None, script="mesure_memoire.py"):
        from pipeline.measuring import own_model

        self.started.append((script, list(argv)))
        with redirect_stdout(StringIO()):
            return Finished(own_model.main(list(argv), gpu=runfixtures.host_gpu()))


def own_sweep(runs_dir: Path, argv: list[str]):
    runner = InProcess()
    out = StringIO()
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(out):
        patch.setattr(sweep.launcher, "Launcher", lambda fork=True: runner)
        code = sweep.main(["--device", "cuda:0", *argv, "--runs-dir", str(runs_dir)])
    summaries = list(runs_dir.glob("*-sweep/sweep.json"))
    document = json.loads(summaries[0].read_text()) if summaries else None
    return code, runner, document, out.getvalue().splitlines()


@pytest.fixture
def workload(tmp_path) -> Path:
    path = tmp_path / "user" / "my_model.py"
    path.parent.mkdir()
    path.write_text(WORKLOAD, encoding="utf-8")
    return path


@pytest.fixture
def runs(tmp_path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


def test_a_batch_sweep_of_a_workload_file_runs_own_model_until_out_of_memory(workload, runs):
    argv = ["--workload", f"{workload}:mlp", "--dim", "depth=3", "--dtype", "float32"]
    argv += ["--vary", "batch", "--start", "2", "--factor", "2", "--until-oom"]
    code, runner, summary, out = own_sweep(runs, argv)
    assert code == 0  # an out-of-memory point ends a sweep normally
    points = summary["points"]
    assert [p["configuration"]["batch"] for p in points] == [2, 4, 8, 16]
    assert [p["status"] for p in points] == ["completed"] * 3 + ["out_of_memory"]
    assert summary["stopped_because"] == "the GPU ran out of memory at batch 16"
    assert summary["largest_fitted"] == points[2]
    assert all(isinstance(p["predicted_peak_reserved_bytes"], int) for p in points[:-1])
    # the stand-in's error also stops the trace of the last point: not predicted, never 0
    assert points[-1]["predicted_peak_reserved_bytes"] is None
    assert [script for script, _ in runner.started] == ["own_model.py"] * 4
    assert runner.started[0][1][5:] == [
        "--workload", f"{workload}:mlp", "--batch", "2", "--dtype", "float32", "--warmup", "1",
        "--repeats", "2", "--seed", "0", "--dim", "depth=3", "--dim", "width=8",
    ]  # fmt: skip
    assert out[0] == "sweep of batch on cuda:0 (my_model.py:mlp, float32): loading PyTorch, " + (
        "once for every point..."
    )
    # every point whole and recorded in the own-model log, nothing in the others
    assert all((runs / p["run"] / "measurement.json").is_file() for p in points)
    parsed, problems = validate.parse_log(
        (runs / "resultats-own.csv").read_bytes(), validate.own_model_header()
    )
    assert problems == []
    assert [row["run_id"] for _, row in parsed] == [p["run"] for p in points]
    assert not (runs / "resultats-bruts.csv").exists()
    assert not (runs / "resultats-decoder.csv").exists()
    [path] = runs.glob("*-sweep/sweep.json")
    assert validate.validate_json(path.read_bytes(), REGISTRY) == []


def test_a_sweep_ends_before_a_point_over_the_most_own_model_takes(workload, runs, monkeypatch):
    """A batch past own_model.py's most (seen on an H100 that held 262,144 images: the next,
    4,194,304, was refused by own_model.py's command line and the sweep ended in an error)
    is not started: the sweep ends normally, saying why, with the points it measured."""
    from pipeline.measuring import own_model

    monkeypatch.setattr(own_model, "MAX_BATCH", 8)
    argv = ["--workload", f"{workload}:mlp", "--dtype", "float32"]
    argv += ["--vary", "batch", "--start", "2", "--factor", "2", "--until-oom"]
    code, runner, summary, _ = own_sweep(runs, argv)
    assert code == 0
    assert [p["configuration"]["batch"] for p in summary["points"]] == [2, 4, 8]
    assert [p["status"] for p in summary["points"]] == ["completed"] * 3
    assert summary["stopped_because"] == (
        "the next point is not started: batch 16 is over the most own_model.py takes (8)"
    )
    assert len(runner.started) == 3


def test_the_plan_names_the_workload_by_file_name_and_sha256_never_its_path(workload, runs):
    argv = ["--workload", f"{workload}:mlp", "--vary", "width", "--start", "8", "--factor", "2"]
    code, _, summary, _ = own_sweep(runs, [*argv, "--max-steps", "3"])
    assert code == 0
    plan = summary["plan"]
    assert plan["workload"] == "own"
    assert plan["vary"] == "width"
    assert plan["base"] == {
        "file": "my_model.py",
        "sha256": hashlib.sha256(workload.read_bytes()).hexdigest(),
        "function": "mlp",
        "dimensions": ["depth", "width"],
        "batch": 1, "dtype": "float32", "warmup": 1, "repeats": 2, "seed": 0,
        "width": 8, "depth": 2,
    }  # fmt: skip
    # batch 1 x width 8, 16, 32: the third is 4 x 8 rows wide, below the stand-in's limit
    assert [p["configuration"]["width"] for p in summary["points"]] == [8, 16, 32]
    assert summary["stopped_because"] == "--max-steps 3 was reached"
    assert (
        str(workload.parent)
        not in (runs / next(runs.glob("*-sweep")).name / "sweep.json").read_text()
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--vary", "height"], "--vary height: mlp has no such dimension (batch, width, depth)"),
        (["--vary", "batch", "--dim", "size=3"], "--dim size: mlp declares no such dimension"),
        (
            ["--vary", "batch", "--memory-fraction", "0.5"],
            "--memory-fraction: a workload file is predicted in the point's own process",
        ),
        (["--vary", "batch", "--plan", "x.yaml"], "--plan: a workload file is swept with --vary"),
    ],
)
def test_a_bad_own_model_sweep_is_one_line_exit_2_and_runs_nothing(workload, runs, extra, message):
    argv = ["--workload", f"{workload}:mlp", "--start", "2", "--factor", "2", *extra]
    if "--memory-fraction" not in extra and "--plan" not in extra:
        argv.append("--until-oom")
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--runs-dir", str(runs))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"sweep.py: error: {message}"), line
    assert list(runs.iterdir()) == []


def test_a_missing_workload_file_is_refused_before_anything_runs(tmp_path, runs):
    argv = ["--workload", f"{tmp_path / 'nope.py'}:mlp", "--vary", "batch", "--start", "2"]
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--factor", "2", "--until-oom",
                        "--runs-dir", str(runs))  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip() == f"sweep.py: error: --workload {tmp_path / 'nope.py'}: no such file"
    )
    assert list(runs.iterdir()) == []


# A published config (Llama-3.2-1B's) cut to two narrow layers, so that the CPU runs it.
SMALL_LLAMA = {
    **json.loads((ROOT / "tests" / "data" / "hf-configs" / "llama-3.2-1b.json").read_text()),
    "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "user" / "small-llama.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(SMALL_LLAMA), encoding="utf-8")
    return path


def test_a_hugging_face_config_is_swept_as_own_model_measures_it(config, runs):
    pytest.importorskip("transformers")
    argv = ["--hf-config", str(config), "--task", "generate", "--new-tokens", "3"]
    argv += ["--dtype", "float32", "--dim", "sequence=8"]
    argv += ["--vary", "sequence", "--start", "8", "--factor", "2", "--max-steps", "2"]
    code, runner, summary, out = own_sweep(runs, argv)
    assert code == 0, out
    assert runner.started[1][1][5:] == [
        "--hf-config", str(config), "--task", "generate", "--batch", "1", "--dtype", "float32",
        "--warmup", "1", "--repeats", "2", "--seed", "0",
        "--dim", "new_tokens=3", "--dim", "sequence=16",
    ]  # fmt: skip
    assert summary["plan"]["workload"] == "own"
    assert summary["plan"]["base"] == {
        "file": "small-llama.json",
        "sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "function": "generate",
        "dimensions": ["new_tokens", "sequence"],
        "batch": 1, "dtype": "float32", "warmup": 1, "repeats": 2, "seed": 0,
        "new_tokens": 3, "sequence": 8,
    }  # fmt: skip
    points = summary["points"]
    assert [p["configuration"]["sequence"] for p in points] == [8, 16]
    assert [p["status"] for p in points] == ["completed", "completed"]
    assert all(isinstance(p["predicted_peak_reserved_bytes"], int) for p in points)
    assert out[0].startswith("sweep of sequence on cuda:0 (small-llama.json:generate, float32)")
    for p in points:  # each point is own_model.py's measurement of that config
        document = json.loads((runs / p["run"] / "measurement.json").read_text())
        assert document["workload"]["file"] == "small-llama.json"
        assert document["configuration"]["dims"] == {
            "new_tokens": 3,
            "sequence": p["configuration"]["sequence"],
        }
    [path] = runs.glob("*-sweep/sweep.json")
    assert validate.validate_json(path.read_bytes(), REGISTRY) == []
    assert str(config.parent) not in path.read_text()


def test_a_config_swept_without_dtype_is_measured_in_the_configs_own(config, runs):
    pytest.importorskip("transformers")
    argv = ["--hf-config", str(config), "--dim", "sequence=8", "--vary", "batch"]
    code, runner, summary, _ = own_sweep(
        runs, [*argv, "--start", "1", "--factor", "2", "--max-steps", "1"]
    )
    assert code == 0
    assert SMALL_LLAMA["torch_dtype"] == "bfloat16"
    assert summary["plan"]["base"]["dtype"] == "bfloat16"
    flags = runner.started[0][1]
    assert flags[flags.index("--dtype") + 1] == "bfloat16"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workload", "decoder"], "--hf-config names the model: drop --workload decoder"),
        (["--task", "sing"], "argument --task: invalid choice: 'sing'"),
        (["--task", "lora", "--vary", "rank"], "--vary rank: lora has no such dimension"),
        (["--memory-fraction", "0.5"], "--memory-fraction: a workload file is predicted"),
    ],
)
def test_a_bad_hugging_face_sweep_is_one_line_exit_2_and_runs_nothing(config, runs, extra, message):
    argv = ["--hf-config", str(config), "--start", "2", "--factor", "2", *extra]
    if "--vary" not in extra:
        argv += ["--vary", "batch"]
    if "--memory-fraction" not in extra:
        argv.append("--until-oom")
    result = call_main(sweep.main, "--device", "cuda:0", *argv, "--runs-dir", str(runs))
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"sweep.py: error: {message}"), line
    assert list(runs.iterdir()) == []


def test_hugging_face_options_without_a_config_are_refused(workload, runs):
    argv = ["--workload", f"{workload}:mlp", "--task", "training", "--vary", "batch"]
    argv += ["--start", "2", "--factor", "2", "--until-oom", "--runs-dir", str(runs)]
    result = run_script("sweep.py", "--device", "cuda:0", *argv)
    assert result.returncode == 2
    assert result.stderr == (
        "sweep.py: error: --task, --new-tokens, --lora-rank and --gradient-checkpointing go "
        "with --hf-config\n"
    )
    assert list(runs.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.gpu_whole
def test_an_example_swept_on_the_gpu_runs_to_out_of_memory_predicted_at_every_point(tmp_path):
    """The ResNet-style example in bfloat16 on images of 64 x 64, its batch multiplied by 16
    from 4,096 until the GPU is full: a few points, each predicted. (At 32 x 32, 1,048,576
    images, the most own_model.py takes, fitted on an H100: the sweep stopped there.) At 64 x
    64 one activation of 1M images is 137 GB: no GPU here holds it."""
    spec = f"{ROOT / 'pipeline' / 'workloads' / 'resnet_cnn.py'}:resnet"
    argv = ["--workload", spec, "--dtype", "bfloat16", "--dim", "image=64"]
    argv += ["--vary", "batch", "--start", "4096", "--factor", "16", "--until-oom"]
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [path] = tmp_path.glob("*-sweep/sweep.json")
    assert validate.validate_json(path.read_bytes(), REGISTRY) == []
    summary = json.loads(path.read_text())
    points = summary["points"]
    assert [p["status"] for p in points] == ["completed"] * (len(points) - 1) + ["out_of_memory"]
    assert len(points) >= 2
    for p in points[:-1]:
        assert p["predicted_peak_reserved_bytes"] == p["peak_reserved_bytes"], p
    assert (tmp_path / "resultats-own.csv").is_file()


@pytest.mark.gpu
def test_a_hugging_face_config_swept_on_the_gpu_measures_each_point_within_its_prediction(
    tmp_path, config
):
    """The small Llama, training in bfloat16, its sequence doubled twice: each point measured
    by own_model.py on the GPU, predicted beside it, and held (exact, or within its bounds)."""
    pytest.importorskip("transformers")
    argv = ["--hf-config", str(config), "--task", "training", "--dtype", "bfloat16"]
    argv += ["--batch", "2", "--vary", "sequence", "--start", "64", "--factor", "2"]
    runs = tmp_path / "runs"
    runs.mkdir()
    result = run_script(
        "sweep.py", "--device", "cuda:0", *argv, "--max-steps", "3", "--runs-dir", str(runs)
    )
    assert result.returncode == 0, result.stderr
    [path] = runs.glob("*-sweep/sweep.json")
    assert validate.validate_json(path.read_bytes(), REGISTRY) == []
    points = json.loads(path.read_text())["points"]
    assert [p["configuration"]["sequence"] for p in points] == [64, 128, 256]
    for p in points:
        document = json.loads((runs / p["run"] / "measurement.json").read_text())
        assert document["status"] == "completed"
        verdict = document["summary"]["prediction"]
        assert verdict["held"] is not False, verdict  # an exact claim holds to the byte
        assert verdict["bounds_held"] is not False, verdict


def test_fit_and_report_answer_for_an_own_model_sweep(workload, runs, tmp_path):
    from pipeline.stages import fit, report

    argv = ["--workload", f"{workload}:mlp", "--vary", "batch", "--start", "2", "--factor", "2"]
    assert own_sweep(runs, [*argv, "--until-oom"])[0] == 0
    [folder] = runs.glob("*-sweep")
    need = fit.need_of(folder)
    assert (
        need.what
        == "its largest completed point, batch 8 (my_model.py:mlp, depth 2, width 8, dtype float32)"
    )
    sweep_document = json.loads((folder / "sweep.json").read_text())
    assert report.fixed_text(sweep_document) == "my_model.py:mlp, depth 2, width 8, dtype float32"
