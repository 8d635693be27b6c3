"""The calibration: what each operator call allocates besides its outputs on a GPU
(`Calibration`), worked out by running each distinct call of a trace once more with the
allocator's history recorded (`probe_operators`), and the history's reading (templates,
the order of segments, the workspaces kept per thread).

Standard library at module level: torch is imported by the functions that need it."""

from __future__ import annotations

import dataclasses
import itertools
import re

from pipeline.core import call_keys, torch_private
from pipeline.predicting import (
    bnb_kernels,
    cublas_operands,
    cudnn_rnn,
    fused_cells,
    fused_optimizers,
    kernel_formulas,
    reduce_scratch,
)
from pipeline.predicting.trace.model import Signature, Trace
from pipeline.predicting.trace.operators import (
    BY_SOURCE,
    CUMSUM,
    EMBEDDING_BACKWARD,
    NOT_PROBED_PREFIX,
    by_source_template,
    call_arguments,
    cumsum_template,
    embedding_backward_template,
)

# A dtype in a call's form (call_keys.form): float16 as a word, not inside bfloat16; and
# the dtypes whose agreeing patterns a float16 product borrows (Calibration.borrowed).
FLOAT16 = re.compile(r"(?<![a-z])float16\b")
DONORS = ("bfloat16", "float32")


