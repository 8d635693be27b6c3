#!/usr/bin/env bash
# On the GPU, in one call: the mechanism alone (raw.py); the 18 generated points whose
# bounds broke (../20261207T060000Z-idioms-repredicted/) measured again at this commit,
# into h100/; then the earlier folders' pending GPU work. bash gpu.sh OUTDIR
set -u
R=$(dirname "$0"); out=$1; mkdir -p "$out/h100"
python3 "$R/raw.py" > "$out/raw.txt" 2>&1
P=runs/20261207T060000Z-idioms-repredicted/points.txt
W=runs/20261207T053000Z-idioms-generated-blind/workloads
one() {
  line=$(grep "^$1 " "$P"); set -- $line; name=$1; spec=$2; shift 3
  python3 -m pipeline.measuring.own_model measure --workload "$spec" --device cuda:0 "$@" \
    --output "$out/h100/$name.json" > "$out/h100/$name.log" 2>&1
  echo "$name: exit $?"
}
export -f one; export P out
cut -d' ' -f1 "$R/points.txt" | xargs -P 4 -I{} bash -c 'one {}'
# The checkpointing grid (../20261207T073000Z-checkpointing-blind/), measured.
timeout 200 python3 tests/benchmarks/hf_zoo_grid.py measure --points runs/20261207T073000Z-checkpointing-blind/points.txt \
  --out runs/20261207T073000Z-checkpointing-blind --measured-in "$out/checkpointing" --deadline-s 150 > "$out/checkpointing.txt" 2>&1
