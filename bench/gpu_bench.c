/* gpu_bench.c - training-step speed of cohort's CUDA backend: GPT-2 124M shapes by default,
 * bf16 matrix products, one large micro batch; and the GPU's own bf16 matrix rate (cuBLASLt,
 * bf16 inputs, fp32 output as the backend's products, 8192^3) measured in the same run,
 * against which MFU is reported; device memory in use after the steps (nothing is freed
 * between steps, so it is the peak); and the step's GPU time per kind of operation
 * (attention, matrix products, elementwise, memory; communication is none on one GPU), from
 * cudaEvents around every backend operation (COHORT_CUDA_PROFILE=1, kernels/cuda/cuda_profile.cu).
 *
 *   gpu_bench [--layers 12] [--hidden 768] [--heads 12] [--seq 1024] [--micro 16]
 *             [--vocab 50257] [--steps 10] [--warmup 3] [--matmul-n 8192] [--fp32] [--json]
 *   gpu_bench --tiny ...   a 1-layer model of hidden 64 over 64 tokens (the CUDA stand-in,
 *                          tests/cudasim/: the report's form, numbers meaningless)
 *
 * On the CUDA stand-in the report says "stand-in: not a GPU".
 *
 * One step = zero grad, forward + backward over one micro batch of random tokens (dropout
 * off), gradient norm, AdamW (the step ends with the backend's sync, so wall time per step is
 * GPU time). Model FLOPs by Megatron's formula (gpt_flops_per_sample). Exits 77 without a GPU.
 * The result names the host CPU too (bench_cpu.h). */
#include "bench/bench_cpu.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"
#include "model/gpt.h"
#include "optim/adamw.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* bf16 x bf16 -> fp32-accumulated bf16 output GEMM rate of cuBLASLt, FLOP/s (0 on failure) */
static double matmul_rate(int n, int reps) {
    void *A = NULL, *B = NULL, *C = NULL, *ws = NULL;
    size_t wss = (size_t)32 << 20, bytes = (size_t)n * n * 2, cbytes = (size_t)n * n * 4;
    double rate = 0;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t l = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaMalloc(&A, bytes) || cudaMalloc(&B, bytes) || cudaMalloc(&C, cbytes) || cudaMalloc(&ws, wss)) goto out;
    cudaMemset(A, 0x3c, bytes); /* bf16 ~1.0-ish values: 0x3c3c */
    cudaMemset(B, 0x3c, bytes);
    if (cublasLtCreate(&lt) || cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, (uint64_t)n, (uint64_t)n, n) ||
        cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)n, (uint64_t)n, n) || cublasLtMatmulPreferenceCreate(&pref))
        goto out;
    cublasOperation_t t = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    uint64_t w64 = wss;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w64, sizeof w64);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, l, l, lc, lc, pref, 1, &res, &found) || found < 1) goto out;
    float one = 1.0f, zero = 0.0f;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; i++) cublasLtMatmul(lt, desc, &one, A, l, B, l, &zero, C, lc, C, lc, &res.algo, ws, wss, 0);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++) cublasLtMatmul(lt, desc, &one, A, l, B, l, &zero, C, lc, C, lc, &res.algo, ws, wss, 0);
    cudaEventRecord(e1, 0);
    if (cudaEventSynchronize(e1) == cudaSuccess) {
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms > 0) rate = 2.0 * n * (double)n * n * reps / (ms * 1e-3);
    }
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (l) cublasLtMatrixLayoutDestroy(l);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (lt) cublasLtDestroy(lt);
    cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(ws);
    (void)cudaGetLastError();
    return rate;
}

