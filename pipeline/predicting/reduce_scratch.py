"""What PyTorch's CUDA reduction kernel takes from the caching allocator, without a GPU.

A TensorIterator reduction (sum, mean, amax, argmax, ...) on CUDA ends in `gpu_reduce_kernel`
(aten/src/ATen/native/cuda/Reduce.cuh). Besides the output, which the operator allocates
first, the kernel allocates a staging buffer (`ReduceConfig::global_memory_size`) and then
semaphores (`semaphore_size`) when `setReduceConfig` splits one output's inputs across
several thread blocks (`should_global_reduce`), and frees them after the launch in reverse
order (C++ destroys `semaphores` before `buffer`). Which case happens, and the sizes, follow
from the iterator's shape after `reorder_dimensions` and `coalesce_dimensions`
(aten/src/ATen/TensorIterator.cpp), the kernel's types and three device properties: this
module ports that arithmetic, for PyTorch 2.11.0. `Reduce.cuh`, `SharedReduceOps.h` and
`ReduceOpsUtils.h` were read from the 2.11.0 wheel (git 70d99e998b49); TensorIterator.cpp,
ReduceOps.cpp and the kernels' `.cu` files from recent stored copies of PyTorch's source, not
tagged 2.11.0. The one difference seen between copies (16-bit sums and means load 8 inputs at
once, or 4) cannot change the scratch (tests/test_reduce_scratch.py shows why), and the
port matches every H200 probe and random calls run on an H200 under torch 2.11.0+cu130.

An input that `make_reduction_from_out_ty` first casts to the result's dtype (an integer or
bool tensor summed as int64, a dtype asked for; `self.to(in_dtype)`) is a copy of it, made
after the output and freed when the operator returns, the kernel's scratch then sized by
the copy. Out of the port's domain (None, never a guess): iterators past 32-bit indexing
(`with_32bit_indexing` splits them and may take an accumulation buffer, `acc_buf`), empty
tensors, complex dtypes, and `argmax`/`argmin` over all dimensions of a tensor that
`reshape(-1)` must copy.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math

from pipeline.core.call_keys import contiguous_strides

# --- The device: the properties setReduceConfig reads (Reduce.cuh) -------------------------


@dataclasses.dataclass(frozen=True)
class Device:
    """`setReduceConfig` reads `getCurrentDeviceProperties()->multiProcessorCount` and
    `->maxThreadsPerMultiProcessor`, and `at::cuda::warp_size()` (`warpSize`) through
    `ReduceConfig::set_block_dimension`. The threads per block are not read from the device:
    `mnt_wrapper<T>::MAX_NUM_THREADS` is a constant 512 (256 for complex<double>), below
    maxThreadsPerBlock (1024)."""

    multiprocessors: int
    max_threads_per_multiprocessor: int
    warp_size: int


# NVIDIA H200 (compute capability 9.0): 132 SMs, 2048 threads per SM, warps of 32.
H200 = Device(multiprocessors=132, max_threads_per_multiprocessor=2048, warp_size=32)
# A calibration's GPU (its `gpu.name`) -> its properties
DEVICES = {"NVIDIA H200": H200}

MAX_NUM_THREADS = 512  # mnt_wrapper<T>::MAX_NUM_THREADS, every dtype covered here
MIN_VALUES_PER_THREAD = 16  # setReduceConfig, CUDA (128 under USE_ROCM)
MAX_VALUES_PER_THREAD = 256  # setReduceConfig
INT32_MAX = 2**31 - 1  # TensorIteratorBase::can_use_32bit_indexing
SIZEOF_INT = 4  # ReduceConfig::semaphore_size: sizeof(int) per block of the grid's x
# Every block the caching allocator hands out is a multiple of 512 bytes from an aligned
# segment: a tensor's data pointer is aligned but for its storage offset.
ALLOCATION_ALIGNMENT = 512

ELEMENT_SIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
LOW_PRECISION = ("float16", "bfloat16")
FLOATING = ("float64", "float32", "float16", "bfloat16")


# --- The kernel each operator launches --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One `gpu_reduce_kernel<scalar_t, out_t, vt0, input_vec_size>` instantiation:
    `scalar_t` the input's dtype, `arg_size` sizeof(arg_t) (the accumulator, the
    ReduceConfig's element_size_bytes), `out_dtype` the output's dtype."""

    scalar: str
    arg_size: int
    out_dtype: str
    input_vec_size: int = 4  # vt0 = 4 by default, input_vec_size = vt0


