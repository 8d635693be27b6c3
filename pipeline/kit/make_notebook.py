"""Generate the kit's notebook, data/mesure-memoire.ipynb, from kit/mesure_memoire.py.

One source, so the two can never drift: the notebook's code cells are the script's own
functions and constants, copied line for line (found with `ast`), grouped by the script's
`# ---- section` comments, each group after a markdown cell that explains it. Only the
command-line layer stays behind (argparse, its value parsers, `main`); a parameters cell and
one checking cell take its place, built from the script's own option defaults. The notebook
never imports the script, so it can travel alone.

    python -m pipeline.kit.make_notebook            # (re)write data/mesure-memoire.ipynb
    python -m pipeline.kit.make_notebook --check    # exit 1 if the committed notebook is stale

The output is nbformat 4.5 as Jupyter writes it (sorted keys, indent 1), with deterministic
cell ids, no outputs, no execution counts and no interpreter version, so regenerating is
byte-for-byte stable. Standard library only.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

from pipeline.kit import generated

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path("kit/mesure_memoire.py")
NOTEBOOK = Path("data/mesure-memoire.ipynb")

# The command-line layer of the script: argparse, its value parsers, and the printers of
# command-line-only output. Everything else at the top level is copied.
EXCLUDED = {
    "_Parser",
    "_matched",
    "positive_int",
    "non_negative_decimal",
    "non_negative_int",
    "device_index",
    "add_defaulted",
    "library_block",
    "print_phase_prediction",
    "add_configuration",
    "build_parser",
    "main",
}
# The only edits made to copied code: the steps read a SimpleNamespace, not argparse's
# Namespace (an annotation only).
EDITS = (("args: argparse.Namespace", "args: types.SimpleNamespace"),)


def edited(code: str) -> str:
    for old, new in EDITS:
        code = code.replace(old, new)
    return code


SECTION_MARK = re.compile(r"# -{8,} (.+)")
# Run cells, each placed after the section that defines the function it calls.
RUN_CODE = {
    "print_estimate": "print_estimate(estimate(ARGS.parameters, ARGS.bits, ARGS.reserve_gib))",
    "collect_environment": (
        "environment = collect_environment("
        "ARGS.device, ARGS.device_text, process_start=ARGS.process_start)\n"
        "print(json.dumps(environment, indent=2, ensure_ascii=False))"
    ),
    "measure": "exit_code = measure(ARGS)",
}
COMMENTS = {  # shown beside a parameter in the parameters cell
    "BATCH": "start small; raise one dimension at a time",
    "CONTEXT": "positions of the input [batch, context, width]; no attention, no KV cache",
    "DTYPE": "float32, float16 or bfloat16, for weights and inputs alike",
    "WARMUP": "warm-up passes, one row together",
    "REPEATS": "timed passes, one row each",
    "REFERENCE_TIMING": "also time the forward with torch.utils.benchmark.Timer",
}

INTRO = """\
# IteraGPU Lab v1 — memory and time of a small synthetic network

This notebook carries its own code: the functions of the companion script
`mesure_memoire.py`, cell by cell, without importing it, so it can be used alone. It
downloads no model and no data set. The network, `Linear → GELU → Linear`, is not an LLM,
not training, and not a representative benchmark of GPUs offered for rent.

Set the parameters below, then run the cells from top to bottom, in a fresh kernel:

1. **Estimate** weight memory from a parameter count: no GPU, standard library only.
2. **Environment**: record Python, PyTorch and its CUDA/HIP build, the visible GPU and the
   driver. A diagnostic: a valid answer may say that no GPU is available.
3. **Measure** the synthetic network phase by phase on an explicit GPU, into a new JSON file.

Measurement needs a PyTorch install that already works with your GPU, driver and CUDA or
ROCm runtime; nothing here installs PyTorch, a driver or a runtime. Without a loadable
PyTorch or an accessible GPU, step 3 stops with a clear message (`UsageError`): it writes no
fake measurement and never falls back to the CPU. The notebook is shipped with no saved
outputs; keep your results in the measurement file, not in the notebook."""

PARAMETERS_MD = """\
## Parameters

The only cell to edit. The measurement defaults are the script's own
(`python mesure_memoire.py measure --help`): the kit's small first configuration. A larger
proposal is `BATCH = 2`, `CONTEXT = 128`, `WIDTH = 1024`, `WARMUP = 3`, `REPEATS = 5`: a
configuration to try, not a guaranteed capacity nor a published result.

- `PARAMETERS`, `BITS`, `RESERVE_GIB`: the estimate's inputs. The reserve, in GiB, is an
  assumption you choose (4 GiB in the example), not a measured value.
