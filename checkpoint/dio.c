/* dio.c - O_DIRECT block writer and block reader for large checkpoint files (see dio.h).
 *
 * Both keep CK_DIO_SLOTS blocks of CK_DIO_BLOCK bytes (anonymous mappings: page-aligned,
 * as O_DIRECT wants) and CK_DIO_THREADS threads that each keep one request in flight.
 * Requests go out in file order; pwrite/pread at explicit offsets, so their completion
 * order does not matter. One mutex and one condition variable per file guard the slots'
 * states; copies and hashing happen outside the lock.
 *
 * Deadlines: the caller's waits (a free slot, the drain, a block to copy out) end with
 * CO_ETIMEOUT when nothing progressed (no request finished, no bytes copied out) for
 * COHORT_CKPT_IO_TIMEOUT seconds (ck__io_timeout_s). A request stuck in the kernel cannot
 * be taken back: its thread is then abandoned (detached; it exits when its request returns,
 * issuing no other, and the last such thread frees the writer or reader, which keep their
 * own descriptor, a dup, so that nothing is ever written to a number since reused). The I/O
 * threads' own waits for work have no deadline: they wait for their owner, who always ends
 * them (stop) and whose waits are bounded. */
#include "checkpoint/dio.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

bool ck__dio_enabled(void) {
    const char *v = getenv("COHORT_CKPT_DIRECT_IO");
    return !(v && !strcmp(v, "0"));
}

/* A block: an anonymous mapping aligned to 2 MiB and backed by huge pages where the kernel
 * allows (transparent huge pages in "madvise" mode or better). Each huge page is one
 * physically contiguous segment of a direct request; with 4 KiB pages a request is cut at
 * the device's segment limit (254 segments, about 1 MiB, on the virtio disk measured), and
 * direct reads and writes took about twice as long. */
#define HUGE (2u << 20)

static uint64_t bytes_written, bytes_read; /* atomic */

/* ---- deadlines ------------------------------------------------------------------------ */

#define IO_TIMEOUT_DEFAULT 300.0 /* s: one 8 MiB request that slow is a disk that stopped */

double ck__io_timeout_s(void) {
    const char *v = getenv("COHORT_CKPT_IO_TIMEOUT");
    if (!v || !*v) return IO_TIMEOUT_DEFAULT;
    char *end;
    double t = strtod(v, &end);
    return *end || !(t > 0) ? IO_TIMEOUT_DEFAULT : t;
}

static ssize_t (*hook_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*hook_pread)(int, void *, size_t, off_t);

void ck__dio_set_io_hooks(ssize_t (*pw)(int, const void *, size_t, off_t), ssize_t (*pr)(int, void *, size_t, off_t)) {
    __atomic_store_n(&hook_pwrite, pw, __ATOMIC_SEQ_CST);
    __atomic_store_n(&hook_pread, pr, __ATOMIC_SEQ_CST);
}

static void cond_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

