// cuda_grouped.cu - the MoE experts' grouped products (kb_ops.grouped_linear_forward and
// grouped_linear_backward, kernels/backend.h) through cuBLAS.
//
// Group j is rows [off[j], off[j+1]) (host offsets) of the row-major in/out/dout/din, with the
// weights W + j*OC*IC ([OC,IC]); groups with no rows are skipped (nothing written, dW_j
// unchanged). Each product is the column-major form of the row-major one (as cuda_matmul.cu):
//   forward  out_j^T[OC,r] = W_j^T' in_j^T       (transa T, transb N, m OC, n r, k IC, beta 0)
//   input    din_j^T[IC,r] = W_j^T dout_j^T       (N, N, m IC, n r, k OC, beta 0)
//   weight   dW_j^T[IC,OC] += in_j^T dout_j       (N, T, m IC, n OC, k r, beta 1)
// How they run (fp32 inputs, CUBLAS_COMPUTE_32F, no TF32, as the backend's fp32 products):
//  - cuBLAS 12.5 and newer: ONE cublasGemmGroupedBatchedEx call per kind of product for every
//    group (each non-empty group is a cuBLAS group of one problem). cuBLAS reads its A/B/C
//    pointer arrays from device memory (its documentation: Aarray, Barray, Carray are
//    device arrays of problem_count pointers; dimensions, leading dimensions, scalars and
//    group sizes are host arrays of group_count), so a one-block kernel on the backend's
//    stream writes them into stream-ordered scratch from the host offsets, which it gets as
//    kernel parameters: no host staging buffer, no stream sync, and the next call may reuse
//    the scratch because everything is ordered on the one stream.
//  - older cuBLAS, or where the grouped call returns CUBLAS_STATUS_NOT_SUPPORTED or
//    CUBLAS_STATUS_ARCH_MISMATCH (remembered for the backend's life), or with
//    COHORT_TEST_CUDA_GROUPED_LOOP=1 in the environment when the handle is made (tests): one
//    cublasSgemm per group, in group order, on the same stream.
//  - bf16 mode (the MoE layer refuses it today; kept correct for any other caller): one
//    cu_linear_forward/backward per group, i.e. the backend's bf16 cuBLASLt products.
// Determinism: one stream, a handle whose workspace is the backend's own (cublasSetWorkspace,
// NVIDIA's condition for bitwise reproducible cuBLAS results), atomics not allowed
// (cublasSetAtomicsMode: no split-K reductions with atomics). cuBLAS then gives the same bits
// for the same inputs on the same GPU model and library version; the grouped call and the
// per-group loop may differ from each other in the last bits (different kernels).
// Errors go to the backend's sticky status (cu_fail) naming the operation and the cuBLAS call.
#include "kernels/cuda/cu_common.cuh"

#include <stdio.h>
#include <stdlib.h>

// cublasGemmGroupedBatchedEx and cublas<t>gemmGroupedBatched appeared in cuBLAS 12.5 (CUDA 12.5).
// COHORT_CUDA_NO_GROUPED_GEMM builds the per-group loop only (to compile-check it on a newer toolkit).
#if defined(COHORT_CUDA_NO_GROUPED_GEMM)
#define CU_HAVE_GROUPED_GEMM 0
#elif defined(CUBLAS_VER_MAJOR) && defined(CUBLAS_VER_MINOR)
#define CU_HAVE_GROUPED_GEMM (CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5))
#else
#define CU_HAVE_GROUPED_GEMM (CUDART_VERSION >= 12050)
#endif

enum { G_FWD = 0, G_DIN, G_DW };

typedef struct gprob {
    int g, r0, rows;
} gprob;

// the non-empty groups, in group order; NULL (status set) when out of memory, *np = 0 when none
static gprob *group_problems(kb_backend *b, const int32_t *off, int n, int *np, const char *op) {
    int cnt = 0;
    for (int j = 0; j < n; j++) cnt += off[j + 1] > off[j];
    *np = cnt;
    gprob *p = (gprob *)malloc(sizeof(gprob) * (size_t)(cnt ? cnt : 1));
    if (!p) {
        cu_fail(b, CO_ENOMEM, op, "out of host memory for the group table");
        return NULL;
    }
    for (int j = 0, k = 0; j < n; j++)
        if (off[j + 1] > off[j]) p[k++] = gprob{j, (int)off[j], (int)(off[j + 1] - off[j])};
    return p;
}

