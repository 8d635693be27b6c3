"""Dropout called from C++ as a GPU runs it, for a trace without a GPU made for one.

`at::native::dropout` (aten/src/ATen/native/Dropout.cpp) takes the fused kernel,
`native_dropout`, when `is_fused_kernel_acceptable` holds: a CUDA input, 0 < p < 1, and at
least one element. Its mask is one byte an element. Otherwise it takes `_dropout_impl`: a
noise tensor of the input's own dtype (`empty_like(input).bernoulli_(1 - p)`), divided and
multiplied in. On the meta device the test fails, so the trace took the second path where a
GPU takes the first, and autograd kept the noise (four bytes an element in float32) where the
GPU keeps the byte mask: on an H100, a Llama trained in float32 with attention dropout held
196,608 B less a layer than the trace without a GPU said, in the math attention kernel's
dropout of its attention weights (`_scaled_dot_product_attention_math` calls `at::dropout`
from C++, where no Python-level override of `F.dropout` reaches).

`install` gives `aten::dropout` the GPU's decision in place of its C++ composite for the
trace's time; the trace beside a GPU needs none (its fake CUDA tensors pass the test).

Standard library only (torch is passed in).
"""

from __future__ import annotations

from pipeline.core import torch_private


def dropout(torch):
    """at::native::dropout with a CUDA input: the fused kernel where it is acceptable;
    `_dropout<false>`'s early returns otherwise (no training, p = 0 or no element: the input
    itself; p = 1: the input times zero)."""

    def kernel(input, p, train):
        if not train or p == 0 or input.numel() == 0:
            return input
        if p < 1:
            return torch.ops.aten.native_dropout(input, p, train)[0]
        return input * torch.zeros((), dtype=input.dtype, device=input.device)

    return kernel


def install(torch):
    """aten::dropout as on a GPU, for the trace's time; returns the undo."""
    return torch_private.composite_kernel(torch, "dropout", dropout(torch))
