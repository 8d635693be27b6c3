"""Build the kit: dist/iteragpu-lab-v1.zip with its nine members, and MANIFEST.json beside it.

    python -m pipeline.kit.archive            # what `make archive` and `nox -s archive` run

MEMBERS below is the one table that says where each of the nine members comes from; nothing
else knows. The zip holds exactly nine entries, `iteragpu-lab-v1/NAME`, and no directory
entry (unzip creates the folder), so "nine members" is literally true of the archive.

Byte-reproducible, as pypa/wheel and repro-zipfile do it: sorted names, each ZipInfo built
before writing, its time from SOURCE_DATE_EPOCH (clamped to the years a zip can hold; the
default is 2026-09-24T00:00:00Z, the catalogue snapshot day), a fixed mode (regular file,
0644), create_system 3 (Unix), DEFLATE at level 9, written with writestr into a seekable
buffer. Nothing of the clock, umask, user, locale or folder reaches the bytes. The zlib
library could (zlib-ng deflates differently): CPython 3.10 to 3.13 on zlib 1.2.13 agree.

Refuses a kit that is not clean: a source missing, resultats-bruts.csv with rows, a kit script
not regenerated from the package (make_kit_script.py), a notebook with outputs or not
regenerated from mesure_memoire.py, a tariff grid that is not 15 models x 3 durations.
Refuses to overwrite: an existing identical output is up to date, a different one is left
untouched and reported. MANIFEST.json is committed, like a lock file.

Exit codes: 0 built or up to date; 1 the kit is not clean; 2 bad input, or an existing
output differs (nothing is written then).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import io
import json
import os
import re
import stat
import sys
import time
import zipfile
from pathlib import Path

from pipeline.core import cli

ROOT = Path(__file__).resolve().parents[2]
KIT = "iteragpu-lab-v1"
FOLDER = f"{KIT}/"
ZIP_NAME = f"{KIT}.zip"
MANIFEST = "MANIFEST.json"
MANIFEST_SCHEMA = "urn:iteragpu-lab:schema:manifest:v1"

# The kit's nine members and their sources, relative to the repository root.
MEMBERS = {
    "README.md": "data/kit-README.md",
    "mesure-memoire.ipynb": "data/mesure-memoire.ipynb",
    "mesure_memoire.py": "kit/mesure_memoire.py",
    "protocole-qualite.md": "data/protocole-qualite.md",
    "resultats-bruts.csv": "data/resultats-bruts.csv",
    "calcul_forfaits.py": "pipeline/calcul_forfaits.py",
    "tarifs-forfaits.csv": "data/tarifs-forfaits.csv",
    "LICENSE.txt": "LICENSE.txt",
    MANIFEST: MANIFEST,  # written by this stage from the eight others
}
SELF_NOTE = "this file: listed without size or SHA-256, since a file cannot hold its own hash"

DEFAULT_EPOCH = 1_790_208_000  # 2026-09-24T00:00:00Z
ZIP_EPOCHS = (315_532_800, 4_354_819_198)  # 1980-01-01 to 2107-12-31, what a zip can hold
FILE_MODE = stat.S_IFREG | 0o644
COMPRESS_LEVEL = 9
TARIFF_MODELS, TARIFF_DURATIONS = 15, 3
PLACEHOLDER = re.compile(rb"<<[A-Z0-9-]+>>")  # text still to be written into the kit README


# ---------------------------------------------------------------- what a clean kit is
# (verify.py applies the same two content rules to a copy of the kit)


def results_problem(data: bytes) -> str | None:
    """resultats-bruts.csv ships as an empty grid: its header and no row."""
    try:
        text = data.decode("utf-8-sig")
        records = [row for row in csv.reader(io.StringIO(text, newline=""), strict=True) if row]
    except (UnicodeDecodeError, csv.Error) as exc:
        return f"not a readable CSV ({exc})"
    if not records or not any(cell.strip() for cell in records[0]):
        return "no header row"
    if len(records) > 1:
        return f"{len(records) - 1} filled row(s): the kit ships an empty grid (header only)"
    return None


def notebook_problem(data: bytes) -> str | None:
    """The notebook ships with no outputs, no execution counts, no interpreter version."""
    try:
        notebook = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        return f"not valid JSON ({exc})"
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list) or not all(isinstance(cell, dict) for cell in cells):
        return "no list of cells: not a notebook"
    for number, cell in enumerate(cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs") != [] or cell.get("execution_count") is not None:
            where = cell.get("id", f"number {number}")
            return f"cell {where} has saved outputs or an execution count: clear them"
    language = notebook.get("metadata", {}).get("language_info", {})
    if isinstance(language, dict) and "version" in language:
        return "its metadata records an interpreter version: regenerate it"
    return None


CONTENT_RULES = {"resultats-bruts.csv": results_problem, "mesure-memoire.ipynb": notebook_problem}


def tariff_problem(root: Path) -> str | None:
    """The shipped calcul_forfaits.py must accept the shipped grid, and the grid must be whole:
    15 models x 3 durations, as the catalogue is."""
    script = root / MEMBERS["calcul_forfaits.py"]
    spec = importlib.util.spec_from_file_location("_kit_calcul_forfaits", script)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        catalogue = module.load_tariffs(str(root / MEMBERS["tarifs-forfaits.csv"]))
    except Exception as exc:  # the script's InputError, or a script that cannot load the grid
        return f"calcul_forfaits.py refuses it: {exc}"
    models, rows = len(catalogue["models"]), len(catalogue["tariffs"])
    if (models, rows) != (TARIFF_MODELS, TARIFF_MODELS * TARIFF_DURATIONS):
        return (
            f"{rows} tariffs for {models} models: the kit ships {TARIFF_MODELS} models x "
            f"{TARIFF_DURATIONS} durations"
        )
    return None


def read_members(root: Path) -> tuple[dict[str, bytes], list[str]]:
    """The eight content members' bytes, and what is missing or not a plain file."""
    contents, problems = {}, []
    for name, source in sorted(MEMBERS.items()):
        if name == MANIFEST:
            continue
        path = root / source
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            problems.append(f"{name}: its source {source} is missing")
            continue
        if not stat.S_ISREG(mode):
            problems.append(f"{name}: its source {source} is not a regular file (or is a link)")
            continue
        contents[name] = path.read_bytes()
    return contents, problems


