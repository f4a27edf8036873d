#!/usr/bin/env bash
# run.sh - the training-step benchmark: configs A and B, cohort fp32 and bf16
# beside PyTorch (Debian's python3-torch on Debian's OpenBLAS) in one run.
#
#   bench/run.sh [steps]        prints JSON lines, then the CPU, PyTorch's OpenBLAS core and a
#                               markdown table for docs/benchmarks.md
#
# OpenBLAS picks its kernels by the CPU it detects and is left to do so; only where it falls
# back to kernels without AVX2 (an unrecognised model, e.g. a recent Xeon it calls Prescott)
# is OPENBLAS_CORETYPE forced, by the CPU's flags: SkylakeX with avx512f, Haswell with avx2
# (bench/cpuinfo.py --openblas-coretype). An OPENBLAS_CORETYPE set by the caller is kept.
# Every JSON line records the CPU (model name, avx2/avx512f/avx512_bf16/amx_bf16); PyTorch's
# also the OpenBLAS library and core it ran on.
#
# Installs the benchmark-only packages (python3-torch, OpenBLAS for it) if missing; builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-5}
need=()
for p in python3-torch libopenblas0-pthread; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null
fi
bash deploy/setup.sh build
py=/usr/bin/python3  # Debian's python, where python3-torch lives
out=$(mktemp)
cpu_line=$($py bench/cpuinfo.py)
echo "$cpu_line" >&2
coretype=$($py bench/cpuinfo.py --openblas-coretype 2>"$out.blas") || { cat "$out.blas" >&2; exit 1; }
cat "$out.blas" >&2
torch_env=()
[ -n "$coretype" ] && torch_env=("OPENBLAS_CORETYPE=$coretype")
A="--layers 4 --hidden 256 --heads 4 --seq 256 --micro 4 --vocab 50257"
B="--layers 12 --hidden 768 --heads 12 --seq 256 --micro 4 --vocab 50257"
for cfg in A B; do
    args=${!cfg}
    echo "config $cfg: cohort fp32" >&2
    echo "{\"config\":\"$cfg\",\"impl\":\"cohort fp32\",\"r\":$(build/bench/bench_train $args --steps "$steps" --json)}" | tee -a "$out"
    echo "config $cfg: cohort bf16" >&2
    # refused (exit 3) where the CPU has no bf16 matrix instructions: the row says so
    if r=$(build/bench/bench_train $args --steps "$steps" --bf16 --json 2>"$out.bf16"); then
        echo "{\"config\":\"$cfg\",\"impl\":\"cohort bf16\",\"r\":$r}" | tee -a "$out"
    else
        rc=$?; cat "$out.bf16" >&2
        [ "$rc" -eq 3 ] || exit 1
    fi
    echo "config $cfg: pytorch fp32" >&2
    echo "{\"config\":\"$cfg\",\"impl\":\"pytorch fp32\",\"r\":$(env "${torch_env[@]}" $py bench/torch_ref.py $args --steps "$steps" --json)}" | tee -a "$out"
done
$py - "$out" "$cpu_line" "$out.blas" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {r["config"]: r["r"] for r in rows if r["impl"] == "pytorch fp32"}
print()
print(sys.argv[2])
print(open(sys.argv[3]).read().strip())  # what OpenBLAS detected, and whether a core was forced
for r in rows:
    if r["impl"] == "pytorch fp32":
        b = r["r"]["blas"]
        print("config %s: PyTorch's BLAS %s, core %s%s" % (r["config"], b["library"], b.get("core", "-"),
              " (forced: OPENBLAS_CORETYPE=%s)" % b["coretype_env"] if b.get("coretype_env") else " (detected)"))
print()
print("| config | implementation | ms/step | tokens/s | × PyTorch fp32 | model GFLOP/s | library fp32 GFLOP/s (model shapes) | model / library | peak RSS MB |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    x, b = r["r"], base[r["config"]]
    lib = x.get("library_fp32_gflops", 0)
    eff = "%.0f%%" % (100 * x["model_gflops"] / lib) if lib else "—"
    print("| %s | %s | %.1f | %.1f | %.2f× | %.1f | %s | %s | %d |" % (
        r["config"], r["impl"], x["ms_per_step"], x["tokens_per_s"], x["tokens_per_s"] / b["tokens_per_s"],
        x["model_gflops"], "%.1f" % lib if lib else "—", eff, x["peak_rss_mb"]))
PY
rm -f "$out" "$out.blas" "$out.bf16"
