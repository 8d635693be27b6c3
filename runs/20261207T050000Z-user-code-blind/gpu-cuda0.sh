#!/usr/bin/env bash
# On the GPU: each point measured (measure --memory-history), its history held against the
# replay beside it (compare.py), and the blocks a kept forward holds (alive.py).
# bash gpu.sh OUTDIR
set -u
R=$(dirname "$0"); out=$1; mkdir -p "$out"
m() {  # name, spec, options
  name=$1; shift; spec=$1; shift
  python3 -m pipeline.measuring.own_model measure --workload "$R/$spec" --device cuda:0 "$@" \
    --output "$out/$name.json" --memory-history "$out/$name.pickle" > "$out/$name.log" 2>&1
  echo "$name: exit $?"; python3 "$R/compare.py" "$out/$name.pickle" 2>&1 | tee "$out/$name.compare"
}
for f in cpu_then_to to_device_then_dtype on_device to_empty_retied to_empty_untied forward_kept; do
  m "tied-$f" "tied.py:$f" --dtype float32 --batch 4
done
m llama-small hf_forward.py:llama --dtype bfloat16 --batch 2 --dim layers=2 --dim width=512 --dim length=512
m llama-small-no-cache hf_forward.py:llama_no_cache --dtype bfloat16 --batch 2 --dim layers=2 --dim width=512 --dim length=512
m llama-tied hf_forward.py:llama_tied --dtype float32 --batch 2
m gemma2 hf_forward.py:gemma2 --dtype bfloat16 --batch 2
m llama-1b hf_forward.py:llama --dtype bfloat16 --batch 4
python3 "$R/alive.py" "$R/hf_forward.py:llama" 2 bfloat16 layers=2 width=512 length=512 > "$out/alive-llama-small.txt" 2>&1
python3 "$R/alive.py" "$R/tied.py:forward_kept" 4 float32 > "$out/alive-tied-forward.txt" 2>&1
# (gpu.sh named the device `0`, which measure refuses: this is it with `cuda:0`, and one more
# point: a transformers GPT-2 built under torch.device, whose first request differed.)
I=runs/20261207T053000Z-idioms-generated-blind/workloads
python3 -m pipeline.measuring.own_model measure --workload "$I/i012-gpt2-devicecontext-train-adamw-float32.py:point" \
  --device cuda:0 --batch 4 --dtype float32 --output "$out/gpt2-device.json" --memory-history "$out/gpt2-device.pickle" > "$out/gpt2-device.log" 2>&1
python3 "$R/compare.py" "$out/gpt2-device.pickle" > "$out/gpt2-device.compare" 2>&1
python3 - "$out/gpt2-device.pickle" > "$out/gpt2-device.first.txt" 2>&1 <<'PY'
import pickle, sys
h = pickle.load(open(sys.argv[1], "rb"))
ev = [e for e in h["snapshot"]["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
print("GPU:", [(e["action"][:5], e["size"]) for e in ev[:30]])
print("replay:", [(k, n, w) for k, n, w in h["replay"][:40]])
PY
