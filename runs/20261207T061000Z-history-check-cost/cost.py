"""What recording the allocator's history costs a step: a transformers Llama training step
(2 layers, width 512, batch 8 x 512, bfloat16, AdamW), timed with the history off and on,
alternately, 20 steps each after a warm-up; the medians and their ratio.

    python3 cost.py"""

import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pipeline.predicting import trace_prediction

torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
model = LlamaForCausalLM(config).to("cuda", torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 32000, (8, 512), device="cuda")


def step():
    torch.cuda.synchronize()
    started = time.perf_counter_ns()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    return time.perf_counter_ns() - started


for _ in range(5):
    step()
off, on, snapshots = [], [], []
for _ in range(20):
    off.append(step())
    trace_prediction.start_history(torch)
    on.append(step())
    started = time.perf_counter_ns()
    events = len(torch.cuda.memory._snapshot()["device_traces"][0])
    snapshots.append(time.perf_counter_ns() - started)
    trace_prediction.stop_history(torch)
print(f"step, history off: median {statistics.median(off) / 1e6:.3f} ms")
print(f"step, history on:  median {statistics.median(on) / 1e6:.3f} ms ({events} events a step)")
print(f"ratio on/off: {statistics.median(on) / statistics.median(off):.4f}")
print(f"snapshot: median {statistics.median(snapshots) / 1e6:.3f} ms")
