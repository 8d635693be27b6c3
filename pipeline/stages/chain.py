"""The measure chain: environment and measurement in one fresh process, then one log row.

    python -m pipeline.stages.chain --device cuda:N|cuda|all [measure flags] [--runs-dir DIR]
    python -m pipeline.stages.chain --device cuda:0 --workload decoder --preset llama-3.1-8b \
        --batch 8 --prompt 2048 --new-tokens 128 --dtype bfloat16
    python -m pipeline.stages.chain --device cuda:0 \
        --workload pipeline/workloads/resnet_cnn.py:resnet \
        --dtype bfloat16 --batch 32 [--dim NAME=VALUE ...]
    python -m pipeline.stages.chain --device cuda:0 --hf-config config.json --task training \
        --dtype bfloat16 --batch 8 --dim sequence=512

--workload network (the default) measures the seed's synthetic network with the kit script
`mesure_memoire.py measure`; --workload decoder a decoder-only language model with
`decoder.py measure`; --workload FILE.py:FUNCTION your own model with `own_model.py measure`
(same outputs, exit codes and protocol; decoder and own-model rows go to logs of their own,
record.py). What it guarantees:
- bad flags (those of the workload's `measure`) fail before a run folder exists; for your
  own model also a workload file that is missing, is not Python, lacks the function, or does
  not declare a --dim given (read, never imported: this process never imports torch); for a
  Hugging Face config (--hf-config, own_model.py), the config as transformers reads it, the
  task and the dimensions (transformers is imported for that: a few seconds);
- a run whose workload code raised (own_model.py exit 1, status "failed") keeps its folder
  and file and is never recorded;
- each run gets a new folder, never reused; a run is recorded only once both of its files
  validate; an out-of-memory result is recorded and the chain exits 3;
- a chain that stops early records nothing and keeps what was written (environment.json
  says why); a folder is removed only when empty;
- this process never imports torch nor initialises CUDA (launcher.py);
- --device all runs one chain per GPU PyTorch sees, side by side, and exits with the most
  severe code: a failure over out of memory over success.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.core import cli, run_folders, workload_kinds
from pipeline.core.workload_kinds import Kind
from pipeline.measuring import decoder, launcher, own_model
from pipeline.workloads import seed_network


def announce(message: str) -> None:
    print(f"chain.py: {message}", flush=True)  # flushed: the children write to the same stream


HF_CONFIG = "--hf-config"  # a Hugging Face model's config.json, among the flags: own_model.py


def workload_flags(workload: str) -> list[str]:
    """What own_model.py is told of the workload; the built-in ones are the script itself, and
    a Hugging Face config is named by its own flag, passed on with the others."""
    if workload == HF_CONFIG or not workload_kinds.of_argument(workload).file:
        return []
    return ["--workload", workload]


def check_own_model_flags(argv: list[str]) -> None:
    args = own_model.build_parser().parse_args(argv)
    file = own_model.setting_from(args).file  # a workload file, or a Hugging Face config's
    declared = own_model.declared_dimensions(file)
    if declared is not None:
        own_model.resolve_dimensions(file.function, declared, args.dim)


def check_measure_flags(flags: list[str], workload: str = "network") -> None:
    """Bad flags fail here, before a run folder exists, with the measuring script's own
    message (for the decoder also its shape rules: a preset or all six shape options; for
    a workload file, what own_model.py checks before it imports torch)."""
    for name in ("--output", "--environment-output"):
        if any(flag == name or flag.startswith(f"{name}=") for flag in flags):
            raise cli.UsageError(f"the chain names its outputs: drop {name}")
    argv = ["measure", "--device", "cuda:0", *workload_flags(workload), *flags]
    argv += ["--output", "unused"]
    CHECKS[workload_kinds.of_argument(workload).kind](argv)


def check_network_flags(argv: list[str]) -> None:
    seed_network.build_parser().parse_args(argv)


def check_decoder_flags(argv: list[str]) -> None:
    args = decoder.build_parser().parse_args(argv)
    decoder.shape_from_args(args)
    decoder.run_configuration(args)


# How each kind's `measure` flags are checked here, in its script's own words (the kind's
# code; which script measures it is workload_kinds' data).
CHECKS = {
    Kind.NETWORK: check_network_flags,
    Kind.DECODER: check_decoder_flags,
    Kind.OWN: check_own_model_flags,
}


def run_steps(
    runner: launcher.Launcher,
    commands: list[list[str]],
    script: str = workload_kinds.NETWORK.script,
) -> list[int]:
    """Measuring commands side by side, each a fresh process; all are started from this
    thread, then waited for."""
    children = [runner.start(argv, script=script) for argv in commands]  # torch loads there...
    from pipeline.stages import record  # noqa: F401  ...while this process imports jsonschema for the last step

    return [child.wait() for child in children]


def end_unrecorded(folder: Path, why: str, code: int) -> int:
    """A chain stopped before its row: the folder keeps what was written, or goes if empty."""
    try:
        folder.rmdir()  # only an empty folder: evidence is never deleted
        where = f"the empty {folder} was removed"
    except OSError:
        where = f"{folder} keeps what was written"
    print(f"chain.py: {why}: nothing recorded; {where}", file=sys.stderr)
    return code


def run_chains(
    runner: launcher.Launcher,
    devices: list[str],
    flags: list[str],
    runs_dir: Path,
    workload: str = "network",
) -> list[int]:
    """One chain per device, side by side; returns each chain's exit code."""
    folders = {device: run_folders.new_run_folder(runs_dir) for device in devices}
    for device, folder in folders.items():
        announce(f"{device}: run folder {folder}")
    steps = [
        [
            "measure",
            "--device",
            device,
            *workload_flags(workload),
            *flags,
            "--environment-output",
            f"{folders[device]}/environment.json",
            "--output",
            f"{folders[device]}/measurement.json",
        ]
        for device in devices
    ]
    try:
        codes = run_steps(runner, steps, script=workload_kinds.of_argument(workload).script)
    except KeyboardInterrupt:
        return [end_unrecorded(folder, "interrupted", 130) for folder in folders.values()]
    from pipeline.stages import record

    for i, device in enumerate(devices):
        if codes[i] not in (cli.OK, cli.OUT_OF_MEMORY):
            codes[i] = end_unrecorded(folders[device], f"measure exited {codes[i]}", codes[i])
        else:
            codes[i] = record.main([str(folders[device])]) or codes[i]
    return codes


