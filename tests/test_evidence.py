"""The committed evidence under runs/ stays valid: every artefact against its schema and the
facts validate.py checks, and the results log as a whole."""

from __future__ import annotations

import json

import pytest
import validate
from conftest import RUNS

REGISTRY = validate.load_registry()
ARTEFACTS = sorted(p for p in RUNS.rglob("*.json"))


@pytest.mark.parametrize("path", ARTEFACTS, ids=lambda p: str(p.relative_to(RUNS)))
def test_every_committed_artefact_validates(path):
    assert validate.validate_json(path.read_bytes(), REGISTRY) == []


@pytest.mark.skipif(not (RUNS / "resultats-bruts.csv").exists(), reason="no log committed yet")
def test_the_committed_results_log_validates():
    assert validate.main([str(RUNS / "resultats-bruts.csv")]) == 0


def test_every_sweep_point_is_a_run_folder_of_its_own():
    for summary in RUNS.glob("*-sweep/sweep.json"):
        for point in json.loads(summary.read_text())["points"]:
            assert (RUNS / point["run"] / "measurement.json").is_file(), point["run"]
