"""The pipeline's modules import each other without going round in circles: a module that
needs another's code at load or at call time, read from its source (imports inside
functions count: they are circles all the same, only deferred). The kit script is a leaf:
no pipeline module imports it, and the core it is generated from imports only the standard
library and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import make_kit_script

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"


def imports(path: Path, modules: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return (found & modules) - {path.stem}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def modules_of(folder: Path) -> set[str]:
    return {path.stem for path in folder.glob("*.py")}


def graph_of(folder: Path) -> dict[str, set[str]]:
    modules = modules_of(folder)
    return {path.stem: imports(path, modules) for path in folder.glob("*.py")}


def test_the_pipeline_has_no_import_circle():
    assert circles(graph_of(PIPELINE)) == []


def test_validate_reads_the_stages_facts_from_below_them():
    """validate is the floor under the stages: their facts live in modules it imports that
    import no stage; the stages import validate (to read a file), never the reverse."""
    graph = graph_of(PIPELINE)
    assert graph["validate"] & {"decoder", "own_model", "hf_model"} == set()
    assert graph["decoder_rules"] == set()  # standard library only
    assert graph["own_model_facts"] <= {"allocator_model", "phase_protocol", "trace_prediction"}
    assert graph["workload_contract"] == set()  # the workload's contract: a leaf
    assert "own_model" not in graph["hf_model"]


def test_the_decoder_model_and_the_calibration_reader_import_downwards():
    graph = graph_of(PIPELINE)
    assert "decoder" not in graph["decoder_model"]
    assert graph["decoder_shape"] == set()  # standard library only
    assert graph["call_keys"] == set()
    assert "gpu_calibration" not in graph["trace_prediction"]
    assert graph["torch_private"] == set()  # PyTorch's private APIs: a leaf any stage imports


KIT_SCRIPT = make_kit_script.KIT_SCRIPT.stem


def test_no_pipeline_module_imports_the_kit_script():
    """The kit is a leaf: the pipeline shares the core modules the kit script is generated
    from, never the kit script itself (the launcher runs it by name, in a child)."""
    graph = graph_of(PIPELINE)
    assert KIT_SCRIPT in graph  # the test reads the right folder
    importers = sorted(module for module, imported in graph.items() if KIT_SCRIPT in imported)
    assert importers == []


def test_the_kit_scripts_sources_import_the_standard_library_and_each_other_only():
    """What make_kit_script.py copies into the one-file kit: standard library at module level
    (torch inside functions), the core importing only the core."""
    core = set(make_kit_script.CORE)
    for path in make_kit_script.SOURCES:
        found = set()
        for node in ast.parse((PIPELINE.parent / path).read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                found.add(node.module.split(".")[0])
        outside = found - core - set(sys.stdlib_module_names) - {"__future__"}
        assert outside == set(), path
        if path.stem in core:
            assert imports(PIPELINE / path.name, modules_of(PIPELINE)) <= core, path


def test_a_module_that_imports_the_kit_script_is_found(tmp_path):
    (tmp_path / "mesure_memoire.py").write_text("")
    (tmp_path / "stage.py").write_text("def f():\n    from mesure_memoire import main\n")
    (tmp_path / "other.py").write_text("import stage\n")
    graph = graph_of(tmp_path)
    assert sorted(m for m, imported in graph.items() if KIT_SCRIPT in imported) == ["stage"]


def test_a_circle_is_found_even_through_an_import_inside_a_function(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import c\n")
    (tmp_path / "c.py").write_text("from a import x\n")
    (tmp_path / "d.py").write_text("import a\n")
    assert circles(graph_of(tmp_path)) == [{"a", "b", "c"}]
