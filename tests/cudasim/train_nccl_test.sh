#!/usr/bin/env bash
# train_nccl_test.sh - multi-rank `cohort train --device cuda` under the supervisor on the
# CUDA stand-in (build/cohort-cudasim, whose module holds the CUDA backend, comm/nccl_comm.c
# and the NCCL stand-in: docs/testing.md), one case per meson test (suite cudasim). Every
# rank is a process with a stand-in GPU of its own (COHORT_CUDASIM_DEVICES=4); the supervisor
# makes the NCCL unique id through the module, the ranks build their NCCL groups from it.
#   dp2, tp2, pp2, tp2_dp2, vpp2, tp2_pp2, tp2_sp (sequence parallelism: the queued
#     reduce-scatters and all-gathers) (and *_bf16 with --bf16): the layout trains 3
#     iterations on the stand-in and on the CPU backend (the same layout, ZeroMQ groups): the
#     logged losses (training and validation) agree within 1e-5 relative (fp32; 2e-5 with
#     --bf16: the products' bf16 roundings differ with the summation order), and the final
#     parameters within 1e-5 absolute (fp32; with --bf16 only within 2.5e-3, a bound of what 3
#     Adam steps at lr 1e-3 can move a weight, where an update near zero may go either way).
#     The *_bf16 layouts run with bf16 activations on the stand-in (the log must say so; under
#     tensor parallelism too: tp2_bf16, tp2_dp2_bf16, tp2_sp_bf16, whose sequence-parallel
#     all-gathers move the norms' bf16 elements), which the CPU's bf16 mode does not keep:
#     the products read the same bf16 values, but the attention backward's rowsum(O dO) and
#     the bias gradients (the BGRADB epilogue) take bf16-rounded O and dout where the CPU
#     takes fp32, inside the same bounds (dp2_bf16: 1.5e-3 seen); the layer activation bytes
#     of dp2, tp2 and tp2_sp are the CPU's less 2 bytes per bf16 element; each layout without
#     a pipeline runs twice on the stand-in, bitwise alike. tp2_sp_bf16 also runs with
#     selective recomputation of every module and with full recomputation (the bf16 buffers
#     made again, gathered again), each bitwise the run without, and with tensor rank 1
#     SIGKILLed in iteration 2 (no replica: the checkpoint of iteration 1), bitwise the
#     fault-free run.
#     With a pipeline (pp2, tp2_pp2; vpp2: 4 layers, --num-layers-per-virtual-pipeline-stage 1,
#     so 2 chunks a rank, the interleaved schedule, in Megatron's batched steps) the
#     activations and gradients go over NCCL on the device in stream order
#     (train/pipeline.c): each rank must say so and none that they go over the host, and a
#     second stand-in run must end bitwise equal to the first (checkpoint and losses).
#   Every case runs with COHORT_SIM_NCCL_RENDEZVOUS=1: a stand-in send finishes only when its
#     receiver took it, as a large message on real NCCL, so a schedule that needs NCCL to
#     buffer a send deadlocks here too.
#   tp2_dp2_fp16: tp 2 x dp 2 with --fp16 (a static scale of 4096) and an overflow injected
#     into rank 3's gradients at iteration 2 (COHORT_TEST_FP16_OVERFLOW): on the stand-in
#     (fp16 products through cuBLASLt, NCCL groups) that step is skipped on every rank as on
#     the CPU backend: the skipped counts the same, losses and parameters within --bf16's
#     bounds (the products' fp16 roundings differ with the summation order).
#   reproducible: two dp 2 runs end with bitwise the same checkpoint (parameters and Adam's
#     moments) and losses.
#   killed / nan / nccl_hang: a fault in a dp 2 job (a rank SIGKILLed inside its all-reduce;
#     a NaN loss, replayed; a rank hung in compute, so that its peer waits inside an NCCL
#     collective until the generation is aborted: ncclCommAbort from the link's thread, and
#     nobody is replaced) ends in an in-process restart (or replay), and bitwise the
#     fault-free run's checkpoint and losses.
#   act_flip_bf16: an activation's bit flipped (--bf16, bf16 activations: the final norm's
#     output in bf16) is caught and the step replayed; nan_bf16: a NaN loss with --bf16,
#     replayed; each job ends bitwise the fault-free run (losses and checkpoint).
#   sdc: silent data corruption: a mantissa bit of rank 1's weights flipped before a forward;
#     the weights' checksums, hashed on the (stand-in) device, differ in that very step with
#     no majority of two, so the step is replayed and the rank whose weights changed since its
#     optimizer step wrote them (the fused AdamW checksum) is repaired from the other: the job
#     ends bitwise the fault-free run.
#   pp2_killed, tp2_pp2_killed, vpp2_killed: the last pipeline stage of a pp 2 job (a rank of it under
#     tp 2 x pp 2; of the vpp2 layout) SIGKILLed in iteration 2 while its peers' NCCL sends and receives are
#     queued on their streams: its stage has no other replica, so the new generation (new
#     NCCL world and pipeline channels) loads the checkpoint of iteration 1 on every rank and
#     the job ends bitwise the fault-free run.
#   vpp2_group: the interleaved schedule with a micro batch group larger than the pipeline
#     (pp 2, 2 chunks a rank, 5 micro batches in groups of 3): the first stage receives the
#     last stage's first-chunk outputs over NCCL steps before the forwards that read them,
#     into queued buffers (the last stage the first stage's gradients alike); each rank must
#     say so and none that anything goes over the host; against the CPU backend's same layout
#     (the fp32 tolerances), a second stand-in run bitwise the first, and a run with the last
#     stage SIGKILLed in iteration 2 (the checkpoint of iteration 1) bitwise the fault-free one.
#   pp2_nan: a NaN loss on the last stage of a pp 2 job is replayed and the job ends bitwise
#     the fault-free run.
#   pp2_nccl_hang: the last stage of a pp 2 job hangs in its forward, so the first stage's
#     stream waits in an NCCL receive of the pipeline's gradient channel; the soft timeout
#     aborts the generation, and the link's abort must reach that communicator (ncclCommAbort
#     on every NCCL communicator of the rank) so that the first stage unwinds in process:
#     nobody is replaced, and the job ends bitwise the fault-free run
#     (COHORT_SIM_NCCL_ABORT_SILENT=1, as in nccl_hang). The hang must be found from rank 0's
#     report that it waits for rank 1 (its device waits are reported as the pipeline's host
#     receives are), not from the stand-in's 120 s deadline of the queued receive.
#   pp2_syncs, tp2_syncs: a training step makes a bounded number of host waits, not one per
#     tensor or layer: the stand-in counts each rank's (cudasim_sync_count;
#     COHORT_CUDASIM_COUNTS writes them at exit) in a 2- and a 6-iteration run of a 4-layer
#     model (about 25 tensors a stage, 4 micro batches a step); the four extra steps cost the
#     busiest rank at most MAX waits a step (the stand-in counts a loss read twice: the copy
#     to the host and its wait). pp 2: the last stage 2 per micro batch (its loss read; the
#     activations and gradients go over NCCL in stream order, so neither the end of a
#     chunk's forward nor of its backward waits) + 8 (the one wait after the schedule, the
#     gradient norm's, the optimizer step's, the log line's...): 16 are counted, where with
#     the pipeline over the host it was 18 (and the bound 4 per micro batch + 6); the first
#     stage, which reads no loss, at most 8 (no wait per micro batch). tp 2 (one
#     model split over 2 ranks): 5 per micro batch (the batch's broadcast, the
#     cross-entropy's row max, the loss read, the end of the backward) + 8, with every
#     collective of the layers queued on the stream, where syncing before each collective
#     added 4 a layer and micro batch.
#   dopt_syncs: the distributed optimizer's step at dp 2 (4 layers, 2 micro batches a rank)
#     waits at most 12 times on each rank: 2 per micro batch (its loss read, counted twice,
#     and the end of its backward) + the validator's replica norm + the shard norm's sums and
#     their all-reduce + the loss sums' all-reduce + the weights' two checksums; the copy's
#     gradient exchange and the all-gather are queued on the stream (15 when the stream was
#     synced after the shard's averaging and around the all-gather).
#   cp2_bf16, cp2_thd_bf16: cp2 and cp2_thd (below) with --bf16: bf16 activations at cp 2 (the
#     log must say so, in the faulty run too), against the CPU's --bf16 within the bf16 bounds
#     above, the killed run bitwise the stand-in's fault-free one.
#   cp2_syncs: as pp2_syncs, a step of cp 2 makes a bounded number of host waits: the ring
#     waits for the device at no step (the merge and the dK/dV sums are kernels, the shifts
#     queued NCCL send/recv): at most 2 per micro batch + 10 (16 counted; 304 before).
#   dopt_dp2, dopt_tp2_dp2, dopt_tp2_pp2, mtp_pp2, cp2, cp2_thd, ep2_alltoall, ep2_allgather,
#     moe_tp2, moe_bf16, overlap_dp2, param_gather_tp2_dp2, overlap_ep2_dp4: what the CPU
#     backend runs and cuda refused before (the distributed optimizer, multi-token prediction, context
#     parallelism with the sequence and the per-document split, expert parallelism with both
#     dispatchers, the experts split over the tensor group, bf16 MoE with grouped products,
#     overlapped gradient reduction and parameter gather (also bitwise the stand-in without
#     them); docs/gpu.md "Parallelism on cuda"): each layout trains 3
#     iterations on the CPU backend and on the stand-in (losses and final parameters within
#     the fp32 tolerances above), then once more on the stand-in with a rank SIGKILLed in
#     iteration 2: the job restarts in process and ends bitwise the stand-in's fault-free
#     run (which also shows two stand-in runs bitwise alike). Tolerances: MTP's parameters
#     3e-5, moe_bf16 below.
#   mtp_pp2_bf16, mtp_tp2_sp_bf16, mtp_p3_bf16: multi-token prediction (2 depths) with --bf16
#     at pp 2 (the depths on the last stage), at pp 3 with the depths on a stage of their own
#     before the loss's (layout Et|tmm|L: the MTP stage's final norm and the 1 + D streams it
#     sends fp32, the loss's stage's output layer reading them so) and at tp 2 with sequence
#     parallelism (eh_proj column-
#     parallel: its gathered columns and sliced gradient, and the [enorm | hnorm]
#     concatenation and its split, pitched copies on the device): bf16 activations (the log
#     says so; the depths' transformer layers keep them too, and enorm's and hnorm's outputs
#     and their concatenation: mtp_tp2_sp_bf16 checks the bytes), against the CPU's --bf16
#     within the bf16 bounds (each depth's loss as lm loss), and with a rank SIGKILLed in
#     iteration 2 (the checkpoint of iteration 1) bitwise the fault-free stand-in run.
#   moe_bf16, moe_act16_allgather: MoE at ep 2 (alltoall; allgather) with --bf16,
#     --moe-grouped-gemm and bf16 activations in the MoE layers (their input stored in bf16,
#     the log says so) against the CPU's bf16 (losses 2e-5, parameters 5e-3: the case says why), a killed rank bitwise
#     the fault-free run.
#   ep2_syncs: the host waits of a MoE step at ep 2 (as pp2_syncs), at most 71 (103 with the
#     permutations as host loops).
#   train_nccl_test.sh COHORT COHORT_CUDASIM CASE
cohort=$1; cudasim=$2; case_name=$3
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
export COHORT_CPU_EXE=$cohort
export COHORT_CUDASIM_DEVICES=4 OMP_WAIT_POLICY=passive COHORT_SIM_NCCL_RENDEZVOUS=1
workdir cudasim-nccl

