#!/bin/bash
# run_fuzz.sh - build one libFuzzer target with clang (ASan + UBSan) and run it.
#
# usage: tests/fuzz/run_fuzz.sh TARGET SECONDS [SOURCE...] [-- LIBFUZZER_ARG...]
#   TARGET    tests/fuzz/TARGET.c defines LLVMFuzzerTestOneInput
#   SECONDS   -max_total_time (0 = no time limit, e.g. with -- -runs=10000000)
#   SOURCE    extra C files, relative to the source root, compiled into the target
#             (common/error.c and the protoc-c output of protocol/cohort.proto always are)
# If tests/fuzz/TARGET_seeds.c exists it is built with the same sources and run with the
# corpus directory as its argument to write seeds; tests/fuzz/corpus/TARGET/, if present,
# is added too. The project's meson compiler is gcc, so this script drives clang itself.
# Environment: COHORT_FUZZ_WORK (build/corpus/crash dir; default a temporary one, removed
# afterwards unless something crashed), CLANG (default clang), PROTOC_C (default protoc-c),
# PROTOBUF_C_SRC (protobuf-c's protobuf-c/protobuf-c.c: compiled in, instrumented, instead of
# linking the system library, so the fuzzer also sees coverage inside protobuf-c's parser).
# Exits 77 (meson's "skipped") when clang, its fuzzer runtime or protoc-c is missing.
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '4,8p' "$0" >&2
    exit 2
fi
target=$1
seconds=$2
shift 2
srcs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do srcs+=("$1"); shift; done
[ $# -gt 0 ] && shift
fuzz_args=("$@")

root=$(cd "$(dirname "$0")/../.." && pwd)
CLANG=${CLANG:-clang}
PROTOC_C=${PROTOC_C:-protoc-c}
for tool in "$CLANG" "$PROTOC_C"; do
    command -v "$tool" >/dev/null || { echo "skip: $tool not found"; exit 77; }
done
[ -f "$root/tests/fuzz/$target.c" ] || { echo "no tests/fuzz/$target.c" >&2; exit 2; }

if [ -n "${COHORT_FUZZ_WORK:-}" ]; then
    work=$COHORT_FUZZ_WORK
    mkdir -p "$work"
    keep=1
else
    work=$(mktemp -d /tmp/cohort-fuzz.XXXXXX)
    keep=0
fi
cleanup() { [ "$keep" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT

# Generated code goes to the work dir, never into the source tree.
mkdir -p "$work/gen/protocol" "$work/corpus" "$work/artifacts"
"$PROTOC_C" --proto_path="$root/protocol" --c_out="$work/gen/protocol" "$root/protocol/cohort.proto"

common=("$root/common/error.c" "$work/gen/protocol/cohort.pb-c.c")
for s in "${srcs[@]}"; do common+=("$root/$s"); done
cflags=(-std=gnu17 -D_GNU_SOURCE -g -O1 -I"$root" -I"$work/gen" -Wall -Wextra)
libs=(-lprotobuf-c -lm)
if [ -n "${PROTOBUF_C_SRC:-}" ]; then
    common+=("$PROTOBUF_C_SRC")
    libs=(-lm)
fi

# Probe the fuzzer runtime (Debian: libclang-rt-*-dev).
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
    >"$work/probe.c"
if ! "$CLANG" -fsanitize=fuzzer "$work/probe.c" -o "$work/probe" 2>/dev/null; then
    echo "skip: $CLANG cannot link -fsanitize=fuzzer (install libclang-rt-dev)"
    exit 77
fi

echo "building $target"
"$CLANG" "${cflags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "$root/tests/fuzz/$target.c" "${common[@]}" "${libs[@]}" -o "$work/$target"

if [ -f "$root/tests/fuzz/${target}_seeds.c" ]; then
    "$CLANG" "${cflags[@]}" -fsanitize=address,undefined \
        "$root/tests/fuzz/${target}_seeds.c" "${common[@]}" "${libs[@]}" -o "$work/${target}_seeds"
    "$work/${target}_seeds" "$work/corpus"
fi
if [ -d "$root/tests/fuzz/corpus/$target" ]; then
    cp -n "$root/tests/fuzz/corpus/$target"/* "$work/corpus/" 2>/dev/null || true
fi

args=(-artifact_prefix="$work/artifacts/" -print_final_stats=1 -max_len=8192 -rss_limit_mb=2048
      -timeout=10 -error_exitcode=1 -timeout_exitcode=1)
[ "$seconds" != 0 ] && args+=(-max_total_time="$seconds")
echo "running $target for ${seconds}s ${fuzz_args[*]:-}"
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$work/$target" "${args[@]}" "${fuzz_args[@]}" "$work/corpus"
rc=$?
set -e
if [ $rc -ne 0 ]; then
    [ $rc = 77 ] && rc=1 # a failure must never read as meson's "skipped"
    keep=1
    echo "FAILED: $target exited $rc; crash inputs and the binary are in $work" >&2
fi
exit $rc
