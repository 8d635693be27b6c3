"""How a calibration names an operator call without its sizes, and checks a call's sizes
against the ones probed: the keys both the calibration's builder (gpu_calibration.py) and
its reader (trace.calibration.Calibration) use. Standard library only; imports nothing of
the pipeline, so that neither of those two needs the other for it.
"""

from __future__ import annotations


def is_tensor_leaf(leaf) -> bool:
    """A described tensor argument (trace.recorder.describe): ("tensor", dtype, shape,
    stride, offset, storage bytes, where)."""
    return isinstance(leaf, tuple) and bool(leaf) and leaf[0] == "tensor"


def contiguous_strides(shape) -> list[int]:
    """Row-major strides as PyTorch computes them (a size-0 or size-1 dimension counts 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


def contiguous(shape, stride) -> bool:
    """Row-major dense, size-1 dimensions' strides aside."""
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def form(name: str, leaves: list) -> str:
    """An operator call without its shapes: its name and each argument's kind (a tensor's
    dtype, None, or a value): the key of the matrix products' patterns (gpu_calibration)."""
    kinds = []
    for leaf in leaves:
        if is_tensor_leaf(leaf):
            kinds.append(leaf[1])
        elif leaf is None:
            kinds.append("None")
        else:
            kinds.append("value")
    return f"{name}({', '.join(kinds)})"


def layout(shape, stride) -> str:
    """A tensor's layout without its sizes: the order of its dimensions by stride, and whether
    it is contiguous (a kernel may copy a non-contiguous input first)."""
    order = sorted(range(len(shape)), key=lambda i: (-stride[i], i))
    return f"{''.join(map(str, order))}{'c' if contiguous(shape, stride) else 'n'}"


def rule_key(name: str, leaves: list, integers: bool = True) -> str:
    """An operator call without its tensors' sizes: each device tensor by dtype and layout, a
    host tensor whole, a float as `float` (a scale, a probability, an epsilon), every other
    argument by value (a dimension, a flag), integers too unless `integers` is False (a
    formula's key: the attention backward kernels take the lengths again as integers)."""
    kinds = []
    for leaf in leaves:
        if is_tensor_leaf(leaf):
            _, dtype, shape, stride, offset, _nbytes, where = leaf
            if where == "device":
                kinds.append(f"{dtype}[{layout(shape, stride)}{'+' if offset else ''}]")
            else:
                kinds.append(repr(leaf))
        elif isinstance(leaf, float):
            kinds.append("float")
        elif not integers and isinstance(leaf, int) and not isinstance(leaf, bool):
            kinds.append("int")
        else:
            kinds.append(repr(leaf))
    return f"{name}({', '.join(kinds)})"


def sizes(leaves: list) -> list:
    """The sizes of the call's device tensors, in order."""
    return [list(leaf[2]) for leaf in leaves if is_tensor_leaf(leaf) and leaf[-1] == "device"]


def within(domain: list, leaves: list) -> bool:
    """Every device tensor's size, dimension by dimension, within the probed ones."""
    low, high = domain
    found = sizes(leaves)
    return len(found) == len(low) and all(
        len(s) == len(lo) and all(a <= x <= b for a, x, b in zip(lo, s, hi, strict=True))
        for s, lo, hi in zip(found, low, high, strict=True)
    )
