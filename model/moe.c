/* moe.c - the mixture-of-experts MLP on one rank (moe.h): routing on the host, the token
 * permutations, the experts' matrix products and activations through the backend, forward
 * and backward.
 *
 * Forward of N tokens:
 *   logits[N,E] = x Wr^T                                  backend (linear_forward), then sync
 *   per token: lse, selection (route_token), routing probs, aux scores   host
 *   capacity: per expert keep cap tokens (apply_capacity)                host
 *   permute: rows ordered by expert, then token (tables on the host, copied):
 *     xp[M,h] = x[row_tok]                                 backend (gather_rows)
 *   per expert e (rows [eoff[e], eoff[e+1])):
 *     h1[rows,F1] = xp W1_e^T; act[rows,F] = gelu(h1) | swiglu(h1);
 *     out[rows,h] = act W2_e^T                                            backend
 *   y[n] = sum over its rows, in expert order, of prob * out[row]  backend (combine_rows)
 *   shared expert: y += act_s(x Ws1^T) Ws2^T                             backend
 * Backward walks it back: dprob[n,e] = dy[n] . out[row] and dout[row] = prob * dy[n]
 * (combine_backward; dprob read by the host after one sync); the experts' products; the
 * router from dprob through the score function, plus the aux and z losses' gradients
 * (router_backward), dWr and dx through linear_backward; the experts' input gradients added
 * into dx per token in the same order as forward (combine_rows).
 * Under a sequence group (moe_set_sequence_group) the aux losses' counts are all-reduced over
 * it between the routing and the losses, the rest runs on this rank's tokens unchanged.
 * With bf16 input (moe_set_input16) x is bf16, widened into an fp32 scratch first. The host
 * parts are plain loops in a fixed order and the backend's permutations have a fixed order
 * too, so results are bitwise reproducible. */
#include "model/moe.h"
#include "model/moe_internal.h"

#include "common/error.h"
#include "common/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* ---- configuration ---- */

int moe_layout(const moe_config *c, moe_offsets *off) {
    if (c->hidden <= 0 || c->num_experts <= 0 || c->ffn_hidden <= 0)
        return co_err_set(CO_EINVAL, "moe: hidden %d, num_experts %d and ffn_hidden %d must be positive", c->hidden,
                          c->num_experts, c->ffn_hidden);
    int E = c->num_experts, k = c->topk;
    if (k < 1 || k > E) return co_err_set(CO_EINVAL, "moe: router top-k %d must be in [1, num_experts %d]", k, E);
    if (c->score != MOE_SCORE_SOFTMAX && c->score != MOE_SCORE_SIGMOID)
        return co_err_set(CO_EINVAL, "moe: unknown router score function %d", (int)c->score);
    if (c->pre_softmax && c->score != MOE_SCORE_SOFTMAX)
        return co_err_set(CO_EINVAL, "moe: pre-softmax applies to the softmax score function only");
    if (c->expert_bias && c->score != MOE_SCORE_SIGMOID)
        return co_err_set(CO_EINVAL, "moe: the expert bias needs the sigmoid score function (as Megatron)");
    if (c->num_groups < 0) return co_err_set(CO_EINVAL, "moe: num_groups %d is negative", c->num_groups);
    if (c->num_groups > 0) {
        int G = c->num_groups, gt = c->group_topk;
        if (E % G) return co_err_set(CO_EINVAL, "moe: %d experts do not split into %d groups", E, G);
        if (gt < 1 || gt > G) return co_err_set(CO_EINVAL, "moe: group_topk %d must be in [1, num_groups %d]", gt, G);
        if (k < gt || k / gt > E / G || k > gt * (E / G))
            return co_err_set(CO_EINVAL, "moe: top-k %d does not fit group_topk %d groups of %d experts", k, gt, E / G);
    } else if (c->group_topk) {
        return co_err_set(CO_EINVAL, "moe: group_topk %d needs num_groups", c->group_topk);
    }
    if (!(c->scaling_factor >= 0.0f)) return co_err_set(CO_EINVAL, "moe: the top-k scaling factor must be >= 0");
    if (c->lb != MOE_LB_NONE && c->lb != MOE_LB_AUX && c->lb != MOE_LB_SEQ_AUX && c->lb != MOE_LB_GLOBAL_AUX &&
        c->lb != MOE_LB_SINKHORN)
        return co_err_set(CO_EINVAL, "moe: unknown load-balancing type %d", (int)c->lb);
    if (c->lb == MOE_LB_SINKHORN &&
        (c->aux_coeff > 0 || c->pre_softmax || c->num_groups || c->scaling_factor > 0 || c->expert_bias))
        return co_err_set(CO_EINVAL, "moe: sinkhorn routing takes no aux loss, pre-softmax, groups, scaling factor "
                                     "or expert bias");
    if (!(c->aux_coeff >= 0.0f) || !(c->z_coeff >= 0.0f))
        return co_err_set(CO_EINVAL, "moe: the aux and z loss coefficients must be >= 0");
    if (c->drop != MOE_DROP_PROBS && c->drop != MOE_DROP_POSITION)
        return co_err_set(CO_EINVAL, "moe: unknown token drop policy %d", (int)c->drop);
    if (c->pad_to_capacity && !(c->capacity_factor > 0))
        return co_err_set(CO_EINVAL, "moe: padding to capacity needs a capacity factor");
    if (c->shared_ffn < 0) return co_err_set(CO_EINVAL, "moe: shared expert size %d is negative", c->shared_ffn);
    if (c->ep_size < 0 || (c->ep_size > 1 && E % c->ep_size))
        return co_err_set(CO_EINVAL, "moe: %d experts do not split over %d expert-parallel ranks", E, c->ep_size);
    if (c->etp_size < 0 || (c->etp_size > 1 && c->ffn_hidden % c->etp_size))
        return co_err_set(CO_EINVAL, "moe: the experts' intermediate size %d does not split over %d expert-tensor-"
                          "parallel ranks", c->ffn_hidden, c->etp_size);
    /* (this rank's slice of each expert: F/etp of its intermediate size) */
    size_t h = (size_t)c->hidden, F = (size_t)(c->ffn_hidden / (c->etp_size > 1 ? c->etp_size : 1));
    size_t F1 = c->swiglu ? 2 * F : F;
    size_t Fs = (size_t)c->shared_ffn, Fs1 = c->swiglu ? 2 * Fs : Fs;
    size_t El = (size_t)(c->ep_size > 1 ? E / c->ep_size : E);
    off->router = 0;
    off->fc1 = off->router + (size_t)E * h;
    off->fc2 = off->fc1 + El * F1 * h;
    off->shared_fc1 = off->fc2 + El * h * F;
    off->shared_fc2 = off->shared_fc1 + Fs1 * h;
    off->total = off->shared_fc2 + h * Fs;
    return 0;
}

/* capacity for N tokens: ceil(N*k/E * factor) as Megatron's get_capacity, at most N */
static int capacity_of(const moe_config *c, int N) {
    if (!(c->capacity_factor > 0)) return 0;
    double cap = ceil((double)N * c->topk / c->num_experts * c->capacity_factor);
    return cap > N ? N : (int)cap;
}

