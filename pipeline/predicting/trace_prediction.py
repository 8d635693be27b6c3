"""Predict any workload's allocator counters without running it on a GPU: trace, then replay.

The workload runs once, phase by phase as `own_model.py measure` runs it, under PyTorch's
FakeTensorMode (tensors with shapes and no memory) and a dispatch mode that sees every
operator: each new storage on the device is an allocation of its size in bytes, each storage
whose last reference goes (a weak reference that expires) is a free, in the order they
happen. `allocator_model.AllocatorModel` replays that sequence with the same phase boundaries
(baseline, peak reset, end values) and gives the six counters of every phase.

One thing a dispatch mode changes in PyTorch itself: while any is active, every tensor counts
as a subclass, and some of PyTorch's C++ then calls an operator out of place (a new storage)
where a real run calls its in-place form: the autograd engine adding a tensor's second
gradient to the first, the math attention kernel adding its mask to the scores, indexing's
backward writing into zeros (`IN_PLACE_IN_A_REAL_RUN`). The recorder finds those calls by
their C++ caller and records them as a real run makes them: the result shares its first
argument's block. And among free blocks of one size the allocator takes the lowest address,
which between segments is the driver's: each prediction is replayed under other orders of the
segments too, and where a counter moves it says "approximate", by how much (`predict`).

What no trace shows are the blocks a GPU kernel allocates inside one operator: cuBLAS and
cuBLASLt workspaces (kept, one set per thread that calls them), cuDNN convolution
workspaces, attention kernels' scratch, reductions' buffers. On a GPU, `probe_operators`
runs each distinct operator call of the trace once more, on fresh tensors, with the
allocator's history recorded, and keeps what it allocated besides its outputs: the
calibration. Without one, an operator not known to allocate only its outputs makes the
prediction "approximate", named; where the trace cannot follow the code (shapes that depend
on tensor values, an operator with no fake implementation) the prediction is "not
predicted", never a figure.

Standard library at module level: torch is imported by the functions that need it.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import importlib.util
import itertools
import math
import os
import random
import re
import sys
import weakref

from pipeline.core import allocator_model, call_keys, phase_protocol, torch_private
from pipeline.core.prediction_status import PEAK_KEYS, PredictionStatus
from pipeline.predicting import (
    autocast_policy,
    bnb_int8,
    bnb_kernels,
    bnb_optimizers,
    ctc_loss,
    cublas_operands,
    cudnn_rnn,
    fast_paths,
    from_pretrained,
    fused_cells,
    fused_dropout,
    fused_optimizers,
    grad_scaler,
    kernel_formulas,
    late_imports,
    loss_outputs,
    module_conversion,
    nll_loss,
    packed_positions,
    packed_sequences,
    quantized_load,
    reduce_scratch,
    segment_order,
)

CALLER, AUTOGRAD = "caller", "autograd"  # the thread that ran an operator (see Recorder.role)

# Operators whose CUDA kernels allocate their outputs and nothing else (TensorIterator
# element-wise kernels, copies, factories, softmax, layer norm's forward, the foreach
# kernels of the optimizers). Trusted without a calibration; `measure` still probes all but
# the foreach ones (a probe would copy every parameter and optimizer state once more).
# fmt: off
_ATEN_OUTPUT_ONLY = (
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full",
    "scalar_tensor", "arange", "rand", "randn", "randint", "rand_like", "randn_like",
    "randint_like", "uniform_", "normal_", "bernoulli_", "random_", "_to_copy", "clone", "copy_",
    "fill_", "zero_", "lift_fresh_copy", "contiguous", "add", "add_", "sub", "sub_", "rsub", "mul",
    "mul_", "div", "div_", "neg", "pow", "rsqrt", "sqrt", "exp", "log", "tanh", "sigmoid", "relu",
    "relu_", "gelu", "silu", "silu_", "where", "masked_fill", "masked_fill_", "threshold_backward",
    "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward", "lerp", "lerp_",
    "addcmul", "addcmul_", "addcdiv", "addcdiv_", "maximum", "minimum", "clamp", "clamp_min",
    "clamp_max", "eq", "ne", "lt", "gt", "le", "ge", "logical_not", "bitwise_not", "cos", "sin",
    "reciprocal", "abs", "sign", "erf", "tril", "triu", "cat", "stack", "index_select",
    "embedding", "slice_backward", "select_backward", "native_layer_norm",
    "constant_pad_nd",  # empty, fill_, copy_ into a narrowed view (or a clone): 189 H200 probes
    "rsqrt_", "pow_", "square", "square_",  # in place, or pow(x, 2): element-wise, as pow is
    "exp_", "log_",  # in place, element-wise as exp and log are (the CTC loss's backward)
    "set_",  # a tensor made a view of another's storage (flatten_parameters): nothing made
)
_FOREACH_OUTPUT_ONLY = (
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "lerp_", "addcmul_", "addcdiv_",
    "sqrt", "sqrt_", "maximum_", "neg", "neg_", "zero_", "copy_", "reciprocal_", "pow", "pow_",
    "sign_", "abs_",
)
# fmt: on
OUTPUT_ONLY = frozenset(
    [
        *(f"aten.{name}" for name in _ATEN_OUTPUT_ONLY),
        *(f"aten._foreach_{name}" for name in _FOREACH_OUTPUT_ONLY),
    ]
)
# Reductions (TensorIterator's CUDA reduce kernel, Reduce.cuh): outputs only, unless the
# kernel splits one output's inputs across thread blocks (`should_global_reduce`), which takes
# a staging buffer and semaphores from the allocator. It does so only where a thread would
# still reduce 256 values or more (max_values_per_thread) after the split across a warp's
# lanes and the block's warps; with fewer than 256 inputs per output that never happens, nor
# for inputs contiguous in the reduced trailing dimensions with fewer than 8,192 (32 lanes x
# 256), the reductions of a norm over the hidden size. Beyond 2**31 bytes the kernel splits
# the iterator and may take an accumulation buffer: not covered either.
VECTOR_NORM = "aten.linalg_vector_norm.default"
# operator -> the name of its dimension argument (None: all of them)
REDUCTIONS = {
    "aten.sum.dim_IntList": "dim",
    "aten.mean.dim": "dim",
    "aten.sum.default": None,
    "aten.mean.default": None,
    "aten.amax.default": "dim",
    "aten.amin.default": "dim",
    "aten.argmax.default": "dim",
    "aten.argmin.default": "dim",
    VECTOR_NORM: "dim",
}
# Asked for a float32 result of a float16 or bfloat16 input, these reduce it uncast on CUDA:
# make_reduction's `gpu_lowp_to_f32` (ReduceOpsUtils.h), through make_reduction_from_out_ty
# for sum and mean and the one-dtype make_reduction for the norm (LinearAlgebra.cpp). The
# norm's exception: a reduction over dimensions all of size 1 is `self.to(dtype)` and `abs`,
# a copy the trace does not see.
LOWP_TO_FLOAT32 = {"aten.sum.dim_IntList", "aten.mean.dim", VECTOR_NORM}
VALUES_PER_THREAD = 256
WARP = 32


def call_arguments(signature) -> dict:
    """The call's arguments by name, as described (a tensor a tuple, see `describe`)."""
    args, kwargs = torch_private.tree_unflatten(list(signature.leaves), signature.spec)
    names = [argument.name for argument in torch_private.schema_of(signature.func).arguments]
    return {**dict(zip(names, args, strict=False)), **kwargs}


def reduction_without_scratch(signature) -> bool:
    """A reduction the kernel finishes inside each thread block (REDUCTIONS)?"""
    if signature.name not in REDUCTIONS or signature.spec is None or signature.func is None:
        return False
    arguments = call_arguments(signature)
    x = arguments.get("self")
    if not call_keys.is_tensor_leaf(x):
        return False
    _, dtype, shape, stride, _offset, nbytes, _where = x
    requested = arguments.get("dtype")
    uncast = (
        signature.name in LOWP_TO_FLOAT32
        and dtype in reduce_scratch.LOW_PRECISION
        and requested == ("dtype", "float32")
    )
    if requested is not None and requested != ("dtype", dtype) and not uncast:
        return False  # converted to another dtype first: a copy the trace may not show
    family = reduce_scratch.OPERATORS.get(signature.name, ("",))[0]
    if requested is None and reduce_scratch.cast_to(family, dtype, None) is not None:
        return False  # an integer or bool input summed as int64: copied first (its template)
    if nbytes >= 2**31:
        return False
    rank = len(shape)
    dims = arguments.get(REDUCTIONS[signature.name]) if REDUCTIONS[signature.name] else None
    if dims is None or dims == []:
        dims = list(range(rank))
    elif isinstance(dims, int):
        dims = [dims]
    dims = sorted({d % rank for d in dims}) if rank else []
    inputs = math.prod(shape[d] for d in dims)
    if signature.name == VECTOR_NORM and inputs == 1 and uncast:
        return False  # self.to(dtype), then abs: a copy (see LOWP_TO_FLOAT32)
    if inputs < VALUES_PER_THREAD:
        return True
    trailing = dims == list(range(rank - len(dims), rank))
    return trailing and call_keys.contiguous(shape, stride) and inputs < WARP * VALUES_PER_THREAD


def output_only(signature) -> bool:
    """Known to allocate its outputs and nothing else, on any NVIDIA GPU, by PyTorch's source."""
    if signature.name in BY_SOURCE:  # outputs only, or a block more (by_source_template)
        return BY_SOURCE[signature.name](signature.leaves)
    if signature.name in nll_loss.OPERATORS:
        return nll_loss.outputs_only(signature.name, signature.leaves)
    name = packet(signature.name)
    return (
        name in OUTPUT_ONLY
        or name in grad_scaler.ALLOCATE_NOTHING
        or reduction_without_scratch(signature)
    )


NOT_PROBED_PREFIX = "aten._foreach_"
# Without a GPU the trace runs on the meta device, where these functions choose other
# kernels than on a GPU: the trace is then not the GPU's, and says so.
META_CHOICES = {
    "scaled_dot_product_attention": "traced on the meta device (no GPU), PyTorch takes the "
    "math kernel (the full attention matrix) where a GPU chooses flash, memory-efficient or "
    "cuDNN attention",
    "batch_norm": "traced on the meta device (no GPU), PyTorch takes its native kernel where "
    "a GPU may take cuDNN's, with other outputs",
    "recurrent layers": "traced on the meta device (no GPU), PyTorch runs LSTM, GRU and RNN "
    "layers step by step where a GPU runs cuDNN's fused kernels, with their own workspace",
    "recurrent cells": "traced on the meta device (no GPU), PyTorch runs LSTMCell and GRUCell "
    "gate by gate where a GPU runs one fused kernel (_thnn_fused_lstm_cell, "
    "_thnn_fused_gru_cell) that saves its own workspace for backward (--gpu NAME traces the "
    "GPU's calls)",
}
# Operators whose scratch on a GPU depends on the tensors' values, which neither a fake
# tensor nor a probe on zeros has: calibrated or not, the prediction for them is approximate.


def embedding_backward_sorts(leaves: list) -> bool:
    """embedding_dense_backward sorts its indices, and sizes its scratch by how many distinct
    ones there are, beyond 3072 indices or with scale_grad_by_freq (torch's Embedding.cu);
    below, see embedding_backward_template."""
    indices, scale = leaves[1], leaves[4]
    return math.prod(indices[2]) > FEW_INDICES or bool(scale)


EMBEDDING_BACKWARD = "aten.embedding_dense_backward.default"
FEW_INDICES = 3072


def embedding_backward_template(arguments: dict) -> list | None:
    """Up to FEW_INDICES indices, without scale_grad_by_freq, the CUDA kernel (Embedding.cu,
    embedding_dense_backward_cuda) sorts nothing: it makes the gradient, then the indices,
    contiguous (a copy each only where they are not: BERT's expanded token types, T5's
    permuted position bias), allocates its zeroed output, and frees the copies on return."""
    grad, indices = arguments.get("grad_output"), arguments.get("indices")
    if not (call_keys.is_tensor_leaf(grad) and call_keys.is_tensor_leaf(indices)):
        return None
    if arguments.get("scale_grad_by_freq") or math.prod(indices[2]) > FEW_INDICES:
        return None
    steps: list[tuple] = []
    for tensor in (grad, indices):
        if not call_keys.contiguous(tensor[2], tensor[3]):
            size = reduce_scratch.ELEMENT_SIZE.get(tensor[1])
            if size is None:
                return None
            steps.append(("internal", len(steps), size * math.prod(tensor[2])))
    copies = len(steps)
    return [*steps, ("output", 0, None), *(("free", n) for n in reversed(range(copies)))]


CUMSUM = "aten.cumsum.default"
# A scan over one row (numel == size(dim)) goes to CUB's inclusive scan (ScanUtils.cuh,
# scan_dim), which takes CUB's temporary storage: on the H200 under torch 2.11.0+cu130, the
# bytes below at every probed length up to the second figure (scan dtype -> (bytes, length)).
CUB_SCAN_STORAGE = {"float32": (1023, 2000), "int64": (1279, 473)}
INTEGERS = ("int8", "uint8", "int16", "int32", "bool")


def cumsum_template(arguments: dict) -> list | None:
    """cumsum on CUDA (ScanKernels.cpp): an integer input below int64 is first copied to
    int64 (after the output); a scan over one row takes CUB's storage (CUB_SCAN_STORAGE);
    over the last, contiguous dimension of several rows the kernel takes nothing more.
    Anything else, or an explicit dtype, is not spoken for."""
    x, dim = arguments.get("self"), arguments.get("dim")
    if not call_keys.is_tensor_leaf(x) or arguments.get("dtype") is not None:
        return None
    _, dtype, shape, stride, _offset, _nbytes, _where = x
    if not shape or not isinstance(dim, int) or not call_keys.contiguous(shape, stride):
        return None
    steps: list[tuple] = [("output", 0, None)]
    if dtype in INTEGERS:
        steps.append(("internal", 0, 8 * math.prod(shape)))
        dtype = "int64"
    rows = math.prod(shape) // max(shape[dim], 1)
    if rows == 1:
        storage, longest = CUB_SCAN_STORAGE.get(dtype, (None, 0))
        if storage is None or shape[dim] > longest:
            return None
        steps.append(("internal", len(steps) - 1, storage))
    elif dim % len(shape) != len(shape) - 1:
        return None
    internal = [step[1] for step in steps if step[0] == "internal"]
    return [*steps, *(("free", n) for n in reversed(internal))]


SOFTMAX_BACKWARD = "aten._softmax_backward_data.default"
# softmax's and log_softmax's kernels, and log_softmax's backward, which run on
# `.contiguous()` of their first tensors (by_source_template): how many
COPIED_FIRST = {
    "aten._softmax.default": 1,
    "aten._log_softmax.default": 1,
    "aten._log_softmax_backward_data.default": 2,
}
POW_SCALAR = "aten.pow.Scalar"
EMBEDDING = "aten.embedding.default"
SCALAR_BYTES = {float: 8, int: 8}  # wrapped_scalar_tensor: a double or an int64


def flat_view(shape, stride) -> bool:
    """Can reshape(-1) view this tensor (no copy)? Adjacent dimensions, size-1 ones aside,
    must each step by the next one's extent (TensorShape.cpp, computeStride)."""
    kept = [(size, step) for size, step in zip(shape, stride, strict=True) if size != 1]
    return all(
        step == next_step * next_size
        for (_, step), (next_size, next_step) in itertools.pairwise(kept)
    )