struct timespec ck__mono_after(double secs) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double whole = (double)(long)secs;
    t.tv_sec += (time_t)whole;
    t.tv_nsec += (long)((secs - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* One bounded wait of a caller: returns false once nothing progressed (*progress unchanged
 * since the deadline was set) until the deadline. */
typedef struct {
    struct timespec dl;
    uint64_t seen;
    double secs;
} stall_clock;

static void stall_start(stall_clock *c, double secs, uint64_t progress) {
    c->secs = secs;
    c->seen = progress;
    c->dl = ck__mono_after(secs);
}

static bool stall_wait(stall_clock *c, pthread_cond_t *cv, pthread_mutex_t *mu, const uint64_t *progress) {
    if (*progress != c->seen) stall_start(c, c->secs, *progress);
    int e = pthread_cond_timedwait(cv, mu, &c->dl);
    if (*progress != c->seen) stall_start(c, c->secs, *progress);
    return e != ETIMEDOUT;
}

uint64_t ck_dio_bytes_written(void) { return __atomic_load_n(&bytes_written, __ATOMIC_RELAXED); }
uint64_t ck_dio_bytes_read(void) { return __atomic_load_n(&bytes_read, __ATOMIC_RELAXED); }

static char *block_new(void) {
    size_t len = CK_DIO_BLOCK + HUGE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    size_t tail = (size_t)(p + len - (a + CK_DIO_BLOCK));
    if (tail) munmap(a + CK_DIO_BLOCK, tail);
#ifdef MADV_HUGEPAGE
    const char *hp = getenv("COHORT_CKPT_DIO_HUGEPAGES"); /* "0": 4 KiB pages (benchmarks) */
    if (!(hp && !strcmp(hp, "0"))) madvise(a, CK_DIO_BLOCK, MADV_HUGEPAGE);
#endif
    return a;
}

static void block_free(char **p) {
    if (*p) munmap(*p, CK_DIO_BLOCK);
    *p = NULL;
}

static size_t round_up(size_t n) { return (n + CK_DIO_ALIGN - 1) & ~(size_t)(CK_DIO_ALIGN - 1); }

/* ---- writer --------------------------------------------------------------------------- */

enum { W_FREE, W_QUEUED, W_WRITING };

struct ck_dw {
    int fd;
    char path[4096];
    char *buf[CK_DIO_SLOTS];
    int cur;             /* the slot being filled */
    size_t fill;         /* bytes in it */
    uint64_t off;        /* its offset in the file */
    bool tried, direct;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* a slot changed state, or stop */
    int st[CK_DIO_SLOTS];
    uint64_t soff[CK_DIO_SLOTS];
    size_t slen[CK_DIO_SLOTS];
    int err;             /* errno of the first failed write (sticky) */
    uint64_t err_at;
    bool stop, cancel;
    bool timed_out;      /* a wait of the caller gave up (sticky) */
    bool abandoned;      /* destroyed with threads still inside a request: the last frees */
    uint64_t progress;   /* requests finished */
    double timeout;      /* s */
    int running;         /* I/O threads not yet returned */
    pthread_t th[CK_DIO_THREADS];
    int nth;
};

static void dw_free(ck_dw *w);

/* All of buf at off; 0 or the errno (and where it happened). An O_DIRECT write the file
 * system refuses (EINVAL: alignment it does not support) is retried buffered. */
static int write_all(int fd, const char *buf, size_t len, uint64_t off, uint64_t *at) {
    size_t done = 0;
    bool retried = false;
    while (done < len) {
        ssize_t (*hook)(int, const void *, size_t, off_t) = __atomic_load_n(&hook_pwrite, __ATOMIC_SEQ_CST);
        ssize_t w = hook ? hook(fd, buf + done, len - done, (off_t)(off + done))
                         : ck__hooked_pwrite(fd, buf + done, len - done, (off_t)(off + done));
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            int fl = fcntl(fd, F_GETFL);
            if (e == EINVAL && !retried && fl >= 0 && (fl & O_DIRECT) && !fcntl(fd, F_SETFL, fl & ~O_DIRECT)) {
                retried = true;
                continue;
            }
            *at = off + done;
            return e;
        }
        if (w == 0) { /* should not happen for a regular file; do not spin */
            *at = off + done;
            return EIO;
        }
        done += (size_t)w;
    }
    return 0;
}

static int write_error(const ck_dw *w, int e, uint64_t at) {
    if (w->timed_out)
        return co_err_set(CO_ETIMEOUT,
                          "writing %s: no block write finished within %g s (the disk or file system stopped "
                          "answering; COHORT_CKPT_IO_TIMEOUT sets the limit)",
                          w->path, w->timeout);
    return co_err_set(fs_errno_code(e), "writing %s at byte %" PRIu64 ": %s", w->path, at, strerror(e));
}

static void *dw_thread(void *arg) {
    ck_dw *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        int k = -1;
        for (int i = 0; i < CK_DIO_SLOTS; i++)
            if (w->st[i] == W_QUEUED && (k < 0 || w->soff[i] < w->soff[k])) k = i;
        if (k < 0) {
            if (w->stop) break;
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        w->st[k] = W_WRITING;
        bool skip = w->err || w->cancel; /* after a failure the file is abandoned anyway */
        pthread_mutex_unlock(&w->mu);
        uint64_t at = 0;
        int e = skip ? 0 : write_all(w->fd, w->buf[k], w->slen[k], w->soff[k], &at);
        if (!skip && !e) __atomic_add_fetch(&bytes_written, w->slen[k], __ATOMIC_RELAXED);
        pthread_mutex_lock(&w->mu);
        if (e && !w->err) {
            w->err = e;
            w->err_at = at;
        }
        w->st[k] = W_FREE;
        w->progress++;
        pthread_cond_broadcast(&w->cv);
    }
    bool last = --w->running == 0 && w->abandoned;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (last) dw_free(w);
    return NULL;
}

/* The caller's wait gave up (lock held): every later call fails with the timeout. */
static void dw_time_out(ck_dw *w) {
    w->timed_out = true;
    if (!w->err) w->err = ETIMEDOUT;
}

int ck_dw_new(ck_dw **out, int fd, const char *path) {
    *out = NULL;
    ck_dw *w = calloc(1, sizeof *w);
    if (!w) return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    w->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* our own: see the deadlines above */
    if (w->fd < 0) {
        int e = errno;
        free(w);
        return co_err_set(fs_errno_code(e), "%s: dup of its descriptor: %s", path, strerror(e));
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    w->timeout = ck__io_timeout_s();
    w->buf[0] = block_new(); /* touched only as far as it is filled */
    if (!w->buf[0]) {
        close(w->fd);
        free(w);
        return co_err_set(CO_ENOMEM, "%s: out of memory for the write buffer", path);
    }
    pthread_mutex_init(&w->mu, NULL);
    cond_init_mono(&w->cv);
    *out = w;
    return 0;
}

char *ck_dw_space(ck_dw *w, size_t *room) {
    *room = CK_DIO_BLOCK - w->fill;
    return w->buf[w->cur] + w->fill;
}

/* Stops the I/O threads: joined when they return within the deadline (a second once a wait
 * already timed out), else detached (true: w now belongs to them). */
static bool stop_threads(ck_dw *w, bool cancel) {
    if (!w->nth) return false;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    w->cancel = w->cancel || cancel;
    pthread_cond_broadcast(&w->cv);
    stall_clock c;
    stall_start(&c, w->timed_out ? 1.0 : w->timeout, w->progress);
    while (w->running && stall_wait(&c, &w->cv, &w->mu, &w->progress)) {}
    bool stuck = w->running > 0;
    if (stuck) {
        dw_time_out(w);
        w->abandoned = true;
        for (int i = 0; i < w->nth; i++) pthread_detach(w->th[i]);
    }
    pthread_mutex_unlock(&w->mu);
    if (stuck) return true;
    for (int i = 0; i < w->nth; i++) pthread_join(w->th[i], NULL);
    w->nth = 0;
    w->direct = false;
    return false;
}

/* Switches to O_DIRECT with the I/O threads, where the file system and memory allow. */
static void start_direct(ck_dw *w) {
    w->tried = true;
    if (!ck__dio_enabled()) return;
    for (int i = 1; i < CK_DIO_SLOTS; i++)
        if (!w->buf[i] && !(w->buf[i] = block_new())) return;
    int fl = fcntl(w->fd, F_GETFL);
    if (fl < 0 || fcntl(w->fd, F_SETFL, fl | O_DIRECT)) return; /* EINVAL: not on this file system */
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < CK_DIO_THREADS; i++) {
        if (pthread_create(&w->th[i], NULL, dw_thread, w)) break;
        w->nth++;
        w->running++;
    }
    pthread_mutex_unlock(&w->mu);
    if (!w->nth) {
        fcntl(w->fd, F_SETFL, fl);
        return;
    }
    w->direct = true;
}

int ck_dw_commit(ck_dw *w, size_t n) {
    w->fill += n;
    if (w->fill < CK_DIO_BLOCK) {
        pthread_mutex_lock(&w->mu);
        int e = w->err;
        uint64_t at = w->err_at;
        pthread_mutex_unlock(&w->mu);
        return e ? write_error(w, e, at) : 0;
    }
    if (!w->tried) start_direct(w);
    if (!w->direct) {
        uint64_t at = 0;
        int e = write_all(w->fd, w->buf[w->cur], w->fill, w->off, &at);
        if (e) return write_error(w, e, at);
        w->off += w->fill;
        w->fill = 0;
        return 0;
    }
    pthread_mutex_lock(&w->mu);
    w->st[w->cur] = W_QUEUED;
    w->soff[w->cur] = w->off;
    w->slen[w->cur] = w->fill;
    pthread_cond_broadcast(&w->cv);
    w->off += w->fill;
    w->fill = 0;
    stall_clock c;
    stall_start(&c, w->timeout, w->progress);
    for (;;) {
        if (w->err) break;
        int j = -1;
        for (int i = 0; i < CK_DIO_SLOTS && j < 0; i++)
            if (w->st[i] == W_FREE) j = i;
        if (j >= 0) {
            w->cur = j;
            break;
        }
        if (!stall_wait(&c, &w->cv, &w->mu, &w->progress)) dw_time_out(w);
    }
    int e = w->err;
    uint64_t at = w->err_at;
    pthread_mutex_unlock(&w->mu);
    return e ? write_error(w, e, at) : 0;
}

int ck_dw_flush(ck_dw *w) {
    int e = 0;
    uint64_t at = 0;
    if (w->direct) {
        pthread_mutex_lock(&w->mu);
        stall_clock c;
        stall_start(&c, w->timeout, w->progress);
        for (;;) {
            bool busy = false;
            for (int i = 0; i < CK_DIO_SLOTS; i++) busy = busy || w->st[i] != W_FREE;
            if (!busy || w->timed_out) break;
            if (!stall_wait(&c, &w->cv, &w->mu, &w->progress)) dw_time_out(w);
        }
        e = w->err;
        at = w->err_at;
        pthread_mutex_unlock(&w->mu);
        if (e) return write_error(w, e, at); /* ck_dw_destroy stops the threads */
        stop_threads(w, false);
        /* the tail through the page cache: no padding in the file */
        int fl = fcntl(w->fd, F_GETFL);
        if (fl >= 0 && (fl & O_DIRECT)) fcntl(w->fd, F_SETFL, fl & ~O_DIRECT);
    }
    if (w->fill) {
        e = write_all(w->fd, w->buf[w->cur], w->fill, w->off, &at);
        if (e) return write_error(w, e, at);
        w->off += w->fill;
        w->fill = 0;
    }
    return 0;
}

static void dw_free(ck_dw *w) {
    for (int i = 0; i < CK_DIO_SLOTS; i++) block_free(&w->buf[i]);
    close(w->fd);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void ck_dw_destroy(ck_dw **wp) {
    ck_dw *w = *wp;
    if (!w) return;
    *wp = NULL;
    if (stop_threads(w, true)) return; /* abandoned: the last I/O thread frees it */
    dw_free(w);
}

/* ---- reader --------------------------------------------------------------------------- */

enum { R_EMPTY, R_READING, R_READY };

struct ck_dr {
    int fd;
    char path[4096];
    uint64_t start, size;
    int64_t nblk, next_blk;
    char *buf[CK_DIO_SLOTS];
    int64_t blk[CK_DIO_SLOTS];
    int st[CK_DIO_SLOTS];
    uint64_t left[CK_DIO_SLOTS];   /* bytes of the block not yet copied out */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool failed, stop;
    bool timed_out, abandoned;     /* as the writer's */
    uint64_t progress;             /* reads finished and copies made */
    double timeout;
    int running;
    int err;                       /* errno, or 0 for a short file */
    uint64_t err_at;
    pthread_t th[CK_DIO_THREADS];
    int nth;
};

static void dr_free(ck_dr *r);

bool ck_dr_file_is_cold(int fd, uint64_t size) {
    if (!size) return false;
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    long pg = sysconf(_SC_PAGESIZE);
    size_t np = (size_t)((size + (uint64_t)pg - 1) / (uint64_t)pg);
    unsigned char *v = malloc(np);
    bool cold = false;
    if (v && !mincore(p, (size_t)size, v)) {
        size_t res = 0;
        for (size_t i = 0; i < np; i++) res += v[i] & 1;
        cold = res * 2 < np;
    }
    free(v);
    munmap(p, (size_t)size);
    return cold;
}

static uint64_t blk_bytes(const ck_dr *r, int64_t b) { /* bytes of [start, size) in block b */
    uint64_t lo = (uint64_t)b * CK_DIO_BLOCK, hi = lo + CK_DIO_BLOCK;
    if (lo < r->start) lo = r->start;
    if (hi > r->size) hi = r->size;
    return hi > lo ? hi - lo : 0;
}

static void fail_locked(ck_dr *r, int e, uint64_t at) {
    if (!r->failed) {
        r->failed = true;
        r->err = e;
        r->err_at = at;
    }
    pthread_cond_broadcast(&r->cv);
}

static void *dr_thread(void *arg) {
    ck_dr *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->stop || r->failed || r->next_blk >= r->nblk) break;
        int64_t b = r->next_blk;
        int s = (int)(b % CK_DIO_SLOTS);
        if (r->st[s] != R_EMPTY) { /* block b - SLOTS not yet all copied out */
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        r->next_blk++;
        r->st[s] = R_READING;
        r->blk[s] = b;
        r->left[s] = blk_bytes(r, b);
        pthread_mutex_unlock(&r->mu);
        uint64_t from = (uint64_t)b * CK_DIO_BLOCK;
        size_t want = (size_t)((r->size - from) < CK_DIO_BLOCK ? r->size - from : CK_DIO_BLOCK);
        size_t ask = round_up(want), got = 0;
        int e = 0;
        bool shortf = false;
        while (got < want) {
            ssize_t (*hook)(int, void *, size_t, off_t) = __atomic_load_n(&hook_pread, __ATOMIC_SEQ_CST);
            ssize_t n = hook ? hook(r->fd, r->buf[s] + got, ask - got, (off_t)(from + got))
                             : pread(r->fd, r->buf[s] + got, ask - got, (off_t)(from + got));
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                e = errno;
                break;
            }
            got += (size_t)n;
            if (n == 0 || (got < want && got % CK_DIO_ALIGN)) { /* the file ends early */
                shortf = got < want;
                break;
            }
        }
        pthread_mutex_lock(&r->mu);
        if (e || shortf) fail_locked(r, e, from + got);
        else {
            r->st[s] = R_READY;
            __atomic_add_fetch(&bytes_read, want, __ATOMIC_RELAXED);
        }
        r->progress++;
        pthread_cond_broadcast(&r->cv);
    }
    bool last = --r->running == 0 && r->abandoned;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (last) dr_free(r);
    return NULL;
}