- `DEVICE` is always explicit, `cuda` or `cuda:N`. PyTorch's ROCm builds use the same name,
  which alone does not prove that a given AMD install works.
- `DTYPE` is shared by weights and inputs; no autocast, gradients, optimizer, quantization
  or multi-GPU sharding. `float16` and `bfloat16` depend on the real install and are not
  validated by a `float32` run.
- `OUTPUT` is the measurement file. It must be new: an existing result is never overwritten."""

IMPORTS_MD = """\
## Imports

The standard library only. PyTorch is imported inside the steps that need it, behind a
guard that stops with a clear message when it cannot be loaded, so step 1 runs anywhere."""

CONSTANTS_MD = """\
## Constants

They describe the synthetic model (hidden width = 4 × width), the clocks and the memory
counters, and they are written into every measurement, so that the file explains itself."""

CHECK_MD = """\
## Checking the parameters

The script checks its command-line options before any work. This cell applies the same rules
to the parameters above, and gathers them into the one namespace that the steps below read,
in place of the script's parsed command line."""

SECTIONS = {  # the script's section title -> the markdown cell before its code
    "estimate (no GPU)": """\
## Step 1 — estimate weight memory, no GPU

Bytes = ceil(parameters × bits / 8): the total is rounded up to whole bytes, so 4-bit
weights pack two to a byte. The result is given in GiB (2^30 bytes) and in decimal GB
(10^9 bytes), in exact decimal arithmetic, never binary floats. Worked example:
7,000,000,000 × 16 bits = 14,000,000,000 bytes = 13.0385160446… GiB = 14 GB; with a 4 GiB
reserve, 17.0385160446… GiB.

Weights only: activations, KV cache, quantization metadata, gradients, optimizer state and
libraries are not included, and the figure does not predict whether a real model fits on a
card.""",
    "environment": """\
## Step 2 — record the environment

Records the Python version, the PyTorch version, the CUDA or HIP version PyTorch was built
with, the GPU actually visible for the device, and the memory the runtime reports (total,
free). The driver is asked separately, from the vendor's tool (`nvidia-smi` or `rocm-smi`):
PyTorch's bundled runtime version is not the driver version. No environment variable and no
personal data are collected (no host or user name, path, address, GPU serial or UUID).""",
    "output files": """\
## Output files

A result is written whole or not at all: into a temporary file first, then linked to a name
that must be new. An existing file is never replaced, and that is checked before any work.""",
    "measure": """\
## Step 3 — measure, phase by phase

One row per phase. Each phase synchronises the device, records the baseline counters,
resets the peaks, runs, synchronises again, and records the end values and the peaks.

| phase | scope |
| --- | --- |
| `model_load` | build and initialise the model on the CPU, then move it to the GPU; the \
time includes the CPU work, the memory counters cover the GPU only |
| `inputs` | create the synthetic input on this GPU |
| `cold_forward` | the first pass after device, generator and input initialisation; not a \
cold start of the machine or driver |
| `warmup` | all warm-up passes together, one row, never mixed with the repetitions |
| `warm_forward` | one row per repetition after warm-up |

A pass's output still exists when its end values are recorded and is freed before the next
pass; weights and inputs persist; the allocator cache is kept (no `empty_cache`). Times
include Python overhead and synchronisation: they are not isolated kernel times, and the
file says which clock measured what.

`allocated` is part of `reserved`: never add them. `peak_allocated_bytes` and
`peak_reserved_bytes` are two different maxima: never subtract one from the other to find
"the cache". Compare baseline, end and peak separately. The counters cover PyTorch's
allocator only, in this process, on the chosen GPU: not the whole GPU memory, the driver or
other processes, nor other GPUs. Values depend on allocator and software versions, so the
environment is saved with the results. Running out of GPU memory is a real observation: the
file is then written with `"status": "out_of_memory"`.""",
    "prediction (no GPU)": """\
## Predicted counters

A model of PyTorch's caching allocator (blocks rounded to 512 bytes, small and large
segments, best fit, split rules) replays the network's known tensors, phase by phase, and
predicts the four counters of each row. The blocks that cuBLAS/cuBLASLt keep are not
assumed: the measurement lists them itself after the phases (its `calibration`), and the
prediction is written beside each measured row, with the largest difference in the
summary. A prediction explains the counters; it does not replace measuring them.""",
}

CLOSING = """\
## Next: quality and cost

Read `protocole-qualite.md`, define the *useful work* and the acceptance thresholds
**before** testing, then fill `resultats-bruts.csv` with real observations, one row per run.
Price a package with `python calcul_forfaits.py --gpu b200 --days 7 --lots 2`; the kit's
`README.md` explains lots, tariffs and the cost per accepted result."""

