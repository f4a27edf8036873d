/* ring_attention.c - load-balanced ring attention for context parallelism: the split, the
 * forward and backward over the ring, and two exchanges (cohort's comm, and threads in one
 * process). What it computes: model/ring_attention.h and docs/context-parallel.md. */
#include "model/ring_attention.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

/* ---- the split ---- */

int ring_check(const ring_geo *g) {
    if (g->cp < 1 || g->rank < 0 || g->rank >= g->cp)
        return co_err_set(CO_EINVAL, "context parallel: rank %d of %d is out of range", g->rank,
                          g->cp);
    if (g->B < 1 || g->seq < 1 || g->nh < 1 || g->nkv < 1 || g->hd < 1 || g->nh % g->nkv)
        return co_err_set(CO_EINVAL,
                          "context parallel: bad attention shape (B %d, seq %d, nh %d, nkv %d, "
                          "hd %d)",
                          g->B, g->seq, g->nh, g->nkv, g->hd);
    if (g->seq % (2 * g->cp))
        return co_err_set(CO_EINVAL,
                          "context parallel: the sequence length %d is not divisible by "
                          "2 * context-parallel-size = %d",
                          g->seq, 2 * g->cp);
    return 0;
}

static int split_check(int B, int seq, int cp, int rank) {
    ring_geo g = {.cp = cp, .rank = rank, .B = B, .seq = seq, .nh = 1, .nkv = 1, .hd = 1};
    return ring_check(&g);
}

int ring_positions(int32_t *pos, int seq, int cp, int rank) {
    int rc = split_check(1, seq, cp, rank);
    if (rc) return rc;
    const int S = seq / (2 * cp);
    for (int t = 0; t < S; t++) {
        pos[t] = rank * S + t;
        pos[S + t] = (2 * cp - rank - 1) * S + t;
    }
    return 0;
}

/* copies between full rows [B][seq] and local rows [B][seq/cp]; to_local says which way */
static int move_rows(void *full, void *local, size_t rb, int B, int seq, int cp, int rank,
                     int to_local) {
    int rc = split_check(B, seq, cp, rank);
    if (rc) return rc;
    const int S = seq / (2 * cp), L = 2 * S;
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            const int chunk = half ? 2 * cp - rank - 1 : rank;
            char *f = (char *)full + ((size_t)b * seq + (size_t)chunk * S) * rb;
            char *l = (char *)local + ((size_t)b * L + (size_t)half * S) * rb;
            if (to_local)
                memcpy(l, f, (size_t)S * rb);
            else
                memcpy(f, l, (size_t)S * rb);
        }
    return 0;
}

int ring_split_rows(void *dst, const void *src, size_t row_bytes, int B, int seq, int cp,
                    int rank) {
    return move_rows((void *)src, dst, row_bytes, B, seq, cp, rank, 1);
}

int ring_unsplit_rows(void *dst, const void *src, size_t row_bytes, int B, int seq, int cp,
                      int rank) {
    return move_rows(dst, (void *)src, row_bytes, B, seq, cp, rank, 0);
}

/* ---- forward and backward ---- */

static int kernel_status(kb_backend *b, const char *op, int step) {
    if (!b->status) return 0;
    return co_err_set(b->status, "%s, step %d: %s", op, step, co_err_detail());
}

/* The KV message: kv[B*L][2*nkv*hd] (k, then v of each token), then (with documents)
 * doc[B*L] int32. (The backward's dK/dV accumulator, of kv's shape, travels on its own.) */
typedef struct ring_msg {
    size_t kw;       /* floats per row of kv: 2*nkv*hd */
    size_t rows;     /* B*L */
    int with_doc;
    size_t bytes;
} ring_msg;

static void msg_init(ring_msg *m, const ring_geo *g, int with_doc) {
    m->kw = (size_t)2 * g->nkv * g->hd;
    m->rows = (size_t)g->B * (g->seq / g->cp);
    m->with_doc = with_doc;
    m->bytes = m->rows * m->kw * sizeof(float) +
               (with_doc ? m->rows * sizeof(int32_t) : 0);
}
static float *msg_kv(const ring_msg *m, void *buf) {
    (void)m;
    return (float *)buf;
}
static int32_t *msg_doc(const ring_msg *m, void *buf) {
    if (!m->with_doc) return NULL;
    return (int32_t *)((float *)buf + m->rows * m->kw);
}

/* The overlap: a step's shifts (the backward's finished dK/dV, then the next step's KV) run
 * in order on a helper thread while the step's block is computed; the block only reads the
 * buffers they send and never touches the ones they receive into. */
typedef struct shift_job {
    const ring_exchange *x;
    int n;                /* shifts to run, in order (0..2) */
    const void *send[2];
    void *recv[2];
    size_t bytes[2];
    const char *what[2];
    int rc;               /* the first failure's code, its shift's name and detail */
    const char *failed;
    char err[600];
} shift_job;

static void *shift_main(void *arg) {
    shift_job *j = arg;
    for (int k = 0; k < j->n && !j->rc; k++) {
        j->rc = j->x->shift(j->x->ctx, j->send[k], j->recv[k], j->bytes[k]);
        if (j->rc) {
            j->failed = j->what[k];
            snprintf(j->err, sizeof j->err, "%s", co_err_detail());
        }
    }
    return NULL;
}

/* Adds a shift to a job (not yet started). */
static void job_add(shift_job *j, const void *send, void *recv, size_t bytes, const char *what) {
    j->send[j->n] = send, j->recv[j->n] = recv, j->bytes[j->n] = bytes, j->what[j->n] = what;
    j->n++;
}

/* Starts a job's shifts on a helper thread (*threaded), or runs them here when no thread can
 * be started (before the caller's compute, blocking); nothing when it has none. */
static void job_start(shift_job *j, pthread_t *th, bool *threaded) {
    *threaded = false;
    if (!j->n) return;
    *threaded = pthread_create(th, NULL, shift_main, j) == 0;
    if (!*threaded) shift_main(j);
}

/* the local K, V and doc ids into a message */
static void msg_pack(const ring_msg *m, void *buf, const ring_geo *g, const float *qkv,
                     const int32_t *doc) {
    const size_t R = (size_t)(g->nh + 2 * g->nkv) * g->hd, koff = (size_t)g->nh * g->hd;
    float *kv = msg_kv(m, buf);
    for (size_t i = 0; i < m->rows; i++) memcpy(kv + i * m->kw, qkv + i * R + koff, m->kw * sizeof(float));
    if (m->with_doc) memcpy(msg_doc(m, buf), doc, m->rows * sizeof(int32_t));
}

/* The block of step i for rank r: which queries against which keys.
 *   i == 0: all L local queries against all L local keys, causal;
 *   i <= r: all L queries against the first S keys (the sender's lower chunk);
 *   i >  r: the last S queries (the upper chunk) against all L keys. */
typedef struct ring_step {
    int q0, nq, nk; /* first query and query count within each local sequence; key count */
    kb_block_mask mask;
} ring_step;

static ring_step step_of(const ring_geo *g, int i) {
    const int L = g->seq / g->cp, S = L / 2;
    if (i == 0) return (ring_step){0, L, L, KB_BLOCK_MASK_CAUSAL};
    if (i <= g->rank) return (ring_step){0, L, S, KB_BLOCK_MASK_NONE};
    return (ring_step){S, S, L, KB_BLOCK_MASK_NONE};
}

static kb_block_attn block_of(const ring_geo *g, const ring_step *s, const ring_msg *m,
                              void *msg, const float *qkv, const int32_t *doc) {
    const int L = g->seq / g->cp;
    const size_t R = (size_t)(g->nh + 2 * g->nkv) * g->hd;
    const float *kv = msg_kv(m, msg);
    kb_block_attn a = {
        .B = g->B, .Tq = s->nq, .Tk = s->nk, .nh = g->nh, .nkv = g->nkv, .hd = g->hd,
        .mask = s->mask,
        .q = qkv + (size_t)s->q0 * R, .q_stride = R, .q_brows = L,
        .k = kv, .k_stride = m->kw, .v = kv + (size_t)g->nkv * g->hd, .v_stride = m->kw,
        .k_brows = L,
        .qdoc = doc ? doc + s->q0 : NULL, .kdoc = msg_doc(m, msg),
    };
    return a;
}

