"""Losses whose reduced result keeps the elementwise loss's block (loss_outputs.py), held to
real CPU runs of the same calls: ATen's own kernels, recorded by a dispatch mode that shares
no code with the trace. mse_loss and smooth_l1_loss are structured (the same meta function
on every device); binary_cross_entropy's CUDA kernel resizes its output as the CPU one does;
soft_margin_loss is one composite for every device."""

from __future__ import annotations

import pytest

from pipeline.predicting import loss_outputs
from pipeline.predicting import trace_prediction as tp

torch = pytest.importorskip("torch")
F = torch.nn.functional
LOSSES = {  # name: loss(input, target, reduction=...)
    "mse_loss": F.mse_loss,
    "smooth_l1_loss": F.smooth_l1_loss,
    "binary_cross_entropy": lambda a, b, **k: F.binary_cross_entropy(
        torch.sigmoid(a), b.clamp(0, 1), **k
    ),
    "soft_margin_loss": F.soft_margin_loss,
    # its backward has no meta kernel: the trace's own
    "multi_margin_loss": lambda a, b, **k: F.multi_margin_loss(
        a.flatten(0, 1), torch.zeros(30, dtype=torch.long, device=a.device), **k
    ),
    # its check that no variance is negative reads a value: taken as passed
    "gaussian_nll_loss": lambda a, b, **k: F.gaussian_nll_loss(a, b, F.softplus(a), **k),
    # controls: a block of their own size on every device, as the fake kernels give
    "l1_loss": F.l1_loss,
    "huber_loss": F.huber_loss,
    "binary_cross_entropy_with_logits": F.binary_cross_entropy_with_logits,
    "kl_div": lambda a, b, **k: F.kl_div(F.log_softmax(a, -1), b.softmax(-1), **k),
}


def step(device, name, dtype, reduction):
    """The loss and its backward on `device`: the calls a training step makes."""

    def run():
        x = torch.randn(6, 5, 8, device=device, dtype=dtype, requires_grad=True)
        y = torch.rand(6, 5, 8, device=device, dtype=dtype)
        for _ in range(2):  # a second step: the fake mode's cache must not remake the first
            loss = LOSSES[name](x, y, reduction=reduction)
            (loss if reduction != "none" else loss.sum()).backward()

    return run


def real_blocks(run) -> list:
    """(operator, storage bytes of each output) of a real CPU run, in call order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if any(r.alias_info is not None for r in func._schema.returns):
                return out  # a view: no block of its own, as in the trace
            outs = out if isinstance(out, (tuple, list)) else (out,)
            sizes = [o.untyped_storage().nbytes() for o in outs if isinstance(o, torch.Tensor)]
            if sizes:  # a value read back (the check's `bool`) makes no block
                calls.append((str(func), sizes))
            return out

    with Record():
        run()
    return calls


def traced_blocks(run) -> list:
    trace = tp.run_trace(torch, "meta", lambda phase: phase("step", run))
    return [
        (event[1].name, [nbytes for _, _, nbytes in event[1].outputs])
        for event in trace.events
        if event[0] == "op" and event[1].outputs and not event[1].name.startswith("aten.rand")
    ]  # fmt: skip


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_a_losss_blocks_in_the_trace_are_a_real_runs(name, reduction, dtype):
    if name == "multi_margin_loss" and dtype == "bfloat16":
        pytest.skip("the CPU's multi_margin_loss kernel has no bfloat16: no real run to hold to")
    dtype = getattr(torch, dtype)
    real = [call for call in real_blocks(step("cpu", name, dtype, reduction))
            if not call[0].startswith("aten.rand")]  # fmt: skip
    traced = traced_blocks(step("meta", name, dtype, reduction))
    loss = f"aten.{name}.default"
    assert [call for call in traced if call[0] == loss] == [c for c in real if c[0] == loss]
    assert [sizes for _, sizes in traced] == [sizes for _, sizes in real]


@pytest.mark.filterwarnings("ignore:Using a target size")
def test_a_broadcast_target_gives_the_broadcast_block_and_the_promoted_dtype():
    """mse_loss of a float32 input and a float64 target broadcast over the batch: the
    output's block is [6, 5, 8] float64 (1,920 B), resized to a scalar."""

    def run(device):
        x = torch.randn(6, 5, 8, device=device, requires_grad=True)
        y = torch.rand(5, 8, device=device, dtype=torch.float64)
        F.mse_loss(x, y).backward()

    def loss_blocks(calls):
        return [sizes for op, sizes in calls if op == "aten.mse_loss.default"]

    real = loss_blocks(real_blocks(lambda: run("cpu")))
    assert real == [[6 * 5 * 8 * 8]]
    assert loss_blocks(traced_blocks(lambda: run("meta"))) == real


def test_the_fake_kernels_leave_pytorchs_own_and_its_decomposition_as_they_were():
    """Outside a trace the fake mode answers with PyTorch's own scalar again, and
    mse_loss's Python decomposition, set aside for the trace, is back."""
    from torch._decomp import decomposition_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    mse = torch.ops.aten.mse_loss.default
    before = decomposition_table[mse]
    mode = FakeTensorMode()
    undo = loss_outputs.add_fake_kernels(torch, mode)
    try:
        assert mse not in decomposition_table
        with mode:
            x = torch.empty(6, 5, 8, device="meta")
            for _ in range(2):  # the second from the cache, were it cached
                assert mse(x, x, 1).untyped_storage().nbytes() == 6 * 5 * 8 * 4
            assert mse(x, x, 0).shape == (6, 5, 8)
    finally:
        undo()
    assert "_validate_cache_key" not in vars(mode)
    assert decomposition_table[mse] is before
    with FakeTensorMode():
        x = torch.empty(6, 5, 8, device="meta")
        assert mse(x, x, 1).untyped_storage().nbytes() == 4


def test_only_a_checked_functions_value_check_is_answered():
    """The same read of a value in the workload's own code still stops the trace: the trace
    cannot tell which branch it takes."""

    def run():
        x = torch.randn(4, 3, device="meta")
        if torch.any(x < 0):
            x = x * 2

    trace = tp.run_trace(torch, "meta", lambda phase: phase("step", run))
    assert trace.stopped is not None
    assert "_local_scalar_dense" in trace.stopped
