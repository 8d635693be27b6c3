"""record.py: one whole row per validated run, never twice, never torn, quality only under a
decided protocol. Every log lives in a pytest tmp dir, never in the real runs/."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from fractions import Fraction

import pytest
import record
import runfixtures
import validate
from conftest import PIPELINE, run_script
from hypothesis import given
from hypothesis import strategies as st

REGISTRY = validate.load_registry()
H200 = runfixtures.H200


def rows_of(log) -> list[dict]:
    rows, problems = validate.parse_log(log.read_bytes(), validate.kit_header())
    assert problems == []
    return [row for _, row in rows]


def assert_refused(result, message: str) -> None:
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("record.py: error: ")
    assert message in result.stderr


# ------------------------------------------------------------------ the row


def test_a_real_h200_run_gives_its_row(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    result = run_script("record.py", str(folder))
    assert result.returncode == 0, result.stderr
    log = tmp_path / "runs" / "resultats-bruts.csv"
    assert result.stdout == f"{folder}: recorded in {log}, line 2\n"
    [row] = rows_of(log)
    assert row == {
        "run_id": folder.name,
        "measured_utc": "2026-12-02T10:33:33Z",
        "status": "completed",
        "failed_phase": "",
        "device": "cuda:0",
        "gpu_name": "NVIDIA H200",
        "driver_version": "580.159.04",
        "python_version": "3.12.3",
        "torch_version": "2.11.0+cu130",
        "cuda_build": "13.0",
        "hip_build": "",
        "batch": "1",
        "context": "16",
        "width": "64",
        "dtype": "float32",
        "warmup": "1",
        "repeats": "2",
        "seed": "0",
        "model_load_wall_ns": "19895016",
        "inputs_wall_ns": "10442633",
        "cold_forward_wall_ns": "89625118",
        "warmup_wall_ns": "332809",
        "warm_forward_median_wall_ns": "154539.5",
        "warm_forward_median_event_ns": "123376",
        "largest_peak_allocated_bytes": "34772480",
        "largest_peak_reserved_bytes": "35651584",
        "measurement_sha256": hashlib.sha256((H200 / "small.json").read_bytes()).hexdigest(),
        "protocol_sha256": hashlib.sha256(validate.PROTOCOL.read_bytes()).hexdigest(),
        "useful_work": "",
        "accepted_results": "",
        "threshold_met": "",
    }


def test_the_log_starts_from_the_kit_grid_which_stays_empty(tmp_path):
    grid = validate.KIT_GRID.read_bytes()
    folder = runfixtures.make_run(tmp_path / "runs", fixture="large")
    assert run_script("record.py", str(folder)).returncode == 0
    log = (tmp_path / "runs" / "resultats-bruts.csv").read_bytes()
    assert log.startswith(grid)
    assert log.count(b"\n") == 2
    assert validate.KIT_GRID.read_bytes() == grid
    assert grid.count(b"\n") == 1


def test_an_out_of_memory_run_is_recorded_as_what_it_is(tmp_path):
    runs = tmp_path / "runs"
    folders = [runfixtures.make_run(runs, n, name) for n, name in enumerate(["oom", "bf16"])]
    result = run_script("record.py", *map(str, folders))
    assert result.returncode == 0, result.stderr
    oom, bf16 = rows_of(runs / "resultats-bruts.csv")
    assert (oom["status"], oom["failed_phase"], oom["context"]) == (
        "out_of_memory",
        "inputs",
        "1000000000",
    )
    assert oom["model_load_wall_ns"] == "3232024"
    assert oom["inputs_wall_ns"] == oom["warm_forward_median_wall_ns"] == ""
    assert (oom["largest_peak_allocated_bytes"], oom["largest_peak_reserved_bytes"]) == (
        "132608",
        "2097152",
    )
    assert (bf16["dtype"], bf16["warm_forward_median_wall_ns"]) == ("bfloat16", "163805")


@given(times=st.lists(st.integers(0, 10**15), min_size=1, max_size=9))
def test_a_median_of_nanoseconds_is_written_exactly(times):
    """As mesure_memoire.py computes it (statistics.median), through JSON, into the log."""
    written = record.median_text(json.loads(json.dumps(statistics.median(times))))
    ordered = sorted(times)
    middle = len(ordered) // 2
    exact = Fraction(ordered[middle] + ordered[~middle], 2)
    if max(times) < 2**52:  # below this, a float holds every half exactly
        assert Fraction(written) == exact
    assert validate.re.fullmatch(r"(0|[1-9][0-9]*)(\.5)?", written)


# ------------------------------------------------------------------ refusals


def test_a_run_already_recorded_is_refused_and_the_log_stays(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    assert run_script("record.py", str(folder)).returncode == 0
    log = tmp_path / "runs" / "resultats-bruts.csv"
    before, stat = log.read_bytes(), log.stat()
    result = run_script("record.py", str(folder))
    assert_refused(
        result,
        f"{log}: $.run_id: {folder.name} is already recorded, at line 2: a run is recorded once",
    )
    assert log.read_bytes() == before
    assert log.stat().st_mtime_ns == stat.st_mtime_ns


def test_an_invalid_run_is_not_recorded(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    document = json.loads((folder / "measurement.json").read_bytes())
    document["phases"][2]["allocated_bytes"] = 10**9
    (folder / "measurement.json").write_text(json.dumps(document))
    result = run_script("record.py", str(folder))
    assert result.returncode == 1
    assert f"{folder / 'measurement.json'}: $.phases[2]: allocated_bytes" in result.stderr
    assert not (tmp_path / "runs" / "resultats-bruts.csv").exists()


def test_an_invalid_environment_file_stops_the_run_too(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    (folder / "environment.json").write_text('{"schema": "urn:iteragpu-lab:schema:environment:v1"}')
    result = run_script("record.py", str(folder))
    assert result.returncode == 1
    assert f"{folder / 'environment.json'}: $: 'tool' is a required property" in result.stderr
    assert not (tmp_path / "runs" / "resultats-bruts.csv").exists()


def test_a_measurement_file_of_another_kind_is_not_a_measurement(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    (folder / "measurement.json").write_bytes((H200 / "env.json").read_bytes())
    result = run_script("record.py", str(folder))
    assert result.returncode == 1
    assert (
        "$.schema: 'urn:iteragpu-lab:schema:environment:v1' is not a measurement" in result.stderr
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda runs: runs / "missing", "not a run folder"),
        (lambda runs: (runs / "my-run").mkdir() or runs / "my-run", "not a run folder"),
        (
            lambda runs: (runs / runfixtures.run_id(7)).mkdir() or runs / runfixtures.run_id(7),
            "no measurement.json",
        ),
    ],
    ids=["missing", "badly-named", "empty"],
)
def test_what_is_not_a_recordable_run_folder_is_refused(tmp_path, make, message):
    runs = tmp_path / "runs"
    runs.mkdir()
    result = run_script("record.py", str(make(runs)))
    assert_refused(result, message)
    assert not (runs / "resultats-bruts.csv").exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b.replace(b"run_id", b"id", 1), "not the header of resultats-bruts.csv"),
        (lambda b: b[:-10], "the last line has no line end"),
    ],
    ids=["other-header", "torn-last-line"],
)
def test_a_log_that_is_not_whole_is_never_appended_to(tmp_path, damage, message):
    runs = tmp_path / "runs"
    runfixtures.make_run(runs, 1)
    assert run_script("record.py", str(runs / runfixtures.run_id(1))).returncode == 0
    log = runs / "resultats-bruts.csv"
    log.write_bytes(damage(log.read_bytes()))
    before = log.read_bytes()
    result = run_script("record.py", str(runfixtures.make_run(runs, 2)))
    assert_refused(result, message)
    assert log.read_bytes() == before


# ------------------------------------------------------------------ quality values

QUALITY = ["--useful-work", "400", "--accepted-results", "388", "--threshold-met", "yes"]


def test_quality_values_are_refused_while_the_shipped_protocol_is_blank(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    result = run_script("record.py", str(folder), *QUALITY)
    assert_refused(result, "the protocol's decisions are still blank (useful_unit,")
    assert not (tmp_path / "runs" / "resultats-bruts.csv").exists()


@pytest.mark.parametrize(
    "argv",
    [QUALITY[:2], QUALITY[2:], ["--useful-work", "-1", *QUALITY[2:]], ["--threshold-met", "maybe"]],
    ids=["work-only", "no-work", "negative", "maybe"],
)
def test_quality_values_that_do_not_go_together_are_refused(tmp_path, argv):
    folder = runfixtures.make_run(tmp_path / "runs")
    assert run_script("record.py", str(folder), *argv).returncode == 2


def test_quality_values_under_a_decided_protocol_are_recorded_and_checked(tmp_path):
    repo = runfixtures.repo_copy(tmp_path)
    runs = repo / "runs"
    script = str(repo / "pipeline" / "record.py")
    good = subprocess.run(
        [sys.executable, script, str(runfixtures.make_run(runs, 1)), *QUALITY],
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stderr
    [row] = rows_of(runs / "resultats-bruts.csv")
    assert (row["useful_work"], row["accepted_results"], row["threshold_met"]) == (
        "400",
        "388",
        "yes",
    )
    assert (
        row["protocol_sha256"] == validate.Protocol(repo / "data" / "protocole-qualite.md").sha256
    )
    wrong = [*QUALITY[:4], "--threshold-met", "no"]  # 388/400 = 0.97 >= 0.95
    bad = subprocess.run(
        [sys.executable, script, str(runfixtures.make_run(runs, 2)), *wrong],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "$.threshold_met: 'no', but 388 accepted out of 400 meets" in bad.stderr
    assert len(rows_of(runs / "resultats-bruts.csv")) == 1


# ------------------------------------------------------------------ concurrency and crashes


def own_sha(run_id: str) -> str:
    """A measurement SHA-256 of the run's own: a log holds each measurement once."""
    return hashlib.sha256(run_id.encode()).hexdigest()


