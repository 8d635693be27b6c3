"""reduce_scratch.py: the CUDA reduction kernel's scratch, ported from PyTorch 2.11's source.

The oracle is the H200's: every reduction call probed in the committed runs
(runs/2026120*-h200-probe*/probes/*.json), with scratch (its template) or without (output
only), must get the same template byte for byte, or be declined (None); the counts are
printed. Hand-worked cases follow setReduceConfig on paper; properties check invariants of
the arithmetic on random calls; and on a GPU host, a `gpu` test compares random calls with
the allocator's recorded history.
"""

from __future__ import annotations

import collections
import json
import math
import random

import pytest
from conftest import ROOT, RUNS
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core import call_keys
from pipeline.predicting import gpu_calibration
from pipeline.predicting import reduce_scratch as rs

PROBE_DOCUMENTS = sorted(RUNS.glob("2026120*-h200-probe*/probes/*.json"))
CALIBRATION = ROOT / "calibrations" / "nvidia-h200-torch-2.11.0+cu130.json"
COVERED = tuple(rs.OPERATORS)


def arguments_of(name: str, leaves: list) -> dict:
    """A probed call's arguments by name. A probe document keeps the flattened leaves, not
    the tree: after the tensor come the dimension(s) (ints), keepdim (a bool) and the dtype
    (("dtype", name)), in schema order; argmax's dimension is one int or absent (None)."""
    x, rest = leaves[0], leaves[1:]
    assert call_keys.is_tensor_leaf(x), leaves
    ints = [v for v in rest if isinstance(v, int) and not isinstance(v, bool)]
    bools = [v for v in rest if isinstance(v, bool)]
    dtypes = [v for v in rest if isinstance(v, tuple) and v[:1] == ("dtype",)]
    assert len(ints) + len(bools) + len(dtypes) == len(rest), leaves
    arguments = {"self": x, "keepdim": bools[0] if bools else False}
    if dtypes:
        arguments["dtype"] = dtypes[0]
    if rs.OPERATORS[name][1]:
        if name.startswith("aten.arg"):
            arguments["dim"] = ints[0] if ints else None
        else:
            arguments["dim"] = ints
    return arguments


def probed_reductions() -> dict:
    """signature key -> (operator, leaves, template, or "output only"), over every probe
    document; a key probed twice must have been measured the same."""
    calls: dict = {}
    for path in PROBE_DOCUMENTS:
        document = json.loads(path.read_text(encoding="utf-8"))
        section = document["calibration"]
        templates = {entry["signature"]: entry["template"] for entry in section["operators"]}
        output_only = set(section["output_only"])
        for key, entry in document["signatures"].items():
            if entry["name"] not in COVERED:
                continue
            if key in templates:
                measured = templates[key]
            elif key in output_only:
                measured = "output only"
            else:
                continue  # not probed (failed or skipped)
            leaves = gpu_calibration.leaves_of(entry["leaves"])
            if key in calls:
                assert calls[key][2] == measured, (key, path)
            calls[key] = (entry["name"], leaves, measured)
    return calls


PROBED = probed_reductions()


def test_every_probed_reduction_matches_the_h200():
    """The port against every probed call of a covered operator: matched, declined or
    mismatched, per operator and kind; none may mismatch, and within the zoo none is
    declined."""
    counts: collections.Counter = collections.Counter()
    mismatched = []
    for key, (name, leaves, measured) in sorted(PROBED.items()):
        arguments = arguments_of(name, leaves)
        got = rs.template_of_call(name, arguments)
        kind = "output only" if measured == "output only" else "scratch"
        if got is None:
            counts[name, kind, "declined"] += 1
            continue
        if measured == "output only":
            x = arguments["self"]
            size = rs.ELEMENT_SIZE["int64" if name.startswith("aten.arg") else x[1]]
            kept = call_keys_reduced_numel(name, x[2], arguments.get("dim"))
            measured = [{"kind": "output", "index": 0, "bytes": kept * size}]
        if got == measured:
            counts[name, kind, "matched"] += 1
        else:
            counts[name, kind, "mismatched"] += 1
            mismatched.append((key, name, leaves, got, measured))
    print()
    for (name, kind, verdict), count in sorted(counts.items()):
        print(f"{name:24} {kind:12} {verdict:10} {count}")
    assert not mismatched, mismatched[:5]
    declined = sum(count for (_, _, verdict), count in counts.items() if verdict == "declined")
    assert declined == 0
    # at least the evidence committed when this was written (a lost document must not make
    # this pass vacuously): 31 sums and 6 argmax with scratch
    assert counts["aten.sum.dim_IntList", "scratch", "matched"] >= 31
    assert counts["aten.argmax.default", "scratch", "matched"] >= 6
    assert counts["aten.sum.dim_IntList", "output only", "matched"] >= 100
    assert counts["aten.mean.dim", "output only", "matched"] >= 200
    assert counts["aten.argmax.default", "output only", "matched"] >= 5


