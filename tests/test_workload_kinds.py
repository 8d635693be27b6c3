"""The registry of workload kinds (pipeline/core/workload_kinds.py) is whole: every kind the stages
meet has an entry, every table of per-kind code has every kind, what the registry says agrees
with the kinds' own modules and with the evidence under runs/, and no stage goes back to an
if chain on a kind's name."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from pipeline.artefacts import validate
from pipeline.core import workload_kinds
from pipeline.core.workload_kinds import Kind
from pipeline.measuring import decoder, launcher, own_model
from pipeline.stages import chain, fit, record, report, sweep
from pipeline.workloads import decoder_rules, own_model_facts

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipeline"
RUNS = ROOT / "runs"

# Every table of per-kind code, keyed by Kind: adding a kind must add its row to each.
TABLES = {
    "sweep.SWEEPS": sweep.SWEEPS,
    "chain.CHECKS": chain.CHECKS,
    "validate.MEASUREMENT_FACTS": validate.MEASUREMENT_FACTS,
    "record.BUILDERS": record.BUILDERS,
    "fit.READINGS": fit.READINGS,
    "report.DRAWINGS": report.DRAWINGS,
}


def test_every_kind_has_one_entry_and_every_table_every_kind():
    assert [entry.kind for entry in workload_kinds.KINDS] == list(Kind)
    for name, table in TABLES.items():
        assert set(table) == set(Kind), name


def test_the_registry_agrees_with_the_kinds_own_modules():
    """What the registry says of a kind is what its module writes."""
    assert workload_kinds.DECODER.schemas == (decoder_rules.SCHEMA,)
    assert workload_kinds.OWN.schemas == (own_model_facts.SCHEMA,)
    assert workload_kinds.DECODER.script == decoder.TOOL["name"]
    assert workload_kinds.OWN.script == own_model.TOOL["name"]
    assert workload_kinds.NETWORK.script == launcher.SCRIPT
    assert tuple(entry.script for entry in workload_kinds.KINDS) == launcher.SCRIPTS
    for entry in workload_kinds.KINDS:
        module = ROOT.joinpath(*entry.module.split(".")).with_suffix(".py")
        assert module.name == entry.script
        schema = json.loads((ROOT / "schemas" / entry.schema_file).read_text(encoding="utf-8"))
        assert schema["properties"]["schema"]["const"] == entry.schemas[-1]


def test_each_kinds_log_header_is_the_one_before_it_and_its_columns():
    headers = [validate.header_of(entry) for entry in workload_kinds.KINDS]
    assert headers[0] == validate.kit_header()
    for before, after, entry in zip(
        headers[:-1], headers[1:], workload_kinds.KINDS[1:], strict=True
    ):
        assert after == before + entry.columns
    assert validate.headers() == tuple(headers)


def test_the_workload_option_names_every_kind():
    assert workload_kinds.ARGUMENTS == "network|decoder|FILE.py:FUNCTION"
    for entry in workload_kinds.KINDS:
        named = "pipeline/workloads/resnet_cnn.py:resnet" if entry.file else entry.argument
        assert workload_kinds.of_argument(workload_kinds.workload_argument(named)) is entry


def measurement_kind(path: Path) -> set[Kind]:
    """Every kind that claims a measurement.json: by schema, by the tool that wrote it."""
    document = json.loads(path.read_text(encoding="utf-8"))
    return {
        entry.kind
        for entry in workload_kinds.KINDS
        if document["schema"] in entry.schemas or document["tool"]["name"] == entry.script
    }


MEASUREMENTS = sorted(RUNS.rglob("measurement.json"))
LOGS = sorted(RUNS.rglob("resultats-*.csv"))
SWEEPS = sorted(RUNS.rglob("sweep.json"))


@pytest.mark.evidence
@pytest.mark.parametrize("path", MEASUREMENTS, ids=lambda p: str(p.relative_to(RUNS)))
def test_every_committed_run_is_one_kind(path):
    [kind] = measurement_kind(path)
    document = json.loads(path.read_text(encoding="utf-8"))
    assert workload_kinds.of_schema(document["schema"]).kind is kind


@pytest.mark.evidence
@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(RUNS)))
def test_every_committed_log_is_one_kinds_log(path):
    """Its header is exactly one kind's, and its name that kind's log's; every row's
    workload is a kind the header holds."""
    data = path.read_bytes()
    first = data.splitlines()[0].decode()
    kinds = [e for e in workload_kinds.KINDS if first == ",".join(validate.header_of(e))]
    assert [entry.log_name for entry in kinds] == [path.name]
    rows, problems = validate.parse_log(data, validate.header_of(kinds[0]))
    assert problems == []
    narrow = workload_kinds.KINDS[: workload_kinds.KINDS.index(kinds[0]) + 1]
    for _, row in rows:
        assert workload_kinds.of_name(row.get("workload")) in narrow


@pytest.mark.evidence
@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: str(p.relative_to(RUNS)))
def test_every_committed_sweep_is_one_kinds(path):
    name = json.loads(path.read_text(encoding="utf-8"))["plan"].get("workload", "network")
    assert name in workload_kinds.BY_NAME


def test_runs_holds_evidence_of_every_kind():
    """The checks above read real files of each kind, not an empty folder."""
    assert {kind for path in MEASUREMENTS for kind in measurement_kind(path)} == set(Kind)


# ---------------------------------------------------------------- no kind if chains

# A kind's name as a string literal compared with something (==, !=, in) is an if chain on
# the kind coming back. Allowed: the registry, and each kind's own modules, which speak of
# themselves.
OWN_MODULES = {
    "workload_kinds",
    "decoder",
    "decoder_model",
    "decoder_rules",
    "decoder_shape",
    "own_model",
    "own_model_facts",
    "hf_model",
    "seed_network",
    "mesure_memoire",
}
NAMES = {entry.kind.value for entry in workload_kinds.KINDS} | {
    entry.argument for entry in workload_kinds.KINDS
}


def kind_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, name) of every comparison with a kind's name, and of every dict literal keyed
    by kind names (a table in disguise)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                elements = operand.elts if isinstance(operand, (ast.Tuple, ast.List)) else []
                for literal in [operand, *elements]:
                    if isinstance(literal, ast.Constant) and literal.value in NAMES:
                        found.append((node.lineno, literal.value))
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if sum(key in NAMES for key in keys) >= 2:
                found.append((node.lineno, "a dict keyed by kind names"))
    return found


def test_no_stage_compares_a_workload_with_a_kinds_name():
    offenders = {
        path.name: kind_comparisons(path.read_text(encoding="utf-8"))
        for path in sorted(PIPELINE.rglob("*.py"))
        if path.stem not in OWN_MODULES
    }
    assert {name: found for name, found in offenders.items() if found} == {}


@pytest.mark.parametrize(
    "code",
    [
        'if workload == "decoder":\n    pass\n',
        'if plan.get("workload") != "own":\n    pass\n',
        'x = script if workload in ("network", "decoder") else other\n',
        'SCRIPTS = {"network": "mesure_memoire.py", "decoder": "decoder.py"}\n',
    ],
)
def test_the_guard_sees_an_if_chain(code):
    assert kind_comparisons(code)


def test_the_guard_leaves_other_strings_alone():
    assert kind_comparisons('if schema == "urn:x" or status == "completed":\n    pass\n') == []


def test_no_stage_writes_a_kinds_log_name_or_schema_of_its_own():
    """Log names and measurement schemas are spelt in the registry only."""
    spelt = {e.log_name for e in workload_kinds.KINDS[1:]} | {
        schema for e in workload_kinds.KINDS for schema in e.schemas
    }
    allowed = OWN_MODULES | {"run_folders"}  # run_folders: the kit's log, beside the runs
    for path in sorted(PIPELINE.rglob("*.py")):
        if path.stem in allowed:
            continue
        text = path.read_text(encoding="utf-8")
        assert [s for s in spelt if re.search(re.escape(f'"{s}"'), text)] == [], path.name


def test_the_registry_sits_below_every_stage():
    """Standard library only: validate.py and every stage import it, it imports none."""
    tree = ast.parse((PIPELINE / "core" / "workload_kinds.py").read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "argparse", "enum", "dataclasses"}
