"""CUDA autocast (mixed precision) in a trace without a GPU: the casts a GPU makes, asked of
PyTorch's own policy at each call.

`torch.autocast("cuda", dtype=D)` enables the AutocastCUDA dispatch key for the thread
(`set_autocast_enabled` takes it out of the excluded keys). Only a CUDA tensor carries that
key, so a meta tensor never reaches its kernels: on the meta device no cast is made, and
without a GPU `autocast.__init__` disables itself besides (`amp_definitely_not_available`,
torch/amp/autocast_mode.py). A GPU runs the same model's matrix products in D, keeps D
copies of the weights for backward, and computes the losses and norms in float32.

The kernels of that key (aten/src/ATen/autocast_mode.cpp, autocast_mode.h) are wrappers: each
takes `ExcludeDispatchKeyGuard(AutocastCUDA)`, casts its arguments (`cached_cast`: `arg.to(D)`
for a floating CUDA tensor of another dtype), or sets the `dtype` argument to float32 where
none was given (the softmax, sum, cumsum family), and calls the operator again (in a few
cases another overload of it, `norm.ScalarOpt_dtype`). Which operator gets which (D, float32,
the widest of the arguments' dtypes) is a table compiled into PyTorch; every other operator
falls through the key untouched, and its C++ decomposition meets the key again in each of the
operators it calls (`cross_entropy_loss` reaches `log_softmax` and `nll_loss`).

Here that table is not copied, it is asked, per call:

1. While a CUDA autocast region is on, a key of our own (AutocastPrivateUse1, unused by any
   device here) is in the thread's dispatch keys, with a Python kernel for each operator that
   AutocastCUDA has a kernel for (`torch_private.autocast_operators`). Autocast keys come
   before autograd, so the casts made there are operators autograd records, as on the GPU:
   the D copies are what backward saves, and their `ToCopyBackward0` gives the float32
   weights float32 gradients.
2. The kernel runs the same operator once on shadow tensors (fake CUDA tensors of the same
   shapes, strides and dtypes, no gradient) with the region's real autocast settings, so
   that PyTorch's own AutocastCUDA kernel makes its decision. A second key of our own, below
   AutocastCUDA (AutocastHPU), is on for that probe only: its fallback sees the casts
   (`aten::to`, made inside the wrapper, where AutocastCUDA is excluded) and stops the probe
   at the operator's call that follows them, which it records with its arguments. Nothing of
   the probe reaches the trace's own modes.
3. The real (meta) call is then made as the wrapper made it: the same casts of the same
   arguments, in the same order (the order in which C++ evaluated the wrapper's arguments),
   then the recorded operator with the recorded non-tensor arguments. The decision is cached
   by operator, autocast dtype, the tensors' dtypes and devices and the other arguments.

`cached_cast` keeps one cast of a weight per region: a cast to D of a float32 tensor that
requires grad, is a leaf, is not a view, while the autocast cache is enabled, is kept in a
table (keyed by the tensor) and given again at the next use; `clear_cache()` drops the
table when the outermost autocast region exits (`autocast.__exit__`, once
`autocast_decrement_nesting()` is 0). The same rule is kept here, so that a layer called
twice in a region costs one copy of its weight, held until the region ends.

The trace's torch function modes see a call before the dispatcher does: some of them choose
a GPU kernel by the arguments' dtypes (scaled_dot_product_attention's flash, efficient or
math kernel). A torch function mode of this module, pushed on top of them while a region is
on, makes ahead of them the casts that autocast makes at a builtin's own operator (asked the
same way, and applied only when autocast's wrapper was the first thing the call reached); a
Python function of torch (F.softmax, F.layer_norm) is left to the dispatcher level, which
sees the operators its body calls.

What follows autocast outside the operators is kept too, the meta device standing in for
the GPU as it does elsewhere in the trace: `torch.autocast("meta", ...)` is CUDA's autocast
(`x.device.type` names meta where it names cuda on a GPU), and checkpointing's recomputation
(torch.utils.checkpoint, which reads the autocast state of its arguments' device) runs under
the state the first forward ran under. `torch.autocast("cpu")` casts CPU tensors only: left
as PyTorch runs it.

Not followed, and noted: `_cudnn_rnn`'s autocast kernel (aten/src/ATen/cudnn/AutocastRNN.cpp
casts a recurrent layer's weights and flattens them again) is compiled in CUDA builds only,
so a CPU build cannot be asked; an operator whose decision could not be read. GradScaler,
which goes with float16 autocast, is grad_scaler.py's.

Standard library only (torch is passed in).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import weakref

from pipeline.core import torch_private

NOTE = "autocast (CUDA mixed precision)"
# Whether a GPU's measurements of mixed-precision steps have been held against predictions
# made with this emulation (they have: the evidence page says where). While False, a trace
# that entered a CUDA autocast region says so in a note that withholds "exact" and the
# bounds (trace.bounds.boundable); a change to the emulation that no GPU has seen
# should set it back to False.
CHECKED_ON_A_GPU = True
UNCHECKED_WHY = (
    "its casts are PyTorch's own CUDA autocast decisions, asked at each call without a GPU, "
    "and have not yet been held against a GPU's measurement: the central figure follows "
    "them, no bounds are claimed (measure traces beside the GPU, where CUDA autocast runs)"
)
UNREAD_WHY = "PyTorch's CUDA autocast decision could not be read for {ops}: those calls are uncast"
RECURRENT = "recurrent layers under CUDA autocast"
RECURRENT_WHY = (
    "a CUDA build casts cuDNN's recurrent weights and flattens them again under autocast "
    "(AutocastRNN.cpp), which a CPU build of PyTorch cannot be asked about: traced uncast"
)
OUR_KEY = "AutocastPrivateUse1"  # the trace's autocast: no device of this build uses it
PROBE_KEY = "AutocastHPU"  # below AutocastCUDA: sees what its wrapper calls; no kernels here
CUDA_KEY = "AutocastCUDA"
# Builtins (C functions and the methods of torch.Tensor written in C) whose call the torch
# function mode may cast ahead; a Python function runs its body, seen at the dispatcher.
BUILTINS = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
)
NOTHING = ()  # a decision: no cast


@dataclasses.dataclass(frozen=True)
class CacheRules:
    """How this PyTorch's `cached_cast` keeps a weight's cast, beyond the conditions every
    release has (autocast_mode.cpp): PyTorch 2.13 keeps none under inference mode, and makes
    the cast it keeps with grad enabled, so that one made under no_grad serves the backward
    too; earlier releases kept it under inference mode and made it under the grad mode of
    the moment."""

    in_inference_mode: bool  # a cast made under inference mode is kept
    without_grad: bool  # a cast made under no_grad is kept
    made_with_grad: bool  # the kept cast is made with grad enabled
    redone_for_grad: bool  # a kept cast without autograd history is made again under grad


_RULES: dict = {}  # torch.__version__ -> CacheRules
# ("operator" or "function", op or function, autocast dtype, described leaves) -> decision:
# PyTorch's answer for the process (no tensor is kept), shared by its traces
_DECISIONS: dict = {}


def cache_rules(torch) -> CacheRules:
    """Asked of this PyTorch on the CPU, whose autocast shares `cached_cast` with CUDA's: a
    1x1 weight through mm under CPU autocast, counting its casts."""
    found = _RULES.get(torch.__version__)
    if found is not None:
        return found
    aten = torch.ops.aten
    with torch_private.outside_modes(torch):
        weight = torch.ones(1, 1, requires_grad=True)
        x = torch.ones(1, 1)
        casts = []

        class Casts(torch_private.TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                if func in (aten._to_copy.default, aten.to.dtype) and args[0] is weight:
                    casts.append(func)
                return func(*args, **(kwargs or {}))

        def count(*grad_modes) -> tuple[int, bool]:
            casts.clear()
            out = None
            with torch.autocast("cpu", dtype=torch.bfloat16), Casts():
                for mode in grad_modes:
                    with mode():
                        out = torch.mm(weight, x)
            return len(casts), out.requires_grad

        inference, _ = count(torch.inference_mode, torch.inference_mode)
        no_grad, _ = count(torch.no_grad, torch.no_grad)
        then_grad, has_grad = count(torch.no_grad, torch.enable_grad)
    found = _RULES[torch.__version__] = CacheRules(
        in_inference_mode=inference == 1,
        without_grad=no_grad == 1,
        made_with_grad=then_grad == 1 and has_grad,
        redone_for_grad=no_grad == 1 and then_grad == 2,
    )
    return found


class _Seen(Exception):
    """The probe reached a call that is not one of autocast's casts: stopped there."""

    def __init__(self, op, args, kwargs, inside: bool) -> None:
        super().__init__()
        self.op, self.args, self.kwargs, self.inside = op, args, kwargs, inside


