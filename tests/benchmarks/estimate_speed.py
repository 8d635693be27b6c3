"""How long `own_model.py estimate` takes, this tree's against an earlier commit's, side by side.

    python tests/benchmarks/estimate_speed.py                     # the four workloads below
    python tests/benchmarks/estimate_speed.py --only llama-8b --repeat 3
    python tests/benchmarks/estimate_speed.py --base HEAD~2

The earlier commit's pipeline (and the calibrations, data and schemas it reads) is taken
with `git archive` into a temporary folder; each workload then runs in a fresh interpreter,
the old tree's and this one's in turn, `--repeat` times, so that a machine busy with another
job slows both alike. Printed per workload: the best seconds of each, their ratio, and
whether the two JSON documents are the same bytes once `created_utc` is left out (the
optimisations must not move any prediction). Exit 1 if any differs. Not a test: it times.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "hf-configs"
# The last commit before the estimate was made faster (the storage callbacks, the indexed
# allocator model, the skipped address orders).
BASE = "46e08d0"
COPIED = ("pipeline", "calibrations", "data", "schemas")
WORKLOADS = {
    "gpt2": ["gpt2.json", "--task", "training", "--dtype", "bfloat16", "--batch", "2",
             "--dim", "sequence=512"],
    "qwen-0.5b-generate": ["qwen2.5-0.5b.json", "--task", "generate", "--batch", "4",
                           "--dim", "sequence=256", "--new-tokens", "16"],
    "llama-1b": ["llama-3.2-1b.json", "--task", "training", "--dtype", "bfloat16",
                 "--batch", "1", "--dim", "sequence=512"],
    "llama-8b": ["llama-3.1-8b.json", "--task", "training", "--dtype", "bfloat16",
                 "--batch", "8", "--dim", "sequence=2048"],
}  # fmt: skip


def export(base: str, folder: Path) -> None:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", base, *COPIED],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)


def estimate(tree: Path, workload: list[str]) -> tuple[float, bytes]:
    """(seconds, the JSON document without its created_utc line) of one fresh run."""
    config, *rest = workload
    script = tree / "pipeline" / "own_model.py"  # a tree from before the package's floors
    program = [str(script)] if script.is_file() else ["-m", "pipeline.measuring.own_model"]
    command = [sys.executable, *program, "estimate",
               "--hf-config", str(CONFIGS / config), *rest, "--gpu", "h200", "--json"]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, check=False, cwd=tree)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{tree}: estimate failed\n{result.stderr.decode()[-3000:]}")
    lines = result.stdout.split(b"\n")
    return seconds, b"\n".join(x for x in lines if not x.lstrip().startswith(b'"created_utc"'))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help=f"the earlier commit (default {BASE})")
    parser.add_argument("--only", help="comma-separated workloads: " + ", ".join(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tree (best kept)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    differ = False
    with tempfile.TemporaryDirectory() as folder:
        old = Path(folder)
        export(args.base, old)
        print(f"{'workload':<20} {args.base + ' s':>12} {'this tree s':>12} {'ratio':>7}  output")
        for name in names:
            times: dict = {"old": [], "new": []}
            outputs: dict = {}
            for _ in range(args.repeat):
                for side, tree in (("old", old), ("new", ROOT)):
                    seconds, outputs[side] = estimate(tree, WORKLOADS[name])
                    times[side].append(seconds)
            before, after = min(times["old"]), min(times["new"])
            same = outputs["old"] == outputs["new"]
            differ |= not same
            print(
                f"{name:<20} {before:>12.1f} {after:>12.1f} {before / after:>6.2f}x  "
                f"{'identical' if same else 'DIFFERENT'}",
                flush=True,
            )
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
