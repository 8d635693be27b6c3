"""Every measurement checks its own prediction against the GPU, request by request.

While `measure` runs the phases, the caching allocator records its history: each block it
hands out (`alloc`, with the block's size) and each block that comes back once the GPU's
work on it is done (`free_completed`) (torch.cuda.memory._record_memory_history, without
stack traces). The trace's replay logs the same two kinds of event for the blocks it
predicts. The two sequences are held against each other:

- the requests in order, each of the block's size as the allocator rounds it
  (allocator_model.block_bytes);
- between two requests, the blocks freed, as one group in no order: a trace learns that a
  storage died at the next operator it sees, where the GPU frees it the moment its last
  reference goes, so frees can come in another order within the gap;
- what is freed after the last request is not compared (the end of the run).

An "exact" prediction is a claim that the GPU asks for the same blocks in the same order; the
measurement keeps the word only where this check agrees (`verdict`). Otherwise the prediction
is approximate and the file names the first place that differs: the phase, what the GPU did,
what the replay did and the operator the replay was at.

Standard library only.
"""

from __future__ import annotations

from pipeline.core import allocator_model

HISTORY = "the allocator's history"
WANTED = {"alloc": "alloc", "free_completed": "free"}


def gpu_events(device_trace: list[dict]) -> list[tuple]:
    """(action, bytes, None) of an allocator history's requests and completed frees."""
    return [
        (WANTED[event["action"]], event["size"], None)
        for event in device_trace
        if event["action"] in WANTED
    ]


def replay_events(log: list[tuple]) -> list[tuple]:
    """(action, bytes, what) of a replay's log, each event after a phase marker carrying it:
    what is "phase NAME: operator"."""
    phase, found = None, []
    for action, nbytes, what in log:
        if action == "phase":
            phase = what
        elif action in ("alloc", "free"):
            found.append((action, nbytes, f"{phase}: {what}"))
    return found


def grouped(events: list[tuple]) -> list[tuple]:
    """The requests in order and, between two, the blocks freed as one sorted group:
    [("alloc", (bytes,), what) | ("free", (bytes, ...), what)]."""
    found, freed, last = [], [], None
    for action, nbytes, what in events:
        size = allocator_model.block_bytes(nbytes)
        if action == "alloc":
            if freed:
                found.append(("free", tuple(sorted(freed)), last))
            found.append(("alloc", (size,), what))
            freed = []
        else:
            freed.append(size)
            last = what
    return found


def described(entry: tuple | None) -> dict | None:
    if entry is None:
        return None
    return {"action": entry[0], "bytes": list(entry[1])}


def check(device_trace: list[dict], log: list[tuple]) -> dict:
    """The GPU's history held against the replay's log: how many requests each made,
    whether they agree, and where they first differ."""
    gpu = grouped(gpu_events(device_trace))
    replay = grouped(replay_events(log))
    requests = {
        "gpu": sum(1 for entry in gpu if entry[0] == "alloc"),
        "replay": sum(1 for entry in replay if entry[0] == "alloc"),
    }
    for position in range(max(len(gpu), len(replay))):
        ours = replay[position] if position < len(replay) else None
        theirs = gpu[position] if position < len(gpu) else None
        if ours is not None and theirs is not None and ours[:2] == theirs[:2]:
            continue
        where = (ours or (replay[-1] if replay else None) or (None, None, None))[2]
        phase, _, operator = (where or ":").partition(": ")
        return {
            "requests": requests,
            "agrees": False,
            "first_difference": {
                "position": position + 1,
                "phase": phase or None,
                "gpu": described(theirs),
                "replay": described(ours),
                "operator": operator or None,
            },
        }
    return {"requests": requests, "agrees": True, "first_difference": None}


def why(found: dict) -> str:
    """One sentence for the prediction's unknown list: the first difference."""
    first = found["first_difference"]

    def said(entry: dict | None) -> str:
        if entry is None:
            return "nothing"
        sizes = entry["bytes"]
        if entry["action"] == "alloc":
            return f"a block of {sizes[0]:,} B"
        return f"{len(sizes)} block(s) freed ({sum(sizes):,} B)"

    return (
        f"at its event {first['position']:,} ({first['phase']}, the replay at "
        f"{first['operator']}) the GPU's allocator history shows {said(first['gpu'])} where "
        f"the replay has {said(first['replay'])}"
    )
