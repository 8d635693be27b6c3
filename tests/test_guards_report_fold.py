"""report.drawn_rows folds a phase of many rows into its first row, drawn as it is, and one
bar of the largest of all the others: the second row is the first of those others
(`rest = rows[1:]`), and folding must not drop it."""

from __future__ import annotations

from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")
from pipeline.stages import report  # noqa: E402

MIB = 2**20
DECODE_ROWS = 14  # with one prefill row, 15 rows: more than report.MOST_ROWS (12), folded


def row(phase: str, mib: int, predicted_mib: int, repetition: int | None = None) -> dict:
    made = {"phase": phase, **dict.fromkeys(report.COUNTERS, mib * MIB)}
    if repetition is not None:
        made["repetition"] = repetition
    made["predicted"] = dict.fromkeys(report.COUNTERS, predicted_mib * MIB)
    return made


def phases() -> list[dict]:
    """decode 1 holds the largest values (drawn by itself, it is no part of the fold);
    decode 2, the first row folded, holds the largest of the others; decode 3-14 less."""
    decode = [row("decode", 50, 500, 1), row("decode", 40, 400, 2)]
    decode += [row("decode", 10 + n, 100 + n, n) for n in range(3, DECODE_ROWS + 1)]
    return [row("prefill", 5, 5), *decode]


def test_the_second_row_of_a_folded_phase_counts_in_its_largest_bar():
    """Guards `rest = rows[1:]`: with rows[2:] decode 2 is left out and the bar says 24 MiB
    (decode 14's), not 40."""
    rows = phases()
    drawn, folded = report.drawn_rows(rows)
    assert folded
    assert drawn[:2] == rows[:2]  # prefill, then decode 1 as it is
    assert drawn[2] == {
        "phase": f"decode 2-{DECODE_ROWS}, largest",
        **dict.fromkeys(report.COUNTERS, 40 * MIB),
        "predicted": dict.fromkeys(report.COUNTERS, 400 * MIB),
    }
    assert len(drawn) == 3


def test_the_picture_draws_the_second_rows_values_as_the_folded_bar():
    """The same through run_picture: six bars per counter, in MiB, at the folded label."""
    document = {
        "status": "completed",
        "configuration": {"batch": 1, "context": 16, "width": 64, "dtype": "float32"},
        "phases": phases(),
    }
    source = report.Source(Path("run"), "measurement.json", document, "0" * 64)
    figure = report.run_picture(source)
    try:
        [axes] = figure.axes
        labels = [t.get_text() for t in axes.get_xticklabels()]
        assert labels == ["prefill", "decode 1", f"decode 2-{DECODE_ROWS}, largest"]
        heights = [[bar.get_height() for bar in bars] for bars in axes.containers]
        assert heights == [[5.0, 50.0, 40.0]] * len(report.COUNTERS)
        predicted = [list(c.get_offsets()[:, 1]) for c in axes.collections]
        assert predicted == [[5.0, 500.0, 400.0]] * len(report.COUNTERS)
    finally:
        report.pyplot().close(figure)
