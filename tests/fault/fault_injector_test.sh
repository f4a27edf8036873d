#!/usr/bin/env bash
# fault_injector_test.sh - Megatron's random fault injector (--fault-injector-*) on a 4-rank
# CPU job under the supervisor: faults of the named types land on the named ranks every few
# seconds (the run report lists each with source --fault-injector), and the job ends bitwise
# equal to the fault-free run; types cohort lacks are refused with one line.
#   fault_injector_test.sh COHORT CASE
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir fault_injector

iters=150
tiny_model --global-batch-size 16 --nproc-per-node 4 --train-iters $iters --log-interval 10
quick=(--inprocess-soft-timeout 2 --inprocess-hard-timeout 4 --inprocess-barrier-timeout 60 --inprocess-restart-limit 40)
run() {
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" --run-report "$work/$name.report.json" \
        --save "$work/$name.ckpt" --save-interval 1000 "$@" >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
}

case $case_name in
random)
    run clean
    [ $rc -eq 0 ] || fail "fault-free run exited $rc: $(tail -5 "$work/clean.err")"
    # one rank drawn from 1..3 per plan, kill, stop or nan, a plan every ~1.5 s; rank 0 sleeps
    # 40 ms per micro batch so that the job trains for 12 s or more, however fast the machine
    run f "${quick[@]}" --fault-injector-num-ranks 1 --fault-injector-fault-types sigkill,SIGSTOP,nan \
        --fault-injector-fault-probabilities 2,1,1 --fault-injector-mtti-seconds 1.5 --fault-injector-seed 7 \
        --inject slow@rank=0,step=1,times=always,ms=40
    [ $rc -eq 0 ] || fail "faulty run exited $rc: $(grep -v '^cohort rank' "$work/f.err" | tail -6)"
    grep -q "fault injector: plan 1: sigkill (kill) on rank" "$work/f.err" || fail "no plan logged: $(head "$work/f.err")"
    /usr/bin/python3 - "$work/f.report.json" <<'PY' || fail "report: $(head -c 3000 "$work/f.report.json")"
import json, re, sys
r = json.load(open(sys.argv[1]))
inj = [i for i in r["injections"]["list"] if i["source"] == "--fault-injector"]
assert len(inj) >= 3, inj
for i in inj:
    m = re.fullmatch(r"(kill|stop|nan)@rank=([123]),step=\d+", i["spec"])
    assert m, i  # the named types only, never rank 0
kills = [f for f in r["faults"] if f["kind"] in ("killed", "collective", "exited", "hang", "stopped")]
assert len(kills) >= 2 and all(f["rank"] != 0 for f in kills), r["faults"]
assert r["restarts"] >= 2 and r["steps_lost"] == 0, r
PY
    same_losses clean f "losses differ from the fault-free run"
    ckpt_same "$work/clean.ckpt/iter_0000150" "$work/f.ckpt/iter_0000150"
    ;;
refused)
    for bad in "gpu_error|CUDA error" "sigterm|save and stop" "melt|not a fault type"; do
        "$cohort" train "${tiny[@]}" --fault-injector-ranks 1 --fault-injector-fault-types "${bad%%|*}" \
            --fault-injector-mtti-seconds 5 >"$work/o" 2>&1
        [ $? -eq 2 ] && grep -q "${bad#*|}" "$work/o" || fail "${bad%%|*}: $(cat "$work/o")"
    done
    "$cohort" train "${tiny[@]}" --fault-injector-ranks 1 --fault-injector-num-ranks 1 --fault-injector-fault-types kill \
        --fault-injector-mtti-seconds 5 >"$work/o" 2>&1
    [ $? -eq 2 ] && grep -q "give one of them" "$work/o" || fail "ranks and num-ranks: $(cat "$work/o")"
    "$cohort" train "${tiny[@]}" --fault-injector-ranks 7 --fault-injector-fault-types kill \
        --fault-injector-mtti-seconds 5 >"$work/o" 2>&1
    [ $? -eq 2 ] && grep -q "'7' is not a rank of this job (0..3)" "$work/o" || fail "rank 7: $(cat "$work/o")"
    ;;
soak)
    # bench/soak.sh for 2 minutes, every fault kind, ~20 s between faults; seed 26 draws nan, kill,
    # stop, bit-flipped activations and hang in its first ~80 s. The soak's own checks (the faults
    # happened, no step lost, the final state bitwise the fault-free run's) and the planner's
    # prediction of this run's ETTR from the costs and restarts it measured, within 10 points.
    SOAK_MTTI=20 SOAK_SEED=26 COHORT=$cohort bash "$COHORT_SOURCE_ROOT/bench/soak.sh" 2 "$work/soak" \
        >"$work/soak.out" 2>&1 || fail "soak: $(tail -3 "$work/soak.out")"
    /usr/bin/python3 - "$work/soak/soak.json" "$work/soak/f.json" <<'PY' || fail "$(cat "$work/soak.out")"
import json, sys
s, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert s["bitwise_equal"] and s["steps_lost"] == 0, s
# the faults happened: the nan was fired, the kill and the stop sent (a rank cannot report
# those); restarts cured the kill (a rank killed) and the stop, a replayed step the nan
inj = [i for i in r["injections"]["list"] if i["source"] == "--fault-injector"]
assert {"nan"} <= {i["spec"].split("@")[0] for i in inj if i["fired"]}, inj
assert {"kill", "stop"} <= {i["spec"].split("@")[0] for i in inj}, inj
assert s["faults_survived"] >= 4 and s["restarts"] >= 2 and s["replays"] >= 1, s
assert "killed" in {f["kind"] for f in r["faults"] if f.get("recovered_by") == "in-process restart"}, r["faults"]
assert s["iterations"] >= 300, s
assert abs(s["ettr_measured"] - s["ettr_predicted"]) <= 0.10, s
PY
    cat "$work/soak.out"
    ;;
validate)
    # on demand (suite soak): the planner against a 10-minute job's measured ETTR, kills, stops
    # and hangs every ~20 s
    SOAK_MTTI=20 SOAK_TYPES=sigkill,sigstop,hang COHORT=$cohort bash "$COHORT_SOURCE_ROOT/bench/soak.sh" 10 \
        "$work/soak" >"$work/soak.out" 2>&1 || fail "soak: $(tail -3 "$work/soak.out")"
    /usr/bin/python3 - "$work/soak/soak.json" <<'PY' || fail "$(cat "$work/soak.out")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["bitwise_equal"] and s["steps_lost"] == 0 and s["restarts"] >= 10, s
assert abs(s["ettr_measured"] - s["ettr_predicted"]) <= 0.10, s
PY
    cat "$work/soak.out"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok $case_name"
