"""Verify that a copy of the kit is intact: its nine members, their sizes and SHA-256.

    python pipeline/verify.py                            # the repo's sources vs MANIFEST.json
    python pipeline/verify.py dist/iteragpu-lab-v1.zip   # a zip
    python pipeline/verify.py DIR                        # an extracted kit folder, or its parent

The reference is the committed MANIFEST.json (or --manifest FILE). It must be valid against
schemas/manifest.schema.json (checked with jsonschema) and list exactly the kit's nine
members. A copy must hold exactly those nine files in one folder, each of the listed size and
SHA-256, with a MANIFEST.json identical to the reference; its resultats-bruts.csv must be an
empty grid and its notebook free of outputs.

A zip is judged first from its central directory, before any member is read: names with
`..`, absolute or drive paths, backslashes or control characters, entries outside
iteragpu-lab-v1/, directory entries, symbolic links or other non-regular modes, duplicates,
encryption, compression other than stored or deflate, sizes other than the manifest's, data
larger than its size needs, zip-bomb ratios. Nothing is ever extracted. Members are then
hashed in chunks, reading at most the declared size plus one byte.

Exit codes: 0 intact; 1 a check failed (each failure names the member and the check);
2 unusable input (no such path, not a zip, a truncated zip, no reference manifest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import stat
import struct
import sys
import zipfile
import zlib
from collections import Counter
from pathlib import Path

import archive

CHUNK = 1 << 16
MAX_ZIP_BYTES = 64 << 20  # far above the kit (about 0.1 MiB): anything larger is not one
MAX_MEMBER_BYTES = 16 << 20
MAX_MANIFEST_BYTES = 1 << 20
MAX_ENTRIES = 64
MAX_RATIO = 100  # deflate on text stays far below; a zip bomb does not
KIT_NAMES = set(archive.MEMBERS)
NAME_LENGTH, EXTRA_LENGTH = 10, 11  # fields of zipfile.structFileHeader, the local header


class Unusable(Exception):
    """The input cannot be judged at all: exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise Unusable(message)


def label(name: str) -> str:
    """An entry name fit for one line: control characters and odd spaces are escaped."""
    return name if re.fullmatch(r"[\x21-\x7e]+", name) else ascii(name)


# ---------------------------------------------------------------- the reference manifest


