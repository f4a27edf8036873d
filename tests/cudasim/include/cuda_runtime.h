/* cuda_runtime.h - the CUDA stand-in's replacement for CUDA's cuda_runtime.h (tests/cudasim/).
 *
 * Code compiled for the stand-in finds this header before CUDA's own. It takes the runtime's
 * prototypes and types from CUDA's cuda_runtime_api.h (so the stand-in implements the real
 * signatures) and, for C++, adds what device code needs on the host compiler: the execution
 * model (cudasim_device.h) and the C++ conveniences of CUDA's header that cohort uses. */
#ifndef COHORT_TESTS_CUDASIM_CUDA_RUNTIME_H
#define COHORT_TESTS_CUDASIM_CUDA_RUNTIME_H

#include <cuda_runtime_api.h>

#include "cudasim.h"

#ifdef __cplusplus
#include "cudasim_device.h"

template <class T>
static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, T *entry) {
    return ::cudaFuncGetAttributes(attr, (const void *)entry);
}
#endif

#endif
