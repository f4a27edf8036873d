// cuda_cp.cu - block attention on the GPU (backend.h: block_attention_forward/backward), the
// building block of context parallelism's ring attention (model/ring_attention.c,
// docs/context-parallel.md): a block of queries against a block of keys and values that may
// be another rank's, with the mask a mode (none, or causal over the same token set) and
// optional per-token document ids. Shapes and strides: kb_block_attn in kernels/backend.h.
//
// Plain and deterministic rather than fast: one thread per row, every sum over keys, queries,
// channels and the heads of a group in index order, no atomics, no shared memory. Forward:
// one thread per (b, h, query t), an online softmax over the keys it sees (the CPU's exp,
// cu_expf), out = O / L, lse = max + log L; a row that sees no key gets out = 0, lse = -inf.
// Backward, from the final (merged) out and lse: D = rowsum(dout * out) per row; one thread
// per (b, h, query) rebuilds P = exp(S scale - lse) and ADDS its dQ row; one per (b, group,
// key) walks the group's heads and the queries that see the key and ADDS dK, dV.
#include "kernels/cuda/cu_common.cuh"

#include <math.h>

#define BLK_THREADS 64
#define BLK_MAX_HD 128 // (the backend's head dimension bound, cu_attention_*)

struct blk_args {
    int B, Tq, Tk, nh, nkv, hd, rep, qbr, kbr;
    bool causal;
    float scale;
    const float *q, *k, *v;
    size_t qs, ks, vs;
    const int32_t *qdoc, *kdoc;
};

// may query t see key j (index rules and document ids)?
__device__ __forceinline__ bool blk_sees(const blk_args &a, int b, int t, int j) {
    if (a.causal && j > t) return false;
    return !a.qdoc || a.qdoc[(size_t)b * a.qbr + t] == a.kdoc[(size_t)b * a.kbr + j];
}

__device__ __forceinline__ const float *blk_q(const blk_args &a, int b, int t, int h) {
    return a.q + ((size_t)b * a.qbr + t) * a.qs + (size_t)h * a.hd;
}
__device__ __forceinline__ const float *blk_k(const blk_args &a, int b, int j, int g) {
    return a.k + ((size_t)b * a.kbr + j) * a.ks + (size_t)g * a.hd;
}
__device__ __forceinline__ const float *blk_v(const blk_args &a, int b, int j, int g) {
    return a.v + ((size_t)b * a.kbr + j) * a.vs + (size_t)g * a.hd;
}

__global__ void k_blk_fwd(float *__restrict__ out, float *__restrict__ lse, blk_args a) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.B * a.nh * a.Tq) return;
    const int t = (int)(i % a.Tq), h = (int)(i / a.Tq % a.nh), b = (int)(i / a.Tq / a.nh), g = h / a.rep, hd = a.hd;
    float q[BLK_MAX_HD], o[BLK_MAX_HD];
    const float *qr = blk_q(a, b, t, h);
    for (int d = 0; d < hd; d++) q[d] = qr[d] * a.scale, o[d] = 0.0f;
    float M = -INFINITY, L = 0.0f;
    const int jend = a.causal ? t + 1 : a.Tk;
    for (int j = 0; j < jend; j++) {
        if (!blk_sees(a, b, t, j)) continue;
        const float *kr = blk_k(a, b, j, g), *vr = blk_v(a, b, j, g);
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += q[d] * kr[d];
        const float mnew = s > M ? s : M, alpha = cu_expf(M - mnew), p = cu_expf(s - mnew);
        L = L * alpha + p;
        for (int d = 0; d < hd; d++) o[d] = o[d] * alpha + p * vr[d];
        M = mnew;
    }
    float *orow = out + ((size_t)b * a.Tq + t) * a.nh * hd + (size_t)h * hd;
    float *l = lse + ((size_t)b * a.nh + h) * a.Tq + t;
    if (L == 0.0f) { // no visible key
        for (int d = 0; d < hd; d++) orow[d] = 0.0f;
        *l = -INFINITY;
        return;
    }
    const float inv = 1.0f / L;
    for (int d = 0; d < hd; d++) orow[d] = o[d] * inv;
    *l = M + logf(L);
}

