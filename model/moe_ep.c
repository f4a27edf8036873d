/* moe_ep.c - expert parallelism for the MoE layer (moe.h, "expert parallelism"): the
 * experts of a layer split over an expert group, tokens dispatched to their experts' ranks
 * and the outputs combined back, with Megatron's two dispatchers.
 *
 * alltoall (Megatron's MoEAlltoAllTokenDispatcher), forward:
 *   counts: rank p receives, per (source s, local expert j), how many rows s sends   all-to-all
 *   rows:   m->xp (rows by expert, so by owner rank) go to the owners, arriving
 *           source-major [s][j][token]; sorted expert-major [j][s][token] (perm, on the
 *           backend: gather_rows; the outputs back through its inverse)              all-to-all
 *   experts on the expert-major rows (moe__experts_forward)
 *   outputs back to source-major, and home into m->out in m->xp's order             all-to-all
 * backward: m->dout the same way out, the experts' backward (weight gradients stay here),
 *   input gradients home into m->dxp.
 * allgather (MoEAllGatherTokenDispatcher), forward: x, the probabilities and the routing
 *   map of the group's tokens gathered [s][token]; each local expert's rows in gathered
 *   token order (gather_rows); y's expert part as every rank's partial sum (combine_rows,
 *   each gathered token's rows in expert order), reduce-scattered to the
 *   tokens' owners. backward: dy gathered; dout = prob * dy and dprob = dy . out for the
 *   local experts' rows; dx's expert part and dprob reduce-scattered back.
 * Experts split over an expert-tensor group (moe_config.etp_size t > 1): the group is the
 *   expert-tensor x expert group (member g = expert rank g / t); alltoall sends a rank's rows
 *   for expert rank q to each of q's t members (ep->dup), each computes its slice's partial
 *   output, and the t partials of a row come home and are summed in member order (Megatron's
 *   all-to-all, all-gather over the expert-tensor group, reduce-scatter back, all-to-all
 *   back); allgather gathers over the whole group and its reduce-scatters sum the partials.
 * Every exchange has the layer's timeout and returns the communicator's error with the step
 * named. Orders are fixed (expert, then source rank, then token), so results are bitwise
 * reproducible for a given group size. */
#include "model/moe_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void ep_bufs_free(moe_layer *m) {
    moe__ep *ep = &m->ep;
    float **b[] = {&ep->xs, &ep->xr, &ep->h1, &ep->act, &ep->out, &ep->dact, &ep->dh1, &ep->dx};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        if (*b[i]) m->o->free(m->be, *b[i]);
        *b[i] = NULL;
    }
    void *dev[] = {ep->d_perm, ep->d_inv, ep->d_grow, ep->d_gw, ep->d_rw, ep->d_dw};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) m->o->free(m->be, dev[i]);
    ep->d_perm = ep->d_inv = ep->d_grow = NULL;
    ep->d_gw = ep->d_rw = NULL;
    ep->d_dw = NULL;
    free(ep->perm);
    free(ep->rtok);
    free(ep->grow);
    free(ep->gw);
    ep->perm = ep->rtok = ep->grow = NULL;
    ep->gw = NULL;
    ep->cap = 0;
}

void moe__ep_free(moe_layer *m) {
    moe__ep *ep = &m->ep;
    ep_bufs_free(m);
    float **g[] = {&ep->xg, &ep->pg, &ep->yg, &ep->dup, &ep->home};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        if (*g[i]) m->o->free(m->be, *g[i]);
        *g[i] = NULL;
    }
    if (ep->d_goff) m->o->free(m->be, ep->d_goff);
    ep->d_goff = NULL;
    free(ep->goff);
    ep->goff = NULL;
    free(ep->mg);
    free(ep->dpg);
    free(ep->roff);
    free(ep->scnt);
    free(ep->rcnt);
    free(ep->sbytes);
    free(ep->rbytes);
    ep->mg = NULL;
    ep->dpg = NULL;
    ep->roff = ep->scnt = ep->rcnt = NULL;
    ep->sbytes = ep->rbytes = NULL;
    ep->c = NULL;
}

