#!/usr/bin/env bash
# run.sh - the verdict of a GPU machine on the CUDA path, in under eight minutes, from a build
# made beforehand elsewhere (tests/gpu/prepare.sh -> gpu-bundle.tar.gz in the source root):
# nothing is compiled here. Steps:
#   1. the machine: nvidia-smi sees a GPU; its driver supports the CUDA version the bundle
#      was built with (else FAIL before anything runs: an older driver would make every
#      test skip); cuBLAS and NCCL libraries are found;
#   2. the gpu suite from the bundle's manifest, one test at a time: the kernel parity tests,
#      the model, MoE, tensor-parallel and NCCL tests, training against the CPU backend. With
#      a GPU present a test that skips (exit 77) is a FAILURE; tests that need more GPUs than
#      the machine has are listed as not run;
#   3. the benchmark (GPT-2 124M, bf16, sequence 1024): tokens/s and model FLOP utilisation
#      against the cuBLAS bf16 rate measured in the same run, on the same GPU.
# Results go to $OUT (default ./gpu-results); the last line is the verdict:
#   VERDICT: PASS ... | VERDICT: FAIL ... | VERDICT: NO GPU ...
# Exit status: 0 pass, 1 a test failed, 2 no bundle or an unusable machine, 3 no GPU.
#   OUT=/some/dir tests/gpu/run.sh        # GPU_BUNDLE=... names another bundle file
set -uo pipefail
S=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$PWD/gpu-results}
bundle=${GPU_BUNDLE:-$S/gpu-bundle.tar.gz}
deadline=${GPU_DEADLINE_S:-450} # the tests and the benchmark together
mkdir -p "$out"
t0=$SECONDS
log() { echo "[run.sh +$((SECONDS - t0))s] $*" | tee -a "$out/run.log" >&2; }
verdict() { # STATUS TEXT...: the last line, then exit
    local rc=$1
    shift
    echo "VERDICT: $*" | tee -a "$out/run.log"
    exit "$rc"
}

[ -f "$bundle" ] || verdict 2 "FAIL: no bundle at $bundle: run tests/gpu/prepare.sh on a build machine first and copy the file with the tree"
U=$(mktemp -d /tmp/cohort-gpu.XXXXXX)
tar -C "$U" -xzf "$bundle" || verdict 2 "FAIL: cannot unpack $bundle"
B=$U/bin
built_cuda=$(cat "$U/cuda-version")
log "bundle: $(cat "$U/source"), CUDA $built_cuda, $(cat "$U/gpu-arch"), $(wc -l <"$U/tests.tsv") tests"

# ---- 1. the machine
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    [ -d "$d" ] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done
# NCCL where pip's nvidia-nccl wheel puts it, when no system copy exists
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2 && [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
    nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$nccl_dir" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$nccl_dir
fi
export LD_LIBRARY_PATH=$U/lib:$LD_LIBRARY_PATH
export COHORT_CUDA_MODULE=$B/libcohort_cuda.so COHORT_SOURCE_ROOT=$S COHORT_BUILD_ROOT=$B OMP_NUM_THREADS=2 B S

{ nvidia-smi; echo; ldd "$B/libcohort_cuda.so"; } >"$out/machine.txt" 2>&1
if ! nvidia-smi -L >"$out/gpus.txt" 2>&1 || ! grep -q "^GPU " "$out/gpus.txt"; then
    log "no GPU: nvidia-smi -L: $(head -1 "$out/gpus.txt")"
    # a dry run: the bundle's programs find every library but CUDA's own, and start
    missing=$(find "$B" -type f -perm -u+x -o -name '*.so' | xargs -r ldd 2>/dev/null | grep "not found" |
        awk '{print $1}' | grep -vE '^lib(cuda|cudart|cublas|cublasLt|nccl)\.' | sort -u | paste -sd' ')
    [ -z "$missing" ] || verdict 2 "FAIL: the bundle lacks libraries: $missing"
    if [ -x "$B/cohort" ]; then
        "$B/cohort" --version >"$out/version.txt" 2>&1 || verdict 2 "FAIL: the bundle's cohort does not start: $(head -2 "$out/version.txt")"
        log "the bundle's cohort starts: $(head -1 "$out/version.txt")"
    fi
    log "dry run: the bundle unpacks ($(du -sk "$U" | cut -f1) KiB) and its tests would be:"
    cut -f1,2 "$U/tests.tsv" | sed 's/\t/ (timeout /; s/$/ s)/' | tee -a "$out/run.log" >&2
    n=$(wc -l <"$U/tests.tsv")
    rm -rf "$U"
    verdict 3 "NO GPU: nothing was run (nvidia-smi sees no GPU); the bundle and its $n tests are ready"
fi
ngpu=$(grep -c "^GPU " "$out/gpus.txt")
gpu_name=$(sed -n '1s/^GPU 0: \(.*\) (UUID.*/\1/p' "$out/gpus.txt")
driver_cuda=$(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' "$out/machine.txt" | head -1)
log "$ngpu GPU(s): $gpu_name; the driver supports CUDA ${driver_cuda:-?}; the bundle needs $built_cuda"
older() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ] && [ "$1" != "$2" ]; }
if [ -z "$driver_cuda" ] || older "${driver_cuda%.*}" "${built_cuda%.*}"; then
    verdict 2 "FAIL: the driver supports CUDA ${driver_cuda:-unknown}, older than the CUDA $built_cuda the bundle was built with: update the driver or prepare the bundle with that CUDA"
