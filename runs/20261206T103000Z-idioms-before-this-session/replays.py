"""Each idiom of the idioms probe traced without a GPU by the code of the tree it runs in,
and replayed with the H200 calibration: one JSON line an idiom, its status and its requests
grouped as tests/conftest.py groups them (a kernel's kept workspaces aside).

    cd TREE && PYTHONPATH=. python3 PATH/replays.py PATH/idioms.py > replays.txt

TREE is the checkout whose code is compared (a worktree of an older commit); PATH/idioms.py
is runs/20261206T095000Z-h100-idioms-history/idioms.py, read from the newer tree."""

import json
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.core import allocator_model
from pipeline.predicting import attention_choice, gpu_calibration
from pipeline.predicting import trace_prediction as tp


def idioms(path: Path) -> dict:
    """The probe's steps by name: its definitions, without its imports and its main loop."""
    text = path.read_text(encoding="utf-8")
    body = "S = {}" + text.split("S = {}", 1)[1].split("names = sys.argv", 1)[0]
    namespace = {"torch": torch, "nn": nn, "F": F}
    exec(body, namespace)
    return namespace["S"]


def grouped(events) -> list:
    found, freed = [], []
    for action, nbytes in events:
        size = allocator_model.block_bytes(nbytes)
        if action == "alloc":
            found += [("free", sorted(freed))] if freed else []
            found.append(("alloc", size))
            freed = []
        else:
            freed.append(size)
    return found


def main() -> None:
    calibration, _ = gpu_calibration.load("h200")
    for name, step in idioms(Path(sys.argv[1])).items():

        def drive(phase, step=step):
            phase("step", lambda: step("meta"))

        trace = tp.run_trace(torch, "meta", drive, target=attention_choice.H200)
        if trace.stopped:
            print(json.dumps({"name": name, "status": "stopped"}))
            continue
        status = tp.predict(trace, calibration).status.value
        log = tp.replay(trace, calibration)[1]
        events = [(kind, nbytes) for kind, nbytes, what in log[1:] if "kept" not in what]
        requests = grouped([("alloc" if kind == "alloc" else "free", n) for kind, n in events])
        print(json.dumps({"name": name, "status": status, "requests": requests}))


if __name__ == "__main__":
    main()
