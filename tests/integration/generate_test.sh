#!/usr/bin/env bash
# generate_test.sh - `cohort generate` (text from a checkpoint, KV-cache forward), one case
# per meson test.
#   generate_test.sh COHORT CASE
# Cases:
#   check_kv   a GPT (learned positions, LayerNorm, GeLU, tied) trained 3 iterations: the
#              KV cache's logits at every position (prompt prefilled, then one position per
#              token) equal a full forward's within 1e-4 x (1 + max |logit|) in fp32
#              (--check-kv), for two prompts and with sampling
#   llama      rope, RMSNorm, SwiGLU, grouped queries (4 heads, 2 groups), untied, no biases:
#              the same check, and greedy generation of --max-new-tokens ids
#   moe        every second layer MoE (4 experts, top-2, dropless) and a model with 2 MTP
#              depths (not used for generation): the same check
#   seed       sampling: a fixed seed gives the same text twice, another seed other text;
#              --greedy equals --temperature 0; prompts from standard input, one per line
#   embedded   the embedded job (`cohort train`'s defaults, byte tokenizer) saved after a
#              few iterations generates text continuing the prompt, tokens/s on stderr
#   tp_pp      a tp 2 x pp 2 checkpoint and its tp 1 conversion (`ckpt convert --to cohort`)
#              generate the same ids, greedy and sampled with one seed, and --iteration N
#              of the checkpoint the same as its latest
#   bf16       a model trained with --bf16 generates in bf16 (--check-kv against a full bf16
#              forward), --fp32 in fp32; held to AVX2 it falls back to fp32 with a warning and
#              refuses an explicit --bf16 (skipped on CPUs without bf16 instructions)
#   refused    no --load, a missing checkpoint, a missing --iteration, NullTokenizer prompts
#              with words that are not ids or ids past the vocabulary, a bad --top-p, an
#              unknown flag: exit 2 with one line naming it, nothing on stdout; --help exit 0
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir generate

tiny_model --num-layers 2 --attention-dropout 0 --hidden-dropout 0
gen() { "$COHORT_CPU_EXE" generate "$@"; }

# NAME ARGS...: a tiny model trained 3 iterations into $work/NAME.ck
save() { train_ok "$1" --train-iters 3 --save "$work/$1.ck" "${@:2}"; }

# NAME ARGS...: --check-kv on $work/NAME.ck passes for two prompts, greedy and sampled
kv_ok() {
    local name=$1; shift
    gen --load "$work/$name.ck" --prompt "1 2 3 4 5" --prompt "7" --max-new-tokens 12 --check-kv "$@" \
        >"$work/$name.gen" 2>"$work/$name.err" || fail "$name: generate --check-kv: $(tail -3 "$work/$name.err")"
    [ "$(grep -c 'check-kv: .*: ok$' "$work/$name.err")" = 2 ] || fail "$name: no check-kv line per prompt: $(cat "$work/$name.err")"
    [ "$(wc -l <"$work/$name.gen")" = 2 ] || fail "$name: not a line per prompt: $(cat "$work/$name.gen")"
    grep -q '^1 2 3 4 5 [0-9]' "$work/$name.gen" || fail "$name: the text does not continue the prompt: $(cat "$work/$name.gen")"
}

case $case_name in
check_kv)
    save gpt
    kv_ok gpt --greedy
    kv_ok gpt --temperature 0.8 --top-k 50 --seed 3
    grep -q 'tokens/s (fp32' "$work/gpt.err" || fail "no tokens per second line: $(cat "$work/gpt.err")"
    ;;
llama)
    save llama --position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention \
        --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear
    kv_ok llama --greedy
    kv_ok llama --top-p 0.9 --seed 5
    gen --load "$work/llama.ck" --prompt "3 1 4 1 5" --max-new-tokens 9 --greedy --json >"$work/j" ||
        fail "llama: greedy --json"
    /usr/bin/python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["prompt_ids"] == [3, 1, 4, 1, 5], r
assert 1 <= len(r["ids"]) <= 9 and all(0 <= i <= 500 for i in r["ids"]), r
assert r["text"].startswith("3 1 4 1 5"), r
' "$work/j" || fail "llama: --json: $(cat "$work/j")"
    ;;
