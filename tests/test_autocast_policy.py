"""CUDA autocast in the trace without a GPU (autocast_policy.py): the casts a GPU makes, read
from PyTorch's own policy, recorded through autograd as on the GPU; nothing changes outside a
region. The calls it makes are held to PyTorch's own CUDA autocast on fake CUDA tensors,
where that autocast runs (forward only: autograd on fake CUDA tensors needs a GPU)."""

from __future__ import annotations

import contextlib

import pytest

from pipeline.core import torch_private
from pipeline.predicting import attention_choice as ac
from pipeline.predicting import autocast_policy as ap
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

torch = pytest.importorskip("torch")
nn = torch.nn
aten = torch.ops.aten
BF16 = torch.bfloat16


# What a trace that entered a CUDA autocast region says until a GPU has checked the emulation.
UNCHECKED = {ap.NOTE: ap.UNCHECKED_WHY}


def traced(body, **options):
    """The trace of `body(seen)` run as one phase on the meta device, and what it saw."""
    seen: dict = {}

    def drive(phase):
        phase("step", lambda: body(seen))

    return tp.run_trace(torch, "meta", drive, target=ac.H200, **options), seen


def casts(trace, nbytes: int) -> int:
    """The trace's casts (`_to_copy`) that allocate `nbytes`."""
    return sum(
        1
        for event in trace.events
        if event[0] == "op"
        and event[1].name == "aten._to_copy.default"
        and any(size == nbytes for _, _, size in event[1].outputs)
    )


def test_a_linear_layer_runs_in_bfloat16_and_its_weight_is_cast_once_a_region():
    def body(seen):
        layer = nn.Linear(256, 512, device="meta")
        x = torch.randn(64, 256, device="meta")
        for region in range(2):
            with torch.autocast("cuda", dtype=BF16):
                first, second = layer(x), layer(x)  # the second reuses the cast weight
            seen[region] = (first.dtype, second.dtype)
        (first.float().sum() + second.float().sum()).backward()
        seen["grad"] = (layer.weight.grad.dtype, layer.bias.grad.dtype)

    trace, seen = traced(body)
    assert seen == {0: (BF16, BF16), 1: (BF16, BF16), "grad": (torch.float32, torch.float32)}
    assert casts(trace, 512 * 256 * 2) == 2  # one per region, both layer calls
    assert casts(trace, 64 * 256 * 2) == 4  # the input, at each call
    assert trace.notes == {}  # checked on a GPU: no note


def test_without_the_cache_the_weight_is_cast_at_each_call():
    def body(seen):
        layer = nn.Linear(256, 512, device="meta")
        x = torch.randn(64, 256, device="meta")
        with torch.autocast("cuda", dtype=BF16, cache_enabled=False):
            layer(x), layer(x)

    trace, _ = traced(body)
    assert casts(trace, 512 * 256 * 2) == 2


def test_the_cast_weight_is_held_until_the_outermost_region_ends():
    """cached_cast's table holds the cast until clear_cache, at the outermost exit."""
    marks = {}

    def drive(phase):
        events = phase.__self__.trace.events

        def step():
            layer = nn.Linear(256, 512, device="meta")
            x = torch.randn(64, 256, device="meta")
            with torch.no_grad(), torch.autocast("cuda", dtype=BF16):
                with torch.autocast("cuda", dtype=BF16):
                    layer(x)
                torch.empty(1, device="meta")  # an operator: the frees so far are recorded
                marks["inner exited"] = len(events)
            torch.empty(1, device="meta")
            marks["outer exited"] = len(events)

        phase("step", step)

    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    (weight,) = (
        e[1].outputs[0][1]
        for e in trace.events
        if e[0] == "op" and e[1].outputs and e[1].outputs[0][2] == 512 * 256 * 2
    )
    (freed,) = (i for i, e in enumerate(trace.events) if e == ("free", weight))
    assert marks["inner exited"] < freed < marks["outer exited"]


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("softmax", lambda y: torch.softmax(y, -1)),
        ("log_softmax", lambda y: nn.functional.log_softmax(y, -1)),
        ("layer_norm", lambda y: nn.functional.layer_norm(y, (512,))),
        ("mse_loss", lambda y: nn.functional.mse_loss(y, torch.zeros_like(y))),
        ("exp", torch.exp),
        ("sum", torch.sum),
        ("norm", aten.norm.Scalar),  # autocast calls another overload, with a float32 dtype
        (
            "cross_entropy",
            lambda y: nn.functional.cross_entropy(
                y, torch.zeros(64, dtype=torch.long, device="meta")
            ),
        ),
    ],
)
def test_the_float32_operators_give_float32_from_a_bfloat16_input(name, call):
    def body(seen):
        layer = nn.Linear(256, 512, device="meta")
        with torch.autocast("cuda", dtype=BF16):
            y = layer(torch.randn(64, 256, device="meta"))
            seen["input"] = y.dtype
            seen["output"] = call(y).dtype

    _, seen = traced(body)
    assert seen == {"input": BF16, "output": torch.float32}


