"""IteraGPU Lab v1: estimate weight memory, record the environment, measure a synthetic network.

Three commands, one file, standard library only at module level (PyTorch is imported inside
the commands that need it, so `estimate` runs on any Python >= 3.10):

    python mesure_memoire.py estimate --parameters 7000000000 --bits 16 --reserve-gib 4
    python mesure_memoire.py environment --device cuda:0
    python mesure_memoire.py measure --device cuda:0 --batch 1 --context 16 --width 64 \
        --dtype float32 --warmup 1 --repeats 2 --output mesures-petit-essai.json

The synthetic network is `Linear(width, 4*width) -> GELU(exact) -> Linear(4*width, width)`.
It is not an LLM, not training, and not a benchmark of the GPU it runs on.

Exit codes: 0 ok; 2 bad input or missing prerequisite (no PyTorch, no GPU, output exists);
3 the GPU ran out of memory during `measure` (the file is written, status "out_of_memory").
"""

from __future__ import annotations

import argparse
import datetime
import enum
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Context, Decimal, InvalidOperation
from functools import partial
from pathlib import Path

TOOL = {"name": "mesure_memoire.py", "version": "1.0.0"}
ENVIRONMENT_SCHEMA = "urn:iteragpu-lab:schema:environment:v1"
MEASUREMENT_SCHEMA = "urn:iteragpu-lab:schema:measurement:v2"
ESTIMATE_SCHEMA = "urn:iteragpu-lab:schema:estimate:v1"

GIB = 2**30
GB = 10**9
HIDDEN_FACTOR = 4
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
EXIT_OK, EXIT_USAGE, EXIT_OOM = 0, 2, 3
# The measured configuration and its defaults: `measure`, `estimate --phases` and the
# pipeline's sweeps take the same options. The phases every run has, in order; then one
# warm_forward row per repetition.
CONFIGURATION_DEFAULTS = {
    "batch": 1,
    "context": 16,
    "width": 64,
    "dtype": "float32",
    "warmup": 1,
    "repeats": 2,
}
FIXED_PHASES = ("model_load", "inputs", "cold_forward", "warmup")
# How the measuring process was started, recorded in environment.process_start: `main`'s
# default; the pipeline's launcher passes its own for the children it forks.
FRESH_INTERPRETER = "fresh interpreter"

# The two Linear layers' keys in the nn.Sequential (GELU is "1"): the library blocks are
# calibrated and predicted per layer.
FIRST_LINEAR, SECOND_LINEAR = "0", "2"
COUNTER_KEYS = (
    "baseline_allocated_bytes",
    "baseline_reserved_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
)
# Dense datasheet peaks (vendor, SXM parts), for scale only: this network is not a benchmark.
DATASHEET_TFLOPS = {
    "NVIDIA H200": {"float32": 67, "float16": 989, "bfloat16": 989},
    "NVIDIA H100 80GB HBM3": {"float32": 67, "float16": 989, "bfloat16": 989},
}


# PyTorch's native CUDA caching allocator with its default settings (c10/cuda/
# CUDACachingAllocator.cpp): every block is a multiple of 512 bytes; requests up to 1 MiB
# come from 2 MiB "small" segments; larger ones from 20 MiB segments (under 10 MiB) or from
# segments rounded up to 2 MiB; a free block is reused best-fit and split only when the rest
# is at least 512 bytes (small pool) or more than 1 MiB (large pool), so a large request can
# be handed a whole block bigger than itself.
MIN_BLOCK, SMALL_SIZE, SMALL_SEGMENT = 512, 2**20, 2 * 2**20
LARGE_SEGMENT, MIN_LARGE_ALLOC, ROUND_LARGE = 20 * 2**20, 10 * 2**20, 2 * 2**20

# The device-side allocator settings the prediction models, in the names and values PyTorch
# reports (its memory snapshot's "allocator_settings"): no split limit, no garbage collection
# threshold, no expandable segments, no power-of-two rounding. Pinned-memory settings change
# host memory only. Other values change reserved counters the model does not follow.
MODELLED_ALLOCATOR = {
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
}

NOT_INCLUDED = (
    "Weights only. Not included: activations, KV cache, quantization metadata, gradients, "
    "optimizer state, CUDA/ROCm libraries and their workspaces, framework overhead. "
    "The reserve is the user's assumption, not a measured value. This does not predict "
    "whether a real model fits on a given card."
)
CLOCKS = {
    "wall_time_ns": (
        "time.perf_counter_ns() (host, monotonic), from just after the pre-operation "
        "synchronisation, baseline reading and peak reset to just after the post-operation "
        "synchronisation: includes Python overhead, kernel launches and the synchronisation."
    ),
    "event_time_ns": (
        "torch.cuda.Event elapsed_time between two events recorded on the device's current "
        "stream around the operation, converted from milliseconds (about 0.5 us resolution): "
        "the GPU timeline, including any idle gap while the host prepared work. "
        "Not an isolated kernel time."
    ),
}
COUNTERS = (
    "PyTorch caching-allocator counters (memory_allocated, memory_reserved, "
    "max_memory_allocated, max_memory_reserved) of this process on the chosen GPU only: not "
    "the whole GPU memory, not the CUDA context or driver, not other processes, not other "
    "GPUs. allocated is part of reserved: never add them. The two peaks are separate maxima: "
    "never subtract one from the other. Values depend on the allocator and software versions "
    "recorded in 'environment'."
)
PHASES_DOC = {
    "model_load": "build and initialise the model on the CPU, then move it to the GPU",
    "inputs": "create the synthetic input on the GPU",
    "cold_forward": "first forward pass after device, generator and input initialisation",
    "warmup": "all warm-up passes together, one row",
    "warm_forward": "one row per timed repetition after warm-up",
}


