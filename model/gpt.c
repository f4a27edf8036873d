/* gpt.c - GPT decoder forward and backward, composed from the backend's operations.
 *
 * Data flow of one micro batch (N = B*T tokens):
 *   x0 = dropout(embed(tokens) + wpe(positions))
 *   per layer l:  h = norm1(x); qkv = h Wqkv^T + b; rope(qkv); a = attention(qkv)
 *                 x = x + dropout(a Wproj^T + b)
 *                 h2 = norm2(x); f = h2 W1^T + b; g = gelu(f) | swiglu(f)
 *                 x = x + dropout(g W2^T + b)
 *   hf = normf(x_L); logits = hf Wlm^T; loss = cross_entropy(logits, targets)
 * Backward walks the same list in reverse; the gradient of the residual stream is one
 * [N,C] buffer that each norm backward accumulates into. */
#include "model/gpt.h"

#include "kernels/checksum.h"

#include <xxhash.h>

#include "common/error.h"
#include "common/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Indices of a layer's tensors in the tensor table. */
enum { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC1_W, FC1_B, FC2_W, FC2_B, NLAYER_T };

typedef struct layer_acts {
    float *x_in;        /* [N,C] residual stream entering the layer */
    float *ln1, *ln1_mean, *ln1_rstd;   /* [N,C], [N], [N] */
    float *qkv;         /* [N,Q] after rope */
    float *x_mid;       /* [N,C] residual stream after the attention branch */
    float *att, *lse;   /* [N,NH*HD], [B*NH*T] */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc1;         /* [N, F or 2F] */
    float *act;         /* [N,F] */
} layer_acts;

struct gpt_model {
    gpt_config cfg;
    kb_backend *be;
    const kb_ops *ops;
    int max_B, max_T;
    gpt_tensor *tensors;
    int ntensors;
    size_t nparams;
    float *params, *grads;
    kb_bf16 *params16; /* bf16 copy (bf16 mode) */
    /* fault injection: flip one bit of the final norm's output in the next forward */
    bool act_flip;
    size_t act_flip_index;
    int act_flip_bit;
    /* tensor indices */
    int t_wte, t_wpe, t_lnf_w, t_lnf_b, t_lm;
    int *t_layer; /* [L][NLAYER_T], -1 when absent */
    /* activations */
    layer_acts *acts;
    float *x_final;     /* [N,C] residual stream after the last layer */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;      /* [N,Vp] logits, then their gradient */
    float *losses;      /* [N] */
    /* backward scratch */
    float *dx, *dh, *dbig, *dqkv, *datt, *dffn;
    float *tmp;         /* [N,C] */
    int last_B, last_T;
    /* Backends whose memory the host cannot hand to kernels (CUDA): the batch arrays are
     * copied into backend buffers each forward, and losses come back through host_losses.
     * host_batch (CPU): the caller's arrays are used as they are. */
    bool host_batch;
    int32_t *d_tok, *d_tgt, *d_pos, *d_seg;
    float *d_dscale, *host_losses;
};

int gpt_padded_vocab(int vocab, int m) { return (vocab + m - 1) / m * m; }

