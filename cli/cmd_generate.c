/* cmd_generate.c - `cohort generate`: text from a trained model (Megatron's text generation
 * as a command). Loads a checkpoint of any parallel layout into one process (every tensor
 * read whole, the padded vocabulary resized as --load does), the model's flags from the
 * checkpoint's recorded arguments (as --use-checkpoint-args), and extends each prompt with
 * the KV-cache forward (model/gpt_infer.h): greedy, or sampled with temperature, top-k and
 * top-p from a seeded generator, until the end-of-document token or --max-new-tokens. */
#include "cli/cli.h"

#include "checkpoint/ckpt.h"
#include "checkpoint/store.h"
#include "common/error.h"
#include "common/log.h"
#include "common/rng.h"
#include "data/tokenizer.h"
#include "model/gpt_check.h"
#include "model/gpt_infer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct gen_opts {
    const char *load;
    int64_t iteration;        /* -1: the tracker's */
    const char **prompts;
    int nprompts;
    int max_new;
    double temperature;       /* 0: greedy */
    int top_k;                /* 0: every token */
    double top_p;             /* 0 or 1: every token */
    uint64_t seed;
    int threads;
    const char *tokenizer_model; /* --tokenizer-model: overrides the recorded path */
    int bf16;                 /* -1: as the checkpoint trained, 0 fp32, 1 bf16 */
    bool json, check_kv;
} gen_opts;

/* One prompt's ids, then its generated ones (EOD included when it stopped there). */
typedef struct gen_seq {
    int32_t *ids;
    int nprompt, n, cap;
    double seconds, prefill_s; /* its generation, and the prompt's prefill in it */
} gen_seq;

typedef struct gen_ctx {
    gen_opts o;
    tok_tokenizer tok;
    bool have_tok;
    co_config cfg;
    ck_manifest *man;
    char dir[4200];
    kb_backend *be;
    gpt_model *model;
    gpt_kv *kv;
    double *p;                /* [vocab] sampling weights */
    int32_t *order;           /* [vocab] ids by weight (top-k, top-p) */
    float *check;             /* --check-kv: the cache's logits of every position [cap][Vp] */
} gen_ctx;

static void generate_usage(FILE *f) {
    fputs("usage: cohort generate --load DIR [flags]\n"
          "\n"
          "Text from a trained model: each prompt extended one token at a time (KV cache), the\n"
          "text on stdout (prompt and continuation), tokens per second on stderr. The checkpoint\n"
          "may be of any parallel layout; the model and tokenizer are the checkpoint's own.\n"
          "\n"
          "  --load DIR              checkpoint directory (a --save directory)\n"
          "  --iteration N           that iteration (default: the latest)\n"
          "  --prompt TEXT           a prompt (repeatable); without any, one prompt per line of\n"
          "                          standard input (NullTokenizer: space-separated ids)\n"
          "  --max-new-tokens N      at most N new tokens per prompt (default 64); stops earlier\n"
          "                          after the end-of-document token\n"
          "  --greedy                the most likely token each step (as --temperature 0)\n"
          "  --temperature T         sampling temperature (default 1.0)\n"
          "  --top-k K               sample among the K most likely tokens (default 0: all)\n"
          "  --top-p P               sample among the most likely tokens whose probabilities\n"
          "                          sum to P (default 0: all)\n"
          "  --seed S                the sampler's seed (default 1234); prompt i uses S + i\n"
          "  --json                  one JSON object per prompt: text, prompt and generated ids,\n"
          "                          seconds\n"
          "  --bf16 | --fp32         matrix products in bf16 or fp32 (default: as it trained)\n"
          "  --threads N             CPU threads (default: all cores)\n"
          "  --tokenizer-model FILE  the SentencePiece model or TikTokenizer ranks file, where it is\n"
          "                          no longer at the path the training run recorded\n",
          f);
}

/* ---- flags ---------------------------------------------------------------------------- */

