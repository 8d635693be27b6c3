"""mesure_memoire.py without a GPU: arithmetic, bad input, guards, privacy, imports.

These run under every supported Python with or without torch (the `kit` nox session has
none, so the no-PyTorch guard is exercised for real there)."""

from __future__ import annotations

import ast
import getpass
import importlib.util
import json
import os
import socket
import sys
from decimal import Decimal

import pytest
from conftest import ROOT, run_script
from hypothesis import given
from hypothesis import strategies as st

from kit import mesure_memoire as mm
from pipeline.artefacts import validate

REGISTRY = validate.load_registry()
HAS_TORCH = importlib.util.find_spec("torch") is not None


# ------------------------------------------------------------------ estimate


def test_worked_example_of_the_spec_exactly():
    result = mm.estimate(7_000_000_000, 16, Decimal(4))
    assert result["weights_bytes"] == 14_000_000_000
    assert result["weights_gib"] == "13.03851604461669921875"
    assert result["weights_gb"] == "14"
    assert result["reserve_gib"] == "4"
    assert result["total_gib"] == "17.03851604461669921875"


def test_worked_example_on_the_command_line():
    argv = ["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]
    text = run_script("mesure_memoire.py", *argv)
    assert text.returncode == 0, text.stderr
    assert "14000000000 bytes" in text.stdout
    assert "13.0385160446 GiB" in text.stdout
    assert "14 GB" in text.stdout
    assert "17.0385160446 GiB" in text.stdout
    assert "activations, KV cache" in text.stdout
    as_json = run_script("mesure_memoire.py", *argv, "--json")
    assert as_json.returncode == 0
    document = json.loads(as_json.stdout)
    assert document == mm.estimate(7_000_000_000, 16, Decimal(4))
    assert "gradients" in document["not_included"]
    assert validate.validate_document(document, REGISTRY) == []


@pytest.mark.parametrize(
    ("parameters", "bits", "expected"),
    [
        (3, 4, 2),
        (1, 4, 1),
        (2, 4, 1),
        (1, 1, 1),
        (9, 1, 2),
        (7_000_000_000, 4, 3_500_000_000),
        (7_000_000_001, 4, 3_500_000_001),
        (5, 3, 2),
        (1, 16, 2),
    ],
)
def test_bytes_round_up_to_whole_bytes(parameters, bits, expected):
    assert mm.estimate(parameters, bits, Decimal(0))["weights_bytes"] == expected


@given(
    parameters=st.integers(min_value=1, max_value=10**15),
    bits=st.integers(min_value=1, max_value=64),
    reserve=st.decimals(min_value=0, max_value=10**6, places=6, allow_nan=False),
)
def test_estimate_arithmetic_is_exact(parameters, bits, reserve):
    result = mm.estimate(parameters, bits, reserve)
    weights = result["weights_bytes"]
    assert weights * 8 >= parameters * bits > (weights - 1) * 8
    assert Decimal(result["weights_gib"]) * 2**30 == weights
    assert Decimal(result["weights_gb"]) * 10**9 == weights
    assert Decimal(result["total_gib"]) - Decimal(result["weights_gib"]) == reserve
    assert "E" not in result["weights_gib"] + result["total_gib"]


# ------------------------------------------------------------------ bad input

BAD_INPUT = [
    (
        ["estimate", "--parameters", "0", "--bits", "16"],
        "--parameters: expected a positive integer",
    ),
    (["estimate", "--parameters", "-5", "--bits", "16"], "--parameters: expected a positive"),
    (["estimate", "--parameters", "1.5", "--bits", "16"], "--parameters: expected a positive"),
    (["estimate", "--parameters", "1e9", "--bits", "16"], "--parameters: expected a positive"),
    (["estimate", "--parameters", "ten", "--bits", "16"], "--parameters: expected a positive"),
    (["estimate", "--parameters", "10", "--bits", "0"], "--bits: expected a positive integer"),
    (["estimate", "--parameters", "10", "--bits", "16", "--reserve-gib", "-1"], "--reserve-gib"),
    (["estimate", "--parameters", "10", "--bits", "16", "--reserve-gib", "nan"], "--reserve-gib"),
    (["estimate", "--parameters", "10", "--bits", "16", "--reserve-gib", "inf"], "--reserve-gib"),
    (["estimate", "--parameters", "10", "--bits", "16", "--reserve-gib", "1e3"], "--reserve-gib"),
    (["estimate", "--bits", "16"], "estimate needs --parameters and --bits"),
    (["estimate", "--phases", "--library-block", "1:512"], "--library-block: expected LAYER:BYTES"),
    ([], "required: command"),
    (["measure", "--device", "cpu"], "--device: expected a GPU device"),
    (["measure", "--device", "cuda:x"], "--device: expected a GPU device"),
    (["measure", "--device", "cuda:-1"], "--device: expected a GPU device"),
    (["measure", "--device", "mps"], "--device: expected a GPU device"),
    (["measure", "--device", "cuda:0", "--batch", "0"], "--batch: expected a positive integer"),
    (["measure", "--device", "cuda:0", "--width", "-64"], "--width: expected a positive"),
    (["measure", "--device", "cuda:0", "--context", "1.5"], "--context: expected a positive"),
    (["measure", "--device", "cuda:0", "--warmup", "0"], "--warmup: expected a positive"),
    (["measure", "--device", "cuda:0", "--repeats", "0"], "--repeats: expected a positive"),
    (["measure", "--device", "cuda:0", "--seed", "-1"], "--seed: expected an integer >= 0"),
    (["measure", "--device", "cuda:0", "--dtype", "float64"], "--dtype: invalid choice"),
    (
        ["measure", "--device", "cuda:0", "--width", "10000000000"],
        "--width 10000000000: building the model on the host needs 3200000000200000000000 bytes",
    ),
    (["environment", "--device", "cpu"], "--device: expected a GPU device"),
]


@pytest.mark.parametrize(
    ("argv", "message"), BAD_INPUT, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, argv, message):
    if argv and argv[0] == "measure":
        argv = [*argv, "--output", str(tmp_path / "out.json")]
    result = run_script("mesure_memoire.py", *argv, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("mesure_memoire.py: error: ")
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("width", "dtype", "needed"),
    [(64, "float32", 132_352), (64, "bfloat16", 165_120), (1, "float16", 13 * 4 + 8)],
)
def test_host_memory_to_build_the_model_is_exact_and_refused_one_byte_short(
    monkeypatch, width, dtype, needed
):
    # float32 weights and biases (width 64: 33,088 parameters), plus the largest cast copy
    assert mm.host_bytes_to_build(width, dtype) == needed
    monkeypatch.setattr(mm, "host_memory_available", lambda: needed)
    mm.check_host_memory(width, dtype)
    monkeypatch.setattr(mm, "host_memory_available", lambda: needed - 1)
    with pytest.raises(mm.UsageError, match=f"needs {needed} bytes .* than the {needed - 1}"):
        mm.check_host_memory(width, dtype)
    monkeypatch.setattr(mm, "host_memory_available", lambda: None)  # the system does not say
    mm.check_host_memory(width, dtype)


def test_host_memory_available_is_a_positive_byte_count():
    available = mm.host_memory_available()
    assert isinstance(available, int)
    assert available > 2**20


@pytest.mark.parametrize("command", ["measure", "environment"])
def test_an_existing_output_is_refused_and_its_bytes_stay(tmp_path, command):
    existing = tmp_path / "result.json"
    existing.write_bytes(b"earlier result \x00\xff")
    before = existing.stat()
    result = run_script(
        "mesure_memoire.py", command, "--device", "cuda:0", "--output", str(existing)
    )
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert result.stderr.count("\n") == 1
    assert existing.read_bytes() == b"earlier result \x00\xff"
    assert existing.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_output_in_a_missing_folder_is_refused(tmp_path):
    target = tmp_path / "missing" / "out.json"
    result = run_script(
        "mesure_memoire.py", "measure", "--device", "cuda:0", "--output", str(target)
    )
    assert result.returncode == 2
    assert "is not an existing folder" in result.stderr
    assert not (tmp_path / "missing").exists()


# ------------------------------------------------------------------ guards


def test_no_pytorch_guard_for_real(tmp_path):
    """-S hides site-packages: `import torch` really fails, whatever is installed."""
    out = tmp_path / "m.json"
    result = run_script(
        "mesure_memoire.py", "measure", "--device", "cuda:0", "--output", str(out), flags=["-S"]
    )
    assert result.returncode == 2
    assert "PyTorch is not importable" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_environment_without_pytorch_says_so_and_exits_0(tmp_path):
    out = tmp_path / "environment.json"
    result = run_script(
        "mesure_memoire.py", "environment", "--device", "cuda:0", "--output", str(out), flags=["-S"]
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert document["environment"]["torch"]["available"] is False
    assert "PyTorch is not importable" in document["environment"]["torch"]["error"]
    assert document["environment"]["gpu"]["available"] is False
    assert validate.validate_document(document, REGISTRY) == []


def test_a_broken_torch_is_recorded_without_paths_or_the_user_name(tmp_path):
    """A torch that fails to load with a path in its message (a missing CUDA library, say):
    the type and the words are kept, the path and the user's name are not."""
    home = tmp_path / "home" / "zoe-kowalski"
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    home.mkdir(parents=True)
    library = home / "venv" / "lib" / "libtorch_cuda.so"
    (fake / "torch" / "__init__.py").write_text(
        f"raise OSError({str(library) + ': cannot open shared object file'!r} "
        "+ ' (installed by zoe-kowalski)')\n"
    )
    out = tmp_path / "e.json"
    env = {**os.environ, "PYTHONPATH": str(fake), "HOME": str(home)}
    result = run_script(
        "mesure_memoire.py", "environment", "--device", "cuda:0", "--output", str(out), env=env
    )
    assert result.returncode == 0, result.stderr
    error = json.loads(out.read_text())["environment"]["torch"]["error"]
    assert error == (
        "PyTorch is not importable (OSError: <path>/libtorch_cuda.so: cannot open shared "
        "object file (installed by <user>))"
    )
    result = run_script(
        "mesure_memoire.py",
        "measure",
        "--device",
        "cuda:0",
        "--output",
        str(tmp_path / "m.json"),
        env=env,
    )
    assert result.returncode == 2
    assert result.stderr == f"mesure_memoire.py: error: {error}\n"
    assert "zoe" not in out.read_text() + result.stderr


@pytest.mark.parametrize(
    ("message", "recorded"),
    [
        ("No module named 'torch'", "No module named 'torch'"),
        ("/opt/x/libcudart.so.12: cannot open", "<path>/libcudart.so.12: cannot open"),
        ("from 'torch' (/srv/envs/torch/__init__.py)", "from 'torch' (<path>/__init__.py)"),
        (r"[WinError 126] C:\\Users\\x\\c10.dll missing", "[WinError 126] <path>/c10.dll missing"),
        ("cache in ~/build/cache and/or /tmp", "cache in <path> and/or <path>"),
    ],
)
def test_paths_in_messages_are_hidden_and_words_kept(message, recorded):
    assert mm.without_personal(message) == recorded


@pytest.mark.skipif(not HAS_TORCH, reason="needs a (CPU) torch installed")
def test_no_gpu_guard_with_a_real_torch(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the no-GPU guard cannot be shown")
    out = tmp_path / "m.json"
    result = run_script("mesure_memoire.py", "measure", "--device", "cuda:0", "--output", str(out))
    assert result.returncode == 2
    assert "no GPU is visible to PyTorch" in result.stderr
    assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []

    env = run_script("mesure_memoire.py", "environment", "--device", "cuda:3")
    assert env.returncode == 0
    document = json.loads(env.stdout)
    assert document["environment"]["torch"]["version"] == torch.__version__
    assert document["environment"]["gpu"]["available"] is False
    assert validate.validate_document(document, REGISTRY) == []


# ------------------------------------------------------------------ out of memory


def test_an_out_of_memory_failure_keeps_the_request_and_the_counters_and_no_process():
    row = {"phase": "warm_forward", "repetition": 2, "passes": 1, "event_time_ns": 5}
    row.update(baseline_allocated_bytes=512, allocated_bytes=1024, peak_reserved_bytes=2097152)
    message = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "139.81 GiB of which 1.00 GiB is free. Process 1234 has 138.00 GiB memory in use."
    )
    assert mm.OutOfMemory(row, message).failure() == {
        "phase": "warm_forward",
        "repetition": 2,
        "error": "CUDA out of memory: tried to allocate 2.00 GiB",
        "counters_after_failure": {
            "baseline_allocated_bytes": 512,
            "allocated_bytes": 1024,
            "peak_reserved_bytes": 2097152,
        },
    }
    del row["repetition"]
    failure = mm.OutOfMemory(row, "CUDA error: out of memory").failure()
    assert (failure["repetition"], failure["error"]) == (None, "out of memory")


# ------------------------------------------------------------------ privacy


def test_no_environment_variable_or_host_data_in_any_output(tmp_path):
    canary = "CANARY-7f3c9e1b-do-not-record"
    env = {**os.environ, "ITERAGPU_CANARY": canary, "CUDA_VISIBLE_DEVICES_CANARY": canary}
    outputs = []
    for argv in (
        ["estimate", "--parameters", "7000000000", "--bits", "16", "--json"],
        ["environment", "--device", "cuda:0"],
        ["environment", "--device", "cuda:0", "--output", str(tmp_path / "e.json")],
        ["measure", "--device", "cuda:0", "--output", str(tmp_path / "m.json")],
    ):
        result = run_script("mesure_memoire.py", *argv, env=env, cwd=tmp_path)
        outputs += [result.stdout, result.stderr]
    outputs += [p.read_text() for p in tmp_path.iterdir()]
    everything = "\n".join(outputs)
    assert canary not in everything
    for secret in {socket.gethostname(), getpass.getuser(), os.path.expanduser("~")}:
        if len(secret) >= 4 and secret not in {"root", "user", "/root"}:
            assert secret not in everything
    assert str(tmp_path) not in everything.replace(str(tmp_path / "e.json"), "")


def test_the_script_never_reads_the_process_environment():
    source = (ROOT / "kit" / "mesure_memoire.py").read_text()
    assert "os.environ" not in source
    assert "environ[" not in source
    assert "getenv" not in source
    assert "gethostname" not in source


# ------------------------------------------------------------------ imports


def test_module_level_imports_are_standard_library_only():
    tree = ast.parse((ROOT / "kit" / "mesure_memoire.py").read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            top.add(node.module.split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names)
    inner = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import) and node not in tree.body
        for alias in node.names
    }
    assert inner - set(sys.stdlib_module_names) == {"torch"}


def test_runs_isolated_from_the_user_site():
    result = run_script(
        "mesure_memoire.py", "estimate", "--parameters", "1", "--bits", "4", flags=["-I"]
    )
    assert result.returncode == 0
    assert "1 bytes" in result.stdout


def measure_with_environment(tmp_path, flags=()):
    """measure into tmp_path/m.json with its environment in tmp_path/e.json."""
    out, env = str(tmp_path / "m.json"), str(tmp_path / "e.json")
    return run_script(
        "mesure_memoire.py",
        "measure",
        "--device",
        "cuda:0",
        "--output",
        out,
        "--environment-output",
        env,
        flags=flags,
    )


def test_environment_output_is_written_first_even_when_the_measurement_is_refused(tmp_path):
    result = measure_with_environment(tmp_path, flags=["-S"])
    assert result.returncode == 2
    assert "PyTorch is not importable" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json"]
    document = json.loads((tmp_path / "e.json").read_text())
    assert document["environment"]["torch"]["available"] is False
    assert validate.validate_document(document, REGISTRY) == []


@pytest.mark.parametrize("existing", ["e.json", "m.json"])
def test_environment_output_follows_the_no_overwrite_rule(tmp_path, existing):
    (tmp_path / existing).write_bytes(b"before")
    result = measure_with_environment(tmp_path)
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == [existing]
    assert (tmp_path / existing).read_bytes() == b"before"


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder that refuses new files, as the kernel refuses them to a user who may not
    write there (root may write anyway, so the refusal is also simulated in-process)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    real_access, real_open, real_mkstemp = os.access, os.open, mm.tempfile.mkstemp

    def inside(path) -> bool:
        return os.path.abspath(os.fspath(path)) == str(folder)

    def access(path, mode, **kwargs):
        return False if inside(path) and mode & os.W_OK else real_access(path, mode, **kwargs)

    def open_(path, flags, *args, **kwargs):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and inside(dir):
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(mm.tempfile, "mkstemp", mkstemp)
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize(
    "argv",
    [
        ["environment", "--device", "cuda:0", "--output", "{ro}/new.json"],
        ["measure", "--device", "cuda:0", "--output", "{ro}/new.json"],
        [
            "measure",
            "--device",
            "cuda:0",
            "--output",
            "{tmp}/m.json",
            "--environment-output",
            "{ro}/new.json",
        ],
    ],
)
def test_an_output_in_an_unwritable_folder_is_one_line_and_exit_2(
    tmp_path, read_only, capsys, argv
):
    """Refused before any work (the environment, the GPU), in one line, nothing written."""
    argv = [a.format(ro=read_only, tmp=tmp_path) for a in argv]
    assert mm.main(argv) == 2
    captured = capsys.readouterr()
    assert (
        captured.err
        == f"mesure_memoire.py: error: {read_only} is not writable: no new file can be made there\n"
    )
    assert captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro"]
    assert list(read_only.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_for_real(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        argv = ["environment", "--device", "cuda:0", "--output", str(folder / "new.json")]
        result = run_script("mesure_memoire.py", *argv)
    finally:
        folder.chmod(0o755)
    assert result.returncode == 2
    assert result.stderr == (
        f"mesure_memoire.py: error: {folder} is not writable: no new file can be made there\n"
    )
    assert list(folder.iterdir()) == []


def test_an_output_the_file_system_refuses_at_write_time_is_one_line_and_exit_2(tmp_path):
    """The last guard, for what no check up front sees (here a name too long to link)."""
    out = tmp_path / ("x" * 300 + ".json")
    result = run_script(
        "mesure_memoire.py", "environment", "--device", "cuda:0", "--output", str(out)
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"mesure_memoire.py: error: {out} cannot be written (")
    assert result.stderr.endswith("): nothing was written\n")
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_environment_output_and_output_must_differ(tmp_path):
    same = str(tmp_path / "x.json")
    result = run_script(
        "mesure_memoire.py",
        "measure",
        "--device",
        "cuda:0",
        "--output",
        same,
        "--environment-output",
        same,
    )
    assert result.returncode == 2
    assert "must be two files" in result.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- new files


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o027])
def test_a_new_file_follows_the_umask_like_any_other_tool(tmp_path, umask):
    old = os.umask(umask)
    try:
        mm.write_new(tmp_path / "a.json", b"{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "a.json").read_bytes() == b"{}\n"


def test_a_new_file_never_replaces_one_and_leaves_no_temp_file(tmp_path):
    (tmp_path / "a.json").write_bytes(b"evidence")
    with pytest.raises(FileExistsError):
        mm.write_new(tmp_path / "a.json", b"other")
    assert (tmp_path / "a.json").read_bytes() == b"evidence"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


@pytest.mark.skipif(not hasattr(os, "O_TMPFILE"), reason="Linux only: O_TMPFILE")
def test_a_write_cut_short_leaves_no_name_in_the_folder(tmp_path, monkeypatch):
    """What kill -9 before the link leaves: the data was in a file with no name at all."""
    seen = []

    def killed(fd, path):
        seen.extend(p.name for p in tmp_path.iterdir())
        raise KeyboardInterrupt

    monkeypatch.setattr(mm, "link_unnamed", killed)
    with pytest.raises(KeyboardInterrupt):
        mm.write_new(tmp_path / "a.json", b"{}\n")
    assert seen == []
    assert list(tmp_path.iterdir()) == []
