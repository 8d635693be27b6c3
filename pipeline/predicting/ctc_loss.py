"""nn.CTCLoss and F.ctc_loss as a GPU runs them, for the trace.

The loss sizes its blocks by the lengths' values: its forward keeps `log_alpha`, batch x
input length x (2 x the longest target + 1) elements, for the backward. On fake tensors
PyTorch's composite `ctc_loss` also takes another way than on a GPU's plain tensors (a
tensor subclass keeps the lengths as tensors), and `_ctc_loss` has no fake kernel. Where the
lengths are Python numbers, or CPU tensors the trace computes for real (a data loader makes
them so: `torch.full`, `torch.tensor`), the trace runs what a GPU runs for plain tensors,
operator by operator, so that each block the GPU makes is one of the trace's:

- the choice of kernel (`ctc_loss` in aten/src/ATen/native/LossCTC.cpp, `_use_cudnn_ctc_loss`
  in native/cudnn/LossCTC.cpp): cuDNN's for float32 log-probabilities with int32 targets,
  blank 0 and short targets, PyTorch's own kernel otherwise;
- PyTorch's kernel (native/cuda/LossCTC.cu): the targets copied to the device as int64
  where they are not already; in the forward, the target and input lengths and the batch
  offsets copied to the device, then `log_alpha` and the loss per sequence, the three copies
  freed; in the backward, the same three copies, `log_beta` as large as `log_alpha`, and
  the gradient; past a size (`large`) the gradient of the blanks is computed with ATen
  operators, a sum over `log_alpha + log_beta` (their `logsumexp`) among them;
- the reduction: per-sequence losses divided by the target lengths (copied to the device)
  and averaged, or summed.

cuDNN's CTC loss takes a workspace whose size the lab has never measured: "not predicted",
in one line that says so, and `measure` measures it. Lengths computed from device tensors
(`mask.sum(-1)`) have no values in the trace: "not predicted" too.
"""

from __future__ import annotations

import functools
import math

from pipeline.core import torch_private
from pipeline.predicting import packed_sequences

NO_VALUES = (
    "the trace cannot follow the code at ctc_loss: the lengths' values come from tensors it "
    "has no values of (made on the GPU, or from one); lengths made on the CPU from numbers, "
    "as a data loader makes them, are followed"
)
CUDNN = (
    "the trace cannot follow the code at ctc_loss: a GPU takes cuDNN's CTC loss here "
    "(float32 log-probabilities, int32 targets, blank 0, targets shorter than 256), whose "
    "workspace the lab has never measured; int64 targets take PyTorch's own kernel, which "
    "is followed"
)
PARAMETERS = ("log_probs", "targets", "input_lengths", "target_lengths", "blank", "reduction",
              "zero_infinity")  # fmt: skip
MEAN, SUM = 1, 2  # at::Reduction
LARGE = 450  # ctc_loss_backward_gpu_template's bound of a "small problem"
# c10's ScalarType names, as a kernel's dispatch names a dtype it does not take
SCALAR_TYPES = {"float16": "Half", "bfloat16": "BFloat16", "int64": "Long", "int32": "Int",
                "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
                "complex64": "ComplexFloat", "complex128": "ComplexDouble"}  # fmt: skip


def lengths_of(torch, lengths) -> list[int] | None:
    """The lengths as the kernel reads them (an IntArrayRef), or None where the trace has no
    values: a fake tensor."""
    if isinstance(lengths, int):
        return [lengths]
    if isinstance(lengths, (list, tuple)):
        return [int(length) for length in lengths]
    if packed_sequences.has_values(torch, lengths):
        return lengths.reshape(-1).tolist()
    return None


def cudnn_may_take(torch, log_probs, targets, blank) -> bool:
    """The conditions both forms of `_use_cudnn_ctc_loss` share: cuDNN on, blank 0, float32
    log-probabilities of three dimensions, int32 targets concatenated and contiguous."""
    return (
        torch.backends.cudnn.enabled
        and blank == 0
        and targets.dim() == 1
        and log_probs.dtype == torch.float32
        and targets.dtype == torch.int32
        and targets.is_contiguous()
        and log_probs.dim() == 3
    )


def cudnn_takes_tensors(torch, log_probs, targets, tensors, inputs, target_lengths,
                        blank) -> bool:  # fmt: skip
    """`_use_cudnn_ctc_loss` for lengths given as tensors (the Tensor overload, `tensors`
    the input and target lengths' tensors, their values as read): int32 lengths, each
    target shorter than 256 and than its input."""
    return (
        cudnn_may_take(torch, log_probs, targets, blank)
        and all(lengths.dtype == torch.int32 for lengths in tensors)
        and all(t < 256 and t <= i for t, i in zip(target_lengths, inputs, strict=False))
    )


