#!/usr/bin/env bash
# slurm_test.sh - deploy/slurm/cohort.sbatch under a real Slurm on this one host: a private
# munged (its own key and socket), slurmctld and two slurmd (node names 127.0.0.1 and
# 127.0.0.2), configured and started here and stopped at the end (trap EXIT), even on failure.
#   slurm_test.sh COHORT
# 1. a 2-node sbatch job trains as one job of 2 x nproc ranks, the nodes' places read by
#    `cohort train` from srun's variables;
# 2. the same job again, preempted (scancel --signal=TERM: every process of the step, workers
#    included), saves, exits 75, requeues itself and resumes: its final checkpoint and
#    logged losses are bitwise those of the uninterrupted job;
# 3. (a third job) the time-limit warning SIGUSR1 sent to the batch shell alone (as
#    --signal=B:USR1@120 does) is passed on to the step by the script: the same stop and requeue.
# Skips (exit 77) with the reason where Slurm is not installed or cannot start here.
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$(realpath "$1")" # (the jobs run in sbatch's directory)
sbatch_script=$COHORT_SOURCE_ROOT/deploy/slurm/cohort.sbatch
skip() { echo "SKIP: $*"; exit 77; }

for t in munged slurmctld slurmd slurmstepd sbatch scontrol squeue scancel sinfo; do
    command -v $t >/dev/null || skip "$t is not installed (Debian: slurmctld slurmd slurm-client munge)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start the jobs' tasks"

