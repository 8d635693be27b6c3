"""Four losses whose reduced result keeps the elementwise loss's block, and one backward
without a meta kernel, for every trace.

With reduction "mean" or "sum", a real run of `mse_loss`, `smooth_l1_loss`,
`binary_cross_entropy` and `soft_margin_loss` returns a 0-dimensional tensor whose storage is
the elementwise loss's, as large as the input: ATen computes the loss elementwise into its
output, then resizes that output to a scalar (`resize_({})` in the structured meta functions
of mse_loss and smooth_l1_loss, aten/src/ATen/native/Loss.cpp; `resize_as_` of the reduced
value in binary_cross_entropy's CPU and CUDA kernels and in soft_margin_loss), and a tensor
resized down keeps its storage. The fake tensors' kernels return a fresh scalar of 4 or 8
bytes instead. The loss lives to the end of the step (backward reads it), so the trace missed
the input's bytes for that long (an input-sized block where the trace had one of 8 bytes).

The trace gives these four operators a fake kernel of its own that makes the GPU's block:
the input's shape (broadcast with the target's for mse_loss and smooth_l1_loss, which
broadcast) and result dtype, resized to a scalar where the loss is reduced. Other losses
(l1, huber, cross-entropy, nll, kl_div, BCE with logits, ...) return a block of their own
size on every device, as the fake kernels do.

`multi_margin_loss_backward` (nn.MultiMarginLoss in training) has no meta kernel, so the
trace stopped there; its CPU and CUDA kernels resize an empty gradient as the input, and the
trace's kernel makes that block (the call's scratch stays uncovered: bounded).

Standard library only (torch is passed in).
"""

from __future__ import annotations

from pipeline.core import torch_private

NONE = 0  # at::Reduction::None
BROADCASTING = ("mse_loss", "smooth_l1_loss")  # binary operators: the shapes broadcast
AS_INPUT = ("binary_cross_entropy", "soft_margin_loss")  # an output like the input


def operators(torch) -> dict:
    return {name: getattr(torch.ops.aten, name).default for name in BROADCASTING + AS_INPUT}


def argument(func, args, kwargs, name: str):
    """An argument by its name in the operator's schema, its default where not passed."""
    for index, described in enumerate(torch_private.schema_of(func).arguments):
        if described.name == name:
            if index < len(args):
                return args[index]
            return kwargs.get(name, described.default_value)
    raise KeyError(name)


def _reduced_in_place(fake_mode, func, *args, **kwargs):
    """The loss's output as a real run makes it (the module's docstring)."""
    import torch

    x, target = args[0], args[1]
    with fake_mode:
        if torch_private.schema_of(func).name.removeprefix("aten::") in BROADCASTING:
            shape = torch.broadcast_shapes(x.shape, target.shape)
            dtype = torch.result_type(x, target)
        else:
            shape, dtype = x.shape, x.dtype
        out = x.new_empty(shape, dtype=dtype)
        if argument(func, args, kwargs, "reduction") != NONE:
            out.resize_(())
    return out


def _multi_margin_backward(fake_mode, func, *args, **kwargs):
    """The gradient of the input, like the input (the module's docstring)."""
    x = argument(func, args, kwargs, "self")
    with fake_mode:
        return x.new_empty(x.shape)


def add_fake_kernels(torch, fake_mode):
    """The fake kernels, for the trace's time, and `fake_mode` computing each call of the
    four losses anew (its cache would remake a scalar's block); returns the undo."""
    ops = operators(torch).values()
    undo = [torch_private.add_fake_kernel(op, _reduced_in_place) for op in ops]
    backward = torch.ops.aten.multi_margin_loss_backward.default
    undo.append(torch_private.add_fake_kernel(backward, _multi_margin_backward))
    undo.append(torch_private.never_cached(fake_mode, ops))
    return lambda: [step() for step in reversed(undo)]
