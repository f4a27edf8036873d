// sim_runtime.cc - the CUDA stand-in's runtime: the functions of CUDA's cuda_runtime_api.h
// that cohort calls (kernels/cuda/*.cu, comm/nccl_comm.c, tests/gpu/), on the CPU
// (tests/cudasim/, docs/testing.md).
//
// One fake sm_90 device (COHORT_CUDASIM_DEVICES=n for more, all the same memory) with
// concurrent managed access. Every kind of memory is host memory from mmap, so each
// allocation has pages of its own, followed by a guard page. Streams are ordered queues
// whose work runs on the thread that next synchronises with them (cudaStreamSynchronize,
// cudaDeviceSynchronize, cudaMemcpy, a second cudaStreamQuery...: the first query of pending
// work answers cudaErrorNotReady). The legacy default stream and the blocking streams wait
// for each other, non-blocking ones do not.
// Host access without the synchronisation the code owes: while queued work uses an
// allocation (a kernel's pointer argument, a copy's source or destination, a cuBLAS
// operand), its pages are closed (PROT_NONE), and device memory (cudaMalloc) always is
// outside queued work; a host read or write there stops the process with a message naming
// the allocation, the work and its stream. They open while queued work runs.
// A failed kernel (sim_exec.cc) or cuBLAS call leaves a sticky error every later call
// returns, as a real context would, until cudasim_clear_error.
#include "sim_internal.h"

extern "C" {
#include "common/log.h"
}
// weak: a program that never logs does not link co_log, and the module then writes to stderr
#pragma weak co_log
#define co_log(level, ...) (co_log ? co_log(level, __VA_ARGS__) : (void)(fprintf(stderr, __VA_ARGS__), fputc('\n', stderr)))

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <thread>

// cudasim_enqueue_async work: runs on a thread of its own once its stream reaches it (with
// every allocation open: it counts in g_exec until it is popped), so that cudaStreamQuery
// answers cudaErrorNotReady while it runs instead of running it in the caller
struct async_run {
    std::mutex m;
    std::condition_variable cv;
    bool started = false, done = false;
    std::thread th;
};

struct CUstream_st {
    int id;
    unsigned flags;
    int queries; // cudaStreamQuery calls answered NotReady since the queue last ran
    struct item {
        std::string what;
        std::function<void()> fn;
        std::vector<void *> refs;
        std::shared_ptr<async_run> async; // set for cudasim_enqueue_async work
    };
    std::deque<item> q;
};

struct CUevent_st {
    cudaStream_t stream;
    bool recorded, done; // done: the latest record has run
    // records made and run, counted: a stream's wait is for the record made before it, not
    // for a later one (CUDA's cudaStreamWaitEvent), so an event recorded again while the
    // wait is queued neither releases it early nor holds it
    uint64_t rec_gen, done_gen;
    double t; // when it ran (CLOCK_MONOTONIC, seconds): cudaEventElapsedTime is the host time between two
};

