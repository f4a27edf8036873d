#!/usr/bin/env bash
# pp_bench.sh - pipeline parallelism on this machine's cores: GPT-2 124M
# (config B, micro batches of 2 x 256 tokens, fp32, dropout off) through `cohort train` at
# pp 1 (one process, 2 threads) and pp 2 (2 processes x 1 thread) with the 1F1B and the
# interleaved schedule (2 chunks per rank), for m = 4, 8, 16 micro batches per iteration; all
# in one run, interleaved by m. The stages are balanced by a layout: the output layer and
# loss over GPT-2's 50304-row vocabulary cost about 5.4 decoder layers, so 1F1B puts 9 layers
# on the first stage and 3 with the head on the second ("Et*9|t*3L"), interleaving 4, 3, 5
# and the head alone ("Et*4|t*3|t*5|L": 9 layers on rank 0, 3 and the head on rank 1);
# Megatron's even split (6 + 6, and 3 per chunk) is
# measured too at m = 16, to show what the imbalance costs. Per configuration: tokens/s (the median of the
# iterations after the first), the measured bubble of the last iteration (`cohort timeline`:
# (span - busy)/busy per rank) beside Megatron's (p-1)/(v*m), and each rank's peak memory.
#   bench/pp_bench.sh [COHORT] [ITERS]      (defaults build/cohort, 3)
# Prints one line per configuration and a markdown table at the end.
set -uo pipefail
cohort=${1:-build/cohort}
iters=${2:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-ppbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
B=(--mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --num-layers 12 --hidden-size 768
   --num-attention-heads 12 --seq-length 256 --max-position-embeddings 1024 --micro-batch-size 2 --lr 1e-4
   --train-iters "$iters" --log-interval 1 --eval-iters 0 --attention-dropout 0 --hidden-dropout 0 --device cpu
   --data-cache-path "$work/cache")
export COHORT_TEST_PEAK_RSS=1
rows=()
run() { # NAME M ARGS...
    local name=$1 m=$2; shift 2
    local out=$work/$name.out tl=$work/$name.tl
    "$cohort" train "${B[@]}" --global-batch-size $((2 * m)) --metrics-file "$work/$name.jsonl" \
        --timeline-dir "$tl" --timeline-iterations "$iters:$iters" "$@" >"$out" 2>&1 ||
        { echo "$name: exit $? $(tail -3 "$out")" >&2; return; }
    "$cohort" timeline "$tl" --json >"$work/$name.tl.json" 2>/dev/null
    local line
    line=$(/usr/bin/python3 - "$work" "$name" "$m" <<'PY'
import json, re, statistics, sys
w, name, m = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{w}/{name}.jsonl") if '"tokens_per_second"' in l]
tok = statistics.median(r["tokens_per_second"] for r in rows[1:]) if len(rows) > 1 else rows[0]["tokens_per_second"]
tl = json.load(open(f"{w}/{name}.tl.json"))
bub = " / ".join(f"{r['bubble']:.3f}" for r in tl["ranks"])
rss = {}
for l in open(f"{w}/{name}.out"):
    mm = re.search(r"peak resident memory (\d+) MB \(tensor rank \d+, pipeline stage (\d+)\)", l)
    if mm: rss[int(mm.group(2))] = int(mm.group(1))
mem = " / ".join(f"{rss[k]}" for k in sorted(rss))
print(f"{name}|{m}|{tok:.1f}|{tl['formula']:.3f}|{tl['mean_bubble']:.3f} ({bub})|{mem}")
PY
)
    echo "$line"
    rows+=("$line")
}
pp2=(--nproc-per-node 2 --pipeline-model-parallel-size 2 --threads 1)
for m in 4 8 16; do
    run "pp1-m$m" $m --nproc-per-node 1 --threads 2
    run "pp2-1f1b-m$m" $m "${pp2[@]}" --pipeline-model-parallel-layout "Et*9|t*3L"
    run "pp2-vpp2-m$m" $m "${pp2[@]}" --pipeline-model-parallel-layout "Et*4|t*3|t*5|L"
done
run "pp2-1f1b-even-m16" 16 "${pp2[@]}"
run "pp2-vpp2-even-m16" 16 "${pp2[@]}" --num-layers-per-virtual-pipeline-stage 3
echo
echo "| configuration | m | tokens/s | bubble formula (p-1)/(v*m) | measured bubble, mean (per rank) | peak RSS per stage (MB) |"
echo "|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
