"""The words a measurement file uses for how its run ended (its `status`).

An enum of str: a document read back from JSON compares equal to its members, json writes
them as their words, and a misspelt status is an AttributeError where it is written, not a
comparison that is silently never true. Standard library only: the kit carries it.
"""

from __future__ import annotations

import enum


class RunStatus(str, enum.Enum):
    """How a measurement run ended (the document's `status`). The kit writes the first two;
    the pipeline's own-model runs and `estimate --json` files the other two."""

    COMPLETED = "completed"
    OUT_OF_MEMORY = "out_of_memory"  # the file is written; exit 3
    FAILED = "failed"  # the user's workload code raised: kept, never recorded as a measurement
    PREDICTED = "predicted"  # `estimate --json`: no GPU ran, the counters are a prediction

    def __str__(self) -> str:
        return self.value
