/* sim_nccl.h - the NCCL stand-in's inside (tests/cudasim/nccl): communicators whose ranks
 * meet in a POSIX shared-memory segment named by the unique id, and the one hook it needs
 * from the CUDA runtime stand-in. Not a public API: nccl.h is the interface.
 *
 * The segment: a header, one record per rank (pid, state, collective round counters), one
 * record per ordered pair of ranks (a point-to-point channel), then the ranks' collective
 * slots and the pairs' channel buffers. Every change bumps the header's futex word and wakes
 * its waiters; every wait sleeps on that word for at most a few milliseconds between checks
 * of the local abort flag, the peers' states and pids, and the wait's deadline. */
#ifndef COHORT_TESTS_CUDASIM_NCCL_SIM_NCCL_H
#define COHORT_TESTS_CUDASIM_NCCL_SIM_NCCL_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The runtime stand-in's stream hook (tests/cudasim/include/cudasim.h declares the same):
 * runs fn(arg) in stream order. sim_enqueue_weak.c holds a weak fallback that runs it at once. */
#ifndef COHORT_CUDASIM_FN_DEFINED
#define COHORT_CUDASIM_FN_DEFINED
typedef void (*cudasim_fn)(void *arg);
#endif
cudaError_t cudasim_enqueue(cudaStream_t s, cudasim_fn fn, void *arg);
/* The same for work that waits on other processes (every collective): the runtime stand-in
 * runs it on a thread of its own, so that cudaStreamQuery never waits for it, as on a GPU. */
cudaError_t cudasim_enqueue_async(cudaStream_t s, cudasim_fn fn, void *arg);

#define SIM_MAX_RANKS 64
#define SIM_SLOT_BYTES ((size_t)256 * 1024) /* a rank's collective slot: one round's chunk */
#define SIM_CHAN_BYTES ((size_t)64 * 1024)  /* a pair's channel: one message chunk */
#define SIM_NAME_MAX 64

enum { RANK_ABSENT = 0, RANK_ATTACHED = 1, RANK_LEFT = 2, RANK_ABORTED = 3, RANK_DEAD = 4 };

typedef struct sim_rank {
    _Atomic uint64_t seq; /* the last collective round this rank posted to its slot */
    _Atomic uint64_t ack; /* the last round this rank finished reading every slot of */
    _Atomic int32_t pid;
    _Atomic int32_t state;
    char pad[40];
} sim_rank;

typedef struct sim_chan {
    _Atomic uint64_t sent;  /* chunks posted by the sender */
    _Atomic uint64_t taken; /* chunks consumed by the receiver */
    uint64_t total;         /* bytes of the message the posted chunk belongs to */
    uint64_t len;           /* bytes in the posted chunk */
    char pad[32];
} sim_chan;

typedef struct sim_seg {
    _Atomic uint32_t futex;    /* bumped on every change */
    _Atomic int32_t nranks;    /* set by the first rank to attach */
    _Atomic int32_t attached;  /* ranks attached so far */
    _Atomic int32_t failed_by; /* 0, or 1 + the first rank that aborted or was found dead */
    char pad[48];
} sim_seg;

typedef struct sim_comm {
    char name[SIM_NAME_MAX]; /* shm_open name */
    int nranks, rank;
    bool blocking;
    void *map;
    size_t map_size;
    sim_seg *seg;
    sim_rank *ranks;
    sim_chan *chans;
    char *slots, *bufs;
    atomic_int mapped;       /* seg and the pointers below it are set (an init thread sets them) */
    atomic_int refs;         /* the user's handle, queued tasks, a background init thread */
    atomic_int aborted;      /* ncclCommAbort or ncclCommDestroy was called */
    atomic_int async_err;    /* the first error of an operation (sticky) */
    atomic_int init_state;   /* ncclInProgress while a non-blocking init or split runs, else its result */
    atomic_int busy;         /* a non-blocking split of this (parent) communicator is running */
    atomic_int finalizing;   /* ncclCommFinalize was called on a non-blocking communicator */
    atomic_int pending;      /* tasks queued or running */
    atomic_int running;      /* tasks running now */
    pthread_mutex_t exec_lk; /* one collective at a time on this communicator */
    uint64_t round;          /* collective rounds done (the same on every rank) */
    uint64_t splits;         /* ncclCommSplit calls so far (names the children) */
    int64_t last_peer_check_ms;
} sim_comm;

struct ncclComm {
    sim_comm c;
};

/* sim_comm.c */
int64_t sim_now_ms(void);
ncclResult_t sim_error(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *sim_last_error(void);
int sim_timeout_ms(void);
sim_comm *sim_comm_alloc(const char *name, int nranks, int rank, bool blocking);
void sim_comm_ref(sim_comm *c);
void sim_comm_unref(sim_comm *c);
/* for tests: communicators of this process not yet freed (a leaked ncclComm_t stays counted) */
int sim_nccl_live_comms(void);
ncclResult_t sim_comm_attach(sim_comm *c);
ncclResult_t sim_comm_start(ncclComm_t *out, const char *name, int nranks, int rank, bool blocking);
ncclResult_t sim_fail(sim_comm *c, ncclResult_t r);
void sim_wake(sim_comm *c);
ncclResult_t sim_wait(sim_comm *c, uint32_t seen, int64_t deadline, const char *what, int peer);
void sim_unlink(sim_comm *c);

/* sim_coll.c: one collective round, the split's exchange */
ncclResult_t sim_round(sim_comm *c, const void *mine, size_t bytes, void (*use)(sim_comm *, void *), void *arg);

/* sim_reduce.c */
size_t sim_type_size(ncclDataType_t t);
/* dst[i] = dst[i] op src[i] (op avg: sum); sim_finish_avg divides by n */
void sim_reduce(void *dst, const void *src, size_t count, ncclDataType_t t, ncclRedOp_t op);
void sim_finish_avg(void *dst, size_t count, ncclDataType_t t, int n);

#endif
