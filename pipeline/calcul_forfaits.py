#!/usr/bin/env python3
"""Price IteraGPU rental packages from the kit's tariff file (standard library only).

    python calcul_forfaits.py --gpu b200 --days 7 --lots 2
    python calcul_forfaits.py --compare --days 7 --gpus 4 --min-memory-gib 80

A package is sold whole: a lot of one GPU model (a B200 lot holds two GPUs) for
3, 7 or 30 days, priced in integer USD cents. Totals are lot price x lots, with no
proration and no currency conversion, so they stay integers and are printed from
cents without any float.

Ratios (unit cost per accepted result, price per GPU-day) are the exact quotient
rounded once, half to even (decimal.ROUND_HALF_EVEN), to 0.01 cent, and given in
JSON as a decimal string of cents ("12.35"): an unbiased rule, so unit cost x N
differs from the total by at most 0.005 x N cents.

Memory is judged as PyTorch will see it, from the vendor's figure only (this script
reads no measurement): the tariff file's nominal GiB per GPU, each taken as 10^9 bytes
(6.9% less), less the CUDA context (MEMORY_RULE says the figures and their source).

The tariff file is looked for beside this script (the kit's layout), then in
../data/ (this repository's layout), unless --tariffs names one. Every quote names
its price_status (illustrative or catalogue), snapshot date and SHA-256, read
from the file itself, so a real catalogue snapshot drops in without code change.
The script prints and writes no file. Exit 0: printed; 2: bad input or tariff
file, said in one line on stderr; 1: the reader closed the pipe early.
"""

import argparse
import csv
import datetime
import decimal
import fractions
import hashlib
import io
import os
import re
import sys

PROG = "calcul_forfaits.py"
TARIFF_FILE = "tarifs-forfaits.csv"
DURATIONS = (3, 7, 30)

# Column -> (pattern a whole cell must match, what the reason says it must be).
# Same rules as schemas/tariff-row.schema.json; a test holds the two together.
COLUMNS = {
    "gpu": (r"[a-z0-9][a-z0-9-]*", "a lowercase id (a-z, 0-9, '-')"),
    "name": (r"\S(.*\S)?", "a name without leading or trailing spaces"),
    "gpus_per_lot": (r"[1-9][0-9]*", "a positive integer"),
    "memory_gib_per_gpu": (r"[1-9][0-9]{0,3}", "a positive integer of GiB, at most 9999"),
    "days": (r"3|7|30", "3, 7 or 30"),
    "lot_price_cents": (
        r"[1-9][0-9]{0,11}",
        "a positive integer of USD cents, at most 999999999999 (12 digits)",
    ),
    "currency": (r"USD", "USD (no currency conversion)"),
    "price_status": (r"illustrative|catalogue", "'illustrative' or 'catalogue'"),
    "snapshot_date": (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "a date YYYY-MM-DD"),
}
CONTROL = r"[\x00-\x1f\x7f]"  # no cell may hold one: a line break, a tab, a NUL...
PER_MODEL = ("name", "gpus_per_lot", "memory_gib_per_gpu")
PER_FILE = ("currency", "price_status", "snapshot_date")


GIB = 2**30
# What the allocator cannot have, measured on an NVIDIA H200 (driver 580.159.04, CUDA 13.0,
# PyTorch 2.11): total minus free memory as the process starts, in every committed run; and
# what CUDA adds when the first forward passes load their kernels (lazy module loading).
CONTEXT_AT_START_BYTES = 552_402_944
KERNELS_LOADED_LATER_BYTES = 165_675_008
CONTEXT_ROOM_BYTES = CONTEXT_AT_START_BYTES + KERNELS_LOADED_LATER_BYTES
# A vendor's memory figure is nominal: PyTorch saw 139.80 GiB of the H200's 141, and ECC
# takes about 1/16 of GDDR memory where it is on. Taking each nominal GiB as 10^9 bytes
# (6.9% off) covers both; a measurement, where one exists, replaces the guess (pipeline/fit.py).
VENDOR_BYTES_PER_GIB = 10**9
MEMORY_RULE = (
    "nominal GiB per GPU taken as 10^9 bytes each (6.9% off: "
    "PyTorch saw 139.80 GiB of the H200's nominal 141, and ECC takes about 1/16 of GDDR "
    "memory), less 0.67 GiB for the CUDA context (measured on an NVIDIA H200)"
)