iters=3
tiny_model --train-iters $iters
quick="--inprocess-soft-timeout 2 --inprocess-hard-timeout 4 --inprocess-barrier-timeout 60"

# run NAME EXE DEVICE [flags...]: output in $work/NAME.{out,jsonl}, final checkpoint in
# $work/NAME.ckpt, status in $rc
run() {
    local name=$1 exe=$2 dev=$3; shift 3
    "$exe" train "${tiny[@]}" --device "$dev" --metrics-file "$work/$name.jsonl" --save "$work/$name.ckpt" \
        --run-report "$work/$name.report.json" "$@" >"$work/$name.out" 2>&1
    rc=$?
}
ok() { [ $rc -eq 0 ] || fail "$1 exited $rc: $(grep -v '^cohort rank' "$work/$1.out" | tail -6)"; }
ckpt() { printf '%s/%s.ckpt/iter_%07d' "$work" "$1" $iters; }
# resumed_bitwise NAME: the faulty run $work/f restarted in process, resumed from the checkpoint
# of iteration 1, and ended bitwise the fault-free run NAME (losses and checkpoint)
resumed_bitwise() {
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "loads the checkpoint of iteration 1" "$work/f.out" ||
        fail "not resumed from the checkpoint: $(grep supervisor "$work/f.out")"
    same_losses "$1" f "the faulty run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt "$1")" "$(ckpt f)"
}

