/* test_module_stub.c - TEST-ONLY: what a CUDA module (kernels/cuda_module.c) must export
 * besides the NCCL communicator, for a module of comm/nccl_comm.c on the NCCL stand-in and
 * the test runtime stub (libcohort_nccl_sim.so): one device, no CUDA backend. */
#include <stdio.h>

int cuda_device_count(char *why, size_t n);

int cuda_device_count(char *why, size_t n) {
    if (why && n) why[0] = 0;
    return 1;
}
