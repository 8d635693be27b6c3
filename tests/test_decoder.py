"""The decoder workload on the CPU: presets, the model, its prediction by the trace (against
the H200's committed measurements), the schema, and bad input.

What needs a GPU (the counters themselves, the probes) is in tests/test_gpu_decoder.py."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import ROOT, RUNS, call_main, run_script, run_unread
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.artefacts import validate
from pipeline.measuring import decoder
from pipeline.predicting import trace_prediction
from pipeline.predicting.trace_prediction import PredictionStatus
from pipeline.workloads import decoder_rules

COUNTER_KEYS = decoder.COUNTER_KEYS
REGISTRY = validate.load_registry()
# One shape whose every tensor fits in one 512-byte block: counters are 512 x live tensors.
TINY = decoder.Shape(layers=1, width=8, heads=2, kv_heads=1, head_dim=4, ffn=16, vocab=16)
TINY_ARGS = ["--layers", "1", "--width", "8", "--heads", "2", "--kv-heads", "1"]
TINY_ARGS += ["--ffn", "16", "--vocab", "16"]


def run_of(**changes) -> dict:
    run = dict(decoder.RUN_DEFAULTS)
    run.update(changes)
    return run


def predicted_rows(shape: decoder.Shape, run: dict, gpu: str | None = None) -> list[dict]:
    """decoder.py estimate's rows: the trace's counters beside each row's own fields."""
    _, prediction, _ = decoder.predicted(torch, shape, run, gpu)
    return [
        {**fields, **{key: row[key] for key in COUNTER_KEYS}}
        for fields, row in zip(decoder.row_fields(run), prediction.rows, strict=True)
    ]


# ------------------------------------------------------------------ presets and shapes


@pytest.mark.parametrize(
    ("preset", "parameters"),
    [
        ("llama-3.2-1b", 1_235_814_400),  # tied LM head: the embedding is counted once
        ("llama-3.2-3b", 3_212_749_824),
        ("llama-3.1-8b", 8_030_261_248),
        ("qwen2.5-7b", 7_615_616_512),  # with its q, k and v biases
        ("mistral-7b-v0.3", 7_248_023_552),
    ],
)
def test_presets_have_the_published_parameter_counts(preset, parameters):
    assert decoder.parameter_count(decoder.PRESETS[preset][0]) == parameters


def test_every_preset_cites_the_config_it_was_taken_from():
    for name, (_, source) in decoder.PRESETS.items():
        assert source.startswith("https://huggingface.co/"), name
        assert source.endswith("/blob/main/config.json"), name


def test_tied_and_biased_shapes_change_the_parameter_tensors():
    llama = decoder.PRESETS["llama-3.2-1b"][0]
    names = [name for name, _, _ in decoder.parameter_tensors(llama)]
    assert "lm_head" not in names
    assert "layers.0.q_bias" not in names
    qwen = [name for name, _, _ in decoder.parameter_tensors(decoder.PRESETS["qwen2.5-7b"][0])]
    first = ["embed", "layers.0.attn_norm", "layers.0.q", "layers.0.q_bias"]
    assert qwen[:6] == [*first, "layers.0.k", "layers.0.k_bias"]
    assert qwen[-1] == "lm_head"


shapes = st.builds(
    lambda layers, kv, groups, head_dim, ffn, vocab, tie, bias: decoder.Shape(
        layers, kv * groups * head_dim, kv * groups, kv, head_dim, ffn, vocab, tie, bias
    ),
    st.integers(1, 6),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from([2, 4, 6, 8, 64]),
    st.integers(1, 300),
    st.integers(1, 5000),
    st.booleans(),
    st.booleans(),
)


@given(shapes)
def test_parameter_count_is_the_closed_form(shape):
    d, q, kv = shape.width, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = 2 * d + 2 * d * q + 2 * d * kv + 3 * d * shape.ffn
    per_layer += (q + 2 * kv) * shape.qkv_bias
    embeddings = shape.vocab * d * (1 if shape.tie_embeddings else 2)
    assert decoder.parameter_count(shape) == embeddings + shape.layers * per_layer + d


