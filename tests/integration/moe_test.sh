#!/usr/bin/env bash
# moe_test.sh - `cohort train` with mixture-of-experts layers (--num-experts), one case per
# meson test.
#   moe_test.sh COHORT CASE
# Cases:
#   train        4 experts, top-2, every second layer MoE, a shared expert, capacity and
#                grouped products: trains (the loss falls), the log line carries Megatron's
#                "load_balancing_loss" and "z_loss" items after "lm loss", the metrics record
#                their values; a second run is bitwise the same
#   resume       a run stopped at iteration 3 and resumed ends with the uninterrupted run's
#                checkpoint bitwise (ckpt diff); `ckpt inspect` lists the router and every
#                expert under its global index
#   layouts      dp 2 and pp 2 (two stages holding MoE layers) train the one-rank job's
#                numbers within fp32 reduction tolerance (losses, gradient norms, the
#                validation loss; the final parameters and moments within 1e-5, ckpt diff)
#   collapse     a router that sends most tokens to one expert (the collapse threshold set
#                low) is reported as a training-health event: in the log, the metrics
#                (moe_router_collapses) and, under the supervisor, the run report
#   expert_bias  sigmoid routing with --moe-router-enable-expert-bias: the bias (a tensor of
#                the checkpoint, no gradient) moves by the update rate each step (against a
#                rate-0 run, every entry differs by a multiple of the rate, at most the steps
#                taken); dp 2 trains the one-rank job's numbers (the counts are summed over
#                the replicas); a resumed run ends with the uninterrupted one's checkpoint
#   tp           tensor parallelism as Megatron's --expert-tensor-parallel-size 1 (every
#                tensor rank holds every expert whole and routes its own sequence-parallel
#                token shard): tp 2 trains the one-rank job's numbers (losses, gradient norms,
#                load_balancing_loss and z_loss of every iteration, the validation loss; the
#                final parameters and moments within 1e-5, ckpt diff, each MoE tensor written
#                once): tp 2 and tp 2 x pp 2 with a shared expert and aux_loss, tp 2 x dp 2
#                with sigmoid routing, the expert bias (its counts summed over the tensor and
#                data groups) and seq_aux_loss; the tp 2
#                checkpoint of iteration 3 resumed at tp 1 and the one-rank one at tp 2 end
#                where the uninterrupted run ends; `ckpt convert` between tp 1 and tp 2
#                keeps every tensor bitwise
#   cp           context parallelism (each context rank routes its tokens of the sequences, the
#                aux losses' counts summed over the context (x tensor) group, Megatron's tp_cp
#                router): cp 2 and cp 2 x tp 2 (SP) with aux_loss and a shared expert, cp 2 x
#                dp 2 with sigmoid routing, the expert bias and seq_aux_loss train the one-rank
#                job's numbers (losses, gradient norms, load_balancing_loss and z_loss within
#                1e-6 relative; the final parameters and moments within 1e-5)
#   cp_thd       context parallelism with packed sequences (THD: each document padded to a
#                multiple of 2cp and split per document; the padding rows route to no expert
#                and count in no statistic, as Megatron's router padding mask): cp 2 with
#                aux_loss, z_loss and a shared expert (and tp 2 x cp 2 with SP, and cp 2 x
#                pp 2 with the MoE layers recomputed), with sigmoid routing, the expert bias
#                and seq_aux_loss, and with a capacity (factor 2, padded to it: no token
#                dropped) train the one-rank job's numbers (losses, gradient norms,
#                load_balancing_loss and z_loss within 1e-6 relative; the final parameters
#                and moments within 1e-5); packed SFT conversations (--sft) at cp 2 against one
#                rank (losses, norms, MoE losses); the layer's semantics (padding rows against the
#                unpadded batch, tokens dropped too): test_moe.c
#   dopt         --use-distributed-optimizer (a MoE layer's run one parameter of its layout;
#                shared expert, grouped products, sigmoid with the expert bias): dp 2 bitwise
#                the replicated run, dp 4 within 1e-5 (losses, norms, parameters, moments); a
#                sharded dp 2 checkpoint resumed sharded at dp 4 and replicated on one rank;
#                a rank killed at dp 4 rebuilt from its neighbour's copy, bitwise the clean run
#   bf16         --bf16 (the experts' and shared expert's products in bf16 as the dense layers',
#                the router's in fp32; skipped, 77, without the CPU's bf16 instructions): one
#                rank within 2e-3 relative of the fp32 run (lm loss, load_balancing_loss,
#                z_loss; gradient norms 1e-2; measured 6e-4); grouped products bitwise the products one by
#                one; --moe-router-dtype fp32 (Megatron's flag) is what it does anyway (bitwise
#                the run without it); ep 2 with either dispatcher and pp 2 within 1e-3 of the bf16 one-rank
#                run (losses, norms, MoE losses; measured 2.5e-5); twice bitwise the same
#   cp_pp        cp 2 x pp 2 (each context rank's pipeline routes its chunks) trains the
#                one-rank job's numbers as cp above
#   capacity_tpcp an expert capacity (0.5: tokens dropped) counted over each rank's tokens, as
#                Megatron's (the semantics against the one-rank layer on each rank's tokens:
#                test_moe_ep.c): tp 2 with SP (expert tensor size 1 and tp), cp 2 and cp 2 x
#                ep 2 train, drop tokens (moe_dropped_tokens) and are bitwise the same twice
#   global_aux   --moe-router-load-balancing-type global_aux_loss (Megatron's: the counts of
#                the global batch so far, summed over tensor x data x context ranks and
#                averaged over the step's micro batches; the layer against a restatement in
#                test_moe_ep.c): tp 2 (SP), cp 2 and pp 2 split the same micro batches as one
#                rank does, so they train the one-rank job's numbers (losses, norms,
#                "global_load_balancing_loss" within 1e-6 relative, parameters 1e-5); dp 2
#                (each micro batch's counts over both replicas) trains, bitwise twice
#   rerun        an injected NaN: the rerun state machine's fault (one process: the list at
#                exit; under the supervisor with ep 2: the run report) carries the round's
#                load_balancing_loss, z_loss and mtp_1 loss of the rank
#   per_token    --calculate-per-token-loss (Megatron's router pre-multiplies the aux and z
#                losses by the micro batch's tokens, so that the division by the step's
#                tokens leaves them weighted 1 / micro batches): with --eod-mask-loss (micro
#                batches of unequal loss tokens) dp 2, pp 2 and ep 2 train the one-rank job's
#                numbers (losses, norms, MoE losses; parameters and moments within 1e-5); with
#                no token masked the job without the flag's numbers
#   layer_list   Megatron's list form of --moe-layer-freq: "([1]+[0])*2" trains bitwise the
#                --moe-layer-freq 2 job; "[0,1,1,0]" puts the experts in layers 1 and 2 only
#                (ckpt inspect), its checkpoint refused by a job of another pattern (the
#                layers named), taken by --use-checkpoint-args, and converted to tp 2 and back
#                bitwise
#   refused      bad configurations exit 2 before any work: top-k above the experts,
#                biases, tensor parallelism without sequence parallelism (also with the
#                experts split over the tensor group), the experts split over the tensor
#                group with an expert size it does not divide, an expert tensor
#                size other than 1 and tp, the expert bias
#                with softmax, flex, group counts that do not divide, padding without a
#                capacity, --moe-router-dtype fp64 (expert parallelism's: moe_ep_test.sh)
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir moe

