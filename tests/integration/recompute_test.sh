#!/usr/bin/env bash
# recompute_test.sh - activation recomputation and sequence parallelism's memory (docs/memory.md),
# one case per meson test.
#   recompute_test.sh COHORT CASE
# Cases (hidden and attention dropout on wherever the layout allows; each run with
# recomputation must end with its reference's checkpoint bitwise: weights and both Adam
# moments after 3 steps, i.e. bitwise equal gradients):
#   tp_sp       tp 2 with SP: full uniform (groups of 1 and 2), full block, selective core_attn
#               (the default, and --recompute-activations), selective layernorm + mlp + core_attn
#   pp          pp 2 with two virtual stages per rank (interleaved): full uniform, full block,
#               selective; the recomputation's scratch is one set, not one per micro batch
#   moe         a MoE model (every second layer) at tp 2 with SP: full uniform 2, selective
#               moe + layernorm + mlp
#   mtp         an MTP model (2 depths): full uniform 2, selective layernorm
#   cp          context parallelism 2 (attention dropout 0, as cp needs): full and core_attn
#   distribute  tp 2 without SP: --distribute-saved-activations with uniform 1 and block 2
#               against the same without distributing and without recomputation; the kept
#               layer inputs shrink to N/tp rows
#   bf16        --bf16 (where the CPU has bf16 matrix instructions): full and selective
#   refused     Megatron's argument checks: each bad combination refused before any work
#   memory      the activation bytes each rank allocates (the model's log line): at tp 2 with
#               SP below tp 2 without by Megatron's formula (within 10%); full recomputation
#               keeps each layer's input only
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir recompute

tiny_model --num-layers 4 --attention-dropout 0.1 --hidden-dropout 0.1 --eval-iters 1
run() { train_ok "$1" --train-iters 3 --save "$work/$1.ck" "${@:2}"; } # NAME ARGS...
# same REF NAME...: each NAME's final checkpoint bitwise REF's
same() {
    local ref=$1 n; shift
    for n in "$@"; do ckpt_same "$work/$ref.ck" "$work/$n.ck" "$n (recomputed) against $ref"; done
}
# also FLAG [VALUE]...: set flags on the tiny model (replacing a value it has)
also() {
    local i found
    while [ $# -gt 0 ]; do
        if [ $# -lt 2 ] || [[ $2 == --* ]]; then tiny+=("$1"); shift; continue; fi
        found=0
        for i in "${!tiny[@]}"; do [ "${tiny[i]}" = "$1" ] && { tiny[i + 1]=$2; found=1; }; done
        [ $found = 1 ] || tiny+=("$1" "$2")
        shift 2
    done
}
full() { echo --recompute-granularity full --recompute-method "$1" --recompute-num-layers "$2"; }
sel() { echo --recompute-granularity selective --recompute-modules "$@"; }
# bytes NAME WHICH: into $got, the first rank's activation bytes from its log line (WHICH:
# total|layers|scratch)
bytes() {
    local line which=$2
    line=$(grep -m1 -o "activation memory: [0-9]* bytes on this rank (layers [0-9]*, recomputation scratch [0-9]*)" \
        "$work/$1.out") || fail "$1: no activation memory line: $(head -5 "$work/$1.out")"
    set -- $line
    case $which in total) got=$3 ;; layers) got=${9%,} ;; scratch) got=${12%)} ;; esac
    [[ $got =~ ^[0-9]+$ ]] || fail "$1: cannot read $which bytes from '$line'"
}

case $case_name in
tp_sp)
    t=(--nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel)
    run ref "${t[@]}"
    run u1 "${t[@]}" $(full uniform 1)
    run u2 "${t[@]}" $(full uniform 2)
    run b1 "${t[@]}" $(full block 1)
    run ca "${t[@]}" --recompute-granularity selective
    run ra "${t[@]}" --recompute-activations
    run s3 "${t[@]}" $(sel core_attn layernorm mlp)
    same ref u1 u2 b1 ca ra s3
    ;;
pp)
    p=(--nproc-per-node 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1)
    run ref "${p[@]}"
    run u1 "${p[@]}" $(full uniform 1)
    run b1 "${p[@]}" $(full block 1)
    run s3 "${p[@]}" $(sel core_attn,layernorm,mlp)
    same ref u1 b1 s3
    # interleaved 1F1B holds several micro batches per chunk: recomputation keeps one scratch
    bytes u1 layers; u=$got
    bytes ref layers; r=$got
    [ $((u * 4)) -lt "$r" ] || fail "full recomputation kept $u bytes of the layers' $r"
    ;;
moe)
    . "${COHORT_SOURCE_ROOT:?}/tests/integration/moe_tiny.sh"
    also --attention-dropout 0.1
    t=(--nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1
       --moe-shared-expert-intermediate-size 16 --moe-grouped-gemm)
    run ref "${t[@]}"
    run u2 "${t[@]}" $(full uniform 2)
    run sm "${t[@]}" $(sel moe layernorm mlp core_attn)
    same ref u2 sm
    ;;
