#!/usr/bin/env bash
# soak.sh - a supervised 4-rank CPU job under Megatron's random fault injector for MINUTES,
# then the fault-free run of the same iterations: reports the faults survived, the steps lost,
# the measured ETTR (the iterations times the faulty run's median logged step time, over its
# wall time less the start-up: the fault-free run's wall time less its iterations at its median
# step time; each run's own step times, so that a busy machine slows both sides alike), `cohort plan`'s prediction for that job (its failure rate from the MTTI,
# the in-process restart's cost and the step time from the faulty run's report), and whether the
# final checkpoints are bitwise equal (`cohort ckpt diff`). Exit status 1 when they are not.
#   bench/soak.sh MINUTES [WORKDIR]
# Environment: COHORT (default build/cohort), SOAK_MTTI seconds between injections (20),
# SOAK_TYPES (every kind: sigkill,sigstop,hang,slow,nan,inf,spike,bitflip-grad,bitflip-param,
# bitflip-act), SOAK_SEED (1).
set -u
minutes=${1:?usage: bench/soak.sh MINUTES [WORKDIR]}
work=${2:-$(mktemp -d "${TMPDIR:-/tmp}/soak.XXXXXX")}
cohort=${COHORT:-build/cohort}
mtti=${SOAK_MTTI:-20}
types=${SOAK_TYPES:-sigkill,sigstop,hang,slow,nan,inf,spike,bitflip-grad,bitflip-param,bitflip-act}
seed=${SOAK_SEED:-1}
mkdir -p "$work"
iters=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 * 300 + 100 }') # above any rate this job reaches
job=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 2 --hidden-size 32
     --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 16 --lr 1e-3
     --data-cache-path "$work/cache" --log-interval 50 --eval-interval 1000000 --eval-iters 1 --threads 1
     --nproc-per-node 4 --train-iters "$iters" --check-for-spiky-loss --save-interval 1000000)

"$cohort" train "${job[@]}" --exit-duration-in-mins "$minutes" --save "$work/f.ckpt" --run-report "$work/f.json" \
    --metrics-file "$work/f.jsonl" --inprocess-soft-timeout 2 --inprocess-hard-timeout 4 \
    --inprocess-barrier-timeout 60 --inprocess-restart-limit 100000 --quarantine-after 0 \
    --fault-injector-num-ranks 1 --fault-injector-fault-types "$types" --fault-injector-mtti-seconds "$mtti" \
    --fault-injector-seed "$seed" >"$work/f.out" 2>"$work/f.err"
rc=$?
[ $rc -eq 0 ] || { echo "soak: the faulty run exited $rc (see $work/f.err)"; exit 1; }
n=$(cat "$work/f.ckpt/latest_checkpointed_iteration.txt")
"$cohort" train "${job[@]}" --exit-interval "$n" --save "$work/clean.ckpt" --run-report "$work/clean.json" \
    --metrics-file "$work/clean.jsonl" >"$work/clean.out" 2>"$work/clean.err" ||
    { echo "soak: the fault-free run failed (see $work/clean.err)"; exit 1; }
it=$(printf 'iter_%07d' "$n")
if "$cohort" ckpt diff "$work/clean.ckpt/$it" "$work/f.ckpt/$it" >"$work/diff.out" 2>&1; then same=yes; else same=no; fi
/usr/bin/python3 - "$work" "$mtti" "$cohort" "$same" "$n" <<'PY'
import json, subprocess, sys
work, mtti, cohort, same, n = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
f, c = json.load(open(f"{work}/f.json")), json.load(open(f"{work}/clean.json"))
inj = [i for i in f.get("injections", {}).get("list", []) if i["source"] == "--fault-injector"]
def median_step(path):
    t = sorted(r["elapsed_ms_per_iteration"] for r in map(json.loads, open(path)) if "elapsed_ms_per_iteration" in r)
    return t[len(t) // 2] / 1000.0
sf, sc = median_step(f"{work}/f.jsonl"), median_step(f"{work}/clean.jsonl")
startup = max(0.0, c["wall_seconds"] - n * sc)
measured = n * sf / (f["wall_seconds"] - startup)
# the planner: 4 GPUs on one node for the faulty run's wall time, one failure per MTTI, each
# cured in place (mix sw) at the in-process cost measured in the report, no checkpoints
days = (f["wall_seconds"] - startup) / 86400.0
plan = subprocess.run([cohort, "plan", "--gpus", "4", "--gpus-per-node", "4", "--days", repr(days),
                       "--failures-per-gpu-hour", repr(3600.0 / (mtti * 4)), "--mix", "hw=0,sw=1,sdc=0",
                       "--fallback-share", "0", "--save-seconds", "0", "--checkpoint-interval", "1e9",
                       "--from-report", f"{work}/f.json", "--step-seconds", repr(sf), "--runs", "4000", "--json"],
                      capture_output=True, text=True, check=True)
pred = [s for s in json.loads(plan.stdout)["strategies"] if s["strategy"] == "in-process"][0]["ettr"]
out = {"iterations": n, "wall_seconds": f["wall_seconds"], "clean_wall_seconds": c["wall_seconds"],
       "injections": len(inj), "faults_survived": len(f["faults"]), "restarts": f["restarts"],
       "steps_lost": f["steps_lost"], "startup_seconds": round(startup, 2), "step_seconds": sf, "ettr_measured": round(measured, 4), "ettr_predicted": round(pred, 4),
       "bitwise_equal": same == "yes"}
json.dump(out, open(f"{work}/soak.json", "w"))
print("soak: %d iterations in %.1f s (fault-free %.1f s); %d injections, %d faults survived, %d restarts, "
      "%d steps lost; ETTR measured %.3f, cohort plan predicts %.3f; final state bitwise equal to the fault-free "
      "run: %s" % (n, f["wall_seconds"], c["wall_seconds"], len(inj), len(f["faults"]), f["restarts"],
                   f["steps_lost"], measured, pred, same))
PY
[ "$same" = yes ]
