"""What makes the GPU-free estimate fast must not move it: each shortcut in
the trace held to the plain way it replaces (tests/benchmarks/estimate_speed.py times
them, and compares whole estimates)."""

from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit import mesure_memoire as mm
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace import prediction as predicting
from pipeline.predicting.trace import recorder as recording
from pipeline.predicting.trace import replay as replaying
from pipeline.predicting.trace_prediction import PredictionStatus

torch = pytest.importorskip("torch")
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

MIB = 2**20
# Sizes that collide often (choices between free blocks of one size) in both pools.
SIZES = st.sampled_from([512, 1000, 4096, MIB, MIB + 1, 3 * MIB, 4 * MIB, 12 * MIB, 22 * MIB])
STEPS = st.lists(st.tuples(st.booleans(), SIZES, st.integers(0, 2**16)), max_size=80)


class PlainRanked(mm.AllocatorModel):
    """RankedSegments on the plain model: the oracle for the indexed one."""

    def __init__(self, segment_rank) -> None:
        super().__init__()
        self.segment_rank, self.segments = segment_rank, 0

    def malloc(self, nbytes: int):
        reserved = self.reserved
        self.next_address = self.segment_rank(self.segments) * tp.RankedSegments.SPAN
        block = super().malloc(nbytes)
        self.segments += self.reserved != reserved
        return block


def run(allocator, steps) -> list:
    """Each step's choice (the block's address and size) and the four counters."""
    live, seen = [], []
    for is_malloc, nbytes, pick in steps:
        if is_malloc or not live:
            block = allocator.malloc(nbytes)
            live.append(block)
            where = None if block is None else (block["address"], block["size"])
        else:
            allocator.free(live.pop(pick % len(live)))
            where = None
        counters = (allocator.allocated, allocator.reserved)
        seen.append((where, *counters, allocator.peak_allocated, allocator.peak_reserved))
    return seen


@settings(max_examples=300, deadline=None)
@given(STEPS, st.sampled_from(["plain", "reversed", "shuffled"]))
def test_the_indexed_allocator_makes_the_models_choices(steps, order):
    """Block for block and counter for counter, under the orders predict() replays."""
    rank = {"reversed": lambda: lambda n: -n, "shuffled": lambda: tp.shuffled(3)}.get(order)
    if rank is None:
        assert run(tp.IndexedAllocator(), steps) == run(mm.AllocatorModel(), steps)
    else:
        assert run(tp.RankedSegments(rank()), steps) == run(PlainRanked(rank()), steps)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_without_a_choice_between_segments_no_order_moves_a_counter(steps):
    """address_choice False: the replay under any other order makes the same choices, the
    ground on which predict() skips those replays."""
    plain = tp.IndexedAllocator()
    counters = [step[1:] for step in run(plain, steps)]
    others = [
        [step[1:] for step in run(PlainRanked(order()), steps)] for order in tp.OTHER_ADDRESS_ORDERS
    ]
    if not plain.address_choice:
        assert all(other == counters for other in others)
    if any(other != counters for other in others):
        assert plain.address_choice


def test_a_choice_is_only_between_blocks_of_one_size_in_different_segments():
    two = tp.IndexedAllocator()
    p, _ = two.malloc(4 * MIB), two.malloc(16 * MIB)  # segment 0, full
    r, _ = two.malloc(4 * MIB), two.malloc(16 * MIB)  # segment 1, full
    two.free(p)
    two.free(r)
    two.malloc(4 * MIB)
    assert two.address_choice
    one = tp.IndexedAllocator()
    a, _, c, _ = (one.malloc(4 * MIB) for _ in range(4))  # one 20 MiB segment
    one.free(a)
    one.free(c)
    one.malloc(4 * MIB)  # two 4 MiB blocks, one segment: their order is known
    one.malloc(3 * MIB)  # the other 4 MiB block, the only one left of its size
    assert not one.address_choice


def test_predict_replays_other_orders_only_when_a_choice_was_made(monkeypatch):
    replays = collections.Counter()
    original = replaying.replay

    def counted(trace, calibration, segment_rank=None, **kwargs):
        replays[segment_rank is not None] += 1
        return original(trace, calibration, segment_rank, **kwargs)

    monkeypatch.setattr(replaying, "replay", counted)
    trace = tp.Trace(device="meta", build="cpu-only", torch_version="")
    trace.events += [("start", "one", None, 1), ("unseen", 0, 4 * MIB), ("end",)]
    assert tp.predict(trace).status == PredictionStatus.EXACT
    assert replays == {False: 1}


