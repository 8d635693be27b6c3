"""A model loaded in 4 bits, measured on a real GPU (marked `gpu`; skipped where none is
visible): QLoRA as --task qlora runs it, its prediction beside the GPU held to the measurement
and to the allocator's history."""

from __future__ import annotations

import json

import pytest
from conftest import run_script
from test_gpu_own_model import honest
from test_hf_model import reduced, written

from pipeline.artefacts import validate

pytestmark = pytest.mark.gpu
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")


@pytest.mark.parametrize(
    "options",
    [
        ["--task", "qlora", "--optim", "paged_adamw_8bit"],
        ["--task", "qlora", "--bf16", "--gradient-accumulation-steps", "2"],
        ["--task", "generate", "--load-in-4bit", "--bnb-4bit-compute-dtype", "bfloat16"],
    ],
    ids=["qlora-paged", "qlora-bf16-accumulate", "generate-4bit"],
)
def test_a_model_in_4_bits_is_measured_and_its_prediction_holds(tmp_path, options):
    config = written(tmp_path, reduced("llama-3.2-1b"))
    output = tmp_path / "m.json"
    result = run_script(
        "own_model.py", "measure", "--hf-config", str(config), "--device", "cuda:0",
        "--dtype", "bfloat16", "--batch", "2", "--dim", "sequence=64", "--output", str(output),
        *options,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(output.read_text())
    assert validate.validate_document(document, validate.load_registry()) == []
    assert document["status"] == "completed"
    assert document["workload"]["recipe"]["load_in_4bit"] is True
    assert "uint8" in document["workload"]["parameters"]["by_dtype"]  # packed 4-bit weights
    honest(document)
