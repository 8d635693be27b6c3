"""merge.py: one log from many machines; rows re-validated, deduplicated, conflicts refused."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
import runfixtures
from conftest import run_script
from hypothesis import given
from hypothesis import strategies as st

from pipeline.artefacts import validate
from pipeline.stages import merge

FIXTURES = ("small", "large", "bf16", "oom")


def rows(*numbers: int) -> list[dict]:
    return [runfixtures.make_row(n, FIXTURES[n % 4]) for n in numbers]


def write_log(path, row_list):
    path.write_bytes(runfixtures.log_bytes(row_list))
    return path


def logged(path) -> list[dict]:
    parsed, problems = validate.parse_log(path.read_bytes(), validate.kit_header())
    assert problems == []
    return [row for _, row in parsed]


def test_logs_of_two_machines_become_one_sorted_log(tmp_path):
    a = write_log(tmp_path / "a.csv", rows(3, 1))
    b = write_log(tmp_path / "b.csv", rows(2, 3))
    before = a.read_bytes(), b.read_bytes()
    out = tmp_path / "team.csv"
    result = run_script("merge.py", str(a), str(b), "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{out}: 3 runs from 2 logs (4 rows read)\n"
    assert logged(out) == rows(1, 2, 3)
    assert (a.read_bytes(), b.read_bytes()) == before
    assert run_script("validate.py", str(out)).returncode == 0


def test_a_conflicting_duplicate_is_refused_and_nothing_is_written(tmp_path):
    changed = rows(2)[0] | {"largest_peak_reserved_bytes": "1"}
    a = write_log(tmp_path / "a.csv", rows(1, 2))
    b = write_log(tmp_path / "b.csv", [changed])
    out = tmp_path / "team.csv"
    result = run_script("merge.py", str(a), str(b), "--output", str(out))
    assert result.returncode == 1
    assert (
        f"{b}: line 2: $.run_id: {runfixtures.run_id(2)} differs from {a}: line 3" in result.stderr
    )
    assert not out.exists()


def test_every_row_is_validated_again(tmp_path):
    bad = rows(5)[0] | {"batch": "0"}
    a = write_log(tmp_path / "a.csv", rows(1))
    b = write_log(tmp_path / "b.csv", [*rows(4), bad])
    out = tmp_path / "team.csv"
    result = run_script("merge.py", str(a), str(b), "--output", str(out))
    assert result.returncode == 1
    assert f"{b}: line 3: $.batch: '0' does not match" in result.stderr
    assert not out.exists()


NOT_THE_HEADER = (
    "line 1: not the header of resultats-bruts.csv (nor the decoder log's, nor the own-model log's)"
)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"gpu,name\nb200,NVIDIA B200\n", NOT_THE_HEADER),  # the tariffs
        (b'{"schema": "x"}', NOT_THE_HEADER),
        (b"", NOT_THE_HEADER),
        (
            b"\x00\xff\xfe",
            "$: not UTF-8 ('utf-8' codec can't decode byte 0xff in position 1: invalid start byte)",
        ),
    ],
    ids=["tariffs", "json", "empty", "binary"],
)
def test_a_file_that_is_not_a_results_log_is_bad_input_in_one_line(tmp_path, content, why):
    """Exit 1 and two lines before (the file's error, then "nothing written")."""
    good = write_log(tmp_path / "a.csv", rows(1))
    other = tmp_path / "other.csv"
    other.write_bytes(content)
    out = tmp_path / "team.csv"
    result = run_script("merge.py", str(good), str(other), "--output", str(out))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"merge.py: error: {other}: {why}: not a results log\n"
    assert not out.exists()


def test_a_log_that_starts_with_a_byte_order_mark_is_refused_saying_so(tmp_path):
    """Refused, plainly: the pipeline never writes one, so a spreadsheet rewrote this log,
    and its rows are no longer known to be the ones recorded."""
    a = tmp_path / "a.csv"
    a.write_bytes(b"\xef\xbb\xbf" + runfixtures.log_bytes(rows(1)))
    out = tmp_path / "team.csv"
    result = run_script("merge.py", str(a), "--output", str(out))
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == (
        f"{a}: line 1: starts with a UTF-8 byte-order mark, which no log the pipeline writes "
        "has (a spreadsheet's 'CSV UTF-8' export adds it): save it as plain UTF-8"
    )
    assert "not the header" not in result.stderr
    assert not out.exists()


def test_a_dangling_link_as_output_is_refused_as_such(tmp_path):
    a = write_log(tmp_path / "a.csv", rows(1))
    out = tmp_path / "team.csv"
    out.symlink_to(tmp_path / "nowhere.csv")
    result = run_script("merge.py", str(a), "--output", str(out))
    assert result.returncode == 2
    assert result.stderr == (
        f"merge.py: error: {out} is a dangling symbolic link: a merge writes a new file only, "
        "never through a link\n"
    )
    assert out.is_symlink()
    assert not (tmp_path / "nowhere.csv").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "team.csv"]


def test_an_existing_output_is_refused_and_keeps_its_bytes(tmp_path):
    a = write_log(tmp_path / "a.csv", rows(1))
    out = tmp_path / "team.csv"
    out.write_bytes(b"earlier merge\n")
    result = run_script("merge.py", str(a), "--output", str(out))
    assert result.returncode == 2
    assert (
        result.stderr == f"merge.py: error: {out} already exists: a merge writes a new file only\n"
    )
    assert out.read_bytes() == b"earlier merge\n"


