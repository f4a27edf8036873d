/* placement.c - Megatron's layer placement over pipeline stages (see placement.h). */
#include "scheduler/placement.h"

#include "common/config.h"

#include "common/error.h"
#include "scheduler/schedule.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the layout string ---------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool too_long;
} sbuf;

static bool sb_put(sbuf *b, const char *src, size_t len, long long times) {
    if (times <= 0 || len == 0) return true;
    if ((long long)len * times > PP_MAX_LAYOUT || b->n + (size_t)len * (size_t)times > PP_MAX_LAYOUT) {
        b->too_long = true;
        return false;
    }
    size_t need = b->n + len * (size_t)times + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < need) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) return false;
        b->s = s;
        b->cap = cap;
    }
    for (long long t = 0; t < times; t++) {
        memcpy(b->s + b->n, src, len);
        b->n += len;
    }
    b->s[b->n] = 0;
    return true;
}

/* Reads \d+ at s[i]: the value (capped past PP_MAX_LAYOUT) and the index after the digits;
 * -1 when s[i] is not a digit. */
static long long digits(const char *s, size_t n, size_t i, size_t *end) {
    if (i >= n || !isdigit((unsigned char)s[i])) return -1;
    long long v = 0;
    while (i < n && isdigit((unsigned char)s[i])) {
        if (v <= PP_MAX_LAYOUT) v = v * 10 + (s[i] - '0');
        i++;
    }
    *end = i;
    return v;
}

/* One pass of re.sub: paren = true for r'\(([^)]+)\)\*(\d+)', else r'(.)\*(\d+)'. Every
 * match from left to right is replaced by its group repeated N times; the text between
 * matches is kept. */
static bool expand_pass(const char *s, size_t n, bool paren, sbuf *out, long long *bad_n) {
    size_t i = 0;
    while (i < n) {
        size_t body = 0, blen = 0, after = 0;
        bool match = false;
        if (paren && s[i] == '(') {
            /* [^)]+ is greedy and cannot cross ')': it ends at the first ')' */
            const char *close = memchr(s + i + 1, ')', n - i - 1);
            size_t k = close ? (size_t)(close - s) : n;
            if (close && k > i + 1 && k + 1 < n && s[k + 1] == '*' && isdigit((unsigned char)(k + 2 < n ? s[k + 2] : 0))) {
                body = i + 1;
                blen = k - i - 1;
                after = k + 2;
                match = true;
            }
        } else if (!paren && s[i] != '\n' && i + 2 < n && s[i + 1] == '*' && isdigit((unsigned char)s[i + 2])) {
            body = i;
            blen = 1;
            after = i + 2;
            match = true;
        }
        if (!match) {
            if (!sb_put(out, s + i, 1, 1)) return false;
            i++;
            continue;
        }
        size_t end = after;
        long long times = digits(s, n, after, &end);
        if (times > PP_MAX_LAYOUT) {
            *bad_n = times;
            out->too_long = true;
            return false;
        }
        if (!sb_put(out, s + body, blen, times)) return false;
        i = end;
    }
    return true;
}

