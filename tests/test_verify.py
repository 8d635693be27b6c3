"""verify.py: an intact kit passes; every alteration and every hostile archive is named.

Hostile zips are made here with zipfile (ZipInfo fields edited, raw bytes patched). For those
refused from the central directory, ZipFile.open is made to fail the test, which proves that
no member was read."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import warnings
import zipfile
import zlib
from pathlib import Path

import pytest
from conftest import ROOT
from kit_tree import build, make_tree, members_of, write_zip

from pipeline.kit import archive, verify

FOLDER = "iteragpu-lab-v1/"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """One built kit for the module: its source tree, its zip and its manifest."""
    base = tmp_path_factory.mktemp("kit")
    tree = make_tree(base / "src")
    assert build(tree, base / "dist") == 0
    return {
        "tree": tree,
        "zip": base / "dist" / "iteragpu-lab-v1.zip",
        "manifest": tree / "MANIFEST.json",
        "members": members_of(tree),
    }


def run(kit, *args: str) -> int:
    return verify.main(["--manifest", str(kit["manifest"]), *map(str, args)])


def entries(kit, **changes) -> list[tuple[str, bytes]]:
    """The kit's nine entries, with members replaced (bytes) or dropped (None)."""
    members = {**kit["members"], **changes}
    return [(FOLDER + n, data) for n, data in sorted(members.items()) if data is not None]


