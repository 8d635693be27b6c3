"""Verify that a copy of the kit holds the nine members of MANIFEST.json, byte for byte.

    python -m pipeline.kit.verify                           # the repo's sources vs MANIFEST.json
    python -m pipeline.kit.verify dist/iteragpu-lab-v1.zip  # a zip, as built or zipped again
    python -m pipeline.kit.verify DIR                       # an extracted kit folder, or its parent

The reference is the committed MANIFEST.json (or --manifest FILE), valid against
schemas/manifest.schema.json and listing exactly the kit's nine members. Content is what is
judged, member by member, and every member that differs is named: each of the listed size
and SHA-256, the copy's MANIFEST.json identical to the reference, resultats-bruts.csv an
empty grid, the notebook free of outputs. Layout is not content: a zip made again (`zip -r`
adds directory entries; another order, compression, times, permissions or extra fields) gets
notes. In a folder, files beside the nine (your own outputs) are listed as ignored and never
read; a zip is the kit as it travels, nine members in one folder: one with any other file is
not the kit, and its extra entries are named and refused (none is read).

A zip is refused from its central directory, before any member is read, when an entry is
hostile: `..`, absolute or drive paths, backslashes or control characters, entries outside
iteragpu-lab-v1/, symbolic links or other non-regular modes, duplicates, encryption,
compression other than stored or deflate, data larger than its size needs, zip-bomb ratios.
Nothing is ever extracted; members are hashed in chunks, reading at most their declared size
plus one byte.

Exit codes: 0 the nine members intact (notes aside); 1 a member differs or is missing, or
the zip holds other files or is hostile (each failure names the entry and the check); 2
unusable input (no such path, not a zip, a truncated zip, not a kit folder, no reference
manifest).
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
import time
import zipfile
import zlib
from collections import Counter
from pathlib import Path

from pipeline.core import cli
from pipeline.kit import archive

CHUNK = 1 << 16
MAX_ZIP_BYTES = 64 << 20  # far above the kit (about 0.1 MiB): anything larger is not one
MAX_MEMBER_BYTES = 16 << 20
MAX_MANIFEST_BYTES = 1 << 20
MAX_ENTRIES = 1000  # the nine, their folder, and room for a user's own outputs
MAX_RATIO = 100  # deflate on text stays far below; a zip bomb does not
KIT_NAMES = set(archive.MEMBERS)
# Names any folder may hold: alone, they do not make a folder a kit folder.
COMMON_NAMES = {"README.md", "LICENSE.txt"}
NAME_LENGTH, EXTRA_LENGTH = 10, 11  # fields of zipfile.structFileHeader, the local header
DATA_DESCRIPTOR, ENCRYPTED, MSDOS_DIRECTORY = 0x08, 0x01, 0x10
SHOWN = 5  # names listed in one note before "and N more"


def label(name: str) -> str:
    """An entry name fit for one line: control characters and odd spaces are escaped."""
    return name if re.fullmatch(r"[\x21-\x7e]+", name) else ascii(name)


def listing(names) -> str:
    """A few names for one line, then how many more."""
    names = [label(name) for name in sorted(names)]
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


# ---------------------------------------------------------------- the reference manifest


def load_reference(path: Path) -> tuple[bytes, dict, list[str]]:
    """The reference's bytes, its members by name, and what is wrong with it."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise cli.UsageError(
            f"{path}: no reference manifest (run make archive, or --manifest FILE)"
        ) from None
    except OSError as exc:
        raise cli.UsageError(f"{path}: {exc.strerror}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        return data, {}, [f"{archive.MANIFEST}: larger than {MAX_MANIFEST_BYTES} bytes"]
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        return data, {}, [f"{archive.MANIFEST}: not valid JSON ({exc})"]
    if not isinstance(document, dict) or document.get("schema") != archive.MANIFEST_SCHEMA:
        return data, {}, [f'{archive.MANIFEST}: its "schema" is not {archive.MANIFEST_SCHEMA}']
    from pipeline.artefacts import validate  # jsonschema: only once the input is known to be usable

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


def kit_folder(folder: Path) -> Path:
    """The folder to judge: `folder` itself when it holds a name only the kit has, else its
    iteragpu-lab-v1/ (the parent an unzip made). Anything else is no kit folder at all."""
    names = set(os.listdir(folder))
    if names & (KIT_NAMES - COMMON_NAMES):
        return folder
    inner = folder / archive.KIT
    if archive.KIT in names and inner.is_dir() and not inner.is_symlink():
        return inner
    hint = ""
    if archive.ZIP_NAME in names:
        hint = f"; to check the zip in it: verify.py {folder / archive.ZIP_NAME}"
    raise cli.UsageError(
        f"{folder}: not a kit folder (none of the kit's files, no {archive.FOLDER} in it){hint}"
    )


def check_folder(folder: Path, members: dict, reference: bytes) -> tuple[list[str], list[str]]:
    """An extracted kit: the nine names, each a regular file (lstat: no links); anything
    else in the folder is the user's and is listed, never opened."""
    folder = kit_folder(folder)
    problems, found, ignored = [], {}, []
    entries = sorted(os.scandir(folder), key=lambda e: e.name)
    for entry in entries:
        if entry.name not in KIT_NAMES:
            ignored.append(entry.name)
        elif entry.is_symlink():
            problems.append(f"{entry.name}: a symbolic link")
        elif not entry.is_file(follow_symlinks=False):
            problems.append(f"{entry.name}: not a regular file")
        else:
            found[entry.name] = Path(entry.path)
    present = {entry.name for entry in entries}
    problems += [f"{name}: missing" for name in sorted(KIT_NAMES - present)]
    problems += check_files(found, members, reference)
    notes = [f"ignored, not kit members (never read): {listing(ignored)}"] if ignored else []
    return sorted(problems), notes


# ---------------------------------------------------------------- a zip


def deflate_bound(size: int) -> int:
    """zlib's compressBound: no honest deflate stream of `size` bytes is longer."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 13


def is_directory(info: zipfile.ZipInfo) -> bool:
    return info.filename.endswith("/")


def is_member(info: zipfile.ZipInfo) -> bool:
    return info.filename.removeprefix(archive.FOLDER) in KIT_NAMES and info.filename.startswith(
        archive.FOLDER
    )


def entry_problems(info: zipfile.ZipInfo, count: int) -> list[str]:
    """What makes one entry hostile, from the central directory, before any byte is read:
    what unzip would write outside the kit's folder, or anything but plain data, or data
    that lies about its size."""
    name, shown = info.filename, label(info.filename)
    parts = name.rstrip("/").split("/")
    mode = info.external_attr >> 16
    directory = is_directory(info)
    marked_directory = stat.S_ISDIR(mode) or bool(info.external_attr & MSDOS_DIRECTORY)
    stored = info.compress_type == zipfile.ZIP_STORED
    checks = [
        ("\\" in name, "a backslash in its name"),
        (name.startswith("/") or re.match(r"[A-Za-z]:", name) is not None, "an absolute path"),
        (".." in parts, "'..' in its path"),
        (re.search(r"[\x00-\x1f\x7f]", name) is not None, "a control character in its name"),
        (stat.S_ISLNK(mode), "a symbolic link"),
        (
            not stat.S_ISLNK(mode)
            and stat.S_IFMT(mode) not in (0, stat.S_IFDIR if directory else stat.S_IFREG),
            "not a regular file",
        ),
        (marked_directory and not directory, "marked as a directory, named as a file"),
        (directory and info.file_size > 0, f"a directory entry holding {info.file_size} bytes"),
        (count > 1, f"appears {count} times"),
        (bool(info.flag_bits & ENCRYPTED), "encrypted"),
        (
            info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED),
            f"compression method {info.compress_type} (only stored or deflate)",
        ),
        (
            info.compress_size > (info.file_size if stored else deflate_bound(info.file_size)),
            f"{info.compress_size} bytes of data for {info.file_size}: bigger than it claims",
        ),
        (
            info.file_size > MAX_RATIO * max(info.compress_size, 1),
            f"expands {info.file_size // max(info.compress_size, 1)}x: a zip bomb",
        ),
    ]
    problems = [f"{shown}: {what}" for failed, what in checks if failed]
    if not problems and not name.startswith(archive.FOLDER):
        problems.append(f"{shown}: outside {archive.FOLDER}: not a member of the kit")
    return problems


def size_problems(name: str, info: zipfile.ZipInfo, size: int) -> list[str]:
    """A member whose declared size is not the manifest's differs: it is not read."""
    if size > MAX_MEMBER_BYTES:
        return [f"{name}: the manifest declares {size} bytes, more than any kit member"]
    if info.file_size != size:
        return [f"{name}: the zip says {info.file_size} bytes, the manifest {size}"]
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


def layout_notes(zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo]) -> list[str]:
    """How the zip differs from what archive.py builds, where content is not at stake."""
    kit = [info for info in infos if is_member(info)]
    directories = [info.filename for info in infos if is_directory(info)]
    build_time = time.gmtime(archive.DEFAULT_EPOCH)[:6]
    stored = [info.filename for info in kit if info.compress_type == zipfile.ZIP_STORED]
    modes = [
        info.filename
        for info in kit
        if info.create_system != 3 or info.external_attr >> 16 != archive.FILE_MODE
    ]
    notes = [
        (
            directories,
            f"directory entries (unzip makes the folders anyway): {listing(directories)}",
        ),
        (
            [info.filename for info in kit] != sorted(info.filename for info in kit),
            "the members are in another order than the build's (sorted by name)",
        ),
        (stored, f"stored without compression: {listing(stored)}"),
        (
            any(info.date_time != build_time for info in kit),
            "file times other than the build's {:04}-{:02}-{:02} {:02}:{:02}:{:02}".format(
                *build_time
            ),
        ),
        (modes, f"permissions other than the build's (Unix, 0644): {listing(modes)}"),
        (any(info.extra for info in kit), "extra fields (times, owners) on the members"),
        (
            any(info.flag_bits & DATA_DESCRIPTOR for info in kit),
            "sizes written after the data (data descriptors)",
        ),
        (zf.comment, "an archive comment"),
    ]
    return [note for present, note in notes if present]


