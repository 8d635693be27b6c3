"""`--optim adamw_8bit` (bitsandbytes' 8-bit AdamW) traced without a GPU (bnb_optimizers.py):
its state is bitsandbytes' own rules, counted here from the parameters; no GPU has checked
it, so the prediction withholds "exact" and bounds; paged optimizers stay refused."""

from __future__ import annotations

import json
import math

import pytest
from test_hf_model import estimate, reduced, written

from pipeline.core import allocator_model
from pipeline.measuring import own_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")
from pipeline.predicting import bnb_optimizers  # noqa: E402

MIN_8BIT_SIZE = 4096  # Optimizer2State's min_8bit_size: fewer values keep 32-bit state
BLOCKSIZE = 256  # init_state's absmax blocks
QMAP_VALUES = 2**8  # create_dynamic_map(total_bits=8): one float32 value a code


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The reduced Llama with MLP matrices of 65,536 values: their absmax vectors (1 KiB)
    outgrow the allocator's smallest block, so the block size is seen in the figure."""
    config = reduced("llama-3.2-1b", intermediate_size=1024)
    return written(tmp_path_factory.mktemp("bnb"), config)


def training(capsys, config, *options):
    return estimate(capsys, config, "--task", "training", "--dtype", "float32", *options)


def growth(document, phase="optimizer_state"):
    row = next(r for r in document["prediction"]["phases"] if r["phase"] == phase)
    return row["allocated_bytes"] - row["baseline_allocated_bytes"]


def block(nbytes: int) -> int:
    return allocator_model.block_bytes(nbytes)


@pytest.fixture(scope="module")
def state_bytes(config):
    """The blocks bitsandbytes' 8-bit AdamW makes at the first step, from the parameters:
    two uint8 moments and two float32 absmax vectors of ceil(n / 256) values for a parameter
    of 4096 values or more; two float32 moments for a smaller one and for an embedding's
    weight (the Trainer's 32-bit override); the two quantisation maps, once."""
    settings = transformers.AutoConfig.for_model(**json.loads(config.read_text()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(settings, dtype=torch.float32)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    eight = thirty_two = 0
    for p in model.parameters():
        n = p.numel()
        if id(p) in embeddings or n < MIN_8BIT_SIZE:
            thirty_two += 2 * block(4 * n)
        else:
            eight += 2 * block(n) + 2 * block(4 * math.ceil(n / BLOCKSIZE))
    assert eight  # the reduced Llama has both kinds
    assert thirty_two
    assert (
        max(block(4 * math.ceil(n / BLOCKSIZE)) for n in map(torch.numel, model.parameters())) > 512
    )
    return eight + thirty_two + 2 * block(4 * QMAP_VALUES)


def test_the_8bit_state_is_bitsandbytes_own(capsys, config, state_bytes):
    document = training(capsys, config, "--optim", "adamw_8bit")
    assert document["workload"]["optimizer"] == "AdamW"
    assert document["workload"]["recipe"] == {"optim": "adamw_8bit"}
    assert growth(document) == state_bytes
    # held against a GPU's measurements: no note, the calibration's coverage decides
    assert bnb_optimizers.NOTE not in [u["op"] for u in document["prediction"]["unknown"]]
    same = training(capsys, config, "--optim", "adamw_bnb_8bit")  # the same class
    assert growth(same) == state_bytes


def test_the_note_goes_with_bitsandbytes_only(capsys, config, monkeypatch):
    torch_adamw = training(capsys, config, "--optim", "adamw_torch")
    ops = [u["op"] for u in torch_adamw["prediction"]["unknown"]]
    assert bnb_optimizers.NOTE not in ops
    monkeypatch.setattr(bnb_optimizers, "CHECKED_ON_A_GPU", False)
    unchecked = training(capsys, config, "--optim", "adamw_8bit")
    # unchecked on a GPU: a central figure, neither exact nor bounded
    unknown = {u["op"]: u["why"] for u in unchecked["prediction"]["unknown"]}
    assert unknown[bnb_optimizers.NOTE] == bnb_optimizers.UNCHECKED_WHY
    assert unchecked["prediction"]["status"] == "approximate"
    assert "bounds" not in unchecked["prediction"]


@pytest.mark.parametrize(
    ("optim", "said"),
    [
        ("paged_adamw_32bit", "is not modelled"),
        ("lion_8bit", "bitsandbytes.optim.lion.Lion is not modelled"),
    ],
)
def test_other_bitsandbytes_optimizers_are_refused_in_one_line(
    capsys, config, tmp_path, optim, said
):
    out = tmp_path / "m.json"
    argv = ["measure", "--device", "cuda:0", "--output", str(out), "--hf-config", str(config)]
    assert own_model.main([*argv, "--task", "training", "--optim", optim]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"--optim {optim}: " in err
    assert said in err
    assert not out.exists()


def test_a_paged_8bit_adamw_over_small_tensors_keeps_the_unpaged_state(capsys, config):
    """bitsandbytes pages the state of tensors of 100,000 values or more only: LoRA adapters
    of a low rank (QLoRA's paged_adamw_8bit) keep theirs as adamw_8bit does."""
    paged = estimate(capsys, config, "--task", "qlora", "--optim", "paged_adamw_8bit")
    unpaged = estimate(capsys, config, "--task", "qlora", "--optim", "adamw_8bit")
    assert paged["workload"]["recipe"]["optim"] == "paged_adamw_8bit"
    assert paged["prediction"]["phases"] == unpaged["prediction"]["phases"]


def test_a_paged_state_outside_the_allocator_is_refused_in_one_line(capsys, tmp_path):
    """An embedding of 2,048 x 64 = 131,072 values trained in full: its paged state would be
    in CUDA unified memory, which the allocator's counters do not hold."""
    path = written(tmp_path, reduced("llama-3.2-1b", vocab_size=2048))
    argv = ["estimate", "--hf-config", str(path), "--task", "training", "--dim", "sequence=8"]
    assert own_model.main([*argv, "--optim", "paged_adamw_8bit"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "own_model.py: error: --optim paged_adamw_8bit: 1 trained tensors of 100,000 values "
        "or more (the largest 131,072) would keep their state in CUDA unified memory"
    ), line
