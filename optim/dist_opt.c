/* dist_opt.c - the distributed optimizer: Megatron's bucketed layout, the sharded AdamW
 * step (reduce-scatter, shard update, all-gather) and the redundant shard copy. See
 * dist_opt.h and docs/distributed-optimizer.md. */
#include "optim/dist_opt.h"

#include "common/error.h"
#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t pad_up(size_t x, size_t d) { return (x + d - 1) / d * d; }

static size_t gcd_z(size_t a, size_t b) {
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

size_t dopt_default_bucket_size(int dp) {
    size_t b = (size_t)1000000 * (size_t)(dp > 0 ? dp : 1);
    return b > 40000000 ? b : 40000000;
}

void dopt_layout_free(dopt_layout *L) {
    if (L->pieces)
        for (int r = 0; r < L->dp; r++) free(L->pieces[r]);
    free(L->pieces);
    free(L->npieces);
    free(L->buckets);
    free(L->param_start);
    free(L->param_numel);
    free(L->param_bucket);
    memset(L, 0, sizeof *L);
}

int dopt_layout_build(dopt_layout *L, const size_t *numel, int nparams, int dp, size_t bucket_size) {
    memset(L, 0, sizeof *L);
    if (dp < 1 || nparams < 1 || !numel)
        return co_err_set(CO_EINVAL, "distributed optimizer layout: %d parameters over %d ranks", nparams, dp);
    for (int i = 0; i < nparams; i++)
        if (numel[i] == 0)
            return co_err_set(CO_EINVAL, "distributed optimizer layout: parameter %d is empty", i);
    if (bucket_size == 0) bucket_size = dopt_default_bucket_size(dp);
    size_t bdiv = (size_t)dp / gcd_z((size_t)dp, DOPT_BUCKET_ALIGN) * DOPT_BUCKET_ALIGN; /* lcm(dp, 128) */
    L->dp = dp;
    L->nparams = nparams;
    L->bucket_size = bucket_size;
    L->param_start = calloc((size_t)nparams, sizeof *L->param_start);
    L->param_numel = calloc((size_t)nparams, sizeof *L->param_numel);
    L->param_bucket = calloc((size_t)nparams, sizeof *L->param_bucket);
    L->buckets = calloc((size_t)nparams, sizeof *L->buckets); /* at most one per parameter */
    L->npieces = calloc((size_t)dp, sizeof *L->npieces);
    L->pieces = calloc((size_t)dp, sizeof *L->pieces);
    if (!L->param_start || !L->param_numel || !L->param_bucket || !L->buckets || !L->npieces || !L->pieces) {
        dopt_layout_free(L);
        return co_err_set(CO_ENOMEM, "distributed optimizer layout: %d parameters", nparams);
    }
    /* Megatron's _ParamAndGradBuffer.__init__ (shared-embedding buckets aside) */
    size_t pstart = 0, bstart = 0, pend = 0;
    int nb = 0, in_bucket = 0;
    for (int i = nparams - 1; i >= 0; i--) {
        pstart = pad_up(pstart, DOPT_PARAM_ALIGN);
        pend = pstart + numel[i];
        L->param_start[i] = pstart;
        L->param_numel[i] = numel[i];
        L->param_bucket[i] = nb;
        in_bucket++;
        if (pend - bstart >= bucket_size) {
            size_t bend = pad_up(pend, bdiv);
            L->buckets[nb++] = (dopt_bucket){.start = bstart, .end = bend, .numel_unpadded = pend - bstart};
            bstart = bend;
            pstart = bend;
            in_bucket = 0;
        } else {
            pstart = pend;
        }
    }
    if (in_bucket) {
        size_t bend = pad_up(pend, bdiv);
        L->buckets[nb++] = (dopt_bucket){.start = bstart, .end = bend, .numel_unpadded = pend - bstart};
    }
    L->nbuckets = nb;
    L->total = L->buckets[nb - 1].end;
    size_t base = 0;
    for (int b = 0; b < nb; b++) {
        L->buckets[b].shard = (L->buckets[b].end - L->buckets[b].start) / (size_t)dp;
        L->buckets[b].shard_base = base;
        base += L->buckets[b].shard;
    }
    L->shard_total = base;
    /* every rank's pieces: parameters in buffer order (reverse table order) */
    for (int r = 0; r < dp; r++) {
        int cap = 0;
        for (int pass = 0; pass < 2; pass++) {
            int np = 0;
            for (int i = nparams - 1; i >= 0; i--) {
                const dopt_bucket *B = &L->buckets[L->param_bucket[i]];
                size_t lo = B->start + (size_t)r * B->shard, hi = lo + B->shard;
                size_t a = L->param_start[i], e = a + numel[i];
                size_t x = a > lo ? a : lo, y = e < hi ? e : hi;
                if (x >= y) continue;
                if (pass == 1)
                    L->pieces[r][np] = (dopt_piece){.param = i, .bucket = L->param_bucket[i], .param_lo = x - a,
                                                    .param_hi = y - a, .shard_off = B->shard_base + (x - lo),
                                                    .buf_off = x};
                np++;
            }
            if (pass == 0) {
                cap = np;
                L->pieces[r] = calloc(cap ? (size_t)cap : 1, sizeof(dopt_piece));
                if (!L->pieces[r]) {
                    dopt_layout_free(L);
                    return co_err_set(CO_ENOMEM, "distributed optimizer layout: pieces of rank %d", r);
                }
            }
            L->npieces[r] = np;
        }
    }
    return 0;
}

double dopt_bytes_per_param(const dopt_layout *L, size_t nparams_total, bool redundant) {
    double bytes = 4.0 * (double)L->total * 2 + 4.0 * (double)L->shard_total * 2; /* params, grads; m, v */
    if (redundant && L->dp > 1) bytes += 4.0 * (double)L->shard_total * 4; /* copy's params, m, v and its gradient */
    return bytes / (double)(nparams_total ? nparams_total : 1);
}

static int layout_copy(dopt_layout *dst, const dopt_layout *src) {
    if (!src->nparams) return co_err_set(CO_EINVAL, "distributed optimizer: empty layout");
    size_t *numel = malloc((size_t)src->nparams * sizeof *numel);
    if (!numel) return co_err_set(CO_ENOMEM, "distributed optimizer: layout copy");
    memcpy(numel, src->param_numel, (size_t)src->nparams * sizeof *numel);
    int rc = dopt_layout_build(dst, numel, src->nparams, src->dp, src->bucket_size);
    free(numel);
    return rc;
}

void dopt_free(dopt_state *s) {
    kb_backend *be = s->be;
    float **bufs[] = {&s->m, &s->v, &s->rparams, &s->rm, &s->rv, &s->rgrad, &s->params, &s->grads};
    size_t nb = sizeof bufs / sizeof *bufs - (s->borrowed ? 2 : 0);
    for (size_t i = 0; i < nb; i++)
        if (*bufs[i] && be) be->ops->free(be, *bufs[i]);
    free(s->norm_runs);
    dopt_layout_free(&s->L);
    memset(s, 0, sizeof *s);
}

static int init_state(dopt_state *s, const dopt_layout *L, int rank, const dopt_options *opt, kb_backend *be,
                      float *params, float *grads);

int dopt_init(dopt_state *s, const dopt_layout *L, int rank, const dopt_options *opt, kb_backend *be) {
    return init_state(s, L, rank, opt, be, NULL, NULL);
}

int dopt_init_borrowed(dopt_state *s, const dopt_layout *L, int rank, const dopt_options *opt, kb_backend *be,
                       float *params, float *grads) {
    if (!params || !grads) {
        memset(s, 0, sizeof *s);
        return co_err_set(CO_EINVAL, "distributed optimizer: no parameter or gradient buffer to borrow");
    }
    return init_state(s, L, rank, opt, be, params, grads);
}

static int init_state(dopt_state *s, const dopt_layout *L, int rank, const dopt_options *opt, kb_backend *be,
                      float *params, float *grads) {
    memset(s, 0, sizeof *s);
    if (!L || !opt || !be || rank < 0 || rank >= L->dp)
        return co_err_set(CO_EINVAL, "distributed optimizer: rank %d of %d or no layout/backend", rank,
                          L ? L->dp : 0);
    int rc = layout_copy(&s->L, L);
    if (rc) return rc;
    s->opt = *opt;
    s->opt.redundant = opt->redundant && L->dp > 1;
    s->be = be;
    s->rank = rank;
    size_t nt = L->total * sizeof(float), ns = (L->shard_total ? L->shard_total : 1) * sizeof(float);
    s->borrowed = params != NULL;
    s->params = params ? params : be->ops->alloc(be, nt);
    s->grads = grads ? grads : be->ops->alloc(be, nt);
    s->m = be->ops->alloc(be, ns);
    s->v = be->ops->alloc(be, ns);
    bool ok = s->params && s->grads && s->m && s->v;
    if (ok && s->opt.redundant) {
        s->rparams = be->ops->alloc(be, ns);
        s->rm = be->ops->alloc(be, ns);
        s->rv = be->ops->alloc(be, ns);
        s->rgrad = be->ops->alloc(be, ns);
        ok = s->rparams && s->rm && s->rv && s->rgrad;
    }
    if (!ok) {
        dopt_free(s);
        return co_err_set(CO_ENOMEM, "distributed optimizer: cannot allocate buffers (%zu + %zu elements)",
                          L->total, L->shard_total);
    }
    return 0;
}

/* Copies shard `k` of the full buffer `full` into dense shard storage `out` (or back). */
static void shard_gather(const dopt_layout *L, int k, const float *full, float *out) {
    for (int b = 0; b < L->nbuckets; b++) {
        const dopt_bucket *B = &L->buckets[b];
        memcpy(out + B->shard_base, full + B->start + (size_t)k * B->shard, B->shard * sizeof(float));
    }
}

void dopt_init_shards(dopt_state *s) {
    if (!s->opt.redundant) return;
    /* (backend copies in stream order: on CUDA no wait for the kernels that wrote params) */
    int k = (s->rank + s->L.dp - 1) % s->L.dp;
    for (int b = 0; b < s->L.nbuckets; b++) {
        const dopt_bucket *B = &s->L.buckets[b];
        s->be->ops->copy(s->be, s->rparams + B->shard_base, s->params + B->start + (size_t)k * B->shard,
                         B->shard * sizeof(float));
    }
}

void dopt_copy_refresh(dopt_state *s, size_t lo, size_t hi) {
    if (!s->opt.redundant || !s->rparams) return;
    int k = (s->rank + s->L.dp - 1) % s->L.dp;
    for (int b = 0; b < s->L.nbuckets; b++) {
        const dopt_bucket *B = &s->L.buckets[b];
        size_t a = B->start + (size_t)k * B->shard, e = a + B->shard;
        size_t x0 = lo > a ? lo : a, x1 = hi < e ? hi : e;
        if (x0 < x1)
            s->be->ops->copy(s->be, s->rparams + B->shard_base + (x0 - a), s->params + x0, (x1 - x0) * sizeof(float));
    }
}

/* The backend's stream where the group has stream-ordered operations (CUDA with an NCCL
 * group; not the all-reduce form of the step): the shard's exchange and all-gather then
 * queue behind the kernels that write their input, with no wait of the host. NULL otherwise. */
static void *queued_stream(const dopt_state *s, const cm_comm *dp) {
    if (s->opt.allreduce || !dp || !dp->ops->p2p_q || !dp->ops->allgather_q || !dp->ops->queued_error ||
        !s->be->ops->stream)
        return NULL;
    return s->be->ops->stream(s->be);
}

void dopt_grads_clear(dopt_state *s) { s->be->ops->zero(s->be, s->grads, s->L.total); }

void dopt_pack(const dopt_layout *L, const float *src, const size_t *offsets, float *dst) {
    for (int i = 0; i < L->nparams; i++)
        memcpy(dst + L->param_start[i], src + offsets[i], L->param_numel[i] * sizeof(float));
}

void dopt_unpack(const dopt_layout *L, const float *src, const size_t *offsets, float *dst) {
    for (int i = 0; i < L->nparams; i++)
        memcpy(dst + offsets[i], src + L->param_start[i], L->param_numel[i] * sizeof(float));
}

/* AdamW over shard k's pieces: p and g are addressed through piece(shard_off) + the given
 * bases: own shard: p_full/g_full at buf_off; copy: dense p/g at shard_off. */
static void shard_update(dopt_state *s, int k, float *p, const float *g, float *m, float *v, bool dense,
                         const bool *decay, float lr, float gscale) {
    kb_backend *be = s->be;
    const dopt_options *o = &s->opt;
    for (int j = 0; j < s->L.npieces[k]; j++) {
        const dopt_piece *pc = &s->L.pieces[k][j];
        size_t n = pc->param_hi - pc->param_lo, at = dense ? pc->shard_off : pc->buf_off;
        float wd = decay && decay[pc->param] ? o->weight_decay : 0.0f;
        float r = s->decoupled && s->decoupled[pc->param] && s->lr_decoupled >= 0 ? (float)s->lr_decoupled : lr;
        be->ops->adamw(be, p + at, g + at, m + pc->shard_off, v + pc->shard_off, n, r, o->beta1, o->beta2, o->eps,
                       wd, gscale, s->step);
    }
}

/* Shard exchange for the redundant copy: every rank sends its reduced shard gradient (each
 * bucket's part, straight from the gradient buffer) to rank+1 and receives rank-1's into
 * the dense rgrad. Even ranks send first, odd ranks receive first, so a ring of any size
 * (odd too) cannot wait on itself even if a send blocks until it is read. */
static int exchange_shard_grad(dopt_state *s, cm_comm *dp) {
    const dopt_layout *L = &s->L;
    int n = L->dp, me = s->rank, nxt = (me + 1) % n, prv = (me + n - 1) % n, rc = 0;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        bool sending = (me % 2 == 0) == (pass == 0);
        for (int b = 0; b < L->nbuckets && !rc; b++) {
            const dopt_bucket *B = &L->buckets[b];
            size_t bytes = B->shard * sizeof(float);
            if (sending)
                rc = dp->ops->send(dp, s->grads + B->start + (size_t)me * B->shard, bytes, nxt, s->opt.timeout_ms);
            else
                rc = dp->ops->recv(dp, s->rgrad + B->shard_base, bytes, prv, s->opt.timeout_ms);
        }
    }
    return rc;
}

