"""validate.py: schemas, the facts a schema cannot state, results logs, the quality protocol.

The broken corpus is built from the real H200 outputs, one defect each, so that every case
is a file a real run could have become (truncated, edited, mixed up)."""

from __future__ import annotations

import copy
import datetime
import json
import re
import sys
from decimal import Decimal
from fractions import Fraction

import pytest
import runfixtures
from conftest import PIPELINE, RUNS, SCHEMAS, run_script
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from pipeline.artefacts import validate

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
    # the decoder log's header: the kit's columns, then the decoder's, then the own model's
    assert list(schema["properties"]) == [
        *schema["required"],
        *validate.DECODER_COLUMNS,
        *validate.OWN_COLUMNS,
    ]


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
    (
        "measurement-twice",  # the second row's measurement under a third run id
        lambda b: b + b.splitlines(keepends=True)[2].replace(b"Z-000001,", b"Z-000002,", 1),
        "line 4: $.measurement_sha256: the measurement of line 3 again",
    ),
    ("nul-byte", lambda b: b.replace(b"NVIDIA H200", b"NVIDIA\0H200", 1), "line 2: $.gpu_name"),
    (
        "quoted-newline",
        lambda b: b.replace(b"NVIDIA H200", b'"NVIDIA\nH200"', 1),
        "line 3: $.gpu_name",
    ),
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


# ------------------------------------------------------------------ JSON that is not plain


def deep(depth: int) -> bytes:
    """The small run with its batch nested `depth` lists deep."""
    text = (H200 / "small.json").read_text()
    return text.replace('"batch": 1,', '"batch": ' + "[" * depth + "]" * depth + ",", 1).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (deep(100_000), "$: not valid JSON (nested too deeply)"),
        (raw("small", lambda b: b.replace(b'"repeats": 2', b'"repeats": NaN', 1))(), "NaN"),
        (raw("small", lambda b: b.replace(b'"seed": 0', b'"seed": Infinity', 1))(), "Infinity"),
        (raw("small", lambda b: b.replace(b'"seed": 0', b'"seed": -Infinity', 1))(), "-Infinity"),
    ],
    ids=["100000-deep", "NaN", "Infinity", "-Infinity"],
)
def test_json_that_python_would_take_but_is_not_standard_is_one_line(tmp_path, data, message):
    path = tmp_path / "measurement.json"
    path.write_bytes(data)
    result = run_script("validate.py", str(path))
    assert result.returncode == 1
    assert result.stdout == "0 valid, 1 invalid, 0 skipped\n"
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{path}: $: ")
    assert message in line
    if message in ("NaN", "Infinity", "-Infinity"):
        assert line == f"{path}: $: not valid JSON ({message} is not a JSON number)"


@pytest.mark.parametrize("depth", range(900, 1101, 10))
def test_nesting_near_the_recursion_limit_is_one_error_never_a_traceback(depth):
    """Around this depth json.loads starts refusing, and the checks (jsonschema quoting the
    value) run out of stack first: either way, one error with a path."""
    [error] = validate.validate_json(deep(depth), REGISTRY)
    assert error.startswith("$")


def test_a_whole_number_written_as_a_float_is_not_an_integer():
    """ "batch": 1.0 is what record.py would write as the cell "1.0": refused here already."""
    errors = validate.validate_json(edit("small", put(1.0, "configuration", "batch"))(), REGISTRY)
    assert errors == ["$.configuration.batch: 1.0 is not of type 'integer'"]
    errors = validate.validate_json(edit("small", phase(0, allocated_bytes=0.0))(), REGISTRY)
    assert errors == ["$.phases[0].allocated_bytes: 0.0 is not of type 'integer'"]


