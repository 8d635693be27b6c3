"""The one JSON reader for what a user hands the lab: a size limit checked before the file is
read whole, a depth limit, and no key given twice.

A JSON object that names a key twice says two things: Python's json keeps the last silently,
and another reader may keep the first. Both readings are refused, as is a document nested
deeper than any the lab writes or reads (a config.json is a few levels deep; an artefact a
dozen), and a file larger than its limit, refused from its size before it is read. Every
refusal is a ValueError whose message is one line, without the path: the caller says which
file or option it was.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_DEPTH = 64  # arrays and objects inside one another


class JsonInputError(ValueError):
    """Text that is not JSON the lab reads: one line, without the path."""


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonInputError(f"the key {key!r} is given twice in one object")
            seen.add(key)
    return document


def _refuse_constant(name: str):
    raise JsonInputError(f"{name} is not a JSON number")


def depth(document: object) -> int:
    """How many arrays and objects lie inside one another, without recursion."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def loads(
    data: bytes | str, *, constants: bool = False, max_depth: int | None = MAX_DEPTH
) -> object:
    """Standard JSON, each key once per object, nested at most `max_depth` deep (None: as deep
    as Python parses); NaN and Infinity only with `constants` (a config.json may hold them:
    Falcon-H1's time_step_limit). Anything else raises a ValueError of one line: a
    JsonInputError, or a UnicodeDecodeError for bytes that are not UTF-8."""
    hooks = {} if constants else {"parse_constant": _refuse_constant}
    too_deep = "nested too deeply" if max_depth is None else f"nested over {max_depth} levels deep"
    try:
        document = json.loads(data, object_pairs_hook=_no_duplicates, **hooks)
    except RecursionError:
        raise JsonInputError(too_deep) from None
    except json.JSONDecodeError as exc:
        raise JsonInputError(str(exc)) from None
    if max_depth is not None and depth(document) > max_depth:
        raise JsonInputError(too_deep)
    return document


def read_limited(path: Path, max_bytes: int) -> bytes:
    """The bytes of a file of at most `max_bytes`, refused from its size before it is read
    (a file growing while read is cut at the limit and refused the same way)."""
    size = path.stat().st_size
    if size > max_bytes:
        raise JsonInputError(f"{size:,} bytes, over the limit of {max_bytes:,} bytes")
    with path.open("rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JsonInputError(f"over the limit of {max_bytes:,} bytes")
    return data