def appender(log, ids: list[str], forever: str = "") -> str:
    """A Python program appending the small run's row under each id (with a SHA-256 of its
    own); with `forever` (a time stamp), then under <forever>-000001, -000002... until it is
    killed. It says "ready" and waits for a file "go" beside the log, so that all workers
    start appending at once."""
    return f"""
import hashlib, json, sys, time
sys.path[:0] = [{str(PIPELINE)!r}]
import cli, record, validate
from pathlib import Path
data = Path({str(H200 / "small.json")!r}).read_bytes()
protocol, registry = validate.Protocol(), validate.load_registry()
row = record.build_row("", data, json.loads(data), protocol.sha256)
print("ready", flush=True)
while not Path({str(log.parent / "go")!r}).exists():
    time.sleep(0.001)
refused = 0
ids = {ids!r}
n = 0
while ids or {forever!r}:
    row["run_id"] = ids.pop(0) if ids else "{forever}-%06x" % (n := n + 1)
    row["measurement_sha256"] = hashlib.sha256(row["run_id"].encode()).hexdigest()
    try:
        record.append_row(Path({str(log)!r}), row, registry, protocol)
    except cli.UsageError:
        refused += 1
print(refused)
"""


def start(log, *programs: str) -> list[subprocess.Popen]:
    """Start the workers, wait until each is ready, then let them all go at once."""
    workers = [
        subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
        for program in programs
    ]
    assert [worker.stdout.readline() for worker in workers] == ["ready\n"] * len(workers)
    (log.parent / "go").touch()
    return workers


