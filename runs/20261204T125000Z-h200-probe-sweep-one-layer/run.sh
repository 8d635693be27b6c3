#!/bin/bash
set -u
HERE=$(dirname "$0")
mkdir -p $OUT/r
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
pip install -q --no-index --find-links .whl transformers peft > $OUT/r/pip.log 2>&1
BUDGET=${BUDGET:-150} timeout 200 python3 $HERE/probe_set.py $HERE/points.txt > $OUT/r/probe.log 2>&1
du -sh $OUT/r; ls $OUT/r/probes | wc -l
