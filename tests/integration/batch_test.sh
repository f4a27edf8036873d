#!/usr/bin/env bash
# batch_test.sh - the iteration's batch: many micro batches per rank under the rerun state
# machine, Megatron's batch-size ramp-up, and Megatron's example launch lines; one case per
# meson test.
#   batch_test.sh COHORT CASE
# Cases:
#   many_micro_batches  256 micro batches per rank (micro batch 1), validated: a NaN injected in
#                       micro batch 200 is caught and replayed and the run ends bitwise the
#                       fault-free run's, in one process and in a dp 2 job (the supervisor's
#                       validator, one report a round); the peak RSS of 256 micro batches is
#                       within 8 MiB of 64's (nothing per micro batch in the state machine)
#   rampup              --rampup-batch-size 2 2 12 to a batch of 8 over --train-samples 48: the
#                       iterations (Megatron's update_train_iters), each log line's global batch
#                       size and consumed samples, and the learning rate (counted in samples,
#                       cosine with --lr-warmup-samples) are Megatron's formulas' (a restatement
#                       in Python); the refusals of Megatron's calculator's checks
#   rampup_resume       a checkpoint before each step that changes the batch (Megatron's); a run
#                       saved mid-ramp (--exit-interval 3: the next batch is 6) and resumed
#                       ends bitwise the uninterrupted run, with the same log lines
#   rampup_parallel     the ramp under pp 2 x dp 2 and interleaved pp 2 (4 ranks, 2): the same
#                       batches, samples and numbers as one rank (fp32 reduction tolerance); a
#                       NaN in the last micro batch of a ramp step is replayed, bitwise the
#                       clean run
#   per_token_loss      --calculate-per-token-loss on short documents with --eod-mask-loss (micro
#                       batches of unequal loss tokens): the iteration's loss is the sum over its
#                       tokens / their count, so 4 micro batches of 2, 1 of 8, dp 2 x 2 of 2 and
#                       tp 2 (SP) x cp 2 and pp 2 end with the same parameters and moments (within 5e-5, fp32
#                       sums in another order), while without the flag (each micro batch's mean
#                       averaged) 4 micro batches of 2 end farther than that from 1 of 8; a NaN
#                       reproduced in dp 2 recomputed by the other replica (no hang) and
#                       diagnosed
#   decoupled_lr        --decoupled-lr/--decoupled-min-lr: the log line's decoupled learning rate
#                       of every iteration is Megatron's schedule (warm-up, cosine decay) from
#                       them, its learning rate the one from --lr/--min-lr; at 0 the input
#                       embedding and the output layer end bitwise the same whatever --lr the
#                       others train at (at their initial values), and differ from a job
#                       without the flags; equal to --lr/--min-lr it is bitwise the
#                       job without the flags; with the distributed optimizer at dp 2 and
#                       tp 2 x dp 2 bitwise the replicated optimizer's run
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir batch

tiny_model --micro-batch-size 1 --eval-iters 1

# peak_rss NAME ARGS...: trains like train_ok; prints the run's peak resident KiB (its processes')
peak_rss() {
    local name=$1; shift
    /usr/bin/python3 - "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" "$@" >"$work/$name.rss" \
        2>"$work/$name.out" <<'PY' || fail "$name: $(tail -5 "$work/$name.out")"
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=sys.stderr).returncode  # the run's output to NAME.out
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)
PY
}