def cudnn_takes_numbers(torch, log_probs, targets, inputs, target_lengths, blank) -> bool:
    """`_use_cudnn_ctc_loss` for lengths given as numbers (the IntArrayRef overload): the
    targets on the CPU, every input as long as the log-probabilities, each target shorter
    than 256 and than its input."""
    return (
        cudnn_may_take(torch, log_probs, targets, blank)
        and targets.device.type == "cpu"
        and log_probs.device.type != "cpu"
        and all(length == log_probs.size(0) for length in inputs)
        and all(t < 256 and t <= i for t, i in zip(target_lengths, inputs, strict=False))
    )


def ctc_loss_as_on_gpu(torch, func, args, kwargs):
    """(the loss, None), or (None, why the trace stops). func: F.ctc_loss, whose reduction is
    a name, or torch.ctc_loss, which takes its number."""
    call = {**dict(zip(PARAMETERS, args, strict=False)), **kwargs}
    are_tensors = [isinstance(call[name], torch.Tensor) for name in PARAMETERS[2:4]]
    if are_tensors[0] != are_tensors[1]:  # no overload takes them: PyTorch says so
        return func(*args, **kwargs), None
    functional = func is torch.nn.functional.ctc_loss
    log_probs, targets = call["log_probs"], call["targets"]
    blank, zero_infinity = call.get("blank", 0), call.get("zero_infinity", False)
    reduction = call.get("reduction", "mean" if functional else MEAN)
    if functional:
        reduction = torch_private.reduction_number(torch, reduction)
    inputs = lengths_of(torch, call["input_lengths"])
    target_lengths = lengths_of(torch, call["target_lengths"])
    if inputs is None or target_lengths is None:
        return None, NO_VALUES
    if are_tensors[0]:  # the Tensor overload
        for name in ("input_lengths", "target_lengths"):
            if call[name].dtype.is_floating_point or call[name].dtype == torch.bool:
                raise RuntimeError(f"{name} must be integral")
        tensors = (call["input_lengths"], call["target_lengths"])
        if log_probs.device.type != "cpu" and cudnn_takes_tensors(
            torch, log_probs, targets, tensors, inputs, target_lengths, blank
        ):
            return None, CUDNN
    batched = log_probs.dim() == 3
    if not batched:
        log_probs = log_probs.unsqueeze(1)
    if cudnn_takes_numbers(torch, log_probs, targets, inputs, target_lengths, blank):
        return None, CUDNN
    targets = targets.to(log_probs.device, torch.int64)
    loss, _ = native_function(torch).apply(
        log_probs, targets, tuple(inputs), tuple(target_lengths), blank, zero_infinity
    )
    if zero_infinity:  # the zero and the test are temporaries of the statement: freed at once
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        loss = torch.where(loss == math.inf, zero, loss)
        del zero
    if reduction == MEAN:
        lengths = torch.tensor(target_lengths, dtype=loss.dtype, device="cpu")
        return (loss / lengths.to(loss.device).clamp_min(1)).mean(), None
    if reduction == SUM:
        return loss.sum(), None
    return (loss if batched else loss.squeeze(0)), None


def checked(torch, log_probs, targets, inputs, target_lengths, blank) -> int:
    """ctc_loss_gpu_template's checks, in its words; the longest target."""
    if log_probs.dtype not in (torch.float32, torch.float64):
        kind = SCALAR_TYPES.get(str(log_probs.dtype).removeprefix("torch."), log_probs.dtype)
        raise RuntimeError(f"\"ctc_loss_cuda\" not implemented for '{kind}'")
    if log_probs.dim() != 3:
        raise RuntimeError(
            f"Expected 3-dimensional tensor, but got {log_probs.dim()}-dimensional tensor for "
            "argument #1 'log_probs' (while checking arguments for ctc_loss_gpu)"
        )
    if targets.dim() not in (1, 2):
        raise RuntimeError(
            f"Expected 1 to 2 dimensions, but got {targets.dim()}-dimensional tensor for "
            "argument #2 'targets' (while checking arguments for ctc_loss_gpu)"
        )
    batch, labels = log_probs.size(1), log_probs.size(2)
    if not 0 <= blank < labels:
        raise RuntimeError("blank must be in label range")
    if len(inputs) != batch:
        raise RuntimeError("input_lengths must be of size batch_size")
    if len(target_lengths) != batch:
        raise RuntimeError("target_lengths must be of size batch_size")
    longest = max(target_lengths, default=0)
    if targets.dim() == 1:
        if targets.size(0) != sum(target_lengths):
            raise RuntimeError(
                f"Expected tensor to have size {sum(target_lengths)} at dimension 0, but got "
                f"size {targets.size(0)} for argument #2 'targets' (while checking arguments "
                "for ctc_loss_gpu)"
            )
    else:
        if targets.size(0) != batch:
            raise RuntimeError(
                f"Expected tensor to have size {batch} at dimension 0, but got size "
                f"{targets.size(0)} for argument #2 'targets' (while checking arguments for "
                "ctc_loss_gpu)"
            )
        if targets.size(1) < longest:
            raise RuntimeError(
                f"Expected tensor to have size at least {longest} at dimension 1, but got "
                f"size {targets.size(1)} for argument #2 'targets' (while checking arguments "
                "for ctc_loss_gpu)"
            )
    for length in inputs:
        if length > log_probs.size(0):
            raise RuntimeError(
                f"Expected input_lengths to have value at most {log_probs.size(0)}, but got "
                f"value {length} (while checking arguments for ctc_loss_gpu)"
            )
    return longest


