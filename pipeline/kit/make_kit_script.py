"""Generate the kit script, kit/mesure_memoire.py, from the package's modules.

The kit ships one self-contained file that imports nothing of the pipeline; the pipeline
shares the same code without importing the kit. So the code lives in the package, by role,
and this generator writes the kit's file from it, as make_notebook.py writes the notebook
from the kit's file:

- the core, standard library only: arguments.py (UsageError, the value parsers),
  run_status.py, allocator_model.py, phase_protocol.py, environment_capture.py, writers.py,
  measure_flow.py;
- the kit's own part, seed_network.py: the synthetic network, its commands and its command
  line, a module that imports the core and runs as the kit does.

The kit script is seed_network.py with three changes: its leading comment (which says all
this) is dropped; its imports become one standard-library block, the union of what it and
the core import, sorted as ruff's isort sorts them; each `# from MODULE: NAMES` line becomes
those definitions, copied verbatim from MODULE with the comment lines directly above them.
A line names consecutive definitions of its module, all of the names they define, and every
definition of every core module is placed exactly once, so nothing is left out or doubled.
Nothing is rewritten: the kit reads in its own order, and a function reads the same in the
kit, in the core and in the notebook made from the kit.

Why placed lines rather than the modules one after the other: the kit is read by people who
have only it, section by section (the notebook is cut from those sections), and a core
definition belongs in the section that uses it (check_gpu and run_phase beside the measure
they serve). So the kit kept its order and its bytes when its code moved into the package.
Why the own part is a module that imports the core rather than a fragment: it runs, is
linted and is imported like any module, so the pipeline checks the seed network's flags
and predicts its counters with the very code the kit ships, without importing the kit.

    python -m pipeline.kit.make_kit_script            # (re)write kit/mesure_memoire.py
    python -m pipeline.kit.make_kit_script --check    # exit 1 if the committed file is stale

Regenerating is byte-for-byte stable. tests/test_kit_script.py and `make archive` refuse a
kit script that differs from what this makes. Standard library only.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from pipeline.kit import generated

ROOT = Path(__file__).resolve().parents[2]
KIT_SCRIPT = Path("kit/mesure_memoire.py")
OWN_PART = Path("pipeline/workloads/seed_network.py")
# The core the kit carries, in the order a reader meets it: each a module of pipeline/core/.
CORE = (
    "arguments",
    "run_status",
    "allocator_model",
    "phase_protocol",
    "environment_capture",
    "writers",
    "measure_flow",
)
REGENERATE = "python -m pipeline.kit.make_kit_script"
PACKAGE = "pipeline.core."  # how the sources import the core: from pipeline.core.NAME import
SOURCES = (OWN_PART, *(Path(f"pipeline/core/{name}.py") for name in CORE))

MARKER = re.compile(r"# from (\w+): (.*)")
CONTINUED = re.compile(r"#\s+(.*)")


class KitSourceError(Exception):
    """The sources break a rule the generator relies on: said in one line, nothing written."""


def defined_names(node: ast.stmt) -> list[str]:
    """The top-level names a statement defines (a def, a class, an assignment)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else []
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    names = []
    for target in targets:
        elements = target.elts if isinstance(target, ast.Tuple) else [target]
        names += [element.id for element in elements if isinstance(element, ast.Name)]
    return names


def statement_start(lines: list[str], node: ast.stmt) -> int:
    """0-based first line of a statement with its decorators and the comment lines directly
    above it, so that a definition's comment travels with it."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return start


def is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def stdlib_imports(name: str, tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The module's top-level imports other than the core's; refuses anything that is
    neither the standard library nor the core, or a core module imported whole (its names
    would need rewriting once copied into one file)."""
    kept = []
    for node in tree.body:
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        for module in modules:
            if core_module(module) and isinstance(node, ast.ImportFrom):
                continue
            if core_module(module) or module == PACKAGE.rstrip("."):
                raise KitSourceError(f"{name}: `import {module}`: import core names with from")
            top = module.split(".")[0]
            if top != "__future__" and top not in sys.stdlib_module_names:
                raise KitSourceError(f"{name}: imports {module}: the kit is standard library only")
        if not (isinstance(node, ast.ImportFrom) and core_module(node.module or "")):
            kept.append(node)
    return kept


def core_module(module: str) -> str | None:
    """The core module an import names (`pipeline.core.writers`: writers), else None."""
    name = module.removeprefix(PACKAGE)
    return name if module.startswith(PACKAGE) and name in CORE else None


