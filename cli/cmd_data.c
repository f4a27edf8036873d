/* cmd_data.c - `cohort data ...`: tools over Megatron-format data.
 *   cohort data order [--split-name train|valid|test] [--count K] DATA FLAGS
 * prints, for the same data flags as `cohort train`, the (document position, offset)
 * pair where each of a split's first K samples starts, in training order, so the order
 * can be checked against Megatron's from outside. */
#include "cli/cli.h"

#include "common/error.h"
#include "data/gpt_dataset.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void data_usage(FILE *f) {
    fputs("usage: cohort data order [--split-name train|valid|test] [--count K] [data flags]\n"
          "\n"
          "Prints the first K samples of a split as 'sample document_position offset' lines:\n"
          "the sample's start in Megatron's sample index, in shuffled training order.\n"
          "Data flags are those of `cohort train`: --data-path or --mock-data, --split,\n"
          "--seq-length, --seed, --tokenizer-type/--vocab-size, --train-iters or --train-samples,\n"
          "--global-batch-size (or --micro-batch-size), --eval-interval, --eval-iters,\n"
          "--data-cache-path. --count defaults to 10, --split-name to train.\n",
          f);
}

static int usage_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int usage_err(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return CO_EINVAL;
}

static int data_order(int argc, char **argv) {
    const char *split_name = "train";
    long long count = 10;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    if (!rest) return CLI_FAILURE;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            data_usage(stdout);
            free(rest);
            return CLI_OK;
        }
        if ((!strcmp(argv[i], "--split-name") || !strcmp(argv[i], "--count")) && i + 1 >= argc) {
            fprintf(stderr, "cohort data order: %s needs a value\n", argv[i]);
            free(rest);
            return CLI_USAGE;
        }
        if (!strcmp(argv[i], "--split-name")) split_name = argv[++i];
        else if (!strcmp(argv[i], "--count")) {
            char *end;
            count = strtoll(argv[++i], &end, 10);
            if (*end || count < 0) {
                fprintf(stderr, "cohort data order: --count expects a non-negative integer\n");
                free(rest);
                return CLI_USAGE;
            }
        } else rest[nrest++] = argv[i];
    }
    int split = !strcmp(split_name, "train") ? 0 : !strcmp(split_name, "valid") ? 1 : !strcmp(split_name, "test") ? 2 : -1;
    co_config c;
    co_config_defaults(&c);
    char err[2048];
    int rc = co_config_parse(&c, nrest, rest, err, sizeof err);
    free(rest);
    int vocab = 0, eod = 0;
    if (!rc && split < 0) rc = usage_err(err, sizeof err, "--split-name must be train, valid or test");
    if (!rc && c.seq_length < 1) rc = usage_err(err, sizeof err, "--seq-length is required");
    if (!rc && c.global_batch_size < 1) c.global_batch_size = c.micro_batch_size;
    if (!rc && c.global_batch_size < 1) rc = usage_err(err, sizeof err, "--global-batch-size is required");
    if (!rc && c.train_iters < 1 && c.train_samples > 0) c.train_iters = c.train_samples / c.global_batch_size;
    if (!rc && c.train_iters < 1) rc = usage_err(err, sizeof err, "--train-iters or --train-samples is required");
    if (!rc && !cli_data_prefix(&c) && !c.mock_data) rc = usage_err(err, sizeof err, "--data-path or --mock-data is required");
    double sp[3];
    if (!rc && co_config_parse_split(c.split, sp)) rc = usage_err(err, sizeof err, "--split '%s' is not valid", c.split);
    if (!rc) rc = cli_tokenizer(&c, &vocab, &eod, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cohort data order: %s\n", err);
        co_config_free(&c);
        return CLI_USAGE;
    }
    int64_t gbs = c.global_batch_size;
    int64_t want = split == 0 ? c.train_iters * gbs
                 : split == 1 ? (c.train_iters / c.eval_interval + 1) * c.eval_iters * gbs
                              : c.eval_iters * gbs;
    gds_config dc;
    memset(&dc, 0, sizeof dc);
    dc.prefix = cli_data_prefix(&c);
    dc.mock = c.mock_data;
    dc.split = c.split;
    dc.seq_length = c.seq_length;
    dc.seed = (uint32_t)c.seed;
    dc.eod = eod;
    dc.vocab_size = vocab;
    dc.cache_dir = c.data_cache_path[0] ? c.data_cache_path : NULL;
    gds_dataset *ds = NULL;
    rc = want > 0 ? gds_build(&ds, &dc, split, want) : 0;
    if (rc) {
        fprintf(stderr, "cohort data order: %s (%s)\n", co_err_detail(), co_strerror(rc));
        co_config_free(&c);
        return CLI_FAILURE;
    }
    if (!ds) {
        printf("# split %s is empty\n", split_name);
        co_config_free(&c);
        return CLI_OK;
    }
    int64_t n = gds_num_samples(ds);
    printf("# split %s: %lld samples requested, %lld in the index; sample document_position offset\n", split_name,
           (long long)want, (long long)n);
    for (int64_t i = 0; i < count && i < n; i++) {
        int64_t doc_pos, offset;
        gds_sample_index_pair(ds, i, &doc_pos, &offset);
        printf("%lld %lld %lld\n", (long long)i, (long long)doc_pos, (long long)offset);
    }
    gds_destroy(&ds);
    co_config_free(&c);
    return CLI_OK;
}

int cli_data(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h") || !strcmp(argv[0], "help")) {
        data_usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? CLI_USAGE : CLI_OK;
    }
    if (!strcmp(argv[0], "order")) return data_order(argc - 1, argv + 1);
    fprintf(stderr, "cohort data: unknown command '%s' (known: order)\n", argv[0]);
    return CLI_USAGE;
}