. "${COHORT_SOURCE_ROOT:?}/tests/integration/moe_tiny.sh"

run() { train_ok "$1" --train-iters "$2" "${@:3}"; } # NAME ITERS ARGS...
# params_close A B: run B's final parameters within 1e-5 of run A's, an expert's among them
params_close() {
    "$cohort" ckpt diff "$work/$1.ck" "$work/$2.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$2: diff"
    /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
assert 'layers.2.mlp.experts.3.fc2.weight' in [r['name'] for r in rows]
assert all(r['status'] in ('bitwise equal', 'differs') for r in rows), rows[:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
" || fail "$2: parameters differ from $1's: $(head -c 400 "$work/d.json")"
}
case $case_name in
train)
    more=(--moe-shared-expert-intermediate-size 16 --moe-expert-capacity-factor 1.5 --moe-grouped-gemm --lr 3e-3)
    run a 30 "${more[@]}" --tensorboard-dir "$work/tb"
    run b 30 "${more[@]}"
    grep -q ' lm loss: [0-9.E+-]* | load_balancing_loss: [0-9.E+-]* | z_loss: [0-9.E+-]* | loss scale:' "$work/a.out" ||
        fail "the log line lacks the MoE items: $(grep -m1 iteration "$work/a.out")"
    /usr/bin/python3 - "$work/a.jsonl" <<'PY' || fail "metrics: $(head -c 600 "$work/a.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"grad_norm"' in l]
assert len(rows) == 30, len(rows)
for r in rows:
    # the switch loss over its coefficient is about 1 when the router is balanced (E * sum f_i P_i)
    assert 0.9 < r["load_balancing_loss"] < 2.0 and r["z_loss"] > 0, r
    assert "moe_dropped_tokens" in r and r["moe_router_collapses"] == 0, r
first = sum(r["lm_loss"] for r in rows[:5]) / 5
last = sum(r["lm_loss"] for r in rows[-5:]) / 5
assert last < first - 0.05, (first, last)
print("ok: lm loss %.4f -> %.4f, load_balancing_loss %.4f, z_loss %.4f" % (first, last, rows[-1]["load_balancing_loss"], rows[-1]["z_loss"]))
PY
    same_losses a b "two runs differ"
    # TensorBoard: Megatron's load_balancing_loss and z_loss tags, the metrics' values
    tb_has "$work/a.jsonl" "load_balancing_loss"
    ;;
