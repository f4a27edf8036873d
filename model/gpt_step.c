/* gpt_step.c - a model chunk's forward and backward for one micro batch, composed from the
 * backend's operations (gpt.h; without pipelining the one chunk is the whole model).
 *
 * Data flow of one micro batch (N = B*T tokens) through a chunk of layers [l0, l1):
 *   embedding chunk:  x = dropout(embed(tokens) + wpe(positions))
 *   other chunks:     x = the previous stage's output (gpt_chunk_input)
 *   per layer l:      h = norm1(x); qkv = h Wqkv^T + b; rope(qkv); a = attention(qkv)
 *                     x = x + dropout(a Wproj^T + b)
 *                     h2 = norm2(x); f = h2 W1^T + b; g = gelu(f) | swiglu(f)
 *                     x = x + dropout(g W2^T + b)
 *                     (a MoE layer: x = x + dropout(moe(h2)), model/moe.h)
 *   head chunk:       hf = normf(x); logits = hf Wlm^T; loss = cross_entropy(logits, targets)
 *   other chunks:     x is the output for the next stage (gpt_chunk_output)
 * Backward walks the same list in reverse; the gradient of the residual stream is one
 * [Nl,C] buffer (m->dx) that each norm backward accumulates into: on the head chunk it
 * starts from the loss, elsewhere from the next stage's gradient, and after the first layer
 * it is the input's gradient for the previous stage.
 *
 * Under tensor parallelism (gpt.h) the same list runs on this rank's slices, with the
 * tensor group's collectives where Megatron's mappings put them (gpt_tp.c):
 *   embed:      local rows, all-reduce (reduce-scatter to token shards under SP)
 *   qkv, fc1:   column-parallel; SP all-gathers the input first; backward sums the
 *               input gradient (all-reduce, or reduce-scatter under SP)
 *   proj, fc2:  row-parallel; all-reduce (reduce-scatter under SP), then the bias;
 *               backward all-gathers the output gradient under SP
 *   head + CE:  column-parallel over the vocabulary, vocabulary-parallel cross-entropy
 * At tp 1 none of this runs and the operations are exactly the one-rank ones. Dropout is
 * keyed by the global layer index (site), so any pipeline split draws the same masks. The
 * embedding, the layer and the cross-entropy are also the MTP depths' (gpt_mtp.c). */
#include "model/gpt_internal.h"

#include "common/error.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t site(int layer, int which) { return gpt__site(layer, which); }

static bool valid(gpt_model *m, int c, int s, const char *what) {
    if (c < 0 || c >= m->nchunks || s < 0 || s >= m->chunk[c].slots) {
        m->be->status = co_err_set(CO_EINVAL, "%s: chunk %d slot %d (the model has %d chunks)", what, c, s, m->nchunks);
        return false;
    }
    return true;
}

int gpt_num_chunks(const gpt_model *m) { return m->nchunks; }
const gpt_chunk *gpt_chunk_def(const gpt_model *m, int c) { return &m->chunk[c].def; }

float *gpt_chunk_input(gpt_model *m, int c, int s) {
    chunk_slot *sl = &m->chunk[c].slot[s];
    return m->chunk[c].def.nlayers ? sl->acts[0].x_in : sl->x_end;
}
const float *gpt_chunk_output(const gpt_model *m, int c, int s) {
    const gpt_chunk *d = &m->chunk[c].def;
    return d->mtp && !d->head ? m->chunk[c].slot[s].mtp_out : m->chunk[c].slot[s].x_end;
}
int gpt_chunk_streams(const gpt_model *m, int c, bool output, bool train) {
    if (c < 0 || c >= m->nchunks || !train || m->cfg.mtp_layers <= 0) return 1;
    const gpt_chunk *d = &m->chunk[c].def;
    bool many = output ? !d->head && (d->mtp || d->mtp_in) : d->mtp_in;
    return many ? 1 + m->cfg.mtp_layers : 1;
}
float *gpt_chunk_output_grad(gpt_model *m) { return m->dx; }
const float *gpt_chunk_input_grad(const gpt_model *m) { return m->dx; }

/* tok_l: the micro batch's token ids in this rank's vocabulary shard (-1 elsewhere), in
 * backend memory where the backend needs its own copy */
const int32_t *gpt__vocab_shard_tokens(gpt_model *m, const int32_t *tokens, int N) {
    for (int n = 0; n < N; n++) {
        int32_t id = tokens[n] - m->v0;
        m->tok_l[n] = id >= 0 && id < m->Vl ? id : -1;
    }
    if (m->host_batch) return m->tok_l;
    m->ops->copy(m->be, m->d_tokl, m->tok_l, sizeof(int32_t) * (size_t)N);
    return m->d_tokl;
}

/* The batch arrays a chunk's kernels read: the caller's on the CPU; elsewhere copied into
 * backend memory, in order with the queued work (the previous micro batch's kernels may still
 * read the last copies). Positions and document starts for every chunk, tokens for the
 * embedding, targets and dscale for the loss. */

