#!/usr/bin/env bash
# sdc_bench.sh - what the weights' checksum (--check-weight-hash-across-dp-replicas-interval,
# silent data corruption caught in its step) costs per training step: 2 data-parallel ranks
# with the checksum every step and with it off, interleaved, same model and batches.
#
#   bench/sdc_bench.sh embedded|gpt2 [iterations] [repetitions]    (after deploy/setup.sh build)
#   INTERVALS="1 2 0" bench/sdc_bench.sh ...    the intervals compared (default "1 0": every step, off)
# embedded: the embedded default job's model (3 layers, hidden 192, 64 bytes, 32 samples
#           per step) on 2 ranks; gpt2: GPT-2 124M (12 layers, hidden 768, 12 heads,
#           sequence 256, vocabulary 50257, micro batch 4, global batch 8), mock data.
# Per run, from the metrics records of iterations 3..N: the median ms per iteration, the
# time the training thread waited for its verdicts (the checksum's message comes after the
# all-reduce: one round trip to the supervisor more), the checksum's wait after the
# all-reduce for the hash that overlaps it, and that overlapped hashing itself. The hash AdamW fuses is not
# timed apart here: build/bench/checksum_bench measures it.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?embedded or gpt2}; iters=${2:-12}; reps=${3:-2}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
case $model in
embedded) args=(--train-iters "$iters" --eval-iters 0 --log-interval 1 --nproc-per-node 2) ;;
gpt2) args=(--mock-data --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 256
            --max-position-embeddings 256 --micro-batch-size 4 --global-batch-size 8 --lr 1e-4
            --hidden-dropout 0 --attention-dropout 0 --train-iters "$iters" --log-interval 1 --eval-iters 0
            --data-cache-path "$work/cache" --split 1,0,0 --nproc-per-node 2) ;;
*) echo "sdc_bench.sh: model '$model': embedded or gpt2" >&2; exit 2 ;;
esac
/usr/bin/python3 bench/cpuinfo.py
echo
echo "| model | checksum every | ms/iteration (median) | verdict wait ms/iteration | checksum wait after the all-reduce ms | overlapped hashing ms |"
echo "|---|---|---|---|---|---|"
for r in $(seq "$reps"); do
    for k in ${INTERVALS:-1 0}; do
        build/cohort train "${args[@]}" --check-weight-hash-across-dp-replicas-interval $k \
            --metrics-file "$work/m.jsonl" >"$work/out" 2>&1 || { tail -5 "$work/out"; exit 1; }
        /usr/bin/python3 - "$work/m.jsonl" "$model" "$k" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_second" in r][2:]
med = lambda key: statistics.median(r[key] for r in rows)
mean = lambda key: sum(r[key] for r in rows) / len(rows)
every = {"0": "never", "1": "step"}.get(sys.argv[3], sys.argv[3] + " steps")
print(f"| {sys.argv[2]} | {every} | {med('elapsed_ms_per_iteration'):.1f} | {mean('validation_ms_per_iteration'):.2f} | "
      f"{mean('weight_checksum_ms_per_iteration'):.2f} | {mean('weight_hash_ms_per_iteration'):.2f} |")
PY
        rm -f "$work/m.jsonl"
    done
done