resume)
    resume_exact 6 3
    "$cohort" ckpt inspect "$work/s" >"$work/inspect.out" 2>&1 || fail "inspect: $(tail -3 "$work/inspect.out")"
    for t in layers.0.mlp.router.weight layers.0.mlp.experts.3.fc1.weight layers.2.mlp.experts.0.fc2.weight \
             layers.1.mlp.fc1.weight; do
        grep -q "$t" "$work/inspect.out" || fail "inspect lacks $t: $(grep -m5 mlp "$work/inspect.out")"
    done
    ! grep -q "layers.1.mlp.experts" "$work/inspect.out" || fail "layer 1 is dense (--moe-layer-freq 2)"
    ;;
layouts)
    run one 5 --nproc-per-node 1 --save "$work/one.ck"
    run dp2 5 --nproc-per-node 2 --save "$work/dp2.ck"
    run pp2 5 --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2.ck"
    compare 1 one dp2 pp2
    for n in dp2 pp2; do
        "$cohort" ckpt diff "$work/one.ck" "$work/$n.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$n: diff"
        /usr/bin/python3 -c "
import json, sys
rows = json.load(open('$work/d.json'))['tensors']
assert any('experts.3.fc2' in r['name'] for r in rows), [r['name'] for r in rows][:20]
assert all(r['status'] in ('bitwise equal', 'differs') for r in rows), rows[:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
" || fail "$n: parameters differ from one rank's: $(head -c 400 "$work/d.json")"
    done
    ;;
collapse)
    # top-1 of 4 experts; any expert over 30% of a layer's tokens for 2 iterations is reported
    c=(--moe-router-topk 1 --moe-router-collapse-share 0.3 --moe-router-collapse-iters 2 --moe-aux-loss-coeff 0)
    run one 6 "${c[@]}"
    grep -q "training health: router collapse in layer [02] at iteration [0-9]*: expert [0-3] got" "$work/one.out" ||
        fail "no collapse event: $(grep -i collapse "$work/one.out" | head -3)"
    grep -q '"moe_router_collapses":[1-9]' "$work/one.jsonl" || fail "metrics: $(tail -c 300 "$work/one.jsonl")"
    run sv 6 "${c[@]}" --nproc-per-node 2 --run-report "$work/sv.report.json"
    grep -q "router collapse in layer" "$work/sv.report.json" ||
        fail "the run report lacks the event: $(head -c 800 "$work/sv.report.json")"
    # the default threshold (90% for 20 iterations) stays quiet on this run
    run quiet 6 --moe-router-topk 1
    ! grep -q "router collapse" "$work/quiet.out" || fail "a collapse reported at the default threshold"
    ;;
expert_bias)
    eb=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-topk 1 --moe-aux-loss-coeff 0)
    run one 6 "${eb[@]}" --moe-router-bias-update-rate 0.01 --save "$work/one.ck" --nproc-per-node 1
    run zero 6 "${eb[@]}" --moe-router-bias-update-rate 0 --save "$work/zero.ck"
    run dp2 6 "${eb[@]}" --moe-router-bias-update-rate 0.01 --save "$work/dp2.ck" --nproc-per-node 2
    run half 6 "${eb[@]}" --moe-router-bias-update-rate 0.01 --save "$work/s" --exit-interval 3
    run rest 6 "${eb[@]}" --moe-router-bias-update-rate 0.01 --save "$work/s" --load "$work/s"
    compare 1 one dp2
    ckpt_same "$work/one.ck" "$work/s" "resumed run differs"
    "$cohort" ckpt diff "$work/zero.ck" "$work/one.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "diff"
    /usr/bin/python3 -c "
import json
rows = {r['name']: r for r in json.load(open('$work/d.json'))['tensors']}
for l in (0, 2):
    r = rows['layers.%d.mlp.router.expert_bias' % l]
    assert r['status'] == 'differs', r
    m = r['max_abs']
    assert 0.0099 < m <= 0.0601 and abs(m / 0.01 - round(m / 0.01)) < 1e-3, r
assert 'layers.1.mlp.router.expert_bias' not in rows
print('ok: the expert bias moved by', [rows['layers.%d.mlp.router.expert_bias' % l]['max_abs'] for l in (0, 2)])
" || fail "the expert bias: $(head -c 600 "$work/d.json")"
    ;;
tp)
    t2=(--nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1)
    shared=(--moe-shared-expert-intermediate-size 16 --moe-grouped-gemm)
    eb=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01
        --moe-router-load-balancing-type seq_aux_loss)
    run one 5 "${shared[@]}" --nproc-per-node 1 --save "$work/one.ck"
    run tp2 5 "${shared[@]}" "${t2[@]}" --save "$work/tp2.ck"
    run tp2pp2 5 "${shared[@]}" "${t2[@]}" --nproc-per-node 4 --pipeline-model-parallel-size 2 --save "$work/tp2pp2.ck"
    run eb1 5 "${eb[@]}" --nproc-per-node 1 --save "$work/eb1.ck"
    run eb2 5 "${eb[@]}" "${t2[@]}" --nproc-per-node 4 --save "$work/eb2.ck"
    # resharding: tp 2 -> tp 1 and tp 1 -> tp 2 from iteration 3
    run half2 5 "${shared[@]}" "${t2[@]}" --exit-interval 3 --save "$work/s2"
    run rest1 5 "${shared[@]}" --nproc-per-node 1 --load "$work/s2" --save "$work/s2"
    grep -q "checkpoint written at tensor x pipeline size 2 x 1, loaded at 1 x 1" "$work/rest1.out" ||
        fail "no reshard note: $(grep -i 'checkpoint' "$work/rest1.out" | head -3)"
    run half1 5 "${shared[@]}" --nproc-per-node 1 --exit-interval 3 --save "$work/s1"
    run rest2 5 "${shared[@]}" "${t2[@]}" --load "$work/s1" --save "$work/s1"
    compare 1 one tp2 tp2pp2
    compare 1 eb1 eb2
    compare 4 one rest1 rest2
    moe_losses_match one:tp2 one:tp2pp2 eb1:eb2 one:rest1 one:rest2
    for p in "one.ck tp2.ck" "one.ck tp2pp2.ck" "eb1.ck eb2.ck" "one.ck s2" "one.ck s1"; do
        set -- $p
        "$cohort" ckpt diff "$work/$1" "$work/$2" --json >"$work/d.json"; [ $? -le 1 ] || fail "$2: diff"
        /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
