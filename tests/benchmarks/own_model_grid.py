"""The three example workloads measured and predicted on a real GPU, one swept to out of memory.

    python3 tests/benchmarks/own_model_grid.py --device cuda:0 --output-dir DIR \\
        [--only grid,sweep,history] [--jobs 2] [--max-batch 1024]

Every point is `own_model.py measure` in a fresh interpreter, writing DIR/<name>.json:

- grid: each example at its small (test) size and at a larger one, in bfloat16 and float32
  (12 processes, --jobs at a time: each process's counters are its own);
- sweep: the decoder's AdamW step in bfloat16, batch doubling from 4 until the GPU runs out
  of memory or --max-batch, one process after the other (DIR/sweep/);
- history: the points of --history-points (by default each example's small size, and the
  decoder's larger one in float32) again with --memory-history: the allocator's history
  during the phases beside the replayed prediction, compared event by event; the first place
  where they part is printed and DIR/history/<name>.txt lists both side by side.

DIR/summary.json holds, per point, predicted against measured for every counter of every
phase. Prints a compact table. Not a test: it needs a GPU and a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
WORKLOADS = PIPELINE / "workloads"
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root
# the commands it starts find it the same way (`python -m pipeline...`)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
)
import gpu_guard  # noqa: E402

from kit import mesure_memoire  # noqa: E402

COUNTERS = mesure_memoire.COUNTER_KEYS
EXAMPLES = {
    "resnet": "resnet_cnn.py:resnet",
    "vit": "vit_encoder.py:vit",
    "decoder": "decoder_training.py:decoder_adamw",
}
# (example, size): batch and dimensions. "small" is the examples' own defaults.
SIZES = {
    ("resnet", "small"): (4, {}),
    ("resnet", "large"): (64, {"image": 64, "width": 32, "blocks": 2}),
    ("vit", "small"): (4, {}),
    ("vit", "large"): (32, {"image": 64, "patch": 8, "width": 256, "depth": 4, "heads": 4}),
    ("decoder", "small"): (4, {}),
    ("decoder", "large"): (
        8,
        {"vocab": 8192, "context": 256, "width": 256, "layers": 4, "heads": 8, "ffn": 688},
    ),
}
# About 1 GB per sequence in bfloat16 (logits of 2048 x 32000, four blocks of width 1024):
# an H200 runs out between batch 64 and 256, each point a second or two of compute.
SWEEP_DIMS = {
    "vocab": 32000,
    "context": 2048,
    "width": 1024,
    "layers": 4,
    "heads": 8,
    "kv_heads": 2,
    "ffn": 2816,
}


def measure(name: str, example: str, dtype: str, batch: int, dims: dict, out: Path, *extra):
    """One fresh measuring process; returns its summary entry."""
    output = out / f"{name}.json"
    argv = [sys.executable, "-m", "pipeline.measuring.own_model", "measure"]
    argv += ["--workload", f"{WORKLOADS / EXAMPLES[example]}", "--device", ARGS.device]
    argv += ["--dtype", dtype, "--batch", str(batch), "--output", str(output), *extra]
    for key, value in dims.items():
        argv += ["--dim", f"{key}={value}"]
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    entry = {
        "name": name,
        "example": example,
        "dtype": dtype,
        "batch": batch,
        "dims": dims,
        "exit": result.returncode,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if not output.exists():
        entry["stderr_tail"] = result.stderr[-2000:]
        return entry
    document = json.loads(output.read_text())
    entry["status"] = document["status"]
    if document["status"] == "failed":
        entry["stderr_tail"] = result.stderr[-2000:]
        return entry
    prediction, summary = document["prediction"], document["summary"]
    entry.update(
        prediction=prediction["status"],
        held=summary["prediction"]["held"],
        applicable=summary["prediction"]["applicable"],
        by_counter=summary["prediction"]["by_counter"],
        unknown=prediction["unknown"],
        address_orders=prediction.get("address_orders"),
        reason=prediction.get("reason"),
        measured_peak_reserved=summary["largest_peak_reserved_bytes"],
        predicted_peak_reserved=prediction["largest_peak_reserved_bytes"],
        failure=document.get("failure"),
        calibration_failed=[f["op"] for f in document.get("calibration", {}).get("failed", [])],
        rows=[
            {
                "phase": row["phase"] + (f"[{row['repetition']}]" if "repetition" in row else ""),
                "measured": {key: row[key] for key in COUNTERS},
                "predicted": row["predicted"],
                "difference": (
                    {key: row[key] - row["predicted"][key] for key in COUNTERS}
                    if row["predicted"]
                    else None
                ),
            }
            for row in document["phases"]
        ],
    )
    return entry


def line(entry: dict) -> str:
    worst = entry.get("by_counter") or {}
    allocated = max((v for k, v in worst.items() if "allocated" in k), default=None)
    reserved = max((v for k, v in worst.items() if "reserved" in k), default=None)
    orders = entry.get("address_orders") or {}
    spread = max((orders.get("largest_difference_bytes") or {}).values(), default=None)
    return (
        f"{entry['name']:<28} exit {entry['exit']} {entry.get('status', '-'):<13} "
        f"{entry.get('prediction', '-'):<13} held {entry.get('held')!s:<5} "
        f"max |diff| alloc {allocated!s:>10} reserved {reserved!s:>10} "
        f"address orders {spread!s:>8} "
        f"peak reserved {entry.get('measured_peak_reserved')!s:>12} "
        f"(predicted {entry.get('predicted_peak_reserved')!s:>12}) {entry['seconds']:>5} s"
    )


def grid(out: Path) -> list[dict]:
    jobs = [
        (f"{example}-{size}-{dtype}", example, dtype, *SIZES[(example, size)])
        for example in EXAMPLES
        for size in ("small", "large")
        for dtype in ("bfloat16", "float32")
    ]
    with ThreadPoolExecutor(max_workers=ARGS.jobs) as pool:
        entries = list(pool.map(lambda job: measure(*job, out), jobs))
    for entry in entries:
        print(line(entry), flush=True)
    return entries


def sweep(out: Path) -> dict:
    folder = out / "sweep"
    folder.mkdir()
    points, batch = [], 4
    while batch <= ARGS.max_batch:
        entry = measure(f"decoder-b{batch}", "decoder", "bfloat16", batch, SWEEP_DIMS, folder)
        points.append(entry)
        print(line(entry), flush=True)
        if entry.get("status") != "completed":
            break
        batch *= 2
    fitted = [p for p in points if p.get("status") == "completed"]
    summary = {
        "workload": EXAMPLES["decoder"],
        "dtype": "bfloat16",
        "dims": SWEEP_DIMS,
        "points": points,
        "largest_batch_that_fitted": fitted[-1]["batch"] if fitted else None,
        "its_peak_reserved_bytes": fitted[-1]["measured_peak_reserved"] if fitted else None,
        "first_out_of_memory": next(
            ({"batch": p["batch"], "phase": p["failure"]["phase"]}
             for p in points if p.get("status") == "out_of_memory"),
            None,
        ),
    }  # fmt: skip
    print(
        f"sweep: largest batch that fitted {summary['largest_batch_that_fitted']} "
        f"(peak reserved {summary['its_peak_reserved_bytes']} B); "
        f"first out of memory {summary['first_out_of_memory']}"
    )
    return summary


def real_events(snapshot: dict, index: int) -> list[tuple]:
    kinds = {"alloc": "alloc", "free_completed": "free"}
    return [
        (kinds[e["action"]], e["size"], "")
        for e in snapshot["device_traces"][index]
        if e["action"] in kinds
    ]


def grouped(events: list[tuple]) -> list[tuple]:
    """Frees between two allocations as one sorted group: their order does not matter.
    Sizes in the allocator's 512-byte blocks, what the counters see."""
    out, frees = [], []
    for kind, nbytes, what in events:
        size = max(512, -(-nbytes // 512) * 512)
        if kind == "free":
            frees.append(size)
            continue
        if frees:
            out.append(("frees", tuple(sorted(frees)), ""))
            frees = []
        out.append((kind, size, what))
    if frees:
        out.append(("frees", tuple(sorted(frees)), ""))
    return out


def real_order_difference(data: dict, entry: dict) -> int | None:
    """The replay under the GPU's own order of segment addresses against the measured rows:
    the largest difference of any counter (0 where the address order explains it all)."""
    rows = data.get("replay_real_order")
    if not rows or not entry.get("rows"):
        return None
    return max(
        abs(row["measured"][key] - again[key])
        for row, again in zip(entry["rows"], rows, strict=False)
        for key in COUNTERS
    )


def history(out: Path) -> list[dict]:
    folder = out / "history"
    folder.mkdir()
    index = int(ARGS.device.partition(":")[2] or 0)
    results = []
    for name in ARGS.history_points.split(","):
        example, size, dtype = name.split("-")
        if (example, size) not in SIZES or dtype not in ("bfloat16", "float32"):
            raise SystemExit(f"--history-points: no point {name!r} (EXAMPLE-SIZE-DTYPE)")
        pickled = folder / f"{name}.pickle"
        batch, dims = SIZES[(example, size)]
        entry = measure(name, example, dtype, batch, dims, folder, "--memory-history", str(pickled))
        if not pickled.exists():
            results.append({"name": name, "error": "no history written", **entry})
            continue
        data = pickle.loads(pickled.read_bytes())
        real = grouped(real_events(data["snapshot"], index))
        predicted = []
        current = ""
        for kind, size, what in data.get("replay", []):
            if kind == "phase":
                current = what
                continue
            predicted.append((kind, size, f"{current}: {what}"))
        predicted = grouped(predicted)
        part = next(
            (i for i, (a, b) in enumerate(zip(real, predicted, strict=False)) if a[:2] != b[:2]),
            None if len(real) == len(predicted) else min(len(real), len(predicted)),
        )
        listing = [
            f"{i:>6}  {real[i][0] if i < len(real) else '':<6} "
            f"{str(real[i][1]) if i < len(real) else '':>24}   |   "
            f"{predicted[i][0] if i < len(predicted) else '':<6} "
            f"{str(predicted[i][1]) if i < len(predicted) else '':>24}  "
            f"{predicted[i][2] if i < len(predicted) else ''}"
            f"{'   <== parts here' if i == part else ''}"
            for i in range(max(len(real), len(predicted)))
        ]
        (folder / f"{name}.txt").write_text(
            "index  measured (allocator history)        |   predicted (replay)  where\n"
            + "\n".join(listing)
            + "\n"
        )
        result = {
            "name": name,
            "events_measured": len(real),
            "events_predicted": len(predicted),
            "first_difference": part,
            "prediction": entry.get("prediction"),
            "held": entry.get("held"),
            "address_orders": entry.get("address_orders"),
            "largest_difference_under_the_gpus_segment_order": real_order_difference(data, entry),
        }
        if part is not None:
            result["around"] = listing[max(0, part - 4) : part + 5]
        results.append(result)
        print(
            f"history {name:<22} measured {len(real):>5} events, predicted "
            f"{len(predicted):>5}; first difference at {part}; replayed under the GPU's "
            f"segment order, largest difference "
            f"{result['largest_difference_under_the_gpus_segment_order']} B",
            flush=True,
        )
        for text in result.get("around", []):
            print("    " + text)
    return results


def main() -> int:
    out = Path(ARGS.output_dir)
    out.mkdir(parents=True, exist_ok=False)
    only = set(ARGS.only.split(","))
    started = time.perf_counter()
    summary: dict = {"schema": "urn:iteragpu-lab:schema:own-model-grid:v1", "device": ARGS.device}
    if "grid" in only:
        summary["grid"] = grid(out)
    if "sweep" in only:
        summary["sweep"] = sweep(out)
    if "history" in only:
        summary["history"] = history(out)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    held = [e for e in summary.get("grid", []) if e.get("prediction") == "exact"]
    print(
        f"done in {summary['seconds']} s; exact predictions that held: "
        f"{sum(bool(e['held']) for e in held)}/{len(held)}; summary in {out / 'summary.json'}"
    )
    unmeasured = [e["name"] for e in summary.get("grid", []) if "stderr_tail" in e]
    if unmeasured:  # a grid that measured nothing is no success
        print(f"{len(unmeasured)} point(s) not measured: {', '.join(unmeasured)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="own_model_grid.py", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--only", default="grid,sweep,history")
    parser.add_argument("--jobs", type=int, default=2, help="grid processes at a time")
    parser.add_argument("--max-batch", type=int, default=1024, help="the sweep's bound")
    parser.add_argument(
        "--history-points",
        default=",".join(
            [f"{e}-small-{d}" for e in EXAMPLES for d in ("bfloat16", "float32")]
            + ["decoder-large-float32"]
        ),
        help="EXAMPLE-SIZE-DTYPE,... compared event by event with the allocator's history",
    )
    ARGS = parser.parse_args()
    gpu_guard.require_gpu("own_model_grid.py", ARGS.device)
    raise SystemExit(main())
