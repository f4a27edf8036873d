/* gpt_cp.c - the model's context parallelism (gpt.h, docs/context-parallel.md): one layer's
 * attention through the one-rank kernel at cp 1, through load-balanced ring attention over
 * the context group (model/ring_attention.c) at cp > 1. Everything else in the model is per
 * token and runs unchanged on the rank's local tokens. */
#include "model/gpt_internal.h"

#include "comm/comm.h"
#include "common/error.h"
#include "common/log.h"
#include "model/ring_attention.h"

void gpt_set_context_group(gpt_model *m, struct cm_comm *cp, int timeout_ms) {
    m->cpc = cp;
    m->cp_timeout = timeout_ms;
    /* the MoE layers route this rank's tokens, their aux counts summed over the context group
     * (Megatron's router over tp x cp; with tensor parallelism: gpt_set_moe_token_group) */
    if (m->cp > 1 && m->tp == 1) gpt_set_moe_token_group(m, cp, timeout_ms);
}

void gpt_set_moe_token_group(gpt_model *m, struct cm_comm *tpcp, int timeout_ms) {
    if (tpcp && (tpcp->size != m->tp * m->cp || tpcp->rank % m->tp != m->tpr)) {
        m->be->status = co_err_set(CO_EINVAL, "the MoE layers' token group: %d ranks with this one at %d, not tensor %d "
                                              "x context %d with this one at tensor rank %d", tpcp->size, tpcp->rank,
                                   m->tp, m->cp, m->tpr);
        return;
    }
    gpt__moe_token_group(m, tpcp, m->tp, timeout_ms);
}

void gpt_set_moe_global_group(gpt_model *m, struct cm_comm *dp, int timeout_ms) {
    for (int k = 0; k < m->nchunks; k++)
        for (int s = 0; s < m->chunk[k].slots; s++)
            for (int i = 0; i < m->chunk[k].def.nlayers; i++) {
                moe_layer *ml = m->chunk[k].slot[s].acts[i].moe;
                /* (a layer's micro batch slots add to one running sum: slot 0's) */
                int rc = ml ? moe_set_global_group(ml, dp, m->chunk[k].slot[0].acts[i].moe, timeout_ms) : 0;
                if (rc && !m->be->status) m->be->status = rc;
            }
}

void gpt_moe_global_reset(gpt_model *m) {
    for (int k = 0; k < m->nchunks; k++)
        for (int i = 0; i < m->chunk[k].def.nlayers && m->chunk[k].slots > 0; i++)
            if (m->chunk[k].slot[0].acts[i].moe) moe_global_aux_reset(m->chunk[k].slot[0].acts[i].moe);
}

/* The ring's geometry and exchange for a micro batch of B x T local tokens; false (and the
 * backend's status set) when the group is missing or does not match the configuration. */
static bool ring_of(gpt_model *m, int B, int T, ring_geo *g, ring_comm *rc, ring_exchange *x, const char *what) {
    if (!m->cpc || m->cpc->size != m->cp || m->cpc->rank != m->cpr) {
        m->be->status = co_err_set(CO_EINVAL, "%s: the context group is not set or is not %d ranks with this one at %d "
                                              "(gpt_set_context_group)", what, m->cp, m->cpr);
        return false;
    }
    *g = (ring_geo){.cp = m->cp, .rank = m->cpr, .B = B, .seq = T * m->cp, .nh = m->NHl, .nkv = m->NKVl,
                    .hd = m->cfg.head_dim};
    *rc = (ring_comm){.c = m->cpc, .timeout_ms = m->cp_timeout};
    ring_exchange_comm(x, rc);
    if (x->shift_q && !m->cpc->ops->queued_error) x->shift_q = NULL; /* (no way to see a failure) */
    if (x->shift_q) { /* stream-ordered: an earlier queued shift's failure stops the pass */
        int e = m->cpc->ops->queued_error(m->cpc);
        if (e) {
            m->be->status = e;
            return false;
        }
    }
    return true;
}

/* The model's ring workspace (made on first use, when the rank says how its ring's steps are
 * ordered with the device); NULL with the backend's status set. */
