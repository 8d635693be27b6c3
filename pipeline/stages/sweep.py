"""Raise one dimension at a time, the others fixed, until the GPU runs out of memory or a bound.

    python3 -m pipeline.stages.sweep --device cuda:0 --vary width --start 64 --factor 2 --until-oom
    python3 -m pipeline.stages.sweep --device cuda:0 --plan data/plans/context-until-oom.yaml
    python3 -m pipeline.stages.sweep --device cuda:0 --workload decoder --preset llama-3.1-8b \
        --batch 8 --prompt 2048 --new-tokens 128 --dtype bfloat16 \
        --vary batch --start 8 --factor 2 --until-oom
    python3 -m pipeline.stages.sweep --device cuda:0 --workload FILE.py:FUNCTION --dtype bfloat16 \
        [--dim NAME=VALUE ...] --vary batch|NAME --start 4 --factor 2 --until-oom
    python3 -m pipeline.stages.sweep --device cuda:0 --hf-config config.json --task training \
        --dtype bfloat16 --dim sequence=2048 --vary batch --start 1 --factor 2 --until-oom

Each point is a fresh measurement process (launcher.py) with its own run folder under runs/,
validated and appended to runs/resultats-bruts.csv while the next point measures (with
--workload decoder each point is `decoder.py measure`, varying batch, prompt or new-tokens, and
its row goes to runs/resultats-decoder.csv; with a workload file, `own_model.py measure`,
varying batch or a declared dimension, into runs/resultats-own.csv; a Hugging Face config.json
is such a workload, its dimensions sequence or image, new_tokens, lora_rank). A point's
folder appears only once whole (it is built under a hidden name, then renamed), so Ctrl-C
leaves whole runs only (`kill -9` may leave the hidden .<id>.partial folder, which validate
names). runs/ is $ITERAGPU_RUNS_DIR where set, as for every stage. runs/<id>-sweep/sweep.json
summarises the sweep: the largest configuration that fitted, its peaks, and predicted
against measured counters per point.
Exit 0 done (an out-of-memory point ends a sweep normally), 1 a point failed validation,
2 bad input or a refused measurement, 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from pipeline.artefacts import validate
from pipeline.core import arguments, cli, run_folders, workload_kinds
from pipeline.core.run_status import RunStatus
from pipeline.core.workload_kinds import Kind
from pipeline.measuring import decoder, launcher, own_model
from pipeline.predicting import gpu_calibration
from pipeline.stages import record
from pipeline.workloads import seed_network

DIMENSIONS = workload_kinds.NETWORK.dimensions
DECODER_DIMENSIONS = workload_kinds.DECODER.dimensions
OWN_SETTINGS = ("batch", "dtype", "warmup", "repeats", "seed")  # besides its declared dimensions
OWN_RECORD = ("file", "sha256", "function", "dimensions")  # what a plan says of the workload
HF_CONFIG = "--hf-config"  # a Hugging Face model's config.json: own_model.py builds it
SIZES = tuple(seed_network.CONFIGURATION_DEFAULTS)
HARD_CAP = 64  # --until-oom on a card larger than any today still stops
INTERRUPTED = "it was interrupted (Ctrl-C): every point listed is a whole run"
GIB, MIB = 2**30, 2**20
# A step multiplies the varied size by at most this (schemas/sweep-plan.schema.json says the
# same): more would make the first point the whole sweep.
MAX_FACTOR = 1000


def factor(text: str) -> float:
    """A number in (1, MAX_FACTOR]: many digits read as a float are infinity, which would
    end the sweep in a crash after its first point, before its row and sweep.json."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) or not 1 < float(text) <= MAX_FACTOR:
        shown = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(
            f"expected a number > 1 and at most {MAX_FACTOR}, got {shown!r}"
        )
    return float(text)


