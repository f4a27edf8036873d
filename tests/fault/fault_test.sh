#!/usr/bin/env bash
# fault_test.sh - the fault suite: one case per fault kind, injected into a 4-rank CPU job
# under the supervisor; each asserts the diagnosis and that training went on (or stopped
# with the documented status), and where the fault is recoverable, that the parameters the
# job ended with are bitwise those of the fault-free run (its logged losses and gradient
# norms, and its final checkpoint: parameters and optimizer state, `cohort ckpt diff`).
#   fault_test.sh COHORT CASE
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir fault

iters=12
tiny_model --global-batch-size 16 --nproc-per-node 4 --train-iters $iters
# Every recoverable case ends with `cohort ckpt diff` of the final checkpoints, fault-free
# run against faulty run (expect_same, expect_same_ckpt). Exempt: nan_persistent_stop,
# nan_persistent_skip and error_injection's correct_result (stop or skip an iteration by
# design), crash_loop (stops at the restart limit), determinism, bad_spec (no fault).

# short timeouts so that hangs are found within seconds
quick="--inprocess-soft-timeout 2 --inprocess-hard-timeout 4 --inprocess-barrier-timeout 60"
# run NAME [flags...]: a 4-rank job; output in $work/NAME.{out,err,jsonl}, status in $rc; it
# saves its final checkpoint (the last iteration's) in $work/NAME.ckpt, unless a --save
# among the flags (later, so it wins) says elsewhere
run() {
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" --run-report "$work/$name.report.json" \
        --save "$work/$name.ckpt" "$@" >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
}
clean() {
    run clean "$@"
    [ $rc -eq 0 ] || fail "fault-free run exited $rc: $(tail -5 "$work/clean.err")"
}
# expect_same NAME: the faulty run logged exactly the fault-free run's losses and norms
expect_same() {
    same_losses clean "$1" "$1: losses differ from the fault-free run"
    [ "$(grep -c '"grad_norm"' "$work/$1.jsonl")" -eq $iters ] || fail "$1: not every iteration logged"
    expect_same_ckpt "$work/clean.ckpt" "$work/$1.ckpt" $iters
}
# expect_same_ckpt REF RUN ITERATION: the run's checkpoint of that iteration holds bitwise the
# fault-free run's parameters and optimizer state (Adam's two moments), every tensor present
expect_same_ckpt() { ckpt_same "$1/$(printf 'iter_%07d' "$3")" "$2/$(printf 'iter_%07d' "$3")"; }
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
    # a corrupted parameter on one rank: its weights' checksum differs from the three other
    # replicas' in that very step, it is repaired from the majority and the step replayed
    clean
    run f --inject "bitflip-param@rank=2,step=5,bit=30"
    expect_rc f 0
    expect_same f
    expect_fault f param_checksum 2 persistent_error
    grep -q "iteration 5: repair (persistent_error): rank 2: parameters differ from 3 of 4 replicas'" "$work/f.err" ||
        fail "no repair: $(grep supervisor "$work/f.err")"
    # without the checksums the losses find it: it reproduces on its rank but not on a
    # peer, so the rank's state is repaired from a healthy replica and the step replayed
    run g --check-weight-hash-across-dp-replicas-interval 0 --inject "bitflip-param@rank=2,step=5,bit=30"
    expect_rc g 0
    expect_same g
    expect_fault g "nan_grad|inf_grad|nan_loss|inf_loss|grad_outlier" 2 persistent_error
    grep -q "repair (persistent_error): rank 2: .* reproduces on rank 2 only" "$work/g.err" || fail "no repair"
    ;;
