"""The pipeline's modules import each other without going round in circles, and only from
their own floor or the floors below it (pipeline.FLOORS, bottom first): a module that needs
another's code at load or at call time, read from its source (imports inside functions
count: they are circles all the same, only deferred). The kit scripts are leaves: they
import nothing of the pipeline, no pipeline module imports mesure_memoire.py, and the core
it is generated from imports only the standard library and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import pipeline
from pipeline.kit import make_kit_script

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipeline"


def module_name(path: Path, root: Path) -> str:
    """pipeline/core/cli.py: pipeline.core.cli."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str], root: Path) -> set[str]:
    """The modules of `modules` that the file imports, by their dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return (found & modules) - {module_name(path, root)}


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


def graph_of(root: Path, packages=("pipeline", "kit")) -> dict[str, set[str]]:
    """Each module of the packages under `root` and the modules of them that it imports."""
    paths = [
        path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
        if path.name != "__init__.py"
    ]
    modules = {module_name(path, root) for path in paths}
    return {module_name(path, root): imports(path, modules, root) for path in paths}


GRAPH = graph_of(ROOT)
PACKAGE = {name: imported for name, imported in GRAPH.items() if name.startswith("pipeline.")}
KIT_SCRIPTS = {"pipeline.calcul_forfaits"}
# The example workload files are a user's, loaded by path: they import `own_model` by name.
EXAMPLES = {name for name in PACKAGE if name.split(".")[-1] in
            ("decoder_training", "resnet_cnn", "vit_encoder")}  # fmt: skip


def floor(module: str) -> int:
    return pipeline.FLOORS.index(module.split(".")[1])


def test_every_module_sits_on_a_floor():
    stray = set(PACKAGE) - KIT_SCRIPTS - {m for m in PACKAGE if m.split(".")[1] in pipeline.FLOORS}
    assert stray == set()
    assert {module.split(".")[1] for module in PACKAGE} - {"calcul_forfaits"} \
        == set(pipeline.FLOORS)  # fmt: skip


def test_the_pipeline_has_no_import_circle():
    assert circles(PACKAGE) == []


def test_no_module_imports_from_a_floor_above_its_own():
    upward = sorted(
        (module, other)
        for module, imported in PACKAGE.items()
        if module not in KIT_SCRIPTS
        for other in imported
        if other not in KIT_SCRIPTS and floor(other) > floor(module)
    )
    assert upward == []


def test_the_kit_scripts_import_nothing_of_the_pipeline_and_no_module_imports_the_kit_script():
    """The kit is a leaf: the pipeline shares the core modules mesure_memoire.py is generated
    from, never the script (the launcher runs it by name, in a child); calcul_forfaits.py is
    the one source of the prices fit and report quote."""
    assert all(GRAPH[script] == set() for script in (*KIT_SCRIPTS, "kit.mesure_memoire"))
    importers = sorted(m for m, imported in PACKAGE.items() if "kit.mesure_memoire" in imported)
    assert importers == []
    assert "pipeline.measuring.launcher" in PACKAGE  # the test reads the right folder


def test_the_example_workloads_import_what_a_users_file_imports():
    assert len(EXAMPLES) == 3
    assert all(PACKAGE[example] == set() for example in EXAMPLES)


def core(name: str) -> str:
    return f"pipeline.core.{name}"


def test_validate_reads_the_stages_facts_from_below_them():
    """validate is the floor under the stages: their facts live in modules it imports that
    import no stage; the stages import validate (to read a file), never the reverse."""
    assert PACKAGE["pipeline.workloads.decoder_rules"] == set()  # standard library only
    assert PACKAGE["pipeline.workloads.own_model_facts"] <= {
        core("allocator_model"),
        core("phase_protocol"),
        core("run_status"),
        core("prediction_status"),
    }
    assert PACKAGE[core("workload_contract")] == set()  # the workload's contract: a leaf
    assert "pipeline.measuring.own_model" not in PACKAGE["pipeline.workloads.hf_model"]


def test_the_leaves_of_the_core_import_nothing():
    leaves = ("call_keys", "torch_private", "workload_kinds", "arguments", "allocator_model")
    for leaf in (*leaves, "run_status", "prediction_status"):
        assert PACKAGE[core(leaf)] == set(), leaf
    assert PACKAGE["pipeline.workloads.decoder_shape"] == set()  # standard library only
    assert (
        "pipeline.predicting.gpu_calibration" not in PACKAGE["pipeline.predicting.trace_prediction"]
    )


def test_the_kit_scripts_sources_import_the_standard_library_and_each_other_only():
    """What make_kit_script.py copies into the one-file kit: standard library at module level
    (torch inside functions), the core importing only the core."""
    kit_core = {core(name) for name in make_kit_script.CORE}
    for path in make_kit_script.SOURCES:
        found = set()
        for node in ast.parse((ROOT / path).read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.module.startswith("pipeline."):
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                assert node.module in kit_core, path
        assert found - set(sys.stdlib_module_names) - {"__future__"} == set(), path
        module = module_name(ROOT / path, ROOT)
        if module in kit_core:
            assert PACKAGE[module] <= kit_core, path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"p/a.py": "import p.b\n", "p/b.py": "def f():\n    from p import c\n",
          "p/c.py": "from p.a import x\n", "p/d.py": "import p.a\n"}, [{"p.a", "p.b", "p.c"}]),
        ({"p/a.py": "from p import b\n", "p/b.py": "x = 1\n"}, []),
    ],
)  # fmt: skip
def test_a_circle_is_found_even_through_an_import_inside_a_function(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert circles(graph_of(tmp_path, ("p",))) == expected


def test_an_upward_import_is_seen(tmp_path):
    (tmp_path / "pipeline" / "core").mkdir(parents=True)
    (tmp_path / "pipeline" / "stages").mkdir()
    (tmp_path / "pipeline" / "core" / "low.py").write_text("from pipeline.stages import high\n")
    (tmp_path / "pipeline" / "stages" / "high.py").write_text("from pipeline.core import low\n")
    graph = graph_of(tmp_path)
    assert graph["pipeline.core.low"] == {"pipeline.stages.high"}
    assert floor("pipeline.stages.high") > floor("pipeline.core.low")


def test_the_stages_that_judge_a_prediction_import_nothing_of_the_trace():
    """validate, fit, report and plan read a prediction's words (core/prediction_status.py):
    the trace and its operator modules are not imported for them."""
    import subprocess

    code = (
        "import sys\n"
        "import pipeline.artefacts.validate, pipeline.stages.fit, pipeline.stages.report\n"
        "import pipeline.stages.plan\n"
        "print([m for m in sys.modules if m.startswith('pipeline.predicting')])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(pipeline.__file__).parent.parent,
    )  # fmt: skip
    assert done.stdout.strip() == "[]"
