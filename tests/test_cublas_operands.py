"""Calls whose blocks a dispatch mode's trace missed, found against an H100's allocator
history: a matrix product's operand cuBLAS cannot read where it lies (copied first), an
integer or bool tensor summed (copied as int64 first), and two calls whose real run selects
elements by a mask's values. The oracle on a GPU host: the allocator's history of each step,
request by request, against the trace's replay."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from conftest import gpu_requests as history
from conftest import replayed_requests as replayed
from conftest import requests_between_frees as grouped

from pipeline.predicting import attention_choice, cublas_operands, gpu_calibration
from pipeline.predicting import trace_prediction as tp


@pytest.mark.parametrize(
    ("shape", "stride", "copied"),
    [
        ((64, 32), (32, 1), False),  # row-major
        ((64, 32), (1, 64), False),  # column-major (a transpose)
        ((64, 32), (96, 1), False),  # rows of a wider matrix
        ((64, 32), (0, 0), True),  # a scalar's gradient broadcast (a sum's backward)
        ((64, 32), (0, 1), True),  # a row broadcast
        ((64, 32), (64, 2), True),  # every other column
        ((64, 1), (1, 1), False),  # a column
    ],
)
def test_what_cublas_reads_where_it_lies(shape, stride, copied):
    assert cublas_operands.readable(shape, stride) is not copied


def tensor(shape, stride, dtype="float32"):
    nbytes = (1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))) * 4
    return ("tensor", dtype, shape, stride, 0, nbytes, "device")


def test_mm_copies_mat2_then_mat1_and_the_pattern_frees_them_after_the_workspaces():
    """The result is contiguous, so cuBLAS computes its transpose: mat2 is prepared first."""
    made = cublas_operands.copies(
        "aten.mm.default", {"self": tensor((64, 32), (0, 0)), "mat2": tensor((32, 16), (0, 1))}
    )
    assert made == [32 * 16 * 4, 64 * 32 * 4]
    pattern = [("output", 0, None), ("persistent", 33554432)]
    assert cublas_operands.with_copies(pattern, made) == [
        ("output", 0, None),
        ("internal", 100, 32 * 16 * 4),
        ("internal", 101, 64 * 32 * 4),
        ("persistent", 33554432),
        ("free", 101),
        ("free", 100),
    ]


def test_a_generated_sequences_last_position_folds_into_linear_by_a_view():
    """hidden[:, -1:] of (2, 500, 4096) into the LM head: _matmul_impl folds it by a view and
    cuBLAS reads it where it lies (Mistral-7B and Pythia generating were measured exact on the
    H200 so); a transposed input would be copied."""
    last = tensor((2, 1, 4096), (500 * 4096, 4096, 1))
    weight = tensor((32000, 4096), (4096, 1))
    assert cublas_operands.copies("aten.linear.default", {"input": last, "weight": weight}) == []
    swapped = tensor((2, 500, 4096), (4096, 8192, 1))
    arguments = {"input": swapped, "weight": weight}
    assert cublas_operands.copies("aten.linear.default", arguments) is None


def test_bmm_copies_a_broadcast_batch_and_keeps_a_plain_one():
    """An einsum's backward of a sum: the gradient (8, 64, 32) broadcast from a scalar is
    cloned (64 KiB); batch2 first, as the result's transpose takes it."""
    plain = {"self": tensor((8, 64, 32), (2048, 32, 1)), "mat2": tensor((8, 32, 16), (0, 1, 32))}
    assert cublas_operands.copies("aten.bmm.default", plain) == []
    broadcast = {"self": tensor((8, 64, 32), (0, 0, 0)), "mat2": tensor((8, 32, 16), (0, 0, 0))}
    assert cublas_operands.copies("aten.bmm.default", broadcast) == [8 * 32 * 16 * 4, 65536]
    one_column = dict(plain, mat2=tensor((8, 32, 1), (32, 1, 1)))
    assert cublas_operands.copies("aten.bmm.default", one_column) is None


def test_other_products_keep_their_pattern_only_where_no_operand_could_be_copied():
    strided = {"input": tensor((8, 64, 32), (32, 256, 1)), "weight": tensor((16, 32), (32, 1))}
    assert cublas_operands.copies("aten.linear.default", strided) is None


STEPS = {}


def step(name):
    def register(function):
        STEPS[name] = function
        return function

    return register


