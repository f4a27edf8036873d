#!/usr/bin/env bash
# mp_test.sh - Megatron's parallel groups as communicators, and in-process restarts across
# them, on 8 processes in a tp2 x pp2 x dp2 layout, with the model
# replicated: cohort-standin (standin_main.c) replicates the whole model on every rank of a
# model-parallel group (the groups' plumbing alone, apart from the tensor and pipeline
# compute that tests/integration/{tp,pp}_test.sh check), so each (tp, pp) shard's data-parallel
# group trains what a 2-rank job trains, and the workers check at every generation's start
# and at the end that the members of every group (tp, cp, dp, pp, mp, embedding, expert ...)
# hold identical weights. Final states are compared with `cohort ckpt diff`.
#   mp_test.sh COHORT COHORT_STANDIN CASE
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$1"
standin=$2; case_name=$3
workdir mp

iters=10
tiny_model --train-iters $iters --inprocess-soft-timeout 5
common=("${tiny[@]}")
mp=(--nproc-per-node 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
# standin NAME [flags...]: the 8-rank stand-in job; status in $rc
standin() {
    local name=$1; shift
    COHORT_CPU_EXE=$standin "$cohort" train "${common[@]}" "${mp[@]}" --metrics-file "$work/$name.jsonl" \
        --save "$work/$name.ckpt" "$@" >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
}
expect_rc() { [ "$rc" -eq "$2" ] || fail "$1 exited $rc, not $2: $(grep -v '^cohort rank' "$work/$1.err" | tail -8)"; }
# expect_same_ckpt A B: the final checkpoints hold bitwise the same parameters and moments
expect_same_ckpt() { ckpt_same "$work/$1.ckpt/$(printf 'iter_%07d' $iters)" "$work/$2.ckpt/$(printf 'iter_%07d' $iters)"; }

case $case_name in
groups_match)
    # the 8-rank layout trains what 2 data-parallel ranks train, and every group's members agree
    "$cohort" train "${common[@]}" --nproc-per-node 2 --metrics-file "$work/dp2.jsonl" --save "$work/dp2.ckpt" \
        >"$work/dp2.out" 2>"$work/dp2.err" || fail "2-rank job: $(tail -5 "$work/dp2.err")"
    standin mp
    expect_rc mp 0
    expect_same_ckpt dp2 mp
    same_losses mp dp2 "logged losses differ from the 2-rank job's"
    grep -q "replicas differ" "$work/mp.err" && fail "$(grep "replicas differ" "$work/mp.err" | head -3)"
    ;;
groups_kill)
    # rank 5 (tp 1, dp 0, pp 1) dies: its shard's state comes from rank 7, its data-parallel
    # peer, every other shard's from its own first survivor; no checkpoint is read
    standin clean
    expect_rc clean 0
    standin f --inject "kill@rank=5,step=5"
    expect_rc f 0
    expect_same_ckpt clean f
    grep -q "resume after iteration 4 with the state of ranks 0, 1, 4, 7 (one per model shard) (1 replaced" "$work/f.err" ||
        fail "$(grep supervisor "$work/f.err")"
    grep -q "loads the checkpoint" "$work/f.err" && fail "a checkpoint was read: $(grep checkpoint "$work/f.err")"
    ;;
groups_shard_lost)
    # ranks 5 and 7 hold the same shard (tp 1, pp 1): with both dead no replica of it is
    # left, and every rank resumes from the last checkpoint (iteration 4), to the same end
    standin clean --save-interval 4
    expect_rc clean 0
    standin f --save-interval 4 --inject "kill@rank=5,step=6" --inject "kill@rank=7,step=6"
    expect_rc f 0
    expect_same_ckpt clean f
    grep -q "no replica survived of the model shard tp 1, cp 0, pp 1" "$work/f.err" || fail "$(grep supervisor "$work/f.err")"
    grep -q "loads the checkpoint of iteration 4" "$work/f.err" || fail "$(grep supervisor "$work/f.err")"
    ;;
groups_refused)
    # cohort itself (no stand-in) refuses the combinations whose compute does not exist yet
    # (a context exchange other than the ring; tensor, context and pipeline parallelism run,
    # with each other too: tests/integration/cp_test.sh)
    "$cohort" train "${common[@]}" --nproc-per-node 8 --pipeline-model-parallel-size 2 --context-parallel-size 2 \
        --attention-dropout 0 --cp-comm-type a2a >"$work/r.out" 2>"$work/r.err"
    rc=$?
    [ $rc -eq 2 ] || fail "cohort accepted pp2 x cp2 with --cp-comm-type a2a (exit $rc)"
    grep -q -- "--cp-comm-type a2a is not supported yet" "$work/r.err" || fail "$(cat "$work/r.err")"
    # and the stand-in a world that the layout does not divide
    COHORT_CPU_EXE=$standin "$cohort" train "${common[@]}" --nproc-per-node 6 --tensor-model-parallel-size 4 \
        >"$work/w.out" 2>"$work/w.err"
    rc=$?
    [ $rc -eq 2 ] || fail "a world of 6 with tp 4 was accepted (exit $rc)"
    grep -q "not a multiple of tensor x context x pipeline = 4" "$work/w.err" || fail "$(cat "$work/w.err")"
    ;;
*) fail "unknown case $case_name" ;;
esac
exit 0
