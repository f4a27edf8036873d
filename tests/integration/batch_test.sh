#!/usr/bin/env bash
# batch_test.sh - the iteration's batch: many micro batches per rank under the rerun state
# machine, Megatron's batch-size ramp-up, and Megatron's example launch lines; one case per
# meson test.
#   batch_test.sh COHORT CASE
# Cases:
#   many_micro_batches  256 micro batches per rank (micro batch 1), validated: a NaN injected in
#                       micro batch 200 is caught and replayed and the run ends bitwise the
#                       fault-free run's, in one process and in a dp 2 job (the supervisor's
#                       validator, one report a round); the peak RSS of 256 micro batches is
#                       within 8 MiB of 64's (nothing per micro batch in the state machine)
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir batch

tiny_model --micro-batch-size 1 --eval-iters 1

# peak_rss NAME ARGS...: trains like train_ok; prints the run's peak resident KiB (its processes')
peak_rss() {
    local name=$1; shift
    /usr/bin/python3 - "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" "$@" >"$work/$name.rss" \
        2>"$work/$name.out" <<'PY' || fail "$name: $(tail -5 "$work/$name.out")"
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)
PY
}

case $case_name in
many_micro_batches)
    m=(--global-batch-size 256 --train-iters 3)
    peak_rss clean "${m[@]}" --save "$work/c"
    peak_rss f "${m[@]}" --save "$work/f" --inject "nan@rank=0,step=2,microbatch=200"
    grep -q "nan on rank 0 at step 2, micro batch 200" "$work/f.out" || fail "no fault injected: $(head -5 "$work/f.out")"
    grep -q "iteration 2: rerun: rank 0: nan_loss (nan); replaying the step in place" "$work/f.out" ||
        fail "no replay: $(grep -i 'iteration 2' "$work/f.out")"
    grep -q "iteration 2, nan_loss, transient_error" "$work/f.out" || fail "no diagnosis: $(tail -3 "$work/f.out")"
    ckpt_same "$work/c" "$work/f" "256 micro batches: the replayed run differs from the fault-free one"
    same_losses clean f "256 micro batches: the logged numbers differ"
    peak_rss small --global-batch-size 64 --train-iters 3
    small=$(cat "$work/small.rss") big=$(cat "$work/clean.rss")
    [ $((big - small)) -le 8192 ] || fail "peak RSS grows with the micro batches: 64: $small KiB, 256: $big KiB"
    echo "ok: peak RSS 64 micro batches $small KiB, 256 $big KiB"
    # the supervisor's validator: dp 2, 256 micro batches per rank, the NaN on rank 1
    d=(--nproc-per-node 2 --global-batch-size 512 --train-iters 3)
    train_ok dclean "${d[@]}" --save "$work/dc"
    train_ok df "${d[@]}" --save "$work/df" --inject "nan@rank=1,step=2,microbatch=200"
    grep -q "rank 1: nan_loss (nan); replaying the step in place" "$work/df.out" ||
        fail "dp 2: no replay: $(grep -i 'iteration 2\|supervisor' "$work/df.out" | head)"
    ckpt_same "$work/dc" "$work/df" "dp 2, 256 micro batches per rank: the replayed run differs"
    same_losses dclean df "dp 2: the logged numbers differ"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
