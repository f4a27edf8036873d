// sim_internal.h - what the CUDA stand-in's parts (sim_exec.cc: the execution model,
// sim_runtime.cc: memory, streams and the runtime API, sim_blas.cc: cuBLAS and cuBLASLt)
// share. Test-only (tests/cudasim/).
#ifndef COHORT_TESTS_CUDASIM_INTERNAL_H
#define COHORT_TESTS_CUDASIM_INTERNAL_H

#include <cuda_runtime.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace cudasim {

// One executor at a time: queued work runs under this lock, on the thread that synchronises.
extern std::recursive_mutex g_lock;

// A failure of queued work (a kernel's race, an out-of-bounds access, a cuBLAS call that
// cannot run): logs msg, makes code the sticky error every later call returns until
// cudasim_clear_error, or aborts with COHORT_CUDASIM_ABORT=1.
void report(cudaError_t code, const std::string &msg);
// The sticky error (cudaSuccess if none).
cudaError_t sticky();
// Records e as the calling thread's last error (cudaGetLastError) and returns it.
cudaError_t set_last(cudaError_t e);

// A kernel grid, as queued.
struct grid_rec {
    std::string name, where;
    dim3 grid, block;
    size_t smem;
    body_fn body;
};
// Runs every block of g (sim_exec.cc); the failure, if any, is reported.
void run_grid(const grid_rec &g);

// Queues fn on stream s; ptrs are the device or managed pointers it uses (their allocations
// are closed to the host until it has run); what names it in messages.
cudaError_t enqueue(cudaStream_t s, const std::string &what, std::function<void()> fn,
                    const std::vector<const void *> &ptrs);
// Runs stream s's queued work now (the caller's synchronisation).
cudaError_t drain(cudaStream_t s);
// Runs every stream's queued work.
cudaError_t drain_all();

} // namespace cudasim

#endif