/* the expert side's buffers for at least R rows */
static int ep_reserve(moe_layer *m, size_t R) {
    moe__ep *ep = &m->ep;
    if (R <= ep->cap && ep->xs) return 0;
    size_t cap = R > ep->cap + ep->cap / 2 ? R : ep->cap + ep->cap / 2;
    if (cap < 16) cap = 16;
    ep_bufs_free(m);
    size_t h = (size_t)m->h, F = (size_t)m->F, F1 = (size_t)m->F1;
    struct {
        float **p;
        size_t n;
    } b[] = {{&ep->xs, h}, {&ep->xr, h}, {&ep->h1, F1}, {&ep->act, F},
             {&ep->out, h}, {&ep->dact, F}, {&ep->dh1, F1}, {&ep->dx, h}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        *b[i].p = m->o->alloc(m->be, sizeof(float) * cap * b[i].n);
        if (!*b[i].p) {
            ep_bufs_free(m);
            return co_err_set(CO_ENOMEM, "moe: expert parallelism: %zu rows of the experts' activations", cap);
        }
    }
    ep->perm = malloc(sizeof(int32_t) * cap);
    ep->rtok = malloc(sizeof(int32_t) * cap);
    ep->grow = malloc(sizeof(int32_t) * cap);
    ep->gw = malloc(sizeof(float) * 2 * cap);
    ep->d_perm = m->o->alloc(m->be, sizeof(int32_t) * cap);
    ep->d_inv = m->o->alloc(m->be, sizeof(int32_t) * cap);
    ep->d_grow = m->o->alloc(m->be, sizeof(int32_t) * cap);
    ep->d_gw = m->o->alloc(m->be, sizeof(float) * cap);
    ep->d_rw = m->o->alloc(m->be, sizeof(float) * cap);
    ep->d_dw = m->o->alloc(m->be, sizeof(double) * cap);
    if (!ep->perm || !ep->rtok || !ep->grow || !ep->gw || !ep->d_perm || !ep->d_inv || !ep->d_grow ||
        !ep->d_gw || !ep->d_rw || !ep->d_dw) {
        ep_bufs_free(m);
        return co_err_set(CO_ENOMEM, "moe: expert parallelism: the row tables");
    }
    ep->cap = cap;
    return 0;
}