def fraction(text: str) -> float:
    if not re.fullmatch(r"0?\.[0-9]+|1(\.0+)?", text) or float(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return float(text)


def build_parser(workload: str = "network") -> argparse.ArgumentParser:
    """The sweep's own options, then the configuration options of the workload's `measure`."""
    kind = workload_kinds.of_argument(workload)
    parser = cli.Parser(prog="sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cuda or cuda:N")
    workload_kinds.add_option(parser, help=workload_kinds.HELP)
    parser.add_argument("--plan", help="a YAML plan under data/plans/ (instead of the flags)")
    if kind.file:  # batch or a dimension the function declares: checked later
        parser.add_argument("--vary", metavar="batch|DIMENSION")
    else:
        parser.add_argument("--vary", choices=list(kind.flags))
    parser.add_argument("--start", type=arguments.positive_int)
    parser.add_argument("--factor", type=factor, help="next = ceil(current x factor)")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--until-oom", action="store_true")
    bound.add_argument("--max-steps", type=arguments.positive_int)
    bound.add_argument(
        "--memory-fraction",
        type=fraction,
        help="stop before a point whose predicted peak reserved exceeds X x memory",
    )
    base = "the base configuration (the varied one starts at --start)"
    SWEEPS[kind.kind].add_configuration(parser, base)
    parser.add_argument("--runs-dir", help=argparse.SUPPRESS)  # else $ITERAGPU_RUNS_DIR, runs/
    parser.add_argument("--no-fork", action="store_true", help="fresh interpreters instead")
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The workload first, as it decides which configuration options exist."""
    peek = cli.Parser(prog="sweep.py", add_help=False, allow_abbrev=False)
    workload_kinds.add_option(peek)
    peek.add_argument(HF_CONFIG)
    given = peek.parse_known_args(argv)[0]
    if given.hf_config is not None:  # a Hugging Face config is a workload of own_model.py
        if given.workload != workload_kinds.DEFAULT.argument:
            raise cli.UsageError(f"{HF_CONFIG} names the model: drop --workload {given.workload}")
        args = build_parser(workload_kinds.OWN.argument).parse_args(argv)
        args.workload = HF_CONFIG
        return args
    kind = workload_kinds.of_argument(given.workload)
    args = build_parser(kind.argument).parse_args(argv)
    if workload_kinds.of_argument(args.workload) != kind:  # an abbreviation the peek missed
        args = build_parser(args.workload).parse_args(argv)
    return args


def load_plan(path: str, registry) -> dict:
    """A YAML plan, checked against schemas/sweep-plan.schema.json before anything runs."""
    try:
        plan = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise cli.UsageError(f"{path}: cannot read the plan ({first})") from None
    if not isinstance(plan, dict):
        raise cli.UsageError(f"{path}: a plan is a mapping")
    plan.setdefault("schema", "urn:iteragpu-lab:schema:sweep-plan:v1")
    if where := not_finite(plan):
        raise cli.UsageError(f"{path}: {where}: not a finite number")
    errors = validate.validate_document(plan, registry)
    if errors:
        raise cli.UsageError(f"{path}: {errors[0]}")
    plan.setdefault("workload", workload_kinds.DEFAULT.kind.value)
    SWEEPS[workload_kinds.of_name(plan["workload"]).kind].check_plan(plan, path)
    return plan


def not_finite(value, where: str = "") -> str | None:
    """Where YAML gave infinity or NaN (`.inf`, `.nan`, `1.0e+400`), which a schema's bounds
    cannot refuse: NaN compares false with every bound."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} {value}".strip()
    if isinstance(value, (dict, list)):
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if found := not_finite(item, f"{where}.{key}" if where else str(key)):
                return found
    return None


# ---------------------------------------------------------------- the decoder's points


def check_decoder_plan(plan: dict, path: str) -> None:
    """A YAML plan's decoder base, made whole (its preset's shape) and checked as decoder.py
    checks a point's options, for the base and the first point."""
    given = plan["base"].get("shape")
    plan["base"] = decoder_base(decoder_args("cuda:0", plan["base"]))
    if given is not None and plan["base"]["preset"] and given != plan["base"]["shape"]:
        raise cli.UsageError(f"{path}: base: give a preset or a shape, not both")
    decoder_args("cuda:0", dict(plan["base"], **{plan["vary"]: plan["start"]}))


def decoder_base(args: argparse.Namespace) -> dict:
    """A decoder configuration as sweep.json records it: the preset (or none) and its whole
    shape, then what each point generates; refused in decoder.py's own words."""
    shape, preset = decoder.shape_from_args(args)
    return {"preset": preset, "shape": dataclasses.asdict(shape), **decoder.run_configuration(args)}


def decoder_flags(configuration: dict) -> list[str]:
    """The `decoder.py measure` options of one point."""
    if configuration.get("preset"):
        flags = ["--preset", configuration["preset"]]
    else:
        shape = configuration["shape"]
        flags = [f"--{name.replace('_', '-')}={shape[name]}" for name in decoder.SHAPE_OPTIONS]
        if "head_dim" in shape:
            flags.append(f"--head-dim={shape['head_dim']}")
        flags += ["--tie-embeddings"] * bool(shape.get("tie_embeddings"))
        flags += ["--qkv-bias"] * bool(shape.get("qkv_bias"))
    for name in decoder.RUN_DEFAULTS:
        flags.append(f"--{name.replace('_', '-')}={configuration[name]}")
    return flags


def decoder_args(device: str, configuration: dict) -> argparse.Namespace:
    """A point's options as decoder.py parses and checks them, before anything runs."""
    argv = ["measure", "--device", device, *decoder_flags(configuration), "--output", "unused"]
    args = decoder.build_parser().parse_args(argv)
    shape = decoder.shape_from_args(args)[0]
    if refused := decoder.over_budget(shape, decoder.run_configuration(args)):
        raise cli.UsageError(refused)
    return args


def beyond_budget(plan: dict, configuration: dict) -> str | None:
    """Why the next point is not started before it runs: for a decoder, its prediction (made
    by `measure`, and by the --memory-fraction check) is over decoder.py's estimate budget;
    None to go on."""
    return SWEEPS[workload_kinds.of_name(plan.get("workload")).kind].beyond_budget(configuration)


def decoder_beyond_budget(configuration: dict) -> str | None:
    shape = decoder.Shape(**configuration["shape"])
    refused = decoder.over_budget(shape, {n: configuration[n] for n in decoder.RUN_DEFAULTS})
    return f"the next point is not started: {refused}" if refused else None


def decoder_sweep_base(args: argparse.Namespace) -> tuple[str, dict]:
    vary = args.vary.replace("-", "_")
    base = decoder_base(args)
    decoder_args(args.device, dict(base, **{vary: args.start}))  # the first point's checks
    return vary, base


def decoder_predicted(configuration: dict, last: dict, runs_dir: Path) -> int | None:
    document = json.loads((runs_dir / last["run"] / "measurement.json").read_text())
    return decoder_predicted_peak(configuration, document["environment"])


UNPREDICTED: set = set()  # (GPU, PyTorch) the stop rule could not predict for, told once


def decoder_predicted_peak(configuration: dict, environment: dict) -> int | None:
    """A point's peak reserved as `decoder.py estimate --gpu` predicts it, run as a user runs
    it (a child process: this one never imports torch), with the committed calibration of the
    last point's GPU and PyTorch; the upper bound where the prediction is approximate (the
    stop must not let a point past the memory). None without a calibration for that GPU and
    PyTorch, or when the estimate fails (said on stderr)."""
    name, version = environment["gpu"].get("name"), environment["torch"].get("version")
    gpu = gpu_calibration.name_for(name, version)
    if gpu is None:
        if (name, version) not in UNPREDICTED:  # said once: the user asked for a stop rule
            UNPREDICTED.add((name, version))
            print(
                f"sweep.py: --memory-fraction: no committed calibration for {name} with "
                f"PyTorch {version}, so no point is predicted before it starts: the sweep "
                "goes on until one does not fit",
                file=sys.stderr,
            )
        return None
    command = [sys.executable, "-m", decoder.__name__, "estimate"]
    command += [*decoder_flags(configuration), "--gpu", gpu, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=launcher.ROOT)
    if done.returncode != 0:
        print(f"sweep.py: the next point's estimate failed: {done.stderr.strip()}", file=sys.stderr)
        return None
    prediction = json.loads(done.stdout)["prediction"]
    if "bounds" in prediction:
        return max(row["peak_reserved_bytes"]["upper"] for row in prediction["bounds"]["phases"])
    return prediction["largest_peak_reserved_bytes"]


# ---------------------------------------------------------------- your own model's points


def add_own_configuration(parser: argparse.ArgumentParser, title: str) -> None:
    own_model.add_configuration(parser.add_argument_group(title))
    hf = parser.add_argument_group("a Hugging Face model instead of a workload file")
    hf.add_argument(HF_CONFIG, metavar="CONFIG.json", help="its config.json (own_model.py's)")
    own_model.add_hf_options(hf)


def own_base(args: argparse.Namespace, vary: str) -> tuple[dict, Path]:
    """The plan's base for a workload file: what it is (its file name and SHA-256, never the
    path given), its settings and each declared dimension, flat so that any of them can vary;
    and the path, kept for the points' command lines only. Checked as own_model.py checks it,
    without importing the file (the sweep imports torch only for a config's transformers)."""
    named = None if args.hf_config else own_model.workload_argument(args.workload)
    file, given, dtype = own_model.workload_of(args, named)
    path, function = file.path, file.function
    declared = own_model.declared_dimensions(file)
    if declared is None:
        raise cli.UsageError(
            f"--workload {path}: {function}'s dimensions must be keyword-only parameters with "
            "integer literals as defaults for a sweep to vary them"
        )
    dims = own_model.resolve_dimensions(function, declared, given)
    if taken := [name for name in dims if name in OWN_SETTINGS + OWN_RECORD]:
        raise cli.UsageError(f"--workload {path}: a dimension named {taken[0]} cannot be swept")
    if vary not in ("batch", *dims):
        known = ", ".join(["batch", *dims])
        raise cli.UsageError(f"--vary {vary}: {function} has no such dimension ({known})")
    base = {"file": path.name, "sha256": file.sha256, "function": function}
    base["dimensions"] = sorted(dims)
    base.update({name: getattr(args, name) for name in OWN_SETTINGS}, **dims)
    base["dtype"] = dtype
    return base, path


def own_sweep_base(args: argparse.Namespace) -> tuple[str, dict]:
    if args.memory_fraction:
        raise cli.UsageError(
            "--memory-fraction: a workload file is predicted in the point's own process, "
            "not before it starts: give --until-oom or --max-steps K"
        )
    vary = args.vary  # a dimension's own name, as the function declares it
    return vary, own_base(args, vary)[0]


def own_beyond_limits(configuration: dict) -> str | None:
    """Why the next point is not started: a value over the most own_model.py takes (its
    command line would refuse it); None to go on."""
    most = {
        "batch": own_model.MAX_BATCH,
        "new_tokens": own_model.MAX_NEW_TOKENS,
        "lora_rank": own_model.MAX_LORA_RANK,
    }
    for name in ("batch", *configuration.get("dimensions", ())):
        limit = most.get(name, own_model.MAX_DIM)
        if configuration[name] > limit:
            return (
                f"the next point is not started: {name} {configuration[name]:,} is over the "
                f"most own_model.py takes ({limit:,})"
            )
    return None


def own_flags(configuration: dict, args: argparse.Namespace) -> list[str]:
    """The `own_model.py measure` options of one point: the workload as the sweep was given it
    (the path, or the config with its task), then the point's settings and dimensions."""
    if args.hf_config is not None:
        task = args.task or "inference"
        checkpointing = ["--gradient-checkpointing"] if args.gradient_checkpointing else []
        flags = [HF_CONFIG, args.hf_config, "--task", task, *checkpointing]
        flags += own_model.recipe_flags(args)
    else:
        path = own_model.workload_argument(args.workload)[0]
        flags = ["--workload", f"{path}:{configuration['function']}"]
    for name in OWN_SETTINGS:
        flags += [f"--{name}", str(configuration[name])]
    for name in configuration["dimensions"]:
        flags += ["--dim", f"{name}={configuration[name]}"]
    return flags


# ---------------------------------------------------------------- the seed network's points


def network_sweep_base(args: argparse.Namespace) -> tuple[str, dict]:
    return args.vary.replace("-", "_"), {name: getattr(args, name) for name in SIZES}


def network_flags(configuration: dict, args: argparse.Namespace) -> list[str]:
    """The kit script's `measure` options of one point."""
    return [flag for name in SIZES for flag in (f"--{name}", str(configuration[name]))]


def network_predicted(configuration: dict, last: dict, runs_dir: Path) -> int | None:
    """The allocator model's peak, with the last point's library blocks; None without them."""
    if last["library_blocks"] is None:
        return None
    rows = seed_network.predict_phases(configuration, last["library_blocks"])
    return max(row["peak_reserved_bytes"] for row in rows)


# ---------------------------------------------------------------- each kind's code


def group_of(add: Callable) -> Callable[[argparse.ArgumentParser, str], None]:
    """A module's add_configuration(group), called with a group titled as the sweep titles it."""
    return lambda parser, title: add(parser.add_argument_group(title))


def add_decoder_configuration(parser: argparse.ArgumentParser, title: str) -> None:
    decoder.add_shape(parser)
    decoder.add_run(parser.add_argument_group(title))


@dataclasses.dataclass(frozen=True)
class Sweeping:
    """What the sweep does its own way for one kind, as code; what is data (the measuring
    script, the dimensions --vary takes, the kind's name) is in workload_kinds."""

    add_configuration: Callable[[argparse.ArgumentParser, str], None]  # its measure options
    base: Callable[[argparse.Namespace], tuple[str, dict]]  # (vary, base) from the flags
    flags: Callable[[dict, argparse.Namespace], list[str]]  # one point's measure options
    what: Callable[[dict], str]  # how the first line names the base ("" the seed network)
    # Before the next point: its predicted peak reserved (--memory-fraction), None if not
    # known, and why it is not started at all.
    predicted: Callable[[dict, dict, Path], int | None] = lambda configuration, last, runs: None
    beyond_budget: Callable[[dict], str | None] = lambda configuration: None
    check_plan: Callable[[dict, str], None] = lambda plan, path: None  # a YAML plan's base


SWEEPS = {
    Kind.NETWORK: Sweeping(
        add_configuration=group_of(seed_network.add_configuration),
        base=network_sweep_base,
        flags=network_flags,
        what=lambda base: "",
        predicted=network_predicted,
    ),
    Kind.DECODER: Sweeping(
        add_configuration=add_decoder_configuration,
        base=decoder_sweep_base,
        flags=lambda configuration, args: decoder_flags(configuration),
        what=lambda base: (
            f" ({workload_kinds.DECODER.title} "
            f"{base['preset'] or 'of the given shape'}, {base['dtype']})"
        ),
        predicted=decoder_predicted,
        beyond_budget=decoder_beyond_budget,
        check_plan=check_decoder_plan,
    ),
    Kind.OWN: Sweeping(
        add_configuration=add_own_configuration,
        base=own_sweep_base,
        flags=own_flags,
        what=lambda base: f" ({base['file']}:{base['function']}, {base['dtype']})",
        beyond_budget=own_beyond_limits,
    ),
}


# ---------------------------------------------------------------- the plan


def plan_from(args: argparse.Namespace, registry) -> dict:
    kind = workload_kinds.of_argument(args.workload)
    if args.plan and kind.file:
        raise cli.UsageError("--plan: a workload file is swept with --vary, --start and --factor")
    if args.plan:
        plan = load_plan(args.plan, registry)
        if plan["workload"] != args.workload:
            raise cli.UsageError(
                f"{args.plan}: a {plan['workload']} plan, not --workload {args.workload}"
            )
        return plan
    if not (args.vary and args.start and args.factor):
        raise cli.UsageError("give --plan, or --vary, --start and --factor")
    if not (args.until_oom or args.max_steps or args.memory_fraction):
        raise cli.UsageError("give a bound: --until-oom, --max-steps K or --memory-fraction X")
    bound = (
        {"until_oom": True}
        if args.until_oom
        else {"max_steps": args.max_steps}
        if args.max_steps
        else {"memory_fraction": args.memory_fraction}
    )
    vary, base = SWEEPS[kind.kind].base(args)
    return {
        "schema": "urn:iteragpu-lab:schema:sweep-plan:v1",
        "workload": kind.kind.value,
        "vary": vary,
        "start": args.start,
        "factor": args.factor,
        "stop": bound,
        "base": base,
    }


# ---------------------------------------------------------------- what the user reads


def size(count: int | None) -> str:
    """Bytes as a person reads them: GiB with two decimals, MiB below one GiB."""
    if count is None:
        return "an unknown size"
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / MIB:.1f} MiB"


def duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def report_progress(step: int, bound: int | None, vary: str, points: list[dict], elapsed: float):
    """One line per point: what it measured, how long the sweep has run, and what is left
    (the median point times the steps left, where --max-steps bounds them)."""
    point = points[-1]
    walls = [p["wall_seconds"] for p in points[1:]] or [point["wall_seconds"]]
    per_point = statistics.median(walls)  # the first point also waited for PyTorch to load
    if bound:
        filled = round(20 * step / bound)
        head = f"[{'#' * filled}{'.' * (20 - filled)}] {step}/{bound}"
        left = f"about {duration(per_point * (bound - step))} left" if step < bound else "done"
    else:
        head = f"[{step}]"
        left = f"{per_point:.2f} s a point"
    print(
        f"{head} {vary} {point['configuration'][vary]}: {point['status'].replace('_', ' ')}, "
        f"peak reserved {size(point['peak_reserved_bytes'])} "
        f"(predicted {size(point['predicted_peak_reserved_bytes'])}), "
        f"{point['wall_seconds']:.2f} s; elapsed {duration(elapsed)}, {left}",
        flush=True,
    )


def final_line(vary: str, points: list[dict], reason: str, summary: Path) -> str:
    fitted = [p for p in points if p["status"] == RunStatus.COMPLETED]
    largest = (
        f"largest that fitted {vary} {fitted[-1]['configuration'][vary]} at "
        f"{size(fitted[-1]['peak_reserved_bytes'])} peak reserved"
        if fitted
        else "none fitted"
    )
    counted = f"{len(points)} point{'' if len(points) == 1 else 's'} measured"
    return f"sweep of {vary}: {counted}, {largest}; stopped because {reason}; summary in {summary}"


