"""segment_order against every committed record of the driver's addresses for the caching
allocator's segments (H200, driver 580.159.04): the fresh processes of
runs/20261204T121000Z-h200-segment-addresses to the byte, the measurement processes (its
hist/, the Pythia history and the 21 of runs/20261204T174000Z-hf-zoo-blind-rules) said
unknown, and how many of the latter it orders better than the plain order; hand-worked
cases; and the constants, each broken, failing the evidence."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import RUNS
from hypothesis import given
from hypothesis import strategies as st

from pipeline.predicting import segment_order as so

MiB = so.MiB
ADDRESSES = RUNS / "20261204T121000Z-h200-segment-addresses"
HISTORY = RUNS / "20261204T142700Z-h200-pythia-history" / "allocator-history.json"
FRESH = [f"segments-{seed}.json" for seed in (0, 1, 2)]
MEASURED = sorted(path.name for path in (ADDRESSES / "hist").glob("*.segments.json"))
BLIND = RUNS / "20261204T174000Z-hf-zoo-blind-rules" / "h200"  # the same format
BLIND_MEASURED = sorted(path.name for path in BLIND.glob("*.segments.json"))


def fresh(name: str) -> list[tuple[str, int, int]]:
    return [
        (s["pool"], s["size"], s["address"]) for s in json.loads((ADDRESSES / name).read_text())
    ]


def measured(name: str) -> list[tuple[str, int, int]]:
    """A measurement process's segments (the history marks no pool: 2 MiB is the small one's
    size, and no large segment is 2 MiB)."""
    if name == "pythia-history":
        events = json.loads(HISTORY.read_text())["events"]
        rows = [(e["action"], e["size"], e["addr"]) for e in events]
    else:
        folder = BLIND if name in BLIND_MEASURED else ADDRESSES / "hist"
        segments = json.loads((folder / name).read_text())["segments"]
        rows = [(s["action"], s["size"], s["address"]) for s in segments]
    assert {action for action, _, _ in rows if action.startswith("segment")} == {"segment_alloc"}
    return [
        ("small" if size == 2 * MiB else "large", size, address)
        for action, size, address in rows
        if action == "segment_alloc"
    ]


def order(values: list[int]) -> list[int]:
    rank = {value: r for r, value in enumerate(sorted(values))}
    return [rank[value] for value in values]


@pytest.mark.parametrize("name", FRESH)
def test_fresh_processes_ranks(name):
    segments = fresh(name)
    assert so.ranks([(pool, size) for pool, size, _ in segments]) == order(
        [address for *_, address in segments]
    )


@pytest.mark.parametrize("name", FRESH)
def test_fresh_processes_addresses_to_the_byte(name):
    """Stronger than the order: every address, relative to the first segment's."""
    segments = fresh(name)
    placed = so.addresses([size for _, size, _ in segments])
    assert [a - placed[0] for a in placed] == [s[2] - segments[0][2] for s in segments]


@pytest.mark.parametrize("name", [*MEASURED, *BLIND_MEASURED, "pythia-history"])
def test_measurement_processes_are_unknown(name):
    """No start explains them: ranks says None; and the fresh start is indeed wrong for
    them (if this starts failing, a start was found: give it a name and use it)."""
    segments = measured(name)
    pairs = [(pool, size) for pool, size, _ in segments]
    assert so.ranks(pairs, start=None) is None
    assert so.ranks(pairs) != order([address for *_, address in segments])


def test_every_committed_process_is_read():
    assert len(MEASURED) == 5
    assert len(BLIND_MEASURED) == 21
    assert all(len(fresh(name)) > 40 for name in FRESH)


def wrong_pairs(segments: list[tuple[str, int, int]], placed: list[int]) -> int:
    """Pairs of segments of one pool whose addresses `placed` orders otherwise than the
    driver did."""
    return sum(
        (a[2] < b[2]) != (pa < pb)
        for (a, pa), (b, pb) in itertools.combinations(zip(segments, placed, strict=True), 2)
        if a[0] == b[0]
    )


