"""A model loaded in 4 bits (`--load-in-4bit`, `--task qlora`), traced without a GPU: the
blocks of transformers' from_pretrained with bitsandbytes' BitsAndBytesConfig
(predicting/quantized_load.py) and of bitsandbytes' CUDA dispatch (predicting/bnb_kernels.py).

The oracle for the load is a real one: the same workload built for real on the CPU, where
bitsandbytes quantises too, every tensor it holds counted in the caching allocator's blocks.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from test_hf_model import estimate, reduced, written

from pipeline.core import allocator_model
from pipeline.core.workload_contract import Configuration
from pipeline.measuring import own_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")
from bitsandbytes import functional as bnb_functional  # noqa: E402

from pipeline.predicting import bnb_kernels, quantized_load  # noqa: E402
from pipeline.workloads import hf_model  # noqa: E402

QLORA = {
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return written(tmp_path_factory.mktemp("qlora"), reduced("llama-3.2-1b"))


def held_blocks(model) -> int:
    """The bytes of the caching allocator's blocks for every tensor the model holds:
    parameters, buffers and each 4-bit weight's quantisation state (its absmax, code,
    offset and, nested, their own absmax and code), each storage once."""
    tensors = [*model.parameters(), *model.buffers()]
    for parameter in model.parameters():
        state = getattr(parameter, "quant_state", None)
        while state is not None:
            tensors += [t for t in (state.absmax, state.code, state.offset) if t is not None]
            state = state.state2
    # and the quantisation map bitsandbytes keeps for the process once it has made one
    tensors += list(bnb_functional.name2qmap.values())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(allocator_model.block_bytes(n) for n in storages.values() if n)


def built_for_real(config_path, task: str, recipe: dict, dtype=torch.bfloat16):
    settings = json.loads(config_path.read_text())
    bnb_functional.name2qmap.clear()  # as in a fresh process
    run = Configuration(device=torch.device("cpu"), dtype=dtype, batch=2, seed=0)
    dims = {"sequence": 16, **({"lora_rank": 8} if task == "qlora" else {})}
    return hf_model.build(run, settings, task, False, recipe, **dims).model


def end_of(document, phase: str) -> int:
    row = next(r for r in document["prediction"]["phases"] if r["phase"] == phase)
    return row["allocated_bytes"]


def test_a_qlora_model_holds_what_the_same_load_holds_for_real(capsys, config):
    """After model_load, the trace holds the blocks the real load holds: packed 4-bit
    weights, their nested quantisation state, the norms and embeddings in float32
    (prepare_model_for_kbit_training) and the LoRA adapters; the skeleton from_pretrained
    builds and the allocator warm-up (dropped at once) are gone."""
    document = estimate(capsys, config, "--task", "qlora", "--dtype", "bfloat16")
    assert document["workload"]["recipe"] == QLORA
    real = built_for_real(config, "qlora", QLORA)
    weights = [p for p in real.parameters() if type(p).__name__ == "Params4bit"]
    assert weights
    assert all(p.dtype == torch.uint8 for p in weights)  # quantised for real
    assert {p.dtype for p in real.parameters() if type(p).__name__ != "Params4bit"} == {
        torch.float32
    }
    assert end_of(document, "model_load") == held_blocks(real)


def test_a_qlora_estimate_says_nothing_about_the_libraries_own_calls(config):
    """What the libraries say of their own calls (peft's checkpointing without
    use_reentrant, bitsandbytes' CPU kernel) is not the user's to act on: a QLoRA estimate's
    stderr holds neither."""
    from conftest import run_script

    result = run_script(
        "own_model.py", "estimate", "--hf-config", str(config), "--task", "qlora",
        "--dtype", "bfloat16", "--batch", "2", "--dim", "sequence=16", "--gpu", "h200",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "use_reentrant" not in result.stderr
    assert "kernels-community" not in result.stderr


@pytest.mark.parametrize(
    ("options", "recipe"),
    [
        (["--load-in-4bit"], {"load_in_4bit": True}),  # BitsAndBytesConfig's defaults
        (
            ["--load-in-4bit", "--bnb-4bit-quant-type", "nf4", "--bnb-4bit-use-double-quant"],
            {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
        ),
    ],
)
def test_a_model_loaded_in_4_bits_for_inference_holds_what_the_real_load_holds(
    capsys, config, options, recipe
):
    document = estimate(capsys, config, "--task", "inference", "--dtype", "bfloat16", *options)
    assert document["workload"]["recipe"] == recipe
    real = built_for_real(config, "inference", recipe)
    assert end_of(document, "model_load") == held_blocks(real)
    # checked on a GPU: no note; the calibration's coverage decides
    assert quantized_load.NOTE not in [u["op"] for u in document["prediction"]["unknown"]]


def test_the_load_in_4_bits_is_smaller_than_in_bfloat16_by_the_quantised_weights(capsys, config):
    plain = estimate(capsys, config, "--task", "inference", "--dtype", "bfloat16")
    four = estimate(capsys, config, "--task", "inference", "--dtype", "bfloat16", "--load-in-4bit")
    assert end_of(four, "model_load") < end_of(plain, "model_load")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--task", "training", "--load-in-4bit"], "--load-in-4bit with --task training:"),
        (["--task", "inference", "--bnb-4bit-quant-type", "nf4"],
         "--bnb-4bit-quant-type goes with --load-in-4bit or --task qlora"),
        (["--task", "qlora", "--gradient-checkpointing"],
         "--gradient-checkpointing with --task qlora: it is on already"),
        (["--task", "generate", "--lora-rank", "4"],
         "--lora-rank goes with --task lora or qlora, not generate"),
    ],
)  # fmt: skip
def test_a_4bit_option_out_of_place_is_one_line_and_exit_2(capsys, config, options, said):
    code = own_model.main(["estimate", "--hf-config", str(config), *options])
    err = capsys.readouterr().err
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"own_model.py: error: {said}"), line


def test_without_bitsandbytes_a_4bit_load_is_refused_in_one_line(capsys, config, monkeypatch):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "bitsandbytes" else found(name, *rest),
    )
    code = own_model.main(["estimate", "--hf-config", str(config), "--task", "qlora"])
    [line] = capsys.readouterr().err.splitlines()
    assert code == 2
    assert "pip install 'bitsandbytes==0.50.2'" in line


def test_the_cuda_dispatch_of_gemm_4bit_is_bitsandbytes_own():
    """Read from bitsandbytes' source for an H200 (132 SMs, 9.0): past 1,536 rows the
    fallback (dequantise, then F.linear); a few rows its own kernel."""
    dispatch = bnb_kernels.read_cuda_dispatch(torch, (132, 9, 0))
    assert dispatch is not None
    assert dispatch["_gemm_4bit_custom_max_m"] == 1536
    custom = dispatch["_gemm_4bit_use_custom_cuda"]
    assert custom(0, torch.bfloat16, 1, 4096, 4096) is True  # decoding one token
    assert custom(0, torch.float32, 64, 4096, 4096) is False  # no MMA kernel for float32


def test_a_4bit_linear_past_the_row_cap_dequantises_its_weight_on_the_gpu_path():
    """gemm_4bit at 2,048 rows traced for an H200: the fallback's blocks (the nested absmax
    dequantised and offset, float32; the weight dequantised, bfloat16), then the product's
    output; without the dispatch, the fake kernel's output alone."""
    import bitsandbytes as bnb

    from pipeline.predicting import attention_choice as ac
    from pipeline.predicting import trace_prediction as tp

    def run():
        layer = bnb.nn.Linear4bit(
            512, 256, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4", device="meta"
        )
        layer.weight = layer.weight.to("meta")  # quantised on meta: the GPU's stand-in
        x = torch.randn(2048, 512, device="meta", dtype=torch.bfloat16)
        with torch.no_grad():
            layer(x)

    def sizes(props):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(bnb_kernels, "read_cuda_dispatch", (
                lambda torch, p, read=bnb_kernels.read_cuda_dispatch: read(torch, p)
                if props else None
            ))  # fmt: skip
            with tp.Tracer(torch, "meta", target=ac.H200) as tracer:
                run()
        return [e[1].outputs for e in tracer.trace.events if e[0] == "op"]

    with_dispatch = sizes(True)
    flat = [nbytes for outputs in with_dispatch for _, _, nbytes in outputs]
    blocks = 512 * 256 // 64  # absmax values, one per block of 64
    assert 4 * blocks in flat  # the nested absmax dequantised to float32
    assert 512 * 256 * 2 in flat  # the weight dequantised to bfloat16
    assert 2048 * 256 * 2 in flat  # the product
    without = [nbytes for outputs in sizes(False) for _, _, nbytes in outputs]
    assert 512 * 256 * 2 not in without


