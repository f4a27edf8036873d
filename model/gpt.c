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
 * [N,C] buffer that each norm backward accumulates into.
 *
 * Under tensor parallelism (gpt.h) the same list runs on this rank's slices, with the
 * tensor group's collectives where Megatron's mappings put them:
 *   embed:      local rows, all-reduce (reduce-scatter to token shards under SP)
 *   qkv, fc1:   column-parallel; SP all-gathers the input first; backward sums the
 *               input gradient (all-reduce, or reduce-scatter under SP)
 *   proj, fc2:  row-parallel; all-reduce (reduce-scatter under SP), then the bias;
 *               backward all-gathers the output gradient under SP
 *   head + CE:  column-parallel over the vocabulary, vocabulary-parallel cross-entropy
 * At tp 1 none of this runs and the operations are exactly the one-rank ones. */
#include "model/gpt.h"

#include "kernels/checksum.h"

#include <xxhash.h>

#include "comm/comm.h"
#include "common/error.h"
#include "common/rng.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    /* tensor parallelism (gpt.h): this rank's shapes and the group */
    int tp, tpr;
    bool sp;
    int NHl, NKVl, kv0, Fl, Vl, v0;  /* local heads, groups, first group, ffn, vocabulary */
    struct cm_comm *tpc;
    int tp_timeout;
    int32_t *tok_l;                  /* [N] token ids in this rank's vocabulary shard, -1 elsewhere
                                      * (host memory; d_tokl the backend's copy where it differs) */
    int32_t *d_tokl;
    float *gath, *dfull, *dhs;       /* [N,C]: gathered input, gathered gradient, a shard's sum */
    float *ce_mx, *ce_all, *ce_sums; /* [N], [tp*N], [2N] */
    float *tp_buf;                   /* gpt_tp_finalize_grads' packing buffer */
    size_t tp_buf_n;
    gpt_tp_stats stats;
    bool overlap;                    /* the input-gradient sum runs beside the weight gradient */
    /* Backends whose memory the host cannot hand to kernels (CUDA): the batch arrays are
     * copied into backend buffers each forward, and losses come back through host_losses.
     * host_batch (CPU): the caller's arrays are used as they are. */
    bool host_batch;
    int32_t *d_tok, *d_tgt, *d_pos, *d_seg;
    float *d_dscale, *host_losses;
};

int gpt_padded_vocab(int vocab, int m) { return (vocab + m - 1) / m * m; }