/* The same exchange queued on the backend's stream as one group of sends and receives
 * (the ring cannot wait on itself: NCCL posts a group's operations together). */
static int exchange_shard_grad_q(dopt_state *s, cm_comm *dp, void *stream) {
    const dopt_layout *L = &s->L;
    int n = L->dp, me = s->rank, nxt = (me + 1) % n, prv = (me + n - 1) % n;
    cm_p2p *ops = malloc(sizeof *ops * 2 * (size_t)L->nbuckets);
    if (!ops) return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    for (int b = 0; b < L->nbuckets; b++) {
        const dopt_bucket *B = &L->buckets[b];
        size_t bytes = B->shard * sizeof(float);
        ops[2 * b] = (cm_p2p){.c = dp, .buf = s->grads + B->start + (size_t)me * B->shard, .bytes = bytes, .peer = nxt,
                              .send = 1};
        ops[2 * b + 1] = (cm_p2p){.c = dp, .buf = s->rgrad + B->shard_base, .bytes = bytes, .peer = prv};
    }
    int rc = dp->ops->p2p_q(ops, 2 * L->nbuckets, stream);
    free(ops);
    return rc;
}

static int check_group(const dopt_state *s, const cm_comm *dp) {
    if (s->L.dp == 1 && !dp) return 0;
    if (!dp || dp->size != s->L.dp || dp->rank != s->rank)
        return co_err_set(CO_EINVAL, "distributed optimizer step: group of %d (rank %d), layout for %d (rank %d)",
                          dp ? dp->size : 0, dp ? dp->rank : -1, s->L.dp, s->rank);
    return 0;
}