# ---------------------------------------------------------------- the points


class Point:
    """One point: a fresh measurement process writing into a hidden folder, renamed to
    <runs>/<id>/ once whole, so that no folder named by a run id is ever half written."""

    def __init__(self, runs_dir: Path, device: str, flags: list[str], script: str) -> None:
        self.run_id = run_folders.new_run_id()
        self.folder = runs_dir / f".{self.run_id}.partial"
        output = str(self.folder / "measurement.json")
        self.argv = ["measure", "--device", device, "--output", output, *flags]
        self.script = script
        self.child: launcher.Child | None = None

    @property
    def whole(self) -> bool:
        return not self.folder.name.endswith(".partial")

    def start(self, runner: launcher.Launcher, after: Point | None) -> None:
        """Its process, forked while `after`'s holds its exit; returns once that one is gone."""
        self.folder.mkdir()
        try:
            self.child = runner.start(
                self.argv, after=after.child if after else None, script=self.script
            )
        except BaseException:
            shutil.rmtree(self.folder)
            raise

    def finish(self) -> int:
        """The exit code once the files are written; the folder is then whole, or removed."""
        try:
            code = self.child.result()
        except BaseException:
            self.discard()
            raise
        if (self.folder / "measurement.json").exists():
            whole = self.folder.parent / self.run_id
            os.rename(self.folder, whole)
            self.folder = whole
        else:
            self.discard()
        return code

    def discard(self) -> None:
        """Not kept: let its process exit, then remove the hidden folder it wrote into."""
        if self.child is not None:
            self.child.wait()
        if not self.whole:
            shutil.rmtree(self.folder, ignore_errors=True)


