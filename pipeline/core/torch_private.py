"""The private PyTorch APIs the pipeline needs, in one place: names that start with `_` or
live in PyTorch's private modules, which a new release may change without notice.

Each is here once, as a small function or a name re-exported as it is, with why the
pipeline needs it; tests/test_torch_private.py holds each to the behaviour the pipeline
relies on, on the PyTorch it runs. They were read against the versions in SUPPORTED
(2.11.0+cu130 on the GPU machine, 2.13.0+cpu without one); `check_version` says when the
PyTorch at hand is outside them, and the trace notes it (trace.tracer.Tracer).

Standard library at module level: torch is imported by the functions that need it, or
taken as an argument, so that the stages that run without torch can import
this module too. It imports nothing of the pipeline (tests/test_imports.py).
"""

from __future__ import annotations

import os
import re

SUPPORTED = ("2.11", "2.13")  # the lowest and highest major.minor these were read against
VERSION_NOTE = "PyTorch version"  # the trace note's name when check_version warns


def check_version(torch) -> str | None:
    """A one-line warning when torch.__version__'s major.minor is outside SUPPORTED, else None."""
    version = str(getattr(torch, "__version__", ""))
    found = re.match(r"(\d+)\.(\d+)", version)
    low, high = (tuple(int(part) for part in bound.split(".")) for bound in SUPPORTED)
    if found is not None and low <= (int(found[1]), int(found[2])) <= high:
        return None
    return (
        f"PyTorch {version or 'of unknown version'}: the private APIs the trace uses were read "
        f"against {SUPPORTED[0]} to {SUPPORTED[1]} only (torch_private.py)"
    )


# ---------------------------------------------------------------- names re-exported as they are

# name -> (the private module it lives in, why the pipeline needs it). Imported on first use
# (PEP 562), so `torch_private.tree_flatten` is pytree's own function, at no cost per call.
REEXPORTED = {
    "FakeTensorMode": (
        "torch._subclasses.fake_tensor",
        "tensors with shapes and no memory: the trace runs the workload under it",
    ),
    "FakeTensor": (
        "torch._subclasses.fake_tensor",
        "the fake mode's tensors: told from real meta tensors made outside the mode",
    ),
    "unset_fake_temporarily": (
        "torch._subclasses.fake_tensor",
        "leaves the fake mode for a moment: random operators' output shapes from meta",
    ),
    "_disable_current_modes": (
        "torch.utils._python_dispatch",
        "every dispatch mode off for a moment: a host tensor's fake body, made unrecorded",
    ),
    "TorchDispatchMode": (
        "torch.utils._python_dispatch",
        "the recorder's base class: it sees every operator call, after autograd",
    ),
    "StorageWeakRef": (
        "torch.multiprocessing.reductions",
        "a storage's weak pointer (`.cdata`): the recorder's key for a live device storage",
    ),
    "tree_flatten": ("torch.utils._pytree", "an operator call's arguments as leaves and spec"),
    "tree_unflatten": ("torch.utils._pytree", "a call rebuilt from its described leaves"),
    "tree_map": ("torch.utils._pytree", "each tensor of a call's arguments replaced"),
    "is_namedtuple_class": (
        "torch.utils._pytree",
        "named tuples are pytree nodes: the quick flatten leaves them to pytree",
    ),
    "suggest_memory_format": (
        "torch._prims_common",
        "the memory format C++ `suggest_memory_format` gives a tensor: cuDNN's batch norm "
        "makes its input contiguous in it",
    ),
}


def __getattr__(name: str):
    """The names of REEXPORTED, imported from their PyTorch module on first use."""
    if name not in REEXPORTED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(REEXPORTED[name][0]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *REEXPORTED])


# ---------------------------------------------------------------- fake tensors


def wrap_make_subclass(torch, make):
    """torch.Tensor._make_subclass, with which a Parameter subclass wraps its data
    (bitsandbytes' Params4bit), answered by make(original, cls, data, require_grad, **kwargs)
    until the returned undo is called."""
    original = torch.Tensor._make_subclass
    had = "_make_subclass" in torch.Tensor.__dict__

    def wrapped(cls, data, require_grad=False, **kwargs):
        return make(original, cls, data, require_grad, **kwargs)

    torch.Tensor._make_subclass = staticmethod(wrapped)

    def undo():
        if had:
            torch.Tensor._make_subclass = original
        else:
            del torch.Tensor._make_subclass

    return undo


