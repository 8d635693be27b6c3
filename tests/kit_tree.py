"""A throw-away copy of the kit's sources, for archive and verify tests (not a test module).

The copy holds only what archive.py reads, at the same relative paths: the members' sources,
and the package modules the kit script is generated from (archive.py checks that it is). The
notebook is generated from the copied script rather than copied, so these tests do not
depend on the committed notebook being fresh (tests/test_notebook.py checks that). A source another
engineer has not written yet is replaced by a small stand-in, so that the tests can run.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from conftest import ROOT

from pipeline.kit import archive, make_kit_script, make_notebook

STAND_INS = {
    "data/protocole-qualite.md": "# Quality protocol\n\nA stand-in for the tests.\n",
    "data/resultats-bruts.csv": "run_id,useful_work,accepted_results\n",
}


def make_tree(folder: Path) -> Path:
    """Copy the eight content sources and the kit script's under `folder` and return it."""
    for name, source in archive.MEMBERS.items():
        if name in (archive.MANIFEST, "mesure-memoire.ipynb"):
            continue
        target = folder / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / source).is_file():
            shutil.copyfile(ROOT / source, target)
        else:
            target.write_text(STAND_INS[source], encoding="utf-8")
    for source in make_kit_script.SOURCES:
        (folder / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / source, folder / source)
    notebook = folder / archive.MEMBERS["mesure-memoire.ipynb"]
    notebook.write_bytes(make_notebook.render(folder))
    return folder


def build(tree: Path, dist: Path) -> int:
    return archive.main(["--root", str(tree), "--dist", str(dist)])


def members_of(tree: Path) -> dict[str, bytes]:
    """The nine members' bytes as archive.py would pack them (the manifest included)."""
    contents, problems = archive.read_members(tree)
    assert problems == []
    contents[archive.MANIFEST] = archive.manifest_bytes(contents)
    return contents


def write_zip(path: Path, entries, compression=zipfile.ZIP_DEFLATED) -> Path:
    """A zip of (name or ZipInfo, bytes) entries, written in the given order."""
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return path