sdc_4|sdc_2)
    # silent data corruption: bits of one replica's weights flipped (mantissa and exponent,
    # before the forward or after the optimizer step, several seeds choosing the weight),
    # changing the loss far less than a spike; the checksums catch each in its step and the
    # job ends bitwise equal to the fault-free run. Four replicas: the majority repairs;
    # two: the step is replayed, and the rank whose weights changed since it wrote them is
    # repaired from the other
    n=${case_name#sdc_}
    clean --nproc-per-node $n --check-for-spiky-loss
    specs=("1 5 3 forward" "2 7 22 forward" "3 4 23 forward" "4 6 24 optimizer" "5 9 26 forward" "6 3 12 optimizer")
    for k in 1 2 3 4 5 6; do
        read -r seed step bit phase <<<"${specs[k-1]}"
        rank=$(( (seed + 1) % n ))
        run f$k --nproc-per-node $n --check-for-spiky-loss --inject-seed $seed \
            --inject "bitflip-param@rank=$rank,step=$step,bit=$bit,phase=$phase"
        expect_rc f$k 0
        expect_same f$k
        expect_fault f$k param_checksum $rank persistent_error
        at=$step; [ "$phase" = optimizer ] && at=$((step + 1))
        if [ "$n" = 4 ]; then
            grep -q "iteration $at: repair (persistent_error): rank $rank: parameters differ from 3 of 4 replicas'" \
                "$work/f$k.err" || fail "f$k: $(grep supervisor "$work/f$k.err")"
        else
            grep -q "iteration $at: rerun: parameter checksums differ between the replicas with no majority" \
                "$work/f$k.err" || fail "f$k: no replay: $(grep supervisor "$work/f$k.err")"
            grep -q "iteration $at: repair (persistent_error): rank $rank: parameters changed in memory since its last update .*repaired from rank $(( 1 - rank ))" \
                "$work/f$k.err" || fail "f$k: $(grep supervisor "$work/f$k.err")"
        fi
        # no loss check tripped: the corruption was silent
        ! grep -Eq "spiky_loss|nan_|inf_|grad_outlier" "$work/f$k.report.json" || fail "f$k: not silent: $(cat "$work/f$k.report.json")"
    done
    # the control: the same faults unchecked train on, unnoticed, and end elsewhere, while
    # no logged loss moved by as much as the spike threshold (10x)
    for k in 1 3 4; do
        read -r seed step bit phase <<<"${specs[k-1]}"
        run u$k --nproc-per-node $n --check-for-spiky-loss --check-weight-hash-across-dp-replicas-interval 0 \
            --check-replicas-interval 0 --inject-seed $seed \
            --inject "bitflip-param@rank=$(( (seed + 1) % n )),step=$step,bit=$bit,phase=$phase"
        expect_rc u$k 0
        ! grep -q param_checksum "$work/u$k.report.json" || fail "u$k: checked though disabled"
        ! "$cohort" ckpt diff "$work/clean.ckpt/iter_0000012" "$work/u$k.ckpt/iter_0000012" >/dev/null 2>&1 ||
            fail "u$k: the unchecked corruption left no trace (the fault did not change the weights)"
        /usr/bin/python3 - "$work/clean.jsonl" "$work/u$k.jsonl" <<'PY' || fail "u$k: the flip moved a loss by a spike's factor"
import json, sys
a, b = ([r["lm_loss"] for r in map(json.loads, open(p)) if "grad_norm" in r] for p in sys.argv[1:])
assert len(a) == len(b) == 12 and all(y < 10 * x and x < 10 * y for x, y in zip(a, b)), (a, b)
PY
    done
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
    # a rank's loss report to the supervisor dropped (the rank sends it again after 1 s without
    # a verdict), sent twice (the supervisor counts it once) or delayed (900 ms): the same
    # numbers. The fault is on rank 3, whose metrics records the supervisor writes, so the
    # records show what it cost that rank: its wait for the verdict of iteration 4 (drop) or
    # the whole iteration (delay); a duplicate is counted once and the report says it came.
    kind=msg-${case_name#msg_}
    spec="$kind@rank=3,step=4"; [ "$kind" = msg-delay ] && spec+=",ms=900"
    clean
    run f --inject "$spec"
    expect_rc f 0
    expect_same f
    grep -q "inject: $kind on rank 3 at step 4" "$work/f.report.json" || fail "not in the report"
    /usr/bin/python3 - "$work/f.jsonl" "$kind" <<'PY' || fail "$kind had no effect: $(grep '"iteration":4,' "$work/f.jsonl")"
import json, sys
rec = {r["iteration"]: r for r in map(json.loads, open(sys.argv[1])) if "grad_norm" in r}[4]
if sys.argv[2] == "msg-drop":    # no verdict without the report sent again, 1 s into the wait
    assert rec["validation_ms_per_iteration"] >= 1000, rec
elif sys.argv[2] == "msg-delay":  # no verdict before the report left, 900 ms after it was sent
    assert rec["elapsed_ms_per_iteration"] >= 900, rec
PY
    if [ "$kind" = msg-dup ]; then
        /usr/bin/python3 -c 'import json,sys; n=json.load(open(sys.argv[1]))["duplicate_reports"]; assert n >= 1, n' \
            "$work/f.report.json" || fail "no duplicate report counted: $(grep -o '"duplicate_reports": [0-9]*' "$work/f.report.json")"
    fi
    ;;
slow)
    # a straggler: rank 2 sleeps 150 ms per micro batch from step 2 on (others take ~5 ms)
    clean
    run f --inject "slow@rank=2,step=2,ms=150,times=always"
    expect_rc f 0
    expect_same f
    /usr/bin/python3 - "$work/f.report.json" <<'PY' || fail "straggler not reported: $(cat "$work/f.report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
s = {x["rank"]: x["lowest_score"] for x in r["stragglers"]}
# rank 2 is ~30x slower; on a loaded 2-core machine another rank may dip below the
# threshold for a while too, but never that far
assert 2 in s and s[2] < 0.2, s
assert all(v > s[2] for k, v in s.items() if k != 2), s
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
kill|kill_allreduce|kill_optimizer)
    # a rank killed in forward, in the all-reduce or right after its optimizer step: the
    # survivors unwind to the restart barrier in their processes, a new process replaces
    # it with a survivor's state, and the job ends with the fault-free numbers
    case $case_name in kill) where=;; kill_allreduce) where=,phase=allreduce;; *) where=,phase=optimizer;; esac
    clean
    run f --inject "kill@rank=2,step=6$where" $quick
    expect_rc f 0
    expect_same f
    expect_fault f killed 2 rank_failure
    grep -q "in-process restart into generation 2" "$work/f.err" || fail "no restart"
    grep -q "generation 2: 4 rank(s) resume after iteration [0-9]* with the state of rank [0-9] (1 replaced" \
        "$work/f.err" || fail "not resumed: $(grep supervisor "$work/f.err")"
    grep -q '"restarts": 1' "$work/f.report.json" || fail "restart not counted"
    ;;
