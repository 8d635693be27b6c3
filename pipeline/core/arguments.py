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


def positive_int(text: str) -> int:
    """Digits only: '1e9', '5.0', '+5' and '0' are refused rather than guessed at."""
    if not re.fullmatch(r"[0-9]+", text) or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def non_negative_decimal(text: str) -> Decimal:
    """A plain decimal number >= 0 ('4', '0.5'); no exponent, sign, NaN or infinity."""
    if not re.fullmatch(r"[0-9]{1,15}(\.[0-9]{1,15})?", text):
        raise argparse.ArgumentTypeError(f"expected a decimal number >= 0, got {text!r}")
    return Decimal(text)


def non_negative_int(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,18}", text):
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def device_index(text: str) -> int:
    """`cuda` or `cuda:N`; ROCm builds of PyTorch use the same name. Never the CPU."""
    match = re.fullmatch(r"cuda(?::([0-9]+))?", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected a GPU device 'cuda' or 'cuda:N' (no CPU fallback), got {text!r}"
        )
    return int(match.group(1) or 0)
