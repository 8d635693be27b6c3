"""GPU calibration files against schemas/gpu-calibration.schema.json: every committed file
whole, and a file that is not one refused in one line where `--gpu` reads it."""

from __future__ import annotations

import json

import pytest

from pipeline.core import cli
from pipeline.predicting import gpu_calibration

pytest.importorskip("jsonschema")

COMMITTED = sorted(gpu_calibration.FOLDER.glob("*.json"))


def test_every_gpu_the_lab_knows_has_its_file():
    assert {gpu_calibration.FOLDER / name for name in gpu_calibration.KNOWN.values()} <= set(
        COMMITTED
    )


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: path.name)
def test_each_committed_calibration_holds_to_its_schema_whole(path):
    gpu_calibration.check(json.loads(path.read_text()), path, whole=True)


def h200() -> dict:
    return json.loads((gpu_calibration.FOLDER / gpu_calibration.KNOWN["h200"]).read_text())


def broken_step(document: dict) -> dict:
    key = next(iter(document["signatures"]))
    document["signatures"][key]["template"].append({"kind": "scratch", "bytes": 512})
    return document


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d | {"schema": "iteragpu-lab/gpu-calibration/v0"}, "at schema:"),
        (lambda d: {k: v for k, v in d.items() if k != "gpu"}, "'gpu' is a required property"),
        (lambda d: d | {"signatures": []}, "at signatures:"),
        (lambda d: d | {"workspaces_per_thread": "yes"}, "at workspaces_per_thread:"),
    ],
)
def test_a_file_that_is_not_a_calibration_is_refused_in_one_line_where_it_is_loaded(
    tmp_path, monkeypatch, change, said
):
    path = tmp_path / "nvidia-h200-torch-2.11.0+cu130.json"
    path.write_text(json.dumps(change(h200())))
    monkeypatch.setattr(gpu_calibration, "FOLDER", tmp_path)
    with pytest.raises(cli.UsageError) as raised:
        gpu_calibration.load("h200")
    [line] = str(raised.value).splitlines()
    assert line.startswith(f"{path}: not a GPU calibration (iteragpu-lab/gpu-calibration/v1)")
    assert said in line, line


def test_an_entry_out_of_its_schema_is_found_when_the_whole_file_is_checked(tmp_path):
    path = tmp_path / "built.json"
    with pytest.raises(cli.UsageError) as raised:
        gpu_calibration.check(broken_step(h200()), path, whole=True)
    assert "at signatures/" in str(raised.value)
    gpu_calibration.check(broken_step(h200()), path)  # the top level alone: a loaded file's


def test_a_file_that_is_not_json_is_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / gpu_calibration.KNOWN["h200"]).write_text('{"schema": ')
    monkeypatch.setattr(gpu_calibration, "FOLDER", tmp_path)
    with pytest.raises(cli.UsageError, match="not JSON"):
        gpu_calibration.load("h200")
