/* cmd_data.c - `cohort data ...`: tools over Megatron-format data.
 *   preprocess  JSONL -> PREFIX_{key}_document.bin/.idx (data/preprocess.h)
 *   order       a split's first samples in training order, for the same data flags as
 *               `cohort train` (single, blended, per-split, SFT; data/loader.h), so the
 *               order can be checked against Megatron's from outside
 *   inspect     summary, length histogram and a decoded document of PREFIX
 *   verify      structural checks of PREFIX with one exit status per check (data/verify.h)
 *   tokenize    encode/decode a whole file (tests and benchmarks) */
#include "cli/cli.h"

#include "common/error.h"
#include "common/log.h"
#include "data/gpt_dataset.h"
#include "data/indexed.h"
#include "data/loader.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "data/verify.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Tokenizer flags shared by the subcommands. */
typedef struct {
    const char *type, *vocab_file, *merge_file, *model, *pattern;
    long long vocab_size, num_special;
    int num_special_given;
    const char *special[CO_MAX_DATA_PATHS];
    int n_special;
} tok_flags;

/* Consumes argv[*i] (and its value) when it is a tokenizer flag: 1 consumed, 0 not one,
 * -1 missing value. --tiktoken-special-tokens takes the words up to the next flag. */
static int tok_flag(tok_flags *t, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--tiktoken-special-tokens")) {
        if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) return -1;
        while (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) && t->n_special < CO_MAX_DATA_PATHS)
            t->special[t->n_special++] = argv[++*i];
        return 1;
    }
    const char **dst = !strcmp(a, "--tokenizer-type")     ? &t->type
                     : !strcmp(a, "--vocab-file")         ? &t->vocab_file
                     : !strcmp(a, "--merge-file")         ? &t->merge_file
                     : !strcmp(a, "--tokenizer-model")    ? &t->model
                     : !strcmp(a, "--tiktoken-pattern")   ? &t->pattern
                                                          : NULL;
    long long *num = !strcmp(a, "--vocab-size")                  ? &t->vocab_size
                     : !strcmp(a, "--tiktoken-num-special-tokens") ? &t->num_special
                                                                   : NULL;
    if (!dst && !num) return 0;
    if (*i + 1 >= argc) return -1;
    (*i)++;
    if (dst) *dst = argv[*i];
    else *num = strtoll(argv[*i], NULL, 10);
    if (num == &t->num_special) t->num_special_given = 1;
    return 1;
}