/* rows [q0, q0+nq) of each sequence: full[B*L rows of w] <-> part[B*nq rows of w] */
static void rows_gather(float *part, const float *full, int B, int L, int q0, int nq, size_t w) {
    for (int b = 0; b < B; b++)
        memcpy(part + (size_t)b * nq * w, full + ((size_t)b * L + q0) * w, (size_t)nq * w * sizeof(float));
}

/* lse[(b*nh + h)*L + t] rows q0.. -> part[(b*nh + h)*nq + t] */
static void lse_gather(float *part, const float *lse, int B, int nh, int L, int q0, int nq) {
    for (int bh = 0; bh < B * nh; bh++)
        memcpy(part + (size_t)bh * nq, lse + (size_t)bh * L + q0, (size_t)nq * sizeof(float));
}

/* Merges a partial result (po[B*nq, nh*hd], pl[(b*nh+h)*nq + t]) for local rows q0..q0+nq
 * into out/lse: lse' = max + log1p(exp(min - max)); out' = out e^(lse - lse') + po e^(pl - lse'). */
static void merge(float *out, float *lse, const float *po, const float *pl, const ring_geo *g,
                  int q0, int nq) {
    const int L = g->seq / g->cp, nh = g->nh, hd = g->hd;
    for (int b = 0; b < g->B; b++)
        for (int h = 0; h < nh; h++)
            for (int t = 0; t < nq; t++) {
                const float ls = pl[((size_t)b * nh + h) * nq + t];
                if (ls == -INFINITY) continue; /* nothing seen in this block */
                float *lo = lse + ((size_t)b * nh + h) * L + q0 + t;
                const float mx = *lo > ls ? *lo : ls, mn = *lo > ls ? ls : *lo;
                const float ln = mx + log1pf(expf(mn - mx));
                const float ca = expf(*lo - ln), cb = expf(ls - ln);
                float *o = out + ((size_t)b * L + q0 + t) * nh * hd + (size_t)h * hd;
                const float *p = po + ((size_t)b * nq + t) * nh * hd + (size_t)h * hd;
                for (int c = 0; c < hd; c++) o[c] = o[c] * ca + p[c] * cb;
                *lo = ln;
            }
}

/* The ring's buffers come from the backend, so that its kernels can read them (CUDA: managed
 * memory, which the host loops here read and write after a sync; the CPU: plain memory). */
static void *rbuf(kb_backend *b, size_t bytes) { return b->ops->alloc(b, bytes ? bytes : 1); }
static void rfree(kb_backend *b, void *p) {
    if (p) b->ops->free(b, p);
}

static int ops_check(kb_backend *b, const ring_geo *g, const char *op) {
    int rc = ring_check(g);
    if (rc) return co_err_set(rc, "%s: %s", op, co_err_detail());
    if (!b->ops->block_attention_forward || !b->ops->block_attention_backward)
        return co_err_set(CO_EUNSUPPORTED,
                          "%s: this backend has no block attention", op);
    return 0;
}

