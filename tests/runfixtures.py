"""The real H200 outputs (tests/data/h200/) laid out as run folders and log rows, and a copy
of the repository whose quality protocol has its decisions written, for the stage tests."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path

from conftest import ROOT

from pipeline.artefacts import validate
from pipeline.stages import record

H200 = Path(__file__).resolve().parent / "data" / "h200"
DECIDED = """---
protocol: IteraGPU Lab quality protocol
version: 1
useful_unit: "one support ticket routed to a team"
acceptance_criteria:
  - "the team equals the reviewer's label in the 2026-11 check set"
minimum_acceptance_rate: 0.95
decided_on: 2026-12-01
decided_by: "ML lead"
---
"""


def run_id(n: int) -> str:
    """A valid run id, distinct and sortable for n in [0, 86400)."""
    return f"20261202T{n // 3600:02d}{n // 60 % 60:02d}{n % 60:02d}Z-{n:06x}"


def measurement_bytes(n: int, fixture: str) -> bytes:
    """A real measurement, followed by n spaces: run n's own bytes (and SHA-256), as two real
    runs never share a measurement.json, with the same JSON in them."""
    return (H200 / f"{fixture}.json").read_bytes() + b" " * n


def make_run(runs_dir: Path, n: int = 0, fixture: str = "small", environment=True) -> Path:
    """runs_dir/<run id>/ holding a real measurement (and the real environment.json)."""
    runs_dir.mkdir(exist_ok=True)
    folder = runs_dir / run_id(n)
    folder.mkdir()
    (folder / "measurement.json").write_bytes(measurement_bytes(n, fixture))
    if environment:
        shutil.copyfile(H200 / "env.json", folder / "environment.json")
    return folder


def make_row(n: int = 0, fixture: str = "small", protocol: Path = validate.PROTOCOL) -> dict:
    """The row record.py builds for make_run's run n, under the given protocol."""
    data = measurement_bytes(n, fixture)
    sha = validate.Protocol(protocol).sha256
    return record.build_row(run_id(n), data, json.loads(data), sha)


def log_bytes(rows: list[dict]) -> bytes:
    header = validate.kit_header()
    return b"".join(
        [record.csv_line(header), *(record.csv_line(r[c] for c in header) for r in rows)]
    )


