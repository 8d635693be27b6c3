"""Recurrent layers as a GPU with cuDNN runs them, for a trace made for that GPU.

On a GPU, torch.lstm, gru, rnn_tanh and rnn_relu call one operator, `_cudnn_rnn`, and
autograd records `_cudnn_rnn_backward`; the meta device runs the layers step by step
instead: other operators, other blocks. With a target GPU, the trace calls `_cudnn_rnn` as
PyTorch's `_cudnn_impl` does (aten/src/ATen/native/cudnn/RNN.cpp), and both operators get
fake kernels that make the blocks the GPU's make, read from that file and from 1,200 calls
probed on an H200 (runs/20261205T163041Z-h200-rnn-probe) and 261 more on an H100
(runs/20261205T184600Z-h100-rnn-probe-2):

- forward: the output (allocated [seq, batch, directions x out] and transposed back for
  batch_first), h_n, c_n; a weight buffer in cuDNN's layout at each call, unless the
  parameters are views of one (`flatten_parameters` makes them so when the module is moved
  to the GPU, in float16 and float32, never in bfloat16, which torch.backends.cudnn does not
  accept); in training mode (the module's, not autograd's), the reserve backward reads;
- backward: the gradients of the input, h_0 and c_0, and one buffer for the weights'
  gradients, whose views the parameters' `.grad` become.

Not covered, so the prediction is approximate: cuDNN's workspace, a block made and freed
inside each call, and the zeros and contiguous copies a call makes for itself. In every
probe, forward and backward, the workspace was 8 MiB per layer and direction plus at most
the weight matrices' bytes, the call's copies and 3.8 times `workspace_growth` (a term in
tokens x widths and batch x layers x widths read from the H200's probes; 3.3 on the H100's
held-out ones);
the most replay gives each call that fixed part, the weights, WORKSPACE_GROWTH_FACTOR times
the growth and the call's own copies (`scratch_bound`). The
reserve's size is cuDNN's own arithmetic: RESERVE_PER_LAYER's rule held in 1,025 of 1,026
H200 calls and 87 of 100 H100 ones, the others up to 40 bytes larger (an alignment).

Dropout between layers in training (`nn.LSTM(..., dropout=p)`, the default of PyTorch's own
word-language-model example) is followed as `get_dropout_state` runs it: the first such call
of the process (and the first after a seed is set) makes an 8-byte seed tensor and frees it,
then cuDNN's dropout state, kept to the end of the process; the reserve holds a mask of
(layers - 1) x tokens x hidden x directions^2 bits besides the rule's bytes. The H100's probe
(a fresh process first, then 16 training calls with dropout) gave a state of 6,488,064 bytes
(49,152 per multiprocessor, 132 of them; the H200 has 132 too) and reserves 0 to 308 bytes
above the rule and the mask, the rule alone being 8 to 40 bytes short in 13 of 100 calls
without dropout: the most replay gives each reserve RESERVE_SLACK bytes more. A workload
that sets a seed between its recurrent calls makes the GPU build the state again, for a
moment twice: not followed.

An LSTM with projections and dropout keeps its mask on the projected outputs, (layers - 1) x
tokens x proj x directions^2 bits; float64 calls follow the same rules in 8-byte elements,
their parameters flattened as float32's are: a third H100 probe (62 training calls with
projections and dropout, 129 calls in float64; runs/20261206T044500Z-h100-rnn-probe-3) gave
every reserve 0 to 240 bytes above these rules and every workspace within the bound.

A packed sequence (packed_sequences.py, its batch sizes known) takes the same call with
them: the packed data's tokens stand for seq x batch in the rules and its largest batch
size for the batch; no probe ran packed calls, so the bound above is all the prediction says
of their workspace.
"""

from __future__ import annotations

from pipeline.core import torch_private
from pipeline.predicting import packed_sequences

