"""The workload kinds the lab measures, in one registry: the seed network, the decoder and a
user's own model (a workload file or a Hugging Face config).

What differs between kinds as data lives here, so that a stage looks a kind up instead of
asking "is it the decoder?" in an if chain of its own: the script that measures it, how its
files are recognised (measurement schema, tool name, a log row's "workload"), its results log
and the columns it adds, what a sweep may vary, and how the stages name it. A stage whose
code (not data) differs by kind keeps one table keyed by Kind beside that code;
tests/test_workload_kinds.py checks that every table has every kind, and that no stage
compares a workload with a kind's name. Adding a kind: its entry here, its own measuring
module, its row in those tables.

Standard library only and no pipeline import: validate.py and every stage import it from
above (tests/test_imports.py).
"""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    """A kind by the name files write: a sweep plan's and a log row's "workload"."""

    NETWORK = "network"
    DECODER = "decoder"
    OWN = "own"


@dataclass(frozen=True)
class WorkloadKind:
    """One kind: what every stage needs to know of it that is not code."""

    kind: Kind
    argument: str  # how --workload names it (chain.py, sweep.py)
    help: str  # what --workload's help says of it
    script: str  # the script that measures it, as measurement.json names its tool
    module: str  # that script as `python -m` runs it
    estimate: str  # the command that predicts it without a GPU (fit.py names it)
    schemas: tuple[str, ...]  # the measurement.json schemas it writes, oldest first
    schema_file: str  # the schema of its measurement.json today, under schemas/
    log_name: str  # its results log, beside the run folders
    log_title: str  # how messages name its log ("the decoder log")
    columns: tuple[str, ...]  # the log columns it adds to the kinds' before it (validate.py)
    misplaced: str  # why its row is refused by a log that lacks its columns; "" never
    # What a sweep may vary: the names of its configuration; None when a workload file
    # declares its own (keyword-only parameters), checked once the file is read.
    dimensions: tuple[str, ...] | None
    title: str  # how a sweep's line and a report name the workload before its model

    @property
    def file(self) -> bool:
        """Named on the command line by a user's FILE.py:FUNCTION, not by its name."""
        return self.dimensions is None

    @property
    def flags(self) -> tuple[str, ...]:
        """The sweepable dimensions as --vary spells them."""
        return tuple(name.replace("_", "-") for name in self.dimensions or ())


MEASUREMENT = "urn:iteragpu-lab:schema:measurement:"

NETWORK = WorkloadKind(
    kind=Kind.NETWORK,
    argument="network",
    help="the seed's synthetic network (default)",
    script="mesure_memoire.py",
    module="kit.mesure_memoire",
    estimate="mesure_memoire.py estimate --phases --json",
    schemas=(f"{MEASUREMENT}v1", f"{MEASUREMENT}v2"),
    schema_file="measurement.schema.json",
    log_name="resultats-bruts.csv",
    log_title="kit",
    columns=(),  # the kit's own grid, data/resultats-bruts.csv: validate.kit_header()
    misplaced="",  # the narrowest log: every log holds its rows
    dimensions=("batch", "context", "width"),
    title="seed network",
)


def measured_by(kind: Kind, script: str, log_title: str) -> dict:
    """A kind that a script of pipeline/measuring measures: its module, command, schema and
    log are named after the script, the kind and `log_title`."""
    return {
        "kind": kind,
        "script": script,
        "module": f"pipeline.measuring.{script.removesuffix('.py')}",
        "estimate": f"{script} estimate --json",
        "schemas": (f"urn:iteragpu-lab:schema:{log_title}-measurement:v1",),
        "schema_file": f"{log_title}-measurement.schema.json",
        "log_name": f"resultats-{kind.value}.csv",
        "log_title": log_title,
    }


DECODER = WorkloadKind(
    **measured_by(Kind.DECODER, "decoder.py", "decoder"),
    argument="decoder",
    help="decoder.py's model",
    columns=(
        "workload",
        "preset",
        "layers",
        "heads",
        "kv_heads",
        "head_dim",
        "ffn",
        "vocab",
        "tie_embeddings",
        "qkv_bias",
        "prompt",
        "new_tokens",
        "tokens_per_row",
        "inputs_and_cache_wall_ns",
        "prefill_wall_ns",
        "decode_wall_ns",
        "prefill_tokens_per_second",
        "decode_tokens_per_second",
        "largest_abs_difference_bytes",
    ),
    misplaced=f"line 1: the header of {NETWORK.log_name}, without the decoder columns: a "
    "decoder row goes to a decoder log",
    dimensions=("batch", "prompt", "new_tokens"),
    title="decoder",
)

OWN = WorkloadKind(
    **measured_by(Kind.OWN, "own_model.py", "own-model"),
    argument="FILE.py:FUNCTION",
    help="your own model (own_model.py)",
    columns=(
        "workload_file",
        "workload_sha256",
        "workload_function",
        "workload_dims",
        "workload_mode",
        "parameter_count",
        "parameter_bytes",
        "cold_step_wall_ns",
        "optimizer_state_wall_ns",
        "warm_step_median_wall_ns",
        "warm_step_median_event_ns",
        "prediction_status",
    ),
    misplaced="line 1: a header without the own-model columns: an own-model row goes to an "
    "own-model log",
    dimensions=None,
    title="own model",
)

# In this order: each log's header is the one before it and the kind's columns, so that one
# log can hold the rows of every kind before it (merge.py writes the widest).
KINDS = (NETWORK, DECODER, OWN)
BY_KIND = {entry.kind: entry for entry in KINDS}
BY_NAME = {entry.kind.value: entry for entry in KINDS}
MEASUREMENT_SCHEMAS = tuple(schema for entry in KINDS for schema in entry.schemas)

# --workload, as chain.py and sweep.py take it; left out, the seed network (as in plans and
# logs written before there were kinds: of_name)
DEFAULT = NETWORK
ARGUMENTS = "|".join(entry.argument for entry in KINDS)
ARGUMENTS_TEXT = ", ".join(e.argument for e in KINDS[:-1]) + f" or {KINDS[-1].argument}"
HELP = "; ".join(f"{entry.argument}: {entry.help}" for entry in KINDS)
NAMED = {entry.argument: entry for entry in KINDS if not entry.file}


def workload_argument(text: str) -> str:
    """--workload's type: a kind's name, or FILE.py:FUNCTION (own_model.py checks it)."""
    if text in NAMED or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"{ARGUMENTS_TEXT}, got {text!r}")


def add_option(parser: argparse.ArgumentParser, **shown) -> None:
    """--workload, as chain.py and sweep.py take it (`shown`: its help and metavar)."""
    parser.add_argument("--workload", type=workload_argument, default=DEFAULT.argument, **shown)


def of_argument(text: str) -> WorkloadKind:
    """The kind --workload names: one by its name, else the workload file's."""
    return NAMED.get(text) or next(entry for entry in KINDS if entry.file)


def of_schema(schema: str | None) -> WorkloadKind | None:
    """The kind whose measurement.json carries this schema; None for any other document."""
    return next((entry for entry in KINDS if schema in entry.schemas), None)


def of_name(name: str | None) -> WorkloadKind:
    """The kind a plan's or a row's "workload" names; left out (files written before there
    were kinds, a kit log's rows), the seed network."""
    return BY_NAME.get(name, DEFAULT)
