# Run from the repository root on a GPU machine: bash profile.sh OUT_FOLDER
set -u
OUT=$1
export PYTHONPATH="$PWD"
mkdir -p "$OUT/p" /tmp/p
cd /tmp/p
OOM="--layers 1 --width 1024 --heads 8 --kv-heads 2 --ffn 4096 --vocab 131072 --prompt 4096 --new-tokens 2 --dtype bfloat16"
prof() { python3 -c "
import pstats,io
s=io.StringIO(); p=pstats.Stats('$1.prof', stream=s); p.sort_stats('cumulative').print_stats(45); p.sort_stats('tottime').print_stats(30)
open('$OUT/p/$1.txt','w').write(s.getvalue())"; }
s=$(date +%s%N); timeout 45 python3 -m cProfile -o oom-b64.prof -m pipeline.measuring.decoder measure --device cuda:0 $OOM --batch 64 --output m1.json --environment-output e1.json > oom.txt 2>&1; echo "oom b64 exit $? $(( ($(date +%s%N) - s) / 1000000 )) ms $(nvidia-smi --query-gpu=name --format=csv,noheader)" >> "$OUT/p/times.txt"; prof oom-b64
s=$(date +%s%N); timeout 70 python3 -m cProfile -o 8b-16.prof -m pipeline.measuring.decoder measure --device cuda:0 --preset llama-3.1-8b --batch 8 --prompt 2048 --new-tokens 16 --dtype bfloat16 --output m2.json --environment-output e2.json > 8b.txt 2>&1; echo "8b 16 tokens exit $? $(( ($(date +%s%N) - s) / 1000000 )) ms" >> "$OUT/p/times.txt"; prof 8b-16
