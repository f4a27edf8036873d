/* zmq_comm.c - CPU collectives over ZeroMQ (see zmq_comm.h for the design).
 *
 * Transport: one ROUTER per rank (bound at its endpoint) receives from every peer; one
 * DEALER per peer sends to it, with routing id 'R' + world rank. Between two ranks there
 * is one DEALER->ROUTER connection, so messages from a peer arrive in the order sent.
 * Every message is [header][payload]; the header names the group, the kind (collective or
 * point-to-point), the operation, its sequence number and arguments, so a mismatched call
 * on two ranks is reported as CO_EPROTOCOL rather than producing garbage. Messages that
 * arrive before they are wanted wait in a per-peer stash (zmq_msg_t moved, no copy).
 *
 * Sends never block (no high-water mark); received payloads are reduced in place inside
 * the received zmq_msg_t and forwarded as they are, so the ring moves each byte with one
 * kernel copy per hop and no user-space copy except the rank's own contribution (copied
 * into a message, so ZeroMQ never holds a pointer into a caller's buffer).
 *
 * Waiting: zmq_poll over the ROUTER, an eventfd written by abort(), and one monitor socket
 * per DEALER (disconnect events), in slices of at most 100 ms; deadline, abort flag and
 * dead peers are checked on every slice. Any failure is fatal for the transport: it sends a
 * FAIL message naming the root cause to every peer, closes the sockets and stays failed.
 *
 * Shared memory (ranks on one host; setup in cm_zmq_new, segments in shm_seg.c): each rank
 * owns a segment of CM__SHM_SLOTS slots of shm_block_bytes and writes only its own; peers
 * read it. All-reduce block b uses slot b % SLOTS on every member. The owner waits until
 * the slot's `readers` count (left by its last use, in any group) is 0, copies in the pieces
 * of the block the other members own, sets readers = 2(n-1) and stores the block's stamp
 * (a hash of group, call sequence number and block) in `posted`. The owner of piece j waits
 * for every member's `posted` stamp, checks the member's call (count, dtype: a mismatch is
 * CO_EPROTOCOL), sums piece j over members in rank order from their slots (its own
 * contribution from the caller's buffer) into its buffer and into its slot, releases the
 * members' slots (readers - 1) and stores `reduced`; every rank copies the other pieces from
 * their owners' slots once their `reduced` stamp is there, and releases those. Up to
 * SLOTS - 1 blocks are posted ahead, so a rank that waits has left work for the others.
 * One block of at most small_bytes is direct: every member sums the whole block itself.
 * Each byte thus moves by memcpy and adds in user space, without kernel copies or
 * ZeroMQ's I/O threads; with 4 ranks on 2 cores that is what matters.
 *
 * Shared-memory waits never spin (ranks may outnumber cores): a waiter sets its `sleeping`
 * flag, re-checks the word it waits for and sleeps in zmq_poll over the same items as
 * above plus its doorbell eventfd, one slice at most; whoever stores a stamp or hands a
 * slot back writes the doorbell of a sleeping peer (sequentially consistent stores and
 * loads on both sides, so no wake-up is lost). Between sleeps it reads ZeroMQ, so a FAIL,
 * an abort, a disconnect, the deadline or a peer's ZeroMQ message for the same call (the
 * peer made another call: CO_EPROTOCOL) end the wait as they end any other. */
#include "comm/zmq_comm.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "comm/shm_seg.h"
#include "comm/zmq_auth.h"
#include "common/error.h"

#define CM__MAGIC 0x315A4D43u /* "CMZ1" */
#define CM__HDR 40
#define CM__SLICE_MS 100
#define CM__FAIL_LINGER_MS 200
#define CM__MSG_MAX 480
#define CM__HELLO_BYTES 48
#ifndef CM__SHM_SLOTS
#define CM__SHM_SLOTS 4        /* slots per segment: blocks in flight per rank */
#define CM__SHM_AHEAD 3        /* blocks posted ahead of the one being reduced */
#define CM__SHM_LAG 0          /* blocks gathered behind the one being reduced */
#endif
/* A rank posting block b + AHEAD waits for the readers of block b + AHEAD - SLOTS; with
 * AHEAD + LAG < SLOTS those never wait, in turn, for this rank. */
_Static_assert(CM__SHM_AHEAD + CM__SHM_LAG < CM__SHM_SLOTS && CM__SHM_AHEAD >= 1, "no deadlock");
#define CM__SHM_MAX_RANKS 256  /* shared memory is offered in worlds up to this size */

enum { CM__K_HELLO = 1, CM__K_COLL = 2, CM__K_P2P = 3, CM__K_FAIL = 4, CM__K_SHM = 5 };
enum { CM__SHM_FDS = 1, CM__SHM_LIST = 2 }; /* arg of a CM__K_SHM message */
enum { CM__SS_FDS = 1, CM__SS_MAPPED = 2, CM__SS_LIST = 4 }; /* shm_state bits */
enum {
    CM__OP_NONE = 0,
    CM__OP_ALLREDUCE = 1,
    CM__OP_BCAST = 2,
    CM__OP_ALLGATHER = 3,
    CM__OP_RSCATTER = 4,
    CM__OP_BARRIER = 5,
    CM__OP_SPLIT = 6,
    CM__OP_P2P = 7,
};
static const char *const cm__op_name[] = {"?",       "allreduce",      "broadcast", "allgather",
                                          "reduce_scatter", "barrier", "split",     "send/recv"};

typedef struct cm__hdr {
    uint8_t kind, op, dt;
    uint64_t group, aux;
    uint32_t seq, tag, arg;
} cm__hdr;

typedef struct cm__ent {
    struct cm__ent *next;
    cm__hdr h;
    zmq_msg_t data;
} cm__ent;

typedef struct cm__tp {
    void *ctx, *router;
    bool curve_router; /* the ROUTER is a CURVE server: senders are known by User-Id */
    cm__zap *zap;      /* its ZAP handler */
    void **dealer; /* [size], NULL for self */
    void **mon;    /* [size] PAIR sockets reading each DEALER's monitor */
    zmq_pollitem_t *items;
    int nitems;
    int efd;
    atomic_int aborted;
    int failed; /* 0 or the sticky CO_E* code */
    bool closed;
    char fail_msg[CM__MSG_MAX];
    int rank, size, refs;
    cm_zmq_options opt;
    int64_t *dead_at; /* [size] monotonic ms of the disconnect, 0 = connected */
    bool *hello;      /* [size] */
    cm__ent **head, **tail; /* [size] stash per source */
    cm__ent *free_ents;
    /* shared memory with the ranks on this host (see the top of this file) */
    bool shm_on;          /* this rank offers its segment */
    uint64_t nonce;       /* this transport's, in HELLO and in the segment; 0 = no offer */
    int shm_sock;         /* descriptor socket (during cm_zmq_new only), -1 = none */
    char *shm_sock_path;
    int shm_memfd;        /* own segment's memfd (during cm_zmq_new only) */
    char **shm_path;      /* [size] peers' descriptor sockets, NULL = peer not on ipc */
    cm_shm_seg *seg;      /* [size] mapped segments; seg[rank] is this rank's own */
    uint64_t *peer_nonce; /* [size] from HELLO, 0 = the peer offers no segment */
    int *pend_mem, *pend_efd; /* [size] descriptors received, not yet mapped, -1 = none */
    uint64_t *pend_nonce;
    uint8_t *shm_state;   /* [size] CM__SS_* */
    uint8_t *pair;        /* [size * size]: pair[a * size + b] = rank a mapped b's segment */
} cm__tp;

typedef struct cm__split_rec {
    uint64_t key;
    uint32_t count;
} cm__split_rec;

typedef struct cm__group {
    cm_comm pub;
    cm__tp *tp;
    uint64_t id;
    int *world; /* [n] group rank -> world rank */
    uint32_t coll_seq;
    uint32_t *p2p_send, *p2p_recv; /* [n] sequence per peer */
    cm__split_rec *splits;
    int nsplits;
    bool shm; /* every pair of members shares memory: all-reduce goes through it */
} cm__group;

static const cm_ops cm__zmq_ops;

/* ---------------------------------------------------------------- small helpers */

static int64_t cm__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t cm__deadline(int timeout_ms) {
    return timeout_ms < 0 ? -1 : cm__now_ms() + timeout_ms;
}

static size_t cm__dt_size(cm_dtype dt) {
    switch (dt) {
    case CM_F32: return 4;
    case CM_F64: return 8;
    case CM_I64: return 8;
    }
    return 0;
}

static void cm__put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void cm__put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t cm__get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t cm__get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

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

/* ---------------------------------------------------------------- transport failure */