@step("x @ w, summed")
def matmul_summed(device):
    x = torch.randn(8, 64, 128, device=device, requires_grad=True)
    w = torch.randn(128, 32, device=device, requires_grad=True)
    (x @ w).sum().backward()
    return x, w


@step("a batch of one @ a batch, summed")
def batch_of_one(device):
    x = torch.randn(1, 64, 128, device=device, requires_grad=True)
    w = torch.randn(8, 128, 32, device=device, requires_grad=True)
    torch.matmul(x, w).sum().backward()
    return x, w


@step("einsum over batches, summed")
def einsum_summed(device):
    a = torch.randn(8, 32, 64, device=device, requires_grad=True)
    b = torch.randn(8, 64, 16, device=device, requires_grad=True)
    torch.einsum("bij,bjk->bik", a, b).sum().backward()
    return a, b


@step("cross_entropy with label smoothing")
def label_smoothing(device):
    x = torch.randn(64, 1000, device=device, requires_grad=True)
    y = torch.randint(0, 1000, (64,), device=device)
    y[::4] = -100
    F.cross_entropy(x, y, label_smoothing=0.1).backward()
    return x


@step("a mask summed")
def mask_summed(device):
    x = torch.randn(300, 700, device=device)
    return (x > 0).sum(), (x > 0).int().sum(1), x


@step("masked_fill with a learnt value")
def learnt_fill(device):
    x = torch.randn(256, 1024, device=device, requires_grad=True)
    v = torch.tensor(0.5, device=device, requires_grad=True)
    mask = torch.rand(256, 1024, device=device) > 0.5
    (x * 2).masked_fill(mask, v).sum().backward()
    return x, v


@step("cross_entropy with label smoothing and class weights")
def weighted_smoothing(device):
    x = torch.randn(64, 1000, device=device, requires_grad=True)
    y = torch.randint(0, 1000, (64,), device=device)
    w = torch.rand(1000, device=device)
    F.cross_entropy(x, y, weight=w, label_smoothing=0.1).backward()
    return x


VALUE_DEPENDENT = {
    "masked_fill with a learnt value": "masked_fill's backward (a tensor value that needs a "
    "gradient)",
    "cross_entropy with label smoothing and class weights": "cross_entropy (label smoothing, "
    "class weights, the mean)",
}


def traced(name, device="meta"):
    def drive(phase):
        phase("step", lambda: STEPS[name](device))

    return tp.run_trace(torch, device, drive, target=attention_choice.H200)


@pytest.mark.parametrize("name", [name for name in STEPS if name not in VALUE_DEPENDENT])
def test_the_blocks_found_on_the_gpu_are_in_the_replay_and_the_prediction_is_exact(name):
    """Worked from the H100's history: each backward `mm` of `x @ w` summed copies the
    broadcast gradient (64 KiB); `(x > 0).sum()` copies its 210,000 values as int64 first."""
    trace = traced(name)
    calibration, _ = gpu_calibration.load("h200")
    assert tp.predict(trace, calibration).status == tp.PredictionStatus.EXACT
    log = tp.replay(trace, calibration)[1]
    scratch = [nbytes for kind, nbytes, what in log[1:] if kind == "alloc" and "scratch" in what]
    if name == "x @ w, summed":
        assert scratch == [8 * 64 * 32 * 4] * 2
    if name == "einsum over batches, summed":
        assert scratch == [8 * 32 * 16 * 4] * 2  # the broadcast gradient, in each bmm
    if name == "a mask summed":
        assert scratch[:1] == [300 * 700 * 8]
    if name == "cross_entropy with label smoothing":
        assert scratch == [64 * 8]  # the targets not ignored, counted: a bool summed as int64


@pytest.mark.parametrize("name", VALUE_DEPENDENT)
def test_a_real_run_that_selects_by_a_masks_values_gives_no_bounds_and_says_why(name):
    calibration, _ = gpu_calibration.load("h200")
    prediction = tp.predict(traced(name), calibration)
    assert prediction.status == tp.PredictionStatus.APPROXIMATE
    assert prediction.bounds is None
    assert {"op": VALUE_DEPENDENT[name], "calls": 0, "why": tp.OTHER_WAY} in prediction.unknown


