"""The largest batch, sequence or number of new tokens that fits each catalogue GPU, and its
price, predicted without a GPU.

    python3 -m pipeline.stages.plan --search batch --days 7 -- --hf-config config.json \\
        --task training --dtype bfloat16 --dim sequence=2048 --gpu h200
    python3 -m pipeline.stages.plan --search sequence --days 7 --picture plan.png -- \\
        --workload model.py:build --batch 8

Everything after `--` is `own_model.py estimate`'s own options, less the one searched. Each
value tried is such an estimate, made in this process (torch and transformers imported once).
A GPU holds a value when the peak reserved that `fit` sizes by (the upper bound of an
approximate prediction, the prediction itself where it is exact or claims no bound) plus the
CUDA context fits its memory, as `fit` reads it: measured where runs name the GPU, else the
vendor figure. The answer is given twice: by that need, and by the central figure alone.

The search doubles the value from --start (every value a multiple of --step: a sequence in
multiples of 128, say) until the need passes the largest GPU's memory, --up-to, or a value
the estimate refuses (the model's positions, the trace's budget), then narrows each GPU's
boundary between the values tried, by interpolation, then by halves.
Where a figure is larger than at a larger value tried, the search says so: a predicted peak
can fall (the caching allocator reuses its segments otherwise at another size), an upper
bound that falls where the peak does not is a defect of the prediction. Each GPU's answer is
the largest value below which every value tried fits. A value's status (exact or
approximate) is said beside it. Writes nothing but --picture (never over a file).
Exit 0 answered, 2 bad input (or no value could be predicted).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline import calcul_forfaits
from pipeline.core import cli, run_folders
from pipeline.core.prediction_status import PredictionStatus
from pipeline.stages import fit

SEARCHED = {  # --search NAME: the estimate's option for it
    "batch": "--batch",
    "new_tokens": "--new-tokens",
    "lora_rank": "--lora-rank",
}
GIB = 2**30
MAX_ESTIMATES = 64  # a search that has not settled by then says so and stops


@dataclass
class Point:
    """One value tried: its prediction's figures, or why there is none."""

    value: int
    status: str | None = None  # exact, approximate; None: refused
    peak_reserved_bytes: int | None = None  # the central figure
    need_bytes: int | None = None  # what fit sizes by (the upper bound where there is one)
    refused: str | None = None  # the estimate's one line, where it refused the value
    seconds: float = 0.0


def option_for(search: str) -> tuple[str, str]:
    """(the estimate's option, how a value is written after it) for a searched name."""
    if search in SEARCHED:
        return SEARCHED[search], "{value}"
    return "--dim", f"{search}={{value}}"


def refuse_searched_given(search: str, rest: list[str]) -> None:
    option, _ = option_for(search)
    for index, arg in enumerate(rest):
        name = arg.split("=")[0]
        given = name == option and option != "--dim"
        given = given or (
            name == "--dim" and index + 1 < len(rest) and rest[index + 1].split("=")[0] == search
        )
        given = given or arg.startswith(f"--dim={search}=")
        if given:
            raise cli.UsageError(
                f"--search {search}: the estimate's options must not give {search} (the search "
                "sets it at each value)"
            )
    for flag in ("--json", "--output", "--phases"):
        if flag in rest:
            raise cli.UsageError(f"{flag}: the plan reads each estimate itself; not an option here")


def estimate(rest: list[str], search: str, value: int) -> Point:
    """`own_model.py estimate` of the run at this value, in this process."""
    from pipeline.measuring import own_model

    option, form = option_for(search)
    argv = ["estimate", *rest, option, form.format(value=value), "--json"]
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = own_model.main(argv)
    seconds = time.perf_counter() - started
    if code != cli.OK:  # refused (exit 2), or the workload's own code raised (exit 1)
        said = err.getvalue().strip().splitlines()
        reason = said[-1].removeprefix("own_model.py: error: ") if said else f"exit {code}"
        return Point(value, refused=reason.removeprefix("own_model.py: "), seconds=seconds)
    document = json.loads(out.getvalue())
    prediction = document["prediction"]
    if prediction["status"] == PredictionStatus.NOT_PREDICTED:
        return Point(value, refused=f"not predicted: {prediction.get('reason', '')}",
                     seconds=seconds)  # fmt: skip
    need = fit.traced_prediction_need(document, f"{search} {value}", "")
    return Point(
        value,
        status=prediction["status"],
        peak_reserved_bytes=prediction["largest_peak_reserved_bytes"],
        need_bytes=need.peak_reserved_bytes,
        seconds=seconds,
    )


