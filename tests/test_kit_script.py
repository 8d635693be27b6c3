"""The kit script: generated from the package (seed_network.py and the core), one file that
imports nothing of the pipeline. Its behaviour is tested by tests/test_mesure_memoire.py."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

import pytest
from conftest import PIPELINE, ROOT, run_script

from pipeline.kit import make_kit_script

SCRIPT = ROOT / "kit" / "mesure_memoire.py"


def sources() -> tuple[str, dict[str, str]]:
    own_part = (ROOT / make_kit_script.OWN_PART).read_text(encoding="utf-8")
    core = {
        name: (PIPELINE / "core" / f"{name}.py").read_text(encoding="utf-8")
        for name in make_kit_script.CORE
    }
    return own_part, core


def test_the_committed_kit_script_is_the_package_regenerated():
    """One source: after changing seed_network.py or a core module, run
    python -m pipeline.kit.make_kit_script (then make_notebook.py, and rebuild the manifest)."""
    assert make_kit_script.render(ROOT) == SCRIPT.read_bytes()


def definitions(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    return {
        node.name: ast.get_source_segment(source, node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
    }


def test_every_core_function_reads_the_same_in_the_kit_script():
    kit = definitions(SCRIPT.read_text(encoding="utf-8"))
    _, core = sources()
    for module, source in core.items():
        for name, code in definitions(source).items():
            assert kit[name] == code, f"{module}.{name}"


def test_the_kit_script_imports_the_standard_library_only():
    imported = set()
    for node in ast.parse(SCRIPT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)
    assert "pipeline" not in imported


def test_the_kit_script_runs_alone_in_an_empty_folder(tmp_path):
    """As a user gets it: one file, no pipeline beside it, no site-packages."""
    shutil.copyfile(SCRIPT, tmp_path / SCRIPT.name)
    result = subprocess.run(
        [sys.executable, "-I", SCRIPT.name, "estimate", "--phases", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert '"phases"' in result.stdout


# ---------------------------------------------------------------- the generator


def test_make_kit_script_check_mode(tmp_path):
    assert run_script("make_kit_script.py", "--check").returncode == 0
    for path in make_kit_script.SOURCES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, tmp_path / path)
    kit = tmp_path / make_kit_script.KIT_SCRIPT
    kit.parent.mkdir()
    kit.write_text(SCRIPT.read_text(encoding="utf-8").replace("GIB = 2**30", "GIB = 1 << 30"))
    stale = run_script("make_kit_script.py", "--check", "--root", str(tmp_path))
    assert stale.returncode == 1
    assert "stale" in stale.stdout
    assert run_script("make_kit_script.py", "--root", str(tmp_path)).returncode == 0
    assert kit.read_bytes() == SCRIPT.read_bytes()


def test_a_core_definition_no_line_places_is_reported():
    own_part, core = sources()
    core["writers"] += "\n\ndef forgotten() -> None:\n    pass\n"
    with pytest.raises(make_kit_script.KitSourceError, match=r"writers\.forgotten"):
        make_kit_script.generate(own_part, core)


def test_a_line_must_name_consecutive_definitions_all_their_names_in_order():
    own_part, core = sources()
    line = (
        "# from arguments: _matched, positive_int, non_negative_decimal, non_negative_int, "
        "device_index,\n#   add_defaulted"
    )
    assert line in own_part
    every = "_matched, positive_int, non_negative_decimal, non_negative_int, device_index"
    for names, problem in [
        ("_matched, positive_int, non_negative_int, device_index, add_defaulted", "consecutive"),
        (every.replace("positive_int, non_negative_decimal", "non_negative_decimal, positive_int")
         + ", add_defaulted", "in that order"),
        (f"{every}, add_defaulted, nowhere", "order"),
        ("nowhere", "not defined there"),
    ]:  # fmt: skip
        changed = own_part.replace(line, f"# from arguments: {names}")
        with pytest.raises(make_kit_script.KitSourceError, match=problem):
            make_kit_script.generate(changed, core)
    allocator = "#     ROUND_LARGE, MODELLED_ALLOCATOR"
    assert allocator in own_part  # a statement of three names: all three are named
    changed = own_part.replace(allocator, "#     MODELLED_ALLOCATOR")
    with pytest.raises(make_kit_script.KitSourceError, match="in that order"):
        make_kit_script.generate(changed, core)


def test_a_definition_placed_twice_or_defined_twice_is_refused():
    own_part, core = sources()
    line = "# from allocator_model: block_bytes, AllocatorModel"
    assert line in own_part
    twice = own_part.replace(line, f"{line}\n# from allocator_model: AllocatorModel")
    with pytest.raises(make_kit_script.KitSourceError, match="AllocatorModel placed twice"):
        make_kit_script.generate(twice, core)
    clash = own_part + "\n\ndef utc_now() -> str:\n    return ''\n"
    with pytest.raises(
        make_kit_script.KitSourceError, match="defined twice in the kit script: utc_now"
    ):
        make_kit_script.generate(clash, core)


@pytest.mark.parametrize(
    ("module", "line", "problem"),
    [
        ("writers", "import yaml", "imports yaml: the kit is standard library only"),
        ("phase_protocol", "import pipeline.core.arguments", "import core names with from"),
        ("phase_protocol", "from pipeline.core import arguments", "import core names with from"),
        ("writers", "from pipeline.stages import fit", "imports pipeline.stages: the kit is"),
    ],
)
def test_the_core_imports_the_standard_library_and_the_core_by_name(module, line, problem):
    own_part, core = sources()
    core[module] = core[module].replace("\nimport ", f"\n{line}\nimport ", 1)
    with pytest.raises(make_kit_script.KitSourceError, match=problem):
        make_kit_script.generate(own_part, core)


def test_the_kits_imports_are_the_union_sorted_as_ruff_sorts_them():
    kit = SCRIPT.read_text(encoding="utf-8")
    assert "from decimal import Context, Decimal, InvalidOperation\n" in kit
    plain = ("argparse", "datetime", "enum", "json", "os", "platform")
    assert "".join(f"\nimport {name}" for name in plain) + "\n" in kit
    assert "from allocator_model" not in kit
    assert "pipeline" not in "".join(line for line in kit.splitlines() if "import" in line)
