// cuda_attention.cu - causal grouped-query attention on the GPU, flash-attention style:
// memory O(T) (only the log-sum-exp per row is saved), no T x T matrix anywhere.
//
// Layout as the CPU backend (kernels/backend.h): qkv[B*T, (nh + 2 nkv) hd], out[B*T, nh hd],
// lse[(b nh + h) T + t]. A block of 128 threads handles 32 rows (queries, or keys in the
// key-side backward kernel); 4 threads share a row, each holding hd/4 of its channels
// (channel d = u + 4e for thread u of the row, e < E) in registers. Tiles of 32 keys (or
// queries) are staged in shared memory. Dot products are combined over the 4 threads with
// two xor shuffles (a fixed order), and every sum runs over keys or queries in index order:
// no atomics, bitwise repeatable.
//
// Forward: online softmax over key tiles from the first key any row of the block may see
// (seg[]) up to the diagonal. Backward: D = rowsum(dO * O); one kernel per query tile
// recomputes P and accumulates dQ; one per key tile recomputes P and accumulates dK, dV;
// with grouped queries (nkv < nh) the per-head dK, dV go to scratch and are summed over each
// group's heads in head order. Dropout keeps probability (b, h, t, j) iff
// kb_keep(seed, offset + ((b nh + h) T + t) T + j, p), as the CPU backend does.
#include "kernels/cuda/cu_common.cuh"

#include <math.h>

#define ATT_ROWS 32
#define ATT_THREADS 128

struct att_args {
    int B, T, nh, nkv, hd, rep;
    size_t R; // row stride of qkv
    float scale, p_drop, inv_keep;
    uint64_t seed, offset;
    const int32_t *seg;
};

// full dot product of a row's 4 partials (threads 4r..4r+3 of a warp)
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// Loads rows [r0, r0 + ATT_ROWS) of the head starting at column col of a [T, stride] matrix
// (zeros past T) into S[ATT_ROWS][hd].
// (S is a template parameter so that the CUDA stand-in, tests/cudasim/, can pass its checked
// shared-memory pointer; on a GPU it is float *)
template <typename P>
__device__ __forceinline__ void load_tile(P S, const float *base, size_t stride, int col, int r0, int T,
                                          int hd) {
    for (int idx = threadIdx.x; idx < ATT_ROWS * hd; idx += ATT_THREADS) {
        int rr = idx / hd, d = idx % hd, r = r0 + rr;
        S[idx] = r < T ? base[(size_t)r * stride + col + d] : 0.0f;
    }
}

