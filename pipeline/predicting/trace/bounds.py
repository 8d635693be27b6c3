"""The bounds of an approximate prediction: the operators nobody measured (`not_covered`),
the scratch they may add at most (`scratch_bound`), whether an unknown can be bounded
(`boundable`), the least and the most replays (`bounds`), and what a trace leaves unknown
(`assess`).

Torch is never imported here."""

from __future__ import annotations

import dataclasses
import math

from pipeline.core import call_keys
from pipeline.core.prediction_status import PEAK_KEYS
from pipeline.predicting import bnb_int8, cudnn_rnn, fast_paths, from_pretrained, fused_cells
from pipeline.predicting.trace import replay
from pipeline.predicting.trace.model import Signature, Trace, packet
from pipeline.predicting.trace.operators import (
    BORROWED,
    UNCALIBRATED,
    UNSEEN,
    VALUE_DEPENDENT,
    call_arguments,
    output_only,
)

# What an approximate prediction's bounds assume of the blocks nobody measured, from every
# operator probed on a GPU so far (tests/test_prediction_bounds.py checks it against the
# committed probes): an operator's scratch, alive together with its outputs, is at most
# SCRATCH_FACTOR times the bytes of its device inputs and outputs (the largest seen: a
# reduction's float buffers, 4 times a bfloat16 input), and the libraries it calls keep at
# most replay.WORKSPACE_BOUND per thread (cuBLAS and cuBLASLt keep 33 MiB on an H200).
SCRATCH_FACTOR = 8
# ...and never less than SCRATCH_FLOOR: a scan over a few int64s (OPT's and RoBERTa's position
# ids, batch 1 x 8 tokens) takes CUB's temporary storage, 1,343 bytes at most in the probes,
# beyond eight times its 64-byte input and output.
SCRATCH_FLOOR = 64 * 1024
# The math kernel builds a causal mask besides its scores (attention.cpp): ones(L, S) of
# booleans, its tril, then where(mask, 0, -inf) of the query's dtype (float32 at most) and
# the scalar -inf made a tensor. Below 1 MiB these land in the small pool, where a single
# large scratch block never goes (Llama 1B in float32, 512 tokens: 2 MiB more reserved).
MASK_BYTES_PER_SCORE = (1, 1, 4)
# scaled_dot_product_attention left whole (the kernel a GPU takes unknown, or the math one)
# may run the math kernel, whose scratch grows with the score matrix, not with its inputs:
# up to 2.06 times batch x heads x queries x keys float32 scores beyond the rule above, in
# the probes; the bound allows MATH_SCORES times.
MATH_SCORES = 3
SDPA = "aten.scaled_dot_product_attention"
AUTOGRAD_THREAD = "autograd thread"
BOUNDS_METHOD = (
    "the trace replayed twice more: the least (operators not covered allocate their outputs "
    "only, a storage made outside the dispatcher appears where first used, workspaces "
    "shared by the threads) and the most (each such operator adds a library workspace of "
    f"{replay.WORKSPACE_BOUND // 2**20} MiB per thread once, and scratch of {SCRATCH_FACTOR} times "
    "the bytes of its device inputs and outputs alive with its outputs (an attention left "
    f"whole, {MATH_SCORES} float32 score matrices more, and the math kernel's causal mask as "
    "its own blocks); such storages allocated before the first phase; workspaces per "
    "thread); each widened by the largest difference the other orders of segment addresses "
    "made; peak allocated from the bytes the least replay's blocks were asked for (each "
    "request rounded to 512 B, without a rest the allocator may leave unsplit), and peak "
    "reserved from there up, since where blocks land is not monotone in their sizes"
)


@dataclasses.dataclass
class Scenario:
    upper: bool
    uncertain: dict  # signature -> the blocks of scratch its call may add at most, in bytes
    # signature -> {output index: bytes the most replay adds to it}: outputs whose size the
    # trace gives within a few bytes only (cuDNN's reserve, cudnn_rnn.RESERVE_SLACK)
    wider: dict = dataclasses.field(default_factory=dict)