static int add_tensor(gpt_model *m, int cap, const char *name, int rows, int cols, bool decay,
                      float std, bool ones) {
    if (m->ntensors >= cap) return -1;
    gpt_tensor *t = &m->tensors[m->ntensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->offset = m->nparams;
    /* keep every tensor 16-float aligned so kernels see aligned rows */
    m->nparams += (t->numel + 15) / 16 * 16;
    t->decay = decay;
    t->init_std = std;
    t->init_ones = ones;
    return m->ntensors++;
}

#define P(m, idx) ((idx) < 0 ? NULL : (m)->params + (m)->tensors[idx].offset)
#define G(m, idx) ((idx) < 0 ? NULL : (m)->grads + (m)->tensors[idx].offset)
#define P16(m, idx) ((idx) < 0 || !(m)->params16 ? NULL : (m)->params16 + (m)->tensors[idx].offset)

static int qkv_width(const gpt_config *c) { return (c->heads + 2 * c->kv_groups) * c->head_dim; }
static int fc1_width(const gpt_config *c) { return c->swiglu ? 2 * c->ffn_hidden : c->ffn_hidden; }

int gpt_new(gpt_model **out, const gpt_config *cfg, kb_backend *be, int max_B, int max_T) {
    *out = NULL;
    if (cfg->num_layers < 1 || cfg->hidden < 1 || cfg->heads < 1 || cfg->kv_groups < 1 ||
        cfg->heads % cfg->kv_groups || cfg->head_dim < 1 || cfg->ffn_hidden < 1 ||
        cfg->padded_vocab < cfg->vocab || max_B < 1 || max_T < 1 ||
        (!cfg->rope && max_T > cfg->max_positions))
        return co_err_set(CO_EINVAL, "gpt_new: inconsistent model shape");
    gpt_model *m = calloc(1, sizeof *m);
    if (!m) return CO_ENOMEM;
    m->cfg = *cfg;
    m->be = be;
    m->ops = be->ops;
    m->max_B = max_B;
    m->max_T = max_T;
    const gpt_config *c = &m->cfg;
    int L = c->num_layers, C = c->hidden, Q = qkv_width(c), F = c->ffn_hidden, AH = c->heads * c->head_dim;
    int cap = 8 + L * NLAYER_T;
    m->tensors = calloc((size_t)cap, sizeof *m->tensors);
    m->t_layer = malloc(sizeof(int) * (size_t)L * NLAYER_T);
    m->acts = calloc((size_t)L, sizeof *m->acts);
    if (!m->tensors || !m->t_layer || !m->acts) goto nomem;

    float std = c->init_std, ostd = c->init_std / sqrtf(2.0f * (float)L);
    m->t_wte = add_tensor(m, cap, "embedding.word_embeddings.weight", c->padded_vocab, C, true, std, false);
    m->t_wpe = c->rope ? -1
                       : add_tensor(m, cap, "embedding.position_embeddings.weight", c->max_positions, C, true,
                                    std, false);
    char name[64];
    for (int l = 0; l < L; l++) {
        int *t = &m->t_layer[l * NLAYER_T];
        for (int k = 0; k < NLAYER_T; k++) t[k] = -1;
#define NAME(s) (snprintf(name, sizeof name, "layers.%d.%s", l, s), name)
        t[LN1_W] = add_tensor(m, cap, NAME("input_norm.weight"), C, 0, false, 0, true);
        if (!c->rmsnorm) t[LN1_B] = add_tensor(m, cap, NAME("input_norm.bias"), C, 0, false, 0, false);
        t[QKV_W] = add_tensor(m, cap, NAME("attention.qkv.weight"), Q, C, true, std, false);
        if (c->bias) t[QKV_B] = add_tensor(m, cap, NAME("attention.qkv.bias"), Q, 0, false, 0, false);
        t[PROJ_W] = add_tensor(m, cap, NAME("attention.proj.weight"), C, AH, true, ostd, false);
        if (c->bias) t[PROJ_B] = add_tensor(m, cap, NAME("attention.proj.bias"), C, 0, false, 0, false);
        t[LN2_W] = add_tensor(m, cap, NAME("mlp_norm.weight"), C, 0, false, 0, true);
        if (!c->rmsnorm) t[LN2_B] = add_tensor(m, cap, NAME("mlp_norm.bias"), C, 0, false, 0, false);
        t[FC1_W] = add_tensor(m, cap, NAME("mlp.fc1.weight"), fc1_width(c), C, true, std, false);
        if (c->bias) t[FC1_B] = add_tensor(m, cap, NAME("mlp.fc1.bias"), fc1_width(c), 0, false, 0, false);
        t[FC2_W] = add_tensor(m, cap, NAME("mlp.fc2.weight"), C, F, true, ostd, false);
        if (c->bias) t[FC2_B] = add_tensor(m, cap, NAME("mlp.fc2.bias"), C, 0, false, 0, false);
#undef NAME
    }
    m->t_lnf_w = add_tensor(m, cap, "final_norm.weight", C, 0, false, 0, true);
    m->t_lnf_b = c->rmsnorm ? -1 : add_tensor(m, cap, "final_norm.bias", C, 0, false, 0, false);
    m->t_lm = c->tied ? m->t_wte : add_tensor(m, cap, "output_layer.weight", c->padded_vocab, C, true, std, false);

    const kb_ops *o = m->ops;
    m->params = o->alloc(be, m->nparams * sizeof(float));
    m->grads = o->alloc(be, m->nparams * sizeof(float));
    if (!m->params || !m->grads) goto nomem;
    if (be->opt.bf16) {
        m->params16 = o->alloc(be, m->nparams * sizeof(kb_bf16));
        if (!m->params16) goto nomem;
    }

    size_t N = (size_t)max_B * max_T;
    size_t lseN = (size_t)max_B * c->heads * max_T;
#define A(ptr, count) \
    do { if (!((ptr) = o->alloc(be, (count) * sizeof(float)))) goto nomem; } while (0)
    for (int l = 0; l < L; l++) {
        layer_acts *a = &m->acts[l];
        A(a->x_in, N * C);
        A(a->ln1, N * C);
        A(a->ln1_mean, N);
        A(a->ln1_rstd, N);
        A(a->qkv, N * Q);
        A(a->att, N * AH);
        A(a->lse, lseN);
        A(a->x_mid, N * C);
        A(a->ln2, N * C);
        A(a->ln2_mean, N);
        A(a->ln2_rstd, N);
        A(a->fc1, N * fc1_width(c));
        A(a->act, N * F);
    }
    A(m->x_final, N * C);
    A(m->lnf, N * C);
    A(m->lnf_mean, N);
    A(m->lnf_rstd, N);
    A(m->logits, N * c->padded_vocab);
    A(m->losses, N);
    A(m->dx, N * C);
    A(m->dh, N * C);
    A(m->tmp, N * C);
    A(m->dqkv, N * Q);
    A(m->datt, N * AH);
    A(m->dbig, N * fc1_width(c));
    A(m->dffn, N * F);
    m->host_batch = be->opt.device == KB_DEVICE_CPU;
    if (!m->host_batch) {
        A(m->d_tok, N);
        A(m->d_tgt, N);
        A(m->d_pos, N);
        A(m->d_seg, N);
        A(m->d_dscale, N);
        if (!(m->host_losses = malloc(N * sizeof(float)))) goto nomem;
    }
#undef A
    *out = m;
    return 0;
nomem:
    gpt_destroy(&m);
    return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate model memory");
}

void gpt_destroy(gpt_model **pm) {
    gpt_model *m = *pm;
    if (!m) return;
    kb_backend *be = m->be;
    const kb_ops *o = m->ops;
    if (m->acts) {
        for (int l = 0; l < m->cfg.num_layers; l++) {
            layer_acts *a = &m->acts[l];
            float *ps[] = {a->x_in, a->x_mid, a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att,
                           a->lse, a->ln2, a->ln2_mean, a->ln2_rstd, a->fc1, a->act};
            for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) if (ps[k]) o->free(be, ps[k]);
        }
    }
    float *ps[] = {m->params, m->grads, m->x_final, m->lnf, m->lnf_mean, m->lnf_rstd, m->logits,
                   m->losses, m->dx, m->dh, m->tmp, m->dqkv, m->datt, m->dbig, m->dffn,
                   (float *)m->d_tok, (float *)m->d_tgt, (float *)m->d_pos, (float *)m->d_seg, m->d_dscale};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) if (ps[k]) o->free(be, ps[k]);
    if (m->params16) o->free(be, m->params16);
    free(m->host_losses);
    free(m->acts);
    free(m->t_layer);
    free(m->tensors);
    free(m);
    *pm = NULL;
}

