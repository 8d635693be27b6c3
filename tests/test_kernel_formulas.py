"""The attention backward kernels' scratch by formula (kernel_formulas.py), held to every
probe the H200 made of them, and the calibration's formula rules built and read from them."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline.core import call_keys
from pipeline.predicting import gpu_calibration, kernel_formulas
from pipeline.predicting import trace_prediction as tp

RUNS = Path(__file__).resolve().parent.parent / "runs"
CUDNN = "aten._scaled_dot_product_cudnn_attention_backward.default"
DECODE = "aten._scaled_dot_product_cudnn_attention.default"
EFFICIENT = "aten._scaled_dot_product_efficient_attention_backward.default"
SAFE_SOFTMAX = "aten._safe_softmax.default"


def probes():
    """(operator, leaves, probed template) of every formula operator's probe on the H200."""
    for path in sorted(RUNS.glob("*-h200-probe*/probes/*.json")):
        document = json.loads(path.read_text())
        templates = {e["signature"]: e["template"] for e in document["calibration"]["operators"]}
        for key, entry in document["signatures"].items():
            if entry["name"] in kernel_formulas.FORMULAS and key in templates:
                yield entry["name"], gpu_calibration.leaves_of(entry["leaves"]), templates[key]


def internal(template: list) -> list[int]:
    return [step["bytes"] for step in template if step["kind"] == "internal"]


def test_every_probe_of_the_formula_kernels_is_the_formula_or_declined():
    matched = {CUDNN: 0, EFFICIENT: 0, DECODE: 0, SAFE_SOFTMAX: 0}
    without = 0
    for name, leaves, template in probes():
        found = kernel_formulas.internal_sizes(name, leaves)
        if found is None:
            continue  # a call the formula does not speak for (a prefill, an unprobed length)
        assert found == internal(template), leaves[:2]
        matched[name] += 1
        without += found == []
    assert without >= 500  # decode steps the kernel did not split: no workspace
    assert matched[CUDNN] >= 75, matched
    assert matched[EFFICIENT] >= 40, matched
    assert matched[DECODE] >= 2_000, matched
    assert matched[SAFE_SOFTMAX] == 58, matched  # every one of its probes, all float32


def decode_call(batch, heads, kv_heads, keys, head_size=64):
    q = tensor("bfloat16", (batch, heads, 1, head_size))
    kv = tensor("bfloat16", (batch, kv_heads, keys, head_size))
    return [q, kv, kv, None, False, head_size**-0.5]


def test_decode_splits_by_hand():
    # Llama-3.2-1B at batch 3, 778 keys: 3 x 8 = 24 key/value groups allow 8 parts, the keys
    # 4 (778 // 128 = 6): 4 parts of 96 rows of 64 floats, two floats a row, 128 bytes
    assert kernel_formulas.cudnn_attention_forward(decode_call(3, 32, 8, 778)) == [
        96 * 4 * 64 * 4 + 2 * 96 * 4 * 4 + 128
    ]
    # Qwen2.5-0.5B at batch 3: 42 rows a part, each float array rounded up to 128 bytes
    assert kernel_formulas.cudnn_attention_forward(decode_call(3, 14, 2, 778)) == [44_672]
    assert kernel_formulas.cudnn_attention_forward(decode_call(1, 32, 8, 300)) == []  # short
    assert kernel_formulas.cudnn_attention_forward(decode_call(12, 32, 8, 4200)) == []  # full
    assert kernel_formulas.cudnn_attention_forward(decode_call(1, 32, 8, 512)) == []  # 4 x 128
    # 4 parts from 513 keys: 32 rows of 64 floats a part
    assert kernel_formulas.cudnn_attention_forward(decode_call(1, 32, 8, 513)) == [
        128 * 64 * 4 + 2 * 128 * 4 + 128
    ]
    # 36 groups: 256 // 36 = 7 allows 4 parts, whatever the keys allow (32 at 5,000)
    assert kernel_formulas.cudnn_attention_forward(decode_call(9, 32, 4, 5000)) == [
        9 * 32 * 4 * 64 * 4 + 2 * 9 * 32 * 4 * 4 + 128
    ]
    # between the probed lengths where the split grows, past the longest, beyond the fills
    assert kernel_formulas.cudnn_attention_forward(decode_call(1, 32, 8, 1018)) is None
    assert kernel_formulas.cudnn_attention_forward(decode_call(1, 32, 8, 8100)) is None
    assert kernel_formulas.cudnn_attention_forward(decode_call(1, 32, 8, 40_000)) is None
    assert kernel_formulas.cudnn_attention_forward(decode_call(65, 32, 8, 600)) is None
    assert kernel_formulas.cudnn_attention_forward(decode_call(1, 32, 8, 800, 80)) is None


