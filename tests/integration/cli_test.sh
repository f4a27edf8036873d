#!/usr/bin/env bash
# cli_test.sh - integration tests of the `cohort` binary, one case per meson test.
#   cli_test.sh COHORT PYTHON CASE
cohort=$1; py=$2; case_name=$3
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir it

tiny_model --global-batch-size 4 --threads 2

case $case_name in
unknown_flag)
    "$cohort" train --hiden-size 64 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 2 ] || fail "exit $rc, want 2"
    grep -q "did you mean '--hidden-size'" "$work/err" || fail "no suggestion: $(cat "$work/err")"
    ;;
inconsistent)
    "$cohort" train "${tiny[@]}" --hidden-size 30 --global-batch-size 3 --train-iters 5 --seq-length 64 \
        --max-position-embeddings 40 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 2 ] || fail "exit $rc, want 2"
    grep -q "not divisible by --num-attention-heads" "$work/err" || fail "heads: $(cat "$work/err")"
    grep -q "not a multiple of --micro-batch-size" "$work/err" || fail "batch: $(cat "$work/err")"
    grep -q "longer than --max-position-embeddings" "$work/err" || fail "positions: $(cat "$work/err")"
    [ ! -s "$work/out" ] || fail "work started before validation: $(cat "$work/out")"
    ;;
