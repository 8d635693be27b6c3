"""The documentation a new user reads: the README's first screen is the model user's path,
the user guide says plainly what is supported and what is not, and the evidence (the run
folders and their scores) is on one page of its own."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

DOCS = ROOT / "docs"
FIRST_SCREEN = 40  # lines
RUN_FOLDER = re.compile(r"runs/(\d{8}T\d{6}Z-[\w.-]+)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readmes_first_screen_is_install_predict_fit_measure_then_tests():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    screen = "\n".join(lines[:FIRST_SCREEN])
    steps = [
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
        'pip install ".[predict]"',
        "iteragpu predict --hf-config config.json",
        "iteragpu fit predicted.json",
        "iteragpu measure --device cuda:0",
    ]
    where = [screen.find(step) for step in steps]
    assert -1 not in where, dict(zip(steps, where, strict=True))
    assert where == sorted(where)
    text = "\n".join(lines)
    assert text.find("make test") > text.find("iteragpu measure --device cuda:0")


SUPPORT_ROWS = {  # the row's first cell: what its "not supported" cell must name
    "Tasks": None,
    "Dtypes": None,
    "Mixed precision": "FP8",
    "Optimizers": "8-bit",
    "Gradient accumulation": None,
    "Quantization": "8-bit",
    "Attention implementations": "flash_attention_2",
    "GPUs": "H200",
    "Several GPUs": "one GPU",
}


def test_the_user_guide_has_a_supported_and_not_supported_table():
    text = (DOCS / "user-guide.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3:
            rows[cells[0]] = cells[1:]
    assert rows.get("") == ["Supported", "Not supported yet"] or rows.get("What") == [
        "Supported",
        "Not supported yet",
    ]
    for name, named in SUPPORT_ROWS.items():
        assert name in rows, name
        if named:
            assert named in rows[name][1], (name, rows[name])


def test_the_user_guide_gives_one_install_command_per_job():
    text = (DOCS / "user-guide.md").read_text(encoding="utf-8")
    for command in (
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
        'pip install ".[predict]"',
        'pip install ".[report]"',
        "pip install .",
    ):
        assert command in text, command


def test_the_evidence_is_one_page_and_the_guides_cite_no_run_folder():
    """docs/evidence.md indexes the run folders; the other pages link to it instead."""
    evidence = (DOCS / "evidence.md").read_text(encoding="utf-8")
    cited = set(RUN_FOLDER.findall(evidence))
    assert len(cited) >= 30
    missing = sorted(name for name in cited if not (ROOT / "runs" / name.split("/")[0]).is_dir())
    assert missing == []
    for page in ("hugging-face.md", "user-guide.md"):
        assert RUN_FOLDER.findall((DOCS / page).read_text(encoding="utf-8")) == [], page
    assert "docs/evidence.md" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "page", [*sorted(p.name for p in DOCS.glob("*.md")), "../README.md"], ids=str
)
def test_every_link_of_a_page_leads_to_a_file_that_exists(page):
    path = (DOCS / page).resolve()
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{page}: {target}"


def test_the_user_guides_sentences_are_short():
    """Sentences a user reads once: on average under 25 words, none over 45."""
    text = (DOCS / "user-guide.md").read_text(encoding="utf-8")
    prose = "\n".join(
        line for line in re.sub(r"```.*?```", "", text, flags=re.S).splitlines()
        if line and not line.startswith(("|", "#"))
    )  # fmt: skip
    sentences = [s for s in re.split(r"(?<=[.!?:])\s+(?=[A-Z`])", prose) if s.strip()]
    words = [len(sentence.split()) for sentence in sentences]
    assert sum(words) / len(words) < 25
    assert max(words) <= 45, max(zip(words, sentences, strict=True))
