"""Which attention kernel `F.scaled_dot_product_attention` takes on an NVIDIA GPU, without one.

On the meta device (a trace without a GPU) PyTorch always takes the math kernel, which holds
the full attention matrix; on a GPU it picks flash, memory-efficient or cuDNN attention, whose
memory is a fraction of that. `choose` is a port of that choice, so that the trace can call
the kernel the GPU would call.

It follows PyTorch 2.11.0 (git 70d99e998b4955e0049d13a98d77ae1b14db1f45, the cu130 build):
`select_sdp_backend` and the `can_use_*_attention` checks of
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, the shared checks of
aten/src/ATen/native/transformers/sdp_utils_cpp.h (read from the 2.11.0 wheel's headers), and
`at::native::scaled_dot_product_attention` of aten/src/ATen/native/transformers/attention.cpp
for what each kernel is called with. The .cpp text read is a later revision; the checks it
has and 2.11.0 does not (their warnings are absent from 2.11.0's libtorch_cuda.so) are left
out: cuDNN's batch/head limit of 65535, its head-dim rules for backward on sm90/sm10x, its
dropout resolution of 1/16, memory-efficient attention's storage-offset alignment and its
grouped-query support (2.11.0's header has `check_batch_size_and_num_heads_dense` without the
MQA flag). Where the 2.11.0 text could not be read line by line (cuDNN's head-dim limit), the
table that `.dev/sdpa/choice_table.py` records on the GPU is the judge
(tests/test_attention_choice.py).

Standard library only: torch is passed in where a function needs it.
"""

from __future__ import annotations

import dataclasses
import itertools

from pipeline.core import call_keys

FLASH, EFFICIENT, CUDNN, MATH = "flash", "efficient", "cudnn", "math"
BACKENDS = (FLASH, EFFICIENT, CUDNN, MATH)
HALF = ("float16", "bfloat16")
# cuDNN each PyTorch wheel for CUDA pins (nvidia-cudnn-cu13==9.19.0.56 for 2.11.0), as
# cudnnGetVersion() reports it: major * 10000 + minor * 100 + patch.
CUDNN_OF_TORCH = {"2.11": 91900}
FOLLOWED = "2.11"


class Undecided(Exception):
    """The rule does not know what the GPU would take: the trace falls back to math and says so."""


@dataclasses.dataclass(frozen=True)
class TargetGpu:
    """The GPU a prediction is for: its name, compute capability (major, minor), the PyTorch
    it runs (torch.__version__), that PyTorch's CUDA and its cuDNN (None: the wheel's)."""

    name: str
    capability: tuple | None
    torch_version: str
    cuda: str = "13.0"
    cudnn_version: int | None = None

    def cudnn(self) -> int | None:
        if self.cudnn_version is not None:
            return self.cudnn_version
        return CUDNN_OF_TORCH.get(minor_version(self.torch_version))


H200 = TargetGpu("NVIDIA H200", (9, 0), "2.11.0+cu130")


def this_gpu(torch, index: int = 0) -> TargetGpu | None:
    """The GPU this process runs on, as a target: the trace made beside a measurement takes
    the kernels the estimate without a GPU takes, so that its calls are the same ones."""
    if not torch.cuda.is_available():
        return None
    return TargetGpu(
        torch.cuda.get_device_name(index),
        tuple(torch.cuda.get_device_capability(index)),
        torch.__version__,
        torch.version.cuda,
        torch.backends.cudnn.version(),
    )


