/* mailbox.c - ZeroMQ sockets on an actor's libuv loop: ROUTER (bind) and DEALER (connect)
 * mailboxes, request/reply with correlation and timeouts, per-peer send queues, CURVE and
 * connection events (zmq_socket_monitor).
 *
 * ZMQ_FD is edge-triggered: it only says "something changed". Every wake-up (and every send,
 * which can swallow the edge) is followed by a drain that loops on ZMQ_EVENTS & ZMQ_POLLIN
 * with ZMQ_DONTWAIT until it clears. Sends made outside a drain schedule one through the
 * actor's idle handle.
 *
 * Wire format: each message is one frame (after the ROUTER identity frame) starting with a
 * kind byte: AC_K_MSG, or AC_K_REQ / AC_K_REP followed by an 8-byte little-endian request id. */
#include "actors/internal.h"

#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* draft API in libzmq 4.3; the library supports it */
#endif

enum { AC_K_MSG = 0xA0, AC_K_REQ = 0xA1, AC_K_REP = 0xA2 };
enum { DRAIN_BATCH = 4096 };

typedef struct outmsg {
    zmq_msg_t body;
    struct outmsg *next;
} outmsg;

typedef struct outq { /* messages for one peer waiting for ZeroMQ's queue to free up */
    char peer[256];
    size_t plen;
    outmsg *head, *tail;
    struct outq *next;
} outq;

typedef struct req {
    uint64_t id;
    ac_reply_fn cb;
    void *ctx;
    ac_mailbox *mb;
    uv_timer_t timer;
    struct req *prev, *next;
} req;

struct ac_mailbox {
    ac_actor *a;
    ac_mailbox *prev, *next;
    void *sock;
    uv_poll_t poll;
    int server;
    char endpoint[512];
    ac_mailbox_opts opts;
    char zap_domain[256];
    uint8_t zap_key[32];
    int zap_registered;

    outq *outqs;
    size_t nqueued;
    uv_timer_t retry; /* while messages wait: retries the flush every millisecond */
    int retry_active;

    req *reqs;
    uint64_t next_id;

    void *mon;        /* PAIR socket reading the monitor's events */
    uv_poll_t mon_poll;

    int closed;
    int in_drain;
    int want_drain;
    int open_handles; /* libuv handles still to close before the struct is freed */
};

/* ---- helpers ------------------------------------------------------------------------- */