moe)
    save moe --num-layers 4 --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-layer-freq 2 \
        --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2
    kv_ok moe --greedy
    kv_ok moe --temperature 1 --seed 9
    save mtp --position-embedding-type rope --mtp-num-layers 2
    kv_ok mtp --greedy
    ;;
seed)
    save gpt
    n=0
    for s in 1 1 2; do
        gen --load "$work/gpt.ck" --prompt "10 20 30" --max-new-tokens 16 --seed $s >"$work/s$s.$((n += 1))" ||
            fail "--seed $s"
    done
    cmp -s "$work/s1.1" "$work/s1.2" || fail "--seed 1 twice: $(cat "$work/s1.1" "$work/s1.2")"
    cmp -s "$work/s1.1" "$work/s2.3" && fail "--seed 1 and 2 gave the same text: $(cat "$work/s1.1")"
    [ "$(wc -w <"$work/s1.1")" -gt 3 ] || fail "nothing generated: $(cat "$work/s1.1")"
    gen --load "$work/gpt.ck" --prompt "10 20 30" --max-new-tokens 8 --greedy >"$work/g1" || fail "--greedy"
    gen --load "$work/gpt.ck" --prompt "10 20 30" --max-new-tokens 8 --temperature 0 --seed 7 >"$work/g2" ||
        fail "--temperature 0"
    cmp -s "$work/g1" "$work/g2" || fail "--greedy and --temperature 0 differ: $(cat "$work/g1" "$work/g2")"
    printf '10 20 30\n5 6\n' | gen --load "$work/gpt.ck" --max-new-tokens 8 --greedy >"$work/stdin" ||
        fail "prompts from standard input"
    [ "$(wc -l <"$work/stdin")" = 2 ] && [ "$(head -1 "$work/stdin")" = "$(cat "$work/g1")" ] ||
        fail "standard input's prompts: $(cat "$work/stdin")"
    ;;
embedded)
    # the embedded job's model and tokenizer (no data flags), a few of its steps
    "$cohort" train --train-iters 4 --threads 1 --save "$work/emb.ck" >"$work/emb.out" 2>&1 ||
        fail "embedded job: $(tail -3 "$work/emb.out")"
    gen --load "$work/emb.ck" --prompt "Permission is " --max-new-tokens 40 --seed 1 >"$work/text" 2>"$work/err" ||
        fail "generate from the embedded job: $(cat "$work/err")"
    grep -q '^Permission is ' "$work/text" || fail "the text does not continue the prompt: $(cat "$work/text")"
    [ "$(wc -c <"$work/text")" -gt 16 ] || fail "nothing generated: $(cat "$work/text")"
    grep -q 'new tokens in .* tokens/s' "$work/err" || fail "no tokens per second: $(cat "$work/err")"
    ;;
tp_pp)
    train_ok tp2pp2 --train-iters 3 --num-layers 4 --nproc-per-node 4 --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --save "$work/tp2pp2.ck"
    "$COHORT_CPU_EXE" ckpt convert "$work/tp2pp2.ck" --to cohort --tensor-model-parallel-size 1 \
        --output "$work/tp1.ck" >"$work/conv.out" 2>&1 || fail "ckpt convert: $(cat "$work/conv.out")"
    for d in tp2pp2 tp1; do
        gen --load "$work/$d.ck" --prompt "1 2 3 4 5" --prompt "42" --max-new-tokens 12 --greedy --json \
            >"$work/$d.json" 2>"$work/$d.err" || fail "$d: $(cat "$work/$d.err")"
        # sampled: every probability counts, so the same draws need the same weights throughout
        gen --load "$work/$d.ck" --prompt "1 2 3 4 5" --max-new-tokens 24 --seed 4 --json \
            >"$work/$d.s.json" 2>"$work/$d.err" || fail "$d: $(cat "$work/$d.err")"
    done
    ids() { sed 's/,"seconds".*//' "$work/$1.json"; } # the text and ids, not the times
    [ "$(ids tp1 | grep -c '"ids":\[[0-9]')" = 2 ] || fail "tp1: $(cat "$work/tp1.json")"
    [ "$(ids tp2pp2.s)" = "$(ids tp1.s)" ] ||
        fail "tp 2 x pp 2 and its tp 1 conversion sample different ids: $(cat "$work/tp2pp2.s.json" "$work/tp1.s.json")"
    [ "$(ids tp2pp2)" = "$(ids tp1)" ] ||
        fail "tp 2 x pp 2 and its tp 1 conversion generate different ids: $(cat "$work/tp2pp2.json" "$work/tp1.json")"
    gen --load "$work/tp2pp2.ck" --iteration 3 --prompt "1 2 3 4 5" --prompt "42" --max-new-tokens 12 --greedy \
        --json >"$work/it.json" || fail "--iteration 3"
    [ "$(ids tp2pp2)" = "$(ids it)" ] || fail "--iteration 3 generates other ids: $(cat "$work/it.json")"
    ;;
