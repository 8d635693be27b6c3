"""What every pipeline script shares on its command line: one-line errors, exit codes, new files.

A usage error is one line on stderr and exit 2, with nothing written. `UsageError` and
`write_new` are those of arguments.py and writers.py, so that there is one of each; the kit
script `mesure_memoire.py` ships alone with its own copy of them (make_kit_script.py).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.core import arguments, writers

OK, INVALID, USAGE, OUT_OF_MEMORY, INTERRUPTED = 0, 1, 2, 3, 130

UsageError = arguments.UsageError
write_new = writers.write_new


class Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def run(prog: str, body: Callable[[], int], interrupted: str = "every file written is whole"):
    """Call body(); a UsageError or OSError becomes one line and exit 2, Ctrl-C exit 130; a
    reader that stopped early (`| head`) ends it quietly, exit 1."""
    try:
        return body()
    except BrokenPipeError:  # `| head` stopped reading: Python's documented way to stay quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return INVALID
    except (UsageError, OSError) as exc:
        print(f"{prog}: error: {os_message(exc)}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted: {interrupted}", file=sys.stderr)
        return INTERRUPTED


def os_message(exc: Exception) -> str:
    """An error in a user's words: `PATH: no such file or directory`, not `[Errno 2] ...`."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror[0].lower()}{exc.strerror[1:]}"
    return str(exc)


def device(text: str) -> str:
    """A GPU device as `measure` takes it (`cuda` or `cuda:N`), checked before any work."""
    try:
        arguments.device_index(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"argument --device: {exc}") from None
    return text


def shown(text: str) -> str:
    """A value as a message quotes it: its repr, cut to 40 characters."""
    quoted = repr(text)
    return quoted if len(quoted) <= 40 else quoted[:39] + "…"


def bounded_int(limit: int) -> Callable[[str], int]:
    """An option's parser: a positive integer of digits only, at most `limit`, the limit said
    in the refusal (a batch of 10**18 overflows PyTorch's byte count; a rank of 10**30 is no
    integer peft takes)."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,30}", text) or not 0 < int(text) <= limit:
            raise argparse.ArgumentTypeError(
                f"expected a positive integer at most {limit}, got {shown(text)}"
            )
        return int(text)

    parse.__name__ = "positive integer"  # argparse names the type by it in its own errors
    return parse


def progress_line(prog: str) -> Callable[[str | None], None] | None:
    """On a terminal, one stderr line rewritten as a long command goes, the seconds since it
    began beside it (a large model's generation takes minutes to trace on a laptop); None
    clears the line, so that the answer is all that stays. None where stderr is not a
    terminal: nothing of it reaches a pipe or a file."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()

    def say(what: str | None) -> None:
        seconds = time.monotonic() - started
        shown = "" if what is None else f"{prog}: {what}... {seconds:.0f} s"
        print(f"\r\033[K{shown}", end="", file=sys.stderr, flush=True)

    return say


def announced(phase: Callable, say: Callable[[str | None], None] | None) -> Callable:
    """A phase runner that first tells `say` which phase (and repetition) it runs."""
    if say is None:
        return phase

    def each(name: str, operation, repetition: int | None = None, passes: int = 1):
        say(f"tracing {name}" + (f" {repetition}" if repetition else ""))
        return phase(name, operation, repetition, passes)

    return each


def existing_file(path: Path, flag: str) -> bytes:
    """The bytes of the file a flag names, or one line saying it is missing or not a file."""
    if not path.exists():
        raise UsageError(f"{flag} {path}: no such file")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: not a file")
    return path.read_bytes()


def refused(errors: list[str], what_not_done: str) -> int:
    """Each error on a line of its own, then what was not done for them: exit 1."""
    print("\n".join(errors), file=sys.stderr)
    print(what_not_done, file=sys.stderr)
    return INVALID


def existing_folder(path: Path) -> Path:
    """A folder that must exist already (runs directories are never created implicitly)."""
    if not path.is_dir():
        raise UsageError(f"{path} is not an existing folder")
    return path