refused|ranges)
    # expect_refused MESSAGE FLAGS...: exit 2 with MESSAGE on stderr, before any work (nothing
    # printed, no checkpoint directory, no metrics file, no corpus)
    expect_refused() {
        local msg=$1; shift
        rm -rf "$work/s" "$work/w" "$work/m.jsonl"
        "$cohort" train "$@" --save "$work/s" --metrics-file "$work/m.jsonl" >"$work/out" 2>"$work/err"; rc=$?
        [ $rc -eq 2 ] || fail "$*: exit $rc, want 2: $(tail -3 "$work/err")"
        grep -qF -- "$msg" "$work/err" || fail "$*: no '$msg' in: $(cat "$work/err")"
        [ ! -s "$work/out" ] || fail "$*: work started: $(head -3 "$work/out")"
        [ ! -e "$work/s" ] && [ ! -e "$work/m.jsonl" ] && [ ! -e "$work/w" ] || fail "$*: something was written"
    }
    if [ "$case_name" = refused ]; then
        # accepted by Megatron, not implemented here: refused, and --help says so
        expect_refused "--rotary-percent 0.5 is not supported yet" \
            "${tiny[@]}" --train-iters 2 --position-embedding-type rope --rotary-percent 0.5 --nproc-per-node 2
        # tensor, pipeline and context parallelism run; what they do not have yet is refused
        expect_refused "--cp-comm-type a2a is not supported yet" \
            "${tiny[@]}" --train-iters 2 --pipeline-model-parallel-size 2 --context-parallel-size 2 --nproc-per-node 4 \
            --attention-dropout 0 --cp-comm-type a2a
        expect_refused "is not a multiple of tensor x context x pipeline = 2" "${tiny[@]}" --train-iters 2 \
            --pipeline-model-parallel-size 2
        expect_refused "--seq-length 18 is not divisible by 2 * --context-parallel-size = 4" "${tiny[@]}" --train-iters 2 \
            --context-parallel-size 2 --nproc-per-node 2 --seq-length 18 --attention-dropout 0
        expect_refused "with --context-parallel-size 2 is not supported yet (the ring attention has no dropout)" \
            "${tiny[@]}" --train-iters 2 --context-parallel-size 2 --nproc-per-node 2 --attention-dropout 0.1
        expect_refused "--fp16 and --bf16 together: give one of them" "${tiny[@]}" --train-iters 2 --fp16 --bf16
        expect_refused "--expert-model-parallel-size 2 needs --num-experts" "${tiny[@]}" --train-iters 2 \
            --expert-model-parallel-size 2
        # (a dense model at tp 1: the expert tensor size must be 1 with experts or the tensor size)
        expect_refused "--expert-tensor-parallel-size 2 is not supported yet (only 1 with --num-experts, or the \
tensor-parallel size 1)" "${tiny[@]}" --train-iters 2 --expert-tensor-parallel-size 2
        # mixture of experts trains (tests/integration/moe_test.sh); its experts have no biases
        expect_refused "add --disable-bias-linear" "${tiny[@]}" --train-iters 2 --num-experts 8
        expect_refused "--mtp-num-layers 9 is out of range" "${tiny[@]}" --train-iters 2 --mtp-num-layers 9
        # pipeline placement flags without a pipeline, as Megatron refuses them
        expect_refused "virtual pipeline" "${tiny[@]}" --train-iters 2 --virtual-pipeline-model-parallel-size 2
        expect_refused "virtual pipeline" "${tiny[@]}" --train-iters 2 --num-layers-per-virtual-pipeline-stage 1
        # the rank order flag is Megatron's and means nothing with one rank per grid dimension
        "$cohort" train "${tiny[@]}" --train-iters 1 --use-tp-pp-dp-mapping >"$work/out" 2>&1 ||
            fail "--use-tp-pp-dp-mapping: $(tail -3 "$work/out")"
        expect_refused "--inprocess-active-world-size 1 is not supported yet" "${tiny[@]}" --train-iters 2 \
            --nproc-per-node 2 --inprocess-active-world-size 1
        expect_refused "--run-report is not supported yet in a single-process job" "${tiny[@]}" --train-iters 2 \
            --run-report "$work/r.json"
        # any number of micro batches per rank is validated (batch_test.sh many_micro_batches)
        "$cohort" train "${tiny[@]}" --train-iters 1 --micro-batch-size 1 --global-batch-size 65 \
            >"$work/out" 2>&1 || fail "65 micro batches under validation: $(tail -3 "$work/out")"
        "$cohort" train --help >"$work/help" || fail "--help exit $?"
        grep -E -- "--overlap-param-gather( |$).*own transports" "$work/help" >/dev/null ||
            fail "--help does not say where --overlap-param-gather runs"
        grep -E -- "--fp16( |$).*loss scaling" "$work/help" >/dev/null || fail "--help does not describe --fp16"
        expect_refused "--vocab-file/--merge-file" --mock-data --num-layers 1 --hidden-size 32 --num-attention-heads 4 \
            --seq-length 16 --micro-batch-size 1 --train-iters 1 --lr 1e-3 --vocab-file "$work/none.json"
    else
        # zero, negative and absurd sizes, counts and ranks: one configuration error each.
        # The embedded default job (no data flags) divided by the world size before validating.
        expect_refused "--nproc-per-node 0 is out of range" --nproc-per-node 0 --workdir "$work/w"
        expect_refused "--nnodes 0 is out of range" --nnodes 0 --workdir "$work/w"
        expect_refused "--nproc-per-node 0 is out of range" "${tiny[@]}" --train-iters 2 --nproc-per-node 0
        expect_refused "--nnodes -1 is out of range" "${tiny[@]}" --train-iters 2 --nnodes -1
        expect_refused "--node-rank 2 is out of range" "${tiny[@]}" --train-iters 2 --nnodes 2 --node-rank 2
        # every parallel size, with its range (pipeline 0 and negatives ran as one stage before)
        for pp in 0 -1 -2 1025; do
            expect_refused "--pipeline-model-parallel-size $pp is out of range (1 to 1024)" "${tiny[@]}" --train-iters 2 \
                --pipeline-model-parallel-size $pp
        done
        expect_refused "--pipeline-model-parallel-size -1 is out of range (1 to 1024)" "${tiny[@]}" --train-iters 2 \
            --pipeline-model-parallel-size -1 --nproc-per-node 2
        expect_refused "--tensor-model-parallel-size -2 is out of range (1 to 64)" "${tiny[@]}" --train-iters 2 \
            --tensor-model-parallel-size -2
        expect_refused "--context-parallel-size 0 is out of range (1 to 1024)" "${tiny[@]}" --train-iters 2 \
            --context-parallel-size 0
        expect_refused "--expert-model-parallel-size -1 is out of range (1 to 1024)" "${tiny[@]}" --train-iters 2 \
            --expert-model-parallel-size -1
        expect_refused "--expert-tensor-parallel-size -1 is out of range (0 to 64)" "${tiny[@]}" --train-iters 2 \
            --expert-tensor-parallel-size -1
        expect_refused "--virtual-pipeline-model-parallel-size -2 is out of range (0 to 1024)" "${tiny[@]}" \
            --train-iters 2 --virtual-pipeline-model-parallel-size -2
        expect_refused "--global-batch-size -8 is out of range" "${tiny[@]}" --train-iters 2 --global-batch-size -8
        expect_refused "--global-batch-size 0 is out of range" "${tiny[@]}" --train-iters 2 --global-batch-size 0
        expect_refused "--global-batch-size -8 is out of range" --global-batch-size -8 --workdir "$work/w"
        expect_refused "--seq-length 100000000 is out of range (1 to 1048576)" "${tiny[@]}" --train-iters 2 \
            --seq-length 100000000 --max-position-embeddings 100000000
        expect_refused "tokens per micro batch: more than 16777216" "${tiny[@]}" --train-iters 2 \
            --micro-batch-size 4096 --seq-length 8192 --max-position-embeddings 8192 --global-batch-size 4096
        expect_refused "refused as absurd" "${tiny[@]}" --train-iters 2 --num-layers 1024 --hidden-size 131072 \
            --num-attention-heads 128
        expect_refused "--micro-batch-size 0 is out of range" "${tiny[@]}" --train-iters 2 --micro-batch-size 0
        expect_refused "--num-layers -3 is out of range" "${tiny[@]}" --train-iters 2 --num-layers -3
        expect_refused "--hidden-size 200000 is out of range" "${tiny[@]}" --train-iters 2 --hidden-size 200000
        expect_refused "--num-query-groups 8 is out of range" "${tiny[@]}" --train-iters 2 --group-query-attention \
            --num-query-groups 8
        expect_refused "--kv-channels 0 is out of range" "${tiny[@]}" --train-iters 2 --kv-channels 0
        expect_refused "--ffn-hidden-size -1 is out of range" "${tiny[@]}" --train-iters 2 --ffn-hidden-size -1
        expect_refused "--vocab-size 0 is out of range" "${tiny[@]}" --train-iters 2 --vocab-size 0
        expect_refused "--train-iters -5 is out of range" "${tiny[@]}" --train-iters -5
        expect_refused "the run asks for" "${tiny[@]}" --train-iters 1000000000000
        expect_refused "--threads 0 is out of range" "${tiny[@]}" --train-iters 2 --threads 0
        expect_refused "--log-interval 0 is out of range" "${tiny[@]}" --train-iters 2 --log-interval 0
        expect_refused "--eval-iters -1 is out of range" "${tiny[@]}" --train-iters 2 --eval-iters -1
        expect_refused "--save-interval 0 is out of range" "${tiny[@]}" --train-iters 2 --save-interval 0
        expect_refused "--most-recent-k 0 is out of range" "${tiny[@]}" --train-iters 2 --most-recent-k 0
        expect_refused "--most-recent-k -2 is out of range" "${tiny[@]}" --train-iters 2 --most-recent-k -2
        expect_refused "--exit-interval 0 is out of range" "${tiny[@]}" --train-iters 2 --exit-interval 0
        expect_refused "--exit-duration-in-mins -1 is out of range" "${tiny[@]}" --train-iters 2 --exit-duration-in-mins -1
        expect_refused "--lr-decay-iters -4 is out of range" "${tiny[@]}" --train-iters 2 --lr-decay-iters -4
        expect_refused "--lr-warmup-iters -1 is out of range" "${tiny[@]}" --train-iters 2 --lr-warmup-iters -1
        expect_refused "--sample-lines -1 is out of range" "${tiny[@]}" --train-iters 2 --sample-lines -1
        expect_refused "--master-port must be in 1..65535" "${tiny[@]}" --train-iters 2 --master-port 0
        expect_refused "the workers' data ports" "${tiny[@]}" --train-iters 2 --master-port 65535 --nproc-per-node 2
        expect_refused "--error-injection-rate -1 is out of range" "${tiny[@]}" --train-iters 2 --error-injection-rate -1
        expect_refused "--quarantine-after -1 is out of range" "${tiny[@]}" --train-iters 2 --quarantine-after -1
        expect_refused "--straggler-evict-after -1 is out of range" "${tiny[@]}" --train-iters 2 --straggler-evict-after -1
        expect_refused "--inject-seed -3 is out of range" "${tiny[@]}" --train-iters 2 --inject-seed -3
        expect_refused "in-process restart timeouts" "${tiny[@]}" --train-iters 2 --inprocess-soft-timeout 0
        expect_refused "--rendezvous-timeout 1e+07 is out of range" "${tiny[@]}" --train-iters 2 --rendezvous-timeout 1e7
        expect_refused "--timeline-iterations '5:2' is not N" "${tiny[@]}" --train-iters 2 --timeline-dir "$work/tl" \
            --timeline-iterations 5:2
        expect_refused "--timeline-iterations needs --timeline-dir" "${tiny[@]}" --train-iters 2 --timeline-iterations 2
        expect_refused "--timeline-iterations 3:4 records nothing: the run ends at iteration 2" "${tiny[@]}" \
            --train-iters 2 --timeline-dir "$work/tl" --timeline-iterations 3:4
        [ ! -e "$work/tl" ] || fail "--timeline-dir created before the configuration was accepted"
        # several problems: every one reported, one per line
        expect_refused "--nnodes 0 is out of range" "${tiny[@]}" --train-iters 2 --nnodes 0 --micro-batch-size 0 \
            --overlap-param-gather
        grep -qF -- "--micro-batch-size 0 is out of range" "$work/err" || fail "only the first problem reported"
        grep -qF -- "--overlap-param-gather only supported with distributed optimizer" "$work/err" || fail "refusal not reported"
    fi
    ;;