def call_keys_reduced_numel(name: str, shape, dims) -> int:
    """Elements of a reduction's output (the reduced dimensions dropped or kept as 1)."""
    if dims is None or dims == []:
        return 1
    dims = [dims] if isinstance(dims, int) else dims
    reduced = {d % len(shape) for d in dims}
    return math.prod(size for d, size in enumerate(shape) if d not in reduced)


def test_the_merged_calibration_holds_no_other_reduction():
    """Every reduction the committed H200 calibration lists with a template was checked
    above, with that template."""
    calibration = json.loads(CALIBRATION.read_text(encoding="utf-8"))
    listed = {
        key: entry["template"]
        for key, entry in calibration["signatures"].items()
        if entry["op"] in COVERED
    }
    assert len(listed) >= 37  # 31 sums and 6 argmax when written
    for key, template in listed.items():
        assert PROBED[key][2] == template


# --- Hand-worked cases ----------------------------------------------------------------


def sum_rows(shape, dtype="float32", dims=(0,), keepdim=False, offset=0):
    stride = tuple(rs.contiguous_strides(shape))
    return rs.reduction_template(
        "aten.sum.dim_IntList", tuple(shape), stride, dtype, list(dims), keepdim, None, offset
    )


def with_scratch(out: int, buffer: int, semaphores: int) -> list[dict]:
    return [
        {"kind": "output", "index": 0, "bytes": out},
        {"kind": "internal", "id": 0, "bytes": buffer},
        {"kind": "internal", "id": 1, "bytes": semaphores},
        {"kind": "free", "id": 1},
        {"kind": "free", "id": 0},
    ]


def test_a_small_sum_takes_no_scratch():
    """(4, 8) summed over its last dimension: 8 inputs per output, one warp's lanes."""
    assert rs.reduction_template("aten.sum.dim_IntList", (4, 8), (8, 1), "float32", [1]) == [
        {"kind": "output", "index": 0, "bytes": 16}
    ]


def test_a_sum_of_2048_rows_into_4096_outputs():
    """float32 (2048, 4096) summed over dim 0. The iterator: shape (2048, 4096), the reduced
    dimension first; input strides (16384, 4) bytes, so the reduction is not on the fastest
    dimension: dim0 = 4096 outputs, dim1 = 2048 inputs. The fastest stride is one element:
    output_vec_size 4, dim0 = 1024. Blocks: 512 / 4 = 128 threads, width 32, height 4.
    Lanes split the outputs (step_output 32); 2048 values per thread >= 4 * 16, so warps
    split the inputs (step_input 4): 512 values per thread. Grid 1024 / 32 = 32 blocks,
    under 132 SMs * (2048 / 128) = 2112: ctas_per_output = max(min(66, 32), 2) = 32.
    Buffer 4 B * 4096 outputs * 32 ctas * 32 lanes * 4 (vector) = 64 MiB; semaphores 4 * 32."""
    config, _ = rs.reduction_config("aten.sum.dim_IntList", (2048, 4096), (4096, 1), "float32", [0])
    assert (config.output_vec_size, config.block_width, config.block_height) == (4, 32, 4)
    assert (config.step_output, config.values_per_thread(), config.grid_x()) == (32, 16, 32)
    assert config.ctas_per_output == 32
    assert sum_rows((2048, 4096)) == with_scratch(16384, 64 * 2**20, 128)


