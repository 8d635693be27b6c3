# The kit script's own part: the seed's synthetic network, its three commands and their
# command line. The kit ships one self-contained file, kit/mesure_memoire.py, generated
# from this module by pipeline/kit/make_kit_script.py: each `# from MODULE: NAMES` line below
# becomes those definitions, copied verbatim from the core module (allocator_model,
# arguments, environment_capture, phase_protocol, writers, run_status, measure_flow), and the
# imports of them become the standard-library imports they need. So the kit reads as one file
# in its own order, and the pipeline shares the core without importing the kit. Edit this
# module or the core, never mesure_memoire.py; then run `python -m pipeline.kit.make_kit_script`
# (a test and `make archive` refuse a kit script that is not regenerated). The pipeline imports
# this module for what it measures of the seed network: the configuration, the fixed phases,
# the command line (the chain checks flags with it) and the predicted counters (validate and
# sweep compare them).
"""IteraGPU Lab v1: estimate weight memory, record the environment, measure a synthetic network.

Three commands, one file, standard library only at module level (PyTorch is imported inside
the commands that need it, so `estimate` runs on any Python >= 3.10):

    python mesure_memoire.py estimate --parameters 7000000000 --bits 16 --reserve-gib 4
    python mesure_memoire.py environment --device cuda:0
    python mesure_memoire.py measure --device cuda:0 --batch 1 --context 16 --width 64 \
        --dtype float32 --warmup 1 --repeats 2 --output mesures-petit-essai.json

The synthetic network is `Linear(width, 4*width) -> GELU(exact) -> Linear(4*width, width)`.
It is not an LLM, not training, and not a benchmark of the GPU it runs on.

Exit codes: 0 ok; 2 bad input or missing prerequisite (no PyTorch, no GPU, output exists);
3 the GPU ran out of memory during `measure` (the file is written, status "out_of_memory").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from decimal import Context, Decimal, InvalidOperation
from functools import partial
from pathlib import Path

from pipeline.core.allocator_model import DTYPE_BYTES, AllocatorModel
from pipeline.core.arguments import (
    UsageError,
    add_defaulted,
    device_index,
    non_negative_decimal,
    non_negative_int,
    positive_int,
)
from pipeline.core.environment_capture import (
    FRESH_INTERPRETER,
    TOOL,
    collect_environment,
    environment_document,
    import_torch,
)
from pipeline.core.measure_flow import EnvironmentStart, refuse_outputs, write_measurement
from pipeline.core.phase_protocol import (
    CLOCKS,
    COUNTER_KEYS,
    COUNTERS,
    OutOfMemory,
    check_gpu,
    peaks_summary,
    prediction_summary,
    run_phase,
    spread,
)
from pipeline.core.run_status import RunStatus
from pipeline.core.writers import document_head, refuse_existing, write_result

# from environment_capture: TOOL, ENVIRONMENT_SCHEMA
MEASUREMENT_SCHEMA = "urn:iteragpu-lab:schema:measurement:v2"
ESTIMATE_SCHEMA = "urn:iteragpu-lab:schema:estimate:v1"

GIB = 2**30
GB = 10**9
HIDDEN_FACTOR = 4
# from allocator_model: DTYPE_BYTES
EXIT_OK, EXIT_USAGE, EXIT_OOM = 0, 2, 3
# The measured configuration and its defaults: `measure`, `estimate --phases` and the
# pipeline's sweeps take the same options. The phases every run has, in order; then one
# warm_forward row per repetition.
CONFIGURATION_DEFAULTS = {
    "batch": 1,
    "context": 16,
    "width": 64,
    "dtype": "float32",
    "warmup": 1,
    "repeats": 2,
}
FIXED_PHASES = ("model_load", "inputs", "cold_forward", "warmup")
# from environment_capture: FRESH_INTERPRETER

# The two Linear layers' keys in the nn.Sequential (GELU is "1"): the library blocks are
# calibrated and predicted per layer.
FIRST_LINEAR, SECOND_LINEAR = "0", "2"
# from phase_protocol: COUNTER_KEYS
# Dense datasheet peaks (vendor, SXM parts), for scale only: this network is not a benchmark.
DATASHEET_TFLOPS = {
    "NVIDIA H200": {"float32": 67, "float16": 989, "bfloat16": 989},
    "NVIDIA H100 80GB HBM3": {"float32": 67, "float16": 989, "bfloat16": 989},
}


# from allocator_model: MIN_BLOCK, SMALL_SIZE, SMALL_SEGMENT, LARGE_SEGMENT, MIN_LARGE_ALLOC,
#     ROUND_LARGE, MODELLED_ALLOCATOR

NOT_INCLUDED = (
    "Weights only. Not included: activations, KV cache, quantization metadata, gradients, "
    "optimizer state, CUDA/ROCm libraries and their workspaces, framework overhead. "
    "The reserve is the user's assumption, not a measured value. This does not predict "
    "whether a real model fits on a given card."
)
# from phase_protocol: CLOCKS, COUNTERS
PHASES_DOC = {
    "model_load": "build and initialise the model on the CPU, then move it to the GPU",
    "inputs": "create the synthetic input on the GPU",
    "cold_forward": "first forward pass after device, generator and input initialisation",
    "warmup": "all warm-up passes together, one row",
    "warm_forward": "one row per timed repetition after warm-up",
}


# from run_status: RunStatus


# from arguments: UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


# ---------------------------------------------------------------- value parsing


# from arguments: _matched, positive_int, non_negative_decimal, non_negative_int, device_index,
#   add_defaulted


# ---------------------------------------------------------------- estimate (no GPU)


def exact_ratio(numerator: int, denominator: int) -> Decimal:
    """numerator/denominator in decimal, exactly (denominators here are 2**30 and 10**9)."""
    context = Context(prec=len(str(numerator)) + 40, traps=[InvalidOperation])
    result = context.divide(Decimal(numerator), Decimal(denominator))
    assert result * denominator == numerator, "the division must be exact"
    return result


def estimate(parameters: int, bits: int, reserve_gib: Decimal) -> dict:
    """bytes = ceil(parameters * bits / 8), GiB = bytes / 2**30 and GB = bytes / 10**9, in
    exact decimals (no float ever rounds a figure a user compares with a card)."""
    weights_bytes = -(-parameters * bits // 8)
    weights_gib = exact_ratio(weights_bytes, GIB)
    total_context = Context(prec=len(str(weights_bytes)) + 80)
    return {
        "schema": ESTIMATE_SCHEMA,
        "parameters": parameters,
        "bits": bits,
        "weights_bytes": weights_bytes,
        "weights_gib": format(weights_gib, "f"),
        "weights_gb": format(exact_ratio(weights_bytes, GB), "f"),
        "reserve_gib": format(reserve_gib, "f"),
        "total_gib": format(total_context.add(weights_gib, reserve_gib), "f"),
        "numbers": "decimal strings, exact: GiB = 2**30 bytes, GB = 10**9 bytes",
        "not_included": NOT_INCLUDED,
    }


def rounded(text: str, places: int = 10) -> str:
    """Digits for reading (half-even); the JSON keeps the exact value."""
    context = Context(prec=len(text) + places + 2)
    digits = format(context.quantize(Decimal(text), Decimal(1).scaleb(-places)), "f")
    return digits.rstrip("0").rstrip(".") if "." in digits else digits


def print_estimate(result: dict) -> None:
    print(f"parameters      {result['parameters']}")
    print(f"bits            {result['bits']}")
    print(f"weights         {result['weights_bytes']} bytes")
    print(f"                {rounded(result['weights_gib'])} GiB (2**30 bytes)")
    print(f"                {rounded(result['weights_gb'])} GB (10**9 bytes)")
    print(f"reserve         {result['reserve_gib']} GiB (your assumption, not measured)")
    print(f"weights+reserve {rounded(result['total_gib'])} GiB")
    print(result["not_included"])


# ---------------------------------------------------------------- environment


# from environment_capture: start_driver_query, finish_driver_query, start_cuda_driver,
#     stop_cuda_driver, PATH_IN_TEXT, without_personal, import_torch, describe_torch,
#     describe_device, allocator_settings


# from allocator_model: prediction_applicability


# from environment_capture: collect_environment


# ---------------------------------------------------------------- output files


# from writers: refuse_existing, json_bytes, write_new, link_unnamed, current_umask, write_result,
#     utc_now, document_head


# ---------------------------------------------------------------- prediction (no GPU)


# from allocator_model: block_bytes, AllocatorModel


def predict_phases(configuration: dict, library_blocks: list[dict]) -> list[dict]:
    """Each phase's predicted counters from the configuration and the library's own blocks.

    The network's tensors are known from the configuration: the four parameters, the input,
    and per pass Linear1's output h1, GELU's output h2 (h1 freed once GELU returns), the
    output y (h2 freed once Linear2 returns). The library blocks (cuBLAS/cuBLASLt
    workspaces: sizes and the layer that allocates them) are measured, not assumed; they
    appear in the first pass and stay."""
    width, size = configuration["width"], DTYPE_BYTES[configuration["dtype"]]
    hidden = HIDDEN_FACTOR * width
    tokens = configuration["batch"] * configuration["context"]
    allocator = AllocatorModel()
    rows: list[dict] = []
    kept: list = []  # parameters, input and library blocks: they stay to the end
    outputs: list = []  # the output of the last pass, alive when end values are read
    library_pending = {FIRST_LINEAR: True, SECOND_LINEAR: True}

    def record(phase: str, steps) -> None:
        row = {"phase": phase}
        row.update({f"baseline_{k}": v for k, v in allocator.counters().items()})
        allocator.reset_peaks()
        steps()
        row.update(allocator.counters())
        row["peak_allocated_bytes"] = allocator.peak_allocated
        row["peak_reserved_bytes"] = allocator.peak_reserved
        rows.append(row)
        while outputs:  # freed after the end values, before the next phase
            allocator.free(outputs.pop())

    def library(layer: str) -> None:
        if library_pending[layer]:
            library_pending[layer] = False
            for entry in library_blocks:
                if entry["layer"] == layer:
                    kept.append(allocator.malloc(entry["requested_bytes"]))

    def one_pass() -> None:
        while outputs:  # the previous pass's output is freed before the next pass
            allocator.free(outputs.pop())
        h1 = allocator.malloc(tokens * hidden * size)
        library(FIRST_LINEAR)
        h2 = allocator.malloc(tokens * hidden * size)
        allocator.free(h1)
        y = allocator.malloc(tokens * width * size)
        library(SECOND_LINEAR)
        allocator.free(h2)
        outputs.append(y)

    def passes(count: int):
        def steps() -> None:
            for _ in range(count):
                one_pass()

        return steps

    parameters = [hidden * width, hidden, width * hidden, width]
    record("model_load", lambda: kept.extend(allocator.malloc(n * size) for n in parameters))
    record("inputs", lambda: kept.append(allocator.malloc(tokens * width * size)))
    record("cold_forward", passes(1))
    record("warmup", passes(configuration["warmup"]))
    for _ in range(configuration["repeats"]):
        record("warm_forward", passes(1))
    return rows


def library_block(text: str) -> dict:
    match = re.fullmatch(rf"({FIRST_LINEAR}|{SECOND_LINEAR}):([0-9]{{1,15}})", text)
    if not match or int(match.group(2)) == 0:
        raise argparse.ArgumentTypeError(f"expected LAYER:BYTES with LAYER 0 or 2, got {text!r}")
    return {"layer": match.group(1), "requested_bytes": int(match.group(2))}


def print_phase_prediction(args: argparse.Namespace) -> int:
    configuration = {
        key: getattr(args, key)
        for key in ("batch", "context", "width", "dtype", "warmup", "repeats")
    }
    rows = predict_phases(configuration, args.library_block)
    if args.json:
        print(
            json.dumps(
                {
                    "configuration": configuration,
                    "library_blocks": args.library_block,
                    "phases": rows,
                },
                indent=2,
            )
        )
        return EXIT_OK
    print("predicted PyTorch allocator counters, bytes (baseline / end / peak)")
    for row in rows:
        print(
            f"{row['phase']:<13} allocated {row['baseline_allocated_bytes']:>14} "
            f"{row['allocated_bytes']:>14} {row['peak_allocated_bytes']:>14}   reserved "
            f"{row['baseline_reserved_bytes']:>14} {row['reserved_bytes']:>14} "
            f"{row['peak_reserved_bytes']:>14}"
        )
    if not args.library_block:
        print(
            "no --library-block given: cuBLAS/cuBLASLt workspaces are left out; "
            "measure reports them under 'calibration'"
        )
    return EXIT_OK


# ---------------------------------------------------------------- measure


def synthetic_model(width: int, dtype: str, seed: int) -> dict:
    hidden = HIDDEN_FACTOR * width
    parameters = width * hidden + hidden + hidden * width + width
    return {
        "architecture": "Linear(width, hidden) -> GELU -> Linear(hidden, width)",
        "width": width,
        "hidden_width": hidden,
        "hidden_rule": f"hidden_width = {HIDDEN_FACTOR} x width",
        "bias": True,
        "gelu": "exact (erf), torch.nn.GELU(approximate='none')",
        "parameters": parameters,
        "parameter_bytes": parameters * DTYPE_BYTES[dtype],
        "parameter_tensors": [
            {"name": "0.weight", "shape": [hidden, width]},
            {"name": "0.bias", "shape": [hidden]},
            {"name": "2.weight", "shape": [width, hidden]},
            {"name": "2.bias", "shape": [width]},
        ],
        "initialisation": "PyTorch default for nn.Linear, on the CPU in float32, then cast",
        "seed": seed,
        "execution": "torch.inference_mode(); no autocast, gradients, optimizer or sharding",
    }


def host_memory_available() -> int | None:
    """Bytes the host can still give: MemAvailable on Linux, else the physical total."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def host_bytes_to_build(width: int, dtype: str) -> int:
    """The weights are initialised on the CPU in float32, then cast tensor by tensor (the
    largest cast copy lives beside them), then moved to the GPU."""
    parameters = synthetic_model(width, dtype, 0)["parameters"]
    largest_cast = HIDDEN_FACTOR * width * width * DTYPE_BYTES[dtype] if dtype != "float32" else 0
    return parameters * 4 + largest_cast


