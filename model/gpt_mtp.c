/* gpt_mtp.c - multi-token prediction (Megatron's MultiTokenPredictionBlock, DeepSeek-V3's
 * MTP; docs/mtp.md) on the head chunk of a training forward. Depth k = 0..D-1:
 *   tok_k, pos_k, tgt_k, mask_k = tokens, positions, targets, loss mask rolled k+1 places
 *                                 left within each sequence, the freed places 0
 *   emb   = dropout(embed(tok_k) + wpe(pos_k))          the shared embedding
 *   cat   = [enorm(emb) | hnorm(h_prev)]                 [N, 2C]; h_prev: the main final norm's
 *                                                        output (k = 0) or depth k-1's output
 *   x     = cat Weh^T                                    eh_proj, 2C -> C, no bias
 *   x_out = transformer layer L + k (x)                  a dense layer, positions pos_k
 *   out_k = final_layernorm_k(x_out)
 *   loss_k = sum(CE(out_k Wlm^T, tgt_k) * mask_k) / sum(mask_k)   the shared output layer
 * The objective adds scale / D * loss_k per depth (--mtp-loss-scaling-factor scale), with the
 * model's auxiliary-loss weight (1 / micro batches: Megatron's MTPLossAutoScaler), so each
 * token's logit gradient weight is mask_k * scale / D / sum(mask_k) * aux_loss_scale (with
 * --calculate-per-token-loss mask_k * scale / D * sum(mask) / sum(mask_k) * the main loss's
 * token weight, gpt_set_mtp_token_weight).
 * Backward runs the depths in reverse: the output layer, the final norm, the layer, eh_proj,
 * then enorm into the embedding's gradient and hnorm into the previous depth's output (or,
 * for depth 0, m->mtp_dlnf: the main final norm's output). The rolled batch is made on the
 * host and copied to the backend (CUDA: stream-ordered); the concatenation, its gradient's
 * split and eh_proj's column gathers and slices under tensor parallelism are pitched copies
 * queued with the kernels (kb_ops.copy_rows: no sync, no host loop).
 *
 * bf16 activations (gpt_internal.h act16): each depth's transformer layer keeps them as a
 * decoder layer does, and enorm's and hnorm's outputs and their concatenation, which only
 * eh_proj reads, are bf16 too (the concatenation copies 2-byte elements, the sequence-
 * parallel gather of it moves them). The depths' final norms and the main final norm's
 * output the depths read stay fp32: each is hnorm's input (a norm's, which reads fp32) and
 * a stream an MTP stage sends on (docs/gpu.md).
 *
 * Split over two stages (the layout's m on a stage before L's; gpt.h gpt_chunk.mtp/mtp_in,
 * Megatron's MTP stage): the MTP stage runs the depths up to their final norms and sends
 * [main | out_0 | ... | out_D-1] on (gpt__mtp_hidden_forward); the loss's stage computes
 * each depth's logits and loss from the received streams (gpt__mtp_loss_forward), and its
 * backward returns the gradients of those streams (gpt__mtp_loss_backward), from which the
 * MTP stage runs the rest (gpt__mtp_hidden_backward). The same operations in the same order
 * as on one stage: the values are the one-stage ones.
 *
 * Tensor parallelism (docs/mtp.md): the rolled ids go through the decoder's vocabulary-
 * parallel embedding (gpt__embedding_forward), the layer is gpt__layer_forward/backward
 * (its tensors split as a decoder layer's), the logits are the shared column-parallel output
 * layer's with the vocabulary-parallel cross-entropy (gpt__cross_entropy). enorm, hnorm and
 * the final norm are replicated and run on this rank's Nl token rows: all N without
 * sequence parallelism (every rank the same values and gradients), the rank's N/tp token
 * shard under it (partial gradients, summed by gpt_tp_finalize_grads). eh_proj is Megatron's
 * column-parallel linear (C/tp output rows per rank, no bias): its input all-gathered under
 * SP, its output gathered over the group, then (SP) this rank's token rows kept; backward
 * keeps this rank's output columns of the (all-gathered) gradient and sums the input
 * gradient over the group (all-reduce; reduce-scatter under SP). */
#include "model/gpt_internal.h"

#include "common/error.h"

#include <math.h>