int pp_layout_expand(const char *layout, char **out, int *nstages) {
    *out = NULL;
    *nstages = 0;
    size_t n = strlen(layout);
    if (n > PP_MAX_LAYOUT)
        return co_err_set(CO_EINVAL, "--pipeline-model-parallel-layout is %zu characters long, more than %d", n,
                          PP_MAX_LAYOUT);
    sbuf a = {0}, b = {0}, c = {0};
    /* commas are cosmetic */
    for (size_t i = 0; i < n; i++)
        if (layout[i] != ',' && !sb_put(&a, layout + i, 1, 1)) goto fail;
    long long bad_n = -1;
    if (!expand_pass(a.s ? a.s : "", a.n, true, &b, &bad_n) || !expand_pass(b.s ? b.s : "", b.n, false, &c, &bad_n))
        goto fail;
    if (!c.s && !(c.s = calloc(1, 1))) goto fail; /* an empty expansion */
    free(a.s);
    free(b.s);
    int ns = 1, stage = 0;
    size_t stage_start = 0;
    for (size_t i = 0; i < c.n; i++) {
        char ch = c.s[i];
        if (ch == '|') {
            ns++;
            stage++;
            stage_start = i + 1;
            continue;
        }
        if (ch == 'E' || ch == 't' || ch == 'm' || ch == 'L') continue;
        size_t stage_end = stage_start;
        while (stage_end < c.n && c.s[stage_end] != '|') stage_end++;
        char what[24];
        if (isprint((unsigned char)ch)) snprintf(what, sizeof what, "'%c'", ch);
        else snprintf(what, sizeof what, "byte 0x%02x", (unsigned char)ch);
        co_err_set(CO_EINVAL, "--pipeline-model-parallel-layout '%s': unknown layer character %s in stage %d "
                   "('%.*s'); known: E (embedding), t (decoder layer), m (MTP layer), L (loss), '|' between stages, "
                   "X*N and (...)*N repeat, commas are ignored", layout, what, stage,
                   (int)(stage_end - stage_start > 60 ? 60 : stage_end - stage_start), c.s + stage_start);
        free(c.s);
        return CO_EINVAL;
    }
    *nstages = ns;
    *out = c.s;
    return 0;
fail:;
    int rc;
    if (a.too_long || b.too_long || c.too_long) {
        if (bad_n >= 0)
            rc = co_err_set(CO_EINVAL, "--pipeline-model-parallel-layout '%s': a repetition count is larger than %d",
                            layout, PP_MAX_LAYOUT);
        else
            rc = co_err_set(CO_EINVAL, "--pipeline-model-parallel-layout '%s' expands to more than %d characters",
                            layout, PP_MAX_LAYOUT);
    } else {
        rc = co_err_set(CO_ENOMEM, "out of memory expanding --pipeline-model-parallel-layout");
    }
    free(a.s);
    free(b.s);
    free(c.s);
    return rc;
}

/* Per stage (in stage order) its counts of E, t, m, L. */
enum { K_E, K_T, K_M, K_L, K_N };

static int kind_of(char ch) { return ch == 'E' ? K_E : ch == 't' ? K_T : ch == 'm' ? K_M : K_L; }

static int *layout_counts(const char *x, int ns) {
    int *cnt = calloc((size_t)ns * K_N, sizeof *cnt);
    if (!cnt) return NULL;
    int s = 0;
    for (const char *q = x; *q; q++) {
        if (*q == '|') s++;
        else cnt[s * K_N + kind_of(*q)]++;
    }
    return cnt;
}

/* PipelineParallelLayerLayout.validate_layer_layout, in its order, and cohort's own rule
 * that E and L sit in the stages that build the embedding and the loss. */
