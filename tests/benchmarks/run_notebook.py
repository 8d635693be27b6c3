"""Run the kit's notebook top to bottom in this one fresh process, without Jupyter.

Each code cell is compiled and executed in order in one namespace, as a kernel would run it
(`codeop.Compile` keeps a cell's `from __future__` import in force for the next cells, as
IPython does). The parameters cell (tagged "parameters") runs first as written; options
given here then replace its values, so the committed notebook is never edited:

    python tests/benchmarks/run_notebook.py --device cuda:0 --output runs/<id>/notebook.json
    python tests/benchmarks/run_notebook.py --help      # one option per notebook parameter

Exit codes: 0 every cell ran; 2 a cell stopped with the notebook's UsageError (bad
parameter, no PyTorch, no GPU, an output that exists: one line, no traceback); 3 the
measurement ran out of GPU memory (recorded in its file); 1 any other error (traceback).
"""

from __future__ import annotations

import argparse
import ast
import codeop
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "data" / "mesure-memoire.ipynb"


def code_cells(notebook: dict) -> list[dict]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def source(cell: dict) -> str:
    text = cell["source"]
    return "".join(text) if isinstance(text, list) else text


def parameters(cells: list[dict]) -> dict:
    """The parameters cell's NAME = literal assignments, in order."""
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise SystemExit("run_notebook.py: error: the notebook needs one cell tagged parameters")
    found = {}
    for node in ast.parse(source(tagged[0])).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def option_type(default):
    """Parse an option like the parameter's default: int, True/False, or text."""
    if isinstance(default, bool):
        return lambda text: {"true": True, "false": False}[text.lower()]
    return type(default)


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--notebook", type=Path, default=NOTEBOOK)
    known, _ = pre.parse_known_args(argv)
    data = known.notebook.read_bytes()
    cells = code_cells(json.loads(data))
    defaults = parameters(cells)

    parser = argparse.ArgumentParser(prog="run_notebook.py", description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK, help="default: the kit's")
    for name, default in defaults.items():
        flag = "--" + name.lower().replace("_", "-")
        parser.add_argument(flag, dest=name, type=option_type(default), help=f"default {default!r}")
    args = parser.parse_args(argv)
    overrides = {name: getattr(args, name) for name in defaults if getattr(args, name) is not None}

    print(
        f"notebook {known.notebook}: sha256 {hashlib.sha256(data).hexdigest()}, "
        f"{len(cells)} code cells; overrides {overrides}"
    )
    namespace = {"__name__": "__main__"}
    compiler = codeop.Compile()
    started = time.perf_counter()
    for number, cell in enumerate(cells, start=1):
        code = compiler(source(cell), f"<{cell.get('id', number)}>", "exec")
        try:
            exec(code, namespace)
        except Exception as exc:
            if type(exc).__name__ == "UsageError":  # the notebook's own: a clear stop, exit 2
                print(f"run_notebook.py: {cell.get('id')}: {exc}", file=sys.stderr)
                return 2
            raise
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            namespace.update(overrides)
    print(f"all {len(cells)} code cells ran in {time.perf_counter() - started:.2f} s")
    return int(namespace.get("exit_code", 0))


if __name__ == "__main__":
    raise SystemExit(main())