def test_the_probed_bfloat16_sum_worked_by_hand():
    """bfloat16 (1626, 768) over dim 0, as probed: 768 outputs / 4 = 192 -> width 32,
    height 4; 1626 / 4 warps = 407 values per thread; grid 192 / 32 = 6; ctas =
    max(min(352, 26), 2) = 26; buffer in float (arg_t): 4 * 768 * 26 * 32 * 4 = 10223616."""
    assert sum_rows((1626, 768), "bfloat16", keepdim=True) == with_scratch(1536, 10223616, 24)


def test_a_misaligned_input_loses_its_vectors_and_its_scratch():
    """The same call on an input one element into its block: get_output_vec_size falls to
    1, blocks of 32 x 16 threads, 1626 / 16 = 102 values per thread: no global reduction."""
    assert sum_rows((1626, 768), "bfloat16", keepdim=True, offset=1) == [
        {"kind": "output", "index": 0, "bytes": 1536}
    ]
    config, _ = rs.reduction_config(
        "aten.sum.dim_IntList", (1626, 768), (768, 1), "bfloat16", [0], True, None, 1
    )
    assert (config.output_vec_size, config.block_height, config.values_per_thread()) == (1, 16, 102)


def test_argmax_of_a_vocabulary_row():
    """float32 (1, 151936) argmax over the last dimension, as probed: on the fastest
    dimension, 512 lanes, 297 values each; one output, ctas = max(min(528, 19), 2) = 19;
    arg_t pair<float, int64> of 16 bytes: buffer 16 * 19 = 304, semaphores 4."""
    got = rs.reduction_template(
        "aten.argmax.default", (1, 151936), (151936, 1), "float32", -1, True
    )
    assert got == with_scratch(8, 304, 4)
    # 128256 columns: 251 values per thread, under 256: no global reduction
    got = rs.reduction_template(
        "aten.argmax.default", (1, 128256), (128256, 1), "float32", -1, True
    )
    assert got == [{"kind": "output", "index": 0, "bytes": 8}]


def test_a_full_sum_of_16m_floats():
    """sum.default of 2**24 contiguous floats: one output, 512 lanes, 32768 values per
    thread, ctas = max(min(528, 2048), 128) = 528; the lanes reduce in the block, so the
    buffer is 4 B * 1 * 528 = 2112. A transposed square input coalesces to the same."""
    assert rs.reduction_template("aten.sum.default", (2**24,), (1,), "float32") == with_scratch(
        4, 2112, 4
    )
    assert rs.reduction_template(
        "aten.sum.default", (4096, 4096), (1, 4096), "float32"
    ) == with_scratch(4, 2112, 4)


def test_amax_accumulates_in_its_own_dtype():
    """amax of bfloat16 accumulates in bfloat16 (func_wrapper<scalar_t>): 2-byte arg_t."""
    config, out = rs.reduction_config(
        "aten.amax.default", (64, 100000), (100000, 1), "bfloat16", []
    )
    assert (config.element_size_bytes, out) == (2, 2)
    assert config.global_memory_size() == 2 * config.ctas_per_output


@pytest.mark.parametrize(
    ("op", "shape", "stride", "dtype", "dims", "out_dtype"),
    [
        ("aten.mean.dim", (64, 64), (64, 1), "int64", [0], None),  # an error in PyTorch
        ("aten.sum.dim_IntList", (2**16, 2**15 + 1), (2**15 + 1, 1), "float32", [0], None),
        ("aten.argmax.default", (64, 64), (1, 64), "float32", None, None),  # reshape copies
        ("aten.sum.dim_IntList", (0, 64), (64, 1), "float32", [0], None),  # empty
        ("aten.sum.dim_IntList", (8, 8), (8, 1), "float32", [0, 0], None),  # repeated dim
        ("aten.prod.dim_int", (8, 8), (8, 1), "float32", 0, None),  # not ported
    ],
)
def test_outside_the_port(op, shape, stride, dtype, dims, out_dtype):
    assert rs.reduction_template(op, shape, stride, dtype, dims, False, out_dtype) is None