def check_host_memory(width: int, dtype: str) -> None:
    """A width the host cannot even build is bad input, refused before anything is written
    (not a GPU out-of-memory: the GPU was never asked)."""
    needed, available = host_bytes_to_build(width, dtype), host_memory_available()
    if available is not None and needed > available:
        raise UsageError(
            f"--width {width}: building the model on the host needs {needed} bytes "
            f"(float32 on the CPU, then cast and moved), more than the {available} available"
        )


# from phase_protocol: check_gpu, OutOfMemory, oom_summary


def calibrate_library_blocks(torch, device, model, x) -> dict:
    """After the phases, so the protocol is untouched: free cuBLAS's workspaces, run one pass
    layer by layer, and list the blocks that appear and stay (neither output nor input).
    These are the library terms of the prediction, measured in this process."""
    report = {
        "method": (
            "after all phases: torch._C._cuda_clearCublasWorkspaces(), then one forward pass "
            "layer by layer; blocks that appear and stay, other than the layer outputs, per "
            "torch.cuda.memory_snapshot()"
        ),
        "blocks": [],
    }
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        report["error"] = "this PyTorch has no _cuda_clearCublasWorkspaces: not calibrated"
        return report

    def active() -> dict:
        found = {}
        for segment in torch.cuda.memory_snapshot():
            if segment.get("device", device.index) != device.index:
                continue
            address = segment["address"]
            for block in segment["blocks"]:
                if block["state"] == "active_allocated":
                    found[(address, block["size"])] = block["requested_size"]
                address += block["size"]
        return found

    torch.cuda.synchronize(device)
    before_clear = torch.cuda.memory_allocated(device)
    clear()
    report["cleared_bytes"] = before_clear - torch.cuda.memory_allocated(device)

    def kept_by(layer: str, seen: dict, output) -> dict:
        """The blocks that appeared with `layer` and stay, its output left out."""
        torch.cuda.synchronize(device)
        now = active()
        for key in sorted(set(now) - set(seen)):
            if key[0] != output.untyped_storage().data_ptr():
                report["blocks"].append({"layer": layer, "requested_bytes": now[key]})
        return now

    seen = active()
    with torch.inference_mode():
        hidden = model.get_submodule(FIRST_LINEAR)(x)
        seen = kept_by(FIRST_LINEAR, seen, hidden)
        activated = model.get_submodule("1")(hidden)  # GELU
        del hidden
        output = model.get_submodule(SECOND_LINEAR)(activated)
        del activated
        kept_by(SECOND_LINEAR, seen, output)
        del output
    return report


