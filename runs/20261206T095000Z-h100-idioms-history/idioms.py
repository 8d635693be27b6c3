"""Common PyTorch idioms, each one small step: the GPU-free trace's replay (calibration for the
H200, its kernels' scratch and copies included, a warm GPU's kept workspaces aside) against
the GPU's allocator history, request by request (tests/test_cublas_operands.grouped).

    python3 runs/20261206T095000Z-h100-idioms-history/idioms.py [NAME,NAME...]

Prints one line a step: the prediction's status, whether the requests are equal, and where
they first differ. A step said "exact" whose requests differ is marked FALSE-EXACT?."""

import sys
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, "tests")
from test_cublas_operands import grouped, history

from pipeline.predicting import attention_choice, gpu_calibration
from pipeline.predicting import trace_prediction as tp

CAL, _ = gpu_calibration.load("h200")
S = {}


def step(f):
    S[f.__name__] = f
    return f


def mlp(dev, dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10)).to(dev, dtype)


@step
def linear_sum(dev):
    m = mlp(dev)
    x = torch.randn(64, 256, device=dev)
    m(x).sum().backward()
    return m


@step
def linear_mse(dev):
    m = mlp(dev)
    x = torch.randn(64, 256, device=dev)
    F.mse_loss(m(x), torch.randn(64, 10, device=dev)).backward()
    return m


@step
def linear_mean_3d(dev):
    m = mlp(dev)
    x = torch.randn(8, 32, 256, device=dev)
    m(x).mean().backward()
    return m


@step
def embed_ce_ignore(dev):
    e = nn.Embedding(1000, 128).to(dev)
    h = nn.Linear(128, 1000).to(dev)
    ids = torch.randint(0, 1000, (8, 64), device=dev)
    lab = ids.clone()
    lab[:, :5] = -100
    F.cross_entropy(h(e(ids)).view(-1, 1000), lab.view(-1)).backward()
    return e, h


@step
def layernorm_res(dev):
    ln = nn.LayerNorm(256).to(dev)
    lin = nn.Linear(256, 256).to(dev)
    x = torch.randn(16, 64, 256, device=dev, requires_grad=True)
    y = x + lin(ln(x))
    y.pow(2).mean().backward()
    return ln, lin, x


@step
def batchnorm_train(dev):
    m = nn.Sequential(nn.Linear(128, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 4)).to(
        dev
    )
    x = torch.randn(64, 128, device=dev)
    F.cross_entropy(m(x), torch.randint(0, 4, (64,), device=dev)).backward()
    return m


@step
def conv_pool(dev):
    m = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    ).to(dev)
    x = torch.randn(8, 3, 32, 32, device=dev)
    F.cross_entropy(m(x), torch.randint(0, 10, (8,), device=dev)).backward()
    return m


@step
def softmax_dim0(dev):
    x = torch.randn(128, 64, device=dev, requires_grad=True)
    (x.softmax(0) * torch.randn(128, 64, device=dev)).sum().backward()
    return x


@step
def cat_stack(dev):
    a = torch.randn(64, 32, device=dev, requires_grad=True)
    b = torch.randn(64, 32, device=dev, requires_grad=True)
    (torch.cat([a, b], 1).sum() + torch.stack([a, b]).pow(2).sum()).backward()
    return a, b


@step
def gather_scatter(dev):
    x = torch.randn(64, 100, device=dev, requires_grad=True)
    i = torch.randint(0, 100, (64, 5), device=dev)
    x.gather(1, i).sum().backward()
    return x


@step
def topk_cumsum(dev):
    x = torch.randn(64, 100, device=dev, requires_grad=True)
    (x.topk(5, dim=1).values.sum() + x.cumsum(1).mean()).backward()
    return x


@step
def einsum_bmm(dev):
    a = torch.randn(8, 32, 64, device=dev, requires_grad=True)
    b = torch.randn(8, 64, 16, device=dev, requires_grad=True)
    torch.einsum("bij,bjk->bik", a, b).sum().backward()
    return a, b


@step
def where_clamp(dev):
    x = torch.randn(64, 64, device=dev, requires_grad=True)
    torch.where(x > 0, x, 0.1 * x).clamp(-1, 1).sum().backward()
    return x


@step
def transpose_contig(dev):
    x = torch.randn(32, 64, 128, device=dev, requires_grad=True)
    lin = nn.Linear(32, 16).to(dev)
    lin(x.transpose(0, 2).contiguous()).sum().backward()
    return x, lin


@step
def normalize_norm(dev):
    x = torch.randn(64, 128, device=dev, requires_grad=True)
    (F.normalize(x, dim=1).sum() + x.norm()).backward()
    return x


@step
def repeat_expand(dev):
    x = torch.randn(16, 1, 64, device=dev, requires_grad=True)
    (x.expand(16, 8, 64).contiguous().sum() + x.repeat(1, 4, 1).mean()).backward()
    return x


@step
def sdpa_causal(dev):
    q = torch.randn(4, 8, 128, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).float().sum().backward()
    return q


@step
def mha_train(dev):
    m = nn.MultiheadAttention(128, 4, batch_first=True).to(dev)
    x = torch.randn(8, 32, 128, device=dev)
    m(x, x, x)[0].sum().backward()
    return m


@step
def silu_glu(dev):
    a = nn.Linear(128, 512).to(dev)
    b = nn.Linear(128, 512).to(dev)
    c = nn.Linear(512, 128).to(dev)
    x = torch.randn(16, 128, device=dev)
    F.mse_loss(c(F.silu(a(x)) * b(x)), x).backward()
    return a, b, c