static void cm__tp_close(cm__tp *t, int dealer_linger) {
    if (t->closed) return;
    t->closed = true;
    int zero = 0;
    for (int r = 0; r < t->size; r++) {
        if (t->dealer[r]) {
            zmq_setsockopt(t->dealer[r], ZMQ_LINGER, &dealer_linger, sizeof dealer_linger);
            zmq_socket_monitor(t->dealer[r], NULL, 0);
            zmq_close(t->dealer[r]);
            t->dealer[r] = NULL;
        }
        if (t->mon[r]) {
            zmq_setsockopt(t->mon[r], ZMQ_LINGER, &zero, sizeof zero);
            zmq_close(t->mon[r]);
            t->mon[r] = NULL;
        }
    }
    if (t->router) {
        zmq_setsockopt(t->router, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(t->router);
        t->router = NULL;
    }
}

static int cm__send_hdr_payload(cm__tp *t, int wdst, const cm__hdr *h, zmq_msg_t *payload,
                                int64_t deadline);

/* Marks the transport failed with code and the sentence (without the "rank N: " prefix,
 * which is added here); tells every peer why unless the failure came from one (remote
 * set: the sentence is forwarded as it is), then closes the sockets. Returns code. */
static int cm__fail_impl(cm__tp *t, int code, bool remote, const char *msg) {
    if (t->failed) return co_err_set(t->failed, "%s", t->fail_msg);
    t->failed = code;
    if (remote)
        snprintf(t->fail_msg, sizeof t->fail_msg, "%s", msg);
    else
        snprintf(t->fail_msg, sizeof t->fail_msg, "world rank %d: %s", t->rank, msg);
    if (!t->closed) {
        size_t len = strlen(t->fail_msg);
        for (int r = 0; r < t->size; r++) {
            if (r == t->rank || !t->dealer[r] || t->dead_at[r]) continue;
            cm__hdr h = {.kind = CM__K_FAIL, .aux = (uint64_t)code};
            zmq_msg_t m;
            if (zmq_msg_init_size(&m, len) != 0) continue;
            memcpy(zmq_msg_data(&m), t->fail_msg, len);
            cm__send_hdr_payload(t, r, &h, &m, 0); /* best effort, never waits */
        }
        cm__tp_close(t, CM__FAIL_LINGER_MS);
    }
    return co_err_set(code, "%s", t->fail_msg);
}

__attribute__((format(printf, 3, 4))) static int cm__fail(cm__tp *t, int code, const char *fmt,
                                                          ...) {
    if (t->failed) return co_err_set(t->failed, "%s", t->fail_msg);
    char buf[CM__MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return cm__fail_impl(t, code, false, buf);
}

/* 0, or the sticky error (turning a pending abort into one). */
static int cm__check(cm__tp *t) {
    if (t->failed) return co_err_set(t->failed, "%s", t->fail_msg);
    if (atomic_load_explicit(&t->aborted, memory_order_acquire))
        return cm__fail(t, CO_EABORTED, "communicator aborted");
    return 0;
}

/* ---------------------------------------------------------------- send */

static void cm__hdr_pack(unsigned char *b, const cm__hdr *h) {
    memset(b, 0, CM__HDR);
    cm__put32(b, CM__MAGIC);
    b[4] = h->kind;
    b[5] = h->op;
    b[6] = h->dt;
    cm__put64(b + 8, h->group);
    cm__put32(b + 16, h->seq);
    cm__put32(b + 20, h->tag);
    cm__put64(b + 24, h->aux);
    cm__put32(b + 32, h->arg);
}

/* Sends [header][payload] to world rank wdst; payload is consumed (closed) in all cases.
 * deadline 0 = do not wait at all (used while failing). */
static int cm__send_hdr_payload(cm__tp *t, int wdst, const cm__hdr *h, zmq_msg_t *payload,
                                int64_t deadline) {
    void *s = t->dealer[wdst];
    if (!s) {
        zmq_msg_close(payload);
        return CO_EIO;
    }
    unsigned char hb[CM__HDR];
    cm__hdr_pack(hb, h);
    for (;;) {
        if (zmq_send(s, hb, CM__HDR, ZMQ_SNDMORE | ZMQ_DONTWAIT) == CM__HDR) break;
        int e = errno;
        if (e != EAGAIN || deadline == 0) {
            zmq_msg_close(payload);
            if (deadline == 0) return CO_EIO;
            return cm__fail(t, CO_EIO, "send to world rank %d: %s", wdst, zmq_strerror(e));
        }
        /* Not expected without a high-water mark; wait for room, still abortable. */
        int rc = cm__check(t);
        if (rc) {
            zmq_msg_close(payload);
            return rc;
        }
        int64_t now = cm__now_ms();
        if (deadline > 0 && now >= deadline) {
            zmq_msg_close(payload);
            return cm__fail(t, CO_ETIMEOUT, "timed out sending to world rank %d", wdst);
        }
        zmq_pollitem_t it[2] = {{s, 0, ZMQ_POLLOUT, 0}, {NULL, t->efd, ZMQ_POLLIN, 0}};
        zmq_poll(it, 2, CM__SLICE_MS);
    }
    if (zmq_msg_send(payload, s, ZMQ_DONTWAIT) < 0) {
        int e = errno;
        zmq_msg_close(payload);
        if (deadline == 0) return CO_EIO;
        return cm__fail(t, CO_EIO, "send to world rank %d: %s", wdst, zmq_strerror(e));
    }
    return 0;
}

/* Sends a copy of p[len]. */
static int cm__send_copy(cm__tp *t, int wdst, const cm__hdr *h, const void *p, size_t len,
                         int64_t deadline) {
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, len) != 0) return cm__fail(t, CO_ENOMEM, "message of %zu bytes", len);
    if (len) memcpy(zmq_msg_data(&m), p, len);
    return cm__send_hdr_payload(t, wdst, h, &m, deadline);
}

/* ---------------------------------------------------------------- receive */

static cm__ent *cm__ent_new(cm__tp *t) {
    cm__ent *e = t->free_ents;
    if (e) {
        t->free_ents = e->next;
        return e;
    }
    return malloc(sizeof *e);
}

static void cm__ent_free(cm__tp *t, cm__ent *e) {
    e->next = t->free_ents;
    t->free_ents = e;
}

static void cm__drain_monitors(cm__tp *t) {
    for (int r = 0; r < t->size; r++) {
        if (!t->mon[r]) continue;
        for (;;) {
            zmq_msg_t ev, addr;
            zmq_msg_init(&ev);
            if (zmq_msg_recv(&ev, t->mon[r], ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&ev);
                break;
            }
            uint16_t code = 0;
            if (zmq_msg_size(&ev) >= 2) memcpy(&code, zmq_msg_data(&ev), 2);
            bool more = zmq_msg_more(&ev);
            zmq_msg_close(&ev);
            if (more) {
                zmq_msg_init(&addr);
                zmq_msg_recv(&addr, t->mon[r], 0);
                zmq_msg_close(&addr);
            }
            if ((code == ZMQ_EVENT_DISCONNECTED || code == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) &&
                !t->dead_at[r])
                t->dead_at[r] = cm__now_ms();
        }
    }
}

/* ---------------------------------------------------------------- shared-memory setup */

/* Reads every descriptor message waiting on this rank's socket into the pending table. */
static void cm__shm_drain_sock(cm__tp *t) {
    if (t->shm_sock < 0) return;
    for (;;) {
        uint32_t r;
        uint64_t nonce;
        int mfd, efd;
        int rc = cm_shm_recv(t->shm_sock, &r, &nonce, &mfd, &efd);
        if (rc == 2) continue; /* malformed: dropped */
        if (rc <= 0) return;
        if (r >= (uint32_t)t->size || (int)r == t->rank) {
            close(mfd);
            close(efd);
            continue;
        }
        if (t->pend_mem[r] >= 0) close(t->pend_mem[r]);
        if (t->pend_efd[r] >= 0) close(t->pend_efd[r]);
        t->pend_mem[r] = mfd;
        t->pend_efd[r] = efd;
        t->pend_nonce[r] = nonce;
    }
}

/* Answers world rank r's HELLO (r offers a segment, so does this rank): sends this rank's
 * descriptors to r's socket, then tells r over ZeroMQ whether that worked (the datagram is
 * in r's queue before r reads the message). A failure only means no shared memory with r. */
