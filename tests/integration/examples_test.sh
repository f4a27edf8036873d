#!/usr/bin/env bash
# examples_test.sh - Megatron-LM's example launch lines (examples/gpt3, examples/mixtral,
# examples/llama), copied as they are with the sizes shrunk, --mock-data, the GPT-2 or the
# Null tokenizer; one case per meson test. Every flag is known to cohort; what is still
# refused is stated exactly, one line per problem, in the case's `remaining` list: when a
# feature lands, its line goes and the case trains the launch line to its end.
#   examples_test.sh COHORT CASE
# Cases:
#   gpt3_175b     train_gpt3_175b_distributed.sh (the version with --rampup-batch-size, --fp16
#                 as it is: dynamic loss scaling from 2^32): Megatron's own checks refuse its
#                 --rampup-batch-size with --train-iters and --lr-decay-iters (it expects
#                 sample-based training); with --train-samples/--lr-decay-samples instead the
#                 line trains (tp 2 x pp 2, the ramp in the log); and with tp 2 x pp 2 x dp 2,
#                 sequence parallelism, the distributed optimizer, both overlaps,
#                 recomputation and bf16 (8 ranks)
#   mixtral_8x7b  train_mixtral_8x7b_distributed.sh (pp 2, ep 2, the distributed optimizer
#                 and both overlaps; NullTokenizer for Llama2Tokenizer, a split the mock
#                 data fills): trains to its end
#   deepseek_v3   Megatron's DeepSeek-V3 recipe without multi-latent attention (ep 2, sigmoid
#                 group-limited routing with the expert bias, top-k scaling, a shared expert,
#                 MTP): trains to its end with the distributed optimizer and both overlaps,
#                 and without the overlaps
#   llama3_8b     train_llama3_8b_h100_fp8.sh (bf16, mock data): past parsing; the refusals
#                 remain (--attention-backend fused for good: cohort has no cuDNN attention);
#                 without the refused flags the line trains to its end, its checkpoint marked
#                 --apply-layernorm-1p
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir examples

# where the CPU has no bf16 matrix instructions --bf16 is refused for that reason alone
BF16=--bf16
grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo || BF16=

# launch NAME NPROC ARGS...: cohort train with the launch line's arguments; exit status in $rc
launch() {
    local name=$1 n=$2; shift 2
    "$cohort" train --nproc-per-node "$n" --threads 1 --data-cache-path "$work/cache" "$@" >"$work/$name.out" \
        2>"$work/$name.err"
    rc=$?
}

