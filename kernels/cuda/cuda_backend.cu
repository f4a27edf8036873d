// cuda_backend.cu - the CUDA backend object: device, stream, cuBLASLt, scratch, memory
// operations and the operation table (the same kb_ops as the CPU backend, kernels/backend.h).
//
// Memory: alloc returns CUDA managed memory, so the host code that reads parameters,
// optimizer moments or losses (optimizer, checkpoints, sampling) keeps working; it must
// call ops->sync first (model/gpt.c and optim/adamw.c do at the points where the host
// reads). Operations are queued on one stream in call order and return at once.
//
// Which GPUs: those this build has code for (COHORT_CUDA_SM from meson.build: sm_80 and
// sm_90 machine code, compute_90 PTX for newer GPUs) and that let the CPU touch managed
// memory while kernels run (concurrentManagedAccess); cuda_device_count refuses any other
// with one line naming the GPU, and create also checks that the driver loads the kernels.
#include "kernels/cuda/cu_common.cuh"

#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "kernels/cuda/cuda.h"
}

int cu_fail(kb_backend *b, int code, const char *op, const char *what) {
    if (!b->status) b->status = co_err_set(code, "cuda backend: %s: %s", op, what);
    return b->status;
}

int cu_check(kb_backend *b, cudaError_t e, const char *op) {
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError(); // clear a non-sticky error so the next check is about the next call
    return cu_fail(b, e == cudaErrorMemoryAllocation ? CO_ENOMEM : CO_EINTERNAL, op, cudaGetErrorString(e));
}

void *cu_scratch(kb_backend *b, int slot, size_t nbytes, const char *op) {
    cu_state *st = cu_st(b);
    if (st->scratch[slot] && st->scratch_size[slot] >= nbytes) return st->scratch[slot];
    size_t n = (nbytes + 4095) & ~(size_t)4095;
    n += n / 8;
    n = (n + 255) & ~(size_t)255;
    if (st->scratch[slot]) {
        // stream-ordered: kernels queued before still see the old buffer
        if (cu_check(b, cudaFreeAsync(st->scratch[slot], st->stream), op)) return NULL;
        st->scratch[slot] = NULL;
        st->scratch_size[slot] = 0;
    }
    void *p = NULL;
    if (cu_check(b, cudaMallocAsync(&p, n, st->stream), op)) return NULL;
    st->scratch[slot] = p;
    st->scratch_size[slot] = n;
    return p;
}

// ---- memory ----