static int cm__shm_offer(cm__tp *t, int r) {
    int ok = 0;
    if (t->shm_path[r]) {
        int64_t until = cm__now_ms() + 2000;
        for (;;) {
            int rc = cm_shm_send(t->shm_sock, t->shm_path[r], t->shm_memfd, t->seg[t->rank].efd,
                                 (uint32_t)t->rank, t->nonce);
            if (rc == 0) {
                ok = 1;
                break;
            }
            if (rc != -EAGAIN || cm__now_ms() >= until) break;
            /* r's queue is full: r may be waiting on ours, so keep ours moving meanwhile */
            cm__shm_drain_sock(t);
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    cm__hdr h = {.kind = CM__K_SHM, .arg = CM__SHM_FDS, .aux = (uint64_t)ok};
    return cm__send_copy(t, r, &h, NULL, 0, cm__deadline(t->opt.connect_timeout_ms));
}

/* A CM__K_SHM message from world rank src during cm_zmq_new. */
static int cm__shm_msg(cm__tp *t, int src, const cm__hdr *h, zmq_msg_t *m) {
    if (!t->shm_on) return 0; /* not offered: nothing to do */
    if (h->arg == CM__SHM_FDS) {
        t->shm_state[src] |= CM__SS_FDS;
        if (h->aux != 1 || !t->peer_nonce[src]) return 0;
        cm__shm_drain_sock(t);
        if (t->pend_mem[src] < 0) return 0;
        int mfd = t->pend_mem[src], efd = t->pend_efd[src];
        t->pend_mem[src] = t->pend_efd[src] = -1;
        if (t->pend_nonce[src] != t->peer_nonce[src]) {
            close(mfd);
            close(efd);
            return 0;
        }
        if (cm_shm_attach(&t->seg[src], mfd, efd, (uint32_t)src, t->peer_nonce[src],
                          t->opt.shm_block_bytes, CM__SHM_SLOTS) == 0) {
            t->shm_state[src] |= CM__SS_MAPPED;
            t->pair[(size_t)t->rank * (size_t)t->size + (size_t)src] = 1;
        }
        return 0;
    }
    if (h->arg == CM__SHM_LIST) {
        size_t n = zmq_msg_size(m) / 4;
        const unsigned char *p = zmq_msg_data(m);
        for (size_t i = 0; i < n; i++) {
            uint32_t q = cm__get32(p + 4 * i);
            if (q < (uint32_t)t->size) t->pair[(size_t)src * (size_t)t->size + q] = 1;
        }
        t->shm_state[src] |= CM__SS_LIST;
        return 0;
    }
    return cm__fail(t, CO_EPROTOCOL, "unknown shared-memory message %u from world rank %d", h->arg, src);
}

/* Reads one message from the ROUTER if one is there: 1 = got one (stashed or handled),
 * 0 = none, < 0 = failure. src_out and ent_out name the stashed entry. */
static int cm__read_one(cm__tp *t, int *src_out, cm__ent **ent_out) {
    *ent_out = NULL;
    zmq_msg_t id;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, t->router, ZMQ_DONTWAIT) < 0) {
        int e = errno;
        zmq_msg_close(&id);
        if (e == EAGAIN || e == EINTR) return 0;
        return cm__fail(t, CO_EIO, "receive: %s", zmq_strerror(e));
    }
    int src = -1;
    /* under CURVE the sender is the User-Id its connection proved (read from the header
     * frame below), not the routing id */
    if (!t->curve_router && zmq_msg_size(&id) == 5 && ((unsigned char *)zmq_msg_data(&id))[0] == 'R') {
        uint32_t v = cm__get32((unsigned char *)zmq_msg_data(&id) + 1);
        if (v < (uint32_t)t->size && (int)v != t->rank) src = (int)v;
    }
    bool more = zmq_msg_more(&id);
    zmq_msg_close(&id);
    /* header, payload: the rest of a multipart message is always there already */
    zmq_msg_t hm;
    zmq_msg_init(&hm);
    int ok = more && zmq_msg_recv(&hm, t->router, 0) == CM__HDR && zmq_msg_more(&hm);
    if (ok && t->curve_router) {
        int v = cm__zap_rank(zmq_msg_gets(&hm, "User-Id"), t->size);
        src = v != t->rank ? v : -1;
    }
    cm__ent *e = ok ? cm__ent_new(t) : NULL;
    if (e) {
        zmq_msg_init(&e->data);
        ok = zmq_msg_recv(&e->data, t->router, 0) >= 0 && !zmq_msg_more(&e->data);
    } else if (ok) {
        zmq_msg_close(&hm);
        return cm__fail(t, CO_ENOMEM, "stash entry");
    }
    const unsigned char *b = ok ? zmq_msg_data(&hm) : NULL;
    if (!ok || src < 0 || cm__get32(b) != CM__MAGIC) {
        /* skip the rest of a malformed message */
        while (zmq_msg_more(e ? &e->data : &hm)) {
            zmq_msg_t x;
            zmq_msg_init(&x);
            if (zmq_msg_recv(&x, t->router, 0) < 0 || !zmq_msg_more(&x)) {
                zmq_msg_close(&x);
                break;
            }
            zmq_msg_close(&x);
        }
        zmq_msg_close(&hm);
        if (e) {
            zmq_msg_close(&e->data);
            cm__ent_free(t, e);
        }
        return cm__fail(t, CO_EPROTOCOL, "malformed message from %s",
                        src < 0 ? "an unknown peer" : "a peer");
    }
    e->h.kind = b[4];
    e->h.op = b[5];
    e->h.dt = b[6];
    e->h.group = cm__get64(b + 8);
    e->h.seq = cm__get32(b + 16);
    e->h.tag = cm__get32(b + 20);
    e->h.aux = cm__get64(b + 24);
    e->h.arg = cm__get32(b + 32);
    zmq_msg_close(&hm);
    e->next = NULL;

    if (e->h.kind == CM__K_FAIL) {
        char txt[CM__MSG_MAX];
        size_t n = zmq_msg_size(&e->data);
        if (n >= sizeof txt) n = sizeof txt - 1;
        memcpy(txt, zmq_msg_data(&e->data), n);
        txt[n] = '\0';
        zmq_msg_close(&e->data);
        cm__ent_free(t, e);
        int code = t->failed ? t->failed : CO_EREMOTE;
        return cm__fail_impl(t, code, true, txt);
    }
    if (e->h.kind == CM__K_HELLO) {
        size_t n = zmq_msg_size(&e->data);
        const unsigned char *p = zmq_msg_data(&e->data);
        int bad = n != CM__HELLO_BYTES || (int)cm__get32(p) != src || (int)cm__get32(p + 4) != t->size ||
                  cm__get64(p + 8) != t->opt.chunk_bytes || cm__get64(p + 16) != t->opt.small_bytes ||
                  cm__get64(p + 24) != t->opt.shm_block_bytes;
        uint32_t their_size = n >= 8 ? cm__get32(p + 4) : 0;
        uint64_t nonce = bad ? 0 : cm__get64(p + 32);
        zmq_msg_close(&e->data);
        cm__ent_free(t, e);
        if (bad)
            return cm__fail(t, CO_EPROTOCOL,
                            "world rank %d has another world size (%u vs %d) or other "
                            "chunk_bytes/small_bytes/shm_block_bytes options",
                            src, their_size, t->size);
        if (t->hello[src]) return 1;
        t->hello[src] = true;
        t->peer_nonce[src] = nonce;
        if (t->shm_on && nonce) {
            int rc = cm__shm_offer(t, src);
            if (rc) return rc;
        }
        return 1;
    }
    if (e->h.kind == CM__K_SHM) {
        int rc = cm__shm_msg(t, src, &e->h, &e->data);
        zmq_msg_close(&e->data);
        cm__ent_free(t, e);
        return rc ? rc : 1;
    }
    if (e->h.kind != CM__K_COLL && e->h.kind != CM__K_P2P) {
        zmq_msg_close(&e->data);
        cm__ent_free(t, e);
        return cm__fail(t, CO_EPROTOCOL, "message of unknown kind %d from world rank %d",
                        e->h.kind, src);
    }
    if (t->tail[src])
        t->tail[src]->next = e;
    else
        t->head[src] = e;
    t->tail[src] = e;
    *src_out = src;
    *ent_out = e;
    return 1;
}

static cm__ent *cm__stash_take(cm__tp *t, int src, uint64_t group, int kind) {
    cm__ent *prev = NULL;
    for (cm__ent *e = t->head[src]; e; prev = e, e = e->next) {
        if (e->h.group != group || e->h.kind != kind) continue;
        if (prev)
            prev->next = e->next;
        else
            t->head[src] = e->next;
        if (t->tail[src] == e) t->tail[src] = prev;
        return e;
    }
    return NULL;
}

/* One round of waiting for a message from world rank `src` (-1: any progress, e.g. HELLOs):
 * reads what is there (stopping at a message for (src, group, kind)); when nothing is,
 * checks deadline and dead peers and polls for one slice. 0 = go around again. */