def device_bytes(signature: Signature) -> int:
    """The storage bytes of a call's tensor arguments on the traced device."""
    return sum(
        leaf[5]
        for leaf in signature.leaves
        if call_keys.is_tensor_leaf(leaf) and leaf[6] == "device"
    )


def attention_scores(signature: Signature) -> tuple[int, int, int] | None:
    """For an attention left whole: (batch x heads, queries, keys) of its score matrix."""
    tensors = [leaf for leaf in signature.leaves if call_keys.is_tensor_leaf(leaf)]
    if packet(signature.name) != SDPA or len(tensors) < 2:
        return None
    query, key = tensors[0][2], tensors[1][2]
    if len(query) < 2 or len(key) < 2:
        return None
    return math.prod(query[:-2]), query[-2], key[-2]


def scratch_bound(signature: Signature, outputs: int) -> int:
    """The most scratch an operator call nobody measured may take (SCRATCH_FACTOR, and for
    an attention left whole MATH_SCORES score matrices)."""
    if signature.name in (cudnn_rnn.FORWARD, cudnn_rnn.BACKWARD) and signature.spec is not None:
        bound = cudnn_rnn.scratch_bound(call_arguments(signature))
        if bound is not None:
            return bound
    bound = max(SCRATCH_FACTOR * (device_bytes(signature) + outputs), SCRATCH_FLOOR)
    scores = attention_scores(signature)
    if scores is not None:
        bound += MATH_SCORES * 4 * math.prod(scores)
    if signature.name in fast_paths.FUSED and signature.spec is not None:
        terms = fast_paths.scratch_terms(signature.name, call_arguments(signature))
        if terms is not None:  # the fused kernels' scores and feed-forward, beside the rest
            bound += MATH_SCORES * 4 * terms[0] + terms[1]
    return bound


def scratch_blocks(signature: Signature, outputs: int) -> tuple[int, ...]:
    """The blocks the most replay gives an operator call nobody measured, alive together
    with its outputs: its scratch bound, and for an attention left whole the math kernel's
    causal mask (MASK_BYTES_PER_SCORE, and the 4-byte scalar)."""
    blocks = (scratch_bound(signature, outputs),)
    scores = attention_scores(signature)
    if scores is not None:
        _, queries, keys = scores
        blocks += (*(queries * keys * n for n in MASK_BYTES_PER_SCORE), 4)
    return blocks


def uncertain_calls(trace: Trace, calibration) -> dict:
    """Signature -> the blocks of scratch its call may add at most (scratch_blocks), for
    each call the prediction does not cover: not calibrated, or sized by values the trace
    does not have."""
    outputs: dict = {}
    for event in trace.events:
        if event[0] == "op":
            outputs[event[1].signature] = sum(nbytes for _, _, nbytes in event[1].outputs)
    return {
        key: scratch_blocks(signature, outputs.get(key, 0))
        for key, signature in trace.signatures.items()
        if not_covered(key, signature, calibration) is not None
    }


def not_covered(key: str, signature: Signature, calibration) -> str | None:
    """Why the prediction does not cover a call (its blocks sized by values the trace does
    not have, or not calibrated), or None: a view, a calibrated call, outputs only."""
    if signature.view:
        return None
    dependent = VALUE_DEPENDENT.get(packet(signature.name))
    if dependent is not None and dependent[0](signature.leaves):
        return dependent[1]
    if (calibration is not None and calibration.known(key, signature)) or output_only(signature):
        return None
    if calibration is not None and key in calibration.failed:
        return f"{UNCALIBRATED}; {calibration.failed[key]}"
    if calibration is not None and calibration.borrowed(signature) is not None:
        return f"{UNCALIBRATED}; {BORROWED}"
    if calibration is not None and calibration.fused_cell(signature) is not None:
        return f"{UNCALIBRATED}; {fused_cells.UNMEASURED}"
    return UNCALIBRATED