int dopt_step(dopt_state *s, cm_comm *dp, const bool *decay, double lr, double *grad_norm_out) {
    double norm = 0;
    int rc = dopt_reduce(s, dp, &norm);
    if (rc) return rc;
    if (grad_norm_out) *grad_norm_out = norm;
    return dopt_update(s, dp, decay, lr, norm);
}

int dopt_set_norm_runs(dopt_state *s, const size_t *runs, int n) {
    size_t *r = malloc(sizeof *r * 2 * (size_t)(n > 0 ? n : 1));
    if (!r) return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    memcpy(r, runs, sizeof *r * 2 * (size_t)n);
    free(s->norm_runs);
    s->norm_runs = r;
    s->nnorm_runs = n;
    return 0;
}

/* The sum of squares of this rank's shards, bucket by bucket in bucket order, each bucket
 * the sum in order of its runs' sums (its shard, or where norm runs are set only the parts
 * this rank counts): with the backend's sumsq_runs in one wait (on CUDA the runs' sums stay
 * on the device, the 8-byte results come back together), bit for bit the host's loop over
 * sumsq, which backends without it run. */
static int shard_sumsq(const dopt_state *s, double *sq) {
    const dopt_layout *L = &s->L;
    kb_backend *be = s->be;
    *sq = 0;
    size_t cap = (size_t)L->nbuckets * (size_t)(s->norm_runs ? s->nnorm_runs + 1 : 1);
    const float **x = malloc(sizeof *x * cap);
    size_t *len = malloc(sizeof *len * cap);
    int *end = malloc(sizeof *end * (size_t)L->nbuckets);
    double *out = malloc(sizeof *out * (size_t)L->nbuckets);
    if (!x || !len || !end || !out) {
        free(x), free(len), free(end), free(out);
        return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    }
    int k = 0;
    for (int b = 0; b < L->nbuckets; b++) {
        size_t lo = L->buckets[b].start + (size_t)s->rank * L->buckets[b].shard, hi = lo + L->buckets[b].shard;
        if (!s->norm_runs) {
            x[k] = s->grads + lo, len[k++] = hi - lo;
        } else {
            for (int i = 0; i < s->nnorm_runs; i++) {
                size_t a = s->norm_runs[2 * i], e = s->norm_runs[2 * i + 1];
                if (e <= lo) continue;
                if (a >= hi) break;
                a = a > lo ? a : lo;
                e = e < hi ? e : hi;
                x[k] = s->grads + a, len[k++] = e - a;
            }
        }
        end[b] = k;
    }
    for (int b = 0; !be->ops->sumsq_runs && b < L->nbuckets; b++) {
        out[b] = 0;
        for (int j = b ? end[b - 1] : 0; j < end[b]; j++) out[b] += be->ops->sumsq(be, x[j], len[j]);
    }
    /* (at most KB_SUMSQ_MAX_GROUPS buckets a call: one wait for a model of up to that many) */
    for (int b0 = 0; be->ops->sumsq_runs && b0 < L->nbuckets; b0 += KB_SUMSQ_MAX_GROUPS) {
        int ng = L->nbuckets - b0 < KB_SUMSQ_MAX_GROUPS ? L->nbuckets - b0 : KB_SUMSQ_MAX_GROUPS;
        int j0 = b0 ? end[b0 - 1] : 0;
        int e[KB_SUMSQ_MAX_GROUPS];
        for (int g = 0; g < ng; g++) e[g] = end[b0 + g] - j0;
        be->ops->sumsq_runs(be, x + j0, len + j0, e, ng, out + b0);
    }
    for (int b = 0; b < L->nbuckets; b++) *sq += out[b];
    free(x), free(len), free(end), free(out);
    return 0;
}