names = [r['name'] for r in rows]
for t in ('layers.0.mlp.router.weight', 'layers.2.mlp.experts.3.fc2.weight'):
    assert t in names and 'optimizer.exp_avg.' + t in names, t
assert ('$1' == 'eb1.ck') == ('layers.2.mlp.router.expert_bias' in names)
assert ('$1' == 'eb1.ck') != ('layers.0.mlp.shared_experts.fc1.weight' in names)
assert all(r['status'] in ('bitwise equal', 'differs') for r in rows), [r for r in rows if r['status'] not in ('bitwise equal', 'differs')][:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
" || fail "$2: parameters differ from $1's: $(head -c 400 "$work/d.json")"
    done
    convert_roundtrip one.ck tp2.ck
    # written once: one slice of every MoE tensor in the tp 2 checkpoint, at its global shape
    /usr/bin/python3 - "$work/tp2.ck/iter_0000005" <<'PY' || fail "the tp 2 checkpoint's MoE tensors"
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
assert m["parallel"]["tensor"] == 2, m["parallel"]
moe = [t for t in m["tensors"] if ".mlp.router." in t["name"] or ".experts." in t["name"]]
assert len(moe) >= 2 * 2 * (1 + 8 + 2), len(moe)
for t in moe:
    assert len(t["slices"]) == 1 and t["slices"][0]["shape"] == t["shape"], t
print("ok: %d MoE tensors written once" % len(moe))
PY
    ;;
dopt)
    # the distributed optimizer: a MoE layer's run (router, experts, shared expert) is one
    # parameter of its layout; the expert bias (moved by the trainer, no gradient) follows
    # into the redundant shard copies
    d=(--moe-shared-expert-intermediate-size 16 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
       --moe-grouped-gemm)
    run r2 6 "${d[@]}" --nproc-per-node 2 --save "$work/r2.ck"
    run o2 6 "${d[@]}" --nproc-per-node 2 --use-distributed-optimizer --save "$work/o2.ck"
    run o4 6 "${d[@]}" --nproc-per-node 4 --use-distributed-optimizer --save "$work/o4.ck"
    grep -q "distributed optimizer over 2 data-parallel ranks" "$work/o2.out" || fail "o2: $(head -5 "$work/o2.out")"
    compare 1 r2 o2 o4
    ckpt_same "$work/r2.ck" "$work/o2.ck" "dp 2: the distributed optimizer differs"
    close() { # REF RUN
        "$cohort" ckpt diff "$work/$1" "$work/$2" --json >"$work/d.json"; [ $? -le 1 ] || fail "$2: diff"
        /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
assert any(r['name'] == 'optimizer.exp_avg_sq.layers.2.mlp.experts.3.fc2.weight' for r in rows)
bad = [r for r in rows if r['status'] not in ('bitwise equal', 'differs') or r.get('max_abs', 0) > 1e-5]
assert not bad, bad[:3]
" || fail "$2 differs from $1: $(head -c 400 "$work/d.json")"
    }
    close r2.ck o4.ck
    # saved with its shards at dp 2, resumed sharded at dp 4 and replicated on one rank
    run h 6 "${d[@]}" --nproc-per-node 2 --use-distributed-optimizer --exit-interval 3 --save "$work/h4"
    cp -r "$work/h4" "$work/h1"
    run h4r 6 "${d[@]}" --nproc-per-node 4 --use-distributed-optimizer --load "$work/h4" --save "$work/h4"
    run h1r 6 "${d[@]}" --load "$work/h1" --save "$work/h1"
    close r2.ck h4
    close r2.ck h1
    # a killed rank's shard is rebuilt from its neighbour's copy, the expert bias with it
    run k 6 "${d[@]}" --nproc-per-node 4 --use-distributed-optimizer --save "$work/k.ck" --inject "kill@rank=2,step=4"
    grep -q "in-process restart into generation 2" "$work/k.out" || fail "no restart: $(grep supervisor "$work/k.out")"
    ckpt_same "$work/o4.ck" "$work/k.ck" "killed"
    ;;