static int open_tokenizer(const tok_flags *f, tok_tokenizer *t) {
    tok_options o = {
        .type = f->type ? f->type : "GPT2BPETokenizer",
        .vocab_size = f->vocab_size,
        .vocab_file = f->vocab_file,
        .merge_file = f->merge_file,
        .tokenizer_model = f->model,
        .tiktoken_pattern = f->pattern,
        .tiktoken_num_special_tokens = !f->num_special_given ? -1
                                       : f->num_special < 0 || f->num_special > INT32_MAX ? 0
                                                                                         : (int)f->num_special,
        .tiktoken_special_tokens = f->special,
        .n_tiktoken_special_tokens = f->n_special,
    };
    int rc = tok_open_options(t, &o);
    if (rc) co_log(CO_LOG_ERROR, "%s", co_err_detail());
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* cohort data preprocess */
static int data_preprocess(int argc, char **argv) {
    pp_options o;
    memset(&o, 0, sizeof o);
    o.workers = 1;
    tok_flags tf = {0};
    int quiet = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = tok_flag(&tf, argc, argv, &i);
        if (r < 0) goto needs_value;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs("usage: cohort data preprocess --input FILE.jsonl --output-prefix PREFIX [--json-keys K ...]\n"
                  "       [--append-eod] [--workers N] [--skip-malformed] [--quiet]\n"
                  "       [--tokenizer-type GPT2BPETokenizer|ByteLevelTokenizer|NullTokenizer|\n"
                  "        SentencePieceTokenizer|GPTSentencePieceTokenizer|Llama2Tokenizer|TikTokenizer]\n"
                  "       [--vocab-file encoder.json --merge-file vocab.bpe] [--vocab-size V]\n"
                  "       [--tokenizer-model FILE] [--tiktoken-pattern v1|v2]\n"
                  "       [--tiktoken-num-special-tokens N] [--tiktoken-special-tokens T ...]\n"
                  "\n"
                  "Writes PREFIX_{key}_document.bin/.idx exactly as Megatron's tools/preprocess_data.py.\n"
                  "SentencePiece types and TikTokenizer read --tokenizer-model (docs/data.md); Llama2Tokenizer\n"
                  "starts every document with bos, as Megatron's.\n"
                  "--json-keys defaults to text, --workers to 1. A malformed line is an error naming the\n"
                  "file and line unless --skip-malformed (then skipped and counted).\n",
                  stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--append-eod")) o.append_eod = 1;
        else if (!strcmp(a, "--skip-malformed")) o.skip_malformed = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--input") || !strcmp(a, "--output-prefix") || !strcmp(a, "--workers") ||
                 !strcmp(a, "--json-keys")) {
            if (i + 1 >= argc) goto needs_value;
            if (!strcmp(a, "--input")) o.input = argv[++i];
            else if (!strcmp(a, "--output-prefix")) o.output_prefix = argv[++i];
            else if (!strcmp(a, "--workers")) {
                char *end;
                long v = strtol(argv[++i], &end, 10);
                if (*end || v < 1 || v > 256) {
                    co_log(CO_LOG_ERROR, "--workers expects 1..256");
                    return CLI_USAGE;
                }
                o.workers = (int)v;
            } else {
                while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
                    if (o.nkeys == PP_MAX_KEYS) {
                        co_log(CO_LOG_ERROR, "at most %d --json-keys", PP_MAX_KEYS);
                        return CLI_USAGE;
                    }
                    o.keys[o.nkeys++] = argv[++i];
                }
                if (!o.nkeys) goto needs_value;
            }
        } else {
            co_log(CO_LOG_ERROR, "unknown flag '%s' (see --help)", a);
            return CLI_USAGE;
        }
        continue;
    needs_value:
        co_log(CO_LOG_ERROR, "%s needs a value", a);
        return CLI_USAGE;
    }
    if (!o.input || !o.output_prefix) {
        co_log(CO_LOG_ERROR, "--input and --output-prefix are required");
        return CLI_USAGE;
    }
    tok_tokenizer tok;
    if (open_tokenizer(&tf, &tok)) return CLI_USAGE;
    o.tok = &tok;
    o.progress = !quiet && isatty(STDERR_FILENO) ? stderr : NULL;
    pp_stats st;
    int rc = pp_run(&o, &st);
    tok_close(&tok);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return rc == CO_EINVAL ? CLI_USAGE : CLI_FAILURE;
    }
    if (!quiet)
        printf("preprocess: %lld lines, %lld documents, %lld tokens, %lld skipped, %.2f MB in %.2f s (%.2f MB/s, "
               "%d workers; %.2f MB per worker CPU second) -> %s_%s_document.{bin,idx}%s\n",
               (long long)st.lines, (long long)st.documents, (long long)st.tokens, (long long)st.skipped,
               (double)st.bytes / 1e6, st.seconds, st.seconds > 0 ? (double)st.bytes / 1e6 / st.seconds : 0.0,
               o.workers, st.worker_cpu_seconds > 0 ? (double)st.bytes / 1e6 / st.worker_cpu_seconds : 0.0,
               o.output_prefix, o.nkeys ? o.keys[0] : "text", o.nkeys > 1 ? " (and the other keys)" : "");
    return CLI_OK;
}

