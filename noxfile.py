"""The front door of the IteraGPU Lab pipeline: one session per stage. `nox -l` is the menu.

Sessions that touch the GPU run in *your* Python (`venv_backend="none"`): the one whose
PyTorch works with your GPU. They never install torch. Which interpreter that is:
`$ITERAGPU_PYTHON` if set, else `python3` (or `python`) found on PATH, i.e. the active
environment. Test and lint sessions build their own pinned virtual environments.
"""

from __future__ import annotations

import datetime
import os
import secrets
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).resolve().parent
PIPELINE = ROOT / "pipeline"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
KIT_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
KIT_TESTS = ["tests/test_mesure_memoire.py", "tests/test_calcul_forfaits.py"]
# The tests need a real torch for the no-GPU guards; the CPU build is enough and small.
TORCH_PIN = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def gpu_python(session: nox.Session) -> str:
    """The interpreter that runs GPU stages: the user's, never one nox built."""
    chosen = os.environ.get("ITERAGPU_PYTHON") or shutil.which("python3") or shutil.which("python")
    if not chosen:
        session.error("Usage: no python3 on PATH; set ITERAGPU_PYTHON to the Python with torch")
    return chosen


def install_cpu_torch(session: nox.Session) -> None:
    """Install the pinned CPU torch once per reused venv (the index lookup is the slow part)."""
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    found = session.run("python", "-c", probe, silent=True, success_codes=[0, 1])
    if not (found or "").strip().startswith(TORCH_PIN.split("==")[1]):
        session.install(TORCH_PIN, "--extra-index-url", TORCH_CPU_INDEX)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite with a CPU torch; GPU tests are skipped where no GPU is visible."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "test"))
    install_cpu_torch(session)
    session.run("pytest", *session.posargs)


@nox.session(python=KIT_PYTHONS)
def kit(session: nox.Session) -> None:
    """Test the two kit scripts on Python 3.10-3.13 with no torch installed at all."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "kit-test"))
    session.run("pytest", *KIT_TESTS, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff (no file is changed)."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def estimate(session: nox.Session) -> None:
    """Estimate weight memory without a GPU: `-- --parameters N --bits B [--reserve-gib R]`."""
    if not session.posargs:
        session.error("Usage: nox -s estimate -- --parameters N --bits B [--reserve-gib R]")
    session.run(
        gpu_python(session),
        str(PIPELINE / "mesure_memoire.py"),
        "estimate",
        *session.posargs,
        external=True,
    )


@nox.session(venv_backend="none")
def environment(session: nox.Session) -> None:
    """Record Python, PyTorch, GPU and driver: `-- --device cuda:0 [--output FILE]`."""
    if not session.posargs:
        session.error("Usage: nox -s environment -- --device cuda:N [--output NEW.json]")
    session.run(
        gpu_python(session),
        str(PIPELINE / "mesure_memoire.py"),
        "environment",
        *session.posargs,
        external=True,
    )


def new_run_folder() -> Path:
    """runs/<UTC time>-<random>: sortable, and created exclusively (never reused)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = ROOT / "runs" / f"{stamp}-{secrets.token_hex(3)}"
    folder.mkdir(parents=False, exist_ok=False)
    return folder


@nox.session(venv_backend="none")
def measure(session: nox.Session) -> None:
    """Measure on a GPU into a new runs/<id>/: `-- --device cuda:0 [measure flags]`."""
    args = list(session.posargs)
    if "--device" not in args:
        session.error("Usage: nox -s measure -- --device cuda:N [--batch B --context C ...]")
    if "--output" in args:
        session.error("Usage: the pipeline names its outputs; drop --output")
    device = args[args.index("--device") + 1] if args.index("--device") + 1 < len(args) else ""
    python = gpu_python(session)
    script = str(PIPELINE / "mesure_memoire.py")
    folder = new_run_folder()
    session.log(f"run folder {folder.relative_to(ROOT)}")
    session.run(
        python,
        script,
        "environment",
        "--device",
        device,
        "--output",
        str(folder / "environment.json"),
        external=True,
    )
    session.run(
        python,
        script,
        "measure",
        *args,
        "--output",
        str(folder / "measurement.json"),
        external=True,
        success_codes=[0, 3],
    )
    session.run(python, str(PIPELINE / "validate.py"), str(folder), external=True)
