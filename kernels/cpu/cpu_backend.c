/* cpu_backend.c - the CPU backend object: threads, oneDNN engine, scratch, op table. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/error.h"
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
};

int cpu_backend_create(kb_backend **out, const kb_options *opt) {
    *out = NULL;
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
    b->opt.threads = threads;
    omp_set_num_threads(threads);
    if (dnnl_engine_create(&st->engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&st->stream, st->engine, dnnl_stream_default_flags) != dnnl_success) {
        cpu_backend_release(b);
        return co_err_set(CO_EINTERNAL, "cpu backend: cannot create the oneDNN engine");
    }
    const dnnl_version_t *v = dnnl_version();
    snprintf(st->desc, sizeof st->desc, "cpu: oneDNN %d.%d.%d, %d thread%s, %s", v->major,
             v->minor, v->patch, threads, threads == 1 ? "" : "s", opt->bf16 ? "bf16" : "fp32");
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