def load_reference(path: Path) -> tuple[bytes, dict, list[str]]:
    """The reference's bytes, its members by name, and what is wrong with it."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise Unusable(
            f"{path}: no reference manifest (run make archive, or --manifest FILE)"
        ) from None
    except OSError as exc:
        raise Unusable(f"{path}: {exc.strerror}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        return data, {}, [f"{archive.MANIFEST}: larger than {MAX_MANIFEST_BYTES} bytes"]
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        return data, {}, [f"{archive.MANIFEST}: not valid JSON ({exc})"]
    if not isinstance(document, dict) or document.get("schema") != archive.MANIFEST_SCHEMA:
        return data, {}, [f'{archive.MANIFEST}: its "schema" is not {archive.MANIFEST_SCHEMA}']
    import validate  # jsonschema: only once the input is known to be usable

    errors = validate.validate_document(document, validate.load_registry())
    if errors:
        return data, {}, [f"{archive.MANIFEST}: fails its schema at {error}" for error in errors]
    names = [member["name"] for member in document["members"]]
    problems = [
        f"{name}: listed {n} times in the manifest" for name, n in Counter(names).items() if n > 1
    ]
    problems += [
        f"{name}: listed, but not a member of the kit" for name in sorted(set(names) - KIT_NAMES)
    ]
    problems += [
        f"{name}: a member of the kit, not listed" for name in sorted(KIT_NAMES - set(names))
    ]
    return data, {member["name"]: member for member in document["members"]}, problems


# ---------------------------------------------------------------- reading one member


def digest(stream, declared: int, keep: bool) -> tuple[int, str, bytes | None]:
    """SHA-256 of at most declared + 1 bytes, in chunks: a member longer than it claims is
    caught after one extra byte, never read to its end."""
    hasher, count, kept = hashlib.sha256(), 0, []
    while count <= declared:
        chunk = stream.read(min(CHUNK, declared + 1 - count))
        if not chunk:
            break
        count += len(chunk)
        hasher.update(chunk)
        if keep:
            kept.append(chunk)
    return count, hasher.hexdigest(), b"".join(kept) if keep else None


def member_problems(name: str, stream, entry: dict, reference: bytes) -> list[str]:
    if name == archive.MANIFEST:
        count, _, data = digest(stream, len(reference), keep=True)
        return [] if data == reference else [f"{name}: differs from the reference manifest"]
    size = entry["size"]
    count, hexdigest, data = digest(stream, size, keep=name in archive.CONTENT_RULES)
    if count > size:
        return [f"{name}: bigger than the {size} bytes it claims"]
    if count < size:
        return [f"{name}: {count} bytes, the manifest says {size}"]
    if hexdigest != entry["sha256"]:
        return [f"{name}: SHA-256 {hexdigest} differs from the manifest's {entry['sha256']}"]
    rule = archive.CONTENT_RULES.get(name)
    problem = rule(data) if rule else None
    return [f"{name}: {problem}"] if problem else []


def declared_size(name: str, members: dict, reference: bytes) -> int:
    return len(reference) if name == archive.MANIFEST else members[name]["size"]


# ---------------------------------------------------------------- files on disk


def check_files(paths: dict[str, Path], members: dict, reference: bytes) -> list[str]:
    """Members on disk: regular files only (links are not followed), the declared size
    before any read, then the hash."""
    problems = []
    for name, path in sorted(paths.items()):
        if name == archive.MANIFEST and path is None:
            continue  # the repository's own manifest is the reference itself
        try:
            fd = os.open(
                path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
            )
        except OSError as exc:
            problems.append(f"{name}: cannot be opened ({exc.strerror}; links are not followed)")
            continue
        with os.fdopen(fd, "rb") as stream:
            info = os.fstat(stream.fileno())
            size = declared_size(name, members, reference)
            if not stat.S_ISREG(info.st_mode):
                problems.append(f"{name}: not a regular file")
            elif info.st_size != size:
                problems.append(f"{name}: {info.st_size} bytes, the manifest says {size}")
            else:
                problems += member_problems(name, stream, members.get(name), reference)
    return problems


def check_folder(folder: Path, members: dict, reference: bytes) -> list[str]:
    """An extracted kit: exactly the nine names, each a regular file (lstat: no links)."""
    entries = list(os.scandir(folder))
    if (
        len(entries) == 1
        and entries[0].name == archive.KIT
        and entries[0].is_dir(follow_symlinks=False)
    ):
        return check_folder(Path(entries[0].path), members, reference)
    problems, found = [], {}
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.is_symlink():
            problems.append(f"{label(entry.name)}: a symbolic link")
        elif not entry.is_file(follow_symlinks=False):
            problems.append(f"{label(entry.name)}: not a regular file")
        elif entry.name not in KIT_NAMES:
            problems.append(f"{label(entry.name)}: not a member of the kit")
        else:
            found[entry.name] = Path(entry.path)
    problems += [f"{name}: missing" for name in sorted(KIT_NAMES - {e.name for e in entries})]
    if problems:
        return problems
    return check_files(found, members, reference)


# ---------------------------------------------------------------- a zip


def deflate_bound(size: int) -> int:
    """zlib's compressBound: no honest deflate stream of `size` bytes is longer."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 13


def entry_problems(info: zipfile.ZipInfo, count: int) -> list[str]:
    """What the central directory says about one entry, before any byte of it is read."""
    name, shown = info.filename, label(info.filename)
    parts = name.split("/")
    mode = info.external_attr >> 16
    checks = [
        ("\\" in name, "a backslash in its name"),
        (name.startswith("/") or re.match(r"[A-Za-z]:", name) is not None, "an absolute path"),
        (".." in parts, "'..' in its path"),
        (re.search(r"[\x00-\x1f\x7f]", name) is not None, "a control character in its name"),
        (name.endswith("/") or bool(info.external_attr & 0x10), "a directory entry"),
        (stat.S_ISLNK(mode), "a symbolic link"),
        (
            stat.S_IFMT(mode) not in (0, stat.S_IFREG) and not stat.S_ISLNK(mode),
            "not a regular file",
        ),
        (count > 1, f"appears {count} times"),
        (bool(info.flag_bits & 0x1), "encrypted"),
        (
            info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED),
            f"compression method {info.compress_type} (only stored or deflate)",
        ),
    ]
    problems = [f"{shown}: {what}" for failed, what in checks if failed]
    if not problems and (len(parts) != 2 or parts[0] != archive.KIT or parts[1] not in KIT_NAMES):
        problems.append(f"{shown}: not a member of the kit in {archive.FOLDER}")
    return problems


def size_problems(name: str, info: zipfile.ZipInfo, size: int) -> list[str]:
    """The sizes the zip declares, against the manifest and against each other."""
    if size > MAX_MEMBER_BYTES:
        return [f"{name}: the manifest declares {size} bytes, more than any kit member"]
    if info.file_size != size:
        return [f"{name}: the zip says {info.file_size} bytes, the manifest {size}"]
    stored = info.compress_type == zipfile.ZIP_STORED
    if info.compress_size > (size if stored else deflate_bound(size)):
        return [f"{name}: {info.compress_size} bytes of data for {size}: bigger than it claims"]
    if info.file_size > MAX_RATIO * max(info.compress_size, 1):
        return [f"{name}: expands {info.file_size // max(info.compress_size, 1)}x: a zip bomb"]
    return []


