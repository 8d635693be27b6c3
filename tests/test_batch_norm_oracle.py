"""The trace's batch norm against the H200's own record: which operators one BatchNorm2d
call makes there (by dtype, memory format and mode) and what cuDNN's batch norm allocates
(the allocator's history at ResNet-50's batch-norm shapes), probed on the GPU and committed
as evidence. The CPU trace, made for that GPU (`--gpu h200`), shares no code with the probe:
it must record the same operators, and its cuDNN calls the outputs the GPU allocated."""

from __future__ import annotations

import json

import pytest
from conftest import RUNS

torch = pytest.importorskip("torch")
from pipeline.predicting import attention_choice as ac  # noqa: E402
from pipeline.predicting import trace_prediction as tp  # noqa: E402

PROBE = json.loads((RUNS / "20261205T145800Z-h200-gpu-tests" / "bnprobe-output.txt").read_text())
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16)}
FORMATS = {str(f): f for f in (torch.contiguous_format, torch.channels_last)}
SHOWN = ("norm", "clone")  # the probe's operators that batch norm makes (no detach)


def traced(step) -> list:
    """The operator calls of `step` traced on the meta device for the H200."""

    def drive(phase):
        phase("step", step)

    trace = tp.run_trace(torch, "meta", drive, target=ac.H200)
    assert trace.stopped is None
    return [event[1] for event in trace.events if event[0] == "op"]


def operator_rows() -> list[dict]:
    return [row for row in PROBE["rows"] if row["probe"] == "ops"]


@pytest.mark.parametrize("row", operator_rows(), ids=lambda r: f"{r['dtype']}-{r.get('fmt', '')}"
                         f"-{r['mode']}-{r.get('eps', '')}".replace("torch.", ""))  # fmt: skip
def test_one_batch_norm_records_the_operators_the_gpu_records(row):
    """BatchNorm2d(64) on a (4, 64, 14, 14) input, as the probe ran it: in training (forward
    and backward), evaluated under no_grad, and under inference mode."""
    mixed = row["dtype"] == "float16 in, float32 weight"
    dtype = torch.float16 if mixed else DTYPES[row["dtype"].removeprefix("torch.")]
    memory_format = FORMATS.get(row.get("fmt"), torch.contiguous_format)
    eps = row.get("eps", 1e-5)

    def step():
        bn = torch.nn.BatchNorm2d(
            64, eps=eps, device="meta", dtype=torch.float32 if mixed else dtype
        )
        x = torch.randn(4, 64, 14, 14, device="meta", dtype=dtype).to(memory_format=memory_format)
        if row["mode"] == "train":
            bn.train()
            bn(x.requires_grad_()).sum().backward()
        elif row["mode"] == "no_grad":
            with torch.no_grad():
                bn.eval()(x)
        else:
            with torch.inference_mode():
                bn.eval()(x)

    names = [call.name for call in traced(step)]
    expected = [name for name in row["ops"] if any(word in name for word in SHOWN)]
    assert [name for name in names if any(word in name for word in SHOWN)] == expected


def cudnn_rows() -> list[dict]:
    return [row for row in PROBE["rows"] if row["probe"] == "cudnn"]


def allocations(events: list) -> list[int]:
    return [size for action, size in events if action == "alloc"]


@pytest.mark.parametrize("memory_format", sorted(FORMATS))
def test_cudnn_batch_norm_outputs_are_the_blocks_the_gpu_allocated(memory_format):
    """At each probed shape (batch 1, 16 and 64; 64 to 2,048 channels; float32 and float16 with
    float32 weights; both memory formats): the trace's cudnn_batch_norm in training allocates
    what the GPU's allocated first, the output and the float32 mean and inverse variance, its
    reserve nothing; its backward the three gradients. Beyond them the GPU took nothing for a
    contiguous input, and one block, freed in the call, for a channels-last one: scratch the
    trace cannot size, which leaves the call uncalibrated (approximate, with bounds)."""
    rows = [row for row in cudnn_rows() if row["fmt"] == memory_format]
    assert len(rows) == 72
    for row in rows:
        shape = (row["batch"], row["c"], row["side"], row["side"])
        dtype, layout = DTYPES[row["dtype"].removeprefix("torch.")], FORMATS[row["fmt"]]

        def step(shape=shape, dtype=dtype, layout=layout):
            bn = torch.nn.BatchNorm2d(shape[1], device="meta")
            x = torch.randn(shape, device="meta", dtype=dtype).to(memory_format=layout)
            bn(x.requires_grad_()).sum().backward()

        calls = {call.name: call for call in traced(step)}
        made = {
            name: [nbytes for *_, nbytes in calls[f"aten.{name}.default"].outputs if nbytes]
            for name in ("cudnn_batch_norm", "cudnn_batch_norm_backward")
        }
        train, backward = (
            allocations(row["train"]["events"]),
            allocations(row["backward"]["events"]),
        )
        extra = 0 if memory_format == str(torch.contiguous_format) else 1
        assert len(train) == 3 + extra, row
        assert len(backward) == 3 + extra, row
        assert made["cudnn_batch_norm"] == train[:3], row
        assert sorted(made["cudnn_batch_norm_backward"]) == sorted(backward[:3]), row
        assert row["train"]["outputs"][3][2] == 0  # the reserve: no block on the GPU either
