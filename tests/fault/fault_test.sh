#!/usr/bin/env bash
# fault_test.sh - the fault suite: one case per fault kind, injected into a 4-rank CPU job
# under the supervisor; each asserts the diagnosis and that training went on (or stopped
# with the documented status), and where the fault is recoverable, that the parameters the
# job ended with are bitwise those of the fault-free run (its logged losses and gradient
# norms, and its final checkpoint).
#   fault_test.sh COHORT CASE
set -uo pipefail
cohort=$1; case_name=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-fault.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

iters=12
tiny=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 2 --hidden-size 32
      --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 16 --lr 1e-3
      --data-cache-path "$work/cache" --log-interval 1 --eval-interval 1000 --eval-iters 1 --threads 1
      --nproc-per-node 4 --train-iters $iters)
# the fields of the training records of a metrics file that must not depend on timing
losses() { grep '"grad_norm"' "$1" | grep -o '"iteration":[0-9]*\|"lm_loss":[^,]*\|"grad_norm":[^,]*' | paste -sd' '; }

# run NAME [flags...]: a 4-rank job; output in $work/NAME.{out,err,jsonl}, status in $rc
run() {
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" --run-report "$work/$name.report.json" "$@" \
        >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
}
clean() {
    run clean "$@"
    [ $rc -eq 0 ] || fail "fault-free run exited $rc: $(tail -5 "$work/clean.err")"
}
# expect_same NAME: the faulty run logged exactly the fault-free run's losses and norms
expect_same() {
    [ "$(losses "$work/$1.jsonl")" = "$(losses "$work/clean.jsonl")" ] ||
        fail "$1: losses differ from the fault-free run:
$(diff <(losses "$work/$1.jsonl" | tr ' ' '\n') <(losses "$work/clean.jsonl" | tr ' ' '\n') | head -6)"
    [ "$(grep -c '"grad_norm"' "$work/$1.jsonl")" -eq $iters ] || fail "$1: not every iteration logged"
}
# expect_fault NAME KIND[|KIND...] RANK DIAGNOSIS: the run report lists that fault (a bit flip
# shows as whichever check its value trips first)
expect_fault() {
    /usr/bin/python3 - "$work/$1.report.json" "$2" "$3" "$4" <<'PY' || fail "$1: the run report lacks $2 on rank $3 ($4): $(cat "$work/$1.report.json" 2>/dev/null | head -40)"
import json, sys
r = json.load(open(sys.argv[1]))
kinds, rank, diag = sys.argv[2].split("|"), int(sys.argv[3]), sys.argv[4]
ok = [f for f in r["faults"] if f["kind"] in kinds and f["rank"] == rank and f.get("diagnosis", "") == diag]
assert ok, r["faults"]
assert r["steps_lost"] == 0
PY
}
expect_rc() { [ $rc -eq "$2" ] || fail "$1 exited $rc, want $2: $(grep -v '^cohort rank' "$work/$1.err" | tail -6)"; }

case $case_name in
nan_transient|inf_transient)
    kind=${case_name%_transient}
    clean
    run f --inject "$kind@rank=2,step=5,microbatch=1"
    expect_rc f 0
    expect_same f
    expect_fault f "${kind}_loss" 2 transient_error
    grep -q "iteration 5: rerun" "$work/f.err" || fail "no replay of iteration 5"
    ;;
spike_transient)
    clean --check-for-spiky-loss
    run f --check-for-spiky-loss --inject "spike@rank=1,step=7"
    expect_rc f 0
    expect_same f
    expect_fault f spiky_loss 1 transient_error
    ;;
nan_persistent_stop)
    # the same batch gives NaN on its rank and on the peer that recomputes it: a data
    # problem; the job stops with status 3, the tracker records it, and a relaunch with
    # the tracker skips that iteration and finishes
    run f --inject "nan@rank=3,step=4,times=always" --result-rejected-tracker-filename "$work/tracker.txt"
    expect_rc f 3
    expect_fault f nan_loss 3 correct_result
    grep -q "check: rank 3: nan_loss (nan) reproduced; rank 0 recomputes" "$work/f.err" || fail "no peer check"
    grep -q "reproduced on rank 0 too" "$work/f.err" || fail "no diagnosis: $(grep supervisor "$work/f.err")"
    grep -Eq "^ts=.* node=.* device=.* jobID=.* rank=3 iteration=4 status=correct_result result=nan message='.*'$" \
        "$work/tracker.txt" || fail "tracker line: $(cat "$work/tracker.txt")"
    run g --result-rejected-tracker-filename "$work/tracker.txt"
    expect_rc g 0
    grep -q "skipping iteration 4 (--iterations-to-skip)" "$work/g.out" || fail "iteration 4 not skipped: $(head -20 "$work/g.out")"
    grep -q '"iteration":12,.*"skipped_iterations":1' "$work/g.jsonl" || fail "skipped count"
    ;;
