#!/usr/bin/env bash
# tb_test.sh - TensorBoard event files (--tensorboard-dir, observe/), one case per meson test.
#   tb_test.sh COHORT CASE
# Every event file is read by tests/integration/tb_read.py, which shares nothing with the
# writer (its own CRC32C, framing parser and schema) and compares each tag's steps and
# values with the metrics records of the same run.
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
reader=$COHORT_SOURCE_ROOT/tests/integration/tb_read.py
py=/usr/bin/python3
workdir tb
trap 'kill -9 $(jobs -p) 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT # (no clean stop to wait for)
"$py" -c "import google.protobuf" 2>/dev/null || { echo "skip: python3-protobuf is not installed (deploy/setup.sh test installs it)"; exit 77; }

tiny_model --eval-interval 5
optin=(--log-validation-ppl-to-tensorboard --log-timers-to-tensorboard --log-memory-to-tensorboard
       --log-world-size-to-tensorboard)

case $case_name in
single)
    # one process, every opt-in tag; then the interval and the off switches
    "$cohort" train "${tiny[@]}" --train-iters 12 --tensorboard-dir "$work/tb" --metrics-file "$work/m.jsonl" \
        "${optin[@]}" >"$work/out" 2>&1 || fail "$(tail -5 "$work/out")"
    "$py" "$reader" check "$work/tb" "$work/m.jsonl" timers memory world=1 ppl || fail "the event file differs"
    "$py" "$reader" dump "$work/tb" >"$work/dump" || fail "dump"
    grep -q "^lm loss validation ppl	10	" "$work/dump" || fail "no validation ppl at 10"
    "$cohort" train "${tiny[@]}" --train-iters 7 --tensorboard-dir "$work/tb2" --metrics-file "$work/m2.jsonl" \
        --tensorboard-log-interval 3 --no-log-loss-scale-to-tensorboard --tensorboard-queue-size 2 \
        >"$work/out2" 2>&1 || fail "$(tail -5 "$work/out2")"
    "$py" "$reader" check "$work/tb2" "$work/m2.jsonl" interval=3 no-loss-scale || fail "interval 3 differs"
    [ "$("$py" "$reader" dump "$work/tb2" | awk -F'\t' '$1 == "lm loss" {print $2}' | paste -sd,)" = 3,6 ] ||
        fail "lm loss not at 3 and 6 only: $("$py" "$reader" dump "$work/tb2" | grep '^lm loss	')"
    ;;
no_metrics_file)
    # events without --metrics-file (the metrics records are made for TensorBoard alone)
    "$cohort" train "${tiny[@]}" --train-iters 4 --tensorboard-dir "$work/tb" >"$work/out" 2>&1 ||
        fail "$(tail -5 "$work/out")"
    [ "$("$py" "$reader" dump "$work/tb" | awk -F'\t' '$1 == "lm loss"' | wc -l)" = 4 ] || fail "not 4 lm loss events"
    ;;
dp)
    # two ranks under the supervisor: only it writes (one file), the last rank's records;
    # a NaN replayed, checkpoints committed: cohort/faults, cohort/replays, cohort/checkpoint-*
    "$cohort" train "${tiny[@]}" --train-iters 10 --nproc-per-node 2 --tensorboard-dir "$work/tb" \
        --metrics-file "$work/m.jsonl" "${optin[@]}" --save "$work/ck" --save-interval 5 \
        --inject "nan@rank=1,step=4" >"$work/out" 2>&1 || fail "$(tail -5 "$work/out")"
    "$py" "$reader" check "$work/tb" "$work/m.jsonl" timers memory world=2 ppl || fail "the event file differs"
    tags=$("$py" "$reader" dump "$work/tb" | cut -f1 | sort -u)
    for t in cohort/faults cohort/replays cohort/fault-recovery-seconds cohort/checkpoint-commit-seconds; do
        grep -qx "$t" <<<"$tags" || fail "no $t: $tags"
    done
    ;;
