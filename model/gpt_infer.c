/* gpt_infer.c - the inference forward with a key/value cache (gpt_infer.h).
 *
 * One step over n new tokens at positions p0 .. p0+n-1 (p0 = the cached length), per layer l:
 *   h = norm1(x); qkv = h Wqkv^T + b; rope(q, k at their positions)
 *   K[l][p0..], V[l][p0..] = this step's keys and values
 *   a_i = softmax(q_i K[l][0..p0+i]^T / sqrt(HD)) V[l][0..p0+i]   (causal over the cache)
 *   x = x + a Wproj^T + b; h2 = norm2(x); x = x + mlp(h2) (or the MoE layer)
 * then the final norm and the output layer on the rows asked for. Every step is what the
 * training forward computes for those rows with dropout off (gpt_step.c), with its kernels
 * and the model's own buffers (the one chunk's activation slot, layer by layer). */
#include "model/gpt_infer.h"

#include "common/error.h"
#include "model/gpt_internal.h"

#include <math.h>
#include <stdlib.h>

struct gpt_kv {
    gpt_model *m;
    int cap, len;
    size_t kvw;        /* NKV * HD: one position's keys (or values) of one layer */
    float *k, *v;      /* [L][cap][kvw] */
    int32_t *pos;      /* [cap]: 0, 1, 2, ... */
    float *w;          /* [cap] one query's attention weights */
};

int gpt_kv_new(gpt_kv **out, gpt_model *m, int cap) {
    *out = NULL;
    const gpt_config *c = &m->cfg;
    if (m->tp > 1 || m->cp > 1 || m->nchunks != 1 || !m->chunk[0].def.embedding || !m->chunk[0].def.head)
        return co_err_set(CO_EINVAL, "the KV-cache forward runs a whole model in one process (tensor, context and "
                                     "pipeline parallel size 1)");
    if (!m->host_batch) return co_err_set(CO_EINVAL, "the KV-cache forward runs on the CPU backend only");
    if (cap < 1 || (!c->rope && cap > c->max_positions))
        return co_err_set(CO_EINVAL, "a KV cache of %d positions: the model has %d learned positions", cap,
                          c->max_positions);
    gpt_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return co_err_set(CO_ENOMEM, "out of memory for the KV cache");
    kv->m = m;
    kv->cap = cap;
    kv->kvw = (size_t)c->kv_groups * c->head_dim;
    size_t n = (size_t)c->num_layers * (size_t)cap * kv->kvw;
    kv->k = malloc(n * sizeof(float));
    kv->v = malloc(n * sizeof(float));
    kv->pos = malloc((size_t)cap * sizeof(int32_t));
    kv->w = malloc((size_t)cap * sizeof(float));
    if (!kv->k || !kv->v || !kv->pos || !kv->w) {
        gpt_kv_destroy(&kv);
        return co_err_set(CO_ENOMEM, "out of memory for a KV cache of %d positions", cap);
    }
    for (int p = 0; p < cap; p++) kv->pos[p] = p;
    *out = kv;
    return 0;
}

void gpt_kv_destroy(gpt_kv **pkv) {
    gpt_kv *kv = *pkv;
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->pos);
    free(kv->w);
    free(kv);
    *pkv = NULL;
}

void gpt_kv_reset(gpt_kv *kv) { kv->len = 0; }
int gpt_kv_len(const gpt_kv *kv) { return kv->len; }

/* Layer l's attention of the step's n rows of qkv [n, Q] (after rope) over the cache, whose
 * positions 0 .. p0+n-1 hold this step's keys and values too: att [n, NH*HD]. */
static void attend(gpt_kv *kv, int l, float *att, const float *qkv, int n, int p0) {
    const gpt_config *c = &kv->m->cfg;
    int NH = c->heads, NKV = c->kv_groups, HD = c->head_dim, Q = (NH + 2 * NKV) * HD, per = NH / NKV;
    const float *K = kv->k + (size_t)l * kv->cap * kv->kvw, *V = kv->v + (size_t)l * kv->cap * kv->kvw;
    float scale = 1.0f / sqrtf((float)HD);
    for (int i = 0; i < n; i++) {
        int last = p0 + i; /* the query's position: it sees keys 0 .. last */
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)i * Q + (size_t)h * HD;
            size_t g = (size_t)(h / per) * HD;
            float mx = -INFINITY;
            for (int j = 0; j <= last; j++) {
                const float *k = K + (size_t)j * kv->kvw + g;
                float s = 0;
                for (int d = 0; d < HD; d++) s += q[d] * k[d];
                kv->w[j] = s * scale;
                mx = fmaxf(mx, kv->w[j]);
            }
            float sum = 0;
            for (int j = 0; j <= last; j++) sum += (kv->w[j] = expf(kv->w[j] - mx));
            float *o = att + (size_t)i * NH * HD + (size_t)h * HD;
            for (int d = 0; d < HD; d++) o[d] = 0;
            for (int j = 0; j <= last; j++) {
                const float *v = V + (size_t)j * kv->kvw + g;
                float wj = kv->w[j] / sum;
                for (int d = 0; d < HD; d++) o[d] += wj * v[d];
            }
        }
    }
}