int moe_set_expert_group(moe_layer *m, cm_comm *c, moe_dispatcher d, int timeout_ms) {
    moe__ep_free(m);
    m->have_fwd = false; /* (the last forward's rows went with the buffers) */
    m->ep.El = m->E;
    m->ep.e0 = 0;
    int P = c ? c->size : 1;
    int t = m->c.etp_size > 1 ? m->c.etp_size : 1;
    int want = (m->c.ep_size > 1 ? m->c.ep_size : 1) * t;
    if (P != want)
        return co_err_set(CO_EINVAL, "moe: an expert group of %d ranks for a layer laid out for %d expert x %d "
                                     "expert-tensor-parallel ranks", P, want / t, t);
    if (d != MOE_DISPATCH_ALLTOALL && d != MOE_DISPATCH_ALLGATHER)
        return co_err_set(CO_EINVAL, "moe: unknown token dispatcher %d", (int)d);
    if (P == 1) return 0;
    moe__ep *ep = &m->ep;
    ep->size = P;
    ep->rank = c->rank;
    ep->etp = t;
    ep->El = m->E / (P / t);
    ep->e0 = c->rank / t * ep->El;
    ep->disp = d;
    ep->timeout_ms = timeout_ms;
    ep->roff = malloc(sizeof(int32_t) * ((size_t)ep->El + 1));
    ep->scnt = malloc(sizeof(int32_t) * (size_t)P * ep->El);
    ep->rcnt = malloc(sizeof(int32_t) * (size_t)P * ep->El);
    ep->sbytes = malloc(sizeof(size_t) * (size_t)P);
    ep->rbytes = malloc(sizeof(size_t) * (size_t)P);
    int rc = 0;
    if (!ep->roff || !ep->scnt || !ep->rcnt || !ep->sbytes || !ep->rbytes)
        rc = co_err_set(CO_ENOMEM, "moe: expert parallelism: the count tables");
    if (!rc && d == MOE_DISPATCH_ALLGATHER) {
        size_t G = (size_t)P * m->maxN, E = (size_t)m->E, h = (size_t)m->h;
        ep->xg = m->o->alloc(m->be, sizeof(float) * G * h);
        ep->yg = m->o->alloc(m->be, sizeof(float) * G * h);
        ep->pg = m->o->alloc(m->be, sizeof(float) * G * E);
        ep->mg = malloc(G * E);
        ep->dpg = malloc(sizeof(double) * G * E);
        ep->goff = malloc(sizeof(int32_t) * (2 * G + 1));
        ep->d_goff = m->o->alloc(m->be, sizeof(int32_t) * (G + 1));
        if (!ep->xg || !ep->yg || !ep->pg || !ep->mg || !ep->dpg || !ep->goff || !ep->d_goff)
            rc = co_err_set(CO_ENOMEM, "moe: the allgather dispatcher's %zu gathered tokens", G);
    }
    if (!rc && d == MOE_DISPATCH_ALLTOALL && t > 1) {
        size_t n = sizeof(float) * (size_t)m->maxM * (size_t)t * (size_t)m->h;
        ep->dup = m->o->alloc(m->be, n);
        ep->home = m->o->alloc(m->be, n);
        if (!ep->dup || !ep->home)
            rc = co_err_set(CO_ENOMEM, "moe: the %d expert-tensor ranks' copies of %d rows", t, m->maxM);
    }
    if (rc) {
        moe__ep_free(m);
        m->ep.El = m->E;
        m->ep.e0 = 0;
        return rc;
    }
    ep->c = c;
    return 0;
}

uint64_t moe_ep_bytes_sent(const moe_layer *m) { return m->ep.bytes_out; }
double moe_ep_dispatch_seconds(const moe_layer *m) { return m->ep.dispatch_s; }

static int ep_err(int rc, const char *step) {
    if (!rc) return 0;
    return co_err_set(rc, "moe: expert parallelism: %s: %s", step, co_err_detail());
}

static uint64_t sent(const moe__ep *ep, const size_t *bytes) {
    uint64_t s = 0;
    for (int p = 0; p < ep->size; p++)
        if (p != ep->rank) s += bytes[p];
    return s;
}

/* Queued after the experts, before the one wait the exchange back needs: the expert-major
 * rows back to source-major order in ep->xs (alltoall), or each gathered token's sum of its
 * rows here in ep->yg, weighted by the probabilities in forward (allgather). */
static void rows_for_exchange(moe_layer *m, const float *rows, bool fwd) {
    moe__ep *ep = &m->ep;
    if (ep->disp == MOE_DISPATCH_ALLTOALL)
        m->o->gather_rows(m->be, ep->xs, rows, ep->d_inv, (int)ep->R, m->h);
    else
        m->o->combine_rows(m->be, ep->yg, rows, ep->d_goff, ep->d_grow, fwd ? ep->d_gw : NULL, ep->size * m->N,
                           m->h, false);
}

/* The local experts over the rows gathered in ep->xr (ep->roff): forward into ep->out, or
 * backward from doutr into ep->dx and dparams, then rows_for_exchange and one wait. Their
 * time is not dispatch's. */
