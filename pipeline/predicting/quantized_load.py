"""A model loaded in 4 bits by transformers' from_pretrained (bitsandbytes' Params4bit), traced
without a GPU: the meta device stands for the GPU, so what bitsandbytes does only for a GPU
is done here as a GPU does it. from_pretrained's own steps (its skeleton, the allocator
warm-up, the loader's threads) are from_pretrained.py's.

Read in transformers 5.23 (modeling_utils.py, integrations/bitsandbytes.py) and bitsandbytes
0.50.2 (nn/modules.py, functional.py, _ops.py):

- The quantisation. `Params4bit.to(device)` quantises a weight the first time it is moved to
  any device but meta (`_quantize`: `functional.quantize_4bit`, whose operators have fake
  kernels in _ops.py); on meta it is moved unquantised. Here meta is the GPU: it quantises.
- The quantisation map. `functional.quantize_blockwise` (a nested quantisation's absmax)
  keeps the map it makes on the first call's device for the process (`name2qmap`): each
  trace starts without one, as a fresh process on a GPU does.
- The parameter. `Params4bit.__new__` wraps its data with `torch.Tensor._make_subclass`,
  which refuses a fake tensor (its Python object is a FakeTensor already). nn.Parameter meets
  the same and, for a tensor of another class, returns the tensor itself, detached, marked
  as a parameter (torch/nn/parameter.py). Here, in every trace (beside a GPU too), the
  detached fake tensor takes a class that is both the parameter's class and FakeTensor
  (`fake_class`): bitsandbytes' methods and attributes as written, FakeTensor's dispatch.

A checkpoint quantized already (its config's quantization_config) is loaded another way, also
followed here:

- The packed quantisation state. `QuantState.as_dict(packed=True)` (what save_pretrained
  writes) packs its non-tensor fields as JSON bytes in a uint8 tensor, one 512-byte block on
  the device (a few hundred bytes whatever its digits); `from_prequantized` reads them back
  with `.cpu().numpy()`. A fake tensor holds no bytes: here the fields packed for a weight's
  shape are kept and read back for a layer of that shape; the nested offset a fake tensor
  cannot say (`.item()`) is written as 0.0, the mean of a zero checkpoint's absmax.

Both loads read a checkpoint the lab makes of zeros on the host (`hf_model.host_zeros`): here
each of its tensors is a fake tensor of the host (a shape, a dtype, no bytes): its values
change no block, and a 70B model's would not fit the memory of the machine that predicts. The
host's own work on them (a quantisation on the host, to make a quantized checkpoint) is then
shapes only too.

Nothing is installed where bitsandbytes is not imported already (a workload that loads in 4
bits imports it before its trace). The quantisation on meta only in a trace whose device is
meta; the rest in every trace.
A trace that quantised a weight notes NOTE while CHECKED_ON_A_GPU is False, which withholds
"exact" and the bounds (trace.bounds.boundable).

Standard library, torch_private and from_pretrained's `replace` only (torch is passed in).
"""

from __future__ import annotations

import sys

from pipeline.core import torch_private
from pipeline.predicting.from_pretrained import replace

NOTE = "4-bit weights (bitsandbytes)"
# The same for a checkpoint quantized already (its own quantization_config), loaded without
# any quantisation on the device: while False, such a load notes PREQUANTIZED_NOTE.
PREQUANTIZED_CHECKED_ON_A_GPU = True
PREQUANTIZED_NOTE = "a 4-bit checkpoint's load (bitsandbytes)"
PREQUANTIZED_UNCHECKED_WHY = (
    "the load follows transformers' loading of a checkpoint bitsandbytes quantized (packed "
    "weights and quantisation state copied as they are) and has not yet been held against a "
    "GPU's measurement: the central figure follows it, no bounds are claimed"
)
# Whether a GPU's measurements of models loaded in 4 bits have been held against predictions
# traced this way (they have: the evidence page says where). While False, a trace that
# quantised a weight says so in a note that withholds "exact" and the bounds.
CHECKED_ON_A_GPU = True
UNCHECKED_WHY = (
    "the load follows transformers' from_pretrained and bitsandbytes' quantisation (packed "
    "4-bit weights, their absmax blocks and quantisation state, the allocator warm-up) and "
    "has not yet been held against a GPU's measurement: the central figure follows it, no "
    "bounds are claimed"
)


def install(torch, recorder, notes: dict, on_meta: bool):
    """The steps above, for the trace's time; returns the undo. Nothing is installed where
    bitsandbytes is not imported."""
    bnb = sys.modules.get("bitsandbytes.nn.modules")
    if bnb is None:
        return lambda: None
    undo = [torch_private.wrap_make_subclass(torch, _fake_parameters(torch))]
    workload = sys.modules.get("pipeline.workloads.hf_model")
    if workload is not None:
        undo.append(replace(workload, "host_zeros", _fake_host_zeros(recorder.tracer.fake)))
    functional = sys.modules.get("bitsandbytes.functional")
    if functional is not None:
        undo.append(_fresh_maps(functional.name2qmap))
        undo += _packed_states(torch, functional, bnb.Params4bit, notes)
    if on_meta:
        undo.append(replace(bnb.Params4bit, "to", _quantised_on_meta(torch, bnb, notes)))

    def restore():
        while undo:
            undo.pop()()

    return restore