class RunStatus(str, enum.Enum):
    """How a measurement run ended (the document's `status`). The kit writes the first two;
    the pipeline's own-model runs and `estimate --json` files the other two."""

    COMPLETED = "completed"
    OUT_OF_MEMORY = "out_of_memory"  # the file is written; exit 3
    FAILED = "failed"  # the user's workload code raised: kept, never recorded as a measurement
    PREDICTED = "predicted"  # `estimate --json`: no GPU ran, the counters are a prediction

    def __str__(self) -> str:
        return self.value


class UsageError(Exception):
    """A bad input or a missing prerequisite: one line on stderr, exit 2, nothing written."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


# ---------------------------------------------------------------- value parsing


def _matched(text: str, pattern: str, expected: str) -> str:
    """The text when the whole of it matches `pattern`; else argparse's one-line refusal."""
    if not re.fullmatch(pattern, text):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return text


def positive_int(text: str) -> int:
    """Digits only: '1e9', '5.0', '+5' and '0' are refused rather than guessed at."""
    return int(_matched(text, r"0*[1-9][0-9]*", "a positive integer"))


def non_negative_decimal(text: str) -> Decimal:
    """A plain decimal number >= 0 ('4', '0.5'); no exponent, sign, NaN or infinity."""
    return Decimal(_matched(text, r"[0-9]{1,15}(\.[0-9]{1,15})?", "a decimal number >= 0"))


def non_negative_int(text: str) -> int:
    return int(_matched(text, r"[0-9]{1,18}", "an integer >= 0"))


def device_index(text: str) -> int:
    """`cuda` or `cuda:N`; ROCm builds of PyTorch use the same name. Never the CPU."""
    match = re.fullmatch(r"cuda(?::([0-9]+))?", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected a GPU device 'cuda' or 'cuda:N' (no CPU fallback), got {text!r}"
        )
    return int(match.group(1) or 0)


def add_defaulted(group, defaults: dict, what: dict, dtypes) -> None:
    """One option per entry of `defaults` (name: default), its help `what[name]` with the
    default shown: `dtype` chooses among `dtypes`, every other takes a positive integer."""
    for name, default in defaults.items():
        text = f"{what[name]} (default {default})" if name in what else f"(default {default})"
        kind = {"choices": sorted(dtypes)} if name == "dtype" else {"type": positive_int}
        group.add_argument("--" + name.replace("_", "-"), default=default, help=text, **kind)


# ---------------------------------------------------------------- estimate (no GPU)


def exact_ratio(numerator: int, denominator: int) -> Decimal:
    """numerator/denominator in decimal, exactly (denominators here are 2**30 and 10**9)."""
    context = Context(prec=len(str(numerator)) + 40, traps=[InvalidOperation])
    result = context.divide(Decimal(numerator), Decimal(denominator))
    assert result * denominator == numerator, "the division must be exact"
    return result


def estimate(parameters: int, bits: int, reserve_gib: Decimal) -> dict:
    """bytes = ceil(parameters * bits / 8), GiB = bytes / 2**30 and GB = bytes / 10**9, in
    exact decimals (no float ever rounds a figure a user compares with a card)."""
    weights_bytes = -(-parameters * bits // 8)
    weights_gib = exact_ratio(weights_bytes, GIB)
    total_context = Context(prec=len(str(weights_bytes)) + 80)
    return {
        "schema": ESTIMATE_SCHEMA,
        "parameters": parameters,
        "bits": bits,
        "weights_bytes": weights_bytes,
        "weights_gib": format(weights_gib, "f"),
        "weights_gb": format(exact_ratio(weights_bytes, GB), "f"),
        "reserve_gib": format(reserve_gib, "f"),
        "total_gib": format(total_context.add(weights_gib, reserve_gib), "f"),
        "numbers": "decimal strings, exact: GiB = 2**30 bytes, GB = 10**9 bytes",
        "not_included": NOT_INCLUDED,
    }


def rounded(text: str, places: int = 10) -> str:
    """Digits for reading (half-even); the JSON keeps the exact value."""
    context = Context(prec=len(text) + places + 2)
    digits = format(context.quantize(Decimal(text), Decimal(1).scaleb(-places)), "f")
    return digits.rstrip("0").rstrip(".") if "." in digits else digits


def print_estimate(result: dict) -> None:
    print(f"parameters      {result['parameters']}")
    print(f"bits            {result['bits']}")
    print(f"weights         {result['weights_bytes']} bytes")
    print(f"                {rounded(result['weights_gib'])} GiB (2**30 bytes)")
    print(f"                {rounded(result['weights_gb'])} GB (10**9 bytes)")
    print(f"reserve         {result['reserve_gib']} GiB (your assumption, not measured)")
    print(f"weights+reserve {rounded(result['total_gib'])} GiB")
    print(result["not_included"])


# ---------------------------------------------------------------- environment


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


def prediction_applicability(environment: dict) -> tuple[bool, str | None]:
    """The allocator model holds for PyTorch's native allocator with its default settings
    only; anything else is said, and the predictions beside the counters are not a claim."""
    gpu = environment.get("gpu", {})
    backend = gpu.get("allocator_backend")
    if backend != "native":
        return False, f"allocator backend {backend!r}: the model is of the native allocator"
    settings = gpu.get("allocator_settings", {})
    if "error" in settings:
        return False, f"allocator settings {settings['error']}: defaults not confirmed"
    changed = [
        f"{key}={settings.get(key)!r}"
        for key, default in MODELLED_ALLOCATOR.items()
        if settings.get(key) != default
    ]
    divisions = settings.get("roundup_power2_divisions")
    if not isinstance(divisions, dict) or any(divisions.values()):
        changed.append(f"roundup_power2_divisions={divisions!r}")
    if changed:
        return False, "allocator settings differ from the modelled defaults: " + ", ".join(changed)
    return True, None


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


# ---------------------------------------------------------------- output files


def refuse_existing(path: Path) -> None:
    """Checked before any work: an existing result is never replaced, and a folder that cannot
    take a new file is refused before the GPU is touched rather than after the measurement."""
    if os.path.lexists(path):
        raise UsageError(f"{path} already exists: results are never overwritten; choose a new name")
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent} is not an existing folder")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UsageError(f"{path.parent} is not writable: no new file can be made there")