static dev_batch to_backend(gpt_model *m, const gpt_batch *b, const gpt_chunk *d, const float *dscale) {
    dev_batch x = {b->tokens, b->positions, b->seg, b->targets, dscale, b->rows};
    if (m->host_batch) return x;
    const kb_ops *o = m->ops;
    size_t ib = sizeof(int32_t) * (size_t)b->B * (size_t)b->T;
    if (d->embedding && b->tokens) o->copy(m->be, m->d_tok, b->tokens, ib), x.tokens = m->d_tok;
    if (b->positions) o->copy(m->be, m->d_pos, b->positions, ib), x.positions = m->d_pos;
    if (b->seg) o->copy(m->be, m->d_seg, b->seg, ib), x.seg = m->d_seg;
    if (d->head && b->targets && dscale) o->copy(m->be, m->d_tgt, b->targets, ib), x.targets = m->d_tgt;
    if (d->head && dscale)
        o->copy(m->be, m->d_dscale, dscale, sizeof(float) * (size_t)b->B * (size_t)b->T), x.dscale = m->d_dscale;
    return x;
}

/* The word (and position) embedding of N tokens into x [Nl, C]: host_tokens the ids in host
 * memory, tokens the backend's copy. At tp 1 the one-rank kernel. Under tensor parallelism
 * Megatron's vocabulary-parallel embedding: this shard's rows, zero for other ids, summed
 * over the group (reduce-scattered to the token shards under sequence parallelism); the
 * position rows added once, by rank 0 (a sum with zeros: the one-rank values). The decoder's
 * embedding and each MTP depth's (its rolled ids). */
void gpt__embedding_forward(gpt_model *m, float *x, const int32_t *host_tokens, const int32_t *tokens,
                            const int32_t *positions, int N) {
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int C = m->cfg.hidden;
    if (m->tp == 1) {
        o->embed_forward(be, x, tokens, positions, P(m, m->t_wte), P(m, m->t_wpe), N, C);
        return;
    }
    const int32_t *tokl = gpt__vocab_shard_tokens(m, host_tokens, N);
    float *e = m->sp ? m->gath : x;
    o->embed_forward(be, e, tokl, positions, P(m, m->t_wte), m->tpr == 0 ? P(m, m->t_wpe) : NULL, N, C);
    if (m->sp) gpt__tp_reduce_scatter(m, x, e, (size_t)(N / m->tp) * C);
    else gpt__tp_allreduce(m, x, (size_t)N * C);
}

/* Its backward from dx [Nl, C] (all-gathered under sequence parallelism): every rank adds
 * the full gradient of the position rows (identical on all of them) and of its vocabulary
 * shard's word rows. */
void gpt__embedding_backward(gpt_model *m, const float *dx, const int32_t *host_tokens, const int32_t *tokens,
                             const int32_t *positions, int N) {
    int C = m->cfg.hidden;
    if (m->tp > 1) tokens = gpt__vocab_shard_tokens(m, host_tokens, N);
    if (m->sp) gpt__tp_allgather(m, m->dfull, dx, (size_t)(N / m->tp) * C), dx = m->dfull;
    m->ops->embed_backward(m->be, G(m, m->t_wte), G(m, m->t_wpe), dx, tokens, positions, N, C, m->Vl);
}

/* The loss of N rows of logits [N, Vl] (this rank's vocabulary columns) and, in place, its
 * gradient weighted by dscale: the one-rank kernel at tp 1; under tensor parallelism
 * Megatron's vocabulary-parallel cross-entropy: the row max over the group (gathered, then
 * the max taken here: exact), the sums of exponentials and the target logit summed. The
 * main head's and each MTP depth's. */
void gpt__cross_entropy(gpt_model *m, float *losses, float *logits, const int32_t *targets, const float *dscale,
                        int N) {
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int V = m->Vl;
    if (m->tp == 1) {
        o->cross_entropy(be, losses, logits, targets, dscale, N, V);
        return;
    }
    o->ce_max(be, m->ce_mx, logits, N, V);
    gpt__tp_allgather(m, m->ce_all, m->ce_mx, (size_t)N);
    if (m->tp_stream) o->sync(be); /* (a queued all-gather) the host takes the max next */
    if (!be->status)
        for (int n = 0; n < N; n++) {
            float mx = m->ce_all[n];
            for (int k = 1; k < m->tp; k++) mx = m->ce_all[(size_t)k * N + n] > mx ? m->ce_all[(size_t)k * N + n] : mx;
            m->ce_mx[n] = mx;
        }
    o->ce_sums(be, m->ce_sums, logits, m->ce_mx, targets, m->v0, N, V);
    gpt__tp_allreduce(m, m->ce_sums, (size_t)2 * N);
    o->ce_grad(be, losses, logits, m->ce_mx, m->ce_sums, targets, dscale, m->v0, m->cfg.padded_vocab, N, V);
}

/* bf16 activations (gpt_internal.h act16): the layers' norm outputs, attention's output and
 * the GELU's output are made and kept in bf16 by the backend's *_bf16 operations, which
 * every reader of those buffers below goes through: the products here and in gpt_tp.c's
 * column- and row-parallel layers (*_act), and under sequence parallelism the all-gather of
 * a norm's output, which moves its bf16 elements (gpt__tp_allgather_act). */
