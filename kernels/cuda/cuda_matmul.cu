// cuda_matmul.cu - linear layers through cuBLASLt: bf16 inputs with fp32 accumulation and
// output in bf16 mode, plain fp32 (CUBLAS_COMPUTE_32F, no TF32) otherwise.
//
// Row-major y[N,OC] = x[N,IC] W[OC,IC]^T is the column-major product y^T = W^T' x^T, so
// every call maps onto one cuBLASLt matmul without copies. The algorithm for each shape
// (and operand alignment) is chosen once by cuBLASLt's heuristic and cached: a shape always
// runs the same algorithm, so results are bitwise repeatable. With the bias epilogue the
// heuristic is asked after CUBLASLT_MATMUL_DESC_BIAS_POINTER is set (cublasLt.h: it assumes
// that pointer's alignment), and the cache key holds the bias alignment too: an algorithm
// chosen for an aligned bias never runs with a less aligned one (biases packed in one
// parameter buffer are only 4-byte aligned). Bias gradients of linear_backward come from the
// weight-gradient product's CUBLASLT_EPILOGUE_BGRADB (the column sums of dout, its B operand:
// bf16-rounded in bf16 mode, as the product reads it), written to scratch and added to the
// accumulated gradient; without a weight gradient, or where cuBLASLt has no BGRADB algorithm,
// they are column sums with a fixed order (cu_col_sums).
// bf16 activations (backend.h: linear_forward_bf16, linear_backward_bf16,
// linear_gelu_forward_bf16; bf16 mode only): the activation operand is already bf16 and is
// read as it is, no conversion; the fused GELU product writes its output in bf16 (D bf16, the
// fp32 pre-activation to the aux matrix: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE), and
// where cuBLASLt has no such algorithm, or refuses it, the product and a GELU kernel that
// writes bf16 run instead.
// The fused products (linear_gelu_forward, linear_backward_dgelu) are cuBLASLt epilogues:
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS (bias, then GELU; the pre-activation to the aux matrix)
// and CUBLASLT_EPILOGUE_DGELU_BGRAD (times gelu'(aux); the bias gradient of the result);
// where cuBLASLt has no algorithm for them (or the aux leading dimension is not a multiple of
// 8, as cublasLt.h requires) they fall back to the product and the elementwise kernels.
#include "kernels/cuda/cu_common.cuh"

#include <stdio.h>

static void mm_clear(cu_mm *m) {
    if (m->desc) cublasLtMatmulDescDestroy(m->desc);
    if (m->la) cublasLtMatrixLayoutDestroy(m->la);
    if (m->lb) cublasLtMatrixLayoutDestroy(m->lb);
    if (m->lc) cublasLtMatrixLayoutDestroy(m->lc);
    memset(m, 0, sizeof *m);
}

void cu_mm_release(cu_state *st) {
    for (int i = 0; i < st->n_mm; i++) mm_clear(&st->mm[i]);
    st->n_mm = 0;
}

// Column-major C[m,n] (beta: 0 or 1) = op(A) op(B); A stored [ta ? k x m : m x k], B stored
// [tb ? n x k : k x n], all tightly packed (leading dimension = stored rows).
// m->epi_bias: the epilogue, EPI_* below; bias and aux as set when the heuristic is asked
enum { EPI_NONE = 0, EPI_BIAS, EPI_GELU_AUX_BIAS, EPI_DGELU_BGRAD, EPI_BGRADB };
static int mm_build(cu_state *st, cu_mm *m, const float *bias, const float *aux) {
    // the inputs: fp32, bf16 (--bf16) or fp16 (--fp16); fp32 compute and output always
    cudaDataType_t ab = m->bf16 == CU_MM_F16 ? CUDA_R_16F : m->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t opa = m->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = m->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t ar = m->ta ? m->k : m->m, ac = m->ta ? m->m : m->k;
    uint64_t br = m->tb ? m->n : m->k, bc = m->tb ? m->k : m->n;
    if (cublasLtMatmulDescCreate(&m->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return -1;
    if (cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) ||
        cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb))
        return -1;
    if (m->epi_bias) {
        cublasLtEpilogue_t epi = m->epi_bias == EPI_GELU_AUX_BIAS ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                 : m->epi_bias == EPI_DGELU_BGRAD ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                 : m->epi_bias == EPI_BGRADB      ? CUBLASLT_EPILOGUE_BGRADB
                                                                  : CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        if (cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
            cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt) ||
            cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias))
            return -1;
        if (m->epi_bias == EPI_GELU_AUX_BIAS || m->epi_bias == EPI_DGELU_BGRAD) {
            // the aux matrix: fp32 (named so where D is bf16), leading dimension D's rows
            int64_t ld = m->m;
            int32_t at = CUDA_R_32F;
            if (cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) ||
                cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld) ||
                (m->out16 && cublasLtMatmulDescSetAttribute(m->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at,
                                                            sizeof at)))
                return -1;
        }
    }
    cudaDataType_t ct = m->out16 ? CUDA_R_16BF : CUDA_R_32F; // C and D
    if (cublasLtMatrixLayoutCreate(&m->la, ab, ar, ac, (int64_t)ar) ||
        cublasLtMatrixLayoutCreate(&m->lb, ab, br, bc, (int64_t)br) ||
        cublasLtMatrixLayoutCreate(&m->lc, ct, (uint64_t)m->m, (uint64_t)m->n, (int64_t)m->m))
        return -1;
    cublasLtMatmulPreference_t pref = NULL;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return -1;
    uint64_t ws = st->ws_size;
    uint32_t al = (uint32_t)m->align;
    int bad = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ||
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al) ||
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al) ||
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al) ||
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    if (!bad &&
        cublasLtMatmulAlgoGetHeuristic(st->lt, m->desc, m->la, m->lb, m->lc, m->lc, pref, 1, &res, &found) !=
            CUBLAS_STATUS_SUCCESS)
        found = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    if (bad || found < 1) return -1;
    m->algo = res.algo;
    return 0;
}