// ---- cuBLAS handle (made on first use: runs without MoE never load cuBLAS's kernels) ----

static int blas_handle(kb_backend *b, const char *op) {
    cu_state *st = cu_st(b);
    if (st->blas) return 0;
    cublasHandle_t h = NULL;
    cublasStatus_t s = cublasCreate(&h);
    char what[128];
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(what, sizeof what, "cublasCreate failed (status %d)", (int)s);
        return cu_fail(b, s == CUBLAS_STATUS_ALLOC_FAILED ? CO_ENOMEM : CO_EINTERNAL, op, what);
    }
    // the stream first: cublasSetStream resets the workspace to cuBLAS's default pool
    const char *step = "cublasSetStream";
    s = cublasSetStream(h, st->stream);
    if (s == CUBLAS_STATUS_SUCCESS) step = "cublasSetWorkspace", s = cublasSetWorkspace(h, st->ws, st->ws_size);
    if (s == CUBLAS_STATUS_SUCCESS) step = "cublasSetAtomicsMode", s = cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED);
    if (s == CUBLAS_STATUS_SUCCESS) step = "cublasSetPointerMode", s = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
    if (s == CUBLAS_STATUS_SUCCESS) step = "cublasSetMathMode", s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH); // no TF32
    if (s != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        snprintf(what, sizeof what, "%s failed (status %d)", step, (int)s);
        return cu_fail(b, CO_EINTERNAL, op, what);
    }
    const char *loop = getenv("COHORT_TEST_CUDA_GROUPED_LOOP");
    st->grouped_mode = (loop && loop[0] == '1') || !CU_HAVE_GROUPED_GEMM ? -1 : 0;
    st->blas = h;
    return 0;
}

void cu_blas_release(cu_state *st) {
    if (st->blas) cublasDestroy(st->blas);
    st->blas = NULL;
}

// ---- the products ----

// one problem's column-major GEMM (see the top of the file)
typedef struct gemm {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    float beta;
} gemm;

static gemm gemm_of(int kind, int rows, int IC, int OC) {
    switch (kind) {
    case G_FWD: return gemm{CUBLAS_OP_T, CUBLAS_OP_N, OC, rows, IC, IC, IC, OC, 0.0f};
    case G_DIN: return gemm{CUBLAS_OP_N, CUBLAS_OP_N, IC, rows, OC, IC, OC, IC, 0.0f};
    default: return gemm{CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, rows, IC, OC, IC, 1.0f};
    }
}

// A, B, C of problem p: element offsets from the bases given to run_products
//   forward: A = W_g, B = in + r0*IC, C = out + r0*OC
//   input:   A = W_g, B = dout + r0*OC, C = din + r0*IC
//   weight:  A = in + r0*IC, B = dout + r0*OC, C = dW_g
typedef struct gbases {
    const float *base[3];
    size_t gstride[3], rstride[3]; // elements per group index, per row
} gbases;

static gbases bases_of(int kind, float *C, const float *X, const float *Y, int IC, int OC) {
    // forward: X = W, Y = in; input: X = W, Y = dout; weight: X = in, Y = dout
    size_t w = (size_t)OC * IC;
    switch (kind) {
    case G_FWD: return gbases{{X, Y, C}, {w, 0, 0}, {0, (size_t)IC, (size_t)OC}};
    case G_DIN: return gbases{{X, Y, C}, {w, 0, 0}, {0, (size_t)OC, (size_t)IC}};
    default: return gbases{{X, Y, C}, {0, 0, w}, {(size_t)IC, (size_t)OC, 0}};
    }
}

static inline const float *gptr(const gbases *bs, int t, const gprob *p) {
    return bs->base[t] + bs->gstride[t] * (size_t)p->g + bs->rstride[t] * (size_t)p->r0;
}