def reference_timing(torch, model, x) -> dict:
    """The same forward timed by torch.utils.benchmark.Timer (synchronises CUDA, no cache
    flush), to show how far the harness's own event times are from a standard tool."""
    from torch.utils import benchmark

    timer = benchmark.Timer(
        stmt="with torch.inference_mode():\n    model(x)",
        globals={"torch": torch, "model": model, "x": x},
    )
    result = timer.blocked_autorange(min_run_time=0.2)
    return {
        "tool": "torch.utils.benchmark.Timer.blocked_autorange(min_run_time=0.2)",
        "median_ns": round(result.median * 1e9),
        "runs": result.number_per_run * len(result.raw_times),
    }


# from phase_protocol: phase_row, run_phase


def build_model(torch, width: int, dtype, seed: int, device):
    """Built on the CPU (a failure there is the host's, never a GPU observation), then moved."""
    torch.manual_seed(seed)
    hidden = HIDDEN_FACTOR * width
    try:
        model = torch.nn.Sequential(
            torch.nn.Linear(width, hidden, bias=True),
            torch.nn.GELU(approximate="none"),
            torch.nn.Linear(hidden, width, bias=True),
        ).to(dtype=dtype)
    except RuntimeError as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--width {width}: the host could not build the model ({first})") from None
    return model.to(device).eval()


