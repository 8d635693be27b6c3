"""Your own PyTorch model under the lab's protocol: measured on a GPU, predicted without one.

    python3 -m pipeline.measuring.own_model measure --workload FILE.py:FUNCTION --device cuda:0 \\
        --dtype bfloat16 --batch 8 [--dim NAME=VALUE ...] [--warmup 1 --repeats 2] \\
        --output m.json [--environment-output env.json]
    python3 -m pipeline.measuring.own_model estimate --workload FILE.py:FUNCTION --dtype bfloat16 \\
        --batch 8 [--dim NAME=VALUE ...] [--calibration m.json] [--json]
    python3 -m pipeline.measuring.own_model estimate|measure --hf-config config.json \\
        --task inference|generate|training|lora [--new-tokens N] [--lora-rank R] \\
        [--gradient-checkpointing] --dim sequence=2048 ...   (hf_model.py: a Hugging Face model)

The workload file defines FUNCTION(config, *, name=default, ...): `config` has `device`,
`dtype`, `batch` and `seed`; the keyword-only parameters with integer defaults are the
workload's own dimensions (`--dim name=value`). It returns a `Workload` (workload_contract.py,
re-exported here). `measure` runs it in this fresh process phase by phase (synchronise,
baseline, peak reset, run, synchronise, end values: phase_protocol.run_phase), after tracing
it once on fake tensors to predict every counter (trace_prediction.py); `estimate` prints
that prediction, no GPU.

Exit codes: 0 done; 1 the workload's own code raised (its traceback on stderr; `measure`
writes the run with status "failed" and the exception's type, never a measurement); 2 bad
input, a broken contract (sys.exit() in the workload among them) or a missing prerequisite,
nothing written; 3 the GPU ran out of memory (the file is written, status "out_of_memory").
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import gc
import hashlib
import importlib.util
import inspect
import itertools
import json
import math
import pickle
import re
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pipeline.core import (
    allocator_model,
    arguments,
    cli,
    environment_capture,
    measure_flow,
    phase_protocol,
    torch_private,
    writers,
)
from pipeline.core.prediction_status import PredictionStatus
from pipeline.core.run_status import RunStatus
from pipeline.core.workload_contract import Configuration, Workload, WorkloadFile
from pipeline.predicting import gpu_calibration, history_check, trace_prediction
from pipeline.workloads import hf_config, seed_network
from pipeline.workloads.own_model_facts import (  # noqa: F401 (own_model.document_facts, own_model.SCHEMA... stay)
    SCHEMA,
    bounds_facts,
    bounds_held,
    compare,
    counter_facts,
    document_facts,
    prediction_peak_facts,
    summarise,
)

TOOL = {"name": "own_model.py", "version": "1.0.0"}
INFERENCE, STEP, TRAINING = "inference", "custom step", "training"
DEFAULTS = {key: seed_network.CONFIGURATION_DEFAULTS[key] for key in ("batch", "warmup")}
DEFAULTS.update(repeats=seed_network.CONFIGURATION_DEFAULTS["repeats"], dtype="float32")
PHASE_SCOPES = {
    "model_load": "the workload function: build the model, put it on the GPU (and make the "
    "optimizer, which holds no state yet)",
    "inputs": "make_inputs(): the inputs on the GPU",
    "cold_step": "the first step: the model's forward under torch.inference_mode(), the "
    "workload's own step, or for training the loss and loss.backward() (no optimizer step)",
    "optimizer_state": "training only: the first optimizer.step(), which creates the "
    "optimizer's state",
    "warmup": "all warm-up steps together, one row (training: zero_grad, loss, backward, "
    "optimizer.step)",
    "warm_step": "one row per timed step after warm-up",
}
# The trace runs the whole protocol on fake tensors: the cold step, the warm-up steps and the
# timed steps (a training workload's first optimizer step besides), each replayed through
# the allocator model. Their count is known before anything runs, so a run past the budget
# is refused up front (`estimate`, and `measure`, which traces first) rather than left tracing
# for hours. What one step costs depends on the workload (the AdamW example's took 1 to 2 s
# on a 2-core CPU): the default admits every committed run (at most 9 steps) and timing
# statistics over dozens of repetitions.
ESTIMATE_BUDGET = 64
# What the options may ask, at most (cli.bounded_int says so in one line where they are
# parsed): a batch of 2**20 rows and a dimension of 2**24 (16,777,216 tokens: above every
# published context) stay far from PyTorch's 64-bit byte count; a generation of 65,536 new
# tokens and a LoRA rank of 65,536 are past anything run on one GPU (the layer-pass budget
# and the model's width bound them further).
MAX_BATCH, MAX_DIM, MAX_NEW_TOKENS, MAX_LORA_RANK = 1 << 20, 1 << 24, 1 << 16, 1 << 16
# Gradient accumulation: each micro-batch is a forward and a backward traced one by one, so
# their count multiplies the trace's time; 1,024 is past any recipe's.
MAX_MICRO_BATCHES = 1 << 10
FAILED_NOTE = (
    "the workload's own code raised an exception: this file records where, and is not a "
    "measurement (never recorded, never compared with a prediction)"
)


# ---------------------------------------------------------------- the contract


class UserCodeError(Exception):
    """An exception raised by the workload's own code: theirs, shown with its traceback."""

    def __init__(self, phase: str, repetition: int | None, original: BaseException):
        super().__init__(f"{type(original).__name__} in {phase}")
        self.phase, self.repetition, self.original = phase, repetition, original


class SkippedStep(RuntimeError):
    """A GradScaler skipped the optimizer's step: the run is not the step measured."""


SKIPPED_STEP = (
    "the GradScaler skipped the optimizer step (an inf or a NaN in the scaled gradients): "
    "that step creates and updates no optimizer state, so it is not the step the protocol "
    "measures; give GradScaler a lower init_scale, or check the loss"
)


def workload_argument(text: str) -> tuple[Path, str]:
    match = re.fullmatch(r"(.+):([A-Za-z_][A-Za-z0-9_]*)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected FILE.py:FUNCTION, got {text!r}")
    return Path(match.group(1)), match.group(2)


def dimension_argument(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=([0-9]{1,30})", text)
    if not match or not 0 < int(match.group(2)) <= MAX_DIM:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with VALUE a positive integer at most {MAX_DIM}, "
            f"got {cli.shown(text)}"
        )
    return match.group(1), int(match.group(2))