# close NAME_A NAME_B LOSS_REL PARAM_ABS: logged losses and final parameters within tolerance
close() {
    "$cohort" ckpt diff --json "$(ckpt "$1")" "$(ckpt "$2")" >"$work/diff.json" 2>&1
    /usr/bin/python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$work/diff.json" "$3" "$4" <<'PY' || fail "$2 against $1"
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"lm_loss"' in l] for f in sys.argv[1:3])
d = json.load(open(sys.argv[3]))
lrel, pabs = float(sys.argv[4]), float(sys.argv[5])
assert len(a) == len(b) >= 3, (len(a), len(b))
for x, y in zip(a, b):
    if x["lm_loss"] == y["lm_loss"] == "nan":  # (--fp16: an interval of skipped iterations only)
        continue
    rel = abs(x["lm_loss"] - y["lm_loss"]) / abs(x["lm_loss"])
    assert rel <= lrel, f"loss {x['lm_loss']} vs {y['lm_loss']} (rel {rel:.2e} > {lrel})"
    for k in (k for k in x if k.startswith("mtp_") and k.endswith("_loss")):  # multi-token prediction's depths
        rel = abs(x[k] - y[k]) / abs(x[k])
        assert rel <= lrel, f"{k} {x[k]} vs {y[k]} (rel {rel:.2e} > {lrel})"
params = [t for t in d["tensors"] if not t["name"].startswith("optimizer.")]
assert params and all(t["status"] in ("bitwise equal", "differs") for t in d["tensors"]), [t for t in d["tensors"] if t["status"] not in ("bitwise equal", "differs")]
worst = max(params, key=lambda t: t.get("max_abs", 0))
assert worst.get("max_abs", 0) <= pabs, f"{worst['name']}: {worst['max_abs']} > {pabs}"
print(f"ok: losses within {lrel}, parameters within {worst.get('max_abs', 0):.2e} ({worst['name']})")
PY
}

layout() {
    case $1 in
    dp2) echo "--nproc-per-node 2" ;;
    tp2) echo "--nproc-per-node 2 --tensor-model-parallel-size 2" ;;
    pp2) echo "--nproc-per-node 2 --pipeline-model-parallel-size 2" ;;
    tp2_dp2) echo "--nproc-per-node 4 --tensor-model-parallel-size 2" ;;
    vpp2) echo "--nproc-per-node 2 --pipeline-model-parallel-size 2 --num-layers 4 --num-layers-per-virtual-pipeline-stage 1" ;;
    tp2_pp2) echo "--nproc-per-node 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" ;;
    tp2_sp) echo "--nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel" ;;
    esac
}

# faulty KIND FLAGS...: a fault-free dp 2 stand-in run and one with the fault; bitwise the same
faulty() {
    run clean "$cudasim" cuda --nproc-per-node 2 $quick; ok clean
    run f "$cudasim" cuda --nproc-per-node 2 $quick "$@"; ok f
    same_losses clean f "the faulty run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt clean)" "$(ckpt f)"
}

# feature INJECT RESUMED FLAGS...: the layout FLAGS on the CPU backend and on the stand-in
# (close, parameters within $pabs), and on the stand-in with the fault INJECT: a restart, the
# supervisor's line matching RESUMED, and bitwise the fault-free stand-in run
# (soft timeout 10 s: a pipeline stage's or the ring's step on the stand-in, on a loaded
# machine, can take longer than $quick's 2 s; a killed rank is seen by its exit at once)
pabs=1e-5 lrel=1e-5
slow="--inprocess-soft-timeout 10 --inprocess-hard-timeout 20 --inprocess-barrier-timeout 60"
feature() {
    local inj=$1 resumed=$2; shift 2
    run cpu "$cohort" cpu "$@" $slow; ok cpu
    run cuda "$cudasim" cuda "$@" $slow; ok cuda
    grep -q "cudasim (the CPU stand-in" "$work/cuda.out" || fail "not on the stand-in: $(head -3 "$work/cuda.out")"
    close cpu cuda $lrel $pabs
    run f "$cudasim" cuda "$@" $slow --inject "$inj"; ok f
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "$resumed" "$work/f.out" || fail "not resumed as expected ($resumed): $(grep supervisor "$work/f.out")"
    same_losses cuda f "the faulty stand-in run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt cuda)" "$(ckpt f)"
}
D=--use-distributed-optimizer
from_memory="resume after iteration [0-9]* with the state of ranks\? [0-9, ]* (.*1 replaced"

# syncs_per_step NAME FLAGS...: the busiest rank's host waits of one step, from a 2- and a
# 6-iteration run of a 4-layer model, into $per
syncs_per_step() {
    local name=$1 it a b; shift
    for it in 2 6; do
        tiny_model --num-layers 4 --train-iters $it
        COHORT_CUDASIM_COUNTS="$work/$name-counts$it" run $name$it "$cudasim" cuda "$@"; ok $name$it
        [ "$(wc -l <"$work/$name-counts$it")" -ge 2 ] || fail "the stand-in wrote no counts: $(cat "$work/$name-counts$it")"
    done
    # the most a rank waited: the worker processes' lines (the supervisor has no device work)
    a=$(awk '{print $4}' "$work/$name-counts2" | sort -n | tail -1); b=$(awk '{print $4}' "$work/$name-counts6" | sort -n | tail -1)
    per=$(( (b - a + 3) / 4 ))
    echo "host waits of the busiest rank: $a in 2 iterations, $b in 6: $per a step"
    [ "$per" -ge 1 ] || fail "no waits counted ($a, $b): the counter does not count"
    # and of the second busiest (with two workers: the other one)
    a=$(awk '{print $4}' "$work/$name-counts2" | sort -n | tail -2 | head -1); b=$(awk '{print $4}' "$work/$name-counts6" | sort -n | tail -2 | head -1)
    per2=$(( (b - a + 3) / 4 ))
    echo "host waits of the second busiest rank: $a in 2 iterations, $b in 6: $per2 a step"
}

