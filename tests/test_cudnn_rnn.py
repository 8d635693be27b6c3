"""Recurrent layers traced for a GPU as cuDNN runs them (cudnn_rnn.py), held to the GPUs'
own probes (runs/*-rnn-probe*/, allocator histories that share no code with the trace) and
to the LSTM points measured after their GPU-free predictions were committed."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import RUNS

from pipeline.predicting import attention_choice, cudnn_rnn
from pipeline.predicting import trace_prediction as tp

torch = pytest.importorskip("torch")
nn = torch.nn
MODULES = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN_TANH": nn.RNN, "RNN_RELU": nn.RNN}
MODES = {"LSTM": cudnn_rnn.LSTM, "GRU": cudnn_rnn.GRU, "RNN_TANH": cudnn_rnn.RNN_TANH,
         "RNN_RELU": cudnn_rnn.RNN_RELU}  # fmt: skip
ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
H200_PROBE = RUNS / "20261205T163041Z-h200-rnn-probe" / "rnnprobe.json.gz"
H100_PROBE = RUNS / "20261205T184600Z-h100-rnn-probe-2" / "rnnprobe2.json.gz"
H100_PROBE_3 = RUNS / "20261206T044500Z-h100-rnn-probe-3" / "rnnprobe3.json.gz"
BLIND = RUNS / "20261205T175000Z-lstm-blind"
BLIND_RECURRENT = RUNS / "20261205T172000Z-rnn-blind"
REPREDICTED = RUNS / "20261205T181500Z-rnn-repredicted"
RERUN = RUNS / "20261205T182000Z-rnn-rerun-h100"


def probe_rows(path):
    return [
        row for row in json.loads(gzip.decompress(path.read_bytes()))["rows"] if "error" not in row
    ]


def traced(row, target=attention_choice.H200, training=True):
    """One forward (and backward) of the probe's module, traced on the meta device."""
    dtype = getattr(torch, row["dtype"])

    def drive(phase):
        def build():
            options = {} if row["mode"] != "RNN_RELU" else {"nonlinearity": "relu"}
            if row.get("proj"):
                options["proj_size"] = row["proj"]
            module = MODULES[row["mode"]](
                row["input"], row["hidden"], row["layers"], bias=row.get("bias", True),
                batch_first=row["batch_first"], bidirectional=row["bidir"],
                dropout=row.get("dropout", 0.0), **options,
            )  # fmt: skip
            return module.to(device="meta", dtype=dtype)

        _, module = phase("model_load", build)
        sizes = (row["seq"], row["batch"], row["input"])
        shape = (sizes[1], sizes[0], sizes[2]) if row["batch_first"] else sizes

        def step():
            x = torch.randn(shape, device="meta", dtype=dtype, requires_grad=training)
            y = module.train(training)(x)[0]
            if training:
                y.backward(torch.ones_like(y))

        phase("step", step)

    return tp.run_trace(torch, "meta", drive, target=target)


def ops(trace, name):
    return [event[1] for event in trace.events if event[0] == "op" and event[1].name == name]


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_for_a_gpu_the_trace_calls_cudnn_and_its_backward_with_cudnns_blocks(mode, dtype):
    row = dict(mode=mode, dtype=dtype, input=24, hidden=40, layers=3, bidir=True, seq=7,
               batch=5, batch_first=True)  # fmt: skip
    trace = traced(row)
    assert "recurrent layers" not in trace.notes
    [forward], [backward] = ops(trace, cudnn_rnn.FORWARD), ops(trace, cudnn_rnn.BACKWARD)
    element, directions = ELEMENT[dtype], 2
    a = cudnn_rnn.RESERVE_PER_LAYER[MODES[mode]]
    reserve = (a * 3 - 1) * 7 * 5 * 40 * directions * element + 256
    assert forward.outputs[3][2] == cudnn_rnn.reserve_bytes(MODES[mode], 3, 2, 35, 40, 0, element)
    sizes = [nbytes for _, _, nbytes in forward.outputs]
    assert sizes[:4] == [7 * 5 * 80 * element, 6 * 5 * 40 * element,
                         6 * 5 * 40 * element if mode == "LSTM" else 0, reserve]  # fmt: skip
    weights = cudnn_rnn.weight_elements(MODES[mode], 24, 40, 0, 3, 2) * element
    # float32 parameters are one flat buffer since model_load; bfloat16 ones are copied into
    # a new buffer at each call (torch.backends.cudnn does not accept bfloat16)
    assert sizes[4:] == ([weights] if dtype == "bfloat16" else [])
    assert [nbytes for _, _, nbytes in backward.outputs][-1] == weights