bf16)
    grep -qwE "avx512_bf16|amx_bf16" /proc/cpuinfo && [ -z "${ONEDNN_MAX_CPU_ISA:-}" ] || exit 77
    sh=(--moe-shared-expert-intermediate-size 16)
    run f32 5 "${sh[@]}"
    run one 5 "${sh[@]}" --bf16 --save "$work/one.ck"
    run oneb 5 "${sh[@]}" --bf16 --moe-router-dtype fp32 --save "$work/oneb.ck"
    run grp 5 "${sh[@]}" --bf16 --moe-grouped-gemm --save "$work/grp.ck"
    run ep2a 5 "${sh[@]}" --bf16 --nproc-per-node 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
    run ep2g 5 "${sh[@]}" --bf16 --nproc-per-node 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
    run pp2 5 "${sh[@]}" --bf16 --nproc-per-node 2 --pipeline-model-parallel-size 2
    grep -q "cpu: oneDNN .*, bf16, " "$work/one.out" || fail "bf16 not in use: $(grep -m1 'cohort: model' "$work/one.out")"
    ckpt_same "$work/one.ck" "$work/oneb.ck"
    ckpt_same "$work/one.ck" "$work/grp.ck" "grouped bf16 products differ from the products one by one"
    /usr/bin/python3 - "$work" <<'PY' || fail "bf16 MoE out of tolerance"
import json, sys
w = sys.argv[1]
def load(n):
    return {r["iteration"]: r for r in map(json.loads, open(f"{w}/{n}.jsonl")) if "grad_norm" in r}
keys = ("lm_loss", "load_balancing_loss", "z_loss")
def close(ref, run, tol, ntol):
    a, b, worst = load(ref), load(run), 0
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5], (run, sorted(b))
    for i in a:
        for k in keys + ("grad_norm",):
            rel = abs(a[i][k] - b[i][k]) / abs(a[i][k])
            worst = max(worst, rel)
            assert rel < (ntol if k == "grad_norm" else tol), (run, i, k, a[i][k], b[i][k])
    return worst
f = load("f32"), load("one")
assert any(f[0][i][k] != f[1][i][k] for i in f[0] for k in keys), "bf16 gave fp32's numbers: not bf16 products"
print("ok: bf16 within %.1e of fp32" % close("f32", "one", 2e-3, 1e-2))
print("ok: layouts within %.1e of bf16 one rank" % max(close("one", n, 1e-3, 1e-3) for n in ("ep2a", "ep2g", "pp2")))
PY
    ;;
cp_pp)
    run one 5 --save "$work/one.ck"
    run cp2pp2 5 --nproc-per-node 4 --context-parallel-size 2 --pipeline-model-parallel-size 2 --save "$work/cp2pp2.ck"
    compare 1 one cp2pp2
    moe_losses_match one:cp2pp2
    params_close one cp2pp2
    ;;
capacity_tpcp)
    cap=(--moe-expert-capacity-factor 0.5)
    run t1 4 "${cap[@]}" --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel \
        --expert-tensor-parallel-size 1 --save "$work/t1.ck"
    run t1b 4 "${cap[@]}" --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel \
        --expert-tensor-parallel-size 1 --save "$work/t1b.ck"
    run t2 4 "${cap[@]}" --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel --save "$work/t2.ck"
    run t2b 4 "${cap[@]}" --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel --save "$work/t2b.ck"
    run c2 4 "${cap[@]}" --nproc-per-node 2 --context-parallel-size 2 --save "$work/c2.ck"
    run c2b 4 "${cap[@]}" --nproc-per-node 2 --context-parallel-size 2 --save "$work/c2b.ck"
    run ce 4 "${cap[@]}" --nproc-per-node 2 --context-parallel-size 2 --expert-model-parallel-size 2
    for p in t1 t2 c2; do
        ckpt_same "$work/$p.ck" "$work/${p}b.ck"
    done
    for p in t1 t2 c2 ce; do
        grep '"grad_norm"' "$work/$p.jsonl" | grep -q '"moe_dropped_tokens":[1-9]' || fail "$p: no token dropped"
    done
    ;;
global_aux)
    g=(--moe-router-load-balancing-type global_aux_loss)
    run one 5 "${g[@]}" --save "$work/one.ck"
    run tp2 5 "${g[@]}" --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel \
        --expert-tensor-parallel-size 1 --save "$work/tp2.ck"
    run cp2 5 "${g[@]}" --nproc-per-node 2 --context-parallel-size 2 --save "$work/cp2.ck"
    run pp2 5 "${g[@]}" --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2.ck"
    run dp2 5 "${g[@]}" --nproc-per-node 2 --save "$work/dp2.ck"
    run dp2b 5 "${g[@]}" --nproc-per-node 2 --save "$work/dp2b.ck"
    compare 1 one tp2 cp2 pp2
    ckpt_same "$work/dp2.ck" "$work/dp2b.ck"
    grep -q ' lm loss: [0-9.E+-]* | global_load_balancing_loss: [0-9.E+-]* |' "$work/one.out" ||
        fail "no global_load_balancing_loss item: $(grep -m1 iteration "$work/one.out")"
    /usr/bin/python3 - "$work" <<'PY' || fail "global_load_balancing_loss differs"
