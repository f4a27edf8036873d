// cudasim_device.h - the CUDA stand-in's execution model as seen by device code compiled with
// the host C++ compiler (tests/cudasim/, docs/testing.md).
//
// tests/cudasim/gen_cu.py rewrites each kernel launch k<<<grid, block, smem, stream>>>(args)
// into cudasim::launch(...) and each __shared__ declaration into a checked handle (sptr,
// sarr2, svar below); this header supplies the rest: threadIdx/blockIdx/blockDim/gridDim,
// __syncthreads, warp shuffles and votes, the integer and bit intrinsics the kernels use.
// Every CUDA thread of a block is a fiber (sim_exec.cc); a barrier or a warp operation
// switches to the scheduler, which runs the block's threads in an order shuffled by
// COHORT_CUDASIM_SEED between barriers. Every shared-memory access goes through
// shared_check(): bounds, reads of words nobody wrote in this block, and races (a word
// another thread wrote or read since the last barrier that orders the two threads).
#ifndef COHORT_TESTS_CUDASIM_DEVICE_H
#define COHORT_TESTS_CUDASIM_DEVICE_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#undef __launch_bounds__
#define __launch_bounds__(...)
#ifndef __restrict__
#define __restrict__ __restrict
#endif

namespace cudasim {

// the CUDA thread now running (sim_exec.cc sets it before switching to its fiber)
struct thread_state {
    uint3 tid;
    int lin, lane, warp;
};
struct block_state {
    uint3 bid;
    dim3 bdim, gdim;
};
extern thread_state *g_thread;
extern block_state g_block;

// ---- barriers and warp operations (sim_exec.cc) ----
enum { W_SHFL = 1, W_BALLOT, W_SYNCWARP };
void block_barrier(const char *file, int line);
// lane-exchange of the calling thread's warp: every live lane arrives, then each gets the
// value of lane src (W_SHFL), the OR of (pred << lane) (W_BALLOT) or nothing (W_SYNCWARP)
uint64_t warp_op(int kind, unsigned mask, uint64_t v, int src, const char *file, int line);

template <class T>
static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffles move values of at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <class T>
static inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

// where a barrier or warp operation is in the source: the macros below make one per call
struct site {
    const char *file;
    int line;
    void syncthreads() const { block_barrier(file, line); }
    void syncwarp(unsigned mask = 0xffffffffu) const { (void)warp_op(W_SYNCWARP, mask, 0, 0, file, line); }
    unsigned ballot(unsigned mask, int pred) const { return (unsigned)warp_op(W_BALLOT, mask, pred != 0, 0, file, line); }
    static int seg_src(int lane, int src, int width) {
        int base = lane & ~(width - 1);
        return src < base || src >= base + width ? lane : src;
    }
    template <class T>
    T shfl_xor(unsigned mask, T v, int lm, int width = 32) const {
        int lane = g_thread->lane;
        return from_bits<T>(warp_op(W_SHFL, mask, to_bits(v), seg_src(lane, lane ^ lm, width), file, line));
    }
    template <class T>
    T shfl(unsigned mask, T v, int src, int width = 32) const {
        int lane = g_thread->lane;
        return from_bits<T>(warp_op(W_SHFL, mask, to_bits(v), (lane & ~(width - 1)) + (src & (width - 1)), file, line));
    }
    template <class T>
    T shfl_down(unsigned mask, T v, unsigned d, int width = 32) const {
        int lane = g_thread->lane;
        return from_bits<T>(warp_op(W_SHFL, mask, to_bits(v), seg_src(lane, lane + (int)d, width), file, line));
    }
    template <class T>
    T shfl_up(unsigned mask, T v, unsigned d, int width = 32) const {
        int lane = g_thread->lane;
        return from_bits<T>(warp_op(W_SHFL, mask, to_bits(v), seg_src(lane, lane - (int)d, width), file, line));
    }
};

// ---- shared memory ----
struct shadow {
    uint64_t w_ep, r_ep;   // barrier epoch of the last write / reads
    int32_t w_tid, r_tid;  // writer; reader (-2: several)
    uint32_t w_wep, r_wep; // the writer's / readers' warp epoch at the access
    int32_t r_warp;        // the readers' warp (-1: several warps)
    int32_t pad;
};
struct shared_hdr {
    const char *name;
    char *data;
    shadow *sh;
    size_t n, elem;
    int dynamic;
};
shared_hdr *shared_static(const char *name, size_t n, size_t elem);
shared_hdr *shared_dynamic(const char *name, size_t elem);
void shared_check(shared_hdr *h, long i, bool write);

template <class T>
struct sref {
    shared_hdr *h;
    long i;
    T *p() const { return (T *)h->data + i; }
    operator T() const {
        shared_check(h, i, false);
        return *p();
    }
    sref &operator=(T v) {
        shared_check(h, i, true);
        *p() = v;
        return *this;
    }
    sref &operator=(const sref &o) { return *this = (T)o; }
    sref &operator+=(T v) { return *this = (T)*this + v; }
    sref &operator-=(T v) { return *this = (T)*this - v; }
    sref &operator*=(T v) { return *this = (T)*this * v; }
};

// a pointer into shared memory (a __shared__ array, or extern __shared__ with an offset)
template <class T>
struct sptr {
    shared_hdr *h;
    long off;
    static sptr make_static(const char *name, size_t n) { return sptr{shared_static(name, n, sizeof(T)), 0}; }
    static sptr make_dynamic(const char *name) { return sptr{shared_dynamic(name, sizeof(T)), 0}; }
    sref<T> operator[](long i) const { return sref<T>{h, off + i}; }
    sref<T> operator*() const { return sref<T>{h, off}; }
    sptr operator+(long k) const { return sptr{h, off + k}; }
    sptr operator-(long k) const { return sptr{h, off - k}; }
};

// a two-dimensional __shared__ array T name[R][C]
template <class T, long C>
struct sarr2 {
    shared_hdr *h;
    static sarr2 make(const char *name, size_t n) { return sarr2{shared_static(name, n, sizeof(T))}; }
    sptr<T> operator[](long i) const { return sptr<T>{h, i * C}; }
};

// a __shared__ scalar
template <class T>
struct svar {
    shared_hdr *h;
    static svar make(const char *name) { return svar{shared_static(name, 1, sizeof(T))}; }
    operator T() const { return (T)sref<T>{h, 0}; }
    svar &operator=(T v) {
        sref<T>{h, 0} = v;
        return *this;
    }
    svar &operator=(const svar &o) { return *this = (T)o; }
    svar &operator+=(T v) { return *this = (T)*this + v; }
};

// ---- launches ----
typedef std::function<void()> body_fn;
// Checks the configuration (a failure is cudaGetLastError's) and queues the grid on stream s.
void launch_raw(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                body_fn body, std::vector<const void *> ptrs);

template <class T>
static inline void add_ptr(std::vector<const void *> &v, const T &x) {
    if constexpr (std::is_pointer<T>::value) v.push_back((const void *)x);
}

template <class... P, class... A>
static inline void launch(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem,
                          cudaStream_t s, void (*k)(P...), A &&...a) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    auto args = std::make_shared<std::tuple<typename std::decay<P>::type...>>(std::forward<A>(a)...);
    std::vector<const void *> ptrs;
    std::apply([&](const auto &...x) { (add_ptr(ptrs, x), ...); }, *args);
    launch_raw(name, file, line, grid, block, smem, s, [k, args]() { std::apply(k, *args); }, std::move(ptrs));
}

} // namespace cudasim