void gpt__norm_act(gpt_model *m, float *out, float *mean, float *rstd, const float *in, const float *w,
                   const float *bias, int N) {
    const gpt_config *c = &m->cfg;
    if (m->act16)
        m->ops->norm_forward_bf16(m->be, c->rmsnorm, gpt__a16(out), mean, rstd, in, w, bias, N, c->hidden, c->norm_eps);
    else m->ops->norm_forward(m->be, c->rmsnorm, out, mean, rstd, in, w, bias, N, c->hidden, c->norm_eps);
}

void gpt__linear_act(gpt_model *m, float *out, const float *in, bool a16, const float *W, const kb_bf16 *W16,
                     const float *bias, int N, int IC, int OC) {
    if (a16) m->ops->linear_forward_bf16(m->be, out, (const kb_bf16 *)(const void *)in, W, W16, bias, N, IC, OC);
    else m->ops->linear_forward(m->be, out, in, W, W16, bias, N, IC, OC);
}

static void linear_act_backward(gpt_model *m, float *din, float *dW, float *dbias, const float *dout, const float *in,
                                const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    m->ops->linear_backward_bf16(m->be, din, dW, dbias, dout, (const kb_bf16 *)(const void *)in, W, W16, N, IC, OC);
}

/* fc1 and its activation: act = gelu(in2 W1^T + b1) (fused: a cuBLASLt epilogue on CUDA, the
 * pre-activation kept in fc1 for the backward) or swiglu / gelu after the product */
static void gpt__fc1_forward(gpt_model *m, layer_acts *a, const float *in2, const int *t, int N) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int C = c->hidden, F = m->Fl, F1 = gpt__fc1_local(m);
    if (m->act16_mlp && !c->swiglu) { /* bf16 in, bf16 GELU out, the pre-activation fp32 */
        o->linear_gelu_forward_bf16(be, gpt__a16(a->act), a->fc1, (const kb_bf16 *)(const void *)in2, P(m, t[FC1_W]),
                                    P16(m, t[FC1_W]), t[FC1_B] >= 0 ? P(m, t[FC1_B]) : NULL, N, C, F1);
        return;
    }
    if (m->act16) { /* SwiGLU: bf16 in, its output bf16 too where the backend rounds it (act16_mlp) */
        gpt__linear_act(m, a->fc1, in2, true, P(m, t[FC1_W]), P16(m, t[FC1_W]), P(m, t[FC1_B]), N, C, F1);
        if (m->act16_mlp) o->swiglu_forward_bf16(be, gpt__a16(a->act), a->fc1, N, F);
        else o->swiglu_forward(be, a->act, a->fc1, N, F);
        return;
    }
    if (!c->swiglu && o->linear_gelu_forward && t[FC1_B] >= 0) {
        o->linear_gelu_forward(be, a->act, a->fc1, in2, P(m, t[FC1_W]), P16(m, t[FC1_W]), P(m, t[FC1_B]), N, C, F1);
        return;
    }
    o->linear_forward(be, a->fc1, in2, P(m, t[FC1_W]), P16(m, t[FC1_W]), P(m, t[FC1_B]), N, C, F1);
    if (c->swiglu) o->swiglu_forward(be, a->act, a->fc1, N, F);
    else o->gelu_forward(be, a->act, a->fc1, (size_t)N * F);
}

/* One transformer layer l (a decoder layer, or an MTP depth's at l >= num_layers) over the
 * micro batch: a->x_in -> x_out, its activations kept in a. 0, or the backend's status. */
