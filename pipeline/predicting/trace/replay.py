"""The replay of a trace through the allocator model: `replay` gives each phase's counters,
under the central order of segment addresses (`DriverOrder`), another order (`RankedSegments`)
or the least and the most the unknowns can take (a `bounds.Scenario`).

Torch is never imported here."""

from __future__ import annotations

import bisect
import itertools

from pipeline.core import allocator_model
from pipeline.predicting import cudnn_rnn, segment_order
from pipeline.predicting.trace.calibration import Calibration
from pipeline.predicting.trace.model import AUTOGRAD, CALLER, Trace

ADDRESS_ORDER = "segment address order"
# The most replay's library workspaces: an operator nobody measured keeps at most this much
# per thread for the libraries it calls (cuBLAS and cuBLASLt keep 33 MiB on an H200); the
# rest of what the bounds assume is in bounds.py.
WORKSPACE_BOUND = 64 * 2**20


class IndexedAllocator(allocator_model.AllocatorModel):
    """allocator_model.AllocatorModel, choice for choice and counter for counter, with its
    free blocks kept sorted by (size, address, when freed) in one list per pool: the model
    scans every free block at every allocation, which an 8B-class trace, replayed ten times,
    asks a few hundred thousand times. The third key, a count, keeps the keys distinct (two
    segments of one rank would give blocks of one size and address), so that blocks
    themselves are never compared.

    It also notes whether any allocation chose among free blocks of its size in different
    segments (`address_choice`): if none did, no order of the segments' addresses can change
    a choice, and so no counter (`address_order_spread`).

    Beside the counters it keeps the bytes the live blocks were asked for, each request
    rounded to 512 (`requested`), and each phase's peak of them (`peaks_requested`): a block
    may be larger than its request by a rest the allocator does not split off, which
    depends on where blocks land, so only these bytes are sure to be allocated."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = self.peak_requested = 0
        self.peaks_requested: list[int] = []
        self.pools: dict = {False: [], True: []}  # small -> sorted [(size, address, n, block)]
        self.listed = itertools.count()
        self.made = itertools.count()  # segments, for address_choice
        self.address_choice = False

    def _list(self, block: dict) -> None:
        block["key"] = key = (block["size"], block["address"], next(self.listed), block)
        bisect.insort(self.pools[block["small"]], key)

    def _unlist(self, block: dict) -> None:
        pool = self.pools[block["small"]]
        del pool[bisect.bisect_left(pool, block["key"])]

    def _take(self, size: int, small: bool) -> dict | None:
        pool = self.pools[small]
        at = bisect.bisect_left(pool, (size,))
        if at == len(pool):
            return None
        block = pool.pop(at)[3]
        if not self.address_choice:
            for other in itertools.islice(pool, at, None):
                if other[0] != block["size"]:
                    break
                if other[3]["segment"] != block["segment"]:
                    self.address_choice = True
                    break
        return block

    def _new_segment(self, size: int, small: bool) -> dict:
        block = super()._new_segment(size, small)
        block["segment"] = next(self.made)  # its split-off tails carry it too
        return block

    def malloc(self, nbytes: int):
        block = super().malloc(nbytes)
        if block is not None:
            block["requested"] = size = allocator_model.block_bytes(nbytes)
            self.requested += size
            self.peak_requested = max(self.peak_requested, self.requested)
        return block

    def reset_peaks(self) -> None:
        super().reset_peaks()
        self.peak_requested = self.requested

    def end_phase(self) -> None:
        self.peaks_requested.append(self.peak_requested)

    def free(self, block) -> None:
        if block is not None:
            self.requested -= block["requested"]
        super().free(block)


class DriverOrder(IndexedAllocator):
    """The central replay: each new segment where segment_order's model of the driver puts
    it, from a start with no holes. Not exact for a measurement process, but closer than
    the plain order on the measured points whose counters depend on the order (the
    evidence page says how many); the plain order stays among the other orders
    (`address_order_spread`)."""

    def __init__(self) -> None:
        super().__init__()
        self.driver = segment_order.Driver(segment_order.Start(holes=()))

    def segment_address(self, size: int) -> int:
        return self.driver.place(size)


class RankedSegments(IndexedAllocator):
    """The allocator model with the n-th segment it creates (from 0) at rank segment_rank(n)
    among the segments' addresses. Among free blocks of one size the allocator takes the
    lowest address; inside a segment that order is known, between segments it is the
    driver's, which no model has (the plain model puts a later segment above an earlier)."""

    SPAN = 2**60  # rank r's segment starts at r * 2**60: segments never touch

    def __init__(self, segment_rank) -> None:
        super().__init__()
        self.segment_rank = segment_rank
        self.segments = 0

    def malloc(self, nbytes: int):
        """segment_rank is asked at every call, for the segment this call may make."""
        reserved = self.reserved
        self.next_address = self.segment_rank(self.segments) * self.SPAN
        block = super().malloc(nbytes)
        self.segments += self.reserved != reserved
        return block