// D[(b nh + h) Tq + t] = dout . out of the row
__global__ void k_blk_dsum(float *__restrict__ D, const float *__restrict__ out, const float *__restrict__ dout,
                           blk_args a) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.B * a.nh * a.Tq) return;
    const int t = (int)(i % a.Tq), h = (int)(i / a.Tq % a.nh), b = (int)(i / a.Tq / a.nh);
    const size_t at = ((size_t)b * a.Tq + t) * a.nh * a.hd + (size_t)h * a.hd;
    float s = 0.0f;
    for (int d = 0; d < a.hd; d++) s += out[at + d] * dout[at + d];
    D[i] = s;
}

// p = P[t, j] of head h and ds = dS[t, j] * scale (0, 0 where t does not see j)
__device__ __forceinline__ void blk_p_ds(const blk_args &a, const float *__restrict__ lse, const float *__restrict__ D,
                                         const float *__restrict__ dout, int b, int h, int t, int j, float *p,
                                         float *ds) {
    *p = *ds = 0.0f;
    const size_t row = ((size_t)b * a.nh + h) * a.Tq + t;
    const float l = lse[row];
    if (l == -INFINITY || !blk_sees(a, b, t, j)) return;
    const int g = h / a.rep, hd = a.hd;
    const float *qr = blk_q(a, b, t, h), *kr = blk_k(a, b, j, g), *vr = blk_v(a, b, j, g);
    const float *dor = dout + ((size_t)b * a.Tq + t) * a.nh * hd + (size_t)h * hd;
    float s = 0.0f, dp = 0.0f;
    for (int d = 0; d < hd; d++) s += qr[d] * kr[d];
    for (int d = 0; d < hd; d++) dp += dor[d] * vr[d];
    *p = cu_expf(s * a.scale - l);
    *ds = *p * (dp - D[row]) * a.scale;
}

__global__ void k_blk_dq(float *__restrict__ dq, size_t dq_stride, const float *__restrict__ lse,
                         const float *__restrict__ D, const float *__restrict__ dout, blk_args a) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.B * a.nh * a.Tq) return;
    const int t = (int)(i % a.Tq), h = (int)(i / a.Tq % a.nh), b = (int)(i / a.Tq / a.nh), g = h / a.rep, hd = a.hd;
    float acc[BLK_MAX_HD];
    for (int d = 0; d < hd; d++) acc[d] = 0.0f;
    const int jend = a.causal ? t + 1 : a.Tk;
    for (int j = 0; j < jend; j++) {
        float p, ds;
        blk_p_ds(a, lse, D, dout, b, h, t, j, &p, &ds);
        if (p == 0.0f && ds == 0.0f) continue;
        const float *kr = blk_k(a, b, j, g);
        for (int d = 0; d < hd; d++) acc[d] += ds * kr[d];
    }
    float *r = dq + ((size_t)b * a.qbr + t) * dq_stride + (size_t)h * hd;
    for (int d = 0; d < hd; d++) r[d] += acc[d];
}

__global__ void k_blk_dkv(float *__restrict__ dk, size_t dk_stride, float *__restrict__ dv, size_t dv_stride,
                          const float *__restrict__ lse, const float *__restrict__ D, const float *__restrict__ dout,
                          blk_args a) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.B * a.nkv * a.Tk) return;
    const int j = (int)(i % a.Tk), g = (int)(i / a.Tk % a.nkv), b = (int)(i / a.Tk / a.nkv), hd = a.hd;
    float ak[BLK_MAX_HD], av[BLK_MAX_HD];
    for (int d = 0; d < hd; d++) ak[d] = av[d] = 0.0f;
    for (int h = g * a.rep; h < (g + 1) * a.rep; h++)
        for (int t = a.causal ? j : 0; t < a.Tq; t++) {
            float p, ds;
            blk_p_ds(a, lse, D, dout, b, h, t, j, &p, &ds);
            if (p == 0.0f && ds == 0.0f) continue;
            const float *qr = blk_q(a, b, t, h), *dor = dout + ((size_t)b * a.Tq + t) * a.nh * hd + (size_t)h * hd;
            for (int d = 0; d < hd; d++) ak[d] += ds * qr[d], av[d] += p * dor[d];
        }
    float *rk = dk + ((size_t)b * a.kbr + j) * dk_stride + (size_t)g * hd;
    float *rv = dv + ((size_t)b * a.kbr + j) * dv_stride + (size_t)g * hd;
    for (int d = 0; d < hd; d++) rk[d] += ak[d], rv[d] += av[d];
}

