"""bitsandbytes' 4-bit CUDA kernels as a GPU runs them, in a trace: their blocks in the order
the CUDA implementation asks for them.

Read in bitsandbytes 0.50.2 (backends/cuda/ops.py, _ops.py, autograd/_functions.py):

- `quantize_4bit` and `quantize_blockwise` make their absmax (float32, one per block) before
  their packed output: the replay asks for the outputs in that order (`template`). Their
  fake kernels return the same shapes. `dequantize_4bit` and `dequantize_blockwise` make
  their output with torch.empty and nothing else (the library's kernel writes into it).
- `gemm_4bit` (the forward of a 4-bit Linear: MatMul4Bit and matmul_4bit without gradients)
  runs bitsandbytes' own kernel, which allocates its output only, or, past
  `_gemm_4bit_custom_max_m` rows (1,536 on CUDA), for a width not a multiple of the block,
  or where `_gemm_4bit_use_custom_cuda` prefers it for the GPU's architecture and SM count,
  `_dequant_linear_fallback`: the nested absmax dequantised (float32) and offset (a second
  float32 block), the weight dequantised into a new tensor of the input's dtype, then
  `F.linear`, which cuBLAS runs as any product. Its fake kernel returns the output only.
  Here (`install`) the call takes the path the CUDA dispatch takes: the fallback runs as
  bitsandbytes wrote it, read from its source (`_dequant_linear_fallback` and the
  heuristic), with the two library calls, which write into blocks already made, left out
  but for their `A.contiguous()`. The GPU's SM count and compute capability are the
  target's (reduce_scratch.DEVICES, attention_choice.TargetGpu), or the GPU's itself beside
  a measurement.
- The backward of MatMul4Bit dequantises with `F.dequantize_4bit` and multiplies with
  torch.matmul: operators the trace follows as they are.

Nothing is installed where bitsandbytes is not imported, or where its CUDA source does not
hold what is read here (another version): the fake kernel's output stands then, and the
quantized load's note already withholds bounds.

Standard library only (torch is passed in).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path

# The outputs in the order the CUDA kernels allocate them, and nothing else: the quantisers
# their absmax (output 1) before their packed output (output 0); the dequantisers their
# output (`torch.empty`), or nothing when given one (`.out`)
OUTPUT_ORDER = {
    "bitsandbytes.quantize_4bit.default": (1, 0),
    "bitsandbytes.quantize_blockwise.default": (1, 0),
    "bitsandbytes.dequantize_4bit.default": (0,),
    "bitsandbytes.dequantize_blockwise.default": (0,),
    "bitsandbytes.dequantize_4bit.out": (),
    "bitsandbytes.dequantize_blockwise.out": (),
    # a gemm_4bit call left in a trace is one the CUDA dispatch gives its own kernel (`install`
    # runs the others as the fallback's operators): its output only
    "bitsandbytes.gemm_4bit.default": (0,),
}
OPERATORS = frozenset(OUTPUT_ORDER)
READ = ("_gemm_4bit_use_custom_cuda", "_dequant_linear_fallback")


def template(name: str) -> list[tuple]:
    """The call's blocks in the order its CUDA kernel asks for them: its outputs only, each
    of the size the trace gives it (None)."""
    return [("output", index, None) for index in OUTPUT_ORDER[name]]


@functools.cache
def read_cuda_dispatch(torch, props: tuple[int, int, int]) -> dict | None:
    """bitsandbytes' own `_gemm_4bit_use_custom_cuda` and `_dequant_linear_fallback`, and
    the CUDA row cap, from its source, bound to this GPU's (SM count, major, minor); None
    where the source does not hold them. Read once a process for a GPU (parsing the source
    takes tens of milliseconds, and a process may trace many times)."""
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "backends" / "cuda" / "ops.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    body: list = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in READ:
            body.append(node)  # with its decorators (functools.cache: asked once a shape)
        elif isinstance(node, ast.Assign) and _names(node) == {"_GEMM_4BIT_CUSTOM_FLOOR_M"}:
            body.append(node)
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "torch.version.hip is None":
            body += [n for n in node.body if isinstance(n, ast.Assign) and _names(n) == {
                "_gemm_4bit_custom_max_m"
            }]  # fmt: skip
    namespace = {
        "functools": functools,
        "torch": torch,
        "_gpu_dispatch_props": lambda index: props,
        # the library's kernels write into blocks made before them: only their copy of a
        # non-contiguous input asks for memory
        "_dequantize_blockwise_impl": lambda A, *rest, **kwargs: A.contiguous(),
        "_dequantize_4bit_impl": lambda A, *rest, **kwargs: A.contiguous(),
    }
    try:
        exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    except Exception:
        return None
    wanted = (*READ, "_GEMM_4BIT_CUSTOM_FLOOR_M", "_gemm_4bit_custom_max_m")
    return namespace if all(name in namespace for name in wanted) else None


def _names(node: ast.Assign) -> set:
    return {target.id for target in node.targets if isinstance(target, ast.Name)}


def install(torch, props: tuple[int, int, int] | None):
    """gemm_4bit as the CUDA dispatch runs it, for the trace's time; returns the undo."""
    if props is None or "bitsandbytes" not in sys.modules:
        return lambda: None
    dispatch = read_cuda_dispatch(torch, props)
    if dispatch is None:
        return lambda: None
    gemm = torch.ops.bitsandbytes.gemm_4bit.default
    custom = dispatch["_gemm_4bit_use_custom_cuda"]
    fallback = dispatch["_dequant_linear_fallback"]
    most_rows = dispatch["_gemm_4bit_custom_max_m"]

    def takes_fallback(A, shapeB, blocksize) -> bool:
        """backends/cuda/ops.py's dispatch of gemm_4bit, its tests in its order."""
        K = A.shape[-1]
        M = A.numel() // K
        N = shapeB[0]
        return most_rows < M or K % blocksize != 0 or not custom(A.device.index, A.dtype, M, N, K)

    class CudaDispatch(torch.overrides.TorchFunctionMode):
        """A gemm_4bit call that the GPU runs as the fallback runs it here, as its
        operators: inside a torch function mode they reach the trace's dispatch."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is gemm and args[0].device.type in ("meta", "cuda"):
                A, B, shapeB, absmax, blocksize, quant_type, *rest = args
                if takes_fallback(A, shapeB, blocksize):
                    return fallback(A, B, shapeB, absmax, blocksize, quant_type, *rest, **kwargs)
            return func(*args, **kwargs)

    mode = CudaDispatch()
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)