def _contiguous(*positions):
    """Whether the call's tensors at these positions are all there and contiguous."""
    return lambda leaves: all(
        i < len(leaves)
        and call_keys.is_tensor_leaf(leaves[i])
        and call_keys.contiguous(leaves[i][2], leaves[i][3])
        for i in positions
    )


# Operators whose blocks beyond their outputs PyTorch's source settles (by_source_template),
# each with whether a call's leaves make it output-only all the same.
BY_SOURCE = {
    SOFTMAX_BACKWARD: lambda leaves: False,
    **{name: _contiguous(*range(count)) for name, count in COPIED_FIRST.items()},
    POW_SCALAR: lambda leaves: type(leaves[0]) in SCALAR_BYTES and leaves[0] == 1,
    EMBEDDING: _contiguous(1),  # the indices
}


def by_source_template(name: str, arguments: dict, leaves: list) -> list | None:
    """- softmax's backward (SoftMax.cu, softmax_backward_cuda_out) computes `tmp = grad *
      output` into a tensor of their shape before its kernel, after its output, and frees it
      on return: all 19 of its H200 probes, from 2 KB to 4 GB;
    - `scalar ** tensor` (Pow.cpp, pow_Scalar_out) makes the scalar a tensor on the
      exponent's device (wrapped_scalar_tensor, 8 bytes) after its output, unless the scalar
      is 1 (a fill): all 340 H200 probes, 8 bytes;
    - embedding (Embedding.cpp) selects rows by `indices.reshape(-1)`, a copy of the indices
      before the output where they cannot be viewed flat (BERT's expanded token types): all
      its H200 probes with such indices; contiguous indices, outputs only; strided indices
      that can be viewed flat were never probed and are not spoken for;
    - softmax and log_softmax, forward and log_softmax's backward (SoftMax.cu, host_softmax
      and host_softmax_backward) run on `.contiguous()` of their input, or of the gradient
      then the output: a copy of each that is not, after the output, kept to the return (an
      H100 copied a transposed gradient so inside log_softmax's backward)."""
    if BY_SOURCE[name](leaves):
        return []  # outputs only
    if name in COPIED_FIRST:
        steps = [("output", 0, None)]
        for index, leaf in enumerate(leaves[: COPIED_FIRST[name]]):
            size = reduce_scratch.ELEMENT_SIZE.get(leaf[1])
            if size is None:
                return None
            if not call_keys.contiguous(leaf[2], leaf[3]):
                steps.append(("internal", index, size * math.prod(leaf[2])))
        frees = [("free", step[1]) for step in reversed(steps) if step[0] == "internal"]
        return steps + frees
    if name == SOFTMAX_BACKWARD:
        grad, output = arguments.get("grad_output"), arguments.get("output")
        if not (call_keys.is_tensor_leaf(grad) and call_keys.is_tensor_leaf(output)):
            return None
        if not (call_keys.contiguous(*grad[2:4]) and call_keys.contiguous(*output[2:4])):
            return None  # `tmp` and the output may be copied again: not what the probes ran
        size = reduce_scratch.ELEMENT_SIZE.get(grad[1])
        if grad[2] != output[2] or grad[1] != output[1] or size is None:
            return None  # a broadcast or a promotion: not what the probes ran
        return [("output", 0, None), ("internal", 0, size * math.prod(grad[2])), ("free", 0)]
    if name == POW_SCALAR:
        size = SCALAR_BYTES.get(type(arguments.get("self")))
        return None if size is None else [("output", 0, None), ("internal", 0, size), ("free", 0)]
    indices = arguments.get("indices")  # an embedding whose indices are not contiguous
    size = reduce_scratch.ELEMENT_SIZE.get(indices[1])
    if size is None or flat_view(indices[2], indices[3]):
        return None  # strided but viewable: index_select's own way with it not probed
    return [("internal", 0, size * math.prod(indices[2])), ("output", 0, None), ("free", 0)]


VALUE_DEPENDENT = {
    "aten.embedding_dense_backward": (
        embedding_backward_sorts,
        "its GPU kernel sorts the indices and sizes its scratch by the number of distinct "
        "ones, a value the trace does not have (the probe ran it on zeros)",
    ),
}
# PyTorch's C++ functions that, because a dispatch mode makes every tensor a subclass, call an
# operator out of place where a real run calls its in-place form on the first argument (which
# is then the result's block): {caller: {operator: when the real run does so}}. "always"; "no
# grad" where grad mode is off; "gradient": grad mode off, the first argument dense, not a
# zero tensor, and held by the engine alone (its own test), which shows when its storage dies
# with the call (Recorder.poll). "other": the real run takes another way, with sizes that
# depend on values: the prediction is approximate. Backward formulas are named by their
# autograd node (`...Backward0::apply`): the helpers they call are not exported, so the node
# is the caller whose name can be read.
BACKWARD = "torch::autograd::generated::"
IN_PLACE_IN_A_REAL_RUN = {
    # the autograd engine adding a tensor's second gradient to the first
    "torch::autograd::InputBuffer::add": {"aten.add.Tensor": "gradient"},
    # the attention mask added to the scores, on the math path
    "at::native::_scaled_dot_product_attention_math": {"aten.add.Tensor": "always"},
    # the bias added to a matrix product on linear's general path
    "at::native::linear": {"aten.add.Tensor": "always"},
    # backward of indexing: the gradient written into zeros shaped like the input
    f"{BACKWARD}IndexBackward0::apply": {"aten.index_put.default": "always"},
    f"{BACKWARD}TakeBackward0::apply": {"aten.put.default": "always"},
    "at::native::gather_backward": {"aten.scatter_add.default": "always"},
    "at::native::index_select_backward_symint": {"aten.index_add.default": "always"},
    "at::native::value_selecting_reduction_backward_symint": {"aten.scatter.src": "always"},
    "at::native::cummaxmin_backward": {"aten.scatter_add.default": "always"},
    "at::native::trace_backward_symint": {"aten.index_fill.int_Scalar": "always"},
    # backward of max()/min()/median() of a whole tensor, and of clamp with tensor bounds
    **{
        f"{BACKWARD}{node}::apply": {"aten.logical_and.default": "always"}
        for node in ("MaxBackward1", "MinBackward1", "MedianBackward0", "NanmedianBackward0")
    },
    f"{BACKWARD}ClampBackward0::apply": {
        "aten.logical_and.default": "always",
        "aten.logical_or.default": "always",
    },
    # binary_cross_entropy_with_logits' backward
    f"{BACKWARD}BinaryCrossEntropyWithLogitsBackward0::apply": {
        "aten.sub.Tensor": "no grad",
        "aten.mul.Tensor": "no grad",
    },
    # prod's backward: a real run looks for zeros in the input and takes another way
    f"{BACKWARD}ProdBackward0::apply": {"aten.cumprod.default": "other"},
    f"{BACKWARD}ProdBackward1::apply": {"aten.cumprod.default": "other"},
}
FAST_PATH = fast_paths.NOTE
OTHER_WAY = (
    "a real run takes another way here than the trace, with sizes that depend on the "
    "tensors' values"
)
IN_PLACE_CANDIDATES = frozenset(op for ops in IN_PLACE_IN_A_REAL_RUN.values() for op in ops)
UNREADABLE_CALLER = (
    "PyTorch's C++ frames could not be read, so the calls it makes in place in a real run "
    "(gradient accumulation, the attention mask, indexing's backward) cannot be told from the "
    "others: each counts as a new block"
)
UNCALIBRATED = (
    "not calibrated: the blocks its GPU kernel allocates besides its outputs "
    "(workspaces, scratch) are unknown"
)
BORROWED = (
    "no float16 product was probed: its library workspaces are taken, for the central "
    "figure only, from the bfloat16 and float32 products of its form, which agree (cuBLAS "
    "and cuBLASLt keep one per handle and stream, whatever the dtype)"
)
# A dtype in a call's form (call_keys.form): float16 as a word, not inside bfloat16; and
# the dtypes whose agreeing patterns a float16 product borrows (Calibration.borrowed).
FLOAT16 = re.compile(r"(?<![a-z])float16\b")
DONORS = ("bfloat16", "float32")
# Written into every prediction, in the words committed predictions hold (the kit script
# carries the same AllocatorModel as allocator_model.py).
METHOD = (
    "the workload traced once under torch FakeTensorMode (no memory, no GPU) by a dispatch "
    "mode: each new device storage an allocation of its bytes, each expired storage a free, "
    "in order; replayed phase by phase through mesure_memoire.AllocatorModel, with each "
    "operator's own blocks from the calibration"
)


class TraceStopped(Exception):
    """The trace cannot follow the code: the prediction is 'not predicted', with this reason."""


@dataclasses.dataclass
class OpCall:
    name: str  # "aten.addmm.default"
    role: str  # CALLER or AUTOGRAD
    signature: str  # what a probe needs to recreate the call, hashed
    outputs: tuple  # ((flat output index, storage id, bytes), ...) of the new device storages
    reuses: int | None = None  # a real run writes the output into this storage's block


@dataclasses.dataclass
class Signature:
    name: str
    func: object  # the OpOverload, to probe it
    leaves: list  # the call's arguments, tensors described (see describe())
    spec: object  # their tree structure
    calls: int = 0
    view: bool = False


@dataclasses.dataclass
class Trace:
    device: str  # "cuda:0", or "meta" where no GPU is visible
    build: str  # the PyTorch traced with: "cuda" or "cpu-only"
    torch_version: str
    events: list = dataclasses.field(default_factory=list)
    signatures: dict = dataclasses.field(default_factory=dict)
    notes: dict = dataclasses.field(default_factory=dict)  # op name -> why it is unknown
    stopped: str | None = None
    checks_passing: int = 0  # inside a function whose value checks are taken as passed

    @property
    def operator_calls(self) -> int:
        return sum(1 for event in self.events if event[0] == "op")


def packet(name: str) -> str:
    """'aten.addmm.default' -> 'aten.addmm': the operator without its overload."""
    return name.rsplit(".", 1)[0]


def signature_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- tracing


def build_of(torch) -> str:
    return "cuda" if torch.version.cuda or torch.version.hip else "cpu-only"


def trace_device(torch, index: int) -> str:
    """Where a GPU is visible, the trace runs on fake `cuda:N` tensors, so that PyTorch makes
    that GPU's kernel choices; elsewhere on meta (autograd cannot run on fake CUDA tensors
    without a GPU: PyTorch aborts the process)."""
    return f"cuda:{index}" if torch.cuda.is_available() else "meta"


class Tracer:
    """`with Tracer(torch, device) as tracer:` runs code on fake tensors and records it;
    `tracer.phase` has `phase_protocol.run_phase`'s shape, so one phase driver serves both."""

    def __init__(self, torch, device: str, fake: bool = True, target=None) -> None:
        self.torch = torch
        self.target = target  # attention_choice.TargetGpu: the GPU a meta trace stands for
        self.real = not fake  # tests record a real run on the CPU the same way
        self.trace = Trace(
            device=device,
            build=build_of(torch),
            torch_version=torch.__version__,
        )
        warning = torch_private.check_version(torch)
        if warning is not None:  # the private APIs below may not do what they were read to do
            self.trace.notes[torch_private.VERSION_NOTE] = warning
        self._undo: list = []

    def __enter__(self) -> Tracer:
        self.fake = torch_private.FakeTensorMode(
            allow_non_fake_inputs=False, allow_fallback_kernels=False
        )
        # Its dispatch cache gives each repeated operator call (one per layer) its outputs'
        # shapes without running the meta kernel again: a quarter of the 8B-class trace's
        # time; the outputs are new fake tensors all the same, so the trace is unchanged.
        self.fake.cache_enabled = True
        self.recorder = make_recorder(self.torch)(self)
        modes = [self.recorder]
        if not self.real:
            modes.insert(0, self.fake)
        if self.trace.device == "meta":
            modes.append(make_choice_notes(self.torch, self.trace, self.target)())
        elif self.target is not None and not self.real:  # beside a measurement: the same calls
            modes.append(make_choice_notes(self.torch, self.trace, self.target, meta=False)())
        try:
            if not self.real:
                self._patch_optimizers()
                self._patch_swap()
                self._patch_deepcopy()
                self._patch_fast_paths()
                if self.trace.device == "meta":  # CUDA autocast's casts, as a GPU makes them
                    self._undo.append(autocast_policy.install(self.torch, self.trace.notes))
                    self._undo.append(bnb_optimizers.install(self.torch, self.trace.notes))
                    if self.target is not None:
                        self._undo.append(fused_dropout.install(self.torch))
                self._undo.append(
                    grad_scaler.install(self.torch, self.trace.notes, self.trace.device == "meta")
                )
                self._undo.append(torch_private.quicker_cache_keys(self.torch))
                self._undo.append(fused_cells.add_fake_kernels(self.torch))
                self._undo.append(module_conversion.install(self.torch, self))
                self._undo.append(
                    from_pretrained.install(
                        self.torch, self.recorder, self.trace.notes, self.trace.device == "meta"
                    )
                )
                if "bitsandbytes.nn.modules" in sys.modules:
                    self._install_bitsandbytes()
                elif importlib.util.find_spec("bitsandbytes") is not None:
                    # imported by transformers inside the trace (a BitsAndBytesConfig)
                    self._undo.append(
                        late_imports.after_import("bitsandbytes", self._install_bitsandbytes)
                    )
                self._undo.append(packed_positions.install(self.torch))
                self._undo.append(loss_outputs.add_fake_kernels(self.torch, self.fake))
                if self.target is not None and self.target.cudnn() is not None:
                    self._undo.append(cudnn_rnn.add_fake_kernels(self.torch))
                    self._patch_rnn_flatten()
            for mode in modes:
                mode.__enter__()
                self._undo.append(lambda mode=mode: mode.__exit__(None, None, None))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _install_bitsandbytes(self) -> None:
        """bitsandbytes' load and kernels as a GPU runs them (quantized_load, bnb_kernels,
        bnb_int8), for the rest of the trace."""
        on_meta = self.trace.device == "meta"
        self._undo.append(
            quantized_load.install(self.torch, self.recorder, self.trace.notes, on_meta)
        )
        self._undo.append(bnb_kernels.install(self.torch, self._gpu_props()))
        self._undo.append(bnb_int8.install(self.torch, self.recorder, self.trace.notes, on_meta))

    def __exit__(self, *exc) -> None:
        """Modes left and torch's functions restored, in reverse order, whatever happened."""
        while self._undo:
            self._undo.pop()()

    def phase(self, name: str, operation, repetition: int | None = None, passes: int = 1):
        row = phase_protocol.phase_row(name, repetition, passes)
        self.recorder.poll()
        self.trace.events.append(("start", name, repetition, passes))
        result = operation()
        self.recorder.poll()  # what died inside the operation, before the end values
        self.trace.events.append(("end",))
        return row, result

    def _gpu_props(self) -> tuple[int, int, int] | None:
        """(SM count, major, minor) of the GPU the trace is for: the target's without a GPU
        (reduce_scratch.DEVICES), this GPU's beside a measurement; None where unknown."""
        if self.trace.device != "meta":
            index = self.torch.device(self.trace.device).index or 0
            props = self.torch.cuda.get_device_properties(index)
            return props.multi_processor_count, props.major, props.minor
        device = reduce_scratch.DEVICES.get(self.target.name) if self.target else None
        if device is None or not self.target.capability:
            return None
        return (device.multiprocessors, *self.target.capability)

    def _patch_optimizers(self) -> None:
        """torch.optim picks its foreach kernels for plain tensors on a GPU only: let fake
        parameters on the traced device get the same choice as the real ones will."""
        self._undo.append(torch_private.add_foreach_type(torch_private.FakeTensor))
        if self.trace.device == "meta":
            self._undo.append(torch_private.add_optimizer_device("meta"))

    def _patch_swap(self) -> None:
        """nn.Module.to() swaps fake parameters (torch.utils.swap_tensors) where it assigns
        `.data` of real ones, which frees the old storage at once; the swapped-out storage
        would live one parameter longer. Record its free where the real one happens."""
        torch = self.torch
        original = torch.utils.swap_tensors
        recorder = self.recorder

        def swap(t1, t2):
            original(t1, t2)
            recorder.free_if_only_held_by(t2)

        torch.utils.swap_tensors = swap
        self._undo.append(lambda: setattr(torch.utils, "swap_tensors", original))

    def _patch_deepcopy(self) -> None:
        """copy.deepcopy of a fake tensor deep-copies its `__dict__` (torch's
        Tensor.__deepcopy__), and with it the FakeTensorMode it refers to: the copy belongs to
        a second mode, and the next operator mixing it with the others fails ("Mixing fake
        modes NYI"). nn.TransformerEncoder and Decoder deep-copy their layer. A mode is the
        trace's context, not data: a copy of it is itself."""
        FakeTensorMode = torch_private.FakeTensorMode

        had = "__deepcopy__" in FakeTensorMode.__dict__
        original = FakeTensorMode.__dict__.get("__deepcopy__")
        FakeTensorMode.__deepcopy__ = lambda mode, memo: mode

        def undo():
            if had:
                FakeTensorMode.__deepcopy__ = original
            else:
                del FakeTensorMode.__deepcopy__

        self._undo.append(undo)

    def _patch_rnn_flatten(self) -> None:
        """nn.RNNBase.flatten_parameters on fake tensors does what it does on a GPU
        (cudnn_rnn.flatten_on_fake); on real tensors, its own code."""
        torch = self.torch
        rnn_base = torch.nn.RNNBase
        original = rnn_base.flatten_parameters
        fake = torch_private.FakeTensor

        def flatten_parameters(module):
            weights = module._flat_weights
            if not weights or not all(isinstance(w, fake) for w in weights):
                return original(module)
            return cudnn_rnn.flatten_on_fake(torch, module)

        rnn_base.flatten_parameters = flatten_parameters
        self._undo.append(lambda: setattr(rnn_base, "flatten_parameters", original))

    def _patch_fast_paths(self) -> None:
        """nn.MultiheadAttention and TransformerEncoderLayer take PyTorch's fused kernels in
        inference only when no tensor argument has a torch function, which fake tensors
        always have: the trace takes them where a GPU does (fast_paths.py)."""
        self._undo.append(fast_paths.install(self.torch, self.trace.notes))