# overlapped PATTERN: after `feature` with both overlaps (its lay[] the layout without them):
# the killed rank came back from memory, the stand-in's log shows PATTERN (the overlap at
# work) and no fallback to an inline reduction or gather, and a stand-in run without the
# overlaps logs the same numbers and ends at the same checkpoint, bitwise
overlapped() {
    ! grep -q "loads the checkpoint" "$work/f.out" || fail "fell back to the checkpoint"
    grep -q "$1" "$work/cuda.out" || fail "not at work ($1): $(grep -i overlap "$work/cuda.out")"
    ! grep -q "no transport of the\|no device communicator" "$work/cuda.out" ||
        fail "not overlapped: $(grep -i 'overlap' "$work/cuda.out" | head -3)"
    run plain "$cudasim" cuda "${lay[@]}" $slow; ok plain
    same_losses plain cuda "the overlaps logged other numbers than the stand-in without them"
    ckpt_same "$(ckpt plain)" "$(ckpt cuda)"
}

case $case_name in
dopt_dp2)
    # the killed rank's optimizer shard comes back from its copy on the other rank's device
    feature "kill@rank=1,step=2,phase=allreduce" "$from_memory" --nproc-per-node 2 $D
    grep -q "distributed optimizer over 2 data-parallel ranks" "$work/cuda.out" || fail "no distributed optimizer"
    ! grep -q "loads the checkpoint" "$work/f.out" || fail "fell back to the checkpoint"
    ;;
dopt_tp2_dp2)
    feature "kill@rank=2,step=2,phase=allreduce" "$from_memory" --nproc-per-node 4 --tensor-model-parallel-size 2 $D
    ! grep -q "loads the checkpoint" "$work/f.out" || fail "fell back to the checkpoint"
    ;;
dopt_tp2_pp2)
    # data-parallel size 1: the killed stage's shard has no other holder, the checkpoint of
    # iteration 1 is loaded
    feature "kill@rank=3,step=2" "loads the checkpoint of iteration 1" --nproc-per-node 4 \
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --save-interval 1 $D
    ;;
mtp_pp2)
    # the depths on the last stage of a pp 2 pipeline (RoPE: a pipeline with MTP refuses
    # learned positions); the killed stage has no replica: the checkpoint of iteration 1.
    # Each depth's loss within 1e-5 as lm loss; the parameters within 3e-5 (the word
    # embedding's gradient sums the depths' too: a few 1e-5 after 3 Adam steps at lr 1e-3)
    pabs=3e-5
    feature "kill@rank=1,step=2" "loads the checkpoint of iteration 1" --nproc-per-node 2 \
        --pipeline-model-parallel-size 2 --mtp-num-layers 2 --position-embedding-type rope --save-interval 1
    grep -q '"mtp_2_loss"' "$work/cuda.jsonl" || fail "no MTP loss logged: $(tail -1 "$work/cuda.jsonl")"
    ;;
mtp_pp2_bf16|mtp_tp2_sp_bf16|mtp_p3_bf16)
    # the depths' transformer layers with bf16 activations; their norms, the concatenation and
    # the main final norm's output they read fp32 (docs/gpu.md)
    lay=(--nproc-per-node 2 --pipeline-model-parallel-size 2 --position-embedding-type rope)
    [ $case_name = mtp_tp2_sp_bf16 ] && lay=(--nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel)
    [ $case_name = mtp_p3_bf16 ] && lay=(--nproc-per-node 3 --pipeline-model-parallel-size 3
        --pipeline-model-parallel-layout "Et|tmm|L" --position-embedding-type rope)
    flags=("${lay[@]}" --mtp-num-layers 2 --bf16 --save-interval 1 $slow)
    run cpu "$cohort" cpu "${flags[@]}"; ok cpu
    run cuda "$cudasim" cuda "${flags[@]}"; ok cuda
    grep -q "cudasim (the CPU stand-in" "$work/cuda.out" || fail "not on the stand-in: $(head -3 "$work/cuda.out")"
    grep -q "the norms', attention's and GELU's outputs in bf16" "$work/cuda.out" ||
        fail "no bf16 activations: $(grep -m1 'activation memory' "$work/cuda.out")"
    grep -q '"mtp_2_loss"' "$work/cuda.jsonl" || fail "no MTP loss logged: $(tail -1 "$work/cuda.jsonl")"
    close cpu cuda 2e-5 2.5e-3
    if [ $case_name = mtp_tp2_sp_bf16 ]; then
        # the activation bytes (every rank the same): 2 bytes fewer than the CPU's per bf16
        # element, in the 2 decoder layers and the 2 depths' layers (ln1, ln2 [Nl,C], attention's
        # output [N,AH/2], the GELU's [N,F/2]) and each depth's enorm and hnorm outputs [Nl,C]
        # and their concatenation [Nl,2C] (N 64, Nl 32, C = AH 32, F 128); the final norms fp32
        ab() { grep -m1 -o 'activation memory: [0-9]*' "$work/$1.out" | grep -o '[0-9]*$'; }
        [ $(( $(ab cpu) - $(ab cuda) )) -eq $(( 2 * (4 * (2 * 32 * 32 + 64 * 16 + 64 * 64) + 2 * 4 * 32 * 32) )) ] ||
            fail "activation bytes: cpu $(ab cpu), stand-in $(ab cuda)"
    fi
    run f "$cudasim" cuda "${flags[@]}" --inject "kill@rank=1,step=2"; ok f
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "loads the checkpoint of iteration 1" "$work/f.out" || fail "not resumed: $(grep supervisor "$work/f.out")"
    same_losses cuda f "the faulty stand-in run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt cuda)" "$(ckpt f)"
    ;;
cp2|cp2_thd|cp2_bf16|cp2_thd_bf16)
    # ring attention over the NCCL context group (block attention kernels, the LSE merge and
    # the dK/dV sums on the device, send/recv queued on the backend's side stream beside the
    # blocks, ordered by events); THD: short
    # documents packed into each sequence, split per document. *_bf16: --bf16 with bf16
    # activations (attention's output rounded once to bf16 after the ring's last merge),
    # against the CPU's --bf16 within the bf16 layouts' bounds (2e-5, 2.5e-3)
    l=${case_name%_bf16}; extra=()
    if [ $l = cp2_thd ]; then
        /usr/bin/python3 -c 'import json, random