import json, sys
w = sys.argv[1]
def load(n):
    return {r["iteration"]: r["global_load_balancing_loss"] for r in map(json.loads, open(f"{w}/{n}.jsonl"))
            if "grad_norm" in r}
a = load("one")
assert sorted(a) == [1, 2, 3, 4, 5] and all(v > 0 for v in a.values()), a
for n in ("tp2", "cp2", "pp2"):
    b = load(n)
    for i in a:
        assert abs(a[i] - b[i]) <= 1e-6 * a[i], (n, i, a[i], b[i])
d = load("dp2")
assert all(abs(d[i] - a[i]) > 1e-9 * a[i] for i in a), ("dp 2 gave one rank's global loss", d, a)
print("ok: global_load_balancing_loss as one rank's at tp 2, cp 2, pp 2")
PY
    for n in tp2 cp2 pp2; do
        "$cohort" ckpt diff "$work/one.ck" "$work/$n.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$n: diff"
        /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
assert rows and all(r['status'] in ('bitwise equal', 'differs') for r in rows), rows[:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
" || fail "$n: parameters differ from one rank's: $(head -c 400 "$work/d.json")"
    done
    ;;
rerun)
    # the rerun state machine validates the language-model loss and reports the MoE and MTP
    # losses of the round that raised a fault: in one process (the fault list at exit) and
    # under the supervisor (the run report), here with expert parallelism and an MTP depth
    m=(--position-embedding-type rope --mtp-num-layers 1)
    run one 5 "${m[@]}" --inject "nan@rank=0,step=3"
    grep -Eq "iteration 3, nan_loss, transient_error: .*\[its MoE/MTP losses: load_balancing_loss [0-9.]+, z_loss [0-9.]+, mtp_1 loss [0-9.]+\]" \
        "$work/one.out" || fail "one process: $(grep -A2 'rerun state machine handled' "$work/one.out")"
    run sv 5 "${m[@]}" --nproc-per-node 2 --expert-model-parallel-size 2 --inject "nan@rank=1,step=3" \
        --run-report "$work/sv.report.json"
    /usr/bin/python3 - "$work/sv.report.json" <<'PY' || fail "run report: $(head -c 900 "$work/sv.report.json")"
import json, re, sys
faults = json.load(open(sys.argv[1]))["faults"]
f = [x for x in faults if x.get("kind") == "nan_loss"]
assert f and f[0]["rank"] == 1 and f[0]["diagnosis"] == "transient_error", faults
m = re.search(r"\[its MoE/MTP losses: load_balancing_loss ([0-9.]+), z_loss ([0-9.]+), mtp_1 loss ([0-9.]+)\]", f[0]["text"])
assert m and 0.9 < float(m.group(1)) < 2 and float(m.group(2)) > 0 and 5 < float(m.group(3)) < 7, f[0]["text"]
PY
    ;;
cp)
    shared=(--moe-shared-expert-intermediate-size 16 --moe-grouped-gemm)
    eb=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01
        --moe-router-load-balancing-type seq_aux_loss)
    run one 5 "${shared[@]}" --save "$work/one.ck"
    run cp2 5 "${shared[@]}" --nproc-per-node 2 --context-parallel-size 2 --save "$work/cp2.ck"
    run tpcp 5 "${shared[@]}" --nproc-per-node 4 --context-parallel-size 2 --tensor-model-parallel-size 2 \
        --sequence-parallel --expert-tensor-parallel-size 1 --save "$work/tpcp.ck"
    run eb1 5 "${eb[@]}" --save "$work/eb1.ck"
    run eb2 5 "${eb[@]}" --nproc-per-node 4 --context-parallel-size 2 --save "$work/eb2.ck"
    compare 1 one cp2 tpcp
    compare 1 eb1 eb2
    moe_losses_match one:cp2 one:tpcp eb1:eb2
    for p in "one.ck cp2.ck" "one.ck tpcp.ck" "eb1.ck eb2.ck"; do
        set -- $p
        "$cohort" ckpt diff "$work/$1" "$work/$2" --json >"$work/d.json"; [ $? -le 1 ] || fail "$2: diff"
        /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