/* A tensor split as `split` says, this rank's slice given by pieces (NULL: replicated). */
static int add_split(gpt_model *m, int cap, const char *name, int grows, int gcols, int split,
                     const gpt_piece *pieces, int npieces, bool decay, float std, bool ones) {
    if (m->ntensors >= cap) return -1;
    gpt_tensor *t = &m->tensors[m->ntensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    int rows = grows, cols = gcols;
    t->gshape[0] = grows;
    t->gshape[1] = gcols;
    t->split = pieces ? split : GPT_TP_REPLICATED;
    if (pieces) {
        int n = 0;
        for (int i = 0; i < npieces; i++) n += pieces[i].len;
        if (split == GPT_TP_ROWS) rows = n;
        else cols = n;
        t->npieces = npieces;
        memcpy(t->piece, pieces, sizeof(gpt_piece) * (size_t)npieces);
    } else {
        t->npieces = 1;
        t->piece[0] = (gpt_piece){0, 0, grows, m->tp};
    }
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

static int add_tensor(gpt_model *m, int cap, const char *name, int rows, int cols, bool decay,
                      float std, bool ones) {
    return add_split(m, cap, name, rows, cols, GPT_TP_REPLICATED, NULL, 0, decay, std, ones);
}

#define P(m, idx) ((idx) < 0 ? NULL : (m)->params + (m)->tensors[idx].offset)
#define G(m, idx) ((idx) < 0 ? NULL : (m)->grads + (m)->tensors[idx].offset)
#define P16(m, idx) ((idx) < 0 || !(m)->params16 ? NULL : (m)->params16 + (m)->tensors[idx].offset)

static int qkv_width(const gpt_config *c) { return (c->heads + 2 * c->kv_groups) * c->head_dim; }
static int fc1_width(const gpt_config *c) { return c->swiglu ? 2 * c->ffn_hidden : c->ffn_hidden; }
/* this rank's widths */
static int qkv_local(const gpt_model *m) { return (m->NHl + 2 * m->NKVl) * m->cfg.head_dim; }
static int fc1_local(const gpt_model *m) { return m->cfg.swiglu ? 2 * m->Fl : m->Fl; }

int gpt_tp_check(const gpt_config *c, int max_T) {
    int tp = c->tp > 1 ? c->tp : 1;
    if (tp == 1) return 0;
    if (c->tp_rank < 0 || c->tp_rank >= tp)
        return co_err_set(CO_EINVAL, "tensor-parallel rank %d is outside a group of %d", c->tp_rank, tp);
    if (c->heads % tp)
        return co_err_set(CO_EINVAL, "--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d",
                          c->heads, tp);
    if (c->kv_groups % tp && tp % c->kv_groups)
        return co_err_set(CO_EINVAL,
                          "--num-query-groups %d and --tensor-model-parallel-size %d: one must divide the other",
                          c->kv_groups, tp);
    if (c->ffn_hidden % tp)
        return co_err_set(CO_EINVAL, "--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d",
                          c->ffn_hidden, tp);
    if (c->padded_vocab % tp)
        return co_err_set(CO_EINVAL, "the padded vocabulary (%d) is not divisible by --tensor-model-parallel-size %d",
                          c->padded_vocab, tp);
    if (c->sequence_parallel && max_T > 0 && max_T % tp)
        return co_err_set(CO_EINVAL,
                          "--sequence-parallel: --seq-length %d is not divisible by --tensor-model-parallel-size %d",
                          max_T, tp);
    return 0;
}

/* This rank's shapes (tp, rank, local heads, groups, ffn, vocabulary) from m->cfg, checked. */
static int model_shape(gpt_model *m, int max_T) {
    const gpt_config *c = &m->cfg;
    m->tp = c->tp > 1 ? c->tp : 1;
    m->tpr = m->tp > 1 ? c->tp_rank : 0;
    m->sp = m->tp > 1 && c->sequence_parallel;
    int rc = gpt_tp_check(c, max_T);
    if (rc) return rc;
    m->cfg.tp = m->tp;
    m->cfg.tp_rank = m->tpr;
    m->cfg.sequence_parallel = m->sp;
    int tp = m->tp, r = m->tpr;
    m->NHl = c->heads / tp;
    m->NKVl = c->kv_groups >= tp ? c->kv_groups / tp : 1;
    m->kv0 = c->kv_groups >= tp ? r * m->NKVl : r / (tp / c->kv_groups);
    m->Fl = c->ffn_hidden / tp;
    m->Vl = c->padded_vocab / tp;
    m->v0 = r * m->Vl;
    return 0;
}

/* The tensor table of this rank (model_shape first): names, global and local shapes, the
 * slice of each split tensor, offsets into the flat buffers (m->nparams their total). */
static int build_tensors(gpt_model *m) {
    const gpt_config *c = &m->cfg;
    int tp = m->tp, r = m->tpr, HD = c->head_dim;
    int kv_share = c->kv_groups >= tp ? 1 : tp / c->kv_groups;
    int L = c->num_layers, C = c->hidden, AH = m->NHl * HD;
    int cap = 8 + L * NLAYER_T;
    m->tensors = calloc((size_t)cap, sizeof *m->tensors);
    m->t_layer = malloc(sizeof(int) * (size_t)L * NLAYER_T);
    if (!m->tensors || !m->t_layer) return CO_ENOMEM;

    float std = c->init_std, ostd = c->init_std / sqrtf(2.0f * (float)L);
    bool par = tp > 1;
    /* this rank's slices (gpt.h): vocabulary rows, qkv rows (q heads, then k, then v
     * groups), fc1 rows (the gate and the up half each), proj and fc2 columns */
    gpt_piece pv[1] = {{0, m->v0, m->Vl, 1}};
    gpt_piece pq[3] = {{0, r * m->NHl * HD, m->NHl * HD, 1},
                       {m->NHl * HD, (c->heads + m->kv0) * HD, m->NKVl * HD, kv_share},
                       {(m->NHl + m->NKVl) * HD, (c->heads + c->kv_groups + m->kv0) * HD, m->NKVl * HD, kv_share}};
    gpt_piece pf[2] = {{0, r * m->Fl, m->Fl, 1}, {m->Fl, c->ffn_hidden + r * m->Fl, m->Fl, 1}};
    gpt_piece pa[1] = {{0, r * AH, AH, 1}};
    gpt_piece pc[1] = {{0, r * m->Fl, m->Fl, 1}};
    int nf = c->swiglu ? 2 : 1;
#define ROWS(p, n) GPT_TP_ROWS, par ? (p) : NULL, (n)
#define COLS(p, n) GPT_TP_COLS, par ? (p) : NULL, (n)
    m->t_wte = add_split(m, cap, "embedding.word_embeddings.weight", c->padded_vocab, C, ROWS(pv, 1), true, std,
                         false);
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
        int GQ = qkv_width(c), GA = c->heads * HD;
        t[QKV_W] = add_split(m, cap, NAME("attention.qkv.weight"), GQ, C, ROWS(pq, 3), true, std, false);
        if (c->bias) t[QKV_B] = add_split(m, cap, NAME("attention.qkv.bias"), GQ, 0, ROWS(pq, 3), false, 0, false);
        t[PROJ_W] = add_split(m, cap, NAME("attention.proj.weight"), C, GA, COLS(pa, 1), true, ostd, false);
        if (c->bias) t[PROJ_B] = add_tensor(m, cap, NAME("attention.proj.bias"), C, 0, false, 0, false);
        t[LN2_W] = add_tensor(m, cap, NAME("mlp_norm.weight"), C, 0, false, 0, true);
        if (!c->rmsnorm) t[LN2_B] = add_tensor(m, cap, NAME("mlp_norm.bias"), C, 0, false, 0, false);
        t[FC1_W] = add_split(m, cap, NAME("mlp.fc1.weight"), fc1_width(c), C, ROWS(pf, nf), true, std, false);
        if (c->bias)
            t[FC1_B] = add_split(m, cap, NAME("mlp.fc1.bias"), fc1_width(c), 0, ROWS(pf, nf), false, 0, false);
        t[FC2_W] = add_split(m, cap, NAME("mlp.fc2.weight"), C, c->ffn_hidden, COLS(pc, 1), true, ostd, false);
        if (c->bias) t[FC2_B] = add_tensor(m, cap, NAME("mlp.fc2.bias"), C, 0, false, 0, false);
#undef NAME
        /* sequence parallelism: the norms and the row-parallel biases see this rank's tokens only */
        int sp_t[] = {LN1_W, LN1_B, LN2_W, LN2_B, PROJ_B, FC2_B};
        for (size_t k = 0; k < sizeof sp_t / sizeof sp_t[0]; k++)
            if (t[sp_t[k]] >= 0) m->tensors[t[sp_t[k]]].partial_grad = m->sp;
    }
    m->t_lnf_w = add_tensor(m, cap, "final_norm.weight", C, 0, false, 0, true);
    m->t_lnf_b = c->rmsnorm ? -1 : add_tensor(m, cap, "final_norm.bias", C, 0, false, 0, false);
    m->tensors[m->t_lnf_w].partial_grad = m->sp;
    if (m->t_lnf_b >= 0) m->tensors[m->t_lnf_b].partial_grad = m->sp;
    m->t_lm = c->tied ? m->t_wte
                      : add_split(m, cap, "output_layer.weight", c->padded_vocab, C, ROWS(pv, 1), true, std, false);
#undef ROWS
#undef COLS
    return 0;
}

int gpt_tensor_table(const gpt_config *cfg, gpt_tensor **out, int *n, size_t *nparams) {
    *out = NULL;
    *n = 0;
    gpt_model *m = calloc(1, sizeof *m);
    if (!m) return co_err_set(CO_ENOMEM, "gpt_tensor_table: out of memory");
    m->cfg = *cfg;
    int rc = model_shape(m, 0);
    if (!rc && build_tensors(m)) rc = co_err_set(CO_ENOMEM, "gpt_tensor_table: out of memory");
    if (!rc) {
        *out = m->tensors;
        *n = m->ntensors;
        if (nparams) *nparams = m->nparams;
        m->tensors = NULL;
    }
    free(m->tensors);
    free(m->t_layer);
    free(m);
    return rc;
}

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
    m->overlap = true;
    int rc = model_shape(m, max_T);
    if (rc) {
        free(m);
        return rc;
    }
    if (m->tp > 1 && (!be->ops->bias_add || !be->ops->bias_grad || !be->ops->ce_max || !be->ops->ce_sums ||
                      !be->ops->ce_grad)) {
        free(m);
        return co_err_set(CO_EUNSUPPORTED, "tensor parallelism: the %s backend has no tensor-parallel kernels yet",
                          be->opt.device == KB_DEVICE_CUDA ? "CUDA" : "this");
    }
    const gpt_config *c = &m->cfg;
    int tp = m->tp, HD = c->head_dim;
    int kv_share = c->kv_groups >= tp ? 1 : tp / c->kv_groups;
    int L = c->num_layers, C = c->hidden, Q = qkv_local(m), F = m->Fl, AH = m->NHl * HD;
    bool par = tp > 1;
    m->acts = calloc((size_t)L, sizeof *m->acts);
    if (!m->acts || build_tensors(m)) goto nomem;

    const kb_ops *o = m->ops;
    m->params = o->alloc(be, m->nparams * sizeof(float));
    m->grads = o->alloc(be, m->nparams * sizeof(float));
    if (!m->params || !m->grads) goto nomem;
    if (be->opt.bf16) {
        m->params16 = o->alloc(be, m->nparams * sizeof(kb_bf16));
        if (!m->params16) goto nomem;
    }

    size_t N = (size_t)max_B * max_T;
    size_t lseN = (size_t)max_B * m->NHl * max_T;
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
        A(a->fc1, N * fc1_local(m));
        A(a->act, N * F);
    }
    A(m->x_final, N * C);
    A(m->lnf, N * C);
    A(m->lnf_mean, N);
    A(m->lnf_rstd, N);
    A(m->logits, N * m->Vl);
    A(m->losses, N);
    A(m->dx, N * C);
    A(m->dh, N * C);
    A(m->tmp, N * C);
    A(m->dqkv, N * Q);
    A(m->datt, N * AH);
    A(m->dbig, N * fc1_local(m));
    if (par) {
        A(m->gath, N * C);
        A(m->dfull, N * C);
        A(m->dhs, N * C);
        A(m->ce_mx, N);
        A(m->ce_all, N * tp);
        A(m->ce_sums, 2 * N);
        if (!(m->tok_l = malloc(N * sizeof(int32_t)))) goto nomem;
        /* gpt_tp_finalize_grads packs the partial gradients: the replicated ones and the
         * global span of key/value rows several ranks hold */
        for (int i = 0; i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            if (t->partial_grad) m->tp_buf_n += t->numel;
            if (kv_share > 1 && t->split == GPT_TP_ROWS && t->npieces == 3)
                m->tp_buf_n += (size_t)2 * c->kv_groups * HD * (size_t)(t->shape[1] ? t->shape[1] : 1);
        }
        if (m->tp_buf_n) A(m->tp_buf, m->tp_buf_n);
    }
    A(m->dffn, N * F);
    m->host_batch = be->opt.device == KB_DEVICE_CPU;
    if (!m->host_batch && par) A(m->d_tokl, N);
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
                   (float *)m->d_tok, (float *)m->d_tgt, (float *)m->d_pos, (float *)m->d_seg, m->d_dscale,
                   m->gath, m->dfull, m->dhs, m->ce_mx, m->ce_all, m->ce_sums, m->tp_buf, (float *)m->d_tokl};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) if (ps[k]) o->free(be, ps[k]);
    if (m->params16) o->free(be, m->params16);
    free(m->host_losses);
    free(m->tok_l);
    free(m->acts);
    free(m->t_layer);
    free(m->tensors);
    free(m);
    *pm = NULL;
}