static bool parse_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* One flag with a value at argv[*i]; false with the error logged. */
static bool value_flag(gen_opts *o, const char *f, const char *v) {
    long long n;
    double d;
    if (!strcmp(f, "--load")) o->load = v;
    else if (!strcmp(f, "--iteration") && parse_int(v, 0, INT64_MAX, &n)) o->iteration = n;
    else if (!strcmp(f, "--prompt")) o->prompts[o->nprompts++] = v;
    else if (!strcmp(f, "--max-new-tokens") && parse_int(v, 1, 1 << 20, &n)) o->max_new = (int)n;
    else if (!strcmp(f, "--temperature") && parse_num(v, 0, 1e6, &d)) o->temperature = d;
    else if (!strcmp(f, "--top-k") && parse_int(v, 0, 1 << 30, &n)) o->top_k = (int)n;
    else if (!strcmp(f, "--top-p") && parse_num(v, 0, 1, &d)) o->top_p = d;
    else if (!strcmp(f, "--seed") && parse_int(v, 0, INT64_MAX, &n)) o->seed = (uint64_t)n;
    else if (!strcmp(f, "--threads") && parse_int(v, 1, 4096, &n)) o->threads = (int)n;
    else if (!strcmp(f, "--tokenizer-model") && *v) o->tokenizer_model = v;
    else {
        co_log(CO_LOG_ERROR, "%s %s: not a valid value (cohort generate --help lists the flags and their ranges)", f, v);
        return false;
    }
    return true;
}

static const char *const value_flags[] = {"--load", "--iteration", "--prompt", "--max-new-tokens", "--temperature",
                                          "--top-k", "--top-p", "--seed", "--threads", "--tokenizer-model", NULL};