def json_bytes(document: dict) -> bytes:
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def write_new(path: Path, data: bytes) -> None:
    """Whole file or nothing, never over another name, mode 0666 less the umask.

    On Linux the data goes into an unnamed file (O_TMPFILE) that is linked to its name only
    when complete, so even `kill -9` leaves nothing behind; elsewhere a named temp file beside
    it is linked, then removed.
    """
    mode = 0o666 & ~current_umask()
    try:
        if not os.path.isdir("/proc/self/fd"):  # linking an unnamed file goes through it
            raise OSError("no /proc")
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY, mode)
        temp = None
    except (AttributeError, OSError):  # no O_TMPFILE here, or not on this file system
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            # FileExistsError if the name was taken meanwhile: the other file is untouched.
            if temp is None:
                link_unnamed(handle.fileno(), path)
            else:
                os.link(temp, path)
    finally:
        if temp is not None:
            os.unlink(temp)


def link_unnamed(fd: int, path: Path) -> None:
    """linkat(AT_SYMLINK_FOLLOW) of an O_TMPFILE; a directory descriptor makes os.link use it."""
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=folder, follow_symlinks=True)
    finally:
        os.close(folder)


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_result(path: Path, document: dict) -> None:
    """Any failure to write is the user's file system refusing: one line, nothing left."""
    try:
        write_new(path, json_bytes(document))
    except FileExistsError:
        raise UsageError(f"{path} appeared during the run: it was left untouched") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{path} cannot be written ({reason}): nothing was written") from None


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def document_head(schema: str, tool: dict, status: str | None = None) -> dict:
    """The fields a result file opens with, in this order: what it is, what wrote it, when,
    and (a measurement or a prediction) how it ended."""
    head = {"schema": schema, "tool": tool, "created_utc": utc_now()}
    if status is not None:
        head["status"] = status
    return head


# ---------------------------------------------------------------- prediction (no GPU)


def block_bytes(nbytes: int) -> int:
    """The bytes of the block a request of `nbytes` (> 0) is given at the least."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


class AllocatorModel:
    """Replays allocations and frees, one stream, and keeps the four counters PyTorch keeps.
    Its free blocks are one list, scanned at every allocation; a subclass keeps them its own
    way through _take, _list and _unlist, and places segments through segment_address."""

    def __init__(self) -> None:
        self.free_blocks: list[dict] = []
        self.next_address = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def _take(self, size: int, small: bool) -> dict | None:
        """The best-fitting free block of the pool (the smallest, then the lowest), unlisted."""
        fits = [b for b in self.free_blocks if b["small"] == small and b["size"] >= size]
        if not fits:
            return None
        block = min(fits, key=lambda b: (b["size"], b["address"]))
        self.free_blocks.remove(block)
        return block

    def _list(self, block: dict) -> None:
        self.free_blocks.append(block)

    def _unlist(self, block: dict) -> None:
        self.free_blocks.remove(block)

    def segment_address(self, size: int) -> int:
        """A new segment's address: above every earlier one."""
        address = self.next_address
        self.next_address += size + ROUND_LARGE  # segments never touch
        return address

    def _new_segment(self, size: int, small: bool) -> dict:
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return {
            "address": self.segment_address(size),
            "size": size,
            "small": small,
            "prev": None,
            "next": None,
            "allocated": False,
        }

    def malloc(self, nbytes: int) -> dict | None:
        if nbytes == 0:
            return None  # an empty tensor takes no block
        size = block_bytes(nbytes)
        small = size <= SMALL_SIZE
        block = self._take(size, small)
        if block is None:
            if small:
                segment = SMALL_SEGMENT
            elif size < MIN_LARGE_ALLOC:
                segment = LARGE_SEGMENT
            else:
                segment = -(-size // ROUND_LARGE) * ROUND_LARGE
            block = self._new_segment(segment, small)
        rest = block["size"] - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            tail = dict(block, address=block["address"] + size, size=rest, prev=block)
            if block["next"] is not None:
                block["next"]["prev"] = tail
            block["next"], block["size"] = tail, size
            self._list(tail)
        block["allocated"] = True
        self.allocated += block["size"]
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: dict | None) -> None:
        if block is None:
            return
        block["allocated"] = False
        self.allocated -= block["size"]
        for neighbour in (block["prev"], block["next"]):
            if neighbour is not None and not neighbour["allocated"]:
                self._unlist(neighbour)
                if neighbour is block["prev"]:
                    block["address"], block["prev"] = neighbour["address"], neighbour["prev"]
                    if neighbour["prev"] is not None:
                        neighbour["prev"]["next"] = block
                else:
                    block["next"] = neighbour["next"]
                    if neighbour["next"] is not None:
                        neighbour["next"]["prev"] = block
                block["size"] += neighbour["size"]
        self._list(block)

    def counters(self) -> dict:
        return {"allocated_bytes": self.allocated, "reserved_bytes": self.reserved}


