// cuda_profile.cu - time spent on the GPU per kind of operation (bench/gpu_bench's report):
// with COHORT_CUDA_PROFILE=1 when the backend is made, its operation table is this file's,
// whose every entry records a cudaEvent before and after the real one on the backend's
// stream; the pairs are read at the next sync (or when the list is full, which waits) and
// added to the operation's category: attention, matrix products, elementwise (norms,
// activations, embeddings, cross-entropy, the optimizer, conversions), memory (zero, copy).
// Communication is not a backend operation (NCCL runs on its communicators' streams), so a
// single-GPU step has none. Off by default: the events cost a little and the full list waits.
#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cuda.h"

#include <stdlib.h>

#define PR_CAP 4096

struct cu_prof {
    const kb_ops *real;
    cudaEvent_t ev[2 * PR_CAP];
    int cat[PR_CAP];
    int n, made;
    double ms[CU_PROF_N];
};

static cu_prof *pr_of(kb_backend *b) { return (cu_prof *)cu_st(b)->prof; }

// reads the recorded pairs (their work has finished: called after a sync)
static void pr_collect(cu_prof *p) {
    for (int i = 0; i < p->n; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) == cudaSuccess) p->ms[p->cat[i]] += ms;
    }
    (void)cudaGetLastError();
    p->n = 0;
}

static int pr_begin(kb_backend *b) {
    cu_prof *p = pr_of(b);
    if (p->n == PR_CAP) { // full: wait for the last pair, then read them all
        cudaEventSynchronize(p->ev[2 * PR_CAP - 1]);
        pr_collect(p);
    }
    int i = p->n;
    for (; p->made < 2 * (i + 1); p->made++)
        if (cudaEventCreate(&p->ev[p->made]) != cudaSuccess) return -1;
    cudaEventRecord(p->ev[2 * i], cu_st(b)->stream);
    return i;
}

static void pr_end(kb_backend *b, int i, int cat) {
    cu_prof *p = pr_of(b);
    if (i < 0) return;
    cudaEventRecord(p->ev[2 * i + 1], cu_st(b)->stream);
    p->cat[i] = cat;
    p->n = i + 1;
}

#define R(b) (pr_of(b)->real)
// a wrapper of entry `name` in category cat: PARAMS its parameter list, ARGS the call's arguments
#define PW(cat, name, PARAMS, ARGS)                                                                                    \
    static void pw_##name PARAMS {                                                                                    \
        int i_ = pr_begin(b);                                                                                          \
        R(b)->name ARGS;                                                                                               \
        pr_end(b, i_, cat);                                                                                            \
    }
enum { K_ATT = CU_PROF_ATTENTION, K_MM = CU_PROF_PRODUCTS, K_EW = CU_PROF_ELEMENTWISE, K_MEM = CU_PROF_MEMORY };

PW(K_MEM, zero, (kb_backend * b, float *x, size_t n), (b, x, n))
PW(K_EW, to_bf16, (kb_backend * b, kb_bf16 *d, const float *s, size_t n), (b, d, s, n))
PW(K_MEM, copy, (kb_backend * b, void *d, const void *s, size_t n), (b, d, s, n))
PW(K_MM, linear_forward, (kb_backend * b, float *o, const float *i, const float *W, const kb_bf16 *W16, const float *bi,
                       int N, int IC, int OC), (b, o, i, W, W16, bi, N, IC, OC))
PW(K_MM, linear_backward, (kb_backend * b, float *di, float *dW, float *db, const float *d, const float *i,
                        const float *W, const kb_bf16 *W16, int N, int IC, int OC),
   (b, di, dW, db, d, i, W, W16, N, IC, OC))
PW(K_EW, embed_forward, (kb_backend * b, float *o, const int32_t *t, const int32_t *p, const float *wte, const float *wpe,
                      int N, int C), (b, o, t, p, wte, wpe, N, C))
PW(K_EW, embed_backward, (kb_backend * b, float *dwte, float *dwpe, const float *d, const int32_t *t, const int32_t *p,
                       int N, int C, int V), (b, dwte, dwpe, d, t, p, N, C, V))
PW(K_EW, norm_forward, (kb_backend * b, bool rms, float *o, float *mean, float *rstd, const float *i, const float *w,
                     const float *bi, int N, int C, float eps), (b, rms, o, mean, rstd, i, w, bi, N, C, eps))
PW(K_EW, norm_backward, (kb_backend * b, bool rms, float *di, float *dw, float *db, const float *d, const float *i,
                      const float *w, const float *mean, const float *rstd, int N, int C),
   (b, rms, di, dw, db, d, i, w, mean, rstd, N, C))
