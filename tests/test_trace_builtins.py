"""The GPU-free trace on torch.nn's own modules, in inference and training, float32 and
bfloat16: it follows their code to the end (no crash), its allocations are those of a real
run on the CPU recorded the same way, and the prediction never says "exact" without a
calibration."""

from __future__ import annotations

import warnings

import pytest

from pipeline.predicting import attention_choice as ac
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

torch = pytest.importorskip("torch")
nn = torch.nn
WIDTH, HEADS, BATCH, TOKENS = 32, 4, 2, 8


def encoder(device, dtype):
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 64, batch_first=True, device=device)
    return nn.TransformerEncoder(layer, 2).to(dtype), (BATCH, TOKENS, WIDTH)


def decoder(device, dtype):
    layer = nn.TransformerDecoderLayer(WIDTH, HEADS, 64, batch_first=True, device=device)
    model = nn.TransformerDecoder(layer, 2).to(dtype)

    class SelfDecoder(nn.Module):  # the memory is the input itself: one argument
        def __init__(self) -> None:
            super().__init__()
            self.decoder = model

        def forward(self, x):
            return self.decoder(x, x)

    return SelfDecoder(), (BATCH, TOKENS, WIDTH)


def attention(device, dtype):
    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True, device=device)

        def forward(self, x):
            return self.mha(x, x, x)[0]

    return SelfAttention().to(dtype), (BATCH, TOKENS, WIDTH)


def recurrent(kind):
    def build(device, dtype):
        class Last(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = kind(WIDTH, WIDTH, num_layers=2, batch_first=True, device=device)

            def forward(self, x):
                return self.rnn(x)[0]

        return Last().to(dtype), (BATCH, TOKENS, WIDTH)

    return build


def convolutions(device, dtype):
    layers = [
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.GroupNorm(2, 8),
        nn.Conv2d(8, 8, 3, stride=2),
        nn.InstanceNorm2d(8, affine=True),
        nn.Flatten(1),
    ]
    return nn.Sequential(*layers).to(device=device, dtype=dtype), (BATCH, 3, 16, 16)


def norms(device, dtype):
    with torch.device(device):
        layers = [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.RMSNorm(WIDTH), nn.GELU()]
    return nn.Sequential(*layers).to(device=device, dtype=dtype), (BATCH, TOKENS, WIDTH)


def from_data(device, dtype):
    """A module that makes a tensor from Python data on its device, as caches do."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(WIDTH, WIDTH, device=device, dtype=dtype)

        def forward(self, x):
            empty = torch.tensor([], dtype=x.dtype, device=x.device)
            scale = torch.as_tensor([0.5], dtype=x.dtype, device=x.device)
            return torch.cat([empty, (self.linear(x) * scale).flatten()])

    return Scaled(), (BATCH, TOKENS, WIDTH)


def host_schedule(device, dtype):
    """A module that computes on the CPU and reads the values back, as ConvNeXt's, Swin's
    and BEiT's stochastic depth does (`torch.linspace(..., device="cpu").tolist()`), and
    copies a CPU tensor to its device in forward."""

    class Scheduled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            rates = torch.linspace(0, 0.2, 4, device="cpu").split([2, 2])
            self.rates = [x.tolist() for x in rates]
            self.linear = nn.Linear(WIDTH, WIDTH, device=device, dtype=dtype)

        def forward(self, x):
            weights = torch.linspace(0.5, 1.0, WIDTH, device="cpu").to(x.device, x.dtype)
            return self.linear(x) * weights * (1 - self.rates[1][1])

    return Scheduled(), (BATCH, TOKENS, WIDTH)


MODULES = {
    "TransformerEncoder": encoder,
    "TransformerDecoder": decoder,
    "MultiheadAttention": attention,
    "LSTM": recurrent(nn.LSTM),
    "GRU": recurrent(nn.GRU),
    "convolutions and norms": convolutions,
    "LayerNorm RMSNorm": norms,
    "tensors from data": from_data,
    "a schedule on the host": host_schedule,
}


def protocol(build, device, dtype, training: bool):
    """The own-model protocol's phases, as own_model.step_plan runs them."""

    def drive(phase):
        _, model = phase("model_load", lambda: build(device, dtype))
        model, shape = model
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True) if training else None
        _, x = phase("inputs", lambda: torch.randn(shape, device=device, dtype=dtype))

        def step(first: bool):
            def run():
                if not training:
                    model.eval()
                    with torch.inference_mode():
                        return model(x)
                if not first:
                    optimizer.zero_grad()
                loss = model(x).float().square().mean()
                loss.backward()
                if not first:
                    optimizer.step()
                return loss

            return run

        phase("cold_step", step(True))
        if training:
            phase("optimizer_state", optimizer.step)
        phase("warm_step", step(False))

    return drive