def read_workload_file(path: Path, function: str) -> WorkloadFile:
    """Checked before torch is imported: a file that is there, is Python, and defines the
    function at its top level."""
    data = cli.existing_file(path, "--workload")
    if path.suffix != ".py":
        raise cli.UsageError(f"--workload {path}: not a Python file (.py)")
    try:
        source = data.decode("utf-8")
        tree = ast.parse(source, filename=path.name)
    except UnicodeDecodeError:
        raise cli.UsageError(f"--workload {path}: not Python (not UTF-8 text)") from None
    except SyntaxError as exc:
        raise cli.UsageError(
            f"--workload {path}: not Python ({exc.msg} at line {exc.lineno})"
        ) from None
    except ValueError:  # null bytes
        raise cli.UsageError(f"--workload {path}: not Python (null bytes)") from None
    if function not in top_level_names(tree):
        raise cli.UsageError(f"--workload {path}: no function {function} at its top level")
    return WorkloadFile(path, function, source, hashlib.sha256(data).hexdigest())


def top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


_imports = itertools.count()


def import_workload(file: WorkloadFile):
    """A fresh module each time, from the very bytes that were hashed: the trace and the
    measurement share no module-level state. Its exceptions are the user's."""
    name = f"_iteragpu_workload_{next(_imports)}"
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_loader(name, loader=None, origin=str(file.path))
    )
    module.__file__ = str(file.path)
    sys.modules[name] = module  # dataclasses and pickle look classes up there
    # A workload file says `from own_model import Workload`: this module, by that name.
    sys.modules.setdefault("own_model", sys.modules[__name__])
    try:
        exec(compile(file.source, str(file.path), "exec"), module.__dict__)
    except SystemExit as exc:
        raise exited(f"--workload {file.path}", "import", exc) from None
    except Exception as exc:
        raise UserCodeError("import", None, exc) from exc
    return module


def exited(workload: str, phase: str, exc: SystemExit) -> cli.UsageError:
    """sys.exit() in the workload's code is that code failing, never a result: without this
    the harness would end with the workload's exit status (0 with nothing said)."""
    return cli.UsageError(
        f"{workload} called sys.exit({exc.code!r}) in {phase}: a workload returns, it never "
        "ends the process"
    )


def workload_function(module, file: WorkloadFile) -> tuple[Callable, dict[str, int]]:
    """The function and its declared dimensions (keyword-only parameters, integer defaults)."""
    function = getattr(module, file.function, None)
    if not callable(function):
        raise cli.UsageError(f"--workload {file.path}: {file.function} is not a function")
    shape = (
        f"{file.function} must take the configuration as its only positional parameter and "
        "its dimensions as keyword-only parameters with integer defaults"
    )
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        raise cli.UsageError(shape) from None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    declared = {}
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise cli.UsageError(shape)
        if parameter.kind == parameter.KEYWORD_ONLY:
            default = parameter.default
            if isinstance(default, bool) or not isinstance(default, int) or default <= 0:
                raise cli.UsageError(f"{shape}: {parameter.name} has no positive integer default")
            declared[parameter.name] = default
    if len(positional) != 1:
        raise cli.UsageError(shape)
    return function, declared


def declared_dimensions(file: WorkloadFile) -> dict[str, int] | None:
    """The function's keyword-only integer defaults, read from its source without running it;
    None when the source does not state them plainly (imported, or computed defaults): the
    measuring process, which imports the file, then checks them."""
    for node in ast.parse(file.source).body:
        if isinstance(node, ast.FunctionDef) and node.name == file.function:
            declared = {}
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True):
                value = getattr(default, "value", None)
                if type(value) is not int:
                    return None
                declared[arg.arg] = value
            return declared
    return None


def resolve_dimensions(function: str, declared: dict, given: list[tuple[str, int]]) -> dict:
    dims = dict(declared)
    seen = set()
    for name, value in given:
        if name not in declared:
            known = ", ".join(declared) or "none"
            raise cli.UsageError(f"--dim {name}: {function} declares no such dimension ({known})")
        if name in seen:
            raise cli.UsageError(f"--dim {name}: given twice")
        seen.add(name)
        dims[name] = value
    return dims


# ---------------------------------------------------------------- checks of what the user gave