template <int E, typename OT> // OT: the output's type, float or uint16_t (bf16 activations)
__global__ void __launch_bounds__(ATT_THREADS) k_attn_fwd(OT *__restrict__ out, float *__restrict__ lse,
                                                          const float *__restrict__ qkv, att_args a) {
    extern __shared__ float sm[];
    auto Ks = sm + 0, Vs = sm + ATT_ROWS * a.hd, Ps = sm + 2 * ATT_ROWS * a.hd; // float * (auto: tests/cudasim)
    __shared__ int s_jmin;
    const int T = a.T, hd = a.hd, nh = a.nh;
    const int bh = blockIdx.y, b = bh / nh, h = bh % nh, grp = h / a.rep;
    const int t0 = blockIdx.x * ATT_ROWS, r = threadIdx.x >> 2, u = threadIdx.x & 3, t = t0 + r;
    const bool live = t < T;
    const float *base = qkv + (size_t)b * T * a.R;
    const int32_t *seg = a.seg ? a.seg + (size_t)b * T : NULL;
    float q[E], o[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        int d = u + 4 * e;
        q[e] = live && d < hd ? base[(size_t)t * a.R + (size_t)h * hd + d] * a.scale : 0.0f;
        o[e] = 0.0f;
    }
    const int lo = live && seg ? seg[t] : 0;
    float m = -INFINITY, l = 0.0f;
    if (threadIdx.x == 0) { // first key any row of the block sees: 0 without documents
        int jm = 0;
        if (seg) {
            jm = t0;
            for (int i = 0; i < ATT_ROWS && t0 + i < T; i++) jm = min(jm, seg[t0 + i]);
        }
        s_jmin = max(jm, 0);
    }
    __syncthreads();
    const int jend = min(T, t0 + ATT_ROWS);
    const uint64_t ctr = a.offset + (((uint64_t)b * nh + h) * (uint64_t)T + (uint64_t)t) * (uint64_t)T;
    for (int j0 = (s_jmin / ATT_ROWS) * ATT_ROWS; j0 < jend; j0 += ATT_ROWS) {
        __syncthreads(); // the previous tile is consumed
        load_tile(Ks, base, a.R, (nh + grp) * hd, j0, T, hd);
        load_tile(Vs, base, a.R, (nh + a.nkv + grp) * hd, j0, T, hd);
        __syncthreads();
        // scores of this tile: thread u of a row stores keys jj = u mod 4 in Ps (the whole
        // row is read back after the max is known)
        float mb = -INFINITY;
#pragma unroll 4
        for (int jj = 0; jj < ATT_ROWS; jj++) {
            float p = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) p += q[e] * Ks[jj * hd + min(u + 4 * e, hd - 1)]; // q[e] is 0 past hd
            p = quad_sum(p);
            int j = j0 + jj;
            float sv = live && j >= lo && j <= t ? p : -INFINITY;
            if ((jj & 3) == u) Ps[r * (ATT_ROWS + 1) + jj] = sv;
            mb = fmaxf(mb, sv);
        }
        __syncwarp();
        if (mb == -INFINITY) continue; // nothing visible in this tile (same for the row's 4 threads)
        const float mnew = fmaxf(m, mb);
        const float alpha = cu_expf(m - mnew);
#pragma unroll
        for (int e = 0; e < E; e++) o[e] *= alpha;
        float psum = 0.0f;
#pragma unroll 4
        for (int jj = 0; jj < ATT_ROWS; jj++) {
            float sv = Ps[r * (ATT_ROWS + 1) + jj];
            float p = sv == -INFINITY ? 0.0f : cu_expf(sv - mnew);
            psum += p;
            if (a.p_drop > 0.0f) p *= cu_keep(a.seed, ctr + (uint64_t)(j0 + jj), a.p_drop) ? a.inv_keep : 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) o[e] += p * Vs[jj * hd + min(u + 4 * e, hd - 1)];
        }
        l = l * alpha + psum;
        m = mnew;
    }
    if (!live) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    OT *orow = out + ((size_t)b * T + t) * (size_t)(nh * hd) + (size_t)h * hd;
#pragma unroll
    for (int e = 0; e < E; e++) {
        int d = u + 4 * e;
        if (d < hd) cu_put(&orow[d], o[e] * inv);
    }
    if (u == 0) lse[((size_t)b * nh + h) * T + t] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// D[(b nh + h) T + t] = sum_d O * dO, one warp per row (O fp32, or bf16 as the forward stored it)
template <typename OT>
__global__ void k_attn_dsum(float *__restrict__ D, const OT *__restrict__ out, const float *__restrict__ dout,
                            int B, int T, int nh, int hd) {
    size_t row = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= (size_t)B * T * nh) return;
    // row enumerates (b, t, h) so the reads are contiguous
    size_t bt = row / (size_t)nh;
    int h = (int)(row % (size_t)nh);
    const OT *o = out + bt * (size_t)nh * hd + (size_t)h * hd;
    const float *g = dout + bt * (size_t)nh * hd + (size_t)h * hd;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s += cu_get(&o[d]) * g[d];
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    if (lane == 0) {
        size_t b = bt / (size_t)T, t = bt % (size_t)T;
        D[(b * nh + h) * T + t] = s;
    }
}