def make_choice_notes(torch, trace: Trace, target=None, meta: bool = True):
    """On the meta device: note the calls whose kernels a GPU would choose otherwise, and
    make tensors from data fake.

    With a target GPU (attention_choice.TargetGpu), scaled_dot_product_attention takes the
    kernel that GPU takes (`sdpa_as_on_gpu`) and needs no note, unless the rule cannot tell.

    torch.tensor, as_tensor and asarray build a tensor from Python data with PyTorch's
    dispatch keys excluded, and for the meta device return it before handing it to the
    fake mode (`internal_new_from_data` in torch/csrc/utils/tensor_new.cpp): a real meta
    tensor, which the next operator refuses ("Please convert all Tensors to FakeTensors
    first"). Transformers' caches start that way (`torch.tensor([], device=...)`). Built on
    the CPU and copied to the device instead, it is fake, and allocated on the device as a
    GPU run allocates it. For a CUDA device the same C++ copies the data to the GPU before
    the fake mode sees it: the trace beside a measurement would allocate a real block there,
    which a module or a cache can keep into the measurement (BatchNorm's
    `num_batches_tracked`, built under `torch.device("cuda")`, held 512 B before model_load).
    It is built the same way: on the CPU, then copied as a fake tensor.

    On a GPU's fake tensors (`meta=False`, the trace beside a measurement), only
    scaled_dot_product_attention goes through the target's rule, so that the trace makes the
    same calls as the estimate made without a GPU; the rest is the GPU's own."""
    from torch.overrides import TorchFunctionMode

    recurrent = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)
    cells = (torch.lstm_cell, torch.gru_cell)
    functions = {
        torch.nn.functional.scaled_dot_product_attention: "scaled_dot_product_attention",
        torch.nn.functional.batch_norm: "batch_norm",
        torch.batch_norm: "batch_norm",
        **dict.fromkeys(recurrent, "recurrent layers"),
        # ATen's LSTMCell and GRUCell take the fused kernel for a CUDA input (RNN.cpp);
        # rnn_tanh_cell and rnn_relu_cell run the same operators on every device.
        **dict.fromkeys((torch.lstm_cell, torch.gru_cell), "recurrent cells"),
    }
    from_data = {torch.tensor, torch.as_tensor, torch.asarray}

    sdpa = torch.nn.functional.scaled_dot_product_attention
    dropouts = {
        torch.nn.functional.dropout: DROPOUT_PARAMETERS,
        torch.dropout: ("input", "p", "train"),
    }
    batch_norms = {
        torch.nn.functional.batch_norm: F_BATCH_NORM_PARAMETERS,
        torch.batch_norm: BATCH_NORM_PARAMETERS,
    }
    # The CTC loss, its blocks sized by the lengths' values: as a GPU runs it (ctc_loss.py).
    ctc = {torch.nn.functional.ctc_loss, torch.ctc_loss}
    # Calls whose C++ takes another way under a dispatch mode (isTensorSubclassLike) than in
    # a real run, which selects elements by a mask's values (`masked_select`): noted.
    other_ways = {
        torch.Tensor.masked_fill: masked_fill_selects,
        torch.Tensor.masked_fill_: masked_fill_selects,
        torch.masked_fill: masked_fill_selects,
        torch.nn.functional.cross_entropy: cross_entropy_selects,
    }
    # `x[index] = number`: for a CUDA tensor PyTorch makes the number a CPU scalar and fills
    # (valueToTensor, python_variable_indexing.cpp); for a meta one, a block on the device.
    setitem = torch.Tensor.__setitem__
    # Every function the branches below look at: any other runs as it comes, at once.
    special = {sdpa, setitem, torch.Tensor.backward, *functions, *from_data, *recurrent,
               *dropouts, *batch_norms, *ctc, *other_ways}  # fmt: skip
    # Python functions that hand themselves to the modes first (handle_torch_function) and
    # call functions of `special`: run, a mode's handler calls them with the mode off, so
    # that what they call would not be seen (nn.MultiheadAttention's general path and its
    # scaled_dot_product_attention: the meta device's math kernel, where a GPU takes flash).
    # The backward too: non-reentrant checkpointing (torch.utils.checkpoint, transformers'
    # gradient_checkpointing_enable) runs the layer's forward again inside it, from the
    # saved-tensor hooks, and must make the calls the first forward made, or it counts
    # other saved tensors and raises CheckpointError.
    nested = {torch.nn.functional.multi_head_attention_forward, torch.autograd.backward,
              torch.autograd.grad}  # fmt: skip
    # Python functions that check a tensor's values and raise where they are bad, which fake
    # tensors cannot tell: the check's operators run, and it is taken as passed, as it is in
    # any run that goes on (gaussian_nll_loss: `torch.any(var < 0)`; Recorder answers it).
    checked = {torch.nn.functional.gaussian_nll_loss}
    held: dict = {}  # what a GPU process keeps to its end (cuDNN's dropout state)

    class ChoiceNotes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in nested:
                return with_mode_inside(self, func, args, kwargs)
            if func is torch.Tensor.backward:  # what its body calls, with the mode on
                names = ("gradient", "retain_graph", "create_graph")
                call = dict(zip(names, args[1:], strict=False))
                call.update(kwargs)
                return with_mode_inside(
                    self, torch.autograd.backward, (args[0], call.get("gradient")),
                    {"retain_graph": call.get("retain_graph"),
                     "create_graph": call.get("create_graph", False),
                     "inputs": call.get("inputs")},
                )  # fmt: skip
            if func in checked:
                trace.checks_passing += 1
                try:
                    return func(*args, **kwargs)
                finally:
                    trace.checks_passing -= 1
            if func not in special:
                return func(*args, **kwargs)
            if func is sdpa and target is not None:
                return sdpa_as_on_gpu(torch, trace, target, func, args, kwargs)
            if func in ctc:
                loss, why = ctc_loss.ctc_loss_as_on_gpu(torch, func, args, kwargs)
                if why is not None:
                    raise TraceStopped(why)
                return loss
            if func in other_ways:
                noted = other_ways[func](torch, args, kwargs)
                if noted is not None:
                    trace.notes.setdefault(noted, OTHER_WAY)
                return func(*args, **kwargs)
            if func in recurrent and target is not None and target.cudnn() is not None:
                routed = cudnn_rnn.rnn_as_on_gpu(torch, func, args, kwargs, held, target.name)
                if routed is not None:
                    if cudnn_rnn.packed(args):
                        trace.notes.setdefault(cudnn_rnn.PACKED_CALLS, cudnn_rnn.PACKED_WHY)
                    return routed
            if func in from_data and args and not isinstance(args[0], torch.Tensor):
                device = torch.device(kwargs.get("device") or "cpu")
                if device.type in ("meta", "cuda"):
                    kwargs = dict(kwargs, device="cpu")
                    grad = kwargs.pop("requires_grad", False)
                    kwargs.pop("pin_memory", None)
                    return func(*args, **kwargs).to(device).requires_grad_(grad)
            if not meta:
                return func(*args, **kwargs)
            if func is setitem and len(args) == 3 and type(args[2]) in (bool, int, float):
                number = torch.tensor(args[2], dtype=args[0].dtype)  # on the CPU, as for CUDA
                return func(args[0], args[1], number)
            if func in cells and target is not None and args and args[0].dim() == 2:
                return fused_cells.cell_as_on_gpu(torch, func, args, kwargs)
            if func in dropouts:
                fused = dropout_as_on_gpu(torch, dropouts[func], args, kwargs)
                if fused is not None:
                    return fused
            if func in batch_norms and target is not None and target.cudnn() is not None:
                return batch_norm_as_on_gpu(torch, batch_norms[func], func, args, kwargs)
            name = functions.get(func)
            if name is not None:
                trace.notes.setdefault(name, META_CHOICES[name])
            return func(*args, **kwargs)

    return ChoiceNotes


def masked_fill_selects(torch, args, kwargs) -> str | None:
    """masked_fill with a tensor value that needs a gradient: a real run's backward sums the
    value's gradient over `grad.masked_select(mask)`, as many elements as the mask holds
    True; under a dispatch mode, over `where(mask, grad, 0)` (masked_fill_backward)."""
    value = kwargs.get("value", args[2] if len(args) > 2 else None)
    if isinstance(value, torch.Tensor) and value.requires_grad and torch.is_grad_enabled():
        return "masked_fill's backward (a tensor value that needs a gradient)"
    return None


def cross_entropy_selects(torch, args, kwargs) -> str | None:
    """cross_entropy with label smoothing, class weights and the mean over class indices: a
    real run divides by the weights of `target.masked_select(~ignore_mask)`, as many as the
    targets not ignored; under a dispatch mode it gathers them all and masks them
    (cross_entropy_loss_label_smoothing, LossNLL.cpp)."""
    call = {**dict(zip(("input", "target", "weight"), args, strict=False)), **kwargs}
    target, weight = call.get("target"), call.get("weight")
    legacy = call.get("size_average") is not None or call.get("reduce") is not None
    if (
        call.get("label_smoothing", 0.0) > 0
        and weight is not None
        and (legacy or call.get("reduction", "mean") == "mean")
        and isinstance(target, torch.Tensor)
        and not target.dtype.is_floating_point
    ):
        return "cross_entropy (label smoothing, class weights, the mean)"
    return None


def with_mode_inside(mode, func, args, kwargs):
    """func's body with `mode` on: its own first has_torch_function check, the one that
    handed it to the mode, answers False once, so that it runs instead of coming back."""
    import sys

    module = sys.modules[func.__module__]
    original = module.has_torch_function
    pending = [True]

    def once(arguments):
        if pending:
            pending.clear()
            return False
        return original(arguments)

    module.has_torch_function = once
    try:
        with mode:
            return func(*args, **kwargs)
    finally:
        module.has_torch_function = original


DROPOUT_PARAMETERS = ("input", "p", "training", "inplace")


def dropout_as_on_gpu(torch, names, args, kwargs):
    """Dropout as a GPU runs it, or None to run it as it comes: `at::native::dropout`
    (Dropout.cpp) takes the fused kernel, native_dropout, whose mask is one byte an element,
    for a CUDA input in training with 0 < p < 1; on the meta device it would take the
    composite path instead (a noise tensor of the input's dtype, and a multiplication).
    The in-place form has no fused path."""
    defaults = dict(zip(names, (None, 0.5, True, False), strict=False))
    call = {**defaults, **dict(zip(names, args, strict=False)), **kwargs}
    x, p = call["input"], call["p"]
    train = call.get("training", call.get("train"))
    if call.get("inplace") or not train or not isinstance(x, torch.Tensor):
        return None
    if not (0 < p < 1) or x.numel() == 0 or x.is_nested:
        return None
    return torch.ops.aten.native_dropout(x, p, True)[0]


F_BATCH_NORM_PARAMETERS = ("input", "running_mean", "running_var", "weight", "bias", "training",
                           "momentum", "eps")  # fmt: skip
BATCH_NORM_PARAMETERS = ("input", "weight", "bias", "running_mean", "running_var", "training",
                         "momentum", "eps", "cudnn_enabled")  # fmt: skip
BATCH_NORM_DEFAULTS = {"weight": None, "bias": None, "running_mean": None, "running_var": None,
                       "training": False, "momentum": 0.1, "eps": 1e-5}  # fmt: skip
# cuDNN's least batch-norm epsilon (CUDNN_BN_MIN_EPSILON: 0 in cuDNN 9; on the H200 an eps
# of 1e-9 took cuDNN), below which PyTorch takes its native kernel.
CUDNN_BN_MIN_EPSILON = 0.0
# _select_batch_norm_backend's batch limits: spatial mode in training, in evaluation
CUDNN_BN_MAX_BATCH = {True: 880801, False: 65535}


def cudnn_takes_batch_norm(torch, x, weight, bias, mean, var, training, eps) -> bool:
    """`_select_batch_norm_backend` (Normalization.cpp), for a CUDA input where PyTorch has
    cuDNN: cuDNN's kernel unless the input or the weight is bfloat16, a float16 input has
    float16 weights, an affine part or one running statistic is missing (both may be missing
    in training), the input has fewer than 3 dimensions, the batch or the element count is
    past cuDNN's limits, eps is below its least, or cuDNN is switched off."""
    half, bf16 = torch.float16, torch.bfloat16
    return (
        weight is not None
        and bias is not None
        and bf16 not in (x.dtype, weight.dtype)
        and (x.dtype != half or weight.dtype == torch.float32)
        and ((mean is not None and var is not None) or (mean is None and var is None and training))
        and x.dim() >= 3
        and x.size(0) <= CUDNN_BN_MAX_BATCH[bool(training)]
        and eps >= CUDNN_BN_MIN_EPSILON
        and torch.backends.cudnn.enabled
        and x.numel() < 2**31 - 1
    )