static ring_ws *ring_ws_of(gpt_model *m, const ring_exchange *x) {
    if (m->ring_ws) return m->ring_ws;
    if (!(m->ring_ws = ring_ws_new())) {
        m->be->status = co_err_set(CO_ENOMEM, "attention (context parallel): out of memory for the ring's workspace");
        return NULL;
    }
    if (m->ops->stream && m->ops->stream(m->be))
        co_log(CO_LOG_INFO, "context parallelism: the ring's merge and dK/dV sums on the device, its shifts %s",
               x->shift_q ? "queued beside its blocks on the backend's streams (NCCL send/recv): no host wait per ring step"
                          : "blocking (the host waits for the device before each ring step's shifts)");
    return m->ring_ws;
}

void gpt__attention_forward(gpt_model *m, float *att, float *lse, const float *qkv, const int32_t *seg, int B, int T,
                            float pa, uint64_t seed, uint64_t site) {
    if (m->be->status) return;
    if (m->cp <= 1 && m->act16) { /* attention's output in bf16: gpt_internal.h act16 */
        m->ops->attention_forward_bf16(m->be, gpt__a16(att), lse, qkv, seg, B, T, m->NHl, m->NKVl, m->cfg.head_dim, pa,
                                       seed, site);
        return;
    }
    if (m->cp <= 1) {
        m->ops->attention_forward(m->be, att, lse, qkv, seg, B, T, m->NHl, m->NKVl, m->cfg.head_dim, pa, seed, site);
        return;
    }
    ring_geo g;
    ring_comm rc;
    ring_exchange x;
    if (!ring_of(m, B, T, &g, &rc, &x, "attention (context parallel)") || !ring_ws_of(m, &x)) return;
    /* with act16 the merged output is rounded once to bf16 into att */
    int e = ring_attention_forward_ws(m->be, m->ring_ws, &x, &g, m->act16 ? NULL : att,
                                      m->act16 ? gpt__a16(att) : NULL, lse, qkv, seg);
    if (e) m->be->status = e;
}

void gpt__attention_backward(gpt_model *m, float *dqkv, const float *datt, const float *qkv, const float *att,
                             const float *lse, const int32_t *seg, int B, int T, float pa, uint64_t seed,
                             uint64_t site) {
    if (m->be->status) return;
    const kb_bf16 *att16 = m->act16 ? (const kb_bf16 *)(const void *)att : NULL;
    if (m->cp <= 1 && att16) {
        m->ops->attention_backward_bf16(m->be, dqkv, datt, qkv, att16, lse, seg, B, T, m->NHl, m->NKVl,
                                        m->cfg.head_dim, pa, seed, site);
        return;
    }
    if (m->cp <= 1) {
        m->ops->attention_backward(m->be, dqkv, datt, qkv, att, lse, seg, B, T, m->NHl, m->NKVl, m->cfg.head_dim, pa,
                                   seed, site);
        return;
    }
    ring_geo g;
    ring_comm rc;
    ring_exchange x;
    if (!ring_of(m, B, T, &g, &rc, &x, "attention backward (context parallel)") || !ring_ws_of(m, &x)) return;
    int e = ring_attention_backward_ws(m->be, m->ring_ws, &x, &g, dqkv, datt, qkv, att16 ? NULL : att, att16, lse,
                                       seg);
    if (e) m->be->status = e;
}

void gpt__dropout_rows(gpt_model *m, const int32_t *rows, int N, float *out, const float *in, int Nl, float p,
                       uint64_t seed, uint64_t site) {
    const size_t C = (size_t)m->cfg.hidden;
    const int r0 = m->sp ? m->tpr * Nl : 0;
    if (!rows) { /* the tokens are the whole batch: element (r0 + i) * C + c */
        m->ops->dropout(m->be, out, in, (size_t)Nl * C, p, seed, site + (uint64_t)r0 * C);
        return;
    }
    for (int i = 0; i < Nl;) {
        /* a run of local rows whose rows in the whole batch follow each other (padding rows:
         * one run each, past the batch's N rows) */
        const int64_t g = rows[r0 + i] >= 0 ? rows[r0 + i] : (int64_t)N + r0 + i;
        int k = 1;
        if (rows[r0 + i] >= 0)
            while (i + k < Nl && rows[r0 + i + k] == rows[r0 + i] + k) k++;
        m->ops->dropout(m->be, out + (size_t)i * C, in + (size_t)i * C, (size_t)k * C, p, seed, site + (uint64_t)g * C);
        i += k;
    }
}
