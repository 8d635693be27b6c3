"""A Trainer's options on `own_model.py estimate --hf-config` (hf_model.Recipe): `--optim` as
TrainingArguments names the optimizer, `--gradient-accumulation-steps`, `--bf16`, traced
without a GPU on a published config reduced to two layers. Their figures are the optimizers'
and the accumulation's own memory rules, from PyTorch's and transformers' source."""

from __future__ import annotations

import importlib.util
import json

import pytest
from test_hf_model import estimate, reduced, written

from pipeline.core import allocator_model
from pipeline.measuring import own_model
from pipeline.stages import sweep

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from pipeline.predicting import autocast_policy  # noqa: E402
from pipeline.workloads import hf_model  # noqa: E402

# refused without bitsandbytes by the Trainer, with it by the lab (test_bnb_optimizers.py)
PAGED = (
    "bitsandbytes.optim.adamw.AdamW is not modelled"
    if importlib.util.find_spec("bitsandbytes")
    else "You need to install `bitsandbytes`"
)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return written(tmp_path_factory.mktemp("recipe"), reduced("llama-3.2-1b"))


def training(capsys, config, *options):
    return estimate(capsys, config, "--task", "training", "--dtype", "float32", *options)


def growth(document, phase="optimizer_state"):
    row = next(r for r in document["prediction"]["phases"] if r["phase"] == phase)
    return row["allocated_bytes"] - row["baseline_allocated_bytes"]


