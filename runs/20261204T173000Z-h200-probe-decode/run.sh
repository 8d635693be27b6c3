#!/bin/bash
# On the GPU machine, from the repository root: bash runs/.../run.sh
set -u
HERE=$(dirname "$0")
mkdir -p $OUT/r
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whlg/*.whl > $OUT/r/pip.log 2>&1
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys,torch,transformers,peft;print(sys.version.split()[0],torch.__version__,torch.backends.cudnn.version(),'transformers',transformers.__version__,'peft',peft.__version__,torch.cuda.get_device_capability())"; } > $OUT/r/machine.txt 2>&1
timeout 150 python3 $HERE/decode_probes.py > $OUT/r/decode.log 2>&1
BUDGET=${BUDGET:-150} timeout 200 python3 $HERE/probe_set.py $HERE/points.txt > $OUT/r/probe.log 2>&1
ls $OUT/r/probes | wc -l; cat $OUT/r/decode.log | tail -2; tail -3 $OUT/r/probe.log
