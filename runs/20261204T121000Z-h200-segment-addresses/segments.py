"""Device: in what order does the driver place the allocator's segments? A fresh process
allocates through PyTorch's caching allocator, never freeing, and records each new segment's
pool, size and address, in creation order."""
import json, os, random, sys
import torch
dev = torch.device("cuda:0")
torch.cuda.init()
out = []
keep = []
seen = set()
def new_segments():
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] not in seen:
            seen.add(seg["address"])
            out.append({"pool": seg["segment_type"], "size": seg["total_size"], "address": seg["address"]})
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
MiB = 2**20
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 120):
    r = rng.random()
    if r < 0.25:
        n = rng.choice([512, 4096, 65536, MiB])  # small pool
    elif r < 0.5:
        n = rng.randrange(MiB + 1, 10 * MiB)  # 20 MiB segments, shared
    elif r < 0.9:
        n = rng.randrange(10, 400) * 2 * MiB  # own segment
    else:
        n = rng.randrange(1, 8) * 1024 * MiB
    keep.append(torch.empty(n, dtype=torch.uint8, device=dev))
    new_segments()
    if rng.random() < 0.2 and keep:  # free some, the allocator keeps them cached
        keep.pop(rng.randrange(len(keep)))
json.dump(out, sys.stdout)
