#!/usr/bin/env bash
# gpu_bench_test.sh - bench/gpu_bench on the CUDA stand-in (tests/cudasim/): a tiny model runs to
# the end and its report has every field, labelled as the stand-in's (numbers meaningless).
#   gpu_bench_test.sh BENCH     (BENCH: build/tests/cudasim/gpu_bench_cudasim; COHORT_CUDA_MODULE set)
set -u
bench=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

timeout 100 "$bench" --tiny --json >"$work/out.json" 2>"$work/err" || fail "gpu_bench --tiny exited $?: $(tail -5 "$work/err")"
python3 - "$work/out.json" <<'PY' || fail "the report: $(cat "$work/out.json")"
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert d["device"] == "stand-in: not a GPU", d["device"]
assert "cudasim" in d["backend"], d["backend"]
assert d["bf16"] is True
for k in ("tokens_per_s", "ms_per_step", "model_tflops", "matmul_bf16_tflops", "mfu"):
    assert d[k] > 0, (k, d[k])
assert d["gpu_mem_used_gib"] >= 0
# every kind of operation ran and was timed; the shares add up to one
for c in ("attention", "products", "elementwise"):
    assert d[c + "_ms"] > 0, (c, d[c + "_ms"])
assert abs(sum(d[c + "_share"] for c in ("attention", "products", "elementwise", "memory")) - 1) < 1e-3
assert d["communication_ms"] == 0
print("report ok: %.0f tokens/s, MFU %.3f, attention %.1f%% products %.1f%% elementwise %.1f%%" % (
    d["tokens_per_s"], d["mfu"], 100 * d["attention_share"], 100 * d["products_share"], 100 * d["elementwise_share"]))
PY