def on_device(torch, values, device):
    """`at::tensor(values, options)` for a device, or a CPU tensor's `.cuda()`: made on the
    CPU, then copied, one block on the device."""
    return torch.tensor(values, dtype=torch.int64, device="cpu").to(device)


@functools.cache
def native_function(torch):
    """`_ctc_loss` and its backward as the CUDA kernels allocate (native/cuda/LossCTC.cu)."""

    class NativeCtcLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, log_probs, targets, inputs, target_lengths, blank, zero_infinity):
            longest = checked(torch, log_probs, targets, inputs, target_lengths, blank)
            batch, device = log_probs.size(1), log_probs.device
            lengths_t = on_device(torch, list(target_lengths), device)
            inputs_t = on_device(torch, list(inputs), device)
            offsets = on_device(torch, [0] * batch, device)  # tg_batch_offsets
            options = {"dtype": log_probs.dtype, "device": device}
            log_alpha = torch.empty((batch, log_probs.size(0), 2 * longest + 1), **options)
            loss = torch.empty((batch,), **options)
            del inputs_t, lengths_t, offsets
            ctx.save_for_backward(log_probs, targets, loss, log_alpha)
            ctx.call = (inputs, target_lengths, blank, zero_infinity)
            ctx.mark_non_differentiable(log_alpha)
            ctx.set_materialize_grads(False)  # log_alpha has no gradient: none is made
            return loss, log_alpha

        @staticmethod
        def backward(ctx, grad_out, _):
            log_probs, targets, loss, log_alpha = ctx.saved_tensors
            inputs, target_lengths, blank, zero_infinity = ctx.call
            steps, batch, labels = log_probs.shape
            device = log_probs.device
            if targets.dim() == 1:
                longest = max(target_lengths, default=0)
            else:
                longest = log_alpha.size(2) // 2
            lengths_t = on_device(torch, list(target_lengths), device)
            inputs_t = on_device(torch, list(inputs), device)
            offsets = on_device(torch, [0] * batch, device)
            log_beta = torch.empty_like(log_alpha, memory_format=torch.contiguous_format)
            log_beta.fill_(-math.inf)
            grad = torch.full_like(log_probs, -math.inf, memory_format=torch.contiguous_format)
            if 2 * steps + (24 * batch) // 10 + (2 * labels) // 10 > LARGE:
                torch.exp(log_probs, out=grad)
                every_other = (log_alpha.size(0), log_alpha.size(1), longest + 1)
                alpha, beta = log_alpha.stride(), log_beta.stride()
                summed = log_alpha.as_strided(every_other, (*alpha[:2], alpha[2] * 2)) + (
                    log_beta.as_strided(every_other, (*beta[:2], beta[2] * 2))
                )
                blanks = logsumexp_kept(torch, summed, 2).permute(1, 0, 2)
                blanks.add_(loss.view(1, batch, 1)).sub_(log_probs.narrow(2, blank, 1)).exp_()
                grad.narrow(2, blank, 1).sub_(blanks)
                del blanks, summed
                grad *= grad_out.view(1, batch, 1)
                if zero_infinity:
                    infinite = loss.view(1, batch, 1) == math.inf
                    zero = torch.zeros((), dtype=grad.dtype, device=device)
                    grad = torch.where(infinite, zero, grad)
                    del infinite, zero
            del log_beta, inputs_t, lengths_t, offsets
            return grad, None, None, None, None, None

    return NativeCtcLoss


def logsumexp_kept(torch, x, dim: int):
    """at::logsumexp(x, dim, keepdim=true) as logsumexp_out_impl (ReduceOps.cpp) runs it, so
    that each of its blocks is recorded: the maxima, their test for infinity, the shifted
    exponentials and the sum."""
    maxes = torch.amax(x, dim, keepdim=True)
    maxes.masked_fill_(maxes.abs() == math.inf, 0)
    result = torch.sum((x - maxes).exp_(), dim, keepdim=True)
    result.log_().add_(maxes)
    return result
