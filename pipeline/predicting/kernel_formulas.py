"""Kernels whose scratch grows with the shapes: the size of each block, by formula.

A shape rule (gpu_calibration) holds only where every probe allocated the same blocks. The
attention backward kernels do not: their workspaces grow with batch, heads and lengths; nor
does the math attention's _safe_softmax, whose masks grow with the scores. Each
formula here gives, for one call, the sizes of the blocks its kernel allocates besides its
outputs, in the order it allocates them (None: a call the formula does not speak for). A
formula is not trusted because it is written here: `gpu_calibration.build` checks it against
every probe of its operator, and the calibration uses it only for the calls of a form whose
probes it matched, all of them, within the sizes probed (its domain).

Read from the probes, then tested on shapes never probed before they were written down
(runs/20261204T173000Z-h200-probe-sweep-training/FORMULAS-BEFORE.md); the reading of each
term is the likeliest one, the sizes are what the H200 measured.

Standard library only; of the pipeline it imports call_keys alone (which imports nothing).
"""

from __future__ import annotations

import math

from pipeline.core import call_keys

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _attention_shapes(leaves: list):
    """(B, Hq, Sq, D, Hkv, Skv, dtype) of a backward call (grad_out, query, key, ...)."""
    query, key = leaves[1], leaves[2]
    batch, heads, queries, head_size = query[2]
    return batch, heads, queries, head_size, key[2][1], key[2][2], query[1]


def cudnn_attention_backward(leaves: list) -> list[int] | None:
    """One workspace: dQ accumulated in float32, one float per query row, 256 bytes, and
    with grouped-query attention dK and dV at the query heads' count before their sum."""
    batch, heads, queries, head_size, kv_heads, keys, dtype = _attention_shapes(leaves)
    if dtype not in ELEMENT_BYTES or queries != keys:
        return None  # only self-attention was probed
    workspace = 4 * batch * heads * queries * head_size + 4 * batch * heads * queries + 256
    if kv_heads != heads:
        workspace += 2 * batch * heads * keys * head_size * ELEMENT_BYTES[dtype]
    return [workspace]


KEY_BLOCK = 64  # keys per thread block of the memory-efficient backward kernel (head size 64)


def efficient_attention_backward(leaves: list) -> list[int] | None:
    """float32: a query-sized block, two floats-per-row blocks, then a workspace of one
    (64 x head size) float32 tile and 16 bytes per key block and head; bfloat16: one
    floats-per-row block, then that workspace."""
    batch, heads, queries, head_size, kv_heads, keys, dtype = _attention_shapes(leaves)
    if head_size != KEY_BLOCK or kv_heads != heads or queries != keys:
        return None  # only head size 64, self-attention, as many key as query heads
    rows = 4 * batch * heads * queries
    workspace = batch * heads * -(-keys // KEY_BLOCK) * (KEY_BLOCK * head_size * 4 + 16)
    if dtype == "float32":
        return [rows * head_size, rows, rows, workspace]
    if dtype == "bfloat16":
        return [rows, workspace]
    return None


# cuDNN's decode kernel (one query per sequence) splits the keys into S parts, each writing a
# float32 partial output and two floats per row into one workspace, when both allow S >= 4:
# the keys (DECODE_KEY_SPLITS: the most parts each range of lengths allows, as probed) and the
# GPU (a power of two at most DECODE_FILL / (batch x key/value heads)). Probed on the H200 at
# 2,183 calls (batch 1 to 160, 8 to 32 query heads, 2 to 32 key/value heads, head size 64 and
# 128, 9 to 32,768 keys, 2 to 512 key/value groups). The split grows one step after 512,
# 1,016, 2,000, 4,000 and 8,000 keys; where exactly, between those and the next probed
# length, is not known, so a call there (or past the longest probed) is not spoken for.
DECODE_FILL = 256
DECODE_KEY_SPLITS = (  # (fewest keys, most keys, the most parts): every length between probed
    (9, 512, 1),
    (513, 1016, 4),
    (1020, 2000, 8),
    (2040, 4000, 16),
    (4090, 8000, 32),
    (8191, 32768, 64),
)
DECODE_MIN_SPLITS = 4
DECODE_GROUPS_PROBED = 512  # batch x key/value heads
DECODE_HEAD_SIZES = (64, 128)


def _align(nbytes: int, to: int = 128) -> int:
    return -(-nbytes // to) * to


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def cudnn_attention_forward(leaves: list) -> list[int] | None:
    """A decode step (one query, no mask): no workspace, or the split's partial outputs."""
    query, key = leaves[0], leaves[1]
    batch, heads, queries, head_size = query[2]
    kv_heads, keys = key[2][1], key[2][2]
    if queries != 1 or leaves[3] is not None or query[1] != "bfloat16":
        return None
    if head_size not in DECODE_HEAD_SIZES:
        return None
    by_keys = next((most for low, high, most in DECODE_KEY_SPLITS if low <= keys <= high), None)
    groups = batch * kv_heads
    if by_keys is None or groups > DECODE_GROUPS_PROBED:
        return None
    splits = min(by_keys, _floor_pow2(DECODE_FILL // groups))
    if splits < DECODE_MIN_SPLITS:
        return []
    rows = batch * heads * splits
    return [_align(rows * head_size * 4) + 2 * _align(rows * 4) + 128]


SAFE_SOFTMAX_CONTIGUOUS = 8192  # reduce_scratch: no staging below this many trailing inputs
SAFE_SOFTMAX_MASK_BYTES = 2**31  # from here the reduce kernel splits its iterator: not probed


def safe_softmax(leaves: list) -> list[int] | None:
    """The math attention's softmax with fully masked rows set to 0 (PyTorch 2.11's
    _safe_softmax): its output, then a bool mask of the input's -inf (one byte an element),
    that mask reduced with `all` over the softmax dimension (one byte a row) and a scalar of
    the input's dtype, freed in the reverse order. The reduction stages nothing in global
    memory over fewer than 8,192 contiguous trailing inputs (reduce_scratch's reading of the
    reduce kernel), so none is counted there; a longer row, an empty one, or a mask of 2**31
    bytes or more (where the reduction splits its iterator and may take a buffer, as
    trace.operators.reduction_without_scratch says) is not spoken for."""
    tensor, dim = leaves[0], leaves[1]
    if not call_keys.is_tensor_leaf(tensor) or tensor[1] not in ELEMENT_BYTES:
        return None
    shape, stride = tensor[2], tensor[3]
    dtype_given = len(leaves) > 2 and leaves[2] is not None
    if not shape or dim not in (-1, len(shape) - 1) or dtype_given:
        return None
    if list(stride) != call_keys.contiguous_strides(shape) or shape[-1] >= SAFE_SOFTMAX_CONTIGUOUS:
        return None
    elements = math.prod(shape)
    if not elements or elements >= SAFE_SOFTMAX_MASK_BYTES:
        return None
    return [elements, elements // shape[-1], ELEMENT_BYTES[tensor[1]]]


FORMULAS = {
    "aten._safe_softmax.default": safe_softmax,
    "aten._scaled_dot_product_cudnn_attention.default": cudnn_attention_forward,
    "aten._scaled_dot_product_cudnn_attention_backward.default": cudnn_attention_backward,
    "aten._scaled_dot_product_efficient_attention_backward.default": efficient_attention_backward,
}


def internal_sizes(name: str, leaves: list) -> list[int] | None:
    formula = FORMULAS.get(name)
    return None if formula is None else formula(leaves)