def allocations(trace) -> list:
    return [(n, event[1].name) for event in trace.events if event[0] == "op" for *_, n in
            event[1].outputs]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", MODULES)
def test_torch_nn_modules_trace_without_a_gpu(name, training, dtype):
    trace = tp.run_trace(torch, "meta", protocol(MODULES[name], "meta", dtype, training))
    assert trace.stopped is None
    prediction = tp.predict(trace)
    assert prediction.status == PredictionStatus.APPROXIMATE  # no calibration: never "exact"
    assert len(prediction.rows) == (5 if training else 4)
    assert prediction.rows[-1]["peak_allocated_bytes"] > 0


def fused_dropout(input, p=0.5, training=True, inplace=False):
    """Dropout as at::native::dropout (Dropout.cpp) runs it for a CUDA input: the fused
    native_dropout in training with 0 < p < 1 (not in place); the CPU takes another path."""
    if training and not inplace and 0 < p < 1 and input.numel() > 0:
        return torch.native_dropout(input, p, True)[0]
    return ORIGINAL_DROPOUT(input, p, training, inplace)


ORIGINAL_DROPOUT = torch.nn.functional.dropout


@pytest.mark.parametrize("name", ["TransformerEncoder", "LayerNorm RMSNorm"])
def test_the_trace_allocates_what_a_real_cpu_run_allocates(name, monkeypatch):
    """The oracle: the same protocol run for real on the CPU, recorded by the same dispatch
    mode without fake tensors, allocates the same sizes by the same operators in order; its
    dropout takes the GPU's path (fused_dropout), as the meta trace stands for a GPU."""
    build = MODULES[name]
    fake = tp.run_trace(torch, "meta", protocol(build, "meta", torch.float32, True))
    monkeypatch.setattr(torch.nn.functional, "dropout", fused_dropout)
    real = tp.run_trace(torch, "cpu", protocol(build, "cpu", torch.float32, True), fake=False)
    assert allocations(fake) == allocations(real)
    assert len(allocations(fake)) > 20


def test_values_computed_on_the_host_are_real_and_only_the_copy_to_the_device_allocates():
    """The CPU work a GPU run does for real is done for real (its values read back: the
    trace used to stop at `.tolist()`) and allocates nothing on the device; the CPU tensor
    copied to the device in forward is the device's block, WIDTH float32 values, allocated
    by the copy before the layer's output, as on a GPU. (Under inference mode PyTorch hands
    that copy to no mode: the block is then allocated at its first use.)"""
    trace = tp.run_trace(torch, "meta", protocol(host_schedule, "meta", torch.float32, True))
    assert trace.stopped is None
    made = allocations(trace)
    assert made[:2] == [
        (WIDTH * WIDTH * 4, "aten.empty.memory_format"),
        (WIDTH * 4, "aten.empty.memory_format"),
    ]  # the layer's; nothing of the host's
    step = made[3:5]  # after the inputs, the cold step
    assert step == [
        (WIDTH * 4, "aten._to_copy.default"),
        (BATCH * TOKENS * WIDTH * 4, "aten.addmm.default"),
    ]
    copies = [n for n, name in made if name == "aten._to_copy.default"]
    assert copies == [WIDTH * 4] * 2


def test_a_deep_copy_of_a_fake_module_stays_in_the_traces_mode():
    """nn.TransformerEncoder deep-copies its layer: the copies' parameters are the trace's
    and allocate, while the layer given is alive (a real run holds all three at once)."""
    trace = tp.run_trace(torch, "meta", protocol(encoder, "meta", torch.float32, False))
    row = tp.predict(trace).rows[0]
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 64)
    one_layer = sum(p.numel() * 4 for p in layer.parameters())
    assert row["allocated_bytes"] >= 2 * one_layer  # the two copies
    assert row["peak_allocated_bytes"] >= 3 * one_layer  # and the layer given


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN], ids=lambda k: k.__name__)
def test_recurrent_layers_traced_without_a_gpu_say_a_gpu_runs_cudnn(kind):
    """On the meta device the recurrence is traced step by step; a GPU runs cuDNN's fused
    kernels (other blocks): named, so the prediction is approximate whatever is calibrated."""
    trace = tp.run_trace(torch, "meta", protocol(recurrent(kind), "meta", torch.float32, True))
    assert "recurrent layers" in trace.notes