#define CU_GRP_CHUNK 256
// kernel parameters (about 2 KB, under the 4 KB every toolkit allows): a chunk of problems
struct grp_chunk {
    int count, first, total;
    int g[CU_GRP_CHUNK], r0[CU_GRP_CHUNK];
};

// ptrs[t*total + first + i] = base[t] + gstride[t]*g[i] + rstride[t]*r0[i]  (t = A, B, C)
__global__ void k_group_ptrs(const void **ptrs, gbases bs, grp_chunk c) {
    int i = threadIdx.x;
    if (i >= c.count) return;
    for (int t = 0; t < 3; t++)
        ptrs[(size_t)t * c.total + c.first + i] =
            bs.base[t] + bs.gstride[t] * (size_t)c.g[i] + bs.rstride[t] * (size_t)c.r0[i];
}

static int blas_failed(kb_backend *b, const char *op, const char *call, cublasStatus_t s) {
    char what[128];
    snprintf(what, sizeof what, "%s failed (status %d)", call, (int)s);
    return cu_fail(b, s == CUBLAS_STATUS_ALLOC_FAILED ? CO_ENOMEM : CO_EINTERNAL, op, what);
}

// one cublasSgemm per problem, in order on the backend's stream
static void run_loop(kb_backend *b, int kind, const gbases *bs, const gprob *p, int np, int IC, int OC,
                     const char *op) {
    cu_state *st = cu_st(b);
    const float one = 1.0f;
    for (int i = 0; i < np; i++) {
        gemm g = gemm_of(kind, p[i].rows, IC, OC);
        cublasStatus_t s = cublasSgemm(st->blas, g.ta, g.tb, g.m, g.n, g.k, &one, gptr(bs, 0, &p[i]), g.lda,
                                       gptr(bs, 1, &p[i]), g.ldb, &g.beta, (float *)gptr(bs, 2, &p[i]), g.ldc);
        if (s != CUBLAS_STATUS_SUCCESS) {
            blas_failed(b, op, "cublasSgemm", s);
            return;
        }
    }
}

#if CU_HAVE_GROUPED_GEMM
// one cublasGemmGroupedBatchedEx for every problem: 0 done (or failure recorded), 1 not
// supported here (NOT_SUPPORTED or ARCH_MISMATCH: nothing queued but the pointer kernel; the
// caller runs the loop)
static int run_grouped(kb_backend *b, int kind, const gbases *bs, const gprob *p, int np, int IC, int OC,
                       const char *op) {
    cu_state *st = cu_st(b);
    const void **ptrs = (const void **)cu_scratch(b, CU_SCR_GRP, (size_t)3 * np * sizeof(void *), op);
    if (!ptrs) return 0;
    for (int first = 0; first < np; first += CU_GRP_CHUNK) {
        grp_chunk c;
        c.count = np - first < CU_GRP_CHUNK ? np - first : CU_GRP_CHUNK;
        c.first = first;
        c.total = np;
        for (int i = 0; i < c.count; i++) c.g[i] = p[first + i].g, c.r0[i] = p[first + i].r0;
        k_group_ptrs<<<1, CU_GRP_CHUNK, 0, st->stream>>>(ptrs, *bs, c);
        if (cu_launched(b, op)) return 0;
    }
    // host arrays of group_count (= np: each problem is a group of one)
    size_t n = (size_t)np;
    cublasOperation_t *ops = (cublasOperation_t *)malloc(sizeof(cublasOperation_t) * 2 * n);
    int *dims = (int *)malloc(sizeof(int) * 7 * n);
    float *scal = (float *)malloc(sizeof(float) * 2 * n);
    if (!ops || !dims || !scal) {
        free(ops), free(dims), free(scal);
        cu_fail(b, CO_ENOMEM, op, "out of host memory for the grouped product's arrays");
        return 0;
    }
    int *m = dims, *nn = dims + n, *k = dims + 2 * n, *lda = dims + 3 * n, *ldb = dims + 4 * n, *ldc = dims + 5 * n;
    int *gsize = dims + 6 * n;
    for (int i = 0; i < np; i++) {
        gemm g = gemm_of(kind, p[i].rows, IC, OC);
        ops[i] = g.ta, ops[n + i] = g.tb;
        m[i] = g.m, nn[i] = g.n, k[i] = g.k, lda[i] = g.lda, ldb[i] = g.ldb, ldc[i] = g.ldc, gsize[i] = 1;
        scal[i] = 1.0f, scal[n + i] = g.beta;
    }
    cublasStatus_t s = cublasGemmGroupedBatchedEx(st->blas, ops, ops + n, m, nn, k, scal, ptrs, CUDA_R_32F, lda,
                                                  ptrs + n, CUDA_R_32F, ldb, scal + n, (void *const *)(ptrs + 2 * n),
                                                  CUDA_R_32F, ldc, np, gsize, CUBLAS_COMPUTE_32F);
    free(ops), free(dims), free(scal); // host arrays are read during the call
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH) return 1;
    if (s != CUBLAS_STATUS_SUCCESS) blas_failed(b, op, "cublasGemmGroupedBatchedEx", s);
    return 0;
}
#endif

