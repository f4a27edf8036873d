// sim_exec.cc - the CUDA stand-in's execution model: grids run block by block, every CUDA
// thread of a block a fiber on the calling host thread (tests/cudasim/, docs/testing.md).
//
// A fiber runs until it reaches __syncthreads, a warp operation (shuffle, ballot,
// __syncwarp) or its end, then switches back to the scheduler. The scheduler runs the ready
// fibers in an order shuffled by COHORT_CUDASIM_SEED, then completes the warp operations
// every live lane of a warp has reached (lockstep: a shuffle is a warp-level barrier), then
// the block barrier once every live thread waits at it (threads that exit leave barriers).
// What cannot complete is reported: threads waiting at different __syncthreads, lanes of a
// warp at different warp operations, a barrier some live threads never reach. Blocks of a
// grid run one at a time, in an order shuffled by the seed too.
// Shared memory (cudasim_device.h's handles) is checked on every access: bounds, reads of
// words not written in this block, and races: a word written (or read) by another thread
// since the last barrier that orders the two (a __syncthreads; for lanes of one warp, also
// a warp operation), in the spirit of compute-sanitizer's racecheck.
#include "sim_internal.h"

extern "C" {
#include "common/log.h"
}
// weak: a program that never logs does not link co_log, and the module then writes to stderr
#pragma weak co_log
#define co_log(level, ...) (co_log ? co_log(level, __VA_ARGS__) : (void)(fprintf(stderr, __VA_ARGS__), fputc('\n', stderr)))

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <memory>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cudasim {

thread_state *g_thread;
block_state g_block;

namespace {

enum { F_READY = 0, F_BAR, F_WARP, F_DONE, F_ABORTED };
const size_t STACK = 64 * 1024;

struct fiber {
    void *sp;
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
    char *stack;
    thread_state ts;
    int state;
    const char *file;
    int line, kind, src;
    unsigned mask;
    uint64_t val, res;
};

std::vector<std::unique_ptr<fiber>> g_pool;
fiber *g_fib;
void *g_sched_sp;
#if !defined(__x86_64__)
ucontext_t g_sched_uc;
#endif
const grid_rec *g_grid;
bool g_failed;
cudaError_t g_fail_code;
std::string g_fail_msg;
uint64_t g_epoch = 1, g_block_ep;
uint32_t g_wep[32];
uint64_t g_launch_serial;
unsigned long g_launches;

} // namespace
} // namespace cudasim

#if defined(__x86_64__)
// cudasim_switch(save, to): saves the callee-saved registers on the current stack, stores
// the stack pointer in *save and resumes the context whose stack pointer is to. (The SSE and
// x87 control words are not switched: every fiber runs with the host thread's.)
asm(R"(
.text
.p2align 4
.type cudasim_switch,@function
cudasim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size cudasim_switch,.-cudasim_switch
)");
extern "C" void cudasim_switch(void **save, void *to);
#endif

namespace cudasim {
namespace {

uint3 u3(unsigned x, unsigned y, unsigned z) {
    uint3 u;
    u.x = x, u.y = y, u.z = z;
    return u;
}

void to_sched() {
#if defined(__x86_64__)
    cudasim_switch(&g_fib->sp, g_sched_sp);
#else
    swapcontext(&g_fib->uc, &g_sched_uc);
#endif
}

void fiber_entry() {
    g_grid->body();
    g_fib->state = F_DONE;
    to_sched();
    abort(); // a finished fiber is never resumed
}

void fiber_init(fiber *f) {
#if defined(__x86_64__)
    // r15 r14 r13 r12 rbx rbp, then fiber_entry as the return address, entered with the
    // stack as a call leaves it (rsp + 8 a multiple of 16; its own return address 0)
    uintptr_t top = ((uintptr_t)f->stack + STACK) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 64);
    for (int i = 0; i < 6; i++) sp[i] = 0;
    sp[6] = (uint64_t)(uintptr_t)&fiber_entry;
    sp[7] = 0;
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, fiber_entry, 0);
#endif
}

void resume(fiber *f) {
    g_fib = f;
    g_thread = &f->ts;
#if defined(__x86_64__)
    cudasim_switch(&g_sched_sp, f->sp);
#else
    swapcontext(&g_sched_uc, &f->uc);
#endif
}