help)
    "$cohort" train --help >"$work/out" || fail "--help exit $?"
    for f in --num-layers --hidden-size --position-embedding-type --normalization --swiglu --lr-decay-style \
             --data-path --split --eval-interval --exit-duration-in-mins --bf16 --seed --timeline-dir \
             --timeline-iterations; do
        grep -q -- "$f" "$work/out" || fail "--help lacks $f"
    done
    grep -q "init-method-std.*default: 0.02" "$work/out" || fail "--help lacks the init-method-std default"
    ;;
deterministic)
    for r in 1 2; do
        "$cohort" train "${tiny[@]}" --train-iters 6 --hidden-dropout 0.1 --attention-dropout 0.1 \
            --metrics-file "$work/m$r.jsonl" >"$work/out$r" 2>&1 || fail "run $r: $(cat "$work/out$r")"
    done
    sed -E 's/"(elapsed_ms_per_iteration|tokens_per_second|tflops_per_rank|validation_ms_per_iteration|weight_checksum_ms_per_iteration|weight_hash_ms_per_iteration|rss_bytes|max_rss_bytes|time)":[^,}]*//g' "$work/m1.jsonl" >"$work/a"
    sed -E 's/"(elapsed_ms_per_iteration|tokens_per_second|tflops_per_rank|validation_ms_per_iteration|weight_checksum_ms_per_iteration|weight_hash_ms_per_iteration|rss_bytes|max_rss_bytes|time)":[^,}]*//g' "$work/m2.jsonl" >"$work/b"
    [ "$(grep -c lm_loss "$work/a")" -ge 6 ] || fail "metrics file has too few lines"
    cmp -s "$work/a" "$work/b" || fail "two runs with the same seed differ: $(diff "$work/a" "$work/b" | head)"
    # a different seed changes the run
    "$cohort" train "${tiny[@]}" --train-iters 6 --seed 99 --metrics-file "$work/m3.jsonl" >/dev/null 2>&1
    sed -E 's/"(elapsed_ms_per_iteration|tokens_per_second|tflops_per_rank|validation_ms_per_iteration|weight_checksum_ms_per_iteration|weight_hash_ms_per_iteration|rss_bytes|max_rss_bytes|time)":[^,}]*//g' "$work/m3.jsonl" >"$work/c"
    ! cmp -s "$work/a" "$work/c" || fail "--seed has no effect"
    ;;
