"""Device: trace HF configs (points from line FROM, 0-based) on the meta device, as an estimate without a GPU does (for the
H200, the attention rule choosing the kernel), and probe every distinct operator call.
Writes $OUT/probes/NAME.json: every signature's leaves and the calibration (templates)."""
import json, os, sys, time, traceback
sys.path.insert(0, "pipeline")
import own_model, trace_prediction, mesure_memoire  # noqa

OUT = os.environ["OUT"]
OUT = OUT + "/r"
os.makedirs(f"{OUT}/probes", exist_ok=True)
deadline = time.monotonic() + float(os.environ.get("BUDGET", "240"))
torch = mesure_memoire.import_torch()
device = torch.device("cuda:0")
points = [line.split() for line in open(sys.argv[1]) if line.strip() and not line.startswith("#")]
points = points[int(os.environ.get("FROM", "0")):]
for name, *argv in points:
    if time.monotonic() > deadline:
        print({"name": name, "skipped": "deadline"}, flush=True); continue
    t0 = time.monotonic()
    try:
        args = own_model.build_parser().parse_args(["estimate", *argv])
        setting = own_model.setting_from(args)
        own_model.load(setting)
        import attention_choice
        trace_prediction.trace_device = lambda torch, index: "meta"
        trace, facts, failure = own_model.trace_workload(torch, setting, 0, attention_choice.H200)
        if failure is not None or trace.stopped:
            print({"name": name, "stopped": trace.stopped or repr(failure)}, flush=True); continue
        calibration = trace_prediction.probe_operators(torch, device, trace)
        import gpu_calibration
        trivial = lambda n: trace_prediction.packet(n) in trace_prediction.OUTPUT_ONLY or n in gpu_calibration.GENERALISED
        sigs = {k: {"name": s.name, "calls": s.calls, "view": s.view, "leaves": repr(s.leaves)}
                for k, s in trace.signatures.items() if not s.view and not trivial(s.name)}
        doc = {"name": name, "argv": argv, "signatures": sigs,
               "calibration": calibration.to_json(trace), "notes": trace.notes,
               "seconds": time.monotonic() - t0}
        json.dump(doc, open(f"{OUT}/probes/{name}.json", "w"))
        print({"name": name, "signatures": len(sigs), "templated": len(calibration.templates),
               "seconds": round(time.monotonic() - t0, 1)}, flush=True)
    except Exception as exc:
        traceback.print_exc()
        print({"name": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}, flush=True)
    finally:
        import gc; gc.collect(); torch.cuda.empty_cache()