def to_device(torch, *args, **kwargs):
    """The device a `Tensor.to(...)` call names, or None: its arguments parsed as Tensor.to
    parses them (torch._C._nn._parse_to)."""
    return torch._C._nn._parse_to(*args, **kwargs)[0]


def fake_tensor_limits() -> tuple:
    """The exceptions by which fake tensors say the trace cannot follow the code: it stops."""
    from torch._subclasses import fake_tensor

    return (
        fake_tensor.DataDependentOutputException,
        fake_tensor.DynamicOutputShapeException,
        fake_tensor.UnsupportedOperatorException,
    )


def unguarded_dispatch_mode():
    """TorchDispatchMode, less the torch.compile guard it puts around each subclass's
    __torch_dispatch__ (`_should_skip_dynamo`: two frame-evaluation swaps a call, at every
    operator of a trace that compiles nothing). Where the hook is missing, the class itself."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if not hasattr(TorchDispatchMode, "_should_skip_dynamo"):
        return TorchDispatchMode

    class UnguardedDispatchMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

    return UnguardedDispatchMode


def fake_device_answer():
    """The function by which FakeTensorMode answers prim.device for a fake tensor, args ->
    device (`_device_handler`): C++ asks a fake tensor's device several times an operator (a
    third of a decoder trace's calls), answered so without two dispatches."""
    from torch._subclasses import fake_tensor

    return fake_tensor._device_handler


def fake_holds_value(x) -> bool:
    """A fake tensor that keeps a real value beside it (`constant`: a small tensor made from
    data), which FakeTensorMode forgets when an operator writes into it."""
    return getattr(x, "constant", None) is not None


def dispatch_keys(torch, tensor):
    """The tensor's dispatch key set (hashable): which kernels PyTorch takes for it, and
    whether it is an inference tensor or autograd's zero tensor."""
    return torch._C._dispatch_key_set(tensor)


def creation_state(torch) -> tuple:
    """What besides its arguments shapes a new tensor, as FakeTensorMode's cache keys hold it:
    the default dtype and device, and whether inference mode is on."""
    return (
        torch.get_default_dtype(),
        torch._C._get_default_device(),
        torch.is_inference_mode_enabled(),
    )


def fake_outputs_recipe(torch, fake_mode, out, inputs) -> tuple | None:
    """(container, per output (shape, strides, dtype, device, requires_grad, bytes) or None)
    of an operator's outputs, from which fake_outputs makes them again; None unless `out` is
    one fake tensor, or a tuple or list of them and None, each on a new storage of its own at
    offset 0 that fake_outputs makes of the same bytes and with the same dispatch keys (as
    FakeTensorMode checks before it caches an output)."""
    from torch._subclasses.fake_tensor import FakeTensor

    container = type(out) if type(out) in (tuple, list) else None
    items = out if container else (out,)
    taken = {storage_key(x.untyped_storage()) for x in inputs if isinstance(x, torch.Tensor)}
    made = []
    for x in items:
        if x is None and container:
            made.append(None)
            continue
        if type(x) is not FakeTensor or x.layout != torch.strided or x.storage_offset():
            return None
        if x.is_conj() or x.is_neg() or x.constant is not None:
            return None
        key = storage_key(x.untyped_storage())
        if key in taken:
            return None
        taken.add(key)
        nbytes = x.untyped_storage().nbytes()
        made.append((tuple(x.shape), x.stride(), x.dtype, x.fake_device, x.requires_grad, nbytes))
    recipe = container, tuple(made)
    again = fake_outputs(torch, fake_mode, recipe)
    for x, y, m in zip(items, again if container else (again,), made, strict=True):
        if m is not None and (
            y.untyped_storage().nbytes() != m[5]
            or dispatch_keys(torch, x) != dispatch_keys(torch, y)
        ):
            return None
    return recipe


