"""Validate pipeline artefacts against the JSON Schemas in schemas/, then check the facts a
schema cannot state. Reads files, writes nothing.

    python pipeline/validate.py runs/<run-id>/ more.json ...

A folder stands for the artefacts inside it (environment.json, measurement.json). Each file
says which schema it follows in its "schema" key. Exit 0 all valid, 1 any file invalid
(each error printed with its JSON path), 2 unusable input (a path that does not exist).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
RUN_ARTEFACTS = ("environment.json", "measurement.json")
MEASUREMENTS = {"urn:iteragpu-lab:schema:measurement:v1", "urn:iteragpu-lab:schema:measurement:v2"}
FIXED_PHASES = ("model_load", "inputs", "cold_forward", "warmup")


def load_registry(folder: Path = SCHEMAS) -> Registry:
    """Every schema under its $id, so that $ref between files resolves without a network."""
    resources = []
    for path in sorted(folder.glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(contents)
        resources.append((contents["$id"], Resource.from_contents(contents)))
    return Registry().with_resources(resources)


def json_path(parts) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def measurement_facts(document: dict) -> list[str]:
    """Cross-field rules of spec 20-23, each error with its JSON path."""
    errors = []
    phases = document.get("phases", [])
    for i, row in enumerate(phases):
        where = f"$.phases[{i}]"
        for prefix in ("baseline_", "", "peak_"):
            allocated, reserved = row[f"{prefix}allocated_bytes"], row[f"{prefix}reserved_bytes"]
            if allocated > reserved:
                errors.append(
                    f"{where}: {prefix}allocated_bytes {allocated} > {prefix}reserved_bytes "
                    f"{reserved} (allocated is part of reserved)"
                )
        for kind in ("allocated", "reserved"):
            peak = row[f"peak_{kind}_bytes"]
            for start in (f"baseline_{kind}_bytes", f"{kind}_bytes"):
                if peak < row[start]:
                    errors.append(f"{where}: peak_{kind}_bytes {peak} < {start} {row[start]}")
    configuration = document["configuration"]
    repeats = configuration["repeats"]
    expected = [*FIXED_PHASES, *(["warm_forward"] * repeats)]
    names = [row["phase"] for row in phases]
    if document["status"] == "completed" and names != expected:
        errors.append(
            f"$.phases: {len(names)} rows, expected {len(expected)} for repeats={repeats}"
        )
    if document["status"] == "out_of_memory":
        failed = document["failure"]["phase"]
        if names != expected[: len(names)] or len(names) >= len(expected):
            errors.append("$.phases: rows of an out-of-memory run must be a prefix of the plan")
        elif expected[len(names)] != failed:
            errors.append(
                f"$.failure.phase: {failed!r}, but the next planned phase is "
                f"{expected[len(names)]!r}"
            )
    repetitions = [row.get("repetition") for row in phases if row["phase"] == "warm_forward"]
    if repetitions != list(range(1, len(repetitions) + 1)):
        errors.append(f"$.phases: warm_forward repetitions {repetitions} are not 1, 2, ...")
    for i, row in enumerate(phases):
        if row["phase"] != "warm_forward" and "repetition" in row:
            errors.append(f"$.phases[{i}]: only warm_forward rows carry a repetition")
        want = configuration["warmup"] if row["phase"] == "warmup" else 1
        if row["passes"] != want:
            errors.append(f"$.phases[{i}].passes: {row['passes']}, expected {want}")
    if configuration["input_shape"] != [
        configuration["batch"],
        configuration["context"],
        configuration["width"],
    ]:
        errors.append("$.configuration.input_shape: not [batch, context, width]")
    return errors


def validate_document(document, registry: Registry) -> list[str]:
    """Schema errors first (with paths); facts only once the shape is known to be right."""
    if not isinstance(document, dict) or not isinstance(document.get("schema"), str):
        return ['$: not an artefact: no "schema" key naming its schema']
    try:
        schema = registry.contents(document["schema"])
    except LookupError:
        return [f"$.schema: unknown schema {document['schema']!r}"]
    validator = Draft202012Validator(
        schema, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path)))
    if errors:
        return [f"{json_path(e.absolute_path)}: {e.message}" for e in errors]
    if document["schema"] in MEASUREMENTS:
        return measurement_facts(document)
    return []


def validate_file(path: Path, registry: Registry) -> list[str]:
    try:
        document = json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError) as exc:
        return [f"$: not valid JSON ({exc})"]
    return validate_document(document, registry)


def expand(paths: list[str]) -> list[Path]:
    """Run folders stand for their artefacts; a missing path is unusable input."""
    files = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = [path / name for name in RUN_ARTEFACTS if (path / name).is_file()]
            if not found:
                raise FileNotFoundError(f"{path}: no {' or '.join(RUN_ARTEFACTS)} inside")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="validate.py", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="artefact files or run folders")
    args = parser.parse_args(argv)
    try:
        files = expand(args.paths)
    except FileNotFoundError as exc:
        print(f"validate.py: error: {exc}", file=sys.stderr)
        return 2
    registry = load_registry()
    invalid = 0
    for path in files:
        errors = validate_file(path, registry)
        for error in errors:
            print(f"{path}: {error}", file=sys.stderr)
        invalid += bool(errors)
        if not errors:
            print(f"{path}: valid")
    return 1 if invalid else 0


if __name__ == "__main__":
    raise SystemExit(main())
