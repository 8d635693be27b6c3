"""The recorder: the dispatch mode that sees every operator of a traced workload and writes
each new device storage as an allocation and each expired one as a free, in order
(`make_recorder`), with the answers it gives itself to calls already seen, and the reading of
an operator's arguments (`describe`) and of its C++ caller (`cpp_caller`).

Standard library at module level: torch is passed in."""

from __future__ import annotations

import dataclasses
import itertools
import weakref

from pipeline.core import torch_private
from pipeline.predicting import packed_sequences
from pipeline.predicting.trace.gpu_paths import DECOMPOSED, absent_outputs, host_outputs
from pipeline.predicting.trace.model import (
    AUTOGRAD,
    CALLER,
    OpCall,
    Signature,
    TraceStopped,
    packet,
    signature_id,
)
from pipeline.predicting.trace.operators import (
    IN_PLACE_CANDIDATES,
    IN_PLACE_IN_A_REAL_RUN,
    OTHER_WAY,
    UNREADABLE_CALLER,
    UNSEEN,
)


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorFacts:
    """What the recorder asks of an operator at every call, answered once per operator: an
    8B-class trace makes a few hundred thousand calls of a few dozen operators."""

    name: str  # str(func): "aten.addmm.default"
    prim: bool  # namespace "prim"
    pointwise_out: bool  # one of the `out=` products written_into_out may skip
    decomposed: object  # False, True, or the condition on (args, kwargs): see decomposed()
    seeded: bool  # random, and not cuDNN's RNN (which has a fake kernel)
    mutable: bool  # its schema writes into an argument
    view: bool
    in_place_candidate: bool  # in IN_PLACE_CANDIDATES
    returns_first: bool  # writes into its first argument and returns it (add_, copy_, ...)
    pure: bool  # aten, writes into no argument, no view, shapes not from values (mm, cat, ...)


# Whether the recorder answers a call already seen (the same signature) of an in-place or view
# operator, or of one that makes new tensors, itself, as FakeTensorMode's dispatch cache would,
# without that cache's key (Recorder.in_place, .viewed, .made). False: every call goes through
# FakeTensorMode, the oracle tests/test_trace_speed.py compares the traces with.
KNOWN_CALLS_ANSWERED = True
# The devices whose fake tensors get those answers: the meta device's (the GPU-free estimate)
# and a GPU's (the trace beside a measurement), where test_trace_speed.py's GPU test makes the
# same comparison on a GPU (the evidence page gives its runs).
ANSWERED_ON = ("meta", "cuda")

# How the recorder learns that a storage's last reference went: "callback", a weak reference
# to the storage's Python object, which PyTorch keeps as long as the storage lives and drops
# with it; "scan", every live storage asked at every operator (quadratic in the trace's
# length; kept as the oracle the tests compare the callbacks with).
FREE_DETECTION = "callback"


def returns_first(schema) -> bool:
    """One return, the first argument, which the operator writes (add_, copy_, resize_)."""
    if len(schema.returns) != 1 or not schema.arguments:
        return False
    first, returned = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return (
        first is not None
        and first.is_write
        and returned is not None
        and returned.before_set == first.before_set
    )


