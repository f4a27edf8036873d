// cuda_elementwise.cu - embeddings, normalisation, rope, activations, dropout, the fused
// softmax cross-entropy, the tensor-parallel bias and vocabulary-parallel cross-entropy, the
// gradient norm's sum of squares and AdamW on the GPU.
//
// The formulas are the CPU backend's (kernels/cpu/elementwise.c), including its exp()
// approximation (cu_expf) and the dropout counter (cu_keep == kb_keep), so dropout masks are
// identical to the CPU's. Reductions use fixed partitions combined in a fixed order (warp
// shuffles, then per-block partials summed by one block), never atomics: the results are
// bitwise repeatable, though not bitwise equal to the CPU's (other summation order).
#include "kernels/cuda/cu_common.cuh"

#include <math.h>

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// ---- embeddings ----

__global__ void k_embed_fwd(float *__restrict__ out, const int32_t *__restrict__ tok, const int32_t *__restrict__ pos,
                            const float *__restrict__ wte, const float *__restrict__ wpe, int N, int C) {
    size_t total = (size_t)N * C;
    GRID_STRIDE(i, total) {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        float e = tok[n] >= 0 ? wte[(size_t)tok[n] * C + c] : 0.0f; // < 0: another vocabulary shard's
        out[i] = wpe ? e + wpe[(size_t)pos[n] * C + c] : e;
    }
}

void cu_embed_forward(kb_backend *b, float *out, const int32_t *tok, const int32_t *pos, const float *wte,
                      const float *wpe, int N, int C) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    k_embed_fwd<<<cu_blocks((size_t)N * C, 256), 256, 0, cu_st(b)->stream>>>(out, tok, pos, wte, wpe, N, C);
    cu_launched(b, "embed_forward");
}

// Block k owns the table rows r with r % K == k: it scans the ids in order, compacts the
// positions of its rows (in order) into shared memory, and adds those gradient rows
// into the table, in token order: the CPU backend's order, so the result is deterministic
// and equal to the CPU's bit for bit.
#define EMB_THREADS 256
__global__ void k_embed_bwd(float *__restrict__ dw, const float *__restrict__ dout, const int32_t *__restrict__ ids,
                            int N, int C, int K) {
    __shared__ int list[EMB_THREADS];
    __shared__ int wcount[EMB_THREADS / 32];
    const int k = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int base = 0; base < N; base += EMB_THREADS) {
        int n = base + (int)threadIdx.x;
        int id = n < N ? ids[n] : -1;
        bool own = id >= 0 && id % K == k;
        unsigned ballot = __ballot_sync(0xffffffffu, own);
        if (lane == 0) wcount[warp] = __popc(ballot);
        __syncthreads();
        int off = 0, total = 0;
        for (int w = 0; w < EMB_THREADS / 32; w++) {
            off += w < warp ? wcount[w] : 0;
            total += wcount[w];
        }
        if (own) list[off + __popc(ballot & ((1u << lane) - 1u))] = n;
        __syncthreads();
        for (int i = 0; i < total; i++) {
            int m = list[i];
            float *row = dw + (size_t)ids[m] * C;
            const float *g = dout + (size_t)m * C;
            for (int c = threadIdx.x; c < C; c += EMB_THREADS) row[c] += g[c];
        }
        __syncthreads();
    }
}

void cu_embed_backward(kb_backend *b, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                       const int32_t *pos, int N, int C, int V) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    cudaStream_t s = cu_st(b)->stream;
    int K = V > 0 && V < 1024 ? V : 1024;
    k_embed_bwd<<<K, EMB_THREADS, 0, s>>>(dwte, dout, tok, N, C, K);
    if (cu_launched(b, "embed_backward")) return;
    if (dwpe) {
        k_embed_bwd<<<1024, EMB_THREADS, 0, s>>>(dwpe, dout, pos, N, C, 1024);
        cu_launched(b, "embed_backward");
    }
}

