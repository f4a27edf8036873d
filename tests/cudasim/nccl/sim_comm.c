/* sim_comm.c - the NCCL stand-in's communicators: unique ids that name a shared-memory
 * segment, attaching to it (blocking, or on a thread for a non-blocking config), the bounded
 * waits every operation uses, and the ends of a communicator (finalize, destroy, abort).
 *
 * Segment lifetime: the rank whose attach completes the world unlinks the name (every rank
 * has it open by then), and every rank unlinks it again (ENOENT ignored) when its
 * communicator is aborted, destroyed or fails to attach, so a world that never completes
 * leaves nothing in /dev/shm once its ranks give up. Only a world whose every rank is killed
 * before the last one attached leaves its segment behind. */
#include "tests/cudasim/nccl/sim_nccl.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ID_MAGIC "cohort-sim-nccl"

static pthread_mutex_t err_lk = PTHREAD_MUTEX_INITIALIZER;
static char err_msg[512];

int64_t sim_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

ncclResult_t sim_error(ncclResult_t r, const char *fmt, ...) {
    char buf[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&err_lk);
    memcpy(err_msg, buf, sizeof buf);
    pthread_mutex_unlock(&err_lk);
    co_log(CO_LOG_DEBUG, "sim nccl: %s", buf);
    return r;
}

const char *sim_last_error(void) {
    static _Thread_local char copy[sizeof err_msg];
    pthread_mutex_lock(&err_lk);
    memcpy(copy, err_msg, sizeof copy);
    pthread_mutex_unlock(&err_lk);
    return copy;
}

/* The bound on any single wait (COHORT_SIM_NCCL_TIMEOUT_MS, default 120 s): a stand-in
 * operation never hangs, where real NCCL would. */
int sim_timeout_ms(void) {
    const char *s = getenv("COHORT_SIM_NCCL_TIMEOUT_MS");
    long v = s && *s ? strtol(s, NULL, 10) : 0;
    return v > 0 && v < INT_MAX ? (int)v : 120000;
}

static size_t seg_size(int n) {
    return sizeof(sim_seg) + (size_t)n * sizeof(sim_rank) + (size_t)n * n * sizeof(sim_chan) +
           (size_t)n * SIM_SLOT_BYTES + (size_t)n * n * SIM_CHAN_BYTES;
}

static atomic_int live_comms; /* communicators allocated and not yet freed (sim_nccl_live_comms) */

int sim_nccl_live_comms(void) { return atomic_load(&live_comms); }

sim_comm *sim_comm_alloc(const char *name, int nranks, int rank, bool blocking) {
    struct ncclComm *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    atomic_fetch_add(&live_comms, 1);
    sim_comm *c = &h->c;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->nranks = nranks;
    c->rank = rank;
    c->blocking = blocking;
    atomic_init(&c->refs, 1);
    atomic_init(&c->init_state, ncclInProgress);
    pthread_mutex_init(&c->exec_lk, NULL);
    return c;
}

void sim_comm_ref(sim_comm *c) { atomic_fetch_add(&c->refs, 1); }

void sim_comm_unref(sim_comm *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->map) munmap(c->map, c->map_size);
    pthread_mutex_destroy(&c->exec_lk);
    free((struct ncclComm *)c);
    atomic_fetch_sub(&live_comms, 1);
}

void sim_unlink(sim_comm *c) {
    if (shm_unlink(c->name) != 0 && errno != ENOENT)
        co_log(CO_LOG_WARN, "sim nccl: cannot remove shared memory %s: %s", c->name, strerror(errno));
}

