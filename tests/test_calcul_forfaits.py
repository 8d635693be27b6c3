"""calcul_forfaits.py: exact prices from the tariff file, bad input, the schema, stdlib only.

Runs under Python 3.10-3.13 with only the kit-test tools (no torch). The script is driven
in-process through main() and as a fresh `python -I` process, as a user runs it.
"""

import ast
import contextlib
import csv
import hashlib
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import jsonschema
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "pipeline" / "calcul_forfaits.py"
TARIFFS = ROOT / "data" / "tarifs-forfaits.csv"
SCHEMA = json.loads((ROOT / "schemas" / "tariff-row.schema.json").read_text(encoding="utf-8"))
FIXTURES = Path(__file__).resolve().parent / "data" / "tariffs"
PREFIX = "calcul_forfaits.py: error: "
COUNT = "must be a positive integer from 1 to 999999999999, got"
DAYS = "argument --days: must be 3, 7 or 30 (whole packages only, no proration), got"


def _load_script():
    spec = importlib.util.spec_from_file_location("calcul_forfaits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cf = _load_script()
VALIDATOR = jsonschema.Draft202012Validator(
    SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
)

with TARIFFS.open(newline="", encoding="utf-8") as _file:
    ROWS = list(csv.DictReader(_file))
SHA256 = hashlib.sha256(TARIFFS.read_bytes()).hexdigest()
CATALOGUE = cf.load_tariffs(str(TARIFFS))

# The vendors' datasheet memory per GPU ("GB" in the JEDEC sense, copied as GiB): nominal.
DATASHEET_MEMORY = {
    "b200": 180,  # DGX B200: 1,440 GB for 8 GPUs
    "h200": 141,
    "h100": 80,
    "gh200": 96,
    "mi325x": 256,
    "mi300x": 192,
    "a100-80": 80,
    "a100-40": 40,
    "l40s": 48,
    "rtx6000-ada": 48,
    "rtx5090": 32,
    "a10": 24,
    "a6000": 48,
    "rtx4090": 24,
    "l4": 24,
}
# What the allocator may hold per GPU without a measurement: each nominal GiB taken as 10^9
# bytes, less the CUDA context measured on the H200 (552,402,944 bytes at the process start,
# 165,675,008 more once the first forward passes have loaded their kernels).
CONTEXT_ROOM = 552_402_944 + 165_675_008


def usable_gib(gpu):
    return Fraction(DATASHEET_MEMORY[gpu] * 10**9 - CONTEXT_ROOM, 2**30)


def call(*argv):
    """main() in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cf.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def run(*argv, cwd):
    """The script as a user runs it: a fresh, isolated interpreter."""
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="backslashreplace",
        cwd=cwd,
        timeout=120,
    )


def quote_json(*argv):
    code, out, err = call(*argv, "--json")
    assert (code, err) == (0, "")
    return json.loads(out)


def exact_hundredths(cents, divisor):
    """The documented rule, computed another way: exact fraction, half to even."""
    return round(Fraction(cents * 100, divisor))


# ---------------------------------------------------------------- the shipped tariff file


def test_shipped_grid_is_15_models_by_3_durations_without_gaps_or_duplicates():
    keys = [(row["gpu"], row["days"]) for row in ROWS]
    models = {gpu for gpu, _ in keys}
    assert len(ROWS) == 45
    assert len(models) == 15
    assert len(set(keys)) == 45
    assert {(gpu, days) for gpu in models for days in ("3", "7", "30")} == set(keys)


def test_shipped_header_is_the_schema_columns_in_order():
    with TARIFFS.open(newline="", encoding="utf-8") as file:
        header = next(csv.reader(file))
    assert header == list(SCHEMA["properties"]) == list(cf.COLUMNS)


def test_a_b200_lot_holds_two_gpus_every_other_lot_one():
    per_lot = {row["gpu"]: row["gpus_per_lot"] for row in ROWS}
    assert per_lot.pop("b200") == "2"
    assert set(per_lot.values()) == {"1"}


def test_memory_is_the_vendor_datasheet_figure():
    assert {row["gpu"]: int(row["memory_gib_per_gpu"]) for row in ROWS} == DATASHEET_MEMORY


def test_longer_packages_are_cheaper_per_day():
    price = {(row["gpu"], int(row["days"])): int(row["lot_price_cents"]) for row in ROWS}
    for gpu in DATASHEET_MEMORY:
        # price3/3 > price7/7 > price30/30, cross-multiplied to stay in integers
        assert price[gpu, 3] * 7 > price[gpu, 7] * 3, gpu
        assert price[gpu, 7] * 30 > price[gpu, 30] * 7, gpu


def test_shipped_prices_are_labelled_illustrative_usd_of_the_snapshot_day():
    assert {(r["price_status"], r["currency"], r["snapshot_date"]) for r in ROWS} == {
        ("illustrative", "USD", "2026-09-24")
    }


def test_shipped_file_passes_the_schema_and_the_script():
    assert [list(VALIDATOR.iter_errors(row)) for row in ROWS] == [[]] * 45
    assert CATALOGUE["sha256"] == SHA256
    assert CATALOGUE["price_status"] == "illustrative"
    assert len(CATALOGUE["tariffs"]) == 45


# ---------------------------------------------------------------- exact quotes


@pytest.mark.parametrize("lots", [1, 2, 3])
@pytest.mark.parametrize("row", ROWS, ids=[f"{r['gpu']}-{r['days']}d" for r in ROWS])
def test_every_tariff_and_lot_count_is_priced_exactly_from_the_file(row, lots):
    quote = quote_json("--gpu", row["gpu"], "--days", row["days"], "--lots", str(lots))
    price, per_lot, days = int(row["lot_price_cents"]), int(row["gpus_per_lot"]), int(row["days"])
    assert quote["price_per_lot_cents"] == price
    assert quote["total_cents"] == price * lots
    assert quote["gpus_per_lot"] == per_lot
    assert quote["gpus"] == per_lot * lots
    assert quote["lots"] == lots
    assert quote["days"] == days
    assert quote["price_per_gpu_day_cents"] == cf._cents_text(
        exact_hundredths(price * lots, per_lot * lots * days)
    )
    assert quote["accepted_results"] is None
    assert quote["unit_cost_cents"] is None
    assert quote["snapshot_date"] == "2026-09-24"
    assert quote["tariffs_sha256"] == SHA256
    assert quote["price_status"] == "illustrative"


def test_spec_example_two_b200_lots_are_four_gpus_at_twice_the_lot_price(tmp_path):
    text = run("--gpu", "b200", "--days", "7", "--lots", "2", cwd=tmp_path)
    assert (text.returncode, text.stderr) == (0, "")
    assert "  lots             2 x 2 GPUs per lot = 4 GPUs\n" in text.stdout
    assert "  price per lot    $1,696.80 USD\n" in text.stdout
    assert "  total            $3,393.60 USD (price per lot x 2 lots)\n" in text.stdout
    assert "  per GPU-day      $121.2000\n" in text.stdout
    as_json = json.loads(
        run("--gpu", "b200", "--days", "7", "--lots", "2", "--json", cwd=tmp_path).stdout
    )
    assert as_json["total_cents"] == 339360
    assert as_json["gpus"] == 4
    assert as_json["price_per_lot_cents"] == 169680


def test_text_quote_names_its_catalogue_and_what_the_price_does_not_prove(tmp_path):
    text = run("--gpu", "h100", "--days", "30", cwd=tmp_path).stdout
    assert (
        "  model            NVIDIA H100 SXM (h100), 80 GiB per GPU (vendor's nominal figure)\n"
        "  for PyTorch      73.83 GiB per GPU (cautious reading: see below)\n"
    ) in text
    assert (
        "Memory for PyTorch is the vendor figure, not measured: nominal GiB per GPU taken as "
        "10^9 bytes each (6.9% off: PyTorch saw 139.80 GiB of the H200's nominal 141, and ECC "
        "takes about 1/16 of GDDR memory), less 0.67 GiB for the CUDA context (measured on an "
        "NVIDIA H200)."
    ) in text
    assert text.startswith(
        "IteraGPU package quote: ILLUSTRATIVE PRICES, not IteraGPU's catalogue\n"
    )
    assert (
        f"tariffs: tarifs-forfaits.csv, price_status illustrative, snapshot 2026-09-24, "
        f"sha256 {SHA256}\n"
    ) in text
    assert "not IteraGPU's figures of 2026-09-24" in text
    assert "proves neither current availability nor a reservation" in text
    assert "check the live offer before buying" in text
    assert "no hourly proration, no currency conversion" in text
    assert "unit cost        null" in text


def test_json_quote_has_every_documented_key():
    quote = quote_json("--gpu", "l4", "--days", "3")
    assert set(quote) >= {
        "gpu",
        "days",
        "lots",
        "gpus_per_lot",
        "gpus",
        "price_per_lot_cents",
        "total_cents",
        "accepted_results",
        "unit_cost_cents",
        "snapshot_date",
        "tariffs_sha256",
        "price_status",
        "notice",
        "memory_gib_per_gpu",
        "usable_memory_bytes",
        "memory_source",
    }
    assert quote["lots"] == 1  # the default
    assert quote["notice"][0].startswith("Illustrative prices")
    assert (quote["memory_gib_per_gpu"], quote["usable_memory_bytes"]) == (24, 23_281_922_048)
    assert quote["memory_source"] == "vendor figure"


@pytest.mark.parametrize(
    ("argv", "unit_cost_cents", "shown"),
    [
        (
            ["--gpu", "b200", "--days", "7", "--lots", "2", "--accepted-results", "1200"],
            "282.80",
            "$2.8280",
        ),
        # l4, 3 days: 3240 cents. 3240/8000 = 0.405 -> 0.40 and 3240/24000 = 0.135 -> 0.14:
        # halves go to the even hundredth, never always up.
        (["--gpu", "l4", "--days", "3", "--accepted-results", "8000"], "0.40", "$0.0040"),
        (["--gpu", "l4", "--days", "3", "--accepted-results", "24000"], "0.14", "$0.0014"),
        (["--gpu", "l4", "--days", "3", "--accepted-results", "7"], "462.86", "$4.6286"),
        (["--gpu", "l4", "--days", "3", "--accepted-results", "1"], "3240.00", "$32.4000"),
    ],
)
def test_unit_cost_is_the_full_package_price_per_accepted_result(argv, unit_cost_cents, shown):
    assert quote_json(*argv)["unit_cost_cents"] == unit_cost_cents
    code, text, _ = call(*argv)
    assert code == 0
    assert f"  unit cost        {shown} per accepted result" in text


# ---------------------------------------------------------------- properties


@given(row=st.sampled_from(ROWS), lots=st.integers(1, 10**12 - 1))
def test_total_and_gpus_scale_linearly_with_lots(row, lots):
    one = cf.quote(CATALOGUE, row["gpu"], int(row["days"]), lots=1)
    many = cf.quote(CATALOGUE, row["gpu"], int(row["days"]), lots=lots)
    assert many["total_cents"] == one["total_cents"] * lots
    assert many["gpus"] == one["gpus"] * lots


@given(row=st.sampled_from(ROWS), gpus=st.integers(1, 10_000))
def test_asking_for_gpus_buys_the_fewest_whole_lots(row, gpus):
    quote = cf.quote(CATALOGUE, row["gpu"], int(row["days"]), gpus=gpus)
    assert quote["gpus"] >= gpus > quote["gpus"] - quote["gpus_per_lot"]
    assert quote["total_cents"] == quote["lots"] * int(row["lot_price_cents"])


@given(total=st.integers(1, 10**18), results=st.integers(1, 10**12))
@example(total=1, results=200)  # exactly half a hundredth: rounds to 0 (even)
@example(total=3, results=200)  # 1.5 hundredths: rounds to 2 (even)
@example(total=10**18, results=10**12 - 1)
def test_unit_cost_times_results_comes_back_to_the_total(total, results):
    hundredths = cf.ratio_hundredths(total, results)
    assert hundredths == exact_hundredths(total, results)
    assert abs(Fraction(hundredths, 100) * results - total) <= Fraction(5, 1000) * results


@given(lots=st.integers(1, 50), results=st.integers(1, 10**9))
def test_json_unit_cost_follows_the_rounding_rule(lots, results):
    quote = quote_json(
        "--gpu", "h200", "--days", "7", "--lots", str(lots), "--accepted-results", str(results)
    )
    unit = Decimal(quote["unit_cost_cents"])
    assert unit.as_tuple().exponent == -2
    assert abs(unit * results - quote["total_cents"]) <= Decimal("0.005") * results


BAD_TEXT = st.one_of(
    st.sampled_from(
        ["", "0", "00", "01", "-1", "+1", "1.0", "1e3", " 1", "1 ", "١", "３", "10" * 7]
    ),
    st.text(max_size=14),
)


@given(option=st.sampled_from(["--lots", "--gpus", "--accepted-results"]), value=BAD_TEXT)
@example(option="--accepted-results", value="0")
@example(option="--accepted-results", value="-5")
def test_a_bad_count_never_produces_a_result(option, value):
    code, out, err = call("--gpu", "b200", "--days", "7", f"{option}={value}", "--json")
    if re.fullmatch(r"[1-9][0-9]{0,11}", value):
        assert code == 0
        assert json.loads(out)["total_cents"] > 0
    else:
        assert (code, out) == (2, "")
        assert err == f"{PREFIX}argument {option}: {COUNT} {value!r}\n"


@given(value=BAD_TEXT)
def test_a_bad_duration_never_produces_a_result(value):
    code, out, err = call("--gpu", "l4", f"--days={value}")
    if value in ("3", "7", "30"):
        assert code == 0
    else:
        assert (code, out) == (2, "")
        assert err == f"{PREFIX}{DAYS} {value!r}\n"


@given(value=st.one_of(BAD_TEXT, st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,2})?", fullmatch=True)))
def test_memory_filter_keeps_exactly_the_models_with_enough_memory(value):
    code, out, err = call("--compare", "--days", "7", f"--min-memory-gib={value}", "--json")
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
        assert (code, out) == (2, "")
        assert err.startswith(f"{PREFIX}argument --min-memory-gib: must be a number of GiB")
        return
    kept = {quote["gpu"] for quote in json.loads(out)["rows"]}
    assert kept == {gpu for gpu in DATASHEET_MEMORY if usable_gib(gpu) >= Fraction(value)}


@pytest.mark.parametrize(
    ("need", "kept"),
    [
        ("140", {"mi300x", "mi325x", "b200"}),  # the H200's nominal 141 is not 140 for PyTorch
        ("130.64", {"mi300x", "mi325x", "b200", "h200"}),  # 140,281,922,048 bytes: 130.647 GiB
        ("130.65", {"mi300x", "mi325x", "b200"}),
    ],
)
def test_memory_filter_judges_what_pytorch_can_hold_not_the_nominal_figure(need, kept):
    rows = quote_json("--compare", "--days", "7", "--min-memory-gib", need)["rows"]
    assert {quote["gpu"] for quote in rows} == kept
    code, text, _ = call("--compare", "--days", "7", "--min-memory-gib", need)
    assert code == 0
    assert ("  h200            141       130.64" in text) == ("h200" in kept)


# ---------------------------------------------------------------- comparison


def test_compare_sorts_every_model_by_total_for_a_number_of_gpus():
    result = quote_json("--compare", "--days", "7", "--gpus", "4")
    totals = [quote["total_cents"] for quote in result["rows"]]
    assert len(totals) == 15
    assert totals == sorted(totals)
    for quote in result["rows"]:
        assert quote["gpus"] == 4
        assert quote["lots"] == (2 if quote["gpu"] == "b200" else 4)
        assert quote["tariffs_sha256"] == SHA256
        assert quote["price_status"] == "illustrative"
    assert result["rows"][0]["gpu"] == "l4"
    assert result["rows"][-1]["gpu"] == "b200"


def test_compare_says_when_a_lot_gives_more_gpus_than_asked():
    code, text, _ = call("--compare", "--days", "3", "--gpus", "3")
    assert code == 0
    assert "  note: b200: 2 x 2 GPUs per lot = 4 GPUs (3 asked; a lot is never split)\n" in text
    b200 = next(
        q
        for q in quote_json("--compare", "--days", "3", "--gpus", "3")["rows"]
        if q["gpu"] == "b200"
    )
    assert (b200["gpus_requested"], b200["lots"], b200["gpus"], b200["total_cents"]) == (
        3,
        2,
        4,
        158112,
    )


def test_compare_answers_which_package_fits_my_memory_and_its_unit_cost():
    argv = [
        "--compare",
        "--days",
        "7",
        "--gpus",
        "4",
        "--min-memory-gib",
        "80",
        "--accepted-results",
        "5000",
    ]
    result = quote_json(*argv)
    order = [quote["gpu"] for quote in result["rows"]]
    # 80 GiB for PyTorch: not on an 80 GiB card (a100-80, h100 give 73.83 GiB by the rule)
    assert order == ["mi300x", "gh200", "mi325x", "h200", "b200"]
    assert result["rows"][0]["total_cents"] == 135072
    assert result["rows"][0]["unit_cost_cents"] == "27.01"
    assert result["min_memory_gib"] == "80"
    assert result["memory_rule"] == cf.MEMORY_RULE
    code, text, _ = call(*argv)
    assert code == 0
    assert "7 days, 4 GPUs, at least 80 GiB per GPU for PyTorch, cheapest total first\n" in text
    assert (
        "  model   nominal GiB  for PyTorch  lots  GPUs  total USD  per GPU-day"
        "  per accepted result\n"
    ) in text
    assert (
        "  mi300x          192       178.14     4     4  $1,350.72     $48.2400"
        "              $0.2701\n"
    ) in text
    assert "the same count is assumed on every model" in text
    assert f"sha256 {SHA256}" in text


def test_compare_by_lots_and_an_empty_filter():
    result = quote_json("--compare", "--days", "30", "--lots", "1")
    assert {q["gpu"]: q["gpus"] for q in result["rows"]}["b200"] == 2
    empty = quote_json("--compare", "--days", "30", "--min-memory-gib", "256.5")
    assert empty["rows"] == []
    code, text, _ = call("--compare", "--days", "30", "--min-memory-gib", "256.5")
    assert code == 0
    assert (
        "No model in tarifs-forfaits.csv has 256.5 GiB per GPU for PyTorch (vendor figures, "
        "cautious reading: see below).\n"
    ) in text


# ---------------------------------------------------------------- bad command lines

IDS = (
    "a10, a100-40, a100-80, a6000, b200, gh200, h100, h200, l4, l40s, mi300x, mi325x, "
    "rtx4090, rtx5090, rtx6000-ada"
)
QUOTE = ["--gpu", "b200", "--days", "7"]
BAD_COMMAND_LINES = [
    ([], "the following arguments are required: --days"),
    (["--days", "7"], "give --gpu ID for a quote, or --compare to price every model"),
    (["--gpu", "x100", "--days", "7"], f"unknown GPU model 'x100'; valid ids: {IDS}"),
    (["--gpu", "B200", "--days", "7"], f"unknown GPU model 'B200'; valid ids: {IDS}"),
    (["--gpu", "b200", "--days", "14"], f"{DAYS} '14'"),
    (["--gpu", "b200", "--days", "7.0"], f"{DAYS} '7.0'"),
    ([*QUOTE, "--lots", "0"], f"argument --lots: {COUNT} '0'"),
    ([*QUOTE, "--lots", "-1"], f"argument --lots: {COUNT} '-1'"),
    ([*QUOTE, "--lots", "1.5"], f"argument --lots: {COUNT} '1.5'"),
    ([*QUOTE, "--gpus", "1e3"], f"argument --gpus: {COUNT} '1e3'"),
    ([*QUOTE, "--accepted-results", "0"], f"argument --accepted-results: {COUNT} '0'"),
    ([*QUOTE, "--accepted-results", "-3"], f"argument --accepted-results: {COUNT} '-3'"),
    ([*QUOTE, "--accepted-results", "2.5"], f"argument --accepted-results: {COUNT} '2.5'"),
    ([*QUOTE, "--accepted-results"], "argument --accepted-results: expected one argument"),
    ([*QUOTE, "--lots", "2", "--gpus", "4"], "argument --gpus: not allowed with argument --lots"),
    (["--compare", *QUOTE], "--compare prices every model: drop --gpu"),
    (
        [*QUOTE, "--min-memory-gib", "80"],
        "--min-memory-gib filters --compare; drop it for a single quote",
    ),
    (
        ["--compare", "--days", "7", "--min-memory-gib", "-1"],
        "argument --min-memory-gib: must be a number of GiB such as 80 or 79.5, got '-1'",
    ),
    ([*QUOTE, "--acc", "3"], "unrecognized arguments: --acc 3"),
    (
        [*QUOTE, "--tariffs", "missing.csv"],
        "cannot read tariff file missing.csv: No such file or directory",
    ),
    (["--gpu", "b2\n00", "--days", "7"], f"unknown GPU model 'b2\\n00'; valid ids: {IDS}"),
    ([*QUOTE, "one\ntwo"], "unrecognized arguments: one\\ntwo"),
]


@pytest.mark.parametrize(
    ("argv", "message"),
    BAD_COMMAND_LINES,
    ids=[" ".join(a) or "no-args" for a, _ in BAD_COMMAND_LINES],
)
def test_bad_command_line_is_one_stderr_line_exit_2_nothing_written(argv, message, tmp_path):
    process = run(*argv, cwd=tmp_path)
    assert process.returncode == 2
    assert process.stdout == ""
    assert process.stderr == f"{PREFIX}{message}\n"
    assert list(tmp_path.iterdir()) == []
    assert call(*argv) == (2, "", f"{PREFIX}{message}\n")


def test_help_is_exit_0(tmp_path):
    process = run("--help", cwd=tmp_path)
    assert process.returncode == 0
    assert process.stdout.startswith(
        "usage: calcul_forfaits.py [-h] [--gpu ID] [--compare] --days {3,7,30}"
    )


# ---------------------------------------------------------------- bad tariff files

# file, line and reason; and what the row schema says: "row" a row fails it, "grid" every
# row passes (the rule spans rows: the script checks it), "file" no rows to validate.
CENTS = (
    "lot_price_cents must be a positive integer of USD cents, at most 999999999999 (12 digits), got"
)
BAD_FILES = [
    ("bad-missing-column.csv", 1, "missing column 'currency'", "row"),
    ("bad-unknown-column.csv", 1, "unknown column 'vat_included'", "row"),
    ("bad-duplicate-column.csv", 1, "duplicate column 'days'", "grid"),
    ("bad-short-row.csv", 3, "8 fields, the header has 9", "row"),
    ("bad-cents-decimal.csv", 3, f"{CENTS} '1696.80'", "row"),
    ("bad-cents-negative.csv", 3, f"{CENTS} '-169680'", "row"),
    ("bad-cents-zero.csv", 3, f"{CENTS} '0'", "row"),
    ("bad-cents-empty.csv", 3, f"{CENTS} ''", "row"),
    ("bad-cents-fullwidth.csv", 3, f"{CENTS} '１６９６８０'", "row"),
    ("bad-days-unknown.csv", 3, "days must be 3, 7 or 30, got '14'", "row"),
    (
        "bad-memory-decimal.csv",
        2,
        "memory_gib_per_gpu must be a positive integer of GiB, at most 9999, got '180.0'",
        "row",
    ),
    ("bad-gpu-uppercase.csv", 2, "gpu must be a lowercase id (a-z, 0-9, '-'), got 'B200'", "row"),
    ("bad-currency.csv", 2, "currency must be USD (no currency conversion), got 'EUR'", "row"),
    ("bad-date.csv", 2, "snapshot_date '2026-02-30' is no real date", "row"),
    ("bad-name-newline.csv", 2, "name holds a line break or control character", "row"),
    ("bad-duplicate-row.csv", 4, "duplicate tariff for b200 7 days", "grid"),
    ("bad-missing-row.csv", 5, "l4 has no 30-day tariff", "grid"),
    (
        "bad-mixed-status.csv",
        5,
        "price_status 'catalogue' differs from 'illustrative' (one file is one catalogue snapshot)",
        "grid",
    ),
    (
        "bad-gpus-per-lot-differs.csv",
        4,
        "gpus_per_lot '1' differs from '2' on b200's first row",
        "grid",
    ),
    ("bad-empty.csv", 1, "no header row", "file"),
    ("bad-header-only.csv", 2, "no tariff rows", "file"),
    ("bad-not-utf8.csv", 5, "not UTF-8 text", "file"),
    ("bad-csv-quote.csv", 2, "not valid CSV (',' expected after '\"')", "file"),
]
GOOD_FILES = ["good-catalogue.csv", "good-excel.csv"]


def schema_verdict(path):
    """'row' if some row fails the row schema, 'grid' if all pass, 'file' if none can be read."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as file:
            rows = list(csv.DictReader(file, strict=True))
    except (UnicodeDecodeError, csv.Error):
        return "file"
    if not rows:
        return "file"
    return "row" if any(not VALIDATOR.is_valid(row) for row in rows) else "grid"


def test_the_fixture_table_covers_every_fixture_file():
    names = {path.name for path in FIXTURES.glob("*.csv")}
    assert names == {name for name, *_ in BAD_FILES} | set(GOOD_FILES)


@pytest.mark.parametrize(
    ("name", "line", "reason", "schema"), BAD_FILES, ids=[f[0] for f in BAD_FILES]
)
def test_a_malformed_tariff_file_is_refused_with_file_line_and_reason(
    name, line, reason, schema, tmp_path
):
    path = FIXTURES / name
    argv = ["--gpu", "b200", "--days", "3", "--tariffs", str(path)]
    assert call(*argv) == (2, "", f"{PREFIX}{path}:{line}: {reason}\n")
    process = run(*argv, cwd=tmp_path)
    assert (process.returncode, process.stdout) == (2, "")
    assert process.stderr.startswith(f"{PREFIX}{path}:{line}: ")
    assert process.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
    assert schema_verdict(path) == schema


@pytest.mark.parametrize("name", GOOD_FILES)
def test_schema_and_script_accept_the_good_fixtures(name):
    assert schema_verdict(FIXTURES / name) == "grid"
    quote = quote_json(
        "--gpu", "b200", "--days", "7", "--lots", "2", "--tariffs", str(FIXTURES / name)
    )
    assert quote["total_cents"] == 339360
    assert quote["tariffs_sha256"] == hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest()


def test_a_real_catalogue_snapshot_drops_in_without_code_change():
    path = str(FIXTURES / "good-catalogue.csv")
    quote = quote_json("--gpu", "l4", "--days", "30", "--tariffs", path)
    assert quote["price_status"] == "catalogue"
    assert (
        quote["notice"][0]
        == "IteraGPU catalogue prices as of 2026-09-24; they may have changed since."
    )
    code, text, _ = call("--gpu", "l4", "--days", "30", "--tariffs", path)
    assert code == 0
    assert text.startswith("IteraGPU package quote: catalogue prices of 2026-09-24\n")
    assert "ILLUSTRATIVE" not in text
    assert "Illustrative" not in text
    assert "proves neither current availability nor a reservation" in text


# ---------------------------------------------------------------- schema and script agree


def test_schema_is_draft_2020_12_with_the_scripts_columns_and_patterns():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["$id"] == "urn:iteragpu-lab:schema:tariff-row:v1"
    assert SCHEMA["required"] == list(cf.COLUMNS)
    assert SCHEMA["additionalProperties"] is False
    for column, (pattern, _) in cf.COLUMNS.items():
        spec = SCHEMA["properties"][column]
        if "pattern" in spec:
            assert spec["pattern"] == f"^{pattern}$", column
        else:
            assert "|".join(spec.get("enum", [spec.get("const")])) == pattern, column


CELL_VALUES = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "0",
            "01",
            "1",
            "3",
            "7",
            "30",
            "14",
            "-1",
            "+1",
            "1.0",
            "1e3",
            "１",
            "٣",
            "USD",
            "usd",
            "USD ",
            "EUR",
            "illustrative",
            "catalogue",
            "Illustrative",
            "2026-09-24",
            "2026-02-30",
            "2026-9-24",
            "20260924",
            "2026-09-24T00:00",
            "2024-02-29",
            "NVIDIA B200",
            " NVIDIA",
            "NVIDIA ",
            "a\tb",
            "x\n",
            "5\n",
            "\r5",
            "h100-x",
            "-h100",
            "H100",
            "x\x00y",
            "\x7f",
            "\u3000",
            "a\u2028b",
            "\ufeff1",
        ]
    ),
    st.text(max_size=12),
    st.from_regex(r"[0-9]{1,7}", fullmatch=True),
)


