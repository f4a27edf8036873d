/* nccl_comm.c - the collective interface over NCCL: non-blocking communicators polled
 * against a deadline and an abort flag (see nccl_comm.h). */
#include "comm/nccl_comm.h"

#include "common/error.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* meson.build builds this file only with NCCL >= 2.18 (ncclCommSplit; non-blocking
 * communicators, ncclCommFinalize and ncclConfig_t since 2.14) and CUDA 12 or 13: every
 * CUDA call here has the same signature in both. */
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "comm/nccl_comm.c needs NCCL 2.18 or newer"
#endif
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is not 128 bytes");

typedef struct nccl_impl {
    ncclComm_t comm;   /* NULL once aborted or destroyed */
    cudaStream_t stream;
    int device;
    atomic_int aborted;
    int failed;        /* sticky: the first error; every later call returns it */
    pthread_mutex_t lk; /* serialises NCCL calls with ncclCommAbort from another thread */
    cm_nccl_options opt;
    /* staging for host buffers */
    void *dstage, *hstage;
    size_t stage_size;
    int32_t *done;     /* device word for barrier */
} nccl_impl;

static const cm_ops nccl_ops;

void cm_nccl_options_default(cm_nccl_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->init_timeout_ms = 60000;
    opt->cancel = NULL;
    opt->poll_us = 50;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int map_nccl(ncclResult_t r) {
    switch (r) {
    case ncclRemoteError:
    case ncclSystemError: return CO_EREMOTE; /* a peer or the network failed */
    case ncclInvalidArgument:
    case ncclInvalidUsage: return CO_EINVAL;
    default: return CO_EINTERNAL;
    }
}

/* with x->lk held: aborts the NCCL communicator once */
static void abort_locked(nccl_impl *x) {
    if (!x->comm) return;
    cudaSetDevice(x->device);
    ncclCommAbort(x->comm);
    x->comm = NULL;
}

/* records the first failure, aborts the communicator, returns the sticky code */
static int fail(nccl_impl *x, int code, const char *fmt_op, const char *why) {
    pthread_mutex_lock(&x->lk);
    abort_locked(x);
    pthread_mutex_unlock(&x->lk);
    if (!x->failed) x->failed = code;
    co_err_set(code, "nccl: %s: %s", fmt_op, why);
    return code;
}

static int fail_nccl(nccl_impl *x, ncclResult_t r, const char *op) {
    const char *last = ncclGetLastError(NULL); /* its argument is unused; x->comm may be going away */
    char why[512];
    snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    return fail(x, map_nccl(r), op, why);
}

static int fail_cuda(nccl_impl *x, cudaError_t e, const char *op) {
    (void)cudaGetLastError();
    return fail(x, e == cudaErrorMemoryAllocation ? CO_ENOMEM : CO_EINTERNAL, op, cudaGetErrorString(e));
}

/* Entry of every call: the sticky error or CO_EABORTED, else 0 with the device set. */
static int enter(nccl_impl *x, const char *op) {
    if (atomic_load(&x->aborted)) {
        if (!x->failed) x->failed = CO_EABORTED;
        co_err_set(x->failed, "nccl: %s: the communicator was aborted", op);
        return x->failed;
    }
    if (x->failed) return co_err_set(x->failed, "nccl: %s: the communicator failed earlier", op);
    cudaError_t e = cudaSetDevice(x->device);
    return e == cudaSuccess ? 0 : fail_cuda(x, e, op);
}

/* Waits for the pending NCCL call to be enqueued and, if stream, for the stream to drain. */
static int wait_done(nccl_impl *x, const char *op, int timeout_ms, bool stream) {
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
    for (;;) {
        if (atomic_load(&x->aborted)) {
            if (!x->failed) x->failed = CO_EABORTED;
            return co_err_set(CO_EABORTED, "nccl: %s: aborted", op);
        }
        pthread_mutex_lock(&x->lk);
        if (!x->comm) {
            pthread_mutex_unlock(&x->lk);
            if (!x->failed) x->failed = CO_EABORTED;
            return co_err_set(CO_EABORTED, "nccl: %s: aborted", op);
        }
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(x->comm, &st);
        cudaError_t ce = cudaSuccess;
        bool done = false;
        if (r == ncclSuccess && st == ncclSuccess) {
            done = true;
            if (stream) {
                ce = cudaStreamQuery(x->stream);
                if (ce == cudaErrorNotReady) {
                    done = false;
                    ce = cudaSuccess;
                } else if (ce == cudaSuccess) {
                    /* an error the operation met while the stream drained, after the read
                     * above, is only visible now */
                    r = ncclCommGetAsyncError(x->comm, &st);
                    done = r == ncclSuccess && st == ncclSuccess;
                }
            }
        }
        pthread_mutex_unlock(&x->lk);
        if (r != ncclSuccess) return fail_nccl(x, r, op);
        if (st != ncclSuccess && st != ncclInProgress) return fail_nccl(x, st, op);
        if (ce != cudaSuccess) return fail_cuda(x, ce, op);
        if (done) return 0;
        if (x->opt.cancel && atomic_load(x->opt.cancel)) {
            atomic_store(&x->aborted, 1);
            return fail(x, CO_EABORTED, op, "cancelled");
        }
        if (now_ms() >= deadline) return fail(x, CO_ETIMEOUT, op, "timed out waiting for the other ranks");
        usleep((useconds_t)(x->opt.poll_us > 0 ? x->opt.poll_us : 50));
    }
}

/* After an enqueue call: ncclSuccess and ncclInProgress both mean "queued". */
static int enqueued(nccl_impl *x, ncclResult_t r, const char *op, int timeout_ms) {
    if (r != ncclSuccess && r != ncclInProgress) return fail_nccl(x, r, op);
    return wait_done(x, op, timeout_ms, true);
}

static bool on_host(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

static int stage_reserve(nccl_impl *x, size_t bytes, const char *op) {
    if (bytes <= x->stage_size) return 0;
    size_t n = (bytes + 4095) & ~(size_t)4095;
    if (x->dstage) cudaFree(x->dstage);
    if (x->hstage) cudaFreeHost(x->hstage);
    x->dstage = x->hstage = NULL;
    x->stage_size = 0;
    cudaError_t e = cudaMalloc(&x->dstage, n);
    if (e == cudaSuccess) e = cudaMallocHost(&x->hstage, n);
    if (e != cudaSuccess) return fail_cuda(x, e, op);
    x->stage_size = n;
    return 0;
}

/* Copies host bytes into device staging at off (pinned bounce, stream-ordered). */
static int stage_in(nccl_impl *x, size_t off, const void *src, size_t bytes, const char *op) {
    memcpy((char *)x->hstage + off, src, bytes);
    cudaError_t e = cudaMemcpyAsync((char *)x->dstage + off, (char *)x->hstage + off, bytes, cudaMemcpyHostToDevice,
                                    x->stream);
    return e == cudaSuccess ? 0 : fail_cuda(x, e, op);
}

/* After the operation completed: device staging at off back to host. */
static int stage_out(nccl_impl *x, size_t off, void *dst, size_t bytes, const char *op) {
    cudaError_t e = cudaMemcpyAsync((char *)x->hstage + off, (char *)x->dstage + off, bytes, cudaMemcpyDeviceToHost,
                                    x->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(x->stream);
    if (e != cudaSuccess) return fail_cuda(x, e, op);
    memcpy(dst, (char *)x->hstage + off, bytes);
    return 0;
}

static size_t dt_size(cm_dtype dt) { return dt == CM_F32 ? 4 : 8; }
static ncclDataType_t dt_nccl(cm_dtype dt) {
    return dt == CM_F32 ? ncclFloat32 : dt == CM_F64 ? ncclFloat64 : ncclInt64;
}

static int nc_allreduce(cm_comm *c, void *buf, size_t count, cm_dtype dt, int timeout_ms) {
    nccl_impl *x = c->impl;
    int rc = enter(x, "all-reduce");
    if (rc || count == 0) return rc;
    if ((unsigned)dt > CM_I64) return co_err_set(CO_EINVAL, "nccl: all-reduce: unknown dtype %d", (int)dt);
    size_t bytes = count * dt_size(dt);
    bool host = on_host(buf);
    void *p = buf;
    if (host) {
        if ((rc = stage_reserve(x, bytes, "all-reduce")) || (rc = stage_in(x, 0, buf, bytes, "all-reduce"))) return rc;
        p = x->dstage;
    }
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = x->comm ? ncclAllReduce(p, p, count, dt_nccl(dt), ncclSum, x->comm, x->stream) : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    if ((rc = enqueued(x, r, "all-reduce", timeout_ms))) return rc;
    return host ? stage_out(x, 0, buf, bytes, "all-reduce") : 0;
}

static int nc_broadcast(cm_comm *c, void *buf, size_t bytes, int root, int timeout_ms) {
    nccl_impl *x = c->impl;
    int rc = enter(x, "broadcast");
    if (rc || bytes == 0) return rc;
    if (root < 0 || root >= c->size) return co_err_set(CO_EINVAL, "nccl: broadcast: root %d out of range", root);
    bool host = on_host(buf);
    void *p = buf;
    if (host) {
        if ((rc = stage_reserve(x, bytes, "broadcast"))) return rc;
        if (c->rank == root && (rc = stage_in(x, 0, buf, bytes, "broadcast"))) return rc;
        p = x->dstage;
    }
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = x->comm ? ncclBroadcast(p, p, bytes, ncclInt8, root, x->comm, x->stream) : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    if ((rc = enqueued(x, r, "broadcast", timeout_ms))) return rc;
    return host ? stage_out(x, 0, buf, bytes, "broadcast") : 0;
}

static int nc_allgather(cm_comm *c, const void *send, void *recv, size_t bytes, int timeout_ms) {
    nccl_impl *x = c->impl;
    int rc = enter(x, "all-gather");
    if (rc || bytes == 0) return rc;
    size_t total = bytes * (size_t)c->size;
    bool hs = on_host(send), hr = on_host(recv);
    const void *s = send;
    void *d = recv;
    if (hs || hr) {
        if ((rc = stage_reserve(x, total + bytes, "all-gather"))) return rc;
        if (hs) {
            if ((rc = stage_in(x, total, send, bytes, "all-gather"))) return rc;
            s = (char *)x->dstage + total;
        }
        if (hr) d = x->dstage;
    }
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = x->comm ? ncclAllGather(s, d, bytes, ncclInt8, x->comm, x->stream) : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    if ((rc = enqueued(x, r, "all-gather", timeout_ms))) return rc;
    return hr ? stage_out(x, 0, recv, total, "all-gather") : 0;
}

static int nc_reduce_scatter(cm_comm *c, const void *send, void *recv, size_t count, cm_dtype dt, int timeout_ms) {
    nccl_impl *x = c->impl;
    int rc = enter(x, "reduce-scatter");
    if (rc || count == 0) return rc;
    if ((unsigned)dt > CM_I64) return co_err_set(CO_EINVAL, "nccl: reduce-scatter: unknown dtype %d", (int)dt);
    size_t bytes = count * dt_size(dt), total = bytes * (size_t)c->size;
    bool hs = on_host(send), hr = on_host(recv);
    const void *s = send;
    void *d = recv;
    if (hs || hr) {
        if ((rc = stage_reserve(x, total + bytes, "reduce-scatter"))) return rc;
        if (hs) {
            if ((rc = stage_in(x, 0, send, total, "reduce-scatter"))) return rc;
            s = x->dstage;
        }
        if (hr) d = (char *)x->dstage + total;
    }
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = x->comm ? ncclReduceScatter(s, d, count, dt_nccl(dt), ncclSum, x->comm, x->stream) : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    if ((rc = enqueued(x, r, "reduce-scatter", timeout_ms))) return rc;
    return hr ? stage_out(x, total, recv, bytes, "reduce-scatter") : 0;
}

/* Before an all-to-all moves data, every rank learns every rank's size lists (one small
 * all-gather of send_bytes and recv_bytes), so that a block whose sizes disagree fails the
 * call on every rank, with the same verdict, instead of hanging in NCCL until the deadline
 * (NCCL cannot tell a short send from a slow one). Returns 0 when every pair agrees. */
static int a2a_check_sizes(cm_comm *c, const size_t *send_bytes, const size_t *recv_bytes, int timeout_ms) {
    nccl_impl *x = c->impl;
    int n = c->size;
    size_t row = 2 * (size_t)n; /* a rank's send_bytes[n], then its recv_bytes[n] */
    uint64_t *all = malloc((size_t)(n + 1) * row * sizeof *all);
    if (!all) return fail(x, CO_ENOMEM, "all-to-all", "out of memory for the size lists");
    uint64_t *mine = all + (size_t)n * row;
    for (int j = 0; j < n; j++) {
        mine[j] = send_bytes[j];
        mine[n + j] = recv_bytes[j];
    }
    int rc = nc_allgather(c, mine, all, row * sizeof *all, timeout_ms);
    for (int i = 0; i < n && !rc; i++)
        for (int j = 0; j < n && !rc; j++) {
            uint64_t sent = all[(size_t)i * row + j], got = all[(size_t)j * row + n + i];
            if (sent == got) continue;
            char why[200];
            snprintf(why, sizeof why, "rank %d sends %llu bytes to rank %d, which receives %llu from it", i,
                     (unsigned long long)sent, j, (unsigned long long)got);
            /* sticky, but no abort: a peer may still be reading the all-gather's last bytes;
             * every rank reaches the same verdict, and destroy aborts */
            if (!x->failed) x->failed = CO_EPROTOCOL;
            rc = co_err_set(CO_EPROTOCOL, "nccl: all-to-all: %s", why);
        }
    free(all);
    return rc;
}

/* All-to-all with uneven blocks: the sizes checked on every rank (a2a_check_sizes), then
 * one send and one receive per peer inside an NCCL group (NCCL has no alltoallv of its
 * own); the own block is a device (or staged) copy. */
static int nc_alltoallv(cm_comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                        int timeout_ms) {
    nccl_impl *x = c->impl;
    int rc = enter(x, "all-to-all");
    if (rc) return rc;
    int n = c->size, me = c->rank;
    if (!send_bytes || !recv_bytes) return co_err_set(CO_EINVAL, "nccl: all-to-all: null size list");
    size_t stot = 0, rtot = 0;
    for (int j = 0; j < n; j++) {
        stot += send_bytes[j];
        rtot += recv_bytes[j];
    }
    if (send_bytes[me] != recv_bytes[me])
        return co_err_set(CO_EINVAL, "nccl: all-to-all: rank %d sends itself %zu bytes but expects %zu", me,
                          send_bytes[me], recv_bytes[me]);
    int64_t t0 = now_ms();
    if (n > 1 && (rc = a2a_check_sizes(c, send_bytes, recv_bytes, timeout_ms))) return rc;
    if (timeout_ms >= 0) { /* the data phase gets what the size check left of the deadline */
        int64_t left = timeout_ms - (now_ms() - t0);
        timeout_ms = left > 0 ? (int)left : 0;
    }
    if (stot + rtot == 0) return 0;
    bool hs = stot && on_host(send), hr = rtot && on_host(recv);
    const char *s = send;
    char *d = recv;
    if (hs || hr) {
        if ((rc = stage_reserve(x, stot + rtot, "all-to-all"))) return rc;
        if (hs) {
            if ((rc = stage_in(x, 0, send, stot, "all-to-all"))) return rc;
            s = x->dstage;
        }
        if (hr) d = (char *)x->dstage + stot;
    }
    size_t so = 0, ro = 0, own_s = 0, own_r = 0;
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = ncclSuccess;
    if (x->comm) {
        r = ncclGroupStart();
        for (int j = 0; j < n && r == ncclSuccess; j++) {
            if (j == me) {
                own_s = so;
                own_r = ro;
            } else {
                if (send_bytes[j]) r = ncclSend(s + so, send_bytes[j], ncclInt8, j, x->comm, x->stream);
                if (r == ncclSuccess && recv_bytes[j])
                    r = ncclRecv(d + ro, recv_bytes[j], ncclInt8, j, x->comm, x->stream);
            }
            so += send_bytes[j];
            ro += recv_bytes[j];
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
    }
    pthread_mutex_unlock(&x->lk);
    if (send_bytes[me]) {
        cudaError_t e = cudaMemcpyAsync(d + own_r, s + own_s, send_bytes[me], cudaMemcpyDeviceToDevice, x->stream);
        if (e != cudaSuccess) return fail_cuda(x, e, "all-to-all");
    }
    if ((rc = enqueued(x, r, "all-to-all", timeout_ms))) return rc;
    return hr ? stage_out(x, stot, recv, rtot, "all-to-all") : 0;
}

static int nc_barrier(cm_comm *c, int timeout_ms) {
    nccl_impl *x = c->impl;
    int rc = enter(x, "barrier");
    if (rc) return rc;
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = x->comm ? ncclAllReduce(x->done, x->done, 1, ncclInt32, ncclSum, x->comm, x->stream) : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    return enqueued(x, r, "barrier", timeout_ms);
}

static int nc_p2p(cm_comm *c, void *buf, size_t bytes, int peer, int timeout_ms, bool send) {
    nccl_impl *x = c->impl;
    const char *op = send ? "send" : "recv";
    int rc = enter(x, op);
    if (rc || bytes == 0) return rc;
    if (peer < 0 || peer >= c->size) return co_err_set(CO_EINVAL, "nccl: %s: peer %d out of range", op, peer);
    bool host = on_host(buf);
    void *p = buf;
    if (host) {
        if ((rc = stage_reserve(x, bytes, op))) return rc;
        if (send && (rc = stage_in(x, 0, buf, bytes, op))) return rc;
        p = x->dstage;
    }
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = ncclSuccess;
    if (x->comm)
        r = send ? ncclSend(p, bytes, ncclInt8, peer, x->comm, x->stream)
                 : ncclRecv(p, bytes, ncclInt8, peer, x->comm, x->stream);
    pthread_mutex_unlock(&x->lk);
    if ((rc = enqueued(x, r, op, timeout_ms))) return rc;
    return host && !send ? stage_out(x, 0, buf, bytes, op) : 0;
}

static int nc_send(cm_comm *c, const void *buf, size_t bytes, int peer, int timeout_ms) {
    return nc_p2p(c, (void *)buf, bytes, peer, timeout_ms, true);
}
static int nc_recv(cm_comm *c, void *buf, size_t bytes, int peer, int timeout_ms) {
    return nc_p2p(c, buf, bytes, peer, timeout_ms, false);
}

/* ---- stream-ordered operations (comm.h): queued on the caller's stream, no wait ---- */

static int gone(nccl_impl *x, const char *op) {
    if (!x->failed) x->failed = CO_EABORTED;
    return co_err_set(x->failed, "nccl: %s: the communicator was aborted", op);
}

/* Entry of a queued call: as enter, and no host buffer (staging it would wait for the
 * device, which these calls exist not to do). */
static int enter_q(nccl_impl *x, const char *op, const void *a, const void *b) {
    int rc = enter(x, op);
    if (rc) return rc;
    if ((a && on_host(a)) || (b && on_host(b)))
        return co_err_set(CO_EINVAL, "nccl: stream-ordered %s of a host buffer: it takes device or managed memory", op);
    return 0;
}

/* After the enqueue call of a queued operation: a non-blocking communicator may still be
 * enqueuing (ncclInProgress); that is waited for, not the stream. */
static int queued(nccl_impl *x, ncclResult_t r, const char *op) {
    if (r != ncclSuccess && r != ncclInProgress) return fail_nccl(x, r, op);
    return r == ncclInProgress ? wait_done(x, op, x->opt.init_timeout_ms, false) : 0;
}

static int nc_allreduce_q(cm_comm *c, void *buf, size_t count, cm_dtype dt, void *stream) {
    nccl_impl *x = c->impl;
    if (count == 0) return enter(x, "all-reduce");
    if ((unsigned)dt > CM_I64) return co_err_set(CO_EINVAL, "nccl: all-reduce: unknown dtype %d", (int)dt);
    int rc = enter_q(x, "all-reduce", buf, NULL);
    if (rc) return rc;
    pthread_mutex_lock(&x->lk);
    bool live = x->comm != NULL;
    ncclResult_t r = live ? ncclAllReduce(buf, buf, count, dt_nccl(dt), ncclSum, x->comm, (cudaStream_t)stream)
                          : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    return live ? queued(x, r, "all-reduce") : gone(x, "all-reduce");
}

static int nc_allgather_q(cm_comm *c, const void *send, void *recv, size_t bytes, void *stream) {
    nccl_impl *x = c->impl;
    if (bytes == 0) return enter(x, "all-gather");
    int rc = enter_q(x, "all-gather", send, recv);
    if (rc) return rc;
    pthread_mutex_lock(&x->lk);
    bool live = x->comm != NULL;
    ncclResult_t r = live ? ncclAllGather(send, recv, bytes, ncclInt8, x->comm, (cudaStream_t)stream) : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    return live ? queued(x, r, "all-gather") : gone(x, "all-gather");
}

static int nc_reduce_scatter_q(cm_comm *c, const void *send, void *recv, size_t count, cm_dtype dt, void *stream) {
    nccl_impl *x = c->impl;
    if (count == 0) return enter(x, "reduce-scatter");
    if ((unsigned)dt > CM_I64) return co_err_set(CO_EINVAL, "nccl: reduce-scatter: unknown dtype %d", (int)dt);
    int rc = enter_q(x, "reduce-scatter", send, recv);
    if (rc) return rc;
    pthread_mutex_lock(&x->lk);
    bool live = x->comm != NULL;
    ncclResult_t r = live ? ncclReduceScatter(send, recv, count, dt_nccl(dt), ncclSum, x->comm, (cudaStream_t)stream)
                          : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    return live ? queued(x, r, "reduce-scatter") : gone(x, "reduce-scatter");
}

#define P2P_Q_MAX_COMMS 8

/* The distinct communicators of a batch into xs (at most P2P_Q_MAX_COMMS), every entry
 * checked; their count, or a negative code. */
static int p2p_q_comms(const cm_p2p *ops, int n, nccl_impl **xs) {
    int nx = 0;
    for (int i = 0; i < n; i++) {
        const cm_p2p *o = &ops[i];
        const char *op = o->send ? "send" : "recv";
        if (!o->c || o->c->ops != &nccl_ops)
            return co_err_set(CO_EINVAL, "nccl: a batch of sends and receives: entry %d is not an NCCL communicator's", i);
        nccl_impl *x = o->c->impl;
        int rc = enter_q(x, op, o->bytes ? o->buf : NULL, NULL);
        if (rc) return rc;
        if (o->peer < 0 || o->peer >= o->c->size || o->peer == o->c->rank)
            return co_err_set(CO_EINVAL, "nccl: %s: peer %d of rank %d out of range (%d ranks)", op, o->peer, o->c->rank,
                              o->c->size);
        int j = 0;
        while (j < nx && xs[j] != x) j++;
        if (j < nx) continue;
        if (nx == P2P_Q_MAX_COMMS)
            return co_err_set(CO_EINVAL, "nccl: a batch of sends and receives over more than %d communicators",
                              P2P_Q_MAX_COMMS);
        xs[nx++] = x;
    }
    return nx;
}

static int nc_p2p_q(const cm_p2p *ops, int n, void *stream) {
    nccl_impl *xs[P2P_Q_MAX_COMMS];
    int nx = n > 0 ? p2p_q_comms(ops, n, xs) : 0;
    if (nx <= 0) return nx;
    /* every communicator of the group locked against an abort while it is posted (an abort
     * takes one lock at a time, so the order does not matter) */
    for (int j = 0; j < nx; j++) pthread_mutex_lock(&xs[j]->lk);
    int dead = -1;
    for (int j = 0; j < nx && dead < 0; j++)
        if (!xs[j]->comm) dead = j;
    ncclResult_t r = ncclSuccess;
    if (dead < 0) {
        r = ncclGroupStart();
        for (int i = 0; i < n && r == ncclSuccess; i++) {
            const cm_p2p *o = &ops[i];
            nccl_impl *x = o->c->impl;
            if (!o->bytes) continue;
            r = o->send ? ncclSend(o->buf, o->bytes, ncclInt8, o->peer, x->comm, (cudaStream_t)stream)
                        : ncclRecv(o->buf, o->bytes, ncclInt8, o->peer, x->comm, (cudaStream_t)stream);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
    }
    for (int j = nx - 1; j >= 0; j--) pthread_mutex_unlock(&xs[j]->lk);
    if (dead >= 0) return gone(xs[dead], "send/recv");
    int rc = 0;
    for (int j = 0; j < nx; j++) {
        int e = queued(xs[j], r, "send/recv");
        if (!rc) rc = e;
    }
    return rc;
}

static int nc_queued_error(cm_comm *c) {
    nccl_impl *x = c->impl;
    const char *op = "a stream-ordered operation";
    if (atomic_load(&x->aborted)) return gone(x, op);
    if (x->failed) return co_err_set(x->failed, "nccl: %s: the communicator failed earlier", op);
    pthread_mutex_lock(&x->lk);
    bool live = x->comm != NULL;
    ncclResult_t st = ncclSuccess, r = live ? ncclCommGetAsyncError(x->comm, &st) : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    if (!live) return gone(x, op);
    if (r != ncclSuccess) return fail_nccl(x, r, op);
    if (st != ncclSuccess && st != ncclInProgress) return fail_nccl(x, st, op);
    return 0;
}

/* comm.h's split: only the listed ranks call it. ranks[0] makes a fresh unique id and sends
 * it to the others over this communicator; then they build a new communicator from it. */
static int nc_split(cm_comm *c, const int *ranks, int n, cm_comm **out) {
    nccl_impl *x = c->impl;
    *out = NULL;
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->size) return co_err_set(CO_EINVAL, "nccl: split: rank %d out of range", ranks[i]);
        if (ranks[i] == c->rank) me = i;
    }
    if (me < 0) return co_err_set(CO_EINVAL, "nccl: split: rank %d is not in the list", c->rank);
    uint8_t id[128];
    int rc = 0;
    if (me == 0) {
        if ((rc = cm_nccl_get_unique_id(id))) return rc;
        for (int i = 1; i < n && !rc; i++) rc = nc_send(c, id, sizeof id, ranks[i], x->opt.init_timeout_ms);
    } else {
        rc = nc_recv(c, id, sizeof id, ranks[0], x->opt.init_timeout_ms);
    }
    if (rc) return rc;
    return cm_nccl_new(out, me, n, id, x->device, &x->opt);
}

static void nc_abort(cm_comm *c) {
    nccl_impl *x = c->impl;
    atomic_store(&x->aborted, 1);
    pthread_mutex_lock(&x->lk);
    abort_locked(x);
    pthread_mutex_unlock(&x->lk);
}

static void nc_destroy(cm_comm *c) {
    if (!c) return;
    nccl_impl *x = c->impl;
    if (x) {
        cudaSetDevice(x->device);
        pthread_mutex_lock(&x->lk);
        if (x->comm && !x->failed && !atomic_load(&x->aborted)) {
            /* flush, then free; a finalize that does not finish in time is aborted */
            ncclResult_t r = ncclCommFinalize(x->comm);
            int64_t deadline = now_ms() + 10000;
            ncclResult_t st = r;
            while (r == ncclSuccess || r == ncclInProgress) {
                if (ncclCommGetAsyncError(x->comm, &st) != ncclSuccess || st != ncclInProgress) break;
                if (now_ms() >= deadline) break;
                usleep(100);
            }
            if ((r == ncclSuccess || r == ncclInProgress) && st == ncclSuccess) {
                ncclCommDestroy(x->comm);
                x->comm = NULL;
            }
        }
        abort_locked(x);
        pthread_mutex_unlock(&x->lk);
        if (x->stream) {
            cudaStreamSynchronize(x->stream);
            cudaStreamDestroy(x->stream);
        }
        if (x->dstage) cudaFree(x->dstage);
        if (x->hstage) cudaFreeHost(x->hstage);
        if (x->done) cudaFree(x->done);
        (void)cudaGetLastError();
        pthread_mutex_destroy(&x->lk);
        free(x);
    }
    free(c);
}

static const cm_ops nccl_ops = {
    .allreduce_sum = nc_allreduce,
    .broadcast = nc_broadcast,
    .allgather = nc_allgather,
    .reduce_scatter_sum = nc_reduce_scatter,
    .alltoallv = nc_alltoallv,
    .barrier = nc_barrier,
    .send = nc_send,
    .recv = nc_recv,
    .split = nc_split,
    .abort = nc_abort,
    .destroy = nc_destroy,
    .allreduce_sum_q = nc_allreduce_q,
    .allgather_q = nc_allgather_q,
    .reduce_scatter_sum_q = nc_reduce_scatter_q,
    .p2p_q = nc_p2p_q,
    .queued_error = nc_queued_error,
};

int cm_nccl_get_unique_id(uint8_t out[128]) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return co_err_set(CO_EUNSUPPORTED, "nccl: no usable CUDA GPU: %s",
                          e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    }
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return co_err_set(map_nccl(r), "nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(out, id.internal, 128);
    return 0;
}

/* A cm_comm around a fresh impl (NCCL communicator not yet created). */
static int impl_new(cm_comm **out, nccl_impl **px, int rank, int size, int device, const cm_nccl_options *opt) {
    cm_comm *c = calloc(1, sizeof *c);
    nccl_impl *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return co_err_set(CO_ENOMEM, "nccl: out of memory");
    }
    c->ops = &nccl_ops;
    c->rank = rank;
    c->size = size;
    c->impl = x;
    x->device = device;
    atomic_init(&x->aborted, 0);
    pthread_mutex_init(&x->lk, NULL);
    if (opt) x->opt = *opt;
    else cm_nccl_options_default(&x->opt);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&x->done, sizeof(int32_t) * 4);
    if (e == cudaSuccess) e = cudaMemset(x->done, 0, sizeof(int32_t) * 4);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        int rc = co_err_set(CO_EUNSUPPORTED, "nccl: CUDA device %d: %s", device, cudaGetErrorString(e));
        nc_destroy(c);
        return rc;
    }
    *out = c;
    *px = x;
    return 0;
}