def record_point(point: Point, points: list[dict]) -> str | None:
    """Let its process go, then validate and append its row (record.py); a point that does
    not record leaves the summary too. None when done, else why not."""
    point.child.wait()
    if record.main([str(point.folder)]) != 0:
        points.pop()
        return f"run {point.folder.name} did not validate or record"
    return None


def next_value(current: int, factor: float) -> int:
    """current x factor, rounded up; at least one more, so that a small factor still moves."""
    return max(current + 1, math.ceil(current * factor))


def predicted_too_large(
    plan: dict, configuration: dict, points: list[dict], runs_dir: Path
) -> str | None:
    """With --memory-fraction: why the next point is not started, from its peak reserved
    predicted with the last point's library blocks (the decoder's: traced, with the
    committed calibration of the last point's GPU and PyTorch); None to go on or when not known."""
    last = points[-1] if points else None
    if "memory_fraction" not in plan["stop"] or last is None:
        return None
    memory, share = last["total_memory_bytes"], plan["stop"]["memory_fraction"]
    if memory is None:
        return None
    kind = workload_kinds.of_name(plan.get("workload"))
    expected = SWEEPS[kind.kind].predicted(configuration, last, runs_dir)
    if expected is None or expected <= share * memory:
        return None
    return (
        f"the next point's predicted peak reserved, {size(expected)} ({expected} bytes), "
        f"exceeds {share} of the GPU's memory ({size(memory)})"
    )