bool gpt_tensor_is_vocab(const char *name) {
    static const char *vocab[] = {"embedding.word_embeddings.weight", "output_layer.weight"};
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof vocab / sizeof vocab[0]; k++) {
        size_t v = strlen(vocab[k]);
        if (n >= v && !strcmp(name + n - v, vocab[k]) && (n == v || name[n - v - 1] == '.')) return true;
    }
    return false;
}

void gpt_tensor_take_slice(const gpt_tensor *t, const float *global, float *local) {
    if (t->split == GPT_TP_REPLICATED) {
        memcpy(local, global, t->numel * sizeof(float));
        return;
    }
    size_t gcols = (size_t)(t->gshape[1] ? t->gshape[1] : 1), lcols = (size_t)(t->shape[1] ? t->shape[1] : 1);
    for (int k = 0; k < t->npieces; k++) {
        const gpt_piece *p = &t->piece[k];
        if (t->split == GPT_TP_ROWS)
            memcpy(local + (size_t)p->local * lcols, global + (size_t)p->global * gcols, (size_t)p->len * gcols * sizeof(float));
        else
            for (int i = 0; i < t->gshape[0]; i++)
                memcpy(local + (size_t)i * lcols + (size_t)p->local, global + (size_t)i * gcols + (size_t)p->global,
                       (size_t)p->len * sizeof(float));
    }
}