static int experts_forward(moe_layer *m, const float *params) {
    moe__ep *ep = &m->ep;
    double te = now_s();
    moe__experts_forward(m, params, ep->xr, ep->h1, ep->act, ep->out, ep->roff, ep->El);
    rows_for_exchange(m, ep->out, true);
    m->o->sync(m->be);
    ep->dispatch_s -= now_s() - te;
    return m->be->status;
}

static int experts_backward(moe_layer *m, const float *params, float *dparams, const float *doutr) {
    moe__ep *ep = &m->ep;
    double te = now_s();
    moe__experts_backward(m, params, dparams, doutr, ep->xr, ep->h1, ep->act, ep->dact, ep->dh1, ep->dx, ep->roff,
                          ep->El);
    rows_for_exchange(m, ep->dx, false);
    m->o->sync(m->be);
    ep->dispatch_s -= now_s() - te;
    return m->be->status;
}

/* ---- alltoall ---- */

/* With experts split over etp > 1 ranks: the rows of src (m->xp's order: by expert, so by
 * expert rank q) once for every member p of the group, block p the rows of q = p / etp, into
 * ep->dup, what the all-to-all sends. At etp 1: src itself. */
static const float *a2a_send_rows(moe_layer *m, const float *src) {
    moe__ep *ep = &m->ep;
    if (ep->etp == 1) return src;
    size_t h = (size_t)m->h, at = 0;
    for (int p = 0; p < ep->size; p++) {
        int q = p / ep->etp;
        size_t r0 = (size_t)m->eoff[q * ep->El], n = (size_t)m->eoff[(q + 1) * ep->El] - r0;
        memcpy(ep->dup + at * h, src + r0 * h, sizeof(float) * n * h);
        at += n;
    }
    return ep->dup;
}

/* The owner's rows (expert-major, ep->R of them), put back in their source ranks' order in
 * ep->xs by rows_for_exchange, home by the all-to-all into dst; with etp > 1 each row comes
 * home from every member of its expert rank (partial sums over their slices), summed in
 * member order into dst. Nothing is queued after it: the caller may read what it wrote. */
static int a2a_home(moe_layer *m, float *dst, const char *step) {
    moe__ep *ep = &m->ep;
    size_t h = (size_t)m->h;
    float *recv = ep->etp > 1 ? ep->home : dst;
    int rc = ep->c->ops->alltoallv(ep->c, ep->xs, ep->rbytes, recv, ep->sbytes, ep->timeout_ms);
    if (rc) return ep_err(rc, step);
    ep->bytes_out += sent(ep, ep->rbytes);
    if (ep->etp == 1) return 0;
    size_t at = 0;
    for (int q = 0; q < ep->size / ep->etp; q++) {
        size_t r0 = (size_t)m->eoff[q * ep->El], n = ((size_t)m->eoff[(q + 1) * ep->El] - r0) * h;
        float *d = dst + r0 * h;
        memcpy(d, recv + at, sizeof(float) * n);
        at += n;
        for (int i = 1; i < ep->etp; i++, at += n)
            for (size_t k = 0; k < n; k++) d[k] += recv[at + k];
    }
    return 0;
}