def batch_norm_as_on_gpu(torch, names, func, args, kwargs):
    """Batch norm as a CUDA GPU with cuDNN runs it (`_batch_norm_impl_index`): where
    `cudnn_takes_batch_norm`, cudnn_batch_norm on the input made contiguous in its suggested
    memory format and the other tensors contiguous, so that the trace records that operator,
    its saved statistics and reserve, and through autograd cudnn_batch_norm_backward; PyTorch's
    native kernel otherwise, which the meta device runs too. Under inference mode the composite
    operator is recorded whole, as on a GPU, and its GPU kernel's blocks are the probes'."""
    call = dict(BATCH_NORM_DEFAULTS, **dict(zip(names, args, strict=False)), **kwargs)
    x, weight, bias = call["input"], call["weight"], call["bias"]
    mean, var, training, eps = (call[k] for k in ("running_mean", "running_var", "training", "eps"))
    if (
        torch.is_inference_mode_enabled()
        or not isinstance(x, torch.Tensor)
        or x.numel() == 0
        or (func is torch.nn.functional.batch_norm and eps <= 0)  # F.batch_norm refuses it
        or not cudnn_takes_batch_norm(torch, x, weight, bias, mean, var, training, eps)
    ):
        return func(*args, **kwargs)
    if func is torch.nn.functional.batch_norm and training:
        torch_private.verify_batch_size(torch, x.size())
    stats = [t.contiguous() if t is not None else None for t in (mean, var)]
    return torch.ops.aten.cudnn_batch_norm(
        x.contiguous(memory_format=torch_private.suggest_memory_format(x)),
        weight.contiguous(),
        bias.contiguous(),
        *stats,
        training,
        call["momentum"],
        eps,
    )[0]


# The memory-efficient attention kernel, outside a CUDA graph capture, returns its random
# seed and offset as CPU scalars, with dropout or without (`_efficient_attention_forward`,
# attention.cu: `device = in_capture_stream ? kCUDA : kCPU`; an H200's allocator history of
# ViT training without dropout shows no block for them). The meta kernels make them on the
# input's device, which would keep two 512-byte blocks per layer alive until backward.
HOST_OUTPUTS = {
    "aten::_scaled_dot_product_efficient_attention": ("philox_seed", "philox_offset"),
    "aten::_efficient_attention_forward": ("philox_seed", "philox_offset"),
}
SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                   "enable_gqa")  # fmt: skip
SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                 "enable_gqa": False}  # fmt: skip


def sdpa_as_on_gpu(torch, trace: Trace, target, func, args, kwargs):
    """F.scaled_dot_product_attention as `at::native::scaled_dot_product_attention`
    (attention.cpp) runs it on the target GPU: the kernel `attention_choice.choose` names,
    called with the arguments it gets there, so that the trace records that kernel's operator,
    its outputs, and through autograd its backward operator; under inference mode too, where
    the composite operator's own kernel makes the same call and keeps its first output only.
    Where the rule cannot tell, the math kernel, noted."""
    from pipeline.predicting import attention_choice as choice

    call = dict(SDPA_DEFAULTS, **dict(zip(SDPA_PARAMETERS, args, strict=False)), **kwargs)
    q, k, v, mask = call["query"], call["key"], call["value"], call["attn_mask"]
    try:
        backend, _ = choice.choose(
            target,
            choice.call_of(
                torch, q, k, v, mask, call["dropout_p"], call["is_causal"], call["enable_gqa"]
            ),
            choice.switches_of(torch),
        )
    except choice.Undecided as why:
        trace.notes.setdefault(
            "scaled_dot_product_attention",
            f"{META_CHOICES['scaled_dot_product_attention']}; the kernel {target.name} would "
            f"take is not known: {why}",
        )
        return func(*args, **kwargs)
    aten = torch.ops.aten
    dropout, causal, scale = call["dropout_p"], call["is_causal"], call["scale"]
    # should_compute_logsumexp: the saved statistics, for backward only
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if backend == choice.FLASH:
        # pad_last_dim<8, false>: head dims padded to a multiple of 8, the scale of the
        # unpadded one; post_process_flash_output slices the output back
        size = q.size(-1)
        padded = [
            t if t.size(-1) % 8 == 0 else torch.nn.functional.pad(t, [0, 8 - t.size(-1) % 8])
            for t in (q, k, v)
        ]
        og_scale = scale if scale is not None else 1.0 / math.sqrt(size)
        out = aten._scaled_dot_product_flash_attention(
            *padded, dropout, causal, False, scale=og_scale
        )[0]
        return out if out.size(-1) == size else out[..., :size]
    if mask is not None and mask.dtype == torch.bool:
        # convert_boolean_attn_mask(_cudnn): where(mask, 0, -inf) in the query's dtype
        fill = -65504.0 if backend == choice.CUDNN else float("-inf")
        mask = torch.where(mask, 0.0, torch.scalar_tensor(fill, dtype=q.dtype, device=mask.device))
    if backend == choice.MATH:
        # the math kernel, whose C++ function the trace runs (DECOMPOSED) as a GPU does:
        # under inference mode the composite would otherwise be recorded whole, its scores,
        # softmax and the grouped heads' copies unseen
        return aten._scaled_dot_product_attention_math(
            q, k, v, mask, dropout, causal, None, scale=scale, enable_gqa=call["enable_gqa"]
        )[0]
    if backend == choice.CUDNN:
        return aten._scaled_dot_product_cudnn_attention(
            q, k, v, mask, lse, dropout, causal, False, scale=scale
        )[0]
    if mask is not None:
        # preprocess_mask: a mask whose strides are not multiples of 8 (or whose last one is
        # not 1) is padded to a multiple of 8 and sliced back, then expanded to (B, H, L, S)
        aligned = all(s % 8 == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1
        if not aligned:
            last = mask.size(-1)
            mask = torch.nn.functional.pad(mask, [0, 8 - last % 8])[..., :last]
        mask = mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))
    return aten._scaled_dot_product_efficient_attention(
        q, k, v, mask, lse, dropout, causal, scale=scale
    )[0]


def absent_outputs(func, args, kwargs) -> set:
    """Indexes of the outputs a GPU leaves unallocated where the meta kernel allocates them:
    cuDNN attention makes its logsumexp only when asked to (run_cudnn_SDP_fprop, MHA.cpp),
    which it is not under inference mode; its meta kernel makes it always."""
    schema = torch_private.schema_of(func)
    if schema.name != "aten::_scaled_dot_product_cudnn_attention":
        return set()
    arguments = [a.name for a in schema.arguments]
    where = arguments.index("compute_log_sumexp")
    wanted = kwargs.get("compute_log_sumexp", args[where] if len(args) > where else False)
    return set() if wanted else {1}


def host_outputs(func, args, kwargs) -> set:
    """Indexes of the outputs a GPU makes on the host (HOST_OUTPUTS)."""
    schema = torch_private.schema_of(func)
    names = HOST_OUTPUTS.get(schema.name)
    if not names:  # every call of a trace asks: most have none
        return set()
    returns = [r.name for r in schema.returns]
    return {returns.index(name) for name in names}


# Composite operators (CompositeImplicitAutograd: one C++ function calling other operators)
# reach the dispatch mode as one call where autograd is off (inference mode); a GPU runs the
# same function, whose inner calls allocate blocks the composite's outputs do not show (layer
# norm's mean and rstd, where's scalar made a tensor on the device). The trace runs these
# through that function instead, so it records each inner call: only those whose function
# takes the same calls on the meta device as on a GPU (each read in PyTorch's source), under
# the condition given. Others stay one call, calibrated or not.
def _not_half_to_float(args, kwargs) -> bool:
    """softmax/log_softmax(x, dim, dtype=float32) on a float16 CUDA input takes the kernel's
    own half-to-float path; on meta it converts first (SoftMax.cpp)."""
    x = args[0]
    dtype = kwargs.get("dtype", args[2] if len(args) > 2 else None)
    return not (str(x.dtype) == "torch.float16" and dtype is not None)


def _int_repeats(args, kwargs) -> bool:
    """repeat_interleave by a number: no sizes read from values (a tensor of repeats is)."""
    repeats = kwargs.get("repeats", args[1] if len(args) > 1 else None)
    return isinstance(repeats, int)


DECOMPOSED = {
    "aten::layer_norm": None,  # native_layer_norm, its first output kept
    "aten::group_norm": None,  # native_group_norm
    "aten::dropout": None,  # training on a GPU is intercepted first (dropout_as_on_gpu)
    "aten::feature_dropout": None,
    "aten::alpha_dropout": None,
    "aten::feature_alpha_dropout": None,
    "aten::type_as": None,
    "aten::conv1d": None,  # convolution, after unbatched inputs get their batch dimension
    "aten::conv2d": None,
    "aten::conv3d": None,
    "aten::where": None,  # the Scalar forms make the scalar a tensor on the device
    "aten::min": None,  # min.other: minimum
    "aten::max": None,
    "aten::_scaled_dot_product_attention_math": None,  # sdpa_as_on_gpu's math kernel
    "aten::matmul": None,  # _matmul_impl: folds or expands by shapes and strides, then mm/bmm
    "aten::repeat_interleave": _int_repeats,  # unsqueeze, expand, clone, flatten (Repeat.cpp)
    "aten::softmax": _not_half_to_float,
    "aten::log_softmax": _not_half_to_float,
}


def decomposed(torch, func, args, kwargs) -> bool:
    """Run this call through its composite function (DECOMPOSED)?"""
    name = torch_private.schema_of(func).name
    if name not in DECOMPOSED:
        return False
    if not torch_private.has_composite_kernel(torch, func):
        return False
    condition = DECOMPOSED[name]
    return condition is None or condition(args, kwargs)


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorFacts:
    """What the recorder asks of an operator at every call, answered once per operator: an
    8B-class trace makes a few hundred thousand calls of a few dozen operators."""

    name: str  # str(func): "aten.addmm.default"
    prim: bool  # namespace "prim"
    pointwise_out: bool  # one of the `out=` products written_into_out may skip
    decomposed: object  # False, True, or the condition on (args, kwargs): see decomposed()
    seeded: bool  # random, and not cuDNN's RNN (which has a fake kernel)
    mutable: bool  # its schema writes into an argument
    view: bool
    in_place_candidate: bool  # in IN_PLACE_CANDIDATES
    returns_first: bool  # writes into its first argument and returns it (add_, copy_, ...)
    pure: bool  # aten, writes into no argument, no view, shapes not from values (mm, cat, ...)


# Whether the recorder answers a call already seen (the same signature) of an in-place or view
# operator, or of one that makes new tensors, itself, as FakeTensorMode's dispatch cache would,
# without that cache's key (Recorder.in_place, .viewed, .made). False: every call goes through
# FakeTensorMode, the oracle tests/test_trace_speed.py compares the traces with.
KNOWN_CALLS_ANSWERED = True
# The devices whose fake tensors get those answers: the meta device's (the GPU-free estimate)
# and a GPU's (the trace beside a measurement), where test_trace_speed.py's GPU test makes the
# same comparison (it passed on an H100, and the 8B decoder's measurement predicted the same
# bytes with the answers and without: runs/20261205T230100Z-h100-gpu-tests-answers/).
ANSWERED_ON = ("meta", "cuda")

# How the recorder learns that a storage's last reference went: "callback", a weak reference
# to the storage's Python object, which PyTorch keeps as long as the storage lives and drops
# with it; "scan", every live storage asked at every operator (quadratic in the trace's
# length; kept as the oracle the tests compare the callbacks with).
FREE_DETECTION = "callback"


def returns_first(schema) -> bool:
    """One return, the first argument, which the operator writes (add_, copy_, resize_)."""
    if len(schema.returns) != 1 or not schema.arguments:
        return False
    first, returned = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return (
        first is not None
        and first.is_write
        and returned is not None
        and returned.before_set == first.before_set
    )


