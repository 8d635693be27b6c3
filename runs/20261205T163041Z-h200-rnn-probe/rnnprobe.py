"""What cuDNN's recurrent layers allocate on this GPU: every block of a forward (training and
no_grad) and a backward, the reserve's exact size, the kernel autograd records."""
import json, random, sys, time, torch

t0 = time.time()
LIMIT = float(sys.argv[2]) if len(sys.argv) > 2 else 90
dev = "cuda:0"
out = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
       "gpu": torch.cuda.get_device_name(0), "rows": []}
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MOD = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN_TANH": torch.nn.RNN, "RNN_RELU": torch.nn.RNN}


def events(fn):
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    r = fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ev = [[e["action"][0], e["size"]] for e in snap["device_traces"][0]
          if e["action"] in ("alloc", "free_requested")]
    return r, ev


def case(c):
    kw = dict(input_size=c["input"], hidden_size=c["hidden"], num_layers=c["layers"],
              bidirectional=c["bidir"], batch_first=c["batch_first"], bias=c["bias"])
    if c["mode"] == "RNN_RELU":
        kw["nonlinearity"] = "relu"
    if c["proj"]:
        kw["proj_size"] = c["proj"]
    m = MOD[c["mode"]](**kw).to(dev, DT[c["dtype"]])
    shape = (c["batch"], c["seq"], c["input"]) if c["batch_first"] else (c["seq"], c["batch"], c["input"])
    x = torch.randn(shape, device=dev, dtype=DT[c["dtype"]])
    row = dict(c)
    row["weight_bytes"] = sum(p.numel() * p.element_size() for p in m.parameters())
    row["flat"] = m._flat_weights[0].data_ptr() == m._flat_weights[0].untyped_storage().data_ptr() and len({p.untyped_storage().data_ptr() for p in m.parameters()}) == 1
    with torch.no_grad():
        _, row["no_grad"] = events(lambda: m(x))
    x.requires_grad_(c["grad_input"])
    (y, h), row["train"] = events(lambda: m(x))
    row["kernel"] = type(y.grad_fn).__name__
    try:
        row["reserve"] = y.grad_fn._saved_result3.numel()
    except Exception as e:  # noqa
        row["reserve"] = f"{type(e).__name__}"
    g = torch.ones_like(y)
    _, row["backward"] = events(lambda: y.backward(g))
    del y, h, g, x, m
    return row


rng = random.Random(20261205)
cases = []
base = dict(mode="LSTM", dtype="float32", input=128, hidden=256, layers=2, bidir=False, seq=32,
            batch=16, batch_first=False, bias=True, proj=0, grad_input=True)
cases.append(dict(base))
for k, vals in dict(mode=["GRU", "RNN_TANH", "RNN_RELU"], dtype=["float16", "bfloat16"],
                    input=[1, 17, 512, 1024], hidden=[1, 20, 64, 100, 512, 1000, 1024, 2048],
                    layers=[1, 3, 4], bidir=[True], seq=[1, 2, 5, 64, 128, 512],
                    batch=[1, 2, 5, 33, 64, 128, 256], batch_first=[True], bias=[False],
                    proj=[32, 128], grad_input=[False]).items():
    for v in vals:
        cases.append(dict(base, **{k: v}))
while len(cases) < 1200:
    mode = rng.choice(["LSTM", "LSTM", "GRU", "RNN_TANH"])
    hidden = rng.choice([16, 32, 64, 96, 128, 200, 256, 384, 512, 768, 1024])
    cases.append(dict(mode=mode, dtype=rng.choice(["float32", "float16", "bfloat16"]),
                      input=rng.choice([8, 32, 64, 80, 128, 300, 512]), hidden=hidden,
                      layers=rng.choice([1, 1, 2, 3, 4]), bidir=rng.random() < 0.4,
                      seq=rng.choice([1, 3, 10, 16, 50, 100, 200, 256]),
                      batch=rng.choice([1, 4, 8, 16, 32, 50, 64, 128]),
                      batch_first=rng.random() < 0.5, bias=rng.random() < 0.85,
                      proj=(rng.choice([0, 0, hidden // 2]) if mode == "LSTM" and hidden > 16 else 0),
                      grad_input=rng.random() < 0.7))
for c in cases:
    if time.time() - t0 > LIMIT:
        break
    try:
        out["rows"].append(case(c))
    except Exception as e:  # noqa
        out["rows"].append(dict(c, error=f"{type(e).__name__}: {e}"[:300]))
    torch.cuda.empty_cache()
out["seconds"] = round(time.time() - t0, 1)
json.dump(out, open(sys.argv[1], "w"))
print(len(out["rows"]), "rows in", out["seconds"], "s;", sum("error" in r for r in out["rows"]), "errors")
print({r["kernel"] for r in out["rows"] if "kernel" in r})
