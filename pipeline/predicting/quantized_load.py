"""A model loaded in 4 bits by transformers' from_pretrained (bitsandbytes' Params4bit), traced
without a GPU: the meta device stands for the GPU, so what from_pretrained does only for a
GPU is done here as a GPU does it.

Read in transformers 5.23 (modeling_utils.py, integrations/bitsandbytes.py) and bitsandbytes
0.50.2 (nn/modules.py, functional.py, _ops.py):

- The skeleton. from_pretrained builds the model under `PreTrainedModel.get_init_context`
  (`torch.device("meta")` among its contexts): tensors without memory, which the loaded
  weights then replace. In a trace whose device is meta they would be taken for the GPU's
  blocks: what is made inside those contexts is not recorded (`skeleton`).
- The warm-up. Before loading, `caching_allocator_warmup` asks the GPU for one float16 tensor
  of the bytes the model will hold there (`get_total_byte_count`: a 4-bit weight at half a
  byte a value), dropped at once, so that the caching allocator keeps the segment and splits
  the weights out of it. It skips every device but an accelerator, meta included: here it
  runs as on CUDA. In a fresh process nothing is reserved before the load, so the whole
  count is asked (`unused_memory` 0); the cap of the GPU's memory less 1.2 GiB is not
  applied (no model the lab loads in 4 bits comes near it).
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

Nothing is installed where bitsandbytes is not imported already (a workload that loads in 4
bits imports it, and transformers' modeling_utils, before its trace). The first three only in
a trace whose device is meta, the first two only where modeling_utils is imported; the last
two in every trace.
A trace that quantised a weight notes NOTE while CHECKED_ON_A_GPU is False, which withholds
"exact" and the bounds (trace_prediction.boundable).

Standard library and torch_private only (torch is passed in).
"""

from __future__ import annotations

import contextlib
import sys
import weakref

from pipeline.core import torch_private

NOTE = "4-bit weights (bitsandbytes)"
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
    functional = sys.modules.get("bitsandbytes.functional")
    if functional is not None:
        undo.append(_fresh_maps(functional.name2qmap))
    utils = sys.modules.get("transformers.modeling_utils")
    if on_meta and utils is not None:
        undo += [
            _replace(
                utils.PreTrainedModel, "get_init_context", _skeleton_contexts(utils, recorder)
            ),
            _replace(utils, "caching_allocator_warmup", _warmup_as_on_a_gpu(torch, utils)),
        ]
    if on_meta:
        undo.append(_replace(bnb.Params4bit, "to", _quantised_on_meta(torch, bnb, notes)))

    checked = recorder.__dict__.get("on_target")

    def restore():
        while undo:
            undo.pop()()
        if checked is None:
            recorder.__dict__.pop("on_target", None)
        else:
            recorder.on_target = checked

    return restore


def _replace(owner, name: str, value):
    had = name in owner.__dict__
    original = owner.__dict__.get(name)

    def undo():
        if had:
            setattr(owner, name, original)
        else:
            delattr(owner, name)

    setattr(owner, name, value)
    return undo


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


def _skeleton_contexts(utils, recorder):
    """get_init_context with one more context last: what is made inside it is the skeleton's.
    Its storages stay off the trace for their whole life (transformers detaches them again
    when it lists the model's keys, outside the contexts): each is remembered by its key until
    it dies (a weak reference's callback), and the recorder's on_target answers no for it."""
    original = utils.PreTrainedModel.__dict__["get_init_context"].__func__
    skeleton: dict = {}  # storage key -> a weak reference that forgets it when it dies
    device_check = recorder.on_target

    def remembered(tensor) -> bool:
        storage = tensor.untyped_storage()
        key = torch_private.storage_key(storage)
        if key not in skeleton:
            skeleton[key] = weakref.ref(storage, lambda _, key=key: skeleton.pop(key, None))
        return False

    def outside(tensor) -> bool:
        return device_check(tensor) and (
            not skeleton or torch_private.storage_key(tensor.untyped_storage()) not in skeleton
        )

    @contextlib.contextmanager
    def skeleton_context():
        recorder.on_target = remembered
        try:
            yield
        finally:
            recorder.on_target = outside

    def get_init_context(cls, *args, **kwargs):
        contexts = original(cls, *args, **kwargs)
        # a list of context managers, entered in order: the skeleton's last
        return [*contexts, skeleton_context()]

    return classmethod(get_init_context)


def _warmup_as_on_a_gpu(torch, utils):
    original = utils.caching_allocator_warmup

    def caching_allocator_warmup(model, expanded_device_map: dict, hf_quantizer):
        on_meta = {
            name: torch.device(device)
            for name, device in expanded_device_map.items()
            if device != "disk" and torch.device(device).type == "meta"
        }
        if not on_meta:
            return original(model, expanded_device_map, hf_quantizer)
        for device, byte_count in utils.get_total_byte_count(model, on_meta, hf_quantizer).items():
            # as modeling_utils divides it: float16 elements, two bytes each
            _ = torch.empty(int(byte_count // 2), dtype=torch.float16, device=device)
            del _
        return None

    return caching_allocator_warmup


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
