/* allreduce_bench.c - all-reduce bus bandwidth of the CPU collectives (comm/zmq_*.c:
 * shared memory between ranks on one host, ZeroMQ otherwise) beside raw ZeroMQ
 * point-to-point bandwidth, measured in the same run on the same transport.
 *
 * For each rank count (2 and 4) it forks the ranks on ipc endpoints in a temporary
 * directory and, for f32 buffers from 1 KiB to 256 MiB (powers of 4), times the all-reduce
 * and reports bus bandwidth as nccl-tests defines it: busbw = 2(n-1)/n * size / time, with
 * time averaged over ranks (best of 3 interleaved rounds, as for point-to-point). Between ranks 0 and 1 of the same group, on the same kind of
 * endpoint and with the same message sizes, it measures ZeroMQ PUSH->PULL bandwidth two
 * ways: "raw" (zero-copy send of the buffer, received message not copied out: the most
 * ZeroMQ can move) and "copy" (zmq_send/zmq_recv to and from user buffers). Prints a
 * markdown table; the last column is busbw / raw point-to-point.
 *
 * usage: allreduce_bench [max_bytes] [chunk_bytes] [shm_block_bytes] [ipc|tcp|tcp-curve]
 *        (defaults 256 MiB, 4 MiB, the library's default block and ipc; shm_block_bytes 0 =
 *        the all-reduce over ZeroMQ only, as before shared memory; tcp: endpoints on
 *        127.0.0.1, no shared memory; tcp-curve: the same with the data plane's CURVE, a job
 *        secret generated for the run. The p2p columns are plain ZeroMQ on the same kind of
 *        endpoint, without CURVE.)
 * The output starts with the CPU (bench_cpu.h: model name, ISA flags). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench_cpu.h"
#include "comm/zmq_comm.h"
#include "common/error.h"

#define ROUNDS 3

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int iters_for(size_t bytes) {
    size_t it = ((size_t)64 << 20) / bytes;
    if (it > 200) it = 200;
    if (it < 2) it = 2;
    return (int)it;
}

static void nofree(void *data, void *hint) {
    (void)data;
    (void)hint;
}

/* PUSH (rank 0) -> PULL (rank 1) of iters messages of `bytes`, then a one-byte ack back;
 * returns bytes per second as seen by rank 0 (0 on rank 1). */
static double p2p(void *push, void *pull_ack, void *pull, void *push_ack, int rank, void *buf,
                  size_t bytes, int iters, int copy) {
    char ack = 0;
    if (rank == 0) {
        /* warm-up message */
        zmq_send(push, buf, bytes, 0);
        zmq_recv(pull_ack, &ack, 1, 0);
        double t0 = now_s();
        for (int i = 0; i < iters; i++) {
            if (copy) {
                zmq_send(push, buf, bytes, 0);
            } else {
                zmq_msg_t m;
                zmq_msg_init_data(&m, buf, bytes, nofree, NULL); /* buf is never written */
                zmq_msg_send(&m, push, 0);
            }
        }
        zmq_recv(pull_ack, &ack, 1, 0);
        return (double)bytes * iters / (now_s() - t0);
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, pull, 0);
    zmq_msg_close(&m);
    zmq_send(push_ack, &ack, 1, 0);
    for (int i = 0; i < iters; i++) {
        if (copy) {
            zmq_recv(pull, buf, bytes, 0);
        } else {
            zmq_msg_init(&m);
            zmq_msg_recv(&m, pull, 0);
            zmq_msg_close(&m);
        }
    }
    zmq_send(push_ack, &ack, 1, 0);
    return 0;
}

typedef struct row {
    size_t bytes;
    double us, busbw, raw, copy;
} row;

static const char *g_mode = "ipc"; /* ipc, tcp, tcp-curve */
static int g_port;
static char g_spub[41], g_ssec[41], g_cpub[41], g_csec[41];

