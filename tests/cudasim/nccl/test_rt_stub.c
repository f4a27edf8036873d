/* test_rt_stub.c - TEST-ONLY: the few CUDA runtime calls comm/nccl_comm.c and its tests make,
 * on the host, so that the NCCL stand-in can run nccl_comm.c without a GPU or the full CUDA
 * stand-in. One device; device, pinned and host memory are malloc'd host memory told apart
 * by a registry (cudaPointerGetAttributes); every stream other than the default one has a
 * thread that runs its queued work in order, as a GPU would, so cudaStreamQuery never blocks
 * and a collective waiting for its peers does not hold up the calling thread. The default
 * stream runs work at once. Not a model of CUDA beyond that: no kernels, no events. */
#include "tests/cudasim/nccl/sim_nccl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct item {
    struct item *next;
    cudasim_fn fn;
    void *arg;
} item;

struct CUstream_st {
    pthread_mutex_t lk;
    pthread_cond_t cv;
    item *head, *tail;
    bool busy, stop;
    pthread_t th;
};

typedef struct allocation {
    char *p;
    size_t n;
    enum cudaMemoryType type;
} allocation;

static pthread_mutex_t reg_lk = PTHREAD_MUTEX_INITIALIZER;
static allocation *reg;
static size_t nreg, capreg;

static bool is_default(cudaStream_t s) { return !s || s == cudaStreamLegacy || s == cudaStreamPerThread; }

static void *stream_main(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->lk);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->lk);
        if (!s->head) break;
        item *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->busy = true;
        pthread_mutex_unlock(&s->lk);
        it->fn(it->arg);
        free(it);
        pthread_mutex_lock(&s->lk);
        s->busy = false;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->lk);
    return NULL;
}

cudaError_t cudasim_enqueue(cudaStream_t s, cudasim_fn fn, void *arg) {
    if (is_default(s)) {
        fn(arg);
        return cudaSuccess;
    }
    item *it = calloc(1, sizeof *it);
    if (!it) return cudaErrorMemoryAllocation;
    it->fn = fn;
    it->arg = arg;
    pthread_mutex_lock(&s->lk);
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lk);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags) {
    (void)flags;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return cudaErrorMemoryAllocation;
    pthread_mutex_init(&s->lk, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
        free(s);
        return cudaErrorMemoryAllocation;
    }
    *ps = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *ps) { return cudaStreamCreateWithFlags(ps, 0); }

cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (is_default(s)) return cudaSuccess;
    pthread_mutex_lock(&s->lk);
    bool idle = !s->head && !s->busy;
    pthread_mutex_unlock(&s->lk);
    return idle ? cudaSuccess : cudaErrorNotReady;
}

/* waits (at most 60 s: a test's bound) for the stream's queue to drain */
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (is_default(s)) return cudaSuccess;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&s->lk);
    while ((s->head || s->busy) && e == cudaSuccess)
        if (pthread_cond_timedwait(&s->cv, &s->lk, &dl) == ETIMEDOUT) e = cudaErrorLaunchTimeout;
    pthread_mutex_unlock(&s->lk);
    return e;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (is_default(s)) return cudaErrorInvalidResourceHandle;
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return e; /* its thread is stuck: leave it */
    pthread_mutex_lock(&s->lk);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lk);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->lk);
    pthread_cond_destroy(&s->cv);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) { return cudasim_enqueue(s, fn, arg); }

typedef struct copy_args {
    void *dst;
    const void *src;
    size_t n;
} copy_args;

static void run_copy(void *arg) {
    copy_args *a = arg;
    memmove(a->dst, a->src, a->n);
    free(a);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)kind;
    copy_args *a = malloc(sizeof *a);
    if (!a) return cudaErrorMemoryAllocation;
    *a = (copy_args){dst, src, n};
    return cudasim_enqueue(s, run_copy, a);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    (void)kind;
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n) {
    memset(p, v, n);
    return cudaSuccess;
}

static cudaError_t reg_alloc(void **out, size_t n, enum cudaMemoryType type) {
    void *p = calloc(1, n ? n : 1);
    pthread_mutex_lock(&reg_lk);
    if (p && nreg == capreg) {
        size_t cap = capreg ? 2 * capreg : 64;
        allocation *r = realloc(reg, cap * sizeof *r);
        if (r) {
            reg = r;
            capreg = cap;
        }
    }
    bool ok = p && nreg < capreg;
    if (ok) reg[nreg++] = (allocation){p, n, type};
    pthread_mutex_unlock(&reg_lk);
    if (!ok) {
        free(p);
        return cudaErrorMemoryAllocation;
    }
    *out = p;
    return cudaSuccess;
}

static cudaError_t reg_free(void *p) {
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&reg_lk);
    size_t i = 0;
    while (i < nreg && reg[i].p != p) i++;
    bool found = i < nreg;
    if (found) reg[i] = reg[--nreg];
    pthread_mutex_unlock(&reg_lk);
    if (!found) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) { return reg_alloc(p, n, cudaMemoryTypeDevice); }
cudaError_t cudaMallocHost(void **p, size_t n) { return reg_alloc(p, n, cudaMemoryTypeHost); }
cudaError_t cudaFree(void *p) { return reg_free(p); }
cudaError_t cudaFreeHost(void *p) { return reg_free(p); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    a->type = cudaMemoryTypeUnregistered;
    pthread_mutex_lock(&reg_lk);
    for (size_t i = 0; i < nreg; i++)
        if ((const char *)p >= reg[i].p && (const char *)p < reg[i].p + (reg[i].n ? reg[i].n : 1)) {
            a->type = reg[i].type;
            a->devicePointer = a->type == cudaMemoryTypeDevice ? (void *)p : NULL;
            a->hostPointer = a->type == cudaMemoryTypeHost ? (void *)p : NULL;
        }
    pthread_mutex_unlock(&reg_lk);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchTimeout: return "the stream did not drain in 60 s (test runtime stub)";
    default: return "CUDA error (test runtime stub)";
    }
}
