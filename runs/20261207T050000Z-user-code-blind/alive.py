"""On a GPU: the blocks alive after a step whose result is kept (the graph with it), each with
the Python and C++ frames that asked for it; beside them, the same step traced without a GPU
and replayed, the blocks alive at the same point with the operator that made each.

    python3 alive.py FILE.py:FUNCTION BATCH DTYPE [NAME=VALUE ...]"""

import collections
import sys

import torch

from pipeline.core import torch_private
from pipeline.core.workload_contract import Configuration
from pipeline.measuring import own_model
from pipeline.predicting import trace_prediction as tp

spec, batch, dtype, *dims = sys.argv[1:]
path, function = spec.split(":")
dims = {k: int(v) for k, v in (d.split("=") for d in dims)}
file = own_model.read_workload_file(own_model.Path(path), function)
module = own_model.import_workload(file)
make = getattr(module, function)
config = Configuration(torch.device("cuda:0"), getattr(torch, dtype), int(batch), 0)
torch.manual_seed(0)
w = make(config, **dims)
inputs = w.make_inputs()
result = w.step(w.model, inputs)
del result
torch.cuda.synchronize()
torch_private.record_memory_history(torch, context="alloc", stacks="all")
before = len(torch_private.memory_snapshot(torch)["device_traces"][0])
result = w.step(w.model, inputs)
torch.cuda.synchronize()
snap = torch_private.memory_snapshot(torch)
events = snap["device_traces"][0][before:]
torch_private.stop_memory_history(torch)
alive = {}
for e in events:
    if e["action"] == "alloc":
        alive[e["addr"]] = e
    elif e["action"] == "free_completed":
        alive.pop(e["addr"], None)


def where(e):
    names = [f.get("name", "") for f in e.get("frames", [])]
    keep = [n for n in names if n and not n.startswith(("c10::", "std::", "torch::autograd::python"))]
    py = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in e.get("frames", []) if f.get("filename", "").endswith(".py")]
    return " < ".join(keep[:4]) + " | " + " < ".join(py[:3])


groups = collections.Counter((e["size"], where(e)) for e in alive.values())
print(f"GPU: {len(alive)} blocks alive after the step, {sum(e['size'] for e in alive.values())} B")
for (size, w_), n in sorted(groups.items(), key=lambda x: -x[0][0] * x[1]):
    print(f"  {n:4d} x {size:>12,d}  {w_}")