def test_flattening_on_the_gpu_makes_one_zeroed_buffer_and_frees_the_parameters_blocks():
    row = dict(mode="LSTM", dtype="float32", input=16, hidden=32, layers=2, bidir=False,
               seq=3, batch=2, batch_first=False)  # fmt: skip
    trace = traced(row)
    load = trace.events[: next(i for i, e in enumerate(trace.events) if e[0] == "end")]
    [flat] = [e[1] for e in load if e[0] == "op" and e[1].name == "aten.new_zeros.default"]
    assert flat.outputs[0][2] == cudnn_rnn.weight_elements(cudnn_rnn.LSTM, 16, 32, 0, 2, 1) * 4
    without = traced(row, target=None)
    assert not [e for e in without.events if e[0] == "op" and e[1].name == "aten.new_zeros.default"]
    assert "recurrent layers" in without.notes  # no GPU named: the meta device's own path


def test_evaluation_mode_makes_no_reserve():
    row = dict(mode="GRU", dtype="float16", input=8, hidden=16, layers=2, bidir=False, seq=4,
               batch=3, batch_first=False)  # fmt: skip
    [forward] = ops(traced(row, training=False), cudnn_rnn.FORWARD)
    assert forward.outputs[3][2] == 0


def test_the_h200s_probes_reserve_output_and_gradient_buffer_are_the_traces():
    """Oracle: every 25th probed call, every mode and dtype, LSTMs with projections among
    them; the trace's reserve equals the probe's (its one call 16 B larger is not among
    them: checked), its output and weights' gradient buffer are blocks of the probe's
    history."""
    rows = probe_rows(H200_PROBE)[::25]
    assert len(rows) == 48
    assert len([row for row in rows if row["proj"]]) >= 5
    for row in rows:
        trace = traced(row)
        [forward], [backward] = ops(trace, cudnn_rnn.FORWARD), ops(trace, cudnn_rnn.BACKWARD)
        assert forward.outputs[3][2] == row["reserve"], row
        train = [size for action, size in row["train"] if action == "a"]
        assert forward.outputs[0][2] in train
        assert backward.outputs[-1][2] in [
            size for action, size in row["backward"] if action == "a"
        ]


def arguments_of(row) -> dict:
    """A probed call's arguments as the trace describes them (the ones scratch_bound reads)."""
    sizes = (row["seq"], row["batch"], row["input"])
    shape = (sizes[1], sizes[0], sizes[2]) if row["batch_first"] else sizes
    return {
        "input": ("tensor", row["dtype"], shape, (), 0, 0, "device"),
        "mode": MODES[row["mode"]],
        "hidden_size": row["hidden"],
        "proj_size": row.get("proj") or 0,
        "num_layers": row["layers"],
        "bidirectional": row["bidir"],
        "batch_first": row["batch_first"],
        "batch_sizes": [],
    }


def made_and_freed(history) -> list[int]:
    """The blocks a history allocates and frees again (each free matched to the latest
    allocation of its size)."""
    open_, done = [], []
    for action, size in history:
        if action == "a":
            open_.append(size)
        elif size in open_:
            open_.reverse()
            open_.remove(size)
            open_.reverse()
            done.append(size)
    return done


@pytest.mark.parametrize(
    "path", [H200_PROBE, H100_PROBE, H100_PROBE_3], ids=["h200", "h100", "h100-float64-projected"]
)
def test_every_probed_workspace_lies_within_the_bound_the_most_replay_gives(path):
    """Forward (training and evaluation) and backward: every block a call made and freed
    that is as large as the fixed part (the workspaces) is within scratch_bound, and each
    forward's workspace is at least the fixed part."""
    seen = 0
    for row in probe_rows(path):
        if row.get("kind", "train") not in ("train", "eval"):
            continue
        arguments = arguments_of(row)
        bound = cudnn_rnn.scratch_bound(arguments)
        fixed = cudnn_rnn.RNN_WORKSPACE_PER_LAYER * row["layers"] * (2 if row["bidir"] else 1)
        forward = row.get("train") or row["forward"]
        assert max(made_and_freed(forward)) >= fixed, row
        for history in (forward, row.get("backward", [])):
            for size in made_and_freed(history):
                assert size < fixed or size <= bound, (size, bound, row)
                seen += size >= fixed
    assert seen > {H200_PROBE: 2000, H100_PROBE: 500, H100_PROBE_3: 300}[path]