static int cm__pump(cm__tp *t, int src, uint64_t group, int kind, int64_t deadline,
                    const char *what) {
    int got = 0;
    for (int i = 0; i < 1024; i++) {
        int s;
        cm__ent *e;
        int rc = cm__read_one(t, &s, &e);
        if (rc < 0) return rc;
        if (rc == 0) break;
        got = 1;
        if (e && s == src && e->h.group == group && e->h.kind == kind) return 0;
    }
    if (got) return 0;
    cm__drain_monitors(t);
    int rc = cm__check(t);
    if (rc) return rc;
    int64_t now = cm__now_ms();
    if (src >= 0 && t->dead_at[src] && now - t->dead_at[src] >= t->opt.peer_grace_ms)
        return cm__fail(t, CO_EREMOTE, "%s: world rank %d disconnected (process died or exited)",
                        what, src);
    if (deadline >= 0 && now >= deadline) {
        if (src >= 0) return cm__fail(t, CO_ETIMEOUT, "%s: timed out waiting for world rank %d", what, src);
        return cm__fail(t, CO_ETIMEOUT, "%s: timed out", what);
    }
    long wait = CM__SLICE_MS;
    if (deadline >= 0 && deadline - now < wait) wait = (long)(deadline - now);
    if (wait < 1) wait = 1;
    if (zmq_poll(t->items, t->nitems, wait) < 0 && errno != EINTR)
        return cm__fail(t, CO_EIO, "%s: poll: %s", what, zmq_strerror(errno));
    return 0;
}

/* Receives the next message of (group rank gsrc, kind) and checks it is the expected one.
 * On success *out holds the payload (caller closes or forwards it) of exactly `len` bytes
 * (len SIZE_MAX: any). */
static int cm__recv(cm__group *g, int kind, int gsrc, const cm__hdr *want, size_t len,
                    zmq_msg_t *out, int64_t deadline) {
    cm__tp *t = g->tp;
    int src = g->world[gsrc];
    const char *what = cm__op_name[want->op];
    for (;;) {
        int rc = cm__check(t);
        if (rc) return rc;
        cm__ent *e = cm__stash_take(t, src, g->id, kind);
        if (e && (e->h.op != want->op || e->h.seq != want->seq || e->h.dt != want->dt ||
                  e->h.aux != want->aux || e->h.arg != want->arg || e->h.tag != want->tag)) {
            /* A peer that failed sends FAIL after what it had already sent: give it a moment
             * to arrive, it explains the mismatch better than the mismatch does. */
            int64_t until = cm__now_ms() + 50;
            while (!t->failed && cm__now_ms() < until) {
                int s2;
                cm__ent *e2;
                rc = cm__read_one(t, &s2, &e2);
                if (rc < 0) break;
                if (rc == 0) {
                    zmq_pollitem_t it = {t->router, 0, ZMQ_POLLIN, 0};
                    zmq_poll(&it, 1, 10);
                }
            }
            if (t->failed) {
                zmq_msg_close(&e->data);
                cm__ent_free(t, e);
                return co_err_set(t->failed, "%s", t->fail_msg);
            }
        }
        if (e) {
            cm__hdr h = e->h;
            zmq_msg_move(out, &e->data);
            zmq_msg_close(&e->data);
            cm__ent_free(t, e);
            size_t got = zmq_msg_size(out);
            if (h.op != want->op || h.seq != want->seq) {
                zmq_msg_close(out);
                return cm__fail(t, CO_EPROTOCOL,
                                "%s #%u: world rank %d sent %s #%u instead (mismatched calls)",
                                what, want->seq, src, cm__op_name[h.op < 8 ? h.op : 0], h.seq);
            }
            if (h.dt != want->dt || h.aux != want->aux || h.arg != want->arg) {
                zmq_msg_close(out);
                return cm__fail(t, CO_EPROTOCOL,
                                "%s #%u: world rank %d called it with size %llu, dtype %d, "
                                "root/peer %u where this rank used %llu, %d, %u",
                                what, want->seq, src, (unsigned long long)h.aux, h.dt, h.arg,
                                (unsigned long long)want->aux, want->dt, want->arg);
            }
            if (h.tag != want->tag || (len != SIZE_MAX && got != len)) {
                zmq_msg_close(out);
                return cm__fail(t, CO_EPROTOCOL,
                                "%s #%u: message %u of %zu bytes from world rank %d where "
                                "message %u of %zu bytes was expected",
                                what, want->seq, h.tag, got, src, want->tag, len);
            }
            return 0;
        }
        rc = cm__pump(t, src, g->id, kind, deadline, what);
        if (rc) return rc;
    }
}

/* ---------------------------------------------------------------- collectives */

