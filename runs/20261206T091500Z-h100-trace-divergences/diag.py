"""The GPU's allocations with the C++ functions that made them, for the divergent cases."""
import sys
import torch
exec(open("runs/20261206T091500Z-h100-trace-divergences/diverge.py").read().split("def history")[0])
names = sys.argv[1].split(",")
KEEP = ("at::native::", "torch::autograd::generated::", "at::_ops::", "torch::autograd::", "c10::cuda::")
for name in names:
    step = CASES[name]
    step("cuda")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(context="all", stacks="all")
    before = len(torch.cuda.memory._snapshot()["device_traces"][0])
    kept = step("cuda"); del kept
    torch.cuda.synchronize()
    events = torch.cuda.memory._snapshot()["device_traces"][0][before:]
    torch.cuda.memory._record_memory_history(enabled=None)
    print("==", name, flush=True)
    for e in events:
        if e["action"] not in ("alloc", "free_completed"):
            continue
        frames = [f["name"] for f in e.get("frames", []) if any(f["name"].startswith(k) for k in KEEP)]
        short = []
        for f in frames:
            f = f.split("(")[0]
            if f not in short and "dispatch" not in f.lower() and "wrapper" not in f.lower() and "boxed" not in f.lower():
                short.append(f)
        print(e["action"][:5], e["size"], " < ".join(short[:6]), flush=True)
