#!/usr/bin/env bash
# moe_ep_test.sh - expert parallelism through `cohort train` (--expert-model-parallel-size,
# train/trainer_ep.c), one case per meson test.
#   moe_ep_test.sh COHORT CASE
# The model: 4 layers, every second one MoE with 4 experts, top-2, aux and z losses. Ranks
# are processes on the CPU backend; an expert group is ep consecutive data-parallel ranks.
# Cases:
#   match     ep 2 (dp 2) and ep 4 (dp 4), each with the alltoall and the allgather
#             dispatcher, and ep 2 x dp 4, train the one-rank job's numbers: losses,
#             gradient norms and the validation loss within 1e-6 relative (compare_runs.sh),
#             the final parameters and Adam moments within 1e-5 (ckpt diff; every expert
#             tensor present); a repeated ep 4 run is bitwise the same (metrics and
#             checkpoint)
#   pp        ep 2 x pp 2 (4 ranks: the expert groups are per stage) against one rank, as
#             match
#   reshard   a checkpoint saved at ep 2 resumes at ep 4 and on one rank (experts by global
#             index): both end within 1e-5 of the uninterrupted one-rank run (the #1517 class)
#   killed    ep 2 x dp 4: the killed rank 3 (expert rank 1 of the second expert group) is
#             rebuilt from rank 1's memory (its expert-data-parallel peer: the same experts)
#             and the job ends bitwise as the clean run; at ep 2 x dp 2 no rank holds the
#             lost experts, so the job reloads its last checkpoint, and ends bitwise too
#   sdc       a flipped weight bit on rank 2 is found by the checksums (an expert group is
#             one replica) and repaired from the other expert group: bitwise the clean run
#   tp        with tensor parallelism (sequence parallel, --expert-tensor-parallel-size 1: the
#             expert group spans the tensor ranks, each routing its token shard): tp 2 x ep 2,
#             tp 2 x ep 4 (allgather) and tp 2 x ep 2 x pp 2 against one rank, as match; a
#             tp 2 x ep 2 checkpoint resumed on one rank; at tp 2 x ep 2 x dp 2 the killed
#             rank 3 is rebuilt from rank 1 (the same tensor slices and experts), bitwise
#   etp       the experts split over the tensor group (--expert-tensor-parallel-size = tp, here
#             Megatron's default: the flag not given): tp 2 and tp 2 x ep 2 (4 ranks) with the
#             alltoall and the allgather dispatcher, tp 2 x pp 2, tp 2 x cp 2 and tp 2 x ep 2 x
#             pp 2 (8 ranks), against one rank, as match; each expert
#             tensor written as two slices (ckpt inspect) where etp 1 writes it whole; the flag
#             given as 2 is the default's run bitwise; a checkpoint of iteration 3 saved at
#             tp 2 resumes on one rank, at tp 2 with --expert-tensor-parallel-size 1 and at
#             tp 2 x ep 2, one saved at tp 2 x ep 2 on one rank and at tp 2 x ep 2, and a
#             one-rank one at tp 2 (resharding the slices), each ending within 1e-5 of the
#             uninterrupted one-rank run
#   etp_killed at tp 2 x ep 2 x dp 4 (etp 2, 8 ranks: two expert-data-parallel replicas) the
#             killed rank 7 (tensor rank 1, expert rank 1) is rebuilt from rank 3's memory (the
#             same experts and slices), and a flipped weight bit on rank 6 is repaired from
#             the other replica, each bitwise the clean run; a NaN that reproduces on rank 7
#             is recomputed by the first expert group and diagnosed as the data's (exit 3)
#   cp_thd    with context parallelism over packed sequences (THD; the padding rows route to no
#             expert): cp 2 x ep 2 (alltoall) and cp 2 x dp 2 x ep 2 (allgather) against one
#             rank, as cp
#   cp        with context parallelism (the context ranks folded into the expert groups, Megatron's
#             expert layout): cp 2 x ep 2 (alltoall), cp 2 x dp 2 x ep 2 (allgather) and cp 2 x
#             ep 4, and with tensor parallelism tp 2 x cp 2 x ep 4 (etp 1) and tp 2 x cp 2 x ep 2
#             (etp 2) against one rank, as match, and load_balancing_loss and z_loss within 1e-6
#             relative (also with sigmoid routing, the expert bias, seq_aux_loss and a shared
#             expert at cp 2 x dp 2 x ep 2, losses only); a cp 2 x dp 2 x ep 2 checkpoint
#             (its layout data 2) resumed on one rank, within 1e-5; at cp 2 x dp 2 x ep 2 the killed rank 3 is rebuilt from rank 1 (the same
#             context rank and experts), bitwise the clean run; a flipped weight bit on rank 2
#             repaired from the other expert group, bitwise; a NaN that reproduces on rank 3
#             found by the other expert group's rank 1 (its context rank's share): exit 3
#   peer_check a NaN that reproduces is recomputed by the other expert group (every rank of
#             it taking its counterpart's micro batches) and diagnosed as the data's: exit 3
#   refused   bad configurations exit 2 before any work: experts not divisible by ep, ep
#             without experts, ep not dividing the data-parallel ranks, ep not a multiple of
#             the tensor-parallel size at expert tensor size 1, tp x ep not dividing the world
#             at expert tensor size tp, ep x expert tensor size not a multiple of tp x cp
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir moe-ep

