#!/usr/bin/env bash
# pp_test.sh - `cohort train` with pipeline parallelism against one rank, one case per meson
# test.
#   pp_test.sh COHORT CASE
# Cases:
#   matches_one_rank  pp 2, pp 4, interleaved (2 chunks per rank), uneven stages, a layout
#                     string, pp 2 x dp 2 and tp 2 x pp 2 with SP train the one-rank job's numbers
#                     (losses and gradient norms of every iteration, the validation loss;
#                     hidden dropout on) within fp32 reduction tolerance; untied embeddings
#                     too; a pp run repeated is bitwise the same; the final parameters and
#                     moments within 1e-5 of one rank's (ckpt diff over every stage's tensors)
#   ckpt_reshard      a tp 2 x pp 2 checkpoint resumes bitwise at its layout (ckpt diff of the
#                     final checkpoints) and continues within tolerance at pp 1, pp 4 and
#                     pp 2 x dp 2 (interleaved); inspect shows each tensor's stage
#   killed            a rank killed in a pp 2 x dp 2 job is replaced in process with the state of
#                     its data-parallel peer on the same stage; the job ends with the
#                     fault-free run's checkpoint bitwise; the same in tp 2 x pp 2 x dp 2
#   nan_replay        a NaN loss injected on the last stage: the whole pipeline step is
#                     replayed in place and the job ends with the fault-free checkpoint bitwise
#   peer_check        a NaN loss that every replay gives again (injected on the last stage, every
#                     time): the other data-parallel pipeline recomputes the suspect's micro
#                     batches, gets the NaN too, and the job stops as Megatron's data problem
#   sdc               a flipped weight bit on one stage of one replica: found by the replicas'
#                     checksums (per tensor x pipeline shard), repaired from the same stage of
#                     the other replica; the job ends with the clean run's checkpoint bitwise
#   hang              a rank that hangs in the middle of the 1F1B steady state: the soft timeout
#                     aborts the generation and the supervisor names the stuck stage
#   stragglers        pp 2 x dp 3: one slow rank is a straggler against the ranks of its stage
#                     (not its stage); a slow stage (all its ranks) is a straggler stage (no
#                     rank of it a straggler)
#   timeline          --timeline-dir of an interleaved pp 2 run: every rank ran exactly the
#                     operations of its schedule, in order (`cohort schedule --json`), and
#                     `cohort timeline` draws the picture, the trace and each rank's bubble
#   bad_layouts       layers that do not split over the stages, an interleaved schedule whose
#                     micro batches do not fit its groups, a layout with the wrong number of
#                     stages: refused before any work (exit 2)
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir pp

# 4 layers over 2 or 4 stages; a global batch of 8 is 4 micro batches per pipeline (2 with
# dp 2). Attention dropout is keyed per tensor rank (Megatron's seed + 2718 + tp_rank), so it
# is off; hidden dropout draws the one-rank masks at any split and stays on.
tiny_model --num-layers 4 --attention-dropout 0 --eval-iters 2
. "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"

run() { train_ok "$1" --train-iters 5 "${@:2}"; } # NAME ARGS...: 5 iterations, metrics in $work/NAME.jsonl
case $case_name in
matches_one_rank)
    run one --nproc-per-node 1 --save "$work/one.ck"
    run pp2 --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2.ck"
    run pp2b --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2b.ck"
    run pp4 --nproc-per-node 4 --pipeline-model-parallel-size 4 --save "$work/pp4.ck"
    run vpp --nproc-per-node 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
        --save "$work/vpp.ck"
    run uneven --nproc-per-node 2 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1
    run layout --nproc-per-node 2 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et|t*3L"
    run pp2dp2 --nproc-per-node 4 --pipeline-model-parallel-size 2
    run tp2pp2 --nproc-per-node 4 --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
        --save "$work/tp2pp2.ck"
    compare 1 one pp2 pp4 vpp uneven layout pp2dp2 tp2pp2
    same_losses pp2 pp2b "two pp 2 runs differ"
    # the parameters and moments after the 5 steps, every stage's tensors under their global
    # names: within fp32 rounding of one rank's; two pp 2 runs bitwise the same
    for n in one pp2 pp2b pp4 vpp tp2pp2; do [ -d "$work/$n.ck" ] || fail "$n saved nothing"; done
    "$cohort" ckpt diff "$work/pp2.ck" "$work/pp2b.ck" >/dev/null || fail "two pp 2 runs' checkpoints differ"
    for n in pp2 pp4 vpp tp2pp2; do
        "$cohort" ckpt diff "$work/one.ck" "$work/$n.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$n: diff"
        /usr/bin/python3 -c "
