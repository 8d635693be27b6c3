"""sweep.py without a GPU: plans are checked before anything runs; a failed first point
leaves nothing behind. (The sweeps themselves ran on an H200: runs/*-sweep/.)"""

from __future__ import annotations

import pytest
import sweep
import validate
from conftest import ROOT, run_script

PLANS = sorted((ROOT / "data" / "plans").glob("*.yaml"))


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_shipped_plans_are_valid(plan):
    loaded = sweep.load_plan(str(plan), validate.load_registry())
    assert loaded["vary"] in sweep.DIMENSIONS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vary: depth\nstart: 1\nfactor: 2\nstop: {until_oom: true}\n", "'depth' is not one of"),
        ("vary: width\nstart: 0\nfactor: 2\nstop: {until_oom: true}\n", "less than the minimum"),
        ("vary: width\nstart: 8\nfactor: 1\nstop: {max_steps: 3}\n", "less than or equal"),
        ("vary: width\nstart: 8\nfactor: 2\nstop: {}\n", "should be non-empty"),
        ("- a list\n", "a plan is a mapping"),
        ("vary: [unclosed\n", "cannot read the plan"),
    ],
)
def test_a_bad_plan_is_one_line_exit_2_and_nothing_runs(tmp_path, text, message):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        text
        if "base" in text or "list" in text or "[" in text
        else text + "base: {batch: 1, context: 1, width: 8, dtype: float32, warmup: 1, "
        "repeats: 1}\n"
    )
    runs = tmp_path / "runs"
    runs.mkdir()
    result = run_script(
        "sweep.py", "--device", "cuda:0", "--plan", str(plan), "--runs-dir", str(runs)
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert message in result.stderr
    assert list(runs.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--vary", "width", "--start", "8"],
        ["--vary", "width", "--start", "8", "--factor", "2"],
        ["--vary", "width", "--start", "8", "--factor", "1", "--until-oom"],
        ["--vary", "width", "--start", "8", "--factor", "2", "--memory-fraction", "1.5"],
        ["--vary", "heads", "--start", "8", "--factor", "2", "--until-oom"],
    ],
)
def test_bad_flags_are_refused(tmp_path, argv):
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("sweep.py: error: ")
    assert list(tmp_path.iterdir()) == []


def test_without_a_gpu_the_first_point_fails_and_leaves_nothing(tmp_path):
    pytest.importorskip("torch")
    result = run_script(
        "sweep.py",
        "--device",
        "cuda:0",
        "--vary",
        "width",
        "--start",
        "8",
        "--factor",
        "2",
        "--max-steps",
        "3",
        "--runs-dir",
        str(tmp_path),
    )
    assert result.returncode == 2
    assert "no GPU is visible" in result.stderr
    assert list(tmp_path.iterdir()) == []