static int zerr(const char *what, const ac_mailbox *mb) {
    int e = zmq_errno();
    return co_err_set(CO_EINTERNAL, "mailbox %s: %s: %s", mb ? mb->endpoint : "?", what,
                      zmq_strerror(e));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void want_drain(ac_mailbox *mb) {
    if (mb->closed) return;
    mb->want_drain = 1;
    if (!mb->in_drain) ac__actor_want_drain(mb->a);
}

static void handle_closed(uv_handle_t *h) {
    ac_mailbox *mb = h->data;
    if (--mb->open_handles == 0) free(mb);
}

/* ---- sending ------------------------------------------------------------------------- */

/* Tries to hand one message to ZeroMQ. 0 sent (body consumed), 1 would block (body kept),
 * CO_EREMOTE unroutable peer, other negative on failure. */
static int try_send(ac_mailbox *mb, const char *peer, size_t plen, zmq_msg_t *body) {
    if (mb->server) {
        if (zmq_send(mb->sock, peer, plen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            if (e == EAGAIN) return 1;
            if (e == EHOSTUNREACH)
                return co_err_set(CO_EREMOTE, "mailbox %s: peer '%s' is not connected",
                                  mb->endpoint, peer);
            return zerr("send", mb);
        }
    }
    if (zmq_msg_send(body, mb->sock, ZMQ_DONTWAIT) < 0) {
        if (!mb->server && zmq_errno() == EAGAIN) return 1;
        return zerr("send", mb); /* a ROUTER's body frame cannot block after its identity */
    }
    return 0;
}

static outq *find_outq(ac_mailbox *mb, const char *peer, size_t plen) {
    for (outq *q = mb->outqs; q; q = q->next)
        if (q->plen == plen && !memcmp(q->peer, peer, plen)) return q;
    return NULL;
}

static void free_outq(ac_mailbox *mb, outq *q) {
    for (outmsg *m = q->head; m;) {
        outmsg *n = m->next;
        zmq_msg_close(&m->body);
        free(m);
        mb->nqueued--;
        m = n;
    }
    free(q);
}

static void on_retry(uv_timer_t *t);

static void flush(ac_mailbox *mb) {
    int had = mb->outqs != NULL;
    for (outq **qp = &mb->outqs; *qp && !mb->closed;) {
        outq *q = *qp;
        int rc = 0;
        while (q->head) {
            rc = try_send(mb, q->peer, q->plen, &q->head->body);
            if (rc) break;
            outmsg *m = q->head;
            q->head = m->next;
            zmq_msg_close(&m->body);
            free(m);
            mb->nqueued--;
        }
        if (!q->head || rc < 0) { /* sent all, or the peer is gone: drop the rest */
            *qp = q->next;
            free_outq(mb, q);
        } else {
            qp = &q->next;
        }
    }
    if (mb->outqs && !mb->retry_active && !mb->closed) {
        uv_timer_start(&mb->retry, on_retry, 1, 1);
        mb->retry_active = 1;
    } else if (!mb->outqs && mb->retry_active) {
        uv_timer_stop(&mb->retry);
        mb->retry_active = 0;
    }
    if (had && !mb->outqs && !mb->closed && mb->opts.on_drained)
        mb->opts.on_drained(mb, mb->opts.ctx);
}

static void on_retry(uv_timer_t *t) {
    ac_mailbox *mb = t->data;
    flush(mb);
    want_drain(mb);
}

static int send_kind(ac_mailbox *mb, const char *peer, int kind, uint64_t id, const void *data,
                     size_t len) {
    if (!mb) return co_err_set(CO_EINVAL, "ac_send: no mailbox");
    if (mb->closed) return co_err_set(CO_EABORTED, "mailbox %s is closed", mb->endpoint);
    if (len && !data) return co_err_set(CO_EINVAL, "ac_send: no data");
    size_t plen = 0;
    if (mb->server) {
        if (!peer || !(plen = strlen(peer)) || plen > 255)
            return co_err_set(CO_EINVAL, "mailbox %s: a server send needs a peer identity",
                              mb->endpoint);
    } else if (peer) {
        return co_err_set(CO_EINVAL, "mailbox %s: a client send takes no peer", mb->endpoint);
    } else {
        peer = "";
    }
    size_t hdr = kind == AC_K_MSG ? 1 : 9;
    zmq_msg_t body;
    if (zmq_msg_init_size(&body, hdr + len) != 0)
        return co_err_set(CO_ENOMEM, "mailbox %s: out of memory", mb->endpoint);
    uint8_t *p = zmq_msg_data(&body);
    p[0] = (uint8_t)kind;
    if (hdr == 9) put_u64(p + 1, id);
    if (len) memcpy(p + hdr, data, len);

    outq *q = mb->outqs ? find_outq(mb, peer, plen) : NULL;
    if (!q) {
        int rc = try_send(mb, peer, plen, &body);
        if (rc <= 0) {
            if (rc < 0) zmq_msg_close(&body);
            want_drain(mb);
            return rc;
        }
    }
    /* Would block, or earlier messages to this peer still wait: queue behind them. */
    if (mb->nqueued >= mb->opts.max_queued) {
        zmq_msg_close(&body);
        return co_err_set(CO_ENOSPC, "mailbox %s: send queue full (%zu messages)", mb->endpoint,
                          mb->nqueued);
    }
    outmsg *m = malloc(sizeof *m);
    if (!q && m) {
        q = calloc(1, sizeof *q);
        if (q) {
            memcpy(q->peer, peer, plen);
            q->plen = plen;
            q->next = mb->outqs;
            mb->outqs = q;
        }
    }
    if (!m || !q) {
        free(m);
        zmq_msg_close(&body);
        return co_err_set(CO_ENOMEM, "mailbox %s: out of memory", mb->endpoint);
    }
    zmq_msg_init(&m->body);
    zmq_msg_move(&m->body, &body);
    m->next = NULL;
    if (q->tail && q->head) q->tail->next = m;
    else q->head = m;
    q->tail = m;
    mb->nqueued++;
    if (!mb->retry_active) {
        uv_timer_start(&mb->retry, on_retry, 1, 1);
        mb->retry_active = 1;
    }
    want_drain(mb);
    return 0;
}

int ac_send(ac_mailbox *mb, const char *peer, const void *data, size_t len) {
    return send_kind(mb, peer, AC_K_MSG, 0, data, len);
}

int ac_reply_to(ac_mailbox *mb, const char *peer, uint64_t request_id, const void *data,
                size_t len) {
    if (!request_id) return co_err_set(CO_EINVAL, "ac_reply: not a request");
    return send_kind(mb, peer, AC_K_REP, request_id, data, len);
}

int ac_reply(ac_mailbox *mb, const ac_msg *m, const void *data, size_t len) {
    if (!m) return co_err_set(CO_EINVAL, "ac_reply: no request");
    return ac_reply_to(mb, m->peer, m->request_id, data, len);
}

/* ---- requests ------------------------------------------------------------------------ */

static void req_closed(uv_handle_t *h) { free(h->data); }

static void req_unlink(req *r) {
    ac_mailbox *mb = r->mb;
    if (r->prev) r->prev->next = r->next;
    else mb->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    uv_timer_stop(&r->timer);
    uv_close((uv_handle_t *)&r->timer, req_closed);
}

static void on_req_timeout(uv_timer_t *t) {
    req *r = t->data;
    ac_mailbox *mb = r->mb;
    ac_reply_fn cb = r->cb;
    void *ctx = r->ctx;
    uint64_t id = r->id;
    req_unlink(r);
    co_err_set(CO_ETIMEOUT, "mailbox %s: request %llu got no reply in time", mb->endpoint,
               (unsigned long long)id);
    cb(mb, CO_ETIMEOUT, NULL, ctx);
}

int ac_request(ac_mailbox *mb, const char *peer, const void *data, size_t len, int timeout_ms,
               ac_reply_fn cb, void *ctx) {
    if (!mb || !cb || timeout_ms <= 0)
        return co_err_set(CO_EINVAL, "ac_request: needs a mailbox, a callback and a timeout");
    if (mb->closed) return co_err_set(CO_EABORTED, "mailbox %s is closed", mb->endpoint);
    req *r = calloc(1, sizeof *r);
    if (!r) return co_err_set(CO_ENOMEM, "ac_request: out of memory");
    r->id = ++mb->next_id;
    int rc = send_kind(mb, peer, AC_K_REQ, r->id, data, len);
    if (rc) {
        free(r);
        return rc;
    }
    r->cb = cb;
    r->ctx = ctx;
    r->mb = mb;
    uv_timer_init(&mb->a->loop, &r->timer);
    r->timer.data = r;
    uv_timer_start(&r->timer, on_req_timeout, (uint64_t)timeout_ms, 0);
    r->next = mb->reqs;
    if (mb->reqs) mb->reqs->prev = r;
    mb->reqs = r;
    return 0;
}

/* ---- receiving ----------------------------------------------------------------------- */

static void dispatch(ac_mailbox *mb, const char *peer, zmq_msg_t *body) {
    const uint8_t *p = zmq_msg_data(body);
    size_t n = zmq_msg_size(body);
    if (n < 1) return;
    ac_msg m = {.peer = peer};
    if (p[0] == AC_K_MSG) {
        m.data = p + 1;
        m.len = n - 1;
    } else if ((p[0] == AC_K_REQ || p[0] == AC_K_REP) && n >= 9) {
        m.request_id = get_u64(p + 1);
        m.data = p + 9;
        m.len = n - 9;
    } else {
        return; /* not ours: dropped */
    }
    if (p[0] == AC_K_REP) {
        req *r = mb->reqs;
        while (r && r->id != m.request_id) r = r->next;
        if (!r) return; /* late (timed out) or unknown: dropped */
        ac_reply_fn cb = r->cb;
        void *ctx = r->ctx;
        req_unlink(r);
        m.request_id = 0;
        cb(mb, 0, &m, ctx);
        return;
    }
    if (mb->opts.on_message) mb->opts.on_message(mb, &m, mb->opts.ctx);
}

/* Receives and dispatches one message; 0 if none was waiting. */
static int recv_one(ac_mailbox *mb) {
    char peer[256];
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, mb->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        return 0;
    }
    int ok = 1;
    if (mb->server) {
        size_t pl = zmq_msg_size(&f);
        if (pl > 255 || !zmq_msg_more(&f)) ok = 0;
        else {
            memcpy(peer, zmq_msg_data(&f), pl);
            peer[pl] = 0;
            if (memchr(peer, 0, pl)) ok = 0; /* not a string identity */
            zmq_msg_close(&f);
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, mb->sock, ZMQ_DONTWAIT) < 0) ok = 0;
        }
    }
    int extra = zmq_msg_more(&f);
    while (extra) { /* more frames than we send: drop the message */
        zmq_msg_t x;
        zmq_msg_init(&x);
        ok = 0;
        extra = zmq_msg_recv(&x, mb->sock, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&x);
        zmq_msg_close(&x);
    }
    if (ok) dispatch(mb, mb->server ? peer : NULL, &f);
    zmq_msg_close(&f);
    return 1;
}