CHECKED = '''\
def checked(name: str, value, rule: str):
    """One parameter against the rule the script's option applies: bad input stops here."""
    text = str(value)
    rules = {
        "positive": (type(value) is int and value > 0, "a positive integer"),
        "non-negative": (type(value) is int and value >= 0, "an integer >= 0"),
        "flag": (type(value) is bool, "True or False"),
        "dtype": (isinstance(value, str) and value in DTYPE_BYTES, f"one of {sorted(DTYPE_BYTES)}"),
        "decimal": (re.fullmatch(r"[0-9]{1,15}(\\.[0-9]{1,15})?", text), "a decimal number >= 0"),
        "device": (re.fullmatch(r"cuda(:[0-9]+)?", text), "cuda or cuda:N, never the CPU"),
        "file": (isinstance(value, str) and text.strip() != "", "a new file name"),
    }
    ok, expected = rules[rule]
    if not ok:
        raise UsageError(f"{name}: expected {expected}, got {value!r}")
    return value'''


class StaleNotebook(Exception):
    """The script changed in a way this generator cannot follow without a new explanation."""


def measure_defaults(script: Path) -> dict:
    """The `measure` options and their defaults, read from the script's own parser (the
    generator may import the script; the notebook may not)."""
    spec = importlib.util.spec_from_file_location("_mesure_memoire_source", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["measure", "--device", "cuda:0", "--output", "unused.json"]
    options = vars(module.build_parser().parse_args(argv))
    skipped = ("command", "device", "output", "environment_output")  # the last: step 2's job
    return {k: v for k, v in options.items() if k not in skipped}


def rule(name: str, default) -> str:
    """The check a measure option gets in the notebook, from the type of its default."""
    if isinstance(default, bool):
        return "flag"
    if name == "dtype":
        return "dtype"
    if isinstance(default, int):
        return "non-negative" if default == 0 else "positive"
    raise StaleNotebook(f"measure option --{name}: no notebook rule for its default {default!r}")


PARAMETERS_HEAD = """\
# Step 1: the weights to estimate (no GPU).
PARAMETERS = 7_000_000_000
BITS = 16
RESERVE_GIB = "4"  # GiB, your assumption, not a measured value

# Steps 2 and 3: the GPU and the measured configuration.
DEVICE = "cuda:0"  # always explicit; never the CPU
"""


def parameters_cell(defaults: dict) -> str:
    lines = PARAMETERS_HEAD.splitlines()
    for name, value in defaults.items():
        comment = COMMENTS.get(name.upper())
        text = json.dumps(value) if isinstance(value, str) else repr(value)
        lines.append(f"{name.upper()} = {text}" + (f"  # {comment}" if comment else ""))
    lines.append(
        'OUTPUT = "mesures-notebook.json"  # a new file: an existing one is never replaced'
    )
    return "\n".join(lines)


def check_cell(defaults: dict) -> str:
    """`checked`, then the namespace of checked parameters, one line per parameter."""
    fields = [
        'parameters=checked("PARAMETERS", PARAMETERS, "positive"),',
        'bits=checked("BITS", BITS, "positive"),',
        'reserve_gib=Decimal(str(checked("RESERVE_GIB", RESERVE_GIB, "decimal"))),',
        'device=int(checked("DEVICE", DEVICE, "device").partition(":")[2] or 0),',
        "device_text=DEVICE,",
    ]
    for name, default in defaults.items():
        fields.append(f'{name}=checked("{name.upper()}", {name.upper()}, "{rule(name, default)}"),')
    fields.append('output=checked("OUTPUT", OUTPUT, "file"),')
    fields.append("environment_output=None,  # step 2 shows the environment")
    fields.append('process_start="notebook kernel",  # recorded in the environment')
    body = [f"    {field}" for field in fields]
    return "\n".join([CHECKED, "", "", "ARGS = types.SimpleNamespace(", *body, ")"])


def statement_span(lines: list[str], node: ast.stmt) -> tuple[int, int]:
    """0-based [start, end) of a statement's whole lines, with its decorators and the comment
    lines directly above it, so that comments travel with the code."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    while (
        start > 0 and lines[start - 1].startswith("#") and not SECTION_MARK.match(lines[start - 1])
    ):
        start -= 1
    return start, node.end_lineno


def defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    return None


def split_script(source: str) -> tuple[list[str], list[tuple[str, str, set[str]]]]:
    """The script's imports (less argparse), then its other code by section, verbatim:
    [(section title, code, names defined)], in the script's order; "" is the header."""
    lines = source.splitlines()
    tree = ast.parse(source)
    marks = [(i + 1, m.group(1)) for i, line in enumerate(lines) if (m := SECTION_MARK.match(line))]
    imports: list[str] = []
    spans: dict[str, list[tuple[int, int, bool]]] = {}
    defined: dict[str, set[str]] = {}
    seen, previous = set(), None
    for node in tree.body:
        name = defined_name(node)
        seen.add(name)
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        main_guard = isinstance(node, ast.If) and "__name__" in ast.dump(node.test)
        if name in EXCLUDED or docstring or main_guard:
            previous = None
            continue
        start, end = statement_span(lines, node)
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names]
            if "argparse" in modules and modules != ["argparse"]:
                raise StaleNotebook(f"line {node.lineno}: keep `import argparse` on its own line")
            if modules != ["argparse"]:
                imports.append("\n".join(lines[start:end]))
            continue
        section = next((title for line, title in reversed(marks) if line < node.lineno), "")
        # A statement that directly followed its kept neighbour keeps the script's spacing.
        follows = previous == section
        spans.setdefault(section, []).append((start, end, follows))
        defined.setdefault(section, set()).add(name)
        previous = section
    missing = EXCLUDED - seen
    if missing:
        raise StaleNotebook(f"names excluded from the notebook but gone from the script: {missing}")
    sections = []
    for section, parts in spans.items():
        out: list[str] = []
        for i, (start, end, follows) in enumerate(parts):
            if i:
                out += lines[parts[i - 1][1] : start] if follows else ["", ""]
            out += lines[start:end]
        code = edited("\n".join(out))
        if "argparse" in code:
            raise StaleNotebook(f"section {section!r} uses argparse: exclude it or refactor")
        sections.append((section, code, defined[section] - {None}))
    return imports, sections