topology)
    # Megatron's groups for every layout of many shapes, against the numpy restatement of
    # its RankGenerator (tests/data/megatron_groups_ref.py; also the refusals)
    /usr/bin/python3 "$src/tests/data/megatron_groups_ref.py" "$COHORT_CPU_EXE" || fail "groups differ from Megatron's"
    # the text form: tp2 x pp2 on 8 ranks, Megatron's documented example
    "$COHORT_CPU_EXE" topology --world-size 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        >"$work/t" || fail "topology exit $?"
    grep -q "world 8 = tp 2 x cp 1 x dp 2 x pp 2 (order tp-cp-ep-dp-pp" "$work/t" || fail "$(head -3 "$work/t")"
    grep -Eq "^  tp +4 of 2: \[0, 1\] \[2, 3\] \[4, 5\] \[6, 7\]$" "$work/t" || fail "tp: $(grep '^  tp ' "$work/t")"
    grep -Eq "^  dp +4 of 2: \[0, 2\] \[1, 3\] \[4, 6\] \[5, 7\]$" "$work/t" || fail "dp: $(grep '^  dp ' "$work/t")"
    grep -Eq "^  pp +4 of 2: \[0, 4\] \[1, 5\] \[2, 6\] \[3, 7\]$" "$work/t" || fail "pp: $(grep '^  pp ' "$work/t")"
    grep -Eq "^  embedding +4 of 2: \[0, 4\]" "$work/t" || fail "embedding: $(grep embedding "$work/t")"
    grep -Eq "^ +5 +1 +0 +0 +1 \|" "$work/t" || fail "rank 5's coordinates: $(grep -E '^ +5 ' "$work/t")"
    # the world from --nproc-per-node x --nnodes
    "$COHORT_CPU_EXE" topology --nproc-per-node 4 --nnodes 2 --context-parallel-size 2 --json >"$work/j" ||
        fail "topology --json exit $?"
    /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['world']==8 and d['cp']==2 and d['dp']==4, d" \
        "$work/j" || fail "$(head -c 300 "$work/j")"
    "$COHORT_CPU_EXE" topology --help | grep -q "tp-cp-ep-dp-pp" || fail "topology --help"
    "$COHORT_CPU_EXE" --help | grep -q "topology" || fail "cohort --help lacks topology"
    ;;
