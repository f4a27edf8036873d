#!/usr/bin/env bash
# multinode_chaos_test.sh - a schedule of mixed faults in one job of three nodes on this host
# (node 0 the supervisor, nodes 1 and 2 node agents on 127.0.0.1, CURVE with a job secret), each
# node 4 workers of a tp 2 x pp 2 x dp 3 job; the final checkpoint must be bitwise the fault-free
# run's (parameters and both of Adam's moments) and every fault must show in the run report and
# the nodes' logs.
#   multinode_chaos_test.sh COHORT CASE
# Cases:
#   chaos  in one run: a worker killed (rank 5, node 1), a NaN loss (rank 10, node 2), a worker
#          SIGSTOPped (rank 6, node 1), a mantissa bit of a weight flipped (rank 1, node 0: silent
#          data corruption), a worker killed inside its gradients' all-reduce (rank 8, node 2),
#          a step slowed past the soft timeout (a restart), node 1 lost whole as that restart is
#          ordered (its agent and workers SIGKILLed while the survivors rebuild their
#          communicators) and a new agent started for node rank 1; 0 steps lost, bitwise the
#          fault-free run
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir mnchaos

"$cohort" keygen --output "$work/secret" >/dev/null || fail "keygen"
# ranks of tp 2 x pp 2 x dp 3 (tp fastest, then dp, then pp), 4 per node: node 0 holds ranks
# 0-3 (stage 0, dp 0-1), node 1 ranks 4-5 (stage 0, dp 2) and 6-7 (stage 1, dp 0), node 2
# ranks 8-11 (stage 1, dp 1-2): every model shard keeps a replica when one node is lost
tiny_model --global-batch-size 12 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --seq-length 16
iters=40
job=(--train-iters $iters --inprocess-heartbeat-interval 0.5 --inprocess-heartbeat-timeout 5
     --inprocess-soft-timeout 2 --inprocess-hard-timeout 20 --inprocess-barrier-timeout 60
     --node-replacement-timeout 60 --inprocess-restart-limit 20)

NODE_NPROC=4 # (start_nodes, tests/lib.sh: three nodes of 4 workers)

