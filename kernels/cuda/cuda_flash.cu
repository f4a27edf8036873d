// cuda_flash.cu - causal grouped-query attention on tensor cores (bf16 mode): the products
// Q K^T, P V, dO V^T, dS K, P^T dO and dS^T Q as WMMA 16x16x16 bf16 fragments with fp32
// accumulation; softmax, masks, dropout and the log-sum-exp in fp32 on CUDA cores.
//
// Used by cu_attention_forward/backward (cuda_attention.cu) when the backend runs in bf16
// mode and the head dimension is 64 or 128 (the template's HD); other head dimensions, and
// fp32 mode, take the fp32 kernels of cuda_attention.cu. Same layout, masks, dropout counters
// and outputs as the CPU backend (kernels/backend.h): qkv and dout are read as fp32 and
// rounded to bf16 as they are staged in shared memory; out, lse and dqkv are fp32.
//
// A block is 2 warps and 32 rows (queries, or keys in the dK/dV kernel); warp w owns rows
// 16w..16w+15. Tiles of 32 keys (queries) are staged in shared memory as bf16. Forward: two
// passes over the key tiles, the first for each row's max and sum (so the log-sum-exp is
// known), the second accumulates P V with P = exp(S - lse) already normalised, so the output
// accumulators are never rescaled (their element layout in a fragment is unspecified). The
// backward recomputes P from lse: one kernel per query block for dQ, one per key block for
// dK and dV (per head; with grouped queries summed over each group's heads in head order).
// No atomics; every sum has a fixed order: bitwise repeatable.
#include "kernels/cuda/cu_common.cuh"

#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>
#include <stdlib.h>

namespace wm = nvcuda::wmma;

#define FL_ROWS 32    // rows of a block and of a staged tile
#define FL_THREADS 64 // 2 warps of 16 rows

typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> fa_row;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> fb_row;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> fb_col;
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> facc;

struct fl_args {
    int B, T, nh, nkv, rep;
    size_t R; // row stride of qkv
    float scale, p_drop, inv_keep;
    uint64_t seed, offset;
    const int32_t *seg;
};

__device__ __forceinline__ __nv_bfloat16 fl_bf(float x) { return __ushort_as_bfloat16(cu_f2bf(x)); }

// S[FL_ROWS][HD] (bf16) = rows [r0, r0 + FL_ROWS) of the head at column col of an fp32 matrix
// with row stride `stride` (zeros past T). S is a template parameter so that the CUDA
// stand-in (tests/cudasim/) can pass its checked shared-memory pointer.
template <int HD, typename P>
__device__ __forceinline__ void fl_stage(P S, const float *base, size_t stride, size_t col, int r0, int T) {
    for (int idx = threadIdx.x; idx < FL_ROWS * HD; idx += FL_THREADS) {
        int rr = idx / HD, d = idx % HD, r = r0 + rr;
        S[idx] = fl_bf(r < T ? base[(size_t)r * stride + col + d] : 0.0f);
    }
}

// C[16][FL_ROWS] (fp32, row stride FL_ROWS) = A[16 rows of a, HD] B^T where b holds FL_ROWS
// rows of HD: the scores of 16 rows against a tile
template <int HD, typename PA, typename PB, typename PC>
__device__ __forceinline__ void fl_scores(PC C, PA a, PB b) {
    fa_row fa;
    fb_col fb;
    facc acc;
#pragma unroll
    for (int n = 0; n < FL_ROWS / 16; n++) {
        wm::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < HD / 16; k++) {
            wm::load_matrix_sync(fa, a + k * 16, HD);
            wm::load_matrix_sync(fb, b + n * 16 * HD + k * 16, HD);
            wm::mma_sync(acc, fa, fb, acc);
        }
        wm::store_matrix_sync(C + n * 16, acc, FL_ROWS, wm::mem_row_major);
    }
}

// acc[d] += P[16][FL_ROWS] (bf16) V[FL_ROWS][HD] (bf16) for each 16-column block d of HD
template <int HD, typename PP, typename PV>
__device__ __forceinline__ void fl_accum(facc *acc, PP p, PV v) {
    fa_row fa;
    fb_row fb;
#pragma unroll
    for (int n = 0; n < FL_ROWS / 16; n++) {
        wm::load_matrix_sync(fa, p + n * 16, FL_ROWS);
#pragma unroll
        for (int d = 0; d < HD / 16; d++) {
            wm::load_matrix_sync(fb, v + n * 16 * HD + d * 16, HD);
            wm::mma_sync(acc[d], fa, fb, acc[d]);
        }
    }
}

