"""Which batch-norm kernel the GPU takes, and what cuDNN's allocates besides its outputs."""
import json, sys, torch
from torch.utils._python_dispatch import TorchDispatchMode

out = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "rows": []}
dev = "cuda:0"

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.names = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))

def ops_of(dtype, fmt, mode, eps=1e-5, wdtype=None):
    bn = torch.nn.BatchNorm2d(64, eps=eps).to(dev, dtype=wdtype or dtype)
    x = torch.randn(4, 64, 14, 14, device=dev, dtype=dtype).to(memory_format=fmt)
    if mode == "train":
        bn.train(); x.requires_grad_()
        m = Ops()
        with m:
            y = bn(x); y.sum().backward()
    elif mode == "no_grad":
        bn.eval(); m = Ops()
        with torch.no_grad(), m: bn(x)
    else:
        bn.eval(); m = Ops()
        with torch.inference_mode(), m: bn(x)
    return [n for n in m.names if "detach" not in n]

for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for fmt in (torch.contiguous_format, torch.channels_last):
        for mode in ("train", "no_grad", "inference"):
            try:
                names = ops_of(dtype, fmt, mode)
            except Exception as e:
                names = [f"error {type(e).__name__}: {e}"[:200]]
            out["rows"].append({"probe": "ops", "dtype": str(dtype), "fmt": str(fmt), "mode": mode, "ops": names})
# fp16 input with fp32 weights (autocast-like)
for mode in ("train", "no_grad"):
    out["rows"].append({"probe": "ops", "dtype": "float16 in, float32 weight", "mode": mode,
                        "ops": ops_of(torch.float16, torch.contiguous_format, mode, wdtype=torch.float32)})
for eps in (1e-6, 1e-9):
    out["rows"].append({"probe": "ops", "dtype": "float32", "eps": eps, "mode": "train",
                        "ops": ops_of(torch.float32, torch.contiguous_format, "train", eps=eps)})

def blocks(fn):
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    r = fn(); torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ev = [(e["action"], e["size"]) for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
    return r, ev

# ResNet-50's batch-norm shapes (channels, side) at batch 16 and 64
shapes = [(64, 112), (64, 56), (256, 56), (128, 56), (128, 28), (512, 28), (256, 28), (256, 14), (1024, 14), (512, 14), (512, 7), (2048, 7)]
for batch in (1, 16, 64):
    for dtype in (torch.float32, torch.float16):
        for fmt in (torch.contiguous_format, torch.channels_last):
            for c, s in shapes:
                x = torch.randn(batch, c, s, s, device=dev, dtype=dtype).to(memory_format=fmt)
                w = torch.ones(c, device=dev); b = torch.zeros(c, device=dev)
                rm = torch.zeros(c, device=dev); rv = torch.ones(c, device=dev)
                row = {"probe": "cudnn", "batch": batch, "c": c, "side": s, "dtype": str(dtype), "fmt": str(fmt)}
                try:
                    for training in (True, False):
                        r, ev = blocks(lambda: torch.ops.aten.cudnn_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5))
                        row["train" if training else "eval"] = {"outputs": [[list(t.shape), str(t.dtype), t.untyped_storage().nbytes()] for t in r], "events": ev}
                        if training:
                            saved = r
                    g = torch.randn_like(x)
                    r2, ev2 = blocks(lambda: torch.ops.aten.cudnn_batch_norm_backward(x, g, w, rm, rv, saved[1], saved[2], 1e-5, saved[3]))
                    row["backward"] = {"outputs": [[list(t.shape), str(t.dtype), t.untyped_storage().nbytes()] for t in r2], "events": ev2}
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                out["rows"].append(row)
                del x
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("rows", len(out["rows"]))