int gpt__layer_forward(gpt_model *m, layer_acts *a, int l, float *x_out, const dev_batch *xb, int B, int T,
                       bool train, uint64_t seed) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    const int *t = &m->t_layer[l * NLAYER_T];
    dev_batch x_b = *xb;
    int N = B * T, C = c->hidden, Q = gpt__qkv_local(m), F = m->Fl;
    int AH = m->NHl * c->head_dim, NH = m->NHl, NKV = m->NKVl;
    bool sp = m->sp;
    int Nl = sp ? N / m->tp : N;
    size_t NlC = (size_t)Nl * C;
    float ph = train ? c->hidden_dropout : 0.0f, pa = train ? c->attention_dropout : 0.0f;
    gpt__norm_act(m, a->ln1, a->ln1_mean, a->ln1_rstd, a->x_in, gpt__norm_w(m, t[LN1_W]), P(m, t[LN1_B]), Nl);
    /* column-parallel qkv (its input all-gathered under sequence parallelism) */
    const float *in1 = a->ln1;
    if (sp) gpt__tp_allgather_act(m, m->gath, a->ln1, NlC, m->act16), in1 = m->gath;
    gpt__linear_act(m, a->qkv, in1, m->act16, P(m, t[QKV_W]), P16(m, t[QKV_W]), P(m, t[QKV_B]), N, C, Q);
    if (c->rope) o->rope(be, a->qkv, x_b.positions, N, NH, NKV, c->head_dim, c->rotary_base, false);
    gpt__attention_forward(m, a->att, a->lse, a->qkv, x_b.seg, B, T, pa, gpt__tp_seed(m, seed), site(l, 1));
    /* row-parallel proj: x_mid = x_in + dropout(sum over the group of att Wproj^T, + b) */
    float *tmp = m->tmp;
    gpt__row_parallel_forward_act(m, m->act16, tmp, a->att, P(m, t[PROJ_W]), P16(m, t[PROJ_W]), P(m, t[PROJ_B]), N, AH,
                                  Nl);
    if (ph > 0) gpt__dropout_rows(m, x_b.rows, N * m->cp, tmp, tmp, Nl, ph, seed, site(l, 2));
    o->add(be, a->x_mid, a->x_in, tmp, NlC);
    gpt__norm_act(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, gpt__norm_w(m, t[LN2_W]), P(m, t[LN2_B]), Nl);
    if (a->moe) {
        /* a MoE layer: router, experts, shared expert over the normed tokens; under sequence
         * parallelism this rank's Nl of the batch's N with the whole weights (the layer's
         * sequence group is the tensor group: gpt_set_tensor_group) */
        if (sp && !m->tpc) {
            be->status = co_err_set(CO_EINVAL, "a MoE layer: the tensor group is not set (gpt_set_tensor_group)");
            return be->status;
        }
        moe_set_training(a->moe, train); /* (sinkhorn routing chooses otherwise outside training) */
        gpt__moe_bind(m, t, a->moe);
        moe_set_padding(a->moe, c->cp_thd ? x_b.rows : NULL); /* (THD: padding rows route nowhere) */
        int rc = moe_forward(a->moe, tmp, a->ln2, P(m, t[ROUTER_W]), P(m, t[EBIAS]), B, T);
        if (rc) {
            be->status = rc;
            return rc;
        }
        if (train && !m->recomputing) {
            const moe_config *mc = &c->moe;
            /* (under sequence parallelism: this rank's part of the load-balancing loss, and
             * the z loss over Megatron's coefficient / tp, the mean over this rank's tokens) */
            m->moe_acc.lb_loss += mc->aux_coeff > 0 ? moe_aux_loss(a->moe) / mc->aux_coeff : 0.0;
            m->moe_acc.z_loss += mc->z_coeff > 0 ? moe_z_loss(a->moe) / (mc->z_coeff / (m->tp * m->cp)) : 0.0;
            m->moe_acc.forwards++;
            m->moe_acc.dropped += moe_dropped(a->moe);
            const int32_t *tpe = moe_tokens_per_expert(a->moe);
            for (int e = 0; e < mc->num_experts; e++) m->moe_tpe[(size_t)l * mc->num_experts + e] += tpe[e];
        }
    } else {
        const float *in2 = a->ln2;
        if (sp) gpt__tp_allgather_act(m, m->gath, a->ln2, NlC, m->act16), in2 = m->gath;
        gpt__fc1_forward(m, a, in2, t, N);
        gpt__row_parallel_forward_act(m, m->act16_mlp, tmp, a->act, P(m, t[FC2_W]), P16(m, t[FC2_W]), P(m, t[FC2_B]), N,
                                      F, Nl);
    }
    if (ph > 0) gpt__dropout_rows(m, x_b.rows, N * m->cp, tmp, tmp, Nl, ph, seed, site(l, 3));
    o->add(be, x_out, a->x_mid, tmp, NlC);
    return be->status;
}

/* An injected silent corruption of one activation (resilience/inject.h): a bit of the final
 * norm's output x[0..n), which the output layer and its gradients read: the first element from
 * the injected index on below 1 in magnitude (a high exponent bit then turns it into a huge
 * value instead of a tiny one). With bf16 activations x holds bf16, whose bit b - 16 is fp32's
 * bit b (sign, exponent and the high mantissa; a lower bit flips bf16's bit b). */
static void act_flip(gpt_model *m, float *x, size_t n, bool a16) {
    size_t i = m->act_flip_index % n;
    int bit = m->act_flip_bit;
    m->act_flip = false;
    if (a16) {
        kb_bf16 *h = gpt__a16(x);
        for (size_t k = 0; k < n; k++, i = (i + 1) % n) {
            uint32_t w = (uint32_t)h[i] << 16;
            float f;
            memcpy(&f, &w, sizeof f);
            if (fabsf(f) < 1.0f) break;
        }
        h[i] ^= (kb_bf16)(1u << (bit >= 16 ? bit - 16 : bit));
        return;
    }
    uint32_t u;
    for (size_t k = 0; k < n && !(fabsf(x[i]) < 1.0f); k++) i = (i + 1) % n;
    memcpy(&u, &x[i], sizeof u);
    u ^= 1u << bit;
    memcpy(&x[i], &u, sizeof u);
}