// ---- normalisation ----

// one warp per row; two passes (mean, then the variance of x - mean) as the CPU does; the
// output fp32 or (OT uint16_t) rounded once to bf16, the statistics fp32 either way
template <typename OT>
__global__ void k_norm_fwd(OT *__restrict__ out, float *__restrict__ mean, float *__restrict__ rstd,
                           const float *__restrict__ in, const float *__restrict__ w, const float *__restrict__ bias,
                           int N, int C, float eps, bool rms) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = in + (size_t)row * C;
    float mu = 0.0f;
    if (!rms) {
        float s = 0.0f;
        for (int c = lane; c < C; c += 32) s += x[c];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        mu = s / (float)C;
    }
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = x[c] - mu;
        v += d * d;
    }
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    float rs = 1.0f / sqrtf(v / (float)C + eps);
    OT *o = out + (size_t)row * C;
    if (bias && !rms)
        for (int c = lane; c < C; c += 32) cu_put(&o[c], (x[c] - mu) * rs * w[c] + bias[c]);
    else
        for (int c = lane; c < C; c += 32) cu_put(&o[c], (x[c] - mu) * rs * w[c]);
    if (lane == 0) {
        if (mean) mean[row] = rms ? 0.0f : mu;
        rstd[row] = rs;
    }
}

void cu_norm_forward(kb_backend *b, bool rms, float *out, float *mean, float *rstd, const float *in, const float *w,
                     const float *bias, int N, int C, float eps) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    k_norm_fwd<float><<<(N + 7) / 8, 256, 0, cu_st(b)->stream>>>(out, mean, rstd, in, w, bias, N, C, eps, rms);
    cu_launched(b, "norm_forward");
}

void cu_norm_forward_bf16(kb_backend *b, bool rms, kb_bf16 *out, float *mean, float *rstd, const float *in,
                          const float *w, const float *bias, int N, int C, float eps) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    k_norm_fwd<uint16_t><<<(N + 7) / 8, 256, 0, cu_st(b)->stream>>>(out, mean, rstd, in, w, bias, N, C, eps, rms);
    cu_launched(b, "norm_forward_bf16");
}

// din += rs * (dy*w - mean(dy*w) - xhat * mean(dy*w*xhat)), one warp per row
__global__ void k_norm_bwd_din(float *__restrict__ din, const float *__restrict__ dout, const float *__restrict__ in,
                               const float *__restrict__ w, const float *__restrict__ mean,
                               const float *__restrict__ rstd, int N, int C, bool rms) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = in + (size_t)row * C, *dy = dout + (size_t)row * C;
    float mu = rms ? 0.0f : mean[row], rs = rstd[row];
    float a1 = 0.0f, a2 = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = dy[c] * w[c];
        a1 += g;
        a2 += g * (x[c] - mu) * rs;
    }
    for (int o = 16; o > 0; o >>= 1) {
        a1 += __shfl_xor_sync(0xffffffffu, a1, o);
        a2 += __shfl_xor_sync(0xffffffffu, a2, o);
    }
    float mg = rms ? 0.0f : a1 / (float)C, mgx = a2 / (float)C;
    float *dx = din + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float xh = (x[c] - mu) * rs;
        dx[c] += rs * (dy[c] * w[c] - mg - xh * mgx);
    }
}

void cu_norm_backward(kb_backend *b, bool rms, float *din, float *dw, float *dbias, const float *dout,
                      const float *in, const float *w, const float *mean, const float *rstd, int N, int C) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    if (rms) dbias = NULL;
    if (din) {
        k_norm_bwd_din<<<(N + 7) / 8, 256, 0, cu_st(b)->stream>>>(din, dout, in, w, rms ? NULL : mean, rstd, N, C,
                                                                  rms);
        if (cu_launched(b, "norm_backward")) return;
    }
    if (dw) cu_col_sums(b, dw, dout, in, rms ? NULL : mean, rstd, N, C, 1);
    if (dbias) cu_col_sums(b, dbias, dout, NULL, NULL, NULL, N, C, 0);
}

