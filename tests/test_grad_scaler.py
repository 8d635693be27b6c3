"""torch.amp.GradScaler in the trace without a GPU (grad_scaler.py): built as on a GPU, its
scale and unscaling traced as PyTorch's source makes them, the optimizer's step taken; in
`measure`, a step the scaler skipped stops the run as not the step measured."""

from __future__ import annotations

import json
import warnings

import pytest
from test_own_model import HEADER, REGISTRY, measure, workload

from pipeline.artefacts import validate
from pipeline.measuring import own_model
from pipeline.predicting import attention_choice as ac
from pipeline.predicting import grad_scaler
from pipeline.predicting import trace_prediction as tp

torch = pytest.importorskip("torch")
nn = torch.nn


def traced(body):
    """The trace of `body(seen)` run as one phase on the meta device, and what it saw."""
    seen: dict = {}

    def drive(phase):
        phase("step", lambda: body(seen))

    return tp.run_trace(torch, "meta", drive, target=ac.H200), seen


def small_blocks(trace) -> list[tuple[str, int]]:
    """(operator, bytes) of each output of 8 bytes or fewer the trace allocated."""
    return [
        (event[1].name, size)
        for event in trace.events
        if event[0] == "op"
        for _, _, size in event[1].outputs
        if 0 < size <= 8
    ]


def scaled_step(seen):
    layer = nn.Linear(64, 32, device="meta")
    optimizer = torch.optim.AdamW(layer.parameters(), foreach=True)
    scaler = torch.amp.GradScaler("cuda")
    seen["enabled"] = scaler.is_enabled()
    loss = layer(torch.randn(8, 64, device="meta")).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    seen["state"] = sorted(optimizer.state[layer.weight])


def test_a_cuda_scaler_is_built_enabled_and_its_step_is_taken():
    """Without the module a CUDA scaler disables itself here (no GPU) and scale() returns the
    loss; in the trace it is enabled, and step() runs AdamW's step, whose state it makes,
    without reading the found-inf flag (a fake tensor's value)."""
    trace, seen = traced(scaled_step)
    assert seen == {"enabled": True, "state": ["exp_avg", "exp_avg_sq", "step"]}
    assert small_blocks(trace) == [
        ("aten.mean.default", 4),  # the loss
        # scale(), at its first call: the scale (float32) and the growth tracker (int32);
        # the scaled loss
        ("aten.full.default", 4), ("aten.full.default", 4), ("aten.mul.Tensor", 4),
        ("aten.ones_like.default", 4), ("aten.mul.Tensor", 4),  # backward's first steps
        # unscale_(): the reciprocal of the scale through float64, the found-inf flag, and a
        # copy of each for the device (_MultiDeviceReplicator: .to(copy=True))
        ("aten._to_copy.default", 8), ("aten.reciprocal.default", 8),
        ("aten._to_copy.default", 4), ("aten.full.default", 4),
        ("aten._to_copy.default", 4), ("aten._to_copy.default", 4),
    ]  # fmt: skip
    assert trace.notes.get(grad_scaler.NOTE) == (
        None if grad_scaler.CHECKED_ON_A_GPU else grad_scaler.UNCHECKED_WHY
    )


def test_the_scalers_operators_are_known_to_allocate_nothing():
    trace, _ = traced(scaled_step)
    calls = {signature.name for signature in trace.signatures.values()}
    assert "aten._amp_foreach_non_finite_check_and_unscale_.default" in calls
    assert "aten._amp_update_scale_.default" in calls
    uncovered = {
        signature.name
        for key, signature in trace.signatures.items()
        if tp.not_covered(key, signature, None) is not None
    }
    assert not any("_amp_" in name for name in uncovered)


def test_outside_the_trace_the_scaler_is_pytorchs_again():
    traced(scaled_step)
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = torch.amp.GradScaler("cuda")
    assert not scaler.is_enabled()
    assert torch.amp.GradScaler._maybe_opt_step.__module__ == "torch.amp.grad_scaler"


