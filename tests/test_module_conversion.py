"""How a model reaches the device in a trace (module_conversion.py): a parameter shared by
several modules stays one where a GPU keeps it one, and nothing the trace builds holds real
host memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import runfixtures
import torch
from conftest import ROOT

from pipeline.core import torch_private
from pipeline.measuring import own_model
from pipeline.predicting import module_conversion
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

VOCAB, WIDTH = 1000, 512
EMBEDDING = VOCAB * WIDTH * 4  # float32


def estimate(capsys, tmp_path, function: str) -> dict:
    path = tmp_path / "tied.py"
    path.write_text(runfixtures.TIED_WORKLOAD, encoding="utf-8")
    argv = ["estimate", "--workload", f"{path}:{function}", "--batch", "2", "--json"]
    assert own_model.main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("function", ["moved", "moved_then_cast", "built_there"])
def test_a_tied_weight_is_one_parameter_however_the_model_reaches_the_device(
    capsys, tmp_path, function
):
    document = estimate(capsys, tmp_path, function)
    assert document["workload"]["parameters"]["bytes"] == EMBEDDING
    # model_load holds the one weight (the allocator's 2 MiB rounding of a 2,048,000 B block)
    load = document["prediction"]["phases"][0]
    assert load["phase"] == "model_load"
    assert load["allocated_bytes"] == 2048000


def test_moving_a_tied_model_allocates_as_building_it_on_the_device_does(capsys, tmp_path):
    """Every phase after the model's: the same counters, the tie's gradient and AdamW's
    state counted once."""
    moved = estimate(capsys, tmp_path, "moved")["prediction"]["phases"][1:]
    built = estimate(capsys, tmp_path, "built_there")["prediction"]["phases"][1:]
    keys = ("allocated_bytes", "peak_allocated_bytes")
    assert [[row[k] for k in keys] for row in moved] == [[row[k] for k in keys] for row in built]


@pytest.mark.parametrize("function", ["emptied", "emptied_untied"])
def test_to_empty_from_the_meta_device_is_named_without_a_gpu(capsys, tmp_path, function):
    """Without a GPU the meta device stands for the GPU: a model built there is counted from
    its build (an H100 held nothing until to_empty: 64 KiB less at model_load's peak for a
    small perceptron) and its tie kept; the prediction says so and claims nothing exact.
    Where a GPU is visible the trace runs beside it on the GPU's own fake device."""
    prediction = estimate(capsys, tmp_path, function)["prediction"]
    named = module_conversion.TO_EMPTY in [u["op"] for u in prediction["unknown"]]
    assert named is not torch.cuda.is_available()
    if named:
        assert prediction["status"] == PredictionStatus.APPROXIMATE


def test_parameters_made_from_host_tensors_are_fake_in_the_trace():
    made = []

    def drive(phase):
        def load():
            made.append(torch.nn.Parameter(torch.ones(4, 4)))
            return made[-1]

        phase("model_load", load)

    trace = tp.run_trace(torch, "meta", drive)
    assert trace.stopped is None
    assert isinstance(made[0], torch_private.FakeTensor)
    assert isinstance(made[0], torch.nn.Parameter)
    assert (made[0].device.type, made[0].shape) == ("cpu", (4, 4))


def test_the_trace_leaves_parameter_and_module_as_they_were():
    new, apply_, to_empty = (
        torch.nn.Parameter.__dict__["__new__"],
        torch.nn.Module._apply,
        torch.nn.Module.to_empty,
    )
    tp.run_trace(torch, "meta", lambda phase: phase("model_load", lambda: torch.nn.Linear(2, 2)))
    assert torch.nn.Parameter.__dict__["__new__"] is new
    assert torch.nn.Module._apply is apply_
    assert torch.nn.Module.to_empty is to_empty
    weight = torch.nn.Linear(2, 2).weight
    assert not isinstance(weight, torch_private.FakeTensor)
    assert type(weight) is torch.nn.Parameter


@pytest.mark.parametrize(
    ("old", "new", "target", "renewed"),
    [
        ("cpu", "cuda", "cuda", False),  # dense to dense: in place, a tie kept
        ("cuda", "cuda", "cuda", False),
        ("meta", "cuda", "cuda", True),  # to_empty from meta: a new Parameter, a tie broken
        ("cuda", "meta", "cuda", True),
        ("meta", "meta", "cuda", False),
        ("cpu", "meta", "meta", False),  # without a GPU, meta stands for the GPU
        ("meta", "meta", "meta", False),
    ],
)
def test_a_gpu_gives_a_new_parameter_where_the_tensor_types_are_not_compatible(
    old, new, target, renewed
):
    class At:
        def __init__(self, where):
            self.device = torch.device(where)

    assert module_conversion.new_parameter(At(old), At(new), torch.device(target)) is renewed


HOST_BUILT = """
import torch
from own_model import Workload


def embedding(config, *, rows=4):
    model = torch.nn.Embedding(rows, 2**10).to(device=config.device, dtype=config.dtype)
    return Workload(model, lambda: torch.zeros(config.batch, 4, dtype=torch.long,
                                               device=config.device))
"""


def resident_kib(path, rows: int) -> int:
    """The largest resident set of an estimate of `embedding` (one process), in KiB."""
    script = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    argv = [sys.executable, "-m", "pipeline.measuring.own_model", "estimate",
            "--workload", f"{path}:embedding", "--dim", f"rows={rows}", "--json"]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    return int(done.stdout)


def test_a_model_built_on_the_host_holds_no_host_memory_while_traced(tmp_path):
    """A 1 GiB model built on the CPU (2**18 x 2**10 float32) is traced in the resident
    memory of a 16 KiB one, give or take 128 MiB; it held its size more before parameters
    were made fake."""
    path = tmp_path / "big.py"
    path.write_text(HOST_BUILT, encoding="utf-8")
    small, big = resident_kib(path, 4), resident_kib(path, 2**18)
    assert big - small < 128 * 1024, f"{big - small} KiB more for the 1 GiB model"
