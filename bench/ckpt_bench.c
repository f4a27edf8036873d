/* ckpt_bench.c - checkpoint save and load bandwidth beside plain sequential dd on the same
 * disk in the same run, and the training-step stall of --async-save.
 *
 *   ckpt_bench [--dir DIR] [--layers 12 --hidden 768 --heads 12 --vocab 50257 --positions 1024]
 *              [--reps 2] [--warm-loads 1] [--step-ms 3500] [--no-async] [--json]
 *
 * The model defaults to GPT-2 124M; the checkpoint holds its parameters and both Adam
 * moments (3 x 124M fp32 = 1.49 GB). Per repetition:
 *   save   ck_save (headers, data, XXH3-128 while writing, fsync, manifest, commit)
 *   dd w   dd if=/dev/zero of=DIR/dd.bin bs=8M count=<same bytes> conv=fsync
 *   load   ck_load_tensors into the model's buffers (verifying every checksum), with the
 *          files evicted from the page cache first (posix_fadvise DONTNEED after fsync), and
 *          again warm (--warm-loads times, each followed by its dd), the files read
 *          through the page cache first (direct I/O saves and cold loads bypass it)
 *   dd r   dd if=DIR/dd.bin of=/dev/null bs=8M, evicted first, and warm
 * Each kind's best time is reported; CKPT_BENCH_VERBOSE=1 prints every load (wall and CPU
 * seconds of the process) and its dd. --no-async skips the async measurement.
 * Async: ck_saver_save with --async-save blocks only for the snapshot into host memory; the
 * stall is reported in ms and as a share of one training step (--step-ms, measured by
 * bench_train for the same configuration). Every result names the CPU (bench_cpu.h). */
#include "bench/bench_cpu.h"
#include "checkpoint/ckpt.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "kernels/backend.h"
#include "model/gpt.h"

#include <dirent.h>
#include <fcntl.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Drops a file's (clean) pages from the page cache. */
static void evict(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static void evict_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[8192];
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            evict(p);
        }
    closedir(d);
}

/* Reads every file of dir through the page cache (a save with direct I/O leaves nothing
 * there, nor does a cold load: the warm loads need the files cached first). */
static void cache_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[8192];
    static char buf[1 << 20];
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            int fd = open(p, O_RDONLY);
            if (fd < 0) continue;
            while (read(fd, buf, sizeof buf) > 0) {
            }
            close(fd);
        }
    closedir(d);
}

/* CPU seconds of this process (every thread) */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static double run(const char *cmd) {
    double t0 = now_s();
    if (system(cmd)) fprintf(stderr, "ckpt_bench: '%s' failed\n", cmd);
    return now_s() - t0;
}

/* Keeps every core busy with matrix products for ms milliseconds (a stand-in for the
 * forward and backward that run while an async snapshot is copied). */
static void busy_ms(double ms) {
    enum { D = 768 };
    static float a[D * D], b[D * D], c[D * D];
    for (int i = 0; i < D * D; i++) a[i] = b[i] = (float)(i % 13) * 0.01f;
    double t0 = now_s();
    while ((now_s() - t0) * 1e3 < ms) dnnl_sgemm('N', 'N', D, D, D, 1.0f, a, D, b, D, 0.0f, c, D);
}

