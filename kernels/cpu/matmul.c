/* matmul.c - linear layers: fp32 through dnnl_sgemm, bf16 through cached oneDNN matmul
 * primitives (AMX / AVX512-BF16 where the CPU has them), fp32 accumulation and output; fp16
 * as bf16's reference path: inputs rounded to fp16, widened back exactly, one fp32 sgemm
 * (the products of the fp16 values accumulated in fp32, as cuBLASLt's fp16 with fp32
 * compute), on every CPU. */
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

static void sync_threads(cpu_state *st) {
    /* oneDNN sizes its parallel regions from this thread's OpenMP setting */
    if (omp_get_max_threads() != st->threads) omp_set_num_threads(st->threads);
}

static void mm_clear(cpu_mm *m) {
    if (m->prim) dnnl_primitive_destroy(m->prim);
    if (m->mem_a) dnnl_memory_destroy(m->mem_a);
    if (m->mem_b) dnnl_memory_destroy(m->mem_b);
    if (m->mem_bias) dnnl_memory_destroy(m->mem_bias);
    if (m->mem_c) dnnl_memory_destroy(m->mem_c);
    memset(m, 0, sizeof *m);
}

void cpu_mm_release(cpu_state *st) {
    for (int i = 0; i < st->n_mm; i++) mm_clear(&st->mm[i]);
    st->n_mm = 0;
}

/* Builds C[M,N] (+)= A[M,K] B[K,N] (+ bias[N]) with A, B bf16 and C, bias fp32.
 * ta: A is stored as [K,M]; tb: B is stored as [N,K]. Returns 0 or -1. */