static int a2a_forward(moe_layer *m, const float *params) {
    moe__ep *ep = &m->ep;
    int P = ep->size, El = ep->El;
    size_t row = sizeof(float) * (size_t)m->h;
    /* the counts: block p = this rank's rows for p's experts (those of its expert rank) */
    size_t cb[P];
    for (int p = 0; p < P; p++) cb[p] = sizeof(int32_t) * (size_t)El;
    for (int p = 0; p < P; p++) memcpy(ep->scnt + p * El, m->tpe + p / ep->etp * El, sizeof(int32_t) * (size_t)El);
    int rc = ep->c->ops->alltoallv(ep->c, ep->scnt, cb, ep->rcnt, cb, ep->timeout_ms);
    if (rc) return ep_err(rc, "the all-to-all of the token counts");
    ep->bytes_out += sent(ep, cb);
    size_t R = 0;
    for (int p = 0; p < P; p++) {
        size_t s = 0, r = 0;
        for (int j = 0; j < El; j++) {
            s += (size_t)ep->scnt[p * El + j];
            r += (size_t)ep->rcnt[p * El + j];
        }
        ep->sbytes[p] = s * row;
        ep->rbytes[p] = r * row;
        R += r;
    }
    if ((rc = ep_reserve(m, R))) return rc;
    ep->R = R;
    m->o->sync(m->be);
    rc = ep->c->ops->alltoallv(ep->c, a2a_send_rows(m, m->xp), ep->sbytes, ep->xs, ep->rbytes, ep->timeout_ms);
    if (rc) return ep_err(rc, "the all-to-all of the tokens to their experts");
    ep->bytes_out += sent(ep, ep->sbytes);
    /* source-major [s][j] -> expert-major [j][s] */
    size_t srow[P + 1];
    srow[0] = 0;
    for (int s = 0; s < P; s++) srow[s + 1] = srow[s] + ep->rbytes[s] / row;
    size_t r = 0;
    int32_t *inv = ep->rtok; /* (unused by alltoall: the inverse permutation's room) */
    for (int j = 0; j < El; j++) {
        ep->roff[j] = (int32_t)r;
        for (int s = 0; s < P; s++) {
            size_t first = srow[s];
            for (int q = 0; q < j; q++) first += (size_t)ep->rcnt[s * El + q];
            for (int i = 0; i < ep->rcnt[s * El + j]; i++, r++) {
                ep->perm[r] = (int32_t)(first + (size_t)i);
                inv[first + (size_t)i] = (int32_t)r;
            }
        }
    }
    ep->roff[El] = (int32_t)r;
    if (R) {
        m->o->copy(m->be, ep->d_perm, ep->perm, sizeof(int32_t) * R);
        m->o->copy(m->be, ep->d_inv, inv, sizeof(int32_t) * R);
    }
    m->o->gather_rows(m->be, ep->xr, ep->xs, ep->d_perm, (int)R, m->h);
    if ((rc = experts_forward(m, params))) return rc;
    return a2a_home(m, m->out, "the all-to-all of the experts' outputs back");
}

static int a2a_backward(moe_layer *m, const float *params, float *dparams) {
    moe__ep *ep = &m->ep;
    size_t R = ep->R;
    m->o->sync(m->be); /* (the exchange reads m->dout from the host) */
    if (m->be->status) return m->be->status;
    int rc = ep->c->ops->alltoallv(ep->c, a2a_send_rows(m, m->dout), ep->sbytes, ep->xs, ep->rbytes, ep->timeout_ms);
    if (rc) return ep_err(rc, "the all-to-all of the output gradients to the experts");
    ep->bytes_out += sent(ep, ep->sbytes);
    float *doutr = ep->out; /* the outputs went home in forward */
    m->o->gather_rows(m->be, doutr, ep->xs, ep->d_perm, (int)R, m->h);
    if ((rc = experts_backward(m, params, dparams, doutr))) return rc;
    return a2a_home(m, m->dxp, "the all-to-all of the input gradients back");
}

/* ---- allgather ---- */

/* The allgather dispatcher's tables from the gathered routing map and probabilities (host):
 * the local experts' rows in expert, then gathered-token order (rtok, roff, each row's
 * probability gw[cap + q]), and each gathered token's rows in expert order (goff, grow, gw);
 * copied into backend memory in order with the queued work. */
