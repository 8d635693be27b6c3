#!/bin/bash
# One device call: segment order evidence, then probes. Everything under $OUT/r.tgz.
set -u
HERE=$(dirname "$0")
mkdir -p $OUT/r/hist
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
pip install -q --no-index --find-links .whl transformers peft nox jsonschema > $OUT/r/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/r/machine.txt
python3 -c "import torch;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_capability())" >> $OUT/r/machine.txt
for seed in 0 1 2; do timeout 60 python3 $HERE/segments.py 150 $seed > $OUT/r/segments-$seed.json 2>>$OUT/r/err.log; done
C=tests/data/hf-configs
hist() { name=$1; shift; timeout 120 python3 pipeline/own_model.py measure "$@" --device cuda:0 --output $OUT/r/hist/$name.json --memory-history /tmp/$name.pkl > $OUT/r/hist/$name.log 2>&1; python3 $HERE/history_segments.py /tmp/$name.pkl $OUT/r/hist/$name.json $OUT/r/hist/$name.segments.json 2>>$OUT/r/err.log; rm -f /tmp/$name.pkl; }
hist pythia-inference-fp32 --hf-config $C/pythia-160m.json --task inference --batch 4 --dim sequence=512 --dtype float32
hist gpt2-training-fp32 --hf-config $C/gpt2.json --task training --batch 2 --dim sequence=512 --dtype float32
hist llama1b-training-bf16 --hf-config $C/llama-3.2-1b.json --task training --batch 1 --dim sequence=512 --dtype bfloat16
hist roberta-training-bf16 --hf-config $C/roberta-base.json --task training --batch 4 --dim sequence=512 --dtype bfloat16
hist t5-training-bf16 --hf-config $C/t5-small.json --task training --batch 4 --dim sequence=512 --dtype bfloat16
