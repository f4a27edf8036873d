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

/* rows x width floats of src (rows sstride floats apart) into dst (dstride apart), in the
 * backend's order (kb_ops.copy_rows counts bytes) */
static void copy_f32_rows(kb_backend *b, float *dst, size_t dstride, const float *src, size_t sstride, size_t width,
                          size_t rows) {
    const size_t f = sizeof(float);
    b->ops->copy_rows(b, dst, dstride * f, src, sstride * f, width * f, rows);
}

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

/* The ring's buffers, kept across calls (ring_ws) so that a step allocates nothing (a CUDA
 * allocation waits for the device). Each slot grows on demand; its contents between calls
 * are undefined. */
enum { RW_CUR, RW_NXT, RW_PO, RW_PL, RW_OF, RW_DLOC, RW_DFIN, RW_DACC, RW_HO, RW_HDO, RW_HL, RW_N };
struct ring_ws {
    kb_backend *b; /* the backend its buffers are from */
    void *p[RW_N];
    size_t n[RW_N];
};

ring_ws *ring_ws_new(void) { return calloc(1, sizeof(ring_ws)); }

static void ws_release(ring_ws *w) {
    for (int i = 0; i < RW_N; i++)
        if (w->p[i]) w->b->ops->free(w->b, w->p[i]);
    memset(w->p, 0, sizeof w->p);
    memset(w->n, 0, sizeof w->n);
}

void ring_ws_free(ring_ws **wp) {
    if (!*wp) return;
    ws_release(*wp);
    free(*wp);
    *wp = NULL;
}

/* slot i of at least bytes from the backend; NULL when it cannot be allocated */
static void *ws_get(kb_backend *b, ring_ws *w, int i, size_t bytes) {
    if (w->b && w->b != b) ws_release(w);
    w->b = b;
    if (w->p[i] && w->n[i] >= bytes) return w->p[i];
    if (w->p[i]) b->ops->free(b, w->p[i]);
    w->p[i] = b->ops->alloc(b, bytes ? bytes : 1);
    w->n[i] = w->p[i] ? bytes : 0;
    return w->p[i];
}

/* How a call's shifts are ordered with the backend's work:
 *   RING_QUEUED: the exchange queues them (shift_q, NCCL in stream order) on the backend's
 *     side stream where it has one, else on its stream: a step's shifts wait there for the
 *     kernels queued before them (side_fork: what they send is written, what they receive
 *     into no longer read) and run beside the step's block; the stream then waits for them
 *     (side_join) before anything that reads what they received. No host wait at all;
 *   RING_THREAD: a backend whose operations finish before they return (the CPU): the shifts
 *     run on a helper thread beside the step's block;
 *   RING_WAIT: a queued backend and a blocking exchange: the host waits for the device before
 *     each step's shifts (they read what kernels wrote, and receive into a buffer a queued
 *     block may still read), then runs them here, before the step's block. */
typedef enum { RING_QUEUED, RING_THREAD, RING_WAIT } ring_mode;

typedef struct ring_order {
    ring_mode md;
    void *stream; /* RING_QUEUED: the stream the shifts are queued on */
    bool side;    /* ... the backend's side stream (forked and joined around them) */
} ring_order;

static ring_order order_of(kb_backend *b, const ring_exchange *x) {
    const kb_ops *o = b->ops;
    ring_order r = {.md = RING_THREAD};
    void *own = o->stream ? o->stream(b) : NULL;
    if (!own) return r;
    if (!x->shift_q) return (ring_order){.md = RING_WAIT};
    void *side = o->side_stream && o->side_fork && o->side_join ? o->side_stream(b) : NULL;
    return (ring_order){.md = RING_QUEUED, .stream = side ? side : own, .side = side != NULL};
}

/* Starts a step's shifts as the order says: queued (their failure to queue in j->rc), on a
 * helper thread (*threaded), or here after a wait for the device. */
static void step_shifts(kb_backend *b, const ring_order *ro, shift_job *j, pthread_t *th, bool *threaded) {
    *threaded = false;
    if (!j->n) return;
    if (ro->md == RING_THREAD) {
        job_start(j, th, threaded);
        return;
    }
    if (ro->md == RING_WAIT) {
        b->ops->sync(b);
        shift_main(j);
        return;
    }
    if (ro->side) b->ops->side_fork(b);
    void *stream = ro->stream;
    for (int k = 0; k < j->n && !j->rc; k++) {
        j->rc = j->x->shift_q(j->x->ctx, j->send[k], j->recv[k], j->bytes[k], stream);
        if (j->rc) {
            j->failed = j->what[k];
            snprintf(j->err, sizeof j->err, "%s", co_err_detail());
        }
    }
}