// ---- column sums (bias and norm weight gradients) ----
// Stage 1: block (column tile of 32, row chunk of COL_ROWS) sums its rows in a fixed order
// (8 row lanes, then lanes 0..7 in order) into part[chunk][c]. Stage 2: one thread per
// column adds the chunks in order into dst.
#define COL_ROWS 256
__global__ void k_col_part(float *__restrict__ part, const float *__restrict__ dy, const float *__restrict__ x,
                           const float *__restrict__ mean, const float *__restrict__ rstd, int N, int C, int mode) {
    __shared__ float sh[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
    int r0 = chunk * COL_ROWS, r1 = min(N, r0 + COL_ROWS);
    float acc = 0.0f;
    if (c < C)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
            float g = dy[(size_t)r * C + c];
            if (mode == 1) g *= (x[(size_t)r * C + c] - (mean ? mean[r] : 0.0f)) * rstd[r];
            acc += g;
        }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += sh[i][threadIdx.x];
        part[(size_t)chunk * C + c] = s;
    }
}

__global__ void k_col_final(float *__restrict__ dst, const float *__restrict__ part, int nchunk, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < nchunk; k++) s += part[(size_t)k * C + c];
    dst[c] += s;
}

void cu_col_sums(kb_backend *b, float *dst, const float *dy, const float *x, const float *mean, const float *rstd,
                 int N, int C, int mode) {
    if (N <= 0 || C <= 0) return;
    int nchunk = (N + COL_ROWS - 1) / COL_ROWS;
    float *part = (float *)cu_scratch(b, CU_SCR_RED, (size_t)nchunk * C * sizeof(float), "column sums");
    if (!part) return;
    cudaStream_t s = cu_st(b)->stream;
    k_col_part<<<dim3((unsigned)((C + 31) / 32), (unsigned)nchunk), dim3(32, 8), 0, s>>>(part, dy, x, mean, rstd, N,
                                                                                        C, mode);
    if (cu_launched(b, "column sums")) return;
    k_col_final<<<(C + 255) / 256, 256, 0, s>>>(dst, part, nchunk, C);
    cu_launched(b, "column sums");
}

// ---- rotary embedding ----
// one thread per (token, pair i): the angle in double as the CPU's table has it, then
// every q and k head of the token

__global__ void k_rope(float *__restrict__ qkv, const int32_t *__restrict__ pos, int N, int nh, int nkv, int hd,
                       double base, float sg) {
    int half = hd / 2, row = (nh + 2 * nkv) * hd, heads = nh + nkv;
    size_t total = (size_t)N * half;
    GRID_STRIDE(idx, total) {
        int n = (int)(idx / (size_t)half), i = (int)(idx % (size_t)half);
        double inv = pow(base, -2.0 * i / hd);
        double a = (double)pos[n] * inv;
        float c = (float)cos(a), s = sg * (float)sin(a);
        float *x = qkv + (size_t)n * row + i;
        for (int h = 0; h < heads; h++, x += hd) {
            float x1 = x[0], x2 = x[half];
            x[0] = x1 * c - x2 * s;
            x[half] = x2 * c + x1 * s;
        }
    }
}

void cu_rope(kb_backend *b, float *qkv, const int32_t *pos, int N, int nh, int nkv, int hd, float base,
             bool inverse) {
    if (!cu_enter(b) || N <= 0 || hd < 2) return;
    k_rope<<<cu_blocks((size_t)N * (hd / 2), 256), 256, 0, cu_st(b)->stream>>>(qkv, pos, N, nh, nkv, hd,
                                                                               (double)base, inverse ? -1.0f : 1.0f);
    cu_launched(b, "rope");
}

// ---- activations ----

