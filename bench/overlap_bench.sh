#!/usr/bin/env bash
# overlap_bench.sh - --overlap-grad-reduce against the reduction after the backward, with the
# replicated optimizer and with the distributed one, at data 2 and tensor 2 x data 2 (the
# communication thread on the gradient group's own transport) on this machine: the step time,
# and the reduction's exposed time (the timeline's dp_reduce record: the step's wait for the
# gradient reduction; without overlap the whole reduction, i.e. its communication time C; with
# overlap, what is still in flight after the backward plus the average and the norm, E) from
# which the share of the communication hidden behind the backward is (C - E) / C.
#
#   bench/overlap_bench.sh [iterations] [repeats]     (after deploy/setup.sh build)
# Model: bench/dopt_bench.sh's (6 layers, hidden 512, 8 heads, sequence 64, vocabulary 500:
# 19.2 M parameters), --ddp-bucket-size 1000000 (20 buckets; the default would make one
# bucket, which cannot start before the backward ends), micro batch 1, global batch 8, mock
# data, one thread per rank. Each configuration runs `repeats` times, interleaved; numbers
# are medians over runs of the means of iterations 3..N. The output starts with the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-10}
reps=${2:-3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args=(--device cpu --mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 6 --hidden-size 512
      --num-attention-heads 8 --seq-length 64 --micro-batch-size 1 --global-batch-size 8 --lr 1e-4
      --train-iters "$iters" --log-interval 1 --eval-iters 0 --split 1,0,0 --threads 1
      --ddp-bucket-size 1000000 --data-cache-path "$work/cache")
/usr/bin/python3 bench/cpuinfo.py
echo
# layouts: "dp2" (2 ranks), "tp2dp2" (4 ranks, --tensor-model-parallel-size 2)
for r in $(seq "$reps"); do
    for lay in dp2 tp2dp2; do
        n=2 tp=(); [ $lay = tp2dp2 ] && n=4 tp=(--tensor-model-parallel-size 2)
        for mode in replicated replicated_ovl dopt dopt_ovl; do
            extra=()
            case $mode in
            replicated_ovl) extra=(--overlap-grad-reduce);;
            dopt) extra=(--use-distributed-optimizer);;
            dopt_ovl) extra=(--use-distributed-optimizer --overlap-grad-reduce);;
            esac
            name=$mode-$lay-$r
            build/cohort train "${args[@]}" --nproc-per-node $n "${tp[@]}" "${extra[@]}" --timeline-dir "$work/$name.tl" \
                --metrics-file "$work/$name.jsonl" >"$work/$name.out" 2>&1 || { tail -5 "$work/$name.out"; exit 1; }
        done
    done
done
/usr/bin/python3 - "$work" "$reps" <<'PY'
import glob, json, statistics, sys
w, reps = sys.argv[1], int(sys.argv[2])
def run(name):
    rows = [x for x in map(json.loads, open(f"{w}/{name}.jsonl")) if "elapsed_ms_per_iteration" in x]
    ms = statistics.mean(x["elapsed_ms_per_iteration"] for x in rows[2:])
    red = []
    for f in glob.glob(f"{w}/{name}.tl/timeline-rank-*.jsonl"):
        red += [(x["t1"] - x["t0"]) / 1000 for x in map(json.loads, open(f)) if x.get("k") == "dp_reduce" and x["it"] > 2]
    return ms, statistics.mean(red)
print("| layout | optimizer | overlap | ms/iteration (median of runs) | reduction exposed, ms/iteration | hidden |")
print("|---|---|---|---|---|---|")
for n in ("dp2", "tp2dp2"):
    for opt in ("replicated", "dopt"):
        base = [run(f"{opt}-{n}-{r}") for r in range(1, reps + 1)]
        ovl = [run(f"{opt}_ovl-{n}-{r}") for r in range(1, reps + 1)]
        bms, bred = statistics.median(x[0] for x in base), statistics.median(x[1] for x in base)
        oms, ored = statistics.median(x[0] for x in ovl), statistics.median(x[1] for x in ovl)
        label = "replicated" if opt == "replicated" else "distributed"
        print(f"| {n} | {label} | no | {bms:.1f} | {bred:.1f} | |")
        print(f"| {n} | {label} | yes | {oms:.1f} ({100 * (oms / bms - 1):+.1f}%) | {ored:.1f} | "
              f"{100 * (1 - ored / bred):.0f}% |")
PY