@pytest.mark.parametrize(
    ("folder", "predictions"),
    [
        (BLIND, BLIND / "cpu"),
        (BLIND_RECURRENT, BLIND_RECURRENT / "cpu"),
        (BLIND, REPREDICTED / "lstm-lm"),
        (BLIND_RECURRENT, REPREDICTED / "recurrent"),
    ],
    ids=["lstm-lm", "recurrent", "lstm-lm-repredicted", "recurrent-repredicted"],
)
def test_the_points_measured_after_their_prediction_lie_within_its_bounds(folder, predictions):
    """The committed GPU-free predictions (--gpu h200), then measured on an H100 with the
    same cuDNN: every phase's peaks inside the bounds, and each measurement's own
    prediction, calibrated there, exact where it claimed so."""
    names = [line.split()[0] for line in (folder / "points.txt").read_text().splitlines()
             if line and not line.startswith("#")]  # fmt: skip
    assert len(names) == 6
    for name in names:
        predicted = json.loads((predictions / f"{name}.json").read_text())["prediction"]
        measured = json.loads((folder / "h100" / f"{name}.json").read_text())
        assert predicted["status"] == "approximate"
        bounds = {(b["phase"], b.get("repetition")): b for b in predicted["bounds"]["phases"]}
        for row in measured["phases"]:
            found = bounds[(row["phase"], row.get("repetition"))]
            for key in tp.PEAK_KEYS:
                assert found[key]["lower"] <= row[key] <= found[key]["upper"], (name, row)
        claim = measured["summary"]["prediction"]
        assert claim["status"] != "exact" or claim["held"] is True


def test_an_lstm_with_projections_takes_cudnn_with_its_projected_state_and_reserve():
    row = dict(mode="LSTM", dtype="float16", input=24, hidden=40, layers=3, bidir=True, seq=7,
               batch=5, batch_first=False, proj=16)  # fmt: skip
    trace = traced(row)
    assert "recurrent layers" not in trace.notes
    [forward] = ops(trace, cudnn_rnn.FORWARD)
    sizes = [nbytes for _, _, nbytes in forward.outputs]
    reserve = ((7 * 3 - 1) * 40 + 3 * 16) * 35 * 2 * 2 + 256
    assert sizes == [7 * 5 * 32 * 2, 6 * 5 * 16 * 2, 6 * 5 * 40 * 2, reserve]


def test_the_most_replay_gives_a_recurrent_call_cudnns_own_scratch_bound():
    """Not the generic 8 times the call's bytes: for a flattened LSTM that counted each
    weight view as the whole buffer (an 11.3 GB upper bound for a 0.8 GB run)."""
    row = dict(mode="LSTM", dtype="bfloat16", input=64, hidden=512, layers=2, bidir=False,
               seq=35, batch=20, batch_first=False)  # fmt: skip
    trace = traced(row)
    for name in (cudnn_rnn.FORWARD, cudnn_rnn.BACKWARD):
        [call] = ops(trace, name)
        signature = trace.signatures[call.signature]
        expected = cudnn_rnn.scratch_bound(tp.call_arguments(signature))
        assert expected == cudnn_rnn.scratch_bound(arguments_of(row))
        assert tp.scratch_bound(signature, sum(n for *_, n in call.outputs)) == expected


def test_the_recurrent_points_measured_twice_gave_the_same_peaks():
    for folder in (BLIND, BLIND_RECURRENT):
        for first in sorted((folder / "h100").glob("*.json")):
            again = json.loads((RERUN / first.name).read_text())["phases"]
            rows = json.loads(first.read_text())["phases"]
            assert [[r[k] for k in tp.PEAK_KEYS] for r in rows] == [
                [r[k] for k in tp.PEAK_KEYS] for r in again
            ], first.name


def step_history(trace) -> list[list]:
    """The step phase's blocks as an allocator history gives them: ["a", bytes] for each
    output made, ["f", bytes] for each storage freed."""
    start = next(i for i, e in enumerate(trace.events) if e[0] == "start" and e[1] == "step")
    sizes, history = {}, []
    for event in trace.events[start + 1 :]:
        if event[0] == "end":
            break
        if event[0] == "op":
            for _, sid, nbytes in sorted(event[1].outputs):
                if nbytes:
                    sizes[sid] = nbytes
                    history.append(["a", nbytes])
        elif event[0] == "free" and event[1] in sizes:
            history.append(["f", sizes.pop(event[1])])
    return history