def import_block(nodes: list[ast.Import | ast.ImportFrom]) -> list[str]:
    """One block, as ruff's isort writes it: __future__, then `import x`, then `from x import`,
    each sorted, the names of one module merged (constants, classes, then the rest)."""
    plain: set[str] = set()
    names: dict[str, set[str]] = {}
    for node in nodes:
        if any(alias.asname for alias in node.names):
            raise KitSourceError(f"line {node.lineno}: no `as` in the kit's imports")
        if isinstance(node, ast.Import):
            plain |= {alias.name for alias in node.names}
        else:
            names.setdefault(node.module, set()).update(alias.name for alias in node.names)

    def order(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
        return kind, name

    def line(module: str) -> str:
        return f"from {module} import {', '.join(sorted(names[module], key=order))}"

    future = [line("__future__"), ""] if "__future__" in names else []
    modules = sorted(set(names) - {"__future__"})
    return [*future, *(f"import {name}" for name in sorted(plain)), *map(line, modules)]


class Core:
    """The core modules' definitions, each to be placed once."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.lines: dict[str, list[str]] = {}
        self.statements: dict[str, list[tuple[int, int, list[str]]]] = {}
        self.imports: list[ast.Import | ast.ImportFrom] = []
        for module, source in sources.items():
            tree = ast.parse(source)
            lines = source.splitlines()
            self.lines[module] = lines
            self.imports += stdlib_imports(f"{module}.py", tree)
            self.statements[module] = [
                (statement_start(lines, node), node.end_lineno, defined_names(node))
                for node in tree.body
                if not (is_docstring(node) or isinstance(node, ast.Import | ast.ImportFrom))
            ]
            for start, _, names in self.statements[module]:
                if not names:
                    raise KitSourceError(f"{module}.py line {start + 1}: defines no name")
        self.placed: set[tuple[str, int]] = set()

    def code(self, module: str, names: list[str]) -> list[str]:
        """The lines of the consecutive definitions of `names` in `module`, verbatim."""
        if module not in self.statements:
            raise KitSourceError(f"# from {module}: not a core module ({', '.join(CORE)})")
        statements = self.statements[module]
        where = [i for i, (_, _, defined) in enumerate(statements) if set(defined) & set(names)]
        if not where:
            raise KitSourceError(f"# from {module}: {', '.join(names)}: not defined there")
        first, last = where[0], where[-1]
        if where != list(range(first, last + 1)):
            raise KitSourceError(f"# from {module}: {', '.join(names)}: not consecutive there")
        defined = [name for _, _, found in statements[first : last + 1] for name in found]
        if defined != names:
            raise KitSourceError(
                f"# from {module}: {', '.join(names)}: name {', '.join(defined)}, in that order"
            )
        for index in where:
            if (module, index) in self.placed:
                raise KitSourceError(f"# from {module}: {statements[index][2][0]} placed twice")
            self.placed.add((module, index))
        return self.lines[module][statements[first][0] : statements[last][1]]

    def left_out(self) -> list[str]:
        return [
            f"{module}.{names[0]}"
            for module, statements in self.statements.items()
            for index, (_, _, names) in enumerate(statements)
            if (module, index) not in self.placed
        ]


def generate(own_part: str, core_sources: dict[str, str]) -> str:
    """The kit script's text from seed_network.py's and the core modules' texts."""
    core = Core(core_sources)
    tree = ast.parse(own_part)
    lines = own_part.splitlines()
    if not tree.body or not is_docstring(tree.body[0]):
        raise KitSourceError(f"{OWN_PART.name}: the kit's docstring must come first")
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    if not imports:
        raise KitSourceError(f"{OWN_PART.name}: no imports")
    block = import_block(stdlib_imports(OWN_PART.name, tree) + core.imports)
    docstring = tree.body[0]
    out = lines[docstring.lineno - 1 : imports[0].lineno - 1] + block
    rest = lines[imports[-1].end_lineno :]
    i = 0
    while i < len(rest):
        match = MARKER.fullmatch(rest[i])
        i += 1
        if not match:
            out.append(rest[i - 1])
            continue
        text = match.group(2)
        while text.endswith(",") and i < len(rest) and CONTINUED.fullmatch(rest[i]):
            text += " " + CONTINUED.fullmatch(rest[i]).group(1)
            i += 1
        out += core.code(match.group(1), [name.strip() for name in text.split(",")])
    left = core.left_out()
    if left:
        raise KitSourceError(f"core definitions no `# from` line places: {', '.join(left)}")
    text = "\n".join(out) + "\n"
    defined = [name for node in ast.parse(text).body for name in defined_names(node)]
    doubled = sorted({name for name in defined if defined.count(name) > 1})
    if doubled:
        raise KitSourceError(f"defined twice in the kit script: {', '.join(doubled)}")
    return text


def render(root: Path = ROOT) -> bytes:
    """The kit script's bytes from the sources under `root`."""
    own_part = (root / OWN_PART).read_text(encoding="utf-8")
    core = {name: (root / f"pipeline/core/{name}.py").read_text(encoding="utf-8") for name in CORE}
    return generate(own_part, core).encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    description = " ".join(__doc__.split("\n\n")[0].split())  # its first paragraph
    errors = (OSError, SyntaxError, KitSourceError)
    return generated.main("make_kit_script.py", description, KIT_SCRIPT, render, errors, ROOT, argv)


if __name__ == "__main__":
    raise SystemExit(main())