/* After the step's block is queued: its shifts (queued on the side stream) finish before the
 * backend's stream goes on, or (a helper thread) are joined. */
static void step_join(kb_backend *b, const ring_order *ro, const shift_job *j, pthread_t *th, bool threaded) {
    if (threaded) pthread_join(*th, NULL);
    if (ro->md == RING_QUEUED && ro->side && j->n) b->ops->side_join(b);
}

/* the local K, V and doc ids into a message, by the backend's copies */
static void msg_pack(kb_backend *b, const ring_msg *m, void *buf, const ring_geo *g, const float *qkv,
                     const int32_t *doc) {
    const size_t R = (size_t)(g->nh + 2 * g->nkv) * g->hd, koff = (size_t)g->nh * g->hd;
    copy_f32_rows(b, msg_kv(m, buf), m->kw, qkv + koff, R, m->kw, m->rows);
    if (m->with_doc) b->ops->copy(b, msg_doc(m, buf), doc, m->rows * sizeof(int32_t));
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

static int ops_check(kb_backend *b, const ring_geo *g, const char *op) {
    int rc = ring_check(g);
    if (rc) return co_err_set(rc, "%s: %s", op, co_err_detail());
    const kb_ops *o = b->ops;
    if (!o->block_attention_forward || !o->block_attention_backward || !o->copy_rows || !o->ring_merge ||
        !o->bf16_to_f32)
        return co_err_set(CO_EUNSUPPORTED,
                          "%s: this backend has no block attention", op);
    return 0;
}

/* after a step: the kernels' status, then the exchange's failure */
static int step_status(kb_backend *b, const shift_job *j, const char *op, int step) {
    int rc = kernel_status(b, op, step);
    if (!rc && j->rc) rc = co_err_set(j->rc, "%s, step %d: %s exchange: %s", op, step, j->failed, j->err);
    return rc;
}

int ring_attention_forward_ws(kb_backend *b, ring_ws *ws, const ring_exchange *x, const ring_geo *g, float *out,
                              kb_bf16 *out16, float *lse, const float *qkv, const int32_t *doc) {
    static const char op[] = "ring_attention_forward";
    int rc = ops_check(b, g, op);
    if (rc) return rc;
    ring_ws tmp = {0};
    ring_ws *w = ws ? ws : &tmp;
    const int L = g->seq / g->cp, nh = g->nh, hd = g->hd;
    const size_t on = (size_t)g->B * L * nh * hd;
    const ring_order ro = order_of(b, x);
    ring_msg m;
    msg_init(&m, g, doc != NULL);
    void *cur = ws_get(b, w, RW_CUR, m.bytes), *nxt = g->cp > 1 ? ws_get(b, w, RW_NXT, m.bytes) : NULL;
    /* partial results: at most [B*L, nh*hd] and [B*nh*L]; with a bf16 output the running
     * fp32 one, rounded once when the last step is merged */
    float *po = g->cp > 1 ? ws_get(b, w, RW_PO, on * sizeof(float)) : NULL;
    float *pl = g->cp > 1 ? ws_get(b, w, RW_PL, (size_t)g->B * nh * L * sizeof(float)) : NULL;
    float *o = out16 ? ws_get(b, w, RW_OF, on * sizeof(float)) : out;
    if (!cur || !o || (g->cp > 1 && (!nxt || !po || !pl))) {
        rc = co_err_set(CO_ENOMEM, "%s: cannot allocate the ring buffers", op);
        goto done;
    }
    msg_pack(b, &m, cur, g, qkv, doc);
    for (int i = 0; i < g->cp; i++) {
        /* cur holds the KV of rank (rank - i); the KV of rank (rank - i - 1) arrives from the
         * left neighbour into nxt meanwhile (step_shifts) */
        shift_job j = {.x = x};
        if (i + 1 < g->cp) job_add(&j, cur, nxt, m.bytes, "KV");
        pthread_t th;
        bool threaded;
        step_shifts(b, &ro, &j, &th, &threaded);
        const ring_step s = step_of(g, i);
        kb_block_attn a = block_of(g, &s, &m, cur, qkv, doc);
        if (i == 0) {
            b->ops->block_attention_forward(b, &a, o, lse);
        } else {
            /* the block, then its merge into the running result, in the backend's order */
            b->ops->block_attention_forward(b, &a, po, pl);
            b->ops->ring_merge(b, o, lse, po, pl, g->B, nh, hd, L, s.q0, s.nq);
        }
        step_join(b, &ro, &j, &th, threaded);
        if ((rc = step_status(b, &j, op, i))) goto done;
        if (i + 1 < g->cp) {
            void *t = cur;
            cur = nxt, nxt = t;
        }
    }
    if (out16) b->ops->to_bf16(b, out16, o, on);
    rc = kernel_status(b, op, g->cp);
done:
    if (!ws) {
        b->ops->sync(b); /* (queued work reads the call's own buffers) */
        ws_release(&tmp);
    }
    return rc;
}

int ring_attention_forward(kb_backend *b, const ring_exchange *x, const ring_geo *g, float *out,
                           float *lse, const float *qkv, const int32_t *doc) {
    return ring_attention_forward_ws(b, NULL, x, g, out, NULL, lse, qkv, doc);
}

int ring_attention_backward_ws(kb_backend *b, ring_ws *ws, const ring_exchange *x, const ring_geo *g, float *dqkv,
                               const float *dout, const float *qkv, const float *out, const kb_bf16 *out16,
                               const float *lse, const int32_t *doc) {
    static const char op[] = "ring_attention_backward";
    int rc = ops_check(b, g, op);
    if (rc) return rc;
    ring_ws tmp = {0};
    ring_ws *w = ws ? ws : &tmp;
    const int L = g->seq / g->cp, S = L / 2, nh = g->nh, nkv = g->nkv, hd = g->hd;
    const size_t R = (size_t)(nh + 2 * nkv) * hd, AH = (size_t)nh * hd;
    const ring_order ro = order_of(b, x);
    /* KV (with the doc ids) and the dK/dV accumulators travel in separate messages. At step i
     * the accumulator finished at step i-1 goes on (the one of the KV held now, which the
     * ranks before us filled, arrives) and then step i+1's KV is fetched, while the block
     * computes this rank's dK/dV of the current KV into dloc; after it the accumulator is
     * finished: dfin = dacc + dloc. The last one goes home by a shift after the last step
     * (the one exchange not beside a block). */
    ring_msg m;
    msg_init(&m, g, doc != NULL);
    const size_t dn = m.rows * m.kw, dbytes = dn * sizeof(float);
    void *cur = ws_get(b, w, RW_CUR, m.bytes), *nxt = g->cp > 1 ? ws_get(b, w, RW_NXT, m.bytes) : NULL;
    float *dloc = ws_get(b, w, RW_DLOC, dbytes), *dfin = ws_get(b, w, RW_DFIN, dbytes);
    float *dacc = g->cp > 1 ? ws_get(b, w, RW_DACC, dbytes) : NULL;
    /* a bf16 output widened (exactly) for D = rowsum(O dO), as attention_backward_bf16 reads it */
    const float *of = out16 ? ws_get(b, w, RW_OF, (size_t)g->B * L * AH * sizeof(float)) : out;
    /* the upper half's out, dout and lse gathered contiguous for the i > rank steps */
    const int need_half = g->rank < g->cp - 1;
    float *ho = need_half ? ws_get(b, w, RW_HO, (size_t)g->B * S * AH * sizeof(float)) : NULL;
    float *hdo = need_half ? ws_get(b, w, RW_HDO, (size_t)g->B * S * AH * sizeof(float)) : NULL;
    float *hl = need_half ? ws_get(b, w, RW_HL, (size_t)g->B * nh * S * sizeof(float)) : NULL;
    if (!cur || !dloc || !dfin || !of || (g->cp > 1 && (!nxt || !dacc)) || (need_half && (!ho || !hdo || !hl))) {
        rc = co_err_set(CO_ENOMEM, "%s: cannot allocate the ring buffers", op);
        goto done;
    }
    if (out16) b->ops->bf16_to_f32(b, (float *)of, out16, (size_t)g->B * L * AH);
    if (need_half) {
        copy_f32_rows(b, ho, (size_t)S * AH, of + (size_t)S * AH, (size_t)L * AH, (size_t)S * AH, g->B);
        copy_f32_rows(b, hdo, (size_t)S * AH, dout + (size_t)S * AH, (size_t)L * AH, (size_t)S * AH, g->B);
        copy_f32_rows(b, hl, S, lse + S, L, S, (size_t)g->B * nh);
    }
    b->ops->zero(b, dqkv, (size_t)g->B * L * R);
    msg_pack(b, &m, cur, g, qkv, doc);
    for (int i = 0; i < g->cp; i++) {
        /* cur: the KV of rank (rank - i) */
        shift_job j = {.x = x};
        if (i > 0) job_add(&j, dfin, dacc, dbytes, "dKV");
        if (i + 1 < g->cp) job_add(&j, cur, nxt, m.bytes, "KV");
        pthread_t th;
        bool threaded;
        step_shifts(b, &ro, &j, &th, &threaded);
        const ring_step s = step_of(g, i);
        kb_block_attn a = block_of(g, &s, &m, cur, qkv, doc);
        const int half = s.q0 != 0;
        b->ops->zero(b, dloc, dn);
        b->ops->block_attention_backward(b, &a, half ? ho : of, half ? hl : lse, half ? hdo : dout,
                                         dqkv + (size_t)s.q0 * R, R, dloc, m.kw, dloc + (size_t)nkv * hd, m.kw);
        /* (the shifts send dfin and receive dacc: both are touched only after the join) */
        step_join(b, &ro, &j, &th, threaded);
        if ((rc = step_status(b, &j, op, i))) goto done;
        if (i == 0) {
            float *t = dfin; /* our own KV: nobody added before us */
            dfin = dloc, dloc = t;
        } else {
            b->ops->add(b, dfin, dacc, dloc, dn); /* (queued behind the join of the shifts) */
        }
        if (i + 1 < g->cp) {
            void *t = cur;
            cur = nxt, nxt = t;
        }
    }
    const float *dkv = dfin;
    if (g->cp > 1) {
        /* the accumulator finished last belongs to rank + 1; ours arrives from rank - 1 */
        shift_job j = {.x = x};
        job_add(&j, dfin, dacc, dbytes, "dKV");
        bool threaded;
        ring_order last = ro;
        if (last.md == RING_THREAD) last.md = RING_WAIT; /* (nothing to overlap: here, blocking) */
        pthread_t none;
        step_shifts(b, &last, &j, &none, &threaded);
        step_join(b, &last, &j, &none, threaded);
        if (j.rc) {
            rc = co_err_set(j.rc, "%s: returning dKV to its owner: %s", op, j.err);
            goto done;
        }
        dkv = dacc;
    }
    copy_f32_rows(b, dqkv + AH, R, dkv, m.kw, m.kw, m.rows);
    rc = kernel_status(b, op, g->cp);
done:
    if (!ws) {
        b->ops->sync(b);
        ws_release(&tmp);
    }
    return rc;
}

int ring_attention_backward(kb_backend *b, const ring_exchange *x, const ring_geo *g,
                            float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int32_t *doc) {
    return ring_attention_backward_ws(b, NULL, x, g, dqkv, dout, qkv, out, NULL, lse, doc);
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

/* The shift queued on a CUDA stream: the send and the receive as one NCCL group, so that
 * no rank's send waits for its own receive (cm_ops.p2p_q) */
static int comm_shift_q(void *ctx, const void *send, void *recv, size_t n, void *stream) {
    ring_comm *rc = ctx;
    cm_comm *c = rc->c;
    const int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    cm_p2p ops[2] = {{.c = c, .buf = (void *)send, .bytes = n, .peer = next, .send = 1},
                     {.c = c, .buf = recv, .bytes = n, .peer = prev, .send = 0}};
    int e = c->ops->p2p_q(ops, 2, stream);
    if (e) return co_err_set(e, "ring shift (queued) to rank %d, from rank %d: %s", next, prev, co_err_detail());
    return 0;
}

void ring_exchange_comm(ring_exchange *x, ring_comm *rc) {
    x->shift = comm_shift;
    x->shift_q = rc->c->ops->p2p_q && rc->c->size > 1 ? comm_shift_q : NULL;
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
    x->shift_q = NULL;
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