def test_a_file_named_for_a_kind_holds_that_kind(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    (folder / "environment.json").write_bytes((H200 / "small.json").read_bytes())
    result = run_script("validate.py", str(folder))
    assert result.returncode == 1
    assert result.stderr == (
        f"{folder / 'environment.json'}: $.schema: 'urn:iteragpu-lab:schema:measurement:v1' "
        "is not an environment, which environment.json holds\n"
    )


def test_a_folder_named_measurement_json_is_not_a_measurement(tmp_path):
    folder = runfixtures.make_run(tmp_path / "runs")
    (folder / "measurement.json").unlink()
    (folder / "measurement.json").mkdir()
    for path in (folder, folder / "measurement.json"):
        result = run_script("validate.py", str(path))
        assert result.returncode == 1
        assert f"{folder / 'measurement.json'}: $: a folder, not a file\n" in result.stderr


# ------------------------------------------------------------------ walking a tree


def evidence_tree(root):
    """A small runs/ with one folder of each kind the pipeline writes."""
    runs = root / "runs"
    run = runfixtures.make_run(runs, 1)
    (run / "memory.png").write_bytes(b"\x89PNG picture")
    sweep = runs / "20261202T000002Z-000002-sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_bytes(
        (RUNS / "20261202T113219Z-8f4a88-sweep" / "sweep.json").read_bytes()
    )
    (sweep / "peaks.png").write_bytes(b"\x89PNG picture")
    grid = runs / "20261202T000003Z-equivalence-grid"
    (grid / "fresh").mkdir(parents=True)
    (grid / "float32-b1-c16-w64.json").write_bytes((H200 / "small.json").read_bytes())
    (grid / "fresh" / "float32-b1-c16-w64.json").write_bytes((H200 / "small.json").read_bytes())
    (runs / "20261202T000004Z-benchmarks").mkdir()
    (runs / "20261202T000004Z-benchmarks" / "benchmarks.txt").write_text("round 1: 5 s\n")
    (runs / "README.md").write_text("# runs/\n")
    (runs / "resultats-bruts.csv").write_bytes(runfixtures.log_bytes([runfixtures.make_row(1)]))
    (runs / "link").symlink_to(run)
    return runs


def test_a_tree_is_walked_and_every_file_is_counted(tmp_path):
    runs = evidence_tree(tmp_path)
    result = run_script("validate.py", str(runs))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    run, grid = runs / runfixtures.run_id(1), runs / "20261202T000003Z-equivalence-grid"
    picture = "skipped (a picture, drawn from the artefacts beside it: no schema)"
    assert result.stdout.splitlines() == [
        f"{run / 'environment.json'}: valid",
        f"{run / 'measurement.json'}: valid",
        f"{run / 'memory.png'}: {picture}",
        f"{runs / '20261202T000002Z-000002-sweep' / 'peaks.png'}: {picture}",
        f"{runs / '20261202T000002Z-000002-sweep' / 'sweep.json'}: valid",
        f"{grid / 'float32-b1-c16-w64.json'}: valid",
        f"{grid / 'fresh' / 'float32-b1-c16-w64.json'}: valid",
        f"{runs / '20261202T000004Z-benchmarks' / 'benchmarks.txt'}: skipped (text for people: "
        "no schema)",
        f"{runs / 'README.md'}: skipped (text for people: no schema)",
        f"{runs / 'link'}: skipped (a symbolic link, not followed)",
        f"{runs / 'resultats-bruts.csv'}: valid",
        "6 valid, 0 invalid, 5 skipped",
    ]


def test_a_sweep_points_unfinished_folder_is_named_in_one_line_and_not_read(tmp_path):
    """What `kill -9` of a sweep leaves: its point's hidden folder, empty, or with a file
    half written. Said, not read (nothing in it is a run), and no failure: the runs beside it
    are whole (passed over in silence before)."""
    runs = evidence_tree(tmp_path)
    empty = runs / ".20261202T000005Z-000005.partial"
    empty.mkdir()
    torn = runs / ".20261202T000006Z-000006.partial"
    torn.mkdir()
    (torn / "measurement.json").write_bytes(b'{"schema": ')
    result = run_script("validate.py", str(runs))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    why = (
        "skipped (a sweep point's folder never made whole: a sweep still measuring it, or one "
        "interrupted (killed, its machine lost) whose point is no run; not read)"
    )
    lines = result.stdout.splitlines()
    assert lines[:2] == [f"{empty}: {why}", f"{torn}: {why}"]
    assert lines[-1] == "6 valid, 0 invalid, 7 skipped"


