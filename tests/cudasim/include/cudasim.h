/* cudasim.h - the test-only CUDA stand-in's own entry points (tests/cudasim/, docs/testing.md).
 *
 * The stand-in runs cohort's CUDA kernels and its cuBLAS/cuBLASLt calls on the CPU behind the
 * real CUDA runtime prototypes. These few functions are what it adds: the hook the NCCL
 * stand-in queues its collectives with, and what tests use to see the errors it reports. */
#ifndef COHORT_TESTS_CUDASIM_H
#define COHORT_TESTS_CUDASIM_H

#include <driver_types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*cudasim_fn)(void *arg);
/* Queues fn(arg) on stream s (0: the legacy default stream) behind its queued work;
 * it runs, in order, at the next call that synchronises with s. */
cudaError_t cudasim_enqueue(cudaStream_t s, cudasim_fn fn, void *arg);
/* The same for work that may wait a long time on something outside the stand-in (the NCCL
 * stand-in's collectives wait for other processes): once its stream reaches it, it runs on a
 * thread of its own, with every allocation open (the host-access check is off while it
 * runs); cudaStreamQuery answers cudaErrorNotReady until it has finished, as on a GPU, and
 * a synchronising call waits for it. fn must not call the CUDA runtime. */
cudaError_t cudasim_enqueue_async(cudaStream_t s, cudasim_fn fn, void *arg);

/* The last error the stand-in reported (a race, an out-of-bounds shared-memory access, a
 * divergent barrier, ...): one line naming the kernel, block and threads; "" if none. */
const char *cudasim_last_error(void);
/* Clears the sticky error a failed kernel left (as a new CUDA context would), so a test can
 * go on after checking that an error was reported. */
void cudasim_clear_error(void);
/* Kernels launched since the process started (tests check that work really ran here). */
unsigned long cudasim_launch_count(void);
/* Host synchronisations since the process started: cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy and cudaMemcpyAsync into pageable
 * host memory (tests bound the waits of a step with it). */
unsigned long cudasim_sync_count(void);
/* Warp-level WMMA products (nvcuda::wmma::mma_sync, include/mma.h) since the process started
 * (tests check that a tensor-core path ran). */
unsigned long cudasim_mma_count_get(void);

#ifdef __cplusplus
}
#endif

#endif