work=$(mktemp -d /tmp/cohort-slurm.XXXXXX) # (munge's socket path must stay short)
export SLURM_CONF=$work/slurm.conf
daemons=()
jobs_submitted=()
cleanup() {
    # the jobs first (their processes belong to slurmstepd, not to the daemons), then the
    # daemons this test started, then any process still holding this test's configuration
    if [ ${#jobs_submitted[@]} -gt 0 ]; then
        scancel "${jobs_submitted[@]}" 2>/dev/null
        for _ in $(seq 100); do
            [ -z "$(squeue -h -o %i -t R,CG,PD 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done
    for _ in $(seq 50); do
        alive=0
        for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive -eq 0 ] && break
        sleep 0.1
    done
    for p in "${daemons[@]}"; do kill -9 "$p" 2>/dev/null; done
    local e
    for e in /proc/[0-9]*/environ; do
        if grep -qzx "SLURM_CONF=$SLURM_CONF" "$e" 2>/dev/null; then
            e=${e#/proc/}; kill -9 "${e%/environ}" 2>/dev/null
        fi
    done
    [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
dump() {
    local f
    for f in "$work"/*.out "$work"/log/*; do
        [ -f "$f" ] && { echo "--- $f"; grep -v '  iteration ' "$f" | tail -25; }
    done
}
fail() { echo "FAIL: $*" >&2; dump >&2; exit 1; } # (lib.sh's, with the jobs' and daemons' logs)

# --- the cluster: munge, slurmctld, two slurmd on this host ---
mkdir -p "$work/munge" "$work/state" "$work/spool/127.0.0.1" "$work/spool/127.0.0.2" "$work/log"
chmod 700 "$work/munge"
head -c 1024 /dev/urandom >"$work/munge/key" && chmod 400 "$work/munge/key"
munged -f --socket="$work/munge/sock" --key-file="$work/munge/key" --pid-file="$work/munge/pid" \
    --log-file="$work/log/munged.log" --seed-file="$work/munge/seed" --foreground >/dev/null 2>&1 &
daemons+=($!)
hw=$(slurmd -C | head -1) || skip "slurmd -C failed"
hwfield() { printf '%s\n' "$hw" | grep -o "$1=[0-9]*" | cut -d= -f2; }
node_hw="CPUs=$(hwfield CPUs) Boards=$(hwfield Boards) SocketsPerBoard=$(hwfield SocketsPerBoard) CoresPerSocket=$(hwfield CoresPerSocket) ThreadsPerCore=$(hwfield ThreadsPerCore) RealMemory=$(hwfield RealMemory)"
port=$((20000 + RANDOM % 20000))
host=$(hostname)
cat >"$SLURM_CONF" <<CONF
ClusterName=cohorttest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/sock,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
SlurmUser=root
SlurmdUser=root
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
KillWait=30
MinJobAge=600
NodeName=127.0.0.1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1)) $node_hw State=UNKNOWN
NodeName=127.0.0.2 NodeHostname=$host NodeAddr=127.0.0.2 Port=$((port + 2)) $node_hw State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
for _ in $(seq 50); do [ -S "$work/munge/sock" ] && break; sleep 0.1; done
[ -S "$work/munge/sock" ] || skip "munged did not start: $(tail -3 "$work/log/munged.log" 2>/dev/null)"
slurmctld -D -i >"$work/log/slurmctld.stderr" 2>&1 &
daemons+=($!)
for n in 127.0.0.1 127.0.0.2; do
    slurmd -D -N $n >"$work/log/slurmd-$n.stderr" 2>&1 &
    daemons+=($!)
done
up=0
for _ in $(seq 300); do
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c idle)" -eq 2 ] && { up=1; break; }
    sleep 0.1
done
[ $up -eq 1 ] || skip "Slurm did not come up here: $(sinfo -h -N 2>&1 | head -3); $(tail -3 "$work/log/slurmctld.log" 2>/dev/null)"
echo "slurm: 2 nodes idle: $(sinfo -h -o '%P %D %t %N')"

# --- the jobs ---
# (step 14 slowed down in every job alike, no numeric effect, so that a preemption lands mid-run)
tiny_model --nproc-per-node 2 --train-iters 24 --rendezvous-timeout 60 --inject slow@rank=0,step=14,phase=allreduce,ms=2500
submit() { # NAME -> job id; the job's output in $work/NAME.out
    local id
    id=$(COHORT=$cohort COHORT_CKPT_DIR=$work/$1 MASTER_PORT=$((port + 100 + 20 * ${#jobs_submitted[@]})) \
        sbatch --parsable --nodes=2 --job-name="cohort-$1" --output="$work/$1.out" --time=10 \
        "$sbatch_script" "${tiny[@]}" --metrics-file "$work/$1.jsonl") || fail "sbatch $1: $id"
    jobs_submitted+=("$id")
    echo "$id"
}
field() { scontrol show job "$1" -o 2>/dev/null | grep -o " $2=[^ ]*" | cut -d= -f2; }
wait_done() { # JOB SECONDS: until it completes (or fails)
    local s
    for _ in $(seq $(($2 * 5))); do
        s=$(field "$1" JobState)
        case $s in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) echo "$s"; return ;; esac
        sleep 0.2
    done
    echo "still ${s:-unknown} after $2 s"
}
wait_log() { # FILE PATTERN SECONDS JOB: until the pattern is in the file (1: not in time, or the job ended)
    for i in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        if [ $((i % 10)) -eq 0 ]; then
            case $(field "$4" JobState) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) return 1 ;; esac
        fi
        sleep 0.1
    done
    return 1
}
clean_run() { # NAME: no rank was lost, killed or restarted
    ! grep -q "was killed by\|exited with status\|restart into generation\|did not stop; killing" "$work/$1.out" ||
        fail "$1: a process died: $(grep "was killed by\|exited with status\|restart into\|killing" "$work/$1.out" | head -5)"
}

# 1. uninterrupted
a=$(submit a)
st=$(wait_done "$a" 120)
[ "$st" = COMPLETED ] || fail "job a: $st, exit $(field "$a" ExitCode)"
[ "$(field "$a" ExitCode)" = 0:0 ] || fail "job a: exit $(field "$a" ExitCode)"
grep -q "from the environment: .*--nnodes 2 (SLURM_STEP_NUM_NODES)" "$work/a.out" &&
    grep -q "from the environment: .*--node-rank 1 (SLURM_NODEID).*--master-addr 127.0.0.1 (SLURM_STEP_NODELIST).*--node-addr 127.0.0.2 (SLURMD_NODENAME)" "$work/a.out" ||
    fail "job a: the nodes' places were not read from srun's variables: $(grep "environment" "$work/a.out")"
grep -q "node agent 1 starting 2 worker processes" "$work/a.out" || fail "job a: no node agent on node 1"
grep -q "4 ranks" "$work/a.out" || fail "job a: not one job of 4 ranks: $(grep ranks "$work/a.out")"
grep -q "iteration       24/      24" "$work/a.out" || fail "job a: did not train 24 iterations"
clean_run a
echo "job a ($a): 2 nodes x 2 workers trained 24 iterations as one job"

# 2. preempted by SIGTERM to every process of the step, requeued, resumed
b=$(submit b)
wait_log "$work/b.out" "iteration       12/" 120 "$b" || fail "job b: no progress: $(field "$b" JobState)"
scancel --signal=TERM "$b" || fail "scancel --signal=TERM"
wait_log "$work/b.out" "requeueing job $b" 60 "$b" || fail "job b: not requeued after SIGTERM"
st=$(wait_done "$b" 150)
[ "$st" = COMPLETED ] && [ "$(field "$b" ExitCode)" = 0:0 ] || fail "job b: $st, exit $(field "$b" ExitCode)"
[ "$(field "$b" Restarts)" = 1 ] || fail "job b: Restarts=$(field "$b" Restarts), want 1"
grep -q "stopped for preemption (Terminated): exit 75" "$work/b.out" || fail "job b: no preemption stop"
line=$(grep -o "stopped by signal after iteration [0-9]*" "$work/b.out" | head -1) || fail "job b: no clean stop"
it=${line##* }
[ "$it" -ge 12 ] && [ "$it" -lt 24 ] || fail "job b: stopped after iteration $it"
grep -q "restart 1" "$work/b.out" || fail "job b: the requeued run did not start"
grep -q "iteration       24/      24" "$work/b.out" || fail "job b: the requeued run did not finish"
clean_run b
ckpt_same "$work/a" "$work/b" "job b: final checkpoint differs from job a's"
same_losses a b "job b: logged losses differ from job a's"
echo "job b ($b): preempted (SIGTERM) after iteration $it, requeued, resumed: bitwise job a's result"

# 3. the time-limit warning, to the batch shell only
c=$(submit c)
wait_log "$work/c.out" "iteration       12/" 120 "$c" || fail "job c: no progress: $(field "$c" JobState)"
scancel --batch --signal=USR1 "$c" || fail "scancel --batch --signal=USR1"
wait_log "$work/c.out" "requeueing job $c" 60 "$c" || fail "job c: not requeued after SIGUSR1"
st=$(wait_done "$c" 150)
[ "$st" = COMPLETED ] && [ "$(field "$c" ExitCode)" = 0:0 ] || fail "job c: $st, exit $(field "$c" ExitCode)"
grep -q "stopped for preemption (User defined signal 1): exit 75" "$work/c.out" || fail "job c: no preemption stop"
clean_run c
ckpt_same "$work/a" "$work/c" "job c: final checkpoint differs from job a's"
echo "job c ($c): SIGUSR1 to the batch shell, passed to the step: saved, requeued, resumed: bitwise job a's result"
exit 0
