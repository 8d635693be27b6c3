"""noxfile.py driven for real: which Python a stage runs in, and exit codes that match the
README (the stage's own; usage errors 2, in one line).

Each test runs nox on a copy of the noxfile in a throw-away repository root, whose .tools/
and .nox/ are faked, with a PATH made for the test. Stand-in Pythons are shell scripts: one
that must never run (it says HIJACKED and exits 97), one that prints the command it was given
and exits with $STAGE_EXIT, and this test interpreter under another name."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import COLLECTED, ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nox") is None, reason="nox is not installed here"
)
ESTIMATE = ["-s", "estimate", "--", "--parameters", "7000000000", "--bits", "16"]
ESTIMATED = "weights         14000000000 bytes"
STAGE_SESSIONS = {  # session: arguments that satisfy its usage check
    "estimate": ["--parameters", "7"],
    "environment": ["--device", "cuda:0"],
    "measure": ["--device", "cuda:0"],
    "sweep": ["--device=cuda:0"],
    "validate": ["x.json"],
    "record": ["runs/x/"],
    "merge": ["a.csv", "--output", "b.csv"],
    "cost": ["--gpu", "h200"],
    "notebook": [],
    "kit-script": [],
}


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def hijacker(folder: Path) -> Path:
    """A python3 in an environment built by make or nox: it must never run."""
    return executable(folder / "python3", "#!/bin/sh\necho HIJACKED >&2\nexit 97\n")


def user_python(folder: Path) -> Path:
    """This test interpreter, as the user's own python3 outside any built environment."""
    return executable(folder / "python3", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')


def echo_python(folder: Path) -> Path:
    """A python3 that prints each argument on its own line and exits with $STAGE_EXIT."""
    text = (
        '#!/bin/sh\necho "pythonpath: $PYTHONPATH"\nfor arg in "$@"; do echo "arg: $arg"; done\n'
        'exit "${STAGE_EXIT:-0}"\n'
    )
    return executable(folder / "python3", text)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A throw-away repository root: the noxfile and what its stages read."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("noxfile.py", "pyproject.toml", "Makefile", "MANIFEST.json"):
        shutil.copy(ROOT / name, root / name)
    for folder in ("pipeline", "schemas"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def nox(repo: Path, *args: str, path, env=None, command=(sys.executable, "-m", "nox"), cwd=None):
    """nox in `repo` (or `cwd`) with exactly `path` as PATH; stdout and stderr kept apart."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ITERAGPU_")}
    environ["PATH"] = os.pathsep.join(map(str, path))
    environ.update(env or {})
    return subprocess.run(
        [*command, *args], cwd=cwd or repo, env=environ, capture_output=True, text=True, timeout=120
    )


def error_lines(result, session: str) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith(f"nox -s {session}:")]


# ---------------------------------------------------------------- which Python runs a stage


@pytest.mark.parametrize(
    ("tools", "flags"),
    [
        (".tools/bin", []),
        (".nox/tests/bin", []),
        (".nox/tests/bin", ["--envdir", "envs"]),  # left from earlier runs
        ("envs/tests/bin", ["--envdir", "envs"]),
    ],
)
def test_a_built_python_first_on_path_is_skipped_for_the_users(repo, tmp_path, tools, flags):
    """`export PATH=$PWD/.tools/bin:$PATH` must not make the GPU stages run in nox's venv."""
    hijacker(repo / tools)
    mine = user_python(tmp_path / "mine")
    result = nox(repo, *flags, *ESTIMATE, path=[repo / tools, mine.parent])
    assert result.returncode == 0, result.stderr
    assert ESTIMATED in result.stdout
    assert "HIJACKED" not in result.stdout + result.stderr
    assert f"{repo / tools / 'python3'} skipped (" in result.stderr
    assert f"): using {mine}\n" in result.stderr


def test_the_environments_of_another_checkout_are_skipped_too(repo, tmp_path):
    """Known by their marks: make's holds nox-only/, nox's lie in a CACHEDIR.TAG folder."""
    other = tmp_path / "other-checkout"
    hijacker(other / ".tools" / "bin")
    (other / ".tools" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (other / ".tools" / "nox-only").mkdir()
    hijacker(other / ".nox" / "tests" / "bin")
    (other / ".nox" / "tests" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (other / ".nox" / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    mine = user_python(tmp_path / "mine")
    path = [other / ".tools" / "bin", other / ".nox" / "tests" / "bin", mine.parent]
    result = nox(repo, *ESTIMATE, path=path)
    assert result.returncode == 0, result.stderr
    assert ESTIMATED in result.stdout
    assert f"{other / '.tools'}, an environment make built for nox): using {mine}" in result.stderr
    assert "HIJACKED" not in result.stdout + result.stderr


def test_only_built_pythons_on_path_is_one_line_naming_iteragpu_python(repo):
    hijacker(repo / ".tools" / "bin")
    result = nox(repo, *ESTIMATE, path=[repo / ".tools" / "bin"])
    assert result.returncode == 2
    assert error_lines(result, "estimate") == [
        "nox -s estimate: error: every python3 or python on PATH is in an environment make or "
        f"nox built ({repo}/.tools/bin/python3: .tools/, the environment make built for nox): "
        "put your own Python on PATH or set ITERAGPU_PYTHON to it"
    ]
    assert "HIJACKED" not in result.stdout + result.stderr


def test_no_python_on_path_at_all(repo, tmp_path):
    result = nox(repo, *ESTIMATE, path=[tmp_path / "empty"])
    assert result.returncode == 2
    assert error_lines(result, "estimate") == [
        "nox -s estimate: error: no python3 or python on PATH: set ITERAGPU_PYTHON to your Python"
    ]


@pytest.mark.parametrize("tools", [".tools/bin", ".nox/tests/bin"])
def test_iteragpu_python_inside_a_built_environment_is_refused(repo, tmp_path, tools):
    fake = hijacker(repo / tools)
    mine = user_python(tmp_path / "mine")
    result = nox(repo, *ESTIMATE, path=[mine.parent], env={"ITERAGPU_PYTHON": str(fake)})
    assert result.returncode == 2
    [line] = error_lines(result, "estimate")
    assert line.startswith(f"nox -s estimate: error: ITERAGPU_PYTHON={fake} is inside .")
    assert line.endswith(": name your own Python")
    assert "HIJACKED" not in result.stdout + result.stderr


def test_iteragpu_python_wins_over_path_and_must_exist(repo, tmp_path):
    hijacker(tmp_path / "first")
    mine = user_python(tmp_path / "mine")
    path = [tmp_path / "first"]
    result = nox(repo, *ESTIMATE, path=path, env={"ITERAGPU_PYTHON": str(mine)})
    assert result.returncode == 0, result.stderr
    assert ESTIMATED in result.stdout
    missing = tmp_path / "no" / "python3"
    result = nox(repo, *ESTIMATE, path=path, env={"ITERAGPU_PYTHON": str(missing)})
    assert result.returncode == 2
    assert error_lines(result, "estimate") == [
        f"nox -s estimate: error: ITERAGPU_PYTHON={missing}: no such executable"
    ]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_the_readmes_way_puts_nothing_but_nox_on_path(repo, tmp_path):
    """README: `export PATH="$PWD/.tools/nox-only:$PATH"`. make links nox there (here to
    the tests' own nox, in place of the pinned one it would install), and that folder holds
    no python3 to shadow yours."""
    assert 'export PATH="$PWD/.tools/nox-only:$PATH"' in (ROOT / "README.md").read_text()
    real_nox = Path(sys.executable).parent / "nox"
    if not real_nox.is_file():
        pytest.skip("no nox script beside this Python")
    hijacker(repo / ".tools" / "bin")
    (repo / ".tools" / "bin" / "nox").symlink_to(real_nox)
    made = subprocess.run(
        ["make", "-C", str(repo), "nox", "NOX=.tools/bin/nox"],
        env={**os.environ, "PATH": os.defpath},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    only = repo / ".tools" / "nox-only"
    assert sorted(os.listdir(only)) == ["nox"]
    assert shutil.which("python3", path=str(only)) is None
    mine = user_python(tmp_path / "mine")
    result = nox(repo, *ESTIMATE, path=[only, mine.parent], command=["nox"])
    assert result.returncode == 0, result.stderr
    assert ESTIMATED in result.stdout
    assert "HIJACKED" not in result.stdout + result.stderr


# ---------------------------------------------------------------- exit codes and arguments


@pytest.mark.parametrize("session", STAGE_SESSIONS)
def test_every_stage_session_exits_with_the_stages_own_code(repo, tmp_path, session):
    """3 (out of memory) comes out of nox as 3, not nox's generic 1."""
    stand_in = echo_python(tmp_path / "bin")
    args = ["-s", session, "--", *STAGE_SESSIONS[session]]
    result = nox(repo, *args, path=[stand_in.parent], env={"STAGE_EXIT": "3"})
    assert result.returncode == 3, result.stdout + result.stderr
    assert "arg: " in result.stdout


@pytest.mark.parametrize(
    ("session", "args"),
    [
        ("estimate", []),
        ("environment", []),
        ("environment", ["--output", "x.json"]),
        ("measure", []),
        ("measure", ["--width", "64"]),
        ("sweep", ["--vary", "width"]),
        ("validate", []),
        ("record", []),
        ("merge", ["a.csv", "b.csv"]),
        ("cost", []),
        ("report", []),
        ("predict", []),
        ("predict", ["--task", "training"]),
    ],
)
def test_a_session_without_its_arguments_exits_2_in_one_line(repo, tmp_path, session, args):
    stand_in = echo_python(tmp_path / "bin")
    # the check comes before any install
    flags = ["--no-venv"] if session in ("report", "predict") else []
    result = nox(repo, *flags, "-s", session, "--", *args, path=[stand_in.parent])
    assert result.returncode == 2
    [line] = error_lines(result, session)
    assert line.startswith(f"nox -s {session}: error: usage: nox -s {session} -- ")
    assert "arg: " not in result.stdout  # no stage was started


def test_predict_runs_the_model_estimate(repo, tmp_path):
    """`nox -s predict` is own_model.py's estimate, not the kit's weights-only calculator."""
    stand_in = echo_python(tmp_path / "bin")
    args = ["--hf-config", "config.json", "--task", "training", "--gpu", "h200"]
    result = nox(repo, "--no-venv", "-s", "predict", "--", *args, path=[stand_in.parent])
    assert result.returncode == 0, result.stderr
    said = [line.removeprefix("arg: ") for line in result.stdout.splitlines()[1:]]
    assert said == ["-m", "pipeline.measuring.own_model", "estimate", *args]


def test_nox_l_says_which_estimate_is_which_in_whole_sentences(repo, tmp_path):
    """`nox -l` shows each session's docstring up to its first line break: each must be one
    whole line; the model estimate has its session, and the kit's calculator says what it is."""
    mine = user_python(tmp_path / "mine")
    result = nox(repo, "-l", path=[mine.parent])
    assert result.returncode == 0, result.stderr
    listed = dict(
        line[2:].split(" -> ", 1) for line in result.stdout.splitlines() if " -> " in line
    )
    assert listed["predict"] == (
        "Predict a model's GPU memory, no GPU: `-- --hf-config config.json --task training`."
    )
    assert listed["estimate"] == (
        "The kit's weights-only calculator (no model): `-- --parameters N --bits B`."
    )
    noxfile = load_noxfile()
    for name, description in listed.items():
        function = getattr(noxfile, name.split("-3.")[0].replace("-", "_"))
        assert function.__doc__.split("\n\n")[0] == description, name


def test_a_bad_argument_exits_2_with_the_stages_own_line(repo, tmp_path):
    mine = user_python(tmp_path / "mine")
    args = ["-s", "estimate", "--", "--parameters", "7B", "--bits", "16"]
    result = nox(repo, *args, path=[mine.parent])
    assert result.returncode == 2
    assert (
        "mesure_memoire.py: error: argument --parameters: expected a positive integer, got '7B'"
        in result.stdout + result.stderr
    )


def test_the_runs_directory_is_passed_on_to_measure_and_sweep(repo, tmp_path):
    stand_in = echo_python(tmp_path / "bin")
    somewhere = tmp_path / "elsewhere"
    for session, module in (
        ("measure", "pipeline.stages.chain"),
        ("sweep", "pipeline.stages.sweep"),
    ):
        args = ["-s", session, "--", "--device", "cuda:0"]
        env = {"ITERAGPU_RUNS_DIR": str(somewhere)}
        result = nox(repo, *args, path=[stand_in.parent], env=env)
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stdout.splitlines() if line.startswith("arg: ")]
        assert lines == [
            "arg: -m",
            f"arg: {module}",
            "arg: --runs-dir",
            f"arg: {somewhere}",
            "arg: --device",
            "arg: cuda:0",
        ]
        # the stage finds the package from the repository root, wherever nox was started
        [pythonpath] = [line for line in result.stdout.splitlines() if line.startswith("pyth")]
        assert pythonpath.split(" ", 1)[1].split(os.pathsep)[0] == str(repo)
        result = nox(repo, *args, path=[stand_in.parent])
        assert "arg: --runs-dir" not in result.stdout


def test_verify_on_a_folder_holding_the_zip_says_it_is_not_a_kit_folder(repo, tmp_path):
    """`nox -s verify -- dist/`: one line and 2, not nine "missing" failures. (--no-venv: the
    test's Python already has the pins the session would install.)"""
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "iteragpu-lab-v1.zip").write_bytes(b"PK")
    mine = user_python(tmp_path / "mine")
    result = nox(repo, "--no-venv", "-s", "verify", "--", str(dist), path=[mine.parent])
    assert result.returncode == 2
    output = result.stdout + result.stderr
    assert f"verify.py: error: {dist}: not a kit folder (none of the kit's files" in output
    assert "missing" not in output


# ---------------------------------------------------------------- the kit's Pythons, nox's noise


def test_a_missing_kit_python_is_skipped_in_one_line_outside_ci(repo, tmp_path, monkeypatch):
    """A user's machine has one Python: a kit Python nox cannot find is a skip, said in one
    line that names it and why, and the session exits 0 (nox's own convention)."""
    monkeypatch.delenv("CI", raising=False)
    mine = user_python(tmp_path / "mine")
    result = nox(repo, "-s", "kit", "--force-python", "3.99", path=[mine.parent])
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "3.99" in line or "CI" in line]
    assert said == [
        "nox > Running session kit-3.99",
        "nox > Session kit-3.99 skipped: Python interpreter 3.99 not found "
        "(outside CI a missing kit Python is skipped; CI=true makes it an error)",
    ]


@pytest.mark.parametrize("flags", [["--error-on-missing-interpreters"], []])
def test_on_ci_a_missing_kit_python_fails_the_kit_session(repo, tmp_path, monkeypatch, flags):
    """CI (CI set, as .ci/run sets it, or nox's own flag) fails on a missing kit Python."""
    if flags:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", "true")
    mine = user_python(tmp_path / "mine")
    result = nox(repo, "-s", "kit", "--force-python", "3.99", *flags, path=[mine.parent])
    assert result.returncode == 1, result.stderr
    assert "Session kit-3.99 failed: Python interpreter 3.99 not found." in result.stderr
    assert "skipped" not in result.stderr


def test_ci_runs_make_test_with_ci_set_even_where_the_caller_did_not(repo, tmp_path):
    """.ci/run is CI's entry point: run by hand, it still fails on a missing kit Python."""
    shutil.copytree(ROOT / ".ci", repo / ".ci")
    fake = tmp_path / "fake"
    executable(fake / "make", '#!/bin/sh\necho "CI=${CI-unset} make $*"\nexit 1\n')
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    environ["PATH"] = os.pathsep.join([str(fake), os.defpath])
    done = subprocess.run(
        [str(repo / ".ci" / "run")], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["CI=true make test"]


def test_no_session_says_uv_binary_not_found(repo, tmp_path):
    """No session uses uv: where there is none, nox does not say so on every session."""
    if importlib.util.find_spec("uv") is not None or "UV" in os.environ:
        pytest.skip("uv is installed beside nox here")
    mine = user_python(tmp_path / "mine")
    result = nox(repo, *ESTIMATE, path=[mine.parent])
    assert result.returncode == 0, result.stderr
    assert "Running session estimate" in result.stderr
    assert "uv binary" not in result.stderr


def test_a_stage_reads_relative_paths_from_where_nox_was_started(repo, tmp_path):
    """`nox -f ../noxfile.py -s merge -- a.csv ...` from a subfolder: a.csv is the one in that
    subfolder, as in your shell; nox (which moves to the noxfile's folder) says where."""
    stand_in = executable(tmp_path / "bin" / "python3", '#!/bin/sh\necho "cwd: $(pwd)"\n')
    here = repo / "here"
    here.mkdir()
    args = ["-f", "../noxfile.py", "-s", "merge", "--", "a.csv", "b.csv", "--output", "c.csv"]
    result = nox(repo, *args, path=[stand_in.parent], cwd=here)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"cwd: {here}"]
    assert f"nox > cd {here}" in result.stderr
    result = nox(
        repo, "-s", "merge", "--", "a.csv", "b.csv", "--output", "c.csv", path=[stand_in.parent]
    )
    assert result.stdout.splitlines() == [f"cwd: {repo}"]
    assert "nox > cd " not in result.stderr  # from the repository root: nothing to say


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
@pytest.mark.parametrize(
    ("installed", "wanted"),
    [
        (
            ["system", "2.7.18", "3.10.2", "3.10.13", "3.11.7", "3.12.1", "3.13.0", "3.14.0"],
            "3.11.7:3.10.13:3.12.1:3.13.0",
        ),
        (["3.12.1", "3.11.7"], "3.11.7:3.12.1"),  # 3.10 and 3.13 missing: nox fails them
        ([], None),
    ],
)
def test_make_test_puts_pyenvs_kit_pythons_on_path_as_ci_does(repo, tmp_path, installed, wanted):
    """`make test` itself, not only .ci/run, finds pyenv's 3.10-3.13 (3.11 first, the newest
    patch of each); without pyenv or with none of them, PYENV_VERSION is left alone."""
    shutil.copytree(ROOT / ".ci", repo / ".ci")
    fake = tmp_path / "fake"
    listing = "".join(f"echo {v}\n" for v in installed)
    executable(fake / "pyenv", f"#!/bin/sh\n{listing}")
    executable(fake / "nox", '#!/bin/sh\necho "PYENV_VERSION=${PYENV_VERSION-unset} nox $*"\n')
    environ = {k: v for k, v in os.environ.items() if k != "PYENV_VERSION"}
    environ["PATH"] = os.pathsep.join([str(fake), os.defpath])
    made = subprocess.run(
        ["make", "-s", "-C", str(repo), "test"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    shown = [] if wanted is None else [f"Python versions on PATH: {wanted}"]
    prefix = "" if wanted is None else f"PYENV_VERSION={wanted} "
    assert made.stdout.splitlines() == [
        *shown,
        f"{prefix}nox -s kit > .nox/kit-sessions.log (beside the suite: shown after it)",
        f"{prefix}nox -s lint tests",
        f"PYENV_VERSION={wanted or 'unset'} nox -s lint tests",
        f"PYENV_VERSION={wanted or 'unset'} nox -s kit",  # the kit's log, after the suite
    ]


@pytest.mark.parametrize(("suite", "kit"), [(0, 0), (0, 1), (3, 0), (3, 1)])
def test_make_test_fails_when_the_suite_or_the_kit_sessions_fail(repo, tmp_path, suite, kit):
    """The kit sessions run beside the suite: either failing fails make test, each failure
    is named in a line, and the kit's output is shown after the suite's either way."""
    fake = tmp_path / "fake"
    executable(
        fake / "nox",
        f'#!/bin/sh\ncase "$*" in *kit*) echo "kit said this"; exit {kit};; esac\n'
        f'echo "suite said this"; exit {suite}\n',
    )
    environ = {k: v for k, v in os.environ.items() if k != "PYENV_VERSION"}
    environ["PATH"] = os.pathsep.join([str(fake), os.defpath])  # no pyenv there
    made = subprocess.run(
        ["make", "-s", "-C", str(repo), "test"], env=environ, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert (made.returncode == 0) == (suite == kit == 0)
    assert made.stdout.splitlines()[-2:] == ["suite said this", "kit said this"]
    named = [line for line in made.stderr.splitlines() if line.startswith("make test: ")]
    assert named == [
        *(["make test: the kit sessions failed (output above)"] if kit else []),
        *(["make test: lint or the suite failed"] if suite else []),
    ]
    assert (repo / ".nox" / "kit-sessions.log").read_text() == "kit said this\n"


def test_gpu_tests_runs_the_shared_half_then_the_whole_gpu_half(repo, tmp_path):
    """Two pytest runs on your Python, in this order: the GPU tests that share the GPU on 8
    processes, then those that need it whole (the check that it has pytest, pytest-xdist
    and torch prints nothing)."""
    python = echo_python(tmp_path / "bin")
    result = nox(repo, "-s", "gpu-tests", "--", "-q", path=[python.parent])
    assert result.returncode == 0, result.stderr
    runs = [line for line in result.stdout.splitlines() if line.startswith("arg: ")]
    shared = ["-m", "pytest", "-m", "gpu", "--gpu-shared", "-n", "8", "-q"]
    whole = ["-m", "pytest", "-m", "gpu_whole", "-q"]
    assert runs == [f"arg: {a}" for a in shared + whole]


@pytest.mark.parametrize("own", [None, "/somewhere/else"])
def test_gpu_tests_keep_their_bytecode_in_one_folder_made_once(repo, tmp_path, own):
    """The GPU tests' interpreters read and write bytecode in one folder (the lab's, under
    .nox/, unless you set your own), with PYTHONDONTWRITEBYTECODE off for them: where the
    GPU Python's packages carry none, each fresh interpreter would compile torch again."""
    folder = tmp_path / "bin"
    executable(
        folder / "python3",
        '#!/bin/sh\necho "prefix: $PYTHONPYCACHEPREFIX"\necho "dont: [$PYTHONDONTWRITEBYTECODE]"\n',
    )
    env = {"PYTHONDONTWRITEBYTECODE": "1", **({"PYTHONPYCACHEPREFIX": own} if own else {})}
    result = nox(repo, "-s", "gpu-tests", path=[folder], env=env)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith(("prefix", "dont"))]
    expected = own or str(repo / ".nox" / "gpu-pycache")
    assert said == [f"prefix: {expected}", "dont: []"] * 2  # both pytest runs


def test_gpu_tests_without_pytest_xdist_is_one_line_naming_the_pins(repo, tmp_path):
    python = echo_python(tmp_path / "bin")
    result = nox(repo, "-s", "gpu-tests", path=[python.parent], env={"STAGE_EXIT": "1"})
    assert result.returncode == 2
    assert error_lines(result, "gpu-tests") == [
        f"nox -s gpu-tests: error: {python} cannot import pytest, pytest-xdist or torch: with "
        f"torch there, {python} -m pip install pytest==9.2.0 pytest-xdist==3.8.0"
    ]
    assert "arg: gpu" not in result.stdout  # no pytest run


# ------------------------------------------------------------- the test environment's torch


@functools.cache
def load_noxfile():
    """Loaded once: loading registers its sessions with nox, twice is warned of."""
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CPU_WHEEL = "file:///wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
REPORTS = {  # what pip's dry run prints: the wheel the tests session installs, or None
    "a local CPU wheel": ({"install": [{"metadata": {"requires_dist": ["filelock"]},
                                         "download_info": {"url": CPU_WHEEL}}]}, CPU_WHEEL),
    "a local CUDA wheel": ({"install": [{"metadata": {"requires_dist": [
        'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"']},
        "download_info": {"url": CPU_WHEEL}}]}, None),
    "no requirements at all": ({"install": [{"metadata": {},
                                             "download_info": {"url": CPU_WHEEL}}]}, CPU_WHEEL),
    "a wheel from a server": ({"install": [{"metadata": {"requires_dist": []},
        "download_info": {"url": "https://example.org/torch-2.13.0.whl"}}]}, None),
    "nothing found": ({"install": []}, None),
    "not JSON": ("ERROR: No matching distribution found for torch==2.13.0", None),
}  # fmt: skip


@pytest.mark.parametrize("case", REPORTS)
def test_the_cpu_index_is_skipped_only_for_a_local_cpu_wheel(tmp_path, case):
    """The tests session takes torch from PyTorch's CPU index unless pip, asked with no index
    at all, names a wheel file on this machine that needs none of NVIDIA's packages."""
    report, wanted = REPORTS[case]
    text = report if isinstance(report, str) else json.dumps(report)
    (tmp_path / "report").write_text(text)
    args = tmp_path / "args"
    executable(tmp_path / "python", f'#!/bin/sh\necho "$@" > {args}\ncat {tmp_path / "report"}\n')
    noxfile = load_noxfile()
    assert noxfile.local_cpu_build(SimpleNamespace(bin=str(tmp_path))) == wanted
    asked = args.read_text().split()
    assert asked[:3] == ["-m", "pip", "install"]
    assert {"--no-index", "--dry-run", "--no-deps"} <= set(asked)
    assert asked[-1] == "torch==2.13.0"


def test_the_gpu_runs_collect_every_file_that_holds_a_gpu_test():
    """nox -s gpu-tests hands pytest the files that mark a GPU test (gpu_test_files), so that
    its processes do not collect the CPU tests: pytest itself must find no GPU test elsewhere.
    Where this process collected every test file, its own collection answers; else pytest is
    asked again, in a process of its own."""
    every = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")}
    if every <= {nodeid.split("::")[0] for nodeid in COLLECTED}:
        found = {nodeid.split("::")[0] for nodeid, gpu in COLLECTED.items() if gpu}
    else:
        collected = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
             "-m", "gpu or gpu_whole", "tests"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert collected.returncode == 0, collected.stdout[-2000:]
        found = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    assert len(found) >= 9  # the test reads pytest's listing, not an empty one
    assert found == set(load_noxfile().gpu_test_files())
