"""What is known of operators without a GPU: those whose CUDA kernels allocate their
outputs and nothing else (`OUTPUT_ONLY`, the reductions by their own arithmetic), the blocks
some allocate besides, by PyTorch's source (`BY_SOURCE`, the embedding's backward, cumsum),
those whose scratch depends on values (`VALUE_DEPENDENT`), the calls PyTorch's C++ makes in
place in a real run and out of place under a dispatch mode (`IN_PLACE_IN_A_REAL_RUN`), and the
reasons a prediction names for what it does not know.

Standard library at module level: torch is imported by the functions that need it."""

from __future__ import annotations

import itertools
import math

from pipeline.core import call_keys, torch_private
from pipeline.predicting import fast_paths, grad_scaler, nll_loss, reduce_scratch
from pipeline.predicting.trace.model import packet

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
UNSEEN = "device storage made outside the dispatcher"
