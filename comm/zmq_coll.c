/* zmq_coll.c - the collective algorithms over the transport: all-reduce (direct for small
 * calls, ring otherwise, shared memory where every member shares it: zmq_shm.c), broadcast,
 * all-gather, reduce-scatter, barrier, point-to-point send and receive. */
#include "comm/zmq_internal.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "comm/shm_seg.h"
#include "comm/zmq_auth.h"
#include "common/error.h"

/* dst[i] = dst[i] + src[i]; either side may be unaligned (received payloads). */
static void cm__add_into(void *dstv, const void *srcv, size_t n, cm_dtype dt) {
    unsigned char *d = dstv;
    const unsigned char *s = srcv;
    if (dt == CM_F32) {
        for (size_t i = 0; i < n; i++) {
            float a, b;
            memcpy(&a, d + 4 * i, 4);
            memcpy(&b, s + 4 * i, 4);
            a = a + b;
            memcpy(d + 4 * i, &a, 4);
        }
    } else if (dt == CM_F64) {
        for (size_t i = 0; i < n; i++) {
            double a, b;
            memcpy(&a, d + 8 * i, 8);
            memcpy(&b, s + 8 * i, 8);
            a = a + b;
            memcpy(d + 8 * i, &a, 8);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint64_t a, b; /* wrapping sum of i64 */
            memcpy(&a, d + 8 * i, 8);
            memcpy(&b, s + 8 * i, 8);
            a = a + b;
            memcpy(d + 8 * i, &a, 8);
        }
    }
}

/* a[i] = b[i] = a[i] + b[i]: the last reduce-scatter step of the all-reduce, which both
 * keeps the sum and forwards it, in one pass. a is a received payload (maybe unaligned). */
static void cm__add_both(void *av, void *bv, size_t n, cm_dtype dt) {
    unsigned char *a = av, *b = bv;
    if (dt == CM_F32) {
        for (size_t i = 0; i < n; i++) {
            float x, y;
            memcpy(&x, a + 4 * i, 4);
            memcpy(&y, b + 4 * i, 4);
            x = x + y;
            memcpy(a + 4 * i, &x, 4);
            memcpy(b + 4 * i, &x, 4);
        }
    } else if (dt == CM_F64) {
        for (size_t i = 0; i < n; i++) {
            double x, y;
            memcpy(&x, a + 8 * i, 8);
            memcpy(&y, b + 8 * i, 8);
            x = x + y;
            memcpy(a + 8 * i, &x, 8);
            memcpy(b + 8 * i, &x, 8);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint64_t x, y;
            memcpy(&x, a + 8 * i, 8);
            memcpy(&y, b + 8 * i, 8);
            x = x + y;
            memcpy(a + 8 * i, &x, 8);
            memcpy(b + 8 * i, &x, 8);
        }
    }
}

/* ---------------------------------------------------------------- collectives */

/* Start of every call: sticky failure / abort check, then a header for this operation. */
static int cm__begin(cm__group *g, int op, cm_dtype dt, uint64_t aux, uint32_t arg, cm__hdr *h) {
    int rc = cm__check(g->tp);
    if (rc) return rc;
    memset(h, 0, sizeof *h);
    h->kind = CM__K_COLL;
    h->op = (uint8_t)op;
    h->dt = (uint8_t)dt;
    h->group = g->id;
    h->seq = g->coll_seq++;
    h->aux = aux;
    h->arg = arg;
    return 0;
}

static int cm__send_to(cm__group *g, int gdst, cm__hdr *h, uint32_t tag, zmq_msg_t *m,
                       int64_t deadline) {
    h->tag = tag;
    return cm__send_hdr_payload(g->tp, g->world[gdst], h, m, deadline);
}

static int cm__send_copy_to(cm__group *g, int gdst, cm__hdr *h, uint32_t tag, const void *p,
                            size_t len, int64_t deadline) {
    h->tag = tag;
    return cm__send_copy(g->tp, g->world[gdst], h, p, len, deadline);
}