# expect_outcome NAME: with `remaining` empty the run trained (exit 0); otherwise it was refused
# (exit 2) with exactly these problems, every flag known (no "unknown flag")
expect_outcome() {
    local name=$1 got want
    ! grep -q "unknown flag" "$work/$name.err" || fail "$name: $(cat "$work/$name.err")"
    if [ ${#remaining[@]} -eq 0 ]; then
        [ $rc -eq 0 ] || fail "$name: exit $rc: $(tail -5 "$work/$name.err")"
        return
    fi
    [ $rc -eq 2 ] || fail "$name: exit $rc, want 2 (refused): $(tail -5 "$work/$name.err")"
    got=$(grep '^  ' "$work/$name.err" | sed 's/^  //' | sort)
    want=$(printf '%s\n' "${remaining[@]}" | sort)
    [ "$got" = "$want" ] || fail "$name: other refusals than the ones stated:
$(diff <(echo "$want") <(echo "$got"))"
    echo "ok: $name refused with exactly ${#remaining[@]} remaining problem(s)"
}

case $case_name in
gpt3_175b)
    GPT_MODEL_ARGS=(
        --num-layers 4
        --hidden-size 32
        --num-attention-heads 4
        --seq-length 32
        --max-position-embeddings 32
        --attention-backend auto # Can use (flash/fused/unfused/local)
    )
    TRAINING_ARGS=(
        --micro-batch-size 1
        --global-batch-size 8
        --rampup-batch-size 2 2 12
        --train-iters 6
        --weight-decay 0.1
        --adam-beta1 0.9
        --adam-beta2 0.95
        --init-method-std 0.006
        --clip-grad 1.0
        --fp16
        --lr 6.0e-5
        --lr-decay-style cosine
        --min-lr 6.0e-6
        --lr-warmup-fraction .001
        --lr-decay-iters 4
    )
    MODEL_PARALLEL_ARGS=(
        --tensor-model-parallel-size 2
        --pipeline-model-parallel-size 2
    )
    DATA_ARGS=(
        --mock-data
        --split 949,50,1
    )
    EVAL_AND_LOGGING_ARGS=(
        --log-interval 1
        --save-interval 3
        --eval-interval 3
        --save "$work/ck"
        --load "$work/ck"
        --eval-iters 1
        --tensorboard-dir "$work/tb"
    )
    launch gpt3 4 "${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}" \
        "${EVAL_AND_LOGGING_ARGS[@]}"
    # Megatron's validate_args refuses this line too ("expected no batch-size rampup for
    # iteration-based training", "expected sample-based learning rate decay")
    remaining=(
        "--rampup-batch-size needs --train-samples: Megatron expects no batch-size ramp-up for iteration-based training (--train-iters)"
        "--rampup-batch-size counts the learning rate's schedule in samples: give --lr-decay-samples and --lr-warmup-samples (or --lr-warmup-fraction), not --lr-decay-iters/--lr-warmup-iters"
    )
    expect_outcome gpt3
    # ... sample-based, as Megatron wants it: the whole line trains, the batch ramping up
    TRAINING_ARGS=("${TRAINING_ARGS[@]/--train-iters/--train-samples}")
    TRAINING_ARGS=("${TRAINING_ARGS[@]/--lr-decay-iters/--lr-decay-samples}")
    for i in "${!TRAINING_ARGS[@]}"; do [ "${TRAINING_ARGS[i]}" = --train-samples ] && TRAINING_ARGS[i + 1]=40; done
    launch gpt3s 4 "${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}" \
        "${EVAL_AND_LOGGING_ARGS[@]}"
    remaining=()
    expect_outcome gpt3s
    grep -q "consumed samples: *14 .*global batch size: *6 " "$work/gpt3s.out" ||
        fail "no ramp in the log: $(grep 'iteration' "$work/gpt3s.out" | head -4)"
    [ -d "$work/ck" ] || fail "no checkpoint saved"
    # --fp16: the loss scale in the log line, Megatron's 2^32 at the first iteration (an
    # overflow there only spends the hysteresis)
    grep -m1 "iteration  *1/" "$work/gpt3s.out" | grep -q "loss scale: 4294967296.0 |" ||
        fail "no dynamic loss scale in the log: $(grep -m1 'iteration  *1/' "$work/gpt3s.out")"
    # ... and the line as Megatron's GPT-3 runs are launched at scale: tensor 2 x pipeline 2 x
    # data 2 with sequence parallelism, the distributed optimizer, both overlaps, activation
    # recomputation and bf16 (for --fp16): trains to its end, both overlaps on every rank
    TRAINING_ARGS=("${TRAINING_ARGS[@]/--fp16/$BF16}")
    MODEL_PARALLEL_ARGS+=(--sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
                          --recompute-activations)
    EVAL_AND_LOGGING_ARGS=("${EVAL_AND_LOGGING_ARGS[@]/#$work\/ck/$work/ck3}")
    launch gpt3mp 8 "${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}" \
        "${EVAL_AND_LOGGING_ARGS[@]}"
    remaining=()
    expect_outcome gpt3mp
    grep -q "iteration  *7/  *7 .*consumed samples:  *38 " "$work/gpt3mp.out" ||
        fail "gpt3mp: not to its end: $(grep iteration "$work/gpt3mp.out" | tail -1)"
    for what in "overlapped gradient reduction" "overlapped parameter all-gather"; do
        [ "$(grep -c "cohort rank [0-7]: $what" "$work/gpt3mp.err")" = 8 ] ||
            fail "gpt3mp: not every rank says $what: $(grep -h overlapped "$work/gpt3mp.err" | head -3)"
    done
    [ -d "$work/ck3" ] || fail "gpt3mp: no checkpoint saved"
    ;;
mixtral_8x7b)
    MODEL_ARGS=(
        --use-mcore-models
        --disable-bias-linear
        --seq-length 32
        --max-position-embeddings 64
        --num-layers 4
        --hidden-size 32
        --ffn-hidden-size 64
        --num-attention-heads 4
        --init-method-std 0.01
        --attention-dropout 0.0
        --hidden-dropout 0.0
        --normalization RMSNorm
        --position-embedding-type rope
        --swiglu
        --untie-embeddings-and-output-weights
        --group-query-attention
        --num-query-groups 2
        --no-masked-softmax-fusion
        --no-position-embedding
        --rotary-base 1000000
    )
    MOE_ARGS=(
        --num-experts 4
        --moe-router-topk 2
        --moe-router-load-balancing-type aux_loss
        --moe-aux-loss-coeff 1e-2
        --moe-grouped-gemm
        --moe-token-dispatcher-type alltoall
        --overlap-param-gather
        --overlap-grad-reduce
    )
    DATA_ARGS=(
        --tokenizer-type NullTokenizer --vocab-size 500
        --mock-data
        --split 99,1,0 # (the line's 99990,8,2 leaves the mock data's validation split no document)
    )
    TRAINING_ARGS=(
        --micro-batch-size 1
        --global-batch-size 8
        --lr 1e-4
        --train-iters 2
        --lr-decay-iters 2
        --lr-decay-style cosine
        --min-lr 1.0e-5
        --weight-decay 0.1
        --lr-warmup-iters 1
        --clip-grad 1.0
        $BF16
    )
    MODEL_PARALLEL_ARGS=(
        --tensor-model-parallel-size 1
        --pipeline-model-parallel-size 2
        --expert-model-parallel-size 2
        --use-distributed-optimizer
        --sequence-parallel
    )
    LOGGING_ARGS=(
        --log-interval 1 \
        --save-interval 10000 \
        --eval-interval 1000 \
        --eval-iters 1 \
        --save "$work/ck" \
        --load "$work/ck" \
        --tensorboard-dir "$work/ck/tensorboard" \
        --no-load-optim \
        --no-load-rng
    )
    launch mixtral 4 "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${DATA_ARGS[@]}" "${TRAINING_ARGS[@]}" \
        "${MODEL_PARALLEL_ARGS[@]}" "${LOGGING_ARGS[@]}"
    remaining=()
    expect_outcome mixtral
    grep -q "overlapped parameter all-gather: [1-9][0-9]* buckets" "$work/mixtral.err" ||
        fail "mixtral: no overlapped gather: $(grep -h overlapped "$work/mixtral.err" | head -3)"
    ;;
