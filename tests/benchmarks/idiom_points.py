"""Workload files written the ways people write their steps and build their models, generated
over the idioms' axes, for hf_zoo_grid.py to predict without a GPU and measure on one.

    python3 tests/benchmarks/idiom_points.py --count 220 --seed 0 --out DIR

writes DIR/workloads/POINT.py (one user-style file a point, function `point`) and
DIR/points.txt (hf_zoo_grid.py's format: NAME FILE.py:point TASK FLAGS). Then:

    python3 tests/benchmarks/hf_zoo_grid.py predict --points DIR/points.txt --out DIR
    python3 tests/benchmarks/hf_zoo_grid.py measure --points DIR/points.txt --out DIR --shard 1/8
    python3 tests/benchmarks/hf_zoo_grid.py summarise --out DIR

The axes (each point one value of each, drawn with the seed, every value of every axis
drawn at least once): the model (a multilayer perceptron, a language model whose output
layer shares the embedding's weight, a convolutional network with batch norm, a
TransformerEncoderLayer, transformers' GPT-2 and Llama from a config written in the file);
how it reaches the device (built on the CPU and moved with one `.to(device, dtype)` or two,
built under `torch.device`, built on the meta device and given memory with `to_empty`);
`train()` or `eval()`; the step (the harness's inference, a step under `no_grad` or
`inference_mode`, a forward with autograd on that returns its output, a training step with
AdamW or SGD); the loss (from torch.nn, or by hand); logits upcast with `.float()` or not;
the result returned as a tensor, a tuple, a dict or the model's own output object; and the
extras (a forward hook that keeps what it sees, a buffer, in-place operations, dropout).
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

FAMILIES = ["mlp", "tied_lm", "conv", "encoder", "gpt2", "llama"]
BUILDS = ["cpu_to", "cpu_to_then_dtype", "device_context", "to_empty"]
MODES = ["train", "eval"]
STEPS = ["inference", "no_grad", "inference_mode", "autograd_forward", "adamw", "sgd"]
LOSSES = ["nn", "by_hand"]
UPCASTS = ["kept", "float"]
RETURNS = ["tensor", "tuple", "dict", "output"]
EXTRAS = ["none", "hook", "buffer", "in_place", "dropout"]
DTYPES = ["float32", "bfloat16"]
AXES = {
    "family": FAMILIES, "build": BUILDS, "mode": MODES, "step": STEPS, "loss": LOSSES,
    "upcast": UPCASTS, "returns": RETURNS, "extra": EXTRAS, "dtype": DTYPES,
}  # fmt: skip

TOKENS = {"tied_lm", "gpt2", "llama"}  # models of token ids; the others take vectors or images
VOCAB, CLASSES = 1000, 10

MODELS = {
    "mlp": """
class Model(torch.nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.up = torch.nn.Linear(128, width)
        self.act = torch.nn.GELU()
        self.drop = torch.nn.Dropout(P_DROP)
        self.down = torch.nn.Linear(width, 10)
        BUFFER_INIT

    def forward(self, x):
        h = self.act(self.up(x))
        INPLACE
        return self.down(self.drop(h)) BUFFER_USE
""",
    "tied_lm": """
class Model(torch.nn.Module):
    def __init__(self, vocab=1000, width=256):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)
        self.drop = torch.nn.Dropout(P_DROP)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight
        BUFFER_INIT

    def forward(self, ids):
        h = torch.relu(self.mix(self.emb(ids)))
        INPLACE
        return self.head(self.drop(h)) BUFFER_USE
""",
    "conv": """
class Model(torch.nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.drop = torch.nn.Dropout(P_DROP)
        self.head = torch.nn.Linear(channels, 10)
        BUFFER_INIT

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        INPLACE
        return self.head(self.drop(h.mean((2, 3)))) BUFFER_USE
""",
    "encoder": """
class Model(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=P_DROP,
                                                      batch_first=True)
        self.head = torch.nn.Linear(width, 10)
        BUFFER_INIT

    def forward(self, x):
        h = self.layer(x)
        INPLACE
        return self.head(h.mean(1)) BUFFER_USE
""",
}
HF = {
    "gpt2": """
def Model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2,
                                      n_head=4, resid_pdrop=P_DROP, embd_pdrop=P_DROP,
                                      attn_pdrop=P_DROP))