def test_dropout_between_layers_makes_the_h100s_seed_state_and_reserve_on_the_first_call_only():
    """Oracle: the H100's probe, a fresh process, nn.LSTM(650, 650, 2, dropout=0.5) called
    twice in training: the trace's blocks are the probe's, in its order, less cuDNN's
    workspace (made and freed inside the call, not covered), the reserve within
    RESERVE_SLACK above the trace's."""
    [row] = [row for row in probe_rows(H100_PROBE) if row["kind"] == "dropout-first"]

    def drive(phase):
        _, module = phase("model_load", lambda: nn.LSTM(650, 650, 2, dropout=0.5).to("meta"))
        _, x = phase("inputs", lambda: torch.randn(35, 20, 650, device="meta").requires_grad_())
        phase("step", lambda: (module.train()(x), module(x)))  # kept, as the probe kept them

    history = step_history(tp.run_trace(torch, "meta", drive, target=attention_choice.H200))
    workspace = 57597632
    for probed in (row["first"], row["second"]):
        assert probed.count(["a", workspace]) == 1
        assert probed.count(["f", workspace]) == 1
    expected = [e for e in row["first"] + row["second"] if e[1] != workspace]
    reserves = [i for i, e in enumerate(expected) if e[1] == row["reserve"]]
    assert len(reserves) == 2
    for i in reserves:
        assert 0 <= expected[i][1] - history[i][1] <= cudnn_rnn.RESERVE_SLACK
        history[i] = expected[i]
    assert history == expected
    assert cudnn_rnn.dropout_state_bytes("NVIDIA H200") == 6488064


@pytest.mark.filterwarnings("ignore:dropout option adds dropout after all but last")
def test_every_probed_reserve_with_dropout_lies_within_the_slack_above_the_traces():
    """The H100's 15 other training calls with dropout (LSTM, GRU, RNN_TANH; 1 to 8 layers, both
    directions): the trace's reserve is at most the probe's, by RESERVE_SLACK at most."""
    rows = [row for row in probe_rows(H100_PROBE) if row.get("dropout") and row["kind"] == "train"]
    assert len(rows) == 15
    for row in rows:
        [forward] = ops(traced(row), cudnn_rnn.FORWARD)
        assert 0 <= row["reserve"] - forward.outputs[3][2] <= cudnn_rnn.RESERVE_SLACK, row


def test_the_most_replay_widens_each_reserve_by_the_slack_and_nothing_else():
    row = dict(mode="GRU", dtype="float32", input=32, hidden=64, layers=3, bidir=False, seq=9,
               batch=4, batch_first=False, dropout=0.3)  # fmt: skip
    trace = traced(row)
    [forward] = ops(trace, cudnn_rnn.FORWARD)
    wider = {forward.signature: cudnn_rnn.output_slack(forward.name)}
    assert wider[forward.signature] == {3: cudnn_rnn.RESERVE_SLACK}
    plain = tp.replay(trace, None, scenario=tp.Scenario(True, {}), logged=False)[0]
    wide = tp.replay(trace, None, scenario=tp.Scenario(True, {}, wider), logged=False)[0]
    key = "peak_allocated_bytes"
    difference = [w[key] - p[key] for p, w in zip(plain, wide, strict=True)]
    assert difference == [0, cudnn_rnn.RESERVE_SLACK]
    evaluation = ops(traced(row, training=False), cudnn_rnn.FORWARD)[0]
    assert evaluation.outputs[3][2] == 0  # no reserve to widen: the replay adds no block


