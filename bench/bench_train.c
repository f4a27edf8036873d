/* bench_train.c - training-step speed of cohort's CPU backend, and the matrix library's own
 * rate on the same model's matrix shapes, measured in one run.
 *
 *   bench_train --layers 12 --hidden 768 --heads 12 --seq 256 --micro 4 --vocab 50257
 *               [--bf16] [--steps 6] [--warmup 2] [--threads 2] [--json]
 *
 * One step = forward + backward + AdamW over one micro batch of random tokens (dropout off,
 * as in the PyTorch reference in bench/torch_ref.py). Prints ms/step, tokens/s, model
 * GFLOP/s (Megatron's formula), peak resident memory, and the library's GFLOP/s on the
 * 15 products of the step (5 linear layers x forward, input-gradient and weight-gradient
 * forms), time-weighted. Every result names the CPU (bench_cpu.h: model name, ISA flags). */
#include "bench/bench_cpu.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/adamw.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

/* Time-weighted GFLOP/s of the model's linear-layer products through the library directly
 * (fp32: dnnl_sgemm). Row-major: forward Y = X W^T (NT), dX = dY W (NN), dW = dY^T X (TN). */
static double library_rate(int N, const int shapes[][2], int nshapes, int reps) {
    double flops = 0, secs = 0;
    for (int s = 0; s < nshapes; s++) {
        int IC = shapes[s][0], OC = shapes[s][1];
        float *X = calloc((size_t)N * IC, 4), *W = calloc((size_t)OC * IC, 4), *Y = calloc((size_t)N * OC, 4);
        float *dW = calloc((size_t)OC * IC, 4);
        for (size_t i = 0; i < (size_t)N * IC; i++) X[i] = (float)(i % 7) * 0.1f;
        for (size_t i = 0; i < (size_t)OC * IC; i++) W[i] = (float)(i % 5) * 0.1f;
        for (int form = 0; form < 3; form++) {
            for (int r = 0; r < reps + 1; r++) {
                double t0 = now_s();
                if (form == 0) dnnl_sgemm('N', 'T', N, OC, IC, 1.0f, X, IC, W, IC, 0.0f, Y, OC);
                else if (form == 1) dnnl_sgemm('N', 'N', N, IC, OC, 1.0f, Y, OC, W, IC, 0.0f, X, IC);
                else dnnl_sgemm('T', 'N', OC, IC, N, 1.0f, Y, OC, X, IC, 1.0f, dW, IC);
                double dt = now_s() - t0;
                if (r) { secs += dt; flops += 2.0 * N * IC * OC; }
            }
        }
        free(X); free(W); free(Y); free(dW);
    }
    return flops / secs / 1e9;
}