/* tok/pos/tgt/mask of depth k (rolled k+1 places left per sequence, zero-filled). Under
 * context parallelism from the whole micro batch (b->full_*): each local token's source is
 * the token k+1 places after its row in the whole sequence, wherever that lies. */
static void roll_batch(mtp_acts *q, const gpt_batch *b, int k) {
    int B = b->B, T = b->T, s = k + 1;
    if (b->full_tokens) {
        int FT = b->full_T;
        for (size_t n = 0; n < (size_t)B * T; n++) {
            int32_t row = b->rows[n];
            bool in = row >= 0 && row % FT + s < FT;
            size_t src = in ? (size_t)row + (size_t)s : 0;
            q->tok[n] = in ? b->full_tokens[src] : 0;
            q->pos[n] = in ? b->full_positions[src] : 0;
            q->tgt[n] = in ? b->full_targets[src] : 0;
            q->mask[n] = in ? b->full_mask[src] : 0.0f;
        }
        return;
    }
    for (int i = 0; i < B; i++)
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)i * T + t, src = n + (size_t)s;
            bool in = t + s < T;
            q->tok[n] = in ? b->tokens[src] : 0;
            q->pos[n] = in ? b->positions[src] : 0;
            q->tgt[n] = in ? b->targets[src] : 0;
            q->mask[n] = in ? b->loss_mask[src] : 0.0f;
        }
}

/* The loss tokens of depth k over the whole sequences: this rank's rolled mask, or under
 * context parallelism the whole micro batch's (every context rank the same count). */
static double rolled_tokens(const mtp_acts *q, const gpt_batch *b, int k) {
    double ntok = 0;
    if (b->full_tokens) {
        int FT = b->full_T, s = k + 1;
        for (size_t r = 0; r < (size_t)b->B * (size_t)FT; r++)
            if ((int)(r % (size_t)FT) + s < FT) ntok += b->full_mask[r + (size_t)s];
        return ntok;
    }
    for (size_t n = 0; n < (size_t)b->B * b->T; n++) ntok += q->mask[n];
    return ntok;
}

/* eh_proj forward, x[Nl,C] = cat[Nl,2C] W^T: one product at tp 1; column-parallel above
 * (cat, and its gathered copy, bf16 with act16) */
static void eh_forward(gpt_model *m, float *x, const float *cat, const float *W, const kb_bf16 *W16, int N) {
    const kb_ops *o = m->ops;
    int C = m->cfg.hidden, tp = m->tp, Nl = m->sp ? N / tp : N, Cl = C / tp;
    if (tp == 1) {
        gpt__linear_act(m, x, cat, m->act16, W, W16, NULL, N, 2 * C, C);
        return;
    }
    const float *in = cat;
    if (m->sp) gpt__tp_allgather_act(m, m->mtp_gcat, cat, (size_t)Nl * 2 * C, m->act16), in = m->mtp_gcat;
    gpt__linear_act(m, m->mtp_part, in, m->act16, W, W16, NULL, N, 2 * C, Cl);
    /* gather_from_tensor_model_parallel_region: the ranks' columns side by side; under SP
     * (scatter_to_sequence_parallel_region) this rank's token rows only */
    gpt__tp_allgather(m, m->mtp_blk, m->mtp_part, (size_t)N * Cl);
    if (m->be->status) return;
    size_t r0 = m->sp ? (size_t)m->tpr * Nl : 0, row = sizeof(float) * (size_t)Cl;
    for (int j = 0; j < tp; j++) /* rank j's columns [j Cl, (j+1) Cl) of this rank's rows */
        o->copy_rows(m->be, x + (size_t)j * Cl, sizeof(float) * (size_t)C, m->mtp_blk + ((size_t)j * N + r0) * Cl, row,
                     row, (size_t)Nl);
}

/* eh_proj's product backward: din (overwritten; fp32) and dW from its input cat (bf16 with
 * act16) */
static void eh_product_backward(gpt_model *m, float *din, float *dW, const float *dout, const float *cat,
                                const float *W, const kb_bf16 *W16, int N, int OC) {
    int IC = 2 * m->cfg.hidden;
    if (m->act16)
        m->ops->linear_backward_bf16(m->be, din, dW, NULL, dout, (const kb_bf16 *)(const void *)cat, W, W16, N, IC, OC);
    else m->ops->linear_backward(m->be, din, dW, NULL, dout, cat, W, W16, N, IC, OC);
}

