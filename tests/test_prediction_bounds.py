"""Bounds of an approximate prediction, and the GPU calibration that `estimate --gpu` carries.

The bounds rest on two facts about GPU kernels, checked here against every operator probed on
the H200 and committed as evidence: an operator's scratch is at most SCRATCH_FACTOR times the
bytes of its device inputs and outputs, and the committed calibration file is exactly what
its evidence builds (no hand edits). The figures of the synthetic traces are worked by hand."""

from __future__ import annotations

import json

import pytest
from conftest import RUNS

from pipeline.artefacts import validate
from pipeline.measuring import own_model
from pipeline.predicting import gpu_calibration
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

PROBES = RUNS / "20261203T212500Z-h200-probes"
MIB = 2**20
REGISTRY = validate.load_registry(validate.SCHEMAS)


def tensor_leaf(nbytes: int) -> tuple:
    return ("tensor", "float32", (nbytes // 4,), (1,), 0, nbytes, "device")


def one_operator_trace(
    name: str = "aten.foo.default", nbytes: int = MIB, leaves: list | None = None
) -> tp.Trace:
    """One phase: an operator reads a tensor of nbytes (or `leaves`) and returns one of
    nbytes, then that output dies."""
    trace = tp.Trace("meta", "cpu-only", "test")
    leaves = [tensor_leaf(nbytes)] if leaves is None else leaves
    trace.signatures["k"] = tp.Signature(name, None, leaves, None, calls=1)
    trace.events = [
        ("start", "step", None, 1),
        ("op", tp.OpCall(name, tp.CALLER, "k", ((0, 0, nbytes),))),
        ("free", 0),
        ("end",),
    ]
    return trace


def test_an_uncalibrated_operator_is_bounded_by_its_outputs_and_the_scratch_rule():
    prediction = tp.predict(one_operator_trace())
    assert prediction.status == PredictionStatus.APPROXIMATE
    (row,) = prediction.bounds
    low, high = row["peak_allocated_bytes"]
    assert low == MIB  # its output only
    # the output, a library workspace kept once, and scratch of 8 x (1 MiB in + 1 MiB out)
    assert high == MIB + tp.WORKSPACE_BOUND + tp.SCRATCH_FACTOR * 2 * MIB == 81 * MIB
    low, high = row["peak_reserved_bytes"]
    assert prediction.rows[0]["peak_reserved_bytes"] == 2 * MIB  # one small segment
    # reserved >= allocated is all that holds for certain below
    assert low == MIB
    # the output's small segment, the workspace's 64 MiB segment, the scratch's 16 MiB one
    assert high == 2 * MIB + 64 * MIB + 16 * MIB


def test_an_attention_left_whole_may_build_the_math_kernels_causal_mask_in_the_small_pool():
    """The most replay gives a composite attention nobody measured its scratch bound and the
    math kernel's causal mask as blocks of their own: for 512 x 512 scores, two of 256 KiB
    (booleans), one of 1 MiB (float32) and the scalar, all in the small pool: 2 MiB more
    reserved than the large scratch alone (as on Llama 1B in float32)."""
    name = "aten.scaled_dot_product_attention.default"
    q = ("tensor", "float32", (1, 2, 512, 512), (524288, 262144, 512, 1), 0, 2 * MIB, "device")
    trace = tp.Trace("meta", "cpu-only", "test")
    trace.signatures["k"] = tp.Signature(name, None, [q, q, q, None, 0.0, True], None, calls=1)
    trace.events = [
        ("start", "step", None, 1),
        ("op", tp.OpCall(name, tp.CALLER, "k", ((0, 0, 2 * MIB),))),
        ("free", 0),
        ("end",),
    ]
    blocks = tp.uncertain_calls(trace, None)["k"]
    scores = 4 * 2 * 512 * 512  # float32, batch 1 x 2 heads
    assert blocks == (tp.SCRATCH_FACTOR * 8 * MIB + tp.MATH_SCORES * scores,
                      512 * 512, 512 * 512, 4 * 512 * 512, 4)  # fmt: skip
    (row,) = tp.predict(trace).bounds
    # the output's 20 MiB segment, the 64 MiB workspace, scratch of 8 x 8 MiB + 3 x 2 MiB
    # (a 70 MiB segment), and a small segment for the mask: 256 + 256 + 1024 KiB and 512 B
    assert row["peak_reserved_bytes"][1] == (20 + 64 + 70 + 2) * MIB


def test_a_calibrated_operator_leaves_nothing_to_bound():
    calibration = tp.Calibration(output_only={"k"})
    prediction = tp.predict(one_operator_trace(), calibration)
    assert prediction.status == PredictionStatus.EXACT
    assert prediction.bounds is None
    assert prediction.unbounded is None


def test_another_kernel_than_the_traces_has_no_bounds():
    trace = one_operator_trace()
    trace.notes["MultiheadAttention fast path"] = tp.FAST_PATH
    prediction = tp.predict(trace)
    assert prediction.bounds is None
    assert "MultiheadAttention fast path" in prediction.unbounded
    assert "aten.foo" not in prediction.unbounded  # that one alone could be bounded


def test_a_storage_made_outside_the_dispatcher_is_bounded_from_the_start():
    """Seen first in the second phase, it may have been made before the first: the upper
    bound of the first phase counts it."""
    trace = one_operator_trace()
    trace.events = [
        ("start", "load", None, 1),
        ("end",),
        *trace.events[:1],
        ("unseen", 7, 4 * MIB),
        *trace.events[1:],
    ]
    trace.notes[tp.UNSEEN] = "first seen as an input of aten.foo.default"
    prediction = tp.predict(trace, tp.Calibration(output_only={"k"}))
    first, second = prediction.bounds
    assert first["peak_allocated_bytes"] == (0, 4 * MIB)
    assert second["peak_allocated_bytes"] == (5 * MIB, 5 * MIB)


def probe_documents() -> list[dict]:
    """Every probe folder committed (the first one, and the sweeps after it)."""
    paths = sorted(RUNS.glob("*-h200-probe*/probes/*.json"))
    assert any(PROBES in path.parents for path in paths)
    return [json.loads(path.read_text()) for path in paths]


def leaves_of(text: str) -> list:
    return gpu_calibration.leaves_of(text)  # inf or nan may be among the arguments


def scratch_peak(template: list[dict]) -> int:
    live = peak = 0
    sizes = {}
    for step in template:
        if step["kind"] == "internal":
            sizes[step["id"]] = step["bytes"]
            live += step["bytes"]
            peak = max(peak, live)
        elif step["kind"] == "free":
            live -= sizes.pop(step["id"])
    return peak


def test_every_probed_operators_scratch_is_within_the_scratch_rule():
    checked = 0
    for document in probe_documents():
        for entry in document["calibration"]["operators"]:
            if entry["signature"] not in document["signatures"]:
                continue  # a later sweep keeps the signatures of the calls worth a rule only
            leaves = leaves_of(document["signatures"][entry["signature"]]["leaves"])
            signature = tp.Signature(entry["op"], None, leaves, None)
            outputs = sum(s["bytes"] for s in entry["template"] if s["kind"] == "output")
            bound = tp.scratch_bound(signature, outputs)
            assert scratch_peak(entry["template"]) <= bound, entry["op"]
            kept = sum(s["bytes"] for s in entry["template"] if s["kind"] == "persistent")
            assert kept <= tp.WORKSPACE_BOUND, entry["op"]
            checked += 1
    assert checked >= 150


def probe_document(signatures: dict, operators: list, output_only: list) -> dict:
    return {
        "signatures": signatures,
        "calibration": {
            "operators": operators,
            "output_only": output_only,
            "failed": [],
            "workspaces_per_thread": True,
        },
    }


def mm(key: str, rows: int) -> dict:
    return {key: {"name": "aten.mm.default", "leaves": repr([tensor_leaf(rows * 4)] * 2)}}


WORKSPACE = [
    {"kind": "output", "index": 0, "bytes": 64},
    {"kind": "persistent", "bytes": 33554432},
]


def test_a_pattern_needs_two_shapes_that_agree():
    one = probe_document(mm("a", 8), [{"op": "aten.mm.default", "signature": "a",
                                       "template": WORKSPACE}], [])  # fmt: skip
    assert gpu_calibration.build([one])["patterns"] == {}
    two = probe_document(
        {**mm("a", 8), **mm("b", 16)},
        [{"op": "aten.mm.default", "signature": key, "template": WORKSPACE} for key in ("a", "b")],
        [],
    )
    built = gpu_calibration.build([two])
    assert built["patterns"] == {
        "aten.mm.default(float32, float32)": [
            {"kind": "output", "index": 0, "bytes": None},
            {"kind": "persistent", "bytes": 33554432},
        ]
    }
    other = probe_document(mm("c", 32), [], ["c"])  # a third shape with no workspace
    built = gpu_calibration.build([two, other])
    assert built["patterns"] == {}
    assert built["patterns_not_shared"] == ["aten.mm.default(float32, float32)"]


def test_a_reduction_is_never_generalised_whatever_its_probes_say():
    """Its scratch switches on with sizes (tests/test_shape_rules.py): neither a pattern nor
    a shape rule, however many shapes agree."""
    documents = probe_document(
        {
            key: {"name": "aten.sum.dim_IntList", "leaves": repr([tensor_leaf(n)])}
            for key, n in (("a", 64), ("b", 128), ("c", 256))
        },
        [],
        ["a", "b", "c"],
    )
    built = gpu_calibration.build([documents])
    assert built["patterns"] == {}
    assert built["shape_rules"] == {}


def test_bounds_that_do_not_hold_the_prediction_are_refused(capsys):
    path_rows = one_operator_trace()
    prediction = tp.predict(path_rows)
    document = {
        "schema": own_model.SCHEMA,
        "tool": own_model.TOOL,
        "created_utc": "2026-12-03T00:00:00Z",
        "status": "predicted",
    }
    record = tp.prediction_record(path_rows, prediction, None)
    assert own_model.bounds_facts(record) == []
    record["bounds"]["phases"][0]["peak_allocated_bytes"]["lower"] = MIB + 1
    assert own_model.bounds_facts(record) == [
        "$.prediction.bounds.phases[0].peak_allocated_bytes: the prediction 1048576 is "
        "outside its bounds"
    ]
    assert document["status"] == "predicted"


@pytest.mark.parametrize("name", ["a100", "H200", ""])
def test_an_unknown_gpu_is_refused_in_one_line(capsys, name):
    code = own_model.main(["estimate", "--workload", "x.py:f", "--gpu", name])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--gpu" in err[0]
    assert "h200" in err[0]


def test_a_value_dependent_operators_probe_is_neither_least_nor_most():
    """embedding_dense_backward sorts more than 3072 indices with scratch sized by their
    values: its probe (on zeros) is one case. The least drops its scratch; the most adds the
    scratch rule on top."""
    name = "aten.embedding_dense_backward.default"
    trace = one_operator_trace(name)
    indices = ("tensor", "int64", (4096,), (1,), 0, 4096 * 8, "device")
    trace.signatures["k"].leaves = [tensor_leaf(MIB), indices, 1000, -1, False]
    template = [("internal", 0, 2 * MIB), ("output", 0, MIB), ("free", 0)]
    prediction = tp.predict(trace, tp.Calibration(templates={"k": template}))
    assert prediction.status == PredictionStatus.APPROXIMATE
    assert prediction.rows[0]["peak_allocated_bytes"] == 3 * MIB  # the probe's own case
    ((low, high),) = [row["peak_allocated_bytes"] for row in prediction.bounds]
    assert low == MIB
    inputs = MIB + 4096 * 8
    assert high == 3 * MIB - 2 * MIB + tp.WORKSPACE_BOUND + tp.SCRATCH_FACTOR * (inputs + MIB)


def test_the_lower_bound_counts_the_bytes_asked_for_not_a_blocks_unsplit_rest():
    """A 2 MiB block and an 18 MiB one fill a 20 MiB segment; the 2 MiB one freed, an
    operator's 1.5 MiB output takes it whole (a rest of 0.5 MiB is not split off), and a
    1.25 MiB one a new segment: 21.25 MiB allocated for 20.75 MiB asked for. A real run
    whose unknown scratch lands in that hole first puts the output elsewhere, split to its
    size: the lower bound of peak allocated is what was asked for (the bound that broke on
    ViT-base training in bfloat16)."""
    trace = tp.Trace("meta", "cpu-only", "test")
    sizes = {"a": 2 * MIB, "b": 18 * MIB, "c": 3 * MIB // 2, "d": 5 * MIB // 4}
    for key, nbytes in sizes.items():
        trace.signatures[key] = tp.Signature(
            "aten.foo.default", None, [tensor_leaf(nbytes)], None, calls=1
        )
    trace.events = [
        ("start", "step", None, 1),
        ("op", tp.OpCall("aten.foo.default", tp.CALLER, "a", ((0, 0, sizes["a"]),))),
        ("op", tp.OpCall("aten.foo.default", tp.CALLER, "b", ((0, 1, sizes["b"]),))),
        ("free", 0),
        ("op", tp.OpCall("aten.foo.default", tp.CALLER, "c", ((0, 2, sizes["c"]),))),
        ("op", tp.OpCall("aten.foo.default", tp.CALLER, "d", ((0, 3, sizes["d"]),))),
        ("end",),
    ]
    prediction = tp.predict(trace)
    assert prediction.rows[0]["peak_allocated_bytes"] == 18 * MIB + 2 * MIB + 5 * MIB // 4
    (row,) = prediction.bounds
    asked = 18 * MIB + 3 * MIB // 2 + 5 * MIB // 4
    assert row["peak_allocated_bytes"][0] == asked
    assert row["peak_reserved_bytes"][0] == asked


def product_trace(dtype: str) -> tp.Trace:
    """One phase: a linear of a 1 MiB input by a 1 MiB weight, its 1 MiB output then dies."""
    leaf = ("tensor", dtype, (512, 512), (512, 1), 0, MIB, "device")
    return one_operator_trace("aten.linear.default", MIB, [leaf, leaf])


KEPT = [("output", 0, None), ("persistent", 32 * MIB)]


def test_a_float16_product_borrows_the_workspace_its_form_keeps_in_bfloat16_and_float32():
    """The central figure takes the 32 MiB workspace both other dtypes keep; the claim stays
    approximate and says why; the least replay leaves the workspace out, the most holds it."""
    patterns = {f"aten.linear.default({dtype}, {dtype})": KEPT for dtype in ("bfloat16", "float32")}
    prediction = tp.predict(product_trace("float16"), tp.Calibration(patterns=patterns))
    assert prediction.rows[0]["peak_allocated_bytes"] == MIB + 32 * MIB
    assert prediction.status == PredictionStatus.APPROXIMATE
    (entry,) = prediction.unknown
    assert entry["op"] == "aten.linear"
    assert entry["why"] == f"{tp.UNCALIBRATED}; {tp.BORROWED}"
    (row,) = prediction.bounds
    scratch = tp.SCRATCH_FACTOR * (2 * MIB + MIB)  # its two inputs and its output
    assert row["peak_allocated_bytes"] == (MIB, MIB + 32 * MIB + tp.WORKSPACE_BOUND + scratch)


@pytest.mark.parametrize(
    ("patterns", "central"),
    [
        ({"aten.linear.default(bfloat16, bfloat16)": KEPT}, MIB),  # float32 not probed
        (
            {
                "aten.linear.default(bfloat16, bfloat16)": KEPT,
                "aten.linear.default(float32, float32)": [("output", 0, None)],
            },
            MIB,  # they disagree
        ),
    ],
)
def test_a_float16_product_borrows_nothing_unless_both_donors_agree(patterns, central):
    prediction = tp.predict(product_trace("float16"), tp.Calibration(patterns=patterns))
    assert prediction.rows[0]["peak_allocated_bytes"] == central
    assert prediction.unknown[0]["why"] == tp.UNCALIBRATED


def test_a_probed_float16_pattern_is_known_and_a_bfloat16_call_borrows_nothing():
    own = {"aten.linear.default(float16, float16)": KEPT}
    assert tp.predict(product_trace("float16"), tp.Calibration(patterns=own)).status == (
        PredictionStatus.EXACT
    )
    donors = {f"aten.linear.default({d}, {d})": KEPT for d in ("float32", "float16")}
    prediction = tp.predict(product_trace("bfloat16"), tp.Calibration(patterns=donors))
    assert prediction.rows[0]["peak_allocated_bytes"] == MIB
