/* test_dio.c - unit tests of checkpoint/dio.c, the direct-I/O block writer and reader, and
 * of the save and load paths that use them on files of several blocks: contents and hashes
 * against plain reads, small files staying buffered, every write failing in turn (ENOSPC,
 * EIO) with no hang, a cold file read by several threads in pieces of every size, a file
 * shorter than expected, a consumer giving up, a corrupted byte found by the loader, and
 * the same with COHORT_CKPT_DIRECT_IO=0, a disk that stops answering (writes or reads that
 * never return: CO_ETIMEOUT after COHORT_CKPT_IO_TIMEOUT, no hang). Direct I/O is asserted to be used where the
 * scratch directory's file system accepts O_DIRECT (and reported skipped where not). */
#include "checkpoint/ckpt.h"
#include "checkpoint/dio.h"
#include "checkpoint/store.h"
#include "common/error.h"
#include "tests/test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char root[256];
static bool direct_ok; /* the scratch file system takes O_DIRECT */

#define MB (1u << 20)
/* pieces of odd sizes, 5 full blocks and a tail in all */
static const size_t pieces[] = {123, 17 * MB + 5, 3, 25 * MB + 777, 1, 2 * MB - 909};
#define NPIECES (sizeof pieces / sizeof pieces[0])

static size_t total_bytes(void) {
    size_t t = 0;
    for (size_t i = 0; i < NPIECES; i++) t += pieces[i];
    return t;
}

static unsigned char *pattern(size_t n, uint64_t seed) {
    unsigned char *p = malloc(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; p && i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)(x >> 24);
    }
    return p;
}

