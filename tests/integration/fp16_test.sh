#!/usr/bin/env bash
# fp16_test.sh - --fp16 with Megatron's loss scaling (docs/fp16.md), one case per meson test.
#   fp16_test.sh COHORT CASE
# Cases (the tiny model, hidden and attention dropout on):
#   train   --fp16 against fp32 on the same batches: every logged loss within 0.1% (relative)
#           with a scale that never overflows; bitwise the same on a second run; a dynamic
#           scale started far too high (2^27, hysteresis 1) overflows at the first
#           iterations: each is skipped (the log counts them, the scale halves each time), and
#           the weights and moments after them are the untouched initial ones (a run that
#           skips the same iterations with --iterations-to-skip); a finite static scale's
#           injected overflow (COHORT_TEST_FP16_OVERFLOW) skips as --iterations-to-skip does
#   resume  a dynamic scale that overflows, backs off and grows (window 2) saved mid-run and
#           resumed: the checkpoint bitwise the uninterrupted run's, the losses, norms and
#           loss scales logged the same
#   dopt    dp 2 with --use-distributed-optimizer against the replicated optimizer under a
#           dynamic scale that overflows and backs off, and an overflow injected on rank 1
#           alone: the same steps skipped, bitwise the same checkpoint (each shard unscaled by
#           the same factor)
#   pp      pp 2 against one rank under a scale that overflows at the first iterations: the
#           same iterations skipped at the same scales, the losses within 1e-4 (relative)
#   tp_dp   tp 2 x dp 2 under the supervisor: an overflow on one rank only (rank 3's
#           gradients at iteration 3) skips that step on every rank: the checkpoint bitwise
#           that of a run skipping iteration 3 with --iterations-to-skip
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir fp16

tiny_model --attention-dropout 0.1 --hidden-dropout 0.1
# scales NAME: the loss scale of every logged iteration
scales() { grep -o '"loss_scale":[^,]*' "$work/$1.jsonl" | cut -d: -f2 | paste -sd' '; }
# skipped NAME: the skipped-iteration count of every logged iteration
skipped() { grep -o '"skipped_iterations":[0-9]*' "$work/$1.jsonl" | cut -d: -f2 | paste -sd' '; }

case $case_name in
train)
    train_ok f32 --train-iters 6
    train_ok f16 --train-iters 6 --fp16 --loss-scale 1024 --save "$work/f16.ck"
    grep -q "loss scale: 1024.0 |" "$work/f16.out" || fail "no static loss scale in the log: $(grep -m1 iteration "$work/f16.out")"
    [ "$(skipped f16)" = "0 0 0 0 0 0" ] || fail "a step was skipped at loss scale 1024: $(skipped f16)"
    /usr/bin/python3 - "$work/f32.jsonl" "$work/f16.jsonl" <<'PY' || fail "fp16 losses off fp32's"
import json, sys
a = [json.loads(l)["lm_loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["lm_loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) >= 6, (a, b)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print("fp16 against fp32: largest relative loss difference %.2e" % worst)
assert worst < 1e-3, (a, b)
assert a != b, "fp16 products changed nothing"
PY
    train_ok f16b --train-iters 6 --fp16 --loss-scale 1024 --save "$work/f16b.ck"
    same_losses f16 f16b "--fp16 is not reproducible"
    ckpt_same "$work/f16.ck" "$work/f16b.ck" "--fp16 is not reproducible"
    # far too high a scale: the first iterations overflow, each skipped, the scale halving
    train_ok over --train-iters 8 --fp16 --initial-loss-scale 134217728 --hysteresis 1
    echo "skipped: $(skipped over); loss scales: $(scales over)"
    set -- $(skipped over)
    k=0
    for n in "$@"; do [ "$n" = $((k + 1)) ] && k=$n; done # the leading run of skipped iterations
    [ "$k" -ge 2 ] && [ "$k" -lt 8 ] || fail "want a first few iterations skipped: $(skipped over)"
    [ "${!#}" = "$k" ] || fail "skips after the scale settled: $(skipped over)"
    grep -q "iteration  *$k/.*loss scale: $((134217728 >> k)).0 | .*number of skipped iterations: *$k |" "$work/over.out" ||
        fail "the log line of iteration $k: $(grep "iteration  *$k/" "$work/over.out")"
    # the weights after the skipped iterations: untouched
    train_ok overk --train-iters "$k" --fp16 --initial-loss-scale 134217728 --hysteresis 1 --save "$work/overk.ck"
    train_ok skipk --train-iters "$k" --fp16 --iterations-to-skip $(seq 1 "$k") --save "$work/skipk.ck"
    ckpt_same "$work/skipk.ck" "$work/overk.ck" "overflowed iterations changed the weights"
    # an injected overflow at a static scale: the step skipped as --iterations-to-skip does
    COHORT_TEST_FP16_OVERFLOW=0:3 train_ok inj --train-iters 5 --fp16 --loss-scale 1024 --save "$work/inj.ck"
    train_ok skip3 --train-iters 5 --fp16 --loss-scale 1024 --iterations-to-skip 3 --save "$work/skip3.ck"
    [ "$(skipped inj)" = "0 0 1 1 1" ] || fail "the injected overflow: skipped $(skipped inj)"
    ckpt_same "$work/skip3.ck" "$work/inj.ck" "the overflowed step changed the weights"
    ;;
resume)
    f16=(--fp16 --initial-loss-scale 33554432 --loss-scale-window 2)
    train_ok full --train-iters 10 "${f16[@]}" --save "$work/full"
    train_ok half --train-iters 10 "${f16[@]}" --exit-interval 5 --save "$work/s"
    train_ok rest --train-iters 10 "${f16[@]}" --load "$work/s" --save "$work/s"
    echo "loss scales: $(scales full); skipped: $(skipped full)"
    [ "$(skipped full | cut -d' ' -f10)" -gt 0 ] || fail "no overflow in the run: $(skipped full)"
    [ "$(scales full | tr ' ' '\n' | sort -u | wc -l)" -ge 3 ] || fail "the scale hardly moved: $(scales full)"
    ckpt_same "$work/full" "$work/s" "the resumed run differs"
    [ "$(scales full | cut -d' ' -f6-)" = "$(scales rest)" ] ||
        fail "loss scales after the resume: $(scales rest), want $(scales full | cut -d' ' -f6-)"
    [ "$(losses "$work/full.jsonl" | tr ' ' '\n' | tail -n 15)" = "$(losses "$work/rest.jsonl" | tr ' ' '\n')" ] ||
        fail "the resumed run logged other losses"
    ;;
