"""GPU history vs the trace for paths suspected to differ under a dispatch mode."""
import json, sys
import torch, torch.nn.functional as F
sys.path.insert(0, "tests")
from test_ctc_loss import blocks, grouped, until_the_last_request as cut
from pipeline.core import torch_private
from pipeline.predicting import attention_choice, trace_prediction as tp

def ce(ls, weight, reduction, ignore):
    def step(dev):
        x = torch.randn(64, 1000, device=dev, requires_grad=True)
        y = torch.randint(0, 1000, (64,), device=dev)
        if ignore:
            y[::4] = -100
        w = torch.rand(1000, device=dev) if weight else None
        loss = F.cross_entropy(x, y, weight=w, label_smoothing=ls, reduction=reduction)
        (loss if loss.dim() == 0 else loss.sum()).backward()
        return x
    return step

def mm(a, b, ga, gb, dtype=torch.float32):
    def step(dev):
        x = torch.randn(*a, device=dev, dtype=dtype, requires_grad=ga)
        y = torch.randn(*b, device=dev, dtype=dtype, requires_grad=gb)
        out = torch.matmul(x, y)
        if ga or gb:
            out.float().sum().backward()
        return x, y
    return step

def mf(grad_value, inplace):
    def step(dev):
        x = torch.randn(256, 1024, device=dev, requires_grad=True)
        v = torch.tensor(0.5, device=dev, requires_grad=grad_value)
        mask = torch.rand(256, 1024, device=dev) > 0.5
        h = x * 2
        out = h.masked_fill_(mask, v) if inplace else h.masked_fill(mask, v)
        out.sum().backward()
        return x, v
    return step

CASES = {
    "ce-ls": ce(0.1, False, "mean", False),
    "ce-ls-ignore": ce(0.1, False, "mean", True),
    "ce-ls-weight-mean": ce(0.1, True, "mean", False),
    "ce-ls-weight-mean-ignore": ce(0.1, True, "mean", True),
    "ce-ls-weight-sum": ce(0.1, True, "sum", False),
    "ce-weight-mean": ce(0.0, True, "mean", False),
    "mm-1xb-grad": mm((1, 64, 128), (8, 128, 32), True, True),
    "mm-bx1-grad": mm((8, 64, 128), (1, 128, 32), True, True),
    "mm-1xb-nograd": mm((1, 64, 128), (8, 128, 32), False, False),
    "mm-2dx3d-grad": mm((64, 128), (8, 128, 32), True, True),
    "mm-3dx2d-grad": mm((8, 64, 128), (128, 32), True, True),
    "mm-4d-bcast-grad": mm((2, 1, 64, 128), (1, 4, 128, 32), True, True),
    "mm-1xb-grad-bf16": mm((1, 64, 128), (8, 128, 32), True, False, torch.bfloat16),
    "mf-value-grad": mf(True, False),
    "mf-value-grad-inplace": mf(True, True),
    "mf-value-nograd": mf(False, False),
}

def history(step):
    torch.cuda.synchronize()
    torch_private.record_memory_history(torch, context=None, stacks="python")
    before = len(torch_private.memory_snapshot(torch)["device_traces"][0])
    kept = step("cuda")
    del kept
    torch.cuda.synchronize()
    events = torch_private.memory_snapshot(torch)["device_traces"][0][before:]
    torch_private.stop_memory_history(torch)
    return [(e["action"], e["size"]) for e in events if e["action"] in ("alloc", "free_completed")]

def traced(step, device):
    def drive(phase):
        phase("step", lambda: step(device))
    return tp.run_trace(torch, device, drive, target=attention_choice.H200)

out = {}
for name, step in CASES.items():
    step("cuda")  # warm: cuBLAS handles and workspaces made once
    gpu = cut(grouped(history(step)))
    row = {"gpu": gpu}
    for device in ("meta", "cuda:0"):
        try:
            t = traced(step, device)
            b = cut(blocks(t))
            first = next((i for i, (x, y) in enumerate(zip(b, gpu)) if x != y), min(len(b), len(gpu)))
            row[device] = {"stopped": t.stopped, "blocks": b, "equal": b == gpu, "first_diff": first}
        except Exception as exc:
            row[device] = {"error": repr(exc)}
    m, c = row["meta"], row["cuda:0"]
    print(name, "meta", m.get("equal"), m.get("first_diff"), m.get("stopped") or m.get("error"), "| cuda", c.get("equal"), c.get("first_diff"), flush=True)
    if not m.get("equal", True):
        i = m["first_diff"]
        print("   gpu  ", gpu[max(0, i - 2): i + 4], flush=True)
        print("   trace", m["blocks"][max(0, i - 2): i + 4], flush=True)
    out[name] = row
    json.dump(out, open(sys.argv[1], "w"), indent=1)