. "${COHORT_SOURCE_ROOT:?}/tests/integration/moe_tiny.sh"

run() { train_ok "$1" --train-iters "$2" --save "$work/$1.ck" "${@:3}"; } # NAME ITERS ARGS...: checkpoint $work/NAME.ck
close() { # REF RUN: the final checkpoints within 1e-5, every expert tensor compared
    "$cohort" ckpt diff "$work/$1.ck" "$work/$2.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$2: diff"
    /usr/bin/python3 - "$work/d.json" <<'PY' || fail "$2: parameters differ from $1's: $(head -c 400 "$work/d.json")"
import json, sys
rows = json.load(open(sys.argv[1]))['tensors']
for e in range(4):
    for l in (0, 2):
        for w in ('fc1', 'fc2'):
            for p in ('', 'optimizer.exp_avg.', 'optimizer.exp_avg_sq.'):
                n = f'{p}layers.{l}.mlp.experts.{e}.{w}.weight'
                assert any(r['name'] == n for r in rows), n
assert all(r['status'] in ('bitwise equal', 'differs') for r in rows), [r for r in rows if r['status'] not in ('bitwise equal', 'differs')][:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
PY
}
recovered() { # INJECT PATTERN ARGS...: 8 iterations of ARGS, clean and with the fault: the output says
    local inj=$1 re=$2; shift 2 # PATTERN (grep -E) and the checkpoints are bitwise the same
    run clean 8 "$@"
    run f 8 "$@" --inject "$inj"
    grep -Eq "$re" "$work/f.out" || fail "$inj: no '$re': $(grep -i 'replaced\|supervisor' "$work/f.out" | head)"
    bitwise clean f
}
bitwise() { ckpt_same "$work/$1.ck" "$work/$2.ck"; } # A B: two runs' checkpoints bitwise the same

three_faults() { # KILL FROM FLIP REPAIR_RE NAN REPORTER_RE FOUND_RE ARGS...: 6 iterations of ARGS
    # clean; rank KILL killed at iteration 4 and rebuilt from rank FROM's memory; a weight bit
    # flipped on rank FLIP repaired from a rank matching REPAIR_RE (both bitwise the clean run);
    # a NaN on rank NAN every replay, reported by REPORTER_RE, reproduced by FOUND_RE: exit 3
    local kill=$1 from=$2 flip=$3 rre=$4 nan=$5 rep=$6 found=$7 rc; shift 7
    run clean 6 "$@"
    run f 6 "$@" --inject "kill@rank=$kill,step=4"
    grep -q "rank $kill replaced in process generation 2: state of iteration 3 taken from rank $from's memory" \
        "$work/f.out" || fail "rank $kill did not take rank $from's state: $(grep -i 'replaced\|supervisor' "$work/f.out" | head)"
    bitwise clean f
    run s 6 "$@" --inject "bitflip-param@rank=$flip,step=4,bit=22"
    grep -Eq "iteration 4: repair .*silent data corruption; repaired from rank $rre" "$work/s.out" ||
        fail "not repaired: $(grep supervisor "$work/s.out")"
    bitwise clean s
    "$cohort" train "${tiny[@]}" --train-iters 6 "$@" --inject "nan@rank=$nan,step=4,times=always" >"$work/p.out" 2>&1
    rc=$?
    [ $rc -eq 3 ] || fail "peer check: exit $rc, want 3: $(tail -5 "$work/p.out")"
    grep -Eq "rank $rep: nan_[a-z]* \(nan\) reproduced on rank $found too: the data or the model is at fault" \
        "$work/p.out" || fail "no peer check: $(grep supervisor "$work/p.out" | head)"
}
case $case_name in
match)
    run one 5
    run ep2a 5 --nproc-per-node 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
    run ep2g 5 --nproc-per-node 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
    run ep4a 5 --nproc-per-node 4 --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall
    run ep4g 5 --nproc-per-node 4 --expert-model-parallel-size 4 --moe-token-dispatcher-type allgather
    run ep2d4 5 --nproc-per-node 4 --expert-model-parallel-size 2
    compare 1 one ep2a ep2g ep4a ep4g ep2d4
    for n in ep2a ep2g ep4a ep4g ep2d4; do close one $n; done
    run ep4b 5 --nproc-per-node 4 --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall
    same_losses ep4a ep4b "two ep 4 runs log different numbers"
    bitwise ep4a ep4b
    ;;
