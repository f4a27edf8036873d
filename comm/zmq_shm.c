/* zmq_shm.c - shared memory between the ranks of one host: the segments' setup at
 * cm_zmq_new and the all-reduce through them.
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
 * flag, re-checks the word it waits for and sleeps in zmq_poll over the items a transport wait polls
 * (zmq_transport.c) plus its doorbell eventfd, one slice at most; whoever stores a stamp or hands a
 * slot back writes the doorbell of a sleeping peer (sequentially consistent stores and
 * loads on both sides, so no wake-up is lost). Between sleeps it reads ZeroMQ, so a FAIL,
 * an abort, a disconnect, the deadline or a peer's ZeroMQ message for the same call (the
 * peer made another call: CO_EPROTOCOL) end the wait as they end any other. */
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
int cm__shm_offer(cm__tp *t, int r) {
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
int cm__shm_msg(cm__tp *t, int src, const cm__hdr *h, zmq_msg_t *m) {
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

/* ---------------------------------------------------------------- shared-memory all-reduce */

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
                                cm__op_name[h->op], h->seq, q, cm__op_name[e->h.op < CM__NOPS ? e->h.op : 0],
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
        t->shm_bytes += bc * es;
    } else {
        for (int j = 0; j < n; j++) {
            size_t o, l;
            if (j == me) continue;
            cm__seg(bc, n, j, &o, &l);
            memcpy(d + o * es, src + o * es, l * es);
            t->shm_bytes += l * es;
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
    if (!a->direct) t->shm_bytes += l * es;
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
int cm__allreduce_shm(cm__group *g, const cm__hdr *h, void *buf, size_t count, cm_dtype dt,
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

void cm__shm_setup_done(cm__tp *t) {
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
int cm__shm_setup(cm__tp *t, const char *const *endpoints) {
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
