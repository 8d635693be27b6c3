"""Unite the results logs of several machines into one new log.

    python pipeline/merge.py A.csv B.csv ... --output NEW.csv

A team that rents many machines keeps one log: bring each machine's runs/resultats-bruts.csv
home, then merge. Every row of every input is validated again (validate.py: schema, facts,
quality rules). Rows are deduplicated by run id: the same run in two logs must be the same
row, except that a copy whose quality columns were filled (protocole-qualite.md, section 3)
wins over one where they are still empty. Any other difference is a conflict. The output is
new (never written over), sorted by run id (that is, by time), and written whole or not at
all; after an invalid row or a conflict, nothing is written.

Exit 0 written; 1 an invalid row or a conflict; 2 bad input (a missing input, an output
that exists).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import record
import validate


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise validate.Usage(message)


def judged(row: dict) -> bool:
    return any(row[column] for column in validate.QUALITY)


def same_run(a: dict, b: dict) -> bool:
    """Equal in every column the pipeline fills (the quality columns may differ)."""
    return all(a[column] == b[column] for column in a if column not in validate.QUALITY)


def merge_rows(logs: list[tuple[str, list[tuple[int, dict]]]]) -> tuple[list[dict], list[str]]:
    """The union of the logs' rows by run id, sorted by run id, and the conflicts found.
    `logs` holds (name, [(line, row), ...]) as validate.parse_log gives them."""
    kept: dict[str, tuple[str, dict]] = {}  # run id -> (where it was read, row)
    conflicts = []
    for name, rows in logs:
        for line, row in rows:
            where = f"{name}: line {line}"
            earlier = kept.setdefault(row["run_id"], (where, row))
            first_where, first = earlier
            if first == row:
                continue
            if same_run(first, row) and not (judged(first) and judged(row)):
                if judged(row):  # the copy whose quality columns were filled wins
                    kept[row["run_id"]] = (where, row)
                continue
            conflicts.append(f"{where}: $.run_id: {row['run_id']} differs from {first_where}")
    return [row for _, (_, row) in sorted(kept.items())], conflicts


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="merge.py", description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, metavar="LOG", help="results logs")
    parser.add_argument("--output", type=Path, required=True, help="a new CSV file")
    try:
        args = parser.parse_args(argv)
        if args.output.exists():
            raise validate.Usage(f"{args.output} already exists: a merge writes a new file only")
        if not args.output.parent.is_dir():
            raise validate.Usage(f"{args.output.parent} is not an existing folder")
        data = {path: validate.read_shared(path) for path in args.inputs}
        protocol = validate.Protocol()
    except (validate.Usage, OSError) as exc:
        print(f"merge.py: error: {exc}", file=sys.stderr)
        return 2
    registry = validate.load_registry()
    header = validate.kit_header()
    errors, logs = [], []
    for path, content in data.items():
        errors += [f"{path}: {e}" for e in validate.log_errors(content, registry, protocol)]
        logs.append((str(path), validate.parse_log(content, header)[0]))
    if not errors:
        merged, errors = merge_rows(logs)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        print(f"merge.py: nothing written to {args.output}", file=sys.stderr)
        return 1
    lines = [record.csv_line(header)]
    lines += [record.csv_line(row[column] for column in header) for row in merged]
    try:
        record.write_new(args.output, b"".join(lines))
    except FileExistsError:
        print(f"merge.py: error: {args.output} appeared meanwhile: left untouched", file=sys.stderr)
        return 2
    read = sum(len(rows) for _, rows in logs)
    print(f"{args.output}: {len(merged)} runs from {len(logs)} logs ({read} rows read)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
