"""The front door of the IteraGPU Lab pipeline: one session per stage. `nox -l` is the menu.

Sessions that touch the GPU run in *your* Python (`venv_backend="none"`): the one whose
PyTorch works with your GPU. They never install torch. Which interpreter that is:
`$ITERAGPU_PYTHON` if set, else `python3` (or `python`) found on PATH, i.e. the active
environment, skipping the environments make and nox build (`.tools/`, `.nox/`): those have
no PyTorch of yours. Test and lint sessions build their own pinned virtual environments.
Every stage session exits with the stage's own code (README's table); usage errors exit 2.
A stage runs in the folder nox was started from (`nox -f PATH/noxfile.py`), so relative paths
given to it mean what they mean in your shell.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import nox
import nox.virtualenv
from packaging.version import Version

nox.needs_version = ">=2026.10.20"  # CommandFailed.return_code
# virtualenv (a dependency of nox) seeds pip from its own wheels: an environment in about 1 s
# of a 2-core machine, where venv and ensurepip took 4 s, for each of the six make test builds.
nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]
# A kit Python that cannot be found fails the kit session on CI (CI set, or nox's
# --error-on-missing-interpreters): nox's own default. On a machine with one Python, the kit
# sessions of the others are skipped, each in one line that says why (MissingKitPython).
# nox never downloads a Python here: the kit is tested on the Pythons you have.
nox.options.download_python = "never"


class MissingKitPython(logging.Filter):
    """nox's skip of a session whose Python is missing, in one line that says it is no error
    here and what makes it one (nox's own "Missing interpreters will error by default on CI
    systems." before each skip is left out)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message == "Missing interpreters will error by default on CI systems.":
            return False
        if message.startswith("Session ") and " skipped: Python interpreter " in message:
            record.msg = (
                f"{message.removesuffix('.')} (outside CI a missing kit Python is skipped; "
                "CI=true makes it an error)"
            )
            record.args = ()
        return True


nox.logger.logger.addFilter(MissingKitPython())

# nox asks for uv on every session, to learn which environment backends exist, and logs
# "uv binary not found." when there is none. No session here uses uv: where uv is absent
# (no $UV, no uv on PATH, no uv package beside nox), give nox that answer before it asks.
if "UV" not in os.environ and shutil.which("uv") is None:
    import importlib.util

    if importlib.util.find_spec("uv") is None:
        nox.virtualenv.HAS_UV = False
        nox.virtualenv.UV = "uv"
        nox.virtualenv.UV_VERSION = Version("0.0")

ROOT = Path(__file__).resolve().parent
PIPELINE = ROOT / "pipeline"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
KIT_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# The kit scripts' tests, and that mesure_memoire.py is generated from the package and runs
# alone, on each kit Python.
KIT_TESTS = [
    "tests/test_mesure_memoire.py",
    "tests/test_calcul_forfaits.py",
    "tests/test_kit_script.py",
]
# The tests need a real torch for the no-GPU guards; the CPU build is enough and small.
TORCH_PIN = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
USAGE = 2  # README's exit code for bad input or a missing prerequisite


def refuse(session: nox.Session, message: str) -> NoReturn:
    """A usage error: one line and exit 2, as every stage does (session.error exits 1)."""
    print(f"nox -s {session.name}: error: {message}", file=sys.stderr)
    raise SystemExit(USAGE)


def built_by_tools(session: nox.Session, folder: Path) -> str | None:
    """Which environment built by make or nox holds `folder`, if any: their Pythons carry
    nox or the test pins, never the PyTorch that works with your GPU. Those of another
    checkout are known by their marks: make's holds nox-only/, nox's lie in a folder nox
    tagged CACHEDIR.TAG."""
    builders = [
        (ROOT / ".tools", ".tools/, the environment make built for nox"),
        (ROOT / ".nox", ".nox/, where nox builds its environments"),
        (session.env_dir.parent, f"{session.env_dir.parent}, where nox builds its environments"),
    ]
    folder = folder.resolve()
    for place, what in builders:
        if folder.is_relative_to(place.resolve()):
            return what
    venv = folder.parent  # folder is a venv's bin/
    if (venv / "pyvenv.cfg").is_file():
        if (venv / "nox-only").is_dir():
            return f"{venv}, an environment make built for nox"
        if (venv.parent / "CACHEDIR.TAG").is_file():
            return f"{venv}, an environment nox built"
    return None


def user_python(session: nox.Session) -> str:
    """The interpreter for stages without a venv of their own: yours, never one make or nox
    built. A folder on PATH is judged as named (`.tools/bin/python3` links to a system
    Python, but the venv around it is what would run)."""
    chosen = os.environ.get("ITERAGPU_PYTHON")
    if chosen and Path(chosen).name != chosen:  # a path, not a command name
        path = Path(chosen)
        if not (path.is_file() and os.access(path, os.X_OK)):
            refuse(session, f"ITERAGPU_PYTHON={chosen}: no such executable")
        inside = built_by_tools(session, path.absolute().parent)
        if inside:
            refuse(session, f"ITERAGPU_PYTHON={chosen} is inside {inside}: name your own Python")
        return chosen
    names = [chosen] if chosen else ["python3", "python"]
    skipped = []
    for name in names:
        for entry in os.environ.get("PATH", "").split(os.pathsep):
            found = shutil.which(name, path=entry or os.curdir)
            if not found:
                continue
            inside = built_by_tools(session, Path(found).absolute().parent)
            if not inside:
                if skipped:
                    session.log(f"{skipped[0][0]} skipped ({skipped[0][1]}): using {found}")
                return found
            skipped.append((found, inside))
    if skipped:
        found, inside = skipped[0]
        refuse(
            session,
            f"every {' or '.join(names)} on PATH is in an environment make or nox built "
            f"({found}: {inside}): put your own Python on PATH or set ITERAGPU_PYTHON to it",
        )
    refuse(session, f"no {' or '.join(names)} on PATH: set ITERAGPU_PYTHON to your Python")


def install_once(session: nox.Session, group: str) -> None:
    """Install a dependency group into the session's reused venv once: a stamp of the pins
    lets later calls skip pip entirely."""
    pins = nox.project.dependency_groups(PYPROJECT, group)
    stamp = Path(session.virtualenv.location) / f"iteragpu-{group}-pins.txt"
    wanted = "\n".join(pins) + "\n"
    if not stamp.is_file() or stamp.read_text(encoding="utf-8") != wanted:
        session.install(*pins)
        stamp.write_text(wanted, encoding="utf-8")


def run_stage(
    session: nox.Session,
    module: str,
    *leading: str,
    usage: str | None = None,
    needs: str | tuple[str, ...] | None = None,
    group: str | None = None,
    runs_dir: bool = False,
    install: Callable[[nox.Session], None] | None = None,
) -> None:
    """Run a stage's module with the session's arguments and exit with the stage's own code:
    nox alone ends every failure with 1, and README promises 1 invalid, 2 bad input, 3 out of
    memory. Without the arguments `usage` describes (any, or one of the options `needs`): exit
    2. A session with a venv installs `group` there (or calls `install`); one without (or
    under `nox --no-venv`) runs in user_python(), as it is.
    `runs_dir` passes $ITERAGPU_RUNS_DIR on as --runs-dir (benchmarks and tests use it)."""
    args = list(session.posargs)
    given = {arg.split("=")[0] for arg in args}
    options = (needs,) if isinstance(needs, str) else needs
    if usage is not None and (given.isdisjoint(options) if options else not args):
        refuse(session, f"usage: nox -s {session.name} -- {usage}")
    if session.venv_backend == "none":
        python = user_python(session)
    else:
        python = "python"
        if group:
            install_once(session, group)
        if install:
            install(session)
    if runs_dir and os.environ.get("ITERAGPU_RUNS_DIR"):
        args = ["--runs-dir", os.environ["ITERAGPU_RUNS_DIR"], *args]
    # Relative paths are your shell's: a stage runs where nox was started (nox itself moves to
    # the noxfile's folder), and says so when that is not the repository root.
    saved = os.environ.get("PYTHONPATH")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), *([saved] if saved else [])])}
    invoked = Path(session.invoked_from).resolve()
    where = session.chdir(invoked) if invoked != ROOT else contextlib.nullcontext()
    try:
        with where:
            session.run(python, "-m", module, *leading, *args, external=True, env=env)
    except nox.command.CommandFailed as failed:  # no code: nox could not start it at all
        raise SystemExit(USAGE if failed.return_code is None else failed.return_code) from None