def boundable(entry: dict) -> bool:
    """Unknowns whose least and most a replay can take: blocks of a known kind and unknown
    size or time. Not: another kernel than the trace's, another way through the code."""
    op, why = entry["op"], entry["why"]
    return (
        why.startswith(UNCALIBRATED)
        or op in (replay.ADDRESS_ORDER, UNSEEN, AUTOGRAD_THREAD, from_pretrained.LOAD_THREADS)
        or op == bnb_int8.OUTLIERS  # its most: Recorder.at_most's blocks
        or (op in VALUE_DEPENDENT and why == VALUE_DEPENDENT[op][1])
    )


def bounds(trace: Trace, calibration, rows: list, spread: dict, unknown: list):
    """(per row {peak counter: (lower, upper)}, None), or (None, why there are none)."""
    unbounded = [entry["op"] for entry in unknown if not boundable(entry)]
    if unbounded == [cudnn_rnn.PACKED_CALLS]:
        return None, f"no bounds: {cudnn_rnn.PACKED_UNBOUNDED}"
    if unbounded:
        return None, (
            "no bounds: the GPU may take another kernel or another way through the code than "
            f"the trace at {', '.join(unbounded)}"
        )
    uncertain = uncertain_calls(trace, calibration)
    wider = {
        key: slack
        for key, signature in trace.signatures.items()
        if (slack := cudnn_rnn.output_slack(signature.name))
    }
    floor = replay.DriverOrder()
    least = replay.replay(
        trace, calibration, scenario=Scenario(False, uncertain), allocator=floor, logged=False
    )[0]
    most = replay.replay(
        trace, calibration, scenario=Scenario(True, uncertain, wider), logged=False
    )[0]
    found = []
    for row, low, high, asked in zip(rows, least, most, floor.peaks_requested, strict=True):
        bound = {
            key: (
                max(0, min(row[key], low[key], high[key]) - spread[key]),
                max(row[key], low[key], high[key]) + spread[key],
            )
            for key in PEAK_KEYS
        }
        # Where blocks land is not monotone in their sizes: an unknown scratch that fills a
        # hole can leave the real run fewer segments than the least replay (ViT-B/32 in
        # bfloat16: 2 MiB less reserved), and a block the real run splits where the least
        # replay does not, fewer bytes allocated (ViT-base training in bfloat16: 1,073,152 B
        # less in the optimizer's first step). Sure are only the bytes the least replay's
        # blocks were asked for, and reserved >= allocated.
        lowest = min(bound["peak_allocated_bytes"][0], asked - spread["peak_allocated_bytes"])
        lower = max(0, lowest)
        bound["peak_allocated_bytes"] = (lower, bound["peak_allocated_bytes"][1])
        bound["peak_reserved_bytes"] = (lower, bound["peak_reserved_bytes"][1])
        found.append(bound)
    return found, None


def assess(trace: Trace, calibration, mismatches: dict, autograd_kept: bool) -> list[dict]:
    """What the prediction does not know, by operator: empty means exact."""
    unknown: dict[str, dict] = {}

    def add(op: str, calls: int, why: str) -> None:
        entry = unknown.setdefault(op, {"op": op, "calls": 0, "why": why})
        entry["calls"] += calls

    for key, signature in trace.signatures.items():
        why = not_covered(key, signature, calibration)
        if why is not None:
            add(packet(signature.name), signature.calls, why)
    for op, why in trace.notes.items():
        add(op, 0, why)
    for op, why in mismatches.items():
        add(packet(op), 0, f"the trace and the GPU disagree on its outputs ({why})")
    if autograd_kept and calibration is not None and calibration.workspaces_per_thread is None:
        add(
            AUTOGRAD_THREAD,
            0,
            "whether backward's thread keeps library workspaces of its own is not calibrated",
        )
    return sorted(unknown.values(), key=lambda entry: entry["op"])
