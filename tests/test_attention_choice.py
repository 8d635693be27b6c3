"""The SDPA kernel rule (attention_choice) against PyTorch 2.11's sdp_utils.cpp, read by hand
until a table recorded on the GPU is committed (TABLE), and the trace taking that kernel on the
meta device."""

from __future__ import annotations

import json
import pathlib

import pytest

from pipeline.predicting import attention_choice as ac

# The table recorded on the H200 by choice_table.py (beside it under runs/): a path under runs/,
# e.g. "runs/<stamp>-sdpa-choices/sdpa-choices.json". None: not recorded yet.
TABLE = "runs/20261204T090000Z-sdpa-choices/sdpa-choices.json"
ROOT = pathlib.Path(__file__).resolve().parent.parent

B, H, L, D = 4, 12, 512, 64


def call(dtype="bfloat16", q=(B, H, L, D), k=None, v=None, **flags):
    k = k or q
    return ac.SdpaCall(dtype, tuple(q), tuple(k), tuple(v or k), **flags)


# (case, expected backend on the H200, why, from sdp_utils.cpp / sdp_utils_cpp.h of 2.11)
CASES = [
    # priority_order: cuDNN 9.19 > 9.15 on sm90 puts cuDNN first; can_use_cudnn_attention
    # passes for dense bf16, head_dim 64 (<= 128), causal
    (call(is_causal=True, needs_grad=True), "cudnn", "GPT-2 training"),
    (call(is_causal=True), "cudnn", "inference has the same order"),
    # check_cudnn_tensor_shapes: d % 8 != 0 fails; flash pads the head dim (<= 256)
    (call(q=(B, H, L, 36)), "flash", "head dim 36: not a multiple of 8 for cuDNN"),
    # check_cudnn_tensor_shapes: s_k == 1 fails; flash has no such rule
    (call(q=(B, H, 1, D), k=(B, H, 1, D)), "flash", "key length 1"),
    # ... s_q == 1 with dropout fails for cuDNN only
    (call(q=(B, H, 1, D), k=(B, H, 128, D), dropout_p=0.1), "flash", "query length 1 + dropout"),
    (call(q=(B, H, 1, D), k=(B, H, 128, D)), "cudnn", "query length 1 without dropout"),
    # check_dtypes_low_precision (cuDNN, flash): fp16/bf16 only; efficient takes float32
    (call(dtype="float32", is_causal=True), "efficient", "float32"),
    (call(dtype="float16"), "cudnn", "float16"),
    # head dim 256: Hopper with cuDNN >= 9.10 allows 256; 512 fails cuDNN and flash (<= 256)
    # and efficient takes it (multiple of 8)
    (call(q=(B, H, L, 256)), "cudnn", "head dim 256 on sm90"),
    (call(q=(B, H, L, 512)), "efficient", "head dim 512"),
    # efficient: head dims multiple of 8 (half) / 4 (float32), else math
    (call(dtype="float32", q=(B, H, L, 66)), "math", "float32, head dim 66"),
    # flash: is_causal with seqlen_q != seqlen_k fails; cuDNN passes it (no such check)
    (call(q=(B, H, 7, D), k=(B, H, 128, D), is_causal=True), "cudnn", "causal, non-square"),
    # efficient: half types need head dims multiple of 8 (minimum_gemm_alignment), else math
    (call(q=(B, H, 7, 36), k=(B, H, 128, 36), is_causal=True), "math", "non-square, d 36"),
    (call(q=(B, H, 7, 40), k=(B, H, 128, 40), is_causal=True), "cudnn", "non-square, d 40"),
    # masks: check_attn_mask_shape for cuDNN; check_for_attn_mask refuses flash
    (call(mask_dtype="bool", mask_shape=(B, 1, L, L)), "cudnn", "boolean 4-d mask"),
    (call(mask_dtype="bool", mask_shape=(B, 3, L, L)), "efficient", "mask heads neither 1 nor H"),
    (call(q=(B, H, L, 36), mask_dtype="bool", mask_shape=(L, L)), "math", "mask + d 36"),
    (
        call(dtype="float32", q=(B, H, L, 36), mask_dtype="bool", mask_shape=(L, L)),
        "efficient",
        "float32: alignment 4",
    ),
    (
        call(mask_dtype="bfloat16", mask_shape=(L, L), mask_requires_grad=True),
        "efficient",
        "a mask requiring grad fails check_attn_mask_shape",
    ),
    # GQA: cuDNN <true, false>, flash <true>, efficient <false> (2.11 has no MQA flag)
    (call(k=(B, 2, L, D), enable_gqa=True), "cudnn", "GQA 12/2"),
    (call(q=(B, H, L, 36), k=(B, 2, L, 36), enable_gqa=True), "flash", "GQA, d 36"),
    (call(dtype="float32", k=(B, 2, L, D), enable_gqa=True), "math", "GQA in float32"),
    (call(k=(B, 2, L, D)), "math", "different heads without enable_gqa"),
    (call(k=(B, 5, L, D), enable_gqa=True), "math", "5 does not divide 12"),
    # check_last_dim_stride_equals_1_dense: a strided last dim fails every fused kernel
    (call(q_stride=(H * L * D * 2, L * D * 2, D * 2, 2)), "math", "last dim stride 2"),
    # (B, S, H, D) memory seen as (B, H, S, D): last dim contiguous, all fused kernels take it
    (call(q_stride=(L * H * D, D, H * D, 1)), "cudnn", "transposed layout"),
    # check_tensor_shapes: 3-d inputs fail every fused kernel
    (call(q=(B, L, D)), "math", "3-d inputs"),
]


