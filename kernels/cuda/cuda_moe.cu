// cuda_moe.cu - the MoE layer's token permutations on the GPU (kb_ops.gather_rows,
// gather_rows_bf16, combine_rows, combine_backward; kernels/backend.h), queued on the
// backend's stream so that the tokens never pass through the host (model/moe.c, moe_ep.c).
//
// Every output element is one thread's, computed in the order backend.h gives (fmaf for the
// weighted sums, the dot products serially in double, as kernels/cpu/moe_perm.c): no atomics,
// no reduction tree, so the bits are the CPU backend's and do not depend on the launch shape.
#include "kernels/cuda/cu_common.cuh"

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ void k_gather_rows(float *out, const float *in, const int32_t *idx, size_t M, int C) {
    GRID_STRIDE(i, M * (size_t)C) {
        size_t r = i / (size_t)C, q = i % (size_t)C;
        size_t s = idx ? (size_t)idx[r] : r;
        out[i] = in[s * (size_t)C + q];
    }
}

__global__ void k_gather_rows_bf16(float *out, const uint16_t *in, const int32_t *idx, size_t M, int C) {
    GRID_STRIDE(i, M * (size_t)C) {
        size_t r = i / (size_t)C, q = i % (size_t)C;
        size_t s = idx ? (size_t)idx[r] : r;
        out[i] = cu_get(in + s * (size_t)C + q);
    }
}

__global__ void k_combine_rows(float *y, const float *src, const int32_t *off, const int32_t *row, const float *w,
                               size_t N, int C, int acc) {
    GRID_STRIDE(i, N * (size_t)C) {
        size_t n = i / (size_t)C, q = i % (size_t)C;
        float v = acc ? y[i] : 0.0f;
        for (int j = off[n]; j < off[n + 1]; j++) {
            float s = src[(size_t)row[j] * (size_t)C + q];
            v = w ? fmaf(w[j], s, v) : v + s;
        }
        y[i] = v;
    }
}

// dout[r, q] = w[r] * dy[idx[r], q]
__global__ void k_combine_dout(float *dout, const float *dy, const int32_t *idx, const float *w, size_t M, int C) {
    GRID_STRIDE(i, M * (size_t)C) {
        size_t r = i / (size_t)C, q = i % (size_t)C;
        dout[i] = w[r] * dy[(size_t)idx[r] * (size_t)C + q];
    }
}

// dw[r] = sum over q ascending of dy[idx[r], q] * out[r, q], in double (one thread a row)
__global__ void k_combine_dw(double *dw, const float *dy, const float *out, const int32_t *idx, size_t M, int C) {
    GRID_STRIDE(r, M) {
        const float *d = dy + (size_t)idx[r] * (size_t)C, *o = out + r * (size_t)C;
        double dot = 0;
        for (int q = 0; q < C; q++) dot += (double)d[q] * (double)o[q];
        dw[r] = dot;
    }
}

void cu_gather_rows(kb_backend *b, float *out, const float *in, const int32_t *idx, int M, int C) {
    if (!cu_enter(b) || M <= 0 || C <= 0) return;
    size_t n = (size_t)M * (size_t)C;
    k_gather_rows<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(out, in, idx, (size_t)M, C);
    cu_launched(b, "gather_rows");
}

void cu_gather_rows_bf16(kb_backend *b, float *out, const kb_bf16 *in, const int32_t *idx, int M, int C) {
    if (!cu_enter(b) || M <= 0 || C <= 0) return;
    size_t n = (size_t)M * (size_t)C;
    k_gather_rows_bf16<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(out, in, idx, (size_t)M, C);
    cu_launched(b, "gather_rows_bf16");
}

void cu_combine_rows(kb_backend *b, float *y, const float *src, const int32_t *off, const int32_t *row,
                     const float *w, int N, int C, bool acc) {
    if (!cu_enter(b) || N <= 0 || C <= 0) return;
    size_t n = (size_t)N * (size_t)C;
    k_combine_rows<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(y, src, off, row, w, (size_t)N, C, acc ? 1 : 0);
    cu_launched(b, "combine_rows");
}

void cu_combine_backward(kb_backend *b, float *dout, double *dw, const float *dy, const float *out,
                         const int32_t *idx, const float *w, int M, int C) {
    if (!cu_enter(b) || M <= 0 || C <= 0) return;
    cudaStream_t s = cu_st(b)->stream;
    size_t n = (size_t)M * (size_t)C;
    k_combine_dw<<<cu_blocks((size_t)M, 128), 128, 0, s>>>(dw, dy, out, idx, (size_t)M, C);
    if (cu_launched(b, "combine_backward (the weights' gradient)")) return;
    k_combine_dout<<<cu_blocks(n, 256), 256, 0, s>>>(dout, dy, idx, w, (size_t)M, C);
    cu_launched(b, "combine_backward");
}
