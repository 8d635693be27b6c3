"""mesure_memoire.py measure on a real GPU (marked `gpu`; skipped where none is visible),
and sweeps through the launcher's hand-over.

Each measurement runs in a fresh process: its own CUDA context and allocator counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_script

from kit import mesure_memoire
from pipeline.artefacts import validate
from pipeline.measuring import launcher

pytestmark = pytest.mark.gpu
REGISTRY = validate.load_registry()
SMALL = ["--batch", "1", "--context", "16", "--width", "64", "--dtype", "float32"]
SMALL += ["--warmup", "1", "--repeats", "2"]
LARGE = ["--batch", "2", "--context", "128", "--width", "1024", "--dtype", "float32"]
LARGE += ["--warmup", "3", "--repeats", "5"]
ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2}


def block(size: int) -> int:
    """The caching allocator counts every block rounded up to 512 bytes."""
    return -(-size // 512) * 512


def measure(tmp_path, argv, name="m.json", expect=0, env=None):
    out = tmp_path / name
    result = run_script(
        "mesure_memoire.py", "measure", "--device", "cuda:0", *argv, "--output", str(out), env=env
    )
    assert result.returncode == expect, result.stderr
    document = json.loads(out.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    return document


def option(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(
    "argv",
    [SMALL, LARGE, [*SMALL[:-5], "float16", *SMALL[-4:]], [*LARGE[:-5], "bfloat16", *LARGE[-4:]]],
    ids=["small-float32", "large-float32", "small-float16", "large-bfloat16"],
)
def test_the_documented_commands_give_the_phase_table_and_exact_weight_and_input_bytes(
    tmp_path, argv
):
    document = measure(tmp_path, argv)
    repeats = int(option(argv, "--repeats"))
    phases = document["phases"]
    assert document["status"] == "completed"
    assert [row["phase"] for row in phases] == [
        "model_load",
        "inputs",
        "cold_forward",
        "warmup",
        *["warm_forward"] * repeats,
    ]
    assert len(phases) == 4 + repeats  # --warmup 1 --repeats 2 gives six rows
    for row in phases:
        assert row["allocated_bytes"] <= row["reserved_bytes"]
        assert row["peak_allocated_bytes"] >= max(
            row["baseline_allocated_bytes"], row["allocated_bytes"]
        )
        assert row["peak_reserved_bytes"] >= max(
            row["baseline_reserved_bytes"], row["reserved_bytes"]
        )
        assert row["wall_time_ns"] > 0
        assert row["event_time_ns"] > 0
    width, size = int(option(argv, "--width")), ELEMENT[option(argv, "--dtype")]
    hidden = 4 * width
    weights = [hidden * width, hidden, width * hidden, width]
    load, inputs = phases[0], phases[1]
    assert load["baseline_allocated_bytes"] == 0
    assert load["allocated_bytes"] == sum(block(n * size) for n in weights)
    batch, context = int(option(argv, "--batch")), int(option(argv, "--context"))
    assert inputs["allocated_bytes"] - inputs["baseline_allocated_bytes"] == block(
        batch * context * width * size
    )
    env = document["environment"]
    assert env["gpu"]["available"] is True
    assert env["driver"]["tool"] == "nvidia-smi"
    assert env["driver"]["version"]
    assert document["summary"]["prediction"]["applicable"] is True
    for row in phases:  # the allocator model, to the byte, on every counter
        assert row["predicted"] == {key: row[key] for key in row["predicted"]}, row["phase"]


def test_allocator_settings_are_recorded_and_a_non_default_one_voids_the_prediction(tmp_path):
    """expandable_segments maps memory in place of new segments: the reserved counters no
    longer follow the model, and the file must say so rather than claim a prediction."""
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    document = measure(tmp_path, LARGE, env=env)
    settings = document["environment"]["gpu"]["allocator_settings"]
    assert settings["expandable_segments"] is True
    prediction = document["summary"]["prediction"]
    assert prediction["applicable"] is False
    assert prediction["not_applicable_because"] == (
        "allocator settings differ from the modelled defaults: expandable_segments=True"
    )
    default = measure(
        tmp_path,
        LARGE,
        name="default.json",
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
        },
    )
    assert default["environment"]["gpu"]["allocator_settings"]["expandable_segments"] is False
    assert default["summary"]["prediction"]["applicable"] is True
    assert [r["reserved_bytes"] for r in document["phases"]] != [
        r["reserved_bytes"] for r in default["phases"]
    ]


@pytest.mark.gpu_whole
def test_out_of_memory_is_recorded_with_exit_3(tmp_path):
    """An input far larger than any card: the inputs phase fails, the file says so."""
    document = measure(
        tmp_path, ["--batch", "1", "--context", "4000000000", "--width", "64"], expect=3
    )
    assert document["status"] == "out_of_memory"
    assert document["failure"]["phase"] == "inputs"
    assert "out of memory" in document["failure"]["error"]
    assert [row["phase"] for row in document["phases"]] == ["model_load"]


def test_a_second_run_never_replaces_the_first(tmp_path):
    measure(tmp_path, SMALL)
    before = (tmp_path / "m.json").read_bytes()
    again = run_script(
        "mesure_memoire.py",
        "measure",
        "--device",
        "cuda:0",
        *SMALL,
        "--output",
        str(tmp_path / "m.json"),
    )
    assert again.returncode == 2
    assert (tmp_path / "m.json").read_bytes() == before


def test_a_device_that_does_not_exist_is_refused(tmp_path):
    result = run_script(
        "mesure_memoire.py", "measure", "--device", "cuda:64", "--output", str(tmp_path / "m.json")
    )
    assert result.returncode == 2
    assert "does not exist" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_model_the_host_cannot_build_is_one_line_exit_2_not_a_traceback(tmp_path):
    """The host check is bypassed (as on a system that does not report its memory) so the
    CPU construction itself fails: the run ends in one line, and no measurement is written."""
    code = (
        "import sys, mesure_memoire as m; m.host_memory_available = lambda: None; "
        "raise SystemExit(m.main(sys.argv[1:]))"
    )
    out = tmp_path / "m.json"
    argv = ["measure", "--device", "cuda:0", "--width", "10000000000", "--output", str(out)]
    result = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT / "kit",
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        "mesure_memoire.py: error: --width 10000000000: the host could not build the model ("
    )
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ sweeps, through the launcher


def sweep_folders(runs_dir):
    """The sweep's summary and its run folders, with no half-written one left."""
    [summary_file] = runs_dir.glob("*-sweep/sweep.json")
    assert validate.validate_json(summary_file.read_bytes(), REGISTRY) == []
    assert not list(runs_dir.glob(".*"))
    runs = sorted(p for p in runs_dir.iterdir() if p.is_dir() and p != summary_file.parent)
    return json.loads(summary_file.read_text()), runs


