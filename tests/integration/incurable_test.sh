#!/usr/bin/env bash
# incurable_test.sh - under the supervisor, a rank's own failure that no restart cures (a
# --load that does not fit the flags, a full disk or a refused write during --save) stops a
# 2-rank job at once with the status one process would exit with and the first failing
# rank's message, with no in-process restart; one case per meson test.
#   incurable_test.sh COHORT CASE
cohort=$1; case_name=$2
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir incurable

tiny_model
S=$work/ckpt
tracker() { cat "$S/latest_checkpointed_iteration.txt" 2>/dev/null; }
# job NAME [flags...]: a 2-rank job (bounded: a restart loop would take minutes); its output
# (supervisor and workers) in $work/NAME.out, its status in $rc, its wall time in $secs
job() {
    local name=$1; shift
    local t0=$SECONDS
    timeout 120 "$cohort" train "${tiny[@]}" --nproc-per-node 2 "$@" >"$work/$name.out" 2>&1
    rc=$?; secs=$((SECONDS - t0))
}
# no_restart NAME: the job stopped without an in-process restart (no generation aborted or
# begun, the run report counts none)
no_restart() {
    ! grep -E "in-process restart|generation|restart barrier" "$work/$1.out" ||
        fail "$1: restarted: $(grep -E 'in-process restart|generation|restart barrier' "$work/$1.out" | head -3)"
    grep -q "cohort run report: .* 0 restart(s)" "$work/$1.out" || fail "$1: $(grep 'run report' "$work/$1.out")"
}

"$cohort" train "${tiny[@]}" --train-iters 2 --save "$S" >"$work/first.out" 2>&1 || fail "first run: $(tail -3 "$work/first.out")"
[ "$(tracker)" = 2 ] || fail "no checkpoint of iteration 2"

case $case_name in
load_mismatch)
    # the checkpoint's 2 layers against --num-layers 3: every rank's setup refuses it; the job
    # exits 2 as one process would, naming the mismatch once
    job m --num-layers 3 --load "$S" --train-iters 4
    [ $rc -eq 2 ] || fail "exit $rc, want 2: $(tail -5 "$work/m.out")"
    [ $secs -le 60 ] || fail "took $secs s to stop"
    [ "$(grep -c "checkpoint has 2 layers, --num-layers is 3" "$work/m.out")" -eq 1 ] ||
        fail "the mismatch is not named once: $(grep -i layers "$work/m.out")"
    grep -q "^cohort: rank [01]: checkpoint: .*checkpoint has 2 layers.* (stopping: a restart cannot cure this)$" \
        "$work/m.out" || fail "no stop message: $(tail -5 "$work/m.out")"
    no_restart m
    ;;
disk_full)
    # rank 1's first checkpoint write fails with ENOSPC (28) while saving iteration 4: the job
    # exits 1 at once with rank 1's message; the checkpoint of iteration 2 is untouched
    COHORT_CKPT_FAIL_WRITE=1:28@1 job f --load "$S" --save "$S" --train-iters 4
    [ $rc -eq 1 ] || fail "exit $rc, want 1: $(tail -5 "$work/f.out")"
    [ $secs -le 60 ] || fail "took $secs s to stop"
    grep -q "^cohort: rank 1: checkpoint: .*No space left on device.* (stopping: a restart cannot cure this)$" \
        "$work/f.out" || fail "no stop message for rank 1: $(tail -8 "$work/f.out")"
    [ "$(grep -c "(stopping: a restart cannot cure this)" "$work/f.out")" -eq 1 ] || fail "stop said twice"
    no_restart f
    [ "$(tracker)" = 2 ] || fail "tracker moved: $(tracker)"
    [ ! -e "$S/iter_0000004" ] || fail "a failed save left iter_4"
    "$cohort" ckpt verify "$S" >"$work/v.out" 2>&1 || fail "the checkpoint of iteration 2 is damaged: $(cat "$work/v.out")"
    # both ranks' disks full: one message, the first failing rank's
    COHORT_CKPT_FAIL_WRITE=1:28 job b --load "$S" --save "$S" --train-iters 4
    [ $rc -eq 1 ] || fail "both ranks: exit $rc, want 1: $(tail -5 "$work/b.out")"
    [ "$(grep -c "No space left on device" "$work/b.out")" -ge 1 ] || fail "both ranks: the disk is not named"
    [ "$(grep -c "(stopping: a restart cannot cure this)" "$work/b.out")" -eq 1 ] ||
        fail "both ranks: not one stop message: $(grep stopping "$work/b.out")"
    no_restart b
    "$cohort" ckpt verify "$S" >/dev/null 2>&1 || fail "both ranks: the checkpoint of iteration 2 is damaged"
    ;;
denied)
    # a write refused with EACCES (13) on rank 0 is no more curable than a full disk: exit 1
    COHORT_CKPT_FAIL_WRITE=1:13@0 job d --load "$S" --save "$S" --train-iters 4
    [ $rc -eq 1 ] || fail "exit $rc, want 1: $(tail -5 "$work/d.out")"
    grep -q "^cohort: rank 0: checkpoint: .*Permission denied.* (stopping: a restart cannot cure this)$" \
        "$work/d.out" || fail "no stop message for rank 0: $(tail -8 "$work/d.out")"
    no_restart d
    [ "$(tracker)" = 2 ] || fail "tracker moved: $(tracker)"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