int main(int argc, char **argv) {
    const char *dir = "/tmp/cohort-ckpt-bench";
    int layers = 12, hidden = 768, heads = 12, vocab = 50257, positions = 1024, reps = 2, warm_loads = 1;
    double step_ms = 3500;
    bool json = false, no_async = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--dir")) dir = v, i++;
        else if (!strcmp(a, "--layers")) layers = atoi(v), i++;
        else if (!strcmp(a, "--hidden")) hidden = atoi(v), i++;
        else if (!strcmp(a, "--heads")) heads = atoi(v), i++;
        else if (!strcmp(a, "--vocab")) vocab = atoi(v), i++;
        else if (!strcmp(a, "--positions")) positions = atoi(v), i++;
        else if (!strcmp(a, "--reps")) reps = atoi(v), i++;
        else if (!strcmp(a, "--step-ms")) step_ms = atof(v), i++;
        else if (!strcmp(a, "--warm-loads")) warm_loads = atoi(v), i++;
        else if (!strcmp(a, "--no-async")) no_async = true;
        else if (!strcmp(a, "--json")) json = true;
        else {
            fprintf(stderr, "usage: ckpt_bench [--dir DIR] [--layers L --hidden C --heads H --vocab V --positions P] "
                            "[--reps N] [--warm-loads K] [--step-ms MS] [--no-async] [--json]\n");
            return 2;
        }
    }
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 0, .bf16 = false};
    if (kb_backend_new(&be, &bo)) return 1;
    gpt_config gc = {.num_layers = layers, .hidden = hidden, .heads = heads, .kv_groups = heads,
                     .head_dim = hidden / heads, .ffn_hidden = 4 * hidden, .vocab = vocab,
                     .padded_vocab = gpt_padded_vocab(vocab, 128), .max_positions = positions, .norm_eps = 1e-5f,
                     .tied = true, .bias = true, .init_std = 0.02f};
    gpt_model *model = NULL;
    if (gpt_new(&model, &gc, be, 1, 1)) {
        fprintf(stderr, "ckpt_bench: model: %s\n", co_err_detail());
        return 1;
    }
    gpt_init(model, 1);
    size_t np = gpt_num_params(model);
    float *m = malloc(np * sizeof(float)), *v = malloc(np * sizeof(float));
    if (!m || !v) return 1;
    for (size_t i = 0; i < np; i++) {
        m[i] = (float)(i % 1000) * 1e-6f;
        v[i] = (float)(i % 777) * 1e-9f;
    }
    int nt = gpt_num_tensors(model);
    const gpt_tensor *gt = gpt_tensors(model);
    ck_tensor_ref *refs = calloc((size_t)nt * 3, sizeof *refs);
    char(*names)[CK_NAME_MAX] = calloc((size_t)nt * 3, sizeof *names);
    size_t bytes = 0;
    for (int part = 0; part < 3; part++)
        for (int i = 0; i < nt; i++) {
            ck_tensor_ref *r = &refs[part * nt + i];
            static const char *pre[] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
            snprintf(names[part * nt + i], CK_NAME_MAX, "%s%s", pre[part], gt[i].name);
            r->name = names[part * nt + i];
            r->kind = part ? CK_KIND_OPTIM : CK_KIND_MODEL;
            r->ndim = gt[i].ndim;
            r->shape[0] = gt[i].shape[0];
            r->shape[1] = gt[i].shape[1];
            float *base = part == 0 ? gpt_params(model) : part == 1 ? m : v;
            r->data = r->dst = base + gt[i].offset;
            bytes += gt[i].numel * 4;
        }
    ck_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.layout = (ck_layout){1, 1, 1, 1, 1, false, 1, 1};
    meta.model = (ck_model_info){layers, hidden, heads, heads, hidden / heads, 4 * hidden, vocab, gc.padded_vocab,
                                 positions, false, false, false, true, true, false, 1e-5, 10000};
    meta.optim = (ck_optim_info){true, "adamw", 1, 0.9, 0.95, 1e-8, 0.1, 1.0};
    ck_remove_dir(dir);
    char save[4096], ckdir[4200], ddf[4200], cmd[8800];
    snprintf(save, sizeof save, "%s/save", dir);
    snprintf(ddf, sizeof ddf, "%s/dd.bin", dir);
    if (fs_mkdirs(dir)) return 1;
    double best[6] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30}; /* save, ddw, load cold, ddr cold, load warm, ddr warm */
    size_t mb8 = (bytes + (8u << 20) - 1) / (8u << 20);
    for (int r = 0; r < reps; r++) {
        meta.iteration = meta.progress.iteration = r + 1;
        /* each write starts with no dirty pages left by the other, and the two alternate
         * which goes first: the disk's write-back state otherwise decides the ratio */
        unlink(ddf);
        snprintf(cmd, sizeof cmd, "dd if=/dev/zero of='%s' bs=8M count=%zu conv=fsync status=none", ddf, mb8);
        double ts = 0, tw = 0;
        for (int k = 0; k < 2; k++) {
            sync();
            if ((k == 0) == (r % 2 == 0)) {
                double t0 = now_s();
                if (ck_save(save, &meta, refs, nt * 3, 1, 1)) {
                    fprintf(stderr, "ckpt_bench: save: %s\n", co_err_detail());
                    return 1;
                }
                ts = now_s() - t0;
            } else {
                tw = run(cmd);
            }
        }
        double t0;
        ck_iter_dir(ckdir, sizeof ckdir, save, r + 1);
        ck_manifest *man = NULL;
        if (ck_read_manifest(ckdir, &man)) return 1;
        double tl[2] = {1e30, 1e30}, tr[2] = {1e30, 1e30};
        /* cold once, then warm_loads warm pairs; the best of each kind */
        for (int k = 0; k < 1 + (warm_loads > 0 ? warm_loads : 1); k++) {
            int warm = k > 0;
            if (!warm) evict_dir(ckdir);
            if (k == 1) cache_dir(ckdir);
            t0 = now_s();
            double c0 = cpu_s();
            ck_bad bad;
            if (ck_load_tensors(ckdir, man, refs, nt * 3, &bad)) {
                fprintf(stderr, "ckpt_bench: load: %s\n", co_err_detail());
                return 1;
            }
            double l = now_s() - t0, lc = cpu_s() - c0;
            if (!warm) evict(ddf);
            snprintf(cmd, sizeof cmd, "dd if='%s' of=/dev/null bs=8M status=none", ddf);
            double d = run(cmd);
            if (getenv("CKPT_BENCH_VERBOSE"))
                fprintf(stderr, "  %s load %.3f s (cpu %.3f s), dd read %.3f s\n", warm ? "warm" : "cold", l, lc, d);
            if (l < tl[warm]) tl[warm] = l;
            if (d < tr[warm]) tr[warm] = d;
        }
        ck_manifest_free(&man);
        double t[6] = {ts, tw, tl[0], tr[0], tl[1], tr[1]};
        for (int k = 0; k < 6; k++)
            if (t[k] < best[k]) best[k] = t[k];
    }
    unlink(ddf);
    /* async: the stall per save, three saves one "step" apart (waiting for the writer) */
    ck_saver *s = NULL;
    ck_saver_opts so = {.save_dir = save, .async = true, .keep = 1, .writers = 1, .log = NULL};
    if (ck_saver_new(&s, &so) || ck_saver_reserve(s, bytes / 4)) return 1;
    double stall = 0, stall_max = 0;
    int nsaves = no_async ? 0 : 3;
    for (int r = 0; r < nsaves; r++) {
        meta.iteration = meta.progress.iteration = 100 + r;
        if (ck_saver_save(s, &meta, refs, nt * 3)) return 1;
        double st = ck_saver_last_stall(s);
        /* the next iteration's forward and backward (about 90% of a step): real matrix
         * work on every core, competing with the snapshot copy as training would */
        busy_ms(0.9 * step_ms);
        st += ck_saver_wait_snapshot(s); /* before the optimizer step */
        stall += st;
        if (st > stall_max) stall_max = st;
        if (ck_saver_wait(s)) return 1;
    }
    if (nsaves) stall /= nsaves;
    ck_saver_destroy(&s);
    ck_remove_dir(dir);
    double gb = (double)bytes / 1e9;
    char cpu[768];
    bench_cpu_json(cpu, sizeof cpu);
    if (json)
        printf("{\"bytes\":%zu,\"save_s\":%.3f,\"dd_write_s\":%.3f,\"load_cold_s\":%.3f,\"dd_read_cold_s\":%.3f,"
               "\"load_warm_s\":%.3f,\"dd_read_warm_s\":%.3f,\"save_vs_dd\":%.3f,\"load_cold_vs_dd\":%.3f,"
               "\"load_warm_vs_dd\":%.3f,\"async_stall_ms\":%.1f,\"async_stall_max_ms\":%.1f,\"step_ms\":%.0f,"
               "\"async_stall_share\":%.4f,%s}\n",
               bytes, best[0], best[1], best[2], best[3], best[4], best[5], best[1] / best[0], best[3] / best[2],
               best[5] / best[4], stall * 1e3, stall_max * 1e3, step_ms, stall * 1e3 / step_ms, cpu);
    else {
        bench_cpu_print(stdout);
        printf("checkpoint of %zu parameters + Adam moments: %.3f GB, best of %d\n", np, gb, reps);
        printf("  save  %.2f s = %.2f GB/s   dd write (conv=fsync) %.2f s = %.2f GB/s   ratio %.0f%%\n", best[0],
               gb / best[0], best[1], gb / best[1], 100 * best[1] / best[0]);
        printf("  load cold %.2f s = %.2f GB/s   dd read cold %.2f s = %.2f GB/s   ratio %.0f%%\n", best[2], gb / best[2],
               best[3], gb / best[3], 100 * best[3] / best[2]);
        printf("  load warm %.2f s = %.2f GB/s   dd read warm %.2f s = %.2f GB/s   ratio %.0f%%\n", best[4], gb / best[4],
               best[5], gb / best[5], 100 * best[5] / best[4]);
        printf("  --async-save stall %.1f ms per checkpoint (max %.1f) = %.2f%% of a %.0f ms step\n", stall * 1e3,
               stall_max * 1e3, 100 * stall * 1e3 / step_ms, step_ms);
    }
    free(refs);
    free(names);
    free(m);
    free(v);
    gpt_destroy(&model);
    kb_backend_destroy(&be);
    return 0;
}
