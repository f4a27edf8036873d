#!/usr/bin/env bash
# train_test.sh - `cohort train --device cuda` end to end against `--device cpu`, one case
# per meson test (suite gpu); exits 77 where there is no GPU.
#   train_test.sh COHORT CASE     CASE: tracks_cpu | tracks_cpu_bf16 | tracks_cpu_fp16 | deterministic |
#                                       local_rank
# (tracks_cpu_fp16: --fp16 at a dynamic scale from 4096 on both sides, the CPU's fp16 products
# being the GPU's inputs multiplied in fp32: fp32's bounds; both runs skip the same steps)
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
# Megatron's whole mock set, as these GPU-vs-CPU tolerances were set on (lib.sh's first 1000
# documents were never run on a GPU)
export COHORT_TEST_MOCK_SEQUENCES=
workdir gpu

tiny_model --hidden-size 64 --seq-length 64 --micro-batch-size 4 --log-interval 10 --eval-interval 100000 --threads 2 \
    --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 10

# skip without a GPU
"$cohort" train "${tiny[@]}" --device cuda --train-iters 12 >"$work/probe" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--device cuda:" "$work/probe"; then
    echo "skip: $(grep -- '--device cuda:' "$work/probe")" >&2
    exit 77
fi
[ $rc -eq 0 ] || fail "probe run: exit $rc: $(tail -5 "$work/probe")"

loss_pairs() { # metrics file -> "iteration loss" per logged training iteration
    sed -n 's/^{"iteration":\([0-9]*\),.*"lm_loss":\([-0-9.eE+]*\),.*/\1 \2/p' "$1"
}

compare() { # a b abs rel: every logged loss of b within abs + rel*|a| of a's
    paste <(loss_pairs "$1") <(loss_pairs "$2") | awk -v A="$3" -v R="$4" '
        { n++; d = $2 - $4; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2
          if ($1 != $3 || d > A + R * a) { bad++; if (bad <= 5) printf "iteration %s: cpu %s gpu %s\n", $1, $2, $4 } }
        END { printf "%d logged iterations compared, %d off\n", n, bad; exit (n < 5 || bad > 0) }' >&2
}

case $case_name in
tracks_cpu|tracks_cpu_bf16|tracks_cpu_fp16)
    extra=(); cpu_extra=(); abs=0.02; rel=0.01
    if [ "$case_name" = tracks_cpu_fp16 ]; then extra=(--fp16 --initial-loss-scale 4096); cpu_extra=("${extra[@]}"); fi
    if [ "$case_name" = tracks_cpu_bf16 ]; then extra=(--bf16); abs=0.08; rel=0.03; fi
    # the CPU side in bf16 where the CPU has bf16 instructions (cohort refuses --bf16 elsewhere);
    # otherwise fp32, which the bf16 losses track within the same bounds
    if [ "$case_name" = tracks_cpu_bf16 ] && grep -qwE "avx512_bf16|amx_bf16" /proc/cpuinfo; then cpu_extra=(--bf16); fi
    [ "$case_name" = tracks_cpu_bf16 ] && echo "cpu reference: ${cpu_extra[*]:-fp32 (no bf16 instructions on this CPU)}" >&2
    for dev in cpu cuda; do
        if [ $dev = cpu ]; then ex=("${cpu_extra[@]}"); else ex=("${extra[@]}"); fi
        "$cohort" train "${tiny[@]}" "${ex[@]}" --device $dev --train-iters 300 --hidden-dropout 0 \
            --attention-dropout 0 --metrics-file "$work/$dev.jsonl" >"$work/$dev.out" 2>&1 ||
            fail "$dev run: $(tail -5 "$work/$dev.out")"
    done
    grep -q "cuda:" "$work/cuda.out" || fail "the cuda run did not use the CUDA backend: $(head -3 "$work/cuda.out")"
    compare "$work/cpu.jsonl" "$work/cuda.jsonl" $abs $rel || fail "the GPU losses do not track the CPU's"
    if [ "$case_name" = tracks_cpu_fp16 ]; then
        grep -q "cuda: .*fp16" "$work/cuda.out" || fail "the cuda run was not fp16: $(grep -m1 cuda: "$work/cuda.out")"
        sk() { grep -o '"skipped_iterations":[0-9]*' "$1" | paste -sd' '; }
        [ "$(sk "$work/cpu.jsonl")" = "$(sk "$work/cuda.jsonl")" ] || fail "skipped steps differ: $(sk "$work/cpu.jsonl") / $(sk "$work/cuda.jsonl")"
    fi
    ;;
deterministic)
    for r in 1 2; do
        "$cohort" train "${tiny[@]}" --device cuda --train-iters 40 --hidden-dropout 0.1 --attention-dropout 0.1 \
            --log-interval 1 --metrics-file "$work/m$r.jsonl" >"$work/out$r" 2>&1 || fail "run $r: $(tail -5 "$work/out$r")"
        sed -E 's/"(elapsed_ms_per_iteration|tokens_per_second|tflops_per_rank|rss_bytes|max_rss_bytes|time)":[^,}]*//g' "$work/m$r.jsonl" >"$work/s$r"
    done
    [ "$(grep -c lm_loss "$work/s1")" -ge 40 ] || fail "metrics file has too few lines"
    cmp -s "$work/s1" "$work/s2" || fail "two GPU runs with the same seed differ: $(diff "$work/s1" "$work/s2" | head)"
    ;;
local_rank)
    # two workers: each on the GPU of its local rank; the printing rank (the last, local
    # rank 1) names its GPU in the model line. Skips with fewer than two GPUs.
    "$cohort" train "${tiny[@]}" --device cuda --nproc-per-node 2 --train-iters 4 >"$work/out" 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q -- "--device cuda: each worker uses the GPU of its local rank" "$work/out"; then
        echo "skip: $(grep -- '--device cuda:' "$work/out")" >&2
        exit 77
    fi
    [ $rc -eq 0 ] || fail "two workers: exit $rc: $(tail -5 "$work/out")"
    grep -q "cuda: GPU 1 of " "$work/out" || fail "the last rank is not on GPU 1: $(grep 'cohort: model' "$work/out")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name" >&2