@given(column=st.sampled_from([c for c in cf.COLUMNS if c != "days"]), value=CELL_VALUES)
def test_schema_and_script_agree_on_any_cell_value(column, value):
    """One column changed where no cross-row rule can object: only the row rules decide."""
    assume(column != "gpu" or value not in DATASHEET_MEMORY)  # a taken id would be a duplicate
    rows = [dict(row) for row in ROWS]
    for row in rows:
        if column in cf.PER_FILE or (column in (*cf.PER_MODEL, "gpu") and row["gpu"] == "h100"):
            row[column] = value
    if column == "lot_price_cents":
        rows[7][column] = value
    schema_accepts = all(VALIDATOR.is_valid(row) for row in rows)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tarifs-forfaits.csv"
        with path.open("w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=list(cf.COLUMNS))  # \r\n: quotes \r and \n
            writer.writeheader()
            try:
                writer.writerows(rows)
            except csv.Error:  # Python 3.10's csv cannot write a NUL at all
                assume(False)
        with path.open(newline="", encoding="utf-8") as file:
            assert list(csv.DictReader(file)) == rows  # the file says what the schema judged
        try:
            cf.load_tariffs(str(path))
        except cf.InputError:
            script_accepts = False
        else:
            script_accepts = True
    assert script_accepts == schema_accepts


# ---------------------------------------------------------------- the kit's rules


def test_the_script_imports_only_the_standard_library():
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            names.add(node.module.split(".")[0])
    assert names
    assert names <= set(sys.stdlib_module_names)


def test_in_the_kit_layout_the_tariffs_sit_beside_the_script(tmp_path):
    kit = tmp_path / "iteragpu-lab-v1"
    kit.mkdir()
    shutil.copy(SCRIPT, kit)
    shutil.copy(TARIFFS, kit)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    process = subprocess.run(
        [
            sys.executable,
            "-I",
            str(kit / "calcul_forfaits.py"),
            "--gpu",
            "b200",
            "--days",
            "7",
            "--lots",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr
    quote = json.loads(process.stdout)
    assert (quote["total_cents"], quote["tariffs_file"], quote["tariffs_sha256"]) == (
        339360,
        "tarifs-forfaits.csv",
        SHA256,
    )
    assert sorted(p.name for p in kit.iterdir()) == ["calcul_forfaits.py", "tarifs-forfaits.csv"]
    assert list(elsewhere.iterdir()) == []


def test_without_a_tariff_file_nearby_it_says_how_to_give_one(tmp_path):
    shutil.copy(SCRIPT, tmp_path)
    process = subprocess.run(
        [
            sys.executable,
            "-I",
            str(tmp_path / "calcul_forfaits.py"),
            "--gpu",
            "b200",
            "--days",
            "7",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert process.returncode == 2
    assert process.stderr == (
        f"{PREFIX}no tarifs-forfaits.csv beside the script nor in ../data/: pass --tariffs PATH\n"
    )


def test_in_this_repository_data_tariffs_are_found_without_a_path(tmp_path):
    process = run("--gpu", "a10", "--days", "7", "--json", cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    assert json.loads(process.stdout)["tariffs_sha256"] == SHA256
    assert str(tmp_path) not in process.stdout
    assert str(ROOT) not in process.stdout  # no absolute path, hence no home folder, in a quote


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-I", str(SCRIPT), "--compare", "--days", "7", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    process.stdout.close()  # like `| head -1` leaving before the script writes
    assert process.stderr.read() == b""
    assert process.wait(timeout=120) == 1
    process.stderr.close()