@pytest.mark.parametrize(
    ("dtype", "out_dtype", "copy"),
    [
        ("int32", None, 64 * 64 * 8),
        ("bool", None, 64 * 64 * 8),
        ("float32", "float64", 64 * 64 * 8),
    ],
)
def test_an_input_cast_first_is_copied_after_the_output_and_freed_on_return(dtype, out_dtype, copy):
    """sum_out: the output, then make_reduction_from_out_ty's `self.to(in_dtype)` (an
    integer or bool input summed as int64; a dtype asked for), freed when it returns."""
    got = rs.reduction_template("aten.sum.dim_IntList", (64, 64), (64, 1), dtype, [0], False,
                                out_dtype)  # fmt: skip
    assert got == [
        {"kind": "output", "index": 0, "bytes": 64 * 8},
        {"kind": "internal", "id": 2, "bytes": copy},
        {"kind": "free", "id": 2},
    ]


def test_a_cast_copy_that_reduces_across_blocks_keeps_its_scratch_inside_the_copys_life():
    """A bool mask of 2**20 values summed whole: the copy (8 MiB of int64), then the
    kernel's staging buffer and semaphores on that copy, freed before it."""
    got = rs.reduction_template("aten.sum.default", (1024, 1024), (1, 1024), "bool")
    steps = [(step["kind"], step.get("id")) for step in got]
    assert steps == [("output", None), ("internal", 2), ("internal", 0), ("internal", 1),
                     ("free", 1), ("free", 0), ("free", 2)]  # fmt: skip
    assert got[1]["bytes"] == 2**20 * 8
    as_int64 = rs.reduction_template("aten.sum.default", (1024, 1024), (1, 1024), "int64")
    assert got[2:4] == as_int64[1:3]


def test_low_precision_summed_into_float32_stays_one_kernel():
    """sum(bfloat16, dtype=float32): gpu_lowp_to_f32, no cast, a float32 output."""
    got = rs.template_of_call(
        "aten.sum.dim_IntList",
        {
            "self": ("tensor", "bfloat16", (1626, 768), (768, 1), 0, 2497536, "device"),
            "dim": [0],
            "keepdim": True,
            "dtype": ("dtype", "float32"),
        },
    )
    assert got == with_scratch(3072, 10223616, 24)


def test_iterator_of_a_two_dimension_sum():
    """(3, 873, 512) over dims 0 and 1: reorder puts the reduced dims first, coalescing
    merges them: shape (2619, 512), output strides (0, 2), input strides (1024, 2)."""
    it = rs.reduction_iterator((3, 873, 512), (446976, 512, 1), 2, 2, [True, True, False], True)
    assert (it.shape, it.strides) == ([2619, 512], [[0, 2], [1024, 2]])


# --- Properties -----------------------------------------------------------------------

SIZES = st.sampled_from([1, 2, 3, 7, 16, 31, 64, 100, 255, 256, 257, 768, 1000, 4096, 30000])
DTYPES = st.sampled_from(["float32", "bfloat16", "float16", "int64"])


@st.composite
def calls(draw):
    """A reduction of a (maybe permuted, maybe offset) dense tensor, under 2**28 elements."""
    ndim = draw(st.integers(1, 4))
    shape = [draw(SIZES) for _ in range(ndim)]
    while math.prod(shape) > 2**28:
        shape[shape.index(max(shape))] //= 7
    order = draw(st.permutations(range(ndim)))
    dense = rs.contiguous_strides([shape[d] for d in order])
    stride = [0] * ndim
    for position, d in enumerate(order):
        stride[d] = dense[position]
    op = draw(st.sampled_from(COVERED))
    dtype = draw(DTYPES)
    if op.startswith("aten.arg"):
        dims = draw(st.none() | st.integers(-ndim, ndim - 1))
    elif rs.OPERATORS[op][1] is None:
        dims = None
    else:
        dims = draw(st.lists(st.integers(0, ndim - 1), unique=True))
    keepdim, offset = draw(st.booleans()), draw(st.sampled_from([0, 0, 1, 2, 4]))
    return op, tuple(shape), tuple(stride), dtype, dims, keepdim, offset