bool pool_reserve(size_t n) {
    while (g_pool.size() < n) {
        std::unique_ptr<fiber> f(new fiber());
        void *m = mmap(NULL, STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, 4096, PROT_NONE); // guard page below the stack
        f->stack = (char *)m + 4096;
        g_pool.push_back(std::move(f));
    }
    return true;
}

uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t seed() {
    static uint64_t s = [] {
        const char *e = getenv("COHORT_CUDASIM_SEED");
        return e && *e ? strtoull(e, NULL, 0) : 1ull;
    }();
    return s;
}

std::string where() {
    char b[160];
    snprintf(b, sizeof b, "kernel %s (launched at %s), block (%u,%u,%u)", g_grid->name.c_str(), g_grid->where.c_str(),
             g_block.bid.x, g_block.bid.y, g_block.bid.z);
    return b;
}

std::string tid_str(int lin) {
    const dim3 &d = g_block.bdim;
    char b[64];
    snprintf(b, sizeof b, "(%d,%d,%d)", lin % (int)d.x, lin / (int)d.x % (int)d.y, lin / (int)(d.x * d.y));
    return b;
}

// "threads 0-31, 64 (x,y,z ...)": a compact list of linear thread ids
std::string ranges(const std::vector<int> &ids) {
    std::string s;
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) j++;
        char b[48];
        if (j == i) snprintf(b, sizeof b, "%s%d", s.empty() ? "" : ", ", ids[i]);
        else snprintf(b, sizeof b, "%s%d-%d", s.empty() ? "" : ", ", ids[i], ids[j]);
        s += b;
        i = j + 1;
        if (s.size() > 200) {
            s += ", ...";
            break;
        }
    }
    return s;
}

void block_fail(cudaError_t code, const std::string &msg) {
    if (g_failed) return;
    g_failed = true;
    g_fail_code = code;
    g_fail_msg = where() + ": " + msg;
}

// from a running fiber: the block fails, and this thread never runs again
[[noreturn]] void thread_fail(cudaError_t code, const char *fmt, ...) {
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    block_fail(code, "thread " + tid_str(g_thread->lin) + " (linear " + std::to_string(g_thread->lin) + "): " + b);
    g_fib->state = F_ABORTED;
    to_sched();
    abort();
}

const char *kind_name(int k) {
    return k == W_SHFL ? "a shuffle" : k == W_BALLOT ? "a ballot" : k == W_SYNCWARP ? "__syncwarp" : "?";
}

std::string site_str(const fiber *f) { return std::string(f->file) + ":" + std::to_string(f->line); }

// Completes warp w's operation if every live lane has reached one: true if it did.
bool warp_complete(int w, int nt) {
    int lo = w * 32, hi = std::min(nt, lo + 32);
    fiber *first = NULL;
    for (int i = lo; i < hi; i++) {
        fiber *f = g_pool[i].get();
        if (f->state == F_DONE) continue;
        if (f->state != F_WARP) return false;
        if (!first) first = f;
    }
    if (!first) return false;
    auto same_site = [&](const fiber *f) {
        return f->kind == first->kind && f->line == first->line && (f->file == first->file || !strcmp(f->file, first->file));
    };
    const fiber *odd = NULL;
    for (int i = lo; i < hi && !odd; i++) {
        fiber *f = g_pool[i].get();
        if (f->state != F_DONE && !same_site(f)) odd = f;
    }
    if (odd) { // the lists for the message
        std::vector<int> same, other;
        for (int i = lo; i < hi; i++)
            if (g_pool[i]->state != F_DONE) (same_site(g_pool[i].get()) ? same : other).push_back(i);
        block_fail(cudaErrorLaunchFailure, "divergent warp operations in warp " + std::to_string(w) + ": threads " +
                                               ranges(same) + " at " + kind_name(first->kind) + " (" + site_str(first) +
                                               "), threads " + ranges(other) + " at " + kind_name(odd->kind) + " (" +
                                               site_str(odd) + ")");
        return false;
    }
    uint64_t ballot = 0;
    for (int i = lo; i < hi; i++) {
        fiber *f = g_pool[i].get();
        if (f->state == F_WARP && f->val) ballot |= 1ull << (i - lo);
    }
    for (int i = lo; i < hi; i++) {
        fiber *f = g_pool[i].get();
        if (f->state != F_WARP) continue;
        if (f->kind == W_SHFL) {
            int s = lo + f->src;
            if (f->src < 0 || f->src > 31 || s >= hi || g_pool[s]->state == F_DONE) {
                block_fail(cudaErrorLaunchFailure, "thread " + tid_str(i) + " (" + site_str(f) + ") shuffles from lane " +
                                                       std::to_string(f->src) + " of warp " + std::to_string(w) +
                                                       ", which has exited or does not exist");
                return false;
            }
            f->res = g_pool[s]->val;
        } else if (f->kind == W_BALLOT) {
            f->res = ballot & f->mask;
        }
    }
    for (int i = lo; i < hi; i++)
        if (g_pool[i]->state == F_WARP) g_pool[i]->state = F_READY;
    g_wep[w]++;
    return true;
}