static int cm__recv_from(cm__group *g, int gsrc, cm__hdr *h, uint32_t tag, size_t len,
                         zmq_msg_t *out, int64_t deadline) {
    h->tag = tag;
    return cm__recv(g, h->kind, gsrc, h, len, out, deadline);
}

/* Segment j of count elements split n ways: [*off, *off + *len). */
void cm__seg(size_t count, int n, int j, size_t *off, size_t *len) {
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    *off = (size_t)j * base + ((size_t)j < rem ? (size_t)j : rem);
    *len = base + ((size_t)j < rem);
}

static int cm__mod(int a, int n) { return ((a % n) + n) % n; }

/* Direct exchange: every rank sends its whole contribution (own_bytes from `own`, already
 * copied into *own_msg) to every peer; result = x_0 + x_1 + ... in rank order. */
static int cm__allreduce_direct(cm__group *g, cm__hdr *h, void *buf, size_t count, cm_dtype dt,
                                int64_t deadline) {
    int n = g->pub.size, me = g->pub.rank;
    size_t bytes = count * cm__dt_size(dt);
    zmq_msg_t own;
    if (zmq_msg_init_size(&own, bytes) != 0) return cm__fail(g->tp, CO_ENOMEM, "allreduce buffer");
    memcpy(zmq_msg_data(&own), buf, bytes);
    int rc = 0;
    for (int k = 1; k < n && !rc; k++) {
        int dst = (me + k) % n;
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_copy(&m, &own); /* shares the content */
        rc = cm__send_to(g, dst, h, 0, &m, deadline);
    }
    for (int r = 0; r < n && !rc; r++) {
        zmq_msg_t in, *x = &own;
        if (r != me) {
            zmq_msg_init(&in);
            rc = cm__recv_from(g, r, h, 0, bytes, &in, deadline);
            if (rc) break;
            x = &in;
        }
        if (r == 0)
            memcpy(buf, zmq_msg_data(x), bytes);
        else
            cm__add_into(buf, zmq_msg_data(x), count, dt);
        if (x == &in) zmq_msg_close(&in);
    }
    zmq_msg_close(&own);
    return rc;
}

/* Ring: reduce-scatter (steps 0..n-2) then all-gather (steps n-1..2n-3), in chunks; each
 * received chunk is reduced inside the message and forwarded, so chunks stream round the
 * ring. Segment j's sum is x_j + x_{j+1} + ... + x_{j-1} (ring order), every rank ends with
 * the bits of the rank that completed it. */
static int cm__allreduce_ring(cm__group *g, cm__hdr *h, void *bufv, size_t count, cm_dtype dt,
                              int64_t deadline) {
    cm__tp *t = g->tp;
    int n = g->pub.size, me = g->pub.rank;
    int nxt = (me + 1) % n, prv = cm__mod(me - 1, n);
    size_t es = cm__dt_size(dt), ce = t->opt.chunk_bytes / es;
    /* at least four chunks per segment, so that they pipeline round the ring, but none
     * under 256 KiB; every rank derives the same size from (count, n) */
    size_t quarter = count / (size_t)n / 4, floor_e = ((size_t)256 << 10) / es;
    if (quarter < floor_e) quarter = floor_e;
    if (quarter < ce) ce = quarter;
    unsigned char *buf = bufv;
    uint32_t tag_out = 0, tag_in = 0;
    int last = 2 * n - 3;
    size_t off, len;
    cm__seg(count, n, me, &off, &len);
    for (size_t c = 0; c < len; c += ce) {
        size_t k = len - c < ce ? len - c : ce;
        int rc = cm__send_copy_to(g, nxt, h, tag_out++, buf + (off + c) * es, k * es, deadline);
        if (rc) return rc;
    }
    for (int s = 0; s <= last; s++) {
        int seg = s < n - 1 ? cm__mod(me - s - 1, n) : cm__mod(me - (s - (n - 1)), n);
        cm__seg(count, n, seg, &off, &len);
        for (size_t c = 0; c < len; c += ce) {
            size_t k = len - c < ce ? len - c : ce;
            unsigned char *dst = buf + (off + c) * es;
            zmq_msg_t m;
            zmq_msg_init(&m);
            int rc = cm__recv_from(g, prv, h, tag_in++, k * es, &m, deadline);
            if (rc) return rc;
            if (s < n - 2)
                cm__add_into(zmq_msg_data(&m), dst, k, dt); /* partial sum: forwarded only */
            else if (s == n - 2)
                cm__add_both(zmq_msg_data(&m), dst, k, dt); /* this rank completes the segment */
            else
                memcpy(dst, zmq_msg_data(&m), k * es);
            if (s < last) {
                rc = cm__send_to(g, nxt, h, tag_out++, &m, deadline);
                if (rc) return rc;
            } else {
                zmq_msg_close(&m);
            }
        }
    }
    return 0;
}

