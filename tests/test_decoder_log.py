"""Decoder runs in the results logs: a decoder file's facts, its row, and logs written before
the decoder that stay valid and merge with decoder logs. Decoder measurements here are
synthesised (runfixtures.decoder_measurement); the GPU tests measure real ones."""

from __future__ import annotations

import copy
import json

import pytest
import runfixtures
from conftest import RUNS, run_script

from pipeline.artefacts import validate
from pipeline.stages import record

REGISTRY = validate.load_registry()
DECODER_LOG = "resultats-decoder.csv"


def errors_of(document: dict) -> list[str]:
    return validate.validate_json(json.dumps(document).encode(), REGISTRY)


@pytest.fixture(scope="module")
def measured() -> dict:
    return runfixtures.decoder_measurement(runfixtures.TINY_DECODER)


def test_a_decoder_measurement_and_prediction_are_valid(measured):
    assert errors_of(measured) == []
    oom = runfixtures.decoder_measurement(runfixtures.TINY_DECODER, memory_bytes=1_000_000)
    assert oom["status"] == "out_of_memory"
    assert errors_of(oom) == []


def break_counter(d):
    d["phases"][2]["allocated_bytes"] = d["phases"][2]["reserved_bytes"] + 512


def swap_rows(d):  # two decode rows: the schema sees decode rows alike, the plan does not
    d["phases"][4], d["phases"][5] = d["phases"][5], d["phases"][4]


def drop_last(d):
    d["phases"].pop()
    d["summary"]["phases_completed"] -= 1


def wrong_difference(d):
    d["summary"]["prediction"]["by_counter"]["reserved_bytes"] = 512


def wrong_peak(d):
    d["summary"]["largest_peak_reserved_bytes"] += 1


def wrong_cache(d):
    d["cache"]["positions"] += 1


def predicted_peak_below_end(d):
    d["phases"][3]["predicted"]["peak_reserved_bytes"] = 0


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (break_counter, "$.phases[2]: allocated_bytes "),
        (
            swap_rows,
            "$.phases: 6 rows, the plan of prompt 16, new_tokens 4, warmup 1, "
            "tokens_per_row 1 has 6 (row 4 is ('decode', 2",
        ),
        (drop_last, "$.phases: 5 rows, the plan of prompt 16, new_tokens 4, warmup 1, "),
        (wrong_difference, "$.summary.prediction.by_counter.reserved_bytes: 512, the rows give 0"),
        (wrong_peak, "$.summary.largest_peak_reserved_bytes: 35651585, but the rows give 35651584"),
        (wrong_cache, "$.cache.positions: 21, not prompt + new_tokens 20"),
        (predicted_peak_below_end, "$.phases[3].predicted: peak_reserved_bytes 0 < "),
    ],
    ids=lambda value: getattr(value, "__name__", "")[:20] or None,
)
def test_a_decoder_file_whose_facts_disagree_is_invalid(measured, damage, message):
    document = copy.deepcopy(measured)
    damage(document)
    errors = errors_of(document)
    assert any(error.startswith(message) for error in errors), errors


def test_an_out_of_memory_decoder_file_stops_at_the_next_planned_row():
    oom = runfixtures.decoder_measurement(runfixtures.TINY_DECODER, memory_bytes=1_000_000)
    oom["failure"]["phase"] = "prefill"
    assert errors_of(oom) == [
        "$.failure: 'prefill' repetition None, but the next planned row is 'model_load' "
        "repetition None"
    ]


def test_a_decoder_run_is_recorded_in_the_decoder_log_with_its_columns(tmp_path):
    folder = runfixtures.make_decoder_run(tmp_path, 1)
    result = run_script("record.py", str(folder))
    assert result.returncode == 0, result.stderr
    data = (tmp_path / DECODER_LOG).read_bytes()
    assert data.splitlines()[0].decode() == ",".join(validate.decoder_header())
    [(_, row)], problems = validate.parse_log(data, validate.decoder_header())
    assert problems == []
    measurement = json.loads((folder / "measurement.json").read_bytes())
    assert row["largest_peak_reserved_bytes"] == "35651584"
    assert (row["repeats"], row["inputs_wall_ns"], row["warm_forward_median_wall_ns"]) == ("",) * 3
    assert row["prefill_wall_ns"] == str(measurement["phases"][2]["wall_time_ns"])
    assert row["decode_wall_ns"] == str(2_000_000 + 1000 * 4 + 2_000_000 + 1000 * 5)
    assert row["largest_abs_difference_bytes"] == "0"
    assert run_script("validate.py", str(tmp_path)).returncode == 0
    again = run_script("record.py", str(folder))
    assert again.returncode == 2
    assert "is already recorded, at line 2" in again.stderr