def tensor(dtype: str, shape: tuple) -> tuple:
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return ("tensor", dtype, shape, strides, 0, 0, "device")


def test_cudnn_backward_with_grouped_query_attention_by_hand():
    # Qwen2.5-0.5B, batch 2 x 128 tokens: 14 query heads, 2 key/value heads, head size 64
    q, kv = tensor("bfloat16", (2, 14, 128, 64)), tensor("bfloat16", (2, 2, 128, 64))
    leaves = [q, q, kv, kv]
    # dQ in float32 917,504 + 14,336 per-row floats + 256 + dK and dV at 14 heads 917,504
    assert kernel_formulas.cudnn_attention_backward(leaves) == [1_849_600]
    same = [q, q, q, q]
    assert kernel_formulas.cudnn_attention_backward(same) == [917_504 + 14_336 + 256]


def test_efficient_backward_by_hand_and_what_it_declines():
    q = tensor("float32", (2, 12, 132, 64))  # 3 key blocks of 64
    assert kernel_formulas.efficient_attention_backward([q, q, q, q]) == [
        811_008, 12_672, 12_672, 2 * 12 * 3 * 16_400
    ]  # fmt: skip
    b = tensor("bfloat16", (3, 8, 333, 64))
    assert kernel_formulas.efficient_attention_backward([b, b, b, b]) == [31_968, 2_361_600]
    wide = tensor("float32", (1, 8, 100, 128))
    assert kernel_formulas.efficient_attention_backward([wide] * 4) is None
    cross = tensor("float32", (1, 8, 50, 64))
    assert kernel_formulas.efficient_attention_backward([q, cross, q, q]) is None


def test_the_calibration_reads_each_probed_call_back_through_its_formula_rule():
    calibration, document = gpu_calibration.load("h200")
    assert document["formula_rules"]
    assert document["formula_rules_missed"] == []
    checked = 0
    for name, leaves, template in probes():
        call = tp.Signature(name, None, tuple(leaves), None)
        key = call_keys.rule_key(name, leaves, integers=False)
        if key not in calibration.formula_rules:
            continue
        if kernel_formulas.internal_sizes(name, leaves) is None:
            assert calibration.formula_rule(call) is None
            continue
        got = calibration.formula_rule(call)
        probed = [tp.template_step(step) for step in template]
        # the probe's steps in its order, its blocks' sizes; outputs take the call's own
        assert [s[:2] for s in got] == [s[:2] for s in probed]
        assert [s for s in got if s[0] == "internal"] == [s for s in probed if s[0] == "internal"]
        checked += 1
    assert checked >= 100


def probe_document(calls: list[tuple[list, list[int]]]) -> dict:
    """A probe document of cuDNN backward calls: (leaves, the internal sizes probed)."""
    signatures, operators = {}, []
    for n, (leaves, sizes) in enumerate(calls):
        key = f"k{n}"
        signatures[key] = {"name": CUDNN, "calls": 1, "view": False, "leaves": repr(leaves)}
        steps = [{"kind": "output", "index": i, "bytes": 8} for i in range(3)]
        steps += [{"kind": "internal", "id": i, "bytes": b} for i, b in enumerate(sizes)]
        steps += [{"kind": "free", "id": i} for i in range(len(sizes))]
        operators.append({"op": CUDNN, "signature": key, "template": steps})
    return {
        "signatures": signatures,
        "calibration": {"operators": operators, "output_only": [],
                        "workspaces_per_thread": True},
    }  # fmt: skip


