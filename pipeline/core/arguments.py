"""The usage error and the value parsers that the kit's and the pipeline's command lines share.

A bad input or a missing prerequisite is a UsageError: one line on stderr, exit 2, nothing
written (cli.run and the kit's main print it). The parsers take digits and device names only,
refusing what they would otherwise guess at ('1e9', '+5', 'cpu').

A core module of the kit script (make_kit_script.py says how): standard library only,
Python >= 3.10, PyTorch imported inside the functions that need it.
"""

from __future__ import annotations

import argparse
import re
from decimal import Decimal


class UsageError(Exception):
    """A bad input or a missing prerequisite: one line on stderr, exit 2, nothing written."""


def _matched(text: str, pattern: str, expected: str) -> str:
    """The text when the whole of it matches `pattern`; else argparse's one-line refusal."""
    if not re.fullmatch(pattern, text):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return text


def positive_int(text: str) -> int:
    """Digits only: '1e9', '5.0', '+5' and '0' are refused rather than guessed at."""
    return int(_matched(text, r"0*[1-9][0-9]*", "a positive integer"))


def non_negative_decimal(text: str) -> Decimal:
    """A plain decimal number >= 0 ('4', '0.5'); no exponent, sign, NaN or infinity."""
    return Decimal(_matched(text, r"[0-9]{1,15}(\.[0-9]{1,15})?", "a decimal number >= 0"))


def non_negative_int(text: str) -> int:
    return int(_matched(text, r"[0-9]{1,18}", "an integer >= 0"))


def device_index(text: str) -> int:
    """`cuda` or `cuda:N`; ROCm builds of PyTorch use the same name. Never the CPU."""
    match = re.fullmatch(r"cuda(?::([0-9]+))?", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected a GPU device 'cuda' or 'cuda:N' (no CPU fallback), got {text!r}"
        )
    return int(match.group(1) or 0)


def add_defaulted(group, defaults: dict, what: dict, dtypes) -> None:
    """One option per entry of `defaults` (name: default), its help `what[name]` with the
    default shown: `dtype` chooses among `dtypes`, every other takes a positive integer."""
    for name, default in defaults.items():
        text = f"{what[name]} (default {default})" if name in what else f"(default {default})"
        kind = {"choices": sorted(dtypes)} if name == "dtype" else {"type": positive_int}
        group.add_argument("--" + name.replace("_", "-"), default=default, help=text, **kind)
