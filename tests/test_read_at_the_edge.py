"""Every file a stage reads is checked where it is read, as validate.py checks it: a file that
validate.py rejects is refused in one line (exit 2) and never answered, and no stage reads or
appends through a symbolic link that leaves the runs folder."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, RUNS, call_main, run_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.artefacts import validate
from pipeline.measuring import decoder
from pipeline.stages import fit

LARGE_RUN = "20261202T112323Z-50900d"  # a kit run on the H200 (environment in its measurement)
OWN_RUN = RUNS / "20261203T131050Z-own-model-chain" / "20261203T131050Z-74623e"
CALIBRATION = RUNS / "20261203T101500Z-decoder-calibration" / "decoder-calibration.json"
GIB = 2**30


def refused(result, *words: str) -> None:
    """One line on stderr naming the problem, exit 2, nothing on stdout."""
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def copy_run(runs: Path, source: Path) -> Path:
    runs.mkdir(exist_ok=True)
    return Path(shutil.copytree(source, runs / source.name))


def kit_prediction() -> dict:
    result = run_script("mesure_memoire.py", "estimate", "--phases", "--width", "256", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def decoder_prediction() -> dict:
    flags = ["--layers", "1", "--width", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128"]
    flags += ["--vocab", "256", "--prompt", "8", "--new-tokens", "2", "--batch", "1"]
    result = call_main(decoder.main, "estimate", *flags, "--dtype", "bfloat16", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def write(folder: Path, name: str, document) -> Path:
    path = folder / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def fit_of(source: Path, runs: Path, *flags: str):
    return run_script("fit.py", str(source), "--days", "7", "--runs-dir", str(runs), *flags)


# ---------------------------------------------------------------- fit's GPU memory


def bad_environment_folder(runs: Path, free: int, total: int | None = None) -> Path:
    """A run folder whose environment says PyTorch saw `free` bytes free at start."""
    folder = runs / "20261204T000000Z-0badf0"
    folder.mkdir(parents=True)
    document = json.loads((RUNS / LARGE_RUN / "measurement.json").read_bytes())
    gpu = document["environment"]["gpu"]
    gpu["total_memory_bytes"] = total or gpu["total_memory_bytes"]
    gpu["free_memory_bytes_at_start"] = free
    write(folder, "measurement.json", document)
    return folder


@pytest.mark.parametrize(
    ("free", "total"), [(150_109_880_320 + 50 * GIB, None), (2 * 10**11, 10**11)]
)
def test_an_environment_with_more_free_than_total_changes_no_answer(tmp_path, free, total):
    runs = tmp_path / "runs"
    source = copy_run(runs, RUNS / LARGE_RUN)
    before = json.loads(fit_of(source, runs, "--json").stdout)
    bad = bad_environment_folder(runs, free, total)
    result = fit_of(source, runs, "--json")
    assert result.returncode == 0, result.stderr
    after = json.loads(result.stdout)
    [line] = after.pop("untrusted_runs")
    assert line.startswith(f"{bad / 'measurement.json'}: $.environment.gpu.free_memory_bytes")
    assert "(free memory is part of the total)" in line
    before.pop("untrusted_runs")
    assert after == before  # the H200's usable memory is still the trusted runs' figure
    text = fit_of(source, runs).stdout
    assert f"  warning: a run folder left out of the GPU memory figures: {line}\n" in text
    checked = run_script("validate.py", str(bad))
    assert checked.returncode == 1
    assert "free_memory_bytes_at_start" in checked.stderr


def test_a_run_folder_linked_from_outside_is_not_trusted(tmp_path):
    runs = tmp_path / "runs"
    source = copy_run(runs, RUNS / LARGE_RUN)
    elsewhere = bad_environment_folder(tmp_path / "elsewhere", 10)
    (runs / "20261204T000001Z-11111a").mkdir()
    (runs / "20261204T000001Z-11111a" / "measurement.json").symlink_to(
        elsewhere / "measurement.json"
    )
    answer = json.loads(fit_of(source, runs, "--json").stdout)
    assert answer["untrusted_runs"] == [
        f"{runs / '20261204T000001Z-11111a' / 'measurement.json'}: a symbolic link out of "
        f"{runs}: not read"
    ]


def test_explain_names_the_run_that_gave_each_measured_figure(tmp_path):
    runs = tmp_path / "runs"
    source = copy_run(runs, RUNS / LARGE_RUN)
    own = copy_run(runs, OWN_RUN)  # 2,097,152 bytes less free at start: the larger context
    result = fit_of(source, runs, "--explain")
    assert result.returncode == 0, result.stderr
    assert (
        f"  h200: the total from run {LARGE_RUN}, the smallest context from run {LARGE_RUN}; "
        "the 2 run(s) by what they reported:\n"
        "    NVIDIA H200: total 150,109,880,320, free at start 149,557,477,376, context "
        f"552,402,944 bytes: {LARGE_RUN}\n"
        "    NVIDIA H200: total 150,109,880,320, free at start 149,555,380,224, context "
        f"554,500,096 bytes: {own.name}\n"
    ) in result.stdout


# ---------------------------------------------------------------- fit's source


PEAKS = [-5, 0, True, "1", None, 1.5, 10**30]


@pytest.mark.parametrize("peak", PEAKS, ids=repr)
def test_a_kit_prediction_whose_peak_is_not_the_models_is_refused(tmp_path, peak):
    document = kit_prediction()
    document["phases"][-1]["peak_reserved_bytes"] = peak
    refused(fit_of(write(tmp_path, "p.json", document), tmp_path), "p.json: $.phases[")


def test_a_kit_prediction_is_re_derived_from_its_configuration(tmp_path):
    document = kit_prediction()
    document["configuration"]["width"] = 4096  # the rows are still the width-256 ones
    refused(
        fit_of(write(tmp_path, "p.json", document), tmp_path),
        "but the allocator model gives",
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d["prediction"].update(status="guess"), "$.prediction.status"),
        (
            lambda d: d["prediction"].update(
                status="exact", unknown=[{"op": "aten.x", "calls": 1, "why": "?"}]
            ),
            "$.prediction.unknown",
        ),
        (lambda d: d["prediction"].update(status="approximate", unknown=[]), "$.prediction"),
        (lambda d: d["prediction"].update(largest_peak_reserved_bytes=-5), "largest_peak"),
        (lambda d: d["prediction"].update(largest_peak_reserved_bytes="5"), "largest_peak"),
    ],
    ids=["guess", "exact-with-unknown", "approximate-with-nothing", "negative", "string"],
)
def test_an_own_model_file_validate_rejects_is_refused(tmp_path, change, words):
    document = json.loads((OWN_RUN / "measurement.json").read_bytes())
    change(document)
    refused(fit_of(write(tmp_path, "own.json", document), tmp_path), "own.json: ", words)


def test_a_decoder_prediction_not_exact_must_say_what_it_leaves_out(tmp_path):
    document = decoder_prediction()
    document["prediction"]["exact"] = False
    document["prediction"]["not_predicted"] = []
    path = write(tmp_path, "d.json", document)
    refused(fit_of(path, tmp_path), "d.json: $.prediction")
    assert run_script("validate.py", str(path)).returncode == 1


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("peak_reserved_bytes", 0, "> peak_reserved_bytes 0 (allocated is part of reserved)"),
        ("allocated_bytes", 10**15, "allocated_bytes 1000000000000000 > reserved_bytes"),
    ],
)
def test_a_run_folder_validate_rejects_is_refused(tmp_path, key, value, words):
    runs = tmp_path / "runs"
    folder = copy_run(runs, RUNS / LARGE_RUN)
    document = json.loads((folder / "measurement.json").read_bytes())
    document["phases"][2][key] = value
    write(folder, "measurement.json", document)
    refused(fit_of(folder, runs), words)


def test_a_sweep_whose_answer_is_not_its_last_completed_point_is_refused(tmp_path):
    runs = tmp_path / "runs"
    sweep = copy_run(runs, RUNS / "20261202T113219Z-8f4a88-sweep")
    document = json.loads((sweep / "sweep.json").read_bytes())
    document["largest_fitted"] = dict(document["largest_fitted"], peak_reserved_bytes=1)
    write(sweep, "sweep.json", document)
    refused(fit_of(sweep, runs), "$.largest_fitted: not the last completed point")


# ---------------------------------------------------------------- decoder calibrations (evidence)


def calibration_with(tmp_path: Path, change) -> Path:
    document = json.loads(CALIBRATION.read_bytes())
    change(document)
    return write(tmp_path, "c.json", document)


def negative_workspace(document: dict) -> None:
    for entry in document["sites"]:
        for block in entry["blocks"]:
            if block["name"].startswith("cuBLAS"):
                block["bytes"] = -33_554_432
                return
    raise AssertionError("no cuBLAS block in the committed calibration")


CALIBRATIONS = [
    ("negative-workspace", negative_workspace, "-33554432"),
    (
        "range-over-a-name",
        lambda d: d["sites"][0].setdefault("when", {}).update(dtype={"min": 1}),
        "a range, but dtype is a name",
    ),
    ("sites-a-string", lambda d: d.update(sites="linear"), "$.sites"),
    ("block-an-int", lambda d: d["sites"][0].update(blocks=[5]), "$.sites[0].blocks[0]"),
]


@pytest.mark.parametrize(
    ("change", "words"),
    [(change, words) for _, change, words in CALIBRATIONS],
    ids=[name for name, _, _ in CALIBRATIONS],
)
def test_a_decoder_calibration_validate_rejects_is_refused(tmp_path, change, words):
    """The decoder calibrations committed as evidence (decoder.py 1.0.0 predicted with them)
    are still checked: a broken one is named, with where it breaks."""
    path = calibration_with(tmp_path, change)
    result = run_script("validate.py", str(path))
    assert result.returncode == 1
    assert words in result.stdout + result.stderr


def test_a_calibration_nested_too_deep_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    spec = f"{ROOT / 'pipeline' / 'workloads' / 'resnet_cnn.py'}:resnet"
    result = run_script("own_model.py", "estimate", "--workload", spec, "--calibration", path)
    refused(result, "deep.json: not valid JSON (nested too deeply)")


def test_a_decoder_measurement_whose_calibration_is_another_gpus_does_not_validate():
    source = (
        RUNS / "20261203T094114Z-decoder-sweep" / "20261203T094114Z-588a67" / "measurement.json"
    )
    document = json.loads(source.read_bytes())
    assert validate.validate_document(document, validate.registry()) == []
    document["prediction"]["calibration"]["gpu"] = "NVIDIA A100-SXM4-80GB"
    assert validate.validate_document(document, validate.registry()) == [
        "$.prediction.calibration.gpu: 'NVIDIA A100-SXM4-80GB', but the run used 'NVIDIA H200'"
    ]


# ---------------------------------------------------------------- record and links


def test_record_never_appends_through_a_link_out_of_the_runs_folder(tmp_path):
    import runfixtures

    runs = tmp_path / "runs"
    folder = runfixtures.make_run(runs, 1)
    outside = tmp_path / "outside.csv"
    outside.write_bytes(b"someone else's file\n")
    (runs / "resultats-bruts.csv").symlink_to(outside)
    result = run_script("record.py", str(folder))
    refused(result, "resultats-bruts.csv: a symbolic link out of")
    assert outside.read_bytes() == b"someone else's file\n"


def test_record_never_records_a_measurement_linked_from_outside(tmp_path):
    import runfixtures

    runs = tmp_path / "runs"
    real = runfixtures.make_run(tmp_path / "elsewhere", 2)
    folder = runs / runfixtures.run_id(3)
    folder.mkdir(parents=True)
    (folder / "measurement.json").symlink_to(real / "measurement.json")
    refused(run_script("record.py", str(folder)), "measurement.json: a symbolic link out of")
    assert not (runs / "resultats-bruts.csv").exists()


# ---------------------------------------------------------------- any mutation


def leaves(document, path=()):
    """Every place in a JSON document: (path to it, its value)."""
    yield path, document
    if isinstance(document, dict):
        for key, value in document.items():
            yield from leaves(value, (*path, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            yield from leaves(value, (*path, i))


def mutated(document, path, value):
    changed = copy.deepcopy(document)
    if not path:
        return value
    *parent, last = path
    holder = changed
    for part in parent:
        holder = holder[part]
    holder[last] = value
    return changed


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(-3, 3), max_size=2),
    st.dictionaries(st.sampled_from(["min", "max", "x"]), st.integers(-3, 3), max_size=2),
)
SOURCES = {}


def source(kind: str) -> dict:
    if kind not in SOURCES:
        SOURCES[kind] = {
            "kit": kit_prediction,
            "decoder": decoder_prediction,
            "own-model": lambda: json.loads((OWN_RUN / "measurement.json").read_bytes()),
        }[kind]()
    return SOURCES[kind]


def answer(path: Path, runs: Path, capsys):
    """fit's exit code, its purchase answer (the peak and every model's row), and stderr; the
    words around it (the file's name, its configuration) may change with a valid edit."""
    code = fit.main([str(path), "--days", "7", "--runs-dir", str(runs), "--json"])
    out, err = capsys.readouterr()
    if code != 0:
        return code, out, err
    result = json.loads(out)
    return code, (result["peak_reserved_bytes"], result["peak_basis"], result["rows"]), err


def judged(original: dict, path: Path, runs: Path, capsys, place, value) -> None:
    """fit on `original` with `place` set to `value`: refused in one line, or the same answer."""
    expected = answer(write(path.parent, path.name, original), runs, capsys)
    assert expected[0] == 0
    code, out, err = answer(
        write(path.parent, path.name, mutated(original, place, value)), runs, capsys
    )
    if code == 0:
        assert (code, out, err) == expected, f"{place} = {value!r} changed the answer"
    else:
        assert (code, out) == (2, ""), err
        assert err.startswith("fit.py: error: "), err
        assert err.count("\n") == 1, err


def test_every_single_edit_of_a_kit_prediction_is_refused_or_changes_nothing(tmp_path, capsys):
    """Exhaustive over the places of a small prediction: every number nudged, and wrong types."""
    original = kit_prediction()
    runs = tmp_path / "empty-runs"
    runs.mkdir()
    for place, was in leaves(original):
        if isinstance(was, (dict, list)):
            continue
        nudged = [was + 1, was - 1, was * 2, was // 2] if type(was) is int else []
        for value in [*nudged, 0, -1, None, True, 1.5, "x", [], {}]:
            judged(original, tmp_path / "p.json", runs, capsys, place, value)


# What a measured run says of its GPU is evidence for that GPU, not for the peak: a valid
# change of its memory moves the usable memory by the rule, and of its name, which catalogue
# model that evidence is for; the two tests below hold both exactly.
GPU_MEMORY = {
    ("environment", "gpu", "free_memory_bytes_at_start"),
    ("environment", "gpu", "total_memory_bytes"),
    ("environment", "gpu", "name"),
}


def test_a_measured_runs_own_memory_figures_move_its_gpus_usable_memory_by_the_rule(
    tmp_path, capsys
):
    original = source("own-model")
    runs = tmp_path / "empty-runs"
    runs.mkdir()

    def h200(document) -> int:
        path = write(tmp_path, "own.json", document)
        assert fit.main([str(path), "--days", "7", "--runs-dir", str(runs), "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        return next(row["usable_memory_bytes"] for row in rows if row["gpu"] == "h200")

    before = h200(original)
    free = ("environment", "gpu", "free_memory_bytes_at_start")
    was = original["environment"]["gpu"]["free_memory_bytes_at_start"]
    assert h200(mutated(original, free, was + 4096)) == before + 4096  # context 4 KiB smaller
    assert h200(mutated(original, free, was - 4096)) == before - 4096


def test_a_measured_runs_gpu_name_says_which_models_memory_it_measured(tmp_path, capsys):
    """Found by the mutation test below: the run's GPU renamed to one the catalogue does not
    know, the H200's row takes the vendor figure in place of the run's measured memory, and
    nothing else of the answer moves; the peak stays the measured one."""
    original = source("own-model")
    assert original["environment"]["gpu"]["name"] == "NVIDIA H200"
    runs = tmp_path / "empty-runs"
    runs.mkdir()

    def answer_for(document) -> dict:
        path = write(tmp_path, "own.json", document)
        assert fit.main([str(path), "--days", "7", "--runs-dir", str(runs), "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    before = answer_for(original)
    after = answer_for(mutated(original, ("environment", "gpu", "name"), "0"))
    assert (after["peak_reserved_bytes"], after["peak_basis"]) == (
        before["peak_reserved_bytes"],
        before["peak_basis"],
    )
    changed = [row["gpu"] for row, was in zip(after["rows"], before["rows"], strict=True)
               if row != was]  # fmt: skip
    assert changed == ["h200"]
    [h200] = [row for row in after["rows"] if row["gpu"] == "h200"]
    [was] = [row for row in before["rows"] if row["gpu"] == "h200"]
    assert (was["memory_basis"], h200["memory_basis"]) == ("measured", "vendor figure")
    assert h200["total_memory_bytes"] == 141_000_000_000


@pytest.mark.parametrize("kind", ["kit", "decoder", "own-model"])
@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_file_is_refused_in_one_line_or_answered_as_the_original(
    tmp_path, capsys, kind, data
):
    original = source(kind)
    places = {
        path: value
        for path, value in leaves(original)
        if not isinstance(value, (dict, list)) and path not in GPU_MEMORY
    }
    place = data.draw(st.sampled_from(sorted(places, key=repr)), label="place")
    was = places[place]
    near = (
        st.sampled_from([was + 1, was - 1, was * 2, was // 2, -was])
        if isinstance(was, int) and not isinstance(was, bool)
        else st.nothing()
    )
    value = data.draw(st.one_of(near, VALUES), label="value")
    runs = tmp_path / "empty-runs"
    runs.mkdir(exist_ok=True)
    judged(original, tmp_path / "original.json", runs, capsys, place, value)


@pytest.mark.parametrize("kind", ["kit", "decoder"])
def test_a_file_claiming_a_trillion_repetitions_is_refused_in_one_line(tmp_path, kind):
    """The rows a configuration plans are counted, never built: a file claiming 10**12
    repetitions or tokens is refused at once, not after filling the memory."""
    runs = tmp_path / "runs"
    if kind == "kit":
        folder = copy_run(runs, RUNS / LARGE_RUN)
        document = json.loads((folder / "measurement.json").read_bytes())
        document["configuration"]["repeats"] = 10**12
        write(folder, "measurement.json", document)
        words = "$.phases: 9 rows, expected 1000000000004 for repeats=1000000000000"
    else:
        document = decoder_prediction()
        document["configuration"]["new_tokens"] = 10**12
        document["cache"]["positions"] = document["configuration"]["prompt"] + 10**12
        folder = write(tmp_path, "prediction.json", document)
        words = "$.phases: 4 rows, the plan of prompt 8, new_tokens 1000000000000"
    refused(fit_of(folder, runs), words)
