# lib.sh - what the test scripts share (tests/integration, tests/fault, tests/gpu source it):
# the case's work directory and its failure line, the `cohort` of the CPU suites, the tiny
# model's flags, the per-iteration losses of a metrics file, checkpoints compared bitwise
# (parameters and both of Adam's moments), jobs in the background and bounded waits on an
# event (a log line, a process's end) instead of fixed sleeps.
#   . "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
#   fail MESSAGE...              prints "FAIL: MESSAGE" on stderr and exits 1
#   workdir NAME                 $work: a fresh directory, removed at exit (KEEP=1 keeps it) after
#                                the script's background jobs are killed
#   on_cpu EXE                   $cohort: EXE through tests/cpu_cohort.sh (`train` gets --device
#                                cpu, also on a machine with a GPU); $COHORT_CPU_EXE: EXE itself
#   tiny_model [FLAG [VALUE]]... $tiny: a small model on mock data (fast, deterministic; the
#                                first 1000 mock documents, COHORT_TEST_MOCK_SEQUENCES); each
#                                FLAG replaces its default value or is added (needs $work)
#   losses METRICS               its training records' iterations, losses and gradient norms
#                                (what must not depend on timing), one line
#   same_losses A B [WHAT]       $work/A.jsonl and $work/B.jsonl logged the same losses and norms
#   ckpt_same A B [WHAT]         checkpoints A and B (an iteration's directory, or a save
#                                directory: its latest) hold bitwise the same tensors, every
#                                parameter with both optimizer moments (`cohort ckpt diff --json`
#                                in $work/ckpt_same.json); WHAT names them when not
#   train_ok NAME ARGS...        `cohort train $tiny ARGS`, metrics in $work/NAME.jsonl, stdout and
#                                stderr in $work/NAME.out; fails the test unless it exits 0
#   train_refused MESSAGE ARGS... `cohort train $tiny --train-iters 2 ARGS` exits 2 with MESSAGE on
#                                stderr and starts no work (nothing on stdout)
#   nan_reproduced KIND REPORTER HELPER ARGS...  a NaN at every replay of iteration 4 (ARGS
#                                inject it) in a 6-iteration job: a rank matching REPORTER reports
#                                KIND, a rank matching HELPER recomputes and finds it too: exit 3
#   resume_exact ITERS AT        train_ok runs of ITERS iterations: one whole ($work/full), one
#                                stopped after AT and resumed from its checkpoint ($work/s); both
#                                end bitwise the same
#   tb_has METRICS TAG           the TensorBoard event files in $work/tb hold the values of the
#                                metrics file METRICS (tests/integration/tb_read.py) and the tag TAG
#   train_bg OUT ITER ARGS...    `cohort train $tiny ARGS` in the background, stdout and stderr in
#                                $work/OUT, its pid in $job; returns once it logged iteration ITER
#                                (fails after 60 s without)
#   wait_until SECONDS COMMAND...  runs COMMAND every 0.1 s until it succeeds; 1 if SECONDS pass
#   wait_gone PID SECONDS        until process PID has exited; 1 if SECONDS pass
#   children PID                 its child processes, oldest first (from /proc: no procps on a
#                                minimal Debian)
#   wait_handles_sigint PID EXE  until process PID runs EXE and has taken SIGINT over (blocked
#                                for its signal thread, or caught); before, a signal would end the
#                                forked shell or the dynamic loader, which no program controls
# Jobs of several nodes on this host (a node agent per node, `--node-rank K`, a job secret in
# $work/secret; NODE_NPROC workers each, 2 by default; each process killed after NODE_TIMEOUT
# seconds, 150 by default):
#   pick_port N                  a port with the next N free (none listening), below the
#                                ephemeral ports: the supervisor's and its workers' data ports
#   start_nodes NAME NNODES ARGS...  the agents of nodes NNODES-1..1, then node 0 (the
#                                supervisor), in the background: `cohort train $tiny $net ARGS`,
#                                each node's output in $work/NAME.nK, node 0's metrics and run
#                                report in $work/NAME.{jsonl,report.json}; pids in node_pid[K],
#                                the network flags in $net
#   start_agent OUT K ARGS...    node K's agent of the job start_nodes started (a new one after
#                                a loss), output in $work/OUT, its pid in node_pid[K]
#   wait_nodes NAME NNODES       every node exits 0 (but one whose node_pid was emptied: gone)
set -uo pipefail
src=${COHORT_SOURCE_ROOT:?}
# --mock-data of the first 1000 of Megatron's 100,000 mock documents (data/gpt_dataset.c): the
# full set's indices cost each rank of a tiny job a second or more to build or verify, most of
# what the job costs. Set it empty to run a script on Megatron's full mock set.
export COHORT_TEST_MOCK_SEQUENCES=${COHORT_TEST_MOCK_SEQUENCES-1000}

