#!/usr/bin/env bash
# goodput_test.sh - the supervisor's goodput accounting and checkpoint housekeeping on 2-rank
# CPU jobs (docs/observability.md "Goodput", docs/checkpoints.md "Retention").
#   goodput_test.sh COHORT CASE
#   faults     a rank killed, a NaN replayed and a rank hung: detection (the hang's soft
#              timeout; a local kill is seen at once), restart and replay seconds are nonzero
#              in the run report, on the Prometheus endpoint and in TensorBoard, ETTR < 1
#   clean      no fault: nothing lost to faults, the accounting closes over the wall time,
#              and ETTR is 1 but for the startup, the saves and the time after the last step
#   retention  --most-recent-k 2 --keep-every 8 after every commit: the newest two and every
#              8th are what is left
#   auto_interval  --save-interval auto: the first save at iteration 10 measures the save cost,
#              then every Young's interval (sqrt(2 x cost x --expected-mtbf) over the step time,
#              each choice in the log and the metrics with its inputs, every rank saving the
#              iterations the supervisor ordered); without --expected-mtbf a killed rank shortens
#              the estimated MTBF; one process decides alone; the refusals
#   disk_full  the save directory's free space (COHORT_TEST_FREE_BYTES) below the first
#              checkpoint's size x --save-space-margin: saves stop with a log line, a metrics
#              event, the Prometheus gauge and the report's entry, and training goes on
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir goodput
py=/usr/bin/python3

tiny_model --nproc-per-node 2 --train-iters 30 --inprocess-soft-timeout 2 --inprocess-hard-timeout 4
free_port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# run NAME [flags...]: a job to its end; output in $work/NAME.{out,err,jsonl,report.json}, status in $rc
run() {
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" --run-report "$work/$name.report.json" \
        "$@" >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
    [ $rc -eq 0 ] || fail "$name exited $rc: $(grep -v '^cohort rank' "$work/$name.err" | tail -5)"
}
# scrape PORT METRIC MIN: until the endpoint's METRIC (a full sample name) is above MIN (30 s);
# the scrape in $work/m.txt
scrape() {
    for _ in $(seq 300); do
        curl -s --max-time 5 "http://127.0.0.1:$1/metrics" >"$work/m.txt" 2>/dev/null
        awk -v m="$2" -v min="$3" '$1 == m && $2 + 0 > min + 0 { ok = 1 } END { exit !ok }' "$work/m.txt" && return 0
        sleep 0.1
    done
    fail "$2 never above $3: $(grep "$2" "$work/m.txt")"
}
# report NAME PYTHON: asserts over the run report's JSON (r) and its goodput (g, lost: l)
report() {
    $py - "$work/$1.report.json" "$2" <<'PY' || fail "$1: the run report: $(cat "$work/$1.report.json" | head -60)"
import json, sys
r = json.load(open(sys.argv[1])); g = r["goodput"]; l = g["lost_seconds"]
exec(sys.argv[2])
PY
}

case $case_name in
faults)
    port=$(free_port)
    "$cohort" train "${tiny[@]}" --train-iters 1000000 --metrics-file "$work/f.jsonl" \
        --run-report "$work/f.report.json" --metrics-port "$port" --tensorboard-dir "$work/tb" \
        --inject "kill@rank=1,step=5" --inject "nan@rank=0,step=9,microbatch=1" --inject "hang@rank=1,step=13" \
        >"$work/f.out" 2>"$work/f.err" &
    job=$!
    # both faults happened and were recovered from: seconds lost to each cause on the endpoint
    scrape "$port" 'cohort_goodput_lost_seconds{cause="restart"}' 0
    scrape "$port" 'cohort_goodput_lost_seconds{cause="detection"}' 0
    scrape "$port" 'cohort_goodput_lost_seconds{cause="replay"}' 0
    scrape "$port" cohort_goodput_ettr 0
    $py - "$work/m.txt" <<'PY' || fail "ETTR on the endpoint: $(grep goodput "$work/m.txt")"