def check_zip(path: Path, members: dict, reference: bytes) -> tuple[list[str], list[str]]:
    size = path.stat().st_size
    if size > MAX_ZIP_BYTES:
        raise cli.UsageError(f"{path}: {size} bytes, larger than any kit ({MAX_ZIP_BYTES})")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError) as exc:
        raise cli.UsageError(f"{path}: not a readable zip ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ENTRIES:
            return [f"{path.name}: {len(infos)} entries, more than a kit copy holds"], []
        counts = Counter(info.filename for info in infos)
        hostile = [p for info in infos for p in entry_problems(info, counts[info.filename])]
        if hostile:
            return hostile, []  # nothing was read
        extra = [info.filename for info in infos if not is_directory(info) and not is_member(info)]
        if extra:  # a sitecustomize.py beside the scripts would run with them: not the kit
            return [
                f"{path.name}: {len(extra)} file(s) besides the kit's {len(KIT_NAMES)} members, "
                f"so not the kit (never read): {listing(extra)}"
            ], []
        by_name = {info.filename[len(archive.FOLDER) :]: info for info in infos if is_member(info)}
        problems = [
            f"{archive.FOLDER}{name}: missing" for name in sorted(KIT_NAMES - by_name.keys())
        ]
        with open(path, "rb") as raw:
            for name, info in sorted(by_name.items()):
                found = size_problems(name, info, declared_size(name, members, reference))
                if found:
                    problems += found  # not read: its size already says it differs
                    continue
                try:
                    with zf.open(info) as stream:
                        found = member_problems(name, stream, members.get(name), reference)
                    if not found and info.compress_type == zipfile.ZIP_DEFLATED:
                        problem = stream_end_problem(raw, info, info.file_size)
                        found = [f"{name}: {problem}"] if problem else []
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError) as exc:
                    found = [f"{name}: unreadable in the zip ({exc})"]
                problems += found
        return problems, layout_notes(zf, infos)