def test_label_smoothing_given_by_position_is_noted_as_by_keyword():
    """F.cross_entropy(x, y, w, None, -100, None, "mean", 0.1): every argument by position."""

    def drive(phase):
        def run():
            x = torch.randn(64, 1000, device="meta", requires_grad=True)
            y = torch.randint(0, 1000, (64,), device="meta")
            w = torch.rand(1000, device="meta")
            F.cross_entropy(x, y, w, None, -100, None, "mean", 0.1).backward()
            return x

        phase("step", run)

    trace = tp.run_trace(torch, "meta", drive, target=attention_choice.H200)
    assert trace.notes == {VALUE_DEPENDENT["cross_entropy with label smoothing and class "
                                           "weights"]: tp.OTHER_WAY}  # fmt: skip


def test_without_a_gradient_or_weights_the_same_calls_stay_exact():
    def drive(phase):
        def run():
            x = torch.randn(64, 1000, device="meta", requires_grad=True)
            y = torch.randint(0, 1000, (64,), device="meta")
            F.cross_entropy(x, y, weight=torch.rand(1000, device="meta"), reduction="sum",
                            label_smoothing=0.1).backward()  # fmt: skip
            v = torch.tensor(0.5, device="meta")  # no gradient
            (x * 2).masked_fill(torch.rand(64, 1000, device="meta") > 0.5, v).sum().backward()
            return x

        phase("step", run)

    trace = tp.run_trace(torch, "meta", drive, target=attention_choice.H200)
    assert not [note for note in trace.notes if "masked_fill" in note or "cross_entropy" in note]


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", STEPS)
def test_the_replay_makes_the_gpus_requests(name):
    """The GPU-free trace's replay, its kernels' scratch and copies included, requests what
    the GPU requests, in order; where a real run selects by values, it does not, and the
    prediction said so."""
    on_gpu = grouped(history(STEPS[name]))
    if name in VALUE_DEPENDENT:
        assert replayed(traced(name)) != on_gpu
    else:
        assert replayed(traced(name)) == on_gpu
        assert replayed(traced(name, "cuda:0")) == on_gpu


@pytest.mark.gpu
def test_random_products_copy_what_the_rule_says():
    """mm, addmm and bmm on operands laid out at random (row- or column-major, rows of a
    wider matrix, broadcast rows or scalars, every other column; a batch broadcast or made
    contiguous): the allocator's history inside the call is the output, then the copies
    `copies` names, freed."""
    rng = random.Random(0)
    mismatched = []
    layouts = ("rows", "columns", "wider", "scalar", "row", "strided")

    def operand(rows, columns, layout):
        if layout == "rows":
            return torch.randn(rows, columns, device="cuda")
        if layout == "columns":
            return torch.randn(columns, rows, device="cuda").t()
        if layout == "wider":
            return torch.randn(rows, columns + 7, device="cuda")[:, :columns]
        if layout == "scalar":
            return torch.randn((), device="cuda").expand(rows, columns)
        if layout == "row":
            return torch.randn(columns, device="cuda").expand(rows, columns)
        return torch.randn(rows, 2 * columns, device="cuda")[:, ::2]

    for trial in range(300):
        m, k, n = (rng.choice([1, 3, 16, 64, 200]) for _ in range(3))
        batched = trial >= 200  # bmm: each operand a batch of 4 laid out alike
        a = operand(m, k, rng.choice(layouts))
        b = operand(k, n, rng.choice(layouts))
        if batched:
            a, b = (x.unsqueeze(0).expand(4, *x.shape) for x in (a, b))
            if rng.random() < 0.5:
                a, b = a.contiguous(), b.clone()  # b keeps its strides
        bias = torch.randn(n, device="cuda") if rng.random() < 0.5 and not batched else None
        arguments = (bias, a, b) if bias is not None else (a, b)
        call = torch.addmm if bias is not None else torch.bmm if batched else torch.mm
        events = history(lambda device, call=call, arguments=arguments: call(*arguments))
        seen = [nbytes for action, nbytes in events if action == "alloc"]
        name = f"aten.{'addmm' if bias is not None else 'bmm' if batched else 'mm'}.default"
        arguments = {
            "mat1" if bias is not None else "self": as_leaf(a),
            "mat2": as_leaf(b),
        }
        made = cublas_operands.copies(name, arguments)
        if made is None:
            continue  # not spoken for: the pattern is not used
        if seen != [(4 if batched else 1) * m * n * 4, *made]:
            mismatched.append((name, tuple(a.stride()), tuple(b.stride()), (m, k, n), seen, made))
    assert not mismatched, mismatched[:5]


def as_leaf(x):
    return ("tensor", "float32", tuple(x.shape), tuple(x.stride()), 0, 0, "device")
