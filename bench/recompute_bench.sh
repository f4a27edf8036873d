#!/usr/bin/env bash
# recompute_bench.sh - activation memory and step time of GPT-2 124M at sequence 1024 without
# recomputation, with selective and with full recomputation, and at tp 2 with and without
# sequence parallelism (docs/benchmarks.md "Activation memory"; docs/memory.md).
#   bench/recompute_bench.sh [BUILD_DIR] [ITERS]
# One process with 2 threads (tp 2: two processes of 1 thread); mock data, dropout on.
# Prints, per configuration, the rank's logged activation bytes, its peak RSS and the
# elapsed time per iteration of the iterations after the first.
set -u
build=${1:-build} iters=${2:-4}
work=$(mktemp -d /tmp/cohort-rcbench.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 "$(dirname "$0")/cpuinfo.py"
gpt2=(--mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --num-layers 12 --hidden-size 768
      --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1
      --global-batch-size 1 --lr 1e-4 --train-iters "$iters" --log-interval 1 --eval-interval 100000
      --eval-iters 0 --data-cache-path "$work/cache" --device cpu)
one() { # NAME ARGS...
    local name=$1; shift
    /usr/bin/time -v "$build/cohort" train "${gpt2[@]}" "$@" >"$work/$name.out" 2>&1
    local act rss ms
    act=$(grep -m1 -o "activation memory: [0-9]* bytes on this rank (layers [0-9]*" "$work/$name.out" | awk '{print $3, $9}')
    rss=$(grep "Maximum resident set size" "$work/$name.out" | awk '{print $NF}')
    ms=$(grep -o "elapsed time per iteration (ms): [0-9.]*" "$work/$name.out" | tail -n +2 | awk '{s += $NF; n++} END {if (n) printf "%.0f", s / n}')
    printf '%-28s activation bytes %s (layers %s)  peak RSS %s kB  ms/iteration %s\n' "$name" ${act:-? ?} "${rss:-?}" "${ms:-?}"
}
one none --threads 2
one selective_core_attn --threads 2 --recompute-granularity selective
one selective_all --threads 2 --recompute-granularity selective --recompute-modules core_attn layernorm mlp
one full_uniform_1 --threads 2 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
one tp2 --threads 1 --nproc-per-node 2 --tensor-model-parallel-size 2
one tp2_sp --threads 1 --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel
