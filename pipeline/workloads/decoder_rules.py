"""The decoder's facts that validate.py checks, below both: the schemas' names, what a
calibration's schema cannot say, and the plan of the rows a measurement holds. Standard
library only: validate.py imports this module, and decoder.py re-exports every name.
"""

from __future__ import annotations

import itertools

SCHEMA = "urn:iteragpu-lab:schema:decoder-measurement:v1"
CALIBRATION_SCHEMA = "urn:iteragpu-lab:schema:decoder-calibration:v1"

TEXT_TERMS = ("dtype", "backend")  # the terms whose values are names, not numbers


def calibration_facts(document: dict) -> list[str]:
    """What the calibration schema cannot say: a range or a size is over numbers, so it never
    names a term whose value is a name (dtype, backend); validate.py applies this to every
    calibration, and so does the predictor before it reads one."""
    errors = []

    def formula_terms(formula, where: str) -> None:
        if isinstance(formula, str) and formula in TEXT_TERMS:
            errors.append(f"{where}: a size cannot be the name-valued term {formula!r}")
        elif isinstance(formula, dict):
            for arguments in formula.values():
                for argument in arguments:
                    formula_terms(argument, where)

    def condition(when: dict, where: str) -> None:
        for key, wanted in when.items():
            if key in TEXT_TERMS and isinstance(wanted, dict):
                errors.append(f"{where}.{key}: a range, but {key} is a name, not a number")

    condition(document.get("covers", {}), "$.covers")
    for i, entry in enumerate(document.get("attention_backends", [])):
        condition(entry.get("when", {}), f"$.attention_backends[{i}].when")
    for i, entry in enumerate(document["sites"]):
        condition(entry.get("when", {}), f"$.sites[{i}].when")
        for j, block in enumerate(entry["blocks"]):
            for key, value in block.items():
                if key in ("bytes", "requested_bytes"):
                    formula_terms(value, f"$.sites[{i}].blocks[{j}].{key}")
    return errors


def traced(prediction: dict) -> bool:
    """A prediction by the trace (decoder.py 2.0.0 on), not the standard-library replay the
    files of decoder.py 1.0.0 carry (`exact`, `not_predicted`): both are read."""
    return "status" in prediction


def row_plan(run: dict) -> list[tuple[str, int | None, int, int]]:
    """The generation rows after the weights and the cache: (phase, repetition, first token
    index, tokens). The prefill makes token 0; warm-up the next `warmup`; then a decode row
    per `tokens_per_row` tokens (the last row may hold fewer)."""
    return list(rows_of_plan(run))


def rows_of_plan(run: dict):
    """row_plan's rows one by one: a reader of a file takes only as many as the file holds
    (its configuration may claim billions of tokens)."""
    yield ("prefill", None, 0, 1)
    yield ("warmup", None, 1, run["warmup"])
    first, repetition = 1 + run["warmup"], 1
    while first < run["new_tokens"]:
        count = min(run["tokens_per_row"], run["new_tokens"] - first)
        yield ("decode", repetition, first, count)
        first, repetition = first + count, repetition + 1


def written_rows(run: dict, limit: int) -> list[tuple[str, int | None, int, int, int]]:
    """(phase, repetition, tokens, passes, first position) of the first `limit` rows decoder.py
    writes: the weights, the cache, then row_plan's (planned_rows counts them all)."""
    rows = [("model_load", None, 0, 0, 0), ("inputs_and_cache", None, 0, 0, 0)]
    for phase, repetition, first, count in itertools.islice(rows_of_plan(run), max(0, limit - 2)):
        passes = 1 if phase == "prefill" else count
        rows.append((phase, repetition, count, passes, first_position(run, phase, first)))
    return rows[:limit]


def planned_rows(run: dict) -> int:
    """How many rows a run of this configuration writes: the weights, the cache, the prefill,
    the warm-up, and one decode row per tokens_per_row tokens after them."""
    decoded = max(0, run["new_tokens"] - 1 - run["warmup"])
    return 4 + -(-decoded // run["tokens_per_row"])


def first_position(run: dict, phase: str, first: int) -> int:
    """The first cache position a row writes: the prompt's from 0, token i's input at P + i - 1."""
    return (
        0 if phase in ("model_load", "inputs_and_cache", "prefill") else run["prompt"] + first - 1
    )
