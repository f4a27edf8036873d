// cu_common.cuh - private interface of the CUDA backend (kernels/cuda/*.cu): its state,
// error helpers and device versions of the CPU backend's numeric helpers.
//
// One cu_state sits behind kb_backend.impl: the GPU index, one non-blocking stream on which
// every operation is queued in call order, a cuBLASLt handle with its workspace and a cache
// of chosen algorithms (one per shape and operand and bias alignment, so a shape always runs
// the same algorithm: results are bitwise repeatable), a cuBLAS handle on the same stream and workspace for the grouped
// products (made on first use, cuda_grouped.cu), and stream-ordered scratch buffers grown on
// demand.
// Every reduction has a fixed partition and a fixed combining order; nothing uses atomics,
// so the same inputs give the same bits on the same GPU model.
#ifndef COHORT_KERNELS_CUDA_CU_COMMON_CUH
#define COHORT_KERNELS_CUDA_CU_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

// CUDA 12.x and 13.x (meson.build refuses older toolkits before compiling this). Calls whose
// signature differs between the two go through the helpers below.
#if !defined(CUDART_VERSION) || CUDART_VERSION < 12000
#error "the CUDA backend needs CUDA 12.0 or newer"
#endif

extern "C" {
#include "common/error.h"
#include "kernels/backend.h"
}

#define CU_MM_CACHE 128

// scratch slots
enum { CU_SCR_A16 = 0, CU_SCR_B16, CU_SCR_W16, CU_SCR_ATT, CU_SCR_MISC, CU_SCR_RED, CU_SCR_GRP, CU_SCR_SUM, CU_SCR_EPI, CU_NSCRATCH };

typedef struct cu_mm {
    // key
    int m, n, k, ta, tb, bf16, epi_bias, beta1, align, bias_align; // bf16: the inputs' type (CU_MM_*)
    int out16; // C and D bf16 (the fused GELU product's bf16 output)
    // value
    int ok;  // 1: algo valid; 0: build failed (the caller falls back)
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} cu_mm;

typedef struct cu_state {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_size;
    cu_mm mm[CU_MM_CACHE];
    int n_mm, next_evict;
    void *scratch[CU_NSCRATCH];
    size_t scratch_size[CU_NSCRATCH];
    double *host_result;  // pinned, for sumsq, sumsq_runs and checksum_runs
    // adamw_checksum's digests waiting on the device for the next sync (cuda_checksum.cu):
    // dig_dev[i] goes to *dig_ptr[i] through the pinned dig_host
    uint64_t *dig_dev, *dig_host, **dig_ptr;
    int dig_pending, dig_cap;
    cublasHandle_t blas;  // grouped products (cuda_grouped.cu): NULL until first used
    int grouped_mode;     // 0: cublasGemmGroupedBatchedEx; -1: one cublasSgemm per group
    char desc[256];
    void *prof;           // the operation timings (cuda_profile.cu), NULL unless COHORT_CUDA_PROFILE=1
    cudaStream_t side;    // the side stream and its two events (cuda_ring.cu): NULL until first used
    cudaEvent_t ev_fork, ev_join;
} cu_state;
// operation timings (cuda_profile.cu)
void cu_profile_setup(kb_backend *b);
void cu_profile_release(cu_state *st);

static inline cu_state *cu_st(kb_backend *b) { return (cu_state *)b->impl; }

// Asks the driver to move managed memory to GPU dev, in order on stream s (a hint).
// CUDA 13 takes a cudaMemLocation and flags; CUDA 12 the device number.
static inline cudaError_t cu_prefetch_to_device(const void *p, size_t n, int dev, cudaStream_t s) {
#if CUDART_VERSION >= 13000
    cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = cudaMemLocationTypeDevice;
    loc.id = dev;
    return cudaMemPrefetchAsync(p, n, loc, 0, s);
#else
    return cudaMemPrefetchAsync(p, n, dev, s);
#endif
}

// Records a CUDA failure in the sticky status (the first one wins) and returns it.
int cu_fail(kb_backend *b, int code, const char *op, const char *what);
// Checks a CUDA runtime result; on error records it and returns nonzero.
int cu_check(kb_backend *b, cudaError_t e, const char *op);
// After a kernel launch: checks the launch error.
static inline int cu_launched(kb_backend *b, const char *op) { return cu_check(b, cudaGetLastError(), op); }
// Stream-ordered scratch of at least nbytes (256-byte aligned), contents undefined; NULL on failure
// (status set).
void *cu_scratch(kb_backend *b, int slot, size_t nbytes, const char *op);
// Entry of every operation: false when the backend already failed (the op is skipped).
static inline bool cu_enter(kb_backend *b) {
    if (b->status) return false;
    return cudaSetDevice(cu_st(b)->device) == cudaSuccess || (cu_fail(b, CO_EINTERNAL, "cudaSetDevice", "failed"), false);
}

