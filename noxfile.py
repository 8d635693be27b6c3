"""The front door of the IteraGPU Lab pipeline: one session per stage. `nox -l` is the menu.

Sessions that touch the GPU run in *your* Python (`venv_backend="none"`): the one whose
PyTorch works with your GPU. They never install torch. Which interpreter that is:
`$ITERAGPU_PYTHON` if set, else `python3` (or `python`) found on PATH, i.e. the active
environment. Test and lint sessions build their own pinned virtual environments.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2026.10.20"  # CommandFailed.return_code
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


def stage(session: nox.Session, script: str, *args: str) -> None:
    """Run pipeline/<script> in your Python. When it fails, nox exits with the stage's own
    code (1 invalid, 2 bad input or refused, 3 out of memory: see README), not a generic 1."""
    try:
        session.run(gpu_python(session), str(PIPELINE / script), *args, external=True)
    except nox.command.CommandFailed as failed:
        raise SystemExit(failed.return_code) from None


@nox.session(venv_backend="none")
def measure(session: nox.Session) -> None:
    """Measure into new runs/<id>/ folders, validate, log: `-- --device cuda:N|all [flags]`."""
    if not any(arg.split("=")[0] == "--device" for arg in session.posargs):
        session.error("Usage: nox -s measure -- --device cuda:N|all [--batch B --context C ...]")
    # Another runs directory, for benchmarks and tests; read here only, passed on explicitly.
    runs_dir = os.environ.get("ITERAGPU_RUNS_DIR")
    stage(session, "chain.py", *(["--runs-dir", runs_dir] if runs_dir else []), *session.posargs)


@nox.session(venv_backend="none")
def sweep(session: nox.Session) -> None:
    """Raise one dimension to out-of-memory or a bound: `-- --device cuda:N --vary width ...`."""
    if not any(arg.split("=")[0] == "--device" for arg in session.posargs):
        session.error(
            "Usage: nox -s sweep -- --device cuda:N (--plan data/plans/X.yaml | --vary "
            "width|batch|context --start N --factor F "
            "--until-oom|--max-steps K|--memory-fraction X)"
        )
    runs_dir = os.environ.get("ITERAGPU_RUNS_DIR")
    stage(session, "sweep.py", *(["--runs-dir", runs_dir] if runs_dir else []), *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Draw memory, sweep and cost pictures (matplotlib) into run folders: `-- RUN_DIR...`."""
    if not session.posargs:
        session.error("Usage: nox -s report -- RUN_DIR... [--days 7 --accepted-results N]")
    session.install(*nox.project.dependency_groups(PYPROJECT, "report"))
    try:
        session.run("python", str(PIPELINE / "report.py"), *session.posargs)
    except nox.command.CommandFailed as failed:
        raise SystemExit(failed.return_code) from None


@nox.session(venv_backend="none")
def validate(session: nox.Session) -> None:
    """Check artefacts, run folders or results logs against schemas/: `-- PATH...`."""
    if not session.posargs:
        session.error("Usage: nox -s validate -- runs/<run-id>/ FILE.json LOG.csv ...")
    stage(session, "validate.py", *session.posargs)


@nox.session(venv_backend="none")
def record(session: nox.Session) -> None:
    """Append validated runs to runs/resultats-bruts.csv: `-- RUN_DIR... [quality flags]`."""
    if not session.posargs:
        session.error("Usage: nox -s record -- runs/<run-id>/ [--useful-work N ...]")
    stage(session, "record.py", *session.posargs)


@nox.session(venv_backend="none")
def merge(session: nox.Session) -> None:
    """Unite results logs of several machines: `-- A.csv B.csv ... --output NEW.csv`."""
    if "--output" not in session.posargs:
        session.error("Usage: nox -s merge -- A.csv B.csv ... --output NEW.csv")
    stage(session, "merge.py", *session.posargs)


@nox.session(venv_backend="none")
def cost(session: nox.Session) -> None:
    """Price a rental package (standard library only): `-- --gpu b200 --days 7 --lots 2`."""
    if not session.posargs:
        session.error("Usage: nox -s cost -- --gpu ID --days 3|7|30 [--lots N] [...]")
    stage(session, "calcul_forfaits.py", *session.posargs)


def kit_stage(session: nox.Session, script: str, *args: str) -> None:
    """Run a kit stage (archive, verify) in this session's reused venv. The `pipeline` pins
    are installed once: a stamp file of them lets later calls skip pip entirely, so that
    `nox -s verify` costs nox's start-up plus verify itself. Exits with the stage's code."""
    pins = nox.project.dependency_groups(PYPROJECT, "pipeline")
    stamp = Path(session.virtualenv.location) / "iteragpu-pipeline-pins.txt"
    wanted = "\n".join(pins) + "\n"
    if not stamp.is_file() or stamp.read_text(encoding="utf-8") != wanted:
        session.install(*pins)
        stamp.write_text(wanted, encoding="utf-8")
    try:
        session.run("python", str(PIPELINE / script), *args)
    except nox.command.CommandFailed as failed:
        raise SystemExit(failed.return_code) from None


@nox.session
def archive(session: nox.Session) -> None:
    """Build dist/iteragpu-lab-v1.zip and MANIFEST.json, reproducibly; no GPU; no overwrite."""
    kit_stage(session, "archive.py", *session.posargs)


@nox.session
def verify(session: nox.Session) -> None:
    """Check the kit against MANIFEST.json: the repo's members, or `-- ZIP_OR_FOLDER`."""
    kit_stage(session, "verify.py", *session.posargs)


@nox.session(venv_backend="none")
def notebook(session: nox.Session) -> None:
    """Regenerate data/mesure-memoire.ipynb from mesure_memoire.py (`-- --check`: compare)."""
    stage(session, "make_notebook.py", *session.posargs)


@nox.session(venv_backend="none")
def fit(session: nox.Session) -> None:
    """Which catalogue GPU holds a run's, sweep's or prediction's peak: `-- RUN_DIR --days 7`."""
    if not session.posargs:
        session.error("Usage: nox -s fit -- RUN_DIR|SWEEP_DIR|PREDICTION.json --days 3|7|30 [...]")
    stage(session, "fit.py", *session.posargs)