/* Receives until ZeroMQ says EAGAIN, then asks ZMQ_EVENTS (which also processes pending
 * commands) whether more came meanwhile; ends only when ZMQ_EVENTS shows no POLLIN, which
 * re-arms the edge-triggered ZMQ_FD. Asking ZMQ_EVENTS once per batch rather than per message
 * saves a poll() system call per message. */
static void drain(ac_mailbox *mb) {
    if (mb->closed) return;
    mb->in_drain++;
    mb->want_drain = 0;
    int n = 0;
    while (!mb->closed) {
        if (mb->outqs) flush(mb);
        while (!mb->closed && n < DRAIN_BATCH && recv_one(mb)) n++;
        if (mb->closed) break;
        if (n >= DRAIN_BATCH) { /* let the rest of the loop run; come back next turn */
            mb->in_drain--;
            want_drain(mb);
            return;
        }
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(mb->sock, ZMQ_EVENTS, &ev, &sz) != 0) break;
        if (ev & ZMQ_POLLIN) continue;
        /* ZMQ_EVENTS may just have processed the peer's "you can write again": the edge is
         * spent, so flush now instead of waiting for the retry timer. */
        if (!mb->outqs || !(ev & ZMQ_POLLOUT)) break;
        size_t before = mb->nqueued;
        flush(mb);
        if (mb->closed || mb->nqueued == before) break;
    }
    mb->in_drain--;
}

