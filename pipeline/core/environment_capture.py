"""What ran a measurement: Python, PyTorch and its build, the GPU, the driver; nothing personal.

Every measuring stage records its environment through collect_environment and writes it with
environment_document, so every environment.json reads alike (its tool is the kit script's
TOOL, whichever stage captured it). The vendor's tool and the CUDA driver are started early,
in a subprocess and a thread, to overlap `import torch`; import_torch is the exit-2 guard.

A core module of the kit script (make_kit_script.py says how): standard library only,
Python >= 3.10, PyTorch imported inside the functions that need it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from pipeline.core.arguments import UsageError
from pipeline.core.writers import document_head

TOOL = {"name": "mesure_memoire.py", "version": "1.0.0"}
ENVIRONMENT_SCHEMA = "urn:iteragpu-lab:schema:environment:v1"
# How the measuring process was started, recorded in environment.process_start: `main`'s
# default; the pipeline's launcher passes its own for the children it forks.
FRESH_INTERPRETER = "fresh interpreter"


def start_driver_query() -> tuple[str, subprocess.Popen] | None:
    """Ask the vendor's tool for the driver version; started early, read later, so the
    subprocess overlaps `import torch` instead of adding to it."""
    commands = {
        "nvidia-smi": ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        "rocm-smi": ["rocm-smi", "--showdriverversion", "--json"],
    }
    for tool, command in commands.items():
        executable = shutil.which(tool)
        if executable is None:
            continue
        try:
            process = subprocess.Popen(
                [executable, *command[1:]],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        except OSError:
            continue
        return tool, process
    return None


def finish_driver_query(query: tuple[str, subprocess.Popen] | None) -> dict:
    """The driver block: which tool said what. PyTorch's CUDA/HIP version is not the driver."""
    if query is None:
        return {"tool": None, "version": None, "error": "no nvidia-smi or rocm-smi on PATH"}
    tool, process = query
    try:
        out, _ = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"tool": tool, "version": None, "error": f"{tool} did not answer within 15 s"}
    if process.returncode != 0:
        return {"tool": tool, "version": None, "error": f"{tool} exited {process.returncode}"}
    version = None
    if tool == "nvidia-smi":
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        version = lines[0] if lines else None
    else:
        try:
            for card in json.loads(out).values():
                version = version or card.get("Driver version")
        except (ValueError, AttributeError):
            version = None
    if not version or not re.fullmatch(r"[0-9A-Za-z.\-_+]{1,64}", version):
        return {"tool": tool, "version": None, "error": f"{tool} gave no readable version"}
    return {"tool": tool, "version": version}


def start_cuda_driver(index: int):
    """Start the CUDA driver and GPU `index`'s primary context in a thread, while this thread
    imports torch (seconds): they do not depend on each other, so the context is ready when
    PyTorch asks for it. PyTorch then uses that very context (one primary context per GPU
    and process). Where there is no CUDA driver (ROCm, no GPU), the thread does nothing and
    PyTorch reports what is missing, as before. Returns what stop_cuda_driver() needs."""
    import ctypes
    import threading

    held: dict = {}

    def start() -> None:
        try:
            driver = ctypes.CDLL("libcuda.so.1")
            release = driver.cuDevicePrimaryCtxRelease_v2
            device, context = ctypes.c_int(), ctypes.c_void_p()
            if driver.cuInit(0) or driver.cuDeviceGet(ctypes.byref(device), index):
                return
            if driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0:
                held["release"] = lambda: release(device)
        except (OSError, AttributeError):  # no libcuda, or one older than CUDA 11
            return

    thread = threading.Thread(target=start, name="cuda-driver-start", daemon=True)
    thread.start()
    return thread, held


def stop_cuda_driver(started) -> None:
    """Once PyTorch holds its own reference to the context, drop the thread's: the context
    then lives exactly as long as PyTorch's."""
    thread, held = started
    thread.join()
    if "release" in held:
        held.pop("release")()


# A path inside a message: a run of non-blank characters from a root, a home or a drive.
PATH_IN_TEXT = re.compile(r"""(?<![\w.])(?:~|[A-Za-z]:)?[\\/][^\s'"(),;:]*""")