# operator -> (its family, the name of its dimension argument, None where it has none)
OPERATORS = {
    "aten.sum.dim_IntList": ("sum", "dim"),
    "aten.sum.default": ("sum", None),
    "aten.mean.dim": ("mean", "dim"),
    "aten.mean.default": ("mean", None),
    "aten.amax.default": ("amax", "dim"),
    "aten.amin.default": ("amax", "dim"),
    "aten.argmax.default": ("argmax", "dim"),
    "aten.argmin.default": ("argmax", "dim"),
}


def kernel_for(family: str, dtype: str, out_dtype: str | None) -> Kernel | None:
    """The kernel a call reaches, or None where the input is cast first (a copy).

    sum, mean: ReduceOps.cpp `sum_out`/`mean_out` build the iterator with
    `make_reduction_from_out_ty` (ReduceOpsUtils.h), which keeps a float16/bfloat16 input
    for a float32 output (`gpu_lowp_to_f32`) and otherwise casts the input to the output's
    dtype. `reduce_dispatch` (ReduceSumProdKernel.cu) and `mean_kernel_cuda`
    (ReduceMomentKernel.cu) accumulate float16/bfloat16 in float (`func_wrapper`'s and
    `MeanOps`' arg_t is acc_t), other dtypes in themselves; 16-bit inputs are launched with
    input_vec_size 8. amax/amin: ReduceMaxValuesKernel.cu/ReduceMinValuesKernel.cu,
    `func_wrapper<acc_t>` with acc_t = scalar_t, no cast (`make_reduction(..., self dtype)`).
    argmax/argmin: ReduceArgMaxKernel.cu, `ArgMaxOps<acc_t>` whose arg_t is
    `pair<acc_t, int64_t>` (SharedReduceOps.h), 16 bytes for every acc_t (8-byte aligned);
    the output is int64.
    """
    if dtype not in ELEMENT_SIZE:
        return None
    if family in ("sum", "mean"):
        integral = dtype not in FLOATING
        if family == "mean" and integral and out_dtype is None:
            return None  # mean of an integer tensor is an error
        out = out_dtype or ("int64" if integral else dtype)
        if out not in ELEMENT_SIZE or (family == "mean" and out not in FLOATING):
            return None
        if cast_to(family, dtype, out_dtype) is not None:
            return None  # make_reduction: self.to(in_dtype), an extra tensor (reduction_config)
        accumulates_in_float = dtype in LOW_PRECISION
        arg_size = 4 if accumulates_in_float else ELEMENT_SIZE[dtype]
        vec = 8 if ELEMENT_SIZE[dtype] == 2 else 4
        return Kernel(scalar=dtype, arg_size=arg_size, out_dtype=out, input_vec_size=vec)
    if family == "amax":
        if out_dtype not in (None, dtype):
            return None
        return Kernel(scalar=dtype, arg_size=ELEMENT_SIZE[dtype], out_dtype=dtype)
    if family == "argmax":
        if dtype == "bool" or out_dtype not in (None, "int64"):
            return None
        return Kernel(scalar=dtype, arg_size=16, out_dtype="int64")
    return None


def cast_to(family: str, dtype: str, out_dtype: str | None) -> str | None:
    """The dtype `make_reduction_from_out_ty` (ReduceOpsUtils.h) casts a sum's or mean's input
    to first, or None where it reduces the input itself: the result's dtype (int64 for an
    integer or bool input summed, or the dtype asked for), unless they agree or a float16 or
    bfloat16 input gives a float32 result on CUDA (`gpu_lowp_to_f32`)."""
    if family not in ("sum", "mean") or dtype not in ELEMENT_SIZE:
        return None
    out = out_dtype or ("int64" if dtype not in FLOATING else dtype)
    if out == dtype or (dtype in LOW_PRECISION and out == "float32"):
        return None
    return out


def non_overlapping_and_dense(shape, stride) -> bool:
    """TensorImpl's is_non_overlapping_and_dense: some order of the dimensions is contiguous
    (size-1 dimensions aside), so that `to(dtype)` keeps the strides."""
    expected = 1
    for size, step in sorted(
        ((size, step) for size, step in zip(shape, stride, strict=True) if size != 1),
        key=lambda pair: pair[1],
    ):
        if step != expected:
            return False
        expected *= size
    return True