static int align_of(const void *p);

// the cached algorithm of this key (bias: the epilogue's bias, NULL for none), built on first use
static cu_mm *mm_get(cu_state *st, int m, int n, int k, int ta, int tb, int bf16, int epi, const float *bias,
                     const float *aux, int beta1, int align, int out16) {
    const int epi_bias = epi, bias_align = bias ? align_of(bias) : 0;
    for (int i = 0; i < st->n_mm; i++) {
        cu_mm *c = &st->mm[i];
        if (c->m == m && c->n == n && c->k == k && c->ta == ta && c->tb == tb && c->bf16 == bf16 &&
            c->epi_bias == epi_bias && c->beta1 == beta1 && c->align == align && c->bias_align == bias_align &&
            c->out16 == out16)
            return c->ok ? c : NULL;
    }
    cu_mm *c;
    if (st->n_mm < CU_MM_CACHE) {
        c = &st->mm[st->n_mm++];
    } else {
        c = &st->mm[st->next_evict];
        st->next_evict = (st->next_evict + 1) % CU_MM_CACHE;
        mm_clear(c);
    }
    c->m = m, c->n = n, c->k = k, c->ta = ta, c->tb = tb, c->bf16 = bf16, c->epi_bias = epi_bias, c->beta1 = beta1;
    c->align = align, c->bias_align = bias_align, c->out16 = out16;
    if (mm_build(st, c, bias, aux)) {
        mm_clear(c); // keep the key with ok = 0 so a failing shape is not rebuilt each call
        c->m = m, c->n = n, c->k = k, c->ta = ta, c->tb = tb, c->bf16 = bf16, c->epi_bias = epi_bias;
        c->beta1 = beta1, c->align = align, c->bias_align = bias_align, c->out16 = out16;
        return NULL;
    }
    c->ok = 1;
    return c;
}

static int align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    return (u & 15) == 0 ? 16 : (u & 7) == 0 ? 8 : (u & 3) == 0 ? 4 : 2;
}

// C = op(A) op(B) (+ C if beta1) (+ bias[m] per column if bias). 0 or -1 (no algorithm).
// With epi (EPI_*): bias is the bias (the bias gradient's output for EPI_DGELU_BGRAD and
// EPI_BGRADB), aux the GELU's input matrix (leading dimension m). out16: C (and D) bf16; a
// product cuBLASLt refuses then returns -1 too (remembered), so the caller's fallback runs.
static int mm_run_epi(kb_backend *b, int m, int n, int k, int ta, int tb, int bf16, const void *A, const void *B,
                      void *C, int epi, const float *bias, const float *aux, int beta1, const char *op,
                      int out16 = 0) {
    cu_state *st = cu_st(b);
    int al = align_of(A);
    int a2 = align_of(B), a3 = align_of(C);
    al = a2 < al ? a2 : al;
    al = a3 < al ? a3 : al;
    if (aux) {
        int a4 = align_of(aux);
        al = a4 < al ? a4 : al;
    }
    cu_mm *mm = mm_get(st, m, n, k, ta, tb, bf16, epi, bias, aux, beta1, al, out16);
    if (!mm) return -1;
    if (bias && cublasLtMatmulDescSetAttribute(mm->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias))
        return -1;
    if (aux && cublasLtMatmulDescSetAttribute(mm->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux))
        return -1;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasLtMatmul(st->lt, mm->desc, &one, A, mm->la, B, mm->lb, beta1 ? &one : &zero, C, mm->lc,
                                      C, mm->lc, &mm->algo, st->ws, st->ws_size, st->stream);
    if (s != CUBLAS_STATUS_SUCCESS && out16 && (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)) {
        mm->ok = 0; // refused before anything was queued: the fallback from now on
        return -1;
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cublasLtMatmul failed (status %d) for %dx%dx%d", (int)s, m, n, k);
        cu_fail(b, CO_EINTERNAL, op, what);
        return 0; // failure recorded; do not retry another way
    }
    return 0;
}