hang)
    # a busy loop inside compute: no report for the soft timeout aborts the generation; the
    # hung rank unwinds too (the abort reaches its loop) and nobody is replaced
    clean
    run f --inject "hang@rank=1,step=4" $quick
    expect_rc f 0
    expect_same f
    expect_fault f hang 1 rank_failure
    grep -q "generation 2: 4 rank(s) resume after iteration 3 with the state of rank 0 (0 replaced" "$work/f.err" ||
        fail "$(grep supervisor "$work/f.err")"
    ;;
stop)
    # SIGSTOP: the rank answers nothing; after the soft timeout the generation is aborted and
    # the rank, its process state T, is killed at once and replaced (not at the hard timeout)
    clean
    # (not rank 3: the logging rank's last line may die with it, unsent; a hard timeout of
    # 10 s: the kill must come long before it, and a slow machine does not fail the others)
    run f --inject "stop@rank=2,step=5" --inprocess-soft-timeout 2 --inprocess-hard-timeout 10 --inprocess-barrier-timeout 60
    expect_rc f 0
    expect_same f
    expect_fault f hang 2 rank_failure
    expect_fault f killed 2 rank_failure
    grep -q "rank 2 is stopped (process state T); killing it" "$work/f.err" || fail "$(grep supervisor "$work/f.err")"
    ;;