class Recorder:
    """The dispatch mode that records (`make_recorder` makes it a TorchDispatchMode, with what
    it reads of torch as class attributes: torch is not imported at module level)."""

    def __init__(self, tracer) -> None:  # a tracer.Tracer, which imports this module
        super().__init__()
        self.tracer = tracer
        self.events = tracer.trace.events
        self.live: dict = {}  # weak pointer -> (StorageWeakRef, bytes, storage id, watch)
        self.scan = FREE_DETECTION == "scan"
        self.reported: list = []  # weak pointers whose storage's Python object went
        self.suspects: set = set()  # reported while their storage still lived
        self.specs: dict = {}  # shape of the arguments (make_flatten) -> TreeSpec, text
        self.freed_early: set = set()
        self.ids = itertools.count()
        self.target = self.torch.device(tracer.trace.device)
        self.pending_in_place: tuple | None = None  # (OpCall, its first argument's storage id)
        self.operators: dict = {}  # OpOverload -> OperatorFacts
        self.keys: dict = {}  # a signature's text -> signature_id(text)
        self.probes: dict = {}  # (name, spec text, described, their types) -> the same
        self.kept_in_place: set = set()  # signatures whose fake kernel changed no metadata
        self.views: dict = {}  # (signature, base's keys, inference mode) -> fake_view_recipe
        self.outputs: dict = {}  # (signature, *creation_state) -> fake_outputs_recipe
        self.described: dict = {}  # dtype or device -> its part of a description
        self.written: dict = {}  # written_into_out's answers, by shapes and dtypes
        answered_here = self.target.type in ANSWERED_ON
        self.answers = KNOWN_CALLS_ANSWERED and answered_here and not tracer.real
        if self.target.type == "meta":  # on_target, in one step (asked a million times)
            self.on_target = lambda tensor: tensor.device.type == "meta"

    def on_target(self, tensor) -> bool:
        device = tensor.device
        if self.target.type == "meta":
            return device.type == "meta"
        return device.type == self.target.type and device.index == self.target.index

    def facts(self, func) -> OperatorFacts:
        """What the recorder asks of an operator at each of its calls, asked once."""
        found = self.operators.get(func)
        if found is None:
            schema = torch_private.schema_of(func)
            name = str(func)
            composite = schema.name in DECOMPOSED and torch_private.has_composite_kernel(
                self.torch, func
            )
            found = self.operators[func] = OperatorFacts(
                name=name,
                prim=func.namespace == "prim",
                pointwise_out=func in self.POINTWISE_OUT,
                decomposed=(DECOMPOSED[schema.name] or True) if composite else False,
                seeded=self.seeded_tag in func.tags and func is not self.RNN,
                mutable=schema.is_mutable,
                view=bool(func.is_view),
                in_place_candidate=name in IN_PLACE_CANDIDATES,
                returns_first=returns_first(schema),
                pure=func.namespace == "aten"
                and not (
                    schema.is_mutable or func.is_view or self.value_shaped.intersection(func.tags)
                ),
            )
        return found

    def poll(self) -> None:
        """Storages whose last reference went since the last operator: freed, now."""
        if not (self.reported or self.suspects or self.scan or self.pending_in_place):
            return  # nothing reported, nothing pending: most operators' case
        expired = torch_private.storage_expired(self.torch)
        if self.scan:
            dead = [key for key in self.live if expired(key)]
        else:
            # Only those a callback reported (`watch`), each asked whether its storage is
            # gone indeed, as a scan would ask it; one still alive is asked again at
            # every poll until it is.
            candidates = self.suspects
            if self.reported:
                candidates = candidates.union(self.reported)
                self.reported.clear()
            dead = [key for key in candidates if expired(key)]
            if candidates:
                self.suspects = candidates.difference(dead)
        pending, self.pending_in_place = self.pending_in_place, None
        for sid in sorted(self.live.pop(key)[2] for key in dead):  # in a stable order
            if pending is not None and sid == pending[1]:
                pending[0].reuses = sid  # nothing else held it: the real run adds in place
            if sid in self.freed_early:
                self.freed_early.discard(sid)
            else:
                self.events.append(("free", sid))

    def free_if_only_held_by(self, tensor) -> None:
        if not isinstance(tensor, self.torch.Tensor) or not self.on_target(tensor):
            return
        storage = tensor.untyped_storage()
        entry = self.live.get(self.StorageWeakRef(storage).cdata)
        # 2: the tensor's own reference and `storage` here; nothing else holds it.
        if entry is not None and torch_private.storage_use_count(self.torch, storage) == 2:
            self.events.append(("free", entry[2]))
            self.freed_early.add(entry[2])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.PRIM_DEVICE and type(args[0]) is self.FakeTensor:
            return self.device_of_fake(args)  # asked from C++: nothing runs, nothing recorded
        kwargs = kwargs or {}
        facts = self.operators.get(func) or self.facts(func)
        if not facts.prim:  # prim.device is asked inside other operators' calls
            self.poll()
        if not self.tracer.real:
            if (
                func is self.SCALAR
                and self.tracer.trace.checks_passing
                and args[0].dtype == self.BOOL
            ):
                return False  # a value check, passed (make_choice_notes' `checked`)
            if func is self.PACK:
                if not packed_sequences.has_values(self.torch, args[1]):
                    raise TraceStopped(packed_sequences.NO_VALUES)
                with self:
                    return packed_sequences.pack(self.torch, *args, **kwargs)
            if self.on_host(args, kwargs):
                with torch_private.unset_fake_temporarily():
                    return func(*args, **kwargs)
            args, kwargs = self.host_tensors_faked(args, kwargs)
        if facts.pointwise_out and self.written_into_out(func, args, kwargs):
            out = kwargs["out"]  # what the fake kernel returns, without its slow path
            self.record(func, args, kwargs, out, facts)
            return out
        condition = facts.decomposed  # decomposed(), its call-independent part kept
        if condition is True or (condition and condition(args, kwargs)):
            with self:
                return torch_private.composite_function(self.torch, func, args, kwargs)
        if facts.seeded and not self.tracer.real:  # random: before any answer
            out = self.seeded(func, args, kwargs)
            torch_private.forget_converted_tensors(self.tracer.fake)
        elif self.answers and facts.returns_first:
            return self.in_place(func, args, kwargs, facts)
        elif self.answers and facts.view:
            return self.viewed(func, args, kwargs, facts)
        elif self.answers and facts.pure:
            return self.made(func, args, kwargs, facts)
        else:
            out = self.called(func, args, kwargs)
        self.record(func, args, kwargs, out, facts)
        return out

    def called(self, func, args, kwargs):
        """func(*args, **kwargs), through the fake mode below."""
        try:
            out = func(*args, **kwargs)
        except AssertionError:
            made = self.made_from_data(args, kwargs)
            if made is None:
                raise
            out = func(*made[0], **made[1])
        torch_private.forget_converted_tensors(self.tracer.fake)
        if func in self.CONTIGUOUS_OUTPUT and not out.is_contiguous():
            out = out.new_empty(out.shape)  # the fake mode's, not recorded: the kernel's
        return out

    def in_place(self, func, args, kwargs, facts: OperatorFacts):
        """An operator that writes into its first argument and returns it. Its fake
        kernel runs the first time a signature is seen (it checks the call as a GPU
        would, and may raise); if that left the first argument's shape, strides, offset
        and storage as they were, a later call of the same signature (the same
        arguments' descriptions) is answered without it: the kernel depends on nothing
        else, and a quarter of a decoder trace's calls are of this kind. Not for fake
        tensors that hold a value (FakeTensorMode then updates it)."""
        first = args[0] if args else None
        called = self.flatten((args, kwargs))
        before = self.call_key(facts, *called, (args, kwargs))
        if before[0] in self.kept_in_place and self.answerable(called[0]):
            self.record(func, args, kwargs, first, facts, called, before)
            return first
        out = self.called(func, args, kwargs)
        after = self.call_key(facts, *called, (args, kwargs))
        if out is first and after == before:
            self.kept_in_place.add(before[0])
        self.record(func, args, kwargs, out, facts, called, after)
        return out

    def viewed(self, func, args, kwargs, facts: OperatorFacts):
        """A view operator: its fake kernel runs the first time a signature is seen; if
        it gave one fake tensor on its first argument's storage and left the arguments
        as they were, a later call of the same signature gets the same view, made as
        FakeTensorMode makes it from its own dispatch cache (torch_private.fake_view)
        without computing that cache's key: views are a third of a decoder trace's
        calls, and the rest of their cost."""
        called = self.flatten((args, kwargs))
        key = self.call_key(facts, *called, (args, kwargs))
        # A view's dispatch keys follow its base's (an inference tensor's, autograd's
        # zero tensor's) and, for a normal base, whether inference mode is on.
        keys = torch_private.dispatch_keys(self.torch, args[0])
        known = key[0], keys, self.torch.is_inference_mode_enabled()
        made = self.views.get(known)
        fake = self.tracer.fake
        if made is not None and self.answerable(called[0]):
            out = torch_private.fake_view(self.torch, fake, args[0], *made)
        else:
            out = self.called(func, args, kwargs)
            made = torch_private.fake_view_recipe(self.torch, fake, out, args[0])
            if made is not None and self.call_key(facts, *called, (args, kwargs)) == key:
                self.views[known] = made
        self.record(func, args, kwargs, out, facts, called, key)
        return out

    def made(self, func, args, kwargs, facts: OperatorFacts):
        """An operator that writes into no argument: its fake kernel runs the first time a
        signature is seen (under the default dtype and device and the inference mode of
        that call, which FakeTensorMode's cache keys hold too); if it returned fake
        tensors on new storages of their own, a later call gets new ones of the same
        shapes, made as that cache makes them (torch_private.fake_outputs)."""
        called = self.flatten((args, kwargs))
        key = self.call_key(facts, *called, (args, kwargs))
        known = key[0], *torch_private.creation_state(self.torch)
        recipe = self.outputs.get(known)
        fake = self.tracer.fake
        if recipe is not None and self.answerable(called[0]):
            out = torch_private.fake_outputs(self.torch, fake, recipe)
        else:
            out = self.called(func, args, kwargs)
            if self.answerable(called[0]):
                recipe = torch_private.fake_outputs_recipe(self.torch, fake, out, called[0])
                if recipe is not None:
                    self.outputs[known] = recipe
        self.record(func, args, kwargs, out, facts, called, key)
        return out

    def answerable(self, leaves) -> bool:
        """Whether a call seen before may be answered without the fake mode: every tensor
        argument one of its fake tensors (a real one takes made_from_data's path), none
        holding a value (FakeTensorMode follows a held value through the call)."""
        for x in leaves:
            if isinstance(x, self.Tensor) and (
                type(x) is not self.FakeTensor or torch_private.fake_holds_value(x)
            ):
                return False
        return True

    def written_into_out(self, func, args, kwargs) -> bool:
        """A binary pointwise `out=` call whose `out` already has the broadcast shape,
        on the inputs' device, and a dtype the result casts to: it allocates nothing, and
        returns `out`. FakeTensorMode caches no `out=` call and runs PyTorch's Python
        reference for it, five times the cost of the same product without `out` (the
        decoder's rotary embedding and norms make thousands)."""
        if self.tracer.real:
            return False
        out = kwargs.get("out")
        if not isinstance(out, self.FakeTensor) or len(args) != 2:
            return False
        tensors = [x for x in args if isinstance(x, self.torch.Tensor)]
        if any(not isinstance(x, self.FakeTensor) or x.device != out.device for x in tensors):
            return False
        # The answer depends on the shapes and dtypes alone where both arguments are
        # tensors of at least one dimension (a zero-dimensional one may be a wrapped
        # number, which promotes otherwise): asked once per such combination.
        key = None
        if len(tensors) == 2 and all(x.dim() for x in tensors):
            key = tuple((tuple(x.shape), x.dtype) for x in (*tensors, out))
            known = self.written.get(key)
            if known is not None:
                return known
        shape = self.torch.broadcast_shapes(*(x.shape for x in tensors))
        if tuple(out.shape) != tuple(shape):
            answer = False  # resized: the fake kernel says how
        else:
            answer = self.torch.can_cast(self.torch.result_type(*args), out.dtype)
        if key is not None:
            self.written[key] = answer
        return answer

    def on_host(self, args, kwargs) -> bool:
        """Whether a GPU run computes this call on the CPU, for real: every tensor argument
        a real CPU tensor (`on_host` made it), or none and the CPU named as the device.
        Run so, its values exist: models that build a schedule on the CPU and read it
        back (ConvNeXt's, Swin's, BEiT's stochastic depth: `torch.linspace(..., device=
        "cpu").tolist()`) are traced on, where a fake tensor has no value to give."""
        FakeTensor = torch_private.FakeTensor
        for x in args:
            if isinstance(x, FakeTensor):
                return False  # the common case, told at once
        device = kwargs.get("device")
        if device is not None and self.torch.device(device).type != "cpu":
            return False
        tensors = [x for x in self.flatten((args, kwargs))[0] if isinstance(x, self.torch.Tensor)]
        if not tensors:
            return device is not None
        return not any(isinstance(x, FakeTensor) or x.device.type != "cpu" for x in tensors)

    def host_tensors_faked(self, args, kwargs):
        """(args, kwargs) with each real CPU tensor among the arguments made fake: where a
        GPU run's CPU tensor meets the device (`.to(device)`, an operator with device
        tensors), so that the fake mode makes the call, and its output is the device's
        block, allocated here. A real CPU tensor inside a list is made fake when the fake
        mode refuses it (`made_from_data`)."""
        FakeTensor = torch_private.FakeTensor

        def real(x) -> bool:
            return isinstance(x, self.torch.Tensor) and not isinstance(x, FakeTensor)

        for x in (*args, *kwargs.values()):  # not any(map(real, ...)), without a call each
            if isinstance(x, self.Tensor) and not isinstance(x, FakeTensor):
                break
        else:
            return args, kwargs
        fake = self.tracer.fake.from_tensor
        return self.tree_map(lambda x: fake(x) if real(x) and x.device.type == "cpu" else x,
                        (args, kwargs))  # fmt: skip

    def made_from_data(self, args, kwargs):
        """(args, kwargs) with each real meta tensor replaced by a fake one, allocated now,
        and each real CPU tensor by a fake one (`on_host` made it: a GPU run copies it
        where it is used); None if there is none. Indexing with a Python list
        (`x[..., [-1]]`) makes its index tensor from data, like torch.tensor
        (make_choice_notes), on the meta device outside the fake mode, which then refuses
        it. On a GPU that tensor is a block on the device, allocated where it is made, just
        before its use."""
        found = []

        def fake(x):
            if (
                isinstance(x, self.torch.Tensor)
                and not isinstance(x, torch_private.FakeTensor)
                and x.device.type in ("meta", "cpu")
                and not self.tracer.real
            ):
                on_device = x.device.type == "meta"
                x = self.tracer.fake.from_tensor(x)
                if on_device:
                    sid, nbytes = self.track(x)
                    self.events.append(("unseen", sid, nbytes))
                found.append(x)
            return x

        made = self.tree_map(fake, (args, kwargs))
        return made if found else None

    def seeded(self, func, args, kwargs):
        """Random operators: values do not matter for memory, and a fake CUDA
        generator needs a CUDA build. In-place ones allocate nothing; the others'
        outputs get their shapes from the meta device."""
        if torch_private.schema_of(func).name.endswith("_"):
            return args[0]
        if "out" in kwargs:
            return kwargs["out"]

        def to_meta(x):
            if isinstance(x, self.torch.Tensor):
                return self.torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            if isinstance(x, self.torch.device):
                return self.torch.device("meta")
            if isinstance(x, self.torch.Generator):
                return None
            return x

        device = kwargs.get("device")
        if device is None:
            tensors = [x for x in self.tree_flatten(args)[0] if isinstance(x, self.torch.Tensor)]
            device = tensors[0].device if tensors else self.torch.device("cpu")
        with torch_private.unset_fake_temporarily():
            meta = func(*self.tree_map(to_meta, args), **self.tree_map(to_meta, kwargs))
        on_host = host_outputs(func, args, kwargs)
        absent = absent_outputs(func, args, kwargs)

        def made(index, m):
            if not isinstance(m, self.torch.Tensor):
                return m
            if index in absent:
                return self.torch.empty(0, dtype=m.dtype, device=device)
            where = self.torch.device("cpu") if index in on_host else device
            return self.torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=where)

        if isinstance(meta, tuple):
            return tuple(made(index, m) for index, m in enumerate(meta))
        return self.tree_map(lambda m: made(None, m), meta)

    def role(self) -> str:
        """Backward runs in autograd's own thread on a GPU: its cuBLAS handle, and
        workspaces, are not the caller's."""
        return AUTOGRAD if torch_private.autograd_node_running(self.torch) else CALLER

    def record(self, func, args, kwargs, out, facts=None, called=None, key=None) -> None:
        """The call as an event: its outputs' new storages and its signature. called,
        key: flatten((args, kwargs)) and call_key(...), where the caller has them."""
        facts = facts or self.facts(func)
        leaves, shape = called or self.flatten((args, kwargs))
        inputs = [x for x in leaves if isinstance(x, self.Tensor)]
        flat = self.flatten(out)[0]
        tensors = [x for x in flat if isinstance(x, self.Tensor)]
        on_target = self.on_target
        if not (any(map(on_target, inputs)) or any(map(on_target, tensors))):
            return  # host-only work: no device memory
        if not tensors and not facts.mutable:
            return  # metadata (prim.device, sizes, a kernel choice): nothing allocated
        name = facts.name
        for tensor in inputs:
            self.unseen(tensor, name)
        outputs = []
        for index, tensor in enumerate(flat):
            if isinstance(tensor, self.Tensor) and on_target(tensor):
                new = self.track(tensor)
                if new is not None:
                    outputs.append((index, *new))
        key, described, spec = key or self.call_key(facts, leaves, shape, (args, kwargs))
        signatures = self.tracer.trace.signatures
        entry = signatures.get(key)
        if entry is None:
            # A view, or an operator that only returns its inputs' storages: no kernel.
            alias = facts.view or (not facts.mutable and not outputs)
            entry = signatures[key] = Signature(name, func, described, spec, view=alias)
        entry.calls += 1
        op = OpCall(name, self.role(), key, tuple(outputs))
        self.events.append(("op", op))
        if facts.in_place_candidate and len(outputs) == 1 and outputs[0][0] == 0:
            self.in_place_in_a_real_run(op, args)

    def call_key(self, facts, leaves, shape, tree=None) -> tuple:
        """(signature_id of the call's text, its described leaves, its TreeSpec). The
        text, "name|described|spec", is made once per distinct call: later ones are
        found by the described leaves themselves and their types (1, 1.0 and True are
        equal keys of different texts), except where one equals zero (-0.0 == 0.0)."""
        spec, spec_text = self.specs.get(shape) or (None, None)
        if spec is None:
            spec = self.tree_flatten(tree)[1]
            spec_text = str(spec)
            if shape is not None:
                self.specs[shape] = spec, spec_text
        described = [self.describe(x) for x in leaves]
        probe = None
        if 0.0 not in described:
            probe = (facts.name, spec_text, tuple(described), tuple(map(type, described)))
            key = self.probes.get(probe)
            if key is not None:
                return key, described, spec
        text = f"{facts.name}|{described!r}|{spec_text}"
        key = self.keys.get(text)
        if key is None:
            key = self.keys[text] = signature_id(text)
        if probe is not None:
            self.probes[probe] = key
        return key, described, spec

    def describe(self, x):
        """describe(torch, x, self.target), a tensor's dtype and device worded once."""
        if type(x) is not self.FakeTensor:
            return describe(self.torch, x, self.target)
        known = self.described
        dtype, device = x.dtype, x.device
        worded = known.get(dtype)
        if worded is None:
            worded = known[dtype] = describe(self.torch, dtype, self.target)[1]
        where = known.get(device)
        if where is None:
            where = known[device] = describe(self.torch, device, self.target)[1]
        return tensor_description(x, worded, where)

    def in_place_in_a_real_run(self, op: OpCall, args) -> None:
        """A call that a real run makes in place (IN_PLACE_IN_A_REAL_RUN) shares its first
        argument's block, which lives as long as either does. For the engine's sum of
        gradients, only if that argument's storage dies with the call, which shows at the
        next poll (`poll`): then nothing else held it, the engine's condition."""
        first = args[0] if args else None
        if not isinstance(first, self.torch.Tensor) or not self.on_target(first):
            return
        storage = first.untyped_storage()
        if storage.nbytes() < op.outputs[0][2]:
            return  # the result does not fit where the first argument lives
        caller = cpp_caller(entry_point(op.name))
        if caller is None:
            self.tracer.trace.notes.setdefault(f"{packet(op.name)} (in place)", UNREADABLE_CALLER)
            return
        condition = next(
            (
                ops.get(op.name)
                for name, ops in IN_PLACE_IN_A_REAL_RUN.items()
                if caller.startswith(name + "(")
            ),
            None,
        )
        if condition is None:
            return
        if condition == "other":
            where = caller.split("(")[0]
            self.tracer.trace.notes.setdefault(f"{packet(op.name)} in {where}", OTHER_WAY)
            return
        if condition != "always" and self.torch.is_grad_enabled():
            return
        if condition == "gradient" and (
            torch_private.is_zero_tensor(first)
            or first.is_nested
            or not dense(first)
            # 2: `first` and `storage` here. A view holds its base, whose storage it shares.
            or torch_private.storage_use_count(self.torch, storage) != 2
        ):
            return
        entry = self.live.get(self.StorageWeakRef(storage).cdata)
        if entry is None:
            return
        if condition == "gradient":  # decided at the next poll
            self.pending_in_place = (op, entry[2])
        else:
            op.reuses = entry[2]

    def track(self, tensor):
        """(storage id, bytes) if the tensor's storage is new, else None."""
        storage = tensor.untyped_storage()
        ref = self.StorageWeakRef(storage)
        entry = self.live.get(ref.cdata)
        if entry is None:
            sid = next(self.ids)
            self.live[ref.cdata] = (ref, storage.nbytes(), sid, self.watch(storage, ref.cdata))
            return sid, storage.nbytes()
        if storage.nbytes() != entry[1]:  # resized in place: a new block, the old freed
            self.live[ref.cdata] = (entry[0], storage.nbytes(), entry[2], entry[3])
            self.events.append(("resize", entry[2], storage.nbytes()))
        return None

    def watch(self, storage, key: int):
        """A weak reference to the storage's Python object that reports `key` when the
        object goes: PyTorch keeps that object alive with the storage (it is the same one
        whichever tensor asks), so it goes when the storage's last reference does."""
        if self.scan:
            return None
        return weakref.ref(storage, lambda _, key=key: self.reported.append(key))

    def at_most(self, blocks: tuple, held_by=None) -> int:
        """Blocks a GPU may take here that the trace does not make, their sizes set by
        values it does not have: the most replay alone allocates them, and frees them
        with `held_by`'s storage (never, where it is not the device's), or at
        at_most_end(the token returned)."""
        self.poll()
        token = next(self.ids)
        sid = None
        if held_by is not None:
            entry = self.live.get(torch_private.storage_key(held_by.untyped_storage()))
            sid = -1 if entry is None else entry[2]
        self.events.append(("most", token, tuple(blocks), sid))
        return token

    def at_most_end(self, token: int) -> None:
        self.events.append(("most_end", token))

    def unseen(self, tensor, name: str) -> None:
        """A device storage no operator returned (made outside the dispatcher): allocated
        now, as far as the trace knows."""
        if not self.on_target(tensor):
            return
        storage = tensor.untyped_storage()
        if torch_private.storage_key(storage) in self.live:
            return
        sid, nbytes = self.track(tensor)
        self.events.append(("unseen", sid, nbytes))
        self.tracer.trace.notes.setdefault(
            UNSEEN,
            f"first seen as an input of {name}: when it was allocated is unknown",
        )