@settings(max_examples=12, deadline=None)
@given(shapes, st.integers(1, 4), st.integers(1, 9), st.integers(2, 6), st.sampled_from([1, 2]))
def test_weights_and_cache_are_predicted_to_the_block(shape, batch, prompt, new_tokens, per_row):
    """The weights and the cache stay for the whole run, each in its own block rounded up to
    512 bytes (a block from the large pool also keeps the rest of its segment when that rest
    is 1 MiB or less: the allocator does not split it off); every decode row frees the token
    it was fed and keeps the one it made."""
    run = run_of(batch=batch, prompt=prompt, new_tokens=new_tokens, tokens_per_row=per_row)
    rows = predicted_rows(shape, run)
    size = decoder.DTYPE_BYTES[run["dtype"]]
    blocks = [
        -(-math.prod(dims) * size // 512) * 512 for _, dims, _ in decoder.parameter_tensors(shape)
    ]
    assert rows[0]["allocated_bytes"] == rows[0]["peak_allocated_bytes"]
    unsplit = rows[0]["allocated_bytes"] - sum(blocks)  # rests of 20 MiB segments, <= 1 MiB each
    assert 0 <= unsplit <= (rows[0]["reserved_bytes"] // (20 << 20) + 1) * (1 << 20)
    cache = decoder.cache_bytes_per_tensor(shape, batch, prompt + new_tokens, run["dtype"])
    assert cache == batch * shape.kv_heads * (prompt + new_tokens) * shape.head_dim * size
    assert (
        rows[1]["allocated_bytes"] - rows[1]["baseline_allocated_bytes"] >= 2 * shape.layers * cache
    )
    after_prefill = rows[2]["allocated_bytes"]
    assert after_prefill == rows[1]["allocated_bytes"] + max(512, -(-batch * 8 // 512) * 512)
    for row in rows:
        for prefix in ("baseline_", "", "peak_"):
            assert row[f"{prefix}allocated_bytes"] <= row[f"{prefix}reserved_bytes"]
        assert row["peak_allocated_bytes"] >= max(
            row["baseline_allocated_bytes"], row["allocated_bytes"]
        )
    assert {row["allocated_bytes"] for row in rows[3:]} == {after_prefill}
    assert sum(row["tokens"] for row in rows) == new_tokens


def test_rows_cover_every_generated_token_once():
    run = run_of(prompt=7, new_tokens=5, warmup=1, tokens_per_row=2)
    plan = decoder.row_plan(run)
    assert plan == [
        ("prefill", None, 0, 1),
        ("warmup", None, 1, 1),
        ("decode", 1, 2, 2),
        ("decode", 2, 4, 1),  # the last row holds what is left
    ]
    rows = predicted_rows(TINY, run)
    assert [(r["phase"], r["first_position"], r["tokens"], r["passes"]) for r in rows] == [
        ("model_load", 0, 0, 0),
        ("inputs_and_cache", 0, 0, 0),
        ("prefill", 0, 1, 1),
        ("warmup", 7, 1, 1),  # token 1 goes in at position P
        ("decode", 8, 2, 2),
        ("decode", 10, 1, 1),
    ]


@given(st.integers(2, 300), st.integers(1, 5), st.integers(1, 9))
def test_the_rows_counted_are_the_rows_planned(new_tokens, warmup, per_row):
    """validate.py counts a file's planned rows without building the plan (a file may claim
    billions of tokens): the count is the plan's length."""
    run = run_of(new_tokens=max(new_tokens, warmup + 1), warmup=warmup, tokens_per_row=per_row)
    assert decoder_rules.planned_rows(run) == 2 + len(decoder.row_plan(run))


def test_a_file_claiming_a_trillion_tokens_is_refused_without_planning_them():
    """One planned row per token would take terabytes: the file is refused from its count."""
    document = predicted_tiny()
    document["configuration"]["new_tokens"] = 10**12
    document["cache"]["positions"] = document["configuration"]["prompt"] + 10**12
    errors = validate.validate_document(document, REGISTRY)
    assert any(
        error.startswith("$.phases: 6 rows, the plan of prompt 16, new_tokens 1000000000000")
        for error in errors
    ), errors


def test_large_rotary_tables_and_cache_share_one_20_mib_segment():
    """cos and sin are 1.5 MiB each (over 1 MiB: the large pool, under 10 MiB: a 20 MiB
    segment); the four 3 MiB cache tensors are cut from what is left of it; the prompt's
    192 KiB and the generated buffer fit in the weights' 2 MiB small segment."""
    shape = decoder.Shape(layers=2, width=64, heads=1, kv_heads=1, head_dim=64, ffn=64, vocab=64)
    run = run_of(prompt=24570, new_tokens=6)  # 24576 positions
    inputs = predicted_rows(shape, run)[1]
    assert inputs["reserved_bytes"] - inputs["baseline_reserved_bytes"] == 20 * 2**20
    assert inputs["allocated_bytes"] - inputs["baseline_allocated_bytes"] == (
        196608 + 512 + 2 * 1572864 + 4 * 3 * 2**20
    )


# ------------------------------------------------------------------ the model


def test_the_model_builds_the_parameters_it_declares():
    from pipeline.workloads import decoder_model

    shape = decoder.Shape(2, 24, 3, 1, 8, 40, 50, True, True)
    weights = decoder_model.make_weights(shape, torch.float32, "cpu", 0)
    assert weights["lm_head"] is weights["embed"]
    storages = {t.untyped_storage().data_ptr(): t.numel() for t in weights.values()}
    assert sum(storages.values()) == decoder.parameter_count(shape)


def test_generation_is_greedy_and_fills_every_new_token():
    from pipeline.workloads import decoder_model

    shape = decoder.Shape(2, 16, 4, 2, 4, 24, 40)
    run = run_of(batch=2, prompt=3, new_tokens=4, dtype="float32")
    weights = decoder_model.make_weights(shape, torch.float32, "cpu", 0)
    state = decoder_model.State(shape, run, torch.float32, "cpu", 0)
    state.generated.fill_(-1)
    with torch.inference_mode():
        holder: list = []
        decoder_model.prefill(shape, weights, state, holder)
        decoder_model.decode(shape, weights, state, holder, 1, 3)
    assert int(state.generated.min()) >= 0
    assert int(state.generated.max()) < shape.vocab
    assert torch.equal(holder[0], state.generated[:, -1])


# ------------------------------------------------------------------ the H200's measurements

GRID = RUNS / "20261203T093850Z-decoder-grid" / "grid"


@pytest.mark.evidence
@pytest.mark.parametrize("path", sorted(GRID.glob("*.json")), ids=lambda p: p.stem)
def test_every_grid_point_is_predicted_without_a_gpu_to_the_h200s_bytes(path):
    """The 36 decoder configurations measured on the H200 (runs/20261203T093850Z-decoder-grid:
    three dtypes, MHA to MQA, 1 to 32 layers, prompts of 1 to 4,096 tokens), each predicted as
    `decoder.py estimate --gpu h200` predicts it: every counter of every row equal to what the
    GPU measured, and said exact (every call they make was probed on the H200:
    runs/20261205T023519Z-h200-probe-decoder)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    configuration = document["configuration"]
    run = {key: configuration[key] for key in decoder.RUN_DEFAULTS}
    shape = decoder.Shape(**configuration["shape"])
    _, prediction, _ = decoder.predicted(torch, shape, run, "h200")
    for predicted, measured in zip(prediction.rows, document["phases"], strict=True):
        assert (predicted["phase"], predicted.get("repetition")) == (
            measured["phase"],
            measured.get("repetition"),
        )
        assert {k: predicted[k] for k in COUNTER_KEYS} == {k: measured[k] for k in COUNTER_KEYS}
    assert prediction.status == PredictionStatus.EXACT, prediction.unknown


# ------------------------------------------------------------------ documents and schema


def test_a_predicted_document_validates_and_says_what_it_does_not_know():
    """Without --gpu: the meta device's own kernel choice (the math attention) and no kernel
    blocks, said approximate, operator by operator."""
    result = call_main(decoder.main, "estimate", "--preset", "llama-3.1-8b", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert validate.validate_document(document, REGISTRY) == []
    assert document["status"] == "predicted"
    assert document["model"]["parameters"] == 8_030_261_248
    assert document["cache"]["bytes"] == 2 * 32 * 1 * 8 * 24 * 128 * 2
    prediction = document["prediction"]
    assert prediction["status"] == "approximate"
    assert prediction["calibration"] is None
    assert [entry["op"] for entry in prediction["unknown"]] == [
        "aten.argmax",
        "aten.linear",
        "aten.scaled_dot_product_attention",
        "scaled_dot_product_attention",
    ]
    rows = document["phases"]
    assert [row["predicted"] for row in rows] == [
        {key: row[key] for key in COUNTER_KEYS} for row in prediction["phases"]
    ]
    assert document["summary"]["largest_peak_reserved_bytes"] == max(
        row["predicted"]["peak_reserved_bytes"] for row in rows
    )


def predicted_tiny() -> dict:
    return decoder.predicted_document(TINY, None, run_of(new_tokens=4), "h200")


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda d: d["prediction"].update(status="exact"), "$.prediction"),
        (lambda d: d["phases"][4].pop("repetition"), "$.phases[4]"),
        (lambda d: d["phases"][0].update(repetition=1), "$.phases[0]"),
        (lambda d: d["configuration"].update(device="cuda:0"), "$.configuration.device"),
        (
            lambda d: d["phases"][2]["predicted"].update(
                peak_reserved_bytes=d["phases"][2]["predicted"]["peak_reserved_bytes"] + 2**21
            ),
            "$.phases[2].predicted: not $.prediction.phases[2]",
        ),
        (lambda d: d["prediction"]["phases"].pop(), "$.prediction.phases"),
    ],
)
def test_the_schema_and_facts_refuse_a_predicted_document_that_says_otherwise(change, path):
    document = predicted_tiny()
    assert document["prediction"]["status"] == "approximate"  # head_dim 4: flash pads it
    assert validate.validate_document(document, REGISTRY) == []
    change(document)
    errors = validate.validate_document(document, REGISTRY)
    assert any(error.startswith(path) for error in errors), errors


def test_a_measured_document_is_assembled_and_validates_without_a_gpu():
    """The measuring code on the CPU, with a stand-in for torch.cuda that reads no counters
    (all zero): what is checked is the document, not the numbers."""

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 0.5

    cuda = types.SimpleNamespace(
        Event=Event,
        synchronize=lambda device: None,
        memory_allocated=lambda device: 0,
        memory_reserved=lambda device: 0,
        max_memory_allocated=lambda device: 0,
        max_memory_reserved=lambda device: 0,
        reset_peak_memory_stats=lambda device: None,
        OutOfMemoryError=torch.cuda.OutOfMemoryError,
    )
    shim = types.SimpleNamespace(cuda=cuda, inference_mode=torch.inference_mode)
    shim.float32 = torch.float32
    run = run_of(batch=2, prompt=3, new_tokens=5, dtype="float32", tokens_per_row=2)
    # An H200's real environment record: a measured decoder file must name the GPU it ran on.
    h200 = Path(__file__).resolve().parent / "data" / "h200" / "env.json"
    environment = json.loads(h200.read_text())["environment"]
    document = decoder.new_measurement(TINY, None, run, "cuda:0", 0, environment)
    state = decoder.measure_rows(shim, TINY, run, 0, "cpu", document["phases"])
    from pipeline.workloads import decoder_model

    document["status"] = "completed"
    document["measured_attention_backend"] = decoder_model.attention_backends(TINY, state, 2)
    traced = decoder.trace(torch, TINY, run, 0, None)
    decoder.add_predictions(document, traced, trace_prediction.predict(traced, None), None)
    assert validate.validate_document(document, REGISTRY) == []
    assert [(r["phase"], r["tokens"], r["first_position"]) for r in document["phases"]] == [
        ("model_load", 0, 0),
        ("inputs_and_cache", 0, 0),
        ("prefill", 1, 0),
        ("warmup", 1, 3),
        ("decode", 2, 4),
        ("decode", 1, 6),
    ]
    verdict = document["summary"]["prediction"]
    assert (verdict["status"], verdict["held"]) == ("approximate", None)
    timing = document["summary"]["timing"]
    assert timing["prefill_tokens_per_second"] == 2 * 3 * 1e9 / 500_000
    assert timing["decode_tokens_per_second"] == 2 * 3 * 1e9 / 1_000_000
    assert int(state.generated.min()) >= 0
    document["summary"]["prediction"]["held"] = True  # a verdict the rows do not give
    assert validate.validate_document(document, REGISTRY) == [
        "$.summary.prediction.held: True, the rows give None"
    ]


# ------------------------------------------------------------------ bad input


def shape_args(width: int, heads: int, kv_heads: int) -> list[str]:
    heads_args = ["--heads", str(heads), "--kv-heads", str(kv_heads)]
    return ["--layers", "1", "--width", str(width), *heads_args, "--ffn", "16", "--vocab", "16"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (shape_args(12, 3, 2), "--heads 3 is not a multiple of --kv-heads 2"),
        (shape_args(10, 4, 2), "--width 10 is not a multiple of --heads 4: give --head-dim"),
        (shape_args(12, 4, 2), "head dimension 3 is odd"),
        ([*shape_args(12, 4, 2), "--head-dim", "5"], "head dimension 5 is odd"),
        (["--preset", "llama-3.1-8b", "--layers", "2"], "takes no shape options (--layers)"),
        (["--layers", "2"], "missing --width, --heads, --kv-heads, --ffn, --vocab"),
        (["--preset", "llama-3.1-8b", "--new-tokens", "1"], "needs --new-tokens >= 2"),
        (["--preset", "llama-9b"], "argument --preset: invalid choice: 'llama-9b'"),
        (["--preset", "llama-3.1-8b", "--batch", "0"], "expected a positive integer, got '0'"),
        ([*TINY_ARGS, "--calibration", "c.json"], "unrecognized arguments: --calibration c.json"),
    ],
)
def test_a_bad_shape_or_run_is_refused_in_one_line_and_writes_nothing(tmp_path, argv, message):
    out = tmp_path / "m.json"
    for command in (["estimate"], ["measure", "--device", "cuda:0", "--output", str(out)]):
        result = run_script("decoder.py", *command, *argv, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert message in result.stderr
        assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_gpu_without_a_committed_calibration_is_refused_in_one_line():
    result = run_script("decoder.py", "estimate", *TINY_ARGS, "--gpu", "b200")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("decoder.py: error: argument --gpu: invalid choice: 'b200'")
    assert "h200" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "100000", "--width", "64", "--heads", "4", "--kv-heads", "4", "--ffn",
          "128", "--vocab", "100"], "900000 layer passes (100000 layers x (8 new tokens + 1)), "
         "over the estimate budget of 5000 (--estimate-budget)"),
        (["--preset", "llama-3.1-8b", "--new-tokens", "10000000"], "320000032 layer passes "
         "(32 layers x (10000000 new tokens + 1)), over the estimate budget of 5000"),
        (["--preset", "llama-3.1-8b", "--new-tokens", "156"], "5024 layer passes"),
        (["--preset", "llama-3.2-1b", "--new-tokens", "200", "--estimate-budget", "3215"],
         "3216 layer passes (16 layers x (200 new tokens + 1)), over the estimate budget of "
         "3215 (--estimate-budget)"),
    ],
    ids=["layers", "new-tokens", "8b-156-tokens", "budget-given"],
)  # fmt: skip
def test_a_prediction_over_the_estimate_budget_is_refused_up_front(tmp_path, argv, message):
    """Refused from the configuration alone, in one line, before any trace (or GPU work):
    these would otherwise run for minutes to hours."""
    out, environment = tmp_path / "m.json", tmp_path / "e.json"
    measure = ["measure", "--device", "cuda:0", "--output", str(out)]
    for command in (["estimate"], [*measure, "--environment-output", str(environment)]):
        result = run_script("decoder.py", *command, *argv)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("decoder.py: error: the prediction would trace ")
        assert result.stderr.count("\n") == 1
        assert message in result.stderr
        assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_the_estimate_budget_admits_its_limit_and_every_committed_configuration():
    within = call_main(decoder.main, "estimate", *TINY_ARGS, "--new-tokens", "9",
                       "--estimate-budget", "10", "--json")  # fmt: skip
    assert within.returncode == 0, within.stderr
    assert decoder.layer_passes(TINY, {"new_tokens": 9}) == 10
    eight_b = decoder.PRESETS["llama-3.1-8b"][0]
    assert decoder.over_budget(eight_b, {"new_tokens": 155}) is None  # 32 x 156 = 4,992
    assert decoder.over_budget(eight_b, {"new_tokens": 156}) is not None
    committed = 0
    for path in (ROOT / "runs").rglob("*.json"):
        with path.open(encoding="utf-8") as file:
            if decoder.SCHEMA not in file.read(300):
                continue
        configuration = json.loads(path.read_text(encoding="utf-8"))["configuration"]
        shape = decoder.Shape(**configuration["shape"])
        assert decoder.over_budget(shape, configuration) is None, path
        committed += 1
    assert committed >= 46


def test_measure_never_falls_back_to_the_cpu(tmp_path):
    out = tmp_path / "m.json"
    result = run_script(
        "decoder.py", "measure", "--device", "cpu", *TINY_ARGS, "--output", str(out)
    )
    assert result.returncode == 2
    assert "expected a GPU device 'cuda' or 'cuda:N' (no CPU fallback), got 'cpu'" in result.stderr
    assert not out.exists()


def test_an_existing_output_is_left_byte_for_byte(tmp_path):
    out = tmp_path / "m.json"
    out.write_bytes(b"earlier result\n")
    result = run_script(
        "decoder.py", "measure", "--device", "cuda:0", *TINY_ARGS, "--output", str(out)
    )
    assert result.returncode == 2
    assert "m.json already exists: results are never overwritten" in result.stderr
    assert out.read_bytes() == b"earlier result\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a PyTorch that sees no GPU")
def test_without_a_gpu_the_environment_is_written_and_the_measurement_is_not(tmp_path):
    out, environment = tmp_path / "m.json", tmp_path / "e.json"
    result = run_script(
        "decoder.py",
        "measure",
        "--device",
        "cuda:0",
        *TINY_ARGS,
        "--output",
        str(out),
        "--environment-output",
        str(environment),
    )
    assert result.returncode == 2
    assert result.stderr == (
        "decoder.py: error: no GPU is visible to PyTorch: measure needs one and never uses "
        "the CPU\n"
    )
    assert not out.exists()
    assert validate.validate_json(environment.read_bytes(), REGISTRY) == []


# ------------------------------------------------------------------ estimate: the answer first

POINT = ["--layers", "2", "--width", "256", "--heads", "8", "--kv-heads", "2", "--ffn", "640"]
POINT += ["--vocab", "1000", "--batch", "2", "--prompt", "33", "--new-tokens", "5"]


def estimate(*args: str):
    result = call_main(decoder.main, "estimate", *POINT, *args)
    assert result.returncode == 0, result.stderr
    return result


def test_estimate_says_first_the_peak_and_that_it_is_exact_with_the_committed_h200_calibration():
    """`--gpu h200`: the committed H200 calibration, named by its file and sha256; the first
    line is the answer. The shape is the committed grid's bfloat16-gqa4-l2-w256, which the
    H200 measured at exactly this peak."""
    document = json.loads(estimate("--gpu", "h200", "--json").stdout)
    measured = json.loads((GRID / "bfloat16-gqa4-l2-w256.json").read_text("utf-8"))
    peak = document["summary"]["largest_peak_reserved_bytes"]
    assert peak == measured["summary"]["largest_peak_reserved_bytes"]
    source = document["prediction"]["calibration"]
    assert source.startswith("nvidia-h200-torch-2.11.0+cu130.json (sha256 ")
    first = estimate("--gpu", "h200").stdout.splitlines()[0]
    assert first == f"peak reserved {peak / 2**30:.2f} GiB ({peak:,} bytes), exact with {source}"


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal is POSIX")
def test_on_a_terminal_the_estimate_says_which_phase_it_traces_then_clears_the_line():
    from conftest import on_a_terminal

    argv = ["estimate", *TINY_ARGS, "--new-tokens", "4", "--tokens-per-row", "1", "--gpu", "h200"]
    code, out, lines = on_a_terminal("decoder.py", *argv)
    assert code == 0
    steps = [line.split("... ")[0].removeprefix("decoder.py: ") for line in lines]
    run = run_of(new_tokens=4, tokens_per_row=1)
    plan = decoder_rules.written_rows(run, decoder_rules.planned_rows(run))
    assert [row[:2] for row in plan][-2:] == [("decode", 1), ("decode", 2)]
    assert steps == [f"tracing {name}" + (f" {rep}" if rep else "") for name, rep, *_ in plan] + [
        "predicting: replaying the trace"
    ]
    assert out.startswith(run_script("decoder.py", *argv).stdout.splitlines()[0])


def test_estimate_without_a_calibration_says_approximate_and_how_to_predict_for_a_gpu():
    first = estimate().stdout.splitlines()[0]
    assert first.endswith(
        "approximate: no GPU calibration, so the kernels' own blocks are left out "
        "(--gpu h200 predicts for that GPU)"
    )


def test_a_reader_that_stops_early_gets_no_traceback_nor_error():
    """`decoder.py estimate | head -1`: the stage ends quietly (exit 1), as fit does."""
    assert run_unread("decoder.py", "estimate", *POINT) == (b"", 1)