/* cohort data tokenize: encodes (or decodes) a whole file in one piece. */
static int data_tokenize(int argc, char **argv) {
    tok_flags tf = {0};
    const char *input = NULL, *output = "-";
    int decode = 0, binary = 0, timing = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = tok_flag(&tf, argc, argv, &i);
        if (r < 0 || ((!strcmp(a, "--input") || !strcmp(a, "--output")) && i + 1 >= argc)) {
            co_log(CO_LOG_ERROR, "%s needs a value", a);
            return CLI_USAGE;
        }
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs("usage: cohort data tokenize --input FILE [--output FILE] [--binary] [--decode] [--time]\n"
                  "       [tokenizer flags]\n"
                  "Encodes the whole file as one text and writes the ids (one per line, or int32\n"
                  "little-endian with --binary); --decode reads ids (as written) and writes the text.\n"
                  "--time prints the throughput to stderr.\n",
                  stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--input")) input = argv[++i];
        else if (!strcmp(a, "--output")) output = argv[++i];
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--binary")) binary = 1;
        else if (!strcmp(a, "--time")) timing = 1;
        else {
            co_log(CO_LOG_ERROR, "unknown flag '%s'", a);
            return CLI_USAGE;
        }
    }
    if (!input) {
        co_log(CO_LOG_ERROR, "--input is required");
        return CLI_USAGE;
    }
    FILE *f = fopen(input, "rb");
    if (!f) {
        co_log(CO_LOG_ERROR, "%s: cannot open", input);
        return CLI_FAILURE;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f); /* one byte kept for the terminating NUL */
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf) return CLI_FAILURE;
    buf[n] = '\0';
    tok_tokenizer tok;
    if (open_tokenizer(&tf, &tok)) {
        free(buf);
        return CLI_USAGE;
    }
    FILE *out = strcmp(output, "-") ? fopen(output, "wb") : stdout;
    int rc = out ? CLI_OK : CLI_FAILURE;
    if (!out) co_log(CO_LOG_ERROR, "%s: cannot create", output);
    if (out && !decode) {
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        tok_session *s = NULL;
        double t0 = now_s();
        int64_t k = ids ? tok_session_new(&s, &tok) : CO_ENOMEM;
        if (!k) k = tok_session_encode(s, buf, n, ids, n + 1);
        double dt = now_s() - t0;
        tok_session_free(&s);
        if (k < 0) {
            co_log(CO_LOG_ERROR, "%s", co_err_detail());
            rc = CLI_FAILURE;
        } else {
            if (timing)
                fprintf(stderr, "tokenize: %zu bytes -> %lld tokens in %.3f s: %.2f MB/s\n", n, (long long)k, dt,
                        dt > 0 ? (double)n / 1e6 / dt : 0.0);
            if (binary) fwrite(ids, sizeof *ids, (size_t)k, out);
            else
                for (int64_t i = 0; i < k; i++) fprintf(out, "%d\n", (int)ids[i]);
        }
        free(ids);
    } else if (out) {
        size_t nid = 0;
        int32_t *ids = malloc((n / (binary ? 4 : 1) + 1) * sizeof *ids);
        if (!ids) {
            co_log(CO_LOG_ERROR, "out of memory");
            rc = CLI_FAILURE;
        } else if (binary && n % 4) {
            co_log(CO_LOG_ERROR, "%s: %zu bytes is not a whole number of 4-byte ids", input, n);
            rc = CLI_FAILURE;
        } else if (binary) {
            memcpy(ids, buf, n);
            nid = n / 4;
        } else {
            /* whitespace-separated decimal ids; anything else is refused, never skipped */
            char *p = buf, *end = buf + n;
            while (p < end) {
                while (p < end && isspace((unsigned char)*p)) p++;
                if (p >= end) break;
                char *q;
                errno = 0;
                long v = strtol(p, &q, 10);
                if (q == p || errno || v < INT32_MIN || v > INT32_MAX || (q < end && !isspace((unsigned char)*q))) {
                    co_log(CO_LOG_ERROR, "%s: \"%.*s\" is not an id (byte %zu)", input,
                           (int)strcspn(p, " \t\r\n") < 32 ? (int)strcspn(p, " \t\r\n") : 32, p, (size_t)(p - buf));
                    rc = CLI_FAILURE;
                    break;
                }
                ids[nid++] = (int32_t)v;
                p = q;
            }
        }
        if (rc == CLI_OK) {
            int64_t len = tok_decode(&tok, ids, nid, NULL, 0);
            char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
            if (!text) {
                co_log(CO_LOG_ERROR, "%s", len < 0 ? co_err_detail() : "out of memory");
                rc = CLI_FAILURE;
            } else {
                tok_decode(&tok, ids, nid, text, (size_t)len + 1);
                fwrite(text, 1, (size_t)len, out);
            }
            free(text);
        }
        free(ids);
    }
    if (out && out != stdout) fclose(out);
    tok_close(&tok);
    free(buf);
    return rc;
}