/* eh_proj backward from dx[Nl,C]: dcat[Nl,2C] (overwritten), dW accumulated */
static void eh_backward(gpt_model *m, float *dcat, float *dW, const float *dx, const float *cat, const float *W,
                        const kb_bf16 *W16, int N) {
    const kb_ops *o = m->ops;
    int C = m->cfg.hidden, tp = m->tp, Nl = m->sp ? N / tp : N, Cl = C / tp;
    if (tp == 1) {
        eh_product_backward(m, dcat, dW, dx, cat, W, W16, N, C);
        return;
    }
    /* this rank's output columns of the gradient (all-gathered over the tokens under SP) */
    const float *dfull = dx;
    if (m->sp) gpt__tp_allgather(m, m->dfull, dx, (size_t)Nl * C), dfull = m->dfull;
    if (m->be->status) return;
    o->copy_rows(m->be, m->mtp_part, sizeof(float) * (size_t)Cl, dfull + (size_t)m->tpr * Cl, sizeof(float) * (size_t)C,
                 sizeof(float) * (size_t)Cl, (size_t)N);
    const float *in = cat;
    if (m->sp) gpt__tp_allgather_act(m, m->mtp_gcat, cat, (size_t)Nl * 2 * C, m->act16), in = m->mtp_gcat;
    float *dpart = m->sp ? m->mtp_dcatf : dcat;
    eh_product_backward(m, dpart, dW, m->mtp_part, in, W, W16, N, Cl);
    if (m->sp) gpt__tp_reduce_scatter(m, dcat, dpart, (size_t)Nl * 2 * C);
    else gpt__tp_allreduce(m, dcat, (size_t)N * 2 * C);
}

/* The micro batch's main loss tokens (the whole sequences' under context parallelism). */
static double main_tokens(const gpt_batch *b) {
    double n = 0;
    size_t T = b->full_tokens ? (size_t)b->full_T : (size_t)b->T;
    const float *mask = b->full_tokens ? b->full_mask : b->loss_mask;
    for (size_t r = 0; r < (size_t)b->B * T; r++) n += mask[r];
    return n;
}

/* Depth k's rolled batch and its tokens' gradient weights (per token: Megatron's
 * process_mtp_loss rescales the depth's sum by the main loss's tokens over its own, the
 * whole sequences' counts here, so that a context-parallel run weighs as one rank). */
static void depth_prepare(gpt_model *m, mtp_acts *q, const gpt_batch *b, int k) {
    const gpt_config *c = &m->cfg;
    int N = b->B * b->T, D = c->mtp_layers;
    roll_batch(q, b, k);
    double ntok = rolled_tokens(q, b, k);
    q->ntok = ntok;
    float w = m->mtp_tok_w >= 0
                  ? (float)((double)c->mtp_loss_scaling / D * (main_tokens(b) / (ntok > 0 ? ntok : 1.0)) *
                            m->mtp_tok_w)
                  : (float)((double)c->mtp_loss_scaling / D / (ntok > 0 ? ntok : 1.0) * m->aux_loss_scale);
    for (int n = 0; n < N; n++) q->dscale[n] = q->mask[n] * w;
    if (!q->d_tok) return;
    /* the kernels' copies, in order with the queued work (gpt_step.c's to_backend) */
    size_t ib = sizeof(int32_t) * (size_t)N;
    m->ops->copy(m->be, q->d_tok, q->tok, ib);
    m->ops->copy(m->be, q->d_pos, q->pos, ib);
    m->ops->copy(m->be, q->d_tgt, q->tgt, ib);
    m->ops->copy(m->be, q->d_dscale, q->dscale, sizeof(float) * (size_t)N);
}

/* Depth k's batch arrays as its kernels read them: the backend's copies, or (CPU) the host's. */
static dev_batch depth_batch(const mtp_acts *q, const gpt_batch *b, bool dscale) {
    if (!q->d_tok) return (dev_batch){q->tok, q->pos, NULL, q->tgt, dscale ? q->dscale : NULL, b->rows};
    return (dev_batch){q->d_tok, q->d_pos, NULL, q->d_tgt, dscale ? q->d_dscale : NULL, b->rows};
}