nan_persistent_skip)
    run f --inject "nan@rank=0,step=6,times=always" --on-reproducible-error skip
    expect_rc f 0
    expect_fault f nan_loss 0 correct_result
    grep -q '"iteration":12,.*"skipped_iterations":1' "$work/f.jsonl" || fail "iteration 6 not skipped"
    ;;
bitflip_grad)
    clean
    run f --inject "bitflip-grad@rank=1,step=3,bit=30"
    expect_rc f 0
    expect_same f
    expect_fault f grad_outlier 1 transient_error
    ;;
bitflip_param)
    # a corrupted parameter on one rank reproduces there but not on a peer: the rank's
    # state is repaired from a healthy replica and the step replayed
    clean
    run f --inject "bitflip-param@rank=2,step=5,bit=30"
    expect_rc f 0
    expect_same f
    expect_fault f "nan_grad|inf_grad|nan_loss|inf_loss|grad_outlier" 2 persistent_error
    grep -q "repair (persistent_error): rank 2" "$work/f.err" || fail "no repair"
    ;;
bitflip_act)
    clean
    run f --inject "bitflip-act@rank=3,step=8,bit=30"
    expect_rc f 0
    expect_same f
    expect_fault f "nan_grad|inf_grad|nan_loss|inf_loss|grad_outlier" 3 transient_error
    ;;
replica_check)
    # a low bit flipped in one rank's parameters after an update changes no loss: the
    # replicas' checksums (every 4 iterations) find it, the majority repairs it
    clean --check-replicas-interval 4
    run f --check-replicas-interval 4 --inject "bitflip-param@rank=1,step=8,bit=3,phase=optimizer"
    expect_rc f 0
    expect_same f
    grep -q "replica check at iteration 8: rank(s) 1 differ from rank 0 (3 of 4 agree); repaired from rank 0" \
        "$work/f.err" || fail "no replica repair: $(grep -i replica "$work/f.err")"
    grep -q '"replica check at iteration 8' "$work/f.report.json" || fail "replica event not in the report"
    ;;
msg_drop|msg_dup|msg_delay)
    kind=msg-${case_name#msg_}
    clean
    run f --inject "$kind@rank=1,step=4"
    expect_rc f 0
    expect_same f
    grep -q "inject: $kind on rank 1 at step 4" "$work/f.report.json" || fail "not in the report"
    ;;
slow)
    # a straggler: rank 2 sleeps 150 ms per micro batch from step 2 on (others take ~5 ms)
    run f --inject "slow@rank=2,step=2,ms=150,times=always"
    expect_rc f 0
    /usr/bin/python3 - "$work/f.report.json" <<'PY' || fail "straggler not reported: $(cat "$work/f.report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["stragglers"]
assert [x["rank"] for x in s] == [2], s
assert s[0]["lowest_score"] < 0.75, s
PY
    grep -q '"event":"straggler".*"rank":2' "$work/f.jsonl" || fail "straggler not in the metrics"
    ;;
error_injection)
    # Megatron's --error-injection-rate: transient ones are replayed away, persistent ones
    # repaired from a peer, correct results stop the job
    clean
    run t --error-injection-rate 3 --error-injection-type transient_error
    expect_rc t 0
    expect_same t
    grep -q '"diagnosis": "transient_error"' "$work/t.report.json" || fail "no transient diagnosis"
    run p --error-injection-rate 3 --error-injection-type persistent_error
    expect_rc p 0
    expect_same p
    grep -q '"diagnosis": "persistent_error"' "$work/p.report.json" || fail "no persistent diagnosis"
    run c --error-injection-rate 3 --error-injection-type correct_result
    expect_rc c 3
    grep -q '"diagnosis": "correct_result"' "$work/c.report.json" || fail "no correct_result diagnosis"
    ;;
determinism)
    run f --rerun-mode report_determinism_stats
    expect_rc f 0
    grep -q '"determinism": ".* values compared, all identical"' "$work/f.report.json" ||
        fail "$(grep -i determinism "$work/f.err" "$work/f.report.json")"
    ;;
disabled)
    # --rerun-mode disabled: no reports, no verdicts, and the same numbers
    clean
    run f --rerun-mode disabled
    expect_rc f 0
    expect_same f
    grep -q '"iterations_validated": 0' "$work/f.report.json" || fail "validated with validation disabled"
    ;;
bad_spec)
    "$cohort" train "${tiny[@]}" --inject "nan@rank=9,step=2" >"$work/o" 2>&1
    [ $? -eq 2 ] || fail "a rank out of range is a usage error"
    grep -q "rank '9' is not in 0..3" "$work/o" || fail "$(cat "$work/o")"
    "$cohort" train "${tiny[@]}" --inject "melt@rank=0,step=2" >"$work/o" 2>&1
    [ $? -eq 2 ] && grep -q "unknown kind 'melt'" "$work/o" || fail "$(cat "$work/o")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok $case_name"