int cm__allreduce(cm_comm *c, void *buf, size_t count, cm_dtype dt, int timeout_ms) {
    cm__group *g = cm__g(c);
    size_t es = cm__dt_size(dt);
    if (!es || (count && !buf) || count > SIZE_MAX / 8)
        return co_err_set(CO_EINVAL, "allreduce: bad dtype %d or buffer", (int)dt);
    cm__hdr h;
    int rc = cm__begin(g, CM__OP_ALLREDUCE, dt, count, 0, &h);
    if (rc || c->size == 1 || count == 0) return rc;
    int64_t dl = cm__deadline(timeout_ms);
    if (g->shm) return cm__allreduce_shm(g, &h, buf, count, dt, dl);
    if (count * es <= g->tp->opt.small_bytes) return cm__allreduce_direct(g, &h, buf, count, dt, dl);
    return cm__allreduce_ring(g, &h, buf, count, dt, dl);
}

/* Chain from root: root -> root+1 -> ... in chunks, each forwarded as it arrives. */
int cm__broadcast(cm_comm *c, void *bufv, size_t bytes, int root, int timeout_ms) {
    cm__group *g = cm__g(c);
    if (root < 0 || root >= c->size || (bytes && !bufv))
        return co_err_set(CO_EINVAL, "broadcast: root %d of %d or buffer", root, c->size);
    cm__hdr h;
    int rc = cm__begin(g, CM__OP_BCAST, 0, bytes, (uint32_t)root, &h);
    if (rc || c->size == 1 || bytes == 0) return rc;
    int n = c->size, me = c->rank, pos = cm__mod(me - root, n);
    int nxt = (me + 1) % n, prv = cm__mod(me - 1, n);
    size_t cb = g->tp->opt.chunk_bytes;
    int64_t dl = cm__deadline(timeout_ms);
    unsigned char *buf = bufv;
    uint32_t tag = 0;
    for (size_t o = 0; o < bytes; o += cb, tag++) {
        size_t k = bytes - o < cb ? bytes - o : cb;
        if (pos == 0) {
            rc = cm__send_copy_to(g, nxt, &h, tag, buf + o, k, dl);
        } else {
            zmq_msg_t m;
            zmq_msg_init(&m);
            rc = cm__recv_from(g, prv, &h, tag, k, &m, dl);
            if (rc) return rc;
            memcpy(buf + o, zmq_msg_data(&m), k);
            if (pos < n - 1)
                rc = cm__send_to(g, nxt, &h, tag, &m, dl);
            else
                zmq_msg_close(&m);
        }
        if (rc) return rc;
    }
    return 0;
}