def predict_phases(configuration: dict, library_blocks: list[dict]) -> list[dict]:
    """Each phase's predicted counters from the configuration and the library's own blocks.

    The network's tensors are known from the configuration: the four parameters, the input,
    and per pass Linear1's output h1, GELU's output h2 (h1 freed once GELU returns), the
    output y (h2 freed once Linear2 returns). The library blocks (cuBLAS/cuBLASLt
    workspaces: sizes and the layer that allocates them) are measured, not assumed; they
    appear in the first pass and stay."""
    width, size = configuration["width"], DTYPE_BYTES[configuration["dtype"]]
    hidden = HIDDEN_FACTOR * width
    tokens = configuration["batch"] * configuration["context"]
    allocator = AllocatorModel()
    rows: list[dict] = []
    kept: list = []  # parameters, input and library blocks: they stay to the end
    outputs: list = []  # the output of the last pass, alive when end values are read
    library_pending = {FIRST_LINEAR: True, SECOND_LINEAR: True}

    def record(phase: str, steps) -> None:
        row = {"phase": phase}
        row.update({f"baseline_{k}": v for k, v in allocator.counters().items()})
        allocator.reset_peaks()
        steps()
        row.update(allocator.counters())
        row["peak_allocated_bytes"] = allocator.peak_allocated
        row["peak_reserved_bytes"] = allocator.peak_reserved
        rows.append(row)
        while outputs:  # freed after the end values, before the next phase
            allocator.free(outputs.pop())

    def library(layer: str) -> None:
        if library_pending[layer]:
            library_pending[layer] = False
            for entry in library_blocks:
                if entry["layer"] == layer:
                    kept.append(allocator.malloc(entry["requested_bytes"]))

    def one_pass() -> None:
        while outputs:  # the previous pass's output is freed before the next pass
            allocator.free(outputs.pop())
        h1 = allocator.malloc(tokens * hidden * size)
        library(FIRST_LINEAR)
        h2 = allocator.malloc(tokens * hidden * size)
        allocator.free(h1)
        y = allocator.malloc(tokens * width * size)
        library(SECOND_LINEAR)
        allocator.free(h2)
        outputs.append(y)

    def passes(count: int):
        def steps() -> None:
            for _ in range(count):
                one_pass()

        return steps

    parameters = [hidden * width, hidden, width * hidden, width]
    record("model_load", lambda: kept.extend(allocator.malloc(n * size) for n in parameters))
    record("inputs", lambda: kept.append(allocator.malloc(tokens * width * size)))
    record("cold_forward", passes(1))
    record("warmup", passes(configuration["warmup"]))
    for _ in range(configuration["repeats"]):
        record("warm_forward", passes(1))
    return rows


def library_block(text: str) -> dict:
    match = re.fullmatch(rf"({FIRST_LINEAR}|{SECOND_LINEAR}):([0-9]{{1,15}})", text)
    if not match or int(match.group(2)) == 0:
        raise argparse.ArgumentTypeError(f"expected LAYER:BYTES with LAYER 0 or 2, got {text!r}")
    return {"layer": match.group(1), "requested_bytes": int(match.group(2))}


def print_phase_prediction(args: argparse.Namespace) -> int:
    configuration = {
        key: getattr(args, key)
        for key in ("batch", "context", "width", "dtype", "warmup", "repeats")
    }
    rows = predict_phases(configuration, args.library_block)
    if args.json:
        print(
            json.dumps(
                {
                    "configuration": configuration,
                    "library_blocks": args.library_block,
                    "phases": rows,
                },
                indent=2,
            )
        )
        return EXIT_OK
    print("predicted PyTorch allocator counters, bytes (baseline / end / peak)")
    for row in rows:
        print(
            f"{row['phase']:<13} allocated {row['baseline_allocated_bytes']:>14} "
            f"{row['allocated_bytes']:>14} {row['peak_allocated_bytes']:>14}   reserved "
            f"{row['baseline_reserved_bytes']:>14} {row['reserved_bytes']:>14} "
            f"{row['peak_reserved_bytes']:>14}"
        )
    if not args.library_block:
        print(
            "no --library-block given: cuBLAS/cuBLASLt workspaces are left out; "
            "measure reports them under 'calibration'"
        )
    return EXIT_OK


