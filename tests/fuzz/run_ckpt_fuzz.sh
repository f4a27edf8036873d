#!/bin/bash
# run_ckpt_fuzz.sh - build a checkpoint-parser libFuzzer target with clang (ASan + UBSan)
# and run it for a bounded time. run_fuzz.sh (the protocol decoder's) links protobuf-c and
# not Jansson, so the checkpoint targets have this small sibling.
#
# usage: tests/fuzz/run_ckpt_fuzz.sh TARGET SEED_KIND SECONDS
#   TARGET     tests/fuzz/TARGET.c (fuzz_ck_manifest | fuzz_ck_safetensors)
#   SEED_KIND  manifest | safetensors (seeds written by tests/fuzz/fuzz_ck_seeds.c)
# Environment: COHORT_FUZZ_WORK (work dir, kept; default a temporary one, removed unless
# something crashed), CLANG (default clang). Exits 77 (meson's "skipped") without clang or
# its fuzzer runtime.
set -euo pipefail
[ $# -eq 3 ] || { sed -n '6,8p' "$0" >&2; exit 2; }
target=$1; kind=$2; seconds=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null || { echo "skip: $CLANG not found"; exit 77; }
if [ -n "${COHORT_FUZZ_WORK:-}" ]; then work=$COHORT_FUZZ_WORK; mkdir -p "$work"; keep=1
else work=$(mktemp -d /tmp/cohort-ckfuzz.XXXXXX); keep=0; fi
trap '[ "$keep" = 1 ] || rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$work/probe.c"
"$CLANG" -fsanitize=fuzzer "$work/probe.c" -o "$work/probe" 2>/dev/null ||
    { echo "skip: $CLANG cannot link -fsanitize=fuzzer (install libclang-rt-dev)"; exit 77; }

srcs=("$root/checkpoint/format.c" "$root/common/error.c")
cflags=(-std=gnu17 -D_GNU_SOURCE -g -O1 -I"$root" -Wall -Wextra)
echo "building $target"
"$CLANG" "${cflags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "$root/tests/fuzz/$target.c" "${srcs[@]}" -ljansson -o "$work/$target"
"$CLANG" "${cflags[@]}" "$root/tests/fuzz/fuzz_ck_seeds.c" "${srcs[@]}" -ljansson -o "$work/seeds"
"$work/seeds" "$kind" "$work/corpus"

echo "running $target for ${seconds}s"
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$work/$target" -artifact_prefix="$work/artifacts/" -print_final_stats=1 -max_len=16384 \
    -rss_limit_mb=2048 -timeout=10 -error_exitcode=1 -timeout_exitcode=1 -max_total_time="$seconds" "$work/corpus"
rc=$?
set -e
if [ $rc -ne 0 ]; then
    [ $rc = 77 ] && rc=1
    keep=1
    echo "FAILED: $target exited $rc; crash inputs and the binary are in $work" >&2
fi
exit $rc
