"""The launcher's children are fresh processes, and its parent never touches torch or CUDA."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import PIPELINE, ROOT

pytest.importorskip("torch")


def launch(code: str) -> subprocess.CompletedProcess:
    program = f"import sys; sys.path.insert(0, {str(PIPELINE)!r})\n" + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_children_run_the_kit_script_and_the_parent_never_imports_torch(tmp_path):
    out = tmp_path / "environment.json"
    result = launch(f"""
        import launcher
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
    out = tmp_path / "m.json"
    result = launch(f"""
        import launcher
        print(launcher.Launcher().run(["measure", "--device", "cuda:0", "--output", {str(out)!r}]))
    """)
    assert result.stdout.splitlines()[-1] == "2"
    assert not out.exists()


def test_without_fork_each_command_is_a_fresh_interpreter(tmp_path):
    out = tmp_path / "environment.json"
    result = launch(f"""
        import launcher
        runner = launcher.Launcher(fork=False)
        print(runner.run(["environment", "--device", "cuda:0", "--output", {str(out)!r}]))
    """)
    assert result.stdout.splitlines()[-1] == "0"
    assert json.loads(out.read_text())["environment"]["process_start"] == "fresh interpreter"


def test_only_the_forked_child_touches_torch():
    """torch.cuda.is_available() and friends initialise the driver: CUDA then breaks in every
    later fork. Only `_child` and `_count_gpus`, run after the fork, may name torch."""
    tree = ast.parse((PIPELINE / "launcher.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name not in {"_child", "_count_gpus"}:
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            imports = {a.name for n in ast.walk(node) if isinstance(n, ast.Import) for a in n.names}
            assert "torch" not in names | imports, node.name


def test_gpus_are_counted_in_a_child():
    result = launch("""
        import launcher
        print(launcher.Launcher().count_gpus(), launcher.Launcher(fork=False).count_gpus())
        print("torch" in sys.modules)
    """)
    assert result.stdout.split() == ["0", "0", "False"], result.stderr