static void *cu_alloc(kb_backend *b, size_t nbytes) {
    if (b->status) return NULL;
    cu_state *st = cu_st(b);
    if (cudaSetDevice(st->device) != cudaSuccess) return NULL;
    size_t n = (nbytes + 255) & ~(size_t)255;
    if (n == 0) n = 256;
    void *p = NULL;
    cudaError_t e = cudaMallocManaged(&p, n, cudaMemAttachGlobal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        co_err_set(CO_ENOMEM, "cuda backend: cudaMallocManaged(%zu bytes): %s", n, cudaGetErrorString(e));
        return NULL;
    }
    // Place it on the GPU and zero it there; wait, so host writes right after (model
    // initialisation, checkpoint loads) cannot race the memset.
    (void)cu_prefetch_to_device(p, n, st->device, st->stream); // a hint: failure is harmless
    (void)cudaGetLastError();
    e = cudaMemsetAsync(p, 0, n, st->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(p);
        co_err_set(CO_EINTERNAL, "cuda backend: zeroing %zu bytes: %s", n, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cu_free(kb_backend *b, void *p) {
    if (!p) return;
    cu_state *st = cu_st(b);
    cudaSetDevice(st->device);
    // queued work may still use it: cudaFree waits for the device, which is what we want
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cu_fail(b, CO_EINTERNAL, "cudaFree", cudaGetErrorString(e));
    }
}

void cu_zero(kb_backend *b, float *x, size_t n) {
    if (!cu_enter(b) || n == 0) return;
    cu_check(b, cudaMemsetAsync(x, 0, n * sizeof(float), cu_st(b)->stream), "zero");
}

__global__ void k_to_bf16(uint16_t *__restrict__ dst, const float *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = cu_f2bf(src[i]);
}

__global__ void k_to_f16(uint16_t *__restrict__ dst, const float *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = cu_f2h(src[i]);
}

// the products' 16-bit type: bf16, or fp16 under --fp16
void cu_to_bf16_raw(kb_backend *b, uint16_t *dst, const float *src, size_t n) {
    if (n == 0) return;
    if (b->opt.fp16 && !b->opt.bf16) {
        k_to_f16<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(dst, src, n);
        cu_launched(b, "to_fp16");
        return;
    }
    k_to_bf16<<<cu_blocks(n, 256), 256, 0, cu_st(b)->stream>>>(dst, src, n);
    cu_launched(b, "to_bf16");
}

void cu_to_bf16(kb_backend *b, kb_bf16 *dst16, const float *src, size_t n) {
    if (!cu_enter(b)) return;
    cu_to_bf16_raw(b, dst16, src, n);
}

static void cu_sync(kb_backend *b) {
    cu_state *st = cu_st(b);
    if (cudaSetDevice(st->device) != cudaSuccess) {
        cu_fail(b, CO_EINTERNAL, "sync", "cudaSetDevice failed");
        return;
    }
    cu_digests_copy(b); // adamw_checksum's digests come with this wait
    cudaError_t e = cudaStreamSynchronize(st->stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) cu_fail(b, CO_EINTERNAL, "asynchronous failure found at sync", cudaGetErrorString(e));
    cu_digests_deliver(b);
}

static void *cu_stream(kb_backend *b) { return (void *)cu_st(b)->stream; }

static bool host_memory(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

static void cu_copy(kb_backend *b, void *dst, const void *src, size_t nbytes) {
    if (!cu_enter(b) || nbytes == 0 || dst == src) return;
    cu_state *st = cu_st(b);
    if (cu_check(b, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, st->stream), "copy")) return;
    if (host_memory(dst)) cu_check(b, cudaStreamSynchronize(st->stream), "copy (waiting for it)");
}

// ---- table ----

static const kb_ops cuda_ops = {
    /* .alloc = */ cu_alloc,
    /* .free = */ cu_free,
    /* .zero = */ cu_zero,
    /* .to_bf16 = */ cu_to_bf16,
    /* .sync = */ cu_sync,
    /* .copy = */ cu_copy,
    /* .linear_forward = */ cu_linear_forward,
    /* .linear_backward = */ cu_linear_backward,
    /* .embed_forward = */ cu_embed_forward,
    /* .embed_backward = */ cu_embed_backward,
    /* .norm_forward = */ cu_norm_forward,
    /* .norm_backward = */ cu_norm_backward,
    /* .rope = */ cu_rope,
    /* .attention_forward = */ cu_attention_forward,
    /* .attention_backward = */ cu_attention_backward,
    // block attention (context parallelism's ring attention): cuda_cp.cu
    /* .block_attention_forward = */ cu_block_attention_forward,
    /* .block_attention_backward = */ cu_block_attention_backward,
    /* .gelu_forward = */ cu_gelu_forward,
    /* .gelu_backward = */ cu_gelu_backward,
    /* .swiglu_forward = */ cu_swiglu_forward,
    /* .swiglu_backward = */ cu_swiglu_backward,
    /* .add = */ cu_add,
    /* .scale = */ cu_scale,
    /* .dropout = */ cu_dropout,
    /* .cross_entropy = */ cu_cross_entropy,
    /* .sumsq = */ cu_sumsq,
    /* .adamw = */ cu_adamw,
    /* .adamw_checksum = */ cu_adamw_checksum,
    /* .sumsq_runs = */ cu_sumsq_runs,
    /* .checksum_runs = */ cu_checksum_runs,
    /* .bias_add = */ cu_bias_add,
    /* .bias_grad = */ cu_bias_grad,
    /* .ce_max = */ cu_ce_max,
    /* .ce_sums = */ cu_ce_sums,
    /* .ce_grad = */ cu_ce_grad,
    // grouped products (the MoE experts with --moe-grouped-gemm): cuBLAS, cuda_grouped.cu
    /* .grouped_linear_forward = */ cu_grouped_linear_forward,
    /* .grouped_linear_backward = */ cu_grouped_linear_backward,
    // fused products: cuBLASLt's GELU epilogues (cuda_matmul.cu)
    /* .linear_gelu_forward = */ cu_linear_gelu_forward,
    /* .linear_backward_dgelu = */ cu_linear_backward_dgelu,
    // ordering other device work (stream-ordered NCCL) with the backend's
    /* .stream = */ cu_stream,
    // bf16 activations (bf16 mode): cuda_elementwise.cu, cuda_matmul.cu, cuda_attention.cu
    /* .norm_forward_bf16 = */ cu_norm_forward_bf16,
    /* .linear_forward_bf16 = */ cu_linear_forward_bf16,
    /* .linear_backward_bf16 = */ cu_linear_backward_bf16,
    /* .linear_gelu_forward_bf16 = */ cu_linear_gelu_forward_bf16,
    /* .swiglu_forward_bf16 = */ cu_swiglu_forward_bf16,
    /* .attention_forward_bf16 = */ cu_attention_forward_bf16,
    /* .attention_backward_bf16 = */ cu_attention_backward_bf16,
    // pitched copies (the MTP concatenation and column slices): cuda_copy_rows.cu
    /* .copy_rows = */ cu_copy_rows,
    // ring attention's bookkeeping (context parallelism): cuda_ring.cu
    /* .ring_merge = */ cu_ring_merge,
    /* .bf16_to_f32 = */ cu_bf16_to_f32,
    /* .side_stream = */ cu_side_stream,
    /* .side_fork = */ cu_side_fork,
    /* .side_join = */ cu_side_join,
    // the MoE layer's token permutations: cuda_moe.cu
    /* .gather_rows = */ cu_gather_rows,
    /* .gather_rows_bf16 = */ cu_gather_rows_bf16,
    /* .combine_rows = */ cu_combine_rows,
    /* .combine_backward = */ cu_combine_backward,
};

// ---- which GPUs this build can run on ----

// The GPU code in this build (meson.build's list cuda_sm): machine code (SASS) for each
// sm_XY, which also runs on X.Z for Z >= Y, and PTX of the last, which the driver compiles
// for newer GPUs when it loads the kernels.
#include "cohort_cuda_sm.h" // COHORT_CUDA_SM: 80, 90 (generated by meson.build)
static const int cu_built_sm[] = {COHORT_CUDA_SM};
#define CU_NBUILT (int)(sizeof cu_built_sm / sizeof cu_built_sm[0])

extern "C" bool cuda_build_covers(int major, int minor) {
    int cc = major * 10 + minor;
    for (int i = 0; i < CU_NBUILT; i++)
        if (cu_built_sm[i] / 10 == major && cu_built_sm[i] % 10 <= minor) return true;
    return cc >= cu_built_sm[CU_NBUILT - 1];
}

extern "C" void cuda_build_code(char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < CU_NBUILT && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "sm_%d, ", cu_built_sm[i]);
    if (k < n) {
        int lo = cu_built_sm[0], hi = cu_built_sm[CU_NBUILT - 1];
        for (int i = 0; i < CU_NBUILT; i++) lo = cu_built_sm[i] < lo ? cu_built_sm[i] : lo;
        snprintf(buf + k, n - k, "and compute_%d PTX (compute capability %d.%d and newer)", hi, lo / 10, lo % 10);
    }
}

// 0 when this build can run on GPU dev; else CO_EUNSUPPORTED with why[0..n) saying why.
// Reads device attributes only: no CUDA context is created (the supervisor calls this too).
static int device_unusable(int dev, char *why, size_t n) {
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, n, "GPU %d: cannot read its properties: %s", dev, cudaGetErrorString(e));
        return CO_EUNSUPPORTED;
    }
    if (!cuda_build_covers(prop.major, prop.minor)) {
        char built[160];
        cuda_build_code(built, sizeof built);
        snprintf(why, n,
                 "GPU %d (%.80s) is compute capability %d.%d, and this build has GPU code for %s only; use --device cpu, "
                 "or CUDA_VISIBLE_DEVICES to hide it",
                 dev, prop.name, prop.major, prop.minor, built);
        return CO_EUNSUPPORTED;
    }
    // alloc hands out cudaMallocManaged memory that host code (optimizer, checkpoints,
    // sampling, the data-parallel all-reduce) reads and writes between queued operations:
    // without concurrent access such a touch while any kernel runs is a fault.
    if (!prop.managedMemory || !prop.concurrentManagedAccess) {
        snprintf(why, n,
                 "GPU %d (%.80s) %s; the CUDA backend keeps the model in managed memory that the CPU reads and writes "
                 "while the GPU computes (as under Windows/WSL, this GPU or driver does not allow it); use --device cpu",
                 dev, prop.name,
                 !prop.managedMemory ? "does not support managed memory"
                                     : "cannot share managed memory with the CPU (concurrentManagedAccess is 0)");
        return CO_EUNSUPPORTED;
    }
    return 0;
}

