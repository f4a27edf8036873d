#!/usr/bin/env bash
# dp_test.sh - multi-process training under the supervisor, one case per meson test.
#   dp_test.sh COHORT CASE
cohort=$1; case_name=$2
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir dp

tiny_model

case $case_name in
matches_one_rank)
    # 1, 2 and 4 ranks on the same global batches agree within fp32 reduction tolerance;
    # each configuration is bitwise reproducible from run to run
    for n in 1 2 4 2; do
        f="$work/m$n.jsonl"; [ -f "$f" ] && f="$work/m${n}b.jsonl"
        "$cohort" train "${tiny[@]}" --nproc-per-node $n --train-iters 5 --metrics-file "$f" >"$work/out$n" 2>&1 \
            || fail "$n ranks: $(tail -5 "$work/out$n")"
    done
    same_losses m2 m2b "2-rank runs differ"
    /usr/bin/python3 - "$work" <<'PY' || fail "ranks disagree"
import json, sys
w = sys.argv[1]
runs = {n: [r for r in map(json.loads, open(f"{w}/m{n}.jsonl")) if "grad_norm" in r] for n in (1, 2, 4)}
assert len(runs[1]) == 5, runs[1]
for n in (2, 4):
    for a, b in zip(runs[1], runs[n]):
        for k in ("lm_loss", "grad_norm"):
            rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-12)
            # fp32 sums in another order: a few ulp per element, a few 1e-7 relative after 5 steps
            if rel > 1e-5:
                print(f"{n} ranks, iteration {a['iteration']}: {k} {b[k]} vs {a[k]} (rel {rel:.2e})"); sys.exit(1)
print("ok: 1/2/4 ranks agree")
PY
    ;;
worker_killed)
    # without in-process restart a dead worker is a clear job-level error (the fault suite
    # covers the restart)
    train_bg out 3 --nproc-per-node 2 --train-iters 100000 --no-inprocess-restart
    sup=$job
    victim=$(children $sup | tail -1); [ -n "$victim" ] || fail "no worker found"
    kill -9 "$victim"
    wait_gone $sup 30 || fail "supervisor still running 30 s after a worker died"
    wait $sup; rc=$?
    [ $rc -eq 4 ] || fail "exit $rc, want 4: $(tail -5 "$work/out")"
    grep -q "was killed by signal 9" "$work/out" || fail "no diagnosis: $(tail -5 "$work/out")"
    ;;
sigterm)
    train_bg out 2 --nproc-per-node 2 --train-iters 100000
    sup=$job
    kill -TERM $sup
    wait $sup; rc=$?
    [ $rc -eq 0 ] || fail "exit $rc after SIGTERM: $(tail -5 "$work/out")"
    grep -q "stopped by signal after iteration" "$work/out" || fail "no clean stop: $(tail -5 "$work/out")"
    ;;
any_order)
    # rank 0 registers last, seconds after the others: `cohort status` shows ranks 1 and 2
    # registered (their host known) while rank 0 is not, and the rendezvous still completes
    COHORT_TEST_REGISTER_DELAY=0:6000,2:700 "$cohort" train "${tiny[@]}" --nproc-per-node 3 --global-batch-size 6 \
        --train-iters 2 >"$work/out" 2>&1 &
    sup=$!
    registered() { # which slots registered, in rank order: "no yes yes"
        "$cohort" status --json $sup 2>/dev/null |
            /usr/bin/python3 -c 'import json, sys; print(" ".join("yes" if r["host"] else "no" for r in json.load(sys.stdin)["ranks"]))'
    }
    wait_until 30 eval '[ "$(registered)" = "no yes yes" ]' ||
        fail "ranks 1 and 2 not seen registered before rank 0: $(registered); $(tail -3 "$work/out")"
    wait $sup || fail "$(tail -5 "$work/out")"
    grep -q "iteration        2/       2" "$work/out" || fail "did not train"
    ;;
