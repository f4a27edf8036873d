#!/usr/bin/env bash
# train_test.sh - `cohort train --device cuda` end to end on the CUDA stand-in
# (build/cohort-cudasim: the real CUDA backend's kernels on the CPU, tests/cudasim/), one case
# per meson test (suite cudasim):
#   tracks_cpu: a tiny GPT (sequences of 64 tokens: two attention tiles) trained 3 iterations
#     on the stand-in logs the same losses as `cohort --device cpu` within 1e-5 relative
#     (different summation orders only), and the run says it used the CUDA backend.
#   deterministic: two stand-in runs with dropout log bitwise the same metrics (the stand-in
#     shuffles thread order per launch: the kernels' results must not depend on it).
cohort=$1; cudasim=$2; case_name=$3
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
workdir cudasim

tiny_model --seq-length 64 --train-iters 3 --global-batch-size 4

losses() { grep -o '"iteration":[0-9]*\|"lm_loss":[^,]*' "$1" | paste -sd' '; }

case $case_name in
tracks_cpu)
    "$cohort" train "${tiny[@]}" --device cpu --metrics-file "$work/cpu.jsonl" >"$work/cpu.out" 2>&1 ||
        fail "cpu run: $(tail -5 "$work/cpu.out")"
    "$cudasim" train "${tiny[@]}" --device cuda --metrics-file "$work/cuda.jsonl" >"$work/cuda.out" 2>&1 ||
        fail "stand-in run: $(tail -5 "$work/cuda.out")"
    grep -q "cuda: GPU 0 of 1, cudasim" "$work/cuda.out" || fail "the run did not use the stand-in: $(head -3 "$work/cuda.out")"
    paste <(grep -o '"lm_loss":[^,]*' "$work/cpu.jsonl" | cut -d: -f2) \
          <(grep -o '"lm_loss":[^,]*' "$work/cuda.jsonl" | cut -d: -f2) | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-5 * a) { bad++; print "cpu " $1 " stand-in " $2 } }
        END { exit (n < 3 || bad > 0) }' >&2 || fail "the stand-in's losses are not the CPU's: $(losses "$work/cpu.jsonl") / $(losses "$work/cuda.jsonl")"
    ;;
deterministic)
    for r in 1 2; do
        COHORT_CUDASIM_SEED=$r "$cudasim" train "${tiny[@]}" --device cuda --hidden-dropout 0.1 --attention-dropout 0.1 \
            --metrics-file "$work/m$r.jsonl" >"$work/out$r" 2>&1 || fail "run $r: $(tail -5 "$work/out$r")"
    done
    [ "$(losses "$work/m1.jsonl")" = "$(losses "$work/m2.jsonl")" ] ||
        fail "two stand-in runs under different thread orders differ: $(losses "$work/m1.jsonl") / $(losses "$work/m2.jsonl")"
    [ "$(grep -c lm_loss "$work/m1.jsonl")" -ge 3 ] || fail "metrics file has too few lines"
    ;;
*) fail "unknown case $case_name" ;;
esac