stop_unread)
    # the same where the process state cannot be read (a remote node's rank): the rank is
    # killed 2 s after the others reached the restart barrier, long before the hard timeout
    clean
    COHORT_TEST_NO_PROC_STATE=1 run f --inject "stop@rank=2,step=5" --inprocess-soft-timeout 2 \
        --inprocess-hard-timeout 60 --inprocess-barrier-timeout 90
    expect_rc f 0
    expect_same f
    expect_fault f killed 2 rank_failure
    grep -q "rank 2 did not reach the restart barrier [0-9.]* s after the other 3 rank(s); killing it" "$work/f.err" ||
        fail "$(grep supervisor "$work/f.err")"
    ;;
crash_loop)
    # a rank that dies at every step: the restart-intensity limit turns the crash loop into
    # a clean stop with a report
    run f --inject "kill@rank=1,step=3" --inject "kill@rank=1,step=4" --inject "kill@rank=1,step=5" \
        --inject "kill@rank=1,step=6" --inprocess-restart-limit 2 $quick
    expect_rc f 4
    grep -q "2 restarts within 600 s already (--inprocess-restart-limit): stopping the job" "$work/f.err" ||
        fail "$(grep supervisor "$work/f.err")"
    grep -q '"restarts": 3' "$work/f.report.json" || fail "$(grep restarts "$work/f.report.json")"
    ;;
quarantine)
    # a rank found faulty twice within --quarantine-window is killed and replaced
    clean
    run f --inject "nan@rank=2,step=3" --inject "inf@rank=2,step=6" $quick
    expect_rc f 0
    expect_same f
    grep -q "rank 2 was found faulty 2 times within 1000 iterations: quarantined" "$work/f.err" ||
        fail "$(grep supervisor "$work/f.err")"
    grep -q '"quarantined_ranks": \[\s*2\s*\]' "$work/f.report.json" ||
        /usr/bin/python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['quarantined_ranks'] == [2]" \
            "$work/f.report.json" || fail "not in the report"
    expect_fault f quarantine 2 rank_failure
    grep -q "generation 2: 4 rank(s) resume after iteration [0-9]* with the state of rank [0-9] (1 replaced" "$work/f.err" || fail "not replaced"
    ;;
inject_cli)
    # `cohort inject` against a running job: refused specs say why, an accepted kill
    # restarts the job like --inject does
    "$cohort" train "${tiny[@]}" --train-iters 400 --metrics-file "$work/f.jsonl" \
        --run-report "$work/f.report.json" --save "$work/f.ckpt" $quick >"$work/f.out" 2>"$work/f.err" &
    job=$!
    for _ in $(seq 300); do
        n=$(grep -c grad_norm "$work/f.jsonl" 2>/dev/null); [ "${n:-0}" -ge 5 ] && break; sleep 0.1
    done
    # (the kill first, well ahead: each `cohort inject` asks the job's status too, and the
    # refusals below take their time while the job runs on)
    at=$(( $(grep -c grad_norm "$work/f.jsonl") + 150 ))
    "$cohort" inject --pid $job --json "kill@rank=1,step=$at" >"$work/i4" 2>&1; r4=$?
    "$cohort" inject --pid $job "nan@rank=7,step=900" >"$work/i1" 2>&1; r1=$?
    "$cohort" inject --pid $job "nan@rank=0,step=1" >"$work/i2" 2>&1; r2=$?
    "$cohort" inject --pid 1 "nan@rank=0,step=1" >"$work/i3" 2>&1; r3=$?
    wait $job; rc=$?
    [ $r1 -eq 1 ] && grep -q "rank '7' is not in 0..3" "$work/i1" || fail "bad rank: $r1 $(cat "$work/i1")"
    [ $r2 -eq 1 ] && grep -q "step 1 is too soon" "$work/i2" || fail "past step: $r2 $(cat "$work/i2")"
    [ $r3 -eq 2 ] && grep -q "no running cohort job with supervisor pid 1" "$work/i3" || fail "no job: $(cat "$work/i3")"
    [ $r4 -eq 0 ] && grep -q '"ok":true' "$work/i4" || fail "kill refused: $r4 $(cat "$work/i4")"
    expect_rc f 0
    expect_fault f killed 1 rank_failure
    grep -q "inject: kill@rank=1,step=$at (cohort inject)" "$work/f.report.json" || fail "not in the report"
    clean --train-iters 400
    expect_same_ckpt "$work/clean.ckpt" "$work/f.ckpt" 400
    ;;