r = random.Random(5)
for i in range(600):
    print(json.dumps({"text": "".join(r.choice("abcdefgh ") for _ in range(r.choice([1, 3, 8, 21, 34])))}))' >"$work/short.jsonl"
        "$cohort" data preprocess --input "$work/short.jsonl" --output-prefix "$work/short" \
            --tokenizer-type ByteLevelTokenizer --append-eod --quiet || fail "preprocess"
        tiny=(--tokenizer-type ByteLevelTokenizer --data-path "$work/short_text_document" --split 90,10,0
              --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2
              --global-batch-size 8 --lr 1e-3 --data-cache-path "$work/cache" --log-interval 1 --eval-interval 1000
              --eval-iters 1 --threads 1 --train-iters $iters --reset-attention-mask --reset-position-ids --eod-mask-loss)
        extra=(--cp-packed-sequences)
    fi
    [ $l = $case_name ] || { extra+=(--bf16); lrel=2e-5; pabs=2.5e-3; }
    feature "kill@rank=1,step=2" "loads the checkpoint of iteration 1" --nproc-per-node 2 --context-parallel-size 2 \
        --attention-dropout 0 --save-interval 1 "${extra[@]}"
    grep -q "context parallelism 2" "$work/cuda.out" || fail "no context parallelism: $(head -3 "$work/cuda.out")"
    [ $l = cp2 ] || grep -q "per-document split (THD" "$work/cuda.out" || fail "not THD: $(grep -i context "$work/cuda.out")"
    n=$(grep -c "the ring's merge and dK/dV sums on the device, its shifts queued beside its blocks" "$work/cuda.out")
    [ "$n" -ge 2 ] || fail "$n rank(s) say the ring runs on the device: $(grep -i "ring's" "$work/cuda.out" | head -2)"
    if [ $l != $case_name ]; then
        for r in cuda f; do
            grep -q "the norms', attention's and GELU's outputs in bf16" "$work/$r.out" ||
                fail "no bf16 activations at cp 2 ($r): $(grep -m1 'activation memory' "$work/$r.out")"
        done
    fi
    ;;
cp2_syncs)
    # the ring's steps wait for the device nowhere: its merge and dK/dV sums are kernels and
    # its shifts NCCL sends and receives queued on the backend's side stream; a step of cp 2 (4
    # micro batches, 4 layers) at most 2 a micro batch (loss read, end of the backward) + 10
    # waits on the busiest rank: 16 are counted, where the ring's host merge, its per-call
    # buffers and a wait per ring step made it 304 (docs/gpu.md)
    max=$((2 * 4 + 10))
    syncs_per_step cp --nproc-per-node 2 --context-parallel-size 2 --attention-dropout 0
    [ "$per" -le $max ] || fail "a step of cp 2 waits for the GPU $per times (at most $max expected)"
    ;;
ep2_alltoall|ep2_allgather)
    # the experts split over 2 ranks, tokens exchanged by all-to-all or all-gather and
    # reduce-scatter over the NCCL expert group; the killed rank's experts have no other
    # holder: the checkpoint of iteration 1. Killed in its forward, so that the survivor's
    # dispatcher exchange fails (most runs): the new generation's expert group must get its
    # buffers (the allgather dispatcher's) past the old one's failure, and no backward may run
    # through a forward that failed (the survivor crashed in ag_backward so)
    inj="kill@rank=1,step=2"
    tiny_model --train-iters $iters --attention-dropout 0 --disable-bias-linear --num-experts 4 --moe-router-topk 2 \
        --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3
    feature "$inj" "loads the checkpoint of iteration 1" --nproc-per-node 2 \
        --expert-model-parallel-size 2 --moe-token-dispatcher-type ${case_name#ep2_} --save-interval 1
    grep -q '"load_balancing_loss"' "$work/cuda.jsonl" || fail "no MoE loss logged: $(tail -1 "$work/cuda.jsonl")"
    ;;
overlap_dp2)
    # --overlap-grad-reduce with the distributed optimizer: buckets of 1000 elements
    # reduce-scattered over NCCL on the communication thread during the last backward
    feature "kill@rank=1,step=2,phase=allreduce" "$from_memory" --nproc-per-node 2 $D --overlap-grad-reduce \
        --ddp-bucket-size 1000
    ! grep -q "loads the checkpoint" "$work/f.out" || fail "fell back to the checkpoint"
    grep -q "overlapped gradient reduction: [0-9]* buckets, [1-9][0-9]* started during the backward" "$work/cuda.out" ||
        fail "no bucket reduced during the backward: $(grep -i overlap "$work/cuda.out")"
    ;;
param_gather_tp2_dp2)
    # --overlap-param-gather (with --overlap-grad-reduce and the distributed optimizer) in
    # tensor 2 x data 2: the buckets all-gathered on the gather thread over the gradient
    # group's own NCCL communicator (its own stream) while the next forward's kernels and the
    # tensor group's collectives run, each waited for before its first layer; against the CPU
    # backend, through a kill, and bitwise the stand-in's run without the overlaps
    lay=(--nproc-per-node 4 --tensor-model-parallel-size 2 "$D" --ddp-bucket-size 1000)
    feature "kill@rank=2,step=2,phase=allreduce" "$from_memory" "${lay[@]}" --overlap-grad-reduce --overlap-param-gather
    overlapped "overlapped parameter all-gather: [1-9][0-9]* buckets"
    ;;
overlap_ep2_dp4)
    # both overlaps with expert parallelism: data 4 x expert 2 (expert-data-parallel pairs),
    # the experts' buckets reduced and gathered over the expert-data-parallel group's own NCCL
    # communicator, the rest over the gradient group's, beside the experts' token exchange on
    # the expert group's; against the CPU backend, through a kill (both groups' shards from
    # memory), and bitwise the stand-in's run without the overlaps
    tiny_model --train-iters $iters --attention-dropout 0 --disable-bias-linear --num-experts 4 --moe-router-topk 2 \
        --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3
    lay=(--nproc-per-node 4 --expert-model-parallel-size 2 "$D" --ddp-bucket-size 1000)
    feature "kill@rank=2,step=2,phase=allreduce" "$from_memory" "${lay[@]}" --overlap-grad-reduce --overlap-param-gather
    overlapped "overlapped gradient reduction: [0-9]* buckets, [1-9][0-9]* started during the backward"
    ;;
moe_tp2)
    # MoE under tp 2 with sequence parallelism, the experts split over the tensor group (the
    # expert tensor size the tensor size: its exchange over the tensor group); no replica of
    # a tensor rank: the checkpoint of iteration 1
    tiny_model --train-iters $iters --attention-dropout 0 --disable-bias-linear --num-experts 4 --moe-router-topk 2 \
        --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3
    feature "kill@rank=1,step=2" "loads the checkpoint of iteration 1" --nproc-per-node 2 \
        --tensor-model-parallel-size 2 --sequence-parallel --save-interval 1
    ;;
