#!/usr/bin/env bash
# fault_bench.sh - what the supervisor's fault tolerance costs and how fast it acts, on the
# embedded default model (4 layers, hidden 256, byte-level, licence texts, global batch 32)
# under the supervisor.
#
#   bench/fault_bench.sh [COHORT]          (COHORT: the cohort binary, default build/cohort)
#
# Part 1, overhead: the embedded job with --train-iters $ITERS on 2 ranks, three ways, in
# alternation (the order rotates every repetition; the machine is noisy):
#   disabled   --rerun-mode disabled          (heartbeats every 1 s)
#   validate   the default, validate_results  (heartbeats every 1 s)
#   hb10x      validate_results with --inprocess-heartbeat-interval 0.1 (bounds the heartbeats)
# per run the median and mean of elapsed_ms_per_iteration from the metrics file, iterations
# after the first $WARM; the summary pools every run's steps per configuration.
#
# Part 2, faults: one run per fault (injected at step $FAULT_STEP of $FAULT_ITERS, on rank 0)
# for each world size in $NPROCS; from the run report: detection_ms and recovery_ms; from
# stderr and stdout, time-stamped here as the lines arrive: injection -> the supervisor's
# first line about it, and injection -> the log line of iteration $FAULT_STEP (the first step
# completed after recovery); and the run's median step time. The target: a crash costs at
# most 2 s + one step, a hang or a stopped rank (SIGSTOP) the soft timeout + 2 s + one step.
#
# Part 3, nodes (PARTS=nodes; not in the default): a node lost whole (its agent and workers
# SIGKILLed after iteration 5) on several nodes on this host, REPS times each way: replaced by
# a new agent of the node (3 nodes, tp 2 x dp 3, the agent started once the supervisor finds
# the node lost), and taken by a spare node (4 nodes, --inprocess-active-world-size 6
# --inprocess-granularity node); from node 0's stamped output: kill -> found lost, found lost
# -> the new generation assigned (the supervisor's "resume" line), found lost -> the next step
# logged, the new agent's start -> the next step, kill -> the next step.
#
# Environment: REPS (3), ITERS (60), WARM (5), NPROCS ("2 4"), FAULT_ITERS (18), NODE_ITERS (200),
# FAULT_STEP (12), REANALYZE=DIR (print the tables again from a kept work directory), PARTS ("overhead faults"), FAULTS (the fault runs, default all of
# kill-forward kill-allreduce hang-2s hang-learned stop-2s stop-learned nan bitflip-grad
# bitflip-param msg-drop), KEEP=1 keeps the work directory. The output starts with the CPU (bench/cpuinfo.py:
# model name, ISA flags).
set -uo pipefail
cohort=${1:-build/cohort}
[ -x "$cohort" ] || { echo "fault_bench: no executable $cohort (build first)" >&2; exit 2; }
cohort=$(readlink -f "$cohort")
REPS=${REPS:-3} ITERS=${ITERS:-60} WARM=${WARM:-5} NPROCS=${NPROCS:-2 4}
FAULT_ITERS=${FAULT_ITERS:-18} FAULT_STEP=${FAULT_STEP:-12} PARTS=${PARTS:-overhead faults}
if [ -n "${REANALYZE:-}" ]; then
    work=$REANALYZE # tables again from a kept work directory (same settings), nothing run
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-fault-bench.XXXXXX")
    trap '[ -n "${KEEP:-}" ] && echo "work directory kept: $work" >&2 || rm -rf "$work"' EXIT
fi
py=/usr/bin/python3

# every line prefixed with the wall-clock time it arrived (s, ms resolution)
stamp() { perl -MTime::HiRes=time -ne 'BEGIN { $| = 1 } printf "%.3f %s", time, $_'; }

# job NAME ARGS...: the embedded job under the supervisor, own work directory (corpus and
# index caches), stamped output in $work/NAME.{out,err}, metrics and run report beside them
job() {
    local name=$1; shift
    [ -z "${REANALYZE:-}" ] || return 0
    awk '{print $1}' /proc/loadavg >"$work/$name.load"
    ( "$cohort" train --workdir "$work/wd" --log-interval 1 --metrics-file "$work/$name.jsonl" \
        --run-report "$work/$name.report.json" "$@" 2>&1 1>&3 3>&- | stamp >"$work/$name.err"
      exit "${PIPESTATUS[0]}" ) 3>&1 | stamp >"$work/$name.out"
    local rc=${PIPESTATUS[0]}
    awk '{print $1}' /proc/loadavg >>"$work/$name.load"
    echo "$rc" >"$work/$name.rc"
    [ "$rc" -eq 0 ] || echo "fault_bench: $name exited $rc: $(grep -v '^[0-9.]* cohort rank' "$work/$name.err" | tail -3)" >&2
}

