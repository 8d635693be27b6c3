"""LSTMCell and GRUCell as a GPU runs them, for a trace made for that GPU.

On a CUDA input, ATen's LSTMCell and GRUCell (aten/src/ATen/native/RNN.cpp, the `operator()`
of `LSTMCell` and `GRUCell`, which `lstm_cell` and `gru_cell` call) compute the gates' two
products with `matmul(input, w_ih.t())` and `matmul(h, w_hh.t())`, without the biases, and
hand them to one fused kernel, `_thnn_fused_lstm_cell` or `_thnn_fused_gru_cell`, which adds
the biases itself and returns a workspace that autograd saves for backward. The meta device
runs the cell gate by gate instead: other operators, other blocks. With a target GPU, the
trace makes the GPU's calls (`cell_as_on_gpu`).

The kernels' blocks, from aten/src/ATen/native/cuda/RNN.cu, in the order they are allocated
(`by_source_template`; outputs only, but not in the order they are returned):

- `_thnn_fused_lstm_cell`: the workspace (like the input gates, [batch, 4 x hidden]), then
  h' and c'; it returns (h', c', workspace);
- `_thnn_fused_lstm_cell_backward_impl`: the gates' gradient ([batch, 4 x hidden]), c's
  gradient, then, with biases, the gates' gradient summed over the batch (`sum(0)`: a
  reduction, whose staging blocks on the GPU are reduce_scratch's);
- `_thnn_fused_gru_cell`: the workspace ([batch, 5 x hidden]), then h'; returns (h',
  workspace);
- `_thnn_fused_gru_cell_backward`: the input gates' and hidden gates' gradients ([batch,
  3 x hidden] each), h's gradient, then, with biases, each gates' gradient summed over the
  batch.

PyTorch has no meta kernels for the GRU's two operators, and the LSTM's forward one fails
for a cell without biases: the trace gives those fake kernels of its own
(`add_fake_kernels`), with the outputs above.

Standard library only (torch is passed in).
"""

from __future__ import annotations

from pipeline.core import torch_private
from pipeline.core.call_keys import is_tensor_leaf
from pipeline.predicting import reduce_scratch

# Whether the templates below are claimed (an exact prediction may rest on them) or give
# the central figure only, the calls staying uncovered and bounded. Claimed since the exact
# claims made with them before a measurement on the H200 held (the evidence page says where).
CLAIMED = True
UNMEASURED = (
    "its blocks are read from PyTorch's RNN.cu (fused_cells.py) and give the central figure, "
    "not yet checked against a GPU's measurement"
)
LSTM_CELL = "aten._thnn_fused_lstm_cell.default"
LSTM_CELL_BACKWARD = "aten._thnn_fused_lstm_cell_backward_impl.default"
GRU_CELL = "aten._thnn_fused_gru_cell.default"
GRU_CELL_BACKWARD = "aten._thnn_fused_gru_cell_backward.default"
OPERATORS = (LSTM_CELL, LSTM_CELL_BACKWARD, GRU_CELL, GRU_CELL_BACKWARD)
GRU_WORKSPACE_MULTIPLIER = 5  # RNN.cu
CELL_PARAMETERS = ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh")


def cell_as_on_gpu(torch, func, args, kwargs):
    """torch.lstm_cell or torch.gru_cell as RNN.cpp runs it on a CUDA input: the two
    products, then the fused kernel; (h', c') or h'."""
    call = {"b_ih": None, "b_hh": None, **dict(zip(CELL_PARAMETERS, args, strict=False)), **kwargs}
    x, hidden, w_ih, w_hh = call["input"], call["hx"], call["w_ih"], call["w_hh"]
    operators, biases = torch_private.fused_cell_operators(torch), (call["b_ih"], call["b_hh"])
    lstm = func is torch.lstm_cell
    h = hidden[0] if lstm else hidden
    igates = torch.matmul(x, w_ih.t())
    hgates = torch.matmul(h, w_hh.t())
    if lstm:
        hy, cy, _workspace = operators["lstm"](igates, hgates, hidden[1], *biases)
        return hy, cy
    return operators["gru"](igates, hgates, hidden, *biases)[0]