class Search:
    """The values tried, each estimated once; `say` reports each as it comes."""

    def __init__(self, rest: list[str], search: str, say, unit: int = 1):
        self.rest, self.search, self.say = rest, search, say
        self.unit = unit  # every value tried is a multiple of it (--step)
        self.points: dict[int, Point] = {}

    def at(self, value: int) -> Point:
        if value not in self.points:
            if len(self.points) >= MAX_ESTIMATES:
                raise cli.UsageError(
                    f"--search {self.search}: {MAX_ESTIMATES} estimates without settling"
                )
            point = estimate(self.rest, self.search, value)
            self.points[value] = point
            self.say(point)
        return self.points[value]

    def fits(self, value: int, usable: int, key: str) -> bool | None:
        """Whether the value's figure fits `usable`; None where the value was refused."""
        point = self.at(value)
        figure = getattr(point, key)
        return None if figure is None else figure <= usable

    def boundary(self, low: int, high: int, usable: int, key: str) -> int:
        """The largest value in [low, high) that fits, `low` fitting and `high` not, in
        multiples of the unit: a guess by interpolation of the two figures, values at
        doubling distances from it until the boundary is bracketed (a peak grows in steps:
        the allocator's block and segment sizes), then halves."""
        unit = self.unit
        a, b = getattr(self.at(low), key), getattr(self.at(high), key)
        low, high = low // unit, high // unit  # from here, counts of units

        def fits(count: int) -> bool:
            return self.fits(count * unit, usable, key)

        guess = low + (high - low) // 2
        if b > a:
            guess = low + int((usable - a) * (high - low) / (b - a))
        guess = min(max(guess, low + 1), high - 1)
        step = 1
        if guess > low and fits(guess):
            low = guess
            while low + step < high and fits(low + step):
                low, step = low + step, step * 2
            high = min(high, low + step)
        elif guess > low:
            high = guess
            while high - step > low and not fits(high - step):
                high, step = high - step, step * 2
            low = max(low, high - step)
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        return low * unit


def defects(points: list[Point]) -> tuple[list[str], list[str]]:
    """Where a figure is larger than at the next larger value tried: (defects, predicted).
    A predicted peak that falls is the caching allocator's own doing as the replay models
    it (its segments split and reused otherwise at another size; the libraries' kernels
    chosen otherwise): what the GPU is predicted to do. An upper bound that falls where the
    predicted peak does not is a bound wider at the smaller value: a defect of the
    prediction."""
    found, predicted = [], []
    tried = [p for p in points if p.need_bytes is not None]
    for smaller, larger in itertools.pairwise(tried):
        if smaller.peak_reserved_bytes > larger.peak_reserved_bytes:
            predicted.append(
                f"the predicted peak at {smaller.value} ({smaller.peak_reserved_bytes:,} B, "
                f"{smaller.status}) is larger than at {larger.value} "
                f"({larger.peak_reserved_bytes:,} B, {larger.status})"
            )
        elif smaller.need_bytes > larger.need_bytes:
            found.append(
                f"the upper bound at {smaller.value} ({smaller.need_bytes:,} B) is larger than "
                f"at {larger.value} ({larger.need_bytes:,} B), the predicted peak is not"
            )
    return found, predicted


def largest_fitting(points: list[Point], usable: int, key: str) -> int | None:
    """The largest value tried below which every value tried fits."""
    best = None
    for point in points:
        figure = getattr(point, key)
        if figure is None or figure > usable:
            break
        best = point.value
    return best


def run_search(args, rest: list[str], memory: dict, say) -> dict:
    search = Search(rest, args.search, say, args.step)
    ceiling = max(held.usable_bytes for held in memory.values())
    up_to = args.up_to // args.step * args.step
    value, last, stopped = args.start, None, None
    while True:  # doubling
        point = search.at(value)
        if point.refused is not None:
            stopped = f"{args.search} {value}: {point.refused}"
            break
        last = value
        if point.need_bytes > ceiling and point.peak_reserved_bytes > ceiling:
            stopped = f"{args.search} {value}: past the largest GPU's memory"
            break
        if value >= up_to:
            stopped = f"--up-to {args.up_to} reached"
            break
        value = min(value * 2, up_to)
    if last is None:
        raise cli.UsageError(f"{args.search} {args.start}: {search.points[args.start].refused}")
    for key in ("need_bytes", "peak_reserved_bytes"):
        for usable in sorted({held.usable_bytes for held in memory.values()}):
            tried = sorted(v for v, p in search.points.items() if p.refused is None)
            fitting = [v for v in tried if getattr(search.points[v], key) <= usable]
            failing = [v for v in tried if getattr(search.points[v], key) > usable]
            if fitting and failing and min(failing) > max(fitting):
                search.boundary(max(fitting), min(failing), usable, key)
    points = sorted(search.points.values(), key=lambda p: p.value)
    predicted = [p for p in points if p.refused is None]
    return {"points": points, "predicted": predicted, "stopped": stopped}


