/* test_config.c - flag parsing, "did you mean", validation, and the LR schedules. */
#include "common/config.h"
#include "common/error.h"
#include "optim/lr.h"
#include "tests/test.h"
#include "train/config_check.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(co_config *c, const char *line, char *err, size_t n) {
    char buf[2048];
    char *argv[128];
    int argc = 0;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *t = strtok(buf, " "); t; t = strtok(NULL, " ")) argv[argc++] = t;
    co_config_defaults(c);
    int rc = co_config_parse(c, argc, argv);
    if (rc) snprintf(err, n, "%s", co_err_detail());
    return rc;
}

/* Every check in order (train/config_check.h), the problems into err. */
static int check(co_config *c, int dp, char *err, size_t n) {
    co_problems P;
    int rc = trainer_config_check(c, dp, &P);
    size_t k = P.len < n ? P.len : n - 1;
    memcpy(err, P.text, k);
    err[k] = '\0';
    return rc;
}

static const char *base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                          "--micro-batch-size 2 --train-iters 10 --lr 1e-3 ";

static int check_line(const char *extra, char *err, size_t n) {
    co_config c;
    char line[2048];
    snprintf(line, sizeof line, "%s%s", base, extra);
    int rc = parse(&c, line, err, n);
    if (!rc) rc = check(&c, 1, err, n);
    co_config_free(&c);
    return rc;
}

static void test_defaults_are_megatrons(void) {
    co_config c;
    co_config_defaults(&c);
    CHECK(c.init_method_std == 0.02);
    CHECK(c.make_vocab_size_divisible_by == 128);
    CHECK(c.adam_beta1 == 0.9 && c.adam_beta2 == 0.999 && c.adam_eps == 1e-8);
    CHECK(c.weight_decay == 0.01 && c.clip_grad == 1.0);
    CHECK(c.seed == 1234);
    CHECK(!strcmp(c.split, "969, 30, 1"));
    CHECK(!strcmp(c.lr_decay_style, "linear"));
    CHECK(!strcmp(c.tokenizer_type, "GPT2BPETokenizer"));
    CHECK(c.log_interval == 100 && c.eval_interval == 1000 && c.eval_iters == 100);
    CHECK(c.hidden_dropout == 0.1 && c.attention_dropout == 0.1);
    CHECK(c.check_for_nan_in_loss_and_grad);
    co_config_free(&c);
}

static void test_parse_forms(void) {
    co_config c;
    char err[512];
    REQUIRE(parse(&c, "--hidden-size=128 --lr 3e-4 --swiglu --no-check-for-nan-in-loss-and-grad "
                      "--data-path 0.5 A --split=98,1,1 --micro_batch_size 3",
                  err, sizeof err) == 0);
    CHECK(c.hidden_size == 128);
    CHECK(fabs(c.lr - 3e-4) < 1e-12);
    CHECK(c.swiglu);
    CHECK(!c.check_for_nan_in_loss_and_grad);
    CHECK(c.n_data_path == 2 && !strcmp(c.data_path[1], "A"));
    CHECK(!strcmp(c.split, "98,1,1"));
    CHECK(c.micro_batch_size == 3);
    CHECK(co_config_was_set(&c, "hidden-size") && !co_config_was_set(&c, "num-layers"));
    co_config_free(&c);
}

/* --data-path words: a path with a space is one path unless the word is a weighted blend. */
static void test_data_path_words(void) {
    co_config c;
    char *one[] = {"--data-path", "/data/my corpus/a_text_document"};
    co_config_defaults(&c);
    REQUIRE(co_config_parse(&c, 2, one) == 0);
    CHECK(c.n_data_path == 1 && !strcmp(c.data_path[0], "/data/my corpus/a_text_document"));
    co_config_free(&c);
    char *blend_word[] = {"--data-path", "0.3 A 0.7 B"};
    co_config_defaults(&c);
    REQUIRE(co_config_parse(&c, 2, blend_word) == 0);
    CHECK(c.n_data_path == 4 && !strcmp(c.data_path[0], "0.3") && !strcmp(c.data_path[3], "B"));
    co_config_free(&c);
    char *blend_words[] = {"--data-path", "0.3", "/data/my corpus/a", "0.7", "B", "--lr", "1"};
    co_config_defaults(&c);
    REQUIRE(co_config_parse(&c, 7, blend_words) == 0);
    CHECK(c.n_data_path == 4 && !strcmp(c.data_path[1], "/data/my corpus/a") && !strcmp(c.data_path[2], "0.7"));
    co_config_free(&c);
    char *split[] = {"--train-data-path", "my dir/t", "--valid-data-path", "1 v"};
    co_config_defaults(&c);
    REQUIRE(co_config_parse(&c, 4, split) == 0);
    CHECK(c.n_train_data_path == 1 && !strcmp(c.train_data_path[0], "my dir/t"));
    CHECK(c.n_valid_data_path == 2 && !strcmp(c.valid_data_path[1], "v"));
    co_config_free(&c);
    /* other list flags still split at spaces */
    char *inj[] = {"--inject", "nan@rank=0,step=2 kill@rank=1,step=3"};
    co_config_defaults(&c);
    REQUIRE(co_config_parse(&c, 2, inj) == 0);
    CHECK(c.n_inject == 2);
    co_config_free(&c);
}