def minor_version(version: str) -> str:
    """'2.11.0+cu130' -> '2.11'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def contiguous(shape) -> tuple:
    return tuple(call_keys.contiguous_strides(shape))


@dataclasses.dataclass(frozen=True)
class SdpaCall:
    """What the choice reads of one call: shapes, strides (None: contiguous), dtypes, flags.
    needs_grad: an input requires grad and grad mode is on (`input_requires_grad`)."""

    dtype: str
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    q_stride: tuple | None = None
    k_stride: tuple | None = None
    v_stride: tuple | None = None
    mask_dtype: str | None = None
    mask_shape: tuple | None = None
    mask_stride: tuple | None = None
    mask_requires_grad: bool = False
    is_causal: bool = False
    dropout_p: float = 0.0
    enable_gqa: bool = False
    needs_grad: bool = False
    nested: bool = False

    def stride(self, which: str) -> tuple:
        given = getattr(self, f"{which}_stride")
        return tuple(given) if given is not None else contiguous(getattr(self, f"{which}_shape"))

    @classmethod
    def from_dict(cls, row: dict) -> SdpaCall:
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in row.items() if k in names}
        )


@dataclasses.dataclass(frozen=True)
class Switches:
    """The global context the choice reads: `torch.backends.cuda.*_sdp_enabled()` (changed by
    `sdpa_kernel`), deterministic algorithms, and FA3 (off unless activated)."""

    flash: bool = True
    efficient: bool = True
    math: bool = True
    cudnn: bool = True
    deterministic: bool = False
    warn_only: bool = False
    fa3: bool = False


def in_range(cap, low, high) -> bool:
    return tuple(low) <= tuple(cap) <= tuple(high)


def priority_order(gpu: TargetGpu, cudnn: int) -> tuple:
    """`priority_order`: Context's default (flash, efficient, math, cudnn), replaced once by
    (cudnn, flash, efficient, math) when `check_prefer_cudnn_attention` holds: cuDNN above
    9.15 on sm9x/sm10x (before CUDA 13, minor 0 or 3 only)."""
    major, minor = gpu.capability
    cuda13 = tuple(int(x) for x in gpu.cuda.split(".")[:1]) >= (13,)
    prefer = cudnn > 91500 and major in (9, 10) and (cuda13 or minor in (0, 3))
    return (CUDNN, FLASH, EFFICIENT, MATH) if prefer else (FLASH, EFFICIENT, MATH, CUDNN)


# ------------------------------------------------------------------ shared checks (sdp_utils_cpp.h)


def check_tensor_shapes(c: SdpaCall):
    if not (len(c.q_shape) == len(c.k_shape) == len(c.v_shape) == 4):
        return "query, key and value are not all 4-dimensional"


def check_attn_mask_shape(c: SdpaCall):
    if c.mask_shape is None:
        return None
    m = c.mask_shape
    if c.mask_requires_grad:
        return "the mask requires grad"
    batch, heads, q_len, kv_len = c.q_shape[0], c.q_shape[1], c.q_shape[2], c.k_shape[2]
    if m[-2] not in (q_len, 1) or m[-1] not in (kv_len, 1):
        return f"mask shape {m} does not broadcast to (L, S)"
    if len(m) == 2 or (len(m) == 4 and m[0] in (1, batch) and m[1] in (1, heads)):
        return None
    return f"mask shape {m} is neither 2-d nor a broadcastable 4-d"


def check_for_attn_mask(c: SdpaCall):
    if c.mask_shape is not None:
        return "an attn_mask is given"


def check_nonzero_sequence_lengths_dense(c: SdpaCall):
    if c.q_shape[-2] == 0 or c.k_shape[-2] == 0:
        return "a sequence length is 0"


def check_last_dim_stride_equals_1_dense(c: SdpaCall, ignore_singleton_dim: bool):
    ok = all(c.stride(x)[-1] == 1 for x in "qkv")
    if ignore_singleton_dim:
        ok = ok or c.q_shape[-1] == 1
    if c.mask_shape is not None and c.stride("mask")[-1] != 1:
        ok = False
    if not ok:
        return "the last dimension of an input (or of the mask) has a stride other than 1"


def check_batch_size_and_num_heads_dense(
    c: SdpaCall, supports_gqa: bool, requires_same_num_heads: bool = True
):
    if not c.q_shape[0] == c.k_shape[0] == c.v_shape[0]:
        return "query, key and value batch sizes differ"
    qh, kh, vh = c.q_shape[-3], c.k_shape[-3], c.v_shape[-3]
    if c.enable_gqa and supports_gqa:  # check_grouped_query_attention
        if requires_same_num_heads and kh != vh:
            return "key and value head counts differ"
        if qh % kh != 0 or (not requires_same_num_heads and qh % vh != 0):
            return "key/value heads do not divide query heads"
        return None
    if not qh == kh == vh:
        return "query, key and value head counts differ (without GQA support)"


def check_tensor_dtype(c: SdpaCall, allowed) -> str | None:
    if c.dtype not in allowed:
        return f"{c.dtype} is not one of {', '.join(allowed)}"


def input_requires_grad(c: SdpaCall) -> bool:
    return c.needs_grad


# ------------------------------------------------------------------ cuDNN (sdp_utils.cpp)


def check_cudnn_tensor_shapes(c: SdpaCall, gpu: TargetGpu, cudnn: int):
    s_q, s_k, d_qk, d_v = c.q_shape[2], c.k_shape[2], c.q_shape[3], c.v_shape[3]
    if cudnn < 8903:
        return "cuDNN older than 8.9.3"
    if cudnn < 8906 and c.dropout_p != 0.0:
        return "dropout before cuDNN 8.9.6"
    limit = 128
    if cudnn >= 91000 and tuple(gpu.capability) == (9, 0):  # Hopper: up to 256 from 9.10
        limit = 256
    if cudnn >= 91100 and gpu.capability[0] == 10 and d_qk == 192 and d_v == 128:
        limit = 192
    if d_qk > limit or d_v > limit:
        return f"head_dim above {limit}"
    if d_qk % 8 or d_v % 8:
        return "head_dim not a multiple of 8"
    if cudnn < 8906 and s_k % 64:
        return "seq_kv not a multiple of 64 before cuDNN 8.9.6"
    if cudnn < 90000:
        if s_q < 64:
            return "s_q below 64 before cuDNN 9"
        if c.dropout_p != 0.0 and (s_q % 64 or s_k % 64):
            return "dropout with s_q or s_k not a multiple of 64 before cuDNN 9"
    if s_k == 1:
        return "key/value sequence length 1"
    if s_q == 1 and c.dropout_p != 0.0:
        return "query sequence length 1 with dropout"


def first_reason(reasons):
    """The first reason that is not None, in order: a backend's constraints in sdp_utils.cpp
    run one after the other, and the first that fails says why the backend is not taken."""
    return next((why for why in reasons if why), None)


def can_use_cudnn(c: SdpaCall, gpu: TargetGpu, cudnn: int, on: Switches):
    if c.dropout_p > 0.0 and 91100 < cudnn < 91400:
        return "cuDNN 9.11 to 9.13 have no dropout in SDPA"
    if not on.cudnn:
        return "cuDNN attention disabled"
    if c.nested:
        return "nested inputs (experimental in cuDNN, off)"
    checks = (  # in sdp_utils.cpp's order: each runs only if those before it passed
        lambda: check_tensor_shapes(c),
        lambda: "not deterministic" if on.deterministic and not on.warn_only else None,
        lambda: check_tensor_dtype(c, HALF if gpu.capability[0] >= 8 else ("float16",)),
        lambda: check_attn_mask_shape(c),
        lambda: None if in_range(gpu.capability, (8, 0), (12, 1)) else "outside sm80..sm121",
        lambda: check_nonzero_sequence_lengths_dense(c),
        lambda: check_last_dim_stride_equals_1_dense(c, ignore_singleton_dim=True),
        lambda: check_batch_size_and_num_heads_dense(c, True, requires_same_num_heads=False),
        lambda: check_cudnn_tensor_shapes(c, gpu, cudnn),
    )
    return first_reason(check() for check in checks)


# ------------------------------------------------------------------ flash


def can_use_flash(c: SdpaCall, gpu: TargetGpu, on: Switches):
    if not on.flash:
        return "flash attention disabled"
    if (why := check_tensor_shapes(c) or check_for_attn_mask(c)) is not None:
        return why
    d_q, d_k, d_v = c.q_shape[-1], c.k_shape[-1], c.v_shape[-1]
    if not (d_q == d_k == d_v and d_q <= 256):
        return "head dims differ or exceed 256"
    if not in_range(gpu.capability, (8, 0), (12, 1)):
        return "outside sm80..sm121"
    sm86_89 = in_range(gpu.capability, (8, 6), (8, 9))
    sm120 = in_range(gpu.capability, (12, 0), (12, 1))
    hard = 192 < d_q <= 224 or (d_q > 224 and c.dropout_p > 0.0)
    if input_requires_grad(c) and (sm86_89 or sm120) and hard:
        return "training with head_dim in (192, 224], or above 224 with dropout, here"
    if c.is_causal and not c.nested and c.q_shape[-2] != c.k_shape[-2]:
        return "is_causal with seqlen_q != seqlen_k"
    fa3 = gpu.capability[0] >= 9 and on.fa3
    allowed = ("float8_e4m3fn", *HALF) if fa3 else HALF if gpu.capability[0] >= 8 else ("float16",)
    if (why := check_tensor_dtype(c, allowed)) is not None:
        return why
    return first_reason(
        (
            check_batch_size_and_num_heads_dense(c, True),
            check_nonzero_sequence_lengths_dense(c),
            check_last_dim_stride_equals_1_dense(c, ignore_singleton_dim=True),
        )
    )


# ------------------------------------------------------------------ memory-efficient


def can_use_efficient(c: SdpaCall, gpu: TargetGpu, on: Switches):
    if not on.efficient:
        return "memory-efficient attention disabled"
    if not in_range(gpu.capability, (5, 0), (12, 1)):
        return "outside sm50..sm121"
    if (why := check_tensor_shapes(c)) is not None:
        return why
    # check_head_dim_size_mem_efficient: minimum_gemm_alignment (tensor cores from sm80; from
    # sm70 for half types): 128 bits of the type, at least 4 from sm80
    half = c.dtype in HALF
    major = gpu.capability[0]
    tensor_cores = major >= 8 or (major >= 7 and half)
    alignment = 4 if major >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    d_q, d_k, d_v = c.q_shape[-1], c.k_shape[-1], c.v_shape[-1]
    if not (d_q == d_k and d_q % alignment == 0 and d_q > 0 and d_v % alignment == 0 and d_v > 0):
        return f"head dims not multiples of {alignment}"
    if c.nested:
        return "nested inputs"
    why = first_reason(
        (
            check_nonzero_sequence_lengths_dense(c),
            check_last_dim_stride_equals_1_dense(c, ignore_singleton_dim=False),
            check_batch_size_and_num_heads_dense(c, False),
        )
    )
    if why:
        return why
    allowed = ("float16", "float32", "bfloat16") if major >= 8 else ("float16", "float32")
    return check_tensor_dtype(c, allowed)


# ------------------------------------------------------------------ the choice


def choose(gpu: TargetGpu, call: SdpaCall, switches: Switches | None = None) -> tuple:
    """(backend, why): the kernel `select_sdp_backend` takes for this call on `gpu`, among
    "flash", "efficient", "cudnn", "math". Raises Undecided where the rule does not know."""
    on = switches or Switches()
    if gpu.capability is None:
        raise Undecided(f"{gpu.name}: compute capability unknown")
    if minor_version(gpu.torch_version) != FOLLOWED:
        raise Undecided(f"PyTorch {gpu.torch_version}: the rule follows {FOLLOWED} only")
    cudnn = gpu.cudnn()
    if cudnn is None:
        raise Undecided(f"PyTorch {gpu.torch_version}: its cuDNN version is unknown")
    if call.nested:
        raise Undecided("nested tensors: the rule does not follow their checks")
    if call.mask_shape is not None and len(call.mask_shape) < 2:
        raise Undecided("a mask of fewer than 2 dimensions")
    if not (on.math or on.flash or on.efficient or on.cudnn):
        raise Undecided("every SDPA backend is disabled: PyTorch raises")
    order = priority_order(gpu, cudnn)
    refused = []
    for backend in order:
        if backend == MATH:
            if on.math:
                tried = "; ".join(refused) or "first in order"
                return MATH, f"math on {gpu.name}: {tried}"
            refused.append("math disabled")
            continue
        why = {
            CUDNN: lambda: can_use_cudnn(call, gpu, cudnn, on),
            FLASH: lambda: can_use_flash(call, gpu, on),
            EFFICIENT: lambda: can_use_efficient(call, gpu, on),
        }[backend]()
        if not why:
            before = f" ({'; '.join(refused)})" if refused else ""
            return backend, f"{backend} on {gpu.name}, order {'>'.join(order)}{before}"
        refused.append(f"not {backend}: {why}")
    raise Undecided("no kernel can run it (math disabled): PyTorch raises")


def call_of(torch, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
            enable_gqa=False) -> SdpaCall:  # fmt: skip
    """The SdpaCall of real (or fake) tensors."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    mask = attn_mask if isinstance(attn_mask, torch.Tensor) else None
    return SdpaCall(
        dtype=str(query.dtype).removeprefix("torch."),
        q_shape=tuple(query.shape),
        k_shape=tuple(key.shape),
        v_shape=tuple(value.shape),
        q_stride=tuple(query.stride()),
        k_stride=tuple(key.stride()),
        v_stride=tuple(value.stride()),
        mask_dtype=None if mask is None else str(mask.dtype).removeprefix("torch."),
        mask_shape=None if mask is None else tuple(mask.shape),
        mask_stride=None if mask is None else tuple(mask.stride()),
        mask_requires_grad=bool(mask is not None and mask.requires_grad),
        is_causal=bool(is_causal),
        dropout_p=float(dropout_p),
        enable_gqa=bool(enable_gqa),
        needs_grad=needs_grad,
        nested=any(t.is_nested for t in (query, key, value)),
    )


