"""Packed sequences (pack_padded_sequence) traced as a GPU run packs them: the packing by
PyTorch's own kernel as the oracle (its values, and the blocks its operators allocate, as
PyTorch's profiler sees them on the CPU), and cuDNN's call on the packed data."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.profiler import ProfilerActivity, profile

from pipeline.predicting import attention_choice, cudnn_rnn, packed_sequences
from pipeline.predicting import trace_prediction as tp


@st.composite
def padded(draw):
    """(input, sorted lengths, batch_first): a padded batch as pack_padded_sequence takes it."""
    batch, steps = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    features = draw(st.lists(st.integers(1, 3), max_size=2))
    lengths = sorted(draw(st.lists(st.integers(1, steps), min_size=batch, max_size=batch)))
    batch_first = draw(st.booleans())
    shape = (batch, steps) if batch_first else (steps, batch)
    return torch.randn(*shape, *features), torch.tensor(lengths[::-1]), batch_first


def allocating_ops(function) -> list[tuple[str, int]]:
    """The operators under `function` that allocate, with their bytes, in order, as
    PyTorch's profiler records them (CPU blocks: the packed data's are the device's on a
    GPU); the int64 batch sizes, a CPU tensor on a GPU too, left out."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        function()
    return [
        (event.name, event.cpu_memory_usage)
        for event in recorded.events()
        if event.name in ("aten::clone", "aten::cat")
    ]


@given(padded())
def test_packing_gives_pytorchs_data_and_batch_sizes(case):
    x, lengths, batch_first = case
    data, batch_sizes = packed_sequences.pack(torch, x, lengths, batch_first)
    expected_data, expected_sizes = torch._pack_padded_sequence(x, lengths, batch_first)
    assert torch.equal(data, expected_data)
    assert batch_sizes.tolist() == expected_sizes.tolist()
    assert type(batch_sizes) is torch.Tensor
    assert batch_sizes.dtype == torch.int64


@given(padded())
def test_packing_allocates_the_blocks_pytorchs_kernel_allocates(case):
    """A copy per distinct length whose slice is not contiguous, then the concatenation."""
    x, lengths, batch_first = case
    ours = allocating_ops(lambda: packed_sequences.pack(torch, x, lengths, batch_first))
    theirs = allocating_ops(lambda: torch._pack_padded_sequence(x, lengths, batch_first))
    assert ours == theirs


@pytest.mark.parametrize(
    ("lengths", "batch"),
    [([2, 3], 2), ([0], 1), ([2, 2, 2], 2), ([[2]], 1), ([2.0], 1)],
    ids=["unsorted", "zero", "too-many", "two-dims", "float"],
)
def test_packing_refuses_what_pytorch_refuses_with_its_words(lengths, batch):
    x, lengths = torch.randn(batch, 3, 2), torch.tensor(lengths)
    with pytest.raises(RuntimeError) as theirs:
        torch._pack_padded_sequence(x, lengths, True)
    with pytest.raises(RuntimeError) as ours:
        packed_sequences.pack(torch, x, lengths, True)
    assert str(ours.value) == str(theirs.value).splitlines()[0]


def traced_tagger(lengths_on_the_cpu: bool, target=attention_choice.H200, mode=torch.nn.LSTM):
    """A bidirectional layer over a batch-first padded batch of 4 rows, trained one step."""

    def drive(phase):
        _, module = phase(
            "model_load",
            lambda: mode(6, 10, 2, batch_first=True, bidirectional=True).to(device="meta"),
        )

        def step():
            x = torch.randn(4, 9, 6, device="meta", requires_grad=True)
            if lengths_on_the_cpu:
                lengths = torch.tensor([9, 2, 5, 5])
            else:  # from a device tensor: values the trace does not have
                lengths = torch.ones(4, 9, device="meta").sum(1).long().cpu()
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = pad_packed_sequence(module(packed)[0], batch_first=True, total_length=9)
            out.sum().backward()

        phase("step", step)

    return tp.run_trace(torch, "meta", drive, target=target)


def ops(trace, name):
    return [event[1] for event in trace.events if event[0] == "op" and event[1].name == name]


@pytest.mark.parametrize("mode", [torch.nn.LSTM, torch.nn.GRU])
def test_a_packed_batch_goes_to_cudnn_with_its_batch_sizes(mode):
    """21 tokens (9 + 5 + 5 + 2) packed: cuDNN's output, reserve and input gradient are the
    packed data's, as _cudnn_impl passes the batch sizes [4, 4, 3, 3, 3, 1, 1, 1, 1]."""
    trace = traced_tagger(True, mode=mode)
    assert trace.stopped is None
    assert "recurrent layers" not in trace.notes
    [forward], [backward] = ops(trace, cudnn_rnn.FORWARD), ops(trace, cudnn_rnn.BACKWARD)
    number = cudnn_rnn.LSTM if mode is torch.nn.LSTM else cudnn_rnn.GRU
    reserve = cudnn_rnn.reserve_bytes(number, 2, 2, 21, 10, 0, 4)
    sizes = [nbytes for _, _, nbytes in forward.outputs]
    assert sizes[0] == 21 * 2 * 10 * 4  # the packed output, both directions
    assert sizes[1] == 2 * 2 * 4 * 10 * 4  # h_n: the largest batch size, 4
    assert sizes[3] == reserve
    assert backward.outputs[0][2] == 21 * 6 * 4  # the packed data's gradient


def test_lengths_without_values_stop_the_trace_in_one_line_that_says_so():
    trace = traced_tagger(False)
    assert trace.stopped == packed_sequences.NO_VALUES
    assert "\n" not in trace.stopped


def test_packing_is_traced_as_the_kernels_operators():
    """The trace records the kernel's copies and concatenation, not the call it has no meta
    kernel for. Lengths 9, 5, 5, 2 batch first: the first two steps' slices (2 x 4 and 3 x 3
    rows) are copied, the last (4 x 1) is contiguous already; 21 rows concatenated."""
    trace = traced_tagger(True)
    events = [event[1] for event in trace.events if event[0] == "op"]
    assert not [op for op in events if op.name == "aten._pack_padded_sequence.default"]
    first_rnn = next(i for i, op in enumerate(events) if op.name == cudnn_rnn.FORWARD)
    made = [
        (op.name, op.outputs[0][2])
        for op in events[:first_rnn]
        if op.name in ("aten.contiguous.default", "aten.cat.default")
    ]
    assert made == [
        ("aten.contiguous.default", 2 * 4 * 6 * 4),
        ("aten.contiguous.default", 3 * 3 * 6 * 4),
        ("aten.cat.default", 21 * 6 * 4),
    ]


def test_a_packed_prediction_for_the_gpu_claims_no_bounds_and_says_why():
    """cuDNN's workspace in packed calls was never probed, and an H100 measured one such
    model's reserved peak above the bounds of unpacked calls: no bounds are claimed."""
    from pipeline.predicting import gpu_calibration

    trace = traced_tagger(True)
    assert trace.notes[cudnn_rnn.PACKED_CALLS] == cudnn_rnn.PACKED_WHY
    calibration, _ = gpu_calibration.load("h200")
    prediction = tp.predict(trace, calibration)
    assert prediction.status == tp.PredictionStatus.APPROXIMATE
    assert prediction.bounds is None
    assert prediction.unbounded == f"no bounds: {cudnn_rnn.PACKED_UNBOUNDED}"
    assert {"op": cudnn_rnn.PACKED_CALLS, "calls": 0, "why": cudnn_rnn.PACKED_WHY} in (
        prediction.unknown
    )