moe_bf16|moe_act16_allgather)
    # MoE with --bf16 and --moe-grouped-gemm at ep 2 with bf16 activations in the MoE layers
    # too (their input, the second norm's output, stored in bf16; the router's math fp32 on
    # it), tokens permuted on the device, against the CPU's bf16 (whose router reads the
    # fp32 input): losses within the bf16 layouts' 2e-5; parameters within 5e-3 (measured
    # 3.4e-3 at alltoall: the router's bf16 input moves the probabilities by ~1e-3 relative,
    # and Adam (lr 1e-3) turns an expert weight's near-zero gradient into steps of either
    # sign). Killed rank: the checkpoint, bitwise the fault-free run (two runs alike).
    tiny_model --train-iters $iters --attention-dropout 0 --disable-bias-linear --num-experts 4 --moe-router-topk 2 \
        --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3
    flags=(--nproc-per-node 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type $([ $case_name = moe_bf16 ] && echo alltoall || echo allgather)
           --bf16 --moe-grouped-gemm --save-interval 1 $slow)
    run cpu "$cohort" cpu "${flags[@]}"; ok cpu
    run cuda "$cudasim" cuda "${flags[@]}"; ok cuda
    grep -q "cudasim (the CPU stand-in" "$work/cuda.out" || fail "not on the stand-in: $(head -3 "$work/cuda.out")"
    grep -q "outputs in bf16 (the MoE layers' inputs too)" "$work/cuda.out" ||
        fail "no bf16 activations in the MoE model: $(grep 'activation memory' "$work/cuda.out" | head -2)"
    close cpu cuda 2e-5 5e-3
    run f "$cudasim" cuda "${flags[@]}" --inject "kill@rank=1,step=2"; ok f
    grep -q "loads the checkpoint of iteration 1" "$work/f.out" || fail "not resumed: $(grep supervisor "$work/f.out")"
    same_losses cuda f "the faulty stand-in run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt cuda)" "$(ckpt f)"
    ;;
ep2_syncs)
    # host waits of a step of a 4-layer MoE model at ep 2 (alltoall, --bf16 with bf16
    # activations): per MoE layer and micro batch the forward waits for the logits (routing
    # on the host) and for each exchange, the backward for the routing gradients and each
    # exchange; the permutations and the combine are device work (docs/gpu.md: 103 a step on
    # the busiest rank before, with host loops over the tokens; 71 after)
    syncs_per_step ep --nproc-per-node 2 --expert-model-parallel-size 2 --bf16 --num-experts 4 --moe-router-topk 2 \
        --moe-ffn-hidden-size 48 --disable-bias-linear
    [ "$per" -le "${MAX_SYNCS:-71}" ] || fail "a step waits for the GPU $per times (at most ${MAX_SYNCS:-71} expected)"
    ;;
dp2|tp2|pp2|tp2_dp2|vpp2|tp2_pp2|tp2_sp|dp2_bf16|tp2_bf16|pp2_bf16|tp2_dp2_bf16|tp2_sp_bf16)
    l=${case_name%_bf16}; flags=($(layout $l)); lrel=1e-5; pabs=1e-5
    [ "$l" != "$case_name" ] && { flags+=(--bf16); lrel=2e-5; pabs=2.5e-3; }
    run cpu "$cohort" cpu "${flags[@]}"; ok cpu
    run cuda "$cudasim" cuda "${flags[@]}"; ok cuda
    grep -q "cudasim (the CPU stand-in" "$work/cuda.out" || fail "not on the stand-in: $(head -3 "$work/cuda.out")"
    close cpu cuda $lrel $pabs
    if [ "$l" != "$case_name" ]; then
        # bf16 activations (the norms', attention's and GELU's outputs stored in bf16), under
        # tensor parallelism too
        said="the norms', attention's and GELU's outputs in bf16"
        grep -q "$said" "$work/cuda.out" || fail "no bf16 activations: $(grep -m1 'activation memory' "$work/cuda.out")"
        # the bytes (the tensor group's rank 0 logs; every rank holds the same): per layer ln1,
        # ln2 [Nl,C], attention's output [N,AH/tp] and the GELU's [N,F/tp] in bf16, 2 bytes each
        # fewer than the CPU's fp32 (N 64, Nl = N/tp under sequence parallelism, C = AH 32, F 128;
        # 2 layers)
        lb() { grep -m1 -o 'activation memory: [0-9]* bytes on this rank (layers [0-9]*' "$work/$1.out" | grep -o '[0-9]*$'; }
        case $l in dp2) nl=64 tp=1 ;; tp2) nl=64 tp=2 ;; tp2_sp) nl=32 tp=2 ;; *) nl= ;; esac
        [ -z "$nl" ] || [ $(( $(lb cpu) - $(lb cuda) )) -eq $(( 2 * 2 * (2 * nl * 32 + 64 * (32 + 128) / tp) )) ] ||
            fail "layer activation bytes: cpu $(lb cpu), stand-in $(lb cuda)"
        [[ " ${flags[*]} " == *" --pipeline-model-parallel-size "* ]] || {
            run again "$cudasim" cuda "${flags[@]}"; ok again
            same_losses cuda again "two stand-in runs differ"
            ckpt_same "$(ckpt cuda)" "$(ckpt again)"
        }
    fi
    if [ $case_name = tp2_sp_bf16 ]; then
        # recomputation rewrites the bf16 buffers (and gathers them again): bitwise the run without
        rc_sel=(--recompute-granularity selective --recompute-modules layernorm core_attn mlp)
        rc_full=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
        run sel "$cudasim" cuda "${flags[@]}" "${rc_sel[@]}"; ok sel
        same_losses cuda sel "selective recomputation changed the numbers"
        ckpt_same "$(ckpt cuda)" "$(ckpt sel)"
        run full "$cudasim" cuda "${flags[@]}" "${rc_full[@]}"; ok full
        same_losses cuda full "full recomputation changed the numbers"
        ckpt_same "$(ckpt cuda)" "$(ckpt full)"
        grep -q "$said" "$work/full.out" || fail "no bf16 activations with full recomputation"
        # a tensor rank killed: no replica, the checkpoint of iteration 1, bitwise the fault-free run
        run f "$cudasim" cuda "${flags[@]}" --save-interval 1 $slow --inject "kill@rank=1,step=2"; ok f
        grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
        grep -q "loads the checkpoint of iteration 1" "$work/f.out" || fail "not resumed: $(grep supervisor "$work/f.out")"
        same_losses cuda f "the faulty stand-in run logged other numbers than the fault-free one"
        ckpt_same "$(ckpt cuda)" "$(ckpt f)"
    fi
    if [[ " ${flags[*]} " == *" --pipeline-model-parallel-size "* ]]; then
        said="pipeline: activations and gradients over NCCL"
        [ $l = vpp2 ] && said+=".*(the interleaved schedule"
        n=$(grep -c "$said" "$work/cuda.out")
        [ "$n" -ge "${flags[1]}" ] || fail "$n rank(s) say the pipeline goes over NCCL: $(grep -i pipeline "$work/cuda.out" | head -3)"
        ! grep -q "pipeline: .* go over the host" "$work/cuda.out" || fail "over the host: $(grep -m1 "over the host" "$work/cuda.out")"
        run again "$cudasim" cuda "${flags[@]}"; ok again
        same_losses cuda again "two stand-in runs differ"
        ckpt_same "$(ckpt cuda)" "$(ckpt again)"
    fi
    ;;
