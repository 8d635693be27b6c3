"""A measurement's allocator history (measure --memory-history) against the trace's replay
beside it: per phase the blocks each side holds at the phase's end (sizes as the allocator
rounds them), what one holds and the other does not, and the first request that differs.

    python3 compare.py HISTORY.pickle"""

import collections
import pickle
import sys

from pipeline.core import allocator_model

h = pickle.load(open(sys.argv[1], "rb"))
events = [e for e in h["snapshot"]["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
log = h["replay"]
gpu = [("alloc" if e["action"] == "alloc" else "free", allocator_model.block_bytes(e["size"])) for e in events]
rep = [(k, allocator_model.block_bytes(n), w) for k, n, w in log if k in ("alloc", "free")]
print(f"GPU requests {sum(1 for a in gpu if a[0] == 'alloc')}, replay requests {sum(1 for a in rep if a[0] == 'alloc')}")
ga = [n for k, n in gpu if k == "alloc"]
ra = [(n, w) for k, n, w in rep if k == "alloc"]
for i, (g, r) in enumerate(zip(ga, ra)):
    if g != r[0]:
        print(f"first differing request #{i}: GPU {g} B, replay {r[0]} B ({r[1]})")
        print("  GPU next:", ga[i:i + 8])
        print("  replay next:", [x[0] for x in ra[i:i + 8]], [x[1] for x in ra[i:i + 8]])
        break
else:
    print("the requests' sizes agree in order" if len(ga) == len(ra) else f"a prefix agrees; lengths {len(ga)} vs {len(ra)}")
alive = collections.Counter()
for k, n in gpu:
    alive[n] += 1 if k == "alloc" else -1
ralive = collections.Counter()
for k, n, w in rep:
    ralive[n] += 1 if k == "alloc" else -1
diff = {n: ralive[n] - alive[n] for n in set(alive) | set(ralive) if ralive[n] != alive[n]}
print("blocks alive at the end, replay minus GPU:", dict(sorted(diff.items())))