@pytest.fixture(scope="module")
def parameters(config):
    """The reduced model's parameter tensors and bytes, counted on the meta device."""
    settings = transformers.AutoConfig.for_model(**json.loads(config.read_text()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(settings, dtype=torch.float32)
    sizes = [p.numel() * 4 for p in model.parameters()]
    return sizes


def blocks(sizes) -> int:
    """What the caching allocator hands out for tensors of these sizes, one block each."""
    return sum(allocator_model.block_bytes(n) for n in sizes)


def test_the_trainers_optimizers_hold_their_own_state(capsys, config, parameters):
    """AdamW keeps two float32 moments a value; its fused kernel (the Trainer's default,
    adamw_torch_fused) also keeps each parameter's step count on the device, one 512-byte
    block each, where the foreach one keeps it on the CPU (torch/optim/adam.py, _init_group);
    SGD without momentum keeps nothing; Adafactor factors its second moment of a matrix into
    a row and a column."""
    count, nbytes = len(parameters), sum(parameters)
    adamw = training(capsys, config, "--optim", "adamw_torch")
    fused = training(capsys, config, "--optim", "adamw_torch_fused")
    sgd = training(capsys, config, "--optim", "sgd")
    adafactor = training(capsys, config, "--optim", "adafactor")
    assert [d["workload"]["optimizer"] for d in (adamw, fused, sgd, adafactor)] == [
        "AdamW", "AdamW", "SGD", "Adafactor"
    ]  # fmt: skip
    assert fused["workload"]["recipe"] == {"optim": "adamw_torch_fused"}
    assert growth(adamw) == 2 * blocks(parameters)
    assert growth(fused) - growth(adamw) == 512 * count
    assert growth(sgd) == 0
    assert 0 < growth(adafactor) < nbytes / 10


def test_the_trainers_optimizer_keeps_its_two_parameter_groups():
    """Trainer.create_optimizer's own groups: weight decay for the matrices, none for
    biases and norms; a foreach or fused optimizer runs one kernel sequence per group."""
    settings = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(settings)
    optimizer = hf_model.trainer_optimizer(model, "adamw_torch_fused")
    names = {id(p): n for n, p in model.named_parameters()}
    decay, plain = ([names[id(p)] for p in g["params"]] for g in optimizer.param_groups)
    assert all("norm" not in n for n in decay)
    assert all("norm" in n for n in plain)
    assert len(decay) + len(plain) == len(list(model.parameters()))
    assert optimizer.defaults["fused"] is True


def test_the_default_optimizer_is_unchanged_and_adamw_torch_adds_the_groups(capsys, config):
    plain = training(capsys, config)
    adamw = training(capsys, config, "--optim", "adamw_torch")
    assert "recipe" not in plain["workload"]
    assert plain["workload"]["micro_batches"] == 1
    assert growth(plain) == growth(adamw)  # the same state; the groups change the scratch
    peak = lambda d: d["prediction"]["phases"][3]["peak_allocated_bytes"]  # noqa: E731
    assert peak(plain) != peak(adamw)


def test_gradient_accumulation_holds_the_gradients_across_micro_batches(capsys, config, parameters):
    """The second micro-batch runs with the first one's gradients held (autograd adds the new
    ones into them, torch/csrc/autograd/functions/accumulate_grad.h): its peak is higher than
    one micro-batch's; a third repeats the second; the step ends with the same blocks."""
    nbytes = sum(parameters)
    one = training(capsys, config)
    two = training(capsys, config, "--gradient-accumulation-steps", "2")
    three = training(capsys, config, "--gradient-accumulation-steps", "3")
    assert (two["workload"]["micro_batches"], three["workload"]["micro_batches"]) == (2, 3)
    assert two["workload"]["recipe"] == {"gradient_accumulation_steps": 2}
    cold = lambda d, key: d["prediction"]["phases"][2][key]  # noqa: E731
    ends = {cold(d, "allocated_bytes") for d in (one, two, three)}
    assert len(ends) == 1
    assert cold(two, "peak_allocated_bytes") - cold(one, "peak_allocated_bytes") >= nbytes / 2
    assert cold(two, "peak_allocated_bytes") == cold(three, "peak_allocated_bytes")


def test_bf16_keeps_the_weights_in_the_runs_dtype_and_casts_as_the_gpu(capsys, config, parameters):
    """The Trainer's mixed precision: float32 weights, gradients and AdamW state; the forward
    under CUDA autocast (autocast_policy.py), whose bfloat16 activations make the cold
    step's peak lower than float32's; predicted with figures, not noted away."""
    nbytes = sum(parameters)
    plain = training(capsys, config, "--gpu", "h200")
    document = training(capsys, config, "--bf16", "--gpu", "h200")
    assert document["workload"]["recipe"] == {"bf16": True}
    assert document["workload"]["parameters"]["by_dtype"] == {
        "float32": {"count": nbytes // 4, "bytes": nbytes}
    }
    assert growth(document) == growth(plain)  # AdamW's state: float32, as the weights
    cold = lambda d: d["prediction"]["phases"][2]["peak_allocated_bytes"]  # noqa: E731
    assert cold(document) < cold(plain)
    # the emulation checked on a GPU: no note, the calibration's coverage decides
    assert autocast_policy.NOTE not in [u["op"] for u in document["prediction"]["unknown"]]


def test_fp16_scales_the_loss_and_holds_the_scalers_two_values(capsys, config):
    """The Trainer's fp16=True: as bf16=True, the forward under float16 autocast, and the
    loss scaled by a CUDA GradScaler (grad_scaler.py): its scale and growth tracker,
    0-dimensional, one 512-byte block each from the first scale() to the end of the run;
    its step taken, so AdamW makes the same state."""
    bf16 = training(capsys, config, "--bf16", "--gpu", "h200")
    fp16 = training(capsys, config, "--fp16", "--gpu", "h200")
    assert fp16["workload"]["recipe"] == {"fp16": True}
    assert fp16["workload"]["grad_scaler"] is True
    assert "grad_scaler" not in bf16["workload"]
    assert growth(fp16) == growth(bf16)
    ends = [
        (f["phase"], f["allocated_bytes"] - b["allocated_bytes"])
        for f, b in zip(fp16["prediction"]["phases"], bf16["prediction"]["phases"], strict=True)
    ]
    assert ends[:2] == [("model_load", 0), ("inputs", 0)]
    assert all(extra == 2 * 512 for _, extra in ends[2:]), ends


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["training", "--optim", "adamw_nonsense"],
         "--optim adamw_nonsense: not one of TrainingArguments' optim names"),
        (["training", "--optim", "paged_adamw_32bit"], f"--optim paged_adamw_32bit: {PAGED}"),
        (["training", "--optim", "lomo"], "--optim lomo:"),
        (["inference", "--optim", "sgd"],
         "--optim: a Trainer's options, for --task training, lora or qlora"),
        (["generate", "--bf16", "--gradient-accumulation-steps", "2"],
         "--gradient-accumulation-steps, --bf16: a Trainer's options"),
        (["training", "--fp16", "--dtype", "float16"],
         "--fp16 with --dtype float16: GradScaler refuses to unscale float16 gradients"),
        (["generate", "--fp16"], "--fp16: a Trainer's options, for --task training"),
        (["training", "--fp16", "--bf16"], "not allowed with argument"),
    ],
)  # fmt: skip
def test_a_recipe_the_lab_does_not_run_is_refused_in_one_line(
    capsys, config, tmp_path, options, said
):
    out = tmp_path / "m.json"
    argv = ["measure", "--device", "cuda:0", "--output", str(out), "--hf-config", str(config)]
    assert own_model.main([*argv, "--task", *options]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert said in err
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-1", "1025", "two"])
def test_accumulation_steps_out_of_range_are_refused(capsys, config, value):
    argv = ["estimate", "--hf-config", str(config), "--task", "training"]
    assert own_model.main([*argv, "--gradient-accumulation-steps", value]) == 2
    assert "--gradient-accumulation-steps" in capsys.readouterr().err


def test_a_workload_file_sets_its_own_recipe(capsys, tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(config):\n    pass\n")
    assert own_model.main(["estimate", "--workload", f"{path}:f", "--optim", "sgd"]) == 2
    assert "Workload.micro_batches" in capsys.readouterr().err


def test_a_workloads_micro_batches_are_checked(capsys, tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import torch\nfrom own_model import Workload\n\n"
        "def f(config):\n"
        "    model = torch.nn.Linear(4, 4).to(config.device)\n"
        "    inputs = lambda: torch.ones(2, 4, device=config.device)\n"
        "    return Workload(model, inputs, micro_batches=2)\n"
    )
    assert own_model.main(["estimate", "--workload", f"{path}:f"]) == 2
    assert "gradient accumulation goes with a training workload" in capsys.readouterr().err


def test_a_sweep_passes_the_recipe_to_every_point(config):
    """Each point of `sweep --hf-config` is its own `own_model.py measure`: the recipe goes
    with its flags."""
    argv = ["--device", "cuda:0", "--hf-config", str(config),
            "--task", "training", "--optim", "sgd", "--gradient-accumulation-steps", "4",
            "--bf16", "--vary", "batch", "--start", "1", "--max-steps", "2"]  # fmt: skip
    args = sweep.parse(argv)
    base = {"batch": 1, "dtype": "float32", "warmup": 1, "repeats": 1, "seed": 0,
            "dimensions": []}  # fmt: skip
    flags = sweep.own_flags(base, args)
    assert flags[flags.index("--optim") :][:5] == [
        "--optim", "sgd", "--gradient-accumulation-steps", "4", "--bf16"
    ]  # fmt: skip


def test_the_fused_adamw_kernel_allocates_nothing_and_is_covered_for_the_h200(capsys, config):
    """fused_optimizers.py: `_fused_adamw_` asks the allocator for nothing (its metadata goes
    to the kernel by value), so a fused step is as covered as the foreach one: the same
    status, and no unknown entry for the kernel."""
    foreach = training(capsys, config, "--optim", "adamw_torch", "--gpu", "h200")
    fused = training(capsys, config, "--optim", "adamw_torch_fused", "--gpu", "h200")
    unknown = [entry["op"] for entry in fused["prediction"]["unknown"]]
    assert not [op for op in unknown if "fused_adamw" in op]
    assert fused["prediction"]["status"] == foreach["prediction"]["status"]