void gpt_init(gpt_model *m, uint64_t seed) {
    co_rng r;
    co_rng_seed(&r, seed);
    memset(m->params, 0, m->nparams * sizeof(float));
    float *global = NULL; /* tp > 1: the global tensor drawn as one rank draws it, then sliced */
    size_t gmax = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        size_t gn = (size_t)t->gshape[0] * (size_t)(t->gshape[1] ? t->gshape[1] : 1);
        if (t->split != GPT_TP_REPLICATED && gn > gmax) gmax = gn;
    }
    if (gmax && !(global = malloc(gmax * sizeof(float)))) {
        m->be->status = co_err_set(CO_ENOMEM, "gpt_init: cannot allocate %zu floats to slice from", gmax);
        return;
    }
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        bool sliced = t->split != GPT_TP_REPLICATED;
        float *d = sliced ? global : p;
        size_t n = sliced ? (size_t)t->gshape[0] * (size_t)(t->gshape[1] ? t->gshape[1] : 1) : t->numel;
        if (t->init_ones)
            for (size_t k = 0; k < n; k++) d[k] = 1.0f;
        else if (t->init_std > 0)
            for (size_t k = 0; k < n; k++) d[k] = (float)(co_rng_normal(&r) * t->init_std);
        else if (sliced)
            memset(d, 0, n * sizeof(float));
        if (sliced) gpt_tensor_take_slice(t, global, p);
    }
    free(global);
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


/* ---- the tensor group's collectives (a failure sets the backend's sticky status; once
 * it is set the rest of the pass communicates no more) ---- */

void gpt_set_tensor_group(gpt_model *m, struct cm_comm *tp, int timeout_ms) {
    m->tpc = tp;
    m->tp_timeout = timeout_ms;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void gpt_tp_stats_take(gpt_model *m, gpt_tp_stats *out) {
    *out = m->stats;
    memset(&m->stats, 0, sizeof m->stats);
}

/* one collective's time and its bandwidth-optimal volume per rank (ring algorithms):
 * all-reduce 2 (p-1)/p n, all-gather and reduce-scatter (p-1) x the shard */
static void tp_count(gpt_model *m, double t0, double bytes) {
    m->stats.comm_s += mono_s() - t0;
    m->stats.analytic_bytes += (uint64_t)bytes;
    m->stats.calls++;
}

/* Whether a collective may run: the group is set and nothing failed. Where the backend
 * queues its operations (CUDA), the ones queued so far must have written the buffers the
 * collective reads: the caller syncs first (queued = true; async_start does it on the
 * training thread before its helper thread communicates). */
static bool tp_ok(gpt_model *m, const char *what, bool queued) {
    if (m->be->status) return false;
    if (!m->tpc || m->tpc->size != m->tp || m->tpc->rank != m->tpr) {
        m->be->status = co_err_set(CO_EINVAL, "%s: the tensor group is not set (gpt_set_tensor_group)", what);
        return false;
    }
    if (queued && !m->host_batch) {
        m->ops->sync(m->be);
        if (m->be->status) return false;
    }
    return true;
}

/* x[n] summed over the group (reduce_from_tensor_region) */
static void tp_allreduce_q(gpt_model *m, float *x, size_t n, bool queued) {
    if (!tp_ok(m, "tensor-parallel all-reduce", queued)) return;
    double t0 = mono_s();
    int rc = m->tpc->ops->allreduce_sum(m->tpc, x, n, CM_F32, m->tp_timeout);
    if (rc) m->be->status = rc;
    tp_count(m, t0, 2.0 * (m->tp - 1) / m->tp * (double)n * sizeof(float));
}
static void tp_allreduce(gpt_model *m, float *x, size_t n) { tp_allreduce_q(m, x, n, true); }

/* full[N,C] (every rank's) summed, this rank's rows [r N/tp, (r+1) N/tp) into shard */
static void tp_reduce_scatter_q(gpt_model *m, float *shard, const float *full, size_t shard_n, bool queued) {
    if (!tp_ok(m, "tensor-parallel reduce-scatter", queued)) return;
    double t0 = mono_s();
    int rc = m->tpc->ops->reduce_scatter_sum(m->tpc, full, shard, shard_n, CM_F32, m->tp_timeout);
    if (rc) m->be->status = rc;
    tp_count(m, t0, (double)(m->tp - 1) * (double)shard_n * sizeof(float));
}
static void tp_reduce_scatter(gpt_model *m, float *shard, const float *full, size_t shard_n) {
    tp_reduce_scatter_q(m, shard, full, shard_n, true);
}

/* full = every rank's shard, in rank order */
static void tp_allgather(gpt_model *m, float *full, const float *shard, size_t shard_n) {
    if (!tp_ok(m, "tensor-parallel all-gather", true)) return;
    double t0 = mono_s();
    int rc = m->tpc->ops->allgather(m->tpc, shard, full, shard_n * sizeof(float), m->tp_timeout);
    if (rc) m->be->status = rc;
    tp_count(m, t0, (double)(m->tp - 1) * (double)shard_n * sizeof(float));
}

void gpt_tp_set_overlap(gpt_model *m, bool on) { m->overlap = on; }

double gpt_tp_grad_sumsq(gpt_model *m) {
    const kb_ops *o = m->ops;
    double sum = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        const float *g = m->grads + t->offset;
        if (t->split == GPT_TP_COLS || m->tp == 1) {
            sum += o->sumsq(m->be, g, t->numel);
            continue;
        }
        /* rows (or a replicated tensor, one run of every row): each run counted by the first
         * of the ranks that hold it */
        size_t cols = (size_t)(t->shape[1] ? t->shape[1] : 1);
        for (int k = 0; k < t->npieces; k++)
            if (m->tpr % t->piece[k].share == 0)
                sum += o->sumsq(m->be, g + (size_t)t->piece[k].local * cols, (size_t)t->piece[k].len * cols);
    }
    return sum;
}