names = [r['name'] for r in rows]
assert 'layers.2.mlp.experts.3.fc2.weight' in names and 'optimizer.exp_avg.layers.0.mlp.router.weight' in names
assert ('$1' == 'eb1.ck') == ('layers.2.mlp.router.expert_bias' in names)
assert all(r['status'] in ('bitwise equal', 'differs') for r in rows), rows[:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
" || fail "$2: parameters differ from $1's: $(head -c 400 "$work/d.json")"
    done
    ;;
cp_thd)
    docs=(--reset-attention-mask --reset-position-ids --eod-mask-loss)
    thd=(--nproc-per-node 2 --context-parallel-size 2 --cp-packed-sequences)
    shared=(--moe-shared-expert-intermediate-size 16 --moe-grouped-gemm)
    eb=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01
        --moe-router-load-balancing-type seq_aux_loss)
    cap=(--moe-expert-capacity-factor 2 --moe-pad-expert-input-to-capacity)
    for v in one:shared eb1:eb cap1:cap; do
        n=${v%%:*}; declare -n f=${v#*:}
        run "$n" 5 "${docs[@]}" "${f[@]}" --save "$work/$n.ck"
        run "${n}thd" 5 "${docs[@]}" "${f[@]}" "${thd[@]}" --save "$work/${n}thd.ck"
        unset -n f
    done
    # tp 2 (SP) x cp 2: each tensor rank's shard of the context rank's padded rows
    run tpthd 5 "${docs[@]}" "${shared[@]}" "${thd[@]}" --nproc-per-node 4 --tensor-model-parallel-size 2 \
        --sequence-parallel --expert-tensor-parallel-size 1 --save "$work/tpthd.ck"
    # cp 2 x pp 2 with the MoE layers recomputed (selective): a micro batch's recomputation in
    # its backward, other micro batches in flight, masks its own padding rows
    run ppthd 5 "${docs[@]}" "${shared[@]}" "${thd[@]}" --nproc-per-node 4 --pipeline-model-parallel-size 2 \
        --recompute-granularity selective --recompute-modules moe --save "$work/ppthd.ck"
    grep -q "context parallelism 2: per-document split (THD" "$work/onethd.out" ||
        fail "not THD: $(grep -i context "$work/onethd.out")"
    compare 1 one onethd tpthd ppthd
    compare 1 eb1 eb1thd
    compare 1 cap1 cap1thd
    moe_losses_match one:onethd one:tpthd one:ppthd eb1:eb1thd cap1:cap1thd
    grep -q '"moe_dropped_tokens":0' "$work/cap1thd.jsonl" && ! grep -q '"moe_dropped_tokens":[1-9]' "$work/cap1thd.jsonl" ||
        fail "cap1thd: tokens dropped (or not reported)"
    for p in one:onethd one:tpthd one:ppthd eb1:eb1thd cap1:cap1thd; do
        a=${p%%:*} b=${p#*:}
        params_close "$a" "$b"
    done
    # packed SFT conversations (--sft: always THD under cp)
    printf '{"messages": [{"role": "user", "content": "hi %s"}, {"role": "assistant", "content": "hello there, %s"}]}\n' \
        $(for i in $(seq 60); do echo "$i $(printf 'x%.0s' $(seq $((i % 7))))"; done) >"$work/chat.jsonl"
    tiny=(--tokenizer-type ByteLevelTokenizer --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 64
          --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --attention-dropout 0 --log-interval 1
          --eval-interval 1000 --eval-iters 1 --threads 1 --data-cache-path "$work/cache" --split 90,10,0 --sft
          --data-path "$work/chat.jsonl" --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48
          --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --disable-bias-linear)
    run sft1 5
    run sft2 5 --nproc-per-node 2 --context-parallel-size 2
    grep -q "per-document split (THD" "$work/sft2.out" || fail "SFT not THD: $(grep -i context "$work/sft2.out")"
    compare 1 sft1 sft2
    moe_losses_match sft1:sft2
    ;;
per_token)
    p=(--calculate-per-token-loss --eod-mask-loss)
    run one 5 "${p[@]}" --save "$work/one.ck"
    run dp2 5 "${p[@]}" --nproc-per-node 2 --save "$work/dp2.ck"
    run pp2 5 "${p[@]}" --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2.ck"
    run ep2 5 "${p[@]}" --nproc-per-node 2 --expert-model-parallel-size 2 --save "$work/ep2.ck"
    compare 1 one dp2 pp2 ep2
    moe_losses_match one:dp2 one:pp2 one:ep2
    run flag 5 --calculate-per-token-loss --save "$work/flag.ck"
    run noflag 5 --save "$work/noflag.ck"
    compare 1 noflag flag
    for n in one:dp2 one:pp2 one:ep2 noflag:flag; do
        "$cohort" ckpt diff "$work/${n%%:*}.ck" "$work/${n#*:}.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$n: diff"
        /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
assert any('router' in r['name'] for r in rows), [r['name'] for r in rows][:20]
bad = [r for r in rows if r['status'] not in ('bitwise equal', 'differs') or r.get('max_abs', 0) > 1e-5]
assert not bad, bad[:3]
" || fail "$n: the parameters differ: $(head -c 400 "$work/d.json")"
    done
    ;;
layer_list)
    run f2 3 --moe-layer-freq 2 --save "$work/f2"
    run l2 3 --moe-layer-freq "([1]+[0])*2" --save "$work/l2"
    ckpt_same "$work/f2" "$work/l2" "the list ([1]+[0])*2 against --moe-layer-freq 2"
    run l3 3 --moe-layer-freq "[0,1,1,0]" --save "$work/l3"
    "$cohort" ckpt inspect "$work/l3" >"$work/inspect.out" 2>&1 || fail "inspect: $(tail -3 "$work/inspect.out")"
    for l in 1 2; do
        grep -q "layers.$l.mlp.experts.3.fc1.weight" "$work/inspect.out" || fail "layer $l has no experts"
    done
    for l in 0 3; do
        ! grep -q "layers.$l.mlp.experts" "$work/inspect.out" || fail "layer $l has experts"
        grep -q "layers.$l.mlp.fc1.weight" "$work/inspect.out" || fail "layer $l is not dense"
    done
    "$cohort" train "${tiny[@]}" --train-iters 4 --moe-layer-freq 2 --load "$work/l3" >"$work/x.out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -q "checkpoint has MoE layers 0110 (1: MoE), --moe-layer-freq gives 1010" "$work/x.out" ||
        fail "another pattern loaded: exit $rc: $(tail -3 "$work/x.out")"
    run args 4 --moe-layer-freq 2 --load "$work/l3" --use-checkpoint-args
    grep -q -- "--moe-layer-freq \[0, 1, 1, 0\] from the checkpoint" "$work/args.out" &&
        grep -q "successfully loaded checkpoint .* at iteration 3" "$work/args.out" ||
        fail "--use-checkpoint-args: $(grep -i "checkpoint" "$work/args.out" | head -5)"
    "$cohort" ckpt convert "$work/l3" --to cohort --tensor-model-parallel-size 2 --output "$work/c2" >"$work/c.out" 2>&1 &&
        "$cohort" ckpt convert "$work/c2" --to cohort --tensor-model-parallel-size 1 --output "$work/c1" >>"$work/c.out" 2>&1 ||
        fail "convert: $(tail -3 "$work/c.out")"
    ckpt_same "$work/l3" "$work/c1" "converted to tp 2 and back"
    ;;