// The backward's scratch (CU_SCR_ATT): D[B nh T] = rowsum(O * dO), queued, then (unless direct:
// one query head per key head) room for dK and dV per query head. NULL after an error (the
// backend's status set).
float *cu_attention_dsum(kb_backend *b, const float *out, const uint16_t *out16, const float *dout, int B, int T,
                         int nh, int hd, bool direct) {
    const size_t rows = (size_t)B * nh * T;
    size_t need = rows * sizeof(float) + (direct ? 0 : 2 * rows * (size_t)hd * sizeof(float));
    float *D = (float *)cu_scratch(b, CU_SCR_ATT, need, "attention_backward");
    if (!D) return NULL;
    if (out16) k_attn_dsum<uint16_t><<<cu_blocks(rows, 8, 0x7fffffff), 256, 0, cu_st(b)->stream>>>(D, out16, dout, B, T, nh, hd);
    else k_attn_dsum<float><<<cu_blocks(rows, 8, 0x7fffffff), 256, 0, cu_st(b)->stream>>>(D, out, dout, B, T, nh, hd);
    return cu_launched(b, "attention_backward (D)") ? NULL : D;
}

template <int E>
__global__ void __launch_bounds__(ATT_THREADS) k_attn_bwd_dq(float *__restrict__ dqkv, const float *__restrict__ dout,
                                                             const float *__restrict__ qkv, const float *__restrict__ lse,
                                                             const float *__restrict__ D, att_args a) {
    extern __shared__ float sm[];
    auto Ks = sm + 0, Vs = sm + ATT_ROWS * a.hd;
    __shared__ int s_jmin;
    const int T = a.T, hd = a.hd, nh = a.nh;
    const int bh = blockIdx.y, b = bh / nh, h = bh % nh, grp = h / a.rep;
    const int t0 = blockIdx.x * ATT_ROWS, r = threadIdx.x >> 2, u = threadIdx.x & 3, t = t0 + r;
    const bool live = t < T;
    const float *base = qkv + (size_t)b * T * a.R;
    const size_t nhd = (size_t)nh * hd;
    const int32_t *seg = a.seg ? a.seg + (size_t)b * T : NULL;
    float q[E], g[E], dq[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        int d = u + 4 * e;
        bool in = live && d < hd;
        q[e] = in ? base[(size_t)t * a.R + (size_t)h * hd + d] : 0.0f;
        g[e] = in ? dout[((size_t)b * T + t) * nhd + (size_t)h * hd + d] : 0.0f;
        dq[e] = 0.0f;
    }
    const int lo = live && seg ? seg[t] : 0;
    const float lrow = live ? lse[((size_t)b * nh + h) * T + t] : 0.0f;
    const float Dt = live ? D[((size_t)b * nh + h) * T + t] : 0.0f;
    if (threadIdx.x == 0) { // first key any row of the block sees: 0 without documents
        int jm = 0;
        if (seg) {
            jm = t0;
            for (int i = 0; i < ATT_ROWS && t0 + i < T; i++) jm = min(jm, seg[t0 + i]);
        }
        s_jmin = max(jm, 0);
    }
    __syncthreads();
    const int jend = min(T, t0 + ATT_ROWS);
    const uint64_t ctr = a.offset + (((uint64_t)b * nh + h) * (uint64_t)T + (uint64_t)t) * (uint64_t)T;
    for (int j0 = (s_jmin / ATT_ROWS) * ATT_ROWS; j0 < jend; j0 += ATT_ROWS) {
        __syncthreads();
        load_tile(Ks, base, a.R, (nh + grp) * hd, j0, T, hd);
        load_tile(Vs, base, a.R, (nh + a.nkv + grp) * hd, j0, T, hd);
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < ATT_ROWS; jj++) {
            float sp = 0.0f, dp = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = min(u + 4 * e, hd - 1);
                sp += q[e] * Ks[jj * hd + d];
                dp += g[e] * Vs[jj * hd + d];
            }
            sp = quad_sum(sp);
            dp = quad_sum(dp);
            int j = j0 + jj;
            if (!(live && j >= lo && j <= t)) continue;
            float pr = cu_expf(sp * a.scale - lrow);
            float kp = a.p_drop > 0.0f ? (cu_keep(a.seed, ctr + (uint64_t)j, a.p_drop) ? a.inv_keep : 0.0f) : 1.0f;
            float ds = pr * (dp * kp - Dt) * a.scale;
#pragma unroll
            for (int e = 0; e < E; e++) dq[e] += ds * Ks[jj * hd + min(u + 4 * e, hd - 1)];
        }
    }
    if (!live) return;
    float *dst = dqkv + ((size_t)b * T + t) * a.R + (size_t)h * hd;