static int layout_validate(const pp_place_cfg *c, const char *x, const int *cnt, int v) {
    int p = c->p, ns = p * v;
    const char *L = c->layout;
    char first = 0, last = 0;
    int tot[K_N] = {0};
    for (const char *q = x; *q; q++)
        if (*q != '|') {
            if (!first) first = *q;
            last = *q;
            tot[kind_of(*q)]++;
        }
#define FAIL(...) return co_err_set(CO_EINVAL, __VA_ARGS__)
    if (!first) FAIL("--pipeline-model-parallel-layout '%s' holds no layers: it must start with E and end with L", L);
    if (first != 'E') FAIL("--pipeline-model-parallel-layout '%s': the first layer must be the embedding E, not %c", L,
                           first);
    if (last != 'L') FAIL("--pipeline-model-parallel-layout '%s': the last layer must be the loss L, not %c", L, last);
    if (tot[K_E] != 1) FAIL("--pipeline-model-parallel-layout '%s': E must appear exactly once (it appears %d times)",
                            L, tot[K_E]);
    if (tot[K_L] != 1) FAIL("--pipeline-model-parallel-layout '%s': L must appear exactly once (it appears %d times)",
                            L, tot[K_L]);
    if (tot[K_T] != c->num_layers)
        FAIL("--pipeline-model-parallel-layout '%s' has %d decoder layers (t) but --num-layers is %d", L, tot[K_T],
             c->num_layers);
    if (tot[K_M] != c->mtp_num_layers)
        FAIL("--pipeline-model-parallel-layout '%s' has %d MTP layers (m) but --mtp-num-layers is %d", L, tot[K_M],
             c->mtp_num_layers);
    const char *m = strchr(x, 'm');
    if (m && strchr(m, 't'))
        FAIL("--pipeline-model-parallel-layout '%s': every decoder layer t must come before the MTP layers m", L);
    for (int r = 0; r < p; r++)
        for (int ch = 0; ch < v - 1; ch++)
            if (cnt[(ch * p + r) * K_N + K_M])
                FAIL("--pipeline-model-parallel-layout '%s': MTP layers m may only be in a rank's last chunk, but "
                     "stage %d (rank %d, chunk %d of %d) has %d", L, ch * p + r, r, ch, v, cnt[(ch * p + r) * K_N + K_M]);
    for (int r = 0; r < p; r++) {
        int k = cnt[((v - 1) * p + r) * K_N + K_M];
        if (k && k != c->mtp_num_layers)
            FAIL("--pipeline-model-parallel-layout '%s': all %d MTP layers must be in one stage, but stage %d (rank "
                 "%d, chunk %d) has %d", L, c->mtp_num_layers, (v - 1) * p + r, r, v - 1, k);
    }
    /* Megatron accepts E and L anywhere as long as they are the first and the last layer,
     * yet builds the embedding on stage 0 and the loss on the last stage whatever the
     * layout says (an empty stage before E or after L): cohort refuses such a layout. */
    if (!cnt[K_E])
        FAIL("--pipeline-model-parallel-layout '%s': E must be in stage 0 (rank 0, chunk 0), where Megatron builds the "
             "embedding whatever the layout says; a stage before it is empty", L);
    if (!cnt[(ns - 1) * K_N + K_L])
        FAIL("--pipeline-model-parallel-layout '%s': L must be in the last stage %d (rank %d, chunk %d), where Megatron "
             "computes the loss whatever the layout says; a stage after it is empty", L, ns - 1, p - 1, v - 1);
#undef FAIL
    return 0;
}

/* ---- the checks ------------------------------------------------------------------------ */

#define FAIL(...) return co_err_set(CO_EINVAL, __VA_ARGS__)

/* Everything but the layout's contents, in Megatron's order; the model chunks per rank
 * (layout: its stages / p). With a layout, *x is its expansion and *ns its stages. */
