// sim_blas.cc - the CUDA stand-in's cuBLASLt and cuBLAS: the calls kernels/cuda/cuda_matmul.cu
// and cuda_grouped.cu make, behind the real prototypes (cublasLt.h, cublas_api.h), computed
// in double from the documented semantics and rounded to the declared output type
// (tests/cudasim/, docs/testing.md).
//
// Column-major throughout: D[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C (+ bias[m] on every
// column with CUBLASLT_EPILOGUE_BIAS); beta == 0 does not read C. CUBLASLT_EPILOGUE_GELU_AUX_BIAS
// writes that (with the bias) to the fp32 aux matrix and gelu of it (tanh form) to D;
// CUBLASLT_EPILOGUE_DGELU_BGRAD multiplies it by gelu'(aux) and writes the row sums of the
// result (the bias gradient, overwritten) to the bias pointer; both need
// CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, a multiple of 8 and at least D's rows (cublasLt.h).
// CUBLASLT_EPILOGUE_BGRADB writes the column sums of op(B) (the sum over k for each of D's
// columns: the bias gradient of the weight-gradient product) to the bias pointer, overwritten.
// fp32, bf16 or fp16 A/B, fp32 C/D, CUBLAS_COMPUTE_32F; with bf16 A/B also bf16 C/D (D
// rounded to nearest even from the fp32 result; the GELU epilogue's aux then bf16 unless
// CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE says fp32). The products are queued on the stream like kernels, with their
// operands closed to the host until they have run (sim_runtime.cc).
// The cuBLASLt heuristic, as cublasLt.h documents, takes the alignment it may assume from
// the preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES and, for a bias epilogue, from
// the value of CUBLASLT_MATMUL_DESC_BIAS_POINTER at the time it is asked (unset: NULL, which
// every alignment divides); the algorithm it returns remembers them, and cublasLtMatmul
// refuses (CUBLAS_STATUS_INVALID_VALUE, logged) operands less aligned than that, where a GPU
// kernel would fault on a misaligned vector access or read the wrong bytes.
#include "sim_internal.h"

extern "C" {
#include "common/log.h"
}
// weak: a program that never logs does not link co_log, and the module then writes to stderr
#pragma weak co_log
#define co_log(level, ...) (co_log ? co_log(level, __VA_ARGS__) : (void)(fprintf(stderr, __VA_ARGS__), fputc('\n', stderr)))

#include <cublasLt.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

struct cublasLtContext {
    int magic;
};
struct cublasContext {
    cudaStream_t stream;
    void *ws;
    size_t ws_size;
    int atomics, pointer_mode, math_mode;
};

