"""Device: cuDNN attention's forward at one query (a decode step of `generate`), probed at
the key lengths and fills the first decode sweep left between its probes (around each power
of two where the split may change, and past 8,193 keys), as a trace describes the call
(trace_prediction.probe on a described Signature). Writes $OUT/r/probes/decode.json in the
probe documents' format (gpu_calibration.build reads it)."""
import itertools, json, os, sys, time
sys.path.insert(0, "pipeline")
import trace_prediction as tp, torch_private, mesure_memoire  # noqa

OUT = os.environ["OUT"] + "/r"
os.makedirs(f"{OUT}/probes", exist_ok=True)
torch = mesure_memoire.import_torch()
device = torch.device("cuda:0")
func = torch.ops.aten._scaled_dot_product_cudnn_attention.default
NAME = "aten._scaled_dot_product_cudnn_attention.default"
HEADS = [(32, 8, 64), (32, 8, 128), (14, 2, 64), (16, 8, 64), (32, 32, 128), (8, 8, 64)]
BATCHES = [1, 2, 4, 8, 16]
KEYS = [401, 450, 500, 505, 509, 510, 511, 512, 640, 793, 900, 1000, 1016, 1020, 1023, 1024,
        1501, 1800, 2000, 2040, 2046, 2047, 2048, 3001, 3500, 4000, 4090, 4094, 4095, 4096,
        6001, 7000, 8000, 8191, 8192, 10000, 16383, 16384, 16385, 32768]
# fills (batch x key/value heads, times a power of two) between 256 and 320
FILL_CASES = [((32, 8, 128), b) for b in (9, 17, 33, 34, 36, 38, 40)] + [
    ((32, 32, 128), b) for b in (9, 10)] + [((14, 2, 64), b) for b in (130, 136, 144, 160)]
FILL_KEYS = [513, 1025, 2049, 4097, 8193]


def described(shape, stride, dtype="bfloat16"):
    nbytes = (sum((s - 1) * st for s, st in zip(shape, stride)) + 1) * 2
    return ("tensor", dtype, tuple(shape), tuple(stride), 0, nbytes, "device")


signatures, operators, output_only, failed = {}, [], [], []
t0 = time.monotonic()
cases = [(h, b, s) for h, b, s in itertools.product(HEADS, BATCHES, KEYS)]
cases += [(h, b, s) for (h, b), s in itertools.product(FILL_CASES, FILL_KEYS)]
for (hq, hkv, d), b, s in cases:
    q = described((b, hq, 1, d), (hq * d, d, d, 1))  # (B, 1, H, D) transposed, as HF does
    kv = described((b, hkv, s, d), (hkv * s * d, s * d, d, 1))  # the cache, made by cat
    scale = d ** -0.5
    leaves = [q, kv, kv, None, False, scale]
    _, spec = torch_private.tree_flatten(((0, 0, 0, None, False), {"scale": scale}))
    key = tp.signature_id(repr(leaves))
    signature = tp.Signature(NAME, func, leaves, spec, calls=1)
    try:
        template = tp.probe(torch, device, signature)
    except Exception as exc:
        failed.append({"op": NAME, "signature": key, "error": f"{type(exc).__name__}: {exc}"[:200]})
        continue
    finally:
        tp.stop_history(torch)
    signatures[key] = {"name": NAME, "calls": 1, "view": False, "leaves": repr(leaves)}
    if tp.plain(template):
        output_only.append(key)
    else:
        operators.append({"op": NAME, "signature": key,
                          "template": [tp.template_entry(step) for step in template]})
document = {
    "name": "decode", "argv": [], "signatures": signatures,
    "calibration": {"method": "trace_prediction.probe of each described call",
                    "operators": operators, "output_only": sorted(output_only),
                    "failed": failed, "workspaces_per_thread": tp.probe_workspace_threads(torch, device)},
    "seconds": time.monotonic() - t0,
}
json.dump(document, open(f"{OUT}/probes/decode.json", "w"))
print(len(signatures), "probed,", len(operators), "with scratch,", len(failed), "failed,",
      round(time.monotonic() - t0, 1), "s")