# ---------------------------------------------------------------- measure


def synthetic_model(width: int, dtype: str, seed: int) -> dict:
    hidden = HIDDEN_FACTOR * width
    parameters = width * hidden + hidden + hidden * width + width
    return {
        "architecture": "Linear(width, hidden) -> GELU -> Linear(hidden, width)",
        "width": width,
        "hidden_width": hidden,
        "hidden_rule": f"hidden_width = {HIDDEN_FACTOR} x width",
        "bias": True,
        "gelu": "exact (erf), torch.nn.GELU(approximate='none')",
        "parameters": parameters,
        "parameter_bytes": parameters * DTYPE_BYTES[dtype],
        "parameter_tensors": [
            {"name": "0.weight", "shape": [hidden, width]},
            {"name": "0.bias", "shape": [hidden]},
            {"name": "2.weight", "shape": [width, hidden]},
            {"name": "2.bias", "shape": [width]},
        ],
        "initialisation": "PyTorch default for nn.Linear, on the CPU in float32, then cast",
        "seed": seed,
        "execution": "torch.inference_mode(); no autocast, gradients, optimizer or sharding",
    }


def host_memory_available() -> int | None:
    """Bytes the host can still give: MemAvailable on Linux, else the physical total."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def host_bytes_to_build(width: int, dtype: str) -> int:
    """The weights are initialised on the CPU in float32, then cast tensor by tensor (the
    largest cast copy lives beside them), then moved to the GPU."""
    parameters = synthetic_model(width, dtype, 0)["parameters"]
    largest_cast = HIDDEN_FACTOR * width * width * DTYPE_BYTES[dtype] if dtype != "float32" else 0
    return parameters * 4 + largest_cast


def check_host_memory(width: int, dtype: str) -> None:
    """A width the host cannot even build is bad input, refused before anything is written
    (not a GPU out-of-memory: the GPU was never asked)."""
    needed, available = host_bytes_to_build(width, dtype), host_memory_available()
    if available is not None and needed > available:
        raise UsageError(
            f"--width {width}: building the model on the host needs {needed} bytes "
            f"(float32 on the CPU, then cast and moved), more than the {available} available"
        )


def check_gpu(torch, index: int, requested: str) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise UsageError("no GPU is visible to PyTorch: measure needs one and never uses the CPU")
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageError(f"{requested} does not exist: PyTorch sees {count} GPU(s)")


class OutOfMemory(Exception):
    """The GPU refused an allocation inside a phase: a real observation."""

    def __init__(self, row: dict, message: str):
        super().__init__(message)
        self.row = row

    def failure(self) -> dict:
        """The document's `failure`: the phase, what was asked for, the counters after it."""
        return {
            "phase": self.row["phase"],
            "repetition": self.row.get("repetition"),
            "error": oom_summary(str(self)),
            "counters_after_failure": {k: v for k, v in self.row.items() if k.endswith("_bytes")},
        }


def oom_summary(message: str) -> str:
    """Keep what was asked for; drop process lists and totals that name other processes."""
    match = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", message)
    return f"CUDA out of memory: tried to allocate {match.group(1)}" if match else "out of memory"


def calibrate_library_blocks(torch, device, model, x) -> dict:
    """After the phases, so the protocol is untouched: free cuBLAS's workspaces, run one pass
    layer by layer, and list the blocks that appear and stay (neither output nor input).
    These are the library terms of the prediction, measured in this process."""
    report = {
        "method": (
            "after all phases: torch._C._cuda_clearCublasWorkspaces(), then one forward pass "
            "layer by layer; blocks that appear and stay, other than the layer outputs, per "
            "torch.cuda.memory_snapshot()"
        ),
        "blocks": [],
    }
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        report["error"] = "this PyTorch has no _cuda_clearCublasWorkspaces: not calibrated"
        return report

    def active() -> dict:
        found = {}
        for segment in torch.cuda.memory_snapshot():
            if segment.get("device", device.index) != device.index:
                continue
            address = segment["address"]
            for block in segment["blocks"]:
                if block["state"] == "active_allocated":
                    found[(address, block["size"])] = block["requested_size"]
                address += block["size"]
        return found

    torch.cuda.synchronize(device)
    before_clear = torch.cuda.memory_allocated(device)
    clear()
    report["cleared_bytes"] = before_clear - torch.cuda.memory_allocated(device)

    def kept_by(layer: str, seen: dict, output) -> dict:
        """The blocks that appeared with `layer` and stay, its output left out."""
        torch.cuda.synchronize(device)
        now = active()
        for key in sorted(set(now) - set(seen)):
            if key[0] != output.untyped_storage().data_ptr():
                report["blocks"].append({"layer": layer, "requested_bytes": now[key]})
        return now

    seen = active()
    with torch.inference_mode():
        hidden = model.get_submodule(FIRST_LINEAR)(x)
        seen = kept_by(FIRST_LINEAR, seen, hidden)
        activated = model.get_submodule("1")(hidden)  # GELU
        del hidden
        output = model.get_submodule(SECOND_LINEAR)(activated)
        del activated
        kept_by(SECOND_LINEAR, seen, output)
        del output
    return report