@pytest.mark.parametrize(
    "argv",
    [["missing.csv", "--output", "new.csv"], ["a.csv"], ["--output", "new.csv"]],
    ids=["missing-input", "no-output", "no-input"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv):
    write_log(tmp_path / "a.csv", rows(1))
    result = run_script("merge.py", *argv, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("merge.py: error: ")
    assert not (tmp_path / "new.csv").exists()


def test_a_copy_with_its_quality_columns_filled_wins(tmp_path):
    repo = runfixtures.repo_copy(tmp_path)
    protocol = repo / "data" / "protocole-qualite.md"
    empty = runfixtures.make_row(1, protocol=protocol)
    judged = empty | {"useful_work": "40", "accepted_results": "38", "threshold_met": "yes"}
    machine = write_log(
        tmp_path / "machine.csv", [empty, runfixtures.make_row(2, protocol=protocol)]
    )
    sheet = write_log(tmp_path / "sheet.csv", [judged])
    command, where = runfixtures.in_repo(repo, "pipeline.stages.merge")
    out = tmp_path / "team.csv"
    for order in ([machine, sheet], [sheet, machine]):
        out.unlink(missing_ok=True)
        argv = [*command, *map(str, order), "--output", str(out)]
        result = subprocess.run(argv, capture_output=True, text=True, **where)
        assert result.returncode == 0, result.stderr
        assert logged(out)[0] == judged
    other = write_log(tmp_path / "other.csv", [judged | {"accepted_results": "39"}])
    argv = [*command, str(sheet), str(other), "--output", str(tmp_path / "x.csv")]
    result = subprocess.run(argv, capture_output=True, text=True, **where)
    assert result.returncode == 1
    assert "differs from" in result.stderr


def test_quality_judged_under_a_blank_protocol_is_refused(tmp_path):
    judged = rows(1)[0] | {"useful_work": "40", "accepted_results": "38", "threshold_met": "yes"}
    a = write_log(tmp_path / "a.csv", [judged])
    result = run_script("merge.py", str(a), "--output", str(tmp_path / "team.csv"))
    assert result.returncode == 1
    assert "$.useful_work: the protocol's decisions are still blank" in result.stderr


QUALITY = {"useful_work": "10", "accepted_results": "10", "threshold_met": "yes"}


@given(
    copies=st.lists(
        st.tuples(st.integers(0, 11), st.booleans(), st.integers(0, 3)), min_size=1, max_size=30
    )
)
def test_merging_is_a_union_whatever_the_split_and_the_order(copies):
    """Each copy: (run, quality filled?, which log it lands in). The result holds each run
    once, sorted, and filled wherever any copy was filled, however the copies are spread."""
    base = {n: runfixtures.make_row(n, FIXTURES[n % 4]) for n in range(12)}
    logs = {i: [] for i in range(4)}
    for n, filled, where in copies:
        row = base[n] | QUALITY if filled else dict(base[n])
        logs[where].append((len(logs[where]) + 2, row))
    merged, conflicts = merge.merge_rows([(str(i), logs[i]) for i in logs])
    reordered, _ = merge.merge_rows([(str(i), logs[i]) for i in reversed(logs)])
    assert conflicts == []
    assert merged == reordered
    wanted = sorted({n for n, _, _ in copies})
    assert [row["run_id"] for row in merged] == [runfixtures.run_id(n) for n in wanted]
    for row, n in zip(merged, wanted, strict=True):
        filled = any(f for m, f, _ in copies if m == n)
        assert row == (base[n] | QUALITY if filled else base[n])


def test_one_measurement_under_two_run_ids_is_a_conflict(tmp_path):
    """The same measurement.json copied to another folder on another machine, and recorded
    there: two rows of one run, which only the SHA-256 shows."""
    copied = rows(2)[0] | {"run_id": runfixtures.run_id(7)}
    a = write_log(tmp_path / "a.csv", rows(1, 2))
    b = write_log(tmp_path / "b.csv", [copied])
    out = tmp_path / "team.csv"
    result = run_script("merge.py", str(a), str(b), "--output", str(out))
    assert result.returncode == 1
    assert result.stderr == (
        f"{b}: line 2: $.measurement_sha256: the measurement of run {runfixtures.run_id(2)} "
        f"({a}: line 3) under another run id\nmerge.py: nothing written to {out}\n"
    )
    assert not out.exists()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077], ids=oct)
def test_the_merged_log_follows_the_umask(tmp_path, umask):
    a = write_log(tmp_path / "a.csv", rows(1, 2))
    out = tmp_path / "team.csv"
    argv = [sys.executable, "-m", "pipeline.stages.merge", str(a), "--output", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, umask=umask)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_a_missing_input_is_named_in_plain_words(tmp_path):
    """Not Python's `[Errno 2] No such file or directory: '...'`."""
    missing = tmp_path / "absent.csv"
    result = run_script("merge.py", str(missing), str(missing), "--output", str(tmp_path / "m.csv"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"merge.py: error: {missing}: no such file or directory\n"
    assert list(tmp_path.iterdir()) == []