static void data_usage(FILE *f) {
    fputs("usage: cohort data <command> [flags]   (each command takes --help)\n"
          "\n"
          "  preprocess  JSONL -> Megatron .bin/.idx (PREFIX_{key}_document), parallel, ordered\n"
          "  order       the first samples of a split in training order (single, blended,\n"
          "              per-split or SFT data; same data flags as `cohort train`)\n"
          "  inspect     documents, tokens, dtype, length histogram, a decoded document\n"
          "  verify      every structural check; the exit status names the failed one\n"
          "  tokenize    encode or decode a file with the tokenizer\n"
          "\n"
          "cohort data order [--split-name train|valid|test] [--count K] [data flags]\n"
          "Prints the first K samples of a split as 'sample document_position offset' lines\n"
          "(blends: 'sample dataset dataset_sample document_position offset'; SFT: the packed\n"
          "sequence in place of document_position and offset -1), in shuffled training order.\n"
          "Data flags are those of `cohort train`: --data-path, --train/valid/test-data-path,\n"
          "--mock-data, --sft, --split, --seq-length, --seed, --tokenizer-type/--vocab-size\n"
          "(--tokenizer-model, --tiktoken-*),\n"
          "--train-iters or --train-samples, --global-batch-size (or --micro-batch-size),\n"
          "--eval-interval, --eval-iters, --data-cache-path, --eod-mask-loss, --reset-position-ids,\n"
          "--reset-attention-mask. --count defaults to 10, --split-name to train. --items adds\n"
          "each sample's tokens, labels, positions, seg (document starts) and loss mask, as\n"
          "training reads them (so with --eod-mask-loss the mask is 0 where the token is EOD,\n"
          "--reset-position-ids restarts positions after each EOD, --reset-attention-mask gives\n"
          "seg = the position where the token's document starts in the sample, else 0).\n",
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

/* --items: the sample's tokens, labels, loss mask, position ids and document starts. */
static int print_item(const dl_dataset *ds, int64_t i, int L) {
    int32_t *v = malloc((size_t)L * 4 * sizeof *v);
    float *mask = malloc((size_t)L * sizeof *mask);
    int rc = v && mask ? dl_get(ds, i, v, v + L, mask, v + 2 * L, v + 3 * L) : CO_ENOMEM;
    if (!rc) {
        static const char *names[] = {"tokens", "labels", "positions", "seg"};
        for (int r = 0; r < 4; r++) {
            printf("  %s", names[r]);
            for (int p = 0; p < L; p++) printf(" %d", (int)v[r * L + p]);
            printf("\n");
        }
        printf("  mask");
        for (int p = 0; p < L; p++) printf(" %d", (int)mask[p]);
        printf("\n");
    }
    free(v);
    free(mask);
    return rc;
}

static int data_order(int argc, char **argv) {
    const char *split_name = "train";
    long long count = 10;
    int items = 0;
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
            co_log(CO_LOG_ERROR, "%s needs a value", argv[i]);
            free(rest);
            return CLI_USAGE;
        }
        if (!strcmp(argv[i], "--items")) items = 1;
        else if (!strcmp(argv[i], "--split-name")) split_name = argv[++i];
        else if (!strcmp(argv[i], "--count")) {
            char *end;
            count = strtoll(argv[++i], &end, 10);
            if (*end || count < 0) {
                co_log(CO_LOG_ERROR, "--count expects a non-negative integer");
                free(rest);
                return CLI_USAGE;
            }
        } else rest[nrest++] = argv[i];
    }
    int split = !strcmp(split_name, "train") ? 0 : !strcmp(split_name, "valid") ? 1 : !strcmp(split_name, "test") ? 2 : -1;
    co_config c;
    co_config_defaults(&c);
    char err[2048];
    int rc = co_config_parse(&c, nrest, rest);
    if (rc) snprintf(err, sizeof err, "%s", co_err_detail());
    free(rest);
    int vocab = 0, eod = 0;
    if (!rc && split < 0) rc = usage_err(err, sizeof err, "--split-name must be train, valid or test");
    if (!rc && c.seq_length < 1) rc = usage_err(err, sizeof err, "--seq-length is required");
    if (!rc && c.global_batch_size < 1) c.global_batch_size = c.micro_batch_size;
    if (!rc && c.global_batch_size < 1) rc = usage_err(err, sizeof err, "--global-batch-size is required");
    if (!rc && c.train_iters < 1 && c.train_samples > 0) c.train_iters = c.train_samples / c.global_batch_size;
    if (!rc && c.train_iters < 1) rc = usage_err(err, sizeof err, "--train-iters or --train-samples is required");
    if (!rc && !c.n_data_path && !c.mock_data && !c.n_train_data_path && !c.n_valid_data_path && !c.n_test_data_path)
        rc = usage_err(err, sizeof err, "--data-path, --mock-data or --train/valid/test-data-path is required");
    double sp[3];
    if (!rc && co_config_parse_split(c.split, sp)) rc = usage_err(err, sizeof err, "--split '%s' is not valid", c.split);
    if (!rc && (rc = cli_tokenizer(&c, &vocab, &eod))) snprintf(err, sizeof err, "%s", co_err_detail());
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", err);
        co_config_free(&c);
        return CLI_USAGE;
    }
    int64_t want = co_config_split_samples(&c, split);
    /* every field trainer_new (train/trainer.c) sets from the same flags: the samples,
     * their loss masks, position ids and document starts are then dl_get's, as in training */
    dl_config dc;
    memset(&dc, 0, sizeof dc);
    dc.base.mock = c.mock_data;
    dc.base.split = c.split;
    dc.base.seq_length = c.seq_length;
    dc.base.seed = (uint32_t)c.seed;
    dc.base.eod = eod;
    dc.base.vocab_size = vocab;
    dc.base.eod_mask_loss = c.eod_mask_loss;
    dc.base.reset_position_ids = c.reset_position_ids;
    dc.base.reset_attention_mask = c.reset_attention_mask;
    dc.base.cache_dir = c.data_cache_path[0] ? c.data_cache_path : NULL;
    dc.data_path = c.data_path;
    dc.n_data_path = c.n_data_path;
    dc.split_path[0] = c.train_data_path, dc.n_split_path[0] = c.n_train_data_path;
    dc.split_path[1] = c.valid_data_path, dc.n_split_path[1] = c.n_valid_data_path;
    dc.split_path[2] = c.test_data_path, dc.n_split_path[2] = c.n_test_data_path;
    dc.sft = c.sft;
    tok_tokenizer tok;
    memset(&tok, 0, sizeof tok);
    rc = 0;
    if (c.sft) {
        rc = tok_open_config(&tok, &c);
        dc.tok = &tok;
    }
    dl_dataset *ds = NULL;
    if (!rc) rc = want > 0 ? dl_build(&ds, &dc, split, want) : 0;
    if (rc) {
        co_log(CO_LOG_ERROR, "%s (%s)", co_err_detail(), co_strerror(rc));
        tok_close(&tok);
        co_config_free(&c);
        return rc == CO_EINVAL ? CLI_USAGE : CLI_FAILURE;
    }
    if (!ds) {
        printf("# split %s is empty\n", split_name);
        tok_close(&tok);
        co_config_free(&c);
        return CLI_OK;
    }
    int64_t n = dl_num_samples(ds);
    int blended = dl_num_datasets(ds) > 1;
    if (blended) {
        printf("# split %s: %lld samples blended from %d datasets%s:", split_name, (long long)n, dl_num_datasets(ds),
               dl_loaded_from_cache(ds) ? " (indices from the cache)" : "");
        for (int k = 0; k < dl_num_datasets(ds); k++) printf(" %d=%s", k, dl_dataset_path(ds, k));
        printf("\n# sample dataset dataset_sample document_position offset\n");
    } else {
        printf("# split %s: %lld samples requested, %lld in the index; sample document_position offset\n", split_name,
               (long long)want, (long long)n);
    }
    for (int64_t i = 0; i < count && i < n; i++) {
        int k;
        int64_t j, doc_pos, offset;
        rc = dl_origin(ds, i, &k, &j, &doc_pos, &offset);
        if (rc) break;
        if (blended) printf("%lld %d %lld %lld %lld\n", (long long)i, k, (long long)j, (long long)doc_pos, (long long)offset);
        else printf("%lld %lld %lld\n", (long long)i, (long long)doc_pos, (long long)offset);
        if (items) rc = print_item(ds, i, c.seq_length);
        if (rc) break;
    }
    dl_destroy(&ds);
    tok_close(&tok);
    co_config_free(&c);
    return rc ? CLI_FAILURE : CLI_OK;
}