/* CLI_OK, CLI_USAGE, or -1 for --help (printed). */
static int parse_flags(gen_opts *o, int argc, char **argv) {
    *o = (gen_opts){.iteration = -1, .max_new = 64, .temperature = 1.0, .seed = 1234, .bf16 = -1};
    if (!(o->prompts = calloc((size_t)argc + 1, sizeof *o->prompts))) return CLI_FAILURE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool takes = false;
        for (int k = 0; value_flags[k] && !takes; k++) takes = !strcmp(a, value_flags[k]);
        if (takes) {
            if (i + 1 >= argc) {
                co_log(CO_LOG_ERROR, "%s needs a value (cohort generate --help)", a);
                return CLI_USAGE;
            }
            if (!value_flag(o, a, argv[++i])) return CLI_USAGE;
        } else if (!strcmp(a, "--greedy")) o->temperature = 0;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--bf16")) o->bf16 = 1;
        else if (!strcmp(a, "--fp32")) o->bf16 = 0;
        else if (!strcmp(a, "--check-kv")) o->check_kv = true; /* tests: the cache against full forwards */
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            generate_usage(stdout);
            return -1;
        } else {
            co_log(CO_LOG_ERROR, "unknown argument '%s' (cohort generate --help lists the flags)", a);
            return CLI_USAGE;
        }
    }
    if (!o->load || !*o->load) {
        co_log(CO_LOG_ERROR, "--load DIR is required: the checkpoint to generate from");
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* ---- the checkpoint, its flags and tokenizer ------------------------------------------ */

static int open_checkpoint(gen_ctx *g) {
    int64_t *its = NULL;
    int n = 0;
    int rc = ck_candidates(g->o.load, g->o.iteration, &its, &n);
    bool found = !rc && n > 0 && (g->o.iteration < 0 || its[0] == g->o.iteration);
    struct stat st;
    if (found) ck_iter_dir(g->dir, sizeof g->dir, g->o.load, its[0]);
    found = found && !stat(g->dir, &st) && S_ISDIR(st.st_mode);
    if (!found) {
        free(its);
        if (g->o.iteration >= 0)
            return co_err_set(CO_ENOENT, "--load %s has no checkpoint at --iteration %lld", g->o.load,
                              (long long)g->o.iteration);
        return co_err_set(CO_ENOENT, "--load %s: no checkpoint there (a --save directory of cohort train)",
                          g->o.load);
    }
    free(its);
    rc = ck_read_manifest(g->dir, &g->man);
    if (rc) return co_err_set(rc, "%s: %s", g->dir, co_err_detail());
    co_config_defaults(&g->cfg);
    rc = co_config_read_json(&g->cfg, json_object_get(g->man->doc, "config"), NULL, NULL, NULL);
    if (rc) return co_err_set(rc, "%s: the recorded flags: %s", g->dir, co_err_detail());
    return 0;
}

static int open_tokenizer(gen_ctx *g) {
    co_config *c = &g->cfg;
    if (g->o.tokenizer_model) {
        if (strlen(g->o.tokenizer_model) >= sizeof c->tokenizer_model)
            return co_err_set(CO_EINVAL, "--tokenizer-model: the path is too long");
        strcpy(c->tokenizer_model, g->o.tokenizer_model);
    }
    int rc = tok_open_config(&g->tok, c);
    if (rc) return co_err_set(rc, "the checkpoint's tokenizer %s: %s", c->tokenizer_type, co_err_detail());
    g->have_tok = true;
    if (tok_vocab_size(&g->tok) != g->man->model.vocab)
        return co_err_set(CO_EINVAL, "the tokenizer %s has %lld ids, the checkpoint's model %d", c->tokenizer_type,
                          (long long)tok_vocab_size(&g->tok), g->man->model.vocab);
    return 0;
}

/* A prompt's ids (an empty prompt starts from the end-of-document token). */
static int encode_prompt(gen_ctx *g, int i, const char *text, gen_seq *s) {
    size_t len = strlen(text);
    int64_t n = tok_encode(&g->tok, text, len, NULL, 0);
    if (n < 0) return co_err_set((int)n, "prompt %d: %s", i + 1, co_err_detail());
    s->cap = (int)(n > 0 ? n : 1) + g->o.max_new;
    if (!(s->ids = malloc((size_t)s->cap * sizeof(int32_t)))) return co_err_set(CO_ENOMEM, "out of memory");
    if (n == 0) s->ids[0] = tok_eod(&g->tok), n = 1;
    else if (tok_encode(&g->tok, text, len, s->ids, (size_t)n) != n)
        return co_err_set(CO_EINVAL, "prompt %d: the tokenizer disagrees with itself", i + 1);
    s->nprompt = s->n = (int)n;
    return 0;
}

/* Prompts from --prompt, else standard input's lines. */
static int read_prompts(gen_ctx *g, gen_seq **seqs, int *nseq) {
    char **lines = NULL, *line = NULL;
    size_t cap = 0;
    int n = 0, rc = 0;
    if (!g->o.nprompts) {
        ssize_t len;
        while ((len = getline(&line, &cap, stdin)) >= 0) {
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
            char **nl = realloc(lines, sizeof *lines * (size_t)(n + 1));
            if (!nl || !(nl[n] = strdup(line))) {
                lines = nl ? nl : lines;
                rc = co_err_set(CO_ENOMEM, "out of memory");
                break;
            }
            lines = nl;
            n++;
        }
        free(line);
        if (!rc && !n) rc = co_err_set(CO_EINVAL, "no prompt: give --prompt TEXT or lines on standard input");
    } else {
        n = g->o.nprompts;
    }
    *nseq = n;
    *seqs = rc ? NULL : calloc((size_t)(n ? n : 1), sizeof **seqs);
    if (!rc && !*seqs) rc = co_err_set(CO_ENOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) rc = encode_prompt(g, i, lines ? lines[i] : g->o.prompts[i], &(*seqs)[i]);
    for (int i = 0; lines && i < n; i++) free(lines[i]);
    free(lines);
    return rc;
}

/* ---- the model -------------------------------------------------------------------------- */

/* The model the checkpoint holds, whole on one process: shapes from its manifest, the MoE
 * settings from its flags (experts all here), no MTP depths (the main head decides). */
static void model_config(const gen_ctx *g, gpt_config *m) {
    const ck_model_info *mi = &g->man->model;
    const co_config *c = &g->cfg;
    *m = (gpt_config){.num_layers = mi->num_layers, .hidden = mi->hidden, .heads = mi->heads,
                      .kv_groups = mi->kv_groups, .head_dim = mi->head_dim, .ffn_hidden = mi->ffn_hidden,
                      .vocab = mi->vocab, .padded_vocab = gpt_padded_vocab(mi->vocab, c->make_vocab_size_divisible_by),
                      .max_positions = mi->max_positions, .rope = mi->rope, .rotary_base = (float)mi->rotary_base,
                      .rmsnorm = mi->rmsnorm, .norm_1p = mi->norm_1p, .norm_eps = (float)mi->norm_eps, .swiglu = mi->swiglu,
                      .tied = mi->tied, .bias = mi->bias, .init_std = 0.02f, .tp = 1};
    if (c->num_experts <= 0) return;
    gpt_moe_of(c, mi->ffn_hidden, &m->moe);
    /* (no loss here; sinkhorn routing chooses by its activation outside training) */
    moe_config *mc = &m->moe;
    mc->lb = mc->lb == MOE_LB_SINKHORN ? MOE_LB_SINKHORN : MOE_LB_NONE;
    mc->aux_coeff = mc->z_coeff = 0;
    mc->ep_size = mc->etp_size = 1;
    gpt_moe_layers_of(c, m);
}

/* The model's tensor t from the checkpoint's global tensor buf (Vc rows when a vocabulary
 * tensor: rows below both sizes kept, new rows copies of the last, as --load). */
static void fill_tensor(float *dst, const gpt_tensor *t, const ck_mtensor *mt, const float *buf) {
    size_t cols = t->ndim == 2 ? (size_t)t->gshape[1] : 1;
    if (!gpt_tensor_is_vocab(t->name)) {
        memcpy(dst, buf, t->numel * sizeof(float));
        return;
    }
    int64_t Vc = mt->shape[0];
    for (int64_t r = 0; r < t->gshape[0]; r++)
        memcpy(dst + (size_t)r * cols, buf + (size_t)(r < Vc ? r : Vc - 1) * cols, cols * sizeof(float));
}

/* Every model tensor from the checkpoint, read whole whatever its layout (verified). */
static int load_weights(gen_ctx *g) {
    float **bufs = NULL;
    ck_bad bad = CK_OK;
    int rc = ck_read_all(g->dir, g->man, 1 << CK_KIND_MODEL, &bufs, &bad);
    if (rc) return co_err_set(rc, "%s: %s", g->dir, co_err_detail());
    const gpt_tensor *ts = gpt_tensors(g->model);
    float *params = gpt_params(g->model);
    for (int i = 0; i < gpt_num_tensors(g->model) && !rc; i++) {
        const gpt_tensor *t = &ts[i];
        const ck_mtensor *mt = ck_manifest_find(g->man, t->name);
        int k = mt ? (int)(mt - g->man->tensors) : -1;
        bool vocab = gpt_tensor_is_vocab(t->name);
        int64_t want = t->ndim == 2 ? (int64_t)t->gshape[1] : 1, have = mt && mt->ndim == 2 ? mt->shape[1] : 1;
        if (!mt || !bufs[k])
            rc = co_err_set(CO_EINVAL, "%s: the checkpoint has no tensor %s", g->dir, t->name);
        else if (mt->ndim != t->ndim || want != have || (!vocab && mt->shape[0] != t->gshape[0]))
            rc = co_err_set(CO_EINVAL, "%s: tensor %s's shape is not the model's", g->dir, t->name);
        else
            fill_tensor(params + t->offset, t, mt, bufs[k]);
    }
    ck_free_all(g->man, &bufs);
    if (!rc) gpt_sync_bf16(g->model);
    return rc;
}

/* bf16 where asked, or where the model trained in bf16 and this CPU has the instructions. */
static bool want_bf16(const gen_ctx *g) {
    if (g->o.bf16 >= 0) return g->o.bf16 == 1;
    if (!g->cfg.bf16) return false;
    char why[300];
    if (kb_cpu_bf16_check(why, sizeof why) == 1) return true;
    co_log(CO_LOG_WARN, "the model trained in bf16; generating in fp32 here (%s)", why);
    return false;
}

static int build_model(gen_ctx *g, int max_T) {
    gpt_config mc;
    model_config(g, &mc);
    if (!mc.rope && max_T > mc.max_positions)
        return co_err_set(CO_EINVAL, "a prompt and --max-new-tokens %d need %d positions, the model has %d: shorten "
                                     "the prompt or lower --max-new-tokens", g->o.max_new, max_T, mc.max_positions);
    char why[300], isa[200];
    if (g->o.bf16 == 1 && kb_cpu_bf16_check(why, sizeof why) != 1) {
        kb_cpu_describe_isa(isa, sizeof isa);
        return co_err_set(CO_EINVAL, "--bf16: this CPU (%s) has no bf16 matrix instructions (AVX512-BF16 or AMX); "
                                     "generate without --bf16 (fp32)", isa);
    }
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = g->o.threads, .bf16 = want_bf16(g)};
    int rc = kb_backend_new(&g->be, &bo);
    if (rc) return co_err_set(rc, "%s", co_err_detail());
    if ((rc = gpt_new(&g->model, &mc, g->be, 1, max_T))) return rc;
    if ((rc = load_weights(g))) return rc;
    if ((rc = gpt_kv_new(&g->kv, g->model, max_T))) return rc;
    size_t V = (size_t)mc.vocab;
    g->p = malloc(V * sizeof *g->p);
    g->order = malloc(V * sizeof *g->order);
    if (g->o.check_kv) g->check = malloc((size_t)max_T * (size_t)mc.padded_vocab * sizeof(float));
    if (!g->p || !g->order || (g->o.check_kv && !g->check)) return co_err_set(CO_ENOMEM, "out of memory");
    return 0;
}