def imports_cell(imports: list[str]) -> str:
    """The script's imports plus `types` (for the namespace), sorted as ruff's isort sorts."""
    future = [text for text in imports if text.startswith("from __future__")]
    plain = sorted([text for text in imports if text.startswith("import ")] + ["import types"])
    other = [text for text in imports if text.startswith("from ") and text not in future]
    return "\n".join([*future, *([""] if future else []), *plain, *sorted(other)])


def build_notebook(script_source: str, defaults: dict) -> dict:
    imports, sections = split_script(script_source)
    unknown = [title for title, _, _ in sections if title and title not in SECTIONS]
    if unknown:
        raise StaleNotebook(f"new script sections {unknown}: explain them in SECTIONS")
    plan = [
        ("markdown", INTRO, ()),
        ("markdown", IMPORTS_MD, ()),
        ("code", imports_cell(imports), ()),
        ("markdown", PARAMETERS_MD, ()),
        ("code", parameters_cell(defaults), ("parameters",)),
    ]
    for title, code, names in sections:
        plan.append(("markdown", SECTIONS[title] if title else CONSTANTS_MD, ()))
        plan.append(("code", code, ()))
        if not title:  # after the constants: the parameters, checked
            plan += [("markdown", CHECK_MD, ()), ("code", check_cell(defaults), ())]
        plan += [("code", RUN_CODE[name], ()) for name in RUN_CODE if name in names]
    plan.append(("markdown", CLOSING, ()))
    cells = []
    for number, (kind, source, tags) in enumerate(plan, start=1):
        cell = {"cell_type": kind, "id": f"cell-{number:02d}", "metadata": {}, "source": source}
        if tags:
            cell["metadata"] = {"tags": list(tags)}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def serialise(notebook: dict) -> bytes:
    """Jupyter's own on-disk form (as nbformat.writes): sources as lists of lines, sorted
    keys, indent 1, a final newline; so opening and saving it unchanged changes nothing."""
    cells = [{**c, "source": c["source"].splitlines(keepends=True)} for c in notebook["cells"]]
    text = json.dumps({**notebook, "cells": cells}, sort_keys=True, indent=1, ensure_ascii=False)
    return (text + "\n").encode("utf-8")


def render(root: Path = ROOT) -> bytes:
    """The notebook's bytes for the script under `root`."""
    script = root / SCRIPT
    source = script.read_text(encoding="utf-8")
    return serialise(build_notebook(source, measure_defaults(script)))


def main(argv: list[str] | None = None) -> int:
    description = " ".join(__doc__.split("\n\n")[0].split())  # its first paragraph
    errors = (OSError, SyntaxError, SystemExit, StaleNotebook)
    return generated.main("make_notebook.py", description, NOTEBOOK, render, errors, ROOT, argv)


if __name__ == "__main__":
    raise SystemExit(main())