static int chunks_of(const pp_place_cfg *c, char **x, int *ns) {
    int p = c->p, L = c->num_layers;
    if (p < 1 || p > PP_MAX_RANKS) FAIL("--pipeline-model-parallel-size %d is out of range (1..%d)", p, PP_MAX_RANKS);
    if (L < 1 || L > PP_MAX_LAYERS) FAIL("--num-layers %d is out of range (1..%d)", L, PP_MAX_LAYERS);
    if (c->v < 0 || c->v > PP_MAX_CHUNKS)
        FAIL("--num-virtual-stages-per-pipeline-rank %d is out of range (1..%d)", c->v, PP_MAX_CHUNKS);
    if (c->layers_per_vstage < 0 || c->layers_per_vstage > PP_MAX_LAYERS)
        FAIL("--num-layers-per-virtual-pipeline-stage %d is out of range (1..%d)", c->layers_per_vstage, PP_MAX_LAYERS);
    if (c->mtp_num_layers < 0 || c->mtp_num_layers > PP_MAX_LAYERS)
        FAIL("--mtp-num-layers %d is out of range (0..%d)", c->mtp_num_layers, PP_MAX_LAYERS);
    if ((c->has_first && (c->first < -PP_MAX_LAYERS || c->first > PP_MAX_LAYERS)) ||
        (c->has_last && (c->last < -PP_MAX_LAYERS || c->last > PP_MAX_LAYERS)))
        FAIL("--decoder-first/last-pipeline-num-layers %d/%d are out of range", c->first, c->last);
    /* megatron/training/arguments.py */
    int given = (c->layers_per_vstage > 0) + (c->v > 0) + (c->layout != NULL);
    if (given > 1)
        FAIL("give at most one of --num-layers-per-virtual-pipeline-stage (%d), --num-virtual-stages-per-pipeline-rank "
             "(%d) and --pipeline-model-parallel-layout (%s)", c->layers_per_vstage, c->v, c->layout ? "given" : "none");
    int Lp = L + c->account_embedding + c->account_loss, v;
    if (c->layout) {
        int nstages, rc = pp_layout_expand(c->layout, x, &nstages);
        if (rc) return rc;
        *ns = nstages;
        if (nstages % p)
            FAIL("--pipeline-model-parallel-layout has %d stages, not a multiple of --pipeline-model-parallel-size %d",
                 nstages, p);
        v = nstages / p;
    } else if (c->layers_per_vstage > 0) {
        if (c->has_first || c->has_last)
            FAIL("--decoder-first/last-pipeline-num-layers with virtual stages need --num-virtual-stages-per-pipeline-"
                 "rank, not --num-layers-per-virtual-pipeline-stage");
        if (Lp % p)
            FAIL("%d layers%s are not divisible by --pipeline-model-parallel-size %d", Lp,
                 Lp != L ? " (counting the embedding/loss)" : "", p);
        if ((Lp / p) % c->layers_per_vstage)
            FAIL("%d layers per pipeline rank are not divisible by --num-layers-per-virtual-pipeline-stage %d", Lp / p,
                 c->layers_per_vstage);
        v = Lp / p / c->layers_per_vstage;
    } else if (c->v > 0) {
        v = c->v;
    } else {
        v = 1;
        if (!c->has_first && !c->has_last && Lp % p)
            FAIL("--num-layers %d%s is not divisible by --pipeline-model-parallel-size %d", L,
                 Lp != L ? " (+1 for each --account-for-*-in-pipeline-split)" : "", p);
    }
    if (v > PP_MAX_CHUNKS) FAIL("%d model chunks per pipeline rank are more than %d", v, PP_MAX_CHUNKS);
    if (v > 1 && p == 1)
        FAIL("%d model chunks per rank (virtual pipeline stages) need --pipeline-model-parallel-size greater than 1", v);
    /* TransformerConfig.__post_init__ */
    bool uneven = c->has_first || c->has_last, account = c->account_embedding || c->account_loss;
    if (uneven && account)
        FAIL("--decoder-first/last-pipeline-num-layers cannot be combined with --account-for-embedding-in-pipeline-"
             "split or --account-for-loss-in-pipeline-split");
    if (c->layout && (uneven || account))
        FAIL("--pipeline-model-parallel-layout cannot be combined with --decoder-first/last-pipeline-num-layers or "
             "--account-for-*-in-pipeline-split");
    if (c->layout) return v;
    if (uneven) {
        int mid = L, stages = p;
        if (c->has_first) {
            if (c->first <= 0) FAIL("--decoder-first-pipeline-num-layers %d must be larger than 0", c->first);
            if (c->first % v)
                FAIL("--decoder-first-pipeline-num-layers %d is not divisible by the %d model chunks per rank", c->first,
                     v);
            mid -= c->first;
            stages--;
        }
        if (c->has_last) {
            if (c->last <= 0) FAIL("--decoder-last-pipeline-num-layers %d must be larger than 0", c->last);
            if (c->last % v)
                FAIL("--decoder-last-pipeline-num-layers %d is not divisible by the %d model chunks per rank", c->last, v);
            mid -= c->last;
            stages--;
        }
        /* cohort's: Megatron takes these and builds a negative number of layers somewhere */
        if (stages < 0)
            FAIL("--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers together need "
                 "--pipeline-model-parallel-size 2 or more (it is %d)", p);
        if (mid < 0)
            FAIL("--decoder-first/last-pipeline-num-layers (%d + %d) exceed --num-layers %d",
                 c->has_first ? c->first : 0, c->has_last ? c->last : 0, L);
        if ((mid != 0) != (stages != 0))
            FAIL("%d decoder layers are left for %d middle pipeline ranks (--num-layers %d, "
                 "--decoder-first/last-pipeline-num-layers %d/%d): both must be zero or both positive", mid, stages, L,
                 c->has_first ? c->first : 0, c->has_last ? c->last : 0);
        if (stages && mid % stages)
            FAIL("the %d decoder layers of the %d middle pipeline ranks are not divisible among them", mid, stages);
        if (stages && (mid / stages) % v)
            FAIL("%d decoder layers per middle pipeline rank are not divisible by the %d model chunks per rank",
                 mid / stages, v);
        return v;
    }
    /* even split, with or without the embedding/loss counted (TransformerConfig, then
     * get_num_layers_to_build's asserts) */
    if (Lp % p)
        FAIL("--num-layers %d%s is not divisible by --pipeline-model-parallel-size %d", L,
             Lp != L ? " (+1 for each --account-for-*-in-pipeline-split)" : "", p);
    if ((Lp / p) % v)
        FAIL("%d layers per pipeline rank%s are not divisible by the %d model chunks per rank", Lp / p,
             account ? " (counting the embedding/loss)" : "", v);
    /* the stage holding the embedding (loss) builds one decoder layer fewer: Megatron asserts
     * it has one to spare ("Not enough layers in the first/last virtual pipeline stage") */
    int per = Lp / p / v, single = p == 1 && v == 1;
    if (per - c->account_embedding - (single ? c->account_loss : 0) < 0 || per - c->account_loss < 0)
        FAIL("%d layers per stage leave no room for the embedding/loss counted as a layer", per);
    return v;
}