static int mm_build(cpu_state *st, cpu_mm *m) {
    dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
    dnnl_dims_t a_dims = {m->M, m->K}, b_dims = {m->K, m->N}, c_dims = {m->M, m->N};
    dnnl_dims_t a_str = {m->ta ? 1 : m->K, m->ta ? m->M : 1};
    dnnl_dims_t b_str = {m->tb ? 1 : m->N, m->tb ? m->K : 1};
    dnnl_dims_t c_str = {m->N, 1};
    dnnl_dims_t bias_dims = {1, m->N}, bias_str = {m->N, 1};
    if (dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_str) ||
        dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_str) ||
        dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str) ||
        dnnl_memory_desc_init_by_strides(&bias_md, 2, bias_dims, dnnl_f32, bias_str))
        return -1;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if (dnnl_primitive_attr_create(&attr)) return -1;
    if (m->acc) {
        if (dnnl_post_ops_create(&po) || dnnl_post_ops_append_sum(po, 1.0f) ||
            dnnl_primitive_attr_set_post_ops(attr, po)) {
            if (po) dnnl_post_ops_destroy(po);
            dnnl_primitive_attr_destroy(attr);
            return -1;
        }
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd = NULL;
    for (int with_bias = m->bias; with_bias >= 0; with_bias--) {
        dnnl_matmul_desc_t d;
        if (dnnl_matmul_desc_init(&d, &a_md, &b_md, with_bias ? &bias_md : NULL, &c_md))
            continue;
        if (dnnl_primitive_desc_create(&pd, &d, attr, st->engine, NULL) == dnnl_success) {
            m->manual_bias = m->bias && !with_bias;
            break;
        }
        pd = NULL;
        if (!m->bias) break;
    }
    dnnl_primitive_attr_destroy(attr);
    if (!pd) return -1;
    int rc = dnnl_primitive_create(&m->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return -1;
    if (dnnl_memory_create(&m->mem_a, &a_md, st->engine, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&m->mem_b, &b_md, st->engine, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&m->mem_c, &c_md, st->engine, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&m->mem_bias, &bias_md, st->engine, DNNL_MEMORY_NONE))
        return -1;
    return 0;
}

static cpu_mm *mm_get(cpu_state *st, int64_t M, int64_t N, int64_t K, int ta, int tb, int bias,
                      int acc) {
    for (int i = 0; i < st->n_mm; i++) {
        cpu_mm *m = &st->mm[i];
        if (m->M == M && m->N == N && m->K == K && m->ta == ta && m->tb == tb &&
            m->bias == bias && m->acc == acc)
            return m->prim || m->emulated ? m : NULL;
    }
    cpu_mm *m;
    if (st->n_mm < CPU_MM_CACHE) {
        m = &st->mm[st->n_mm++];
    } else {
        m = &st->mm[st->next_evict];
        st->next_evict = (st->next_evict + 1) % CPU_MM_CACHE;
        mm_clear(m);
    }
    m->M = M, m->N = N, m->K = K, m->ta = ta, m->tb = tb, m->bias = bias, m->acc = acc;
    if (st->bf16_emulated || st->fp16) {
        m->emulated = 1;
        return m;
    }
    if (mm_build(st, m)) {
        /* keep the key with prim == NULL: the caller reports the failure and does not
         * retry the build every call */
        mm_clear(m);
        m->M = M, m->N = N, m->K = K, m->ta = ta, m->tb = tb, m->bias = bias, m->acc = acc;
        return NULL;
    }
    return m;
}

/* The same product without bf16 instructions (kb_options.bf16_reference): A and B widened
 * from bf16 to fp32 exactly, one fp32 sgemm, so the values multiplied are the bf16 ones. */
static int mm_run_emulated(cpu_state *st, cpu_mm *m, const kb_bf16 *A, const kb_bf16 *B,
                           const float *bias, float *C) {
    size_t na = (size_t)m->M * (size_t)m->K, nb = (size_t)m->K * (size_t)m->N;
    float *a = malloc((na ? na : 1) * sizeof(float)), *bm = malloc((nb ? nb : 1) * sizeof(float));
    if (!a || !bm) {
        free(a), free(bm);
        return -1;
    }
    if (st->fp16) {
        for (size_t i = 0; i < na; i++) a[i] = cpu_h2f(A[i]);
        for (size_t i = 0; i < nb; i++) bm[i] = cpu_h2f(B[i]);
    } else {
        for (size_t i = 0; i < na; i++) a[i] = cpu_bf2f(A[i]);
        for (size_t i = 0; i < nb; i++) bm[i] = cpu_bf2f(B[i]);
    }
    float beta = m->acc ? 1.0f : 0.0f;
    if (m->bias && !m->acc) {
        for (int64_t r = 0; r < m->M; r++) memcpy(C + r * m->N, bias, (size_t)m->N * sizeof(float));
        beta = 1.0f;
    }
    dnnl_status_t rc = dnnl_sgemm(m->ta ? 'T' : 'N', m->tb ? 'T' : 'N', m->M, m->N, m->K, 1.0f, a,
                                  m->ta ? m->M : m->K, bm, m->tb ? m->K : m->N, beta, C, m->N);
    if (rc == dnnl_success && m->bias && m->acc)
        for (int64_t r = 0; r < m->M; r++)
            for (int64_t j = 0; j < m->N; j++) C[r * m->N + j] += bias[j];
    free(a), free(bm);
    return rc == dnnl_success ? 0 : -1;
}

static int mm_run(cpu_state *st, cpu_mm *m, const kb_bf16 *A, const kb_bf16 *B,
                  const float *bias, float *C) {
    if (m->emulated) return mm_run_emulated(st, m, A, B, bias, C);
    dnnl_memory_set_data_handle(m->mem_a, (void *)A);
    dnnl_memory_set_data_handle(m->mem_b, (void *)B);
    dnnl_memory_set_data_handle(m->mem_c, C);
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, m->mem_a}, {DNNL_ARG_WEIGHTS, m->mem_b}, {DNNL_ARG_DST, m->mem_c}};
    int nargs = 3;
    if (m->bias && !m->manual_bias) {
        dnnl_memory_set_data_handle(m->mem_bias, (void *)bias);
        args[3] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, m->mem_bias};
        nargs = 4;
    }
    if (dnnl_primitive_execute(m->prim, st->stream, nargs, args)) return -1;
    if (dnnl_stream_wait(st->stream)) return -1;
    return 0;
}

/* ---- helpers ---- */

static void mm_fail(kb_backend *b, const char *op, int64_t M, int64_t N, int64_t K) {
    b->status = co_err_set(CO_EINTERNAL, "%s: oneDNN could not build or run the bf16 matrix product "
                                         "%lldx%lldx%lld", op, (long long)M, (long long)N, (long long)K);
}

static void convert(cpu_state *st, kb_bf16 *dst, const float *src, size_t n) {
    const size_t chunk = 1 << 14;
    size_t nc = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < nc; c++) {
        size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        if (st->fp16)
            for (size_t i = lo; i < hi; i++) dst[i] = cpu_f2h(src[i]);
        else
            for (size_t i = lo; i < hi; i++) dst[i] = cpu_f2bf(src[i]);
    }
}