pp)
    run one 5
    run ep2pp2 5 --nproc-per-node 4 --expert-model-parallel-size 2 --pipeline-model-parallel-size 2
    compare 1 one ep2pp2
    close one ep2pp2
    ;;
reshard)
    run one 6
    run half 6 --nproc-per-node 2 --expert-model-parallel-size 2 --exit-interval 3
    cp -r "$work/half.ck" "$work/half1.ck"
    "$cohort" train "${tiny[@]}" --train-iters 6 --nproc-per-node 4 --expert-model-parallel-size 4 \
        --load "$work/half.ck" --save "$work/half.ck" >"$work/r4.out" 2>&1 || fail "resume at ep 4: $(tail -3 "$work/r4.out")"
    grep -q "successfully loaded checkpoint" "$work/r4.out" || fail "ep 4 did not load: $(head -5 "$work/r4.out")"
    "$cohort" train "${tiny[@]}" --train-iters 6 --load "$work/half1.ck" --save "$work/half1.ck" >"$work/r1.out" 2>&1 ||
        fail "resume on one rank: $(tail -3 "$work/r1.out")"
    close one half
    close one half1
    ;;
killed)
    k=(--nproc-per-node 4 --expert-model-parallel-size 2)
    run clean 8 "${k[@]}"
    run f 8 "${k[@]}" --inject "kill@rank=3,step=4"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "rank 3 replaced in process generation 2: state of iteration 3 taken from rank 1's memory" "$work/f.out" ||
        fail "rank 3 did not take rank 1's state: $(grep -i 'replaced\|supervisor' "$work/f.out" | head)"
    bitwise clean f
    # ep = dp: the lost experts have no replica; the last checkpoint (iteration 2) is reloaded
    k=(--nproc-per-node 2 --expert-model-parallel-size 2 --save-interval 2)
    run clean2 8 "${k[@]}"
    run g 8 "${k[@]}" --inject "kill@rank=1,step=4"
    grep -q "no replica survived of the model shard" "$work/g.out" || fail "no fallback: $(grep supervisor "$work/g.out")"
    grep -q "loads the checkpoint of iteration 2" "$work/g.out" || fail "no reload: $(grep supervisor "$work/g.out")"
    bitwise clean2 g
    ;;
sdc)
    recovered "bitflip-param@rank=2,step=4,bit=22" "iteration 4: repair .*silent data corruption; repaired from rank [01]" \
        --nproc-per-node 4 --expert-model-parallel-size 2
    ;;