int ring_attention_forward(kb_backend *b, const ring_exchange *x, const ring_geo *g, float *out,
                           float *lse, const float *qkv, const int32_t *doc) {
    static const char op[] = "ring_attention_forward";
    int rc = ops_check(b, g, op);
    if (rc) return rc;
    const int L = g->seq / g->cp, nh = g->nh, hd = g->hd;
    ring_msg m;
    msg_init(&m, g, doc != NULL);
    void *cur = rbuf(b, m.bytes), *nxt = g->cp > 1 ? rbuf(b, m.bytes) : NULL;
    /* partial results: at most [B*L, nh*hd] and [B*nh*L] */
    float *po = g->cp > 1 ? rbuf(b, (size_t)g->B * L * nh * hd * sizeof(float)) : NULL;
    float *pl = g->cp > 1 ? rbuf(b, (size_t)g->B * nh * L * sizeof(float)) : NULL;
    if (!cur || (g->cp > 1 && (!nxt || !po || !pl))) {
        rc = co_err_set(CO_ENOMEM, "%s: cannot allocate the ring buffers", op);
        goto done;
    }
    b->ops->sync(b); /* (a queued backend: qkv and doc are written) */
    msg_pack(&m, cur, g, qkv, doc);
    for (int i = 0; i < g->cp; i++) {
        /* cur holds the KV of rank (rank - i); the KV of rank (rank - i - 1) arrives from the
         * left neighbour into nxt on a helper thread meanwhile (where no thread can be
         * started, before the block, blocking) */
        shift_job j = {.x = x};
        if (i + 1 < g->cp) job_add(&j, cur, nxt, m.bytes, "KV");
        pthread_t th;
        bool threaded;
        job_start(&j, &th, &threaded);
        const ring_step s = step_of(g, i);
        kb_block_attn a = block_of(g, &s, &m, cur, qkv, doc);
        if (i == 0) {
            b->ops->block_attention_forward(b, &a, out, lse);
        } else {
            b->ops->block_attention_forward(b, &a, po, pl);
        }
        /* the merge too runs beside the exchange (neither touches the other's buffers); a
         * queued backend's block first finishes (the host reads it) */
        b->ops->sync(b);
        const int krc = kernel_status(b, op, i);
        if (!krc && i > 0) merge(out, lse, po, pl, g, s.q0, s.nq);
        if (threaded) pthread_join(th, NULL);
        if ((rc = krc)) goto done;
        if (j.rc) {
            rc = co_err_set(j.rc, "%s, step %d: %s exchange: %s", op, i + 1, j.failed, j.err);
            goto done;
        }
        if (i + 1 < g->cp) {
            void *t = cur;
            cur = nxt, nxt = t;
        }
    }
done:
    rfree(b, cur);
    rfree(b, nxt);
    rfree(b, po);
    rfree(b, pl);
    return rc;
}

