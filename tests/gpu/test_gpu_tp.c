/* test_gpu_tp.c - tensor and sequence parallelism (model/gpt.h) on the CUDA backend against
 * one rank on the CUDA backend, and loosely against one rank on the CPU backend.
 *
 * Each case forks tp = 2 rank processes that share GPU 0, each with its own CUDA backend,
 * joined by a ZeroMQ tensor group over ipc (tests/tp_harness.h, which
 * tests/unit/model/test_gpt_tp.c runs on the CPU). Every rank trains, on the same global
 * batches and from the same initial weights (the tp model keeps its slice of the global
 * draw):
 *   ref: the tp 1 model on the CUDA backend,
 *   cpu: the tp 1 model on the CPU backend,
 *   a:   its slice of the tp model on the CUDA backend,
 *   b:   the same again, the input-gradient sums not overlapped with the weight gradients,
 * and checks a against ref (this rank's slice of every one-rank tensor, gpt_tensor_take_slice):
 *   - the loss of every micro batch within LOSS_RTOL;
 *   - every gradient after the first backward (and gpt_tp_finalize_grads) within
 *     GRAD_ATOL + GRAD_RTOL |g|;
 *   - every parameter after TPH_STEPS AdamW steps within PARAM_ATOL + PARAM_RTOL |p|;
 * b bitwise equal to a (losses, gradients, weights); and a against cpu within the CPU_*
 * tolerances (per tensor, the gradient's absolute tolerance scales with the tensor's largest
 * one-rank gradient).
 *
 * Tolerances: test_gpt_tp's on the CPU are LOSS 2e-6, GRAD 2e-7 + 2e-4 |g|, PARAM 2e-6 +
 * 1e-4 |p|; here 5 times those. The tp model's sums differ from one rank's in the order of
 * additions only (fp32 throughout, no TF32), as on the CPU, but on the GPU the products of
 * other shapes may also run other cuBLASLt algorithms (split-k) and the vocabulary-parallel
 * cross-entropy sums in other blocks. The CPU comparison allows what tests/gpu/test_gpu_model.c
 * allows between the backends: loss 1e-4 relative, gradients 2e-4 max|g| + 1e-3 |g|, weights
 * after the steps 1e-4 + 1e-3 |p|. AdamW's epsilon is 1e-3 (as in test_gpt_tp: the key biases'
 * true gradient is 0, and a tiny epsilon would turn rounding noise there into full steps).
 *
 * CUDA is never initialised in the parent: a CUDA context does not survive fork, so even the
 * check for a GPU runs in a child. Exits 77 without a GPU. */
#include "kernels/backend.h"
#include "tests/test.h"
#include "tests/tp_harness.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOSS_RTOL 1e-5
#define GRAD_ATOL 1e-6
#define GRAD_RTOL 1e-3
#define PARAM_ATOL 1e-5
#define PARAM_RTOL 5e-4
#define CPU_LOSS_RTOL 1e-4
#define CPU_GRAD_ATOL_REL 2e-4 /* x the tensor's largest |g| */
#define CPU_GRAD_RTOL 1e-3
#define CPU_PARAM_ATOL 1e-4
#define CPU_PARAM_RTOL 1e-3

static const tph_case cases[] = {
    {"tp2 mha gelu learned untied", 2, false, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp mha gelu learned untied", 2, true, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp gqa(1<tp) gelu tied dropout", 2, true, 4, 1, false, false, false, true, true, false, 37, 0.1f},
    {"tp2 sp gqa(2=tp) swiglu rope rms reset dropout", 2, true, 4, 2, true, true, true, false, true, true, 50, 0.1f},
    /* 1337 padded to 1340: 670 columns a rank, more than one block of the CE kernels */
    {"tp2 gqa(1<tp) swiglu rope tied odd vocab", 2, false, 4, 1, true, true, false, true, false, false, 1337, 0},
};

static void report(const tph_case *k, int rank, const tph_worst *w) {
    fprintf(stderr,
            "  %-48s rank %d: vs one GPU rank: loss %.1e relative, error / tolerance: gradients %.3f, weights %.3f;"
            " vs one CPU rank: loss %.1e, gradients %.3f, weights %.3f\n",
            k->name, rank, w[0].loss, w[0].grad, w[0].param, w[1].loss, w[1].grad, w[1].param);
}

static const tph_setup setup = {
    .sizes = {.hidden = 64, .head_dim = 16, .ffn_hidden = 128, .max_positions = 16, .B = 2, .T = 16, .reset_at = 5},
    .device = KB_DEVICE_CUDA,
    .timeout_ms = 60000,
    .alarm_s = 300,
    .scratch = "gpu-tp",
    .nrefs = 2,
    .refs = {{.device = KB_DEVICE_CUDA, .whose = "one GPU rank's", .loss_rtol = LOSS_RTOL, .grad_atol = GRAD_ATOL,
              .grad_rtol = GRAD_RTOL, .param_atol = PARAM_ATOL, .param_rtol = PARAM_RTOL},
             {.device = KB_DEVICE_CPU, .whose = "one CPU rank's", .loss_rtol = CPU_LOSS_RTOL, .grad_atol = 1e-12,
              .grad_atol_rel = CPU_GRAD_ATOL_REL, .grad_rtol = CPU_GRAD_RTOL, .param_atol = CPU_PARAM_ATOL,
              .param_rtol = CPU_PARAM_RTOL}},
    .report = report,
};

static void test_tp_matches_one_rank(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) tph_run_case(&setup, &cases[i]);
}

/* Exits 77 when there is no usable GPU. The check runs in a child, so this process never
 * initialises CUDA before it forks the ranks. */
static void require_gpu_in_child(void) {
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        char why[256];
        if (!kb_cuda_available(why, sizeof why)) {
            fprintf(stderr, "skip: %s\n", why);
            fflush(stderr);
            _exit(77);
        }
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) exit(77);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "the GPU check ended with status %#x\n", st);
        exit(1);
    }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    require_gpu_in_child();
    RUN(test_tp_matches_one_rank);
    return TEST_EXIT();
}
