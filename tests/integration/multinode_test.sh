#!/usr/bin/env bash
# multinode_test.sh - a job of several nodes on this host (each node its own `cohort train
# --node-rank N` on 127.0.0.1: node 0 the supervisor, the others node agents, CURVE with a job
# secret) through faults, one case per meson test.
#   multinode_test.sh COHORT CASE
# Cases:
#   worker_killed  three nodes x 2 workers, tp 2 x dp 3: a worker on node 2 killed at a step is
#                  replaced in process by node 2's agent with its data-parallel peer's state
#                  (another node's), the survivors on every node keep theirs: 0 steps lost,
#                  the final checkpoint (parameters and both moments) bitwise the fault-free
#                  run's
#   spare          three nodes x 2 with --inprocess-active-world-size 4 (tp 2 x dp 2; node 2's
#                  two processes are warm spares): rank 3 (node 1) killed, node 2's spare takes
#                  its rank and its peer's state, node 1's agent starts a new spare in the dead
#                  slot; bitwise the fault-free run; every node ends 0, no spare complains
#   no_restart     the same kill with --no-inprocess-restart: the job stops with exit 4 and the
#                  dead rank named with its node, every node's process exits non-zero
#   stopped        a worker on node 1 SIGSTOPped: its agent reports it stopped, the hang aborts
#                  the generation and the stopped rank is killed and replaced at the barrier at
#                  once (not at the hard timeout); the job ends bitwise as the fault-free run
#   node0_killed   node 0 (the supervisor and its workers) killed: the agents of nodes 1 and 2
#                  stop their workers within the heartbeat timeout, say so, exit 8; the last
#                  checkpoint verifies
#   node_stopped   node 1's agent and workers SIGSTOPped: the supervisor finds the node lost
#                  after the heartbeat timeout, stops the job with exit 7 and the last
#                  checkpoint verifies
#   node_replaced  node 1's agent and workers SIGSTOPped (then its workers killed: the host is
#                  gone) with --node-replacement-timeout: the node is found lost after the
#                  heartbeat timeout, the survivors wait at the restart barrier, a new agent of
#                  node rank 1 joins and its workers take the node's ranks with their data-
#                  parallel peers' state: 0 steps lost, the final checkpoint bitwise the
#                  fault-free run's; the old agent, continued, is refused and stops
#   node_killed    node 2 lost whole (its agent and workers SIGKILLed, as a machine that
#                  crashes) with --node-replacement-timeout: found lost after the heartbeat
#                  timeout, and a new agent for node 2 started 5 s after the crash takes its
#                  ranks with their peers' state: 0 steps lost, bitwise the fault-free run
#   spare_node_lost four nodes x 2, tp 2 x dp 3 on --inprocess-active-world-size 6 (node 3's two
#                  processes warm spares, per process): node 1 lost whole (agent and workers
#                  SIGKILLed): node 3's spares take ranks 2 and 3 with their peers' state, the lost
#                  node's slots wait for nothing, no other node is found lost; a new agent of node 1
#                  then has its workers restarted as spares; 0 steps lost, bitwise the fault-free
#                  run, every node ends 0
#   spare_node     the same with --inprocess-granularity node (node 3 a spare node; an active world
#                  not a multiple of --nproc-per-node refused): node 3's workers, started before the
#                  fault, take node 1's ranks slot for slot, no process starts; bitwise the
#                  fault-free run, 0 steps lost; then one worker of node 1 killed: node 1 leaves
#                  whole (its live rank's process too), node 3 takes both ranks, node 1's agent
#                  starts two spares; bitwise, 0 steps lost
#   spare_node_gone the spare node itself lost whole: the spare pool shrinks, no restart, the job
#                  ends 0
#   partitioned    the supervisor and node 1's agent SIGSTOPped (node 1's workers cut off, their
#                  agent unable to stop them): the workers stop themselves after the heartbeat
#                  timeout of the supervisor's silence
#   requeue_policy deploy/slurm/cohort.sbatch (srun and scontrol stubbed) requeues after 75
#                  always and after 4-8 and 137 at most COHORT_MAX_REQUEUES times, never after
#                  0, 1, 2, 3, 130; deploy/k8s/cohort.yaml fails the Job on 1, 2, 3, 130, 143
#                  and on nothing a requeue cures
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir multinode