""",
    "llama": """
def Model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=512,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=256,
                                        attention_dropout=P_DROP, tie_word_embeddings=True))
""",
}

BUILD = {
    "cpu_to": "    model = Model().to(device=config.device, dtype=config.dtype)\n",
    "cpu_to_then_dtype": "    model = Model().to(config.device).to(config.dtype)\n",
    "device_context": (
        "    with torch.device(config.device):\n"
        "        model = Model()\n"
        "    model = model.to(config.dtype)\n"
    ),
    "to_empty": (
        '    with torch.device("meta"):\n'
        "        model = Model()\n"
        "    model = model.to_empty(device=config.device).to(config.dtype)\n"
        "    TIE_AGAIN\n"
    ),
}
INPUTS = {
    "mlp": "torch.randn(config.batch, 128, device=config.device, dtype=config.dtype)",
    "conv": "torch.randn(config.batch, 3, 32, 32, device=config.device, dtype=config.dtype)",
    "encoder": "torch.randn(config.batch, 64, 128, device=config.device, dtype=config.dtype)",
    "tokens": f"torch.randint(0, {VOCAB}, (config.batch, 64), device=config.device)",
}


def draw(count: int, seed: int) -> list[dict]:
    """`count` points, each a dict of one value per axis; every value of every axis is drawn
    at least once, the rest at random; no point twice."""
    rng = random.Random(seed)
    longest = max(len(values) for values in AXES.values())
    chosen: list[dict] = []
    seen: set = set()
    for i in itertools.count():
        if len(chosen) >= count:
            break
        if i < longest:  # the first points walk every axis's values
            point = {axis: values[i % len(values)] for axis, values in AXES.items()}
        else:
            point = {axis: rng.choice(values) for axis, values in AXES.items()}
        key = tuple(point.values())
        if key in seen:
            continue
        seen.add(key)
        chosen.append(point)
    return chosen


def logits_of(point: dict) -> str:
    """The model's logits from `out`, as a user reads them."""
    return "out.logits" if point["family"] in {"gpt2", "llama"} else "out"


def loss_lines(point: dict) -> list[str]:
    logits = logits_of(point)
    upcast = ".float()" if point["upcast"] == "float" else ""
    if point["family"] in TOKENS:
        if point["loss"] == "nn":
            return [
                f"        logits = {logits}{upcast}",
                f"        return torch.nn.CrossEntropyLoss()(logits.reshape(-1, {VOCAB}), "
                "inputs.reshape(-1))",
            ]
        return [
            f"        logp = torch.log_softmax({logits}{upcast}, dim=-1)",
            "        return -logp.gather(-1, inputs.unsqueeze(-1)).mean()",
        ]
    target = f"torch.zeros(config.batch, {CLASSES}, device=config.device, dtype=out.dtype)"
    if point["loss"] == "nn":
        return [f"        return torch.nn.MSELoss()({logits}{upcast}, {target}{upcast})"]
    return [f"        return ({logits}{upcast} - {target}{upcast}).pow(2).mean()"]


def result_lines(point: dict) -> list[str]:
    logits = logits_of(point)
    upcast = ".float()" if point["upcast"] == "float" else ""
    kind = point["returns"]
    if kind == "output" and point["family"] in {"gpt2", "llama"}:
        return ["        return out"]
    if kind == "tuple":
        return [f"        return {logits}{upcast}, {logits}.argmax(-1)"]
    if kind == "dict":
        return [f'        return {{"logits": {logits}{upcast}}}']
    return [f"        return {logits}{upcast}"]


