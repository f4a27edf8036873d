/* cuda.h - the C-facing entry points of the CUDA backend (the .cu files in kernels/cuda/).
 *
 * backend.c calls these when kb_options.device is KB_DEVICE_CUDA and the build has CUDA
 * (COHORT_HAVE_CUDA). Everything else about the backend is private to kernels/cuda/. */
#ifndef COHORT_KERNELS_CUDA_CUDA_H
#define COHORT_KERNELS_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates the CUDA backend on GPU opt->cuda_device. 0 or a negative CO_E* code
 * (CO_EUNSUPPORTED when that GPU does not exist or this build cannot use it;
 * co_err_detail() says why). */
int cuda_backend_create(kb_backend **out, const kb_options *opt);
void cuda_backend_release(kb_backend *b);
const char *cuda_backend_describe(const kb_backend *b);

/* Number of CUDA devices this process sees when this build can run on every one of them
 * (compute capability it has code for, concurrent managed memory access), else 0; when 0
 * and why != NULL, why[0..n) receives the reason ("no CUDA-capable device is detected",
 * "GPU 0 (...) is compute capability 7.5, and this build has GPU code for ..."). Reads
 * device attributes only: creates no CUDA context. */
int cuda_device_count(char *why, size_t n);

/* Whether this build's GPU code runs on compute capability major.minor: machine code for
 * the same major version and a minor at most minor, or PTX of an older architecture. */
bool cuda_build_covers(int major, int minor);
/* What this build contains: "sm_80, sm_90 and compute_90 PTX (compute capability 8.0 and newer)". */
void cuda_build_code(char *buf, size_t n);

/* GPU time per kind of backend operation (bench/gpu_bench's report), milliseconds summed
 * since the backend was made, read at its syncs: 0 with the times in ms[], or -1 when the
 * backend was not made with COHORT_CUDA_PROFILE=1 (kernels/cuda/cuda_profile.cu). */
enum { CU_PROF_ATTENTION, CU_PROF_PRODUCTS, CU_PROF_ELEMENTWISE, CU_PROF_MEMORY, CU_PROF_N };
int cuda_backend_profile(kb_backend *b, double ms[CU_PROF_N]);

#ifdef __cplusplus
}
#endif

#endif
