/* cpu_backend.c - the CPU backend object: threads, oneDNN engine, scratch, op table. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/error.h"
#include "kernels/checksum.h"
#include "kernels/cpu/cpu.h"

static void *cpu_alloc(kb_backend *b, size_t nbytes) {
    (void)b;
    size_t n = (nbytes + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    void *p = aligned_alloc(64, n);
    if (p) memset(p, 0, n);
    return p;
}

static void cpu_free(kb_backend *b, void *p) {
    (void)b;
    free(p);
}

/* operations finish before they return: nothing to wait for */
static void cpu_sync(kb_backend *b) { (void)b; }

static void cpu_copy(kb_backend *b, void *dst, const void *src, size_t nbytes) {
    (void)b;
    if (nbytes && dst != src) memmove(dst, src, nbytes);
}

void *cpu_scratch(cpu_state *st, int slot, size_t nbytes) {
    if (st->scratch_size[slot] >= nbytes && st->scratch[slot]) return st->scratch[slot];
    free(st->scratch[slot]);
    size_t n = (nbytes + 4095) & ~(size_t)4095;
    /* grow geometrically a little so slowly growing requests do not reallocate each time */
    n += n / 8;
    n = (n + 63) & ~(size_t)63;
    st->scratch[slot] = aligned_alloc(64, n);
    st->scratch_size[slot] = st->scratch[slot] ? n : 0;
    return st->scratch[slot];
}

/* copy_rows: row by row (operations finish before they return) */
static void cpu_copy_rows(kb_backend *b, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                          size_t rows) {
    (void)b;
    for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}

/* sumsq_runs and checksum_runs: on the host they are the loops their callers would write */
static void cpu_sumsq_runs(kb_backend *b, const float *const *x, const size_t *n, const int *end, int ngroups,
                           double *out) {
    for (int k = 0, j = 0; k < ngroups; k++) {
        double s = 0;
        for (; j < end[k]; j++) s += cpu_sumsq(b, x[j], n[j]);
        out[k] = s;
    }
}

static uint64_t cpu_checksum_runs(kb_backend *b, const float *const *x, const size_t *n, const uint64_t *seed,
                                  int nruns) {
    (void)b;
    uint64_t h = 0;
    for (int j = 0; j < nruns; j++) h ^= kb_checksum_f32(x[j], n[j], seed[j]);
    return h;
}

static const kb_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_bf16 = cpu_to_bf16,
    .sync = cpu_sync,
    .copy = cpu_copy,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .embed_forward = cpu_embed_forward,
    .embed_backward = cpu_embed_backward,
    .norm_forward = cpu_norm_forward,
    .norm_backward = cpu_norm_backward,
    .rope = cpu_rope,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .block_attention_forward = cpu_block_attention_forward,
    .block_attention_backward = cpu_block_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .add = cpu_add,
    .scale = cpu_scale,
    .dropout = cpu_dropout,
    .cross_entropy = cpu_cross_entropy,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
    .adamw_checksum = cpu_adamw_checksum,
    .sumsq_runs = cpu_sumsq_runs,
    .checksum_runs = cpu_checksum_runs,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .ce_max = cpu_ce_max,
    .ce_sums = cpu_ce_sums,
    .ce_grad = cpu_ce_grad,
    .grouped_linear_forward = cpu_grouped_linear_forward,
    .grouped_linear_backward = cpu_grouped_linear_backward,
    .copy_rows = cpu_copy_rows,
    .ring_merge = cpu_ring_merge,
    .bf16_to_f32 = cpu_bf16_to_f32,
    .gather_rows = cpu_gather_rows,
    .gather_rows_bf16 = cpu_gather_rows_bf16,
    .combine_rows = cpu_combine_rows,
    .combine_backward = cpu_combine_backward,
};

/* Attention through the variant compiled for this CPU's level (kernels/meson.build builds
 * the ones the compiler can; COHORT_ATTN_AVX512 / _AVX2 say which). */
typedef void (*attn_fwd_fn)(kb_backend *, float *, float *, const float *, const int32_t *, int, int, int, int,
                            int, float, uint64_t, uint64_t);
typedef void (*attn_bwd_fn)(kb_backend *, float *, const float *, const float *, const float *, const float *,
                            const int32_t *, int, int, int, int, int, float, uint64_t, uint64_t);

static int attn_choice(void) {
    int level = cpu_isa_level();
#ifdef COHORT_ATTN_AVX512
    if (level >= CPU_ISA_AVX512) return 2;
#endif
#ifdef COHORT_ATTN_AVX2
    if (level >= CPU_ISA_AVX2) return 1;
#endif
    (void)level;
    return 0;
}

const char *cpu_attention_variant(void) {
    static const char *names[3] = {"base", "avx2", "avx512"};
    return names[attn_choice()];
}