schedule)
    # pipeline schedules and layer placement for many shapes, flags and layouts, against the
    # Python restatement of Megatron's schedules.py and layer placement (also the refusals)
    /usr/bin/python3 "$src/tests/data/pp_schedule_ref.py" "$COHORT_CPU_EXE" || fail "schedules differ from Megatron's"
    # the text form: the example in Megatron's comments (PP 2, group 3, 5 micro batches, 2 chunks)
    "$COHORT_CPU_EXE" schedule --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 \
        --microbatch-group-size-per-virtual-pipeline-stage 3 --num-microbatches 5 --num-layers 8 >"$work/t" ||
        fail "schedule exit $?"
    grep -q "^cohort schedule: interleaved 1F1B over 2 pipeline ranks x 2 model chunks, 5 micro batches in groups of 3$" \
        "$work/t" || fail "$(head -2 "$work/t")"
    grep -q "^bubble (p-1)/(v\*m) = 1/(2\*5) = 0.1000$" "$work/t" || fail "bubble: $(grep bubble "$work/t")"
    grep -q "^  rank 0 (warm-up 5): F0.0 F1.0 F2.0 F0.1 F1.1 | F2.1 B0.1 F3.0 B1.1 F4.0 B2.1 F3.1 B0.0 F4.1 B1.0 | B2.0 B3.1 B4.1 B3.0 B4.0$" \
        "$work/t" || fail "rank 0: $(grep 'rank 0' "$work/t")"
    grep -Eq "^ +3 +1 +1  6-7 +2  final norm, output layer, loss$" "$work/t" || fail "stage 3: $(grep -E '^ +3 ' "$work/t")"
    # M from the batch sizes; a refusal is one line, exit 2
    "$COHORT_CPU_EXE" schedule --pipeline-model-parallel-size 4 --global-batch-size 32 --micro-batch-size 2 \
        --data-parallel-size 2 | grep -q "1F1B over 4 pipeline ranks, 8 micro batches" || fail "M from the batch sizes"
    "$COHORT_CPU_EXE" schedule --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 \
        --num-microbatches 6 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 2 ] && [ ! -s "$work/out" ] && [ "$(wc -l <"$work/err")" -eq 1 ] || fail "exit $rc: $(cat "$work/err")"
    grep -q "remainder must be 0 or at least the pipeline size 4" "$work/err" || fail "$(cat "$work/err")"
    "$COHORT_CPU_EXE" schedule --help | grep -q -- "--pipeline-model-parallel-layout" || fail "schedule --help"
    "$COHORT_CPU_EXE" --help | grep -q "schedule" || fail "cohort --help lacks schedule"
    ;;
log_format)
    "$cohort" train "${tiny[@]}" --train-iters 2 --metrics-file "$work/m.jsonl" >"$work/out" 2>&1 || fail "$(cat "$work/out")"
    re='^ \[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\] iteration +2/ +2 \| consumed samples: +8 \| elapsed time per iteration \(ms\): [0-9]+\.[0-9] \| throughput per GPU \(TFLOP/s/GPU\): [0-9]+\.[0-9] \| learning rate: [0-9]\.[0-9]{6}E[-+][0-9]{2} \| global batch size: +4 \| lm loss: [0-9]\.[0-9]{6}E[-+][0-9]{2} \| loss scale: 1\.0 \| grad norm: [0-9]+\.[0-9]{3} \| number of skipped iterations: +0 \| number of nan iterations: +0 \|$'
    grep -Eq "$re" "$work/out" || fail "log line not in Megatron's format: $(grep iteration "$work/out")"
    "$py" -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$work/m.jsonl" || fail "metrics not JSON"
    grep -q "validation loss at iteration 2 on test set | lm loss value: " "$work/out" || fail "no final test evaluation"
    ;;
exit_interval)
    "$cohort" train "${tiny[@]}" --train-iters 50 --exit-interval 3 >"$work/out" 2>&1; rc=$?
    [ $rc -eq 0 ] || fail "exit $rc"
    grep -q "exit-interval reached at iteration 3" "$work/out" || fail "$(tail -3 "$work/out")"
    ! grep -q "iteration        4/" "$work/out" || fail "ran past the exit interval"
    ;;
sigterm)
    train_bg out 2 --train-iters 100000
    pid=$job
    kill -TERM $pid
    wait $pid; rc=$?
    [ $rc -eq 0 ] || fail "exit $rc after SIGTERM"
    grep -q "stopped by signal after iteration" "$work/out" || fail "no clean stop: $(tail -3 "$work/out")"
    ;;
bad_data)
    printf 'not an index' >"$work/bad.idx"; : >"$work/bad.bin"
    "$cohort" train "${tiny[@]:1}" --data-path "$work/bad" --train-iters 2 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 1 ] || fail "exit $rc, want 1: $(cat "$work/err")"
    grep -q "$work/bad.idx" "$work/err" || fail "error does not name the file: $(cat "$work/err")"
    ;;