static int rank_main(int rank, int n, const char *dir, size_t max_bytes, size_t chunk, long shm,
                     int out_fd) {
    char eps[4][160];
    const char *ep[4];
    bool tcp = strcmp(g_mode, "ipc") != 0;
    for (int r = 0; r < n; r++) {
        if (tcp) snprintf(eps[r], sizeof eps[r], "tcp://127.0.0.1:%d", g_port + r);
        else snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options o;
    cm_zmq_options_default(&o);
    o.chunk_bytes = chunk;
    if (shm >= 0) o.shm_block_bytes = (size_t)shm;
    if (!strcmp(g_mode, "tcp-curve")) {
        o.curve_server_public = g_spub;
        o.curve_server_secret = g_ssec;
        o.curve_client_secret = g_csec;
    }
    cm_comm *c = NULL;
    int rc = cm_zmq_new(&c, rank, n, ep, &o);
    if (rc) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, co_err_name(rc), co_err_detail());
        return 1;
    }
    /* point-to-point sockets between ranks 0 and 1, on their own context */
    void *ctx = NULL, *push = NULL, *pull = NULL, *ack_push = NULL, *ack_pull = NULL;
    if (rank < 2) {
        char d[200], a[200];
        if (tcp) {
            snprintf(d, sizeof d, "tcp://127.0.0.1:%d", g_port + 8);
            snprintf(a, sizeof a, "tcp://127.0.0.1:%d", g_port + 9);
        } else {
            snprintf(d, sizeof d, "ipc://%s/p2p", dir);
            snprintf(a, sizeof a, "ipc://%s/ack", dir);
        }
        int zero = 0;
        ctx = zmq_ctx_new();
        if (rank == 0) {
            push = zmq_socket(ctx, ZMQ_PUSH);
            ack_pull = zmq_socket(ctx, ZMQ_PULL);
            zmq_setsockopt(push, ZMQ_SNDHWM, &zero, sizeof zero);
            zmq_bind(push, d);
            zmq_bind(ack_pull, a);
        } else {
            pull = zmq_socket(ctx, ZMQ_PULL);
            ack_push = zmq_socket(ctx, ZMQ_PUSH);
            zmq_setsockopt(pull, ZMQ_RCVHWM, &zero, sizeof zero);
            zmq_connect(pull, d);
            zmq_connect(ack_push, a);
        }
    }
    c->ops->barrier(c, 60000); /* both p2p ends exist */
    float *buf = malloc(max_bytes);
    for (size_t i = 0; i < max_bytes / 4; i++) buf[i] = (float)(i % 1000) * 0.001f;
    for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
        int iters = iters_for(bytes);
        size_t count = bytes / 4;
        row rw = {bytes, 1e30, 0, 0, 0};
        rc = c->ops->allreduce_sum(c, buf, count, CM_F32, 120000); /* warm-up */
        /* The machine is shared: ROUNDS interleaved rounds of all-reduce and point-to-point,
         * the best of each kept, so both see the same conditions. */
        for (int round = 0; round < ROUNDS && !rc; round++) {
            rc |= c->ops->barrier(c, 120000);
            double t0 = now_s();
            for (int i = 0; i < iters && !rc; i++)
                rc = c->ops->allreduce_sum(c, buf, count, CM_F32, 120000);
            double tsum = (now_s() - t0) / iters;
            if (!rc) rc = c->ops->allreduce_sum(c, &tsum, 1, CM_F64, 120000);
            if (rc) break;
            if (tsum / n * 1e6 < rw.us) rw.us = tsum / n * 1e6;
            int pit = iters < 100 ? iters : 100;
            c->ops->barrier(c, 120000);
            double bw = 0;
            if (rank < 2) bw = p2p(push, ack_pull, pull, ack_push, rank, buf, bytes, pit, 0);
            if (bw > rw.raw) rw.raw = bw;
            c->ops->barrier(c, 120000);
            bw = 0;
            if (rank < 2) bw = p2p(push, ack_pull, pull, ack_push, rank, buf, bytes, pit, 1);
            if (bw > rw.copy) rw.copy = bw;
        }
        if (rc) {
            fprintf(stderr, "rank %d: %s: %s\n", rank, co_err_name(rc), co_err_detail());
            return 1;
        }
        rw.busbw = (double)bytes / (rw.us * 1e-6) * 2.0 * (n - 1) / n;
        c->ops->barrier(c, 120000);
        if (rank == 0 && write(out_fd, &rw, sizeof rw) != (ssize_t)sizeof rw) return 1;
    }
    free(buf);
    if (ctx) {
        int zero = 0;
        void *s[4] = {push, pull, ack_push, ack_pull};
        for (int i = 0; i < 4; i++)
            if (s[i]) {
                zmq_setsockopt(s[i], ZMQ_LINGER, &zero, sizeof zero);
                zmq_close(s[i]);
            }
        zmq_ctx_term(ctx);
    }
    cm_destroy(&c);
    return 0;
}