/* The sum of a column-parallel layer's input gradient over the group, on a helper thread
 * while this one computes the weight gradient (Megatron's async all-reduce of dgrad,
 * reduce-scatter under SP); the communicator is used by that thread alone meanwhile. */
typedef struct tp_async {
    gpt_model *m;
    size_t n; /* elements of this rank's part of the sum: its tokens' rows x C */
    pthread_t th;
    bool running;
} tp_async;

/* (the training thread synced the backend: the input gradient is written) */
static void input_grad_sum(gpt_model *m, size_t n) {
    if (m->sp) tp_reduce_scatter_q(m, m->dh, m->dfull, n, false);
    else tp_allreduce_q(m, m->dh, n, false);
}

static void *async_main(void *p) {
    tp_async *a = p;
    input_grad_sum(a->m, a->n);
    return NULL;
}

/* N tokens' input gradient [N, C] */
static void async_start(tp_async *a, gpt_model *m, int N) {
    a->m = m;
    a->n = (size_t)(m->sp ? N / m->tp : N) * (size_t)m->cfg.hidden;
    if (!m->host_batch) m->ops->sync(m->be); /* the input gradient the helper sums is written */
    a->running = m->overlap && !pthread_create(&a->th, NULL, async_main, a);
    if (!a->running) input_grad_sum(m, a->n);
}

static void async_wait(tp_async *a) {
    if (a->running) pthread_join(a->th, NULL);
    a->running = false;
}

/* din (summed over the group into dh) and dW of a column-parallel layer (qkv, fc1, the
 * output layer): the input gradient first, its sum started, the weight gradient meanwhile.
 * At tp 1 the one-rank product into dh. */
static void column_parallel_backward(gpt_model *m, float *dW, float *dbias, const float *dout, const float *in,
                                     const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    const kb_ops *o = m->ops;
    if (m->tp == 1) {
        o->linear_backward(m->be, m->dh, dW, dbias, dout, in, W, W16, N, IC, OC);
        return;
    }
    float *din = m->sp ? m->dfull : m->dh;
    o->linear_backward(m->be, din, NULL, dbias, dout, in, W, W16, N, IC, OC);
    tp_async a;
    async_start(&a, m, N);
    o->linear_backward(m->be, NULL, dW, NULL, dout, in, W, W16, N, IC, OC);
    async_wait(&a);
}

int gpt_tp_finalize_grads(gpt_model *m) {
    if (m->tp == 1 || !m->tp_buf_n) return kb_backend_status(m->be);
    const gpt_config *c = &m->cfg;
    int HD = c->head_dim;
    size_t k = 0;
    /* pack: partial replicated gradients whole; shared key/value rows at their place in the
     * global span [NH HD, (NH + 2 NKV) HD) of rows, zeros where this rank holds none */
    memset(m->tp_buf, 0, m->tp_buf_n * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        k = 0;
        for (int i = 0; i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            float *g = m->grads + t->offset;
            if (t->partial_grad) {
                if (pass == 0) memcpy(m->tp_buf + k, g, t->numel * sizeof(float));
                else memcpy(g, m->tp_buf + k, t->numel * sizeof(float));
                k += t->numel;
            }
            if (t->split == GPT_TP_ROWS && t->npieces == 3 && t->piece[1].share > 1) {
                size_t cols = (size_t)(t->shape[1] ? t->shape[1] : 1), base = (size_t)c->heads * HD;
                for (int q = 1; q < 3; q++) {
                    const gpt_piece *p = &t->piece[q];
                    float *span = m->tp_buf + k + ((size_t)p->global - base) * cols;
                    float *loc = g + (size_t)p->local * cols;
                    if (pass == 0) memcpy(span, loc, (size_t)p->len * cols * sizeof(float));
                    else memcpy(loc, span, (size_t)p->len * cols * sizeof(float));
                }
                k += (size_t)2 * c->kv_groups * HD * cols;
            }
        }
        if (pass == 0) tp_allreduce(m, m->tp_buf, k);
        if (kb_backend_status(m->be)) return kb_backend_status(m->be);
    }
    return 0;
}

