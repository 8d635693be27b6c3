"""The measure chain: environment capture -> measurement -> validation and log, per run folder.

    python pipeline/chain.py --device cuda:0 [measure flags] [--runs-dir DIR]
    python pipeline/chain.py --device all [measure flags]

`nox -s measure` runs this file with your Python. The measure flags are those of
`mesure_memoire.py measure` (none: the spec's small first configuration); they are checked
before anything is created. Then, in a new run folder <runs>/<UTC time>-<random>/:

1. environment capture writes environment.json, then
2. the measurement writes measurement.json, both by `mesure_memoire.py measure
   --environment-output` in one fresh process, as the spec asks (its CUDA context and
   allocator counters start from zero): CUDA start-up is paid once per run;
3. record.py, imported here, validates both files and appends one row to
   <runs>/resultats-bruts.csv: two interpreters fewer than running them as scripts.

A failed step stops the chain with that step's exit code and leaves what was written. An
out-of-memory measurement (exit 3) is a result: it is validated and recorded, then the chain
exits 3. A chain that stops early keeps its folder when anything is in it (environment.json
says why the GPU was unusable) and removes it when empty; it appends nothing to the log.

--device all runs one chain per GPU that PyTorch sees, side by side, each step a fresh
process given --device cuda:N (the real index, so each row names its GPU) and each chain its
own run folder; it waits for all and exits with the worst code.

Fresh processes come from launcher.py; this process never imports torch and never
initialises CUDA. One device: the measurement is a fresh interpreter, which imports torch
once, as a forkserver would, and starts the CUDA driver while it does (mesure_memoire.py).
--device all: a forkserver imports torch once, a forked child counts the GPUs, and each
chain's measurement is a child forked from it with its own CUDA context and allocator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import launcher
import mesure_memoire
import run_folders

PIPELINE = Path(__file__).resolve().parent


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise mesure_memoire.UsageError(message)


def say(message: str) -> None:
    print(f"chain.py: {message}", flush=True)  # flushed: the children write to the same stream


def check_measure_flags(flags: list[str]) -> None:
    """Bad flags fail here, before a run folder exists, with the kit script's own message."""
    for name in ("--output", "--environment-output"):
        if any(flag == name or flag.startswith(f"{name}=") for flag in flags):
            raise mesure_memoire.UsageError(f"the chain names its outputs: drop {name}")
    mesure_memoire.build_parser().parse_args(
        ["measure", "--device", "cuda:0", *flags, "--output", "unused"]
    )


_LAUNCHER: list = []


def launcher_instance(fork: bool = True) -> launcher.Launcher:
    """One launcher per chain, started on first use (after the flags were checked)."""
    if not _LAUNCHER:
        _LAUNCHER.append(launcher.Launcher(fork=fork))
    return _LAUNCHER[0]


def run_steps(commands: list[list[str]]) -> list[int]:
    """Kit commands side by side, each a fresh process (launcher.py); all are started from
    this thread, then waited for."""
    handles = [launcher_instance().start(argv) for argv in commands]  # torch loads there...
    import record  # noqa: F401  ...while this process imports jsonschema for the last step

    return [handle.wait() for handle in handles]


def stop(folder: Path, why: str, code: int) -> int:
    try:
        folder.rmdir()  # only an empty folder: evidence is never deleted
        where = f"the empty {folder} was removed"
    except OSError:
        where = f"{folder} keeps what was written"
    print(f"chain.py: {why}: nothing recorded; {where}", file=sys.stderr)
    return code


def run_chains(devices: list[str], flags: list[str], runs_dir: Path) -> list[int]:
    """One chain per device, side by side; returns each chain's exit code."""
    folders = {device: run_folders.new_run_folder(runs_dir) for device in devices}
    for device, folder in folders.items():
        say(f"{device}: run folder {folder}")
    steps = [
        [
            "measure",
            "--device",
            device,
            *flags,
            "--environment-output",
            f"{folders[device]}/environment.json",
            "--output",
            f"{folders[device]}/measurement.json",
        ]
        for device in devices
    ]
    try:
        codes = run_steps(steps)
    except KeyboardInterrupt:
        return [stop(folder, "interrupted", 130) for folder in folders.values()]
    import record

    for i, device in enumerate(devices):
        if codes[i] not in (0, mesure_memoire.EXIT_OOM):
            codes[i] = stop(folders[device], f"measure exited {codes[i]}", codes[i])
        else:
            codes[i] = record.main([str(folders[device])]) or codes[i]
    return codes


def visible_gpus() -> int:
    """How many GPUs PyTorch sees, asked of a forked child: this process never initialises
    CUDA, which would break every later fork."""
    count = launcher_instance().count_gpus()
    if count is None:
        raise mesure_memoire.UsageError("--device all: PyTorch could not count GPUs")
    return count


def worst(codes: list[int]) -> int:
    """0 < 3 (out of memory, recorded) < a failure; among failures, the highest code."""
    return max(codes, key=lambda code: (code not in (0, mesure_memoire.EXIT_OOM), code))


def run_all(flags: list[str], runs_dir: Path) -> int:
    count = visible_gpus()
    if count == 0:
        raise mesure_memoire.UsageError("--device all: no GPU is visible to PyTorch")
    say(f"all: {count} GPU(s), one chain each, side by side")
    codes = run_chains([f"cuda:{i}" for i in range(count)], flags, runs_dir)
    say(f"all: exit codes {codes}")
    return worst(codes)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="chain.py", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--device", required=True, help="cuda:N, cuda, or all")
    parser.add_argument("--runs-dir", type=Path, default=run_folders.RUNS, help="default: runs/")
    try:
        args, flags = parser.parse_known_args(argv)
        if args.device != "all":
            try:
                mesure_memoire.device_index(args.device)
            except argparse.ArgumentTypeError as exc:
                raise mesure_memoire.UsageError(f"argument --device: {exc}") from None
        check_measure_flags(flags)
        if not args.runs_dir.is_dir():
            raise mesure_memoire.UsageError(f"{args.runs_dir} is not an existing folder")
        if args.device == "all":
            return run_all(flags, args.runs_dir)
        launcher_instance(fork=False)  # one measurement: see the module's notes
        return run_chains([args.device], flags, args.runs_dir)[0]
    except (mesure_memoire.UsageError, OSError) as exc:
        print(f"chain.py: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chain.py: interrupted: every file written is whole", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
