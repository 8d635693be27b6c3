"""validate.py: schemas, the facts a schema cannot state, results logs, the quality protocol.

The broken corpus is built from the real H200 outputs, one defect each, so that every case
is a file a real run could have become (truncated, edited, mixed up)."""

from __future__ import annotations

import copy
import datetime
import json
import re
from decimal import Decimal
from fractions import Fraction

import pytest
import runfixtures
import validate
from conftest import SCHEMAS, run_script
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

REGISTRY = validate.load_registry()
H200 = runfixtures.H200
FIXTURES = ("env", "small", "large", "bf16", "oom")


def fixture(name: str) -> dict:
    return json.loads((H200 / f"{name}.json").read_bytes())


# ------------------------------------------------------------------ schemas


def test_every_schema_is_draft_2020_12_with_a_versioned_id_in_the_registry():
    paths = sorted(SCHEMAS.glob("*.schema.json"))
    assert len(paths) >= 4
    for path in paths:
        schema = json.loads(path.read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(schema)  # load_registry trusts them: checked here
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert re.fullmatch(r"urn:iteragpu-lab:schema:[a-z0-9-]+:v[0-9]+", schema["$id"])
        assert schema["$id"] in REGISTRY


def test_the_real_h200_outputs_are_valid():
    paths = [str(H200 / f"{name}.json") for name in FIXTURES]
    result = run_script("validate.py", *paths)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        *(f"{path}: valid" for path in paths),
        "5 valid, 0 invalid, 0 skipped",
    ]


# ------------------------------------------------------------------ the broken corpus


def edit(name: str, change):
    """A fixture with one change applied to its parsed JSON."""

    def build() -> bytes:
        document = copy.deepcopy(fixture(name))
        change(document)
        return json.dumps(document).encode()

    return build


def raw(name: str, change):
    return lambda: change((H200 / f"{name}.json").read_bytes())


def phase(i: int, **values):
    return lambda d: d["phases"][i].update(values)


def swap(i: int, j: int):
    def change(d):
        d["phases"][i], d["phases"][j] = d["phases"][j], d["phases"][i]

    return change


def delete(*keys):
    def change(d):
        *parents, last = keys
        for key in parents:
            d = d[key]
        del d[last]

    return change


def put(value, *keys):
    def change(d):
        *parents, last = keys
        for key in parents:
            d = d[key]
        d[last] = value

    return change


def both(*changes):
    def change(d):
        for one in changes:
            one(d)

    return change


def extra_warm_row(d):
    row = dict(d["phases"][-1], repetition=3)
    d["phases"].append(row)


