"""A checkpoint bitsandbytes quantized in 4 bits, named by its config's own
quantization_config (as a Hub repository of a model "-bnb-4bit" publishes it): loaded as
from_pretrained loads it, its packed weights and quantisation state copied to the device as
they are (predicting/quantized_load.py).

The oracle is a real load: the same workload built for real on the CPU, every tensor it
holds counted in the caching allocator's blocks.
"""

from __future__ import annotations

import json

import pytest
from test_hf_model import estimate, reduced, written
from test_quantized_load import built_for_real, end_of, held_blocks

from pipeline.core import allocator_model
from pipeline.measuring import own_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")
from bitsandbytes import functional as bnb_functional  # noqa: E402

from pipeline.predicting import from_pretrained, quantized_load  # noqa: E402

# BitsAndBytesConfig(load_in_4bit=True, nf4, double quantisation, bfloat16).to_dict(), as
# save_pretrained writes it into config.json
STORED = {
    "_load_in_4bit": True,
    "_load_in_8bit": False,
    "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_quant_storage": "uint8",
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
    "llm_int8_skip_modules": None,
    "llm_int8_threshold": 6.0,
    "load_in_4bit": True,
    "load_in_8bit": False,
    "quant_method": "bitsandbytes",
}
RECIPE = {
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
    "prequantized": True,
}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return written(
        tmp_path_factory.mktemp("prequantized"),
        reduced("llama-3.2-1b", quantization_config=STORED),
    )


def test_the_savepretrained_fields_match_transformers_own():
    """STORED is what transformers writes today for that BitsAndBytesConfig."""
    made = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    ).to_dict()
    assert made == STORED


@pytest.mark.parametrize("task", ["inference", "qlora"])
def test_a_4bit_checkpoint_holds_what_the_same_load_holds_for_real(capsys, config, task):
    """After model_load the trace holds the blocks the real load of the same checkpoint
    holds: packed weights and their nested quantisation state, copied as they are."""
    document = estimate(capsys, config, "--task", task, "--dtype", "bfloat16")
    assert document["workload"]["recipe"] == RECIPE
    real = built_for_real(config, task, RECIPE)
    weights = [p for p in real.parameters() if type(p).__name__ == "Params4bit"]
    assert weights
    assert all(p.dtype == torch.uint8 for p in weights)
    # bitsandbytes' process-wide quantisation map was made by the host's quantisation of
    # the checkpoint: on a GPU it stays on the host, here the host is the device
    on_host = sum(
        allocator_model.block_bytes(t.untyped_storage().nbytes())
        for t in bnb_functional.name2qmap.values()
    )
    assert on_host > 0
    assert end_of(document, "model_load") == held_blocks(real) - on_host


def test_a_checkpoint_loads_without_the_transient_of_a_quantisation_on_the_device(
    capsys, config, tmp_path
):
    """The same model quantised on the device (--load-in-4bit) passes each weight through
    the GPU in bfloat16; a checkpoint quantized already does not: the same blocks at the
    end, a lower or equal peak."""
    stored = estimate(capsys, config, "--task", "inference", "--dtype", "bfloat16")
    plain = json.loads(config.read_text())
    del plain["quantization_config"]
    path = written(tmp_path, plain)
    options = ["--bnb-4bit-quant-type", "nf4", "--bnb-4bit-use-double-quant",
               "--bnb-4bit-compute-dtype", "bfloat16"]  # fmt: skip
    on_device = estimate(
        capsys, path, "--task", "inference", "--dtype", "bfloat16", "--load-in-4bit", *options
    )
    # quantised on the device, bitsandbytes keeps its map for the nested absmax there
    # (functional.name2qmap: 256 float32 values); a checkpoint's load makes none
    the_map = allocator_model.block_bytes(256 * 4)
    assert end_of(stored, "model_load") == end_of(on_device, "model_load") - the_map
    peak = {
        name: next(r for r in doc["prediction"]["phases"] if r["phase"] == "model_load")[
            "peak_allocated_bytes"
        ]
        for name, doc in (("stored", stored), ("on_device", on_device))
    }
    assert peak["stored"] <= peak["on_device"]