class Registered(collections.namedtuple("Registered", "a b")):
    pass


@pytest.mark.parametrize(
    "tree",
    [
        None,
        3,
        ((1, 2.5, None), {"dim": [0, 1], "keepdim": True, "dtype": torch.bfloat16}),
        ([torch.empty(2), torch.empty(3)], {"device": torch.device("cpu")}),
        ((torch.Size([2, 3]), [4]), {}),  # torch.Size is a pytree node
        (collections.OrderedDict(b=1, a=torch.empty(1)),),
        (Registered(torch.empty(1), [2, 3]), {"x": (torch.contiguous_format,)}),
        ({"b": 1, "a": [2, {"c": 3, "d": 4}]},),
        (object(), [1]),
    ],
)
def test_the_quick_flatten_gives_pytrees_leaves(tree):
    from torch.utils._pytree import tree_flatten

    flatten = tp.make_flatten(torch)
    expected = tree_flatten(tree)[0]
    leaves = flatten(tree)[0]
    assert len(leaves) == len(expected)
    assert all(a is b or a == b for a, b in zip(leaves, expected, strict=True))


def test_two_trees_have_one_shape_where_pytree_gives_one_spec():
    """The recorder keeps one TreeSpec per shape: its text is in each signature's hash."""
    from torch.utils._pytree import tree_flatten

    t = torch.empty(1)
    trees = [
        ((t, 1), {}), ((t, 1.5), {}), ((t, None), {}), ((t, [1, 2]), {}), ((t, (1, 2)), {}),
        ((t, [1]), {}), ((t,), {"dim": 1}), ((t,), {"dim": [1]}), ((t,), {"keepdim": 1}),
        ((t,), {"dim": 1, "keepdim": True}), ((t,), {"keepdim": True, "dim": 1}),
        (({1: t},), {}), (({True: t},), {}), (({"1": t},), {}), ((t, 1), {}), ((t, [[]]), {}),
        ((t, []), {}), ((t, ()), {}), ((t, {}), {}),
    ]  # fmt: skip
    flatten = tp.make_flatten(torch)
    shapes = [flatten(tree)[1] for tree in trees]
    texts = [str(tree_flatten(tree)[1]) for tree in trees]
    assert None not in shapes
    for i, j in itertools.combinations(range(len(trees)), 2):
        assert (shapes[i] == shapes[j]) == (texts[i] == texts[j]), (trees[i], trees[j])
    assert flatten((torch.Size([2]),))[1] is None  # pytree's own: no shape


def protocol(device: str):
    """Training with views, in-place updates, a gradient summed from two uses, a dtype change
    (fake parameters are swapped), dropout, attention and an optimizer: storages that die
    at every kind of place."""

    def drive(phase):
        def load():
            model = torch.nn.ModuleDict(
                {
                    "embed": torch.nn.Embedding(32, 16, device=device),
                    "attention": torch.nn.MultiheadAttention(16, 2, batch_first=True),
                    "norm": torch.nn.LayerNorm(16, device=device),
                    "out": torch.nn.Linear(16, 32, device=device),
                }
            ).to(device)
            model.to(torch.float64).to(torch.float32)
            return model, torch.optim.AdamW(model.parameters(), foreach=True)

        _, (model, optimizer) = phase("model_load", load)
        _, x = phase("inputs", lambda: torch.zeros(2, 6, dtype=torch.long, device=device))

        def step():
            optimizer.zero_grad()
            h = model["embed"](x)
            a, _ = model["attention"](h, h, h, need_weights=False)
            h = model["norm"](torch.nn.functional.dropout(a + h, 0.1) + h[:, :1])
            loss = model["out"](h).transpose(0, 1)[1:].float().square().mean()
            loss.backward()
            optimizer.step()
            return loss

        for name in ("cold_step", "warm_step"):
            phase(name, step)

    return drive


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_the_storage_callbacks_report_the_frees_a_scan_finds(monkeypatch, device):
    """Every event, frees included and in the same order, whether the recorder learns of a
    storage's end by its callback or asks every live storage at every operator."""
    traces = {}
    for mode in ("scan", "callback"):
        monkeypatch.setattr(recording, "FREE_DETECTION", mode)
        torch.manual_seed(0)
        traces[mode] = tp.run_trace(torch, device, protocol(device), fake=device == "meta")
    scan, callback = traces["scan"], traces["callback"]
    assert scan.stopped is None
    frees = [event for event in scan.events if event[0] == "free"]
    assert len(frees) > 100
    assert callback.events == scan.events
    assert callback.signatures.keys() == scan.signatures.keys()
    assert tp.predict(callback).rows == tp.predict(scan).rows