def install_cpu_torch(session: nox.Session) -> None:
    """Install the pinned CPU torch once per reused venv, from PyTorch's CPU index (on Linux,
    PyPI's build needs CUDA: several GB). A CPU build that pip finds without any index (a
    wheel house named by pip's --find-links) is taken as it is: with the CPU index as an extra
    index pip asks it for every dependency too, and where it cannot be reached pip retries
    each one for seconds."""
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    found = session.run("python", "-c", probe, silent=True, success_codes=[0, 1])
    if (found or "").strip().startswith(TORCH_PIN.split("==")[1]):
        return
    wheel = local_cpu_build(session)
    if wheel:
        session.install(wheel)  # that very file; its dependencies from pip's indexes
        return
    session.install(TORCH_PIN, "--extra-index-url", TORCH_CPU_INDEX)


def local_cpu_build(session: nox.Session) -> str | None:
    """The wheel file of the pinned torch that pip finds without an index, if it needs none of
    NVIDIA's CUDA packages (pip's dry run reads its metadata). Any doubt answers None."""
    python = Path(session.bin) / "python"
    command = [str(python), "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
               "--quiet", "--disable-pip-version-check", "--report", "-", TORCH_PIN]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        (torch,) = json.loads(result.stdout)["install"]
        requires = torch["metadata"].get("requires_dist") or []
        url = torch["download_info"]["url"]
    except (ValueError, KeyError, TypeError):
        return None
    if any(requirement.lower().startswith("nvidia-") for requirement in requires):
        return None
    return url if url.startswith("file:") else None