killed_in_rendezvous)
    COHORT_TEST_REGISTER_DELAY=1:20000 "$cohort" train "${tiny[@]}" --nproc-per-node 2 --train-iters 2 >"$work/out" 2>&1 &
    sup=$!
    wait_until 30 eval '[ "$(children $sup | wc -l)" -ge 2 ]' # both workers started
    victim=$(children $sup | tail -1); [ -n "$victim" ] || fail "no worker found"
    kill -9 "$victim"
    wait_gone $sup 30 || fail "supervisor still running 30 s after a worker died in rendezvous"
    wait $sup; rc=$?
    [ $rc -eq 4 ] || fail "exit $rc, want 4: $(tail -5 "$work/out")"
    ;;
slow_link_start)
    # a worker whose link to the supervisor starts after its start and stop timeouts (10 s each): the
    # worker gives up with status 1 and its still-running link thread keeps the memory it
    # reads (freeing it corrupted the heap: SIGABRT or SIGSEGV); the job stops with 4
    COHORT_TEST_REGISTER_DELAY=1:25000 "$cohort" train "${tiny[@]}" --nproc-per-node 2 --train-iters 2 >"$work/out" 2>&1
    rc=$?
    [ $rc -eq 4 ] || fail "exit $rc, want 4: $(tail -5 "$work/out")"
    grep -q "actor worker-link did not stop within .* its memory is left to it" "$work/out" ||
        fail "the link's slow start did not happen: $(tail -5 "$work/out")"
    grep -q "rank 1 (node 0, pid [0-9]*) exited with status 1" "$work/out" ||
        fail "rank 1 did not exit cleanly: $(grep 'rank 1' "$work/out")"
    ! grep -qiE "corrupted|double free|signal (6|11)" "$work/out" || fail "$(grep -iE 'corrupted|double free|signal' "$work/out")"
    ;;
two_nodes)
    # two nodes on one machine over tcp: node 0's supervisor, node 1's agent, CURVE with the job secret
    "$cohort" keygen --output "$work/secret" >/dev/null || fail "keygen"
    port=$((20000 + RANDOM % 20000))
    net=(--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $port --job-secret "$work/secret")
    # (both nodes are this machine: node 1 says so rather than resolving its host name)
    "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank 1 --node-addr 127.0.0.1 --train-iters 3 >"$work/n1" 2>&1 &
    agent=$!
    "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank 0 --train-iters 3 --metrics-file "$work/m.jsonl" >"$work/n0" 2>&1 ||
        fail "node 0: $(tail -5 "$work/n0"); node 1: $(tail -5 "$work/n1")"
    wait $agent || fail "node 1: $(tail -5 "$work/n1")"
    # the log lines and metrics of the last rank (on node 1) reach node 0's supervisor
    grep -q "2 ranks" "$work/n0" && grep -q "iteration        3/       3" "$work/n0" || fail "$(cat "$work/n0")"
    [ "$(grep -c '"grad_norm"' "$work/m.jsonl")" -eq 3 ] || fail "metrics not gathered: $(cat "$work/m.jsonl")"
    ;;
keyless_peer)
    # a process without the job's secret attacks every data port of a 2-node job on tcp
    # (plain ZeroMQ claiming each rank's routing id with data-plane-shaped junk, CURVE with a
    # foreign key, raw bytes): the job never sees it, needs no restart, and ends with the
    # parameters and optimizer state bitwise equal to the undisturbed run's
    intruder=${COHORT_BUILD_ROOT:?}/tests/integration/intruder
    "$cohort" keygen --output "$work/secret" >/dev/null || fail "keygen"
    two_node_run() { # DIR PORT
        local net=(--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $2 --job-secret "$work/secret")
        # (both nodes name the save directory: each node's ranks write their share)
        timeout -s KILL 120 "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank 1 --node-addr 127.0.0.1 \
            --train-iters 12 --save "$1" --save-interval 12 >"$1.n1" 2>&1 &
        local agent=$!
        timeout -s KILL 120 "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank 0 --train-iters 12 --save "$1" \
            --save-interval 12 >"$1.n0" 2>&1 || fail "node 0: $(tail -5 "$1.n0"); node 1: $(tail -5 "$1.n1")"
        wait $agent || fail "node 1: $(tail -5 "$1.n1")"
    }
    port=$((20000 + RANDOM % 20000))
    two_node_run "$work/calm" $port
    port=$((port + 10))
    ( while :; do "$intruder" 127.0.0.1 1 2 $((port + 1)) $((port + 2)) $((port + 3)); done ) >"$work/intruder.log" 2>&1 &
    attacker=$!
    sleep 0.5
    two_node_run "$work/attacked" $port
    kill $attacker; wait $attacker 2>/dev/null
    grep -q "intruder: [1-9][0-9]* plain connections claiming ranks, [1-9][0-9]* CURVE with a foreign key, [1-9][0-9]* raw" \
        "$work/intruder.log" || fail "the intruder did not run: $(tail -3 "$work/intruder.log")"
    for f in "$work/attacked.n0" "$work/attacked.n1"; do
        ! grep -q "restart into generation\|protocol violation\|was killed by\|exited with status" "$f" ||
            fail "the job noticed the intruder: $(grep -v '  iteration ' "$f" | tail -8)"
    done
    grep -q "iteration       12/      12" "$work/attacked.n0" || fail "$(tail -5 "$work/attacked.n0")"
    ckpt_same "$work/calm/iter_0000012" "$work/attacked/iter_0000012" "the attacked run's final state"
    ;;
