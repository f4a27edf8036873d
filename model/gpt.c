/* gpt.c - the GPT decoder's parameters: the tensor table (names, global and local shapes,
 * each tensor-parallel slice, the layers of this rank's pipeline chunks, offsets into one flat
 * buffer), the buffers (parameters, gradients, the bf16 copy, activations per chunk and
 * micro batch in flight, scratch), Megatron's initialisation, checksums. The forward and
 * backward are in gpt_step.c, the tensor group's collectives and layers in gpt_tp.c. */
#include "model/gpt_internal.h"

#include "kernels/checksum.h"
#include "model/gpt_check.h"
#include "model/ring_attention.h"

#include <xxhash.h>

#include "common/error.h"
#include "common/log.h"
#include "common/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpt_padded_vocab(int vocab, int m) { return (vocab + m - 1) / m * m; }

/* A tensor split as `split` says, this rank's slice given by pieces (NULL: replicated). */
static int add_split(gpt_model *m, int cap, const char *name, int grows, int gcols, int split,
                     const gpt_piece *pieces, int npieces, bool decay, float std, bool ones) {
    if (m->ntensors >= cap) return -1;
    gpt_tensor *t = &m->tensors[m->ntensors];
    size_t ln = strlen(name);
    if (ln >= sizeof t->name) return -1; /* names are at most 63 characters (checkpoints) */
    memcpy(t->name, name, ln + 1);
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
    /* keep every tensor 16-float aligned so kernels see aligned rows (a MoE layer's block is
     * one run in moe.h's layout: padded after its last tensor) */
    m->nparams += m->pack ? t->numel : (t->numel + 15) / 16 * 16;
    t->decay = decay;
    t->init_std = std;
    t->init_ones = ones;
    /* inside a packed run: the run moves as one (gpt_relayout) */
    t->packed = m->pack && m->ntensors > 0 && m->tensors[m->ntensors - 1].packed_run == m->pack_run;
    t->packed_run = m->pack ? m->pack_run : -1;
    return m->ntensors++;
}

static int add_tensor(gpt_model *m, int cap, const char *name, int rows, int cols, bool decay,
                      float std, bool ones) {
    return add_split(m, cap, name, rows, cols, GPT_TP_REPLICATED, NULL, 0, decay, std, ones);
}


bool gpt_layer_is_moe(const gpt_config *c, int l) {
    /* (an MTP depth's layer, l >= num_layers, is dense) */
    if (c->moe.num_experts <= 0 || l < 0 || l >= c->num_layers) return false;
    if (c->moe_listed) return l < GPT_MOE_LIST_MAX && (c->moe_list[l / 64] >> (l % 64) & 1);
    return l % (c->moe_layer_freq > 0 ? c->moe_layer_freq : 1) == 0;
}

/* The MoE layer's configuration with the model's hidden size and activation. */
static moe_config moe_of(const gpt_config *c) {
    moe_config mc = c->moe;
    mc.hidden = c->hidden;
    mc.swiglu = c->swiglu;
    return mc;
}

static int qkv_width(const gpt_config *c) { return (c->heads + 2 * c->kv_groups) * c->head_dim; }
static int fc1_width(const gpt_config *c) { return c->swiglu ? 2 * c->ffn_hidden : c->ffn_hidden; }

int gpt_tp_check(const gpt_config *c, int max_T) {
    int tp = c->tp > 1 ? c->tp : 1;
    if (tp == 1) return 0;
    if (c->tp_rank < 0 || c->tp_rank >= tp)
        return co_err_set(CO_EINVAL, "tensor-parallel rank %d is outside a group of %d", c->tp_rank, tp);
    return gpt_tp_rules(c, max_T, NULL);
}

/* This rank's shapes (tp, rank, local heads, groups, ffn, vocabulary) from m->cfg, checked. */
static int model_shape(gpt_model *m, int max_T) {
    const gpt_config *c = &m->cfg;
    m->tp = c->tp > 1 ? c->tp : 1;
    m->tpr = m->tp > 1 ? c->tp_rank : 0;
    m->sp = m->tp > 1 && c->sequence_parallel;
    m->cp = c->cp > 1 ? c->cp : 1;
    m->cpr = m->cp > 1 ? c->cp_rank : 0;
    int rc = gpt_tp_check(c, max_T);
    if (rc) return rc;
    if (c->mtp_layers < 0 || c->mtp_layers > GPT_MAX_MTP)
        return co_err_set(CO_EINVAL, "%d multi-token prediction depths (at most %d)", c->mtp_layers, GPT_MAX_MTP);
    if (c->mtp_layers > 0) {
        /* eh_proj is column-parallel: C / tp output rows per rank */
        if (m->tp > 1 && c->hidden % m->tp)
            return co_err_set(CO_EINVAL,
                              "multi-token prediction: --hidden-size %d is not divisible by "
                              "--tensor-model-parallel-size %d (eh_proj is column-parallel)",
                              c->hidden, m->tp);
        /* a stage without the embedding runs the depths on its copy of the word embedding;
         * the position table stays on the first stage (Megatron's docs: learned absolute
         * positions are unsupported with MTP) */
        for (int k = 0; k < c->nchunks; k++) {
            const gpt_chunk *d = &c->chunks[k];
            bool runs = d->mtp || (d->head && !d->mtp_in);
            if (runs && !d->embedding && !c->rope)
                return co_err_set(CO_EUNSUPPORTED, "multi-token prediction on a pipeline stage without the embedding "
                                                   "needs rope (--position-embedding-type rope): the stage holds no "
                                                   "position table");
        }
    }
    for (int k = 0; k < c->nchunks; k++)
        if ((c->chunks[k].mtp || c->chunks[k].mtp_in) && c->mtp_layers <= 0)
            return co_err_set(CO_EINVAL, "model chunk %d: MTP placement flags without --mtp-num-layers", k);
    if (c->moe.num_experts > 0) {
        moe_offsets mo;
        moe_config mc = moe_of(c);
        if ((rc = moe_layout(&mc, &mo))) return rc;
        /* tensor parallelism: Megatron's experts whole on every tensor rank (expert tensor-
         * parallel size 1) over this rank's tokens, which needs sequence parallelism */
        if (m->tp > 1 && !m->sp)
            return co_err_set(CO_EUNSUPPORTED, "mixture of experts with tensor parallelism needs sequence parallelism "
                                               "(as Megatron)");
        /* (context parallelism combines with expert parallelism: each context rank routes its
         * own tokens and exchanges them within its expert group, trainer_ep.c) */
        if (c->bias)
            return co_err_set(CO_EINVAL, "mixture of experts: the experts have no biases; add --disable-bias-linear");
        /* the experts split over the tensor group (expert tensor-parallel size = tp, the only
         * one besides 1: the expert-tensor rank is the tensor rank) */
        int etp = c->moe.etp_size > 1 ? c->moe.etp_size : 1;
        if (etp > 1 && (etp != m->tp || c->moe.ffn_hidden % etp))
            return co_err_set(CO_EUNSUPPORTED, "mixture of experts: %d expert-tensor-parallel ranks with %d tensor-"
                                               "parallel ranks and expert size %d (the expert-tensor size must be 1 "
                                               "or the tensor size, and divide the expert size)",
                              etp, m->tp, c->moe.ffn_hidden);
        int ep = c->moe.ep_size > 1 ? c->moe.ep_size : 1;
        if (c->ep_rank < 0 || c->ep_rank >= ep)
            return co_err_set(CO_EINVAL, "expert-parallel rank %d is outside a group of %d", c->ep_rank, ep);
    }
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
    /* the chunks: without pipelining one chunk of every layer with the embedding and the head */
    if (c->nchunks <= 0) {
        m->cfg.nchunks = 1;
        m->cfg.chunks[0] = (gpt_chunk){.layer0 = 0, .nlayers = c->num_layers, .embedding = true, .head = true, .slots = 1};
    }
    /* the head runs the MTP depths unless an earlier stage did */
    for (int k = 0; k < m->cfg.nchunks; k++) {
        gpt_chunk *d = &m->cfg.chunks[k];
        if (c->mtp_layers > 0 && d->head && !d->mtp_in) d->mtp = true;
    }
    if (m->cfg.nchunks > GPT_MAX_CHUNKS)
        return co_err_set(CO_EINVAL, "%d model chunks on one rank (at most %d)", m->cfg.nchunks, GPT_MAX_CHUNKS);
    int next = -1;
    for (int k = 0; k < m->cfg.nchunks; k++) {
        gpt_chunk *d = &m->cfg.chunks[k];
        if (d->slots < 1) d->slots = 1;
        if (d->layer0 < 0 || d->nlayers < 0 || d->layer0 + d->nlayers > c->num_layers || d->layer0 < next ||
            (d->embedding && (k || d->layer0)) || (d->head && (k + 1 < m->cfg.nchunks || d->layer0 + d->nlayers < c->num_layers)) ||
            /* the MTP chunk comes after every decoder layer, and whoever receives its
             * streams holds none (and runs no depths of its own) */
            (d->mtp && !d->head && (d->embedding || d->mtp_in || k + 1 < m->cfg.nchunks || d->layer0 + d->nlayers < c->num_layers)) ||
            (d->mtp_in && (d->nlayers || d->embedding)))
            return co_err_set(CO_EINVAL, "model chunk %d (layers %d..%d of %d%s%s%s%s) does not fit this rank's chunks",
                              k, d->layer0, d->layer0 + d->nlayers - 1, c->num_layers,
                              d->embedding ? ", embedding" : "", d->head ? ", head" : "", d->mtp ? ", MTP" : "",
                              d->mtp_in ? ", after MTP" : "");
        next = d->layer0 + d->nlayers;
    }
    m->nchunks = m->cfg.nchunks;
    for (int k = 0; k < m->nchunks; k++) {
        m->chunk[k].def = m->cfg.chunks[k];
        m->chunk[k].slots = m->cfg.chunks[k].slots;
    }
    return 0;
}