@given(calls())
def test_buffer_iff_semaphores(call):
    """Either the output alone, or output, buffer, semaphores and their two frees; both
    sizes positive, semaphores a whole number of ints."""
    op, shape, stride, dtype, dims, keepdim, offset = call
    template = rs.reduction_template(op, shape, stride, dtype, dims, keepdim, None, offset)
    if template is None:
        return
    assert template[0]["kind"] == "output"
    assert len(template) in (1, 5)
    if len(template) == 5:
        assert [step["kind"] for step in template[1:]] == ["internal", "internal", "free", "free"]
        assert template[1]["bytes"] > 0
        assert template[2]["bytes"] > 0
        assert template[2]["bytes"] % 4 == 0


@given(calls())
def test_scratch_needs_256_values_per_output_and_more_than_one_block(call):
    """A global reduction needs values_per_thread >= 256 (so inputs per output >= 256) and
    splits each output over 2 blocks or more; the buffer holds one arg_t per output per
    block (per lane and vector element when lanes do not reduce among themselves)."""
    op, shape, stride, dtype, dims, keepdim, offset = call
    found = rs.reduction_config(op, shape, stride, dtype, dims, keepdim, None, offset)
    if found is None or found[0] is None:
        return
    config = found[0]
    if config.num_inputs < rs.MAX_VALUES_PER_THREAD:
        assert not config.should_global_reduce()
    if config.should_global_reduce():
        assert config.ctas_per_output >= 2
        per_block = config.element_size_bytes * config.num_outputs * config.ctas_per_output
        lanes = 1 if config.should_block_x_reduce() else config.block_width
        assert config.global_memory_size() == per_block * lanes * config.output_vec_size
        assert config.semaphore_size() == 4 * config.grid_x()


@given(calls())
def test_agrees_with_the_rule_the_project_had(call):
    """trace_prediction.reduction_without_scratch's rule (fewer than 256 inputs per output,
    or contiguous inputs reduced over trailing dimensions, fewer than 32 x 256): where it
    says no scratch, the port says so too."""
    op, shape, stride, dtype, dims, keepdim, offset = call
    template = rs.reduction_template(op, shape, stride, dtype, dims, keepdim, None, offset)
    if template is None:
        return
    rank = len(shape)
    reduced = list(range(rank)) if dims in (None, []) else [dims] if isinstance(dims, int) else dims
    reduced = sorted({d % rank for d in reduced})
    inputs = math.prod(shape[d] for d in reduced)
    trailing = reduced == list(range(rank - len(reduced), rank))
    if inputs < 256 or (trailing and call_keys.contiguous(shape, stride) and inputs < 32 * 256):
        assert len(template) == 1


@given(calls())
def test_sixteen_bit_input_vectors_do_not_move_the_scratch(call):
    """Whether a 16-bit sum/mean loads 4 or 8 inputs at once (input_vec_size, which PyTorch's
    branches set differently) changes dim0 only where a thread gets fewer than 16 values:
    never the scratch."""
    op, shape, stride, dtype, dims, keepdim, offset = call
    if rs.OPERATORS[op][0] not in ("sum", "mean") or dtype not in rs.LOW_PRECISION:
        return
    found = rs.reduction_config(op, shape, stride, dtype, dims, keepdim, None, offset)
    if found is None or found[0] is None:
        return
    mask = rs._reduced_mask(len(shape), dims)
    it = rs.reduction_iterator(shape, stride, 2, 2, mask, keepdim)
    sizes = set()
    for vec in (4, 8):
        kernel = rs.Kernel(scalar=dtype, arg_size=4, out_dtype=dtype, input_vec_size=vec)
        config = rs.set_reduce_config(it, kernel, offset)
        sizes.add((config.global_memory_size(), config.semaphore_size()))
    assert len(sizes) == 1


@given(calls())
def test_keepdim_does_not_move_the_scratch(call):
    """keepdim changes the output's strides in its size-1 dimensions only, which
    coalescing drops."""
    op, shape, stride, dtype, dims, _keepdim, offset = call
    kept = rs.reduction_template(op, shape, stride, dtype, dims, True, None, offset)
    dropped = rs.reduction_template(op, shape, stride, dtype, dims, False, None, offset)
    assert kept == dropped