void gpt_init(gpt_model *m, uint64_t seed) {
    co_rng r;
    co_rng_seed(&r, seed);
    memset(m->params, 0, m->nparams * sizeof(float));
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->init_ones)
            for (size_t k = 0; k < t->numel; k++) p[k] = 1.0f;
        else if (t->init_std > 0)
            for (size_t k = 0; k < t->numel; k++) p[k] = (float)(co_rng_normal(&r) * t->init_std);
    }
    gpt_sync_bf16(m);
    m->ops->sync(m->be); /* the host may read or overwrite the parameters next (checkpoint load) */
}

size_t gpt_num_params(const gpt_model *m) { return m->nparams; }
float *gpt_params(gpt_model *m) { return m->params; }
float *gpt_grads(gpt_model *m) { return m->grads; }
int gpt_num_tensors(const gpt_model *m) { return m->ntensors; }
const gpt_tensor *gpt_tensors(const gpt_model *m) { return m->tensors; }
const gpt_config *gpt_get_config(const gpt_model *m) { return &m->cfg; }
kb_backend *gpt_backend(gpt_model *m) { return m->be; }

const void *gpt_params_bf16(const gpt_model *m) { return m->params16; }

uint64_t gpt_weights_checksum32(gpt_model *m) {
    uint64_t h = 0;
    for (int i = 0; i < m->ntensors; i++)
        h ^= kb_checksum_f32(m->params + m->tensors[i].offset, m->tensors[i].numel, GPT_SUM_SEED(i));
    return h;
}

