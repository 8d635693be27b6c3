"""A model loaded by transformers' from_pretrained, in a user's file or the lab's 4-bit loads,
traced without a GPU: the meta device stands for the GPU, so what from_pretrained does only
for a GPU is done here as a GPU does it.

Read in transformers 5.23 (modeling_utils.py, core_model_loading.py):

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
  applied.
- The loader's threads. Where it does not quantise on the fly, transformers copies every
  tensor of the checkpoint to the device on a pool of 4 threads, all submitted at once
  (`spawn_materialize`), while the main thread converts them as they come. A dispatch mode
  is a thread's own, and a fake tensor's mode cannot run on several: here each copy is made
  when it is submitted, in the file's order, as threads that run ahead of the main thread
  make them. On a GPU the threads may interleave in other orders: a copy onto the device
  notes LOAD_THREADS, which withholds "exact" (the bounds stay: the tensors are the same,
  only the order of their blocks differs).

A workload that imports transformers (its file is imported before the trace) has
modeling_utils and core_model_loading imported here, before the trace: transformers imports
them lazily, at the first from_pretrained, which would be inside the trace and after these
steps were due. The first two only in a trace whose device is meta.

Standard library and torch_private only (torch is passed in).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import weakref

from pipeline.core import torch_private

LOAD_THREADS = "transformers' loader threads"
LOAD_THREADS_WHY = (
    "transformers copies a checkpoint's tensors to the device on 4 threads: the order of "
    "their blocks is the threads', the trace's is the file's"
)


def install(torch, recorder, notes: dict, on_meta: bool):
    """The steps above, for the trace's time; returns the undo."""
    undo = []
    if "transformers" in sys.modules:
        importlib.import_module("transformers.modeling_utils")
        importlib.import_module("transformers.core_model_loading")
    loading = sys.modules.get("transformers.core_model_loading")
    if loading is not None:
        undo.append(replace(loading, "ThreadPoolExecutor", _inline_pool(torch, recorder, notes)))
    utils = sys.modules.get("transformers.modeling_utils")
    if on_meta and utils is not None:
        undo += [
            replace(utils.PreTrainedModel, "get_init_context", _skeleton_contexts(utils, recorder)),
            replace(utils, "caching_allocator_warmup", _warmup_as_on_a_gpu(torch, utils)),
        ]
    checked = recorder.__dict__.get("on_target")

    def restore():
        while undo:
            undo.pop()()
        if checked is None:
            recorder.__dict__.pop("on_target", None)
        else:
            recorder.on_target = checked

    return restore


def replace(owner, name: str, value):
    """owner.name set to value for the trace's time; returns the undo (what owner's own
    __dict__ held, or nothing)."""
    had = name in owner.__dict__
    original = owner.__dict__.get(name)

    def undo():
        if had:
            setattr(owner, name, original)
        else:
            delattr(owner, name)

    setattr(owner, name, value)
    return undo


def _inline_pool(torch, recorder, notes: dict):
    """A ThreadPoolExecutor whose jobs run when submitted, on the calling thread; a copy onto
    the traced device notes LOAD_THREADS (one to the host, a model loaded there and moved
    later, asks nothing of the GPU)."""
    from concurrent.futures import Future

    class InlinePool:
        def __init__(self, *args, **kwargs):
            pass

        def submit(self, job, *args, **kwargs):
            result = job(*args, **kwargs)
            if isinstance(result, torch.Tensor) and recorder.on_target(result):
                notes.setdefault(LOAD_THREADS, LOAD_THREADS_WHY)
            future = Future()
            future.set_result(result)
            return future

        def shutdown(self, *args, **kwargs):
            pass

    return InlinePool


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