def tensors_in(torch, value) -> list:
    return [x for x in torch_private.tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


def check_workload(torch, workload, device, function: str) -> str:
    """The returned Workload, checked before anything runs on it; returns its kind."""
    if not isinstance(workload, Workload):
        raise cli.UsageError(
            f"{function} returned {type(workload).__name__}, expected own_model.Workload"
            "(model, make_inputs, step=None, optimizer=None)"
        )
    if not isinstance(workload.model, torch.nn.Module):
        raise cli.UsageError(f"Workload.model is a {type(workload.model).__name__}, not a Module")
    if not callable(workload.make_inputs):
        raise cli.UsageError("Workload.make_inputs is not callable")
    if workload.step is not None and not callable(workload.step):
        raise cli.UsageError("Workload.step is not callable")
    typed = (
        ("optimizer", torch.optim.Optimizer, "torch.optim.Optimizer"),
        ("scaler", torch.amp.GradScaler, "torch.amp.GradScaler"),
    )
    for field, kind, wanted in typed:
        given = getattr(workload, field)
        if given is not None and not isinstance(given, kind):
            name = type(given).__name__
            raise cli.UsageError(f"Workload.{field} is a {name}, not a {wanted}")
    if workload.optimizer is not None and workload.step is None:
        raise cli.UsageError(
            "a training workload (an optimizer given) needs step(model, inputs) returning the loss"
        )
    if workload.scaler is not None and workload.optimizer is None:
        raise cli.UsageError(
            "Workload.scaler: a GradScaler goes with a training workload (an optimizer given)"
        )
    micro = workload.micro_batches
    if not (type(micro) is int and 1 <= micro <= MAX_MICRO_BATCHES):
        raise cli.UsageError(
            f"Workload.micro_batches is {micro!r}: an integer from 1 to {MAX_MICRO_BATCHES}"
        )
    if micro > 1 and workload.optimizer is None:
        raise cli.UsageError(
            f"Workload.micro_batches {micro}: gradient accumulation goes with a training "
            "workload (an optimizer given)"
        )
    named = itertools.chain(
        (("parameter", n, t) for n, t in workload.model.named_parameters()),
        (("buffer", n, t) for n, t in workload.model.named_buffers()),
    )
    for what, name, tensor in named:
        if tensor.device != device:
            raise cli.UsageError(
                f"the model's {what} {name} is on {tensor.device}, not {device}: "
                "move the model with .to(config.device)"
            )
    if workload.optimizer is not None:
        return TRAINING
    return INFERENCE if workload.step is None else STEP


def check_inputs(torch, inputs, device) -> None:
    """The contract's inputs only: anything else would fail later inside the user's model,
    shown as their traceback when it is the contract that was broken."""
    if not isinstance(inputs, (torch.Tensor, tuple, list, dict)):
        raise cli.UsageError(
            f"make_inputs() returned {type(inputs).__name__}: expected a tensor, a tuple or "
            "list (the model's positional arguments) or a dict (its keyword arguments)"
        )
    for tensor in tensors_in(torch, inputs):
        if tensor.device != device:
            raise cli.UsageError(
                f"make_inputs() returned a tensor on {tensor.device}, not {device}"
            )


def check_result(torch, result) -> None:
    if not tensors_in(torch, result):
        raise cli.UsageError(
            f"the step returned {type(result).__name__}: a step must return what it computed "
            "(a tensor, or a tuple, list or dict of tensors), which the harness frees after "
            "each phase's end values"
        )


def check_loss(torch, loss) -> None:
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
        got = type(loss).__name__
        if isinstance(loss, torch.Tensor):
            got = f"a tensor of {loss.numel()} element(s), requires_grad={loss.requires_grad}"
        raise cli.UsageError(
            "the step of a training workload must return the loss, one value that requires "
            f"grad; it returned {got}"
        )


def counted(tensors) -> dict:
    by_dtype: dict[str, dict] = {}
    for tensor in tensors:
        entry = by_dtype.setdefault(str(tensor.dtype).removeprefix("torch."), {"count": 0})
        entry["count"] += tensor.numel()
        entry["bytes"] = entry.get("bytes", 0) + tensor.numel() * tensor.element_size()
    return {
        "count": sum(e["count"] for e in by_dtype.values()),
        "bytes": sum(e["bytes"] for e in by_dtype.values()),
        "by_dtype": dict(sorted(by_dtype.items())),
    }


# ---------------------------------------------------------------- the phases


def planned_phases(kind: str, repeats: int) -> list[str]:
    first = ["cold_step", "optimizer_state"] if kind == TRAINING else ["cold_step"]
    return ["model_load", "inputs", *first, "warmup", *["warm_step"] * repeats]


def call_model(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def step_plan(torch, workload: Workload, inputs, kind: str, warmup: int, repeats: int):
    """(phase, repetition, passes, operation) after the model and the inputs. Each operation
    returns its last step's result, so that it is alive for the end values; an earlier
    step's result is freed before the next step starts."""
    model, step, optimizer = workload.model, workload.step, workload.optimizer
    micro, scaler = workload.micro_batches, workload.scaler

    def backward(loss):
        (loss if scaler is None else scaler.scale(loss)).backward()

    def optimizer_step():
        if scaler is None:
            optimizer.step()
            return
        taken = []  # PyTorch's step post-hook, on this optimizer: the steps it took
        handle = optimizer.register_step_post_hook(lambda *_: taken.append(None))
        try:
            scaler.step(optimizer)
        finally:
            handle.remove()
        scaler.update()
        if not taken:
            raise SkippedStep(SKIPPED_STEP)

    def steps(count: int, first: bool = False):
        def run():
            result = None
            for _ in range(count):
                result = None
                if kind == INFERENCE:
                    with torch.inference_mode():
                        result = call_model(model, inputs)
                elif kind == STEP:
                    result = step(model, inputs)
                else:
                    if not first:
                        optimizer.zero_grad()
                    for _ in range(micro):
                        result = None  # the last micro-batch's loss is freed before the next
                        result = step(model, inputs)
                        check_loss(torch, result)
                        # as the Trainer does where the model does not scale its loss for
                        # accumulation itself: the mean over the micro-batches
                        backward(result / micro if micro > 1 else result)
                    if not first:
                        optimizer_step()
                check_result(torch, result)
            return result

        return run

    def first_optimizer_step():
        optimizer_step()

    plan = [("cold_step", None, 1, steps(1, first=True))]
    if kind == TRAINING:
        plan.append(("optimizer_state", None, 1, first_optimizer_step))
    plan.append(("warmup", None, warmup, steps(warmup)))
    plan += [("warm_step", i, 1, steps(1)) for i in range(1, repeats + 1)]
    return plan


def drive(torch, phase, function, name, config, dims, warmup, repeats, rows, facts, passthrough):
    """Every phase in order, with `phase` (run_phase on the GPU, Tracer.phase in the trace);
    each row appended as soon as it is read, what is known of the workload put in `facts`.
    Exceptions from the user's code become UserCodeError, the others pass through."""

    def user(operation, phase_name, repetition=None):
        def run():
            try:
                return operation()
            except (cli.UsageError, *passthrough):
                raise
            except SystemExit as exc:
                raise exited(f"the workload {name}", phase_name, exc) from None
            except Exception as exc:
                raise UserCodeError(phase_name, repetition, exc) from exc

        return run

    row, workload = phase("model_load", user(lambda: function(config, **dims), "model_load"))
    rows.append(row)
    kind = check_workload(torch, workload, config.device, name)
    facts["kind"] = kind
    facts["optimizer"] = type(workload.optimizer).__name__ if workload.optimizer else None
    facts["micro_batches"] = workload.micro_batches
    facts["grad_scaler"] = workload.scaler is not None
    facts["parameters"] = counted(workload.model.parameters())
    facts["buffers"] = counted(workload.model.buffers())
    row, inputs = phase("inputs", user(workload.make_inputs, "inputs"))
    rows.append(row)
    check_inputs(torch, inputs, config.device)
    facts["inputs"] = [
        {
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "bytes": t.numel() * t.element_size(),
        }
        for t in tensors_in(torch, inputs)
    ]
    for phase_name, repetition, count, operation in step_plan(
        torch, workload, inputs, kind, warmup, repeats
    ):
        # [0]: the step's result, alive for the end values, is dropped before the next phase.
        rows.append(
            phase(phase_name, user(operation, phase_name, repetition), repetition, count)[0]
        )


# ---------------------------------------------------------------- trace and measurement


@dataclasses.dataclass
class Setting:
    """The configuration of one run, as the command line gave it."""

    file: WorkloadFile
    dtype: str
    batch: int
    dims: dict
    declared: dict
    warmup: int
    repeats: int
    seed: int
    given: list = dataclasses.field(default_factory=list)  # the --dim options


def trace_workload(torch, setting: Setting, index: int, target=None, device=None, say=None):
    """(Trace, facts, the user's exception or None): the protocol run once on fake tensors.
    The module is imported again inside the trace, so its own tensors are fake too. target:
    the GPU whose kernel choices a trace without a GPU makes (attention_choice.TargetGpu);
    device="meta": trace as a machine without a GPU does, even on one (probe_sweep.py);
    say: told each phase as its trace starts (progress_line)."""
    device = device or trace_prediction.trace_device(torch, index)
    dtype = getattr(torch, setting.dtype)
    config = Configuration(torch.device(device), dtype, setting.batch, setting.seed)
    facts: dict = {}
    failure: list = []
    limits = (*torch_private.fake_tensor_limits(), trace_prediction.TraceStopped)

    def run(phase) -> None:
        phase = cli.announced(phase, say)
        try:
            module = import_workload(setting.file)
            function = getattr(module, setting.file.function)
            torch.manual_seed(setting.seed)
            drive(
                torch, phase, function, setting.file.function, config, setting.dims,
                setting.warmup, setting.repeats, [], facts, limits,
            )  # fmt: skip
        except UserCodeError as exc:
            failure.append(exc)
            raise trace_prediction.TraceStopped(
                f"the workload's own code raised {type(exc.original).__name__} in "
                f"{exc.phase} on fake tensors: the trace cannot follow it"
            ) from None

    try:
        trace = trace_prediction.run_trace(torch, device, run, target=target)
    except (cli.UsageError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the harness's own failure: said, and the measurement stands
        traceback.print_exc()
        trace = trace_prediction.Trace(device, trace_prediction.build_of(torch), torch.__version__)
        trace.stopped = f"the trace itself failed ({type(exc).__name__}): not predicted"
    return trace, facts, (failure[0] if failure else None)


def configuration_record(setting: Setting, device: str) -> dict:
    return {
        "device": device,
        "dtype": setting.dtype,
        "batch": setting.batch,
        "dims": setting.dims,
        "warmup": setting.warmup,
        "repeats": setting.repeats,
        "seed": setting.seed,
    }


def workload_record(setting: Setting, facts: dict, rows: list[dict]) -> dict:
    """What was run, never where it lives: the file's name and SHA-256, not its path."""
    kind = facts.get("kind")
    return {
        "file": setting.file.path.name,
        "sha256": setting.file.sha256,
        "function": setting.file.function,
        "dimensions": setting.dims,
        "declared_defaults": setting.declared,
        "kind": kind,
        "optimizer": facts.get("optimizer"),
        "micro_batches": facts.get("micro_batches", 1),
        **({"grad_scaler": True} if facts.get("grad_scaler") else {}),
        **({"recipe": setting.file.recipe} if setting.file.recipe else {}),
        "parameters": facts.get("parameters"),
        "buffers": facts.get("buffers"),
        "inputs": facts.get("inputs"),
        "phases_planned": planned_phases(kind, setting.repeats) if kind else None,
        "phases_run": [row["phase"] for row in rows],
    }


class Gpu:
    """Everything `measure` asks of the GPU, in one place: the tests stand a CPU in for it."""

    stacks = False  # the history with each block's stack (measure --history-stacks)

    def check(self, torch, index: int, text: str) -> None:
        phase_protocol.check_gpu(torch, index, text)

    def environment(self, index: int, text: str, driver_query, process_start: str) -> dict:
        return environment_capture.collect_environment(index, text, driver_query, process_start)

    def start(self, torch, index: int):
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        torch.cuda.init()
        if torch.cuda.memory_reserved(device):  # the trace must leave nothing behind
            torch.cuda.empty_cache()
        return device

    def runtime(self, torch):
        """What phase_protocol.run_phase reads the counters and events from."""
        return torch.cuda

    def probe(self, torch, device, trace) -> trace_prediction.Calibration:
        return trace_prediction.probe_operators(torch, device, trace)

    def history(self, torch, on: bool):
        """on: starts recording, True; off: the snapshot, recording stopped."""
        if on:
            trace_prediction.start_history(torch, self.stacks)
            return True
        snapshot = torch_private.memory_snapshot(torch)
        trace_prediction.stop_history(torch)
        return snapshot


def run_measurement(torch, gpu, setting, device, function, traced, document, history) -> int:
    """The phases on the GPU; then, the protocol untouched, the probes and the prediction."""
    config = Configuration(device, getattr(torch, setting.dtype), setting.batch, setting.seed)
    rows, facts = document["phases"], {}
    runtime = gpu.runtime(torch)
    recording = gpu.history(torch, True)  # the oracle's history (held_against_history)
    torch.manual_seed(setting.seed)
    status, failure = RunStatus.COMPLETED, None
    try:
        drive(
            torch, partial(phase_protocol.run_phase, runtime, device), function,
            setting.file.function, config, setting.dims, setting.warmup, setting.repeats,
            rows, facts, (runtime.OutOfMemoryError,),
        )  # fmt: skip
    except phase_protocol.OutOfMemory as oom:
        status = RunStatus.OUT_OF_MEMORY
        failure = oom.failure()
    except UserCodeError as exc:
        status = RunStatus.FAILED
        traceback.print_exception(exc.original)
        failure = user_failure(exc)
    started = time.perf_counter_ns()
    snapshot = gpu.history(torch, False) if recording else None
    history_ns = time.perf_counter_ns() - started
    if history is not None and snapshot is not None:
        history["snapshot"] = snapshot
    document["status"] = status
    document["workload"] = workload_record(setting, facts or traced[1], rows)
    if failure is not None:
        document["failure"] = failure
    if status == RunStatus.FAILED:
        return cli.INVALID
    gc.collect()  # the workload's tensors go before the probes need room
    trace, calibration = traced[0], None
    try:
        if trace.stopped is None:
            calibration = gpu.probe(torch, device, trace)
            document["calibration"] = calibration.to_json(trace)
        prediction = trace_prediction.predict(trace, calibration)
    except Exception as exc:  # the harness's own failure: said, and the measurement stands
        traceback.print_exc()
        document.pop("calibration", None)
        reason = f"the calibration or the replay failed ({type(exc).__name__}): not predicted"
        prediction = trace_prediction.Prediction(PredictionStatus.NOT_PREDICTED, [], [], [], reason)
    if status == RunStatus.COMPLETED:  # out of memory: the phases the replay has, unrun
        document["history_check"] = held_against_history(snapshot, device, prediction, history_ns)
    if history is not None and snapshot is not None:
        history["replay"] = prediction.log
        if prediction.rows:  # replayed again under this GPU's own order of segment addresses
            events = history["snapshot"]["device_traces"][device.index]
            rank = trace_prediction.segment_ranks(events)
            history["replay_real_order"] = trace_prediction.replay(trace, calibration, rank)[0]
    document["prediction"] = trace_prediction.prediction_record(trace, prediction, "this process")
    for row in rows:
        row["harness_overhead_ns"] = row["wall_time_ns"] - row["event_time_ns"]
    document["summary"] = summarise(document)
    compare(document)
    return cli.OUT_OF_MEMORY if status == RunStatus.OUT_OF_MEMORY else cli.OK


def held_against_history(snapshot, device, prediction, history_ns: int) -> dict | None:
    """The oracle (history_check.py): the prediction's replay against the allocator's
    history of the phases, request by request; an "exact" claim that it contradicts is
    withdrawn, with the first difference named. None where no history was recorded."""
    if snapshot is None or not prediction.rows:
        return None
    events = snapshot["device_traces"][device.index]
    if len(events) >= trace_prediction.HISTORY_ENTRIES:  # the oldest events dropped
        return None
    started = time.perf_counter_ns()
    found = history_check.check(events, prediction.log)
    found.update(history_ns=history_ns, check_ns=time.perf_counter_ns() - started)
    if prediction.status == PredictionStatus.EXACT and not found["agrees"]:
        prediction.status = PredictionStatus.APPROXIMATE
        unknown = {"op": history_check.HISTORY, "calls": 0, "why": history_check.why(found)}
        prediction.unknown.append(unknown)
        prediction.unbounded = (
            "the GPU's own history contradicted the replay: no bounds are claimed"
        )
    return found


def user_failure(exc: UserCodeError) -> dict:
    """Where the user's code raised and the exception's type: never its message, which may
    hold paths or data."""
    return {
        "phase": exc.phase,
        "repetition": exc.repetition,
        "exception_type": type(exc.original).__name__,
        "note": FAILED_NOTE,
    }


def setting_from(args) -> Setting:
    steps = 1 + args.warmup + args.repeats
    if steps > args.estimate_budget:
        raise cli.UsageError(
            f"the trace would run {steps} steps (1 cold + --warmup {args.warmup} + --repeats "
            f"{args.repeats}), over the estimate budget of {args.estimate_budget} "
            "(--estimate-budget)"
        )
    file, given, dtype = workload_of(args, args.workload)
    return Setting(file, dtype, args.batch, {}, {}, args.warmup, args.repeats, args.seed, given)


def workload_of(args, workload: tuple[Path, str] | None) -> tuple[WorkloadFile, list, str]:
    """What the options name (sweep.py asks the same): the WorkloadFile of FILE.py:FUNCTION,
    or of a --hf-config, read and checked; the dimensions given (--dim, and a config's
    --new-tokens and --lora-rank); the dtype: --dtype, else a config's own (as transformers
    builds a model from it), else float32."""
    given = list(args.dim)
    if args.hf_config is None:
        if args.task or args.new_tokens or args.lora_rank or args.gradient_checkpointing:
            raise cli.UsageError(
                "--task, --new-tokens, --lora-rank and --gradient-checkpointing go with --hf-config"
            )
        if given_flags := recipe_flags(args):
            raise cli.UsageError(
                f"{given_flags[0]}: goes with --hf-config (a workload file loads its own "
                "model and sets its own optimizer, autocast and Workload.micro_batches)"
            )
        return read_workload_file(*workload), given, args.dtype or DEFAULTS["dtype"]
    from pipeline.workloads import hf_model

    path, task = Path(args.hf_config), args.task or "inference"
    options = {"new_tokens": args.new_tokens, "lora_rank": args.lora_rank}
    for name, wants in (("new_tokens", ("generate",)), ("lora_rank", hf_model.ADAPTED)):
        if options[name] is not None and task not in wants:
            option = "--" + name.replace("_", "-")
            raise cli.UsageError(f"{option} goes with --task {' or '.join(wants)}, not {task}")
    steps = 1 + args.warmup + args.repeats
    budget = getattr(args, "layer_pass_budget", None) or hf_model.hf_config.LAYER_PASS_BUDGET
    given_hf = given + [(name, value) for name, value in options.items() if value is not None]
    config = hf_model.read_config(path)
    four_bit = hf_model.four_bit_recipe(
        task,
        getattr(args, "load_in_4bit", False),
        hf_model.stored_quantization(config, path),
        quant_type=getattr(args, "bnb_4bit_quant_type", None),
        use_double_quant=getattr(args, "bnb_4bit_use_double_quant", None),
        compute_dtype=getattr(args, "bnb_4bit_compute_dtype", None),
    )
    recipe = hf_model.Recipe(
        optim=getattr(args, "optim", None),
        gradient_accumulation_steps=getattr(args, "gradient_accumulation_steps", 1),
        bf16=getattr(args, "bf16", False),
        fp16=getattr(args, "fp16", False),
        load_in_8bit=getattr(args, "load_in_8bit", False),
        **four_bit,
    )
    file, named = hf_model.workload_file(
        path,
        task,
        args.gradient_checkpointing,
        args.batch,
        given_hf,
        steps,
        budget,
        recipe,
        config,
    )
    given += [(name, value) for name, value in options.items() if value is not None]
    dtype = args.dtype or named or DEFAULTS["dtype"]
    if recipe.fp16 and dtype == "float16":
        said = "--dtype float16" if args.dtype else f"{path.name}'s dtype float16"
        raise cli.UsageError(
            f"--fp16 with {said}: GradScaler refuses to unscale float16 gradients (the "
            "Trainer's fp16=True trains float32 weights): give --dtype float32 or bfloat16"
        )
    return file, given, dtype


def recipe_flags(args) -> list[str]:
    """A --hf-config run's recipe options given (a 4-bit load, a Trainer's options:
    add_hf_options), as flags: sweep.py passes them on."""
    flags = []
    if getattr(args, "optim", None) is not None:
        flags += ["--optim", args.optim]
    if getattr(args, "gradient_accumulation_steps", 1) != 1:
        flags += ["--gradient-accumulation-steps", str(args.gradient_accumulation_steps)]
    flags += [f"--{name}" for name in ("bf16", "fp16") if getattr(args, name, False)]
    flags += [
        f"--load-in-{bits}bit" for bits in (4, 8) if getattr(args, f"load_in_{bits}bit", False)
    ]
    for name in ("quant_type", "compute_dtype"):
        if (value := getattr(args, f"bnb_4bit_{name}", None)) is not None:
            flags += [f"--bnb-4bit-{name.replace('_', '-')}", value]
    double = getattr(args, "bnb_4bit_use_double_quant", None)
    if double is not None:
        flags.append("--bnb-4bit-use-double-quant" if double else "--no-bnb-4bit-use-double-quant")
    return flags


def load(setting: Setting):
    """Import the workload once for real; its function and dimensions, checked."""
    module = import_workload(setting.file)
    function, declared = workload_function(module, setting.file)
    setting.declared = declared
    setting.dims = resolve_dimensions(setting.file.function, declared, setting.given)
    return function


def measure(args, gpu: Gpu) -> int:
    output = Path(args.output)
    named = {
        "--environment-output": args.environment_output,
        "--memory-history": args.memory_history,
    }
    outputs = {"--output": output, **{k: Path(v) if v else None for k, v in named.items()}}
    measure_flow.refuse_outputs(outputs)
    setting = setting_from(args)
    started = measure_flow.EnvironmentStart(args.device)

    def record_environment() -> dict:
        return started.record(args, outputs["--environment-output"], collect=gpu.environment)

    try:
        torch = environment_capture.import_torch()
        gpu.check(torch, args.device, args.device_text)
    except cli.UsageError:
        # As mesure_memoire.py and decoder.py measure: a run refused for want of PyTorch or a
        # GPU still leaves its diagnostic, the environment, where one was asked for.
        record_environment()
        raise
    failed = None
    try:
        function = load(setting)
    except UserCodeError as exc:
        failed, function = exc, None
    if failed is None:
        from pipeline.predicting import attention_choice

        traced = trace_workload(
            torch, setting, args.device, attention_choice.this_gpu(torch, args.device)
        )
    environment = record_environment()
    document = {
        **writers.document_head(SCHEMA, TOOL, "running"),
        "environment": environment,
        "configuration": configuration_record(setting, f"cuda:{args.device}"),
        "workload": None,
        "clocks": phase_protocol.CLOCKS,
        "counters": phase_protocol.COUNTERS,
        "phase_scopes": PHASE_SCOPES,
        "phases": [],
    }
    if failed is not None:
        traceback.print_exception(failed.original)
        document["status"] = RunStatus.FAILED
        document["workload"] = workload_record(setting, {}, [])
        document["failure"] = user_failure(failed)
        code = cli.INVALID
    else:
        history = {} if args.memory_history else None
        device = gpu.start(torch, args.device)
        code = run_measurement(torch, gpu, setting, device, function, traced, document, history)
        if history is not None and "snapshot" in history:
            history["phases"] = [row["phase"] for row in document["phases"]]
            cli.write_new(Path(args.memory_history), pickle.dumps(history))
    measure_flow.write_measurement(output, document)
    if code == cli.INVALID:
        failure = document["failure"]
        print(
            f"own_model.py: the workload raised {failure['exception_type']} in "
            f"{failure['phase']} (traceback above): recorded as failed, not a measurement",
            file=sys.stderr,
        )
    return code


# ---------------------------------------------------------------- estimate (no GPU)


# The trace_workload() reason when the trace failed in the tool's own code, not the workload's.
TRACE_FAILED = "the trace itself failed"
NO_GPU = "no GPU in particular (no calibration: --gpu h200 gives the H200's)"


# What PyTorch raises where code asks for CUDA on a build or machine without it
# (c10/core/impl/DeviceGuardImplInterface.h, torch/cuda/__init__.py's _lazy_init)
NO_CUDA = (
    "PyTorch is not linked with support for cuda devices",
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver on your system",
)


def asks_cuda_by_name(exc: BaseException) -> bool:
    return any(said in str(exc) for said in NO_CUDA)


def estimate(args) -> int:
    setting = setting_from(args)
    calibration, source, target, gpu = None, None, None, NO_GPU
    if args.gpu is not None:
        calibration, facts = gpu_calibration.load(args.gpu)
        source = calibration.source
        target = gpu_calibration.target(facts)
        gpu = f"the {facts['gpu']['name']}"
    if args.calibration is not None:
        calibration, source, gpu = read_calibration(Path(args.calibration))
    torch = environment_capture.import_torch()
    say = cli.progress_line("own_model.py")
    try:
        load(setting)
        trace, facts, failure = trace_workload(torch, setting, 0, target, say=say)
    except UserCodeError as exc:
        failure, trace = exc, None
    if say is not None:
        say(None if failure is not None else "predicting: replaying the trace")
    if failure is not None:
        traceback.print_exception(failure.original)
        hint = (
            ": it asks for a CUDA device by name, which a trace without a GPU does not "
            "have; give its models and tensors config.device (and device_map=config.device)"
            if asks_cuda_by_name(failure.original)
            else ""
        )
        print(
            f"own_model.py: the workload raised {type(failure.original).__name__} in "
            f"{failure.phase} (traceback above): not predicted{hint}",
            file=sys.stderr,
        )
        return cli.INVALID
    prediction = trace_prediction.predict(trace, calibration)
    if say is not None:
        say(None)
    document = {
        **writers.document_head(SCHEMA, TOOL, RunStatus.PREDICTED),
        "configuration": configuration_record(setting, trace.device),
        "workload": workload_record(setting, facts, []),
        "phase_scopes": PHASE_SCOPES,
        "prediction": trace_prediction.prediction_record(trace, prediction, source),
    }
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_estimate(document, gpu)
    if (trace.stopped or "").startswith(TRACE_FAILED):  # the tool's failure: never a success
        print(
            f"own_model.py: {trace.stopped.removesuffix(': not predicted')}, the tool's own "
            "failure, not your model's (traceback above): not predicted",
            file=sys.stderr,
        )
        return cli.INVALID
    return cli.OK


def read_calibration(path: Path):
    """An own-model measurement's calibration, for operator calls with the same signatures:
    a file that validates as validate.py validates it, measured with a calibration."""
    from pipeline.artefacts import validate  # jsonschema: read here, when needed

    document = validate.checked(path, (SCHEMA,), "an own_model.py measurement").document
    if "calibration" not in document:
        raise cli.UsageError(
            f"--calibration {path}: an own_model.py {document['status']} file without a "
            "calibration; give a measurement that has one"
        )
    calibration = trace_prediction.Calibration.from_json(document, path.name)
    gpu = document["environment"]["gpu"].get("name")
    version = document["environment"]["torch"].get("version")
    return calibration, f"{path.name} ({gpu}, torch {version})", f"the {gpu} of {path.name}"


def in_gib(nbytes: int, rounding: Callable[[float], float] = round) -> str:
    """A size as a person reads it: GiB from 1 GiB up, MiB below, one decimal, `rounding`
    (math.floor for a lower bound, math.ceil for an upper one) to that decimal."""
    unit, size = ("GiB", 2**30) if nbytes >= 2**30 else ("MiB", 2**20)
    return f"{rounding(nbytes / size * 10) / 10:.1f} {unit}"


def estimate_headline(prediction: dict, gpu: str) -> list[str]:
    """The answer first: the peak reserved (the GPU memory PyTorch holds), its bounds where
    approximate, the GPU it is for; then exact or approximate, and why, in one line."""
    status = prediction["status"]
    if status == PredictionStatus.NOT_PREDICTED:
        return ["peak reserved: not predicted", f"not predicted: {prediction.get('reason')}"]
    peak = prediction["largest_peak_reserved_bytes"]
    shown = in_gib(peak)
    if "bounds" in prediction:
        rows = prediction["bounds"]["phases"]
        lower = max(row["peak_reserved_bytes"]["lower"] for row in rows)
        upper = max(row["peak_reserved_bytes"]["upper"] for row in rows)
        shown += f" ({in_gib(lower, math.floor)} to {in_gib(upper, math.ceil)})"
    elif "unbounded" in prediction:
        shown += " (no upper bound)"
    first = f"peak reserved {shown}, {status}, for {gpu}"
    if status == PredictionStatus.EXACT:
        why = "every operator call is covered by the calibration; the GPU must show these bytes"
        return [first, f"exact: {why}"]
    unknown = [entry["op"] for entry in prediction["unknown"]]
    more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
    why = f"the calibration does not cover {', '.join(unknown[:3])}{more}"
    if "bounds" in prediction:
        why += "; fit sizes the GPU by the upper bound"
    elif "unbounded" in prediction:
        why += f"; {prediction['unbounded']}"
    return [first, f"approximate: {why}"]


def print_estimate(document: dict, gpu: str = NO_GPU) -> None:
    prediction = document["prediction"]
    for line in estimate_headline(prediction, gpu):
        print(line)
    if prediction["phases"]:
        print("predicted PyTorch allocator counters, bytes (baseline / end / peak)")
    for row in prediction["phases"]:
        print(
            f"{row['phase']:<15} allocated {row['baseline_allocated_bytes']:>14} "
            f"{row['allocated_bytes']:>14} {row['peak_allocated_bytes']:>14}   reserved "
            f"{row['baseline_reserved_bytes']:>14} {row['reserved_bytes']:>14} "
            f"{row['peak_reserved_bytes']:>14}"
        )
    trace = prediction["trace"]
    print(
        f"prediction: {prediction['status']} (traced on {trace['device']}, torch "
        f"{trace['torch']}; calibration: {prediction['calibration'] or 'none'})"
    )
    if "reason" in prediction:
        print(f"  {prediction['reason']}")
    if "bounds" in prediction:
        largest = {
            key: max(row[key]["upper"] for row in prediction["bounds"]["phases"])
            for key in trace_prediction.PEAK_KEYS
        }
        least = {
            key: max(row[key]["lower"] for row in prediction["bounds"]["phases"])
            for key in trace_prediction.PEAK_KEYS
        }
        print(
            f"  bounds of the largest peaks: allocated {least['peak_allocated_bytes']:,} to "
            f"{largest['peak_allocated_bytes']:,} B, reserved {least['peak_reserved_bytes']:,} "
            f"to {largest['peak_reserved_bytes']:,} B"
        )
    elif "unbounded" in prediction:
        print(f"  {prediction['unbounded']}")
    for entry in prediction["unknown"]:
        calls = f" ({entry['calls']} calls)" if entry["calls"] else ""
        print(f"  unknown: {entry['op']}{calls}: {entry['why']}")


# ---------------------------------------------------------------- command line


def add_configuration(parser) -> None:
    """The run's settings and the workload's dimensions (sweep.py takes the same options)."""
    parser.add_argument(
        "--dtype",
        choices=sorted(allocator_model.DTYPE_BYTES),
        help=f"(default {DEFAULTS['dtype']}; a --hf-config model: its config's dtype, if any)",
    )
    parser.add_argument(
        "--batch",
        type=cli.bounded_int(MAX_BATCH),
        default=DEFAULTS["batch"],
        help=f"(default {DEFAULTS['batch']}; at most {MAX_BATCH})",
    )
    counts = {name: DEFAULTS[name] for name in ("warmup", "repeats")}
    arguments.add_defaulted(parser, counts, {}, ())
    parser.add_argument("--seed", type=arguments.non_negative_int, default=0)
    parser.add_argument(
        "--dim",
        type=dimension_argument,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one of the function's declared dimensions (keyword-only parameters)",
    )


def add_hf_options(parser) -> None:
    """What to run of a --hf-config model (hf_model.py)."""
    parser.add_argument("--task", choices=("inference", "generate", "training", "lora", "qlora"))
    parser.add_argument(
        "--new-tokens",
        type=cli.bounded_int(MAX_NEW_TOKENS),
        help=f"generate: tokens (default 16, at most {MAX_NEW_TOKENS})",
    )
    parser.add_argument(
        "--lora-rank",
        type=cli.bounded_int(MAX_LORA_RANK),
        help=f"lora, qlora: the rank (default 8, at most {MAX_LORA_RANK} and the model's width)",
    )
    # the load, as transformers' BitsAndBytesConfig names it (qlora: 4 bits, its defaults)
    parser.add_argument(
        "--load-in-4bit",
        action="store_true",
        help="load the model in 4 bits with bitsandbytes, as from_pretrained does "
        "(inference, generate, lora)",
    )
    parser.add_argument(
        "--load-in-8bit",
        action="store_true",
        help="load the model in 8 bits with bitsandbytes (LLM.int8, its outlier threshold "
        "6.0), as from_pretrained does (inference, generate, lora)",
    )
    parser.add_argument(
        "--bnb-4bit-quant-type",
        choices=("nf4", "fp4"),
        help="the 4-bit data type (default fp4, as BitsAndBytesConfig; qlora: nf4)",
    )
    parser.add_argument(
        "--bnb-4bit-use-double-quant",
        action=argparse.BooleanOptionalAction,
        help="quantise the quantisation constants too (default no; qlora: yes)",
    )
    parser.add_argument(
        "--bnb-4bit-compute-dtype",
        choices=sorted(allocator_model.DTYPE_BYTES),
        help="the dtype 4-bit layers compute in (default float32; qlora: bfloat16)",
    )
    parser.add_argument(
        "--layer-pass-budget",
        type=arguments.positive_int,
        default=hf_config.LAYER_PASS_BUDGET,
        metavar="PASSES",
        help="the most layer passes, steps x layers x forwards a step (generate: one a new "
        f"token), the trace of a --hf-config model may run (default {hf_config.LAYER_PASS_BUDGET})",
    )
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="the model's own checkpointing"
    )
    # a Trainer's options (--task training or lora), as TrainingArguments names them
    parser.add_argument(
        "--optim",
        metavar="NAME",
        help="the optimizer the Trainer makes for this name (adamw_torch, adamw_torch_fused, "
        "adafactor, sgd, ...); default: AdamW over foreach kernels",
    )
    parser.add_argument(
        "--gradient-accumulation-steps",
        type=cli.bounded_int(MAX_MICRO_BATCHES),
        default=1,
        metavar="N",
        help=f"micro-batches of --batch each step accumulates (default 1, at most "
        f"{MAX_MICRO_BATCHES})",
    )
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument(
        "--bf16",
        action="store_true",
        help="mixed precision: the forward under CUDA autocast to bfloat16, the weights, "
        "gradients and optimizer state in --dtype (float32 for the Trainer's bf16=True on a "
        "float32 model)",
    )
    precision.add_argument(
        "--fp16",
        action="store_true",
        help="mixed precision: the forward under CUDA autocast to float16 and the loss scaled "
        "by a CUDA GradScaler, the weights, gradients and optimizer state in --dtype (the "
        "Trainer's fp16=True on a float32 model)",
    )


def build_parser() -> cli.Parser:
    parser = cli.Parser(prog="own_model.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=cli.Parser)
    measure_parser = commands.add_parser("measure", help="measure a workload phase by phase")
    estimate_parser = commands.add_parser("estimate", help="predict its counters, no GPU")
    for p in (measure_parser, estimate_parser):
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--workload",
            type=workload_argument,
            metavar="FILE.py:FUNCTION",
            help="the file and the function that returns a Workload",
        )
        which.add_argument(
            "--hf-config",
            metavar="CONFIG.json",
            help="a Hugging Face model's config.json, built with transformers (hf_model.py)",
        )
        add_hf_options(p)
        add_configuration(p)
        p.add_argument(
            "--estimate-budget",
            type=arguments.positive_int,
            default=ESTIMATE_BUDGET,
            metavar="STEPS",
            help="the most steps, 1 + warmup + repeats, the trace may run "
            f"(default {ESTIMATE_BUDGET})",
        )
    measure_parser.add_argument("--device", required=True, type=cli.device, help="cuda or cuda:N")
    measure_parser.add_argument("--output", required=True, help="a new JSON file")
    measure_parser.add_argument("--environment-output", help="also the environment, a new file")
    measure_parser.add_argument(
        "--history-stacks",
        action="store_true",
        help="record each block's C++ and Python stack in the allocator's history, so that "
        "the check of the prediction names the C++ function of the first request that "
        "differs; the steps then take longer (the evidence page says how much)",
    )
    measure_parser.add_argument(
        "--memory-history",
        metavar="FILE",
        help="also record the allocator's history during the phases (no stack traces) and "
        "the replayed prediction, pickled into this new file, to find where they part",
    )
    source = estimate_parser.add_mutually_exclusive_group()  # one calibration, said once
    source.add_argument(
        "--calibration",
        metavar="MEASUREMENT.json",
        help="an own_model.py measurement whose calibration covers these operator calls",
    )
    source.add_argument(
        "--gpu",
        choices=sorted(gpu_calibration.KNOWN),
        help="predict for this GPU: its attention kernel choices and its committed calibration",
    )
    estimate_parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def main(
    argv: list[str] | None = None,
    process_start: str = environment_capture.FRESH_INTERPRETER,
    gpu: Gpu | None = None,
):
    def body() -> int:
        args = build_parser().parse_args(argv)
        args.process_start = process_start
        if args.command == "estimate":
            return estimate(args)
        args.device_text = args.device
        args.device = arguments.device_index(args.device)
        gpu_in_use = gpu or Gpu()
        gpu_in_use.stacks = args.history_stacks
        return measure(args, gpu_in_use)

    return cli.run("own_model.py", body, interrupted="nothing was written")


if __name__ == "__main__":
    raise SystemExit(main())
