/* tp_bench.c - the model's training step split over a tensor group, against one rank.
 *
 *   tp_bench --tp P [--sp] [--no-overlap] [--threads T] [--layers 12 --hidden 768 --heads 12 --seq 256
 *            --micro 4 --vocab 50257] [--steps 4] [--warmup 1]
 *
 * P = 1 runs in this process with T threads; P > 1 forks P ranks (T threads each) joined
 * by a ZeroMQ communicator over ipc on this host (shared memory for the all-reduces, as a
 * job's workers on one node). One step = forward + backward + gpt_tp_finalize_grads +
 * AdamW over one micro batch of random tokens (dropout off); --no-overlap sums each
 * column-parallel layer's input gradient before its weight gradient instead of beside it
 * (gpt_tp_set_overlap). Each rank prints ms/step,
 * tokens/s, the seconds per step in the tensor group's collectives, the bytes it sent per
 * step (over ZeroMQ, and into its shared-memory segment) beside the bandwidth-optimal
 * volume, its model state (weights, gradients, two Adam moments) and its peak resident
 * memory. The model layer only: no data loading, no data-parallel reduction. */
#include "bench/bench_cpu.h"
#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct args {
    int tp, threads, layers, hidden, heads, seq, micro, vocab, steps, warmup;
    bool sp, no_overlap;
} args;

static int rank_main(const args *a, int rank, const char *dir) {
    cm_comm *comm = NULL;
    if (a->tp > 1) {
        char eps[8][300];
        const char *ep[8];
        for (int r = 0; r < a->tp; r++) {
            snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
            ep[r] = eps[r];
        }
        cm_zmq_options zo;
        cm_zmq_options_default(&zo);
        int rc = cm_zmq_new(&comm, rank, a->tp, ep, &zo);
        if (rc) {
            fprintf(stderr, "rank %d: cm_zmq_new: %s\n", rank, co_err_detail());
            return 1;
        }
    }
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = a->threads};
    if (kb_backend_new(&be, &bo)) {
        fprintf(stderr, "backend: %s\n", co_err_detail());
        return 1;
    }
    gpt_config c = {.num_layers = a->layers, .hidden = a->hidden, .heads = a->heads, .kv_groups = a->heads,
                    .head_dim = a->hidden / a->heads, .ffn_hidden = 4 * a->hidden, .vocab = a->vocab,
                    .padded_vocab = gpt_padded_vocab(a->vocab, 128 * a->tp), .max_positions = a->seq,
                    .norm_eps = 1e-5f, .tied = true, .bias = true, .init_std = 0.02f, .tp = a->tp,
                    .tp_rank = rank, .sequence_parallel = a->sp};
    gpt_model *m = NULL;
    if (gpt_new(&m, &c, be, a->micro, a->seq)) {
        fprintf(stderr, "gpt_new: %s\n", co_err_detail());
        return 1;
    }
    if (comm) gpt_set_tensor_group(m, comm, 600000);
    gpt_tp_set_overlap(m, !a->no_overlap);
    gpt_init(m, 1);
    size_t n = gpt_num_params(m), N = (size_t)a->micro * a->seq;
    float *mom = calloc(n, sizeof(float)), *var = calloc(n, sizeof(float)), *dscale = malloc(N * sizeof(float));
    float *mask = malloc(N * sizeof(float));
    int32_t *tok = malloc(N * 4), *tgt = malloc(N * 4), *pos = malloc(N * 4);
    co_rng r;
    co_rng_seed(&r, 5);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(co_rng_next(&r) % (uint64_t)a->vocab);
        tgt[i] = (int32_t)(co_rng_next(&r) % (uint64_t)a->vocab);
        pos[i] = (int32_t)(i % (size_t)a->seq);
        mask[i] = 1.0f;
        dscale[i] = 1.0f / (float)N;
    }
    gpt_batch b = {.B = a->micro, .T = a->seq, .tokens = tok, .targets = tgt, .positions = pos, .loss_mask = mask};
    double t_all = 0, comm_s = 0, loss = 0;
    uint64_t analytic = 0, z0 = 0, s0 = 0, z1 = 0, s1 = 0;
    for (int s = 0; s < a->warmup + a->steps; s++) {
        if (s == a->warmup) {
            gpt_tp_stats st;
            gpt_tp_stats_take(m, &st);
            if (comm) cm_zmq_traffic(comm, &z0, &s0);
        }
        double t0 = now_s();
        gpt_zero_grad(m);
        loss = gpt_forward(m, &b, true, 1, dscale, NULL) / (double)N;
        gpt_backward(m, &b, 1);
        gpt_tp_finalize_grads(m);
        be->ops->adamw(be, gpt_params(m), gpt_grads(m), mom, var, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, s + 1);
        if (kb_backend_status(be)) {
            fprintf(stderr, "rank %d: step %d: %s\n", rank, s, co_err_detail());
            return 1;
        }
        if (s >= a->warmup) t_all += now_s() - t0;
    }
    gpt_tp_stats st;
    gpt_tp_stats_take(m, &st);
    comm_s = st.comm_s;
    analytic = st.analytic_bytes;
    if (comm) cm_zmq_traffic(comm, &z1, &s1);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double step = t_all / a->steps;
    printf("tp %d%s%s rank %d: %d threads, %.1f ms/step, %.1f tokens/s, loss %.4f, collectives %.1f ms/step (%.0f%%, "
           "%llu calls), sent %.2f MB/step (ZeroMQ %.2f, shared memory %.2f) vs analytic %.2f MB/step, model state "
           "%.1f MB, peak RSS %.1f MB\n",
           a->tp, a->sp ? " sp" : "", a->no_overlap ? " no-overlap" : "", rank, a->threads, 1000 * step, (double)N / step, loss, 1000 * comm_s / a->steps,
           100 * comm_s / t_all, (unsigned long long)(st.calls / (uint64_t)a->steps),
           (double)(z1 - z0 + s1 - s0) / a->steps / 1e6, (double)(z1 - z0) / a->steps / 1e6,
           (double)(s1 - s0) / a->steps / 1e6, (double)analytic / a->steps / 1e6, 4.0 * 4.0 * (double)n / 1e6,
           (double)ru.ru_maxrss / 1024.0);
    fflush(stdout);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    cm_destroy(&comm);
    free(mom), free(var), free(dscale), free(mask), free(tok), free(tgt), free(pos);
    return 0;
}

