#!/usr/bin/env bash
# cp_test.sh - `cohort train` with context parallelism (ring attention over the context
# group, train/trainer_cp.c) against one rank, one case per meson test.
#   cp_test.sh COHORT CASE
# Every comparison: the losses and gradient norms of every iteration and the validation loss
# within fp32 reduction tolerance (compare_runs.sh: 1e-6 relative), and the final parameters
# and Adam moments (`cohort ckpt diff --json`) within 5e-5 absolute of one rank's (lr 1e-3:
# a gradient element near zero whose fp32 sum order differs moves its Adam step by up to lr;
# measured worst 2.9e-6, 1.1e-5 seen once with tp and SP); a repeated context-parallel run is
# bitwise the same (ckpt diff exact).
# Cases:
#   causal       learned positions, plain causal: cp 2, cp 4, cp 2 x dp 2 vs one rank; cp 2 twice
#   rope_docs    RoPE, GQA, SwiGLU, RMSNorm, --reset-attention-mask --reset-position-ids
#                --eod-mask-loss on a corpus of short documents (several per sequence, crossing
#                the chunks): the sequence split at cp 2 and 4, the per-document split (THD,
#                --cp-packed-sequences) at cp 2 and 4 (--cp-packed-capacity 2.5); at cp 4 with
#                the default capacity these documents are refused, naming the sample
#   sft          packed SFT conversations (--sft: always THD under cp) at cp 2 vs one rank
#   tp           cp 2 x tp 2 (the ring over each tensor rank's heads) with documents: THD, the
#                sequence split with sequence parallelism, THD with sequence parallelism
#   resume       a cp 2 checkpoint of iteration 3 resumed at cp 2 ends bitwise where the
#                uninterrupted run ends; resumed at cp 1 it ends within the tolerance above
#   killed       a rank of a cp 2 x dp 2 job killed: replaced in process from its data-parallel
#                peer with the same context rank, the fault-free run's checkpoint bitwise
#   sdc          a flipped weight bit on one rank of a cp 2 x dp 2 job: found by the replicas'
#                checksums, repaired from the data-parallel peer with the same context rank,
#                the clean run's final checkpoint bitwise; a NaN that reproduces is recomputed by
#                the other replica's context ranks and diagnosed as the data's (exit 3)
#   pp           cp 2 x pp 2 (each context rank's pipeline carries its chunks of the sequences,
#                the loss tokens of the whole sequences): plain causal, learned positions, and
#                with documents in the per-document split (THD) with RoPE, vs one rank; twice
#                bitwise the same
#   pp_killed    a rank of a cp 2 x pp 2 x dp 2 job killed: replaced in process from its
#                data-parallel peer with the same context and pipeline ranks, the fault-free
#                run's checkpoint bitwise
#   bad_configs  a sequence not divisible by 2cp, attention dropout, --cp-packed-sequences
#                without documents, --cp-comm-type other than p2p: refused before any work
#                (--device cuda is not: tests/cudasim/train_nccl_test.sh cp2, cp2_thd)
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir cp

# the ring attention has no dropout (refused with cp); hidden dropout (Megatron's default 0.1)
# stays on: it is keyed by each token's row in the whole micro batch, so a context-parallel
# run draws one rank's masks
tiny_model --attention-dropout 0 --eval-iters 2
. "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"

