# moe_tiny.sh - sourced by moe_test.sh and moe_ep_test.sh (after tests/lib.sh and workdir): the
# tiny MoE model both train (4 layers, every second one MoE with 4 experts of hidden 48, top-2,
# aux and z losses) as $tiny, compare_runs.sh's helpers, and moe_losses_match (below).
# The first 10,000 mock documents (not lib.sh's 1000): the layouts' final parameters are
# compared within 1e-5, a bound met on Megatron's whole set and on its first 10,000
# documents, while on the first 1000 three of the comparisons (moe_tp's eb2, moe_ep_tp's
# t2e4, moe_ep_etp's t2c2) land at 1.0-1.5e-5 in one attention weight element. The 21 MoE
# cases took 413 CPU-s on the whole set, 94 on these.
export COHORT_TEST_MOCK_SEQUENCES=10000
tiny_model --num-layers 4 --attention-dropout 0 --eval-iters 2 --disable-bias-linear --num-experts 4 \
    --moe-router-topk 2 --moe-layer-freq 2 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2 \
    --moe-z-loss-coeff 1e-3
. "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"
moe_losses_match() { # REF:RUN...: each iteration RUN logged has REF's load_balancing_loss and z_loss
    /usr/bin/python3 - "$work" "$@" <<'PY' || fail "the MoE losses differ from one rank's"
import json, sys
w = sys.argv[1]
def load(n):
    return {r["iteration"]: r for r in map(json.loads, open(f"{w}/{n}.jsonl")) if "grad_norm" in r}
worst = 0
for pair in sys.argv[2:]:
    ref, run = pair.split(":")
    a, b = load(ref), load(run)
    assert b and set(b) <= set(a), (run, sorted(b))
    for i in b:
        for k in ("load_balancing_loss", "z_loss"):
            x, y = a[i][k], b[i][k]
            assert x > 0, (ref, i, k, x)
            rel = abs(x - y) / x
            worst = max(worst, rel)
            assert rel < 1e-6, f"{run}, iteration {i}: {k} {y} vs {ref}'s {x}"
print(f"ok: load_balancing_loss and z_loss match one rank's (worst relative difference {worst:.1e})")
PY
}