// Every live thread is blocked and no warp operation can complete: release the block
// barrier if all of them wait at the same __syncthreads, else report why the block hangs.
bool barrier_complete(int nt) {
    const fiber *first = NULL, *odd = NULL;
    auto same_site = [&](const fiber *f) {
        return f->line == first->line && (f->file == first->file || !strcmp(f->file, first->file));
    };
    for (int i = 0; i < nt && !odd; i++) {
        fiber *f = g_pool[i].get();
        if (f->state == F_DONE) continue;
        if (f->state == F_WARP) odd = f;
        else if (!first) first = f;
        else if (!same_site(f)) odd = f;
    }
    if (!first && !odd) return false; // every thread has exited
    if (!odd) {
        for (int i = 0; i < nt; i++)
            if (g_pool[i]->state == F_BAR) g_pool[i]->state = F_READY;
        g_epoch++;
        return true;
    }
    std::vector<int> same, other, warp; // the lists for the message
    for (int i = 0; i < nt; i++) {
        fiber *f = g_pool[i].get();
        if (f->state == F_DONE) continue;
        if (f->state == F_WARP) warp.push_back(i);
        else if (!first) first = f, same.push_back(i);
        else (same_site(f) ? same : other).push_back(i);
    }
    if (!warp.empty()) odd = g_pool[warp[0]].get();
    std::string msg;
    if (!first)
        msg = "lanes of a warp never meet: threads " + ranges(warp) + " wait at " + kind_name(odd->kind) + " (" +
              site_str(odd) + ") for lanes that have exited or wait elsewhere";
    else if (!warp.empty())
        msg = "divergent barrier: threads " + ranges(same) + " wait at __syncthreads (" + site_str(first) +
              ") while threads " + ranges(warp) + " wait at " + kind_name(odd->kind) + " (" + site_str(odd) + ")";
    else
        msg = "divergent __syncthreads: threads " + ranges(same) + " wait at " + site_str(first) + ", threads " +
              ranges(other) + " at " + site_str(odd);
    block_fail(cudaErrorLaunchFailure, msg);
    return false;
}

void run_block(uint3 bid, uint64_t rng) {
    const dim3 bd = g_grid->block;
    const int nt = (int)(bd.x * bd.y * bd.z), nw = (nt + 31) / 32;
    g_block.bid = bid;
    for (int i = 0; i < nt; i++) {
        fiber *f = g_pool[i].get();
        fiber_init(f);
        f->ts.tid = u3(i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y));
        f->ts.lin = i, f->ts.lane = i & 31, f->ts.warp = i >> 5;
        f->state = F_READY;
    }
    g_block_ep = ++g_epoch;
    memset(g_wep, 0, sizeof g_wep);
    static std::vector<int> ready;
    ready.resize((size_t)nt);
    for (int i = 0; i < nt; i++) ready[i] = i;
    while (!g_failed) {
        for (size_t i = ready.size(); i > 1; i--) { // Fisher-Yates with the seeded stream
            rng = mix(rng + 0x9E3779B97F4A7C15ull);
            std::swap(ready[i - 1], ready[rng % i]);
        }
        for (int i : ready) {
            resume(g_pool[i].get());
            if (g_failed) break;
        }
        if (g_failed) break;
        ready.clear();
        for (int w = 0; w < nw && !g_failed; w++)
            if (warp_complete(w, nt))
                for (int i = w * 32; i < std::min(nt, w * 32 + 32); i++)
                    if (g_pool[i]->state == F_READY) ready.push_back(i);
        if (!ready.empty() || g_failed) continue;
        if (!barrier_complete(nt)) break;
        for (int i = 0; i < nt; i++)
            if (g_pool[i]->state == F_READY) ready.push_back(i);
    }
    g_thread = NULL;
    g_fib = NULL;
}

} // namespace