def test_a_decoder_row_is_refused_by_a_log_without_the_decoder_columns(tmp_path):
    folder = runfixtures.make_decoder_run(tmp_path, 1)
    log = tmp_path / DECODER_LOG
    log.write_bytes(runfixtures.log_bytes([runfixtures.make_row(0)]))  # the kit's header
    before = log.read_bytes()
    result = run_script("record.py", str(folder))
    assert result.returncode == 2
    assert "without the decoder columns: a decoder row goes to a decoder log" in result.stderr
    assert log.read_bytes() == before


def test_a_network_row_in_a_decoder_log_reads_workload_network(tmp_path):
    decoder_run = runfixtures.make_decoder_run(tmp_path, 1)
    assert run_script("record.py", str(decoder_run)).returncode == 0
    network = runfixtures.make_run(tmp_path, 2)
    (tmp_path / DECODER_LOG).rename(tmp_path / "resultats-bruts.csv")
    assert run_script("record.py", str(network)).returncode == 0
    data = (tmp_path / "resultats-bruts.csv").read_bytes()
    rows, problems = validate.parse_log(data, validate.decoder_header())
    assert problems == []
    assert [row["workload"] for _, row in rows] == ["decoder", "network"]
    assert all(rows[1][1][column] == "" for column in validate.DECODER_COLUMNS[1:])


def test_a_network_row_claiming_decoder_cells_is_invalid():
    row = validate.as_header(runfixtures.make_row(0), validate.decoder_header())
    assert validate.schema_errors(row, validate.RESULTS_ROW, REGISTRY) == []
    row["prompt"] = "16"
    assert validate.schema_errors(row, validate.RESULTS_ROW, REGISTRY) == [
        "$.prompt: '' was expected"
    ]


COMMITTED_LOGS = sorted(RUNS.glob("**/resultats-bruts.csv"))


@pytest.mark.parametrize("old", COMMITTED_LOGS, ids=lambda p: str(p.relative_to(RUNS)))
def test_a_committed_log_stays_valid_and_merges_with_a_decoder_log(tmp_path, old):
    before = old.read_bytes()
    assert run_script("validate.py", str(old)).returncode == 0
    folder = runfixtures.make_decoder_run(tmp_path / "runs", 1)
    assert run_script("record.py", str(folder)).returncode == 0
    new = tmp_path / "runs" / DECODER_LOG
    merged = tmp_path / "team.csv"
    result = run_script("merge.py", str(old), str(new), "--output", str(merged))
    assert result.returncode == 0, result.stderr
    assert old.read_bytes() == before
    rows, problems = validate.parse_log(merged.read_bytes(), validate.decoder_header())
    assert problems == []
    old_rows, _ = validate.parse_log(before, validate.kit_header())
    assert len(rows) == len(old_rows) + 1
    by_id = {row["run_id"]: row for _, row in rows}
    for _, row in old_rows:  # every old cell kept; the decoder cells empty
        assert by_id[row["run_id"]] == validate.as_header(row, validate.decoder_header())
        assert by_id[row["run_id"]]["workload"] == "network"
    assert by_id[folder.name]["workload"] == "decoder"
    assert run_script("validate.py", str(merged)).returncode == 0


def test_logs_of_the_kit_header_alone_merge_into_the_kit_header(tmp_path):
    a = tmp_path / "a.csv"
    a.write_bytes(runfixtures.log_bytes([runfixtures.make_row(0)]))
    out = tmp_path / "out.csv"
    assert run_script("merge.py", str(a), "--output", str(out)).returncode == 0
    assert out.read_bytes() == a.read_bytes()


def test_a_decoder_row_built_matches_the_decoder_columns(measured):
    data = json.dumps(measured).encode()
    row = record.build_decoder_row(runfixtures.run_id(3), data, measured, "0" * 64)
    assert tuple(row) == validate.decoder_header()
    assert validate.schema_errors(row, validate.RESULTS_ROW, REGISTRY) == []
