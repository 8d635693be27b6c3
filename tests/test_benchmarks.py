"""The GPU benchmarks under tests/benchmarks/ on a machine without a GPU: the stages' up-front
guard, for them too. One line on stderr, exit 2, nothing written, nothing printed before it,
in seconds (not minutes of children failing one by one with tracebacks)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import gpu_guard
import pytest
from conftest import ROOT, cuda_available

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or cuda_available(),
    reason="needs a torch that sees no GPU",
)
BENCHMARKS = ROOT / "tests" / "benchmarks"
NO_GPU = "no GPU is visible to PyTorch: this benchmark needs one and never uses the CPU"
# script: its arguments, OUT standing for a new output folder
GPU_SCRIPTS = {
    "own_model_grid.py": ["--device", "cuda:0", "--output-dir", "OUT"],
    "prediction_grid.py": ["--device", "cuda:0", "--output-dir", "OUT"],
    "decoder_grid.py": ["--device", "cuda:0", "--output-dir", "OUT"],
    "equivalence_grid.py": ["OUT", "--device", "cuda:0"],
    "context_room.py": ["--device", "cuda:0", "--output-dir", "."],
    "bench_sweep.py": ["--device", "cuda:0", "--points", "2"],
}


def run(script: str, args: list[str], cwd):
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_a_gpu_benchmark_without_a_gpu_is_one_line_exit_2_and_writes_nothing(tmp_path, script):
    out = tmp_path / "out"
    args = [str(out) if arg == "OUT" else arg for arg in GPU_SCRIPTS[script]]
    result = run(script, args, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr[-2000:]
    assert result.stderr == f"{script}: error: {NO_GPU}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_device_the_machine_lacks_is_named(tmp_path):
    assert gpu_guard.gpu_problem("cuda:7") == NO_GPU
    assert gpu_guard.gpu_problem("cpu").startswith("argument --device: expected a GPU device")


def test_the_guard_says_when_there_is_no_pytorch(tmp_path):
    """A Python without PyTorch (here: isolated from the one that has it) is named."""
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    assert gpu_guard.gpu_problem("cuda:0", str(python)) == (
        f"no PyTorch in {python}: this benchmark measures on a GPU"
    )


def test_the_own_model_grid_exits_1_when_a_point_was_not_measured(tmp_path, monkeypatch):
    """Not exit 0 with '0/0 held': a point whose process wrote nothing (or failed) fails it."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "own_model_grid", BENCHMARKS / "own_model_grid.py"
    )
    grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grid)
    grid.ARGS = argparse.Namespace(device="cuda:0", output_dir=str(tmp_path / "out"), only="grid")
    entry = {"name": "resnet-small-bfloat16", "exit": 2, "stderr_tail": "no GPU"}
    monkeypatch.setattr(grid, "grid", lambda out: [entry])
    assert grid.main() == 1
    monkeypatch.setattr(
        grid, "grid", lambda out: [{"name": "x", "prediction": "exact", "held": True}]
    )
    grid.ARGS.output_dir = str(tmp_path / "again")
    assert grid.main() == 0