@pytest.fixture
def no_member_read(monkeypatch):
    """ZipFile.open for reading fails the test (writing, to build a zip, still works)."""
    original = zipfile.ZipFile.open

    def guarded(self, name, mode="r", *args, **kwargs):
        if mode == "r":
            raise AssertionError("a member was read although the central directory was refused")
        return original(self, name, mode, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", guarded)


# ---------------------------------------------------------------- intact copies


def test_the_built_zip_is_intact(kit, capsys):
    assert run(kit, kit["zip"]) == 0
    assert "intact: 9 members match" in capsys.readouterr().out


def test_an_extracted_folder_and_its_parent_are_intact(kit, tmp_path, capsys):
    with zipfile.ZipFile(kit["zip"]) as zf:
        zf.extractall(tmp_path)  # safe: our own zip, checked just above
    assert run(kit, tmp_path) == 0
    assert run(kit, tmp_path / "iteragpu-lab-v1") == 0
    (tmp_path / "README.md").write_text("the user's own notes\n")  # a name any folder has
    (tmp_path / "iteragpu-lab-v1" / "LICENSE.txt").write_text("altered\n")
    capsys.readouterr()
    assert run(kit, tmp_path) == 1  # still the kit inside that is judged
    err = capsys.readouterr().err
    assert "FAIL LICENSE.txt: 8 bytes, the manifest says 1069\n" in err
    assert "(1 failed check(s))" in err


def test_the_sources_of_a_tree_against_its_manifest(kit, tmp_path):
    assert verify.main(["--root", str(kit["tree"])]) == 0


def test_the_committed_manifest_matches_the_repository():
    """MANIFEST.json is a lock file: a member changed without `make archive` fails here."""
    if not (ROOT / "MANIFEST.json").exists():
        pytest.skip("no MANIFEST.json committed yet: run make archive")
    assert verify.main([]) == 0


def test_a_run_as_its_own_process(kit):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.kit.verify",
            "--manifest",
            str(kit["manifest"]),
            kit["zip"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


# ---------------------------------------------------------------- zipped again: layout only


def rezipped(kit, path: Path, changes: dict | None = None, extra=()) -> Path:
    """The kit as a zip tool other than archive.py writes it: a directory entry first, the
    members in reverse order, stored, another time, mode 0664, an extra field, a comment."""
    members = {**kit["members"], **(changes or {})}
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(info(FOLDER, stat.S_IFDIR | 0o755, compress_type=zipfile.ZIP_STORED), b"")
        for name in sorted(members, reverse=True):
            zinfo = info(
                FOLDER + name,
                stat.S_IFREG | 0o664,
                compress_type=zipfile.ZIP_STORED,
                date_time=(2026, 12, 3, 9, 30, 0),
                extra=struct.pack("<HHBL", 0x5455, 5, 1, 1_796_290_200),  # "UT": a time
            )
            zf.writestr(zinfo, members[name])
        for name, data in extra:
            zf.writestr(info(name), data)
        zf.comment = b"zipped again"
    return path


def test_a_kit_zipped_again_is_intact_with_its_layout_in_notes(kit, tmp_path, capsys):
    path = rezipped(kit, tmp_path / "again.zip")
    assert run(kit, path) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.out.splitlines() if line.startswith("verify.py: note: ")]
    assert notes == [
        "verify.py: note: directory entries (unzip makes the folders anyway): iteragpu-lab-v1/",
        "verify.py: note: the members are in another order than the build's (sorted by name)",
        "verify.py: note: stored without compression: iteragpu-lab-v1/LICENSE.txt, "
        "iteragpu-lab-v1/MANIFEST.json, iteragpu-lab-v1/README.md, "
        "iteragpu-lab-v1/calcul_forfaits.py, iteragpu-lab-v1/mesure-memoire.ipynb and 4 more",
        "verify.py: note: file times other than the build's 2026-09-24 00:00:00",
        "verify.py: note: permissions other than the build's (Unix, 0644): "
        "iteragpu-lab-v1/LICENSE.txt, iteragpu-lab-v1/MANIFEST.json, "
        "iteragpu-lab-v1/README.md, iteragpu-lab-v1/calcul_forfaits.py, "
        "iteragpu-lab-v1/mesure-memoire.ipynb and 4 more",
        "verify.py: note: extra fields (times, owners) on the members",
        "verify.py: note: an archive comment",
    ]
    assert "intact: 9 members match" in captured.out
    assert "; 7 note(s)" in captured.out
    assert captured.err == ""


def test_the_built_zip_has_no_note(kit, capsys):
    assert run(kit, kit["zip"]) == 0
    assert "note" not in capsys.readouterr().out


def test_a_kit_zipped_again_and_altered_names_every_member_that_differs(kit, tmp_path, capsys):
    readme = kit["members"]["README.md"].replace(b"IteraGPU", b"IteraCPU", 1)
    changes = {"README.md": readme, "LICENSE.txt": b"another licence\n"}
    changes["resultats-bruts.csv"] = kit["members"]["resultats-bruts.csv"] + b"r1\n"
    assert run(kit, rezipped(kit, tmp_path / "again.zip", changes)) == 1
    captured = capsys.readouterr()
    fails = [line for line in captured.err.splitlines() if line.startswith("verify.py: FAIL ")]
    assert [line.split(":")[1].removeprefix(" FAIL ") for line in fails] == [
        "LICENSE.txt",
        "README.md",
        "resultats-bruts.csv",
    ]
    assert "FAIL README.md: SHA-256" in captured.err
    assert "NOT intact (3 failed check(s))" in captured.err
    assert "verify.py: note: directory entries" in captured.out  # layout still reported


@pytest.mark.parametrize(
    "extra",
    [
        [(FOLDER + "mesures.json", b"{}"), (FOLDER + "runs/r1/measurement.json", b"{}")],
        [(FOLDER + "extra.txt", b"x"), (FOLDER + "sitecustomize.py", b"import os\n")],
    ],
)
def test_a_zip_with_files_beside_the_nine_is_not_the_kit_and_none_is_read(
    kit, tmp_path, capsys, extra
):
    """The kit travels as nine members in one folder: a zip with more (a sitecustomize.py
    beside the scripts runs with them) is refused, its extras named, nothing read."""
    path = write_zip(tmp_path / "k.zip", [*entries(kit), *extra])
    opened, original = [], zipfile.ZipFile.open

    def recording(self, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return original(self, name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zipfile.ZipFile, "open", recording)
        assert run(kit, path) == 1
    captured = capsys.readouterr()
    names = ", ".join(sorted(name for name, _ in extra))
    assert captured.err == (
        f"verify.py: FAIL k.zip: 2 file(s) besides the kit's 9 members, so not the kit (never "
        f"read): {names}\n{path}: NOT intact (1 failed check(s))\n"
    )
    assert captured.out == ""
    assert opened == []


@pytest.mark.skipif(shutil.which("zip") is None, reason="no zip command here")
def test_a_folder_zipped_again_with_zip_r_is_intact(kit, folder, tmp_path, capsys):
    """The real tool: `zip -r` as a user would; with an output of theirs in the folder, the
    zip is no longer the kit."""
    path = tmp_path / "again.zip"
    subprocess.run(["zip", "-qr", str(path), "iteragpu-lab-v1"], cwd=folder.parent, check=True)
    assert run(kit, path) == 0
    out = capsys.readouterr().out
    assert "note: directory entries (unzip makes the folders anyway): iteragpu-lab-v1/\n" in out
    assert "intact: 9 members match" in out
    (folder / "mesures.json").write_text("{}")
    path.unlink()
    subprocess.run(["zip", "-qr", str(path), "iteragpu-lab-v1"], cwd=folder.parent, check=True)
    assert run(kit, path) == 1
    assert "so not the kit (never read): iteragpu-lab-v1/mesures.json\n" in capsys.readouterr().err
    (folder / "mesures.json").unlink()
    (folder / "README.md").write_bytes(kit["members"]["README.md"].replace(b"Itera", b"Ultra", 1))
    path.unlink()
    subprocess.run(["zip", "-qr", str(path), "iteragpu-lab-v1"], cwd=folder.parent, check=True)
    assert run(kit, path) == 1
    assert "FAIL README.md: SHA-256" in capsys.readouterr().err


# ---------------------------------------------------------------- altered copies: exit 1


def test_altered_content_of_the_same_size_names_member_and_hash(kit, tmp_path, capsys):
    readme = kit["members"]["README.md"]
    altered = readme.replace(b"IteraGPU", b"IteraCPU", 1)
    assert len(altered) == len(readme)
    path = write_zip(tmp_path / "k.zip", entries(kit, **{"README.md": altered}))
    assert run(kit, path) == 1
    assert "FAIL README.md: SHA-256" in capsys.readouterr().err


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The members verify reads (hashes), in order."""
    read, original = [], verify.member_problems
    monkeypatch.setattr(
        verify, "member_problems", lambda name, *a: read.append(name) or original(name, *a)
    )
    return read


def test_a_member_of_another_size_is_named_unread_and_the_others_still_judged(
    kit, tmp_path, capsys, reads
):
    bigger = kit["members"]["LICENSE.txt"] + b"\n"
    readme = kit["members"]["README.md"].replace(b"IteraGPU", b"IteraCPU", 1)
    path = write_zip(
        tmp_path / "k.zip", entries(kit, **{"LICENSE.txt": bigger, "README.md": readme})
    )
    assert run(kit, path) == 1
    err = capsys.readouterr().err
    assert "FAIL LICENSE.txt: the zip says 1070 bytes, the manifest 1069" in err
    assert "FAIL README.md: SHA-256" in err
    assert "(2 failed check(s))" in err
    assert "LICENSE.txt" not in reads  # its size already says it differs
    assert sorted(reads) == sorted(verify.KIT_NAMES - {"LICENSE.txt"})


def test_a_missing_entry(kit, tmp_path, capsys):
    assert run(kit, write_zip(tmp_path / "k.zip", entries(kit, **{"LICENSE.txt": None}))) == 1
    assert "FAIL iteragpu-lab-v1/LICENSE.txt: missing" in capsys.readouterr().err


def test_a_copy_whose_manifest_differs_from_the_reference(kit, tmp_path, capsys):
    other = kit["members"]["MANIFEST.json"].replace(b'\n  "hash"', b'\n\t "hash"', 1)
    assert len(other) == len(kit["members"]["MANIFEST.json"])
    path = write_zip(tmp_path / "k.zip", entries(kit, **{"MANIFEST.json": other}))
    assert run(kit, path) == 1
    assert "FAIL MANIFEST.json: differs from the reference manifest" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("member", "dirty", "message"),
    [
        ("resultats-bruts.csv", b"run_id\nr1\n", "resultats-bruts.csv: 1 filled row(s)"),
        (
            "mesure-memoire.ipynb",
            b'{"cells": [{"cell_type": "code", "execution_count": 3, "outputs": []}]}',
            "mesure-memoire.ipynb: cell number 1 has saved outputs",
        ),
    ],
)
def test_the_empty_grid_and_empty_notebook_rules_hold_even_when_the_hashes_agree(
    kit, tmp_path, capsys, member, dirty, message
):
    members = {**kit["members"], member: dirty}
    del members["MANIFEST.json"]
    manifest = archive.manifest_bytes(members)
    (tmp_path / "MANIFEST.json").write_bytes(manifest)
    members["MANIFEST.json"] = manifest
    path = tmp_path / "dirty.zip"
    path.write_bytes(archive.zip_bytes(members, archive.DEFAULT_EPOCH))
    assert verify.main(["--manifest", str(tmp_path / "MANIFEST.json"), str(path)]) == 1
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- the reference manifest


def spoilt_manifest(kit, tmp_path, change) -> Path:
    document = json.loads(kit["members"]["MANIFEST.json"])
    change(document)
    path = tmp_path / "MANIFEST.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["members"][0].update(size="1069"), "fails its schema at $.members[0]"),
        (lambda d: d.update(extra=1), "fails its schema at $"),
        (lambda d: d.update(schema="urn:iteragpu-lab:schema:estimate:v1"), 'its "schema" is not'),
        (lambda d: d["members"][0].update(name="LICENCE.txt"), "LICENCE.txt: listed, but not"),
        (lambda d: d["members"][2].update(name="LICENSE.txt"), "listed 2 times"),
    ],
)
def test_a_bad_reference_manifest_fails_its_checks(kit, tmp_path, capsys, change, message):
    reference = spoilt_manifest(kit, tmp_path, change)
    assert verify.main(["--manifest", str(reference), str(kit["zip"])]) == 1
    assert message in capsys.readouterr().err


def test_a_reference_that_is_not_json_fails(kit, tmp_path, capsys):
    (tmp_path / "MANIFEST.json").write_text("{")
    assert verify.main(["--manifest", str(tmp_path / "MANIFEST.json")]) == 1
    assert "not valid JSON" in capsys.readouterr().err


def test_no_reference_manifest_is_unusable_input(kit, tmp_path, capsys):
    assert verify.main(["--manifest", str(tmp_path / "none.json"), str(kit["zip"])]) == 2
    assert "no reference manifest" in capsys.readouterr().err


# ---------------------------------------------------------------- hostile zips


def info(name: str, mode: int = stat.S_IFREG | 0o644, **fields) -> zipfile.ZipInfo:
    zinfo = zipfile.ZipInfo(name, date_time=(2026, 9, 24, 0, 0, 0))
    zinfo.create_system = 3
    zinfo.external_attr = mode << 16
    zinfo.compress_type = zipfile.ZIP_DEFLATED
    for key, value in fields.items():
        setattr(zinfo, key, value)
    return zinfo


HOSTILE = {
    "dot-dot": ([(FOLDER + "../evil.sh", b"x")], "'..' in its path"),
    "absolute": ([("/etc/cron.d/evil", b"x")], "an absolute path"),
    "drive letter": ([("C:/evil.bat", b"x")], "an absolute path"),
    "backslash": ([(FOLDER + "..\\evil", b"x")], "a backslash in its name"),
    "control character": ([(FOLDER + "a\nb", b"x")], "a control character"),
    "directory entry with data": (
        [(info(FOLDER + "sub/", stat.S_IFDIR | 0o755), b"x")],
        "a directory entry holding 1 bytes",
    ),
    "directory entry outside": (
        [(info("other/", stat.S_IFDIR | 0o755), b"")],
        "other/: outside iteragpu-lab-v1/",
    ),
    "a file marked as a directory": (
        [(info(FOLDER + "notes", external_attr=0x10), b"")],
        "marked as a directory, named as a file",
    ),
    "other folder": ([("other/README.md", b"x")], "outside iteragpu-lab-v1/"),
    "top level": ([("README.md", b"x")], "README.md: outside iteragpu-lab-v1/"),
    "symlink": (
        [(info(FOLDER + "link", stat.S_IFLNK | 0o777), b"/etc/passwd")],
        "a symbolic link",
    ),
    "fifo": ([(info(FOLDER + "pipe", stat.S_IFIFO | 0o644), b"")], "not a regular file"),
    "bzip2": (
        [(info(FOLDER + "packed", compress_type=zipfile.ZIP_BZIP2), b"x")],
        "compression method 12",
    ),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_entries_are_refused_before_any_read(kit, tmp_path, capsys, no_member_read, case):
    extra, message = HOSTILE[case]
    path = write_zip(tmp_path / "hostile.zip", [*entries(kit), *extra])
    assert run(kit, path) == 1
    assert message in capsys.readouterr().err


def test_a_duplicate_name_is_refused_before_any_read(kit, tmp_path, capsys, no_member_read):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns about the duplicate
        path = write_zip(
            tmp_path / "dup.zip", [*entries(kit), (FOLDER + "README.md", b"# Evil twin\n")]
        )
    assert run(kit, path) == 1
    err = capsys.readouterr().err
    assert err.count("README.md: appears 2 times") == 1  # one entry's problem, said once
    assert "(1 failed check(s))" in err


def test_a_zip_bomb_ratio_is_refused_before_any_read(kit, tmp_path, capsys, monkeypatch):
    members = dict(kit["members"])
    members["LICENSE.txt"] = b"\0" * 300_000
    manifest = archive.manifest_bytes({k: v for k, v in members.items() if k != "MANIFEST.json"})
    (tmp_path / "MANIFEST.json").write_bytes(manifest)
    members["MANIFEST.json"] = manifest
    path = tmp_path / "bomb.zip"
    path.write_bytes(archive.zip_bytes(members, archive.DEFAULT_EPOCH))
    monkeypatch.setattr(zipfile.ZipFile, "open", None)  # a read would raise TypeError
    assert verify.main(["--manifest", str(tmp_path / "MANIFEST.json"), str(path)]) == 1
    assert "LICENSE.txt: expands" in capsys.readouterr().err


# Offsets of a few fields in a local header (PK\3\4) and a central one (PK\1\2).
FIELDS = {"flag_bits": ("<H", 6, 8), "crc": ("<L", 14, 16), "file_size": ("<L", 22, 24)}


def patch_entry(data: bytes, name: str, **values: int) -> bytes:
    """Rewrite fields of one entry in both its local and central headers."""
    out, raw = bytearray(data), name.encode()
    for signature, fixed, column in ((b"PK\x03\x04", 30, 1), (b"PK\x01\x02", 46, 2)):
        at = out.index(signature)
        while out[at + fixed : at + fixed + len(raw)] != raw:
            at = out.index(signature, at + 4)
        for field, value in values.items():
            struct.pack_into(FIELDS[field][0], out, at + FIELDS[field][column], value)
    return bytes(out)


def test_an_encrypted_entry_is_refused_before_any_read(kit, tmp_path, capsys, no_member_read):
    raw = write_zip(tmp_path / "k.zip", entries(kit)).read_bytes()
    path = tmp_path / "encrypted.zip"
    path.write_bytes(patch_entry(raw, FOLDER + "README.md", flag_bits=0x1))
    assert run(kit, path) == 1
    assert "FAIL iteragpu-lab-v1/README.md: encrypted" in capsys.readouterr().err


@pytest.mark.parametrize(
    "compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"]
)
def test_a_member_bigger_than_it_claims(kit, tmp_path, capsys, compression):
    """The headers claim the true size and CRC, the data holds more: zipfile alone would
    stop at the claimed size and never notice; unzip would write the extra bytes."""
    licence = kit["members"]["LICENSE.txt"]
    listed = entries(kit, **{"LICENSE.txt": licence + b"\0" * 5000})
    raw = write_zip(tmp_path / "k.zip", listed, compression).read_bytes()
    name = FOLDER + "LICENSE.txt"
    path = tmp_path / "lying.zip"
    path.write_bytes(patch_entry(raw, name, file_size=len(licence), crc=zlib.crc32(licence)))
    assert run(kit, path) == 1
    assert "LICENSE.txt: " in (err := capsys.readouterr().err)
    assert "bigger than it claims" in err


def test_reading_stops_one_byte_past_the_declared_size():
    stream = io.BytesIO(b"x" * 1_000_000)
    count, _, _ = verify.digest(stream, 10, keep=False)
    assert count == 11
    assert stream.tell() == 11


# ---------------------------------------------------------------- unusable input: exit 2


def truncated(kit, tmp_path, cut: slice) -> Path:
    path = tmp_path / "cut.zip"
    path.write_bytes(kit["zip"].read_bytes()[cut])
    return path


@pytest.mark.parametrize(
    "make",
    [
        lambda kit, tmp: truncated(kit, tmp, slice(0, -30)),  # end record gone
        lambda kit, tmp: truncated(kit, tmp, slice(0, 20_000)),  # cut in the middle
        lambda kit, tmp: truncated(kit, tmp, slice(0, 0)),  # empty
        lambda kit, tmp: Path(ROOT / "LICENSE.txt"),  # not a zip
        lambda kit, tmp: tmp / "does-not-exist.zip",
    ],
    ids=["no end record", "cut in the middle", "empty file", "not a zip", "no such file"],
)
def test_unusable_input_exits_2_in_one_line(kit, tmp_path, capsys, make):
    assert run(kit, make(kit, tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("verify.py: error: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("held", [["iteragpu-lab-v1.zip"], [], ["README.md", "notes.txt"]])
def test_a_folder_that_is_no_kit_folder_is_one_line_and_exit_2(kit, tmp_path, capsys, held):
    """`verify dist/` names the folder holding the zip: one line, not nine "missing"."""
    dist = tmp_path / "dist"
    dist.mkdir()
    for name in held:
        (dist / name).write_bytes(b"x")
    assert run(kit, dist) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"verify.py: error: {dist}: not a kit folder (none of the kit's files")
    assert err.count("\n") == 1
    hint = f"; to check the zip in it: verify.py {dist / 'iteragpu-lab-v1.zip'}\n"
    assert err.endswith(hint) == (held == ["iteragpu-lab-v1.zip"])


def test_a_file_too_large_to_be_a_kit_is_not_opened(kit, capsys, monkeypatch):
    monkeypatch.setattr(verify, "MAX_ZIP_BYTES", 1000)
    monkeypatch.setattr(zipfile, "ZipFile", None)
    assert run(kit, kit["zip"]) == 2
    assert "larger than any kit" in capsys.readouterr().err


def test_a_bad_option_is_one_line_and_exit_2(capsys):
    assert verify.main(["--no-such-option"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ---------------------------------------------------------------- hostile folders


@pytest.fixture
def folder(kit, tmp_path):
    with zipfile.ZipFile(kit["zip"]) as zf:
        zf.extractall(tmp_path)
    return tmp_path / "iteragpu-lab-v1"


def test_a_symlinked_member_in_a_folder_is_refused(kit, folder, capsys):
    target = folder.parent / "LICENSE.txt"
    (folder / "LICENSE.txt").rename(target)
    (folder / "LICENSE.txt").symlink_to(target)
    assert run(kit, folder) == 1
    assert "FAIL LICENSE.txt: a symbolic link" in capsys.readouterr().err


def test_a_folder_with_the_users_outputs_beside_the_nine_is_intact(kit, folder, capsys, reads):
    """The kit README has measurements written into the kit's folder: they are listed as
    ignored and never opened (a fifo would block a read)."""
    (folder / "mesures-petit-essai.json").write_text("{}")
    (folder / "sub").mkdir()
    os.mkfifo(folder / "pipe")
    (folder / ".DS_Store").write_bytes(b"\0")
    (folder / "other-link").symlink_to(folder / "README.md")
    assert run(kit, folder) == 0
    out = capsys.readouterr().out
    assert (
        "verify.py: note: ignored, not kit members (never read): .DS_Store, "
        "mesures-petit-essai.json, other-link, pipe, sub\n"
    ) in out
    assert "intact: 9 members match" in out
    assert sorted(reads) == sorted(verify.KIT_NAMES)


def test_a_member_replaced_by_a_folder_or_a_fifo(kit, folder, capsys):
    (folder / "LICENSE.txt").unlink()
    (folder / "LICENSE.txt").mkdir()
    (folder / "README.md").unlink()
    os.mkfifo(folder / "README.md")
    assert run(kit, folder) == 1
    err = capsys.readouterr().err
    assert "FAIL LICENSE.txt: not a regular file" in err
    assert "FAIL README.md: not a regular file" in err
    assert "(2 failed check(s))" in err


def test_a_longer_file_in_a_folder_is_refused_by_its_size(kit, folder, capsys, reads):
    size = (folder / "README.md").stat().st_size
    with (folder / "README.md").open("ab") as handle:
        handle.write(b"more")
    assert run(kit, folder) == 1
    expected = f"FAIL README.md: {size + 4} bytes, the manifest says {size}"
    assert expected in capsys.readouterr().err
    assert "README.md" not in reads  # refused from fstat, before any read
    assert "LICENSE.txt" in reads


def test_a_missing_member_in_a_folder(kit, folder, capsys):
    (folder / "tarifs-forfaits.csv").unlink()
    assert run(kit, folder) == 1
    assert "FAIL tarifs-forfaits.csv: missing" in capsys.readouterr().err


# ---------------------------------------------------------------- the kit README's own check


def readme_check(folder: Path) -> subprocess.CompletedProcess:
    """Run the Python lines the kit's README gives for a check with the standard library
    alone (`-I -S`: no site-packages at all), in the kit's folder."""
    readme = (folder / "README.md").read_text(encoding="utf-8")
    program = re.search(r"^python3 - <<'EOF'\n(.*?)^EOF$", readme, re.S | re.M).group(1)
    return subprocess.run(
        [sys.executable, "-I", "-S", "-"],
        input=program,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_kit_readme_checks_the_kit_with_the_standard_library_alone(kit, folder):
    names = [m["name"] for m in json.loads(kit["members"]["MANIFEST.json"])["members"]]
    eight = [name for name in names if name != "MANIFEST.json"]
    (folder / "mesures.json").write_text("{}")  # the user's own output: not looked at
    result = readme_check(folder)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [f"ok   {name}" for name in eight]
    (folder / "LICENSE.txt").write_bytes(kit["members"]["LICENSE.txt"].replace(b"MIT", b"BSD"))
    (folder / "tarifs-forfaits.csv").unlink()
    result = readme_check(folder)
    assert result.stderr == ""
    expected = {"LICENSE.txt": "FAIL", "tarifs-forfaits.csv": "FAIL"}
    assert result.stdout.splitlines() == [f"{expected.get(name, 'ok  ')} {name}" for name in eight]
