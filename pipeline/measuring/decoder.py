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
a fresh process, and writes the prediction beside every measured row. `estimate` predicts
every counter of every phase with the standard library alone: Mirror replays the forward's
tensors through allocator_model.AllocatorModel, and the blocks that kernels allocate for
themselves (cuBLAS workspaces, attention and reduction buffers) come from a calibration file
measured on one GPU with one PyTorch, named in every prediction. Without one, or where the
calibration does not cover the run, the prediction says what it leaves out.

Exit codes: 0 ok; 2 bad input or missing prerequisite (nothing written); 3 the GPU ran out of
memory during `measure` (the file is written, status "out_of_memory").
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
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
from pipeline.core.run_status import RunStatus
from pipeline.workloads.decoder_rules import (  # noqa: F401 (decoder.SCHEMA, decoder.row_plan... stay)
    CALIBRATION_SCHEMA,
    SCHEMA,
    TEXT_TERMS,
    calibration_facts,
    first_position,
    row_plan,
)
from pipeline.workloads.decoder_shape import (  # noqa: F401 (decoder.Shape, decoder.PRESETS... stay)
    BACKEND_NAMES,
    PRESETS,
    Shape,
    parameter_count,
    parameter_tensors,
)

TOOL = {"name": "decoder.py", "version": "1.0.0"}
ROOT = Path(__file__).resolve().parents[2]
CALIBRATIONS = ROOT / "runs"  # committed calibrations: runs/<id>/decoder-calibration.json
DTYPE_BYTES = allocator_model.DTYPE_BYTES
TOKEN_BYTES = 8  # token ids are int64
STATISTIC_BYTES = 4  # the RMSNorm statistic is float32
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
# The prediction replays every decoder layer once per generated token (the prefill makes the
# first) and once more for the weights and the cache: layers x (new tokens + 1) layer passes,
# known from the configuration before any work. Its time and memory grow with that count
# (0.25 to 1 ms and 9 kB per pass for a preset on a 2-core CPU, more with thousands of
# layers: README gives the default's measured worst cases), so an
# estimate past the budget is refused up front rather than left running for minutes. The
# default admits every committed configuration (at most 32 x 129) and Llama-3.1-8B with up to
# 3,124 new tokens; --estimate-budget raises it knowingly.
ESTIMATE_BUDGET = 100_000
OPAQUE_BACKENDS = ("flash", "efficient", "cudnn")  # one output; their inner blocks: calibration


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
    shape = Shape(
        layers=args.layers,
        width=args.width,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=head_dim,
        ffn=args.ffn,
        vocab=args.vocab,
        tie_embeddings=args.tie_embeddings,
        qkv_bias=args.qkv_bias,
    )
    return checked_shape(shape), None


def cache_bytes_per_tensor(shape: Shape, batch: int, positions: int, dtype: str) -> int:
    return batch * shape.kv_heads * positions * shape.head_dim * DTYPE_BYTES[dtype]


# ---------------------------------------------------------------- calibration


class CalibrationError(cli.UsageError):
    """A calibration file the predictor cannot use: one line naming the file and the entry."""