/* Ring: at step s rank r passes block r-s on and receives block r-s-1. */
int cm__allgather(cm_comm *c, const void *sendv, void *recvv, size_t bytes, int timeout_ms) {
    cm__group *g = cm__g(c);
    if (bytes && (!sendv || !recvv)) return co_err_set(CO_EINVAL, "allgather: null buffer");
    cm__hdr h;
    int rc = cm__begin(g, CM__OP_ALLGATHER, 0, bytes, 0, &h);
    if (rc || bytes == 0) return rc;
    int n = c->size, me = c->rank;
    unsigned char *recv = recvv;
    if (recv + (size_t)me * bytes != (const unsigned char *)sendv)
        memmove(recv + (size_t)me * bytes, sendv, bytes);
    if (n == 1) return 0;
    int nxt = (me + 1) % n, prv = cm__mod(me - 1, n);
    size_t cb = g->tp->opt.chunk_bytes;
    int64_t dl = cm__deadline(timeout_ms);
    uint32_t tag_out = 0, tag_in = 0;
    for (size_t o = 0; o < bytes; o += cb) {
        size_t k = bytes - o < cb ? bytes - o : cb;
        rc = cm__send_copy_to(g, nxt, &h, tag_out++, recv + (size_t)me * bytes + o, k, dl);
        if (rc) return rc;
    }
    for (int s = 0; s < n - 1; s++) {
        unsigned char *blk = recv + (size_t)cm__mod(me - s - 1, n) * bytes;
        for (size_t o = 0; o < bytes; o += cb) {
            size_t k = bytes - o < cb ? bytes - o : cb;
            zmq_msg_t m;
            zmq_msg_init(&m);
            rc = cm__recv_from(g, prv, &h, tag_in++, k, &m, dl);
            if (rc) return rc;
            memcpy(blk + o, zmq_msg_data(&m), k);
            if (s < n - 2) {
                rc = cm__send_to(g, nxt, &h, tag_out++, &m, dl);
                if (rc) return rc;
            } else {
                zmq_msg_close(&m);
            }
        }
    }
    return 0;
}

/* Ring: at step s rank r sends (the partial sum of) block r-s-1 and receives block r-s-2;
 * after n-1 steps it holds block r. Small blocks: each rank sends block j to rank j, which
 * sums them in rank order. */
int cm__reduce_scatter(cm_comm *c, const void *sendv, void *recvv, size_t count,
                       cm_dtype dt, int timeout_ms) {
    cm__group *g = cm__g(c);
    size_t es = cm__dt_size(dt);
    if (!es || (count && (!sendv || !recvv)) || count > SIZE_MAX / 8 / (size_t)c->size)
        return co_err_set(CO_EINVAL, "reduce_scatter: bad dtype %d or buffer", (int)dt);
    cm__hdr h;
    int rc = cm__begin(g, CM__OP_RSCATTER, dt, count, 0, &h);
    if (rc || count == 0) return rc;
    int n = c->size, me = c->rank;
    const unsigned char *send = sendv;
    unsigned char *recv = recvv;
    size_t bytes = count * es;
    if (n == 1) {
        memmove(recv, send, bytes);
        return 0;
    }
    int64_t dl = cm__deadline(timeout_ms);
    if (bytes <= g->tp->opt.small_bytes) {
        for (int k = 1; k < n; k++) {
            int dst = (me + k) % n;
            rc = cm__send_copy_to(g, dst, &h, 0, send + (size_t)dst * bytes, bytes, dl);
            if (rc) return rc;
        }
        zmq_msg_t own;
        if (zmq_msg_init_size(&own, bytes) != 0) return cm__fail(g->tp, CO_ENOMEM, "reduce_scatter");
        memcpy(zmq_msg_data(&own), send + (size_t)me * bytes, bytes); /* recv may alias it */
        for (int r = 0; r < n && !rc; r++) {
            zmq_msg_t in, *x = &own;
            if (r != me) {
                zmq_msg_init(&in);
                rc = cm__recv_from(g, r, &h, 0, bytes, &in, dl);
                if (rc) break;
                x = &in;
            }
            if (r == 0)
                memcpy(recv, zmq_msg_data(x), bytes);
            else
                cm__add_into(recv, zmq_msg_data(x), count, dt);
            if (x == &in) zmq_msg_close(&in);
        }
        zmq_msg_close(&own);
        return rc;
    }
    int nxt = (me + 1) % n, prv = cm__mod(me - 1, n);
    size_t ce = g->tp->opt.chunk_bytes / es;
    uint32_t tag_out = 0, tag_in = 0;
    const unsigned char *first = send + (size_t)cm__mod(me - 1, n) * bytes;
    for (size_t o = 0; o < count; o += ce) {
        size_t k = count - o < ce ? count - o : ce;
        rc = cm__send_copy_to(g, nxt, &h, tag_out++, first + o * es, k * es, dl);
        if (rc) return rc;
    }
    for (int s = 0; s < n - 1; s++) {
        const unsigned char *blk = send + (size_t)cm__mod(me - s - 2, n) * bytes;
        for (size_t o = 0; o < count; o += ce) {
            size_t k = count - o < ce ? count - o : ce;
            zmq_msg_t m;
            zmq_msg_init(&m);
            rc = cm__recv_from(g, prv, &h, tag_in++, k * es, &m, dl);
            if (rc) return rc;
            cm__add_into(zmq_msg_data(&m), blk + o * es, k, dt);
            if (s < n - 2) {
                rc = cm__send_to(g, nxt, &h, tag_out++, &m, dl);
                if (rc) return rc;
            } else {
                memcpy(recv + o * es, zmq_msg_data(&m), k * es);
                zmq_msg_close(&m);
            }
        }
    }
    return 0;
}

