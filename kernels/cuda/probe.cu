// probe.cu - compiled (never linked or run) by meson.build before it enables the CUDA
// backend: the runtime, cuBLASLt, cuBLAS and device calls kernels/cuda/ makes, through the same
// version-dependent helpers (cu_common.cuh) and with the same -gencode flags. A toolkit
// that cannot compile this cannot build the backend, and the build goes on without CUDA.
#include "kernels/cuda/cu_common.cuh"

__global__ void probe_kernel(float *x, int n) {
    __shared__ float red[32];
    float v = threadIdx.x < (unsigned)n ? x[threadIdx.x] : 0.0f;
    v = cu_block_sum(v, red);
    if (threadIdx.x == 0) x[0] = v + __uint_as_float(cu_f2bf(v)) + cu_expf(v);
}

int probe_host(void) {
    void *p = NULL, *q = NULL;
    cudaStream_t s = NULL;
    int cc = 0;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
    (void)cudaDeviceGetAttribute(&cc, cudaDevAttrConcurrentManagedAccess, 0);
    (void)cudaMallocManaged(&p, 256, cudaMemAttachGlobal);
    (void)cu_prefetch_to_device(p, 256, 0, s);
    (void)cudaMallocAsync(&q, 256, s);
    (void)cudaFreeAsync(q, s);
    probe_kernel<<<1, 32, 0, s>>>((float *)p, 8);
    cudaFuncAttributes fa;
    (void)cudaFuncGetAttributes(&fa, probe_kernel);
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t d = NULL;
    (void)cublasLtCreate(&lt);
    (void)cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cudaDataType_t bf = CUDA_R_16BF;
    (void)bf;
    cublasHandle_t h = NULL; // the grouped products (cuda_grouped.cu); the grouped call itself is 12.5+
    (void)cublasCreate(&h);
    (void)cublasSetStream(h, s);
    (void)cublasSetWorkspace(h, q, 256);
    (void)cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED);
    (void)cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    const float one = 1.0f;
    (void)cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 1, &one, (const float *)p, 1, (const float *)p, 1, &one,
                      (float *)p, 1);
    return cc;
}