llama3_8b)
    MODEL_ARGS=(
        --use-mcore-models
        --num-layers 2
        --hidden-size 32
        --ffn-hidden-size 64
        --num-attention-heads 4
        --group-query-attention
        --num-query-groups 2
        --kv-channels 8
        --seq-length 32
        --max-position-embeddings 32
        --position-embedding-type rope
        --rotary-base 1000000
        --rotary-percent 1.0
        --attention-dropout 0.0
        --hidden-dropout 0.0
        --swiglu
        --normalization RMSNorm
        --init-method-std 0.0134
        --attention-backend fused
        --apply-layernorm-1p
        --untie-embeddings-and-output-weights
        --disable-bias-linear
    )
    TRAINING_ARGS=(
        --micro-batch-size 1
        --global-batch-size 8
        --train-samples 16
        --lr-decay-samples 12
        --lr-warmup-samples 4
        --lr 0.00015
        --min-lr 0.00001
        --decoupled-lr 5.0e-4      # Specific to decoupled AdamW, ensure optimizer is compatible
        --decoupled-min-lr 4.5e-5  # Specific to decoupled AdamW
        --lr-decay-style cosine
        --clip-grad 1.0
        --weight-decay 0.1
        --adam-beta1 0.9
        --adam-beta2 0.95
        $BF16
        --grad-reduce-in-bf16
        --cross-entropy-loss-fusion
        --calculate-per-token-loss
        --manual-gc
        --empty-unused-memory-level 1
        --exit-duration-in-mins 235
    )
    MODEL_PARALLEL_ARGS=(
        --tensor-model-parallel-size 2
        --context-parallel-size 1
        --sequence-parallel  # Always enable sequence parallelism with TP_SIZE=2
    )
    DDP_ARGS=(
        --use-distributed-optimizer
        --overlap-grad-reduce
        --overlap-param-gather
    )
    TRAINING_ARGS+=("${DDP_ARGS[@]}")
    DATA_ARGS_LIST=(
        --mock-data
        --tokenizer-type NullTokenizer
        --vocab-size 500
        --tiktoken-pattern v2
        --split 99,1,0
        --no-create-attention-mask-in-dataloader
        --no-mmap-bin-files
        --num-workers 1
    )
    EVAL_AND_LOGGING_ARGS=(
        --log-interval 1
        --eval-iters 1
        --eval-interval 100
        --save-interval 1000
        --log-throughput
        --profile
        --profile-step-start 4
        --profile-step-end 6
        --ckpt-format torch_dist
        --distributed-timeout-minutes 60
        --save "$work/ck"
        --load "$work/ck"
        --tensorboard-dir "$work/tb"
    )
    launch llama3 2 "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS_LIST[@]}" \
        "${EVAL_AND_LOGGING_ARGS[@]}"
    remaining=(
        "--attention-backend fused selects Transformer Engine's cuDNN fused attention, which cohort does not have: use auto (local and unfused are the same: cohort's one attention kernel)"
    )
    expect_outcome llama3
    # ... without the refused flag (--attention-backend auto; the decoupled rate beside the
    # distributed optimizer and both overlaps kept, tp 2 with sequence parallelism):
    # the line trains to its end, zero-centred norms (--apply-layernorm-1p, kept so in the
    # checkpoint) and the loss per token (--calculate-per-token-loss) included
    keep=()
    skip=0
    for a in "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}"; do
        if [ $skip = 1 ]; then skip=0; continue; fi
        case $a in
        --attention-backend) skip=1; continue ;;
        esac
        keep+=("$a")
    done
    EVAL_AND_LOGGING_ARGS=("${EVAL_AND_LOGGING_ARGS[@]/#$work\/ck/$work/ck2}")
    launch llama3_run 2 "${keep[@]}" --attention-backend auto "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS_LIST[@]}" \
        "${EVAL_AND_LOGGING_ARGS[@]}"
    remaining=()
    expect_outcome llama3_run
    grep -q '"layernorm_1p": *true' "$work"/ck2/iter_0000002/manifest.json ||
        fail "the checkpoint does not say its norms are stored as w - 1: $(ls "$work/ck2")"
    # ... and a job without --apply-layernorm-1p does not load it
    launch llama3_plain 2 "${keep[@]/--apply-layernorm-1p/--no-load-rng}" --attention-backend auto \
        "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS_LIST[@]}" "${EVAL_AND_LOGGING_ARGS[@]}" --train-samples 24
    [ $rc -ne 0 ] && grep -q "checkpoint has norm weights stored as w - 1, the flags (--apply-layernorm-1p) give norm weights stored as w" \
        "$work/llama3_plain.out" "$work/llama3_plain.err" || fail "loaded without --apply-layernorm-1p: exit $rc"
    ;;