run() { train_ok "$1" --train-iters 5 --save "$work/$1.ck" "${@:2}"; } # NAME ARGS...: checkpoint in $work/NAME.ck
params_match() { # REF RUN...: final parameters and moments within 5e-5 absolute of REF's
    local ref=$1; shift
    for n in "$@"; do
        "$cohort" ckpt diff "$work/$ref.ck" "$work/$n.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$n: diff"
        /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
assert rows and all(r['status'] in ('bitwise equal', 'differs') for r in rows), rows[:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 5e-5]
assert not bad, bad[:3]
print('$n: %d tensors, worst abs %.1e' % (len(rows), max(r['max_abs'] for r in rows)))
" || fail "$n: parameters differ from $ref's: $(head -c 400 "$work/d.json")"
    done
}
corpus() { # short documents (1 to 34 bytes and the EOD, ByteLevelTokenizer), so that a sequence of 64
    # holds several and they cross the chunk boundaries: the flags that train on them
    /usr/bin/python3 -c 'import json, random
r = random.Random(5)
for i in range(3000):
    n = r.choice([1, 2, 3, 5, 8, 13, 21, 34])
    print(json.dumps({"text": "".join(r.choice("abcdefgh ") for _ in range(n))}))' >"$work/short.jsonl"
    "$cohort" data preprocess --input "$work/short.jsonl" --output-prefix "$work/short" --tokenizer-type ByteLevelTokenizer \
        --append-eod --quiet || fail "preprocess"
    tiny=(--tokenizer-type ByteLevelTokenizer --data-path "$work/short_text_document" --split 90,10,0 --num-layers 2
          --hidden-size 32 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3
          --attention-dropout 0 --data-cache-path "$work/cache" --log-interval 1
          --eval-interval 1000 --eval-iters 2 --threads 1 --reset-attention-mask --reset-position-ids --eod-mask-loss)
}
bitwise() { ckpt_same "$work/$1.ck" "$work/$2.ck"; } # A B: two runs' checkpoints bitwise the same

case $case_name in
causal)
    run one --nproc-per-node 1
    run cp2 --nproc-per-node 2 --context-parallel-size 2
    run cp2b --nproc-per-node 2 --context-parallel-size 2
    run cp4 --nproc-per-node 4 --context-parallel-size 4
    run cp2dp2 --nproc-per-node 4 --context-parallel-size 2
    compare 1 one cp2 cp4 cp2dp2
    params_match one cp2 cp4 cp2dp2
    bitwise cp2 cp2b
    grep -q "data-parallel size 2" "$work/cp2dp2.out" || fail "cp2 x dp2: $(head -3 "$work/cp2dp2.out")"
    ;;
rope_docs)
    corpus
    d=(--position-embedding-type rope --group-query-attention --num-query-groups 2 --swiglu --normalization RMSNorm)
    run one "${d[@]}" --nproc-per-node 1
    run cp2 "${d[@]}" --nproc-per-node 2 --context-parallel-size 2
    run cp4 "${d[@]}" --nproc-per-node 4 --context-parallel-size 4
    run thd2 "${d[@]}" --nproc-per-node 2 --context-parallel-size 2 --cp-packed-sequences
    run thd2b "${d[@]}" --nproc-per-node 2 --context-parallel-size 2 --cp-packed-sequences
    run thd4 "${d[@]}" --nproc-per-node 4 --context-parallel-size 4 --cp-packed-sequences --cp-packed-capacity 2.5
    compare 1 one cp2 cp4 thd2 thd4
    params_match one cp2 cp4 thd2 thd4
    bitwise thd2 thd2b
    grep -q "context parallelism 4: load-balanced sequence split (chunks r and 7-r of 8), 16 tokens per sequence" \
        "$work/cp4.out" || fail "cp4: $(grep -i context "$work/cp4.out")"
    grep -q "context parallelism 4: per-document split (THD: documents padded to multiples of 8, at most 160 tokens" \
        "$work/thd4.out" || fail "thd4: $(grep -i context "$work/thd4.out")"
    # at cp 4 these short documents padded to 8 need more than the default 1.5 x 64 tokens:
    # refused, naming the sample
    "$cohort" train "${tiny[@]}" "${d[@]}" --train-iters 5 --nproc-per-node 4 --context-parallel-size 4 \
        --cp-packed-sequences >"$work/over.out" 2>&1 && fail "THD beyond its capacity was not refused"
    grep -q "sample [0-9]*: its documents padded to multiples of 2 \* context-parallel-size = 8 take [0-9]* tokens, more than the packed capacity 96" \
        "$work/over.out" || fail "no capacity refusal: $(grep -i fail "$work/over.out" | head -3)"
    ;;
