"""torch.optim's fused kernels (`fused=True`; the Trainer's default optimizer, adamw_torch_fused),
as a GPU runs them: they allocate nothing.

`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_` and `_fused_adagrad_` update the parameters, the
gradients' moments and the step counts in place (aten/src/ATen/native/cuda/fused_adam_impl.cu,
fused_adamw_impl.cu, FusedSgdKernel.cu, FusedAdagradKernel.cu). Each goes through
`multi_tensor_apply_for_fused_optimizer` (MultiTensorApply.cuh), which gathers the tensors'
addresses, sizes and step addresses into a `FusedOptimizerTensorListMetadata` held on the host
and passed to the kernel by value, launching again whenever it is full: no block is asked of
the caching allocator, and the operators return nothing. The step counts they read are the
optimizer's own state (`torch.zeros((), device=p.device)` per parameter for a fused optimizer,
torch/optim/adam.py), made by the trace as the optimizer makes them.

The calibration holds no probe of them (none ran on the H200); `template` gives them their
source's template, outputs only, so that a fused step is not left uncovered.

Standard library only.
"""

from __future__ import annotations

OPERATORS = frozenset(
    f"aten.{name}.{overload}"
    for name in ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_")
    for overload in ("default", "tensor_lr")
)


def template(name: str) -> list | None:
    """The blocks the call allocates besides its outputs, in template steps: none."""
    return [] if name in OPERATORS else None