fail() { echo "FAIL: $*" >&2; exit 1; }

workdir() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-$1.XXXXXX")
    trap 'kill $(jobs -p) 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $work" >&2 || rm -rf "$work"' EXIT
}

on_cpu() {
    export COHORT_CPU_EXE=$1
    cohort=$src/tests/cpu_cohort.sh
}

tiny_model() {
    tiny=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 2 --hidden-size 32
          --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3
          --data-cache-path "$work/cache" --log-interval 1 --eval-interval 1000 --eval-iters 1 --threads 1)
    local i found
    while [ $# -gt 0 ]; do
        if [ $# -lt 2 ] || [[ $2 == --* ]]; then # a flag without a value
            tiny+=("$1")
            shift
            continue
        fi
        found=0
        for i in "${!tiny[@]}"; do
            [ "${tiny[i]}" = "$1" ] && { tiny[i + 1]=$2; found=1; }
        done
        [ $found = 1 ] || tiny+=("$1" "$2")
        shift 2
    done
}

losses() { grep '"grad_norm"' "$1" | grep -o '"iteration":[0-9]*\|"lm_loss":[^,]*\|"grad_norm":[^,]*' | paste -sd' '; }

same_losses() {
    [ "$(losses "$work/$1.jsonl")" = "$(losses "$work/$2.jsonl")" ] ||
        fail "${3:-$2 logged other numbers than $1}:
$(diff <(losses "$work/$1.jsonl" | tr ' ' '\n') <(losses "$work/$2.jsonl" | tr ' ' '\n') | head -6)"
}

ckpt_same() {
    local out=$work/ckpt_same.json
    "${COHORT_CPU_EXE:?}" ckpt diff --json "$1" "$2" >"$out" 2>&1 ||
        fail "${3:-$2 against $1}: not bitwise equal: $(grep -B1 '"status": "[^b]' "$out" | head -8)"
    /usr/bin/python3 - "$out" <<'PY' || fail "${3:-$2 against $1}: $(head -c 600 "$out")"
import json, sys
d = json.load(open(sys.argv[1]))
names = [t["name"] for t in d["tensors"]]
params = [n for n in names if not n.startswith("optimizer.")]
assert d["bitwise_equal"] and d["different"] == 0 and d["equal"] == len(names), d
assert params and all("optimizer.exp_avg." + n in names and "optimizer.exp_avg_sq." + n in names for n in params), names
assert all(t["status"] == "bitwise equal" for t in d["tensors"]), d
PY
}

train_ok() {
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" "$@" >"$work/$name.out" 2>&1 ||
        fail "$name: exit $?: $(tail -5 "$work/$name.out")"
}

train_refused() {
    local msg=$1 rc; shift
    "$cohort" train "${tiny[@]}" --train-iters 2 "$@" >"$work/out" 2>"$work/err"
    rc=$?
    [ $rc -eq 2 ] || fail "$*: exit $rc, want 2: $(tail -3 "$work/err")"
    grep -qF -- "$msg" "$work/err" || fail "$*: no '$msg' in: $(cat "$work/err")"
    [ ! -s "$work/out" ] || fail "$*: work started: $(head -3 "$work/out")"
}

nan_reproduced() {
    local kind=$1 rep=$2 helper=$3 rc; shift 3
    "$cohort" train "${tiny[@]}" --train-iters 6 "$@" >"$work/f.out" 2>&1
    rc=$?
    [ $rc -eq 3 ] || fail "exit $rc, want 3: $(tail -5 "$work/f.out")"
    grep -Eq "rank $rep: $kind \(nan\) reproduced; rank $helper recomputes" "$work/f.out" ||
        fail "no peer check: $(grep -i 'supervisor\|iteration 4' "$work/f.out" | head)"
    grep -Eq "reproduced on rank $helper too: the data or the model is at fault" "$work/f.out" ||
        fail "no diagnosis: $(grep supervisor "$work/f.out")"
}

resume_exact() {
    train_ok full --train-iters "$1" --save "$work/full"
    train_ok half --train-iters "$1" --exit-interval "$2" --save "$work/s"
    train_ok rest --train-iters "$1" --load "$work/s" --save "$work/s"
    ckpt_same "$work/full" "$work/s" "resumed run differs"
}

tb_has() {
    /usr/bin/python3 "$src/tests/integration/tb_read.py" check "$work/tb" "$1" >"$work/tb.out" 2>&1 ||
        fail "tensorboard: $(tail -3 "$work/tb.out")"
    /usr/bin/python3 "$src/tests/integration/tb_read.py" dump "$work/tb" | grep -q "^$2" || fail "no $2 tag"
}

train_bg() {
    local out=$work/$1 it=$2; shift 2
    "$cohort" train "${tiny[@]}" "$@" >"$out" 2>&1 &
    job=$!
    wait_until 60 grep -q "iteration *$it/" "$out" || fail "no progress within 60 s: $(tail -3 "$out")"
}

wait_until() {
    local end=$((SECONDS + $1 + 1)); shift
    until "$@" 2>/dev/null; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.1
    done
}

wait_gone() {
    local end=$((SECONDS + $2 + 1))
    while kill -0 "$1" 2>/dev/null; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.1
    done
}

children() {
    local p stat f
    for p in /proc/[0-9]*; do
        { read -r stat <"$p/stat"; } 2>/dev/null || continue
        read -ra f <<<"${stat##*) }" # after the command name (which may hold spaces): state, ppid, ...
        [ "${f[1]}" = "$1" ] && echo "${p#/proc/}"
    done | sort -n
}

wait_handles_sigint() {
    local pid=$1 exe mask
    exe=$(readlink -f "$2")
    for _ in $(seq 5000); do
        [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] || continue
        mask=$(awk '/^Sig(Blk|Cgt)/{printf "%s ", $2}' "/proc/$pid/status" 2>/dev/null) || return 1
        [ -n "$mask" ] && { (( 16#${mask%% *} & 2 )) || (( 16#${mask#* } & 2 )); } && return 0
    done
    return 1
}

pick_port() {
    local used p k ok _ addr
    used=" $(tail -qn +2 /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _ addr _; do echo $((16#${addr##*:})); done |
        tr '\n' ' ') "
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 12000)) ok=1 # (below the ephemeral ports, 32768 up)
        for ((k = 0; k <= $1; k++)); do [[ $used == *" $((p + k)) "* ]] && ok=0; done
        [ $ok = 1 ] && break
    done
    echo $p
}

start_nodes() {
    local name=$1 nn=$2 k; shift 2
    # (each worker's data port, and a second one for the overlapped gradient reduction's transport)
    net=(--nnodes "$nn" --nproc-per-node "${NODE_NPROC:-2}" --master-addr 127.0.0.1
         --master-port "$(pick_port $((2 * nn * ${NODE_NPROC:-2} + 1)))" --job-secret "$work/secret")
    node_pid=()
    for ((k = nn - 1; k >= 1; k--)); do start_agent "$name.n$k" $k "$@"; done
    timeout -s KILL "${NODE_TIMEOUT:-150}" "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank 0 \
        --metrics-file "$work/$name.jsonl" --run-report "$work/$name.report.json" "$@" >"$work/$name.n0" 2>&1 &
    node_pid[0]=$!
}

start_agent() {
    local out=$1 k=$2; shift 2
    timeout -s KILL "${NODE_TIMEOUT:-150}" "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank "$k" \
        --node-addr 127.0.0.1 "$@" >"$work/$out" 2>&1 &
    node_pid[k]=$!
}

wait_nodes() {
    local k rc
    for ((k = 0; k < $2; k++)); do
        [ -n "${node_pid[k]:-}" ] || continue
        wait "${node_pid[k]}"; rc=$?
        [ $rc -eq 0 ] || fail "$1: node $k exit $rc: $(tail -5 "$work/$1.n$k")
errors: $(grep -hi "error\|failed\|cannot\|refused" "$work/$1".n* | grep -v "^ *\[" | head -8)"
    done
}
