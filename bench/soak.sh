#!/usr/bin/env bash
# soak.sh - a supervised 4-rank CPU job under Megatron's random fault injector for MINUTES,
# then the fault-free run of the same iterations: reports the faults survived, the steps lost,
# the measured ETTR, `cohort plan`'s prediction of it from the costs this run measured, and
# whether the final checkpoints are bitwise equal (`cohort ckpt diff`). Exit status 1 when they
# are not, or a run fails.
#
# Rank 0 sleeps SOAK_STEP_MS per micro batch in the faulty run (`--inject slow`, rank 0 is never
# a target): the step is then mostly a sleep, so a busy machine changes the step time little, and
# the fault-free run (no sleep) of the same iterations takes a fraction of the faulty one's time.
# Measured ETTR: the iterations times the faulty run's median logged step time, over its wall
# time less its start-up (the report's goodput: up to the first accepted step). The prediction: `cohort plan` for 4 GPUs over that time, the in-process restart's
# cost and the step time from the faulty run's report, and its failure rate from the restarts
# this run had (`ettr_predicted`) or from the injector's MTTI and the share of the fault types
# that need a restart (`ettr_predicted_mtti`); the other types cost a replayed step or a 200 ms
# sleep, which the planner counts as free.
#   bench/soak.sh MINUTES [WORKDIR]
# Environment: COHORT (default build/cohort), SOAK_MTTI seconds between injections (20),
# SOAK_TYPES (every kind: sigkill,sigstop,hang,slow,nan,inf,spike,bitflip-grad,bitflip-param,
# bitflip-act), SOAK_SEED (1), SOAK_STEP_MS (40; 0: no sleep).
set -u
minutes=${1:?usage: bench/soak.sh MINUTES [WORKDIR]}
work=${2:-$(mktemp -d "${TMPDIR:-/tmp}/soak.XXXXXX")}
cohort=${COHORT:-build/cohort}
mtti=${SOAK_MTTI:-20}
types=${SOAK_TYPES:-sigkill,sigstop,hang,slow,nan,inf,spike,bitflip-grad,bitflip-param,bitflip-act}
seed=${SOAK_SEED:-1}
pad=${SOAK_STEP_MS:-40}
mkdir -p "$work"
iters=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 * 300 + 100 }') # above any rate this job reaches
job=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 2 --hidden-size 32
     --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 16 --lr 1e-3
     --data-cache-path "$work/cache" --log-interval 50 --eval-interval 1000000 --eval-iters 1 --threads 1
     --nproc-per-node 4 --train-iters "$iters" --check-for-spiky-loss --save-interval 1000000)
slow=()
[ "$pad" -gt 0 ] && slow=(--inject "slow@rank=0,step=1,times=always,ms=$pad")

t0=$(date +%s)
"$cohort" train "${job[@]}" --exit-duration-in-mins "$minutes" --save "$work/f.ckpt" --run-report "$work/f.json" \
    --metrics-file "$work/f.jsonl" --inprocess-soft-timeout 2 --inprocess-hard-timeout 4 \
    --inprocess-barrier-timeout 60 --inprocess-restart-limit 100000 --quarantine-after 0 \
    --fault-injector-num-ranks 1 --fault-injector-fault-types "$types" --fault-injector-mtti-seconds "$mtti" \
    --fault-injector-seed "$seed" "${slow[@]}" >"$work/f.out" 2>"$work/f.err"
rc=$?
[ $rc -eq 0 ] || { echo "soak: the faulty run exited $rc (see $work/f.err)"; exit 1; }
n=$(cat "$work/f.ckpt/latest_checkpointed_iteration.txt")
t1=$(date +%s)
"$cohort" train "${job[@]}" --exit-interval "$n" --save "$work/clean.ckpt" --run-report "$work/clean.json" \
    --metrics-file "$work/clean.jsonl" >"$work/clean.out" 2>"$work/clean.err" ||
    { echo "soak: the fault-free run failed (see $work/clean.err)"; exit 1; }
t2=$(date +%s)
it=$(printf 'iter_%07d' "$n")
if "$cohort" ckpt diff "$work/clean.ckpt/$it" "$work/f.ckpt/$it" >"$work/diff.out" 2>&1; then same=yes; else same=no; fi
/usr/bin/python3 "${0%/*}/soak_report.py" "$work" "$mtti" "$cohort" "$same" "$n" "$types" "$((t1 - t0))" "$((t2 - t1))" ||
    { echo "soak: the report failed"; exit 1; }
[ "$same" = yes ]
