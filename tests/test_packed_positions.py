"""transformers' packed-sequence check in a trace (packed_positions.py): position ids that
count up by one (the model's own) take the real run's answer, one sequence a row; any other
ids keep transformers' own, the mask kept."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import test_hf_model as hf  # noqa: E402
import transformers.masking_utils as masking  # noqa: E402

from pipeline.measuring import own_model  # noqa: E402
from pipeline.predicting import trace_prediction as tp  # noqa: E402
from pipeline.workloads import hf_model  # noqa: E402


def protocol(config: dict, device: str, checkpointing: bool):
    def drive(phase):
        configuration = own_model.Configuration(torch.device(device), torch.float32, 2, 0)

        def function(config_, *, sequence):
            return hf_model.build(config_, config, "training", checkpointing, sequence=sequence)

        own_model.drive(
            torch, phase, function, "training", configuration, {"sequence": 16}, 1, 1, [], {}, ()
        )

    return drive


def test_a_checkpointed_step_allocates_what_a_real_cpu_run_allocates():
    """With checkpointing transformers runs without a cache and asks whether the rows are
    packed: the real run reads the answer and drops the mask; the trace did not (1,321
    allocations against 1,303, the first apart at the check's `eq`)."""
    config = hf.reduced("llama-3.2-1b", attn_implementation="eager")
    fake = tp.run_trace(torch, "meta", protocol(config, "meta", True))
    real = tp.run_trace(torch, "cpu", protocol(config, "cpu", True), fake=False)
    assert fake.stopped is None
    assert len(hf.allocations(real)) > 1000
    assert hf.allocations(fake) == hf.allocations(real)


def test_only_counting_position_ids_take_the_real_runs_answer():
    seen = {}

    def drive(phase):
        def step():
            with torch.device("meta"):
                counting = (torch.arange(8) + 3).unsqueeze(0).expand(2, -1)
                packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]] * 2)
                stepped = torch.arange(0, 16, 2).unsqueeze(0)
            for name, ids in (("counting", counting), ("packed", packed), ("stepped", stepped)):
                seen[name] = masking.find_packed_sequence_indices(ids)

        phase("step", step)

    trace = tp.run_trace(torch, "meta", drive)
    assert trace.stopped is None
    assert seen["counting"] is None  # one sequence a row, as a real run reads it
    assert seen["packed"] is not None  # transformers' own answer on a fake tensor: the mask
    assert seen["stepped"] is not None