def evaluate(formula, terms: dict, where: str) -> int:
    """A block size: an integer, a term's name, or {"product" | "sum" | "max" | "min":
    [formulas]}, {"ceil_div" | "floor_div" | "round_up": [a, b]}, {"floor_pow2": [a]} (the
    largest power of two not above a; 0 below 1: a kernel's split count)."""
    if isinstance(formula, int) and not isinstance(formula, bool):
        return formula
    if isinstance(formula, str):
        if not isinstance(terms.get(formula), int):
            numeric = sorted(k for k, v in terms.items() if isinstance(v, int))
            raise CalibrationError(f"{where}: unknown term {formula!r} (known: {numeric})")
        return terms[formula]
    if isinstance(formula, dict) and len(formula) == 1:
        ((operator, arguments),) = formula.items()
        if isinstance(arguments, list) and arguments:
            values = [evaluate(argument, terms, where) for argument in arguments]
            if operator in ("product", "sum", "max", "min"):
                return {"product": math.prod, "sum": sum, "max": max, "min": min}[operator](values)
            if operator in ("ceil_div", "round_up") and len(values) == 2 and values[1] > 0:
                quotient = -(-values[0] // values[1])
                return quotient if operator == "ceil_div" else quotient * values[1]
            if operator == "floor_div" and len(values) == 2 and values[1] > 0:
                return values[0] // values[1]
            if operator == "floor_pow2" and len(values) == 1:
                return 1 << (values[0].bit_length() - 1) if values[0] >= 1 else 0
    raise CalibrationError(f"{where}: not a formula: {json.dumps(formula)}")


def matches(when: dict, terms: dict, where: str) -> bool:
    """Every condition holds: a value, a list of values, or {"min": a, "max": b}."""
    for key, wanted in when.items():
        if key not in terms:
            raise CalibrationError(f"{where}: unknown term {key!r} in 'when'")
        value = terms[key]
        if isinstance(wanted, list):
            held = value in wanted
        elif isinstance(wanted, dict):
            held = wanted.get("min", value) <= value <= wanted.get("max", value)
        else:
            held = value == wanted
        if not held:
            return False
    return True


class Calibration:
    """Kernel-internal blocks per site, from a file measured on one GPU with one PyTorch."""

    def __init__(self, document: dict, name: str, sha256: str | None = None):
        if not isinstance(document, dict) or document.get("schema") != CALIBRATION_SCHEMA:
            raise CalibrationError(f"{name}: not a decoder calibration ({CALIBRATION_SCHEMA})")
        self.document = document
        self.name = name
        self.sha256 = sha256
        self.gpu = document.get("gpu", {})
        self.sites = document.get("sites", [])
        self.backends = document.get("attention_backends", [])
        self.covers = document.get("covers", {})

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """A calibration that validates as validate.py validates it: its schema and its facts
        (one line, exit 2, otherwise)."""
        from pipeline.artefacts import validate  # jsonschema: only when a file is loaded

        read = validate.checked(path, (CALIBRATION_SCHEMA,), "a decoder calibration")
        return cls(read.document, recorded_path(path), hashlib.sha256(read.data).hexdigest())

    def record(self) -> dict:
        return {
            "file": self.name,
            "sha256": self.sha256,
            "gpu": self.gpu.get("name"),
            "torch": self.document.get("torch"),
            "source": self.document.get("source"),
        }

    def uncovered(self, terms: dict) -> list[str]:
        """The conditions of `covers` (what the calibration was measured on) this run misses."""
        return [
            f"{key} {terms.get(key)!r} (measured: {json.dumps(wanted)})"
            for key, wanted in self.covers.items()
            if not matches({key: wanted}, terms, f"{self.name}: covers")
        ]

    def backend(self, terms: dict) -> str | None:
        for i, entry in enumerate(self.backends):
            if matches(entry.get("when", {}), terms, f"{self.name}: attention_backends[{i}]"):
                return entry["backend"]
        return None

    def blocks(self, site: str, terms: dict) -> list[dict]:
        """The blocks of every entry for this site whose conditions hold, in file order."""
        found = []
        for i, entry in enumerate(self.sites):
            where = f"{self.name}: sites[{i}] ({entry.get('site')})"
            if entry.get("site") == site and matches(entry.get("when", {}), terms, where):
                for j, block in enumerate(entry.get("blocks", [])):
                    found.append({**block, "where": f"{where}.blocks[{j}]", "key": (i, j)})
        return found


def recorded_path(path: Path) -> str:
    """A path as files may record it: relative to the repository, else the file name only
    (never a home folder or a user name)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def find_calibration(gpu_name: str | None, torch_version: str | None) -> Calibration | None:
    """The newest committed calibration for this GPU model and PyTorch version, if any (run
    folders are named by time: a later one replaces an earlier one)."""
    for path in sorted(CALIBRATIONS.glob("*/decoder-calibration.json"), reverse=True):
        calibration = Calibration.load(path)
        if calibration.gpu.get("name") == gpu_name and (
            calibration.document.get("torch") == torch_version
        ):
            return calibration
    return None


# ---------------------------------------------------------------- prediction (no torch)


class Tensor:
    """What the mirror knows of a tensor: its bytes, where it was made, its allocator block."""

    __slots__ = ("block", "ident", "nbytes", "site")

    def __init__(self, ident: int, nbytes: int, site: str, block):
        self.ident, self.nbytes, self.site, self.block = ident, nbytes, site, block


def default_backend(dtype: str, head_dim: int) -> str:
    """The guess when no calibration names the kernel: flash for half types (head dimensions
    up to 256), math for float32 (flash takes half types only; the memory-efficient kernel
    has no grouped-query attention).

    The kernel is a property of one GPU model and one PyTorch, so the calibration file says
    it (`attention_backends`, first match wins). The committed H200 / torch 2.11.0+cu130 one
    (runs/20261203T080000Z-decoder-calibration) states the rule inferred from the measured
    choices of the traced configurations (runs/20261203T070900Z-decoder-trace): cuDNN for
    bfloat16 and float16, in the prefill and in decode (gqa4-b2-p33, gqa3-w384-b1-p100,
    gqa4-v128256-b4-p300, mha-bias-tied-b1-p16, and every decode step), except flash where
    the keys are one position long, which only a one-token prompt's prefill has (gqa8-b3-p1).
    `measure` asks PyTorch's chooser which kernel ran and marks the prediction inexact when
    it is not the one assumed."""
    return "flash" if dtype != "float32" and head_dim <= 256 else "math"


class Mirror:
    """decoder_model's generation replayed as allocations and frees, one method per function
    there and in the same order, through allocator_model.AllocatorModel.

    `events` lists every step: ("alloc", ident, bytes, site) and ("free", ident, bytes, site).
    Blocks that kernels allocate for themselves come from the calibration, at the site that
    makes them; without one they are left out and `not_predicted` says so.

    `dispatch_trace=True` replays what a run under a TorchDispatchMode does instead of a real
    run, for the CPU test: under any dispatch mode the math attention adds its causal mask out
    of place (isTensorSubclassLike is true), one more block than a real run."""

    def __init__(self, shape: Shape, run: dict, calibration: Calibration | None = None):
        self.shape, self.run, self.calibration = shape, run, calibration
        self.size = DTYPE_BYTES[run["dtype"]]
        self.allocator = allocator_model.AllocatorModel()
        self.events: list[tuple] = []
        self.kept: list[Tensor] = []  # process-lifetime library blocks
        self.done_once: set = set()
        self.next_ident = 0
        self.dispatch_trace = False
        self.not_predicted: dict[str, str] = {}
        self.backends: dict[str, str] = {}  # prefill / decode -> the kernel assumed
        self.generating = "prefill"  # which of the two the current forward is
        self.call_terms: dict[int, dict] = {}  # an operator's output -> the terms of its call
        if calibration is not None:
            uncovered = calibration.uncovered(self.terms())
            if uncovered:
                self.not_predicted["calibration coverage"] = (
                    f"{calibration.name} was measured for other runs: {', '.join(uncovered)}; "
                    "its blocks are applied unverified"
                )

    # -------------------------------------------------- allocations

    def alloc(self, nbytes: int, site: str) -> Tensor | None:
        if nbytes == 0:
            return None  # an empty tensor takes no block
        self.next_ident += 1
        tensor = Tensor(self.next_ident, nbytes, site, self.allocator.malloc(nbytes))
        self.events.append(("alloc", tensor.ident, nbytes, site))
        return tensor

    def free(self, *tensors: Tensor | None) -> None:
        for tensor in tensors:
            if tensor is not None:
                self.allocator.free(tensor.block)
                self.events.append(("free", tensor.ident, tensor.nbytes, tensor.site))

    def terms(self, **site_terms) -> dict:
        """Everything a calibration formula or condition may name at a site."""
        shape, run = self.shape, self.run
        terms = {
            "batch": run["batch"],
            "prompt": run["prompt"],
            "new_tokens": run["new_tokens"],
            "positions": run["prompt"] + run["new_tokens"],
            "layers": shape.layers,
            "width": shape.width,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "ffn": shape.ffn,
            "vocab": shape.vocab,
            "dtype": run["dtype"],
            "dtype_bytes": self.size,
        }
        if self.calibration is not None and "multiprocessors" in self.calibration.gpu:
            terms["multiprocessors"] = self.calibration.gpu["multiprocessors"]
        terms.update(site_terms)
        return terms

    def op(self, site: str, output_bytes: int, **site_terms) -> Tensor | None:
        """One operator: its calibrated inner blocks before the output, the output, the blocks
        after it; blocks freed before the output go first, the rest when the operator returns,
        process-lifetime blocks (library workspaces, made once) stay."""
        terms = self.terms(**site_terms)
        if self.calibration is None:
            self.not_predicted.setdefault(
                "kernel-internal blocks",
                "no calibration for this GPU and PyTorch: cuBLAS workspaces, attention and "
                "reduction buffers are left out (each is at least 512 bytes, cuBLAS's "
                "workspaces tens of MiB)",
            )
            return self.output(output_bytes, site, terms)
        blocks = []
        for block in self.calibration.blocks(site, terms):
            if block.get("once") and block["key"] in self.done_once:
                continue
            self.done_once.add(block["key"])
            blocks.append(block)
            if block.get("exact") is False:
                self.not_predicted.setdefault(
                    f"{site}:{block.get('name', 'block')}",
                    block.get("note", "the calibration marks this block's size inexact"),
                )
        made: dict[str, list] = {"before_output": [], "on_return": [], "never": []}
        for block in (b for b in blocks if b.get("order", "after_output") == "before_output"):
            self.make_block(site, block, terms, made)
        for tensor in made["before_output"]:
            self.free(tensor)
        output = self.output(output_bytes, site, terms)
        for block in (b for b in blocks if b.get("order", "after_output") == "after_output"):
            self.make_block(site, block, terms, made)
        self.free(*reversed(made["on_return"]))
        self.kept += made["never"]
        return output

    def output(self, nbytes: int, site: str, terms: dict) -> Tensor | None:
        tensor = self.alloc(nbytes, site)
        if tensor is not None:
            self.call_terms[tensor.ident] = terms
        return tensor

    def make_block(self, site: str, block: dict, terms: dict, made: dict) -> None:
        nbytes = evaluate(block.get("bytes"), terms, block["where"])
        freed = block.get("freed", "on_return")
        if freed not in made or (freed == "before_output" and block.get("order") != freed):
            raise CalibrationError(f"{block['where']}: 'freed' {freed!r} cannot hold here")
        made[freed].append(self.alloc(nbytes, f"{site}:{block.get('name', 'block')}"))

    # -------------------------------------------------- weights and state

    def make_weights(self) -> list[Tensor | None]:
        return [
            self.alloc(math.prod(dims) * self.size, "parameter")
            for _, dims, _ in parameter_tensors(self.shape)
        ]

    def inputs_and_cache(self) -> list[Tensor | None]:
        """decoder_model.State: prompt, generated tokens, rotary tables, then K and V per layer."""
        shape, run = self.shape, self.run
        positions = run["prompt"] + run["new_tokens"]
        made = [
            self.alloc(run["batch"] * run["prompt"] * TOKEN_BYTES, "prompt"),
            self.alloc(run["batch"] * run["new_tokens"] * TOKEN_BYTES, "generated"),
            self.alloc(positions * (shape.head_dim // 2) * self.size, "rope_cos"),
            self.alloc(positions * (shape.head_dim // 2) * self.size, "rope_sin"),
        ]
        per_tensor = cache_bytes_per_tensor(shape, run["batch"], positions, run["dtype"])
        for _ in range(shape.layers):
            made += [self.alloc(per_tensor, "kv_cache"), self.alloc(per_tensor, "kv_cache")]
        return made

    # -------------------------------------------------- the forward

    def rms_norm(self, rows: int) -> Tensor | None:
        inverse = self.op("norm_statistic", rows * STATISTIC_BYTES, rows=rows)
        out = self.alloc(rows * self.shape.width * self.size, "norm_output")
        self.free(inverse)
        return out

    def linear(self, rows: int, features: int, bias: bool = False) -> Tensor | None:
        return self.op(
            "linear", rows * features * self.size, rows=rows, features=features, bias=int(bias)
        )

    def attention(self, tokens: int, keys: int) -> tuple[Tensor | None, str]:
        b, s = self.run["batch"], self.size
        heads, head_dim = self.shape.heads, self.shape.head_dim
        call = self.attention_call(tokens, keys)
        backend = self.backend(call)
        self.backends.setdefault(self.generating, backend)
        if backend == "math":
            return self.math_attention(tokens, keys), backend
        if head_dim % 8:
            self.not_predicted.setdefault(
                "attention padding",
                f"head dimension {head_dim} is not a multiple of 8: scaled_dot_product_attention "
                "pads query, keys and values for the flash kernel at every call; those copies "
                "are not modelled",
            )
        if backend not in OPAQUE_BACKENDS:
            raise CalibrationError(f"attention backend {backend!r} is not one this mirror knows")
        output = self.op("attention", b * tokens * heads * head_dim * s, **call, backend=backend)
        return output, backend

    def attention_call(self, tokens: int, keys: int) -> dict:
        """The terms of one attention call, the kernel's choice and its blocks depend on."""
        return {
            "query_length": tokens,
            "key_length": keys,
            "causal": int(tokens > 1),
            "groups": self.shape.heads // self.shape.kv_heads,
            "kv_rows": self.run["batch"] * self.shape.kv_heads,  # one key head of one sequence
        }

    def backend(self, call: dict) -> str:
        """The calibration's kernel for this call (its terms: the run's and the call's)."""
        if self.calibration is not None:
            chosen = self.calibration.backend(self.terms(**call))
            if chosen is not None:
                return chosen
        return default_backend(self.run["dtype"], self.shape.head_dim)

    def math_attention(self, tokens: int, keys: int) -> Tensor | None:
        """at::_scaled_dot_product_attention_math, operator by operator: the scaled query,
        the causal mask (ones, tril, two scalars, where), K and V repeated per group, the
        scaled keys, a contiguous copy of the query where matmul cannot fold it, the
        scores, the softmax and the values."""
        b, s, heads = self.run["batch"], self.size, self.shape.heads
        head_dim, grouped = self.shape.head_dim, self.shape.heads != self.shape.kv_heads
        terms = {"query_length": tokens, "key_length": keys, "causal": int(tokens > 1)}
        terms["backend"] = "math"
        query = self.op("math.scale_query", b * heads * tokens * head_dim * s, **terms)
        mask = None
        if tokens > 1:
            ones = self.op("math.mask_ones", tokens * keys, **terms)
            tril = self.op("math.mask_tril", tokens * keys, **terms)
            self.free(ones)
            zero = self.op("math.mask_scalar", s, **terms)
            minus_infinity = self.op("math.mask_scalar", s, **terms)
            mask = self.op("math.mask_where", tokens * keys * s, **terms)
            self.free(zero, minus_infinity, tril)
        repeated = []
        if grouped:
            for site in ("math.repeat_keys", "math.repeat_values"):
                repeated.append(self.op(site, b * heads * keys * head_dim * s, **terms))
        scaled_keys = self.op("math.scale_keys", b * heads * keys * head_dim * s, **terms)
        # matmul folds (batch, heads) into one dimension: a view, except for the scaled
        # query, which keeps the (batch, tokens, heads) order the model made it in.
        folded = None
        if b > 1 and heads > 1 and tokens > 1:
            folded = self.op("math.fold_query", b * heads * tokens * head_dim * s, **terms)
        scores = self.op("math.scores", b * heads * tokens * keys * s, **terms)
        self.free(folded, scaled_keys)
        if mask is not None and self.dispatch_trace:
            masked = self.op("math.mask_add", b * heads * tokens * keys * s, **terms)
            self.free(scores)
            scores = masked
        weights = self.op("math.softmax", b * heads * tokens * keys * s, **terms)
        self.free(scores)
        out = self.op("math.values", b * heads * tokens * head_dim * s, **terms)
        self.free(*repeated, query, mask, weights)
        return out

    def block(self, tokens: int, position: int) -> None:
        """decoder_model.block: the residual stream is updated in place (no allocation)."""
        shape, rows = self.shape, self.run["batch"] * tokens
        q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        x = self.rms_norm(rows)
        q = self.linear(rows, q_out, shape.qkv_bias)
        k = self.linear(rows, kv_out, shape.qkv_bias)
        v = self.linear(rows, kv_out, shape.qkv_bias)
        self.free(x)
        query = self.alloc(rows * q_out * self.size, "rotary_query")
        self.free(q)
        self.free(k)  # rotated straight into the K cache
        self.free(v)  # copied into the V cache
        attention, backend = self.attention(tokens, position + tokens)
        self.free(query)
        merged = attention  # a view, unless the kernel wrote (batch, heads, tokens, head_dim)
        if backend == "math" and tokens > 1 and shape.heads > 1:
            merged = self.alloc(rows * q_out * self.size, "attention_merge")
            self.free(attention)
        o = self.linear(rows, shape.width)
        self.free(merged)
        self.free(o)
        x = self.rms_norm(rows)
        gate = self.linear(rows, shape.ffn)
        up = self.linear(rows, shape.ffn)
        self.free(x)
        self.free(up)
        down = self.linear(rows, shape.width)
        self.free(gate)
        self.free(down)

    def forward(self, tokens: int, position: int) -> Tensor | None:
        b = self.run["batch"]
        h = self.op("embedding", b * tokens * self.shape.width * self.size, rows=b * tokens)
        for _ in range(self.shape.layers):
            self.block(tokens, position)
        x = self.rms_norm(b)
        self.free(h)
        logits = self.linear(b, self.shape.vocab)
        self.free(x)
        token = self.op("argmax", b * TOKEN_BYTES, rows=b, features=self.shape.vocab)
        self.free(logits)
        return token

    # -------------------------------------------------- generation

    def prefill(self, holder: list) -> None:
        self.generating = "prefill"  # a one-token prompt's prefill is not a decode step
        holder.append(self.forward(self.run["prompt"], 0))

    def decode(self, holder: list, first: int, count: int) -> None:
        self.generating = "decode"
        token = holder.pop()
        for index in range(first, first + count):
            following = self.forward(1, self.run["prompt"] + index - 1)
            self.free(token)
            token = following
        holder.append(token)


def predict(shape: Shape, run: dict, calibration: Calibration | None = None, dispatch=False):
    """Every phase's counters, in the order `measure` writes its rows; returns the mirror too
    (its events, what it left out, the attention backends it assumed)."""
    mirror = Mirror(shape, run, calibration)
    mirror.dispatch_trace = dispatch
    allocator, rows, holder = mirror.allocator, [], []

    def record(phase: str, repetition, first: int, tokens: int, passes: int, steps) -> None:
        row: dict = {"phase": phase}
        if repetition is not None:
            row["repetition"] = repetition
        row.update(passes=passes, tokens=tokens, first_position=first_position(run, phase, first))
        row.update({f"baseline_{k}": v for k, v in allocator.counters().items()})
        allocator.reset_peaks()
        mirror.events.append(("phase", phase, repetition))
        steps()
        row.update(allocator.counters())
        row["peak_allocated_bytes"] = allocator.peak_allocated
        row["peak_reserved_bytes"] = allocator.peak_reserved
        rows.append(row)

    record("model_load", None, 0, 0, 0, mirror.make_weights)
    record("inputs_and_cache", None, 0, 0, 0, mirror.inputs_and_cache)
    for phase, repetition, first, count in row_plan(run):
        if phase == "prefill":
            record(phase, None, first, count, 1, lambda: mirror.prefill(holder))
        else:

            def steps(first=first, count=count) -> None:
                mirror.decode(holder, first, count)

            record(phase, repetition, first, count, count, steps)
    return rows, mirror


def prediction_record(mirror: Mirror) -> dict:
    """What every file says of its prediction: the calibration, the assumptions, the gaps."""
    return {
        "model": (
            "decoder.Mirror replays the forward's tensors (operator outputs, in the model's "
            "order) and the calibration's kernel-internal blocks through the pipeline's "
            "allocator model (512-byte blocks, 2 MiB small segments, 20 MiB or 2 MiB-rounded "
            "large segments, best fit, split rules)"
        ),
        "calibration": None if mirror.calibration is None else mirror.calibration.record(),
        "attention_backend": dict(mirror.backends),
        "exact": not mirror.not_predicted,
        "not_predicted": [
            {"what": what, "why": why} for what, why in sorted(mirror.not_predicted.items())
        ],
        "assumes": (
            "PyTorch's native caching allocator with default settings, one stream, and a GPU "
            "that never refuses a segment (near the memory limit the allocator frees cached "
            "blocks and retries, which this model does not replay)"
        ),
    }


def comparable(events, block: int = 1) -> list[tuple]:
    """Events as two traces can be compared: each allocation by its size (rounded up to
    `block` bytes), each free by the ordinal of the allocation it frees ("earlier" for one
    made before the events began), a run of consecutive frees as one sorted group: their
    order does not change the allocator's state. Phase marks are dropped."""
    ordinal: dict = {}
    out: list[tuple] = []
    for event in events:
        if event[0] == "alloc":
            ordinal[event[1]] = len(ordinal)
            out.append(("alloc", max(block, -(-event[2] // block) * block)))
        elif event[0] == "free":
            freed = ordinal.get(event[1], "earlier")
            if out and out[-1][0] == "free":
                out[-1] = ("free", tuple(sorted((*out[-1][1], freed), key=str)))
            else:
                out.append(("free", (freed,)))
    return out


def first_mismatch(left: list[tuple], right: list[tuple]) -> int | None:
    """The index of the first differing step of two comparable() lists, or None."""
    for i, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return i
    return None if len(left) == len(right) else min(len(left), len(right))


# ---------------------------------------------------------------- documents


def replay_size(shape: Shape, run: dict) -> int:
    """The layer passes predict() replays for this configuration (see ESTIMATE_BUDGET)."""
    return shape.layers * (run["new_tokens"] + 1)


def over_budget(shape: Shape, run: dict, budget: int | None = None) -> str | None:
    """Why the prediction of this configuration is refused, or None when it is within budget
    (by default ESTIMATE_BUDGET)."""
    budget = ESTIMATE_BUDGET if budget is None else budget
    size = replay_size(shape, run)
    if size <= budget:
        return None
    return (
        f"the prediction would replay {size} layer passes ({shape.layers} layers x "
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


def predicted_document(shape: Shape, preset: str | None, run: dict, calibration) -> dict:
    rows, mirror = predict(shape, run, calibration)
    return {
        "schema": SCHEMA,
        "tool": TOOL,
        "created_utc": writers.utc_now(),
        "status": RunStatus.PREDICTED,
        "configuration": configuration_record(shape, preset, run, None, None),
        "model": describe_model(shape, preset, run["dtype"], None),
        "cache": describe_cache(shape, run),
        "counters": phase_protocol.COUNTERS,
        "phase_scopes": PHASES_DOC,
        "prediction": prediction_record(mirror),
        "phases": [
            {
                **{k: row[k] for k in row if k not in COUNTER_KEYS},
                "predicted": {k: row[k] for k in COUNTER_KEYS},
            }
            for row in rows
        ],
        "summary": {
            "phases": len(rows),
            "largest_peak_allocated_bytes": max(r["peak_allocated_bytes"] for r in rows),
            "largest_peak_reserved_bytes": max(r["peak_reserved_bytes"] for r in rows),
        },
    }


GIB = 2**30


def headline(document: dict) -> str:
    """The answer first: the largest peak reserved, and whether it is exact, where and why."""
    peak = document["summary"]["largest_peak_reserved_bytes"]
    prediction = document["prediction"]
    calibration = prediction["calibration"]
    said = f"peak reserved {peak / GIB:.2f} GiB ({peak:,} bytes)"
    if prediction["exact"] and calibration:
        return (
            f"{said}, exact on {calibration['gpu']} with PyTorch {calibration['torch']} "
            f"and calibration {calibration['file']}"
        )
    if calibration:
        gaps = "; ".join(gap["what"] for gap in prediction["not_predicted"])
        return f"{said}, approximate on {calibration['gpu']} ({gaps} not predicted)"
    return (
        f"{said}, approximate: no calibration, so kernel-internal blocks are left out "
        f"(--gpu {' or --gpu '.join(committed_gpus()) or 'ID'} or --calibration FILE for an "
        "exact one)"
    )


def committed_calibrations() -> dict[str, Path]:
    """The newest committed decoder calibration of each GPU model, by --gpu id: the model
    name's last word in lower case (NVIDIA H200: h200)."""
    found: dict[str, Path] = {}
    for path in sorted(CALIBRATIONS.glob("*/decoder-calibration.json"), reverse=True):
        try:
            name = json.loads(path.read_bytes()).get("gpu", {}).get("name")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(name, str) and name.split():
            found.setdefault(name.split()[-1].lower(), path)
    return found


def committed_gpus() -> list[str]:
    return sorted(committed_calibrations())


def existing_calibration(path: Path) -> Path:
    """--calibration FILE, which must be there: one plain line if not, never [Errno 2]."""
    if not path.is_file():
        why = "a folder, not a file" if path.is_dir() else "no such file"
        raise cli.UsageError(f"argument --calibration: {path}: {why}")
    return path


def calibration_for_gpu(gpu: str) -> Path:
    """--gpu ID: the committed calibration of that GPU model, or one line naming those there are."""
    found = committed_calibrations()
    if gpu.lower() not in found:
        known = ", ".join(sorted(found)) or "none"
        raise cli.UsageError(
            f"argument --gpu: no committed decoder calibration for {gpu!r} (committed: {known}); "
            "--calibration FILE names another"
        )
    return found[gpu.lower()]


def print_prediction(document: dict) -> None:
    model, cache, prediction = document["model"], document["cache"], document["prediction"]
    print(headline(document))
    print(f"parameters      {model['parameters']} ({model['parameter_bytes']} bytes)")
    print(f"KV cache        {cache['bytes']} bytes ({cache['positions']} positions)")
    print(f"attention       {prediction['attention_backend']}")
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
    calibration = prediction["calibration"]
    print(f"calibration     {calibration['file'] if calibration else 'none'}")
    for gap in prediction["not_predicted"]:
        print(f"not predicted   {gap['what']}: {gap['why']}")


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


def trace(torch, shape: Shape, run: dict, seed: int, target):
    """The decoder traced on the meta device as `target` (an attention_choice.TargetGpu) runs
    it, through the driver `measure` itself uses: the trace's prediction of a decoder run
    (tests/benchmarks/decoder_by_trace.py) and the calls a probe sweep probes for it."""
    from pipeline.predicting import trace_prediction

    def drive(phase) -> None:
        measure_rows(torch, shape, run, seed, torch.device("meta"), [], phase=phase)

    return trace_prediction.run_trace(torch, "meta", drive, target=target)


def add_predictions(document: dict, shape: Shape, run: dict, calibration) -> None:
    """The predicted counters beside the measured ones in every row written."""
    rows, mirror = predict(shape, run, calibration)
    for row, expected in zip(document["phases"], rows, strict=False):
        row["predicted"] = {key: expected[key] for key in COUNTER_KEYS}
        row["harness_overhead_ns"] = row["wall_time_ns"] - row["event_time_ns"]
    document["prediction"] = prediction_record(mirror)
    measured = document.get("measured_attention_backend")
    if measured:
        for kind, backend in measured.items():
            assumed = document["prediction"]["attention_backend"].get(kind)
            if assumed is not None and assumed != backend:
                document["prediction"]["exact"] = False
                document["prediction"]["not_predicted"].append(
                    {
                        "what": f"{kind} attention",
                        "why": f"PyTorch ran {backend}; the prediction assumed {assumed}",
                    }
                )


def summarise(document: dict) -> dict:
    phases, run = document["phases"], document["configuration"]
    summary = {
        **phase_protocol.peaks_summary(phases),
        # the mirror replays the native allocator with its default settings: anything else is said
        "prediction": phase_protocol.prediction_summary(document),
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
    torch = environment_capture.import_torch()
    phase_protocol.check_gpu(torch, args.device, args.device_text)
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    torch.cuda.init()
    calibration = args.calibration
    if calibration is None:
        environment = document["environment"]
        calibration = find_calibration(
            environment["gpu"].get("name"), environment["torch"].get("version")
        )
    try:
        state = measure_rows(torch, shape, run, args.seed, device, document["phases"])
    except phase_protocol.OutOfMemory as oom:
        document["status"] = RunStatus.OUT_OF_MEMORY
        document["failure"] = {
            "phase": oom.row["phase"],
            "repetition": oom.row.get("repetition"),
            "error": phase_protocol.oom_summary(str(oom)),
            "counters_after_failure": {k: v for k, v in oom.row.items() if k.endswith("_bytes")},
        }
        add_predictions(document, shape, run, calibration)
        document["summary"] = summarise(document)
        return cli.OUT_OF_MEMORY
    from pipeline.workloads import decoder_model

    document["status"] = RunStatus.COMPLETED
    with torch.inference_mode():
        document["measured_attention_backend"] = decoder_model.attention_backends(
            shape, state, run["batch"]
        )
    add_predictions(document, shape, run, calibration)
    document["summary"] = summarise(document)
    return cli.OK


def new_measurement(shape: Shape, preset, run: dict, device: str, seed: int, environment) -> dict:
    """The measurement before its rows: what ran, on what, and what each field means."""
    return {
        "schema": SCHEMA,
        "tool": TOOL,
        "created_utc": writers.utc_now(),
        "status": "running",
        "environment": environment,
        "configuration": configuration_record(shape, preset, run, device, seed),
        "model": describe_model(shape, preset, run["dtype"], seed),
        "cache": describe_cache(shape, run),
        "clocks": phase_protocol.CLOCKS,
        "counters": phase_protocol.COUNTERS,
        "phase_scopes": PHASES_DOC,
        "phases": [],
    }


def refuse_foreign_calibration(calibration: Calibration, environment: dict) -> None:
    """A calibration given by name must have been measured on this GPU model with this
    PyTorch: another's kernels allocate other blocks. Refused before anything is written."""
    ran = (environment["gpu"].get("name"), environment["torch"].get("version"))
    made = (calibration.gpu.get("name"), calibration.document.get("torch"))
    if ran != made:
        raise cli.UsageError(
            f"--calibration {calibration.name} was measured on {made[0]} with torch {made[1]}; "
            f"this run is on {ran[0]} with torch {ran[1]}: give a calibration of this GPU and "
            "PyTorch, or none (the newest committed one that matches is then used)"
        )


def measure(args: argparse.Namespace, shape: Shape, preset: str | None, run: dict) -> int:
    """measure_flow's order, as every workload is measured."""
    output = Path(args.output)
    environment_output = Path(args.environment_output) if args.environment_output else None
    measure_flow.refuse_outputs({"--output": output, "--environment-output": environment_output})

    def calibration_of_this_gpu(environment: dict) -> None:
        if args.calibration is not None and environment["gpu"].get("available"):
            refuse_foreign_calibration(args.calibration, environment)

    started = measure_flow.EnvironmentStart(args.device)
    environment = started.record(args, environment_output, check=calibration_of_this_gpu)
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
    for name, default in RUN_DEFAULTS.items():
        option = "--" + name.replace("_", "-")
        text = f"{what[name]} (default {default})"
        if name == "dtype":
            parser.add_argument(option, choices=sorted(DTYPE_BYTES), default=default, help=text)
        else:
            parser.add_argument(option, type=arguments.positive_int, default=default, help=text)
    parser.add_argument(
        "--calibration",
        type=Path,
        help="a decoder calibration JSON (kernel-internal blocks for one GPU and PyTorch)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="decoder.py",
        description="Measure and predict a decoder-only language model's inference memory.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=cli.Parser)
    commands.add_parser("presets", help="the public shapes, their parameters and sources")
    p = commands.add_parser("estimate", help="predict every phase's counters, no torch, no GPU")
    add_shape(p)
    add_run(p)
    p.add_argument(
        "--gpu",
        metavar="ID",
        help="predict for this GPU model with its committed calibration (e.g. h200)",
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
        help="the most layer passes, layers x (new tokens + 1), the prediction may replay "
        f"(default {ESTIMATE_BUDGET}: up to about 2 minutes and 1 GB on a 2-core CPU)",
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
        if getattr(args, "gpu", None) is not None:
            if args.calibration is not None:
                raise cli.UsageError("give --gpu or --calibration, not both")
            args.calibration = calibration_for_gpu(args.gpu)
        if args.calibration is not None:
            args.calibration = Calibration.load(existing_calibration(args.calibration))
        if args.command == "estimate":
            document = predicted_document(shape, preset, run, args.calibration)
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