wrong_key)
    # a node whose secret is not the job's is refused: its worker never registers
    "$cohort" keygen --output "$work/secret" >/dev/null && "$cohort" keygen --output "$work/other" >/dev/null || fail "keygen"
    port=$((20000 + RANDOM % 20000))
    net=(--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $port --rendezvous-timeout 4)
    "$cohort" train "${tiny[@]}" "${net[@]}" --job-secret "$work/other" --node-rank 1 --node-addr 127.0.0.1 \
        --train-iters 3 >"$work/n1" 2>&1 &
    agent=$!
    "$cohort" train "${tiny[@]}" "${net[@]}" --job-secret "$work/secret" --node-rank 0 --train-iters 3 >"$work/n0" 2>&1; rc=$?
    [ $rc -eq 5 ] || fail "node 0 exit $rc, want 5 (rendezvous): $(tail -5 "$work/n0")"
    grep -q "1 of 2 workers registered" "$work/n0" || fail "$(tail -5 "$work/n0")"
    wait $agent; [ $? -ne 0 ] || fail "the refused node reported success"
    ;;
flags_differ)
    # a node whose training flags differ from node 0's (here: no --save, another --lr) is
    # refused at registration with the flags that differ, and both nodes stop at once (it
    # used to train, and the final save waited 600 s for the node that had no --save)
    "$cohort" keygen --output "$work/secret" >/dev/null || fail "keygen"
    port=$((20000 + RANDOM % 20000))
    net=(--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $port --job-secret "$work/secret")
    timeout -s KILL 60 "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank 1 --node-addr 127.0.0.1 --train-iters 3 \
        --lr 2e-3 >"$work/n1" 2>&1 &
    agent=$!
    timeout -s KILL 60 "$cohort" train "${tiny[@]}" "${net[@]}" --node-rank 0 --train-iters 3 --save "$work/ckpt" \
        --metrics-file "$work/m.jsonl" >"$work/n0" 2>&1; rc=$?
    [ $rc -eq 2 ] || fail "node 0 exit $rc, want 2 (usage): $(tail -5 "$work/n0")"
    grep -q "training flags differ from node .*--lr .*--save " "$work/n0" ||
        grep -q "training flags differ from node .*--save .*--lr " "$work/n0" || fail "$(tail -5 "$work/n0")"
    ! grep -q "metrics-file\|node-rank\|node-addr" <(grep "flags differ" "$work/n0" | sed 's/(only.*//') ||
        fail "node-local flags named: $(grep 'flags differ' "$work/n0")"
    wait $agent; rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 137 ] || fail "the refused node exited $rc: $(tail -5 "$work/n1")"
    ! grep -q '"grad_norm"' "$work/m.jsonl" 2>/dev/null || fail "the job trained"
    ;;