dp_restart)
    # a rank killed: the in-process restart is in cohort/restarts with its recovery time
    "$cohort" train "${tiny[@]}" --train-iters 12 --nproc-per-node 2 --tensorboard-dir "$work/tb" \
        --metrics-file "$work/m.jsonl" --inprocess-restart --inject "kill@rank=0,step=5" \
        >"$work/out" 2>&1 || fail "$(tail -5 "$work/out")"
    "$py" "$reader" check "$work/tb" "$work/m.jsonl" || fail "the event file differs"
    "$py" "$reader" dump "$work/tb" >"$work/dump" || fail "dump"
    grep -q "^cohort/restarts	" "$work/dump" || fail "no cohort/restarts: $(grep event "$work/m.jsonl")"
    ;;
stragglers)
    # a slow rank among three: its straggler score is cohort/straggler-score/rank-2
    "$cohort" train "${tiny[@]}" --global-batch-size 12 --train-iters 14 --nproc-per-node 3 \
        --tensorboard-dir "$work/tb" --metrics-file "$work/m.jsonl" \
        --inject "slow@rank=2,step=2,ms=60,times=always" >"$work/out" 2>&1 || fail "$(tail -5 "$work/out")"
    "$py" "$reader" check "$work/tb" "$work/m.jsonl" || fail "the event file differs"
    "$py" "$reader" dump "$work/tb" >"$work/dump" || fail "dump"
    grep -q "^cohort/straggler-score/rank-2	" "$work/dump" ||
        fail "no straggler score: $(grep event "$work/m.jsonl")"
    ;;
killed)
    # kill -9 mid-run, single process and supervisor: the file holds whole records only
    "$cohort" train "${tiny[@]}" --train-iters 100000 --eval-interval 100000 --tensorboard-dir "$work/tb" \
        --tensorboard-queue-size 3 >"$work/out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        f=$(ls "$work"/tb/events.out.tfevents.* 2>/dev/null | head -1)
        [ -n "$f" ] && [ "$(stat -c %s "$f")" -gt 20000 ] && break
        sleep 0.1
    done
    kill -9 $pid; wait $pid 2>/dev/null
    "$py" "$reader" intact "$work/tb" 100 || fail "not readable after kill -9"
    set -m # the supervisor and its workers in their own process group: all killed at once
    "$cohort" train "${tiny[@]}" --train-iters 100000 --eval-interval 100000 --nproc-per-node 2 \
        --tensorboard-dir "$work/tb2" --tensorboard-queue-size 1 >"$work/out2" 2>&1 &
    pid=$!
    set +m
    for _ in $(seq 600); do
        f=$(ls "$work"/tb2/events.out.tfevents.* 2>/dev/null | head -1)
        [ -n "$f" ] && [ "$(stat -c %s "$f")" -gt 20000 ] && break
        sleep 0.1
    done
    kill -9 -- -$pid; wait $pid 2>/dev/null
    "$py" "$reader" intact "$work/tb2" 100 || fail "not readable after kill -9 of the job"
    ;;
flags)
    "$cohort" train --help >"$work/help" 2>&1
    for f in tensorboard-dir tensorboard-log-interval tensorboard-queue-size log-validation-ppl-to-tensorboard \
        log-timers-to-tensorboard log-memory-to-tensorboard log-world-size-to-tensorboard \
        log-loss-scale-to-tensorboard log-learning-rate-to-tensorboard; do
        grep -q -- "--$f" "$work/help" || fail "--help lacks --$f"
    done
    "$cohort" train "${tiny[@]}" --train-iters 2 --tensorboard-dir "$work/tb" --tensorboard-queue-size 0 \
        >"$work/out" 2>&1 && fail "--tensorboard-queue-size 0 accepted"
    grep -q "tensorboard-queue-size" "$work/out" || fail "no message naming the flag: $(cat "$work/out")"
    : >"$work/file"
    "$cohort" train "${tiny[@]}" --train-iters 2 --tensorboard-dir "$work/file/tb" >"$work/out" 2>&1 &&
        fail "an impossible --tensorboard-dir accepted"
    grep -q "TensorBoard directory" "$work/out" || fail "the error does not say what failed: $(cat "$work/out")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