/* Dropout stream offsets: each dropout site of a micro batch gets its own counter range. */
static uint64_t site(int layer, int which) { return ((uint64_t)(layer + 1) * 8u + (uint64_t)which) << 40; }

/* The seed of dropout inside the tensor region (this rank's attention heads): Megatron's
 * seed + 2718 + tp_rank under tensor parallelism; the plain seed at tp 1. */
static uint64_t tp_seed(const gpt_model *m, uint64_t seed) { return m->tp > 1 ? seed + 2718u + (uint64_t)m->tpr : seed; }

/* A row-parallel layer (proj, fc2) forward: out[Nl,C] = (in[N,IC] W^T summed over the
 * group, reduce-scattered to this rank's tokens under SP) + bias. At tp 1 one fused product. */
static void row_parallel_forward(gpt_model *m, float *out, const float *in, const float *W, const kb_bf16 *W16,
                                 const float *bias, int N, int IC, int Nl) {
    const kb_ops *o = m->ops;
    int C = m->cfg.hidden;
    if (m->tp == 1) {
        o->linear_forward(m->be, out, in, W, W16, bias, N, IC, C);
        return;
    }
    o->linear_forward(m->be, m->sp ? m->dfull : out, in, W, W16, NULL, N, IC, C);
    if (m->sp) tp_reduce_scatter(m, out, m->dfull, (size_t)Nl * C);
    else tp_allreduce(m, out, (size_t)Nl * C);
    if (bias) o->bias_add(m->be, out, bias, Nl, C);
}

/* Its backward: dbias from this rank's tokens' dout[Nl,C], then (SP: all-gathered) the
 * input gradient din[N,IC] and dW. */
static void row_parallel_backward(gpt_model *m, float *din, float *dW, float *dbias, const float *dout,
                                  const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int Nl) {
    const kb_ops *o = m->ops;
    int C = m->cfg.hidden;
    if (m->tp == 1) {
        o->linear_backward(m->be, din, dW, dbias, dout, in, W, W16, N, IC, C);
        return;
    }
    if (dbias) o->bias_grad(m->be, dbias, dout, Nl, C);
    if (m->sp) tp_allgather(m, m->dfull, dout, (size_t)Nl * C), dout = m->dfull;
    o->linear_backward(m->be, din, dW, NULL, dout, in, W, W16, N, IC, C);
}