fi
if grep -q "not found" "$out/machine.txt"; then
    verdict 2 "FAIL: libraries missing for the CUDA module: $(grep 'not found' "$out/machine.txt" | awk '{print $1}' | paste -sd' ')"
fi

# ---- 2. the gpu suite
pass=0 fail=0 failed=() notrun=()
while IFS=$'\t' read -r name timeout cmd; do
    if [ "$name" = gpu_train_local_rank ] && [ "$ngpu" -lt 2 ]; then
        notrun+=("$name (needs 2 GPUs)")
        continue
    fi
    left=$((deadline - 60 - (SECONDS - t0)))
    if [ $left -lt 20 ]; then
        notrun+=("$name (out of time)")
        fail=$((fail + 1)) failed+=("$name:not-run")
        continue
    fi
    [ "$timeout" -gt "$left" ] && timeout=$left
    s=$SECONDS
    (cd "$out" && eval "timeout $timeout $cmd") >"$out/$name.log" 2>&1
    rc=$?
    case $rc in
    0) pass=$((pass + 1)) r=ok ;;
    77) fail=$((fail + 1)) failed+=("$name:skipped") r="SKIPPED (a failure on a GPU machine)" ;;
    124) fail=$((fail + 1)) failed+=("$name:timeout") r="TIMEOUT after $timeout s" ;;
    *) fail=$((fail + 1)) failed+=("$name:exit-$rc") r="FAIL (exit $rc)" ;;
    esac
    log "$name: $r in $((SECONDS - s)) s"
    [ $rc -eq 0 ] || tail -15 "$out/$name.log" | sed 's/^/    /' >&2
done <"$U/tests.tsv"

# ---- 3. the benchmark
left=$((deadline - (SECONDS - t0)))
bench="not run (no time left)"
if [ $left -gt 30 ]; then
    timeout $((left - 5)) "$B/bench/gpu_bench" --micro "${BENCH_MICRO:-16}" --json >"$out/bench.json" 2>"$out/bench.err"
    brc=$?
    if [ $brc -eq 0 ]; then
        bench=$(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("%.0f tokens/s, %.1f model TFLOP/s, MFU %.1f%% of the cuBLAS bf16 rate measured here (%.0f TFLOP/s), device memory %.1f GiB, GPU time: attention %.0f%%, products %.0f%%, elementwise %.0f%%, memory %.0f%%, communication none (one GPU)" % (d["tokens_per_s"], d["model_tflops"], 100 * d["mfu"], d["matmul_bf16_tflops"], d["gpu_mem_used_gib"], 100 * d.get("attention_share", 0), 100 * d.get("products_share", 0), 100 * d.get("elementwise_share", 0), 100 * d.get("memory_share", 0)))' "$out/bench.json" 2>/dev/null || echo "see bench.json")
    else
        bench="failed (exit $brc, bench.err)"
    fi
fi
log "benchmark: $bench"
# PyTorch eager on the same model and step, where torch with CUDA is installed (bench/gpu_torch.py)
left=$((deadline - (SECONDS - t0)))
if [ $left -gt 60 ] && [ -f "$S/bench/gpu_torch.py" ] &&
    python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    timeout $((left - 5)) python3 "$S/bench/gpu_torch.py" --micro "${BENCH_MICRO:-16}" --modes eager \
        >"$out/torch.json" 2>"$out/torch.err" &&
        log "PyTorch eager: $(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("%.0f tokens/s, %.1f model TFLOP/s" % (d["tokens_per_s"], d["model_tflops"]))' "$out/torch.json" 2>/dev/null || echo "see torch.json")" ||
        log "PyTorch eager: failed (torch.err)"
else
    log "PyTorch eager: not run (no torch with CUDA here, or no time left)"
fi
rm -rf "$U"
summary="$pass passed, $fail failed on $gpu_name (driver CUDA $driver_cuda, built with $built_cuda) in $((SECONDS - t0)) s; benchmark: $bench"
[ ${#notrun[@]} -eq 0 ] || summary="$summary; not run: ${notrun[*]}"
[ $fail -eq 0 ] && [ $pass -gt 0 ] && verdict 0 "PASS: $summary"
verdict 1 "FAIL: ${failed[*]}; $summary"