def test_a_storage_reported_while_it_lives_is_freed_when_it_goes(monkeypatch):
    """A report whose storage still lives (its Python object went first, with no callback
    to come) is asked again at every operator until the storage goes, as a scan would."""

    def drive(phase):
        recorder = phase.__self__.recorder

        def run():
            x = torch.ones(4, device="meta")
            key = StorageWeakRef(x.untyped_storage()).cdata
            recorder.live[key] = (*recorder.live[key][:3], None)  # no callback to come
            recorder.reported.append(key)
            y = x + 1  # x lives on: not freed here
            del x
            return y * 2  # freed before this operator

        phase("one", run)

    traces = {}
    for mode in ("scan", "callback"):
        monkeypatch.setattr(recording, "FREE_DETECTION", mode)
        traces[mode] = tp.run_trace(torch, "meta", drive)
    assert [event[0] for event in traces["scan"].events].count("free") == 2  # x, then y
    assert traces["callback"].events == traces["scan"].events


def test_each_call_replays_its_own_signatures_template():
    """The replay looks each signature's template up once (a pattern's lookup is not free):
    two signatures of one operator keep their own."""
    trace = tp.Trace(device="meta", build="cpu-only", torch_version="")
    trace.events.append(("start", "one", None, 1))
    for sid, signature in enumerate(("scratchy", "plain", "scratchy", "plain")):
        trace.events.append(
            ("op", tp.OpCall("aten.mm.default", "caller", signature, ((0, sid, 1024),)))
        )
    trace.events.append(("end",))
    calibration = tp.Calibration(
        templates={"scratchy": [("output", 0, 1024), ("internal", 0, 4 * MIB), ("free", 0)]},
        output_only={"plain"},
    )
    log = tp.replay(trace, calibration)[1]
    assert [what for kind, _, what in log if kind == "alloc"] == [
        "aten.mm.default", "aten.mm.default scratch", "aten.mm.default",
        "aten.mm.default", "aten.mm.default scratch", "aten.mm.default",
    ]  # fmt: skip


def choice_trace() -> tp.Trace:
    """Two full segments, a block of each freed, then asked for again: the replay chooses
    between segments, so predict() replays every other order of their addresses."""
    trace = tp.Trace(device="meta", build="cpu-only", torch_version="")
    sizes = [4 * MIB, 16 * MIB, 4 * MIB, 16 * MIB]
    trace.events.append(("start", "one", None, 1))
    trace.events += [("unseen", sid, nbytes) for sid, nbytes in enumerate(sizes)]
    trace.events += [("free", 0), ("free", 2), ("unseen", 4, 4 * MIB), ("unseen", 5, 3 * MIB)]
    trace.events.append(("end",))
    return trace


def test_side_by_side_gives_each_result_in_order_forked_or_not(monkeypatch):
    monkeypatch.setattr(predicting, "usable_cpus", lambda: 2)
    serial = predicting.side_by_side(lambda base, n: (base, n * n), ("x",), range(7), forked=False)
    assert serial == [("x", n * n) for n in range(7)]
    assert predicting.side_by_side(lambda base, n: (base, n * n), ("x",), range(7)) == serial
    assert predicting._SHARED == ()


def test_predict_with_the_other_orders_replayed_in_workers_is_the_serial_prediction(
    monkeypatch,
):
    trace = choice_trace()
    monkeypatch.setattr(predicting, "FORKED_REPLAYS", 10**9)
    serial = tp.prediction_record(trace, tp.predict(trace), None)
    workers = []
    original = predicting.side_by_side

    def watched(function, arguments, items, forked=True):
        workers.append((forked, len(items)))
        return original(function, arguments, items, forked)

    monkeypatch.setattr(predicting, "FORKED_REPLAYS", 0)
    monkeypatch.setattr(predicting, "usable_cpus", lambda: 2)
    monkeypatch.setattr(predicting, "side_by_side", watched)
    assert tp.prediction_record(trace, tp.predict(trace), None) == serial
    assert workers == [(True, len(tp.OTHER_ADDRESS_ORDERS))]  # a choice: every order replayed


