"""Each private PyTorch API the pipeline needs (torch_private.py) held to the behaviour the
trace and the probes rely on, on the PyTorch at hand: a new release that changes one fails
its own test here, by name, before any prediction moves."""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import importlib
import subprocess
import sys
import types

import pytest
from conftest import PIPELINE

from pipeline.core import torch_private as tpv
from pipeline.kit import make_kit_script

torch = pytest.importorskip("torch")
aten = torch.ops.aten


def calls_seen(run):
    """(operator, autograd node running?) of each operator call `run()` makes."""
    seen = []

    class Seen(tpv.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((func, tpv.autograd_node_running(torch)))
            return func(*args, **(kwargs or {}))

    with Seen():
        run()
    return seen


# ---------------------------------------------------------------- the version check


@pytest.mark.parametrize(
    ("version", "warned"),
    [
        ("2.9.0", True),
        ("2.10.1", True),
        ("2.11.0+cu130", False),
        ("2.12.1", False),
        ("2.13.0", False),
        ("2.13.0+cpu", False),
        ("2.14.0a0+git1234", True),
        ("3.0.0", True),
        ("nightly", True),
    ],
)
def test_check_version_warns_outside_the_versions_read(version, warned):
    warning = tpv.check_version(types.SimpleNamespace(__version__=version))
    if warned:
        assert warning is not None
        assert "\n" not in warning
        assert version in warning
        assert "2.11 to 2.13" in warning
    else:
        assert warning is None


def test_the_trace_notes_a_pytorch_outside_the_versions_read(monkeypatch):
    from pipeline.predicting import trace_prediction as tp

    def drive(phase):
        phase("one", lambda: torch.ones(4, device="meta") + 1)

    assert tpv.VERSION_NOTE not in tp.run_trace(torch, "meta", drive).notes
    monkeypatch.setattr(torch, "__version__", "2.9.0")
    notes = tp.run_trace(torch, "meta", drive).notes
    assert notes[tpv.VERSION_NOTE] == tpv.check_version(torch)


def test_the_module_imports_without_torch_and_imports_nothing_on_import():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pipeline.core import torch_private\n"
        "print(torch_private.check_version(type('T', (), {'__version__': '2.12.0'})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "None\n"


# ---------------------------------------------------------------- names re-exported


@pytest.mark.parametrize("name", sorted(tpv.REEXPORTED))
def test_each_reexported_name_is_pytorchs_own(name):
    module, why = tpv.REEXPORTED[name]
    assert getattr(tpv, name) is getattr(importlib.import_module(module), name)
    assert why


def test_a_name_not_reexported_is_an_attribute_error():
    with pytest.raises(AttributeError):
        tpv.no_such_name  # noqa: B018


def test_fake_tensor_mode_makes_tensors_without_memory():
    with tpv.FakeTensorMode(allow_non_fake_inputs=False, allow_fallback_kernels=False):
        x = torch.empty(2**40, dtype=torch.uint8, device="meta")  # a tebibyte
        y = x + 1
    assert isinstance(y, tpv.FakeTensor)
    assert y.untyped_storage().nbytes() == 2**40
    assert y.untyped_storage() is not x.untyped_storage()


def test_fake_tensor_tells_the_modes_tensors_from_real_meta_ones():
    with tpv.FakeTensorMode():
        fake = torch.empty(4, device="meta")
    assert isinstance(fake, tpv.FakeTensor)
    assert not isinstance(torch.empty(4, device="meta"), tpv.FakeTensor)


def test_unset_fake_temporarily_makes_real_tensors_inside_the_mode():
    with tpv.FakeTensorMode():
        with tpv.unset_fake_temporarily():
            real = torch.empty(4, device="meta")
        fake = torch.empty(4, device="meta")
    assert not isinstance(real, tpv.FakeTensor)
    assert isinstance(fake, tpv.FakeTensor)


def test_a_dispatch_mode_sees_each_operator_call():
    a, b = torch.ones(2), torch.ones(2)
    assert [func for func, _ in calls_seen(lambda: torch.mul(a + b, 2))] == [
        aten.add.Tensor,
        aten.mul.Tensor,
    ]


def test_an_unguarded_dispatch_modes_subclass_keeps_its_own_dispatch_and_sees_each_call():
    seen = []

    class Seen(tpv.unguarded_dispatch_mode()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    raw = Seen.__dict__["__torch_dispatch__"]
    assert getattr(raw, "__wrapped__", raw) is raw  # not PyTorch's torch.compile guard
    with Seen():
        torch.ones(2) + 1
    assert seen == [aten.ones.default, aten.add.Tensor]


def test_a_plain_dispatch_modes_subclass_is_wrapped_in_the_guard_the_unguarded_leaves_out():
    class Plain(tpv.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert Plain.__dict__["__torch_dispatch__"].__wrapped__ is not None


def test_fake_device_answer_is_the_device_the_fake_mode_gives():
    answer = tpv.fake_device_answer()
    with tpv.FakeTensorMode() as mode:
        x = torch.empty(3, device="meta")
        y = mode.from_tensor(torch.ones(2))  # a fake CPU tensor
        assert answer((x,)) == torch.ops.prim.device.default(x) == torch.device("meta")
        assert answer((y,)) == torch.ops.prim.device.default(y) == torch.device("cpu")


def test_fake_holds_value_for_a_small_tensor_made_from_data_only():
    with tpv.FakeTensorMode():
        made = torch.tensor(2.0)  # lift_fresh of one element: the fake mode keeps its value
        empty = torch.empty(2)
    assert tpv.fake_holds_value(made)
    assert not tpv.fake_holds_value(empty)
    assert not tpv.fake_holds_value(3)


def test_creation_state_follows_the_default_dtype_and_inference_mode():
    plain = tpv.creation_state(torch)
    assert plain == (torch.float32, "cpu", False)
    with torch.inference_mode():
        assert tpv.creation_state(torch)[2] is True
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert tpv.creation_state(torch)[0] == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_fake_outputs_make_new_tensors_as_the_fake_mode_made_them():
    with tpv.FakeTensorMode() as mode:
        x = torch.empty(4, 6, device="meta")
        values, indices = aten.max.dim(x, 1)
        recipe = tpv.fake_outputs_recipe(torch, mode, (values, indices), [x])
        again = tpv.fake_outputs(torch, mode, recipe)
        product = x @ x.t()
        single = tpv.fake_outputs(torch, mode, tpv.fake_outputs_recipe(torch, mode, product, [x]))
    assert type(again) is tuple
    assert len(again) == 2
    for made, original in zip((*again, single), (values, indices, product), strict=True):
        assert type(made) is tpv.FakeTensor
        assert (made.shape, made.stride(), made.dtype) == (
            original.shape, original.stride(), original.dtype
        )  # fmt: skip
        assert made.untyped_storage().nbytes() == original.untyped_storage().nbytes()
        assert tpv.storage_key(made.untyped_storage()) != tpv.storage_key(
            original.untyped_storage()
        )


def test_fake_outputs_recipe_is_none_for_an_output_on_an_inputs_or_anothers_storage():
    with tpv.FakeTensorMode() as mode:
        x = torch.empty(4, device="meta")
        assert tpv.fake_outputs_recipe(torch, mode, x, [x]) is None  # an input returned
        y = torch.empty(8, device="meta")
        assert tpv.fake_outputs_recipe(torch, mode, (y[:4], y[4:]), [x]) is None  # shared
        assert tpv.fake_outputs_recipe(torch, mode, y[4:], [x]) is None  # at an offset
        assert tpv.fake_outputs_recipe(torch, mode, 3, [x]) is None  # not a tensor
        assert tpv.fake_outputs_recipe(torch, mode, (y, None), [x]) is not None


def test_dispatch_keys_tell_inference_and_zero_tensors_from_normal_ones():
    normal = tpv.dispatch_keys(torch, torch.ones(2))
    assert normal == tpv.dispatch_keys(torch, torch.ones(3, dtype=torch.int64))
    with torch.inference_mode():
        assert tpv.dispatch_keys(torch, torch.ones(2)) != normal
    assert tpv.dispatch_keys(torch, aten._efficientzerotensor([2])) != normal
    assert hash(normal) == hash(tpv.dispatch_keys(torch, torch.ones(2)))


def test_fake_view_makes_the_view_the_fake_mode_makes_on_the_same_storage():
    with tpv.FakeTensorMode() as mode:
        base = torch.empty(4, 6, device="meta")
        view = base.t()[1:, :3]
        recipe = tpv.fake_view_recipe(torch, mode, view, base)
        again = tpv.fake_view(torch, mode, base, *recipe)
        other = torch.empty(4, 6, device="meta")
        elsewhere = tpv.fake_view(torch, mode, other, *recipe)
    assert recipe == ((5, 3), (1, 6), 1, torch.float32, torch.device("meta"), False)
    assert type(again) is tpv.FakeTensor
    for made, on in ((again, base), (elsewhere, other)):
        assert (made.shape, made.stride(), made.storage_offset()) == (
            view.shape, view.stride(), view.storage_offset()
        )  # fmt: skip
        assert tpv.storage_key(made.untyped_storage()) == tpv.storage_key(on.untyped_storage())


def test_fake_view_recipe_is_none_for_an_output_on_its_own_storage():
    with tpv.FakeTensorMode() as mode:
        base = torch.empty(4, device="meta")
        assert tpv.fake_view_recipe(torch, mode, base + 1, base) is None
        assert tpv.fake_view_recipe(torch, mode, base[1:], base) is not None
    real = torch.ones(2)
    assert tpv.fake_view_recipe(torch, mode, real[1:], real) is None  # not fake


def test_fake_view_recipe_is_none_where_the_view_made_again_would_have_other_dispatch_keys():
    """Under inference mode the view of a normal tensor is normal; one made anew would be an
    inference tensor (autograd then refuses to share the base's version counter)."""
    with tpv.FakeTensorMode() as mode:
        base = torch.zeros(1, 4, 8, device="meta")
        with torch.inference_mode():
            view = base.expand(2, -1, -1)
            assert tpv.fake_view_recipe(torch, mode, view, base) is None
            inner = torch.zeros(1, 4, 8, device="meta")
            assert tpv.fake_view_recipe(torch, mode, inner.expand(2, -1, -1), inner) is not None


def test_storage_weak_refs_key_a_storage_whichever_tensor_holds_it():
    x = torch.ones(8)
    view, other = x[2:], torch.ones(8)
    key = tpv.StorageWeakRef(x.untyped_storage()).cdata
    assert tpv.StorageWeakRef(view.untyped_storage()).cdata == key
    assert tpv.StorageWeakRef(other.untyped_storage()).cdata != key


def test_tree_flatten_and_unflatten_give_the_call_back():
    a, b = torch.ones(1), torch.zeros(2)
    call = ((a, [b, None, 3]), {"dim": -1, "dtype": torch.float16})
    leaves, spec = tpv.tree_flatten(call)
    assert leaves == [a, b, None, 3, -1, torch.float16]
    rebuilt = tpv.tree_unflatten(leaves, spec)
    assert rebuilt[0][0] is a
    assert rebuilt[0][1] == [b, None, 3]
    assert rebuilt[1] == call[1]


def test_tree_map_replaces_each_leaf():
    a = torch.ones(1)
    assert tpv.tree_map(lambda x: "t" if isinstance(x, torch.Tensor) else x, ([a, 1], {})) == (
        ["t", 1],
        {},
    )


def test_is_namedtuple_class_tells_named_tuples():
    assert tpv.is_namedtuple_class(collections.namedtuple("Pair", "a b"))
    assert not tpv.is_namedtuple_class(tuple)


def test_is_pytree_node_names_the_containers_pytree_flattens():
    assert all(tpv.is_pytree_node(cls) for cls in (tuple, list, dict))
    assert not any(tpv.is_pytree_node(cls) for cls in (int, str, torch.Tensor))


# ---------------------------------------------------------------- fake tensors


def test_fake_tensor_limits_are_what_a_value_dependent_shape_raises():
    limits = tpv.fake_tensor_limits()
    assert len(limits) == 3
    with tpv.FakeTensorMode():
        x = torch.empty(4, device="meta")
        with pytest.raises(limits) as dynamic:
            torch.nonzero(x)
        with pytest.raises(limits) as data:
            x.sum().item()
    assert type(dynamic.value) is not type(data.value)


def test_forget_converted_tensors_empties_the_fake_modes_memo():
    fake = tpv.FakeTensorMode()
    real = torch.ones(3)
    converted = fake.from_tensor(real)  # the memo holds it weakly
    memo = fake.fake_tensor_converter.meta_converter.tensor_memo
    assert len(memo) == 1
    tpv.forget_converted_tensors(fake)
    assert len(memo) == 0
    assert isinstance(converted, tpv.FakeTensor)


def cache_key_items(mode, args) -> list:
    """The items of the fake mode's dispatch cache key for aten.add on these arguments."""
    from torch._subclasses.fake_tensor import _CacheKeyState

    state = _CacheKeyState(mode.shape_env)
    return list(mode._cache_key(state, aten.add.Tensor, args, {}).key)


def test_quicker_cache_keys_make_the_same_keys_and_undo():
    from torch._subclasses import fake_tensor
    from torch._subclasses.fake_tensor import TensorMetadata

    original = TensorMetadata._flatten_into
    mode = tpv.FakeTensorMode()
    with mode:
        x = torch.empty(3, 4, 5, dtype=torch.bfloat16)
        calls = [
            (x, x),
            (x.transpose(0, 2), 2.0),
            (x[1:, ::2], torch.empty(1, 1, dtype=torch.float32)),
            (torch.empty(()), torch.empty(0, 7, device="meta")),
        ]
    tensors = [
        *(x for args in calls for x in args if isinstance(x, torch.Tensor)),
        torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
        torch.empty(2, 3).t(),
        torch.eye(3).to_sparse(),
    ]
    extract = fake_tensor.extract_tensor_metadata
    before = [cache_key_items(mode, args) for args in calls]
    metadata_before = [extract(x) for x in tensors]
    undo = tpv.quicker_cache_keys(torch)
    try:
        assert TensorMetadata._flatten_into is not original
        assert fake_tensor.extract_tensor_metadata is not extract
        after = [cache_key_items(mode, args) for args in calls]
        metadata_after = [fake_tensor.extract_tensor_metadata(x) for x in tensors]
    finally:
        undo()
    assert TensorMetadata._flatten_into is original
    assert fake_tensor.extract_tensor_metadata is extract
    assert metadata_after == metadata_before
    assert [m.memory_format for m in metadata_after[-3:]] == [torch.channels_last, None, None]
    fields = tuple(field.name for field in dataclasses.fields(TensorMetadata))
    assert fields == tpv.TENSOR_METADATA  # else the patch stands aside: the trace is slower
    assert [[(type(v), v) for v in key] for key in after] == [
        [(type(v), v) for v in key] for key in before
    ]
    # The original way where a shape holds anything but plain ints.
    fast = []
    metadata = TensorMetadata(torch.float32, (2, True), [3], *[None] * 14)
    undo = tpv.quicker_cache_keys(torch)
    try:
        metadata._flatten_into(fast, mode, None)
    finally:
        undo()
    slow = []
    metadata._flatten_into(slow, mode, None)
    assert [(type(v), v) for v in fast] == [(type(v), v) for v in slow]


def test_quicker_cache_keys_change_nothing_outside_the_versions_read():
    from torch._subclasses.fake_tensor import TensorMetadata

    original = TensorMetadata._flatten_into
    old = types.SimpleNamespace(__version__="2.9.0", Size=torch.Size, SymInt=torch.SymInt)
    undo = tpv.quicker_cache_keys(old)
    assert TensorMetadata._flatten_into is original
    undo()
    assert TensorMetadata._flatten_into is original


def test_add_foreach_type_lets_the_optimizers_take_foreach_for_it_and_undoes():
    from torch.optim import optimizer

    undo = tpv.add_foreach_type(tpv.FakeTensor)
    try:
        assert tpv.FakeTensor in optimizer._foreach_supported_types
    finally:
        undo()
    assert tpv.FakeTensor not in optimizer._foreach_supported_types


def test_add_optimizer_device_lets_the_optimizers_take_foreach_there_and_undoes():
    from torch.optim import optimizer

    original = optimizer._get_foreach_kernels_supported_devices
    undo = tpv.add_optimizer_device("meta")
    try:
        assert optimizer._get_foreach_kernels_supported_devices() == [*original(), "meta"]
    finally:
        undo()
    assert optimizer._get_foreach_kernels_supported_devices is original


def test_fake_parameters_on_meta_take_the_foreach_kernels_with_both():
    """What the tracer's patch is for: torch.optim's own choice, as on a GPU."""
    from torch.optim import optimizer

    with tpv.FakeTensorMode():
        parameter = torch.nn.Parameter(torch.empty(4, device="meta"))
    assert optimizer._default_to_fused_or_foreach([parameter], False, False) == (False, False)
    undo = [tpv.add_foreach_type(tpv.FakeTensor), tpv.add_optimizer_device("meta")]
    try:
        assert optimizer._default_to_fused_or_foreach([parameter], False, False) == (False, True)
    finally:
        for step in reversed(undo):
            step()


# ---------------------------------------------------------------- storages


def test_storage_expired_says_when_the_last_reference_went():
    expired = tpv.storage_expired(torch)
    x = torch.ones(8)
    ref = tpv.StorageWeakRef(x.untyped_storage())  # kept, as the recorder keeps it
    view = x[1:]
    del x
    assert not expired(ref.cdata)  # the view holds the storage
    del view
    assert expired(ref.cdata)


def test_storage_key_is_the_weak_refs_key_whichever_tensor_holds_the_storage():
    x = torch.empty(4)
    key = tpv.storage_key(x.untyped_storage())
    assert key == tpv.StorageWeakRef(x.untyped_storage()).cdata
    assert tpv.storage_key(x[1:].untyped_storage()) == key
    assert tpv.storage_key(torch.empty(4).untyped_storage()) != key


def test_storage_use_count_is_two_for_a_tensor_alone_and_more_with_a_view():
    x = torch.ones(8)
    storage = x.untyped_storage()
    assert tpv.storage_use_count(torch, storage) == 2  # x and `storage`
    view = x[1:]
    assert tpv.storage_use_count(torch, storage) == 3
    del view
    assert tpv.storage_use_count(torch, storage) == 2


def test_is_zero_tensor_tells_autograds_zero_tensors():
    assert tpv.is_zero_tensor(torch._efficientzerotensor(2))
    assert not tpv.is_zero_tensor(torch.zeros(2))


# ---------------------------------------------------------------- operators


def test_schema_of_gives_the_name_arguments_returns_and_mutability():
    schema = tpv.schema_of(aten.add.Tensor)
    assert schema.name == "aten::add"
    assert [a.name for a in schema.arguments] == ["self", "other", "alpha"]
    assert not schema.is_mutable
    assert tpv.schema_of(aten.add_.Tensor).is_mutable
    returns = tpv.schema_of(aten._scaled_dot_product_efficient_attention.default).returns
    assert [r.name for r in returns][-2:] == ["philox_seed", "philox_offset"]


def test_has_composite_kernel_for_layer_norm_not_for_mm():
    assert tpv.has_composite_kernel(torch, aten.layer_norm.default)
    assert tpv.has_composite_kernel(torch, aten.dropout.default)
    assert not tpv.has_composite_kernel(torch, aten.mm.default)


def test_composite_function_of_dropout_outside_training_returns_the_input_itself():
    """The C++ function a GPU runs; PyTorch's Python decomposition clones instead."""
    x = torch.ones(3)
    assert tpv.composite_function(torch, aten.dropout.default, (x, 0.5, False), {}) is x
    assert aten.dropout.default.decompose(x, 0.5, False) is not x


def test_composite_function_makes_the_inner_calls():
    x = torch.ones(2, 8)
    seen = calls_seen(lambda: tpv.composite_function(torch, aten.layer_norm.default, (x, [8]), {}))
    assert aten.native_layer_norm.default in [func for func, _ in seen]
    assert aten.layer_norm.default not in [func for func, _ in seen]


def test_autograd_node_running_in_backward_only():
    a = torch.ones(3, requires_grad=True)
    loss = []
    forward = calls_seen(lambda: loss.append((a * 2).sum()))
    backward = calls_seen(lambda: loss[0].backward())
    assert [func for func, _ in forward] == [aten.mul.Tensor, aten.sum.default]
    assert not any(running for _, running in forward)
    assert [running for func, running in backward if func == aten.mul.Tensor] == [True]
    assert not tpv.autograd_node_running(torch)


def test_cpp_frames_name_the_operators_caller():
    names = []

    class Frames(tpv.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.add.Tensor:
                names.extend(frame["name"] for frame in tpv.cpp_frames())
            return func(*args, **(kwargs or {}))

    with Frames():
        torch.ones(2) + torch.ones(2)
    entries = [i for i, name in enumerate(names) if name.startswith("at::_ops::add_Tensor::call(")]
    assert entries
    assert entries[-1] + 1 < len(names)  # a caller after it, as trace_prediction.cpp_caller reads


def test_fused_sdp_choice_names_an_sdp_backend():
    from torch.nn.attention import SDPBackend

    q = torch.randn(2, 4, 8, 16)
    choice = tpv.fused_sdp_choice(torch, q, q, q, is_causal=True, enable_gqa=False)
    assert choice in {member.value for member in SDPBackend.__members__.values()}
    assert choice == torch._fused_sdp_choice(q, q, q, is_causal=True, enable_gqa=False)


# ---------------------------------------------------------------- the CUDA allocator


def test_the_memory_history_functions_exist_in_this_pytorch():
    for name in ("_record_memory_history", "_snapshot"):
        assert callable(getattr(torch.cuda.memory, name))


def test_record_and_stop_memory_history_forward_to_pytorch(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(kw))
    tpv.record_memory_history(torch, enabled="all", context=None, max_entries=10)
    tpv.stop_memory_history(torch)
    assert calls == [{"enabled": "all", "context": None, "max_entries": 10}, {"enabled": None}]


def test_memory_snapshot_is_pytorchs(monkeypatch):
    snapshot = {"segments": [], "device_traces": [[]]}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)
    assert tpv.memory_snapshot(torch) is snapshot


@pytest.mark.gpu
def test_the_memory_history_records_an_allocation_on_a_gpu():
    device = torch.device("cuda", torch.cuda.current_device())
    tpv.record_memory_history(torch, enabled="all", context=None)
    try:
        x = torch.empty(3 * 2**20 + 512, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        events = tpv.memory_snapshot(torch)["device_traces"][device.index]
    finally:
        tpv.stop_memory_history(torch)
    assert any(e["action"] == "alloc" and e["addr"] == x.data_ptr() for e in events)


def test_cuda_in_bad_fork_is_false_in_a_process_that_forked_nothing():
    assert tpv.cuda_in_bad_fork(torch) is False
    flagged = types.SimpleNamespace(cuda=types.SimpleNamespace(_is_in_bad_fork=lambda: True))
    assert tpv.cuda_in_bad_fork(flagged) is True


def test_cublas_workspace_clearer_is_the_builds_or_none():
    def clear():
        return None

    with_it = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_clearCublasWorkspaces=clear))
    assert tpv.cublas_workspace_clearer(with_it) is clear
    assert tpv.cublas_workspace_clearer(types.SimpleNamespace(_C=types.SimpleNamespace())) is None
    found = tpv.cublas_workspace_clearer(torch)
    assert found is getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if torch.version.cuda:
        assert callable(found)


# ---------------------------------------------------------------- one place


# The kit stands alone: not held to this, nor are the package modules its script is generated
# from (they cannot import torch_private.py: the kit carries their code).
KIT = {"mesure_memoire.py", "calcul_forfaits.py", *(p.name for p in make_kit_script.SOURCES)}
PRIVATE_ATTRIBUTES = {
    "_schema", "_op_dk", "_cdata", "_expired", "_is_zerotensor", "_storage_Use_Count",
    "_current_autograd_node", "_record_memory_history", "_snapshot", "_fused_sdp_choice",
    "_foreach_supported_types", "_get_foreach_kernels_supported_devices", "_is_in_bad_fork",
}  # fmt: skip


def private_uses(tree) -> list[str]:
    """Imports of torch's private modules or names, attributes that start with `_` on a chain
    from the name `torch` (dunders aside), and the private attributes the pipeline used."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            names = [*node.module.split("."), *(alias.name for alias in node.names)]
            found += [f"from {node.module} import" for name in names if name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("torch.") and "._" in a.name]
        elif isinstance(node, ast.Attribute):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            rooted = isinstance(base, ast.Name) and base.id == "torch"
            private = [a for a in chain if a.startswith("_") and not a.startswith("__")]
            if (rooted and private) or node.attr in PRIVATE_ATTRIBUTES:
                found.append(".".join(reversed(chain)))
    return found


def test_the_pipeline_reaches_pytorchs_private_apis_through_torch_private_only():
    found = {
        str(path.relative_to(PIPELINE)): uses
        for path in sorted(PIPELINE.rglob("*.py"))
        if path.name not in KIT | {"torch_private.py"}
        and (uses := private_uses(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}


def test_suggest_memory_format_is_channels_last_for_a_channels_last_tensor_only():
    x = torch.empty(2, 3, 4, 5, device="meta")
    assert tpv.suggest_memory_format(x) == torch.contiguous_format
    assert tpv.suggest_memory_format(x.to(memory_format=torch.channels_last)) == (
        torch.channels_last
    )


def test_verify_batch_size_refuses_one_value_per_channel_only():
    tpv.verify_batch_size(torch, torch.Size([2, 8, 1, 1]))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        tpv.verify_batch_size(torch, torch.Size([1, 8, 1, 1]))


def test_cudnn_rnn_operators_have_a_meta_kernel_that_gives_no_reserve_and_a_backward_without():
    """Why the trace brings its own fake kernels (cudnn_rnn.py): the meta kernel of
    _cudnn_rnn makes a 0-byte reserve in training, and its backward has none at all."""
    forward, backward = tpv.cudnn_rnn_operators(torch)
    assert (forward.name(), backward.name()) == ("aten::_cudnn_rnn", "aten::_cudnn_rnn_backward")
    x = torch.empty(5, 3, 8, device="meta")
    weights = [torch.empty(n, device="meta") for n in ((64, 8), (64, 16), (64,), (64,))]
    hx, cx = torch.empty(1, 3, 16, device="meta"), torch.empty(1, 3, 16, device="meta")
    flat = torch.empty(64 * 26, device="meta")
    out = forward(x, weights, 4, flat, hx, cx, 2, 16, 0, 1, False, 0.0, True, False, [], None)
    assert [tuple(t.shape) for t in out[:4]] == [(5, 3, 16), (1, 3, 16), (1, 3, 16), (0,)]
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(backward.name(), "Meta")


def test_a_fake_kernel_added_is_taken_ahead_of_the_meta_kernel_and_removed_by_its_undo():
    forward, _ = tpv.cudnn_rnn_operators(torch)
    seen = []

    def kernel(fake_mode, func, *args, **kwargs):
        seen.append(func)
        with fake_mode:
            return tuple(torch.empty(n, device="meta") for n in (1, 2, 3, 4, 5))

    args = (torch.empty(5, 3, 8), [torch.empty(64, 8)], 2, None, torch.empty(1, 3, 16), None,
            1, 16, 0, 1, False, 0.0, True, False, [], None)  # fmt: skip

    def run():
        with tpv.FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake[1] = [mode.from_tensor(w) for w in args[1]]
            return [None if t is None else t.numel() for t in forward(*fake)]

    undo = tpv.add_fake_kernel(forward, kernel)
    try:
        assert run() == [1, 2, 3, 4, 5]
        assert seen == [forward]
    finally:
        undo()
    assert run()[3] == 0
    assert seen == [forward]


def test_the_fused_cell_operators_have_the_arguments_fused_cells_reads():
    """fused_cells.by_source_template reads `workspace` and `has_bias` of the backwards; the
    LSTM's forward has a meta kernel, the GRU's two operators none (the trace adds its own)."""
    operators = tpv.fused_cell_operators(torch)
    names = {key: [a.name for a in op._schema.arguments] for key, op in operators.items()}
    assert names["lstm"] == ["input_gates", "hidden_gates", "cx", "input_bias", "hidden_bias"]
    assert names["gru"] == ["input_gates", "hidden_gates", "hx", "input_bias", "hidden_bias"]
    assert names["gru_backward"] == ["grad_hy", "workspace", "has_bias"]
    backward = torch.ops.aten._thnn_fused_lstm_cell_backward_impl.default
    assert [a.name for a in backward._schema.arguments][-2:] == ["workspace", "has_bias"]
    gates, bias = torch.empty(4, 32, device="meta"), torch.empty(32, device="meta")
    hy, cy, workspace = operators["lstm"](
        gates, gates, torch.empty(4, 8, device="meta"), bias, bias
    )
    assert (hy.shape, cy.shape, workspace.shape) == ((4, 8), (4, 8), (4, 32))
    with pytest.raises(NotImplementedError):
        operators["gru"](gates[:, :24], gates[:, :24], torch.empty(4, 8, device="meta"))


def test_the_fast_path_operators_take_what_the_modules_give_them():
    """fast_paths.scratch_terms reads src, num_heads and ffn_weight_1, and query, key and
    num_head; both operators have meta kernels that make the outputs."""
    layer, attention = tpv.fast_path_operators(torch)
    layer_names = [a.name for a in layer._schema.arguments]
    assert layer_names[:3] == ["src", "embed_dim", "num_heads"]
    assert "ffn_weight_1" in layer_names
    assert [a.name for a in attention._schema.arguments][:5] == [
        "query", "key", "value", "embed_dim", "num_head"
    ]  # fmt: skip
    m = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    out, weights = attention(m(2, 5, 16), m(2, 5, 16), m(2, 5, 16), 16, 4, m(48, 16), m(48),
                             m(16, 16), m(16), None, True, True, None)  # fmt: skip
    assert (out.shape, weights.shape) == ((2, 5, 16), (2, 5, 5))


def test_never_cached_makes_the_fake_mode_compute_each_call_anew_on_that_mode_only():
    """The fake mode's own check of a cache entry (_validate_cache_key, an instance method
    wrapped on the one mode) refuses the named operators: each call bypasses the cache, which
    would remake its output from shape alone; other operators are cached as before, and the
    undo gives the mode its class's method back and the operators their caching."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    add, mul = torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor
    mode, other = FakeTensorMode(), FakeTensorMode()
    undo = tpv.never_cached(mode, [add])
    reason = "a storage larger than its shape"
    try:
        with mode:
            x = torch.empty(3, 4, device="meta")
            before, hits = FakeTensorMode.cache_bypasses[reason], FakeTensorMode.cache_hits
            for _ in range(3):
                add(x, x)
            assert FakeTensorMode.cache_hits == hits  # never answered from the cache
            assert FakeTensorMode.cache_bypasses[reason] > before
            mul(x, x), mul(x, x)
            assert FakeTensorMode.cache_hits > hits  # mul: cached as ever
    finally:
        undo()
    assert "_validate_cache_key" not in vars(mode)
    with other:  # the cache's entries for add (one shared by every mode) forgotten: cached again
        y = torch.empty(3, 4, device="meta")
        add(y, y)
        hits = FakeTensorMode.cache_hits
        add(y, y)
        assert FakeTensorMode.cache_hits == hits + 1


def operators_called(run) -> list:
    """The operators `run()` dispatches, in order, on real tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Seen():
        run()
    return seen


def test_the_pack_operator_is_what_pack_padded_sequence_calls_and_fake_tensors_refuse():
    """Why the trace packs for itself (packed_sequences.py): the operator reads its lengths'
    values, which fake tensors do not have."""
    from torch.nn.utils.rnn import pack_padded_sequence

    op = tpv.pack_padded_operator(torch)
    assert op in operators_called(lambda: pack_padded_sequence(torch.randn(3, 2, 4), [3, 2]))
    with tpv.FakeTensorMode(), pytest.raises(tpv.fake_tensor_limits()):
        op(torch.empty(3, 2, 4), torch.tensor([3, 2]), False)


@pytest.mark.parametrize(("name", "number"), [("none", 0), ("mean", 1), ("sum", 2)])
def test_a_reductions_number_is_what_f_ctc_loss_passes_to_the_operator(name, number):
    """torch.ctc_loss takes the number; the same loss by either way in (ctc_loss.py)."""
    assert tpv.reduction_number(torch, name) == number
    log_probs = torch.randn(6, 2, 5).log_softmax(2)
    call = (log_probs, torch.randint(1, 5, (2, 3)), [6, 5], [3, 2])
    assert torch.equal(
        torch.nn.functional.ctc_loss(*call, reduction=name), torch.ctc_loss(*call, 0, number)
    )
    with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
        tpv.reduction_number(torch, "avg")


def test_the_local_scalar_operator_is_what_bool_of_a_tensor_calls_and_fake_tensors_refuse():
    """Why a value check needs the trace's answer (make_choice_notes' `checked`)."""
    op = tpv.local_scalar_operator(torch)
    assert op in operators_called(lambda: bool(torch.any(torch.randn(3) < 0)))
    with tpv.FakeTensorMode(), pytest.raises(tpv.fake_tensor_limits()):
        bool(torch.any(torch.empty(3) < 0))


# ---------------------------------------------------------------- CUDA autocast


def test_autocast_operators_are_those_cuda_autocast_casts():
    names = tpv.autocast_operators(torch)
    assert {"aten::linear", "aten::mm", "aten::softmax.int", "aten::layer_norm"} <= set(names)
    assert "aten::add.Tensor" not in names


def test_python_kernels_serve_their_key_while_it_is_included_and_are_removed_by_the_undo():
    called = []

    def mm(a, b):
        called.append("mm")
        with tpv.dispatch_key(torch, "AutocastPrivateUse1", False):
            return torch.ops.aten.mm.default(a, b)

    x = torch.ones(2, 2)
    undo = tpv.python_kernels(
        torch, "AutocastPrivateUse1", {"mm": mm}, torch.library.fallthrough_kernel
    )
    try:
        torch.mm(x, x)  # the key is not included: nothing
        assert not tpv.dispatch_key_included(torch, "AutocastPrivateUse1")
        tpv.include_dispatch_key(torch, "AutocastPrivateUse1", True)
        try:
            assert tpv.dispatch_key_included(torch, "AutocastPrivateUse1")
            assert torch.mm(x, x).sum().item() == 8  # mm through the kernel, sum falls through
        finally:
            tpv.include_dispatch_key(torch, "AutocastPrivateUse1", False)
    finally:
        undo()
    torch.mm(x, x)
    assert called == ["mm"]
    assert tpv.dispatch_key_excluded(torch, "AutocastPrivateUse1")
    with tpv.dispatch_key(torch, "AutocastPrivateUse1", True), pytest.raises(NotImplementedError):
        torch.mm(x, x)  # removed, fallback and all: nothing serves the key any more


def test_outside_modes_hides_the_modes_in_force():
    from torch.overrides import TorchFunctionMode

    seen = []

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    mode = Seen()
    with mode, calls_seen_mode() as dispatched:
        assert mode in tpv.torch_function_modes(torch)
        with tpv.outside_modes(torch):
            torch.ones(1) + 1
        with tpv.no_torch_function(torch):
            torch.ones(1) + 1
    assert seen == []
    assert dispatched == [torch.ops.aten.ones.default, torch.ops.aten.add.Tensor]


@contextlib.contextmanager
def calls_seen_mode():
    seen = []

    class Seen(tpv.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Seen():
        yield seen


def test_is_view_tells_a_view_from_its_base():
    x = torch.ones(4)
    assert tpv.is_view(x[1:])
    assert not tpv.is_view(x)


def test_an_autocast_context_enabled_afterwards_enables_autocast_when_entered():
    context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)
    tpv.enable_autocast_context(context, True)
    with context:
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


def test_checkpointing_reads_the_autocast_state_through_the_patch():
    from torch.utils import checkpoint

    asked = []
    undo = tpv.patch_checkpoint_autocast_kwargs(
        torch, lambda original, device: asked.append(device) or original("cpu")
    )
    try:
        device_kwargs, _ = checkpoint._get_autocast_kwargs("meta")
    finally:
        undo()
    assert asked == ["meta"]
    assert device_kwargs["dtype"] == torch.get_autocast_dtype("cpu")
    assert checkpoint._get_autocast_kwargs("cpu")[0] is not None