double gpt_chunk_forward(gpt_model *m, int ci, int s, const gpt_batch *b, bool train, uint64_t seed,
                         const float *dscale, float *losses) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    if (!valid(m, ci, s, "gpt_chunk_forward")) return NAN;
    const gpt_chunk *d = &m->chunk[ci].def;
    chunk_slot *sl = &m->chunk[ci].slot[s];
    int B = b->B, T = b->T, N = B * T, C = c->hidden, V = m->Vl;
    bool sp = m->sp;
    /* rows of the token-wise part on this rank: all N, or its N/tp under sequence parallelism */
    int Nl = sp ? N / m->tp : N;
    size_t NlC = (size_t)Nl * C;
    float ph = train ? c->hidden_dropout : 0.0f;
    sl->B = B;
    sl->T = T;
    m->last_chunk = ci;
    m->last_slot = s;
    if (sp && N % m->tp) {
        be->status = co_err_set(CO_EINVAL, "sequence parallelism: %d tokens do not split over %d ranks", N, m->tp);
        return NAN;
    }
    dev_batch x_b = to_backend(m, b, d, dscale);
    dscale = x_b.dscale;

    float *x = gpt_chunk_input(m, ci, s);
    if (m->fwd_hook) m->fwd_hook(m->fwd_hook_ctx, -1);
    if (d->embedding) {
        gpt__embedding_forward(m, x, b->tokens, x_b.tokens, x_b.positions, N);
        if (ph > 0) gpt__dropout_rows(m, b->rows, N * m->cp, x, x, Nl, ph, seed, site(-1, 0));
    }

    for (int i = 0; i < d->nlayers; i++) {
        int l = d->layer0 + i;
        float *x_out = i + 1 < d->nlayers ? sl->acts[i + 1].x_in : sl->x_end;
        if (m->fwd_hook) m->fwd_hook(m->fwd_hook_ctx, l);
        if (gpt__layer_forward(m, &sl->acts[i], l, x_out, &x_b, B, T, train, seed)) return NAN;
        /* a distributed recomputation group's input: this rank's rows kept */
        if (i + 1 < d->nlayers && sl->acts[i + 1].xin_shard) {
            size_t rows = (size_t)(N / m->tp) * C;
            o->copy(be, sl->acts[i + 1].xin_shard, x_out + (size_t)m->tpr * rows, rows * sizeof(float));
        }
    }
    if (m->fwd_hook) m->fwd_hook(m->fwd_hook_ctx, GPT_HOOK_AFTER_LAYERS);
    bool l16 = gpt__lnf16(m, d);
    if (gpt__has_final_norm(d) && l16)
        gpt__norm_act(m, sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->x_end, gpt__norm_w(m, m->t_lnf_w), P(m, m->t_lnf_b),
                      Nl);
    else if (gpt__has_final_norm(d)) /* (fp32: hnorm's input too, or sent on to the loss's stage) */
        o->norm_forward(be, c->rmsnorm, sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->x_end, gpt__norm_w(m, m->t_lnf_w),
                        P(m, m->t_lnf_b), Nl, C, c->norm_eps);
    if (d->mtp && !d->head) {
        /* the MTP stage: the main final norm's output and (training) each depth's, on */
        if (train) {
            if (gpt__mtp_hidden_forward(m, sl, b, seed)) return NAN;
        } else {
            sl->mtp_done = false;
            o->copy(be, sl->mtp_out, sl->lnf, NlC * sizeof(float));
        }
    }
    if (!d->head) {
        if (!m->dev_pp) o->sync(be); /* the output is written before the host sends it */
        return be->status ? NAN : 0.0;
    }
    /* the final norm's output: this chunk's, or the first stream received after the MTP
     * stage (which applied it) */
    float *lnf = d->mtp_in ? sl->x_end : sl->lnf;
    if (m->act_flip) {
        o->sync(be); /* the norm's output is written before the host reads it (CUDA) */
        act_flip(m, lnf, NlC, l16);
    }
    const float *inf = lnf;
    if (sp) gpt__tp_allgather_act(m, m->gath, lnf, NlC, l16), inf = m->gath;
    /* the output layer: column-parallel over the vocabulary */
    gpt__linear_act(m, sl->logits, inf, l16, P(m, m->t_lm), P16(m, m->t_lm), NULL, N, C, V);
    if (!dscale) {
        o->sync(be); /* sampling: the logits stay readable by the host */
        return 0.0;
    }
    gpt__cross_entropy(m, sl->losses, sl->logits, x_b.targets, dscale, N);
    if (be->status) return NAN;
    const float *ls = sl->losses;
    if (!m->host_batch) {
        o->copy(be, m->host_losses, sl->losses, sizeof(float) * (size_t)N); /* waits for the forward */
        ls = m->host_losses;
    }
    double sum = 0;
    for (int n = 0; n < N; n++) sum += (double)ls[n] * b->loss_mask[n];
    if (losses) memcpy(losses, ls, sizeof(float) * (size_t)N);
    /* multi-token prediction (training only): its losses enter through the gradient */
    if (d->mtp && gpt__mtp_forward(m, sl, b, train, seed)) return NAN;
    if (d->mtp_in) {
        sl->mtp_done = false;
        if (train && gpt__mtp_loss_forward(m, sl, b, sl->x_end)) return NAN;
    }
    return sum;
}

/* Selective recomputation before a layer's backward, the MLP side: the second norm's output
 * (layernorm), then from it a dense layer's fc1 and activation (mlp) or a MoE layer's whole
 * forward (moe, its output discarded): the forward's kernels on the forward's inputs, so the
 * same values. 0, or the backend's status. */