uint64_t gpt_weights_checksum16(gpt_model *m) {
    return m->params16 ? XXH3_64bits_withSeed(m->params16, m->nparams * sizeof(kb_bf16), 0x16) : 0;
}

uint64_t gpt_weights_checksum(gpt_model *m) { return gpt_weights_checksum32(m) ^ gpt_weights_checksum16(m); }

void gpt_sync_bf16(gpt_model *m) {
    if (m->params16) m->ops->to_bf16(m->be, m->params16, m->params, m->nparams);
}

void gpt_inject_act_flip(gpt_model *m, size_t index, int bit) {
    m->act_flip = true;
    m->act_flip_index = index;
    m->act_flip_bit = bit & 31;
}

void gpt_zero_grad(gpt_model *m) { m->ops->zero(m->be, m->grads, m->nparams); }

/* Dropout stream offsets: each dropout site of a micro batch gets its own counter range. */
static uint64_t site(int layer, int which) { return ((uint64_t)(layer + 1) * 8u + (uint64_t)which) << 40; }

double gpt_forward(gpt_model *m, const gpt_batch *b, bool train, uint64_t seed, const float *dscale,
                   float *losses) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int B = b->B, T = b->T, N = B * T, C = c->hidden, Q = qkv_width(c), F = c->ffn_hidden;
    int AH = c->heads * c->head_dim;
    float ph = train ? c->hidden_dropout : 0.0f, pa = train ? c->attention_dropout : 0.0f;
    m->last_B = B;
    m->last_T = T;
    const int32_t *tokens = b->tokens, *positions = b->positions, *seg = b->seg, *targets = b->targets;
    if (!m->host_batch) {
        /* into backend memory, in order with the queued work (the previous micro batch's
         * backward may still be reading the last copies) */
        size_t ib = sizeof(int32_t) * (size_t)N;
        o->copy(be, m->d_tok, b->tokens, ib);
        tokens = m->d_tok;
        if (b->positions) {
            o->copy(be, m->d_pos, b->positions, ib);
            positions = m->d_pos;
        }
        if (b->seg) {
            o->copy(be, m->d_seg, b->seg, ib);
            seg = m->d_seg;
        }
        if (b->targets && dscale) {
            o->copy(be, m->d_tgt, b->targets, ib);
            targets = m->d_tgt;
        }
        if (dscale) {
            o->copy(be, m->d_dscale, dscale, sizeof(float) * (size_t)N);
            dscale = m->d_dscale;
        }
    }

    float *x = m->acts[0].x_in;
    o->embed_forward(be, x, tokens, positions, P(m, m->t_wte), P(m, m->t_wpe), N, C);
    if (ph > 0) o->dropout(be, x, x, (size_t)N * C, ph, seed, site(-1, 0));

    for (int l = 0; l < c->num_layers; l++) {
        layer_acts *a = &m->acts[l];
        const int *t = &m->t_layer[l * NLAYER_T];
        float *x_out = l + 1 < c->num_layers ? m->acts[l + 1].x_in : m->x_final;
        o->norm_forward(be, c->rmsnorm, a->ln1, a->ln1_mean, a->ln1_rstd, a->x_in, P(m, t[LN1_W]),
                        P(m, t[LN1_B]), N, C, c->norm_eps);
        o->linear_forward(be, a->qkv, a->ln1, P(m, t[QKV_W]), P16(m, t[QKV_W]), P(m, t[QKV_B]), N, C, Q);
        if (c->rope) o->rope(be, a->qkv, positions, N, c->heads, c->kv_groups, c->head_dim, c->rotary_base, false);
        o->attention_forward(be, a->att, a->lse, a->qkv, seg, B, T, c->heads, c->kv_groups, c->head_dim, pa,
                             seed, site(l, 1));
        /* x_mid = x_in + dropout(att Wproj^T + b) */
        o->linear_forward(be, m->tmp, a->att, P(m, t[PROJ_W]), P16(m, t[PROJ_W]), P(m, t[PROJ_B]), N, AH, C);
        if (ph > 0) o->dropout(be, m->tmp, m->tmp, (size_t)N * C, ph, seed, site(l, 2));
        o->add(be, a->x_mid, a->x_in, m->tmp, (size_t)N * C);
        o->norm_forward(be, c->rmsnorm, a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, P(m, t[LN2_W]),
                        P(m, t[LN2_B]), N, C, c->norm_eps);
        o->linear_forward(be, a->fc1, a->ln2, P(m, t[FC1_W]), P16(m, t[FC1_W]), P(m, t[FC1_B]), N, C, fc1_width(c));
        if (c->swiglu) o->swiglu_forward(be, a->act, a->fc1, N, F);
        else o->gelu_forward(be, a->act, a->fc1, (size_t)N * F);
        o->linear_forward(be, m->tmp, a->act, P(m, t[FC2_W]), P16(m, t[FC2_W]), P(m, t[FC2_B]), N, F, C);
        if (ph > 0) o->dropout(be, m->tmp, m->tmp, (size_t)N * C, ph, seed, site(l, 3));
        o->add(be, x_out, a->x_mid, m->tmp, (size_t)N * C);
    }
    o->norm_forward(be, c->rmsnorm, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_final, P(m, m->t_lnf_w),
                    P(m, m->t_lnf_b), N, C, c->norm_eps);
    if (m->act_flip) {
        /* an injected silent corruption of one activation (resilience/inject.h): the
         * final norm's output, which the output layer and its gradients read */
        uint32_t u;
        size_t n = (size_t)N * (size_t)C, i = m->act_flip_index % n;
        /* the first element from there below 1 in magnitude: a high exponent bit then
         * turns it into a huge value instead of a tiny one */
        o->sync(be); /* the norm's output is written before the host reads it (CUDA) */
        for (size_t k = 0; k < n && !(fabsf(m->lnf[i]) < 1.0f); k++) i = (i + 1) % n;
        memcpy(&u, &m->lnf[i], sizeof u);
        u ^= 1u << m->act_flip_bit;
        memcpy(&m->lnf[i], &u, sizeof u);
        m->act_flip = false;
    }
    o->linear_forward(be, m->logits, m->lnf, P(m, m->t_lm), P16(m, m->t_lm), NULL, N, C, c->padded_vocab);
    if (!dscale) {
        o->sync(be); /* sampling: the logits stay readable by the host */
        return 0.0;
    }
    o->cross_entropy(be, m->losses, m->logits, targets, dscale, N, c->padded_vocab);
    const float *ls = m->losses;
    if (!m->host_batch) {
        o->copy(be, m->host_losses, m->losses, sizeof(float) * (size_t)N); /* waits for the forward */
        ls = m->host_losses;
    }
    double sum = 0;
    for (int n = 0; n < N; n++) sum += (double)ls[n] * b->loss_mask[n];
    if (losses) memcpy(losses, ls, sizeof(float) * (size_t)N);
    return sum;
}