def make_input(torch, shape: tuple[int, int, int], dtype, seed: int, device):
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=dtype)


def forward_passes(torch, model, x, count: int):
    """`count` passes; each pass's output is freed before the next; the last one is returned,
    so that it is alive when the phase's end values are read."""
    with torch.inference_mode():
        output = None
        for _ in range(count):
            output = None
            output = model(x)
        return output


def pass_plan(args: argparse.Namespace) -> list[tuple[str, int | None, int]]:
    """The forward phases after the model and the input: (name, repetition, passes)."""
    plan: list[tuple[str, int | None, int]] = [("cold_forward", None, 1)]
    plan.append(("warmup", None, args.warmup))
    plan += [("warm_forward", i, 1) for i in range(1, args.repeats + 1)]
    return plan


def measure_phases(torch, args: argparse.Namespace, device, phases: list):
    """Every phase in order, each row appended as soon as it is read; returns the model and
    the input for the calibration. Raises OutOfMemory at the phase that ran out."""
    cuda, dtype = torch.cuda, getattr(torch, args.dtype)
    shape = (args.batch, args.context, args.width)
    row, model = run_phase(
        cuda, device, "model_load", lambda: build_model(torch, args.width, dtype, args.seed, device)
    )
    phases.append(row)
    row, x = run_phase(
        cuda, device, "inputs", lambda: make_input(torch, shape, dtype, args.seed, device)
    )
    phases.append(row)
    for name, repetition, count in pass_plan(args):
        operation = partial(forward_passes, torch, model, x, count)
        # [0]: the pass's output, alive for the end values, is dropped before the next phase.
        phases.append(run_phase(cuda, device, name, operation, repetition, count)[0])
    return model, x


