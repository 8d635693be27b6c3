"""A model loaded in 8 bits (`--load-in-8bit`, bitsandbytes' LLM.int8), traced without a GPU
(predicting/bnb_int8.py): the load as transformers and bitsandbytes make it, each 8-bit
product as the CUDA dispatch runs it, the outlier columns the activations' values decide
taken as none in the central figure and as every column in the upper bound.

The oracle for the load is a real one: the same workload built for real on the CPU, where
bitsandbytes quantises in 8 bits too, every tensor it holds counted in the caching
allocator's blocks.
"""

from __future__ import annotations

import json

import pytest
from test_hf_model import estimate, reduced, written

from pipeline.core import allocator_model
from pipeline.core.workload_contract import Configuration
from pipeline.measuring import own_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from pipeline.predicting import bnb_int8, trace_prediction  # noqa: E402
from pipeline.workloads import hf_model  # noqa: E402

EIGHT = {"load_in_8bit": True}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return written(tmp_path_factory.mktemp("int8"), reduced("llama-3.2-1b"))


def held_blocks(model) -> int:
    """The caching allocator's blocks for every tensor the model holds: parameters (the
    int8 weights), buffers and each 8-bit layer's row scales, each storage once."""
    tensors = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        state = getattr(module, "state", None)
        tensors += [t for t in (getattr(state, "SCB", None),) if t is not None]
        weight = getattr(module, "weight", None)
        tensors += [t for t in (getattr(weight, "SCB", None),) if t is not None]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(allocator_model.block_bytes(n) for n in storages.values() if n)


def built_for_real(config_path, task: str):
    settings = json.loads(config_path.read_text())
    run = Configuration(device=torch.device("cpu"), dtype=torch.bfloat16, batch=2, seed=0)
    dims = {"sequence": 16, **({"lora_rank": 8} if task == "lora" else {})}
    return hf_model.build(run, settings, task, False, EIGHT, **dims).model


def end_of(document, phase: str) -> int:
    row = next(r for r in document["prediction"]["phases"] if r["phase"] == phase)
    return row["allocated_bytes"]


def test_the_cuda_and_default_kernels_are_read_from_bitsandbytes_own_source():
    kernels = bnb_int8.read_kernels(torch)
    assert kernels is not None
    assert set(kernels) == set(bnb_int8.OPERATORS)


@pytest.mark.parametrize("task", ["inference", "lora"])
def test_a_model_loaded_in_8_bits_holds_what_the_real_load_holds(capsys, config, task):
    document = estimate(capsys, config, "--task", task, "--dtype", "bfloat16", "--load-in-8bit")
    assert document["workload"]["recipe"] == EIGHT
    assert "int8" in document["workload"]["parameters"]["by_dtype"]
    real = built_for_real(config, task)
    weights = [p for p in real.parameters() if type(p).__name__ == "Int8Params"]
    assert weights
    assert all(p.dtype == torch.int8 for p in weights)  # quantised for real
    assert end_of(document, "model_load") == held_blocks(real)


def test_the_8bit_load_is_smaller_than_in_bfloat16_by_half_the_linear_weights(capsys, config):
    plain = estimate(capsys, config, "--task", "inference", "--dtype", "bfloat16")
    eight = estimate(capsys, config, "--task", "inference", "--dtype", "bfloat16", "--load-in-8bit")
    settings = json.loads(config.read_text())
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**settings)
    )
    quantised = [  # what transformers converts: every Linear but the output head
        m for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name != "lm_head"
    ]  # fmt: skip
    halved = sum(m.weight.numel() for m in quantised)  # 2 bytes -> 1, plus float32 row scales
    scales = sum(m.weight.shape[0] * 4 for m in quantised)
    saved = end_of(plain, "model_load") - end_of(eight, "model_load")
    assert abs(saved - (halved - scales)) <= 512 * 2 * len(quantised)  # blocks' rounding


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """One layer wide enough that its outlier path outweighs the unknown calls' scratch."""
    settings = reduced("llama-3.2-1b", hidden_size=1024, intermediate_size=4096,
                       num_hidden_layers=1, head_dim=64, num_attention_heads=16)  # fmt: skip
    return written(tmp_path_factory.mktemp("int8-wide"), settings)


def cold_step_upper(capsys, config) -> tuple[dict, int]:
    document = estimate(
        capsys, config, "--task", "inference", "--dtype", "bfloat16", "--load-in-8bit",
        "--gpu", "h200",
    )  # fmt: skip
    rows = document["prediction"]["bounds"]["phases"]
    row = next(r for r in rows if r["phase"] == "cold_step")
    return document["prediction"], row["peak_allocated_bytes"]["upper"]


def test_until_a_gpu_has_checked_8bit_predictions_they_claim_no_bounds(capsys, config):
    document = estimate(
        capsys, config, "--task", "inference", "--dtype", "bfloat16", "--load-in-8bit",
        "--gpu", "h200",
    )  # fmt: skip
    prediction = document["prediction"]
    assert bnb_int8.CHECKED_ON_A_GPU is False  # flipped with the evidence of a GPU
    assert prediction["status"] == "approximate"
    assert "bounds" not in prediction
    assert bnb_int8.NOTE in prediction["unbounded"]


