#!/usr/bin/env bash
# train_test.sh - `cohort train --device cuda` end to end on the CUDA stand-in
# (build/cohort-cudasim: the real CUDA backend's kernels on the CPU, tests/cudasim/), one case
# per meson test (suite cudasim):
#   tracks_cpu: a tiny GPT (sequences of 64 tokens: two attention tiles) trained 3 iterations
#     on the stand-in logs the same losses as `cohort --device cpu` within 1e-5 relative
#     (different summation orders only), and the run says it used the CUDA backend.
#   fp16: --fp16 (loss scale 4096, dynamic: no overflow in 3 iterations) on the stand-in (the
#     CUDA backend's fp16 conversion kernel, cuBLASLt with CUDA_R_16F inputs computed in
#     double) logs the CPU backend's --fp16 losses within 1e-5 relative (the same fp16 inputs;
#     fp32 against double accumulation, which can move an fp16 rounding downstream), and the
#     loss scale.
#   deterministic: two stand-in runs with dropout log bitwise the same metrics (the stand-in
#     shuffles thread order per launch: the kernels' results must not depend on it).
#   bf16_recompute: --bf16 with dropout on the stand-in keeps the norms', attention's and
#     GELU's outputs in bf16 (the log says so), and selective recomputation of every module
#     (their bf16 buffers written again before the backward reads them) and full recomputation
#     (a layer at a time: every activation from the layer's input) log bitwise the losses and
#     gradient norms of the run without recomputation, under another thread order.
cohort=$1; cudasim=$2; case_name=$3
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
workdir cudasim

tiny_model --seq-length 64 --train-iters 3 --global-batch-size 4

losses() { grep -o '"iteration":[0-9]*\|"lm_loss":[^,]*' "$1" | paste -sd' '; }
gn() { grep -o '"iteration":[0-9]*\|"lm_loss":[^,]*\|"grad_norm":[^,]*' "$1" | paste -sd' '; }

case $case_name in
tracks_cpu)
    "$cohort" train "${tiny[@]}" --device cpu --metrics-file "$work/cpu.jsonl" >"$work/cpu.out" 2>&1 ||
        fail "cpu run: $(tail -5 "$work/cpu.out")"
    "$cudasim" train "${tiny[@]}" --device cuda --metrics-file "$work/cuda.jsonl" >"$work/cuda.out" 2>&1 ||
        fail "stand-in run: $(tail -5 "$work/cuda.out")"
    grep -q "cuda: GPU 0 of 1, cudasim" "$work/cuda.out" || fail "the run did not use the stand-in: $(head -3 "$work/cuda.out")"
    paste <(grep -o '"lm_loss":[^,]*' "$work/cpu.jsonl" | cut -d: -f2) \
          <(grep -o '"lm_loss":[^,]*' "$work/cuda.jsonl" | cut -d: -f2) | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-5 * a) { bad++; print "cpu " $1 " stand-in " $2 } }
        END { exit (n < 3 || bad > 0) }' >&2 || fail "the stand-in's losses are not the CPU's: $(losses "$work/cpu.jsonl") / $(losses "$work/cuda.jsonl")"
    ;;
fp16)
    f16=(--fp16 --initial-loss-scale 4096)
    "$cohort" train "${tiny[@]}" "${f16[@]}" --device cpu --metrics-file "$work/cpu.jsonl" >"$work/cpu.out" 2>&1 ||
        fail "cpu run: $(tail -5 "$work/cpu.out")"
    "$cudasim" train "${tiny[@]}" "${f16[@]}" --device cuda --metrics-file "$work/cuda.jsonl" >"$work/cuda.out" 2>&1 ||
        fail "stand-in run: $(tail -5 "$work/cuda.out")"
    grep -q "cuda: GPU 0 of 1, cudasim.*fp16" "$work/cuda.out" || fail "no fp16 stand-in run: $(grep -m1 cuda: "$work/cuda.out")"
    grep -q "loss scale: 4096.0 | .*skipped iterations: *0 |" "$work/cuda.out" || fail "no loss scale: $(grep -m1 iteration "$work/cuda.out")"
    paste <(grep -o '"lm_loss":[^,]*' "$work/cpu.jsonl" | cut -d: -f2) \
          <(grep -o '"lm_loss":[^,]*' "$work/cuda.jsonl" | cut -d: -f2) | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = d / a; if (r > w) w = r; if (r > 1e-5) bad++ }
        END { printf "fp16: stand-in against cpu: largest relative loss difference %.2e\n", w; exit (n < 3 || bad > 0) }' >&2 ||
        fail "the stand-in's fp16 losses are not the CPU's: $(losses "$work/cpu.jsonl") / $(losses "$work/cuda.jsonl")"
    ;;
deterministic)
    for r in 1 2; do
        COHORT_CUDASIM_SEED=$r "$cudasim" train "${tiny[@]}" --device cuda --hidden-dropout 0.1 --attention-dropout 0.1 \
            --metrics-file "$work/m$r.jsonl" >"$work/out$r" 2>&1 || fail "run $r: $(tail -5 "$work/out$r")"
    done
    [ "$(losses "$work/m1.jsonl")" = "$(losses "$work/m2.jsonl")" ] ||
        fail "two stand-in runs under different thread orders differ: $(losses "$work/m1.jsonl") / $(losses "$work/m2.jsonl")"
    [ "$(grep -c lm_loss "$work/m1.jsonl")" -ge 3 ] || fail "metrics file has too few lines"
    ;;
bf16_recompute|bf16_recompute_moe)
    # bf16_recompute_moe: bf16 activations in a MoE model (every second layer; their input
    # stored in bf16, the router and the shared expert reading it widened): selective
    # recomputation of the norms, attention and the MoE layers, and full recomputation, give
    # bitwise the same losses and gradient norms as none (the recomputed MoE forward widens
    # the same bf16 input)
    b16=(--bf16 --hidden-dropout 0.1 --attention-dropout 0.1); mod=mlp
    said="the norms', attention's and GELU's outputs in bf16"
    if [ $case_name = bf16_recompute_moe ]; then
        b16+=(--disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-layer-freq 2
              --moe-shared-expert-intermediate-size 32 --moe-grouped-gemm --moe-aux-loss-coeff 1e-2)
        mod=moe said="outputs in bf16 (the MoE layers' inputs too)"
    fi
    runs=(plain "--recompute-granularity selective --recompute-modules layernorm core_attn $mod"
          "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    for r in 0 1 2; do
        extra=(); [ $r -gt 0 ] && extra=(${runs[r]})
        COHORT_CUDASIM_SEED=$((r + 1)) "$cudasim" train "${tiny[@]}" "${b16[@]}" "${extra[@]}" --device cuda \
            --metrics-file "$work/m$r.jsonl" >"$work/out$r" 2>&1 || fail "run $r (${runs[r]}): $(tail -5 "$work/out$r")"
        grep -q "$said" "$work/out$r" || fail "run $r: no bf16 activations: $(grep -m1 'activation memory' "$work/out$r")"
        [ $r -eq 0 ] || [ "$(gn "$work/m0.jsonl")" = "$(gn "$work/m$r.jsonl")" ] ||
            fail "${runs[r]} against none: $(gn "$work/m0.jsonl") / $(gn "$work/m$r.jsonl")"
    done
    [ "$(grep -c lm_loss "$work/m0.jsonl")" -ge 3 ] || fail "metrics file has too few lines"
    ;;
*) fail "unknown case $case_name" ;;
esac
