#!/usr/bin/env bash
# dp_bench.sh - tokens/s of the data-parallel trainer for 1 and 2 ranks on this machine, same
# model and global batch (config A of the trainer benchmark: 4 layers, hidden 256, 4 heads,
# sequence 256, vocabulary 50257; micro batch 4, global batch 8), mock data.
#
#   bench/dp_bench.sh [iterations]     (after deploy/setup.sh build)
# One rank uses every core; with N ranks each uses cores/N threads (the default). The output
# starts with the CPU (bench/cpuinfo.py: model name, ISA flags).
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-12}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args=(--mock-data --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256
      --max-position-embeddings 256 --micro-batch-size 4 --global-batch-size 8 --lr 1e-4
      --hidden-dropout 0 --attention-dropout 0 --train-iters "$iters" --log-interval 1 --eval-iters 0
      --data-cache-path "$work/cache" --split 1,0,0)
/usr/bin/python3 bench/cpuinfo.py
echo
echo "| ranks | threads per rank | tokens/s (mean of iterations 3..$iters) | ms/iteration |"
echo "|---|---|---|---|"
for n in 1 2; do
    build/cohort train "${args[@]}" --nproc-per-node $n --metrics-file "$work/m$n.jsonl" >"$work/out$n" 2>&1 \
        || { tail -5 "$work/out$n"; exit 1; }
    /usr/bin/python3 - "$work/m$n.jsonl" "$n" "$(nproc)" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_second" in r][2:]
n, cores = int(sys.argv[2]), int(sys.argv[3])
tps = sum(r["tokens_per_second"] for r in rows) / len(rows)
ms = sum(r["elapsed_ms_per_iteration"] for r in rows) / len(rows)
print(f"| {n} | {max(1, cores // n)} | {tps:.0f} | {ms:.1f} |")
PY
done