def _fake_host_zeros(fake_mode):
    """host_zeros as a fake tensor of the host: a meta tensor of that shape, wrapped as the
    fake mode wraps its own, its device the CPU."""
    fake = torch_private.FakeTensor

    def host_zeros(torch, shape, dtype):
        # made with every mode off: the trace's recorder would take a meta tensor for the GPU's
        with torch_private._disable_current_modes():
            empty = torch.empty(shape, dtype=dtype, device="meta")
        return fake(fake_mode, empty, torch.device("cpu"))

    return host_zeros


class _ZeroOffset:
    """What as_dict reads of a nested offset a fake tensor holds: `.item()`, here 0.0."""

    @staticmethod
    def item() -> float:
        return 0.0


def _packed_states(torch, functional, params, notes: dict):
    """as_dict packs what a fake tensor can say; from_prequantized reads back the fields
    packed for a weight of the layer's shape."""
    fake = torch_private.FakeTensor
    packed: dict = {}  # a weight's shape -> the fields pack_dict_to_tensor packed for it
    state = functional.QuantState
    original_as_dict = state.__dict__["as_dict"]
    original_pack = functional.pack_dict_to_tensor
    original_from = params.__dict__["from_prequantized"].__func__

    def as_dict(self, *args, **kwargs):
        offset = self.offset
        if isinstance(offset, fake):
            self.offset = _ZeroOffset()
        try:
            return original_as_dict(self, *args, **kwargs)
        finally:
            self.offset = offset

    def pack_dict_to_tensor(source):
        if isinstance(source.get("shape"), (list, tuple)):
            packed[tuple(source["shape"])] = dict(source)
        return original_pack(source)

    def from_prequantized(cls, data, quantized_stats, *args, module=None, **kwargs):
        key = next(
            (k for k, v in quantized_stats.items() if "quant_state" in k and isinstance(v, fake)),
            None,
        )
        if not PREQUANTIZED_CHECKED_ON_A_GPU:
            notes.setdefault(PREQUANTIZED_NOTE, PREQUANTIZED_UNCHECKED_WHY)
        if key is not None and module is not None:
            shape = (module.out_features, module.in_features)
            if shape not in packed:
                raise RuntimeError(
                    f"a packed quantisation state for a {shape} weight that was not packed "
                    "in this trace: its fields are not known"
                )
            quantized_stats.pop(key)  # as QuantState.from_dict pops it
            quantized_stats.update(packed[shape])
        return original_from(cls, data, quantized_stats, *args, module=module, **kwargs)

    return [
        replace(state, "as_dict", as_dict),
        replace(functional, "pack_dict_to_tensor", pack_dict_to_tensor),
        replace(params, "from_prequantized", classmethod(from_prequantized)),
    ]


def _fresh_maps(maps: dict):
    """bitsandbytes keeps the quantisation map it makes at its first blockwise quantisation
    on a device (`functional.name2qmap`) for the rest of the process: a GPU process makes it
    once, on the GPU. The trace starts without it, as a fresh process does, and what it made
    goes with the trace."""
    held = dict(maps)
    maps.clear()

    def undo():
        maps.clear()
        maps.update(held)

    return undo


_FAKE_CLASSES: dict = {}


def fake_class(torch, cls):
    """A class that is both the parameter class `cls` and FakeTensor, made once per class."""
    made = _FAKE_CLASSES.get(cls)
    if made is None:
        fake = torch_private.FakeTensor
        made = _FAKE_CLASSES[cls] = type(f"Fake{cls.__name__}", (cls, fake), {})
    return made


def _fake_parameters(torch):
    fake = torch_private.FakeTensor

    def make(original, cls, data, require_grad=False, **kwargs):
        if isinstance(data, fake) and issubclass(cls, torch.nn.Parameter) and not kwargs:
            alias = data.detach()
            alias.requires_grad_(require_grad)
            alias.__class__ = fake_class(torch, cls)
            return alias
        return original(cls, data, require_grad, **kwargs)

    return make


def _quantised_on_meta(torch, bnb, notes: dict):
    original = bnb.Params4bit.__dict__["to"]

    def to(self, *args, **kwargs):
        device = torch_private.to_device(torch, *args, **kwargs)
        if device is not None and device.type == "meta" and not self.bnb_quantized:
            if not CHECKED_ON_A_GPU:
                notes.setdefault(NOTE, UNCHECKED_WHY)
            return self._quantize(device)
        return original(self, *args, **kwargs)

    return to
