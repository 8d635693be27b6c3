#!/bin/bash
# On the GPU machine, from the repository root, with transformers 5.23.0 and peft 0.21.2
# importable: bash runs/20261204T200500Z-h200-probe-sweep-gaps/run.sh (writes $OUT/r/)
set -u
HERE=$(dirname "$0")
mkdir -p $OUT/r
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys,torch,transformers,peft;print(sys.version.split()[0],torch.__version__,torch.backends.cudnn.version(),'transformers',transformers.__version__,'peft',peft.__version__,torch.cuda.get_device_capability())"; } > $OUT/r/machine.txt 2>&1
timeout 110 python3 $HERE/decode_probes.py > $OUT/r/decode.log 2>&1
BUDGET=100 timeout 140 python3 $HERE/probe_set.py $HERE/points.txt > $OUT/r/probe.log 2>&1