/* cohort data inspect PREFIX */
static int data_inspect(int argc, char **argv) {
    tok_flags tf = {0};
    const char *prefix = NULL;
    long long doc = 0, chars = 400;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = tok_flag(&tf, argc, argv, &i);
        if (r < 0 || ((!strcmp(a, "--doc") || !strcmp(a, "--chars")) && i + 1 >= argc)) {
            co_log(CO_LOG_ERROR, "%s needs a value", a);
            return CLI_USAGE;
        }
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs("usage: cohort data inspect PREFIX [--doc N] [--chars N] [tokenizer flags]\n"
                  "Prints documents, sequences, tokens, dtype, a histogram of document lengths and\n"
                  "document N (default 0) decoded with the tokenizer (its ids when the tokenizer\n"
                  "cannot be opened), cut to --chars characters (default 400).\n",
                  stdout);
            return CLI_OK;
        }
        if (!strcmp(a, "--doc")) doc = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(a, "--chars")) chars = strtoll(argv[++i], NULL, 10);
        else if (a[0] == '-' || prefix) {
            co_log(CO_LOG_ERROR, "unexpected argument '%s'", a);
            return CLI_USAGE;
        } else prefix = a;
    }
    if (!prefix) {
        co_log(CO_LOG_ERROR, "give PREFIX (of PREFIX.bin/.idx)");
        return CLI_USAGE;
    }
    idx_reader *r;
    int rc = idx_open(&r, prefix);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return CLI_FAILURE;
    }
    static const char *names[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
    int64_t ns = idx_num_sequences(r), nd = idx_num_documents(r);
    const int32_t *lens = idx_sequence_lengths(r);
    const int64_t *docs = idx_document_indices(r);
    int64_t total = 0, maxlen = 0, minlen = INT64_MAX;
    int64_t hist[64] = {0};
    for (int64_t d = 0; d < nd; d++) {
        int64_t l = 0;
        for (int64_t k = docs[d]; k < docs[d + 1]; k++) l += lens[k];
        total += l;
        if (l > maxlen) maxlen = l;
        if (l < minlen) minlen = l;
        int b = 0;
        while (b < 63 && (1ll << b) <= l) b++;
        hist[b]++;
    }
    int dt = idx_dtype(r);
    /* (counts are unsigned in the file; the reader bounded them by its size) */
    printf("%s\n  documents %" PRIu64 ", sequences %" PRIu64 ", tokens %" PRIu64 ", dtype %s (code %d)\n", prefix,
           (uint64_t)nd, (uint64_t)ns, (uint64_t)total, dt >= 1 && dt <= 8 ? names[dt] : "?", dt);
    if (nd)
        printf("  document length: min %lld, mean %.1f, max %lld tokens\n", (long long)minlen, (double)total / (double)nd,
               (long long)maxlen);
    printf("  length histogram (tokens per document):\n");
    int64_t peak = 1;
    for (int b = 0; b < 64; b++)
        if (hist[b] > peak) peak = hist[b];
    for (int b = 0; b < 64; b++) {
        if (!hist[b]) continue;
        char bar[41];
        int w = (int)(40.0 * (double)hist[b] / (double)peak + 0.5);
        memset(bar, '#', (size_t)w);
        bar[w] = '\0';
        if (b == 0) printf("    %10s %10d  %10lld %s\n", "0", 0, (long long)hist[b], bar);
        else printf("    %10lld %10lld  %10lld %s\n", 1ll << (b - 1), (1ll << b) - 1, (long long)hist[b], bar);
    }
    if (doc >= 0 && doc < nd) {
        int64_t n = 0;
        for (int64_t k = docs[doc]; k < docs[doc + 1]; k++) n += lens[k];
        int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
        int64_t w = 0;
        for (int64_t k = docs[doc]; ids && k < docs[doc + 1]; k++) {
            if (idx_read(r, k, 0, lens[k], ids + w)) break;
            w += lens[k];
        }
        tok_tokenizer tok;
        int have_tok = ids && !open_tokenizer(&tf, &tok);
        printf("  document %lld (%lld tokens)", doc, (long long)n);
        int64_t len = have_tok ? tok_decode(&tok, ids, (size_t)w, NULL, 0) : -1;
        if (len >= 0) {
            char *text = malloc((size_t)len + 1);
            if (text) {
                tok_decode(&tok, ids, (size_t)w, text, (size_t)len + 1);
                printf(" decoded:\n    %.*s%s\n", (int)(len < chars ? len : chars), text, len > chars ? " [...]" : "");
                free(text);
            }
        } else if (ids) {
            printf(" ids%s:\n   ", have_tok ? " (not decodable with this tokenizer)" : "");
            for (int64_t k = 0; k < w && k < chars / 4; k++) printf(" %d", (int)ids[k]);
            printf("%s\n", w > chars / 4 ? " ..." : "");
        }
        if (have_tok) tok_close(&tok);
        free(ids);
    }
    idx_close(&r);
    return CLI_OK;
}