def kit_script_problem(root: Path, data: bytes) -> str | None:
    """The kit script ships as generated from the package (seed_network.py and the core
    modules), as the notebook ships as generated from the kit script."""
    from pipeline.kit import make_kit_script

    try:
        fresh = make_kit_script.render(root) == data
    except (OSError, SyntaxError, make_kit_script.KitSourceError) as exc:
        return f"cannot be generated ({exc})"
    if not fresh:
        return (
            "not generated from the package's modules: run python -m pipeline.kit.make_kit_script"
        )
    return None


def kit_problems(root: Path, contents: dict[str, bytes]) -> list[str]:
    """Everything that keeps these sources from being shipped, one line each."""
    problems = []
    for name, rule in CONTENT_RULES.items():
        problem = rule(contents[name]) if name in contents else None
        if problem:
            problems.append(f"{name}: {problem}")
    if "mesure_memoire.py" in contents:
        problem = kit_script_problem(root, contents["mesure_memoire.py"])
        if problem:
            problems.append(f"mesure_memoire.py: {problem}")
    if "mesure-memoire.ipynb" in contents and "mesure_memoire.py" in contents:
        from pipeline.kit import make_notebook

        try:
            fresh = make_notebook.render(root) == contents["mesure-memoire.ipynb"]
        except (make_notebook.StaleNotebook, SyntaxError, SystemExit) as exc:
            problems.append(f"mesure-memoire.ipynb: cannot be generated ({exc})")
        else:
            if not fresh:
                problems.append(
                    "mesure-memoire.ipynb: not generated from the current mesure_memoire.py: "
                    "run python -m pipeline.kit.make_notebook"
                )
    if "calcul_forfaits.py" in contents and "tarifs-forfaits.csv" in contents:
        problem = tariff_problem(root)
        if problem:
            problems.append(f"tarifs-forfaits.csv: {problem}")
    return problems