def without_personal(text: str) -> str:
    """A message as it may be recorded: every path becomes <path> (its file name kept when
    it has an extension, e.g. <path>/libcudart.so.12), and the user's name becomes <user>."""

    def hide(match: re.Match) -> str:
        name = re.split(r"[\\/]", match.group(0).rstrip("/\\"))[-1]
        return f"<path>/{name}" if re.fullmatch(r"[\w+-]+\.[\w.+-]+", name) else "<path>"

    text = PATH_IN_TEXT.sub(hide, text)
    names = {Path.home().name}
    try:
        import pwd  # POSIX only

        names.add(pwd.getpwuid(os.getuid()).pw_name)
    except (ImportError, KeyError, OSError):
        pass
    for name in sorted(n for n in names if len(n) >= 2 and n not in ("root",)):
        text = re.sub(rf"(?<![\w]){re.escape(name)}(?![\w])", "<user>", text)
    return text


def import_torch():
    """The exit-2 guard: no PyTorch means no measurement, and no fake one. The message keeps
    the exception's type and text without paths or the user's name: it is recorded."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising OSError and friends
        detail = without_personal(f"{type(exc).__name__}: {exc}")
        raise UsageError(f"PyTorch is not importable ({detail})") from None
    return torch


def describe_torch(torch) -> dict:
    hip = getattr(torch.version, "hip", None)
    return {
        "available": True,
        "version": torch.__version__,
        "backend": "rocm" if hip else ("cuda" if torch.version.cuda else "cpu-only build"),
        "cuda_build": torch.version.cuda,
        "hip_build": hip,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def describe_device(torch, index: int) -> dict:
    """What the runtime says about the GPU: no UUID, serial or bus address."""
    properties = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    return {
        "index": index,
        "name": properties.name,
        "compute_capability": f"{properties.major}.{properties.minor}",
        "multiprocessors": properties.multi_processor_count,
        "total_memory_bytes": total,
        "free_memory_bytes_at_start": free,
        "allocator_backend": torch.cuda.get_allocator_backend(),
        "allocator_settings": allocator_settings(torch),
    }


def allocator_settings(torch) -> dict:
    """The allocator's settings as PyTorch parsed them (whatever variable or call set them),
    not the process environment: a setting PyTorch did not accept is not recorded as set."""
    try:
        reported = torch.cuda.memory._snapshot().get("allocator_settings")
    except (AttributeError, RuntimeError, TypeError) as exc:
        return {"error": f"not reported by this PyTorch ({type(exc).__name__})"}
    if not isinstance(reported, dict):
        return {"error": "not reported by this PyTorch (no allocator_settings in its snapshot)"}
    return reported


def collect_environment(
    index: int, requested: str, driver_query=None, process_start: str = FRESH_INTERPRETER
) -> dict:
    """What ran the measurement, nothing personal (no host name, user, path or GPU serial).
    Never raises for a missing PyTorch or GPU: it says so instead."""
    if driver_query is None:
        driver_query = start_driver_query()
    environment = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "platform": {"system": platform.system(), "machine": platform.machine()},
        "process_start": process_start,
        "requested_device": requested,
        "torch": {"available": False},
        "gpu": {"available": False},
    }
    try:
        torch = import_torch()
    except UsageError as exc:
        environment["torch"]["error"] = str(exc)
        environment["gpu"]["error"] = "not checked: PyTorch is not importable"
        torch = None
    if torch is not None:
        environment["torch"] = describe_torch(torch)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            environment["gpu"]["error"] = "PyTorch sees no GPU (torch.cuda.is_available() is False)"
        elif index >= count:
            environment["gpu"]["error"] = f"{requested} does not exist: PyTorch sees {count} GPU(s)"
        else:
            environment["gpu"] = {"available": True, "visible_count": count}
            environment["gpu"].update(describe_device(torch, index))
    environment["driver"] = finish_driver_query(driver_query)
    return environment


def environment_document(environment: dict) -> dict:
    return {**document_head(ENVIRONMENT_SCHEMA, TOOL), "environment": environment}