double gpt_forward(gpt_model *m, const gpt_batch *b, bool train, uint64_t seed, const float *dscale,
                   float *losses) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int B = b->B, T = b->T, N = B * T, C = c->hidden, Q = qkv_local(m), F = m->Fl, F1 = fc1_local(m);
    int AH = m->NHl * c->head_dim, NH = m->NHl, NKV = m->NKVl, V = m->Vl;
    bool par = m->tp > 1, sp = m->sp;
    /* rows of the token-wise part on this rank: all N, or its N/tp under sequence parallelism */
    int Nl = sp ? N / m->tp : N;
    size_t NlC = (size_t)Nl * C;
    uint64_t hoff = sp ? (uint64_t)m->tpr * NlC : 0; /* its first element's global index */
    float ph = train ? c->hidden_dropout : 0.0f, pa = train ? c->attention_dropout : 0.0f;
    m->last_B = B;
    m->last_T = T;
    if (sp && N % m->tp) {
        be->status = co_err_set(CO_EINVAL, "sequence parallelism: %d tokens do not split over %d ranks", N, m->tp);
        return NAN;
    }
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
    if (!par) {
        o->embed_forward(be, x, tokens, positions, P(m, m->t_wte), P(m, m->t_wpe), N, C);
    } else {
        /* vocabulary-parallel embedding: this shard's rows, zero for other ids, summed over
         * the group (reduce-scattered to the token shards under sequence parallelism); the
         * position rows added once, by rank 0 (a sum with zeros: the one-rank values) */
        for (int n = 0; n < N; n++) {
            int32_t id = b->tokens[n] - m->v0;
            m->tok_l[n] = id >= 0 && id < V ? id : -1;
        }
        const int32_t *tokl = m->tok_l;
        if (!m->host_batch) {
            o->copy(be, m->d_tokl, m->tok_l, sizeof(int32_t) * (size_t)N);
            tokl = m->d_tokl;
        }
        float *e = sp ? m->gath : x;
        o->embed_forward(be, e, tokl, positions, P(m, m->t_wte), m->tpr == 0 ? P(m, m->t_wpe) : NULL, N, C);
        if (sp) tp_reduce_scatter(m, x, e, NlC);
        else tp_allreduce(m, x, (size_t)N * C);
    }
    if (ph > 0) o->dropout(be, x, x, NlC, ph, seed, site(-1, 0) + hoff);

    for (int l = 0; l < c->num_layers; l++) {
        layer_acts *a = &m->acts[l];
        const int *t = &m->t_layer[l * NLAYER_T];
        float *x_out = l + 1 < c->num_layers ? m->acts[l + 1].x_in : m->x_final;
        o->norm_forward(be, c->rmsnorm, a->ln1, a->ln1_mean, a->ln1_rstd, a->x_in, P(m, t[LN1_W]),
                        P(m, t[LN1_B]), Nl, C, c->norm_eps);
        /* column-parallel qkv (its input all-gathered under sequence parallelism) */
        const float *in1 = a->ln1;
        if (sp) tp_allgather(m, m->gath, a->ln1, NlC), in1 = m->gath;
        o->linear_forward(be, a->qkv, in1, P(m, t[QKV_W]), P16(m, t[QKV_W]), P(m, t[QKV_B]), N, C, Q);
        if (c->rope) o->rope(be, a->qkv, positions, N, NH, NKV, c->head_dim, c->rotary_base, false);
        o->attention_forward(be, a->att, a->lse, a->qkv, seg, B, T, NH, NKV, c->head_dim, pa, tp_seed(m, seed),
                             site(l, 1));
        /* row-parallel proj: x_mid = x_in + dropout(sum over the group of att Wproj^T, + b) */
        float *tmp = m->tmp;
        row_parallel_forward(m, tmp, a->att, P(m, t[PROJ_W]), P16(m, t[PROJ_W]), P(m, t[PROJ_B]), N, AH, Nl);
        if (ph > 0) o->dropout(be, tmp, tmp, NlC, ph, seed, site(l, 2) + hoff);
        o->add(be, a->x_mid, a->x_in, tmp, NlC);
        o->norm_forward(be, c->rmsnorm, a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, P(m, t[LN2_W]),
                        P(m, t[LN2_B]), Nl, C, c->norm_eps);
        const float *in2 = a->ln2;
        if (sp) tp_allgather(m, m->gath, a->ln2, NlC), in2 = m->gath;
        o->linear_forward(be, a->fc1, in2, P(m, t[FC1_W]), P16(m, t[FC1_W]), P(m, t[FC1_B]), N, C, F1);
        if (c->swiglu) o->swiglu_forward(be, a->act, a->fc1, N, F);
        else o->gelu_forward(be, a->act, a->fc1, (size_t)N * F);
        row_parallel_forward(m, tmp, a->act, P(m, t[FC2_W]), P16(m, t[FC2_W]), P(m, t[FC2_B]), N, F, Nl);
        if (ph > 0) o->dropout(be, tmp, tmp, NlC, ph, seed, site(l, 3) + hoff);
        o->add(be, x_out, a->x_mid, tmp, NlC);
    }
    o->norm_forward(be, c->rmsnorm, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_final, P(m, m->t_lnf_w),
                    P(m, m->t_lnf_b), Nl, C, c->norm_eps);
    if (m->act_flip) {
        /* an injected silent corruption of one activation (resilience/inject.h): the
         * final norm's output, which the output layer and its gradients read */
        uint32_t u;
        size_t n = NlC, i = m->act_flip_index % n;
        /* the first element from there below 1 in magnitude: a high exponent bit then
         * turns it into a huge value instead of a tiny one */
        o->sync(be); /* the norm's output is written before the host reads it (CUDA) */
        for (size_t k = 0; k < n && !(fabsf(m->lnf[i]) < 1.0f); k++) i = (i + 1) % n;
        memcpy(&u, &m->lnf[i], sizeof u);
        u ^= 1u << m->act_flip_bit;
        memcpy(&m->lnf[i], &u, sizeof u);
        m->act_flip = false;
    }
    const float *inf = m->lnf;
    if (sp) tp_allgather(m, m->gath, m->lnf, NlC), inf = m->gath;
    /* the output layer: column-parallel over the vocabulary */
    o->linear_forward(be, m->logits, inf, P(m, m->t_lm), P16(m, m->t_lm), NULL, N, C, V);
    if (!dscale) {
        o->sync(be); /* sampling: the logits stay readable by the host */
        return 0.0;
    }
    if (!par) {
        o->cross_entropy(be, m->losses, m->logits, targets, dscale, N, V);
    } else {
        /* vocabulary-parallel cross-entropy: the row max over the group (gathered, then the
         * max taken here: exact), the sums of exponentials and the target logit summed */
        o->ce_max(be, m->ce_mx, m->logits, N, V);
        tp_allgather(m, m->ce_all, m->ce_mx, (size_t)N);
        if (!be->status)
            for (int n = 0; n < N; n++) {
                float mx = m->ce_all[n];
                for (int k = 1; k < m->tp; k++) mx = m->ce_all[(size_t)k * N + n] > mx ? m->ce_all[(size_t)k * N + n] : mx;
                m->ce_mx[n] = mx;
            }
        o->ce_sums(be, m->ce_sums, m->logits, m->ce_mx, targets, m->v0, N, V);
        tp_allreduce(m, m->ce_sums, (size_t)2 * N);
        o->ce_grad(be, m->losses, m->logits, m->ce_mx, m->ce_sums, targets, dscale, m->v0, c->padded_vocab, N, V);
    }
    if (be->status) return NAN;
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
    if (m->tp > 1) return NULL;
    return m->logits + ((size_t)b * m->last_T + (size_t)t) * m->cfg.padded_vocab;
}