static void add_bias(cpu_state *st, float *out, const float *bias, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OC;
        for (int j = 0; j < OC; j++) o[j] += bias[j];
    }
}

static void fill_bias(cpu_state *st, float *out, const float *bias, int N, int OC) {
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
}

/* dbias[j] += sum_n dout[n][j]: column blocks in parallel, rows in order within a block. */
static void col_sums(cpu_state *st, float *dbias, const float *dout, int N, int OC) {
    if (N <= 0 || OC <= 0) return;
    enum { CB = 64 };
    int nb = (OC + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int cb = 0; cb < nb; cb++) {
        int j0 = cb * CB, j1 = j0 + CB < OC ? j0 + CB : OC;
        float acc[CB];
        for (int j = 0; j < CB; j++) acc[j] = 0.0f;
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC + j0;
            if (j1 - j0 == CB) {
                for (int j = 0; j < CB; j++) acc[j] += d[j];
            } else {
                for (int j = 0; j < j1 - j0; j++) acc[j] += d[j];
            }
        }
        for (int j = 0; j < j1 - j0; j++) dbias[j0 + j] += acc[j];
    }
}

/* ---- fp32 ---- */

static void fwd_f32(cpu_state *st, float *out, const float *in, const float *W,
                    const float *bias, int N, int IC, int OC) {
    if (bias) fill_bias(st, out, bias, N, OC);
    dnnl_sgemm('N', 'T', N, OC, IC, 1.0f, in, IC, W, IC, bias ? 1.0f : 0.0f, out, OC);
}

static void bwd_f32(cpu_state *st, float *din, float *dW, const float *dout, const float *in,
                    const float *W, int N, int IC, int OC) {
    (void)st;
    if (din) dnnl_sgemm('N', 'N', N, IC, OC, 1.0f, dout, OC, W, IC, 0.0f, din, IC);
    if (dW) dnnl_sgemm('T', 'N', OC, IC, N, 1.0f, dout, OC, in, IC, 1.0f, dW, IC);
}

/* ---- entry points ---- */

void cpu_linear_forward(kb_backend *b, float *out, const float *in, const float *W,
                        const kb_bf16 *W16, const float *bias, int N, int IC, int OC) {
    cpu_state *st = cpu_st(b);
    if (N <= 0 || OC <= 0) return;
    sync_threads(st);
    if ((b->opt.bf16 || b->opt.fp16) && IC > 0) {
        /* bf16 was checked to be native here (isa.c): a product it cannot do is an error,
         * never a silent fp32 fallback */
        cpu_mm *m = mm_get(st, N, OC, IC, 0, 1, bias != NULL, 0);
        kb_bf16 *in16 = cpu_scratch(st, CPU_SCR_A16, (size_t)N * IC * sizeof(kb_bf16));
        if (m && in16 && !W16) {
            kb_bf16 *w = cpu_scratch(st, CPU_SCR_W16, (size_t)OC * IC * sizeof(kb_bf16));
            if (w) convert(st, w, W, (size_t)OC * IC);
            W16 = w;
        }
        if (!m) {
            mm_fail(b, "linear_forward", N, OC, IC);
            return;
        }
        if (!in16 || !W16) {
            b->status = co_err_set(CO_ENOMEM, "linear_forward: cannot allocate bf16 scratch");
            return;
        }
        convert(st, in16, in, (size_t)N * IC);
        if (mm_run(st, m, in16, W16, bias, out)) {
            mm_fail(b, "linear_forward", N, OC, IC);
            return;
        }
        if (m->manual_bias) add_bias(st, out, bias, N, OC);
        return;
    }
    if (IC <= 0) {
        for (int n = 0; n < N; n++)
            for (int j = 0; j < OC; j++) out[(size_t)n * OC + j] = bias ? bias[j] : 0.0f;
        return;
    }
    fwd_f32(st, out, in, W, bias, N, IC, OC);
}