def test_eight_processes_append_four_hundred_whole_rows(tmp_path):
    log = tmp_path / "resultats-bruts.csv"
    ids = [[runfixtures.run_id(1000 * w + i) for i in range(50)] for w in range(8)]
    workers = start(log, *(appender(log, chunk) for chunk in ids))
    assert [w.communicate(timeout=240)[0] for w in workers] == ["0\n"] * 8
    lines = log.read_bytes().splitlines(keepends=True)
    assert len(lines) == 401
    expected = runfixtures.make_row(0)
    header = validate.kit_header()
    wanted = {
        record.csv_line(
            (expected | {"run_id": i, "measurement_sha256": own_sha(i)})[c] for c in header
        )
        for chunk in ids
        for i in chunk
    }
    assert set(lines[1:]) == wanted  # every row whole, each once: none interleaved
    assert validate.log_errors(log.read_bytes(), REGISTRY, validate.Protocol()) == []


def test_a_run_racing_itself_is_recorded_once(tmp_path):
    log = tmp_path / "resultats-bruts.csv"
    ids = [runfixtures.run_id(i) for i in range(25)]
    workers = start(log, *(appender(log, ids) for _ in range(4)))  # same order: most collisions
    refused = [int(w.communicate(timeout=240)[0]) for w in workers]
    assert sum(refused) == 75
    assert sorted(row["run_id"] for row in rows_of(log)) == ids


def test_a_process_killed_mid_append_leaves_a_valid_csv(tmp_path):
    log = tmp_path / "resultats-bruts.csv"
    for round_ in range(4):
        [worker] = start(log, appender(log, [], forever=f"20261202T0{round_}0000Z"))
        deadline = time.monotonic() + 60
        while (
            not log.exists() or log.read_bytes().count(b"\n") < 2
        ) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.2))
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        data = log.read_bytes()
        assert data.endswith(b"\n")
        assert validate.log_errors(data, REGISTRY, validate.Protocol()) == []
    assert len(rows_of(log)) >= 4