case $case_name in
many_micro_batches)
    m=(--global-batch-size 256 --train-iters 3)
    peak_rss clean "${m[@]}" --save "$work/c"
    peak_rss f "${m[@]}" --save "$work/f" --inject "nan@rank=0,step=2,microbatch=200"
    grep -q "nan on rank 0 at step 2, micro batch 200" "$work/f.out" || fail "no fault injected: $(head -5 "$work/f.out")"
    grep -q "iteration 2: rerun: rank 0: nan_loss (nan); replaying the step in place" "$work/f.out" ||
        fail "no replay: $(grep -i 'iteration 2' "$work/f.out")"
    grep -q "iteration 2, nan_loss, transient_error" "$work/f.out" || fail "no diagnosis: $(tail -3 "$work/f.out")"
    ckpt_same "$work/c" "$work/f" "256 micro batches: the replayed run differs from the fault-free one"
    same_losses clean f "256 micro batches: the logged numbers differ"
    peak_rss small --global-batch-size 64 --train-iters 3
    small=$(cat "$work/small.rss") big=$(cat "$work/clean.rss")
    [[ $small =~ ^[0-9]+$ && $big =~ ^[0-9]+$ && $small -gt 0 ]] || fail "peak RSS not measured: '$small' '$big'"
    [ $((big - small)) -le 8192 ] || fail "peak RSS grows with the micro batches: 64: $small KiB, 256: $big KiB"
    echo "ok: peak RSS 64 micro batches $small KiB, 256 $big KiB"
    # the supervisor's validator: dp 2, 256 micro batches per rank, the NaN on rank 1
    d=(--nproc-per-node 2 --global-batch-size 512 --train-iters 3)
    train_ok dclean "${d[@]}" --save "$work/dc"
    train_ok df "${d[@]}" --save "$work/df" --inject "nan@rank=1,step=2,microbatch=200"
    grep -q "rank 1: nan_loss (nan); replaying the step in place" "$work/df.out" ||
        fail "dp 2: no replay: $(grep -i 'iteration 2\|supervisor' "$work/df.out" | head)"
    ckpt_same "$work/dc" "$work/df" "dp 2, 256 micro batches per rank: the replayed run differs"
    same_losses dclean df "dp 2: the logged numbers differ"
    ;;
per_token_loss)
    # short documents (1 to 34 bytes and the EOD, as cp_test.sh's) whose EODs take a share of
    # each micro batch's loss tokens that varies from one micro batch to the next
    /usr/bin/python3 -c 'import json, random
r = random.Random(5)
for i in range(3000):
    n = r.choice([1, 2, 3, 5, 8, 13, 21, 34])
    print(json.dumps({"text": "".join(r.choice("abcdefgh ") for _ in range(n))}))' >"$work/short.jsonl"
    "$cohort" data preprocess --input "$work/short.jsonl" --output-prefix "$work/short" --tokenizer-type ByteLevelTokenizer \
        --append-eod --quiet || fail "preprocess"
    tiny=(--tokenizer-type ByteLevelTokenizer --data-path "$work/short_text_document" --split 90,10,0 --num-layers 2
          --hidden-size 32 --num-attention-heads 4 --seq-length 64 --global-batch-size 8 --lr 1e-3
          --attention-dropout 0 --hidden-dropout 0 --eod-mask-loss --data-cache-path "$work/cache" --log-interval 1
          --eval-interval 1000 --eval-iters 1 --threads 1 --make-vocab-size-divisible-by 256)
    # (the padded vocabulary 512 at tp 1 and 2: the same model)
    p=(--calculate-per-token-loss --train-iters 4)
    train_ok m4 "${p[@]}" --micro-batch-size 2 --save "$work/m4"
    train_ok m1 "${p[@]}" --micro-batch-size 8 --save "$work/m1"
    train_ok d2 "${p[@]}" --micro-batch-size 2 --nproc-per-node 2 --save "$work/d2"
    train_ok tc "${p[@]}" --micro-batch-size 2 --nproc-per-node 4 --tensor-model-parallel-size 2 --sequence-parallel \
        --context-parallel-size 2 --save "$work/tc"
    # (pp 2: every stage counts the step's tokens, as Megatron's last stage does)
    train_ok pp "${p[@]}" --micro-batch-size 2 --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp"
    train_ok a4 --train-iters 4 --micro-batch-size 2 --save "$work/a4"
    train_ok a1 --train-iters 4 --micro-batch-size 8 --save "$work/a1"
    worst() { # A B: the largest absolute difference of any parameter or moment
        "$COHORT_CPU_EXE" ckpt diff --json "$work/$1" "$work/$2" >"$work/d.json"
        /usr/bin/python3 -c "import json; print(max(r.get('max_abs', 0) for r in json.load(open('$work/d.json'))['tensors']))"
    }
    for r in m1 d2 tc pp; do
        w=$(worst m4 $r)
        /usr/bin/python3 -c "import sys; sys.exit(not $w <= 5e-5)" || fail "per-token loss: $r differs from m4 by $w"
        echo "ok: per-token loss: $r within $w of 4 micro batches of 2"
    done
    w=$(worst a4 a1)
    /usr/bin/python3 -c "import sys; sys.exit(not $w > 5e-5)" ||
        fail "without per-token loss 4 micro batches of 2 end within $w of 1 of 8: the test does not tell"
    echo "ok: without the flag the micro batches' means differ by $w"
    # a NaN that reproduces on rank 1 in a dp 2 job: rank 0 recomputes rank 1's share of the
    # step with the step's token weight (no collective of its own: the other replica waits)
    nan_reproduced nan_loss 1 0 "${p[@]}" --micro-batch-size 2 --nproc-per-node 2 \
        --inject "nan@rank=1,step=4,times=always"
    ;;