int pp_place_chunks(const pp_place_cfg *c) {
    int ns = 0;
    char *x = NULL;
    int v = chunks_of(c, &x, &ns);
    if (v > 0 && x) {
        int *cnt = layout_counts(x, ns);
        if (!cnt) {
            free(x);
            return co_err_set(CO_ENOMEM, "the pipeline's layout: out of memory");
        }
        int rc = layout_validate(c, x, cnt, v);
        free(cnt);
        if (rc) v = rc;
    }
    free(x);
    return v;
}

#undef FAIL

/* ---- the placement ---------------------------------------------------------------------- */

int pp_placement(const pp_place_cfg *c, pp_stage *st, int cap, int *vout) {
    int v = pp_place_chunks(c);
    if (v < 0) return v;
    int p = c->p, L = c->num_layers;
    *vout = v;
    if (cap < p * v) return co_err_set(CO_ERANGE, "room for %d stages, the placement has %d", cap, p * v);
    memset(st, 0, sizeof *st * (size_t)p * (size_t)v);
    if (c->layout) {
        /* PipelineParallelLayerLayout.get_num_layers_to_build / get_layer_offset: a stage's
         * offset is the t's of every stage before it in stage order */
        int ns;
        char *x;
        int rc = pp_layout_expand(c->layout, &x, &ns);
        if (rc) return rc;
        int *cnt = layout_counts(x, ns);
        free(x);
        if (!cnt) return co_err_set(CO_ENOMEM, "the pipeline's placement: out of memory");
        int off = 0;
        for (int i = 0; i < ns; i++) {
            pp_stage *s = &st[(i % p) * v + i / p];
            s->first_layer = off;
            s->num_layers = cnt[i * K_N + K_T];
            s->mtp_layers = cnt[i * K_N + K_M];
            off += s->num_layers;
        }
        free(cnt);
    } else if (c->has_first || c->has_last) {
        int fl = c->has_first ? c->first : 0, ll = c->has_last ? c->last : 0;
        int mid = L - fl - ll, mstages = p - c->has_first - c->has_last;
        for (int r = 0; r < p; r++) {
            /* get_num_layers_to_build */
            int per = mstages > 0 ? mid / mstages : 0;
            if (r == 0 && c->has_first) per = c->first;
            if (r == p - 1 && c->has_last) per = c->last;
            int mrank = c->has_first ? r - 1 : r;
            for (int ch = 0; ch < v; ch++) {
                pp_stage *s = &st[r * v + ch];
                s->num_layers = per / v;
                /* get_transformer_layer_offset */
                if (p == 1) s->first_layer = 0;
                else if (v > 1) {
                    int fc = fl / v, lc = ll / v, mc = mid / v, total = fc + mc + lc;
                    /* Megatron divides by the middle ranks even when there are none (p = 2 with
                     * both counts given: ZeroDivisionError); their term is 0 */
                    s->first_layer = r == 0 ? ch * total : ch * total + fc + (mstages ? mrank * (mc / mstages) : 0);
                } else {
                    int per_mid = mstages > 0 ? mid / mstages : 0;
                    s->first_layer = r == 0 ? 0 : mrank * per_mid + fl;
                }
            }
        }
    } else {
        int Lp = L + c->account_embedding + c->account_loss, per_rank = Lp / p, per = per_rank / v;
        for (int r = 0; r < p; r++)
            for (int ch = 0; ch < v; ch++) {
                pp_stage *s = &st[r * v + ch];
                bool first = r == 0 && ch == 0, last = r == p - 1 && ch == v - 1;
                s->num_layers = per - (c->account_embedding && first) - (c->account_loss && last);
                if (p == 1) s->first_layer = 0;
                else s->first_layer = (v > 1 ? ch * (Lp / v) + r * per : r * per_rank) - (c->account_embedding && !first);
            }
    }
    if (!c->layout && c->mtp_num_layers) st[(p - 1) * v + v - 1].mtp_layers = c->mtp_num_layers;
    st[0].embedding = true;
    st[(p - 1) * v + v - 1].loss = true;
    /* the stages, in stage order, hold layers 0..L-1 one after the other */
    int next = 0;
    for (int i = 0; i < p * v; i++) {
        const pp_stage *s = &st[(i % p) * v + i / p];
        if (s->first_layer != next || s->num_layers < 0)
            return co_err_set(CO_EINTERNAL, "internal: stage %d (rank %d, chunk %d) starts at layer %d with %d layers, "
                                            "expected to start at %d", i, i % p, i / p, s->first_layer, s->num_layers,
                              next);
        next += s->num_layers;
    }
    if (next != L) return co_err_set(CO_EINTERNAL, "internal: the stages hold %d layers, --num-layers is %d", next, L);
    return 0;
}