def test_an_8bit_estimate_is_never_exact_and_its_upper_bound_holds_every_outlier(
    capsys, wide, monkeypatch
):
    """Once checked on a GPU: the outlier columns are named; the most replay takes each
    product's outlier path with every column an outlier: its upper bound of the cold step's
    peak lies at least one layer's dequantised weight (float32) above the same replay
    without that path."""
    monkeypatch.setattr(bnb_int8, "CHECKED_ON_A_GPU", True)
    prediction, upper = cold_step_upper(capsys, wide)
    assert prediction["status"] == "approximate"
    unknown = {entry["op"]: entry for entry in prediction["unknown"]}
    assert bnb_int8.OUTLIERS in unknown
    assert trace_prediction.boundable(unknown[bnb_int8.OUTLIERS])
    monkeypatch.setattr(bnb_int8, "product_blocks", lambda A, CB: ())
    monkeypatch.setattr(bnb_int8, "search_blocks", lambda A: ())
    without, upper_without = cold_step_upper(capsys, wide)
    assert without["phases"] == prediction["phases"]  # the central figure takes none
    settings = json.loads(wide.read_text())
    widest = 4 * settings["hidden_size"] * settings["intermediate_size"]
    assert upper - upper_without >= widest


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--task", "training", "--load-in-8bit"], "--load-in-8bit with --task training:"),
        (["--task", "qlora", "--load-in-8bit"], "--load-in-8bit with --task qlora:"),
        (["--task", "inference", "--load-in-8bit", "--load-in-4bit"],
         "--load-in-8bit with --load-in-4bit:"),
    ],
)  # fmt: skip
def test_an_8bit_option_out_of_place_is_one_line_and_exit_2(capsys, config, options, said):
    code = own_model.main(["estimate", "--hf-config", str(config), *options])
    [line] = capsys.readouterr().err.splitlines()
    assert code == 2
    assert line.startswith(f"own_model.py: error: {said}"), line


def test_an_8bit_estimate_says_nothing_of_bitsandbytes_float16_cast(config):
    """Each 8-bit product of a bfloat16 input logs that it casts the input to float16,
    a layer a step: dropped (the cast is traced)."""
    from conftest import run_script

    result = run_script(
        "own_model.py", "estimate", "--hf-config", str(config), "--task", "generate",
        "--dtype", "bfloat16", "--batch", "2", "--dim", "sequence=16", "--load-in-8bit",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "MatMul8bitLt" not in result.stderr


def bounded_estimate(capsys, monkeypatch, *options: str) -> dict:
    """The GPU-free estimate's prediction (the H200's calibration) with its bounds, as it
    will say them once checked on a GPU: what these GPU tests check."""
    monkeypatch.setattr(bnb_int8, "CHECKED_ON_A_GPU", True)
    code = own_model.main(["estimate", *options, "--gpu", "h200", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    return json.loads(captured.out)["prediction"]


@pytest.mark.gpu
@pytest.mark.parametrize("task", ["generate", "lora"])
def test_an_8bit_model_measured_on_a_gpu_is_within_the_estimates_bounds(
    capsys, monkeypatch, tmp_path, config, task
):
    """Measured with the trace beside the GPU (honest), and the GPU-free estimate's bounds
    hold on every peak of every phase."""
    from test_gpu_own_model import honest, measured, outside_bounds

    options = ["--hf-config", str(config), "--task", task, "--dtype", "bfloat16",
               "--batch", "2", "--dim", "sequence=64", "--load-in-8bit"]  # fmt: skip
    prediction = bounded_estimate(capsys, monkeypatch, *options)
    document, _ = measured(tmp_path, *options)
    assert document["status"] == "completed"
    assert document["workload"]["recipe"] == EIGHT
    assert "int8" in document["workload"]["parameters"]["by_dtype"]
    honest(document)
    assert outside_bounds(prediction["bounds"], document) == []


OUTLIERS_WORKLOAD = """
import torch
import transformers


def infer(config, *, sequence=64):
    from own_model import Workload

    model = transformers.AutoModelForCausalLM.from_pretrained(
        {folder!r}, dtype=config.dtype, device_map=config.device,
        quantization_config=transformers.BitsAndBytesConfig(load_in_8bit=True),
    )
    with torch.no_grad():  # norms of 10: every normalised input has columns over 6.0
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.fill_(10.0)
    make_inputs = lambda: {{
        "input_ids": torch.randint(0, 512, (config.batch, sequence), device=config.device)
    }}
    return Workload(model.eval(), make_inputs)
"""


@pytest.mark.gpu
def test_a_model_whose_activations_have_outliers_stays_within_the_upper_bound(
    capsys, monkeypatch, tmp_path
):
    """Norms of 10 make most input columns of the attention and MLP products outliers: the
    GPU takes LLM.int8's outlier path, which the central figure leaves out (the measured peak
    lies above it) and the upper bound holds."""
    from test_from_pretrained import saved_llama
    from test_gpu_own_model import measured, outside_bounds

    saved_llama(tmp_path / "model", 1024, 4096, heads=16, kv_heads=4)
    path = tmp_path / "user.py"
    path.write_text(OUTLIERS_WORKLOAD.format(folder=str(tmp_path / "model")))
    options = ["--workload", f"{path}:infer", "--batch", "2", "--dtype", "bfloat16"]
    prediction = bounded_estimate(capsys, monkeypatch, *options)
    document, _ = measured(tmp_path, *options)
    cold = next(r for r in document["phases"] if r["phase"] == "cold_step")
    central = next(r for r in prediction["phases"] if r["phase"] == "cold_step")
    assert cold["peak_allocated_bytes"] > central["peak_allocated_bytes"]  # outliers taken
    assert outside_bounds(prediction["bounds"], document) == []
