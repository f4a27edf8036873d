#!/usr/bin/env bash
# cp_bench.sh - context parallelism on this machine's cores: one model at
# a long sequence through `cohort train` at cp 1 (one process, 2 threads) and cp 2 (2
# processes x 1 thread, the ring over them), same batches, fp32, dropout off. Per
# configuration: tokens/s (the median of the iterations after the first) and each rank's
# peak resident memory; the activation memory is that peak minus the peak of the same run at
# a short sequence (parameters, gradients, Adam moments and the runtime, which do not grow
# with the sequence), per rank. The two long runs are repeated ROUNDS times, interleaved, and
# each configuration's best and median round are printed (a machine shared with other work
# slows single rounds unevenly; the best rounds are the closest to a quiet machine).
#   bench/cp_bench.sh [COHORT] [SEQ] [ITERS] [ROUNDS]      (defaults build/cohort, 4096, 3, 3)
set -uo pipefail
cohort=${1:-build/cohort}
seq=${2:-4096}
iters=${3:-3}
rounds=${4:-3}
short=256
work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-cpbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
M=(--mock-data --tokenizer-type NullTokenizer --vocab-size 4096 --num-layers 4 --hidden-size 256
   --num-attention-heads 4 --position-embedding-type rope --micro-batch-size 1 --global-batch-size 1 --lr 1e-4
   --train-iters "$iters" --log-interval 1 --eval-iters 0 --attention-dropout 0 --hidden-dropout 0 --device cpu
   --data-cache-path "$work/cache")
export COHORT_TEST_PEAK_RSS=1
peak() { # OUT: the ranks' peak resident memory in MB, space separated, by rank
    grep -o "cohort rank [0-9]*: peak resident memory [0-9]* MB" "$1" | sort -k3,3n | awk '{print $7}' | paste -sd' '
}
run() { # NAME SEQ ARGS...
    local name=$1 s=$2; shift 2
    "$cohort" train "${M[@]}" --seq-length "$s" --max-position-embeddings "$s" --metrics-file "$work/$name.jsonl" "$@" \
        >"$work/$name.out" 2>&1 || { echo "$name: exit $? $(tail -3 "$work/$name.out")" >&2; return 1; }
}
cp1=(--nproc-per-node 1 --threads 2)
cp2=(--nproc-per-node 2 --context-parallel-size 2 --threads 1)
for r in $(seq "$rounds"); do
    run "cp1-$r" "$seq" "${cp1[@]}" && run "cp2-$r" "$seq" "${cp2[@]}" || exit 1
done
run cp1s "$short" "${cp1[@]}" && run cp2s "$short" "${cp2[@]}" || exit 1
/usr/bin/python3 - "$work" "$seq" "$short" "$rounds" <<'PY'
import json, re, statistics, sys
w, seq, short, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def tok(n):
    rows = [json.loads(l) for l in open(f"{w}/{n}.jsonl") if '"tokens_per_second"' in l]
    return statistics.median(r["tokens_per_second"] for r in rows[1:]) if len(rows) > 1 else rows[0]["tokens_per_second"]
def rss(n):
    out = {}
    for l in open(f"{w}/{n}.out"):
        m = re.search(r"cohort rank (\d+): peak resident memory (\d+) MB", l)
        if m: out[int(m.group(1))] = int(m.group(2))
    return [out[k] for k in sorted(out)]
t1 = [tok(f"cp1-{r}") for r in range(1, rounds + 1)]
t2 = [tok(f"cp2-{r}") for r in range(1, rounds + 1)]
r1, r2, s1, s2 = rss("cp1-1"), rss("cp2-1"), rss("cp1s"), rss("cp2s")
a1 = [a - b for a, b in zip(r1, s1)]
a2 = [a - b for a, b in zip(r2, s2)]
print(f"sequence {seq}, {rounds} rounds (activation memory: peak minus the peak at sequence {short})")
print("rounds, tokens/s: cp 1 " + " ".join(f"{x:.0f}" for x in t1) + "; cp 2 " + " ".join(f"{x:.0f}" for x in t2))
print("| run | tokens/s best (median) | peak memory per rank (MB) | activation memory per rank (MB) |")
print("|---|---|---|---|")
print(f"| cp 1, 2 threads | {max(t1):.0f} ({statistics.median(t1):.0f}) | {' / '.join(map(str, r1))} | {' / '.join(map(str, a1))} |")
print(f"| cp 2, 1 thread each | {max(t2):.0f} ({statistics.median(t2):.0f}) | {' / '.join(map(str, r2))} | {' / '.join(map(str, a2))} |")
print(f"cp 2 / cp 1: tokens/s {max(t2) / max(t1):.2f} best to best (median to median {statistics.median(t2) / statistics.median(t1):.2f}), "
      f"activation memory per rank {max(a2) / max(a1):.2f} (worst rank)")
PY