/* Everyone tells everyone it has arrived. */
int cm__barrier_op(cm__group *g, int op, int64_t dl) {
    cm__hdr h;
    int rc = cm__begin(g, op, 0, 0, 0, &h);
    if (rc) return rc;
    int n = g->pub.size, me = g->pub.rank;
    for (int k = 1; k < n; k++) {
        rc = cm__send_copy_to(g, (me + k) % n, &h, 0, NULL, 0, dl);
        if (rc) return rc;
    }
    for (int k = 1; k < n; k++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        rc = cm__recv_from(g, cm__mod(me - k, n), &h, 0, 0, &m, dl);
        if (rc) return rc;
        zmq_msg_close(&m);
    }
    return 0;
}

int cm__barrier(cm_comm *c, int timeout_ms) {
    return cm__barrier_op(cm__g(c), CM__OP_BARRIER, cm__deadline(timeout_ms));
}

/* Point to point: chunks on the group's p2p channel; aux carries the total size so that
 * a send and a recv of different sizes are reported. */
int cm__send(cm_comm *c, const void *bufv, size_t bytes, int peer, int timeout_ms) {
    cm__group *g = cm__g(c);
    if (peer < 0 || peer >= c->size || peer == c->rank || (bytes && !bufv))
        return co_err_set(CO_EINVAL, "send: peer %d of %d (self %d) or buffer", peer, c->size,
                          c->rank);
    int rc = cm__check(g->tp);
    if (rc) return rc;
    cm__hdr h = {.kind = CM__K_P2P, .op = CM__OP_P2P, .group = g->id,
                 .seq = g->p2p_send[peer]++, .aux = bytes};
    int64_t dl = cm__deadline(timeout_ms);
    size_t cb = g->tp->opt.chunk_bytes;
    const unsigned char *buf = bufv;
    uint32_t tag = 0;
    size_t o = 0;
    do {
        size_t k = bytes - o < cb ? bytes - o : cb;
        rc = cm__send_copy_to(g, peer, &h, tag++, buf + o, k, dl);
        if (rc) return rc;
        o += k;
    } while (o < bytes);
    return 0;
}

int cm__recv_p2p(cm_comm *c, void *bufv, size_t bytes, int peer, int timeout_ms) {
    cm__group *g = cm__g(c);
    if (peer < 0 || peer >= c->size || peer == c->rank || (bytes && !bufv))
        return co_err_set(CO_EINVAL, "recv: peer %d of %d (self %d) or buffer", peer, c->size,
                          c->rank);
    int rc = cm__check(g->tp);
    if (rc) return rc;
    cm__hdr h = {.kind = CM__K_P2P, .op = CM__OP_P2P, .group = g->id,
                 .seq = g->p2p_recv[peer]++, .aux = bytes};
    int64_t dl = cm__deadline(timeout_ms);
    size_t cb = g->tp->opt.chunk_bytes;
    unsigned char *buf = bufv;
    uint32_t tag = 0;
    size_t o = 0;
    do {
        size_t k = bytes - o < cb ? bytes - o : cb;
        zmq_msg_t m;
        zmq_msg_init(&m);
        rc = cm__recv_from(g, peer, &h, tag++, k, &m, dl);
        if (rc) return rc;
        if (k) memcpy(buf + o, zmq_msg_data(&m), k);
        zmq_msg_close(&m);
        o += k;
    } while (o < bytes);
    return 0;
}