@dataclasses.dataclass
class Calibration:
    """What each operator call allocates besides its outputs, in allocation order:
    ("output", flat index, bytes), ("internal", id, bytes), ("free", id) and
    ("persistent", bytes) for blocks it keeps (library workspaces)."""

    templates: dict = dataclasses.field(default_factory=dict)  # signature -> template
    output_only: set = dataclasses.field(default_factory=set)  # probed: outputs only, in order
    failed: dict = dataclasses.field(default_factory=dict)  # signature -> why
    workspaces_per_thread: bool | None = None
    source: str = "this process"
    # call_keys.form(...) -> template whose outputs take the call's own sizes (None)
    patterns: dict = dataclasses.field(default_factory=dict)
    # call_keys.rule_key(...) -> (template, the sizes it holds within)
    shape_rules: dict = dataclasses.field(default_factory=dict)
    # call_keys.rule_key(..., integers=False) -> ({number of blocks: template without
    # sizes}, domain): the blocks' sizes come from kernel_formulas, the outputs' from the call
    formula_rules: dict = dataclasses.field(default_factory=dict)
    # the GPU whose reduction kernel's scratch reduce_scratch works out (None: not known)
    reduce_device: reduce_scratch.Device | None = None
    # signature -> template, as `template` worked it out (a cache, not part of the value)
    resolved: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def known(self, signature: str, call: Signature | None = None) -> bool:
        return (
            signature in self.templates
            or signature in self.output_only
            or self.pattern(call) is not None
            or self.rule(call) is not None
            or self.reduction(call) is not None
        )

    def template(self, signature: str, call: Signature | None) -> list | None:
        """None: outputs only. Worked out once per signature: a prediction replays its trace
        a dozen times (other segment orders, bounds), and a rule's lookup is not free."""
        if signature not in self.resolved:
            self.resolved[signature] = self._template(signature, call)
        return self.resolved[signature]

    def _template(self, signature: str, call: Signature | None) -> list | None:
        """The first that knows the call: its probe, its pattern, a shape rule, a reduction's
        formula, a float16 product's borrowed pattern."""
        found = self.templates.get(signature)
        for lookup in (self.pattern, self.rule, self.reduction, self.fused_cell, self.borrowed):
            if found is not None:
                break
            found = lookup(call)
        return found or None

    def fused_cell(self, call: Signature | None) -> list | None:
        """A fused LSTM/GRU cell call's template, read from PyTorch's source (fused_cells):
        known where fused_cells.CLAIMED, else the central figure's only (the call uncovered)."""
        if call is None or call.name not in fused_cells.OPERATORS or call.spec is None:
            return None
        if self.reduce_device is None:
            return None
        arguments = call_arguments(call)
        return fused_cells.by_source_template(call.name, arguments, self.reduce_device)

    def borrowed(self, call: Signature | None) -> list | None:
        """A float16 matrix product that no probe ran: the pattern its form has in bfloat16
        and in float32, where both were probed and are the same. PyTorch keeps cuBLAS's and
        cuBLASLt's workspaces per (handle, stream) pair (CublasHandlePool.cpp), made by the
        first product on it whatever its dtype, and these patterns hold nothing else. Not
        `known`: the call stays uncovered (BORROWED), its least replay without the
        workspaces, its most with WORKSPACE_BOUND."""
        if call is None or not self.patterns:
            return None
        form = call_keys.form(call.name, call.leaves)
        if FLOAT16.search(form) is None or self.patterns.get(form) is not None:
            return None
        bf16, fp32 = (self.patterns.get(FLOAT16.sub(dtype, form)) for dtype in DONORS)
        return self.with_operand_copies(call, bf16) if bf16 is not None and bf16 == fp32 else None

    def reduction(self, call: Signature | None) -> list | None:
        """A call's blocks by PyTorch's own code, on this GPU: a reduction by its kernel's
        arithmetic (reduce_scratch), an embedding's backward over few indices, a scan."""
        if call is None or self.reduce_device is None or call.spec is None or call.func is None:
            return None
        if call.name == EMBEDDING_BACKWARD:
            return embedding_backward_template(call_arguments(call))
        if call.name == CUMSUM:
            return cumsum_template(call_arguments(call))
        if call.name in BY_SOURCE:
            return by_source_template(call.name, call_arguments(call), list(call.leaves))
        if call.name in fused_cells.OPERATORS:
            return self.fused_cell(call) if fused_cells.CLAIMED else None
        if call.name in fused_optimizers.OPERATORS:
            return fused_optimizers.template(call.name)
        if call.name in bnb_kernels.OPERATORS:
            return bnb_kernels.template(call.name)
        found = reduce_scratch.template_of_call(call.name, call_arguments(call), self.reduce_device)
        return None if found is None else [template_step(step) for step in found]

    def rule(self, call: Signature | None) -> list | None:
        """The template of the shape rule that covers this call (call_keys), or None."""
        if call is None:
            return None
        found = self.shape_rules.get(call_keys.rule_key(call.name, call.leaves))
        if found is not None and call_keys.within(found[1], call.leaves):
            return found[0]
        return self.formula_rule(call)

    def formula_rule(self, call: Signature) -> list | None:
        found = self.formula_rules.get(call_keys.rule_key(call.name, call.leaves, False))
        if found is None or not call_keys.within(found[1], call.leaves):
            return None
        sizes = kernel_formulas.internal_sizes(call.name, list(call.leaves))
        steps = None if sizes is None else found[0].get(len(sizes))
        if steps is None:
            return None
        fill = iter(sizes)
        return [(kind, index, next(fill)) if kind == "internal" else (kind, index, *rest)
                for kind, index, *rest in steps]  # fmt: skip

    def pattern(self, call: Signature | None) -> list | None:
        """A matrix product's pattern, with the copies of operands cuBLAS cannot read where
        they lie (cublas_operands); None where those are not known."""
        if call is None or not self.patterns:
            return None
        found = self.patterns.get(call_keys.form(call.name, call.leaves))
        return self.with_operand_copies(call, found)

    def with_operand_copies(self, call: Signature, found: list | None) -> list | None:
        if found is None:
            return None
        if call.spec is not None and call.func is not None:
            arguments = call_arguments(call)
        else:  # a signature without its call's structure: the leaves in the schema's order
            names = cublas_operands.POSITIONS.get(call.name, ())
            arguments = dict(zip(names, call.leaves, strict=False))
        made = cublas_operands.copies(call.name, arguments)
        return None if made is None else cublas_operands.with_copies(found, made)

    def to_json(self, trace: Trace | None = None) -> dict:
        names = trace.signatures if trace is not None else {}

        def op(key):
            return names[key].name if key in names else None

        return {
            "method": (
                "after the phases, in the same process: each distinct operator call of the "
                "trace (its shapes, strides and arguments), foreach kernels excepted, run "
                "once on fresh tensors after torch._C._cuda_clearCublasWorkspaces(), with "
                "torch.cuda.memory._record_memory_history; what it allocated besides its "
                "outputs, in order, and what it kept"
            ),
            "operators": [
                {
                    "op": op(key),
                    "signature": key,
                    "template": [template_entry(step) for step in template],
                }
                for key, template in sorted(self.templates.items())
            ],
            "output_only": sorted(self.output_only),
            "failed": [
                {"op": op(key), "signature": key, "error": why}
                for key, why in sorted(self.failed.items())
            ],
            "workspaces_per_thread": self.workspaces_per_thread,
        }

    @classmethod
    def from_json(cls, document: dict, source: str) -> Calibration:
        section = document["calibration"]
        templates = {
            entry["signature"]: [template_step(step) for step in entry["template"]]
            for entry in section["operators"]
        }
        return cls(
            templates=templates,
            output_only=set(section["output_only"]),
            failed={entry["signature"]: entry["error"] for entry in section["failed"]},
            workspaces_per_thread=section["workspaces_per_thread"],
            source=source,
        )