swiglu_bf16)
    # SwiGLU layers with bf16 activations: the SwiGLU output made in bf16 by its kernel (as the
    # GELU's) and read by fc2 as it is; against the CPU's --bf16 dp 2 within the bf16 bounds,
    # the layer activation bytes the bf16 count fewer (ln1, ln2 [N,C], attention's [N,AH] and
    # the SwiGLU output [N,F]: N 64, C = AH 32, F 64 (Megatron's --swiglu width: 4C 2/3 rounded
    # down to a multiple of 64), 2 layers), two runs bitwise alike
    flags=($(layout dp2) --swiglu --bf16)
    run cpu "$cohort" cpu "${flags[@]}"; ok cpu
    run cuda "$cudasim" cuda "${flags[@]}"; ok cuda
    close cpu cuda 2e-5 2.5e-3
    grep -q "the norms', attention's and SwiGLU's outputs in bf16" "$work/cuda.out" ||
        fail "no bf16 SwiGLU output: $(grep -m1 'activation memory' "$work/cuda.out")"
    lb() { grep -m1 -o 'activation memory: [0-9]* bytes on this rank (layers [0-9]*' "$work/$1.out" | grep -o '[0-9]*$'; }
    [ $(( $(lb cpu) - $(lb cuda) )) -eq $(( 2 * 2 * (2 * 64 * 32 + 64 * (32 + 64)) )) ] ||
        fail "layer activation bytes: cpu $(lb cpu), stand-in $(lb cuda)"
    run again "$cudasim" cuda "${flags[@]}"; ok again
    same_losses cuda again "two stand-in runs differ"
    ckpt_same "$(ckpt cuda)" "$(ckpt again)"
    ;;
tp2_dp2_fp16)
    flags=($(layout tp2_dp2) --fp16 --loss-scale 4096)
    export COHORT_TEST_FP16_OVERFLOW=3:2
    run cpu "$cohort" cpu "${flags[@]}"; ok cpu
    run cuda "$cudasim" cuda "${flags[@]}"; ok cuda
    grep -q "cudasim (the CPU stand-in.*fp16" "$work/cuda.out" || fail "not fp16 on the stand-in: $(grep -m1 cuda: "$work/cuda.out")"
    sk() { grep -o '"skipped_iterations":[0-9]*' "$work/$1.jsonl" | cut -d: -f2 | paste -sd' '; }
    [ "$(sk cuda)" = "0 1 1" ] && [ "$(sk cpu)" = "0 1 1" ] || fail "skipped: cpu $(sk cpu), stand-in $(sk cuda)"
    close cpu cuda 2e-5 2.5e-3
    ;;
reproducible)
    run a "$cudasim" cuda --nproc-per-node 2; ok a
    run b "$cudasim" cuda --nproc-per-node 2; ok b
    same_losses a b "two stand-in runs differ"
    ckpt_same "$(ckpt a)" "$(ckpt b)"
    ;;
killed)
    faulty --inject "kill@rank=1,step=2,phase=allreduce"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "1 replaced" "$work/f.out" || fail "the killed rank was not replaced: $(grep supervisor "$work/f.out")"
    ;;
nan)
    faulty --inject "nan@rank=1,step=2,microbatch=1"
    grep -q "iteration 2: rerun" "$work/f.out" || fail "no replay of iteration 2: $(grep -i nan "$work/f.out" | head -3)"
    ;;
nccl_hang)
    # rank 1 hangs in its forward pass (a busy loop that polls the abort flag), so rank 0
    # waits inside the data-parallel NCCL all-reduce; the soft timeout aborts the generation:
    # ncclCommAbort from rank 0's link thread must end that collective in process (rank 1's
    # own abort does not reach rank 0 here, as with real NCCL: COHORT_SIM_NCCL_ABORT_SILENT)
    COHORT_SIM_NCCL_ABORT_SILENT=1 faulty --inject "hang@rank=1,step=2"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "rank 0: generation aborted during iteration 2" "$work/f.out" ||
        fail "rank 0 did not unwind: $(grep 'rank 0\|supervisor' "$work/f.out")"
    # nobody replaced: a collective that ignored the abort would have had rank 0 killed
    grep -q "generation 2: 2 rank(s) resume after iteration 1 with the state of rank [01] (0 replaced" "$work/f.out" ||
        fail "not resumed in process: $(grep supervisor "$work/f.out")"
    ;;
nan_bf16)
    # a NaN loss on rank 1 with --bf16 (bf16 activations): replayed in place, the job bitwise
    # the fault-free run (losses and checkpoint), as on the CPU backend
    run clean "$cudasim" cuda --nproc-per-node 2 $quick --bf16; ok clean
    run f "$cudasim" cuda --nproc-per-node 2 $quick --bf16 --inject "nan@rank=1,step=2,microbatch=1"; ok f
    grep -q "iteration 2: accept (transient_error)" "$work/f.out" || fail "no accepted replay: $(grep supervisor "$work/f.out")"
    same_losses clean f "the replayed run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt clean)" "$(ckpt f)"
    ;;
act_flip_bf16)
    # bit 30 of an fp32 activation (bf16's bit 14, the exponent's top) flipped in rank 1's
    # final-norm output, which bf16 activations keep in bf16: a huge value, the step replayed
    # in place and the job bitwise the fault-free run (losses and checkpoint)
    run clean "$cudasim" cuda --nproc-per-node 2 $quick --bf16; ok clean
    run f "$cudasim" cuda --nproc-per-node 2 $quick --bf16 --inject "bitflip-act@rank=1,step=2,bit=30"; ok f
    grep -q "the norms', attention's and GELU's outputs in bf16" "$work/f.out" || fail "no bf16 activations"
    grep -q "iteration 2: rerun: rank 1: \(grad_outlier\|nan_\|inf_\)" "$work/f.out" ||
        fail "the flip was not caught: $(grep -i 'inject\|supervisor' "$work/f.out" | head -4)"
    grep -q "iteration 2: accept (transient_error)" "$work/f.out" || fail "no accepted replay: $(grep supervisor "$work/f.out")"
    same_losses clean f "the replayed run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt clean)" "$(ckpt f)"
    ;;
