"""`decoder.py estimate --gpu` against every committed decoder measurement, without a GPU.

    python tests/benchmarks/decoder_by_trace.py [--only SUBSTRING,...] [--gpu h200]
    python tests/benchmarks/decoder_by_trace.py --points > decoder-points.txt

Each committed decoder measurement under runs/ is traced on the meta device as the given GPU
runs it (its committed calibration, and the attention backend PyTorch picks there), through
the phase driver the measurement used (decoder.measure_rows), as `decoder.py estimate --gpu`
does, and compared with what the GPU measured on all six counters of every phase. Printed
per point: equal or not, the trace's claim (exact or approximate) and whether the measured
peaks lie within its bounds, whether the prediction written in the file when it was measured
was equal (decoder.py 1.0.0's standard-library replay, for the older files), the seconds and
the seconds per layer pass (decoder.ESTIMATE_BUDGET counts them), and the first differences.
Exit 1 if a claimed exact differs or a bound is broken. Not a test: it times.

--points prints instead one line per committed point for `python -m
pipeline.measuring.probe_sweep` (NAME decoder ARGUMENTS): run on the GPU, its probes are what
a calibration needs to cover these points.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root

from pipeline.core.phase_protocol import COUNTER_KEYS  # noqa: E402
from pipeline.measuring import decoder  # noqa: E402
from pipeline.predicting import gpu_calibration  # noqa: E402
from pipeline.predicting import trace_prediction as tp  # noqa: E402
from pipeline.predicting.trace_prediction import PredictionStatus  # noqa: E402
from pipeline.workloads.decoder_shape import Shape  # noqa: E402

DECODER = '"urn:iteragpu-lab:schema:decoder-measurement:v1"'


def committed() -> list[Path]:
    found = []
    for path in sorted((ROOT / "runs").rglob("*.json")):
        with path.open(encoding="utf-8") as file:
            if DECODER in file.read(300):
                found.append(path)
    return found


def trace_point(torch, document: dict, target, calibration) -> tp.Prediction:
    configuration = document["configuration"]
    shape = Shape(**configuration["shape"])
    run = {key: configuration[key] for key in decoder.RUN_DEFAULTS}
    trace = decoder.trace(torch, shape, run, configuration["seed"], target)
    return tp.predict(trace, calibration)


def points_line(path: Path, document: dict) -> str:
    """`NAME decoder ARGUMENTS`: the point's run as decoder.py estimate takes it."""
    configuration = document["configuration"]
    name = "-".join(path.relative_to(ROOT / "runs").with_suffix("").parts[-2:])
    if configuration["preset"]:
        words = ["--preset", configuration["preset"]]
    else:
        shape = configuration["shape"]
        words = [
            f"--{key.replace('_', '-')}={shape[key]}"
            for key in ("layers", "width", "heads", "kv_heads", "head_dim", "ffn", "vocab")
        ]
        words += [
            f"--{key.replace('_', '-')}" for key in ("tie_embeddings", "qkv_bias") if shape[key]
        ]
    words += [f"--{key.replace('_', '-')}={configuration[key]}" for key in decoder.RUN_DEFAULTS]
    return " ".join([name, "decoder", *words])


def compare(prediction: tp.Prediction, measured: list[dict]) -> dict:
    rows = tp.prediction_rows(prediction)
    differences = [
        (m["phase"], m.get("repetition"), key, r[key] - m[key])
        for r, m in zip(rows, measured, strict=False)
        for key in COUNTER_KEYS
        if r[key] != m[key]
    ]
    broken = [
        (m["phase"], m.get("repetition"), key, m[key], low, high)
        for bounds, m in zip(prediction.bounds or [], measured, strict=False)
        for key, (low, high) in bounds.items()
        if not low <= m[key] <= high
    ]
    return {
        "equal": not differences and len(rows) == len(measured),
        "differences": differences,
        "broken": broken,
        "then_equal": all(
            m["predicted"][key] == m[key]
            for m in measured
            if "predicted" in m
            for key in COUNTER_KEYS
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated substrings of the points' paths")
    parser.add_argument("--gpu", default="h200", choices=sorted(gpu_calibration.KNOWN))
    parser.add_argument("--points", action="store_true", help="print probe_sweep.py lines")
    args = parser.parse_args()
    if args.points:
        lines = [points_line(p, json.loads(p.read_text(encoding="utf-8"))) for p in committed()]
        try:
            print("\n".join(lines), flush=True)
        except BrokenPipeError:  # a reader that stops early (| head): not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's recipe
        return 0
    import torch

    calibration, facts = gpu_calibration.load(args.gpu)
    target = gpu_calibration.target(facts)
    points = committed()
    if args.only:
        points = [p for p in points if any(s in str(p) for s in args.only.split(","))]
    totals = dict.fromkeys(("points", "equal", "then_equal", "exact", "false_exact"), 0)
    totals["bounds_broken"] = 0
    print(f"torch {torch.__version__}; calibration {calibration.source}", flush=True)
    for path in points:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document["status"] != "completed":
            print(f"skipped ({document['status']})  {path.relative_to(ROOT)}")
            continue
        started = time.perf_counter()
        prediction = trace_point(torch, document, target, calibration)
        seconds = time.perf_counter() - started
        found = compare(prediction, document["phases"])
        configuration = document["configuration"]
        passes = decoder.layer_passes(Shape(**configuration["shape"]), configuration)
        exact = prediction.status == PredictionStatus.EXACT
        totals["points"] += 1
        totals["equal"] += found["equal"]
        totals["then_equal"] += found["then_equal"]
        totals["exact"] += exact
        totals["false_exact"] += exact and not found["equal"]
        totals["bounds_broken"] += bool(found["broken"])
        bounds = "no bounds" if prediction.bounds is None else (
            "BOUNDS BROKEN" if found["broken"] else "within bounds"
        )  # fmt: skip
        unknown = sorted({entry["op"] for entry in prediction.unknown})
        print(
            f"{'equal' if found['equal'] else 'differs':<8} {prediction.status:<12} "
            f"{bounds:<14} then {'equal' if found['then_equal'] else 'differs':<8}"
            f"{seconds:6.1f} s {1000 * seconds / passes:5.1f} ms/pass  {path.relative_to(ROOT)}",
            flush=True,
        )
        for difference in found["differences"][:3]:
            print(f"    {difference[0]} {difference[1]} {difference[2]}: {difference[3]:+,} B")
        for broken in found["broken"]:
            print(f"    bound broken: {broken}")
        print(f"    not covered: {', '.join(unknown) or 'nothing'}")
    print(
        f"{totals['points']} points: {totals['equal']} equal to the byte by the trace "
        f"({totals['then_equal']} by the prediction written when measured); "
        f"{totals['exact']} said exact, "
        f"{totals['false_exact']} of them wrong; {totals['bounds_broken']} with a bound broken"
    )
    return 1 if totals["false_exact"] or totals["bounds_broken"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
