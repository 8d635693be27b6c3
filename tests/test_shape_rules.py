"""What makes a call covered at a shape never probed: a calibration's shape rules (probes that
agree over a range of sizes, claimed only inside it), the reductions PyTorch's source settles,
composite operators traced through their inner calls, and cuDNN attention's logsumexp made
only when asked for. Each rule is pinned at its edges: one size past a threshold, one
dimension past a domain."""

from __future__ import annotations

import json

import pytest

from pipeline.predicting import gpu_calibration as gc
from pipeline.predicting import trace_prediction as tp

torch = pytest.importorskip("torch")
aten = torch.ops.aten
META = torch.device("meta")


def signature(func, *args, **kwargs) -> tp.Signature:
    """A traced call's signature, as the recorder describes it."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((args, kwargs))
    described = [tp.describe(torch, x, META) for x in leaves]
    return tp.Signature(str(func), func, described, spec)


def x(*shape, dtype=torch.float32):
    return torch.empty(shape, device="meta", dtype=dtype)


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize(
    ("call", "covered"),
    [
        # a norm over the hidden size: contiguous, trailing, fewer than 8,192 inputs an output
        (lambda: signature(aten.mean.dim, x(4, 512, 4096), [-1], True), True),
        (lambda: signature(aten.mean.dim, x(4, 512, 8191), [-1], True), True),
        (lambda: signature(aten.mean.dim, x(4, 512, 8192), [-1], True), False),
        (lambda: signature(aten.sum.dim_IntList, x(2, 3, 64, 64), [2, 3]), True),
        (lambda: signature(aten.sum.dim_IntList, x(2, 3, 128, 64), [2, 3]), False),
        # not trailing, or not contiguous: only below 256 inputs an output
        (lambda: signature(aten.sum.dim_IntList, x(255, 768), [0]), True),
        (lambda: signature(aten.sum.dim_IntList, x(256, 768), [0]), False),
        (lambda: signature(aten.sum.dim_IntList, x(300, 768).t(), [-1]), False),
        (lambda: signature(aten.sum.dim_IntList, x(200, 768).t(), [-1]), True),
        # a whole tensor, argmax over a vocabulary; a conversion first, except a 16-bit
        # input asked for float32, which CUDA reduces uncast (gpu_lowp_to_f32)
        (lambda: signature(aten.sum.default, x(255)), True),
        (lambda: signature(aten.sum.default, x(64, 127)), True),
        (lambda: signature(aten.sum.default, x(64, 128)), False),
        (lambda: signature(aten.sum.default, x(64, 128).t()), False),
        (lambda: signature(aten.argmax.default, x(8, 151936), -1), False),
        (lambda: signature(aten.argmax.default, x(8, 4000), -1), True),
        (
            lambda: signature(
                aten.mean.dim, x(4, 64, dtype=torch.bfloat16), [-1], dtype=torch.float32
            ),
            True,
        ),
        (lambda: signature(aten.mean.dim, x(4, 64), [-1], dtype=torch.float64), False),
        (lambda: signature(aten.mean.dim, x(4, 64), [-1], dtype=torch.float32), True),
        # past 2**31 bytes the kernel splits the iterator
        (lambda: signature(aten.mean.dim, x(2**27, 4), [-1]), False),
        (lambda: signature(aten.mean.dim, x(2**27 - 1, 4), [-1]), True),
        # not a reduction the rule knows
        (lambda: signature(aten.cumsum.default, x(4, 16), -1), False),
    ],
)
def test_a_reduction_allocates_its_outputs_only_where_no_block_splits_an_output(call, covered):
    assert tp.output_only(call()) is covered


# ---------------------------------------------------------------- shape rules


def test_the_rule_key_keeps_layouts_and_values_and_drops_sizes():
    q = x(2, 8, 16, 64).transpose(1, 2)  # a view: (2, 16, 8, 64) with other strides
    a = signature(aten.mean.dim, x(4, 5, 6), [-1], True)
    b = signature(aten.mean.dim, x(7, 8, 9), [-1], True)
    assert gc.rule_key(a.name, a.leaves) == gc.rule_key(b.name, b.leaves)
    assert gc.rule_key(a.name, a.leaves) == "aten.mean.dim(float32[012c], -1, True)"
    other_dim = signature(aten.mean.dim, x(4, 5, 6), [0], True)
    assert gc.rule_key(other_dim.name, other_dim.leaves) != gc.rule_key(a.name, a.leaves)
    view = signature(aten.neg.default, q)
    assert gc.rule_key(view.name, view.leaves) == "aten.neg.default(float32[0213n])"
    scaled = signature(aten.mul.Tensor, x(3), 0.125)
    assert gc.rule_key(scaled.name, scaled.leaves) == "aten.mul.Tensor(float32[0c], float)"


def test_a_call_is_within_a_domain_only_dimension_by_dimension_inclusive():
    domain = [[[1, 8, 16, 64]], [[8, 32, 4096, 128]]]
    leaves = lambda *shape: signature(aten.neg.default, x(*shape)).leaves  # noqa: E731
    assert gc.within(domain, leaves(1, 8, 16, 64))
    assert gc.within(domain, leaves(8, 32, 4096, 128))
    assert not gc.within(domain, leaves(9, 32, 4096, 128))
    assert not gc.within(domain, leaves(8, 32, 4097, 128))
    assert not gc.within(domain, leaves(1, 8, 15, 64))
    assert not gc.within(domain, leaves(8, 32, 4096))  # another rank


def probes(name: str, shapes: list, templates: list) -> dict:
    """A probe document: one call of `name` per shape, each with its template."""
    signatures, operators, output_only = {}, [], []
    for i, (shape, template) in enumerate(zip(shapes, templates, strict=True)):
        key = f"k{i}"
        leaf = ("tensor", "float32", shape, tuple(1 for _ in shape), 0, 4, "device")
        signatures[key] = {"name": name, "leaves": repr([leaf])}
        if template:
            operators.append({"op": name, "signature": key, "template": template})
        else:
            output_only.append(key)
    return {
        "signatures": signatures,
        "calibration": {"operators": operators, "output_only": output_only, "failed": [],
                        "workspaces_per_thread": True},
    }  # fmt: skip


SCRATCH = [
    {"kind": "output", "index": 0, "bytes": 64},
    {"kind": "internal", "id": 0, "bytes": 256},
    {"kind": "free", "id": 0},
]


def test_a_shape_rule_needs_three_shapes_that_agree_and_holds_only_between_them():
    name = "aten.neg.default"
    two = probes(name, [(2, 8), (4, 16)], [SCRATCH, SCRATCH])
    assert gc.build([two])["shape_rules"] == {}
    three = probes(name, [(2, 8), (4, 16), (3, 32)], [SCRATCH] * 3)
    rules = gc.build([three])["shape_rules"]
    ((key, rule),) = rules.items()
    assert key == "aten.neg.default(float32[01n])"  # unit strides: not contiguous
    assert rule["domain"] == [[[2, 8]], [[4, 32]]]
    assert rule["shapes"] == 3
    assert rule["template"][0] == {"kind": "output", "index": 0, "bytes": None}
    assert rule["template"][1:] == SCRATCH[1:]
    other = probes(name, [(5, 5)], [[{"kind": "output", "index": 0, "bytes": 64}]])
    built = gc.build([three, other])  # a fourth shape without the scratch: no rule
    assert built["shape_rules"] == {}
    assert built["shape_rules_not_shared"] == ["aten.neg.default(float32[01n])"]


@pytest.mark.parametrize(
    "name", ["aten.sum.dim_IntList", "aten.embedding_dense_backward.default", "aten.min.other"]
)
def test_reductions_and_value_dependent_operators_are_never_ruled_by_shape(name):
    document = probes(name, [(2, 8), (4, 16), (3, 32)], [[]] * 3)
    assert gc.build([document])["shape_rules"] == {}


def test_a_rule_covers_a_call_inside_its_domain_and_an_output_only_rule_adds_nothing():
    document = probes("aten.neg.default", [(2, 8), (4, 16), (3, 32)], [[]] * 3)
    built = gc.build([document])
    calibration = tp.Calibration(
        shape_rules={
            key: ([tp.template_step(s) for s in rule["template"]], rule["domain"])
            for key, rule in built["shape_rules"].items()
        }
    )
    inside = tp.Signature("aten.neg.default", None, [("tensor", "float32", (3, 9), (1, 1), 0,
                                                      4, "device")], None)  # fmt: skip
    outside = tp.Signature("aten.neg.default", None, [("tensor", "float32", (5, 9), (1, 1), 0,
                                                       4, "device")], None)  # fmt: skip
    assert calibration.known("s", inside)
    assert not calibration.known("s", outside)
    assert calibration.template("s", inside) is None  # outputs only: replayed as such


def test_the_committed_calibration_is_what_its_evidence_builds(tmp_path):
    """No hand edits: the file is what `gpu_calibration.py build` makes of the folders it
    names, and it holds shape rules (the cuDNN attention's forward among them)."""
    committed = gc.FOLDER / gc.KNOWN["h200"]
    document = json.loads(committed.read_text())
    folders = [part.strip().removeprefix("runs/")
               for part in document["made_from"].split(":")[0].split(",")]  # fmt: skip
    from conftest import RUNS

    output = tmp_path / "calibration.json"
    assert gc.main(["build", *(str(RUNS / f) for f in folders), "--output", str(output)]) == 0
    assert output.read_bytes() == committed.read_bytes()
    assert any(k.startswith("aten._scaled_dot_product_cudnn_attention.default(")
               for k in document["shape_rules"])  # fmt: skip


NEVER_OVERWRITTEN = "a calibration is never overwritten"


def test_building_over_an_existing_file_names_it_and_changes_nothing(tmp_path, capsys):
    from conftest import RUNS

    output = tmp_path / "calibration.json"
    output.write_bytes(b"mine")
    probes = RUNS / "20261203T212500Z-h200-probes"
    assert gc.main(["build", str(probes), "--output", str(output)]) == 2
    said = capsys.readouterr().err
    assert said == f"gpu_calibration.py: error: {output}: file exists ({NEVER_OVERWRITTEN})\n"
    assert output.read_bytes() == b"mine"
    assert gc.main(["build", str(tmp_path), "--output", str(tmp_path / "new.json")]) == 2
    assert "no probe documents" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.json"]


# ---------------------------------------------------------------- the trace


def inference(step):
    def drive(phase):
        def run():
            with torch.inference_mode():
                return step()

        phase("step", run)

    return drive


def ops(trace) -> list:
    return [(e[1].name, [n for *_, n in e[1].outputs]) for e in trace.events if e[0] == "op"]


def test_layer_norm_under_inference_mode_is_traced_through_its_statistics():
    """A GPU runs layer_norm's composite function: native_layer_norm makes the output and
    the float32 mean and rstd, which die with the call; the trace records them."""
    w, b = x(64), x(64)
    trace = tp.run_trace(
        torch, "meta", inference(lambda: torch.nn.functional.layer_norm(x(4, 8, 64), [64], w, b))
    )
    assert ("aten.native_layer_norm.default", [4 * 8 * 64 * 4, 4 * 8 * 4, 4 * 8 * 4]) in ops(trace)
    assert not any(name == "aten.layer_norm.default" for name, _ in ops(trace))


def test_softmax_of_float16_to_float32_stays_one_call():
    """On a GPU that call takes the kernel's own half-to-float path; on meta the composite
    converts first (another block): not traced through."""
    half = x(4, 64, dtype=torch.float16)
    trace = tp.run_trace(torch, "meta", inference(lambda: torch.softmax(half, -1, torch.float32)))
    assert [name for name, _ in ops(trace)] == ["aten.softmax.int"]
    single = x(4, 64)
    trace = tp.run_trace(torch, "meta", inference(lambda: torch.softmax(single, -1)))
    assert [name for name, _ in ops(trace)] == ["aten._softmax.default"]


@pytest.mark.parametrize("wanted", [False, True])
def test_cudnn_attention_makes_its_logsumexp_only_when_asked(wanted):
    q = x(2, 4, 128, 64, dtype=torch.bfloat16)

    def step():
        return aten._scaled_dot_product_cudnn_attention(q, q, q, None, wanted, 0.0, True, False)

    trace = tp.run_trace(torch, "meta", inference(step))
    ((name, sizes),) = ops(trace)
    assert name == "aten._scaled_dot_product_cudnn_attention.default"
    lse = 2 * 4 * 128 * 4  # float32, one per query row
    assert (lse in sizes) is wanted
    prediction = tp.predict(trace)
    assert not prediction.mismatches


@pytest.mark.parametrize("module", [torch.nn.Dropout(0.1), torch.nn.Dropout(0.0)])
def test_dropout_outside_training_returns_its_input_as_on_a_gpu(module):
    """ATen's dropout returns the input itself outside training (Dropout.cpp); the Python
    decomposition registered for it clones. An eval model traced with clones had a block
    more per dropout and the blocks after it elsewhere: Pythia-160M's real run kept 589,824 B
    more than the trace said "exact"."""
    module.eval()
    hidden = x(2, 16, 64)

    def step():
        out = module(hidden)
        assert out is hidden
        return out

    trace = tp.run_trace(torch, "meta", inference(step))
    assert ops(trace) == []


def test_matmul_under_inference_mode_is_traced_through_its_products():
    """A GPU runs matmul's composite function (`_matmul_impl`, which branches on shapes,
    strides and requires_grad, never on the device): attention scores of (B, H, L, D) x
    (B, H, D, S) expand, fold the batch dimensions and call bmm, which the calibration's
    workspace patterns cover. Recorded whole, matmul was a call no probe had seen (Gemma-2's
    eager attention, the math kernel)."""
    q = x(2, 4, 16, 8)
    k = x(2, 4, 16, 8)
    trace = tp.run_trace(torch, "meta", inference(lambda: torch.matmul(q, k.transpose(-1, -2))))
    assert ops(trace) == [
        ("aten.transpose.int", []),
        ("aten.expand.default", []),
        ("aten.reshape.default", []),
        ("aten.expand.default", []),
        ("aten.reshape.default", []),
        ("aten.bmm.default", [2 * 4 * 16 * 16 * 4]),
        ("aten._unsafe_view.default", []),
    ]


def test_repeat_interleave_by_a_number_is_traced_through_its_copy():
    """Grouped-query heads repeated for the math kernel (`repeat_interleave.self_int`): the
    C++ function unsqueezes, expands and clones, one copy of the result's bytes; by a tensor
    of repeats its sizes come from values, and it stays one call."""
    kv = x(2, 2, 16, 8)
    trace = tp.run_trace(torch, "meta", inference(lambda: torch.repeat_interleave(kv, 3, dim=1)))
    assert ops(trace) == [
        ("aten.unsqueeze.default", []),
        ("aten.expand.default", []),
        ("aten.clone.default", [2 * 6 * 16 * 8 * 4]),
        ("aten.flatten.using_ints", []),
    ]