int cm_nccl_new(cm_comm **out, int rank, int size, const uint8_t id[128], int device, const cm_nccl_options *opt) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size || !id)
        return co_err_set(CO_EINVAL, "nccl: rank %d of %d is not a valid place", rank, size);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || device < 0 || device >= ndev) {
        (void)cudaGetLastError();
        return co_err_set(CO_EUNSUPPORTED, "nccl: CUDA device %d is not available (%d devices)", device, ndev);
    }
    cm_comm *c = NULL;
    nccl_impl *x = NULL;
    int rc = impl_new(&c, &x, rank, size, device, opt);
    if (rc) return rc;
    ncclUniqueId uid;
    memcpy(uid.internal, id, 128);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = ncclCommInitRankConfig(&x->comm, size, uid, rank, &config);
    pthread_mutex_unlock(&x->lk);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = co_err_set(map_nccl(r), "nccl: ncclCommInitRankConfig (rank %d of %d): %s", rank, size,
                        ncclGetErrorString(r));
        nc_destroy(c);
        return rc;
    }
    rc = wait_done(x, "init", x->opt.init_timeout_ms, false);
    if (rc) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", co_err_detail());
        nc_destroy(c);
        return co_err_set(rc, "%s (rank %d of %d)", detail, rank, size);
    }
    *out = c;
    return 0;
}