sft)
    printf '{"messages": [{"role": "user", "content": "hi %s"}, {"role": "assistant", "content": "hello there, %s"}]}\n' \
        $(for i in $(seq 60); do echo "$i $(printf 'x%.0s' $(seq $((i % 7))))"; done) >"$work/chat.jsonl"
    tiny=(--tokenizer-type ByteLevelTokenizer --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 64
          --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --attention-dropout 0
          --log-interval 1 --eval-interval 1000 --eval-iters 1 --threads 1 --data-cache-path "$work/cache"
          --split 90,10,0 --sft --data-path "$work/chat.jsonl")
    run one --nproc-per-node 1
    run cp2 --nproc-per-node 2 --context-parallel-size 2
    compare 1 one cp2
    params_match one cp2
    grep -q "context parallelism 2: per-document split (THD" "$work/cp2.out" || fail "SFT not THD: $(grep -i context "$work/cp2.out")"
    ;;
tp)
    corpus
    # (the byte-level vocabulary, 257 ids, pads to 512 at tp 1 and 2 alike: the same model)
    d=(--num-attention-heads 8 --hidden-size 64 --make-vocab-size-divisible-by 256)
    run one "${d[@]}" --nproc-per-node 1
    run cp2tp2 "${d[@]}" --nproc-per-node 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --cp-packed-sequences
    run cp2tp2sp "${d[@]}" --nproc-per-node 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel
    run thdtp2sp "${d[@]}" --nproc-per-node 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
        --cp-packed-sequences
    compare 1 one cp2tp2 cp2tp2sp thdtp2sp
    params_match one cp2tp2 cp2tp2sp thdtp2sp
    ;;
resume)
    r=(--nproc-per-node 2 --context-parallel-size 2 --train-iters 6)
    "$cohort" train "${tiny[@]}" "${r[@]}" --save "$work/full.ck" >"$work/full.out" 2>&1 || fail "full: $(tail -3 "$work/full.out")"
    "$cohort" train "${tiny[@]}" "${r[@]}" --exit-interval 3 --save "$work/half.ck" >"$work/half.out" 2>&1 ||
        fail "half: $(tail -3 "$work/half.out")"
    "$cohort" train "${tiny[@]}" "${r[@]}" --load "$work/half.ck" --save "$work/half.ck" >"$work/res.out" 2>&1 ||
        fail "resumed: $(tail -3 "$work/res.out")"
    grep -q "successfully loaded checkpoint from $work/half.ck .* at iteration 3" "$work/res.out" ||
        fail "no load: $(grep -i checkpoint "$work/res.out" | head -3)"
    bitwise full half
    "$cohort" ckpt inspect "$work/half.ck" >"$work/inspect" || fail "inspect"
    grep -q "world 2 = tensor 1 x pipeline 1 x context 2 x data 1" "$work/inspect" || fail "layout: $(grep world "$work/inspect")"
    "$cohort" train "${tiny[@]}" --nproc-per-node 1 --train-iters 6 --load "$work/half.ck" --ckpt-step 3 \
        --save "$work/one.ck" >"$work/one.out" 2>&1 || fail "resumed at cp 1: $(tail -3 "$work/one.out")"
    params_match full one
    ;;
killed)
    k=(--nproc-per-node 4 --context-parallel-size 2 --train-iters 8)
    run clean "${k[@]}"
    run f "${k[@]}" --inject "kill@rank=3,step=4"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    # world rank 3 is dp 1, cp 1 (tp-cp-dp-pp): its data-parallel peer with the same context rank is rank 1
    grep -q "state of iteration [0-9]* taken from rank 1's memory" "$work/f.out" ||
        fail "rank 3 did not take rank 1's state: $(grep 'replaced in process' "$work/f.out")"
    bitwise clean f
    ;;
sdc)
    k=(--nproc-per-node 4 --context-parallel-size 2 --train-iters 8)
    run clean "${k[@]}"
    run f "${k[@]}" --inject "bitflip-param@rank=2,step=4,bit=22"
    # world rank 2 is dp 1, cp 0: its replica at the same context rank is rank 0
    grep -Eq "iteration 4: repair .*rank 2: parameters (differ|changed).*repaired from rank 0" "$work/f.out" ||
        fail "not repaired from rank 0: $(grep supervisor "$work/f.out")"
    bitwise clean f
    # a NaN that reproduces on rank 3 (dp 1, cp 1): the other replica's context ranks recompute
    # its micro batches (each its chunks) and find it too: the data's fault, exit 3
    "$cohort" train "${tiny[@]}" "${k[@]}" --inject "nan@rank=3,step=4,times=always" >"$work/p.out" 2>&1
    rc=$?
    [ $rc -eq 3 ] || fail "peer check: exit $rc, want 3: $(tail -5 "$work/p.out")"
    grep -Eq "rank 3: nan_[a-z]* \(nan\) reproduced on rank [01] too: the data or the model is at fault" \
        "$work/p.out" || fail "no peer check: $(grep supervisor "$work/p.out" | head)"
    ;;