static cm__group *cm__g(cm_comm *c) { return (cm__group *)c; }

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
static void cm__seg(size_t count, int n, int j, size_t *off, size_t *len) {
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

/* ---------------------------------------------------------------- shared-memory all-reduce */

static uint64_t cm__fnv(uint64_t h, const void *p, size_t n);

/* What a slot holds, for (group, call, block): never 0, which a fresh slot holds. */
static uint64_t cm__stamp(const cm__group *g, uint32_t seq, size_t b) {
    uint64_t k = cm__fnv(14695981039346656037ull, &g->id, sizeof g->id);
    k = cm__fnv(k, &seq, sizeof seq);
    uint64_t bb = b;
    return cm__fnv(k, &bb, sizeof bb) | 1;
}

/* Wakes world rank w if it sleeps on its doorbell. Called after the store it should see
 * (sequentially consistent on both sides: either w sees the store before it sleeps, or
 * this sees its sleeping flag). */
static void cm__shm_ring(cm__tp *t, int w) {
    cm_shm_seg *s = &t->seg[w];
    if (atomic_load(&s->hdr->sleeping)) {
        uint64_t one = 1;
        ssize_t x = write(s->efd, &one, sizeof one);
        (void)x;
    }
}

/* One read of a peer's slot done: the last reader hands it back to its owner. */
static void cm__shm_release(cm__tp *t, int w, int slot) {
    if (atomic_fetch_sub(&t->seg[w].hdr->slot[slot].readers, 1) == 1) cm__shm_ring(t, w);
}

/* A peer that made another call with this sequence number goes over ZeroMQ: its message
 * waits in the stash. */
static int cm__shm_mismatch(cm__group *g, const cm__hdr *h) {
    cm__tp *t = g->tp;
    for (int k = 0; k < g->pub.size; k++) {
        int q = g->world[k];
        if (q == t->rank) continue;
        for (cm__ent *e = t->head[q]; e; e = e->next)
            if (e->h.group == g->id && e->h.kind == CM__K_COLL && e->h.seq == h->seq)
                return cm__fail(t, CO_EPROTOCOL,
                                "%s #%u: world rank %d sent %s #%u instead (mismatched calls)",
                                cm__op_name[h->op], h->seq, q, cm__op_name[e->h.op < 8 ? e->h.op : 0],
                                e->h.seq);
    }
    return 0;
}

/* Waits until *w == want (a word in shared memory that world rank wsrc will set; -1: the
 * group's members). Between checks it reads ZeroMQ (FAIL messages, mismatched calls), checks
 * abort, deadline and dead members, and sleeps in zmq_poll on the ROUTER, the abort eventfd,
 * the disconnect monitors and this rank's doorbell, for at most one slice: no spinning. */
static int cm__shm_wait(cm__group *g, const cm__hdr *h, _Atomic uint64_t *w, uint64_t want,
                        int wsrc, int64_t dl) {
    cm__tp *t = g->tp;
    const char *what = cm__op_name[h->op];
    cm_shm_seg *own = &t->seg[t->rank];
    for (;;) {
        if (atomic_load_explicit(w, memory_order_acquire) == want) return 0;
        int rc = cm__check(t);
        if (rc) return rc;
        for (int i = 0; i < 1024; i++) {
            int s;
            cm__ent *e;
            rc = cm__read_one(t, &s, &e);
            if (rc < 0) return rc;
            if (rc == 0) break;
        }
        rc = cm__shm_mismatch(g, h);
        if (rc) return rc;
        cm__drain_monitors(t);
        int64_t now = cm__now_ms();
        for (int k = 0; k < g->pub.size; k++) {
            int q = g->world[k];
            if (q != t->rank && t->dead_at[q] && now - t->dead_at[q] >= t->opt.peer_grace_ms)
                return cm__fail(t, CO_EREMOTE, "%s: world rank %d disconnected (process died or exited)",
                                what, q);
        }
        if (dl >= 0 && now >= dl) {
            if (wsrc >= 0) return cm__fail(t, CO_ETIMEOUT, "%s: timed out waiting for world rank %d", what, wsrc);
            return cm__fail(t, CO_ETIMEOUT, "%s: timed out waiting for peers to read this rank's data", what);
        }
        long slice = CM__SLICE_MS;
        if (dl >= 0 && dl - now < slice) slice = (long)(dl - now);
        if (slice < 1) slice = 1;
        atomic_store(&own->hdr->sleeping, 1);
        int prc = 0;
        if (atomic_load(w) != want) prc = zmq_poll(t->items, t->nitems + 1, slice);
        int perr = errno;
        atomic_store(&own->hdr->sleeping, 0);
        uint64_t junk;
        ssize_t x = read(own->efd, &junk, sizeof junk); /* the doorbell, non-blocking */
        (void)x;
        if (prc < 0 && perr != EINTR) return cm__fail(t, CO_EIO, "%s: poll: %s", what, zmq_strerror(perr));
    }
}

/* dst1 (and dst2 if not NULL) [len] = src[0] + src[1] + ... + src[n-1], added in that order
 * per element, in tiles that stay in L1; any pointer may be unaligned and dst1 may be one of
 * the sources (each tile is read in full before it is written). */
static void cm__sum_n(cm_dtype dt, size_t len, const unsigned char *const *src, int n,
                      unsigned char *dst1, unsigned char *dst2) {
    size_t es = cm__dt_size(dt), tile = 8192 / es;
    union {
        float f[2048];
        double d[1024];
        uint64_t u[1024];
    } acc;
    for (size_t o = 0; o < len; o += tile) {
        size_t k = len - o < tile ? len - o : tile;
        memcpy(&acc, src[0] + o * es, k * es);
        for (int r = 1; r < n; r++) {
            const unsigned char *s = src[r] + o * es;
            if (dt == CM_F32) {
                for (size_t i = 0; i < k; i++) {
                    float v;
                    memcpy(&v, s + 4 * i, 4);
                    acc.f[i] += v;
                }
            } else if (dt == CM_F64) {
                for (size_t i = 0; i < k; i++) {
                    double v;
                    memcpy(&v, s + 8 * i, 8);
                    acc.d[i] += v;
                }
            } else {
                for (size_t i = 0; i < k; i++) { /* wrapping sum of i64 */
                    uint64_t v;
                    memcpy(&v, s + 8 * i, 8);
                    acc.u[i] += v;
                }
            }
        }
        memcpy(dst1 + o * es, &acc, k * es);
        if (dst2) memcpy(dst2 + o * es, &acc, k * es);
    }
}

typedef struct cm__ar {
    cm__group *g;
    const cm__hdr *h;
    unsigned char *buf;
    size_t count, es, be, nblk; /* be: elements per block */
    cm_dtype dt;
    bool direct;
    int64_t dl;
} cm__ar;

static void cm__ar_block(const cm__ar *a, size_t b, size_t *bo, size_t *bc) {
    *bo = b * a->be;
    *bc = a->count - *bo < a->be ? a->count - *bo : a->be;
}

/* Block b into slot b % SLOTS of this rank's segment, once the slot's last readers are done:
 * the pieces the other members reduce (direct: the whole block), then the stamp. */
static int cm__ar_post(cm__ar *a, size_t b) {
    cm__tp *t = a->g->tp;
    int n = a->g->pub.size, me = a->g->pub.rank, s = (int)(b % CM__SHM_SLOTS);
    cm_shm_seg *own = &t->seg[t->rank];
    cm_shm_slot *sl = &own->hdr->slot[s];
    int rc = cm__shm_wait(a->g, a->h, &sl->readers, 0, -1, a->dl);
    if (rc) return rc;
    size_t bo, bc, es = a->es;
    cm__ar_block(a, b, &bo, &bc);
    unsigned char *d = cm_shm_slot_data(own, s);
    const unsigned char *src = a->buf + bo * es;
    if (a->direct) {
        memcpy(d, src, bc * es);
    } else {
        for (int j = 0; j < n; j++) {
            size_t o, l;
            if (j == me) continue;
            cm__seg(bc, n, j, &o, &l);
            memcpy(d + o * es, src + o * es, l * es);
        }
    }
    sl->count = a->count;
    sl->desc = (uint64_t)a->h->op << 8 | (uint64_t)a->dt;
    atomic_store_explicit(&sl->readers, (uint64_t)(a->direct ? n - 1 : 2 * (n - 1)), memory_order_relaxed);
    atomic_store(&sl->posted, cm__stamp(a->g, a->h->seq, b));
    for (int k = 0; k < n; k++)
        if (k != me) cm__shm_ring(t, a->g->world[k]);
    return 0;
}

/* This rank's piece of block b (direct: the whole block) = the members' contributions in
 * group rank order, into the caller's buffer and (for the others to gather) its slot. */
static int cm__ar_reduce(cm__ar *a, size_t b) {
    cm__tp *t = a->g->tp;
    int n = a->g->pub.size, me = a->g->pub.rank, s = (int)(b % CM__SHM_SLOTS);
    uint64_t stamp = cm__stamp(a->g, a->h->seq, b), desc = (uint64_t)a->h->op << 8 | (uint64_t)a->dt;
    size_t bo, bc, o, l, es = a->es;
    cm__ar_block(a, b, &bo, &bc);
    if (a->direct) {
        o = 0;
        l = bc;
    } else {
        cm__seg(bc, n, me, &o, &l);
    }
    const unsigned char *src[CM__SHM_MAX_RANKS];
    for (int k = 0; k < n; k++) {
        if (k == me) {
            src[k] = a->buf + (bo + o) * es;
            continue;
        }
        int w = a->g->world[k];
        cm_shm_slot *sl = &t->seg[w].hdr->slot[s];
        int rc = cm__shm_wait(a->g, a->h, &sl->posted, stamp, w, a->dl);
        if (rc) return rc;
        if (sl->count != a->count || sl->desc != desc)
            return cm__fail(t, CO_EPROTOCOL,
                            "%s #%u: world rank %d called it with size %llu, dtype %d where this "
                            "rank used %llu, %d (mismatched calls)",
                            cm__op_name[a->h->op], a->h->seq, w, (unsigned long long)sl->count,
                            (int)(sl->desc & 0xff), (unsigned long long)a->count, (int)a->dt);
        src[k] = cm_shm_slot_data(&t->seg[w], s) + o * es;
    }
    cm_shm_seg *own = &t->seg[t->rank];
    cm__sum_n(a->dt, l, src, n, a->buf + (bo + o) * es, a->direct ? NULL : cm_shm_slot_data(own, s) + o * es);
    for (int k = 0; k < n; k++)
        if (k != me) cm__shm_release(t, a->g->world[k], s);
    if (!a->direct) {
        atomic_store(&own->hdr->slot[s].reduced, stamp);
        for (int k = 0; k < n; k++)
            if (k != me) cm__shm_ring(t, a->g->world[k]);
    }
    return 0;
}

/* The other members' reduced pieces of block b into the caller's buffer, whichever is
 * ready first. */
static int cm__ar_gather(cm__ar *a, size_t b) {
    cm__tp *t = a->g->tp;
    int n = a->g->pub.size, me = a->g->pub.rank, s = (int)(b % CM__SHM_SLOTS);
    uint64_t stamp = cm__stamp(a->g, a->h->seq, b);
    size_t bo, bc, es = a->es;
    cm__ar_block(a, b, &bo, &bc);
    bool done[CM__SHM_MAX_RANKS] = {false};
    int left = n - 1;
    while (left > 0) {
        int first = -1;
        for (int kk = 1; kk < n; kk++) {
            int k = (me + kk) % n;
            if (done[k]) continue;
            int w = a->g->world[k];
            cm_shm_slot *sl = &t->seg[w].hdr->slot[s];
            if (atomic_load_explicit(&sl->reduced, memory_order_acquire) != stamp) {
                if (first < 0) first = k;
                continue;
            }
            size_t o, l;
            cm__seg(bc, n, k, &o, &l);
            memcpy(a->buf + (bo + o) * es, cm_shm_slot_data(&t->seg[w], s) + o * es, l * es);
            cm__shm_release(t, w, s);
            done[k] = true;
            left--;
        }
        if (left > 0 && first >= 0) {
            int w = a->g->world[first];
            int rc = cm__shm_wait(a->g, a->h, &t->seg[w].hdr->slot[s].reduced, stamp, w, a->dl);
            if (rc) return rc;
        }
    }
    return 0;
}

/* Blocks of shm_block_bytes, up to SLOTS - 1 posted ahead of the one being reduced, so that
 * peers always have work while this rank waits. Direct (one block of at most small_bytes):
 * every member sums the whole block itself, one synchronisation instead of two. */
static int cm__allreduce_shm(cm__group *g, const cm__hdr *h, void *buf, size_t count, cm_dtype dt,
                             int64_t dl) {
    cm__ar a = {.g = g, .h = h, .buf = buf, .count = count, .es = cm__dt_size(dt), .dt = dt, .dl = dl};
    a.be = g->tp->opt.shm_block_bytes / a.es;
    a.nblk = (count + a.be - 1) / a.be;
    a.direct = a.nblk == 1 && count * a.es <= g->tp->opt.small_bytes;
    size_t ahead = CM__SHM_AHEAD < a.nblk ? CM__SHM_AHEAD : a.nblk;
    for (size_t b = 0; b < ahead; b++) {
        int rc = cm__ar_post(&a, b);
        if (rc) return rc;
    }
    size_t lag = CM__SHM_LAG;
    for (size_t b = 0; b < a.nblk + lag; b++) {
        int rc = 0;
        if (b < a.nblk) rc = cm__ar_reduce(&a, b);
        if (!rc && b + ahead < a.nblk) rc = cm__ar_post(&a, b + ahead);
        if (!rc && !a.direct && b >= lag && b - lag < a.nblk) rc = cm__ar_gather(&a, b - lag);
        if (rc) return rc;
    }
    return 0;
}

static int cm__allreduce(cm_comm *c, void *buf, size_t count, cm_dtype dt, int timeout_ms) {
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
static int cm__broadcast(cm_comm *c, void *bufv, size_t bytes, int root, int timeout_ms) {
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
static int cm__allgather(cm_comm *c, const void *sendv, void *recvv, size_t bytes, int timeout_ms) {
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
static int cm__reduce_scatter(cm_comm *c, const void *sendv, void *recvv, size_t count,
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
static int cm__barrier_op(cm__group *g, int op, int64_t dl) {
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

static int cm__barrier(cm_comm *c, int timeout_ms) {
    return cm__barrier_op(cm__g(c), CM__OP_BARRIER, cm__deadline(timeout_ms));
}

/* Point to point: chunks on the group's p2p channel; aux carries the total size so that
 * a send and a recv of different sizes are reported. */
static int cm__send(cm_comm *c, const void *bufv, size_t bytes, int peer, int timeout_ms) {
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

static int cm__recv_p2p(cm_comm *c, void *bufv, size_t bytes, int peer, int timeout_ms) {
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

/* ---------------------------------------------------------------- groups */

static uint64_t cm__fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static cm__group *cm__group_new(cm__tp *t, uint64_t id, const int *world, int n, int rank) {
    cm__group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->world = malloc(sizeof(int) * (size_t)n);
    g->p2p_send = calloc((size_t)n, sizeof(uint32_t));
    g->p2p_recv = calloc((size_t)n, sizeof(uint32_t));
    if (!g->world || !g->p2p_send || !g->p2p_recv) {
        free(g->world);
        free(g->p2p_send);
        free(g->p2p_recv);
        free(g);
        return NULL;
    }
    memcpy(g->world, world, sizeof(int) * (size_t)n);
    g->pub.ops = &cm__zmq_ops;
    g->pub.rank = rank;
    g->pub.size = n;
    g->pub.impl = g;
    g->tp = t;
    g->id = id;
    /* the same answer on every member: pair[] is the same matrix everywhere */
    g->shm = t->shm_on && n > 1;
    for (int a = 0; g->shm && a < n; a++)
        for (int b = 0; b < n; b++)
            if (a != b && !t->pair[(size_t)world[a] * (size_t)t->size + (size_t)world[b]]) {
                g->shm = false;
                break;
            }
    return g;
}

static void cm__tp_free(cm__tp *t);

static void cm__group_free(cm__group *g) {
    cm__tp *t = g->tp;
    free(g->world);
    free(g->p2p_send);
    free(g->p2p_recv);
    free(g->splits);
    free(g);
    if (--t->refs == 0) cm__tp_free(t);
}

/* The group id is a hash of the parent's id, the list and how many times this rank split
 * the same list off the same parent, so every member computes it without talking. A
 * barrier in the new group then checks that every member made the same call. */
static int cm__split(cm_comm *c, const int *ranks, int n, cm_comm **out) {
    cm__group *g = cm__g(c);
    *out = NULL;
    int me = -1;
    if (!ranks || n < 1 || n > c->size) return co_err_set(CO_EINVAL, "split: %d ranks of %d", n, c->size);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->size)
            return co_err_set(CO_EINVAL, "split: rank %d out of range", ranks[i]);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) return co_err_set(CO_EINVAL, "split: rank %d twice", ranks[i]);
        if (ranks[i] == c->rank) me = i;
    }
    if (me < 0) return co_err_set(CO_EINVAL, "split: rank %d is not in the list", c->rank);
    int rc = cm__check(g->tp);
    if (rc) return rc;
    uint64_t key = cm__fnv(14695981039346656037ull, &g->id, sizeof g->id);
    key = cm__fnv(key, &n, sizeof n);
    key = cm__fnv(key, ranks, sizeof(int) * (size_t)n);
    uint32_t occ = 0;
    int i;
    for (i = 0; i < g->nsplits; i++)
        if (g->splits[i].key == key) break;
    if (i == g->nsplits) {
        cm__split_rec *s = realloc(g->splits, sizeof *s * (size_t)(g->nsplits + 1));
        if (!s) return co_err_set(CO_ENOMEM, "split");
        g->splits = s;
        s[i].key = key;
        s[i].count = 0;
        g->nsplits++;
    }
    occ = g->splits[i].count++;
    uint64_t id = cm__fnv(key, &occ, sizeof occ);
    int *world = malloc(sizeof(int) * (size_t)n);
    if (!world) return co_err_set(CO_ENOMEM, "split");
    for (int k = 0; k < n; k++) world[k] = g->world[ranks[k]];
    cm__group *ng = cm__group_new(g->tp, id, world, n, me);
    free(world);
    if (!ng) return co_err_set(CO_ENOMEM, "split");
    g->tp->refs++;
    rc = cm__barrier_op(ng, CM__OP_SPLIT, cm__deadline(g->tp->opt.connect_timeout_ms));
    if (rc) {
        cm__group_free(ng);
        return rc;
    }
    *out = &ng->pub;
    return 0;
}

static void cm__abort(cm_comm *c) {
    cm__tp *t = cm__g(c)->tp;
    atomic_store_explicit(&t->aborted, 1, memory_order_release);
    uint64_t one = 1;
    ssize_t w = write(t->efd, &one, sizeof one); /* wakes a blocked zmq_poll */
    (void)w;
}

static void cm__destroy(cm_comm *c) {
    if (c) cm__group_free(cm__g(c));
}

static const cm_ops cm__zmq_ops = {
    .allreduce_sum = cm__allreduce,
    .broadcast = cm__broadcast,
    .allgather = cm__allgather,
    .reduce_scatter_sum = cm__reduce_scatter,
    .barrier = cm__barrier,
    .send = cm__send,
    .recv = cm__recv_p2p,
    .split = cm__split,
    .abort = cm__abort,
    .destroy = cm__destroy,
};

/* ---------------------------------------------------------------- setup */

void cm_zmq_options_default(cm_zmq_options *o) {
    memset(o, 0, sizeof *o);
    o->connect_timeout_ms = 30000;
    o->chunk_bytes = (size_t)4 << 20; /* measured: 4 MiB beats 1 MiB for 4 ranks on 2 cores */
    o->small_bytes = (size_t)32 << 10;
    o->io_threads = 1;
    o->linger_ms = 2000;
    o->peer_grace_ms = 500;
    o->heartbeat_ivl_ms = 1000;
    o->heartbeat_timeout_ms = 10000;
    o->shm_block_bytes = (size_t)1 << 20;
}

/* End of cm_zmq_new (or its failure): the descriptor socket, its file and this rank's memfd
 * are no longer needed (peers hold their own descriptors); unmapped descriptors closed. */
static void cm__shm_setup_done(cm__tp *t) {
    if (t->shm_sock >= 0) close(t->shm_sock);
    t->shm_sock = -1;
    if (t->shm_sock_path) unlink(t->shm_sock_path);
    free(t->shm_sock_path);
    t->shm_sock_path = NULL;
    if (t->shm_memfd >= 0) close(t->shm_memfd);
    t->shm_memfd = -1;
    for (int r = 0; t->pend_mem && r < t->size; r++) {
        if (t->pend_mem[r] >= 0) close(t->pend_mem[r]);
        if (t->pend_efd[r] >= 0) close(t->pend_efd[r]);
        t->pend_mem[r] = t->pend_efd[r] = -1;
    }
}

/* The file path of an ipc:// endpoint, NULL for other transports and abstract names. */
static char *cm__ipc_sock_path(const char *ep) {
    if (strncmp(ep, "ipc://", 6) != 0 || ep[6] == '@' || ep[6] == '\0') return NULL;
    size_t n = strlen(ep + 6);
    if (n + 5 > 107) return NULL; /* sun_path */
    char *p = malloc(n + 5);
    if (p) {
        memcpy(p, ep + 6, n);
        memcpy(p + n, ".shm", 5);
    }
    return p;
}

/* This rank's offer: its segment, doorbell and descriptor socket. Any failure (no memfd,
 * path too long, ...) only means ZeroMQ carries everything. */
static int cm__shm_setup(cm__tp *t, const char *const *endpoints) {
    int n = t->size;
    t->seg = calloc((size_t)n, sizeof *t->seg);
    t->shm_path = calloc((size_t)n, sizeof(char *));
    t->peer_nonce = calloc((size_t)n, sizeof(uint64_t));
    t->pend_mem = malloc(sizeof(int) * (size_t)n);
    t->pend_efd = malloc(sizeof(int) * (size_t)n);
    t->pend_nonce = calloc((size_t)n, sizeof(uint64_t));
    t->shm_state = calloc((size_t)n, 1);
    if (!t->seg || !t->shm_path || !t->peer_nonce || !t->pend_mem || !t->pend_efd || !t->pend_nonce ||
        !t->shm_state)
        return co_err_set(CO_ENOMEM, "cm_zmq_new");
    for (int r = 0; r < n; r++) {
        t->seg[r].efd = -1;
        t->pend_mem[r] = t->pend_efd[r] = -1;
    }
    if (!t->opt.shm_block_bytes || n < 2 || n > CM__SHM_MAX_RANKS) return 0;
    char *mine = cm__ipc_sock_path(endpoints[t->rank]);
    if (!mine) return 0;
    t->pair = calloc((size_t)n * (size_t)n, 1);
    if (!t->pair) {
        free(mine);
        return co_err_set(CO_ENOMEM, "cm_zmq_new");
    }
    for (int r = 0; r < n; r++)
        if (r != t->rank) t->shm_path[r] = cm__ipc_sock_path(endpoints[r]);
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != (ssize_t)sizeof nonce)
        nonce = (uint64_t)cm__now_ms() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    nonce |= 1;
    if (cm_shm_create(&t->seg[t->rank], &t->shm_memfd, (uint32_t)t->rank, nonce,
                      t->opt.shm_block_bytes, CM__SHM_SLOTS) != 0) {
        free(mine);
        return 0;
    }
    int sock = cm_shm_sock_bind(mine);
    if (sock < 0) {
        free(mine);
        cm_shm_release(&t->seg[t->rank]);
        close(t->shm_memfd);
        t->shm_memfd = -1;
        return 0;
    }
    t->shm_sock = sock;
    t->shm_sock_path = mine;
    t->nonce = nonce;
    t->shm_on = true;
    return 0;
}

static void cm__tp_free(cm__tp *t) {
    if (!t) return;
    cm__tp_close(t, t->failed ? 0 : t->opt.linger_ms);
    for (int r = 0; t->head && r < t->size; r++) {
        for (cm__ent *e = t->head[r], *nx; e; e = nx) {
            nx = e->next;
            zmq_msg_close(&e->data);
            free(e);
        }
    }
    for (cm__ent *e = t->free_ents, *nx; e; e = nx) {
        nx = e->next;
        free(e);
    }
    cm__zap_stop(&t->zap); /* its socket closes before the context ends */
    if (t->ctx) zmq_ctx_term(t->ctx); /* waits for lingering sends (bounded by linger_ms) */
    if (t->efd >= 0) close(t->efd);
    cm__shm_setup_done(t);
    for (int r = 0; t->seg && r < t->size; r++) cm_shm_release(&t->seg[r]);
    for (int r = 0; t->shm_path && r < t->size; r++) free(t->shm_path[r]);
    free(t->shm_path);
    free(t->seg);
    free(t->peer_nonce);
    free(t->pend_mem);
    free(t->pend_efd);
    free(t->pend_nonce);
    free(t->shm_state);
    free(t->pair);
    free(t->dealer);
    free(t->mon);
    free(t->items);
    free(t->dead_at);
    free(t->hello);
    free(t->head);
    free(t->tail);
    free(t);
}

static int cm__setopt(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

static int cm__sock_common(const cm_zmq_options *o, void *s) {
    int rc = 0;
    rc |= cm__setopt(s, ZMQ_SNDHWM, 0);
    /* bounded receive queue: past it ZeroMQ stops reading the connection (the sender's own
     * queue grows, never this rank's memory) */
    rc |= cm__setopt(s, ZMQ_RCVHWM, o->rcvhwm_msgs);
    rc |= cm__setopt(s, ZMQ_LINGER, o->linger_ms);
    rc |= cm__setopt(s, ZMQ_RECONNECT_IVL, 20);
    rc |= cm__setopt(s, ZMQ_RECONNECT_IVL_MAX, 500);
    int64_t maxmsg = (int64_t)(o->chunk_bytes > o->small_bytes ? o->chunk_bytes : o->small_bytes) + 4096;
    rc |= zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (o->heartbeat_ivl_ms > 0) {
        rc |= cm__setopt(s, ZMQ_HEARTBEAT_IVL, o->heartbeat_ivl_ms);
        rc |= cm__setopt(s, ZMQ_HEARTBEAT_TIMEOUT, o->heartbeat_timeout_ms);
        rc |= cm__setopt(s, ZMQ_HEARTBEAT_TTL, o->heartbeat_timeout_ms);
    }
    return rc;
}

int cm_zmq_new(cm_comm **out, int rank, int size, const char *const *endpoints,
               const cm_zmq_options *opt) {
    if (!out) return co_err_set(CO_EINVAL, "cm_zmq_new: out is NULL");
    *out = NULL;
    cm_zmq_options o;
    if (opt)
        o = *opt;
    else
        cm_zmq_options_default(&o);
    if (size < 1 || size > 65536 || rank < 0 || rank >= size || !endpoints)
        return co_err_set(CO_EINVAL, "cm_zmq_new: rank %d of %d", rank, size);
    /* Every chunk travels in a ZeroMQ message that malloc provides. glibc maps blocks this
     * large with mmap and unmaps them on free, so each chunk would fault its pages in
     * again; keep them in the heap instead, where freed chunks are reused. */
    static atomic_flag malloc_tuned = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&malloc_tuned)) {
        size_t big = o.chunk_bytes * 2 + 4096;
        if (big < ((size_t)1 << 22)) big = (size_t)1 << 22;
        mallopt(M_MMAP_THRESHOLD, (int)big);
        mallopt(M_TRIM_THRESHOLD, (int)(big * 64));
    }
    for (int r = 0; r < size; r++)
        if (!endpoints[r] || !endpoints[r][0])
            return co_err_set(CO_EINVAL, "cm_zmq_new: no endpoint for rank %d", r);
    if (o.chunk_bytes < 64 || o.chunk_bytes % 8 || o.chunk_bytes > ((size_t)1 << 30) ||
        o.small_bytes > o.chunk_bytes || o.io_threads < 1 || o.linger_ms < 0 ||
        o.peer_grace_ms < 0 || o.heartbeat_ivl_ms < 0 || o.heartbeat_timeout_ms < 0 ||
        (o.shm_block_bytes && (o.shm_block_bytes < 256 || o.shm_block_bytes % 64 ||
                               o.shm_block_bytes > ((size_t)1 << 30))))
        return co_err_set(CO_EINVAL,
                          "cm_zmq_new: chunk_bytes %zu must be a multiple of 8 in [64, 1 GiB] "
                          "and at least small_bytes %zu; shm_block_bytes %zu 0 or a multiple of "
                          "64 in [256, 1 GiB]; other options must be >= 0",
                          o.chunk_bytes, o.small_bytes, o.shm_block_bytes);
    bool curve = o.curve_server_public || o.curve_server_secret || o.curve_client_secret;
    if (curve && !(o.curve_server_public && o.curve_server_secret && o.curve_client_secret &&
                   strlen(o.curve_server_public) == 40 && strlen(o.curve_server_secret) == 40 &&
                   strlen(o.curve_client_secret) == 40))
        return co_err_set(CO_EINVAL, "cm_zmq_new: CURVE needs the server keypair and the client "
                                     "secret key, 40 Z85 characters each");
    if (o.rcvhwm_msgs < 0) return co_err_set(CO_EINVAL, "cm_zmq_new: rcvhwm_msgs %d < 0", o.rcvhwm_msgs);
    if (o.rcvhwm_msgs == 0) {
        size_t per = o.chunk_bytes + 4096, n = ((size_t)256 << 20) / per;
        o.rcvhwm_msgs = n < 16 ? 16 : n > 65536 ? 65536 : (int)n;
    }

    char my_pub[41] = "", my_sec[41] = ""; /* this rank's CURVE keypair (tcp peers) */
    cm__tp *t = calloc(1, sizeof *t);
    if (!t) return co_err_set(CO_ENOMEM, "cm_zmq_new");
    t->efd = -1;
    t->shm_sock = -1;
    t->shm_memfd = -1;
    t->rank = rank;
    t->size = size;
    t->opt = o;
    t->refs = 1;
    atomic_init(&t->aborted, 0);
    t->dealer = calloc((size_t)size, sizeof(void *));
    t->mon = calloc((size_t)size, sizeof(void *));
    t->items = calloc((size_t)size + 2, sizeof(zmq_pollitem_t)); /* + abort efd, doorbell */
    t->dead_at = calloc((size_t)size, sizeof(int64_t));
    t->hello = calloc((size_t)size, sizeof(bool));
    t->head = calloc((size_t)size, sizeof(cm__ent *));
    t->tail = calloc((size_t)size, sizeof(cm__ent *));
    int rc = 0;
    if (!t->dealer || !t->mon || !t->items || !t->dead_at || !t->hello || !t->head || !t->tail) {
        rc = co_err_set(CO_ENOMEM, "cm_zmq_new");
        goto fail;
    }
    t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    t->ctx = zmq_ctx_new();
    if (t->efd < 0 || !t->ctx) {
        rc = co_err_set(CO_EIO, "cm_zmq_new: eventfd or ZeroMQ context");
        goto fail;
    }
    zmq_ctx_set(t->ctx, ZMQ_IO_THREADS, o.io_threads);
    zmq_ctx_set(t->ctx, ZMQ_BLOCKY, 0);
    /* CURVE where the endpoint is tcp; ipc endpoints live in a private directory */
    t->curve_router = curve && !strncmp(endpoints[rank], "tcp://", 6);
    if (t->curve_router) {
        rc = cm__zap_start(t->ctx, o.curve_client_secret, size, rank, &t->zap);
        if (rc) goto fail;
    }
    t->router = zmq_socket(t->ctx, ZMQ_ROUTER);
    /* without CURVE a reconnecting peer takes its route back (handover); with it, routes
     * carry no identity, so none is handed over */
    if (!t->router || cm__sock_common(&o, t->router) ||
        cm__setopt(t->router, ZMQ_ROUTER_HANDOVER, t->curve_router ? 0 : 1)) {
        rc = co_err_set(CO_EIO, "cm_zmq_new: router socket: %s", zmq_strerror(errno));
        goto fail;
    }
    if (t->curve_router) {
        /* the ZAP handler is bound before this socket exists and lives until the context
         * ends, so every handshake is put to it (libzmq admits all only without one) */
        if (cm__setopt(t->router, ZMQ_CURVE_SERVER, 1) ||
            zmq_setsockopt(t->router, ZMQ_CURVE_SECRETKEY, o.curve_server_secret, 40) ||
            zmq_setsockopt(t->router, ZMQ_ZAP_DOMAIN, CM__ZAP_DOMAIN, strlen(CM__ZAP_DOMAIN))) {
            rc = co_err_set(CO_EIO, "cm_zmq_new: CURVE server options: %s", zmq_strerror(errno));
            goto fail;
        }
    }
    if (zmq_bind(t->router, endpoints[rank]) != 0) {
        rc = co_err_set(CO_EIO, "cm_zmq_new: bind %s: %s", endpoints[rank], zmq_strerror(errno));
        goto fail;
    }
    rc = cm__shm_setup(t, endpoints);
    if (rc) goto fail;
    t->items[0] = (zmq_pollitem_t){t->router, 0, ZMQ_POLLIN, 0};
    t->items[1] = (zmq_pollitem_t){NULL, t->efd, ZMQ_POLLIN, 0};
    t->nitems = 2;
    unsigned char id[5] = {'R'};
    cm__put32(id + 1, (uint32_t)rank);
    if (curve) {
        rc = cm__rank_keypair(o.curve_client_secret, rank, my_pub, my_sec);
        if (rc) goto fail;
    }
    for (int r = 0; r < size; r++) {
        if (r == rank) continue;
        char mep[64];
        snprintf(mep, sizeof mep, "inproc://cm-monitor-%d", r);
        void *d = t->dealer[r] = zmq_socket(t->ctx, ZMQ_DEALER);
        /* to a tcp peer: CURVE with this rank's key; else the routing id names this rank */
        bool dcurve = curve && !strncmp(endpoints[r], "tcp://", 6);
        if (!d || cm__sock_common(&o, d) ||
            (dcurve ? zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, o.curve_server_public, 40) ||
                          zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, my_pub, 40) ||
                          zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, my_sec, 40)
                    : zmq_setsockopt(d, ZMQ_ROUTING_ID, id, sizeof id)) ||
            zmq_socket_monitor(d, mep, ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)) {
            rc = co_err_set(CO_EIO, "cm_zmq_new: dealer socket: %s", zmq_strerror(errno));
            goto fail;
        }
        void *m = t->mon[r] = zmq_socket(t->ctx, ZMQ_PAIR);
        if (!m || zmq_connect(m, mep) != 0) {
            rc = co_err_set(CO_EIO, "cm_zmq_new: monitor socket: %s", zmq_strerror(errno));
            goto fail;
        }
        if (zmq_connect(d, endpoints[r]) != 0) {
            rc = co_err_set(CO_EIO, "cm_zmq_new: connect %s: %s", endpoints[r], zmq_strerror(errno));
            goto fail;
        }
        t->items[t->nitems++] = (zmq_pollitem_t){m, 0, ZMQ_POLLIN, 0};
    }
    explicit_bzero(my_sec, sizeof my_sec); /* ZeroMQ keeps its own copy */
    /* one past nitems: this rank's doorbell, polled only by shared-memory waits */
    t->items[t->nitems] = (zmq_pollitem_t){NULL, t->shm_on ? t->seg[rank].efd : t->efd, ZMQ_POLLIN, 0};
    /* HELLO to everyone; messages queue until the peer's endpoint exists. */
    for (int r = 0; r < size; r++) {
        if (r == rank) continue;
        unsigned char p[CM__HELLO_BYTES] = {0};
        cm__put32(p, (uint32_t)rank);
        cm__put32(p + 4, (uint32_t)size);
        cm__put64(p + 8, o.chunk_bytes);
        cm__put64(p + 16, o.small_bytes);
        cm__put64(p + 24, o.shm_block_bytes);
        cm__put64(p + 32, t->nonce); /* 0: no segment offered */
        cm__hdr h = {.kind = CM__K_HELLO};
        rc = cm__send_copy(t, r, &h, p, sizeof p, cm__deadline(o.connect_timeout_ms));
        if (rc) goto fail;
    }
    int64_t dl = cm__deadline(o.connect_timeout_ms);
    for (int r = 0; r < size; r++) {
        while (r != rank && !t->hello[r]) {
            rc = cm__pump(t, -1, 0, 0, dl, "connect");
            if (rc) goto fail;
        }
    }
    if (t->shm_on) {
        /* every peer that offers a segment answers ours (CM__SHM_FDS); then every rank tells
         * the others whose segments it mapped, so that all agree on the pairs that share */
        for (int r = 0; r < size; r++) {
            while (r != rank && t->peer_nonce[r] && !(t->shm_state[r] & CM__SS_FDS)) {
                rc = cm__pump(t, -1, 0, 0, dl, "connect (shared memory)");
                if (rc) goto fail;
            }
        }
        uint32_t nl = 0;
        unsigned char *lst = malloc(4 * (size_t)size);
        if (!lst) {
            rc = co_err_set(CO_ENOMEM, "cm_zmq_new");
            goto fail;
        }
        for (int r = 0; r < size; r++)
            if (t->shm_state[r] & CM__SS_MAPPED) cm__put32(lst + 4 * nl++, (uint32_t)r);
        for (int r = 0; r < size && !rc; r++) {
            if (r == rank || !t->peer_nonce[r]) continue;
            cm__hdr h = {.kind = CM__K_SHM, .arg = CM__SHM_LIST};
            rc = cm__send_copy(t, r, &h, lst, 4 * (size_t)nl, dl);
        }
        free(lst);
        if (rc) goto fail;
        for (int r = 0; r < size; r++) {
            while (r != rank && t->peer_nonce[r] && !(t->shm_state[r] & CM__SS_LIST)) {
                rc = cm__pump(t, -1, 0, 0, dl, "connect (shared memory)");
                if (rc) goto fail;
            }
        }
        cm__shm_setup_done(t);
    }
    int *world = malloc(sizeof(int) * (size_t)size);
    if (!world) {
        rc = co_err_set(CO_ENOMEM, "cm_zmq_new");
        goto fail;
    }
    for (int r = 0; r < size; r++) world[r] = r;
    cm__group *g = cm__group_new(t, 0x636f686f7274ull /* world */, world, size, rank);
    free(world);
    if (!g) {
        rc = co_err_set(CO_ENOMEM, "cm_zmq_new");
        goto fail;
    }
    *out = &g->pub;
    return 0;
fail:
    explicit_bzero(my_sec, sizeof my_sec);
    if (rc == CO_ETIMEOUT) {
        char missing[256] = "";
        size_t n = 0;
        for (int r = 0; r < size && n + 16 < sizeof missing; r++)
            if (r != rank && !t->hello[r]) n += (size_t)snprintf(missing + n, sizeof missing - n, " %d", r);
        rc = co_err_set(CO_ETIMEOUT, "cm_zmq_new: world rank %d: no answer within %d ms from ranks%s",
                        rank, o.connect_timeout_ms, missing);
    }
    {
        char keep[512];
        snprintf(keep, sizeof keep, "%s", co_err_detail());
        t->failed = t->failed ? t->failed : rc;
        cm__tp_close(t, 0);
        cm__tp_free(t);
        co_err_set(rc, "%s", keep);
    }
    return rc;
}
