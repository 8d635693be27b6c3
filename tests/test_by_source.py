"""Operators once trusted as output-only that a GPU showed are not, with the blocks
PyTorch's source gives them (trace_prediction.by_source_template), held to every committed
H200 probe of them: softmax's backward (`tmp = grad * output`, as large as its output),
`scalar ** tensor` (the scalar made an 8-byte tensor on the device), an embedding whose
indices cannot be viewed flat (copied first), and softmax and log_softmax's kernels, which
copy an input or gradient that is not contiguous (an H100 copied a transposed gradient).
Trusted as output-only, an unprobed shape of any of them would have been said "exact"
without the block."""

from __future__ import annotations

import functools
import json
import math

import pytest
from conftest import RUNS

from pipeline.predicting import gpu_calibration
from pipeline.predicting import trace_prediction as tp

PROBES = sorted(RUNS.glob("*-h200-probe*/probes/*.json"))
NAMES = (tp.SOFTMAX_BACKWARD, tp.POW_SCALAR, tp.EMBEDDING)


def tensor(dtype, shape, stride=None):
    if stride is None:
        stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return ("tensor", dtype, tuple(shape), tuple(stride), 0, 0, "device")


def arguments(name: str, leaves: list) -> dict:
    names = {
        tp.SOFTMAX_BACKWARD: ("grad_output", "output", "dim", "input_dtype"),
        tp.POW_SCALAR: ("self", "exponent"),
        tp.EMBEDDING: ("weight", "indices", "padding_idx"),
    }[name]
    return dict(zip(names, leaves, strict=False))


def template(name: str, leaves: list):
    return tp.by_source_template(name, arguments(name, leaves), leaves)


@functools.cache
def documents() -> list:
    """(the probe document, its calls' leaves by signature) of every committed probe file,
    read once for the tests that walk them."""
    found = []
    for path in PROBES:
        document = json.loads(path.read_text())
        leaves = {
            key: gpu_calibration.leaves_of(entry["leaves"])
            for key, entry in document["signatures"].items()
        }
        found.append((document, leaves))
    return found


def probed(name: str):
    """(leaves or None, the probed template as steps) of every committed probe of `name`;
    leaves only where the probe file recorded the call (the earliest folder did)."""
    for document, leaves in documents():
        for entry in document["calibration"]["operators"]:
            if entry["op"] == name:
                steps = [tp.template_step(step) for step in entry["template"]]
                yield leaves.get(entry["signature"]), steps
        if name != tp.SOFTMAX_BACKWARD:  # output-only probes: leaves recorded only
            for key in document["calibration"]["output_only"]:
                if key in leaves and document["signatures"][key]["name"] == name:
                    yield leaves[key], []


def without_sizes(steps):
    return [step[:2] for step in steps]


def test_softmax_backward_by_hand():
    scores = tensor("float32", (2, 14, 128, 128))
    leaves = [scores, scores, -1, "float32"]
    assert template(tp.SOFTMAX_BACKWARD, leaves) == [
        ("output", 0, None),
        ("internal", 0, 2 * 14 * 128 * 128 * 4),
        ("free", 0),
    ]
    half = tensor("bfloat16", (1, 8, 976, 976))
    assert template(tp.SOFTMAX_BACKWARD, [half, half, -1, "bfloat16"])[1] == (
        "internal",
        0,
        1 * 8 * 976 * 976 * 2,
    )
    promoted = [tensor("float32", (2, 4)), tensor("float16", (2, 4)), -1, "float16"]
    assert template(tp.SOFTMAX_BACKWARD, promoted) is None  # not what the probes ran
    assert not tp.output_only(tp.Signature(tp.SOFTMAX_BACKWARD, None, leaves, None))


def test_every_softmax_backward_probe_took_a_block_as_large_as_its_output():
    found = 0
    for leaves, steps in probed(tp.SOFTMAX_BACKWARD):
        assert without_sizes(steps) == [("output", 0), ("internal", 0), ("free", 0)]
        if leaves is not None:
            assert steps[1] == template(tp.SOFTMAX_BACKWARD, leaves)[1]
        else:  # the output's bytes: grad's shape in its dtype, the formula's block
            assert steps[1][2] == steps[0][2]
        found += 1
    assert found == 19


def test_a_scalar_to_a_tensors_power_makes_the_scalar_a_device_tensor():
    exponent = tensor("float32", (64,))
    assert template(tp.POW_SCALAR, [500000.0, exponent]) == [
        ("output", 0, None),
        ("internal", 0, 8),
        ("free", 0),
    ]
    assert template(tp.POW_SCALAR, [10000, exponent])[1] == ("internal", 0, 8)
    assert template(tp.POW_SCALAR, [1.0, exponent]) == []  # pow_Scalar_out fills with 1
    assert tp.output_only(tp.Signature(tp.POW_SCALAR, None, [1.0, exponent], None))
    assert not tp.output_only(tp.Signature(tp.POW_SCALAR, None, [2.0, exponent], None))
    assert template(tp.POW_SCALAR, [True, exponent]) is None  # a bool: not spoken for