const float *gpt_last_logits(gpt_model *m, int b, int t) {
    return m->logits + ((size_t)b * m->last_T + (size_t)t) * m->cfg.padded_vocab;
}

void gpt_backward(gpt_model *m, const gpt_batch *b, uint64_t seed) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int B = b->B, T = b->T, N = B * T, C = c->hidden, Q = qkv_width(c), F = c->ffn_hidden;
    int AH = c->heads * c->head_dim;
    float ph = c->hidden_dropout, pa = c->attention_dropout;
    size_t NC = (size_t)N * C;
    /* the batch as the last forward copied it (CPU: the caller's arrays) */
    const int32_t *tokens = m->host_batch ? b->tokens : m->d_tok;
    const int32_t *positions = m->host_batch || !b->positions ? b->positions : m->d_pos;
    const int32_t *seg = m->host_batch || !b->seg ? b->seg : m->d_seg;

    /* LM head: logits hold dloss/dlogits */
    o->linear_backward(be, m->dh, G(m, m->t_lm), NULL, m->logits, m->lnf, P(m, m->t_lm), P16(m, m->t_lm), N, C,
                       c->padded_vocab);
    o->zero(be, m->dx, NC);
    o->norm_backward(be, c->rmsnorm, m->dx, G(m, m->t_lnf_w), G(m, m->t_lnf_b), m->dh, m->x_final,
                     P(m, m->t_lnf_w), m->lnf_mean, m->lnf_rstd, N, C);

    for (int l = c->num_layers - 1; l >= 0; l--) {
        layer_acts *a = &m->acts[l];
        const int *t = &m->t_layer[l * NLAYER_T];
        /* MLP branch: dmlp = dropout'(dx) */
        const float *dmlp = m->dx;
        if (ph > 0) {
            o->dropout(be, m->tmp, m->dx, NC, ph, seed, site(l, 3));
            dmlp = m->tmp;
        }
        o->linear_backward(be, m->dffn, G(m, t[FC2_W]), G(m, t[FC2_B]), dmlp, a->act, P(m, t[FC2_W]),
                           P16(m, t[FC2_W]), N, F, C);
        if (c->swiglu) o->swiglu_backward(be, m->dbig, m->dffn, a->fc1, N, F);
        else o->gelu_backward(be, m->dbig, m->dffn, a->fc1, (size_t)N * F);
        o->linear_backward(be, m->dh, G(m, t[FC1_W]), G(m, t[FC1_B]), m->dbig, a->ln2, P(m, t[FC1_W]),
                           P16(m, t[FC1_W]), N, C, fc1_width(c));
        o->norm_backward(be, c->rmsnorm, m->dx, G(m, t[LN2_W]), G(m, t[LN2_B]), m->dh, a->x_mid,
                         P(m, t[LN2_W]), a->ln2_mean, a->ln2_rstd, N, C);
        /* attention branch */
        const float *datt_out = m->dx;
        if (ph > 0) {
            o->dropout(be, m->tmp, m->dx, NC, ph, seed, site(l, 2));
            datt_out = m->tmp;
        }
        o->linear_backward(be, m->datt, G(m, t[PROJ_W]), G(m, t[PROJ_B]), datt_out, a->att, P(m, t[PROJ_W]),
                           P16(m, t[PROJ_W]), N, AH, C);
        o->attention_backward(be, m->dqkv, m->datt, a->qkv, a->att, a->lse, seg, B, T, c->heads, c->kv_groups,
                              c->head_dim, pa, seed, site(l, 1));
        if (c->rope)
            o->rope(be, m->dqkv, positions, N, c->heads, c->kv_groups, c->head_dim, c->rotary_base, true);
        o->linear_backward(be, m->dh, G(m, t[QKV_W]), G(m, t[QKV_B]), m->dqkv, a->ln1, P(m, t[QKV_W]),
                           P16(m, t[QKV_W]), N, C, Q);
        o->norm_backward(be, c->rmsnorm, m->dx, G(m, t[LN1_W]), G(m, t[LN1_B]), m->dh, a->x_in, P(m, t[LN1_W]),
                         a->ln1_mean, a->ln1_rstd, N, C);
    }
    if (ph > 0) o->dropout(be, m->dx, m->dx, NC, ph, seed, site(-1, 0));
    o->embed_backward(be, G(m, m->t_wte), G(m, m->t_wpe), m->dx, tokens, positions, N, C,
                      c->padded_vocab);
    o->sync(be); /* the gradients are complete before the host (all-reduce, clipping) reads them */
}

double gpt_flops_per_sample(const gpt_config *c, int s) {
    double h = c->hidden, L = c->num_layers;
    double qproj = (double)c->head_dim * c->heads / h;
    double gated = c->swiglu ? 1.5 : 1.0;
    return 12.0 * s * L * h * h *
           ((1.0 + (double)c->kv_groups / c->heads + s / h) * qproj + (double)c->ffn_hidden / h * gated +
            (double)c->padded_vocab / (2.0 * L * h));
}