"$cohort" keygen --output "$work/secret" >/dev/null || fail "keygen"
# (ranks of a tp 2 x dp 3 job, 2 per node: node 2 holds ranks 4 and 5)
tiny_model --global-batch-size 12
hb=(--inprocess-heartbeat-interval 0.5 --inprocess-heartbeat-timeout 3)

NODE_TIMEOUT=120 # (start_nodes, tests/lib.sh)

# the pid of worker LOCAL (0, 1) of the node whose process is PID
worker_of() { children "$1" | sed -n "$(($2 + 1))p"; }

case $case_name in
worker_killed|overlap_killed)
    job=(--tensor-model-parallel-size 2 --train-iters 8)
    # with --overlap-grad-reduce each data-parallel group also has its own transport over tcp
    # and CURVE (ports past the worker slots'), aborted and rebuilt with the rest
    [ $case_name = overlap_killed ] && job+=(--overlap-grad-reduce --ddp-bucket-size 1000)
    start_nodes clean 3 "${job[@]}" --save "$work/cs"
    wait_nodes clean 3
    start_nodes f 3 "${job[@]}" --save "$work/fs" --inject "kill@rank=5,step=4"
    wait_nodes f 3
    grep -q "rank 5 (node 2, pid [0-9]*) was killed by signal 9" "$work/f.n0" ||
        fail "no kill on node 2: $(grep supervisor "$work/f.n0")"
    grep -q "in-process restart into generation 2" "$work/f.n0" || fail "no restart: $(grep supervisor "$work/f.n0")"
    grep -q "starting a replacement in slot 5" "$work/f.n2" || fail "node 2's agent replaced nothing: $(cat "$work/f.n2")"
    grep -q "with the state of ranks 0, 1 (one per model shard)" "$work/f.n0" ||
        fail "not resumed from the survivors' memory: $(grep 'resume after' "$work/f.n0")"
    grep -q "state of iteration [0-9]* taken from rank [13]'s memory" "$work/f.n0" ||
        fail "rank 5 did not take a peer's state: $(grep "replaced in process" "$work/f.n0")"
    grep -q "1 restart(s), 0 step(s) lost" "$work/f.n0" && ! grep -q "loads the checkpoint" "$work/f.n0" ||
        fail "steps lost: $(grep 'lost\|checkpoint' "$work/f.n0")"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    if [ $case_name = overlap_killed ]; then
        grep -q "overlapped gradient reduction: [0-9]* buckets, [1-9][0-9]* started during the backward" "$work"/f.n* ||
            fail "no bucket started early: $(grep -h overlapped "$work"/f.n* | head -3)"
        grep -q "no transport of the gradient group's own" "$work"/f.n* && fail "reduced on the training thread"
    fi
    ;;
spare)
    job=(--tensor-model-parallel-size 2 --train-iters 8 --inprocess-active-world-size 4)
    start_nodes clean 3 "${job[@]}" --save "$work/cs"
    wait_nodes clean 3
    start_nodes f 3 "${job[@]}" --save "$work/fs" --inject "kill@rank=3,step=4"
    wait_nodes f 3
    grep -q "rank 3 (node 1, pid [0-9]*) was killed by signal 9" "$work/f.n0" || fail "no kill: $(grep supervisor "$work/f.n0")"
    grep -q "the warm spare in slot 5 takes rank 3" "$work/f.n0" || fail "no spare took it: $(grep supervisor "$work/f.n0")"
    grep -q "starting a warm spare in slot 3" "$work/f.n1" || fail "no new spare on node 1: $(grep agent "$work/f.n1")"
    grep -q "0 step(s) lost" "$work/f.n0" || fail "steps lost: $(grep 'run report' "$work/f.n0")"
    ! grep -q "no rank assignment" "$work"/f.n* || fail "a spare complained: $(grep -h 'no rank assignment' "$work"/f.n*)"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    ;;
no_restart)
    start_nodes f 3 --tensor-model-parallel-size 2 --train-iters 8 --no-inprocess-restart \
        --inject "kill@rank=5,step=4"
    for k in 0 1 2; do
        wait "${node_pid[k]}"; rc=$?
        [ $rc -eq 4 ] || fail "node $k exit $rc, want 4: $(tail -3 "$work/f.n$k")"
    done
    grep -q "rank 5 (node 2, pid [0-9]*) was killed by signal 9 (Killed) at iteration [0-9]*; stopping the job" "$work/f.n0" ||
        fail "no diagnosis: $(grep supervisor "$work/f.n0")"
    ! grep -q "restart into generation" "$work/f.n0" || fail "restarted: $(grep supervisor "$work/f.n0")"
    ;;