#pragma unroll
    for (int e = 0; e < E; e++) {
        int d = u + 4 * e;
        if (d < hd) dst[d] = dq[e];
    }
}

// dK, dV of 32 keys of head h; written to dk/dv rows [(b nh + h) T + j] of width hd, with
// row stride ostride and the key/value column offsets given (direct into dqkv when rep == 1)
template <int E>
__global__ void __launch_bounds__(ATT_THREADS) k_attn_bwd_dkv(float *__restrict__ dk, float *__restrict__ dv,
                                                              size_t ostride, int direct,
                                                              const float *__restrict__ dout,
                                                              const float *__restrict__ qkv,
                                                              const float *__restrict__ lse,
                                                              const float *__restrict__ D, att_args a) {
    extern __shared__ float sm[];
    auto Qs = sm + 0, Gs = sm + ATT_ROWS * a.hd;
    __shared__ float s_l[ATT_ROWS], s_D[ATT_ROWS];
    __shared__ int s_lo[ATT_ROWS];
    const int T = a.T, hd = a.hd, nh = a.nh;
    const int bh = blockIdx.y, b = bh / nh, h = bh % nh, grp = h / a.rep;
    const int j0 = blockIdx.x * ATT_ROWS, r = threadIdx.x >> 2, u = threadIdx.x & 3, j = j0 + r;
    const bool live = j < T;
    const float *base = qkv + (size_t)b * T * a.R;
    const size_t nhd = (size_t)nh * hd;
    const int32_t *seg = a.seg ? a.seg + (size_t)b * T : NULL;
    const float *lrow = lse + ((size_t)b * nh + h) * T, *Drow = D + ((size_t)b * nh + h) * T;
    float k[E], v[E], dkr[E], dvr[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        int d = u + 4 * e;
        bool in = live && d < hd;
        k[e] = in ? base[(size_t)j * a.R + (size_t)(nh + grp) * hd + d] : 0.0f;
        v[e] = in ? base[(size_t)j * a.R + (size_t)(nh + a.nkv + grp) * hd + d] : 0.0f;
        dkr[e] = dvr[e] = 0.0f;
    }
    const uint64_t ctr0 = a.offset + ((uint64_t)b * nh + h) * (uint64_t)T * (uint64_t)T + (uint64_t)j;
    for (int tq0 = j0; tq0 < T; tq0 += ATT_ROWS) {
        __syncthreads();
        load_tile(Qs, base, a.R, h * hd, tq0, T, hd);
        load_tile(Gs, dout + (size_t)b * T * nhd, nhd, h * hd, tq0, T, hd);
        if (threadIdx.x < ATT_ROWS) {
            int tt = tq0 + threadIdx.x;
            s_l[threadIdx.x] = tt < T ? lrow[tt] : 0.0f;
            s_D[threadIdx.x] = tt < T ? Drow[tt] : 0.0f;
            s_lo[threadIdx.x] = tt < T ? (seg ? seg[tt] : 0) : T; // past T: sees nothing
        }
        __syncthreads();
#pragma unroll 4
        for (int i = 0; i < ATT_ROWS; i++) {
            float sp = 0.0f, dp = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = min(u + 4 * e, hd - 1);
                sp += Qs[i * hd + d] * k[e];
                dp += Gs[i * hd + d] * v[e];
            }
            sp = quad_sum(sp);
            dp = quad_sum(dp);
            int t = tq0 + i;
            if (!(live && t < T && j <= t && j >= s_lo[i])) continue;
            float pr = cu_expf(sp * a.scale - s_l[i]);
            float kp = a.p_drop > 0.0f
                           ? (cu_keep(a.seed, ctr0 + (uint64_t)t * (uint64_t)T, a.p_drop) ? a.inv_keep : 0.0f)
                           : 1.0f;
            float ds = pr * (dp * kp - s_D[i]) * a.scale;
            float pd = pr * kp;
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = min(u + 4 * e, hd - 1);
                dvr[e] += pd * Gs[i * hd + d];
                dkr[e] += ds * Qs[i * hd + d];
            }
        }
    }
    if (!live) return;
    size_t row = direct ? (size_t)b * T + j : ((size_t)b * nh + h) * T + j;
    float *dkrow = dk + row * ostride, *dvrow = dv + row * ostride;
    if (direct) {
        dkrow += (size_t)(nh + grp) * hd;
        dvrow += (size_t)(nh + a.nkv + grp) * hd;
    }
