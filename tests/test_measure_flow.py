"""measure_flow: the order every workload's measurement follows, and what each step refuses."""

from __future__ import annotations

import json
import types

import pytest

from pipeline.core import measure_flow
from pipeline.core.arguments import UsageError


def test_an_existing_output_is_refused_whichever_option_names_it(tmp_path):
    (tmp_path / "env.json").write_text("{}")
    named = {"--output": tmp_path / "m.json", "--environment-output": tmp_path / "env.json"}
    with pytest.raises(UsageError, match=r"env\.json"):
        measure_flow.refuse_outputs(named)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json"]


def test_two_options_naming_one_file_are_refused_by_their_names(tmp_path):
    named = {
        "--output": tmp_path / "m.json",
        "--environment-output": None,
        "--memory-history": tmp_path / "sub" / ".." / "m.json",
    }
    (tmp_path / "sub").mkdir()
    with pytest.raises(UsageError) as refused:
        measure_flow.refuse_outputs(named)
    assert str(refused.value) == "--memory-history and --output must be two files"


def test_options_not_given_and_distinct_files_pass(tmp_path):
    named = {"--output": tmp_path / "m.json", "--environment-output": None, "--x": tmp_path / "e"}
    assert measure_flow.refuse_outputs(named) is None


def start(monkeypatch, stopped: list) -> measure_flow.EnvironmentStart:
    monkeypatch.setattr(measure_flow, "start_driver_query", lambda: "query")
    monkeypatch.setattr(measure_flow, "start_cuda_driver", lambda device: f"driver {device}")
    monkeypatch.setattr(measure_flow, "stop_cuda_driver", stopped.append)
    return measure_flow.EnvironmentStart(3)


ARGS = types.SimpleNamespace(device=3, device_text="cuda:3", process_start="fresh")


def test_the_environment_is_collected_from_what_was_started_and_written_first(
    tmp_path, monkeypatch
):
    stopped: list = []
    started = start(monkeypatch, stopped)
    seen = []

    def collect(device, device_text, driver_query, process_start):
        seen.append((device, device_text, driver_query, process_start))
        return {"gpu": {"name": "G"}}

    out = tmp_path / "env.json"
    environment = started.record(ARGS, out, collect=collect)
    assert environment == {"gpu": {"name": "G"}}
    assert seen == [(3, "cuda:3", "query", "fresh")]
    assert stopped == ["driver 3"]
    assert json.loads(out.read_text())["environment"] == environment


def test_a_check_that_refuses_leaves_no_environment_file(tmp_path, monkeypatch):
    started = start(monkeypatch, [])

    def refuse(environment):
        raise UsageError("foreign calibration")

    out = tmp_path / "env.json"
    with pytest.raises(UsageError, match="foreign calibration"):
        started.record(ARGS, out, check=refuse, collect=lambda *a: {"gpu": {}})
    assert not out.exists()


@pytest.mark.parametrize(
    ("status", "stderr"),
    [
        ("completed", ""),
        ("failed", ""),
        ("out_of_memory", "out of memory in phase cold_step: CUDA out of memory. Tried 2 GiB\n"),
    ],
)
def test_the_measurement_is_written_and_said_in_one_line(tmp_path, capsys, status, stderr):
    document = {"status": status, "phases": [{}, {}]}
    if status == "out_of_memory":
        document["failure"] = {"phase": "cold_step", "error": "CUDA out of memory. Tried 2 GiB"}
    out = tmp_path / "m.json"
    measure_flow.write_measurement(out, document)
    assert json.loads(out.read_text()) == document
    assert capsys.readouterr() == (f"{out}: {status}, 2 phase rows\n", stderr)
