"""Unite the results logs of several machines into one new log.

    python -m pipeline.stages.merge A.csv B.csv ... --output NEW.csv

A team that rents many machines keeps one log: bring each machine's runs/resultats-bruts.csv
home, then merge. Every row of every input is validated again (validate.py: schema, facts,
quality rules). Rows are deduplicated by run id: the same run in two logs must be the same
row, except that a copy whose quality columns were filled (protocole-qualite.md, section 3)
wins over one where they are still empty. Any other difference is a conflict, and so is one
measurement under two run ids. The output is new (never written over), sorted by run id
(that is, by time), and written whole or not at all; after an invalid row or a conflict,
nothing is written. Logs with the kit's header, decoder logs (the kit's columns, then the
decoder's) and own-model logs (the decoder log's columns, then the own model's) merge alike:
the output has the widest header among the inputs', where a seed-network row reads workload
"network" and every row has empty cells for the columns of the other workloads.

Exit 0 written; 1 an invalid row or a conflict; 2 bad input (a missing input, a file that
is not a results log at all: not UTF-8, or its first line no log's header; an output that
exists).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.artefacts import validate
from pipeline.core import cli
from pipeline.stages import record


def judged(row: dict) -> bool:
    return any(row[column] for column in validate.QUALITY)


def same_run(a: dict, b: dict) -> bool:
    """Equal in every column the pipeline fills (the quality columns may differ)."""
    return all(a[column] == b[column] for column in a if column not in validate.QUALITY)


def merge_rows(logs: list[tuple[str, list[tuple[int, dict]]]]) -> tuple[list[dict], list[str]]:
    """The union of the logs' rows by run id, sorted by run id, and the conflicts found.
    `logs` holds (name, [(line, row), ...]) as validate.check_log gives them."""
    kept: dict[str, tuple[str, dict]] = {}  # run id -> (where it was read, row)
    runs_of: dict[str, str] = {}  # measurement_sha256 -> the run id it was first read under
    conflicts = []
    for name, rows in logs:
        for line, row in rows:
            where = f"{name}: line {line}"
            run_id = runs_of.setdefault(row["measurement_sha256"], row["run_id"])
            if run_id != row["run_id"]:
                conflicts.append(
                    f"{where}: $.measurement_sha256: the measurement of run {run_id} "
                    f"({kept[run_id][0]}) under another run id"
                )
                continue
            first_where, first = kept.setdefault(row["run_id"], (where, row))
            if first == row:
                continue
            if same_run(first, row) and not (judged(first) and judged(row)):
                if judged(row):  # the copy whose quality columns were filled wins
                    kept[row["run_id"]] = (where, row)
                continue
            conflicts.append(f"{where}: $.run_id: {row['run_id']} differs from {first_where}")
    return [row for _, (_, row) in sorted(kept.items())], conflicts


# What validate.log_records says of a file that is no results log at all, not of a log
NOT_A_LOG = ("$: not UTF-8", "line 1: not the header of")


def merge(inputs: list[Path], output: Path) -> int:
    if output.is_symlink() and not output.exists():
        raise cli.UsageError(
            f"{output} is a dangling symbolic link: a merge writes a new file only, never "
            "through a link"
        )
    if output.exists():
        raise cli.UsageError(f"{output} already exists: a merge writes a new file only")
    cli.existing_folder(output.parent)
    data = {path: validate.read_shared(path) for path in inputs}
    protocol = validate.Protocol()
    registry = validate.load_registry()
    errors, logs = [], []
    for path, content in data.items():
        rows, problems = validate.check_log(content, registry, protocol, keep_rows=True)
        if shape := next((p for p in problems if p.startswith(NOT_A_LOG)), None):
            raise cli.UsageError(f"{path}: {shape}: not a results log")
        errors += [f"{path}: {problem}" for problem in problems]
        logs.append((str(path), rows))
    # the widest header of the inputs': each header is the one before it and more columns
    header = max((validate.log_header(content) for content in data.values()), key=len)
    logs = [(name, [(n, validate.as_header(r, header)) for n, r in rows]) for name, rows in logs]
    if not errors:
        merged, errors = merge_rows(logs)
    if errors:
        return cli.refused(errors, f"merge.py: nothing written to {output}")
    lines = [record.csv_line(header)]
    lines += [record.csv_line(row[column] for column in header) for row in merged]
    try:
        cli.write_new(output, b"".join(lines))
    except FileExistsError:
        raise cli.UsageError(f"{output} appeared meanwhile: left untouched") from None
    read = sum(len(rows) for _, rows in logs)
    print(f"{output}: {len(merged)} runs from {len(logs)} logs ({read} rows read)")
    return cli.OK


def main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(prog="merge.py", description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, metavar="LOG", help="results logs")
    parser.add_argument("--output", type=Path, required=True, help="a new CSV file")

    return cli.run("merge.py", lambda: merge(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    raise SystemExit(main())