void cpu_linear_backward(kb_backend *b, float *din, float *dW, float *dbias,
                         const float *dout, const float *in, const float *W,
                         const kb_bf16 *W16, int N, int IC, int OC) {
    cpu_state *st = cpu_st(b);
    if (N <= 0 || OC <= 0 || IC <= 0) {
        if (din && N > 0 && IC > 0) memset(din, 0, (size_t)N * IC * sizeof(float));
        if (dbias && N > 0 && OC > 0) col_sums(st, dbias, dout, N, OC);
        return;
    }
    sync_threads(st);
    if (dbias) col_sums(st, dbias, dout, N, OC);
    if (b->opt.bf16 || b->opt.fp16) {
        cpu_mm *md = din ? mm_get(st, N, IC, OC, 0, 0, 0, 0) : NULL;
        cpu_mm *mw = dW ? mm_get(st, OC, IC, N, 1, 0, 0, 1) : NULL;
        if ((din && !md) || (dW && !mw)) {
            if (din && !md) mm_fail(b, "linear_backward (input gradient)", N, IC, OC);
            else mm_fail(b, "linear_backward (weight gradient)", OC, IC, N);
            return;
        }
        kb_bf16 *dout16 = cpu_scratch(st, CPU_SCR_B16, (size_t)N * OC * sizeof(kb_bf16));
        if (!dout16) {
            b->status = co_err_set(CO_ENOMEM, "linear_backward: cannot allocate bf16 scratch");
            return;
        }
        convert(st, dout16, dout, (size_t)N * OC);
        if (md) {
            if (!W16) {
                kb_bf16 *w = cpu_scratch(st, CPU_SCR_W16, (size_t)OC * IC * sizeof(kb_bf16));
                if (w) convert(st, w, W, (size_t)OC * IC);
                W16 = w;
            }
            if (!W16) {
                b->status = co_err_set(CO_ENOMEM, "linear_backward: cannot allocate bf16 scratch");
                return;
            }
            if (mm_run(st, md, dout16, W16, NULL, din)) {
                mm_fail(b, "linear_backward (input gradient)", N, IC, OC);
                return;
            }
        }
        if (mw) {
            kb_bf16 *in16 = cpu_scratch(st, CPU_SCR_A16, (size_t)N * IC * sizeof(kb_bf16));
            if (!in16) {
                b->status = co_err_set(CO_ENOMEM, "linear_backward: cannot allocate bf16 scratch");
                return;
            }
            convert(st, in16, in, (size_t)N * IC);
            if (mm_run(st, mw, dout16, in16, NULL, dW)) {
                mm_fail(b, "linear_backward (weight gradient)", OC, IC, N);
                return;
            }
        }
        return;
    }
    bwd_f32(st, din, dW, dout, in, W, N, IC, OC);
}

void cpu_bias_add(kb_backend *b, float *out, const float *bias, int N, int C) { add_bias(cpu_st(b), out, bias, N, C); }

void cpu_bias_grad(kb_backend *b, float *dbias, const float *dout, int N, int C) {
    col_sums(cpu_st(b), dbias, dout, N, C);
}

/* ---- grouped products (kb_ops.grouped_linear_*): the MoE layer's experts in one call ----
 * The work is cut into pieces that do not depend on the thread count: forward and the input
 * gradient in blocks of GROUP_ROWS rows of one group, the weight gradient in blocks of
 * GROUP_COLS output rows of one group's dW (so no two pieces write the same element). The
 * pieces are spread over the backend's threads (static schedule); each is one dnnl_sgemm,
 * which runs on its calling thread inside the parallel region. With --bf16 each group is one
 * bf16 product (cpu_linear_forward/backward, the dense layers' path), as the CUDA backend's
 * grouped products under bf16: the same bits as the experts' products one by one. */
enum { GROUP_ROWS = 256, GROUP_COLS = 256 };

typedef struct gpiece {
    int g, lo, hi;
} gpiece;

/* pieces of n groups: row blocks (by_rows) or blocks of `width` columns; NULL on no memory */
static gpiece *group_pieces(const int32_t *off, int n, bool by_rows, int width, int *np) {
    size_t cnt = 0;
    for (int g = 0; g < n; g++) {
        int rows = off[g + 1] - off[g];
        if (rows <= 0) continue;
        cnt += by_rows ? (size_t)(rows + GROUP_ROWS - 1) / GROUP_ROWS : (size_t)(width + GROUP_COLS - 1) / GROUP_COLS;
    }
    gpiece *p = malloc((cnt ? cnt : 1) * sizeof *p);
    if (!p) return NULL;
    size_t k = 0;
    for (int g = 0; g < n; g++) {
        int rows = off[g + 1] - off[g];
        if (rows <= 0) continue;
        int total = by_rows ? rows : width, step = by_rows ? GROUP_ROWS : GROUP_COLS;
        for (int lo = 0; lo < total; lo += step) p[k++] = (gpiece){g, lo, lo + step < total ? lo + step : total};
    }
    *np = (int)cnt;
    return p;
}