def run_measurement(args: argparse.Namespace, document: dict) -> int:
    """The phases, then the library calibration and the predictions beside the counters."""
    torch = import_torch()
    check_gpu(torch, args.device, args.device_text)
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    torch.cuda.init()
    try:
        model, x = measure_phases(torch, args, device, document["phases"])
    except OutOfMemory as oom:
        document["status"] = RunStatus.OUT_OF_MEMORY
        document["failure"] = oom.failure()
        document["calibration"] = {
            "blocks": [],
            "error": "not run: the measurement ran out of memory",
        }
        add_predictions(document, [])
        document["summary"] = summarise(document)
        return EXIT_OOM
    document["status"] = RunStatus.COMPLETED
    document["calibration"] = calibrate_library_blocks(torch, device, model, x)
    reference = reference_timing(torch, model, x) if args.reference_timing else None
    add_predictions(document, document["calibration"]["blocks"])
    document["summary"] = summarise(document, reference)
    return EXIT_OK


def add_predictions(document: dict, library_blocks: list[dict]) -> None:
    """Put the predicted counters beside the measured ones in every completed phase row."""
    predicted = predict_phases(document["configuration"], library_blocks)
    for row, expected in zip(document["phases"], predicted, strict=False):
        row["predicted"] = {key: expected[key] for key in COUNTER_KEYS}
        row["harness_overhead_ns"] = row["wall_time_ns"] - row["event_time_ns"]