// checks the geometry as the CPU backend does; false (status set) when it cannot run
static bool blk_setup(kb_backend *b, const kb_block_attn *k, blk_args *a, const char *op) {
    const char *why = NULL;
    if (k->B < 0 || k->Tq < 0 || k->Tk < 0 || k->nh <= 0 || k->nkv <= 0 || k->hd <= 0) why = "bad sizes";
    else if (k->hd > BLK_MAX_HD) why = "head dimension above 128";
    else if (k->nh % k->nkv) why = "nh is not a multiple of nkv";
    else if (k->mask == KB_BLOCK_MASK_CAUSAL && k->Tq != k->Tk) why = "the causal mask needs Tq == Tk";
    else if (k->mask != KB_BLOCK_MASK_NONE && k->mask != KB_BLOCK_MASK_CAUSAL) why = "unknown mask mode";
    else if (!k->qdoc != !k->kdoc) why = "qdoc and kdoc must both be set or both be NULL";
    else if ((k->q_brows && k->q_brows < k->Tq) || (k->k_brows && k->k_brows < k->Tk))
        why = "rows per sequence smaller than the block";
    if (why) {
        b->status = co_err_set(CO_EINVAL, "%s: %s", op, why);
        return false;
    }
    *a = blk_args{k->B, k->Tq, k->Tk, k->nh, k->nkv, k->hd, k->nh / k->nkv, k->q_brows ? k->q_brows : k->Tq,
                  k->k_brows ? k->k_brows : k->Tk, k->mask == KB_BLOCK_MASK_CAUSAL, 1.0f / sqrtf((float)k->hd),
                  k->q, k->k, k->v, k->q_stride, k->k_stride, k->v_stride, k->qdoc, k->kdoc};
    return true;
}

void cu_block_attention_forward(kb_backend *b, const kb_block_attn *k, float *out, float *lse) {
    blk_args a;
    if (!cu_enter(b) || !blk_setup(b, k, &a, "block_attention_forward") || a.B == 0 || a.Tq == 0) return;
    size_t rows = (size_t)a.B * a.nh * a.Tq;
    k_blk_fwd<<<cu_blocks(rows, BLK_THREADS, 0x7fffffff), BLK_THREADS, 0, cu_st(b)->stream>>>(out, lse, a);
    cu_launched(b, "block_attention_forward");
}

void cu_block_attention_backward(kb_backend *b, const kb_block_attn *k, const float *out, const float *lse,
                                 const float *dout, float *dq, size_t dq_stride, float *dk, size_t dk_stride,
                                 float *dv, size_t dv_stride) {
    blk_args a;
    if (!cu_enter(b) || !blk_setup(b, k, &a, "block_attention_backward") || a.B == 0 || a.Tq == 0 || a.Tk == 0)
        return;
    size_t rows = (size_t)a.B * a.nh * a.Tq, keys = (size_t)a.B * a.nkv * a.Tk;
    float *D = (float *)cu_scratch(b, CU_SCR_ATT, rows * sizeof(float), "block_attention_backward");
    if (!D) return;
    cudaStream_t s = cu_st(b)->stream;
    k_blk_dsum<<<cu_blocks(rows, BLK_THREADS, 0x7fffffff), BLK_THREADS, 0, s>>>(D, out, dout, a);
    if (cu_launched(b, "block_attention_backward (D)")) return;
    k_blk_dq<<<cu_blocks(rows, BLK_THREADS, 0x7fffffff), BLK_THREADS, 0, s>>>(dq, dq_stride, lse, D, dout, a);
    if (cu_launched(b, "block_attention_backward (dq)")) return;
    k_blk_dkv<<<cu_blocks(keys, BLK_THREADS, 0x7fffffff), BLK_THREADS, 0, s>>>(dk, dk_stride, dv, dv_stride, lse, D,
                                                                               dout, a);
    cu_launched(b, "block_attention_backward (dk, dv)");
}