tp)
    T=(--tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1)
    run one 6
    run t2e2 6 --nproc-per-node 2 "${T[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
    run t2e4 6 --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 4 --moe-token-dispatcher-type allgather
    run t2e2p2 6 --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --moe-token-dispatcher-type alltoall
    compare 1 one t2e2 t2e4 t2e2p2
    for n in t2e2 t2e4 t2e2p2; do close one $n; done
    run half 6 --nproc-per-node 2 "${T[@]}" --expert-model-parallel-size 2 --exit-interval 3
    "$cohort" train "${tiny[@]}" --train-iters 6 --load "$work/half.ck" --save "$work/half.ck" >"$work/r1.out" 2>&1 ||
        fail "resume on one rank: $(tail -3 "$work/r1.out")"
    close one half
    recovered "kill@rank=3,step=4" "rank 3 replaced in process generation 2: state of iteration 3 taken from rank 1's memory" \
        --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2
    ;;
etp)
    T=(--tensor-model-parallel-size 2 --sequence-parallel) # no --expert-tensor-parallel-size: 2
    A=(--moe-token-dispatcher-type alltoall)               # (allgather is Megatron's default)
    run one 6
    run t2a 6 --nproc-per-node 2 "${T[@]}" "${A[@]}"
    run t2g 6 --nproc-per-node 2 "${T[@]}" --moe-token-dispatcher-type allgather
    run t2e2 6 --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2 "${A[@]}"
    run t2e2g 6 --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
    run t2p2 6 --nproc-per-node 4 "${T[@]}" --pipeline-model-parallel-size 2 "${A[@]}"
    run t2c2 6 --nproc-per-node 4 "${T[@]}" --context-parallel-size 2 "${A[@]}"
    run t2e2p2 6 --nproc-per-node 8 "${T[@]}" --expert-model-parallel-size 2 --pipeline-model-parallel-size 2 "${A[@]}"
    compare 1 one t2a t2g t2e2 t2e2g t2p2 t2c2 t2e2p2
    for n in t2a t2g t2e2 t2e2g t2p2 t2c2 t2e2p2; do close one $n; done
    # the experts are split: two slices per expert tensor (one at etp 1)
    "$cohort" ckpt inspect "$work/t2a.ck" >"$work/i2" 2>&1 || fail "inspect"
    grep -Eq "^ *layers\.0\.mlp\.experts\.3\.fc2\.weight +model F32 +\[32, 48\] +2 " "$work/i2" ||
        fail "expert 3's fc2 is not two slices: $(grep experts.3.fc2 "$work/i2" | head -2)"
    grep -q '"moe_ep_bytes_sent":[1-9]' "$work/t2a.jsonl" || fail "no exchange over the tensor group in the metrics"
    run t2x 6 --nproc-per-node 2 "${T[@]}" "${A[@]}" --expert-tensor-parallel-size 2
    bitwise t2a t2x
    # resharding: saved at tp 2 (etp 2), resumed on one rank, at etp 1 and at tp 2 x ep 2; saved
    # at tp 2 x ep 2, resumed on one rank and at tp 2 x ep 2 (the other dispatcher); saved on
    # one rank, resumed at tp 2 (the whole experts cut into slices)
    resume() { # NAME FROM ARGS...: iteration 3 of FROM resumed to 6 as NAME
        local name=$1 from=$2; shift 2
        cp -r "$work/$from.ck" "$work/$name.ck"
        "$cohort" train "${tiny[@]}" --train-iters 6 --load "$work/$name.ck" --save "$work/$name.ck" "$@" \
            >"$work/$name.out" 2>&1 || fail "$name: $(tail -3 "$work/$name.out")"
        grep -q "successfully loaded checkpoint .* at iteration 3" "$work/$name.out" ||
            fail "$name did not load iteration 3: $(grep -i checkpoint "$work/$name.out" | head -3)"
        close one "$name"
    }
    run half 6 --nproc-per-node 2 "${T[@]}" --exit-interval 3
    run halfe 6 --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2 --exit-interval 3 "${A[@]}"
    resume r1 half
    resume r2 half --nproc-per-node 2 "${T[@]}" --expert-tensor-parallel-size 1
    resume r3 halfe
    resume r4 halfe --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2
    resume r5 half --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2 "${A[@]}"
    run half1 6 --exit-interval 3
    resume r6 half1 --nproc-per-node 2 "${T[@]}" "${A[@]}"
    ;;