// rows [0, 16) of acc (16 x HD) to dst rows: row i to dst + i * stride, for rows i with
// row0 + i < T; through the warp's fp32 scratch C (16 x FL_ROWS)
template <int HD, typename OT, typename PC>
__device__ __forceinline__ void fl_write(OT *dst, size_t stride, int row0, int T, const facc *acc, PC C) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int d = 0; d < HD / 16; d++) {
        __syncwarp();
        wm::store_matrix_sync(C, acc[d], FL_ROWS, wm::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            int i = e >> 4, c = e & 15;
            if (row0 + i < T) cu_put(&dst[(size_t)i * stride + d * 16 + c], C[i * FL_ROWS + c]);
        }
    }
}

// the first key any query of the block [t0, t0 + FL_ROWS) sees, rounded down to a tile
__device__ __forceinline__ int fl_first_tile(const int32_t *seg, int t0, int T) {
    int jm = 0;
    if (seg) {
        jm = t0;
        for (int i = 0; i < FL_ROWS && t0 + i < T; i++) jm = min(jm, seg[t0 + i]);
    }
    return (max(jm, 0) / FL_ROWS) * FL_ROWS;
}

template <int HD, typename OT> // OT: the output's type, float or uint16_t (bf16 activations)
__global__ void __launch_bounds__(FL_THREADS) k_flash_fwd(OT *__restrict__ out, float *__restrict__ lse,
                                                          const float *__restrict__ qkv, fl_args a) {
    __shared__ __align__(32) __nv_bfloat16 Qs[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Ks[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Vs[FL_ROWS * HD];
    __shared__ __align__(32) float Ss[2 * 16 * FL_ROWS];
    __shared__ __align__(32) __nv_bfloat16 Ps[2 * 16 * FL_ROWS];
    __shared__ float s_lse[FL_ROWS];
    const int T = a.T, nh = a.nh;
    const int bh = blockIdx.y, b = bh / nh, h = bh % nh, grp = h / a.rep;
    const int t0 = blockIdx.x * FL_ROWS, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, c0 = (lane & 1) * 16, t = t0 + 16 * w + r; // this lane's row and columns
    const bool live = t < T;
    const float *base = qkv + (size_t)b * T * a.R;
    const int32_t *seg = a.seg ? a.seg + (size_t)b * T : NULL;
    const int lo = live && seg ? seg[t] : 0;
    auto S = Ss + w * 16 * FL_ROWS;
    auto P = Ps + w * 16 * FL_ROWS;
    fl_stage<HD>(Qs, base, a.R, (size_t)h * HD, t0, T);
    const int jbeg = fl_first_tile(seg, t0, T), jend = min(T, t0 + FL_ROWS);
    // pass 1: row max and sum; lane keeps its 16 columns' running (m, l), pairs merge at the end
    float m = -INFINITY, l = 0.0f;
    for (int j0 = jbeg; j0 < jend; j0 += FL_ROWS) {
        __syncthreads(); // Qs staged; the previous tile consumed
        fl_stage<HD>(Ks, base, a.R, (size_t)(nh + grp) * HD, j0, T);
        __syncthreads();
        fl_scores<HD>(S, Qs + w * 16 * HD, Ks);
        __syncwarp();
        for (int c = c0; c < c0 + 16; c++) {
            int j = j0 + c;
            if (!(live && j >= lo && j <= t)) continue;
            float s = S[r * FL_ROWS + c] * a.scale;
            if (s > m) {
                l = l * cu_expf(m - s) + 1.0f;
                m = s;
            } else {
                l += cu_expf(s - m);
            }
        }
    }
    {
        float m2 = __shfl_xor_sync(0xffffffffu, m, 1), l2 = __shfl_xor_sync(0xffffffffu, l, 1);
        float mm = fmaxf(m, m2);
        // the even lane's columns first: the same sum on both lanes
        float la = (lane & 1) ? l2 : l, ma = (lane & 1) ? m2 : m, lb = (lane & 1) ? l : l2, mb = (lane & 1) ? m : m2;
        float ls = mm == -INFINITY ? 0.0f : la * cu_expf(ma - mm) + lb * cu_expf(mb - mm);
        if ((lane & 1) == 0) s_lse[16 * w + r] = ls > 0.0f ? mm + logf(ls) : -INFINITY;
    }
    __syncwarp();
    const float lrow = s_lse[16 * w + r];
    const uint64_t ctr = a.offset + (((uint64_t)b * nh + h) * (uint64_t)T + (uint64_t)t) * (uint64_t)T;
    // pass 2: O = sum over tiles of exp(S - lse) V
    facc acc[HD / 16];
#pragma unroll
    for (int d = 0; d < HD / 16; d++) wm::fill_fragment(acc[d], 0.0f);
    for (int j0 = jbeg; j0 < jend; j0 += FL_ROWS) {
        __syncthreads();
        fl_stage<HD>(Ks, base, a.R, (size_t)(nh + grp) * HD, j0, T);
        fl_stage<HD>(Vs, base, a.R, (size_t)(nh + a.nkv + grp) * HD, j0, T);
        __syncthreads();
        fl_scores<HD>(S, Qs + w * 16 * HD, Ks);
        __syncwarp();
        for (int c = c0; c < c0 + 16; c++) {
            int j = j0 + c;
            float p = 0.0f;
            if (live && j >= lo && j <= t) {
                p = cu_expf(S[r * FL_ROWS + c] * a.scale - lrow);
                if (a.p_drop > 0.0f) p *= cu_keep(a.seed, ctr + (uint64_t)j, a.p_drop) ? a.inv_keep : 0.0f;
            }
            P[r * FL_ROWS + c] = fl_bf(p);
        }
        __syncwarp();
        fl_accum<HD>(acc, P, Vs);
    }
    const int row0 = t0 + 16 * w;
    fl_write<HD>(out + ((size_t)b * T + row0) * (size_t)(nh * HD) + (size_t)h * HD, (size_t)nh * HD, row0, T, acc, S);
    if (live && (lane & 1) == 0) lse[((size_t)b * nh + h) * T + t] = lrow;
}

// dQ of 32 queries of head h: dS = P (dP - D) scale with dP = dO V^T, dQ = dS K
template <int HD>
__global__ void __launch_bounds__(FL_THREADS) k_flash_dq(float *__restrict__ dqkv, const float *__restrict__ dout,
                                                         const float *__restrict__ qkv, const float *__restrict__ lse,
                                                         const float *__restrict__ D, fl_args a) {
    __shared__ __align__(32) __nv_bfloat16 Qs[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Gs[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Ks[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Vs[FL_ROWS * HD];
    __shared__ __align__(32) float Ss[2 * 16 * FL_ROWS];
    __shared__ __align__(32) __nv_bfloat16 Ps[2 * 16 * FL_ROWS];
    const int T = a.T, nh = a.nh;
    const int bh = blockIdx.y, b = bh / nh, h = bh % nh, grp = h / a.rep;
    const int t0 = blockIdx.x * FL_ROWS, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, c0 = (lane & 1) * 16, t = t0 + 16 * w + r;
    const bool live = t < T;
    const float *base = qkv + (size_t)b * T * a.R;
    const size_t nhd = (size_t)nh * HD;
    const int32_t *seg = a.seg ? a.seg + (size_t)b * T : NULL;
    const int lo = live && seg ? seg[t] : 0;
    const float lrow = live ? lse[((size_t)b * nh + h) * T + t] : 0.0f;
    const float Dt = live ? D[((size_t)b * nh + h) * T + t] : 0.0f;
    const uint64_t ctr = a.offset + (((uint64_t)b * nh + h) * (uint64_t)T + (uint64_t)t) * (uint64_t)T;
    auto S = Ss + w * 16 * FL_ROWS;
    auto P = Ps + w * 16 * FL_ROWS;
    fl_stage<HD>(Qs, base, a.R, (size_t)h * HD, t0, T);
    fl_stage<HD>(Gs, dout + (size_t)b * T * nhd, nhd, (size_t)h * HD, t0, T);
    facc acc[HD / 16];
#pragma unroll
    for (int d = 0; d < HD / 16; d++) wm::fill_fragment(acc[d], 0.0f);
    const int jbeg = fl_first_tile(seg, t0, T), jend = min(T, t0 + FL_ROWS);
    for (int j0 = jbeg; j0 < jend; j0 += FL_ROWS) {
        __syncthreads();
        fl_stage<HD>(Ks, base, a.R, (size_t)(nh + grp) * HD, j0, T);
        fl_stage<HD>(Vs, base, a.R, (size_t)(nh + a.nkv + grp) * HD, j0, T);
        __syncthreads();
        float sv[16];
        fl_scores<HD>(S, Qs + w * 16 * HD, Ks);
        __syncwarp();
        for (int c = 0; c < 16; c++) sv[c] = S[r * FL_ROWS + c0 + c];
        __syncwarp();
        fl_scores<HD>(S, Gs + w * 16 * HD, Vs); // dP
        __syncwarp();
        for (int c = 0; c < 16; c++) {
            int j = j0 + c0 + c;
            float ds = 0.0f;
            if (live && j >= lo && j <= t) {
                float pr = cu_expf(sv[c] * a.scale - lrow);
                float kp = a.p_drop > 0.0f ? (cu_keep(a.seed, ctr + (uint64_t)j, a.p_drop) ? a.inv_keep : 0.0f) : 1.0f;
                ds = pr * (S[r * FL_ROWS + c0 + c] * kp - Dt) * a.scale;
            }
            P[r * FL_ROWS + c0 + c] = fl_bf(ds);
        }
        __syncwarp();
        fl_accum<HD>(acc, P, Ks);
    }
    const int row0 = t0 + 16 * w;
    __syncwarp();
    fl_write<HD>(dqkv + ((size_t)b * T + row0) * a.R + (size_t)h * HD, a.R, row0, T, acc, S);
}

// dK, dV of 32 keys of head h: dV = P^T dO, dK = dS^T Q, over the query tiles that see them;
// written to rows [(b nh + h) T + j] of dk / dv with row stride ostride (direct: rows b T + j
// of dqkv at the group's key / value columns)
template <int HD>
__global__ void __launch_bounds__(FL_THREADS) k_flash_dkv(float *__restrict__ dk, float *__restrict__ dv,
                                                          size_t ostride, int direct, const float *__restrict__ dout,
                                                          const float *__restrict__ qkv,
                                                          const float *__restrict__ lse,
                                                          const float *__restrict__ D, fl_args a) {
    __shared__ __align__(32) __nv_bfloat16 Ks[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Vs[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Qs[FL_ROWS * HD];
    __shared__ __align__(32) __nv_bfloat16 Gs[FL_ROWS * HD];
    __shared__ __align__(32) float Ss[2 * 16 * FL_ROWS];
    __shared__ __align__(32) __nv_bfloat16 Ps[2 * 16 * FL_ROWS];
    __shared__ __align__(32) __nv_bfloat16 Es[2 * 16 * FL_ROWS];
    __shared__ float s_l[FL_ROWS], s_D[FL_ROWS];
    __shared__ int s_lo[FL_ROWS];
    const int T = a.T, nh = a.nh;
    const int bh = blockIdx.y, b = bh / nh, h = bh % nh, grp = h / a.rep;
    const int j0 = blockIdx.x * FL_ROWS, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, c0 = (lane & 1) * 16, j = j0 + 16 * w + r; // this lane's key, its query columns
    const bool live = j < T;
    const float *base = qkv + (size_t)b * T * a.R;
    const size_t nhd = (size_t)nh * HD;
    const int32_t *seg = a.seg ? a.seg + (size_t)b * T : NULL;
    const float *lrow = lse + ((size_t)b * nh + h) * T, *Drow = D + ((size_t)b * nh + h) * T;
    const uint64_t ctr0 = a.offset + ((uint64_t)b * nh + h) * (uint64_t)T * (uint64_t)T + (uint64_t)j;
    auto S = Ss + w * 16 * FL_ROWS;
    auto P = Ps + w * 16 * FL_ROWS;
    auto E = Es + w * 16 * FL_ROWS;
    fl_stage<HD>(Ks, base, a.R, (size_t)(nh + grp) * HD, j0, T);
    fl_stage<HD>(Vs, base, a.R, (size_t)(nh + a.nkv + grp) * HD, j0, T);
    facc dka[HD / 16], dva[HD / 16];
#pragma unroll
    for (int d = 0; d < HD / 16; d++) {
        wm::fill_fragment(dka[d], 0.0f);
        wm::fill_fragment(dva[d], 0.0f);
    }
    for (int tq0 = j0; tq0 < T; tq0 += FL_ROWS) {
        __syncthreads();
        fl_stage<HD>(Qs, base, a.R, (size_t)h * HD, tq0, T);
        fl_stage<HD>(Gs, dout + (size_t)b * T * nhd, nhd, (size_t)h * HD, tq0, T);
        if (threadIdx.x < FL_ROWS) {
            int tt = tq0 + threadIdx.x;
            s_l[threadIdx.x] = tt < T ? lrow[tt] : 0.0f;
            s_D[threadIdx.x] = tt < T ? Drow[tt] : 0.0f;
            s_lo[threadIdx.x] = tt < T ? (seg ? seg[tt] : 0) : T; // past T: sees nothing
        }
        __syncthreads();
        float pv[16], kv[16];
        fl_scores<HD>(S, Ks + w * 16 * HD, Qs); // S^T: 16 keys x 32 queries
        __syncwarp();
        for (int c = 0; c < 16; c++) {
            int i = c0 + c, tt = tq0 + i;
            float pr = 0.0f, kp = 0.0f;
            if (live && tt < T && j <= tt && j >= s_lo[i]) {
                pr = cu_expf(S[r * FL_ROWS + i] * a.scale - s_l[i]);
                kp = a.p_drop > 0.0f
                         ? (cu_keep(a.seed, ctr0 + (uint64_t)tt * (uint64_t)T, a.p_drop) ? a.inv_keep : 0.0f)
                         : 1.0f;
            }
            pv[c] = pr, kv[c] = kp;
            P[r * FL_ROWS + i] = fl_bf(pr * kp);
        }
        __syncwarp();
        fl_scores<HD>(S, Vs + w * 16 * HD, Gs); // dP^T
        __syncwarp();
        for (int c = 0; c < 16; c++) {
            int i = c0 + c;
            E[r * FL_ROWS + i] = fl_bf(pv[c] * (S[r * FL_ROWS + i] * kv[c] - s_D[i]) * a.scale);
        }
        __syncwarp();
        fl_accum<HD>(dva, P, Gs);
        fl_accum<HD>(dka, E, Qs);
    }
    const int row0 = j0 + 16 * w;
    size_t first = direct ? (size_t)b * T + row0 : ((size_t)b * nh + h) * T + row0;
    float *dkrow = dk + first * ostride, *dvrow = dv + first * ostride;
    if (direct) {
        dkrow += (size_t)(nh + grp) * HD;
        dvrow += (size_t)(nh + a.nkv + grp) * HD;
    }
    __syncwarp();
    fl_write<HD>(dkrow, ostride, row0, T, dka, S);
    fl_write<HD>(dvrow, ostride, row0, T, dva, S);
}

// dqkv's key/value part of group g = sum over its query heads, in head order
__global__ void k_flash_group_sum(float *__restrict__ dqkv, const float *__restrict__ dkh,
                                  const float *__restrict__ dvh, fl_args a, int hd) {
    const int nh = a.nh, nkv = a.nkv, rep = a.rep, T = a.T;
    size_t total = (size_t)a.B * T * 2 * nkv * hd;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % (size_t)hd);
        size_t rest = i / (size_t)hd;
        int gg = (int)(rest % (size_t)nkv);
        rest /= (size_t)nkv;
        int kv = (int)(rest % 2);
        size_t bt = rest / 2;
        size_t bb = bt / (size_t)T, t = bt % (size_t)T;
        const float *src = kv ? dvh : dkh;
        float s = 0.0f;
        for (int q = 0; q < rep; q++) s += src[((bb * nh + (size_t)gg * rep + q) * T + t) * hd + d];
        dqkv[bt * a.R + (size_t)(nh + kv * nkv + gg) * hd + d] = s;
    }
}

bool cu_flash_usable(const kb_backend *b, int B, int nh, int hd) {
    static int off = -1; // COHORT_CUDA_FLASH=0: the fp32 kernels in bf16 mode too (comparisons)
    if (off < 0) {
        const char *e = getenv("COHORT_CUDA_FLASH");
        off = e && e[0] == '0';
    }
    return b->opt.bf16 && !off && (hd == 64 || hd == 128) && (size_t)B * nh <= 65535;
}

static fl_args fl_setup(const int32_t *seg, int B, int T, int nh, int nkv, int hd, float p_drop, uint64_t seed,
                        uint64_t offset) {
    fl_args a;
    a.B = B, a.T = T, a.nh = nh, a.nkv = nkv;
    a.rep = nkv > 0 ? nh / nkv : 1;
    if (a.rep < 1) a.rep = 1;
    a.R = (size_t)(nh + 2 * nkv) * hd;
    a.scale = 1.0f / sqrtf((float)hd);
    a.p_drop = p_drop > 0.0f ? p_drop : 0.0f;
    a.inv_keep = p_drop < 1.0f ? 1.0f / (1.0f - a.p_drop) : 0.0f;
    a.seed = seed, a.offset = offset, a.seg = seg;
    return a;
}

template <typename OT>
void cu_flash_forward(kb_backend *b, OT *out, float *lse, const float *qkv, const int32_t *seg, int B, int T,
                      int nh, int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset) {
    fl_args a = fl_setup(seg, B, T, nh, nkv, hd, p_drop, seed, offset);
    dim3 grid((unsigned)((T + FL_ROWS - 1) / FL_ROWS), (unsigned)(B * nh));
    cudaStream_t s = cu_st(b)->stream;
    if (hd == 64) k_flash_fwd<64, OT><<<grid, FL_THREADS, 0, s>>>(out, lse, qkv, a);
    else k_flash_fwd<128, OT><<<grid, FL_THREADS, 0, s>>>(out, lse, qkv, a);
    cu_launched(b, "attention_forward (tensor cores)");
}
template void cu_flash_forward<float>(kb_backend *, float *, float *, const float *, const int32_t *, int, int, int,
                                      int, int, float, uint64_t, uint64_t);
template void cu_flash_forward<uint16_t>(kb_backend *, uint16_t *, float *, const float *, const int32_t *, int, int,
                                         int, int, int, float, uint64_t, uint64_t);

template <int HD>
static void fl_bwd_launch(kb_backend *b, float *dqkv, float *dk, float *dv, size_t ostride, int direct,
                          const float *dout, const float *qkv, const float *lse, const float *D, const fl_args &a) {
    dim3 grid((unsigned)((a.T + FL_ROWS - 1) / FL_ROWS), (unsigned)(a.B * a.nh));
    cudaStream_t s = cu_st(b)->stream;
    k_flash_dq<HD><<<grid, FL_THREADS, 0, s>>>(dqkv, dout, qkv, lse, D, a);
    if (cu_launched(b, "attention_backward (tensor cores, dq)")) return;
    k_flash_dkv<HD><<<grid, FL_THREADS, 0, s>>>(dk, dv, ostride, direct, dout, qkv, lse, D, a);
    cu_launched(b, "attention_backward (tensor cores, dk, dv)");
}

void cu_flash_backward(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const float *out,
                       const uint16_t *out16, const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd, float p_drop,
                       uint64_t seed, uint64_t offset) {
    fl_args a = fl_setup(seg, B, T, nh, nkv, hd, p_drop, seed, offset);
    const size_t rows = (size_t)B * nh * T;
    const bool direct = a.rep == 1 && nkv == nh;
    float *D = cu_attention_dsum(b, out, out16, dout, B, T, nh, hd, direct);
    if (!D) return;
    cudaStream_t s = cu_st(b)->stream;
    float *dk = direct ? dqkv : D + rows, *dv = direct ? dqkv : D + rows + rows * (size_t)hd;
    size_t ostride = direct ? a.R : (size_t)hd;
    if (hd == 64) fl_bwd_launch<64>(b, dqkv, dk, dv, ostride, direct, dout, qkv, lse, D, a);
    else fl_bwd_launch<128>(b, dqkv, dk, dv, ostride, direct, dout, qkv, lse, D, a);
    if (b->status || direct) return;
    size_t total = (size_t)B * T * 2 * nkv * hd;
    k_flash_group_sum<<<cu_blocks(total, 256), 256, 0, s>>>(dqkv, D + rows, D + rows + rows * (size_t)hd, a, hd);
    cu_launched(b, "attention_backward (group sums)");
}