def switches_of(torch) -> Switches:
    """The switches as this process has them (`sdpa_kernel` sets them on a CPU build too)."""
    cuda = torch.backends.cuda
    return Switches(
        flash=cuda.flash_sdp_enabled(),
        efficient=cuda.mem_efficient_sdp_enabled(),
        math=cuda.math_sdp_enabled(),
        cudnn=cuda.cudnn_sdp_enabled(),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
    )


# ------------------------------------------------------------------ the cases a GPU table holds


def choice_cases() -> list:
    """Every case the GPU table records, as SdpaCall fields plus "layout" and "grad" (how the
    GPU script makes the tensors): the test and `.dev/sdpa/choice_table.py` read this list."""
    cases = []
    seqs = [(1, 1), (1, 128), (7, 7), (7, 128), (128, 128), (128, 4096), (4096, 4096)]
    grads = [("none", False), ("requires_grad", True), ("requires_grad_no_grad", False)]
    for dtype, head_dim, mask, gqa, (q_len, k_len), batch, (
        grad,
        needs,
    ), dropout in itertools.product(
        ("bfloat16", "float16", "float32"),
        (32, 64, 80, 96, 128, 160, 192, 256, 512),
        ("none", "causal", "bool", "float"),
        (False, True),
        seqs,
        (1, 8),
        grads,
        (0.0, 0.1),
    ):
        if q_len * k_len * batch > 8 * 128 * 4096 and head_dim not in (64, 128, 256):
            continue  # the longest sequences at the usual head dims only: the table stays small
        heads, kv_heads = 8, (2 if gqa else 8)
        cases.append(case(dtype, batch, heads, kv_heads, q_len, k_len, head_dim, mask, gqa,
                          grad, needs, dropout, "bhsd"))  # fmt: skip
    for dtype, layout, mask in itertools.product(
        ("bfloat16", "float32"), ("bshd", "last_dim_strided"), ("none", "causal", "float")
    ):
        for grad, needs in grads[:2]:
            cases.append(case(dtype, 2, 8, 8, 128, 128, 64, mask, False, grad, needs, 0.0, layout))
    return cases