void pp_place_from_config(const co_config *c, pp_place_cfg *out) {
    *out = (pp_place_cfg){
        .p = c->pipeline_model_parallel_size, .num_layers = c->num_layers,
        .v = c->virtual_pipeline_model_parallel_size ? c->virtual_pipeline_model_parallel_size
                                                     : c->num_virtual_stages_per_pipeline_rank,
        .layers_per_vstage = c->num_layers_per_virtual_pipeline_stage,
        .has_first = co_config_was_set(c, "decoder-first-pipeline-num-layers"),
        .has_last = co_config_was_set(c, "decoder-last-pipeline-num-layers"),
        .first = c->decoder_first_pipeline_num_layers, .last = c->decoder_last_pipeline_num_layers,
        .account_embedding = c->account_for_embedding_in_pipeline_split,
        .account_loss = c->account_for_loss_in_pipeline_split,
        .layout = c->pipeline_model_parallel_layout[0] ? c->pipeline_model_parallel_layout : NULL,
        .mtp_num_layers = c->mtp_num_layers};
}

int pp_mtp_rank(const pp_stage *st, int p, int v) {
    for (int r = 0; r < p; r++)
        for (int c = 0; c < v; c++)
            if (st[r * v + c].mtp_layers > 0) return r;
    return -1;
}

unsigned long long pp_embedding_stages(const pp_stage *st, int p, int v, bool tied) {
    int r = pp_mtp_rank(st, p, v);
    if (r < 0 || r == p - 1 || p > 64) return 0;
    unsigned long long mask = 1ull | 1ull << r;
    if (tied) mask |= 1ull << (p - 1);
    return mask;
}

unsigned long long pp_embedding_stages_of_config(const co_config *c) {
    int p = c->pipeline_model_parallel_size;
    if (p < 2 || c->mtp_num_layers <= 0 || c->standin_model_parallel) return 0;
    pp_place_cfg pc;
    pp_place_from_config(c, &pc);
    int v = pp_place_chunks(&pc);
    if (v < 1) return 0;
    pp_stage *st = calloc((size_t)p * (size_t)v, sizeof *st);
    unsigned long long mask = 0;
    if (st && !pp_placement(&pc, st, p * v, &v))
        mask = pp_embedding_stages(st, p, v, !c->untie_embeddings_and_output_weights);
    free(st);
    return mask;
}