pp)
    pp=(--nproc-per-node 4 --context-parallel-size 2 --pipeline-model-parallel-size 2)
    run one --nproc-per-node 1
    run cp2pp2 "${pp[@]}"
    run cp2pp2b "${pp[@]}"
    compare 1 one cp2pp2
    params_match one cp2pp2
    bitwise cp2pp2 cp2pp2b
    "$cohort" ckpt inspect "$work/cp2pp2.ck" >"$work/inspect" || fail "inspect"
    grep -q "world 4 = tensor 1 x pipeline 2 x context 2 x data 1" "$work/inspect" || fail "layout: $(grep world "$work/inspect")"
    corpus
    d=(--position-embedding-type rope --swiglu --normalization RMSNorm)
    run done "${d[@]}" --nproc-per-node 1
    run thdpp "${d[@]}" "${pp[@]}" --cp-packed-sequences
    run thdppb "${d[@]}" "${pp[@]}" --cp-packed-sequences
    compare 1 done thdpp
    params_match done thdpp
    bitwise thdpp thdppb
    grep -q "context parallelism 2: per-document split (THD" "$work/thdpp.out" || fail "not THD: $(grep -i context "$work/thdpp.out")"
    ;;
pp_killed)
    k=(--nproc-per-node 8 --context-parallel-size 2 --pipeline-model-parallel-size 2 --train-iters 8)
    run clean "${k[@]}"
    run f "${k[@]}" --inject "kill@rank=7,step=4"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    # world rank 7 is cp 1, dp 1, pp 1 (tp-cp-dp-pp): its data-parallel peer with the same
    # context and pipeline ranks is rank 5 (cp 1, dp 0, pp 1)
    grep -q "state of iteration [0-9]* taken from rank 5's memory" "$work/f.out" ||
        fail "rank 7 did not take rank 5's state: $(grep 'replaced in process' "$work/f.out")"
    bitwise clean f
    ;;
bad_configs)
    refused() { # what expected-message flags...
        local what=$1 msg=$2; shift 2
        "$cohort" train "${tiny[@]}" --train-iters 1 "$@" >"$work/r.out" 2>&1; local rc=$?
        [ $rc -eq 2 ] || fail "$what: exit $rc, not 2: $(tail -3 "$work/r.out")"
        grep -q -- "$msg" "$work/r.out" || fail "$what: no '$msg': $(tail -3 "$work/r.out")"
    }
    refused "seq % 2cp" "not divisible by 2 \* --context-parallel-size = 8" --nproc-per-node 4 --context-parallel-size 4 --seq-length 36
    refused "attention dropout" "ring attention has no dropout" --nproc-per-node 2 --context-parallel-size 2 --attention-dropout 0.1
    refused "thd without documents" "cp-packed-sequences splits documents" --nproc-per-node 2 --context-parallel-size 2 \
        --cp-packed-sequences
    refused "world" "not a multiple of" --nproc-per-node 3 --context-parallel-size 2
    refused "capacity" "--cp-packed-capacity 2.5 is more than --context-parallel-size 2" --nproc-per-node 2 \
        --context-parallel-size 2 --reset-attention-mask --cp-packed-sequences --cp-packed-capacity 2.5
    refused "a2a" "--cp-comm-type a2a is not supported yet" --nproc-per-node 2 --context-parallel-size 2 --cp-comm-type a2a
    refused "timeline" "--timeline-dir with --context-parallel-size 2 is not supported yet" --nproc-per-node 2 \
        --context-parallel-size 2 --timeline-dir "$work/tl"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok $case_name"