def case(dtype, batch, heads, kv_heads, q_len, k_len, head_dim, mask, gqa, grad, needs, dropout,
         layout) -> dict:  # fmt: skip
    q_shape = (batch, heads, q_len, head_dim)
    kv_shape = (batch, kv_heads, k_len, head_dim)
    strides = {}
    for name, shape in (("q", q_shape), ("k", kv_shape), ("v", kv_shape)):
        _b, h, s, d = shape
        if layout == "bshd":  # (B, S, H, D) memory seen as (B, H, S, D): what attention layers do
            strides[name] = (s * h * d, d, h * d, 1)
        elif layout == "last_dim_strided":
            strides[name] = (h * s * d * 2, s * d * 2, d * 2, 2)
        else:
            strides[name] = contiguous(shape)
    mask_shape = (batch, 1, q_len, k_len) if mask in ("bool", "float") else None
    return {
        "dtype": dtype,
        "q_shape": q_shape,
        "k_shape": kv_shape,
        "v_shape": kv_shape,
        "q_stride": strides["q"],
        "k_stride": strides["k"],
        "v_stride": strides["v"],
        "mask_dtype": {"bool": "bool", "float": dtype}.get(mask),
        "mask_shape": mask_shape,
        "mask_stride": contiguous(mask_shape) if mask_shape else None,
        "is_causal": mask == "causal",
        "dropout_p": dropout,
        "enable_gqa": gqa,
        "needs_grad": needs,
        "grad": grad,
        "layout": layout,
    }


def storage_numel(shape, stride) -> int:
    """Elements a view of that shape and stride reaches, from offset 0."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=False))