static const char *human(size_t b, char *s, size_t n) {
    if (b >= (1u << 20))
        snprintf(s, n, "%zu MiB", b >> 20);
    else
        snprintf(s, n, "%zu KiB", b >> 10);
    return s;
}

int main(int argc, char **argv) {
    size_t max_bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)256 << 20;
    size_t chunk = argc > 2 ? strtoull(argv[2], NULL, 0) : (size_t)4 << 20;
    long shm = argc > 3 ? strtol(argv[3], NULL, 0) : -1; /* -1: the library's default */
    if (argc > 4) g_mode = argv[4];
    if (strcmp(g_mode, "ipc") && strcmp(g_mode, "tcp") && strcmp(g_mode, "tcp-curve")) {
        fprintf(stderr, "allreduce_bench: transport %s: want ipc, tcp or tcp-curve\n", g_mode);
        return 2;
    }
    zmq_curve_keypair(g_spub, g_ssec);
    zmq_curve_keypair(g_cpub, g_csec);
    cm_zmq_options dflt;
    cm_zmq_options_default(&dflt);
    size_t shm_eff = shm >= 0 ? (size_t)shm : dflt.shm_block_bytes;
    static const int ns[] = {2, 4};
    row res[2][16];
    int nrows = 0;
    for (int k = 0; k < 2; k++) {
        int n = ns[k];
        char dir[] = "/tmp/cmbench-XXXXXX";
        g_port = 30000 + (int)(getpid() % 1000) * 20 + k * 10; /* ranks +0..3, p2p +8, +9 */
        if (!mkdtemp(dir)) return 1;
        int fds[2];
        if (pipe(fds)) return 1;
        pid_t pid[4];
        for (int r = 0; r < n; r++) {
            pid[r] = fork();
            if (pid[r] == 0) {
                close(fds[0]);
                _exit(rank_main(r, n, dir, max_bytes, chunk, shm, fds[1]));
            }
        }
        close(fds[1]);
        int m = 0;
        while (m < 16 && read(fds[0], &res[k][m], sizeof(row)) == (ssize_t)sizeof(row)) m++;
        close(fds[0]);
        int bad = 0;
        for (int r = 0; r < n; r++) {
            int st;
            waitpid(pid[r], &st, 0);
            bad |= !WIFEXITED(st) || WEXITSTATUS(st);
        }
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd)) {
        }
        if (bad) {
            fprintf(stderr, "allreduce_bench: a rank failed with %d ranks\n", n);
            return 1;
        }
        nrows = m;
    }
    bench_cpu_print(stdout);
    if (strcmp(g_mode, "ipc"))
        printf("All-reduce f32 over ZeroMQ %s on 127.0.0.1, chunk %zu KiB", !strcmp(g_mode, "tcp") ? "tcp" : "tcp with CURVE (data plane encrypted)", chunk >> 10);
    else if (shm_eff)
        printf("All-reduce f32 between ranks on ipc endpoints, through shared memory in blocks of "
               "%zu KiB", shm_eff >> 10);
    else
        printf("All-reduce f32 over ZeroMQ ipc only, chunk %zu KiB", chunk >> 10);
    printf("; GB/s = 1e9 B/s; p2p = PUSH->PULL between ranks 0 and 1 of the same run (raw: "
           "zero-copy, copy: zmq_send/zmq_recv)\n\n");
    printf("| size | ranks | time (us) | busbw GB/s | p2p raw GB/s | p2p copy GB/s | busbw / raw |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < nrows; i++)
        for (int k = 0; k < 2; k++) {
            row *w = &res[k][i];
            char s[32];
            printf("| %s | %d | %.1f | %.3f | %.3f | %.3f | %.0f%% |\n", human(w->bytes, s, sizeof s),
                   ns[k], w->us, w->busbw / 1e9, w->raw / 1e9, w->copy / 1e9,
                   100.0 * w->busbw / w->raw);
        }
    return 0;
}