static int mm_run(kb_backend *b, int m, int n, int k, int ta, int tb, int bf16, const void *A, const void *B,
                  float *C, const float *bias, int beta1, const char *op) {
    return mm_run_epi(b, m, n, k, ta, tb, bf16, A, B, C, bias ? EPI_BIAS : EPI_NONE, bias, NULL, beta1, op);
}

__global__ void k_fill_rows(float *__restrict__ out, const float *__restrict__ bias, int N, int OC) {
    size_t total = (size_t)N * OC;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias ? bias[i % (size_t)OC] : 0.0f;
}

static void fill_rows(kb_backend *b, float *out, const float *bias, int N, int OC) {
    k_fill_rows<<<cu_blocks((size_t)N * OC, 256), 256, 0, cu_st(b)->stream>>>(out, bias, N, OC);
    cu_launched(b, "linear_forward (bias)");
}

static void no_algo(kb_backend *b, const char *op, int m, int n, int k, int bf16) {
    char what[128];
    snprintf(what, sizeof what, "cuBLASLt has no %s algorithm for %dx%dx%d",
             bf16 == CU_MM_F16 ? "fp16" : bf16 ? "bf16" : "fp32", m, n, k);
    cu_fail(b, CO_EUNSUPPORTED, op, what);
}

// out = in W^T (+ bias); in16: the activation already in bf16 (bf16 mode), read as it is
static void lin_fwd(kb_backend *b, float *out, const float *in, const uint16_t *in16, const float *W,
                    const kb_bf16 *W16, const float *bias, int N, int IC, int OC) {
    if (IC <= 0) {
        fill_rows(b, out, bias, N, OC);
        return;
    }
    const int bf = cu_mm_type(b);
    const void *A = W, *B = in;
    if (bf) {
        if (!in16) {
            uint16_t *x16 = (uint16_t *)cu_scratch(b, CU_SCR_A16, (size_t)N * IC * 2, "linear_forward");
            if (!x16) return;
            cu_to_bf16_raw(b, x16, in, (size_t)N * IC);
            in16 = x16;
        }
        if (!W16) {
            uint16_t *w = (uint16_t *)cu_scratch(b, CU_SCR_W16, (size_t)OC * IC * 2, "linear_forward");
            if (!w) return;
            cu_to_bf16_raw(b, w, W, (size_t)OC * IC);
            W16 = w;
        }
        A = W16;
        B = in16;
    }
    // out^T[OC,N] = W (stored IC x OC, transposed) x in^T (stored IC x N)
    if (mm_run(b, OC, N, IC, 1, 0, bf, A, B, out, bias, 0, "linear_forward") == 0) return;
    if (bias) { // no algorithm with the bias epilogue: bias first, then accumulate
        fill_rows(b, out, bias, N, OC);
        if (mm_run(b, OC, N, IC, 1, 0, bf, A, B, out, NULL, 1, "linear_forward") == 0) return;
    }
    no_algo(b, "linear_forward", OC, N, IC, bf);
}

void cu_linear_forward(kb_backend *b, float *out, const float *in, const float *W, const kb_bf16 *W16,
                       const float *bias, int N, int IC, int OC) {
    if (!cu_enter(b) || N <= 0 || OC <= 0) return;
    lin_fwd(b, out, in, NULL, W, W16, bias, N, IC, OC);
}