v = [float(l.split()[1]) for l in open(__import__("sys").argv[1]) if l.startswith("cohort_goodput_ettr ")]
assert 0 < v[0] < 1, v
PY
    kill -TERM $job; wait $job; rc=$?
    [ $rc -eq 0 ] || fail "the job exited $rc after SIGTERM: $(grep -v '^cohort rank' "$work/f.err" | tail -5)"
    grep -q "iteration 9: rerun" "$work/f.err" || fail "no replay of iteration 9"
    report f 'assert r["restarts"] == 2 and r["replays"] >= 1, r
assert l["detection"] > 0 and l["restart"] > 0 and l["replay"] > 0, l
assert 0 < g["ettr"] < 1, g
assert abs(g["productive_seconds"] + sum(l.values()) + g["other_seconds"] - g["wall_seconds"]) < 0.05, g'
    grep -q "goodput: ETTR 0\.[0-9]* (.*); lost: .*detection [0-9.]* s, restart" "$work/f.err" ||
        fail "no goodput line in the log: $(grep goodput "$work/f.err")"
    # TensorBoard: the supervisor's goodput series
    $py "$src/tests/integration/tb_read.py" dump "$work/tb" >"$work/tb.txt" || fail "tensorboard: $(tail -3 "$work/tb.txt")"
    grep -q "^cohort/goodput/ettr" "$work/tb.txt" || fail "no cohort/goodput/ettr tag: $(cut -c1-60 "$work/tb.txt" | sort -u | head)"
    grep -q "^cohort/goodput/lost-seconds/restart" "$work/tb.txt" || fail "no cohort/goodput/lost-seconds/restart tag"
    ;;
clean)
    run c --save "$work/c.ckpt" --save-interval 5
    report c 'assert r["restarts"] == 0 and not r["faults"], r
for c in ("detection", "restart", "state_transfer", "replay", "recompute"):
    assert l[c] == 0, (c, l)
assert l["checkpoint_save"] > 0 and l["startup"] > 0, l
assert abs(g["productive_seconds"] + sum(l.values()) + g["other_seconds"] - g["wall_seconds"]) < 0.05, g
# 1 but for the startup, the saves and the final save and shutdown; stragglers are noise here
rest = 1 - (l["startup"] + l["checkpoint_save"] + g["other_seconds"]) / g["wall_seconds"]
assert g["ettr"] <= rest + 1e-9 and g["ettr"] > rest - 0.15, (g, rest)'
    grep -q '"event":"checkpoint_save","iteration":5,"blocking_seconds"' "$work/c.jsonl" || fail "no save time recorded"
    grep -q '"event":"goodput"' "$work/c.jsonl" || fail "no goodput record in the metrics stream"
    ;;
retention)
    run r --train-iters 20 --save "$work/r.ckpt" --save-interval 2 --most-recent-k 2 --keep-every 8
    left=$(cd "$work/r.ckpt" && ls -d iter_* | paste -sd' ')
    [ "$left" = "iter_0000008 iter_0000016 iter_0000018 iter_0000020" ] || fail "retention left: $left"
    grep -q "retention: removed the checkpoint of iteration 14" "$work/r.err" || fail "removals not logged"
    ;;
auto_interval)
    run a --train-iters 150 --save "$work/a.ckpt" --save-interval auto --expected-mtbf 0.5
    saved=$(cd "$work/a.ckpt" && ls -d iter_* | sed 's/iter_0*//' | paste -sd' ')
    $py - "$work/a.jsonl" "$saved" <<'PY' || fail "auto interval: $(grep -h 'save-interval auto' "$work/a.out" "$work/a.err")"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
saved = [int(x) for x in sys.argv[2].split()]
ch = [r for r in recs if r.get("event") == "save_interval"]
orders = [r for r in recs if r.get("event") == "save_ordered"]
assert ch[0]["interval_iterations"] == 10 and ch[0]["saves_measured"] == 0, ch[0]
assert orders[0]["iteration"] == 10, orders
for r in ch[1:]:  # Young's interval over the step time, from the inputs it names
    assert r["mtbf_seconds"] == 0.5 and r["saves_measured"] >= 1, r
    young = math.sqrt(2 * r["save_seconds"] * r["mtbf_seconds"])
    assert abs(r["young_seconds"] - young) < 2e-3, r
    want = min(150, max(1, round(young / r["step_seconds"])))
    assert abs(r["interval_iterations"] - want) <= 1, (r, want)