def logged(runs_dir) -> list[dict]:
    parsed, problems = validate.parse_log(
        (runs_dir / "resultats-bruts.csv").read_bytes(), validate.kit_header()
    )
    assert problems == []
    return [row for _, row in parsed]


@pytest.mark.gpu_whole  # reads the GPU's free memory: no other process may hold any
def test_a_sweep_hands_each_point_over_to_the_next_through_the_real_launcher(tmp_path):
    """Four points, each a child forked while the previous one held its exit: every point is
    a whole, valid, forked run in the log, and each measured only once the previous process
    had gone (the GPU's free memory at its start does not hold the previous context)."""
    argv = ["--device", "cuda:0", "--vary", "width", "--start", "64", "--factor", "2"]
    result = run_script("sweep.py", *argv, "--max-steps", "4", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary, runs = sweep_folders(tmp_path)
    points = summary["points"]
    assert [p["configuration"]["width"] for p in points] == [64, 128, 256, 512]
    assert [p["status"] for p in points] == ["completed"] * 4
    assert summary["stopped_because"] == "--max-steps 4 was reached"
    assert summary["process_start"] == launcher.FORKED
    assert sorted(p["run"] for p in points) == [folder.name for folder in runs]
    assert [row["run_id"] for row in logged(tmp_path)] == [p["run"] for p in points]
    free = []
    for folder in runs:
        assert sorted(p.name for p in folder.iterdir()) == ["measurement.json"]
        document = json.loads((folder / "measurement.json").read_text())
        phases = [row["phase"] for row in document["phases"]]
        assert phases == [*mesure_memoire.FIXED_PHASES, "warm_forward", "warm_forward"]
        assert document["environment"]["process_start"] == launcher.FORKED
        free.append(document["environment"]["gpu"]["free_memory_bytes_at_start"])
    assert max(free) - min(free) < 256 * 2**20, free  # a CUDA context alone is more
    assert result.stdout.splitlines()[-1].startswith(
        "sweep of width: 4 points measured, largest that fitted width 512 at "
    )


@pytest.mark.gpu_whole
def test_a_sweep_that_runs_out_of_memory_records_that_point_and_exits_0(tmp_path):
    """Context 2**24 fits an H200 (about 40 GiB); 2**26 does not (its first pass needs about
    150 GiB): the second point is an out-of-memory result, recorded, and the sweep's end."""
    argv = ["--device", "cuda:0", "--vary", "context", "--start", str(2**24), "--factor", "4"]
    result = run_script("sweep.py", *argv, "--until-oom", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary, runs = sweep_folders(tmp_path)
    assert [p["status"] for p in summary["points"]] == ["completed", "out_of_memory"]
    assert summary["stopped_because"] == f"the GPU ran out of memory at context {2**26}"
    assert summary["largest_fitted"]["configuration"]["context"] == 2**24
    assert len(runs) == 2
    assert [row["status"] for row in logged(tmp_path)] == ["completed", "out_of_memory"]
