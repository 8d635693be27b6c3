"""Forked children measure what fresh interpreters measure: the proof, again, with today's code.

    python3 tests/benchmarks/equivalence_grid.py OUTPUT_DIR [--device cuda:0]
        [--reference runs/20261202T131525Z-equivalence-grid] [--configurations N] [--parallel 6]

Every configuration of the reference folder (its measurement files: 12 shapes x 3 dtypes,
warm-up 2, repeats 5, --reference-timing) is measured twice: in children forked by
pipeline/measuring/launcher.py one after another, each started as the previous one exits, as in a
sweep (OUTPUT_DIR/<name>.json); then in fresh interpreters, --parallel at a time
(OUTPUT_DIR/fresh/<name>.json). OUTPUT_DIR/comparison.json says, per configuration, whether
the allocator counters of every phase are identical, and whether the forked ones equal the
reference's (for information: other software versions may differ). OUTPUT_DIR is new.
Exit 0 all identical, 1 a counter differs or a measurement wrote nothing, 2 bad input.
Not a test: it needs a GPU and about two minutes.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root
import gpu_guard  # noqa: E402

from kit import mesure_memoire  # noqa: E402
from pipeline.core import cli  # noqa: E402
from pipeline.measuring import launcher  # noqa: E402

REFERENCE = ROOT / "runs" / "20261202T131525Z-equivalence-grid"
SCHEMA = "urn:iteragpu-lab:schema:equivalence-grid:v1"


def grid_of(reference: Path) -> dict[str, dict]:
    """name -> configuration of every measurement in the reference folder, by name."""
    grid = {}
    for path in sorted(reference.glob("*.json")):
        document = json.loads(path.read_text())
        if document.get("schema") == mesure_memoire.MEASUREMENT_SCHEMA:
            grid[path.stem] = document["configuration"]
    if not grid:
        raise cli.UsageError(f"{reference}: no measurement files to measure again")
    return grid


def argv_for(configuration: dict, device: str, output: Path) -> list[str]:
    argv = ["measure", "--device", device]
    for name in mesure_memoire.CONFIGURATION_DEFAULTS:
        argv += [f"--{name}", str(configuration[name])]
    argv += ["--seed", str(configuration["seed"])]
    if configuration["reference_timing"]:
        argv.append("--reference-timing")
    return [*argv, "--output", str(output)]


def counters(path: Path) -> list[tuple] | None:
    """Every phase's counters, in order; None when there is no file."""
    if not path.is_file():
        return None
    phases = json.loads(path.read_text())["phases"]
    return [tuple(row[key] for key in mesure_memoire.COUNTER_KEYS) for row in phases]


def measure_forked(grid: dict, device: str, out: Path) -> dict[str, int]:
    runner, previous, codes = launcher.Launcher(), None, {}
    for name, configuration in grid.items():
        argv = argv_for(configuration, device, out / f"{name}.json")
        previous = runner.start(argv, after=previous)
        codes[name] = previous.result()
        print(f"{name}: forked, exit {codes[name]}", flush=True)
    if previous is not None:
        previous.wait()
    return codes


def measure_fresh(grid: dict, device: str, out: Path, parallel: int) -> dict[str, int]:
    runner, names, codes = launcher.Launcher(fork=False), list(grid), {}
    for first in range(0, len(names), parallel):
        batch = names[first : first + parallel]
        children = {n: runner.start(argv_for(grid[n], device, out / f"{n}.json")) for n in batch}
        for name, child in children.items():
            codes[name] = child.wait()
            print(f"{name}: fresh, exit {codes[name]}", flush=True)
    return codes


def compare(name, configuration, forked_exit, fresh_exit, out: Path, reference: Path) -> dict:
    forked, fresh = counters(out / f"{name}.json"), counters(out / "fresh" / f"{name}.json")
    compared = forked is not None and fresh is not None
    differing = [
        i for i, (a, b) in enumerate(itertools.zip_longest(forked or [], fresh or [])) if a != b
    ]
    return {
        "name": name,
        "configuration": configuration,
        "forked_exit": forked_exit,
        "fresh_exit": fresh_exit,
        "identical": not differing if compared else None,
        "differing_phases": differing if compared else [],
        "same_as_reference": None
        if forked is None
        else forked == counters(reference / f"{name}.json"),
    }


def run(argv: list[str] | None) -> int:
    parser = cli.Parser(prog="equivalence_grid.py", description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, metavar="OUTPUT_DIR", help="a new folder")
    parser.add_argument("--device", default="cuda:0", help="cuda or cuda:N")
    parser.add_argument("--reference", type=Path, default=REFERENCE, help="a committed grid")
    parser.add_argument("--configurations", type=mesure_memoire.positive_int, help="the first N")
    parser.add_argument("--parallel", type=mesure_memoire.positive_int, default=6)
    args = parser.parse_args(argv)
    device = f"cuda:{mesure_memoire.device_index(cli.device(args.device))}"
    reference = cli.existing_folder(args.reference)
    grid = dict(list(grid_of(reference).items())[: args.configurations])
    if args.output.exists():
        raise cli.UsageError(f"{args.output} already exists: the comparison goes in a new folder")
    cli.existing_folder(args.output.parent)
    gpu_guard.require_gpu("equivalence_grid.py", device)
    args.output.mkdir()
    (args.output / "fresh").mkdir()
    forked = measure_forked(grid, device, args.output)
    fresh = measure_fresh(grid, device, args.output / "fresh", args.parallel)
    rows = [
        compare(name, grid[name], forked[name], fresh[name], args.output, reference)
        for name in grid
    ]
    comparison = {
        "schema": SCHEMA,
        "reference": reference.resolve().name,
        "device": device,
        "counters": list(mesure_memoire.COUNTER_KEYS),
        "forked_process_start": launcher.FORKED,
        "fresh_process_start": launcher.FRESH,
        "configurations": rows,
        "identical": sum(row["identical"] is True for row in rows),
        "differing": [row["name"] for row in rows if row["identical"] is False],
        "not_compared": [row["name"] for row in rows if row["identical"] is None],
    }
    path = args.output / "comparison.json"
    cli.write_new(path, (json.dumps(comparison, indent=2) + "\n").encode())
    same = sum(row["same_as_reference"] is True for row in rows)
    print(
        f"forked vs fresh interpreter: {comparison['identical']}/{len(rows)} configurations with "
        f"identical counters in every phase; differing: {comparison['differing']}; not "
        f"compared: {comparison['not_compared']}; forked equal to {reference.name}: "
        f"{same}/{len(rows)}; {path}"
    )
    return cli.INVALID if comparison["differing"] or comparison["not_compared"] else cli.OK


def main(argv: list[str] | None = None) -> int:
    return cli.run("equivalence_grid.py", lambda: run(argv))


if __name__ == "__main__":
    raise SystemExit(main())
