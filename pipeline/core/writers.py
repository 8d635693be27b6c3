"""Result files: written whole or not at all, never over another name, refused before any work.

refuse_existing runs before the GPU is touched; write_new links a complete file to a new name
(O_TMPFILE on Linux, so even `kill -9` leaves nothing behind); write_result turns a file
system's refusal into one line. utc_now is the timestamp every document carries.

A core module of the kit script (make_kit_script.py says how): standard library only,
Python >= 3.10, PyTorch imported inside the functions that need it.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path

from pipeline.core.arguments import UsageError


def refuse_existing(path: Path) -> None:
    """Checked before any work: an existing result is never replaced, and a folder that cannot
    take a new file is refused before the GPU is touched rather than after the measurement."""
    if os.path.lexists(path):
        raise UsageError(f"{path} already exists: results are never overwritten; choose a new name")
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent} is not an existing folder")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UsageError(f"{path.parent} is not writable: no new file can be made there")


def json_bytes(document: dict) -> bytes:
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def write_new(path: Path, data: bytes) -> None:
    """Whole file or nothing, never over another name, mode 0666 less the umask.

    On Linux the data goes into an unnamed file (O_TMPFILE) that is linked to its name only
    when complete, so even `kill -9` leaves nothing behind; elsewhere a named temp file beside
    it is linked, then removed.
    """
    mode = 0o666 & ~current_umask()
    try:
        if not os.path.isdir("/proc/self/fd"):  # linking an unnamed file goes through it
            raise OSError("no /proc")
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY, mode)
        temp = None
    except (AttributeError, OSError):  # no O_TMPFILE here, or not on this file system
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            # FileExistsError if the name was taken meanwhile: the other file is untouched.
            if temp is None:
                link_unnamed(handle.fileno(), path)
            else:
                os.link(temp, path)
    finally:
        if temp is not None:
            os.unlink(temp)


def link_unnamed(fd: int, path: Path) -> None:
    """linkat(AT_SYMLINK_FOLLOW) of an O_TMPFILE; a directory descriptor makes os.link use it."""
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=folder, follow_symlinks=True)
    finally:
        os.close(folder)


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_result(path: Path, document: dict) -> None:
    """Any failure to write is the user's file system refusing: one line, nothing left."""
    try:
        write_new(path, json_bytes(document))
    except FileExistsError:
        raise UsageError(f"{path} appeared during the run: it was left untouched") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{path} cannot be written ({reason}): nothing was written") from None


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def document_head(schema: str, tool: dict, status: str | None = None) -> dict:
    """The fields a result file opens with, in this order: what it is, what wrote it, when,
    and (a measurement or a prediction) how it ended."""
    head = {"schema": schema, "tool": tool, "created_utc": utc_now()}
    if status is not None:
        head["status"] = status
    return head