def make_recorder(torch):
    """The dispatch mode class: `Recorder` on torch's TorchDispatchMode (made on demand: it
    needs torch to exist), with what it reads of torch as class attributes."""
    aten = torch.ops.aten
    read = {
        "torch": torch,
        "StorageWeakRef": torch_private.StorageWeakRef,
        "tree_flatten": staticmethod(torch_private.tree_flatten),
        "tree_map": staticmethod(torch_private.tree_map),
        "seeded_tag": torch.Tag.nondeterministic_seeded,
        "flatten": staticmethod(make_flatten(torch)),
        "FakeTensor": torch_private.FakeTensor,
        "POINTWISE_OUT": {aten.mul.out, aten.add.out, aten.sub.out},
        # The fake mode runs PyTorch's Python decomposition of log_softmax's backward, whose
        # result keeps the gradient's strides; the kernels' own meta function
        # (TORCH_META_FUNC(_log_softmax_backward_data), SoftMax.cpp) makes it contiguous, and
        # an H100 showed it so (no copy where the gradient meets a contiguous leaf).
        "CONTIGUOUS_OUTPUT": {aten._log_softmax_backward_data.default},
        # cuDNN's RNN: tagged seeded (its dropout), not taken so: cudnn_rnn's fake kernel makes it
        "RNN": torch_private.cudnn_rnn_operators(torch)[0],
        "PACK": torch_private.pack_padded_operator(torch),  # packed_sequences: the lengths read
        "SCALAR": torch_private.local_scalar_operator(torch),  # a value read back to Python
        "BOOL": torch.bool,
        # Operators whose outputs may take their shapes from values: FakeTensorMode caches none.
        "value_shaped": {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape},
        "PRIM_DEVICE": torch.ops.prim.device.default,  # a third of a decoder trace's calls
        "device_of_fake": staticmethod(torch_private.fake_device_answer()),
        "Tensor": torch.Tensor,
    }
    mode = torch_private.unguarded_dispatch_mode()  # no torch.compile inside
    return type("Recorder", (Recorder, mode), read)