void block_barrier(const char *file, int line) {
    fiber *f = g_fib;
    f->state = F_BAR, f->file = file, f->line = line, f->kind = 0;
    to_sched();
}

uint64_t warp_op(int kind, unsigned mask, uint64_t v, int src, const char *file, int line) {
    fiber *f = g_fib;
    if (mask != 0xffffffffu)
        thread_fail(cudaErrorLaunchFailure, "%s at %s:%d with mask 0x%08x: the stand-in models full-warp masks only",
                    kind_name(kind), file, line, mask);
    f->state = F_WARP, f->kind = kind, f->mask = mask, f->val = v, f->src = src, f->file = file, f->line = line;
    to_sched();
    return f->res;
}

// ---- shared memory ----

namespace {
struct dyn_buf {
    shared_hdr h;
    std::vector<char> data;
    std::vector<shadow> sh;
    uint64_t serial;
};
dyn_buf g_dyn;
} // namespace

shared_hdr *shared_static(const char *name, size_t n, size_t elem) {
    shared_hdr *h = new shared_hdr();
    h->name = name;
    h->n = n, h->elem = elem;
    h->data = (char *)calloc(n ? n : 1, elem);
    h->sh = (shadow *)calloc(n ? n : 1, sizeof(shadow));
    if (!h->data || !h->sh) abort();
    return h;
}

shared_hdr *shared_dynamic(const char *name, size_t elem) {
    dyn_buf &d = g_dyn;
    if (d.serial != g_launch_serial || d.h.elem != elem) {
        size_t n = g_grid->smem / elem;
        if (d.data.size() < n * elem) d.data.resize(n * elem);
        if (d.sh.size() < n) d.sh.resize(n);
        d.h.name = name, d.h.n = n, d.h.elem = elem, d.h.dynamic = 1;
        d.h.data = d.data.data();
        d.h.sh = d.sh.data();
        d.serial = g_launch_serial;
    }
    return &d.h;
}

void shared_check(shared_hdr *h, long i, bool write) {
    if (i < 0 || (size_t)i >= h->n)
        thread_fail(cudaErrorIllegalAddress, "shared memory out of bounds: %s %s[%ld] of %zu elements (%zu bytes each)",
                    write ? "write to" : "read of", h->name, i, h->n, h->elem);
    shadow &s = h->sh[i];
    const int t = g_thread->lin, w = g_thread->warp;
    const uint32_t wep = g_wep[w];
    auto ordered = [&](int u, uint32_t uwep) { return u == t || ((u >> 5) == w && g_wep[w] > uwep); };
    if (!write) {
        if (s.w_ep < g_block_ep)
            thread_fail(cudaErrorLaunchFailure, "read of shared %s[%ld], which no thread of this block has written",
                        h->name, i);
        if (s.w_ep == g_epoch && !ordered(s.w_tid, s.w_wep))
            thread_fail(cudaErrorLaunchFailure,
                        "race on shared %s[%ld]: read after thread %s (linear %d) wrote it, with no barrier between",
                        h->name, i, tid_str(s.w_tid).c_str(), s.w_tid);
        if (s.r_ep != g_epoch) {
            s.r_ep = g_epoch, s.r_tid = t, s.r_wep = wep, s.r_warp = w;
        } else if (s.r_tid != t) {
            s.r_tid = -2;
            if (s.r_warp != w) s.r_warp = -1;
            if (wep > s.r_wep) s.r_wep = wep;
        }
        return;
    }
    if (s.w_ep == g_epoch && !ordered(s.w_tid, s.w_wep))
        thread_fail(cudaErrorLaunchFailure,
                    "race on shared %s[%ld]: written after thread %s (linear %d) wrote it, with no barrier between",
                    h->name, i, tid_str(s.w_tid).c_str(), s.w_tid);
    if (s.r_ep == g_epoch) {
        bool ok = s.r_tid >= 0 ? ordered(s.r_tid, s.r_wep) : (s.r_warp == w && g_wep[w] > s.r_wep);
        if (!ok) {
            if (s.r_tid >= 0)
                thread_fail(cudaErrorLaunchFailure,
                            "race on shared %s[%ld]: written after thread %s (linear %d) read it, with no barrier between",
                            h->name, i, tid_str(s.r_tid).c_str(), s.r_tid);
            thread_fail(cudaErrorLaunchFailure,
                        "race on shared %s[%ld]: written after other threads read it, with no barrier between", h->name, i);
        }
    }
    s.w_ep = g_epoch, s.w_tid = t, s.w_wep = wep, s.r_ep = 0;
}