# from phase_protocol: peaks_summary, spread, prediction_summary


def summarise(document: dict, reference: dict | None = None) -> dict:
    phases = document["phases"]
    configuration = document["configuration"]
    warm = [row for row in phases if row["phase"] == "warm_forward"]
    model = (
        "pipeline allocator model (512-byte blocks, 2 MiB small segments, 20 MiB or "
        "2 MiB-rounded large segments, best fit, split rules) replaying the network's tensors "
        "and the calibrated library blocks"
    )
    summary = {
        **peaks_summary(phases),
        "warm_forward_median_event_time_ns": None,
        "warm_forward_median_wall_time_ns": None,
        "prediction": prediction_summary(document, model),
    }
    if not warm:
        return summary
    events = [r["event_time_ns"] for r in warm]
    summary["warm_forward_median_event_time_ns"] = statistics.median(events)
    summary["warm_forward_median_wall_time_ns"] = statistics.median(r["wall_time_ns"] for r in warm)
    tokens = configuration["batch"] * configuration["context"]
    flops = 2 * 2 * tokens * configuration["width"] * HIDDEN_FACTOR * configuration["width"]
    median_s = statistics.median(events) / 1e9
    gpu_name = document["environment"]["gpu"].get("name")
    peak = DATASHEET_TFLOPS.get(gpu_name, {}).get(configuration["dtype"])
    summary["timing"] = {
        "warm_forward_event_ns": spread(events),
        "warm_forward_wall_ns": spread([r["wall_time_ns"] for r in warm]),
        "harness_overhead_ns": {
            r["phase"] + (f"[{r['repetition']}]" if "repetition" in r else ""): r[
                "harness_overhead_ns"
            ]
            for r in phases
        },
        "reference": reference,
        "event_median_over_reference": (
            round(statistics.median(events) / reference["median_ns"], 4) if reference else None
        ),
        "forward_matmul_flops": flops,
        "achieved_tflops": round(flops / median_s / 1e12, 3) if median_s > 0 else None,
        "datasheet_dense_tflops": peak,
        "caveat": "matmul FLOPs of two Linear layers over the warm_forward event median; "
        "this small synthetic network is not a benchmark of the card",
    }
    return summary


# from environment_capture: environment_document


# from measure_flow: refuse_outputs, EnvironmentStart, write_measurement