int ring_attention_backward(kb_backend *b, const ring_exchange *x, const ring_geo *g,
                            float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int32_t *doc) {
    static const char op[] = "ring_attention_backward";
    int rc = ops_check(b, g, op);
    if (rc) return rc;
    const int L = g->seq / g->cp, S = L / 2, nh = g->nh, nkv = g->nkv, hd = g->hd;
    const size_t R = (size_t)(nh + 2 * nkv) * hd;
    /* KV (with the doc ids) and the dK/dV accumulators travel in separate messages. At step i
     * a helper thread passes on the accumulator finished at step i-1 (receiving the one of
     * the KV held now, which the ranks before us filled) and then fetches step i+1's KV,
     * while the block computes this rank's dK/dV of the current KV into dloc; after it the
     * accumulator is finished: dfin = dacc + dloc. The last one goes home by a shift after
     * the last step (the one exchange not beside a block). */
    ring_msg m;
    msg_init(&m, g, doc != NULL);
    const size_t dn = m.rows * m.kw, dbytes = dn * sizeof(float);
    void *cur = rbuf(b, m.bytes), *nxt = g->cp > 1 ? rbuf(b, m.bytes) : NULL;
    float *dloc = rbuf(b, dbytes), *dfin = rbuf(b, dbytes), *dacc = g->cp > 1 ? rbuf(b, dbytes) : NULL;
    /* the upper half's out, dout and lse gathered contiguous for the i > rank steps */
    const int need_half = g->rank < g->cp - 1;
    float *ho = need_half ? rbuf(b, (size_t)g->B * S * nh * hd * sizeof(float)) : NULL;
    float *hdo = need_half ? rbuf(b, (size_t)g->B * S * nh * hd * sizeof(float)) : NULL;
    float *hl = need_half ? rbuf(b, (size_t)g->B * nh * S * sizeof(float)) : NULL;
    if (!cur || !dloc || !dfin || (g->cp > 1 && (!nxt || !dacc)) || (need_half && (!ho || !hdo || !hl))) {
        rc = co_err_set(CO_ENOMEM, "%s: cannot allocate the ring buffers", op);
        goto done;
    }
    b->ops->sync(b); /* (a queued backend: the forward's and the gradient's rows are written) */
    if (need_half) {
        rows_gather(ho, out, g->B, L, S, S, (size_t)nh * hd);
        rows_gather(hdo, dout, g->B, L, S, S, (size_t)nh * hd);
        lse_gather(hl, lse, g->B, nh, L, S, S);
    }
    memset(dqkv, 0, (size_t)g->B * L * R * sizeof(float));
    msg_pack(&m, cur, g, qkv, doc);
    for (int i = 0; i < g->cp; i++) {
        /* cur: the KV of rank (rank - i) */
        shift_job j = {.x = x};
        if (i > 0) job_add(&j, dfin, dacc, dbytes, "dKV");
        if (i + 1 < g->cp) job_add(&j, cur, nxt, m.bytes, "KV");
        pthread_t th;
        bool threaded;
        job_start(&j, &th, &threaded);
        const ring_step s = step_of(g, i);
        kb_block_attn a = block_of(g, &s, &m, cur, qkv, doc);
        const int half = s.q0 != 0;
        memset(dloc, 0, dbytes);
        b->ops->block_attention_backward(b, &a, half ? ho : out, half ? hl : lse,
                                         half ? hdo : dout, dqkv + (size_t)s.q0 * R, R, dloc,
                                         m.kw, dloc + (size_t)nkv * hd, m.kw);
        b->ops->sync(b); /* (the host adds dloc next) */
        if (threaded) pthread_join(th, NULL);
        if ((rc = kernel_status(b, op, i))) goto done;
        if (j.rc) {
            rc = co_err_set(j.rc, "%s, step %d: %s exchange: %s", op, i, j.failed, j.err);
            goto done;
        }
        if (i == 0) {
            float *t = dfin; /* our own KV: nobody added before us */
            dfin = dloc, dloc = t;
        } else {
            for (size_t k = 0; k < dn; k++) dfin[k] = dacc[k] + dloc[k];
        }
        if (i + 1 < g->cp) {
            void *t = cur;
            cur = nxt, nxt = t;
        }
    }
    const float *dkv = dfin;
    if (g->cp > 1) {
        /* the accumulator finished last belongs to rank + 1; ours arrives from rank - 1 */
        rc = x->shift(x->ctx, dfin, dacc, dbytes);
        if (rc) {
            rc = co_err_set(rc, "%s: returning dKV to its owner: %s", op, co_err_detail());
            goto done;
        }
        dkv = dacc;
    }
    for (size_t r = 0; r < m.rows; r++)
        memcpy(dqkv + r * R + (size_t)nh * hd, dkv + r * m.kw, m.kw * sizeof(float));
done:
    rfree(b, cur);
    rfree(b, nxt);
    rfree(b, dloc);
    rfree(b, dfin);
    rfree(b, dacc);
    rfree(b, ho);
    rfree(b, hdo);
    rfree(b, hl);
    return rc;
}

/* ---- exchange over cohort's comm ---- */

static int comm_shift(void *ctx, const void *send, void *recv, size_t n) {
    ring_comm *rc = ctx;
    cm_comm *c = rc->c;
    if (c->size == 1) {
        memcpy(recv, send, n);
        return 0;
    }
    const int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    int e;
    if (c->rank % 2 == 0) {
        if ((e = c->ops->send(c, send, n, next, rc->timeout_ms)))
            return co_err_set(e, "ring shift: send to rank %d: %s", next, co_err_detail());
        if ((e = c->ops->recv(c, recv, n, prev, rc->timeout_ms)))
            return co_err_set(e, "ring shift: recv from rank %d: %s", prev, co_err_detail());
    } else {
        if ((e = c->ops->recv(c, recv, n, prev, rc->timeout_ms)))
            return co_err_set(e, "ring shift: recv from rank %d: %s", prev, co_err_detail());
        if ((e = c->ops->send(c, send, n, next, rc->timeout_ms)))
            return co_err_set(e, "ring shift: send to rank %d: %s", next, co_err_detail());
    }
    return 0;
}