/* The tensor table of this rank (model_shape first): names, global and local shapes, the
 * slice of each split tensor, offsets into the flat buffers (m->nparams their total). */
static int build_tensors(gpt_model *m) {
    const gpt_config *c = &m->cfg;
    int tp = m->tp, r = m->tpr, HD = c->head_dim;
    int kv_share = c->kv_groups >= tp ? 1 : tp / c->kv_groups;
    int L = c->num_layers, C = c->hidden, AH = m->NHl * HD;
    int E = c->moe.num_experts, ep = c->moe.ep_size > 1 ? c->moe.ep_size : 1, El = E / ep, e0 = c->ep_rank * El;
    int D = c->mtp_layers > 0 ? c->mtp_layers : 0;
    int cap = 8 + L * (NLAYER_T + 2 * El + 3) + D * (NLAYER_T + 8);
    m->ntensors = 0;
    m->nparams = 0;
    m->tensors = calloc((size_t)cap, sizeof *m->tensors);
    m->t_layer = malloc(sizeof(int) * (size_t)(L + D) * NLAYER_T);
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
    gpt_piece pe[1] = {{0, r * (C / tp), C / tp, 1}}; /* an MTP depth's eh_proj rows */
    int nf = c->swiglu ? 2 : 1;
#define ROWS(p, n) GPT_TP_ROWS, par ? (p) : NULL, (n)
#define COLS(p, n) GPT_TP_COLS, par ? (p) : NULL, (n)
    m->t_wte = m->t_wpe = m->t_lnf_w = m->t_lnf_b = m->t_lm = -1;
    for (int l = 0; l < (L + D) * NLAYER_T; l++) m->t_layer[l] = -1;
    for (int k = 0; k < GPT_MAX_MTP; k++)
        for (int q = 0; q < MTP_NT; q++) m->t_mtp[k][q] = -1;
    char name[96], pfx[64];
    for (int k = 0; k < m->nchunks; k++) {
        const gpt_chunk *d = &m->chunk[k].def;
        if (d->embedding) {
            m->t_wte = add_split(m, cap, "embedding.word_embeddings.weight", c->padded_vocab, C, ROWS(pv, 1), true,
                                 std, false);
            m->t_wpe = c->rope ? -1
                               : add_tensor(m, cap, "embedding.position_embeddings.weight", c->max_positions, C, true,
                                            std, false);
        }
        /* the chunk's layers, and on the chunk running the MTP depths their transformer
         * layers (global layer L + k, named under mtp.layers.k.transformer_layer) */
        int nl = d->nlayers + (d->mtp ? D : 0);
        for (int li = 0; li < nl; li++) {
            int l = li < d->nlayers ? d->layer0 + li : L + (li - d->nlayers);
            int *t = &m->t_layer[l * NLAYER_T];
            if (l < L) snprintf(pfx, sizeof pfx, "layers.%d.", l);
            else snprintf(pfx, sizeof pfx, "mtp.layers.%d.transformer_layer.", l - L);
#define NAME(s) (snprintf(name, sizeof name, "%s%s", pfx, s), name)
            t[LN1_W] = add_tensor(m, cap, NAME("input_norm.weight"), C, 0, false, 0, !c->norm_1p);
            if (!c->rmsnorm) t[LN1_B] = add_tensor(m, cap, NAME("input_norm.bias"), C, 0, false, 0, false);
            int GQ = qkv_width(c), GA = c->heads * HD;
            t[QKV_W] = add_split(m, cap, NAME("attention.qkv.weight"), GQ, C, ROWS(pq, 3), true, std, false);
            if (c->bias)
                t[QKV_B] = add_split(m, cap, NAME("attention.qkv.bias"), GQ, 0, ROWS(pq, 3), false, 0, false);
            t[PROJ_W] = add_split(m, cap, NAME("attention.proj.weight"), C, GA, COLS(pa, 1), true, ostd, false);
            if (c->bias) t[PROJ_B] = add_tensor(m, cap, NAME("attention.proj.bias"), C, 0, false, 0, false);
            t[LN2_W] = add_tensor(m, cap, NAME("mlp_norm.weight"), C, 0, false, 0, !c->norm_1p);
            if (!c->rmsnorm) t[LN2_B] = add_tensor(m, cap, NAME("mlp_norm.bias"), C, 0, false, 0, false);
            if (gpt_layer_is_moe(c, l)) {
                /* the router, the local experts' fc1 then fc2, the shared expert: one unpadded
                 * run in moe.h's layout (the router's index locates the block) */
                int Fm = c->moe.ffn_hidden, Fm1 = c->swiglu ? 2 * Fm : Fm, Fs = c->moe.shared_ffn;
                int Fs1 = c->swiglu ? 2 * Fs : Fs;
                /* experts split over the tensor group (moe.etp_size = tp): fc1 column-parallel
                 * (this rank's rows of the gate and of the up half, as the dense fc1), fc2
                 * row-parallel (its columns) */
                bool esplit = c->moe.etp_size > 1 && par;
                int Fml = esplit ? Fm / tp : Fm;
                gpt_piece pef[2] = {{0, r * Fml, Fml, 1}, {Fml, Fm + r * Fml, Fml, 1}};
                gpt_piece pec[1] = {{0, r * Fml, Fml, 1}};
                char ename[64];
                m->pack = true;
                m->pack_run = m->ntensors; /* the run's first tensor */
                t[ROUTER_W] = add_tensor(m, cap, NAME("mlp.router.weight"), E, C, true, std, false);
                for (int j = 0; j < El; j++) {
                    snprintf(ename, sizeof ename, "layers.%d.mlp.experts.%d.fc1.weight", l, e0 + j);
                    int k = add_split(m, cap, ename, Fm1, C, GPT_TP_ROWS, esplit ? pef : NULL, nf, true, std,
                                      false);
                    if (k >= 0) m->tensors[k].expert = true;
                }
                for (int j = 0; j < El; j++) {
                    snprintf(ename, sizeof ename, "layers.%d.mlp.experts.%d.fc2.weight", l, e0 + j);
                    int k = add_split(m, cap, ename, C, Fm, GPT_TP_COLS, esplit ? pec : NULL, 1, true, ostd,
                                      false);
                    if (k >= 0) m->tensors[k].expert = true;
                }
                if (Fs) {
                    add_tensor(m, cap, NAME("mlp.shared_experts.fc1.weight"), Fs1, C, true, std, false);
                    add_tensor(m, cap, NAME("mlp.shared_experts.fc2.weight"), C, Fs, true, ostd, false);
                }
                m->pack = false;
                m->nparams = (m->nparams + 15) / 16 * 16;
                /* whole on every tensor rank, each computing over its own tokens under sequence
                 * parallelism: a part of the gradient per rank (the router is Megatron's
                 * sequence-parallel parameter, the experts' gradients are summed over the
                 * expert-data-parallel group, tensor x data at expert tensor-parallel size 1) */
                for (int q = t[ROUTER_W]; q < m->ntensors; q++)
                    m->tensors[q].partial_grad =
                        m->sp && !(m->tensors[q].expert && (c->moe.ep_size > 1 || esplit));
                /* (with expert parallelism too, the expert group spans the tensor ranks: each
                 * holds other experts, whose gradients are its own; split over the tensor group,
                 * each rank's slice has the gradient of every token its expert-tensor group
                 * computed: its own) */
                if (c->moe.expert_bias)
                    t[EBIAS] = add_tensor(m, cap, NAME("mlp.router.expert_bias"), E, 0, false, 0, false);
            } else {
                t[FC1_W] = add_split(m, cap, NAME("mlp.fc1.weight"), fc1_width(c), C, ROWS(pf, nf), true, std, false);
                if (c->bias)
                    t[FC1_B] = add_split(m, cap, NAME("mlp.fc1.bias"), fc1_width(c), 0, ROWS(pf, nf), false, 0, false);
                t[FC2_W] = add_split(m, cap, NAME("mlp.fc2.weight"), C, c->ffn_hidden, COLS(pc, 1), true, ostd, false);
                if (c->bias) t[FC2_B] = add_tensor(m, cap, NAME("mlp.fc2.bias"), C, 0, false, 0, false);
            }
#undef NAME
            /* sequence parallelism: the norms and the row-parallel biases see this rank's tokens only */
            int sp_t[] = {LN1_W, LN1_B, LN2_W, LN2_B, PROJ_B, FC2_B};
            for (size_t q = 0; q < sizeof sp_t / sizeof sp_t[0]; q++)
                if (t[sp_t[q]] >= 0) m->tensors[t[sp_t[q]]].partial_grad = m->sp;
        }
        if (gpt__has_final_norm(d)) {
            m->t_lnf_w = add_tensor(m, cap, "final_norm.weight", C, 0, false, 0, !c->norm_1p);
            m->t_lnf_b = c->rmsnorm ? -1 : add_tensor(m, cap, "final_norm.bias", C, 0, false, 0, false);
            m->tensors[m->t_lnf_w].partial_grad = m->sp;
            if (m->t_lnf_b >= 0) m->tensors[m->t_lnf_b].partial_grad = m->sp;
        }
        if ((d->head && c->tied) || d->mtp) {
            if (m->t_wte < 0) {
                /* a later stage's copy of the word embedding: the tied output layer's
                 * (Megatron's last stage), the MTP depths' (Megatron's MTP stage) */
                m->t_wte = add_split(m, cap, "embedding.word_embeddings.weight", c->padded_vocab, C, ROWS(pv, 1),
                                     true, std, false);
                m->tensors[m->t_wte].emb_copy = true;
            }
        }
        if (d->head)
            m->t_lm = c->tied ? m->t_wte
                              : add_split(m, cap, "output_layer.weight", c->padded_vocab, C, ROWS(pv, 1), true, std,
                                          false);
        if (d->mtp) {
            /* multi-token prediction: each depth's norms of the embedding and of the previous
             * hidden state, the 2C -> C projection, and its final norm (its layer's tensors
             * are above) */
            for (int k = 0; k < D; k++) {
                int *q = m->t_mtp[k];
#define MNAME(s) (snprintf(name, sizeof name, "mtp.layers.%d.%s", k, s), name)
                q[MTP_EN_W] = add_tensor(m, cap, MNAME("enorm.weight"), C, 0, false, 0, !c->norm_1p);
                if (!c->rmsnorm) q[MTP_EN_B] = add_tensor(m, cap, MNAME("enorm.bias"), C, 0, false, 0, false);
                q[MTP_HN_W] = add_tensor(m, cap, MNAME("hnorm.weight"), C, 0, false, 0, !c->norm_1p);
                if (!c->rmsnorm) q[MTP_HN_B] = add_tensor(m, cap, MNAME("hnorm.bias"), C, 0, false, 0, false);
                q[MTP_EH_W] = add_split(m, cap, MNAME("eh_proj.weight"), C, 2 * C, ROWS(pe, 1), true, std, false);
                q[MTP_FN_W] = add_tensor(m, cap, MNAME("final_layernorm.weight"), C, 0, false, 0, !c->norm_1p);
                if (!c->rmsnorm) q[MTP_FN_B] = add_tensor(m, cap, MNAME("final_layernorm.bias"), C, 0, false, 0, false);
#undef MNAME
                /* the norms: replicated on every tensor rank, run on its token shard under
                 * sequence parallelism: partial gradients there (gpt_mtp.c); eh_proj is
                 * column-parallel (its rows split, its input whole) */
                for (int j = 0; j < MTP_NT; j++)
                    if (q[j] >= 0 && j != MTP_EH_W) m->tensors[q[j]].partial_grad = m->sp;
            }
        }
    }
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

/* n floats of activation memory, counted (gpt_activation_bytes) into m->act_bytes and *also */
static float *act_alloc(gpt_model *m, size_t n, size_t *also) {
    float *p = n ? m->ops->alloc(m->be, n * sizeof(float)) : NULL;
    if (p) {
        m->act_bytes += n * sizeof(float);
        if (also) *also += n * sizeof(float);
    }
    return p;
}

/* The floats' worth of room for n activations: half with bf16 storage (gpt_internal.h act16) */
static size_t act_n(size_t n, bool a16) {
    return a16 ? (n + 1) / 2 : n;
}

/* Whether this model keeps bf16 activations (gpt_internal.h act16): the backend has the
 * bf16 operations (CUDA in bf16 mode), at a context size above 1 the ring's device merge
 * too (it rounds attention's output once), and for MoE layers gather_rows_bf16 (the layer
 * widens its bf16 input into one fp32 scratch). Tensor parallelism and MTP depths take the
 * bf16 buffers as they are. */
static void choose_act16(gpt_model *m) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    bool ok = m->be->opt.bf16 && !m->be->opt.fp16 && o->norm_forward_bf16 && o->linear_forward_bf16 &&
              o->linear_backward_bf16 && o->linear_gelu_forward_bf16 && o->attention_forward_bf16 &&
              o->attention_backward_bf16 && (m->cp == 1 || o->ring_merge);
    for (int l = 0; ok && l < c->num_layers; l++) ok = !gpt_layer_is_moe(c, l) || o->gather_rows_bf16;
    m->act16 = ok;
    m->act16_mlp = m->act16 && (!c->swiglu || o->swiglu_forward_bf16);
}

