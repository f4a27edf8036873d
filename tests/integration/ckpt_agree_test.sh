#!/usr/bin/env bash
# ckpt_agree_test.sh - a multi-rank job loads one iteration for the whole job, never a mix of
# checkpoints; one case per meson test.
#   ckpt_agree_test.sh COHORT CASE
# Cases:
#   fallback     a tp 2 x pp 2 checkpoint (iterations 2 and 4) with one rank's shard of
#                iteration 4 truncated, a byte flipped, deleted, unreadable (a directory in its
#                place) or a FIFO that never answers: every rank falls back to iteration 2
#                together, and the run's losses and final checkpoint are bitwise a clean resume
#                from iteration 2 (the flipped byte with --rerun-mode disabled too)
#   no_older     the same corruption with no older checkpoint: the job stops with exit 1 within
#                seconds, naming the file, and nothing restarts
#   moe_args     a MoE checkpoint loaded with another --num-experts names the expert counts
#                (exit 2); --use-checkpoint-args takes --num-experts and the MoE flags from it
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir agree
. "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"

tiny_model --num-layers 4 --attention-dropout 0 --eval-iters 2
layout=(--nproc-per-node 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)

run() { # NAME ARGS...: output in $work/NAME.out, metrics in $work/NAME.jsonl; returns the exit status
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" "$@" >"$work/$name.out" 2>&1
}
base() { # the checkpoint: iterations 2 and 4 of a tp 2 x pp 2 job
    run base "${layout[@]}" --train-iters 4 --save-interval 2 --save "$work/base" ||
        fail "base run: exit $?: $(tail -5 "$work/base.out")"
    [ -d "$work/base/iter_0000002" ] && [ -d "$work/base/iter_0000004" ] || fail "base run saved $(ls "$work/base")"
}
# One rank's model shard of iteration 4 in a copy of the base checkpoint, damaged one way.
# Its file name goes to $work/NAME.file.
corrupt() { # NAME HOW
    local name=$1 how=$2
    cp -a "$work/base" "$work/$name"
    local f="$work/$name/iter_0000004/model-00002-of-00004.safetensors"
    [ -f "$f" ] || fail "no $f"
    echo "$f" >"$work/$name.file"
    case $how in
    truncated) truncate -s 4096 "$f" ;;
    flipped) /usr/bin/python3 -c "
import sys
f = open(sys.argv[1], 'r+b'); f.seek(-9, 2); b = f.read(1); f.seek(-9, 2); f.write(bytes([b[0] ^ 0x10]))" "$f" ;;
    deleted) rm -f "$f" ;;
    unreadable) rm -f "$f"; mkdir "$f" ;;   # (root reads a chmod 000 file: a directory cannot be read)
    fifo) rm -f "$f"; mkfifo "$f" ;;        # (a file that never answers: opening it must not block)
    *) fail "corrupt: $how?" ;;
    esac
}

case $case_name in
fallback)
    base
    # the reference: a clean resume from iteration 2
    cp -a "$work/base" "$work/clean"
    rm -rf "$work/clean/iter_0000004"; echo 2 >"$work/clean/latest_checkpointed_iteration.txt"
    run clean "${layout[@]}" --train-iters 6 --load "$work/clean" --save "$work/clean.out.ck" --save-interval 100 ||
        fail "clean resume: exit $?: $(tail -5 "$work/clean.out")"
    grep -q "successfully loaded checkpoint .* at iteration 2" "$work/clean.out" || fail "the clean resume did not load 2"
    ways=(truncated flipped deleted unreadable fifo flipped)
    pids=()
    for i in "${!ways[@]}"; do
        n=c$i
        corrupt "$n" "${ways[$i]}"
        extra=()
        [ "$i" = 5 ] && extra=(--rerun-mode disabled)
        run "$n" "${layout[@]}" --train-iters 6 --load "$work/$n" --save "$work/$n.out.ck" --save-interval 100 \
            "${extra[@]}" &
        pids+=($!)
    done
    for i in "${!ways[@]}"; do
        n=c$i
        wait "${pids[$i]}" || fail "${ways[$i]}: exit $?: $(tail -5 "$work/$n.out")"
        f=$(cat "$work/$n.file")
        # the fault happened: the damaged file was found by the rank that reads it ...
        grep -q "WARNING: checkpoint at iteration 4 is .* on rank [0-9]*: $f" "$work/$n.out" ||
            fail "${ways[$i]}: no warning naming $f: $(head -8 "$work/$n.out")"
        # ... and every rank loaded iteration 2 (one loading line per rank, none of iteration 4)
        grep -q "every rank falls back to the previous checkpoint" "$work/$n.out" || fail "${ways[$i]}: no fallback line"
        grep -q "successfully loaded checkpoint .* at iteration 2" "$work/$n.out" || fail "${ways[$i]}: iteration 2 not loaded"
        ! grep -q "successfully loaded checkpoint .* at iteration 4" "$work/$n.out" || fail "${ways[$i]}: a rank loaded 4"
        ! grep -qi "restart\|generation" "$work/$n.out" || fail "${ways[$i]}: the job restarted: $(grep -i restart "$work/$n.out")"
        [ "$(losses "$work/$n.jsonl")" = "$(losses "$work/clean.jsonl")" ] ||
            fail "${ways[$i]}: the losses differ from a clean resume from iteration 2:
$(losses "$work/$n.jsonl")
$(losses "$work/clean.jsonl")"
        "$cohort" ckpt diff "$work/clean.out.ck" "$work/$n.out.ck" >"$work/d.out" 2>&1 && grep -q "^bitwise equal" "$work/d.out" ||
            fail "${ways[$i]}: the final checkpoint is not a clean resume's: $(tail -3 "$work/d.out")"
        echo "ok: ${ways[$i]}${i/5/ (--rerun-mode disabled)}: every rank fell back to iteration 2, bitwise a clean resume"
    done
    ;;
no_older)
    base
    corrupt bad flipped
    rm -rf "$work/bad/iter_0000002"
    start=$SECONDS
    run bad "${layout[@]}" --train-iters 6 --load "$work/bad"
    rc=$?
    took=$((SECONDS - start))
    f=$(cat "$work/bad.file")
    [ $rc = 1 ] || fail "exit $rc, not 1: $(tail -8 "$work/bad.out")"
    [ $took -lt 60 ] || fail "the job took $took s to stop"
    grep -q "checkpoint at iteration 4 is corrupt on rank [0-9]*: $f" "$work/bad.out" || fail "the file is not named"
    grep -q "no older checkpoint to fall back to" "$work/bad.out" || fail "no 'no older checkpoint' line"
    ! grep -qi "in-process restart\|generation [0-9]" "$work/bad.out" || fail "the job restarted: $(grep -i restart "$work/bad.out")"
    ! grep -q "^ *\[.*iteration *[0-9]*/" "$work/bad.out" || fail "the job trained"
    echo "ok: no older checkpoint: exit 1 after $took s, naming $f"
    ;;
moe_args)
    moe=(--disable-bias-linear --moe-router-topk 2 --moe-layer-freq 2 --moe-ffn-hidden-size 48)
    run moe4 --train-iters 2 --num-experts 4 "${moe[@]}" --save "$work/moe4" || fail "moe run: $(tail -3 "$work/moe4.out")"
    run moe8 --train-iters 4 --num-experts 8 "${moe[@]}" --load "$work/moe4"
    rc=$?
    [ $rc = 2 ] || fail "another --num-experts: exit $rc, not 2: $(tail -3 "$work/moe8.out")"
    grep -q "checkpoint has 4 experts, --num-experts is 8" "$work/moe8.out" ||
        fail "the expert counts are not named: $(grep -i "checkpoint" "$work/moe8.out" | tail -3)"
    # --use-checkpoint-args: the expert count and the MoE flags come from the checkpoint
    run args --train-iters 4 --num-experts 8 --moe-router-topk 1 --disable-bias-linear --load "$work/moe4" \
        --use-checkpoint-args || fail "--use-checkpoint-args: exit $?: $(tail -3 "$work/args.out")"
    for l in "--num-experts 4 from the checkpoint" "--moe-router-topk 2 from the checkpoint" \
             "--moe-ffn-hidden-size 48 from the checkpoint" "--moe-layer-freq 2 from the checkpoint"; do
        grep -q -- "$l" "$work/args.out" || fail "--use-checkpoint-args: no '$l'"
    done
    grep -q "successfully loaded checkpoint .* at iteration 2" "$work/args.out" || fail "--use-checkpoint-args did not load"
    echo "ok: the expert counts named; --use-checkpoint-args restored the MoE flags"
    ;;
*) fail "unknown case $case_name" ;;
esac