def test_one_invalid_file_in_a_tree_makes_exit_1_and_is_named(tmp_path):
    runs = evidence_tree(tmp_path)
    grid_point = runs / "20261202T000003Z-equivalence-grid" / "fresh" / "float32-b1-c16-w64.json"
    grid_point.write_bytes(grid_point.read_bytes()[:-3])
    (runs / "stray.tmp").write_bytes(b"")
    result = run_script("validate.py", str(runs))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{grid_point}: $: not valid JSON (")
    assert result.stderr.count("\n") == 1
    assert f"{runs / 'stray.tmp'}: skipped (no schema for *.tmp files)\n" in result.stdout
    assert result.stdout.endswith("\n5 valid, 1 invalid, 6 skipped\n")


def test_a_folder_with_nothing_to_validate_is_unusable_input(tmp_path):
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "peaks.png").write_bytes(b"\x89PNG")
    result = run_script("validate.py", str(H200 / "small.json"), str(tmp_path / "pictures"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"validate.py: error: {tmp_path / 'pictures'}: nothing to validate inside "
        "(no *.json artefact, no *.csv results log)\n"
    )


def test_help_says_what_validate_does_in_a_whole_sentence():
    result = run_script("validate.py", "--help")
    assert result.returncode == 0
    described = " ".join(result.stdout.split("\n\n")[1].split())
    assert described == (
        "Validate pipeline artefacts and results logs against the JSON Schemas in schemas/, "
        "and the facts a schema cannot state; nothing is written."
    )


@pytest.mark.parametrize(
    "path",
    [
        *sorted(SCHEMAS.glob("*.schema.json")),
        PIPELINE / "artefacts" / "validate.py",
        *(PIPELINE / "stages" / f"{n}.py" for n in ("record", "merge")),
    ],
    ids=lambda p: p.name,
)
def test_rules_are_stated_not_cited_by_number(path):
    """A rule is stated in words, never as a number of a document outside the repository."""
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"\b(spec|rules?) ?[0-9]+", text, re.IGNORECASE), path.name


# ------------------------------------------------------------------ the row screen


CELLS = st.one_of(
    st.sampled_from(["", "0", "1", "01", "1.5", "2.5", "-1", "yes", "no", "completed", "inputs"]),
    st.sampled_from(["cuda:0", "cuda:x", "float32", "float64", "2026-12-02T10:33:33Z"]),
    st.sampled_from(["2026-02-30T10:00:00Z", "2026-12-02T24:00:00Z", "20261202T000000Z-00000g"]),
    st.sampled_from(["0" * 64, "f" * 63, "A" * 64, "34772480\n", "x\x00", "a,b", 'say "hi"']),
    st.text(max_size=8),
    st.integers(0, 10**20).map(str),
)


@given(
    changes=st.lists(
        st.tuples(st.sampled_from(validate.kit_header()), CELLS), min_size=0, max_size=4
    ),
    fixture=st.sampled_from(FIXTURES[1:]),
)
def test_the_row_screen_gives_jsonschemas_verdict(changes, fixture):
    """fastjsonschema, on the row schema as draft 7 says it and with the cells it has found
    valid remembered, says valid exactly when jsonschema does."""
    row = runfixtures.make_row(3, fixture)
    for column, value in changes:
        row[column] = value
    screen = validate.row_screen(REGISTRY)
    assert not hasattr(screen, "__self__")  # the compiled screen, not jsonschema's is_valid
    assert screen(row) == (validate.schema_errors(row, validate.RESULTS_ROW, REGISTRY) == [])
    assert screen(row) == screen(dict(row))  # a second time, from what it remembered


def test_the_row_screen_remembers_only_what_it_checked():
    screen = validate.row_screen(REGISTRY)
    row = runfixtures.make_row(5, "large")
    assert screen(row) is True
    for column, value in row.items():  # no cell may hold a control character
        for bad in (value + "\n", value + "\x00", "\t" + value):
            assert screen(row | {column: bad}) is False, (column, bad)


def without(column: str):
    return lambda row: {k: v for k, v in row.items() if k != column}


@pytest.mark.parametrize(
    ("fixture", "change"),
    [
        ("small", lambda row: row | {"failed_phase": "inputs"}),
        ("small", lambda row: row | {"warmup_wall_ns": ""}),
        ("oom", lambda row: row | {"failed_phase": ""}),
        ("small", without("seed")),
        ("small", lambda row: row | {"notes": "x"}),
    ],
    ids=[
        "completed-with-failed-phase",
        "completed-without-warmup",
        "oom-without-phase",
        "missing-column",
        "extra-column",
    ],
)
def test_the_row_screen_applies_the_rules_across_cells(fixture, change):
    row = change(runfixtures.make_row(2, fixture))
    assert validate.schema_errors(row, validate.RESULTS_ROW, REGISTRY) != []
    assert validate.row_screen(REGISTRY)(row) is False