# Where PYTHONDONTWRITEBYTECODE is set (some CI images set it), every worker rewrites the test
# modules' asserts again and every fresh interpreter compiles the lab's modules again: the
# suite took 294-311 s on a 2-core machine with it set, 259 s without. The bytecode goes where
# Python puts it by default, in __pycache__ folders that git ignores.
WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite with a CPU torch; GPU tests are skipped where no GPU is visible."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "test"))
    install_cpu_torch(session)
    # After torch: peft and accelerate require torch, and before it pip would fetch a CUDA one.
    # (Installed with --no-compile, torch and transformers took 15 s instead of 43 s, but the
    # suite's first imports and the kit sessions beside it took that time back: make test
    # 346-351 s from a fresh clone on a 2-core machine, against 352 s.)
    session.install(*nox.project.dependency_groups(PYPROJECT, "hf"))
    # bitsandbytes, optional for users, is here so that its optimizers' tests run
    session.install(*nox.project.dependency_groups(PYPROJECT, "bnb"))
    # Most tests pay a subprocess's `import torch`: on several processes (pytest-xdist) the
    # suite takes about 70% of its time on one, on a 2-core machine; the GPU tests stay
    # together on one process (conftest.py). `nox -s tests -- -n 0`: one process.
    session.run(
        "pytest", "-n", "auto", "--maxprocesses", "4", "--dist", "loadgroup", *session.posargs,
        env=WRITE_BYTECODE,
    )  # fmt: skip