mtp)
    also --position-embedding-type rope --mtp-num-layers 2
    run ref --nproc-per-node 1
    run u2 --nproc-per-node 1 $(full uniform 2)
    run sl --nproc-per-node 1 $(sel layernorm)
    same ref u2 sl
    ;;
cp)
    c=(--nproc-per-node 2 --context-parallel-size 2 --attention-dropout 0)
    run ref "${c[@]}"
    run u1 "${c[@]}" $(full uniform 1)
    run ca "${c[@]}" --recompute-activations
    same ref u1 ca
    ;;
distribute)
    t=(--nproc-per-node 2 --tensor-model-parallel-size 2)
    run ref "${t[@]}"
    run u1 "${t[@]}" $(full uniform 1)
    run du1 "${t[@]}" $(full uniform 1) --distribute-saved-activations
    run db2 "${t[@]}" $(full block 2) --distribute-saved-activations
    same ref u1 du1 db2
    # 4 layers of one slot: u1 keeps 4 full inputs, du1 the first whole and 3 halves
    bytes u1 layers; u=$got
    bytes du1 layers; d=$got
    [ $((d * 8)) -eq $((u * 5)) ] || fail "distributed inputs: $d bytes, want 5/8 of $u"
    ;;
bf16)
    grep -qw 'avx512_bf16\|amx_bf16' /proc/cpuinfo || { echo "SKIP: no bf16 matrix instructions"; exit 77; }
    t=(--nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel --bf16)
    run ref "${t[@]}"
    run u2 "${t[@]}" $(full uniform 2)
    run s3 "${t[@]}" $(sel core_attn layernorm mlp)
    same ref u2 s3
    ;;
refused)
    train_refused "needs --recompute-method uniform or block" --recompute-granularity full --recompute-num-layers 1
    train_refused "needs --recompute-num-layers between 1 and the layers per pipeline rank (4), got -1" \
        --recompute-granularity full --recompute-method uniform
    train_refused "got 5" $(full uniform 5)
    train_refused "--recompute-granularity must be one of full|selective" --recompute-granularity partial
    train_refused "a recompute method is not supported for selective" --recompute-granularity selective \
        --recompute-method block
    train_refused "selective recomputation takes no layer count" --recompute-activations --recompute-num-layers 2
    train_refused "need --recompute-granularity full" --recompute-method uniform --recompute-num-layers 1
    train_refused "it contradicts --recompute-granularity full" --recompute-activations $(full uniform 1)
    train_refused "--recompute-modules applies to selective recomputation" --recompute-modules mlp
    train_refused "'attn' is not a module" $(sel attn)
    train_refused "--recompute-modules moe: the model has no MoE layer" $(sel moe)
    train_refused "--recompute-modules moe_act: recomputing only the experts' activation" $(sel moe_act)
    train_refused "--recompute-modules mla_up_proj: it is for multi-latent attention" $(sel mla_up_proj)
    train_refused "--distribute-saved-activations needs --tensor-model-parallel-size > 1" $(full uniform 1) \
        --distribute-saved-activations
    train_refused "--distribute-saved-activations with --sequence-parallel" $(full uniform 1) \
        --distribute-saved-activations --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel
    train_refused "applies to --recompute-granularity full only" --distribute-saved-activations \
        --recompute-activations --nproc-per-node 2 --tensor-model-parallel-size 2
    ;;
memory)
    # 8 layers of hidden 128 at 64 tokens: sequence parallelism shards the layers' token-wise
    # activations (the norms' inputs and outputs: Megatron's 10sbh less the dropout masks,
    # which cohort regenerates instead of keeping, in fp32: 16sbh bytes) over tp ranks
    L=8 C=128 S=32 B=2 TP=2
    also --num-layers $L --hidden-size $C --seq-length $S --micro-batch-size $B
    t=(--nproc-per-node $TP --tensor-model-parallel-size $TP --train-iters 1)
    train_ok nosp "${t[@]}"
    train_ok sp "${t[@]}" --sequence-parallel
    train_ok full "${t[@]}" --sequence-parallel $(full uniform 1)
    bytes nosp layers; nosp=$got
    bytes sp layers; sp=$got
    bytes full layers; full=$got
    bytes full scratch; scratch=$got
    /usr/bin/python3 - $nosp $sp $full $scratch $L $C $S $B $TP <<'PY' || fail "activation memory"
import sys
nosp, sp, full, scratch, L, C, S, B, tp = map(int, sys.argv[1:])
want = L * 16 * S * B * C * (1 - 1 / tp)  # bytes Megatron's formula says SP saves
got = nosp - sp
print(f"layers' activations: {nosp} bytes without SP, {sp} with; saved {got}, formula {want:.0f}")
assert abs(got - want) <= 0.1 * want, (got, want)
# full recomputation: each layer keeps its input (Nl rows of C) only, one scratch layer
assert full == L * S * B // tp * C * 4, full
assert scratch < sp / L * 1.5, (scratch, sp)
print(f"full recomputation keeps {full} bytes (+ {scratch} scratch) of {sp}")
PY
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
