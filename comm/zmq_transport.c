/* zmq_transport.c - the ZeroMQ transport under the CPU collectives (zmq_comm.h): sockets,
 * setup (cm_zmq_new), framing, sending, receiving with the per-peer stash, failure.
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
 * FAIL message naming the root cause to every peer, closes the sockets and stays failed. */
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

const char *const cm__op_name[] = {"?",       "allreduce",      "broadcast", "allgather",
                                   "reduce_scatter", "barrier", "split",     "send/recv",
                                   "alltoall"};

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

__attribute__((format(printf, 3, 4))) int cm__fail(cm__tp *t, int code, const char *fmt,
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
int cm__check(cm__tp *t) {
    if (t->failed) return co_err_set(t->failed, "%s", t->fail_msg);
    if (atomic_load_explicit(&t->aborted, memory_order_acquire))
        return cm__fail(t, CO_EABORTED, "communicator aborted");
    /* the flag is a plain int another thread raises: read it atomically (no torn or cached read) */
    if (t->opt.cancel && __atomic_load_n(t->opt.cancel, __ATOMIC_ACQUIRE)) return cm__fail(t, CO_EABORTED, "communicator aborted (cancelled)");
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
int cm__send_hdr_payload(cm__tp *t, int wdst, const cm__hdr *h, zmq_msg_t *payload,
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
    size_t plen = zmq_msg_size(payload);
    if (zmq_msg_send(payload, s, ZMQ_DONTWAIT) < 0) {
        int e = errno;
        zmq_msg_close(payload);
        if (deadline == 0) return CO_EIO;
        return cm__fail(t, CO_EIO, "send to world rank %d: %s", wdst, zmq_strerror(e));
    }
    t->zmq_bytes += plen;
    return 0;
}

/* Sends a copy of p[len]. */
int cm__send_copy(cm__tp *t, int wdst, const cm__hdr *h, const void *p, size_t len,
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

void cm__drain_monitors(cm__tp *t) {
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

int cm__read_one(cm__tp *t, int *src_out, cm__ent **ent_out) {
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
int cm__recv(cm__group *g, int kind, int gsrc, const cm__hdr *want, size_t len,
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
                                what, want->seq, src, cm__op_name[h.op < CM__NOPS ? h.op : 0], h.seq);
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

void cm__tp_free(cm__tp *t) {
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
