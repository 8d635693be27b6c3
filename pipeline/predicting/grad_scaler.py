"""torch.amp.GradScaler (float16 mixed precision's loss scaling) in a trace without a GPU: the
scaler a GPU builds, and the optimizer step it takes.

Read in PyTorch 2.11 (torch/amp/grad_scaler.py):

- `GradScaler("cuda")` disables itself where CUDA is not available
  (`torch.cuda.amp.common.amp_definitely_not_available()` in `__init__`): without a GPU its
  `scale` returns the loss as it is and `step` is the optimizer's step, so neither the scale
  nor the unscaling would be traced. Here a CUDA scaler is built on the meta device as on a
  GPU, the availability check answered as a GPU answers it, for the constructor's call only.
- What it then does is PyTorch operators on the device, traced as they come: `scale` makes
  the scale (float32) and the growth tracker (int32), 0-dimensional, at its first call, and
  multiplies the loss by the scale; `unscale_` (from `step`, or the user's own call before
  clipping) makes the reciprocal of the scale through float64, a found-inf flag, a copy of
  each per device (`_MultiDeviceReplicator`: `.to(device, copy=True)`), and unscales the
  gradients in place by device and dtype (`_amp_foreach_non_finite_check_and_unscale_`);
  `update` sums the flags and updates the scale in place (`_amp_update_scale_`). Optimizers
  that unscale inside their own kernels (`_step_supports_amp_scaling`: fused Adam and AdamW)
  are handed the scale and the flag instead.
- `step` takes the optimizer's step only where no gradient held an inf or a NaN:
  `_maybe_opt_step` reads the flags back to Python (`.item()`, a copy to the host: no block
  of the allocator), a value a fake tensor does not have. The trace takes the step, as every
  step does once the scale has settled; a GPU that skipped it ran another step than the one
  predicted, which `measure` refuses to record (own_model.py counts the optimizer's steps).

Its two operators allocate nothing on a GPU (aten/src/ATen/native/cuda/AmpKernels.cu):
`_amp_foreach_non_finite_check_and_unscale_cuda_` unscales in place through
`multi_tensor_apply` (the tensors' addresses passed as the kernel's arguments), a tensor that
is not dense through a TensorIterator kernel writing into itself; `_amp_update_scale_cuda_`
launches one thread that writes the scale and the tracker in place (ALLOCATE_NOTHING).

`install` makes both changes for the trace's time and returns the undo.

Standard library only (torch is passed in).
"""

from __future__ import annotations

from pipeline.core import torch_private

# operators (the trace's packet names) that allocate no block on a GPU
ALLOCATE_NOTHING = frozenset(
    {"aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_"}
)
NOTE = "GradScaler (CUDA)"
# Whether a GPU's measurements of steps with a CUDA GradScaler have been held against
# predictions traced this way (they have: the evidence page says where). While False, a
# trace that built one says so in a note, which withholds "exact" and the bounds.
CHECKED_ON_A_GPU = True
UNCHECKED_WHY = (
    "its scale, the scaled loss and the unscaling of the gradients are traced as PyTorch's "
    "source makes them and have not yet been held against a GPU's measurement: the central "
    "figure follows them, no bounds are claimed"
)


def install(torch, notes: dict, meta: bool):
    """For the trace's time: a CUDA GradScaler built enabled where the trace runs on the meta
    device, and every scaler's step taken without reading its flags; returns the undo."""
    scaler = torch.amp.GradScaler
    original_init = scaler.__init__
    amp_common = torch.cuda.amp.common

    def init(self, device="cuda", *args, **kwargs):
        if device != "cuda" or not meta:
            return original_init(self, device, *args, **kwargs)
        checked = amp_common.amp_definitely_not_available
        amp_common.amp_definitely_not_available = lambda: False  # as on a GPU
        try:
            original_init(self, device, *args, **kwargs)
        finally:
            amp_common.amp_definitely_not_available = checked
        if self.is_enabled() and not CHECKED_ON_A_GPU:
            notes.setdefault(NOTE, UNCHECKED_WHY)
        return None

    def take_step(self, optimizer, optimizer_state, *args, **kwargs):
        # PyTorch's: `if not sum(v.item() for v in found_inf_per_device.values())`
        return optimizer.step(*args, **kwargs)

    scaler.__init__ = init
    undo_step = torch_private.patch_grad_scaler_step(torch, take_step)

    def undo() -> None:
        undo_step()
        scaler.__init__ = original_init

    return undo