data_order)
    # Megatron's whole mock set (numpy's reference builds all 100,000 documents)
    COHORT_TEST_MOCK_SEQUENCES= "$cohort" data order --mock-data --tokenizer-type NullTokenizer --vocab-size 500 --seq-length 64 \
        --global-batch-size 8 --train-iters 50 --split 98,1,1 --seed 7 --count 20 --data-cache-path "$work/c" \
        >"$work/out" 2>&1 || fail "$(cat "$work/out")"
    PYTHONPATH="$src/tests/data" "$py" - "$work/out" <<'PY' || fail "order differs from numpy's"
import sys, numpy, gpt_order_ref as R
got = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if not l.startswith("#")]
r = R.build(R.mock_lengths(), "98,1,1", 0, 64, 7, 50 * 8)
want = [(i, int(r["sample_index"][r["shuffle_index"][i]][0]), int(r["sample_index"][r["shuffle_index"][i]][1])) for i in range(20)]
if got != want:
    print("got ", got[:5], "\nwant", want[:5]); sys.exit(1)
PY
    ;;
embedded)
    "$cohort" train --train-iters 12 --log-interval 4 --eval-interval 6 --workdir "$work/w" --sample-lines 2 \
        >"$work/out" 2>&1 || fail "$(cat "$work/out")"
    grep -q "running the embedded default job" "$work/out" || fail "no banner"
    [ -s "$work/w/common-licenses.bin" ] && [ -s "$work/w/common-licenses.idx" ] || fail "corpus not written"
    [ "$(grep -c '^  > ' "$work/out")" -eq 2 ] || fail "no samples: $(tail -5 "$work/out")"
    ;;
embedded_default)
    # the README's job exactly as shipped (only its work directory moved): it learns beyond
    # letter frequencies and samples text; its time is printed, not asserted (docs/benchmarks.md)
    t0=$(date +%s)
    "$cohort" train --workdir "$work/w" >"$work/out" 2>&1 || fail "$(tail -5 "$work/out")"
    echo "embedded default job: $(( $(date +%s) - t0 )) s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    grep -q "the model learned structure beyond letter frequencies" "$work/out" || fail "did not learn: $(grep 'validation loss' "$work/out" | tail -2)"
    [ "$(grep -c '^  > ' "$work/out")" -eq 4 ] || fail "no samples: $(tail -5 "$work/out")"
    ;;
bf16_choice)
    # --bf16 trains only where the CPU has bf16 matrix instructions (AVX512-BF16, AMX); held to
    # AVX2 or plain AVX-512 (as on an EPYC Zen 3 or a Skylake-X), it is refused before any work
    for isa in AVX2 AVX512_CORE; do
        ONEDNN_MAX_CPU_ISA=$isa "$cohort" train "${tiny[@]}" --train-iters 2 --bf16 --device cpu >"$work/out" 2>"$work/err"; rc=$?
        [ $rc -eq 2 ] || fail "$isa: exit $rc, want 2: $(cat "$work/err")"
        grep -q -- "--bf16: this CPU .* has no bf16 matrix instructions" "$work/err" || fail "$isa: $(cat "$work/err")"
        grep -q -- "train without --bf16" "$work/err" || fail "$isa: no advice: $(cat "$work/err")"
        [ ! -s "$work/out" ] || fail "$isa: work started: $(head -3 "$work/out")"
        # fp32 still trains there
        ONEDNN_MAX_CPU_ISA=$isa "$cohort" train "${tiny[@]}" --train-iters 2 --device cpu >"$work/out" 2>&1 \
            || fail "$isa fp32: $(tail -3 "$work/out")"
    done
    if grep -qwE "avx512_bf16|amx_bf16" /proc/cpuinfo && [ -z "${ONEDNN_MAX_CPU_ISA:-}" ]; then
        "$cohort" train "${tiny[@]}" --train-iters 2 --bf16 --device cpu >"$work/out" 2>&1 || fail "native bf16: $(tail -3 "$work/out")"
        grep -q "cpu: oneDNN .*, bf16, " "$work/out" || fail "native bf16 not in use: $(grep -m1 'cohort: model' "$work/out")"
    else
        "$cohort" train "${tiny[@]}" --train-iters 2 --bf16 --device cpu >"$work/out" 2>"$work/err"; rc=$?
        [ $rc -eq 2 ] || fail "no bf16 instructions here, yet --bf16 exit $rc"
    fi
    ;;
