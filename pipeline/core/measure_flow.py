"""One measurement's order, the same for every workload (the seed network, the decoder, a
user's model): every output refused before anything runs; the CUDA driver started at once, so
that its seconds overlap the workload's own preparation; the environment recorded and, where
asked, written first, so that a run refused for want of PyTorch or a GPU still leaves its
diagnostic; the phases; then the measurement file, written whatever happened on the GPU.
Part of the kit script (make_kit_script.py copies it in): standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.core.arguments import UsageError
from pipeline.core.environment_capture import (
    collect_environment,
    environment_document,
    start_cuda_driver,
    start_driver_query,
    stop_cuda_driver,
)
from pipeline.core.run_status import RunStatus
from pipeline.core.writers import refuse_existing, write_result


def refuse_outputs(named: dict[str, Path | None]) -> None:
    """Each output option's file (None: not asked for) is new, and each is its own file."""
    given = {option: path for option, path in named.items() if path is not None}
    for path in given.values():
        refuse_existing(path)
    seen: dict[Path, str] = {}
    for option, path in given.items():
        first = seen.setdefault(path.resolve(), option)
        if first != option:
            raise UsageError(f"{option} and {first} must be two files")


class EnvironmentStart:
    """The environment's slow parts (the driver query, the CUDA driver) started now; the
    record is taken by record(), once the workload is ready to measure."""

    def __init__(self, device: int) -> None:
        self.driver_query = start_driver_query()
        self.cuda_driver = start_cuda_driver(device)

    def record(self, args, output: Path | None, check=None, collect=collect_environment) -> dict:
        """The environment of this run (`collect` reads it), checked by `check` before anything
        is written, then written to `output` where one was asked for."""
        environment = collect(args.device, args.device_text, self.driver_query, args.process_start)
        stop_cuda_driver(self.cuda_driver)
        if check is not None:
            check(environment)
        if output is not None:
            write_result(output, environment_document(environment))
        return environment


def write_measurement(output: Path, document: dict) -> None:
    """The measurement file, and one line of what it holds (a second line on stderr when the
    GPU ran out of memory: where, and PyTorch's words)."""
    write_result(output, document)
    print(f"{output}: {document['status']}, {len(document['phases'])} phase rows")
    if document["status"] == RunStatus.OUT_OF_MEMORY:
        failure = document["failure"]
        print(f"out of memory in phase {failure['phase']}: {failure['error']}", file=sys.stderr)
