"""The launcher's children are fresh processes, and its parent never touches torch or CUDA."""

from __future__ import annotations

import ast
import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import PIPELINE, ROOT, cuda_available

from pipeline.measuring import launcher

pytest.importorskip("torch")
without_a_gpu = pytest.mark.skipif(cuda_available(), reason="shows what happens without a GPU")


def launch(code: str) -> subprocess.CompletedProcess:
    program = "import sys\n" + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_children_run_the_kit_script_and_the_parent_never_imports_torch(tmp_path):
    out = tmp_path / "environment.json"
    result = launch(f"""
        from pipeline.measuring import launcher
        runner = launcher.Launcher()
        codes = [runner.run(["estimate", "--parameters", "7", "--bits", "4"]),
                 runner.run(["environment", "--device", "cuda:0", "--output", {str(out)!r}])]
        print(runner.mode)
        print(codes)
        print("torch" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "4 bytes" in result.stdout
    assert lines[-3] == "forked from a server that had imported torch and never initialised CUDA"
    assert lines[-2] == "[0, 0]"
    assert lines[-1] == "False"
    environment = json.loads(out.read_text())["environment"]
    assert environment["process_start"] == lines[-3]
    assert environment["torch"]["available"] is True


def test_a_refused_measurement_keeps_its_exit_code_and_writes_nothing(tmp_path):
    """No host has a 65th GPU (and one without a GPU refuses any)."""
    out = tmp_path / "m.json"
    result = launch(f"""
        from pipeline.measuring import launcher
        print(launcher.Launcher().run(["measure", "--device", "cuda:64", "--output", {str(out)!r}]))
    """)
    assert result.stdout.splitlines()[-1] == "2"
    assert not out.exists()


def test_without_fork_each_command_is_a_fresh_interpreter(tmp_path):
    out = tmp_path / "environment.json"
    result = launch(f"""
        from pipeline.measuring import launcher
        runner = launcher.Launcher(fork=False)
        print(runner.run(["environment", "--device", "cuda:0", "--output", {str(out)!r}]))
    """)
    assert result.stdout.splitlines()[-1] == "0"
    assert json.loads(out.read_text())["environment"]["process_start"] == "fresh interpreter"


def test_only_the_forked_child_touches_torch():
    """torch.cuda.is_available() and friends initialise the driver: CUDA then breaks in every
    later fork. Only `_forked_child` and `_count_gpus`, run after the fork, may name torch."""
    tree = ast.parse((PIPELINE / "measuring" / "launcher.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name not in {"_forked_child", "_count_gpus"}:
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            imports = {a.name for n in ast.walk(node) if isinstance(n, ast.Import) for a in n.names}
            assert "torch" not in names | imports, node.name


def test_gpus_are_counted_in_a_child():
    result = launch("""
        from pipeline.measuring import launcher
        print(launcher.Launcher().count_gpus(), launcher.Launcher(fork=False).count_gpus())
        print("torch" in sys.modules)
    """)
    import torch

    count = str(torch.cuda.device_count()) if cuda_available() else "0"
    assert result.stdout.split() == [count, count, "False"], result.stderr


def test_a_child_started_after_another_measures_only_once_that_one_has_exited(tmp_path):
    """The earlier process stands in as a handle whose exit takes 1.5 s; the new child's
    output must be written after the moment it exited (both times from the file system)."""
    out, exited = tmp_path / "environment.json", tmp_path / "exited"
    result = launch(f"""
        import pathlib, time
        from pipeline.measuring import launcher
        class Exiting:
            def wait(self):
                time.sleep(1.5)
                pathlib.Path({str(exited)!r}).write_text("")
                return 0
        runner = launcher.Launcher()
        argv = ["environment", "--device", "cuda:0", "--output", {str(out)!r}]
        handle = runner.start(argv, after=Exiting())
        print(handle.result(), handle.wait())
    """)
    assert result.stdout.splitlines()[-1] == "0 0", result.stderr
    assert out.stat().st_mtime_ns >= exited.stat().st_mtime_ns
    environment = json.loads(out.read_text())["environment"]
    assert environment["process_start"].startswith("forked")


def test_a_parent_interrupted_while_waiting_leaves_the_child_measuring_nothing(tmp_path):
    """The child was forked and waits for the word to measure: it never comes, the child
    exits without writing, and it has been waited for when start() gives up."""
    out = tmp_path / "environment.json"
    result = launch(f"""
        import multiprocessing
        from pipeline.measuring import launcher
        class Interrupted:
            def wait(self):
                raise KeyboardInterrupt
        runner = launcher.Launcher()
        try:
            runner.start(["environment", "--device", "cuda:0", "--output", {str(out)!r}],
                         after=Interrupted())
        except KeyboardInterrupt:
            print("interrupted")
        print(multiprocessing.active_children())
    """)
    assert result.stdout.splitlines()[-2:] == ["interrupted", "[]"], result.stderr
    assert not out.exists()


def test_a_child_that_finds_cuda_initialised_refuses_before_anything(monkeypatch, capsys):
    """CUDA does not survive a fork: such a child says so and exits 2, without even saying
    it is ready (the parent then gets that exit code from result())."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    parent, child = multiprocessing.Pipe()
    parent.send(launcher.EXIT)  # a child that went on would stop at its wait for the word
    with pytest.raises(SystemExit) as exited:
        launcher._forked_child(["estimate", "--parameters", "7", "--bits", "4"], child)
    assert exited.value.code == 2
    assert capsys.readouterr() == ("", "launcher: CUDA was initialised before the fork: refusing\n")
    assert not parent.poll()


def test_a_child_finds_the_modules_of_the_parent_main_script_already_loaded(tmp_path):
    """multiprocessing runs the parent's main script again in each child (as __mp_main__):
    its imports must come from the server, or each sweep point pays for record, validate
    and yaml again. Run from a folder where the pipeline is not importable by itself, as
    `nox -s sweep` is; PYTHONPATH is left as it was."""
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys
        if __name__ == "__mp_main__":
            print("child:", "pipeline.stages.sweep" in sys.modules, "yaml" in sys.modules,
                  flush=True)
        from pipeline.measuring import launcher
        from pipeline.stages import sweep
        if __name__ == "__main__":
            runner = launcher.Launcher()
            print("parent:", os.environ.get("PYTHONPATH"), flush=True)
            print("parent:", runner.run(["estimate", "--parameters", "7", "--bits", "4"]))
        """)
    )
    # The caller's own PYTHONPATH (where its jsonschema may live) plus a folder of no use.
    given = os.pathsep.join(
        [str(tmp_path / "elsewhere"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env = {**os.environ, "PYTHONPATH": given}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    said = [line for line in result.stdout.splitlines() if line.startswith(("child:", "parent:"))]
    assert said == [f"parent: {given}", "child: True True", "parent: 0"], result.stderr


def test_a_child_holds_its_exit_after_reporting_until_waited_for():
    """The exit (a CUDA context's teardown on a GPU) waits until the parent says so, so that
    the next child can be forked first; a parent that never says so does not hang."""
    result = launch("""
        import time
        from pipeline.measuring import launcher
        runner = launcher.Launcher()
        handle = runner.start(["estimate", "--parameters", "7", "--bits", "4"])
        print("parent:", handle.result(), flush=True)
        time.sleep(0.5)
        print("parent:", handle.process.is_alive(), flush=True)
        print("parent:", handle.wait(), handle.process.is_alive(), flush=True)
        forgotten = runner.start(["estimate", "--parameters", "7", "--bits", "4"])
        print("parent:", forgotten.result(), flush=True)
    """)
    said = [line for line in result.stdout.splitlines() if line.startswith("parent: ")]
    assert said == ["parent: 0", "parent: True", "parent: 0 False", "parent: 0"], result.stderr
    assert result.returncode == 0


# ------------------------------------------------------------------ the equivalence grid

EQUIVALENCE = ROOT / "tests" / "benchmarks" / "equivalence_grid.py"


def load_benchmark(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_equivalence_grid_tells_identical_counters_from_differing_ones(tmp_path):
    """Committed measurements stand in for today's: a copy is identical and equal to the
    reference; one counter changed in one phase names that phase."""
    grid = load_benchmark(EQUIVALENCE)
    name = "float32-b1-c16-w64"
    committed = grid.REFERENCE / f"{name}.json"
    (tmp_path / "fresh").mkdir()
    shutil.copyfile(committed, tmp_path / f"{name}.json")
    document = json.loads(committed.read_text())
    (tmp_path / "fresh" / f"{name}.json").write_text(json.dumps(document))
    row = grid.compare(name, {}, 0, 0, tmp_path, grid.REFERENCE)
    assert (row["identical"], row["differing_phases"], row["same_as_reference"]) == (True, [], True)
    document["phases"][2]["peak_reserved_bytes"] += 512
    (tmp_path / "fresh" / f"{name}.json").unlink()
    (tmp_path / "fresh" / f"{name}.json").write_text(json.dumps(document))
    row = grid.compare(name, {}, 0, 0, tmp_path, grid.REFERENCE)
    assert (row["identical"], row["differing_phases"], row["same_as_reference"]) == (
        False,
        [2],
        True,
    )


@without_a_gpu
def test_the_equivalence_grid_without_a_gpu_is_one_line_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "grid"
    result = subprocess.run(
        [sys.executable, str(EQUIVALENCE), str(out), "--configurations", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == (
        "equivalence_grid.py: error: no GPU is visible to PyTorch: this benchmark needs one "
        "and never uses the CPU\n"
    )
    assert not out.exists()
    out.mkdir()
    again = subprocess.run(
        [sys.executable, str(EQUIVALENCE), str(out)], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 2
    assert again.stderr == (
        f"equivalence_grid.py: error: {out} already exists: the comparison goes in a new folder\n"
    )


# ---------------------------------------------------------------- the decoder's measurements

TINY_DECODER = ["--layers", "2", "--width", "64", "--heads", "4", "--kv-heads", "2", "--ffn"]
TINY_DECODER += ["160", "--vocab", "1000", "--batch", "2", "--prompt", "16", "--new-tokens", "4"]


def test_a_forked_child_runs_decoder_main_as_forked(monkeypatch):
    """The decoder's environment record says how its process started: the child must pass it."""
    from pipeline.measuring import decoder

    calls = []
    monkeypatch.setattr(
        decoder, "main", lambda argv, process_start: calls.append((argv, process_start)) or 0
    )
    parent, child = multiprocessing.Pipe()
    parent.send(launcher.MEASURE)
    parent.send(launcher.EXIT)  # let go as soon as it has reported
    with pytest.raises(SystemExit) as exited:
        launcher._forked_child(["measure", "--device", "cuda:0"], child, script="decoder.py")
    assert exited.value.code == 0
    assert calls == [(["measure", "--device", "cuda:0"], launcher.FORKED)]
    assert parent.recv() == launcher.READY
    assert parent.recv() == 0


@without_a_gpu
def test_without_a_gpu_a_forked_decoder_measurement_refuses_in_one_line(tmp_path):
    out = tmp_path / "measurement.json"
    argv = ["measure", "--device", "cuda:0", *TINY_DECODER, "--output", str(out)]
    result = launch(f"""
        from pipeline.measuring import launcher
        runner = launcher.Launcher()
        print(runner.mode)
        print(runner.start({argv!r}, script="decoder.py").wait())
        print("torch" in sys.modules)
    """)
    assert result.stdout.splitlines()[-3:] == [launcher.FORKED, "2", "False"], result.stderr
    assert result.stderr == (
        "decoder.py: error: no GPU is visible to PyTorch: measure needs one and never uses "
        "the CPU\n"
    )
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- your own model's measurements


def test_a_forked_child_runs_own_model_main_as_forked(monkeypatch):
    """An own-model file's environment record says how its process started, as the others."""
    from pipeline.measuring import own_model

    calls = []
    monkeypatch.setattr(
        own_model, "main", lambda argv, process_start: calls.append((argv, process_start)) or 1
    )
    parent, child = multiprocessing.Pipe()
    parent.send(launcher.MEASURE)
    parent.send(launcher.EXIT)
    with pytest.raises(SystemExit) as exited:
        launcher._forked_child(["measure", "--device", "cuda:0"], child, script="own_model.py")
    assert exited.value.code == 1  # a workload that raised: its exit code, passed on
    assert calls == [(["measure", "--device", "cuda:0"], launcher.FORKED)]
    assert parent.recv() == launcher.READY
    assert parent.recv() == 1


@without_a_gpu
def test_without_a_gpu_a_forked_own_model_measurement_refuses_in_one_line(tmp_path):
    out = tmp_path / "measurement.json"
    workload = str(ROOT / "pipeline" / "workloads" / "resnet_cnn.py") + ":resnet"
    argv = ["measure", "--device", "cuda:0", "--workload", workload, "--output", str(out)]
    result = launch(f"""
        from pipeline.measuring import launcher
        runner = launcher.Launcher()
        print(runner.mode)
        print(runner.start({argv!r}, script="own_model.py").wait())
        print("torch" in sys.modules)
    """)
    assert result.stdout.splitlines()[-3:] == [launcher.FORKED, "2", "False"], result.stderr
    assert result.stderr == (
        "own_model.py: error: no GPU is visible to PyTorch: measure needs one and never uses "
        "the CPU\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_launcher_runs_only_the_measuring_scripts():
    with pytest.raises(
        ValueError, match=r"runs mesure_memoire\.py, decoder\.py, own_model\.py, not chain\.py"
    ):
        launcher.Launcher(fork=False).start(["measure"], script="chain.py")
