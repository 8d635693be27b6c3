"""Packed sequences (`torch.nn.utils.rnn.pack_padded_sequence`) as a GPU run packs them.

`_pack_padded_sequence` reads its lengths' values, which a fake tensor does not have: the
fake mode refuses it. The lengths are a CPU tensor, which the trace computes for real where
every input of theirs is real (`Recorder.on_host`): from a list, `torch.tensor`, `arange`.
Then the trace packs as PyTorch's kernel does (aten/src/ATen/native/PackedSequence.cpp),
through the same operators, so that each block that kernel makes on the GPU is one of the
trace's: per distinct length, the input's slice copied where it is not contiguous (every
one for `batch_first`), the copies concatenated into the packed data, then freed. The batch
sizes are a real CPU tensor, as on the GPU, where the recurrent layer (cudnn_rnn),
`_pad_packed_sequence` and the backward read them.
"""

from __future__ import annotations

from pipeline.core import torch_private

NO_VALUES = (
    "the trace cannot follow the code at aten._pack_padded_sequence: the lengths' values "
    "come from tensors it has no values of (made on the GPU, or from one); lengths made on "
    "the CPU from numbers, as a data loader makes them, are followed"
)


def has_values(torch, lengths) -> bool:
    """Whether the trace knows the values of the lengths (or the batch sizes made from
    them): a real CPU tensor, not a fake one."""
    return type(lengths) is torch.Tensor and lengths.device.type == "cpu"


def pack(torch, input, lengths, batch_first: bool):
    """(data, batch_sizes) as `_pack_padded_sequence` makes them, with its checks."""
    aten = torch.ops.aten
    if lengths.dtype != torch.int64 or lengths.dim() != 1:
        raise RuntimeError(
            "'lengths' argument should be a 1D CPU int64 tensor, but got "
            f"{lengths.dim()}D {lengths.device.type} "
            f"{lengths.type().removeprefix('torch.').removesuffix('Tensor')} tensor"
        )
    if batch_first:
        input = aten.transpose.int(input, 0, 1)
    if input.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    batch = input.size(1)
    values = lengths.tolist()
    if len(values) != batch:
        raise RuntimeError(
            f"Expected `len(lengths)` to be equal to batch_size, but got {len(values)} "
            f"(batch_size={batch})"
        )
    if values[-1] <= 0:
        raise RuntimeError(
            "Length of all samples has to be greater than 0, but found an element in "
            "'lengths' that is <= 0"
        )
    if any(values[i] < values[i + 1] for i in range(batch - 1)):
        raise RuntimeError(
            "`lengths` array must be sorted in decreasing order when `enforce_sorted` is "
            "True. You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
            "pack_sequence to sidestep this requirement if you do not need ONNX "
            "exportability."
        )
    step_shape = [-1, *input.shape[2:]]
    steps, sizes, previous = [], [], 0
    for i in range(batch):
        length = values[batch - 1 - i]
        if length > previous:
            current = batch - i
            block = aten.slice.Tensor(aten.slice.Tensor(input, 0, previous, length), 1, 0, current)
            steps.append(block.contiguous().view(step_shape))
            sizes += [current] * (length - previous)
            previous = length
    data = aten.cat.default(steps)
    del steps, block
    with torch_private.unset_fake_temporarily():
        batch_sizes = torch.tensor(sizes, dtype=torch.int64)
    return data, batch_sizes