extern "C" int cuda_device_count(char *why, size_t n) {
    char tmp[512];
    if (!why || !n) why = tmp, n = sizeof tmp;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, n, "no usable CUDA GPU: %s", cudaGetErrorString(e));
        return 0;
    }
    if (count == 0) snprintf(why, n, "no CUDA GPU on this machine");
    for (int d = 0; d < count; d++)
        if (device_unusable(d, why, n)) return 0;
    return count;
}

extern "C" void cuda_backend_release(kb_backend *b) {
    if (!b) return;
    cu_state *st = (cu_state *)b->impl;
    if (st) {
        cudaSetDevice(st->device);
        if (st->stream) cudaStreamSynchronize(st->stream);
        cu_mm_release(st);
        cu_blas_release(st);
        cu_digests_release(st);
        cu_profile_release(st);
        cu_side_release(st);
        for (int i = 0; i < CU_NSCRATCH; i++)
            if (st->scratch[i]) cudaFreeAsync(st->scratch[i], st->stream);
        if (st->stream) cudaStreamSynchronize(st->stream);
        if (st->ws) cudaFree(st->ws);
        if (st->host_result) cudaFreeHost(st->host_result);
        if (st->lt) cublasLtDestroy(st->lt);
        if (st->stream) cudaStreamDestroy(st->stream);
        (void)cudaGetLastError();
        free(st);
    }
    free(b);
}

