#!/usr/bin/env bash
# slurm_test.sh - deploy/slurm/cohort.sbatch under a real Slurm on this one host: a private
# munged (its own key and socket), slurmctld and two slurmd (node names 127.0.0.1 and
# 127.0.0.2), configured and started here and stopped at the end (trap EXIT), even on failure.
#   slurm_test.sh COHORT [CASE]   CASE: requeue (jobs 1-3, the default) or node_killed (jobs 1, 4)
# 1. a 2-node sbatch job trains as one job of 2 x nproc ranks, the nodes' places read by
#    `cohort train` from srun's variables;
# 2. the same job again, preempted (scancel --signal=TERM: every process of the step, workers
#    included), saves, exits 75, requeues itself and resumes: its final checkpoint and
#    logged losses are bitwise those of the uninterrupted job;
# 3. (a third job) the time-limit warning SIGUSR1 sent to the batch shell alone (as
#    --signal=B:USR1@120 does) is passed on to the step by the script: the same stop and requeue.
# Case node_killed (the uninterrupted job 1, then):
# 4. a node crashes: node 127.0.0.2's slurmd and its task's processes (the node agent and its
#    workers) SIGKILLed after the job's checkpoint of iteration 12; node 0's supervisor finds
#    the node lost (exit 7), the script requeues the job (failure requeue 1 of
#    COHORT_MAX_REQUEUES=2), the node's slurmd is brought back (as an operator would), and the
#    requeued job resumes from the checkpoint: its final checkpoint and every loss it logged are
#    bitwise job 1's.
# Skips (exit 77) with the reason where Slurm is not installed or cannot start here.
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$(realpath "$1")" # (the jobs run in sbatch's directory)
case_name=${2:-requeue}
case $case_name in requeue | node_killed) ;; *) fail "unknown case $case_name" ;; esac
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
# (a requeued job becomes eligible cred_expire + 1 s later, with no event to schedule it on:
# the periodic pass, every 60 s by default, would start it)
SchedulerParameters=sched_interval=1
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
declare -A slurmd_pid
start_slurmd() { # NODE: its slurmd in the background, its pid in slurmd_pid[NODE]
    slurmd -D -N "$1" >>"$work/log/slurmd-$1.stderr" 2>&1 &
    daemons+=($!)
    slurmd_pid[$1]=$!
}
for n in 127.0.0.1 127.0.0.2; do start_slurmd $n; done
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
submit() { # NAME [FLAGS...] -> job id; the job's output in $work/NAME.out
    local id name=$1; shift
    id=$(COHORT=$cohort COHORT_CKPT_DIR=$work/$name MASTER_PORT=$((port + 100 + 20 * ${#jobs_submitted[@]})) \
        sbatch --parsable --nodes=2 --job-name="cohort-$name" --output="$work/$name.out" --time=10 \
        "$sbatch_script" "${tiny[@]}" --metrics-file "$work/$name.jsonl" "$@") || fail "sbatch $name: $id"
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

# 4. a node crashes after a checkpoint; the job is requeued and resumes
node_killed() {
    local d agent st
    # (steps 2 and 13 slowed down too, no numeric effect: time to find the node's processes,
    # and 5 s after the checkpoint of iteration 12 to kill the node in; srun passes the job's
    # output on late, so the test waits on files and processes)
    d=$(COHORT_MAX_REQUEUES=2 submit d --save-interval 6 --inprocess-heartbeat-interval 0.5 --inprocess-heartbeat-timeout 3 \
        --inject slow@rank=0,step=2,phase=allreduce,ms=4000 --inject slow@rank=0,step=13,phase=allreduce,ms=5000)
    wait_until 60 eval '[ -n "$(node_agent "$d" 127.0.0.2)" ]' || fail "job d: no node agent on node 127.0.0.2"
    agent=$(node_agent "$d" 127.0.0.2)
    wait_until 60 grep -qx 12 "$work/d/latest_checkpointed_iteration.txt" ||
        fail "job d: no checkpoint of iteration 12: $(field "$d" JobState)"
    # the node crashes: its slurmd, its task (the node agent) and the agent's workers
    kill -KILL "${slurmd_pid[127.0.0.2]}" "$agent" $(children "$agent")
    echo "job d ($d): node 127.0.0.2 killed (slurmd ${slurmd_pid[127.0.0.2]}, node agent $agent and its workers)"
    wait_log "$work/d.out" "requeueing job $d" 60 "$d" || fail "job d: not requeued after the node's crash"
    grep -q "node 1's agent sent nothing for [0-9.]* s (--inprocess-heartbeat-timeout 3.0 s): the node is lost" "$work/d.out" ||
        fail "job d: the supervisor did not find node 1 lost"
    grep -q "cohort train exited \(7\|137\) .*failure requeue 1 of 2" "$work/d.out" ||
        fail "job d: not requeued as a failure: $(grep cohort.sbatch "$work/d.out")"
    [ "$(cat "$work/d.requeues")" = 1 ] || fail "job d: requeues counted: $(cat "$work/d.requeues" 2>&1)"
    # the node comes back (an operator, or the node's reboot); the requeued job needs both
    start_slurmd 127.0.0.2
    st=$(wait_done "$d" 180)
    [ "$st" = COMPLETED ] && [ "$(field "$d" ExitCode)" = 0:0 ] || fail "job d: $st, exit $(field "$d" ExitCode)"
    [ "$(field "$d" Restarts)" = 1 ] || fail "job d: Restarts=$(field "$d" Restarts), want 1"
    grep -q "restart 1" "$work/d.out" || fail "job d: the requeued run did not start"
    grep -q "successfully loaded checkpoint from .* at iteration 12" "$work/d.out" ||
        fail "job d: not resumed from the checkpoint of iteration 12: $(grep -i 'load\|resum' "$work/d.out" | head -5)"
    grep -q "iteration       24/      24" "$work/d.out" || fail "job d: the requeued run did not finish"
    ckpt_same "$work/a" "$work/d" "job d: final checkpoint differs from job a's"
    # every iteration job d logged (those after the checkpoint twice) has job a's loss and norm
    /usr/bin/python3 - "$work/a.jsonl" "$work/d.jsonl" <<'PY' || fail "job d: logged losses differ from job a's"
import json, sys
def recs(p):
    return [json.loads(l) for l in open(p) if '"grad_norm"' in l]
a = {r["iteration"]: (r["lm_loss"], r["grad_norm"]) for r in recs(sys.argv[1])}
d = recs(sys.argv[2])
assert len(a) == 24 and {r["iteration"] for r in d} == set(a), (sorted(a), [r["iteration"] for r in d])
bad = [r["iteration"] for r in d if (r["lm_loss"], r["grad_norm"]) != a[r["iteration"]]]
assert not bad, bad
PY
    echo "job d ($d): a node killed after iteration 12's checkpoint, requeued, resumed: bitwise job a's result"
    exit 0
}
# node_agent JOB NODE: the pid of the job's node agent 1 (cohort-agent1) started by the job's
# step (slurmstepd "[JOB.0]") on NODE, the slurmstepd whose log is NODE's slurmd log
node_agent() {
    local p comm pp
    for p in /proc/[0-9]*; do
        { read -r comm <"$p/comm"; } 2>/dev/null || continue
        [ "$comm" = cohort-agent1 ] || continue
        pp=$(awk '{print $4}' "$p/stat" 2>/dev/null) || continue
        tr '\0' ' ' <"/proc/$pp/cmdline" 2>/dev/null | grep -qF "[$1.0]" &&
            ls -l "/proc/$pp/fd" 2>/dev/null | grep -qF "$work/log/slurmd-$2.log" && { echo "${p#/proc/}"; return; }
    done
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
[ "$case_name" = node_killed ] && node_killed # (the function below; exits)

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