// dW (+)= dout^T in with dbias += the column sums of dout: one product with the BGRADB
// epilogue (its sums to scratch, then added), or the product and cu_col_sums
static void dw_product(kb_backend *b, float *dW, float *dbias, const float *dout, const void *X, const void *dO,
                       int N, int IC, int OC, int bf) {
    if (dbias) {
        float *g = (float *)cu_scratch(b, CU_SCR_EPI, (size_t)OC * sizeof(float), "linear_backward");
        if (!g) return;
        // dW^T[IC,OC] += in^T (stored IC x N) x dout (stored OC x N, transposed); g = sums over N
        if (mm_run_epi(b, IC, OC, N, 0, 1, bf, X, dO, dW, EPI_BGRADB, g, NULL, 1, "linear_backward (weight)") == 0) {
            if (!b->status) cu_add(b, dbias, dbias, g, (size_t)OC);
            return;
        }
        cu_col_sums(b, dbias, dout, NULL, NULL, NULL, N, OC, 0);
    }
    if (mm_run(b, IC, OC, N, 0, 1, bf, X, dO, dW, NULL, 1, "linear_backward (weight)"))
        no_algo(b, "linear_backward (weight)", IC, OC, N, bf);
}

// the backward of lin_fwd; in16 as there
static void lin_bwd(kb_backend *b, float *din, float *dW, float *dbias, const float *dout, const float *in,
                    const uint16_t *in16, const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    cudaStream_t s = cu_st(b)->stream;
    if (N <= 0 || OC <= 0 || IC <= 0) {
        if (din && N > 0 && IC > 0) cu_check(b, cudaMemsetAsync(din, 0, (size_t)N * IC * sizeof(float), s), "linear_backward");
        if (dbias && N > 0 && OC > 0) cu_col_sums(b, dbias, dout, NULL, NULL, NULL, N, OC, 0);
        return;
    }
    if (!din && !dW) {
        if (dbias) cu_col_sums(b, dbias, dout, NULL, NULL, NULL, N, OC, 0);
        return;
    }
    const int bf = cu_mm_type(b);
    const void *dO = dout, *Wp = W, *X = in;
    if (bf) {
        uint16_t *d16 = (uint16_t *)cu_scratch(b, CU_SCR_B16, (size_t)N * OC * 2, "linear_backward");
        if (!d16) return;
        cu_to_bf16_raw(b, d16, dout, (size_t)N * OC);
        dO = d16;
        if (din) {
            if (!W16) {
                uint16_t *w = (uint16_t *)cu_scratch(b, CU_SCR_W16, (size_t)OC * IC * 2, "linear_backward");
                if (!w) return;
                cu_to_bf16_raw(b, w, W, (size_t)OC * IC);
                W16 = w;
            }
            Wp = W16;
        }
        if (dW && !in16) {
            uint16_t *x16 = (uint16_t *)cu_scratch(b, CU_SCR_A16, (size_t)N * IC * 2, "linear_backward");
            if (!x16) return;
            cu_to_bf16_raw(b, x16, in, (size_t)N * IC);
            in16 = x16;
        }
        if (dW) X = in16;
    }
    // din^T[IC,N] = W (stored IC x OC) x dout^T (stored OC x N)
    if (din && mm_run(b, IC, N, OC, 0, 0, bf, Wp, dO, din, NULL, 0, "linear_backward (input)"))
        no_algo(b, "linear_backward (input)", IC, N, OC, bf);
    if (dW) dw_product(b, dW, dbias, dout, X, dO, N, IC, OC, bf);
    else if (dbias) cu_col_sums(b, dbias, dout, NULL, NULL, NULL, N, OC, 0);
}

void cu_linear_backward(kb_backend *b, float *din, float *dW, float *dbias, const float *dout, const float *in,
                        const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    if (!cu_enter(b)) return;
    lin_bwd(b, din, dW, dbias, dout, in, NULL, W, W16, N, IC, OC);
}

// the bf16-activation forms are for bf16 mode only
static bool act16_mode(kb_backend *b, const char *op) {
    if (cu_mm_type(b) == CU_MM_BF16) return true;
    cu_fail(b, CO_EINVAL, op, "bf16 activations need the backend in bf16 mode (--bf16)");
    return false;
}

void cu_linear_forward_bf16(kb_backend *b, float *out, const kb_bf16 *in, const float *W, const kb_bf16 *W16,
                            const float *bias, int N, int IC, int OC) {
    if (!cu_enter(b) || N <= 0 || OC <= 0 || !act16_mode(b, "linear_forward_bf16")) return;
    lin_fwd(b, out, NULL, in, W, W16, bias, N, IC, OC);
}

void cu_linear_backward_bf16(kb_backend *b, float *din, float *dW, float *dbias, const float *dout,
                             const kb_bf16 *in, const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    if (!cu_enter(b) || !act16_mode(b, "linear_backward_bf16")) return;
    lin_bwd(b, din, dW, dbias, dout, NULL, in, W, W16, N, IC, OC);
}