/* All-to-all with uneven blocks: every rank first sends each peer its block (in chunks, at
 * least one message even when empty, each header carrying the block's size so that the
 * receiver checks it against recv_bytes), starting with the next rank, then receives from
 * each peer, starting with the previous one. Sends never wait on a receiver (the transport
 * stashes what arrives early), so no order of calls deadlocks. */
int cm__alltoallv(cm_comm *c, const void *sendv, const size_t *send_bytes, void *recvv,
                  const size_t *recv_bytes, int timeout_ms) {
    cm__group *g = cm__g(c);
    int n = c->size, me = c->rank;
    if (!send_bytes || !recv_bytes) return co_err_set(CO_EINVAL, "alltoall: null size list");
    size_t stot = 0, rtot = 0;
    for (int j = 0; j < n; j++) {
        if (send_bytes[j] > SIZE_MAX / 2 - stot || recv_bytes[j] > SIZE_MAX / 2 - rtot)
            return co_err_set(CO_EINVAL, "alltoall: block sizes overflow");
        stot += send_bytes[j];
        rtot += recv_bytes[j];
    }
    if ((stot && !sendv) || (rtot && !recvv)) return co_err_set(CO_EINVAL, "alltoall: null buffer");
    if (send_bytes[me] != recv_bytes[me])
        return co_err_set(CO_EINVAL, "alltoall: rank %d sends itself %zu bytes but expects %zu", me,
                          send_bytes[me], recv_bytes[me]);
    cm__hdr h;
    int rc = cm__begin(g, CM__OP_ALLTOALL, 0, 0, 0, &h);
    if (rc) return rc;
    const unsigned char *send = sendv;
    unsigned char *recv = recvv;
    size_t *soff = malloc(2 * (size_t)n * sizeof *soff);
    if (!soff) return cm__fail(g->tp, CO_ENOMEM, "alltoall");
    size_t *roff = soff + n;
    soff[0] = roff[0] = 0;
    for (int j = 1; j < n; j++) {
        soff[j] = soff[j - 1] + send_bytes[j - 1];
        roff[j] = roff[j - 1] + recv_bytes[j - 1];
    }
    if (send_bytes[me]) memcpy(recv + roff[me], send + soff[me], send_bytes[me]);
    int64_t dl = cm__deadline(timeout_ms);
    size_t cb = g->tp->opt.chunk_bytes;
    for (int k = 1; k < n && !rc; k++) {
        int dst = (me + k) % n;
        size_t bytes = send_bytes[dst], o = 0;
        uint32_t tag = 0;
        h.aux = bytes;
        do {
            size_t len = bytes - o < cb ? bytes - o : cb;
            rc = cm__send_copy_to(g, dst, &h, tag++, send + soff[dst] + o, len, dl);
            o += len;
        } while (!rc && o < bytes);
    }
    for (int k = 1; k < n && !rc; k++) {
        int src = cm__mod(me - k, n);
        size_t bytes = recv_bytes[src], o = 0;
        uint32_t tag = 0;
        h.aux = bytes;
        do {
            size_t len = bytes - o < cb ? bytes - o : cb;
            zmq_msg_t m;
            zmq_msg_init(&m);
            rc = cm__recv_from(g, src, &h, tag++, len, &m, dl);
            if (rc) break;
            if (len) memcpy(recv + roff[src] + o, zmq_msg_data(&m), len);
            zmq_msg_close(&m);
            o += len;
        } while (o < bytes);
    }
    free(soff);
    return rc;
}
