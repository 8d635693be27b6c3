"""Pictures of measured memory, predicted beside measured, and what a result would cost.

    python3 pipeline/report.py runs/<run-id>/ [runs/<id>-sweep/ ...] [--days 7 \
        --accepted-results 40]

For a run folder: `memory.png`, bars of baseline / end / peak allocated and reserved per
phase, the predicted allocated values marked. For a sweep folder (sweep.json): `peaks.png`,
peak allocated and reserved against the varied dimension, the GPU's total memory as a line.
With --days and --accepted-results: `cost-<days>d-<results>.png` in the last folder given,
the cost per accepted result of one lot of every catalogue model whose memory per GPU holds
the largest measured peak reserved. Pictures are new files: an existing one is never
replaced (exit 2 before anything is drawn). Exit 0 done, 2 bad input.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import calcul_forfaits
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

GIB = 2**30
MEASURED = (
    "baseline_allocated_bytes",
    "allocated_bytes",
    "peak_allocated_bytes",
    "baseline_reserved_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
)


class ReportError(Exception):
    """Bad input: one line, exit 2, no picture written."""


def label(row: dict) -> str:
    return row["phase"] + (f" {row['repetition']}" if "repetition" in row else "")


def unit(largest: int) -> tuple[int, str]:
    return (GIB, "GiB") if largest >= GIB else (2**20, "MiB")


def run_picture(document: dict, title: str):
    phases = document["phases"]
    scale, name = unit(max(row["peak_reserved_bytes"] for row in phases))
    figure, axes = plt.subplots(figsize=(max(8, 1.3 * len(phases)), 4.8))
    width = 0.13
    colours = ["#9ecae1", "#4292c6", "#08519c", "#fdae6b", "#f16913", "#a63603"]
    for i, key in enumerate(MEASURED):
        xs = [p + (i - 2.5) * width for p in range(len(phases))]
        axes.bar(
            xs,
            [row[key] / scale for row in phases],
            width,
            label=key.replace("_bytes", ""),
            color=colours[i],
        )
        if "allocated" in key and all("predicted" in row for row in phases):
            axes.scatter(
                xs,
                [row["predicted"][key] / scale for row in phases],
                marker="_",
                s=200,
                color="black",
                zorder=3,
                label="predicted" if key == "baseline_allocated_bytes" else None,
            )
    axes.set_xticks(range(len(phases)), [label(row) for row in phases], rotation=20)
    axes.set_ylabel(f"{name} (PyTorch allocator, this process, this GPU)")
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    return figure


def sweep_picture(sweep: dict):
    vary = sweep["plan"]["vary"]
    points = sweep["points"]
    xs = [p["configuration"][vary] for p in points]
    figure, axes = plt.subplots(figsize=(8, 4.8))
    axes.plot(
        xs,
        [p["peak_allocated_bytes"] / GIB for p in points],
        "o-",
        label="peak allocated (measured)",
    )
    axes.plot(
        xs, [p["peak_reserved_bytes"] / GIB for p in points], "s-", label="peak reserved (measured)"
    )
    axes.plot(
        xs,
        [p["predicted_peak_allocated_bytes"] / GIB for p in points],
        "k+",
        markersize=12,
        label="peak allocated (predicted)",
    )
    total = next((p["total_memory_bytes"] for p in points if p.get("total_memory_bytes")), None)
    if total:
        axes.axhline(total / GIB, color="red", linestyle="--", label="GPU total memory")
    for p, x in zip(points, xs, strict=True):
        if p["status"] == "out_of_memory":
            axes.annotate("out of memory", (x, p["peak_reserved_bytes"] / GIB), fontsize=8)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel(vary)
    axes.set_ylabel("GiB")
    base = {k: v for k, v in sweep["plan"]["base"].items() if k != vary}
    axes.set_title(f"sweep of {vary}, {base}", fontsize=8)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def cost_picture(peak_reserved: int, days: int, accepted: int, tariffs: Path | None):
    catalogue = calcul_forfaits.load_tariffs(tariffs or calcul_forfaits.default_tariffs())
    need_gib = peak_reserved / GIB
    result = calcul_forfaits.compare(catalogue, days, lots=1, accepted=accepted, min_memory=None)
    fitting = [row for row in result["rows"] if float(row["memory_gib_per_gpu"]) >= need_gib]
    if not fitting:
        raise ReportError(f"no catalogue model has {need_gib:.2f} GiB per GPU")
    fitting.sort(key=lambda row: int(row["total_cents"]))
    figure, axes = plt.subplots(figsize=(8, 0.4 * len(fitting) + 1.6))
    values = [float(row["unit_cost_cents"]) / 100 for row in fitting]
    axes.barh([row["gpu"] for row in fitting], values, color="#31a354")
    axes.invert_yaxis()
    axes.set_xlabel(f"USD per accepted result ({accepted} results, one lot, {days} days)")
    axes.set_title(
        f"models whose memory per GPU holds the measured peak reserved "
        f"({need_gib:.2f} GiB); {result['price_status']} prices of "
        f"{result['snapshot_date']}",
        fontsize=8,
    )
    figure.tight_layout()
    return figure


def png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    plt.close(figure)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report.py", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--days", type=int, choices=calcul_forfaits.DURATIONS)
    parser.add_argument("--accepted-results", type=calcul_forfaits._count)
    parser.add_argument("--tariffs", type=Path)
    args = parser.parse_args(argv)
    try:
        return draw(args)
    except ReportError as exc:
        print(f"report.py: error: {exc}", file=sys.stderr)
        return 2


def draw(args: argparse.Namespace) -> int:
    if (args.days is None) != (args.accepted_results is None):
        raise ReportError("--days and --accepted-results go together")
    plans, peak = [], 0
    for text in args.folders:
        folder = Path(text)
        if (folder / "sweep.json").is_file():
            sweep = json.loads((folder / "sweep.json").read_text())
            peak = max([peak] + [p["peak_reserved_bytes"] for p in sweep["points"]])
            plans.append((folder / "peaks.png", lambda s=sweep: sweep_picture(s)))
        elif (folder / "measurement.json").is_file():
            document = json.loads((folder / "measurement.json").read_text())
            peak = max(peak, document["summary"]["largest_peak_reserved_bytes"])
            c = document["configuration"]
            title = (
                f"{folder.name}: batch {c['batch']}, context {c['context']}, width "
                f"{c['width']}, {c['dtype']}, {document['environment']['gpu'].get('name')}"
            )
            plans.append((folder / "memory.png", lambda d=document, t=title: run_picture(d, t)))
        else:
            raise ReportError(f"{folder}: neither a run folder nor a sweep folder")
    if args.days:
        target = Path(args.folders[-1]) / f"cost-{args.days}d-{args.accepted_results}.png"
        plans.append(
            (target, lambda: cost_picture(peak, args.days, args.accepted_results, args.tariffs))
        )
    existing = [str(path) for path, _ in plans if path.exists()]
    if existing:
        raise ReportError(f"{existing[0]} already exists: pictures are never replaced")
    for path, make in plans:
        data = png(make())
        with open(path, "xb") as handle:
            handle.write(data)
        print(f"{path}: written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