def _lstm_forward(fake_mode, func, input_gates, hidden_gates, cx, *_biases):
    with fake_mode:
        workspace = input_gates.new_empty(input_gates.shape)
        return cx.new_empty(cx.shape), cx.new_empty(cx.shape), workspace


def _gru_forward(fake_mode, func, input_gates, hidden_gates, hx, *_biases):
    with fake_mode:
        batch, hidden = hx.shape
        workspace = hx.new_empty((batch, hidden * GRU_WORKSPACE_MULTIPLIER))
        return hx.new_empty((batch, hidden)), workspace


def _gru_backward(fake_mode, func, grad_hy, workspace, has_bias):
    with fake_mode:
        batch, hidden = workspace.size(0), workspace.size(1) // GRU_WORKSPACE_MULTIPLIER
        grad_input_gates = workspace.new_empty((batch, hidden * 3))
        grad_hidden_gates = workspace.new_empty((batch, hidden * 3))
        grad_hx = grad_hy.new_empty(grad_hy.shape)
        biases = (
            (grad_input_gates.new_empty(hidden * 3), grad_hidden_gates.new_empty(hidden * 3))
            if has_bias
            else (None, None)
        )
    return grad_input_gates, grad_hidden_gates, grad_hx, *biases


def add_fake_kernels(torch):
    """Fake kernels for the trace's time: the GRU cell's operators have no meta kernel, and
    the LSTM cell's refuses a cell without biases (its size check reads `None.device`);
    returns the undo."""
    operators = torch_private.fused_cell_operators(torch)
    undo = [
        torch_private.add_fake_kernel(operators["lstm"], _lstm_forward),
        torch_private.add_fake_kernel(operators["gru"], _gru_forward),
        torch_private.add_fake_kernel(operators["gru_backward"], _gru_backward),
    ]
    return lambda: [step() for step in reversed(undo)]


def _summed_over_batch(dtype: str, batch: int, width: int, index: int, first_id: int, device):
    """`gradient.sum(0)` of a contiguous [batch, width] gradient into output `index`, with
    its staging blocks as ids from first_id; None outside reduce_scratch's port."""
    found = reduce_scratch.reduction_template(
        "aten.sum.dim_IntList", (batch, width), (width, 1), dtype, [0], False, None, 0, device
    )
    if found is None:
        return None
    steps = []
    for step in found:
        if step["kind"] == "output":
            steps.append(("output", index, None))
        elif step["kind"] == "internal":
            steps.append(("internal", first_id + step["id"], step["bytes"]))
        else:
            steps.append(("free", first_id + step["id"]))
    return steps


def by_source_template(name: str, arguments: dict, device) -> list | None:
    """The call's template (the module's docstring), or None where it is not known: a sum
    outside reduce_scratch's port. The gradients the sums read are made by the call:
    contiguous, the workspace's dtype and batch."""
    if name == LSTM_CELL:
        return [("output", 2, None), ("output", 0, None), ("output", 1, None)]
    if name == GRU_CELL:
        return [("output", 1, None), ("output", 0, None)]
    workspace = arguments.get("workspace")
    if not is_tensor_leaf(workspace) or len(workspace[2]) != 2:
        return None
    dtype, (batch, width) = workspace[1], workspace[2]
    if name == LSTM_CELL_BACKWARD:
        steps = [("output", 0, None), ("output", 1, None)]
        if not arguments.get("has_bias"):
            return steps
        summed = _summed_over_batch(dtype, batch, width, 2, 0, device)
        return None if summed is None else steps + summed
    if name == GRU_CELL_BACKWARD:
        steps = [("output", 0, None), ("output", 1, None), ("output", 2, None)]
        if not arguments.get("has_bias"):
            return steps
        gates = width // GRU_WORKSPACE_MULTIPLIER * 3
        first = _summed_over_batch(dtype, batch, gates, 3, 0, device)
        second = _summed_over_batch(dtype, batch, gates, 4, 2, device)
        return None if first is None or second is None else steps + first + second
    return None
