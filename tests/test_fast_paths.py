"""The fused inference fast path of nn.TransformerEncoderLayer and nn.MultiheadAttention:
traced where a real run takes it (one fused operator, its blocks bounded), the general path
where it does not."""

from __future__ import annotations

import pytest
from test_fused_cells import calls
from test_trace_builtins import protocol

from pipeline.predicting import attention_choice as ac
from pipeline.predicting import fast_paths
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

torch = pytest.importorskip("torch")
nn = torch.nn
BATCH, TOKENS, WIDTH, HEADS, HIDDEN = 3, 10, 32, 4, 96


def encoder(batch_first: bool = True):
    def build(device, dtype):
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, HIDDEN, batch_first=batch_first, device=device
        )
        stack = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        return stack.to(dtype), (BATCH, TOKENS, WIDTH)

    return build


def attention(need_weights: bool):
    def build(device, dtype):
        class SelfAttention(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.mha = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True, device=device)

            def forward(self, x):
                return self.mha(x, x, x, need_weights=need_weights)[0]

        return SelfAttention().to(dtype), (BATCH, TOKENS, WIDTH)

    return build


def names(trace) -> list[str]:
    return [name for name, _ in calls(trace)]


def test_an_encoder_layer_in_inference_is_one_fused_call_per_layer():
    """A GPU runs each layer as _transformer_encoder_layer_fwd (eval, batch first, even
    heads, no grad): so does the trace, with no general-path operator and no note; the
    prediction is approximate with bounds (the call's blocks are not covered)."""
    trace = tp.run_trace(torch, "meta", protocol(encoder(), "meta", torch.float32, False),
                         target=ac.H200)  # fmt: skip
    assert trace.stopped is None
    assert trace.notes == {}
    made = names(trace)
    assert made.count(fast_paths.ENCODER_LAYER) == 2 * 2  # two layers, cold and warm steps
    assert "aten.native_layer_norm.default" not in made
    assert dict(calls(trace))[fast_paths.ENCODER_LAYER] == ((0, BATCH * TOKENS * WIDTH * 4),)
    prediction = tp.predict(trace)
    assert prediction.status == PredictionStatus.APPROXIMATE
    assert prediction.unbounded is None
    assert prediction.bounds is not None


@pytest.mark.parametrize("need_weights", [False, True], ids=["no-weights", "weights"])
def test_multihead_attention_in_inference_is_the_fused_call(need_weights):
    drive = protocol(attention(need_weights), "meta", torch.bfloat16, False)
    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    assert trace.notes == {}
    outputs = dict(calls(trace))[fast_paths.ATTENTION]
    assert outputs[0] == (0, BATCH * TOKENS * WIDTH * 2)
    if need_weights:  # averaged over the heads: batch x queries x keys
        assert outputs[1] == (1, BATCH * TOKENS * TOKENS * 2)
    assert tp.predict(trace).unbounded is None


@pytest.mark.parametrize("build", [encoder(), attention(False)], ids=["encoder", "attention"])
def test_in_training_the_trace_takes_the_general_path_as_a_real_run_does(build):
    trace = tp.run_trace(torch, "meta", protocol(build, "meta", torch.float32, True),
                         target=ac.H200)  # fmt: skip
    assert not set(fast_paths.FUSED) & set(names(trace))
    assert "aten.addmm.default" in names(trace)
    assert not any("fast path" in note for note in trace.notes)


GPU_ATTENTION = {
    f"aten._scaled_dot_product_{kernel}_attention.default"
    for kernel in ("flash", "efficient", "cudnn")
}


@pytest.mark.parametrize("build", [encoder(), attention(False)], ids=["encoder", "attention"])
def test_the_general_paths_attention_takes_the_kernel_the_gpu_takes(build):
    """The general path (F.multi_head_attention_forward, handed to the trace's mode as a
    whole) calls scaled_dot_product_attention: for the H200, the kernel the H200 takes, not
    the meta device's math kernel and its batch x heads x tokens x tokens scores (a
    BERT-sized encoder's training step was predicted 0.57 GB above the H200's measurement,
    outside its bounds)."""
    trace = tp.run_trace(torch, "meta", protocol(build, "meta", torch.bfloat16, True),
                         target=ac.H200)  # fmt: skip
    made = set(names(trace))
    assert "aten._safe_softmax.default" not in made
    assert len(made & GPU_ATTENTION) == 1
    assert "scaled_dot_product_attention" not in trace.notes


def test_a_condition_the_module_checks_itself_keeps_the_general_path():
    """batch_first=False: the module refuses its fast path before asking about torch
    functions; nothing fused, nothing noted."""
    build = encoder(batch_first=False)
    trace = tp.run_trace(torch, "meta", protocol(build, "meta", torch.float32, False),
                         target=ac.H200)  # fmt: skip
    assert not set(fast_paths.FUSED) & set(names(trace))
    assert trace.notes == {}


