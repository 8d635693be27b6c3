"""What a GPU run does that the trace on the meta device would not on its own: the ways
PyTorch's Python takes on a GPU (dropout, batch norm through cuDNN, scaled_dot_product_attention's
kernel), the calls whose value-dependent selection a dispatch mode changes, the outputs a CUDA
kernel leaves on the host or does not make, and the operators FakeTensorMode decomposes.

Standard library at module level: torch is imported by the functions that need it (or passed
in)."""

from __future__ import annotations

import math
import sys

from pipeline.core import torch_private
from pipeline.predicting.trace.model import Trace
from pipeline.predicting.trace.operators import META_CHOICES


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