def unseen_first(events: list) -> list:
    """The events with every storage made outside the dispatcher allocated before all else:
    the earliest it can have been made."""
    early = [event for event in events if event[0] == "unseen"]
    return early + [event for event in events if event[0] != "unseen"]


def replay(
    trace: Trace,
    calibration: Calibration | None,
    segment_rank=None,
    scenario=None,
    allocator: IndexedAllocator | None = None,
    logged: bool = True,
):
    """Returns (rows, log, mismatches, whether autograd's thread used kept blocks); with
    `segment_rank`, under that order of the segments' addresses (RankedSegments); with
    `scenario` (Scenario), the least or the most the unknowns can take (`bounds`). An
    `allocator` given (a fresh one) is the one replayed through, for its `address_choice`.
    Not `logged`: the log stays empty (the replays whose rows alone are read)."""
    if allocator is None:
        allocator = DriverOrder() if segment_rank is None else RankedSegments(segment_rank)
    per_thread = calibration is None or calibration.workspaces_per_thread is not False
    events = trace.events
    if scenario is not None:
        if calibration is None or calibration.workspaces_per_thread is None:
            per_thread = scenario.upper
        if scenario.upper:
            events = unseen_first(events)
    run = Replay(trace, calibration, scenario, allocator, logged, per_thread)
    run.play(events)
    return run.rows, run.log, run.mismatches, run.autograd_kept


