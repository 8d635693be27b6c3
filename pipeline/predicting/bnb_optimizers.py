"""bitsandbytes' 8-bit AdamW (the Trainer's `adamw_8bit`, `adamw_bnb_8bit`) in a trace without
a GPU: it runs as written on the meta device, and the trace says that no GPU has checked it.

Read in bitsandbytes 0.50.2 (bitsandbytes/optim/optimizer.py, functional.py, _ops.py,
backends/cuda/ops.py):

- State. `Optimizer2State.init_state`, at a parameter's first step, makes its two moments with
  `get_state_buffer` (`torch.zeros_like(p, dtype=...)` where the optimizer is not paged):
  uint8, one byte a value, with two float32 `absmax` vectors of ceil(numel / 256) values
  (blockwise quantisation, blocksize 256); float32 moments instead for a parameter of fewer
  than `min_8bit_size` (4096) values, or one whose config says `optim_bits` 32. The Trainer
  (Trainer.create_optimizer) registers every nn.Embedding's weight for 32-bit state with
  `GlobalOptimManager.register_module_override`, applied by `check_overrides` at the first
  step. The two quantisation maps (`create_dynamic_map`, 256 float32 values, signed and
  unsigned) are made on the CPU in the constructor and copied to the parameter's device at the
  first 8-bit parameter's `init_state`, once for the optimizer. The step count is a Python int.
- Update. `F.optimizer_update_8bit_blockwise` and `F.optimizer_update_32bit` call
  `torch.ops.bitsandbytes.optimizer_update_8bit_blockwise` / `optimizer_update_32bit`, which
  return nothing and mutate their arguments; _ops.py registers their fake kernels
  (`torch.library.register_fake`), which only check shapes and dtypes, so they run under
  FakeTensorMode on meta. Their CUDA kernels (backends/cuda/ops.py) pass the tensors'
  pointers to the library through ctypes: nothing is asked of PyTorch's caching allocator
  there. What the compiled library itself does is not read here (its source is not shipped
  in the wheel): the replay notes these operators as not calibrated.
- Device checks. `F.is_on_gpu`, called before each update, accepts tensors all on one device
  of any type: the trace's meta tensors pass it as they are, so nothing of bitsandbytes is
  patched. `sync_gpu` synchronises CUDA or XPU only and does nothing on meta.

A paged optimizer (`paged_*`) keeps each state of 100,000 values or more in CUDA unified
memory (`F.get_paged`: `cudaMallocManaged` through ctypes), which the caching allocator never
sees; it is refused before any trace (hf_model.trainer_optimizer_class).

`install` adds, for the trace's time, an optimizer step pre-hook of PyTorch's
(`torch.optim.optimizer.register_optimizer_step_pre_hook`, run for every optimizer whose
class derives from torch.optim.Optimizer, as bitsandbytes' do): a step of a bitsandbytes
optimizer adds NOTE to the trace's notes while CHECKED_ON_A_GPU is False, which withholds
"exact" and the bounds (trace.bounds.boundable). Nothing of bitsandbytes is imported.

Standard library only (torch is passed in).
"""

from __future__ import annotations

import importlib.util
import sys

NOTE = "bitsandbytes optimizer"
# Whether a GPU's measurements of steps with a bitsandbytes optimizer have been held against
# predictions traced this way (they have: the evidence page says where). While False, a
# trace that stepped one says so in a note.
CHECKED_ON_A_GPU = True
UNCHECKED_WHY = (
    "its state follows bitsandbytes' source (uint8 moments, float32 absmax blocks, 32-bit "
    "state for small parameters and embeddings, its quantisation maps) and has not yet been "
    "held against a GPU's measurement: the central figure follows it, no bounds are claimed"
)


def available() -> bool:
    """bitsandbytes imported already, or importable (found, not imported: its import takes
    seconds and loads torch._dynamo)."""
    return "bitsandbytes" in sys.modules or importlib.util.find_spec("bitsandbytes") is not None


def install(torch, notes: dict):
    """A step of a bitsandbytes optimizer notes itself, for the trace's time; returns the
    undo. Nothing is installed where bitsandbytes is neither imported nor importable."""
    if not available():
        return lambda: None

    def noted(optimizer, args, kwargs):
        if type(optimizer).__module__.startswith("bitsandbytes.") and not CHECKED_ON_A_GPU:
            notes.setdefault(NOTE, UNCHECKED_WHY)

    optimizer_module = sys.modules[torch.optim.Optimizer.__module__]  # torch.optim.optimizer
    handle = optimizer_module.register_optimizer_step_pre_hook(noted)
    return handle.remove