def make_recorder(torch):
    """The dispatch mode class (it needs torch to exist, so it is made on demand)."""
    StorageWeakRef = torch_private.StorageWeakRef
    TorchDispatchMode = torch_private.unguarded_dispatch_mode()  # no torch.compile inside
    tree_flatten, tree_map = torch_private.tree_flatten, torch_private.tree_map

    seeded = torch.Tag.nondeterministic_seeded
    flatten = make_flatten(torch)
    FakeTensor = torch_private.FakeTensor
    aten = torch.ops.aten
    POINTWISE_OUT = {aten.mul.out, aten.add.out, aten.sub.out}
    # The fake mode runs PyTorch's Python decomposition of log_softmax's backward, whose
    # result keeps the gradient's strides; the kernels' own meta function
    # (TORCH_META_FUNC(_log_softmax_backward_data), SoftMax.cpp) makes it contiguous, and an
    # H100 showed it so (no copy where the gradient meets a contiguous leaf).
    CONTIGUOUS_OUTPUT = {aten._log_softmax_backward_data.default}
    RNN = torch_private.cudnn_rnn_operators(torch)[0]  # seeded (dropout); cudnn_rnn's fake kernel
    PACK = torch_private.pack_padded_operator(torch)  # packed_sequences: the lengths read
    SCALAR = torch_private.local_scalar_operator(torch)  # a value read back to Python
    BOOL = torch.bool
    # Operators whose outputs may take their shapes from values: FakeTensorMode caches none.
    value_shaped = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}
    PRIM_DEVICE = torch.ops.prim.device.default  # a third of a decoder trace's calls
    device_of_fake = torch_private.fake_device_answer()
    Tensor = torch.Tensor

    class Recorder(TorchDispatchMode):
        def __init__(self, tracer: Tracer) -> None:
            super().__init__()
            self.tracer = tracer
            self.events = tracer.trace.events
            self.live: dict = {}  # weak pointer -> (StorageWeakRef, bytes, storage id, watch)
            self.scan = FREE_DETECTION == "scan"
            self.reported: list = []  # weak pointers whose storage's Python object went
            self.suspects: set = set()  # reported while their storage still lived
            self.specs: dict = {}  # shape of the arguments (make_flatten) -> TreeSpec, text
            self.freed_early: set = set()
            self.ids = itertools.count()
            self.target = torch.device(tracer.trace.device)
            self.pending_in_place: tuple | None = None  # (OpCall, its first argument's storage id)
            self.operators: dict = {}  # OpOverload -> OperatorFacts
            self.keys: dict = {}  # a signature's text -> signature_id(text)
            self.probes: dict = {}  # (name, spec text, described, their types) -> the same
            self.kept_in_place: set = set()  # signatures whose fake kernel changed no metadata
            self.views: dict = {}  # (signature, base's keys, inference mode) -> fake_view_recipe
            self.outputs: dict = {}  # (signature, *creation_state) -> fake_outputs_recipe
            self.described: dict = {}  # dtype or device -> its part of a description
            self.written: dict = {}  # written_into_out's answers, by shapes and dtypes
            answered_here = self.target.type in ANSWERED_ON
            self.answers = KNOWN_CALLS_ANSWERED and answered_here and not tracer.real
            if self.target.type == "meta":  # on_target, in one step (asked a million times)
                self.on_target = lambda tensor: tensor.device.type == "meta"

        def on_target(self, tensor) -> bool:
            device = tensor.device
            if self.target.type == "meta":
                return device.type == "meta"
            return device.type == self.target.type and device.index == self.target.index

        def facts(self, func) -> OperatorFacts:
            """What the recorder asks of an operator at each of its calls, asked once."""
            found = self.operators.get(func)
            if found is None:
                schema = torch_private.schema_of(func)
                name = str(func)
                composite = schema.name in DECOMPOSED and torch_private.has_composite_kernel(
                    torch, func
                )
                found = self.operators[func] = OperatorFacts(
                    name=name,
                    prim=func.namespace == "prim",
                    pointwise_out=func in POINTWISE_OUT,
                    decomposed=(DECOMPOSED[schema.name] or True) if composite else False,
                    seeded=seeded in func.tags and func is not RNN,
                    mutable=schema.is_mutable,
                    view=bool(func.is_view),
                    in_place_candidate=name in IN_PLACE_CANDIDATES,
                    returns_first=returns_first(schema),
                    pure=func.namespace == "aten"
                    and not (
                        schema.is_mutable or func.is_view or value_shaped.intersection(func.tags)
                    ),
                )
            return found

        def poll(self) -> None:
            """Storages whose last reference went since the last operator: freed, now."""
            if not (self.reported or self.suspects or self.scan or self.pending_in_place):
                return  # nothing reported, nothing pending: most operators' case
            expired = torch_private.storage_expired(torch)
            if self.scan:
                dead = [key for key in self.live if expired(key)]
            else:
                # Only those a callback reported (`watch`), each asked whether its storage is
                # gone indeed, as a scan would ask it; one still alive is asked again at
                # every poll until it is.
                candidates = self.suspects
                if self.reported:
                    candidates = candidates.union(self.reported)
                    self.reported.clear()
                dead = [key for key in candidates if expired(key)]
                if candidates:
                    self.suspects = candidates.difference(dead)
            pending, self.pending_in_place = self.pending_in_place, None
            for sid in sorted(self.live.pop(key)[2] for key in dead):  # in a stable order
                if pending is not None and sid == pending[1]:
                    pending[0].reuses = sid  # nothing else held it: the real run adds in place
                if sid in self.freed_early:
                    self.freed_early.discard(sid)
                else:
                    self.events.append(("free", sid))

        def free_if_only_held_by(self, tensor) -> None:
            if not isinstance(tensor, torch.Tensor) or not self.on_target(tensor):
                return
            storage = tensor.untyped_storage()
            entry = self.live.get(StorageWeakRef(storage).cdata)
            # 2: the tensor's own reference and `storage` here; nothing else holds it.
            if entry is not None and torch_private.storage_use_count(torch, storage) == 2:
                self.events.append(("free", entry[2]))
                self.freed_early.add(entry[2])

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is PRIM_DEVICE and type(args[0]) is FakeTensor:
                return device_of_fake(args)  # asked from C++: nothing runs, nothing recorded
            kwargs = kwargs or {}
            facts = self.operators.get(func) or self.facts(func)
            if not facts.prim:  # prim.device is asked inside other operators' calls
                self.poll()
            if not self.tracer.real:
                if func is SCALAR and self.tracer.trace.checks_passing and args[0].dtype == BOOL:
                    return False  # a value check, passed (make_choice_notes' `checked`)
                if func is PACK:
                    if not packed_sequences.has_values(torch, args[1]):
                        raise TraceStopped(packed_sequences.NO_VALUES)
                    with self:
                        return packed_sequences.pack(torch, *args, **kwargs)
                if self.on_host(args, kwargs):
                    with torch_private.unset_fake_temporarily():
                        return func(*args, **kwargs)
                args, kwargs = self.host_tensors_faked(args, kwargs)
            if facts.pointwise_out and self.written_into_out(func, args, kwargs):
                out = kwargs["out"]  # what the fake kernel returns, without its slow path
                self.record(func, args, kwargs, out, facts)
                return out
            condition = facts.decomposed  # decomposed(), its call-independent part kept
            if condition is True or (condition and condition(args, kwargs)):
                with self:
                    return torch_private.composite_function(torch, func, args, kwargs)
            if facts.seeded and not self.tracer.real:  # random: before any answer
                out = self.seeded(func, args, kwargs)
                torch_private.forget_converted_tensors(self.tracer.fake)
            elif self.answers and facts.returns_first:
                return self.in_place(func, args, kwargs, facts)
            elif self.answers and facts.view:
                return self.viewed(func, args, kwargs, facts)
            elif self.answers and facts.pure:
                return self.made(func, args, kwargs, facts)
            else:
                out = self.called(func, args, kwargs)
            self.record(func, args, kwargs, out, facts)
            return out

        def called(self, func, args, kwargs):
            """func(*args, **kwargs), through the fake mode below."""
            try:
                out = func(*args, **kwargs)
            except AssertionError:
                made = self.made_from_data(args, kwargs)
                if made is None:
                    raise
                out = func(*made[0], **made[1])
            torch_private.forget_converted_tensors(self.tracer.fake)
            if func in CONTIGUOUS_OUTPUT and not out.is_contiguous():
                out = out.new_empty(out.shape)  # the fake mode's, not recorded: the kernel's
            return out

        def in_place(self, func, args, kwargs, facts: OperatorFacts):
            """An operator that writes into its first argument and returns it. Its fake
            kernel runs the first time a signature is seen (it checks the call as a GPU
            would, and may raise); if that left the first argument's shape, strides, offset
            and storage as they were, a later call of the same signature (the same
            arguments' descriptions) is answered without it: the kernel depends on nothing
            else, and a quarter of a decoder trace's calls are of this kind. Not for fake
            tensors that hold a value (FakeTensorMode then updates it)."""
            first = args[0] if args else None
            called = flatten((args, kwargs))
            before = self.call_key(facts, *called, (args, kwargs))
            if before[0] in self.kept_in_place and self.answerable(called[0]):
                self.record(func, args, kwargs, first, facts, called, before)
                return first
            out = self.called(func, args, kwargs)
            after = self.call_key(facts, *called, (args, kwargs))
            if out is first and after == before:
                self.kept_in_place.add(before[0])
            self.record(func, args, kwargs, out, facts, called, after)
            return out

        def viewed(self, func, args, kwargs, facts: OperatorFacts):
            """A view operator: its fake kernel runs the first time a signature is seen; if
            it gave one fake tensor on its first argument's storage and left the arguments
            as they were, a later call of the same signature gets the same view, made as
            FakeTensorMode makes it from its own dispatch cache (torch_private.fake_view)
            without computing that cache's key: views are a third of a decoder trace's
            calls, and the rest of their cost."""
            called = flatten((args, kwargs))
            key = self.call_key(facts, *called, (args, kwargs))
            # A view's dispatch keys follow its base's (an inference tensor's, autograd's
            # zero tensor's) and, for a normal base, whether inference mode is on.
            keys = torch_private.dispatch_keys(torch, args[0])
            known = key[0], keys, torch.is_inference_mode_enabled()
            made = self.views.get(known)
            fake = self.tracer.fake
            if made is not None and self.answerable(called[0]):
                out = torch_private.fake_view(torch, fake, args[0], *made)
            else:
                out = self.called(func, args, kwargs)
                made = torch_private.fake_view_recipe(torch, fake, out, args[0])
                if made is not None and self.call_key(facts, *called, (args, kwargs)) == key:
                    self.views[known] = made
            self.record(func, args, kwargs, out, facts, called, key)
            return out

        def made(self, func, args, kwargs, facts: OperatorFacts):
            """An operator that writes into no argument: its fake kernel runs the first time a
            signature is seen (under the default dtype and device and the inference mode of
            that call, which FakeTensorMode's cache keys hold too); if it returned fake
            tensors on new storages of their own, a later call gets new ones of the same
            shapes, made as that cache makes them (torch_private.fake_outputs)."""
            called = flatten((args, kwargs))
            key = self.call_key(facts, *called, (args, kwargs))
            known = key[0], *torch_private.creation_state(torch)
            recipe = self.outputs.get(known)
            fake = self.tracer.fake
            if recipe is not None and self.answerable(called[0]):
                out = torch_private.fake_outputs(torch, fake, recipe)
            else:
                out = self.called(func, args, kwargs)
                if self.answerable(called[0]):
                    recipe = torch_private.fake_outputs_recipe(torch, fake, out, called[0])
                    if recipe is not None:
                        self.outputs[known] = recipe
            self.record(func, args, kwargs, out, facts, called, key)
            return out

        def answerable(self, leaves) -> bool:
            """Whether a call seen before may be answered without the fake mode: every tensor
            argument one of its fake tensors (a real one takes made_from_data's path), none
            holding a value (FakeTensorMode follows a held value through the call)."""
            for x in leaves:
                if isinstance(x, Tensor) and (
                    type(x) is not FakeTensor or torch_private.fake_holds_value(x)
                ):
                    return False
            return True

        def written_into_out(self, func, args, kwargs) -> bool:
            """A binary pointwise `out=` call whose `out` already has the broadcast shape,
            on the inputs' device, and a dtype the result casts to: it allocates nothing, and
            returns `out`. FakeTensorMode caches no `out=` call and runs PyTorch's Python
            reference for it, five times the cost of the same product without `out` (the
            decoder's rotary embedding and norms make thousands)."""
            if self.tracer.real:
                return False
            out = kwargs.get("out")
            if not isinstance(out, FakeTensor) or len(args) != 2:
                return False
            tensors = [x for x in args if isinstance(x, torch.Tensor)]
            if any(not isinstance(x, FakeTensor) or x.device != out.device for x in tensors):
                return False
            # The answer depends on the shapes and dtypes alone where both arguments are
            # tensors of at least one dimension (a zero-dimensional one may be a wrapped
            # number, which promotes otherwise): asked once per such combination.
            key = None
            if len(tensors) == 2 and all(x.dim() for x in tensors):
                key = tuple((tuple(x.shape), x.dtype) for x in (*tensors, out))
                known = self.written.get(key)
                if known is not None:
                    return known
            shape = torch.broadcast_shapes(*(x.shape for x in tensors))
            if tuple(out.shape) != tuple(shape):
                answer = False  # resized: the fake kernel says how
            else:
                answer = torch.can_cast(torch.result_type(*args), out.dtype)
            if key is not None:
                self.written[key] = answer
            return answer

        def on_host(self, args, kwargs) -> bool:
            """Whether a GPU run computes this call on the CPU, for real: every tensor argument
            a real CPU tensor (`on_host` made it), or none and the CPU named as the device.
            Run so, its values exist: models that build a schedule on the CPU and read it
            back (ConvNeXt's, Swin's, BEiT's stochastic depth: `torch.linspace(..., device=
            "cpu").tolist()`) are traced on, where a fake tensor has no value to give."""
            FakeTensor = torch_private.FakeTensor
            for x in args:
                if isinstance(x, FakeTensor):
                    return False  # the common case, told at once
            device = kwargs.get("device")
            if device is not None and torch.device(device).type != "cpu":
                return False
            tensors = [x for x in flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
            if not tensors:
                return device is not None
            return not any(isinstance(x, FakeTensor) or x.device.type != "cpu" for x in tensors)

        def host_tensors_faked(self, args, kwargs):
            """(args, kwargs) with each real CPU tensor among the arguments made fake: where a
            GPU run's CPU tensor meets the device (`.to(device)`, an operator with device
            tensors), so that the fake mode makes the call, and its output is the device's
            block, allocated here. A real CPU tensor inside a list is made fake when the fake
            mode refuses it (`made_from_data`)."""
            FakeTensor = torch_private.FakeTensor

            def real(x) -> bool:
                return isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor)

            for x in (*args, *kwargs.values()):  # not any(map(real, ...)), without a call each
                if isinstance(x, Tensor) and not isinstance(x, FakeTensor):
                    break
            else:
                return args, kwargs
            fake = self.tracer.fake.from_tensor
            return tree_map(lambda x: fake(x) if real(x) and x.device.type == "cpu" else x,
                            (args, kwargs))  # fmt: skip

        def made_from_data(self, args, kwargs):
            """(args, kwargs) with each real meta tensor replaced by a fake one, allocated now,
            and each real CPU tensor by a fake one (`on_host` made it: a GPU run copies it
            where it is used); None if there is none. Indexing with a Python list
            (`x[..., [-1]]`) makes its index tensor from data, like torch.tensor
            (make_choice_notes), on the meta device outside the fake mode, which then refuses
            it. On a GPU that tensor is a block on the device, allocated where it is made, just
            before its use."""
            found = []

            def fake(x):
                if (
                    isinstance(x, torch.Tensor)
                    and not isinstance(x, torch_private.FakeTensor)
                    and x.device.type in ("meta", "cpu")
                    and not self.tracer.real
                ):
                    on_device = x.device.type == "meta"
                    x = self.tracer.fake.from_tensor(x)
                    if on_device:
                        sid, nbytes = self.track(x)
                        self.events.append(("unseen", sid, nbytes))
                    found.append(x)
                return x

            made = tree_map(fake, (args, kwargs))
            return made if found else None

        def seeded(self, func, args, kwargs):
            """Random operators: values do not matter for memory, and a fake CUDA
            generator needs a CUDA build. In-place ones allocate nothing; the others'
            outputs get their shapes from the meta device."""
            if torch_private.schema_of(func).name.endswith("_"):
                return args[0]
            if "out" in kwargs:
                return kwargs["out"]

            def to_meta(x):
                if isinstance(x, torch.Tensor):
                    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
                if isinstance(x, torch.device):
                    return torch.device("meta")
                if isinstance(x, torch.Generator):
                    return None
                return x

            device = kwargs.get("device")
            if device is None:
                tensors = [x for x in tree_flatten(args)[0] if isinstance(x, torch.Tensor)]
                device = tensors[0].device if tensors else torch.device("cpu")
            with torch_private.unset_fake_temporarily():
                meta = func(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))
            on_host = host_outputs(func, args, kwargs)
            absent = absent_outputs(func, args, kwargs)

            def made(index, m):
                if not isinstance(m, torch.Tensor):
                    return m
                if index in absent:
                    return torch.empty(0, dtype=m.dtype, device=device)
                where = torch.device("cpu") if index in on_host else device
                return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=where)

            if isinstance(meta, tuple):
                return tuple(made(index, m) for index, m in enumerate(meta))
            return tree_map(lambda m: made(None, m), meta)

        def role(self) -> str:
            """Backward runs in autograd's own thread on a GPU: its cuBLAS handle, and
            workspaces, are not the caller's."""
            return AUTOGRAD if torch_private.autograd_node_running(torch) else CALLER

        def record(self, func, args, kwargs, out, facts=None, called=None, key=None) -> None:
            """The call as an event: its outputs' new storages and its signature. called,
            key: flatten((args, kwargs)) and call_key(...), where the caller has them."""
            facts = facts or self.facts(func)
            leaves, shape = called or flatten((args, kwargs))
            inputs = [x for x in leaves if isinstance(x, Tensor)]
            flat = flatten(out)[0]
            tensors = [x for x in flat if isinstance(x, Tensor)]
            on_target = self.on_target
            if not (any(map(on_target, inputs)) or any(map(on_target, tensors))):
                return  # host-only work: no device memory
            if not tensors and not facts.mutable:
                return  # metadata (prim.device, sizes, a kernel choice): nothing allocated
            name = facts.name
            for tensor in inputs:
                self.unseen(tensor, name)
            outputs = []
            for index, tensor in enumerate(flat):
                if isinstance(tensor, Tensor) and on_target(tensor):
                    new = self.track(tensor)
                    if new is not None:
                        outputs.append((index, *new))
            key, described, spec = key or self.call_key(facts, leaves, shape, (args, kwargs))
            signatures = self.tracer.trace.signatures
            entry = signatures.get(key)
            if entry is None:
                # A view, or an operator that only returns its inputs' storages: no kernel.
                alias = facts.view or (not facts.mutable and not outputs)
                entry = signatures[key] = Signature(name, func, described, spec, view=alias)
            entry.calls += 1
            op = OpCall(name, self.role(), key, tuple(outputs))
            self.events.append(("op", op))
            if facts.in_place_candidate and len(outputs) == 1 and outputs[0][0] == 0:
                self.in_place_in_a_real_run(op, args)

        def call_key(self, facts, leaves, shape, tree=None) -> tuple:
            """(signature_id of the call's text, its described leaves, its TreeSpec). The
            text, "name|described|spec", is made once per distinct call: later ones are
            found by the described leaves themselves and their types (1, 1.0 and True are
            equal keys of different texts), except where one equals zero (-0.0 == 0.0)."""
            spec, spec_text = self.specs.get(shape) or (None, None)
            if spec is None:
                spec = tree_flatten(tree)[1]
                spec_text = str(spec)
                if shape is not None:
                    self.specs[shape] = spec, spec_text
            described = [self.describe(x) for x in leaves]
            probe = None
            if 0.0 not in described:
                probe = (facts.name, spec_text, tuple(described), tuple(map(type, described)))
                key = self.probes.get(probe)
                if key is not None:
                    return key, described, spec
            text = f"{facts.name}|{described!r}|{spec_text}"
            key = self.keys.get(text)
            if key is None:
                key = self.keys[text] = signature_id(text)
            if probe is not None:
                self.probes[probe] = key
            return key, described, spec

        def describe(self, x):
            """describe(torch, x, self.target), a tensor's dtype and device worded once."""
            if type(x) is not FakeTensor:
                return describe(torch, x, self.target)
            known = self.described
            dtype, device = x.dtype, x.device
            worded = known.get(dtype)
            if worded is None:
                worded = known[dtype] = describe(torch, dtype, self.target)[1]
            where = known.get(device)
            if where is None:
                where = known[device] = describe(torch, device, self.target)[1]
            return tensor_description(x, worded, where)

        def in_place_in_a_real_run(self, op: OpCall, args) -> None:
            """A call that a real run makes in place (IN_PLACE_IN_A_REAL_RUN) shares its first
            argument's block, which lives as long as either does. For the engine's sum of
            gradients, only if that argument's storage dies with the call, which shows at the
            next poll (`poll`): then nothing else held it, the engine's condition."""
            first = args[0] if args else None
            if not isinstance(first, torch.Tensor) or not self.on_target(first):
                return
            storage = first.untyped_storage()
            if storage.nbytes() < op.outputs[0][2]:
                return  # the result does not fit where the first argument lives
            caller = cpp_caller(entry_point(op.name))
            if caller is None:
                self.tracer.trace.notes.setdefault(
                    f"{packet(op.name)} (in place)", UNREADABLE_CALLER
                )
                return
            condition = next(
                (
                    ops.get(op.name)
                    for name, ops in IN_PLACE_IN_A_REAL_RUN.items()
                    if caller.startswith(name + "(")
                ),
                None,
            )
            if condition is None:
                return
            if condition == "other":
                where = caller.split("(")[0]
                self.tracer.trace.notes.setdefault(f"{packet(op.name)} in {where}", OTHER_WAY)
                return
            if condition != "always" and torch.is_grad_enabled():
                return
            if condition == "gradient" and (
                torch_private.is_zero_tensor(first)
                or first.is_nested
                or not dense(first)
                # 2: `first` and `storage` here. A view holds its base, whose storage it shares.
                or torch_private.storage_use_count(torch, storage) != 2
            ):
                return
            entry = self.live.get(StorageWeakRef(storage).cdata)
            if entry is None:
                return
            if condition == "gradient":  # decided at the next poll
                self.pending_in_place = (op, entry[2])
            else:
                op.reuses = entry[2]

        def track(self, tensor):
            """(storage id, bytes) if the tensor's storage is new, else None."""
            storage = tensor.untyped_storage()
            ref = StorageWeakRef(storage)
            entry = self.live.get(ref.cdata)
            if entry is None:
                sid = next(self.ids)
                self.live[ref.cdata] = (ref, storage.nbytes(), sid, self.watch(storage, ref.cdata))
                return sid, storage.nbytes()
            if storage.nbytes() != entry[1]:  # resized in place: a new block, the old freed
                self.live[ref.cdata] = (entry[0], storage.nbytes(), entry[2], entry[3])
                self.events.append(("resize", entry[2], storage.nbytes()))
            return None

        def watch(self, storage, key: int):
            """A weak reference to the storage's Python object that reports `key` when the
            object goes: PyTorch keeps that object alive with the storage (it is the same one
            whichever tensor asks), so it goes when the storage's last reference does."""
            if self.scan:
                return None
            return weakref.ref(storage, lambda _, key=key: self.reported.append(key))

        def at_most(self, blocks: tuple, held_by=None) -> int:
            """Blocks a GPU may take here that the trace does not make, their sizes set by
            values it does not have: the most replay alone allocates them, and frees them
            with `held_by`'s storage (never, where it is not the device's), or at
            at_most_end(the token returned)."""
            self.poll()
            token = next(self.ids)
            sid = None
            if held_by is not None:
                entry = self.live.get(torch_private.storage_key(held_by.untyped_storage()))
                sid = -1 if entry is None else entry[2]
            self.events.append(("most", token, tuple(blocks), sid))
            return token

        def at_most_end(self, token: int) -> None:
            self.events.append(("most_end", token))

        def unseen(self, tensor, name: str) -> None:
            """A device storage no operator returned (made outside the dispatcher): allocated
            now, as far as the trace knows."""
            if not self.on_target(tensor):
                return
            storage = tensor.untyped_storage()
            if torch_private.storage_key(storage) in self.live:
                return
            sid, nbytes = self.track(tensor)
            self.events.append(("unseen", sid, nbytes))
            self.tracer.trace.notes.setdefault(
                UNSEEN,
                f"first seen as an input of {name}: when it was allocated is unknown",
            )

    return Recorder