def fake_outputs(torch, fake_mode, recipe):
    """New fake tensors as fake_outputs_recipe describes them, made as FakeTensorMode makes
    an output from its dispatch cache: an empty meta tensor of that shape and those strides,
    wrapped."""
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    container, made = recipe
    outs = []
    with in_kernel_invocation_manager(fake_mode):
        for m in made:
            if m is None:
                outs.append(None)
                continue
            empty = torch.empty_strided(m[0], m[1], dtype=m[2], device="meta", requires_grad=m[4])
            outs.append(empty)
    outs = [
        None if e is None else FakeTensor(fake_mode, e, m[3])
        for e, m in zip(outs, made, strict=True)
    ]
    return container(outs) if container else outs[0]


def fake_view_recipe(torch, fake_mode, out, base) -> tuple | None:
    """(shape, strides, offset, dtype, device, requires_grad) of a view operator's output,
    from which fake_view makes it again; None unless it is one plain fake tensor on `base`'s
    storage that fake_view makes with the same dispatch keys (FakeTensorMode's own check
    before it caches an output: under inference mode a view of a normal tensor is normal,
    a tensor made anew is not)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if type(out) is not FakeTensor or type(base) is not FakeTensor:
        return None
    if out.layout != base.layout or out.is_conj() or out.is_neg() or out.constant is not None:
        return None
    if storage_key(out.untyped_storage()) != storage_key(base.untyped_storage()):
        return None
    recipe = (tuple(out.shape), out.stride(), out.storage_offset(), out.dtype, out.fake_device,
              out.requires_grad)  # fmt: skip
    made = fake_view(torch, fake_mode, base, *recipe)
    if dispatch_keys(torch, made) != dispatch_keys(torch, out):
        return None
    return recipe


def fake_view(torch, fake_mode, base, shape, stride, offset, dtype, device, requires_grad):
    """A fake tensor on `base`'s storage, made as FakeTensorMode makes a view operator's
    output from its dispatch cache (`_get_output_tensor_from_cache_entry`): an empty meta
    tensor of that shape and those strides, set to the storage, and wrapped."""
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    with in_kernel_invocation_manager(fake_mode):
        empty = torch.empty_strided(
            shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad
        )
        empty.set_(base.untyped_storage(), offset, shape, stride)
    return FakeTensor(fake_mode, empty, device)


def forget_converted_tensors(fake_mode) -> None:
    """Empties the fake mode's memo of converted tensors: its weak references would stop
    nn.Module.to()'s swaps."""
    memo = getattr(fake_mode.fake_tensor_converter, "meta_converter", None)
    if memo is not None and len(memo.tensor_memo):  # mostly empty: clear() would pop till
        memo.tensor_memo.clear()  # KeyError, at every operator call


# The fields of the fake mode's TensorMetadata, in order, as quicker_cache_keys fills them.
TENSOR_METADATA = (
    "dtype", "shape", "stride", "device", "layout", "memory_format", "storage_offset",
    "storage_bytes", "requires_grad", "is_quantized", "is_conj", "is_neg", "is_inference",
    "is_sparse", "is_coalesced", "dense_dim", "sparse_dim",
)  # fmt: skip