static void drain_monitor(ac_mailbox *mb);

static void on_poll(uv_poll_t *h, int status, int events) {
    (void)status;
    (void)events;
    drain(h->data);
}

static void on_mon_poll(uv_poll_t *h, int status, int events) {
    (void)status;
    (void)events;
    drain_monitor(h->data);
}

void ac__mailbox_drain_pending(ac_actor *a) {
    for (ac_mailbox *mb = a->mailboxes; mb;) {
        ac_mailbox *next = mb->next; /* a callback may close mb (it stays allocated) */
        if (mb->want_drain) drain(mb);
        if (mb->mon && !mb->closed) drain_monitor(mb);
        mb = next;
    }
}

/* ---- monitor ------------------------------------------------------------------------- */

static void drain_monitor(ac_mailbox *mb) {
    while (!mb->closed && mb->mon) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(mb->mon, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN)) break;
        zmq_msg_t f1, f2;
        zmq_msg_init(&f1);
        zmq_msg_init(&f2);
        if (zmq_msg_recv(&f1, mb->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f1);
            zmq_msg_close(&f2);
            break;
        }
        char ep[512] = "";
        if (zmq_msg_more(&f1) && zmq_msg_recv(&f2, mb->mon, ZMQ_DONTWAIT) >= 0) {
            size_t n = zmq_msg_size(&f2);
            if (n >= sizeof ep) n = sizeof ep - 1;
            memcpy(ep, zmq_msg_data(&f2), n);
            ep[n] = 0;
        }
        int event = 0;
        if (zmq_msg_size(&f1) >= 2) {
            const uint8_t *p = zmq_msg_data(&f1);
            uint16_t e16;
            memcpy(&e16, p, 2);
            switch (e16) {
            case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: event = AC_EV_CONNECTED; break;
            case ZMQ_EVENT_DISCONNECTED: event = AC_EV_DISCONNECTED; break;
            case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL: event = AC_EV_AUTH_FAILED; break;
            default: break;
            }
        }
        zmq_msg_close(&f1);
        zmq_msg_close(&f2);
        if (event && mb->opts.on_event) mb->opts.on_event(mb, event, ep, mb->opts.ctx);
    }
}

