// cuda_ring.cu - ring attention's bookkeeping on the GPU (backend.h: ring_merge, bf16_to_f32),
// queued on the backend's stream so that model/ring_attention.c waits for the device at no
// ring step (its strided copies are copy_rows, cuda_copy_rows.cu): the LSE merge of each
// step's partial output, and the widening of a bf16 attention output for the backward. The same math as the CPU's (kernels/cpu/ring_ops.c): one thread per merged
// row, its channels in index order, no atomics. And the side stream the ring's NCCL shifts
// are queued on beside the blocks (side_stream, side_fork, side_join: events, no host wait).
#include "kernels/cuda/cu_common.cuh"

#include <math.h>

#define RING_THREADS 256

// one thread per (b, h, t) of the merged rows
__global__ void k_ring_merge(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ po,
                             const float *__restrict__ pl, int B, int nh, int hd, int L, int q0, int nq) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * nh * nq) return;
    const int t = (int)(i % nq), bh = (int)(i / nq), bb = bh / nh, h = bh % nh;
    const float ls = pl[(size_t)bh * nq + t];
    if (ls == -INFINITY) return; // nothing seen in this block
    float *lo = lse + (size_t)bh * L + q0 + t;
    const float l0 = *lo, mx = l0 > ls ? l0 : ls, mn = l0 > ls ? ls : l0;
    const float ln = mx + log1pf(expf(mn - mx));
    const float ca = expf(l0 - ln), cb = expf(ls - ln);
    float *o = out + ((size_t)bb * L + q0 + t) * nh * hd + (size_t)h * hd;
    const float *p = po + ((size_t)bb * nq + t) * nh * hd + (size_t)h * hd;
    for (int c = 0; c < hd; c++) o[c] = o[c] * ca + p[c] * cb;
    *lo = ln;
}

void cu_ring_merge(kb_backend *b, float *out, float *lse, const float *po, const float *pl, int B, int nh, int hd,
                   int L, int q0, int nq) {
    const size_t rows = (size_t)B * nh * nq;
    if (!cu_enter(b) || rows == 0) return;
    k_ring_merge<<<cu_blocks(rows, RING_THREADS, 0x7fffffff), RING_THREADS, 0, cu_st(b)->stream>>>(out, lse, po, pl, B,
                                                                                                    nh, hd, L, q0, nq);
    cu_launched(b, "ring_merge");
}

__global__ void k_bf16_to_f32(float *__restrict__ dst, const uint16_t *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = cu_get(src + i);
}

void cu_bf16_to_f32(kb_backend *b, float *dst, const kb_bf16 *src, size_t n) {
    if (!cu_enter(b) || n == 0) return;
    k_bf16_to_f32<<<cu_blocks(n, RING_THREADS), RING_THREADS, 0, cu_st(b)->stream>>>(dst, src, n);
    cu_launched(b, "bf16_to_f32");
}

// ---- the side stream ----

// the side stream and its events, made on first use; false (status set) when they cannot be
static bool side_ready(kb_backend *b) {
    cu_state *st = cu_st(b);
    if (st->side) return true;
    if (!cu_enter(b)) return false;
    cudaError_t e = cudaStreamCreateWithFlags(&st->side, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&st->ev_fork, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&st->ev_join, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cu_check(b, e, "side stream");
        cu_side_release(st);
        return false;
    }
    return true;
}

void *cu_side_stream(kb_backend *b) { return side_ready(b) ? (void *)cu_st(b)->side : NULL; }

// `to` waits (on the device) for everything queued on `from` so far, through event ev
static void stream_after(kb_backend *b, cudaEvent_t ev, cudaStream_t from, cudaStream_t to, const char *what) {
    cudaError_t e = cudaEventRecord(ev, from);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(to, ev, 0);
    cu_check(b, e, what);
}

void cu_side_fork(kb_backend *b) {
    if (!side_ready(b) || !cu_enter(b)) return;
    cu_state *st = cu_st(b);
    stream_after(b, st->ev_fork, st->stream, st->side, "side_fork");
}

void cu_side_join(kb_backend *b) {
    if (!side_ready(b) || !cu_enter(b)) return;
    cu_state *st = cu_st(b);
    stream_after(b, st->ev_join, st->side, st->stream, "side_join");
}

void cu_side_release(cu_state *st) {
    if (st->side) cudaStreamSynchronize(st->side);
    if (st->ev_fork) cudaEventDestroy(st->ev_fork);
    if (st->ev_join) cudaEventDestroy(st->ev_join);
    if (st->side) cudaStreamDestroy(st->side);
    st->side = NULL, st->ev_fork = st->ev_join = NULL;
    (void)cudaGetLastError();
}