PW(K_EW, rope, (kb_backend * b, float *q, const int32_t *p, int N, int nh, int nkv, int hd, float base, bool inv),
   (b, q, p, N, nh, nkv, hd, base, inv))
PW(K_ATT, attention_forward, (kb_backend * b, float *o, float *l, const float *q, const int32_t *s, int B, int T, int nh,
                          int nkv, int hd, float p, uint64_t seed, uint64_t off),
   (b, o, l, q, s, B, T, nh, nkv, hd, p, seed, off))
PW(K_ATT, attention_backward, (kb_backend * b, float *dq, const float *d, const float *q, const float *o, const float *l,
                           const int32_t *s, int B, int T, int nh, int nkv, int hd, float p, uint64_t seed,
                           uint64_t off), (b, dq, d, q, o, l, s, B, T, nh, nkv, hd, p, seed, off))
PW(K_EW, gelu_forward, (kb_backend * b, float *o, const float *i, size_t n), (b, o, i, n))
PW(K_EW, gelu_backward, (kb_backend * b, float *di, const float *d, const float *i, size_t n), (b, di, d, i, n))
PW(K_EW, swiglu_forward, (kb_backend * b, float *o, const float *i, int N, int F), (b, o, i, N, F))
PW(K_EW, swiglu_backward, (kb_backend * b, float *di, const float *d, const float *i, int N, int F), (b, di, d, i, N, F))
PW(K_EW, add, (kb_backend * b, float *o, const float *x, const float *y, size_t n), (b, o, x, y, n))
PW(K_EW, scale, (kb_backend * b, float *x, float s, size_t n), (b, x, s, n))
PW(K_EW, dropout, (kb_backend * b, float *o, const float *i, size_t n, float p, uint64_t seed, uint64_t off),
   (b, o, i, n, p, seed, off))
PW(K_EW, cross_entropy, (kb_backend * b, float *l, float *lg, const int32_t *t, const float *ds, int N, int V),
   (b, l, lg, t, ds, N, V))
PW(K_EW, adamw, (kb_backend * b, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
              float eps, float wd, float gs, int64_t t), (b, p, g, m, v, n, lr, b1, b2, eps, wd, gs, t))
PW(K_EW, adamw_checksum, (kb_backend * b, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                       float b2, float eps, float wd, float gs, int64_t t, uint64_t seed, uint64_t *sum),
   (b, p, g, m, v, n, lr, b1, b2, eps, wd, gs, t, seed, sum))
PW(K_EW, sumsq_runs, (kb_backend * b, const float *const *x, const size_t *n, const int *end, int ng, double *out),
   (b, x, n, end, ng, out))
PW(K_EW, bias_add, (kb_backend * b, float *o, const float *bi, int N, int C), (b, o, bi, N, C))
PW(K_EW, bias_grad, (kb_backend * b, float *db, const float *d, int N, int C), (b, db, d, N, C))
PW(K_EW, ce_max, (kb_backend * b, float *mx, const float *lg, int N, int V), (b, mx, lg, N, V))
PW(K_EW, ce_sums, (kb_backend * b, float *s, const float *lg, const float *mx, const int32_t *t, int v0, int N, int V),
   (b, s, lg, mx, t, v0, N, V))
PW(K_EW, ce_grad, (kb_backend * b, float *l, float *lg, const float *mx, const float *s, const int32_t *t,
                const float *ds, int v0, int Vt, int N, int V), (b, l, lg, mx, s, t, ds, v0, Vt, N, V))
PW(K_MM, grouped_linear_forward, (kb_backend * b, float *o, const float *i, const float *W, const int32_t *off, int n,
                               int IC, int OC), (b, o, i, W, off, n, IC, OC))
PW(K_MM, grouped_linear_backward, (kb_backend * b, float *di, float *dW, const float *d, const float *i, const float *W,
                                const int32_t *off, int n, int IC, int OC), (b, di, dW, d, i, W, off, n, IC, OC))
PW(K_MM, linear_gelu_forward, (kb_backend * b, float *o, float *pre, const float *i, const float *W, const kb_bf16 *W16,
                            const float *bi, int N, int IC, int OC), (b, o, pre, i, W, W16, bi, N, IC, OC))
PW(K_MM, linear_backward_dgelu, (kb_backend * b, float *di, float *db, const float *d, const float *W,
                              const kb_bf16 *W16, const float *pre, int N, int IC, int OC),
   (b, di, db, d, W, W16, pre, N, IC, OC))

PW(K_MEM, copy_rows, (kb_backend * b, void *d, size_t dp, const void *s, size_t sp, size_t w, size_t r),
   (b, d, dp, s, sp, w, r))

