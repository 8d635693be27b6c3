"""Matrix products' operands as PyTorch hands them to cuBLAS, for the products' patterns.

A matrix product's pattern (gpu_calibration) holds its output and cuBLAS's and cuBLASLt's
workspaces only, which holds where cuBLAS can read each operand where it lies. Where it
cannot, PyTorch copies the operand first: `cublasCommonArgs` (aten/src/ATen/native/cuda/
Blas.cpp) passes each matrix of `mm` and `addmm` through `prepare_matrix_for_cublas`, which
keeps a matrix that is dense in some order of its dimensions, or whose one dimension has
stride 1 and the other a stride at least the first's size, and otherwise makes a contiguous
copy (`clone`), kept until the product returns. The result is fresh and contiguous, so cuBLAS
computes its transpose: `mat2` is prepared first, then `mat1`. The commonest such operand
is a gradient broadcast from a sum (`out.sum().backward()`: strides 0), which an H100's
allocator history showed copied inside `mm`'s backward calls.

`bmm` and `baddbmm` prepare each batch of matrices alike (`prepare_batch_matrix_for_cublas`,
`baddbmm_out_cuda_impl`): batch2 first, a batch kept where its last two dimensions are row-
or column-major or it is contiguous, cloned otherwise (an `einsum`'s backward of a sum).
For the other products (linear, matmul, mv...) the pattern is kept only where no operand
could need a copy (`plain`, `folds_as_a_view`), and otherwise the call is not covered.

Standard library only.
"""

from __future__ import annotations

import itertools
import math

from pipeline.core import call_keys
from pipeline.predicting import reduce_scratch

# The matrices `cublasCommonArgs` prepares, by argument name, mat1 first
MATRICES = {"aten.mm.default": ("self", "mat2"), "aten.addmm.default": ("mat1", "mat2")}
# The batches of matrices `baddbmm_out_cuda_impl` prepares, batch1 first
BATCHES = {"aten.bmm.default": ("self", "mat2"), "aten.baddbmm.default": ("batch1", "batch2")}
# Products whose input a kernel may fold or reshape: their first argument must be contiguous
FOLDED = ("aten.linear.default", "aten.matmul.default")
# The products' tensor arguments in their schemas' order
POSITIONS = {
    "aten.mm.default": ("self", "mat2"),
    "aten.addmm.default": ("self", "mat1", "mat2"),
    "aten.bmm.default": ("self", "mat2"),
    "aten.baddbmm.default": ("self", "batch1", "batch2"),
    "aten.addbmm.default": ("self", "batch1", "batch2"),
    "aten.linear.default": ("input", "weight", "bias"),
    "aten.matmul.default": ("self", "other"),
    "aten.mv.default": ("self", "vec"),
    "aten.addmv.default": ("self", "mat", "vec"),
}


def dense(shape, stride) -> bool:
    """is_non_overlapping_and_dense: some order of the dimensions is contiguous."""
    return reduce_scratch.non_overlapping_and_dense(shape, stride)


def readable(shape, stride) -> bool:
    """prepare_matrix_for_cublas keeps the matrix: dense, or one dimension of stride 1 with
    the other's stride at least that dimension's size."""
    rows, columns = shape
    return (
        dense(shape, stride)
        or (stride[0] == 1 and stride[1] >= max(1, rows))
        or (stride[1] == 1 and stride[0] >= max(1, columns))
    )


def plain(shape, stride) -> bool:
    """An operand no product copies: a vector of stride 1; a matrix, or a batch of them (the
    batch's stride is cuBLAS's to take, 0 included: `prepare_batch_matrix_for_cublas` reads
    the last two), whose last two dimensions are row- or column-major."""
    if len(shape) == 1:
        return stride[0] == 1 or shape[0] == 1
    rows, columns = shape[-2:]
    return (stride[-1] == 1 and stride[-2] >= max(1, columns)) or (
        stride[-2] == 1 and stride[-1] >= max(1, rows)
    )


def copies(name: str, arguments: dict) -> list[int] | None:
    """The bytes of each operand copy the product makes before cuBLAS runs, in the order it
    makes them ([] for none); None where that is not known (the pattern does not cover it)."""
    tensors = {
        key: leaf
        for key, leaf in arguments.items()
        if call_keys.is_tensor_leaf(leaf) and leaf[-1] == "device"
    }
    if any(math.prod(leaf[2]) == 0 for leaf in tensors.values()):
        return None  # an empty product: other paths
    if name in MATRICES:
        first, second = (tensors.get(key) for key in MATRICES[name])
        if first is None or second is None:
            return None
        made = []
        for _, dtype, shape, stride, *_ in (second, first):  # the result's transpose: mat2 first
            if not readable(shape, stride):
                made.append(math.prod(shape) * reduce_scratch.ELEMENT_SIZE[dtype])
        return made
    if name in BATCHES:
        return batch_copies(*(tensors.get(key) for key in BATCHES[name]))
    for key, (_, _, shape, stride, *_) in tensors.items():
        if key in ("self", "input") and name in FOLDED:
            if not (call_keys.contiguous(shape, stride) or folds_as_a_view(shape, stride)):
                return None
        elif not plain(shape, stride):
            return None
    return []


def batch_copies(batch1, batch2) -> list[int] | None:
    """`baddbmm_out_cuda_impl`'s copies: the result is fresh and contiguous, so cuBLAS
    computes its transpose and `prepare_batch_matrix_for_cublas` takes batch2, then batch1;
    a batch is kept where its last two dimensions are row- or column-major (the other
    stride at least the size it spans), or it is contiguous with non-zero strides, and is
    otherwise cloned. A result of one row or one column takes the other layout: not
    spoken for."""
    if batch1 is None or batch2 is None or len(batch1[2]) != 3 or len(batch2[2]) != 3:
        return None
    if batch1[2][1] == 1 or batch2[2][2] == 1:
        return None
    made = []
    for _, dtype, shape, stride, *_ in (batch2, batch1):
        kept = plain(shape, stride) or (
            call_keys.contiguous(shape, stride) and stride[1] != 0 and stride[2] != 0
        )
        if not kept:
            made.append(math.prod(shape) * reduce_scratch.ELEMENT_SIZE[dtype])
    return made


def folds_as_a_view(shape, stride) -> bool:
    """A product's input that `_matmul_impl` folds into one matrix by a view (its leading
    dimensions, size-1 ones aside, each stepping by the next one's extent; should_fold then
    folds whatever the weight), and cuBLAS reads where it lies: no copy. A generated
    sequence's last position (`hidden[:, -1:]`) is such an input."""
    if len(shape) < 2:
        return False
    lead = [(size, step) for size, step in zip(shape[:-1], stride[:-1], strict=True) if size != 1]
    if any(outer != inner * size for (_, outer), (size, inner) in itertools.pairwise(lead)):
        return False
    rows = math.prod(shape[:-1])
    row_stride = lead[-1][1] if lead else max(1, shape[-1])
    return readable((rows, shape[-1]), (row_stride, stride[-1]))


def with_copies(template: list, made: list[int]) -> list:
    """A product's pattern with its operand copies: made after the output, before the
    workspaces a first product allocates, freed when it returns."""
    if not made:
        return template
    outputs = [step for step in template if step[0] == "output"]
    rest = [step for step in template if step[0] != "output"]
    internal = [("internal", 100 + i, nbytes) for i, nbytes in enumerate(made)]
    frees = [("free", 100 + i) for i in reversed(range(len(made)))]
    return [*outputs, *internal, *rest, *frees]