int main(int argc, char **argv) {
    int L = 12, C = 768, H = 12, T = 256, B = 4, V = 50257, steps = 6, warmup = 2, threads = 2;
    bool bf16 = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--layers")) L = atoi(v), i++;
        else if (!strcmp(a, "--hidden")) C = atoi(v), i++;
        else if (!strcmp(a, "--heads")) H = atoi(v), i++;
        else if (!strcmp(a, "--seq")) T = atoi(v), i++;
        else if (!strcmp(a, "--micro")) B = atoi(v), i++;
        else if (!strcmp(a, "--vocab")) V = atoi(v), i++;
        else if (!strcmp(a, "--steps")) steps = atoi(v), i++;
        else if (!strcmp(a, "--warmup")) warmup = atoi(v), i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (!strcmp(a, "--bf16")) bf16 = true;
        else if (!strcmp(a, "--json")) json = true;
        else { fprintf(stderr, "bench_train: unknown flag %s\n", a); return 2; }
    }
    kb_backend *be = NULL;
    kb_options o = {.device = KB_DEVICE_CPU, .threads = threads, .bf16 = bf16};
    if (kb_backend_new(&be, &o)) {
        /* e.g. --bf16 on a CPU without bf16 matrix instructions: said, exit 3 (bench/run.sh skips the row) */
        fprintf(stderr, "bench_train: %s\n", co_err_detail());
        return bf16 ? 3 : 1;
    }
    gpt_config c = {.num_layers = L, .hidden = C, .heads = H, .kv_groups = H, .head_dim = C / H,
                    .ffn_hidden = 4 * C, .vocab = V, .padded_vocab = gpt_padded_vocab(V, 128),
                    .max_positions = T, .rotary_base = 10000.0f, .norm_eps = 1e-5f, .tied = true, .bias = true,
                    .init_std = 0.02f};
    gpt_model *m = NULL;
    if (gpt_new(&m, &c, be, B, T)) { fprintf(stderr, "bench_train: no model\n"); return 1; }
    gpt_init(m, 1);
    opt_adamw opt;
    opt_adamw_init(&opt, m, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f);
    int N = B * T;
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N), *pos = malloc(sizeof(int32_t) * N);
    float *mask = malloc(sizeof(float) * N), *dscale = malloc(sizeof(float) * N);
    co_rng r;
    co_rng_seed(&r, 5);
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(co_rng_next(&r) % (uint64_t)V);
        tgt[i] = (int32_t)(co_rng_next(&r) % (uint64_t)V);
        pos[i] = i % T;
        mask[i] = 1.0f;
        dscale[i] = 1.0f / (float)N;
    }
    gpt_batch b = {.B = B, .T = T, .tokens = tok, .targets = tgt, .positions = pos, .seg = NULL, .loss_mask = mask};
    double total = 0, loss = 0;
    double fwd = 0, bwd = 0, optt = 0;
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = now_s();
        gpt_zero_grad(m);
        loss = gpt_forward(m, &b, true, (uint64_t)s, dscale, NULL) / N;
        double t1 = now_s();
        gpt_backward(m, &b, (uint64_t)s);
        double t2 = now_s();
        opt_adamw_step(&opt, m, 1e-4, opt_grad_norm(m));
        double t3 = now_s();
        if (s >= warmup) { total += t3 - t0; fwd += t1 - t0; bwd += t2 - t1; optt += t3 - t2; }
    }
    double ms = 1000.0 * total / steps;
    double tok_s = N / (total / steps);
    double model_gflops = gpt_flops_per_sample(&c, T) * B / (total / steps) / 1e9;
    int shapes[][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, c.padded_vocab}};
    long rss = peak_rss_mb(); /* before the library measurement allocates its own buffers */
    double lib = bf16 ? 0.0 : library_rate(N, shapes, 5, 3);
    char cpu[768];
    bench_cpu_json(cpu, sizeof cpu);
    if (json)
        printf("{\"layers\":%d,\"hidden\":%d,\"seq\":%d,\"micro\":%d,\"vocab\":%d,\"bf16\":%s,\"ms_per_step\":%.1f,"
               "\"tokens_per_s\":%.1f,\"model_gflops\":%.1f,\"library_fp32_gflops\":%.1f,\"peak_rss_mb\":%ld,"
               "\"loss\":%.4f,\"fwd_ms\":%.1f,\"bwd_ms\":%.1f,\"opt_ms\":%.1f,%s}\n",
               L, C, T, B, V, bf16 ? "true" : "false", ms, tok_s, model_gflops, lib, rss, loss,
               1000 * fwd / steps, 1000 * bwd / steps, 1000 * optt / steps, cpu);
    else {
        bench_cpu_print(stdout);
        printf("cohort %s L=%d C=%d T=%d B=%d V=%d: %.1f ms/step (fwd %.1f bwd %.1f opt %.1f), %.1f tokens/s, "
               "model %.1f GFLOP/s, library fp32 %.1f GFLOP/s on the model's shapes, peak RSS %ld MB, loss %.4f\n",
               bf16 ? "bf16" : "fp32", L, C, T, B, V, ms, 1000 * fwd / steps, 1000 * bwd / steps,
               1000 * optt / steps, tok_s, model_gflops, lib, rss, loss);
    }
    opt_adamw_free(&opt, m);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    free(tok); free(tgt); free(pos); free(mask); free(dscale);
    return 0;
}