def reference_timing(torch, model, x) -> dict:
    """The same forward timed by torch.utils.benchmark.Timer (synchronises CUDA, no cache
    flush), to show how far the harness's own event times are from a standard tool."""
    from torch.utils import benchmark

    timer = benchmark.Timer(
        stmt="with torch.inference_mode():\n    model(x)",
        globals={"torch": torch, "model": model, "x": x},
    )
    result = timer.blocked_autorange(min_run_time=0.2)
    return {
        "tool": "torch.utils.benchmark.Timer.blocked_autorange(min_run_time=0.2)",
        "median_ns": round(result.median * 1e9),
        "runs": result.number_per_run * len(result.raw_times),
    }


def phase_row(name: str, repetition: int | None, passes: int) -> dict:
    """A phase row's first keys, measured or traced alike."""
    row: dict = {"phase": name}
    if repetition is not None:
        row["repetition"] = repetition
    row["passes"] = passes
    return row


def run_phase(cuda, device, name: str, operation, repetition: int | None = None, passes: int = 1):
    """One phase under the protocol: synchronise, baseline, peak reset, run, synchronise, end
    values. Returns (row, what the operation returned); the caller keeps what it needs (the
    model, the input) and drops a pass's output at once, after the end values were read.
    An out-of-memory inside the operation raises OutOfMemory with the row read after it."""
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    cuda.synchronize(device)
    row = phase_row(name, repetition, passes)
    row["baseline_allocated_bytes"] = cuda.memory_allocated(device)
    row["baseline_reserved_bytes"] = cuda.memory_reserved(device)
    cuda.reset_peak_memory_stats(device)
    failure, result = None, None
    t0 = time.perf_counter_ns()
    start.record()
    try:
        result = operation()
    except cuda.OutOfMemoryError as exc:
        failure = str(exc)
    end.record()
    cuda.synchronize(device)
    t1 = time.perf_counter_ns()
    row["wall_time_ns"] = t1 - t0
    row["event_time_ns"] = round(start.elapsed_time(end) * 1_000_000)
    row["allocated_bytes"] = cuda.memory_allocated(device)
    row["reserved_bytes"] = cuda.memory_reserved(device)
    row["peak_allocated_bytes"] = cuda.max_memory_allocated(device)
    row["peak_reserved_bytes"] = cuda.max_memory_reserved(device)
    if failure is not None:
        raise OutOfMemory(row, failure)
    return row, result


def build_model(torch, width: int, dtype, seed: int, device):
    """Built on the CPU (a failure there is the host's, never a GPU observation), then moved."""
    torch.manual_seed(seed)
    hidden = HIDDEN_FACTOR * width
    try:
        model = torch.nn.Sequential(
            torch.nn.Linear(width, hidden, bias=True),
            torch.nn.GELU(approximate="none"),
            torch.nn.Linear(hidden, width, bias=True),
        ).to(dtype=dtype)
    except RuntimeError as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--width {width}: the host could not build the model ({first})") from None
    return model.to(device).eval()


def make_input(torch, shape: tuple[int, int, int], dtype, seed: int, device):
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=dtype)


def forward_passes(torch, model, x, count: int):
    """`count` passes; each pass's output is freed before the next; the last one is returned,
    so that it is alive when the phase's end values are read."""
    with torch.inference_mode():
        output = None
        for _ in range(count):
            output = None
            output = model(x)
        return output


def pass_plan(args: argparse.Namespace) -> list[tuple[str, int | None, int]]:
    """The forward phases after the model and the input: (name, repetition, passes)."""
    plan: list[tuple[str, int | None, int]] = [("cold_forward", None, 1)]
    plan.append(("warmup", None, args.warmup))
    plan += [("warm_forward", i, 1) for i in range(1, args.repeats + 1)]
    return plan


def measure_phases(torch, args: argparse.Namespace, device, phases: list):
    """Every phase in order, each row appended as soon as it is read; returns the model and
    the input for the calibration. Raises OutOfMemory at the phase that ran out."""
    cuda, dtype = torch.cuda, getattr(torch, args.dtype)
    shape = (args.batch, args.context, args.width)
    row, model = run_phase(
        cuda, device, "model_load", lambda: build_model(torch, args.width, dtype, args.seed, device)
    )
    phases.append(row)
    row, x = run_phase(
        cuda, device, "inputs", lambda: make_input(torch, shape, dtype, args.seed, device)
    )
    phases.append(row)
    for name, repetition, count in pass_plan(args):
        operation = partial(forward_passes, torch, model, x, count)
        # [0]: the pass's output, alive for the end values, is dropped before the next phase.
        phases.append(run_phase(cuda, device, name, operation, repetition, count)[0])
    return model, x


def run_measurement(args: argparse.Namespace, document: dict) -> int:
    """The phases, then the library calibration and the predictions beside the counters."""
    torch = import_torch()
    check_gpu(torch, args.device, args.device_text)
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    torch.cuda.init()
    try:
        model, x = measure_phases(torch, args, device, document["phases"])
    except OutOfMemory as oom:
        document["status"] = RunStatus.OUT_OF_MEMORY
        document["failure"] = oom.failure()
        document["calibration"] = {
            "blocks": [],
            "error": "not run: the measurement ran out of memory",
        }
        add_predictions(document, [])
        document["summary"] = summarise(document)
        return EXIT_OOM
    document["status"] = RunStatus.COMPLETED
    document["calibration"] = calibrate_library_blocks(torch, device, model, x)
    reference = reference_timing(torch, model, x) if args.reference_timing else None
    add_predictions(document, document["calibration"]["blocks"])
    document["summary"] = summarise(document, reference)
    return EXIT_OK