void sim_wake(sim_comm *c) {
    atomic_fetch_add(&c->seg->futex, 1);
    syscall(SYS_futex, (uint32_t *)&c->seg->futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Records the communicator's first error (sticky) and tells the peers when it is this
 * rank's own fault (so their waits end too). */
ncclResult_t sim_fail(sim_comm *c, ncclResult_t r) {
    int zero = ncclSuccess;
    atomic_compare_exchange_strong(&c->async_err, &zero, (int)r);
    return (ncclResult_t)atomic_load(&c->async_err);
}

/* whether process pid is gone (or a zombie nobody reaped yet) */
static bool pid_dead(int pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* The peers' states: ncclRemoteError once one aborted or died, or once the rank waited on
 * (peer; -1: every rank) left. */
static ncclResult_t check_peers(sim_comm *c, int peer) {
    int by = atomic_load(&c->seg->failed_by);
    if (by) return sim_error(ncclRemoteError, "%s: rank %d aborted or died", c->name, by - 1);
    int64_t now = sim_now_ms();
    bool look = now - c->last_peer_check_ms >= 20;
    if (look) c->last_peer_check_ms = now;
    for (int j = 0; j < c->nranks; j++) {
        if (j == c->rank) continue;
        int st = atomic_load(&c->ranks[j].state);
        if (st == RANK_ATTACHED && look && pid_dead(atomic_load(&c->ranks[j].pid))) {
            int exp = RANK_ATTACHED;
            if (atomic_compare_exchange_strong(&c->ranks[j].state, &exp, RANK_DEAD)) {
                int zero = 0;
                atomic_compare_exchange_strong(&c->seg->failed_by, &zero, j + 1);
                co_log(CO_LOG_WARN, "sim nccl: %s: rank %d (pid %d) died", c->name, j,
                       (int)atomic_load(&c->ranks[j].pid));
                sim_wake(c);
                st = RANK_DEAD;
            } else {
                st = exp; /* it left (or aborted) and exited meanwhile */
            }
        }
        if (st == RANK_ABORTED || st == RANK_DEAD)
            return sim_error(ncclRemoteError, "%s: rank %d %s", c->name, j, st == RANK_DEAD ? "died" : "aborted");
        if (st == RANK_LEFT && (peer < 0 || peer == j))
            return sim_error(ncclRemoteError, "%s: rank %d destroyed its communicator", c->name, j);
    }
    return ncclSuccess;
}

/* One step of a wait on peer (-1: every rank), whose condition the caller found unmet with
 * the futex word at `seen`: fails on a local abort, the deadline, or (the word unmoved) a
 * failed peer; else sleeps until the word moves from `seen` (at most 5 ms). */
ncclResult_t sim_wait(sim_comm *c, uint32_t seen, int64_t deadline, const char *what, int peer) {
    if (atomic_load(&c->aborted)) return sim_error(ncclSystemError, "%s: %s: the communicator was aborted", c->name, what);
    if (sim_now_ms() >= deadline)
        return sim_error(ncclSystemError, "%s: %s: no progress in %d ms (COHORT_SIM_NCCL_TIMEOUT_MS)", c->name, what,
                         sim_timeout_ms());
    /* a peer that posted its part and then left (or exited) is no failure: every post bumps
     * the word before the peer can leave, so a word still at `seen` after the peers were
     * read means the caller's condition saw everything they posted */
    if (atomic_load(&c->seg->futex) != seen) return ncclSuccess;
    ncclResult_t r = check_peers(c, peer);
    if (r != ncclSuccess) return atomic_load(&c->seg->futex) != seen ? ncclSuccess : r;
    struct timespec ts = {0, 5 * 1000 * 1000};
    syscall(SYS_futex, (uint32_t *)&c->seg->futex, FUTEX_WAIT, seen, &ts, NULL, 0);
    return ncclSuccess;
}

static ncclResult_t map_segment(sim_comm *c) {
    size_t size = seg_size(c->nranks);
    int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return sim_error(ncclSystemError, "shm_open %s: %s", c->name, strerror(errno));
    off_t cur = lseek(fd, 0, SEEK_END);
    if (cur < (off_t)size && ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return sim_error(ncclSystemError, "ftruncate %s to %zu bytes: %s", c->name, size, strerror(e));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return sim_error(ncclSystemError, "mmap %s: %s", c->name, strerror(errno));
    c->map = p;
    c->map_size = size;
    int n = c->nranks;
    c->seg = p;
    c->ranks = (sim_rank *)((char *)p + sizeof(sim_seg));
    c->chans = (sim_chan *)(c->ranks + n);
    c->slots = (char *)(c->chans + (size_t)n * n);
    c->bufs = c->slots + (size_t)n * SIM_SLOT_BYTES;
    atomic_store(&c->mapped, 1);
    return ncclSuccess;
}

/* Marks this rank gone from the segment (left or aborted; an abort fails the peers too,
 * unless COHORT_SIM_NCCL_ABORT_SILENT=1: then, as with real NCCL, whose abort need not reach
 * the peers, they wait on until their own abort, their deadline or this process's exit). */
static void mark_gone(sim_comm *c, int state) {
    if (!atomic_load(&c->mapped)) return;
    const char *silent = getenv("COHORT_SIM_NCCL_ABORT_SILENT");
    if (state == RANK_ABORTED && silent && silent[0] == '1') return;
    int st = RANK_ATTACHED;
    atomic_compare_exchange_strong(&c->ranks[c->rank].state, &st, state);
    if (state == RANK_ABORTED) {
        int zero = 0;
        atomic_compare_exchange_strong(&c->seg->failed_by, &zero, c->rank + 1);
    }
    sim_wake(c);
}

/* Joins the segment as c->rank and waits (bounded, abortable) for every rank. */
ncclResult_t sim_comm_attach(sim_comm *c) {
    ncclResult_t r = map_segment(c);
    if (r != ncclSuccess) return r;
    int zero = 0;
    if (!atomic_compare_exchange_strong(&c->seg->nranks, &zero, c->nranks) && zero != c->nranks) {
        sim_unlink(c);
        return sim_error(ncclInvalidUsage, "%s: rank %d says %d ranks, another rank said %d", c->name, c->rank,
                         c->nranks, zero);
    }
    sim_rank *me = &c->ranks[c->rank];
    int absent = RANK_ABSENT;
    atomic_store(&me->pid, (int32_t)getpid());
    if (!atomic_compare_exchange_strong(&me->state, &absent, RANK_ATTACHED)) {
        sim_unlink(c);
        return sim_error(ncclInvalidUsage, "%s: rank %d joined twice", c->name, c->rank);
    }
    if (atomic_fetch_add(&c->seg->attached, 1) + 1 == c->nranks) sim_unlink(c); /* all have it open */
    sim_wake(c);
    int64_t deadline = sim_now_ms() + sim_timeout_ms();
    for (;;) {
        uint32_t f = atomic_load(&c->seg->futex);
        if (atomic_load(&c->seg->attached) >= c->nranks) break;
        if ((r = sim_wait(c, f, deadline, "init", -1)) != ncclSuccess) {
            if (atomic_load(&c->aborted)) mark_gone(c, RANK_ABORTED); /* aborted while it attached */
            sim_unlink(c);
            return r;
        }
    }
    /* a peer may have failed after attaching; the first operation finds out */
    return ncclSuccess;
}

/* ---- the API ---- */

static ncclResult_t init_done(sim_comm *c, ncclResult_t r) {
    atomic_store(&c->init_state, (int)r);
    if (r != ncclSuccess) sim_fail(c, r);
    return r;
}

static void *init_thread(void *arg) {
    sim_comm *c = arg;
    init_done(c, sim_comm_attach(c));
    sim_comm_unref(c);
    return NULL;
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return sim_error(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return sim_error(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    uint8_t rnd[8];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, rnd, sizeof rnd) : -1;
    if (fd >= 0) close(fd);
    if (n != (ssize_t)sizeof rnd) return sim_error(ncclSystemError, "ncclGetUniqueId: cannot read /dev/urandom");
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    char *name = id->internal + sizeof ID_MAGIC;
    int k = snprintf(name, SIM_NAME_MAX, "/cohort-nccl-%d-", (int)getpid());
    for (int i = 0; i < 8; i++) k += snprintf(name + k, (size_t)(SIM_NAME_MAX - k), "%02x", rnd[i]);
    return ncclSuccess;
}

/* the segment name an id carries, or NULL for an id this stand-in did not make */
static const char *id_name(const ncclUniqueId *id) {
    if (memcmp(id->internal, ID_MAGIC, sizeof ID_MAGIC) != 0) return NULL;
    const char *name = id->internal + sizeof ID_MAGIC;
    return name[0] == '/' && memchr(name, 0, SIM_NAME_MAX) ? name : NULL;
}

/* A communicator on segment `name`: attached at once (blocking) or on a thread. */
ncclResult_t sim_comm_start(ncclComm_t *out, const char *name, int nranks, int rank, bool blocking) {
    sim_comm *c = sim_comm_alloc(name, nranks, rank, blocking);
    if (!c) return sim_error(ncclSystemError, "out of memory");
    if (blocking) {
        ncclResult_t r = init_done(c, sim_comm_attach(c));
        if (r != ncclSuccess) {
            sim_comm_unref(c);
            return r;
        }
        *out = (ncclComm_t)c;
        return ncclSuccess;
    }
    pthread_t th;
    sim_comm_ref(c); /* the thread's */
    if (pthread_create(&th, NULL, init_thread, c) != 0) {
        sim_comm_unref(c);
        sim_comm_unref(c);
        return sim_error(ncclSystemError, "cannot start the init thread");
    }
    pthread_detach(th);
    *out = (ncclComm_t)c;
    return ncclInProgress;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config) {
    if (!comm) return sim_error(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > SIM_MAX_RANKS || rank < 0 || rank >= nranks)
        return sim_error(ncclInvalidArgument, "rank %d of %d: not a valid place (at most %d ranks)", rank, nranks,
                         SIM_MAX_RANKS);
    const char *name = id_name(&commId);
    if (!name) return sim_error(ncclInvalidArgument, "the unique id was not made by this NCCL stand-in");
    bool blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    return sim_comm_start(comm, name, nranks, rank, blocking);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError) return sim_error(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    sim_comm *c = &comm->c;
    int e = atomic_load(&c->async_err);
    if (e != ncclSuccess) *asyncError = (ncclResult_t)e;
    else if (atomic_load(&c->init_state) == ncclInProgress || atomic_load(&c->busy)) *asyncError = ncclInProgress;
    else if (atomic_load(&c->finalizing) && atomic_load(&c->pending) > 0) *asyncError = ncclInProgress;
    else *asyncError = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return sim_error(ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = comm->c.nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return sim_error(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = comm->c.rank;
    return ncclSuccess;
}

/* Marks this rank gone (state) and drops the user's reference; queued tasks keep the
 * mapping until they ran (they fail at once). */
static void comm_end(sim_comm *c, int state) {
    atomic_store(&c->aborted, 1);
    mark_gone(c, state); /* or the init thread does, once it sees the abort */
    sim_unlink(c);
    /* a running task stops at its next check (a few ms): wait for it, as ncclCommAbort
     * waits for its kernels, so the caller may free the buffers afterwards */
    int64_t deadline = sim_now_ms() + 2000;
    while (atomic_load(&c->running) > 0 && sim_now_ms() < deadline) usleep(200);
    sim_comm_unref(c);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    co_log(CO_LOG_DEBUG, "sim nccl: %s: rank %d aborts", comm->c.name, comm->c.rank);
    comm_end(&comm->c, RANK_ABORTED);
    return ncclSuccess;
}

/* Waits (bounded) for the queued operations; a non-blocking communicator reports the wait
 * through ncclCommGetAsyncError instead. */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return sim_error(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    sim_comm *c = &comm->c;
    if (!c->blocking) {
        atomic_store(&c->finalizing, 1);
        return atomic_load(&c->pending) > 0 ? ncclInProgress : ncclSuccess;
    }
    int64_t deadline = sim_now_ms() + sim_timeout_ms();
    while (atomic_load(&c->pending) > 0) {
        if (sim_now_ms() >= deadline) return sim_error(ncclSystemError, "%s: finalize: operations still queued", c->name);
        usleep(200);
    }
    return (ncclResult_t)atomic_load(&c->async_err);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    sim_comm *c = &comm->c;
    bool failed = atomic_load(&c->async_err) != ncclSuccess;
    comm_end(c, failed ? RANK_ABORTED : RANK_LEFT);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return sim_last_error();
}