echo "# fault_bench: $(date -u '+%F %T') UTC, $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# cohort: $cohort"
echo "# $($py "$(dirname "$0")/cpuinfo.py")"
# corpus and dataset indices built once, outside any timing
job prep --nproc-per-node 2 --train-iters 2 --eval-iters 1 >/dev/null

if [[ " $PARTS " == *" overhead "* ]]; then
    configs=(disabled validate hb10x)
    declare -A flags=([disabled]="--rerun-mode disabled" [validate]="" [hb10x]="--inprocess-heartbeat-interval 0.1")
    runs=()
    for ((r = 1; r <= REPS; r++)); do
        for ((k = 0; k < 3; k++)); do
            c=${configs[$(((k + r - 1) % 3))]}
            # shellcheck disable=SC2086
            job "ovh-$c-$r" --nproc-per-node 2 --train-iters "$ITERS" ${flags[$c]}
            runs+=("ovh-$c-$r")
            echo "#   $c rep $r done (load $(paste -sd' ' "$work/ovh-$c-$r.load"))" >&2
        done
    done
    echo
    echo "## Overhead: embedded model, 2 ranks, --train-iters $ITERS, iterations $((WARM + 1))..$ITERS, $REPS repetitions"
    $py - "$work" "$WARM" "${runs[@]}" <<'PY'
import json, statistics as st, sys, os
work, warm, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def steps(name):
    out = []
    for line in open(os.path.join(work, name + ".jsonl")):
        r = json.loads(line)
        if "elapsed_ms_per_iteration" in r and r["iteration"] > warm:
            out.append(r["elapsed_ms_per_iteration"])
    return out
def report(name):
    try: return json.load(open(os.path.join(work, name + ".report.json")))
    except Exception: return {}
per = {}
print("\n| rep | config | load before/after | steps | median ms/iter | mean ms/iter | replays | rc |")
print("|---:|---|---|---:|---:|---:|---:|---:|")
for name in runs:
    _, cfg, rep = name.split("-")
    s = steps(name)
    rp = report(name)
    load = "/".join(open(os.path.join(work, name + ".load")).read().split())
    rc = open(os.path.join(work, name + ".rc")).read().strip()
    per.setdefault(cfg, []).append((int(rep), s))
    print(f"| {rep} | {cfg} | {load} | {len(s)} | {st.median(s):.1f} | {st.mean(s):.1f} | {rp.get('replays', '—')} | {rc} |")