# ---------------------------------------------------------------- the two outputs


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_bytes(contents: dict[str, bytes]) -> bytes:
    """Deterministic JSON: sorted keys, members sorted by name, indent 2, final newline."""
    members = [
        {"name": name, "note": SELF_NOTE}
        if name == MANIFEST
        else {"name": name, "size": len(contents[name]), "sha256": sha256(contents[name])}
        for name in sorted(MEMBERS)
    ]
    document = {
        "schema": MANIFEST_SCHEMA,
        "kit": KIT,
        "folder": FOLDER,
        "hash": "sha256",
        "members": members,
    }
    return (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def source_date_epoch(environ=os.environ) -> int:
    """SOURCE_DATE_EPOCH (reproducible-builds.org), clamped to what a zip can hold."""
    text = environ.get("SOURCE_DATE_EPOCH")
    if text is None:
        return DEFAULT_EPOCH
    if not re.fullmatch(r"[0-9]{1,12}", text):
        raise cli.UsageError(
            f"SOURCE_DATE_EPOCH={text!r}: expected whole seconds since 1970-01-01 UTC"
        )
    return min(max(int(text), ZIP_EPOCHS[0]), ZIP_EPOCHS[1])


def zip_bytes(contents: dict[str, bytes], epoch: int) -> bytes:
    """The archive, in memory (seekable, so no data descriptors): same inputs, same bytes."""
    date_time = time.gmtime(epoch)[:6]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(contents):
            info = zipfile.ZipInfo(FOLDER + name, date_time=date_time)
            info.create_system = 3
            info.external_attr = FILE_MODE << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, contents[name], zipfile.ZIP_DEFLATED, COMPRESS_LEVEL)
    return buffer.getvalue()


def changed_members(old: bytes, new: bytes) -> str:
    """Which members a stale MANIFEST.json disagrees on, to make the refusal actionable."""
    try:
        before = {m["name"]: m for m in json.loads(old)["members"]}
        after = {m["name"]: m for m in json.loads(new)["members"]}
    except (ValueError, KeyError, TypeError):
        return "it is not a manifest this stage wrote"
    names = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    return f"members changed: {', '.join(names)}" if names else "its formatting differs"


def up_to_date(path: Path, data: bytes, advice: str) -> bool:
    """True if `path` already holds exactly `data`; False if absent; UsageError otherwise."""
    if not os.path.lexists(path):
        return False
    if path.is_symlink() or not path.is_file():
        raise cli.UsageError(f"{path} exists and is not a regular file: {advice}")
    current = path.read_bytes()
    if current == data:
        return True
    reason = changed_members(current, data) if path.name == MANIFEST else "other bytes"
    raise cli.UsageError(f"{path} exists with different content ({reason}): {advice}")


def publish(path: Path, data: bytes, advice: str) -> None:
    """Whole file or nothing, and never over another (the umask applies)."""
    try:
        cli.write_new(path, data)
    except FileExistsError:  # appeared since the check: the same rule again
        up_to_date(path, data, advice)


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(prog="archive.py", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository to pack (this one)")
    parser.add_argument("--dist", type=Path, help="folder for the zip (default: ROOT/dist)")
    return cli.run("archive.py", lambda: build(parser.parse_args(argv)))


def build(args: argparse.Namespace) -> int:
    """Check the sources, then write whatever of the two outputs is not there yet."""
    epoch = source_date_epoch()
    root = args.root
    dist = args.dist if args.dist is not None else root / "dist"
    if not root.is_dir():
        raise cli.UsageError(f"--root {root}: not a folder")
    contents, problems = read_members(root)
    problems += kit_problems(root, contents)
    if problems:
        for problem in problems:
            print(f"archive.py: not clean: {problem}", file=sys.stderr)
        print("archive.py: nothing was written", file=sys.stderr)
        return cli.INVALID
    manifest = manifest_bytes(contents)
    from pipeline.artefacts import (
        validate,  # jsonschema, only now: the manifest is checked like every artefact
    )

    errors = validate.validate_document(json.loads(manifest), validate.load_registry())
    if errors:
        raise cli.UsageError(f"the manifest fails its schema: {errors[0]}")
    contents[MANIFEST] = manifest
    archive = zip_bytes(contents, epoch)
    rebuild = "move it away, then run make archive again (dist/ is not versioned)"
    relock = (
        "if the change is intended, delete MANIFEST.json and the zip, run make archive, "
        "review and commit the new MANIFEST.json"
    )
    outputs = [(root / MANIFEST, manifest, relock), (dist / ZIP_NAME, archive, rebuild)]
    states = [up_to_date(path, data, advice) for path, data, advice in outputs]
    dist.mkdir(exist_ok=True)
    for (path, data, advice), same in zip(outputs, states, strict=True):
        if not same:
            publish(path, data, advice)
        print(f"{shown(path)}: {'up to date' if same else 'written'}")
    print(
        f"{shown(dist / ZIP_NAME)}: sha256 {sha256(archive)}, {len(contents)} members in "
        f"{FOLDER}, SOURCE_DATE_EPOCH {epoch}"
    )
    for placeholder in sorted(set(PLACEHOLDER.findall(contents["README.md"]))):
        print(f"archive.py: warning: README.md still holds {placeholder.decode()}: fill it in")
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