@nox.session(name="gpu-tests", venv_backend="none")
def gpu_tests(session: nox.Session) -> None:
    """Run the GPU tests on your GPU Python: those that share the GPU, then the whole-GPU ones.

    Your GPU Python needs pytest and pytest-xdist: the tests that share the GPU run on 8
    processes at once, then those that run it to out-of-memory, alone."""
    python = user_python(session)
    check = subprocess.run([python, "-c", "import pytest, xdist, torch"], capture_output=True)
    if check.returncode:
        pins = [
            pin
            for pin in nox.project.dependency_groups(PYPROJECT, "test")
            if pin.split("==")[0] in ("pytest", "pytest-xdist")
        ]
        refuse(
            session,
            f"{python} cannot import pytest, pytest-xdist or torch: with torch there, "
            f"{python} -m pip install {' '.join(pins)}",
        )
    # The tests start dozens of fresh interpreters, each importing torch. Where its modules
    # carry no bytecode and none may be written beside them (a read-only image, or
    # PYTHONDONTWRITEBYTECODE set), each one compiles torch's modules again: 7.9 s of a 20.8 s
    # decoder measurement under the profiler, on one such GPU machine. Their bytecode goes to
    # one folder of the lab's, made by the first interpreter and read by the others; nothing
    # is written beside anyone's sources. A PYTHONPYCACHEPREFIX of your own is kept.
    env = {
        "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX")
        or str(ROOT / ".nox" / "gpu-pycache"),
        "PYTHONDONTWRITEBYTECODE": "",
    }
    files = gpu_test_files()
    session.run(python, "-m", "pytest", "-m", "gpu", "--gpu-shared", "-n", "8", *session.posargs,
                *files, env=env, external=True)  # fmt: skip
    session.run(python, "-m", "pytest", "-m", "gpu_whole", *session.posargs, *files, env=env,
                external=True)  # fmt: skip


GPU_MARK = re.compile(r"\bpytest\.mark\.gpu(_whole)?\b")


def gpu_test_files() -> list[str]:
    """The test files that mark a test gpu or gpu_whole: each of the GPU runs' processes then
    collects these alone, not the 4,000 CPU tests (about 3.5 s a process, on the GPU's time).
    A test checks that they are every file pytest finds a GPU test in."""
    return [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        if GPU_MARK.search(path.read_text(encoding="utf-8"))
    ]


@nox.session(python=KIT_PYTHONS)
def kit(session: nox.Session) -> None:
    """Test the two kit scripts on Python 3.10-3.13 with no torch installed at all."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "kit-test"))
    session.run("pytest", *KIT_TESTS, *session.posargs, env=WRITE_BYTECODE)


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff (no file is changed)."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def install_predict(session: nox.Session, *more: str) -> None:
    """The CPU torch (as the tests session installs it, never a CUDA build), then the
    `predict` extra's pins, then the other groups named."""
    install_cpu_torch(session)
    for group in ("predict", *more):
        install_once(session, group)


@nox.session
def predict(session: nox.Session) -> None:
    """Predict a model's GPU memory, no GPU: `-- --hf-config config.json --task training`.

    own_model.py estimate, in a venv of its own: the CPU torch (as the tests session installs
    it, never a CUDA build), then the `predict` extra's pins (transformers, peft, jsonschema,
    pyyaml). `-- --workload FILE.py:FUNCTION ...` predicts your own PyTorch model."""
    usage = (
        "--hf-config config.json|--workload FILE.py:FUNCTION [--task training|lora|inference"
        "|generate] [--dtype bfloat16 --batch 4 --dim sequence=2048 --gpu h200 --json]"
    )
    run_stage(
        session, "pipeline.measuring.own_model", "estimate", usage=usage,
        needs=("--hf-config", "--workload"), install=install_predict,
    )  # fmt: skip


@nox.session
def plan(session: nox.Session) -> None:
    """Each GPU's largest batch, and its price, no GPU: `-- --search batch --days 7 -- ...`.

    `-- --search batch|new_tokens|DIM --days 7 -- --hf-config config.json --task training`:
    plan.py, in the venv of `predict` (the CPU torch, then the `predict` extra's pins), with
    matplotlib for --picture."""
    usage = (
        "--search batch|new_tokens|DIM --days 3|7|30 [--picture plan.png] -- --hf-config "
        "config.json|--workload FILE.py:FUNCTION [estimate's options]"
    )
    run_stage(
        session, "pipeline.stages.plan", usage=usage, needs="--search",
        install=lambda session: install_predict(session, "report"), runs_dir=True,
    )  # fmt: skip


@nox.session(venv_backend="none")
def estimate(session: nox.Session) -> None:
    """The kit's weights-only calculator (no model): `-- --parameters N --bits B`.

    `[--reserve-gib R]` adds a reserve. For a model's memory, with its activations and
    optimizer, `nox -s predict`."""
    usage = "--parameters N --bits B [--reserve-gib R]"
    run_stage(session, "kit.mesure_memoire", "estimate", usage=usage)