bf16)
    # a model trained in bf16 generates in bf16 (the products through the training forward's
    # bf16 kernels): the cache's logits against a full bf16 forward's; --fp32 overrides; on a
    # CPU without bf16 matrix instructions (or held to AVX2) it falls back to fp32 with a
    # warning, and an explicit --bf16 is refused
    grep -qwE "avx512_bf16|amx_bf16" /proc/cpuinfo && [ -z "${ONEDNN_MAX_CPU_ISA:-}" ] ||
        { echo "skip: this CPU has no bf16 matrix instructions"; exit 77; }
    save b16 --bf16
    kv_ok b16 --greedy
    grep -q 'tokens/s (bf16' "$work/b16.err" || fail "not bf16: $(cat "$work/b16.err")"
    kv_ok b16 --fp32 --seed 2
    grep -q 'tokens/s (fp32' "$work/b16.err" || fail "--fp32 is not fp32: $(cat "$work/b16.err")"
    ONEDNN_MAX_CPU_ISA=AVX2 gen --load "$work/b16.ck" --prompt "1 2" --max-new-tokens 4 >"$work/out" 2>"$work/err" ||
        fail "AVX2: $(cat "$work/err")"
    grep -q 'trained in bf16; generating in fp32' "$work/err" && grep -q 'tokens/s (fp32' "$work/err" ||
        fail "AVX2: no fp32 fallback: $(cat "$work/err")"
    ONEDNN_MAX_CPU_ISA=AVX2 gen --load "$work/b16.ck" --prompt "1 2" --max-new-tokens 4 --bf16 >"$work/out" 2>"$work/err"
    [ $? = 2 ] && grep -q 'bf16' "$work/err" && [ ! -s "$work/out" ] || fail "AVX2 --bf16 not refused: $(cat "$work/err")"
    ;;
refused)
    save gpt
    refused() { # MESSAGE ARGS...: exit 2, MESSAGE on stderr, nothing on stdout
        local msg=$1 rc; shift
        gen "$@" >"$work/out" 2>"$work/err" </dev/null
        rc=$?
        [ $rc -eq 2 ] || fail "$*: exit $rc, want 2: $(cat "$work/err")"
        grep -qF -- "$msg" "$work/err" || fail "$*: no '$msg' in: $(cat "$work/err")"
        [ "$(wc -l <"$work/err")" = 1 ] || fail "$*: not one line: $(cat "$work/err")"
        [ ! -s "$work/out" ] || fail "$*: printed: $(cat "$work/out")"
    }
    refused "--load DIR is required" --prompt "1 2"
    refused "--load $work/none: no checkpoint there" --load "$work/none" --prompt "1 2"
    refused "no checkpoint at --iteration 7" --load "$work/gpt.ck" --iteration 7 --prompt "1"
    refused 'prompt 2: NullTokenizer: "x1"' --load "$work/gpt.ck" --prompt "1 2" --prompt "3 x1"
    refused 'prompt 1: NullTokenizer: "900"' --load "$work/gpt.ck" --prompt "900"
    refused "--top-p 1.5: not a valid value" --load "$work/gpt.ck" --top-p 1.5 --prompt "1"
    refused "unknown argument '--nope'" --load "$work/gpt.ck" --nope
    refused "no prompt" --load "$work/gpt.ck"
    gen --help | grep -q -- '--max-new-tokens' || fail "--help"
    "$COHORT_CPU_EXE" help | grep -q '^  generate ' || fail "cohort help does not list generate"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