def template_entry(step: tuple) -> dict:
    kind = step[0]
    if kind == "output":
        return {"kind": kind, "index": step[1], "bytes": step[2]}
    if kind == "internal":
        return {"kind": kind, "id": step[1], "bytes": step[2]}
    if kind == "free":
        return {"kind": kind, "id": step[1]}
    return {"kind": kind, "bytes": step[1]}


def template_step(entry: dict) -> tuple:
    kind = entry["kind"]
    if kind == "output":
        return (kind, entry["index"], entry["bytes"])
    if kind == "internal":
        return (kind, entry["id"], entry["bytes"])
    if kind == "free":
        return (kind, entry["id"])
    return (kind, entry["bytes"])


def template_from_history(events: list[dict], outputs: dict[int, int]) -> list[tuple]:
    """One probe's allocator history -> its template. outputs: data pointer -> flat index.
    An output's block is the last one allocated at its address (a scratch block freed
    earlier may have had the same address)."""
    last_at = {}
    for position, event in enumerate(events):
        if event["action"] == "alloc" and event["addr"] in outputs:
            last_at[event["addr"]] = position
    template: list[tuple] = []
    internal: dict[int, int] = {}  # address -> id while allocated
    ids = itertools.count()
    for position, event in enumerate(events):
        action, address = event["action"], event["addr"]
        if action == "alloc" and last_at.get(address) == position:
            template.append(("output", outputs[address], event["size"]))
        elif action == "alloc":
            internal[address] = next(ids)
            template.append(("internal", internal[address], event["size"]))
        elif action == "free_completed" and address in internal:
            template.append(("free", internal.pop(address)))
    kept = set(internal.values())
    return [
        ("persistent", step[2]) if step[0] == "internal" and step[1] in kept else step
        for step in template
    ]


def plain(template: list[tuple]) -> bool:
    """Outputs only, in the order the operator returns them."""
    indexes = [step[1] for step in template if step[0] == "output"]
    return all(step[0] == "output" for step in template) and indexes == sorted(indexes)


def probe_operators(torch, device, trace: Trace) -> Calibration:
    """Run each distinct operator call of the trace once on the GPU (see the module's
    docstring). A probe that fails leaves its operator uncalibrated, with the reason."""
    calibration = Calibration()
    calibration.workspaces_per_thread = probe_workspace_threads(torch, device)
    for key, signature in trace.signatures.items():
        if signature.view or signature.name.startswith(NOT_PROBED_PREFIX):
            continue
        try:
            template = probe(torch, device, signature)
        except torch.cuda.OutOfMemoryError:
            calibration.failed[key] = "out of memory while probing"
        except Exception as exc:  # an operator the probe cannot recreate or run alone
            first = (str(exc).strip().splitlines() or [""])[0][:160]  # its first line, said
            why = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            calibration.failed[key] = f"probe failed ({why})"
        else:
            if plain(template):
                calibration.output_only.add(key)
            else:
                calibration.templates[key] = template
        finally:
            stop_history(torch)
    return calibration