reshard)
    # a checkpoint saved at data-parallel size 2 resumes at 4 (and at 1) with the data position
    # kept: iterations 5..8 continue from the same consumed samples and match one
    # uninterrupted run within fp32 reduction tolerance
    "$cohort" train "${tiny[@]}" --nproc-per-node 2 --train-iters 8 --save "$work/ck" --save-interval 4 \
        --exit-interval 4 >"$work/o1" 2>&1 || fail "save at 2: $(tail -5 "$work/o1")"
    for n in 4 1; do
        "$cohort" train "${tiny[@]}" --nproc-per-node $n --train-iters 8 --load "$work/ck" \
            --metrics-file "$work/r$n.jsonl" >"$work/o$n" 2>&1 || fail "load at $n: $(tail -5 "$work/o$n")"
    done
    "$cohort" train "${tiny[@]}" --train-iters 8 --metrics-file "$work/full.jsonl" >/dev/null 2>&1 || fail "full run"
    /usr/bin/python3 - "$work" <<'PY' || fail "resumed runs differ from the uninterrupted one"
import json, sys
w = sys.argv[1]
rows = lambda f: {r["iteration"]: r for r in map(json.loads, open(f"{w}/{f}")) if "grad_norm" in r}
full = rows("full.jsonl")
for n in (4, 1):
    got = rows(f"r{n}.jsonl")
    assert sorted(got) == [5, 6, 7, 8], (n, sorted(got))
    for it, r in got.items():
        assert r["consumed_samples"] == full[it]["consumed_samples"], (n, it)
        rel = abs(r["lm_loss"] - full[it]["lm_loss"]) / full[it]["lm_loss"]
        assert rel < 1e-5, (n, it, r["lm_loss"], full[it]["lm_loss"])
print("ok: resharded resume matches")
PY
    ;;
resume_exact)
    # data parallel, 2 and 4 ranks (each rank writes its share of the checkpoint, the
    # supervisor commits): 8 iterations in one go, and 4 + 4 with a checkpoint and a new job
    # in between (sync and async save), give bitwise the same parameters, optimizer state
    # and logged losses
    for n in 2 4; do
        "$cohort" train "${tiny[@]}" --nproc-per-node $n --train-iters 8 --save "$work/a$n" \
            --metrics-file "$work/a$n.jsonl" >"$work/oa" 2>&1 || fail "$n ranks uninterrupted: $(tail -5 "$work/oa")"
        [ "$(grep -o '"writer": *[0-9]*' "$work/a$n/iter_0000008/manifest.json" | sort -u | wc -l)" -eq $n ] ||
            fail "$n ranks: not every rank wrote files: $(grep -o '"writer": *[0-9]*' "$work/a$n/iter_0000008/manifest.json")"
        for mode in sync async; do
            extra=(); [ $mode = async ] && extra=(--async-save)
            d=$work/$mode$n
            "$cohort" train "${tiny[@]}" --nproc-per-node $n --train-iters 8 --save "$d" --save-interval 4 \
                --exit-interval 4 "${extra[@]}" --metrics-file "$d.jsonl" >"$work/o1$mode" 2>&1 \
                || fail "$n ranks, first half ($mode): $(tail -5 "$work/o1$mode")"
            "$cohort" ckpt verify "$d" >/dev/null 2>&1 || fail "$n ranks ($mode): the checkpoint does not verify"
            "$cohort" train "${tiny[@]}" --nproc-per-node $n --train-iters 8 --save "$d" --load "$d" \
                "${extra[@]}" --metrics-file "$d.jsonl" >"$work/o2$mode" 2>&1 \
                || fail "$n ranks, second half ($mode): $(tail -5 "$work/o2$mode")"
            "$cohort" ckpt diff "$work/a$n" "$d" >"$work/diff$mode" 2>&1 \
                || fail "$n ranks, $mode: checkpoints at iteration 8 differ: $(head -5 "$work/diff$mode")"
            [ "$(losses "$work/a$n.jsonl")" = "$(losses "$d.jsonl")" ] || fail "$n ranks, $mode: logged losses differ"
        done
    done
    ;;