#define GELU_K 0.7978845608028654f
#define GELU_A 0.044715f

__device__ __forceinline__ float tanh_fast(float u) { return 1.0f - 2.0f / (cu_expf(2.0f * u) + 1.0f); }
__device__ __forceinline__ float sigmoid_fast(float a) { return 1.0f / (1.0f + cu_expf(-a)); }

template <typename OT>
__global__ void k_gelu_fwd(OT *__restrict__ out, const float *__restrict__ in, size_t n) {
    GRID_STRIDE(i, n) {
        float x = in[i];
        float t = tanh_fast(GELU_K * (x + GELU_A * x * x * x));
        cu_put(&out[i], 0.5f * x * (1.0f + t));
    }
}

// din may alias dout: each element is read before it is written, by the same thread
__global__ void k_gelu_bwd(float *din, const float *dout, const float *__restrict__ in, size_t n) {
    GRID_STRIDE(i, n) {
        float x = in[i];
        float t = tanh_fast(GELU_K * (x + GELU_A * x * x * x));
        float dt = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        float g = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt;
        din[i] = dout[i] * g;
    }
}

void cu_gelu_forward(kb_backend *b, float *out, const float *in, size_t n) {
    if (!cu_enter(b) || n == 0) return;
    k_gelu_fwd<float><<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(out, in, n);
    cu_launched(b, "gelu_forward");
}

void cu_gelu_forward_bf16(kb_backend *b, kb_bf16 *out, const float *in, size_t n) {
    if (!cu_enter(b) || n == 0) return;
    k_gelu_fwd<uint16_t><<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(out, in, n);
    cu_launched(b, "gelu_forward_bf16");
}

void cu_gelu_backward(kb_backend *b, float *din, const float *dout, const float *in, size_t n) {
    if (!cu_enter(b) || n == 0) return;
    k_gelu_bwd<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(din, dout, in, n);
    cu_launched(b, "gelu_backward");
}

// T: float, or uint16_t for bf16 activations (rounded once, cu_put)
template <typename T>
__global__ void k_swiglu_fwd(T *__restrict__ out, const float *__restrict__ in, int N, int F) {
    size_t total = (size_t)N * F;
    GRID_STRIDE(idx, total) {
        size_t n = idx / (size_t)F, i = idx % (size_t)F;
        float a = in[n * 2 * F + i], g = in[n * 2 * F + F + i];
        cu_put(out + idx, a * sigmoid_fast(a) * g);
    }
}

__global__ void k_swiglu_bwd(float *__restrict__ din, const float *__restrict__ dout, const float *__restrict__ in,
                             int N, int F) {
    size_t total = (size_t)N * F;
    GRID_STRIDE(idx, total) {
        size_t n = idx / (size_t)F, i = idx % (size_t)F;
        float ai = in[n * 2 * F + i], gi = in[n * 2 * F + F + i], di = dout[idx];
        float s = sigmoid_fast(ai);
        din[n * 2 * F + i] = di * gi * s * (1.0f + ai * (1.0f - s));
        din[n * 2 * F + F + i] = di * ai * s;
    }
}

void cu_swiglu_forward(kb_backend *b, float *out, const float *in, int N, int F) {
    if (!cu_enter(b) || N <= 0 || F <= 0) return;
    k_swiglu_fwd<float><<<cu_blocks((size_t)N * F, 256), 256, 0, cu_st(b)->stream>>>(out, in, N, F);
    cu_launched(b, "swiglu_forward");
}

void cu_swiglu_forward_bf16(kb_backend *b, kb_bf16 *out, const float *in, int N, int F) {
    if (!cu_enter(b) || N <= 0 || F <= 0) return;
    k_swiglu_fwd<uint16_t><<<cu_blocks((size_t)N * F, 256), 256, 0, cu_st(b)->stream>>>(out, in, N, F);
    cu_launched(b, "swiglu_forward_bf16");
}