base_pool = [x for _, s in per["disabled"] for x in s]
base = st.median(base_pool)
base_by_rep = {r: st.median(s) for r, s in per["disabled"]}
print("\n| config | runs | median ms/iter (all steps) | run medians min–max | mean ms/iter | 5th percentile ms/iter | fastest step ms | vs disabled (pooled median) | vs disabled (5th percentile) | vs disabled, paired per repetition: median (min..max) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
def p5(xs):
    xs = sorted(xs)
    return xs[len(xs) // 20]
base_p5 = p5(base_pool)
summary = {}
for cfg in ("disabled", "validate", "hb10x"):
    if cfg not in per: continue
    pool = [x for _, s in per[cfg] for x in s]
    meds = [st.median(s) for _, s in per[cfg]]
    med = st.median(pool)
    d = 100 * (med / base - 1)
    paired = sorted(100 * (st.median(s) / base_by_rep[r] - 1) for r, s in per[cfg] if r in base_by_rep)
    summary[cfg] = (med, d, paired)
    pc = "—" if cfg == "disabled" else f"{st.median(paired):+.2f}% ({paired[0]:+.2f}..{paired[-1]:+.2f})"
    q = p5(pool)
    print(f"| {cfg} | {len(meds)} | {med:.1f} | {min(meds):.1f}–{max(meds):.1f} | {st.mean(pool):.1f} | {q:.1f} | {min(pool):.1f} | "
          f"{'—' if cfg == 'disabled' else f'{d:+.2f}%'} | {'—' if cfg == 'disabled' else f'{100 * (q / base_p5 - 1):+.2f}%'} | {pc} |")
if "validate" in summary and "hb10x" in summary:
    v, h = summary["validate"][1], summary["hb10x"][1]
    print(f"\nvalidation (gate) vs disabled: {v:+.2f}% of step time (target <= 1%)")
    print(f"heartbeats at 10 Hz vs 1 Hz: {h - v:+.2f}%; one 1 Hz heartbeat stream is about a ninth of that: {(h - v) / 9:+.3f}%")
    print(f"validation + heartbeats (1 Hz) estimate: {v + max(0.0, (h - v) / 9):+.2f}% (target <= 1%)")
PY
fi

if [[ " $PARTS " == *" faults "* ]]; then
    S=$FAULT_STEP
    quick=(--inprocess-soft-timeout 2 --inprocess-hard-timeout 4)
    read -r -a names <<<"${FAULTS:-kill-forward kill-allreduce hang-2s hang-learned stop-2s stop-learned nan bitflip-grad bitflip-param msg-drop}"
    declare -A spec=(
        [kill-forward]="kill@rank=0,step=$S,phase=forward"
        [kill-allreduce]="kill@rank=0,step=$S,phase=allreduce"
        [hang-2s]="hang@rank=0,step=$S" [hang-learned]="hang@rank=0,step=$S"
        [stop-2s]="stop@rank=0,step=$S" [stop-learned]="stop@rank=0,step=$S"
        [nan]="nan@rank=0,step=$S"
        [bitflip-grad]="bitflip-grad@rank=0,step=$S,bit=30"
        [bitflip-param]="bitflip-param@rank=0,step=$S,bit=30"
        [msg-drop]="msg-drop@rank=0,step=$S")
    fruns=()
    for n in $NPROCS; do
        for f in "${names[@]}"; do
            extra=()
            case $f in *-2s) extra=("${quick[@]}");; esac
            job "flt-$n-$f" --nproc-per-node "$n" --train-iters "$FAULT_ITERS" --eval-iters 1 \
                --inject "${spec[$f]}" "${extra[@]}"
            fruns+=("flt-$n-$f")
            echo "#   $f on $n ranks done" >&2
        done
    done
    echo
    echo "## Faults: embedded model, injected on rank 0 at step $S of $FAULT_ITERS (validate_results)"
    $py - "$work" "$WARM" "$S" "${fruns[@]}" <<'PY'
import json, re, statistics as st, sys, os
work, warm, S, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def lines(path):
    out = []
    for l in open(path, errors="replace"):
        t, _, rest = l.partition(" ")
        try: out.append((float(t), rest.rstrip("\n")))
        except ValueError: pass
    return out
rows = []
print("\n| ranks | fault | reported (kind, diagnosis) | detection ms | recovery ms | detection + recovery ms | injection → supervisor's first line ms | injection → iteration %d logged ms | iteration %d ms (metrics) | median step ms | target ms ([soft timeout +] 2 s + one step) | within? | rc |" % (S, S))
print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for name in runs:
    _, n, fault = name.split("-", 2)
    base = os.path.join(work, name)
    rc = open(base + ".rc").read().strip()
    try: rep = json.load(open(base + ".report.json"))
    except Exception: rep = {"faults": []}
    # the fault at step S, and a restart that follows from it (a stopped rank killed after
    # the barrier timeout is listed with iteration -1)
    fs = [f for f in rep.get("faults", []) if f.get("iteration") == S or
          (f.get("recovered_by") and f.get("iteration", 0) < 0)] or \
         [f for f in rep.get("faults", []) if f.get("recovered_by")]
    # the injection itself is listed too (kind "injected"); a message fault has no diagnosis
    diag = [f for f in fs if f["kind"] != "injected"]
    kinds = ", ".join(f"{f['kind']} ({f.get('diagnosis', '?')})" for f in diag) or \
        ("injection only" if fs else "—")
    det = [f["detection_ms"] for f in fs if "detection_ms" in f]
    rec = [f["recovery_ms"] for f in fs if "recovery_ms" in f]
    # the first fault of the run carries the timeline; a second (a stopped rank killed
    # after the hard timeout) is part of the same recovery
    d0 = det[0] if det else None
    r0 = rec[0] if rec else None
    err, out = lines(base + ".err"), lines(base + ".out")
    t_inj = next((t for t, l in err if " inject: " in l), None)
    t_sup = next((t for t, l in err if t_inj is not None and t >= t_inj and l.startswith("cohort supervisor:")), None)
    t_step = None
    for t, l in out:
        m = re.search(r"\] iteration +(\d+)/", l)
        if m and int(m.group(1)) >= S and t_inj is not None and t >= t_inj:
            t_step = t; break
    steps, step_s = [], None
    for l in open(base + ".jsonl"):
        r = json.loads(l)
        if "elapsed_ms_per_iteration" not in r: continue
        if r["iteration"] == S: step_s = r["elapsed_ms_per_iteration"]
        if r["iteration"] > warm and r["iteration"] not in (S, S + 1):
            steps.append(r["elapsed_ms_per_iteration"])
    med = st.median(steps) if steps else float("nan")
    f = lambda x: "—" if x is None else f"{x:.0f}"
    inj_sup = None if t_sup is None else 1000 * (t_sup - t_inj)
    inj_step = None if t_step is None else 1000 * (t_step - t_inj)
    # a hang is detected after the soft timeout (in the report's text); the target adds it
    soft = [m.group(1) for x in fs for m in [re.search(r"soft timeout ([0-9.]+) s", x.get("text", ""))] if m]
    target = (1000 * float(soft[0]) if soft else 0) + 2000 + med
    within = "—" if inj_step is None else ("yes" if inj_step <= target else f"no (+{inj_step - target:.0f})")
    both = None if d0 is None or r0 is None else d0 + r0
    print(f"| {n} | {fault} | {kinds} | {f(d0)} | {f(r0)} | {f(both)} | {f(inj_sup)} | {f(inj_step)} | {f(step_s)} | {med:.0f} | {target:.0f} | {within} | {rc} |")
    if soft: rows.append(f"{name}: soft timeout {soft[0]} s")
for r in rows: print(f"\n{r}")
PY
fi
if [[ " $PARTS " == *" nodes "* ]]; then
    # several nodes on this host (each its own `cohort train --node-rank K` on 127.0.0.1, CURVE
    # with a job secret), the tiny model of tests/integration/multinode_test.sh, tp 2: node 1
    # lost whole (its agent and workers SIGKILLed) after iteration 5
    NODE_ITERS=${NODE_ITERS:-200}
    tiny=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 2 --hidden-size 32
          --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 12 --lr 1e-3
          --data-cache-path "$work/cache" --log-interval 1 --eval-interval 1000 --eval-iters 1 --threads 1
          --tensor-model-parallel-size 2 --train-iters "$NODE_ITERS"
          --inprocess-heartbeat-interval 0.5 --inprocess-heartbeat-timeout 3)
    [ -n "${REANALYZE:-}" ] || "$cohort" keygen --output "$work/secret" >/dev/null
    now() { perl -MTime::HiRes=time -e 'printf "%.3f\n", time'; }
    # a port with the next 8 free: the supervisor's and the workers' data ports
    free_port() {
        local used p k ok _ addr
        used=" $(tail -qn +2 /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _ addr _; do
            echo $((16#${addr##*:})); done | tr '\n' ' ') "
        for _ in $(seq 50); do
            p=$((20000 + RANDOM % 12000)) ok=1
            for ((k = 0; k <= 8; k++)); do [[ $used == *" $((p + k)) "* ]] && ok=0; done
            [ $ok = 1 ] && break
        done
        echo "$p"
    }
    # node NAME OUT K ARGS...: node K of the job NAME in the background, its stamped output
    # (stdout and stderr) in $work/OUT, its process's pid in $work/OUT.pid
    node() {
        local name=$1 out=$2 k=$3; shift 3
        ( "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank "$k" --node-addr 127.0.0.1 "$@" 2>&1 &
          echo $! >"$work/$out.pid"; wait $! ) | stamp >"$work/$out" &
    }
    waitfor() { # SECONDS FILE PATTERN
        local end=$((SECONDS + $1))
        until grep -q "$3" "$2" 2>/dev/null; do [ $SECONDS -lt $end ] || return 1; sleep 0.05; done
    }
    pids_of() { # the children of pid $1 (a process's name may hold spaces: the fields after ") ")
        local p stat f
        for p in /proc/[0-9]*; do
            { read -r stat <"$p/stat"; } 2>/dev/null || continue
            read -ra f <<<"${stat##*) }"
            [ "${f[1]}" = "$1" ] && echo "${p#/proc/}"
        done
    }
    # node_run NAME NNODES HOW ARGS...: HOW "replaced" (a new agent of node 1 started as soon as the
    # supervisor finds the node lost) or "spare" (warm spares take its ranks); times in $work/NAME.t
    node_run() {
        local name=$1 nn=$2 how=$3 k; shift 3
        [ -z "${REANALYZE:-}" ] || return 0
        net=(--nnodes "$nn" --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$(free_port)"
             --job-secret "$work/secret")
        for ((k = nn - 1; k >= 0; k--)); do node "$name" "$name.n$k" "$k" "$@"; done
        waitfor 120 "$work/$name.n0" "iteration *5/" || { echo "fault_bench: $name made no progress" >&2; return; }
        local agent; agent=$(cat "$work/$name.n1.pid")
        kill -KILL "$agent" $(pids_of "$agent")
        echo "kill $(now)" >"$work/$name.t"
        if [ "$how" = replaced ]; then
            waitfor 60 "$work/$name.n0" "node 1's agent sent nothing" || echo "fault_bench: $name: node 1 not found lost" >&2
            node "$name" "$name.n1b" 1 "$@"
            echo "agent $(now)" >>"$work/$name.t"
        fi
        waitfor 180 "$work/$name.n0" "run report: exit status" || echo "fault_bench: $name did not end" >&2
        sleep 1
        echo "# $name done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    }
    nruns=()
    for ((r = 1; r <= REPS; r++)); do
        node_run "nod-replaced-$r" 3 replaced --node-replacement-timeout 60
        node_run "nod-spare-$r" 4 spare --inprocess-active-world-size 6 --inprocess-granularity node
        nruns+=("nod-replaced-$r" "nod-spare-$r")
    done
    echo
    echo "## Nodes: node 1 lost whole after iteration 5 (tiny model, tp 2, 2 workers per node, heartbeat timeout 3 s)"
    echo "replaced: 3 nodes (tp 2 x dp 3), --node-replacement-timeout 60, a new agent of node 1 started when the"
    echo "supervisor says the node is lost; spare: 4 nodes, --inprocess-active-world-size 6 --inprocess-granularity node"
    $py - "$work" "${nruns[@]}" <<'PY'
import re, statistics as st, sys, os
work, runs = sys.argv[1], sys.argv[2:]
def stamped(path):
    for l in open(path, errors="replace"):
        t, _, rest = l.partition(" ")
        try: yield float(t), rest
        except ValueError: pass
rows = {}
print("\n| run | kill → found lost ms | found lost → new generation assigned ms | found lost → next step ms | new agent started → next step ms | kill → next step ms | rc |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in runs:
    base = os.path.join(work, name)
    try: t = dict(l.split() for l in open(base + ".t"))
    except OSError: continue
    kill = float(t["kill"]); agent = float(t["agent"]) if "agent" in t else None
    lines = list(stamped(base + ".n0"))
    lost = next((ts for ts, l in lines if "node 1's agent sent nothing" in l), None)
    step = next((ts for ts, l in lines if lost and ts >= lost and re.search(r"\] iteration +\d+/", l)), None)
    asg = next((ts for ts, l in lines if lost and ts >= lost and re.search(r"generation \d+: \d+ rank\(s\) resume", l)), None)
    rc = "0" if any("run report: exit status 0" in l for _, l in lines) else "?"
    ms = lambda a, b: None if a is None or b is None else 1000 * (b - a)
    vals = (ms(kill, lost), ms(lost, asg), ms(lost, step), ms(agent, step), ms(kill, step))
    f = lambda x: "—" if x is None else f"{x:.0f}"
    print(f"| {name} | " + " | ".join(f(x) for x in vals) + f" | {rc} |")
    rows.setdefault(name.split("-")[1], []).append(vals)
print("\n| how | runs | median kill → found lost ms | median found lost → assigned ms | median found lost → next step ms | median new agent → next step ms | median kill → next step ms |")
print("|---|---:|---:|---:|---:|---:|---:|")
for how, vs in rows.items():
    med = lambda i: (lambda xs: f"{st.median(xs):.0f}" if xs else "—")([v[i] for v in vs if v[i] is not None])
    print(f"| {how} | {len(vs)} | {med(0)} | {med(1)} | {med(2)} | {med(3)} | {med(4)} |")
PY
fi

echo
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