# --- On a GPU host: random calls against the allocator's history ------------------------


@pytest.mark.gpu
def test_random_calls_against_the_gpu():
    """Random reductions (dtypes, permuted and offset inputs, keepdim, dims, dtype=float32
    for 16-bit sums and means) run on the GPU with the allocator's history recorded: each
    call's allocations and frees, in order, are the port's template."""
    import torch

    history = torch.cuda.memory
    rng = random.Random(0)
    sizes = [1, 2, 3, 5, 8, 16, 31, 64, 96, 128, 255, 256, 300, 512, 768, 1000, 1024, 2048]
    sizes += [4096, 8191, 8192, 30000, 151936]
    counts: collections.Counter = collections.Counter()
    mismatched = []
    for _ in range(1000):
        op = rng.choice(COVERED)
        family = rs.OPERATORS[op][0]
        dtype = rng.choice(["float32", "bfloat16", "float16", "int64", "int32", "bool"])
        if family == "mean" and dtype in ("int64", "int32", "bool"):
            continue
        if family != "sum" and dtype in ("int32", "bool"):
            continue  # cast first: sums only (make_reduction_from_out_ty)
        ndim = rng.randint(1, 4)
        shape = [rng.choice(sizes) for _ in range(ndim)]
        while math.prod(shape) > 2**27:
            shape[rng.randrange(ndim)] = rng.choice(sizes[:12])
        offset = rng.choice([0, 0, 0, 1, 2, 3, 8])
        order = list(range(ndim))
        if rng.random() < 0.3:
            rng.shuffle(order)
        base = torch.zeros(math.prod(shape) + offset, dtype=getattr(torch, dtype), device="cuda")
        x = (
            base[offset:]
            .view([shape[d] for d in order])
            .permute([order.index(d) for d in range(ndim)])
        )
        keepdim, out_dtype = rng.random() < 0.5, None
        if family == "argmax":
            dims = rng.choice([None, rng.randrange(-ndim, ndim)])
        elif rs.OPERATORS[op][1] is None:
            dims = None
        else:
            dims = sorted(rng.sample(range(ndim), rng.randint(0, ndim)))
        if family in ("sum", "mean") and dtype in rs.LOW_PRECISION and rng.random() < 0.3:
            out_dtype = "float32"
        if family in ("sum", "mean") and dtype == "float32" and rng.random() < 0.2:
            out_dtype = "float64"  # cast first
        kwargs = {"dtype": getattr(torch, out_dtype)} if out_dtype else {}
        _, name, overload = op.split(".")
        function = getattr(getattr(torch.ops.aten, name), overload)
        args = (x,) if rs.OPERATORS[op][1] is None else (x, dims, keepdim)
        if rs.OPERATORS[op][1] is None:
            keepdim = False
        expected = rs.reduction_template(
            op, tuple(x.shape), tuple(x.stride()), dtype, dims, keepdim, out_dtype, offset
        )
        torch.cuda.synchronize()
        history._record_memory_history(context=None, stacks="python")
        before = len(history._snapshot()["device_traces"][0])
        out = function(*args, **kwargs)
        torch.cuda.synchronize()
        events = [
            (event["action"], event["size"])
            for event in history._snapshot()["device_traces"][0][before:]
            if event["action"] in ("alloc", "free_completed")
        ]
        history._record_memory_history(enabled=None)
        shape, stride = tuple(x.shape), tuple(x.stride())
        del out, x, base
        if expected is None:
            counts[op, "declined"] += 1
            continue
        sizes_by_id = {step["id"]: step["bytes"] for step in expected if step["kind"] == "internal"}
        wanted = [
            ("free_completed", sizes_by_id[step["id"]])
            if step["kind"] == "free"
            else ("alloc", step["bytes"])
            for step in expected
        ]
        verdict = "matched" if events == wanted else "mismatched"
        counts[op, "scratch" if len(expected) > 1 else "output only", verdict] += 1
        if events != wanted:
            mismatched.append((op, dtype, shape, stride, offset, dims, keepdim, events, wanted))
    print()
    for key, count in sorted(counts.items()):
        print(*key, count)
    assert not mismatched, mismatched[:10]