void cu_swiglu_backward(kb_backend *b, float *din, const float *dout, const float *in, int N, int F) {
    if (!cu_enter(b) || N <= 0 || F <= 0) return;
    k_swiglu_bwd<<<cu_blocks((size_t)N * F, 256), 256, 0, cu_st(b)->stream>>>(din, dout, in, N, F);
    cu_launched(b, "swiglu_backward");
}

// ---- elementwise (outputs may alias inputs: same index, same thread) ----

__global__ void k_add(float *out, const float *x, const float *y, size_t n) {
    GRID_STRIDE(i, n) out[i] = x[i] + y[i];
}
__global__ void k_scale(float *x, float s, size_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}
__global__ void k_dropout(float *out, const float *in, size_t n, float p, float sc, uint64_t seed,
                          uint64_t offset) {
    GRID_STRIDE(i, n) out[i] = cu_keep(seed, offset + i, p) ? in[i] * sc : 0.0f;
}

void cu_add(kb_backend *b, float *out, const float *x, const float *y, size_t n) {
    if (!cu_enter(b) || n == 0) return;
    k_add<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(out, x, y, n);
    cu_launched(b, "add");
}

void cu_scale(kb_backend *b, float *x, float s, size_t n) {
    if (!cu_enter(b) || n == 0) return;
    k_scale<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(x, s, n);
    cu_launched(b, "scale");
}

void cu_dropout(kb_backend *b, float *out, const float *in, size_t n, float p, uint64_t seed, uint64_t offset) {
    if (!cu_enter(b) || n == 0) return;
    cudaStream_t s = cu_st(b)->stream;
    if (p <= 0.0f) {
        if (out != in) cu_check(b, cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDefault, s), "dropout");
        return;
    }
    float sc = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    k_dropout<<<cu_blocks(n, 256), 256, 0, s>>>(out, in, n, p, sc, seed, offset);
    cu_launched(b, "dropout");
}

// ---- fused softmax cross-entropy: one block per row ----
// Pass 1: each thread keeps a running max and sum of exp over its strided elements; the
// block combines them in a fixed order. Pass 2 writes the gradient in place.

#define CE_THREADS 512
__global__ void __launch_bounds__(CE_THREADS) k_cross_entropy(float *__restrict__ losses, float *__restrict__ logits,
                                                              const int32_t *__restrict__ targets,
                                                              const float *__restrict__ dscale, int Vp) {
    __shared__ float red[32];
    __shared__ float redm[32];
    const int n = blockIdx.x;
    float *x = logits + (size_t)n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < Vp; j += CE_THREADS) {
        float v = x[j];
        if (v > m) {
            s = s * cu_expf(m - v) + 1.0f;
            m = v;
        } else {
            s += cu_expf(v - m);
        }
    }
    float M = cu_block_max(m, redm);
    float part = m == -INFINITY ? 0.0f : s * cu_expf(m - M);
    float S = cu_block_sum(part, red);
    float lse = M + logf(S);
    int tg = targets[n];
    bool valid = tg >= 0 && tg < Vp;
    float ds = dscale ? dscale[n] : 1.0f;
    __syncthreads(); // everyone has read x[] for the sums before anyone writes
    if (threadIdx.x == 0) losses[n] = valid ? lse - x[tg] : 0.0f;
    __syncthreads(); // x[tg] read before the gradient overwrites it
    if (ds == 0.0f) {
        for (int j = threadIdx.x; j < Vp; j += CE_THREADS) x[j] = 0.0f;
        return;
    }
    for (int j = threadIdx.x; j < Vp; j += CE_THREADS) {
        float g = cu_expf(x[j] - lse) * ds;
        if (valid && j == tg) g -= ds;
        x[j] = g;
    }
}