@dataclasses.dataclass
class _Stop:
    op: object
    args: tuple
    kwargs: dict
    inside: bool


class _Unread(Exception):
    """The probe's answer could not be mapped back onto the call."""


class Emulation:
    """The state of one trace's emulation: its patches, its kernels while a region is on,
    the decisions read, the cast weights of the region."""

    def __init__(self, torch, notes: dict) -> None:
        self.torch = torch
        self.notes = notes
        self.decisions = _DECISIONS
        self.weights: dict = {}  # id(weight) -> (weak reference to it, its cast)
        self.unread: set = set()
        self.remove_kernels = None
        self.fake = None  # the probe's own FakeTensorMode, made at the first probe
        self.casts: list = []  # the probe's observed casts: (source, dtype, result)
        self.casting = False
        self.entries: list = []  # per autocast entry: the function mode it pushed, or None
        self.function_mode = make_function_mode(torch, self)
        self.counter = make_counter(self)
        self.ran = 0  # operators the probe ran before it stopped, autocast's casts aside
        self.aten_to = torch.ops.aten.to.dtype
        self.rules = cache_rules(torch)
        self.tree_flatten = torch_private.tree_flatten
        self.tree_unflatten = torch_private.tree_unflatten

    # ------------------------------------------------------------ the region

    def sync(self) -> None:
        """Our key on exactly while CUDA autocast is enabled (entered, exited, nested)."""
        on = self.torch.is_autocast_enabled("cuda")
        if on and self.remove_kernels is None:
            self.register()
        if torch_private.dispatch_key_included(self.torch, OUR_KEY) != on:
            torch_private.include_dispatch_key(self.torch, OUR_KEY, on)

    def register(self) -> None:
        torch = self.torch
        kernels = {}
        for name in torch_private.autocast_operators(torch, CUDA_KEY):
            namespace, _, full = name.partition("::")
            if namespace != "aten":
                continue
            packet, _, overload = full.partition(".")
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
            kernels[full] = self.kernel(op)
        rnn = getattr(torch.ops.aten, "_cudnn_rnn", None)
        if rnn is not None and "_cudnn_rnn" not in kernels:
            kernels["_cudnn_rnn"] = self.noted_kernel(rnn.default, RECURRENT, RECURRENT_WHY)
        undo_ours = torch_private.python_kernels(
            torch, OUR_KEY, kernels, torch.library.fallthrough_kernel
        )
        # The probe key sees every overload of those operators (a wrapper may call another:
        # norm.Scalar calls norm.ScalarOpt_dtype) and the casts; a Python fallback cannot
        # serve it (a fake tensor's call reaches a Python kernel through the operator's own
        # registration, which a fallback lacks), so every other operator falls through.
        observed = {}
        for name in ["to", *(full.partition(".")[0] for full in kernels)]:
            packet = getattr(torch.ops.aten, name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                key = name if overload == "default" else f"{name}.{overload}"
                observed[key] = self.observer(op)
        undo_probe = torch_private.python_kernels(
            torch, PROBE_KEY, observed, torch.library.fallthrough_kernel
        )

        def remove() -> None:
            undo_probe()
            undo_ours()

        self.remove_kernels = remove

    def clear_cache(self) -> None:
        self.weights.clear()

    def close(self) -> None:
        if torch_private.dispatch_key_included(self.torch, OUR_KEY):
            torch_private.include_dispatch_key(self.torch, OUR_KEY, False)
        if self.remove_kernels is not None:
            self.remove_kernels()
            self.remove_kernels = None
        self.weights.clear()

    # ------------------------------------------------------------ the decision

    def describe(self, leaves) -> tuple | None:
        Tensor = self.torch.Tensor
        described = []
        for leaf in leaves:
            if isinstance(leaf, Tensor):
                described.append((leaf.dtype, leaf.device.type))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    return None
                described.append((type(leaf), leaf))
        return tuple(described)

    def floating(self, leaves) -> bool:
        Tensor = self.torch.Tensor
        return any(isinstance(x, Tensor) and x.is_floating_point() for x in leaves)

    def probe(self, callable_, leaves, spec):
        """Runs `callable_` on shadows of the leaves under the region's autocast settings:
        (shadows, the casts autocast made, the call that followed them) or None where
        nothing was called. The shadows are fake CUDA tensors for the meta ones (the GPU's),
        fake CPU tensors for CPU ones (which CUDA autocast leaves as they are)."""
        torch = self.torch
        with torch_private.outside_modes(torch):
            if self.fake is None:
                self.fake = torch_private.FakeTensorMode(allow_non_fake_inputs=False)
            specs = [
                (tuple(x.shape), x.stride(), x.dtype, x.device.type)
                if isinstance(x, torch.Tensor)
                else None
                for x in leaves
            ]
            with self.fake:
                shadows = [
                    torch.empty_strided(
                        s[0], s[1], dtype=s[2], device="cuda" if s[3] == "meta" else s[3]
                    )
                    if s is not None
                    else x
                    for s, x in zip(specs, leaves, strict=True)
                ]
            args, kwargs = self.tree_unflatten(shadows, spec)
            self.casts = []
            self.ran = 0
            seen = None
            with (
                torch.no_grad(),
                torch_private.dispatch_key(torch, PROBE_KEY, True),
                torch_private.dispatch_key(torch, OUR_KEY, False),
                self.counter,
            ):
                try:
                    callable_(*args, **kwargs)
                except _Seen as stop:  # its fields only: its traceback holds this frame
                    seen = _Stop(stop.op, stop.args, stop.kwargs, stop.inside)
            casts, self.casts = self.casts, []
        return shadows, casts, seen

    def observer(self, op):
        """The probe key's kernel for `op`: autocast's casts pass (and are kept), any other
        call stops the probe."""
        torch = self.torch
        cast = torch_private.schema_of(op).name == "aten::to"

        def observe(*args, **kwargs):
            inside = torch_private.dispatch_key_excluded(torch, CUDA_KEY)
            if self.casting or (cast and not inside):
                with torch_private.dispatch_key(torch, PROBE_KEY, False):
                    return op(*args, **kwargs)
            if cast:
                self.casting = True
                try:
                    with torch_private.dispatch_key(torch, PROBE_KEY, False):
                        out = op(*args, **kwargs)
                finally:
                    self.casting = False
                self.casts.append((args[0], out.dtype, out))
                return out
            raise _Seen(op, args, kwargs, inside)

        return observe

    def operator_decision(self, op, leaves, spec):
        """For a call of `op` (one of AutocastCUDA's): NOTHING, or (casts, the operator
        called after them, its arguments' spec, each of its leaves: ("leaf", i), ("cast",
        k) or ("value", v))."""
        shadows, casts, seen = self.probe(op, leaves, spec)
        if seen is None or not seen.inside:
            return NOTHING
        index = {id(s): i for i, s in enumerate(shadows) if isinstance(s, self.torch.Tensor)}
        made = {}
        planned = []
        for k, (source, dtype, out) in enumerate(casts):
            if id(source) not in index:
                raise _Unread(f"a cast of a tensor not among {op}'s arguments")
            planned.append((index[id(source)], dtype))
            made[id(out)] = k
        seen_leaves, seen_spec = self.tree_flatten((seen.args, seen.kwargs))
        template = []
        for x in seen_leaves:
            if isinstance(x, self.torch.Tensor):
                if id(x) in made:
                    template.append(("cast", made[id(x)]))
                elif id(x) in index:
                    template.append(("leaf", index[id(x)]))
                else:
                    raise _Unread(f"{seen.op} got a tensor autocast made otherwise")
            else:
                template.append(("value", x))
        same_call = (
            seen.op is op
            and not planned
            and len(seen_leaves) == len(leaves)
            and all(
                (kind == "leaf" and x == i) or (kind == "value" and x is leaves[i])
                for i, (kind, x) in enumerate(template)
            )
        )
        if same_call:
            return NOTHING
        return (tuple(planned), seen.op, seen_spec, tuple(template))

    def function_decision(self, func, leaves, spec):
        """For a builtin's call: the casts of its own arguments that autocast makes at the
        first operator it reaches, where that operator is autocast's and nothing came
        before; NOTHING otherwise."""
        try:
            shadows, casts, seen = self.probe(func, leaves, spec)
        except Exception:  # no decision ahead: the dispatcher level decides
            return NOTHING
        if seen is None or not seen.inside or not casts or self.ran:
            return NOTHING
        index = {id(s): i for i, s in enumerate(shadows) if isinstance(s, self.torch.Tensor)}
        if any(id(source) not in index for source, _, _ in casts):
            return NOTHING
        return tuple((index[id(source)], dtype) for source, dtype, _ in casts)

    def decision(self, key_head, leaves, spec, decide):
        described = self.describe(leaves)
        key = None if described is None else (*key_head, described)
        found = self.decisions.get(key) if key is not None else None
        if found is None:
            found = decide(leaves, spec)
            if key is not None:
                self.decisions[key] = found
        return found

    # ------------------------------------------------------------ the casts

    def cast(self, tensor, dtype):
        """`cached_cast`'s cast: a float32 weight (leaf, requires grad, not a view) cast to
        the region's dtype while the cache is enabled is made once and kept, by the rules
        of this PyTorch (`cache_rules`)."""
        torch = self.torch
        rules = self.rules
        if (
            dtype == torch.get_autocast_dtype("cuda")
            and tensor.dtype == torch.float32
            and tensor.requires_grad
            and tensor.is_leaf
            and not torch_private.is_view(tensor)
            and torch.is_autocast_cache_enabled()
            and (rules.in_inference_mode or not torch.is_inference_mode_enabled())
            and (rules.without_grad or torch.is_grad_enabled())
        ):
            entry = self.weights.get(id(tensor))
            if entry is not None and entry[0]() is tensor:
                kept = entry[1]
                if not (
                    rules.redone_for_grad and torch.is_grad_enabled() and not kept.requires_grad
                ):
                    return kept
            with torch.enable_grad() if rules.made_with_grad else contextlib.nullcontext():
                out = self.aten_to(tensor, dtype)
            self.weights[id(tensor)] = (weakref.ref(tensor), out)
            return out
        return self.aten_to(tensor, dtype)

    def kernel(self, op):
        """Our key's kernel for one of AutocastCUDA's operators."""
        torch = self.torch
        head = (op,)

        def autocast_kernel(*args, **kwargs):
            with torch_private.dispatch_key(torch, OUR_KEY, False):
                leaves, spec = self.tree_flatten((args, kwargs))
                if not self.floating(leaves):
                    return op(*args, **kwargs)
                try:
                    found = self.decision(
                        ("operator", *head, torch.get_autocast_dtype("cuda")),
                        leaves,
                        spec,
                        lambda leaves, spec: self.operator_decision(op, leaves, spec),
                    )
                except _Unread as why:
                    self.note_unread(op, str(why))
                    return op(*args, **kwargs)
                except RuntimeError as error:
                    if "autocast" in str(error):  # refused under autocast on a GPU too
                        raise
                    self.note_unread(op, str(error).splitlines()[0] if str(error) else "")
                    return op(*args, **kwargs)
                if found is NOTHING:
                    return op(*args, **kwargs)
                planned, called, called_spec, template = found
                with torch_private.no_torch_function(torch):
                    made = [self.cast(leaves[i], dtype) for i, dtype in planned]
                    new = [
                        leaves[x] if kind == "leaf" else made[x] if kind == "cast" else x
                        for kind, x in template
                    ]
                    new_args, new_kwargs = self.tree_unflatten(new, called_spec)
                    return called(*new_args, **new_kwargs)

        return autocast_kernel

    def noted_kernel(self, op, name: str, why: str):
        torch = self.torch

        def noted(*args, **kwargs):
            with torch_private.dispatch_key(torch, OUR_KEY, False):
                leaves, _ = self.tree_flatten((args, kwargs))
                if self.floating(leaves):
                    self.notes.setdefault(name, why)
                return op(*args, **kwargs)

        return noted

    def note_unread(self, op, why: str) -> None:
        self.unread.add(f"{op} ({why})" if why else str(op))
        self.notes[NOTE] = UNREAD_WHY.format(ops=", ".join(sorted(self.unread)))

    def function_call(self, func, args, kwargs):
        """The torch function mode's handling of a call while CUDA autocast is enabled."""
        torch = self.torch
        leaves, spec = self.tree_flatten((args, kwargs))
        if not self.floating(leaves):
            return func(*args, **kwargs)
        found = self.decision(
            ("function", func, torch.get_autocast_dtype("cuda")),
            leaves,
            spec,
            lambda leaves, spec: self.function_decision(func, leaves, spec),
        )
        if found is NOTHING:
            return func(*args, **kwargs)
        leaves = list(leaves)
        for i, dtype in found:
            leaves[i] = self.cast(leaves[i], dtype)
        new_args, new_kwargs = self.tree_unflatten(leaves, spec)
        return func(*new_args, **new_kwargs)


def make_counter(emulation: Emulation):
    """A dispatch mode of the probe's: counts the operators run, autocast's casts aside."""

    class Counter(torch_private.TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if not emulation.casting and func.namespace != "prim":
                emulation.ran += 1
            return func(*args, **(kwargs or {}))

    return Counter()


def make_function_mode(torch, emulation: Emulation):
    from torch.overrides import TorchFunctionMode

    class AutocastAhead(TorchFunctionMode):
        """Casts a builtin's arguments as autocast will, before the modes below see them."""

        def __torch_function__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not isinstance(func, BUILTINS) or not torch.is_autocast_enabled("cuda"):
                return func(*args, **kwargs)
            return emulation.function_call(func, args, kwargs)

    return AutocastAhead()


def install(torch, notes: dict):
    """CUDA autocast emulated for a trace on the meta device; returns the undo."""
    emulation = Emulation(torch, notes)
    autocast = torch.amp.autocast_mode.autocast
    original_init = autocast.__init__
    original_enter = autocast.__enter__
    original_exit = autocast.__exit__
    original_clear = torch.clear_autocast_cache
    original_available = torch.amp.is_autocast_available

    def init(context, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "meta":  # the GPU's stand-in: x.device.type names it
            device_type = "cuda"
        if device_type != "cuda":
            return original_init(context, device_type, dtype, enabled, cache_enabled)
        # Built disabled (the CUDA checks are a GPU's: this one is absent), then enabled as
        # asked; dtype None takes get_autocast_dtype("cuda"), float16 unless set.
        original_init(context, device_type, dtype, False, cache_enabled)
        torch_private.enable_autocast_context(context, enabled)
        return None

    def enter(context):
        result = original_enter(context)
        if context.device == "cuda":
            if torch.is_autocast_enabled("cuda") and not CHECKED_ON_A_GPU:
                notes.setdefault(NOTE, UNCHECKED_WHY)
            pushed = None
            mode = emulation.function_mode
            if torch.is_autocast_enabled("cuda") and mode not in torch_private.torch_function_modes(
                torch
            ):
                emulation.function_mode.__enter__()
                pushed = emulation.function_mode
            emulation.entries.append(pushed)
            emulation.sync()
        return result

    def exit_(context, *exc):
        result = original_exit(context, *exc)
        if context.device == "cuda":
            pushed = emulation.entries.pop() if emulation.entries else None
            if pushed is not None:
                pushed.__exit__(None, None, None)
            emulation.sync()
        return result

    def clear_autocast_cache():
        original_clear()
        emulation.clear_cache()

    def is_autocast_available(device_type: str) -> bool:
        return device_type == "meta" or original_available(device_type)

    def checkpoint_kwargs(original, device_type):
        return original("cuda" if device_type == "meta" else device_type)

    autocast.__init__ = init
    autocast.__enter__ = enter
    autocast.__exit__ = exit_
    torch.clear_autocast_cache = clear_autocast_cache
    torch.amp.is_autocast_available = is_autocast_available
    undo_checkpoint = torch_private.patch_checkpoint_autocast_kwargs(torch, checkpoint_kwargs)

    def undo() -> None:
        undo_checkpoint()
        torch.amp.is_autocast_available = original_available
        torch.clear_autocast_cache = original_clear
        autocast.__exit__ = original_exit
        autocast.__enter__ = original_enter
        autocast.__init__ = original_init
        emulation.close()

    return undo