def test_until_a_gpu_has_checked_such_a_load_a_prediction_claims_nothing(
    capsys, config, monkeypatch
):
    """The pre-quantized load has its own flag: while it is False, no exact, no bounds."""
    monkeypatch.setattr(quantized_load, "PREQUANTIZED_CHECKED_ON_A_GPU", False)
    document = estimate(
        capsys, config, "--task", "inference", "--dtype", "bfloat16", "--gpu", "h200"
    )
    unknown = {u["op"]: u["why"] for u in document["prediction"]["unknown"]}
    assert unknown[quantized_load.PREQUANTIZED_NOTE] == quantized_load.PREQUANTIZED_UNCHECKED_WHY
    assert from_pretrained.LOAD_THREADS in unknown
    assert document["prediction"]["status"] == "approximate"
    assert "bounds" not in document["prediction"]


def test_once_checked_the_loader_threads_leave_bounds_but_no_exact(capsys, config, monkeypatch):
    monkeypatch.setattr(quantized_load, "PREQUANTIZED_CHECKED_ON_A_GPU", True)
    document = estimate(
        capsys, config, "--task", "inference", "--dtype", "bfloat16", "--gpu", "h200"
    )
    unknown = {u["op"] for u in document["prediction"]["unknown"]}
    assert quantized_load.PREQUANTIZED_NOTE not in unknown
    assert from_pretrained.LOAD_THREADS in unknown
    assert document["prediction"]["status"] == "approximate"
    assert "bounds" in document["prediction"]


@pytest.mark.parametrize(
    ("changes", "options", "said"),
    [
        ({}, ["--load-in-4bit"], "--load-in-4bit: the config's quantization_config says how"),
        ({}, ["--bnb-4bit-quant-type", "fp4"], "--bnb-4bit-quant-type: the config's"),
        ({}, ["--task", "training"],
         "a 4-bit checkpoint (its config's quantization_config) with --task training:"),
        ({"bnb_4bit_quant_storage": "bfloat16"}, [],
         "quantization_config's bnb_4bit_quant_storage 'bfloat16' is not modelled"),
        ({"bnb_4bit_quant_type": "int4"}, [],
         "quantization_config's bnb_4bit_quant_type 'int4' is not modelled"),
        ({"load_in_4bit": False, "_load_in_4bit": False, "load_in_8bit": True}, [],
         "a quantized model (quantization_config: bitsandbytes) is not modelled: the lab "
         "loads bitsandbytes' 4-bit checkpoints (load_in_4bit); an 8-bit checkpoint's own "
         "load is not modelled: remove quantization_config from a copy of the file and give "
         "--load-in-8bit"),
        ({}, ["--load-in-8bit"], "--load-in-8bit: the config's quantization_config says how"),
    ],
)  # fmt: skip
def test_what_the_lab_does_not_load_is_one_line_and_exit_2(
    capsys, tmp_path, changes, options, said
):
    path = written(tmp_path, reduced("llama-3.2-1b", quantization_config={**STORED, **changes}))
    code = own_model.main(["estimate", "--hf-config", str(path), *options])
    err = capsys.readouterr().err
    assert code == 2, err
    [line] = err.splitlines()
    assert said in line, line
    assert line.startswith("own_model.py: error: "), line


def test_the_checkpoint_a_trace_loads_is_not_made_in_the_hosts_memory(tmp_path):
    """The zeros checkpoint a 4-bit load reads is fake in a trace: Llama 3.2 1B's, 2.5 GB in
    bfloat16, would otherwise be made for real on the machine that predicts (an 8B's took
    16 GB, a 70B's would not fit). The estimating process stays well under its size."""
    import subprocess
    import sys

    from conftest import ROOT

    path = ROOT / "tests" / "data" / "hf-configs" / "llama-3.2-1b.json"
    program = (
        "import resource, sys\n"
        "from pipeline.measuring import own_model\n"
        "code = own_model.main(sys.argv[1:])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    argv = ["estimate", "--hf-config", str(path), "--task", "inference", "--load-in-4bit",
            "--bnb-4bit-compute-dtype", "bfloat16", "--dtype", "bfloat16", "--batch", "1",
            "--dim", "sequence=64", "--warmup", "1", "--repeats", "1"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", program, *argv], capture_output=True, text=True, cwd=ROOT,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    peak_kib = int(result.stderr.strip().splitlines()[-1])  # Linux: kibibytes
    checkpoint = 1_235_814_400 * 2  # its parameters, untied, in bfloat16
    assert peak_kib * 1024 < checkpoint / 2, peak_kib