void cu_cross_entropy(kb_backend *b, float *losses, float *logits, const int32_t *targets, const float *dscale,
                      int N, int Vp) {
    if (!cu_enter(b) || N <= 0 || Vp <= 0) return;
    k_cross_entropy<<<N, CE_THREADS, 0, cu_st(b)->stream>>>(losses, logits, targets, dscale, Vp);
    cu_launched(b, "cross_entropy");
}

// ---- tensor parallelism: row-parallel bias, vocabulary-parallel cross-entropy ----
// (backend.h: bias_add, bias_grad, ce_max, ce_sums, ce_grad; the CPU's are in
// kernels/cpu/matmul.c and kernels/cpu/elementwise.c)

// out[N,C] += bias[C] on every row: one addition per element, bitwise the CPU's
__global__ void k_bias_add(float *__restrict__ out, const float *__restrict__ bias, int N, int C) {
    size_t total = (size_t)N * C;
    GRID_STRIDE(i, total) out[i] += bias[i % (size_t)C];
}

void cu_bias_add(kb_backend *b, float *out, const float *bias, int N, int C) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    k_bias_add<<<cu_blocks((size_t)N * C, 256), 256, 0, cu_st(b)->stream>>>(out, bias, N, C);
    cu_launched(b, "bias_add");
}

// dbias[C] += column sums of dout[N,C]: the fixed-order column sums of linear_backward
void cu_bias_grad(kb_backend *b, float *dbias, const float *dout, int N, int C) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    cu_col_sums(b, dbias, dout, NULL, NULL, NULL, N, C, 0);
}

// One block per row of logits[N,V] (this rank's vocabulary shard). Each thread takes the
// columns j = threadIdx.x + k * CE_THREADS in order; the block combines the threads in a
// fixed tree (cu_block_max, cu_block_sum): bitwise repeatable.

// mx[n] = max_j logits[n,j] (NaN ignored, as the CPU's row_max)
__global__ void __launch_bounds__(CE_THREADS) k_ce_max(float *__restrict__ mx, const float *__restrict__ logits,
                                                       int V) {
    __shared__ float red[32];
    const int n = blockIdx.x;
    const float *x = logits + (size_t)n * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += CE_THREADS) m = x[j] > m ? x[j] : m;
    float M = cu_block_max(m, red);
    if (threadIdx.x == 0) mx[n] = M;
}

// sums[n] = sum_j cu_expf(logits[n,j] - mx[n]); sums[N+n] = logits[n, t - v0] - mx[n] where
// the target t lies in [v0, v0 + V), else 0
__global__ void __launch_bounds__(CE_THREADS) k_ce_sums(float *__restrict__ sums, const float *__restrict__ logits,
                                                        const float *__restrict__ mx,
                                                        const int32_t *__restrict__ targets, int v0, int N, int V) {
    __shared__ float red[32];
    const int n = blockIdx.x;
    const float *x = logits + (size_t)n * V;
    const float m = mx[n];
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += CE_THREADS) s += cu_expf(x[j] - m);
    float S = cu_block_sum(s, red);
    if (threadIdx.x == 0) {
        sums[n] = S;
        int t = targets[n] - v0;
        sums[N + n] = t >= 0 && t < V ? x[t] - m : 0.0f;
    }
}

// losses[n] = logf(sums[n]) - sums[N+n] for a target in [0, Vt), else 0; logits overwritten
// with (cu_expf(x - mx - lse) - onehot) * dscale[n], the one-hot where this rank holds the
// target; rows with dscale 0 get 0. Each element is read and written by one thread.
__global__ void __launch_bounds__(CE_THREADS) k_ce_grad(float *__restrict__ losses, float *__restrict__ logits,
                                                        const float *__restrict__ mx, const float *__restrict__ sums,
                                                        const int32_t *__restrict__ targets,
                                                        const float *__restrict__ dscale, int v0, int Vt, int N,
                                                        int V) {
    const int n = blockIdx.x;
    float *x = logits + (size_t)n * V;
    const float lse = logf(sums[n]);
    const int tg = targets[n];
    const bool valid = tg >= 0 && tg < Vt;
    if (threadIdx.x == 0) losses[n] = valid ? lse - sums[N + n] : 0.0f;
    const float ds = dscale ? dscale[n] : 1.0f;
    if (ds == 0.0f) {
        for (int j = threadIdx.x; j < V; j += CE_THREADS) x[j] = 0.0f;
        return;
    }
    const float off = mx[n] + lse;
    const int t = valid ? tg - v0 : -1;
    for (int j = threadIdx.x; j < V; j += CE_THREADS) {
        float g = cu_expf(x[j] - off) * ds;
        if (j == t) g -= ds;
        x[j] = g;
    }
}