/* Depth k from h_prev [Nl,C] to its final norm's output q->out. */
static int depth_hidden_forward(gpt_model *m, mtp_acts *q, int k, const float *h_prev, const gpt_batch *b,
                                uint64_t seed) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int L = c->num_layers, B = b->B, T = b->T, N = B * T, C = c->hidden;
    int Nl = m->sp ? N / m->tp : N;
    const int *t = m->t_mtp[k];
    dev_batch xb = depth_batch(q, b, true);
    gpt__embedding_forward(m, q->emb, q->tok, xb.tokens, xb.positions, N);
    if (c->hidden_dropout > 0)
        gpt__dropout_rows(m, b->rows, N * m->cp, q->emb, q->emb, Nl, c->hidden_dropout, seed, gpt__site(L + k, 0));
    /* enorm and hnorm: outputs only eh_proj reads (through cat): bf16 with act16 */
    gpt__norm_act(m, q->en, q->en_mean, q->en_rstd, q->emb, gpt__norm_w(m, t[MTP_EN_W]), P(m, t[MTP_EN_B]), Nl);
    gpt__norm_act(m, q->hn, q->hn_mean, q->hn_rstd, h_prev, gpt__norm_w(m, t[MTP_HN_W]), P(m, t[MTP_HN_B]), Nl);
    /* cat = [en | hn], row by row (elements of 2 bytes with act16) */
    size_t row = (m->act16 ? sizeof(kb_bf16) : sizeof(float)) * (size_t)C;
    o->copy_rows(be, q->cat, 2 * row, q->en, row, row, (size_t)Nl);
    o->copy_rows(be, (char *)q->cat + row, 2 * row, q->hn, row, row, (size_t)Nl);
    /* eh_proj (column-parallel under tensor parallelism) */
    eh_forward(m, q->layer.x_in, q->cat, P(m, t[MTP_EH_W]), P16(m, t[MTP_EH_W]), N);
    int rc = gpt__layer_forward(m, &q->layer, L + k, q->x_out, &xb, B, T, true, seed);
    if (rc) return rc;
    o->norm_forward(be, c->rmsnorm, q->out, q->out_mean, q->out_rstd, q->x_out, gpt__norm_w(m, t[MTP_FN_W]), P(m, t[MTP_FN_B]),
                    Nl, C, c->norm_eps);
    return be->status;
}

/* Depth k's loss from its output `out` [Nl,C]: the shared output layer (column-parallel over
 * the vocabulary; its input all-gathered under sequence parallelism) and the cross-entropy. */
static int depth_loss_forward(gpt_model *m, mtp_acts *q, int k, const float *out, int N) {
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int Nl = m->sp ? N / m->tp : N;
    const float *inf = out;
    if (m->sp) gpt__tp_allgather(m, m->gath, out, (size_t)Nl * m->cfg.hidden), inf = m->gath;
    o->linear_forward(be, q->logits, inf, P(m, m->t_lm), P16(m, m->t_lm), NULL, N, m->cfg.hidden, m->Vl);
    gpt__cross_entropy(m, q->losses, q->logits, q->d_tgt ? q->d_tgt : q->tgt, q->d_dscale ? q->d_dscale : q->dscale,
                       N);
    o->sync(be);
    if (be->status) return be->status;
    double sum = 0;
    for (int n = 0; n < N; n++) sum += (double)q->losses[n] * q->mask[n];
    q->loss = q->ntok > 0 ? sum / q->ntok : 0.0;
    m->mtp_loss_sum[k] += q->loss;
    return 0;
}

/* The shared output layer's backward for depth k (q->logits hold dloss/dlogits): the
 * gradient of its input `out` (summed over the group, this rank's rows) into m->dh. */
static void depth_loss_backward(gpt_model *m, mtp_acts *q, const float *out, int N) {
    int C = m->cfg.hidden, Nl = m->sp ? N / m->tp : N;
    const float *inf = out;
    if (m->sp) gpt__tp_allgather(m, m->gath, out, (size_t)Nl * C), inf = m->gath;
    gpt__column_parallel_backward(m, G(m, m->t_lm), NULL, q->logits, inf, P(m, m->t_lm), P16(m, m->t_lm), N, C, m->Vl);
}

/* Depth k's backward from m->mtp_dout, the gradient of its output (the loss's plus the next
 * depth's): its weights' gradients accumulated, the embedding's too; the gradient of its
 * h_prev into *dprev (one of m->mtp_dh). */