def source(point: dict) -> str:
    family = point["family"]
    drop = "0.1" if point["extra"] == "dropout" else "0.0"
    hf = family in HF
    model = (HF[family] if hf else MODELS[family]).replace("P_DROP", drop)
    buffer_init = 'self.register_buffer("scale", torch.ones(1))'
    if not hf:
        buffered = point["extra"] == "buffer"
        model = model.replace("BUFFER_INIT", buffer_init if buffered else "")
        model = model.replace(" BUFFER_USE", " * self.scale" if buffered else "")
        inplace = "h.mul_(2.0)" if point["extra"] == "in_place" else ""
        model = model.replace("INPLACE", inplace)
        model = "\n".join(line for line in model.splitlines() if line.strip()) + "\n"
        model = model.replace("\n    def forward", "\n\n    def forward")
    build = BUILD[point["build"]]
    tie = {"tied_lm": "model.head.weight = model.emb.weight", "gpt2": "model.tie_weights()",
           "llama": "model.tie_weights()"}.get(family)  # fmt: skip
    build = build.replace("    TIE_AGAIN\n", f"    {tie}  # to_empty unties them\n" if tie else "")
    lines = [
        '"""Generated (tests/benchmarks/idiom_points.py): '
        + ", ".join(f"{k}={v}" for k, v in point.items())
        + '."""',
        "",
        "import torch",
        "from own_model import Workload",
        "",
        model.rstrip("\n"),
        "",
        "",
        "def point(config):",
        build.rstrip("\n"),
        f"    model.{point['mode']}()",
    ]
    if point["extra"] == "hook":
        lines += [
            "    seen = []",
            "    model.register_forward_hook(lambda module, args, output: seen.append(output))",
        ]
    feed = INPUTS["tokens" if family in TOKENS else family]
    lines.append(f"    make_inputs = lambda: {feed}")
    call = "model(input_ids=inputs)" if hf else "model(inputs)"
    step = point["step"]
    if point["extra"] == "hook":
        call = f"(seen.clear(), {call})[1]"
    if step == "inference":
        lines.append("    return Workload(model, make_inputs)")
    elif step in ("adamw", "sgd"):
        optimizer = (
            "AdamW(model.parameters(), lr=1e-4)"
            if step == "adamw"
            else ("SGD(model.parameters(), lr=1e-2, momentum=0.9)")
        )
        lines += [
            f"    optimizer = torch.optim.{optimizer}",
            "",
            "    def step(model, inputs):",
            f"        out = {call}",
            *loss_lines(point),
            "",
            "    return Workload(model, make_inputs, step=step, optimizer=optimizer)",
        ]
    else:
        context = {"no_grad": "torch.no_grad()", "inference_mode": "torch.inference_mode()"}
        body = [f"        out = {call}", *result_lines(point)]
        if step in context:
            body = [f"        with {context[step]}:", *("    " + line for line in body)]
        lines += [
            "",
            "    def step(model, inputs):",
            *body,
            "",
            "    return Workload(model, make_inputs, step=step)",
        ]
    return "\n".join(lines) + "\n"


def name_of(index: int, point: dict) -> str:
    short = [point["family"], point["build"], point["mode"], point["step"], point["dtype"]]
    return f"i{index:03d}-" + "-".join(short).replace("_", "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=220)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    workloads = out / "workloads"
    if (out / "points.txt").exists() or workloads.exists():
        print(f"idiom_points.py: error: {out} holds points already", file=sys.stderr)
        return 2
    workloads.mkdir(parents=True)
    lines = ["# generated by tests/benchmarks/idiom_points.py "
             f"--count {args.count} --seed {args.seed} --batch {args.batch}",
             "@estimate --gpu h200"]  # fmt: skip
    for index, point in enumerate(draw(args.count, args.seed)):
        name = name_of(index, point)
        (workloads / f"{name}.py").write_text(source(point), encoding="utf-8")
        task = "training" if point["step"] in ("adamw", "sgd") else "inference"
        flags = f"--batch {args.batch} --dtype {point['dtype']}"
        lines.append(f"{name} {workloads / name}.py:point {task} {flags}")
    (out / "points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.count} points in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