resume_direct)
    # the same with a model whose files span several 8 MiB blocks per rank, so that saves and
    # cold loads go through direct I/O (checkpoint/dio.c) wherever the file system takes it
    big=("${tiny[@]}" --vocab-size 32768 --hidden-size 128)
    "$cohort" train "${big[@]}" --nproc-per-node 2 --train-iters 6 --save "$work/a" --metrics-file "$work/a.jsonl" \
        >"$work/oa" 2>&1 || fail "uninterrupted: $(tail -5 "$work/oa")"
    "$cohort" train "${big[@]}" --nproc-per-node 2 --train-iters 6 --save "$work/b" --save-interval 3 --exit-interval 3 \
        --async-save --metrics-file "$work/b.jsonl" >"$work/o1" 2>&1 || fail "first half: $(tail -5 "$work/o1")"
    if dd if=/dev/zero of="$work/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then # O_DIRECT here
        grep -q "successfully saved checkpoint .*direct I/O" "$work/o1" || fail "no direct I/O: $(grep saved "$work/o1")"
    fi
    "$cohort" ckpt verify "$work/b" >/dev/null 2>&1 || fail "the checkpoint does not verify"
    "$cohort" train "${big[@]}" --nproc-per-node 2 --train-iters 6 --save "$work/b" --load "$work/b" --async-save \
        --metrics-file "$work/b.jsonl" >"$work/o2" 2>&1 || fail "second half: $(tail -5 "$work/o2")"
    ckpt_same "$work/a" "$work/b" "checkpoints differ"
    same_losses a b "logged losses differ"
    ;;
embedded)
    "$cohort" train --nproc-per-node 4 --train-iters 4 --log-interval 2 --eval-iters 1 --workdir "$work/w" \
        --sample-lines 1 >"$work/out" 2>&1 || fail "$(tail -5 "$work/out")"
    grep -q "4 ranks" "$work/out" || fail "not data-parallel: $(head -5 "$work/out")"
    [ "$(grep -c '^  > ' "$work/out")" -eq 1 ] || fail "no sample: $(tail -5 "$work/out")"
    ;;