int cm_nccl_split_color(cm_comm *c, int color, int key, cm_comm **out, int timeout_ms) {
    nccl_impl *x = c->impl;
    *out = NULL;
    int rc = enter(x, "split");
    if (rc) return rc;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t nc = NULL;
    pthread_mutex_lock(&x->lk);
    ncclResult_t r = x->comm ? ncclCommSplit(x->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &config)
                             : ncclSuccess;
    pthread_mutex_unlock(&x->lk);
    if (r != ncclSuccess && r != ncclInProgress) return fail_nccl(x, r, "split");
    /* the parent reports the split's progress; a failed split's half-made child is aborted
     * here (nothing else holds it) */
    if ((rc = wait_done(x, "split", timeout_ms, false))) {
        if (nc) ncclCommAbort(nc);
        return rc;
    }
    if (color < 0 || !nc) return 0;
    nccl_impl *y = NULL;
    cm_comm *child = NULL;
    if ((rc = impl_new(&child, &y, 0, 1, x->device, &x->opt))) {
        ncclCommAbort(nc);
        return rc;
    }
    y->comm = nc;
    /* the child finishes its own setup, then says where this rank is in it */
    int nrank = 0, nsize = 0;
    if ((rc = wait_done(y, "split", timeout_ms, false))) {
        nc_destroy(child);
        return rc;
    }
    if (ncclCommUserRank(nc, &nrank) != ncclSuccess || ncclCommCount(nc, &nsize) != ncclSuccess) {
        nc_destroy(child);
        return co_err_set(CO_EINTERNAL, "nccl: split: cannot query the new communicator");
    }
    child->rank = nrank;
    child->size = nsize;
    *out = child;
    return 0;
}

void *cm_nccl_stream(cm_comm *c) { return (void *)((nccl_impl *)c->impl)->stream; }