int ck_dr_new(ck_dr **out, const char *path, uint64_t start, uint64_t size) {
    *out = NULL;
    if (!ck__dio_enabled()) return co_err_set(CO_EUNSUPPORTED, "%s: direct I/O turned off", path);
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return co_err_set(e == EINVAL ? CO_EUNSUPPORTED : fs_errno_code(e), "opening %s for direct reads: %s", path,
                          strerror(e));
    }
    ck_dr *r = calloc(1, sizeof *r);
    int rc = r ? 0 : co_err_set(CO_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < CK_DIO_SLOTS && !rc; i++)
        if (!(r->buf[i] = block_new())) rc = co_err_set(CO_ENOMEM, "%s: out of memory for read buffers", path);
    if (rc) {
        close(fd);
        if (r)
            for (int i = 0; i < CK_DIO_SLOTS; i++) block_free(&r->buf[i]);
        free(r);
        return rc;
    }
    r->fd = fd;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->start = start;
    r->size = size;
    r->next_blk = (int64_t)(start / CK_DIO_BLOCK);
    r->nblk = (int64_t)((size + CK_DIO_BLOCK - 1) / CK_DIO_BLOCK);
    for (int i = 0; i < CK_DIO_SLOTS; i++) r->blk[i] = -1;
    r->timeout = ck__io_timeout_s();
    pthread_mutex_init(&r->mu, NULL);
    cond_init_mono(&r->cv);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < CK_DIO_THREADS; i++) {
        if (pthread_create(&r->th[i], NULL, dr_thread, r)) break;
        r->nth++;
        r->running++;
    }
    pthread_mutex_unlock(&r->mu);
    if (!r->nth) {
        *out = r;
        ck_dr_destroy(out);
        return co_err_set(CO_EUNSUPPORTED, "%s: no thread for direct reads", path);
    }
    *out = r;
    return 0;
}