@pytest.mark.parametrize(("probed_more", "agrees"), [(21, True), (1024, True), (1025, False)])
def test_a_probe_gives_the_reserve_the_trace_knows_within_the_slack(probed_more, agrees):
    """Beside a measurement, the probe of each distinct call says its reserve's size: up to
    RESERVE_SLACK above the trace's it is the probe's size that is replayed, no disagreement
    (on the H100 the word-language model's was 21 bytes above); beyond, a disagreement."""
    row = dict(mode="LSTM", dtype="float32", input=16, hidden=32, layers=2, bidir=False, seq=5,
               batch=3, batch_first=False, dropout=0.5)  # fmt: skip
    trace = traced(row)
    [forward] = ops(trace, cudnn_rnn.FORWARD)
    sizes = [nbytes for _, _, nbytes in forward.outputs]
    template = [("output", i, n + (probed_more if i == 3 else 0)) for i, n in enumerate(sizes)]
    calibration = tp.Calibration(templates={forward.signature: template})
    rows, _, mismatches, _ = tp.replay(trace, calibration)
    plain = tp.replay(trace, tp.Calibration(templates={forward.signature: [
        ("output", i, n) for i, n in enumerate(sizes)]}))[0]  # fmt: skip
    assert (cudnn_rnn.FORWARD not in mismatches) is agrees
    grown = rows[-1]["peak_allocated_bytes"] - plain[-1]["peak_allocated_bytes"]
    assert grown == (512 * -(-(sizes[3] + probed_more) // 512) - 512 * -(-sizes[3] // 512)
                     if agrees else 0)  # fmt: skip


def test_the_backwards_probe_gets_a_reserve_longer_by_the_slack_and_nothing_else_changes():
    row = dict(mode="GRU", dtype="float32", input=8, hidden=16, layers=2, bidir=False, seq=3,
               batch=2, batch_first=False, dropout=0.5)  # fmt: skip
    trace = traced(row)
    [backward] = ops(trace, cudnn_rnn.BACKWARD)
    signature = trace.signatures[backward.signature]
    args, _ = tp.torch_private.tree_unflatten(
        [tp.rebuild(torch, torch.device("cpu"), leaf) for leaf in signature.leaves], signature.spec
    )
    probed = cudnn_rnn.probe_arguments(torch, signature.name, args)
    assert args[20].numel() > 0
    assert probed[20].numel() == args[20].numel() + cudnn_rnn.RESERVE_SLACK
    assert all(a is b for i, (a, b) in enumerate(zip(args, probed, strict=True)) if i != 20)
    [forward] = ops(trace, cudnn_rnn.FORWARD)
    same = trace.signatures[forward.signature]
    plain = tp.torch_private.tree_unflatten(
        [tp.rebuild(torch, torch.device("cpu"), leaf) for leaf in same.leaves], same.spec
    )[0]
    assert cudnn_rnn.probe_arguments(torch, same.name, plain) is plain


def probe_3_training_rows():
    rows = [row for row in probe_rows(H100_PROBE_3) if row["kind"] == "train"]
    assert len(rows) == 130
    return rows


def test_every_third_probe_reserve_lies_within_the_slack_above_cudnns_rule():
    """Oracle: the H100's 130 training calls in float64 or with projections and dropout
    between layers (their mask on the projected outputs): each reserve is 0 to RESERVE_SLACK
    bytes above reserve_bytes, and exactly it in float64 without dropout."""
    for row in probe_3_training_rows():
        rule = cudnn_rnn.reserve_bytes(
            MODES[row["mode"]], row["layers"], 2 if row["bidir"] else 1, row["seq"] * row["batch"],
            row["hidden"], row.get("proj", 0), ELEMENT[row["dtype"]], bool(row.get("dropout")),
        )  # fmt: skip
        assert 0 <= row["reserve"] - rule <= cudnn_rnn.RESERVE_SLACK, row
        if not row.get("dropout"):
            assert row["reserve"] == rule, row


@pytest.mark.filterwarnings("ignore:dropout option adds dropout after all but last")
def test_float64_and_projections_with_dropout_are_traced_as_cudnn_runs_them():
    """Every 8th of those calls traced for the GPU: cuDNN's call (no meta-device note), the
    dropout state where the layers drop out, the reserve of the rule, and the weights
    flattened at model_load, as the probe found them, in float64 as in float32."""
    rows = probe_3_training_rows()[::8]
    assert {row["dtype"] for row in rows} >= {"float64", "bfloat16"}
    assert any(row.get("proj") and row.get("dropout") for row in rows)
    for row in rows:
        trace = traced(row)
        assert "recurrent layers" not in trace.notes, row
        [forward] = ops(trace, cudnn_rnn.FORWARD)
        assert 0 <= row["reserve"] - forward.outputs[3][2] <= cudnn_rnn.RESERVE_SLACK, row
        assert (len(forward.outputs) == 4) is row["flat"], row  # no buffer made per call
        made = [n for e in trace.events if e[0] == "op" for _, _, n in e[1].outputs]
        state = cudnn_rnn.dropout_state_bytes("NVIDIA H100 80GB HBM3")
        assert (made.count(state) == 1) is bool(row.get("dropout")), row