decoupled_lr)
    s=(--untie-embeddings-and-output-weights --micro-batch-size 2 --train-iters 6 --lr-decay-style cosine
       --lr-warmup-iters 2 --lr-decay-iters 5 --lr 1e-3 --min-lr 1e-4)
    train_ok d "${s[@]}" --decoupled-lr 5e-3 --decoupled-min-lr 2e-4 --save "$work/d"
    /usr/bin/python3 - "$work/d.out" <<'PY' || fail "the learning rates are not Megatron's schedules"
import math, re, sys
def lr(step, mx, mn, warm=2, decay=5):  # Megatron's OptimizerParamScheduler.get_lr, cosine, init 0
    if step <= warm: return mx * step / warm
    if step > decay: return mn
    return mn + 0.5 * (math.cos(math.pi * (step - warm) / (decay - warm)) + 1) * (mx - mn)
rows = re.findall(r"iteration +(\d+)/.*? learning rate: (\S+) \| decoupled learning rate: (\S+) \|", open(sys.argv[1]).read())
assert [int(r[0]) for r in rows] == list(range(1, 7)), rows
for it, a, b in rows:  # (the line's rate is the next step's: after `it` steps)
    it = int(it)
    for got, want in ((float(a), lr(it, 1e-3, 1e-4)), (float(b), lr(it, 5e-3, 2e-4))):
        assert abs(got - want) <= 1e-6 * want + 1e-12, (it, got, want)
print("ok: both schedules over", len(rows), "iterations")
PY
    # at rate 0 (AdamW's step and its weight decay both scale with the rate) the two tensors
    # keep their initial values whatever --lr the others train at
    train_ok z "${s[@]}" --decoupled-lr 0 --decoupled-min-lr 0 --save "$work/z"
    train_ok z3 "${s[@]}" --lr 3e-3 --decoupled-lr 0 --decoupled-min-lr 0 --save "$work/z3"
    train_ok plain "${s[@]}" --save "$work/plain"
    for pair in "z z3 equal" "z plain differs"; do
        set -- $pair
        "$COHORT_CPU_EXE" ckpt diff --json --model-only "$work/$1" "$work/$2" >"$work/zd.json"
        /usr/bin/python3 - "$work/zd.json" "$3" <<'PY' || fail "--decoupled-lr 0, $1 vs $2: $(head -c 600 "$work/zd.json")"