def visible_gpus(runner: launcher.Launcher) -> int:
    """How many GPUs PyTorch sees, asked of a child: this process never initialises CUDA,
    which would break every later fork."""
    count = runner.count_gpus()
    if count is None:
        raise cli.UsageError("--device all: PyTorch could not count GPUs")
    return count


def most_severe(codes: list[int]) -> int:
    """0 < 3 (out of memory, recorded) < a failure; among failures, the highest code."""
    return max(codes, key=lambda code: (code not in (cli.OK, cli.OUT_OF_MEMORY), code))


def run_all(runner: launcher.Launcher, flags: list[str], runs_dir: Path, workload: str) -> int:
    count = visible_gpus(runner)
    if count == 0:
        raise cli.UsageError("--device all: no GPU is visible to PyTorch")
    announce(f"all: {count} GPU(s), one chain each, side by side")
    codes = run_chains(runner, [f"cuda:{i}" for i in range(count)], flags, runs_dir, workload)
    announce(f"all: exit codes {codes}")
    return most_severe(codes)


def run_chain(argv: list[str] | None) -> int:
    parser = cli.Parser(prog="chain.py", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--device", required=True, help="cuda:N, cuda, or all")
    parser.add_argument("--runs-dir", type=Path, default=run_folders.RUNS, help="default: runs/")
    workload_kinds.add_option(parser, metavar=workload_kinds.ARGUMENTS, help=workload_kinds.HELP)
    args, flags = parser.parse_known_args(argv)
    if any(flag == HF_CONFIG or flag.startswith(f"{HF_CONFIG}=") for flag in flags):
        if args.workload != workload_kinds.DEFAULT.argument:
            raise cli.UsageError(f"{HF_CONFIG} names the model: drop --workload {args.workload}")
        args.workload = HF_CONFIG  # own_model.py measures it, told by the flag itself
    if args.device != "all":
        cli.device(args.device)
    check_measure_flags(flags, args.workload)
    runs_dir = cli.existing_folder(args.runs_dir)
    if args.device == "all":  # many measurements: children of one server that imported torch
        return run_all(launcher.Launcher(), flags, runs_dir, args.workload)
    # one measurement: a fresh interpreter imports torch once, as a server would, and starts
    # the CUDA driver meanwhile (the measuring script); a server would add its own start-up
    one = launcher.Launcher(fork=False)
    return run_chains(one, [args.device], flags, runs_dir, args.workload)[0]


def main(argv: list[str] | None = None) -> int:
    return cli.run("chain.py", lambda: run_chain(argv))


if __name__ == "__main__":
    raise SystemExit(main())