for o in orders[1:]:
    assert o["since_last"] >= o["interval_iterations"], o
# every rank saved what was ordered (and the final iteration), nothing else
assert saved == sorted({o["iteration"] for o in orders} | {150}), (saved, orders)
assert len(orders) >= 2, orders
PY
    grep -q "save-interval auto: a checkpoint every [0-9]* iterations (Young: sqrt(2 x 0.[0-9]* s to save x 0.5 s between failures)" \
        "$work/a.err" || fail "no log line: $(grep -h 'save-interval' "$work/a.err" | head -3)"
    # estimated: the kill is a fault observed, the MTBF estimate falls
    run b --train-iters 60 --save "$work/b.ckpt" --save-interval auto --inject "kill@rank=1,step=25"
    grep -q "was killed by signal 9" "$work/b.err" || fail "no kill"
    $py - "$work/b.jsonl" <<'PY' || fail "the estimate after a fault: $(grep save_interval "$work/b.jsonl")"
import json, sys
ch = [json.loads(l) for l in open(sys.argv[1]) if '"save_interval"' in l]
before = [r for r in ch if r["faults"] == 0 and r["saves_measured"] > 0]
after = [r for r in ch if r["faults"] >= 1]
assert before and after, ch
assert after[0]["mtbf_seconds"] < before[-1]["mtbf_seconds"] / 10, (before[-1], after[0])
assert after[0]["interval_iterations"] <= before[-1]["interval_iterations"], (before[-1], after[0])
PY
    # one process decides alone
    "$cohort" train "${tiny[@]}" --nproc-per-node 1 --train-iters 30 --save "$work/s.ckpt" --save-interval auto \
        --expected-mtbf 1000000 >"$work/s.out" 2>&1 || fail "one process: $(tail -3 "$work/s.out")"
    [ "$(cd "$work/s.ckpt" && ls -d iter_* | paste -sd' ')" = "iter_0000010 iter_0000030" ] ||
        fail "one process saved $(ls "$work/s.ckpt")"
    grep -q "cohort: --save-interval auto: a checkpoint every 30 iterations (Young" "$work/s.out" ||
        fail "one process: $(grep 'save-interval' "$work/s.out")"
    train_refused "--save-interval auto needs --save" --save-interval auto
    train_refused "--save-interval auto with several processes needs --rerun-mode validate_results" \
        --nproc-per-node 2 --save "$work/r.ckpt" --save-interval auto --rerun-mode disabled
    ;;
disk_full)
    port=$(free_port)
    COHORT_TEST_FREE_BYTES=1000 "$cohort" train "${tiny[@]}" --train-iters 1000000 --save "$work/d.ckpt" \
        --save-interval 3 --metrics-file "$work/d.jsonl" --run-report "$work/d.report.json" \
        --metrics-port "$port" >"$work/d.out" 2>"$work/d.err" &
    job=$!
    scrape "$port" cohort_checkpoint_saves_stopped 0
    scrape "$port" cohort_iteration 12 # training goes on past three more save points
    kill -TERM $job; wait $job; rc=$?
    [ $rc -eq 0 ] || fail "the job exited $rc after SIGTERM: $(grep -v '^cohort rank' "$work/d.err" | tail -5)"
    left=$(cd "$work/d.ckpt" && ls -d iter_* | paste -sd' ')
    [ "$left" = "iter_0000003" ] || fail "saved after saves stopped: $left"
    grep -q "checkpoint: saving stopped after iteration 3: the save directory .* has 0.0 MiB free, below the last checkpoint's" \
        "$work/d.err" || fail "no log line: $(grep -i 'sav' "$work/d.err" | head -5)"
    grep -q '"event":"saves_stopped","iteration":3' "$work/d.jsonl" || fail "no metrics event"
    grep -q "not saved: the supervisor stopped saving" "$work/d.out" || fail "the ranks did not say they skip: $(grep -i sav "$work/d.out" | head -3)"
    report d 'assert "below the last checkpoint" in r["checkpoint_saves_stopped"], r'
    ;;
*) fail "unknown case $case_name" ;;
esac
echo ok