import json, sys
rows = {r["name"]: r["status"] for r in json.load(open(sys.argv[1]))["tensors"]}
io = ("embedding.word_embeddings.weight", "output_layer.weight")
want = "bitwise equal" if sys.argv[2] == "equal" else "differs"
assert all(rows[n] == want for n in io), [(n, rows[n]) for n in io]
rest = [n for n in rows if n not in io and n.endswith("weight") and "norm" not in n]
assert rest and all(rows[n] == "differs" for n in rest), rows
print(f"ok: the input embedding and the output layer {want}; the {len(rest)} other matrices differ")
PY
    done
    train_ok same "${s[@]}" --decoupled-lr 1e-3 --decoupled-min-lr 1e-4 --save "$work/same"
    ckpt_same "$work/same" "$work/plain" "--decoupled-lr equal to --lr"
    # the distributed optimizer: each shard's pieces of the embedding and the output layer
    # (their vocabulary slices under tp 2) at the decoupled rate: bitwise the replicated run
    dl=(--decoupled-lr 5e-3 --decoupled-min-lr 2e-4)
    for l in "2" "4 --tensor-model-parallel-size 2"; do
        set -- $l
        train_ok r$1 "${s[@]}" "${dl[@]}" --nproc-per-node "$@" --save "$work/r$1"
        train_ok o$1 "${s[@]}" "${dl[@]}" --nproc-per-node "$@" --use-distributed-optimizer --save "$work/o$1"
        ckpt_same "$work/r$1" "$work/o$1" "--decoupled-lr with the distributed optimizer, $* ranks"
    done
    train_refused "--decoupled-min-lr needs --decoupled-lr" --decoupled-min-lr 1e-4
    ;;
rampup)
    r=(--global-batch-size 8 --rampup-batch-size 2 2 12 --train-samples 48 --lr-warmup-samples 4
       --lr-decay-style cosine --min-lr 1e-5)
    train_ok r "${r[@]}"
    /usr/bin/python3 - "$work/r.jsonl" "$work/r.out" <<'PY' || fail "the ramp is not Megatron's: $(grep iteration "$work/r.out" | head -3)"
import json, math, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"grad_norm"' in l]
lines = [l for l in open(sys.argv[2]) if "consumed samples" in l]
# Megatron's RampupBatchsizeNumMicroBatchesCalculator and update_train_iters
gbs, start, inc, ramp, train = 8, 2, 2, 12, 48
per = ramp / ((gbs - start) // inc)
batch = lambda c: gbs if c > ramp else start + int(c / per) * inc
iters, c = 0, 0
while c <= ramp and c <= train:
    c += batch(c); iters += 1
iters += (train - c) // gbs
# OptimizerParamScheduler.get_lr over samples: warm-up 4, cosine decay over --train-samples
def lr(n, mx=1e-3, mn=1e-5, warm=4, decay=train):
    if n <= warm: return mx * n / warm
    if n > decay: return mn
    return mn + 0.5 * (math.cos(math.pi * (n - warm) / (decay - warm)) + 1) * (mx - mn)
assert len(rows) == iters == 8 and len(lines) == iters, (len(rows), iters, len(lines))
c = 0
for i, (row, line) in enumerate(zip(rows, lines), 1):
    b = batch(c); c += b
    assert row["iteration"] == i and row["global_batch_size"] == b and row["consumed_samples"] == c, (i, b, c, row)
    m = re.search(r"consumed samples: +(\d+) .*global batch size: +(\d+) ", line)
    assert m and int(m.group(1)) == c and int(m.group(2)) == b, line
    assert abs(row["learning_rate"] - lr(c)) <= 1e-9 * lr(c), (i, row["learning_rate"], lr(c))
print("ok: batches", [batch(x) for x in (0, 2, 4, 8, 14, 22)], "iterations", iters)
PY
    # Megatron's checks of the calculator and of sample-based training
    train_refused "needs --train-samples" --global-batch-size 8 --rampup-batch-size 2 2 12
    train_refused "a multiple of INCREMENT 4" --global-batch-size 8 --rampup-batch-size 2 4 12 --train-samples 48 \
       
    train_refused "multiples of --micro-batch-size 1 x data-parallel size 2" --nproc-per-node 2 \
        --global-batch-size 8 --rampup-batch-size 1 1 12 --train-samples 48
    train_refused "--lr-decay-samples" "${r[@]}" --lr-decay-iters 4
    # every batch of the ramp must fit the pipeline's schedule (here the first, 1 micro batch)
    "$cohort" train "${tiny[@]}" --num-layers 4 --global-batch-size 8 --rampup-batch-size 1 1 12 --train-samples 48 \
        --nproc-per-node 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
        --microbatch-group-size-per-virtual-pipeline-stage 2 >"$work/out" 2>"$work/err"
    [ $? -eq 2 ] && grep -q "the ramp's global batch 1: --microbatch-group-size-per-virtual-pipeline-stage 2 must lie" \
        "$work/err" || fail "a ramp batch the interleaved schedule cannot run: $(cat "$work/err")"
    ;;
rampup_resume)
    r=(--global-batch-size 8 --rampup-batch-size 2 2 12 --train-samples 48 --hidden-dropout 0.1)
    train_ok full "${r[@]}" --save "$work/full"
    # Megatron saves before each step whose micro batches differ: the batches are 2 2 4 6 8 8 8 8
    [ "$(cd "$work/full" && echo iter_*)" = "iter_0000002 iter_0000003 iter_0000004 iter_0000008" ] ||
        fail "not saved where the batch changes: $(ls "$work/full")"
    train_ok half "${r[@]}" --exit-interval 3 --save "$work/s"
    grep -q '"iteration":3,.*"consumed_samples":8,' "$work/half.jsonl" || fail "not stopped mid-ramp: $(tail -1 "$work/half.jsonl")"
    train_ok rest "${r[@]}" --load "$work/s" --save "$work/s"
    grep -q '"iteration":4,.*"consumed_samples":14,.*"global_batch_size":6,' "$work/rest.jsonl" ||
        fail "the resumed run's first batch is not the ramp's: $(head -1 "$work/rest.jsonl")"
    ckpt_same "$work/full" "$work/s" "the run resumed mid-ramp differs"
    [ "$(losses "$work/full.jsonl" | tr ' ' '\n' | tail -15)" = "$(losses "$work/rest.jsonl" | tr ' ' '\n' | tail -15)" ] ||
        fail "the resumed run logged other numbers"
    ;;