# cudnnRNNMode_t, as PyTorch passes it to _cudnn_rnn
RNN_RELU, RNN_TANH, LSTM, GRU = 0, 1, 2, 3
GATES = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 4, GRU: 3}
MODE_BY_NAME = {"RNN_RELU": RNN_RELU, "RNN_TANH": RNN_TANH, "LSTM": LSTM, "GRU": GRU}  # .mode
# The reserve: (RESERVE_PER_LAYER x layers - 1) x tokens x hidden x directions elements,
# and RESERVE_EXTRA bytes (the module's docstring says where it held).
RESERVE_PER_LAYER = {RNN_RELU: 2, RNN_TANH: 2, LSTM: 6, GRU: 7}
RESERVE_EXTRA = 256
PROJECTED_PER_LAYER = 7  # an LSTM with projections (reserve_bytes)
# The workspace's part that does not grow with the shapes, per layer and direction: 8 MiB
# in every probe; beyond it and the weights and copies (scratch_bound), at most 3.8 times
# workspace_growth (3.3 on the held-out H100 calls), allowed 6.
RNN_WORKSPACE_PER_LAYER = 8 * 2**20
WORKSPACE_GROWTH_FACTOR = 6
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
FORWARD = "aten._cudnn_rnn.default"
BACKWARD = "aten._cudnn_rnn_backward.default"
DTYPES = ("float32", "float16", "bfloat16", "float64")  # probed
FLATTENED = ("float32", "float16", "float64")  # torch.backends.cudnn.is_acceptable
# cuDNN's dropout state (cudnnDropoutGetStatesSize): 6,488,064 B on the H100's 132
# multiprocessors; the GPUs below by their name as torch.cuda.get_device_name gives it.
DROPOUT_STATE_PER_MULTIPROCESSOR = 49152
MULTIPROCESSORS = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132}
DEFAULT_MULTIPROCESSORS = 132
# The most a reserve exceeded its rule (and mask) in the probes was 308 bytes.
RESERVE_SLACK = 1024
HELD_STATE = "cuDNN dropout state"


PACKED_CALLS = "recurrent layers on packed sequences"
PACKED_UNBOUNDED = "cuDNN's workspace in calls on packed sequences was never probed"
PACKED_WHY = (
    f"{PACKED_UNBOUNDED}, and its blocks move the reserved peak past the bound of unpacked "
    "calls (an LSTM language model measured on an H100: 23 MB above that bound): "
    "approximate, without bounds"
)


def packed(args) -> bool:
    """Whether torch.lstm/gru/rnn_*'s arguments are a packed sequence's (data, batch_sizes,
    hx, params, ...), not a padded batch's (input, hx, params, has_biases, ...)."""
    return len(args) == 9 and not isinstance(args[3], bool)


def mode_of(torch, func) -> int | None:
    modes = {torch.lstm: LSTM, torch.gru: GRU, torch.rnn_tanh: RNN_TANH, torch.rnn_relu: RNN_RELU}
    return modes.get(func)


def weight_elements(mode, input_size, hidden, proj, layers, directions) -> int:
    """cuDNN's weight buffer, in elements: each layer and direction's input-hidden and
    hidden-hidden matrices, its projection, and two bias vectors, which cuDNN keeps whether
    the module has biases or not (the probes' buffers of modules without them)."""
    gates, out = GATES[mode], proj or hidden
    total = 0
    for layer in range(layers):
        inputs = input_size if layer == 0 else out * directions
        per_direction = gates * hidden * (inputs + out) + 2 * gates * hidden
        total += directions * (per_direction + (proj * hidden if proj else 0))
    return total