static int recompute_mlp_side(gpt_model *m, layer_acts *a, int l, const int32_t *rows, int B, int T) {
    const gpt_config *c = &m->cfg;
    kb_backend *be = m->be;
    const int *t = &m->t_layer[l * NLAYER_T];
    int N = B * T, C = c->hidden;
    int Nl = m->sp ? N / m->tp : N;
    if (a->sel & GPT_RC_LAYERNORM)
        gpt__norm_act(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, gpt__norm_w(m, t[LN2_W]), P(m, t[LN2_B]), Nl);
    if (a->moe && (a->sel & GPT_RC_MOE)) {
        moe_set_training(a->moe, true);
        gpt__moe_bind(m, t, a->moe);
        moe_set_padding(a->moe, c->cp_thd ? rows : NULL);
        int rc = moe_forward(a->moe, m->rc_xout, a->ln2, P(m, t[ROUTER_W]), P(m, t[EBIAS]), B, T);
        if (rc) be->status = rc;
    } else if (!a->moe && (a->sel & GPT_RC_MLP)) {
        const float *in2 = a->ln2;
        if (m->sp) gpt__tp_allgather_act(m, m->gath, a->ln2, (size_t)Nl * C, m->act16), in2 = m->gath;
        gpt__fc1_forward(m, a, in2, t, N);
    }
    return be->status;
}

/* Backward of one transformer layer: m->dx holds the gradient of its output and becomes the
 * gradient of its input; weight gradients accumulate. 0, or the backend's status. */
int gpt__layer_backward(gpt_model *m, layer_acts *a, int l, const dev_batch *xb, int B, int T, uint64_t seed) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    const int *t = &m->t_layer[l * NLAYER_T];
    dev_batch x_b = *xb;
    int N = B * T, C = c->hidden, Q = gpt__qkv_local(m), F = m->Fl, F1 = gpt__fc1_local(m);
    int AH = m->NHl * c->head_dim, NH = m->NHl, NKV = m->NKVl;
    bool sp = m->sp;
    int Nl = sp ? N / m->tp : N;
    size_t NlC = (size_t)Nl * C;
    float ph = c->hidden_dropout, pa = c->attention_dropout;
    if (a->sel && recompute_mlp_side(m, a, l, x_b.rows, B, T)) return be->status;
    /* MLP branch: dmlp = dropout'(dx) */
    const float *dmlp = m->dx;
    if (ph > 0) {
        gpt__dropout_rows(m, x_b.rows, N * m->cp, m->tmp, m->dx, Nl, ph, seed, site(l, 3));
        dmlp = m->tmp;
    }
    if (a->moe) {
        /* the normed input's gradient into dh (as the column-parallel fc1's would be); the
         * aux and z losses enter with the model's MoE loss scale */
        gpt__moe_bind(m, t, a->moe);
        int rc = moe_backward(a->moe, m->dh, G(m, t[ROUTER_W]), dmlp, a->ln2, P(m, t[ROUTER_W]),
                              m->aux_loss_scale);
        if (rc) {
            be->status = rc;
            return rc;
        }
    } else {
        /* the GELU's backward fused into fc2's input product (a cuBLASLt epilogue on CUDA),
         * fc1's bias gradient with it: one tensor-parallel rank only */
        bool fused = !c->swiglu && o->linear_backward_dgelu && m->tp == 1 && t[FC1_B] >= 0;
        if (fused) {
            if (m->act16_mlp)
                linear_act_backward(m, NULL, G(m, t[FC2_W]), G(m, t[FC2_B]), dmlp, a->act, P(m, t[FC2_W]),
                                    P16(m, t[FC2_W]), N, F, C);
            else
                o->linear_backward(be, NULL, G(m, t[FC2_W]), G(m, t[FC2_B]), dmlp, a->act, P(m, t[FC2_W]),
                                   P16(m, t[FC2_W]), N, F, C);
            o->linear_backward_dgelu(be, m->dbig, G(m, t[FC1_B]), dmlp, P(m, t[FC2_W]), P16(m, t[FC2_W]), a->fc1,
                                     N, F, C);
        } else {
            gpt__row_parallel_backward_act(m, m->act16_mlp, m->dffn, G(m, t[FC2_W]), G(m, t[FC2_B]), dmlp, a->act,
                                           P(m, t[FC2_W]), P16(m, t[FC2_W]), N, F, Nl);
            if (c->swiglu) o->swiglu_backward(be, m->dbig, m->dffn, a->fc1, N, F);
            else o->gelu_backward(be, m->dbig, m->dffn, a->fc1, (size_t)N * F);
        }
        const float *in2 = a->ln2;
        if (sp) gpt__tp_allgather_act(m, m->gath, a->ln2, NlC, m->act16), in2 = m->gath;
        gpt__column_parallel_backward_act(m, m->act16, G(m, t[FC1_W]), fused ? NULL : G(m, t[FC1_B]), m->dbig, in2,
                                          P(m, t[FC1_W]), P16(m, t[FC1_W]), N, C, F1);
    }
    o->norm_backward(be, c->rmsnorm, m->dx, G(m, t[LN2_W]), G(m, t[LN2_B]), m->dh, a->x_mid,
                     gpt__norm_w(m, t[LN2_W]), a->ln2_mean, a->ln2_rstd, Nl, C);
    /* attention branch */
    const float *datt_out = m->dx;
    if (ph > 0) {
        gpt__dropout_rows(m, x_b.rows, N * m->cp, m->tmp, m->dx, Nl, ph, seed, site(l, 2));
        datt_out = m->tmp;
    }
    /* selective core_attn: attention's output and log-sum-exp again from the kept qkv */
    if (a->sel & GPT_RC_CORE_ATTN)
        gpt__attention_forward(m, a->att, a->lse, a->qkv, x_b.seg, B, T, pa, gpt__tp_seed(m, seed), site(l, 1));
    gpt__row_parallel_backward_act(m, m->act16, m->datt, G(m, t[PROJ_W]), G(m, t[PROJ_B]), datt_out, a->att,
                                   P(m, t[PROJ_W]), P16(m, t[PROJ_W]), N, AH, Nl);
    gpt__attention_backward(m, m->dqkv, m->datt, a->qkv, a->att, a->lse, x_b.seg, B, T, pa, gpt__tp_seed(m, seed),
                            site(l, 1));
    if (c->rope) o->rope(be, m->dqkv, x_b.positions, N, NH, NKV, c->head_dim, c->rotary_base, true);
    /* selective layernorm: the first norm's output again (the shared buffer held the second's) */
    if (a->sel & GPT_RC_LAYERNORM)
        gpt__norm_act(m, a->ln1, a->ln1_mean, a->ln1_rstd, a->x_in, gpt__norm_w(m, t[LN1_W]), P(m, t[LN1_B]), Nl);
    const float *in1 = a->ln1;
    if (sp) gpt__tp_allgather_act(m, m->gath, a->ln1, NlC, m->act16), in1 = m->gath;
    gpt__column_parallel_backward_act(m, m->act16, G(m, t[QKV_W]), G(m, t[QKV_B]), m->dqkv, in1, P(m, t[QKV_W]),
                                      P16(m, t[QKV_W]), N, C, Q);
    o->norm_backward(be, c->rmsnorm, m->dx, G(m, t[LN1_W]), G(m, t[LN1_B]), m->dh, a->x_in, gpt__norm_w(m, t[LN1_W]),
                     a->ln1_mean, a->ln1_rstd, Nl, C);
    return be->status;
}

