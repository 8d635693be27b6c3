"""Device: trace HF configs on fake CUDA tensors and probe every distinct operator call.
Writes $OUT/probes/NAME.json: the trace's op events and every signature's leaves and template."""
import json, os, sys, time, traceback
sys.path.insert(0, "pipeline")
import own_model, trace_prediction, mesure_memoire  # noqa

OUT = os.environ["OUT"]
os.makedirs(f"{OUT}/probes", exist_ok=True)
deadline = time.monotonic() + float(os.environ.get("BUDGET", "420"))
torch = mesure_memoire.import_torch()
device = torch.device("cuda:0")
points = [line.split() for line in open(sys.argv[1]) if line.strip() and not line.startswith("#")]
summary = []
for name, *argv in points:
    if time.monotonic() > deadline:
        summary.append({"name": name, "skipped": "deadline"}); continue
    t0 = time.monotonic()
    try:
        args = own_model.build_parser().parse_args(["estimate", *argv])
        setting = own_model.setting_from(args)
        own_model.load(setting)
        trace, facts, failure = own_model.trace_workload(torch, setting, 0)
        if failure is not None or trace.stopped:
            summary.append({"name": name, "stopped": trace.stopped or repr(failure)}); continue
        calibration = trace_prediction.probe_operators(torch, device, trace) if torch.cuda.is_available() else trace_prediction.Calibration()
        prediction = trace_prediction.predict(trace, calibration)
        events = []
        for e in trace.events:
            if e[0] == "op":
                op = e[1]
                events.append(["op", op.name, op.signature, op.role, [list(o) for o in op.outputs], op.reuses])
            elif e[0] in ("start",):
                events.append(["start", e[1]])
            elif e[0] == "end":
                events.append(["end"])
            else:
                events.append(list(e))
        sigs = {k: {"name": s.name, "calls": s.calls, "view": s.view, "leaves": repr(s.leaves)}
                for k, s in trace.signatures.items()}
        doc = {"name": name, "argv": argv, "events": events, "signatures": sigs,
               "calibration": calibration.to_json(trace), "notes": trace.notes,
               "prediction": {"status": prediction.status, "rows": trace_prediction.prediction_rows(prediction),
                              "unknown": prediction.unknown},
               "seconds": time.monotonic() - t0}
        json.dump(doc, open(f"{OUT}/probes/{name}.json", "w"))
        summary.append({"name": name, "ops": trace.operator_calls, "signatures": len(sigs),
                        "templated": len(calibration.templates), "seconds": round(time.monotonic() - t0, 1)})
    except Exception as exc:
        traceback.print_exc()
        summary.append({"name": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    finally:
        import gc; gc.collect(); torch.cuda.empty_cache()
    print(summary[-1], flush=True)