def test_the_skeleton_is_not_memory_and_the_warm_up_block_is(capsys, config):
    """from_pretrained's skeleton (its tensors on meta, which the trace's device is too) holds
    no block; the allocator warm-up asks for the model's bytes as a GPU would (4-bit weights
    at half a byte a value), and drops them at once: model_load peaks at that block or at
    the load of one weight past what stays, never at a second copy of the model."""
    document = estimate(
        capsys, config, "--task", "inference", "--dtype", "bfloat16", "--load-in-4bit"
    )
    real = built_for_real(config, "inference", {"load_in_4bit": True})
    warm_up = sum(
        (p.quant_state.shape.numel() // 2 if type(p).__name__ == "Params4bit" else p.nbytes)
        for p in real.parameters()
    )
    load = next(r for r in document["prediction"]["phases"] if r["phase"] == "model_load")
    largest = max(p.nbytes for p in real.parameters())  # a bfloat16 weight, before its quantising
    assert load["peak_allocated_bytes"] <= max(
        allocator_model.block_bytes(2 * (warm_up // 2)),
        load["allocated_bytes"] + 2 * allocator_model.block_bytes(largest),
    )
    assert load["peak_allocated_bytes"] >= allocator_model.block_bytes(2 * (warm_up // 2))


def test_the_warm_up_asks_a_gpu_for_the_models_bytes_in_float16_and_drops_them():
    """caching_allocator_warmup skips meta; in a trace for a GPU it runs as on CUDA in a fresh
    process: one float16 tensor of half the bytes transformers counts, freed at once."""
    import types

    from pipeline.predicting import attention_choice as ac
    from pipeline.predicting import trace_prediction as tp

    utils = transformers.modeling_utils
    with tp.Tracer(torch, "meta", target=ac.H200) as tracer:
        weight = torch.empty(1000, 999, dtype=torch.bfloat16, device="meta")
        model = types.SimpleNamespace(
            all_tied_weights_keys={}, get_parameter_or_buffer=lambda name: weight
        )
        utils.caching_allocator_warmup(model, {"w": "meta", "cpu_one": "cpu"}, None)
        torch.empty(1, device="meta")  # the next operator: the trace sees the free before it
    kinds = [(e[0], e[1].outputs if e[0] == "op" else e[1]) for e in tracer.trace.events]
    ((_, warm_up, nbytes),) = kinds[1][1]
    assert nbytes == 2 * (1000 * 999 * 2 // 2)
    assert kinds[2] == ("free", warm_up)
    # outside a trace, transformers' own: meta is skipped
    before = torch.zeros(1)
    utils.caching_allocator_warmup(model, {"w": "meta"}, None)
    assert before.sum() == 0


def test_a_bias_cast_the_trace_cannot_follow_is_refused_in_one_line(capsys, tmp_path):
    """Qwen2's projections have biases: loaded in bfloat16 with float32 compute,
    bitsandbytes casts them in place under inference_mode, which the meta device refuses."""
    path = written(tmp_path, reduced("qwen2.5-0.5b"))
    argv = ["estimate", "--hf-config", str(path), "--task", "inference", "--load-in-4bit"]
    code = own_model.main([*argv, "--dtype", "bfloat16", "--dim", "sequence=8"])
    [line] = capsys.readouterr().err.splitlines()
    assert code == 2
    assert line.startswith(
        "own_model.py: error: --bnb-4bit-compute-dtype float32 on a model in bfloat16 whose "
        "4-bit layers have biases"
    ), line
    same = [*argv, "--dtype", "bfloat16", "--dim", "sequence=8"]
    assert own_model.main([*same, "--bnb-4bit-compute-dtype", "bfloat16"]) == 0


def test_until_a_gpu_has_checked_the_load_a_prediction_claims_nothing(capsys, config, monkeypatch):
    monkeypatch.setattr(quantized_load, "CHECKED_ON_A_GPU", False)
    document = estimate(capsys, config, "--task", "qlora", "--dtype", "bfloat16")
    unknown = {u["op"]: u["why"] for u in document["prediction"]["unknown"]}
    assert unknown[quantized_load.NOTE] == quantized_load.UNCHECKED_WHY
    assert document["prediction"]["status"] == "approximate"
    assert "bounds" not in document["prediction"]