sdc)
    faulty --inject-seed 3 --inject "bitflip-param@rank=1,step=2,bit=22,phase=forward"
    grep -q "inject: flipped bit 22 of parameter" "$work/f.out" || fail "no flip: $(grep -i inject "$work/f.out" | head -3)"
    grep -q "iteration 2: rerun: parameter checksums differ between the replicas with no majority" "$work/f.out" ||
        fail "the checksums did not catch it: $(grep supervisor "$work/f.out")"
    grep -q "iteration 2: repair (persistent_error): rank 1: parameters changed in memory since its last update .*repaired from rank 0" \
        "$work/f.out" || fail "no repair: $(grep supervisor "$work/f.out")"
    ;;
pp2_killed|tp2_pp2_killed|vpp2_killed)
    pp=(--nproc-per-node 2 --pipeline-model-parallel-size 2 --save-interval 1 $quick); victim=1
    [ $case_name = tp2_pp2_killed ] && { pp[1]=4; pp+=(--tensor-model-parallel-size 2); victim=3; }
    [ $case_name = vpp2_killed ] && pp=($(layout vpp2) --save-interval 1 $slow)
    run clean "$cudasim" cuda "${pp[@]}"; ok clean
    [ $case_name != vpp2_killed ] || grep -q "over NCCL on the device.*(the interleaved schedule" "$work/clean.out" ||
        fail "the interleaved pipeline is not over NCCL: $(grep -m1 "pipeline:" "$work/clean.out")"
    run f "$cudasim" cuda "${pp[@]}" --inject "kill@rank=$victim,step=2"; ok f
    resumed_bitwise clean
    ;;
vpp2_group)
    tiny_model --train-iters $iters --global-batch-size 10
    flags=($(layout vpp2) --microbatch-group-size-per-virtual-pipeline-stage 3 --save-interval 1 $slow)
    run cpu "$cohort" cpu "${flags[@]}"; ok cpu
    run cuda "$cudasim" cuda "${flags[@]}"; ok cuda
    grep -q "cudasim (the CPU stand-in" "$work/cuda.out" || fail "not on the stand-in: $(head -3 "$work/cuda.out")"
    close cpu cuda 1e-5 1e-5
    n=$(grep -c "pipeline: activations and gradients over NCCL.*(the interleaved schedule.*received ahead into queued" "$work/cuda.out")
    [ "$n" -ge 2 ] || fail "$n rank(s) say the pipeline goes over NCCL with queued receives: $(grep -i pipeline: "$work/cuda.out" | head -3)"
    ! grep -q "pipeline: .* go over the host" "$work/cuda.out" || fail "over the host: $(grep -m1 "over the host" "$work/cuda.out")"
    run again "$cudasim" cuda "${flags[@]}"; ok again
    same_losses cuda again "two stand-in runs differ"
    ckpt_same "$(ckpt cuda)" "$(ckpt again)"
    run f "$cudasim" cuda "${flags[@]}" --inject "kill@rank=1,step=2"; ok f
    resumed_bitwise cuda
    ;;
pp2_nan)
    pp=(--nproc-per-node 2 --pipeline-model-parallel-size 2 $quick)
    run clean "$cudasim" cuda "${pp[@]}"; ok clean
    run f "$cudasim" cuda "${pp[@]}" --inject "nan@rank=1,step=2,microbatch=1"; ok f
    grep -q "iteration 2: rerun" "$work/f.out" || fail "no replay of iteration 2: $(grep -i nan "$work/f.out" | head -3)"
    same_losses clean f "the faulty run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt clean)" "$(ckpt f)"
    ;;
pp2_nccl_hang)
    # (a hard timeout of 12 s: after the abort the stand-in still runs, on the CPU, the
    # kernels rank 0 queued behind the aborted receive before it reaches the barrier)
    pp=(--nproc-per-node 2 --pipeline-model-parallel-size 2 --save-interval 1 --inprocess-soft-timeout 2
        --inprocess-hard-timeout 12 --inprocess-barrier-timeout 60)
    run clean "$cudasim" cuda "${pp[@]}"; ok clean
    COHORT_SIM_NCCL_ABORT_SILENT=1 run f "$cudasim" cuda "${pp[@]}" --inject "hang@rank=1,step=2"; ok f
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "rank 0: generation aborted during iteration 2" "$work/f.out" ||
        fail "rank 0 did not unwind: $(grep 'rank 0\|supervisor' "$work/f.out")"
    grep -q "0 replaced" "$work/f.out" || fail "a rank was replaced: $(grep supervisor "$work/f.out")"
    # found by the supervisor from rank 0's reported wait, not by a device operation's deadline
    grep -q "no progress: rank 0 waited .* for rank 1's pipeline message" "$work/f.out" ||
        fail "the hang was not found from rank 0's wait: $(grep 'supervisor' "$work/f.out" | head -3)"
    same_losses clean f "the faulty run logged other numbers than the fault-free one"
    ckpt_same "$(ckpt clean)" "$(ckpt f)"
    ;;
pp2_syncs)
    max=$((2 * 4 + 8))
    syncs_per_step pp --nproc-per-node 2 --pipeline-model-parallel-size 2
    [ "$per" -le $max ] || fail "a step waits for the GPU $per times (at most $max expected)"
    # the first stage reads no loss: no wait per micro batch at all
    [ "$per2" -le 8 ] || fail "the first stage waits for the GPU $per2 times a step (at most 8 expected)"
    ;;
dopt_syncs)
    # the distributed optimizer's step queues its shard exchange and all-gather on the
    # stream: 12 waits a step counted (see the comment at the top; 15 when the stream was
    # synced after the averaging and around the all-gather)
    max=12
    syncs_per_step dopt --nproc-per-node 2 $D
    [ "$per" -le $max ] || fail "a dopt step waits for the GPU $per times (at most $max expected)"
    ;;
tp2_syncs)
    max=$((5 * 4 + 8))
    syncs_per_step tp --nproc-per-node 2 --tensor-model-parallel-size 2
    [ "$per" -le $max ] || fail "a step waits for the GPU $per times (at most $max expected)"
    ;;
*) fail "unknown case $case_name" ;;
esac