int main(int argc, char **argv) {
    args a = {.tp = 1, .threads = 0, .layers = 12, .hidden = 768, .heads = 12, .seq = 256, .micro = 4,
              .vocab = 50257, .steps = 4, .warmup = 1};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--sp")) { a.sp = true; continue; }
        if (!strcmp(k, "--no-overlap")) { a.no_overlap = true; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "tp_bench: %s needs a value\n", k); return 2; }
        int v = atoi(argv[++i]);
        if (!strcmp(k, "--tp")) a.tp = v;
        else if (!strcmp(k, "--threads")) a.threads = v;
        else if (!strcmp(k, "--layers")) a.layers = v;
        else if (!strcmp(k, "--hidden")) a.hidden = v;
        else if (!strcmp(k, "--heads")) a.heads = v;
        else if (!strcmp(k, "--seq")) a.seq = v;
        else if (!strcmp(k, "--micro")) a.micro = v;
        else if (!strcmp(k, "--vocab")) a.vocab = v;
        else if (!strcmp(k, "--steps")) a.steps = v;
        else if (!strcmp(k, "--warmup")) a.warmup = v;
        else { fprintf(stderr, "tp_bench: unknown option %s\n", k); return 2; }
    }
    if (a.tp < 1 || a.tp > 8 || a.steps < 1) { fprintf(stderr, "tp_bench: --tp 1..8, --steps >= 1\n"); return 2; }
    if (a.threads <= 0) a.threads = a.tp == 1 ? 2 : 1;
    bench_cpu_print(stdout);
    if (a.tp == 1) return rank_main(&a, 0, NULL);
    char dir[] = "/tmp/tp-bench-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    pid_t pid[8];
    fflush(stdout);
    for (int r = 0; r < a.tp; r++)
        if ((pid[r] = fork()) == 0) _exit(rank_main(&a, r, dir));
    int bad = 0;
    for (int r = 0; r < a.tp; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "tp_bench: could not remove %s\n", dir);
    return bad ? 1 : 0;
}
