"""The measure chain end to end: on CPU with a real torch up to where it must stop (the
measurement, exit 2, nothing appended); on a GPU (marked `gpu`) all the way to the log.
Run folders go to pytest tmp dirs through --runs-dir or ITERAGPU_RUNS_DIR, never to runs/."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import runfixtures
from conftest import ROOT, call_main, cuda_available, run_script

from pipeline.artefacts import validate
from pipeline.core import run_folders
from pipeline.measuring import launcher
from pipeline.stages import chain

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_NOX = importlib.util.find_spec("nox") is not None
REGISTRY = validate.load_registry()
needs_cpu_torch = pytest.mark.skipif(
    not HAS_TORCH or cuda_available(), reason="needs a torch that sees no GPU"
)
needs_nox = pytest.mark.skipif(not HAS_NOX, reason="nox is not installed here")


def nox(*args: str, runs_dir=None) -> subprocess.CompletedProcess:
    """nox with this Python as the GPU Python; its output and the stages' in .stdout (nox
    passes a command's stderr through on its stdout). This Python is named through a
    launcher outside .nox/: the noxfile refuses interpreters nox built, and the tests run in
    one."""
    with tempfile.TemporaryDirectory() as folder:
        python = Path(folder) / "python3"
        python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        python.chmod(0o755)
        env = {**os.environ, "ITERAGPU_PYTHON": str(python)}
        if runs_dir is not None:
            env["ITERAGPU_RUNS_DIR"] = str(runs_dir)
        command = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args]
        return subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=300,
        )


def folders(runs_dir) -> list:
    return sorted(p for p in runs_dir.iterdir() if p.is_dir())


# ------------------------------------------------------------------ on CPU


@needs_cpu_torch
@needs_nox
def test_the_chain_stops_at_the_measurement_without_a_gpu(tmp_path):
    """nox -s measure, for real: environment.json is written and kept (it says why), the
    measurement refuses with exit 2, and the log already there keeps its bytes."""
    runs_dir = tmp_path / "runs"
    earlier = runfixtures.make_run(runs_dir, 1)
    assert run_script("record.py", str(earlier)).returncode == 0
    log = runs_dir / run_folders.LOG_NAME
    before = log.read_bytes()
    result = nox("-s", "measure", "--", "--device", "cuda:0", runs_dir=runs_dir)
    assert result.returncode == 2, result.stdout
    assert "mesure_memoire.py: error: no GPU is visible to PyTorch" in result.stdout
    assert "chain.py: measure exited 2: nothing recorded;" in result.stdout
    [kept] = [folder for folder in folders(runs_dir) if folder != earlier]
    assert run_folders.RUN_ID.fullmatch(kept.name)
    assert sorted(p.name for p in kept.iterdir()) == ["environment.json"]
    environment = json.loads((kept / "environment.json").read_bytes())
    assert environment["environment"]["gpu"]["available"] is False
    assert environment["environment"]["python"]["version"] == ".".join(
        map(str, sys.version_info[:3])
    )
    assert validate.validate_json((kept / "environment.json").read_bytes(), REGISTRY) == []
    assert log.read_bytes() == before


@needs_cpu_torch
def test_one_fresh_chain_per_gpu_side_by_side(tmp_path, monkeypatch):
    """--device all with two GPUs pretended: two real child chains, cuda:0 and cuda:1, each
    with its own folder; both stop at the measurement here, and the worst code comes back."""
    monkeypatch.setattr(chain, "visible_gpus", lambda runner: 2)
    code = chain.main(["--device", "all", "--runs-dir", str(tmp_path), "--width", "32"])
    assert code == 2
    made = folders(tmp_path)
    assert len(made) == 2
    devices = sorted(
        json.loads((folder / "environment.json").read_bytes())["environment"]["requested_device"]
        for folder in made
    )
    assert devices == ["cuda:0", "cuda:1"]
    assert not (tmp_path / run_folders.LOG_NAME).exists()


@needs_cpu_torch
def test_a_chain_after_a_device_all_one_still_measures_in_a_fresh_interpreter(
    tmp_path, monkeypatch
):
    """Each chain owns its launcher: none outlives the chain that made it, so a one-device
    chain run later in the same process is not handed the forking one."""
    monkeypatch.setattr(chain, "visible_gpus", lambda runner: 1)
    every, one = tmp_path / "all", tmp_path / "one"
    every.mkdir()
    one.mkdir()
    assert chain.main(["--device", "all", "--runs-dir", str(every)]) == 2
    assert chain.main(["--device", "cuda:0", "--runs-dir", str(one)]) == 2
    [forked], [fresh] = folders(every), folders(one)
    starts = [
        json.loads((folder / "environment.json").read_bytes())["environment"]["process_start"]
        for folder in (forked, fresh)
    ]
    assert starts == [launcher.FORKED, "fresh interpreter"]


@needs_cpu_torch
def test_device_all_without_a_gpu_is_one_line_and_creates_nothing(tmp_path):
    result = run_script("chain.py", "--device", "all", "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == "chain.py: error: --device all: no GPU is visible to PyTorch\n"
    assert list(tmp_path.iterdir()) == []


def replay_h200(monkeypatch, measurement: str, code: int) -> None:
    """The GPU steps replaced by the real H200 outputs they gave (exit codes included)."""

    def run_steps(runner, commands: list[list[str]], script: str) -> list[int]:
        assert script == "mesure_memoire.py"  # the seed network's chain: the kit script
        for _command, *argv in commands:
            environment = argv[argv.index("--environment-output") + 1]
            shutil.copyfile(runfixtures.H200 / "env.json", environment)
            output = argv[argv.index("--output") + 1]
            shutil.copyfile(runfixtures.H200 / f"{measurement}.json", output)
        return [code] * len(commands)

    monkeypatch.setattr(chain, "run_steps", run_steps)


@pytest.mark.parametrize(("measurement", "code"), [("small", 0), ("oom", 3)])
def test_after_the_measurement_the_chain_validates_and_records(
    tmp_path, monkeypatch, measurement, code
):
    replay_h200(monkeypatch, measurement, code)
    assert chain.main(["--device", "cuda:0", "--runs-dir", str(tmp_path)]) == code
    [folder] = folders(tmp_path)
    parsed, problems = validate.parse_log(
        (tmp_path / run_folders.LOG_NAME).read_bytes(), validate.kit_header()
    )
    assert problems == []
    [(_, row)] = parsed
    assert row["run_id"] == folder.name
    assert row["status"] == ("completed" if code == 0 else "out_of_memory")


def test_an_invalid_measurement_stops_the_chain_with_exit_1_and_keeps_the_files(
    tmp_path, monkeypatch
):
    replay_h200(monkeypatch, "env", 0)  # an environment record where the measurement should be
    assert chain.main(["--device", "cuda:0", "--runs-dir", str(tmp_path)]) == 1
    [folder] = folders(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["environment.json", "measurement.json"]
    assert not (tmp_path / run_folders.LOG_NAME).exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "cuda:0", "--batch", "0"], "argument --batch: expected a positive integer"),
        (["--device", "cuda:0", "--dtype", "float64"], "argument --dtype: invalid choice"),
        (["--device", "cuda:0", "--output", "x.json"], "the chain names its outputs"),
        (["--device", "cpu"], "argument --device: expected a GPU device"),
        (["--device", "cuda:0", "--colour", "red"], "unrecognized arguments: --colour red"),
        ([], "the following arguments are required: --device"),
    ],
    ids=["batch", "dtype", "output", "cpu", "unknown", "no-device"],
)
def test_bad_input_stops_before_a_run_folder_exists(tmp_path, argv, message):
    result = run_script("chain.py", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_missing_runs_directory_is_refused(tmp_path):
    result = run_script("chain.py", "--device", "cuda:0", "--runs-dir", str(tmp_path / "no"))
    assert result.returncode == 2
    assert result.stderr == f"chain.py: error: {tmp_path / 'no'} is not an existing folder\n"


def test_a_run_folder_is_never_reused(tmp_path, monkeypatch):
    taken = tmp_path / runfixtures.run_id(1)
    taken.mkdir()
    (taken / "measurement.json").write_bytes(b"evidence")
    ids = iter([taken.name, taken.name, runfixtures.run_id(2)])
    monkeypatch.setattr(run_folders, "new_run_id", lambda: next(ids))
    assert run_folders.new_run_folder(tmp_path) == tmp_path / runfixtures.run_id(2)
    assert (taken / "measurement.json").read_bytes() == b"evidence"
    monkeypatch.setattr(run_folders, "new_run_id", lambda: taken.name)
    with pytest.raises(FileExistsError):
        run_folders.new_run_folder(tmp_path)


def test_run_ids_sort_by_time_and_match_the_row_schema():
    first, second = run_folders.new_run_id(), run_folders.new_run_id()
    assert run_folders.RUN_ID.fullmatch(first)
    assert first[:16] <= second[:16]
    schema = json.loads((ROOT / "schemas" / "results-row.schema.json").read_text())
    assert schema["properties"]["run_id"]["pattern"] == f"^{run_folders.RUN_ID.pattern}$"


@pytest.mark.parametrize(
    ("codes", "expected"),
    [([0, 0], 0), ([0, 3], 3), ([3, 2, 0], 2), ([1, 2], 2), ([137, 2], 137), ([3, 1], 1)],
)
def test_the_most_severe_exit_code_wins(codes, expected):
    assert chain.most_severe(codes) == expected


def test_the_stages_start_without_torch_or_yaml():
    """They run after every measurement: start-up stays small."""
    program = (
        "import sys\n"
        "from pipeline.stages import chain, record, merge\n"
        "from pipeline.artefacts import validate\n"
        "from pipeline.core import run_folders\n"
        "print(sorted({'torch', 'yaml'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.stdout == "[]\n", result.stderr


@needs_nox
def test_nox_lists_every_stage_with_its_one_line_description():
    result = nox("-l")
    assert result.returncode == 0
    for name in ("measure", "environment", "validate", "record", "cost", "estimate", "merge"):
        [line] = [ln for ln in result.stdout.splitlines() if ln.startswith(f"- {name} -> ")]
        assert len(line) > len(f"- {name} -> ") + 20


@needs_nox
def test_a_stage_exit_code_comes_out_of_nox(tmp_path):
    result = nox("-s", "record", "--", str(tmp_path / "not-a-run"))
    assert result.returncode == 2
    assert "record.py: error: " in result.stdout


@needs_nox
def test_the_benchmark_runs_its_rounds_in_a_scratch_runs_directory(tmp_path):
    """With a stand-in Python that succeeds at everything, the benchmark's own logic runs
    without a GPU: rounds, medians and both ratios; the real runs/ is untouched."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    before = sorted(run_folders.RUNS.iterdir())
    bench = str(ROOT / "tests" / "benchmarks" / "bench_measure_chain.py")
    env = {**os.environ, "ITERAGPU_PYTHON": str(fake)}
    result = subprocess.run(
        [sys.executable, bench, "--rounds", "2"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["round 1", "round 2"]
    assert lines[2].startswith("medians of 2 rounds on cuda:0")
    assert lines[3].startswith("a/c = ")
    assert lines[4].startswith("b/c = ")
    assert sorted(run_folders.RUNS.iterdir()) == before


@needs_cpu_torch
def test_the_benchmark_without_a_gpu_is_one_line_and_exit_2():
    bench = str(ROOT / "tests" / "benchmarks" / "bench_measure_chain.py")
    env = {**os.environ, "ITERAGPU_PYTHON": sys.executable}
    if not HAS_NOX:
        pytest.skip("the benchmark checks for nox first")
    result = subprocess.run([sys.executable, bench], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("bench_measure_chain.py: error: no usable GPU")


# ------------------------------------------------------------------ on a GPU


def the_row(runs_dir, folder) -> dict:
    parsed, problems = validate.parse_log(
        (runs_dir / run_folders.LOG_NAME).read_bytes(), validate.kit_header()
    )
    assert problems == []
    [row] = [row for _, row in parsed if row["run_id"] == folder.name]
    return row


@pytest.mark.gpu
def test_on_a_gpu_the_chain_records_one_row(tmp_path):
    result = run_script("chain.py", "--device", "cuda:0", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [folder] = folders(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["environment.json", "measurement.json"]
    assert run_script("validate.py", str(folder)).returncode == 0
    measurement = json.loads((folder / "measurement.json").read_bytes())
    row = the_row(tmp_path, folder)
    assert row["status"] == "completed"
    assert row["device"] == "cuda:0"
    assert row["gpu_name"] == measurement["environment"]["gpu"]["name"]
    assert (row["batch"], row["context"], row["width"], row["repeats"]) == ("1", "16", "64", "2")
    assert row["largest_peak_allocated_bytes"] == str(
        measurement["summary"]["largest_peak_allocated_bytes"]
    )
    # one measurement: a fresh interpreter, which starts the CUDA driver while torch loads
    assert measurement["environment"]["process_start"] == "fresh interpreter"


@pytest.mark.gpu
@pytest.mark.gpu_whole
def test_on_a_gpu_an_out_of_memory_run_is_recorded_and_exits_3(tmp_path):
    argv = ["--device", "cuda:0", "--context", "1000000000", "--runs-dir", str(tmp_path)]
    result = run_script("chain.py", *argv)
    assert result.returncode == 3, result.stderr
    [folder] = folders(tmp_path)
    row = the_row(tmp_path, folder)
    assert (row["status"], row["failed_phase"]) == ("out_of_memory", "inputs")


@pytest.mark.gpu
@needs_nox
def test_on_a_gpu_nox_measure_uses_the_runs_directory_it_is_given(tmp_path):
    before = sorted(run_folders.RUNS.iterdir())
    result = nox("-s", "measure", "--", "--device", "cuda:0", "--width", "128", runs_dir=tmp_path)
    assert result.returncode == 0, result.stdout
    [folder] = folders(tmp_path)
    assert the_row(tmp_path, folder)["width"] == "128"
    assert sorted(run_folders.RUNS.iterdir()) == before


@pytest.mark.gpu
def test_on_a_gpu_device_all_gives_one_row_per_gpu(tmp_path):
    count = chain.visible_gpus(launcher.Launcher())
    result = run_script("chain.py", "--device", "all", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    made = folders(tmp_path)
    assert len(made) == count
    rows = [the_row(tmp_path, folder) for folder in made]
    assert sorted(row["device"] for row in rows) == [f"cuda:{i}" for i in range(count)]
    for folder in made:
        environment = json.loads((folder / "environment.json").read_bytes())["environment"]
        assert environment["process_start"].startswith("forked from a server")
    assert run_script("validate.py", str(tmp_path / run_folders.LOG_NAME)).returncode == 0


# ------------------------------------------------------------------ the decoder workload


def replay_decoder(monkeypatch, memory_bytes=None):
    """decoder.py's measurement replaced by a synthesised one (each row as predicted), from
    the very flags the chain hands the decoder's measuring script."""
    scripts = []

    def run_steps(runner, commands, script="mesure_memoire.py"):
        scripts.append(script)
        for _command, *argv in commands:
            environment = Path(argv[argv.index("--environment-output") + 1])
            output = Path(argv[argv.index("--output") + 1])
            flags = argv[argv.index("cuda:0") + 1 : argv.index("--environment-output")]
            data = runfixtures.decoder_bytes(flags, memory_bytes)
            environment.write_bytes(runfixtures.environment_beside(data))
            output.write_bytes(data)
        return [3 if b'"out_of_memory"' in data else 0] * len(commands)

    monkeypatch.setattr(chain, "run_steps", run_steps)
    return scripts


@pytest.mark.parametrize(("memory_bytes", "code"), [(None, 0), (1_000_000, 3)])
def test_a_decoder_chain_runs_decoder_py_and_records_a_decoder_row(
    tmp_path, monkeypatch, memory_bytes, code
):
    scripts = replay_decoder(monkeypatch, memory_bytes)
    argv = ["--device", "cuda:0", "--workload", "decoder", *runfixtures.TINY_DECODER]
    assert chain.main([*argv, "--runs-dir", str(tmp_path)]) == code
    assert scripts == ["decoder.py"]
    [folder] = folders(tmp_path)
    assert not (tmp_path / run_folders.LOG_NAME).exists()  # the seed network's log: untouched
    data = (tmp_path / "resultats-decoder.csv").read_bytes()
    parsed, problems = validate.parse_log(data, validate.decoder_header())
    assert problems == []
    [(_, row)] = parsed
    assert row["run_id"] == folder.name
    assert (row["workload"], row["layers"], row["prompt"], row["new_tokens"]) == (
        "decoder",
        "2",
        "16",
        "4",
    )
    assert row["context"] == "20"  # the positions the cache holds: prompt + new tokens
    assert row["status"] == ("completed" if code == 0 else "out_of_memory")


def test_the_network_chain_still_runs_the_kit_script(tmp_path, monkeypatch):
    seen = []

    def run_steps(runner, commands, script="mesure_memoire.py"):
        seen.append(script)
        return [2]

    monkeypatch.setattr(chain, "run_steps", run_steps)
    assert chain.main(["--device", "cuda:0", "--runs-dir", str(tmp_path)]) == 2
    assert seen == ["mesure_memoire.py"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch", "8"], "give --preset NAME or all of the shape options: missing --layers"),
        (["--preset", "llama-3.1-8b", "--layers", "2"], "takes no shape options (--layers)"),
        (["--preset", "gpt-5"], "argument --preset: invalid choice: 'gpt-5'"),
        (["--preset", "llama-3.2-1b", "--new-tokens", "1"], "needs --new-tokens >= 2"),
        (["--preset", "llama-3.2-1b", "--context", "128"], "unrecognized arguments: --context"),
        (
            [
                *("--layers", "1", "--width", "64", "--heads", "3", "--kv-heads", "2"),
                *("--ffn", "8", "--vocab", "10", "--head-dim", "8"),
            ],
            "--heads 3 is not a multiple of --kv-heads 2",
        ),
        (["--preset", "llama-3.2-1b", "--output", "x.json"], "the chain names its outputs"),
    ],
    ids=["no-shape", "preset-and-shape", "preset", "new-tokens", "network-flag", "gqa", "output"],
)
def test_bad_decoder_flags_stop_before_a_run_folder_exists(tmp_path, flags, message):
    argv = ["--device", "cuda:0", "--workload", "decoder", *flags, "--runs-dir", str(tmp_path)]
    result = run_script("chain.py", *argv)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("chain.py: error: ")
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_decoder_flags_are_refused_for_the_network_workload(tmp_path):
    result = run_script(
        "chain.py", "--device", "cuda:0", "--prompt", "8", "--runs-dir", str(tmp_path)
    )
    assert result.returncode == 2
    assert "unrecognized arguments: --prompt 8" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
def test_on_a_gpu_a_decoder_chain_records_one_decoder_row(tmp_path):
    argv = ["--device", "cuda:0", "--workload", "decoder", *runfixtures.TINY_DECODER]
    result = run_script("chain.py", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [folder] = folders(tmp_path)
    assert run_script("validate.py", str(tmp_path)).returncode == 0
    measurement = json.loads((folder / "measurement.json").read_bytes())
    assert measurement["schema"] == "urn:iteragpu-lab:schema:decoder-measurement:v1"
    assert measurement["environment"]["process_start"] == "fresh interpreter"
    parsed, problems = validate.parse_log(
        (tmp_path / "resultats-decoder.csv").read_bytes(), validate.decoder_header()
    )
    assert problems == []
    [(_, row)] = parsed
    assert row["largest_peak_reserved_bytes"] == str(
        measurement["summary"]["largest_peak_reserved_bytes"]
    )


@pytest.mark.gpu
def test_on_a_gpu_an_8b_decoder_chain_at_batch_8_and_prompt_2048(tmp_path):
    """The issue's own command: the 8B-class preset, batch 8, prompt 2048, 128 new tokens."""
    argv = ["--device", "cuda:0", "--workload", "decoder", "--preset", "llama-3.1-8b"]
    argv += ["--batch", "8", "--prompt", "2048", "--new-tokens", "128", "--dtype", "bfloat16"]
    result = run_script("chain.py", *argv, "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert run_script("validate.py", str(tmp_path)).returncode == 0


# ------------------------------------------------------------------ your own model

RESNET_SPEC = "pipeline/workloads/resnet_cnn.py:resnet"
FAILING_WORKLOAD = (
    "import torch\nfrom own_model import Workload\n\n"
    "def broken(config):\n"
    "    model = torch.nn.Linear(4, 4).to(config.device)\n"
    "    def make_inputs():\n"
    "        raise KeyError('no inputs')\n"
    "    return Workload(model, make_inputs)\n"
)


def measure_own_model_on_the_cpu(monkeypatch):
    """own_model.py measure, in this process with the CPU standing in for the GPU, from the
    very arguments the chain hands the launcher."""
    from pipeline.measuring import own_model

    scripts = []

    def run_steps(runner, commands, script="mesure_memoire.py"):
        scripts.append(script)
        return [own_model.main(argv, gpu=runfixtures.host_gpu()) for argv in commands]

    monkeypatch.setattr(chain, "run_steps", run_steps)
    return scripts


@needs_cpu_torch
def test_an_own_model_chain_runs_own_model_py_and_records_an_own_model_row(tmp_path, monkeypatch):
    scripts = measure_own_model_on_the_cpu(monkeypatch)
    argv = ["--device", "cuda:0", "--workload", str(ROOT / RESNET_SPEC), "--batch", "2"]
    argv += ["--dim", "image=16", "--dim", "width=8", "--runs-dir", str(tmp_path)]
    assert chain.main(argv) == 0
    assert scripts == ["own_model.py"]
    [folder] = folders(tmp_path)
    measurement = json.loads((folder / "measurement.json").read_bytes())
    assert measurement["configuration"]["dims"]["width"] == 8
    assert measurement["configuration"]["batch"] == 2
    assert not (tmp_path / run_folders.LOG_NAME).exists()
    assert not (tmp_path / "resultats-decoder.csv").exists()
    parsed, problems = validate.parse_log(
        (tmp_path / "resultats-own.csv").read_bytes(), validate.own_model_header()
    )
    assert problems == []
    [(_, row)] = parsed
    assert (row["run_id"], row["workload"], row["workload_file"]) == (
        folder.name,
        "own",
        "resnet_cnn.py",
    )
    assert row["workload_dims"] == "image=16 width=8 stages=3 blocks=1 classes=10"


@needs_cpu_torch
def test_a_run_whose_workload_raised_keeps_its_file_exits_1_and_is_not_recorded(
    tmp_path, monkeypatch, capsys
):
    measure_own_model_on_the_cpu(monkeypatch)
    workload = tmp_path / "failing.py"
    workload.write_text(FAILING_WORKLOAD, encoding="utf-8")
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    argv = ["--device", "cuda:0", "--workload", f"{workload}:broken", "--runs-dir", str(runs_dir)]
    assert chain.main(argv) == 1
    [folder] = folders(runs_dir)
    assert sorted(p.name for p in runs_dir.iterdir()) == [folder.name]  # no log of any kind
    assert sorted(p.name for p in folder.iterdir()) == ["environment.json", "measurement.json"]
    measurement = json.loads((folder / "measurement.json").read_bytes())
    assert measurement["status"] == "failed"
    assert measurement["failure"]["exception_type"] == "KeyError"
    err = capsys.readouterr().err
    assert "KeyError: 'no inputs'" in err  # the user's traceback, shown
    assert f"chain.py: measure exited 1: nothing recorded; {folder} keeps what was written" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workload", "resnet"], "argument --workload: network, decoder or FILE.py:FUNCTION"),
        (["--workload", "missing.py:resnet"], "--workload missing.py: no such file"),
        (["--workload", "README.md:resnet"], "--workload README.md: not a Python file (.py)"),
        (
            ["--workload", "pipeline/workloads/resnet_cnn.py:vit"],
            "--workload pipeline/workloads/resnet_cnn.py: no function vit at its top level",
        ),
        (
            ["--workload", RESNET_SPEC, "--dim", "depth=3"],
            "--dim depth: resnet declares no such dimension (image, width, stages, blocks, "
            "classes)",
        ),
        (["--workload", RESNET_SPEC, "--dim", "width=8", "--dim", "width=9"], "--dim width: given"),
        (
            ["--workload", RESNET_SPEC, "--dim", "width=0"],
            "argument --dim: expected NAME=VALUE with VALUE a positive integer at most 16777216, "
            "got 'width=0'",
        ),
        (["--workload", RESNET_SPEC, "--context", "8"], "unrecognized arguments: --context 8"),
        (["--workload", RESNET_SPEC, "--output", "x.json"], "the chain names its outputs"),
    ],
    ids=["name", "missing", "not-python", "function", "dim", "twice", "zero", "flag", "output"],
)
def test_bad_own_model_flags_stop_before_a_run_folder_exists(tmp_path, flags, message):
    argv = ["--device", "cuda:0", *flags, "--runs-dir", str(tmp_path)]
    result = call_main(chain.main, *argv, cwd=ROOT)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("chain.py: error: ")
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_dimensions_a_source_does_not_state_plainly_are_left_to_the_measuring_process(
    tmp_path,
):
    from pipeline.measuring import own_model

    path = tmp_path / "model.py"
    path.write_text("def build(config, *, width=4, depth=2):\n    pass\n", encoding="utf-8")
    file = own_model.read_workload_file(path, "build")
    assert own_model.declared_dimensions(file) == {"width": 4, "depth": 2}
    path.write_text("SIZE = 4\n\ndef build(config, *, width=SIZE):\n    pass\n", encoding="utf-8")
    file = own_model.read_workload_file(path, "build")
    assert own_model.declared_dimensions(file) is None
    chain.check_measure_flags(["--dim", "SIZE=3"], f"{path}:build")  # not refused: the child says


@pytest.mark.gpu
def test_on_a_gpu_an_own_model_chain_records_one_own_model_row(tmp_path):
    argv = ["--device", "cuda:0", "--workload", RESNET_SPEC, "--dtype", "bfloat16"]
    result = run_script("chain.py", *argv, "--batch", "32", "--runs-dir", str(tmp_path), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    [folder] = folders(tmp_path)
    assert run_script("validate.py", str(tmp_path)).returncode == 0
    measurement = json.loads((folder / "measurement.json").read_bytes())
    assert measurement["schema"] == "urn:iteragpu-lab:schema:own-model-measurement:v1"
    assert measurement["environment"]["process_start"] == "fresh interpreter"
    parsed, problems = validate.parse_log(
        (tmp_path / "resultats-own.csv").read_bytes(), validate.own_model_header()
    )
    assert problems == []
    [(_, row)] = parsed
    assert row["largest_peak_reserved_bytes"] == str(
        measurement["summary"]["largest_peak_reserved_bytes"]
    )
    assert row["prediction_status"] == measurement["prediction"]["status"]


@needs_cpu_torch
@needs_nox
def test_nox_measure_hands_an_own_model_to_own_model_py(tmp_path):
    """nox -s measure, for real, without a GPU: the flags pass the chain's checks, own_model.py
    refuses in its own words, and, as for the seed network, the run folder keeps only its
    environment.json, which says why."""
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    argv = ["--device", "cuda:0", "--workload", RESNET_SPEC, "--dtype", "bfloat16"]
    result = nox("-s", "measure", "--", *argv, "--batch", "32", runs_dir=runs_dir)
    assert result.returncode == 2, result.stdout
    assert "own_model.py: error: no GPU is visible to PyTorch" in result.stdout
    assert "chain.py: measure exited 2: nothing recorded; " in result.stdout
    [kept] = folders(runs_dir)
    assert f"{kept} keeps what was written" in result.stdout
    assert sorted(p.name for p in kept.iterdir()) == ["environment.json"]
    environment = json.loads((kept / "environment.json").read_bytes())
    assert environment["environment"]["gpu"]["available"] is False


HF_GPT2 = "tests/data/hf-configs/gpt2.json"


@needs_cpu_torch
def test_a_hugging_face_config_goes_through_the_chain_to_an_own_model_row(tmp_path, monkeypatch):
    """`nox -s measure -- --hf-config config.json --task ...`: own_model.py measures it, and
    its row names the config by file name and SHA-256."""
    pytest.importorskip("transformers")
    scripts = measure_own_model_on_the_cpu(monkeypatch)
    config = json.loads((ROOT / HF_GPT2).read_bytes())
    small = tmp_path / "gpt2-small.json"  # two narrow layers: the CPU stands in for the GPU
    small.write_text(
        json.dumps(
            dict(
                config,
                n_layer=2,
                n_embd=64,
                n_head=4,
                vocab_size=512,
                bos_token_id=0,
                eos_token_id=0,
            )
        )
    )
    argv = ["--device", "cuda:0", "--hf-config", str(small), "--task", "training"]
    argv += ["--batch", "2", "--dim", "sequence=16", "--runs-dir", str(tmp_path)]
    assert chain.main(argv) == 0
    assert scripts == ["own_model.py"]
    [folder] = folders(tmp_path)
    measurement = json.loads((folder / "measurement.json").read_bytes())
    assert measurement["workload"]["file"] == "gpt2-small.json"
    parsed, problems = validate.parse_log(
        (tmp_path / "resultats-own.csv").read_bytes(), validate.own_model_header()
    )
    assert problems == []
    [(_, row)] = parsed
    assert (row["workload_file"], row["workload_sha256"]) == (
        "gpt2-small.json",
        hashlib.sha256(small.read_bytes()).hexdigest(),
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--hf-config", "missing.json"], "missing.json"),
        (["--hf-config", "README.md"], "README.md"),
        (["--hf-config", HF_GPT2, "--workload", "decoder"], "--hf-config names the model: drop"),
        (["--hf-config", HF_GPT2, "--task", "fly"], "argument --task: invalid choice: 'fly'"),
        (["--hf-config", HF_GPT2, "--dim", "depth=3"], "--dim depth"),
    ],
    ids=["missing", "not-json", "two-workloads", "task", "dim"],
)
def test_bad_hugging_face_flags_stop_before_a_run_folder_exists(tmp_path, flags, message):
    pytest.importorskip("transformers")
    argv = ["--device", "cuda:0", *flags, "--runs-dir", str(tmp_path)]
    result = run_script("chain.py", *argv, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("chain.py: error: ")
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("published", "head", "message"),
    [
        ("gpt2.json", "GPT2ForSequenceClassification", "--batch 2: GPT2ForSequenceClassification "
         "finds each row's last token by the config's pad_token_id, which it does not set"),
        ("t5-small.json", "T5ForSequenceClassification", "T5ForSequenceClassification is not "
         "modelled: it pools each row at its end-of-sequence tokens"),
    ],
)  # fmt: skip
def test_a_classifier_the_lab_cannot_run_stops_before_a_run_folder_exists(
    tmp_path, published, head, message
):
    pytest.importorskip("transformers")
    config = json.loads((ROOT / "tests" / "data" / "hf-configs" / published).read_text())
    path = tmp_path / "classifier.json"
    path.write_text(json.dumps({**config, "architectures": [head], "num_labels": 3}))
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = ["--device", "cuda:0", "--hf-config", str(path), "--task", "training", "--batch", "2"]
    result = call_main(chain.main, *argv, "--runs-dir", str(runs), cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert list(runs.iterdir()) == []
