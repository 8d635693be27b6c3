"""The package as a user installs it: a wheel built from this tree, installed where this
tree cannot be imported, and its `iteragpu` command run from a folder outside the repository.

The wheel is built without isolation (setuptools, pinned in the test group) from a copy of
the files it is made of, and installed with --no-deps into a --target folder: the test
environment's torch and jsonschema stand in for those a user installs first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytest.importorskip("setuptools")
torch = pytest.importorskip("torch")

SOURCES = ["pyproject.toml", "README.md", "LICENSE.txt", "pipeline", "kit", "calibrations",
           "schemas", "data"]  # fmt: skip
LINEAR = (
    "import torch\nfrom own_model import Workload\n\n"
    "def linear(config, *, features=64, out=256):\n"
    "    model = torch.nn.Linear(features, out).to(device=config.device, dtype=config.dtype)\n"
    "    def make_inputs():\n"
    "        shape = (config.batch, features)\n"
    "        return torch.randn(shape, device=config.device, dtype=config.dtype)\n"
    "    return Workload(model, make_inputs)\n"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel installed into a folder of its own: how to run its command, and where."""
    work = tmp_path_factory.mktemp("install")
    source = work / "source"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "wheels"),
                    str(source)], check=True, cwd=work)  # fmt: skip
    (wheel,) = (work / "wheels").glob("iteragpu_lab-1.0.0-py3-none-any.whl")
    target = work / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(target),
                    str(wheel)], check=True, cwd=work)  # fmt: skip
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ITERAGPU_", "PYTHON"))}
    env["PYTHONPATH"] = str(target)  # what site-packages would be: nothing of this tree
    return {"command": [str(target / "bin" / "iteragpu")], "cwd": elsewhere, "env": env,
            "target": target, "python": sys.executable}  # fmt: skip


def run(installed: dict, *args: str, command=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*(command or installed["command"]), *args], cwd=installed["cwd"], env=installed["env"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_installed_package_is_imported_from_the_wheel_not_this_tree(installed):
    probe = "import pipeline.core.places as p; print(p.__file__, p.installed())"
    done = run(installed, "-c", probe, command=[installed["python"]])
    assert done.returncode == 0, done.stderr
    where, flag = done.stdout.split()
    assert Path(where).is_relative_to(installed["target"])
    assert flag == "True"


def test_the_console_command_lists_what_a_user_does(installed):
    done = run(installed, "--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("    ") and line[4] != " "]
    assert listed == ["predict", "measure", "plan", "fit", "cost", "sweep", "report",
                      "validate", "verify"]  # fmt: skip
    unknown = run(installed, "frobnicate")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr.startswith("iteragpu: error: argument SUBCOMMAND: invalid choice: ")
    assert len(unknown.stderr.splitlines()) == 1


def test_the_installed_command_predicts_without_a_gpu_with_its_own_calibration(installed):
    """The H200's calibration and the schemas come with the wheel (pipeline/_bundled/)."""
    (installed["cwd"] / "model.py").write_text(LINEAR)
    args = ["predict", "--workload", "model.py:linear", "--gpu", "h200"]
    done = run(installed, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        "peak reserved 34.0 MiB, exact, for the NVIDIA H200",
        "exact: every operator call is covered by the calibration; the GPU must show these bytes",
    ]
    done = run(installed, *args, "--json")
    assert done.returncode == 0, done.stderr
    (installed["cwd"] / "predicted.json").write_text(done.stdout)
    assert json.loads(done.stdout)["prediction"]["status"] == "exact"
    checked = run(installed, "validate", "predicted.json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    fitted = run(installed, "fit", "predicted.json", "--days", "7")
    assert fitted.returncode == 0, fitted.stdout + fitted.stderr
    # the installed tariffs go before `--`: what follows is the estimate's own
    planned = run(installed, "plan", "--search", "batch", "--up-to", "4", "--days", "7", "--",
                  "--workload", "model.py:linear", "--gpu", "h200")  # fmt: skip
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "stopped: --up-to 4 reached" in planned.stdout


def test_the_installed_command_prices_a_package_from_its_own_tariffs(installed):
    done = run(installed, "cost", "--gpu", "h200", "--days", "7")
    assert done.returncode == 0, done.stderr
    assert "NVIDIA H200" in done.stdout


def test_the_predict_extra_and_the_predict_group_pin_the_same():
    """`pip install ".[predict]"` and `nox -s predict` install the same pins, torch in none."""
    import nox.project

    pyproject = nox.project.load_toml(ROOT / "pyproject.toml")
    extra = pyproject["project"]["optional-dependencies"]["predict"]
    group = nox.project.dependency_groups(pyproject, "predict")
    assert sorted(extra) == sorted(group)
    assert all("==" in pin for pin in extra)
    assert not any(pin.startswith("torch") for pin in extra)
    assert pyproject["project"]["scripts"] == {"iteragpu": "pipeline.stages.console:main"}
