#!/usr/bin/env bash
# On the GPU: the 220 points measured, 12 at a time (each a fresh process; the allocator's
# counters are each process's own), into h100/; no new point past DEADLINE seconds.
# bash gpu.sh DEADLINE
set -u
D=$(dirname "$0")
for i in $(seq 1 12); do
  python3 tests/benchmarks/hf_zoo_grid.py measure --points "$D/points.txt" --out "$D" \
    --measured-in h100 --shard "$i/12" --deadline-s "$1" > "$D/measure-shard-$i.log" 2>&1 &
done
wait