def test_dropout_in_training_keeps_a_one_byte_mask_as_on_a_gpu():
    """A GPU's dropout saves a bool mask for backward, not a noise tensor of the input's
    dtype (the meta device's own path): for bfloat16 input, half the bytes."""

    def drive(phase):
        def step():
            x = torch.randn(4, 64, 32, device="meta", dtype=torch.bfloat16, requires_grad=True)
            nn.Dropout(0.1)(x).sum().backward()

        phase("step", step)

    trace = tp.run_trace(torch, "meta", drive)
    dropouts = [e[1] for e in trace.events if e[0] == "op" and "dropout" in e[1].name]
    assert [op.name for op in dropouts] == [
        "aten.native_dropout.default",
        "aten.native_dropout_backward.default",
    ]
    assert [size for *_, size in dropouts[0].outputs] == [4 * 64 * 32 * 2, 4 * 64 * 32]


def written_into_out(device: str):
    """`out=` products as the decoder's rotary embedding and norms make them: into a view of
    the right shape (nothing allocated), into a lower dtype (the result cast), and into an
    empty tensor the kernel resizes (its block allocated there)."""

    def drive(phase):
        x = torch.randn(4, 8, 16, device=device)
        scale = torch.randn(1, 8, 1, device=device)

        def step():
            out = torch.empty(4, 8, 16, device=device)
            torch.mul(x[..., :8], scale, out=out[..., :8])
            torch.add(x[..., 8:], scale, alpha=2.0, out=out[..., 8:])
            half = torch.empty(4, 8, 16, dtype=torch.bfloat16, device=device)
            torch.sub(x, scale, out=half)
            grown = torch.empty(0, device=device)
            torch.mul(x, 2.0, out=grown)
            return out, half, grown

        phase("cold_step", step)

    return drive


def test_an_out_product_allocates_only_where_its_out_is_resized_as_a_real_run_does():
    """The trace takes a product into a fitting `out` without the fake kernel (which caches
    no `out=` call); one whose `out` must grow goes through it, and its resize is seen."""

    def events(trace) -> list:
        return [
            ("op", e[1].name, tuple(o[-1] for o in e[1].outputs)) if e[0] == "op"
            else ("resize", *e[2:]) if e[0] == "resize" else (e[0],)
            for e in trace.events
        ]  # fmt: skip

    fake = tp.run_trace(torch, "meta", written_into_out("meta"))
    real = tp.run_trace(torch, "cpu", written_into_out("cpu"), fake=False)
    assert fake.stopped is None
    assert events(fake) == events(real)
    step = events(fake)[events(fake).index(("start",)) + 1 :]
    assert [e for e in step if e[0] != "op" or e[2]] == [
        ("op", "aten.empty.memory_format", (4 * 8 * 16 * 4,)),
        ("op", "aten.empty.memory_format", (4 * 8 * 16 * 2,)),  # bfloat16
        ("op", "aten.empty.memory_format", (0,)),
        ("resize", 4 * 8 * 16 * 4),  # the grown `out`, before its product
        ("end",),
    ]


def test_an_out_the_result_cannot_be_cast_to_raises_in_the_trace_as_on_a_gpu():
    def drive(phase):
        x = torch.randn(4, 8, device="meta")
        whole = torch.empty(4, 8, dtype=torch.int64, device="meta")
        phase("cold_step", lambda: torch.mul(x, 1.5, out=whole))

    with pytest.raises(RuntimeError, match="can't be cast"):
        tp.run_trace(torch, "meta", drive)


# ------------------------------------------------------------------ batch norm on a GPU


def batch_norm_ops(dtype, mode, target=ac.H200, x_shape=(4, 8, 6, 6), channels_last=False):
    """The trace of one BatchNorm2d call (and its backward in training) on the meta device:
    the names of the operators it records, its notes, and its operator calls."""
    format = torch.channels_last if channels_last else torch.contiguous_format

    def drive(phase):
        def step():
            bn = nn.BatchNorm2d(x_shape[1], device="meta", dtype=dtype)
            x = torch.randn(x_shape, device="meta", dtype=dtype).to(memory_format=format)
            if mode == "training":
                bn(x.requires_grad_()).sum().backward()
            elif mode == "no_grad":
                with torch.no_grad():
                    bn.eval()(x)
            else:
                with torch.inference_mode():
                    bn.eval()(x)

        phase("step", step)

    trace = tp.run_trace(torch, "meta", drive, target=target)
    assert trace.stopped is None
    calls = [event[1] for event in trace.events if event[0] == "op"]
    return [call.name for call in calls if "norm" in call.name], trace.notes, calls