def probe(torch, device, signature: Signature) -> list[tuple]:
    args, kwargs = torch_private.tree_unflatten(
        [rebuild(torch, device, leaf) for leaf in signature.leaves], signature.spec
    )
    args = cudnn_rnn.probe_arguments(torch, signature.name, args)
    clear = torch_private.cublas_workspace_clearer(torch)
    torch.cuda.synchronize(device)
    if clear is not None:
        clear()
    start_history(torch)
    before = len(history_events(torch, device))
    with torch.no_grad():
        out = signature.func(*args, **kwargs)
    torch.cuda.synchronize(device)
    events = history_events(torch, device)[before:]
    stop_history(torch)
    outputs = {}
    for index, tensor in enumerate(torch_private.tree_flatten(out)[0]):
        if isinstance(tensor, torch.Tensor) and tensor.device == device:
            outputs.setdefault(tensor.untyped_storage().data_ptr(), index)
    return template_from_history(events, outputs)


def rebuild(torch, device, leaf):
    if not isinstance(leaf, tuple):
        return leaf
    kind = leaf[0]
    if kind == "tensor":
        _, dtype, shape, stride, offset, nbytes, where = leaf
        dtype = getattr(torch, dtype)
        place = device if where == "device" else torch.device(where)
        size = torch.empty(0, dtype=dtype).element_size()
        base = torch.zeros(-(-nbytes // size), dtype=dtype, device=place)
        return base.as_strided(shape, stride, offset)
    if kind == "device":
        return device if leaf[1] == "device" else torch.device(leaf[1])
    if kind == "dtype":
        return getattr(torch, leaf[1])
    if kind == "enum":
        return getattr(torch, leaf[1])
    raise ValueError(f"cannot recreate a {leaf[1]} argument")


HISTORY_ENTRIES = 1_000_000  # events the allocator keeps; past them it drops the oldest


def start_history(torch, stacks: bool = False) -> None:
    """The allocator's history of allocations and frees, without stack traces; with
    `stacks`, each allocation's C++ and Python frames (history_check names the C++ function
    of the first difference from them)."""
    context = {"context": "alloc", "stacks": "all"} if stacks else {"context": None}
    try:
        torch_private.record_memory_history(
            torch, enabled="all", max_entries=HISTORY_ENTRIES, clear_history=True, **context
        )
    except TypeError:  # a PyTorch without clear_history: callers count the events before
        torch_private.record_memory_history(torch, enabled="all", **context)


def stop_history(torch) -> None:
    torch_private.stop_memory_history(torch)


def segment_ranks(events: list[dict]):
    """From an allocator history (`device_traces[i]`): the rank of the n-th segment created
    by the driver's own addresses, for replay(segment_rank=...). A replay under it checks
    that the address order, and nothing else, is what a prediction missed."""
    addresses = [event["addr"] for event in events if event["action"] == "segment_alloc"]
    order = {address: rank for rank, address in enumerate(sorted(addresses))}
    return lambda n: order[addresses[n]] if n < len(addresses) else n  # more: above them


def history_events(torch, device) -> list[dict]:
    return torch_private.memory_snapshot(torch)["device_traces"][device.index]


def probe_workspace_threads(torch, device) -> bool | None:
    """Does autograd's thread keep library workspaces of its own? A matrix product in the
    caller's thread, then one in backward, after the workspaces were cleared: kept blocks
    that backward added, other than the gradient, say yes."""
    clear = torch_private.cublas_workspace_clearer(torch)
    if clear is None:
        return None
    try:
        a = torch.ones(64, 64, device=device, requires_grad=True)
        b = torch.ones(64, 64, device=device)
        torch.cuda.synchronize(device)
        clear()
        start_history(torch)
        start = len(history_events(torch, device))
        y = a @ b
        torch.cuda.synchronize(device)
        forward = len(history_events(torch, device))
        y.sum().backward()
        torch.cuda.synchronize(device)
        events = history_events(torch, device)[start:]
        forward -= start
        stop_history(torch)
        tensors = {y.untyped_storage().data_ptr(), a.grad.untyped_storage().data_ptr()}
    except Exception:  # an unknown answer, said as such
        stop_history(torch)
        return None
    before = kept_blocks(events[:forward])
    added = {block for block in kept_blocks(events) - before if block[0] not in tensors}
    return bool(added)


def kept_blocks(events: list[dict]) -> set:
    alive: dict = {}
    for event in events:
        if event["action"] == "alloc":
            alive[event["addr"]] = event["size"]
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    return set(alive.items())