/* A MoE layer's state, kept in m->moes (which owns it). */
static int moe_add(gpt_model *m, moe_layer **out, size_t N) {
    const gpt_config *c = &m->cfg;
    moe_layer **grown = realloc(m->moes, sizeof *grown * (size_t)(m->nmoes + 1));
    if (!grown) return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate model memory");
    m->moes = grown;
    moe_config mc = moe_of(c);
    int rc = moe_new(out, &mc, m->be, (int)N);
    if (rc) return co_err_set(rc, "gpt_new: a MoE layer: %s", co_err_detail());
    m->moes[m->nmoes++] = *out;
    if (!m->act16) return 0;
    /* bf16 activations (choose_act16: with MoE layers where the backend has gather_rows_bf16):
     * the layer's input (the second norm's output) is bf16, widened during each call into one
     * fp32 scratch all MoE layers share (they run one at a time) */
    if (m->moe_x32_n < N * (size_t)c->hidden) {
        if (m->moe_x32) m->ops->free(m->be, m->moe_x32);
        m->moe_x32_n = N * (size_t)c->hidden;
        if (!(m->moe_x32 = m->ops->alloc(m->be, sizeof(float) * m->moe_x32_n)))
            return co_err_set(CO_ENOMEM, "gpt_new: the MoE layers' fp32 input scratch");
        for (int k = 0; k < m->nmoes; k++) moe_set_input16(m->moes[k], m->moe_x32);
    }
    return moe_set_input16(*out, m->moe_x32);
}

