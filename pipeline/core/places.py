"""Where the lab's folders beside the package are: in a clone of the repository, beside
`pipeline/`; in an installed package (`pip install .`), the copies it carries in
`pipeline/_bundled/` (calibrations, schemas, data), and runs/ in the folder a command runs
from."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
BUNDLED = PACKAGE / "_bundled"


def installed() -> bool:
    """True in an installed package (its wheel carries _bundled/), False in a clone."""
    return BUNDLED.is_dir()


def folder(name: str) -> Path:
    """calibrations/, schemas/ or data/: the installed package's copy, else the clone's."""
    return BUNDLED / name if installed() else PACKAGE.parent / name


def runs() -> Path:
    """runs/: the clone's; from an installed package, runs/ where the command runs."""
    return Path("runs") if installed() else PACKAGE.parent / "runs"