int dopt_reduce(dopt_state *s, cm_comm *dp, double *grad_norm_out) {
    return dopt_reduce_mp(s, dp, NULL, grad_norm_out);
}

int dopt_reduce_mp(dopt_state *s, cm_comm *dp, cm_comm *mp, double *grad_norm_out) {
    int rc = check_group(s, dp);
    for (int b = 0; b < s->L.nbuckets && !rc; b++) rc = dopt_reduce_bucket(s, dp, b);
    return rc ? rc : dopt_reduce_finish(s, dp, mp, grad_norm_out);
}

int dopt_reduce_bucket(dopt_state *s, cm_comm *dp, int b) {
    const dopt_layout *L = &s->L;
    int n = L->dp, me = s->rank, rc = 0;
    if (n == 1) return 0;
    /* 1. reduce-scatter the bucket in place into this rank's shard (averaged in dopt_reduce_finish) */
    const dopt_bucket *B = &L->buckets[b];
    float *base = s->grads + B->start, *mine = base + (size_t)me * B->shard;
    if (s->opt.allreduce)
        rc = dp->ops->allreduce_sum(dp, base, (size_t)n * B->shard, CM_F32, s->opt.timeout_ms);
    else
        rc = dp->ops->reduce_scatter_sum(dp, base, mine, B->shard, CM_F32, s->opt.timeout_ms);
    if (rc)
        return co_err_set(rc, "distributed optimizer step: reduce-scatter of bucket %d of %d: %s", b, L->nbuckets,
                          co_err_detail());
    return 0;
}