def make_flatten(torch):
    """tree -> (torch.utils._pytree.tree_flatten(tree)[0], its shape), twice per operator
    call: the common trees (tuples, lists and dicts of tensors, numbers, None, dtypes,
    devices) read here, a tenth of pytree's time; any other type of node or leaf sends the
    whole tree to pytree, and its shape is None. The shape, hashable, is equal for two trees
    exactly where pytree's TreeSpecs are: the recorder makes a TreeSpec, and its text, once
    per shape."""
    containers = {tuple: tuple, list: list, dict: dict}
    leaf_types = (int, float, bool, complex, str, type(None), torch.dtype, torch.device,
                  torch.layout, torch.memory_format)  # fmt: skip
    kinds: dict = {}  # type -> "node", "leaf" or "other", as pytree sees it

    def kind(cls) -> str:
        found = kinds.get(cls)
        if found is None:
            if cls in containers and torch_private.is_pytree_node(cls):
                found = "node"
            elif torch_private.is_pytree_node(cls) or torch_private.is_namedtuple_class(cls):
                found = "other"
            elif cls in leaf_types or issubclass(cls, torch.Tensor):
                found = "leaf"
            else:
                found = "other"
            kinds[cls] = found
        return found

    class Other(Exception):
        pass

    def walk(tree, leaves: list):
        cls = type(tree)
        found = kinds.get(cls) or kind(cls)
        if found == "leaf":
            leaves.append(tree)
            return None
        if found != "node":
            raise Other
        children = tree.values() if cls is dict else tree
        shapes = []
        for child in children:  # a leaf told here, without a call (most children are)
            if (kinds.get(type(child)) or kind(type(child))) == "leaf":
                leaves.append(child)
                shapes.append(None)
            else:
                shapes.append(walk(child, leaves))
        if cls is dict:  # pytree's context: the keys, in order (typed: 1 and True differ)
            return cls, tuple((type(key), key) for key in tree), tuple(shapes)
        return cls, tuple(shapes)

    def flatten(tree) -> tuple:
        leaves: list = []
        try:
            shape = walk(tree, leaves)
        except Other:
            return torch_private.tree_flatten(tree)[0], None
        return leaves, shape

    return flatten