shift_ranks)
    # --inprocess-rank-assignment shift-ranks: after rank 1 dies the survivors 0 2 3 become
    # 0 1 2 and the replacement rank 3; the numbers and the log are the fault-free run's
    clean
    run f --inprocess-rank-assignment shift-ranks --inject "kill@rank=1,step=5" $quick
    expect_rc f 0
    expect_same f
    grep -q "rank 2 is rank 1 from generation 2" "$work/f.err" && grep -q "rank 3 is rank 2 from generation 2" "$work/f.err" ||
        fail "ranks not shifted: $(grep 'is rank' "$work/f.err")"
    # (the training lines only, not the checkpoint's "saved ... from iteration 12 to DIR")
    logged=$(grep -c ' iteration *[0-9]*/ *[0-9]* |' "$work/f.out")
    [ "$logged" -eq $iters ] || fail "log lines lost or doubled: $logged"
    ;;
spare)
    # --inprocess-active-world-size 2 of 3 processes: the third is a warm spare that takes a
    # dead rank's place; the dead slot starts a new spare; the numbers are the 2-rank run's
    clean --nproc-per-node 2 # (a later flag overrides the same one earlier)
    run f --nproc-per-node 3 --inprocess-active-world-size 2 --inject "kill@rank=0,step=5" $quick
    expect_rc f 0
    expect_same f
    grep -q "the warm spare in slot 2 takes rank 0" "$work/f.err" || fail "$(grep supervisor "$work/f.err")"
    grep -q "no rank assignment" "$work/f.err" && fail "a spare complained at the end"
    expect_fault f killed 0 rank_failure
    ;;
all_replicas)
    # every replica dies at once: no memory holds the state, so the new generation loads
    # the last checkpoint (iteration 8) and the job still ends bitwise at the fault-free result
    clean --save "$work/clean.ckpt" --save-interval 4
    run f --inject "kill@rank=0,step=10" --inject "kill@rank=1,step=10" --inject "kill@rank=2,step=10" \
        --inject "kill@rank=3,step=10" --save "$work/f.ckpt" --save-interval 4 $quick
    expect_rc f 0
    grep -q "no replica of the state survived: the new generation loads the checkpoint of iteration 8" "$work/f.err" ||
        fail "$(grep supervisor "$work/f.err")"
    expect_same_ckpt "$work/clean.ckpt" "$work/f.ckpt" $iters
    /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['steps_lost'] == 1, r['steps_lost']" \
        "$work/f.report.json" || fail "steps lost: $(grep steps_lost "$work/f.report.json")"
    ;;
rerun_state)
    # the state machine's state travels in the checkpoint: a spike in the first iteration
    # after a resume is caught against the maxima learned before the save
    run f --check-for-spiky-loss --save "$work/s" --save-interval 6
    expect_rc f 0
    /usr/bin/python3 - "$work/s/iter_0000012/manifest.json" <<'PY' || fail "no state in the manifest"
import json, sys
r = json.load(open(sys.argv[1]))["rerun_state_machine"]
assert r["mode"] == "validate_results" and r["spiky_n"] > 0 and r["spiky_max"] > 0 and len(r["faults"]) == 4, r
PY
    run g --check-for-spiky-loss --load "$work/s" --train-iters 14 --inject "spike@rank=2,step=13"
    expect_rc g 0
    expect_fault g spiky_loss 2 transient_error
    run g0 --check-for-spiky-loss --load "$work/s" --train-iters 14
    expect_rc g0 0
    expect_same_ckpt "$work/g0.ckpt" "$work/g.ckpt" 14
    ;;