dopt)
    par=(--nproc-per-node 2 --fp16 --initial-loss-scale 33554432 --loss-scale-window 2 --train-iters 8)
    COHORT_TEST_FP16_OVERFLOW=1:7 train_ok rep "${par[@]}" --save "$work/rep.ck"
    COHORT_TEST_FP16_OVERFLOW=1:7 train_ok dist "${par[@]}" --use-distributed-optimizer --save "$work/dist.ck"
    echo "skipped: $(skipped dist); loss scales: $(scales dist)"
    [ "$(skipped dist)" = "$(skipped rep)" ] || fail "other steps skipped: $(skipped dist) / $(skipped rep)"
    [ "$(scales dist | tr ' ' '\n' | sort -u | wc -l)" -ge 3 ] || fail "the scale hardly moved: $(scales dist)"
    ckpt_same "$work/rep.ck" "$work/dist.ck" "the distributed optimizer under --fp16"
    ;;
pp)
    f16=(--fp16 --initial-loss-scale 134217728 --hysteresis 1 --train-iters 8)
    train_ok one "${f16[@]}"
    train_ok pp2 "${f16[@]}" --nproc-per-node 2 --pipeline-model-parallel-size 2
    echo "skipped: $(skipped pp2); loss scales: $(scales pp2)"
    [ "$(skipped pp2)" = "$(skipped one)" ] && [ "$(scales pp2)" = "$(scales one)" ] ||
        fail "pp 2 skipped other steps: $(skipped pp2) / $(skipped one) at $(scales pp2) / $(scales one)"
    [ "$(skipped one | cut -d' ' -f1)" = 1 ] || fail "no overflow at the first iteration: $(skipped one)"
    /usr/bin/python3 - "$work/one.jsonl" "$work/pp2.jsonl" <<'PY' || fail "pp 2's fp16 losses off one rank's"
import json, sys
a, b = ([json.loads(l)["lm_loss"] for l in open(f) if '"grad_norm"' in l] for f in sys.argv[1:3])
pairs = [(x, y) for x, y in zip(a, b) if x != "nan" or y != "nan"]
assert len(a) == len(b) == 8 and len(pairs) >= 3, (a, b)
assert all(abs(x - y) <= 1e-4 * abs(x) for x, y in pairs), (a, b)
PY
    ;;
tp_dp)
    par=(--nproc-per-node 4 --tensor-model-parallel-size 2 --fp16 --loss-scale 1024 --train-iters 5)
    COHORT_TEST_FP16_OVERFLOW=3:3 train_ok inj "${par[@]}" --save "$work/inj.ck"
    train_ok skip3 "${par[@]}" --iterations-to-skip 3 --save "$work/skip3.ck"
    [ "$(skipped inj)" = "0 0 1 1 1" ] || fail "the injected overflow: skipped $(skipped inj)"
    grep -q "iteration  *3/.*number of skipped iterations: *1 |" "$work/inj.out" ||
        fail "iteration 3 not counted as skipped: $(grep "iteration  *3/" "$work/inj.out")"
    ckpt_same "$work/skip3.ck" "$work/inj.ck" "an overflow on one rank was not skipped on every rank"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: fp16 $case_name"
