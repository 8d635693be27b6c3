"""Fresh measurement processes at the price of CUDA start-up, not of `import torch`.

The spec wants every measurement in a fresh process (its own CUDA context, its own caching
allocator, counters starting from zero). A fresh interpreter pays `import torch` each time,
seconds on a GPU host. A multiprocessing *forkserver* that has imported torch (and never
touched CUDA) forks a child per measurement instead: the child gets a new process, a new
CUDA context and a new allocator, but torch is already imported.

Rules that keep the children fresh:
- this process never imports torch, and the server only imports it: nothing here calls
  torch.cuda (is_available() and device_count() would initialise the driver, and CUDA does
  not survive a fork); each child checks that it did not inherit an initialised CUDA;
- where the platform has no fork (spawn-only), each measurement runs in a fresh interpreter
  instead, and the measurement's environment block says which way it was started.

Two costs are kept off a sweep's critical path (measured on an H200: README, issue notes):
- multiprocessing re-runs the parent's main script in every child (as `__mp_main__`); the
  server therefore also preloads the pipeline modules the parent had imported (record,
  validate, jsonschema, yaml for a sweep), so that re-run finds them already imported;
- a child's exit destroys its CUDA context (about 0.1 s), and a fork made meanwhile was
  seen to wait for it. So a child that has written its files holds its exit until wait();
  `start(argv, after=earlier)` forks the next child first, then lets the earlier one exit
  while the new one starts the CUDA driver (no context, no GPU memory), and lets the new
  one create its context and measure only once the earlier process is gone.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import subprocess
import sys
from pathlib import Path

PIPELINE = Path(__file__).resolve().parent
SCRIPT = PIPELINE / "mesure_memoire.py"
FORKED = "forked from a server that had imported torch and never initialised CUDA"
FRESH = "fresh interpreter"


def _count_gpus(connection) -> None:
    """Runs in a forked child: the parent must never ask torch.cuda itself."""
    import torch

    connection.send(torch.cuda.device_count() if torch.cuda.is_available() else 0)


COUNT_GPUS = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


HOLD_SECONDS = 5  # a child waits this long at most for the word to exit


def _child(argv: list[str], gate, done) -> None:
    """Runs in the forked child: the kit script's own main. Sends its exit code on `done`
    once its files are written, then holds its exit until told (or HOLD_SECONDS). With a
    `gate`, it says it is running, starts the CUDA driver, and measures only on the word."""
    import mesure_memoire
    import torch

    if torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork():
        print("launcher: CUDA was initialised before the fork: refusing", file=sys.stderr)
        raise SystemExit(2)
    if gate is not None:
        gate.send("running")
        # the driver only: no context, no memory on any GPU; no GPU or driver: main() says so
        with contextlib.suppress(Exception):
            torch.cuda.init()
        try:
            gate.recv()
        except (EOFError, KeyboardInterrupt):  # the parent stopped: measure nothing
            raise SystemExit(130) from None
    code = mesure_memoire.main(argv, process_start=FORKED)
    with contextlib.suppress(OSError):  # a parent gone: the exit status still says it
        done.send(code)
        done.poll(HOLD_SECONDS)
    raise SystemExit(code)


def _preload() -> list[str]:
    """torch, and the pipeline modules this process has imported (see the module's notes)."""
    ours = [
        name
        for name, module in list(sys.modules.items())
        if Path(getattr(module, "__file__", None) or "/").parent == PIPELINE and name != "__main__"
    ]
    return ["torch", *sorted({"mesure_memoire", "launcher", *ours})]


class Launcher:
    """Starts `mesure_memoire.py` commands in fresh processes; forked when possible."""

    def __init__(self, fork: bool = True) -> None:
        self.context = None
        if fork and "forkserver" in multiprocessing.get_all_start_methods():
            self.context = multiprocessing.get_context("forkserver")
            self.context.set_forkserver_preload(_preload())
            # the server imports torch now, while this process goes on with other work
            from multiprocessing import forkserver

            if str(PIPELINE) not in sys.path:
                sys.path.insert(0, str(PIPELINE))
            forkserver.ensure_running()
        self.mode = FORKED if self.context else FRESH

    def start(self, argv: list[str], after=None):
        """Start one command; returns a handle: result() gives its exit code once its files
        are written, wait() lets the process exit and waits for it (always call it). With
        `after` (an earlier handle), returns once that process has exited, the new one
        having been forked before it began to exit."""
        if self.context is None:
            if after is not None:
                after.wait()
            return _Fresh(subprocess.Popen([sys.executable, str(SCRIPT), *argv]))
        gate, gate_child = self.context.Pipe() if after else (None, None)
        done, done_child = self.context.Pipe()
        process = self.context.Process(target=_child, args=(list(argv), gate_child, done_child))
        process.start()
        done_child.close()  # the child holds the only other end: EOF if it dies early
        if after is not None:
            gate_child.close()
            try:
                with contextlib.suppress(EOFError):
                    gate.recv()  # forked and running: the earlier one may exit now
                after.wait()
                with contextlib.suppress(OSError):
                    gate.send("measure")
            finally:
                gate.close()  # without the word, the child measures nothing and exits
        return _Forked(process, done)

    def run(self, argv: list[str]) -> int:
        return self.start(argv).wait()

    def count_gpus(self) -> int | None:
        """GPUs PyTorch sees, counted in a child; None when the child could not say."""
        if self.context is None:
            probe = subprocess.run(
                [sys.executable, "-c", COUNT_GPUS], capture_output=True, text=True
            )
            text = probe.stdout.strip()
            return int(text) if probe.returncode == 0 and text.isdigit() else None
        receiver, sender = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_count_gpus, args=(sender,))
        process.start()
        sender.close()
        try:
            return receiver.recv()
        except EOFError:
            return None
        finally:
            process.join()


class _Fresh:
    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    def wait(self) -> int:
        return self.popen.wait()

    result = wait  # a fresh interpreter reports by exiting


class _Forked:
    def __init__(self, process, done) -> None:
        self.process, self.done = process, done

    def result(self) -> int:
        if self.done.closed:
            return self.wait()
        try:
            return self.done.recv()
        except EOFError:  # it died before reporting: its exit status says how
            return self.wait()

    def wait(self) -> int:
        if not self.done.closed:
            with contextlib.suppress(OSError):
                self.done.send("exit")
            self.done.close()
        self.process.join()
        code = self.process.exitcode
        return 128 - code if code < 0 else code  # killed by a signal: shell convention