def stream_end_problem(handle, info: zipfile.ZipInfo, size: int) -> str | None:
    """zipfile stops at the declared size, but an unzip tool inflates to the end of the
    stream: a deflated member must end exactly at its size. Reads only its compressed bytes
    (already bounded) and inflates at most size + 1 bytes."""
    handle.seek(info.header_offset)
    header = handle.read(zipfile.sizeFileHeader)
    if len(header) != zipfile.sizeFileHeader or header[:4] != zipfile.stringFileHeader:
        return "no local header where the central directory points"
    fields = struct.unpack(zipfile.structFileHeader, header)
    handle.seek(info.header_offset + len(header) + fields[NAME_LENGTH] + fields[EXTRA_LENGTH])
    inflater, produced, left = zlib.decompressobj(-zlib.MAX_WBITS), 0, info.compress_size
    while left and not inflater.eof:
        pending = handle.read(min(CHUNK, left))
        if not pending:
            return "its compressed data is cut short"
        left -= len(pending)
        while pending and not inflater.eof:
            produced += len(inflater.decompress(pending, size + 1 - produced))
            if produced > size:
                return f"inflates past the {size} bytes it claims: bigger than it claims"
            pending = inflater.unconsumed_tail
    if not inflater.eof:
        return "its compressed stream does not end"
    if left or inflater.unused_data:
        return "data after the end of its compressed stream"
    return None


def check_zip(path: Path, members: dict, reference: bytes) -> list[str]:
    size = path.stat().st_size
    if size > MAX_ZIP_BYTES:
        raise Unusable(f"{path}: {size} bytes, larger than any kit ({MAX_ZIP_BYTES})")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError) as exc:
        raise Unusable(f"{path}: not a readable zip ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ENTRIES:
            return [f"{path.name}: {len(infos)} entries, the kit has exactly {len(KIT_NAMES)}"]
        counts = Counter(info.filename for info in infos)
        problems = [p for info in infos for p in entry_problems(info, counts[info.filename])]
        present = {info.filename for info in infos}
        problems += [
            f"{archive.FOLDER}{name}: missing"
            for name in sorted(KIT_NAMES)
            if archive.FOLDER + name not in present
        ]
        by_name = {info.filename[len(archive.FOLDER) :]: info for info in infos}
        if not problems:
            for name, info in sorted(by_name.items()):
                problems += size_problems(name, info, declared_size(name, members, reference))
        if problems:
            return problems  # nothing was read
        with open(path, "rb") as raw:
            for name, info in sorted(by_name.items()):
                try:
                    with zf.open(info) as stream:
                        found = member_problems(name, stream, members.get(name), reference)
                    if not found and info.compress_type == zipfile.ZIP_DEFLATED:
                        problem = stream_end_problem(raw, info, info.file_size)
                        found = [f"{name}: {problem}"] if problem else []
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError) as exc:
                    found = [f"{name}: unreadable in the zip ({exc})"]
                problems += found
    return problems


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="verify.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "path", nargs="?", type=Path, help="a kit zip or folder (default: the repo)"
    )
    parser.add_argument("--manifest", type=Path, help="reference manifest (default: MANIFEST.json)")
    parser.add_argument("--root", type=Path, default=archive.ROOT, help=argparse.SUPPRESS)
    try:
        args = parser.parse_args(argv)
        reference_path = args.manifest or args.root / archive.MANIFEST
        reference, members, problems = load_reference(reference_path)
        target = args.path
        if not problems:
            if target is None:
                sources = {name: args.root / source for name, source in archive.MEMBERS.items()}
                sources[archive.MANIFEST] = None
                problems = check_files(sources, members, reference)
            elif target.is_dir():
                problems = check_folder(target, members, reference)
            elif target.is_file():
                problems = check_zip(target, members, reference)
            else:
                raise Unusable(f"{target}: no such file or folder")
    except Unusable as exc:
        print(f"verify.py: error: {exc}", file=sys.stderr)
        return 2
    what = target if target is not None else f"{args.root} (the repository's members)"
    for problem in problems:
        print(f"verify.py: FAIL {problem}", file=sys.stderr)
    if problems:
        print(f"{what}: NOT intact ({len(problems)} failed check(s))", file=sys.stderr)
        return 1
    print(f"{what}: intact: {len(members)} members match {reference_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