void moe_destroy(moe_layer **pm) {
    moe_layer *m = *pm;
    if (!m) return;
    moe__ep_free(m);
    float **bufs[] = {&m->logits, &m->xp, &m->h1, &m->act, &m->out, &m->dout, &m->dact, &m->dh1, &m->dxp,
                      &m->dlogits, &m->s_h1, &m->s_act, &m->s_dact, &m->s_dh1, &m->tmp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (*bufs[i]) m->o->free(m->be, *bufs[i]);
    void *dev[] = {m->d_rowtok, m->d_toff, m->d_trow, m->d_tw, m->d_rw, m->d_dw};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) m->o->free(m->be, dev[i]);
    free(m->toff);
    free(m->trow);
    free(m->tw);
    free(m->rw);
    free(m->sel);
    free(m->rprobs);
    free(m->probs);
    free(m->map0);
    free(m->map);
    free(m->lse);
    free(m->auxs);
    free(m->auxcnt);
    free(m->sq_cnt);
    free(m->gsum);
    free(m->gavg);
    free(m->tpe);
    free(m->eoff);
    free(m->row_tok);
    free(m->row_exp);
    free(m->dprob);
    free(m->rs);
    free(m->gs);
    free(m->elig);
    free(m->cand);
    free(m->pad);
    free(m->vseq);
    free(m->snorm);
    free(m->sd0);
    free(m->sd1);
    free(m);
    *pm = NULL;
}

int moe_new(moe_layer **out, const moe_config *c, kb_backend *be, int max_tokens) {
    *out = NULL;
    moe_offsets off;
    int rc = moe_layout(c, &off);
    if (rc) return rc;
    if (max_tokens <= 0) return co_err_set(CO_EINVAL, "moe: max_tokens %d must be positive", max_tokens);
    if (!be->ops->gather_rows || !be->ops->combine_rows || !be->ops->combine_backward)
        return co_err_set(CO_EUNSUPPORTED, "moe: the backend has no token permutations (gather_rows, combine_rows)");
    moe_layer *m = calloc(1, sizeof *m);
    if (!m) return co_err_set(CO_ENOMEM, "moe: allocating the layer");
    m->c = *c;
    m->off = off;
    m->be = be;
    m->o = be->ops;
    m->E = c->num_experts;
    m->h = c->hidden;
    m->k = c->topk;
    m->F = c->ffn_hidden / (c->etp_size > 1 ? c->etp_size : 1); /* this rank's slice of each expert */
    m->F1 = c->swiglu ? 2 * m->F : m->F;
    m->Fs = c->shared_ffn;
    m->Fs1 = c->swiglu ? 2 * m->Fs : m->Fs;
    m->maxN = max_tokens;
    m->ep.El = m->E;
    m->sq_size = m->sq_shards = 1;
    /* rows the experts compute: N*k dropless or dropping; E*cap padded */
    size_t maxM = (size_t)max_tokens * (size_t)m->k;
    if (c->pad_to_capacity) {
        size_t pm = (size_t)m->E * (size_t)capacity_of(c, max_tokens);
        if (pm > maxM) maxM = pm;
    }
    m->maxM = (int)maxM;
    size_t N = (size_t)max_tokens, E = (size_t)m->E, h = (size_t)m->h;
    struct {
        float **p;
        size_t n;
    } bb[] = {{&m->logits, N * E},          {&m->xp, maxM * h},        {&m->h1, maxM * m->F1},
              {&m->act, maxM * m->F},       {&m->out, maxM * h},       {&m->dout, maxM * h},
              {&m->dact, maxM * m->F},      {&m->dh1, maxM * m->F1},   {&m->dxp, maxM * h},
              {&m->dlogits, N * E},         {&m->s_h1, N * m->Fs1},    {&m->s_act, N * m->Fs},
              {&m->s_dact, N * m->Fs},      {&m->s_dh1, N * m->Fs1},   {&m->tmp, N * h}};
    for (size_t i = 0; i < sizeof bb / sizeof bb[0]; i++) {
        if (!bb[i].n) continue;
        *bb[i].p = m->o->alloc(be, sizeof(float) * bb[i].n);
        if (!*bb[i].p) {
            moe_destroy(&m);
            return co_err_set(CO_ENOMEM, "moe: allocating %zu floats of activations", bb[i].n);
        }
    }
    struct {
        void **p;
        size_t bytes;
    } dt[] = {{(void **)&m->d_rowtok, sizeof(int32_t) * maxM}, {(void **)&m->d_toff, sizeof(int32_t) * (N + 1)},
              {(void **)&m->d_trow, sizeof(int32_t) * maxM},   {(void **)&m->d_tw, sizeof(float) * maxM},
              {(void **)&m->d_rw, sizeof(float) * maxM},       {(void **)&m->d_dw, sizeof(double) * maxM}};
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++)
        if (!(*dt[i].p = m->o->alloc(be, dt[i].bytes))) {
            moe_destroy(&m);
            return co_err_set(CO_ENOMEM, "moe: allocating the permutations' tables (%zu bytes)", dt[i].bytes);
        }
    m->toff = malloc(sizeof(int32_t) * (N + 1));
    m->trow = malloc(sizeof(int32_t) * maxM);
    m->tw = malloc(sizeof(float) * maxM);
    m->rw = malloc(sizeof(float) * maxM);
    m->sel = malloc(sizeof(int32_t) * N * (size_t)m->k);
    m->rprobs = malloc(sizeof(float) * N * E);
    m->probs = malloc(sizeof(float) * N * E);
    m->map0 = malloc(N * E);
    m->map = malloc(N * E);
    m->lse = malloc(sizeof(double) * N);
    m->auxs = malloc(sizeof(float) * N * E);
    m->auxcnt = malloc(sizeof(int32_t) * N * E);
    m->gsum = calloc(E, sizeof(int64_t));
    m->gavg = calloc(E, sizeof(double));
    m->gacc = m;
    m->tpe = malloc(sizeof(int32_t) * E);
    m->eoff = malloc(sizeof(int32_t) * (E + 1));
    m->row_tok = malloc(sizeof(int32_t) * maxM);
    m->row_exp = malloc(sizeof(int32_t) * maxM);
    m->dprob = malloc(sizeof(double) * N * E);
    m->rs = malloc(sizeof(double) * E);
    m->gs = malloc(sizeof(double) * E);
    m->elig = malloc(E);
    m->cand = malloc(sizeof(*m->cand) * N);
    m->pad = calloc(N, 1);
    m->vseq = malloc(sizeof(int64_t) * N);
    m->train = true;
    if (c->lb == MOE_LB_SINKHORN) {
        m->snorm = malloc(sizeof(double) * N * E);
        m->sd0 = malloc(sizeof(double) * N);
        m->sd1 = malloc(sizeof(double) * E);
        if (!m->snorm || !m->sd0 || !m->sd1) {
            moe_destroy(&m);
            return co_err_set(CO_ENOMEM, "moe: allocating the sinkhorn routing's tables");
        }
    }
    if (!m->sel || !m->rprobs || !m->probs || !m->map0 || !m->map || !m->lse || !m->auxs || !m->auxcnt || !m->tpe ||
        !m->gsum || !m->gavg ||
        !m->eoff || !m->row_tok || !m->row_exp || !m->dprob || !m->rs || !m->gs || !m->elig || !m->cand ||
        !m->pad || !m->vseq || !m->toff || !m->trow || !m->tw || !m->rw) {
        moe_destroy(&m);
        return co_err_set(CO_ENOMEM, "moe: allocating the routing tables");
    }
    *out = m;
    return 0;
}