void cu_ce_max(kb_backend *b, float *mx, const float *logits, int N, int V) {
    if (!cu_enter(b) || N <= 0 || V <= 0) return;
    k_ce_max<<<N, CE_THREADS, 0, cu_st(b)->stream>>>(mx, logits, V);
    cu_launched(b, "ce_max");
}

void cu_ce_sums(kb_backend *b, float *sums, const float *logits, const float *mx, const int32_t *targets, int v0,
                int N, int V) {
    if (!cu_enter(b) || N <= 0 || V <= 0) return;
    k_ce_sums<<<N, CE_THREADS, 0, cu_st(b)->stream>>>(sums, logits, mx, targets, v0, N, V);
    cu_launched(b, "ce_sums");
}

void cu_ce_grad(kb_backend *b, float *losses, float *logits, const float *mx, const float *sums,
                const int32_t *targets, const float *dscale, int v0, int Vt, int N, int V) {
    if (!cu_enter(b) || N <= 0 || V <= 0) return;
    k_ce_grad<<<N, CE_THREADS, 0, cu_st(b)->stream>>>(losses, logits, mx, sums, targets, dscale, v0, Vt, N, V);
    cu_launched(b, "ce_grad");
}

// ---- sum of squares in double: fixed chunks, fixed tree, partials summed in order ----

#define SS_THREADS 256
#define SS_CHUNK ((size_t)SS_THREADS * 32)
__global__ void k_sumsq_part(double *__restrict__ part, const float *__restrict__ x, size_t n) {
    __shared__ double red[32];
    size_t lo = (size_t)blockIdx.x * SS_CHUNK, hi = lo + SS_CHUNK < n ? lo + SS_CHUNK : n;
    double acc = 0.0;
    for (size_t i = lo + threadIdx.x; i < hi; i += SS_THREADS) acc += (double)x[i] * (double)x[i];
    double s = cu_block_sum(acc, red);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sumsq_final(double *__restrict__ out, const double *__restrict__ part, size_t np) {
    __shared__ double red[32];
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < np; i += SS_THREADS) acc += part[i];
    double s = cu_block_sum(acc, red);
    if (threadIdx.x == 0) *out = s;
}

double cu_sumsq(kb_backend *b, const float *x, size_t n) {
    if (!cu_enter(b)) return NAN;
    if (n == 0) return 0.0;
    cu_state *st = cu_st(b);
    size_t np = (n + SS_CHUNK - 1) / SS_CHUNK;
    if (np > 0x7fffffff) {
        cu_fail(b, CO_EINVAL, "sumsq", "too many elements");
        return NAN;
    }
    double *part = (double *)cu_scratch(b, CU_SCR_RED, (np + 1) * sizeof(double), "sumsq");
    if (!part) return NAN;
    k_sumsq_part<<<(unsigned)np, SS_THREADS, 0, st->stream>>>(part + 1, x, n);
    if (cu_launched(b, "sumsq")) return NAN;
    k_sumsq_final<<<1, SS_THREADS, 0, st->stream>>>(part, part + 1, np);
    if (cu_launched(b, "sumsq")) return NAN;
    if (cu_check(b, cudaMemcpyAsync(st->host_result, part, sizeof(double), cudaMemcpyDeviceToHost, st->stream),
                 "sumsq") ||
        cu_check(b, cudaStreamSynchronize(st->stream), "sumsq (asynchronous failure)"))
        return NAN;
    return st->host_result[0];
}

