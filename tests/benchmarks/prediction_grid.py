"""Predicted against measured counters on a grid of configurations, on a real GPU.

    python3 tests/benchmarks/prediction_grid.py --device cuda:0 --output-dir DIR [--fresh N]
        [--configurations N]

Every point is its own process (forked by the launcher, each started as the previous one
exits, as in a sweep) writing DIR/<name>.json with `--reference-timing`. With `--fresh
N`, the first N configurations of each dtype are measured a second time in fresh
interpreters (DIR/fresh/), and their counters compared with the forked ones byte for byte.
Prints one line per point and a summary; exit 1 if a forked and a fresh counter differ. Not
a test: it needs a GPU and minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root
import gpu_guard  # noqa: E402

from kit import mesure_memoire  # noqa: E402
from pipeline.measuring import launcher  # noqa: E402

COUNTERS = mesure_memoire.COUNTER_KEYS
# (batch, context, width): the default and the larger proposed one, odd widths, width 1,
# millions of positions, large matrices; the last one fills most of a 141 GB card (context
# scaled per dtype).
GRID = [
    (1, 16, 64),
    (2, 128, 1024),
    (1, 1, 1),
    (3, 5, 1),
    (1, 16, 3),
    (2, 7, 13),
    (4, 33, 100),
    (1, 1, 4095),
    (8, 64, 1000),
    (16, 512, 1023),
    (1, 1_000_000, 1),
    (4, 1_000_000, 8),
    (1000, 1000, 16),
    (1, 2048, 2048),
    (2, 512, 4096),
    (1, 1, 8192),
    (64, 128, 512),
    (5, 999, 257),
    (1, 4096, 8192),
    (32, 2048, 1024),
    (7, 11, 2049),
    (128, 1, 640),
    (1, 100_000, 96),
    (3, 3, 300),
    (2, 65_536, 64),
    (9, 17, 1537),
    (1, 16, 6000),
    (256, 256, 256),
    (1, 3, 5),
    (10, 100, 10),
    (1, 3_200_000, 1024),
]
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}


def argv_for(batch, context, width, dtype, output):
    if (batch, context, width) == GRID[-1]:
        context = context * 4 // DTYPES[dtype]  # the same bytes in every dtype
    return [
        "measure",
        "--device",
        ARGS.device,
        "--batch",
        str(batch),
        "--context",
        str(context),
        "--width",
        str(width),
        "--dtype",
        dtype,
        "--warmup",
        "2",
        "--repeats",
        "5",
        "--reference-timing",
        "--output",
        str(output),
    ]


def counters(path: Path) -> list[tuple]:
    document = json.loads(path.read_text())
    return [tuple(row[key] for key in COUNTERS) for row in document["phases"]]


def main() -> int:
    out = Path(ARGS.output_dir)
    (out / "fresh").mkdir(parents=True, exist_ok=False)
    runner = launcher.Launcher()
    worst_allocated = worst_reserved = 0
    started = time.perf_counter()
    previous = None  # as in a sweep: each child starts while the previous one exits
    for dtype in DTYPES:
        for batch, context, width in GRID[: ARGS.configurations]:
            name = f"{dtype}-b{batch}-c{context}-w{width}"
            argv = argv_for(batch, context, width, dtype, out / f"{name}.json")
            previous = runner.start(argv, after=previous)
            code = previous.result()
            path = out / f"{name}.json"
            if not path.exists():
                print(f"{name}: exit {code}, no file")
                continue
            document = json.loads(path.read_text())
            prediction = document["summary"]["prediction"]
            timing = document["summary"].get("timing") or {}
            worst_allocated = max(
                worst_allocated, prediction["largest_abs_difference_allocated_bytes"]
            )
            worst_reserved = max(
                worst_reserved, prediction["largest_abs_difference_reserved_bytes"]
            )
            print(
                f"{name}: exit {code} {document['status']} "
                f"diff alloc {prediction['largest_abs_difference_allocated_bytes']} "
                f"reserved {prediction['largest_abs_difference_reserved_bytes']} "
                f"event/ref {timing.get('event_median_over_reference')} "
                f"event median {timing.get('warm_forward_event_ns', {}).get('median')}",
                flush=True,
            )
    if previous is not None:
        previous.wait()
    print(
        f"grid: {time.perf_counter() - started:.1f} s; largest difference allocated "
        f"{worst_allocated} B, reserved {worst_reserved} B"
    )
    if not ARGS.fresh:
        return 0

    jobs = [(dtype, *shape) for dtype in DTYPES for shape in GRID[: ARGS.fresh]]

    def fresh(job):
        dtype, batch, context, width = job
        name = f"{dtype}-b{batch}-c{context}-w{width}"
        argv = argv_for(batch, context, width, dtype, out / "fresh" / f"{name}.json")
        script = ROOT / "kit" / "mesure_memoire.py"
        subprocess.run([sys.executable, str(script), *argv], check=False)
        return name

    with ThreadPoolExecutor(max_workers=6) as pool:
        names = list(pool.map(fresh, jobs))
    differing = [
        n for n in names if counters(out / f"{n}.json") != counters(out / "fresh" / f"{n}.json")
    ]
    print(
        f"forked vs fresh interpreter: {len(names) - len(differing)}/{len(names)} "
        f"configurations with identical counters in every phase; differing: {differing}"
    )
    return 1 if differing else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="prediction_grid.py", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--fresh", type=int, default=0, help="configurations to re-run fresh")
    parser.add_argument(
        "--configurations", type=int, default=len(GRID), help="the first N of the grid only"
    )
    ARGS = parser.parse_args()
    gpu_guard.require_gpu("prediction_grid.py", ARGS.device)
    raise SystemExit(main())
