"""cuDNN recurrent layers, third probe: an LSTM with projections and dropout between layers
in training, and float64 (training and evaluation, with and without projections or dropout)."""
import json, random, sys, time, torch

t0 = time.time()
LIMIT = float(sys.argv[2]) if len(sys.argv) > 2 else 80
dev = "cuda:0"
out = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
       "gpu": torch.cuda.get_device_name(0), "rows": []}
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
      "float64": torch.float64}
MOD = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN_TANH": torch.nn.RNN}


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


def case(c, kind):
    kw = dict(input_size=c["input"], hidden_size=c["hidden"], num_layers=c["layers"],
              bidirectional=c["bidir"], batch_first=c["batch_first"], dropout=c.get("dropout", 0.0))
    if c.get("proj"):
        kw["proj_size"] = c["proj"]
    m = MOD[c["mode"]](**kw).to(dev, DT[c["dtype"]])
    shape = (c["batch"], c["seq"], c["input"]) if c["batch_first"] else (c["seq"], c["batch"], c["input"])
    x = torch.randn(shape, device=dev, dtype=DT[c["dtype"]])
    row = dict(c, kind=kind)
    row["weight_bytes"] = sum(p.numel() * p.element_size() for p in m.parameters())
    row["flat"] = len({p.untyped_storage().data_ptr() for p in m.parameters()}) == 1
    if kind == "eval":
        m.eval()
        with torch.no_grad():
            _, row["forward"] = events(lambda: m(x))
        with torch.inference_mode():
            _, row["inference_mode"] = events(lambda: m(x))
        return row
    x.requires_grad_(True)
    (y, h), row["forward"] = events(lambda: m(x))
    row["reserve"] = y.grad_fn._saved_result3.numel()
    _, row["backward"] = events(lambda: y.backward(torch.ones_like(y)))
    return row


rng = random.Random(20261207)


def shape(mode=None):
    return dict(mode=mode or rng.choice(["LSTM", "LSTM", "GRU", "RNN_TANH"]),
                dtype=rng.choice(["float32", "float16", "bfloat16"]),
                input=rng.choice([10, 33, 64, 100, 256, 650, 1000]),
                hidden=rng.choice([24, 50, 128, 300, 650, 1024, 1500]),
                layers=rng.choice([1, 2, 3, 5, 6, 8]), bidir=rng.random() < 0.4,
                seq=rng.choice([1, 7, 35, 70, 120, 300]), batch=rng.choice([1, 2, 10, 20, 48, 80]),
                batch_first=rng.random() < 0.5)



plan = []
for _ in range(80):  # projections and dropout, training
    s = shape("LSTM")
    s["layers"] = rng.choice([2, 3, 4, 6])
    s["proj"] = rng.choice([8, 16, 50, 100, 200, 400])
    s["dropout"] = rng.choice([0.1, 0.5])
    s["dtype"] = rng.choice(["float32", "float16", "bfloat16", "float64"])
    if s["proj"] < s["hidden"]:
        plan.append(("train", s))
for _ in range(70):  # float64, training
    s = shape()
    s["dtype"] = "float64"
    if rng.random() < 0.3:
        s["dropout"] = rng.choice([0.1, 0.5])
    if s["mode"] == "LSTM" and rng.random() < 0.3:
        s["proj"] = rng.choice([8, 16, 50, 100])
        if s["proj"] >= s["hidden"]:
            del s["proj"]
    plan.append(("train", s))
for _ in range(40):  # float64, evaluation
    s = shape()
    s["dtype"] = "float64"
    plan.append(("eval", s))
rng.shuffle(plan)
for kind, c in plan:
    if time.time() - t0 > LIMIT:
        break
    try:
        out["rows"].append(case(c, kind))
    except Exception as e:  # noqa
        out["rows"].append(dict(c, kind=kind, error=f"{type(e).__name__}: {e}"[:300]))
    torch.cuda.empty_cache()
out["seconds"] = round(time.time() - t0, 1)
json.dump(out, open(sys.argv[1], "w"))
print(len(out["rows"]), "rows in", out["seconds"], "s;", sum("error" in r for r in out["rows"]), "errors")