import json, sys
rows = json.load(open('$work/d.json'))['tensors']
assert len(rows) == 156 and all(r['status'] in ('bitwise equal', 'differs') for r in rows), rows[:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
" || fail "$n: parameters differ from one rank's: $(head -c 400 "$work/d.json")"
    done
    grep -q "pipeline stage 1 of 2: layers 1-3" "$work/uneven.out" || fail "uneven: $(grep -i 'stage' "$work/uneven.out")"
    grep -q "pipeline stage 1 of 2: 2 model chunks: layers 1, 3" "$work/vpp.out" ||
        fail "interleaved: $(grep -i 'stage' "$work/vpp.out")"
    # untied: the last stage's own output layer, no embedding group sum: bitwise one rank's
    run one_u --nproc-per-node 1 --untie-embeddings-and-output-weights
    run pp2_u --nproc-per-node 2 --pipeline-model-parallel-size 2 --untie-embeddings-and-output-weights
    compare 1 one_u pp2_u
    ;;
ckpt_reshard)
    t22=(--nproc-per-node 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
    run full "${t22[@]}" --train-iters 6 --save "$work/full"
    run half "${t22[@]}" --train-iters 6 --exit-interval 3 --save "$work/s" --async-save
    "$cohort" ckpt verify "$work/s" >/dev/null || fail "verify"
    run same "${t22[@]}" --train-iters 6 --load "$work/s" --save "$work/s"
    grep -q "successfully loaded checkpoint from $work/s \[ t 2/2, p 2/2 \] at iteration 3" "$work/same.out" ||
        fail "no load line: $(grep -i checkpoint "$work/same.out" | head -3)"
    ckpt_same "$work/full" "$work/s" "resumed at tp 2 x pp 2"
    # inspect: which stage wrote each tensor (the embedding on stage 0, the last layer on 1)
    "$cohort" ckpt inspect "$work/s" --iteration 3 >"$work/inspect" || fail "inspect"
    grep -qE "^  embedding.word_embeddings.weight .* stage 0" "$work/inspect" || fail "inspect: $(head -20 "$work/inspect")"
    grep -qE "^  layers.3.mlp.fc2.weight .* stage 1" "$work/inspect" || fail "inspect: $(grep layers.3 "$work/inspect")"
    run pp1 --nproc-per-node 1 --train-iters 6 --load "$work/s" --ckpt-step 3
    grep -q "checkpoint written at tensor x pipeline size 2 x 2, loaded at 1 x 1" "$work/pp1.out" || fail "no reshard note"
    run pp4 --nproc-per-node 4 --pipeline-model-parallel-size 4 --train-iters 6 --load "$work/s" --ckpt-step 3
    run vdp --nproc-per-node 4 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
        --train-iters 6 --load "$work/s" --ckpt-step 3
    compare 4 full pp1 pp4 vdp
    ;;
killed)
    run clean --nproc-per-node 4 --pipeline-model-parallel-size 2 --train-iters 8 --save "$work/cs"
    # (the printing rank, 3 = dp 1 on stage 1, tells where its state came from: rank 2, dp 0
    # on stage 1)
    run f --nproc-per-node 4 --pipeline-model-parallel-size 2 --train-iters 8 --inject "kill@rank=3,step=4" \
        --save "$work/fs"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "state of iteration [0-9]* taken from rank 2's memory" "$work/f.out" ||
        fail "rank 3 did not take rank 2's state: $(grep 'replaced in process' "$work/f.out")"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    # tp 2 x pp 2 x dp 2: rank 7 (tp 1, pp 1, dp 1) from rank 5 (tp 1, pp 1, dp 0)
    t8=(--nproc-per-node 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --train-iters 6)
    run clean8 "${t8[@]}" --save "$work/cs8"
    run f8 "${t8[@]}" --inject "kill@rank=7,step=3" --save "$work/fs8"
    grep -q "state of iteration [0-9]* taken from rank 5's memory" "$work/f8.out" ||
        fail "rank 7 did not take rank 5's state: $(grep 'replaced in process\|supervisor' "$work/f8.out" | head)"
    ckpt_same "$work/cs8" "$work/fs8" "tp2 x pp2 x dp2"
    ;;
nan_replay)
    run clean --nproc-per-node 4 --pipeline-model-parallel-size 2 --train-iters 6 --save "$work/cs"
    # rank 3 is on the last stage (tp-cp-dp-pp order: rank = dp + 2 pp): its loss is the one
    run f --nproc-per-node 4 --pipeline-model-parallel-size 2 --train-iters 6 --inject "nan@rank=3,step=3" \
        --save "$work/fs"
    grep -qi "iteration 3: .*replay" "$work/f.out" || fail "no replay: $(grep -i 'iteration 3' "$work/f.out" | head)"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    same_losses clean f "the logged numbers differ"
    ;;
peer_check)
    # pp 2 x dp 2: rank 3 is stage 1 of replica 1 (ranks 1, 3); replica 0 (ranks 0, 2) helps.
    # Every rank of a replica reports its loss, so the suspect named is one of replica 1's.
    nan_reproduced nan_loss "[13]" "[02]" --nproc-per-node 4 --pipeline-model-parallel-size 2 \
        --inject "nan@rank=3,step=4,times=always"
    ;;
sdc)
    # a flipped weight bit on the last stage of replica 1 (rank 3): each replica's checksum
    # covers its stages', they differ, and rank 3 is repaired from rank 2 (the same stage
    # of replica 0); the job trains the clean run's numbers
    sdc_repaired 3 2 --nproc-per-node 4 --pipeline-model-parallel-size 2
    ;;