static int depth_hidden_backward(gpt_model *m, mtp_acts *q, int k, const float *h_prev, const gpt_batch *b,
                                 uint64_t seed, float **dprev) {
    const gpt_config *c = &m->cfg;
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int L = c->num_layers, B = b->B, T = b->T, N = B * T, C = c->hidden;
    int Nl = m->sp ? N / m->tp : N;
    size_t NlC = (size_t)Nl * C;
    const int *t = m->t_mtp[k];
    o->zero(be, m->dx, NlC);
    o->norm_backward(be, c->rmsnorm, m->dx, G(m, t[MTP_FN_W]), G(m, t[MTP_FN_B]), m->mtp_dout, q->x_out,
                     gpt__norm_w(m, t[MTP_FN_W]), q->out_mean, q->out_rstd, Nl, C);
    dev_batch xb = depth_batch(q, b, false);
    int rc = gpt__layer_backward(m, &q->layer, L + k, &xb, B, T, seed);
    if (rc) return rc;
    /* eh_proj: m->dx is the gradient of its output */
    eh_backward(m, m->mtp_dcat, G(m, t[MTP_EH_W]), m->dx, q->cat, P(m, t[MTP_EH_W]), P16(m, t[MTP_EH_W]), N);
    if (be->status) return be->status;
    /* split [d en | d hn]: d en into mtp_dout, d hn into dh */
    float *dhn = m->dh;
    size_t row = sizeof(float) * (size_t)C;
    o->copy_rows(be, m->mtp_dout, row, m->mtp_dcat, 2 * row, row, (size_t)Nl);
    o->copy_rows(be, dhn, row, m->mtp_dcat + C, 2 * row, row, (size_t)Nl);
    /* enorm into the embedding (the decoder's embedding backward) */
    o->zero(be, m->mtp_demb, NlC);
    o->norm_backward(be, c->rmsnorm, m->mtp_demb, G(m, t[MTP_EN_W]), G(m, t[MTP_EN_B]), m->mtp_dout, q->emb,
                     gpt__norm_w(m, t[MTP_EN_W]), q->en_mean, q->en_rstd, Nl, C);
    if (c->hidden_dropout > 0)
        gpt__dropout_rows(m, b->rows, N * m->cp, m->mtp_demb, m->mtp_demb, Nl, c->hidden_dropout, seed,
                          gpt__site(L + k, 0));
    gpt__embedding_backward(m, m->mtp_demb, q->tok, xb.tokens, xb.positions, N);
    /* hnorm into the previous depth's output (or the main final norm's) */
    float *d = m->mtp_dh[k & 1];
    o->zero(be, d, NlC);
    o->norm_backward(be, c->rmsnorm, d, G(m, t[MTP_HN_W]), G(m, t[MTP_HN_B]), dhn, h_prev, gpt__norm_w(m, t[MTP_HN_W]),
                     q->hn_mean, q->hn_rstd, Nl, C);
    *dprev = d;
    return 0;
}

static int mtp_check_batch(gpt_model *m, const gpt_batch *b) {
    if (b->seg)
        return m->be->status = co_err_set(CO_EUNSUPPORTED, "multi-token prediction with --reset-attention-mask "
                                                           "(document masks) is not supported yet");
    return 0;
}

/* The depths from the main final norm's output sl->lnf, each with its loss (with_loss) or
 * up to its output only (the MTP stage). */
static int depths_forward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, uint64_t seed, bool with_loss) {
    if (mtp_check_batch(m, b)) return m->be->status;
    const float *h_prev = sl->lnf;
    for (int k = 0; k < m->cfg.mtp_layers; k++) {
        mtp_acts *q = &sl->mtp[k];
        depth_prepare(m, q, b, k);
        int rc = depth_hidden_forward(m, q, k, h_prev, b, seed);
        if (!rc && with_loss) rc = depth_loss_forward(m, q, k, q->out, b->B * b->T);
        if (rc) return rc;
        h_prev = q->out;
    }
    return 0;
}

int gpt__mtp_forward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, bool train, uint64_t seed) {
    sl->mtp_done = false;
    if (m->cfg.mtp_layers <= 0 || !train) return 0;
    int rc = depths_forward(m, sl, b, seed, true);
    if (rc) return rc;
    m->mtp_forwards++;
    sl->mtp_done = true;
    return 0;
}