static int start_monitor(ac_mailbox *mb) {
    static atomic_uint seq;
    char addr[96];
    snprintf(addr, sizeof addr, "inproc://ac-monitor-%p-%u", (void *)mb,
             atomic_fetch_add(&seq, 1));
    if (zmq_socket_monitor(mb->sock, addr,
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
        return zerr("zmq_socket_monitor", mb);
    mb->mon = zmq_socket(mb->a->zctx, ZMQ_PAIR);
    if (!mb->mon) return zerr("monitor socket", mb);
    int zero = 0;
    zmq_setsockopt(mb->mon, ZMQ_LINGER, &zero, sizeof zero);
    int fd;
    size_t sz = sizeof fd;
    if (zmq_connect(mb->mon, addr) != 0 || zmq_getsockopt(mb->mon, ZMQ_FD, &fd, &sz) != 0) {
        int rc = zerr("monitor connect", mb);
        zmq_close(mb->mon);
        mb->mon = NULL;
        return rc;
    }
    uv_poll_init_socket(&mb->a->loop, &mb->mon_poll, fd);
    mb->mon_poll.data = mb;
    mb->open_handles++;
    uv_poll_start(&mb->mon_poll, UV_READABLE, on_mon_poll);
    return 0;
}

/* ---- open and close ------------------------------------------------------------------ */

void ac_mailbox_close(ac_mailbox **mbp) {
    if (!mbp || !*mbp) return;
    ac_mailbox *mb = *mbp;
    *mbp = NULL;
    if (mb->closed) return;
    mb->closed = 1;
    ac_actor *a = mb->a;
    if (mb->prev) mb->prev->next = mb->next;
    else a->mailboxes = mb->next;
    if (mb->next) mb->next->prev = mb->prev;
    mb->prev = mb->next = NULL;
    /* Stop watching the fds before ZeroMQ closes them (uv_close unregisters at once). */
    uv_close((uv_handle_t *)&mb->poll, handle_closed);
    if (mb->mon) {
        uv_close((uv_handle_t *)&mb->mon_poll, handle_closed);
        zmq_socket_monitor(mb->sock, NULL, 0);
        zmq_close(mb->mon);
        mb->mon = NULL;
    }
    uv_timer_stop(&mb->retry);
    uv_close((uv_handle_t *)&mb->retry, handle_closed);
    while (mb->outqs) {
        outq *q = mb->outqs;
        mb->outqs = q->next;
        free_outq(mb, q);
    }
    zmq_close(mb->sock);
    mb->sock = NULL;
    if (mb->zap_registered) ac__zap_disallow(mb->zap_domain, mb->zap_key);
    while (mb->reqs) {
        req *r = mb->reqs;
        ac_reply_fn cb = r->cb;
        void *ctx = r->ctx;
        req_unlink(r);
        co_err_set(CO_EABORTED, "mailbox %s closed before the reply", mb->endpoint);
        cb(mb, CO_EABORTED, NULL, ctx);
    }
}

void ac__mailbox_close_all(ac_actor *a) {
    while (a->mailboxes) {
        ac_mailbox *mb = a->mailboxes;
        ac_mailbox_close(&mb);
    }
}

static int set_int(ac_mailbox *mb, int opt, int v, const char *name) {
    if (zmq_setsockopt(mb->sock, opt, &v, sizeof v) != 0) return zerr(name, mb);
    return 0;
}

static int set_key(ac_mailbox *mb, int opt, const char *z85, const char *name) {
    if (strlen(z85) != AC_KEY_Z85_LEN)
        return co_err_set(CO_EINVAL, "mailbox %s: %s is not a Z85 key", mb->endpoint, name);
    if (zmq_setsockopt(mb->sock, opt, z85, AC_KEY_Z85_LEN + 1) != 0) return zerr(name, mb);
    return 0;
}

static int open_mailbox(ac_actor *a, int server, const char *endpoint, const char *identity,
                        const ac_mailbox_opts *opts, ac_mailbox **out) {
    if (!out) return co_err_set(CO_EINVAL, "mailbox: no output");
    *out = NULL;
    if (!a || !endpoint) return co_err_set(CO_EINVAL, "mailbox: no actor or endpoint");
    if (a->shutting_down) return co_err_set(CO_EABORTED, "actor %s is stopping", a->name);
    if (strlen(endpoint) >= sizeof ((ac_mailbox *)0)->endpoint)
        return co_err_set(CO_EINVAL, "mailbox: endpoint too long");
    if (!server && (!identity || !*identity || strlen(identity) > 255))
        return co_err_set(CO_EINVAL, "mailbox %s: identity must be 1..255 bytes", endpoint);
    ac_mailbox *mb = calloc(1, sizeof *mb);
    if (!mb) return co_err_set(CO_ENOMEM, "mailbox: out of memory");
    mb->a = a;
    mb->server = server;
    snprintf(mb->endpoint, sizeof mb->endpoint, "%s", endpoint);
    if (opts) mb->opts = *opts;
    if (mb->opts.hwm <= 0) mb->opts.hwm = 1000;
    if (!mb->opts.max_queued) mb->opts.max_queued = 1000000;
    mb->opts.secret = NULL; /* not kept: the keys live in the socket */
    snprintf(mb->zap_domain, sizeof mb->zap_domain, "%s",
             opts && opts->zap_domain ? opts->zap_domain : "cohort");
    mb->opts.zap_domain = mb->zap_domain;
    const ac_secret *sec = opts ? opts->secret : NULL;

    /* libuv handles first, so the failure path can always close them. */
    uv_timer_init(&a->loop, &mb->retry);
    mb->retry.data = mb;
    mb->open_handles = 1;
    mb->sock = zmq_socket(a->zctx, server ? ZMQ_ROUTER : ZMQ_DEALER);
    int rc = 0;
    if (!mb->sock) {
        rc = zerr("zmq_socket", mb);
        uv_close((uv_handle_t *)&mb->retry, handle_closed);
        return rc;
    }
    int fd;
    size_t sz = sizeof fd;
    if (zmq_getsockopt(mb->sock, ZMQ_FD, &fd, &sz) != 0) {
        rc = zerr("ZMQ_FD", mb);
        zmq_close(mb->sock);
        uv_close((uv_handle_t *)&mb->retry, handle_closed);
        return rc;
    }
    uv_poll_init_socket(&a->loop, &mb->poll, fd);
    mb->poll.data = mb;
    mb->open_handles++;
    /* Linked now so ac_mailbox_close can undo everything below. */
    mb->next = a->mailboxes;
    if (a->mailboxes) a->mailboxes->prev = mb;
    a->mailboxes = mb;

    if (!rc) rc = set_int(mb, ZMQ_LINGER, 0, "ZMQ_LINGER");
    if (!rc) rc = set_int(mb, ZMQ_SNDHWM, mb->opts.hwm, "ZMQ_SNDHWM");
    if (!rc) rc = set_int(mb, ZMQ_RCVHWM, mb->opts.hwm, "ZMQ_RCVHWM");
    /* A frame over the limit makes ZeroMQ drop the connection before buffering it. */
    if (!rc && mb->opts.max_msg_size >= 0) {
        int64_t lim = mb->opts.max_msg_size ? mb->opts.max_msg_size : AC_MAX_MSG_DEFAULT;
        if (zmq_setsockopt(mb->sock, ZMQ_MAXMSGSIZE, &lim, sizeof lim)) rc = zerr("ZMQ_MAXMSGSIZE", mb);
    }
    /* ZMTP heartbeats: a dead tcp peer is noticed (and disconnected) within seconds. */
    if (!rc) rc = set_int(mb, ZMQ_HEARTBEAT_IVL, 1000, "ZMQ_HEARTBEAT_IVL");
    if (!rc) rc = set_int(mb, ZMQ_HEARTBEAT_TIMEOUT, 5000, "ZMQ_HEARTBEAT_TIMEOUT");
    if (!rc && server) {
        rc = set_int(mb, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY");
        /* A restarted peer reconnecting with the same identity takes over its route. */
        if (!rc) rc = set_int(mb, ZMQ_ROUTER_HANDOVER, 1, "ZMQ_ROUTER_HANDOVER");
    }
    if (!rc && !server && zmq_setsockopt(mb->sock, ZMQ_ROUTING_ID, identity, strlen(identity)))
        rc = zerr("ZMQ_ROUTING_ID", mb);
    if (!rc && sec) {
        if (!zmq_has("curve")) {
            rc = co_err_set(CO_EUNSUPPORTED, "mailbox %s: libzmq has no CURVE", endpoint);
        } else if (server) {
            rc = set_int(mb, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER");
            if (!rc) rc = set_key(mb, ZMQ_CURVE_SECRETKEY, sec->server_secret, "server secret key");
            if (!rc && zmq_setsockopt(mb->sock, ZMQ_ZAP_DOMAIN, mb->zap_domain,
                                      strlen(mb->zap_domain)))
                rc = zerr("ZMQ_ZAP_DOMAIN", mb);
            if (!rc) rc = set_int(mb, ZMQ_ZAP_ENFORCE_DOMAIN, 1, "ZMQ_ZAP_ENFORCE_DOMAIN");
            if (!rc && (strlen(sec->client_public) != AC_KEY_Z85_LEN ||
                        !zmq_z85_decode(mb->zap_key, sec->client_public)))
                rc = co_err_set(CO_EINVAL, "mailbox %s: client public key is not Z85", endpoint);
            if (!rc) rc = ac__zap_allow(mb->zap_domain, mb->zap_key);
            if (!rc) mb->zap_registered = 1;
        } else {
            rc = set_key(mb, ZMQ_CURVE_SERVERKEY, sec->server_public, "server public key");
            if (!rc) rc = set_key(mb, ZMQ_CURVE_PUBLICKEY, sec->client_public, "client public key");
            if (!rc) rc = set_key(mb, ZMQ_CURVE_SECRETKEY, sec->client_secret, "client secret key");
        }
    }
    if (!rc && mb->opts.on_event) rc = start_monitor(mb);
    if (!rc) {
        if (server ? zmq_bind(mb->sock, endpoint) : zmq_connect(mb->sock, endpoint)) {
            int e = zmq_errno();
            rc = co_err_set(e == EADDRINUSE ? CO_EIO : CO_EINVAL, "mailbox: %s %s: %s",
                            server ? "bind" : "connect", endpoint, zmq_strerror(e));
        }
    }
    if (!rc && server) {
        sz = sizeof mb->endpoint;
        if (zmq_getsockopt(mb->sock, ZMQ_LAST_ENDPOINT, mb->endpoint, &sz) != 0)
            snprintf(mb->endpoint, sizeof mb->endpoint, "%s", endpoint);
    }
    if (rc) {
        ac_mailbox *tmp = mb;
        ac_mailbox_close(&tmp);
        return rc;
    }
    uv_poll_start(&mb->poll, UV_READABLE, on_poll);
    want_drain(mb); /* drain once before relying on the edge */
    *out = mb;
    return 0;
}

int ac_mailbox_bind(ac_actor *a, const char *endpoint, const ac_mailbox_opts *opts,
                    ac_mailbox **out) {
    return open_mailbox(a, 1, endpoint, NULL, opts, out);
}

int ac_mailbox_connect(ac_actor *a, const char *endpoint, const char *identity,
                       const ac_mailbox_opts *opts, ac_mailbox **out) {
    return open_mailbox(a, 0, endpoint, identity, opts, out);
}

const char *ac_mailbox_endpoint(const ac_mailbox *mb) { return mb->endpoint; }
ac_actor *ac_mailbox_actor(const ac_mailbox *mb) { return mb->a; }
size_t ac_mailbox_queued(const ac_mailbox *mb) { return mb->nqueued; }
