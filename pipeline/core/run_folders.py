"""The runs directory and its run ids: one folder per run, runs/<UTC time>-<random>/.

An id sorts by time (the UTC second the run started) and carries a random part, so runs
started in the same second, on one machine or many, never share a name. Folders are created
exclusively: an id is never reused and a folder never replaced. The results log,
resultats-bruts.csv, sits beside the run folders it records.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
from pathlib import Path

from pipeline.core import cli, places

RUNS = places.runs()
LOG_NAME = "resultats-bruts.csv"
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}")


def runs_directory(text: str | None) -> Path:
    """--runs-dir, else $ITERAGPU_RUNS_DIR, else runs/: one rule for every stage. A folder
    named must exist already: a mistyped name never creates a new evidence folder."""
    chosen = text or os.environ.get("ITERAGPU_RUNS_DIR")
    if chosen is None:
        return RUNS
    return cli.existing_folder(Path(chosen))


def new_run_id() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def new_run_folder(runs_dir: Path = RUNS, suffix: str = "") -> Path:
    """A new, empty run folder (its id, then `suffix`); an id already taken is drawn again,
    never reused."""
    for _ in range(10):
        folder = runs_dir / f"{new_run_id()}{suffix}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"{runs_dir}: ten new run ids in a row were taken")