def measure(args: argparse.Namespace) -> int:
    """With --environment-output, the environment is written first, by this same process:
    a pipeline then pays CUDA start-up once per run, and a run refused for want of PyTorch
    or a GPU still leaves its diagnostic behind."""
    output = Path(args.output)
    environment_output = Path(args.environment_output) if args.environment_output else None
    refuse_outputs({"--output": output, "--environment-output": environment_output})
    check_host_memory(args.width, args.dtype)
    environment = EnvironmentStart(args.device).record(args, environment_output)
    import_torch()  # the exit-2 guard, before the measurement is written
    document = {
        **document_head(MEASUREMENT_SCHEMA, TOOL, "running"),
        "environment": environment,
        "configuration": {
            "device": f"cuda:{args.device}",
            "batch": args.batch,
            "context": args.context,
            "width": args.width,
            "dtype": args.dtype,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "seed": args.seed,
            "reference_timing": args.reference_timing,
            "input_shape": [args.batch, args.context, args.width],
        },
        "synthetic_model": synthetic_model(args.width, args.dtype, args.seed),
        "clocks": CLOCKS,
        "counters": COUNTERS,
        "phase_scopes": PHASES_DOC,
        "phases": [],
    }
    exit_code = run_measurement(args, document)
    write_measurement(output, document)
    return exit_code


# ---------------------------------------------------------------- command line


def add_configuration(group) -> None:
    """The configuration options, with their defaults shown in --help."""
    what = {
        "batch": "inputs per pass",
        "context": "positions per input",
        "width": "the network's width (hidden layer: 4 x width)",
        "dtype": "weights and inputs",
        "warmup": "warm-up passes (one row)",
        "repeats": "timed passes (a row each)",
    }
    add_defaulted(group, CONFIGURATION_DEFAULTS, what, DTYPE_BYTES)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mesure_memoire.py",
        description="Estimate weight memory, record the environment, measure a synthetic MLP.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = commands.add_parser("estimate", help="weight memory from a parameter count, no GPU")
    p.add_argument("--parameters", type=positive_int)
    p.add_argument("--bits", type=positive_int, help="storage width per weight")
    p.add_argument("--reserve-gib", type=non_negative_decimal, default=Decimal(0))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    phases = p.add_argument_group("--phases: predict each phase's counters for measure")
    phases.add_argument("--phases", action="store_true", help="predict instead of --parameters")
    add_configuration(phases)
    phases.add_argument(
        "--library-block",
        type=library_block,
        action="append",
        default=[],
        metavar="LAYER:BYTES",
        help="a block the libraries keep, as measure's calibration reports it (e.g. 0:33554432)",
    )

    p = commands.add_parser("environment", help="record Python, PyTorch, GPU and driver")
    p.add_argument("--device", required=True, help="cuda or cuda:N")
    p.add_argument("--output", help="write JSON to this new file instead of stdout")

    p = commands.add_parser("measure", help="measure the synthetic network phase by phase")
    p.add_argument("--device", required=True, help="cuda or cuda:N (never the CPU)")
    add_configuration(p)
    p.add_argument("--seed", type=non_negative_int, default=0, help="weights' seed (default 0)")
    p.add_argument(
        "--reference-timing",
        action="store_true",
        help="also time the forward with torch.utils.benchmark.Timer (about 0.4 s more)",
    )
    p.add_argument("--output", required=True, help="a new JSON file (never overwritten)")
    p.add_argument(
        "--environment-output",
        help="also write the environment record to this new file, first",
    )
    return parser


def main(argv: list[str] | None = None, process_start: str = FRESH_INTERPRETER) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.process_start = process_start
        if args.command == "estimate" and args.phases:
            return print_phase_prediction(args)
        if args.command == "estimate":
            if args.parameters is None or args.bits is None:
                raise UsageError("estimate needs --parameters and --bits (or --phases)")
            result = estimate(args.parameters, args.bits, args.reserve_gib)
            if args.json:
                print(json.dumps(result, indent=2))
            else:
                print_estimate(result)
            return EXIT_OK
        args.device_text = args.device
        try:
            args.device = device_index(args.device)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"argument --device: {exc}") from None
        if args.command == "environment":
            output = Path(args.output) if args.output else None
            if output is not None:
                refuse_existing(output)
            environment = collect_environment(
                args.device, args.device_text, process_start=process_start
            )
            document = environment_document(environment)
            if output is None:
                print(json.dumps(document, indent=2, ensure_ascii=False))
            else:
                write_result(output, document)
                print(f"{output}: environment recorded")
            return EXIT_OK
        return measure(args)
    except UsageError as exc:
        print(f"mesure_memoire.py: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("mesure_memoire.py: interrupted: nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