# --- The iterator (TensorIterator.cpp) ----------------------------------------------------


@dataclasses.dataclass
class Iterator:
    """The reduction iterator after build: shape and per-operand strides in bytes, fastest
    dimension first (operand 0 the output, operand 1 the input)."""

    shape: list[int]
    strides: list[list[int]]  # [output, input]

    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def num_reduce_dims(self) -> int:
        """TensorIteratorBase::num_reduce_dims: dimensions where the output's stride is 0."""
        return sum(1 for s in self.strides[0] if s == 0)

    def num_output_elements(self) -> int:
        """TensorIteratorBase::num_output_elements."""
        return math.prod(
            size for size, s in zip(self.shape, self.strides[0], strict=True) if s != 0 or size == 0
        )

    def can_use_32bit_indexing(self) -> bool:
        """TensorIteratorBase::can_use_32bit_indexing."""
        if self.numel() > INT32_MAX:
            return False
        for strides in self.strides:
            offset = 1 + sum((size - 1) * s for size, s in zip(self.shape, strides, strict=True))
            if offset > INT32_MAX:
                return False
        return True


def reduction_iterator(
    shape, stride, in_size: int, out_size: int, mask: list[bool], keepdim: bool
) -> Iterator:
    """`TensorIterator::reduce_op(viewed_result, self)` as built: compute_strides, then
    reorder_dimensions, then coalesce_dimensions. The output is the contiguous result of
    `resize_reduction`, seen through `review_reduce_result` (ReduceOpsUtils.h: without
    keepdim, a size-1 dimension of stride 0 inserted at each reduced one)."""
    ndim = len(shape)
    if keepdim:
        out_shape = [1 if mask[d] else shape[d] for d in range(ndim)]
        out_stride = contiguous_strides(out_shape)
    else:
        kept = [shape[d] for d in range(ndim) if not mask[d]]
        kept_stride = iter(contiguous_strides(kept))
        out_shape = [1 if mask[d] else shape[d] for d in range(ndim)]
        out_stride = [0 if mask[d] else next(kept_stride) for d in range(ndim)]
    # compute_strides: a size-1 dimension broadcast against a larger one gets stride 0
    out_bytes = [
        0 if out_shape[d] == 1 and shape[d] != 1 else out_stride[d] * out_size for d in range(ndim)
    ]
    in_bytes = [stride[d] * in_size for d in range(ndim)]
    operands = [out_bytes, in_bytes]
    perm = reorder_dimensions(list(shape), operands)
    it = Iterator(
        shape=[shape[p] for p in perm],
        strides=[[strides[p] for p in perm] for strides in operands],
    )
    coalesce_dimensions(it)
    return it


def reorder_dimensions(shape: list[int], operands: list[list[int]]) -> list[int]:
    """TensorIteratorBase::reorder_dimensions: the permutation that puts the fastest moving
    dimension first and, for a reduction, the reduced dimensions (output stride 0) before
    the others; an insertion sort that stops at the first dimension known to come before."""
    ndim = len(shape)
    if ndim <= 1:
        return list(range(ndim))
    perm = list(range(ndim - 1, -1, -1))

    def should_swap(dim0: int, dim1: int) -> int:
        for arg, strides in enumerate(operands):
            stride0, stride1 = strides[dim0], strides[dim1]
            if arg == 0 and (stride0 == 0) != (stride1 == 0):  # is_reduction_, the output
                return 1 if stride1 == 0 else -1
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 < stride1:
                return -1
            if stride0 > stride1:
                return 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return perm