def summarise_point(folder: Path, configuration: dict, seconds: float) -> dict:
    document = json.loads((folder / "measurement.json").read_text())
    phases = document["phases"]
    calibration = document.get("calibration", {})
    predicted = [row.get("predicted") for row in phases]
    if not all(predicted):  # a workload file the trace could not follow: no figure, not 0
        predicted = None
    return {
        "run": folder.name,
        "configuration": dict(configuration),
        "status": document["status"],
        "wall_seconds": round(seconds, 3),
        "peak_allocated_bytes": document["summary"]["largest_peak_allocated_bytes"],
        "peak_reserved_bytes": document["summary"]["largest_peak_reserved_bytes"],
        "predicted_peak_allocated_bytes": None
        if predicted is None
        else max((row["peak_allocated_bytes"] for row in predicted), default=0),
        "predicted_peak_reserved_bytes": None
        if predicted is None
        else max((row["peak_reserved_bytes"] for row in predicted), default=0),
        "largest_abs_difference_allocated_bytes": document["summary"]["prediction"][
            "largest_abs_difference_allocated_bytes"
        ],
        "library_blocks": calibration.get("blocks") if "error" not in calibration else None,
        "total_memory_bytes": document["environment"]["gpu"].get("total_memory_bytes"),
    }


def write_summary(sweep_dir: Path, plan, device, mode, points, reason, seconds) -> Path:
    fitted = [p for p in points if p["status"] == RunStatus.COMPLETED]
    summary = {
        "schema": "urn:iteragpu-lab:schema:sweep:v1",
        "plan": plan,
        "device": device,
        "process_start": mode,
        "stopped_because": reason,
        "wall_seconds": round(seconds, 3),
        "largest_fitted": fitted[-1] if fitted else None,
        "points": points,
    }
    sweep_dir.mkdir()
    path = sweep_dir / "sweep.json"
    cli.write_new(path, (json.dumps(summary, indent=2) + "\n").encode())
    return path