static void ag_tables(moe_layer *m, size_t G) {
    moe__ep *ep = &m->ep;
    int El = ep->El, E = m->E;
    int32_t *cur = ep->goff + G + 1; /* (goff holds G + 1 offsets, then G cursors) */
    float *rw = ep->gw + ep->cap;
    memset(ep->goff, 0, sizeof(int32_t) * (G + 1));
    size_t r = 0;
    for (int j = 0; j < El; j++) {
        ep->roff[j] = (int32_t)r;
        for (size_t g = 0; g < G; g++)
            if (ep->mg[g * E + ep->e0 + j]) {
                rw[r] = ep->pg[g * E + ep->e0 + j];
                ep->rtok[r++] = (int32_t)g;
                ep->goff[g + 1]++;
            }
    }
    ep->roff[El] = (int32_t)r;
    for (size_t g = 0; g < G; g++) ep->goff[g + 1] += ep->goff[g];
    memcpy(cur, ep->goff, sizeof(int32_t) * G);
    /* rows ascend by expert: each token's fill in expert order */
    for (size_t q = 0; q < r; q++) {
        int at = cur[ep->rtok[q]]++;
        ep->grow[at] = (int32_t)q;
        ep->gw[at] = rw[q];
    }
    const kb_ops *o = m->o;
    kb_backend *be = m->be;
    o->copy(be, ep->d_goff, ep->goff, sizeof(int32_t) * (G + 1));
    if (!r) return;
    o->copy(be, ep->d_perm, ep->rtok, sizeof(int32_t) * r);
    o->copy(be, ep->d_grow, ep->grow, sizeof(int32_t) * r);
    o->copy(be, ep->d_gw, ep->gw, sizeof(float) * r);
    o->copy(be, ep->d_rw, rw, sizeof(float) * r);
}

static int ag_forward(moe_layer *m, const float *params, const float *x, float *y) {
    moe__ep *ep = &m->ep;
    cm_comm *c = ep->c;
    int P = ep->size, El = ep->El, E = m->E, N = m->N, h = m->h;
    size_t G = (size_t)P * N;
    uint64_t out = (uint64_t)(P - 1);
    m->o->sync(m->be);
    int rc = c->ops->allgather(c, x, ep->xg, sizeof(float) * (size_t)N * h, ep->timeout_ms);
    if (!rc) rc = c->ops->allgather(c, m->probs, ep->pg, sizeof(float) * (size_t)N * E, ep->timeout_ms);
    if (!rc) rc = c->ops->allgather(c, m->map, ep->mg, (size_t)N * E, ep->timeout_ms);
    if (rc) return ep_err(rc, "the all-gather of the group's tokens");
    ep->bytes_out += out * (sizeof(float) * (size_t)N * (h + E) + (size_t)N * E);
    size_t R = 0;
    for (size_t g = 0; g < G; g++)
        for (int j = 0; j < El; j++) R += ep->mg[g * E + ep->e0 + j];
    if ((rc = ep_reserve(m, R))) return rc;
    ep->R = R;
    ag_tables(m, G);
    m->o->gather_rows(m->be, ep->xr, ep->xg, ep->d_perm, (int)R, h);
    /* (each gathered token's partial output into yg: its rows here, in expert order, weighted) */
    if ((rc = experts_forward(m, params))) return rc;
    rc = c->ops->reduce_scatter_sum(c, ep->yg, y, (size_t)N * h, CM_F32, ep->timeout_ms);
    if (rc) return ep_err(rc, "the reduce-scatter of the experts' outputs");
    ep->bytes_out += out * sizeof(float) * (size_t)N * h;
    return 0;
}