/* One transformer layer's activations for micro batches of N tokens (gpt_internal.h's
 * layer_acts; Nl rows of the token-wise ones): the dense MLP's buffers (dense), a MoE layer's
 * state (moe); the selective modules a->sel recomputes point at the model's shared scratch.
 * Bytes counted into *count. 0, or the error. */
static int layer_acts_new(gpt_model *m, layer_acts *a, bool dense, bool moe, size_t N, size_t Nl, size_t *count) {
    const gpt_config *c = &m->cfg;
    size_t C = (size_t)c->hidden, AH = (size_t)m->NHl * c->head_dim, lseN = (size_t)m->max_B * m->NHl * m->max_T;
    bool ln = a->sel & GPT_RC_LAYERNORM, at = a->sel & GPT_RC_CORE_ATTN, mlp = a->sel & GPT_RC_MLP;
    struct {
        float **p;
        size_t n;
    } b[] = {{&a->x_in, Nl * C}, {&a->ln1, ln ? 0 : act_n(Nl * C, m->act16)}, {&a->ln1_mean, Nl},
             {&a->ln1_rstd, Nl}, {&a->qkv, N * (size_t)gpt__qkv_local(m)},
             {&a->att, at ? 0 : act_n(N * AH, m->act16)}, {&a->lse, at ? 0 : lseN},
             {&a->x_mid, Nl * C}, {&a->ln2, ln ? 0 : act_n(Nl * C, m->act16)}, {&a->ln2_mean, Nl}, {&a->ln2_rstd, Nl},
             {&a->fc1, dense && !mlp ? N * (size_t)gpt__fc1_local(m) : 0},
             {&a->act, dense && !mlp ? act_n(N * (size_t)m->Fl, m->act16_mlp) : 0}};
    a->owns_xin = a->owns_rest = true;
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i].n && !(*b[i].p = act_alloc(m, b[i].n, count)))
            return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate model memory");
    if (ln) a->ln1 = a->ln2 = m->rc_ln;
    if (at) a->att = m->rc_att, a->lse = m->rc_lse;
    if (mlp && dense) a->fc1 = m->rc_fc1, a->act = m->rc_act;
    if (!moe) return 0;
    if (a->sel & GPT_RC_MOE) {
        a->moe = m->rc_moe;
        return 0;
    }
    return moe_add(m, &a->moe, N);
}

static void layer_acts_free(gpt_model *m, layer_acts *a) {
    const kb_ops *o = m->ops;
    if (a->owns_xin && a->x_in) o->free(m->be, a->x_in);
    if (a->xin_shard) o->free(m->be, a->xin_shard);
    if (!a->owns_rest) return;
    float *ps[] = {a->x_mid, a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att,
                   a->lse, a->ln2, a->ln2_mean, a->ln2_rstd, a->fc1, a->act};
    float *shared[] = {m->rc_ln, m->rc_att, m->rc_lse, m->rc_fc1, m->rc_act};
    for (size_t q = 0; q < sizeof ps / sizeof ps[0]; q++) {
        bool mine = ps[q] != NULL;
        for (size_t k = 0; k < sizeof shared / sizeof shared[0]; k++) mine = mine && ps[q] != shared[k];
        if (mine) o->free(m->be, ps[q]);
    }
}

/* The recomputation's scratch (gpt_internal.h): the selective modules' shared buffers and one
 * set of a layer's activations per place in a full recomputation group. 0, or the error. */
