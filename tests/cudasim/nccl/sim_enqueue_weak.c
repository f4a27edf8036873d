/* sim_enqueue_weak.c - the NCCL stand-in's fallback stream hook: runs the operation at once
 * in the calling thread, for a program linked without the CUDA runtime stand-in (whose
 * strong cudasim_enqueue queues it on the stream instead). In its own object, so that a
 * strong definition anywhere in the link replaces it. cudasim_enqueue_async falls back to
 * the program's cudasim_enqueue (a stub whose streams have threads runs it there). */
#include "tests/cudasim/nccl/sim_nccl.h"

__attribute__((weak)) cudaError_t cudasim_enqueue(cudaStream_t s, cudasim_fn fn, void *arg) {
    (void)s;
    fn(arg);
    return cudaSuccess;
}

/* without the runtime stand-in's own (a thread of its own per item), the program's hook */
__attribute__((weak)) cudaError_t cudasim_enqueue_async(cudaStream_t s, cudasim_fn fn, void *arg) {
    return cudasim_enqueue(s, fn, arg);
}