void cpu_attention_forward(kb_backend *b, float *out, float *lse, const float *qkv, const int32_t *seg, int B,
                           int T, int nh, int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset) {
    static const attn_fwd_fn fns[3] = {
        cpu_attention_forward_base,
#ifdef COHORT_ATTN_AVX2
        cpu_attention_forward_avx2,
#else
        cpu_attention_forward_base,
#endif
#ifdef COHORT_ATTN_AVX512
        cpu_attention_forward_avx512,
#else
        cpu_attention_forward_base,
#endif
    };
    fns[attn_choice()](b, out, lse, qkv, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
}

void cpu_block_attention_forward(kb_backend *b, const kb_block_attn *a, float *out, float *lse) {
    static void (*const fns[3])(kb_backend *, const kb_block_attn *, float *, float *) = {
        cpu_block_attention_forward_base,
#ifdef COHORT_ATTN_AVX2
        cpu_block_attention_forward_avx2,
#else
        cpu_block_attention_forward_base,
#endif
#ifdef COHORT_ATTN_AVX512
        cpu_block_attention_forward_avx512,
#else
        cpu_block_attention_forward_base,
#endif
    };
    fns[attn_choice()](b, a, out, lse);
}

void cpu_block_attention_backward(kb_backend *b, const kb_block_attn *a, const float *out, const float *lse,
                                  const float *dout, float *dq, size_t dq_stride, float *dk, size_t dk_stride,
                                  float *dv, size_t dv_stride) {
    static void (*const fns[3])(kb_backend *, const kb_block_attn *, const float *, const float *, const float *,
                                float *, size_t, float *, size_t, float *, size_t) = {
        cpu_block_attention_backward_base,
#ifdef COHORT_ATTN_AVX2
        cpu_block_attention_backward_avx2,
#else
        cpu_block_attention_backward_base,
#endif
#ifdef COHORT_ATTN_AVX512
        cpu_block_attention_backward_avx512,
#else
        cpu_block_attention_backward_base,
#endif
    };
    fns[attn_choice()](b, a, out, lse, dout, dq, dq_stride, dk, dk_stride, dv, dv_stride);
}

void cpu_attention_backward(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                            float p_drop, uint64_t seed, uint64_t offset) {
    static const attn_bwd_fn fns[3] = {
        cpu_attention_backward_base,
#ifdef COHORT_ATTN_AVX2
        cpu_attention_backward_avx2,
#else
        cpu_attention_backward_base,
#endif
#ifdef COHORT_ATTN_AVX512
        cpu_attention_backward_avx512,
#else
        cpu_attention_backward_base,
#endif
    };
    fns[attn_choice()](b, dqkv, dout, qkv, out, lse, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
}

int cpu_backend_create(kb_backend **out, const kb_options *opt) {
    *out = NULL;
    char why[400];
    if (opt->bf16 && !opt->bf16_reference && !kb_cpu_bf16_check(why, sizeof why)) return co_err_set(CO_EUNSUPPORTED, "%s", why);
    kb_backend *b = calloc(1, sizeof *b);
    cpu_state *st = calloc(1, sizeof *st);
    if (!b || !st) {
        free(b);
        free(st);
        return co_err_set(CO_ENOMEM, "cpu backend: out of memory");
    }
    b->ops = &cpu_ops;
    b->opt = *opt;
    b->impl = st;
    int threads = opt->threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    st->threads = threads;
    st->bf16_emulated = opt->bf16 && opt->bf16_reference && !kb_cpu_bf16_check(NULL, 0);
    st->fp16 = opt->fp16 && !opt->bf16;
    b->opt.threads = threads;
    omp_set_num_threads(threads);
    if (dnnl_engine_create(&st->engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&st->stream, st->engine, dnnl_stream_default_flags) != dnnl_success) {
        cpu_backend_release(b);
        return co_err_set(CO_EINTERNAL, "cpu backend: cannot create the oneDNN engine");
    }
    const dnnl_version_t *v = dnnl_version();
    snprintf(st->desc, sizeof st->desc, "cpu: oneDNN %d.%d.%d, %d thread%s, %s, %s kernels (attention %s)",
             v->major, v->minor, v->patch, threads, threads == 1 ? "" : "s",
             st->bf16_emulated ? "bf16 (reference: widened to fp32)"
             : opt->bf16      ? "bf16"
             : st->fp16       ? "fp16 (products of fp16 values in fp32)"
                              : "fp32",
             cpu_isa_name(cpu_isa_level()), cpu_attention_variant());
    *out = b;
    return 0;
}

void cpu_backend_release(kb_backend *b) {
    if (!b) return;
    cpu_state *st = b->impl;
    if (st) {
        cpu_mm_release(st);
        if (st->stream) dnnl_stream_destroy(st->stream);
        if (st->engine) dnnl_engine_destroy(st->engine);
        for (int i = 0; i < CPU_NSCRATCH; i++) free(st->scratch[i]);
        free(st->rope_cos);
        free(st->rope_sin);
        free(st);
    }
    free(b);
}

const char *cpu_backend_describe(const kb_backend *b) { return ((const cpu_state *)b->impl)->desc; }
