"""A user's file that loads its model in 4 or 8 bits through transformers' BitsAndBytesConfig
and never imports bitsandbytes: transformers imports it inside from_pretrained, inside the
trace (predicting/late_imports.py). The prediction is the one made where the file imports
bitsandbytes first (it was a traceback and "not predicted")."""

from __future__ import annotations

import json

import pytest
from conftest import run_script
from test_from_pretrained import saved_llama

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

WORKLOAD = """{first}import torch
import transformers


def infer(config, *, sequence=16):
    from own_model import Workload

    quantization = transformers.BitsAndBytesConfig({quantization})
    model = transformers.AutoModelForCausalLM.from_pretrained(
        {folder!r}, dtype=config.dtype, device_map=config.device,
        quantization_config=quantization,
    )
    make_inputs = lambda: {{
        "input_ids": torch.zeros(config.batch, sequence, dtype=torch.long, device=config.device)
    }}
    return Workload(model.eval(), make_inputs)
"""
QUANTIZATIONS = {
    "4-bit": "load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16",
    "8-bit": "load_in_8bit=True",
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    saved_llama(folder / "model", hidden_size=128, intermediate_size=256)
    return folder


def predicted(folder, bits: str, first: str) -> dict:
    path = folder / f"user-{bits}-{'eager' if first else 'late'}.py"
    path.write_text(
        WORKLOAD.format(first=first, quantization=QUANTIZATIONS[bits], folder=str(folder / "model"))
    )
    result = run_script(
        "own_model.py", "estimate", "--workload", f"{path}:infer", "--batch", "2",
        "--dtype", "bfloat16", "--gpu", "h200", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)["prediction"]


@pytest.mark.parametrize("bits", sorted(QUANTIZATIONS))
def test_bitsandbytes_imported_by_transformers_inside_the_trace_is_followed(saved, bits):
    late = predicted(saved, bits, "")
    eager = predicted(saved, bits, "import bitsandbytes  # noqa: F401\n")
    assert late["status"] != "not predicted"
    for key in ("status", "phases", "unknown", "bounds"):
        assert late.get(key) == eager.get(key), key
    # quantised: the load holds less than the same weights in bfloat16 would
    settings = json.loads((saved / "model" / "config.json").read_text())
    linear = settings["num_hidden_layers"] * (
        2 * settings["hidden_size"] ** 2
        + 2 * settings["hidden_size"] * settings["hidden_size"] // 2
        + 3 * settings["hidden_size"] * settings["intermediate_size"]
    )
    load = next(r for r in late["phases"] if r["phase"] == "model_load")
    embeddings = 2 * 2 * settings["vocab_size"] * settings["hidden_size"]  # and the head
    assert load["allocated_bytes"] < embeddings + 2 * linear
