"""Pictures of runs, sweeps and what a result would cost, in a new folder of their own.

    python3 -m pipeline.stages.report runs/<run-id>/ [runs/<id>-sweep/ ...] \
        [--days 7 --accepted-results 40] [--output NEW_DIR]

A run folder gives memory-<run>.png, a sweep folder peaks-<sweep>.png (with the memory PyTorch
can use on one GPU of each catalogue model drawn across it), and --days with
--accepted-results cost-<days>d-<N>.png: the cost per accepted result of every catalogue model
whose one GPU holds the largest completed peak, by fit.py's rule. They go into one new folder
(by default runs/<id>-report/, under $ITERAGPU_RUNS_DIR when it is set), never into a run
folder, with report.json naming each source file and its SHA-256. Every picture is drawn
before anything is written, and a failure while writing removes what this call wrote.
Exit 0 done, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import io
import json
import math
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import calcul_forfaits
from pipeline.artefacts import validate
from pipeline.core import cli, run_folders, workload_kinds
from pipeline.core.prediction_status import PredictionStatus
from pipeline.core.run_status import RunStatus
from pipeline.core.workload_kinds import Kind
from pipeline.stages import fit

GIB, MIB = 2**30, 2**20
REPORT_SCHEMA = "urn:iteragpu-lab:schema:report:v1"
COUNTERS = {  # key: what a reader calls it
    "baseline_allocated_bytes": "allocated at the phase's start",
    "allocated_bytes": "allocated at its end",
    "peak_allocated_bytes": "peak allocated",
    "baseline_reserved_bytes": "reserved at the phase's start",
    "reserved_bytes": "reserved at its end",
    "peak_reserved_bytes": "peak reserved",
}
# Six counters, six hues a reader tells apart (Okabe and Ito's colour-blind-safe set); the
# reserved counters are also hatched, so that the two families stay apart in grey too.
COLOURS = ["#56B4E9", "#0072B2", "#009E73", "#E69F00", "#D55E00", "#CC79A7"]
HATCHES = ["", "", "", "//", "//", "//"]
GREY = "#737373"  # what is there for scale: the catalogue's lines and notes
DPI = 110  # the pictures' resolution: a title wraps to the figure's width at it
CHAR_PX = 9.5  # a character of a 10-point title at DPI, generously


@dataclass
class Source:
    """One folder given on the command line, read once, with the bytes' SHA-256."""

    folder: Path
    file: str
    document: dict
    sha256: str
    need: fit.Need | None = None  # what it asks of a GPU, when it completed
    gpu_name: str | None = None
    total_memory_bytes: int | None = None

    @property
    def name(self) -> str:
        return self.folder.name


@dataclass
class Plan:
    """What this call will write: every picture rendered before the first byte is written."""

    files: dict[str, bytes] = field(default_factory=dict)
    made_from: dict[str, list[str]] = field(default_factory=dict)
    memory: list[dict] = field(default_factory=list)
    cost: dict | None = None