// grid size for n elements, threads per block t, capped
static inline unsigned cu_blocks(size_t n, unsigned t, size_t cap = 65535u * 16u) {
    size_t g = (n + t - 1) / t;
    if (g > cap) g = cap;
    if (g < 1) g = 1;
    return (unsigned)g;
}

// ---- device helpers shared by the kernels (bitwise the CPU backend's formulas) ----

__device__ __forceinline__ uint32_t cu_rand32(uint64_t seed, uint64_t counter) {
    uint64_t z = seed ^ (counter * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint32_t)(z >> 32);
}
__device__ __forceinline__ bool cu_keep(uint64_t seed, uint64_t counter, float p) {
    return __uint2float_rn(cu_rand32(seed, counter)) * (1.0f / 4294967296.0f) >= p;
}

// bf16 round-to-nearest-even; NaN stays NaN (quiet bit set) -- cpu_f2bf
__device__ __forceinline__ uint16_t cu_f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// a kernel's output element: fp32 as it is, or (bf16 activations) rounded once to bf16
__device__ __forceinline__ void cu_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void cu_put(uint16_t *p, float v) { *p = cu_f2bf(v); }
__device__ __forceinline__ float cu_get(const float *p) { return *p; }
__device__ __forceinline__ float cu_get(const uint16_t *p) { return __uint_as_float((uint32_t)*p << 16); }