// Several runs' sums of squares, one wait: each run as cu_sumsq reduces it (its partials,
// then its sum into runs[j]), each group's runs summed in order by one thread (the host's
// loop: 0 + r0 + r1 + ...), the groups' sums copied to the host at once.
__global__ void k_sum_seq(double *__restrict__ out, const double *__restrict__ r, int nr) {
    double s = 0.0;
    for (int i = 0; i < nr; i++) s += r[i];
    *out = s;
}

void cu_sumsq_runs(kb_backend *b, const float *const *x, const size_t *n, const int *end, int ngroups, double *out) {
    for (int k = 0; k < ngroups; k++) out[k] = NAN;
    if (!cu_enter(b) || ngroups <= 0) return;
    if (ngroups > KB_SUMSQ_MAX_GROUPS) {
        cu_fail(b, CO_EINVAL, "sumsq_runs", "more than KB_SUMSQ_MAX_GROUPS groups");
        return;
    }
    cu_state *st = cu_st(b);
    int nruns = end[ngroups - 1];
    size_t np = 0;
    for (int j = 0; j < nruns; j++) np += (n[j] + SS_CHUNK - 1) / SS_CHUNK;
    double *red = (double *)cu_scratch(b, CU_SCR_RED, ((size_t)ngroups + nruns + np) * sizeof(double), "sumsq_runs");
    if (!red) return;
    double *runs = red + ngroups, *part = runs + nruns;
    for (int j = 0; j < nruns; j++) {
        size_t npj = (n[j] + SS_CHUNK - 1) / SS_CHUNK;
        if (npj > 0x7fffffff) {
            cu_fail(b, CO_EINVAL, "sumsq_runs", "too many elements");
            return;
        }
        if (npj) k_sumsq_part<<<(unsigned)npj, SS_THREADS, 0, st->stream>>>(part, x[j], n[j]);
        k_sumsq_final<<<1, SS_THREADS, 0, st->stream>>>(runs + j, part, npj);
        if (cu_launched(b, "sumsq_runs")) return;
        part += npj;
    }
    for (int k = 0, j0 = 0; k < ngroups; j0 = end[k++]) {
        k_sum_seq<<<1, 1, 0, st->stream>>>(red + k, runs + j0, end[k] - j0);
        if (cu_launched(b, "sumsq_runs")) return;
    }
    if (cu_check(b, cudaMemcpyAsync(st->host_result, red, (size_t)ngroups * sizeof(double), cudaMemcpyDeviceToHost,
                                    st->stream), "sumsq_runs") ||
        cu_check(b, cudaStreamSynchronize(st->stream), "sumsq_runs (asynchronous failure)"))
        return;
    for (int k = 0; k < ngroups; k++) out[k] = st->host_result[k];
}

// ---- AdamW ----

__global__ void k_adamw(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                        float *__restrict__ v, size_t n, float lr, float beta1, float beta2, float c1, float c2,
                        float ib1, float ib2, float eps, float wd, float gscale) {
    GRID_STRIDE(i, n) cu_adamw_elem(p, g, m, v, i, lr, beta1, beta2, c1, c2, ib1, ib2, eps, wd, gscale);
}

void cu_adamw(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
              float beta2, float eps, float wd, float gscale, int64_t t) {
    if (!cu_enter(b) || n == 0) return;
    if (t < 1) t = 1;
    float ib1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    float ib2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    k_adamw<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(p, g, m, v, n, lr, beta1, beta2, 1.0f - beta1,
                                                             1.0f - beta2, ib1, ib2, eps, wd, gscale);
    cu_launched(b, "adamw");
}