def dense(tensor) -> bool:
    """PyTorch's non-overlapping-and-dense: in some order of the dimensions (by stride, those
    of size 1 aside), each stride is the product of the sizes before it."""
    expected = 1
    for stride, size in sorted(
        (stride, size)
        for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
        if size != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def entry_point(name: str) -> str:
    """'aten.add.Tensor' -> 'at::_ops::add_Tensor::call', the C++ entry of an operator."""
    _, operator, overload = name.split(".")
    return f"at::_ops::{operator}{'' if overload == 'default' else '_' + overload}::call"


def cpp_caller(entry: str) -> str | None:
    """The C++ function that called the operator being dispatched, whose entry point is
    `entry` ("at::_ops::add_Tensor::call"), or None where the names cannot be read. Exported
    names are enough, and dladdr reads them a hundred times faster than addr2line."""
    try:
        frames = torch_private.cpp_frames()
    except Exception:  # a build without the unwinder: no names
        return None
    names = [frame["name"] for frame in frames if frame["name"] != "??"]
    calls = [i for i, name in enumerate(names) if name.startswith(entry + "(")]
    if not calls or calls[-1] + 1 == len(names):
        return None
    return names[calls[-1] + 1]


def tensor_description(x, dtype: str, where: str) -> tuple:
    """A tensor as describe() gives it, its dtype and device already worded."""
    nbytes = x.untyped_storage().nbytes()
    return ("tensor", dtype, tuple(x.shape), tuple(x.stride()), x.storage_offset(), nbytes, where)


def describe(torch, x, target):
    """An argument as a probe recreates it: tensors by dtype, shape, strides, offset, storage
    bytes and device ('device' for the traced one), everything else by value."""

    def where(device) -> str:
        same = device.type == target.type and device.index in (None, target.index)
        return "device" if same else device.type

    if isinstance(x, torch.Tensor):
        return tensor_description(x, str(x.dtype).removeprefix("torch."), where(x.device))
    if isinstance(x, torch.device):
        return ("device", where(x))
    if isinstance(x, torch.dtype):
        return ("dtype", str(x).removeprefix("torch."))
    if isinstance(x, (torch.memory_format, torch.layout)):
        return ("enum", str(x).removeprefix("torch."))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return ("unprobeable", type(x).__name__)


def run_trace(torch, device: str, drive, fake: bool = True, target=None) -> Trace:
    """drive(phase) runs the whole protocol, phase by phase. Exceptions that say the trace
    cannot follow the code stop it (Trace.stopped); any other exception propagates. target:
    the GPU (attention_choice.TargetGpu) whose kernel choices a meta trace makes; None: the
    meta device's own."""
    limits = torch_private.fake_tensor_limits()
    tracer = Tracer(torch, device, fake, target)
    try:
        with tracer:
            drive(tracer.phase)
    except limits as exc:
        func = getattr(exc, "func", None)
        where = f" at {func}" if func is not None else ""
        tracer.trace.stopped = (
            f"the trace cannot follow the code{where} ({type(exc).__name__}): the shapes or "
            "the operator depend on values or kernels a fake tensor does not have"
        )
    except TraceStopped as exc:
        tracer.trace.stopped = str(exc)
    return tracer.trace


# ---------------------------------------------------------------- calibration


@dataclasses.dataclass
class Calibration:
    """What each operator call allocates besides its outputs, in allocation order:
    ("output", flat index, bytes), ("internal", id, bytes), ("free", id) and
    ("persistent", bytes) for blocks it keeps (library workspaces)."""

    templates: dict = dataclasses.field(default_factory=dict)  # signature -> template
    output_only: set = dataclasses.field(default_factory=set)  # probed: outputs only, in order
    failed: dict = dataclasses.field(default_factory=dict)  # signature -> why
    workspaces_per_thread: bool | None = None
    source: str = "this process"
    # call_keys.form(...) -> template whose outputs take the call's own sizes (None)
    patterns: dict = dataclasses.field(default_factory=dict)
    # call_keys.rule_key(...) -> (template, the sizes it holds within)
    shape_rules: dict = dataclasses.field(default_factory=dict)
    # call_keys.rule_key(..., integers=False) -> ({number of blocks: template without
    # sizes}, domain): the blocks' sizes come from kernel_formulas, the outputs' from the call
    formula_rules: dict = dataclasses.field(default_factory=dict)
    # the GPU whose reduction kernel's scratch reduce_scratch works out (None: not known)
    reduce_device: reduce_scratch.Device | None = None
    # signature -> template, as `template` worked it out (a cache, not part of the value)
    resolved: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def known(self, signature: str, call: Signature | None = None) -> bool:
        return (
            signature in self.templates
            or signature in self.output_only
            or self.pattern(call) is not None
            or self.rule(call) is not None
            or self.reduction(call) is not None
        )

    def template(self, signature: str, call: Signature | None) -> list | None:
        """None: outputs only. Worked out once per signature: a prediction replays its trace
        a dozen times (other segment orders, bounds), and a rule's lookup is not free."""
        if signature not in self.resolved:
            self.resolved[signature] = self._template(signature, call)
        return self.resolved[signature]

    def _template(self, signature: str, call: Signature | None) -> list | None:
        """The first that knows the call: its probe, its pattern, a shape rule, a reduction's
        formula, a float16 product's borrowed pattern."""
        found = self.templates.get(signature)
        for lookup in (self.pattern, self.rule, self.reduction, self.fused_cell, self.borrowed):
            if found is not None:
                break
            found = lookup(call)
        return found or None

    def fused_cell(self, call: Signature | None) -> list | None:
        """A fused LSTM/GRU cell call's template, read from PyTorch's source (fused_cells):
        known where fused_cells.CLAIMED, else the central figure's only (the call uncovered)."""
        if call is None or call.name not in fused_cells.OPERATORS or call.spec is None:
            return None
        if self.reduce_device is None:
            return None
        arguments = call_arguments(call)
        return fused_cells.by_source_template(call.name, arguments, self.reduce_device)

    def borrowed(self, call: Signature | None) -> list | None:
        """A float16 matrix product that no probe ran: the pattern its form has in bfloat16
        and in float32, where both were probed and are the same. PyTorch keeps cuBLAS's and
        cuBLASLt's workspaces per (handle, stream) pair (CublasHandlePool.cpp), made by the
        first product on it whatever its dtype, and these patterns hold nothing else. Not
        `known`: the call stays uncovered (BORROWED), its least replay without the
        workspaces, its most with WORKSPACE_BOUND."""
        if call is None or not self.patterns:
            return None
        form = call_keys.form(call.name, call.leaves)
        if FLOAT16.search(form) is None or self.patterns.get(form) is not None:
            return None
        bf16, fp32 = (self.patterns.get(FLOAT16.sub(dtype, form)) for dtype in DONORS)
        return self.with_operand_copies(call, bf16) if bf16 is not None and bf16 == fp32 else None

    def reduction(self, call: Signature | None) -> list | None:
        """A call's blocks by PyTorch's own code, on this GPU: a reduction by its kernel's
        arithmetic (reduce_scratch), an embedding's backward over few indices, a scan."""
        if call is None or self.reduce_device is None or call.spec is None or call.func is None:
            return None
        if call.name == EMBEDDING_BACKWARD:
            return embedding_backward_template(call_arguments(call))
        if call.name == CUMSUM:
            return cumsum_template(call_arguments(call))
        if call.name in BY_SOURCE:
            return by_source_template(call.name, call_arguments(call), list(call.leaves))
        if call.name in fused_cells.OPERATORS:
            return self.fused_cell(call) if fused_cells.CLAIMED else None
        if call.name in fused_optimizers.OPERATORS:
            return fused_optimizers.template(call.name)
        if call.name in bnb_kernels.OPERATORS:
            return bnb_kernels.template(call.name)
        found = reduce_scratch.template_of_call(call.name, call_arguments(call), self.reduce_device)
        return None if found is None else [template_step(step) for step in found]

    def rule(self, call: Signature | None) -> list | None:
        """The template of the shape rule that covers this call (call_keys), or None."""
        if call is None:
            return None
        found = self.shape_rules.get(call_keys.rule_key(call.name, call.leaves))
        if found is not None and call_keys.within(found[1], call.leaves):
            return found[0]
        return self.formula_rule(call)

    def formula_rule(self, call: Signature) -> list | None:
        found = self.formula_rules.get(call_keys.rule_key(call.name, call.leaves, False))
        if found is None or not call_keys.within(found[1], call.leaves):
            return None
        sizes = kernel_formulas.internal_sizes(call.name, list(call.leaves))
        steps = None if sizes is None else found[0].get(len(sizes))
        if steps is None:
            return None
        fill = iter(sizes)
        return [(kind, index, next(fill)) if kind == "internal" else (kind, index, *rest)
                for kind, index, *rest in steps]  # fmt: skip

    def pattern(self, call: Signature | None) -> list | None:
        """A matrix product's pattern, with the copies of operands cuBLAS cannot read where
        they lie (cublas_operands); None where those are not known."""
        if call is None or not self.patterns:
            return None
        found = self.patterns.get(call_keys.form(call.name, call.leaves))
        return self.with_operand_copies(call, found)

    def with_operand_copies(self, call: Signature, found: list | None) -> list | None:
        if found is None:
            return None
        if call.spec is not None and call.func is not None:
            arguments = call_arguments(call)
        else:  # a signature without its call's structure: the leaves in the schema's order
            names = cublas_operands.POSITIONS.get(call.name, ())
            arguments = dict(zip(names, call.leaves, strict=False))
        made = cublas_operands.copies(call.name, arguments)
        return None if made is None else cublas_operands.with_copies(found, made)

    def to_json(self, trace: Trace | None = None) -> dict:
        names = trace.signatures if trace is not None else {}

        def op(key):
            return names[key].name if key in names else None

        return {
            "method": (
                "after the phases, in the same process: each distinct operator call of the "
                "trace (its shapes, strides and arguments), foreach kernels excepted, run "
                "once on fresh tensors after torch._C._cuda_clearCublasWorkspaces(), with "
                "torch.cuda.memory._record_memory_history; what it allocated besides its "
                "outputs, in order, and what it kept"
            ),
            "operators": [
                {
                    "op": op(key),
                    "signature": key,
                    "template": [template_entry(step) for step in template],
                }
                for key, template in sorted(self.templates.items())
            ],
            "output_only": sorted(self.output_only),
            "failed": [
                {"op": op(key), "signature": key, "error": why}
                for key, why in sorted(self.failed.items())
            ],
            "workspaces_per_thread": self.workspaces_per_thread,
        }

    @classmethod
    def from_json(cls, document: dict, source: str) -> Calibration:
        section = document["calibration"]
        templates = {
            entry["signature"]: [template_step(step) for step in entry["template"]]
            for entry in section["operators"]
        }
        return cls(
            templates=templates,
            output_only=set(section["output_only"]),
            failed={entry["signature"]: entry["error"] for entry in section["failed"]},
            workspaces_per_thread=section["workspaces_per_thread"],
            source=source,
        )


def template_entry(step: tuple) -> dict:
    kind = step[0]
    if kind == "output":
        return {"kind": kind, "index": step[1], "bytes": step[2]}
    if kind == "internal":
        return {"kind": kind, "id": step[1], "bytes": step[2]}
    if kind == "free":
        return {"kind": kind, "id": step[1]}
    return {"kind": kind, "bytes": step[1]}


def template_step(entry: dict) -> tuple:
    kind = entry["kind"]
    if kind == "output":
        return (kind, entry["index"], entry["bytes"])
    if kind == "internal":
        return (kind, entry["id"], entry["bytes"])
    if kind == "free":
        return (kind, entry["id"])
    return (kind, entry["bytes"])


def template_from_history(events: list[dict], outputs: dict[int, int]) -> list[tuple]:
    """One probe's allocator history -> its template. outputs: data pointer -> flat index.
    An output's block is the last one allocated at its address (a scratch block freed
    earlier may have had the same address)."""
    last_at = {}
    for position, event in enumerate(events):
        if event["action"] == "alloc" and event["addr"] in outputs:
            last_at[event["addr"]] = position
    template: list[tuple] = []
    internal: dict[int, int] = {}  # address -> id while allocated
    ids = itertools.count()
    for position, event in enumerate(events):
        action, address = event["action"], event["addr"]
        if action == "alloc" and last_at.get(address) == position:
            template.append(("output", outputs[address], event["size"]))
        elif action == "alloc":
            internal[address] = next(ids)
            template.append(("internal", internal[address], event["size"]))
        elif action == "free_completed" and address in internal:
            template.append(("free", internal.pop(address)))
    kept = set(internal.values())
    return [
        ("persistent", step[2]) if step[0] == "internal" and step[1] in kept else step
        for step in template
    ]


def plain(template: list[tuple]) -> bool:
    """Outputs only, in the order the operator returns them."""
    indexes = [step[1] for step in template if step[0] == "output"]
    return all(step[0] == "output" for step in template) and indexes == sorted(indexes)


def probe_operators(torch, device, trace: Trace) -> Calibration:
    """Run each distinct operator call of the trace once on the GPU (see the module's
    docstring). A probe that fails leaves its operator uncalibrated, with the reason."""
    calibration = Calibration()
    calibration.workspaces_per_thread = probe_workspace_threads(torch, device)
    for key, signature in trace.signatures.items():
        if signature.view or signature.name.startswith(NOT_PROBED_PREFIX):
            continue
        try:
            template = probe(torch, device, signature)
        except torch.cuda.OutOfMemoryError:
            calibration.failed[key] = "out of memory while probing"
        except Exception as exc:  # an operator the probe cannot recreate or run alone
            first = (str(exc).strip().splitlines() or [""])[0][:160]  # its first line, said
            why = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            calibration.failed[key] = f"probe failed ({why})"
        else:
            if plain(template):
                calibration.output_only.add(key)
            else:
                calibration.templates[key] = template
        finally:
            stop_history(torch)
    return calibration


def probe(torch, device, signature: Signature) -> list[tuple]:
    args, kwargs = torch_private.tree_unflatten(
        [rebuild(torch, device, leaf) for leaf in signature.leaves], signature.spec
    )
    args = cudnn_rnn.probe_arguments(torch, signature.name, args)
    clear = torch_private.cublas_workspace_clearer(torch)
    torch.cuda.synchronize(device)
    if clear is not None:
        clear()
    start_history(torch)
    before = len(history_events(torch, device))
    with torch.no_grad():
        out = signature.func(*args, **kwargs)
    torch.cuda.synchronize(device)
    events = history_events(torch, device)[before:]
    stop_history(torch)
    outputs = {}
    for index, tensor in enumerate(torch_private.tree_flatten(out)[0]):
        if isinstance(tensor, torch.Tensor) and tensor.device == device:
            outputs.setdefault(tensor.untyped_storage().data_ptr(), index)
    return template_from_history(events, outputs)


def rebuild(torch, device, leaf):
    if not isinstance(leaf, tuple):
        return leaf
    kind = leaf[0]
    if kind == "tensor":
        _, dtype, shape, stride, offset, nbytes, where = leaf
        dtype = getattr(torch, dtype)
        place = device if where == "device" else torch.device(where)
        size = torch.empty(0, dtype=dtype).element_size()
        base = torch.zeros(-(-nbytes // size), dtype=dtype, device=place)
        return base.as_strided(shape, stride, offset)
    if kind == "device":
        return device if leaf[1] == "device" else torch.device(leaf[1])
    if kind == "dtype":
        return getattr(torch, leaf[1])
    if kind == "enum":
        return getattr(torch, leaf[1])
    raise ValueError(f"cannot recreate a {leaf[1]} argument")


HISTORY_ENTRIES = 1_000_000  # events the allocator keeps; past them it drops the oldest


def start_history(torch, stacks: bool = False) -> None:
    """The allocator's history of allocations and frees, without stack traces; with
    `stacks`, each allocation's C++ and Python frames (history_check names the C++ function
    of the first difference from them)."""
    context = {"context": "alloc", "stacks": "all"} if stacks else {"context": None}
    try:
        torch_private.record_memory_history(
            torch, enabled="all", max_entries=HISTORY_ENTRIES, clear_history=True, **context
        )
    except TypeError:  # a PyTorch without clear_history: callers count the events before
        torch_private.record_memory_history(torch, enabled="all", **context)


def stop_history(torch) -> None:
    torch_private.stop_memory_history(torch)


def segment_ranks(events: list[dict]):
    """From an allocator history (`device_traces[i]`): the rank of the n-th segment created
    by the driver's own addresses, for replay(segment_rank=...). A replay under it checks
    that the address order, and nothing else, is what a prediction missed."""
    addresses = [event["addr"] for event in events if event["action"] == "segment_alloc"]
    order = {address: rank for rank, address in enumerate(sorted(addresses))}
    return lambda n: order[addresses[n]] if n < len(addresses) else n  # more: above them


def history_events(torch, device) -> list[dict]:
    return torch_private.memory_snapshot(torch)["device_traces"][device.index]


def probe_workspace_threads(torch, device) -> bool | None:
    """Does autograd's thread keep library workspaces of its own? A matrix product in the
    caller's thread, then one in backward, after the workspaces were cleared: kept blocks
    that backward added, other than the gradient, say yes."""
    clear = torch_private.cublas_workspace_clearer(torch)
    if clear is None:
        return None
    try:
        a = torch.ones(64, 64, device=device, requires_grad=True)
        b = torch.ones(64, 64, device=device)
        torch.cuda.synchronize(device)
        clear()
        start_history(torch)
        start = len(history_events(torch, device))
        y = a @ b
        torch.cuda.synchronize(device)
        forward = len(history_events(torch, device))
        y.sum().backward()
        torch.cuda.synchronize(device)
        events = history_events(torch, device)[start:]
        forward -= start
        stop_history(torch)
        tensors = {y.untyped_storage().data_ptr(), a.grad.untyped_storage().data_ptr()}
    except Exception:  # an unknown answer, said as such
        stop_history(torch)
        return None
    before = kept_blocks(events[:forward])
    added = {block for block in kept_blocks(events) - before if block[0] not in tensors}
    return bool(added)


def kept_blocks(events: list[dict]) -> set:
    alive: dict = {}
    for event in events:
        if event["action"] == "alloc":
            alive[event["addr"]] = event["size"]
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    return set(alive.items())


# ---------------------------------------------------------------- replay and assessment


@dataclasses.dataclass
class Prediction:
    status: PredictionStatus
    rows: list
    unknown: list  # [{"op", "calls", "why"}]
    log: list  # the replayed allocations and frees, to compare with a GPU's history
    reason: str | None = None
    mismatches: dict = dataclasses.field(default_factory=dict)
    address_orders: dict | None = None  # {"orders": n, "largest_difference_bytes": {...}}
    bounds: list | None = None  # per row: {counter: (lower, upper)} for the peak counters
    unbounded: str | None = None  # why an approximate prediction has no bounds


def predict(trace: Trace, calibration: Calibration | None = None) -> Prediction:
    """The six counters of every traced phase, and how far they can be trusted."""
    if trace.stopped is not None:
        return Prediction(PredictionStatus.NOT_PREDICTED, [], [], [], reason=trace.stopped)
    allocator = DriverOrder()
    rows, log, mismatches, per_thread_used = replay(trace, calibration, allocator=allocator)
    unknown = assess(trace, calibration, mismatches, per_thread_used)
    spread = address_order_spread(trace, calibration, rows, allocator.address_choice)
    if any(spread.values()):
        unknown.append({"op": ADDRESS_ORDER, "calls": 0, "why": address_order_why(spread)})
    prediction = Prediction(
        PredictionStatus.APPROXIMATE if unknown else PredictionStatus.EXACT,
        rows,
        unknown,
        log,
        mismatches=mismatches,
        address_orders={"orders": len(OTHER_ADDRESS_ORDERS), "largest_difference_bytes": spread},
    )
    if unknown:
        prediction.bounds, prediction.unbounded = bounds(trace, calibration, rows, spread, unknown)
    return prediction


# Other orders of the segments' addresses to replay under (RankedSegments), besides the
# central one (DriverOrder): the plain order (a later segment above an earlier), the
# reverse, then seeded shuffles. Each is a function of the segment's
# creation index (the same index always gets the same rank, in one replay).
def shuffled(seed: int):
    ranks: dict = {}
    generator = random.Random(seed)
    return lambda n: ranks.setdefault(n, generator.getrandbits(40))


OTHER_ADDRESS_ORDERS = (
    lambda: lambda n: n,
    lambda: lambda n: -n,
    *(lambda s=s: shuffled(s) for s in range(1, 8)),
)
ADDRESS_ORDER = "segment address order"


def address_order_spread(
    trace: Trace, calibration, rows: list[dict], address_choice: bool = True
) -> dict:
    """Per counter, the largest difference from `rows` over the replays under other orders
    of the segments' addresses. Zero everywhere: the order, which only the driver knows,
    does not matter to this workload. Without an `address_choice` in the replay of `rows`
    (IndexedAllocator), every other order makes the same choices: zero, without replaying."""
    spread = dict.fromkeys(phase_protocol.COUNTER_KEYS, 0)
    orders = range(len(OTHER_ADDRESS_ORDERS)) if address_choice else ()
    forked = len(trace.events) >= FORKED_REPLAYS
    for other in side_by_side(partial_replay, (trace, calibration), orders, forked):
        for row, alternative in zip(rows, other, strict=True):
            for key in spread:
                spread[key] = max(spread[key], abs(alternative[key] - row[key]))
    return spread


def partial_replay(trace: Trace, calibration, order: int) -> list[dict]:
    """The rows of the replay under OTHER_ADDRESS_ORDERS[order], without its log."""
    return replay(trace, calibration, OTHER_ADDRESS_ORDERS[order](), logged=False)[0]


# Events from which the other orders' replays go to forked workers: below, a replay takes
# about as long as forking a process (a 1B-class decoder's 16 tokens make 20,000 events; the
# 8B-class estimate's 128 tokens, hundreds of thousands).
FORKED_REPLAYS = 50_000

# What side_by_side's forked workers read: set just before they are forked, so that they
# inherit it instead of receiving the trace (hundreds of thousands of events) by pickle.
_SHARED: tuple = ()


def _shared_call(item):
    function, arguments = _SHARED
    return function(*arguments, item)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return 1


def side_by_side(function, arguments: tuple, items, forked: bool = True) -> list:
    """[function(*arguments, item) for item in items], in that order, computed by workers
    forked from this process where it may fork and more than one CPU is usable: the
    replays are independent, pure Python and each as long as the central one. Elsewhere,
    not `forked`, or for fewer than two items, one after the other here."""
    global _SHARED
    import multiprocessing

    items = list(items)
    workers = min(usable_cpus(), len(items)) if forked else 1
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [function(*arguments, item) for item in items]
    _SHARED = (function, arguments)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return pool.map(_shared_call, items, chunksize=1)
    finally:
        _SHARED = ()


def address_order_why(spread: dict) -> str:
    largest = max(spread.values())
    counters = ", ".join(key.removesuffix("_bytes") for key, value in spread.items() if value)
    return (
        f"among free blocks of one size the allocator takes the lowest address, and the "
        f"driver's addresses of its segments are not known: replayed under "
        f"{len(OTHER_ADDRESS_ORDERS)} other orders of them, the counters move by up to "
        f"{largest:,} bytes ({counters}); the real order may move them further"
    )


class IndexedAllocator(allocator_model.AllocatorModel):
    """allocator_model.AllocatorModel, choice for choice and counter for counter, with its
    free blocks kept sorted by (size, address, when freed) in one list per pool: the model
    scans every free block at every allocation, which an 8B-class trace, replayed ten times,
    asks a few hundred thousand times. The third key, a count, keeps the keys distinct (two
    segments of one rank would give blocks of one size and address), so that blocks
    themselves are never compared.

    It also notes whether any allocation chose among free blocks of its size in different
    segments (`address_choice`): if none did, no order of the segments' addresses can change
    a choice, and so no counter (`address_order_spread`).

    Beside the counters it keeps the bytes the live blocks were asked for, each request
    rounded to 512 (`requested`), and each phase's peak of them (`peaks_requested`): a block
    may be larger than its request by a rest the allocator does not split off, which
    depends on where blocks land, so only these bytes are sure to be allocated."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = self.peak_requested = 0
        self.peaks_requested: list[int] = []
        self.pools: dict = {False: [], True: []}  # small -> sorted [(size, address, n, block)]
        self.listed = itertools.count()
        self.made = itertools.count()  # segments, for address_choice
        self.address_choice = False

    def _list(self, block: dict) -> None:
        block["key"] = key = (block["size"], block["address"], next(self.listed), block)
        bisect.insort(self.pools[block["small"]], key)

    def _unlist(self, block: dict) -> None:
        pool = self.pools[block["small"]]
        del pool[bisect.bisect_left(pool, block["key"])]

    def _take(self, size: int, small: bool) -> dict | None:
        pool = self.pools[small]
        at = bisect.bisect_left(pool, (size,))
        if at == len(pool):
            return None
        block = pool.pop(at)[3]
        if not self.address_choice:
            for other in itertools.islice(pool, at, None):
                if other[0] != block["size"]:
                    break
                if other[3]["segment"] != block["segment"]:
                    self.address_choice = True
                    break
        return block

    def _new_segment(self, size: int, small: bool) -> dict:
        block = super()._new_segment(size, small)
        block["segment"] = next(self.made)  # its split-off tails carry it too
        return block

    def malloc(self, nbytes: int):
        block = super().malloc(nbytes)
        if block is not None:
            block["requested"] = size = allocator_model.block_bytes(nbytes)
            self.requested += size
            self.peak_requested = max(self.peak_requested, self.requested)
        return block

    def reset_peaks(self) -> None:
        super().reset_peaks()
        self.peak_requested = self.requested

    def end_phase(self) -> None:
        self.peaks_requested.append(self.peak_requested)

    def free(self, block) -> None:
        if block is not None:
            self.requested -= block["requested"]
        super().free(block)


class DriverOrder(IndexedAllocator):
    """The central replay: each new segment where segment_order's model of the driver puts
    it, from a start with no holes. Not exact for a measurement process, but closer than
    the plain order: of the 14 points of runs/20261204T174000Z-hf-zoo-blind-rules whose
    counters depend on the order, 8 replay to the byte under it, 3 under the plain order,
    which stays among the other orders (`address_order_spread`)."""

    def __init__(self) -> None:
        super().__init__()
        self.driver = segment_order.Driver(segment_order.Start(holes=()))

    def segment_address(self, size: int) -> int:
        return self.driver.place(size)


class RankedSegments(IndexedAllocator):
    """The allocator model with the n-th segment it creates (from 0) at rank segment_rank(n)
    among the segments' addresses. Among free blocks of one size the allocator takes the
    lowest address; inside a segment that order is known, between segments it is the
    driver's, which no model has (the plain model puts a later segment above an earlier)."""

    SPAN = 2**60  # rank r's segment starts at r * 2**60: segments never touch

    def __init__(self, segment_rank) -> None:
        super().__init__()
        self.segment_rank = segment_rank
        self.segments = 0

    def malloc(self, nbytes: int):
        """segment_rank is asked at every call, for the segment this call may make."""
        reserved = self.reserved
        self.next_address = self.segment_rank(self.segments) * self.SPAN
        block = super().malloc(nbytes)
        self.segments += self.reserved != reserved
        return block


def replay(
    trace: Trace,
    calibration: Calibration | None,
    segment_rank=None,
    scenario=None,
    allocator: IndexedAllocator | None = None,
    logged: bool = True,
):
    """Returns (rows, log, mismatches, whether autograd's thread used kept blocks); with
    `segment_rank`, under that order of the segments' addresses (RankedSegments); with
    `scenario` (Scenario), the least or the most the unknowns can take (`bounds`). An
    `allocator` given (a fresh one) is the one replayed through, for its `address_choice`.
    Not `logged`: the log stays empty (the replays whose rows alone are read)."""
    if allocator is None:
        allocator = DriverOrder() if segment_rank is None else RankedSegments(segment_rank)
    blocks: dict = {}  # storage id -> block
    kept: set = set()  # the persistent blocks already allocated, by thread and size
    per_thread = calibration is None or calibration.workspaces_per_thread is not False
    events = trace.events
    if scenario is not None:
        if calibration is None or calibration.workspaces_per_thread is None:
            per_thread = scenario.upper
        if scenario.upper:
            events = unseen_first(events)
    rows: list[dict] = []
    log: list[tuple] = []
    mismatches: dict = {}
    autograd_kept = False
    row: dict = {}
    templates: dict = {}  # signature -> its template: a pattern's lookup is not free

    allocate, deallocate = allocator.malloc, allocator.free

    def malloc(nbytes: int, what: str):
        if logged:
            log.append(("alloc", nbytes, what))
        return allocate(nbytes)

    def free(block, nbytes: int, what: str) -> None:
        if logged and block is not None:
            log.append(("free", nbytes, what))
        deallocate(block)

    sharing: dict = {}  # id of a (block, bytes) entry -> storages that share it, where several
    tied: dict = {}  # a storage id, or an at_most token -> the blocks the most replay added

    def release(entry: tuple, what: str) -> None:
        """A storage's end: its block is freed with the last storage that shares it."""
        count = sharing.pop(id(entry), 1) - 1
        if count:
            sharing[id(entry)] = count
        else:
            free(entry[0], entry[1], what)

    for event in events:
        kind = event[0]
        if kind == "start":
            _, name, repetition, passes = event
            row = {"phase": name}
            if repetition is not None:
                row["repetition"] = repetition
            row["passes"] = passes
            row["baseline_allocated_bytes"] = allocator.allocated
            row["baseline_reserved_bytes"] = allocator.reserved
            allocator.reset_peaks()
            log.append(("phase", 0, name))
        elif kind == "end":
            row["allocated_bytes"] = allocator.allocated
            row["reserved_bytes"] = allocator.reserved
            row["peak_allocated_bytes"] = allocator.peak_allocated
            row["peak_reserved_bytes"] = allocator.peak_reserved
            allocator.end_phase()
            rows.append(row)
        elif kind == "free":
            entry = blocks.pop(event[1], None)
            if entry is not None:
                release(entry, "storage")
            for block, nbytes in reversed(tied.pop(event[1], ())):
                free(block, nbytes, "at most")
        elif kind == "most":  # the most replay's alone (Recorder.at_most)
            if scenario is not None and scenario.upper:
                held = [(malloc(nbytes, "at most"), nbytes) for nbytes in event[2] if nbytes]
                tied.setdefault(event[1] if event[3] is None else event[3], []).extend(held)
        elif kind == "most_end":
            for block, nbytes in reversed(tied.pop(event[1], ())):
                free(block, nbytes, "at most")
        elif kind == "unseen":
            blocks[event[1]] = (malloc(event[2], "unseen storage"), event[2])
        elif kind == "resize":
            old = blocks.pop(event[1], None)
            blocks[event[1]] = (malloc(event[2], "resize"), event[2])
            if old is not None:
                release(old, "resize")
        else:
            op = event[1]
            if op.reuses in blocks:  # made in place by a real run: one block, two storages
                ((_, sid, _),) = op.outputs
                blocks[sid] = blocks[op.reuses]
                sharing[id(blocks[sid])] = sharing.get(id(blocks[sid]), 1) + 1
                continue
            template = None
            if calibration:
                template = templates.get(op.signature, templates)
                if template is templates:
                    template = templates[op.signature] = calibration.template(
                        op.signature, trace.signatures.get(op.signature)
                    )
            uncertain = scenario is not None and op.signature in scenario.uncertain
            wide = scenario.wider.get(op.signature, {}) if scenario and scenario.upper else {}
            if uncertain and template is not None and not scenario.upper:
                template = [step for step in template if step[0] == "output"]
            if template is None and not uncertain:  # outputs only, by index (`record`'s order)
                for index, sid, nbytes in sorted(op.outputs):
                    nbytes += wide.get(index, 0) if nbytes else 0
                    blocks[sid] = (malloc(nbytes, op.name), nbytes)
                continue
            pending = {index: (sid, nbytes) for index, sid, nbytes in op.outputs}
            scratch: dict = {}
            seen_sizes: dict = {}
            for step in template or ():
                if step[0] == "output" and step[1] in pending:
                    sid, nbytes = pending.pop(step[1])
                    if step[2] is not None and nbytes != step[2]:  # None: a pattern's
                        slack = cudnn_rnn.output_slack(op.name).get(step[1], 0)
                        if 0 < step[2] - nbytes <= slack:
                            nbytes = step[2]  # a size the trace knows within slack: the probe's
                        else:
                            mismatches.setdefault(op.name, f"output {step[1]}: traced {nbytes} B")
                    nbytes += wide.get(step[1], 0) if nbytes else 0
                    blocks[sid] = (malloc(nbytes, op.name), nbytes)
                elif step[0] == "output":
                    mismatches.setdefault(op.name, f"output {step[1]} is not new in the trace")
                elif step[0] == "internal":
                    scratch[step[1]] = (malloc(step[2], f"{op.name} scratch"), step[2])
                elif step[0] == "free":
                    block, nbytes = scratch.pop(step[1])
                    free(block, nbytes, f"{op.name} scratch")
                else:
                    nth = seen_sizes[step[1]] = seen_sizes.get(step[1], 0) + 1
                    key = (op.role if per_thread else CALLER, step[1], nth)
                    if key not in kept:
                        kept.add(key)
                        autograd_kept |= op.role == AUTOGRAD
                        malloc(step[1], f"{op.name} kept (library workspace)")
            for index, (sid, nbytes) in sorted(pending.items()):
                if template is not None and nbytes:  # an empty tensor takes no block
                    mismatches.setdefault(op.name, f"output {index} not allocated by the probe")
                nbytes += wide.get(index, 0) if nbytes else 0
                blocks[sid] = (malloc(nbytes, op.name), nbytes)
            if uncertain and scenario.upper:  # the most its kernel may add, with its outputs
                key = (op.role if per_thread else CALLER, "workspace bound")
                if key not in kept:
                    kept.add(key)
                    malloc(WORKSPACE_BOUND, f"{op.name} library workspace, at most")
                held = [
                    (malloc(nbytes, f"{op.name} scratch, at most"), nbytes)
                    for nbytes in scenario.uncertain[op.signature]
                    if nbytes
                ]
                for block, nbytes in reversed(held):
                    free(block, nbytes, op.name)
    return rows, log, mismatches, autograd_kept


# ---------------------------------------------------------------- bounds

# What an approximate prediction's bounds assume of the blocks nobody measured, from every
# operator probed on a GPU so far (tests/test_prediction_bounds.py checks it against the
# committed probes): an operator's scratch, alive together with its outputs, is at most
# SCRATCH_FACTOR times the bytes of its device inputs and outputs (the largest seen: a
# reduction's float buffers, 4 times a bfloat16 input), and the libraries it calls keep at
# most WORKSPACE_BOUND per thread (cuBLAS and cuBLASLt keep 33 MiB on an H200).
SCRATCH_FACTOR = 8
WORKSPACE_BOUND = 64 * 2**20
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
UNSEEN = "device storage made outside the dispatcher"
AUTOGRAD_THREAD = "autograd thread"
BOUNDS_METHOD = (
    "the trace replayed twice more: the least (operators not covered allocate their outputs "
    "only, a storage made outside the dispatcher appears where first used, workspaces "
    "shared by the threads) and the most (each such operator adds a library workspace of "
    f"{WORKSPACE_BOUND // 2**20} MiB per thread once, and scratch of {SCRATCH_FACTOR} times "
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


def unseen_first(events: list) -> list:
    """The events with every storage made outside the dispatcher allocated before all else:
    the earliest it can have been made."""
    early = [event for event in events if event[0] == "unseen"]
    return early + [event for event in events if event[0] != "unseen"]


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
        or op in (ADDRESS_ORDER, UNSEEN, AUTOGRAD_THREAD, from_pretrained.LOAD_THREADS)
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
    floor = DriverOrder()
    least = replay(
        trace, calibration, scenario=Scenario(False, uncertain), allocator=floor, logged=False
    )[0]
    most = replay(trace, calibration, scenario=Scenario(True, uncertain, wider), logged=False)[0]
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


def prediction_rows(prediction: Prediction) -> list[dict]:
    keys = ("phase", "repetition", "passes", *phase_protocol.COUNTER_KEYS)
    return [{key: row[key] for key in keys if key in row} for row in prediction.rows]


def prediction_record(trace: Trace, prediction: Prediction, calibration_source: str | None) -> dict:
    """What every measurement and estimate file says of its prediction (one record for every
    workload): the claim, what it does not know, the trace, the rows, the bounds."""
    rows = prediction_rows(prediction)
    record = {
        "status": prediction.status,
        "unknown": prediction.unknown,
        "method": METHOD,
        "trace": {
            "torch": trace.torch_version,
            "build": trace.build,
            "device": trace.device,
            "operator_calls": trace.operator_calls,
            "distinct_calls": len(trace.signatures),
        },
        "calibration": calibration_source,
        "phases": rows,
        "largest_peak_allocated_bytes": max(
            (r["peak_allocated_bytes"] for r in rows), default=None
        ),
        "largest_peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in rows), default=None),
    }
    if prediction.address_orders is not None:
        record["address_orders"] = prediction.address_orders
    if prediction.bounds is not None:
        record["bounds"] = {
            "method": BOUNDS_METHOD,
            "phases": [
                {
                    **{key: row[key] for key in ("phase", "repetition") if key in row},
                    **{key: {"lower": low, "upper": high} for key, (low, high) in found.items()},
                }
                for row, found in zip(rows, prediction.bounds, strict=True)
            ],
        }
    if prediction.unbounded is not None:
        record["unbounded"] = prediction.unbounded
    if prediction.reason is not None:
        record["reason"] = prediction.reason
    return record
