// test_cudasim_exec.cu - the CUDA stand-in's execution model and runtime on small kernels of
// its own (translated by gen_cu.py like kernels/cuda/*.cu): block reductions with shuffles
// and shared memory, and each error the stand-in must report (a race, out-of-bounds shared
// memory, a divergent __syncthreads, a shuffle from an exited lane, an uninitialised shared
// read, a bad launch configuration, a host access to memory queued work uses or to device
// memory, a kernel writing past its allocation), the stream
// semantics (work runs at the synchronising call, cudaStreamQuery, cudasim_enqueue order)
// and that the thread order between barriers follows the seed.
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" {
#include "tests/test.h"
}

// ---- kernels ----

__global__ void k_block_sum(float *out, const float *in, int n) {
    __shared__ float red[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += in[blockIdx.x * n + i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[w];
        out[blockIdx.x] = s;
    }
}

// a neighbour's word read with no barrier after (or before) it is written again
__global__ void k_race(float *out) {
    __shared__ float sh[64];
    sh[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    sh[threadIdx.x] = 2.0f * threadIdx.x;
    out[threadIdx.x] = sh[(threadIdx.x + 1) % 64];
}

// the same with __syncwarp between, inside one warp: ordered
__global__ void k_warp_ordered(float *out) {
    __shared__ float sh[32];
    sh[threadIdx.x] = (float)threadIdx.x;
    __syncwarp();
    out[threadIdx.x] = sh[threadIdx.x ^ 1];
}

__global__ void k_oob(float *out) {
    __shared__ float sh[32];
    sh[threadIdx.x + 1] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x];
}

__global__ void k_divergent(float *out) {
    if (threadIdx.x < 16) __syncthreads();
    else __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// lanes 0-15 shuffle while the others wait at the block barrier: the warp never meets
__global__ void k_divergent_warp(float *out) {
    float v = 1.0f;
    if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}

// threads past 64 exit before the barrier: the others still meet
__global__ void k_exit_early(float *out) {
    __shared__ float sh[128];
    if (threadIdx.x >= 64) return;
    sh[threadIdx.x] = 2.0f * threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = sh[63 - threadIdx.x];
}

__global__ void k_shfl_exited(float *out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void k_uninit(float *out) {
    __shared__ float sh[32];
    if (threadIdx.x != 5) sh[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x];
}

__global__ void k_dynamic(float *out, int n) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = 3.0f;
    __syncthreads();
    out[threadIdx.x] = dyn[(threadIdx.x + 1) % n];
}

__global__ void k_ballot(unsigned *out) {
    unsigned b = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
    if (threadIdx.x == 0) out[0] = b;
}

// the order in which the threads first run: order[k] = thread that ran k-th
__global__ void k_order(int *order, int *counter) {
    int k = (*counter)++; // one thread at a time between barriers: no atomics needed here
    order[k] = (int)threadIdx.x;
}

__global__ void k_fill(float *x, float v, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = v;
}

// ---- tests ----

static float *managed(size_t n) {
    void *p = NULL;
    if (cudaMallocManaged(&p, n * sizeof(float), cudaMemAttachGlobal) != cudaSuccess) abort();
    return (float *)p;
}

// the kernel failed with code and the stand-in's message has every word in want
static void expect_error(const char *label, cudaError_t code, const char *want1, const char *want2) {
    cudaError_t e = cudaDeviceSynchronize();
    const char *msg = cudasim_last_error();
    CHECK_MSG(e == code, "%s: %s, expected %s", label, cudaGetErrorName(e), cudaGetErrorName(code));
    CHECK_MSG(strstr(msg, want1) && strstr(msg, want2), "%s: message \"%s\" lacks \"%s\" / \"%s\"", label, msg, want1,
              want2);
    CHECK_MSG(cudaGetLastError() == code, "%s: cudaGetLastError", label);
    cudasim_clear_error();
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

static void test_reduce(void) {
    const int B = 5, n = 1000;
    float *in = managed((size_t)B * n), *out = managed(B);
    for (int i = 0; i < B * n; i++) in[i] = (float)(i % 7) - 3.0f;
    for (int threads : {32, 128, 1024}) {
        k_block_sum<<<B, threads>>>(out, in, n);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        for (int b = 0; b < B; b++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += in[b * n + i];
            CHECK_CLOSE(out[b], s, 1e-3, 1e-5);
        }
    }
    cudaFree(in), cudaFree(out);
}

static void test_errors(void) {
    float *out = managed(1024);
    k_race<<<1, 64>>>(out);
    expect_error("race", cudaErrorLaunchFailure, "race on shared sh[", "k_race");
    k_warp_ordered<<<2, 32>>>(out);
    CHECK_MSG(cudaDeviceSynchronize() == cudaSuccess, "warp-ordered: %s", cudasim_last_error());
    CHECK(out[4] == 5.0f && out[5] == 4.0f);
    k_oob<<<1, 32>>>(out);
    expect_error("out of bounds", cudaErrorIllegalAddress, "out of bounds", "sh[32]");
    k_divergent<<<1, 32>>>(out);
    expect_error("divergent", cudaErrorLaunchFailure, "divergent __syncthreads", "k_divergent");
    k_divergent_warp<<<1, 64>>>(out);
    expect_error("divergent warp", cudaErrorLaunchFailure, "divergent barrier", "a shuffle");
    k_exit_early<<<1, 128>>>(out);
    CHECK_MSG(cudaDeviceSynchronize() == cudaSuccess, "exit early: %s", cudasim_last_error());
    CHECK(out[0] == 126.0f && out[63] == 0.0f);
    k_shfl_exited<<<1, 32>>>(out);
    expect_error("shuffle from an exited lane", cudaErrorLaunchFailure, "lane 31", "exited");
    k_uninit<<<1, 32>>>(out);
    expect_error("uninitialised", cudaErrorLaunchFailure, "no thread of this block has written", "sh[5]");
    k_dynamic<<<1, 64, 64 * sizeof(float)>>>(out, 64);
    CHECK_MSG(cudaDeviceSynchronize() == cudaSuccess, "dynamic: %s", cudasim_last_error());
    CHECK(out[10] == 3.0f);
    k_dynamic<<<1, 64, 32 * sizeof(float)>>>(out, 32);
    expect_error("dynamic out of bounds", cudaErrorIllegalAddress, "out of bounds", "of 32 elements");
    k_fill<<<1, 2048>>>(out, 1.0f, 4);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);
    unsigned *b = (unsigned *)managed(1);
    k_ballot<<<1, 32>>>(b);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK_MSG(*b == 0x49249249u, "ballot 0x%08x", *b);
    cudaFree(out), cudaFree(b);
}

static void on_host(void *arg) { *(int *)arg += 1; }

static void test_streams(void) {
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    float *x = managed(1000);
    static int ran;
    ran = 0;
    unsigned long before = cudasim_launch_count();
    k_fill<<<4, 64, 0, s>>>(x, 5.0f, 1000);
    CHECK(cudasim_enqueue(s, on_host, &ran) == cudaSuccess);
    CHECK(cudasim_launch_count() == before); // queued, not run
    CHECK(ran == 0);
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CHECK(cudaStreamQuery(s) == cudaSuccess); // the second query runs the queue
    CHECK(cudasim_launch_count() == before + 1 && ran == 1);
    CHECK(x[999] == 5.0f);
    // a copy to pageable host memory waits for the work before it
    k_fill<<<4, 64, 0, s>>>(x, 6.0f, 1000);
    float h[4];
    CHECK(cudaMemcpyAsync(h, x + 10, sizeof h, cudaMemcpyDefault, s) == cudaSuccess);
    CHECK(h[0] == 6.0f && h[3] == 6.0f);
    cudaFree(x);
    cudaStreamDestroy(s);
}

// runs fn in a forked child with its stderr in buf; its wait status
static int in_child(void (*fn)(void), char *buf, size_t n) {
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(pfd[1], 2);
        fn();
        _exit(0);
    }
    close(pfd[1]);
    ssize_t r;
    size_t got = 0;
    while (got + 1 < n && (r = read(pfd[0], buf + got, n - 1 - got)) > 0) got += (size_t)r;
    buf[got] = 0;
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void host_read_unsynced(void) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *x = managed(100);
    k_fill<<<1, 32, 0, s>>>(x, 1.0f, 100);
    volatile float v = x[3]; // no cudaStreamSynchronize: the stand-in stops here
    (void)v;
}

static void kernel_past_the_end(void) {
    void *d = NULL;
    cudaMalloc(&d, 4096);
    k_fill<<<1, 32>>>((float *)d, 1.0f, 1025); // one float past the allocation's last page
    cudaDeviceSynchronize();
}

static void host_touches_device_memory(void) {
    void *d = NULL;
    cudaMalloc(&d, 64);
    ((volatile float *)d)[0] = 1.0f;
}

// host access to memory that queued work uses, or to device memory, and a kernel writing
// past an allocation stop the process with a clear message
static void test_host_access(void) {
    char buf[2048];
    int st = in_child(host_read_unsynced, buf, sizeof buf);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "unsynchronised read: not stopped (status 0x%x)", st);
    CHECK_MSG(strstr(buf, "host read") && strstr(buf, "kernel k_fill") && strstr(buf, "queued on stream"), "message: %s", buf);
    st = in_child(kernel_past_the_end, buf, sizeof buf);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "write past the end: not stopped (status 0x%x)", st);
    CHECK_MSG(strstr(buf, "write") && strstr(buf, "0 bytes past the end of an allocation of 4096 bytes"), "message: %s", buf);
    st = in_child(host_touches_device_memory, buf, sizeof buf);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "device memory: not stopped (status 0x%x)", st);
    CHECK_MSG(strstr(buf, "host write") && strstr(buf, "device memory"), "message: %s", buf);
}

// between barriers the threads run in an order that follows the seed and changes per launch
static void test_order(void) {
    int *order = (int *)managed(256), *counter = (int *)managed(1);
    int first[256];
    int differs = 0, identity = 1;
    for (int run = 0; run < 2; run++) {
        *counter = 0;
        k_order<<<1, 256>>>(order, counter);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        CHECK(*counter == 256);
        for (int i = 0; i < 256; i++) {
            if (run == 0) first[i] = order[i], identity &= order[i] == i;
            else differs |= order[i] != first[i];
        }
    }
    CHECK_MSG(!identity, "threads ran in index order: the order is not shuffled");
    CHECK_MSG(differs, "two launches ran their threads in the same order");
    cudaFree(order), cudaFree(counter);
}

int main(void) {
    RUN(test_reduce);
    RUN(test_errors);
    RUN(test_streams);
    RUN(test_host_access);
    RUN(test_order);
    return TEST_EXIT();
}