// ---- grids ----

void run_grid(const grid_rec &g) {
    const dim3 gd = g.grid, bd = g.block;
    const int nt = (int)(bd.x * bd.y * bd.z);
    if (!pool_reserve((size_t)nt)) {
        report(cudaErrorMemoryAllocation, "cudasim: no memory for the fibers of kernel " + g.name);
        return;
    }
    g_grid = &g;
    g_block.bdim = bd, g_block.gdim = gd;
    g_failed = false;
    g_launch_serial++;
    g_launches++;
    const uint64_t nb = (uint64_t)gd.x * gd.y * gd.z;
    uint64_t rng = mix(seed() * 0x9E3779B97F4A7C15ull + g_launch_serial);
    // blocks in an order shuffled by the seed: an odd multiplier modulo nb visits each once
    uint64_t step = 1, start = 0;
    if (nb > 1) {
        start = rng % nb;
        step = 0;
        for (uint64_t c = (mix(rng) % nb) | 1; step == 0; c += 2) {
            uint64_t a = c % nb, b = nb;
            while (b) { uint64_t t = a % b; a = b; b = t; }
            if (a == 1) step = c % nb;
        }
    }
    for (uint64_t k = 0, id = start; k < nb && !g_failed; k++, id = (id + step) % nb) {
        uint3 bid = u3((unsigned)(id % gd.x), (unsigned)(id / gd.x % gd.y), (unsigned)(id / ((uint64_t)gd.x * gd.y)));
        run_block(bid, mix(rng ^ (id * 0xD1B54A32D192ED03ull)));
    }
    g_grid = NULL;
    if (g_failed) report(g_fail_code, "cudasim: " + g_fail_msg);
}

void launch_raw(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                body_fn body, std::vector<const void *> ptrs) {
    uint64_t nt = (uint64_t)block.x * block.y * block.z;
    const char *bad = NULL;
    if (nt == 0 || nt > 1024 || block.z > 64) bad = "block size";
    else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu)
        bad = "grid size";
    else if (smem > 48 * 1024) bad = "dynamic shared memory above 48 KiB without cudaFuncSetAttribute";
    if (bad) {
        char b[256];
        snprintf(b, sizeof b, "cudasim: launch of %s at %s:%d refused: %s (grid %u,%u,%u block %u,%u,%u smem %zu)", name,
                 file, line, bad, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        co_log(CO_LOG_ERROR, "%s", b);
        set_last(cudaErrorInvalidConfiguration);
        return;
    }
    std::shared_ptr<grid_rec> g(new grid_rec());
    g->name = name;
    g->where = std::string(file) + ":" + std::to_string(line);
    g->grid = grid, g->block = block, g->smem = smem;
    g->body = std::move(body);
    cudaError_t e = enqueue(s, "kernel " + g->name, [g]() { run_grid(*g); }, ptrs);
    if (e != cudaSuccess) set_last(e);
}

} // namespace cudasim

extern "C" unsigned long cudasim_launch_count(void) { return cudasim::g_launches; }
