#!/usr/bin/env bash
# dopt_bench.sh - the distributed optimizer (--use-distributed-optimizer) against the
# replicated one at data-parallel sizes 2 and 4 on this machine: bytes per parameter per rank
# (from the layout, as the trainer prints it, against Megatron's table: fp32 parameters and
# gradients, replicated 16, sharded 8 + 8/d) and as measured (a rank's peak resident memory:
# its difference to the replicated run per parameter), the step time, and what the redundant
# shard copy (--dist-opt-redundancy, on by default) costs in memory and time.
#
#   bench/dopt_bench.sh [iterations] [repeats]     (after deploy/setup.sh build)
# Model: 6 layers, hidden 512, 8 heads, sequence 64, vocabulary 500 (19.2 M parameters, one
# bucket at Megatron's default bucket size; also with --ddp-bucket-size 1000000, 20 buckets),
# micro batch 1, global batch 4, mock data, one thread per rank. Each configuration runs `repeats` times, interleaved; the step time is
# the median over runs of the mean of iterations 3..N. The output starts with the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-12}
reps=${2:-3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args=(--device cpu --mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 6 --hidden-size 512
      --num-attention-heads 8 --seq-length 64 --micro-batch-size 1 --global-batch-size 4 --lr 1e-4
      --train-iters "$iters" --log-interval 1 --eval-iters 0 --split 1,0,0 --threads 1
      --data-cache-path "$work/cache")
/usr/bin/python3 bench/cpuinfo.py
echo
for r in $(seq "$reps"); do
    for n in 2 4; do
        for mode in replicated dopt dopt_nored dopt_b1m dopt_nored_b1m; do
            extra=()
            case $mode in
            dopt) extra=(--use-distributed-optimizer);;
            dopt_nored) extra=(--use-distributed-optimizer --no-dist-opt-redundancy);;
            dopt_b1m) extra=(--use-distributed-optimizer --ddp-bucket-size 1000000);;
            dopt_nored_b1m) extra=(--use-distributed-optimizer --no-dist-opt-redundancy --ddp-bucket-size 1000000);;
            esac
            build/cohort train "${args[@]}" --nproc-per-node $n "${extra[@]}" \
                --metrics-file "$work/$mode-$n-$r.jsonl" >"$work/$mode-$n-$r.out" 2>&1 \
                || { tail -5 "$work/$mode-$n-$r.out"; exit 1; }
        done
    done
done
/usr/bin/python3 - "$work" "$reps" <<'PY'
import json, re, statistics, sys
w, reps = sys.argv[1], int(sys.argv[2])
def run(mode, n, r):
    rows = [x for x in map(json.loads, open(f"{w}/{mode}-{n}-{r}.jsonl")) if "elapsed_ms_per_iteration" in x]
    out = open(f"{w}/{mode}-{n}-{r}.out").read()
    params = int(re.search(r"model (\d+) parameters", out).group(1))
    m = re.search(r"([0-9.]+) bytes per parameter on this rank", out)
    ms = statistics.mean(x["elapsed_ms_per_iteration"] for x in rows[2:])
    return ms, max(x["max_rss_bytes"] for x in rows), params, float(m.group(1)) if m else 16.0
print("| dp | optimizer | bytes/param (layout) | Megatron's table | peak RSS of the logging rank (MiB) | "
      "RSS saved vs replicated, bytes/param | ms/iteration: median of runs (min-max) | vs replicated |")
print("|---|---|---|---|---|---|---|---|")
for n in (2, 4):
    res = {m: [run(m, n, r) for r in range(1, reps + 1)]
           for m in ("replicated", "dopt", "dopt_nored", "dopt_b1m", "dopt_nored_b1m")}
    base_ms = statistics.median(x[0] for x in res["replicated"])
    base_rss = statistics.median(x[1] for x in res["replicated"])
    plain, red = f"8 + 8/{n} = {8 + 8 / n:g}", f"8 + 8/{n} + 16/{n} = {8 + 24 / n:g}"
    for m, label, table in (("replicated", "replicated", "16"), ("dopt_nored", "distributed", plain),
                            ("dopt", "distributed + redundancy", red),
                            ("dopt_nored_b1m", "distributed, 1M-element buckets", plain),
                            ("dopt_b1m", "distributed + redundancy, 1M-element buckets", red)):
        ms = statistics.median(x[0] for x in res[m])
        rss = statistics.median(x[1] for x in res[m])
        params = res["replicated"][0][2]
        print(f"| {n} | {label} | {res[m][0][3]:.2f} | {table} | {rss / 2**20:.0f} | "
              f"{(base_rss - rss) / params:.2f} | {ms:.1f} ({min(x[0] for x in res[m]):.0f}-"
              f"{max(x[0] for x in res[m]):.0f}) | {100 * (ms / base_ms - 1):+.1f}% |")
PY
