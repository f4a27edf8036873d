# compare_runs.sh - sourced by the parallelism tests (tp_test.sh, pp_test.sh): what two runs
# of `cohort train` logged, compared. Needs tests/lib.sh and $work (the runs' metrics are
# $work/NAME.jsonl).
#   convert_roundtrip ONE TP2 `ckpt convert --to cohort` of the tp 1 checkpoint $work/ONE to tp 2
#                             and of the tp 2 one $work/TP2 to tp 1 keeps every tensor bitwise
#   sdc_repaired RANK FROM ARGS...  a weight bit of RANK flipped in iteration 4 of an 8-iteration
#                             job (run ARGS) is repaired from rank FROM: bitwise the clean run
#   compare FROM REF RUN...   iterations FROM.. of every RUN against REF's, and their validation
#                             losses, within fp32 reduction tolerance (1e-6 relative)
compare() { # FROM REF RUN...: iterations FROM.. of every run against REF's, and the validation loss
    /usr/bin/python3 - "$work" "$@" <<'PY' || fail "the layouts disagree"
import json, sys
w, first, ref, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def load(n):
    rows = [json.loads(l) for l in open(f"{w}/{n}.jsonl")]
    return ({r["iteration"]: r for r in rows if "grad_norm" in r},
            [r["lm_loss"] for r in rows if r.get("evaluation") == "valid"])
a, av = load(ref)
worst = 0
for n in runs:
    b, bv = load(n)
    assert sorted(b) == [i for i in sorted(a) if i >= first] and bv and len(bv) == len(av), (n, sorted(b), bv)
    for i in b:
        for k in ("lm_loss", "grad_norm"):
            x, y = a[i][k], b[i][k]
            rel = abs(x - y) / max(abs(x), 1e-12)
            worst = max(worst, rel)
            # fp32 sums in another order: about 1e-8 relative; the gradient norm is printed to
            # 6 decimals
            if rel > 1e-6 and not (k == "grad_norm" and abs(x - y) <= 2.5e-6):
                print(f"{n}, iteration {i}: {k} {y} vs {ref}'s {x} (rel {rel:.2e})"); sys.exit(1)
    for x, y in zip(av, bv):
        if abs(x - y) / abs(x) > 1e-6: print(f"{n}: validation loss {y} vs {x}"); sys.exit(1)
print(f"ok: {', '.join(runs)} match {ref} from iteration {first} (worst relative difference {worst:.1e})")
PY
}
convert_roundtrip() { # ONE TP2: checkpoints (in $work) of one rank and of tp 2, converted to the other size
    "$cohort" ckpt convert "$work/$1" --to cohort --tensor-model-parallel-size 2 --output "$work/c2" \
        >"$work/c2.out" 2>&1 || fail "convert to tp 2: $(tail -3 "$work/c2.out")"
    "$cohort" ckpt convert "$work/$2" --to cohort --tensor-model-parallel-size 1 --output "$work/c1" \
        >"$work/c1.out" 2>&1 || fail "convert to tp 1: $(tail -3 "$work/c1.out")"
    local p
    for p in "$1 c2" "$2 c1"; do
        set -- $p
        "$cohort" ckpt diff "$work/$1" "$work/$2" >"$work/d.out" 2>&1 && grep -q "^bitwise equal" "$work/d.out" ||
            fail "converted $1: $(tail -3 "$work/d.out")"
    done
}
sdc_repaired() {
    local rank=$1 from=$2; shift 2
    run clean "$@" --train-iters 8 --save "$work/cs"
    run f "$@" --train-iters 8 --inject "bitflip-param@rank=$rank,step=4,bit=22" --save "$work/fs"
    grep -q "rank $rank: parameters changed in memory since its last update .*silent data corruption; repaired from rank $from" \
        "$work/f.out" || fail "no diagnosis: $(grep -i 'supervisor' "$work/f.out" | head -5)"
    same_losses clean f "the repaired run trained other numbers"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
}