int dopt_reduce_finish(dopt_state *s, cm_comm *dp, cm_comm *mp, double *grad_norm_out) {
    const dopt_layout *L = &s->L;
    kb_backend *be = s->be;
    int n = L->dp, me = s->rank, rc = check_group(s, dp);
    if (rc) return rc;
    float inv = 1.0f / (float)(s->opt.average_over > 0 ? s->opt.average_over : n);
    /* (a group of one still averages over the replicas: the experts' over an expert-data-
     * parallel group of one rank are divided by the data-parallel size) */
    for (int b = 0; b < L->nbuckets && (n > 1 || inv != 1.0f); b++)
        be->ops->scale(be, s->grads + L->buckets[b].start + (size_t)me * L->buckets[b].shard, inv,
                       L->buckets[b].shard);
    /* (a queued backend, CUDA, without stream-ordered operations of the group: the copy's
     * exchange reads the averaged shard from the host's side of the stream; with them it is
     * queued behind the averaging, and the norm's 8-byte sums are the only wait) */
    void *q = queued_stream(s, dp);
    if (n > 1 && s->opt.redundant && !s->opt.allreduce && !q) be->ops->sync(be);
    /* 2. the global norm: sum of squares of every rank's shards (padding is zero), all-reduced
     * over the group, then over the replica's model-parallel ranks */
    double sq = 0;
    if ((rc = shard_sumsq(s, &sq))) return rc;
    if (q && (rc = dp->ops->queued_error(dp))) /* (the last step's queued exchange and gather have run) */
        return co_err_set(rc, "distributed optimizer step: a queued shard exchange or all-gather: %s", co_err_detail());
    if (n > 1 && (rc = dp->ops->allreduce_sum(dp, &sq, 1, CM_F64, s->opt.timeout_ms)))
        return co_err_set(rc, "distributed optimizer step: all-reduce of the gradient norm: %s", co_err_detail());
    if (mp && (rc = mp->ops->allreduce_sum(mp, &sq, 1, CM_F64, s->opt.timeout_ms)))
        return co_err_set(rc, "distributed optimizer step: all-reduce of the gradient norm over the model-parallel "
                              "group: %s", co_err_detail());
    if (s->opt.redundant && s->opt.allreduce && n > 1) {
        /* the previous rank's shard of the all-reduced gradient is here already: the copy's
         * gradient is read locally, averaged the same way (the bits its owner uses) */
        int prv = (me + n - 1) % n;
        for (int b = 0; b < L->nbuckets; b++) {
            const dopt_bucket *B = &L->buckets[b];
            be->ops->copy(be, s->rgrad + B->shard_base, s->grads + B->start + (size_t)prv * B->shard,
                          B->shard * sizeof(float));
            be->ops->scale(be, s->rgrad + B->shard_base, inv, B->shard);
        }
    } else if (s->opt.redundant && n > 1 && q && (rc = exchange_shard_grad_q(s, dp, q))) {
        return co_err_set(rc, "distributed optimizer step: shard gradient to rank %d / from rank %d (queued): %s",
                          (me + 1) % n, (me + n - 1) % n, co_err_detail());
    } else if (s->opt.redundant && !q && (rc = exchange_shard_grad(s, dp)))
        return co_err_set(rc, "distributed optimizer step: shard gradient to rank %d / from rank %d: %s",
                          (me + 1) % n, (me + n - 1) % n, co_err_detail());
    s->norm_sq = sq;
    if (grad_norm_out) *grad_norm_out = sqrt(sq);
    return 0;
}

