#!/usr/bin/env bash
# prepare.sh - builds, on a machine WITHOUT a GPU, everything tests/gpu/run.sh runs on a GPU
# machine, and packs it into one file that travels with the source tree, so that the GPU
# machine (where time is short) only runs:
#
#   tests/gpu/prepare.sh                 # -> gpu-bundle.tar.gz in the source root (ignored by git)
#   ... copy the source tree and gpu-bundle.tar.gz to the GPU machine, then there:
#   tests/gpu/run.sh                     # verdict in its last line
#
# The build is for sm_90 (H100/H200) only (-Dgpu_sm=90; CUDA_SM=80,90 for more), for a
# generic x86-64 CPU (-Dnative=false: the GPU machine's CPU is not this one), release, in
# build-gpu/. The bundle holds the GPU test programs, cohort, its CUDA module, the GPU
# benchmark, a manifest of the gpu suite's tests (their command lines relative to the bundle
# and the source tree), the CUDA version it was built with, and the shared libraries the
# programs need that a GPU machine's image may lack (oneDNN, ZeroMQ, libuv, ...; not glibc,
# not libstdc++, not cuBLAS or NCCL, which come from the GPU machine's CUDA).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${GPU_BUILD_DIR:-$root/build-gpu}
bundle=${GPU_BUNDLE:-$root/gpu-bundle.tar.gz}
sm=${CUDA_SM:-90}
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
log() { echo "prepare.sh: $*" >&2; }

command -v nvcc >/dev/null || { log "no nvcc: the GPU build needs the CUDA toolkit here (no GPU needed)"; exit 2; }
if [ -f "$build/build.ninja" ]; then
    meson configure "$build" -Dcuda=enabled -Dgpu_sm="$sm" -Dnative=false -Dbuildtype=release >/dev/null
else
    meson setup "$build" -Dcuda=enabled -Dgpu_sm="$sm" -Dnative=false -Dbuildtype=release >/dev/null
fi

# the programs of the gpu suite and what they run (meson's own record of the tests)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson introspect --tests "$build" >"$stage/tests.json"
mapfile -t targets < <(python3 - "$build" "$stage/tests.json" <<'EOF'
import json, os, sys
build, tests = sys.argv[1], json.load(open(sys.argv[2]))
out = {"cohort", "libcohort_cuda.so", "bench/gpu_bench"}
for t in tests:
    if "cohort:gpu" not in t["suite"]:
        continue
    for a in map(os.path.normpath, t["cmd"]):
        if a.startswith(build + "/"):
            out.add(os.path.relpath(a, build))
print("\n".join(sorted(out)))
EOF
)
log "building ${#targets[@]} targets in $build for sm_$sm"
ninja -C "$build" "${targets[@]}" >&2

mkdir -p "$stage/bin" "$stage/lib"
for t in "${targets[@]}"; do
    mkdir -p "$stage/bin/$(dirname "$t")"
    cp "$build/$t" "$stage/bin/$t"
done
strip --strip-unneeded "$stage"/bin/cohort "$stage"/bin/libcohort_cuda.so 2>/dev/null || true

# the manifest: one line per test, NAME<TAB>TIMEOUT<TAB>command (bash words; $B is the
# bundle's bin folder, $S the source root, both set by run.sh)
python3 - "$build" "$root" "$stage/tests.json" >"$stage/tests.tsv" <<'EOF'
import json, os, shlex, sys
build, root, tests = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
def word(a):
    if a.startswith("./") and os.path.exists(os.path.join(build, a)):
        a = os.path.join(build, a)  # meson names built programs relative to the build folder
    a = os.path.normpath(a) if a.startswith("/") else a
    for pre, var in ((build + "/", "$B/"), (root + "/", "$S/")):
        if a.startswith(pre):
            return '"' + var + a[len(pre):] + '"'
    if "/" in a and a.endswith("bash"):
        return "bash"
    return shlex.quote(a)
for t in sorted(tests, key=lambda t: t["name"]):
    if "cohort:gpu" in t["suite"]:
        print("\t".join([t["name"], str(int(t["timeout"])), " ".join(word(a) for a in t["cmd"])]))
EOF

# the shared libraries a bare GPU image may not have
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcublas|libcublasLt|libnccl)'
find "$stage/bin" -type f -perm -u+x -o -name '*.so' | xargs ldd 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u | while read -r name path; do
        [[ $name =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
    done
nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p' >"$stage/cuda-version"
echo "sm_$sm" >"$stage/gpu-arch"
(cd "$root" && git log --oneline -1 2>/dev/null || echo "not a git checkout") >"$stage/source"
rm "$stage/tests.json"
tar -C "$stage" -czf "$bundle" .
log "$(basename "$bundle"): $(du -k "$bundle" | cut -f1) KiB packed, $(du -sk "$stage" | cut -f1) KiB unpacked;" \
    "$(wc -l <"$stage/tests.tsv") tests, CUDA $(cat "$stage/cuda-version"), sm_$sm"
