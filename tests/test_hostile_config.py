"""`own_model.py estimate --hf-config` with hostile or careless inputs: a bad config, an
oversized option or a run past the budget is refused in one line, exit 2, before any trace;
never a traceback, never "the workload raised", never a hang. A property test edits a small
config at random: each edit is refused in one line or predicted, within the budget."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import runfixtures
from conftest import ROOT
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline.measuring import own_model

pytest.importorskip("torch")
pytest.importorskip("transformers")
MAX_CONFIG_BYTES = 4 << 20  # hf_config.py's limit, as the documentation states it

LLAMA = runfixtures.LLAMA_1B
BASE = {**LLAMA, "num_hidden_layers": 2}  # the hostile/cfg/base.json
SMALL = runfixtures.SMALL_LLAMA


def run(capsys, tmp_path, config: dict | str | bytes, *options: str) -> tuple[int, str]:
    code, err, _ = run_full(capsys, tmp_path, config, *options)
    return code, err


def run_full(capsys, tmp_path, config, *options: str) -> tuple[int, str, str]:
    path = tmp_path / "config.json"
    if isinstance(config, dict):
        config = json.dumps(config)
    path.write_bytes(config if isinstance(config, bytes) else config.encode())
    argv = ["estimate", "--hf-config", str(path), "--warmup", "1", "--repeats", "1", *options]
    code = own_model.main(argv)
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def one_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def duplicate(key: str, value) -> str:
    text = json.dumps(BASE)
    return text[:-1] + f", {json.dumps(key)}: {json.dumps(value)}}}"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "not JSON the lab reads (nested over 32 levels deep)",
        ),
        (
            '{"model_type": "llama", "x": ' + "[" * 40 + "]" * 40 + "}",
            "not JSON the lab reads (nested over 32 levels deep)",
        ),
        (
            {**BASE, "num_hidden_layers": -3},
            "num_hidden_layers is -3, not an integer from 1 to 1,024 (the lab's limit for layers)",
        ),
        (
            {**BASE, "rope_scaling": {**BASE["rope_scaling"], "rope_type": "nope"}},
            "rope_scaling.rope_type is 'nope', not one transformers has (default, dynamic, "
            "linear, llama3, longrope, proportional, yarn)",
        ),
        (
            {**BASE, "num_attention_heads": 0},
            "num_attention_heads is 0, not an integer from 1 to 4,096 (the lab's limit for heads)",
        ),
        (
            duplicate("num_attention_heads", 4),
            "not JSON the lab reads (the key 'num_attention_heads' is given twice in one object)",
        ),
        (duplicate("hidden_size", 1024), "the key 'hidden_size' is given twice in one object"),
        (
            {**BASE, "num_attention_heads": 4},
            "num_attention_heads 4 is not a multiple of num_key_value_heads 8: each key/value "
            "head serves a whole group of attention heads",
        ),
        (
            {**BASE, "num_hidden_layers": 10**7},
            "num_hidden_layers is 10000000, not an integer from 1 to 1,024",
        ),
        ({**BASE, "hidden_size": 0}, "hidden_size is 0, not an integer from 1 to 1,048,576"),
        ({**BASE, "hidden_size": 10**12}, "hidden_size is 1000000000000, not an integer"),
        ({**BASE, "vocab_size": 10**10}, "vocab_size is 10000000000, not an integer from 1 to"),
        ({**BASE, "intermediate_size": 10**12}, "intermediate_size is 1000000000000, not an"),
        (
            {**BASE, "max_position_embeddings": -1},
            "max_position_embeddings is -1, not an integer from 1 to 16,777,216",
        ),
        ({**BASE, "hidden_size": 2048.0}, "hidden_size is 2048.0, not an integer"),
        ({**BASE, "num_hidden_layers": True}, "num_hidden_layers is True, not an integer"),
        ({**BASE, "text_config": {"hidden_size": -1}}, "text_config.hidden_size is -1, not an"),
        (
            {**BASE, "head_dim": None, "hidden_size": 2050},
            "hidden_size 2050 is not a multiple of num_attention_heads 32: each head takes an "
            "equal part of the width (or head_dim says its size)",
        ),
    ],
    ids=lambda value: None if isinstance(value, str) and len(value) < 60 else "",
)
def test_a_bad_config_is_bad_input_in_one_line_naming_the_field(capsys, tmp_path, config, message):
    started = time.monotonic()
    code, err = run(capsys, tmp_path, config, "--dim", "sequence=16")
    line = one_line(code, err)
    assert line.startswith(f"own_model.py: error: --hf-config {tmp_path / 'config.json'}: ")
    assert message in line
    assert time.monotonic() - started < 60


def test_a_config_over_the_size_limit_is_refused_before_it_is_read(capsys, tmp_path):
    padding = "x" * MAX_CONFIG_BYTES
    code, err = run(capsys, tmp_path, {**BASE, "padding": padding})
    size = (tmp_path / "config.json").stat().st_size
    assert one_line(code, err).endswith(
        f"config.json: not JSON the lab reads ({size:,} bytes, over the limit of 4,194,304 bytes)"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ("--batch", str(10**18)),
            "argument --batch: expected a positive integer at most 1048576, got "
            "'1000000000000000000'",
        ),
        (
            ("--dim", f"sequence={10**9}"),
            "argument --dim: expected NAME=VALUE with VALUE a positive integer at most 16777216, "
            "got 'sequence=1000000000'",
        ),
        (
            ("--task", "lora", "--lora-rank", str(10**9)),
            "argument --lora-rank: expected a positive integer at most 65536, got '1000000000'",
        ),
        (
            ("--task", "lora", "--lora-rank", str(10**30)),
            "argument --lora-rank: expected a positive integer at most 65536, got "
            "'1000000000000000000000000000000'",
        ),
        (
            ("--task", "lora", "--lora-rank", "4096"),
            "--lora-rank 4096: over the model's width 2048, the most a LoRA adapter of its "
            "projections can use",
        ),
        (
            ("--task", "generate", "--new-tokens", "1000000"),
            "argument --new-tokens: expected a positive integer at most 65536, got '1000000'",
        ),
        (
            ("--task", "generate", "--new-tokens", "65536"),
            "the trace would run 393,216 layer passes (3 steps x 2 layers x 65536 forwards), "
            "over the estimate budget of 20,000 (--layer-pass-budget)",
        ),
        (
            ("--batch", "1048576", "--dim", "sequence=65536"),  # 2**20 x 32 x 2**16 x 2**16 x 4
            "the trace would make a tensor of about 576,460,752,303,423,488 bytes (the "
            "attention scores, float32), over 1,125,899,906,842,624 bytes (1 PiB): no GPU "
            "holds it",
        ),
    ],
)
def test_an_oversized_option_is_refused_in_one_line_with_its_limit(
    capsys, tmp_path, options, message
):
    code, err = run(capsys, tmp_path, BASE, *options)
    assert one_line(code, err) == f"own_model.py: error: {message}"


def test_a_large_lora_rank_of_a_large_model_is_refused_before_peft_fills_the_host(capsys, tmp_path):
    eight_b = json.loads((ROOT / "tests/data/hf-configs/llama-3.1-8b.json").read_text())
    code, err = run(capsys, tmp_path, eight_b, "--task", "lora", "--lora-rank", "4096")
    assert one_line(code, err) == (
        "own_model.py: error: --lora-rank 4096: peft would make about 17,179,869,184 bytes of "
        "adapters in host memory (32 layers, width 4096), over the limit of 4,294,967,296 "
        "bytes (4 GiB)"
    )


@pytest.mark.parametrize(
    ("changes", "options", "message"),
    [
        (  # killed at 120 s with 2.5 GB resident before
            {"num_hidden_layers": 1024},
            ("--warmup", "10", "--repeats", "10"),
            "the trace would run 21,504 layer passes (21 steps x 1024 layers x 1 forward), over "
            "the estimate budget of 20,000 (--layer-pass-budget)",
        ),
        (
            {"num_hidden_layers": 10**5},
            (),
            "num_hidden_layers is 100000, not an integer from 1 to 1,024 (the lab's limit for "
            "layers)",
        ),
        (  # killed at 120 s before
            {},
            ("--task", "generate", "--new-tokens", "20000"),
            "the trace would run 160,000 layer passes (4 steps x 2 layers x 20000 forwards), over "
            "the estimate budget of 20,000 (--layer-pass-budget)",
        ),
        (
            {},
            ("--task", "generate", "--new-tokens", "100", "--layer-pass-budget", "10"),
            "the trace would run 800 layer passes (4 steps x 2 layers x 100 forwards), over "
            "the estimate budget of 10 (--layer-pass-budget)",
        ),
    ],
)
def test_a_trace_past_the_budget_is_refused_up_front_not_left_running(
    tmp_path, changes, options, message
):
    """As decoder.py estimate refuses its equivalent: in seconds, one line, exit 2 (a process
    of its own: the code before this refusal ran until killed)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **changes}))
    argv = [sys.executable, "-m", "pipeline.measuring.own_model", "estimate", "--hf-config"]
    started = time.monotonic()
    try:
        result = subprocess.run(
            [*argv, str(path), "--dim", "sequence=16", *options],
            capture_output=True, text=True, cwd=ROOT, timeout=90,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("still tracing after 90 s: not refused up front")
    assert time.monotonic() - started < 90
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("own_model.py: error: ")
    assert result.stderr.endswith(f" {message}\n")
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("changes", "options", "message"),
    [
        (
            {"num_hidden_layers": -3},
            (),
            "num_hidden_layers is -3, not an integer from 1 to 1,024 (the lab's limit for layers)",
        ),
        (
            {},
            ("--task", "generate", "--new-tokens", "20000"),
            "the trace would run 160,000 layer passes (4 steps x 2 layers x 20000 forwards), "
            "over the estimate budget of 20,000 (--layer-pass-budget)",
        ),
    ],
    ids=["config", "budget"],
)
def test_measure_refuses_the_same_budget_and_writes_nothing(
    capsys, tmp_path, changes, options, message
):
    """Refused by the config's checks and the budget, before it looks for a GPU: without one,
    the code before them said "no GPU is visible", which hid them."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **changes}))
    output = tmp_path / "m.json"
    argv = ["measure", "--hf-config", str(path), "--device", "cuda", "--output", str(output)]
    code = own_model.main([*argv, "--dim", "sequence=16", *options])
    line = one_line(code, capsys.readouterr().err)
    assert line.startswith("own_model.py: error: ")
    assert line.endswith(f" {message}")
    assert not output.exists()


# ---------------------------------------------------------------- random edits

SIZE_KEYS = [
    "head_dim", "hidden_size", "intermediate_size", "max_position_embeddings",
    "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "vocab_size",
]  # fmt: skip
VALUES = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=0, max_value=300),
    st.sampled_from([None, True, 1.5, "64", [], {}, 2**63, -1, 0, 10**7]),
)
EDITS = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(SIZE_KEYS), VALUES),
    st.tuples(st.just("drop"), st.sampled_from(sorted(SMALL)), st.none()),
    st.tuples(st.just("twice"), st.sampled_from(SIZE_KEYS), VALUES),
    st.tuples(st.just("nest"), st.sampled_from(SIZE_KEYS), st.integers(1, 200)),
)


def edited(edits) -> str:
    config, extra = dict(SMALL), []
    for how, key, value in edits:
        if how == "set":
            config[key] = value
        elif how == "drop":
            config.pop(key, None)
        elif how == "twice":
            extra.append(f"{json.dumps(key)}: {json.dumps(value)}")
        else:
            config[key] = json.loads("[" * value + "1" + "]" * value)
    text = json.dumps(config)
    return text[:-1] + "".join(", " + item for item in extra) + "}"


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(EDITS, min_size=1, max_size=3))
@example([("set", "num_attention_heads", 0)])
@example([("set", "num_hidden_layers", -3)])
@example([("nest", "hidden_size", 150)])
def test_a_random_edit_is_refused_in_one_line_or_predicted_within_the_budget(
    capsys, tmp_path, edits
):
    started = time.monotonic()
    code, err, out = run_full(capsys, tmp_path, edited(edits), "--dim", "sequence=8", "--json")
    assert "Traceback" not in err, err
    assert "the workload raised" not in err, err
    if code == 0:
        assert json.loads(out)["prediction"]["phases"]
    else:
        one_line(code, err)
    assert time.monotonic() - started < 120