/* One layer over the step's rows: x [n, C] in and out (a's buffers, m->tmp). */
static int layer_step(gpt_kv *kv, int l, float *x, int n, int p0) {
    gpt_model *m = kv->m;
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    layer_acts *a = &m->chunk[0].slot[0].acts[l];
    const int *t = &m->t_layer[l * NLAYER_T];
    int C = c->hidden, NH = c->heads, NKV = c->kv_groups, HD = c->head_dim, Q = (NH + 2 * NKV) * HD;
    int AH = NH * HD, F = c->ffn_hidden, F1 = c->swiglu ? 2 * F : F;
    size_t nC = (size_t)n * C;
    /* with bf16 activations (gpt_internal.h act16) the norms' outputs are bf16 as in training;
     * attention's and the MLP's outputs go to the backward's fp32 scratch (datt, dffn), which
     * the products round as the training forward's kernels do */
    float *att = m->act16 ? m->datt : a->att, *act = m->act16_mlp ? m->dffn : a->act;
    gpt__norm_act(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, gpt__norm_w(m, t[LN1_W]), P(m, t[LN1_B]), n);
    gpt__linear_act(m, a->qkv, a->ln1, m->act16, P(m, t[QKV_W]), P16(m, t[QKV_W]), P(m, t[QKV_B]), n, C, Q);
    if (c->rope) o->rope(be, a->qkv, kv->pos + p0, n, NH, NKV, HD, c->rotary_base, false);
    float *K = kv->k + ((size_t)l * kv->cap + (size_t)p0) * kv->kvw;
    float *V = kv->v + ((size_t)l * kv->cap + (size_t)p0) * kv->kvw;
    for (int i = 0; i < n; i++) {
        const float *row = a->qkv + (size_t)i * Q;
        for (size_t d = 0; d < kv->kvw; d++) {
            K[(size_t)i * kv->kvw + d] = row[(size_t)AH + d];
            V[(size_t)i * kv->kvw + d] = row[(size_t)AH + kv->kvw + d];
        }
    }
    attend(kv, l, att, a->qkv, n, p0);
    float *tmp = m->tmp;
    o->linear_forward(be, tmp, att, P(m, t[PROJ_W]), P16(m, t[PROJ_W]), P(m, t[PROJ_B]), n, AH, C);
    o->add(be, a->x_mid, x, tmp, nC);
    gpt__norm_act(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, gpt__norm_w(m, t[LN2_W]), P(m, t[LN2_B]), n);
    if (a->moe) {
        /* the router decides per token: one sequence of this step's n tokens */
        moe_set_training(a->moe, false);
        gpt__moe_bind(m, t, a->moe);
        int rc = moe_forward(a->moe, tmp, a->ln2, P(m, t[ROUTER_W]), P(m, t[EBIAS]), 1, n);
        if (rc) return be->status = rc;
    } else {
        gpt__linear_act(m, a->fc1, a->ln2, m->act16, P(m, t[FC1_W]), P16(m, t[FC1_W]), P(m, t[FC1_B]), n, C, F1);
        if (c->swiglu) o->swiglu_forward(be, act, a->fc1, n, F);
        else o->gelu_forward(be, act, a->fc1, (size_t)n * F);
        o->linear_forward(be, tmp, act, P(m, t[FC2_W]), P16(m, t[FC2_W]), P(m, t[FC2_B]), n, F, C);
    }
    o->add(be, x, a->x_mid, tmp, nC);
    return be->status;
}

int gpt_kv_step(gpt_kv *kv, const int32_t *tokens, int n, bool all, const float **logits) {
    gpt_model *m = kv->m;
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    chunk_slot *sl = &m->chunk[0].slot[0];
    int C = c->hidden, Vp = c->padded_vocab, p0 = kv->len;
    *logits = NULL;
    if (n < 1 || n > m->max_T || p0 + n > kv->cap)
        return co_err_set(CO_EINVAL, "a step of %d tokens after %d: the cache holds %d positions, a step at most %d", n,
                          p0, kv->cap, m->max_T);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return co_err_set(CO_EINVAL, "token id %d is outside the vocabulary (0..%d)", (int)tokens[i],
                              c->vocab - 1);
    float *x = sl->x_end;
    o->embed_forward(be, x, tokens, kv->pos + p0, P(m, m->t_wte), P(m, m->t_wpe), n, C);
    for (int l = 0; l < c->num_layers; l++) {
        int rc = layer_step(kv, l, x, n, p0);
        if (rc) return rc;
    }
    /* the head on the rows asked for: every one, or the last */
    int r0 = all ? 0 : n - 1, rows = n - r0;
    const float *xr = x + (size_t)r0 * C;
    gpt__norm_act(m, sl->lnf, sl->lnf_mean, sl->lnf_rstd, xr, gpt__norm_w(m, m->t_lnf_w), P(m, m->t_lnf_b), rows);
    gpt__linear_act(m, sl->logits, sl->lnf, m->act16, P(m, m->t_lm), P16(m, m->t_lm), NULL, rows, C, Vp);
    o->sync(be);
    if (be->status) return be->status;
    kv->len = p0 + n;
    *logits = sl->logits;
    return 0;
}