int dopt_update(dopt_state *s, cm_comm *dp, const bool *decay, double lr, double norm) {
    int rc = check_group(s, dp);
    if (!rc) rc = dopt_update_shards(s, decay, lr, norm);
    if (!rc) rc = dopt_gather(s, dp);
    return rc;
}

int dopt_update_shards(dopt_state *s, const bool *decay, double lr, double norm) {
    kb_backend *be = s->be;
    int n = s->L.dp, me = s->rank, rc;
    float gscale = opt_step_scale(s->opt.clip_grad, norm, s->opt.inv_loss_scale);
    /* 3. AdamW on the own shard (in the parameter buffer) and on the copy */
    s->step++;
    shard_update(s, me, s->params, s->grads, s->m, s->v, false, decay, (float)lr, gscale);
    if (s->opt.redundant)
        shard_update(s, (me + n - 1) % n, s->rparams, s->rgrad, s->rm, s->rv, true, decay, (float)lr, gscale);
    if ((rc = kb_backend_status(be)))
        return co_err_set(rc, "distributed optimizer step: the update: %s", co_err_detail());
    return 0;
}

int dopt_gather_bucket(dopt_state *s, cm_comm *dp, int b) {
    const dopt_layout *L = &s->L;
    int n = L->dp, me = s->rank, rc = check_group(s, dp);
    if (rc || n == 1) return rc;
    if (b < 0 || b >= L->nbuckets) return co_err_set(CO_EINVAL, "distributed optimizer: no bucket %d", b);
    /* 4. all-gather the bucket's updated shards into every rank's full parameter buffer */
    const dopt_bucket *B = &L->buckets[b];
    float *base = s->params + B->start;
    if (s->opt.allreduce) {
        /* every other rank's shard zeroed, then the 64-bit integer sum of the bucket's bits
         * over the group: each element is one rank's bits plus zeros (no carries), an exact
         * copy (the bucket's start and length are multiples of 128 elements) */
        size_t len = (size_t)n * B->shard;
        if (me > 0) memset(base, 0, (size_t)me * B->shard * sizeof(float));
        if (me + 1 < n) memset(base + (size_t)(me + 1) * B->shard, 0, (len - (size_t)(me + 1) * B->shard) * sizeof(float));
        rc = dp->ops->allreduce_sum(dp, base, len / 2, CM_I64, s->opt.timeout_ms);
    } else {
        rc = dp->ops->allgather(dp, base + (size_t)me * B->shard, base, B->shard * sizeof(float), s->opt.timeout_ms);
    }
    if (rc)
        return co_err_set(rc, "distributed optimizer step: all-gather of bucket %d of %d: %s", b, L->nbuckets,
                          co_err_detail());
    return 0;
}