@nox.session(venv_backend="none")
def environment(session: nox.Session) -> None:
    """Record Python, PyTorch, GPU and driver: `-- --device cuda:0 [--output FILE]`."""
    usage = "--device cuda:N [--output NEW.json]"
    run_stage(session, "kit.mesure_memoire", "environment", usage=usage, needs="--device")


@nox.session(venv_backend="none")
def measure(session: nox.Session) -> None:
    """Measure into new runs/<id>/ folders, validate, log: `-- --device cuda:N|all [flags]`."""
    usage = "--device cuda:N|all [--workload network|decoder|FILE.py:FUNCTION] [--batch B ...]"
    run_stage(session, "pipeline.stages.chain", usage=usage, needs="--device", runs_dir=True)


@nox.session(venv_backend="none")
def sweep(session: nox.Session) -> None:
    """Raise one dimension to out-of-memory or a bound: `-- --device cuda:N --vary width ...`."""
    usage = (
        "--device cuda:N (--plan data/plans/X.yaml | --vary width|batch|context --start N "
        "--factor F --until-oom|--max-steps K|--memory-fraction X)"
    )
    run_stage(session, "pipeline.stages.sweep", usage=usage, needs="--device", runs_dir=True)


@nox.session
def report(session: nox.Session) -> None:
    """Draw memory, sweep and cost pictures into a new runs/<id>-report/: `-- RUN_DIR...`."""
    usage = "RUN_DIR... [--days 7 --accepted-results N]"
    run_stage(session, "pipeline.stages.report", usage=usage, group="report")


@nox.session(venv_backend="none")
def validate(session: nox.Session) -> None:
    """Check artefacts, run folders or results logs against schemas/: `-- PATH...`."""
    run_stage(session, "pipeline.artefacts.validate", usage="runs/<run-id>/ FILE.json LOG.csv ...")


@nox.session(venv_backend="none")
def record(session: nox.Session) -> None:
    """Append validated runs to runs/resultats-bruts.csv: `-- RUN_DIR... [quality flags]`."""
    run_stage(session, "pipeline.stages.record", usage="runs/<run-id>/ [--useful-work N ...]")


@nox.session(venv_backend="none")
def merge(session: nox.Session) -> None:
    """Unite results logs of several machines: `-- A.csv B.csv ... --output NEW.csv`."""
    run_stage(
        session, "pipeline.stages.merge", usage="A.csv B.csv ... --output NEW.csv", needs="--output"
    )


@nox.session(venv_backend="none")
def cost(session: nox.Session) -> None:
    """Price a rental package (standard library only): `-- --gpu b200 --days 7 --lots 2`."""
    run_stage(session, "pipeline.calcul_forfaits", usage="--gpu ID --days 3|7|30 [--lots N] [...]")


@nox.session
def archive(session: nox.Session) -> None:
    """Build dist/iteragpu-lab-v1.zip and MANIFEST.json, reproducibly; no GPU; no overwrite."""
    run_stage(session, "pipeline.kit.archive", group="pipeline")


@nox.session
def verify(session: nox.Session) -> None:
    """Check the kit against MANIFEST.json: the repo's members, or `-- ZIP_OR_FOLDER`."""
    run_stage(session, "pipeline.kit.verify", group="pipeline")


@nox.session(name="kit-script", venv_backend="none")
def kit_script(session: nox.Session) -> None:
    """Regenerate kit/mesure_memoire.py from the package (`-- --check`: compare)."""
    run_stage(session, "pipeline.kit.make_kit_script")


@nox.session(venv_backend="none")
def notebook(session: nox.Session) -> None:
    """Regenerate data/mesure-memoire.ipynb from mesure_memoire.py (`-- --check`: compare)."""
    run_stage(session, "pipeline.kit.make_notebook")


@nox.session(venv_backend="none")
def fit(session: nox.Session) -> None:
    """Which catalogue GPU holds a run's, sweep's or prediction's peak: `-- RUN_DIR --days 7`."""
    run_stage(
        session,
        "pipeline.stages.fit",
        usage="RUN_DIR|SWEEP_DIR|PREDICTION.json --days 3|7|30 [...]",
    )
