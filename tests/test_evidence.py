"""The committed evidence under runs/ stays valid: `validate.py runs/` walks it whole, every
artefact against its schema and the facts validate.py checks, and the results log."""

from __future__ import annotations

import json

import pytest
from conftest import RUNS, run_script

from pipeline.artefacts import validate

pytestmark = pytest.mark.evidence
FILES = sorted(p for p in RUNS.rglob("*") if p.is_file() and not p.is_symlink())
CHECKED = [  # artefacts and the log (a model's config.json is an input, not an artefact)
    p for p in FILES if p.suffix in (".json", ".csv") and not validate.model_config(p)
]


def test_validate_walks_the_committed_runs_and_finds_them_all_valid():
    """One command over the whole tree: each folder kind is either checked (run, sweep,
    notebook, prediction and equivalence grid folders hold JSON artefacts; runs/ holds the
    log) or listed as skipped with its reason (pictures, benchmark printouts, README). An
    artefact that fails shows in the comparison below as its own line, with validate.py's
    reason; every artefact is validated once, here (a test per file validated them all a
    second time: 2,557 tests, 31 s of a 2-core machine's suite)."""
    result = run_script("validate.py", str(RUNS))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    skipped = [p for p in FILES if p not in CHECKED]

    def why(path):
        if validate.model_config(path):
            return validate.MODEL_CONFIG
        return validate.SKIPPED_SUFFIXES[path.suffix]

    assert lines[-1] == f"{len(CHECKED)} valid, 0 invalid, {len(skipped)} skipped"
    assert sorted(lines[:-1]) == sorted(
        [f"{path}: valid" for path in CHECKED]
        + [f"{path}: skipped ({why(path)})" for path in skipped]
    )
    assert len(CHECKED) > 250  # the grids' points, the run folders, the sweeps, the log
    assert {p.suffix for p in skipped} == {
        ".png",
        ".txt",
        ".md",
        ".gz",
        ".py",
        ".log",
        ".sh",
        ".json",
        ".compare",
        ".pickle",
    }


def test_every_sweep_point_is_a_run_folder_of_its_own():
    for summary in RUNS.glob("*-sweep/sweep.json"):
        for point in json.loads(summary.read_text())["points"]:
            assert (RUNS / point["run"] / "measurement.json").is_file(), point["run"]


def test_no_test_takes_the_newest_or_first_runs_folder_it_finds():
    """A user's own run (even one refused for want of a GPU) is a newer runs/ folder: tests
    read named committed fixtures, never the last of a sorted glob of runs/ nor its first."""
    import re
    from pathlib import Path

    picked = re.compile(r"sorted\(\s*RUNS\.(?:r?glob|iterdir)\(.*\)\s*\)\s*\[|next\(\s*RUNS\.")
    tests = Path(__file__).resolve().parent
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(tests.glob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if picked.search(line)
    ]
    assert offenders == []