class InputError(Exception):
    """Bad input or tariff file: one line on stderr, exit 2."""


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help wraps at 80 columns: a fixed width keeps every run from sizing the terminal."""

    def __init__(self, prog):
        super().__init__(prog, width=80)


class _Parser(argparse.ArgumentParser):
    """Turns argparse's usage dump and exit into an InputError, like every other error."""

    def error(self, message):
        raise InputError(message)


def _option_value(text, pattern, expected, convert):
    """`convert(text)` when the whole text matches `pattern`, else one line saying why."""
    if not re.fullmatch(pattern, text):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
    return convert(text)


def _count(text):
    """Counts are plain digits, so '1e3', ' 7', '+2', '٣' or '0' cannot slip through int()."""
    expected = "a positive integer from 1 to 999999999999"
    return _option_value(text, r"[1-9][0-9]{0,11}", expected, int)


def _days(text):
    expected = "3, 7 or 30 (whole packages only, no proration)"
    return _option_value(text, r"3|7|30", expected, int)


def _gib(text):
    expected = "a number of GiB such as 80 or 79.5"
    return _option_value(text, r"[0-9]+(?:\.[0-9]+)?", expected, decimal.Decimal)


def add_days(parser):
    """--days, as every command that prices a package takes it (fit.py too)."""
    parser.add_argument(
        "--days", type=_days, required=True, metavar="{3,7,30}", help="package length in days"
    )


def add_accepted_results(parser, help_text):
    """--accepted-results, the count a unit cost divides by (fit.py too)."""
    parser.add_argument("--accepted-results", type=_count, metavar="N", help=help_text)