static int ag_backward(moe_layer *m, const float *params, float *dparams, const float *dy, float *dx_experts) {
    moe__ep *ep = &m->ep;
    cm_comm *c = ep->c;
    int P = ep->size, El = ep->El, E = m->E, N = m->N, h = m->h;
    size_t G = (size_t)P * N;
    uint64_t out = (uint64_t)(P - 1);
    float *dyg = ep->xg; /* the gathered x is not needed any more (the rows are in xr) */
    m->o->sync(m->be); /* (the exchange reads dy from the host) */
    if (m->be->status) return m->be->status;
    int rc = c->ops->allgather(c, dy, dyg, sizeof(float) * (size_t)N * h, ep->timeout_ms);
    if (rc) return ep_err(rc, "the all-gather of the output gradients");
    ep->bytes_out += out * sizeof(float) * (size_t)N * h;
    /* the local rows' output gradients (into xs, free under this dispatcher) and their
     * probabilities' gradients, on the backend */
    float *doutr = ep->xs;
    int R = (int)ep->R;
    m->o->combine_backward(m->be, doutr, ep->d_dw, dyg, ep->out, ep->d_perm, ep->d_rw, R, h);
    /* (each gathered token's input gradient into yg: its rows here, in expert order; the wait
     * after it lets the host read the rows' probability gradients in backend memory) */
    if ((rc = experts_backward(m, params, dparams, doutr))) return rc;
    memset(ep->dpg, 0, sizeof(double) * G * E);
    for (int j = 0; j < El; j++)
        for (int q = ep->roff[j]; q < ep->roff[j + 1]; q++) ep->dpg[(size_t)ep->rtok[q] * E + ep->e0 + j] = ep->d_dw[q];
    rc = c->ops->reduce_scatter_sum(c, ep->yg, dx_experts, (size_t)N * h, CM_F32, ep->timeout_ms);
    if (!rc) rc = c->ops->reduce_scatter_sum(c, ep->dpg, m->dprob, (size_t)N * E, CM_F64, ep->timeout_ms);
    if (rc) return ep_err(rc, "the reduce-scatter of the input and routing gradients");
    ep->bytes_out += out * (sizeof(float) * (size_t)N * h + sizeof(double) * (size_t)N * E);
    return 0;
}

int moe__ep_forward(moe_layer *m, const float *params, const float *x, float *y) {
    double t0 = now_s();
    int rc = m->ep.disp == MOE_DISPATCH_ALLGATHER ? ag_forward(m, params, x, y) : a2a_forward(m, params);
    m->ep.dispatch_s += now_s() - t0;
    return rc;
}

int moe__ep_backward(moe_layer *m, const float *params, float *dparams, const float *dy, float *dx_experts) {
    double t0 = now_s();
    int rc = m->ep.disp == MOE_DISPATCH_ALLGATHER ? ag_backward(m, params, dparams, dy, dx_experts)
                                                  : a2a_backward(m, params, dparams);
    m->ep.dispatch_s += now_s() - t0;
    return rc;
}

/* ---- the flat buffer of one expert-parallel rank ---- */

static void ep_copy(const moe_config *c, int P, int rank, const float *src, float *dst, bool to_local) {
    moe_config cf = *c, cl = *c;
    cf.ep_size = 0;
    cl.ep_size = P;
    cf.etp_size = cl.etp_size = 0; /* whole experts */
    moe_offsets of, ol;
    if (moe_layout(&cf, &of) || moe_layout(&cl, &ol)) return;
    int El = P > 1 ? c->num_experts / P : c->num_experts;
    size_t h = (size_t)c->hidden, F = (size_t)c->ffn_hidden, F1 = c->swiglu ? 2 * F : F;
    struct {
        size_t full, local, n;
    } part[] = {{of.router, ol.router, (size_t)c->num_experts * h},
                {of.fc1 + (size_t)rank * El * F1 * h, ol.fc1, (size_t)El * F1 * h},
                {of.fc2 + (size_t)rank * El * h * F, ol.fc2, (size_t)El * h * F},
                {of.shared_fc1, ol.shared_fc1, of.total - of.shared_fc1}};
    for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
        if (to_local) memcpy(dst + part[i].local, src + part[i].full, sizeof(float) * part[i].n);
        else memcpy(dst + part[i].full, src + part[i].local, sizeof(float) * part[i].n);
    }
}

void moe_ep_slice(const moe_config *c, int P, int rank, const float *full, float *local) {
    ep_copy(c, P, rank, full, local, true);
}

void moe_ep_unslice(const moe_config *c, int P, int rank, const float *local, float *full) {
    ep_copy(c, P, rank, local, full, false);
}
