"""own_model.py and trace_prediction.py without a GPU: loading a user's workload and every way
it can be refused, the user's own exceptions, privacy, and the trace replayed through the
allocator model on hand-checked figures.

`measure` runs in-process with a CPU standing in for the GPU (runfixtures.host_gpu: the
protocol's rows with zero counters), so that everything after the GPU check is reached here;
the GPU tests run the real thing."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib.util
import io
import itertools
import json
import math
import sys

import pytest
import runfixtures
from conftest import PIPELINE, RUNS, run_script
from hypothesis import given, settings
from hypothesis import strategies as st

from kit import mesure_memoire
from pipeline.artefacts import validate
from pipeline.measuring import own_model
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace import recorder as recording
from pipeline.predicting.trace_prediction import PredictionStatus

torch = pytest.importorskip("torch")
REGISTRY = validate.load_registry()
KB = 512  # the allocator's block: every request is rounded up to a multiple of it
MIB = 2**20


def block(nbytes: int) -> int:
    return max(KB, -(-nbytes // KB) * KB)


# A named committed H200 environment: never "the newest runs/ folder", which a user's own
# run (even one refused for want of a GPU) would be.
COMMITTED_ENVIRONMENT = "20261202T125840Z-53bc76/environment.json"


def committed_environment() -> dict:
    """A committed H200 environment, with the allocator settings the model replays."""
    path = RUNS / COMMITTED_ENVIRONMENT
    environment = json.loads(path.read_text(encoding="utf-8"))["environment"]
    settings_ = dict(mesure_memoire.MODELLED_ALLOCATOR, roundup_power2_divisions={})
    environment["gpu"]["allocator_settings"] = settings_
    return environment


def test_the_committed_environment_ignores_a_newer_run_folder(tmp_path, monkeypatch):
    """A README-style `nox -s measure` without a GPU leaves runs/<newer id>/environment.json
    (no GPU in it): the tests' environment is still the named committed H200 one."""
    before = committed_environment()
    for name in ("20261202T125840Z-53bc76", "20991231T235959Z-ffffff"):  # committed, then newer
        (tmp_path / name).mkdir()
    (tmp_path / COMMITTED_ENVIRONMENT).write_bytes((RUNS / COMMITTED_ENVIRONMENT).read_bytes())
    refused = json.loads((RUNS / COMMITTED_ENVIRONMENT).read_bytes())
    refused["environment"]["gpu"] = {"available": False}
    (tmp_path / "20991231T235959Z-ffffff" / "environment.json").write_text(json.dumps(refused))
    monkeypatch.setitem(globals(), "RUNS", tmp_path)
    assert committed_environment() == before
    assert before["gpu"]["name"] == "NVIDIA H200"


def host_gpu():
    """The CPU standing in for the GPU (runfixtures.host_gpu), recording a committed H200
    environment with the allocator settings the model replays."""
    return runfixtures.host_gpu(committed_environment)


HEADER = "import torch\nfrom own_model import Workload\n\n"
LINEAR = HEADER + (
    "def linear(config, *, features=64, out=256):\n"
    "    model = torch.nn.Linear(features, out).to(device=config.device, dtype=config.dtype)\n"
    "    def make_inputs():\n"
    "        shape = (config.batch, features)\n"
    "        return torch.randn(shape, device=config.device, dtype=config.dtype)\n"
    "    return Workload(model, make_inputs)\n"
)
MLP_ADAMW = HEADER + (
    "def mlp(config, *, width=64):\n"
    "    layers = [torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 8)]\n"
    "    model = torch.nn.Sequential(*layers).to(config.device)\n"
    "    optimizer = torch.optim.AdamW(model.parameters())\n"
    "    def make_inputs():\n"
    "        return torch.randn(config.batch, 16, device=config.device)\n"
    "    def step(model, x):\n"
    "        return model(x).square().mean()\n"
    "    return Workload(model, make_inputs, step, optimizer)\n"
)


def workload(tmp_path, source: str, name: str = "model.py"):
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return path


def measure(tmp_path, spec: str, *extra: str):
    """own_model.py measure in this process (HostGpu); returns (exit code, output path)."""
    output = tmp_path / "m.json"
    argv = ["measure", "--workload", spec, "--device", "cuda:0", "--output", str(output)]
    argv += ["--environment-output", str(tmp_path / "env.json"), *extra]
    return own_model.main(argv, gpu=host_gpu()), output


def estimate(spec: str, *extra: str) -> list[str]:
    return ["estimate", "--workload", spec, *extra]


def estimate_json(capsys, spec: str, *extra: str) -> dict:
    assert own_model.main(estimate(spec, "--json", *extra)) == 0
    document = json.loads(capsys.readouterr().out)
    assert validate.validate_document(document, REGISTRY) == []
    return document


def rows_by_phase(document: dict) -> list[tuple]:
    return [
        (row["phase"], *(row[key] for key in mesure_memoire.COUNTER_KEYS))
        for row in document["prediction"]["phases"]
    ]


# ------------------------------------------------------------------ refused, nothing written


def refused(capsys, tmp_path, code: int, fragment: str) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("own_model.py: error: ")
    assert fragment in lines[0]
    assert not (tmp_path / "m.json").exists()
    assert not (tmp_path / "env.json").exists()


def test_a_missing_file_is_refused(capsys, tmp_path):
    code, _ = measure(tmp_path, f"{tmp_path / 'absent.py'}:build")
    refused(capsys, tmp_path, code, "absent.py: no such file")


def test_a_folder_named_as_the_file_is_refused(capsys, tmp_path):
    folder = tmp_path / "model.py"
    folder.mkdir()
    code, _ = measure(tmp_path, f"{folder}:build")
    refused(capsys, tmp_path, code, "--workload " + str(folder) + ": not a file")
    code = own_model.main(["estimate", "--hf-config", str(folder)])
    refused(capsys, tmp_path, code, "--hf-config " + str(folder) + ": not a file")


def test_a_file_that_is_not_python_by_name_is_refused(capsys, tmp_path):
    path = workload(tmp_path, LINEAR, "model.txt")
    code, _ = measure(tmp_path, f"{path}:linear")
    refused(capsys, tmp_path, code, "model.txt: not a Python file (.py)")


def test_a_syntax_error_is_refused_with_its_line(capsys, tmp_path):
    path = workload(tmp_path, "import torch\ndef build(config:\n    pass\n")
    code, _ = measure(tmp_path, f"{path}:build")
    refused(capsys, tmp_path, code, "model.py: not Python (")
    code, _ = measure(tmp_path, f"{path}:build")
    assert "at line 2)" in capsys.readouterr().err


def test_bytes_that_are_not_text_are_refused(capsys, tmp_path):
    path = tmp_path / "model.py"
    path.write_bytes(b"def build(config):\n    return '\xff\xfe'\n")
    code, _ = measure(tmp_path, f"{path}:build")
    refused(capsys, tmp_path, code, "model.py: not Python (not UTF-8 text)")


def test_a_missing_function_is_refused(capsys, tmp_path):
    path = workload(tmp_path, LINEAR)
    code, _ = measure(tmp_path, f"{path}:resnet")
    refused(capsys, tmp_path, code, "model.py: no function resnet at its top level")


