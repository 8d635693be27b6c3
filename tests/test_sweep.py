"""sweep.py without a GPU: plans are checked before anything runs; a failed first point
leaves nothing behind; the committed H200 sweeps, replayed, stop where they stopped. (The
sweeps themselves ran on an H200: runs/*-sweep/; a real one runs in test_gpu_measure.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, RUNS, cuda_available, run_script
from hypothesis import given
from hypothesis import strategies as st

from kit import mesure_memoire
from pipeline.artefacts import validate
from pipeline.stages import sweep

PLANS = sorted((ROOT / "data" / "plans").glob("*.yaml"))
BENCH_SWEEP = ROOT / "tests" / "benchmarks" / "bench_sweep.py"
without_a_gpu = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or cuda_available(),
    reason="needs a torch that sees no GPU",
)
SMALL_SWEEP = ["--vary", "width", "--start", "8", "--factor", "2", "--max-steps", "3"]


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
        (
            "vary: width\nstart: 8\nfactor: .inf\nstop: {max_steps: 3}\n",
            ": factor inf: not a finite",
        ),
        ("vary: width\nstart: 8\nfactor: 1.0e+400\nstop: {max_steps: 3}\n", ": factor inf: not a"),
        ("vary: width\nstart: 8\nfactor: 1001\nstop: {max_steps: 3}\n", "greater than the maximum"),
        ("vary: width\nstart: 8\nfactor: .nan\nstop: {max_steps: 3}\n", ": factor nan: not a"),
        (
            "vary: width\nstart: 8\nfactor: 2\nstop: {memory_fraction: .nan}\n",
            ": stop.memory_fraction nan",
        ),
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
    ("bound", "factor", "message"),
    [
        ("--until-oom", "9" * 400, "argument --factor: expected a number > 1 and at most 1000, "
         "got '99999999999999999999... (400 characters)'"),
        ("--until-oom", "1001", "argument --factor: expected a number > 1 and at most 1000, got "
         "'1001'"),
        ("--memory-fraction=0.000", "2", "argument --memory-fraction: expected a fraction in "
         "(0, 1], got '0.000'"),
    ],
    ids=["infinite-factor", "absurd-factor", "zero-fraction"],
)  # fmt: skip
def test_non_finite_or_absurd_numbers_are_refused_up_front(tmp_path, bound, factor, message):
    """Refused before any point: a float that became infinity would crash the sweep after
    its first point, before that point's row and sweep.json are written."""
    argv = ["--vary", "width", "--start", "8", "--factor", factor, bound]
    result = run_script("sweep.py", "--device", "cuda:0", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == f"sweep.py: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


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


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cpu", "argument --device: expected a GPU device 'cuda' or 'cuda:N' (no CPU fallback)"),
        ("cuda:x", "argument --device: expected a GPU device 'cuda' or 'cuda:N'"),
    ],
)
def test_a_device_that_is_not_a_gpu_is_refused_as_measure_refuses_it(tmp_path, device, message):
    result = run_script("sweep.py", "--device", device, *SMALL_SWEEP, "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"sweep.py: error: {message}")
    assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_runs_folder_that_does_not_exist_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "no-such-runs"
    result = run_script("sweep.py", "--device", "cuda:0", *SMALL_SWEEP, "--runs-dir", str(missing))
    assert result.returncode == 2
    assert result.stderr == f"sweep.py: error: {missing} is not an existing folder\n"
    assert not missing.exists()


@pytest.mark.parametrize("flags", [[], ["--no-fork"]], ids=["forked", "fresh"])
def test_without_pytorch_the_sweep_is_one_line_and_exit_2(tmp_path, flags):
    """A Python whose `import torch` fails (here a stand-in package first on the path): the
    measurement's own one line, as `measure` gives it, and nothing written."""
    hidden = tmp_path / "hidden" / "torch"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**os.environ, "PYTHONPATH": str(hidden.parent)}
    argv = ["--device", "cuda:0", *SMALL_SWEEP, "--runs-dir", str(runs), *flags]
    result = run_script("sweep.py", *argv, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "mesure_memoire.py: error: PyTorch is not importable "
        "(ModuleNotFoundError: No module named 'torch')\n"
    )
    assert result.stdout.startswith("sweep of width on cuda:0: ")
    assert list(runs.iterdir()) == []