namespace {

using namespace cudasim;

const uint64_t ALGO_MAGIC = 0x63756461'73696d31ull; // "cudasim1"

struct mdesc {
    int32_t compute, scale, ta, tb;
    uint32_t epilogue;
    int32_t bias_type;
    const void *bias;
    void *aux;
    int64_t aux_ld;
    int32_t aux_type; // -1: D's type
};
struct mlayout {
    int32_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct mpref {
    uint64_t ws;
    uint32_t align[4]; // A B C D
};
static_assert(sizeof(mdesc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor fits");
static_assert(sizeof(mlayout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
static_assert(sizeof(mpref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference fits");

mdesc *D(cublasLtMatmulDesc_t d) { return (mdesc *)d->data; }
mlayout *L(cublasLtMatrixLayout_t l) { return (mlayout *)l->data; }
mpref *P(cublasLtMatmulPreference_t p) { return (mpref *)p->data; }

// the alignment an algorithm may rely on: at most 16 bytes (the widest vector access)
uint32_t align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 1;
    while (a < 16 && !(u & a)) a <<= 1;
    return a;
}

size_t type_size(int32_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 0; }

// an IEEE half's value (normal, subnormal, Inf, NaN), exactly
double half_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0x1f ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

// bf16's value, exactly, and a float rounded to bf16 (nearest even; NaN stays NaN) as the
// backend's cu_f2bf
float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// one column-major operand
struct mat {
    const void *p;
    int32_t type;
    int64_t ld;
    int trans;
    double at(int64_t i, int64_t j) const { // op(M)(i, j)
        int64_t r = trans ? j : i, c = trans ? i : j;
        size_t k = (size_t)(r + c * ld);
        if (type == CUDA_R_32F) return ((const float *)p)[k];
        if (type == CUDA_R_16F) return half_value(((const uint16_t *)p)[k]);
        uint32_t u = (uint32_t)((const uint16_t *)p)[k] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};

// D = alpha op(A) op(B) + beta C (+ bias[i]) in double, rounded to float
void gemm(int64_t m, int64_t n, int64_t k, float alpha, mat A, mat B, float beta, const float *C, int64_t ldc, float *Dp,
          int64_t ldd, const float *bias) {
    std::vector<double> col((size_t)m);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < m; i++) {
            double s = 0.0;
            for (int64_t p = 0; p < k; p++) s += A.at(i, p) * B.at(p, j);
            double v = (double)alpha * s;
            if (beta != 0.0f) v += (double)beta * C[i + j * ldc];
            if (bias) v += bias[i];
            col[(size_t)i] = v;
        }
        for (int64_t i = 0; i < m; i++) Dp[i + j * ldd] = (float)col[(size_t)i];
    }
}

// the GELU epilogues on D[m,n] (tanh form, in double): forward, aux = D and D = gelu(D);
// backward, D *= gelu'(aux) and bgrad[i] = sum over j of D(i, j) (overwritten)
void epilogue_gelu(int64_t m, int64_t n, float *Dp, int64_t ldd, float *aux, int64_t ldaux, bool backward, float *bgrad) {
    const double k = 0.7978845608028654, a = 0.044715;
    std::vector<double> rows(backward ? (size_t)m : 0, 0.0);
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float &d = Dp[i + j * ldd];
            if (!backward) {
                double x = d;
                aux[i + j * ldaux] = d;
                d = (float)(0.5 * x * (1.0 + tanh(k * (x + a * x * x * x))));
            } else {
                double x = aux[i + j * ldaux], t = tanh(k * (x + a * x * x * x));
                double g = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * a * x * x);
                d = (float)((double)d * g);
                rows[(size_t)i] += d;
            }
        }
    for (int64_t i = 0; backward && i < m; i++) bgrad[i] = (float)rows[(size_t)i];
}

cublasStatus_t refuse(const char *call, const std::string &why) {
    co_log(CO_LOG_ERROR, "cudasim: %s refused: %s", call, why.c_str());
    return CUBLAS_STATUS_INVALID_VALUE;
}

// the shapes, types and operation of a cuBLASLt product; "" when it is one this stand-in
// (and cuBLASLt for these types) can run, else why not
std::string lt_check(const mdesc *d, const mlayout *a, const mlayout *b, const mlayout *c, const mlayout *dd) {
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F) return "only CUBLAS_COMPUTE_32F with fp32 scale";
    if (a->type != b->type || !type_size(a->type)) return "A and B must both be fp32, both bf16 or both fp16";
    const bool d16 = dd->type == CUDA_R_16BF && c->type == CUDA_R_16BF && a->type == CUDA_R_16BF;
    if (!d16 && (c->type != CUDA_R_32F || dd->type != CUDA_R_32F))
        return "C and D must be fp32 (or both bf16 with bf16 A and B)";
    uint64_t am = d->ta ? a->cols : a->rows, ak = d->ta ? a->rows : a->cols;
    uint64_t bk = d->tb ? b->cols : b->rows, bn = d->tb ? b->rows : b->cols;
    if (ak != bk || am != c->rows || bn != c->cols || c->rows != dd->rows || c->cols != dd->cols)
        return "operand shapes do not agree";
    if (a->ld < (int64_t)a->rows || b->ld < (int64_t)b->rows || c->ld < (int64_t)c->rows || dd->ld < (int64_t)dd->rows)
        return "a leading dimension is smaller than its matrix's rows";
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS &&
        d->epilogue != CUBLASLT_EPILOGUE_GELU_AUX_BIAS && d->epilogue != CUBLASLT_EPILOGUE_DGELU_BGRAD &&
        d->epilogue != CUBLASLT_EPILOGUE_BGRADB)
        return "epilogue " + std::to_string(d->epilogue) + " is not modelled";
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->bias_type != CUDA_R_32F) return "the bias must be fp32";
    if (d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        if (d->aux_ld % 8 || d->aux_ld < (int64_t)dd->rows)
            return "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD " + std::to_string(d->aux_ld) +
                   " must be a multiple of 8 and at least D's rows";
        int32_t at = d->aux_type < 0 ? dd->type : d->aux_type;
        if (at != CUDA_R_32F && !(d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS && at == CUDA_R_16BF))
            return "the GELU epilogue's aux matrix must be fp32 (or bf16 for GELU_AUX_BIAS)";
    }
    if (d16 && (d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD || d->epilogue == CUBLASLT_EPILOGUE_BGRADB))
        return "the bias-gradient epilogues are modelled with fp32 D only";
    return "";
}

} // namespace