def quicker_cache_keys(torch):
    """The fake mode's dispatch cache keys, the same values made sooner; returns the undo.

    Every cached call reads each tensor argument's metadata (extract_tensor_metadata) and
    flattens it into its key (TensorMetadata._flatten_into: each field, a shape or strides
    through FakeTensorMode._prep_args_for_hash, which appends a tuple's type and length, then
    each plain int's type and value): a third of the 8B-class trace's time. Here a strided
    tensor's metadata is read without asking four times whether it is sparse, and a tuple of
    plain ints is appended in one step; anything else goes the original way, so each key
    holds the same items in the same order. Outside the versions read (check_version), or
    where a function is missing, nothing is changed."""
    import dataclasses
    import operator

    from torch._subclasses import fake_tensor

    metadata = getattr(fake_tensor, "TensorMetadata", None)
    original = getattr(metadata, "_flatten_into", None)
    extract = getattr(fake_tensor, "extract_tensor_metadata", None)
    suggest = getattr(fake_tensor, "suggest_memory_format", None)
    if check_version(torch) is not None or None in (original, extract, suggest):
        return lambda: None
    names = tuple(field.name for field in dataclasses.fields(metadata))
    if names != TENSOR_METADATA:  # another metadata than the one read
        return lambda: None
    sequences = (tuple, list, torch.Size)
    SymInt = torch.SymInt
    strided = torch.strided

    def extract_tensor_metadata(t):
        """extract_tensor_metadata(t), its sparse branches left out for a strided tensor."""
        if t.layout != strided:
            return extract(t)
        memory_format = suggest(t)
        if t._has_symbolic_sizes_strides or not t.is_contiguous(memory_format=memory_format):
            memory_format = None
        storage_offset = t.storage_offset()
        return metadata(
            t.dtype,
            t.shape,
            t.stride(),
            t.device,
            t.layout,
            memory_format,
            storage_offset,
            t.untyped_storage().nbytes(),
            t.requires_grad,
            t.is_quantized,
            t.is_conj(),
            t.is_neg(),
            t.is_inference(),
            t.is_sparse,
            None,
            None,
            None,
        )

    fields = operator.attrgetter(*names)
    # Types appended as they are by the original (neither a sequence nor a SymInt).
    plain = frozenset({bool, int, type(None), torch.dtype, torch.device, torch.layout,
                       torch.memory_format})  # fmt: skip

    def _flatten_into(self, result, mode, state) -> None:
        append = result.append
        for value in fields(self):
            kind = type(value)
            if kind in plain:
                append(value)
            elif isinstance(value, sequences):
                if all(type(item) is int for item in value):
                    append(kind)
                    append(f"length_{len(value)}")
                    for item in value:
                        append(int)
                        append(item)
                else:
                    mode._prep_args_for_hash(result, value, state, [])
            elif isinstance(value, SymInt):
                state.convert_sym_int(result, value)
            else:
                append(value)

    metadata._flatten_into = _flatten_into
    fake_tensor.extract_tensor_metadata = extract_tensor_metadata

    def undo():
        metadata._flatten_into = original
        fake_tensor.extract_tensor_metadata = extract

    return undo


def add_foreach_type(cls):
    """torch.optim takes its foreach kernels for tensors of `cls` too (fake parameters);
    returns the undo."""
    from torch.optim import optimizer

    supported = optimizer._foreach_supported_types
    supported.append(cls)
    return lambda: supported.remove(cls)


def add_optimizer_device(device: str):
    """torch.optim takes its foreach kernels, and accepts fused=True (the Trainer's default
    optimizer, adamw_torch_fused), on `device` too (a meta trace stands for a GPU; the fused
    kernels have meta implementations); returns the undo."""
    from torch.optim import optimizer

    names = ("_get_foreach_kernels_supported_devices", "_get_fused_kernels_supported_devices")
    originals = {name: getattr(optimizer, name) for name in names}
    for name, original in originals.items():
        setattr(optimizer, name, lambda original=original: [*original(), device])

    def undo():
        for name, original in originals.items():
            setattr(optimizer, name, original)

    return undo


def cudnn_rnn_operators(torch) -> tuple:
    """(_cudnn_rnn, _cudnn_rnn_backward): the operators a GPU's torch.lstm, gru and rnn_*
    call and autograd records, which the trace calls as the GPU does (cudnn_rnn.py)."""
    return torch.ops.aten._cudnn_rnn.default, torch.ops.aten._cudnn_rnn_backward.default


def pack_padded_operator(torch):
    """_pack_padded_sequence: what pack_padded_sequence calls, whose lengths' values the
    trace reads to pack as the GPU's kernel does (packed_sequences.py)."""
    return torch.ops.aten._pack_padded_sequence.default


def local_scalar_operator(torch):
    """_local_scalar_dense: a tensor's value read back to Python (`bool(t)`, `.item()`),
    which fake tensors refuse; the trace answers a value check with it (trace.recorder)."""
    return torch.ops.aten._local_scalar_dense.default


def reduction_number(torch, reduction: str) -> int:
    """A loss's reduction by name ("none", "mean", "sum") as the ATen operator takes it:
    what F.ctc_loss passes to torch.ctc_loss, with its warnings and its refusal."""
    return torch.nn._reduction.get_enum(reduction)


def fused_cell_operators(torch) -> dict:
    """The operators a GPU's LSTMCell and GRUCell call (RNN.cpp's CUDA branch), and the GRU
    backward autograd records, which has no meta kernel (fused_cells.py): by name."""
    aten = torch.ops.aten
    return {
        "lstm": aten._thnn_fused_lstm_cell.default,
        "gru": aten._thnn_fused_gru_cell.default,
        "gru_backward": aten._thnn_fused_gru_cell_backward.default,
    }