@without_a_gpu
def test_without_a_gpu_the_first_point_fails_in_one_line_and_leaves_nothing(tmp_path):
    result = run_script("sweep.py", "--device", "cuda:0", *SMALL_SWEEP, "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("mesure_memoire.py: error: no GPU is visible to PyTorch")
    assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_base_configuration_defaults_are_the_measurement_defaults():
    args = sweep.build_parser().parse_args(["--device", "cuda:0", *SMALL_SWEEP])
    plan = sweep.plan_from(args, validate.load_registry())
    assert plan["base"] == mesure_memoire.CONFIGURATION_DEFAULTS


@given(st.integers(1, 10**9), st.floats(1.0, 16.0, exclude_min=True))
def test_the_next_value_is_the_current_times_the_factor_rounded_up_and_at_least_one_more(
    current, factor
):
    following = sweep.next_value(current, factor)
    assert following >= current + 1
    assert following >= current * factor
    assert following == current + 1 or following - 1 < current * factor


class Done:
    """A finished process's child handle; it remembers being let go."""

    def __init__(self, code):
        self.code, self.waited = code, False

    def result(self):
        return self.code

    def wait(self):
        self.waited = True
        return self.code


class Replay:
    """Stands in for the launcher: each 'measurement' is the committed H200 file of the same
    configuration, so the sweep's own logic runs on CPU against real results. It checks the
    hand-over: each point is started after the previous point's child, which completed."""

    mode = sweep.launcher.FORKED  # as the real one, with its message

    def __init__(self, sweep_json, interrupt_at=None):
        summary = json.loads(sweep_json.read_text())
        self.by_config = {
            json.dumps(p["configuration"], sort_keys=True): RUNS / p["run"] / "measurement.json"
            for p in summary["points"]
        }
        self.children, self.argvs, self.interrupt_at = [], [], interrupt_at

    def start(self, argv, after=None, script=sweep.launcher.SCRIPT):
        assert script == "mesure_memoire.py"  # the seed network's points run the kit script
        assert after is (self.children[-1] if self.children else None)
        if after is not None:
            assert after.wait() == 0  # only a completed point is followed by another
        if len(self.children) + 1 == self.interrupt_at:
            raise KeyboardInterrupt
        self.argvs.append(argv)
        self.children.append(Done(self.run(argv)))
        return self.children[-1]

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
    return runner, runs_dir


def recorded_runs(runs_dir) -> list[str]:
    parsed, problems = validate.parse_log(
        (runs_dir / "resultats-bruts.csv").read_bytes(), validate.kit_header()
    )
    assert problems == []
    return [row["run_id"] for _, row in parsed]


@pytest.mark.parametrize(
    ("sweep_name", "plan", "values", "reason"),
    [
        (
            "20261202T113219Z-8f4a88-sweep",
            "context-until-oom",
            [128 * 4**k for k in range(9)],
            "the GPU ran out of memory at context 8388608",
        ),
        (
            "20261202T113230Z-a8d565-sweep",
            "batch-to-half-memory",
            [2**k for k in range(1, 14)],
            # the prediction for batch 16384 from the batch 8192 point's library blocks,
            # against the H200's 150109880320 bytes
            "the next point's predicted peak reserved, 72.06 GiB (77378617344 bytes), "
            "exceeds 0.5 of the GPU's memory (139.80 GiB)",
        ),
    ],
)
def test_the_h200_sweeps_replayed_stop_where_they_stopped(
    monkeypatch, tmp_path, sweep_name, plan, values, reason
):
    runner, runs_dir = replay(monkeypatch, tmp_path, sweep_name)
    plan_file = str(ROOT / "data" / "plans" / f"{plan}.yaml")
    assert sweep.main(["--device", "cuda:0", "--plan", plan_file, "--runs-dir", str(runs_dir)]) == 0
    [summary_file] = runs_dir.glob("*-sweep/sweep.json")
    summary = json.loads(summary_file.read_text())
    vary = summary["plan"]["vary"]
    points = summary["points"]
    assert summary["stopped_because"] == reason
    assert [p["configuration"][vary] for p in points] == values
    assert [p["status"] for p in points[:-1]] == ["completed"] * (len(values) - 1)
    # the sweep's own maxima over the predicted rows, against the measured peaks
    assert [p["predicted_peak_allocated_bytes"] for p in points] == [
        p["peak_allocated_bytes"] for p in points
    ]
    assert [p["predicted_peak_reserved_bytes"] for p in points] == [
        p["peak_reserved_bytes"] for p in points
    ]
    fitted = [p for p in points if p["status"] == "completed"][-1]
    assert summary["largest_fitted"] == fitted
    made = [p for p in runs_dir.iterdir() if p.is_dir() and p != summary_file.parent]
    assert [p["run"] for p in points] == recorded_runs(runs_dir)
    assert sorted(p["run"] for p in points) == sorted(folder.name for folder in made)
    assert all(child.waited for child in runner.children)
    assert validate.validate_json(summary_file.read_bytes(), validate.load_registry()) == []
    assert not list(runs_dir.glob(".*partial"))


def test_a_bounded_sweep_says_its_progress_and_ends_in_a_sentence(monkeypatch, tmp_path, capsys):
    """The committed 20-point width sweep (the measurement's defaults as base, --device cuda
    as chain takes it): its widths from the factor, one progress line per point in MiB,
    the step count, and a last line that reads."""
    runner, runs_dir = replay(monkeypatch, tmp_path, "20261202T125841Z-8537a8-sweep")
    argv = ["--device", "cuda", "--vary", "width", "--start", "8", "--factor", "1.2"]
    assert sweep.main([*argv, "--max-steps", "20", "--runs-dir", str(runs_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    [summary_file] = runs_dir.glob("*-sweep/sweep.json")
    summary = json.loads(summary_file.read_text())
    widths = [8, 10, 12, 15, 18, 22, 27, 33, 40, 48, 58, 70, 84, 101, 122, 147, 177, 213, 256, 308]
    assert [p["configuration"]["width"] for p in summary["points"]] == widths
    assert summary["device"] == "cuda:0"
    assert all(argv[argv.index("--device") + 1] == "cuda:0" for argv in runner.argvs)
    assert out[0] == "sweep of width on cuda:0: loading PyTorch, once for every point..."
    progress = [line for line in out if line.startswith("[")]
    assert len(progress) == 20
    assert progress[0].startswith(
        "[#...................] 1/20 width 8: completed, peak reserved 34.0 MiB "
        "(predicted 34.0 MiB), "
    )
    assert progress[0].split("; elapsed ")[1].endswith(" left")
    assert progress[-1].startswith(
        "[####################] 20/20 width 308: completed, peak reserved 54.0 MiB "
        "(predicted 54.0 MiB), "
    )
    assert progress[-1].endswith(", done")
    assert out[-1] == (
        "sweep of width: 20 points measured, largest that fitted width 308 at 54.0 MiB peak "
        f"reserved; stopped because --max-steps 20 was reached; summary in {summary_file}"
    )


def test_the_runs_folder_comes_from_the_environment_as_for_every_stage(
    monkeypatch, tmp_path, capsys
):
    """$ITERAGPU_RUNS_DIR without --runs-dir, as fit and report read it (runs/ before)."""
    _, runs_dir = replay(monkeypatch, tmp_path, "20261202T125841Z-8537a8-sweep")
    monkeypatch.setattr(sweep.run_folders, "RUNS", tmp_path / "not-runs")  # never runs/ here
    monkeypatch.setenv("ITERAGPU_RUNS_DIR", str(runs_dir))
    argv = ["--device", "cuda:0", "--vary", "width", "--start", "8", "--factor", "1.2"]
    assert sweep.main([*argv, "--max-steps", "2"]) == 0
    [summary_file] = runs_dir.glob("*-sweep/sweep.json")
    points = json.loads(summary_file.read_text())["points"]
    assert recorded_runs(runs_dir) == [point["run"] for point in points]
    assert not (tmp_path / "not-runs").exists()
    missing = tmp_path / "no-such-runs"
    monkeypatch.setenv("ITERAGPU_RUNS_DIR", str(missing))
    capsys.readouterr()
    assert sweep.main([*argv, "--max-steps", "2"]) == 2
    assert capsys.readouterr().err == f"sweep.py: error: {missing} is not an existing folder\n"
    assert not missing.exists()


def test_the_time_left_is_the_median_point_times_the_steps_left(capsys):
    """The first point also waited for PyTorch to load: it counts only while alone."""

    def point(seconds):
        return {
            "configuration": {"width": 64},
            "status": "completed",
            "peak_reserved_bytes": 77360801792,
            "predicted_peak_reserved_bytes": 2**21,
            "wall_seconds": seconds,
        }

    sweep.report_progress(1, 10, "width", [point(4.0)], 4.0)
    sweep.report_progress(3, 10, "width", [point(4.0), point(0.5), point(0.9)], 5.4)
    sweep.report_progress(3, None, "width", [point(4.0), point(0.5), point(0.9)], 5.4)
    assert capsys.readouterr().out.splitlines() == [
        "[##..................] 1/10 width 64: completed, peak reserved 72.05 GiB "
        "(predicted 2.0 MiB), 4.00 s; elapsed 4.0 s, about 36.0 s left",
        "[######..............] 3/10 width 64: completed, peak reserved 72.05 GiB "
        "(predicted 2.0 MiB), 0.90 s; elapsed 5.4 s, about 4.9 s left",
        "[3] width 64: completed, peak reserved 72.05 GiB (predicted 2.0 MiB), 0.90 s; "
        "elapsed 5.4 s, 0.70 s a point",
    ]


def test_ctrl_c_leaves_only_whole_runs_and_says_so(monkeypatch, tmp_path, capsys):
    runner, runs_dir = replay(
        monkeypatch, tmp_path, "20261202T113219Z-8f4a88-sweep", interrupt_at=3
    )
    plan_file = str(ROOT / "data" / "plans" / "context-until-oom.yaml")
    assert (
        sweep.main(["--device", "cuda:0", "--plan", plan_file, "--runs-dir", str(runs_dir)]) == 130
    )
    last_line = capsys.readouterr().out.splitlines()[-1]
    folders = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.endswith("-sweep")]
    assert len(folders) == 2  # the two points measured before Ctrl-C, each whole
    assert all((folder / "measurement.json").is_file() for folder in folders)
    log = runs_dir / "resultats-bruts.csv"  # the second is recorded after Ctrl-C: both are
    assert validate.main([str(log)]) == 0
    assert sorted(recorded_runs(runs_dir)) == sorted(folder.name for folder in folders)
    assert not list(runs_dir.glob(".*partial"))
    assert all(child.waited for child in runner.children)
    [summary_file] = runs_dir.glob("*-sweep/sweep.json")
    assert json.loads(summary_file.read_text())["stopped_because"] == sweep.INTERRUPTED
    assert last_line.startswith(
        "sweep of context: 2 points measured, largest that fitted context 512 at 74.0 MiB peak "
        "reserved; stopped because it was interrupted (Ctrl-C): every point listed is a whole "
        "run; summary in "
    )


# ------------------------------------------------------------------ the benchmark's own logic


# writes the summary a 3-point sweep would, the first point slow (it loads PyTorch)
OLDER_SWEEP = """import json, pathlib, sys
summary = pathlib.Path(sys.argv[sys.argv.index("--runs-dir") + 1]) / "x-sweep" / "sweep.json"
summary.parent.mkdir()
summary.write_text(json.dumps({"points": [{"wall_seconds": s} for s in (4.0, 0.5, 0.6)]}))
"""


def test_the_sweep_benchmark_alternates_new_and_old_and_gives_the_ratio(
    tmp_path, monkeypatch, capsys
):
    """The sweeps stand in with fixed figures: the order (new, old, new, old), the old
    pipeline run from a copy beside this repository's schemas and data, the medians of the
    points after the first, and new/old."""
    spec = importlib.util.spec_from_file_location("bench_sweep", BENCH_SWEEP)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    old = tmp_path / "old" / "pipeline"
    old.mkdir(parents=True)
    (old / "sweep.py").write_text(OLDER_SWEEP)
    assert bench.one_sweep(old, "cuda:0", 3, True)[1] == [0.5, 0.6]  # the first one left out
    order = []

    def one_sweep(pipeline, device, points, fork):
        name = "new" if pipeline == ROOT / "pipeline" else "old"
        if name == "old":
            assert (pipeline / "sweep.py").read_text() == OLDER_SWEEP
            assert (pipeline.parent / "schemas").resolve() == ROOT / "schemas"
        order.append((name, device, points, fork))
        return (10.0, [0.5, 0.4, 0.6]) if name == "new" else (12.5, [0.6, 0.5, 0.7])

    monkeypatch.setattr(bench, "one_sweep", one_sweep)
    monkeypatch.setattr(bench.gpu_guard, "require_gpu", lambda prog, device: None)
    argv = ["--baseline-pipeline", str(old), "--rounds", "2", "--points", "4"]
    assert bench.main(argv) == 0
    assert order == [("new", "cuda:0", 4, True), ("old", "cuda:0", 4, True)] * 2
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        "new: per point median 0.500 s over 6 points; whole sweeps [10.0, 10.0]",
        "old: per point median 0.600 s over 6 points; whole sweeps [12.5, 12.5]",
        "per point new/old 0.833 (target <= 1.1: met); whole new/old 0.800",
    ]


def test_a_baseline_named_relatively_keeps_its_own_schemas_and_data(tmp_path, monkeypatch):
    """`git archive OLD pipeline schemas data | tar -x -C old` then `--baseline-pipeline
    old/pipeline`: the copy's links must reach old/schemas and old/data, not dangle."""
    spec = importlib.util.spec_from_file_location("bench_sweep", BENCH_SWEEP)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name in ("pipeline", "schemas", "data"):
        (tmp_path / "old" / name).mkdir(parents=True)
    (tmp_path / "old" / "pipeline" / "sweep.py").write_text(OLDER_SWEEP)
    (tmp_path / "old" / "data" / "protocole-qualite.md").write_text("old protocol\n")
    (tmp_path / "scratch").mkdir()
    monkeypatch.chdir(tmp_path)
    copy = bench.baseline_tree(Path("old/pipeline"), tmp_path / "scratch")
    assert (copy.parent / "data" / "protocole-qualite.md").read_text() == "old protocol\n"
    assert (copy.parent / "schemas").resolve() == (tmp_path / "old" / "schemas").resolve()


@without_a_gpu
def test_the_sweep_benchmark_without_a_gpu_is_one_line_and_exit_2():
    result = subprocess.run(
        [sys.executable, str(BENCH_SWEEP), "--points", "2", "--forked-only"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (result.returncode, result.stdout) == (2, "")  # refused before it starts a sweep
    assert result.stderr == (
        "bench_sweep.py: error: no GPU is visible to PyTorch: this benchmark needs one and "
        "never uses the CPU\n"
    )