def coalesce_dimensions(it: Iterator) -> None:
    """TensorIteratorBase::coalesce_dimensions: merge neighbours that every operand walks as
    one (shape[n] * stride[n] == stride[n + 1]) and drop size-1 dimensions."""
    if it.ndim() <= 1:
        return
    shape, operands = it.shape, it.strides

    def can_coalesce(dim0: int, dim1: int) -> bool:
        if shape[dim0] == 1 or shape[dim1] == 1:
            return True
        return all(shape[dim0] * s[dim0] == s[dim1] for s in operands)

    def replace_stride(dim0: int, dim1: int) -> None:
        for s in operands:
            s[dim0] = s[dim1]

    prev = 0
    for dim in range(1, len(shape)):
        if can_coalesce(prev, dim):
            if shape[prev] == 1:
                replace_stride(prev, dim)
            shape[prev] *= shape[dim]
        else:
            prev += 1
            if prev != dim:
                replace_stride(prev, dim)
                shape[prev] = shape[dim]
    del shape[prev + 1 :]
    for s in operands:
        del s[prev + 1 :]


# --- The launch configuration (Reduce.cuh) ------------------------------------------------


def div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


def last_pow2(n: int) -> int:
    """Reduce.cuh last_pow2: the largest power of two not above n, at least 1."""
    return max(1, 1 << (n.bit_length() - 1)) if n > 0 else 1