def _parser():
    parser = _Parser(
        prog=PROG,
        allow_abbrev=False,  # --gpu and --gpus are one letter apart: no guessing
        formatter_class=_Help,
        description="Price an IteraGPU package (lots of GPUs for 3, 7 or 30 days),\n"
        "or compare every model for one need.",
        epilog="examples:\n"
        "  %(prog)s --gpu b200 --days 7 --lots 2\n"
        "  %(prog)s --gpu h100 --days 30 --gpus 4 --accepted-results 12000 --json\n"
        "  %(prog)s --compare --days 7 --gpus 4 --min-memory-gib 80\n\n"
        "Prices come from the tariff file and say whether they are illustrative.\n"
        "Memory usable by PyTorch is a cautious reading of the vendor figure: its GiB\n"
        "taken as 10^9 bytes, less 0.67 GiB of CUDA context (measured on an H200).\n"
        "A tariff proves neither availability nor a reservation: check the live offer.",
    )
    parser.add_argument("--gpu", metavar="ID", help="model id from the tariff file, e.g. b200")
    parser.add_argument(
        "--compare", action="store_true", help="price every model instead, cheapest first"
    )
    add_days(parser)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--lots", type=_count, metavar="N", help="lots to buy (quote default: 1)")
    size.add_argument(
        "--gpus",
        type=_count,
        metavar="N",
        help="GPUs needed: buys ceil(N / gpus_per_lot) lots (compare default: 1)",
    )
    add_accepted_results(
        parser,
        "distinct useful results actually accepted (no default; repeats of one benchmark do "
        "not count); gives the unit cost",
    )
    parser.add_argument(
        "--min-memory-gib",
        type=_gib,
        metavar="X",
        help="with --compare: keep models where X GiB of PyTorch memory (a peak reserved) "
        "fits on one GPU, judged from the vendor figure (see the note below)",
    )
    parser.add_argument(
        "--tariffs",
        metavar="PATH",
        help=f"tariff file (default: {TARIFF_FILE} beside this script, else in ../data/)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _shown(path):
    """Names the default file relative to here, never by an absolute path that holds a home."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive, on Windows
        return os.path.basename(path)
    return os.path.basename(path) if relative.startswith(os.pardir) else relative


def default_tariffs():
    """The kit ships the tariffs beside the script; this repository keeps them in ../data/."""
    here = os.path.dirname(os.path.realpath(__file__))
    for candidate in (
        os.path.join(here, TARIFF_FILE),
        os.path.join(here, os.pardir, "data", TARIFF_FILE),
    ):
        if os.path.isfile(candidate):
            return candidate
    raise InputError(f"no {TARIFF_FILE} beside the script nor in ../data/: pass --tariffs PATH")


def load_tariffs(path, shown=None):
    """Reads and checks the whole grid, so no quote is ever priced from a broken file."""
    shown = path if shown is None else shown
    data = _read_bytes(path, shown)
    header, rows = _read_rows(data, shown)
    tariffs = {}
    models = {}  # gpu -> (line, row) of the model's first row
    for line, record in rows:
        where = f"{shown}:{line}"
        row = _checked_row(header, record, where)
        _check_against_earlier_rows(row, tariffs, models, where)
        models.setdefault(row["gpu"], (line, row))
        tariffs[row["gpu"], int(row["days"])] = row
    _check_complete(tariffs, models, shown)
    first = next(iter(tariffs.values()))
    return {
        "tariffs": tariffs,
        "models": list(models),
        "price_status": first["price_status"],
        "snapshot_date": first["snapshot_date"],
        "file": os.path.basename(path),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


# The grid is a few kB (a catalogue of a hundred models would be 30 kB): a larger file is
# refused from its size, before it is read whole.
MAX_TARIFF_BYTES = 1 << 20


def _read_bytes(path, shown):
    """The file's bytes: the SHA-256 that every quote names is of these exact bytes."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_TARIFF_BYTES + 1)
    except OSError as error:
        raise InputError(f"cannot read tariff file {shown}: {error.strerror}") from None
    if len(data) > MAX_TARIFF_BYTES:
        raise InputError(
            f"tariff file {shown}: over the limit of {MAX_TARIFF_BYTES} bytes (a grid is a few kB)"
        )
    return data


def _read_rows(data, shown):
    """The header, checked, and the non-blank records with the line each starts on."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise InputError(f"{shown}:{line}: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows = []
    try:
        header = next(reader, None)
        _check_header(header, shown)
        end = reader.line_num
        for record in reader:  # a quoted cell may span lines: report where its record starts
            start, end = end + 1, reader.line_num
            if record:  # the csv module gives [] for a blank line
                rows.append((start, record))
    except csv.Error as error:
        raise InputError(f"{shown}:{reader.line_num}: not valid CSV ({error})") from None
    return header, rows


def _check_header(header, shown):
    if not header:
        raise InputError(f"{shown}:1: no header row")
    for column in COLUMNS:
        if column not in header:
            raise InputError(f"{shown}:1: missing column {column!r}")
    for column in header:
        if column not in COLUMNS or header.count(column) > 1:
            what = "duplicate" if column in COLUMNS else "unknown"
            raise InputError(f"{shown}:1: {what} column {column!r}")


def _checked_row(header, record, where):
    """One record as a dict whose every cell follows its column's rule (the row schema's)."""
    if len(record) != len(header):
        raise InputError(f"{where}: {len(record)} fields, the header has {len(header)}")
    row = dict(zip(header, record, strict=True))
    for column, (pattern, meaning) in COLUMNS.items():
        value = row[column]
        if re.search(CONTROL, value):
            raise InputError(f"{where}: {column} holds a line break or control character")
        if not re.fullmatch(pattern, value):
            raise InputError(f"{where}: {column} must be {meaning}, got {value!r}")
    try:
        datetime.date.fromisoformat(row["snapshot_date"])
    except ValueError:
        raise InputError(
            f"{where}: snapshot_date {row['snapshot_date']!r} is no real date"
        ) from None
    return row


def _check_against_earlier_rows(row, tariffs, models, where):
    """The rules a single row cannot break alone: one tariff per model and duration, one
    catalogue snapshot per file, one description per model."""
    gpu, days = row["gpu"], int(row["days"])
    if (gpu, days) in tariffs:
        raise InputError(f"{where}: duplicate tariff for {gpu} {days} days")
    if models:
        _, first = next(iter(models.values()))
        for column in PER_FILE:
            if row[column] != first[column]:
                raise InputError(
                    f"{where}: {column} {row[column]!r} differs from {first[column]!r} "
                    "(one file is one catalogue snapshot)"
                )
    if gpu in models:
        _, same = models[gpu]
        for column in PER_MODEL:
            if row[column] != same[column]:
                raise InputError(
                    f"{where}: {column} {row[column]!r} differs from {same[column]!r} "
                    f"on {gpu}'s first row"
                )


def _check_complete(tariffs, models, shown):
    """Every model is sold for every duration, so a comparison never silently drops one."""
    if not tariffs:
        raise InputError(f"{shown}:2: no tariff rows")
    for gpu, (line, _) in models.items():
        for days in DURATIONS:
            if (gpu, days) not in tariffs:
                raise InputError(f"{shown}:{line}: {gpu} has no {days}-day tariff")


def ratio_hundredths(cents, divisor):
    """cents / divisor in hundredths of a cent, rounded once, half to even.

    The precision keeps more digits than can separate the quotient from a
    rounding half-point (they are at least 1/(2 x divisor) apart unless equal),
    so the division's own rounding never changes the final one.
    """
    with decimal.localcontext() as context:
        context.prec = len(str(cents)) + len(str(divisor)) + 6
        exact = decimal.Decimal(cents) * 100 / divisor
        return int(exact.to_integral_value(rounding=decimal.ROUND_HALF_EVEN))


def _cents_text(hundredths):
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def dollars(cents):
    """$1,234.56 from integer cents, with integer arithmetic only."""
    return f"${cents // 100:,}.{cents % 100:02d}"


def _dollars_fine(cents_text):
    """$1.2345 from a ratio's cents text "123.45": four places keep its 0.01 cent."""
    whole, hundredths = cents_text.split(".")
    return f"${int(whole) // 100:,}.{int(whole) % 100:02d}{hundredths}"