// bf16 copies of an activation and a weight for a product (scratch slots given); W16 used if set
static bool mm_bf16_operands(kb_backend *b, const void **X, const void **Wp, const float *x, size_t nx, int xslot,
                             const float *W, const kb_bf16 *W16, size_t nw, const char *op) {
    uint16_t *x16 = (uint16_t *)cu_scratch(b, xslot, nx * 2, op);
    if (!x16) return false;
    cu_to_bf16_raw(b, x16, x, nx);
    *X = x16;
    if (!W16) {
        uint16_t *w = (uint16_t *)cu_scratch(b, CU_SCR_W16, nw * 2, op);
        if (!w) return false;
        cu_to_bf16_raw(b, w, W, nw);
        W16 = w;
    }
    *Wp = W16;
    return true;
}

void cu_linear_gelu_forward(kb_backend *b, float *out, float *pre, const float *in, const float *W,
                            const kb_bf16 *W16, const float *bias, int N, int IC, int OC) {
    if (!cu_enter(b) || N <= 0 || OC <= 0) return;
    if (IC > 0 && bias && OC % 8 == 0) {
        const bool bf = b->opt.bf16;
        const void *A = W, *B = in;
        if (bf && !mm_bf16_operands(b, &B, &A, in, (size_t)N * IC, CU_SCR_A16, W, W16, (size_t)OC * IC,
                                    "linear_gelu_forward"))
            return;
        // out^T[OC,N] = gelu(W^T' in^T + bias), pre^T[OC,N] the argument
        if (mm_run_epi(b, OC, N, IC, 1, 0, bf, A, B, out, EPI_GELU_AUX_BIAS, bias, pre, 0, "linear_gelu_forward") == 0)
            return;
    }
    cu_linear_forward(b, pre, in, W, W16, bias, N, IC, OC); // no epilogue for this shape
    cu_gelu_forward(b, out, pre, (size_t)N * OC);
}

void cu_linear_backward_dgelu(kb_backend *b, float *din, float *dbias, const float *dout, const float *W,
                              const kb_bf16 *W16, const float *pre, int N, int IC, int OC) {
    if (!cu_enter(b) || N <= 0 || IC <= 0) return;
    if (OC > 0 && dbias && IC % 8 == 0) {
        const bool bf = b->opt.bf16;
        const void *A = W, *B = dout;
        if (bf && !mm_bf16_operands(b, &B, &A, dout, (size_t)N * OC, CU_SCR_B16, W, W16, (size_t)OC * IC,
                                    "linear_backward_dgelu"))
            return;
        float *g = (float *)cu_scratch(b, CU_SCR_EPI, (size_t)IC * sizeof(float), "linear_backward_dgelu");
        if (!g) return;
        // din^T[IC,N] = (W (stored IC x OC) dout^T) * gelu'(pre^T); g = its row sums
        if (mm_run_epi(b, IC, N, OC, 0, 0, bf, A, B, din, EPI_DGELU_BGRAD, g, pre, 0, "linear_backward_dgelu") == 0) {
            cu_add(b, dbias, dbias, g, (size_t)IC); // the epilogue overwrites; the gradient accumulates
            return;
        }
    }
    cu_linear_backward(b, din, NULL, NULL, dout, NULL, W, W16, N, IC, OC);
    cu_gelu_backward(b, din, din, pre, (size_t)N * IC);
    if (dbias) cu_col_sums(b, dbias, din, NULL, NULL, NULL, N, IC, 0);
}

void cu_linear_gelu_forward_bf16(kb_backend *b, kb_bf16 *out, float *pre, const kb_bf16 *in, const float *W,
                                 const kb_bf16 *W16, const float *bias, int N, int IC, int OC) {
    if (!cu_enter(b) || N <= 0 || OC <= 0 || !act16_mode(b, "linear_gelu_forward_bf16")) return;
    if (IC > 0 && bias && OC % 8 == 0) {
        const void *A = W16;
        if (!W16) {
            uint16_t *w = (uint16_t *)cu_scratch(b, CU_SCR_W16, (size_t)OC * IC * 2, "linear_gelu_forward_bf16");
            if (!w) return;
            cu_to_bf16_raw(b, w, W, (size_t)OC * IC);
            A = w;
        }
        // out^T[OC,N] = bf16(gelu(W^T' in^T + bias)), pre^T[OC,N] (fp32) the argument
        if (mm_run_epi(b, OC, N, IC, 1, 0, CU_MM_BF16, A, in, out, EPI_GELU_AUX_BIAS, bias, pre, 0,
                       "linear_gelu_forward_bf16", 1) == 0)
            return;
    }
    lin_fwd(b, pre, NULL, in, W, W16, bias, N, IC, OC); // no bf16-output epilogue for this shape
    cu_gelu_forward_bf16(b, out, pre, (size_t)N * OC);
}