/* ---- sampling --------------------------------------------------------------------------- */

static const double *g_sort_p;
static int by_weight(const void *a, const void *b) {
    double x = g_sort_p[*(const int32_t *)a], y = g_sort_p[*(const int32_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The next token from the logits of the real vocabulary (padding never chosen): the first
 * most likely (greedy), or a draw from the tempered softmax cut to top-k / top-p. */
static int32_t pick_token(gen_ctx *g, const float *logits, co_rng *r) {
    int V = g->man->model.vocab;
    if (g->o.temperature <= 0) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        return best;
    }
    double mx = -INFINITY, *p = g->p;
    for (int v = 0; v < V; v++) mx = fmax(mx, logits[v] / g->o.temperature);
    for (int v = 0; v < V; v++) p[v] = exp(logits[v] / g->o.temperature - mx);
    int n = V;
    bool cut = (g->o.top_k > 0 && g->o.top_k < V) || (g->o.top_p > 0 && g->o.top_p < 1);
    if (cut) {
        for (int v = 0; v < V; v++) g->order[v] = v;
        g_sort_p = p;
        qsort(g->order, (size_t)V, sizeof *g->order, by_weight);
        if (g->o.top_k > 0 && g->o.top_k < n) n = g->o.top_k;
        if (g->o.top_p > 0 && g->o.top_p < 1) {
            double total = 0, acc = 0;
            for (int i = 0; i < n; i++) total += p[g->order[i]];
            for (int i = 0; i < n; i++)
                if ((acc += p[g->order[i]]) >= g->o.top_p * total) {
                    n = i + 1;
                    break;
                }
        }
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += p[cut ? g->order[i] : i];
    double u = co_rng_uniform(r) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        int v = cut ? g->order[i] : i;
        if (u < (acc += p[v])) return v;
    }
    return cut ? g->order[n - 1] : n - 1;
}

/* ---- generation ------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Extends one prompt: prefill, then one position per new token. *prefill_s: the prefill's
 * seconds. With --check-kv each position's logits are kept in g->check. */
static int extend(gen_ctx *g, gen_seq *s, uint64_t seed, double *prefill_s) {
    int Vp = gpt_get_config(g->model)->padded_vocab;
    co_rng r;
    co_rng_seed(&r, seed);
    gpt_kv_reset(g->kv);
    const float *lg;
    double t0 = now_s();
    int rc = gpt_kv_step(g->kv, s->ids, s->n, g->o.check_kv, &lg);
    *prefill_s = now_s() - t0;
    if (!rc && g->o.check_kv) memcpy(g->check, lg, (size_t)s->n * Vp * sizeof(float)), lg += (size_t)(s->n - 1) * Vp;
    for (int k = 0; !rc && k < g->o.max_new; k++) {
        int32_t id = pick_token(g, lg, &r);
        s->ids[s->n++] = id;
        if (id == tok_eod(&g->tok) || k + 1 == g->o.max_new) break;
        rc = gpt_kv_step(g->kv, &id, 1, false, &lg);
        if (!rc && g->o.check_kv) memcpy(g->check + (size_t)(s->n - 1) * Vp, lg, (size_t)Vp * sizeof(float));
    }
    return rc;
}

/* --check-kv: a full forward over the sequence (but its last token, whose logits were never
 * computed) against the cache's logits at every position; the largest difference on stderr,
 * CO_EINTERNAL past 1e-4 x (1 + the largest |logit|). */
static int check_kv(gen_ctx *g, const gen_seq *s) {
    int T = s->n - 1 > s->nprompt ? s->n - 1 : s->nprompt, Vp = gpt_get_config(g->model)->padded_vocab;
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    float *mask = calloc((size_t)T, sizeof *mask);
    if (!pos || !mask) {
        free(pos), free(mask);
        return co_err_set(CO_ENOMEM, "out of memory");
    }
    for (int t = 0; t < T; t++) pos[t] = t;
    gpt_batch b = {.B = 1, .T = T, .tokens = s->ids, .targets = s->ids, .positions = pos, .loss_mask = mask};
    gpt_forward(g->model, &b, false, 0, NULL, NULL);
    double worst = 0, big = 0;
    for (int t = 0; t < T; t++) {
        const float *full = gpt_last_logits(g->model, 0, t), *kv = g->check + (size_t)t * Vp;
        for (int v = 0; v < Vp; v++) {
            worst = fmax(worst, fabs((double)full[v] - kv[v]));
            big = fmax(big, fabs((double)full[v]));
        }
    }
    free(pos), free(mask);
    int rc = gpt_backend(g->model)->status;
    if (rc) return rc;
    double tol = 1e-4 * (1 + big);
    co_log(CO_LOG_INFO, "check-kv: %d positions, max |KV-cache logit - full forward logit| %.3g (tolerance %.3g): %s",
           T, worst, tol, worst <= tol ? "ok" : "DIFFERENT");
    return worst <= tol ? 0 : co_err_set(CO_EINTERNAL, "the KV-cache logits differ from the full forward's by %.3g",
                                         worst);
}

static void print_ids(FILE *f, const int32_t *ids, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", (int)ids[i]);
    fputc(']', f);
}

/* The text (prompt and continuation, a final end-of-document token left out), or with --json
 * one object: text, prompt_ids, ids (the generated ones), seconds (the prompt's generation,
 * prefill included) and prefill_seconds. */
static int print_seq(gen_ctx *g, const gen_seq *s) {
    int n = s->n;
    if (n > s->nprompt && s->ids[n - 1] == tok_eod(&g->tok)) n--;
    int64_t len = tok_decode(&g->tok, s->ids, (size_t)n, NULL, 0);
    char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (!text || tok_decode(&g->tok, s->ids, (size_t)n, text, (size_t)len + 1) < 0) {
        free(text);
        return co_err_set(CO_EINVAL, "the generated ids do not decode: %s", co_err_detail());
    }
    if (!g->o.json) {
        printf("%s\n", text);
    } else {
        fputs("{\"text\":", stdout);
        co_json_str(stdout, text);
        fputs(",\"prompt_ids\":", stdout);
        print_ids(stdout, s->ids, s->nprompt);
        fputs(",\"ids\":", stdout);
        print_ids(stdout, s->ids + s->nprompt, s->n - s->nprompt);
        printf(",\"seconds\":%.6f,\"prefill_seconds\":%.6f}\n", s->seconds, s->prefill_s);
    }
    fflush(stdout);
    free(text);
    return 0;
}

static int run(gen_ctx *g) {
    gen_seq *seqs = NULL;
    int n = 0, rc = open_checkpoint(g);
    if (!rc) rc = open_tokenizer(g);
    if (!rc) rc = read_prompts(g, &seqs, &n);
    int max_T = 0;
    for (int i = 0; i < n && !rc; i++) max_T = seqs[i].cap > max_T ? seqs[i].cap : max_T;
    if (!rc) rc = build_model(g, max_T);
    double pre = 0, total = 0;
    long long new_tokens = 0, prompt_tokens = 0;
    for (int i = 0; i < n && !rc; i++) {
        double t0 = now_s();
        rc = extend(g, &seqs[i], g->o.seed + (uint64_t)i, &seqs[i].prefill_s);
        seqs[i].seconds = now_s() - t0;
        total += seqs[i].seconds;
        pre += seqs[i].prefill_s;
        new_tokens += seqs[i].n - seqs[i].nprompt;
        prompt_tokens += seqs[i].nprompt;
        if (!rc && g->o.check_kv) rc = check_kv(g, &seqs[i]);
        if (!rc) rc = print_seq(g, &seqs[i]);
    }
    if (!rc)
        co_log(CO_LOG_INFO, "%lld new tokens in %.3f s: %.2f tokens/s (%s; %lld prompt tokens prefilled in %.3f s, then "
                            "%.2f tokens/s)", new_tokens, total, total > 0 ? (double)new_tokens / total : 0,
               gpt_params_bf16(g->model) ? "bf16" : "fp32", prompt_tokens, pre,
               total - pre > 0 ? (double)(new_tokens - n) / (total - pre) : 0);
    for (int i = 0; seqs && i < n; i++) free(seqs[i].ids);
    free(seqs);
    return rc;
}

int cli_generate(int argc, char **argv) {
    co_log_set_prefix("cohort generate");
    gen_ctx g = {0};
    int rc = parse_flags(&g.o, argc, argv);
    if (rc) {
        free(g.o.prompts);
        return rc < 0 ? CLI_OK : rc;
    }
    rc = run(&g);
    if (rc) co_log(CO_LOG_ERROR, "%s", co_err_detail());
    gpt_kv_destroy(&g.kv);
    gpt_destroy(&g.model);
    if (g.be) kb_backend_destroy(&g.be);
    if (g.have_tok) tok_close(&g.tok);
    if (g.man) ck_manifest_free(&g.man);
    co_config_free(&g.cfg);
    free(g.p), free(g.order), free(g.check), free(g.o.prompts);
    if (!rc) return CLI_OK;
    return rc == CO_EINVAL || rc == CO_ENOENT ? CLI_USAGE : CLI_FAILURE;
}
