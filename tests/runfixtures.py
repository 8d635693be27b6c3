"""The real H200 outputs (tests/data/h200/) laid out as run folders and log rows, and a copy
of the repository whose quality protocol has its decisions written, for the stage tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import record
import validate
from conftest import ROOT

H200 = Path(__file__).resolve().parent / "data" / "h200"
DECIDED = """---
protocol: IteraGPU Lab quality protocol
version: 1
useful_unit: "one support ticket routed to a team"
acceptance_criteria:
  - "the team equals the reviewer's label in the 2026-11 check set"
minimum_acceptance_rate: 0.95
decided_on: 2026-12-01
decided_by: "ML lead"
---
"""


def run_id(n: int) -> str:
    """A valid run id, distinct and sortable for n in [0, 86400)."""
    return f"20261202T{n // 3600:02d}{n // 60 % 60:02d}{n % 60:02d}Z-{n:06x}"


def measurement_bytes(n: int, fixture: str) -> bytes:
    """A real measurement, followed by n spaces: run n's own bytes (and SHA-256), as two real
    runs never share a measurement.json, with the same JSON in them."""
    return (H200 / f"{fixture}.json").read_bytes() + b" " * n


def make_run(runs_dir: Path, n: int = 0, fixture: str = "small", environment=True) -> Path:
    """runs_dir/<run id>/ holding a real measurement (and the real environment.json)."""
    runs_dir.mkdir(exist_ok=True)
    folder = runs_dir / run_id(n)
    folder.mkdir()
    (folder / "measurement.json").write_bytes(measurement_bytes(n, fixture))
    if environment:
        shutil.copyfile(H200 / "env.json", folder / "environment.json")
    return folder


def make_row(n: int = 0, fixture: str = "small", protocol: Path = validate.PROTOCOL) -> dict:
    """The row record.py builds for make_run's run n, under the given protocol."""
    data = measurement_bytes(n, fixture)
    sha = validate.Protocol(protocol).sha256
    return record.build_row(run_id(n), data, json.loads(data), sha)


def log_bytes(rows: list[dict]) -> bytes:
    header = validate.kit_header()
    return b"".join(
        [record.csv_line(header), *(record.csv_line(r[c] for c in header) for r in rows)]
    )


def repo_copy(tmp_path: Path, front_matter: str = DECIDED) -> Path:
    """The stage scripts, schemas and kit data under tmp_path/repo, with `front_matter`
    in place of the protocol's: its scripts judge quality values against that protocol."""
    repo = tmp_path / "repo"
    for folder, pattern in (("pipeline", "*.py"), ("schemas", "*.schema.json")):
        (repo / folder).mkdir(parents=True)
        for path in (ROOT / folder).glob(pattern):
            shutil.copyfile(path, repo / folder / path.name)
    (repo / "data").mkdir()
    shutil.copyfile(ROOT / "data" / "resultats-bruts.csv", repo / "data" / "resultats-bruts.csv")
    write_protocol(repo / "data" / "protocole-qualite.md", front_matter)
    return repo


def write_protocol(path: Path, front_matter: str = DECIDED) -> Path:
    """The repository's protocol with `front_matter` in place of its own."""
    body = validate.PROTOCOL.read_text(encoding="utf-8").split("\n---\n", 1)[1]
    path.write_text(front_matter + body, encoding="utf-8")
    return path