def notice(catalogue, accepted=None, compare=False):
    """What a price does not prove, worded from the file's own price_status."""
    date, file = catalogue["snapshot_date"], catalogue["file"]
    if catalogue["price_status"] == "illustrative":
        lines = [
            f"Illustrative prices in the catalogue's format, not IteraGPU's figures of {date}: "
            f"do not budget with them; replace {file} with the real snapshot."
        ]
    else:
        lines = [f"IteraGPU catalogue prices as of {date}; they may have changed since."]
    lines += [
        "A tariff proves neither current availability nor a reservation: "
        "check the live offer before buying.",
        "Whole packages of 3, 7 or 30 days in USD: no hourly proration, no currency conversion.",
        f"Memory for PyTorch is the vendor figure, not measured: {MEMORY_RULE}.",
    ]
    if accepted is not None:
        lines.append(
            f"Unit cost = full package price / {accepted} accepted results: distinct useful "
            "units, not repeats of one benchmark"
            + ("; the same count is assumed on every model." if compare else ".")
        )
    return lines


def usable_bytes(row):
    """Memory PyTorch's allocator may hold on one GPU of the row's model, by MEMORY_RULE."""
    return int(row["memory_gib_per_gpu"]) * VENDOR_BYTES_PER_GIB - CONTEXT_ROOM_BYTES