def cudnn_call(batch: int, tokens: int) -> list:
    q = tensor("bfloat16", (batch, 8, tokens, 64))
    return [q, q, q, q, tokens, tokens]


def test_a_formula_rule_needs_every_probe_and_holds_only_within_them():
    calls = [cudnn_call(b, s) for b, s in ((1, 8), (2, 100), (4, 512))]
    good = [(c, kernel_formulas.cudnn_attention_backward(c)) for c in calls]
    built = gpu_calibration.build([probe_document(good)])
    (key,) = built["formula_rules"]
    assert "int" in key
    assert built["formula_rules"][key]["domain"][1][1] == [4, 8, 512, 64]
    calibration = tp.Calibration(
        formula_rules=gpu_calibration.read_formula_rules(built["formula_rules"])
    )
    inside = tp.Signature(CUDNN, None, tuple(cudnn_call(3, 300)), None)
    ((step,),) = [[s for s in calibration.rule(inside) if s[0] == "internal"]]
    assert step == ("internal", 0, 4 * 3 * 8 * 300 * 64 + 4 * 3 * 8 * 300 + 256)
    outside = tp.Signature(CUDNN, None, tuple(cudnn_call(3, 600)), None)
    assert calibration.rule(outside) is None
    # one probe the formula misses: no rule for that form, and the file says which
    bad = [*good[:2], (calls[2], [kernel_formulas.cudnn_attention_backward(calls[2])[0] + 512])]
    built = gpu_calibration.build([probe_document(bad)])
    assert built["formula_rules"] == {}
    assert built["formula_rules_missed"] == [key]
    # two shapes are not enough
    assert gpu_calibration.build([probe_document(good[:2])])["formula_rules"] == {}


def test_embedding_backward_over_few_indices_is_each_probe():
    """Up to 3,072 indices: copies of a non-contiguous gradient or index tensor, then the
    output, as every probe on the H200 allocated (expanded token types, permuted biases)."""
    calibration, _ = gpu_calibration.load("h200")
    seen = {"copies": 0, "output only": 0}
    for path in sorted(RUNS.glob("*-h200-probe*/probes/*.json")):
        document = json.loads(path.read_text())
        section = document["calibration"]
        templates = {e["signature"]: e["template"] for e in section["operators"]}
        for key, entry in document["signatures"].items():
            if entry["name"] != tp.EMBEDDING_BACKWARD:
                continue
            leaves = gpu_calibration.leaves_of(entry["leaves"])
            if math.prod(leaves[1][2]) > tp.FEW_INDICES:
                continue
            names = ("grad_output", "indices", "num_weights", "padding_idx", "scale")
            got = tp.embedding_backward_template(
                dict(zip(names, leaves, strict=True)) | {"scale_grad_by_freq": leaves[4]}
            )
            if key in section["output_only"]:
                assert got == [("output", 0, None)], leaves
                seen["output only"] += 1
            else:
                probed = [tp.template_step(step) for step in templates[key]]
                assert [s[:2] for s in got] == [s[:2] for s in probed], leaves
                assert [s for s in got if s[0] == "internal"] == [
                    s for s in probed if s[0] == "internal"
                ]
                seen["copies"] += 1
    assert seen["copies"] >= 8, seen
    assert seen["output only"] >= 100, seen
    assert calibration.reduce_device is not None


def test_cumsum_is_each_probe():
    """Every cumsum the H200 ran in the probes: a cast of an int32 input to int64 after the
    output, CUB's storage for one row, nothing more over several rows."""
    checked = 0
    for path in sorted(RUNS.glob("*-h200-probe*/probes/*.json")):
        document = json.loads(path.read_text())
        section = document["calibration"]
        templates = {e["signature"]: e["template"] for e in section["operators"]}
        for key, entry in document["signatures"].items():
            if entry["name"] != tp.CUMSUM:
                continue
            leaves = gpu_calibration.leaves_of(entry["leaves"])
            got = tp.cumsum_template({"self": leaves[0], "dim": leaves[1]})
            assert got is not None, leaves
            probed = [("output", 0, None)]
            if key in templates:
                probed = [
                    (s[0], s[1], None) if s[0] == "output" else s
                    for s in map(tp.template_step, templates[key])
                ]
            assert got == probed, leaves
            checked += 1
    assert checked >= 60