int dopt_gather(dopt_state *s, cm_comm *dp) {
    int rc = check_group(s, dp);
    if (rc) return rc;
    void *q = s->L.dp > 1 ? queued_stream(s, dp) : NULL;
    if (q) {
        /* queued behind the shard's AdamW, in place (each rank's shard is its part of the
         * receive buffer), ahead of the next forward's kernels: no wait */
        for (int b = 0; b < s->L.nbuckets && !rc; b++) {
            const dopt_bucket *B = &s->L.buckets[b];
            float *base = s->params + B->start;
            rc = dp->ops->allgather_q(dp, base + (size_t)s->rank * B->shard, base, B->shard * sizeof(float), q);
            if (rc)
                rc = co_err_set(rc, "distributed optimizer step: all-gather of bucket %d of %d (queued): %s", b,
                                s->L.nbuckets, co_err_detail());
        }
        if (!rc && (rc = dp->ops->queued_error(dp)))
            rc = co_err_set(rc, "distributed optimizer step: a queued all-gather: %s", co_err_detail());
        return rc;
    }
    /* the shard's update may still be queued (CUDA): the collectives and the host read it */
    s->be->ops->sync(s->be);
    for (int b = 0; b < s->L.nbuckets && !rc; b++) rc = dopt_gather_bucket(s, dp, b);
    if (rc) return rc;
    s->be->ops->sync(s->be);
    return 0;
}

