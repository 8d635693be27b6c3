"""The trace a workload leaves: its events in order, each operator call (`OpCall`) and
what a probe needs to make the call again (`Signature`), and `TraceStopped`, raised where the
trace cannot follow the code.

Standard library only: torch is never imported here."""

from __future__ import annotations

import dataclasses
import hashlib

CALLER, AUTOGRAD = "caller", "autograd"  # the thread that ran an operator (see Recorder.role)


class TraceStopped(Exception):
    """The trace cannot follow the code: the prediction is 'not predicted', with this reason."""


@dataclasses.dataclass
class OpCall:
    name: str  # "aten.addmm.default"
    role: str  # CALLER or AUTOGRAD
    signature: str  # what a probe needs to recreate the call, hashed
    outputs: tuple  # ((flat output index, storage id, bytes), ...) of the new device storages
    reuses: int | None = None  # a real run writes the output into this storage's block


@dataclasses.dataclass
class Signature:
    name: str
    func: object  # the OpOverload, to probe it
    leaves: list  # the call's arguments, tensors described (see describe())
    spec: object  # their tree structure
    calls: int = 0
    view: bool = False


@dataclasses.dataclass
class Trace:
    device: str  # "cuda:0", or "meta" where no GPU is visible
    build: str  # the PyTorch traced with: "cuda" or "cpu-only"
    torch_version: str
    events: list = dataclasses.field(default_factory=list)
    signatures: dict = dataclasses.field(default_factory=dict)
    notes: dict = dataclasses.field(default_factory=dict)  # op name -> why it is unknown
    stopped: str | None = None
    checks_passing: int = 0  # inside a function whose value checks are taken as passed

    @property
    def operator_calls(self) -> int:
        return sum(1 for event in self.events if event[0] == "op")


def packet(name: str) -> str:
    """'aten.addmm.default' -> 'aten.addmm': the operator without its overload."""
    return name.rsplit(".", 1)[0]


def signature_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
