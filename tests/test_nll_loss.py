"""nll_loss on a GPU (nll_loss.py): a call whose tensors are contiguous allocates its outputs
only, at any size, by PyTorch's source; a causal LM's loss at batch 1 (its shifted labels a
contiguous view with an offset) is covered, not left to the probes' domain."""

from __future__ import annotations

import pytest
from test_hf_model import estimate, reduced, written

from pipeline.predicting import nll_loss

FORWARD, BACKWARD = "aten.nll_loss_forward.default", "aten.nll_loss_backward.default"


def tensor(shape, stride=None, offset=0, dtype="float32", where="device"):
    """A described tensor argument, as the trace describes one."""
    if stride is None:
        stride, step = [], 1
        for size in reversed(shape):
            stride.insert(0, step)
            step *= max(size, 1)
    return ("tensor", dtype, tuple(shape), tuple(stride), offset, 0, where)


ROWS, CLASSES = 4096, 128_256  # Llama 3's vocabulary, past every probe at batch 1
LOGITS, LABELS = tensor([ROWS, CLASSES]), tensor([ROWS], offset=1, dtype="int64")
GRAD, TOTAL = tensor([]), tensor([])


def test_contiguous_calls_allocate_their_outputs_only_at_any_size():
    assert nll_loss.outputs_only(FORWARD, [LOGITS, LABELS, None, 1, -100])
    assert nll_loss.outputs_only(BACKWARD, [GRAD, LOGITS, LABELS, None, 1, -100, TOTAL])
    weight = tensor([CLASSES])
    assert nll_loss.outputs_only(FORWARD, [LOGITS, LABELS, weight, 1, -100])


@pytest.mark.parametrize(
    "leaves",
    [
        [tensor([ROWS, CLASSES], stride=[1, ROWS]), LABELS, None, 1, -100],  # transposed
        [LOGITS, tensor([ROWS], stride=[2], dtype="int64"), None, 1, -100],  # strided labels
        [LOGITS, LABELS, tensor([CLASSES], stride=[2]), 1, -100],  # a strided weight
        [LOGITS, tensor([ROWS], dtype="int64", where="host"), None, 1, -100],
        [LOGITS, LABELS],  # not the schema's arguments
    ],
    ids=["transposed-input", "strided-target", "strided-weight", "host-target", "short"],
)
def test_a_copy_the_kernel_would_make_is_left_to_the_calibration(leaves):
    assert not nll_loss.outputs_only(FORWARD, leaves)


def test_the_backward_reads_its_gradient_contiguous_too():
    strided_grad = tensor([ROWS], stride=[2])  # an unreduced loss's gradient, strided
    assert not nll_loss.outputs_only(BACKWARD, [strided_grad, LOGITS, LABELS, None, 0, -100, TOTAL])


def test_other_operators_are_not_spoken_for():
    assert not nll_loss.outputs_only("aten.nll_loss2d_forward.default", [LOGITS, LABELS])


pytest.importorskip("transformers")


def test_a_causal_lms_loss_at_batch_1_is_covered(capsys, tmp_path):
    """Before: its labels' key (contiguous, with an offset) was probed at up to 2,000 rows
    of 32,000 classes or more, and this call, outside it, was "not calibrated", its upper
    bound widened by the logits' size."""
    config = written(tmp_path, reduced("llama-3.2-1b"))
    document = estimate(capsys, config, "--task", "training", "--batch", "1", "--gpu", "h200")
    unknown = {entry["op"] for entry in document["prediction"]["unknown"]}
    assert not any("nll_loss" in op for op in unknown), unknown