def fast_path_operators(torch) -> tuple:
    """(_transformer_encoder_layer_fwd, _native_multi_head_attention): the fused operators
    of nn.TransformerEncoderLayer's and nn.MultiheadAttention's inference fast path, which
    the trace calls as those modules do (fast_paths.py)."""
    aten = torch.ops.aten
    return aten._transformer_encoder_layer_fwd.default, aten._native_multi_head_attention.default


def add_fake_kernel(op, kernel):
    """Fake tensors take `kernel(fake_mode, op, *args, **kwargs)` for `op`, ahead of its meta
    kernel (cuDNN's recurrent layers: a reserve sized as on the GPU, and a backward that has
    no meta kernel) and of a Python decomposition, which the fake mode would run first
    (mse_loss's: a fresh scalar where a real run keeps the elementwise loss's block); returns
    the undo."""
    from torch._decomp import decomposition_table
    from torch._subclasses import fake_impls

    entry = (lambda func: func is op, kernel)
    forget_cached_calls(op)
    fake_impls.op_implementations_checks.insert(0, entry)
    decomposition = decomposition_table.pop(op, None)

    def undo():
        fake_impls.op_implementations_checks.remove(entry)
        if decomposition is not None:
            decomposition_table[op] = decomposition
        forget_cached_calls(op)

    return undo


def composite_kernel(torch, name: str, kernel):
    """`aten::name` decomposes into `kernel(*args)` in place of its C++ composite (registered
    at CompositeImplicitAutograd), also where C++ code calls it; returns the undo, which
    removes the registration (Library._destroy) and so brings the C++ one back."""
    import warnings

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        library.impl(name, kernel, "CompositeImplicitAutograd")
    forget_cached_calls(getattr(torch.ops.aten, name).default)
    return library._destroy


def never_cached(fake_mode, ops):
    """`fake_mode` computes each call of `ops` anew, never from its dispatch cache, whose
    entries remake an output from its shape, strides and dtype alone: a loss whose scalar
    keeps the elementwise loss's block (loss_outputs.py) came back from the cache with a
    scalar's. The mode's own check of a call's cache entry is wrapped, on this mode only;
    returns the undo."""
    from torch._subclasses import fake_tensor

    bypass = fake_tensor._BypassDispatchCache
    original = fake_mode._validate_cache_key
    ops = frozenset(ops)

    def validate(func, args, kwargs):
        if func in ops:
            raise bypass("a storage larger than its shape")
        return original(func, args, kwargs)

    fake_mode._validate_cache_key = validate
    for op in ops:  # entries made before (the cache is the class's, shared by every mode)
        forget_cached_calls(op)

    def undo():
        del fake_mode._validate_cache_key  # the class's method again
        for op in ops:
            forget_cached_calls(op)

    return undo


def forget_cached_calls(op) -> None:
    """Drops the fake mode's cached outputs of `op`: the dispatch cache is shared by every
    FakeTensorMode of the process and keyed by the call alone, so outputs made by one kernel
    would otherwise come back under another."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cache = FakeTensorMode.cache
    for key in [key for key in cache if getattr(key, "key", (None,))[0] is op]:
        del cache[key]


# ---------------------------------------------------------------- storages


def storage_expired(torch):
    """The test `key -> bool`: has the storage of this weak pointer (StorageWeakRef.cdata)
    gone? The recorder's frees."""
    return torch.UntypedStorage._expired


def storage_key(storage) -> int:
    """StorageWeakRef(storage).cdata, the storage's own pointer, without making and dropping a
    weak reference: the recorder asks whether it knows a storage at every tensor argument."""
    return storage._cdata


def storage_use_count(torch, storage) -> int:
    """How many references hold the storage: 2 from a tensor and its `untyped_storage()`
    object means nothing else does (a free, or a gradient summed in place)."""
    return torch._C._storage_Use_Count(storage._cdata)


def is_zero_tensor(tensor) -> bool:
    """A ZeroTensor (autograd's undefined gradient): the engine sums into it out of place."""
    return tensor._is_zerotensor()


# ---------------------------------------------------------------- operators