deepseek_v3)
    # Megatron's DeepSeek-V3 recipe (Megatron-Core's MoE README and the MoE model zoo's
    # DeepSeek-V3 line), sizes shrunk: fine-grained experts with a shared expert, group-limited
    # sigmoid routing without aux loss (the expert bias, updated from the counts; the sequence
    # aux loss at a small weight), top-k scaling, multi-token prediction. Left out: multi-latent
    # attention (--multi-latent-attention, --q-lora-rank, --kv-lora-rank, --qk-head-dim,
    # --qk-pos-emb-head-dim, --v-head-dim, --rotary-scaling-factor, --mscale*), which cohort
    # does not have, and the fusion flags of Transformer Engine (--moe-permute-fusion).
    MODEL_ARGS=(
        --use-mcore-models
        --disable-bias-linear
        --seq-length 32
        --max-position-embeddings 32
        --num-layers 4
        --hidden-size 32
        --ffn-hidden-size 64
        --num-attention-heads 4
        --kv-channels 8
        --init-method-std 0.02
        --attention-dropout 0.0
        --hidden-dropout 0.0
        --normalization RMSNorm
        --norm-epsilon 1e-6
        --position-embedding-type rope
        --rotary-base 10000
        --swiglu
        --untie-embeddings-and-output-weights
        --no-masked-softmax-fusion
        --no-position-embedding
    )
    MOE_ARGS=(
        --num-experts 8
        # Megatron's line makes the first 3 of 61 layers dense, "([0]*3+[1]*58)"; here the
        # first of 4
        --moe-layer-freq "([0]*1+[1]*3)"
        --moe-ffn-hidden-size 16
        --moe-shared-expert-intermediate-size 16
        --moe-router-load-balancing-type seq_aux_loss
        --moe-router-topk 4
        --moe-router-num-groups 4
        --moe-router-group-topk 2
        --moe-router-topk-scaling-factor 2.5
        --moe-router-score-function sigmoid
        --moe-router-enable-expert-bias
        --moe-router-bias-update-rate 1e-3
        --moe-router-dtype fp32
        --moe-aux-loss-coeff 1e-4
        --moe-grouped-gemm
        --moe-token-dispatcher-type alltoall
    )
    MTP_ARGS=(
        --mtp-num-layers 1
        --mtp-loss-scaling-factor 0.1
    )
    DATA_ARGS=(
        --tokenizer-type NullTokenizer --vocab-size 500
        --mock-data
        --split 99,1,0
    )
    TRAINING_ARGS=(
        --micro-batch-size 1
        --global-batch-size 8
        --lr 1e-4
        --train-iters 3
        --lr-decay-iters 3
        --lr-decay-style cosine
        --min-lr 1.0e-5
        --weight-decay 0.1
        --lr-warmup-iters 1
        --clip-grad 1.0
        $BF16
    )
    MODEL_PARALLEL_ARGS=(
        --tensor-model-parallel-size 1
        --pipeline-model-parallel-size 1
        --expert-model-parallel-size 2
    )
    DDP_ARGS=(
        --use-distributed-optimizer
        --overlap-grad-reduce
        --overlap-param-gather
    )
    LOGGING_ARGS=(
        --log-interval 1
        --save-interval 10000
        --eval-interval 1000
        --eval-iters 1
        --save "$work/ck"
        --tensorboard-dir "$work/tb"
    )
    launch deepseek 2 "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${MTP_ARGS[@]}" "${DATA_ARGS[@]}" "${TRAINING_ARGS[@]}" \
        "${MODEL_PARALLEL_ARGS[@]}" "${DDP_ARGS[@]}" "${LOGGING_ARGS[@]}"
    remaining=()
    expect_outcome deepseek
    # ... the model, its routing and MTP without the two overlaps (the distributed optimizer
    # kept, its experts' shards over the expert-data-parallel group): trains to its end, the MTP
    # loss and the expert bias's routing in the log
    launch deepseek_run 2 "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${MTP_ARGS[@]}" "${DATA_ARGS[@]}" \
        "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" --use-distributed-optimizer "${LOGGING_ARGS[@]}"
    remaining=()
    expect_outcome deepseek_run
    grep -q "iteration *3/ *3 .*mtp_1 loss" "$work/deepseek_run.out" ||
        fail "no MTP loss in the last iteration's line: $(grep 'iteration' "$work/deepseek_run.out" | tail -2)"
    [ -d "$work/ck" ] || fail "no checkpoint saved"
    # the list form of --moe-layer-freq: layer 0 dense, the others MoE
    "$cohort" ckpt inspect "$work/ck" >"$work/inspect.out" 2>&1 || fail "inspect: $(tail -3 "$work/inspect.out")"
    grep -q "layers.0.mlp.fc1.weight" "$work/inspect.out" && grep -q "layers.3.mlp.experts.7.fc1.weight" \
        "$work/inspect.out" && ! grep -q "layers.0.mlp.experts" "$work/inspect.out" ||
        fail "not the first layer dense: $(grep -m6 mlp "$work/inspect.out")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
