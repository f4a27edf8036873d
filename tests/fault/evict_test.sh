#!/usr/bin/env bash
# evict_test.sh - straggler eviction (--straggler-evict-after) under the supervisor: a rank the
# injector slows down (dp 2) is scored below --straggler-threshold window after window; with a
# warm spare it is evicted: the spare (a process started before) takes its rank and its
# shard's state from the data-parallel peer, the slow process is stopped, the steps after run
# at the normal pace, no step is lost and the final checkpoint is bitwise the fault-free run's;
# without a spare the supervisor says it cannot evict and the job completes.
#   evict_test.sh COHORT CASE      CASE: spare | no_spare
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir evict

iters=14
tiny_model --global-batch-size 8 --nproc-per-node 2 --train-iters $iters
# rank 1 sleeps 150 ms per micro batch (2 a step) from step 2 on; the others take a few ms
slow="slow@rank=1,step=2,ms=150,times=always"
quick="--inprocess-soft-timeout 5 --inprocess-hard-timeout 8 --inprocess-barrier-timeout 60"
# run NAME [flags...]: in the background (pid in $job); output in $work/NAME.{out,err,jsonl}
start() {
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" --run-report "$work/$name.report.json" \
        --save "$work/$name.ckpt" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    job=$!
}
finish() {
    wait "$job"
    rc=$?
    [ $rc -eq 0 ] || fail "$1 exited $rc: $(grep -v '^cohort rank' "$work/$1.err" | tail -6)"
}

case $case_name in
spare)
    start clean
    finish clean
    # (threshold 0.3: the slow rank scores about 0.05; after the eviction steps of a few ms score
    # 0.5 or so from noise alone, and must not be evicted in turn)
    start f --nproc-per-node 3 --inprocess-active-world-size 2 --straggler-evict-after 2 --straggler-threshold 0.3 \
        --inject "$slow" $quick
    # the job's processes before any eviction (scores start after 5 iterations of warm-up)
    wait_until 60 grep -q '"iteration":2,' "$work/f.jsonl" || fail "no progress: $(tail -3 "$work/f.err")"
    before=" $(children "$job" | tr '\n' ' ') "
    finish f
    grep -q "training goes on" "$work/f.err" && fail "eviction refused: $(grep straggler "$work/f.err")"
    evicted=$(sed -n 's/.*rank 1 (pid \([0-9]*\)) evicted as a straggler: scored below 0.30 2 iterations in a row (scores [0-9. ]*).*/\1/p' "$work/f.err" | head -1)
    spare=$(sed -n 's/.*the warm spare in slot 2 takes rank 1 (node 0, pid \([0-9]*\): started before the fault).*/\1/p' "$work/f.err" | head -1)
    [ -n "$evicted" ] && [ -n "$spare" ] || fail "no eviction: $(grep -i 'straggler\|spare\|evict' "$work/f.err" | head)"
    [[ $before == *" $evicted "* ]] || fail "the evicted pid $evicted is not the slow rank's process (before: $before)"
    [[ $before == *" $spare "* && $spare != "$evicted" ]] || fail "the spare pid $spare was not a warm spare before: $before"
    kill -0 "$evicted" 2>/dev/null && fail "the evicted process $evicted still runs"
    /usr/bin/python3 - "$work/f.report.json" "$work/f.jsonl" <<'PY' || fail "report or step times: $(head -c 1500 "$work/f.report.json")"
import json, statistics, sys
r = json.load(open(sys.argv[1]))
ev = [f for f in r["faults"] if f["kind"] == "evicted"]
assert len(ev) == 1 and ev[0]["rank"] == 1 and ev[0]["diagnosis"] == "straggler", r["faults"]
assert len(ev[0]["scores"]) == 2 and all(s < 0.3 for s in ev[0]["scores"]), ev[0]
assert r["steps_lost"] == 0 and r["restarts"] == 1, r
at = ev[0]["iteration"]
recs = [json.loads(l) for l in open(sys.argv[2])]
assert any(x.get("event") == "fault" and x.get("kind") == "evicted" and len(x.get("scores", [])) == 2 for x in recs)
ms = {x["iteration"]: x["elapsed_ms_per_iteration"] for x in recs if "elapsed_ms_per_iteration" in x and "event" not in x}
slow = [ms[i] for i in range(3, at - 1)]
fast = [ms[i] for i in range(at + 2, max(ms) + 1)]
assert len(slow) >= 2 and len(fast) >= 3, (at, ms)
# 300 ms of sleep a step before, none after
assert statistics.median(fast) < statistics.median(slow) / 3, (at, slow, fast)
PY
    # every iteration logged once, the losses and the final checkpoint the fault-free run's
    same_losses clean f "the run with an eviction logged other numbers than the fault-free run"
    ckpt_same "$work/clean.ckpt/$(printf 'iter_%07d' $iters)" "$work/f.ckpt/$(printf 'iter_%07d' $iters)"
    ;;
no_spare)
    start g --straggler-evict-after 2 --inject "$slow" $quick
    finish g
    grep -q "straggler: rank 1 scored below --straggler-threshold 2 iterations in a row (scores [0-9. ]*): it would be evicted (--straggler-evict-after) but cannot: no free warm spare" \
        "$work/g.err" || fail "no 'cannot evict' line: $(grep -i straggler "$work/g.err" | head)"
    grep -q "evicted as a straggler" "$work/g.err" && fail "evicted without a spare"
    [ "$(grep -c '"grad_norm"' "$work/g.jsonl")" -eq $iters ] || fail "not every iteration logged"
    /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["restarts"] == 0 and r["steps_lost"] == 0, r' \
        "$work/g.report.json" || fail "a restart without a spare: $(head -c 600 "$work/g.report.json")"
    ;;
*) fail "unknown case $case_name" ;;
esac