static int recompute_scratch(gpt_model *m, size_t N, size_t Nl) {
    const gpt_config *c = &m->cfg;
    const gpt_recompute *r = &c->recompute;
    size_t C = (size_t)c->hidden, AH = (size_t)m->NHl * c->head_dim, lseN = (size_t)m->max_B * m->NHl * m->max_T;
    bool any_moe = false, any_dense = false;
    int most = 0;
    for (int k = 0; k < m->nchunks; k++) {
        const gpt_chunk *d = &m->chunk[k].def;
        if (d->nlayers > most) most = d->nlayers;
        for (int i = 0; i < d->nlayers; i++) {
            if (gpt_layer_is_moe(c, d->layer0 + i)) any_moe = true;
            else any_dense = true;
        }
    }
    size_t *cnt = &m->act_rc_bytes;
    unsigned sel = r->full ? 0 : r->modules;
    if (((sel & GPT_RC_LAYERNORM) && !(m->rc_ln = act_alloc(m, act_n(Nl * C, m->act16), cnt))) ||
        ((sel & GPT_RC_CORE_ATTN) && (!(m->rc_att = act_alloc(m, act_n(N * AH, m->act16), cnt)) ||
                                      !(m->rc_lse = act_alloc(m, lseN, cnt)))) ||
        ((sel & GPT_RC_MLP) && any_dense &&
         (!(m->rc_fc1 = act_alloc(m, N * (size_t)gpt__fc1_local(m), cnt)) ||
          !(m->rc_act = act_alloc(m, act_n(N * (size_t)m->Fl, m->act16_mlp), cnt)))))
        return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate the recomputation's scratch");
    int rc;
    if ((sel & GPT_RC_MOE) && any_moe && (rc = moe_add(m, &m->rc_moe, N))) return rc;
    if (r->full || ((sel & GPT_RC_MOE) && any_moe)) {
        size_t rows = r->distribute ? N : Nl;
        if (!(m->rc_xout = act_alloc(m, rows * C, cnt)))
            return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate the recomputation's scratch");
    }
    if (r->distribute && !(m->rc_xfull = act_alloc(m, N * C, cnt)))
        return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate the recomputation's scratch");
    if (!r->full) return 0;
    m->rc_nsets = r->full == GPT_RC_BLOCK ? 1 : (r->num_layers < most ? r->num_layers : most);
    if (m->rc_nsets < 1) m->rc_nsets = 1;
    if (!(m->rc_set = calloc((size_t)m->rc_nsets, sizeof *m->rc_set)))
        return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate the recomputation's scratch");
    for (int k = 0; k < m->rc_nsets; k++) {
        m->rc_set[k].rc_pos = -1;
        /* (a distributed group's layers run on all N rows) */
        if ((rc = layer_acts_new(m, &m->rc_set[k], any_dense, any_moe, N, Nl, cnt))) return rc;
    }
    return 0;
}

/* A chunk's layer i (global l) of one slot: its own buffers, or a full recomputation group's
 * scratch set with its own kept input (this rank's rows of it when distributed). */
static int slot_layer_new(gpt_model *m, layer_acts *a, const gpt_chunk *d, int i, size_t N, size_t Nl) {
    const gpt_config *c = &m->cfg;
    int g0, g1, l = d->layer0 + i;
    bool moe = gpt_layer_is_moe(c, l);
    int pos = gpt__rc_pos(&c->recompute, i, d->nlayers, &g0, &g1);
    if (pos < 0) {
        a->rc_pos = -1;
        a->sel = c->recompute.full ? 0 : c->recompute.modules;
        return layer_acts_new(m, a, !moe, moe, N, Nl, &m->act_layer_bytes);
    }
    *a = m->rc_set[pos];
    a->rc_pos = pos;
    a->sel = 0;
    a->owns_xin = a->owns_rest = false;
    a->xin_shard = NULL;
    if (!moe) a->moe = NULL;
    if (pos > 0) return 0;
    size_t C = (size_t)c->hidden;
    if (c->recompute.distribute && i > 0) {
        a->x_in = m->rc_xfull;
        a->xin_shard = act_alloc(m, N / (size_t)m->tp * C, &m->act_layer_bytes);
        if (!a->xin_shard) return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate model memory");
        return 0;
    }
    a->owns_xin = true;
    if (!(a->x_in = act_alloc(m, (c->recompute.distribute ? N : Nl) * C, &m->act_layer_bytes)))
        return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate model memory");
    return 0;
}