void gpt_backward(gpt_model *m, const gpt_batch *b, uint64_t seed) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int B = b->B, T = b->T, N = B * T, C = c->hidden, Q = qkv_local(m), F = m->Fl, F1 = fc1_local(m);
    int AH = m->NHl * c->head_dim, NH = m->NHl, NKV = m->NKVl, V = m->Vl;
    bool par = m->tp > 1, sp = m->sp;
    int Nl = sp ? N / m->tp : N;
    size_t NlC = (size_t)Nl * C;
    uint64_t hoff = sp ? (uint64_t)m->tpr * NlC : 0;
    float ph = c->hidden_dropout, pa = c->attention_dropout;
    /* the batch as the last forward copied it (CPU: the caller's arrays) */
    const int32_t *tokens = m->host_batch ? b->tokens : m->d_tok;
    const int32_t *positions = m->host_batch || !b->positions ? b->positions : m->d_pos;
    const int32_t *seg = m->host_batch || !b->seg ? b->seg : m->d_seg;
    if (par) tokens = m->host_batch ? m->tok_l : m->d_tokl;
    /* Under tensor parallelism the input gradient of a column-parallel layer is a part:
     * summed over the group into dh (reduce-scattered to this rank's tokens under sequence
     * parallelism) beside its weight gradient (column_parallel_backward); the gradient a
     * row-parallel layer receives is the token shards' all-gathered. */

    /* LM head: logits hold dloss/dlogits */
    const float *inf = m->lnf;
    if (sp) tp_allgather(m, m->gath, m->lnf, NlC), inf = m->gath;
    column_parallel_backward(m, G(m, m->t_lm), NULL, m->logits, inf, P(m, m->t_lm), P16(m, m->t_lm), N, C, V);
    o->zero(be, m->dx, NlC);
    o->norm_backward(be, c->rmsnorm, m->dx, G(m, m->t_lnf_w), G(m, m->t_lnf_b), m->dh, m->x_final,
                     P(m, m->t_lnf_w), m->lnf_mean, m->lnf_rstd, Nl, C);

    for (int l = c->num_layers - 1; l >= 0; l--) {
        layer_acts *a = &m->acts[l];
        const int *t = &m->t_layer[l * NLAYER_T];
        /* MLP branch: dmlp = dropout'(dx) */
        const float *dmlp = m->dx;
        if (ph > 0) {
            o->dropout(be, m->tmp, m->dx, NlC, ph, seed, site(l, 3) + hoff);
            dmlp = m->tmp;
        }
        row_parallel_backward(m, m->dffn, G(m, t[FC2_W]), G(m, t[FC2_B]), dmlp, a->act, P(m, t[FC2_W]),
                              P16(m, t[FC2_W]), N, F, Nl);
        if (c->swiglu) o->swiglu_backward(be, m->dbig, m->dffn, a->fc1, N, F);
        else o->gelu_backward(be, m->dbig, m->dffn, a->fc1, (size_t)N * F);
        const float *in2 = a->ln2;
        if (sp) tp_allgather(m, m->gath, a->ln2, NlC), in2 = m->gath;
        column_parallel_backward(m, G(m, t[FC1_W]), G(m, t[FC1_B]), m->dbig, in2, P(m, t[FC1_W]), P16(m, t[FC1_W]), N,
                                 C, F1);
        o->norm_backward(be, c->rmsnorm, m->dx, G(m, t[LN2_W]), G(m, t[LN2_B]), m->dh, a->x_mid,
                         P(m, t[LN2_W]), a->ln2_mean, a->ln2_rstd, Nl, C);
        /* attention branch */
        const float *datt_out = m->dx;
        if (ph > 0) {
            o->dropout(be, m->tmp, m->dx, NlC, ph, seed, site(l, 2) + hoff);
            datt_out = m->tmp;
        }
        row_parallel_backward(m, m->datt, G(m, t[PROJ_W]), G(m, t[PROJ_B]), datt_out, a->att, P(m, t[PROJ_W]),
                              P16(m, t[PROJ_W]), N, AH, Nl);
        o->attention_backward(be, m->dqkv, m->datt, a->qkv, a->att, a->lse, seg, B, T, NH, NKV, c->head_dim, pa,
                              tp_seed(m, seed), site(l, 1));
        if (c->rope) o->rope(be, m->dqkv, positions, N, NH, NKV, c->head_dim, c->rotary_base, true);
        const float *in1 = a->ln1;
        if (sp) tp_allgather(m, m->gath, a->ln1, NlC), in1 = m->gath;
        column_parallel_backward(m, G(m, t[QKV_W]), G(m, t[QKV_B]), m->dqkv, in1, P(m, t[QKV_W]), P16(m, t[QKV_W]), N,
                                 C, Q);
        o->norm_backward(be, c->rmsnorm, m->dx, G(m, t[LN1_W]), G(m, t[LN1_B]), m->dh, a->x_in, P(m, t[LN1_W]),
                         a->ln1_mean, a->ln1_rstd, Nl, C);
    }
    if (ph > 0) o->dropout(be, m->dx, m->dx, NlC, ph, seed, site(-1, 0) + hoff);
    /* the embedding: every rank adds the full gradient of the position rows (identical on
     * all of them) and of its vocabulary shard's word rows */
    const float *demb = m->dx;
    if (sp) tp_allgather(m, m->dfull, m->dx, NlC), demb = m->dfull;
    o->embed_backward(be, G(m, m->t_wte), G(m, m->t_wpe), demb, tokens, positions, N, C, V);
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