void ring_exchange_comm(ring_exchange *x, ring_comm *rc) {
    x->shift = comm_shift;
    x->ctx = rc;
}

/* ---- exchange inside one process ---- */

typedef struct ring_sim_rank {
    struct ring_sim *s;
    int rank;
} ring_sim_rank;

struct ring_sim {
    int cp, timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long gen;
    int aborted; /* 0, or the CO_E* code every later call returns */
    const void **send;
    size_t *nbytes;
    ring_sim_rank *ranks;
};

/* all cp ranks meet here (mu held); 0 or the abort code */
static int sim_barrier(struct ring_sim *s) {
    if (s->aborted) return s->aborted;
    const unsigned long my = s->gen;
    if (++s->arrived == s->cp) {
        s->arrived = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
        return 0;
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += s->timeout_ms / 1000;
    dl.tv_nsec += (long)(s->timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    while (s->gen == my && !s->aborted) {
        int e = pthread_cond_timedwait(&s->cv, &s->mu, &dl);
        if (e == ETIMEDOUT && s->gen == my && !s->aborted) {
            s->aborted = CO_ETIMEOUT;
            pthread_cond_broadcast(&s->cv);
        }
    }
    return s->gen != my ? 0 : s->aborted;
}

static int sim_shift(void *ctx, const void *send, void *recv, size_t n) {
    ring_sim_rank *me = ctx;
    struct ring_sim *s = me->s;
    const int prev = (me->rank + s->cp - 1) % s->cp;
    pthread_mutex_lock(&s->mu);
    s->send[me->rank] = send;
    s->nbytes[me->rank] = n;
    int rc = sim_barrier(s); /* everyone has posted */
    if (!rc) {
        if (s->nbytes[prev] != n) {
            s->aborted = CO_EINVAL;
            pthread_cond_broadcast(&s->cv);
            rc = CO_EINVAL;
        } else {
            memcpy(recv, s->send[prev], n); /* copied under the lock: one rank at a time */
            rc = sim_barrier(s);            /* everyone has copied: send buffers are free */
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == CO_ETIMEOUT)
        return co_err_set(rc, "ring_sim shift (rank %d): a rank did not arrive in %d ms",
                          me->rank, s->timeout_ms);
    if (rc) return co_err_set(rc, "ring_sim shift (rank %d): simulation aborted", me->rank);
    return 0;
}

int ring_sim_new(ring_sim **out, int cp, int timeout_ms) {
    *out = NULL;
    if (cp < 1 || timeout_ms < 0)
        return co_err_set(CO_EINVAL, "ring_sim_new: bad cp %d or timeout %d", cp, timeout_ms);
    ring_sim *s = calloc(1, sizeof *s);
    if (!s) return co_err_set(CO_ENOMEM, "ring_sim_new: out of memory");
    s->cp = cp, s->timeout_ms = timeout_ms;
    s->send = calloc((size_t)cp, sizeof *s->send);
    s->nbytes = calloc((size_t)cp, sizeof *s->nbytes);
    s->ranks = calloc((size_t)cp, sizeof *s->ranks);
    if (!s->send || !s->nbytes || !s->ranks) {
        free(s->send);
        free(s->nbytes);
        free(s->ranks);
        free(s);
        return co_err_set(CO_ENOMEM, "ring_sim_new: out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int r = 0; r < cp; r++) s->ranks[r] = (ring_sim_rank){s, r};
    *out = s;
    return 0;
}

void ring_sim_exchange(ring_sim *s, int rank, ring_exchange *x) {
    x->shift = sim_shift;
    x->ctx = &s->ranks[rank];
}

void ring_sim_abort(ring_sim *s) {
    pthread_mutex_lock(&s->mu);
    if (!s->aborted) s->aborted = CO_EABORTED;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void ring_sim_free(ring_sim **sp) {
    ring_sim *s = *sp;
    if (!s) return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->send);
    free(s->nbytes);
    free(s->ranks);
    free(s);
    *sp = NULL;
}
