#!/usr/bin/env bash
# train_test.sh - `cohort train --device cuda` end to end on the CUDA stand-in
# (build/cohort-cudasim: the real CUDA backend's kernels on the CPU, tests/cudasim/), one case
# per meson test (suite cudasim):
#   tracks_cpu: a tiny GPT (sequences of 64 tokens: two attention tiles) trained 3 iterations
#     on the stand-in logs the same losses as `cohort --device cpu` within 1e-5 relative
#     (different summation orders only), and the run says it used the CUDA backend.
#   deterministic: two stand-in runs with dropout log bitwise the same metrics (the stand-in
#     shuffles thread order per launch: the kernels' results must not depend on it).
#   syncs: a training step makes a bounded number of host waits, not one per tensor: the
#     stand-in counts them (cudasim_sync_count; COHORT_CUDASIM_COUNTS writes the count at
#     exit) in a 2- and a 6-iteration run of a 4-layer model (about 50 tensors, 2 micro
#     batches a step); the four extra steps cost at most 2 waits per micro batch (its loss
#     read, the end of its backward) + 6 each (the gradient norm's one, the optimizer step's
#     one with every tensor's checksum, the checksum checks', the log line's): 10, where one
#     wait per tensor for the norm alone was over 50.
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
syncs)
    max_per_step=$((2 * 2 + 6))
    for it in 2 6; do
        rm -f "$work/counts$it"
        tiny_model --seq-length 64 --global-batch-size 4 --num-layers 4 --train-iters $it
        COHORT_CUDASIM_COUNTS="$work/counts$it" "$cudasim" train "${tiny[@]}" --device cuda >"$work/out$it" 2>&1 ||
            fail "run of $it iterations: $(tail -5 "$work/out$it")"
        [ -s "$work/counts$it" ] || fail "the stand-in wrote no counts (COHORT_CUDASIM_COUNTS)"
    done
    a=$(awk '{print $4}' "$work/counts2"); b=$(awk '{print $4}' "$work/counts6")
    per=$(( (b - a + 3) / 4 ))
    echo "host waits: $a in 2 iterations, $b in 6: $per a step"
    [ "$per" -ge 1 ] || fail "no waits counted ($a, $b): the counter does not count"
    [ "$per" -le $max_per_step ] || fail "a step waits for the GPU $per times (at most $max_per_step expected): $a in 2 iterations, $b in 6"
    ;;
*) fail "unknown case $case_name" ;;
esac