hang)
    q=(--inprocess-soft-timeout 2 --inprocess-hard-timeout 4 --inprocess-barrier-timeout 60)
    run clean --nproc-per-node 2 --pipeline-model-parallel-size 2 --train-iters 6 --save "$work/cs"
    # stage 0 (rank 0) hangs in the backward of micro batch 1: rank 1 waits for its gradient
    run f --nproc-per-node 2 --pipeline-model-parallel-size 2 --train-iters 6 --save "$work/fs" "${q[@]}" \
        --inject "hang@rank=0,step=4,microbatch=1,phase=backward"
    grep -q "stuck: pipeline stage 0 (rank 0)" "$work/f.out" || fail "the stuck stage not named: $(grep supervisor "$work/f.out")"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    ;;
stragglers)
    s6=(--nproc-per-node 6 --pipeline-model-parallel-size 2 --global-batch-size 12 --train-iters 12)
    # (pp 2 x dp 3, ranks dp + 3 pp: stage 1 is ranks 3, 4, 5)
    run slowrank "${s6[@]}" --run-report "$work/r1.json" --inject "slow@rank=4,step=2,ms=60,times=always"
    run slowstage "${s6[@]}" --run-report "$work/r2.json" --inject "slow@rank=3,step=2,ms=60,times=always" \
        --inject "slow@rank=4,step=2,ms=60,times=always" --inject "slow@rank=5,step=2,ms=60,times=always"
    /usr/bin/python3 - "$work" <<'PY' || fail "stragglers: $(cat "$work/r1.json" "$work/r2.json")"
import json, sys
w = sys.argv[1]
a, b = json.load(open(w + "/r1.json")), json.load(open(w + "/r2.json"))
ra = {x["rank"]: x["lowest_score"] for x in a["stragglers"]}
# (stage 1, the slow rank's, is not a straggler stage; stage 0 may be one on a loaded machine:
# a tiny model's step is a few ms, and scheduling noise doubles it)
assert 4 in ra and ra[4] < 0.4 and 1 not in {x["stage"] for x in a["straggler_stages"]}, a
rb = {x["stage"]: x["lowest_score"] for x in b["straggler_stages"]}
assert 1 in rb and rb[1] < 0.4, b
assert not any(r in (3, 4, 5) for r in (x["rank"] for x in b["stragglers"])), b
print("ok: rank 4 a straggler in its stage; stage 1 a straggler stage")
PY
    grep -q "straggler stage: pipeline stage 1" "$work/slowstage.out" || fail "no line: $(grep straggler "$work/slowstage.out")"
    ;;
timeline)
    run tl --nproc-per-node 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
        --micro-batch-size 1 --timeline-dir "$work/tl" --timeline-iterations 2:3
    "$cohort" schedule --pipeline-model-parallel-size 2 --num-layers 4 --num-layers-per-virtual-pipeline-stage 1 \
        --num-microbatches 8 --json >"$work/sched.json" || fail "cohort schedule"
    "$cohort" timeline "$work/tl" --json >"$work/tl.json" || fail "cohort timeline: $(cat "$work/tl.json")"
    /usr/bin/python3 - "$work" <<'PY' || fail "the executed operations are not the schedule's"
import json, sys
w = sys.argv[1]
sched = json.load(open(w + "/sched.json"))
tl = json.load(open(w + "/tl.json"))
assert tl["iteration"] == 3 and tl["pp"] == 2 and tl["v"] == 2 and tl["m"] == 8 and not tl["missing_ranks"], tl
assert abs(tl["formula"] - 1 / 16) < 1e-12 and all(0 <= r["bubble"] < 100 for r in tl["ranks"]), tl
for r in (0, 1):
    ev = [json.loads(l) for l in open(f"{w}/tl/timeline-rank-{r:05d}.jsonl") if l.startswith('{"k"')]
    for it in (2, 3):
        ops = sorted((e for e in ev if e["it"] == it and e["k"] in ("forward", "backward")), key=lambda e: e["t0"])
        got = [("F" if e["k"] == "forward" else "B") + f"{e['mb']}.{e['c']}" for e in ops]
        want = sched["ranks"][r]["ops"]
        assert got == want, (r, it, got, want)
    assert not any(e["it"] not in (2, 3) for e in ev), "recorded outside --timeline-iterations"
print("ok: both ranks ran their schedules (32 operations each) in iterations 2 and 3")
PY
    [ -s "$work/tl/timeline-iter-3.svg" ] && [ -s "$work/tl/timeline-iter-3.trace.json" ] || fail "no picture: $(ls "$work/tl")"
    ;;
bad_layouts)
    train_refused "--num-layers 4" --nproc-per-node 3 --pipeline-model-parallel-size 3
    train_refused "microbatch" --nproc-per-node 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
        --global-batch-size 2
    train_refused "stages" --nproc-per-node 2 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et|t|tL"
    train_refused "is not a multiple of tensor x context x pipeline = 4" --nproc-per-node 2 --pipeline-model-parallel-size 4
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
