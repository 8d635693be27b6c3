"""sweep.py without a GPU: plans are checked before anything runs; a failed first point
leaves nothing behind. (The sweeps themselves ran on an H200: runs/*-sweep/.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sweep
import validate
from conftest import ROOT, RUNS, run_script

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


class Done:
    """A finished process's handle."""

    def __init__(self, code):
        self.code = code

    def result(self):
        return self.code

    def wait(self):
        return self.code


class Replay:
    """Stands in for the launcher: each 'measurement' is the committed H200 file of the same
    configuration, so the sweep's own logic runs on CPU against real results."""

    mode = "replay of committed H200 runs"

    def __init__(self, sweep_json, interrupt_at=None):
        summary = json.loads(sweep_json.read_text())
        self.by_config = {
            json.dumps(p["configuration"], sort_keys=True): RUNS / p["run"] / "measurement.json"
            for p in summary["points"]
        }
        self.calls, self.interrupt_at = 0, interrupt_at

    def start(self, argv, after=None):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        if after is not None:
            assert after.wait() in (0, 3)  # the previous point's process has exited first
        return Done(self.run(argv))

    def run(self, argv):
        config = {name: argv[argv.index(f"--{name}") + 1] for name in sweep.SIZES}
        config = {k: (v if k == "dtype" else int(v)) for k, v in config.items()}
        source = self.by_config[json.dumps(config, sort_keys=True)]
        output = Path(argv[argv.index("--output") + 1])
        shutil.copyfile(source, output)
        return 3 if json.loads(source.read_text())["status"] == "out_of_memory" else 0


def replay(monkeypatch, tmp_path, sweep_name, interrupt_at=None):
    runner = Replay(RUNS / sweep_name / "sweep.json", interrupt_at)
    monkeypatch.setattr(sweep.launcher, "Launcher", lambda fork=True: runner)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    return runs_dir


@pytest.mark.parametrize(
    ("sweep_name", "plan", "reason"),
    [
        ("20261202T113219Z-8f4a88-sweep", "context-until-oom", "ran out of memory"),
        ("20261202T113230Z-a8d565-sweep", "batch-to-half-memory", "predicted peak reserved"),
    ],
)
def test_the_h200_sweeps_replayed_stop_where_they_stopped(
    monkeypatch, tmp_path, sweep_name, plan, reason
):
    runs_dir = replay(monkeypatch, tmp_path, sweep_name)
    plan_file = str(ROOT / "data" / "plans" / f"{plan}.yaml")
    assert sweep.main(["--device", "cuda:0", "--plan", plan_file, "--runs-dir", str(runs_dir)]) == 0
    [summary_file] = runs_dir.glob("*-sweep/sweep.json")
    summary = json.loads(summary_file.read_text())
    committed = json.loads((RUNS / sweep_name / "sweep.json").read_text())
    assert reason in summary["stopped_because"]
    keys = ("configuration", "status", "peak_allocated_bytes", "predicted_peak_allocated_bytes")
    assert [{k: p[k] for k in keys} for p in summary["points"]] == [
        {k: p[k] for k in keys} for p in committed["points"]
    ]
    assert (
        summary["largest_fitted"]["configuration"] == committed["largest_fitted"]["configuration"]
    )
    assert validate.validate_json(summary_file.read_bytes(), validate.load_registry()) == []
    assert validate.main([str(runs_dir / "resultats-bruts.csv")]) == 0
    assert not list(runs_dir.glob(".*partial"))


def test_ctrl_c_leaves_only_whole_runs_and_says_so(monkeypatch, tmp_path):
    runs_dir = replay(monkeypatch, tmp_path, "20261202T113219Z-8f4a88-sweep", interrupt_at=3)
    plan_file = str(ROOT / "data" / "plans" / "context-until-oom.yaml")
    assert (
        sweep.main(["--device", "cuda:0", "--plan", plan_file, "--runs-dir", str(runs_dir)]) == 130
    )
    folders = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.endswith("-sweep")]
    assert len(folders) == 2  # the two points measured before Ctrl-C, each whole
    assert all((folder / "measurement.json").is_file() for folder in folders)
    log = runs_dir / "resultats-bruts.csv"  # the second is recorded after Ctrl-C: both are
    assert validate.main([str(log)]) == 0
    assert len(log.read_text().splitlines()) == 3
    assert not list(runs_dir.glob(".*partial"))
    [summary_file] = runs_dir.glob("*-sweep/sweep.json")
    assert "interrupted" in json.loads(summary_file.read_text())["stopped_because"]