stopped)
    # (a hard timeout of 20 s: the kill must come long before it; the heartbeat timeout is
    # left at its 30 s so that the hang, not the silence, finds the stopped rank)
    job=(--tensor-model-parallel-size 2 --train-iters 8 --inprocess-soft-timeout 2 --inprocess-hard-timeout 20
         --inprocess-barrier-timeout 60)
    start_nodes clean 3 "${job[@]}" --save "$work/cs"
    wait_nodes clean 3
    start_nodes f 3 "${job[@]}" --save "$work/fs" --inject "stop@rank=2,step=5"
    wait_nodes f 3
    grep -q "worker 2 (pid [0-9]*) is stopped (process state T)" "$work/f.n1" ||
        fail "node 1's agent did not see its worker stopped: $(grep agent "$work/f.n1")"
    grep -q "rank 2 is stopped (process state T, node 1's agent says); killing it" "$work/f.n0" ||
        fail "not killed at the barrier: $(grep supervisor "$work/f.n0")"
    grep -q "starting a replacement in slot 2" "$work/f.n1" || fail "node 1's agent replaced nothing: $(cat "$work/f.n1")"
    grep -q "0 step(s) lost" "$work/f.n0" || fail "steps lost: $(grep 'run report' "$work/f.n0")"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    ;;
node0_killed)
    # the supervisor dies at step 7 (--inject kill-supervisor: SIGKILL; its node's workers stop
    # on their own), after the checkpoint of iteration 4
    start_nodes f 3 --train-iters 200 --save "$work/fs" --save-interval 4 "${hb[@]}" --inject "kill-supervisor@step=7"
    wait "${node_pid[0]}"; rc=$?
    t0=$SECONDS
    [ $rc -eq 137 ] || fail "node 0 exited $rc, not killed: $(tail -3 "$work/f.n0")"
    for k in 1 2; do
        wait "${node_pid[k]}"; rc=$?
        [ $rc -eq 8 ] || fail "node $k exit $rc, want 8 (the supervisor's node lost): $(tail -3 "$work/f.n$k")"
        grep -q "no word from the supervisor at .* for [0-9.]* s (--inprocess-heartbeat-timeout 3.0 s): node 0 is lost; stopping this node's workers" "$work/f.n$k" ||
            fail "node $k did not say why: $(tail -3 "$work/f.n$k")"
    done
    # the heartbeat timeout (3 s), a tick (0.5 s), the kill, and a loaded machine's slack
    [ $((SECONDS - t0)) -le 6 ] || fail "the nodes stopped $((SECONDS - t0)) s after node 0 died"
    [ "$(cat "$work/fs/latest_checkpointed_iteration.txt")" = 4 ] || fail "tracker: $(cat "$work/fs/latest_checkpointed_iteration.txt")"
    "$cohort" ckpt verify "$work/fs" >/dev/null || fail "the last checkpoint does not verify"
    ;;
node_stopped)
    # node 1's agent and workers SIGSTOPped after the checkpoint of iteration 4: nothing of the
    # node answers; the supervisor finds it lost after the heartbeat timeout
    start_nodes f 3 --train-iters 400 --save "$work/fs" --save-interval 4 "${hb[@]}"
    wait_until 60 grep -q "successfully saved checkpoint from iteration *4 " "$work/f.n0" ||
        fail "no checkpoint: $(tail -3 "$work/f.n0")"
    agent=$(children "${node_pid[1]}")
    [ -n "$agent" ] || fail "node 1's agent not found"
    stopped="$agent $(children "$agent")"
    kill -STOP $stopped
    t0=$SECONDS
    wait "${node_pid[0]}"; rc=$?
    kill -KILL $stopped; kill -CONT $stopped
    [ $rc -eq 7 ] || fail "node 0 exit $rc, want 7 (a node lost): $(tail -5 "$work/f.n0")"
    grep -q "node 1's agent sent nothing for [0-9.]* s (--inprocess-heartbeat-timeout 3.0 s): the node is lost with its ranks 2 to 3" "$work/f.n0" ||
        fail "not found lost: $(grep supervisor "$work/f.n0")"
    # the hang (2 s) aborts the generation first, the silence (3 s) ends it
    [ $((SECONDS - t0)) -le 8 ] || fail "the job stopped $((SECONDS - t0)) s after node 1 stopped"
    wait "${node_pid[2]}"; rc=$?
    [ $rc -eq 7 ] || fail "node 2 exit $rc, want 7: $(tail -3 "$work/f.n2")"
    "$cohort" ckpt verify "$work/fs" >/dev/null || fail "the last checkpoint does not verify"
    ;;