// bf16 activations
PW(K_EW, norm_forward_bf16, (kb_backend * b, bool rms, kb_bf16 *o, float *mean, float *rstd, const float *i,
                            const float *w, const float *bi, int N, int C, float eps),
   (b, rms, o, mean, rstd, i, w, bi, N, C, eps))
PW(K_MM, linear_forward_bf16, (kb_backend * b, float *o, const kb_bf16 *i, const float *W, const kb_bf16 *W16,
                              const float *bi, int N, int IC, int OC), (b, o, i, W, W16, bi, N, IC, OC))
PW(K_MM, linear_backward_bf16, (kb_backend * b, float *di, float *dW, float *db, const float *d, const kb_bf16 *i,
                               const float *W, const kb_bf16 *W16, int N, int IC, int OC),
   (b, di, dW, db, d, i, W, W16, N, IC, OC))
PW(K_MM, linear_gelu_forward_bf16, (kb_backend * b, kb_bf16 *o, float *pre, const kb_bf16 *i, const float *W,
                                   const kb_bf16 *W16, const float *bi, int N, int IC, int OC),
   (b, o, pre, i, W, W16, bi, N, IC, OC))
PW(K_EW, swiglu_forward_bf16, (kb_backend * b, kb_bf16 *o, const float *i, int N, int F), (b, o, i, N, F))
PW(K_ATT, attention_forward_bf16, (kb_backend * b, kb_bf16 *o, float *l, const float *q, const int32_t *s, int B, int T,
                                  int nh, int nkv, int hd, float p, uint64_t seed, uint64_t off),
   (b, o, l, q, s, B, T, nh, nkv, hd, p, seed, off))
PW(K_ATT, attention_backward_bf16, (kb_backend * b, float *dq, const float *d, const float *q, const kb_bf16 *o,
                                   const float *l, const int32_t *s, int B, int T, int nh, int nkv, int hd, float p,
                                   uint64_t seed, uint64_t off),
   (b, dq, d, q, o, l, s, B, T, nh, nkv, hd, p, seed, off))

static void pw_sync(kb_backend *b) {
    R(b)->sync(b);
    pr_collect(pr_of(b));
}
static double pw_sumsq(kb_backend *b, const float *x, size_t n) { return R(b)->sumsq(b, x, n); } // waits itself
static uint64_t pw_checksum_runs(kb_backend *b, const float *const *x, const size_t *n, const uint64_t *seed, int k) {
    return R(b)->checksum_runs(b, x, n, seed, k);
}

// the profiling table: every entry of the real one, wrapped (NULL stays NULL)
static kb_ops pr_ops;

static void pr_table(const kb_ops *r) {
    pr_ops = *r;
#define SET(name) pr_ops.name = r->name ? pw_##name : NULL
    SET(zero), SET(to_bf16), SET(sync), SET(copy), SET(linear_forward), SET(linear_backward), SET(embed_forward);
    SET(embed_backward), SET(norm_forward), SET(norm_backward), SET(rope), SET(attention_forward);
    SET(attention_backward), SET(gelu_forward), SET(gelu_backward), SET(swiglu_forward), SET(swiglu_backward);
    SET(add), SET(scale), SET(dropout), SET(cross_entropy), SET(sumsq), SET(adamw), SET(adamw_checksum);
    SET(sumsq_runs), SET(checksum_runs), SET(bias_add), SET(bias_grad), SET(ce_max), SET(ce_sums), SET(ce_grad);
    SET(grouped_linear_forward), SET(grouped_linear_backward), SET(linear_gelu_forward), SET(linear_backward_dgelu);
    SET(norm_forward_bf16), SET(linear_forward_bf16), SET(linear_backward_bf16), SET(linear_gelu_forward_bf16);
    SET(swiglu_forward_bf16), SET(attention_forward_bf16), SET(attention_backward_bf16);
    SET(copy_rows);
#undef SET
}

void cu_profile_setup(kb_backend *b) {
    const char *e = getenv("COHORT_CUDA_PROFILE");
    if (!e || e[0] != '1') return;
    cu_prof *p = (cu_prof *)calloc(1, sizeof *p);
    if (!p) return; // not profiled
    p->real = b->ops;
    cu_st(b)->prof = p;
    pr_table(b->ops); // the same for every backend: the real table is cuda_ops
    b->ops = &pr_ops;
}

void cu_profile_release(cu_state *st) {
    cu_prof *p = (cu_prof *)st->prof;
    if (!p) return;
    for (int i = 0; i < p->made; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    st->prof = NULL;
}

extern "C" int cuda_backend_profile(kb_backend *b, double ms[CU_PROF_N]) {
    if (!b || !b->impl || !cu_st(b)->prof) return -1;
    cu_prof *p = pr_of(b);
    for (int i = 0; i < CU_PROF_N; i++) ms[i] = p->ms[i];
    return 0;
}