@pytest.mark.parametrize(("case", "expected", "what"), CASES, ids=[c[2] for c in CASES])
def test_rule_by_the_source(case, expected, what):
    backend, why = ac.choose(ac.H200, case)
    assert backend == expected, why


def test_older_gpus_and_switches():
    a100 = ac.TargetGpu("A100", (8, 0), "2.11.0+cu130")  # no cuDNN preference: flash first
    assert ac.choose(a100, call(is_causal=True))[0] == "flash"
    assert ac.choose(a100, call(q=(B, H, L, 256)))[0] == "flash"  # cuDNN limit 128 off sm90
    assert ac.choose(a100, call(mask_dtype="bool", mask_shape=(L, L)))[0] == "efficient"
    t4 = ac.TargetGpu("T4", (7, 5), "2.11.0+cu130")  # below sm80: efficient, not bf16
    assert ac.choose(t4, call(dtype="float16"))[0] == "efficient"
    assert ac.choose(t4, call(dtype="bfloat16"))[0] == "math"
    off = ac.Switches(cudnn=False)
    assert ac.choose(ac.H200, call(), off)[0] == "flash"
    assert ac.choose(ac.H200, call(), ac.Switches(deterministic=True))[0] == "flash"


def test_undecided():
    for gpu in (
        ac.TargetGpu("unknown", None, "2.11.0"),
        ac.TargetGpu("H200", (9, 0), "2.9.1+cu128"),
    ):
        with pytest.raises(ac.Undecided):
            ac.choose(gpu, call())
    with pytest.raises(ac.Undecided):
        ac.choose(ac.H200, call(nested=True))


def test_cases_are_well_formed():
    cases = ac.choice_cases()
    assert len(cases) > 10000
    for row in cases[::97]:
        ac.choose(ac.H200, ac.SdpaCall.from_dict(json.loads(json.dumps(row))))


def test_rule_matches_the_gpu_table():
    if TABLE is None:
        pytest.skip("no table recorded on a GPU is committed yet (TABLE is None)")
    table = json.loads((ROOT / TABLE).read_text())
    gpu = ac.TargetGpu(table["gpu"], tuple(table["capability"]), table["torch"],
                       cuda=table["cuda"], cudnn_version=table["cudnn"])  # fmt: skip
    assert {row["dtype"] for row in table["rows"]}  # not empty
    wrong = []
    for row in table["rows"]:
        if row["backend"] is None:
            continue  # PyTorch refused the call: no choice to compare
        got, why = ac.choose(gpu, ac.SdpaCall.from_dict(row))
        if got != row["backend"]:
            wrong.append((row, got, why))
    assert not wrong, f"{len(wrong)} of {len(table['rows'])} rows differ, first: {wrong[:3]}"


# ------------------------------------------------------------------ the trace

torch = pytest.importorskip("torch")