def add_predictions(document: dict, library_blocks: list[dict]) -> None:
    """Put the predicted counters beside the measured ones in every completed phase row."""
    predicted = predict_phases(document["configuration"], library_blocks)
    for row, expected in zip(document["phases"], predicted, strict=False):
        row["predicted"] = {key: expected[key] for key in COUNTER_KEYS}
        row["harness_overhead_ns"] = row["wall_time_ns"] - row["event_time_ns"]


def peaks_summary(phases: list[dict]) -> dict:
    """The first keys of every workload's summary: how many rows, and their largest peaks."""
    return {
        "phases_completed": len(phases),
        "largest_peak_allocated_bytes": max((r["peak_allocated_bytes"] for r in phases), default=0),
        "largest_peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in phases), default=0),
    }


def spread(values: list[int]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def prediction_summary(document: dict, model: str | None = None) -> dict:
    """Predicted against measured over every row, per counter, and whether the prediction is
    a claim at all (the allocator's backend and settings); shared by every workload."""
    phases = document["phases"]
    differences = {
        key: max((abs(row[key] - row["predicted"][key]) for row in phases), default=0)
        for key in COUNTER_KEYS
    }
    prediction = {
        "largest_abs_difference_allocated_bytes": max(
            differences[key] for key in COUNTER_KEYS if "allocated" in key
        ),
        "largest_abs_difference_reserved_bytes": max(
            differences[key] for key in COUNTER_KEYS if "reserved" in key
        ),
        "by_counter": differences,
    }
    if model is not None:
        prediction["model"] = model
    applicable, because = prediction_applicability(document["environment"])
    prediction["applicable"] = applicable
    if not applicable:
        prediction["not_applicable_because"] = because
    return prediction


def summarise(document: dict, reference: dict | None = None) -> dict:
    phases = document["phases"]
    configuration = document["configuration"]
    warm = [row for row in phases if row["phase"] == "warm_forward"]
    model = (
        "pipeline allocator model (512-byte blocks, 2 MiB small segments, 20 MiB or "
        "2 MiB-rounded large segments, best fit, split rules) replaying the network's tensors "
        "and the calibrated library blocks"
    )
    summary = {
        **peaks_summary(phases),
        "warm_forward_median_event_time_ns": None,
        "warm_forward_median_wall_time_ns": None,
        "prediction": prediction_summary(document, model),
    }
    if not warm:
        return summary
    events = [r["event_time_ns"] for r in warm]
    summary["warm_forward_median_event_time_ns"] = statistics.median(events)
    summary["warm_forward_median_wall_time_ns"] = statistics.median(r["wall_time_ns"] for r in warm)
    tokens = configuration["batch"] * configuration["context"]
    flops = 2 * 2 * tokens * configuration["width"] * HIDDEN_FACTOR * configuration["width"]
    median_s = statistics.median(events) / 1e9
    gpu_name = document["environment"]["gpu"].get("name")
    peak = DATASHEET_TFLOPS.get(gpu_name, {}).get(configuration["dtype"])
    summary["timing"] = {
        "warm_forward_event_ns": spread(events),
        "warm_forward_wall_ns": spread([r["wall_time_ns"] for r in warm]),
        "harness_overhead_ns": {
            r["phase"] + (f"[{r['repetition']}]" if "repetition" in r else ""): r[
                "harness_overhead_ns"
            ]
            for r in phases
        },
        "reference": reference,
        "event_median_over_reference": (
            round(statistics.median(events) / reference["median_ns"], 4) if reference else None
        ),
        "forward_matmul_flops": flops,
        "achieved_tflops": round(flops / median_s / 1e12, 3) if median_s > 0 else None,
        "datasheet_dense_tflops": peak,
        "caveat": "matmul FLOPs of two Linear layers over the warm_forward event median; "
        "this small synthetic network is not a benchmark of the card",
    }
    return summary


def environment_document(environment: dict) -> dict:
    return {**document_head(ENVIRONMENT_SCHEMA, TOOL), "environment": environment}


def refuse_outputs(named: dict[str, Path | None]) -> None:
    """Each output option's file (None: not asked for) is new, and each is its own file."""
    given = {option: path for option, path in named.items() if path is not None}
    for path in given.values():
        refuse_existing(path)
    seen: dict[Path, str] = {}
    for option, path in given.items():
        first = seen.setdefault(path.resolve(), option)
        if first != option:
            raise UsageError(f"{option} and {first} must be two files")


class EnvironmentStart:
    """The environment's slow parts (the driver query, the CUDA driver) started now; the
    record is taken by record(), once the workload is ready to measure."""

    def __init__(self, device: int) -> None:
        self.driver_query = start_driver_query()
        self.cuda_driver = start_cuda_driver(device)

    def record(self, args, output: Path | None, check=None, collect=collect_environment) -> dict:
        """The environment of this run (`collect` reads it), checked by `check` before anything
        is written, then written to `output` where one was asked for."""
        environment = collect(args.device, args.device_text, self.driver_query, args.process_start)
        stop_cuda_driver(self.cuda_driver)
        if check is not None:
            check(environment)
        if output is not None:
            write_result(output, environment_document(environment))
        return environment


def write_measurement(output: Path, document: dict) -> None:
    """The measurement file, and one line of what it holds (a second line on stderr when the
    GPU ran out of memory: where, and PyTorch's words)."""
    write_result(output, document)
    print(f"{output}: {document['status']}, {len(document['phases'])} phase rows")
    if document["status"] == RunStatus.OUT_OF_MEMORY:
        failure = document["failure"]
        print(f"out of memory in phase {failure['phase']}: {failure['error']}", file=sys.stderr)


def measure(args: argparse.Namespace) -> int:
    """With --environment-output, the environment is written first, by this same process:
    a pipeline then pays CUDA start-up once per run, and a run refused for want of PyTorch
    or a GPU still leaves its diagnostic behind."""
    output = Path(args.output)
    environment_output = Path(args.environment_output) if args.environment_output else None
    refuse_outputs({"--output": output, "--environment-output": environment_output})
    check_host_memory(args.width, args.dtype)
    environment = EnvironmentStart(args.device).record(args, environment_output)
    import_torch()  # the exit-2 guard, before the measurement is written
    document = {
        **document_head(MEASUREMENT_SCHEMA, TOOL, "running"),
        "environment": environment,
        "configuration": {
            "device": f"cuda:{args.device}",
            "batch": args.batch,
            "context": args.context,
            "width": args.width,
            "dtype": args.dtype,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "seed": args.seed,
            "reference_timing": args.reference_timing,
            "input_shape": [args.batch, args.context, args.width],
        },
        "synthetic_model": synthetic_model(args.width, args.dtype, args.seed),
        "clocks": CLOCKS,
        "counters": COUNTERS,
        "phase_scopes": PHASES_DOC,
        "phases": [],
    }
    exit_code = run_measurement(args, document)
    write_measurement(output, document)
    return exit_code


# ---------------------------------------------------------------- command line


def add_configuration(group) -> None:
    """The configuration options, with their defaults shown in --help."""
    what = {
        "batch": "inputs per pass",
        "context": "positions per input",
        "width": "the network's width (hidden layer: 4 x width)",
        "dtype": "weights and inputs",
        "warmup": "warm-up passes (one row)",
        "repeats": "timed passes (a row each)",
    }
    add_defaulted(group, CONFIGURATION_DEFAULTS, what, DTYPE_BYTES)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mesure_memoire.py",
        description="Estimate weight memory, record the environment, measure a synthetic MLP.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = commands.add_parser("estimate", help="weight memory from a parameter count, no GPU")
    p.add_argument("--parameters", type=positive_int)
    p.add_argument("--bits", type=positive_int, help="storage width per weight")
    p.add_argument("--reserve-gib", type=non_negative_decimal, default=Decimal(0))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    phases = p.add_argument_group("--phases: predict each phase's counters for measure")
    phases.add_argument("--phases", action="store_true", help="predict instead of --parameters")
    add_configuration(phases)
    phases.add_argument(
        "--library-block",
        type=library_block,
        action="append",
        default=[],
        metavar="LAYER:BYTES",
        help="a block the libraries keep, as measure's calibration reports it (e.g. 0:33554432)",
    )

    p = commands.add_parser("environment", help="record Python, PyTorch, GPU and driver")
    p.add_argument("--device", required=True, help="cuda or cuda:N")
    p.add_argument("--output", help="write JSON to this new file instead of stdout")

    p = commands.add_parser("measure", help="measure the synthetic network phase by phase")
    p.add_argument("--device", required=True, help="cuda or cuda:N (never the CPU)")
    add_configuration(p)
    p.add_argument("--seed", type=non_negative_int, default=0, help="weights' seed (default 0)")
    p.add_argument(
        "--reference-timing",
        action="store_true",
        help="also time the forward with torch.utils.benchmark.Timer (about 0.4 s more)",
    )
    p.add_argument("--output", required=True, help="a new JSON file (never overwritten)")
    p.add_argument(
        "--environment-output",
        help="also write the environment record to this new file, first",
    )
    return parser


def main(argv: list[str] | None = None, process_start: str = FRESH_INTERPRETER) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.process_start = process_start
        if args.command == "estimate" and args.phases:
            return print_phase_prediction(args)
        if args.command == "estimate":
            if args.parameters is None or args.bits is None:
                raise UsageError("estimate needs --parameters and --bits (or --phases)")
            result = estimate(args.parameters, args.bits, args.reserve_gib)
            if args.json:
                print(json.dumps(result, indent=2))
            else:
                print_estimate(result)
            return EXIT_OK
        args.device_text = args.device
        try:
            args.device = device_index(args.device)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"argument --device: {exc}") from None
        if args.command == "environment":
            output = Path(args.output) if args.output else None
            if output is not None:
                refuse_existing(output)
            environment = collect_environment(
                args.device, args.device_text, process_start=process_start
            )
            document = environment_document(environment)
            if output is None:
                print(json.dumps(document, indent=2, ensure_ascii=False))
            else:
                write_result(output, document)
                print(f"{output}: environment recorded")
            return EXIT_OK
        return measure(args)
    except UsageError as exc:
        print(f"mesure_memoire.py: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("mesure_memoire.py: interrupted: nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