size_t gpt_activation_bytes(const gpt_model *m, size_t *layers, size_t *scratch) {
    if (layers) *layers = m->act_layer_bytes;
    if (scratch) *scratch = m->act_rc_bytes;
    return m->act_bytes;
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
    int C = c->hidden, Q = gpt__qkv_local(m), F = m->Fl, AH = m->NHl * HD;
    bool par = tp > 1;
    if (build_tensors(m)) goto nomem;

    const kb_ops *o = m->ops;
    m->params = o->alloc(be, m->nparams * sizeof(float));
    m->grads = o->alloc(be, m->nparams * sizeof(float));
    if (!m->params || !m->grads) goto nomem;
    if (be->opt.bf16 || be->opt.fp16) { /* the products' 16-bit copy of the weights */
        m->params16 = o->alloc(be, m->nparams * sizeof(kb_bf16));
        if (!m->params16) goto nomem;
    }

    size_t N = (size_t)max_B * max_T;
    choose_act16(m);
    /* rows of the token-wise activations: this rank's shard under sequence parallelism */
    size_t Nl = m->sp ? N / (size_t)tp : N;
#define A(ptr, count) \
    do { if (!((ptr) = o->alloc(be, (count) * sizeof(float)))) goto nomem; } while (0)
#define AA(ptr, count) \
    do { if (!((ptr) = act_alloc(m, (count), NULL))) goto nomem; } while (0)
    if ((rc = recompute_scratch(m, N, Nl))) goto fail;
    /* the activations of every micro batch a chunk holds at once */
    for (int k = 0; k < m->nchunks; k++) {
        chunk_state *ch = &m->chunk[k];
        if (!(ch->slot = calloc((size_t)ch->slots, sizeof *ch->slot))) goto nomem;
        for (int s = 0; s < ch->slots; s++) {
            chunk_slot *sl = &ch->slot[s];
            if (ch->def.nlayers && !(sl->acts = calloc((size_t)ch->def.nlayers, sizeof *sl->acts))) goto nomem;
            for (int i = 0; i < ch->def.nlayers; i++)
                if ((rc = slot_layer_new(m, &sl->acts[i], &ch->def, i, N, Nl))) goto fail;
            const gpt_chunk *d = &ch->def;
            int D = c->mtp_layers > 0 ? c->mtp_layers : 0;
            /* after MTP depths on an earlier stage the input is 1 + D streams */
            AA(sl->x_end, (d->mtp_in ? 1 + (size_t)D : 1) * Nl * C);
            if (gpt__has_final_norm(d)) {
                AA(sl->lnf, act_n(Nl * C, gpt__lnf16(m, d))); /* (the LM head's input: bf16 with act16) */
                AA(sl->lnf_mean, Nl);
                AA(sl->lnf_rstd, Nl);
            }
            if (d->mtp && !d->head) AA(sl->mtp_out, (1 + (size_t)D) * Nl * C);
            if (d->head) {
                AA(sl->logits, N * m->Vl);
                AA(sl->losses, N);
            }
            if (d->mtp || (d->head && d->mtp_in)) {
                /* the depths (mtp) or only their losses (the head after them) */
                if (D > 0 && !(sl->mtp = calloc((size_t)D, sizeof *sl->mtp))) goto nomem;
                for (int k = 0; k < D; k++) {
                    mtp_acts *q = &sl->mtp[k];
                    if (d->mtp) {
                        q->layer.rc_pos = -1;
                        if ((rc = layer_acts_new(m, &q->layer, true, false, N, Nl, NULL))) goto fail;
                        AA(q->emb, Nl * C);
                        AA(q->en, act_n(Nl * C, m->act16)); /* (en, hn, cat: bf16 with act16) */
                        AA(q->en_mean, Nl);
                        AA(q->en_rstd, Nl);
                        AA(q->hn, act_n(Nl * C, m->act16));
                        AA(q->hn_mean, Nl);
                        AA(q->hn_rstd, Nl);
                        AA(q->cat, act_n(2 * Nl * C, m->act16));
                        AA(q->x_out, Nl * C);
                        AA(q->out, Nl * C);
                        AA(q->out_mean, Nl);
                        AA(q->out_rstd, Nl);
                    }
                    if (d->head) {
                        AA(q->logits, N * m->Vl);
                        AA(q->losses, N);
                    }
                    q->tok = malloc(N * sizeof(int32_t));
                    q->pos = malloc(N * sizeof(int32_t));
                    q->tgt = malloc(N * sizeof(int32_t));
                    q->mask = malloc(N * sizeof(float));
                    q->dscale = malloc(N * sizeof(float));
                    if (!q->tok || !q->pos || !q->tgt || !q->mask || !q->dscale) goto nomem;
                    if (be->opt.device != KB_DEVICE_CPU) {
                        size_t ib = (size_t)N * sizeof(int32_t);
                        A(q->d_dscale, N);
                        if (!(q->d_tok = o->alloc(be, ib)) || !(q->d_pos = o->alloc(be, ib)) ||
                            !(q->d_tgt = o->alloc(be, ib)))
                            goto nomem;
                    }
                }
                if (D > 0 && d->mtp && !d->head && !m->mtp_gin) A(m->mtp_gin, (1 + (size_t)D) * N * C);
                if (D > 0 && d->mtp && !m->mtp_dout) {
                    A(m->mtp_dout, N * C);
                    A(m->mtp_dcat, 2 * N * C);
                    if (par) {
                        A(m->mtp_gcat, 2 * N * C);
                        A(m->mtp_dcatf, 2 * N * C);
                        A(m->mtp_part, N * C);
                        A(m->mtp_blk, N * C);
                    }
                    A(m->mtp_demb, N * C);
                    A(m->mtp_dh[0], N * C);
                    A(m->mtp_dh[1], N * C);
                }
            }
        }
    }
    /* dx: a chunk's input gradient, 1 + D streams on either side of an MTP stage */
    size_t nstreams = 1;
    for (int k = 0; k < m->nchunks; k++)
        if ((m->chunk[k].def.mtp && !m->chunk[k].def.head) || m->chunk[k].def.mtp_in) nstreams = 1 + (size_t)c->mtp_layers;
    A(m->dx, nstreams * N * C);
    A(m->dh, N * C);
    A(m->tmp, N * C);
    if (c->norm_1p) {
        A(m->norm_ones, C);
        A(m->norm_1p, C);
        float *ones = malloc((size_t)C * sizeof(float));
        if (!ones) goto nomem;
        for (int k = 0; k < C; k++) ones[k] = 1.0f;
        o->copy(be, m->norm_ones, ones, (size_t)C * sizeof(float));
        free(ones);
    }
    A(m->dqkv, N * Q);
    A(m->datt, N * AH);
    A(m->dbig, N * gpt__fc1_local(m));
    if (par) {
        A(m->gath, N * C);
        A(m->dfull, N * C);
        A(m->dhs, N * C);
        A(m->ce_mx, N);
        A(m->ce_all, N * tp);
        A(m->ce_sums, 2 * N);
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
    if (par && !(m->tok_l = malloc(N * sizeof(int32_t)))) goto nomem;
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
    m->aux_loss_scale = 1.0f;
    m->mtp_tok_w = -1.0f;
    if (c->moe.num_experts > 0 &&
        !(m->moe_tpe = calloc((size_t)c->num_layers * c->moe.num_experts, sizeof *m->moe_tpe)))
        goto nomem;
#undef A
#undef AA
    if (m->tpr == 0) /* (the tensor group's ranks hold the same) */
        co_log(CO_LOG_INFO, "activation memory: %zu bytes on this rank (layers %zu, recomputation scratch %zu)%s%s",
               m->act_bytes, m->act_layer_bytes, m->act_rc_bytes,
               m->act16_mlp ? (c->swiglu ? "; the norms', attention's and SwiGLU's outputs in bf16"
                                         : "; the norms', attention's and GELU's outputs in bf16")
               : m->act16   ? "; the norms' and attention's outputs in bf16"
                            : "", m->act16 && m->nmoes ? " (the MoE layers' inputs too)" : "");
    *out = m;
    return 0;
nomem:
    gpt_destroy(&m);
    return co_err_set(CO_ENOMEM, "gpt_new: cannot allocate model memory");
fail:
    {
        char why[300];
        snprintf(why, sizeof why, "%s", co_err_detail());
        gpt_destroy(&m);
        return co_err_set(rc, "%s", why);
    }
}

void gpt_destroy(gpt_model **pm) {
    gpt_model *m = *pm;
    if (!m) return;
    kb_backend *be = m->be;
    const kb_ops *o = m->ops;
    ring_ws_free(&m->ring_ws);
    for (int k = 0; k < m->nchunks; k++) {
        chunk_state *ch = &m->chunk[k];
        for (int s = 0; ch->slot && s < ch->slots; s++) {
            chunk_slot *sl = &ch->slot[s];
            for (int i = 0; sl->acts && i < ch->def.nlayers; i++) {
                layer_acts_free(m, &sl->acts[i]);
            }
            float *ps[] = {sl->x_end, sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->logits, sl->losses, sl->mtp_out};
            for (size_t q = 0; q < sizeof ps / sizeof ps[0]; q++) if (ps[q]) o->free(be, ps[q]);
            for (int k = 0; sl->mtp && k < m->cfg.mtp_layers; k++) {
                mtp_acts *q = &sl->mtp[k];
                layer_acts_free(m, &q->layer);
                float *qs[] = {q->emb, q->en, q->en_mean, q->en_rstd,
                               q->hn, q->hn_mean, q->hn_rstd, q->cat, q->x_out, q->out, q->out_mean, q->out_rstd,
                               q->logits, q->losses};
                for (size_t z = 0; z < sizeof qs / sizeof qs[0]; z++) if (qs[z]) o->free(be, qs[z]);
                free(q->tok), free(q->pos), free(q->tgt), free(q->mask), free(q->dscale);
                void *ds[] = {q->d_tok, q->d_pos, q->d_tgt, q->d_dscale};
                for (size_t z = 0; z < sizeof ds / sizeof ds[0]; z++) if (ds[z]) o->free(be, ds[z]);
            }
            free(sl->mtp);
            free(sl->acts);
        }
        free(ch->slot);
    }
    for (int k = 0; k < m->rc_nsets; k++) layer_acts_free(m, &m->rc_set[k]);
    free(m->rc_set);
    float *prc[] = {m->rc_ln, m->rc_att, m->rc_lse, m->rc_fc1, m->rc_act, m->rc_xout, m->rc_xfull};
    for (size_t k = 0; k < sizeof prc / sizeof prc[0]; k++) if (prc[k]) o->free(be, prc[k]);
    for (int k = 0; k < m->nmoes; k++) moe_destroy(&m->moes[k]);
    free(m->moes);
    float *pmtp[] = {m->mtp_dout, m->mtp_dcat, m->mtp_demb, m->mtp_dh[0], m->mtp_dh[1], m->mtp_gin,
                     m->mtp_gcat, m->mtp_dcatf, m->mtp_part, m->mtp_blk};
    for (size_t k = 0; k < sizeof pmtp / sizeof pmtp[0]; k++) if (pmtp[k]) o->free(be, pmtp[k]);
    float *ps[] = {m->params, m->grads, m->dx, m->dh, m->tmp, m->norm_ones, m->norm_1p, m->dqkv, m->datt, m->dbig, m->dffn,
                   (float *)m->d_tok, (float *)m->d_tgt, (float *)m->d_pos, (float *)m->d_seg, m->d_dscale,
                   m->gath, m->dfull, m->dhs, m->ce_mx, m->ce_all, m->ce_sums, m->tp_buf, (float *)m->d_tokl};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) if (ps[k]) o->free(be, ps[k]);
    if (m->params16) o->free(be, m->params16);
    if (m->moe_x32) o->free(be, m->moe_x32);
    free(m->host_losses);
    free(m->moe_tpe);
    free(m->tok_l);
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

/* The index of this rank's tensor of that name, from index `from` on (-1: none). */
static int find_tensor(const gpt_model *m, const char *name, int from) {
    for (int i = from; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return i;
    return -1;
}

void gpt_init(gpt_model *m, uint64_t seed) {
    co_rng r;
    co_rng_seed(&r, seed);
    memset(m->params, 0, m->nparams * sizeof(float));
    /* Every tensor of the whole model is drawn in the one-rank order from one generator, and
     * this rank keeps what it holds (its tensor-parallel slice, its pipeline chunks' tensors,
     * a later stage's copy of the tied embedding), so every layout starts where a one-rank run
     * starts (as Megatron's --use-cpu-initialization; Megatron otherwise seeds each pipeline
     * stage differently). */
    gpt_config whole = m->cfg;
    whole.nchunks = 0;
    whole.moe.ep_size = 0; /* every expert, in global order */
    whole.ep_rank = 0;
    gpt_tensor *all = NULL;
    int nall = 0;
    int rc = gpt_tensor_table(&whole, &all, &nall, NULL);
    if (rc) {
        m->be->status = rc;
        return;
    }
    size_t gmax = 0;
    for (int i = 0; i < nall; i++) {
        size_t gn = (size_t)all[i].gshape[0] * (size_t)(all[i].gshape[1] ? all[i].gshape[1] : 1);
        if (gn > gmax) gmax = gn;
    }
    float *global = malloc((gmax ? gmax : 1) * sizeof(float)); /* the global tensor as one rank draws it */
    if (!global) {
        free(all);
        m->be->status = co_err_set(CO_ENOMEM, "gpt_init: cannot allocate %zu floats to slice from", gmax);
        return;
    }
    for (int i = 0; i < nall; i++) {
        const gpt_tensor *g = &all[i];
        size_t n = (size_t)g->gshape[0] * (size_t)(g->gshape[1] ? g->gshape[1] : 1);
        if (g->init_ones)
            for (size_t k = 0; k < n; k++) global[k] = 1.0f;
        else if (g->init_std > 0)
            for (size_t k = 0; k < n; k++) global[k] = (float)(co_rng_normal(&r) * g->init_std);
        else
            memset(global, 0, n * sizeof(float));
        for (int j = find_tensor(m, g->name, 0); j >= 0; j = find_tensor(m, g->name, j + 1))
            gpt_tensor_take_slice(&m->tensors[j], global, m->params + m->tensors[j].offset);
    }
    free(global);
    free(all);
    gpt_sync_bf16(m);
    m->ops->sync(m->be); /* the host may read or overwrite the parameters next (checkpoint load) */
}

int gpt_tied_embedding(const gpt_model *m) {
    const gpt_config *c = &m->cfg;
    if (m->t_wte < 0) return -1;
    if (m->tensors[m->t_wte].emb_copy) return m->t_wte; /* a later stage's copy */
    /* the first stage: copies elsewhere unless this rank holds the head (tied) and the MTP
     * depths too (one rank: nothing to sum) */
    const gpt_chunk *last = &m->chunk[m->nchunks - 1].def;
    bool tied_elsewhere = c->tied && !last->head, mtp_elsewhere = c->mtp_layers > 0 && !last->mtp;
    return tied_elsewhere || mtp_elsewhere ? m->t_wte : -1;
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
    /* where the weights are: on CUDA a kernel hashes them and 8 bytes come back */
    int nt = m->ntensors;
    const float **x = malloc((size_t)nt * sizeof *x);
    size_t *n = malloc((size_t)nt * sizeof *n);
    uint64_t *seed = malloc((size_t)nt * sizeof *seed), h = 0;
    if (x && n && seed && m->ops->checksum_runs) {
        for (int i = 0; i < nt; i++) {
            x[i] = m->params + m->tensors[i].offset;
            n[i] = m->tensors[i].numel;
            seed[i] = GPT_SUM_SEED(i);
        }
        h = m->ops->checksum_runs(m->be, x, n, seed, nt);
    } else {
        m->ops->sync(m->be);
        for (int i = 0; i < nt; i++)
            h ^= kb_checksum_f32(m->params + m->tensors[i].offset, m->tensors[i].numel, GPT_SUM_SEED(i));
    }
    free(x), free(n), free(seed);
    return h;
}

uint64_t gpt_weights_checksum16(gpt_model *m) {
    return m->params16 ? XXH3_64bits_withSeed(m->params16, m->nparams * sizeof(kb_bf16), 0x16) : 0;
}

uint64_t gpt_weights_checksum(gpt_model *m) { return gpt_weights_checksum32(m) ^ gpt_weights_checksum16(m); }

void gpt_sync_bf16(gpt_model *m) {
    if (m->params16) m->ops->to_bf16(m->be, m->params16, m->params, m->nparams);
}

void gpt_sync_bf16_range(gpt_model *m, size_t lo, size_t n) {
    if (m->params16 && lo < m->nparams)
        m->ops->to_bf16(m->be, m->params16 + lo, m->params + lo, n < m->nparams - lo ? n : m->nparams - lo);
}

void gpt_inject_act_flip(gpt_model *m, size_t index, int bit) {
    m->act_flip = true;
    m->act_flip_index = index;
    m->act_flip_bit = bit & 31;
}

void gpt_zero_grad(gpt_model *m) { m->ops->zero(m->be, m->grads, m->nparams); }

/* The tensor before packed tensor i in its run of the same kind (expert or not), -1: none. */
static int packed_before(const gpt_model *m, int i) {
    for (int j = i - 1; j >= 0 && m->tensors[j].packed_run == m->tensors[i].packed_run; j--)
        if (m->tensors[j].expert == m->tensors[i].expert) return j;
    return -1;
}

void gpt__moe_bind(gpt_model *m, const int *t, struct moe_layer *moe) {
    if (moe) moe_set_params16(moe, P16(m, t[ROUTER_W])); /* (the step's copies, after the optimizer) */
    if (!m->moe_moved || !moe) return;
    int r = t[ROUTER_W], n = 0, fc1 = -1, fc2 = -1, sh = -1;
    const gpt_tensor *x = m->tensors;
    /* the run: router, the experts' fc1 then fc2, the shared expert's fc1 and fc2 */
    for (int i = r + 1; i < m->ntensors && x[i].packed_run == x[r].packed_run; i++) {
        if (x[i].expert && fc1 < 0) fc1 = i;
        if (x[i].expert) n++;
        if (!x[i].expert && sh < 0) sh = i;
    }
    fc2 = fc1 + n / 2;
    size_t base = x[r].offset;
    moe_set_param_offsets(moe, x[fc1].offset - base, x[fc2].offset - base, sh < 0 ? 0 : x[sh].offset - base,
                          sh < 0 ? 0 : x[sh + 1].offset - base);
}

int gpt_relayout(gpt_model *m, const size_t *offsets, size_t total) {
    bool moved = false;
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *x = &m->tensors[i];
        bool ok = offsets[i] + x->numel <= total && (x->packed || offsets[i] % 16 == 0);
        if (ok && x->packed && offsets[i] != offsets[i - 1] + m->tensors[i - 1].numel) {
            /* a packed run's tensors follow one another, except that its experts may lie
             * apart from the rest, after its router (each kind contiguous: the MoE layer is
             * pointed at them, gpt__moe_bind) */
            int j = packed_before(m, i);
            ok = j >= 0 ? offsets[i] == offsets[j] + m->tensors[j].numel
                        : x->expert && offsets[i] % 16 == 0 && offsets[i] > offsets[x->packed_run];
            moved = true;
        }
        if (!ok)
            return co_err_set(CO_EINVAL, "gpt_relayout: tensor %s at %zu (%zu elements) in a buffer of %zu",
                              x->name, offsets[i], x->numel, total);
    }
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    /* the old buffers go first: the peak holds one set, never both */
    bool bf16 = m->params16 != NULL;
    o->free(be, m->params);
    o->free(be, m->grads);
    if (bf16) o->free(be, m->params16);
    m->params = o->alloc(be, total * sizeof(float));
    m->grads = o->alloc(be, total * sizeof(float));
    m->params16 = bf16 ? o->alloc(be, total * sizeof(kb_bf16)) : NULL;
    if (!m->params || !m->grads || (bf16 && !m->params16))
        return co_err_set(CO_ENOMEM, "gpt_relayout: cannot allocate buffers of %zu parameters", total);
    o->zero(be, m->params, total);
    o->zero(be, m->grads, total);
    for (int i = 0; i < m->ntensors; i++) m->tensors[i].offset = offsets[i];
    m->nparams = total;
    m->moe_moved = moved;
    return 0;
}


double gpt_flops_per_sample(const gpt_config *c, int s) {
    double h = c->hidden, L = c->num_layers;
    double qproj = (double)c->head_dim * c->heads / h;
    double gated = c->swiglu ? 1.5 : 1.0;
    /* the MLP's width averaged over the layers: a MoE layer computes top-k experts and the
     * shared expert per token (Megatron's formula with num_experts) */
    double ffn = c->ffn_hidden;
    if (c->moe.num_experts > 0) {
        int nmoe = 0;
        for (int l = 0; l < c->num_layers; l++) nmoe += gpt_layer_is_moe(c, l);
        double moe_ffn = (double)c->moe.topk * c->moe.ffn_hidden + c->moe.shared_ffn;
        ffn = ((L - nmoe) * c->ffn_hidden + nmoe * moe_ffn) / L;
    }
    double f = 12.0 * s * L * h * h *
               ((1.0 + (double)c->kv_groups / c->heads + s / h) * qproj + ffn / h * gated +
                (double)c->padded_vocab / (2.0 * L * h));
    /* each MTP depth: a dense layer, the 2h -> h projection and another output layer */
    if (c->mtp_layers > 0)
        f += c->mtp_layers * 12.0 * s * h * h *
             ((1.0 + (double)c->kv_groups / c->heads + s / h) * qproj + (double)c->ffn_hidden / h * gated + 2.0 / 3.0 +
              (double)c->padded_vocab / (2.0 * h));
    return f;
}

void gpt_mtp_last_losses(const gpt_model *m, double *losses) {
    const chunk_slot *sl = &m->chunk[m->last_chunk].slot[m->last_slot];
    for (int k = 0; k < m->cfg.mtp_layers; k++) losses[k] = sl->mtp && sl->mtp_done ? sl->mtp[k].loss : 0.0;
}

void gpt_mtp_stats_take(gpt_model *m, double *loss_sums, int64_t *forwards) {
    for (int k = 0; k < m->cfg.mtp_layers; k++) {
        loss_sums[k] = m->mtp_loss_sum[k];
        m->mtp_loss_sum[k] = 0;
    }
    *forwards = m->mtp_forwards;
    m->mtp_forwards = 0;
}

void gpt_set_aux_loss_scale(gpt_model *m, float scale) { m->aux_loss_scale = scale; }

void gpt_set_mtp_token_weight(gpt_model *m, float w) { m->mtp_tok_w = w; }

float *gpt_moe_expert_bias(gpt_model *m, int l) {
    if (l < 0 || l >= m->cfg.num_layers) return NULL;
    int i = m->t_layer[l * NLAYER_T + EBIAS];
    return i < 0 ? NULL : m->params + m->tensors[i].offset;
}

int gpt_set_expert_group(gpt_model *m, struct cm_comm *ep, moe_dispatcher d, int timeout_ms) {
    for (int k = 0; k < m->nmoes; k++) {
        int rc = moe_set_expert_group(m->moes[k], ep, d, timeout_ms);
        if (rc) return rc;
    }
    return 0;
}

void gpt_moe_ep_counters(const gpt_model *m, uint64_t *bytes, double *seconds) {
    *bytes = 0;
    *seconds = 0;
    for (int k = 0; k < m->nmoes; k++) {
        *bytes += moe_ep_bytes_sent(m->moes[k]);
        *seconds += moe_ep_dispatch_seconds(m->moes[k]);
    }
}

void gpt_moe_stats_peek(const gpt_model *m, gpt_moe_stats *out) { *out = m->moe_acc; }

void gpt_mtp_stats_peek(const gpt_model *m, double *loss_sums, int64_t *forwards) {
    for (int k = 0; k < m->cfg.mtp_layers; k++) loss_sums[k] = m->mtp_loss_sum[k];
    *forwards = m->mtp_forwards;
}

void gpt_moe_stats_take(gpt_model *m, gpt_moe_stats *out, int64_t *tpe) {
    *out = m->moe_acc;
    memset(&m->moe_acc, 0, sizeof m->moe_acc);
    size_t n = (size_t)m->cfg.num_layers * (size_t)m->cfg.moe.num_experts;
    if (n) {
        if (tpe) memcpy(tpe, m->moe_tpe, sizeof(int64_t) * n);
        memset(m->moe_tpe, 0, sizeof(int64_t) * n);
    }
}