def test_without_fastjsonschema_jsonschema_screens_alone(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastjsonschema", None)
    validate._compiled_row_check.cache_clear()
    try:
        screen = validate.row_screen(REGISTRY)
        assert screen.__self__.schema["$id"] == validate.RESULTS_ROW  # a jsonschema validator
        assert screen(runfixtures.make_row(0)) is True
        assert screen(runfixtures.make_row(0) | {"batch": "1.0"}) is False
    finally:
        validate._compiled_row_check.cache_clear()


def test_a_keyword_draft_7_reads_otherwise_is_not_translated():
    with pytest.raises(ValueError, match="'prefixItems' is not read alike by draft 7"):
        validate.as_draft_7({"type": "array", "prefixItems": [{"type": "string"}]})
    assert validate.as_draft_7({"$ref": "#/$defs/cell", "pattern": "^x$"}) == {
        "allOf": [{"$ref": "#/definitions/cell"}, {"pattern": "^x$"}]
    }


@pytest.mark.parametrize(
    ("stamp", "valid"),
    [
        ("2026-12-02T10:33:33Z", True),
        ("2026-12-31T23:59:60Z", True),  # a leap second
        ("2026-12-02T10:33:33.25+01:00", True),
        ("2026-02-29T10:00:00Z", False),
        ("2026-12-02T24:00:00Z", False),
        ("2026-12-02T10:60:00Z", False),
        ("2026-12-02T10:00:62Z", False),
        ("2026-1-02T10:00:00ZZ", False),
        ("2026-12-02 10:33:33Z", False),
    ],
)
def test_a_date_time_is_a_real_moment(stamp, valid):
    assert validate._is_datetime(stamp) is valid
    row = runfixtures.make_row(0) | {"measured_utc": stamp}
    assert validate.row_screen(REGISTRY)(row) is (valid and len(stamp) == 20)


def test_a_raw_gpu_record_is_checked_by_the_schema_its_place_names(tmp_path):
    """Probe records and the attention-kernel table carry no schema key: their folder and
    name say which schema holds them, and a record that breaks it is invalid."""
    probe = RUNS / "20261203T212500Z-h200-probes" / "probes" / "bert-inference-bfloat16-b2.json"
    table = RUNS / "20261204T090000Z-sdpa-choices" / "sdpa-choices.json"
    registry = validate.load_registry()
    for source, place in ((probe, "x-h200-probes/probes/a.json"), (table, "y/sdpa-choices.json")):
        placed = tmp_path / place
        placed.parent.mkdir(parents=True)
        placed.write_bytes(source.read_bytes())
        assert validate.read_artefact(placed, registry).errors == []
        document = json.loads(source.read_text())
        document["seconds"] = -1
        placed.write_text(json.dumps(document))
        assert validate.read_artefact(placed, registry).errors != []
        elsewhere = tmp_path / "elsewhere" / placed.name.replace("sdpa-choices", "other")
        elsewhere.parent.mkdir(exist_ok=True)
        elsewhere.write_bytes(source.read_bytes())
        assert validate.read_artefact(elsewhere, registry).errors == [
            '$: not an artefact: no "schema" key naming its schema'
        ]


@pytest.mark.parametrize(
    ("folder", "skipped"),
    [
        ("20261205T083500Z-hf-zoo-blind-7", True),
        ("20261205T023519Z-h200-probe-decoder", True),
        ("20261202T000004Z-benchmarks", False),  # elsewhere, a JSON file without a schema
        ("20261207T211500Z-bnb4-checkpoints-blind", True),  # a grid: its points.txt beside
    ],
)
def test_a_model_config_is_skipped_only_in_a_probe_or_zoo_folder(tmp_path, folder, skipped):
    """configs/<name>.json beside a probe or zoo grid's points is a model's config.json, the
    input the points name: no schema; anywhere else it is an artefact, checked (and refused:
    it names no schema)."""
    config = tmp_path / "runs" / folder / "configs" / "resnet-50.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"model_type": "resnet"}\n')
    if "blind" in folder:
        (config.parent.parent / "points.txt").write_text("# a zoo grid's points\n")
    [(path, kind, why)] = [e for e in validate.walk(tmp_path / "runs") if e[0].suffix == ".json"]
    assert path == config
    assert (kind, why) == (
        (validate.SKIPPED, validate.MODEL_CONFIG) if skipped else (validate.ARTEFACT, "")
    )