node_replaced)
    job=(--train-iters 40 "${hb[@]}" --node-replacement-timeout 60)
    start_nodes clean 3 "${job[@]}" --save "$work/cs"
    wait_nodes clean 3
    start_nodes f 3 "${job[@]}" --save "$work/fs"
    wait_until 60 grep -q "iteration *5/" "$work/f.n0" || fail "no progress: $(tail -3 "$work/f.n0")"
    old_agent=$(children "${node_pid[1]}"); old_pid=${node_pid[1]}
    [ -n "$old_agent" ] || fail "node 1's agent not found"
    old_workers=$(children "$old_agent")
    kill -STOP $old_agent $old_workers
    t0=$SECONDS
    wait_until 20 grep -q "node 1's agent sent nothing for [0-9.]* s .*: the node is lost with its ranks 2 to 3; waiting up to 60.0 s (--node-replacement-timeout) for a new agent of node 1" "$work/f.n0" ||
        fail "node 1 not found lost: $(grep supervisor "$work/f.n0")"
    [ $((SECONDS - t0)) -le 7 ] || fail "node 1 found lost $((SECONDS - t0)) s after it stopped (heartbeat timeout 3 s)"
    grep -q "every model shard node 1 held has a replica on another node" "$work/f.n0" ||
        fail "the loss not planned: $(grep supervisor "$work/f.n0" | tail -3)"
    kill -KILL $old_workers # (the host is gone: its ports with it)
    start_agent f.n1b 1 "${job[@]}" --save "$work/fs"
    wait_until 30 grep -q "a new agent of node 1 joined" "$work/f.n0" || fail "the new agent not taken: $(grep supervisor "$work/f.n0")"
    kill -CONT $old_agent # the old agent comes back: refused (or it finds the supervisor silent first)
    wait "$old_pid"; rc=$?
    [ $rc -eq 7 ] || [ $rc -eq 8 ] || fail "the old agent exited $rc: $(tail -3 "$work/f.n1")"
    wait_nodes f 3
    # (7: the supervisor refused it; 8: it found the supervisor silent first and stopped)
    if [ $rc -eq 7 ]; then
        grep -q "node 1's agent agent1\.[0-9a-f.]* refused: node 1 was lost and its ranks were given to another agent" \
            "$work/f.n0" || fail "the old agent not refused: $(grep supervisor "$work/f.n0")"
    else
        grep -q "no word from the supervisor .* node 0 is lost" "$work/f.n1" || fail "the old agent: $(tail -3 "$work/f.n1")"
    fi
    grep -q "resume after iteration [0-9]* with the state of rank 0 (2 replaced" "$work/f.n0" ||
        fail "not resumed from the survivors' memory: $(grep 'resume after' "$work/f.n0")"
    grep -q "0 step(s) lost" "$work/f.n0" || fail "steps lost: $(grep 'run report' "$work/f.n0")"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    ;;
node_killed)
    job=(--train-iters 40 "${hb[@]}" --node-replacement-timeout 60)
    start_nodes clean 3 "${job[@]}" --save "$work/cs"
    wait_nodes clean 3
    start_nodes f 3 "${job[@]}" --save "$work/fs"
    wait_until 60 grep -q "iteration *5/" "$work/f.n0" || fail "no progress: $(tail -3 "$work/f.n0")"
    old_agent=$(children "${node_pid[2]}"); old_pid=${node_pid[2]}
    [ -n "$old_agent" ] || fail "node 2's agent not found"
    kill -KILL $old_agent $(children "$old_agent")
    t0=$SECONDS
    wait "$old_pid"
    wait_until 20 grep -q "node 2's agent sent nothing for [0-9.]* s .*: the node is lost with its ranks 4 to 5; waiting up to 60.0 s (--node-replacement-timeout) for a new agent of node 2" "$work/f.n0" ||
        fail "node 2 not found lost: $(grep supervisor "$work/f.n0")"
    # the machine that replaces it comes up 5 s after the crash (a scheduler's restart)
    while [ $((SECONDS - t0)) -lt 5 ]; do sleep 0.2; done
    start_agent f.n2b 2 "${job[@]}" --save "$work/fs"
    wait_until 30 grep -q "a new agent of node 2 joined" "$work/f.n0" || fail "the new agent not taken: $(grep supervisor "$work/f.n0")"
    wait_nodes f 3
    grep -q "resume after iteration [0-9]* with the state of rank 0 (2 replaced" "$work/f.n0" ||
        fail "not resumed from the survivors' memory: $(grep 'resume after' "$work/f.n0")"
    grep -q "0 step(s) lost" "$work/f.n0" || fail "steps lost: $(grep 'run report' "$work/f.n0")"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    ;;
