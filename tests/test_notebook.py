"""The kit's notebook: generated from mesure_memoire.py, valid, empty, self-contained.

Its code runs here without a GPU (the estimate, then the clean stop of the measurement);
the GPU run is marked `gpu` and compares the notebook's measurement with the script's."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types

import nbformat
import pytest
from conftest import ROOT, run_script

from pipeline.artefacts import validate
from pipeline.kit import make_notebook

NOTEBOOK = ROOT / "data" / "mesure-memoire.ipynb"
RUNNER = ROOT / "tests" / "benchmarks" / "run_notebook.py"
SCRIPT = ROOT / "kit" / "mesure_memoire.py"


@pytest.fixture(scope="module")
def text() -> str:
    return NOTEBOOK.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def notebook(text) -> dict:
    return json.loads(text)


def code(notebook: dict) -> list[str]:
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def test_the_committed_notebook_is_the_script_regenerated():
    """One source: after changing mesure_memoire.py, run python -m pipeline.kit.make_notebook."""
    assert make_notebook.render(ROOT) == NOTEBOOK.read_bytes()


def test_valid_per_nbformat_and_already_in_its_canonical_form(text):
    parsed = nbformat.reads(text, as_version=4)
    nbformat.validate(parsed)
    assert nbformat.writes(parsed) + "\n" == text  # Jupyter's own writer changes nothing


def test_no_outputs_no_counts_no_interpreter_version_and_deterministic_ids(notebook):
    cells = notebook["cells"]
    assert [c["id"] for c in cells] == [f"cell-{n:02d}" for n in range(1, len(cells) + 1)]
    for cell in cells:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == []
            assert cell["execution_count"] is None
    assert notebook["metadata"] == {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    assert (notebook["nbformat"], notebook["nbformat_minor"]) == (4, 5)


def test_every_code_cell_follows_a_markdown_explanation(notebook):
    kinds = [c["cell_type"] for c in notebook["cells"]]
    assert kinds[0] == "markdown"
    for i, kind in enumerate(kinds):
        if kind == "code" and kinds[i - 1] == "code":  # a definition cell, then its run cell
            assert kinds[i - 2] == "markdown"


def test_the_notebook_never_imports_the_script_nor_parses_a_command_line(notebook):
    imported = set()
    for source in code(notebook):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module)
    assert "mesure_memoire" not in imported
    assert "argparse" not in imported
    joined = "\n".join(code(notebook))
    assert "import mesure_memoire" not in joined
    assert "from mesure_memoire" not in joined
    assert "sys.argv" not in joined
    assert "argparse" not in joined


def definitions(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    return {
        node.name: ast.get_source_segment(source, node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
    }


def test_every_function_of_the_script_is_in_the_notebook_verbatim_or_deliberately_left_out(
    notebook,
):
    script = definitions(SCRIPT.read_text(encoding="utf-8"))
    copied = definitions("\n\n".join(code(notebook)))
    assert set(script) - set(copied) == make_notebook.EXCLUDED
    for name, source in script.items():
        if name not in make_notebook.EXCLUDED:
            assert copied[name] == make_notebook.edited(source), name


def test_one_parameters_cell_with_the_script_defaults(notebook):
    tagged = [c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1
    values = {}
    for node in ast.parse("".join(tagged[0]["source"])).body:
        values[node.targets[0].id] = ast.literal_eval(node.value)
    for name in ("PARAMETERS", "BITS", "RESERVE_GIB", "DEVICE", "OUTPUT"):
        assert name in values
    defaults = make_notebook.measure_defaults(SCRIPT)
    assert {"batch", "context", "width", "dtype", "warmup", "repeats", "seed"} <= set(defaults)
    for name, value in defaults.items():
        assert values[name.upper()] == value


def cells_through_the_check(notebook: dict, **overrides) -> dict:
    """Run the code cells in one namespace, as a kernel would, up to the parameters check;
    `overrides` replace values of the parameters cell, as a user editing it would."""
    namespace: dict = {"__name__": "__main__"}
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        exec(compile("".join(cell["source"]), f"<{cell['id']}>", "exec"), namespace)
        if "parameters" in cell["metadata"].get("tags", []):
            namespace.update(overrides)
        if "ARGS" in namespace:
            return namespace
    raise AssertionError("no cell defines ARGS")


def test_the_namespace_gives_the_steps_what_the_command_line_gives_them(notebook):
    namespace = cells_through_the_check(notebook)
    args = namespace["ARGS"]
    assert isinstance(args, types.SimpleNamespace)
    parsed = make_notebook.measure_defaults(SCRIPT)
    for name, value in parsed.items():
        assert getattr(args, name) == value
    assert (args.device, args.device_text, args.output) == (0, "cuda:0", "mesures-notebook.json")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("BATCH", 0, "BATCH: expected a positive integer"),
        ("WIDTH", 64.0, "WIDTH: expected a positive integer"),
        ("SEED", -1, "SEED: expected an integer >= 0"),
        ("DTYPE", "float64", "DTYPE: expected one of"),
        ("DEVICE", "cpu", "DEVICE: expected cuda or cuda:N"),
        ("RESERVE_GIB", "1e3", "RESERVE_GIB: expected a decimal number"),
        ("OUTPUT", "", "OUTPUT: expected a new file name"),
    ],
)
def test_a_bad_parameter_stops_at_the_check(notebook, name, value, message):
    with pytest.raises(Exception, match=message) as caught:
        cells_through_the_check(notebook, **{name: value})
    assert type(caught.value).__name__ == "UsageError"


def test_run_top_to_bottom_without_a_gpu_estimates_then_stops_cleanly(tmp_path):
    output = tmp_path / "notebook.json"
    result = subprocess.run(
        [sys.executable, str(RUNNER), "--output", str(output)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "13.0385160446 GiB" in result.stdout  # step 1 ran
    assert result.stderr.count("\n") == 1  # one line, no traceback
    assert "no GPU is visible" in result.stderr or "PyTorch is not importable" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no measurement, not even a partial one


@pytest.mark.gpu
def test_on_a_gpu_the_notebook_measures_like_the_script(tmp_path):
    registry = validate.load_registry()
    config = ["--batch", "1", "--context", "16", "--width", "64", "--dtype", "float32"]
    config += ["--warmup", "1", "--repeats", "2", "--seed", "0"]
    by_notebook, by_script = tmp_path / "notebook.json", tmp_path / "script.json"
    result = subprocess.run(
        [sys.executable, str(RUNNER), "--device", "cuda:0", *config, "--output", str(by_notebook)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    script = run_script(
        "mesure_memoire.py", "measure", "--device", "cuda:0", *config, "--output", str(by_script)
    )
    assert script.returncode == 0, script.stderr
    documents = [json.loads(p.read_text()) for p in (by_notebook, by_script)]
    for document in documents:
        assert validate.validate_document(document, registry) == []
    assert documents[0]["schema"] == documents[1]["schema"]
    assert documents[0]["configuration"] == documents[1]["configuration"]
    phases = [[(r["phase"], r.get("repetition")) for r in d["phases"]] for d in documents]
    assert phases[0] == phases[1]
    assert len(phases[0]) == 6


# ---------------------------------------------------------------- the generator


def test_a_new_script_section_needs_its_explanation():
    source = SCRIPT.read_text(encoding="utf-8").replace(
        "\n\ndef exact_ratio(",
        "\n\n# ---------------------------------------------------------------- surprise\n\n"
        "def exact_ratio(",
    )
    with pytest.raises(make_notebook.StaleNotebook, match="surprise"):
        make_notebook.build_notebook(source, make_notebook.measure_defaults(SCRIPT))


def test_an_excluded_name_that_left_the_script_is_reported():
    source = SCRIPT.read_text(encoding="utf-8").replace("def device_index(", "def device_of(")
    with pytest.raises(make_notebook.StaleNotebook, match="device_index"):
        make_notebook.build_notebook(source, make_notebook.measure_defaults(SCRIPT))


def test_make_notebook_check_mode(tmp_path):
    assert run_script("make_notebook.py", "--check").returncode == 0
    (tmp_path / "kit").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "kit" / "mesure_memoire.py").write_bytes(SCRIPT.read_bytes())
    (tmp_path / "data" / "mesure-memoire.ipynb").write_text("{}")
    stale = run_script("make_notebook.py", "--check", "--root", str(tmp_path))
    assert stale.returncode == 1
    assert "stale" in stale.stdout
    assert run_script("make_notebook.py", "--root", str(tmp_path)).returncode == 0
    assert (tmp_path / "data" / "mesure-memoire.ipynb").read_bytes() == NOTEBOOK.read_bytes()