def make_flatten(torch):
    """tree -> (torch.utils._pytree.tree_flatten(tree)[0], its shape), twice per operator
    call: the common trees (tuples, lists and dicts of tensors, numbers, None, dtypes,
    devices) read here, a tenth of pytree's time; any other type of node or leaf sends the
    whole tree to pytree, and its shape is None. The shape, hashable, is equal for two trees
    exactly where pytree's TreeSpecs are: the recorder makes a TreeSpec, and its text, once
    per shape."""
    containers = {tuple: tuple, list: list, dict: dict}
    leaf_types = (int, float, bool, complex, str, type(None), torch.dtype, torch.device,
                  torch.layout, torch.memory_format)  # fmt: skip
    kinds: dict = {}  # type -> "node", "leaf" or "other", as pytree sees it

    def kind(cls) -> str:
        found = kinds.get(cls)
        if found is None:
            if cls in containers and torch_private.is_pytree_node(cls):
                found = "node"
            elif torch_private.is_pytree_node(cls) or torch_private.is_namedtuple_class(cls):
                found = "other"
            elif cls in leaf_types or issubclass(cls, torch.Tensor):
                found = "leaf"
            else:
                found = "other"
            kinds[cls] = found
        return found

    class Other(Exception):
        pass

    def walk(tree, leaves: list):
        cls = type(tree)
        found = kinds.get(cls) or kind(cls)
        if found == "leaf":
            leaves.append(tree)
            return None
        if found != "node":
            raise Other
        children = tree.values() if cls is dict else tree
        shapes = []
        for child in children:  # a leaf told here, without a call (most children are)
            if (kinds.get(type(child)) or kind(type(child))) == "leaf":
                leaves.append(child)
                shapes.append(None)
            else:
                shapes.append(walk(child, leaves))
        if cls is dict:  # pytree's context: the keys, in order (typed: 1 and True differ)
            return cls, tuple((type(key), key) for key in tree), tuple(shapes)
        return cls, tuple(shapes)

    def flatten(tree) -> tuple:
        leaves: list = []
        try:
            shape = walk(tree, leaves)
        except Other:
            return torch_private.tree_flatten(tree)[0], None
        return leaves, shape

    return flatten