rampup_parallel)
    . "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"
    tiny_model --micro-batch-size 1 --num-layers 4 --attention-dropout 0 --eval-iters 1
    r=(--global-batch-size 8 --rampup-batch-size 2 2 12 --train-samples 48)
    train_ok one "${r[@]}"
    train_ok pp2dp2 "${r[@]}" --nproc-per-node 4 --pipeline-model-parallel-size 2 --save "$work/c"
    # a NaN on the last stage (rank 3) in iteration 4 (batch 6: 3 micro batches per pipeline):
    # the replay of that iteration's schedule ends bitwise the clean run
    train_ok nan "${r[@]}" --nproc-per-node 4 --pipeline-model-parallel-size 2 --save "$work/f" \
        --inject "nan@rank=3,step=4,microbatch=2"
    # (every rank of the replica, ranks 1 and 3, reports the pipeline's losses: either is named)
    grep -Eq "iteration 4: rerun: rank [13]: nan_loss \(nan\); replaying the step in place" "$work/nan.out" ||
        fail "no replay under the ramp: $(grep -i 'iteration 4\|inject' "$work/nan.out" | head -4)"
    ckpt_same "$work/c" "$work/f" "pp 2 x dp 2: the replayed run under the ramp differs"
    train_ok vpp "${r[@]}" --nproc-per-node 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
    compare 1 one pp2dp2 vpp
    batches() { grep '"grad_norm"' "$work/$1.jsonl" | grep -o '"consumed_samples":[0-9]*\|"global_batch_size":[0-9]*' | paste -sd' '; }
    for n in pp2dp2 vpp; do
        [ "$(batches $n)" = "$(batches one)" ] || fail "$n: other batches or samples than one rank's: $(batches $n)"
    done
    grep -q '"global_batch_size":6,' "$work/pp2dp2.jsonl" || fail "no ramp: $(head -3 "$work/pp2dp2.jsonl")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