spare_node_lost | spare_node)
    # (a step takes some 40 ms: enough of them that the fault comes mid-run, and a new agent
    # of the lost node joins while the job runs)
    job=(--tensor-model-parallel-size 2 --train-iters 100 --inprocess-active-world-size 6 "${hb[@]}")
    # (per process as the bug was found: with a replacement timeout; the spare node needs none)
    [ "$case_name" = spare_node_lost ] && job=(--tensor-model-parallel-size 2 --train-iters 300
                                                --inprocess-active-world-size 6 "${hb[@]}" --node-replacement-timeout 60)
    if [ "$case_name" = spare_node ]; then
        train_refused "--inprocess-granularity node: --inprocess-active-world-size 3 is not a multiple of --nproc-per-node 2" \
            --nproc-per-node 2 --nnodes 2 --node-rank 0 --inprocess-active-world-size 3 --inprocess-granularity node
        job+=(--inprocess-granularity node)
    fi
    start_nodes clean 4 "${job[@]}" --save "$work/cs"
    wait_nodes clean 4
    start_nodes f 4 "${job[@]}" --save "$work/fs"
    wait_until 60 grep -q "iteration *5/" "$work/f.n0" || fail "no progress: $(tail -3 "$work/f.n0")"
    spare_agent=$(children "${node_pid[3]}")
    spares=$(children "$spare_agent" | paste -sd' ')
    [ "$(echo $spares | wc -w)" = 2 ] || fail "node 3's spares not found: '$spares'"
    old_agent=$(children "${node_pid[1]}"); old_pid=${node_pid[1]}
    [ -n "$old_agent" ] || fail "node 1's agent not found"
    kill -KILL $old_agent $(children "$old_agent")
    wait "$old_pid"; node_pid[1]=
    if [ "$case_name" = spare_node_lost ]; then
        # a new agent of node 1 once the spares took over: its workers (started as ranks 2 and 3)
        # are restarted as spares, and it ends 0 with the job
        wait_until 60 grep -q "resume after" "$work/f.n0" || fail "no restart: $(grep supervisor "$work/f.n0")"
        start_agent f.n1 1 "${job[@]}" --save "$work/fs"
        wait_until 30 grep -q "a new agent of node 1 joined: its slots hold warm spares" "$work/f.n0" ||
            fail "the new agent not taken: $(grep supervisor "$work/f.n0")"
    fi
    wait_nodes f 4
    if [ "$case_name" = spare_node_lost ]; then
        for k in 2 3; do
            grep -q "starting a warm spare in slot $k: its rank went to a warm spare" "$work/f.n1" ||
                fail "node 1's new agent did not restart slot $k as a spare: $(cat "$work/f.n1")"
        done
    fi
    grep -q "node 1's agent sent nothing for [0-9.]* s .*: the node is lost with its ranks 2 to 3" "$work/f.n0" ||
        fail "node 1 not found lost: $(grep supervisor "$work/f.n0")"
    ! grep -q "node [023]'s agent sent nothing\|no replica outside\|ordering node" "$work/f.n0" ||
        fail "the bookkeeping after the spares moved: $(grep "sent nothing\|no replica\|ordering" "$work/f.n0")"
    grep -q "node 1's ranks go to warm spares on other nodes: no new agent of node 1 is awaited" "$work/f.n0" ||
        fail "a new agent of node 1 awaited: $(grep supervisor "$work/f.n0")"
    # (rank granularity: the last spare takes the first dead rank; node: slot for slot)
    if [ "$case_name" = spare_node ]; then
        first=6 second=7
        grep -q "the spare node 3 takes the ranks of node 1 whole" "$work/f.n0" ||
            fail "no spare node took over: $(grep supervisor "$work/f.n0")"
    else
        first=7 second=6
    fi
    for pair in "$first 2" "$second 3"; do
        set -- $pair
        pid=$(grep -o "the warm spare in slot $1 takes rank $2 (node 3, pid [0-9]*" "$work/f.n0" | grep -o "[0-9]*$")
        [ -n "$pid" ] || fail "slot $1 did not take rank $2: $(grep 'warm spare\|supervisor' "$work/f.n0")"
        [[ " $spares " == *" $pid "* ]] || fail "rank $2 went to pid $pid, not a spare started before the fault ($spares)"
    done
    ! grep -q "starting a" "$work/f.n3" || fail "node 3 started a process: $(grep 'starting a' "$work/f.n3")"
    grep -q "resume after iteration [0-9]* with the state of ranks 0, 1 (one per model shard) (2 replaced" \
        "$work/f.n0" || fail "not resumed from the survivors' memory: $(grep 'resume after' "$work/f.n0")"
    grep -q " 0 step(s) lost" "$work/f.n0" || fail "steps lost: $(grep 'run report\|lost' "$work/f.n0")"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    [ "$case_name" = spare_node ] || exit 0
    # one worker of node 1 killed: the node leaves the active world whole (NVRx's node
    # granularity), its live rank's process too; node 3 takes both ranks, node 1 becomes the
    # spare node (its agent starts two spares)
    start_nodes g 4 "${job[@]}" --save "$work/gs" --inject "kill@rank=3,step=5"
    wait_nodes g 4
    grep -q "the spare node 3 takes the ranks of node 1 whole" "$work/g.n0" ||
        fail "no spare node took over: $(grep supervisor "$work/g.n0")"
    grep -q "the warm spare in slot 6 takes rank 2 (node 3, pid [0-9]*: started before the fault) from the live process of slot 2" \
        "$work/g.n0" || fail "rank 2 stayed on node 1: $(grep supervisor "$work/g.n0")"
    grep -q "the warm spare in slot 7 takes rank 3 (node 3" "$work/g.n0" || fail "rank 3: $(grep supervisor "$work/g.n0")"
    for k in 2 3; do
        grep -q "starting a warm spare in slot $k" "$work/g.n1" || fail "node 1 did not become a spare node: $(cat "$work/g.n1")"
    done
    ! grep -q "starting a" "$work/g.n3" || fail "node 3 started a process: $(grep 'starting a' "$work/g.n3")"
    grep -q " 0 step(s) lost" "$work/g.n0" || fail "steps lost: $(grep 'run report\|lost' "$work/g.n0")"
    ckpt_same "$work/cs" "$work/gs" "the final checkpoints differ (a worker killed)"
    ;;