class Replay:
    """One replay of a trace's events through an allocator model, as `replay` sets it up:
    the blocks of the storages alive, the rows of the phases ended, the log."""

    def __init__(self, trace, calibration, scenario, allocator, logged, per_thread) -> None:
        self.trace = trace
        self.calibration = calibration
        self.scenario = scenario
        self.allocator = allocator
        self.logged = logged
        self.per_thread = per_thread
        self.blocks: dict = {}  # storage id -> block
        self.kept: set = set()  # the persistent blocks already allocated, by thread and size
        self.rows: list[dict] = []
        self.log: list[tuple] = []
        self.mismatches: dict = {}
        self.autograd_kept = False
        self.row: dict = {}
        self.templates: dict = {}  # signature -> its template: a pattern's lookup is not free
        # id of a (block, bytes) entry -> storages that share it, where several
        self.sharing: dict = {}
        # a storage id, or an at_most token -> the blocks the most replay added
        self.tied: dict = {}

    def malloc(self, nbytes: int, what: str):
        if self.logged:
            self.log.append(("alloc", nbytes, what))
        return self.allocator.malloc(nbytes)

    def free(self, block, nbytes: int, what: str) -> None:
        if self.logged and block is not None:
            self.log.append(("free", nbytes, what))
        self.allocator.free(block)

    def release(self, entry: tuple, what: str) -> None:
        """A storage's end: its block is freed with the last storage that shares it."""
        count = self.sharing.pop(id(entry), 1) - 1
        if count:
            self.sharing[id(entry)] = count
        else:
            self.free(entry[0], entry[1], what)

    def play(self, events: list) -> None:
        """The events in order: phases begun and ended, storages made and gone."""
        allocator, blocks, tied, scenario = self.allocator, self.blocks, self.tied, self.scenario
        malloc, free = self.malloc, self.free
        for event in events:
            kind = event[0]
            if kind == "start":
                _, name, repetition, passes = event
                row = self.row = {"phase": name}
                if repetition is not None:
                    row["repetition"] = repetition
                row["passes"] = passes
                row["baseline_allocated_bytes"] = allocator.allocated
                row["baseline_reserved_bytes"] = allocator.reserved
                allocator.reset_peaks()
                self.log.append(("phase", 0, name))
            elif kind == "end":
                row = self.row
                row["allocated_bytes"] = allocator.allocated
                row["reserved_bytes"] = allocator.reserved
                row["peak_allocated_bytes"] = allocator.peak_allocated
                row["peak_reserved_bytes"] = allocator.peak_reserved
                allocator.end_phase()
                self.rows.append(row)
            elif kind == "free":
                entry = blocks.pop(event[1], None)
                if entry is not None:
                    self.release(entry, "storage")
                for block, nbytes in reversed(tied.pop(event[1], ())):
                    free(block, nbytes, "at most")
            elif kind == "most":  # the most replay's alone (Recorder.at_most)
                if scenario is not None and scenario.upper:
                    held = [(malloc(nbytes, "at most"), nbytes) for nbytes in event[2] if nbytes]
                    tied.setdefault(event[1] if event[3] is None else event[3], []).extend(held)
            elif kind == "most_end":
                for block, nbytes in reversed(tied.pop(event[1], ())):
                    free(block, nbytes, "at most")
            elif kind == "unseen":
                blocks[event[1]] = (malloc(event[2], "unseen storage"), event[2])
            elif kind == "resize":
                old = blocks.pop(event[1], None)
                blocks[event[1]] = (malloc(event[2], "resize"), event[2])
                if old is not None:
                    self.release(old, "resize")
            else:
                self.operator(event[1])

    def operator(self, op) -> None:
        """An operator call: its outputs' blocks, and those its kernel allocates besides."""
        blocks, scenario, calibration = self.blocks, self.scenario, self.calibration
        if op.reuses in blocks:  # made in place by a real run: one block, two storages
            ((_, sid, _),) = op.outputs
            blocks[sid] = blocks[op.reuses]
            self.sharing[id(blocks[sid])] = self.sharing.get(id(blocks[sid]), 1) + 1
            return
        template = None
        if calibration:
            templates = self.templates
            template = templates.get(op.signature, templates)
            if template is templates:
                template = templates[op.signature] = calibration.template(
                    op.signature, self.trace.signatures.get(op.signature)
                )
        uncertain = scenario is not None and op.signature in scenario.uncertain
        wide = scenario.wider.get(op.signature, {}) if scenario and scenario.upper else {}
        if uncertain and template is not None and not scenario.upper:
            template = [step for step in template if step[0] == "output"]
        if template is None and not uncertain:  # outputs only, by index (`record`'s order)
            for index, sid, nbytes in sorted(op.outputs):
                nbytes += wide.get(index, 0) if nbytes else 0
                blocks[sid] = (self.malloc(nbytes, op.name), nbytes)
            return
        pending = {index: (sid, nbytes) for index, sid, nbytes in op.outputs}
        self.steps(op, template or (), pending, wide)
        for index, (sid, nbytes) in sorted(pending.items()):
            if template is not None and nbytes:  # an empty tensor takes no block
                self.mismatches.setdefault(op.name, f"output {index} not allocated by the probe")
            nbytes += wide.get(index, 0) if nbytes else 0
            blocks[sid] = (self.malloc(nbytes, op.name), nbytes)
        if uncertain and scenario.upper:
            self.at_most(op)

    def steps(self, op, template, pending: dict, wide: dict) -> None:
        """The call's template, step by step; the outputs it allocates leave `pending`."""
        malloc, mismatches = self.malloc, self.mismatches
        scratch: dict = {}
        seen_sizes: dict = {}
        for step in template:
            if step[0] == "output" and step[1] in pending:
                sid, nbytes = pending.pop(step[1])
                if step[2] is not None and nbytes != step[2]:  # None: a pattern's
                    slack = cudnn_rnn.output_slack(op.name).get(step[1], 0)
                    if 0 < step[2] - nbytes <= slack:
                        nbytes = step[2]  # a size the trace knows within slack: the probe's
                    else:
                        mismatches.setdefault(op.name, f"output {step[1]}: traced {nbytes} B")
                nbytes += wide.get(step[1], 0) if nbytes else 0
                self.blocks[sid] = (malloc(nbytes, op.name), nbytes)
            elif step[0] == "output":
                mismatches.setdefault(op.name, f"output {step[1]} is not new in the trace")
            elif step[0] == "internal":
                scratch[step[1]] = (malloc(step[2], f"{op.name} scratch"), step[2])
            elif step[0] == "free":
                block, nbytes = scratch.pop(step[1])
                self.free(block, nbytes, f"{op.name} scratch")
            else:
                nth = seen_sizes[step[1]] = seen_sizes.get(step[1], 0) + 1
                key = (op.role if self.per_thread else CALLER, step[1], nth)
                if key not in self.kept:
                    self.kept.add(key)
                    self.autograd_kept |= op.role == AUTOGRAD
                    malloc(step[1], f"{op.name} kept (library workspace)")

    def at_most(self, op) -> None:
        """The most a call nobody measured may add, alive with its outputs: a library
        workspace per thread once, and its scratch."""
        key = (op.role if self.per_thread else CALLER, "workspace bound")
        if key not in self.kept:
            self.kept.add(key)
            self.malloc(WORKSPACE_BOUND, f"{op.name} library workspace, at most")
        held = [
            (self.malloc(nbytes, f"{op.name} scratch, at most"), nbytes)
            for nbytes in self.scenario.uncertain[op.signature]
            if nbytes
        ]
        for block, nbytes in reversed(held):
            self.free(block, nbytes, op.name)