def test_a_cpu_scaler_is_left_as_pytorch_runs_it():
    """Only a CUDA scaler is the GPU's: a CPU one is built as PyTorch builds it, and its
    step still reads no flag in the trace."""

    def body(seen):
        seen["enabled"] = torch.amp.GradScaler("cpu", enabled=False).is_enabled()

    _, seen = traced(body)
    assert seen == {"enabled": False}


SCALED = HEADER + (
    "def scaled(config, *, width=64):\n"
    "    model = torch.nn.Linear(16, width).to(config.device)\n"
    "    optimizer = torch.optim.AdamW(model.parameters())\n"
    "    scaler = torch.amp.GradScaler(config.device.type)\n"
    "    def make_inputs():\n"
    "        return torch.randn(config.batch, 16, device=config.device)\n"
    "    def step(model, x):\n"
    "        return model(x).square().mean() * {factor}\n"
    "    return Workload(model, make_inputs, step, optimizer, scaler=scaler)\n"
)


def test_measure_runs_the_scalers_step_and_records_it(capsys, tmp_path):
    path = workload(tmp_path, SCALED.format(factor="1.0"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CPU scaler of PyTorch's: no warning expected
        code, output = measure(tmp_path, f"{path}:scaled", "--repeats", "2")
    assert code == 0, capsys.readouterr().err
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["workload"]["grad_scaler"] is True
    assert document["workload"]["kind"] == "training"


def test_a_step_the_scaler_skipped_is_not_recorded_as_the_step(capsys, tmp_path):
    """An inf in the scaled gradients: GradScaler skips the optimizer's step, which then
    makes no state; the run stops there, recorded as failed, never compared."""
    path = workload(tmp_path, SCALED.format(factor="float('inf')"))
    code, output = measure(tmp_path, f"{path}:scaled")
    err = capsys.readouterr().err
    assert code == 1
    assert "SkippedStep: the GradScaler skipped the optimizer step" in err
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["status"] == "failed"
    assert document["failure"]["phase"] == "optimizer_state"
    assert document["failure"]["exception_type"] == "SkippedStep"


def test_a_scaler_that_is_not_one_is_refused_in_one_line(capsys, tmp_path):
    source = SCALED.format(factor="1.0").replace(
        "scaler = torch.amp.GradScaler(config.device.type)", "scaler = object()"
    )
    path = workload(tmp_path, source)
    code, _ = measure(tmp_path, f"{path}:scaled")
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "own_model.py: error: Workload.scaler is a object, not a torch.amp.GradScaler"
    ]
    assert not (tmp_path / "m.json").exists()


def test_estimate_traces_a_users_scaled_step(capsys, tmp_path):
    path = workload(tmp_path, SCALED.format(factor="1.0").replace(
        "torch.amp.GradScaler(config.device.type)", "torch.amp.GradScaler('cuda')"
    ))  # fmt: skip
    assert own_model.main(["estimate", "--workload", f"{path}:scaled", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["workload"]["grad_scaler"] is True
    optimizer_state = document["prediction"]["phases"][3]
    assert optimizer_state["phase"] == "optimizer_state"
    # AdamW's two float32 moments of the weight and of the bias, one block each
    grown = optimizer_state["allocated_bytes"] - optimizer_state["baseline_allocated_bytes"]
    assert grown == 2 * (own_model.allocator_model.block_bytes(16 * 64 * 4) + 512)


@pytest.mark.gpu
@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused"])
def test_fp16_is_measured_on_a_gpu_and_its_prediction_holds(tmp_path, optim):
    """The Trainer's fp16 on a GPU: the scaler's step taken (a skipped one would stop the
    run), the prediction beside the GPU held to the measurement and the allocator's
    history. The fused AdamW unscales inside its kernel (no flag read), the foreach one
    after the scaler's unscale_."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from conftest import run_script
    from test_gpu_own_model import honest
    from test_hf_model import reduced, written

    config = written(tmp_path, reduced("llama-3.2-1b"))
    output = tmp_path / "m.json"
    result = run_script(
        "own_model.py", "measure", "--hf-config", str(config), "--device", "cuda:0",
        "--task", "training", "--dtype", "float32", "--fp16", "--optim", optim,
        "--batch", "2", "--dim", "sequence=64", "--output", str(output),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["status"] == "completed"
    assert document["workload"]["grad_scaler"] is True
    honest(document)
