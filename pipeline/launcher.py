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
"""

from __future__ import annotations

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


def _child(argv: list[str]) -> None:
    """Runs in the forked child: the kit script's own main, nothing else."""
    import mesure_memoire
    import torch

    if torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork():
        print("launcher: CUDA was initialised before the fork: refusing", file=sys.stderr)
        raise SystemExit(2)
    mesure_memoire.PROCESS_START = FORKED
    raise SystemExit(mesure_memoire.main(argv))


class Launcher:
    """Starts `mesure_memoire.py` commands in fresh processes; forked when possible."""

    def __init__(self, fork: bool = True) -> None:
        self.context = None
        if fork and "forkserver" in multiprocessing.get_all_start_methods():
            self.context = multiprocessing.get_context("forkserver")
            self.context.set_forkserver_preload(["torch", "mesure_memoire", "launcher"])
            # the server imports torch now, while this process goes on with other work
            from multiprocessing import forkserver

            if str(PIPELINE) not in sys.path:
                sys.path.insert(0, str(PIPELINE))
            forkserver.ensure_running()
        self.mode = FORKED if self.context else FRESH

    def start(self, argv: list[str]):
        """Start one command; returns a handle whose wait() gives its exit code."""
        if self.context is None:
            return _Fresh(subprocess.Popen([sys.executable, str(SCRIPT), *argv]))
        process = self.context.Process(target=_child, args=(list(argv),))
        process.start()
        return _Forked(process)

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


class _Forked:
    def __init__(self, process) -> None:
        self.process = process

    def wait(self) -> int:
        self.process.join()
        code = self.process.exitcode
        return 128 - code if code < 0 else code  # killed by a signal: shell convention