etp_killed)
    k=(--nproc-per-node 8 --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2
       --moe-token-dispatcher-type alltoall)
    # the killed rank 7 (tensor rank 1, expert rank 1) rebuilt from rank 3's memory; a flipped
    # weight bit on rank 6 (tensor rank 0, expert rank 1 of the second replica) repaired from the
    # other one; a NaN every replay on rank 7 (the second expert group, ranks 4-7) recomputed
    # by the first expert group and found there too
    three_faults 7 3 6 "[0-3]" 7 "[4-7]" "[0-3]" "${k[@]}"
    ;;
cp)
    # context parallelism folded into the expert groups (Megatron's expert layout): at cp 2 x ep 2
    # the expert group is the context group, at cp 2 x dp 2 x ep 2 each context group, at cp 2 x
    # ep 4 both replicas' context groups; each context rank routes its own tokens
    C=(--context-parallel-size 2)
    run one 5
    run c2e2 5 --nproc-per-node 2 "${C[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
    run c2d2e2 5 --nproc-per-node 4 "${C[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
    run c2e4 5 --nproc-per-node 4 "${C[@]}" --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall
    # with tensor parallelism (sequence parallel; the token group is tensor x context): tp 2 x
    # cp 2 x ep 4 at expert tensor size 1, and tp 2 x cp 2 x ep 2 with the experts split over
    # the tensor group (etp 2): in both the expert group is the tensor x context group
    T=(--tensor-model-parallel-size 2 --sequence-parallel "${C[@]}")
    run t2c2e4 5 --nproc-per-node 4 "${T[@]}" --expert-tensor-parallel-size 1 --expert-model-parallel-size 4 \
        --moe-token-dispatcher-type alltoall
    run t2c2e2 5 --nproc-per-node 4 "${T[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
    compare 1 one c2e2 c2d2e2 c2e4 t2c2e4 t2c2e2
    moe_losses_match one:c2e2 one:c2d2e2 one:c2e4 one:t2c2e4 one:t2c2e2
    for n in c2e2 c2d2e2 c2e4 t2c2e4 t2c2e2; do close one $n; done
    grep -q '"moe_ep_bytes_sent":[1-9]' "$work/c2e4.jsonl" || fail "no exchange over the expert group in the metrics"
    # sigmoid routing, the expert bias (its counts over data x tensor x context), seq_aux_loss
    # and a shared expert at cp 2 x dp 2 x ep 2: losses, norms and the MoE losses (the final
    # parameters differ by about 1.3e-5 here at ep 2 without cp too: Adam on near-zero
    # gradients; not compared)
    eb=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01
        --moe-router-load-balancing-type seq_aux_loss --moe-shared-expert-intermediate-size 16)
    run eb1 5 "${eb[@]}"
    run eb2 5 "${eb[@]}" --nproc-per-node 4 "${C[@]}" --expert-model-parallel-size 2
    compare 1 eb1 eb2
    moe_losses_match eb1:eb2
    # a checkpoint of iteration 3 saved at cp 2 x dp 2 x ep 2 (the experts by global index, each
    # written by the expert rank holding it) resumed on one rank ends at the one-rank run
    run one6 6
    run half 6 --nproc-per-node 4 "${C[@]}" --expert-model-parallel-size 2 --exit-interval 3
    "$cohort" ckpt inspect "$work/half.ck" >"$work/ih" 2>&1 || fail "inspect"
    grep -q "world 4 = tensor 1 x pipeline 1 x context 2 x data 2" "$work/ih" || fail "layout: $(grep world "$work/ih")"
    "$cohort" train "${tiny[@]}" --train-iters 6 --load "$work/half.ck" --save "$work/half.ck" >"$work/r1.out" 2>&1 ||
        fail "resume on one rank: $(tail -3 "$work/r1.out")"
    grep -q "successfully loaded checkpoint .* at iteration 3" "$work/r1.out" || fail "no load: $(head -5 "$work/r1.out")"
    close one6 half
    # the killed rank 3 (context rank 1, expert rank 1 of the second expert group) rebuilt from
    # rank 1 (its expert-data-parallel peer: the same context rank and experts), bitwise
    k=(--nproc-per-node 4 "${C[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall)
    # a flipped weight bit on rank 2 (context rank 0 of the second expert group) repaired from the
    # first one; a NaN every replay on rank 3 (context rank 1): the first expert group recomputes
    # the second one's micro batches, each rank its context coordinate's share, and finds it on
    # rank 1 too
    three_faults 3 1 2 "[01]" 3 3 1 "${k[@]}"
    ;;
peer_check)
    # the second expert group (ranks 2, 3) reports it; the first (ranks 0, 1) recomputes
    nan_reproduced "nan_[a-z]*" "[23]" "[01]" --nproc-per-node 4 --expert-model-parallel-size 2 \
        --inject "nan@rank=3,step=4,times=always"
    ;;