@pytest.mark.parametrize(
    ("dtype", "mode", "expected"),
    [
        (torch.float32, "training",
         ["aten.cudnn_batch_norm.default", "aten.cudnn_batch_norm_backward.default"]),
        (torch.float32, "no_grad", ["aten.cudnn_batch_norm.default"]),
        (torch.float32, "inference", ["aten.batch_norm.default"]),
        (torch.bfloat16, "training",
         ["aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"]),
        (torch.bfloat16, "no_grad", ["aten.native_batch_norm.default"]),
        (torch.float16, "training",
         ["aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"]),
    ],
    ids=lambda v: str(v).replace("torch.", "") if not isinstance(v, list) else "",
)  # fmt: skip
def test_batch_norm_takes_the_kernel_a_gpu_with_cudnn_takes(dtype, mode, expected):
    """For a GPU target the trace runs batch norm as `_batch_norm_impl_index` does there:
    cuDNN's forward and backward for float32, PyTorch's native kernels for bfloat16 and for
    float16 with float16 weights (which cuDNN's path refuses); under inference mode the
    composite recorded whole, as the GPU's trace records it. Nothing is noted: the kernel is
    the GPU's."""
    names, notes, _ = batch_norm_ops(dtype, mode)
    assert names == expected
    assert "batch_norm" not in notes


def test_batch_norm_for_an_unknown_gpu_is_noted():
    """Without a target (a GPU of unknown kind, an AMD one included), the meta device's
    native kernel is all there is, and the prediction says so."""
    names, notes, _ = batch_norm_ops(torch.float32, "training", target=None)
    assert names == ["aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"]
    assert "batch_norm" in notes


def test_cudnn_batch_norm_saves_float_statistics_and_copies_a_strided_input_first():
    """cuDNN's forward in training allocates its output, the float32 mean and inverse
    variance of each channel, and its reserve; an input that is not contiguous in its
    suggested memory format is copied first (a channels-last input is not)."""
    n, c, h, w = 4, 8, 6, 6
    _, _, calls = batch_norm_ops(torch.float32, "training")
    forward = next(call for call in calls if call.name == "aten.cudnn_batch_norm.default")
    # the reserve: 0 bytes (cuDNN sizes it on the GPU; see CUDNN_BN_RESERVE)
    assert [nbytes for *_, nbytes in forward.outputs] == [n * c * h * w * 4, c * 4, c * 4, 0]
    _, _, calls = batch_norm_ops(torch.float32, "training", channels_last=True)
    before = [call.name for call in calls[: calls.index(next(
        call for call in calls if call.name == "aten.cudnn_batch_norm.default"))]]  # fmt: skip
    assert "aten.clone.default" not in before

    def drive(phase):
        def step():
            bn = nn.BatchNorm2d(c, device="meta")
            x = torch.randn(n, h, w, c, device="meta").permute(0, 3, 1, 2)[:, :, :, :4]
            bn(x.requires_grad_()).sum().backward()

        phase("step", step)

    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    names = [event[1].name for event in trace.events if event[0] == "op"]
    at = names.index("aten.cudnn_batch_norm.default")
    assert "aten.clone.default" in names[:at]


def test_batch_norm_of_one_value_per_channel_in_training_raises_as_pytorch_does():
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        batch_norm_ops(torch.float32, "training", x_shape=(1, 8, 1, 1))


def test_batch_norm_with_eps_zero_raises_as_it_does_on_the_gpu():
    """F.batch_norm refuses eps <= 0 before any kernel (the H200's probe met it): taking
    cuDNN's kernel for it must not skip that, or the estimate gives a figure for a model that
    fails."""

    def drive(phase):
        def step():
            bn = nn.BatchNorm2d(8, eps=0.0, device="meta")
            bn(torch.randn(4, 8, 6, 6, device="meta", requires_grad=True)).sum().backward()

        phase("step", step)

    with pytest.raises(ValueError, match="eps must be positive"):
        tp.run_trace(torch, "meta", drive, target=ac.H200)