spare_node_gone)
    # the spare node (node 3) lost whole: no rank lost, no restart, the others end 0
    start_nodes f 4 --tensor-model-parallel-size 2 --train-iters 100 --inprocess-active-world-size 6 \
        --inprocess-granularity node "${hb[@]}"
    wait_until 60 grep -q "iteration *5/" "$work/f.n0" || fail "no progress: $(tail -3 "$work/f.n0")"
    agent=$(children "${node_pid[3]}"); old_pid=${node_pid[3]}
    [ -n "$agent" ] || fail "node 3's agent not found"
    kill -KILL $agent $(children "$agent")
    wait "$old_pid"; node_pid[3]=
    wait_nodes f 4
    grep -q "node 3's agent sent nothing for [0-9.]* s .*: the node is lost with its warm spares only; it held warm spares only: no rank is lost, 0 warm spare(s) left" \
        "$work/f.n0" || fail "the spare node's loss: $(grep supervisor "$work/f.n0")"
    ! grep -q "restart into generation" "$work/f.n0" || fail "restarted: $(grep supervisor "$work/f.n0")"
    grep -q " 0 restart(s), 0 step(s) lost" "$work/f.n0" || fail "run report: $(grep 'run report' "$work/f.n0")"
    # (the lost node's spares are not killed one by one through the dead agent, and their end
    # as the agent dies is no stop request)
    ! grep -q "sent no heartbeat\|received by rank" "$work/f.n0" || fail "$(grep supervisor "$work/f.n0")"
    ;;