case $case_name in
chaos)
    t_start=$SECONDS
    start_nodes clean 3 "${job[@]}" --save "$work/cs"
    wait_nodes clean 3
    t_clean=$((SECONDS - t_start))
    # (step 22 of rank 0 slowed down by 5 s, no numeric effect: longer than the soft
    # timeout, so the job aborts the generation and restarts; node 1 is killed as that restart
    # is ordered, while the survivors rebuild their communicators)
    faults=(kill@rank=5,step=3 nan@rank=10,step=6 stop@rank=6,step=9 bitflip-param@rank=1,step=12,bit=12
            kill@rank=8,step=15,phase=allreduce slow@rank=0,step=22,ms=5000)
    args=()
    for f in "${faults[@]}"; do args+=(--inject "$f"); done
    start_nodes f 3 "${job[@]}" --save "$work/fs" "${args[@]}"
    # (node 1's processes looked up first: its workers are final once rank 6 was replaced)
    wait_until 60 grep -q "iteration *18/" "$work/f.n0" || fail "no progress: $(grep supervisor "$work/f.n0" | tail -3)"
    old_agent=$(children "${node_pid[1]}"); old_pid=${node_pid[1]}
    [ -n "$old_agent" ] || fail "node 1's agent not found"
    old_workers=$(children "$old_agent")
    [ "$(echo $old_workers | wc -w)" = 4 ] || fail "node 1's workers: $old_workers"
    # (the restart order seen at once, not a poll later: the rebuild takes a fraction of a second)
    timeout 60 grep -m1 -q "generation [0-9]*: 12 rank(s) resume after iteration 21 " < <(tail -n +1 -F "$work/f.n0" 2>/dev/null) ||
        fail "no restart at step 22: $(grep supervisor "$work/f.n0" | tail -3)"
    kill -KILL $old_agent $old_workers
    wait "$old_pid"
    wait_until 20 grep -q "node 1's agent sent nothing for [0-9.]* s .*: the node is lost with its ranks 4 to 7; waiting up to 60.0 s (--node-replacement-timeout) for a new agent of node 1" "$work/f.n0" ||
        fail "node 1 not found lost: $(grep supervisor "$work/f.n0" | tail -5)"
    start_agent f.n1b 1 "${job[@]}" --save "$work/fs" "${args[@]}"
    wait_until 30 grep -q "a new agent of node 1 joined" "$work/f.n0" || fail "the new agent not taken: $(grep supervisor "$work/f.n0" | tail -5)"
    wait_nodes f 3
    t_all=$((SECONDS - t_start))
    # each fault happened, as its node says
    grep -q "rank 5 (node 1, pid [0-9]*) was killed by signal 9" "$work/f.n0" || fail "no kill of rank 5: $(grep supervisor "$work/f.n0")"
    grep -q "starting a replacement in slot 5" "$work/f.n1" || fail "node 1's agent did not replace rank 5: $(grep agent "$work/f.n1")"
    grep -q "worker 6 (pid [0-9]*) is stopped (process state T)" "$work/f.n1" ||
        fail "node 1's agent did not see rank 6 stopped: $(grep agent "$work/f.n1")"
    grep -q "starting a replacement in slot 6" "$work/f.n1" || fail "node 1's agent did not replace rank 6: $(grep agent "$work/f.n1")"
    grep -q "rank 8 (node 2, pid [0-9]*) was killed by signal 9" "$work/f.n0" || fail "no kill of rank 8: $(grep supervisor "$work/f.n0")"
    grep -q "starting a replacement in slot 8" "$work/f.n2" || fail "node 2's agent did not replace rank 8: $(grep agent "$work/f.n2")"
    # (the weights' checksum is one per model replica: every rank of rank 1's, 0, 1, 6 and 7, is
    # repaired from its shard's peer in another replica)
    grep -q "iteration 12: repair (persistent_error): 4 ranks' parameters differ .*(ranks 0, 1, 6, 7;.*silent data corruption" "$work/f.n0" ||
        fail "the flipped weight not repaired: $(grep supervisor "$work/f.n0")"
    # (every rank of a replica reports its loss: the suspect named is one of rank 10's replica)
    grep -q "iteration 6: rerun: rank \(4\|5\|10\|11\): nan_loss (nan); replaying the step in place" "$work/f.n0" ||
        fail "no replay of iteration 6: $(grep supervisor "$work/f.n0")"
    grep -q "a new agent of node 1 joined" "$work/f.n0" || fail "node 1 not replaced"
    /usr/bin/python3 - "$work/f.report.json" <<'PY' || fail "report incomplete: $(cat "$work/f.report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
f = r["faults"]
def has(kind, rank, step=None):
    return any(x["kind"] in kind.split("|") and x["rank"] == rank and (step is None or x["iteration"] == step) for x in f)
kill = "killed|collective|exited"  # whichever the supervisor heard of first
want = [(kill, 5), (kill, 6), ("param_checksum", 1, 12), (kill, 8), ("node_lost", 4)]
# (a hang names the stuck pipeline stage by either of its ranks)
assert any(has("hang", r, 9) for r in (6, 7)), f  # the stopped rank 6
assert any(has("hang", r, 22) for r in range(12)), f  # step 22's slow-down
missing = [w for w in want if not has(*w)]
assert any(has("nan_loss", r, 6) for r in (4, 5, 10, 11)), f
assert not missing, (missing, f)
assert r["restarts"] >= 6 and r["steps_lost"] == 0, r
fired = {i["spec"] for i in r["injections"]["list"] if i["fired"]}
# (a killed or stopped rank's own report of its fault can be lost with it: its restart is in the faults)
assert {"nan@rank=10,step=6", "bitflip-param@rank=1,step=12,bit=12", "slow@rank=0,step=22,ms=5000"} <= fired, fired
PY
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    echo "fault-free run ${t_clean} s, both runs ${t_all} s"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
