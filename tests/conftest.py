"""Shared helpers: the repository's paths and a way to run a stage as its own process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# No test may depend on the machine's speed: a loaded CI host is not a failure. Timing claims
# live in tests/benchmarks/, which print ratios measured side by side.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipeline"
SCHEMAS = ROOT / "schemas"
RUNS = ROOT / "runs"
# pytest finds `pipeline` from the root (pyproject's pythonpath); the commands the tests start
# find it as nox's stages do, through PYTHONPATH.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
)
# The kit's two scripts run by their path, as the kit's users run them; every other command
# as `python -m` runs it.
KIT_SCRIPTS = ("mesure_memoire.py", "calcul_forfaits.py")


def command(script: str) -> list[str]:
    """How a test starts a command named by its file's name (`own_model.py`)."""
    if script == "mesure_memoire.py":
        return [str(ROOT / "kit" / script)]  # generated, kept out of the package
    if script in KIT_SCRIPTS:
        return [str(PIPELINE / script)]
    (path,) = PIPELINE.glob(f"*/{script}")
    return ["-m", ".".join(path.relative_to(ROOT).with_suffix("").parts)]


def run_script(script: str, *args: str, python: str = sys.executable, flags=(), env=None, cwd=None):
    """Run a pipeline command in a fresh interpreter; returns the CompletedProcess (text)."""
    if env is not None and str(ROOT) not in env.get("PYTHONPATH", "").split(os.pathsep):
        env = {
            **env,
            "PYTHONPATH": os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)])),
        }
    return subprocess.run(
        [python, *flags, *command(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def call_main(main, *args: str, cwd=None) -> subprocess.CompletedProcess:
    """A command's main(argv) in this process, its output captured: for what a command says.
    The command line itself (the interpreter's exit code, pipes, a terminal, what a fresh
    interpreter imports) stays with run_script, which pays `import torch` each time (1.5 to
    2.5 s of a 2-core machine)."""
    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    try:
        os.chdir(cwd or before)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def run_unread(script: str, *args: str) -> tuple[bytes, int]:
    """A pipeline command whose reader leaves before it writes (`| head -1`): its stderr and
    exit code."""
    process = subprocess.Popen(
        [sys.executable, *command(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()
    try:
        return process.stderr.read(), process.wait(timeout=120)
    finally:
        process.stderr.close()


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_addoption(parser):
    parser.addoption(
        "--gpu-shared",
        action="store_true",
        help="GPU tests on several processes at once (-n N), leaving out those marked "
        "gpu_whole, which fill the GPU to out-of-memory: run them after, alone (nox -s gpu-tests)",
    )


# Every test this process collected, before -m and -k deselect any: its id -> whether it is
# marked gpu or gpu_whole (test_noxfile reads it instead of collecting the suite again).
COLLECTED: dict[str, bool] = {}


def pytest_itemcollected(item):
    COLLECTED[item.nodeid] = any(m.name in ("gpu", "gpu_whole") for m in item.iter_markers())


def pytest_collection_modifyitems(config, items):
    """GPU tests run where a GPU is visible, one after another on one test process (those
    that run to out-of-memory would starve the others), or with --gpu-shared all at once
    but for those; they are skipped, saying why, where no GPU is visible."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if config.getoption("gpu_shared"):
        whole = [item for item in gpu_items if "gpu_whole" in item.keywords]
        if whole:
            config.hook.pytest_deselected(items=whole)
            items[:] = [item for item in items if "gpu_whole" not in item.keywords]
            gpu_items = [item for item in gpu_items if "gpu_whole" not in item.keywords]
    else:
        for item in gpu_items:
            item.add_marker(pytest.mark.xdist_group("gpu"))
    if not gpu_items or cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible to PyTorch (GPU tests run on a GPU host)")
    for item in gpu_items:
        item.add_marker(skip)


def outside_python(folder: Path) -> Path:
    """This interpreter under a name outside .nox/: the noxfile refuses interpreters nox
    built for GPU stages, and the tests themselves run in one."""
    import shlex

    python = Path(folder) / "python3"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return python


def on_a_terminal(script: str, *args: str) -> tuple[int, str, list[str]]:
    """A pipeline command whose stderr is a pseudo-terminal, its stdout a pipe: (exit code,
    stdout, the progress lines it wrote and rewrote). Each line must begin by clearing the
    one before ("\\r\\x1b[K"), and the command must end with a clear: only the answer stays."""
    import pty

    master, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, *command(script), *args],
        stdout=subprocess.PIPE, stderr=terminal, cwd=ROOT,
    )  # fmt: skip
    os.close(terminal)
    said = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # Linux: EIO once the other end is closed
            break
        if not chunk:
            break
        said += chunk
    os.close(master)
    out = process.stdout.read().decode()
    code = process.wait()
    pieces = said.decode().split("\r\x1b[K")
    assert pieces[0] == "", pieces[0]  # nothing but the progress line
    assert pieces[-1] == "", pieces[-1]  # the last clear
    return code, out, pieces[1:-1]


def requests_between_frees(events) -> list:
    """Allocator events, (action, bytes), as requests' blocks in order and, between two
    requests, the blocks freed as one sorted group (a trace tells frees at the next
    operator); what the end frees is left out. The grouping every measurement's own check
    makes (history_check.grouped), in the tests' shape: ("alloc", bytes), ("free", [bytes])."""
    from pipeline.predicting import history_check

    grouped = history_check.grouped([(action, nbytes, None) for action, nbytes in events])
    return [
        (action, sizes[0]) if action == "alloc" else (action, list(sizes))
        for action, sizes, _ in grouped
    ]


def gpu_requests(function) -> list:
    """The GPU allocator's history of `function("cuda")`, (action, bytes), after one call to
    warm it (cuBLAS's workspaces, kept, are made once per thread)."""
    import torch

    from pipeline.core import torch_private

    function("cuda")
    torch.cuda.synchronize()
    torch_private.record_memory_history(torch, context=None, stacks="python")
    before = len(torch_private.memory_snapshot(torch)["device_traces"][0])
    kept = function("cuda")
    del kept
    torch.cuda.synchronize()
    events = torch_private.memory_snapshot(torch)["device_traces"][0][before:]
    torch_private.stop_memory_history(torch)
    wanted = ("alloc", "free_completed")
    return [(event["action"], event["size"]) for event in events if event["action"] in wanted]


def replayed_requests(trace) -> list:
    """The trace replayed with the H200's calibration (its kernels' scratch and copies
    included, the workspaces a warm GPU keeps aside), as requests_between_frees gives them."""
    from pipeline.predicting import gpu_calibration
    from pipeline.predicting import trace_prediction as tp

    calibration, _ = gpu_calibration.load("h200")
    log = tp.replay(trace, calibration)[1]
    events = [(kind, nbytes) for kind, nbytes, what in log[1:] if "kept" not in what]
    return requests_between_frees(events)
