"""The decoder workload: a decoder-only language model's inference memory, measured and predicted.

    python -m pipeline.measuring.decoder presets
    python -m pipeline.measuring.decoder estimate --preset llama-3.1-8b --batch 8 --prompt 2048 \
        --new-tokens 128 --dtype bfloat16 [--calibration FILE] [--json]
    python -m pipeline.measuring.decoder measure --device cuda:0 --preset llama-3.1-8b --batch 8 \
        --prompt 2048 --new-tokens 128 --dtype bfloat16 --output m.json \
        [--environment-output e.json] [--calibration FILE]

The model (pipeline/workloads/decoder_model.py, PyTorch): token embedding, N blocks of
RMSNorm, rotary positions, grouped-query attention through scaled_dot_product_attention and
a SwiGLU MLP, a final norm and the LM head; random weights made on the GPU, nothing
downloaded. Greedy decoding with a preallocated KV cache of prompt + new-tokens positions.

`measure` follows the seed network's protocol phase by phase (phase_protocol.run_phase:
synchronise, baseline, peak reset, run, synchronise, end values, CUDA events and wall time) in
a fresh process, and writes the prediction beside every measured row. Both commands predict
as every workload is predicted (trace_prediction.py): the generation is traced on the meta
device through the very phase driver `measure` runs (measure_rows), as the target GPU's
PyTorch would choose its attention kernel, and the trace is replayed through the allocator
model with the blocks each kernel allocates besides its outputs. `estimate --gpu ID` takes
those blocks from the GPU's committed calibration (calibrations/), `measure` from probes of
each distinct call on the GPU it ran on. A prediction says "exact" only where every call is
covered; otherwise "approximate", with bounds for each peak, and what it does not know.

Exit codes: 0 ok; 2 bad input or missing prerequisite (nothing written); 3 the GPU ran out of
memory during `measure` (the file is written, status "out_of_memory").
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import traceback
from functools import partial
from pathlib import Path

from pipeline.core import (
    allocator_model,
    arguments,
    cli,
    environment_capture,
    measure_flow,
    phase_protocol,
    writers,
)
from pipeline.core.prediction_status import PredictionStatus
from pipeline.core.run_status import RunStatus
from pipeline.predicting import gpu_calibration, trace_prediction
from pipeline.workloads import own_model_facts
from pipeline.workloads.decoder_rules import (
    SCHEMA,
    first_position,
    planned_rows,
    row_plan,
    written_rows,
)
from pipeline.workloads.decoder_shape import (  # noqa: F401 (decoder.Shape, decoder.PRESETS... stay)
    BACKEND_NAMES,
    PRESETS,
    Shape,
    parameter_count,
    parameter_tensors,
)

TOOL = {"name": "decoder.py", "version": "2.0.0"}
DTYPE_BYTES = allocator_model.DTYPE_BYTES
COUNTER_KEYS = phase_protocol.COUNTER_KEYS
FIXED_PHASES = ("model_load", "inputs_and_cache", "prefill", "warmup")
RUN_DEFAULTS = {
    "batch": 1,
    "prompt": 16,
    "new_tokens": 8,
    "dtype": "bfloat16",
    "warmup": 1,
    "tokens_per_row": 1,
}
# The trace runs every decoder layer once per generated token (the prefill makes the first):
# layers x (new tokens + 1) layer passes, known from the configuration before any work, each
# 17 to 24 ms on a 2-core CPU (tests/benchmarks/decoder_by_trace.py prints them). An estimate
# past the budget is refused up front rather than left running for minutes. The default
# admits every committed configuration (at most 32 x 129: Llama-3.1-8B with 128 new tokens,
# 71 s); --estimate-budget raises it knowingly.
ESTIMATE_BUDGET = 5_000


# ---------------------------------------------------------------- shapes and presets


SHAPE_OPTIONS = ("layers", "width", "heads", "kv_heads", "ffn", "vocab")


def checked_shape(shape: Shape) -> Shape:
    """The constraints the model needs, each refused in one line naming the options."""
    if shape.heads % shape.kv_heads:
        raise cli.UsageError(
            f"--heads {shape.heads} is not a multiple of --kv-heads {shape.kv_heads}: "
            "each key/value head serves a whole group of query heads"
        )
    if shape.head_dim % 2:
        raise cli.UsageError(
            f"head dimension {shape.head_dim} is odd: rotary positions rotate pairs "
            "(give an even --head-dim, or --width / --heads even)"
        )
    return shape


def shape_from_args(args: argparse.Namespace) -> tuple[Shape, str | None]:
    """A preset, or all six shape options (and --head-dim when width / heads is not whole)."""
    given = [name for name in SHAPE_OPTIONS if getattr(args, name) is not None]
    extras = [f"--{n}" for n in ("head_dim",) if getattr(args, n) is not None]
    flags = [f"--{name.replace('_', '-')}" for name in given] + extras
    if args.tie_embeddings or args.qkv_bias:
        flags += ["--tie-embeddings"] * args.tie_embeddings + ["--qkv-bias"] * args.qkv_bias
    if args.preset is not None:
        if flags:
            raise cli.UsageError(f"--preset {args.preset} takes no shape options ({flags[0]})")
        return PRESETS[args.preset][0], args.preset
    missing = [f"--{name.replace('_', '-')}" for name in SHAPE_OPTIONS if name not in given]
    if missing:
        raise cli.UsageError(
            f"give --preset NAME or all of the shape options: missing {', '.join(missing)}"
        )
    head_dim = args.head_dim
    if head_dim is None:
        if args.width % args.heads:
            raise cli.UsageError(
                f"--width {args.width} is not a multiple of --heads {args.heads}: give --head-dim"
            )
        head_dim = args.width // args.heads
    names = (*SHAPE_OPTIONS, "tie_embeddings", "qkv_bias")
    return checked_shape(Shape(head_dim=head_dim, **{n: getattr(args, n) for n in names})), None


def cache_bytes_per_tensor(shape: Shape, batch: int, positions: int, dtype: str) -> int:
    return batch * shape.kv_heads * positions * shape.head_dim * DTYPE_BYTES[dtype]


# ---------------------------------------------------------------- documents


def layer_passes(shape: Shape, run: dict) -> int:
    """The layer passes the trace runs for this configuration (see ESTIMATE_BUDGET)."""
    return shape.layers * (run["new_tokens"] + 1)


def over_budget(shape: Shape, run: dict, budget: int | None = None) -> str | None:
    """Why the prediction of this configuration is refused, or None when it is within budget
    (by default ESTIMATE_BUDGET)."""
    budget = ESTIMATE_BUDGET if budget is None else budget
    size = layer_passes(shape, run)
    if size <= budget:
        return None
    return (
        f"the prediction would trace {size} layer passes ({shape.layers} layers x "
        f"({run['new_tokens']} new tokens + 1)), over the estimate budget of {budget} "
        "(--estimate-budget)"
    )


def run_configuration(args: argparse.Namespace) -> dict:
    run = {key: getattr(args, key) for key in RUN_DEFAULTS}
    if run["new_tokens"] < run["warmup"] + 1:
        raise cli.UsageError(
            f"--new-tokens {run['new_tokens']}: the prefill makes the first token and "
            f"--warmup {run['warmup']} decode step(s) the next ones: needs --new-tokens >= "
            f"{run['warmup'] + 1}"
        )
    return run


def describe_model(shape: Shape, preset: str | None, dtype: str, seed: int | None) -> dict:
    parameters = parameter_count(shape)
    return {
        "architecture": (
            "token embedding; per layer RMSNorm, q/k/v projections, rotary positions, "
            "grouped-query scaled_dot_product_attention over the KV cache, output projection, "
            "residual add, RMSNorm, SwiGLU MLP (gate, up, down), residual add; final RMSNorm; "
            "LM head on the last position"
        ),
        "source": PRESETS[preset][1] if preset else None,
        "parameters": parameters,
        "parameter_bytes": parameters * DTYPE_BYTES[dtype],
        "parameter_tensors": len(parameter_tensors(shape)),
        "lm_head": "tied to the embedding" if shape.tie_embeddings else "its own weight",
        "initialisation": (
            "torch.empty on the device in the measured dtype, filled in place from one seeded "
            "generator on that device: normal(0, 0.02), norms 1, biases 0; no host copy"
        ),
        "seed": seed,
        "execution": "torch.inference_mode(); greedy decoding (argmax); no sampling, batching "
        "across requests, paging, quantization or sharding",
    }


def describe_cache(shape: Shape, run: dict) -> dict:
    positions = run["prompt"] + run["new_tokens"]
    per_tensor = cache_bytes_per_tensor(shape, run["batch"], positions, run["dtype"])
    return {
        "strategy": "preallocated",
        "why": (
            "one K and one V tensor per layer made before the prefill and written in place: "
            "no growth, so no reallocation or copy per token and no fragmentation"
        ),
        "positions": positions,
        "layout": "(batch, kv_heads, positions, head_dim) per layer, for K and for V",
        "tensors": 2 * shape.layers,
        "bytes_per_tensor": per_tensor,
        "bytes": 2 * shape.layers * per_tensor,
    }


def configuration_record(shape: Shape, preset: str | None, run: dict, device, seed) -> dict:
    return {
        "device": device,
        "preset": preset,
        "shape": dataclasses.asdict(shape),
        **run,
        "seed": seed,
    }


PHASES_DOC = {
    "model_load": "every parameter made on the GPU and filled in place",
    "inputs_and_cache": "prompt token ids, the generated-token buffer, rotary tables, KV cache",
    "prefill": "the prompt in one pass (cold: first forward of the process); makes token 1",
    "warmup": (
        "the first decode step(s), one row: real tokens written to the cache, so warm-up has "
        "no memory effect that generation would not have; the decode kernels' first use "
        "(cuBLAS for one row, the attention kernel for one query) happens here"
    ),
    "decode": "one row per tokens_per_row generated tokens (one pass each), after warm-up",
}


def row_fields(run: dict) -> list[dict]:
    """What each row says besides its counters, in the order measure writes the rows."""
    rows = []
    for phase, repetition, tokens, passes, first in written_rows(run, planned_rows(run)):
        row = {"phase": phase} if repetition is None else {"phase": phase, "repetition": repetition}
        rows.append({**row, "passes": passes, "tokens": tokens, "first_position": first})
    return rows


def predicted(torch, shape: Shape, run: dict, gpu: str | None, say=None):
    """(trace, prediction, where the kernels' own blocks came from) without a GPU: traced on
    meta as the GPU of `gpu`'s committed calibration runs it, replayed with that calibration;
    without one, the meta device's own kernel choices and no kernel blocks (approximate)."""
    calibration, target, source = None, None, None
    if gpu is not None:
        calibration, facts = gpu_calibration.load(gpu)
        target, source = gpu_calibration.target(facts), calibration.source
    traced = trace(torch, shape, run, 0, target, say)
    if say is not None:
        say("predicting: replaying the trace")
    return traced, trace_prediction.predict(traced, calibration), source


def followed(traced) -> None:
    """The lab's own decoder is always traced; a stop is a defect of the lab, said so."""
    if traced.stopped is not None:
        raise RuntimeError(f"the trace did not follow the decoder: {traced.stopped}")


def predicted_document(
    shape: Shape, preset: str | None, run: dict, gpu: str | None, say=None
) -> dict:
    torch = environment_capture.import_torch()
    traced, prediction, source = predicted(torch, shape, run, gpu, say)
    record = trace_prediction.prediction_record(traced, prediction, source)
    rows = row_fields(run)
    for row, expected in zip(rows, record["phases"], strict=True):
        row["predicted"] = {key: expected[key] for key in COUNTER_KEYS}
    return {
        **writers.document_head(SCHEMA, TOOL, RunStatus.PREDICTED),
        "configuration": configuration_record(shape, preset, run, None, None),
        "model": describe_model(shape, preset, run["dtype"], None),
        "cache": describe_cache(shape, run),
        "counters": phase_protocol.COUNTERS,
        "phase_scopes": PHASES_DOC,
        "prediction": record,
        "phases": rows,
        "summary": {
            "phases": len(rows),
            "largest_peak_allocated_bytes": record["largest_peak_allocated_bytes"],
            "largest_peak_reserved_bytes": record["largest_peak_reserved_bytes"],
        },
    }


GIB = 2**30


def headline(document: dict) -> str:
    """The answer first: the largest peak reserved, and whether it is exact, where and why."""
    prediction = document["prediction"]
    peak = prediction["largest_peak_reserved_bytes"]
    said = f"peak reserved {peak / GIB:.2f} GiB ({peak:,} bytes)"
    source = prediction["calibration"]
    if source is None:
        return (
            f"{said}, approximate: no GPU calibration, so the kernels' own blocks are left out "
            f"(--gpu {' or --gpu '.join(sorted(gpu_calibration.KNOWN))} predicts for that GPU)"
        )
    if prediction["status"] == PredictionStatus.EXACT:
        return f"{said}, exact with {source}"
    ops = ", ".join(entry["op"] for entry in prediction["unknown"])
    return f"{said}, approximate with {source} ({ops} not known)"


def print_prediction(document: dict) -> None:
    model, cache, prediction = document["model"], document["cache"], document["prediction"]
    print(headline(document))
    print(f"parameters      {model['parameters']} ({model['parameter_bytes']} bytes)")
    print(f"KV cache        {cache['bytes']} bytes ({cache['positions']} positions)")
    print("predicted PyTorch allocator counters, bytes (baseline / end / peak)")
    rows = document["phases"]
    shown = [r for r in rows if r["phase"] != "decode"]
    decode = [r for r in rows if r["phase"] == "decode"]
    shown += decode[:1] + decode[-1:] if len(decode) > 1 else decode
    for row in shown:
        p = row["predicted"]
        name = row["phase"] + (f"[{row['repetition']}]" if "repetition" in row else "")
        print(
            f"{name:<17} allocated {p['baseline_allocated_bytes']:>14} "
            f"{p['allocated_bytes']:>14} {p['peak_allocated_bytes']:>14}   reserved "
            f"{p['baseline_reserved_bytes']:>14} {p['reserved_bytes']:>14} "
            f"{p['peak_reserved_bytes']:>14}"
        )
    if len(decode) > 2:
        print(f"({len(decode) - 2} decode rows between the two shown: --json lists them all)")
    if "bounds" in prediction:
        found = prediction["bounds"]["phases"]
        for key in trace_prediction.PEAK_KEYS:
            low = max(row[key]["lower"] for row in found)
            high = max(row[key]["upper"] for row in found)
            print(f"bounds          largest {key.replace('_bytes', '')}: {low:,} to {high:,} B")
    for entry in prediction["unknown"]:
        print(f"not known       {entry['op']} ({entry['calls']} calls): {entry['why']}")


# ---------------------------------------------------------------- measure (GPU)


def measure_rows(torch, shape: Shape, run: dict, seed: int, device, phases: list, phase=None):
    """Every phase with `phase` (phase_protocol.run_phase on the GPU, the default; a
    trace's Tracer.phase without one), each row appended as soon as it is read. Returns the
    state for the attention-backend question. Raises OutOfMemory at the phase that ran out."""
    from pipeline.workloads import decoder_model

    dtype = getattr(torch, run["dtype"])
    phase = phase or partial(phase_protocol.run_phase, torch.cuda, device)

    def note(row: dict, tokens: int, first: int) -> dict:
        row["tokens"] = tokens
        row["first_position"] = first_position(run, row["phase"], first)
        return row

    with torch.inference_mode():
        row, weights = phase(
            "model_load",
            lambda: decoder_model.make_weights(shape, dtype, device, seed),
            passes=0,
        )
        phases.append(note(row, 0, 0))
        row, state = phase(
            "inputs_and_cache",
            lambda: decoder_model.State(shape, run, dtype, device, seed),
            passes=0,
        )
        phases.append(note(row, 0, 0))
        holder: list = []
        for name, repetition, first, count in row_plan(run):
            if name == "prefill":

                def operation() -> None:
                    decoder_model.prefill(shape, weights, state, holder)

                passes = 1
            else:

                def operation(first=first, count=count) -> None:
                    decoder_model.decode(shape, weights, state, holder, first, count)

                passes = count
            row = phase(name, operation, repetition, passes)[0]
            phases.append(note(row, count, first))
    return state


def trace(torch, shape: Shape, run: dict, seed: int, target, say=None):
    """The decoder traced on the meta device as `target` (an attention_choice.TargetGpu) runs
    it, through the driver `measure` itself uses: what `estimate` and `measure` replay, and
    the calls a probe sweep probes for it."""

    def drive(phase) -> None:
        phase = cli.announced(phase, say)  # on a terminal, estimate's progress line
        measure_rows(torch, shape, run, seed, torch.device("meta"), [], phase=phase)

    traced = trace_prediction.run_trace(torch, "meta", drive, target=target)
    followed(traced)
    return traced


def add_predictions(document: dict, traced, prediction, source: str) -> None:
    """The predicted counters beside the measured ones in every row written, and the
    summary's verdict: how far, and whether an exact claim or the bounds held."""
    record = trace_prediction.prediction_record(traced, prediction, source)
    document["prediction"] = record
    for row, expected in zip(document["phases"], record["phases"], strict=False):
        row["predicted"] = {key: expected[key] for key in COUNTER_KEYS}
        row["harness_overhead_ns"] = row["wall_time_ns"] - row["event_time_ns"]
    document["summary"] = summarise(document)


def summarise(document: dict) -> dict:
    phases, run = document["phases"], document["configuration"]
    # the replay is of the native allocator with its default settings: anything else is said
    comparison = phase_protocol.prediction_summary(document)
    summary = {
        **phase_protocol.peaks_summary(phases),
        "prediction": {**comparison, **own_model_facts.verdict(document, comparison["by_counter"])},
        "timing": None,
    }
    prefill = [r for r in phases if r["phase"] == "prefill"]
    decode = [r for r in phases if r["phase"] == "decode"]
    if not prefill:
        return summary
    batch = run["batch"]

    def per_second(tokens: int, ns: int) -> float | None:
        return round(tokens * 1e9 / ns, 3) if ns > 0 else None

    decode_tokens = sum(r["tokens"] for r in decode)
    decode_event = sum(r["event_time_ns"] for r in decode)
    decode_wall = sum(r["wall_time_ns"] for r in decode)
    summary["timing"] = {
        "prefill_event_ns": prefill[0]["event_time_ns"],
        "prefill_wall_ns": prefill[0]["wall_time_ns"],
        "prefill_tokens_per_second": per_second(batch * run["prompt"], prefill[0]["event_time_ns"]),
        "prefill_tokens_per_second_wall": per_second(
            batch * run["prompt"], prefill[0]["wall_time_ns"]
        ),
        "decode_rows": len(decode),
        "decode_tokens_per_sequence": decode_tokens,
        "decode_event_ns": decode_event,
        "decode_wall_ns": decode_wall,
        "decode_tokens_per_second": per_second(batch * decode_tokens, decode_event),
        "decode_tokens_per_second_wall": per_second(batch * decode_tokens, decode_wall),
        "decode_row_event_ns": (
            phase_protocol.spread([r["event_time_ns"] for r in decode]) if decode else None
        ),
        "decode_row_harness_overhead_ns": (
            phase_protocol.spread([r["harness_overhead_ns"] for r in decode]) if decode else None
        ),
        "caveat": (
            "tokens per second count every sequence of the batch: prefill = batch x prompt "
            "over the prefill row, decode = batch x decode-row tokens over the decode rows "
            "(warm-up excluded); each row synchronises the GPU, so per-row rows cost the "
            "overlap of host and GPU between tokens (see tokens_per_row)"
        ),
    }
    return summary


def run_measurement(args, document: dict, shape: Shape, run: dict) -> int:
    """The phases on the GPU, traced first on meta as this GPU runs them; then, the protocol
    untouched, each distinct call of the trace probed here and the trace replayed with those
    probes (as own_model.py measure does)."""
    torch = environment_capture.import_torch()
    phase_protocol.check_gpu(torch, args.device, args.device_text)
    from pipeline.predicting import attention_choice

    traced = trace(torch, shape, run, args.seed, attention_choice.this_gpu(torch, args.device))
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    torch.cuda.init()
    code, state = cli.OK, None
    try:
        state = measure_rows(torch, shape, run, args.seed, device, document["phases"])
        document["status"] = RunStatus.COMPLETED
    except phase_protocol.OutOfMemory as oom:
        code = cli.OUT_OF_MEMORY
        document["status"] = RunStatus.OUT_OF_MEMORY
        document["failure"] = oom.failure()
    if state is not None:
        from pipeline.workloads import decoder_model

        with torch.inference_mode():
            document["measured_attention_backend"] = decoder_model.attention_backends(
                shape, state, run["batch"]
            )
        del state
    gc.collect()  # the run's tensors go before the probes need room
    try:
        calibration = trace_prediction.probe_operators(torch, device, traced)
        source = "this process"
    except Exception:  # the harness's own failure: said, and the measurement stands
        traceback.print_exc()
        print("decoder.py: the probes failed: predicted without them", file=sys.stderr)
        calibration, source = None, None
    add_predictions(document, traced, trace_prediction.predict(traced, calibration), source)
    return code


def new_measurement(shape: Shape, preset, run: dict, device: str, seed: int, environment) -> dict:
    """The measurement before its rows: what ran, on what, and what each field means."""
    return {
        **writers.document_head(SCHEMA, TOOL, "running"),
        "environment": environment,
        "configuration": configuration_record(shape, preset, run, device, seed),
        "model": describe_model(shape, preset, run["dtype"], seed),
        "cache": describe_cache(shape, run),
        "clocks": phase_protocol.CLOCKS,
        "counters": phase_protocol.COUNTERS,
        "phase_scopes": PHASES_DOC,
        "phases": [],
    }


def measure(args: argparse.Namespace, shape: Shape, preset: str | None, run: dict) -> int:
    """measure_flow's order, as every workload is measured."""
    output = Path(args.output)
    environment_output = Path(args.environment_output) if args.environment_output else None
    measure_flow.refuse_outputs({"--output": output, "--environment-output": environment_output})
    started = measure_flow.EnvironmentStart(args.device)
    environment = started.record(args, environment_output)
    environment_capture.import_torch()  # the exit-2 guard, before the measurement is written
    document = new_measurement(shape, preset, run, f"cuda:{args.device}", args.seed, environment)
    exit_code = run_measurement(args, document, shape, run)
    measure_flow.write_measurement(output, document)
    return exit_code


# ---------------------------------------------------------------- command line


def add_shape(parser) -> None:
    group = parser.add_argument_group("shape: --preset NAME, or all six of the shape options")
    group.add_argument("--preset", choices=sorted(PRESETS), help="a public model's shape")
    what = {
        "layers": "decoder blocks",
        "width": "hidden size",
        "heads": "query heads",
        "kv_heads": "key/value heads (a divisor of --heads)",
        "ffn": "MLP intermediate size",
        "vocab": "vocabulary size",
    }
    for name, text in what.items():
        option = "--" + name.replace("_", "-")
        group.add_argument(option, type=arguments.positive_int, help=text)
    group.add_argument(
        "--head-dim",
        type=arguments.positive_int,
        help="per-head size (default width / heads)",
    )
    group.add_argument("--tie-embeddings", action="store_true", help="LM head = embedding")
    group.add_argument("--qkv-bias", action="store_true", help="q, k, v projections with bias")


def add_run(parser) -> None:
    what = {
        "batch": "sequences generated together",
        "prompt": "prompt tokens per sequence",
        "new_tokens": "tokens generated per sequence (the prefill makes the first)",
        "dtype": "weights, activations and cache",
        "warmup": "decode steps in the warm-up row",
        "tokens_per_row": "generated tokens per decode row",
    }
    arguments.add_defaulted(parser, RUN_DEFAULTS, what, DTYPE_BYTES)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="decoder.py",
        description="Measure and predict a decoder-only language model's inference memory.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=cli.Parser)
    commands.add_parser("presets", help="the public shapes, their parameters and sources")
    p = commands.add_parser("estimate", help="predict every phase's counters, no GPU")
    add_shape(p)
    add_run(p)
    p.add_argument(
        "--gpu",
        choices=sorted(gpu_calibration.KNOWN),
        help="predict for this GPU model with its committed calibration",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_budget(p)
    p = commands.add_parser("measure", help="measure generation phase by phase on one GPU")
    p.add_argument("--device", required=True, help="cuda or cuda:N (never the CPU)")
    add_shape(p)
    add_run(p)
    p.add_argument(
        "--seed", type=arguments.non_negative_int, default=0, help="weights' seed (default 0)"
    )
    p.add_argument("--output", required=True, help="a new JSON file (never overwritten)")
    p.add_argument("--environment-output", help="also write the environment record, first")
    add_budget(p)
    return parser


def add_budget(parser) -> None:
    parser.add_argument(
        "--estimate-budget",
        type=arguments.positive_int,
        default=ESTIMATE_BUDGET,
        metavar="PASSES",
        help="the most layer passes, layers x (new tokens + 1), the prediction may trace "
        f"(default {ESTIMATE_BUDGET}: about 30 s on an idle 2-core CPU)",
    )


def print_presets() -> int:
    print(f"{'preset':<17} {'parameters':>14} {'bfloat16 bytes':>16}  source")
    for name, (shape, source) in PRESETS.items():
        count = parameter_count(shape)
        print(f"{name:<17} {count:>14} {count * 2:>16}  {source}")
    return cli.OK


def main(argv: list[str] | None = None, process_start: str = environment_capture.FRESH_INTERPRETER):
    def body() -> int:
        args = build_parser().parse_args(argv)
        if args.command == "presets":
            return print_presets()
        shape, preset = shape_from_args(args)
        run = run_configuration(args)
        if refused := over_budget(shape, run, args.estimate_budget):
            raise cli.UsageError(refused)
        if args.command == "estimate":
            say = cli.progress_line("decoder.py")
            document = predicted_document(shape, preset, run, args.gpu, say)
            if say is not None:
                say(None)
            if args.json:
                print(json.dumps(document, indent=2))
            else:
                print_prediction(document)
            return cli.OK
        args.process_start = process_start
        args.device_text = cli.device(args.device)
        args.device = arguments.device_index(args.device)
        return measure(args, shape, preset, run)

    return cli.run("decoder.py", body)


if __name__ == "__main__":
    raise SystemExit(main())