#pragma unroll
    for (int e = 0; e < E; e++) {
        int d = u + 4 * e;
        if (d < hd) {
            dkrow[d] = dkr[e];
            dvrow[d] = dvr[e];
        }
    }
}

// dqkv k/v part of group g = sum over its query heads, in head order
__global__ void k_attn_group_sum(float *__restrict__ dqkv, const float *__restrict__ dkh,
                                 const float *__restrict__ dvh, att_args a) {
    const int hd = a.hd, nh = a.nh, nkv = a.nkv, rep = a.rep, T = a.T;
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
        for (int r = 0; r < rep; r++) s += src[((bb * nh + (size_t)gg * rep + r) * T + t) * hd + d];
        dqkv[bt * a.R + (size_t)(nh + kv * nkv + gg) * hd + d] = s;
    }
}

static bool att_setup(kb_backend *b, att_args *a, const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                      float p_drop, uint64_t seed, uint64_t offset, const char *op) {
    if (hd > 128) {
        cu_fail(b, CO_EUNSUPPORTED, op, "head dimensions above 128 are not supported by the CUDA attention kernels");
        return false;
    }
    if ((size_t)B * nh > 65535) {
        cu_fail(b, CO_EUNSUPPORTED, op, "batch x heads above 65535 is not supported");
        return false;
    }
    a->B = B, a->T = T, a->nh = nh, a->nkv = nkv, a->hd = hd;
    a->rep = nkv > 0 ? nh / nkv : 1;
    if (a->rep < 1) a->rep = 1;
    a->R = (size_t)(nh + 2 * nkv) * hd;
    a->scale = 1.0f / sqrtf((float)hd);
    a->p_drop = p_drop > 0.0f ? p_drop : 0.0f;
    a->inv_keep = p_drop < 1.0f ? 1.0f / (1.0f - a->p_drop) : 0.0f;
    a->seed = seed, a->offset = offset, a->seg = seg;
    return true;
}

template <int E, typename OT>
static void fwd_launch(kb_backend *b, OT *out, float *lse, const float *qkv, const att_args &a) {
    dim3 grid((unsigned)((a.T + ATT_ROWS - 1) / ATT_ROWS), (unsigned)(a.B * a.nh));
    size_t sh = (2 * (size_t)ATT_ROWS * a.hd + (size_t)ATT_ROWS * (ATT_ROWS + 1)) * sizeof(float);
    k_attn_fwd<E, OT><<<grid, ATT_THREADS, sh, cu_st(b)->stream>>>(out, lse, qkv, a);
}

template <int E>
static void bwd_launch(kb_backend *b, float *dqkv, float *dk, float *dv, size_t ostride, int direct,
                       const float *dout, const float *qkv, const float *lse, const float *D, const att_args &a) {
    dim3 grid((unsigned)((a.T + ATT_ROWS - 1) / ATT_ROWS), (unsigned)(a.B * a.nh));
    size_t sh = 2 * (size_t)ATT_ROWS * a.hd * sizeof(float);
    cudaStream_t s = cu_st(b)->stream;
    k_attn_bwd_dq<E><<<grid, ATT_THREADS, sh, s>>>(dqkv, dout, qkv, lse, D, a);
    if (cu_launched(b, "attention_backward (dq)")) return;
    k_attn_bwd_dkv<E><<<grid, ATT_THREADS, sh, s>>>(dk, dv, ostride, direct, dout, qkv, lse, D, a);
    cu_launched(b, "attention_backward (dk, dv)");
}