def test_eval_mode_with_grad_enabled_takes_the_general_path():
    """In evaluation mode but with grad enabled and parameters that require it, the module
    refuses its fast path (on a GPU too): the general path, not the fused call."""

    def drive(phase):
        _, built = phase("model_load", lambda: encoder()("meta", torch.float32))
        stack, shape = built
        _, x = phase("inputs", lambda: torch.randn(shape, device="meta"))
        phase("step", lambda: stack.eval()(x))

    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    assert fast_paths.ENCODER_LAYER not in names(trace)
    assert "aten.addmm.default" in names(trace)


def test_a_fused_calls_bound_holds_its_scores_and_feed_forward():
    """Beside SCRATCH_FACTOR times its tensors, the fused call's bound holds MATH_SCORES
    float32 score matrices (batch x heads x tokens x tokens) and twice the feed-forward's
    hidden layer in the input's dtype."""
    src = ("tensor", "bfloat16", [2, 100, 64], [6400, 64, 1], 0, 25600, "device")
    weight = ("tensor", "bfloat16", [256, 64], [64, 1], 0, 32768, "device")
    terms = fast_paths.scratch_terms(
        fast_paths.ENCODER_LAYER, {"src": src, "num_heads": 8, "ffn_weight_1": weight}
    )
    assert terms == (2 * 8 * 100 * 100, 2 * 2 * 100 * 256 * 2)
    query = ("tensor", "float32", [2, 100, 64], [6400, 64, 1], 0, 51200, "device")
    key = ("tensor", "float32", [2, 70, 64], [4480, 64, 1], 0, 35840, "device")
    terms = fast_paths.scratch_terms(
        fast_paths.ATTENTION, {"query": query, "key": key, "num_head": 4}
    )
    assert terms == (2 * 4 * 100 * 70, 0)
    assert fast_paths.scratch_terms("aten.mm.default", {}) is None


def test_the_fused_calls_bound_in_the_prediction_grows_with_the_scores():
    """The most replay gives the fused call its scores: at 4x the tokens the upper bound of
    the inference peak grows by at least the 16x larger scores' part."""
    uppers = []
    for tokens in (64, 256):

        def build(device, dtype, tokens=tokens):
            model, _ = encoder()(device, dtype)
            return model, (BATCH, tokens, WIDTH)

        trace = tp.run_trace(torch, "meta", protocol(build, "meta", torch.float32, False),
                             target=ac.H200)  # fmt: skip
        bounds = tp.predict(trace).bounds
        uppers.append(max(row["peak_allocated_bytes"][1] for row in bounds))
    scores = lambda tokens: BATCH * HEADS * tokens * tokens * tp.MATH_SCORES * 4  # noqa: E731
    assert uppers[1] - uppers[0] >= scores(256) - scores(64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("build", [encoder(), attention(False), attention(True)],
                         ids=["encoder", "attention", "attention-weights"])  # fmt: skip
def test_on_a_gpus_fake_tensors_the_fast_path_makes_the_same_calls(build, dtype):
    """The trace beside a measurement (a GPU's fake tensors) and the GPU-free one made for
    the H200 take the fast path alike: the same calls, outputs and order."""
    on_gpu = tp.run_trace(torch, "cuda:0", protocol(build, "cuda:0", dtype, False))
    for_gpu = tp.run_trace(torch, "meta", protocol(build, "meta", dtype, False), target=ac.H200)
    assert set(fast_paths.FUSED) & set(names(on_gpu))
    assert calls(for_gpu) == calls(on_gpu)


def test_an_encoder_given_a_padding_mask_is_not_predicted_with_the_operator_named():
    """TransformerEncoder turns a padded batch into a nested tensor whose sizes are the
    mask's values: the trace stops there, in one line naming the operator."""

    def drive(phase):
        def build():
            layer = nn.TransformerEncoderLayer(WIDTH, HEADS, HIDDEN, batch_first=True,
                                               device="meta")  # fmt: skip
            return nn.TransformerEncoder(layer, 2).eval()

        _, stack = phase("model_load", build)
        _, x = phase("inputs", lambda: torch.randn(BATCH, TOKENS, WIDTH, device="meta"))
        mask = torch.zeros(BATCH, TOKENS, dtype=torch.bool, device="meta")

        def run():
            with torch.inference_mode():
                return stack(x, src_key_padding_mask=mask)

        phase("step", run)

    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    assert "_nested_tensor_from_mask" in trace.stopped
    assert tp.predict(trace).status == PredictionStatus.NOT_PREDICTED
