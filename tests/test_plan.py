"""plan.py: the largest value of one dimension each catalogue GPU holds, without a GPU. Each
answer is held to `fit`'s own rule on estimates made apart: the value fits, the next one
does not; a figure larger at a smaller value is said, never hidden."""

from __future__ import annotations

import json

import pytest
from test_own_model import HEADER, workload

from pipeline.measuring import own_model
from pipeline.stages import fit, plan

torch = pytest.importorskip("torch")

WIDE = HEADER + (
    "def wide(config, *, width=8):\n"
    # 8 MiB of weights a unit of width: larger than the allocator's rounding
    "    model = torch.nn.Linear(4096, 512 * width, bias=False, device=config.device)\n"
    "    def make_inputs():\n"
    "        return torch.randn(config.batch, 4096, device=config.device)\n"
    "    return Workload(model, make_inputs)\n"
)
# a buffer that shrinks as the value grows: a peak that is not monotone, and approximate
# (no --gpu: no calibration)
SHRINKING = HEADER + (
    "def shrinking(config, *, width=8):\n"
    "    model = torch.nn.Linear(16, 16).to(config.device)\n"
    "    model.register_buffer('held', torch.empty((64 // width) << 28, device=config.device))\n"
    "    def make_inputs():\n"
    "        return torch.randn(config.batch, 16, device=config.device)\n"
    "    return Workload(model, make_inputs)\n"
)


def planned(capsys, tmp_path, *argv) -> dict:
    code = plan.main(["--json", "--days", "7", "--runs-dir", str(tmp_path / "no-runs"), *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def need_at(capsys, spec: str, value: int) -> int:
    """fit's need for the estimate at this width, made apart (a process's own call)."""
    code = own_model.main(
        ["estimate", "--workload", spec, "--gpu", "h200", "--dim", f"width={value}", "--json"]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    return fit.traced_prediction_need(document, "w", "").peak_reserved_bytes


def test_each_gpus_answer_fits_and_the_next_value_does_not(capsys, tmp_path):
    (tmp_path / "no-runs").mkdir()
    spec = f"{workload(tmp_path, WIDE)}:wide"
    result = planned(capsys, tmp_path, "--search", "width", "--start", "2", "--", "--workload",
                     spec, "--gpu", "h200")  # fmt: skip
    assert result["search"] == "width"
    assert result["stopped"].endswith("past the largest GPU's memory")
    rows = {row["gpu"]: row for row in result["rows"]}
    assert len(rows) == 15
    checked = set()
    for row in result["rows"]:
        largest, usable = row["largest"], row["usable_memory_bytes"]
        if largest in checked:
            continue
        checked.add(largest)
        assert need_at(capsys, spec, largest) <= usable
        assert need_at(capsys, spec, largest + 1) > usable
        assert row["status"] == "exact"
    # a GPU with more memory holds at least as much
    ordered = sorted(result["rows"], key=lambda r: r["usable_memory_bytes"])
    assert [r["largest"] for r in ordered] == sorted(r["largest"] for r in ordered)


def test_a_figure_larger_at_a_smaller_value_is_said_and_stops_the_answer(capsys, tmp_path):
    (tmp_path / "no-runs").mkdir()
    spec = f"{workload(tmp_path, SHRINKING)}:shrinking"
    result = planned(capsys, tmp_path, "--search", "width", "--up-to", "16", "--", "--workload",
                     spec)  # fmt: skip
    assert not result["monotone"]
    assert result["not_monotone_as_predicted"][0].startswith("the predicted peak at 1 (")
    assert result["defects"] == []  # the bound follows the peak
    rows = {row["gpu"]: row for row in result["rows"]}
    # 16 GiB at width 4 fits an L4, but 64 GiB at width 1 does not: no answer below it
    assert rows["l4"]["largest"] is None
    assert rows["b200"]["largest"] == 16  # 64 GiB and less fit its memory


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--search", "batch", "--", "--workload", "W", "--batch", "4"],
         "--search batch: the estimate's options must not give batch"),
        (["--search", "width", "--", "--workload", "W", "--dim", "width=4"],
         "--search width: the estimate's options must not give width"),
        (["--search", "batch", "--", "--workload", "W", "--json"], "--json: the plan reads"),
        (["--search", "batch"], "the run to plan"),
        (["--search", "batch", "--start", "8", "--up-to", "4", "--", "--workload", "W"],
         "--start 8 is over --up-to 4"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line(capsys, tmp_path, argv, said):
    argv = [a.replace("W", f"{workload(tmp_path, WIDE)}:wide") if a == "W" else a for a in argv]
    assert plan.main(["--days", "7", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert said in err[0]


def test_a_first_value_the_estimate_refuses_is_said(capsys, tmp_path):
    spec = f"{workload(tmp_path, WIDE)}:wide"
    assert plan.main(["--days", "7", "--search", "nonsense", "--", "--workload", spec]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("plan.py: error: nonsense 1: ")


def test_the_picture_is_drawn_once_and_never_over_a_file(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "no-runs").mkdir()
    spec = f"{workload(tmp_path, WIDE)}:wide"
    picture = tmp_path / "plan.png"
    planned(capsys, tmp_path, "--search", "width", "--up-to", "64", "--picture", str(picture),
            "--", "--workload", spec, "--gpu", "h200")  # fmt: skip
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = picture.read_bytes()
    code = plan.main(
        ["--days", "7", "--search", "width", "--picture", str(picture), "--", "--workload", spec]
    )
    assert code == 2
    assert "exists; never overwritten" in capsys.readouterr().err
    assert picture.read_bytes() == before


def test_a_step_keeps_every_value_a_multiple_and_each_answer_its_last_that_fits(capsys, tmp_path):
    (tmp_path / "no-runs").mkdir()
    spec = f"{workload(tmp_path, WIDE)}:wide"
    result = planned(capsys, tmp_path, "--search", "width", "--step", "96", "--", "--workload",
                     spec, "--gpu", "h200")  # fmt: skip
    assert {point["value"] % 96 for point in result["points"]} == {0}
    assert result["points"][0]["value"] == 96  # --start is --step unless given
    for row in {r["largest"]: r for r in result["rows"]}.values():
        assert need_at(capsys, spec, row["largest"]) <= row["usable_memory_bytes"]
        assert need_at(capsys, spec, row["largest"] + 96) > row["usable_memory_bytes"]


def test_a_start_off_the_step_is_refused(capsys, tmp_path):
    spec = f"{workload(tmp_path, WIDE)}:wide"
    argv = ["--days", "7", "--search", "width", "--step", "8", "--start", "12", "--", "--workload"]
    assert plan.main([*argv, spec]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "plan.py: error: --start 12 is not a multiple of --step 8"
