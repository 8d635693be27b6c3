"""bitsandbytes' 8-bit weights (LLM.int8, `load_in_8bit`) as a GPU runs them, in a trace.

Read in bitsandbytes 0.50.2 (nn/modules.py, autograd/_functions.py, _ops.py,
backends/cuda/ops.py, backends/default/ops.py) and transformers 5.23
(integrations/bitsandbytes.py):

- The load. transformers' Bnb8bitQuantize moves each weight to the host and makes it an
  `Int8Params`, moved back to the device; `Int8Params.to` quantises it the first time it goes
  from the host to any device but meta (`_quantize`: the weight in float16 on the device,
  `int8_vectorwise_quant`, the int8 weight and its float32 row scales kept). On meta it is
  moved unquantised: here meta is the GPU, and it quantises; in every trace the quantised
  weight is a new parameter (`_quantised_on_the_device`).
- The kernels. Their fake kernels (_ops.py) give the outputs' shapes only, in another order
  than CUDA's, and the outlier columns a dynamic size a trace without a shape environment
  cannot make. A GPU runs the CUDA implementations (backends/cuda/ops.py) where there is one,
  else the default ones (backends/default/ops.py: `int8_mixed_scaled_mm`, `int8_scaled_mm`,
  `int8_vectorwise_dequant`): Python over torch's operators around the library's calls. Here
  each call runs that Python as bitsandbytes wrote it, read from its source, with the
  library's calls left out (they write into blocks made before them; cuBLASLt's int8 product
  takes no workspace from PyTorch's allocator).
- The outlier columns. With a threshold (6.0 by default, `llm_int8_threshold`), each 8-bit
  product looks for input columns holding a value at or above it (`A.abs() >= threshold`,
  then `outliers.any()` read on the host): those columns are multiplied in 16 bits, their
  weight columns dequantised for the call. How many there are is set by the activations'
  values, which a trace does not have. The central figure takes none (the lab's models are
  loaded from a checkpoint of zeros, whose activations have none); the most replay takes
  every column an outlier (`OUTLIERS`, noted: never exact; boundable): the blocks of that
  path (`search_blocks`, `product_blocks`), alive through the call, the 16-bit input columns
  as long as the product keeps them (for backward in training) and their indices as long as
  the layer keeps them (`state.idx`, until its next call).

A trace that runs an 8-bit kernel notes NOTE while CHECKED_ON_A_GPU is False, which withholds
the bounds. Nothing is installed where bitsandbytes is not imported, or where its source
does not hold what is read here (another version): a trace that reaches these kernels then
fails on their fake kernels and says "not predicted".

Standard library, torch_private and from_pretrained's `replace` only (torch is passed in).
"""

from __future__ import annotations

import ast
import collections.abc
import functools
import importlib.util
import math
import sys
import typing
from pathlib import Path

from pipeline.core import torch_private
from pipeline.predicting.from_pretrained import replace

OUTLIERS = "LLM.int8's outlier columns (bitsandbytes)"
OUTLIERS_WHY = (
    "each 8-bit product multiplies in 16 bits the input columns holding a value at or above "
    "its threshold, found on the GPU from the activations' values: the central figure takes "
    "none (the lab's model of zeros has none), the upper bound every column"
)
# Whether a GPU's measurements of models loaded in 8 bits have been held against predictions
# traced this way. While False, a trace that runs an 8-bit kernel notes NOTE, which withholds
# the bounds (trace.bounds.boundable): the central figure follows the source, nothing
# more is claimed.
CHECKED_ON_A_GPU = False
NOTE = "8-bit weights (bitsandbytes)"
UNCHECKED_WHY = (
    "the load and products follow transformers' from_pretrained and bitsandbytes' CUDA "
    "dispatch (int8 weights and row scales, each product's float16 input, quantisation and "
    "int32 result) and have not yet been held against a GPU's measurement: the central figure "
    "follows them, no bounds are claimed"
)
OPERATORS = (
    "int8_vectorwise_quant",
    "int8_linear_matmul",
    "int8_mm_dequant",
    "int8_scaled_mm",
    "int8_mixed_scaled_mm",
    "int8_vectorwise_dequant",
)
# Scratch an indexing kernel may take beside its output, per element it indexes: a copy of
# its index broadcast to the result, in int64. PyTorch's advanced indexing on CUDA
# (index_put_ and index through TensorIterator's restrided indices) makes none, as read; the
# bound allows one.
INDEX_SCRATCH_PER_ELEMENT = 8


