"""The command line of a generated source (the kit script, the kit's notebook): written whole
from its sources, or with --check only compared with them (exit 1 if it is stale), so that a
test and `make archive` can refuse a committed file that was edited by hand."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path


def main(
    prog: str,
    description: str,
    target: Path,
    render: Callable[[Path], bytes],
    errors: tuple[type[BaseException], ...],
    root: Path,
    argv: list[str] | None,
) -> int:
    """`target` (relative to --root) made by render(root); a source that fails with one of
    `errors` is one line and exit 2, nothing written."""
    module = f"pipeline.kit.{prog.removesuffix('.py')}"
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {target.name} is stale")
    parser.add_argument("--root", type=Path, default=root, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    path = args.root / target
    try:
        data = render(args.root)
    except errors as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if path.is_file() and path.read_bytes() == data:
        print(f"{target}: up to date")
        return 0
    if args.check:
        print(f"{prog}: {target} is stale: run python -m {module}")
        return 1
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)  # a generated source, like a formatter's output: replaced whole
    print(f"{target}: written")
    return 0