@dataclasses.dataclass
class ReduceConfig:
    """Reduce.cuh ReduceConfig: the fields that decide the scratch."""

    element_size_bytes: int
    num_outputs: int
    num_inputs: int
    step_input: int = 1
    step_output: int = 1
    ctas_per_output: int = 1
    input_mult: list[int] = dataclasses.field(default_factory=lambda: [0, 0, 0])
    output_mult: list[int] = dataclasses.field(default_factory=lambda: [0, 0])
    block_width: int = 1
    block_height: int = 1
    num_threads: int = 1
    vectorize_input: bool = False
    output_vec_size: int = 1

    def set_block_dimension(self, dim0: int, dim1: int, warp_size: int) -> None:
        max_num_threads = MAX_NUM_THREADS // self.output_vec_size
        dim0_pow2 = last_pow2(dim0) if dim0 < max_num_threads else max_num_threads
        dim1_pow2 = last_pow2(dim1) if dim1 < max_num_threads else max_num_threads
        self.block_width = min(dim0_pow2, warp_size)
        self.block_height = min(dim1_pow2, max_num_threads // self.block_width)
        self.block_width = min(dim0_pow2, max_num_threads // self.block_height)
        self.num_threads = self.block_width * self.block_height

    def split_input(self, parallelism: int) -> int:
        step, self.step_input = self.step_input, self.step_input * parallelism
        return step

    def split_output(self, parallelism: int) -> int:
        step, self.step_output = self.step_output, self.step_output * parallelism
        return step

    def grid_x(self) -> int:
        return div_up(self.num_outputs // self.output_vec_size, self.step_output)

    def values_per_thread(self) -> int:
        return div_up(self.num_inputs, self.step_input)

    def should_block_x_reduce(self) -> bool:
        return self.input_mult[0] != 0

    def should_global_reduce(self) -> bool:
        return self.input_mult[2] != 0

    def global_memory_size(self) -> int:
        if not self.should_global_reduce():
            return 0
        size = self.element_size_bytes * self.num_outputs * self.ctas_per_output
        if not self.should_block_x_reduce():
            size *= self.block_width * self.output_vec_size
        return size

    def semaphore_size(self) -> int:
        if not self.should_global_reduce():
            return 0
        return SIZEOF_INT * self.grid_x()


def output_vec_size(it: Iterator, scalar_size: int, offset: int) -> int:
    """Reduce.cuh get_output_vec_size<scalar_t>: 4, halved until it divides the input's
    address in elements (its storage offset, the block being aligned), the output dimension's
    size and the input's other strides in elements."""
    vec = 4

    def update(n: int) -> None:
        nonlocal vec
        while n % vec != 0:
            vec //= 2

    update(offset)
    output_index = it.num_reduce_dims()
    update(it.shape[output_index])
    for j, stride in enumerate(it.strides[1]):
        if j != output_index:
            update(stride // scalar_size)
    return vec


def set_reduce_config(
    it: Iterator, kernel: Kernel, offset: int = 0, device: Device = H200
) -> ReduceConfig:
    """Reduce.cuh setReduceConfig<arg_t, scalar_t, vt0, input_vec_size>, line for line."""
    scalar_size = ELEMENT_SIZE[kernel.scalar]
    num_outputs = it.num_output_elements()
    inputs_per_output = it.numel() // num_outputs
    config = ReduceConfig(kernel.arg_size, num_outputs, inputs_per_output)
    in_strides = it.strides[1]
    if it.ndim() > 0:
        reduce_dims = it.num_reduce_dims()
        on_fastest = reduce_dims == it.ndim() or in_strides[0] < in_strides[reduce_dims]
        if on_fastest:
            dim0, dim1 = inputs_per_output, num_outputs
            fastest_moving_stride = in_strides[0]
        else:
            dim0, dim1 = num_outputs, inputs_per_output
            fastest_moving_stride = in_strides[reduce_dims]
    else:
        on_fastest, fastest_moving_stride, dim0, dim1 = True, scalar_size, 1, 1

    if fastest_moving_stride == scalar_size:
        if on_fastest and dim0 >= 128 and it.num_reduce_dims() == 1:
            config.vectorize_input = True  # case 1, "vectorize along input"
            dim0 //= kernel.input_vec_size
        elif not on_fastest:
            config.output_vec_size = output_vec_size(it, scalar_size, offset)  # case 2
            dim0 //= config.output_vec_size

    config.set_block_dimension(dim0, dim1, device.warp_size)
    block_width, block_height = config.block_width, config.block_height
    if it.ndim() == 0 or on_fastest:
        config.input_mult[0] = config.split_input(block_width)  # lanes share one output
    else:
        config.output_mult[0] = config.split_output(block_width)

    warp_split_threshold = min(block_height * 16, MAX_VALUES_PER_THREAD)
    if config.values_per_thread() >= warp_split_threshold:
        config.input_mult[1] = config.split_input(block_height)  # warps share one output
    else:
        config.output_mult[1] = config.split_output(block_height)

    blocks_per_sm = device.max_threads_per_multiprocessor // config.num_threads
    target_grid_size = device.multiprocessors * blocks_per_sm
    grid = config.grid_x()
    if (
        config.input_mult[1] != 0
        and config.values_per_thread() >= MAX_VALUES_PER_THREAD
        and grid <= target_grid_size
    ):
        # blocks share one output: the global reduction, with its buffer and semaphores
        ctas_per_output1 = div_up(target_grid_size, grid)
        ctas_per_output2 = div_up(config.values_per_thread(), MIN_VALUES_PER_THREAD)
        ctas_per_output3 = div_up(config.values_per_thread(), MAX_VALUES_PER_THREAD)
        config.ctas_per_output = max(min(ctas_per_output1, ctas_per_output2), ctas_per_output3)
        if config.ctas_per_output > 1:
            config.input_mult[2] = config.split_input(config.ctas_per_output)
    return config


# --- The operator call ---------------------------------------------------------------------


def _reduced_mask(ndim: int, dims) -> list[bool] | None:
    """ReduceOpsUtils.h make_dim_mask: None or [] reduce every dimension; None for a
    repeated or out-of-range dimension (an error in PyTorch)."""
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return [True] * ndim
    dims = [dims] if isinstance(dims, int) else list(dims)
    rank = max(ndim, 1)
    if any(not isinstance(d, int) or isinstance(d, bool) or not -rank <= d < rank for d in dims):
        return None
    wrapped = [d % rank for d in dims]
    if len(set(wrapped)) != len(wrapped):
        return None
    mask = [False] * ndim
    for d in wrapped:
        if d < ndim:
            mask[d] = True
    return mask


def _view_as_flat(shape, stride) -> tuple[tuple[int], tuple[int]] | None:
    """`self.reshape({-1})` as a view (its shape and stride), or None where it copies."""
    dims = [(size, step) for size, step in zip(shape, stride, strict=True) if size != 1]
    for (_, outer), (inner_size, inner) in itertools.pairwise(dims):
        if outer != inner * inner_size:
            return None
    return (math.prod(shape),), (dims[-1][1] if dims else 1,)


def reduction_config(
    op: str,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: str,
    dims: list[int] | int | None = None,
    keepdim: bool = False,
    out_dtype: str | None = None,
    offset: int = 0,
    device: Device = H200,
) -> tuple[ReduceConfig | None, int] | None:
    """The launch configuration of a covered call and its output's bytes; the configuration
    None where the kernel is not launched (argmax over a size-1 dimension fills its output);
    None for a call outside the port."""
    if op not in OPERATORS or len(shape) != len(stride):
        return None
    family = OPERATORS[op][0]
    cast = cast_to(family, dtype, out_dtype)
    if cast is not None:  # the kernel reduces the copy: fresh, its strides kept where dense
        if not non_overlapping_and_dense(shape, stride):
            stride = tuple(contiguous_strides(shape))
        dtype, offset = cast, 0
    kernel = kernel_for(family, dtype, out_dtype)
    if kernel is None or math.prod(shape) == 0 or any(s < 0 for s in stride):
        return None
    ndim = len(shape)
    mask = _reduced_mask(ndim, dims)
    if mask is None:
        return None
    out_numel = math.prod(size for size, reduced in zip(shape, mask, strict=True) if not reduced)
    out_bytes = out_numel * ELEMENT_SIZE[kernel.out_dtype]
    if family == "argmax":
        # ReduceOps.cpp argmax_argmin_impl
        if dims is not None and not isinstance(dims, int):
            return None  # its dim is one int or None
        if dims is not None:
            if ndim and shape[dims % ndim] == 1:
                return None, out_bytes  # result.fill_(0): no kernel
        else:
            flat = _view_as_flat(shape, stride)
            if flat is None:
                return None  # reshape copies the input first
            shape, stride, mask, keepdim = flat[0], flat[1], [True], False
    it = reduction_iterator(
        shape, stride, ELEMENT_SIZE[kernel.scalar], ELEMENT_SIZE[kernel.out_dtype], mask, keepdim
    )
    if not it.can_use_32bit_indexing():
        return None  # gpu_reduce_kernel splits the iterator (acc_buf): not ported
    return set_reduce_config(it, kernel, offset, device), out_bytes


def reduction_template(*call, **options) -> list[dict] | None:
    """The allocator template of one reduction call on `device`, in the calibration's format:
    the output, then the input's copy where it is cast first (`cast_to`), then (when the
    kernel reduces across blocks) the staging buffer and the semaphores, freed semaphores
    first, the copy last; None outside what the port covers.

    The arguments are reduction_config's: `shape`, `stride` and `offset` (elements) describe
    the input; `dims` the dimension argument as passed (None or [] for all of them);
    `out_dtype` the call's dtype argument."""
    found = reduction_config(*call, **options)
    if found is None:
        return None
    config, out_bytes = found
    template = [{"kind": "output", "index": 0, "bytes": out_bytes}]
    given = inspect.signature(reduction_config).bind(*call, **options)
    given.apply_defaults()
    argument = given.arguments
    cast = cast_to(OPERATORS[argument["op"]][0], argument["dtype"], argument["out_dtype"])
    if cast is not None:
        copy = math.prod(argument["shape"]) * ELEMENT_SIZE[cast]
        template.append({"kind": "internal", "id": 2, "bytes": copy})
    if config is not None and config.should_global_reduce():
        template += [
            {"kind": "internal", "id": 0, "bytes": config.global_memory_size()},
            {"kind": "internal", "id": 1, "bytes": config.semaphore_size()},
            {"kind": "free", "id": 1},
            {"kind": "free", "id": 0},
        ]
    if cast is not None:
        template.append({"kind": "free", "id": 2})
    return template


def template_of_call(name: str, arguments: dict, device: Device = H200) -> list[dict] | None:
    """`reduction_template` for a traced call: `name` the operator (signature.name) and
    `arguments` its arguments by name as `trace.operators.call_arguments` gives them (a
    tensor as ("tensor", dtype, shape, stride, offset, nbytes, where), a dtype as
    ("dtype", name)). None for another operator, or a tensor not on the traced device."""
    if name not in OPERATORS:
        return None
    x = arguments.get("self")
    if not (isinstance(x, tuple) and len(x) == 7 and x[0] == "tensor") or x[6] != "device":
        return None
    _, dtype, shape, stride, offset, _nbytes, _where = x
    dim_name = OPERATORS[name][1]
    dims = arguments.get(dim_name) if dim_name else None
    requested = arguments.get("dtype")
    if requested is not None and not (isinstance(requested, tuple) and requested[0] == "dtype"):
        return None
    out_dtype = requested[1] if requested else None
    keepdim = bool(arguments.get("keepdim", False))
    return reduction_template(
        name, tuple(shape), tuple(stride), dtype, dims, keepdim, out_dtype, offset, device
    )