# ---------------------------------------------------------------- the sweep


def run_sweep(args: argparse.Namespace) -> int:
    registry = validate.load_registry()
    plan = plan_from(args, registry)
    device = f"cuda:{arguments.device_index(cli.device(args.device))}"
    runs_dir = run_folders.runs_directory(args.runs_dir)
    vary, bound = plan["vary"], plan["stop"].get("max_steps")
    kind = workload_kinds.of_name(plan["workload"])
    sweeping = SWEEPS[kind.kind]
    runner = launcher.Launcher(fork=not args.no_fork)
    loading = (
        "loading PyTorch, once for every point"
        if runner.mode == launcher.FORKED
        else "every point loads PyTorch in a fresh interpreter"
    )
    what = sweeping.what(plan["base"])
    print(f"sweep of {vary} on {device}{what}: {loading}...", flush=True)
    sweep_dir = runs_dir / f"{run_folders.new_run_id()}-sweep"
    configuration = dict(plan["base"], **{vary: plan["start"]})
    points: list[dict] = []
    reason, exit_code = "", cli.OK
    started = last = time.perf_counter()
    measured = running = None  # measured: whole and summarised, its row not yet appended
    try:
        for step in range(1, (bound or HARD_CAP) + 1):
            reason = beyond_budget(plan, configuration) or predicted_too_large(
                plan, configuration, points, runs_dir
            )
            if reason:
                break
            flags = sweeping.flags(configuration, args)
            running = Point(runs_dir, device, flags, kind.script)
            running.start(runner, after=measured)
            if measured is not None:  # recorded while the new point measures
                reason, measured = record_point(measured, points), None
                if reason:
                    exit_code = cli.INVALID
                    break
            code = running.finish()
            finished, running = running, None
            if code not in (cli.OK, cli.OUT_OF_MEMORY) or not finished.whole:
                finished.discard()
                reason = f"the measurement exited {code}"
                exit_code = cli.INVALID if code in (cli.OK, cli.OUT_OF_MEMORY) else code
                break
            now = time.perf_counter()
            points.append(summarise_point(finished.folder, configuration, now - last))
            measured, last = finished, now
            report_progress(step, bound, vary, points, now - started)
            if points[-1]["status"] == RunStatus.OUT_OF_MEMORY:
                reason = f"the GPU ran out of memory at {vary} {configuration[vary]}"
                break
            configuration[vary] = next_value(configuration[vary], plan["factor"])
        else:
            reason = f"--max-steps {bound} was reached" if bound else f"{HARD_CAP} steps were done"
    except KeyboardInterrupt:
        reason, exit_code = INTERRUPTED, cli.INTERRUPTED
    try:
        if running is not None:
            running.discard()  # started, then not kept: a sweep that stops leaves no half run
        if measured is not None:
            failure = record_point(measured, points)
            if failure:
                reason, exit_code = failure, cli.INVALID
    except KeyboardInterrupt:
        reason, exit_code = INTERRUPTED, cli.INTERRUPTED
    if not points and exit_code not in (cli.OK, cli.INTERRUPTED):
        if exit_code != cli.USAGE:  # a refused measurement has said why, in one line
            print(
                f"sweep.py: error: the first point failed ({reason}): nothing written",
                file=sys.stderr,
            )
        return exit_code
    seconds = time.perf_counter() - started
    summary = write_summary(sweep_dir, plan, device, runner.mode, points, reason, seconds)
    print(final_line(vary, points, reason, summary), flush=True)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    return cli.run("sweep.py", lambda: run_sweep(parse(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
