/* cpu.h - private interface of the CPU backend (kernels/cpu/).
 *
 * The CPU backend keeps one cpu_state behind kb_backend.impl: the thread count, the oneDNN
 * engine/stream and a cache of matmul primitives, and scratch buffers grown on demand.
 * A backend object is used by one thread at a time (the caller's); the kernels
 * parallelise internally with OpenMP using exactly st->threads threads and static
 * partitions, so results are bitwise repeatable at a fixed thread count. */
#ifndef COHORT_KERNELS_CPU_CPU_H
#define COHORT_KERNELS_CPU_CPU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/backend.h"

#define CPU_MM_CACHE 64
#define CPU_NSCRATCH 5

/* scratch slots */
enum { CPU_SCR_A16 = 0, CPU_SCR_B16 = 1, CPU_SCR_W16 = 2, CPU_SCR_ATTN = 3, CPU_SCR_MISC = 4 };

typedef struct cpu_mm {
    /* key */
    int64_t M, N, K;
    int ta, tb, bias, acc;
    /* value */
    dnnl_primitive_t prim;
    dnnl_memory_t mem_a, mem_b, mem_bias, mem_c;
    int manual_bias; /* primitive built without bias: add it afterwards */
    int emulated;    /* no primitive: bf16 inputs widened to fp32, fp32 product (bf16_reference) */
} cpu_mm;

typedef struct cpu_state {
    int threads;
    bool bf16_emulated; /* kb_options.bf16_reference on a CPU without bf16 instructions */
    bool fp16;          /* kb_options.fp16: products of fp16 values, widened to fp32 (emulated) */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    cpu_mm mm[CPU_MM_CACHE];
    int n_mm, next_evict;
    void *scratch[CPU_NSCRATCH];
    size_t scratch_size[CPU_NSCRATCH];
    /* rope cos/sin table: [npos][hd/2] each */
    float *rope_cos, *rope_sin;
    int rope_npos, rope_hd;
    float rope_base;
    char desc[128];
} cpu_state;

/* instruction-set levels (isa.c), ordered: a level includes the ones below it */
enum { CPU_ISA_BASE = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2, CPU_ISA_AVX512_BF16 = 3, CPU_ISA_AMX = 4 };
/* The level the backend's kernels use: min(CPU, oneDNN's effective ISA, what was compiled). */
int cpu_isa_level(void);
const char *cpu_isa_name(int level);
/* /proc/cpuinfo's "model name" (or "unknown CPU"). */
void cpu_model_name(char *out, size_t n);

static inline cpu_state *cpu_st(kb_backend *b) { return (cpu_state *)b->impl; }

/* Returns a buffer of at least nbytes (64-byte aligned), contents undefined; NULL on OOM. */
void *cpu_scratch(cpu_state *st, int slot, size_t nbytes);

/* backend construction (cpu_backend.c) */
int cpu_backend_create(kb_backend **out, const kb_options *opt);
void cpu_backend_release(kb_backend *b);
const char *cpu_backend_describe(const kb_backend *b);

/* operations, one group per file */
void cpu_linear_forward(kb_backend *b, float *out, const float *in, const float *W,
                        const kb_bf16 *W16, const float *bias, int N, int IC, int OC);
void cpu_linear_backward(kb_backend *b, float *din, float *dW, float *dbias,
                         const float *dout, const float *in, const float *W,
                         const kb_bf16 *W16, int N, int IC, int OC);
void cpu_mm_release(cpu_state *st);
void cpu_grouped_linear_forward(kb_backend *b, float *out, const float *in, const float *W, const int32_t *off,
                                int n, int IC, int OC);
void cpu_grouped_linear_backward(kb_backend *b, float *din, float *dW, const float *dout, const float *in,
                                 const float *W, const int32_t *off, int n, int IC, int OC);

/* attention (attention.c, compiled once per instruction set as _avx512, _avx2 and _base;
 * the unsuffixed entry points in cpu_backend.c choose by cpu_isa_level()) */
#define CPU_ATTN_DECL(sfx)                                                                      \
    void cpu_attention_forward##sfx(kb_backend *b, float *out, float *lse, const float *qkv,   \
                                    const int32_t *seg, int B, int T, int nh, int nkv, int hd, \
                                    float p_drop, uint64_t seed, uint64_t offset);             \
    void cpu_attention_backward##sfx(kb_backend *b, float *dqkv, const float *dout,             \
                                     const float *qkv, const float *out, const float *lse,     \
                                     const int32_t *seg, int B, int T, int nh, int nkv, int hd, \
                                     float p_drop, uint64_t seed, uint64_t offset);
CPU_ATTN_DECL()
CPU_ATTN_DECL(_avx512)
CPU_ATTN_DECL(_avx2)
CPU_ATTN_DECL(_base)
/* which variant the dispatchers call: "avx512", "avx2" or "base" */
const char *cpu_attention_variant(void);
/* block attention (block_attention.c, compiled per instruction set like attention.c; the
 * unsuffixed entry points in cpu_backend.c choose by cpu_isa_level()) */
#define CPU_BLOCK_ATTN_DECL(sfx)                                                                              \
    void cpu_block_attention_forward##sfx(kb_backend *b, const kb_block_attn *a, float *out, float *lse);     \
    void cpu_block_attention_backward##sfx(kb_backend *b, const kb_block_attn *a, const float *out,           \
                                           const float *lse, const float *dout, float *dq, size_t dq_stride, \
                                           float *dk, size_t dk_stride, float *dv, size_t dv_stride);
CPU_BLOCK_ATTN_DECL()
CPU_BLOCK_ATTN_DECL(_avx512)
CPU_BLOCK_ATTN_DECL(_avx2)
CPU_BLOCK_ATTN_DECL(_base)

