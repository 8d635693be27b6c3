"""transformers' packed-sequence check, answered in a trace as the real run answers it.

Without an attention mask and without a cache (a training step with gradient checkpointing,
where transformers turns the cache off, or a forward with `use_cache=False`),
`transformers.masking_utils.create_causal_mask` asks `find_packed_sequence_indices` whether
each row of `position_ids` holds several sequences (positions that start again). It computes
`packed_sequence_mask = (torch.diff(position_ids, prepend=position_ids[:, :1] - 1) !=
1).cumsum(-1)` and returns None, one sequence a row, when `(packed_sequence_mask[:, -1] ==
0).all()`: a value read. On a fake tensor it skips the read (`is_tracing` counts a
FakeTensor as a traced graph) and returns the mask, from which a mask of batch x length x
length is made and kept through the step: a real run of ordinary positions drops it (4 MiB
at 4 x 1,024 tokens, the 4,194,304 B an H100 held less than the trace of a checkpointed
Llama 3.2 1B).

The trace knows the values of one kind of position ids: those counting up by one along the
last dimension from `torch.arange` with step 1 (the model's own when the caller gives none:
`torch.arange(length) + past_seen_tokens`, then `.unsqueeze(0)`), through `unsqueeze`,
`expand`, `to`, `clone` and `contiguous`, which keep each row's values, and the addition or
subtraction of a Python integer, which keeps them counting. For such ids the check runs as
the source runs it (the same operators, in the same order, for their blocks) and answers None,
as the real run does. Ids of any other origin (a data collator's packed positions) are left to
transformers' own code, which keeps the mask: the larger figure, as before.

The check is replaced where transformers is already imported when the trace starts (a
`--hf-config` model, a workload file that imports it at its top); a workload that imports it
inside its function keeps transformers' own.

Standard library only (torch is passed in).
"""

from __future__ import annotations

import sys
import weakref

KEEPS_ROWS = ("unsqueeze", "expand", "to", "clone", "contiguous")
SHIFTS = ("__add__", "__radd__", "add", "__sub__", "sub")  # by a Python integer


def counting_arange(args, kwargs) -> bool:
    """torch.arange(end) or (start, end) or (start, end, 1): values that count up by one."""
    step = kwargs.get("step", args[2] if len(args) > 2 else 1)
    return step == 1


def shift(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def install(torch):
    """The check answered for counting position ids, for the trace's time; returns the undo."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None and "transformers" in sys.modules:
        import transformers.masking_utils as masking
    if masking is None:
        return lambda: None
    from torch.overrides import TorchFunctionMode

    counting: dict = {}  # id -> weak reference (a tensor's == compares its values)
    methods = {getattr(torch.Tensor, name) for name in KEEPS_ROWS}
    shifts = {getattr(torch.Tensor, name) for name in SHIFTS}

    def counts(tensor) -> bool:
        ref = counting.get(id(tensor))
        return ref is not None and ref() is tensor

    def shifted(args) -> bool:
        return counts(args[0]) and shift(args[1])

    def note(tensor) -> None:
        key = id(tensor)
        counting[key] = weakref.ref(tensor, lambda _: counting.pop(key, None))

    class Counting(TorchFunctionMode):
        """Notes the tensors whose rows count up by one."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and (
                (func is torch.arange and counting_arange(args, kwargs))
                or (func in methods and args and counts(args[0]))
                or (func in shifts and len(args) == 2 and shifted(args))
            ):
                note(out)
            return out

    original = masking.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids):
        if not counts(position_ids):
            return original(position_ids)
        # masking_utils.find_packed_sequence_indices, up to its check, which holds
        first_dummy_value = position_ids[:, :1] - 1
        position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
        packed_sequence_mask = (position_diff != 1).cumsum(-1)
        (packed_sequence_mask[:, -1] == 0).all()
        return None

    mode = Counting()
    mode.__enter__()
    masking.find_packed_sequence_indices = find_packed_sequence_indices

    def undo():
        masking.find_packed_sequence_indices = original
        mode.__exit__(None, None, None)

    return undo