kill_supervisor)
    # the supervisor dies: the workers stop on their own (no orphan trains headless), the
    # last checkpoint is intact, and the job resumes from it to the fault-free result
    clean --save "$work/clean.ckpt" --save-interval 4
    # (run's job in the background, to know its workers: the supervisor's children)
    "$cohort" train "${tiny[@]}" --metrics-file "$work/f.jsonl" --run-report "$work/f.report.json" --save "$work/f.ckpt" \
        --inject "kill-supervisor@step=7" --save-interval 4 >"$work/f.out" 2>"$work/f.err" &
    sup=$!
    wait_until 60 eval '[ "$(children $sup | wc -l)" -ge 4 ]' || fail "the job's 4 workers did not start"
    workers=$(children $sup)
    wait $sup; rc=$?
    [ $rc -eq 137 ] || fail "supervisor exited $rc, not killed"
    running() { # the workers still running (a zombie has stopped; whoever adopted it reaps it)
        local p s; for p in $workers; do s=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ] && echo "$p"; done
    }
    wait_until 10 eval '[ -z "$(running)" ]' || fail "workers $(running) still running 10 s after their supervisor died"
    [ "$(cat "$work/f.ckpt/latest_checkpointed_iteration.txt")" = 4 ] || fail "tracker: $(cat "$work/f.ckpt/latest_checkpointed_iteration.txt")"
    "$cohort" ckpt verify "$work/f.ckpt" >/dev/null || fail "the last checkpoint does not verify"
    run g --load "$work/f.ckpt" --save "$work/f.ckpt" --save-interval 4
    expect_rc g 0
    expect_same_ckpt "$work/clean.ckpt" "$work/f.ckpt" $iters
    ;;
chaos)
    # 200 steps with 14 mixed faults (kills, a hang, transient NaN/Inf and a spike, bit flips
    # in gradients, parameters and activations, message faults): the parameters and optimizer
    # state at the end are bitwise those of the fault-free run, and the report lists them all
    chaos_iters=(--train-iters 200 --check-for-spiky-loss --log-interval 10)
    clean "${chaos_iters[@]}" --save "$work/clean.ckpt" --save-interval 1000
    faults=(kill@rank=1,step=20 nan@rank=0,step=30 hang@rank=2,step=45 msg-drop@rank=2,step=60
            bitflip-grad@rank=1,step=70,bit=30 kill@rank=2,step=90,phase=allreduce msg-dup@rank=1,step=100
            inf@rank=2,step=110 bitflip-param@rank=3,step=120,bit=30 msg-delay@rank=0,step=130
            spike@rank=1,step=140 bitflip-act@rank=0,step=160,bit=30 kill@rank=0,step=175,phase=optimizer
            nan@rank=3,step=190,microbatch=1)
    args=()
    for f in "${faults[@]}"; do args+=(--inject "$f"); done
    run f "${chaos_iters[@]}" "${args[@]}" $quick --save "$work/f.ckpt" --save-interval 1000 --inprocess-restart-limit 20
    expect_rc f 0
    expect_same_ckpt "$work/clean.ckpt" "$work/f.ckpt" 200
    same_losses f clean "logged losses differ"
    /usr/bin/python3 - "$work/f.report.json" <<'PY' || fail "report incomplete: $(cat "$work/f.report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
f = r["faults"]
def has(kind, rank, step=None):
    return any(x["kind"] in kind.split("|") and x["rank"] == rank and (step is None or x["iteration"] == step) for x in f)
kill = "killed|collective|exited"  # whichever the supervisor heard of first (the iteration a restart records may be the next)
flip = "nan_grad|inf_grad|grad_outlier|nan_loss|inf_loss|spiky_loss"  # whichever check the flipped value trips
want = [(kill, 1, None), ("nan_loss", 0, 30), ("hang", 2, 45), ("injected", 2, 60), (flip, 1, 70), (kill, 2, None),
        ("injected", 1, 100), ("inf_loss", 2, 110), ("param_checksum", 3, 120), ("injected", 0, 130), ("spiky_loss", 1, 140),
        (flip, 0, 160), (kill, 0, None), ("nan_loss", 3, 190)]
missing = [w for w in want if not has(*w)]
assert not missing, missing
assert r["restarts"] >= 4 and r["steps_lost"] == 0, r
# ranks 0, 1 and 3 are found faulty twice within 1000 iterations: quarantined and replaced
assert sorted(r["quarantined_ranks"]) == [0, 1, 3], r["quarantined_ranks"]
PY
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
