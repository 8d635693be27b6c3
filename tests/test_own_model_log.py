"""Own-model runs in the results logs: their row in resultats-own.csv, a failed run that is
never recorded, older logs that keep their bytes and stay valid, and merges of the three
headers. Own-model measurements here are made on the CPU standing in for the GPU
(runfixtures.own_model_run); the GPU tests measure real ones."""

from __future__ import annotations

import hashlib
import json

import pytest
import runfixtures
from conftest import run_script

from pipeline.artefacts import validate
from pipeline.stages import record

pytest.importorskip("torch")
REGISTRY = validate.load_registry()
OWN_LOG = "resultats-own.csv"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One inference run (the ResNet example) and one training run (AdamW on the decoder),
    recorded; the folder and its measurements."""
    runs_dir = tmp_path_factory.mktemp("runs")
    folders = [
        runfixtures.make_own_model_run(runs_dir, 0, runfixtures.RESNET),
        runfixtures.make_own_model_run(runs_dir, 1, runfixtures.DECODER_ADAMW),
    ]
    assert record.main([str(folder) for folder in folders]) == 0
    measurements = [json.loads((f / "measurement.json").read_bytes()) for f in folders]
    return runs_dir, folders, measurements


def rows_of(data: bytes) -> list[dict]:
    rows, problems = validate.parse_log(data, validate.own_model_header())
    assert problems == []
    return [row for _, row in rows]


def test_an_own_model_row_says_what_was_run_and_what_was_predicted(runs):
    runs_dir, folders, (resnet, adamw) = runs
    data = (runs_dir / OWN_LOG).read_bytes()
    assert data.splitlines()[0].decode() == ",".join(validate.own_model_header())
    inference, training = rows_of(data)
    source = runfixtures.WORKLOADS / "resnet_cnn.py"
    assert inference["run_id"] == folders[0].name
    assert inference["workload"] == "own"
    assert inference["workload_file"] == "resnet_cnn.py"  # the name, never the path
    assert inference["workload_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert inference["workload_function"] == "resnet"
    assert inference["workload_dims"] == "image=16 width=8 stages=2 blocks=1 classes=10"
    assert (inference["workload_mode"], training["workload_mode"]) == ("inference", "training")
    assert inference["parameter_bytes"] == str(resnet["workload"]["parameters"]["bytes"])
    assert inference["parameter_count"] == str(resnet["workload"]["parameters"]["count"])
    assert training["parameter_bytes"] == str(adamw["workload"]["parameters"]["bytes"])
    assert inference["prediction_status"] == resnet["prediction"]["status"] == "approximate"
    largest = max(resnet["summary"]["prediction"]["by_counter"].values())
    assert inference["largest_abs_difference_bytes"] == str(largest)
    assert (inference["batch"], inference["repeats"], inference["context"]) == ("2", "2", "")
    assert inference["cold_step_wall_ns"] == str(resnet["phases"][2]["wall_time_ns"])
    assert inference["optimizer_state_wall_ns"] == ""
    assert training["optimizer_state_wall_ns"] == str(adamw["phases"][3]["wall_time_ns"])
    assert str(runfixtures.WORKLOADS).encode() not in data
    assert not (runs_dir / "resultats-bruts.csv").exists()
    assert not (runs_dir / "resultats-decoder.csv").exists()


def test_the_own_model_log_and_its_run_folders_validate(runs):
    result = run_script("validate.py", str(runs[0]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{runs[0] / OWN_LOG}: valid" in result.stdout
    assert f"{runs[1][0] / 'measurement.json'}: valid" in result.stdout


def test_an_own_model_run_is_recorded_once(runs, capsys):
    assert record.main([str(runs[1][0])]) == 2
    assert "is already recorded, at line 2: a run is recorded once" in capsys.readouterr().err


def own_row(runs) -> dict:
    return rows_of((runs[0] / OWN_LOG).read_bytes())[0]


@pytest.mark.parametrize(
    ("column", "value", "error"),
    [
        ("width", "64", "$.width: '' was expected"),
        ("prompt", "16", "$.prompt: '' was expected"),
        ("optimizer_state_wall_ns", "5", "$.optimizer_state_wall_ns: '' was expected"),
        ("prediction_status", "not predicted", "$.largest_abs_difference_bytes: '' was expected"),
        ("workload_dims", "image=0", "$.workload_dims: 'image=0' does not match"),
        ("failed_phase", "prefill", "$.failed_phase: 'prefill' is not one of"),
        ("workload_file", "", "$.workload_file: '' should be non-empty"),
    ],
)
def test_an_own_model_row_breaking_its_workloads_rules_is_invalid(runs, column, value, error):
    row = own_row(runs)
    assert validate.schema_errors(row, validate.RESULTS_ROW, REGISTRY) == []
    row[column] = value
    errors = validate.schema_errors(row, validate.RESULTS_ROW, REGISTRY)
    assert any(e.startswith(error) for e in errors), errors


def test_a_network_or_decoder_row_claiming_own_model_cells_is_invalid():
    network = validate.as_header(runfixtures.make_row(0), validate.own_model_header())
    assert validate.schema_errors(network, validate.RESULTS_ROW, REGISTRY) == []
    network["workload_file"] = "model.py"
    assert validate.schema_errors(network, validate.RESULTS_ROW, REGISTRY) == [
        "$.workload_file: '' was expected"
    ]


FAILING = (
    "import torch\nfrom own_model import Workload\n\n"
    "def broken(config):\n"
    "    model = torch.nn.Linear(4, 4).to(config.device)\n"
    "    def make_inputs():\n"
    "        raise KeyError('no inputs')\n"
    "    return Workload(model, make_inputs)\n"
)


def test_a_failed_run_is_refused_by_record_and_no_log_appears(tmp_path, capsys):
    workload = tmp_path / "failing.py"
    workload.write_text(FAILING, encoding="utf-8")
    folder = tmp_path / "runs" / runfixtures.run_id(5)
    folder.mkdir(parents=True)
    assert runfixtures.own_model_run(folder, ["--workload", f"{workload}:broken"]) == 1
    capsys.readouterr()
    assert record.main([str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"record.py: error: {folder / 'measurement.json'}: the workload's own code raised "
        "KeyError: a failed run is not a measurement, never recorded\n"
    )
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


@pytest.mark.parametrize("header", ["kit", "decoder"])
def test_an_own_model_row_is_refused_by_a_log_without_its_columns(runs, tmp_path, header):
    row = own_row(runs)
    old = runfixtures.make_row(0)
    columns = validate.kit_header() if header == "kit" else validate.decoder_header()
    data = record.csv_line(columns) + record.csv_line(validate.as_header(old, columns).values())
    assert validate.append_refusal(data, row, REGISTRY, validate.Protocol()) == (
        "line 1: a header without the own-model columns: an own-model row goes to an own-model log"
    )
    log = tmp_path / OWN_LOG
    log.write_bytes(data)
    with pytest.raises(record.cli.UsageError, match="goes to an own-model log; nothing appended"):
        record.append_row(log, row, REGISTRY, validate.Protocol())
    assert log.read_bytes() == data


def test_older_logs_keep_their_bytes_and_merge_with_an_own_model_log(runs, tmp_path):
    kit_folder = runfixtures.make_run(tmp_path / "runs", 2)
    decoder_folder = runfixtures.make_decoder_run(tmp_path / "runs", 3)
    assert record.main([str(kit_folder), str(decoder_folder)]) == 0
    kit_log = tmp_path / "runs" / "resultats-bruts.csv"
    decoder_log = tmp_path / "runs" / "resultats-decoder.csv"
    before = {kit_log: kit_log.read_bytes(), decoder_log: decoder_log.read_bytes()}
    own_log = runs[0] / OWN_LOG
    merged = tmp_path / "team.csv"
    result = run_script(
        "merge.py", str(kit_log), str(decoder_log), str(own_log), "--output", str(merged)
    )
    assert result.returncode == 0, result.stderr
    assert {path: path.read_bytes() for path in before} == before
    rows = rows_of(merged.read_bytes())
    assert [row["workload"] for row in rows] == ["own", "own", "network", "decoder"]
    kit_row = rows_of(validate_kit_as_own(before[kit_log]))[0]
    assert rows[2] == kit_row  # every old cell kept, the other workloads' cells empty
    assert all(rows[3][column] == "" for column in validate.OWN_COLUMNS)
    assert run_script("validate.py", str(merged), str(kit_log), str(decoder_log)).returncode == 0


def validate_kit_as_own(data: bytes) -> bytes:
    """A kit log's rows written under the own-model log's header."""
    rows, _ = validate.parse_log(data, validate.kit_header())
    header = validate.own_model_header()
    lines = [record.csv_line(header)]
    lines += [record.csv_line(validate.as_header(r, header).values()) for _, r in rows]
    return b"".join(lines)


def test_an_own_model_row_built_matches_the_own_model_columns(runs):
    folder = runs[1][0]
    data = (folder / "measurement.json").read_bytes()
    row = record.build_own_model_row(folder.name, data, json.loads(data), "0" * 64)
    assert tuple(row) == validate.own_model_header()