const moe_offsets *moe_layer_offsets(const moe_layer *m) { return &m->off; }

void moe_set_training(moe_layer *m, bool train) { m->train = train; }

void moe_set_padding(moe_layer *m, const int32_t *rows) { m->pad_rows = rows; }

void moe_set_params16(moe_layer *m, const kb_bf16 *p16) { m->p16 = p16; }

int moe_set_input16(moe_layer *m, float *x32) {
    if (x32 && !m->o->gather_rows_bf16)
        return co_err_set(CO_EUNSUPPORTED, "moe: bf16 input on a backend without gather_rows_bf16");
    m->x16 = x32 != NULL;
    m->x32 = x32;
    return 0;
}

void moe_set_param_offsets(moe_layer *m, size_t fc1, size_t fc2, size_t shared_fc1, size_t shared_fc2) {
    m->off.fc1 = fc1;
    m->off.fc2 = fc2;
    m->off.shared_fc1 = shared_fc1;
    m->off.shared_fc2 = shared_fc2;
}

void moe_init_params(const moe_layer *m, float *params, float std, uint64_t seed) {
    co_rng r;
    co_rng_seed(&r, seed);
    for (size_t i = 0; i < m->off.total; i++) params[i] = (float)(std * co_rng_normal(&r));
}

double moe_aux_loss(const moe_layer *m) { return m->aux; }
double moe_z_loss(const moe_layer *m) { return m->z; }
const int32_t *moe_tokens_per_expert(const moe_layer *m) { return m->tpe; }
const uint8_t *moe_routing_map(const moe_layer *m) { return m->map; }
const float *moe_routing_probs(const moe_layer *m) { return m->probs; }
int moe_dropped(const moe_layer *m) { return m->dropped; }
int moe_capacity(const moe_layer *m) { return m->cap; }

void moe_expert_bias_update(float *bias, const int32_t *tpe, int E, float rate) {
    double sum = 0;
    for (int e = 0; e < E; e++) sum += tpe[e];
    double mean = sum / E;
    for (int e = 0; e < E; e++) {
        double d = mean - tpe[e];
        bias[e] += d > 0 ? rate : d < 0 ? -rate : 0.0f;
    }
}

/* ---- routing ---- */

/* The top-k of v[0..n) among elig (NULL: all) into idx[0..k): larger first, among equal
 * values the lower index first; NaNs last. */
static void topk_idx(const double *v, const uint8_t *elig, int n, int k, int32_t *idx) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            if (elig && !elig[e]) continue;
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (taken) continue;
            if (best < 0 || v[e] > v[best] || (isnan(v[best]) && !isnan(v[e]))) best = e;
        }
        idx[j] = best;
    }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* lse and softmax of one row of logits, in double */
static double row_softmax(const float *l, int E, double *sm) {
    double mx = l[0];
    for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    double s = 0;
    for (int e = 0; e < E; e++) s += (sm[e] = exp((double)l[e] - mx));
    for (int e = 0; e < E; e++) sm[e] /= s;
    return mx + log(s);
}

/* Selection of token n: fills sel[n,0..k) and the probabilities pk[0..k) before scaling. */
static void route_token(moe_layer *m, int n, const float *expert_bias, double *pk) {
    const moe_config *c = &m->c;
    int E = m->E, k = m->k;
    const float *l = m->logits + (size_t)n * E;
    double *r = m->rs, *sm = m->gs;
    int32_t *sel = m->sel + (size_t)n * k;
    /* the scores the top-k ranks */
    if (c->score == MOE_SCORE_SOFTMAX) {
        if (c->pre_softmax) {
            row_softmax(l, E, sm);
            for (int e = 0; e < E; e++) r[e] = (float)sm[e];
        } else {
            for (int e = 0; e < E; e++) r[e] = l[e];
        }
    } else {
        for (int e = 0; e < E; e++) {
            r[e] = (float)sigmoid(l[e]);
            if (expert_bias) r[e] = (float)(r[e] + expert_bias[e]);
        }
    }
    const uint8_t *elig = NULL;
    if (c->num_groups > 0) {
        /* group-limited: a group's score is the sum of its top k/group_topk scores */
        int G = c->num_groups, g = E / G, kg = k / c->group_topk;
        double gsc[G];
        int32_t gi[kg > c->group_topk ? kg : c->group_topk];
        for (int q = 0; q < G; q++) {
            topk_idx(r + (size_t)q * g, NULL, g, kg, gi);
            double s = 0;
            for (int j = 0; j < kg; j++) s += r[q * g + gi[j]];
            gsc[q] = s;
        }
        topk_idx(gsc, NULL, G, c->group_topk, gi);
        memset(m->elig, 0, (size_t)E);
        for (int j = 0; j < c->group_topk; j++) memset(m->elig + (size_t)gi[j] * g, 1, (size_t)g);
        elig = m->elig;
    }
    topk_idx(r, elig, E, k, sel);
    /* the probabilities of the selected */
    if (c->score == MOE_SCORE_SOFTMAX) {
        if (c->pre_softmax) {
            for (int j = 0; j < k; j++) pk[j] = r[sel[j]];
        } else {
            double mx = l[sel[0]], s = 0;
            for (int j = 1; j < k; j++) mx = l[sel[j]] > mx ? l[sel[j]] : mx;
            for (int j = 0; j < k; j++) s += (pk[j] = exp((double)l[sel[j]] - mx));
            for (int j = 0; j < k; j++) pk[j] /= s;
        }
    } else {
        double s = 0;
        for (int j = 0; j < k; j++) s += (pk[j] = sigmoid(l[sel[j]]));
        if (k > 1)
            for (int j = 0; j < k; j++) pk[j] /= s + 1e-20;
    }
}

/* Megatron's moe_utils.sinkhorn over this forward's N x E logits, into m->snorm: cost =
 * exp(logits); d0 = 1/N / (cost d1 + eps) per token, d1 = 1/E / (d0 cost + eps) per expert,
 * until the mean |change of d1| is at most 1e-4 (bounded: 1000 rounds); d1 * cost * d0. In
 * double (Megatron: fp32). */