def repo_copy(tmp_path: Path, front_matter: str = DECIDED) -> Path:
    """The stage scripts, schemas and kit data under tmp_path/repo, with `front_matter`
    in place of the protocol's: its scripts judge quality values against that protocol."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "pipeline", repo / "pipeline", ignore=shutil.ignore_patterns("__py*"))
    shutil.copytree(ROOT / "kit", repo / "kit", ignore=shutil.ignore_patterns("__py*"))
    (repo / "schemas").mkdir()
    for path in (ROOT / "schemas").glob("*.schema.json"):
        shutil.copyfile(path, repo / "schemas" / path.name)
    (repo / "data").mkdir()
    shutil.copyfile(ROOT / "data" / "resultats-bruts.csv", repo / "data" / "resultats-bruts.csv")
    write_protocol(repo / "data" / "protocole-qualite.md", front_matter)
    return repo


def in_repo(repo: Path, module: str) -> tuple[list[str], dict]:
    """The command line and the keywords of subprocess.run that run `module` of the copy
    under `repo` (`-m` looks in the working folder first: the copy's)."""
    return [sys.executable, "-m", module], {"env": {**os.environ, "PYTHONPATH": ""}, "cwd": repo}


def write_protocol(path: Path, front_matter: str = DECIDED) -> Path:
    """The repository's protocol with `front_matter` in place of its own."""
    body = validate.PROTOCOL.read_text(encoding="utf-8").split("\n---\n", 1)[1]
    path.write_text(front_matter + body, encoding="utf-8")
    return path


# ---------------------------------------------------------------- decoder runs, synthesised

# What a decoder measurement would say if the H200 did exactly as predicted: decoder.py's own
# document, its rows the trace's prediction with the committed H200 calibration, with fixed
# clocks. They stand in for a run in the stage tests (the GPU tests measure real ones).
H200_USABLE_BYTES = 150109880320 - 718077952  # total - CUDA context, the committed H200 runs


# What PyTorch reports of an allocator left at its defaults (tests/data/h200/env.json was
# recorded before the environment named them).
DEFAULT_ALLOCATOR = {
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "roundup_power2_divisions": {},
}


def decoder_measurement(
    flags: list[str], memory_bytes: int | None = H200_USABLE_BYTES, allocator=DEFAULT_ALLOCATOR
) -> dict:
    """The decoder measurement.json `decoder.py measure --device cuda:0 FLAGS` would write on
    the H200 of tests/data/h200/env.json with these allocator settings, each row measured as
    predicted; a row whose predicted peak reserved exceeds memory_bytes runs out of memory,
    as the GPU would."""
    from pipeline.measuring import decoder

    args = decoder.build_parser().parse_args(
        ["measure", "--device", "cuda:0", *flags, "--output", "unused"]
    )
    shape, preset = decoder.shape_from_args(args)
    run = decoder.run_configuration(args)
    environment = json.loads((H200 / "env.json").read_bytes())["environment"]
    environment["gpu"]["allocator_settings"] = dict(allocator)
    document = decoder.new_measurement(shape, preset, run, "cuda:0", args.seed, environment)
    document["created_utc"] = "2026-12-04T10:00:00Z"
    traced, prediction, source = predicted_on_h200(tuple(flags))
    rows = [
        {**fields, **{key: row[key] for key in decoder.COUNTER_KEYS}}
        for fields, row in zip(decoder.row_fields(run), prediction.rows, strict=True)
    ]
    status = "completed"
    for i, predicted in enumerate(rows):
        if memory_bytes is not None and predicted["peak_reserved_bytes"] > memory_bytes:
            status = "out_of_memory"
            document["failure"] = {
                "phase": predicted["phase"],
                "repetition": predicted.get("repetition"),
                "error": "CUDA out of memory. Tried to allocate more than the GPU holds",
                "counters_after_failure": {  # what the phase started with, kept
                    key: predicted[
                        f"baseline_{'allocated' if 'allocated' in key else 'reserved'}_bytes"
                    ]
                    for key in decoder.COUNTER_KEYS
                },
            }
            break
        document["phases"].append(
            {**predicted, "wall_time_ns": 2_000_000 + 1000 * i, "event_time_ns": 1_900_000 + i}
        )
    document["status"] = status
    if status == "completed":  # what the H200 chose for these shapes (attention_choice)
        document["measured_attention_backend"] = {"prefill": "cudnn", "decode": "cudnn"}
    decoder.add_predictions(document, traced, prediction, source)
    return document


@functools.cache
def predicted_on_h200(flags: tuple[str, ...]):
    """decoder.py estimate --gpu h200 FLAGS: (trace, prediction, calibration source), once
    per configuration (a trace takes a second or two)."""
    import torch

    from pipeline.measuring import decoder

    args = decoder.build_parser().parse_args(["estimate", *flags])
    shape, _ = decoder.shape_from_args(args)
    return decoder.predicted(torch, shape, decoder.run_configuration(args), "h200")


def decoder_bytes(flags: list[str], memory_bytes: int | None = H200_USABLE_BYTES) -> bytes:
    return (json.dumps(decoder_measurement(flags, memory_bytes), indent=2) + "\n").encode()


TINY_DECODER = ["--layers", "2", "--width", "64", "--heads", "4", "--kv-heads", "2"]
TINY_DECODER += ["--ffn", "160", "--vocab", "1000", "--batch", "2", "--prompt", "16"]
TINY_DECODER += ["--new-tokens", "4"]


def environment_beside(measurement: bytes) -> bytes:
    """The environment.json of a run folder whose measurement.json is `measurement`: the
    H200's file, recording the environment that measurement records (one run, one
    environment, as validate.py requires)."""
    document = json.loads((H200 / "env.json").read_bytes())
    document["environment"] = json.loads(measurement)["environment"]
    return (json.dumps(document, indent=2) + "\n").encode()


def make_decoder_run(runs_dir: Path, n: int = 0, flags=TINY_DECODER, memory_bytes=None) -> Path:
    """runs_dir/<run id>/ holding a synthesised decoder measurement and the real environment,
    with the allocator settings the decoder's measurement records."""
    runs_dir.mkdir(exist_ok=True)
    folder = runs_dir / run_id(n)
    folder.mkdir()
    data = decoder_bytes(list(flags), memory_bytes)
    (folder / "measurement.json").write_bytes(data)
    (folder / "environment.json").write_bytes(environment_beside(data))
    return folder


# ---------------------------------------------------------------- own-model runs, on the CPU

# own_model.py measure run in this process with the CPU standing in for the GPU: the
# protocol's rows with zero counters, the committed H200 environment, and no calibration
# probe. No own-model run from a GPU is
# committed yet; these stand in for one in the stage tests (the GPU tests measure real ones).
WORKLOADS = ROOT / "pipeline" / "workloads"
RESNET = ["--workload", f"{WORKLOADS / 'resnet_cnn.py'}:resnet", "--batch", "2"]
RESNET += ["--dim", "image=16", "--dim", "width=8", "--dim", "stages=2"]
DECODER_ADAMW = ["--workload", f"{WORKLOADS / 'decoder_training.py'}:decoder_adamw"]
DECODER_ADAMW += ["--batch", "2", "--dim", "context=16", "--dim", "vocab=64"]


def host_gpu(environment=None):
    """own_model.Gpu for a CPU: every counter reads zero; `environment()`, if given, is the
    environment the run records (by default the committed H200's, default allocator)."""
    import time

    import torch

    from pipeline.measuring import own_model
    from pipeline.predicting import trace_prediction

    recorded = environment

    class Runtime:
        OutOfMemoryError = torch.OutOfMemoryError

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = 0

            def record(self) -> None:
                self.t = time.perf_counter_ns()

            def elapsed_time(self, other) -> float:
                return (other.t - self.t) / 1e6

        def synchronize(self, device=None) -> None:
            pass

        def memory_allocated(self, device=None) -> int:
            return 0

        memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

        def reset_peak_memory_stats(self, device=None) -> None:
            pass

    class HostGpu(own_model.Gpu):
        def check(self, torch, index, text) -> None:
            pass

        def environment(self, *args) -> dict:
            if recorded is not None:
                return recorded()
            environment = json.loads((H200 / "env.json").read_bytes())["environment"]
            environment["gpu"]["allocator_settings"] = dict(DEFAULT_ALLOCATOR)
            return environment

        def start(self, torch, index):
            return torch.device("cpu")

        def runtime(self, torch):
            return Runtime()

        def probe(self, torch, device, trace):
            return trace_prediction.Calibration()

        def history(self, torch, on):
            return False  # a CPU has no allocator history: nothing to hold the replay against

    return HostGpu()


def own_model_run(folder: Path, flags: list[str], gpu=None) -> int:
    """own_model.py measure FLAGS into folder/measurement.json and environment.json, on the
    CPU stand-in; its exit code."""
    from pipeline.measuring import own_model

    argv = ["measure", "--device", "cuda:0", *flags, "--output", str(folder / "measurement.json")]
    argv += ["--environment-output", str(folder / "environment.json")]
    return own_model.main(argv, gpu=gpu or host_gpu())


def make_own_model_run(runs_dir: Path, n: int = 0, flags=RESNET) -> Path:
    """runs_dir/<run id>/ holding an own-model measurement made on the CPU stand-in."""
    runs_dir.mkdir(exist_ok=True)
    folder = runs_dir / run_id(n)
    folder.mkdir()
    assert own_model_run(folder, list(flags)) == 0
    return folder


# A one-layer Llama of published shape but tiny sizes: the configs the input checks edit.
LLAMA_1B = json.loads((ROOT / "tests/data/hf-configs/llama-3.2-1b.json").read_text())
SMALL_LLAMA = {
    **LLAMA_1B,
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
}

# A workload file whose output layer shares the embedding's weight (1000 x 512, float32),
# reaching the device in each of the ways users write it.
TIED_WORKLOAD = """
import torch
from own_model import Workload


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 512)
        self.head = torch.nn.Linear(512, 1000, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


def inputs(config):
    return lambda: torch.randint(0, 1000, (config.batch, 16), device=config.device)


def training(model, config):
    optimizer = torch.optim.AdamW(model.parameters())
    step = lambda model, ids: model(ids).float().logsumexp(-1).mean()
    return Workload(model, inputs(config), step=step, optimizer=optimizer)


def moved(config):
    return training(Tied().to(device=config.device, dtype=config.dtype), config)


def moved_then_cast(config):
    return training(Tied().to(config.device).to(config.dtype), config)


def built_there(config):
    with torch.device(config.device):
        model = Tied()
    return training(model, config)


def emptied(config):
    with torch.device("meta"):
        model = Tied()
    return training(model.to_empty(device=config.device), config)


def emptied_untied(config):
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
    return Workload(model.to_empty(device=config.device), lambda: torch.randn(
        config.batch, 512, device=config.device))
"""