/* Full recomputation: the forward of a chunk's layers [g0, g1] from the group's kept input
 * (all-gathered first where it is distributed), in training mode with the forward's seed, so
 * dropout draws the forward's masks; the activations land in the scratch sets the group's
 * layer_acts point at, the last output is discarded. No statistics are counted again. */
static int recompute_group(gpt_model *m, chunk_slot *sl, const gpt_chunk *d, int g0, int g1, const dev_batch *xb,
                           int B, int T, uint64_t seed) {
    layer_acts *first = &sl->acts[g0];
    if (first->xin_shard)
        gpt__tp_allgather(m, first->x_in, first->xin_shard, (size_t)(B * T / m->tp) * m->cfg.hidden);
    m->recomputing = true;
    int rc = m->be->status;
    for (int j = g0; j <= g1 && !rc; j++) {
        float *x_out = j < g1 ? sl->acts[j + 1].x_in : m->rc_xout;
        rc = gpt__layer_forward(m, &sl->acts[j], d->layer0 + j, x_out, xb, B, T, true, seed);
    }
    m->recomputing = false;
    return rc;
}

void gpt_chunk_backward(gpt_model *m, int ci, int s, const gpt_batch *b, uint64_t seed) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    if (!valid(m, ci, s, "gpt_chunk_backward")) return;
    const gpt_chunk *d = &m->chunk[ci].def;
    chunk_slot *sl = &m->chunk[ci].slot[s];
    int B = b->B, T = b->T, N = B * T, C = c->hidden, V = m->Vl;
    bool sp = m->sp;
    int Nl = sp ? N / m->tp : N;
    size_t NlC = (size_t)Nl * C;
    float ph = c->hidden_dropout;
    if (B != sl->B || T != sl->T) {
        be->status = co_err_set(CO_EINVAL, "gpt_chunk_backward: a %dx%d batch for slot %d, whose forward had %dx%d", B,
                                T, s, sl->B, sl->T);
        return;
    }
    /* the batch as this micro batch's forward saw it (the slot's forward may be several
     * forwards ago: copied again where the backend keeps its own copies) */
    dev_batch x_b = to_backend(m, b, &(gpt_chunk){.embedding = d->embedding}, NULL);
    /* Under tensor parallelism the input gradient of a column-parallel layer is a part:
     * summed over the group into dh (reduce-scattered to this rank's tokens under sequence
     * parallelism) beside its weight gradient (gpt__column_parallel_backward); the gradient a
     * row-parallel layer receives is the token shards' all-gathered. */
    if (d->head) {
        /* the MTP depths first (they use the backward scratch): their gradient of the final
         * norm's output joins the LM head's; after an MTP stage, the gradients of the
         * received depth streams into dx's streams 1..D */
        if (d->mtp && gpt__mtp_backward(m, sl, b, seed)) return;
        if (d->mtp_in && gpt__mtp_loss_backward(m, sl, sl->x_end, m->dx)) return;
        /* LM head: the logits hold dloss/dlogits */
        const float *lnf = d->mtp_in ? sl->x_end : sl->lnf;
        const float *inf = lnf;
        bool l16 = gpt__lnf16(m, d);
        if (sp) gpt__tp_allgather_act(m, m->gath, lnf, NlC, l16), inf = m->gath;
        gpt__column_parallel_backward_act(m, l16, G(m, m->t_lm), NULL, sl->logits, inf, P(m, m->t_lm), P16(m, m->t_lm),
                                          N, C, V);
        if (d->mtp && m->mtp_dlnf) o->add(be, m->dh, m->dh, m->mtp_dlnf, NlC);
        if (d->mtp_in) {
            o->copy(be, m->dx, m->dh, NlC * sizeof(float)); /* the first stream's gradient */
        } else {
            o->zero(be, m->dx, NlC);
            o->norm_backward(be, c->rmsnorm, m->dx, G(m, m->t_lnf_w), G(m, m->t_lnf_b), m->dh, sl->x_end,
                             gpt__norm_w(m, m->t_lnf_w), sl->lnf_mean, sl->lnf_rstd, Nl, C);
        }
    } else if (d->mtp) {
        /* the MTP stage: m->dx holds the next stage's gradients of the 1 + D streams; the
         * depths' backward, then the final norm's from the main stream's gradient and theirs */
        size_t D = (size_t)c->mtp_layers;
        o->copy(be, m->mtp_gin, m->dx, (1 + D) * NlC * sizeof(float));
        if (gpt__mtp_hidden_backward(m, sl, b, m->mtp_gin, seed)) return;
        if (m->mtp_dlnf) o->add(be, m->dh, m->mtp_gin, m->mtp_dlnf, NlC);
        else o->copy(be, m->dh, m->mtp_gin, NlC * sizeof(float));
        o->zero(be, m->dx, NlC);
        o->norm_backward(be, c->rmsnorm, m->dx, G(m, m->t_lnf_w), G(m, m->t_lnf_b), m->dh, sl->x_end,
                         gpt__norm_w(m, m->t_lnf_w), sl->lnf_mean, sl->lnf_rstd, Nl, C);
    } /* else m->dx holds the next stage's gradient of this chunk's output (after an MTP
       * stage, of its 1 + D streams: a chunk without layers hands them back as they are) */

    for (int i = d->nlayers - 1; i >= 0; i--) {
        int g0, g1;
        if (gpt__rc_pos(&c->recompute, i, d->nlayers, &g0, &g1) >= 0) {
            /* a full recomputation group [g0, i]: its forward again, then its backward */
            if (recompute_group(m, sl, d, g0, i, &x_b, B, T, seed)) return;
            for (int j = i; j >= g0; j--) {
                if (gpt__layer_backward(m, &sl->acts[j], d->layer0 + j, &x_b, B, T, seed)) return;
                if (m->bwd_hook) {
                    o->sync(be);
                    m->bwd_hook(m->bwd_hook_ctx, d->layer0 + j);
                }
            }
            i = g0;
            continue;
        }
        if (gpt__layer_backward(m, &sl->acts[i], d->layer0 + i, &x_b, B, T, seed)) return;
        if (m->bwd_hook) {
            o->sync(be);
            m->bwd_hook(m->bwd_hook_ctx, d->layer0 + i);
        }
    }
    if (d->embedding) {
        if (ph > 0) gpt__dropout_rows(m, b->rows, N * m->cp, m->dx, m->dx, Nl, ph, seed, site(-1, 0));
        gpt__embedding_backward(m, m->dx, b->tokens, x_b.tokens, x_b.positions, N);
    }
    /* the gradients (and the input's gradient) are complete before the host reads them; on
     * the device pipeline the caller syncs once after its last chunk */
    if (!m->dev_pp) o->sync(be);
}