def test_the_model_orders_most_measurement_processes_better_than_the_plain_order():
    """The module docstring's count: with no holes at the start, the model orders fewer
    pairs wrongly than creation order in 18 of the 21 blind-test processes; GPT-2 inference
    and T5 inference, where the plain order is closer, are the exceptions. Neither is exact
    for any of them."""
    better, worse = [], []
    for name in BLIND_MEASURED:
        segments = measured(name)
        sizes = [size for _, size, _ in segments]
        model = wrong_pairs(segments, so.addresses(sizes, so.Start(holes=())))
        plain = wrong_pairs(segments, list(range(len(segments))))
        assert model > 0
        assert plain > 0
        (better if model < plain else worse).append(name.removesuffix(".segments.json"))
    assert len(better) == 18
    assert worse == [
        "gpt2-inference-bf16-b3-s900",
        "t5-small-inference-bf16-b4-s700",
        "t5-small-inference-fp32-b2-s1000",
    ]


# Hand-worked: relative to the top of the region new spans grow down from (0), fresh start
# holes [414, 416) MiB and [488, 508) MiB.
def test_hand_worked_spans_and_their_rests():
    sizes = [796 * MiB, 2 * MiB, 330 * MiB, 20 * MiB, 170 * MiB]
    # 796 -> span [-800, 0), rest [-4, 0) takes the 2 MiB; 330 -> span [-1152, -800), its
    # rest [-822, -800) takes the 20 MiB (lower than the 20 MiB hole at 488); 170 -> 192.
    assert so.addresses(sizes) == [m * MiB for m in (-800, -4, -1152, -822, -1344)]
    assert so.ranks([("large", s) for s in sizes]) == [3, 4, 1, 2, 0]


def test_hand_worked_start_holes():
    # A 2 MiB segment first: no span yet, the lowest hole that fits is the 2 MiB one; a 20
    # MiB one next: the 20 MiB hole, highest of all; 32 MiB: a span of its own, no rest;
    # 2 MiB again: no hole left, a span [-64, -32) whose rest [-62, -32) stays.
    driver = so.Driver()
    assert [driver.place(s * MiB) for s in (2, 20, 32, 2)] == [
        m * MiB for m in (414, 488, -32, -64)
    ]
    assert driver.holes == [(-62 * MiB, -32 * MiB)]


def test_a_full_span_leaves_no_hole():
    driver = so.Driver(so.Start(holes=()))
    assert [driver.place(s) for s in (64 * MiB, 2 * MiB)] == [-64 * MiB, -96 * MiB]
    assert driver.holes == [(-94 * MiB, -64 * MiB)]


def test_unknown_sizes_and_starts():
    assert so.ranks([("large", 3 * MiB)]) is None
    assert so.ranks([("large", 0)]) is None
    assert so.ranks([], start=None) is None
    assert so.ranks([]) == []
    with pytest.raises(ValueError, match="multiple of 2 MiB"):
        so.Driver().place(MiB)


@given(st.lists(st.integers(1, 4000).map(lambda n: n * 2 * MiB), max_size=60))
def test_segments_never_overlap_and_ranks_are_a_permutation(sizes):
    placed = so.addresses(sizes)
    spans = sorted(zip(placed, sizes, strict=True))
    assert all(a + s <= b for (a, s), (b, _) in itertools.pairwise(spans))
    assert sorted(so.ranks([("large", s) for s in sizes])) == list(range(len(sizes)))


def evidence_holds(start: so.Start = so.FRESH) -> bool:
    for name in FRESH:
        segments = fresh(name)
        placed = so.addresses([size for _, size, _ in segments], start)
        if order(placed) != order([a for *_, a in segments]):
            return False
    return True


@pytest.mark.parametrize(
    ("constant", "value"),
    [
        ("SPAN", 2 * MiB),
        ("SPAN", 16 * MiB),
        ("SPAN", 64 * MiB),
        ("FRESH", so.Start(holes=())),
        ("FRESH", so.Start(holes=((488 * MiB, 552 * MiB),))),
        ("FRESH", so.Start(holes=((414 * MiB, 416 * MiB), (488 * MiB, 552 * MiB)))),
    ],
)
def test_breaking_a_constant_fails_the_evidence(monkeypatch, constant, value):
    assert evidence_holds()
    if constant == "FRESH":  # a default argument, read when defined: given instead
        assert not evidence_holds(value)
    else:
        monkeypatch.setattr(so, constant, value)
        assert not evidence_holds()


def test_breaking_the_hole_rule_fails_the_evidence(monkeypatch):
    """The highest hole that fits, not the lowest: seed 0 and seed 1 disagree at once."""

    class Highest(so.Driver):
        def place(self, size: int) -> int:
            self.holes.reverse()
            try:
                return super().place(size)
            finally:
                self.holes.sort()

    monkeypatch.setattr(so, "Driver", Highest)
    assert not evidence_holds()
