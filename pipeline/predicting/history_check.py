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
what the replay did and the operator the replay was at. Where the history was recorded with
stack traces (`measure --history-stacks`), also the C++ function that asked the GPU for the
block (`made_by`).

Standard library only.
"""

from __future__ import annotations

from pipeline.core import allocator_model

HISTORY = "the allocator's history"
WANTED = {"alloc": "alloc", "free_completed": "free"}


# The frames of the allocator and of the history's own recording, above the function that
# asked for the block (CUDACachingAllocator.cpp, memory_snapshot.cpp, the storage's resize).
MACHINERY = ("torch::unwind", "torch::CapturedTraceback", "torch::cuda::", "c10::",
             "at::_ops::", "at::detail::empty", "at::native::resize", "at::native::empty",
             "at::create_out")  # fmt: skip


def gpu_events(device_trace: list[dict]) -> list[tuple]:
    """(action, bytes, event) of an allocator history's requests and completed frees."""
    return [
        (WANTED[event["action"]], event["size"], event)
        for event in device_trace
        if event["action"] in WANTED
    ]


def made_by(event) -> str | None:
    """The C++ function that asked for this block, its arguments left out: past the
    allocator's, the recording's and the dispatcher's own frames, the first of ATen's
    kernels (`at::native::`), else the first frame left (a structured kernel makes its
    output before its body runs, in its own `set_output_raw_strided`); None without stack
    traces."""
    names = []
    for frame in (event or {}).get("frames") or []:
        name = frame.get("name", "").replace("(anonymous namespace)::", "")
        name = name.removeprefix("void ").strip().split("(")[0][:200]
        if (
            name
            and not name.startswith(MACHINERY)
            and not frame.get("filename", "").endswith(".py")
        ):
            names.append(name)
    kernel = next((name for name in names if name.startswith("at::native::")), None)
    return kernel or (names[0] if names else None)


def replay_events(log: list[tuple]) -> list[tuple]:
    """(action, bytes, what) of a replay's log, each event after a phase marker carrying it:
    what is "phase NAME: operator". An empty tensor's storage is left out: the caching
    allocator gives a request of 0 bytes no block and records nothing (CUDACachingAllocator's
    `allocate` calls `malloc` only for a size other than 0), as the replay's allocator model
    takes none for it either."""
    phase, found = None, []
    for action, nbytes, what in log:
        if action == "phase":
            phase = what
        elif action in ("alloc", "free") and nbytes:
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
                **stacks_of(theirs),
            },
        }
    return {"requests": requests, "agrees": True, "first_difference": None}


def stacks_of(entry: tuple | None) -> dict:
    """{"gpu_function": ...} for a GPU request recorded with its stack, else {}."""
    if entry is None or entry[0] != "alloc" or not (entry[2] or {}).get("frames"):
        return {}
    return {"gpu_function": made_by(entry[2])}


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

    made = f" (made by {first['gpu_function']})" if first.get("gpu_function") else ""
    return (
        f"at its event {first['position']:,} ({first['phase']}, the replay at "
        f"{first['operator']}) the GPU's allocator history shows {said(first['gpu'])}{made} "
        f"where the replay has {said(first['replay'])}"
    )
