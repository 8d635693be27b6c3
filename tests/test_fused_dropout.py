"""Dropout called from C++ as a GPU runs it (fused_dropout.py): the math attention kernel's
dropout of its attention weights takes the fused kernel, one byte of mask an element, in a
trace without a GPU made for one."""

from __future__ import annotations

import pytest
import torch

from pipeline.predicting import fused_dropout, gpu_calibration
from pipeline.predicting import trace_prediction as tp

H200 = gpu_calibration.target(gpu_calibration.load("h200")[1])
B, H, L, E = 4, 4, 64, 32  # the attention weights: B x H x L x L float32, 262,144 bytes


def attention_step(phase):
    def step():
        q = torch.randn(B, H, L, E, device="meta", requires_grad=True)
        out = torch.ops.aten._scaled_dot_product_attention_math(q, q, q, None, 0.1, False, None)
        return out[0]

    phase("cold_step", step)


def kept_after(target) -> list:
    trace = tp.run_trace(torch, "meta", attention_step, target=target)
    assert trace.stopped is None
    return sorted(nbytes for kind, nbytes, _ in tp.predict(trace).log if kind == "alloc")


def test_the_math_kernels_dropout_keeps_a_byte_mask_for_a_gpu():
    """The weights' mask: 65,536 B (bool) as on a GPU, not a float32 noise of 262,144 B."""
    blocks = kept_after(H200)
    assert B * H * L * L in blocks  # the byte mask
    assert blocks.count(4 * B * H * L * L) == 3  # scores, softmax, dropped: no noise tensor
    meta = kept_after(None)  # the meta device's own path: the noise, of the input's dtype
    assert meta.count(4 * B * H * L * L) == 4
    assert B * H * L * L not in meta


@pytest.mark.parametrize(
    ("p", "train", "kept"),
    [(0.0, True, "input"), (0.3, False, "input"), (1.0, True, "zero"), (0.3, True, "fused")],
)
def test_dropout_takes_the_gpus_path(p, train, kept):
    x = torch.ones(8, 8)
    out = fused_dropout.dropout(torch)(x, p, train)
    if kept == "input":
        assert out is x
    elif kept == "zero":
        assert torch.equal(out, torch.zeros(8, 8))
    else:  # the fused kernel: each element kept, scaled by 1 / (1 - p), or dropped
        assert set(out.unique().tolist()) <= {0.0, torch.tensor(1 / 0.7).item()}


def test_the_trace_gives_dropout_its_composite_back():
    """After the trace, at::dropout on the meta device is PyTorch's composite again: a noise
    tensor (bernoulli_), no fused kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    tp.run_trace(torch, "meta", attention_step, target=H200)
    with Calls() as calls:
        torch.dropout(torch.randn(2, 8, device="meta"), 0.5, True)
    assert "aten.bernoulli_.float" in calls.seen
    assert "aten.native_dropout.default" not in calls.seen