refused)
    expect() { # PATTERN ARGS...: exit 2 and the pattern on stderr, nothing trained
        local pat=$1; shift
        "$cohort" train "${tiny[@]}" --train-iters 2 "$@" >"$work/r.out" 2>&1; local rc=$?
        [ $rc -eq 2 ] || fail "$*: exit $rc, expected 2: $(tail -3 "$work/r.out")"
        grep -q -- "$pat" "$work/r.out" || fail "$*: no '$pat' in: $(tail -3 "$work/r.out")"
        ! grep -q "iteration  *1/" "$work/r.out" || fail "$*: trained"
    }
    expect "--moe-router-topk 5 must be between 1 and --num-experts 4" --moe-router-topk 5
    # biases (tiny without --disable-bias-linear)
    with_bias=(); for a in "${tiny[@]}"; do [ "$a" = --disable-bias-linear ] || with_bias+=("$a"); done
    "$cohort" train "${with_bias[@]}" --train-iters 2 >"$work/r.out" 2>&1; rc=$?
    [ $rc -eq 2 ] && grep -q -- "add --disable-bias-linear" "$work/r.out" || fail "biases: exit $rc: $(tail -3 "$work/r.out")"
    tp2=(--tensor-model-parallel-size 2 --nproc-per-node 2)
    expect "--num-experts with --tensor-model-parallel-size 2 needs --sequence-parallel" "${tp2[@]}" \
        --expert-tensor-parallel-size 1
    expect "performance may degrade if MoE and tensor parallelism" "${tp2[@]}" --expert-tensor-parallel-size 1
    # the experts split over the tensor group (the default expert tensor size, or given) need it too
    expect "--num-experts with --tensor-model-parallel-size 2 needs --sequence-parallel" "${tp2[@]}"
    expect "--num-experts with --tensor-model-parallel-size 2 needs --sequence-parallel" "${tp2[@]}" \
        --expert-tensor-parallel-size 2
    expect "the experts' hidden size 47 is not divisible by it" "${tp2[@]}" --sequence-parallel \
        --moe-ffn-hidden-size 47
    expect "--expert-tensor-parallel-size 3 is not supported yet" "${tp2[@]}" --sequence-parallel \
        --expert-tensor-parallel-size 3
    expect "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid" --moe-router-enable-expert-bias
    expect "flex (DeepEP) is not supported" --moe-token-dispatcher-type flex
    expect "--moe-router-num-groups 3 must divide" --moe-router-num-groups 3 --moe-router-group-topk 1
    expect "needs --moe-expert-capacity-factor" --moe-pad-expert-input-to-capacity
    # sinkhorn routing (checked against numpy in tests/unit/model/test_moe.c): Megatron's
    # assertion, the flags its routing would ignore, and a run that trains and evaluates
    expect "Sinkhorn routing does not support aux loss" --moe-router-load-balancing-type sinkhorn
    expect "sinkhorn does not use --moe-router-pre-softmax" --moe-router-load-balancing-type sinkhorn \
        --moe-aux-loss-coeff 0 --moe-router-pre-softmax
    "$cohort" train "${tiny[@]}" --train-iters 2 --eval-interval 1 --moe-router-load-balancing-type sinkhorn \
        --moe-aux-loss-coeff 0 >"$work/s.out" 2>&1 || fail "sinkhorn: $(tail -3 "$work/s.out")"
    grep -q "iteration  *2/" "$work/s.out" && grep -q "validation loss at iteration 1" "$work/s.out" ||
        fail "sinkhorn: $(tail -3 "$work/s.out")"
    expect "--moe-router-dtype fp64 is not supported yet" --moe-router-dtype fp64
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
