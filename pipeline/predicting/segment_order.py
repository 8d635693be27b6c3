"""The order of the CUDA driver's addresses for the caching allocator's segments, from their
sizes alone: among free blocks of one size the allocator takes the lowest address, so the
replay needs that order (trace.replay.RankedSegments), and the driver does not say it.

The model (runs/20261204T121000Z-h200-segment-addresses, H200, driver 580.159.04):

- A segment that fits in a hole takes the lowest such hole, at the hole's bottom.
- Otherwise it opens a span of its size rounded up to SPAN (32 MiB) just below the lowest
  span so far; the span's rest, above the segment, becomes a hole.
- A fresh process (import torch, CUDA init, nothing else) starts with two holes above the
  first span: a 2 MiB one 74 MiB below a 20 MiB one, 488 MiB above the first span's top
  (FRESH). Those numbers give every address of the three committed fresh processes, to the
  byte, relative to the first segment.

A measurement process of the pipeline (own_model.py measure) starts otherwise: about 450 MiB
above its first segment become free during the first phase, the driver or the libraries
place 2 MiB blocks of their own between the segments, and its first span's top moves by
32 MiB from one model to another. No single start explains the six committed ones, so for
them (start=None) `ranks` says None: the replay keeps its other orders and says
"approximate", as before.

Not the central replay of trace.prediction.predict either (tried on the 21 measurement
processes of runs/20261204T174000Z-hf-zoo-blind-rules with segments): with no holes at the
start, it orders fewer segment pairs of one pool wrongly than the plain order in 18 of them,
and of the 14 points there whose counters depend on the order, replayed under it rather than
the plain order, 8 are measured to the byte instead of 3 and 10 come closer; but
t5-small-training-bf16-b2-s384 moves away (largest difference 5,505,024 bytes, 3,538,944
plain; the driver's own order gives 0), so the plain order stays central.

Nor a reason to claim "exact". Starts with a region freed after the first, second or third
segment, 0 to 640 MiB in 32 MiB steps, that new spans take from its top down, order every
large segment of 26 of the 95 measurement processes committed with their segments as the
driver did (the plain start: none). But of 100 H200 measurements re-predicted with them, 4
points whose counters agree under every such start differ from the H200: GPT-2 training in
bfloat16 at 2 x 512 and 4 x 256 (131,072 bytes), Qwen2.5-0.5B training at 1 x 1,500
(2,721,792 bytes; for these two the driver's own order gives 0) and ViT-base training in
bfloat16 at batch 8 (1,347,584 bytes). Regions packed from the bottom up as well (tried on
14 of them) leave the Qwen point wrong. The driver puts some segments where no such start
does (a 20 MiB one right above the first), so the random orders of trace.prediction's
`address_order_spread` stay.
"""

from __future__ import annotations

import bisect
import dataclasses

MiB = 1 << 20
GRANULE = 2 * MiB  # every cudaMalloc of the caching allocator is a multiple of 2 MiB
SPAN = 32 * MiB  # the driver's step for a segment no hole takes


@dataclasses.dataclass(frozen=True)
class Start:
    """The driver's holes when the process creates its first segment, as (start, end) in
    bytes relative to the top of the region new spans grow down from (0)."""

    holes: tuple[tuple[int, int], ...]


# Fit on segments-0|1|2.json: seed 1 puts its first (2 MiB) segment in the lower hole and its
# first 20 MiB one in the upper, seed 2 its first 2 MiB one in the lower; all three open
# their first span right below 0. The upper hole is at least 20 MiB; 20 is the least the
# data allow (a 64 MiB one would take seed 1's later 20 MiB segments).
FRESH = Start(holes=((414 * MiB, 416 * MiB), (488 * MiB, 508 * MiB)))


class Driver:
    """The driver's placement, one segment after another (segments are never released:
    the caching allocator frees them only on empty_cache or out of memory)."""

    def __init__(self, start: Start = FRESH) -> None:
        self.holes = sorted(start.holes)  # (start, end), by address
        self.bottom = 0  # the lowest span's start

    def place(self, size: int) -> int:
        """The address of a new segment of `size` bytes (a positive multiple of 2 MiB)."""
        if size <= 0 or size % GRANULE:
            raise ValueError(f"a segment of {size} bytes: not a positive multiple of 2 MiB")
        for at, (low, high) in enumerate(self.holes):
            if high - low >= size:  # the lowest hole that fits
                del self.holes[at]
                if high - low > size:
                    bisect.insort(self.holes, (low + size, high))
                return low
        span = -(-size // SPAN) * SPAN
        self.bottom -= span
        if span > size:
            bisect.insort(self.holes, (self.bottom + size, self.bottom + span))
        return self.bottom


def addresses(sizes: list[int], start: Start = FRESH) -> list[int]:
    """The model's address of each segment, in creation order, relative to its start."""
    driver = Driver(start)
    return [driver.place(size) for size in sizes]


def ranks(segments: list[tuple[str, int]], start: Start | None = FRESH) -> list[int] | None:
    """Given (pool, size) of each new segment in creation order, the rank of its address
    (0 = lowest); None where the model cannot tell: an unknown start (a measurement
    process: start=None), or a size the caching allocator never asks the driver for."""
    if start is None:
        return None
    sizes = [size for _, size in segments]
    if any(size <= 0 or size % GRANULE for size in sizes):
        return None
    placed = addresses(sizes, start)
    order = {address: rank for rank, address in enumerate(sorted(placed))}
    return [order[address] for address in placed]