int ck_dr_copy(ck_dr *r, void *dst, size_t len, uint64_t off) {
    char *d = dst;
    if (off < r->start || off + len > r->size)
        return co_err_set(CO_EINTERNAL, "%s: direct read of bytes %" PRIu64 "+%zu outside %" PRIu64 "-%" PRIu64, r->path,
                          off, len, r->start, r->size);
    while (len) {
        int64_t b = (int64_t)(off / CK_DIO_BLOCK);
        int s = (int)(b % CK_DIO_SLOTS);
        pthread_mutex_lock(&r->mu);
        stall_clock c;
        stall_start(&c, r->timeout, r->progress);
        while (!r->failed && !r->stop && !(r->blk[s] == b && r->st[s] == R_READY))
            if (!stall_wait(&c, &r->cv, &r->mu, &r->progress)) {
                r->timed_out = true;
                fail_locked(r, ETIMEDOUT, off);
            }
        bool failed = r->failed, stopped = r->stop, timed_out = r->timed_out;
        int e = r->err;
        uint64_t at = r->err_at;
        pthread_mutex_unlock(&r->mu);
        if (failed || stopped) {
            if (timed_out)
                return co_err_set(CO_ETIMEOUT,
                                  "reading %s at byte %" PRIu64 ": no block read finished and no bytes were taken "
                                  "within %g s (the disk or file system stopped answering; COHORT_CKPT_IO_TIMEOUT "
                                  "sets the limit)",
                                  r->path, at, r->timeout);
            if (failed && e)
                return co_err_set(fs_errno_code(e), "reading %s at byte %" PRIu64 ": %s", r->path, at, strerror(e));
            if (!failed) return co_err_set(CO_EABORTED, "reading %s: abandoned", r->path);
            return co_err_set(CO_EFORMAT, "%s: truncated: ends at byte %" PRIu64, r->path, at);
        }
        uint64_t in = off - (uint64_t)b * CK_DIO_BLOCK;
        size_t n = CK_DIO_BLOCK - (size_t)in < len ? CK_DIO_BLOCK - (size_t)in : len;
        memcpy(d, r->buf[s] + in, n);
        pthread_mutex_lock(&r->mu);
        r->progress++;
        r->left[s] -= n;
        if (!r->left[s]) {
            r->st[s] = R_EMPTY;
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&r->mu);
        d += n;
        off += n;
        len -= n;
    }
    return 0;
}

void ck_dr_abort(ck_dr *r) {
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void dr_free(ck_dr *r) {
    for (int i = 0; i < CK_DIO_SLOTS; i++) block_free(&r->buf[i]);
    close(r->fd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void ck_dr_destroy(ck_dr **rp) {
    ck_dr *r = *rp;
    if (!r) return;
    *rp = NULL;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    /* the threads return within a request (a second once a read already timed out) */
    stall_clock c;
    stall_start(&c, r->timed_out ? 1.0 : r->timeout, r->progress);
    while (r->running && stall_wait(&c, &r->cv, &r->mu, &r->progress)) {}
    bool stuck = r->running > 0;
    if (stuck) {
        r->abandoned = true; /* the last thread frees it */
        for (int i = 0; i < r->nth; i++) pthread_detach(r->th[i]);
    }
    pthread_mutex_unlock(&r->mu);
    if (stuck) return;
    for (int i = 0; i < r->nth; i++) pthread_join(r->th[i], NULL);
    dr_free(r);
}