static unsigned char *read_whole(const char *path, size_t *n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat st;
    fstat(fd, &st);
    unsigned char *b = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (b && got < (size_t)st.st_size) {
        ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *n = got;
    return b;
}

/* Drops path from the page cache; returns whether the loader now finds it cold. The kernel
 * may keep pages that are still under writeback or were read back meanwhile (a loaded
 * machine), so it tries a few times; a caller that needs a cold file checks the answer. */
static bool evict(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    struct stat st;
    bool cold = false;
    if (fstat(fd, &st) == 0)
        for (int i = 0; i < 20 && !cold; i++) {
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            cold = ck_dr_file_is_cold(fd, (uint64_t)st.st_size);
            if (!cold) usleep(50 * 1000);
        }
    close(fd);
    return cold;
}

/* Writes the pieces of data through ck_file; the file's hash into h. */
static int write_pieces(const char *path, const unsigned char *data, uint8_t h[16]) {
    unlink(path);
    ck_file f;
    int rc = ck_file_create(&f, path);
    if (rc) return rc;
    size_t off = 0;
    for (size_t i = 0; i < NPIECES && !rc; i++) {
        rc = ck_file_write(&f, data + off, pieces[i]);
        off += pieces[i];
    }
    if (rc) {
        ck_file_abort(&f);
        return rc;
    }
    return ck_file_finish(&f, h);
}

/* root/name, and n bytes of pattern(seed) written to it in the pieces (NULL on failure). */
static unsigned char *make_file(const char *name, uint64_t seed, char *path, size_t pn, size_t *n, uint8_t h[16]) {
    snprintf(path, pn, "%s/%s", root, name);
    *n = total_bytes();
    unsigned char *data = pattern(*n, seed);
    if (data && write_pieces(path, data, h)) {
        free(data);
        return NULL;
    }
    return data;
}

static void check_written(const char *path, const unsigned char *data, size_t n, const uint8_t h[16]) {
    size_t got = 0;
    unsigned char *b = read_whole(path, &got);
    REQUIRE(b);
    CHECK_MSG(got == n, "%s: %zu bytes, wrote %zu", path, got, n);
    CHECK_MSG(got == n && !memcmp(b, data, n), "%s: contents differ", path);
    free(b);
    uint8_t h2[16];
    uint64_t sz = 0;
    CHECK(!ck_hash_file(path, h2, &sz) && sz == n && !memcmp(h, h2, 16));
}

static void test_writer_blocks(void) {
    char path[512];
    size_t n;
    uint8_t h[16];
    uint64_t before = ck_dio_bytes_written();
    unsigned char *data = make_file("blocks.bin", 1, path, sizeof path, &n, h);
    REQUIRE(data);
    uint64_t direct = ck_dio_bytes_written() - before;
    check_written(path, data, n, h);
    if (direct_ok) /* every full block went direct, the tail through the page cache */
        CHECK_MSG(direct == n / CK_DIO_BLOCK * CK_DIO_BLOCK, "direct bytes %llu of %zu", (unsigned long long)direct, n);
    else
        CHECK(direct == 0);
    /* turned off: the same file, nothing direct */
    setenv("COHORT_CKPT_DIRECT_IO", "0", 1);
    before = ck_dio_bytes_written();
    REQUIRE(!write_pieces(path, data, h));
    CHECK(ck_dio_bytes_written() == before);
    check_written(path, data, n, h);
    unsetenv("COHORT_CKPT_DIRECT_IO");
    /* a small file: one buffered write at the end */
    snprintf(path, sizeof path, "%s/small.bin", root);
    ck_file f;
    REQUIRE(!ck_file_create(&f, path));
    CHECK(!ck_file_write(&f, data, 1000) && !ck_file_write(&f, data + 1000, 5000));
    before = ck_dio_bytes_written();
    ck_test_fail_write(2, ENOSPC); /* a second write would fail: there is none */
    CHECK(!ck_file_finish(&f, h));
    ck_test_fail_write(0, 0);
    CHECK(ck_dio_bytes_written() == before);
    check_written(path, data, 6000, h);
    free(data);
}

static void test_writer_failing(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/failing.bin", root);
    size_t n = total_bytes();
    unsigned char *data = pattern(n, 2);
    REQUIRE(data);
    int writes = -1;
    for (int k = 1; k < 20; k++) {
        int err = k % 2 ? ENOSPC : EIO;
        ck_test_fail_write(k, err);
        uint8_t h[16];
        int rc = write_pieces(path, data, h);
        ck_test_fail_write(0, 0);
        if (!rc) {
            writes = k - 1;
            break;
        }
        CHECK_MSG(rc == (err == ENOSPC ? CO_ENOSPC : CO_EIO), "write %d: rc %d (%s)", k, rc, co_err_detail());
        CHECK_MSG(strstr(co_err_detail(), "failing.bin") && strstr(co_err_detail(), strerror(err)), "write %d: %s", k,
                  co_err_detail());
    }
    /* five full blocks and the tail, whichever way they went */
    CHECK_MSG(writes == (int)(n / CK_DIO_BLOCK) + 1, "%d writes", writes);
    free(data);
}

/* ---- reader ---- */

typedef struct {
    ck_dr *r;
    uint64_t start, end;
    unsigned char *dst;
    uint64_t next; /* claimed up to here (under mu) */
    pthread_mutex_t mu;
    uint64_t seed;
    int rc;
} share;

static void *consumer(void *arg) {
    share *s = arg;
    uint64_t x = s->seed;
    for (;;) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t len = 1 + (size_t)(x % (3 * MB));
        if (x % 5 == 0) len = 1 + (size_t)(x % 100); /* small ones too */
        pthread_mutex_lock(&s->mu);
        uint64_t off = s->next;
        if (off + len > s->end) len = (size_t)(s->end - off);
        s->next = off + len;
        pthread_mutex_unlock(&s->mu);
        if (!len) break;
        int rc = ck_dr_copy(s->r, s->dst + (off - s->start), len, off);
        if (rc) {
            pthread_mutex_lock(&s->mu);
            if (!s->rc) s->rc = rc;
            pthread_mutex_unlock(&s->mu);
            break;
        }
    }
    return NULL;
}