@step
def adamw_step(dev):
    m = mlp(dev)
    o = torch.optim.AdamW(m.parameters())
    m(torch.randn(64, 256, device=dev)).pow(2).mean().backward()
    o.step()
    o.zero_grad()
    return m, o


@step
def clip_grad(dev):
    m = mlp(dev)
    m(torch.randn(64, 256, device=dev)).pow(2).mean().backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    return m


@step
def autocast_bf16(dev):
    m = mlp(dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(torch.randn(64, 256, device=dev))
    y.float().pow(2).mean().backward()
    return m


@step
def sgd_momentum(dev):
    m = mlp(dev)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(64, 256, device=dev)).pow(2).mean().backward()
    o.step()
    return m, o


@step
def lstm_train(dev):
    m = nn.LSTM(64, 128, 2, batch_first=True).to(dev)
    x = torch.randn(8, 20, 64, device=dev)
    m(x)[0].pow(2).mean().backward()
    return m


@step
def ce_label_smoothing(dev):
    x = torch.randn(64, 100, device=dev, requires_grad=True)
    nn.CrossEntropyLoss(label_smoothing=0.1)(x, torch.randint(0, 100, (64,), device=dev)).backward()
    return x


@step
def bce_logits(dev):
    x = torch.randn(64, 10, device=dev, requires_grad=True)
    F.binary_cross_entropy_with_logits(x, torch.rand(64, 10, device=dev)).backward()
    return x


@step
def setitem_ops(dev):
    x = torch.zeros(64, 64, device=dev)
    x[:, :8] = 1.0
    x[0] = 2
    x[..., -1] = True
    y = torch.randn(64, 64, device=dev, requires_grad=True)
    (y * x).sum().backward()
    return x, y


@step
def tied_weights(dev):
    e = nn.Embedding(1000, 128).to(dev)
    ids = torch.randint(0, 1000, (8, 64), device=dev)
    logits = e(ids) @ e.weight.t()
    F.cross_entropy(logits.view(-1, 1000), ids.view(-1)).backward()
    return e


@step
def grad_accumulation(dev):
    m = mlp(dev)
    for _ in range(2):
        m(torch.randn(64, 256, device=dev)).pow(2).mean().backward()
    return m


@step
def dropout_train(dev):
    m = nn.Sequential(nn.Linear(256, 512), nn.Dropout(0.1), nn.ReLU(), nn.Linear(512, 10))
    m = m.to(dev).train()
    m(torch.randn(64, 256, device=dev)).pow(2).mean().backward()
    return m


@step
def checkpointed(dev):
    from torch.utils.checkpoint import checkpoint

    a, b = nn.Linear(256, 1024).to(dev), nn.Linear(1024, 256).to(dev)
    x = torch.randn(64, 256, device=dev, requires_grad=True)
    y = checkpoint(lambda t: b(F.gelu(a(t))), x, use_reentrant=False)
    y.pow(2).mean().backward()
    return a, b, x


@step
def interpolate_pad(dev):
    x = torch.randn(4, 8, 16, 16, device=dev, requires_grad=True)
    y = F.pad(F.interpolate(x, scale_factor=2, mode="nearest"), (1, 1, 1, 1))
    y.pow(2).mean().backward()
    return x


@step
def groupnorm_conv(dev):
    m = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU()).to(dev)
    m(torch.randn(4, 8, 16, 16, device=dev)).mean().backward()
    return m


@step
def loss_item(dev):
    m = mlp(dev)
    loss = m(torch.randn(64, 256, device=dev)).pow(2).mean()
    loss.backward()
    return m, loss.item()


@step
def inference_mlp(dev):
    m = mlp(dev).eval()
    with torch.inference_mode():
        return m(torch.randn(64, 256, device=dev)).softmax(-1)


names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(S)
for name in names:
    f = S[name]
    row = {}
    try:
        gpu = grouped(history(f))

        def drive(phase, f=f):
            phase("step", lambda: f("meta"))

        t = tp.run_trace(torch, "meta", drive, target=attention_choice.H200)
        if t.stopped:
            row = {"stopped": t.stopped}
        else:
            p = tp.predict(t, CAL)
            log = tp.replay(t, CAL)[1]
            ev = [(k, n, w) for k, n, w, *_ in [(*e,) for e in log[1:]] if "kept" not in w]
            mine = grouped([("alloc" if k == "alloc" else "free", n) for k, n, w in ev])
            first = next(
                (i for i, (a, b) in enumerate(zip(mine, gpu, strict=False)) if a != b), None
            )
            if first is None and len(mine) != len(gpu):
                first = min(len(mine), len(gpu))
            allocs = [w for k, n, w in ev if k == "alloc"]
            n_alloc = (
                sum(1 for x in mine[: first or 0] if x[0] == "alloc") if first is not None else None
            )
            row = {
                "status": p.status.value,
                "equal": mine == gpu,
                "first": first,
                "near_op": allocs[n_alloc - 1 : n_alloc + 2] if n_alloc else None,
                "gpu": gpu[max(0, (first or 0) - 2) : (first or 0) + 4],
                "trace": mine[max(0, (first or 0) - 2) : (first or 0) + 4],
                "unknown": [u["op"] for u in p.unknown][:4],
            }
    except Exception as exc:
        row = {"error": "".join(traceback.format_exception_only(exc))[-300:]}
    flag = "FALSE-EXACT?" if row.get("status") == "exact" and not row.get("equal") else ""
    print(
        name,
        row.get("status"),
        row.get("equal"),
        flag,
        row.get("first"),
        row.get("near_op"),
        row.get("stopped") or row.get("error") or "",
        flush=True,
    )
    if flag:
        print("   gpu  ", row["gpu"])
        print("   trace", row["trace"])
