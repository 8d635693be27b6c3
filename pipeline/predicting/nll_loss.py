"""The negative log-likelihood loss on a GPU (cross_entropy's second half, every language
model's loss): which calls allocate their outputs and nothing else, by PyTorch's source, at
any size.

Read in PyTorch 2.11 (aten/src/ATen/native/cuda/Loss.cu):

- `nll_loss_forward_out_cuda_template` takes `input_.expect_contiguous()` and
  `target_.expect_contiguous()` (a borrow of the tensor itself when it is contiguous, a copy
  otherwise) and `weight.contiguous()` where a weight is given; its kernels
  (`nll_loss_forward_reduce_cuda_kernel_2d`, one block of NLL_LOSS_THREADS accumulating in
  shared memory; the 1-d and unreduced ones) write into the structured outputs, `output` and
  `total_weight`, which it resizes in place (to a scalar where the loss is reduced: no new
  block for a fresh output, as the meta function made it).
- `nll_loss_backward_out_cuda` zeroes the structured `grad_input`, then
  `nll_loss_backward_out_cuda_template` takes the same borrows of target, input, grad_input
  and grad_output, and `weight.contiguous()`; its kernels write into grad_input.

So a call whose tensors are all contiguous allocates its outputs only, whatever its sizes:
the probes' shape rules held that (an empty template) from 1 x 2 to 16,384 x 256,000 values,
but a contiguous target with an offset (a causal LM's shifted labels at batch 1) is another
rule key, probed at up to 2,000 rows only, and a longer one fell outside it, "not
calibrated", with an upper bound of several GiB over the central figure. A call with a
non-contiguous tensor makes copies (their order and lifetimes are not spoken for here): left
to the calibration.

Standard library only.
"""

from __future__ import annotations

from pipeline.core import call_keys

# Each operator's tensors (positions in its schema), and its class weights' position (None
# there where no weight is given).
READ = {
    "aten.nll_loss_forward.default": ((0, 1, 2), 2),  # self, target, weight
    # grad_output, self, target, weight, total_weight
    "aten.nll_loss_backward.default": ((0, 1, 2, 3, 6), 3),
}
OPERATORS = frozenset(READ)


def outputs_only(name: str, leaves) -> bool:
    """Whether this call of nll_loss's forward or backward allocates its outputs only: every
    tensor it reads is on the device and contiguous (the weight may be absent)."""
    if name not in READ:
        return False
    positions, weight = READ[name]
    if len(leaves) <= max(positions):
        return False
    for position in positions:
        leaf = leaves[position]
        if leaf is None and position == weight:
            continue
        if not call_keys.is_tensor_leaf(leaf) or leaf[-1] != "device":
            return False
        if not call_keys.contiguous(leaf[2], leaf[3]):
            return False
    return True