def schema_of(func):
    """The operator's schema: its name, arguments, returns and whether it mutates."""
    return func._schema


def has_composite_kernel(torch, func) -> bool:
    """Has the operator a C++ composite function (CompositeImplicitAutograd) to run instead?"""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def composite_function(torch, func, args, kwargs):
    """The operator's C++ composite function, the one a GPU runs. Not `OpOverload.decompose`:
    that prefers a Python decomposition where one is registered, and aten.dropout's clones its
    input outside training, where the C++ function returns the input itself (one block more
    per dropout in an eval model, and another arrangement of the blocks after it)."""
    return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


def verify_batch_size(torch, size) -> None:
    """F.batch_norm's own check in training (ValueError for one value per channel), made
    where the trace calls cuDNN's batch norm in place of F.batch_norm."""
    torch.nn.functional._verify_batch_size(size)


def autograd_node_running(torch) -> bool:
    """Is the operator called from a backward node (autograd's thread on a GPU)?"""
    return torch._C._current_autograd_node() is not None


def is_pytree_node(cls) -> bool:
    """Does pytree flatten objects of this type (a registered container)?"""
    from torch.utils import _pytree

    return cls in _pytree.SUPPORTED_NODES


def cpp_frames() -> list[dict]:
    """The calling thread's C++ frames, innermost first, named from the exported symbols
    (dladdr: a hundred times faster than addr2line): who called the operator being
    dispatched. Raises where the build has no unwinder."""
    from torch._C._profiler import gather_traceback, symbolize_tracebacks

    os.environ.setdefault("TORCH_SYMBOLIZE_MODE", "dladdr")
    (frames,) = symbolize_tracebacks([gather_traceback(False, False, True)])
    return frames


def fused_sdp_choice(torch, query, key, value, **options) -> int:
    """The SDPBackend value scaled_dot_product_attention would take for these tensors."""
    return torch._fused_sdp_choice(query, key, value, **options)


# ---------------------------------------------------------------- the CUDA allocator


def record_memory_history(torch, **options) -> None:
    """Starts recording the allocator's history of allocations and frees (the probes)."""
    torch.cuda.memory._record_memory_history(**options)


def stop_memory_history(torch) -> None:
    """Stops recording the allocator's history."""
    torch.cuda.memory._record_memory_history(enabled=None)


def memory_snapshot(torch) -> dict:
    """The allocator's segments and recorded history (`device_traces`, one list per GPU)."""
    return torch.cuda.memory._snapshot()


def cuda_in_bad_fork(torch) -> bool:
    """Was CUDA initialised in the parent of this forked process? It does not survive a fork:
    the launcher's child refuses to measure."""
    return torch.cuda._is_in_bad_fork()


def cublas_workspace_clearer(torch):
    """torch._C._cuda_clearCublasWorkspaces, or None in a build without it: a probe starts
    with no cuBLAS workspace kept, so that it sees the ones its operator allocates."""
    return getattr(torch._C, "_cuda_clearCublasWorkspaces", None)


# ---------------------------------------------------------------- CUDA autocast


def autocast_operators(torch, key: str = "AutocastCUDA") -> list[str]:
    """The operators that have a kernel of their own at an autocast dispatch key ("aten::mm",
    "aten::softmax.int"): those it casts; every other operator falls through it."""
    return sorted(torch._C._dispatch_get_registrations_for_dispatch_key(key))