extern "C" {

// ---- cuBLASLt ----

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = new cublasLtContext{1};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t st) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    *d = new cublasLtMatmulDescOpaque_t();
    mdesc *m = D(*d);
    m->compute = ct, m->scale = st, m->ta = m->tb = CUBLAS_OP_N, m->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    m->bias_type = CUDA_R_32F, m->bias = NULL, m->aux = NULL, m->aux_ld = 0, m->aux_type = -1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t n) {
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    mdesc *m = D(d);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: {
        if (n != 4) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t v;
        memcpy(&v, buf, 4);
        if (attr == CUBLASLT_MATMUL_DESC_TRANSA) m->ta = v;
        else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) m->tb = v;
        else if (attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) m->bias_type = v;
        else if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE) m->aux_type = v;
        else if (attr == CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) m->compute = v;
        else m->scale = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (n != 4) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&m->epilogue, buf, 4);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (n != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&m->bias, buf, sizeof(void *));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        if (n != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&m->aux, buf, sizeof(void *));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        if (n != 8) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&m->aux_ld, buf, 8);
        return CUBLAS_STATUS_SUCCESS;
    default: return refuse("cublasLtMatmulDescSetAttribute", "attribute " + std::to_string((int)attr) + " is not modelled");
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new cublasLtMatrixLayoutOpaque_t();
    mlayout *x = L(*l);
    x->type = type, x->rows = rows, x->cols = cols, x->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    *p = new cublasLtMatmulPreferenceOpaque_t();
    mpref *x = P(*p);
    for (int i = 0; i < 4; i++) x->align[i] = 256; // cublasLt.h: the default assumes 256-byte alignment
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t n) {
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    mpref *x = P(p);
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (n != 8) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&x->ws, buf, 8);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (n != 4) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&x->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
        return CUBLAS_STATUS_SUCCESS;
    }
    return refuse("cublasLtMatmulPreferenceSetAttribute", "attribute " + std::to_string((int)attr) + " is not modelled");
}

