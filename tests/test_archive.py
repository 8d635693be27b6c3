"""archive.py: the nine members, the manifest, byte-reproducibility, no overwrite, a clean kit.

Builds run from copies of the sources in tmp_path (kit_tree.py), never in the repository."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT
from kit_tree import build, make_tree

from pipeline.artefacts import validate
from pipeline.kit import archive

NINE = {
    "README.md",
    "mesure-memoire.ipynb",
    "mesure_memoire.py",
    "protocole-qualite.md",
    "resultats-bruts.csv",
    "calcul_forfaits.py",
    "tarifs-forfaits.csv",
    "LICENSE.txt",
    "MANIFEST.json",
}


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "src")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_one_table_maps_the_nine_members_to_existing_sources():
    assert set(archive.MEMBERS) == NINE
    assert len(set(archive.MEMBERS.values())) == 9
    for name, source in archive.MEMBERS.items():
        if name != "MANIFEST.json":
            assert (ROOT / source).is_file(), f"{name}: source {source} is missing"


def test_the_zip_holds_exactly_the_nine_members_in_one_folder(tree, tmp_path, capsys):
    assert build(tree, tmp_path / "dist") == 0
    path = tmp_path / "dist" / "iteragpu-lab-v1.zip"
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == sorted(f"iteragpu-lab-v1/{n}" for n in NINE)
        for info in infos:
            assert info.date_time == (2026, 9, 24, 0, 0, 0)
            assert info.create_system == 3
            assert info.external_attr >> 16 == stat.S_IFREG | 0o644
            assert info.compress_type == zipfile.ZIP_DEFLATED
            assert not info.is_dir()
            name = info.filename.removeprefix("iteragpu-lab-v1/")
            if name != "MANIFEST.json":
                assert zf.read(info) == (tree / archive.MEMBERS[name]).read_bytes()
        inside = zf.read("iteragpu-lab-v1/MANIFEST.json")
    assert inside == (tree / "MANIFEST.json").read_bytes()
    assert f"sha256 {sha(path)}" in capsys.readouterr().out


def test_the_manifest_lists_nine_with_sizes_and_hashes_and_passes_its_schema(tree, tmp_path):
    assert build(tree, tmp_path / "dist") == 0
    data = (tree / "MANIFEST.json").read_bytes()
    document = json.loads(data)
    assert validate.validate_document(document, validate.load_registry()) == []
    assert document["schema"] == "urn:iteragpu-lab:schema:manifest:v1"
    assert [m["name"] for m in document["members"]] == sorted(NINE)
    for member in document["members"]:
        if member["name"] == "MANIFEST.json":
            assert set(member) == {"name", "note"}  # a file cannot hold its own hash
            continue
        source = (tree / archive.MEMBERS[member["name"]]).read_bytes()
        assert member["size"] == len(source)
        assert member["sha256"] == hashlib.sha256(source).hexdigest()
    assert data == (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def run_archive(tree: Path, dist: Path, cwd: Path, umask: int, env: dict):
    return subprocess.run(
        [sys.executable, "-m", "pipeline.kit.archive", "--root", str(tree), "--dist", str(dist)],
        cwd=cwd,
        env=env,
        preexec_fn=lambda: os.umask(umask),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_same_sources_same_bytes_whatever_clock_umask_locale_user_or_folder(tmp_path):
    first = make_tree(tmp_path / "one")
    second = tmp_path / "elsewhere" / "two, with spaces"
    shutil.copytree(first, second)
    for path in second.rglob("*"):  # other times and modes on every source
        path.chmod(0o600 if path.is_file() else 0o700)
        os.utime(path, (2_000_000_000, 2_000_000_000))
    base = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    runs = [
        (first, tmp_path / "dist-a", first, 0o022, {**base, "TZ": "UTC", "LC_ALL": "C"}),
        (
            second,
            tmp_path / "dist-b",
            tmp_path,
            0o077,
            {
                **base,
                "TZ": "Asia/Jakarta",
                "LC_ALL": "C.UTF-8",
                "LANG": "id_ID.UTF-8",
                "USER": "somebody-else",
                "SOURCE_DATE_EPOCH": str(archive.DEFAULT_EPOCH),
            },
        ),
    ]
    hashes = []
    for tree, dist, cwd, umask, env in runs:
        result = run_archive(tree, dist, cwd, umask, env)
        assert result.returncode == 0, result.stderr
        hashes.append((sha(dist / "iteragpu-lab-v1.zip"), sha(tree / "MANIFEST.json")))
    assert hashes[0] == hashes[1]


def test_source_date_epoch_is_honoured_and_clamped_to_1980(tree, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # 2023-11-14T22:13:20Z
    assert build(tree, tmp_path / "a") == 0
    with zipfile.ZipFile(tmp_path / "a" / "iteragpu-lab-v1.zip") as zf:
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert build(tree, tmp_path / "b") == 0
    with zipfile.ZipFile(tmp_path / "b" / "iteragpu-lab-v1.zip") as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    zips = [tmp_path / d / "iteragpu-lab-v1.zip" for d in "ab"]
    assert sha(zips[0]) != sha(zips[1])


@pytest.mark.parametrize("value", ["", "yesterday", "-1", "1.5", "1e9"])
def test_a_malformed_source_date_epoch_is_refused(tree, tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    assert build(tree, tmp_path / "dist") == 2
    assert "SOURCE_DATE_EPOCH" in capsys.readouterr().err
    assert not (tree / "MANIFEST.json").exists()
    assert not (tmp_path / "dist").exists()


def test_a_rebuild_is_up_to_date_and_changes_nothing(tree, tmp_path, capsys):
    assert build(tree, tmp_path / "dist") == 0
    zip_path = tmp_path / "dist" / "iteragpu-lab-v1.zip"
    before = (zip_path.stat().st_ino, (tree / "MANIFEST.json").stat().st_ino)
    capsys.readouterr()
    assert build(tree, tmp_path / "dist") == 0
    assert capsys.readouterr().out.count("up to date") == 2
    assert (zip_path.stat().st_ino, (tree / "MANIFEST.json").stat().st_ino) == before


def test_an_existing_different_zip_is_refused_and_left_untouched(tree, tmp_path, capsys):
    dist = tmp_path / "dist"
    assert build(tree, dist) == 0
    (dist / "iteragpu-lab-v1.zip").write_bytes(b"an older build")
    capsys.readouterr()
    assert build(tree, dist) == 2
    err = capsys.readouterr().err
    assert "iteragpu-lab-v1.zip exists with different content" in err
    assert "move it away" in err
    assert (dist / "iteragpu-lab-v1.zip").read_bytes() == b"an older build"
    assert sorted(p.name for p in dist.iterdir()) == ["iteragpu-lab-v1.zip"]  # no temp left


def test_a_stale_manifest_is_refused_naming_the_changed_member(tree, tmp_path, capsys):
    dist = tmp_path / "dist"
    assert build(tree, dist) == 0
    manifest = (tree / "MANIFEST.json").read_bytes()
    (dist / "iteragpu-lab-v1.zip").unlink()
    (tree / "LICENSE.txt").write_text("another licence\n")
    capsys.readouterr()
    assert build(tree, dist) == 2
    err = capsys.readouterr().err
    assert "MANIFEST.json exists with different content (members changed: LICENSE.txt)" in err
    assert "delete MANIFEST.json" in err
    assert (tree / "MANIFEST.json").read_bytes() == manifest
    assert not (dist / "iteragpu-lab-v1.zip").exists()  # refused before anything was written


def append(path: Path, text: str) -> None:
    with path.open("a") as handle:
        handle.write(text)


def replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def drop_last_lines(path: Path, count: int) -> None:
    path.write_text("".join(path.read_text().splitlines(True)[:-count]))


def notebook_with(tree: Path, change) -> None:
    path = tree / "data" / "mesure-memoire.ipynb"
    notebook = json.loads(path.read_bytes())
    change(notebook)
    path.write_text(json.dumps(notebook, indent=1, sort_keys=True) + "\n")


def first_code_cell(notebook: dict) -> dict:
    return next(c for c in notebook["cells"] if c["cell_type"] == "code")


DIRTY = {
    "results with a row": (
        lambda tree: append(tree / "data" / "resultats-bruts.csv", "a,b,c\n"),
        "resultats-bruts.csv: 1 filled row(s)",
    ),
    "notebook with outputs": (
        lambda tree: notebook_with(
            tree,
            lambda nb: first_code_cell(nb)["outputs"].append(
                {"output_type": "stream", "name": "stdout", "text": ["14 GB\n"]}
            ),
        ),
        "mesure-memoire.ipynb: cell cell-03 has saved outputs or an execution count",
    ),
    "notebook with an execution count": (
        lambda tree: notebook_with(tree, lambda nb: first_code_cell(nb).update(execution_count=1)),
        "has saved outputs or an execution count",
    ),
    "notebook with an interpreter version": (
        lambda tree: notebook_with(
            tree, lambda nb: nb["metadata"]["language_info"].update(version="3.12.1")
        ),
        "records an interpreter version",
    ),
    "notebook not regenerated": (
        lambda tree: replace(tree / "kit" / "mesure_memoire.py", "GIB = 2**30", "GIB = 1 << 30"),
        "mesure-memoire.ipynb: not generated from the current mesure_memoire.py",
    ),
    "kit script not regenerated": (
        lambda tree: replace(
            tree / "pipeline" / "core" / "writers.py", "never overwritten", "never replaced"
        ),
        "mesure_memoire.py: not generated from the package's modules: run python -m "
        "pipeline.kit.make_kit_script",
    ),
    "member missing": (
        lambda tree: (tree / "data" / "protocole-qualite.md").unlink(),
        "protocole-qualite.md: its source data/protocole-qualite.md is missing",
    ),
    "tariff grid short of a model": (
        lambda tree: drop_last_lines(tree / "data" / "tarifs-forfaits.csv", 3),
        "tarifs-forfaits.csv: 42 tariffs for 14 models",
    ),
    "tariff grid missing a duration": (
        lambda tree: drop_last_lines(tree / "data" / "tarifs-forfaits.csv", 1),
        "tarifs-forfaits.csv: calcul_forfaits.py refuses it",
    ),
    "a source that is a link": (
        lambda tree: (
            (tree / "LICENSE.txt").rename(tree / "elsewhere.txt"),
            (tree / "LICENSE.txt").symlink_to(tree / "elsewhere.txt"),
        ),
        "LICENSE.txt: its source LICENSE.txt is not a regular file",
    ),
}


@pytest.mark.parametrize("case", DIRTY)
def test_a_kit_that_is_not_clean_is_refused_and_nothing_written(tree, tmp_path, capsys, case):
    spoil, message = DIRTY[case]
    spoil(tree)
    assert build(tree, tmp_path / "dist") == 1
    err = capsys.readouterr().err
    assert message in err
    assert "nothing was written" in err
    assert not (tree / "MANIFEST.json").exists()
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a,b\n", None),
        ("\ufeffa,b\r\n\r\n", None),
        ("", "no header row"),
        (",\n", "no header row"),
        ("a,b\n1,2\n3,4\n", "2 filled row(s)"),
        ("a,b\n,\n", "1 filled row(s)"),  # a row of empty cells is still a row
        ('a,"b\n', "not a readable CSV"),
    ],
)
def test_the_empty_grid_rule(text, problem):
    found = archive.results_problem(text.encode())
    if problem is None:
        assert found is None
    else:
        assert problem in found


def test_the_empty_notebook_rule_accepts_the_generated_notebook():
    assert archive.notebook_problem((ROOT / "data" / "mesure-memoire.ipynb").read_bytes()) is None
    assert "not valid JSON" in archive.notebook_problem(b"{")
    assert "not a notebook" in archive.notebook_problem(b'{"cells": 3}')


def test_a_placeholder_left_in_the_kit_readme_is_reported(tree, tmp_path, capsys):
    readme = tree / "data" / "kit-README.md"
    readme.write_text(readme.read_text().replace("## Licence", "<<H200-RUNS>>\n\n## Licence"))
    assert build(tree, tmp_path / "a") == 0
    assert "warning: README.md still holds <<H200-RUNS>>" in capsys.readouterr().out
    readme.write_text(readme.read_text().replace("<<H200-RUNS>>", "Run on an H200."))
    (tree / "MANIFEST.json").unlink()
    assert build(tree, tmp_path / "b") == 0
    assert "warning" not in capsys.readouterr().out