static void sinkhorn(moe_layer *m) {
    int N = m->N, E = m->E;
    double *cost = m->snorm, *d0 = m->sd0, *d1 = m->sd1, eps = 1e-8, err = 1e9;
    for (size_t i = 0; i < (size_t)N * E; i++) cost[i] = exp((double)m->logits[i]);
    /* (padding rows: cost 0, so they add nothing to the columns; the rows' mean over the real) */
    int Nv = N;
    for (int n = 0; n < N && m->masked; n++) {
        if (!m->pad[n]) continue;
        memset(cost + (size_t)n * E, 0, sizeof(double) * (size_t)E);
        Nv--;
    }
    Nv = Nv > 0 ? Nv : 1;
    for (int e = 0; e < E; e++) d1[e] = 1.0;
    for (int round = 0; err > 1e-4 && round < 1000; round++) {
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int e = 0; e < E; e++) s += d1[e] * cost[(size_t)n * E + e];
            d0[n] = (1.0 / Nv) * 1.0 / (s + eps);
        }
        err = 0;
        for (int e = 0; e < E; e++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += d0[n] * cost[(size_t)n * E + e];
            double v = (1.0 / E) * 1.0 / (s + eps);
            err += fabs(v - d1[e]);
            d1[e] = v;
        }
        err /= E;
    }
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++) cost[(size_t)n * E + e] *= d1[e] * d0[n];
}

/* The activation of sinkhorn routing for one token's logits: sigmoid at top-1, else softmax. */
static void sinkhorn_act(const moe_layer *m, const float *l, double *a) {
    if (m->k == 1)
        for (int e = 0; e < m->E; e++) a[e] = sigmoid(l[e]);
    else
        row_softmax(l, m->E, a);
}

/* Sinkhorn routing's selection of token n (sel[n,0..k)) and its probabilities pk[0..k). */
static void route_sinkhorn(moe_layer *m, int n, double *pk) {
    int E = m->E, k = m->k;
    double *a = m->gs;
    int32_t *sel = m->sel + (size_t)n * k;
    sinkhorn_act(m, m->logits + (size_t)n * E, a);
    topk_idx(m->train ? m->snorm + (size_t)n * E : a, NULL, E, k, sel);
    for (int j = 0; j < k; j++) pk[j] = a[sel[j]];
}