namespace cudasim {

std::recursive_mutex g_lock;

namespace {

enum { M_DEVICE = 1, M_MANAGED, M_HOST };

struct alloc {
    char *base;
    size_t size, span; // asked, rounded to pages (a guard page follows)
    int kind;
    int pending;       // queued work using it
    bool closed;       // PROT_NONE now
    char user[160];    // the last queued work that uses it (for the message)
};

std::map<uintptr_t, alloc *> g_allocs;
std::vector<CUstream_st *> g_streams;
CUstream_st g_legacy;
int g_next_stream = 1;
int g_exec;          // > 0 while queued work runs (allocations open)
cudaError_t g_sticky = cudaSuccess;
std::string g_msg;
thread_local cudaError_t t_last = cudaSuccess;
thread_local int t_device;
size_t g_page;
struct sigaction g_old_segv;

int device_count() {
    static int n = [] {
        const char *e = getenv("COHORT_CUDASIM_DEVICES");
        int v = e && *e ? atoi(e) : 1;
        return v < 1 ? 1 : v;
    }();
    return n;
}

alloc *find(const void *p) {
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return NULL;
    --it;
    alloc *a = it->second;
    return (uintptr_t)p < (uintptr_t)a->base + a->span ? a : NULL;
}

// the allocation whose guard page holds p
alloc *find_guard(const void *p) {
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return NULL;
    --it;
    alloc *a = it->second;
    uintptr_t end = (uintptr_t)a->base + a->span;
    return (uintptr_t)p >= end && (uintptr_t)p < end + g_page ? a : NULL;
}

bool want_closed(const alloc *a) { return g_exec == 0 && (a->kind == M_DEVICE || a->pending > 0); }

void set_prot(alloc *a) {
    bool c = want_closed(a);
    if (c == a->closed) return;
    mprotect(a->base, a->span, c ? PROT_NONE : PROT_READ | PROT_WRITE);
    a->closed = c;
}

void exec_begin() {
    if (g_exec++ == 0)
        for (auto &kv : g_allocs) set_prot(kv.second);
}

void exec_end() {
    if (--g_exec == 0)
        for (auto &kv : g_allocs) set_prot(kv.second);
}

void say(const char *s) {
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

void on_segv(int sig, siginfo_t *si, void *ctx) {
    void *addr = si->si_addr;
    alloc *a = find(addr), *g = a ? NULL : find_guard(addr);
    bool wr = false;
#if defined(__x86_64__)
    wr = ctx && (((ucontext_t *)ctx)->uc_mcontext.gregs[REG_ERR] & 2);
#endif
    char b[640];
    if (a && a->closed) {
        snprintf(b, sizeof b,
                 "cudasim: host %s at %p, %zu bytes into %s memory of %zu bytes at %p, %s; the host must "
                 "synchronise (cudaStreamSynchronize, the backend's sync) before it touches it\n",
                 wr ? "write" : "read", addr, (size_t)((char *)addr - a->base),
                 a->kind == M_DEVICE ? "device" : a->kind == M_MANAGED ? "managed" : "pinned host", a->size, (void *)a->base,
                 a->kind == M_DEVICE && !a->pending ? "which the host may never touch (cudaMalloc)" : a->user);
        say(b);
        abort();
    }
    if (g) {
        snprintf(b, sizeof b, "cudasim: %s at %p, %zu bytes past the end of an allocation of %zu bytes at %p (%s)\n",
                 wr ? "write" : "read", addr, (size_t)((char *)addr - g->base) - g->size, g->size, (void *)g->base,
                 g->user[0] ? g->user : "no queued work");
        say(b);
        abort();
    }
    // not ours: what was there before
    if (g_old_segv.sa_flags & SA_SIGINFO && g_old_segv.sa_sigaction) {
        g_old_segv.sa_sigaction(sig, si, ctx);
        return;
    }
    signal(SIGSEGV, g_old_segv.sa_handler == SIG_IGN ? SIG_DFL : g_old_segv.sa_handler);
}

void install_handler() {
    static bool done = false;
    if (done) return;
    done = true;
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
}

cudaError_t new_alloc(void **out, size_t n, int kind) {
    if (!out) return set_last(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    install_handler();
    size_t span = ((n ? n : 1) + g_page - 1) / g_page * g_page;
    char *m = (char *)mmap(NULL, span + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        *out = NULL;
        return set_last(cudaErrorMemoryAllocation);
    }
    mprotect(m + span, g_page, PROT_NONE);
    alloc *a = new alloc();
    a->base = m, a->size = n, a->span = span, a->kind = kind;
    g_allocs[(uintptr_t)m] = a;
    set_prot(a);
    *out = m;
    return cudaSuccess;
}

void free_alloc(alloc *a) {
    g_allocs.erase((uintptr_t)a->base);
    munmap(a->base, a->span + g_page);
    delete a;
}

CUstream_st *S(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g_legacy;
    return s;
}

bool blocking(const CUstream_st *s) { return s == &g_legacy || !(s->flags & cudaStreamNonBlocking); }

// Whether the asynchronous item at the head of a queue has finished: starts its thread the
// first time; with wait, waits for it (its work never takes g_lock, so holding it is safe).
bool async_finished(CUstream_st::item &it, bool wait) {
    async_run *a = it.async.get();
    if (!a->started) {
        a->started = true;
        exec_begin(); // ended when the item is popped
        std::function<void()> fn = it.fn;
        a->th = std::thread([a, fn]() {
            fn();
            std::lock_guard<std::mutex> lk(a->m);
            a->done = true;
            a->cv.notify_all();
        });
    }
    std::unique_lock<std::mutex> lk(a->m);
    if (wait) a->cv.wait(lk, [a]() { return a->done; });
    if (!a->done) return false;
    lk.unlock();
    a->th.join();
    exec_end();
    return true;
}

// Runs the queue; without wait, stops at asynchronous work still running and returns false.
bool run_queue(CUstream_st *s, bool wait = true) {
    exec_begin();
    bool finished = true;
    while (!s->q.empty()) {
        CUstream_st::item &head = s->q.front();
        if (head.async && (head.async->started || g_sticky == cudaSuccess) && !async_finished(head, wait)) {
            finished = false;
            break;
        }
        CUstream_st::item it = std::move(head);
        s->q.pop_front();
        if (!it.async && g_sticky == cudaSuccess) it.fn(); // after a failure nothing more runs, as on a GPU
        for (void *r : it.refs) {
            alloc *a = find(r);
            if (a && a->pending > 0) a->pending--;
        }
    }
    if (finished) s->queries = 0;
    exec_end();
    return finished;
}

} // namespace

void report(cudaError_t code, const std::string &msg) {
    co_log(CO_LOG_ERROR, "%s", msg.c_str());
    {
        std::lock_guard<std::recursive_mutex> lk(g_lock);
        g_msg = msg;
        if (g_sticky == cudaSuccess) g_sticky = code;
    }
    const char *ab = getenv("COHORT_CUDASIM_ABORT");
    if (ab && ab[0] == '1') abort();
}

cudaError_t sticky() { return g_sticky; }

cudaError_t set_last(cudaError_t e) {
    if (e != cudaSuccess) t_last = e;
    return e;
}

cudaError_t enqueue(cudaStream_t s0, const std::string &what, std::function<void()> fn,
                    const std::vector<const void *> &ptrs) {
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    if (g_sticky) return g_sticky;
    CUstream_st *s = S(s0);
    CUstream_st::item it;
    it.what = what;
    it.fn = std::move(fn);
    for (const void *p : ptrs) {
        alloc *a = find(p);
        if (!a) continue;
        a->pending++;
        snprintf(a->user, sizeof a->user, "which %s queued on stream %d uses", what.c_str(), s->id);
        it.refs.push_back(a->base);
        set_prot(a);
    }
    s->q.push_back(std::move(it));
    return cudaSuccess;
}

// The legacy stream's implicit synchronisation before s runs: the legacy stream waits for
// every blocking stream, and a blocking stream for the legacy one (g_lock held).
static void drain_implicit(CUstream_st *s) {
    if (s == &g_legacy) {
        for (CUstream_st *o : g_streams)
            if (blocking(o)) run_queue(o);
    } else if (blocking(s)) {
        run_queue(&g_legacy);
    }
}

cudaError_t drain(cudaStream_t s0) {
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    CUstream_st *s = S(s0);
    drain_implicit(s);
    run_queue(s);
    return g_sticky;
}

// cudaStreamQuery's drain: as drain, but the stream's own queue stops at asynchronous work
// still running (cudaErrorNotReady)
cudaError_t drain_poll(cudaStream_t s0) {
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    CUstream_st *s = S(s0);
    drain_implicit(s);
    if (!run_queue(s, false)) return g_sticky ? g_sticky : cudaErrorNotReady;
    return g_sticky;
}

cudaError_t drain_all() {
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    run_queue(&g_legacy);
    for (CUstream_st *o : g_streams) run_queue(o);
    return g_sticky;
}

} // namespace cudasim

using namespace cudasim;

#define STICKY()                                     \
    do {                                             \
        if (g_sticky) return set_last(g_sticky);     \
    } while (0)

extern "C" {

const char *cudasim_last_error(void) { return g_msg.c_str(); }

// host synchronisations: the calls that make the host wait for queued work (counted whether
// or not work was queued: the count is of the code's waits, as a GPU would cost them)
static std::atomic<unsigned long> g_syncs;
static void count_sync() { g_syncs++; }
unsigned long cudasim_sync_count(void) { return g_syncs; }

// WMMA products (include/mma.h increments it from lane 0 of each warp-level mma_sync)
uint64_t cudasim_mma_count;
unsigned long cudasim_mma_count_get(void) { return (unsigned long)__atomic_load_n(&cudasim_mma_count, __ATOMIC_RELAXED); }

// COHORT_CUDASIM_COUNTS=FILE: at exit, one line "pid PID syncs N launches M" appended to FILE
// (tests/cudasim/train_test.sh counts a training step's waits from two runs' lines)
namespace {
struct counts_at_exit {
    ~counts_at_exit() {
        const char *f = getenv("COHORT_CUDASIM_COUNTS");
        if (!f || !*f) return;
        FILE *o = fopen(f, "a");
        if (!o) return;
        fprintf(o, "pid %d syncs %lu launches %lu\n", (int)getpid(), (unsigned long)g_syncs,
                cudasim_launch_count());
        fclose(o);
    }
} g_counts_at_exit;
}

void cudasim_clear_error(void) {
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    g_sticky = cudaSuccess;
    g_msg.clear();
    t_last = cudaSuccess;
}

cudaError_t cudasim_enqueue(cudaStream_t s, cudasim_fn fn, void *arg) {
    if (!fn) return set_last(cudaErrorInvalidValue);
    return set_last(enqueue(s, "cudasim_enqueue work", [fn, arg]() { fn(arg); }, {}));
}

cudaError_t cudasim_enqueue_async(cudaStream_t s0, cudasim_fn fn, void *arg) {
    if (!fn) return set_last(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    cudaError_t e = enqueue(s0, "cudasim_enqueue_async work", [fn, arg]() { fn(arg); }, {});
    if (e == cudaSuccess) S(s0)->q.back().async = std::make_shared<async_run>();
    return set_last(e);
}

// ---- errors and versions ----

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_sticky ? g_sticky : t_last;
    t_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return g_sticky ? g_sticky : t_last; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (cudasim)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (cudasim: see the error logged before)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error (cudasim)";
    }
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return set_last(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) { return cudaRuntimeGetVersion(v); }

// ---- device ----

cudaError_t cudaGetDeviceCount(int *n) {
    if (!n) return set_last(cudaErrorInvalidValue);
    *n = device_count();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
    STICKY();
    if (d < 0 || d >= device_count()) return set_last(cudaErrorInvalidDevice);
    t_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
    if (!d) return set_last(cudaErrorInvalidValue);
    *d = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (!p) return set_last(cudaErrorInvalidValue);
    if (d < 0 || d >= device_count()) return set_last(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudasim (the CPU stand-in for an sm_90 GPU)");
    p->major = 9, p->minor = 0;
    p->totalGlobalMem = (size_t)80 << 30;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 132;
    p->managedMemory = 1;
    p->concurrentManagedAccess = 1;
    p->pageableMemoryAccess = 0;
    p->unifiedAddressing = 1;
    p->pciBusID = d;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    if (!v) return set_last(cudaErrorInvalidValue);
    if (d < 0 || d >= device_count()) return set_last(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrConcurrentManagedAccess: *v = 1; break;
    case cudaDevAttrManagedMemory: *v = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 * 1024; break;
    default: *v = 0; break;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *f) {
    if (!a || !f) return set_last(cudaErrorInvalidDeviceFunction);
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = 1024;
    a->ptxVersion = 90, a->binaryVersion = 90;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    STICKY();
    count_sync();
    return set_last(drain_all());
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
    if (fr) *fr = (size_t)79 << 30;
    if (total) *total = (size_t)80 << 30;
    return cudaSuccess;
}

// ---- memory ----

cudaError_t cudaMalloc(void **p, size_t n) {
    STICKY();
    return new_alloc(p, n, M_DEVICE);
}

cudaError_t cudaMallocManaged(void **p, size_t n, unsigned flags) {
    (void)flags;
    STICKY();
    return new_alloc(p, n, M_MANAGED);
}

cudaError_t cudaMallocHost(void **p, size_t n) {
    STICKY();
    return new_alloc(p, n, M_HOST);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    return cudaMallocHost(p, n);
}

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
    (void)s;
    STICKY();
    return new_alloc(p, n, M_DEVICE);
}

static cudaError_t free_kind(void *p, bool host) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    alloc *a = find(p);
    if (!a || (void *)a->base != p || (a->kind == M_HOST) != host) return set_last(cudaErrorInvalidValue);
    drain_all(); // cudaFree waits for the device
    free_alloc(a);
    return g_sticky ? set_last(g_sticky) : cudaSuccess;
}

cudaError_t cudaFree(void *p) { return free_kind(p, false); }
cudaError_t cudaFreeHost(void *p) { return free_kind(p, true); }

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    STICKY();
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    alloc *a = find(p);
    if (!a || (void *)a->base != p) return set_last(cudaErrorInvalidValue);
    return set_last(enqueue(s, "cudaFreeAsync", [p]() {
        alloc *x = find(p);
        if (x) free_alloc(x);
    }, {p}));
}

cudaError_t cudaMemPrefetchAsync(const void *p, size_t n, struct cudaMemLocation loc, unsigned flags,
                                 cudaStream_t s) {
    (void)n, (void)loc, (void)flags, (void)s;
    STICKY();
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    alloc *a = find(p);
    return a && a->kind == M_MANAGED ? cudaSuccess : set_last(cudaErrorInvalidValue);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p) {
    if (!at) return set_last(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    memset(at, 0, sizeof *at);
    alloc *a = find(p);
    at->device = 0;
    if (!a) {
        at->type = cudaMemoryTypeUnregistered;
        return cudaSuccess;
    }
    at->type = a->kind == M_DEVICE ? cudaMemoryTypeDevice : a->kind == M_MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeHost;
    at->devicePointer = (void *)p;
    at->hostPointer = a->kind == M_DEVICE ? NULL : (void *)p;
    return cudaSuccess;
}

// a copy or fill that runs now, with every allocation open
static void now(const std::function<void()> &fn) {
    exec_begin();
    fn();
    exec_end();
}

static bool ours(const void *p) { return find(p) != NULL; }

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
    (void)k;
    STICKY();
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return set_last(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    if (!ours(dst)) { // into pageable host memory: done when the call returns
        count_sync();
        cudaError_t e = drain(s);
        if (e) return set_last(e);
        now([&]() { memmove(dst, src, n); });
        return cudaSuccess;
    }
    if (!ours(src)) { // from pageable host memory: the caller may reuse it at once
        std::shared_ptr<std::vector<char>> copy(new std::vector<char>((const char *)src, (const char *)src + n));
        return set_last(enqueue(s, "cudaMemcpyAsync", [dst, copy]() { memcpy(dst, copy->data(), copy->size()); }, {dst}));
    }
    return set_last(enqueue(s, "cudaMemcpyAsync", [dst, src, n]() { memmove(dst, src, n); }, {dst, src}));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    STICKY();
    count_sync();
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return set_last(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    cudaError_t e = drain(NULL);
    if (e) return set_last(e);
    now([&]() { memmove(dst, src, n); });
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    STICKY();
    if (n == 0) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    alloc *a = find(p);
    if (!a || (char *)p + n > a->base + a->size) return set_last(cudaErrorInvalidValue);
    return set_last(enqueue(s, "cudaMemsetAsync", [p, v, n]() { memset(p, v, n); }, {p}));
}

cudaError_t cudaMemset(void *p, int v, size_t n) {
    STICKY();
    if (n == 0) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    alloc *a = find(p);
    if (!a || (char *)p + n > a->base + a->size) return set_last(cudaErrorInvalidValue);
    cudaError_t e = drain(NULL);
    if (e) return set_last(e);
    now([&]() { memset(p, v, n); });
    return cudaSuccess;
}

// ---- streams and events ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    STICKY();
    if (!s) return set_last(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    CUstream_st *n = new CUstream_st();
    n->id = g_next_stream++;
    n->flags = flags;
    g_streams.push_back(n);
    *s = n;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return set_last(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    for (size_t i = 0; i < g_streams.size(); i++)
        if (g_streams[i] == s) {
            drain(s); // queued work completes, as CUDA does
            g_streams.erase(g_streams.begin() + (long)i);
            delete s;
            return cudaSuccess;
        }
    return set_last(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    STICKY();
    count_sync();
    return set_last(drain(s));
}

cudaError_t cudaStreamQuery(cudaStream_t s0) {
    STICKY();
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    CUstream_st *s = S(s0);
    if (s->q.empty()) return cudaSuccess;
    if (s->queries++ == 0) return cudaErrorNotReady; // the next query runs it
    cudaError_t e = drain_poll(s0);
    return e == cudaErrorNotReady ? e : set_last(e);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
    STICKY();
    if (!fn) return set_last(cudaErrorInvalidValue);
    // as on a GPU, where a CUDA thread of its own runs it (and it must not call CUDA)
    return cudasim_enqueue_async(s, fn, arg);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    if (!e) return set_last(cudaErrorInvalidValue);
    *e = new CUevent_st();
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    STICKY();
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    e->stream = s, e->recorded = true, e->done = false;
    const uint64_t g = ++e->rec_gen;
    return set_last(enqueue(s, "cudaEventRecord", [e, g]() {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        if (g > e->done_gen) e->done_gen = g;
        e->done = e->done_gen == e->rec_gen;
    }, {}));
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    STICKY();
    count_sync();
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    return e->recorded && !e->done ? set_last(drain(e->stream)) : cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    STICKY();
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    if (!e->recorded || e->done) return cudaSuccess;
    return cudaStreamQuery(e->stream) == cudaErrorNotReady ? cudaErrorNotReady : (e->done ? cudaSuccess : cudaErrorNotReady);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    STICKY();
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(g_lock);
    if (!e->recorded || e->done) return cudaSuccess;
    cudaStream_t other = e->stream;
    const uint64_t g = e->rec_gen; // the record this wait is for
    // when s reaches this point, other runs up to (at least) the event
    return set_last(enqueue(s, "cudaStreamWaitEvent", [e, other, g]() {
        if (e->done_gen < g) drain(other);
    }, {}));
}

// the host time between the two events' running (the stand-in's work is host work)
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms || !a || !b) return set_last(cudaErrorInvalidValue);
    if (!a->done || !b->done) return set_last(cudaErrorNotReady);
    *ms = (float)(1e3 * (b->t - a->t));
    return cudaSuccess;
}

} // extern "C"
