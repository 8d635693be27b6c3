"""cuDNN recurrent layers, second probe: dropout's state (first thing in the process), the
workspace in evaluation mode, new training shapes (up to 8 layers), projections with their
own sizes, and dropout between layers in training."""
import json, random, sys, time, torch

t0 = time.time()
LIMIT = float(sys.argv[2]) if len(sys.argv) > 2 else 80
dev = "cuda:0"
out = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
       "gpu": torch.cuda.get_device_name(0), "rows": []}
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
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


rng = random.Random(20261206)


def shape(mode=None):
    return dict(mode=mode or rng.choice(["LSTM", "LSTM", "GRU", "RNN_TANH"]),
                dtype=rng.choice(["float32", "float16", "bfloat16"]),
                input=rng.choice([10, 33, 64, 100, 256, 650, 1000]),
                hidden=rng.choice([24, 50, 128, 300, 650, 1024, 1500]),
                layers=rng.choice([1, 2, 3, 5, 6, 8]), bidir=rng.random() < 0.4,
                seq=rng.choice([1, 7, 35, 70, 120, 300]), batch=rng.choice([1, 2, 10, 20, 48, 80]),
                batch_first=rng.random() < 0.5)


plan = [("dropout-first", dict(mode="LSTM", dtype="float32", input=650, hidden=650, layers=2,
                               bidir=False, seq=35, batch=20, batch_first=False, dropout=0.5))]
plan += [("eval", shape()) for _ in range(260)]
plan += [("train", shape()) for _ in range(200)]
for _ in range(60):
    s = shape("LSTM")
    s["proj"] = rng.choice([8, 16, 50, 100, 200, 400])
    if s["proj"] < s["hidden"]:
        plan.append(("train", s))
for _ in range(40):
    plan.append(("train", dict(shape(), dropout=rng.choice([0.1, 0.5]))))
rest = plan[1:]
rng.shuffle(rest)
plan = plan[:1] + rest
for kind, c in plan:
    if time.time() - t0 > LIMIT:
        break
    try:
        if kind == "dropout-first":
            m = torch.nn.LSTM(650, 650, 2, dropout=0.5).to(dev)
            x = torch.randn(35, 20, 650, device=dev, requires_grad=True)
            (y, _), ev = events(lambda: m(x))
            _, ev2 = events(lambda: m(x))
            out["rows"].append(dict(c, kind=kind, first=ev, second=ev2,
                                    reserve=y.grad_fn._saved_result3.numel()))
            del m, x, y
        else:
            out["rows"].append(case(c, kind))
    except Exception as e:  # noqa
        out["rows"].append(dict(c, kind=kind, error=f"{type(e).__name__}: {e}"[:300]))
    torch.cuda.empty_cache()
out["seconds"] = round(time.time() - t0, 1)
json.dump(out, open(sys.argv[1], "w"))
print(len(out["rows"]), "rows in", out["seconds"], "s;", sum("error" in r for r in out["rows"]), "errors")
