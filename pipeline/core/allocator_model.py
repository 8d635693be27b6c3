"""PyTorch's native caching allocator as the predictions model it, and when that model holds.

AllocatorModel replays allocations and frees, one stream, and keeps the four counters PyTorch
keeps; every prediction goes through it (the seed network's, the decoder's, the own model's
and the trace's IndexedAllocator, which subclasses it). prediction_applicability says whether
an environment's allocator is the one modelled (native, default settings): where it is not,
predictions are written but are not a claim. DTYPE_BYTES: bytes per element of the dtypes
the stages measure.

A core module of the kit script (make_kit_script.py says how): standard library only,
Python >= 3.10, PyTorch imported inside the functions that need it.
"""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


# PyTorch's native CUDA caching allocator with its default settings (c10/cuda/
# CUDACachingAllocator.cpp): every block is a multiple of 512 bytes; requests up to 1 MiB
# come from 2 MiB "small" segments; larger ones from 20 MiB segments (under 10 MiB) or from
# segments rounded up to 2 MiB; a free block is reused best-fit and split only when the rest
# is at least 512 bytes (small pool) or more than 1 MiB (large pool), so a large request can
# be handed a whole block bigger than itself.
MIN_BLOCK, SMALL_SIZE, SMALL_SEGMENT = 512, 2**20, 2 * 2**20
LARGE_SEGMENT, MIN_LARGE_ALLOC, ROUND_LARGE = 20 * 2**20, 10 * 2**20, 2 * 2**20

# The device-side allocator settings the prediction models, in the names and values PyTorch
# reports (its memory snapshot's "allocator_settings"): no split limit, no garbage collection
# threshold, no expandable segments, no power-of-two rounding. Pinned-memory settings change
# host memory only. Other values change reserved counters the model does not follow.
MODELLED_ALLOCATOR = {
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
}


def block_bytes(nbytes: int) -> int:
    """The bytes of the block a request of `nbytes` (> 0) is given at the least."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


class AllocatorModel:
    """Replays allocations and frees, one stream, and keeps the four counters PyTorch keeps.
    Its free blocks are one list, scanned at every allocation; a subclass keeps them its own
    way through _take, _list and _unlist, and places segments through segment_address."""

    def __init__(self) -> None:
        self.free_blocks: list[dict] = []
        self.next_address = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def _take(self, size: int, small: bool) -> dict | None:
        """The best-fitting free block of the pool (the smallest, then the lowest), unlisted."""
        fits = [b for b in self.free_blocks if b["small"] == small and b["size"] >= size]
        if not fits:
            return None
        block = min(fits, key=lambda b: (b["size"], b["address"]))
        self.free_blocks.remove(block)
        return block

    def _list(self, block: dict) -> None:
        self.free_blocks.append(block)

    def _unlist(self, block: dict) -> None:
        self.free_blocks.remove(block)

    def segment_address(self, size: int) -> int:
        """A new segment's address: above every earlier one."""
        address = self.next_address
        self.next_address += size + ROUND_LARGE  # segments never touch
        return address

    def _new_segment(self, size: int, small: bool) -> dict:
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return {
            "address": self.segment_address(size),
            "size": size,
            "small": small,
            "prev": None,
            "next": None,
            "allocated": False,
        }

    def malloc(self, nbytes: int) -> dict | None:
        if nbytes == 0:
            return None  # an empty tensor takes no block
        size = block_bytes(nbytes)
        small = size <= SMALL_SIZE
        block = self._take(size, small)
        if block is None:
            if small:
                segment = SMALL_SEGMENT
            elif size < MIN_LARGE_ALLOC:
                segment = LARGE_SEGMENT
            else:
                segment = -(-size // ROUND_LARGE) * ROUND_LARGE
            block = self._new_segment(segment, small)
        rest = block["size"] - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            tail = dict(block, address=block["address"] + size, size=rest, prev=block)
            if block["next"] is not None:
                block["next"]["prev"] = tail
            block["next"], block["size"] = tail, size
            self._list(tail)
        block["allocated"] = True
        self.allocated += block["size"]
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: dict | None) -> None:
        if block is None:
            return
        block["allocated"] = False
        self.allocated -= block["size"]
        for neighbour in (block["prev"], block["next"]):
            if neighbour is not None and not neighbour["allocated"]:
                self._unlist(neighbour)
                if neighbour is block["prev"]:
                    block["address"], block["prev"] = neighbour["address"], neighbour["prev"]
                    if neighbour["prev"] is not None:
                        neighbour["prev"]["next"] = block
                else:
                    block["next"] = neighbour["next"]
                    if neighbour["next"] is not None:
                        neighbour["next"]["prev"] = block
                block["size"] += neighbour["size"]
        self._list(block)

    def counters(self) -> dict:
        return {"allocated_bytes": self.allocated, "reserved_bytes": self.reserved}


def prediction_applicability(environment: dict) -> tuple[bool, str | None]:
    """The allocator model holds for PyTorch's native allocator with its default settings
    only; anything else is said, and the predictions beside the counters are not a claim."""
    gpu = environment.get("gpu", {})
    backend = gpu.get("allocator_backend")
    if backend != "native":
        return False, f"allocator backend {backend!r}: the model is of the native allocator"
    settings = gpu.get("allocator_settings", {})
    if "error" in settings:
        return False, f"allocator settings {settings['error']}: defaults not confirmed"
    changed = [
        f"{key}={settings.get(key)!r}"
        for key, default in MODELLED_ALLOCATOR.items()
        if settings.get(key) != default
    ]
    divisions = settings.get("roundup_power2_divisions")
    if not isinstance(divisions, dict) or any(divisions.values()):
        changed.append(f"roundup_power2_divisions={divisions!r}")
    if changed:
        return False, "allocator settings differ from the modelled defaults: " + ", ".join(changed)
    return True, None
