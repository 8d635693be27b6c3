"""decoder.py measure on a real GPU (marked `gpu`; skipped where none is visible), each run in
a fresh process: the counters, the prediction beside them (the trace replayed with probes of
its calls on this GPU), and what `decoder.py estimate --gpu` said of the same run without it."""

from __future__ import annotations

import json
import math

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


def measure(tmp_path, argv, expect=0):
    out = tmp_path / "m.json"
    result = run_script(
        "decoder.py", "measure", "--device", "cuda:0", *argv, "--output", str(out),
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
    """The trace replayed with this GPU's own probes: equal on every counter of every row,
    and the summary's verdict says the claim held (an exact one to the byte, an approximate
    one, for the segments' address order say, within its bounds)."""
    document = measure(tmp_path, CONFIGURATIONS[name])
    prediction = document["prediction"]
    differences = {
        f"{row['phase']}{row.get('repetition', '')}.{key}": row[key] - row["predicted"][key]
        for row in document["phases"]
        for key in decoder.COUNTER_KEYS
        if row[key] != row["predicted"][key]
    }
    assert differences == {}, prediction["unknown"]
    assert prediction["calibration"] == "this process"
    verdict = document["summary"]["prediction"]
    if prediction["status"] == "exact":
        assert verdict["held"] is True
    else:
        assert verdict["bounds_held"] in (True, None), prediction["unknown"]


def test_the_estimate_without_a_gpu_says_what_this_gpu_measures(tmp_path):
    """`decoder.py estimate --gpu h200` (the committed calibration, traced on meta) against
    the measurement on this GPU: where it says exact, every counter of every row is equal;
    where approximate, the measured peaks lie inside its bounds. Only on an H200."""
    import torch

    if torch.cuda.get_device_name(0) != "NVIDIA H200":
        pytest.skip("the committed calibration is the H200's")
    argv = CONFIGURATIONS["gqa3-bfloat16"]
    estimate = run_script("decoder.py", "estimate", *argv, "--gpu", "h200", "--json")
    assert estimate.returncode == 0, estimate.stderr
    predicted = json.loads(estimate.stdout)
    measured = measure(tmp_path, argv)
    pairs = list(zip(predicted["phases"], measured["phases"], strict=True))
    if predicted["prediction"]["status"] == "exact":
        for guess, row in pairs:
            assert guess["predicted"] == {key: row[key] for key in decoder.COUNTER_KEYS}
    else:
        bounds = predicted["prediction"]["bounds"]["phases"]
        for found, (_, row) in zip(bounds, pairs, strict=True):
            for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
                assert found[key]["lower"] <= row[key] <= found[key]["upper"]


@pytest.mark.gpu_whole
def test_out_of_memory_is_an_observation_with_exit_3(tmp_path):
    """A 128 GiB K cache for one layer: refused in inputs_and_cache, the file still written."""
    argv = ["--layers", "1", "--width", "64", "--heads", "1", "--kv-heads", "1", "--ffn", "64"]
    argv += ["--vocab", "64", "--batch", "1048576", "--prompt", "1022", "--new-tokens", "2"]
    document = measure(tmp_path, argv, expect=3)
    assert document["status"] == "out_of_memory"
    assert document["failure"]["phase"] == "inputs_and_cache"
    assert [row["phase"] for row in document["phases"]] == ["model_load"]