def gib_floor_text(nbytes):
    """GiB to 0.01, rounded down: memory said to be usable is never rounded up."""
    hundredths = nbytes * 100 // GIB
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def quote(catalogue, gpu, days, lots=None, gpus=None, accepted=None):
    """One package: `lots` lots, or the fewest whole lots that give `gpus` GPUs."""
    if gpu not in catalogue["models"]:
        valid = ", ".join(sorted(catalogue["models"]))
        raise InputError(f"unknown GPU model {gpu!r}; valid ids: {valid}")
    row = catalogue["tariffs"][gpu, days]
    per_lot = int(row["gpus_per_lot"])
    if lots is None:
        lots = -(-gpus // per_lot)  # ceil: a lot is never split
    price = int(row["lot_price_cents"])
    total = price * lots
    unit = None if accepted is None else _cents_text(ratio_hundredths(total, accepted))
    return {
        "gpu": gpu,
        "name": row["name"],
        "memory_gib_per_gpu": int(row["memory_gib_per_gpu"]),
        "usable_memory_bytes": usable_bytes(row),
        "memory_source": "vendor figure",
        "days": days,
        "gpus_requested": gpus,
        "lots": lots,
        "gpus_per_lot": per_lot,
        "gpus": per_lot * lots,
        "price_per_lot_cents": price,
        "total_cents": total,
        "currency": row["currency"],
        "price_per_gpu_day_cents": _cents_text(ratio_hundredths(total, per_lot * lots * days)),
        "accepted_results": accepted,
        "unit_cost_cents": unit,
        **tariff_source(catalogue),
    }


def tariff_source(catalogue):
    """Where every price of a result comes from: its status, its date and the file's hash."""
    return {
        "price_status": catalogue["price_status"],
        "snapshot_date": catalogue["snapshot_date"],
        "tariffs_file": catalogue["file"],
        "tariffs_sha256": catalogue["sha256"],
    }


def compare(catalogue, days, lots=None, gpus=None, accepted=None, min_memory=None):
    """Every model that fits, cheapest total first: the buyer's question."""
    quotes = [
        quote(catalogue, gpu, days, lots, gpus, accepted)
        for gpu in catalogue["models"]
        if min_memory is None
        or usable_bytes(catalogue["tariffs"][gpu, days]) >= fractions.Fraction(min_memory) * GIB
    ]
    quotes.sort(key=lambda q: (q["total_cents"], q["gpu"]))
    return {
        "days": days,
        "gpus_requested": gpus,
        "lots": lots,
        "min_memory_gib": None if min_memory is None else str(min_memory),
        "memory_rule": MEMORY_RULE,
        "accepted_results": accepted,
        **tariff_source(catalogue),
        "notice": notice(catalogue, accepted, compare=True),
        "rows": quotes,
    }


def _heading(what, result):
    if result["price_status"] == "illustrative":
        return f"IteraGPU {what}: ILLUSTRATIVE PRICES, not IteraGPU's catalogue"
    return f"IteraGPU {what}: catalogue prices of {result['snapshot_date']}"


def _source(result):
    return (
        f"tariffs: {result['tariffs_file']}, price_status {result['price_status']}, "
        f"snapshot {result['snapshot_date']}, sha256 {result['tariffs_sha256']}"
    )


def _plural(count, word):
    return f"{count} {word}{'' if count == 1 else 's'}"


def _lots_text(q):
    text = (
        f"{q['lots']} x {_plural(q['gpus_per_lot'], 'GPU')} per lot = {_plural(q['gpus'], 'GPU')}"
    )
    if q["gpus_requested"] is not None and q["gpus"] != q["gpus_requested"]:
        text += f" ({q['gpus_requested']} asked; a lot is never split)"
    return text


def render_quote(q):
    lines = [
        _heading("package quote", q),
        f"  model            {q['name']} ({q['gpu']}), {q['memory_gib_per_gpu']} GiB per GPU "
        "(vendor's nominal figure)",
        f"  for PyTorch      {gib_floor_text(q['usable_memory_bytes'])} GiB per GPU "
        "(cautious reading: see below)",
        f"  package          {q['days']} days, whole package",
        f"  lots             {_lots_text(q)}",
        f"  price per lot    {dollars(q['price_per_lot_cents'])} {q['currency']}",
        f"  total            {dollars(q['total_cents'])} {q['currency']} "
        f"(price per lot x {_plural(q['lots'], 'lot')})",
        f"  per GPU-day      {_dollars_fine(q['price_per_gpu_day_cents'])}",
    ]
    if q["unit_cost_cents"] is None:
        lines.append("  unit cost        null: give --accepted-results N to divide the total")
    else:
        lines.append(
            f"  unit cost        {_dollars_fine(q['unit_cost_cents'])} per accepted "
            f"result ({q['accepted_results']} accepted; 0.01 cent, half to even)"
        )
    return _with_source_and_notice(lines, q, "What this price does not prove:")


def _with_source_and_notice(lines, result, heading):
    """The text's end: where the prices come from, then what they do not prove."""
    lines += [f"  {_source(result)}", heading, *(f"  - {line}" for line in result["notice"])]
    return "\n".join(lines)


def render_comparison(result):
    basis = (
        f"{_plural(result['lots'], 'lot')} of each model"
        if result["lots"] is not None
        else _plural(result["gpus_requested"], "GPU")
    )
    memory = result["min_memory_gib"]
    lines = [
        _heading("package comparison", result),
        f"{result['days']} days, {basis}"
        + (f", at least {memory} GiB per GPU for PyTorch" if memory is not None else "")
        + ", cheapest total first",
    ]
    table = [["model", "nominal GiB", "for PyTorch", "lots", "GPUs", "total USD", "per GPU-day"]]
    if result["accepted_results"] is not None:
        table[0].append("per accepted result")
    notes = []
    for q in result["rows"]:
        cells = [
            q["gpu"],
            str(q["memory_gib_per_gpu"]),
            gib_floor_text(q["usable_memory_bytes"]),
            str(q["lots"]),
            str(q["gpus"]),
            dollars(q["total_cents"]),
            _dollars_fine(q["price_per_gpu_day_cents"]),
        ]
        if q["unit_cost_cents"] is not None:
            cells.append(_dollars_fine(q["unit_cost_cents"]))
        table.append(cells)
        if q["gpus_per_lot"] > 1:
            notes.append(f"{q['gpu']}: {_lots_text(q)}")
    if len(table) == 1:
        lines.append(
            f"No model in {result['tariffs_file']} has {memory} GiB per GPU for PyTorch "
            "(vendor figures, cautious reading: see below)."
        )
    else:
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            left = row[0].ljust(widths[0])
            right = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
            lines.append("  " + "  ".join([left, *right]))
    lines += [f"  note: {note}" for note in notes]
    return _with_source_and_notice(lines, result, "What these prices do not prove:")


def _one_line(message):
    return message.replace("\r", "\\r").replace("\n", "\\n")


def main(argv=None):
    """Prints a quote or a comparison; every failure is one stderr line and exit 2."""
    try:
        args = _parser().parse_args(argv)
        if args.compare and args.gpu is not None:
            raise InputError("--compare prices every model: drop --gpu")
        if not args.compare and args.gpu is None:
            raise InputError("give --gpu ID for a quote, or --compare to price every model")
        if args.min_memory_gib is not None and not args.compare:
            raise InputError("--min-memory-gib filters --compare; drop it for a single quote")
        lots, gpus = args.lots, args.gpus
        if lots is None and gpus is None:  # a quote defaults to one lot, a comparison to one GPU
            lots, gpus = (None, 1) if args.compare else (1, None)
        if args.tariffs is None:
            path = default_tariffs()
            catalogue = load_tariffs(path, _shown(path))
        else:
            catalogue = load_tariffs(args.tariffs)
        if args.compare:
            result = compare(
                catalogue, args.days, lots, gpus, args.accepted_results, args.min_memory_gib
            )
            text = render_comparison(result)
        else:
            result = quote(catalogue, args.gpu, args.days, lots, gpus, args.accepted_results)
            result["notice"] = notice(catalogue, args.accepted_results)
            text = render_quote(result)
    except InputError as error:
        print(f"{PROG}: error: {_one_line(str(error))}", file=sys.stderr)
        return 2
    if args.json:
        import json  # only here: a text quote need not pay for it

        text = json.dumps(result, indent=2)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `| head` stopped reading: Python's documented way to stay quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