// algo->data: [0] magic, [1] alignment assumed for A/B/C/D, [2] for the bias (0: no bias)
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t pref, int req,
                                              cublasLtMatmulHeuristicResult_t res[], int *count) {
    if (!h || !d || !a || !b || !c || !dd || !pref || req < 1 || !res || !count) return CUBLAS_STATUS_INVALID_VALUE;
    *count = 0;
    std::string why = lt_check(D(d), L(a), L(b), L(c), L(dd));
    if (!why.empty()) {
        co_log(CO_LOG_WARN, "cudasim: cublasLtMatmulAlgoGetHeuristic: no algorithm: %s", why.c_str());
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    memset(&res[0], 0, sizeof res[0]);
    uint32_t al = 256;
    for (int i = 0; i < 4; i++) al = P(pref)->align[i] < al ? P(pref)->align[i] : al;
    res[0].algo.data[0] = ALGO_MAGIC;
    res[0].algo.data[1] = al < 16 ? al : 16;
    // the bias pointer set now is the one whose alignment the algorithm may assume
    const bool epi_bias = D(d)->epilogue == CUBLASLT_EPILOGUE_BIAS || D(d)->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (epi_bias && !D(d)->bias)
        co_log(CO_LOG_WARN, "cudasim: cublasLtMatmulAlgoGetHeuristic asked for a bias epilogue before "
                            "CUBLASLT_MATMUL_DESC_BIAS_POINTER is set: the algorithm assumes a 16-byte aligned bias");
    res[0].algo.data[2] = epi_bias ? align_of(D(d)->bias) : 0;
    res[0].workspaceSize = 0;
    res[0].state = CUBLAS_STATUS_SUCCESS;
    res[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *Dp, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_size, cudaStream_t s) {
    (void)ws, (void)ws_size;
    if (!h || !d || !a || !b || !c || !dd || !alpha || !beta || !A || !B || !Dp) return CUBLAS_STATUS_INVALID_VALUE;
    const mdesc m = *D(d);
    const mlayout la = *L(a), lb = *L(b), lc = *L(c), ld = *L(dd);
    std::string why = lt_check(&m, &la, &lb, &lc, &ld);
    if (!why.empty()) return refuse("cublasLtMatmul", why);
    const bool gelu = m.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS, dgelu = m.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const bool bias = m.epilogue == CUBLASLT_EPILOGUE_BIAS || gelu, bgradb = m.epilogue == CUBLASLT_EPILOGUE_BGRADB;
    if ((bias || dgelu || bgradb) && !m.bias)
        return refuse("cublasLtMatmul", "a bias epilogue with no CUBLASLT_MATMUL_DESC_BIAS_POINTER");
    if ((gelu || dgelu) && !m.aux)
        return refuse("cublasLtMatmul", "a GELU epilogue with no CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER");
    if (algo) {
        if (algo->data[0] != ALGO_MAGIC) return refuse("cublasLtMatmul", "the algorithm is not one the heuristic returned");
        const void *ops[4] = {A, B, C, Dp};
        for (int i = 0; i < 4; i++)
            if (align_of(ops[i]) < algo->data[1]) {
                char w[200];
                snprintf(w, sizeof w, "operand %c at %p is %u-byte aligned; the algorithm was chosen for %u-byte alignment",
                         "ABCD"[i], ops[i], align_of(ops[i]), (unsigned)algo->data[1]);
                return refuse("cublasLtMatmul", w);
            }
        if (bias && align_of(m.bias) < algo->data[2]) {
            char w[300];
            snprintf(w, sizeof w,
                     "the bias at %p is %u-byte aligned, but the algorithm was chosen for a bias aligned to %u bytes "
                     "(the heuristic takes the alignment from CUBLASLT_MATMUL_DESC_BIAS_POINTER as set when it is asked)",
                     m.bias, align_of(m.bias), (unsigned)algo->data[2]);
            return refuse("cublasLtMatmul", w);
        }
    }
    float al, be;
    memcpy(&al, alpha, 4);
    memcpy(&be, beta, 4);
    const float *bp = bias ? (const float *)m.bias : NULL;
    mat MA{A, la.type, la.ld, m.ta != CUBLAS_OP_N}, MB{B, lb.type, lb.ld, m.tb != CUBLAS_OP_N};
    int64_t M = (int64_t)ld.rows, N = (int64_t)ld.cols, K = (int64_t)(m.ta != CUBLAS_OP_N ? la.rows : la.cols);
    const float *Cp = (const float *)C;
    int64_t ldc = lc.ld, ldd = ld.ld;
    float *Dout = (float *)Dp;
    float *aux = (float *)m.aux, *bgrad = dgelu || bgradb ? (float *)m.bias : NULL;
    const int64_t aux_ld = m.aux_ld;
    const bool d16 = ld.type == CUDA_R_16BF, aux16 = (m.aux_type < 0 ? ld.type : m.aux_type) == CUDA_R_16BF;
    cudaError_t e = enqueue(
        s, "cublasLtMatmul",
        [=]() {
            if (bgradb) // the column sums of op(B), from its elements as stored (before the product)
                for (int64_t j = 0; j < N; j++) {
                    double sum = 0.0;
                    for (int64_t p = 0; p < K; p++) sum += MB.at(p, j);
                    bgrad[j] = (float)sum;
                }
            if (!d16) {
                gemm(M, N, K, al, MA, MB, be, Cp, ldc, Dout, ldd, bp);
                if (gelu || dgelu) epilogue_gelu(M, N, Dout, ldd, aux, aux_ld, dgelu, bgrad);
                return;
            }
            // bf16 D (and C): the fp32 result, its epilogue, then rounded to bf16
            std::vector<float> c32((size_t)ldc * N), d32((size_t)M * N), a32(aux ? (size_t)M * N : 0);
            if (be != 0.0f)
                for (size_t i = 0; i < c32.size(); i++) c32[i] = bf16_value(((const uint16_t *)Cp)[i]);
            gemm(M, N, K, al, MA, MB, be, c32.data(), ldc, d32.data(), M, bp);
            if (gelu) epilogue_gelu(M, N, d32.data(), M, a32.data(), M, false, NULL);
            for (int64_t j = 0; j < N; j++)
                for (int64_t i = 0; i < M; i++) {
                    float v = d32[(size_t)(i + j * M)];
                    ((uint16_t *)Dout)[i + j * ldd] = bf16_round(v);
                    if (!gelu) continue;
                    float x = a32[(size_t)(i + j * M)];
                    if (aux16) ((uint16_t *)aux)[i + j * aux_ld] = bf16_round(x);
                    else aux[i + j * aux_ld] = x;
                }
        },
        {A, B, C, Dp, bp, aux, bgrad});
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// ---- cuBLAS ----

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = new cublasContext();
    (*h)->pointer_mode = CUBLAS_POINTER_MODE_HOST;
    (*h)->atomics = CUBLAS_ATOMICS_NOT_ALLOWED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    h->ws = NULL, h->ws_size = 0; // cuBLAS: setting the stream resets the workspace to the default pool
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t n) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->ws = ws, h->ws_size = n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetAtomicsMode(cublasHandle_t h, cublasAtomicsMode_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->atomics = m;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t h, cublasPointerMode_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->pointer_mode = m;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math_mode = m;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t check_dims(const char *call, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc) {
    if (m < 0 || n < 0 || k < 0) return refuse(call, "negative dimension");
    if (lda < (ta != CUBLAS_OP_N ? k : m) || lda < 1 || ldb < (tb != CUBLAS_OP_N ? n : k) || ldb < 1 || ldc < m ||
        ldc < 1)
        return refuse(call, "a leading dimension is too small");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return refuse("cublasSgemm", "only host scalars are modelled");
    cublasStatus_t st = check_dims("cublasSgemm", ta, tb, m, n, k, lda, ldb, ldc);
    if (st) return st;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    float al = *alpha, be = *beta;
    mat MA{A, CUDA_R_32F, lda, ta != CUBLAS_OP_N}, MB{B, CUDA_R_32F, ldb, tb != CUBLAS_OP_N};
    cudaError_t e = enqueue(h->stream, "cublasSgemm", [=]() { gemm(m, n, k, al, MA, MB, be, C, ldc, C, ldc, NULL); },
                            {A, B, C});
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// Host arrays (operations, dimensions, scalars, group sizes) are read during the call; the
// A/B/C pointer arrays are device memory, read when the product runs on the stream.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[],
                                          const int m[], const int n[], const int k[], const void *alpha,
                                          const void *const Aarray[], cudaDataType_t at, const int lda[],
                                          const void *const Barray[], cudaDataType_t bt, const int ldb[],
                                          const void *beta, void *const Carray[], cudaDataType_t ct, const int ldc[],
                                          int groups, const int gsize[], cublasComputeType_t comp) {
    const char *call = "cublasGemmGroupedBatchedEx";
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
        return refuse(call, "only fp32 with CUBLAS_COMPUTE_32F is modelled");
    if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return refuse(call, "only host scalars are modelled");
    if (groups < 0) return refuse(call, "negative group count");
    struct grp {
        int ta, tb, m, n, k, lda, ldb, ldc, size;
        float alpha, beta;
    };
    std::vector<grp> g((size_t)groups);
    int total = 0;
    for (int i = 0; i < groups; i++) {
        cublasStatus_t st = check_dims(call, ta[i], tb[i], m[i], n[i], k[i], lda[i], ldb[i], ldc[i]);
        if (st) return st;
        if (gsize[i] < 0) return refuse(call, "negative group size");
        g[(size_t)i] = grp{ta[i], tb[i], m[i], n[i], k[i], lda[i], ldb[i], ldc[i], gsize[i], ((const float *)alpha)[i],
                           ((const float *)beta)[i]};
        total += gsize[i];
    }
    cudaPointerAttributes pa;
    for (const void *arr : {(const void *)Aarray, (const void *)Barray, (const void *)Carray})
        if (total > 0 && (cudaPointerGetAttributes(&pa, arr) != cudaSuccess || pa.type == cudaMemoryTypeUnregistered ||
                          pa.type == cudaMemoryTypeHost))
            return refuse(call, "the A/B/C pointer arrays must be in device memory (cuBLAS documents them so)");
    cudaError_t e = enqueue(h->stream, call, [=]() {
        int p = 0;
        for (const grp &x : g)
            for (int j = 0; j < x.size; j++, p++) {
                mat MA{Aarray[p], CUDA_R_32F, x.lda, x.ta != CUBLAS_OP_N}, MB{Barray[p], CUDA_R_32F, x.ldb, x.tb != CUBLAS_OP_N};
                float *C = (float *)Carray[p];
                gemm(x.m, x.n, x.k, x.alpha, MA, MB, x.beta, C, x.ldc, C, x.ldc, NULL);
            }
    }, {Aarray, Barray, Carray});
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // extern "C"
