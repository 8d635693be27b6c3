"""A user's own workload file that loads its model with transformers' from_pretrained onto
the device, traced without a GPU (predicting/from_pretrained.py): the skeleton is no memory,
the weights are the device's blocks from model_load on, copied as the loader's threads copy
them (one at a time here, and said so).

The oracle is a real load: the same checkpoint loaded by from_pretrained on the CPU, every
tensor it holds counted in the caching allocator's blocks.
"""

from __future__ import annotations

import json

import pytest

from pipeline.core import allocator_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pipeline.predicting import from_pretrained  # noqa: E402

WORKLOAD = """
import torch
import transformers


def infer(config, *, sequence=16):
    from own_model import Workload

    model = transformers.AutoModelForCausalLM.from_pretrained(
        {folder!r}, dtype=config.dtype{placed}
    ){moved}
    make_inputs = lambda: {{
        "input_ids": torch.zeros(config.batch, sequence, dtype=torch.long, device=config.device)
    }}
    return Workload(model.eval(), make_inputs)
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small Llama saved by save_pretrained (safetensors), and a workload file loading it."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    saved_llama(folder / "model", hidden_size=64, intermediate_size=128)
    path = folder / "user.py"
    path.write_text(written(folder, ", device_map=config.device", ""))
    return folder, path


def saved_llama(
    folder, hidden_size: int, intermediate_size: int, heads: int = 4, kv_heads: int = 2
):
    """A small Llama (2 layers, 512 tokens) saved by save_pretrained (safetensors) in
    `folder`, as a user's checkpoint."""
    settings = transformers.LlamaConfig(
        vocab_size=512, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
    )  # fmt: skip
    transformers.logging.disable_progress_bar()
    transformers.LlamaForCausalLM(settings).save_pretrained(folder)
    transformers.logging.enable_progress_bar()


def written(folder, placed: str, moved: str) -> str:
    return WORKLOAD.format(folder=str(folder / "model"), placed=placed, moved=moved)


def held_blocks(model) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(allocator_model.block_bytes(n) for n in storages.values() if n)


def estimated_beside_a_real_load(folder, path) -> tuple[dict, int, int]:
    """The file's estimate in a fresh process (--gpu h200), its model_load's allocated
    bytes, and the blocks the same checkpoint holds loaded for real on the CPU."""
    from conftest import run_script

    result = run_script(
        "own_model.py", "estimate", "--workload", f"{path}:infer", "--batch", "2",
        "--dtype", "bfloat16", "--gpu", "h200", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    load = next(r for r in document["prediction"]["phases"] if r["phase"] == "model_load")
    real = transformers.AutoModelForCausalLM.from_pretrained(
        folder / "model", dtype=torch.bfloat16, device_map="cpu"
    )
    return document, load["allocated_bytes"], held_blocks(real)


def test_a_users_from_pretrained_holds_the_weights_the_real_load_holds(saved):
    """In a fresh process, as a user runs it: transformers imports its loader lazily, at the
    first from_pretrained, inside the trace."""

    folder, path = saved
    document, load, real = estimated_beside_a_real_load(folder, path)
    assert load == real
    unknown = {u["op"] for u in document["prediction"]["unknown"]}
    assert from_pretrained.LOAD_THREADS in unknown  # never exact: the threads' order
    assert not any("outside the dispatcher" in u for u in unknown), unknown
    assert document["prediction"]["status"] == "approximate"


def test_a_model_loaded_on_the_host_and_moved_is_not_the_loaders_threads(saved, tmp_path):
    """from_pretrained onto the host, then `.to(config.device)`: the loader's threads copy
    to the host, which asks nothing of the GPU (no LOAD_THREADS note); the device holds the
    same blocks."""

    folder, _ = saved
    path = tmp_path / "moved.py"
    path.write_text(written(folder, "", ".to(config.device)"))
    document, load, real = estimated_beside_a_real_load(folder, path)
    assert load == real
    unknown = {u["op"] for u in document["prediction"]["unknown"]}
    assert from_pretrained.LOAD_THREADS not in unknown


@pytest.mark.gpu
def test_a_users_from_pretrained_measured_on_a_gpu_is_what_the_trace_said(saved, tmp_path):
    """The same file measured on the GPU: the load's blocks equal the GPU-free estimate's to
    the byte, the measurement's own prediction (traced beside the GPU) is honest, and the
    estimate's bounds hold on every peak of every phase."""
    from conftest import run_script
    from test_gpu_own_model import honest, measured, outside_bounds

    _, path = saved
    options = ["--workload", f"{path}:infer", "--batch", "2", "--dtype", "bfloat16"]
    estimated = run_script("own_model.py", "estimate", *options, "--gpu", "h200", "--json")
    assert estimated.returncode == 0, estimated.stderr[-2000:]
    prediction = json.loads(estimated.stdout)["prediction"]
    document, _ = measured(tmp_path, *options)
    honest(document)
    load = next(r for r in document["phases"] if r["phase"] == "model_load")
    assert load["allocated_bytes"] == next(
        r["allocated_bytes"] for r in prediction["phases"] if r["phase"] == "model_load"
    )
    assert outside_bounds(prediction["bounds"], document) == []
