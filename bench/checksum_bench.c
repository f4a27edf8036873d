/* checksum_bench.c - what the weights' checksum costs the training thread per step, in
 * isolation: the CPU backend's AdamW over N fp32 weights alone, AdamW with the checksum of
 * what it writes (adamw_checksum: each 16384-float chunk hashed as it is written), and a
 * separate checksum pass over the weights (kb_checksum_f32: the hash a data-parallel rank
 * runs beside the all-reduce). Best of R repetitions, one thread (a rank on a 2-core
 * machine with two ranks).
 *
 *   build/bench/checksum_bench [N (124439808: GPT-2 124M)] [repetitions (5)] [threads (1)] */
#include "bench/bench_cpu.h"
#include "kernels/backend.h"
#include "kernels/checksum.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atoll(argv[1]) : 124439808;
    int reps = argc > 2 ? atoi(argv[2]) : 5, threads = argc > 3 ? atoi(argv[3]) : 1;
    kb_options o = {.device = KB_DEVICE_CPU, .threads = threads};
    kb_backend *b;
    if (n < 1 || reps < 1 || kb_backend_new(&b, &o)) {
        fprintf(stderr, "usage: checksum_bench [N] [repetitions] [threads]\n");
        return 2;
    }
    float *p = b->ops->alloc(b, n * 4), *g = b->ops->alloc(b, n * 4), *m = b->ops->alloc(b, n * 4),
          *v = b->ops->alloc(b, n * 4);
    if (!p || !g || !m || !v) {
        fprintf(stderr, "checksum_bench: cannot allocate 4 x %zu floats\n", n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) p[i] = 0.02f * (float)((i * 2654435761u) % 1000) / 1000.0f, g[i] = 1e-3f;
    double best[3] = {1e30, 1e30, 1e30};
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        b->ops->adamw(b, p, g, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, r + 1);
        double t1 = now_s();
        uint64_t s;
        b->ops->adamw_checksum(b, p, g, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, r + 1, 1, &s);
        double t2 = now_s();
        sink ^= s ^ kb_checksum_f32(p, n, 1);
        double t3 = now_s();
        if (t1 - t0 < best[0]) best[0] = t1 - t0;
        if (t2 - t1 < best[1]) best[1] = t2 - t1;
        if (t3 - t2 < best[2]) best[2] = t3 - t2;
    }
    bench_cpu_print(stdout);
    printf("%zu weights (%.1f MB), %d thread(s), best of %d:\n", n, n * 4 / 1e6, threads, reps);
    printf("| AdamW | AdamW + checksum of what it writes | fused checksum's cost | separate checksum pass (GB/s) |\n");
    printf("|---|---|---|---|\n");
    printf("| %.2f ms | %.2f ms | %.2f ms | %.2f ms (%.1f) |\n", 1e3 * best[0], 1e3 * best[1], 1e3 * (best[1] - best[0]),
           1e3 * best[2], n * 4 / best[2] / 1e9);
    b->ops->free(b, p), b->ops->free(b, g), b->ops->free(b, m), b->ops->free(b, v);
    kb_backend_destroy(&b);
    return (int)(sink & 0);
}