@functools.cache
def read_kernels(torch) -> dict | None:
    """{operator name: the function a CUDA GPU runs for it}, compiled from bitsandbytes'
    source with the library's calls left out; None where the source does not hold them."""
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(spec.submodule_search_locations[0])
    found: dict = {}
    # a CUDA kernel first, as the dispatcher picks; the default ones are in the backend's
    # module but for int8_vectorwise_dequant's, registered beside its definition
    for path, backend in (
        (package / "backends" / "cuda" / "ops.py", "cuda"),
        (package / "backends" / "default" / "ops.py", "default"),
        (package / "_ops.py", "default"),
    ):
        compiled = _compile(torch, path, backend)
        if compiled is None:
            return None
        for name, function in compiled.items():
            found.setdefault(name, function)
    return found if all(name in found for name in OPERATORS) else None


def _compile(torch, path: Path, backend: str) -> dict | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    body: list = []
    kernels: dict = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        name = _registered(node, backend)
        if name in OPERATORS:
            node.name = f"_kernel_{name.replace('.', '_')}"
            kernels[name] = node.name
            node.decorator_list = []
        elif not node.name.startswith("_int8_"):
            continue  # only the helpers the int8 kernels call
        body.append(_WithoutLibrary().visit(node))
    namespace = {
        "torch": torch,
        "prod": math.prod,
        "Optional": typing.Optional,
        "Sequence": collections.abc.Sequence,
        "_outliers_found": _outliers_found,
    }
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    try:
        exec(compile(module, str(path), "exec"), namespace)
    except Exception:
        return None
    return {name: namespace[function] for name, function in kernels.items()}


def _registered(node: ast.FunctionDef, backend: str) -> str | None:
    """The operator a `@register_kernel("bitsandbytes::NAME", backend)` function is for."""
    for decorator in node.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and ast.unparse(decorator.func) == "register_kernel"
            and len(decorator.args) == 2
            and all(isinstance(arg, ast.Constant) for arg in decorator.args)
            and decorator.args[1].value == backend
            and str(decorator.args[0].value).startswith("bitsandbytes::")
        ):
            name = decorator.args[0].value.removeprefix("bitsandbytes::")
            return None if "." in name else name  # the .out overloads are not called here
    return None


class _WithoutLibrary(ast.NodeTransformer):
    """The library's calls out: a `with _cuda_device_of(...)` block (the library's kernel
    launched on the tensor's device) becomes its names set to 0 (a return code of success),
    a pointer read becomes 0, and `if X.any():` asks _outliers_found(X)."""

    def visit_With(self, node):
        if not any(
            ast.unparse(item.context_expr).startswith("_cuda_device_of(") for item in node.items
        ):
            return self.generic_visit(node)
        names = [
            target.id
            for statement in ast.walk(node)
            if isinstance(statement, ast.Assign)
            for target in statement.targets
            if isinstance(target, ast.Name)
        ]
        zero = [
            ast.Assign(targets=[ast.Name(n, ast.Store())], value=ast.Constant(0)) for n in names
        ]
        return zero or ast.Pass()

    def visit_Call(self, node):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "data_ptr" and not node.args:
            return ast.Constant(0)
        return self.generic_visit(node)

    def visit_If(self, node):
        test = node.test
        if (
            isinstance(test, ast.Call)
            and isinstance(test.func, ast.Attribute)
            and test.func.attr == "any"
            and not test.args
            and not test.keywords
        ):
            node.test = ast.Call(ast.Name("_outliers_found", ast.Load()), [test.func.value], [])
        return self.generic_visit(node)


_NOTES: list = []  # the trace's notes while installed (one trace at a time)


def _outliers_found(outliers) -> bool:
    """`outliers.any()` as the GPU computes it (its one-element result made and dropped),
    taken as False: no column at or above the threshold."""
    outliers.any()
    if _NOTES:
        _NOTES[-1].setdefault(OUTLIERS, OUTLIERS_WHY)
    return False


def search_blocks(A) -> tuple[int, ...]:
    """The blocks int8_vectorwise_quant (CUDA) takes at most beside the no-outlier path for
    A (rows x columns), every column an outlier: the columns' flags (`any(dim=0)`, bool),
    their indices (`argwhere`, int64) and its search's scratch, the zeroing's index
    scratch (`out_row[:, outlier_cols] = 0`)."""
    rows, columns = A.numel() // A.shape[-1], A.shape[-1]
    per = INDEX_SCRATCH_PER_ELEMENT
    return (columns, 8 * columns, per * columns, per * rows * columns)


