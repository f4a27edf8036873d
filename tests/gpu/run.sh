#!/usr/bin/env bash
# run.sh - the one GPU script: on a machine with a CUDA GPU, configure a fresh build with
# CUDA, build, run the gpu test suite, then the GPU benchmark beside PyTorch (eager and
# torch.compile), writing everything under $OUT (default: ./gpu-results). Bounded to about
# 8 minutes by per-step timeouts. Exit status: 0 all tests passed (benchmark numbers are
# reported, never judged), 1 a test failed, 2 the build failed, 3 no GPU.
#
#   OUT=/some/dir tests/gpu/run.sh          # GPU_BUILD_DIR=... to choose the build folder
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$PWD/gpu-results}
build=${GPU_BUILD_DIR:-$root/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
# nvcc and the CUDA libraries where the CUDA toolkit installs them
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$out"
t0=$SECONDS
log() { echo "[run.sh +$((SECONDS - t0))s] $*" | tee -a "$out/run.log" >&2; }

log "cohort GPU run in $root, build $build, results $out"
{ nvidia-smi; nvcc --version; } >"$out/machine.txt" 2>&1
(cd "$root" && git log --oneline -1 && git status --short | head -20) >>"$out/machine.txt" 2>&1
if ! nvidia-smi -L >/dev/null 2>&1; then log "no GPU (nvidia-smi -L failed)"; exit 3; fi

# 1. fresh configure and build (warnings are collected, not fatal: this is the one shot)
rm -rf "$build"
if ! timeout 120 meson setup "$build" -Dcuda=enabled -Dbuildtype=release >"$out/setup.log" 2>&1; then
    log "configure failed:"; tail -25 "$out/setup.log" >&2; exit 2
fi
if ! timeout 300 ninja -C "$build" -j"$jobs" >"$out/build.log" 2>&1; then
    log "build failed:"; grep -E "error|Error" "$out/build.log" | head -30 >&2; exit 2
fi
grep -E -A4 "warning" "$out/build.log" >"$out/build-warnings.txt" || true
log "built ($(grep -c warning "$out/build.log") warning lines, see build-warnings.txt)"

# 2. the gpu suite (one test at a time: they share the GPU)
timeout 330 meson test -C "$build" --suite gpu --num-processes 1 --print-errorlogs >"$out/gpu-tests.log" 2>&1
tests_rc=$?
cp "$build/meson-logs/testlog.txt" "$out/gpu-testlog.txt" 2>/dev/null
grep -E "^ *[0-9]+/[0-9]+ " "$out/gpu-tests.log" | tee "$out/gpu-tests-summary.txt" >&2
log "gpu suite exit status $tests_rc"

# 3. benchmark: cohort (bf16, GPT-2 124M, seq 1024), then PyTorch eager and compiled
bench_micro=${BENCH_MICRO:-16}
timeout 150 "$build/bench/gpu_bench" --micro "$bench_micro" --json >"$out/bench-cohort.json" 2>"$out/bench-cohort.err"
brc=$?
if [ $brc -ne 0 ] && [ $brc -ne 124 ]; then
    log "gpu_bench --micro $bench_micro failed ($brc): retrying with --micro 8"
    bench_micro=8
    timeout 120 "$build/bench/gpu_bench" --micro 8 --json >"$out/bench-cohort.json" 2>>"$out/bench-cohort.err"
fi
cat "$out/bench-cohort.json" >&2
remaining=$((470 - (SECONDS - t0)))
if [ $remaining -gt 30 ]; then
    timeout $remaining python3 "$root/bench/gpu_torch.py" --micro "$bench_micro" >"$out/bench-torch.json" \
        2>"$out/bench-torch.err"
    log "pytorch baseline exit status $? (bench-torch.json)"
    cat "$out/bench-torch.json" >&2
else
    log "no time left for the PyTorch baseline"
fi

# 4. one summary
{
    echo "## cohort GPU run $(date -u +%FT%TZ)"
    head -12 "$out/machine.txt" | grep -E "NVIDIA|Driver|CUDA" | head -3
    echo "### gpu suite (exit $tests_rc)"
    cat "$out/gpu-tests-summary.txt"
    echo "### benchmark"
    cat "$out/bench-cohort.json" "$out/bench-torch.json" 2>/dev/null
} >"$out/summary.md"
log "done in $((SECONDS - t0)) s; summary in $out/summary.md"
[ $tests_rc -eq 0 ] || exit 1
exit 0