def hf_protocol(task: str, device: str = "meta"):
    """A two-layer Llama from its published config, float32, batch 2 × 16 tokens (and 4 new
    tokens through its own cache)."""
    pytest.importorskip("transformers")
    from test_hf_model import reduced

    from pipeline.measuring import own_model
    from pipeline.workloads import hf_model

    config = reduced("llama-3.2-1b")
    dims = {"sequence": 16, **({"new_tokens": 4} if task == "generate" else {})}

    def drive(phase):
        configuration = own_model.Configuration(torch.device(device), torch.float32, 2, 0)

        def function(config_, **given):
            return hf_model.build(config_, config, task, False, **given)

        kind = "training" if task == "training" else "inference"
        own_model.drive(torch, phase, function, kind, configuration, dims, 1, 1, [], {}, ())

    return drive


def decoder_protocol(device: str = "meta"):
    from pipeline.measuring import decoder

    shape = decoder.Shape(layers=2, width=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=64)
    run = {**decoder.RUN_DEFAULTS, "batch": 2, "prompt": 8, "new_tokens": 6, "dtype": "bfloat16"}
    return lambda phase: decoder.measure_rows(
        torch, shape, run, 0, torch.device(device), [], phase=phase
    )


def inference_mode_views(device: str):
    """Views of one signature on a normal tensor (as a parameter is) and on tensors made under
    inference mode: a view of the first is normal, of the others an inference tensor."""

    def run():
        weight = torch.zeros(4, 8, device=device)
        with torch.inference_mode():
            for _ in range(12):
                made = torch.zeros(4, 8, device=device)
                for base in (made, weight):
                    base.t().sum()

    return lambda phase: phase("one", run)


WORKLOADS = {  # name -> device -> the drive of tp.run_trace
    "views under inference mode": inference_mode_views,
    "modules and AdamW": protocol,
    "decoder generating": decoder_protocol,
    "llama training": lambda device: hf_protocol("training", device),
    "llama generating": lambda device: hf_protocol("generate", device),
}


def counted_calls(monkeypatch, *names) -> collections.Counter:
    """Calls of each named torch_private function from here on, by name."""
    calls = collections.Counter()
    for name in names:
        original = getattr(tp.torch_private, name)

        def counted(*args, name=name, original=original):
            calls[name] += 1
            return original(*args)

        monkeypatch.setattr(tp.torch_private, name, counted)
    return calls


def answered_and_plain(monkeypatch, name: str, device: str):
    """Views, in-place calls and calls making new tensors, of a signature already seen, are
    answered without the fake mode (Recorder.viewed, Recorder.in_place, Recorder.made): every
    event, signature and predicted counter the same as with every call through it. The
    answers are counted, so that the test cannot pass by never taking them."""
    answered = counted_calls(monkeypatch, "fake_view", "fake_holds_value", "fake_outputs")
    traces = {}
    for answering in (False, True):
        monkeypatch.setattr(recording, "KNOWN_CALLS_ANSWERED", answering)
        torch.manual_seed(0)
        traces[answering] = tp.run_trace(torch, device, WORKLOADS[name](device))
        if not answering:
            assert answered == {}
    plain, quick = traces[False], traces[True]
    assert plain.stopped is None
    assert answered["fake_view"] > 10
    assert answered["fake_holds_value"] > 10
    assert answered["fake_outputs"] > 10
    assert quick.events == plain.events
    assert quick.signatures.keys() == plain.signatures.keys()
    assert [s.calls for s in quick.signatures.values()] == [
        s.calls for s in plain.signatures.values()
    ]
    assert tp.predict(quick).rows == tp.predict(plain).rows


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_calls_the_recorder_answers_leave_the_trace_as_the_fake_mode_makes_it(monkeypatch, name):
    answered_and_plain(monkeypatch, name, "meta")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_on_a_gpus_fake_tensors_the_answers_would_leave_the_trace_as_it_is(monkeypatch, name):
    """The comparison on the GPU's fake tensors, as the trace beside a measurement makes them
    (ANSWERED_ON holds "cuda" on its ground)."""
    answered_and_plain(monkeypatch, name, "cuda:0")


def test_an_in_place_call_that_changes_its_tensor_goes_through_the_fake_mode_each_time():
    """resize_ returns its argument with another shape: its second call, the same signature
    as the first, must resize too (a new block of the new size, the old one freed)."""

    def drive(phase):
        def run():
            kept = []
            for _ in range(3):
                x = torch.empty(0, device="meta")
                x.resize_(1024)
                kept.append(x.view(32, 32))
            return kept

        phase("one", run)

    trace = tp.run_trace(torch, "meta", drive)
    assert trace.stopped is None
    resized = [event for event in trace.events if event[0] == "resize"]
    assert [event[2] for event in resized] == [4096, 4096, 4096]


