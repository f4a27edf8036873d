// cuda_copy_rows.cu - kb_ops.copy_rows (kernels/backend.h): rows of bytes from one pitched
// buffer into another on the backend's stream, in order with the kernels around it; the
// model's concatenations and column slices (model/gpt_mtp.c: MTP's [enorm | hnorm], its
// gradient's split, eh_proj's gathered columns under tensor parallelism) without a sync and a
// host loop. One element a thread: 4-byte words where every address, pitch and the width
// allow, else 2-byte ones (bf16 activations), else bytes. No arithmetic: the copy is exact.
#include "kernels/cuda/cu_common.cuh"

template <typename T>
__global__ void k_copy_rows(char *dst, size_t dpitch, const char *src, size_t spitch, size_t w, size_t rows) {
    size_t n = w * rows;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / w, c = i - r * w;
        ((T *)(dst + r * dpitch))[c] = ((const T *)(src + r * spitch))[c];
    }
}

// the widest element that divides every address, pitch and the width
static size_t elem_size(const void *dst, size_t dpitch, const void *src, size_t spitch, size_t width) {
    uintptr_t all = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)dpitch | (uintptr_t)spitch | (uintptr_t)width;
    return all % 4 == 0 ? 4 : all % 2 == 0 ? 2 : 1;
}

void cu_copy_rows(kb_backend *b, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                  size_t rows) {
    if (!cu_enter(b) || width == 0 || rows == 0) return;
    cudaStream_t s = cu_st(b)->stream;
    size_t e = elem_size(dst, dst_pitch, src, src_pitch, width), w = width / e, n = w * rows;
    char *d = (char *)dst;
    const char *x = (const char *)src;
    if (e == 4) k_copy_rows<uint32_t><<<cu_blocks(n, 256), 256, 0, s>>>(d, dst_pitch, x, src_pitch, w, rows);
    else if (e == 2) k_copy_rows<uint16_t><<<cu_blocks(n, 256), 256, 0, s>>>(d, dst_pitch, x, src_pitch, w, rows);
    else k_copy_rows<uint8_t><<<cu_blocks(n, 256), 256, 0, s>>>(d, dst_pitch, x, src_pitch, w, rows);
    cu_launched(b, "copy_rows");
}
