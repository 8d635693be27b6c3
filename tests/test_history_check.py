"""The oracle in every measurement (history_check.py, own_model.held_against_history): the
replay against the allocator's history, request by request; an exact claim it contradicts is
withdrawn with the first difference named."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT

from pipeline.measuring import own_model
from pipeline.predicting import history_check
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

MIB = 1 << 20


def gpu(*events) -> list[dict]:
    """An allocator history: ("alloc" | "free", bytes), with the keys the allocator records."""
    names = {"alloc": "alloc", "free": "free_completed"}
    found = []
    for n, (action, size) in enumerate(events):
        found.append({"action": names[action], "size": size, "addr": n, "stream": 0})
        if action == "alloc":  # the other actions an allocator records are ignored
            found.append({"action": "segment_alloc", "size": size, "addr": n, "stream": 0})
    return found


LOG = [
    ("phase", 0, "model_load"),
    ("alloc", 4 * MIB, "aten.empty"),
    ("phase", 0, "cold_step"),
    ("alloc", MIB, "aten.mm"),
    ("alloc", 512, "aten.sum"),
    ("free", MIB, "storage"),
    ("free", 512, "storage"),
    ("alloc", 2 * MIB, "aten.mul"),
    ("free", 2 * MIB, "storage"),
]


def test_the_same_requests_agree_whatever_the_order_of_frees_between_two():
    history = gpu(("alloc", 4 * MIB), ("alloc", MIB), ("alloc", 512), ("free", 512),
                  ("free", MIB), ("alloc", 2 * MIB))  # fmt: skip
    found = history_check.check(history, LOG)
    assert found == {"requests": {"gpu": 4, "replay": 4}, "agrees": True, "first_difference": None}


def test_a_request_the_replay_lacks_is_named_with_its_phase_and_operator():
    history = gpu(("alloc", 4 * MIB), ("alloc", MIB), ("alloc", 512), ("alloc", 8192),
                  ("free", 512), ("free", MIB), ("alloc", 2 * MIB))  # fmt: skip
    found = history_check.check(history, LOG)
    assert found["agrees"] is False
    assert found["requests"] == {"gpu": 5, "replay": 4}
    assert found["first_difference"] == {
        "position": 4,
        "phase": "cold_step",
        "gpu": {"action": "alloc", "bytes": [8192]},
        "replay": {"action": "free", "bytes": [512, MIB]},
        "operator": "storage",
    }
    assert history_check.why(found) == (
        "at its event 4 (cold_step, the replay at storage) the GPU's allocator history shows "
        "a block of 8,192 B where the replay has 2 block(s) freed (1,049,088 B)"
    )


def test_a_block_of_another_size_differs_after_the_allocators_rounding_only():
    rounded = gpu(("alloc", 4 * MIB), ("alloc", MIB), ("alloc", 100), ("free", 100), ("free", MIB),
                  ("alloc", 2 * MIB))  # fmt: skip
    assert history_check.check(rounded, LOG)["agrees"] is True  # 100 B and 512 B: one block
    other = gpu(("alloc", 4 * MIB), ("alloc", MIB + 512), ("alloc", 512), ("alloc", 2 * MIB))
    first = history_check.check(other, LOG)["first_difference"]
    assert (first["position"], first["gpu"], first["operator"]) == (
        2, {"action": "alloc", "bytes": [MIB + 512]}, "aten.mm"
    )  # fmt: skip


def test_a_shorter_history_differs_where_it_ends():
    found = history_check.check(gpu(("alloc", 4 * MIB)), LOG)
    assert found["first_difference"]["position"] == 2
    assert found["first_difference"]["gpu"] is None


def prediction(status) -> tp.Prediction:
    rows = [{"phase": "model_load"}]
    return tp.Prediction(status, rows, [], list(LOG))


def snapshot(history) -> dict:
    return {"device_traces": [history]}


def test_an_exact_claim_the_history_contradicts_is_withdrawn():
    found = prediction(PredictionStatus.EXACT)
    history = gpu(("alloc", 4 * MIB), ("alloc", 3 * MIB))
    check = own_model.held_against_history(snapshot(history), torch.device("cuda", 0), found, 7)
    assert check["agrees"] is False
    assert check["history_ns"] == 7
    assert check["check_ns"] >= 0
    assert found.status == PredictionStatus.APPROXIMATE
    assert [u["op"] for u in found.unknown] == [history_check.HISTORY]
    assert found.unbounded is not None
    assert found.bounds is None


def test_an_exact_claim_the_history_bears_out_stays_exact():
    found = prediction(PredictionStatus.EXACT)
    history = gpu(("alloc", 4 * MIB), ("alloc", MIB), ("alloc", 512), ("free", MIB),
                  ("free", 512), ("alloc", 2 * MIB))  # fmt: skip
    check = own_model.held_against_history(snapshot(history), torch.device("cuda", 0), found, 0)
    assert check["agrees"] is True
    assert found.status == PredictionStatus.EXACT
    assert found.unknown == []


def test_no_history_or_a_history_that_dropped_its_start_checks_nothing():
    found = prediction(PredictionStatus.EXACT)
    assert own_model.held_against_history(None, torch.device("cuda", 0), found, 0) is None
    full = [{"action": "alloc", "size": 512, "addr": 0}] * tp.HISTORY_ENTRIES
    assert own_model.held_against_history(snapshot(full), torch.device("cuda", 0), found, 0) is None
    assert found.status == PredictionStatus.EXACT


def h100_frames(request: int) -> list[dict]:
    """The stack an H100's allocator recorded for one request of a transformers Llama step
    (`runs/20261207T071500Z-trace-left-real-blocks/history-cost.txt`, printed as
    `name  (file:line)`), as the snapshot holds it."""
    text = ROOT / "runs" / "20261207T071500Z-trace-left-real-blocks" / "history-cost.txt"
    blocks = text.read_text().split("--- alloc of ")[1:]
    frames = []
    for line in blocks[request].splitlines()[1:]:
        name, _, where = line.strip().rpartition("  (")
        filename, _, number = where.rstrip(")").rpartition(":")
        frames.append({"name": name, "filename": filename, "line": int(number or 0)})
    return frames


def test_with_stack_traces_the_first_difference_names_the_cpp_function_that_asked():
    """Past the allocator's and the dispatcher's own frames: the embedding's index_select
    that asked an H100 for 4 MiB."""
    frames = h100_frames(0)
    assert frames[0]["name"] == "torch::unwind::unwind()"
    history = [{"action": "alloc", "size": 4 * MIB, "addr": 0, "stream": 0, "frames": frames}]
    found = history_check.check(history, [("phase", 0, "cold_step"), ("alloc", 512, "aten.sum")])
    first = found["first_difference"]
    assert first["gpu_function"] == "at::native::index_select_out_cuda_impl<c10::BFloat16>"
    assert "(made by at::native::index_select_out_cuda_impl<c10::BFloat16>)" in history_check.why(
        found
    )


@pytest.mark.parametrize(
    ("request_", "function"),
    [
        (0, "at::native::index_select_out_cuda_impl<c10::BFloat16>"),  # resized in its body
        (1, "at::native::arange_cuda_out"),
        # a structured kernel makes its output before its body: the op's own output setter
        (2, "at::structured_sum_out_functional::set_output_raw_strided"),
    ],
)
def test_the_function_named_is_the_kernels_not_the_allocators(request_, function):
    assert history_check.made_by({"frames": h100_frames(request_)}) == function


def test_without_stack_traces_no_function_is_named():
    found = history_check.check(gpu(("alloc", 4 * MIB)), [("alloc", 512, "aten.sum")])
    assert "gpu_function" not in found["first_difference"]


def test_an_empty_tensor_asks_the_gpu_for_nothing():
    """The replay logs an empty tensor's storage (0 bytes, `torch.tensor([])` copied to the
    device, a cache's first keys); the GPU's allocator records no request for it."""
    log = [("phase", 0, "cold_step"), ("alloc", 0, "aten._to_copy"), ("alloc", MIB, "aten.cat"),
           ("free", 0, "storage")]  # fmt: skip
    found = history_check.check(gpu(("alloc", MIB)), log)
    assert found == {"requests": {"gpu": 1, "replay": 1}, "agrees": True, "first_difference": None}


@pytest.mark.parametrize("point", ["llama-small", "llama-1b", "gemma2", "llama-tied"])
def test_an_h100s_history_of_a_transformers_forward_agrees_with_its_replay(point):
    """Histories an H100 recorded (`measure --memory-history`) of transformers forwards with
    autograd on, each beside the replay `measure` made: every request agrees in size and
    order. They differed once at the first empty tensor of the model's cache (the GPU asks
    for no block, the check counted one of 512 B)."""
    import pickle

    path = ROOT / "runs" / "20261207T050000Z-user-code-blind" / "h100" / f"{point}.pickle"
    history = pickle.loads(path.read_bytes())
    found = history_check.check(history["snapshot"]["device_traces"][0], history["replay"])
    assert found["agrees"] is True, found["first_difference"]
    assert found["requests"]["gpu"] == found["requests"]["replay"] > 400


@pytest.mark.parametrize(("flags", "context"), [
    (["--history-stacks"], {"context": "alloc", "stacks": "all"}),
    ([], {"context": None}),
])  # fmt: skip
def test_measure_history_stacks_records_each_blocks_stack(tmp_path, monkeypatch, flags, context):
    """`measure --history-stacks` asks the allocator for each block's C++ and Python stack
    (the options the H100's frames above were recorded with); without it, no stack."""
    import runfixtures

    asked = []
    monkeypatch.setattr(
        tp.torch_private, "record_memory_history", lambda torch, **options: asked.append(options)
    )
    monkeypatch.setattr(tp.torch_private, "stop_memory_history", lambda torch: None)
    monkeypatch.setattr(tp.torch_private, "memory_snapshot", lambda torch: None)

    class Recording(type(runfixtures.host_gpu())):
        def history(self, torch, on):  # the real Gpu's, on the CPU stand-in's allocator
            return own_model.Gpu.history(self, torch, on)

    code = runfixtures.own_model_run(tmp_path, [*runfixtures.RESNET, *flags], gpu=Recording())
    assert code == 0
    assert asked == [{"enabled": "all", "max_entries": tp.HISTORY_ENTRIES,
                      "clear_history": True, **context}]  # fmt: skip
