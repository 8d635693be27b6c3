"""Device: from own_model.py measure --memory-history's pickle, what to keep: the segments in
creation order (pool, size, address), the rows measured, predicted, and replayed under the
driver's own order of segment addresses."""
import json, pickle, sys
h = pickle.load(open(sys.argv[1], "rb"))
doc = json.load(open(sys.argv[2]))
events = h["snapshot"]["device_traces"][0]
segs = [{"action": e["action"], "size": e["size"], "address": e["addr"]} for e in events if e["action"] in ("segment_alloc", "segment_free", "segment_map", "segment_unmap")]
keys = ("baseline_allocated_bytes", "baseline_reserved_bytes", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes")
slim = lambda rows: [{k: r[k] for k in ("phase", *keys) if k in r} for r in rows]
json.dump({"segments": segs, "measured": slim(doc["phases"]), "predicted": slim(doc["prediction"].get("phases", [])),
           "replay_real_order": slim(h.get("replay_real_order", [])), "status": doc["prediction"]["status"]}, open(sys.argv[3], "w"))