def test_the_promoting_operators_take_the_widest_dtype():
    def body(seen):
        a32 = torch.randn(8, 8, device="meta")
        b16 = torch.randn(8, 8, device="meta", dtype=BF16)
        with torch.autocast("cuda", dtype=BF16):
            seen["addcmul"] = torch.addcmul(a32, b16, b16).dtype  # autocast's promote list
            seen["atan2"] = torch.atan2(b16, a32).dtype
            seen["cat"] = torch.cat([a32, b16]).dtype  # promotes by itself
            seen["add"] = (a32 + b16).dtype

    trace, seen = traced(body)
    assert set(seen.values()) == {torch.float32}
    assert casts(trace, 8 * 8 * 4) == 3  # addcmul's two bfloat16 arguments, atan2's one


def test_outside_a_region_in_a_disabled_one_and_under_cpu_autocast_nothing_changes(monkeypatch):
    monkeypatch.setattr(ap, "CHECKED_ON_A_GPU", False)  # the note says where a region was on

    def body(context):
        def run(seen):
            model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8)).to("meta")
            with context():
                out = model(torch.randn(16, 64, device="meta"))
            seen["out"] = out.dtype
            out.pow(2).mean().backward()

        return run

    def nested():
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast("cuda", dtype=BF16))
        stack.enter_context(torch.autocast("cuda", enabled=False))
        return stack

    plain, seen = traced(body(contextlib.nullcontext))
    assert seen["out"] == torch.float32
    for context in (
        lambda: torch.autocast("cuda", enabled=False),
        lambda: torch.autocast("cpu", dtype=BF16),  # CPU tensors only
        nested,
    ):
        trace, seen = traced(body(context))
        assert seen["out"] == torch.float32
        assert trace.events == plain.events
        assert trace.notes == (UNCHECKED if context is nested else {})  # a region was on


def test_the_dtype_of_cuda_autocast_is_float16_unless_given_and_meta_names_cuda():
    def body(seen):
        layer = nn.Linear(16, 16, device="meta")
        x = torch.randn(4, 16, device="meta")
        with torch.autocast("cuda"):
            seen["default"] = layer(x).dtype
        with torch.autocast(x.device.type, dtype=BF16):  # "meta" stands for the GPU
            seen["meta"] = layer(x).dtype
        with torch.cuda.amp.autocast(dtype=BF16):
            seen["torch.cuda.amp"] = layer(x).dtype
        seen["after"] = layer(x).dtype

    with pytest.warns(FutureWarning):  # torch.cuda.amp.autocast is deprecated
        _, seen = traced(body)
    assert seen == {
        "default": torch.float16,
        "meta": BF16,
        "torch.cuda.amp": BF16,
        "after": torch.float32,
    }
    assert torch.autocast is torch.amp.autocast is torch.amp.autocast_mode.autocast


