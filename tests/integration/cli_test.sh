#!/usr/bin/env bash
# cli_test.sh - integration tests of the `cohort` binary, one case per meson test.
#   cli_test.sh COHORT PYTHON CASE
set -uo pipefail
cohort=$1; py=$2; case_name=$3
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
export COHORT_CPU_EXE=$cohort; cohort=${COHORT_SOURCE_ROOT:?}/tests/cpu_cohort.sh
src=${COHORT_SOURCE_ROOT:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-it.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# a small model on mock data: fast, deterministic
tiny=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 2 --hidden-size 32
      --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3
      --data-cache-path "$work/cache" --log-interval 1 --eval-interval 1000 --eval-iters 1 --threads 2)

case $case_name in
unknown_flag)
    "$cohort" train --hiden-size 64 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 2 ] || fail "exit $rc, want 2"
    grep -q "did you mean '--hidden-size'" "$work/err" || fail "no suggestion: $(cat "$work/err")"
    ;;
inconsistent)
    "$cohort" train "${tiny[@]}" --hidden-size 30 --global-batch-size 3 --train-iters 5 --seq-length 64 \
        --max-position-embeddings 40 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 2 ] || fail "exit $rc, want 2"
    grep -q "not divisible by --num-attention-heads" "$work/err" || fail "heads: $(cat "$work/err")"
    grep -q "not a multiple of --micro-batch-size" "$work/err" || fail "batch: $(cat "$work/err")"
    grep -q "longer than --max-position-embeddings" "$work/err" || fail "positions: $(cat "$work/err")"
    [ ! -s "$work/out" ] || fail "work started before validation: $(cat "$work/out")"
    ;;
help)
    "$cohort" train --help >"$work/out" || fail "--help exit $?"
    for f in --num-layers --hidden-size --position-embedding-type --normalization --swiglu --lr-decay-style \
             --data-path --split --eval-interval --exit-duration-in-mins --bf16 --seed; do
        grep -q -- "$f" "$work/out" || fail "--help lacks $f"
    done
    grep -q "init-method-std.*default: 0.02" "$work/out" || fail "--help lacks the init-method-std default"
    ;;
deterministic)
    for r in 1 2; do
        "$cohort" train "${tiny[@]}" --train-iters 6 --hidden-dropout 0.1 --attention-dropout 0.1 \
            --metrics-file "$work/m$r.jsonl" >"$work/out$r" 2>&1 || fail "run $r: $(cat "$work/out$r")"
    done
    sed -E 's/"(elapsed_ms_per_iteration|tokens_per_second|tflops_per_rank|validation_ms_per_iteration|time)":[^,}]*//g' "$work/m1.jsonl" >"$work/a"
    sed -E 's/"(elapsed_ms_per_iteration|tokens_per_second|tflops_per_rank|validation_ms_per_iteration|time)":[^,}]*//g' "$work/m2.jsonl" >"$work/b"
    [ "$(grep -c lm_loss "$work/a")" -ge 6 ] || fail "metrics file has too few lines"
    cmp -s "$work/a" "$work/b" || fail "two runs with the same seed differ: $(diff "$work/a" "$work/b" | head)"
    # a different seed changes the run
    "$cohort" train "${tiny[@]}" --train-iters 6 --seed 99 --metrics-file "$work/m3.jsonl" >/dev/null 2>&1
    sed -E 's/"(elapsed_ms_per_iteration|tokens_per_second|tflops_per_rank|validation_ms_per_iteration|time)":[^,}]*//g' "$work/m3.jsonl" >"$work/c"
    ! cmp -s "$work/a" "$work/c" || fail "--seed has no effect"
    ;;
log_format)
    "$cohort" train "${tiny[@]}" --train-iters 2 --metrics-file "$work/m.jsonl" >"$work/out" 2>&1 || fail "$(cat "$work/out")"
    re='^ \[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\] iteration +2/ +2 \| consumed samples: +8 \| elapsed time per iteration \(ms\): [0-9]+\.[0-9] \| throughput per GPU \(TFLOP/s/GPU\): [0-9]+\.[0-9] \| learning rate: [0-9]\.[0-9]{6}E[-+][0-9]{2} \| global batch size: +4 \| lm loss: [0-9]\.[0-9]{6}E[-+][0-9]{2} \| loss scale: 1\.0 \| grad norm: [0-9]+\.[0-9]{3} \| number of skipped iterations: +0 \| number of nan iterations: +0 \|$'
    grep -Eq "$re" "$work/out" || fail "log line not in Megatron's format: $(grep iteration "$work/out")"
    "$py" -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$work/m.jsonl" || fail "metrics not JSON"
    grep -q "validation loss at iteration 2 on test set | lm loss value: " "$work/out" || fail "no final test evaluation"
    ;;
exit_interval)
    "$cohort" train "${tiny[@]}" --train-iters 50 --exit-interval 3 >"$work/out" 2>&1; rc=$?
    [ $rc -eq 0 ] || fail "exit $rc"
    grep -q "exit-interval reached at iteration 3" "$work/out" || fail "$(tail -3 "$work/out")"
    ! grep -q "iteration        4/" "$work/out" || fail "ran past the exit interval"
    ;;
sigterm)
    "$cohort" train "${tiny[@]}" --train-iters 100000 >"$work/out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q "iteration        2/" "$work/out" && break; sleep 0.1; done
    grep -q "iteration        2/" "$work/out" || fail "no progress within 60 s"
    kill -TERM $pid
    wait $pid; rc=$?
    [ $rc -eq 0 ] || fail "exit $rc after SIGTERM"
    grep -q "stopped by signal after iteration" "$work/out" || fail "no clean stop: $(tail -3 "$work/out")"
    ;;
bad_data)
    printf 'not an index' >"$work/bad.idx"; : >"$work/bad.bin"
    "$cohort" train "${tiny[@]:1}" --data-path "$work/bad" --train-iters 2 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 1 ] || fail "exit $rc, want 1: $(cat "$work/err")"
    grep -q "$work/bad.idx" "$work/err" || fail "error does not name the file: $(cat "$work/err")"
    ;;
data_order)
    "$cohort" data order --mock-data --tokenizer-type NullTokenizer --vocab-size 500 --seq-length 64 \
        --global-batch-size 8 --train-iters 50 --split 98,1,1 --seed 7 --count 20 --data-cache-path "$work/c" \
        >"$work/out" 2>&1 || fail "$(cat "$work/out")"
    PYTHONPATH="$src/tests/data" "$py" - "$work/out" <<'PY' || fail "order differs from numpy's"
import sys, numpy, gpt_order_ref as R
got = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if not l.startswith("#")]
r = R.build(R.mock_lengths(), "98,1,1", 0, 64, 7, 50 * 8)
want = [(i, int(r["sample_index"][r["shuffle_index"][i]][0]), int(r["sample_index"][r["shuffle_index"][i]][1])) for i in range(20)]
if got != want:
    print("got ", got[:5], "\nwant", want[:5]); sys.exit(1)
PY
    ;;
embedded)
    "$cohort" train --train-iters 12 --log-interval 4 --eval-interval 6 --workdir "$work/w" --sample-lines 2 \
        >"$work/out" 2>&1 || fail "$(cat "$work/out")"
    grep -q "running the embedded default job" "$work/out" || fail "no banner"
    [ -s "$work/w/common-licenses.bin" ] && [ -s "$work/w/common-licenses.idx" ] || fail "corpus not written"
    [ "$(grep -c '^  > ' "$work/out")" -eq 2 ] || fail "no samples: $(tail -5 "$work/out")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok $case_name"
