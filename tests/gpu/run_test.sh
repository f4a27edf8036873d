#!/usr/bin/env bash
# run_test.sh - tests/gpu/run.sh's verdict, on a made-up bundle and a stand-in nvidia-smi (no
# GPU needed): a driver older than the bundle's CUDA fails before any test runs; on a machine
# with a GPU a test that skips (exit 77) is a failure, never a pass; all passing is a PASS;
# without a GPU it is a dry run that names the tests. One case per meson test.
#   run_test.sh CASE       CASE: old_driver | skip_fails | pass | no_gpu
case_name=$1
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
workdir gpurun

mkdir -p "$work/b/bin" "$work/b/lib" "$work/path"
echo 13.0 >"$work/b/cuda-version"
echo sm_90 >"$work/b/gpu-arch"
echo "test bundle" >"$work/b/source"
printf '#!/bin/sh\nexit 0\n' >"$work/b/bin/passes"
printf '#!/bin/sh\necho "skip: no usable GPU" >&2; exit 77\n' >"$work/b/bin/skips"
chmod +x "$work/b/bin/"*
{
    printf 'gpu_one\t30\t"$B/passes"\n'
    [ "$case_name" = skip_fails ] && printf 'gpu_two\t30\t"$B/skips"\n'
} >"$work/b/tests.tsv"
tar -C "$work/b" -czf "$work/bundle.tar.gz" .

driver=13.0
[ "$case_name" = old_driver ] && driver=12.4
if [ "$case_name" != no_gpu ]; then
    cat >"$work/path/nvidia-smi" <<SMI
#!/bin/sh
[ "\$1" = -L ] && { echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; exit 0; }
echo "| NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: $driver |"
SMI
    chmod +x "$work/path/nvidia-smi"
fi
# no nvidia-smi of this machine's own, if it has one
PATH="$work/path:/usr/bin:/bin" OUT="$work/out" GPU_BUNDLE="$work/bundle.tar.gz" \
    bash "$COHORT_SOURCE_ROOT/tests/gpu/run.sh" >"$work/stdout" 2>"$work/stderr"
rc=$?
last=$(tail -1 "$work/stdout")
echo "exit $rc: $last" >&2
case $case_name in
old_driver)
    [ $rc -eq 2 ] || fail "exit $rc, want 2"
    [[ $last == "VERDICT: FAIL: the driver supports CUDA 12.4, older than the CUDA 13.0"* ]] || fail "verdict: $last"
    [ ! -f "$work/out/gpu_one.log" ] || fail "a test ran with a driver older than the runtime"
    ;;
skip_fails)
    [ $rc -eq 1 ] || fail "exit $rc, want 1"
    [[ $last == "VERDICT: FAIL: gpu_two:skipped; 1 passed, 1 failed on NVIDIA H100 80GB HBM3"* ]] || fail "verdict: $last"
    grep -q "gpu_two: SKIPPED (a failure on a GPU machine)" "$work/stderr" || fail "no skip line: $(cat "$work/stderr")"
    ;;
pass)
    [ $rc -eq 0 ] || fail "exit $rc, want 0: $(cat "$work/stderr")"
    [[ $last == "VERDICT: PASS: 1 passed, 0 failed on NVIDIA H100 80GB HBM3 (driver CUDA 13.0, built with 13.0)"* ]] ||
        fail "verdict: $last"
    ;;
no_gpu)
    [ $rc -eq 3 ] || fail "exit $rc, want 3"
    [[ $last == "VERDICT: NO GPU: nothing was run"*"its 1 tests are ready" ]] || fail "verdict: $last"
    grep -q "^gpu_one (timeout 30 s)" "$work/stderr" || fail "the dry run does not list the tests: $(cat "$work/stderr")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name" >&2