partitioned)
    start_nodes f 3 --train-iters 400 "${hb[@]}"
    wait_until 60 grep -q "iteration *5/" "$work/f.n0" || fail "no progress: $(tail -3 "$work/f.n0")"
    sup=$(children "${node_pid[0]}"); agent=$(children "${node_pid[1]}")
    workers=$(children "$agent")
    [ -n "$sup" ] && [ -n "$agent" ] && [ "$(echo $workers | wc -w)" = 2 ] || fail "processes not found"
    kill -STOP $sup $agent
    t0=$SECONDS
    # (a worker that stopped is a zombie until its stopped agent reaps it)
    running() { local p; for p in $workers; do [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = R ] ||
        [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = S ] && echo "$p"; done; }
    wait_until 15 eval '[ -z "$(running)" ]' || fail "node 1's workers $(running) still run 15 s after the supervisor went silent"
    elapsed=$((SECONDS - t0))
    kill -KILL $sup $agent; kill -CONT $sup $agent
    # (the timeout, a heartbeat tick, the goodbye's 2 s wait for the silent supervisor, and slack)
    [ $elapsed -ge 2 ] && [ $elapsed -le 10 ] || fail "the workers stopped $elapsed s after the silence began (timeout 3 s)"
    grep -q "no word from the supervisor for 3.0 s; stopping" "$work/f.n1" || fail "not said: $(tail -3 "$work/f.n1")"
    ;;
requeue_policy)
    stub=$work/bin; mkdir -p "$stub"
    printf '#!/bin/sh\nexit "$FAKE_RC"\n' >"$stub/srun"
    printf '#!/bin/sh\necho "$*" >>"$FAKE_LOG"\n' >"$stub/scontrol"
    printf '#!/bin/sh\nexit 0\n' >"$stub/sleep" # (the script waits for Slurm to end it)
    chmod +x "$stub"/*
    # sbatch_rc RC: the script's requeues ("requeue 42" lines) in $work/requeued, its exit in $?
    sbatch_rc() {
        : >"$work/requeued"
        PATH=$stub:$PATH FAKE_RC=$1 FAKE_LOG=$work/requeued COHORT_CKPT_DIR=$work/ck COHORT_JOB_SECRET=$work/secret \
            COHORT_MAX_REQUEUES=2 SLURM_JOB_ID=42 bash "$src/deploy/slurm/cohort.sbatch" >"$work/sb.out" 2>&1
    }
    for rc in 0 1 2 3 130; do
        sbatch_rc $rc; [ $? -eq $rc ] || fail "exit $rc became $?"
        [ ! -s "$work/requeued" ] || fail "requeued after exit $rc: $(cat "$work/sb.out")"
    done
    for rc in 75 75 75; do
        sbatch_rc $rc
        grep -qx "requeue 42" "$work/requeued" || fail "not requeued after a preemption: $(cat "$work/sb.out")"
    done
    for rc in 7 8; do
        sbatch_rc $rc
        grep -qx "requeue 42" "$work/requeued" || fail "not requeued after exit $rc: $(cat "$work/sb.out")"
    done
    [ "$(cat "$work/ck.requeues")" = 2 ] || fail "failure requeues counted: $(cat "$work/ck.requeues")"
    for rc in 4 5 6 7 8 137; do # the bound (2) is reached: none more
        sbatch_rc $rc; [ $? -eq $rc ] || fail "exit $rc became $?"
        [ ! -s "$work/requeued" ] || fail "requeued after exit $rc beyond the bound: $(cat "$work/sb.out")"
        grep -q "requeued after failures 2 times already (COHORT_MAX_REQUEUES=2): not again" "$work/sb.out" ||
            fail "the bound not said: $(cat "$work/sb.out")"
    done
    rm "$work/ck.requeues"
    for rc in 4 5 6 137; do
        rm -f "$work/ck.requeues"; sbatch_rc $rc
        grep -qx "requeue 42" "$work/requeued" || fail "not requeued after exit $rc: $(cat "$work/sb.out")"
    done
    /usr/bin/python3 - "$src/deploy/k8s/cohort.yaml" <<'PY' || fail "k8s podFailurePolicy"
import sys, yaml
job = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "Job"][0]
fail = set()
for r in job["spec"]["podFailurePolicy"]["rules"]:
    if r.get("action") == "FailJob":
        fail |= set(r["onExitCodes"]["values"])
assert {1, 2, 3, 130, 143} <= fail, fail
assert not fail & {4, 5, 6, 7, 8, 75, 137}, fail
assert job["spec"]["backoffLimit"] > 0
PY
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
