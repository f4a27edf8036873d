#!/usr/bin/env bash
# generate_bench.sh - tokens per second of `cohort generate` (KV cache, one process) on GPT-2
# 124M, fp32 and bf16, beside a PyTorch KV-cache loop over the same weights
# (bench/generate_torch.py), in one run (docs/benchmarks.md, "Text generation").
#   bench/generate_bench.sh [BUILD_DIR] [NEW_TOKENS] [THREADS]
# The model: GPT-2 124M (12 layers, hidden 768, 12 heads, vocabulary 50257 padded to 50304)
# after one training iteration from Megatron's initialisation on mock data, saved without its
# optimizer state and exported with `cohort ckpt convert --to hf-gpt2` for PyTorch. Each side
# generates greedily NEW_TOKENS tokens after the same prompt ids; cohort's time is its second
# prompt's (the first warms oneDNN's kernels up), PyTorch's the best of two runs, prefill
# included in both. bf16 runs where the CPU has bf16 matrix instructions (else it is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
new=${2:-64}
threads=${3:-2}
cohort=$build/cohort
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-genbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export COHORT_TEST_MOCK_SEQUENCES=1000 OMP_WAIT_POLICY=passive

echo "$($py bench/cpuinfo.py)"
coretype=$($py bench/cpuinfo.py --openblas-coretype 2>/dev/null || true)
torch_env=()
[ -n "$coretype" ] && torch_env=("OPENBLAS_CORETYPE=$coretype")

"$cohort" train --device cpu --mock-data --data-cache-path "$work/cache" --tokenizer-type GPT2BPETokenizer \
    --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 64 --max-position-embeddings 1024 \
    --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-4 --eval-interval 1000 --eval-iters 1 --threads "$threads" \
    --no-save-optim --save "$work/ck" >"$work/train.out" 2>&1 || { tail -5 "$work/train.out"; exit 1; }
"$cohort" ckpt convert "$work/ck" --to hf-gpt2 --output "$work/hf" >"$work/convert.out" 2>&1 ||
    { cat "$work/convert.out"; exit 1; }

prompt="The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks were striking"
run_cohort() { # PRECISION: one JSON line, the second (warm) prompt's
    "$cohort" generate --load "$work/ck" --prompt "$prompt" --prompt "$prompt" --max-new-tokens "$new" --greedy \
        --json --threads "$threads" "--$1" 2>"$work/gen.err" | tail -1
}
for prec in fp32 bf16; do
    if ! line=$(run_cohort $prec); then
        echo "cohort $prec: skipped ($(tail -1 "$work/gen.err"))"
        continue
    fi
    ids=$(echo "$line" | $py -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["prompt_ids"])))')
    torch_flag=(); [ $prec = bf16 ] && torch_flag=(--bf16)
    tline=$(env "${torch_env[@]}" $py bench/generate_torch.py "$work/hf" --prompt-ids "$ids" --new-tokens "$new" \
        --threads "$threads" "${torch_flag[@]}")
    $py - "$prec" "$line" "$tline" <<'PY'
import json, sys
prec, c, t = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
n = len(c["ids"])
print(f"{prec}: prompt {len(c['prompt_ids'])} tokens, {n} new: cohort {n / c['seconds']:.2f} tokens/s "
      f"({c['seconds']:.3f} s, prefill {c['prefill_seconds']:.3f} s), PyTorch {t['torch']} {t['tokens_per_s']:.2f} "
      f"tokens/s ({t['seconds']:.3f} s); greedy ids equal for the first {next((i for i, (a, b) in enumerate(zip(c['ids'], t['ids'])) if a != b), n)} of {n}")
PY
done
