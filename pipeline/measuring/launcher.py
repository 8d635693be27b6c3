"""Fresh processes for the measuring scripts' commands, forked from a server that imported torch.

What it guarantees:
- this process never imports torch; the fork server imports it and never touches CUDA, and
  a child that finds CUDA initialised before its fork refuses (exit 2);
- a child started `after` an earlier one measures only once that process has exited: its
  fork and CUDA driver start overlap that exit, never its measurement;
- every child is waited for, and a child whose parent stops before saying "measure"
  measures nothing.
Without fork (or with fork=False) each command is a fresh interpreter; the environment
record of every measurement says which way its process started. A command is one of the
kit script `mesure_memoire.py` (the seed network, the default), `decoder.py` (the decoder
workload) or `own_model.py` (a user's workload file), each by its module
(workload_kinds): all are standard library until they measure, so the fork server imports
any of them (own_model.py imports the user's file only in the child). The kit script is run,
never imported by a pipeline module: the fork server loads it for the children that run it.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import subprocess
import sys
from multiprocessing import forkserver
from pathlib import Path
from typing import Protocol

from pipeline.core import arguments, environment_capture, torch_private, workload_kinds

ROOT = Path(__file__).resolve().parents[2]  # where `pipeline` is found
SCRIPT = workload_kinds.NETWORK.script
# what a child may run, by script name: each module has main(argv, process_start)
MODULES = {kind.script: kind.module for kind in workload_kinds.KINDS}
SCRIPTS = tuple(MODULES)
FORKED = "forked from a server that had imported torch and never initialised CUDA"
FRESH = environment_capture.FRESH_INTERPRETER
HOLD_SECONDS = 5  # a child that has reported waits this long at most to be let go
# What parent and child say on the child's pipe, in this order.
READY, MEASURE, EXIT = "ready", "measure", "exit"
COUNT_GPUS = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


class Child(Protocol):
    """A started command, forked or fresh."""

    def result(self) -> int:
        """Its exit code once its files are written (a forked child then holds its exit)."""
        ...

    def wait(self) -> int:
        """Let it exit and wait for it: its exit code. Call it for every child."""
        ...


def with_root(path: str | None) -> str:
    """A PYTHONPATH that finds `pipeline` first, wherever the child starts."""
    return os.pathsep.join([str(ROOT), *([path] if path else [])])


# ---------------------------------------------------------------- in the forked child


def _forked_child(argv: list[str], parent, script: str = SCRIPT) -> None:
    """The child's side of the hand-over, in the order it happens. It says READY, starts the
    CUDA driver (a context would hold GPU memory) and waits for MEASURE; it runs the kit
    script, sends the exit code once the files are written, then holds its exit (the CUDA
    context's teardown) until EXIT, so that the next child is forked before it."""
    torch = sys.modules.get("torch")  # the server's import; if it failed, main() says why
    if torch is not None and (torch.cuda.is_initialized() or torch_private.cuda_in_bad_fork(torch)):
        print("launcher: CUDA was initialised before the fork: refusing", file=sys.stderr)
        raise SystemExit(2)
    parent.send(READY)
    if torch is not None:
        with contextlib.suppress(Exception):  # no GPU or driver: main() says so
            torch.cuda.init()
    try:
        told = parent.recv()
    except (EOFError, KeyboardInterrupt):
        told = None
    if told != MEASURE:  # the parent stopped first
        raise SystemExit(130)
    main = importlib.import_module(MODULES[script]).main  # imported by the server already
    code = main(argv, process_start=FORKED)
    with contextlib.suppress(OSError, KeyboardInterrupt):  # a parent gone: the status says it
        parent.send(code)
        parent.poll(HOLD_SECONDS)
    raise SystemExit(code)


def _count_gpus(parent) -> None:
    """In a forked child: torch.cuda would start the driver, which no later fork survives."""
    import torch

    parent.send(torch.cuda.device_count() if torch.cuda.is_available() else 0)


# ---------------------------------------------------------------- in this process


def _start_server(context) -> None:
    """The server imports torch now, while this process goes on. multiprocessing runs this
    process's main script again in every child, so the server also imports the pipeline
    modules imported here, and that run finds them loaded (about 0.1 s a child); and the kit
    script, which no pipeline module imports, so that a child runs it loaded. Before
    Python 3.12.8 and 3.13.1 the server ignores sys.path (CPython gh-117378): PYTHONPATH
    carries the repository root to it, as that fix advises."""
    ours = {name for name in list(sys.modules) if name.startswith("pipeline.")}
    context.set_forkserver_preload(["torch", *sorted(ours | {MODULES[SCRIPT]})])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = with_root(saved)
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


class Launcher:
    """Starts commands of SCRIPTS in fresh processes, forked when possible."""

    def __init__(self, fork: bool = True) -> None:
        self.context = None
        if fork and "forkserver" in multiprocessing.get_all_start_methods():
            self.context = multiprocessing.get_context("forkserver")
            _start_server(self.context)
        self.mode = FORKED if self.context else FRESH

    def start(self, argv: list[str], after: Child | None = None, script: str = SCRIPT) -> Child:
        """Start one command of `script`; with `after` (an earlier child that has reported),
        returns once that one has exited, the new one having been forked first."""
        if script not in SCRIPTS:
            raise ValueError(f"the launcher runs {', '.join(SCRIPTS)}, not {script}")
        if self.context is None:
            if after is not None:
                after.wait()
            command = [sys.executable, "-m", MODULES[script], *argv]
            environment = {**os.environ, "PYTHONPATH": with_root(os.environ.get("PYTHONPATH"))}
            return _Fresh(subprocess.Popen(command, env=environment))
        connection, child_end = self.context.Pipe()
        process = self.context.Process(target=_forked_child, args=(list(argv), child_end, script))
        try:
            process.start()
        except (EOFError, ConnectionError):  # the server died: import torch raised, not ImportError
            raise arguments.UsageError(
                f"the fork server of {sys.executable} stopped: PyTorch failed to import (above)"
            ) from None
        finally:
            child_end.close()  # the child holds the only other end: EOF if it dies
        try:
            with contextlib.suppress(EOFError):  # dead already: result() gives its status
                connection.recv()  # READY: forked and running
            if after is not None:
                after.wait()
            with contextlib.suppress(OSError):
                connection.send(MEASURE)
        except BaseException:  # Ctrl-C: without MEASURE, the child measures nothing
            connection.close()
            process.join()
            raise
        return _Forked(process, connection)

    def run(self, argv: list[str], script: str = SCRIPT) -> int:
        return self.start(argv, script=script).wait()

    def count_gpus(self) -> int | None:
        """GPUs PyTorch sees, counted in a child; None when the child could not say."""
        if self.context is None:
            probe = subprocess.run(
                [sys.executable, "-c", COUNT_GPUS], capture_output=True, text=True
            )
            text = probe.stdout.strip()
            return int(text) if probe.returncode == 0 and text.isdigit() else None
        connection, child_end = self.context.Pipe()
        process = self.context.Process(target=_count_gpus, args=(child_end,))
        process.start()
        child_end.close()
        try:
            return connection.recv()
        except EOFError:
            return None
        finally:
            connection.close()
            process.join()


class _Fresh(Child):
    """A fresh interpreter: it reports by exiting."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    def result(self) -> int:
        return self.popen.wait()

    def wait(self) -> int:
        return self.popen.wait()


class _Forked(Child):
    """A forked child and the parent's end of its pipe (the messages: _forked_child)."""

    def __init__(self, process, connection) -> None:
        self.process, self.connection = process, connection
        self.code: int | None = None

    def result(self) -> int:
        if self.code is None and not self.connection.closed:
            with contextlib.suppress(EOFError):  # died before reporting: its status says how
                self.code = self.connection.recv()
        return self.wait() if self.code is None else self.code

    def wait(self) -> int:
        if not self.connection.closed:
            with contextlib.suppress(OSError):
                self.connection.send(EXIT)
            self.connection.close()
        self.process.join()
        code = self.process.exitcode
        return 128 - code if code < 0 else code  # killed by a signal: the shell's convention