def test_a_workload_argument_without_a_function_is_refused(capsys, tmp_path):
    path = workload(tmp_path, LINEAR)
    code, _ = measure(tmp_path, str(path))
    refused(capsys, tmp_path, code, "expected FILE.py:FUNCTION")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("    return {'model': None}\n", "linear returned dict, expected own_model.Workload"),
        (
            "    return Workload(torch.nn.Linear(4, 4), lambda: torch.ones(1))\n",
            "the model's parameter weight is on cpu, not meta: move the model with "
            ".to(config.device)",
        ),
        (
            "    model = torch.nn.Linear(4, 4).to(config.device)\n"
            "    model.register_buffer('scale', torch.ones(4))\n"
            "    return Workload(model, lambda: torch.ones(1, 4, device=config.device))\n",
            "the model's buffer scale is on cpu, not meta",
        ),
        (
            "    model = torch.nn.Linear(4, 4).to(config.device)\n"
            "    return Workload(model, lambda: torch.ones(2, 4))\n",
            "make_inputs() returned a tensor on cpu, not meta",
        ),
        (
            "    model = torch.nn.Linear(4, 4).to(config.device)\n"
            "    inputs = lambda: torch.ones(2, 4, device=config.device)\n"
            "    return Workload(model, inputs, step=lambda model, x: None)\n",
            "the step returned NoneType: a step must return what it computed",
        ),
        (
            "    model = torch.nn.Linear(4, 4).to(config.device)\n"
            "    inputs = lambda: torch.ones(2, 4, device=config.device)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    return Workload(model, inputs, optimizer=optimizer)\n",
            "a training workload (an optimizer given) needs step(model, inputs) returning the loss",
        ),
        (
            "    model = torch.nn.Linear(4, 4).to(config.device)\n"
            "    inputs = lambda: torch.ones(2, 4, device=config.device)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    return Workload(model, inputs, lambda m, x: m(x).detach().sum(), optimizer)\n",
            "must return the loss, one value that requires grad; it returned a tensor of 1 "
            "element(s), requires_grad=False",
        ),
        (
            "    model = torch.nn.Linear(4, 4).to(config.device)\n"
            "    return Workload(model, lambda: 5)\n",
            "make_inputs() returned int: expected a tensor, a tuple or list (the model's "
            "positional arguments) or a dict (its keyword arguments)",
        ),
    ],
    ids=["not-a-workload", "model-on-cpu", "buffer-on-cpu", "inputs-on-cpu", "step-returns-none",
         "optimizer-without-step", "loss-without-grad", "inputs-not-the-contracts"],
)  # fmt: skip
def test_a_broken_contract_is_refused(capsys, tmp_path, body, fragment):
    path = workload(tmp_path, HEADER + "def linear(config):\n" + body)
    code, _ = measure(tmp_path, f"{path}:linear")
    refused(capsys, tmp_path, code, fragment)
    assert own_model.main(estimate(f"{path}:linear")) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "10000000"], "10000002 steps (1 cold + --warmup 1 + --repeats 10000000), "
         "over the estimate budget of 64 (--estimate-budget)"),
        (["--warmup", "10", "--repeats", "10", "--estimate-budget", "20"], "21 steps (1 cold + "
         "--warmup 10 + --repeats 10), over the estimate budget of 20 (--estimate-budget)"),
    ],
    ids=["default", "given"],
)  # fmt: skip
def test_a_trace_over_the_estimate_budget_is_refused_up_front(capsys, tmp_path, argv, message):
    """Counted from the options before the workload is even read: ten million traced steps
    would run for days."""
    path = workload(tmp_path, LINEAR)
    code, _ = measure(tmp_path, f"{path}:linear", *argv)
    refused(capsys, tmp_path, code, f"the trace would run {message}")
    assert own_model.main(estimate(f"{path}:linear", *argv)) == 2
    assert capsys.readouterr().err == f"own_model.py: error: the trace would run {message}\n"


def test_the_estimate_budget_admits_every_committed_own_model_run():
    committed = 0
    for path in RUNS.glob("*/*.json"):
        document = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(document, dict) and document.get("schema") == own_model.SCHEMA:
            configuration = document["configuration"]
            steps = 1 + configuration["warmup"] + configuration["repeats"]
            assert steps <= own_model.ESTIMATE_BUDGET, path
            committed += 1
    assert committed > 0


