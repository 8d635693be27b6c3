"""nn.LSTMCell and nn.GRUCell traced for a GPU: the GPU's calls (two products and one fused
kernel, and its backward), the fused kernels' blocks in RNN.cu's order, and the same calls
as a GPU's own fake tensors make."""

from __future__ import annotations

import pytest
from test_trace_builtins import protocol

from pipeline.predicting import attention_choice as ac
from pipeline.predicting import fused_cells
from pipeline.predicting import reduce_scratch as rs
from pipeline.predicting import trace_prediction as tp

torch = pytest.importorskip("torch")
nn = torch.nn
BATCH, TOKENS, FEATURES, WIDTH = 4, 3, 24, 40


def cell_loop(cell, bias: bool):
    def build(device, dtype):
        class Loop(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.cell = cell(FEATURES, WIDTH, bias=bias, device=device)

            def forward(self, x):
                state = None  # zeros; an LSTMCell's is (h, c)
                for t in range(x.size(1)):
                    state = self.cell(x[:, t], state)
                return state[0] if isinstance(state, tuple) else state

        return Loop().to(dtype), (BATCH, TOKENS, FEATURES)

    return build


def calls(trace) -> list[tuple]:
    """(operator, ((output index, bytes), ...)) of every call that is not a view, in order."""
    return [
        (event[1].name, tuple((index, nbytes) for index, _, nbytes in event[1].outputs))
        for event in trace.events
        if event[0] == "op" and not trace.signatures[event[1].signature].view
    ]


CELLS = {"LSTMCell": (nn.LSTMCell, "lstm", 4), "GRUCell": (nn.GRUCell, "gru", 3)}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_a_cell_traced_for_a_gpu_makes_the_gpus_calls(name, training, bias):
    """RNN.cpp on a CUDA input: matmul(input, w_ih.t()) and matmul(h, w_hh.t()) without the
    biases, then the fused kernel, each step; its backward in training. No gate-by-gate
    operator, and no note: the trace took the GPU's way."""
    cell, kind, gates = CELLS[name]
    drive = protocol(cell_loop(cell, bias), "meta", torch.float32, training)
    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    assert trace.stopped is None
    assert "recurrent cells" not in trace.notes
    names = [call[0] for call in calls(trace)]
    fused = f"aten._thnn_fused_{kind}_cell.default"
    backward = f"aten._thnn_fused_{kind}_cell_backward{'_impl' if kind == 'lstm' else ''}.default"
    assert names.count(fused) == TOKENS * 2  # the cold step and the warm one
    assert names.count(backward) == (TOKENS * 2 if training else 0)
    assert not {"aten.sigmoid_.default", "aten.sigmoid.default", "aten.tanh_.default"} & set(names)
    at = names.index(fused)
    assert names[at - 2 : at] == ["aten.mm.default", "aten.mm.default"]
    found = calls(trace)
    outputs = dict(found)
    state = BATCH * WIDTH * 4  # float32
    if kind == "lstm":
        assert outputs[fused] == ((0, state), (1, state), (2, 4 * state))
    else:
        assert outputs[fused] == ((0, state), (1, 5 * state))
    assert found[at - 1][1] == ((0, gates * state),)


@pytest.mark.parametrize(
    ("cell", "named"), [(nn.LSTMCell, True), (nn.GRUCell, True), (nn.RNNCell, False)],
    ids=["LSTMCell", "GRUCell", "RNNCell"],
)  # fmt: skip
def test_without_a_target_the_cells_are_named_and_traced_as_they_come(cell, named):
    """No GPU named: nothing says which kernel a GPU takes, so the meta device runs LSTMCell
    and GRUCell gate by gate, named, neither an exact claim nor bounds (a GPU runs one fused
    kernel). RNNCell runs the same operators on every device."""
    trace = tp.run_trace(torch, "meta", protocol(cell_loop(cell, True), "meta",
                                                 torch.float32, True))  # fmt: skip
    assert ("recurrent cells" in trace.notes) == named
    assert not any("thnn" in call[0] for call in calls(trace))
    prediction = tp.predict(trace)
    if named:
        assert prediction.status == tp.PredictionStatus.APPROXIMATE
        assert prediction.bounds is None
        assert "recurrent cells" in prediction.unbounded


def workspace(dtype, batch, width):
    return {"workspace": ("tensor", dtype, [batch, width], [width, 1], 0, 0, "device")}


def test_the_fused_kernels_allocate_their_outputs_in_rnn_cus_order():
    """RNN.cu allocates the workspace before h' (and c'), and returns it last."""
    template = fused_cells.by_source_template
    assert template(fused_cells.LSTM_CELL, {}, rs.H200) == [
        ("output", 2, None), ("output", 0, None), ("output", 1, None)
    ]  # fmt: skip
    assert template(fused_cells.GRU_CELL, {}, rs.H200) == [("output", 1, None), ("output", 0, None)]
    args = {**workspace("float32", 8, 4 * 96), "has_bias": False}
    assert template(fused_cells.LSTM_CELL_BACKWARD, args, rs.H200) == [
        ("output", 0, None), ("output", 1, None)
    ]  # fmt: skip
    args = {**workspace("bfloat16", 8, 5 * 96), "has_bias": False}
    assert template(fused_cells.GRU_CELL_BACKWARD, args, rs.H200) == [
        ("output", 0, None), ("output", 1, None), ("output", 2, None)
    ]  # fmt: skip


def test_the_biases_gradient_is_a_sum_over_the_batch_with_the_reduction_kernels_blocks():
    """With biases, the backward sums the gates' gradient over the batch inside the call:
    no staging at batch 8; at batch 1,024 the H200's reduction kernel stages 8 MiB and 32
    bytes of semaphores for 1,024 float32 gates (reduce_scratch), freed before the call
    returns."""
    template = fused_cells.by_source_template
    small = template(fused_cells.LSTM_CELL_BACKWARD, {**workspace("float32", 8, 1024),
                                                      "has_bias": True}, rs.H200)  # fmt: skip
    assert small == [("output", 0, None), ("output", 1, None), ("output", 2, None)]
    large = template(fused_cells.LSTM_CELL_BACKWARD, {**workspace("float32", 1024, 1024),
                                                      "has_bias": True}, rs.H200)  # fmt: skip
    assert large == [
        ("output", 0, None), ("output", 1, None), ("output", 2, None),
        ("internal", 0, 8_388_608), ("internal", 1, 32), ("free", 1), ("free", 0),
    ]  # fmt: skip
    gru = template(fused_cells.GRU_CELL_BACKWARD, {**workspace("float32", 1024, 5 * 256),
                                                   "has_bias": True}, rs.H200)  # fmt: skip
    assert gru[:3] == [("output", 0, None), ("output", 1, None), ("output", 2, None)]
    assert gru[3:] == [
        ("output", 3, None), ("internal", 0, 6_291_456), ("internal", 1, 24), ("free", 1),
        ("free", 0), ("output", 4, None), ("internal", 2, 6_291_456), ("internal", 3, 24),
        ("free", 3), ("free", 2),
    ]  # fmt: skip
    assert template(fused_cells.LSTM_CELL_BACKWARD, {"has_bias": True}, rs.H200) is None


@pytest.mark.parametrize("name", sorted(CELLS))
def test_a_cell_without_biases_is_traced(name):
    """PyTorch's meta kernel of _thnn_fused_lstm_cell reads `None.device` for a cell without
    biases; the trace's own fake kernel does not."""
    cell = CELLS[name][0]
    drive = protocol(cell_loop(cell, False), "meta", torch.bfloat16, True)
    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    assert trace.stopped is None
    assert tp.predict(trace).status != tp.PredictionStatus.NOT_PREDICTED


@pytest.mark.parametrize("claimed", [True, False], ids=["claimed", "not-claimed"])
def test_the_h200s_prediction_of_a_cell_loop_rests_on_the_templates_only_when_claimed(
    monkeypatch, claimed
):
    """Products (calibrated patterns) and the fused kernels (by source): claimed, nothing
    unknown; not claimed, the fused calls are uncovered, named why, and bounded, with the
    same central figure."""
    from pipeline.predicting import gpu_calibration

    calibration, _ = gpu_calibration.load("h200")
    monkeypatch.setattr(fused_cells, "CLAIMED", claimed)
    for name in sorted(CELLS):
        drive = protocol(cell_loop(CELLS[name][0], True), "meta", torch.float32, True)
        trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
        prediction = tp.predict(trace, calibration)
        fused = [entry for entry in prediction.unknown if "thnn" in entry["op"]]
        if claimed:
            assert fused == []
        else:
            assert len(fused) == 2
            assert all(fused_cells.UNMEASURED in entry["why"] for entry in fused)
            assert prediction.status == tp.PredictionStatus.APPROXIMATE
            assert prediction.bounds is not None
        monkeypatch.setattr(fused_cells, "CLAIMED", True)
        assert tp.predict(trace, calibration).rows == prediction.rows
        monkeypatch.setattr(fused_cells, "CLAIMED", claimed)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_the_gpu_free_trace_makes_the_calls_a_gpus_fake_tensors_make(name, bias, dtype):
    """On a GPU's fake tensors ATen's own LSTMCell/GRUCell takes the fused path (its input
    is CUDA): the meta trace made for the H200 must make the same calls, with the same
    outputs, in the same order."""
    build = cell_loop(CELLS[name][0], bias)
    on_gpu = tp.run_trace(torch, "cuda:0", protocol(build, "cuda:0", dtype, True))
    for_gpu = tp.run_trace(torch, "meta", protocol(build, "meta", dtype, True), target=ac.H200)
    assert on_gpu.stopped is None
    assert for_gpu.stopped is None
    assert calls(for_gpu) == calls(on_gpu)