#define threadIdx (::cudasim::g_thread->tid)
#define blockIdx (::cudasim::g_block.bid)
#define blockDim (::cudasim::g_block.bdim)
#define gridDim (::cudasim::g_block.gdim)
static constexpr int warpSize = 32;
#define __syncthreads ::cudasim::site{__FILE__, __LINE__}.syncthreads
#define __syncwarp ::cudasim::site{__FILE__, __LINE__}.syncwarp
#define __ballot_sync ::cudasim::site{__FILE__, __LINE__}.ballot
#define __shfl_xor_sync ::cudasim::site{__FILE__, __LINE__}.shfl_xor
#define __shfl_sync ::cudasim::site{__FILE__, __LINE__}.shfl
#define __shfl_down_sync ::cudasim::site{__FILE__, __LINE__}.shfl_down
#define __shfl_up_sync ::cudasim::site{__FILE__, __LINE__}.shfl_up

// ---- device intrinsics on the host ----
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline unsigned __float_as_uint(float f) { return ::cudasim::from_bits<unsigned>(::cudasim::to_bits(f)); }
static inline float __uint_as_float(unsigned u) { return ::cudasim::from_bits<float>(u); }
static inline float __int_as_float(int i) { return ::cudasim::from_bits<float>((uint32_t)i); }
static inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
static inline float __uint2float_rn(unsigned u) { return (float)u; }
static inline float __int2float_rn(int i) { return (float)i; }
// (__expf and __logf: glibc has them)
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
template <class T>
static inline T __ldg(const T *p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

#endif