def traced(drive, target=ac.H200):
    from pipeline.predicting import trace_prediction as tp

    trace = tp.run_trace(torch, "meta", drive, target=target)
    assert trace.stopped is None
    return trace, [ev[1].name for ev in trace.events if ev[0] == "op"]


def qkv(dtype=torch.bfloat16, q=(2, 4, 128, 64), k=None, grad=True):
    def make(shape):
        return torch.randn(*shape, device="meta", dtype=dtype, requires_grad=grad)

    return make(q), make(k or q), make(k or q)


def test_training_takes_cudnn_forward_and_backward():
    def drive(phase):
        def step():
            q, k, v = qkv()
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.sum().backward()

        phase("step", step)

    trace, ops = traced(drive)
    assert "aten._scaled_dot_product_cudnn_attention.default" in ops
    assert "aten._scaled_dot_product_cudnn_attention_backward.default" in ops
    assert "aten.bmm.default" not in ops  # no math decomposition
    assert "scaled_dot_product_attention" not in trace.notes


def test_flash_pads_the_head_dim_and_efficient_converts_the_mask():
    def drive(phase):
        def step():
            q, k, v = qkv(q=(2, 4, 128, 36))
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            assert out.shape == (2, 4, 128, 36)
            out.sum().backward()
            q, k, v = qkv(dtype=torch.float32)
            mask = torch.ones(128, 128, dtype=torch.bool, device="meta")
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out.sum().backward()

        phase("step", step)

    trace, ops = traced(drive)
    pads = [ev[1].role for ev in trace.events if ev[0] == "op" and "constant_pad" in ev[1].name]
    assert pads == ["caller"] * 3 + ["autograd"] * 3  # q, k, v padded; backward slices back
    assert "aten._scaled_dot_product_flash_attention_backward.default" in ops
    assert "aten.where.self" in ops
    assert "aten._scaled_dot_product_efficient_attention_backward.default" in ops
    assert not trace.notes


def test_inference_mode_takes_the_gpus_kernel_and_unknown_gpu_is_noted():
    """Under inference mode the composite's own function calls the kernel the GPU picks and
    keeps its first output: the trace calls that kernel, with no logsumexp (cuDNN makes it
    only when asked), so that its blocks are the kernel's, calibrated or not."""

    def drive(phase):
        def step():
            q, k, v = qkv(grad=False)
            with torch.inference_mode():
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        phase("step", step)

    trace, ops = traced(drive)
    assert [op for op in ops if "attention" in op] == [
        "aten._scaled_dot_product_cudnn_attention.default"
    ]
    assert not trace.notes
    trace, ops = traced(drive, ac.TargetGpu("some GPU", None, "2.11.0"))
    assert "aten.scaled_dot_product_attention.default" in ops  # unknown: the composite, noted
    assert "compute capability unknown" in trace.notes["scaled_dot_product_attention"]
    trace, ops = traced(drive, None)  # no target: today's note
    assert trace.notes["scaled_dot_product_attention"].startswith("traced on the meta")


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_efficient_attention_keeps_its_seed_on_the_host_with_dropout_or_without(dropout):
    """The kernel's seed and offset are CPU scalars (no device block) outside a CUDA graph
    capture, with dropout or without: a probe that made them on the GPU crashed the process,
    and ViT training without dropout on the H200 showed no block for them (the trace had
    two 512-byte blocks a layer: runs/20261204T194000Z-h200-vit-history/)."""

    def drive(phase):
        def step():
            q, k, v = qkv(dtype=torch.float32)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
            out.sum().backward()

        phase("step", step)

    trace, _ = traced(drive)
    forward = [
        ev[1]
        for ev in trace.events
        if ev[0] == "op" and ev[1].name == "aten._scaled_dot_product_efficient_attention.default"
    ]
    assert len(forward) == 1
    # output and logsumexp on the device; the seed and offset never
    assert [index for index, *_ in forward[0].outputs] == [0, 1]
    backward = next(
        s
        for s in trace.signatures.values()
        if s.name == "aten._scaled_dot_product_efficient_attention_backward.default"
    )
    places = [
        leaf[-1] for leaf in backward.leaves if isinstance(leaf, tuple) and leaf[0] == "tensor"
    ]
    assert places.count("cpu") == 2
