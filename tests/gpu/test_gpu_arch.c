/* test_gpu_arch.c - which GPUs a build with CUDA accepts, without a GPU: the coverage rule
 * of kernels/cuda/cuda_backend.cu for meson.build's list (sm_80 and sm_90 machine code,
 * compute_90 PTX) and the description its refusals print, and that kb_cuda_available
 * gives a reason whenever it says no. Runs on any machine (suite unit). */
#include "kernels/cuda/cuda.h"
#include "tests/test.h"

static void test_covers(void) {
    /* no code for Volta/Turing: sm_80 machine code does not run there, PTX 9.0 neither */
    CHECK(!cuda_build_covers(7, 0));
    CHECK(!cuda_build_covers(7, 5));
    /* sm_80 machine code runs on every 8.x at or above 8.0 (A100, A10/RTX 30, L4/RTX 40) */
    CHECK(cuda_build_covers(8, 0));
    CHECK(cuda_build_covers(8, 6));
    CHECK(cuda_build_covers(8, 9));
    /* sm_90 (H100/H200), and PTX 9.0 compiled by the driver for newer GPUs */
    CHECK(cuda_build_covers(9, 0));
    CHECK(cuda_build_covers(10, 0));
    CHECK(cuda_build_covers(12, 0));
}

static void test_description(void) {
    char d[200];
    cuda_build_code(d, sizeof d);
    CHECK_MSG(!strcmp(d, "sm_80, sm_90, and compute_90 PTX (compute capability 8.0 and newer)"), "got \"%s\"", d);
    char small[8];
    cuda_build_code(small, sizeof small); /* truncates, stays a string */
    CHECK(strlen(small) < sizeof small);
}

static void test_available_says_why(void) {
    char why[512] = "";
    int n = kb_cuda_available(why, sizeof why);
    CHECK(n >= 0);
    if (n == 0) CHECK_MSG(why[0] != '\0', "no GPU and no reason");
    fprintf(stderr, "kb_cuda_available: %d%s%s\n", n, n ? "" : ": ", n ? "" : why);
}

int main(void) {
    RUN(test_covers);
    RUN(test_description);
    RUN(test_available_says_why);
    return TEST_EXIT();
}
