/* zmq_internal.h - what the files of the ZeroMQ collectives share (zmq_transport.c,
 * zmq_coll.c, zmq_shm.c, zmq_group.c): wire constants, the transport and group types, and
 * the cm__ functions one file calls in another. Not for use outside comm/. */
#ifndef COHORT_COMM_ZMQ_INTERNAL_H
#define COHORT_COMM_ZMQ_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "comm/shm_seg.h"
#include "comm/zmq_auth.h"
#include "comm/zmq_comm.h"

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
    CM__OP_ALLTOALL = 8,
    CM__NOPS = 9, /* entries of cm__op_name */
};
extern const char *const cm__op_name[];

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
    /* traffic (cm_zmq_traffic): payload bytes sent over ZeroMQ, bytes this rank wrote into
     * its segment for other ranks to read */
    uint64_t zmq_bytes, shm_bytes;
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

extern const cm_ops cm__zmq_ops; /* zmq_group.c */

/* ---------------------------------------------------------------- small helpers */

static inline int64_t cm__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t cm__deadline(int timeout_ms) {
    return timeout_ms < 0 ? -1 : cm__now_ms() + timeout_ms;
}

static inline size_t cm__dt_size(cm_dtype dt) {
    switch (dt) {
    case CM_F32: return 4;
    case CM_F64: return 8;
    case CM_I64: return 8;
    }
    return 0;
}

static inline void cm__put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void cm__put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t cm__get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t cm__get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static inline cm__group *cm__g(cm_comm *c) { return (cm__group *)c; }

static inline uint64_t cm__fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* zmq_coll.c */
void cm__seg(size_t count, int n, int j, size_t *off, size_t *len);
int cm__allreduce(cm_comm *c, void *buf, size_t count, cm_dtype dt, int timeout_ms);
int cm__broadcast(cm_comm *c, void *bufv, size_t bytes, int root, int timeout_ms);
int cm__allgather(cm_comm *c, const void *sendv, void *recvv, size_t bytes, int timeout_ms);
int cm__reduce_scatter(cm_comm *c, const void *sendv, void *recvv, size_t count, cm_dtype dt, int timeout_ms);
int cm__alltoallv(cm_comm *c, const void *sendv, const size_t *send_bytes, void *recvv,
                  const size_t *recv_bytes, int timeout_ms);
int cm__barrier_op(cm__group *g, int op, int64_t dl);
int cm__barrier(cm_comm *c, int timeout_ms);
int cm__send(cm_comm *c, const void *bufv, size_t bytes, int peer, int timeout_ms);
int cm__recv_p2p(cm_comm *c, void *bufv, size_t bytes, int peer, int timeout_ms);

/* zmq_group.c */
cm__group *cm__group_new(cm__tp *t, uint64_t id, const int *world, int n, int rank);

/* zmq_shm.c */
int cm__shm_offer(cm__tp *t, int r);
int cm__shm_msg(cm__tp *t, int src, const cm__hdr *h, zmq_msg_t *m);
int cm__allreduce_shm(cm__group *g, const cm__hdr *h, void *buf, size_t count, cm_dtype dt, int64_t dl);
void cm__shm_setup_done(cm__tp *t);
int cm__shm_setup(cm__tp *t, const char *const *endpoints);

/* zmq_transport.c */
__attribute__((format(printf, 3, 4))) int cm__fail(cm__tp *t, int code, const char *fmt, ...);
int cm__check(cm__tp *t);
int cm__send_hdr_payload(cm__tp *t, int wdst, const cm__hdr *h, zmq_msg_t *payload, int64_t deadline);
int cm__send_copy(cm__tp *t, int wdst, const cm__hdr *h, const void *p, size_t len, int64_t deadline);
void cm__drain_monitors(cm__tp *t);
int cm__read_one(cm__tp *t, int *src_out, cm__ent **ent_out);
int cm__recv(cm__group *g, int kind, int gsrc, const cm__hdr *want, size_t len, zmq_msg_t *out, int64_t deadline);
void cm__tp_free(cm__tp *t);

#endif