int main(int argc, char **argv) {
    int L = 12, C = 768, H = 12, T = 1024, micro = 16, vocab = 50257, steps = 10, warmup = 3;
    int bf16 = 1, json = 0, mm_n = 8192;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *dst = !strcmp(a, "--layers") ? &L : !strcmp(a, "--hidden") ? &C : !strcmp(a, "--heads") ? &H
                 : !strcmp(a, "--seq") ? &T : !strcmp(a, "--micro") ? &micro : !strcmp(a, "--vocab") ? &vocab
                 : !strcmp(a, "--steps") ? &steps : !strcmp(a, "--warmup") ? &warmup
                 : !strcmp(a, "--matmul-n") ? &mm_n : NULL;
        if (dst && i + 1 < argc) *dst = atoi(argv[++i]);
        else if (!strcmp(a, "--tiny"))
            L = 1, C = 64, H = 1, T = 64, micro = 2, vocab = 256, steps = 2, warmup = 1, mm_n = 128;
        else if (!strcmp(a, "--fp32")) bf16 = 0;
        else if (!strcmp(a, "--json")) json = 1;
        else {
            fprintf(stderr, "gpu_bench: unknown argument %s\n", a);
            return 2;
        }
    }
    char why[256];
    if (!kb_cuda_available(why, sizeof why)) {
        fprintf(stderr, "gpu_bench: skipped: %s\n", why);
        return 77;
    }
    setenv("COHORT_CUDA_PROFILE", "1", 1); /* the per-operation timings */
    kb_options o = {.device = KB_DEVICE_CUDA, .bf16 = bf16};
    kb_backend *be = NULL;
    if (kb_backend_new(&be, &o)) {
        fprintf(stderr, "gpu_bench: %s\n", co_err_detail());
        return 1;
    }
    gpt_config cfg = {.num_layers = L, .hidden = C, .heads = H, .kv_groups = H, .head_dim = C / H,
                      .ffn_hidden = 4 * C, .vocab = vocab, .padded_vocab = gpt_padded_vocab(vocab, 128),
                      .max_positions = T, .norm_eps = 1e-5f, .tied = true, .bias = true, .init_std = 0.02f};
    gpt_model *m = NULL;
    if (gpt_new(&m, &cfg, be, micro, T)) {
        fprintf(stderr, "gpu_bench: model: %s\n", co_err_detail());
        return 1;
    }
    gpt_init(m, 1);
    opt_adamw opt;
    if (opt_adamw_init(&opt, m, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f)) return 1;
    int N = micro * T;
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N), *pos = malloc(sizeof(int32_t) * N);
    float *mask = malloc(sizeof(float) * N), *dscale = malloc(sizeof(float) * N);
    co_rng r;
    co_rng_seed(&r, 5);
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(co_rng_next(&r) % (uint64_t)vocab);
        tgt[i] = (int32_t)(co_rng_next(&r) % (uint64_t)vocab);
        pos[i] = i % T;
        mask[i] = 1.0f;
        dscale[i] = 1.0f / (float)N;
    }
    gpt_batch b = {.B = micro, .T = T, .tokens = tok, .targets = tgt, .positions = pos, .loss_mask = mask};
    double total = 0, loss = 0, prof0[CU_PROF_N] = {0}, prof[CU_PROF_N] = {0};
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) cuda_backend_profile(be, prof0); /* the measured steps' share only */
        double t0 = now_s();
        gpt_zero_grad(m);
        loss = gpt_forward(m, &b, true, (uint64_t)s, dscale, NULL) / N;
        gpt_backward(m, &b, (uint64_t)s);
        double gn = opt_grad_norm(m);
        opt_adamw_step(&opt, m, 1e-4, gn);
        double dt = now_s() - t0;
        if (s >= warmup) total += dt;
        if (be->status) {
            fprintf(stderr, "gpu_bench: step %d failed: %s\n", s, co_err_detail());
            return 1;
        }
    }
    size_t freeb = 0, totb = 0;
    cudaMemGetInfo(&freeb, &totb);
    double step_s = total / steps;
    double tps = N / step_s, mflops = gpt_flops_per_sample(&cfg, T) * micro / step_s;
    double peak = matmul_rate(mm_n, mm_n >= 4096 ? 20 : 2);
    const char *desc = kb_backend_describe(be);
    const int standin = strstr(desc, "cudasim") != NULL;
    const char *label = standin ? "stand-in: not a GPU" : "GPU";
    int have_prof = cuda_backend_profile(be, prof) == 0;
    double cat_ms[CU_PROF_N], cat_sum = 0;
    for (int i = 0; i < CU_PROF_N; i++) {
        cat_ms[i] = have_prof ? (prof[i] - prof0[i]) / steps : 0.0;
        cat_sum += cat_ms[i];
    }
    static const char *cat_name[CU_PROF_N] = {"attention", "products", "elementwise", "memory"};
    char cpu[768];
    bench_cpu_json(cpu, sizeof cpu);
    char cats[512];
    int cn = 0;
    for (int i = 0; i < CU_PROF_N; i++)
        cn += snprintf(cats + cn, sizeof cats - (size_t)cn, "\"%s_ms\":%.3f,\"%s_share\":%.4f,", cat_name[i], cat_ms[i],
                       cat_name[i], cat_sum > 0 ? cat_ms[i] / cat_sum : 0.0);
    if (json)
        printf("{\"engine\":\"cohort\",\"device\":\"%s\",\"backend\":\"%s\",\"layers\":%d,\"hidden\":%d,\"seq\":%d,"
               "\"micro\":%d,\"bf16\":%s,\"ms_per_step\":%.2f,\"tokens_per_s\":%.0f,\"model_tflops\":%.4g,"
               "\"matmul_bf16_tflops\":%.4g,\"matmul_n\":%d,\"mfu\":%.4f,\"gpu_mem_used_gib\":%.2f,%s"
               "\"communication_ms\":0,\"loss\":%.4f,%s}\n",
               label, desc, L, C, T, micro, bf16 ? "true" : "false", 1e3 * step_s, tps, mflops / 1e12, peak / 1e12,
               mm_n, peak > 0 ? mflops / peak : 0, (double)(totb - freeb) / (1 << 30), cats, loss, cpu);
    else {
        bench_cpu_print(stdout);
        printf("cohort [%s] %s\n  L=%d C=%d T=%d B=%d %s: %.2f ms/step, %.0f tokens/s, model %.2f TFLOP/s, "
               "bf16 matmul %.1f TFLOP/s measured (%d^3), MFU %.1f%%, device memory in use (peak) %.2f GiB, loss %.4f\n",
               label, desc, L, C, T, micro, bf16 ? "bf16" : "fp32", 1e3 * step_s, tps, mflops / 1e12, peak / 1e12, mm_n,
               peak > 0 ? 100 * mflops / peak : 0.0, (double)(totb - freeb) / (1 << 30), loss);
        printf("  GPU time per step:");
        for (int i = 0; i < CU_PROF_N; i++)
            printf(" %s %.3f ms (%.1f%%),", cat_name[i], cat_ms[i], cat_sum > 0 ? 100 * cat_ms[i] / cat_sum : 0.0);
        printf(" communication 0 ms (one GPU)\n");
    }
    opt_adamw_free(&opt, m);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    free(tok), free(tgt), free(pos), free(mask), free(dscale);
    return 0;
}