def product_blocks(A, CB) -> tuple[int, ...]:
    """The blocks int8_mixed_scaled_mm (default kernel) takes at most beside the no-outlier
    path for A (rows x columns) by the int8 weight CB (outputs x columns), every column an
    outlier: A's columns (`subA`, A's dtype) and the gather's index scratch, the weight's
    columns (int8) and theirs, dequantised (float32, twice: the scales' product, then the
    1/127 one), in A's dtype, and addmm's new output."""
    rows, columns = A.numel() // A.shape[-1], A.shape[-1]
    outputs, size, per = CB.shape[0], A.element_size(), INDEX_SCRATCH_PER_ELEMENT
    return (
        size * rows * columns,
        per * rows * columns,
        outputs * columns,
        per * outputs * columns,
        4 * outputs * columns,
        4 * outputs * columns,
        size * outputs * columns,
        size * rows * outputs,
    )


def install(torch, recorder, notes: dict):
    """The steps above, for the trace's time; returns the undo."""
    modules = sys.modules.get("bitsandbytes.nn.modules")
    kernels = read_kernels(torch) if modules is not None else None
    if kernels is None:
        return lambda: None
    _NOTES.append(notes)
    undo = [_NOTES.pop]
    undo.append(replace(modules.Int8Params, "to", _quantised_on_the_device(torch, modules)))
    # the operator packet (`torch.ops.bitsandbytes.NAME(...)`) and its overload, as called
    by_overload = {}
    for name in kernels:
        packet = getattr(torch.ops.bitsandbytes, name)
        by_overload[packet] = by_overload[packet.default] = name

    class CudaKernels(torch.overrides.TorchFunctionMode):
        """An int8 call on the traced device runs as the CUDA dispatch runs it, as its
        operators; the mode is entered again for the kernels' own int8 calls."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = by_overload.get(func)  # every torch call of the trace asks: one lookup
            if name is None or not _on_device(args):
                return func(*args, **kwargs)
            if not CHECKED_ON_A_GPU:
                notes.setdefault(NOTE, UNCHECKED_WHY)
            with self:
                if name == "int8_vectorwise_quant":
                    return self.quant(kernels[name], *args, **kwargs)
                if name == "int8_mixed_scaled_mm":
                    return self.mixed(kernels[name], *args, **kwargs)
                return kernels[name](*args, **kwargs)

        def quant(self, kernel, A, threshold=0.0):
            if not threshold > 0.0:  # no threshold: no outlier search
                return kernel(A, threshold)
            token = recorder.at_most(search_blocks(A))
            out_row, row_stats, outlier_cols = kernel(A, threshold)
            recorder.at_most_end(token)
            # the indices live as the layer's state.idx, until its next call
            recorder.at_most((8 * A.shape[-1],), outlier_cols)
            return out_row, row_stats, outlier_cols

        def mixed(self, kernel, A, CA, CB, SCA, SCB, outlier_cols=None, bias=None):
            if outlier_cols is None:  # no threshold: no outlier path
                return kernel(A, CA, CB, SCA, SCB, outlier_cols, bias)
            token = recorder.at_most(product_blocks(A, CB))
            output, subA = kernel(A, CA, CB, SCA, SCB, outlier_cols, bias)
            recorder.at_most_end(token)
            # A's columns live as the product's subA (saved for backward in training)
            recorder.at_most((A.element_size() * A.numel(),), subA)
            return output, subA

    mode = CudaKernels()
    mode.__enter__()
    undo.append(lambda: mode.__exit__(None, None, None))

    def restore():
        while undo:
            undo.pop()()

    return restore


def _on_device(args) -> bool:
    return any(
        getattr(arg, "device", None) is not None and arg.device.type in ("meta", "cuda")
        for arg in args
        if hasattr(arg, "untyped_storage")
    )


def _quantised_on_the_device(torch, modules):
    original = modules.Int8Params.__dict__["to"]

    def to(self, *args, **kwargs):
        device = torch_private.to_device(torch, *args, **kwargs)
        if (
            device is not None
            and device.type != "cpu"  # the traced device: meta, or the GPU's beside it
            and self.data.dtype != torch.int8
            and self.data.device.type == "cpu"
            and not self.has_fp16_weights
        ):
            # _quantize's steps (on meta too: meta stands for the GPU); its last, `self.data
            # = CB`, sets a host parameter's data to a device tensor, which a fake tensor
            # refuses on meta and, beside a GPU, takes while still saying it is the host's:
            # the device's parameter is made anew around CB, as Int8Params.to makes one for
            # a quantized weight
            B = self.data.contiguous().to(device=device, dtype=torch.float16)
            CB, SCB, _ = modules.bnb.functional.int8_vectorwise_quant(B)
            del B
            return modules.Int8Params(
                CB, requires_grad=self.requires_grad, has_fp16_weights=False, CB=CB, SCB=SCB
            )
        return original(self, *args, **kwargs)

    return to