void cpu_grouped_linear_forward(kb_backend *b, float *out, const float *in, const float *W, const int32_t *off,
                                int n, int IC, int OC) {
    cpu_state *st = cpu_st(b);
    if (n <= 0 || OC <= 0) return;
    if (b->opt.bf16 || b->opt.fp16) {
        for (int g = 0; g < n && !b->status; g++)
            if (off[g + 1] > off[g])
                cpu_linear_forward(b, out + (size_t)off[g] * OC, in + (size_t)off[g] * IC, W + (size_t)g * OC * IC,
                                   NULL, NULL, off[g + 1] - off[g], IC, OC);
        return;
    }
    sync_threads(st);
    int np = 0;
    gpiece *p = group_pieces(off, n, true, 0, &np);
    if (!p) {
        b->status = co_err_set(CO_ENOMEM, "grouped_linear_forward: the piece table");
        return;
    }
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int i = 0; i < np; i++) {
        size_t r0 = (size_t)off[p[i].g] + (size_t)p[i].lo;
        int rows = p[i].hi - p[i].lo;
        float *o = out + r0 * OC;
        if (IC <= 0) {
            memset(o, 0, (size_t)rows * OC * sizeof(float));
            continue;
        }
        dnnl_sgemm('N', 'T', rows, OC, IC, 1.0f, in + r0 * IC, IC, W + (size_t)p[i].g * OC * IC, IC, 0.0f, o, OC);
    }
    free(p);
}

void cpu_grouped_linear_backward(kb_backend *b, float *din, float *dW, const float *dout, const float *in,
                                 const float *W, const int32_t *off, int n, int IC, int OC) {
    cpu_state *st = cpu_st(b);
    if (n <= 0 || OC <= 0 || IC <= 0) return;
    if (b->opt.bf16 || b->opt.fp16) {
        for (int g = 0; g < n && !b->status; g++) {
            size_t r0 = (size_t)off[g];
            if (off[g + 1] > off[g])
                cpu_linear_backward(b, din ? din + r0 * IC : NULL, dW ? dW + (size_t)g * OC * IC : NULL, NULL,
                                    dout + r0 * OC, in + r0 * IC, W + (size_t)g * OC * IC, NULL, off[g + 1] - off[g],
                                    IC, OC);
        }
        return;
    }
    sync_threads(st);
    int np = 0, nw = 0;
    gpiece *p = din ? group_pieces(off, n, true, 0, &np) : NULL;
    gpiece *q = dW ? group_pieces(off, n, false, OC, &nw) : NULL;
    if ((din && !p) || (dW && !q)) {
        free(p);
        free(q);
        b->status = co_err_set(CO_ENOMEM, "grouped_linear_backward: the piece table");
        return;
    }
    /* one parallel loop over both kinds of pieces: input-gradient row blocks, then
     * weight-gradient column blocks */
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int i = 0; i < np + nw; i++) {
        if (i < np) {
            size_t r0 = (size_t)off[p[i].g] + (size_t)p[i].lo;
            int rows = p[i].hi - p[i].lo;
            dnnl_sgemm('N', 'N', rows, IC, OC, 1.0f, dout + r0 * OC, OC, W + (size_t)p[i].g * OC * IC, IC, 0.0f,
                       din + r0 * IC, IC);
        } else {
            const gpiece *w = &q[i - np];
            size_t r0 = (size_t)off[w->g];
            int rows = off[w->g + 1] - off[w->g], cols = w->hi - w->lo;
            /* dW_g[lo:hi, :] += dout[rows, lo:hi]^T in[rows, :] */
            dnnl_sgemm('T', 'N', cols, IC, rows, 1.0f, dout + r0 * OC + w->lo, OC, in + r0 * IC, IC, 1.0f,
                       dW + (size_t)w->g * OC * IC + (size_t)w->lo * IC, IC);
        }
    }
    free(p);
    free(q);
}