def answer(args, found: dict, memory: dict, catalogue: dict) -> dict:
    predicted = found["predicted"]
    rows = []
    for gpu in catalogue["models"]:
        held = memory[gpu]
        quote = calcul_forfaits.quote(catalogue, gpu, args.days, lots=1,
                                          accepted=args.accepted_results)  # fmt: skip
        by_need = largest_fitting(predicted, held.usable_bytes, "need_bytes")
        central = largest_fitting(predicted, held.usable_bytes, "peak_reserved_bytes")
        at = next((p for p in predicted if p.value == by_need), None)
        rows.append({
            "gpu": gpu,
            "name": quote["name"],
            "usable_memory_bytes": held.usable_bytes,
            "memory_basis": held.basis,
            "largest": by_need,
            "status": at.status if at else None,
            "need_bytes": at.need_bytes if at else None,
            "largest_by_central_figure": central,
            "gpus_per_lot": quote["gpus_per_lot"],
            "total_cents": quote["total_cents"],
        })  # fmt: skip
    rows.sort(key=lambda r: (r["largest"] is None, r["total_cents"], r["gpu"]))
    return {
        "search": args.search,
        "estimate_options": found["rest"],
        "days": args.days,
        "rule": "a GPU holds a value when the peak reserved fit sizes by (an approximate "
        "prediction's upper bound) plus the CUDA context fits its memory; the largest value "
        "is the largest tried below which every value tried fits",
        "monotone": not found["defects"] and not found["not_monotone_as_predicted"],
        "defects": found["defects"],
        "not_monotone_as_predicted": found["not_monotone_as_predicted"],
        "stopped": found["stopped"],
        "points": [asdict(p) for p in found["points"]],
        "seconds": round(sum(p.seconds for p in found["points"]), 1),
        **calcul_forfaits.tariff_source(catalogue),
        "rows": rows,
    }


def render(result: dict) -> str:
    search = result["search"]
    lines = [
        f"the largest {search} each GPU holds, predicted without a GPU "
        f"({len(result['points'])} estimates, {result['seconds']} s); "
        f"{result['days']}-day package, one lot",
        f"{'GPU':<14}{'usable GiB':>11}  {'largest':>8}  {'need GiB':>9}  {'status':<12}"
        f"{'central':>8}  {'price':>12}",
    ]
    for row in result["rows"]:
        largest = "none" if row["largest"] is None else str(row["largest"])
        need = "" if row["need_bytes"] is None else fit.gib_up(row["need_bytes"])
        central = row["largest_by_central_figure"]
        lines.append(
            f"{row['gpu']:<14}{fit.gib(row['usable_memory_bytes']):>11}  {largest:>8}  "
            f"{need:>9}  {row['status'] or '':<12}{'none' if central is None else central:>8}  "
            f"{calcul_forfaits.dollars(row['total_cents']):>12}"
        )
    lines.append(f"stopped: {result['stopped']}")
    lines += [f"NOT MONOTONE, a defect of the bound: {said}" for said in result["defects"]]
    lines += [f"not monotone: {said}" for said in result["not_monotone_as_predicted"]]
    if not result["monotone"]:
        lines.append("each GPU's answer stops below the first value that does not fit")
    return "\n".join(lines)