def dense(tensor) -> bool:
    """PyTorch's non-overlapping-and-dense: in some order of the dimensions (by stride, those
    of size 1 aside), each stride is the product of the sizes before it."""
    expected = 1
    for stride, size in sorted(
        (stride, size)
        for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
        if size != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def entry_point(name: str) -> str:
    """'aten.add.Tensor' -> 'at::_ops::add_Tensor::call', the C++ entry of an operator."""
    _, operator, overload = name.split(".")
    return f"at::_ops::{operator}{'' if overload == 'default' else '_' + overload}::call"


def cpp_caller(entry: str) -> str | None:
    """The C++ function that called the operator being dispatched, whose entry point is
    `entry` ("at::_ops::add_Tensor::call"), or None where the names cannot be read. Exported
    names are enough, and dladdr reads them a hundred times faster than addr2line."""
    try:
        frames = torch_private.cpp_frames()
    except Exception:  # a build without the unwinder: no names
        return None
    names = [frame["name"] for frame in frames if frame["name"] != "??"]
    calls = [i for i, name in enumerate(names) if name.startswith(entry + "(")]
    if not calls or calls[-1] + 1 == len(names):
        return None
    return names[calls[-1] + 1]


def tensor_description(x, dtype: str, where: str) -> tuple:
    """A tensor as describe() gives it, its dtype and device already worded."""
    nbytes = x.untyped_storage().nbytes()
    return ("tensor", dtype, tuple(x.shape), tuple(x.stride()), x.storage_offset(), nbytes, where)


def describe(torch, x, target):
    """An argument as a probe recreates it: tensors by dtype, shape, strides, offset, storage
    bytes and device ('device' for the traced one), everything else by value."""

    def where(device) -> str:
        same = device.type == target.type and device.index in (None, target.index)
        return "device" if same else device.type

    if isinstance(x, torch.Tensor):
        return tensor_description(x, str(x.dtype).removeprefix("torch."), where(x.device))
    if isinstance(x, torch.device):
        return ("device", where(x))
    if isinstance(x, torch.dtype):
        return ("dtype", str(x).removeprefix("torch."))
    if isinstance(x, (torch.memory_format, torch.layout)):
        return ("enum", str(x).removeprefix("torch."))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return ("unprobeable", type(x).__name__)