def test_cumsum_declines_what_was_not_probed():
    row = tensor("float32", (1, 2001))
    assert tp.cumsum_template({"self": row, "dim": 1}) is None  # longer than probed
    half = tensor("bfloat16", (1, 8))
    assert tp.cumsum_template({"self": half, "dim": 1}) is None
    assert tp.cumsum_template({"self": tensor("float32", (4, 8)), "dim": 0}) is None
    many = tensor("int32", (4, 512))
    assert tp.cumsum_template({"self": many, "dim": 1}) == [
        ("output", 0, None), ("internal", 0, 16_384), ("free", 0)
    ]  # fmt: skip


def softmax_call(shape, dtype="float32", dim=-1, stride=None):
    if stride is None:
        stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return [("tensor", dtype, shape, stride, 0, math.prod(shape) * 4, "device"), dim]


def test_safe_softmax_by_hand_and_what_it_declines():
    """Llama-3.2-1B's float32 math attention at 3 x 400: 3 x 32 x 400 x 400 scores; a bool
    mask of them, a bool a row, one float32 scalar."""
    scores = (3, 32, 400, 400)
    assert kernel_formulas.safe_softmax(softmax_call(scores)) == [15_360_000, 38_400, 4]
    assert kernel_formulas.safe_softmax(softmax_call(scores, dim=3)) == [15_360_000, 38_400, 4]
    assert kernel_formulas.safe_softmax(softmax_call(scores, dim=2)) is None  # not a row
    transposed = (3 * 32 * 400 * 400, 400 * 400, 1, 400)
    assert kernel_formulas.safe_softmax(softmax_call(scores, stride=transposed)) is None
    # 8,192 keys: the reduction may stage partial results in global memory
    assert kernel_formulas.safe_softmax(softmax_call((1, 1, 2, 8192))) is None
    assert kernel_formulas.safe_softmax(softmax_call((1, 1, 2, 8191))) == [16_382, 2, 4]
    # a mask of 2**31 bytes: the reduction splits its iterator (8 x 32 x 2,900 x 2,900 is
    # inside the probed box, 8 x 32 x 2,048 x 2,048 the largest probe, 2**30 bytes)
    assert kernel_formulas.safe_softmax(softmax_call((8, 32, 2900, 2900))) is None
    assert kernel_formulas.safe_softmax(softmax_call((8, 32, 2048, 2048)))[0] == 2**30
    assert kernel_formulas.safe_softmax(softmax_call((2, 8, 0, 0))) is None  # no row
    assert kernel_formulas.safe_softmax([*softmax_call(scores), "float32"]) is None  # dtype=
    assert kernel_formulas.safe_softmax(softmax_call(scores, dtype="int64")) is None


def test_the_calibration_covers_safe_softmax_only_within_its_probes():
    """The committed calibration's rule: float32, from 1 x 8 x 8 x 8 to 8 x 32 x 3000 x 3000,
    read back to the probed blocks; a longer row, or bfloat16, is not covered."""
    calibration = gpu_calibration.load("h200")[0]

    def covered(shape, dtype="float32"):
        leaves = softmax_call(shape, dtype)
        call = tp.Signature(SAFE_SOFTMAX, None, leaves, None)
        return calibration.formula_rule(call)

    found = covered((3, 32, 400, 400))
    assert [step for step in found if step[0] == "internal"] == [
        ("internal", 0, 15_360_000),
        ("internal", 1, 38_400),
        ("internal", 2, 4),
    ]
    assert covered((1, 14, 3001, 3001)) is None
    assert covered((3, 32, 400, 400), "bfloat16") is None