def draw(result: dict, path: Path) -> None:
    """The need and the central figure against the value, one line per GPU memory."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    points = [p for p in result["points"] if p["need_bytes"] is not None]
    values = [p["value"] for p in points]
    figure, axes = pyplot.subplots(figsize=(8, 5))
    axes.plot(values, [p["need_bytes"] / GIB for p in points], "o-", label="need (upper bound)")
    axes.plot(values, [p["peak_reserved_bytes"] / GIB for p in points], "s--",
              label="central figure")  # fmt: skip
    memories: dict[int, list[str]] = {}
    for row in result["rows"]:
        memories.setdefault(row["usable_memory_bytes"], []).append(row["gpu"])
    for usable, gpus in sorted(memories.items()):
        axes.axhline(usable / GIB, color="grey", linewidth=0.8)
        label = f"{', '.join(sorted(gpus))}: {fit.gib(usable)} GiB"
        axes.annotate(label, (values[-1], usable / GIB), fontsize=7, va="bottom", ha="right",
                      color="dimgrey")  # fmt: skip
    # up to a little over the largest GPU: the values past it would flatten the rest
    top = max(memories) * 1.08
    axes.set_ylim(0, top / GIB)
    past = [p["value"] for p in points if p["need_bytes"] > top]
    axes.set_xlim(0, min(past, default=values[-1]) * 1.02)
    axes.set_xlabel(result["search"])
    axes.set_ylabel("peak reserved, GiB")
    axes.set_title(f"the largest {result['search']} each GPU holds")
    axes.legend(loc="upper left")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    pyplot.close(figure)
    cli.write_new(path, buffer.getvalue())


def parser() -> cli.Parser:
    parser = cli.Parser(prog="plan.py", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument(
        "--search", required=True, metavar="NAME",
        help="batch, new_tokens, lora_rank, or a --dim name (sequence, image)",
    )  # fmt: skip
    parser.add_argument("--step", type=cli.bounded_int(1 << 20), default=1,
                        help="every value tried is a multiple of it (default 1; a sequence: "
                        "128, say)")  # fmt: skip
    parser.add_argument(
        "--start", type=cli.bounded_int(1 << 20),
        help="the first value tried, a multiple of --step (default --step)",
    )  # fmt: skip
    parser.add_argument("--up-to", type=cli.bounded_int(1 << 24), default=1 << 20,
                        help="the largest value tried")  # fmt: skip
    calcul_forfaits.add_days(parser)
    calcul_forfaits.add_accepted_results(parser, "distinct useful results accepted")
    parser.add_argument("--tariffs", metavar="PATH", help="tariff file")
    parser.add_argument("--runs-dir", metavar="DIR", help="where measured memory is looked for")
    parser.add_argument("--picture", type=Path, metavar="PNG", help="draw the search (new file)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("estimate", nargs=argparse.REMAINDER,
                        help="-- then own_model.py estimate's options")  # fmt: skip
    return parser


def plan_command(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    rest = args.estimate[1:] if args.estimate[:1] == ["--"] else args.estimate
    if not rest:
        raise cli.UsageError("the run to plan: -- --hf-config FILE ... or -- --workload F.py:FN")
    refuse_searched_given(args.search, rest)
    if args.picture is not None and args.picture.exists():
        raise cli.UsageError(f"--picture {args.picture}: exists; never overwritten")
    if args.picture is not None and importlib.util.find_spec("matplotlib") is None:
        raise cli.UsageError(
            "--picture draws with matplotlib, not installed here: pip install "
            "'matplotlib==3.11.2' (pyproject.toml's `report` extra)"
        )
    args.start = args.step if args.start is None else args.start
    if args.start % args.step:
        raise cli.UsageError(f"--start {args.start} is not a multiple of --step {args.step}")
    if args.start > args.up_to:
        raise cli.UsageError(f"--start {args.start} is over --up-to {args.up_to}")
    catalogue = fit.load_catalogue(args.tariffs)
    found_runs = fit.gpu_records(run_folders.runs_directory(args.runs_dir))
    memory = fit.catalogue_memory(catalogue, list(found_runs.records.values()))
    progress = cli.progress_line("plan.py")

    def say(point: Point) -> None:
        if progress is not None:
            what = point.refused or f"{point.status}, need {fit.gib_up(point.need_bytes)} GiB"
            progress(f"{args.search} {point.value}: {what}")

    found = run_search(args, rest, memory, say)
    if progress is not None:
        progress(None)
    found["rest"] = rest
    found["defects"], found["not_monotone_as_predicted"] = defects(found["predicted"])
    result = answer(args, found, memory, catalogue)
    if args.picture is not None:
        draw(result, args.picture)
    print(json.dumps(result, indent=2) if args.json else render(result), flush=True)
    return cli.OK


def main(argv: list[str] | None = None) -> int:
    return cli.run("plan.py", lambda: plan_command(argv))


if __name__ == "__main__":
    sys.exit(main())