def test_a_view_whose_signature_was_seen_is_a_view_of_its_own_argument():
    """Answered views share their own argument's storage, never the first call's."""
    seen = []

    def drive(phase):
        def run():
            for _ in range(3):
                x = torch.zeros(4, 6, device="meta")
                y = x[:, 2:]
                seen.append((y.shape, y.stride(), y.storage_offset(), y.untyped_storage()))
                seen.append(x.untyped_storage())

        phase("one", run)

    trace = tp.run_trace(torch, "meta", drive)
    assert trace.stopped is None
    for view, base in zip(seen[::2], seen[1::2], strict=True):
        assert view[:3] == ((4, 4), (6, 1), 2)
        assert StorageWeakRef(view[3]).cdata == StorageWeakRef(base).cdata


def test_a_call_making_a_tensor_under_another_default_dtype_is_not_answered_as_before():
    """torch.ones(4) reaches the dispatcher without a dtype: the default dtype at that moment
    gives its bytes, so two calls of one signature under two defaults make two sizes."""

    def drive(phase):
        def run():
            kept = [torch.ones(4, device="meta")]
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                kept.append(torch.ones(4, device="meta"))
            finally:
                torch.set_default_dtype(previous)
            kept.append(torch.ones(4, device="meta"))
            return kept

        phase("one", run)

    trace = tp.run_trace(torch, "meta", drive)
    made = [e[1] for e in trace.events if e[0] == "op" and e[1].name == "aten.ones.default"]
    assert [op.outputs[0][2] for op in made] == [16, 32, 16]


def test_the_answers_are_given_on_the_devices_named_and_never_on_real_tensors(monkeypatch):
    """The meta device's fake tensors (the estimate) and a GPU's (the trace beside a
    measurement) get the answers; a device not named, or a trace of real tensors, does not."""

    def answers(device, fake=True):
        return tp.make_recorder(torch)(tp.Tracer(torch, device, fake, None)).answers

    assert answers("meta")
    assert answers("cuda:0")
    assert not answers("cpu", fake=False)
    monkeypatch.setattr(recording, "ANSWERED_ON", ("meta",))
    assert not answers("cuda:0")
    monkeypatch.setattr(recording, "KNOWN_CALLS_ANSWERED", False)
    assert not answers("meta")


@pytest.mark.parametrize(
    ("op", "pure"),
    [
        (torch.ops.aten.mm.default, True),
        (torch.ops.aten.cat.default, True),
        (torch.ops.aten.nonzero.default, False),  # its shape comes from values
        (torch.ops.aten.index.Tensor, False),  # by a mask: the same
        (torch.ops.aten.add_.Tensor, False),  # writes into its first argument
        (torch.ops.aten.mul.out, False),  # writes into `out`
        (torch.ops.aten.transpose.int, False),  # a view
    ],
)
def test_only_operators_whose_outputs_follow_their_arguments_descriptions_are_answered(op, pure):
    recorder = tp.make_recorder(torch)(tp.Tracer(torch, "meta", True, None))
    assert recorder.facts(op).pure is pure


@pytest.mark.parametrize("name", ["TransformerEncoder", "TransformerDecoder", "MultiheadAttention",
                                  "LSTM", "GRU", "convolutions and norms", "LayerNorm RMSNorm",
                                  "tensors from data", "a schedule on the host"])  # fmt: skip
def test_torch_nn_modules_traced_for_the_h200_are_the_same_answered_or_not(monkeypatch, name):
    """torch.nn's own modules (test_trace_builtins.py's), a bfloat16 training step predicted
    for the H200 (cuDNN's recurrent calls, the attention rule): the same trace either way."""
    from test_trace_builtins import MODULES
    from test_trace_builtins import protocol as module_protocol

    from pipeline.predicting import attention_choice

    made = counted_calls(monkeypatch, "fake_outputs")
    traces = {}
    for answering in (False, True):
        monkeypatch.setattr(recording, "KNOWN_CALLS_ANSWERED", answering)
        torch.manual_seed(0)
        drive = module_protocol(MODULES[name], "meta", torch.bfloat16, True)
        traces[answering] = tp.run_trace(torch, "meta", drive, target=attention_choice.H200)
    plain, quick = traces[False], traces[True]
    assert plain.stopped is None
    assert made["fake_outputs"] > 0
    assert quick.events == plain.events
    assert quick.signatures.keys() == plain.signatures.keys()
    assert tp.predict(quick).rows == tp.predict(plain).rows