/* ring attention's bookkeeping (ring_ops.c) */
void cpu_ring_merge(kb_backend *b, float *out, float *lse, const float *po, const float *pl, int B, int nh, int hd,
                    int L, int q0, int nq);
void cpu_bf16_to_f32(kb_backend *b, float *dst, const kb_bf16 *src, size_t n);

void cpu_zero(kb_backend *b, float *x, size_t n);
void cpu_to_bf16(kb_backend *b, kb_bf16 *dst16, const float *src, size_t n);
void cpu_embed_forward(kb_backend *b, float *out, const int32_t *tok, const int32_t *pos,
                       const float *wte, const float *wpe, int N, int C);
void cpu_embed_backward(kb_backend *b, float *dwte, float *dwpe, const float *dout,
                        const int32_t *tok, const int32_t *pos, int N, int C, int V);
void cpu_norm_forward(kb_backend *b, bool rms, float *out, float *mean, float *rstd,
                      const float *in, const float *w, const float *bias, int N, int C,
                      float eps);
void cpu_norm_backward(kb_backend *b, bool rms, float *din, float *dw, float *dbias,
                       const float *dout, const float *in, const float *w,
                       const float *mean, const float *rstd, int N, int C);
void cpu_rope(kb_backend *b, float *qkv, const int32_t *pos, int N, int nh, int nkv, int hd,
              float base, bool inverse);
void cpu_gelu_forward(kb_backend *b, float *out, const float *in, size_t n);
void cpu_gelu_backward(kb_backend *b, float *din, const float *dout, const float *in,
                       size_t n);
void cpu_swiglu_forward(kb_backend *b, float *out, const float *in, int N, int F);
void cpu_swiglu_backward(kb_backend *b, float *din, const float *dout, const float *in,
                         int N, int F);
/* the MoE layer's token permutations (moe_perm.c) */
void cpu_gather_rows(kb_backend *b, float *out, const float *in, const int32_t *idx, int M, int C);
void cpu_gather_rows_bf16(kb_backend *b, float *out, const kb_bf16 *in, const int32_t *idx, int M, int C);
void cpu_combine_rows(kb_backend *b, float *y, const float *src, const int32_t *off, const int32_t *row,
                      const float *w, int N, int C, bool acc);
void cpu_combine_backward(kb_backend *b, float *dout, double *dw, const float *dy, const float *out,
                          const int32_t *idx, const float *w, int M, int C);
void cpu_add(kb_backend *b, float *out, const float *x, const float *y, size_t n);
void cpu_scale(kb_backend *b, float *x, float s, size_t n);
void cpu_dropout(kb_backend *b, float *out, const float *in, size_t n, float p, uint64_t seed,
                 uint64_t offset);
void cpu_cross_entropy(kb_backend *b, float *losses, float *logits, const int32_t *targets,
                       const float *dscale, int N, int Vp);
void cpu_ce_max(kb_backend *b, float *mx, const float *logits, int N, int V);
void cpu_ce_sums(kb_backend *b, float *sums, const float *logits, const float *mx, const int32_t *targets, int v0,
                 int N, int V);
void cpu_ce_grad(kb_backend *b, float *losses, float *logits, const float *mx, const float *sums,
                 const int32_t *targets, const float *dscale, int v0, int Vt, int N, int V);
void cpu_bias_add(kb_backend *b, float *out, const float *bias, int N, int C);
void cpu_bias_grad(kb_backend *b, float *dbias, const float *dout, int N, int C);
double cpu_sumsq(kb_backend *b, const float *x, size_t n);
void cpu_adamw(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float wd, float gscale, int64_t t);
void cpu_adamw_checksum(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, float gscale, int64_t t, uint64_t seed,
                        uint64_t *sum);

/* ---- small inline helpers ---- */

/* bf16 round-to-nearest-even; NaN stays NaN (quiet bit set). */
static inline kb_bf16 cpu_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (kb_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (kb_bf16)(u >> 16);
}
/* fp16 (IEEE half) round-to-nearest-even, as CUDA's __float2half_rn: beyond 65504 (from
 * 65520 on, the tie rounding up) Inf, below 2^-14 subnormal; NaN stays NaN (quiet). */
static inline uint16_t cpu_f2h(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal: the exponent rebiased, 13 bits rounded off */
        uint32_t v = a - 0x38000000u;
        return (uint16_t)(sign | ((v + 0xfffu + ((v >> 13) & 1u)) >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) return (uint16_t)sign; /* below 2^-25: zero */
    /* subnormal: the value in units of 2^-24, rounded to nearest even */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}
static inline float cpu_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) u = sign | 0x7f800000u | (m << 13);
    else if (e) u = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) u = sign;
    else {
        uint32_t k = 0;
        while (!(m & 0x400u)) m <<= 1, k++;
        u = sign | ((113 - k) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float cpu_bf2f(kb_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* exp(x) for float, branch-free so loops calling it vectorise; relative error ~2 ulp over
 * the normal range; x < -87 (including -inf) gives 0, x > 88.5 saturates to a large finite
 * value. Deterministic (pure arithmetic). */
static inline float cpu_expf(float x0) {
    float x = x0 < -87.0f ? -87.0f : x0;
    x = x > 88.5f ? 88.5f : x;
    /* round to nearest by the 1.5*2^23 trick (vectorises, no libm call) */
    /* a NaN input takes exponent 0 here (converting NaN to an integer is undefined) and
     * comes out NaN through r and p */
    float xn = x == x ? x : 0.0f;
    float n = (xn * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    /* exp(r) on |r| <= ln2/2: degree-6 Taylor/minimax (Cephes coefficients) */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t e = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, 4);
    return x0 < -87.0f ? 0.0f : p * s;
}

#endif
