"""Device: cuDNN attention's forward at one query (a decode step of `generate`), probed at
many batch sizes, head counts and key lengths, as a trace describes the call
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
BATCHES = [1, 2, 3, 4, 5, 6, 8, 12, 16]
KEYS = [9, 17, 33, 65, 129, 257, 400, 513, 777, 1025, 1500, 2049, 3000, 4097, 4300, 6000, 8193]


def described(shape, stride, dtype="bfloat16"):
    nbytes = (sum((s - 1) * st for s, st in zip(shape, stride)) + 1) * 2
    return ("tensor", dtype, tuple(shape), tuple(stride), 0, nbytes, "device")


signatures, operators, output_only, failed = {}, [], [], []
t0 = time.monotonic()
for (hq, hkv, d), b, s in itertools.product(HEADS, BATCHES, KEYS):
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
