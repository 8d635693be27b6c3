"""The words a prediction uses for how far it can be trusted (a document's
`prediction.status`) and the counters its bounds are given for: read by the stages that
judge a prediction (validate, fit, report), which need these words, not the trace that makes
them. Standard library only.
"""

from __future__ import annotations

import enum


class PredictionStatus(str, enum.Enum):
    """How far a prediction can be trusted (a measurement's `prediction.status`); an enum of
    str, so a document read back from JSON compares equal to it."""

    EXACT = "exact"  # everything it used is covered: it must equal the GPU to the byte
    APPROXIMATE = "approximate"  # something is not covered: it names what, with bounds
    NOT_PREDICTED = "not predicted"  # the trace could not follow the code: it says where

    def __str__(self) -> str:
        return self.value


# the counters a prediction's bounds are given for (its `bounds`, row by row)
PEAK_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes")