// every non-empty group's product of one kind
static void run_products(kb_backend *b, int kind, float *C, const float *X, const float *Y, const gprob *p, int np,
                         int IC, int OC, const char *op) {
    if (np == 0 || blas_handle(b, op)) return;
    cu_state *st = cu_st(b);
    gbases bs = bases_of(kind, C, X, Y, IC, OC);
#if CU_HAVE_GROUPED_GEMM
    if (st->grouped_mode == 0) {
        if (run_grouped(b, kind, &bs, p, np, IC, OC, op) == 0) return;
        st->grouped_mode = -1; // this cuBLAS or GPU has no grouped GEMM for fp32: the loop from now on
    }
#endif
    (void)st;
    run_loop(b, kind, &bs, p, np, IC, OC, op);
}

void cu_grouped_linear_forward(kb_backend *b, float *out, const float *in, const float *W, const int32_t *off, int n,
                               int IC, int OC) {
    const char *op = "grouped_linear_forward";
    if (!cu_enter(b) || n <= 0 || OC <= 0) return;
    int np = 0;
    gprob *p = group_problems(b, off, n, &np, op);
    if (!p) return;
    cudaStream_t s = cu_st(b)->stream;
    if (IC <= 0) { // empty products: zeros, as the CPU backend
        for (int i = 0; i < np; i++)
            if (cu_check(b, cudaMemsetAsync(out + (size_t)p[i].r0 * OC, 0, sizeof(float) * p[i].rows * OC, s), op))
                break;
    } else if (b->opt.bf16 || b->opt.fp16) {
        for (int i = 0; i < np && !b->status; i++)
            cu_linear_forward(b, out + (size_t)p[i].r0 * OC, in + (size_t)p[i].r0 * IC, W + (size_t)p[i].g * OC * IC,
                              NULL, NULL, p[i].rows, IC, OC);
    } else {
        run_products(b, G_FWD, out, W, in, p, np, IC, OC, op);
    }
    free(p);
}

void cu_grouped_linear_backward(kb_backend *b, float *din, float *dW, const float *dout, const float *in,
                                const float *W, const int32_t *off, int n, int IC, int OC) {
    const char *op = "grouped_linear_backward";
    if (!cu_enter(b) || n <= 0 || OC <= 0 || IC <= 0 || (!din && !dW)) return;
    int np = 0;
    gprob *p = group_problems(b, off, n, &np, op);
    if (!p) return;
    if (b->opt.bf16 || b->opt.fp16) {
        for (int i = 0; i < np && !b->status; i++) {
            size_t r0 = (size_t)p[i].r0, g = (size_t)p[i].g;
            cu_linear_backward(b, din ? din + r0 * IC : NULL, dW ? dW + g * OC * IC : NULL, NULL, dout + r0 * OC,
                               in + r0 * IC, W + g * OC * IC, NULL, p[i].rows, IC, OC);
        }
    } else {
        if (din) run_products(b, G_DIN, din, W, dout, p, np, IC, OC, "grouped_linear_backward (input)");
        if (dW && !b->status) run_products(b, G_DW, dW, in, dout, p, np, IC, OC, "grouped_linear_backward (weight)");
    }
    free(p);
}