sigint_early|interrupt_loop)
    # Ctrl-C at any moment of a job, from the first millisecond its handlers exist (they are
    # installed before the shared libraries' constructors run) to the middle of training:
    # exit 0 and "stopped by signal"; before the first step nothing is trained and nothing
    # saved; after it, the final checkpoint is the last logged iteration and verifies.
    # (No heap corruption: glibc's malloc checks abort with 134 if there is any.)
    set -m # a foreground-like job: SIGINT not inherited as ignored
    # interrupt WHEN N: one job; WHEN "handlers": as soon as /proc shows SIGINT caught, else
    # seconds after the start; N names the run
    job=("${tiny[@]}")
    interrupt() {
        local when=$1 n=$2
        rm -rf "$work/ck"
        # the binary itself, not the --device cpu wrapper: a signal in the wrapper shell before its
        # exec would end it with 130
        "$COHORT_CPU_EXE" train --device cpu "${job[@]}" --train-iters 100000 --save "$work/ck" >"$work/out" 2>&1 &
        local pid=$!
        # every interrupt comes once cohort took SIGINT over (blocked for its signal thread,
        # or caught): before that the process is still the forked shell (which catches
        # SIGINT itself under job control) or the dynamic loader (the first ~2 ms after
        # exec), which no program controls
        wait_handles_sigint $pid "$COHORT_CPU_EXE"
        [ "$when" = handlers ] || sleep "$when"
        kill -INT $pid
        wait $pid; local rc=$?
        [ $rc -eq 0 ] || fail "run $n, SIGINT at $when: exit $rc, want 0: $(grep -v '  iteration ' "$work/out" | tail -5)"
        local line
        line=$(grep -o "stopped by signal.*" "$work/out") || fail "run $n, SIGINT at $when: no clean stop: $(tail -3 "$work/out")"
        local last
        last=$(grep -o "iteration *[0-9]*/" "$work/out" | tail -1 | grep -o "[0-9]*")
        if [ -z "$last" ]; then
            # stopped before the first step: nothing trained, nothing saved
            [ ! -e "$work/ck/latest_checkpointed_iteration.txt" ] || fail "run $n: a checkpoint without training"
            echo "  run $n, SIGINT at $when: $line"
            return
        fi
        [[ "$line" == "stopped by signal after iteration $last" ]] || fail "run $n, SIGINT at $when: '$line', last logged $last"
        "$cohort" ckpt verify "$work/ck" >"$work/verify" 2>&1 || fail "run $n: checkpoint: $(tail -3 "$work/verify")"
        [ "$(cat "$work/ck/latest_checkpointed_iteration.txt")" = "$last" ] || fail "run $n: latest checkpoint is not $last"
        echo "  run $n, SIGINT at $when: $line"
    }
    if [ "$case_name" = sigint_early ]; then
        interrupt handlers 1
        # honoured before any step: in setup, or (when setup was quicker than the signal's
        # delivery) at the stop vote before the first step
        grep -qE "stopped by signal \(Interrupt\) during setup: nothing trained|stopped by signal after iteration 0 \(before this run's first step" \
            "$work/out" || fail "not stopped before the first step: $(tail -3 "$work/out")"
        if grep -q "during setup: nothing trained" "$work/out"; then
            ! grep -q "cohort: model" "$work/out" || fail "setup went on after the signal"
        fi
        for t in 0.02 0.05 0.1 0.2; do interrupt $t "at $t"; done
    else
        # 20 interrupts at random moments: 10 of the embedded job's model (its oneDNN sgemm
        # kernels are the ones whose signal frames corrupted the heap, 1 run in 6 to 10
        # before the fix) in its first 3 s, 10 of the tiny job in its first 1.5 s (setup,
        # first steps, training)
        t_start=$SECONDS
        job=(--workdir "$work/w" --device cpu --log-interval 1 --sample-lines 0)
        for n in $(seq 10); do ms=$((300 + RANDOM % 2700)); interrupt "$((ms / 1000)).$(printf %03d $((ms % 1000)))" "$n (embedded)"; done
        job=("${tiny[@]}")
        for n in $(seq 11 20); do ms=$((RANDOM % 1500)); interrupt "$((ms / 1000)).$(printf %03d $((ms % 1000)))" $n; done
        echo "  20 interrupts in $((SECONDS - t_start)) s"
    fi
    ;;
