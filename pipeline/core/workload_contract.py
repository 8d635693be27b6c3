"""The contract between a workload and own_model.py: what the workload function receives
(Configuration) and returns (Workload), and the file it is read from (WorkloadFile). Below
own_model.py and hf_model.py, whose generated workloads return a Workload; own_model.py
re-exports every name, so a workload's `from own_model import Workload` stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Workload:
    """What a workload function returns.

    model: a torch.nn.Module whose parameters and buffers are all on `config.device`.
    make_inputs: make_inputs() returns the inputs, on `config.device`: a tensor, a tuple or
        list (the model's positional arguments) or a dict (its keyword arguments).
    step: without an optimizer, step(model, inputs) is the step timed instead of the default
        forward under torch.inference_mode(). With an optimizer, step(model, inputs) returns
        the loss (one value that requires grad) and the harness calls loss.backward() and
        optimizer.step() itself, so that the first optimizer step is a phase of its own.
        Either way the step returns what it computed (a tensor, or a tuple, list or dict
        holding tensors): the protocol reads each phase's end values with the result alive
        and frees it before the next phase. A step that returned nothing would have dropped
        its result inside (end values without it) or kept it somewhere (memory carried into
        every later phase): neither is the row the protocol defines, so it is refused.
    optimizer: a torch.optim.Optimizer over the model's parameters: a training step.
    micro_batches: a training step's micro-batches (gradient accumulation, the Trainer's
        gradient_accumulation_steps): each step runs step(model, inputs) and the backward of
        its loss divided by micro_batches that many times, the gradients summed, before one
        optimizer.step().
    scaler: a torch.amp.GradScaler for a training step (float16 mixed precision): the harness
        then runs scaler.scale(loss).backward() and scaler.step(optimizer), scaler.update()
        in place of loss.backward() and optimizer.step(), as the Trainer (through accelerate)
        does. A step the scaler skips (an inf or a NaN in the scaled gradients) is not the
        step measured: `measure` stops there and says so.
    """

    model: Any
    make_inputs: Callable[[], Any]
    step: Callable[[Any, Any], Any] | None = None
    optimizer: Any = None
    micro_batches: int = 1
    scaler: Any = None


@dataclasses.dataclass(frozen=True)
class Configuration:
    """What the workload function receives: put everything on `device`, in `dtype`."""

    device: Any  # torch.device; a fake one while the workload is traced
    dtype: Any  # torch.dtype
    batch: int
    seed: int


@dataclasses.dataclass
class WorkloadFile:
    path: Path
    function: str
    source: str
    sha256: str
    recipe: dict | None = None  # a --hf-config run's Trainer options (hf_model.Recipe)