def test_checkpointing_recomputes_under_the_autocast_of_its_forward():
    from torch.utils.checkpoint import checkpoint

    def body(seen):
        layer = nn.Linear(256, 512, device="meta")
        x = torch.randn(64, 256, device="meta", requires_grad=True)
        with torch.autocast("cuda", dtype=BF16):
            y = checkpoint(layer, x, use_reentrant=False)
        seen["out"] = y.dtype
        y.float().sum().backward()  # outside the region: the recomputation casts again
        seen["grad"] = layer.weight.grad.dtype

    trace, seen = traced(body)
    assert seen == {"out": BF16, "grad": torch.float32}
    assert casts(trace, 512 * 256 * 2) == 2  # the forward's, the recomputation's


def test_the_cache_rules_are_this_pytorchs():
    """PyTorch 2.13 keeps no cast under inference mode and makes the kept ones with grad."""
    rules = ap.cache_rules(torch)
    if torch.__version__.startswith("2.13"):
        assert rules == ap.CacheRules(
            in_inference_mode=False, without_grad=True, made_with_grad=True, redone_for_grad=False
        )


# ---------------------------------------------------------------- a Llama's training step


def llama(**changes):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, **changes,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def test_a_llama_training_step_under_bf16_autocast_is_predicted_with_its_own_figures(
    monkeypatch,
):
    from pipeline.predicting import gpu_calibration

    def drive(mixed):
        def body(seen):
            model = llama()
            ids = torch.randint(0, 256, (2, 32), device="meta")
            with torch.autocast("cuda", dtype=BF16) if mixed else contextlib.nullcontext():
                out = model(input_ids=ids, labels=ids)
            seen["logits"] = out.logits.dtype
            out.loss.backward()
            seen["grads"] = {p.grad.dtype for p in model.parameters()}
            seen["weights"] = {p.dtype for p in model.parameters()}

        return body

    calibration, _ = gpu_calibration.load("h200")
    mixed, seen = traced(drive(True))
    assert seen == {"logits": BF16, "grads": {torch.float32}, "weights": {torch.float32}}
    plain, seen = traced(drive(False))
    assert seen["logits"] == torch.float32
    assert (mixed.notes, plain.notes) == ({}, {})  # checked on a GPU: no note
    predicted = tp.predict(mixed, calibration)
    without = tp.predict(plain, calibration)
    assert predicted.rows != without.rows
    # checked on a GPU: the calibration's coverage decides, as without autocast
    assert predicted.status == without.status
    # unchecked (an emulation changed since): a central figure, neither exact nor bounded
    monkeypatch.setattr(ap, "CHECKED_ON_A_GPU", False)
    unchecked, _ = traced(drive(True))
    assert unchecked.notes == UNCHECKED
    assert unchecked.events == mixed.events
    alone = tp.predict(unchecked, calibration)
    assert alone.status == PredictionStatus.APPROXIMATE
    assert alone.bounds is None

    # The attention kernel was chosen for bfloat16 under autocast (cast ahead of the choice,
    # as scaled_dot_product_attention's autocast kernel casts before it chooses).
    def attention(trace):
        return {e[1].name for e in trace.events if e[0] == "op" and "_scaled_dot" in e[1].name}

    assert attention(mixed) == {
        "aten._scaled_dot_product_cudnn_attention.default",
        "aten._scaled_dot_product_cudnn_attention_backward.default",
    }
    assert attention(mixed) != attention(plain)


# ---------------------------------------------------------------- against PyTorch's own


