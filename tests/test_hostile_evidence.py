"""Evidence a hostile or careless hand has changed: a calibration whose blocks no GPU can
allocate, an environment a GPU of its model cannot have, an environment.json that says
another thing than the measurement beside it. `--calibration`, fit, record and validate
apply the same rules (validate.py), and refuse or leave out such a file in one line."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import runfixtures
from conftest import ROOT, RUNS, call_main, run_script

from pipeline.measuring import own_model
from pipeline.stages import fit

OWN_RUN = RUNS / "20261203T131050Z-own-model-chain" / "20261203T131050Z-74623e"
LARGE_RUN = RUNS / "20261202T112323Z-50900d"  # a kit run on the H200
LLAMA = runfixtures.LLAMA_1B
SMALL = runfixtures.SMALL_LLAMA


def measurement() -> dict:
    return json.loads((OWN_RUN / "measurement.json").read_bytes())


@pytest.mark.parametrize("size", [10**30, 150_109_880_321])
def test_a_calibration_with_a_block_larger_than_its_gpu_is_refused(capsys, tmp_path, size):
    pytest.importorskip("transformers")
    document = measurement()
    document["calibration"]["operators"][0]["template"][1]["bytes"] = size
    calibration = tmp_path / "m.json"
    calibration.write_text(json.dumps(document))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL))
    code = own_model.main(
        ["estimate", "--hf-config", str(config), "--dim", "sequence=8", "--calibration",
         str(calibration)]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, ""), captured.err
    assert captured.err == (
        f"own_model.py: error: {calibration}: $.calibration.operators[0].template[1].bytes: "
        f"{size} is more than the GPU's total memory 150109880320: not a block it can "
        "allocate\n"
    )
    checked = run_script("validate.py", str(calibration))
    assert checked.returncode == 1
    assert "is more than the GPU's total memory" in checked.stderr


def forged_folder(runs: Path, gpu: dict) -> Path:
    """A copy of an own-model run folder whose environment.json says `gpu` of the GPU; its
    measurement.json keeps the true one."""
    folder = Path(shutil.copytree(OWN_RUN, runs / OWN_RUN.name))
    path = folder / "environment.json"
    document = json.loads(path.read_bytes())
    document["environment"]["gpu"].update(gpu)
    path.write_text(json.dumps(document))
    return folder


FORGED = [
    (
        {"total_memory_bytes": 1000, "free_memory_bytes_at_start": 999},
        "$.environment.gpu.total_memory_bytes: 1000 is not a NVIDIA H200's: a GPU's total is "
        "from 1073741824 bytes (1 GiB) to 151397597184 (a H200's nominal 141 GB)",
    ),
    (
        {"name": "NVIDIA B200", "total_memory_bytes": 10**13, "free_memory_bytes_at_start": 10**13},
        "$.environment.gpu.total_memory_bytes: 10000000000000 is not a NVIDIA B200's: a GPU's "
        "total is from 1073741824 bytes (1 GiB) to 193273528320 (a B200's nominal 180 GB)",
    ),
    (
        {"free_memory_bytes_at_start": 100_000_000_000},
        "$.environment.gpu.free_memory_bytes_at_start: differs from the environment "
        "measurement.json beside it records (one run, one environment)",
    ),
]


@pytest.mark.parametrize(("gpu", "message"), FORGED)
def test_a_forged_environment_changes_no_answer_of_fit(tmp_path, gpu, message):
    runs = tmp_path / "runs"
    runs.mkdir()
    source = Path(shutil.copytree(LARGE_RUN, runs / LARGE_RUN.name))
    flags = ["--days", "7", "--runs-dir", str(runs), "--json"]
    before = json.loads(run_script("fit.py", str(source), *flags).stdout)
    folder = forged_folder(runs, gpu)
    result = run_script("fit.py", str(source), *flags)
    assert result.returncode == 0, result.stderr
    after = json.loads(result.stdout)
    assert after.pop("untrusted_runs") == [f"{folder / 'environment.json'}: {message}"]
    before.pop("untrusted_runs")
    assert after == before


@pytest.mark.parametrize(("gpu", "message"), FORGED)
def test_record_and_validate_refuse_a_forged_environment(tmp_path, gpu, message):
    folder = forged_folder(tmp_path, gpu)
    result = run_script("record.py", str(folder))
    assert result.returncode == 1, result.stderr
    assert f"{folder / 'environment.json'}: {message}\n" in result.stderr
    assert list(tmp_path.glob("*.csv")) == []  # no log made, no row appended
    checked = run_script("validate.py", str(folder))
    assert checked.returncode == 1
    assert f"{folder / 'environment.json'}: {message}\n" in checked.stderr


def test_every_committed_environment_is_possible():
    result = run_script("validate.py", *map(str, sorted(RUNS.glob("*/environment.json"))))
    assert result.returncode == 0, result.stderr


def test_an_artefact_with_a_key_given_twice_is_refused(tmp_path):
    text = (OWN_RUN / "environment.json").read_text()
    path = tmp_path / "environment.json"
    path.write_text(text[: text.rindex("}")] + ', "schema": "x"}')
    checked = run_script("validate.py", str(path))
    assert checked.returncode == 1
    assert checked.stderr.startswith(
        f"{path}: $: not valid JSON (the key 'schema' is given twice in one object)\n"
    )


def test_record_onto_a_log_that_is_a_folder_says_so_in_words(tmp_path):
    folder = Path(shutil.copytree(OWN_RUN, tmp_path / OWN_RUN.name))
    (tmp_path / "resultats-own.csv").mkdir()
    result = run_script("record.py", str(folder))
    assert result.returncode == 2
    assert result.stderr == f"record.py: error: {tmp_path / 'resultats-own.csv'}: is a directory\n"


TARIFFS = ROOT / "data" / "tarifs-forfaits.csv"


def test_a_tariff_price_of_ten_to_the_thirty_cents_is_refused(tmp_path):
    lines = TARIFFS.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace(",79056,", "," + "1" + "0" * 30 + ",")
    path = tmp_path / "tarifs-forfaits.csv"
    path.write_text("".join(lines))
    result = run_script(
        "calcul_forfaits.py", "--tariffs", str(path), "--gpu", "b200", "--days", "3"
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stdout
    assert result.stderr == (
        f"calcul_forfaits.py: error: {path}:2: lot_price_cents must be a positive integer of USD "
        f"cents, at most 999999999999 (12 digits), got '1{'0' * 30}'\n"
    )


def test_a_tariff_of_a_million_rows_is_refused_from_its_size(tmp_path):
    lines = TARIFFS.read_text().splitlines(keepends=True)
    path = tmp_path / "tarifs-forfaits.csv"
    path.write_text(lines[0] + lines[1] * 10**6)
    started = time.monotonic()
    result = run_script(
        "calcul_forfaits.py", "--tariffs", str(path), "--gpu", "b200", "--days", "3"
    )
    assert time.monotonic() - started < 10  # 16.6 s and 1.27 GB before the limit
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"calcul_forfaits.py: error: tariff file {path}: over the limit of 1048576 bytes (a grid "
        "is a few kB)\n"
    )


# ------------------------------------------------- an approximate prediction's bounds

BOUNDED = RUNS / "20261206T055600Z-loss-outputs-blind" / "cpu" / "mlp-mse-fp32.json"
UNBOUNDED = RUNS / "20261206T090000Z-packed-sequences-repredicted" / "cpu" / "tagger-fp32-b16.json"
BEFORE_BOUNDS = RUNS / "20261203T195500Z-hf-first-points" / "cpu" / "qwen-lora.json"
NO_BOUNDS = (
    '$.prediction: approximate, with neither its bounds nor "unbounded" saying why it has '
    "none (every approximate prediction written since 2026-12-03T21:34:47Z has one or the "
    "other): its predicted peak is not the most it may need"
)


def test_an_approximate_prediction_stripped_of_its_bounds_is_refused(tmp_path):
    """Sized by its central figure before (0.61 GiB where its upper bound is 0.74 GiB)."""
    document = json.loads(BOUNDED.read_bytes())
    del document["prediction"]["bounds"]
    path = tmp_path / "prediction.json"
    path.write_text(json.dumps(document))
    result = call_main(fit.main, str(path), "--days", "7")
    assert (result.returncode, result.stdout) == (2, ""), result.stdout
    assert result.stderr == f"fit.py: error: {path}: {NO_BOUNDS}\n"
    checked = run_script("validate.py", str(path))
    assert checked.returncode == 1
    assert f"{path}: {NO_BOUNDS}\n" in checked.stderr


@pytest.mark.parametrize("source", [UNBOUNDED, BEFORE_BOUNDS], ids=["unbounded", "older"])
def test_an_approximate_prediction_without_bounds_that_may_have_none_is_fitted(source):
    """One that says why it has no bounds, or was written before predictions had them, is
    sized by its predicted peak, as before."""
    result = call_main(fit.main, str(source), "--days", "7", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    peak = json.loads(source.read_bytes())["prediction"]["largest_peak_reserved_bytes"]
    assert (answer["peak_reserved_bytes"], answer["peak_basis"]) == (peak, "prediction")
    assert run_script("validate.py", str(source)).returncode == 0