def python_kernels(torch, key: str, kernels: dict, fallback):
    """Python kernels at the dispatch key `key`: `kernels` maps an operator's name ("mm",
    "softmax.int") to its kernel, `fallback` (torch.library.fallthrough_kernel, or a function
    `fallback(op, *args, **kwargs)`) serves every other operator. Returns the undo, which
    removes them (Library._destroy) and so brings back what was there before."""
    import warnings

    library = torch.library.Library("aten", "IMPL")
    every = torch.library.Library("_", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel"
        warnings.simplefilter("ignore")
        every.fallback(fallback, key)
        for name, kernel in kernels.items():
            library.impl(name, kernel, key)

    def undo() -> None:
        library._destroy()
        every._destroy()

    return undo


def dispatch_key_included(torch, key: str) -> bool:
    """Is `key` in this thread's dispatch keys (included, not excluded)?"""
    dispatch_key = getattr(torch._C.DispatchKey, key)
    return torch._C._dispatch_tls_is_dispatch_key_included(
        dispatch_key
    ) and not torch._C._dispatch_tls_is_dispatch_key_excluded(dispatch_key)


def dispatch_key_excluded(torch, key: str) -> bool:
    """Is `key` excluded from this thread's dispatch? Inside an autocast kernel its own key is
    (ExcludeDispatchKeyGuard, autocast_mode.h): the call it makes after its casts."""
    return torch._C._dispatch_tls_is_dispatch_key_excluded(getattr(torch._C.DispatchKey, key))


def include_dispatch_key(torch, key: str, on: bool) -> None:
    """Puts `key` in this thread's dispatch keys (on) or takes it out, as set_autocast_enabled
    does for a device's autocast key; autograd's backward carries the thread's keys along."""
    dispatch_key = getattr(torch._C.DispatchKey, key)
    torch._C._dispatch_tls_set_dispatch_key_included(dispatch_key, on)
    torch._C._dispatch_tls_set_dispatch_key_excluded(dispatch_key, not on)


class dispatch_key:  # a context manager, named as the action it takes
    """`with dispatch_key(torch, key, on):` the key included (on) or excluded for the block,
    as it was after."""

    def __init__(self, torch, key: str, on: bool) -> None:
        self.torch, self.key, self.on = torch, key, on

    def __enter__(self):
        C, key = self.torch._C, getattr(self.torch._C.DispatchKey, self.key)
        self.saved = (
            C._dispatch_tls_is_dispatch_key_included(key),
            C._dispatch_tls_is_dispatch_key_excluded(key),
        )
        C._dispatch_tls_set_dispatch_key_included(key, self.on)
        C._dispatch_tls_set_dispatch_key_excluded(key, not self.on)
        return self

    def __exit__(self, *exc) -> None:
        C, key = self.torch._C, getattr(self.torch._C.DispatchKey, self.key)
        C._dispatch_tls_set_dispatch_key_included(key, self.saved[0])
        C._dispatch_tls_set_dispatch_key_excluded(key, self.saved[1])


def outside_modes(torch):
    """A context where neither the torch function modes nor the dispatch modes of the moment
    see anything (a probe beside the trace, on tensors of its own)."""
    import contextlib

    from torch.utils._python_dispatch import _disable_current_modes

    stack = contextlib.ExitStack()
    stack.enter_context(_disable_current_modes())
    stack.enter_context(torch._C.DisableTorchFunction())
    return stack


def no_torch_function(torch):
    """A context where no torch function mode or subclass's __torch_function__ is asked."""
    return torch._C.DisableTorchFunction()


def torch_function_modes(torch) -> list:
    """The torch function modes in force, outermost first."""
    return torch.overrides._get_current_function_mode_stack()


def is_view(tensor) -> bool:
    """Is the tensor a view of another's storage (autograd's view tracking)?"""
    return tensor._is_view()


def enable_autocast_context(context, enabled: bool) -> None:
    """Sets whether an autocast context manager enables autocast when entered (its
    `_enabled`, which __init__ turned off for CUDA without a GPU)."""
    context._enabled = enabled


def patch_grad_scaler_step(torch, replacement):
    """GradScaler.step takes the optimizer's step through `_maybe_opt_step(optimizer,
    optimizer_state, *args, **kwargs)`, which reads the found-inf flags back to Python:
    `replacement` (same arguments, the scaler first) runs in its place. Returns the undo."""
    scaler = torch.amp.GradScaler
    original = scaler._maybe_opt_step
    scaler._maybe_opt_step = replacement

    def undo() -> None:
        scaler._maybe_opt_step = original

    return undo


def patch_checkpoint_autocast_kwargs(torch, replacement):
    """torch.utils.checkpoint reads the autocast state of the checkpointed call's device
    (`_get_autocast_kwargs(device_type)`) and restores it around the recomputation:
    `replacement(original, device_type)` answers in its place. Returns the undo."""
    from torch.utils import checkpoint

    original = checkpoint._get_autocast_kwargs
    checkpoint._get_autocast_kwargs = lambda device_type="cuda": replacement(original, device_type)

    def undo() -> None:
        checkpoint._get_autocast_kwargs = original

    return undo