// fp16 round-to-nearest-even (as __float2half_rn: from 65520 on Inf), NaN stays NaN -- cpu_f2h,
// spelled in integer operations so that the stand-in's CPU build gives the same bits
__device__ __forceinline__ uint16_t cu_f2h(float f) {
    uint32_t u = __float_as_uint(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        uint32_t v = a - 0x38000000u;
        return (uint16_t)(sign | ((v + 0xfffu + ((v >> 13) & 1u)) >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) return (uint16_t)sign;
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

// cpu_expf: x < -87 (and -inf) gives 0, x > 88.5 saturates
__device__ __forceinline__ float cu_expf(float x0) {
    float x = x0 < -87.0f ? -87.0f : x0;
    x = x > 88.5f ? 88.5f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s = __int_as_float(e);
    return x0 < -87.0f ? 0.0f : p * s;
}

// Fixed-order block reduction (sum) over blockDim.x threads (a multiple of 32, <= 1024).
// red: shared scratch of 32 entries (a V *; a template parameter so that the CUDA stand-in,
// tests/cudasim/, can pass its checked shared-memory handle). All threads get the result.
template <typename V, typename R>
__device__ __forceinline__ V cu_block_sum(V v, R red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();  // red may still be read by a previous call
    if (l == 0) red[w] = v;
    __syncthreads();
    V s = l < nw ? red[l] : V(0);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}
template <typename R>
__device__ __forceinline__ float cu_block_max(float v, R red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    float s = l < nw ? red[l] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}

// One element of AdamW (k_adamw, k_adamw_checksum: the same bits)
__device__ __forceinline__ void cu_adamw_elem(float *__restrict__ p, const float *__restrict__ g,
                                              float *__restrict__ m, float *__restrict__ v, size_t i, float lr,
                                              float beta1, float beta2, float c1, float c2, float ib1, float ib2,
                                              float eps, float wd, float gscale) {
    float gi = g[i] * gscale;
    float mi = beta1 * m[i] + c1 * gi;
    float vi = beta2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mh = mi * ib1, vh = vi * ib2;
    p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
}

// ---- operations (one group per file) ----
// the matrix products' input type: fp32, bf16 (--bf16), fp16 (--fp16)
enum { CU_MM_F32 = 0, CU_MM_BF16 = 1, CU_MM_F16 = 2 };
static inline int cu_mm_type(const kb_backend *b) {
    return b->opt.bf16 ? CU_MM_BF16 : b->opt.fp16 ? CU_MM_F16 : CU_MM_F32;
}
void cu_to_bf16_raw(kb_backend *b, uint16_t *dst, const float *src, size_t n);  // no cu_enter; fp16 in fp16 mode

void cu_linear_forward(kb_backend *b, float *out, const float *in, const float *W, const kb_bf16 *W16,
                       const float *bias, int N, int IC, int OC);
void cu_linear_backward(kb_backend *b, float *din, float *dW, float *dbias, const float *dout, const float *in,
                        const float *W, const kb_bf16 *W16, int N, int IC, int OC);
void cu_mm_release(cu_state *st);
// the fused products (backend.h: linear_gelu_forward, linear_backward_dgelu; cuBLASLt epilogues)
void cu_linear_gelu_forward(kb_backend *b, float *out, float *pre, const float *in, const float *W,
                            const kb_bf16 *W16, const float *bias, int N, int IC, int OC);
void cu_linear_backward_dgelu(kb_backend *b, float *din, float *dbias, const float *dout, const float *W,
                              const kb_bf16 *W16, const float *pre, int N, int IC, int OC);
// grouped products (backend.h: grouped_linear_forward/backward; cuda_grouped.cu)
void cu_grouped_linear_forward(kb_backend *b, float *out, const float *in, const float *W, const int32_t *off, int n,
                               int IC, int OC);
void cu_grouped_linear_backward(kb_backend *b, float *din, float *dW, const float *dout, const float *in,
                                const float *W, const int32_t *off, int n, int IC, int OC);
void cu_blas_release(cu_state *st);
// the MoE layer's token permutations (backend.h: gather_rows ... combine_backward; cuda_moe.cu)
void cu_gather_rows(kb_backend *b, float *out, const float *in, const int32_t *idx, int M, int C);
void cu_gather_rows_bf16(kb_backend *b, float *out, const kb_bf16 *in, const int32_t *idx, int M, int C);
void cu_combine_rows(kb_backend *b, float *y, const float *src, const int32_t *off, const int32_t *row,
                     const float *w, int N, int C, bool acc);
void cu_combine_backward(kb_backend *b, float *dout, double *dw, const float *dy, const float *out,
                         const int32_t *idx, const float *w, int M, int C);
// dst[c] += sum over rows of (mode 0) dy[n,c]; (mode 1) dy[n,c] * (x[n,c]-mean[n])*rstd[n]
void cu_col_sums(kb_backend *b, float *dst, const float *dy, const float *x, const float *mean,
                 const float *rstd, int N, int C, int mode);

void cu_attention_forward(kb_backend *b, float *out, float *lse, const float *qkv, const int32_t *seg, int B,
                          int T, int nh, int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset);
void cu_attention_backward(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                           float p_drop, uint64_t seed, uint64_t offset);
// the attention backward's D = rowsum(O * dO) in its scratch, with room for dK and dV unless
// direct (cuda_attention.cu; the fp32 and the tensor-core backward share it)
// (out16: O in bf16, out NULL then)
float *cu_attention_dsum(kb_backend *b, const float *out, const uint16_t *out16, const float *dout, int B, int T,
                         int nh, int hd, bool direct);
// attention on tensor cores (cuda_flash.cu): bf16 mode, head dimension 64 or 128
bool cu_flash_usable(const kb_backend *b, int B, int nh, int hd);
// (OT float, or uint16_t: the output in bf16; out16 likewise the backward's O in bf16)
template <typename OT>
void cu_flash_forward(kb_backend *b, OT *out, float *lse, const float *qkv, const int32_t *seg, int B, int T,
                      int nh, int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset);
void cu_flash_backward(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const float *out,
                       const uint16_t *out16, const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd, float p_drop,
                       uint64_t seed, uint64_t offset);
// block attention (backend.h; context parallelism's ring attention, cuda_cp.cu)
void cu_block_attention_forward(kb_backend *b, const kb_block_attn *a, float *out, float *lse);
void cu_block_attention_backward(kb_backend *b, const kb_block_attn *a, const float *out, const float *lse,
                                 const float *dout, float *dq, size_t dq_stride, float *dk, size_t dk_stride,
                                 float *dv, size_t dv_stride);
// ring attention's bookkeeping (backend.h: ring_merge, bf16_to_f32; cuda_ring.cu)
void cu_ring_merge(kb_backend *b, float *out, float *lse, const float *po, const float *pl, int B, int nh, int hd,
                   int L, int q0, int nq);
void cu_bf16_to_f32(kb_backend *b, float *dst, const kb_bf16 *src, size_t n);
void *cu_side_stream(kb_backend *b);
void cu_side_fork(kb_backend *b);
void cu_side_join(kb_backend *b);
void cu_side_release(cu_state *st);

void cu_zero(kb_backend *b, float *x, size_t n);
void cu_to_bf16(kb_backend *b, kb_bf16 *dst16, const float *src, size_t n);
void cu_embed_forward(kb_backend *b, float *out, const int32_t *tok, const int32_t *pos, const float *wte,
                      const float *wpe, int N, int C);
void cu_embed_backward(kb_backend *b, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                       const int32_t *pos, int N, int C, int V);
void cu_norm_forward(kb_backend *b, bool rms, float *out, float *mean, float *rstd, const float *in,
                     const float *w, const float *bias, int N, int C, float eps);
void cu_norm_backward(kb_backend *b, bool rms, float *din, float *dw, float *dbias, const float *dout,
                      const float *in, const float *w, const float *mean, const float *rstd, int N, int C);
void cu_rope(kb_backend *b, float *qkv, const int32_t *pos, int N, int nh, int nkv, int hd, float base,
             bool inverse);
void cu_gelu_forward(kb_backend *b, float *out, const float *in, size_t n);
// bf16 activations (backend.h: *_bf16; bf16 mode): outputs rounded once to bf16 by the kernel
// that makes them, bf16 activation operands read as they are
void cu_norm_forward_bf16(kb_backend *b, bool rms, kb_bf16 *out, float *mean, float *rstd, const float *in,
                          const float *w, const float *bias, int N, int C, float eps);
void cu_gelu_forward_bf16(kb_backend *b, kb_bf16 *out, const float *in, size_t n);
void cu_swiglu_forward_bf16(kb_backend *b, kb_bf16 *out, const float *in, int N, int F);
void cu_linear_forward_bf16(kb_backend *b, float *out, const kb_bf16 *in, const float *W, const kb_bf16 *W16,
                            const float *bias, int N, int IC, int OC);
void cu_linear_backward_bf16(kb_backend *b, float *din, float *dW, float *dbias, const float *dout,
                             const kb_bf16 *in, const float *W, const kb_bf16 *W16, int N, int IC, int OC);
void cu_linear_gelu_forward_bf16(kb_backend *b, kb_bf16 *out, float *pre, const kb_bf16 *in, const float *W,
                                 const kb_bf16 *W16, const float *bias, int N, int IC, int OC);
void cu_attention_forward_bf16(kb_backend *b, kb_bf16 *out, float *lse, const float *qkv, const int32_t *seg, int B,
                               int T, int nh, int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset);
void cu_attention_backward_bf16(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const kb_bf16 *out,
                                const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                                float p_drop, uint64_t seed, uint64_t offset);
void cu_gelu_backward(kb_backend *b, float *din, const float *dout, const float *in, size_t n);
void cu_swiglu_forward(kb_backend *b, float *out, const float *in, int N, int F);
void cu_swiglu_backward(kb_backend *b, float *din, const float *dout, const float *in, int N, int F);
void cu_add(kb_backend *b, float *out, const float *x, const float *y, size_t n);
void cu_copy_rows(kb_backend *b, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                  size_t rows);
void cu_scale(kb_backend *b, float *x, float s, size_t n);
void cu_dropout(kb_backend *b, float *out, const float *in, size_t n, float p, uint64_t seed, uint64_t offset);
void cu_cross_entropy(kb_backend *b, float *losses, float *logits, const int32_t *targets, const float *dscale,
                      int N, int Vp);
double cu_sumsq(kb_backend *b, const float *x, size_t n);
void cu_adamw(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
              float beta2, float eps, float wd, float gscale, int64_t t);
void cu_sumsq_runs(kb_backend *b, const float *const *x, const size_t *n, const int *end, int ngroups, double *out);
// the weights' checksum (cuda_checksum.cu)
uint64_t cu_checksum_runs(kb_backend *b, const float *const *x, const size_t *n, const uint64_t *seed, int nruns);
void cu_adamw_checksum(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                       float beta2, float eps, float wd, float gscale, int64_t t, uint64_t seed, uint64_t *sum);
// the backend's sync around its wait: queue the copy of the pending digests, then (after the
// wait) write them where adamw_checksum was told
void cu_digests_copy(kb_backend *b);
void cu_digests_deliver(kb_backend *b);
void cu_digests_release(cu_state *st);
// tensor parallelism (backend.h: bias_add ... ce_grad)
void cu_bias_add(kb_backend *b, float *out, const float *bias, int N, int C);
void cu_bias_grad(kb_backend *b, float *dbias, const float *dout, int N, int C);
void cu_ce_max(kb_backend *b, float *mx, const float *logits, int N, int V);
void cu_ce_sums(kb_backend *b, float *sums, const float *logits, const float *mx, const int32_t *targets, int v0,
                int N, int V);
void cu_ce_grad(kb_backend *b, float *losses, float *logits, const float *mx, const float *sums,
                const int32_t *targets, const float *dscale, int v0, int Vt, int N, int V);

#endif
