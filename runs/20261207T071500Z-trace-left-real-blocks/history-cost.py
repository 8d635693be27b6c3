"""What the allocator's history costs a step, side by side in one run: a transformers Llama
training step (2 layers, width 512, batch 8 x 512, bfloat16, AdamW), 20 rounds, each round
the step with the history off, on without stack traces (what `measure` records), and on
with C++ and Python stack traces (what naming the C++ function of a request would need);
the medians, their ratios, the snapshot's time, and the frames of three requests.

    python3 history-cost.py"""

import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
model = LlamaForCausalLM(config).to("cuda", torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 32000, (8, 512), device="cuda")
history = torch.cuda.memory._record_memory_history


def step():
    torch.cuda.synchronize()
    started = time.perf_counter_ns()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    return time.perf_counter_ns() - started


def snapshot():
    started = time.perf_counter_ns()
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    return time.perf_counter_ns() - started, events


for _ in range(5):
    step()
times = {"off": [], "on": [], "stacks": []}
snaps = {"on": [], "stacks": []}
for _ in range(20):
    times["off"].append(step())
    history(enabled="all", context=None, max_entries=100000, clear_history=True)
    times["on"].append(step())
    took, events = snapshot()
    snaps["on"].append(took)
    history(enabled=None)
    history(enabled="all", context="alloc", stacks="all", max_entries=100000, clear_history=True)
    times["stacks"].append(step())
    took, stacked = snapshot()
    snaps["stacks"].append(took)
    history(enabled=None)
off = statistics.median(times["off"])
for name, values in times.items():
    median = statistics.median(values)
    print(f"step, history {name}: median {median / 1e6:.3f} ms, ratio to off {median / off:.4f}")
for name, values in snaps.items():
    print(f"snapshot, history {name}: median {statistics.median(values) / 1e6:.3f} ms")
print(f"events a step: {len(events)} without stacks, {len(stacked)} with")
allocs = [event for event in stacked if event["action"] == "alloc"]
for event in allocs[:2] + allocs[len(allocs) // 2:len(allocs) // 2 + 1]:
    print(f"--- alloc of {event['size']} B")
    for frame in event.get("frames", [])[:40]:
        print(f"  {frame['name']}  ({frame['filename']}:{frame['line']})")