def test_every_scalar_power_probe_took_eight_bytes():
    found = [steps for _, steps in probed(tp.POW_SCALAR) if steps]
    assert len(found) == 340
    assert all(steps == [("output", 0, steps[0][2]), ("internal", 0, 8), ("free", 0)]
               for steps in found)  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "stride", "copied"),
    [
        ((2, 128), (0, 1), True),  # BERT's token types, expanded over the batch
        ((2, 128), (128, 1), False),
        ((1, 128), (512, 1), False),  # a slice of a longer row: size-1 dimension aside
        ((4, 6), (1, 4), True),  # transposed
        ((128,), (2,), None),  # strided, viewable: index_select's way never probed
        ((2, 3), (6, 2), None),
    ],
)
def test_embedding_copies_indices_that_cannot_be_viewed_flat(shape, stride, copied):
    """copied: True, False, or None where the template is not spoken for."""
    weight = tensor("bfloat16", (30522, 768))
    indices = tensor("int64", shape, stride)
    found = template(tp.EMBEDDING, [weight, indices])
    if copied:
        assert found == [
            ("internal", 0, 8 * math.prod(shape)),
            ("output", 0, None),
            ("free", 0),
        ]
    else:
        assert found == ([] if copied is False else None)
    alone = tp.output_only(tp.Signature(tp.EMBEDDING, None, [weight, indices], None))
    assert alone is (copied is False)


def test_every_embedding_probe_is_the_source_template():
    """Where the probe file recorded the call, to the byte, copied or not; elsewhere the copy
    is always before the output and a whole number of int64 indices."""
    checked = copies = 0
    for leaves, steps in probed(tp.EMBEDDING):
        if leaves is not None:
            assert template(tp.EMBEDDING, leaves) == [
                (kind, index, None) if kind == "output" else (kind, index, *rest)
                for kind, index, *rest in steps
            ]
            checked += 1
        else:
            assert without_sizes(steps) == [("internal", 0), ("output", 0), ("free", 0)]
            assert steps[0][2] % 8 == 0
        copies += bool(steps)
    assert checked == 27
    assert copies == 35


SOFTMAX, LOG_SOFTMAX, LOG_SOFTMAX_BACKWARD = tp.COPIED_FIRST
SOFTMAXES = (SOFTMAX, LOG_SOFTMAX, LOG_SOFTMAX_BACKWARD)


def every_probe(name: str):
    """(leaves, the probed template) of every committed H200 probe of `name` whose file
    recorded the call, output-only ones included."""
    return ((leaves, steps) for leaves, steps in probed(name) if leaves is not None)


def test_every_softmax_probe_takes_the_blocks_of_the_copies_rule():
    """Every committed H200 probe of log_softmax, forward and backward, whose call its file
    recorded (softmax's forward has none such): the rule's template."""
    checked = dict.fromkeys(SOFTMAXES, 0)
    for name in SOFTMAXES:
        for leaves, steps in every_probe(name):
            assert tp.by_source_template(name, {}, leaves) == steps, leaves
            checked[name] += 1
    assert checked[LOG_SOFTMAX] > 0
    assert checked[LOG_SOFTMAX_BACKWARD] > 0


def test_a_transposed_gradient_is_copied_inside_log_softmaxs_backward():
    """CTC's log-probabilities, made batch-first and transposed: their gradient reaches
    log_softmax's backward transposed, and host_softmax_backward copies it (an H100 did)."""
    grad = tensor("float32", (16, 400, 64), (64, 1024, 1))  # (400, 16, 64) contiguous, transposed
    output = tensor("float32", (16, 400, 64))
    assert tp.by_source_template(LOG_SOFTMAX_BACKWARD, {}, [grad, output, -1, None]) == [
        ("output", 0, None),
        ("internal", 0, 16 * 400 * 64 * 4),
        ("free", 0),
    ]
    assert tp.output_only(tp.Signature(LOG_SOFTMAX_BACKWARD, None, [output, output, -1], None))


def test_softmax_of_a_transposed_input_copies_it_and_its_backward_is_not_spoken_for():
    x = tensor("bfloat16", (8, 32), (1, 8))
    assert tp.by_source_template(SOFTMAX, {}, [x, -1, False]) == [
        ("output", 0, None),
        ("internal", 0, 8 * 32 * 2),
        ("free", 0),
    ]
    leaves = [x, tensor("bfloat16", (8, 32)), -1, None]
    assert template(tp.SOFTMAX_BACKWARD, leaves) is None
