"""report.py draws new pictures and never replaces one."""

from __future__ import annotations

import shutil

import pytest
from conftest import run_script
from runfixtures import H200

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"


def run_folder(tmp_path, name="large"):
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copyfile(H200 / f"{name}.json", folder / "measurement.json")
    return folder


def test_a_run_gets_its_memory_and_cost_pictures(tmp_path):
    folder = run_folder(tmp_path)
    result = run_script("report.py", str(folder), "--days", "7", "--accepted-results", "40")
    assert result.returncode == 0, result.stderr
    for name in ("memory.png", "cost-7d-40.png"):
        assert (folder / name).read_bytes().startswith(PNG)


def test_an_existing_picture_is_never_replaced_and_nothing_else_is_drawn(tmp_path):
    folder = run_folder(tmp_path)
    (folder / "memory.png").write_bytes(b"earlier")
    result = run_script("report.py", str(folder), "--days", "7", "--accepted-results", "40")
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert (folder / "memory.png").read_bytes() == b"earlier"
    assert not (folder / "cost-7d-40.png").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--days", "7"], "go together"), (["--accepted-results", "0"], "")],
)
def test_bad_input_draws_nothing(tmp_path, argv, message):
    folder = run_folder(tmp_path)
    result = run_script("report.py", str(folder), *argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["measurement.json"]


def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    result = run_script("report.py", str(tmp_path))
    assert result.returncode == 2
    assert "neither a run folder nor a sweep folder" in result.stderr