int gpt__mtp_backward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, uint64_t seed) {
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int D = m->cfg.mtp_layers, N = b->B * b->T;
    m->mtp_dlnf = NULL;
    if (D <= 0 || !sl->mtp_done) return 0;
    size_t NlC = (size_t)(m->sp ? N / m->tp : N) * m->cfg.hidden;
    /* dnext: the gradient of depth k's output from depth k+1's hnorm (none for the last) */
    float *dnext = NULL;
    for (int k = D - 1; k >= 0; k--) {
        mtp_acts *q = &sl->mtp[k];
        depth_loss_backward(m, q, q->out, N);
        if (dnext) o->add(be, m->mtp_dout, m->dh, dnext, NlC);
        else o->copy(be, m->mtp_dout, m->dh, NlC * sizeof(float));
        int rc = depth_hidden_backward(m, q, k, k ? sl->mtp[k - 1].out : sl->lnf, b, seed, &dnext);
        if (rc) return rc;
    }
    o->sync(be);
    m->mtp_dlnf = dnext;
    return be->status;
}

int gpt__mtp_hidden_forward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, uint64_t seed) {
    int D = m->cfg.mtp_layers, N = b->B * b->T;
    size_t NlC = (size_t)(m->sp ? N / m->tp : N) * m->cfg.hidden;
    sl->mtp_done = false;
    int rc = depths_forward(m, sl, b, seed, false);
    if (rc) return rc;
    /* the output: the main final norm's, then each depth's */
    m->ops->copy(m->be, sl->mtp_out, sl->lnf, NlC * sizeof(float));
    for (int k = 0; k < D; k++)
        m->ops->copy(m->be, sl->mtp_out + (size_t)(k + 1) * NlC, sl->mtp[k].out, NlC * sizeof(float));
    m->ops->sync(m->be);
    sl->mtp_done = true;
    return m->be->status;
}

int gpt__mtp_hidden_backward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, const float *dout, uint64_t seed) {
    const kb_ops *o = m->ops;
    kb_backend *be = m->be;
    int D = m->cfg.mtp_layers, N = b->B * b->T;
    size_t NlC = (size_t)(m->sp ? N / m->tp : N) * m->cfg.hidden;
    m->mtp_dlnf = NULL;
    if (!sl->mtp_done) return 0;
    float *dnext = NULL;
    for (int k = D - 1; k >= 0; k--) {
        const float *dk = dout + (size_t)(k + 1) * NlC; /* the loss's gradient of depth k's output */
        if (dnext) o->add(be, m->mtp_dout, dk, dnext, NlC);
        else o->copy(be, m->mtp_dout, dk, NlC * sizeof(float));
        int rc = depth_hidden_backward(m, &sl->mtp[k], k, k ? sl->mtp[k - 1].out : sl->lnf, b, seed, &dnext);
        if (rc) return rc;
    }
    o->sync(be);
    m->mtp_dlnf = dnext;
    return be->status;
}

int gpt__mtp_loss_forward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, const float *in) {
    int D = m->cfg.mtp_layers, N = b->B * b->T;
    size_t NlC = (size_t)(m->sp ? N / m->tp : N) * m->cfg.hidden;
    sl->mtp_done = false;
    if (mtp_check_batch(m, b)) return m->be->status;
    for (int k = 0; k < D; k++) {
        depth_prepare(m, &sl->mtp[k], b, k);
        int rc = depth_loss_forward(m, &sl->mtp[k], k, in + (size_t)(k + 1) * NlC, N);
        if (rc) return rc;
    }
    m->mtp_forwards++;
    sl->mtp_done = true;
    return 0;
}

int gpt__mtp_loss_backward(gpt_model *m, chunk_slot *sl, const float *in, float *din) {
    int D = m->cfg.mtp_layers, N = sl->B * sl->T;
    size_t NlC = (size_t)(m->sp ? N / m->tp : N) * m->cfg.hidden;
    if (!sl->mtp_done) return 0;
    /* the depths in the order of the one-stage backward (the output layer's gradient sums
     * alike) */
    for (int k = D - 1; k >= 0; k--) {
        depth_loss_backward(m, &sl->mtp[k], in + (size_t)(k + 1) * NlC, N);
        m->ops->copy(m->be, din + (size_t)(k + 1) * NlC, m->dh, NlC * sizeof(float));
    }
    m->ops->sync(m->be);
    return m->be->status;
}