sigint_group|sigterm_group|sigterm_one_worker|sigint_supervisor)
    # Ctrl-C / SIGTERM as a terminal, Slurm or a container runtime sends them (to the whole
    # process group), to the supervisor alone, or to one worker alone (a scheduler killing
    # it): the job finishes its step on every rank, saves, writes the run report, exits 0
    set -m # the job in its own process group, as a terminal's foreground job is
    "$COHORT_CPU_EXE" train --device cpu "${tiny[@]}" --nproc-per-node 2 --train-iters 100000 --save "$work/ck" >"$work/out" 2>&1 &
    sup=$!
    wait_until 60 grep -q "iteration        3/" "$work/out" || fail "no progress within 60 s"
    case $case_name in
    sigint_group) kill -INT -- -$sup ;;
    sigterm_group) kill -TERM -- -$sup ;;
    sigint_supervisor) kill -INT $sup ;;
    sigterm_one_worker)
        victim=$(children $sup | tail -1); [ -n "$victim" ] || fail "no worker found"
        kill -TERM "$victim" ;;
    esac
    wait $sup; rc=$?
    [ $rc -eq 0 ] || fail "exit $rc, want 0: $(grep -v '  iteration ' "$work/out" | tail -8)"
    line=$(grep -o "stopped by signal after iteration [0-9]*" "$work/out") || fail "no clean stop: $(tail -5 "$work/out")"
    it=${line##* }
    last=$(grep -o "iteration *[0-9]*/" "$work/out" | tail -1 | grep -o "[0-9]*")
    [ "$it" = "$last" ] && [ "$it" -ge 3 ] || fail "stopped after $it, last logged iteration $last"
    ! grep -q "restart into generation\|was killed by\|exited with status" "$work/out" || fail "taken for a fault: $(grep -v '  iteration ' "$work/out" | tail -8)"
    "$cohort" ckpt verify "$work/ck" >"$work/verify" 2>&1 || fail "the final checkpoint does not verify: $(tail -3 "$work/verify")"
    [ "$(cat "$work/ck/latest_checkpointed_iteration.txt")" = "$it" ] || fail "latest checkpoint $(cat "$work/ck/latest_checkpointed_iteration.txt"), stopped after $it"
    [ -d "$work/ck/iter_$(printf %07d "$it")" ] || fail "no checkpoint of iteration $it: $(ls "$work/ck")"
    /usr/bin/python3 - "$work/ck/run_report.json" "$case_name" <<'PY' || fail "run report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["exit_status"] == 0, r["exit_status"]
sig = [f for f in r["faults"] if f["kind"] == "signal"]
assert sig, r["faults"]
want = "Terminated" if "sigterm" in sys.argv[2] else "Interrupt"
assert want in sig[0].get("diagnosis", "") + sig[0].get("text", ""), sig
assert len(r["faults"]) == len(sig), r["faults"]   # nothing else happened
PY
    ;;
sigint_rendezvous)
    # a group signal while the workers are still starting (some in the dynamic loader,
    # before their own handlers exist, some registered): a clean stop with nothing trained,
    # exit 0, the run report written in --save
    set -m
    for delay in 0.05 0.5 1.2; do
        rm -rf "$work/ck"
        COHORT_TEST_REGISTER_DELAY=1:3000 "$COHORT_CPU_EXE" train --device cpu "${tiny[@]}" --nproc-per-node 2 --train-iters 100000 \
            --save "$work/ck" >"$work/out" 2>&1 &
        sup=$!
        # (the supervisor's own handler first: it exists about 2 ms after exec, from main.c's
        # preinit; a loaded machine can keep a process in the dynamic loader longer than 0.05 s,
        # and a signal there kills it as any program's would; before the exec the process is
        # the forked shell, which under job control catches SIGINT itself)
        wait_handles_sigint $sup "$COHORT_CPU_EXE"
        sleep $delay
        kill -INT -- -$sup
        wait $sup; rc=$?
        [ $rc -eq 0 ] || fail "signal at $delay s: exit $rc, want 0: $(tail -6 "$work/out")"
        grep -q "stopped by signal\|before training began" "$work/out" || fail "signal at $delay s: $(tail -5 "$work/out")"
        ! grep -q "restart into generation" "$work/out" || fail "signal at $delay s: restarted: $(tail -5 "$work/out")"
        # (a signal before the supervisor started has no job to report on)
        grep -q "during setup: nothing trained" "$work/out" || [ -s "$work/ck/run_report.json" ] ||
            fail "signal at $delay s: no run report: $(tail -3 "$work/out")"
    done
    ;;
second_signal)
    # a second Ctrl-C stops at once: exit 130 (128 + SIGINT), the step in progress is not
    # finished (rank 0 sleeps 4 s in step 6), the run report says so
    set -m
    "$COHORT_CPU_EXE" train --device cpu "${tiny[@]}" --nproc-per-node 2 --train-iters 100000 --save "$work/ck" --save-interval 2 \
        --inject slow@rank=0,step=6,phase=allreduce,ms=4000 >"$work/out" 2>&1 &
    sup=$!
    wait_until 60 grep -q "iteration        5/" "$work/out" || fail "no progress within 60 s"
    kill -INT -- -$sup
    sleep 0.5
    t0=$(date +%s%N)
    kill -INT -- -$sup
    wait $sup; rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ $rc -eq 130 ] || fail "exit $rc, want 130: $(grep -v '  iteration ' "$work/out" | tail -6)"
    [ $ms -lt 3000 ] || fail "took $ms ms to stop after the second signal"
    grep -q "second Interrupt" "$work/out" || fail "$(tail -5 "$work/out")"
    ! grep -q "stopped by signal after" "$work/out" || fail "finished the step: $(tail -5 "$work/out")"
    ! grep -q "iteration        6/" "$work/out" || fail "iteration 6 completed"
    /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['exit_status']==130, r['exit_status']" \
        "$work/ck/run_report.json" || fail "run report"
    "$cohort" ckpt verify "$work/ck" >/dev/null 2>&1 || fail "the last committed checkpoint does not verify"
    [ "$(cat "$work/ck/latest_checkpointed_iteration.txt")" = 4 ] || fail "latest $(cat "$work/ck/latest_checkpointed_iteration.txt"), want 4"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok $case_name"