double gpt_forward(gpt_model *m, const gpt_batch *b, bool train, uint64_t seed, const float *dscale, float *losses) {
    if (m->nchunks != 1 || !m->chunk[0].def.embedding || !m->chunk[0].def.head) {
        m->be->status = co_err_set(CO_EINVAL, "gpt_forward: a pipeline stage runs chunk by chunk (gpt_chunk_forward)");
        return NAN;
    }
    return gpt_chunk_forward(m, 0, 0, b, train, seed, dscale, losses);
}

void gpt_set_backward_hook(gpt_model *m, void (*fn)(void *ctx, int layer), void *ctx) {
    m->bwd_hook = fn;
    m->bwd_hook_ctx = ctx;
}

void gpt_set_forward_hook(gpt_model *m, void (*fn)(void *ctx, int layer), void *ctx) {
    m->fwd_hook = fn;
    m->fwd_hook_ctx = ctx;
}

void gpt_backward(gpt_model *m, const gpt_batch *b, uint64_t seed) { gpt_chunk_backward(m, 0, 0, b, seed); }

const float *gpt_last_logits(gpt_model *m, int b, int t) {
    if (m->tp > 1 || !m->chunk[m->last_chunk].def.head) return NULL;
    const chunk_slot *sl = &m->chunk[m->last_chunk].slot[m->last_slot];
    return sl->logits + ((size_t)b * sl->T + (size_t)t) * m->cfg.padded_vocab;
}