int dopt_shard_view_get(const dopt_state *s, int shard, dopt_shard_view *out, float *params) {
    int n = s->L.dp;
    memset(out, 0, sizeof *out);
    s->be->ops->sync(s->be); /* the host reads the shards next (a queued backend: CUDA) */
    if (shard == s->rank) {
        out->m = s->m;
        out->v = s->v;
        if (params) shard_gather(&s->L, shard, s->params, params);
    } else if (s->opt.redundant && shard == (s->rank + n - 1) % n) {
        out->m = s->rm;
        out->v = s->rv;
        if (params) memcpy(params, s->rparams, s->L.shard_total * sizeof(float));
    } else {
        return co_err_set(CO_ENOENT, "distributed optimizer: rank %d holds no copy of shard %d (of %d)", s->rank,
                          shard, n);
    }
    out->shard = shard;
    out->n = s->L.shard_total;
    out->step = s->step;
    return 0;
}

int dopt_shard_restore(dopt_state *s, const dopt_shard_view *v, const float *params) {
    const dopt_layout *L = &s->L;
    int n = L->dp;
    if (v->n != L->shard_total || !v->m || !v->v || !params)
        return co_err_set(CO_EINVAL, "distributed optimizer restore: shard %d of %zu elements, layout has %zu",
                          v->shard, v->n, L->shard_total);
    size_t bytes = L->shard_total * sizeof(float);
    s->be->ops->sync(s->be); /* the host writes the shards next (a queued backend: CUDA) */
    if (v->shard == s->rank) {
        for (int b = 0; b < L->nbuckets; b++) {
            const dopt_bucket *B = &L->buckets[b];
            memcpy(s->params + B->start + (size_t)s->rank * B->shard, params + B->shard_base,
                   B->shard * sizeof(float));
        }
        memmove(s->m, v->m, bytes);
        memmove(s->v, v->v, bytes);
    } else if (s->opt.redundant && v->shard == (s->rank + n - 1) % n) {
        memmove(s->rparams, params, bytes);
        memmove(s->rm, v->m, bytes);
        memmove(s->rv, v->v, bytes);
    } else {
        return co_err_set(CO_ENOENT, "distributed optimizer restore: rank %d holds no copy of shard %d (of %d)",
                          s->rank, v->shard, n);
    }
    s->step = v->step;
    return 0;
}