# ---------------------------------------------------------------- command line


def verify_command(args: argparse.Namespace) -> int:
    """The reference manifest, then the repository's members, a folder or a zip against it."""
    reference_path = args.manifest or args.root / archive.MANIFEST
    reference, members, problems = load_reference(reference_path)
    target, notes = args.path, []
    if not problems:
        if target is None:
            sources = {name: args.root / source for name, source in archive.MEMBERS.items()}
            sources[archive.MANIFEST] = None
            problems = check_files(sources, members, reference)
        elif target.is_dir():
            problems, notes = check_folder(target, members, reference)
        elif target.is_file():
            problems, notes = check_zip(target, members, reference)
        else:
            raise cli.UsageError(f"{target}: no such file or folder")
    what = target if target is not None else f"{args.root} (the repository's members)"
    problems = list(dict.fromkeys(problems))  # a duplicated entry's FAIL, said once
    for note in notes:
        print(f"verify.py: note: {note}")
    for problem in problems:
        print(f"verify.py: FAIL {problem}", file=sys.stderr)
    if problems:
        print(f"{what}: NOT intact ({len(problems)} failed check(s))", file=sys.stderr)
        return cli.INVALID
    noted = f"; {len(notes)} note(s) above, none about the content" if notes else ""
    print(f"{what}: intact: {len(members)} members match {reference_path}{noted}")
    return cli.OK


def main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(prog="verify.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "path", nargs="?", type=Path, help="a kit zip or folder (default: the repo)"
    )
    parser.add_argument("--manifest", type=Path, help="reference manifest (default: MANIFEST.json)")
    parser.add_argument("--root", type=Path, default=archive.ROOT, help=argparse.SUPPRESS)
    return cli.run("verify.py", lambda: verify_command(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