def reserve_bytes(
    mode, layers, directions, tokens, hidden, proj, element_bytes, dropout: bool = False
) -> int:
    """The reserve: with projections, each layer keeps its hidden state before and after
    the projection too ((7 layers - 1) x hidden + layers x proj: 174 of 174 H200 probes);
    with dropout, the mask on the outputs between layers (projected ones where the layers
    project), one bit per element (the module's docstring)."""
    per_token = (RESERVE_PER_LAYER[mode] * layers - 1) * hidden
    if proj:
        per_token = (PROJECTED_PER_LAYER * layers - 1) * hidden + layers * proj
    out = proj or hidden
    mask = -(-(layers - 1) * tokens * out * directions**2 // 8) if dropout else 0
    return per_token * tokens * directions * element_bytes + RESERVE_EXTRA + mask


def output_slack(name: str) -> dict:
    """{output index: bytes} the most replay adds to an operator's outputs: the forward's
    reserve (index 3), which the rule gives to within RESERVE_SLACK bytes. A probe of the
    call on a GPU gives its size itself: the replay takes the probe's."""
    return {3: RESERVE_SLACK} if name == FORWARD else {}


def probe_arguments(torch, name: str, args):
    """The backward's arguments as a probe passes them: its reserve RESERVE_SLACK bytes
    longer, since cuDNN refuses a reserve shorter than its own size, which the trace gives
    within that slack (the bytes past it are never read)."""
    if name != BACKWARD or len(args) < 21 or not isinstance(args[20], torch.Tensor):
        return args
    reserve = args[20]
    longer = reserve.new_zeros(reserve.numel() + RESERVE_SLACK)
    return (*args[:20], longer, *args[21:])


def dropout_state_bytes(gpu_name: str | None) -> int:
    return DROPOUT_STATE_PER_MULTIPROCESSOR * MULTIPROCESSORS.get(gpu_name, DEFAULT_MULTIPROCESSORS)


def dropout_state(torch, x, held: dict, gpu_name: str | None):
    """`get_dropout_state` on the first call: the seed made and freed, then the state, kept
    in `held` (the trace's) as the process keeps it."""
    state = held.get(HELD_STATE)
    if state is None:
        x.new_empty((), dtype=torch.int64)  # the seed; freed at once
        state = held[HELD_STATE] = x.new_empty(dropout_state_bytes(gpu_name), dtype=torch.uint8)
    return state


def rnn_as_on_gpu(torch, func, args, kwargs, held: dict, gpu_name: str | None):
    """torch.lstm/gru/rnn_* as `_cudnn_impl` calls cuDNN, or None where the GPU's call is
    not followed (see the module's docstring) or cuDNN would not take it. `held`: what the
    trace keeps alive as the process would (the dropout state)."""
    mode = mode_of(torch, func)
    if mode is None or kwargs or len(args) != 9:
        return None
    batch_sizes: list = []
    if not packed(args):
        x, hidden, params, has_biases, layers, dropout, train, bidirectional, batch_first = args
    else:  # a packed sequence: (data, batch_sizes, hx, params, ...), its batch sizes real
        x, sizes, hidden, params, has_biases, layers, dropout, train, bidirectional = args
        if not packed_sequences.has_values(torch, sizes) or x.dim() != 2:
            return None  # batch sizes without values (a fake tensor): not followed
        batch_sizes, batch_first = sizes.tolist(), False
    hx, cx = (hidden[0], hidden[1]) if mode == LSTM else (hidden, None)
    if not torch.backends.cudnn.enabled or str(x.dtype).removeprefix("torch.") not in DTYPES:
        return None
    if x.dim() != (2 if batch_sizes else 3) or any(p.dtype != x.dtype for p in params):
        return None
    hidden_size, proj = hx.size(2), 0
    if cx is not None and cx.size(2) != hx.size(2):  # an LSTM with projections
        hidden_size, proj = cx.size(2), hx.size(2)
    state = None
    if dropout > 0 and train:
        state = dropout_state(torch, x, held, gpu_name)
    forward = torch_private.cudnn_rnn_operators(torch)[0]
    output, hy, cy, _, _ = forward(
        x,
        list(params),
        (4 if has_biases else 2) + (1 if proj else 0),
        weight_buffer(torch, params, mode, x.size(-1), hidden_size, proj, layers, bidirectional),
        hx,
        cx,
        mode,
        hidden_size,
        proj,
        layers,
        batch_first,
        dropout,
        train,
        bidirectional,
        batch_sizes,
        state,
    )
    return (output, hy, cy) if mode == LSTM else (output, hy)


def weight_buffer(torch, params, mode, input_size, hidden, proj, layers, bidirectional):
    """`try_get_weight_buf`: the parameters' one storage as a flat tensor when all of them
    are views of it (a module flattened on the GPU), else None: _cudnn_rnn makes a buffer."""
    storages = {torch_private.StorageWeakRef(p.untyped_storage()).cdata for p in params}
    if len(storages) != 1 or not params[-1].is_contiguous():
        return None
    elements = weight_elements(mode, input_size, hidden, proj, layers, 2 if bidirectional else 1)
    first = params[0]
    if first.untyped_storage().nbytes() < elements * first.element_size():
        return None
    return first.new_empty(0).set_(first.untyped_storage(), 0, (elements,), (1,))


def flatten_on_fake(torch, module) -> None:
    """nn.RNNBase.flatten_parameters as a GPU runs it for a module of fake tensors: where
    the parameters are float16 or float32, of one dtype, and none aliases another, they are
    copied into one zeroed buffer of cuDNN's size and made views of it
    (`_cudnn_rnn_flatten_weight`): one block made, theirs freed. Without a GPU the real
    method stops at `is_cuda`, beside one at `data_ptr`."""
    weights = module._flat_weights
    if len(weights) != len(module._flat_weights_names) or not torch.backends.cudnn.enabled:
        return
    dtype = weights[0].dtype
    if str(dtype).removeprefix("torch.") not in FLATTENED or any(w.dtype != dtype for w in weights):
        return
    storages = {torch_private.StorageWeakRef(w.untyped_storage()).cdata for w in weights}
    if len(storages) != len(weights):  # parameters that alias: the copying path
        return
    elements = weight_elements(
        MODE_BY_NAME[module.mode], module.input_size, module.hidden_size, module.proj_size,
        module.num_layers, 2 if module.bidirectional else 1,
    )  # fmt: skip
    with torch.no_grad():
        flat = weights[0].new_zeros(elements)
        offset = 0
        for w in weights:
            view = flat[offset : offset + w.numel()].view_as(w)
            view.copy_(w)
            w.set_(view)
            offset += w.numel()


def _forward(fake_mode, func, *args, **kwargs):
    """_cudnn_rnn's blocks (the module's docstring), on fake tensors."""
    import torch

    (x, _weight, _stride0, weight_buf, hx, cx, mode, hidden, proj, layers, batch_first, dropout,
     train, bidirectional, batch_sizes, _state) = args  # fmt: skip
    directions = 2 if bidirectional else 1
    out = proj or hidden
    with fake_mode:
        if batch_sizes:
            tokens, batch = x.size(0), batch_sizes[0]
            output = x.new_empty((tokens, out * directions))
        else:
            seq, batch = (x.size(1), x.size(0)) if batch_first else (x.size(0), x.size(1))
            tokens = seq * batch
            output = x.new_empty((seq, batch, out * directions))
            if batch_first:
                output = output.transpose(0, 1)
        hy = hx.new_empty((layers * directions, batch, out))
        cy = hx.new_empty(0) if cx is None else cx.new_empty((layers * directions, batch, hidden))
        if weight_buf is None:
            weight_buf = x.new_empty(
                weight_elements(mode, x.size(-1), hidden, proj, layers, directions)
            )
        size = reserve_bytes(
            mode, layers, directions, tokens, hidden, proj, x.element_size(), dropout > 0
        )
        reserve = x.new_empty(size if train else 0, dtype=torch.uint8)
    return output, hy, cy, reserve, weight_buf


def _backward(fake_mode, func, *args, **kwargs):
    """_cudnn_rnn_backward's outputs; the weights' gradients are views of one buffer, in the
    order of the weights (their offsets in cuDNN's layout do not change any block)."""
    (x, weight, _stride0, weight_buf, hx, cx, _output, _go, _ghy, _gcy, _mode, _hidden, _proj,
     _layers, batch_first, _dropout, _train, _bidirectional, batch_sizes, _state, _reserve,
     mask) = args  # fmt: skip
    with fake_mode:
        if batch_first and not batch_sizes:  # made in cuDNN's order, handed back transposed
            time_major = x.transpose(0, 1)
            dx = time_major.new_empty(time_major.shape).transpose(0, 1)
        else:
            dx = x.new_empty(x.shape)
        dhx = hx.new_empty(hx.shape)
        dcx = cx.new_empty(cx.shape) if cx is not None else None
        dw = []
        if mask[3]:
            flat = weight_buf.new_empty(weight_buf.shape)  # zeros, then filled by cuDNN
            offset = 0
            for w in weight:
                dw.append(flat[offset : offset + w.numel()].view(w.shape))
                offset += w.numel()
    return dx, dhx, dcx, dw


def add_fake_kernels(torch):
    """Both operators' fake kernels, for the trace's time; returns the undo."""
    forward, backward = torch_private.cudnn_rnn_operators(torch)
    undo = [
        torch_private.add_fake_kernel(forward, _forward),
        torch_private.add_fake_kernel(backward, _backward),
    ]
    return lambda: [step() for step in reversed(undo)]


def workspace_growth(mode, input_size, hidden, layers, directions, tokens, batch, element):
    """The workspace's part that grows with the call, as the probes show its shape: per token
    the gates' and two more states' widths and twice the input, per batch row 20 states per
    layer and direction, and 64 KiB."""
    per_token = directions * (GATES[mode] + 2) * hidden + 2 * input_size
    return element * (tokens * per_token + 20 * layers * directions * batch * hidden) + 65536


def scratch_bound(arguments: dict) -> int | None:
    """The most a recorded _cudnn_rnn or _cudnn_rnn_backward call allocates besides its
    outputs, from its arguments (tensors as trace.recorder.describe gives them): the
    workspace's bound (the module's docstring) and the copies the call makes for itself (its
    input and output made contiguous, zeros for the state gradients autograd did not give).
    None: not a call this bound speaks for."""
    x = arguments.get("input")
    if not (isinstance(x, tuple) and x and x[0] == "tensor") or x[1] not in ELEMENT_BYTES:
        return None
    element, shape = ELEMENT_BYTES[x[1]], x[2]
    mode, hidden, proj = arguments["mode"], arguments["hidden_size"], arguments["proj_size"]
    layers, directions = arguments["num_layers"], 2 if arguments["bidirectional"] else 1
    if len(shape) == 2 and arguments["batch_sizes"]:
        tokens, batch = shape[0], arguments["batch_sizes"][0]
    elif len(shape) == 3:
        batch = shape[0] if arguments["batch_first"] else shape[1]
        tokens = shape[0] * shape[1]
    else:
        return None
    out = proj or hidden
    matrices = weight_elements(mode, shape[-1], hidden, proj, layers, directions)
    matrices -= 2 * GATES[mode] * hidden * layers * directions  # the biases
    growth = workspace_growth(mode, shape[-1], hidden, layers, directions, tokens, batch, element)
    copies = tokens * (shape[-1] + out * directions) + 2 * layers * directions * batch * (
        out + hidden
    )
    return (
        RNN_WORKSPACE_PER_LAYER * layers * directions
        + element * (matrices + copies)
        + WORKSPACE_GROWTH_FACTOR * growth
    )
