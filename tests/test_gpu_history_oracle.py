"""The trace against a GPU's own record: the CUDA caching allocator's history of real runs
on the H200, committed as evidence, is an oracle the trace shares no code with. The trace
made here on the CPU must ask for the blocks those runs asked for: Pythia-160M inference
(bfloat16, batch 2 x 2,000 tokens) in the same order, step for step; ViT-base training
(float32, batch 8) the same requests over the whole run.

This is the test that found an eval model's dropout cloning its input in the trace (the
Python decomposition of aten.dropout) where ATen returns the input itself: the trace said
"exact" and the run kept 589,824 B more."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import ROOT, RUNS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from pipeline.measuring import own_model  # noqa: E402
from pipeline.predicting import attention_choice, gpu_calibration  # noqa: E402
from pipeline.predicting import trace_prediction as tp  # noqa: E402

HISTORY = RUNS / "20261204T142700Z-h200-pythia-history" / "allocator-history.json"
CONFIG = ROOT / "tests" / "data" / "hf-configs" / "pythia-160m.json"


def canonical(steps: list[tuple[str, int]]) -> list[tuple]:
    """Allocations in order; each run of frees between two allocations as one sorted group
    (frees that no allocation separates leave the same free blocks whatever their order)."""
    out: list[tuple] = []
    frees: list[int] = []
    for kind, nbytes in steps:
        if kind == "free":
            frees.append(nbytes)
            continue
        if frees:
            out.append(("frees", tuple(sorted(frees))))
            frees = []
        out.append(("alloc", nbytes))
    if frees:
        out.append(("frees", tuple(sorted(frees))))
    return out


def real_steps() -> list[tuple[str, int]]:
    events = json.loads(HISTORY.read_text())["events"]
    kinds = {"alloc": "alloc", "free_completed": "free"}
    return [(kinds[e["action"]], e["size"]) for e in events if e["action"] in kinds]


def traced_warm_step() -> list[tuple[str, int]]:
    """The trace's last warm step, as the H200 would run it, replayed with the H200's
    calibration (each kernel's own blocks in the order its probe saw them)."""
    argv = ["estimate", "--hf-config", str(CONFIG), "--task", "inference", "--batch", "2",
            "--dim", "sequence=2000", "--dtype", "bfloat16", "--gpu", "h200"]  # fmt: skip
    setting = own_model.setting_from(own_model.build_parser().parse_args(argv))
    own_model.load(setting)
    trace, _, failure = own_model.trace_workload(torch, setting, 0, attention_choice.H200)
    assert failure is None
    log = tp.replay(trace, gpu_calibration.load("h200")[0])[1]
    last = max(i for i, (kind, _, name) in enumerate(log) if kind == "phase")
    assert log[last][2] == "warm_step"
    return [(kind, nbytes) for kind, nbytes, _ in log[last + 1 :] if nbytes]


def test_the_traced_warm_step_asks_for_the_blocks_the_h200_run_asked_for():
    traced = canonical(traced_warm_step())
    # the frees that end the step join, in the real run, those of the step before's outputs
    # (its cache and logits, replaced by the next step's): a boundary, not a block
    if traced[-1][0] == "frees":
        traced = traced[:-1]
    real = canonical(real_steps())
    assert len(traced) > 500  # a whole forward of 12 layers
    starts = [i for i in range(len(real) - len(traced) + 1) if real[i : i + len(traced)] == traced]
    # the real run made three such steps (the warm-up and two warm steps) after the cold one
    assert len(starts) >= 3, "the trace's warm step is not a step of the real run"


VIT_HISTORY = RUNS / "20261204T194000Z-h200-vit-history" / "allocator-history.json"
VIT_CONFIG = ROOT / "tests" / "data" / "hf-configs" / "vit-base-patch16-224-in21k.json"


def test_a_vit_training_run_asks_the_h200_for_the_blocks_the_trace_asks_for():
    """ViT-base float32 training at batch 8, the whole run (load, inputs, cold step, warm-up,
    two warm steps): every request, by size, as the H200's allocator recorded it, the
    convolution backward's cuDNN blocks among them (probed at this batch since:
    runs/20261204T200500Z-h200-probe-sweep-gaps/). This is the test that found the
    memory-efficient attention's seed and offset traced as two 8-byte device tensors a
    layer, kept for backward (12,288 B of peak allocated): the kernel makes them on the
    host, with dropout or without."""
    argv = ["estimate", "--hf-config", str(VIT_CONFIG), "--task", "training", "--batch", "8",
            "--dtype", "float32", "--gpu", "h200"]  # fmt: skip
    setting = own_model.setting_from(own_model.build_parser().parse_args(argv))
    own_model.load(setting)
    trace, _, failure = own_model.trace_workload(torch, setting, 0, attention_choice.H200)
    assert failure is None
    log = tp.replay(trace, gpu_calibration.load("h200")[0])[1]
    traced = Counter(nbytes for kind, nbytes, _ in log if kind == "alloc" and nbytes)
    events = json.loads(VIT_HISTORY.read_text())["events"]
    real = Counter(e["size"] for e in events if e["action"] == "alloc")
    assert traced - real == Counter()
    assert real - traced == Counter()