CORPUS = [
    # (case, file bytes, the JSON path the first matching error must name)
    ("truncated-measurement", raw("small", lambda b: b[: len(b) // 2]), "$: not valid JSON"),
    ("truncated-environment", raw("env", lambda b: b[:-2]), "$: not valid JSON"),
    ("empty-file", raw("small", lambda b: b""), "$: not valid JSON"),
    ("not-utf8", raw("env", lambda b: b"\xff\xfe" + b), "$: not valid JSON"),
    ("top-level-array", raw("env", lambda b: b"[" + b + b"]"), "$: not an artefact"),
    ("unknown-schema", edit("small", put("urn:x:y", "schema")), "$.schema"),
    ("missing-phases", edit("small", delete("phases")), "$: 'phases' is a required"),
    ("missing-summary", edit("large", delete("summary")), "$: 'summary' is a required"),
    ("bytes-as-string", edit("small", phase(0, peak_allocated_bytes="132608")), "$.phases[0]"),
    ("negative-bytes", edit("small", phase(2, allocated_bytes=-1)), "$.phases[2].allocated"),
    ("fractional-bytes", edit("bf16", phase(3, reserved_bytes=1.5)), "$.phases[3].reserved"),
    ("boolean-batch", edit("small", put(True, "configuration", "batch")), "$.configuration"),
    ("negative-time", edit("large", phase(5, wall_time_ns=-7)), "$.phases[5].wall_time_ns"),
    ("allocated-above-reserved", edit("small", phase(2, allocated_bytes=35651585)), "$.phases[2]"),
    (
        "baseline-allocated-above-reserved",
        edit("large", phase(1, baseline_reserved_bytes=33574400)),
        "$.phases[1]",
    ),
    ("peak-below-end", edit("small", phase(3, peak_allocated_bytes=34743807)), "$.phases[3]"),
    ("peak-below-baseline", edit("bf16", phase(4, peak_reserved_bytes=1)), "$.phases[4]"),
    ("missing-warm-row", edit("small", lambda d: d["phases"].pop()), "$.phases: 5 rows"),
    ("extra-warm-row", edit("small", extra_warm_row), "$.phases: 7 rows"),
    ("missing-warmup-phase", edit("small", lambda d: d["phases"].pop(3)), "$.phases[3]"),
    ("first-two-swapped", edit("small", swap(0, 1)), "$.phases[0].phase"),
    ("cold-and-warmup-swapped", edit("large", swap(2, 3)), "$.phases[2].phase"),
    ("repetitions-out-of-order", edit("small", swap(4, 5)), "$.phases: warm_forward"),
    ("unknown-phase", edit("small", phase(4, phase="hot_forward")), "$.phases[4].phase"),
    ("warmup-passes", edit("large", phase(3, passes=2)), "$.phases[3].passes"),
    ("repetition-on-inputs", edit("small", phase(1, repetition=1)), "$.phases[1]"),
    ("extra-key", edit("small", put("x", "notes")), "$: Additional properties"),
    ("status-running", edit("small", put("running", "status")), "$.status"),
    (
        "completed-with-failure",
        edit("small", put(fixture("oom")["failure"], "failure")),
        "$: {'schema'",  # jsonschema quotes the document: "... should not be valid under"
    ),
    ("oom-without-failure", edit("oom", delete("failure")), "$: 'failure' is a required"),
    ("oom-wrong-failed-phase", edit("oom", put("warmup", "failure", "phase")), "$.failure.phase"),
    (
        "oom-repetition-on-inputs",
        edit("oom", put(1, "failure", "repetition")),
        "$.failure.repetition",
    ),
    (
        "oom-counters-inconsistent",
        edit("oom", put(9_999_999, "failure", "counters_after_failure", "allocated_bytes")),
        "$.failure.counters_after_failure",
    ),
    (
        "oom-after-every-phase",
        edit(
            "small",
            both(
                put("out_of_memory", "status"),
                put(
                    {
                        "phase": "warm_forward",
                        "repetition": 3,
                        "error": "out of memory",
                        "counters_after_failure": {
                            k: v
                            for k, v in fixture("small")["phases"][5].items()
                            if k.endswith("_bytes")
                        },
                    },
                    "failure",
                ),
            ),
        ),
        "$.phases: rows of an out-of-memory run",
    ),
    ("input-shape", edit("small", put([1, 16, 65], "configuration", "input_shape")), "$.config"),
    ("device-name", edit("small", put("cuda:x", "configuration", "device")), "$.configuration"),
    ("dtype", edit("small", put("float64", "configuration", "dtype")), "$.configuration.dtype"),
    ("calendar-date", edit("small", put("2026-02-30T10:00:00Z", "created_utc")), "$.created_utc"),
    ("summary-peak", edit("large", put(1, "summary", "largest_peak_allocated_bytes")), "$.summ"),
    ("summary-count", edit("small", put(5, "summary", "phases_completed")), "$.summary.phases"),
    (
        "summary-median",
        edit("small", put(1.0, "summary", "warm_forward_median_wall_time_ns")),
        "$.summary.warm_forward_median_wall_time_ns",
    ),
    (
        "measured-without-gpu",
        edit("small", put({"available": False, "error": "none"}, "environment", "gpu")),
        "$.environment.gpu.available",
    ),
    ("other-gpu-index", edit("small", put(1, "environment", "gpu", "index")), "$.environment"),
    ("env-missing-driver", edit("env", delete("environment", "driver")), "$.environment: 'dri"),
    (
        "env-driver-from-torch",
        edit("env", put("CUDA 13.0", "environment", "driver", "version")),
        "$.environment.driver",
    ),
    (
        "env-negative-memory",
        edit("env", put(-1, "environment", "gpu", "total_memory_bytes")),
        "$.environment.gpu",
    ),
    ("env-torch-no-version", edit("env", delete("environment", "torch", "version")), "$.env"),
    ("env-python-2", edit("env", put("2.7.18", "environment", "python", "version")), "$.env"),
    ("env-hostname", edit("env", put("gpu-07", "environment", "hostname")), "$.environment: Add"),
    ("env-cpu-device", edit("env", put("cpu", "environment", "requested_device")), "$.environm"),
    ("env-time", edit("env", put("yesterday", "created_utc")), "$.created_utc"),
]


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 30
    assert len({case for case, _, _ in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(("case", "build", "where"), CORPUS, ids=[c[0] for c in CORPUS])
def test_a_broken_file_is_rejected_with_the_path_of_the_error(case, build, where):
    errors = validate.validate_json(build(), REGISTRY)
    assert errors, f"{case} was accepted"
    assert any(error.startswith(where) for error in errors), errors


def test_the_corpus_on_the_command_line(tmp_path):
    paths = []
    for case, build, _ in CORPUS:
        paths.append(tmp_path / f"{case}.json")
        paths[-1].write_bytes(build())
    result = run_script("validate.py", *map(str, paths))
    assert result.returncode == 1
    assert result.stdout == f"0 valid, {len(CORPUS)} invalid, 0 skipped\n"
    lines = result.stderr.splitlines()
    for path, (_, _, where) in zip(paths, CORPUS, strict=True):
        assert any(line.startswith(f"{path}: {where}") for line in lines), path.name


@given(
    counters=st.fixed_dictionaries(
        {
            f"{prefix}{kind}_bytes": st.integers(0, 40_000_000)
            for prefix in ("baseline_", "", "peak_")
            for kind in ("allocated", "reserved")
        }
    )
)
def test_counter_facts_hold_exactly_when_the_spec_says(counters):
    document = fixture("small")
    document["phases"][2].update(counters)
    errors = [e for e in validate.measurement_facts(document) if e.startswith("$.phases[2]:")]
    consistent = all(
        counters[f"{p}allocated_bytes"] <= counters[f"{p}reserved_bytes"]
        for p in ("baseline_", "", "peak_")
    ) and all(
        counters[f"peak_{k}_bytes"] >= max(counters[f"baseline_{k}_bytes"], counters[f"{k}_bytes"])
        for k in ("allocated", "reserved")
    )
    assert (errors == []) == consistent


# ------------------------------------------------------------------ command line


def test_no_argument_is_one_line_and_exit_2():
    result = run_script("validate.py")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("validate.py: error: ")


def test_a_missing_path_is_one_line_and_exit_2(tmp_path):
    result = run_script("validate.py", str(tmp_path / "missing.json"))
    assert result.returncode == 2
    assert (
        result.stderr
        == f"validate.py: error: {tmp_path / 'missing.json'}: no such file or folder\n"
    )


def test_without_jsonschema_it_says_what_to_install():
    """-S hides site-packages: jsonschema is really missing."""
    result = run_script("validate.py", str(H200 / "env.json"), flags=["-S"])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "pip install jsonschema referencing pyyaml" in result.stderr


def test_a_run_folder_stands_for_its_files(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs", fixture="oom")
    result = run_script("validate.py", str(folder))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{folder / 'environment.json'}: valid",
        f"{folder / 'measurement.json'}: valid",
        "2 valid, 0 invalid, 0 skipped",
    ]


# ------------------------------------------------------------------ results logs


def test_the_kit_grid_is_a_header_only_and_matches_the_row_schema():
    grid = validate.KIT_GRID.read_bytes()
    assert grid.count(b"\n") == 1
    assert grid.endswith(b"\n")
    schema = json.loads((SCHEMAS / "results-row.schema.json").read_text(encoding="utf-8"))
    assert tuple(schema["required"]) == validate.kit_header()
    assert list(schema["properties"]) == schema["required"]


def test_rows_from_every_real_output_are_valid():
    rows = [runfixtures.make_row(n, name) for n, name in enumerate(FIXTURES[1:])]
    assert validate.log_errors(runfixtures.log_bytes(rows), REGISTRY, validate.Protocol()) == []


LOG_DEFECTS = [
    ("torn-last-line", lambda b: b[:-40], "$: the last line has no line end"),
    ("other-header", lambda b: b.replace(b"run_id,", b"run,", 1), "line 1: not the header"),
    ("no-header", lambda b: b"", "line 1: not the header"),
    ("missing-cell", lambda b: b.replace(b",1,16,64,", b",1,16,", 1), "line 2: 30 cells"),
    ("bad-batch", lambda b: b.replace(b",1,16,64,", b",0,16,64,", 1), "line 2: $.batch"),
    ("bad-sha", lambda b: b.replace(b",f6486f", b",F6486f", 1), "line 2: $.measurement_sha256"),
    ("duplicate-run", lambda b: b + b.splitlines(keepends=True)[1], "line 4: $.run_id"),
    ("open-quote", lambda b: b + b'"unterminated\n', "line 4: not CSV"),
    ("not-utf8", lambda b: b + b"\xff\n", "$: not UTF-8"),
]


@pytest.mark.parametrize(("case", "change", "where"), LOG_DEFECTS, ids=[c[0] for c in LOG_DEFECTS])
def test_a_broken_log_is_rejected_with_the_line(case, change, where):
    good = runfixtures.log_bytes([runfixtures.make_row(0), runfixtures.make_row(1, "oom")])
    errors = validate.log_errors(change(good), REGISTRY, validate.Protocol())
    assert any(error.startswith(where) for error in errors), errors


def test_a_log_on_the_command_line(tmp_path):
    log = tmp_path / "log.csv"
    log.write_bytes(runfixtures.log_bytes([runfixtures.make_row(0, "large")]))
    assert (
        run_script("validate.py", str(log)).stdout
        == f"{log}: valid\n1 valid, 0 invalid, 0 skipped\n"
    )
    log.write_bytes(log.read_bytes()[:-1])
    result = run_script("validate.py", str(log))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{log}: $: the last line has no line end")


# ------------------------------------------------------------------ the quality protocol


def decided(tmp_path, front_matter=runfixtures.DECIDED) -> validate.Protocol:
    path = runfixtures.write_protocol(tmp_path / "protocole-qualite.md", front_matter)
    return validate.Protocol(path)


def test_the_shipped_protocol_parses_and_leaves_every_decision_to_the_team():
    protocol = validate.Protocol()
    assert protocol.decisions["version"] == 1
    assert protocol.undecided() == [
        "useful_unit",
        "acceptance_criteria",
        "minimum_acceptance_rate",
        "decided_on",
        "decided_by",
    ]


def test_written_decisions_are_read(tmp_path):
    protocol = decided(tmp_path)
    assert protocol.undecided() == []
    assert protocol.rate == Decimal("0.95")
    assert protocol.decided_on == datetime.date(2026, 12, 1)


@pytest.mark.parametrize("decided_on", ["2026-12-01 09:30:00", "'2026-12-01'"])
def test_a_decision_date_may_carry_a_time_or_quotes(tmp_path, decided_on):
    text = runfixtures.DECIDED.replace("decided_on: 2026-12-01", f"decided_on: {decided_on}")
    assert decided(tmp_path, text).decided_on == datetime.date(2026, 12, 1)


@pytest.mark.parametrize("rate", ["0", "1.5", "-0.5", "abc", "true", "nan", "''", "[0.9]"])
def test_a_rate_outside_0_to_1_is_not_a_decision(tmp_path, rate):
    text = runfixtures.DECIDED.replace(
        "minimum_acceptance_rate: 0.95", f"minimum_acceptance_rate: {rate}"
    )
    assert decided(tmp_path, text).undecided() == ["minimum_acceptance_rate"]


def quality_row(protocol, useful, accepted, met, measured="2026-12-02T10:33:33Z"):
    row = runfixtures.make_row(0, protocol=protocol.path)
    row.update(useful_work=useful, accepted_results=accepted, threshold_met=met)
    row["measured_utc"] = measured
    return row


def test_quality_values_are_refused_under_a_blank_protocol():
    protocol = validate.Protocol()
    errors = validate.quality_errors(quality_row(protocol, "10", "10", "yes"), protocol)
    assert errors == [
        "$.useful_work: the protocol's decisions are still blank (useful_unit, "
        "acceptance_criteria, minimum_acceptance_rate, decided_on, decided_by): write them in "
        "protocole-qualite.md before any run"
    ]


def test_quality_values_need_the_protocol_the_row_names(tmp_path):
    protocol = decided(tmp_path)
    row = quality_row(protocol, "10", "10", "yes")
    assert validate.quality_errors(row, protocol) == []
    row["protocol_sha256"] = validate.Protocol().sha256
    assert validate.quality_errors(row, protocol)[0].startswith("$.protocol_sha256")


def test_quality_values_for_a_run_before_the_decisions_are_refused(tmp_path):
    protocol = decided(tmp_path)
    row = quality_row(protocol, "10", "10", "yes", measured="2026-11-30T23:59:59Z")
    assert validate.quality_errors(row, protocol)[0].startswith("$.measured_utc: the run")


def test_quality_columns_go_together_and_accepted_never_exceeds_the_work(tmp_path):
    protocol = decided(tmp_path)
    errors = validate.quality_errors(quality_row(protocol, "10", "", ""), protocol)
    assert [e.split(":")[0] for e in errors] == ["$.accepted_results", "$.threshold_met"]
    errors = validate.quality_errors(quality_row(protocol, "3", "4", "yes"), protocol)
    assert errors[0] == "$.accepted_results: 4 accepted out of 3 units of work"


@given(
    useful=st.integers(0, 10**6),
    share=st.fractions(0, 1),
    digits=st.integers(1, 6),
    numerator=st.integers(1, 10**6),
)
def test_threshold_met_is_exact_integer_arithmetic(
    tmp_path_factory, useful, share, digits, numerator
):
    """rate = numerator / 10**digits (<= 1); met <=> accepted * 10**digits >= numerator * useful."""
    numerator = min(numerator, 10**digits)
    rate = Decimal(numerator).scaleb(-digits)
    accepted = int(share * useful)
    text = runfixtures.DECIDED.replace("0.95", f"'{rate}'")
    protocol = decided(tmp_path_factory.getbasetemp(), text)
    met = useful > 0 and accepted * 10**digits >= numerator * useful
    assert Fraction(protocol.rate) == Fraction(numerator, 10**digits)
    row = quality_row(protocol, str(useful), str(accepted), "yes" if met else "no")
    assert validate.quality_errors(row, protocol) == []
    row["threshold_met"] = "no" if met else "yes"
    assert validate.quality_errors(row, protocol)[0].startswith("$.threshold_met")