template <typename OT>
static void att_fwd(kb_backend *b, OT *out, float *lse, const float *qkv, const int32_t *seg, int B, int T, int nh,
                    int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset) {
    if (!cu_enter(b) || B <= 0 || T <= 0 || nh <= 0 || hd <= 0) return;
    if (cu_flash_usable(b, B, nh, hd)) { // bf16 mode: tensor cores (cuda_flash.cu)
        cu_flash_forward(b, out, lse, qkv, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
        return;
    }
    att_args a;
    if (!att_setup(b, &a, seg, B, T, nh, nkv, hd, p_drop, seed, offset, "attention_forward")) return;
    if (hd <= 8) fwd_launch<2>(b, out, lse, qkv, a);
    else if (hd <= 16) fwd_launch<4>(b, out, lse, qkv, a);
    else if (hd <= 32) fwd_launch<8>(b, out, lse, qkv, a);
    else if (hd <= 64) fwd_launch<16>(b, out, lse, qkv, a);
    else fwd_launch<32>(b, out, lse, qkv, a);
    cu_launched(b, "attention_forward");
}

void cu_attention_forward(kb_backend *b, float *out, float *lse, const float *qkv, const int32_t *seg, int B, int T,
                          int nh, int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset) {
    att_fwd(b, out, lse, qkv, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
}

// bf16 activations: the output rounded to bf16 as it is written (the fp32 or the tensor-core kernels)
void cu_attention_forward_bf16(kb_backend *b, kb_bf16 *out, float *lse, const float *qkv, const int32_t *seg, int B,
                               int T, int nh, int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset) {
    att_fwd(b, out, lse, qkv, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
}

// out16: the forward's output in bf16 (bf16 activations; out NULL then)
static void att_bwd(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const float *out,
                    const uint16_t *out16, const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                    float p_drop, uint64_t seed, uint64_t offset) {
    if (!cu_enter(b) || B <= 0 || T <= 0 || nh <= 0 || hd <= 0) return;
    if (cu_flash_usable(b, B, nh, hd)) {
        cu_flash_backward(b, dqkv, dout, qkv, out, out16, lse, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
        return;
    }
    att_args a;
    if (!att_setup(b, &a, seg, B, T, nh, nkv, hd, p_drop, seed, offset, "attention_backward")) return;
    const size_t rows = (size_t)B * nh * T;
    const bool direct = a.rep == 1 && nkv == nh;
    float *D = cu_attention_dsum(b, out, out16, dout, B, T, nh, hd, direct);
    if (!D) return;
    cudaStream_t s = cu_st(b)->stream;
    float *dk = direct ? dqkv : D + rows, *dv = direct ? dqkv : D + rows + rows * (size_t)hd;
    size_t ostride = direct ? a.R : (size_t)hd;
    if (hd <= 8) bwd_launch<2>(b, dqkv, dk, dv, ostride, direct, dout, qkv, lse, D, a);
    else if (hd <= 16) bwd_launch<4>(b, dqkv, dk, dv, ostride, direct, dout, qkv, lse, D, a);
    else if (hd <= 32) bwd_launch<8>(b, dqkv, dk, dv, ostride, direct, dout, qkv, lse, D, a);
    else if (hd <= 64) bwd_launch<16>(b, dqkv, dk, dv, ostride, direct, dout, qkv, lse, D, a);
    else bwd_launch<32>(b, dqkv, dk, dv, ostride, direct, dout, qkv, lse, D, a);
    if (b->status || direct) return;
    size_t total = (size_t)B * T * 2 * nkv * hd;
    k_attn_group_sum<<<cu_blocks(total, 256), 256, 0, s>>>(dqkv, D + rows, D + rows + rows * (size_t)hd, a);
    cu_launched(b, "attention_backward (group sums)");
}

void cu_attention_backward(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd, float p_drop,
                           uint64_t seed, uint64_t offset) {
    att_bwd(b, dqkv, dout, qkv, out, NULL, lse, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
}

void cu_attention_backward_bf16(kb_backend *b, float *dqkv, const float *dout, const float *qkv, const kb_bf16 *out,
                                const float *lse, const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                                float p_drop, uint64_t seed, uint64_t offset) {
    att_bwd(b, dqkv, dout, qkv, NULL, out, lse, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
}