class Calls(torch_private.TorchDispatchMode):
    """Each operator call's name and its outputs' dtypes and shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace != "prim":  # device questions: fake CUDA tensors' alone
            outs = out if isinstance(out, (tuple, list)) else [out]
            shapes = tuple((o.dtype, tuple(o.shape)) for o in outs if isinstance(o, torch.Tensor))
            self.calls.append((str(func), shapes))
        return out


def plain_indexing():
    """Python indexing and `contiguous` as the operators they make: their C++ needs a CUDA
    device guard, which a CPU build of PyTorch refuses for fake CUDA tensors."""
    from torch.overrides import TorchFunctionMode

    def index(x, key):
        key = key if isinstance(key, tuple) else (key,)
        named = sum(1 for k in key if k is not None and k is not Ellipsis)
        out, dim = x, 0
        for k in key:
            if k is Ellipsis:
                dim += x.dim() - named
            elif k is None:
                out, dim = aten.unsqueeze.default(out, dim), dim + 1
            elif isinstance(k, slice):
                out = aten.slice.Tensor(out, dim, k.start, k.stop, k.step or 1)
                dim += 1
            else:
                out = aten.select.int(out, dim, k)
        return out

    class PlainIndexing(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            if func is torch.Tensor.__getitem__:
                return index(*args)
            if func is torch.Tensor.contiguous and not args[0].is_contiguous():
                return aten.clone.default(args[0], memory_format=torch.contiguous_format)
            return func(*args, **(kwargs or {}))

    return PlainIndexing()


def on_fake_cuda(model):
    """The model's parameters and buffers as fake CUDA tensors (no initialisation: a CPU
    build cannot fill one)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                cuda = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="cuda")
                module._parameters[name] = nn.Parameter(cuda, p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty_strided(
                    b.shape, b.stride(), dtype=b.dtype, device="cuda"
                )
    return model


def mlp():
    with torch.device("meta"):
        return nn.Sequential(
            nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10), nn.Softmax(-1)
        )


def run_forward(build, inputs, grad_mode, cuda: bool):
    """The forward's calls, under PyTorch's CUDA autocast on fake CUDA tensors (`cuda`) or
    under the emulation on the meta device. The cache is off under no_grad: PyTorch makes a
    kept cast with grad enabled, which fake CUDA tensors cannot take without a GPU."""
    fake = torch_private.FakeTensorMode()
    device = "cuda" if cuda else "meta"
    with fake:
        model = build()
        if cuda:
            model = on_fake_cuda(model)
        args = inputs(device)
    calls = Calls()
    cache = grad_mode is torch.inference_mode
    if cuda:
        torch.set_autocast_dtype("cuda", BF16)
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_cache_enabled(cache)
        torch.autocast_increment_nesting()
        try:
            with fake, plain_indexing(), grad_mode(), calls:
                out = model(**args)
        finally:
            torch.autocast_decrement_nesting()
            torch.clear_autocast_cache()
            torch.set_autocast_enabled("cuda", False)
            torch.set_autocast_cache_enabled(True)
    else:
        undo = ap.install(torch, {})
        try:
            region = torch.autocast("cuda", dtype=BF16, cache_enabled=cache)
            with fake, plain_indexing(), region, grad_mode(), calls:
                out = model(**args)
        finally:
            undo()
    return calls.calls, out


def mlp_inputs(device):
    return {"input": torch.empty(8, 64, device=device)}


def llama_inputs(device):
    # A 4D mask and the positions given: transformers would build them by indexing
    ids = torch.zeros(2, 16, dtype=torch.long, device=device)
    return {
        "input_ids": ids,
        "labels": ids,
        "attention_mask": torch.zeros(2, 1, 16, 16, device=device),
        "position_ids": torch.zeros(1, 16, dtype=torch.long, device=device),
        "use_cache": False,
    }


@pytest.mark.parametrize(
    "grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference"]
)
@pytest.mark.parametrize(
    ("build", "inputs"),
    [(mlp, mlp_inputs), (lambda: llama(attn_implementation="eager"), llama_inputs)],
    ids=["mlp", "llama"],
)
def test_the_calls_are_those_of_pytorchs_own_cuda_autocast(build, inputs, grad_mode):
    gpu, _ = run_forward(build, inputs, grad_mode, cuda=True)
    meta, _ = run_forward(build, inputs, grad_mode, cuda=False)
    assert len(gpu) > 10
    assert meta == gpu
    assert any(dtype == BF16 for _, outs in gpu for dtype, _ in outs)
