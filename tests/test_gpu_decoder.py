"""decoder.py measure on a real GPU (marked `gpu`; skipped where none is visible), each run in
a fresh process.

The byte-for-byte comparison needs the calibration of the GPU and PyTorch it runs on
(runs/<id>/decoder-calibration.json, found by measure itself, or DECODER_CALIBRATION): until
one is committed, test_predicted_equals_measured_on_every_counter fails and says by how much."""

from __future__ import annotations

import json
import math
import os

import pytest
from conftest import run_script

from pipeline.artefacts import validate
from pipeline.measuring import decoder

pytestmark = pytest.mark.gpu
REGISTRY = validate.load_registry()
SMALL = ["--layers", "2", "--width", "192", "--heads", "6", "--kv-heads", "2"]
SMALL += ["--ffn", "320", "--vocab", "1000", "--batch", "2", "--prompt", "24"]
SMALL += ["--new-tokens", "6", "--tokens-per-row", "2"]
CONFIGURATIONS = {
    "gqa3-bfloat16": [*SMALL, "--dtype", "bfloat16"],
    "gqa3-float16": [*SMALL, "--dtype", "float16"],
    "gqa3-float32": [*SMALL, "--dtype", "float32"],
    "mha-bias-tied-bfloat16": [
        *["--layers", "1", "--width", "256", "--heads", "4", "--kv-heads", "4", "--ffn", "512"],
        *["--vocab", "512", "--qkv-bias", "--tie-embeddings", "--prompt", "7", "--new-tokens", "3"],
        *["--dtype", "bfloat16"],
    ],
}


def calibration_args() -> list[str]:
    path = os.environ.get("DECODER_CALIBRATION")
    return ["--calibration", path] if path else []


def measure(tmp_path, argv, expect=0):
    out = tmp_path / "m.json"
    result = run_script(
        "decoder.py", "measure", "--device", "cuda:0", *argv, *calibration_args(),
        "--output", str(out),
    )  # fmt: skip
    assert result.returncode == expect, result.stderr
    document = json.loads(out.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    return document


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_a_small_decoder_is_measured_end_to_end(tmp_path, name):
    document = measure(tmp_path, CONFIGURATIONS[name])
    assert document["status"] == "completed"
    run = document["configuration"]
    names = [row["phase"] for row in document["phases"]]
    assert names[:4] == list(decoder.FIXED_PHASES)
    assert sum(row["tokens"] for row in document["phases"]) == run["new_tokens"]
    load = document["phases"][0]
    shape = decoder.Shape(**run["shape"])
    size = decoder.DTYPE_BYTES[run["dtype"]]
    blocks = sum(
        -(-math.prod(dims) * size // 512) * 512 for _, dims, _ in decoder.parameter_tensors(shape)
    )
    # Made in place on the GPU: nothing but the parameters, no temporary on the way.
    assert load["allocated_bytes"] == load["peak_allocated_bytes"] == blocks
    assert document["summary"]["timing"]["decode_tokens_per_second"] > 0


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_predicted_equals_measured_on_every_counter(tmp_path, name):
    document = measure(tmp_path, CONFIGURATIONS[name])
    prediction = document["prediction"]
    assert prediction["attention_backend"] == document["measured_attention_backend"]
    differences = {
        f"{row['phase']}{row.get('repetition', '')}.{key}": row[key] - row["predicted"][key]
        for row in document["phases"]
        for key in decoder.COUNTER_KEYS
        if row[key] != row["predicted"][key]
    }
    assert differences == {}, (prediction["calibration"], prediction["not_predicted"])


@pytest.mark.gpu_whole
def test_out_of_memory_is_an_observation_with_exit_3(tmp_path):
    """A 128 GiB K cache for one layer: refused in inputs_and_cache, the file still written."""
    argv = ["--layers", "1", "--width", "64", "--heads", "1", "--kv-heads", "1", "--ffn", "64"]
    argv += ["--vocab", "64", "--batch", "1048576", "--prompt", "1022", "--new-tokens", "2"]
    document = measure(tmp_path, argv, expect=3)
    assert document["status"] == "out_of_memory"
    assert document["failure"]["phase"] == "inputs_and_cache"
    assert [row["phase"] for row in document["phases"]] == ["model_load"]


def test_a_calibration_of_another_gpu_is_refused_before_anything_is_written(tmp_path):
    """--calibration names the kernels of one GPU model and one PyTorch: on another, measure
    refuses it in one line once it has seen the GPU, and writes neither file."""
    committed = sorted(validate.ROOT.glob("runs/*/decoder-calibration.json"))[-1]
    document = json.loads(committed.read_text())
    document["gpu"]["name"] = "NVIDIA A100-SXM4-80GB"
    other = tmp_path / "a100-calibration.json"
    other.write_text(json.dumps(document))
    out, environment = tmp_path / "m.json", tmp_path / "e.json"
    result = run_script(
        "decoder.py", "measure", "--device", "cuda:0", *SMALL, "--calibration", str(other),
        "--output", str(out), "--environment-output", str(environment),
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(
        "decoder.py: error: --calibration a100-calibration.json was measured on NVIDIA "
        "A100-SXM4-80GB with torch "
    )
    assert result.stderr.count("\n") == 1
    assert not out.exists()
    assert not environment.exists()