static void test_reader(void) {
    char path[512];
    size_t n;
    uint8_t h[16];
    unsigned char *data = make_file("read.bin", 3, path, sizeof path, &n, h);
    REQUIRE(data);
    evict(path);
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    if (direct_ok) CHECK(ck_dr_file_is_cold(fd, n));
    close(fd);
    ck_dr *r = NULL;
    int rc = ck_dr_new(&r, path, 100, n);
    if (!direct_ok) {
        CHECK(rc == CO_EUNSUPPORTED && !r);
        free(data);
        return;
    }
    REQUIRE(!rc && r);
    uint64_t before = ck_dio_bytes_read();
    share s = {.r = r, .start = 100, .end = n, .next = 100, .seed = 77};
    s.dst = malloc(n);
    REQUIRE(s.dst);
    pthread_mutex_init(&s.mu, NULL);
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, consumer, &s);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK_MSG(s.rc == 0, "rc %d: %s", s.rc, co_err_detail());
    CHECK(!memcmp(s.dst, data + 100, n - 100));
    CHECK(ck_dio_bytes_read() - before == n); /* whole blocks from 0: the first one holds bytes 0..99 too */
    ck_dr_destroy(&r);
    CHECK(!r);
    /* the file is shorter than the reader was told: every copy fails, as truncated */
    REQUIRE(!ck_dr_new(&r, path, 0, n + 3 * MB));
    rc = ck_dr_copy(r, s.dst, n, 0); /* what exists, then the missing end below */
    if (!rc) rc = ck_dr_copy(r, s.dst, 3 * MB, n);
    CHECK_MSG(rc == CO_EFORMAT && strstr(co_err_detail(), "truncated"), "rc %d: %s", rc, co_err_detail());
    ck_dr_destroy(&r);
    free(s.dst);
    free(data);
}

typedef struct {
    ck_dr *r;
    uint64_t off;
    int rc;
    unsigned char buf[4096];
} waiter;

static void *wait_copy(void *arg) {
    waiter *w = arg;
    w->rc = ck_dr_copy(w->r, w->buf, sizeof w->buf, w->off);
    return NULL;
}

static void test_reader_abort(void) {
    if (!direct_ok) return;
    char path[512];
    snprintf(path, sizeof path, "%s/read.bin", root); /* from test_reader */
    size_t n = total_bytes();
    ck_dr *r = NULL;
    REQUIRE(!ck_dr_new(&r, path, 0, n));
    /* nobody takes block 0: block CK_DIO_SLOTS (same slot) can never be read */
    waiter w = {.r = r, .off = (uint64_t)CK_DIO_SLOTS * CK_DIO_BLOCK + 5};
    pthread_t th;
    pthread_create(&th, NULL, wait_copy, &w);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    ck_dr_abort(r); /* the consumer of block 0 gave up */
    pthread_join(th, NULL);
    CHECK_MSG(w.rc == CO_EABORTED, "rc %d", w.rc);
    ck_dr_destroy(&r);
    /* destroying with reads in flight and nothing consumed does not hang either */
    REQUIRE(!ck_dr_new(&r, path, 0, n));
    ck_dr_destroy(&r);
}

/* ---- save and load through them ---- */