BN_BASE = {"dtype": torch.float32, "weight": torch.float32, "affine": True, "stats": "both",
           "dim": 4, "batch": 4, "training": True, "eps": 1e-5, "cudnn": True}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "takes"),
    [
        ({}, True),
        ({"dtype": torch.bfloat16, "weight": torch.bfloat16}, False),
        ({"weight": torch.bfloat16}, False),
        ({"dtype": torch.float16, "weight": torch.float16}, False),
        ({"dtype": torch.float16}, True),  # float16 input, float32 weights
        ({"dtype": torch.float64, "weight": torch.float64}, True),
        ({"affine": False}, False),
        ({"stats": "mean"}, False),
        ({"stats": "none"}, True),
        ({"stats": "none", "training": False}, False),
        ({"dim": 2}, False),
        ({"dim": 3}, True),
        ({"batch": 65536, "training": False, "dim": 3}, False),
        ({"batch": 65535, "training": False, "dim": 3}, True),
        ({"batch": 65536, "dim": 3}, True),
        ({"batch": 880802, "dim": 3}, False),
        ({"eps": -1e-9}, False),
        ({"cudnn": False}, False),
    ],
    ids=lambda v: ",".join(f"{k}={v[k]}".replace("torch.", "") for k in v) or "base"
    if isinstance(v, dict) else str(v),
)  # fmt: skip
def test_cudnn_takes_batch_norm_as_pytorchs_backend_choice_says(change, takes):
    """Each condition of `_select_batch_norm_backend` turned against cuDNN on its own."""
    case = {**BN_BASE, **change}
    shape = (case["batch"], 3, 2, 2)[: case["dim"]]
    x = torch.empty(shape, device="meta", dtype=case["dtype"])
    weight = torch.empty(3, device="meta", dtype=case["weight"])
    stats = {"both": (weight, weight), "mean": (weight, None), "none": (None, None)}
    mean, var = stats[case["stats"]]
    affine = (weight, weight) if case["affine"] else (None, None)
    with torch.backends.cudnn.flags(enabled=case["cudnn"]):
        assert tp.cudnn_takes_batch_norm(
            torch, x, *affine, mean, var, case["training"], case["eps"]
        ) is takes  # fmt: skip


@pytest.mark.parametrize(
    ("autocast", "dtype", "status"),
    [
        (lambda: torch.autocast("cuda", dtype=torch.bfloat16), torch.bfloat16, "exact"),
        # no float16 product was probed on the H200: its workspaces are borrowed (BORROWED)
        (lambda: torch.autocast(device_type="cuda", dtype=torch.float16), torch.float16, "bounds"),
        (lambda: torch.autocast("cuda", enabled=False), torch.float32, "exact"),
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16), torch.float32, "exact"),  # CPU only
    ],
    ids=["cuda-bf16", "cuda-fp16-keyword", "disabled", "cpu"],
)
@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
def test_cuda_autocast_traced_without_a_gpu_makes_the_gpus_casts(
    monkeypatch, autocast, dtype, status, checked
):
    """On the meta device PyTorch makes none of CUDA autocast's casts (and disables it
    without a GPU); the trace makes them as an H100 does (autocast_policy.py): the linear
    layers run in the autocast dtype, and the prediction has its own figures. Until a GPU
    has checked the emulation, a region that was on withholds "exact" and the bounds; once
    checked, the calibration's coverage decides the status as for any trace."""
    from pipeline.predicting import autocast_policy

    monkeypatch.setattr(autocast_policy, "CHECKED_ON_A_GPU", checked)
    region = dtype != torch.float32  # a CUDA region was on
    from pipeline.predicting import gpu_calibration

    seen = {}

    def drive(phase):
        def step():
            model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10))
            model = model.to("meta")
            with autocast():
                out = model(torch.randn(64, 256, device="meta"))
            seen["out"] = out.dtype
            out.float().pow(2).mean().backward()
            return model

        phase("step", step)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "CUDA is not available ... Disabling autocast"
        trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    calibration, _ = gpu_calibration.load("h200")
    prediction = tp.predict(trace, calibration)
    assert seen["out"] == dtype
    if region and not checked:
        assert trace.notes == {autocast_policy.NOTE: autocast_policy.UNCHECKED_WHY}
        assert prediction.status == PredictionStatus.APPROXIMATE
        assert prediction.bounds is None
        return
    assert trace.notes == {}
    if status == "exact":
        assert prediction.status == PredictionStatus.EXACT
    else:
        assert prediction.status == PredictionStatus.APPROXIMATE
        assert prediction.bounds is not None