inject_checked)
    # `cohort inject` against a running 2-rank job: --pid takes a live job's supervisor pid
    # only (abc and 0 injected into whatever ran), specs are capped as --inject's, a key
    # twice and steps outside the job's remaining iterations are refused naming the range,
    # and the run report counts the faults that fired, not the specs received
    # (rank 0 slowed to at most 10 iterations a second, so that a step 30 ahead is still ahead
    # when the request arrives)
    # (and 59 --inject specs that never fire: with the live ones the job nears its cap of 64)
    later=(); for k in $(seq 59); do later+=(--inject "nan@rank=1,step=$((99000 + k))"); done
    "$cohort" train "${tiny[@]}" --nproc-per-node 2 --threads 1 --train-iters 100000 --metrics-file "$work/m.jsonl" \
        --run-report "$work/report.json" --inject "slow@rank=0,step=1,ms=100,times=always" "${later[@]}" \
        >"$work/out" 2>"$work/err" &
    job=$!
    for _ in $(seq 600); do
        n=$(grep -c grad_norm "$work/m.jsonl" 2>/dev/null); [ "${n:-0}" -ge 2 ] && break; sleep 0.1
    done
    [ "${n:-0}" -ge 2 ] || { kill $job; fail "the job did not start: $(tail -3 "$work/err")"; }
    inj() { # want-exit want-message args...
        local want=$1 msg=$2; shift 2
        "$cohort" inject "$@" >"$work/i" 2>&1; local rc=$?
        [ $rc -eq "$want" ] && grep -qF -- "$msg" "$work/i" || { kill $job; fail "inject $*: exit $rc, want $want: $(cat "$work/i")"; }
    }
    inj 2 "--pid needs a positive whole number (the pid of a running job's supervisor), got 'abc'" \
        --pid abc "nan@rank=0,step=90000"
    inj 2 "got '0'" --pid 0 "nan@rank=0,step=90000"
    inj 2 "got '-5'" --pid -5 "nan@rank=0,step=90000"
    inj 2 "no running cohort job with supervisor pid $$" --pid $$ "nan@rank=0,step=90000"
    many=(); for k in $(seq 65); do many+=("nan@rank=0,step=$((90000 + k))"); done
    inj 2 "65 fault specs: at most 64 per call" --pid $job "${many[@]}"
    inj 2 "'step' is given twice" --pid $job "nan@rank=0,step=90000,step=90001"
    inj 2 "step '0' is not an iteration number" --pid $job "nan@rank=0,step=0"
    inj 1 "..100000 (the iterations the job has still to run" --pid $job "nan@rank=0,step=200000"
    inj 1 "rank '2' is not in 0..1" --pid $job "nan@rank=2,step=90000"
    inj 1 "step 1 is too soon" --pid $job "nan@rank=0,step=1"
    # two that fire (30 iterations ahead of the job as its status says; again if it was faster)
    for _ in 1 2 3 4 5; do
        at=$("$cohort" status --json $job | "$py" -c 'import json,sys; d = json.load(sys.stdin)
print(max([d["iteration"], d["reported_iteration"]] + [r["iteration"] for r in d["ranks"]]) + 30)')
        "$cohort" inject --pid $job "nan@rank=1,step=$at" "spike@rank=0,step=$((at + 1))" >"$work/i" 2>&1 && break
        grep -q "too soon" "$work/i" || break
    done
    grep -q "ok: spike@rank=0,step=$((at + 1))" "$work/i" || { kill $job; fail "not accepted: $(cat "$work/i")"; }
    inj 0 "ok: nan@rank=0,step=90000" --pid $job "nan@rank=0,step=90000"
    # the job's cap counts --inject's specs and every call's: the 65th is refused
    extra=0
    for k in 1 2 3 4 5 6; do
        "$cohort" inject --pid $job "nan@rank=0,step=$((91000 + k))" >"$work/i" 2>&1 || break
        extra=$((extra + 1))
    done
    grep -q "the job has 64 injections already" "$work/i" || { kill $job; fail "no cap on a job's injections: $(cat "$work/i")"; }
    for _ in $(seq 600); do
        grep -q "inject: nan on rank 1" "$work/err" && grep -q "inject: spike on rank 0" "$work/err" && break; sleep 0.1
    done
    kill -TERM $job
    wait $job; rc=$?
    [ $rc -eq 0 ] || fail "job exit $rc: $(tail -3 "$work/err")"
    grep -q "injections: $((63 + extra)) asked for (60 by --inject, $((3 + extra)) by cohort inject), 3 reported fired" \
        "$work/err" || fail "the injections line: $(grep "injections:" "$work/err")"
    "$py" - "$work/report.json" "$extra" <<'PY' || fail "run report: $(cat "$work/report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
inj = [f for f in r["faults"] if f["kind"] == "injected"]
assert len(inj) == 3 and all("(--inject " in f["text"] for f in inj), r["faults"]  # slow, nan, spike: once each
i = r["injections"]
assert i["requested"] == 63 + int(sys.argv[2]) and i["fired"] == 3, i
unfired = [x["spec"] for x in i["list"] if not x["fired"]]
assert "nan@rank=0,step=90000" in unfired and len(unfired) == i["requested"] - 3, i
assert all(s == "nan@rank=0,step=90000" or "step=99" in s or "step=910" in s for s in unfired), unfired
PY
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok $case_name"
