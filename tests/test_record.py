"""record.py: one whole row per validated run, never twice, never torn, quality only under a
decided protocol. Every log lives in a pytest tmp dir, never in the real runs/."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import time
from fractions import Fraction

import pytest
import runfixtures
from conftest import run_script
from hypothesis import given
from hypothesis import strategies as st

from pipeline.artefacts import validate
from pipeline.stages import record

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


def test_the_same_measurement_under_another_folder_name_is_refused(tmp_path):
    runs = tmp_path / "runs"
    first = runfixtures.make_run(runs, 1)
    assert run_script("record.py", str(first)).returncode == 0
    log = runs / "resultats-bruts.csv"
    before = log.read_bytes()
    copy = runs / runfixtures.run_id(2)
    shutil.copytree(first, copy)
    result = run_script("record.py", str(copy))
    assert_refused(
        result,
        f"{log}: $.measurement_sha256: this measurement is already recorded, at line 2 "
        f"(run {first.name}): a measurement is recorded once; nothing appended",
    )
    assert log.read_bytes() == before


LOG_DAMAGE = [
    # (case, damage to a valid two-row log, what validate and record both say)
    ("run-twice", lambda b: b + b.splitlines(keepends=True)[1], "line 4: $.run_id"),
    (
        "foreign-row",
        lambda b: b + b",".join([b"x"] * 31) + b"\n",
        "line 4: $.accepted_results: 'x' does not match",
    ),
    ("nul-byte", lambda b: b.replace(b"NVIDIA H200", b"NVIDIA\0H200", 1), "line 2: $.gpu_name"),
    (
        "quoted-newline",
        lambda b: b.replace(b"NVIDIA H200", b'"NVIDIA\nH200"', 1),
        "line 3: $.gpu_name",
    ),
    ("blank-line", lambda b: b + b"\n", "line 4: 0 cells, expected 31"),
    ("cell-missing", lambda b: b.replace(b",1,16,64,", b",1,16,", 1), "line 2: 30 cells"),
    (
        "quoted-and-foreign",  # not plain: every row is read, the middle one is refused
        lambda b: b.replace(b"NVIDIA H200", b'"NVIDIA H200, SXM"', 1).replace(
            b",1,16,64,", b",0,16,64,", 1
        ),
        "line 2: $.batch",
    ),
    ("torn-last-line", lambda b: b[:-1], "$: the last line has no line end"),
]


@pytest.mark.parametrize(("case", "damage", "message"), LOG_DAMAGE, ids=[c[0] for c in LOG_DAMAGE])
def test_a_log_that_validate_rejects_is_never_appended_to(tmp_path, case, damage, message):
    runs = tmp_path / "runs"
    for n, fixture in ((1, "small"), (2, "oom")):
        assert run_script("record.py", str(runfixtures.make_run(runs, n, fixture))).returncode == 0
    log = runs / "resultats-bruts.csv"
    log.write_bytes(damage(log.read_bytes()))
    before = log.read_bytes()
    checked = run_script("validate.py", str(log))
    assert checked.returncode == 1
    assert f"{log}: {message}" in checked.stderr
    result = run_script("record.py", str(runfixtures.make_run(runs, 3, "large")))
    assert_refused(result, f"{log}: {message}")
    assert result.stderr.endswith("; nothing appended\n")
    assert log.read_bytes() == before


def test_a_log_with_quoted_cells_is_read_row_by_row_and_appended_to(tmp_path):
    """A GPU name with a comma is quoted by csv.writer: such a log is valid, and is checked
    row by row instead of at the speed of bytes."""
    runs = tmp_path / "runs"
    assert run_script("record.py", str(runfixtures.make_run(runs, 1))).returncode == 0
    log = runs / "resultats-bruts.csv"
    log.write_bytes(log.read_bytes().replace(b"NVIDIA H200", b'"NVIDIA H200, SXM"'))
    assert run_script("validate.py", str(log)).returncode == 0
    again = run_script("record.py", str(runs / runfixtures.run_id(1)))
    assert_refused(
        again, f"{log}: $.run_id: {runfixtures.run_id(1)} is already recorded, at line 2"
    )
    copy = runs / runfixtures.run_id(4)
    shutil.copytree(runs / runfixtures.run_id(1), copy)
    assert_refused(run_script("record.py", str(copy)), "this measurement is already recorded")
    folder = runfixtures.make_run(runs, 3, "large")
    result = run_script("record.py", str(folder))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{folder}: recorded in {log}, line 3\n"
    assert run_script("validate.py", str(log)).returncode == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda b: b.replace(
                b'"batch": 1,', b'"batch": ' + b"[" * 100_000 + b"]" * 100_000 + b",", 1
            ),
            "$: not valid JSON (nested too deeply)",
        ),
        (
            lambda b: b.replace(b'"seed": 0', b'"seed": NaN', 1),
            "$: not valid JSON (NaN is not a JSON number)",
        ),
        (
            lambda b: b.replace(b'"batch": 1,', b'"batch": 1.0,', 1),
            "$.configuration.batch: 1.0 is not of type 'integer'",
        ),
    ],
    ids=["100000-deep", "NaN", "batch-1.0"],
)
def test_a_measurement_validate_refuses_is_refused_with_its_words(tmp_path, change, message):
    """The same rules in both: the line validate.py prints is the line record.py prints."""
    folder = runfixtures.make_run(tmp_path / "runs")
    path = folder / "measurement.json"
    path.write_bytes(change(path.read_bytes()))
    checked = run_script("validate.py", str(path))
    assert checked.stderr == f"{path}: {message}\n"
    result = run_script("record.py", str(folder))
    assert result.returncode == 1
    assert result.stderr == (
        f"{path}: {message}\nrecord.py: {folder} does not validate: nothing appended\n"
    )
    assert not (tmp_path / "runs" / "resultats-bruts.csv").exists()


def test_a_folder_named_measurement_json_is_not_recorded(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    (folder / "measurement.json").unlink()
    (folder / "measurement.json").mkdir()
    result = run_script("record.py", str(folder))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{folder / 'measurement.json'}: $: a folder, not a file\n")
    assert not (tmp_path / "runs" / "resultats-bruts.csv").exists()


# ------------------------------------------------------------------ quality values

QUALITY = ["--useful-work", "400", "--accepted-results", "388", "--threshold-met", "yes"]


def test_quality_values_are_refused_while_the_shipped_protocol_is_blank(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    result = run_script("record.py", str(folder), *QUALITY)
    assert_refused(result, "the protocol's decisions are still blank (useful_unit,")
    assert not (tmp_path / "runs" / "resultats-bruts.csv").exists()


TOGETHER = "--useful-work, --accepted-results and --threshold-met go together"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (QUALITY[:2], TOGETHER),
        (QUALITY[2:], TOGETHER),
        (["--threshold-met", "no"], TOGETHER),
        (["--useful-work", "-1", *QUALITY[2:]], "argument --useful-work: expected an integer >= 0"),
        (["--accepted-results", "1e3"], "argument --accepted-results: expected an integer >= 0"),
        (["--threshold-met", "maybe"], "argument --threshold-met: invalid choice: 'maybe'"),
    ],
    ids=["work-only", "no-work", "met-only", "negative", "exponent", "maybe"],
)
def test_quality_values_that_do_not_go_together_are_refused(tmp_path, argv, message):
    """Refused before the protocol is read: the blank protocol that ships would refuse them
    too, with its own message, so the message is what shows which check said no."""
    folder = runfixtures.make_run(tmp_path / "runs")
    assert_refused(run_script("record.py", str(folder), *argv), message)
    assert not (tmp_path / "runs" / "resultats-bruts.csv").exists()


def test_quality_values_describe_one_run(tmp_path):
    folders = [str(runfixtures.make_run(tmp_path / "runs", n)) for n in (1, 2)]
    result = run_script("record.py", *folders, *QUALITY)
    assert_refused(result, "quality values describe one run: give one RUN_DIR")


def test_quality_values_under_a_decided_protocol_are_recorded_and_checked(tmp_path):
    repo = runfixtures.repo_copy(tmp_path)
    runs = repo / "runs"
    command, where = runfixtures.in_repo(repo, "pipeline.stages.record")
    good = subprocess.run(
        [*command, str(runfixtures.make_run(runs, 1)), *QUALITY],
        capture_output=True,
        text=True,
        **where,
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
        [*command, str(runfixtures.make_run(runs, 2)), *wrong],
        capture_output=True,
        text=True,
        **where,
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
from pipeline.artefacts import validate
from pipeline.core import cli
from pipeline.stages import record
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


def test_a_process_killed_while_creating_the_log_leaves_no_file(tmp_path):
    """The new log is written as an unnamed file, linked to its name once whole: a kill -9
    before that leaves no name at all (no .resultats-bruts.csv.*.tmp), and the next record
    creates the log afresh."""
    runs = tmp_path / "runs"
    folder = runfixtures.make_run(runs, 1)
    program = f"""
import os, sys, time
def stalled_fsync(fd):
    print("written, not yet linked", flush=True)
    time.sleep(600)
os.fsync = stalled_fsync
from pipeline.stages import record
record.main([{str(folder)!r}])
"""
    worker = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline() == "written, not yet linked\n"
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    assert sorted(path.name for path in runs.iterdir()) == [folder.name]
    result = run_script("record.py", str(folder))
    assert result.returncode == 0, result.stderr
    assert len(rows_of(runs / "resultats-bruts.csv")) == 1


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002, 0o077], ids=oct)
def test_a_new_log_follows_the_umask(tmp_path, umask):
    """One rule for every new file: mode 0666 less the umask, as pictures and the zip."""
    folder = runfixtures.make_run(tmp_path / "runs", 1)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.stages.record", str(folder)],
        capture_output=True,
        text=True,
        umask=umask,
    )
    assert result.returncode == 0, result.stderr
    log = tmp_path / "runs" / "resultats-bruts.csv"
    assert stat.S_IMODE(log.stat().st_mode) == 0o666 & ~umask