static void test_unknown_flag_suggests(void) {
    co_config c;
    char err[512];
    CHECK(parse(&c, "--hiden-size 12", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "did you mean '--hidden-size'"), "%s", err);
    co_config_free(&c);
    CHECK(parse(&c, "--num-layer 12", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "'--num-layers'"), "%s", err);
    co_config_free(&c);
    CHECK(parse(&c, "--lr", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "needs a value"), "%s", err);
    co_config_free(&c);
    CHECK(parse(&c, "--lr abc", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "expects a number"), "%s", err);
    co_config_free(&c);
    CHECK(parse(&c, "--normalization BatchNorm", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "LayerNorm|RMSNorm"), "%s", err);
    co_config_free(&c);
}

static void test_validation(void) {
    char err[2048];
    CHECK(check_line("", err, sizeof err) == 0);
    CHECK(check_line("--hidden-size 66", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "not divisible by --num-attention-heads"), "%s", err);
    CHECK(check_line("--global-batch-size 5", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "not a multiple of --micro-batch-size"), "%s", err);
    CHECK(check_line("--max-position-embeddings 16", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "longer than --max-position-embeddings"), "%s", err);
    CHECK(check_line("--max-position-embeddings 16 --position-embedding-type rope", err, sizeof err) == 0);
    CHECK(check_line("--split 0,0,0", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--split"), "%s", err);
    CHECK(check_line("--split 1,2,3,4", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--split 98,-1,1", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--group-query-attention --num-query-groups 3", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--num-query-groups"), "%s", err);
    CHECK(check_line("--train-samples 20", err, sizeof err) == CO_EINVAL); /* both given */
    /* --fp16 and its loss scale: accepted; one precision; Megatron's asserts on the scales */
    CHECK(check_line("--fp16", err, sizeof err) == 0);
    CHECK(check_line("--fp16 --loss-scale 4096 --initial-loss-scale 65536 --min-loss-scale 2 --loss-scale-window 10 "
                     "--hysteresis 1", err, sizeof err) == 0);
    CHECK(check_line("--fp16 --bf16", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--fp16 and --bf16 together"), "%s", err);
    CHECK(check_line("--fp16 --min-loss-scale 8 --initial-loss-scale 4", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--min-loss-scale 8 must be positive and at most --initial-loss-scale 4"), "%s", err);
    CHECK(check_line("--fp16 --loss-scale 0", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--fp16 --hysteresis 0", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--fp16 --loss-scale-window 0", err, sizeof err) == CO_EINVAL);
    /* tensor parallelism: what is built runs, what is not is refused */
    CHECK(check_line("--tensor-model-parallel-size 2", err, sizeof err) == 0);
    CHECK(check_line("--tensor-model-parallel-size 2 --sequence-parallel", err, sizeof err) == 0);
    CHECK(check_line("--tensor-model-parallel-size 2 --save ck --load ck", err, sizeof err) == 0);
    CHECK(check_line("--tensor-model-parallel-size 2 --device cuda", err, sizeof err) == 0);
    /* on cuda what the CPU backend runs: the distributed optimizer, MTP, context and expert parallelism, the
     * experts split over the tensor group */
    CHECK(check_line("--use-distributed-optimizer --device cuda", err, sizeof err) == 0);
    CHECK(check_line("--use-distributed-optimizer --tensor-model-parallel-size 2 --device cuda", err, sizeof err) == 0);
    CHECK(check_line("--mtp-num-layers 1 --device cuda", err, sizeof err) == 0);
    CHECK(check_line("--overlap-grad-reduce --device cuda", err, sizeof err) == 0);
    CHECK(check_line("--context-parallel-size 2 --attention-dropout 0 --device cuda", err, sizeof err) == 0);
    CHECK_MSG(check_line("--num-experts 4 --disable-bias-linear --expert-model-parallel-size 2 --device cuda", err,
                         sizeof err) == 0, "%s", err);
    CHECK_MSG(check_line("--num-experts 4 --disable-bias-linear --tensor-model-parallel-size 2 --sequence-parallel "
                         "--device cuda", err, sizeof err) == 0, "%s", err);
    CHECK(check_line("--tensor-model-parallel-size 3", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3"), "%s", err);
    CHECK(check_line("--tensor-model-parallel-size 4 --sequence-parallel --seq-length 30 --max-position-embeddings 32",
                     err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--seq-length 30 is not divisible by --tensor-model-parallel-size 4"), "%s", err);
    CHECK(check_line("--tensor-model-parallel-size 65", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--tensor-model-parallel-size 65 is out of range (1 to 64)"), "%s", err);
    CHECK(check_line("--lr-warmup-iters 5 --lr-warmup-fraction 0.1", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--tokenizer-type NullTokenizer", err, sizeof err) == CO_EINVAL);
    /* accepted by Megatron but not implemented: refused, not ignored */
    CHECK(check_line("--use-distributed-optimizer --overlap-grad-reduce", err, sizeof err) == 0);
    /* the overlap runs with tensor, pipeline, context and expert parallelism (the gradient
     * group's and the expert-data-parallel group's own transports) */
    CHECK(check_line("--overlap-grad-reduce --tensor-model-parallel-size 2", err, sizeof err) == 0);
    CHECK(check_line("--overlap-grad-reduce --pipeline-model-parallel-size 2", err, sizeof err) == 0);
    check_line("--overlap-grad-reduce --num-experts 2 --expert-model-parallel-size 2", err, sizeof err);
    CHECK_MSG(!strstr(err, "overlap"), "%s", err); /* (one rank: refused for its world alone) */
    /* --overlap-param-gather: Megatron's two requirements; with any layout (the gradient
     * group's and the expert-data-parallel group's own transports) */
    CHECK(check_line("--use-distributed-optimizer --overlap-param-gather", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "Must use --overlap-param-gather with --overlap-grad-reduce"), "%s", err);
    CHECK(check_line("--overlap-grad-reduce --overlap-param-gather", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--overlap-param-gather only supported with distributed optimizer"), "%s", err);
    CHECK(check_line("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather", err, sizeof err) == 0);
    CHECK(check_line("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
                     "--tensor-model-parallel-size 2", err, sizeof err) == 0);
    CHECK(check_line("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
                     "--pipeline-model-parallel-size 2", err, sizeof err) == 0);
    CHECK(check_line("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
                     "--context-parallel-size 2 --attention-dropout 0", err, sizeof err) == 0);
    check_line("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --num-experts 2 "
               "--expert-model-parallel-size 2", err, sizeof err);
    CHECK_MSG(!strstr(err, "overlap"), "%s", err);
    CHECK(check_line("--use-distributed-optimizer --tensor-model-parallel-size 2", err, sizeof err) == 0);
    CHECK(check_line("--use-distributed-optimizer --ddp-bucket-size 1000", err, sizeof err) == 0);
    CHECK(check_line("--use-distributed-optimizer --no-dist-opt-redundancy", err, sizeof err) == 0);
    CHECK(check_line("--sequence-parallel", err, sizeof err) == 0); /* off at tp 1, as Megatron */
    CHECK(check_line("--run-report r.json", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--run-report r.json --nproc-per-node 2", err, sizeof err) == 0);
    CHECK(check_line("--metrics-port 9400", err, sizeof err) == 0); /* a single process serves it too */
    CHECK(check_line("--metrics-port 70000", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--metrics-port 70000 is out of range (0 to 65535)"), "%s", err);
    CHECK(check_line("--nnodes 2 --inprocess-active-world-size 1", err, sizeof err) == CO_EINVAL);
    /* spare nodes: the active world in whole nodes */
    CHECK(check_line("--nnodes 3 --nproc-per-node 2 --inprocess-active-world-size 3 --inprocess-granularity node", err,
                     sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--inprocess-granularity node: --inprocess-active-world-size 3 is not a multiple of "
                          "--nproc-per-node 2 (the warm spares are whole nodes): give a multiple such as 4"), "%s", err);
    CHECK(check_line("--nnodes 3 --nproc-per-node 2 --inprocess-active-world-size 4 --inprocess-granularity node", err,
                     sizeof err) == 0);
    CHECK(check_line("--nnodes 3 --nproc-per-node 2 --inprocess-active-world-size 3", err, sizeof err) == 0);
    CHECK(check_line("--inprocess-granularity gpu", err, sizeof err) != 0);
    /* zero, negative, absurd: each refused with the range in the message */
    CHECK(check_line("--nproc-per-node 0", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--nproc-per-node 0 is out of range (1 to 65536)"), "%s", err);
    CHECK(check_line("--nnodes 0", err, sizeof err) == CO_EINVAL);
    /* every parallel size: zero and negatives were taken as one before */
    static const struct { const char *flag, *want; } sizes[] = {
        {"--pipeline-model-parallel-size 0", "--pipeline-model-parallel-size 0 is out of range (1 to 1024)"},
        {"--pipeline-model-parallel-size -2", "--pipeline-model-parallel-size -2 is out of range (1 to 1024)"},
        {"--pipeline-model-parallel-size 1025", "--pipeline-model-parallel-size 1025 is out of range (1 to 1024)"},
        {"--tensor-model-parallel-size -2", "--tensor-model-parallel-size -2 is out of range (1 to 64)"},
        {"--context-parallel-size 0", "--context-parallel-size 0 is out of range (1 to 1024)"},
        {"--context-parallel-size 2000000000", "--context-parallel-size 2000000000 is out of range (1 to 1024)"},
        {"--expert-model-parallel-size -1", "--expert-model-parallel-size -1 is out of range (1 to 1024)"},
        {"--expert-tensor-parallel-size -1", "--expert-tensor-parallel-size -1 is out of range (0 to 64)"},
        {"--virtual-pipeline-model-parallel-size -1", "--virtual-pipeline-model-parallel-size -1 is out of range (0 to 1024)"},
        {"--num-virtual-stages-per-pipeline-rank -3", "--num-virtual-stages-per-pipeline-rank -3 is out of range (0 to 1024)"},
        {"--nnodes -1", "--nnodes -1 is out of range (1 to 65536)"},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        CHECK_MSG(check_line(sizes[i].flag, err, sizeof err) == CO_EINVAL, "%s accepted", sizes[i].flag);
        CHECK_MSG(strstr(err, sizes[i].want), "%s: %s", sizes[i].flag, err);
    }
    {
        /* the data-parallel size the launcher derived, in range too */
        co_config c;
        char e[1024];
        REQUIRE(parse(&c, base, e, sizeof e) == 0);
        CHECK(check(&c, -3, e, sizeof e) == CO_EINVAL);
        CHECK_MSG(strstr(e, "data-parallel size -3 (the world over tensor x context x pipeline) is out of range"),
                  "%s", e);
        co_config_free(&c);
    }
    CHECK(check_line("--global-batch-size -8", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--global-batch-size -8 is out of range"), "%s", err);
    CHECK(check_line("--global-batch-size -1", err, sizeof err) == CO_EINVAL); /* -1 given is not "unset" */
    CHECK(check_line("--global-batch-size 0", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--seq-length 2000000", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "(1 to 1048576)"), "%s", err);
    CHECK(check_line("--num-layers 1024 --hidden-size 65536 --num-attention-heads 64", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "refused as absurd"), "%s", err);
    CHECK(check_line("--micro-batch-size 65536 --seq-length 65536 --position-embedding-type rope", err, sizeof err) ==
          CO_EINVAL);
    CHECK_MSG(strstr(err, "tokens per micro batch"), "%s", err);
    CHECK(check_line("--train-iters -3", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--save-interval 0", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--most-recent-k 0", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--most-recent-k 3", err, sizeof err) == 0);
    CHECK(check_line("--exit-interval -1", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--threads 0", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--threads 1", err, sizeof err) == 0);
    CHECK(check_line("--group-query-attention --num-query-groups 8", err, sizeof err) == CO_EINVAL);
    CHECK(check_line("--group-query-attention --num-query-groups 2", err, sizeof err) == 0);
    /* the rerun state machine validates any number of micro batches per rank (GPT-3 175B's
     * layout has 192) */
    CHECK(check_line("--micro-batch-size 1 --global-batch-size 64", err, sizeof err) == 0);
    CHECK(check_line("--micro-batch-size 1 --global-batch-size 65", err, sizeof err) == 0);
    CHECK(check_line("--micro-batch-size 1 --global-batch-size 1536", err, sizeof err) == 0);
    {
        co_config c;
        char e[1024];
        REQUIRE(parse(&c, "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                          "--micro-batch-size 1 --global-batch-size 128 --train-iters 10 --lr 1e-3",
                      e, sizeof e) == 0);
        CHECK(check(&c, 2, e, sizeof e) == 0); /* 64 per rank with 2 ranks */
        co_config_free(&c);
        REQUIRE(parse(&c, "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                          "--micro-batch-size 2 --train-iters 10 --lr 1e-3",
                      e, sizeof e) == 0);
        CHECK(check(&c, 0, e, sizeof e) == CO_EINVAL); /* no division by a zero world */
        co_config_free(&c);
    }
    /* several problems are reported together, one per line */
    CHECK(check_line("--hidden-size 66 --global-batch-size 5", err, sizeof err) == CO_EINVAL);
    CHECK(strchr(err, '\n') != NULL);
}

/* --rampup-batch-size: Megatron's calculator (the batch at each consumed count, the
 * iterations of a ramped run) and its checks; the flags of Megatron's example scripts. */
static void test_rampup_and_compat(void) {
    const char *base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --lr 1e-3 "
                       "--micro-batch-size 1 ";
    char line[600], e[1024];
    co_config c;
    snprintf(line, sizeof line, "%s--global-batch-size 64 --train-samples 1000 --rampup-batch-size 16 16 300", base);
    REQUIRE(parse(&c, line, e, sizeof e) == 0);
    CHECK_MSG(check(&c, 2, e, sizeof e) == 0, "%s", e);
    CHECK(c.rampup_start == 16 && c.rampup_increment == 16 && c.rampup_samples == 300);
    /* Megatron: 3 increments over 300 samples, 100 each; int(consumed / 100) steps; past 300 the full batch */
    int64_t at[8] = {0, 16, 99, 100, 199, 200, 300, 301};
    int want[8] = {16, 16, 16, 32, 32, 48, 64, 64};
    for (int k = 0; k < 8; k++)
        CHECK_MSG(co_config_batch_at(&c, at[k]) == want[k], "at %lld: %d", (long long)at[k], co_config_batch_at(&c, at[k]));
    /* Megatron's update_train_iters: 0, 16, ..., 96 (7 batches of 16: 112), 112, 144, 176 (3 of
     * 32: 208), 208, 256 (2 of 48: 304 > 300), then (1000 - 304) // 64 = 10 whole batches */
    CHECK_MSG(c.train_iters == 22, "%lld iterations", (long long)c.train_iters);
    CHECK(co_config_split_samples(&c, 0) == 1000);
    co_config_free(&c);
    const char *bad[][2] = {
        {"--global-batch-size 64 --train-iters 10 --rampup-batch-size 16 16 300", "needs --train-samples"},
        {"--global-batch-size 64 --train-samples 640 --rampup-batch-size 16 20 300", "a multiple of INCREMENT"},
        {"--global-batch-size 64 --train-samples 640 --rampup-batch-size 17 47 300", "multiples of --micro-batch-size"},
        {"--global-batch-size 64 --train-samples 640 --rampup-batch-size 64 16 300", "below --global-batch-size"},
        {"--global-batch-size 64 --train-samples 640 --rampup-batch-size 16 16", "three integers"},
        {"--global-batch-size 64 --train-samples 640 --rampup-batch-size 16 16 300 --lr-decay-iters 5",
         "--lr-decay-samples"},
        {"--attention-backend flash", "FlashAttention"},
        {"--attention-backend fused", "cuDNN fused"},
        {"--no-position-embedding", "--no-position-embedding with --position-embedding-type learned_absolute"},
        {"--rotary-percent 0.5", "--rotary-percent 0.5 is not supported yet"},
        {"--decoupled-min-lr 5e-5", "--decoupled-min-lr needs --decoupled-lr"},
        {"--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather",
         "fp8 is not supported"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(line, sizeof line, "%s%s%s", base, strstr(bad[k][0], "train-") ? "" : "--train-iters 10 ", bad[k][0]);
        REQUIRE(parse(&c, line, e, sizeof e) == 0);
        int rc = check(&c, 2, e, sizeof e);
        CHECK_MSG(rc == CO_EINVAL && strstr(e, bad[k][1]), "%s: %s", bad[k][0], e);
        co_config_free(&c);
    }
    /* accepted: Megatron's no-ops and meanings; --no-position-embedding with rope */
    snprintf(line, sizeof line, "%s--train-iters 10 --use-mcore-models --no-masked-softmax-fusion --position-embedding-type "
             "rope --no-position-embedding --attention-backend auto --cross-entropy-loss-fusion --manual-gc "
             "--empty-unused-memory-level 1 --num-workers 1 --no-mmap-bin-files --no-create-attention-mask-in-dataloader "
             "--log-throughput --ckpt-format torch_dist --distributed-timeout-minutes 60 --wandb-project p", base);
    REQUIRE(parse(&c, line, e, sizeof e) == 0);
    CHECK_MSG(check(&c, 1, e, sizeof e) == 0, "%s", e);
    CHECK(!c.add_position_embedding && !c.masked_softmax_fusion && c.use_mcore_models);
    co_config_free(&c);
}

/* --timeline-dir and --timeline-iterations: parsed, validated, and which iterations record. */
static void test_timeline_flags(void) {
    char err[2048], line[2048];
    co_config c;
    /* the trainer records: accepted */
    CHECK_MSG(check_line("--timeline-dir tl", err, sizeof err) == 0, "%s", err);
    /* "A:B": absolute, 1-based, inclusive */
    snprintf(line, sizeof line, "%s--timeline-dir tl --timeline-iterations 5:8", base);
    REQUIRE(parse(&c, line, err, sizeof err) == 0);
    check(&c, 1, err, sizeof err);
    CHECK_MSG(!strstr(err, "--timeline-iterations"), "%s", err);
    CHECK(c.timeline_from == 5 && c.timeline_to == 8 && !c.timeline_relative);
    CHECK(!co_config_timeline_records(&c, 0, 4) && co_config_timeline_records(&c, 0, 5));
    CHECK(co_config_timeline_records(&c, 6, 8) && !co_config_timeline_records(&c, 0, 9));
    co_config_free(&c);
    /* "N" (default 3): the N iterations after the run's first, counted from where it began */
    snprintf(line, sizeof line, "%s--timeline-dir tl", base);
    REQUIRE(parse(&c, line, err, sizeof err) == 0);
    check(&c, 1, err, sizeof err);
    CHECK(c.timeline_from == 2 && c.timeline_to == 4 && c.timeline_relative);
    CHECK(!co_config_timeline_records(&c, 0, 1) && co_config_timeline_records(&c, 0, 2) &&
          co_config_timeline_records(&c, 0, 4) && !co_config_timeline_records(&c, 0, 5));
    CHECK(!co_config_timeline_records(&c, 100, 101) && co_config_timeline_records(&c, 100, 102) &&
          co_config_timeline_records(&c, 100, 104) && !co_config_timeline_records(&c, 100, 105));
    c.timeline_dir[0] = '\0'; /* off: nothing records */
    CHECK(!co_config_timeline_records(&c, 0, 2));
    co_config_free(&c);
    /* ranges that make no sense: one line each */
    const char *bad[] = {"0:3", "5:2", "abc", "3:", ":3", "0", "-1", "1:1e3", "1:2:3", "2:99999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(line, sizeof line, "--timeline-dir tl --timeline-iterations %s", bad[i]);
        CHECK(check_line(line, err, sizeof err) == CO_EINVAL);
        CHECK_MSG(strstr(err, "--timeline-iterations '") && strstr(err, "is not N"), "%s: %s", bad[i], err);
    }
    CHECK(check_line("--timeline-iterations 4", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "--timeline-iterations needs --timeline-dir"), "%s", err);
    CHECK(check_line("--timeline-dir tl --timeline-iterations 11:12", err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "records nothing: the run ends at iteration 10"), "%s", err);
}

static void test_derived(void) {
    co_config c;
    char err[512];
    REQUIRE(parse(&c, "--num-layers 2 --hidden-size 96 --num-attention-heads 4 --seq-length 32 "
                      "--micro-batch-size 2 --train-iters 10 --lr 1e-3 --swiglu",
                  err, sizeof err) == 0);
    REQUIRE(check(&c, 2, err, sizeof err) == 0);
    CHECK(c.ffn_hidden_size == 256); /* int(4*96*2/3 / 64) * 64 */
    CHECK(c.kv_channels == 24);
    CHECK(c.num_query_groups == 4);
    CHECK(c.max_position_embeddings == 32);
    CHECK(c.global_batch_size == 4); /* micro x dp */
    CHECK(c.lr_decay_iters == 10);
    co_config_free(&c);
}

/* The configuration as JSON (co_config_write_json) read back (co_config_read_json) through
 * the flag table: every kind of flag equal, what changed told, `only` limits the flags. */
static char *config_json(const co_config *c) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    co_config_write_json(c, f);
    fclose(f);
    return buf;
}

static void count_changes(void *ctx, const char *name, const char *value) {
    int *n = ctx;
    (*n)++;
    if (!strcmp(name, "hidden-size")) CHECK_MSG(!strcmp(value, "96"), "%s", value);
    if (!strcmp(name, "swiglu")) CHECK_MSG(!strcmp(value, "on"), "%s", value);
}

static void test_json_round_trip(void) {
    co_config c, back;
    char err[512];
    REQUIRE(parse(&c, "--num-layers 3 --hidden-size 96 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 "
                      "--train-iters 10 --lr 3e-4 --swiglu --no-check-for-nan-in-loss-and-grad --data-path 0.5 A 0.5 B "
                      "--split 98,1,1 --normalization RMSNorm --train-samples 123456789012 --rotary-base 500000.5 "
                      "--inject nan@rank=0,step=2 --metrics-file m\"q.json",
                  err, sizeof err) == 0);
    char *one = config_json(&c);
    REQUIRE(one != NULL);
    json_error_t je;
    json_t *obj = json_loads(one, 0, &je);
    REQUIRE_MSG(obj != NULL, "%s: %s", je.text, one);
    co_config_defaults(&back);
    int changes = 0;
    REQUIRE(co_config_read_json(&back, obj, NULL, count_changes, &changes) == 0);
    char *two = config_json(&back);
    CHECK_MSG(two && !strcmp(one, two), "%s\n%s", one, two ? two : "");
    CHECK(back.n_data_path == 4 && !strcmp(back.data_path[3], "B") && back.n_inject == 1);
    CHECK(back.train_samples == 123456789012LL && back.rotary_base == 500000.5 && !back.check_for_nan_in_loss_and_grad);
    CHECK(changes >= 15);
    co_config_free(&back);
    /* only the flags named: the rest stay at their defaults */
    static const char *const model[] = {"hidden-size", "swiglu", NULL};
    co_config_defaults(&back);
    changes = 0;
    REQUIRE(co_config_read_json(&back, obj, model, count_changes, &changes) == 0);
    CHECK(changes == 2 && back.hidden_size == 96 && back.swiglu && back.num_layers == -1 && back.n_data_path == 0);
    static const char *const bogus[] = {"no-such-flag", NULL};
    CHECK(co_config_read_json(&back, obj, bogus, NULL, NULL) == CO_EINVAL);
    /* a value of another kind is left as it was */
    json_object_set_new(obj, "num-layers", json_string("three"));
    REQUIRE(co_config_read_json(&back, obj, NULL, NULL, NULL) == 0);
    CHECK(back.num_layers == -1 && back.hidden_size == 96);
    co_config_free(&back);
    json_decref(obj);
    free(one);
    free(two);
    co_config_free(&c);
}

/* --moe-layer-freq: the integer, and Megatron's list form (its moe_freq_type's Python list
 * expression, as its examples write it) expanded per layer, checked against --num-layers,
 * kept through the checkpoint's JSON; what it is not, refused with the reason. */
static void test_moe_layer_freq_list(void) {
    static const char *const ok[][2] = {
        {"([1]*3+[0]*1)*2", "11101110"}, /* Megatron's help */
        {"[0,1,1,1]", "0111"},
        {"[0]*3+[1]*5", "00011111"}, /* the DeepSeek-V3 and Kimi examples' form, unparenthesised */
        {"([0]+[1]*3)", "0111"},      /* DeepSeek-V2-Lite's */
        {"([0,1]*2)", "0101"},        /* Llama-4's */
        {"[1,]*2+2*[0]", "1100"},     /* a trailing comma; an integer times a list */
        {"[1]*(1+1)+[0]*0", "11"},
    };
    co_config c;
    char err[512], line[512];
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
        snprintf(line, sizeof line, "--moe-layer-freq %s", ok[k][0]);
        REQUIRE_MSG(parse(&c, line, err, sizeof err) == 0, "%s: %s", ok[k][0], err);
        CHECK_MSG(!strcmp(c.moe_layer_list, ok[k][1]) && c.moe_layer_freq == 0, "%s: %s", ok[k][0], c.moe_layer_list);
        for (int l = 0; ok[k][1][l]; l++) CHECK(co_config_moe_layer(&c, l) == (ok[k][1][l] == '1'));
        co_config_free(&c);
    }
    REQUIRE(parse(&c, "--moe-layer-freq 3", err, sizeof err) == 0);
    CHECK(c.moe_layer_freq == 3 && !c.moe_layer_list[0] && co_config_moe_layer(&c, 3) && !co_config_moe_layer(&c, 4));
    co_config_free(&c);
    static const char *const bad[][2] = {
        {"[1,_0]", "only digits, commas"},
        {"[1]+1", "a list plus an integer"},
        {"[2,1]", "an entry other than 0 (dense) and 1 (MoE)"},
        {"[[1],[0]]", "a list inside a list"},
        {"([1],[0])", "a tuple"},
        {"[1]*[2]", "a list times a list"},
        {"[1,0", "separated by commas and end with ]"},
        {"[1]+", "the expression ends early"},
        {"[1]*2)", "text after the expression"},
        {"[1]*100000", "more entries than layers"},
        {"(3)", "expects an integer"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(line, sizeof line, "--moe-layer-freq %s", bad[k][0]);
        CHECK_MSG(parse(&c, line, err, sizeof err) == CO_EINVAL && strstr(err, bad[k][1]), "%s: %s", bad[k][0], err);
        co_config_free(&c);
    }
    /* one entry per layer (Megatron's assertion), with MoE flags that are otherwise valid */
    const char *moe = "--num-experts 4 --disable-bias-linear --moe-router-topk 2 ";
    snprintf(line, sizeof line, "%s--moe-layer-freq [0]+[1]", moe);
    CHECK_MSG(check_line(line, err, sizeof err) == 0, "%s", err);
    snprintf(line, sizeof line, "%s--moe-layer-freq [1,0,1]", moe);
    CHECK_MSG(check_line(line, err, sizeof err) == CO_EINVAL &&
                  strstr(err, "Invalid length of moe_layer_pattern: 3, expected 2 (--num-layers)"), "%s", err);
    /* the checkpoint's flags: the list form as a string, read back (spaces as Python prints it) */
    REQUIRE(parse(&c, "--moe-layer-freq ([1]*3+[0]*1)*2", err, sizeof err) == 0);
    char *one = config_json(&c);
    REQUIRE(one && strstr(one, "\"moe-layer-freq\":\"[1, 1, 1, 0, 1, 1, 1, 0]\""));
    json_t *obj = json_loads(one, 0, NULL);
    REQUIRE(obj != NULL);
    co_config back;
    co_config_defaults(&back);
    static const char *const only[] = {"moe-layer-freq", NULL};
    REQUIRE(co_config_read_json(&back, obj, only, NULL, NULL) == 0);
    CHECK_MSG(!strcmp(back.moe_layer_list, "11101110") && back.moe_layer_freq == 0, "%s", back.moe_layer_list);
    /* and an integer read over a list replaces it */
    json_object_set_new(obj, "moe-layer-freq", json_integer(2));
    REQUIRE(co_config_read_json(&back, obj, only, NULL, NULL) == 0);
    CHECK(back.moe_layer_freq == 2 && !back.moe_layer_list[0]);
    co_config_free(&back);
    json_decref(obj);
    free(one);
    co_config_free(&c);
}

static void test_lr_schedules(void) {
    lr_schedule s = {.max_lr = 1.0, .min_lr = 0.1, .init_lr = 0.0, .warmup_iters = 10, .decay_iters = 110,
                     .wsd_decay_iters = 20, .style = LR_COSINE, .wsd_style = WSD_EXPONENTIAL};
    CHECK_CLOSE(lr_at(&s, 0), 0.0, 1e-12, 0);
    CHECK_CLOSE(lr_at(&s, 5), 0.5, 1e-12, 0);
    CHECK_CLOSE(lr_at(&s, 10), 1.0, 1e-12, 0);
    CHECK_CLOSE(lr_at(&s, 60), 0.1 + 0.9 * 0.5 * (cos(M_PI * 0.5) + 1), 1e-12, 0);
    CHECK_CLOSE(lr_at(&s, 200), 0.1, 1e-12, 0);
    s.style = LR_LINEAR;
    CHECK_CLOSE(lr_at(&s, 35), 0.1 + 0.9 * 0.75, 1e-12, 0);
    s.style = LR_CONSTANT;
    CHECK_CLOSE(lr_at(&s, 500), 1.0, 1e-12, 0);
    s.style = LR_INVSQRT;
    CHECK_CLOSE(lr_at(&s, 40), sqrt(10.0) / sqrt(40.0), 1e-12, 0);
    s.style = LR_WSD;
    CHECK_CLOSE(lr_at(&s, 80), 1.0, 1e-12, 0);                           /* stable phase */
    CHECK_CLOSE(lr_at(&s, 100), 0.1 + 0.9 * (2 * pow(0.5, 0.5) - 1), 1e-12, 0); /* half-way anneal */
    s.wsd_style = WSD_LINEAR;
    CHECK_CLOSE(lr_at(&s, 100), 0.1 + 0.9 * 0.5, 1e-12, 0);
    CHECK(lr_style_parse("WSD") == LR_WSD && lr_style_parse("bogus") == -1);
}

static void test_split_parse(void) {
    double f[3];
    CHECK(co_config_parse_split("98,1,1", f) == 0 && fabs(f[0] - 0.98) < 1e-12 && fabs(f[2] - 0.01) < 1e-12);
    CHECK(co_config_parse_split("969, 30, 1", f) == 0 && fabs(f[1] - 0.03) < 1e-12);
    CHECK(co_config_parse_split("1", f) == 0 && f[0] == 1.0 && f[1] == 0 && f[2] == 0);
    CHECK(co_config_parse_split("a,b", f) == -1);
}

static void test_edit_distance(void) {
    CHECK(co_edit_distance("kitten", "sitting") == 3);
    CHECK(co_edit_distance("", "abc") == 3);
    CHECK(co_edit_distance("same", "same") == 0);
}

int main(void) {
    RUN(test_defaults_are_megatrons);
    RUN(test_parse_forms);
    RUN(test_data_path_words);
    RUN(test_unknown_flag_suggests);
    RUN(test_validation);
    RUN(test_timeline_flags);
    RUN(test_rampup_and_compat);
    RUN(test_derived);
    RUN(test_json_round_trip);
    RUN(test_moe_layer_freq_list);
    RUN(test_lr_schedules);
    RUN(test_split_parse);
    RUN(test_edit_distance);
    return TEST_EXIT();
}