/* larger first, NaN after every number, then the lower token index (a total order) */
static int cand_cmp(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    bool xn = isnan(x->v), yn = isnan(y->v);
    if (xn != yn) return xn ? 1 : -1;
    if (!xn && x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* map, probs from map0, rprobs under the capacity; counts the drops */
static void apply_capacity(moe_layer *m) {
    int N = m->N, E = m->E, cap = m->cap;
    size_t NE = (size_t)N * E;
    m->dropped = 0;
    if (!cap) {
        memcpy(m->map, m->map0, NE);
        memcpy(m->probs, m->rprobs, sizeof(float) * NE);
        return;
    }
    memset(m->map, 0, NE);
    for (int e = 0; e < E; e++) {
        int nc = 0; /* (padding rows are never candidates) */
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * E + e;
            if (m->masked && m->pad[n]) continue;
            m->cand[nc].v = m->c.drop == MOE_DROP_PROBS ? m->rprobs[i] : (float)m->map0[i];
            m->cand[nc++].n = n;
        }
        qsort(m->cand, (size_t)nc, sizeof *m->cand, cand_cmp);
        for (int j = 0; j < cap && j < nc; j++) {
            size_t i = (size_t)m->cand[j].n * E + e;
            m->map[i] = m->c.pad_to_capacity ? 1 : m->map0[i];
        }
    }
    for (size_t i = 0; i < NE; i++) {
        m->probs[i] = m->map[i] ? m->rprobs[i] : 0.0f;
        m->dropped += m->map0[i] && !m->map[i];
    }
}

/* The aux losses' sequences: nseq of per tokens each (the whole sequences', over the token
 * group); this rank's token n is row n0 + n of its B x T batch (of the tensor ranks' shards),
 * where each sequence has rows rows. */
static void aux_shape(const moe_layer *m, int *nseq, int *per, int *rows, int *n0) {
    bool seq = m->c.lb == MOE_LB_SEQ_AUX;
    int cp = m->sq_size / m->sq_shards;
    *nseq = seq ? m->B : 1;
    *rows = seq ? m->T : m->N * m->sq_shards;
    *per = seq ? m->T * cp : m->N * m->sq_size;
    *n0 = (m->sq_rank % m->sq_shards) * m->N;
}

/* Padding rows (moe_set_padding): this rank's rows' flags, its real rows, the real rows of
 * each aux sequence summed over the token group and their total. 0, or the group's error. */
static int pad_counts(moe_layer *m) {
    int N = m->N, nseq, per, rows, n0;
    aux_shape(m, &nseq, &per, &rows, &n0);
    if (nseq > m->maxN)
        return co_err_set(CO_EINVAL, "moe: %d sequences of padded rows, the layer holds %d", nseq, m->maxN);
    const int32_t *ids = m->pad_rows + (size_t)(m->sq_rank % m->sq_shards) * N;
    memset(m->vseq, 0, sizeof(int64_t) * (size_t)nseq);
    m->nvalid = 0;
    for (int n = 0; n < N; n++) {
        m->pad[n] = ids[n] < 0;
        if (m->pad[n]) continue;
        m->nvalid++;
        m->vseq[(n0 + n) / rows]++;
    }
    if (m->sq) {
        int rc = m->sq->ops->allreduce_sum(m->sq, m->vseq, (size_t)nseq, CM_I64, m->sq_timeout);
        if (rc) return co_err_set(rc, "moe: summing the real (not padding) tokens over the token group: %s",
                                  co_err_detail());
    }
    m->vtot = 0;
    for (int b = 0; b < nseq; b++) m->vtot += m->vseq[b];
    return 0;
}

/* global_aux_loss (moe_set_global_group): this forward's counts (m->auxcnt, this rank's)
 * summed over the token group and the data-parallel group, added to the step's running sum,
 * the loss from the running mean. 0, or a group's error. */
static int global_aux(moe_layer *m) {
    const moe_config *c = &m->c;
    int N = m->N, E = m->E, k = m->k;
    int64_t cnt[E + 1];
    for (int e = 0; e < E; e++) cnt[e] = m->auxcnt[e];
    cnt[E] = m->nvalid; /* padding: the batch's real rows, summed with the counts */
    size_t nc = (size_t)E + (m->masked ? 1 : 0);
    cm_comm *grp[2] = {m->sq, m->gdp};
    int tm[2] = {m->sq_timeout, m->gdp_timeout};
    for (int g = 0; g < 2; g++) {
        int rc = grp[g] ? grp[g]->ops->allreduce_sum(grp[g], cnt, nc, CM_I64, tm[g]) : 0;
        if (rc) return co_err_set(rc, "moe: summing the global aux loss's token counts over the %s group: %s",
                                  g ? "data-parallel" : "token", co_err_detail());
    }
    moe_layer *a = m->gacc;
    a->gsteps++;
    double T = m->masked ? (double)cnt[E] : (double)N * m->sq_size * (m->gdp ? m->gdp->size : 1), loss = 0;
    m->gT = T;
    for (int e = 0; e < E; e++) {
        a->gsum[e] += cnt[e];
        m->gavg[e] = (double)a->gsum[e] / (double)a->gsteps;
        double ps = 0;
        for (int n = 0; n < N; n++) ps += m->auxs[(size_t)n * E + e];
        loss += ps * m->gavg[e];
    }
    m->aux = T > 0 ? c->aux_coeff * loss * E / ((double)k * T * T) : 0.0;
    return 0;
}

int moe_set_global_group(moe_layer *m, cm_comm *dp, moe_layer *share, int timeout_ms) {
    if (share && share->E != m->E)
        return co_err_set(CO_EINVAL, "moe: a global aux loss shared by layers of %d and %d experts", m->E, share->E);
    m->gdp = dp && dp->size > 1 ? dp : NULL;
    m->gdp_timeout = timeout_ms;
    m->gacc = share ? share : m;
    return 0;
}

void moe_global_aux_reset(moe_layer *m) {
    memset(m->gacc->gsum, 0, sizeof(int64_t) * (size_t)m->E);
    m->gacc->gsteps = 0;
}

/* aux scores, their top-k counts (summed over the sequence group) and the load-balancing
 * loss: this rank's tokens' part of it. 0, or the group's error. */
static int aux_losses(moe_layer *m) {
    const moe_config *c = &m->c;
    int N = m->N, E = m->E, k = m->k, nseq, per, rows, n0;
    m->aux = 0;
    if (c->lb == MOE_LB_NONE || c->lb == MOE_LB_SINKHORN) return 0;
    aux_shape(m, &nseq, &per, &rows, &n0);
    memset(m->auxcnt, 0, sizeof(int32_t) * (size_t)nseq * E);
    int32_t top[E];
    for (int n = 0; n < N; n++) {
        const float *l = m->logits + (size_t)n * E;
        float *a = m->auxs + (size_t)n * E;
        if (m->masked && m->pad[n]) { /* (no score, no count) */
            memset(a, 0, sizeof(float) * (size_t)E);
            continue;
        }
        double *sc = m->gs, *v = m->rs;
        if (c->score == MOE_SCORE_SOFTMAX) {
            row_softmax(l, E, sc);
            for (int e = 0; e < E; e++) a[e] = (float)sc[e];
        } else {
            double s = 0;
            for (int e = 0; e < E; e++) s += (sc[e] = sigmoid(l[e]));
            for (int e = 0; e < E; e++) a[e] = (float)(sc[e] / (s + 1e-20));
        }
        for (int e = 0; e < E; e++) v[e] = a[e];
        topk_idx(v, NULL, E, k, top);
        for (int j = 0; j < k; j++) m->auxcnt[(size_t)((n0 + n) / rows) * E + top[j]]++;
    }
    if (c->lb == MOE_LB_GLOBAL_AUX) return global_aux(m);
    if (m->sq) {
        /* Megatron's get_tokens_per_expert_and_token_count: the counts over the group */
        size_t nc = (size_t)nseq * E;
        for (size_t i = 0; i < nc; i++) m->sq_cnt[i] = m->auxcnt[i];
        int rc = m->sq->ops->allreduce_sum(m->sq, m->sq_cnt, nc, CM_I64, m->sq_timeout);
        if (rc) return co_err_set(rc, "moe: summing the aux loss's token counts over the sequence group: %s",
                                  co_err_detail());
        for (size_t i = 0; i < nc; i++) m->auxcnt[i] = (int32_t)m->sq_cnt[i];
    }
    double loss = 0;
    for (int b = 0; b < nseq; b++) {
        /* this rank's tokens of sequence b */
        int lo = b * rows - n0, hi = (b + 1) * rows - n0;
        lo = lo < 0 ? 0 : lo;
        hi = hi > N ? N : hi;
        if (lo >= hi) continue;
        double lb = 0;
        for (int e = 0; e < E; e++) {
            double ps = 0;
            for (int n = lo; n < hi; n++) ps += m->auxs[(size_t)n * E + e];
            lb += ps * m->auxcnt[(size_t)b * E + e];
        }
        double pb = m->masked ? (double)m->vseq[b] : per; /* (the real tokens of the sequence) */
        if (pb > 0) loss += lb * E / ((double)k * pb * pb);
    }
    m->aux = c->aux_coeff * loss / nseq;
    return 0;
}

int moe_set_sequence_group(moe_layer *m, cm_comm *sq, int timeout_ms) {
    return moe_set_token_group(m, sq, sq ? sq->size : 1, timeout_ms);
}

int moe_set_token_group(moe_layer *m, cm_comm *sq, int shards, int timeout_ms) {
    if (!sq || sq->size <= 1) {
        m->sq = NULL;
        m->sq_size = m->sq_shards = 1;
        m->sq_rank = 0;
        return 0;
    }
    if (shards < 1 || sq->size % shards)
        return co_err_set(CO_EINVAL, "moe: %d row shards in a token group of %d ranks", shards, sq->size);
    /* (an expert capacity then counts this rank's tokens, as Megatron's token dropping over
     * the rank's routing map: capacity_of over moe_forward's N) */
    size_t n = (size_t)m->maxN * (size_t)sq->size * (size_t)m->E;
    int32_t *cnt = realloc(m->auxcnt, sizeof(int32_t) * n);
    if (!cnt) return co_err_set(CO_ENOMEM, "moe: the aux counts of the sequence group");
    m->auxcnt = cnt;
    int64_t *c64 = realloc(m->sq_cnt, sizeof(int64_t) * n);
    if (!c64) return co_err_set(CO_ENOMEM, "moe: the aux counts of the sequence group");
    m->sq_cnt = c64;
    m->sq = sq;
    m->sq_size = sq->size;
    m->sq_shards = shards;
    m->sq_rank = sq->rank;
    m->sq_timeout = timeout_ms;
    m->have_fwd = false;
    return 0;
}

/* ---- forward ---- */

/* The router's product in fp32 under --bf16 and --fp16 as well (Megatron's
 * --moe-router-dtype fp32: routing decisions from 16-bit logits flip with rounding): the
 * backend's 16-bit mode is off for the call. forward: logits = x Wr^T; backward (dlogits
 * given): dx, dWr. */
static void router_linear(moe_layer *m, const float *x, const float *Wr, float *dx, float *dWr, int N) {
    kb_backend *be = m->be;
    bool bf16 = be->opt.bf16, fp16 = be->opt.fp16;
    be->opt.bf16 = be->opt.fp16 = false;
    if (!dWr) m->o->linear_forward(be, m->logits, x, Wr, NULL, NULL, N, m->h, m->E);
    else m->o->linear_backward(be, dx, dWr, NULL, m->dlogits, x, Wr, NULL, N, m->h, m->E);
    be->opt.bf16 = bf16;
    be->opt.fp16 = fp16;
}

/* Local expert j's 16-bit weight copy of matrix `which` (fc1: [rows,h], fc2: [h,rows]), or
 * NULL without copies (moe_set_params16). With copies the experts run one product per expert
 * (the grouped call has no copies to take; in 16-bit mode it is one product per group too). */
#define W16_OF(m, which, j, rows) ((m)->p16 ? (m)->p16 + (m)->off.which + (size_t)(j) * (size_t)(rows) * (size_t)(m)->h : NULL)

void moe__experts_forward(moe_layer *m, const float *params, const float *xin, float *h1, float *act, float *out,
                          const int32_t *off, int n) {
    const kb_ops *o = m->o;
    kb_backend *be = m->be;
    int h = m->h, F = m->F, F1 = m->F1;
    if (m->c.grouped_gemm && o->grouped_linear_forward && !m->p16) {
        /* one grouped product per matrix, the activation over every row at once */
        int r0 = off[0], rows = off[n] - off[0];
        if (rows <= 0) return;
        o->grouped_linear_forward(be, h1, xin, params + m->off.fc1, off, n, h, F1);
        if (m->c.swiglu) o->swiglu_forward(be, act + (size_t)r0 * F, h1 + (size_t)r0 * F1, rows, F);
        else o->gelu_forward(be, act + (size_t)r0 * F, h1 + (size_t)r0 * F1, (size_t)rows * F);
        o->grouped_linear_forward(be, out, act, params + m->off.fc2, off, n, F, h);
        return;
    }
    for (int j = 0; j < n; j++) {
        int r0 = off[j], cnt = off[j + 1] - off[j];
        if (!cnt) continue;
        const float *W1 = params + m->off.fc1 + (size_t)j * F1 * h, *W2 = params + m->off.fc2 + (size_t)j * h * F;
        float *h1j = h1 + (size_t)r0 * F1, *actj = act + (size_t)r0 * F;
        o->linear_forward(be, h1j, xin + (size_t)r0 * h, W1, W16_OF(m, fc1, j, F1), NULL, cnt, h, F1);
        if (m->c.swiglu) o->swiglu_forward(be, actj, h1j, cnt, F);
        else o->gelu_forward(be, actj, h1j, (size_t)cnt * F);
        o->linear_forward(be, out + (size_t)r0 * h, actj, W2, W16_OF(m, fc2, j, F), NULL, cnt, F, h);
    }
}

void moe__experts_backward(moe_layer *m, const float *params, float *dparams, const float *dout, const float *xin,
                           const float *h1, const float *act, float *dact, float *dh1, float *dxin,
                           const int32_t *off, int n) {
    const kb_ops *o = m->o;
    kb_backend *be = m->be;
    int h = m->h, F = m->F, F1 = m->F1;
    if (m->c.grouped_gemm && o->grouped_linear_backward && !m->p16) {
        int r0 = off[0], rows = off[n] - off[0];
        if (rows <= 0) return;
        o->grouped_linear_backward(be, dact, dparams + m->off.fc2, dout, act, params + m->off.fc2, off, n, F, h);
        if (m->c.swiglu)
            o->swiglu_backward(be, dh1 + (size_t)r0 * F1, dact + (size_t)r0 * F, h1 + (size_t)r0 * F1, rows, F);
        else
            o->gelu_backward(be, dh1 + (size_t)r0 * F1, dact + (size_t)r0 * F, h1 + (size_t)r0 * F1,
                             (size_t)rows * F);
        o->grouped_linear_backward(be, dxin, dparams + m->off.fc1, dh1, xin, params + m->off.fc1, off, n, h, F1);
        return;
    }
    for (int j = 0; j < n; j++) {
        int r0 = off[j], cnt = off[j + 1] - off[j];
        if (!cnt) continue;
        const float *W1 = params + m->off.fc1 + (size_t)j * F1 * h, *W2 = params + m->off.fc2 + (size_t)j * h * F;
        float *dW1 = dparams + m->off.fc1 + (size_t)j * F1 * h, *dW2 = dparams + m->off.fc2 + (size_t)j * h * F;
        float *dactj = dact + (size_t)r0 * F, *dh1j = dh1 + (size_t)r0 * F1;
        o->linear_backward(be, dactj, dW2, NULL, dout + (size_t)r0 * h, act + (size_t)r0 * F, W2, W16_OF(m, fc2, j, F),
                           cnt, F, h);
        if (m->c.swiglu) o->swiglu_backward(be, dh1j, dactj, h1 + (size_t)r0 * F1, cnt, F);
        else o->gelu_backward(be, dh1j, dactj, h1 + (size_t)r0 * F1, (size_t)cnt * F);
        o->linear_backward(be, dxin + (size_t)r0 * h, dW1, NULL, dh1j, xin + (size_t)r0 * h, W1, W16_OF(m, fc1, j, F1),
                           cnt, h, F1);
    }
}

/* the shared expert's 16-bit weights (moe_set_params16), or NULL */
#define P16_AT(m, which) ((m)->p16 && (m)->Fs ? (m)->p16 + (m)->off.which : NULL)

/* The layer's input in fp32: x itself, or (bf16 input, moe_set_input16) x widened into x32. */
static const float *input32(moe_layer *m, const float *x, int N) {
    if (!m->x16) return x;
    m->o->gather_rows_bf16(m->be, m->x32, (const kb_bf16 *)(const void *)x, NULL, N, m->h);
    return m->x32;
}

/* The permutation's tables from m->map and m->probs: the expert-major rows (row_tok, row_exp,
 * rw; eoff, tpe) and each token's rows in expert order (toff, trow, tw), copied into backend
 * memory in order with the queued work. Returns M. */
static int permute_tables(moe_layer *m) {
    int N = m->N, E = m->E, M = 0;
    memset(m->toff, 0, sizeof(int32_t) * ((size_t)N + 1));
    for (int e = 0; e < E; e++) {
        m->eoff[e] = M;
        for (int n = 0; n < N; n++)
            if (m->map[(size_t)n * E + e]) {
                m->row_tok[M] = n;
                m->row_exp[M] = e;
                m->rw[M] = m->probs[(size_t)n * E + e];
                m->toff[n + 1]++;
                M++;
            }
        m->tpe[e] = M - m->eoff[e];
    }
    m->eoff[E] = M;
    m->M = M;
    for (int n = 0; n < N; n++) m->toff[n + 1] += m->toff[n];
    /* rows ascend by expert, so each token's rows fill in expert order */
    int32_t *at = m->trow; /* (a cursor per token, kept in cand's room: maxN entries) */
    int32_t *cur = (int32_t *)(void *)m->cand;
    for (int n = 0; n < N; n++) cur[n] = m->toff[n];
    for (int r = 0; r < M; r++) {
        int j = cur[m->row_tok[r]]++;
        at[j] = r;
        m->tw[j] = m->rw[r];
    }
    const kb_ops *o = m->o;
    kb_backend *be = m->be;
    size_t i4 = sizeof(int32_t), f4 = sizeof(float);
    o->copy(be, m->d_toff, m->toff, i4 * ((size_t)N + 1));
    if (M) {
        o->copy(be, m->d_rowtok, m->row_tok, i4 * (size_t)M);
        o->copy(be, m->d_trow, m->trow, i4 * (size_t)M);
        o->copy(be, m->d_tw, m->tw, f4 * (size_t)M);
        o->copy(be, m->d_rw, m->rw, f4 * (size_t)M);
    }
    return M;
}

int moe_forward(moe_layer *m, float *y, const float *x, const float *params, const float *expert_bias, int B,
                int T) {
    const moe_config *c = &m->c;
    const kb_ops *o = m->o;
    kb_backend *be = m->be;
    int N = B * T / m->sq_shards, E = m->E, k = m->k, h = m->h;
    m->have_fwd = false;
    if (B <= 0 || T <= 0 || N > m->maxN || (B * T) % m->sq_shards)
        return co_err_set(CO_EINVAL, "moe_forward: %d x %d tokens over %d sequence-parallel ranks (the layer holds at "
                                     "most %d per rank)", B, T, m->sq_shards, m->maxN);
    if (c->etp_size > 1 && !m->ep.c)
        return co_err_set(CO_EINVAL, "moe_forward: the experts are split over %d expert-tensor-parallel ranks and "
                                     "the expert-tensor group is not set (moe_set_expert_group)", c->etp_size);
    m->N = N;
    m->B = B;
    m->T = T;
    m->masked = m->pad_rows != NULL;
    if (m->masked) {
        int rc = pad_counts(m);
        if (rc) return rc;
    }
    /* (padding rows: the capacity of this rank's real rows, Megatron's with its padding mask) */
    m->cap = capacity_of(c, m->masked ? m->nvalid : N);
    const float *xf = input32(m, x, N);
    router_linear(m, xf, params + m->off.router, NULL, NULL, N);
    o->sync(be);
    if (be->status) return be->status;

    /* routing */
    size_t NE = (size_t)N * E;
    memset(m->rprobs, 0, sizeof(float) * NE);
    memset(m->map0, 0, NE);
    double z = 0, pk[k];
    bool sk = c->lb == MOE_LB_SINKHORN;
    if (sk && m->train) sinkhorn(m);
    for (int n = 0; n < N; n++) {
        double *sm = m->gs;
        if (m->masked && m->pad[n]) { /* a padding row: no expert, no z */
            m->lse[n] = 0;
            continue;
        }
        m->lse[n] = row_softmax(m->logits + (size_t)n * E, E, sm);
        z += m->lse[n] * m->lse[n];
        if (sk) route_sinkhorn(m, n, pk);
        else route_token(m, n, c->expert_bias ? expert_bias : NULL, pk);
        for (int j = 0; j < k; j++) {
            int e = m->sel[(size_t)n * k + j];
            double p = c->scaling_factor > 0 ? (float)pk[j] * (double)c->scaling_factor : pk[j];
            m->rprobs[(size_t)n * E + e] = (float)p;
            m->map0[(size_t)n * E + e] = 1;
        }
    }
    /* (Megatron's apply_z_loss: the coefficient over the sequence group's size) */
    if (m->masked) /* the mean over the group's real tokens */
        m->z = c->z_coeff > 0 && m->vtot > 0 ? c->z_coeff * z / (double)m->vtot : 0.0;
    else
        m->z = c->z_coeff > 0 ? c->z_coeff / m->sq_size * z / N : 0.0;
    apply_capacity(m);
    int rc = aux_losses(m);
    if (rc) return rc;

    /* permute: rows by expert, then token (the tables on the host, the rows on the backend) */
    int M = permute_tables(m);
    o->gather_rows(be, m->xp, xf, m->d_rowtok, M, h);
    bool gathered = m->ep.c && m->ep.disp == MOE_DISPATCH_ALLGATHER;
    if (m->ep.c) {
        /* the experts of the group: m->out rows back in m->xp's order (alltoall) or the
         * experts' sum straight into y (allgather) */
        rc = moe__ep_forward(m, params, xf, y);
        if (rc) return rc;
    } else {
        moe__experts_forward(m, params, m->xp, m->h1, m->act, m->out, m->eoff, E);
    }
    if (m->Fs) {
        o->linear_forward(be, m->s_h1, xf, params + m->off.shared_fc1, P16_AT(m, shared_fc1), NULL, N, h, m->Fs1);
        if (c->swiglu) o->swiglu_forward(be, m->s_act, m->s_h1, N, m->Fs);
        else o->gelu_forward(be, m->s_act, m->s_h1, (size_t)N * m->Fs);
        o->linear_forward(be, m->tmp, m->s_act, params + m->off.shared_fc2, P16_AT(m, shared_fc2), NULL, N, m->Fs, h);
    }
    /* combine: each token's rows in expert order, weighted by their probabilities (queued:
     * no wait; the caller's next operations are ordered after it) */
    if (!gathered) o->combine_rows(be, y, m->out, m->d_toff, m->d_trow, m->d_tw, N, h, false);
    if (m->Fs) o->add(be, y, y, m->tmp, (size_t)N * h);
    if (be->status) return be->status;
    m->have_fwd = true;
    return 0;
}

/* ---- backward ---- */

/* dl[E] of token n: the routing probs' gradient through the score function, the aux and
 * z losses' */
static void router_backward_token(moe_layer *m, int n, double ls, double *dl) {
    const moe_config *c = &m->c;
    int E = m->E, k = m->k;
    const float *l = m->logits + (size_t)n * E;
    const int32_t *sel = m->sel + (size_t)n * k;
    double *sm = m->gs;
    double pk[k], dp[k];
    for (int e = 0; e < E; e++) dl[e] = 0;
    /* the selected probabilities' gradient: kept (n,e) only, times the scaling factor */
    double scale = c->scaling_factor > 0 ? c->scaling_factor : 1.0;
    for (int j = 0; j < k; j++) {
        size_t i = (size_t)n * E + sel[j];
        dp[j] = m->map[i] ? m->dprob[i] * scale : 0.0;
    }
    if (c->lb == MOE_LB_SINKHORN && k == 1) {
        /* probs = sigmoid(l)[sel] */
        double s = sigmoid(l[sel[0]]);
        dl[sel[0]] += dp[0] * s * (1.0 - s);
    } else if (c->score == MOE_SCORE_SOFTMAX || c->lb == MOE_LB_SINKHORN) {
        if (c->pre_softmax || c->lb == MOE_LB_SINKHORN) {
            /* probs = s[sel], s = softmax(l): dl = s * (ds - sum s ds) */
            row_softmax(l, E, sm);
            double dot = 0;
            for (int j = 0; j < k; j++) dot += sm[sel[j]] * dp[j];
            for (int e = 0; e < E; e++) dl[e] -= sm[e] * dot;
            for (int j = 0; j < k; j++) dl[sel[j]] += sm[sel[j]] * dp[j];
        } else {
            double mx = l[sel[0]], s = 0, dot = 0;
            for (int j = 1; j < k; j++) mx = l[sel[j]] > mx ? l[sel[j]] : mx;
            for (int j = 0; j < k; j++) s += (pk[j] = exp((double)l[sel[j]] - mx));
            for (int j = 0; j < k; j++) dot += (pk[j] /= s) * dp[j];
            for (int j = 0; j < k; j++) dl[sel[j]] += pk[j] * (dp[j] - dot);
        }
    } else {
        double s = 0, ds[k];
        for (int j = 0; j < k; j++) s += (pk[j] = sigmoid(l[sel[j]]));
        if (k > 1) {
            /* p_j = s_j / D, D = sum s + 1e-20: ds_j = dp_j / D - sum_i dp_i s_i / D^2 */
            double D = s + 1e-20, dot = 0;
            for (int j = 0; j < k; j++) dot += dp[j] * pk[j];
            for (int j = 0; j < k; j++) ds[j] = dp[j] / D - dot / (D * D);
        } else {
            ds[0] = dp[0];
        }
        for (int j = 0; j < k; j++) dl[sel[j]] += ds[j] * pk[j] * (1.0 - pk[j]);
    }
    if (c->lb != MOE_LB_NONE && c->lb != MOE_LB_SINKHORN && c->aux_coeff > 0) {
        /* d aux / d a[n,e] = coeff / nseq * E/(k per^2) * count[seq(n), e] (global: the
         * running mean count over T^2) */
        int nseq, per, rows, n0;
        aux_shape(m, &nseq, &per, &rows, &n0);
        double *ga = m->rs;
        if (c->lb == MOE_LB_GLOBAL_AUX) {
            double T = m->gT;
            double w = T > 0 ? ls * c->aux_coeff * E / ((double)k * T * T) : 0.0;
            for (int e = 0; e < E; e++) ga[e] = w * m->gavg[e];
        } else {
            int b = (n0 + n) / rows;
            double pb = m->masked ? (double)m->vseq[b] : per; /* (the sequence's real tokens) */
            double w = pb > 0 ? ls * c->aux_coeff / nseq * E / ((double)k * pb * pb) : 0.0;
            const int32_t *cnt = m->auxcnt + (size_t)b * E;
            for (int e = 0; e < E; e++) ga[e] = w * cnt[e];
        }
        if (c->score == MOE_SCORE_SOFTMAX) {
            row_softmax(l, E, sm);
            double dot = 0;
            for (int e = 0; e < E; e++) dot += sm[e] * ga[e];
            for (int e = 0; e < E; e++) dl[e] += sm[e] * (ga[e] - dot);
        } else {
            double s = 0, dot = 0;
            for (int e = 0; e < E; e++) s += (sm[e] = sigmoid(l[e]));
            double D = s + 1e-20;
            for (int e = 0; e < E; e++) dot += ga[e] * sm[e];
            for (int e = 0; e < E; e++) dl[e] += (ga[e] / D - dot / (D * D)) * sm[e] * (1.0 - sm[e]);
        }
    }
    if (c->z_coeff > 0) {
        /* d z / d l[n,e] = coeff/(s N) * 2 lse[n] * softmax[n,e] */
        row_softmax(l, E, sm);
        double w = m->masked ? ls * c->z_coeff / (double)m->vtot * 2.0 * m->lse[n]
                             : ls * c->z_coeff / m->sq_size / m->N * 2.0 * m->lse[n];
        for (int e = 0; e < E; e++) dl[e] += w * sm[e];
    }
}

int moe_backward(moe_layer *m, float *dx, float *dparams, const float *dy, const float *x, const float *params,
                 float loss_scale) {
    const moe_config *c = &m->c;
    const kb_ops *o = m->o;
    kb_backend *be = m->be;
    if (!m->have_fwd) return co_err_set(CO_EINVAL, "moe_backward: no forward to go back through");
    int N = m->N, E = m->E, h = m->h, M = m->M;
    size_t NE = (size_t)N * E;
    bool gathered = m->ep.c && m->ep.disp == MOE_DISPATCH_ALLGATHER;
    /* the routed rows: dout = prob * dy, dprob = dy . out, on the backend (allgather: the
     * experts' owners compute both, moe__ep_backward) */
    for (size_t i = 0; i < NE; i++) m->dprob[i] = 0;
    if (!gathered && M) o->combine_backward(be, m->dout, m->d_dw, dy, m->out, m->d_rowtok, m->d_rw, M, h);
    /* the experts: m->dxp rows in m->xp's order (alltoall), or their sum per token into
     * m->tmp (allgather) */
    if (m->ep.c) {
        int rc = moe__ep_backward(m, params, dparams, dy, m->tmp);
        if (rc) return rc;
    }
    /* the rows' probability gradients read by the host, for the router's backward there (the
     * one wait of the backward without an expert group; with one, its exchanges have waited
     * after the last queued work already) */
    if (!m->ep.c) o->sync(be);
    if (be->status) return be->status;
    for (int r = 0; r < M && !gathered; r++) m->dprob[(size_t)m->row_tok[r] * E + m->row_exp[r]] = m->d_dw[r];
    /* the router's logits gradient (host), before any more backend work is queued */
    double dl[E];
    for (int n = 0; n < N; n++) {
        if (m->masked && m->pad[n]) memset(dl, 0, sizeof dl); /* (a padding row: no gradient) */
        else router_backward_token(m, n, loss_scale, dl);
        for (int e = 0; e < E; e++) m->dlogits[(size_t)n * E + e] = (float)dl[e];
    }
    if (!m->ep.c)
        moe__experts_backward(m, params, dparams, m->dout, m->xp, m->h1, m->act, m->dact, m->dh1, m->dxp, m->eoff, E);
    const float *xf = input32(m, x, N); /* (bf16 input: widened again) */
    router_linear(m, xf, params + m->off.router, dx, dparams + m->off.router, N);
    if (gathered) o->add(be, dx, dx, m->tmp, (size_t)N * h);
    if (m->Fs) {
        int Fs = m->Fs, Fs1 = m->Fs1;
        o->linear_backward(be, m->s_dact, dparams + m->off.shared_fc2, NULL, dy, m->s_act, params + m->off.shared_fc2,
                           P16_AT(m, shared_fc2), N, Fs, h);
        if (c->swiglu) o->swiglu_backward(be, m->s_dh1, m->s_dact, m->s_h1, N, Fs);
        else o->gelu_backward(be, m->s_dh1, m->s_dact, m->s_h1, (size_t)N * Fs);
        o->linear_backward(be, m->tmp, dparams + m->off.shared_fc1, NULL, m->s_dh1, xf, params + m->off.shared_fc1,
                           P16_AT(m, shared_fc1), N, h, Fs1);
        o->add(be, dx, dx, m->tmp, (size_t)N * h);
    }
    /* the experts' input gradients added into each token's, its rows in forward's order */
    if (!gathered && M) o->combine_rows(be, dx, m->dxp, m->d_toff, m->d_trow, NULL, N, h, true);
    return be->status;
}