def pyplot():
    """matplotlib on first use only, so that --help and bad input need none of it."""
    try:
        import matplotlib
    except ImportError:
        raise cli.UsageError(
            "matplotlib is not installed for this Python: python3 -m pip install "
            "matplotlib==3.11.2, or run nox -s report"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_source(folder: Path) -> Source:
    if (folder / "sweep.json").is_file():
        read = validate.checked(folder / "sweep.json", (validate.SWEEP,), "a sweep summary")
        document, data = read.document, read.data
        source = Source(folder, "sweep.json", document, hashlib.sha256(data).hexdigest())
        try:
            if document["largest_fitted"] is not None:
                source.need = fit.sweep_need(folder)
            source.gpu_name = source.need.gpu_name if source.need else None
            totals = [p["total_memory_bytes"] for p in document["points"]]
            source.total_memory_bytes = next((t for t in totals if t), None)
        except (KeyError, TypeError, ValueError) as exc:
            raise cli.UsageError(f"{folder}/sweep.json: not a sweep summary ({exc!r})") from None
        return source
    if (folder / "measurement.json").is_file():
        path = folder / "measurement.json"
        read = validate.checked(path, fit.MEASUREMENTS, "a measurement")
        document, data = read.document, read.data
        source = Source(folder, "measurement.json", document, hashlib.sha256(data).hexdigest())
        try:
            gpu = document["environment"]["gpu"]
            source.gpu_name = gpu.get("name")
            source.total_memory_bytes = gpu.get("total_memory_bytes")
            if document["status"] == RunStatus.COMPLETED:
                source.need = fit.measured_need(path, folder.name, document)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise cli.UsageError(f"{path}: not a measurement ({exc!r})") from None
        return source
    if not folder.exists():
        raise cli.UsageError(f"{folder} does not exist")
    raise cli.UsageError(f"{folder}: neither a run folder nor a sweep folder")


def unit(largest: int) -> tuple[int, str]:
    return (GIB, "GiB (2^30 bytes)") if largest >= GIB else (MIB, "MiB (2^20 bytes)")


def phase_label(row: dict) -> str:
    return row["phase"] + (f" {row['repetition']}" if "repetition" in row else "")


MOST_ROWS = 12  # more rows than this (a decoder's tokens, many warm steps) are folded


def drawn_rows(phases: list[dict]) -> tuple[list[dict], bool]:
    """The rows to draw: all of them, up to MOST_ROWS; beyond, each phase's first row, then,
    for a phase of more rows, one bar of the others' largest value per counter (measured and
    predicted apart), so that a decoder's 128 token rows do not make a picture 160 inches wide."""
    if len(phases) <= MOST_ROWS:
        return phases, False
    groups: dict[str, list[dict]] = {}
    for row in phases:
        groups.setdefault(row["phase"], []).append(row)
    drawn, folded = [], False
    for name, rows in groups.items():
        if len(rows) <= 2:
            drawn += rows
            continue
        folded = True
        rest = rows[1:]
        largest = {key: max(r[key] for r in rest) for key in COUNTERS}
        if all("predicted" in r for r in rest):
            largest["predicted"] = {k: max(r["predicted"][k] for r in rest) for k in COUNTERS}
        drawn += [rows[0], {"phase": f"{name} 2-{len(rows)}, largest", **largest}]
    return drawn, folded


def run_picture(source: Source):
    """Six bars per phase, never summed: allocated is part of reserved, the peaks are maxima."""
    plt = pyplot()
    document = source.document
    phases, folded = drawn_rows(document["phases"])
    scale, unit_name = unit(max(row["peak_reserved_bytes"] for row in phases))
    figure, axes = plt.subplots(figsize=(max(8, 1.25 * len(phases) + 2), 6), layout="constrained")
    width = 0.13
    prediction = document.get("summary", {}).get("prediction", {})
    predicted_label = "predicted by the allocator model"
    if prediction.get("applicable") is False:  # e.g. expandable segments: not a claim
        predicted_label += f" (NOT APPLICABLE: {prediction['not_applicable_because']})"
    elif prediction.get("status") == PredictionStatus.APPROXIMATE:  # says what it does not know
        unknown = [entry["op"] for entry in document.get("prediction", {}).get("unknown", [])]
        predicted_label += f" (APPROXIMATE: {', '.join(unknown) or 'see the file'})"
    for i, (key, name) in enumerate(COUNTERS.items()):
        xs = [p + (i - 2.5) * width for p in range(len(phases))]
        axes.bar(
            xs,
            [row[key] / scale for row in phases],
            width,
            label=name,
            color=COLOURS[i],
            hatch=HATCHES[i],
            edgecolor="white",
            linewidth=0.4,
        )
        if all("predicted" in row for row in phases):
            axes.scatter(
                xs,
                [row["predicted"][key] / scale for row in phases],
                marker="_",
                s=160,
                linewidths=2,
                color="black",
                zorder=3,
                label=predicted_label if i == 0 else None,
            )
    axes.set_xticks(range(len(phases)), [phase_label(row) for row in phases], rotation=20)
    axes.set_ylabel(f"{unit_name}: PyTorch allocator, this process")
    status = (
        ""
        if document["status"] == RunStatus.COMPLETED
        else f" ({document['status'].replace('_', ' ')})"
    )
    folded_text = (
        f"\n{len(document['phases'])} rows: a phase of more than two, its first row and then the "
        "largest of the others per counter"
        if folded
        else ""
    )
    axes.set_title(
        wrapped(
            f"Memory per phase{status}: {source.gpu_name or 'GPU not recorded'}\n"
            f"run {source.name}: {run_text(document)}{folded_text}",
            figure,
        ),
        fontsize=10,
    )
    figure.legend(
        fontsize=8, ncol=2 if len(predicted_label) > 40 else 4, loc="outside lower center"
    )
    return figure


def wrapped(title: str, figure) -> str:
    """Each line of a title wrapped to the figure's width: a title never widens a picture."""
    width = max(40, int(figure.get_figwidth() * DPI / CHAR_PX))
    return "\n".join(
        "\n".join(textwrap.wrap(line, width, break_on_hyphens=False) or [""])
        for line in title.split("\n")
    )


def run_text(document: dict) -> str:
    """The configuration in the workload's own terms: the seed network's, a decoder's, or
    the user's model (its file, function and declared dimensions). A document that names no
    schema is read as the seed network's."""
    kind = workload_kinds.of_schema(document.get("schema")) or workload_kinds.NETWORK
    return DRAWINGS[kind.kind].run_text(document)


def network_run_text(document: dict) -> str:
    c = document["configuration"]
    return f"batch {c['batch']}, context {c['context']}, width {c['width']}, {c['dtype']}"


def own_run_text(document: dict) -> str:
    c, workload = document["configuration"], document["workload"]
    dims = ", ".join(f"{k} {v}" for k, v in sorted(c.get("dims", {}).items()))
    return f"{workload['file']}:{workload['function']}, batch {c['batch']}, " + (
        f"{dims}, {c['dtype']}" if dims else c["dtype"]
    )


def usable_line(source: Source, records: list[fit.Record]) -> tuple[int, str] | None:
    """The memory PyTorch can use on the sweep's GPU, and how the line's label says it."""
    mine = [r for r in records if r.gpu == source.gpu_name]
    if mine:
        memory = fit.measured_memory(source.gpu_name, mine)
        how = "measured"
    elif source.total_memory_bytes:
        memory = fit.Memory(
            source.total_memory_bytes, calcul_forfaits.CONTEXT_ROOM_BYTES, fit.Basis.MEASURED, ""
        )
        how = "total measured, context room the H200's"
    else:
        return None
    label = (
        f"{source.gpu_name or 'this GPU'}: {fit.gib(memory.usable_bytes)} GiB usable by PyTorch "
        f"= {fit.gib(memory.total_bytes)} GiB total - {fit.gib_up(memory.context_bytes)} GiB "
        f"CUDA context ({how})"
    )
    return memory.usable_bytes, label


def catalogue_lines(catalogue: dict, records: list[fit.Record]) -> list[dict]:
    """One line per distinct usable memory among the catalogue's models (fit.py's rule:
    measured where runs exist, else the vendor figure), the models sharing it named together."""
    memory = fit.catalogue_memory(catalogue, records)
    by_usable: dict[tuple[int, str], list[str]] = {}
    for gpu, held in memory.items():
        by_usable.setdefault((held.usable_bytes, held.basis), []).append(gpu)
    return [
        {
            "gpu": ", ".join(sorted(gpus)),
            "usable_bytes": usable,
            "label": f"{' / '.join(sorted(gpus))}: {fit.gib(usable)} GiB ({basis})",
        }
        for (usable, basis), gpus in sorted(by_usable.items())
    ]


def draw_catalogue(
    axes, lines: list[dict], scale: int, top: float, corner: float = 0.99
) -> tuple[float, list]:
    """The models' usable memory as dashed lines, up to twice the largest peak (the others
    named in a corner); returns the height the axis must reach to show them, and the labels
    label_lines() writes once the axis has its limits."""
    shown = [line for line in lines if line["usable_bytes"] / scale <= 2 * top]
    above = [line for line in lines if line not in shown]
    labels = []
    for line in shown:
        measured = line["label"].endswith("(measured)")
        colour = "#b30000" if measured else GREY
        axes.axhline(line["usable_bytes"] / scale, color=colour, linestyle="--", linewidth=0.9)
        labels.append((line["usable_bytes"] / scale, line["label"], colour))
    if above:  # one short line: the smallest of them, and how many there are
        smallest = min(above, key=lambda line: line["usable_bytes"])
        others = f" and {len(above) - 1} more" if len(above) > 1 else ""
        corner_note(axes, corner, f"above this scale: {smallest['label']}{others}", 7.5, GREY)
    return max((line["usable_bytes"] / scale for line in shown), default=0), labels


def corner_note(axes, height: float, text: str, size: float, colour: str) -> None:
    """A note in the axes' top-left corner, at `height` of the axes."""
    axes.text(0.01, height, text, transform=axes.transAxes, va="top", fontsize=size, color=colour)


def offset_label(axes, text: str, xy, xycoords, xytext, va: str, size: float, colour: str, **more):
    """A left-aligned label `xytext` points from `xy`: the usable-memory lines' labels."""
    axes.annotate(
        text,
        xy,
        xycoords=xycoords,
        xytext=xytext,
        textcoords="offset points",
        ha="left",
        va=va,
        fontsize=size,
        color=colour,
        **more,
    )


def label_lines(axes, labels: list, gap: float = 0.032) -> None:
    """Each line's label right of the axes, at its height, pushed up just enough that no two
    overlap (lines close together on a log axis would print over each other)."""
    to_axes = axes.transAxes.inverted()
    placed = -1.0
    for y, text, colour in sorted(labels):
        at = to_axes.transform(axes.transData.transform((0, y)))[1]
        placed = max(at, placed + gap)
        # right of the axes: clear of the points and their labels
        offset_label(axes, text, (1, placed), "axes fraction", (4, 0), "center", 7.5, colour)


def fixed_text(sweep: dict) -> str:
    """What the sweep held fixed, in the workload's terms."""
    base, vary = sweep["plan"]["base"], sweep["plan"]["vary"]
    return DRAWINGS[workload_kinds.of_name(sweep["plan"].get("workload")).kind].fixed_text(
        base, vary
    )


def network_fixed_text(base: dict, vary: str) -> str:
    return ", ".join(
        f"{k} {v}"
        for k, v in base.items()
        if k in ("batch", "context", "width", "dtype") and k != vary
    )


def decoder_fixed_text(base: dict, vary: str) -> str:
    model = base["preset"] or fit.configuration_text({"shape": base["shape"], "preset": None})
    keys = ("batch", "prompt", "new_tokens", "dtype")
    fixed = ", ".join(f"{k} {base[k]}" for k in keys if k != vary)
    return f"{workload_kinds.DECODER.title} {model}, {fixed}"


def own_fixed_text(base: dict, vary: str) -> str:
    return fit.configuration_text({k: v for k, v in base.items() if k != vary})


@dataclass(frozen=True)
class Drawing:
    """How the report names one kind (the kind's code): a run's configuration, what its
    sweep held fixed, and whether its sweep is drawn against the catalogue's GPU models (a
    decoder's: which GPU fits the model) rather than against the GPU it ran on."""

    run_text: Callable[[dict], str]
    fixed_text: Callable[[dict, str], str]
    against_catalogue: bool = False


DRAWINGS = {
    Kind.NETWORK: Drawing(network_run_text, network_fixed_text),
    Kind.DECODER: Drawing(
        lambda document: fit.configuration_text(document["configuration"]),
        decoder_fixed_text,
        against_catalogue=True,
    ),
    Kind.OWN: Drawing(own_run_text, own_fixed_text),
}


def sweep_picture(
    source: Source,
    records: list[fit.Record],
    lines: list[dict] | None = None,
    catalogue: list[dict] | None = None,
):
    """A logarithmic axis where the completed peaks span more than 30 times; otherwise a
    linear axis from zero scaled to the data, so that a sweep of a few MiB is no flat line
    under the GPU's. With `lines` (a decoder sweep's catalogue models), those instead of the
    sweep's GPU's; with `catalogue`, the sweep's GPU's line and every other model's besides.
    A point that ran out of memory is marked where it was tried: at its value, on the line of
    the memory it did not fit in."""
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, ScalarFormatter

    sweep = source.document
    vary = sweep["plan"]["vary"]
    done = [p for p in sweep["points"] if p["status"] == RunStatus.COMPLETED]
    failed = [p for p in sweep["points"] if p["status"] != RunStatus.COMPLETED]
    # The scale is the completed points' peaks alone, the same rule for every workload: what
    # a point that stopped held when it stopped says nothing of what it needed.
    measured = done or sweep["points"]
    values = [p[k] for p in measured for k in ("peak_allocated_bytes", "peak_reserved_bytes")]
    scale, unit_name = unit(max(values))
    reserved = [p["peak_reserved_bytes"] for p in measured]
    log_y = max(reserved) > 30 * max(1, min(reserved))
    own_line = usable_line(source, records)
    figure, axes = plt.subplots(figsize=(10, 6.4), layout="constrained")
    x_done = [p["configuration"][vary] for p in done]
    for key, style, name in (
        ("peak_reserved_bytes", "s-", "peak reserved"),
        ("peak_allocated_bytes", "o-", "peak allocated"),
    ):
        axes.plot(x_done, [p[key] / scale for p in done], style, label=f"{name} (measured)")
    for key, marker in (
        ("predicted_peak_reserved_bytes", "+"),
        ("predicted_peak_allocated_bytes", "x"),
    ):
        axes.plot(
            x_done,
            [math.nan if p[key] is None else p[key] / scale for p in done],  # None: not predicted
            marker,
            color="black",
            markersize=9,
            linestyle="none",
            label=(
                (
                    "predicted by the trace"
                    if lines is not None
                    else "predicted by the allocator model"
                )
                if marker == "+"
                else None
            ),
        )
    top = max(values) / scale
    for n, p in enumerate(failed):  # where the attempt was: above what the GPU could give
        x = p["configuration"][vary]
        what = p["status"].replace("_", " ")
        held = f"{fit.gib(p['peak_reserved_bytes'])} GiB held at the stop"
        if p["status"] == RunStatus.OUT_OF_MEMORY and own_line is not None:
            y = own_line[0] / scale
            text = f"{what} at {x:,}:\nneeds more than\n{fit.gib(own_line[0])} GiB\n({held})"
            name = f"{what}: the point tried, at the memory it could not fit in"
        else:
            y = max(p["peak_reserved_bytes"] / scale, top)
            text = f"{what}\nat {x:,}\n({held})"
            name = f"{what}: the point tried"
        top = max(top, y)
        axes.plot(
            [x],
            [y],
            "X",
            color="red",
            markersize=11,
            linestyle="none",
            label=name if n == 0 else None,
        )
        axes.annotate(  # in the lower right corner, which a rising curve leaves empty
            text,
            (x, y),
            xytext=(0.98, 0.04 + 0.2 * n),
            textcoords="axes fraction",
            ha="right",
            va="bottom",
            fontsize=8,
            color="red",
            bbox={"facecolor": "white", "edgecolor": "red", "linewidth": 0.5, "pad": 3},
            arrowprops={"arrowstyle": "->", "color": "red", "linewidth": 0.8},
        )
    line = None if lines is not None else own_line
    if line is not None and catalogue is not None:  # the sweep's GPU is drawn as its own line
        mine = fit.DEVICE_NAMES.get(source.gpu_name or "")
        lines = [c for c in catalogue if c["gpu"] != mine and c["usable_bytes"] != line[0]]
    far = line is not None and line[0] / scale > (10 if log_y else 2.5) * top
    corner = 0.9 if far else 0.99  # below the note that the GPU's line is far above
    reach, labels = (0, []) if lines is None else draw_catalogue(axes, lines, scale, top, corner)
    if line is not None:
        usable, label = line
        # drawn while the data keep at least 40% of a linear axis (10x on a log one)
        if usable / scale <= (10 if log_y else 2.5) * top:
            axes.axhline(usable / scale, color="red", linestyle="--", label=label)
            reach = max(reach, usable / scale)  # the axis reaches the line
            offset_label(  # left, above the line: the right is where a stopped point goes
                axes,
                f"{fit.gib(usable)} GiB usable by PyTorch",
                (0.01, usable / scale),
                ("axes fraction", "data"),
                (0, 3),
                "bottom",
                8,
                "red",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
            )
        else:  # a line at 140 GiB would flatten peaks of a few MiB: name it instead
            share = 100 * max(values) / usable
            note = f"far above this scale: {label};\nthe largest peak here is {share:.2f}% of it"
            corner_note(axes, 0.98, note, 8, "red")
    xs = [p["configuration"][vary] for p in sweep["points"]]
    if max(xs) >= 8 * min(xs):
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{round(value):,}"))
        if len(xs) <= 12:
            axes.xaxis.set_major_locator(FixedLocator(xs))
        if max(xs) >= 10**6:  # long tick labels would touch
            axes.tick_params(axis="x", labelrotation=25)
        axes.xaxis.set_minor_locator(NullLocator())
    if failed:  # room on the right for the labels of points that stopped
        low, high = axes.get_xlim()
        log_x = axes.get_xscale() == "log"
        axes.set_xlim(low, high * 6 if log_x else high + 0.35 * (high - low))
    if labels:  # what the dashed lines are, in the legend
        axes.plot(
            [],
            [],
            "--",
            color=GREY,
            linewidth=0.9,
            label="usable by PyTorch on one GPU of a catalogue model (total - CUDA context):\n"
            "measured where runs on it exist, else the vendor figure read cautiously",
        )
    if log_y:
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(ScalarFormatter())
        low, high = axes.get_ylim()
        axes.set_ylim(low, max(high, top * 1.5, reach * 1.2))
    else:
        axes.set_ylim(0, max(top * 1.25, reach * 1.06))
    label_lines(axes, labels)
    axes.set_xlabel(vary)
    axes.set_ylabel(f"{unit_name}: PyTorch allocator, this process")
    fixed = fixed_text(sweep)
    subtitle = f"sweep {source.name}: {fixed}; stopped because {sweep['stopped_because']}"
    axes.set_title(
        f"Peak memory against {vary}: {source.gpu_name or 'GPU not recorded'}\n"
        + "\n".join(textwrap.wrap(subtitle, 100)),
        fontsize=10,
    )
    figure.legend(fontsize=8, loc="outside lower center", ncol=2)
    return figure


def cost_picture(result: dict, need: fit.Need):
    """What one accepted result costs on each model that holds the peak, exact to 0.01 cent."""
    plt = pyplot()
    rows = [row for row in result["rows"] if row["fits"]]
    figure, axes = plt.subplots(figsize=(10, 0.45 * len(rows) + 3.2), layout="constrained")
    measured = fit.Basis.MEASURED
    labels = [
        row["name"]
        + (f" ×{row['gpus_per_lot']} lot" if row["gpus_per_lot"] > 1 else "")
        + (" (memory measured)" if row["memory_basis"] == measured else " (memory: vendor)")
        for row in rows
    ]
    values = [int(row["unit_cost_cents"].replace(".", "")) / 10_000 for row in rows]
    bars = axes.barh(labels, values, color="#31a354")
    axes.bar_label(
        bars, [calcul_forfaits._dollars_fine(row["unit_cost_cents"]) for row in rows], padding=3
    )
    axes.invert_yaxis()
    axes.set_xlim(0, max(values) * 1.2)
    axes.set_xlabel(
        f"USD per accepted result: one {result['days']}-day lot / "
        f"{result['accepted_results']} accepted results"
    )
    illustrative = result["price_status"] == "illustrative"
    figure.suptitle(
        "ILLUSTRATIVE PRICES, not IteraGPU's catalogue: do not budget with them"
        if illustrative
        else f"IteraGPU catalogue prices of {result['snapshot_date']}",
        color="#b30000" if illustrative else "black",
        fontsize=12,
        fontweight="bold",
    )
    where = f", measured on {need.gpu_name}" if need.gpu_name else ""
    source = f"from {need.source}: {need.what}{where}"
    axes.set_title(
        f"Models whose one GPU holds the peak reserved {fit.gib_up(need.peak_reserved_bytes)} GiB "
        "+ CUDA context\n" + "\n".join(textwrap.wrap(source, 100)),
        fontsize=9,
    )
    figure.supxlabel(
        "memory: measured where runs on that model exist, else the vendor figure read "
        f"cautiously; tariffs {result['tariffs_file']}, sha256 {result['tariffs_sha256'][:16]}...",
        fontsize=7,
    )
    return figure


def png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    figure.clf()
    pyplot().close(figure)
    return buffer.getvalue()


def drawing_of(source: Source) -> Drawing:
    """The drawing of a sweep's kind, as its plan names it."""
    return DRAWINGS[workload_kinds.of_name(source.document["plan"].get("workload")).kind]


def plan(sources: list[Source], args, runs_dir: Path) -> Plan:
    """Every picture, rendered; report.json is written from what this returns."""
    result = Plan()
    needs = [s.need for s in sources if s.need is not None]
    records = list(fit.evidence(runs_dir, needs).records.values())
    lines = None
    for source in sources:
        try:
            if source.file == "sweep.json" and drawing_of(source).against_catalogue:
                if lines is None:
                    lines = catalogue_lines(fit.load_catalogue(args.tariffs), records)
                name = f"peaks-{source.name}.png"
                result.files[name] = png(sweep_picture(source, records, lines))
                result.memory += [line for line in lines if line not in result.memory]
            elif source.file == "sweep.json":
                if lines is None:
                    lines = catalogue_lines(fit.load_catalogue(args.tariffs), records)
                name = f"peaks-{source.name}.png"
                result.files[name] = png(sweep_picture(source, records, catalogue=lines))
                line = usable_line(source, records)
                mine = fit.DEVICE_NAMES.get(source.gpu_name or "")
                drawn = [c for c in lines if c["gpu"] != mine]  # as sweep_picture draws them
                if line is not None:
                    result.memory.append(
                        {"gpu": source.gpu_name, "usable_bytes": line[0], "label": line[1]}
                    )
                    drawn = [c for c in drawn if c["usable_bytes"] != line[0]]
                result.memory += [c for c in drawn if c not in result.memory]
            else:
                name = f"memory-{source.name}.png"
                result.files[name] = png(run_picture(source))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise cli.UsageError(
                f"{source.folder / source.file}: cannot be drawn ({type(exc).__name__}: {exc})"
            ) from None
        result.made_from[name] = [source.name]
    if args.days is not None:
        if not needs:
            raise cli.UsageError("no completed run or sweep point to price: no cost picture")
        need = max(needs, key=lambda n: n.peak_reserved_bytes)
        catalogue = fit.load_catalogue(args.tariffs)
        memory = fit.catalogue_memory(catalogue, records)
        priced = fit.fit(need, catalogue, memory, args.days, args.accepted_results)
        if not any(row["fits"] for row in priced["rows"]):
            raise cli.UsageError(
                f"no catalogue model holds {fit.gib_up(need.peak_reserved_bytes)} GiB on one GPU: "
                "no cost picture (fit.py shows the table)"
            )
        name = f"cost-{args.days}d-{args.accepted_results}.png"
        result.files[name] = png(cost_picture(priced, need))
        result.made_from[name] = [need.source]
        result.cost = {
            key: priced[key]
            for key in (
                "peak_reserved_bytes",
                "source",
                "days",
                "accepted_results",
                "price_status",
                "snapshot_date",
                "tariffs_file",
                "tariffs_sha256",
                "memory_bases",
            )
        }
    return result


def summary(sources: list[Source], drawn: Plan) -> bytes:
    document = {
        "schema": REPORT_SCHEMA,
        "tool": "report.py",
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sources": [{"folder": s.name, "file": s.file, "sha256": s.sha256} for s in sources],
        "pictures": [
            {
                "file": name,
                "sha256": hashlib.sha256(data).hexdigest(),
                "from": drawn.made_from[name],
            }
            for name, data in drawn.files.items()
        ],
        "usable_memory_lines": drawn.memory,
        "cost": drawn.cost,
    }
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def new_output(args, runs_dir: Path) -> Path:
    """A folder that did not exist: --output, or a new <id>-report beside the runs."""
    if args.output is not None:
        if os.path.lexists(args.output):
            raise cli.UsageError(f"{args.output} already exists: a report goes into a new folder")
        cli.existing_folder(args.output.parent)
        args.output.mkdir()
        return args.output
    try:
        return run_folders.new_run_folder(runs_dir, "-report")
    except FileExistsError:
        raise cli.UsageError(f"{runs_dir}: ten new report ids in a row were taken") from None


def write_all(folder: Path, files: dict[str, bytes]) -> None:
    """Each file whole under its name, or none of this call's files and no folder at all."""
    written = []
    try:
        for name, data in files.items():
            cli.write_new(folder / name, data)
            written.append(folder / name)
    except OSError as exc:
        for path in written:
            path.unlink()
        with contextlib.suppress(OSError):  # not empty: someone else put a file there
            folder.rmdir()
        raise cli.UsageError(
            f"{folder / name}: {exc.strerror or exc}: nothing was written"
        ) from None


def parser() -> cli.Parser:
    parser = cli.Parser(prog="report.py", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("folders", nargs="+", type=Path, metavar="RUN_OR_SWEEP_DIR")
    parser.add_argument("--days", type=calcul_forfaits._days, metavar="{3,7,30}")
    parser.add_argument("--accepted-results", type=calcul_forfaits._count, metavar="N")
    parser.add_argument("--tariffs", metavar="PATH", help="default: data/tarifs-forfaits.csv")
    parser.add_argument("--output", type=Path, metavar="NEW_DIR", help="a folder to create")
    parser.add_argument(
        "--runs-dir",
        metavar="DIR",
        help="where the default output goes and measured memory is looked for "
        "(default: $ITERAGPU_RUNS_DIR, else runs/)",
    )
    return parser


def report_command(args: argparse.Namespace) -> int:
    """Read each source, draw, write a new report folder."""
    if (args.days is None) != (args.accepted_results is None):
        raise cli.UsageError("--days and --accepted-results go together")
    runs_dir = run_folders.runs_directory(args.runs_dir)
    sources = [read_source(folder) for folder in args.folders]
    names = [s.name for s in sources]
    if len(set(names)) < len(names):
        raise cli.UsageError("two sources share a folder name: their pictures would too")
    drawn = plan(sources, args, runs_dir)
    files = {**drawn.files, "report.json": summary(sources, drawn)}
    folder = new_output(args, runs_dir)
    write_all(folder, files)
    for name in files:
        print(f"{folder / name}: written")
    return cli.OK


def main(argv: list[str] | None = None) -> int:
    return cli.run("report.py", lambda: report_command(parser().parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
