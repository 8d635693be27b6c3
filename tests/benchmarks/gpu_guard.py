"""The GPU benchmarks' up-front guard, as the stages have one: before a benchmark writes a
file or starts a measurement, PyTorch must see the GPU it names. Without one: one line on
stderr, exit 2, nothing written (not minutes of children failing one by one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root

from kit import mesure_memoire  # noqa: E402

# Counted in a child: this process never initialises CUDA (launcher.py forks from it).
COUNT = (
    "import sys\n"
    "try:\n"
    "    import torch\n"
    "except ImportError:\n"
    "    sys.exit(9)\n"
    "print(torch.cuda.device_count() if torch.cuda.is_available() else 0)\n"
)


def gpu_problem(device: str, python: str = sys.executable) -> str | None:
    """Why `python` cannot measure on `device` (cuda or cuda:N), or None when it can."""
    try:
        index = mesure_memoire.device_index(device)
    except Exception as exc:  # argparse.ArgumentTypeError: its own words
        return f"argument --device: {exc}"
    probe = subprocess.run([python, "-c", COUNT], capture_output=True, text=True, check=False)
    if probe.returncode == 9:
        return f"no PyTorch in {python}: this benchmark measures on a GPU"
    text = probe.stdout.strip()
    if probe.returncode != 0 or not text.isdigit():
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"PyTorch could not count GPUs: {last}"
    if int(text) == 0:
        return "no GPU is visible to PyTorch: this benchmark needs one and never uses the CPU"
    if index >= int(text):
        return f"{device}: PyTorch sees {text} GPU(s), cuda:0 to cuda:{int(text) - 1}"
    return None


def require_gpu(prog: str, device: str, python: str = sys.executable) -> None:
    """Exit 2 with `prog: error: ...` in one line unless `python` can measure on `device`."""
    problem = gpu_problem(device, python)
    if problem is not None:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
