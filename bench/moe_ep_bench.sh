#!/usr/bin/env bash
# moe_ep_bench.sh - expert parallelism in a training job: a small MoE GPT
# (2 layers, both MoE: 8 experts, top-2, hidden 256, expert hidden 1024, GELU, sequence 256)
# trained by `cohort train` on 2 ranks as data parallelism (ep 1: every rank computes every
# expert) and as ep 2 with each dispatcher. Per configuration: tokens per second (the whole
# job's), the share of the logging rank's step time in dispatch and combine (the exchanges and
# the sorting of rows: moe_ep_dispatch_s in the metrics), and the bytes that rank sent to its
# expert group per iteration (moe_ep_bytes_sent) against the analytic volume: allgather's is
# fixed by the shapes, alltoall's depends on the routing (given for balanced routing; the
# layer-level benchmark, bench/moe_bench.c, checks the exact one); the logging rank's
# parameters and peak resident memory (expert parallelism's point: E/ep experts per rank).
#
#   bench/moe_ep_bench.sh [iterations] [repeats]     (after deploy/setup.sh build)
# Micro batch 2 (512 tokens), global batch 8 (2 micro batches per rank), one thread per rank,
# mock data. Iterations 3..N count; the median over repeats (interleaved). The output starts
# with the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-12}
reps=${2:-3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args=(--device cpu --mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 256
      --num-attention-heads 4 --seq-length 256 --micro-batch-size 2 --global-batch-size 8 --lr 1e-4
      --disable-bias-linear --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 --moe-aux-loss-coeff 1e-2
      --train-iters "$iters" --log-interval 1 --eval-iters 0 --split 1,0,0 --threads 1 --nproc-per-node 2
      --data-cache-path "$work/cache")
/usr/bin/python3 bench/cpuinfo.py
echo
for r in $(seq "$reps"); do
    for mode in ep1 ep2_alltoall ep2_allgather; do
        extra=()
        case $mode in
        ep2_alltoall) extra=(--expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall);;
        ep2_allgather) extra=(--expert-model-parallel-size 2 --moe-token-dispatcher-type allgather);;
        esac
        build/cohort train "${args[@]}" "${extra[@]}" --metrics-file "$work/$mode-$r.jsonl" >"$work/$mode-$r.out" 2>&1 \
            || { tail -5 "$work/$mode-$r.out"; exit 1; }
    done
done
/usr/bin/python3 - "$work" "$reps" <<'PY'
import json, re, statistics, sys
w, reps = sys.argv[1], int(sys.argv[2])
N, h, E, k, P, layers, micro = 512, 256, 8, 2, 2, 2, 2   # tokens per micro batch, ..., micro batches per rank
tokens_per_iter = 8 * 256
def run(mode, r):
    rows = [x for x in map(json.loads, open(f"{w}/{mode}-{r}.jsonl")) if "elapsed_ms_per_iteration" in x][2:]
    ms = statistics.mean(x["elapsed_ms_per_iteration"] for x in rows)
    disp = statistics.mean(x.get("moe_ep_dispatch_s", 0) * 1e3 for x in rows)
    sent = statistics.mean(x.get("moe_ep_bytes_sent", 0) for x in rows)
    rss = max(x["max_rss_bytes"] for x in rows) / 2**20
    out = open(f"{w}/{mode}-{r}.out").read()
    params = int(re.search(r"model (\d+) parameters", out).group(1))
    return ms, disp, sent, rss, params
per = layers * micro   # MoE forward+backward passes per iteration per rank
analytic = {"ep1": 0,
            "ep2_alltoall": per * (4.0 * N * k * (P - 1) / P * h * 4 + (P - 1) * (E // P) * 4),
            "ep2_allgather": per * (P - 1) * (N * (h + E) * 4 + N * E + 3.0 * N * h * 4 + N * E * 8)}
print("| layout | tokens/s: median of runs (min-max) | dispatch + combine, ms/iteration (share of the step) | "
      "bytes sent per iteration (logging rank) | analytic | parameters per rank | peak RSS of the logging rank (MiB) |")
print("|---|---|---|---|---|---|---|")
for mode in ("ep1", "ep2_alltoall", "ep2_allgather"):
    res = [run(mode, r) for r in range(1, reps + 1)]
    tps = sorted(tokens_per_iter / (x[0] / 1e3) for x in res)
    ms = statistics.median(x[0] for x in res)
    disp = statistics.median(x[1] for x in res)
    sent = statistics.median(x[2] for x in res)
    a = analytic[mode]
    note = "" if mode != "ep2_alltoall" else " (balanced routing)"
    print(f"| {mode.replace('_', ', ')} | {statistics.median(tps):.0f} ({tps[0]:.0f}-{tps[-1]:.0f}) | "
          f"{disp:.1f} ({100 * disp / ms:.0f}%) | {sent:,.0f} | {a:,.0f}{note} | {res[0][4]:,} | "
          f"{statistics.median(x[3] for x in res):.0f} |")
PY