refused)
    expect() { # PATTERN ARGS...: exit 2 and the pattern in the output, nothing trained
        local pat=$1; shift
        "$cohort" train "${tiny[@]}" --train-iters 2 "$@" >"$work/r.out" 2>&1; local rc=$?
        [ $rc -eq 2 ] || fail "$*: exit $rc, expected 2: $(tail -3 "$work/r.out")"
        grep -q -- "$pat" "$work/r.out" || fail "$*: no '$pat' in: $(tail -3 "$work/r.out")"
        ! grep -q "iteration  *1/" "$work/r.out" || fail "$*: trained"
    }
    expect "--num-experts 4 is not divisible by --expert-model-parallel-size 3" --expert-model-parallel-size 3 \
        --nproc-per-node 3 --global-batch-size 6
    expect "--expert-model-parallel-size 2 needs --num-experts" --num-experts 0 --expert-model-parallel-size 2
    expect "does not divide the 1 data-parallel x 1 tensor-parallel x 1 context-parallel ranks" --expert-model-parallel-size 2
    expect "world size 6 is not a multiple of expert tensor 1 x expert 4" --expert-model-parallel-size 4 --nproc-per-node 6 \
        --global-batch-size 12
    expect "--expert-model-parallel-size 2 is not a multiple of --tensor-model-parallel-size 4" \
        --expert-model-parallel-size 2 --tensor-model-parallel-size 4 --sequence-parallel --expert-tensor-parallel-size 1 \
        --nproc-per-node 4
    # with the experts split over the tensor group an expert group is tp x ep ranks
    expect "world size 4 is not a multiple of expert tensor 2 x expert 4" --expert-model-parallel-size 4 \
        --tensor-model-parallel-size 2 --sequence-parallel --nproc-per-node 4
    # with context parallelism an expert group holds whole tensor x context groups
    expect "--expert-model-parallel-size 2 x expert tensor size 1 is not a multiple of tensor 1 x context 4" \
        --expert-model-parallel-size 2 --context-parallel-size 4 --nproc-per-node 4
    ;;
cp_thd)
    # packed sequences (THD) under cp: the per-document split's padding rows route to no expert,
    # so none is dispatched to another rank and every statistic is the unpadded batch's
    D=(--reset-attention-mask --reset-position-ids --eod-mask-loss)
    C=(--context-parallel-size 2 --cp-packed-sequences)
    run one 5 "${D[@]}"
    run c2e2 5 "${D[@]}" --nproc-per-node 2 "${C[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
    run c2d2e2 5 "${D[@]}" --nproc-per-node 4 "${C[@]}" --expert-model-parallel-size 2 \
        --moe-token-dispatcher-type allgather
    grep -q "per-document split (THD" "$work/c2e2.out" || fail "not THD: $(grep -i context "$work/c2e2.out")"
    compare 1 one c2e2 c2d2e2
    moe_losses_match one:c2e2 one:c2d2e2
    for n in c2e2 c2d2e2; do close one $n; done
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