static void test_save_load(void) {
    char save[512], dir[600], path[900];
    snprintf(save, sizeof save, "%s/save", root);
    ck_remove_dir(save);
    /* a model file of ~20 MiB and an optimizer file of ~40 MiB (rows of odd length) */
    enum { R = 4099, C = 1283, NF = R * C };
    float *w = malloc(NF * sizeof(float)), *m1 = malloc(NF * sizeof(float)), *m2 = malloc(NF * sizeof(float));
    float *lw = malloc(NF * sizeof(float)), *l1 = malloc(NF * sizeof(float)), *l2 = malloc(NF * sizeof(float));
    REQUIRE(w && m1 && m2 && lw && l1 && l2);
    for (int i = 0; i < NF; i++) w[i] = (float)i * 1e-3f, m1[i] = -(float)i, m2[i] = (float)(i % 977) * 0.5f;
    ck_tensor_ref refs[3] = {{.name = "w", .kind = CK_KIND_MODEL, .ndim = 2, .shape = {R, C}, .data = w, .dst = lw},
                             {.name = "optimizer.exp_avg.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {R, C}, .data = m1, .dst = l1},
                             {.name = "optimizer.exp_avg_sq.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {R, C}, .data = m2, .dst = l2}};
    ck_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.iteration = 7;
    meta.progress.iteration = 7;
    meta.layout = (ck_layout){1, 1, 1, 1, 1, false, 1, 1};
    meta.model = (ck_model_info){1, C, 1, 1, C, 4 * C, R, R, 16, false, false, false, true, true, false, 1e-5, 10000};
    meta.optim = (ck_optim_info){true, "adamw", 7, 0.9, 0.999, 1e-8, 0.01, 1.0};
    for (int mode = 0; mode < 2; mode++) { /* direct allowed, then turned off */
        if (mode) setenv("COHORT_CKPT_DIRECT_IO", "0", 1);
        ck_remove_dir(save);
        uint64_t wb = ck_dio_bytes_written();
        int src = ck_save(save, &meta, refs, 3, 1, 0);
        CHECK_MSG(!src, "save: %s", co_err_detail());
        REQUIRE(!src);
        CHECK(direct_ok && !mode ? ck_dio_bytes_written() - wb >= 3ull * NF * 4 - 2 * CK_DIO_BLOCK
                                 : ck_dio_bytes_written() == wb);
        ck_iter_dir(dir, sizeof dir, save, 7);
        ck_manifest *man = NULL;
        REQUIRE(!ck_read_manifest(dir, &man));
        const char *chunks[] = {NULL, "1000"}; /* the default, and odd chunks on 3 threads */
        for (int c = 0; c < 2; c++) {
            if (chunks[c]) setenv("COHORT_CKPT_LOAD_CHUNK", chunks[c], 1), setenv("COHORT_CKPT_LOAD_THREADS", "3", 1);
            bool cold = true;
            for (int i = 0; i < man->nfiles; i++) {
                snprintf(path, sizeof path, "%s/%s", dir, man->files[i].name);
                cold &= evict(path);
            }
            memset(lw, 0, NF * 4), memset(l1, 0, NF * 4), memset(l2, 0, NF * 4);
            uint64_t rb = ck_dio_bytes_read();
            ck_bad bad = CK_OK;
            int rc = ck_load_tensors(dir, man, refs, 3, &bad);
            CHECK_MSG(!rc, "mode %d chunks %s: %s", mode, chunks[c] ? chunks[c] : "default", co_err_detail());
            CHECK(!memcmp(w, lw, NF * 4) && !memcmp(m1, l1, NF * 4) && !memcmp(m2, l2, NF * 4));
            /* cold files are read direct: all three tensors' bytes on a quiet machine; on a
             * loaded one (ASan, other jobs) the loader's own residency test at open can find
             * a file half cached again by readahead, so at least one file's worth is asked */
            uint64_t direct = ck_dio_bytes_read() - rb;
            if (direct_ok && !mode && !cold)
                fprintf(stderr, "  note: the page cache kept the files; the direct-read count is not checked\n");
            else if (direct_ok && !mode) {
                CHECK_MSG(direct >= (uint64_t)NF * 4, "direct reads %llu of %llu bytes", (unsigned long long)direct,
                          3ull * NF * 4);
                if (direct < 3ull * NF * 4)
                    fprintf(stderr, "  note: %llu of %llu bytes read direct\n", (unsigned long long)direct,
                            3ull * NF * 4);
            } else
                CHECK(direct == 0);
            unsetenv("COHORT_CKPT_LOAD_CHUNK");
            unsetenv("COHORT_CKPT_LOAD_THREADS");
        }
        /* one flipped byte in the middle of the optimizer file: a checksum mismatch */
        int oi = !strcmp(man->files[0].name, "model.safetensors") ? 1 : 0;
        snprintf(path, sizeof path, "%s/%s", dir, man->files[oi].name);
        int fd = open(path, O_RDWR);
        REQUIRE(fd >= 0);
        off_t at = (off_t)(man->files[oi].size / 2);
        unsigned char b;
        CHECK(pread(fd, &b, 1, at) == 1);
        b ^= 0x10;
        CHECK(pwrite(fd, &b, 1, at) == 1);
        close(fd);
        evict(path);
        ck_bad bad = CK_OK;
        int rc = ck_load_tensors(dir, man, refs, 3, &bad);
        CHECK_MSG(rc == CO_EFORMAT && bad == CK_BAD_CHECKSUM && strstr(co_err_detail(), "checksum mismatch"),
                  "rc %d bad %d: %s", rc, (int)bad, co_err_detail());
        /* ck_verify reads without destinations */
        evict(path);
        CHECK(ck_verify(dir, &bad, NULL, NULL) && bad == CK_BAD_CHECKSUM);
        ck_manifest_free(&man);
    }
    unsetenv("COHORT_CKPT_DIRECT_IO");
    free(w), free(m1), free(m2), free(lw), free(l1), free(l2);
}

/* ---- a disk that stops answering ---- */

/* The hooks block until the gate opens (at most 60 s, so the test itself cannot hang). */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;
static int gate_inside; /* calls blocked in the gate now */

static void gate_wait(void) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&gate_mu);
    gate_inside++;
    while (!gate_open && pthread_cond_timedwait(&gate_cv, &gate_mu, &dl) != ETIMEDOUT) {}
    gate_inside--;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static ssize_t stuck_pwrite(int fd, const void *b, size_t n, off_t o) {
    gate_wait();
    return pwrite(fd, b, n, o);
}

static ssize_t stuck_pread(int fd, void *b, size_t n, off_t o) {
    gate_wait();
    return pread(fd, b, n, o);
}

static int inside(void) {
    pthread_mutex_lock(&gate_mu);
    int n = gate_inside;
    pthread_mutex_unlock(&gate_mu);
    return n;
}

static void gate_set(bool open) {
    pthread_mutex_lock(&gate_mu);
    gate_open = open;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* Opens the gate and waits (bounded) until the abandoned I/O threads left it. */
static void gate_release(void) {
    ck__dio_set_io_hooks(NULL, NULL);
    gate_set(true);
    for (int i = 0; i < 500 && inside(); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(inside() == 0);
    struct timespec ts = {0, 100 * 1000 * 1000}; /* they free their writer / reader */
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Both I/O threads stuck inside their writes: the save ends with CO_ETIMEOUT naming the
 * file after COHORT_CKPT_IO_TIMEOUT, not a hang; the threads are abandoned, not waited for. */
static void test_stuck_write(void) {
    if (!direct_ok) TEST_SKIP_CASE("no O_DIRECT here: every write is the caller's own, no I/O thread to wait for");
    char path[512];
    snprintf(path, sizeof path, "%s/stuck.bin", root);
    size_t n = total_bytes();
    unsigned char *data = pattern(n, 5);
    REQUIRE(data);
    setenv("COHORT_CKPT_IO_TIMEOUT", "0.5", 1);
    CHECK(ck__io_timeout_s() == 0.5);
    gate_set(false);
    ck__dio_set_io_hooks(stuck_pwrite, NULL);
    double t0 = now_s();
    uint8_t h[16];
    int rc = write_pieces(path, data, h);
    double dt = now_s() - t0;
    CHECK_MSG(rc == CO_ETIMEOUT, "rc %d: %s", rc, co_err_detail());
    CHECK_MSG(strstr(co_err_detail(), "stuck.bin") && strstr(co_err_detail(), "no block write finished within 0.5 s"),
              "%s", co_err_detail());
    CHECK_MSG(dt >= 0.5 && dt < 10, "%.2f s", dt);
    CHECK_MSG(inside() == CK_DIO_THREADS, "%d writes still stuck", inside()); /* abandoned, not joined */
    gate_release();
    unsetenv("COHORT_CKPT_IO_TIMEOUT");
    CHECK(ck__io_timeout_s() == 300.0);
    /* the same file writes again once the disk answers */
    CHECK(!write_pieces(path, data, h));
    check_written(path, data, n, h);
    free(data);
}

/* Reads that never return: ck_dr_copy ends with CO_ETIMEOUT, ck_dr_destroy returns. */
static void test_stuck_read(void) {
    if (!direct_ok) TEST_SKIP_CASE("no O_DIRECT here: no direct reader");
    char path[512];
    size_t n;
    uint8_t h[16];
    unsigned char *data = make_file("stuck-read.bin", 6, path, sizeof path, &n, h);
    REQUIRE(data);
    evict(path);
    setenv("COHORT_CKPT_IO_TIMEOUT", "0.5", 1);
    gate_set(false);
    ck__dio_set_io_hooks(NULL, stuck_pread);
    ck_dr *r = NULL;
    REQUIRE(!ck_dr_new(&r, path, 0, n));
    double t0 = now_s();
    unsigned char *dst = malloc(n);
    REQUIRE(dst);
    int rc = ck_dr_copy(r, dst, n, 0);
    CHECK_MSG(rc == CO_ETIMEOUT, "rc %d: %s", rc, co_err_detail());
    CHECK_MSG(strstr(co_err_detail(), "stuck-read.bin") && strstr(co_err_detail(), "within 0.5 s"), "%s",
              co_err_detail());
    rc = ck_dr_copy(r, dst, 10, 0); /* and every later copy at once */
    CHECK(rc == CO_ETIMEOUT);
    ck_dr_destroy(&r);
    double dt = now_s() - t0;
    CHECK(!r);
    CHECK_MSG(dt >= 0.5 && dt < 10, "%.2f s", dt);
    gate_release();
    unsetenv("COHORT_CKPT_IO_TIMEOUT");
    free(dst);
    free(data);
}

/* An --async-save whose writes never return: the trainer's ck_saver_wait gets CO_ETIMEOUT
 * naming the file (the stuck I/O threads' timeout, carried out of the background thread),
 * no checkpoint is committed, and the saver can be destroyed. */
static void test_stuck_async_save(void) {
    if (!direct_ok) TEST_SKIP_CASE("no O_DIRECT here: no I/O thread to get stuck");
    char save[512];
    snprintf(save, sizeof save, "%s/stuck-save", root);
    ck_remove_dir(save);
    enum { R = 2048, C = 2048, NF = R * C }; /* 16 MiB per tensor: direct writes */
    float *w = calloc(NF, sizeof(float)), *m1 = calloc(NF, sizeof(float)), *m2 = calloc(NF, sizeof(float));
    REQUIRE(w && m1 && m2);
    ck_tensor_ref refs[3] = {{.name = "w", .kind = CK_KIND_MODEL, .ndim = 2, .shape = {R, C}, .data = w, .dst = NULL},
                             {.name = "optimizer.exp_avg.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {R, C}, .data = m1, .dst = NULL},
                             {.name = "optimizer.exp_avg_sq.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {R, C}, .data = m2, .dst = NULL}};
    ck_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.iteration = 3;
    meta.progress.iteration = 3;
    meta.layout = (ck_layout){1, 1, 1, 1, 1, false, 1, 1};
    meta.model = (ck_model_info){1, C, 1, 1, C, 4 * C, R, R, 16, false, false, false, true, true, false, 1e-5, 10000};
    meta.optim = (ck_optim_info){true, "adamw", 3, 0.9, 0.999, 1e-8, 0.01, 1.0};
    ck_saver_opts o = {.save_dir = save, .async = true, .writers = 1};
    ck_saver *sv = NULL;
    REQUIRE(!ck_saver_new(&sv, &o));
    setenv("COHORT_CKPT_IO_TIMEOUT", "0.5", 1);
    gate_set(false);
    ck__dio_set_io_hooks(stuck_pwrite, NULL);
    double t0 = now_s();
    CHECK(!ck_saver_save(sv, &meta, refs, 3));
    ck_saver_wait_snapshot(sv);
    int rc = ck_saver_wait(sv);
    double dt = now_s() - t0;
    CHECK_MSG(rc == CO_ETIMEOUT, "rc %d: %s", rc, co_err_detail());
    CHECK_MSG(strstr(co_err_detail(), ".safetensors") && strstr(co_err_detail(), "no block write finished"), "%s",
              co_err_detail());
    CHECK_MSG(dt < 20, "%.2f s", dt);
    char tracker[600];
    snprintf(tracker, sizeof tracker, "%s/latest_checkpointed_iteration.txt", save);
    CHECK(access(tracker, F_OK) != 0); /* nothing committed */
    ck_saver_destroy(&sv);
    CHECK(!sv);
    gate_release();
    unsetenv("COHORT_CKPT_IO_TIMEOUT");
    free(w), free(m1), free(m2);
}

static bool probe_direct(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/probe", root);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) return false;
    void *buf = NULL;
    bool ok = !posix_memalign(&buf, 4096, 4096);
    if (ok) {
        memset(buf, 0, 4096);
        ok = pwrite(fd, buf, 4096, 0) == 4096;
    }
    free(buf);
    close(fd);
    unlink(path);
    return ok;
}

int main(void) {
    if (t_scratch_dir(root, sizeof root, "cohort-dio-unit")) return 1;
    unsetenv("COHORT_CKPT_DIRECT_IO");
    direct_ok = probe_direct();
    if (!direct_ok) fprintf(stderr, "note: %s refuses O_DIRECT: only the buffered fallback is tested\n", root);
    RUN(test_writer_blocks);
    RUN(test_writer_failing);
    RUN(test_reader);
    RUN(test_reader_abort);
    RUN(test_save_load);
    RUN(test_stuck_write);
    RUN(test_stuck_read);
    RUN(test_stuck_async_save);
    t_remove_dir(root);
    return TEST_EXIT();
}
