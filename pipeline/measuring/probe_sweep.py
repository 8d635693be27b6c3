"""Probe, on a GPU, every operator call that the GPU-free estimate of some workloads makes.

    python -m pipeline.measuring.probe_sweep POINTS.txt --out DIR [--device cuda:0] [--gpu h200]
                                              [--budget-s 240]

POINTS.txt holds one workload a line, `#` starting a comment: `NAME ESTIMATE-ARGUMENTS...`,
the arguments `own_model.py estimate` takes (`--hf-config FILE --task training --batch 2
--dim sequence=512 --dtype bfloat16`, or `--workload FILE:FUNC ...`), or `NAME decoder
ARGUMENTS...` with those of `decoder.py estimate` (`--preset llama-3.1-8b --batch 8 --prompt
4096 --new-tokens 2`): the decoder traced through the phase driver its `measure` runs.

Each workload is traced as `estimate --gpu GPU` traces it without a GPU (on the meta device,
the GPU's attention rule choosing the kernel), so the probes cover exactly the calls such an
estimate will look up; then each distinct call runs once on this GPU under the allocator's
history (trace_prediction.probe_operators). DIR/probes/NAME.json records every call that
is not a view or output-only by its operator, the matrix products included (their cuBLAS
workspaces generalise by form, gpu_calibration.GENERALISED), with the blocks each probe
allocated; `gpu_calibration.py build` turns such folders into the committed calibration.

Every output name is refused before the GPU is touched if it exists; a workload past
--budget-s is not started and said so. Exit 0 when every workload was probed, 1 when one
stopped or failed (its line says why), 2 on unusable input.
"""

from __future__ import annotations

import gc
import json
import re
import shlex
import sys
import time
from pathlib import Path

from pipeline.core import cli, environment_capture, writers
from pipeline.measuring import decoder, own_model
from pipeline.predicting import attention_choice, gpu_calibration, trace_prediction

PROG = "probe_sweep.py"
TARGETS = {"h200": attention_choice.H200}


DECODER = "decoder"  # a points line's first argument for decoder.py's model


def parsed(argv: list[str]):
    """A line's arguments, read by the parser of the estimate they are given to."""
    if argv[:1] == [DECODER]:
        args = decoder.build_parser().parse_args(["estimate", *argv[1:]])
        decoder.shape_from_args(args), decoder.run_configuration(args)  # their usage errors
        return args
    return own_model.build_parser().parse_args(["estimate", *argv])


def read_points(text: str) -> list[tuple[str, list[str]]]:
    """(NAME, estimate arguments) per line; each checked by its estimate's own parser."""
    points, names = [], set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *argv = shlex.split(line)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise cli.UsageError(f"line {number}: {name!r} is not a usable file name")
        if name in names:
            raise cli.UsageError(f"line {number}: {name} named twice")
        try:
            parsed(argv)
        except cli.UsageError as exc:
            raise cli.UsageError(f"line {number} ({name}): {exc}") from None
        names.add(name)
        points.append((name, argv))
    if not points:
        raise cli.UsageError("no workload in the points file")
    return points


def recorded(trace: trace_prediction.Trace) -> dict:
    """The calls a calibration is built from: all but views and output-only operators."""
    return {
        key: {"name": s.name, "calls": s.calls, "view": s.view, "leaves": repr(s.leaves)}
        for key, s in trace.signatures.items()
        if not s.view and trace_prediction.packet(s.name) not in trace_prediction.OUTPUT_ONLY
    }


def trace_point(torch, argv: list[str], target):
    """The trace `own_model.py estimate ARGV --gpu` makes, on meta whatever this machine has
    (for a decoder line, the trace of the run `decoder.py measure` makes)."""
    args = parsed(argv)
    if argv[:1] == [DECODER]:
        shape, _ = decoder.shape_from_args(args)
        trace = decoder.trace(torch, shape, decoder.run_configuration(args), 0, target)
        return (None, trace.stopped) if trace.stopped else (trace, None)
    setting = own_model.setting_from(args)
    own_model.load(setting)
    trace, _, failure = own_model.trace_workload(torch, setting, 0, target, device="meta")
    if failure is not None:
        return None, f"the workload raised {type(failure.original).__name__} in {failure.phase}"
    return (None, trace.stopped) if trace.stopped else (trace, None)


def probe_point(torch, device, name: str, argv: list[str], target) -> tuple[dict | None, str]:
    started = time.monotonic()
    trace, stopped = trace_point(torch, argv, target)
    if trace is None:
        return None, f"not probed: {stopped}"
    calibration = trace_prediction.probe_operators(torch, device, trace)
    calls = recorded(trace)
    document = {
        "name": name,
        "argv": argv,
        "signatures": calls,
        "calibration": calibration.to_json(trace),
        "notes": trace.notes,
        "seconds": round(time.monotonic() - started, 3),
    }
    products = sum(entry["name"] in gpu_calibration.GENERALISED for entry in calls.values())
    return document, (
        f"{len(calls)} calls ({products} matrix products), {len(calibration.templates)} with "
        f"blocks of their own, {len(calibration.failed)} failed, {document['seconds']:.1f} s"
    )


def build_parser() -> cli.Parser:
    parser = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("points", type=Path, help="one `NAME ESTIMATE-ARGUMENTS...` a line")
    parser.add_argument("--out", type=Path, required=True, help="an existing folder")
    parser.add_argument("--device", type=cli.device, default="cuda:0")
    parser.add_argument(
        "--gpu",
        choices=sorted(TARGETS),
        default="h200",
        help="whose attention rule the traces follow (the estimate's --gpu)",
    )
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="no workload is started past this many seconds")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        points = read_points(args.points.read_text())
        folder = cli.existing_folder(args.out) / "probes"
        targets = [folder / f"{name}.json" for name, _ in points]
        if folder.exists():
            for path in targets:
                writers.refuse_existing(path)
        torch = environment_capture.import_torch()
        if not torch.cuda.is_available():
            raise cli.UsageError("no CUDA GPU is visible: probes run on the GPU they calibrate")
        folder.mkdir(exist_ok=True)
        device = torch.device(args.device)
        deadline = time.monotonic() + args.budget_s
        failed = 0
        for (name, point_argv), path in zip(points, targets, strict=True):
            if time.monotonic() > deadline:
                print(f"{name}: not started: past --budget-s {args.budget_s:g}", flush=True)
                failed += 1
                continue
            try:
                document, said = probe_point(torch, device, name, point_argv, TARGETS[args.gpu])
            except Exception as exc:  # one workload's failure, said; the next one runs
                document, said = None, f"failed: {type(exc).__name__}: {str(exc)[:300]}"
            finally:
                gc.collect()
                torch.cuda.empty_cache()
            if document is not None:
                writers.write_new(path, (json.dumps(document) + "\n").encode())
            failed += document is None
            print(f"{name}: {said}", flush=True)
        return cli.OK if not failed else cli.INVALID

    return cli.run(PROG, body, interrupted="every probe file written is whole")


if __name__ == "__main__":
    sys.exit(main())
