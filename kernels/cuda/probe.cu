// probe.cu - proves the build can compile CUDA; the CUDA backend itself is a later issue.
#include <cuda_runtime.h>

extern "C" int kb_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}