@pytest.mark.parametrize(
    ("source", "phase"),
    [
        (LINEAR + "import sys\nsys.exit(0)\n", "import"),
        (LINEAR.replace("    model = ", "    import sys\n    sys.exit(0)\n    model = "),
         "model_load"),
        (LINEAR.replace("        shape = ", "        raise SystemExit(0)\n        shape = "),
         "inputs"),
    ],
    ids=["import", "model_load", "inputs"],
)  # fmt: skip
def test_a_workload_that_exits_is_refused_in_one_line(capsys, tmp_path, source, phase):
    """SystemExit from the user's code is that code failing: not exit 0 with nothing said."""
    path = workload(tmp_path, source)
    who = f"--workload {path}" if phase == "import" else "the workload linear"
    fragment = f"{who} called sys.exit(0) in {phase}: a workload returns, it never ends"
    code, _ = measure(tmp_path, f"{path}:linear")
    refused(capsys, tmp_path, code, fragment)
    assert own_model.main(estimate(f"{path}:linear")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert fragment in captured.err


def test_a_workload_that_exits_is_refused_by_the_script(tmp_path):
    path = workload(tmp_path, LINEAR.replace("    model = ", "    raise SystemExit\n    model = "))
    result = run_script("own_model.py", *estimate(f"{path}:linear"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "own_model.py: error: the workload linear called sys.exit(None) in model_load: "
        "a workload returns, it never ends the process\n"
    )


@pytest.mark.parametrize(
    ("signature", "argv", "fragment"),
    [
        ("config, *, width=64", ["--dim", "depth=2"], "--dim depth: linear declares no such "
         "dimension (width)"),
        ("config, *, width=64", ["--dim", "width=2", "--dim", "width=3"],
         "--dim width: given twice"),
        ("config, *, width", [], "width has no positive integer default"),
        ("config, *, scale=0.5", [], "scale has no positive integer default"),
        ("config, width=64", [], "linear must take the configuration as its only positional"),
        ("config, *, width=64", ["--dim", "width=0"], "expected NAME=VALUE with VALUE a positive"),
    ],
    ids=["unknown", "twice", "no-default", "not-integer", "positional", "zero"],
)  # fmt: skip
def test_dimensions_are_the_functions_keyword_only_integers(
    capsys, tmp_path, signature, argv, fragment
):
    path = workload(tmp_path, HEADER + f"def linear({signature}):\n    pass\n")
    code, _ = measure(tmp_path, f"{path}:linear", *argv)
    refused(capsys, tmp_path, code, fragment)


def test_the_command_line_script_loads_a_workload_that_imports_own_model(tmp_path):
    """The script is __main__: `from own_model import Workload` must be the same class."""
    path = workload(tmp_path, LINEAR)
    result = run_script("own_model.py", *estimate(f"{path}:linear", "--batch", "4"))
    assert result.returncode == 0, result.stderr
    assert "prediction: approximate" in result.stdout
    refused_run = run_script("own_model.py", "measure", "--workload", f"{path}:linear",
                             "--device", "cpu", "--output", str(tmp_path / "m.json"))  # fmt: skip
    assert refused_run.returncode == 2
    assert "expected a GPU device 'cuda' or 'cuda:N'" in refused_run.stderr
    assert not (tmp_path / "m.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_measure_without_a_gpu_is_refused_leaving_its_environment_as_the_kit_does(tmp_path):
    """mesure_memoire.py and decoder.py measure write the environment first, refused or not
    (the diagnostic of why): own_model.py does the same; the measurement is never written."""
    path = workload(tmp_path, LINEAR)
    result = run_script("own_model.py", "measure", "--workload", f"{path}:linear",
                        "--device", "cuda:0", "--output", str(tmp_path / "m.json"),
                        "--environment-output", str(tmp_path / "env.json"))  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        "own_model.py: error: no GPU is visible to PyTorch: measure needs one and never uses "
        "the CPU\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json", path.name]
    document = json.loads((tmp_path / "env.json").read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["environment"]["gpu"]["available"] is False
    kit = run_script("mesure_memoire.py", "measure", "--device", "cuda:0",
                     "--output", str(tmp_path / "k.json"),
                     "--environment-output", str(tmp_path / "k-env.json"))  # fmt: skip
    assert kit.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json", "k-env.json", path.name]


# ------------------------------------------------------------------ the user's own exceptions


def test_a_file_that_asks_for_cuda_by_name_is_told_to_use_config_device(capsys, tmp_path):
    """A trace without a GPU runs the file on config.device: a model moved to "cuda" by name
    fails there, and the last line says what to change."""
    path = workload(tmp_path, LINEAR.replace(".to(device=config.device,", '.to(device="cuda",'))
    code = own_model.main(estimate(f"{path}:linear"))
    last = capsys.readouterr().err.splitlines()[-1]
    assert code == 1  # the user's code failed, as in a measurement
    assert last.startswith("own_model.py: the workload raised RuntimeError in model_load"), last
    assert last.endswith("give its models and tensors config.device (and "
                         "device_map=config.device)"), last  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_an_exception_in_the_users_code_is_theirs_shown_and_recorded_as_failed(capsys, tmp_path):
    source = LINEAR.replace(
        "    def make_inputs():\n",
        "    def make_inputs():\n"
        "        if config.device.type != 'meta':\n"
        "            raise ValueError('boom from make_inputs in /home/someone/data')\n",
    )
    path = workload(tmp_path, source)
    code, output = measure(tmp_path, f"{path}:linear")
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback (most recent call last)" in err
    assert "ValueError: boom from make_inputs" in err
    assert "the workload raised ValueError in inputs (traceback above)" in err
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["status"] == "failed"
    assert document["failure"] == {
        "phase": "inputs",
        "repetition": None,
        "exception_type": "ValueError",
        "note": own_model.FAILED_NOTE,
    }
    assert [row["phase"] for row in document["phases"]] == ["model_load"]
    assert own_model.document_facts(document) == []
    assert "boom" not in output.read_text()
    assert "prediction" not in document


def test_an_exception_at_import_is_recorded_as_failed_in_phase_import(capsys, tmp_path):
    path = workload(tmp_path, LINEAR + "raise KeyError('no such dataset')\n")
    code, output = measure(tmp_path, f"{path}:linear")
    err = capsys.readouterr().err
    assert code == 1
    assert "KeyError: 'no such dataset'" in err
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert (document["status"], document["failure"]["phase"]) == ("failed", "import")
    assert document["failure"]["exception_type"] == "KeyError"
    assert document["phases"] == []
    assert own_model.document_facts(document) == []


def test_estimate_shows_the_users_exception_and_writes_nothing(capsys, tmp_path):
    path = workload(
        tmp_path, LINEAR.replace("    return Workload", "    1 / 0\n    return Workload")
    )
    assert own_model.main(estimate(f"{path}:linear")) == 1
    captured = capsys.readouterr()
    assert "ZeroDivisionError: division by zero" in captured.err
    assert "raised ZeroDivisionError in model_load (traceback above): not predicted" in captured.err
    assert captured.out == ""


def test_out_of_memory_in_a_step_is_an_observation_with_the_file_written(capsys, tmp_path):
    source = MLP_ADAMW.replace(
        "    def step(model, x):\n",
        "    def step(model, x):\n"
        "        if config.device.type != 'meta':\n"
        "            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB."
        " GPU 0 has a total capacity of 139.81 GiB of which 1.00 GiB is free. Process 1234')\n",
    )
    path = workload(tmp_path, source)
    code, output = measure(tmp_path, f"{path}:mlp")
    assert code == 3
    assert "out of memory in phase cold_step" in capsys.readouterr().err
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["status"] == "out_of_memory"
    counters = {key: 0 for key in document["phases"][-1] if key.endswith("_bytes")}
    assert document["failure"] == {  # the host's counters read zero
        "phase": "cold_step",
        "repetition": None,
        "error": "CUDA out of memory: tried to allocate 2.00 GiB",
        "counters_after_failure": counters,
    }
    assert len(counters) == 6
    assert "Process 1234" not in output.read_text()
    assert len(document["prediction"]["phases"]) == 7  # the whole plan, beside two rows
    assert [row["predicted"] is not None for row in document["phases"]] == [True, True]
    assert own_model.document_facts(document) == []


# ------------------------------------------------------------------ what the file records


def test_the_file_names_the_workload_by_name_and_sha256_never_by_path(capsys, tmp_path):
    folder = tmp_path / "private-folder-4711"
    folder.mkdir()
    path = workload(folder, MLP_ADAMW, "mymodel.py")
    code, output = measure(tmp_path, f"{path}:mlp", "--dim", "width=32", "--batch", "3")
    assert code == 0, capsys.readouterr().err
    text = output.read_text()
    assert "private-folder-4711" not in text
    assert str(tmp_path) not in text
    document = json.loads(text)
    assert validate.validate_document(document, REGISTRY) == []
    record = document["workload"]
    assert record["file"] == "mymodel.py"
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (record["function"], record["kind"], record["optimizer"]) == ("mlp", "training", "AdamW")
    assert record["dimensions"] == {"width": 32}
    assert record["declared_defaults"] == {"width": 64}
    parameters = 16 * 32 + 32 + 32 * 8 + 8
    assert record["parameters"] == {
        "count": parameters,
        "bytes": 4 * parameters,
        "by_dtype": {"float32": {"count": parameters, "bytes": 4 * parameters}},
    }
    assert record["inputs"] == [{"shape": [3, 16], "dtype": "float32", "bytes": 3 * 16 * 4}]
    planned = ["model_load", "inputs", "cold_step", "optimizer_state", "warmup", "warm_step"]
    planned.append("warm_step")
    assert record["phases_planned"] == planned
    assert record["phases_run"] == planned
    assert document["configuration"]["dims"] == {"width": 32}


def test_parameters_are_counted_by_dtype(capsys, tmp_path):
    path = workload(tmp_path, LINEAR)
    document = estimate_json(capsys, f"{path}:linear", "--dtype", "bfloat16")
    assert document["workload"]["parameters"] == {
        "count": 64 * 256 + 256,
        "bytes": 2 * (64 * 256 + 256),
        "by_dtype": {"bfloat16": {"count": 64 * 256 + 256, "bytes": 2 * (64 * 256 + 256)}},
    }
    assert document["workload"]["kind"] == "inference"


# ------------------------------------------------------------------ trace and replay


def test_a_linear_forward_replays_to_the_hand_counted_bytes(capsys, tmp_path):
    """Weight 256x64 and bias 256 float32 (65536 + 1024 bytes), input 4x64 (1024), output
    4x256 (4096), all in one 2 MiB small segment; each step's output freed before the next."""
    path = workload(tmp_path, LINEAR)
    document = estimate_json(capsys, f"{path}:linear", "--batch", "4")
    load, inputs, cold = 65536 + 1024, 65536 + 1024 + 1024, 65536 + 1024 + 1024 + 4096
    segment = 2 * MIB
    assert rows_by_phase(document) == [
        ("model_load", 0, 0, load, segment, load, segment),
        ("inputs", load, segment, inputs, segment, inputs, segment),
        ("cold_step", inputs, segment, cold, segment, cold, segment),
        ("warmup", inputs, segment, cold, segment, cold, segment),
        ("warm_step", inputs, segment, cold, segment, cold, segment),
        ("warm_step", inputs, segment, cold, segment, cold, segment),
    ]
    prediction = document["prediction"]
    assert prediction["status"] == "approximate"
    assert prediction["unknown"] == [{"op": "aten.linear", "calls": 4, "why": tp.UNCALIBRATED}]
    assert prediction["largest_peak_reserved_bytes"] == segment


def linear_calibration(tmp_path, template: list[tuple], workspaces_per_thread=True) -> str:
    """A measurement file whose calibration says what the Linear's call allocates."""
    path = workload(tmp_path, LINEAR)
    setting = own_model.Setting(
        own_model.read_workload_file(path, "linear"), "float32", 4, {}, {}, 1, 2, 0
    )
    own_model.load(setting)
    trace, _, failure = own_model.trace_workload(torch, setting, 0)
    assert failure is None
    (key,) = [k for k, s in trace.signatures.items() if s.name == "aten.linear.default"]
    calibration = tp.Calibration(templates={key: template})
    calibration.workspaces_per_thread = workspaces_per_thread
    folder = tmp_path / "run"  # a whole measurement, as --calibration reads only valid files
    folder.mkdir()
    flags = ["--workload", f"{path}:linear", "--dtype", "float32", "--batch", "4"]
    with contextlib.redirect_stdout(io.StringIO()):  # its line is not the estimate's
        assert runfixtures.own_model_run(folder, flags) == 0
    document = json.loads((folder / "measurement.json").read_text())
    document["calibration"] = calibration.to_json(trace)
    (tmp_path / "calibration.json").write_text(json.dumps(document))
    return f"{path}:linear"


def test_calibrated_library_blocks_make_the_linear_exact(capsys, tmp_path):
    """cuBLAS's 32 MiB workspace (a 32 MiB large segment) and cuBLASLt's 1 MiB (in the small
    segment, which still has room) are allocated after the first output and kept."""
    template = [("output", 0, 4096), ("persistent", 32 * MIB), ("persistent", MIB)]
    spec = linear_calibration(tmp_path, template)
    document = estimate_json(
        capsys, spec, "--batch", "4", "--calibration", str(tmp_path / "calibration.json")
    )
    kept, inputs = 32 * MIB + MIB, 65536 + 1024 + 1024
    reserved = 2 * MIB + 32 * MIB
    cold, warm = rows_by_phase(document)[2:4]
    assert cold == ("cold_step", inputs, 2 * MIB, inputs + kept + 4096, reserved,
                    inputs + kept + 4096, reserved)  # fmt: skip
    assert warm == ("warmup", inputs + kept, reserved, inputs + kept + 4096, reserved,
                    inputs + kept + 4096, reserved)  # fmt: skip
    assert document["prediction"]["status"] == "exact"
    assert document["prediction"]["unknown"] == []
    assert document["prediction"]["calibration"].startswith("calibration.json (NVIDIA H200")


def test_a_calibrated_scratch_block_counts_in_the_peak_only(capsys, tmp_path):
    """A 3 MiB scratch block before the output: a 20 MiB large segment appears, the peak
    holds it, the end values do not."""
    template = [("internal", 0, 3 * MIB), ("output", 0, 4096), ("free", 0)]
    spec = linear_calibration(tmp_path, template)
    document = estimate_json(
        capsys, spec, "--batch", "4", "--calibration", str(tmp_path / "calibration.json")
    )
    inputs = 65536 + 1024 + 1024
    cold = rows_by_phase(document)[2]
    large = 20 * MIB
    assert cold == ("cold_step", inputs, 2 * MIB, inputs + 4096, 2 * MIB + large,
                    inputs + 4096 + 3 * MIB, 2 * MIB + large)  # fmt: skip


def test_each_intermediate_is_freed_before_the_next_allocation(capsys, tmp_path):
    """Three ReLUs in a row on a 64 KiB input: the first output dies as the third is made,
    so the peak holds the input and two outputs, not three."""
    source = HEADER + (
        "def chain(config):\n"
        "    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU(), torch.nn.ReLU())\n"
        "    return Workload(model, lambda: torch.randn(16384, device=config.device))\n"
    )
    path = workload(tmp_path, source)
    document = estimate_json(capsys, f"{path}:chain", "--repeats", "1")
    cold = document["prediction"]["phases"][2]
    assert cold["phase"] == "cold_step"
    assert cold["allocated_bytes"] == 2 * 65536
    assert cold["peak_allocated_bytes"] == 3 * 65536
    assert document["prediction"]["status"] == "exact"  # relu allocates its output only


def test_a_training_step_splits_off_the_optimizers_first_step(capsys, tmp_path):
    """cold_step: forward and backward, ending with the gradients and the loss; then
    optimizer_state: AdamW's two moments per parameter, and nothing else kept."""
    path = workload(tmp_path, MLP_ADAMW)
    document = estimate_json(capsys, f"{path}:mlp", "--batch", "4", "--repeats", "1")
    assert own_model.document_facts(document) == []
    rows = document["prediction"]["phases"]
    assert [row["phase"] for row in rows] == [
        "model_load", "inputs", "cold_step", "optimizer_state", "warmup", "warm_step",
    ]  # fmt: skip
    parameters = sum(block(4 * n) for n in (16 * 64, 64, 64 * 8, 8))  # 7168
    load, inputs, cold, state = rows[:4]
    assert load["allocated_bytes"] == parameters
    assert inputs["allocated_bytes"] - inputs["baseline_allocated_bytes"] == block(4 * 16 * 4)
    assert cold["allocated_bytes"] - cold["baseline_allocated_bytes"] == parameters + KB
    assert state["baseline_allocated_bytes"] == cold["allocated_bytes"] - KB  # the loss went
    assert state["allocated_bytes"] - state["baseline_allocated_bytes"] == 2 * parameters
    assert document["workload"]["kind"] == "training"


def test_the_trace_follows_storages_as_a_real_run_does(tmp_path):
    """The fake-tensor trace and a real run on the CPU, recorded the same way, allocate and
    free the same storages in the same order (frees between two allocations as a set)."""

    def protocol(device: str):
        def drive(phase):
            def load():
                layers = [torch.nn.Linear(16, 64, device=device), torch.nn.ReLU()]
                model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 8, device=device))
                return model, torch.optim.SGD(model.parameters(), 0.1, 0.9, foreach=True)

            _, (model, optimizer) = phase("model_load", load)
            _, x = phase("inputs", lambda: torch.randn(4, 16, device=device))

            def step(first: bool):
                def run():
                    if not first:
                        optimizer.zero_grad()
                    loss = model(x).square().mean()
                    loss.backward()
                    if not first:
                        optimizer.step()
                    return loss

                return run

            phase("cold_step", step(True))
            phase("optimizer_state", optimizer.step)
            phase("warmup", step(False))
            phase("warm_step", step(False))

        return drive

    def sequence(trace) -> list:
        out, frees = [], []
        for event in trace.events:
            if event[0] == "free":
                frees.append(event[1])
                continue
            if frees:
                out.append(("free", tuple(sorted(frees))))
                frees = []
            if event[0] == "op":
                out += [("alloc", sid, n, event[1].name) for _, sid, n in event[1].outputs]
            else:
                out.append(event)
        return out

    fake = tp.run_trace(torch, "meta", protocol("meta"))
    real = tp.run_trace(torch, "cpu", protocol("cpu"), fake=False)
    assert fake.stopped is None
    assert sum(1 for e in sequence(fake) if e[0] == "alloc") > 40
    assert sequence(fake) == sequence(real)


def test_moving_parameters_on_the_device_frees_each_old_one_at_once():
    """nn.Module.to(dtype) on the device: each float32 parameter is freed as soon as its
    bfloat16 copy exists (as `.data =` does), so the peak holds one parameter twice only."""

    def drive(phase):
        def load():
            model = torch.nn.Linear(64, 256, device="meta")
            return model.to(torch.bfloat16)

        phase("model_load", load)

    trace = tp.run_trace(torch, "meta", drive)
    (row,) = tp.predict(trace).rows
    assert row["allocated_bytes"] == 2 * 64 * 256 + 512
    assert row["peak_allocated_bytes"] == 4 * 64 * 256 + 1024 + 2 * 64 * 256


DECODER_DIMS = {"vocab": 128, "context": 32, "width": 64, "layers": 2, "heads": 4, "kv_heads": 2}


def decoder_example(device: str):
    """The decoder example's model and inputs, built on `device`."""
    path = PIPELINE / "workloads" / "decoder_training.py"
    spec = importlib.util.spec_from_file_location("decoder_training_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = own_model.Configuration(torch.device(device), torch.float32, 2, 0)
    workload = module.decoder_adamw(config, **DECODER_DIMS, ffn=96)
    return workload, workload.make_inputs()


def test_calls_a_real_run_makes_in_place_take_their_first_arguments_block():
    """While a dispatch mode is active PyTorch counts every tensor as a subclass and adds out
    of place where a real run adds in place: the autograd engine summing a tensor's
    gradients (unless the first one is a view, which holds its base's storage too), the math
    attention adding its mask. The trace records each add as the real run makes it. The
    oracle is PyTorch's profiler on a real CPU run, which names aten::add_ or aten::add and
    changes nothing (no dispatch mode)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    workload, inputs = decoder_example("cpu")
    cpu = [torch.profiler.ProfilerActivity.CPU]
    profile = torch.profiler.profile(activities=cpu, record_shapes=True)
    with sdpa_kernel(SDPBackend.MATH), profile as run:
        workload.step(workload.model, inputs).backward()
    events = sorted(
        (e for e in run.events() if e.name in ("aten::add", "aten::add_")),
        key=lambda e: e.time_range.start,
    )
    real = [(e.name, tuple(e.input_shapes[0])) for e in events]

    def drive(phase):
        def step():
            workload, inputs = decoder_example("meta")
            workload.step(workload.model, inputs).backward()

        phase("cold_step", step)

    trace = tp.run_trace(torch, "meta", drive)
    adds = [e[1] for e in trace.events if e[0] == "op" and e[1].name == "aten.add.Tensor"]
    traced = [
        ("aten::add_" if call.reuses is not None else "aten::add",
         trace.signatures[call.signature].leaves[0][2])
        for call in adds
    ]  # fmt: skip
    assert traced == real
    in_place = sum(name == "aten::add_" for name, _ in real)
    attention = (2, DECODER_DIMS["heads"], DECODER_DIMS["context"], DECODER_DIMS["context"])
    assert ("aten::add_", attention) in real  # the mask, once per layer
    assert in_place > DECODER_DIMS["layers"]  # gradients summed in place, too
    assert len(real) > in_place  # and out of place


@pytest.mark.parametrize(("create_graph", "expected"), [(False, "aten::add_"), (True, "aten::add")])
def test_a_gradient_sum_is_in_place_unless_the_gradients_own_graph_is_kept(create_graph, expected):
    """With create_graph the engine keeps grad mode on and sums out of place, as a real run
    on the CPU shows."""

    def gradient(device: str):
        x = torch.ones(64, 64, device=device, requires_grad=True)
        return torch.autograd.grad((x * x.sin()).sum(), x, create_graph=create_graph)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as run:
        gradient("cpu")
    real = [e.name for e in run.events() if e.name in ("aten::add", "aten::add_")]
    trace = tp.run_trace(torch, "meta", lambda phase: phase("cold_step", lambda: gradient("meta")))
    adds = [e[1] for e in trace.events if e[0] == "op" and e[1].name == "aten.add.Tensor"]
    assert real == [expected]
    assert ["aten::add_" if call.reuses is not None else "aten::add" for call in adds] == real


def backward_of(forward, profiled: bool = False):
    """run(device): the forward, then the backward; with `profiled`, the backward only under
    the profiler, which run returns."""

    def run(device: str):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(8, 8, generator=generator).to(device).requires_grad_()
        loss = forward(x, device).sum()
        if not profiled:
            return loss.backward()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as run:
            loss.backward()
        return run

    return run


def index(device: str):
    return torch.arange(3, device=device) % 2 * 2  # 0, 2, 0: a repeat, too


IN_PLACE_CASES = {
    "index": (lambda x, d: x[index(d)], "index_put", "_index_put_impl_"),
    "gather": (
        lambda x, d: x.gather(1, torch.zeros(8, 2, dtype=torch.long, device=d)),
        "scatter_add",
        "scatter_add_",
    ),
    "topk": (lambda x, d: x.topk(2, dim=1).values, "scatter", "scatter_"),
    "index_select": (
        lambda x, d: x.index_select(0, index(d)),
        "index_add",
        "index_add_",
    ),
    "take": (lambda x, d: x.take(index(d)), "put", "put_"),
    "clamp": (
        lambda x, d: x.clamp(torch.zeros(8, device=d), torch.ones(8, device=d)),
        "logical_and",
        "logical_and_",
    ),
    "bce_with_logits": (
        lambda x, d: torch.nn.functional.binary_cross_entropy_with_logits(
            x, torch.full((8, 8), 0.5, device=d)
        ),
        "mul",
        "mul_",
    ),
}


@pytest.mark.parametrize("case", sorted(IN_PLACE_CASES))
def test_backward_formulas_that_write_in_place_in_a_real_run_do_so_in_the_trace(case):
    """Indexing's backwards write the gradient into zeros, clamp's and BCE's combine masks
    and factors in place: in a real run (the profiler's names) and in the trace alike."""
    forward, traced_op, real_op = IN_PLACE_CASES[case]
    run = backward_of(forward, profiled=True)("cpu")
    real = sum(e.name == f"aten::{real_op}" for e in run.events())
    trace = tp.run_trace(
        torch, "meta", lambda phase: phase("cold_step", lambda: backward_of(forward)("meta"))
    )
    reused = [e[1].name for e in trace.events if e[0] == "op" and e[1].reuses is not None]
    assert real >= 1
    assert sum(name.split(".")[1] == traced_op for name in reused) == real


def test_a_backward_that_takes_another_way_in_a_real_run_is_named():
    """prod's backward looks for zeros in the input on real tensors; the trace cannot."""
    prod_backward = backward_of(lambda x, d: x.prod(1))
    trace = tp.run_trace(
        torch, "meta", lambda phase: phase("cold_step", lambda: prod_backward("meta"))
    )
    assert "aten.cumprod in torch::autograd::generated::ProdBackward1::apply" in trace.notes


def test_without_cpp_frames_the_calls_made_in_place_are_named_as_unknown(monkeypatch):
    def drive(phase):
        def step():
            x = torch.ones(64, 64, device="meta", requires_grad=True)
            (x * x.sin()).sum().backward()  # x's two gradients are summed

        phase("cold_step", step)

    named = tp.run_trace(torch, "meta", drive)
    assert [e[1].reuses is not None for e in named.events if e[0] == "op" and
            e[1].name == "aten.add.Tensor"] == [True]  # fmt: skip
    note = {"op": "aten.add (in place)", "calls": 0, "why": tp.UNREADABLE_CALLER}
    assert note not in tp.predict(named).unknown
    monkeypatch.setattr(recording, "cpp_caller", lambda entry: None)
    unnamed = tp.run_trace(torch, "meta", drive)
    prediction = tp.predict(unnamed)
    assert prediction.status == PredictionStatus.APPROXIMATE
    assert note in prediction.unknown
    sizes = [
        collections.Counter(n for kind, n, _ in tp.predict(t).log if kind == "alloc")
        for t in (named, unnamed)
    ]
    assert sizes[1] - sizes[0] == {64 * 64 * 4: 1}  # the sum in a block of its own


def test_a_choice_between_blocks_of_one_size_in_two_segments_makes_it_approximate():
    """The allocator takes the lowest address among free blocks of one size, and which of two
    segments lies lower is the driver's. Here that choice decides whether a 22 MiB request
    fits a free 24 MiB block or needs a segment of its own: replayed with the second segment
    lower (as the central replay's model of the driver puts it: the 24 MiB segment needs a
    span of its own, below the first), 22 MiB more are reserved than with it higher (the
    plain order, one of the others compared), and the prediction says so."""
    trace = tp.Trace("meta", "cpu-only", torch.__version__)
    ids = itertools.count()

    def alloc(nbytes: int) -> int:
        sid = next(ids)
        call = tp.OpCall("aten.empty.memory_format", tp.CALLER, "s", ((0, sid, nbytes),))
        trace.events.append(("op", call))
        return sid

    def free(*sids: int) -> None:
        trace.events.extend(("free", sid) for sid in sids)

    trace.events.append(("start", "cold_step", None, 1))
    p, q = alloc(4 * MIB), alloc(16 * MIB)  # segment 1: 20 MiB, full
    free(alloc(24 * MIB))  # segment 2: 24 MiB, free
    r, s = alloc(4 * MIB), alloc(20 * MIB)  # segment 2 full
    free(p, r)  # one free 4 MiB block in each segment
    alloc(4 * MIB)  # takes the lower one
    free(q, s)
    alloc(22 * MIB)  # fits segment 2 if the 4 MiB went to segment 1
    trace.events.append(("end",))
    prediction = tp.predict(trace)
    (row,) = prediction.rows
    assert (row["reserved_bytes"], row["allocated_bytes"]) == (66 * MIB, 26 * MIB)
    spread = dict.fromkeys(mesure_memoire.COUNTER_KEYS, 0)
    spread.update(reserved_bytes=22 * MIB, peak_reserved_bytes=22 * MIB)
    assert prediction.address_orders == {"orders": 9, "largest_difference_bytes": spread}
    assert prediction.status == PredictionStatus.APPROXIMATE
    (unknown,) = prediction.unknown
    assert unknown["op"] == tp.ADDRESS_ORDER
    assert "move by up to 23,068,672 bytes (reserved, peak_reserved)" in unknown["why"]
    plain = tp.replay(trace, None, lambda n: n)[0][0]
    assert plain["reserved_bytes"] == 44 * MIB
    assert tp.replay(trace, None, lambda n: -n)[0] == tp.replay(trace, None)[0]  # central


def test_the_gpus_own_segment_order_is_read_from_the_allocators_history():
    events = [
        {"action": "segment_alloc", "addr": 300},
        {"action": "alloc", "addr": 300},
        {"action": "segment_alloc", "addr": 100},
        {"action": "free_completed", "addr": 300},
        {"action": "segment_alloc", "addr": 200},
    ]
    rank = tp.segment_ranks(events)
    assert [rank(n) for n in range(5)] == [2, 0, 1, 3, 4]  # segments it did not make: above


def test_a_shape_that_depends_on_values_is_not_predicted(capsys, tmp_path):
    source = LINEAR.replace(
        "    return Workload(model, make_inputs)",
        "    step = lambda model, x: model(x[x > 0].reshape(-1, features))\n"
        "    return Workload(model, make_inputs, step)",
    )
    path = workload(tmp_path, source)
    document = estimate_json(capsys, f"{path}:linear")
    prediction = document["prediction"]
    assert prediction["status"] == "not predicted"
    assert "the trace cannot follow the code at aten.nonzero.default" in prediction["reason"]
    assert prediction["phases"] == []
    assert own_model.main(estimate(f"{path}:linear")) == 0
    assert "prediction: not predicted" in capsys.readouterr().out


def test_attention_traced_without_a_gpu_says_the_gpu_chooses_another_kernel(capsys, tmp_path):
    source = HEADER + (
        "class Attention(torch.nn.Module):\n"
        "    def forward(self, q):\n"
        "        return torch.nn.functional.scaled_dot_product_attention(q, q, q)\n"
        "def attention(config):\n"
        "    shape = (config.batch, 2, 16, 8)\n"
        "    inputs = lambda: torch.randn(shape, device=config.device)\n"
        "    return Workload(Attention(), inputs)\n"
    )
    path = workload(tmp_path, source)
    document = estimate_json(capsys, f"{path}:attention")
    notes = [
        e for e in document["prediction"]["unknown"] if e["op"] == "scaled_dot_product_attention"
    ]
    assert notes == [{"op": "scaled_dot_product_attention", "calls": 0,
                      "why": tp.META_CHOICES["scaled_dot_product_attention"]}]  # fmt: skip
    assert document["prediction"]["status"] == "approximate"


# ------------------------------------------------------------------ calibration pieces


def test_a_probe_history_becomes_a_template():
    """The output is the last block allocated at its address; a scratch block freed earlier
    at the same address is scratch; a block still allocated at the end is kept."""
    events = [
        {"action": "alloc", "addr": 100, "size": 3000},
        {"action": "free_requested", "addr": 100, "size": 3000},
        {"action": "free_completed", "addr": 100, "size": 3000},
        {"action": "alloc", "addr": 100, "size": 4096},
        {"action": "segment_alloc", "addr": 9000, "size": 32 * MIB},
        {"action": "alloc", "addr": 9000, "size": 32 * MIB},
    ]
    assert tp.template_from_history(events, {100: 0}) == [
        ("internal", 0, 3000),
        ("free", 0),
        ("output", 0, 4096),
        ("persistent", 32 * MIB),
    ]
    assert tp.plain([("output", 0, 1), ("output", 1, 2)])
    assert not tp.plain([("output", 1, 2), ("output", 0, 1)])
    assert not tp.plain([("output", 0, 1), ("persistent", 2)])


def synthetic_trace(roles: list[str]) -> tp.Trace:
    """One phase; one 4 KiB output per call, each in its own thread role."""
    trace = tp.Trace(device="meta", build="cpu-only", torch_version="x")
    trace.signatures["s"] = tp.Signature("aten.mm.default", None, [], None, calls=len(roles))
    trace.events.append(("start", "cold_step", None, 1))
    for sid, role in enumerate(roles):
        trace.events.append(("op", tp.OpCall("aten.mm.default", role, "s", ((0, sid, 4096),))))
    trace.events.append(("end",))
    return trace


@pytest.mark.parametrize(("per_thread", "kept"), [(True, 2), (False, 1), (None, 2)])
def test_kept_library_blocks_are_one_set_per_thread_when_calibrated_so(per_thread, kept):
    calibration = tp.Calibration(templates={"s": [("output", 0, 4096), ("persistent", 32 * MIB)]})
    calibration.workspaces_per_thread = per_thread
    trace = synthetic_trace([tp.CALLER, tp.CALLER, tp.AUTOGRAD, tp.AUTOGRAD])
    prediction = tp.predict(trace, calibration)
    (row,) = prediction.rows
    assert row["allocated_bytes"] == 4 * 4096 + kept * 32 * MIB
    assert row["reserved_bytes"] == 2 * MIB + kept * 32 * MIB
    unknown = [entry["op"] for entry in prediction.unknown]
    assert unknown == (["autograd thread"] if per_thread is None else [])


def test_a_probe_whose_outputs_disagree_with_the_trace_makes_it_approximate():
    calibration = tp.Calibration(templates={"s": [("output", 0, 8192)]})
    prediction = tp.predict(synthetic_trace([tp.CALLER]), calibration)
    assert prediction.status == "approximate"
    assert prediction.unknown == [{
        "op": "aten.mm", "calls": 0,
        "why": "the trace and the GPU disagree on its outputs (output 0: traced 4096 B)",
    }]  # fmt: skip


@settings(max_examples=15)
@given(
    features=st.integers(1, 3000),
    out=st.integers(1, 3000),
    batch=st.integers(1, 700),
    dtype=st.sampled_from(["float32", "bfloat16"]),
)
def test_a_linear_of_any_shape_replays_its_blocks(tmp_path_factory, features, out, batch, dtype):
    """Whatever the shapes, the trace asks for the weight, the bias, the input and the output,
    in that order and of those sizes: the allocator model fed them by hand agrees."""
    size = mesure_memoire.DTYPE_BYTES[dtype]
    folder = tmp_path_factory.mktemp("linear")
    path = workload(folder, LINEAR)
    setting = own_model.Setting(
        own_model.read_workload_file(path, "linear"), dtype, batch, {}, {}, 1, 1, 0,
        [("features", features), ("out", out)],
    )  # fmt: skip
    own_model.load(setting)
    trace, _, _ = own_model.trace_workload(torch, setting, 0)
    rows = tp.predict(trace).rows
    by_hand = mesure_memoire.AllocatorModel()
    by_hand.malloc(out * features * size)
    by_hand.malloc(out * size)
    expected = [(by_hand.allocated, by_hand.reserved)]
    by_hand.malloc(batch * features * size)
    expected.append((by_hand.allocated, by_hand.reserved))
    by_hand.reset_peaks()
    by_hand.malloc(batch * out * size)
    expected.append((by_hand.allocated, by_hand.reserved))
    assert [(r["allocated_bytes"], r["reserved_bytes"]) for r in rows[:3]] == expected
    assert rows[2]["peak_allocated_bytes"] == by_hand.peak_allocated
    assert rows[0]["allocated_bytes"] >= block(out * features * size) + block(out * size)


# ------------------------------------------------------------------ the examples


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("resnet_cnn.py:resnet", "inference"),
        ("vit_encoder.py:vit", "inference"),
        ("decoder_training.py:decoder_adamw", "training"),
    ],
)
def test_each_example_traces_on_the_cpu_and_validates(capsys, spec, kind):
    from conftest import PIPELINE

    document = estimate_json(capsys, str(PIPELINE / "workloads" / spec), "--batch", "2")
    assert document["workload"]["kind"] == kind
    assert document["prediction"]["status"] == "approximate"  # no calibration, no GPU
    assert document["prediction"]["trace"]["device"] == "meta"
    assert len(document["prediction"]["phases"]) == len(document["workload"]["phases_planned"])


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal is POSIX")
def test_on_a_terminal_the_estimate_says_which_phase_it_traces_then_clears_the_line(tmp_path):
    from conftest import on_a_terminal

    path = workload(tmp_path, MLP_ADAMW)
    code, out, lines = on_a_terminal("own_model.py", "estimate", "--workload", f"{path}:mlp")
    assert code == 0
    assert [line.split("... ")[0] for line in lines] == [
        "own_model.py: tracing model_load", "own_model.py: tracing inputs",
        "own_model.py: tracing cold_step", "own_model.py: tracing optimizer_state",
        "own_model.py: tracing warmup", "own_model.py: tracing warm_step 1",
        "own_model.py: tracing warm_step 2", "own_model.py: predicting: replaying the trace",
    ]  # fmt: skip
    assert all(line.endswith(" s") for line in lines)
    assert out.startswith("peak reserved ")  # the answer, unchanged


# ------------------------------------------------------------------ facts for validate.py


def test_the_facts_of_a_written_file_hold_and_a_tampered_one_is_caught(capsys, tmp_path):
    path = workload(tmp_path, MLP_ADAMW)
    code, output = measure(tmp_path, f"{path}:mlp")
    assert code == 0, capsys.readouterr().err
    document = json.loads(output.read_text())
    assert own_model.document_facts(document) == []

    def tampered(change) -> list[str]:
        copy = json.loads(output.read_text())
        change(copy)
        return own_model.document_facts(copy)

    def claim_held(d):
        d["summary"]["prediction"]["held"] = True

    def drop_a_row(d):
        d["phases"].pop()
        d["workload"]["phases_run"].pop()

    def move_a_prediction(d):
        d["phases"][2]["predicted"]["peak_allocated_bytes"] += 512

    def peak_below_end(d):
        d["phases"][1]["peak_reserved_bytes"] = -1

    def number_the_load(d):
        d["phases"][0]["repetition"] = 1

    def two_warmup_passes(d):
        d["phases"][3]["passes"] = 2

    assert tampered(claim_held) == ["$.summary.prediction.held: True, the rows give None"]
    assert "$.phases: 6 rows, the plan has 7" in tampered(drop_a_row)
    assert tampered(move_a_prediction) == ["$.phases[2].predicted: not $.prediction.phases[2]"]
    assert any(
        e.startswith("$.phases[1]: peak_reserved_bytes -1 < baseline_reserved_bytes ")
        for e in tampered(peak_below_end)
    )
    assert tampered(number_the_load) == ["$.phases[0]: only warm_step rows carry a repetition"]
    assert tampered(two_warmup_passes) == ["$.phases[3].passes: 2, expected 1"]


def test_a_failing_calibration_leaves_the_measurement_standing(capsys, tmp_path):
    def broken_probe(torch, device, trace):
        raise RuntimeError("probe broke")

    gpu = host_gpu()
    gpu.probe = broken_probe

    path = workload(tmp_path, LINEAR)
    output = tmp_path / "m.json"
    argv = ["measure", "--workload", f"{path}:linear", "--device", "cuda:0"]
    assert own_model.main([*argv, "--output", str(output)], gpu=gpu) == 0
    assert "RuntimeError: probe broke" in capsys.readouterr().err
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert own_model.document_facts(document) == []
    assert document["status"] == "completed"
    assert document["prediction"]["status"] == "not predicted"
    assert document["prediction"]["reason"] == (
        "the calibration or the replay failed (RuntimeError): not predicted"
    )
    assert "calibration" not in document


@pytest.mark.parametrize(("batch", "why"), [(4, tp.UNCALIBRATED), (64, "sorts the indices")])
def test_scratch_that_depends_on_values_is_named_beyond_the_sorting_threshold(capsys, batch, why):
    """The decoder's 64 positions: 4 x 64 indices are below embedding backward's 3072, where
    it allocates its output only; 64 x 64 are above, where it sorts them."""
    from conftest import PIPELINE

    spec = str(PIPELINE / "workloads" / "decoder_training.py:decoder_adamw")
    document = estimate_json(capsys, spec, "--batch", str(batch), "--repeats", "1")
    unknown = {e["op"]: e for e in document["prediction"]["unknown"]}
    assert why in unknown["aten.embedding_dense_backward"]["why"]
    # its positions are expanded over the batch: the forward copies them on a GPU, which
    # this estimate has no calibration to work out (trace_prediction.by_source_template)
    assert unknown["aten.embedding"]["why"] == tp.UNCALIBRATED


def test_a_failing_trace_leaves_the_measurement_standing(capsys, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("tracer broke")

    monkeypatch.setattr(tp, "run_trace", broken)
    path = workload(tmp_path, LINEAR)
    code, output = measure(tmp_path, f"{path}:linear")
    assert code == 0
    assert "RuntimeError: tracer broke" in capsys.readouterr().err
    document = json.loads(output.read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["status"] == "completed"
    assert (
        document["prediction"]["reason"] == "the trace itself failed (RuntimeError): not predicted"
    )
    assert [row["predicted"] for row in document["phases"]] == [None] * 6


def test_validate_applies_the_own_model_facts(capsys, tmp_path):
    """`validate` checks an own-model file's facts, not its schema alone: a tampered file the
    schema accepts is invalid there too."""
    from pipeline.artefacts import validate

    path = workload(tmp_path, MLP_ADAMW)
    code, output = measure(tmp_path, f"{path}:mlp")
    assert code == 0, capsys.readouterr().err
    document = json.loads(output.read_text())
    registry = validate.load_registry()
    assert validate.validate_document(document, registry) == []
    document["summary"]["prediction"]["held"] = True
    assert validate.validate_document(document, registry) == [
        "$.summary.prediction.held: True, the rows give None"
    ]


def test_a_missing_calibration_is_named_in_plain_words(tmp_path):
    """Not Python's `[Errno 2] No such file or directory: '...'`."""
    missing = tmp_path / "absent.json"
    spec = f"{PIPELINE / 'workloads' / 'resnet_cnn.py'}:resnet"
    result = run_script(
        "own_model.py", "estimate", "--workload", spec, "--calibration", str(missing)
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"own_model.py: error: {missing}: no such file or directory\n"


def test_a_gpu_and_a_calibration_file_are_one_or_the_other(tmp_path):
    """`--gpu` brings its own calibration and that GPU's kernel choices; a measurement's
    calibration was made on some other GPU: together they would mix two GPUs, refused."""
    spec = f"{PIPELINE / 'workloads' / 'resnet_cnn.py'}:resnet"
    calibration = tmp_path / "measured.json"
    calibration.write_text("{}")
    result = run_script(
        "own_model.py", "estimate", "--workload", spec, "--gpu", "h200",
        "--calibration", str(calibration),
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "own_model.py: error: argument --calibration: not allowed with argument --gpu\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["measured.json"]


# ------------------------------------------------------------------ estimate's text, exit codes


def headline(out: str) -> list[str]:
    """The text's first two lines: the peak reserved in GiB or MiB, then why it is so."""
    return out.splitlines()[:2]


def test_the_estimates_text_starts_with_the_peak_reserved_its_bounds_and_the_gpu(capsys, tmp_path):
    """A person reads the text: the answer comes first, in GiB (MiB below 1 GiB), with the
    bounds an approximate prediction has (the lower rounded down, the upper up), the GPU it
    is for, and why it is approximate; the rows of bytes follow."""
    path = workload(tmp_path, MLP_ADAMW)
    spec = f"{path}:mlp"
    prediction = estimate_json(capsys, spec)["prediction"]
    assert prediction["status"] == "approximate"  # no calibration: cuBLAS's workspaces unknown
    assert own_model.main(estimate(spec)) == 0
    out = capsys.readouterr().out
    peak = prediction["largest_peak_reserved_bytes"]
    lower = max(row["peak_reserved_bytes"]["lower"] for row in prediction["bounds"]["phases"])
    upper = max(row["peak_reserved_bytes"]["upper"] for row in prediction["bounds"]["phases"])
    assert [entry["op"] for entry in prediction["unknown"]] == ["aten.addmm", "aten.mm"]
    assert headline(out) == [
        f"peak reserved {peak / MIB:.1f} MiB ({math.floor(lower / MIB * 10) / 10:.1f} MiB to "
        f"{math.ceil(upper / MIB * 10) / 10:.1f} MiB), approximate, for no GPU in particular "
        "(no calibration: --gpu h200 gives the H200's)",
        "approximate: the calibration does not cover aten.addmm, aten.mm; fit sizes the GPU by "
        "the upper bound",
    ]
    assert out.splitlines()[2] == (
        "predicted PyTorch allocator counters, bytes (baseline / end / peak)"
    )


def test_an_estimate_for_the_h200_says_so_and_that_it_is_exact(capsys, tmp_path):
    path = workload(tmp_path, LINEAR)
    assert own_model.main(estimate(f"{path}:linear", "--gpu", "h200")) == 0
    assert headline(capsys.readouterr().out) == [
        "peak reserved 34.0 MiB, exact, for the NVIDIA H200",
        "exact: every operator call is covered by the calibration; the GPU must show these bytes",
    ]


@pytest.mark.parametrize(
    ("nbytes", "shown"),
    [(36_000_000_000, "33.5 GiB"), (2**30, "1.0 GiB"), (35_651_584, "34.0 MiB"), (0, "0.0 MiB")],
)
def test_sizes_are_read_in_gib_or_mib(nbytes, shown):
    assert own_model.in_gib(nbytes) == shown


def test_an_exact_estimate_says_so_and_that_every_call_is_covered():
    document = {
        "prediction": {
            "status": "exact", "unknown": [], "largest_peak_reserved_bytes": 36_000_000_000,
            "phases": [], "trace": {"device": "meta", "torch": "2.13.0+cpu"},
            "calibration": "h200.json",
        }
    }  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        own_model.print_estimate(document, "the NVIDIA H200")
    assert headline(out.getvalue()) == [
        "peak reserved 33.5 GiB, exact, for the NVIDIA H200",
        "exact: every operator call is covered by the calibration; the GPU must show these bytes",
    ]


def test_a_failure_of_the_tools_own_trace_writes_the_document_and_exits_1(
    capsys, tmp_path, monkeypatch
):
    """Not the user's code: the tool's. The document says why, and the exit code is 1."""

    def broken(*args, **kwargs):
        raise RuntimeError("tracer broke")

    monkeypatch.setattr(tp, "run_trace", broken)
    path = workload(tmp_path, LINEAR)
    assert own_model.main(estimate(f"{path}:linear", "--json")) == 1
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert validate.validate_document(document, REGISTRY) == []
    assert document["prediction"]["status"] == "not predicted"
    assert document["prediction"]["reason"] == (
        "the trace itself failed (RuntimeError): not predicted"
    )
    assert "RuntimeError: tracer broke" in captured.err
    assert captured.err.splitlines()[-1] == (
        "own_model.py: the trace itself failed (RuntimeError), the tool's own failure, not "
        "your model's (traceback above): not predicted"
    )
    assert own_model.main(estimate(f"{path}:linear")) == 1
    assert headline(capsys.readouterr().out) == [
        "peak reserved: not predicted",
        "not predicted: the trace itself failed (RuntimeError): not predicted",
    ]