extern "C" int cuda_backend_create(kb_backend **out, const kb_options *opt) {
    *out = NULL;
    char why[512];
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return co_err_set(CO_EUNSUPPORTED, "the CUDA backend cannot run: no usable CUDA GPU: %s", cudaGetErrorString(ce));
    }
    if (opt->cuda_device < 0 || opt->cuda_device >= count) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return co_err_set(CO_EUNSUPPORTED,
                          "the CUDA backend cannot run: GPU %d is wanted (each worker uses the GPU numbered by its "
                          "local rank on its node), but this process sees %d GPU%s (CUDA_VISIBLE_DEVICES%s%s); start "
                          "at most %d worker%s per node (--nproc-per-node) or use --device cpu",
                          opt->cuda_device, count, count == 1 ? "" : "s", vis ? "=" : " is not set", vis ? vis : "",
                          count, count == 1 ? "" : "s");
    }
    if (device_unusable(opt->cuda_device, why, sizeof why))
        return co_err_set(CO_EUNSUPPORTED, "the CUDA backend cannot run: %s", why);
    kb_backend *b = (kb_backend *)calloc(1, sizeof *b);
    cu_state *st = (cu_state *)calloc(1, sizeof *st);
    if (!b || !st) {
        free(b);
        free(st);
        return co_err_set(CO_ENOMEM, "cuda backend: out of memory");
    }
    b->ops = &cuda_ops;
    b->opt = *opt;
    b->impl = st;
    st->device = opt->cuda_device;
    cudaDeviceProp prop;
    cudaError_t e = cudaSetDevice(st->device);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, st->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&st->host_result, sizeof(double) * KB_SUMSQ_MAX_GROUPS);
    st->ws_size = (size_t)32 << 20; // cuBLASLt workspace, as NVIDIA recommends for Hopper
    if (e == cudaSuccess) e = cudaMalloc(&st->ws, st->ws_size);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        int rc = co_err_set(e == cudaErrorMemoryAllocation ? CO_ENOMEM : CO_EUNSUPPORTED,
                            "cuda backend: cannot set up device %d: %s", st->device, cudaGetErrorString(e));
        cuda_backend_release(b);
        return rc;
    }
    // the driver loads this build's kernels for this GPU (SASS, or PTX it can compile)
    cudaFuncAttributes fa;
    e = cudaFuncGetAttributes(&fa, k_to_bf16);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        char built[160];
        cuda_build_code(built, sizeof built);
        cuda_backend_release(b);
        return co_err_set(CO_EUNSUPPORTED, "cuda backend: GPU %d (%s, compute capability %d.%d) cannot load this "
                          "build's kernels (%s): %s", opt->cuda_device, prop.name, prop.major, prop.minor, built,
                          cudaGetErrorString(e));
    }
    if (cublasLtCreate(&st->lt) != CUBLAS_STATUS_SUCCESS) {
        st->lt = NULL;
        cuda_backend_release(b);
        return co_err_set(CO_EINTERNAL, "cuda backend: cannot create the cuBLASLt handle");
    }
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    snprintf(st->desc, sizeof st->desc,
             "cuda: GPU %d of %d, %.80s (sm_%d%d, %.0f GiB), CUDA %d.%d, cuBLASLt, %s, deterministic", st->device,
             count, prop.name, prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
              rt / 1000, (rt % 1000) / 10, opt->bf16 ? "bf16" : opt->fp16 ? "fp16" : "fp32");
    cu_profile_setup(b); // COHORT_CUDA_PROFILE=1: operation timings (bench/gpu_bench)
    *out = b;
    return 0;
}

extern "C" const char *cuda_backend_describe(const kb_backend *b) { return ((const cu_state *)b->impl)->desc; }