/* cohort data verify PREFIX: the token bound is the tokenizer's vocabulary (as `cohort train`
 * resolves it: GPT-2's 50257 by default, --vocab-file's size, NullTokenizer's --vocab-size
 * + 1, ByteLevelTokenizer's 257), or --vocab-size V alone as the bound itself. */
static int data_verify(int argc, char **argv) {
    const char *prefix = NULL;
    tok_flags tf = {0};
    int vocab_given = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs("usage: cohort data verify PREFIX [--tokenizer-type T] [--vocab-size V] [--vocab-file F --merge-file M]\n"
                  "       [--tokenizer-model F] [--tiktoken-pattern v1|v2] [--tiktoken-num-special-tokens N]\n"
                  "Runs every structural check of PREFIX.idx/.bin; the exit status names the first that\n"
                  "failed: 0 ok, 2 usage, 10 .idx missing/unreadable, 11 bad header (magic, version,\n"
                  "dtype), 12 .idx size inconsistent with its counts, 13 bad sequence lengths or\n"
                  "pointers, 14 bad document index, 15 .bin missing/unreadable, 16 .bin size wrong,\n"
                  "17 a token negative or outside the vocabulary. The vocabulary is the tokenizer's, as\n"
                  "`cohort train` takes it (default GPT2BPETokenizer: 50257; --vocab-file: its size;\n"
                  "NullTokenizer --vocab-size V: V + 1; ByteLevelTokenizer: 257; --tokenizer-model: the\n"
                  "model's, docs/data.md); --vocab-size V without\n"
                  "--tokenizer-type bounds the ids to 0..V-1.\n",
                  stdout);
            return CLI_OK;
        }
        int t = tok_flag(&tf, argc, argv, &i);
        if (t < 0) {
            co_log(CO_LOG_ERROR, "%s needs a value", argv[i]);
            return CLI_USAGE;
        }
        if (t > 0) {
            if (!strcmp(argv[i - 1], "--vocab-size")) vocab_given = 1;
            continue;
        }
        if (argv[i][0] == '-' || prefix) {
            co_log(CO_LOG_ERROR, "unexpected argument '%s'", argv[i]);
            return CLI_USAGE;
        } else prefix = argv[i];
    }
    if (!prefix) {
        co_log(CO_LOG_ERROR, "give PREFIX (of PREFIX.bin/.idx)");
        return CLI_USAGE;
    }
    long long vocab;
    if (vocab_given && !tf.type) {
        if (tf.vocab_size < 1) {
            co_log(CO_LOG_ERROR, "--vocab-size must be at least 1");
            return CLI_USAGE;
        }
        vocab = tf.vocab_size;
    } else if ((!tf.type || !strcmp(tf.type, "GPT2BPETokenizer")) && !tf.vocab_file && !tf.merge_file) {
        vocab = 50257; /* GPT-2's vocabulary, as `cohort train` takes it without --vocab-file */
    } else {
        tok_tokenizer tok;
        if (open_tokenizer(&tf, &tok)) return CLI_USAGE;
        vocab = (long long)tok_vocab_size(&tok);
        tok_close(&tok);
    }
    char msg[8192];
    int rc = idxv_verify(prefix, vocab, msg, sizeof msg);
    fprintf(rc ? stderr : stdout, "%s%s\n", rc ? "cohort data verify: FAILED: " : "", msg);
    return rc;
}

int cli_data(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h") || !strcmp(argv[0], "help")) {
        data_usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? CLI_USAGE : CLI_OK;
    }
    co_log_set_prefix("cohort data %s", argv[0]);
    if (!strcmp(argv[0], "order")) return data_order(argc - 1, argv + 1);
    if (!strcmp(argv[0], "preprocess")) return data_preprocess(argc - 1, argv + 1);
    if (!strcmp(argv[0], "tokenize")) return data_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[0], "inspect")) return data_inspect(argc - 1, argv + 1);
    if (!strcmp(argv[0], "verify")) return data_verify(argc - 1, argv + 1);
    co_log_set_prefix("cohort data");
    co_log(CO_LOG_ERROR, "unknown command '%s' (known: order, preprocess, tokenize, inspect, verify)", argv[0]);
    return CLI_USAGE;
}
