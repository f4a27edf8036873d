/* store.c - save-directory operations: hashing file I/O with fault injection, the tracker,
 * the commit protocol, listing and retention (see store.h). */
#include "checkpoint/store.h"

#include "checkpoint/dio.h"

#include "common/error.h"
#include "common/log.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IO_CHUNK (8u << 20)

/* ---- test hooks ----------------------------------------------------------------------- */

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static bool hooks_read;
static char crash_phase[32];
static long crash_nth, crash_seen;
static long fail_nth, fail_count;
static long stop_nth, stop_seen;
static int fail_errno = ENOSPC;
static char role[16];        /* "sv", a worker's rank, or "" (one process) */
static bool role_set;

/* A hook's optional "@WHO" suffix: the hook applies only in the process of that role (a
 * data-parallel rank, or "sv" for the supervisor); without one, in every process. Returns
 * whether it applies here and cuts the suffix off. */
static bool for_me(char *spec) {
    char *at = strchr(spec, '@');
    if (!at) return true;
    *at = '\0';
    if (!role_set) {
        const char *w = getenv("COHORT_WORKER_ID");
        snprintf(role, sizeof role, "%s", w && getenv("COHORT_SUPERVISOR") ? w : "");
    }
    return !strcmp(at + 1, role);
}

static void read_hooks(void) {
    if (hooks_read) return;
    hooks_read = true;
    const char *c = getenv("COHORT_CKPT_CRASH_AT");
    if (c && *c) {
        snprintf(crash_phase, sizeof crash_phase, "%s", c);
        if (!for_me(crash_phase)) crash_phase[0] = '\0';
        char *colon = strchr(crash_phase, ':');
        crash_nth = 1;
        if (colon) {
            *colon = '\0';
            crash_nth = strtol(colon + 1, NULL, 10);
        }
    }
    const char *w = getenv("COHORT_CKPT_FAIL_WRITE");
    if (w && *w) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s", w);
        if (for_me(spec)) {
            char *end;
            fail_nth = strtol(spec, &end, 10);
            if (*end == ':') fail_errno = (int)strtol(end + 1, NULL, 10);
        }
    }
    const char *st = getenv("COHORT_CKPT_STOP_AT");
    if (st && *st) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s", st);
        if (for_me(spec)) stop_nth = strtol(spec, NULL, 10);
    }
}

void ck_test_set_role(const char *who) {
    pthread_mutex_lock(&hook_mu);
    snprintf(role, sizeof role, "%s", who ? who : "");
    role_set = true;
    hooks_read = false; /* re-read the hooks for this role */
    crash_phase[0] = '\0';
    fail_nth = 0;
    stop_nth = 0;
    read_hooks();
    pthread_mutex_unlock(&hook_mu);
}

void ck_crash_point(const char *phase) {
    pthread_mutex_lock(&hook_mu);
    read_hooks();
    bool die = crash_phase[0] && !strcmp(crash_phase, phase) && ++crash_seen == crash_nth;
    pthread_mutex_unlock(&hook_mu);
    if (die) {
        co_log(CO_LOG_WARN, "COHORT_CKPT_CRASH_AT=%s: killing the process", phase);
        fflush(NULL);
        raise(SIGKILL);
    }
}

void ck_test_fail_write(long n, int err) {
    pthread_mutex_lock(&hook_mu);
    read_hooks();
    fail_nth = n;
    fail_count = 0;
    fail_errno = err;
    pthread_mutex_unlock(&hook_mu);
}

/* pwrite(2) with the failing-write hook. */
ssize_t ck__hooked_pwrite(int fd, const void *buf, size_t len, off_t off) {
    pthread_mutex_lock(&hook_mu);
    read_hooks();
    bool fail = fail_nth > 0 && ++fail_count == fail_nth;
    int e = fail_errno;
    pthread_mutex_unlock(&hook_mu);
    if (fail) {
        errno = e;
        return -1;
    }
    return pwrite(fd, buf, len, off);
}

/* COHORT_CKPT_STOP_AT: stops the process at its Nth file write. */
static void stop_point(const char *path) {
    pthread_mutex_lock(&hook_mu);
    read_hooks();
    bool stop = stop_nth > 0 && ++stop_seen == stop_nth;
    pthread_mutex_unlock(&hook_mu);
    if (stop) {
        co_log(CO_LOG_WARN, "COHORT_CKPT_STOP_AT=%ld: stopping the process while writing %s", stop_nth, path);
        fflush(NULL);
        raise(SIGSTOP);
    }
}

/* ---- interruption ---------------------------------------------------------------------- */

static volatile sig_atomic_t caught_signal;

static void on_signal(int sig) {
    if (!caught_signal) caught_signal = sig;
}

int ck_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL)) {
        int e = errno;
        return co_err_set(CO_EINTERNAL, "installing the SIGINT/SIGTERM handlers: %s", strerror(e));
    }
    return 0;
}

int ck_interrupted(void) { return caught_signal; }

void ck_reraise(void) {
    int sig = caught_signal;
    if (!sig) return;
    fflush(NULL);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* CO_EINTERRUPTED naming what was interrupted, or 0 when no signal was caught. */
static int check_interrupted(const char *what) {
    int sig = caught_signal;
    if (!sig) return 0;
    return co_err_set(CO_EINTERRUPTED, "%s: interrupted by %s", what, sig == SIGINT ? "SIGINT" : "SIGTERM");
}

int ck_err_wrap(int rc, const char *fmt, ...) {
    char prefix[1024], detail[2048];
    snprintf(detail, sizeof detail, "%s", co_err_detail());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return co_err_set(rc, "%s: %s", prefix, detail);
}

/* ---- hashing file I/O ----------------------------------------------------------------- */

int ck_file_create(ck_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    int rc = check_interrupted(path);
    if (rc) return rc;
    f->hash = XXH3_createState();
    if (!f->hash) return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    XXH3_128bits_reset(f->hash);
    f->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        int e = errno;
        XXH3_freeState(f->hash);
        f->hash = NULL;
        return co_err_set(fs_errno_code(e), "creating %s: %s", path, strerror(e));
    }
    return 0;
}

/* Bytes copied and hashed at a time: the hash reads them while they are in cache. */
#define HASH_PIECE (256u << 10)

int ck_file_write(ck_file *f, const void *buf, size_t len) {
    const char *p = buf;
    stop_point(f->path);
    if (len && !f->dw) {
        int rc = ck_dw_new(&f->dw, f->fd, f->path);
        if (rc) return rc;
    }
    while (len) {
        int rc = check_interrupted(f->path);
        if (rc) return rc;
        size_t room;
        char *dst = ck_dw_space(f->dw, &room);
        size_t n = len < room ? len : room;
        if (n > HASH_PIECE) n = HASH_PIECE;
        memcpy(dst, p, n);
        XXH3_128bits_update(f->hash, dst, n);
        if (f->hash64) XXH64_update(f->hash64, dst, n);
        f->bytes += n;
        p += n;
        len -= n;
        rc = ck_dw_commit(f->dw, n);
        if (rc) return rc;
    }
    return 0;
}

void ck_file_abort(ck_file *f) {
    ck_dw_destroy(&f->dw);
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->hash) XXH3_freeState(f->hash);
    f->hash = NULL;
    if (f->hash64) XXH64_freeState(f->hash64);
    f->hash64 = NULL;
}

int ck_file_want_xxh64(ck_file *f) {
    if (f->hash64) return 0;
    f->hash64 = XXH64_createState();
    if (!f->hash64) return co_err_set(CO_ENOMEM, "%s: out of memory", f->path);
    XXH64_reset(f->hash64, 0);
    return 0;
}

static void digest(XXH3_state_t *s, uint8_t h[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s));
    memcpy(h, c.digest, 16);
}

int ck_file_finish(ck_file *f, uint8_t h[16]) {
    if (f->dw) {
        int rc = ck_dw_flush(f->dw);
        ck_dw_destroy(&f->dw);
        if (rc) {
            ck_file_abort(f);
            return rc;
        }
    }
    if (fsync(f->fd)) {
        int e = errno;
        ck_file_abort(f);
        return co_err_set(fs_errno_code(e), "fsync of %s: %s", f->path, strerror(e));
    }
    digest(f->hash, h);
    if (f->hash64) f->xxh64 = XXH64_digest(f->hash64);
    int rc = close(f->fd);
    int e = errno;
    f->fd = -1;
    ck_file_abort(f);
    if (rc) return co_err_set(fs_errno_code(e), "closing %s: %s", f->path, strerror(e));
    return 0;
}

int ck_file_open(ck_file *f, const char *path, uint64_t *size) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "opening %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(f->fd, &st)) {
        int e = errno;
        close(f->fd);
        return co_err_set(fs_errno_code(e), "stat of %s: %s", path, strerror(e));
    }
    f->hash = XXH3_createState();
    if (!f->hash) {
        close(f->fd);
        return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    }
    XXH3_128bits_reset(f->hash);
    if (size) *size = (uint64_t)st.st_size;
    posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return 0;
}

int ck_file_read(ck_file *f, void *buf, size_t len) {
    char *p = buf;
    while (len) {
        int rc = check_interrupted(f->path);
        if (rc) return rc;
        size_t n = len < IO_CHUNK ? len : IO_CHUNK;
        size_t done = 0;
        while (done < n) {
            ssize_t r = read(f->fd, p + done, n - done);
            if (r < 0) {
                if (errno == EINTR) continue;
                int e = errno;
                return co_err_set(fs_errno_code(e), "reading %s at byte %" PRIu64 ": %s", f->path, f->bytes + done,
                                  strerror(e));
            }
            if (r == 0)
                return co_err_set(CO_EFORMAT, "%s: truncated: ends at byte %" PRIu64, f->path, f->bytes + done);
            done += (size_t)r;
        }
        XXH3_128bits_update(f->hash, p, n);
        f->bytes += n;
        p += n;
        len -= n;
    }
    return 0;
}

void ck_file_close(ck_file *f, uint8_t h[16]) {
    if (h && f->hash) digest(f->hash, h);
    ck_file_abort(f);
}

int ck_hash_file(const char *path, uint8_t h[16], uint64_t *size) {
    ck_file f;
    uint64_t sz;
    int rc = ck_file_open(&f, path, &sz);
    if (rc) return rc;
    char *buf = malloc(IO_CHUNK);
    if (!buf) {
        ck_file_close(&f, NULL);
        return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    }
    uint64_t left = sz;
    while (left && !rc) {
        size_t n = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
        rc = ck_file_read(&f, buf, n);
        left -= n;
    }
    free(buf);
    ck_file_close(&f, h);
    if (size) *size = sz;
    return rc;
}

/* ---- directory ------------------------------------------------------------------------ */

void ck_iter_dir(char *out, size_t n, const char *save_dir, int64_t it) {
    snprintf(out, n, "%s/iter_%07" PRId64, save_dir, it);
}

int64_t ck_parse_iter_name(const char *name) {
    if (strncmp(name, "iter_", 5)) return -1;
    const char *d = name + 5;
    size_t n = strlen(d);
    if (n < 7 || n > 18) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9') return -1;
        v = v * 10 + (d[i] - '0');
    }
    return v;
}

/* text (len bytes, not terminated) as a short quoted string for a message: control and
 * non-ASCII bytes escaped, cut with "..." past the room in out; "an empty file" for none. */
static void quote_text(char *out, size_t n, const char *text, size_t len) {
    if (!len) {
        snprintf(out, n, "an empty file");
        return;
    }
    size_t o = 0;
    out[o++] = '\'';
    for (size_t i = 0; i < len; i++) {
        if (o + 10 >= n) { /* room for an escape, "..." and the closing quote */
            o += (size_t)snprintf(out + o, n - o, "...");
            break;
        }
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') o += (size_t)snprintf(out + o, n - o, "\\n");
        else if (c < 0x20 || c >= 0x7f || c == '\'') o += (size_t)snprintf(out + o, n - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    snprintf(out + o, n - o, "'");
}

int ck_read_tracker(const char *save_dir, int64_t *it) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", save_dir, CK_TRACKER_NAME);
    char *data;
    size_t len;
    int rc = fs_read_all(path, &data, &len);
    if (rc) return rc == CO_ENOENT ? co_err_set(CO_ENOENT, "%s: no tracker file", path) : rc;
    char *p = data;
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    int64_t v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 18) v = v * 10 + (*p++ - '0'), digits++;
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    bool ok = digits > 0 && *p == '\0' && (size_t)(p - data) == len;
    if (!ok && !strncmp(data, "release", 7)) {
        rc = co_err_set(CO_EFORMAT, "%s: 'release' checkpoints are not supported", path);
    } else if (!ok) {
        char shown[64];
        size_t shown_len = len; /* a trailing newline is allowed: not shown */
        while (shown_len > 1 && strchr(" \t\r\n", data[shown_len - 1])) shown_len--;
        quote_text(shown, sizeof shown, data, shown_len);
        rc = co_err_set(CO_EFORMAT, "%s holds %s, not an iteration number (a non-negative integer); fix or remove it",
                        path, shown);
    }
    free(data);
    if (!rc) *it = v;
    return rc;
}

int ck_write_tracker(const char *save_dir, int64_t it) {
    char path[4096], text[32];
    snprintf(path, sizeof path, "%s/%s", save_dir, CK_TRACKER_NAME);
    int n = snprintf(text, sizeof text, "%" PRId64, it);
    const void *bufs[1] = {text};
    size_t lens[1] = {(size_t)n};
    int rc = fs_write_atomic(path, bufs, lens, 1);
    if (rc) return ck_err_wrap(rc, "replacing the tracker %s", path);
    return 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int ck_list_iterations(const char *save_dir, int64_t **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(save_dir);
    if (!d) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "listing %s: %s", save_dir, strerror(e));
    }
    int cap = 0;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        int64_t it = ck_parse_iter_name(de->d_name);
        if (it < 0) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *p = realloc(*out, (size_t)cap * sizeof *p);
            if (!p) {
                rc = co_err_set(CO_ENOMEM, "listing %s: out of memory", save_dir);
                break;
            }
            *out = p;
        }
        (*out)[(*n)++] = it;
    }
    closedir(d);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_i64);
    return 0;
}

int ck_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        if (e == ENOENT) return 0;
        return co_err_set(fs_errno_code(e), "removing %s: %s", dir, strerror(e));
    }
    struct dirent *de;
    int rc = 0;
    char path[4096 + 256];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (unlink(path) && errno != ENOENT) {
            int e = errno;
            if (e == EISDIR || e == EPERM) {
                rc = ck_remove_dir(path);
                if (rc) break;
                continue;
            }
            rc = co_err_set(fs_errno_code(e), "removing %s: %s", path, strerror(e));
            break;
        }
    }
    closedir(d);
    if (!rc && rmdir(dir) && errno != ENOENT) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "removing %s: %s", dir, strerror(e));
    }
    return rc;
}

/* iter_NNN.tmp-* / iter_NNN.del-* */
static bool is_leftover(const char *name) {
    if (strncmp(name, "iter_", 5)) return false;
    return strstr(name, ".tmp-") || strstr(name, ".del-");
}

int ck_clean_stale(const char *save_dir) {
    DIR *d = opendir(save_dir);
    if (!d) return errno == ENOENT ? 0 : co_err_set(fs_errno_code(errno), "listing %s: %s", save_dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    char path[4096 + 256];
    while ((de = readdir(d)) && !rc) {
        if (!is_leftover(de->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", save_dir, de->d_name);
        rc = ck_remove_dir(path);
    }
    closedir(d);
    return rc;
}

int ck_owner_alive(const char *suffix) {
    char *end;
    errno = 0;
    long pid = strtol(suffix, &end, 10);
    if (end == suffix || *end || errno || pid <= 0) return -1;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* ck_owner_alive for the cleaners: this process's own PID names a leftover of an earlier
 * process that had it (this one has not begun writing yet). */
static int other_owner_alive(const char *suffix) {
    char self[32];
    snprintf(self, sizeof self, "%ld", (long)getpid());
    return strcmp(suffix, self) ? ck_owner_alive(suffix) : 0;
}

static void note_name(char (*names)[256], int *count, const char *name) {
    if (*count < CK_STALE_MAX) snprintf(names[*count], sizeof names[0], "%s", name);
    (*count)++;
}

static void note_kept(ck_stale *st, const char *name, const char *why) {
    if (st->nkept < CK_STALE_MAX) snprintf(st->why_kept[st->nkept], sizeof st->why_kept[0], "%s", why);
    note_name(st->kept, &st->nkept, name);
}

int ck_clean_dead(const char *save_dir, const char *locked_by, bool dry_run, ck_stale *st) {
    memset(st, 0, sizeof *st);
    DIR *d = opendir(save_dir);
    if (!d) return errno == ENOENT ? 0 : co_err_set(fs_errno_code(errno), "listing %s: %s", save_dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    char path[4096 + 256], why[160];
    while ((de = readdir(d)) && !rc) {
        if (!is_leftover(de->d_name)) continue;
        const char *suffix = strstr(de->d_name, ".tmp-");
        if (!suffix) suffix = strstr(de->d_name, ".del-");
        if (locked_by) {
            snprintf(why, sizeof why, "the save directory is locked by %s", locked_by);
            note_kept(st, de->d_name, why);
            continue;
        }
        if (other_owner_alive(suffix + 5) == 1) {
            snprintf(why, sizeof why, "process %s is running", suffix + 5);
            note_kept(st, de->d_name, why);
            continue;
        }
        snprintf(path, sizeof path, "%s/%s", save_dir, de->d_name);
        if (!dry_run) rc = ck_remove_dir(path);
        if (!rc) note_name(st->removed, &st->nremoved, de->d_name);
    }
    closedir(d);
    return rc;
}

int ck_clean_dead_files(const char *dir, const char *const *names, int nnames, ck_stale *st) {
    memset(st, 0, sizeof *st);
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : co_err_set(fs_errno_code(errno), "listing %s: %s", dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    char path[4096 + 256], why[160];
    while ((de = readdir(d)) && !rc) {
        const char *suffix = NULL;
        for (int i = 0; i < nnames && !suffix; i++) {
            size_t l = strlen(names[i]);
            if (!strncmp(de->d_name, names[i], l) && !strncmp(de->d_name + l, ".tmp-", 5)) suffix = de->d_name + l + 5;
        }
        if (!suffix) continue;
        int alive = other_owner_alive(suffix);
        if (alive < 0) continue; /* not a name this code writes */
        if (alive) {
            snprintf(why, sizeof why, "process %s is running", suffix);
            note_kept(st, de->d_name, why);
            continue;
        }
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (unlink(path) && errno != ENOENT) {
            int e = errno;
            rc = co_err_set(fs_errno_code(e), "removing %s: %s", path, strerror(e));
            break;
        }
        note_name(st->removed, &st->nremoved, de->d_name);
    }
    closedir(d);
    return rc;
}

ck_dir_kind ck_classify_dir(const char *dir) {
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, CK_MANIFEST_NAME);
    if (!stat(p, &st)) return CK_DIR_CHECKPOINT;
    snprintf(p, sizeof p, "%s/%s", dir, CK_TRACKER_NAME);
    if (!stat(p, &st)) return CK_DIR_SAVE;
    DIR *d = opendir(dir);
    if (!d) return CK_DIR_OTHER;
    ck_dir_kind kind = CK_DIR_OTHER;
    struct dirent *de;
    while ((de = readdir(d)) && kind == CK_DIR_OTHER) {
        if (strncmp(de->d_name, "iter_", 5)) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (!stat(p, &st) && S_ISDIR(st.st_mode)) kind = CK_DIR_SAVE;
    }
    closedir(d);
    return kind;
}

/* path with the symbolic links of its existing part resolved (the rest appended as given). */
static int resolve_path(const char *path, char *out, size_t n) {
    char head[4096], tail[4096] = "";
    snprintf(head, sizeof head, "%s", path);
    for (;;) {
        char *r = realpath(head[0] ? head : ".", NULL);
        if (r) {
            int w = snprintf(out, n, "%s%s%s", r, tail[0] && strcmp(r, "/") ? "/" : "", tail);
            free(r);
            return w < 0 || (size_t)w >= n ? co_err_set(CO_EINVAL, "%s: path too long", path) : 0;
        }
        if (errno != ENOENT && errno != ENOTDIR) {
            int e = errno;
            return co_err_set(fs_errno_code(e), "%s: %s", path, strerror(e));
        }
        /* move the last component of head in front of tail */
        size_t l = strlen(head);
        while (l > 1 && head[l - 1] == '/') head[--l] = '\0';
        char *slash = strrchr(head, '/');
        const char *last = slash ? slash + 1 : head;
        char t[2 * sizeof tail + 2];
        int tl = snprintf(t, sizeof t, "%s%s%s", last, tail[0] ? "/" : "", tail);
        if (tl < 0 || (size_t)tl >= sizeof tail) return co_err_set(CO_EINVAL, "%s: path too long", path);
        memcpy(tail, t, (size_t)tl + 1);
        if (!slash) head[0] = '\0';
        else if (slash == head) head[1] = '\0';
        else *slash = '\0';
    }
}

int ck_check_output(const char *output, bool save_ok, const char *flag) {
    char full[4096];
    int rc = resolve_path(output, full, sizeof full);
    if (rc) return ck_err_wrap(rc, "%s", flag);
    char q[4096];
    snprintf(q, sizeof q, "%s", full);
    for (bool self = true;; self = false) {
        ck_dir_kind k = ck_classify_dir(q);
        if (k == CK_DIR_CHECKPOINT)
            return co_err_set(CO_EINVAL,
                              "%s %s %s the checkpoint directory %s (it holds %s): writing there would overwrite the "
                              "checkpoint; choose a directory outside every save directory",
                              flag, output, self ? "is" : "lies inside", q, CK_MANIFEST_NAME);
        if (k == CK_DIR_SAVE && !(self && save_ok))
            return co_err_set(CO_EINVAL,
                              "%s %s %s the save directory %s (it holds %s or iter_* directories): writing there could "
                              "overwrite its checkpoints; choose a directory outside every save directory",
                              flag, output, self ? "is" : "lies inside", q, CK_TRACKER_NAME);
        char *slash = strrchr(q, '/');
        if (!slash || !strcmp(q, "/")) break;
        if (slash == q) q[1] = '\0';
        else *slash = '\0';
    }
    return 0;
}

int ck_begin(const char *save_dir, int64_t iteration, char *tmp, size_t n) {
    int rc = check_interrupted(save_dir);
    if (rc) return rc;
    rc = fs_mkdirs(save_dir);
    if (rc) return ck_err_wrap(rc, "creating the save directory %s", save_dir);
    char final[4096];
    ck_iter_dir(final, sizeof final, save_dir, iteration);
    snprintf(tmp, n, "%s.tmp-%ld", final, (long)getpid());
    rc = ck_remove_dir(tmp);
    if (rc) return rc;
    if (mkdir(tmp, 0777)) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "creating %s: %s", tmp, strerror(e));
    }
    ck_crash_point("start");
    return 0;
}

void ck_tmp_dir_shared(char *out, size_t n, const char *save_dir, int64_t iteration, const char *token) {
    snprintf(out, n, "%s/iter_%07" PRId64 ".tmp-%s", save_dir, iteration, token);
}

int ck_begin_shared(const char *save_dir, int64_t iteration, const char *token, char *tmp, size_t n) {
    int rc = fs_mkdirs(save_dir);
    if (rc) return ck_err_wrap(rc, "creating the save directory %s", save_dir);
    ck_tmp_dir_shared(tmp, n, save_dir, iteration, token);
    /* every writer creates the same directory; whoever comes first makes it */
    if (mkdir(tmp, 0777) && errno != EEXIST) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "creating %s: %s", tmp, strerror(e));
    }
    struct stat st;
    if (stat(tmp, &st) || !S_ISDIR(st.st_mode)) return co_err_set(CO_EIO, "creating %s: not a directory", tmp);
    ck_crash_point("start");
    return 0;
}

int ck_remove_tmp_dirs(const char *save_dir, const char *token) {
    DIR *d = opendir(save_dir);
    if (!d) return errno == ENOENT ? 0 : co_err_set(fs_errno_code(errno), "listing %s: %s", save_dir, strerror(errno));
    char suffix[128];
    snprintf(suffix, sizeof suffix, ".tmp-%s", token);
    size_t sl = strlen(suffix);
    struct dirent *de;
    int rc = 0;
    char path[4096 + 256];
    while ((de = readdir(d)) && !rc) {
        size_t l = strlen(de->d_name);
        if (strncmp(de->d_name, "iter_", 5) || l < sl || strcmp(de->d_name + l - sl, suffix)) continue;
        snprintf(path, sizeof path, "%s/%s", save_dir, de->d_name);
        rc = ck_remove_dir(path);
    }
    closedir(d);
    return rc;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "opening directory %s: %s", dir, strerror(e));
    }
    int rc = 0;
    if (fsync(fd)) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "fsync of directory %s: %s", dir, strerror(e));
    }
    close(fd);
    return rc;
}

int ck_commit(const char *save_dir, int64_t iteration, const char *tmp) {
    int rc = fsync_dir(tmp);
    if (rc) return rc;
    char final[4096];
    ck_iter_dir(final, sizeof final, save_dir, iteration);
    bool exchanged = false;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE)) {
        int e = errno;
        if (e == EEXIST || e == ENOTEMPTY) {
            /* an older checkpoint of this iteration (not the tracker's: the caller never
             * re-saves the tracked iteration) is swapped out atomically */
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE)) {
                e = errno;
                return co_err_set(fs_errno_code(e), "exchanging %s with %s: %s", tmp, final, strerror(e));
            }
            exchanged = true;
        } else if (e == EINVAL || e == ENOSYS) {
            /* file systems without renameat2 flags */
            if (rename(tmp, final)) {
                e = errno;
                return co_err_set(fs_errno_code(e), "renaming %s to %s: %s", tmp, final, strerror(e));
            }
        } else {
            return co_err_set(fs_errno_code(e), "renaming %s to %s: %s", tmp, final, strerror(e));
        }
    }
    ck_crash_point("renamed");
    rc = fsync_dir(save_dir);
    if (rc) return rc;
    ck_crash_point("committed");
    rc = ck_write_tracker(save_dir, iteration);
    if (rc) return rc;
    ck_crash_point("tracker");
    if (exchanged) ck_remove_dir(tmp); /* the replaced checkpoint; a leftover is cleaned later */
    return 0;
}

int ck_remove_checkpoint(const char *save_dir, int64_t iteration) {
    char dir[4096], del[4200];
    ck_iter_dir(dir, sizeof dir, save_dir, iteration);
    snprintf(del, sizeof del, "%s.del-%ld", dir, (long)getpid());
    if (rename(dir, del)) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "removing %s: %s", dir, strerror(e));
    }
    int rc = fsync_dir(save_dir);
    ck_crash_point("prune");
    if (!rc) rc = ck_remove_dir(del);
    return rc;
}

/* Whether SAVE/iter_N is a complete checkpoint: its manifest is there and parses (the commit
 * wrote it after every file was written, fsync'ed and hashed). */
static bool is_complete(const char *save_dir, int64_t it) {
    char dir[4200];
    ck_iter_dir(dir, sizeof dir, save_dir, it);
    ck_manifest *m = NULL;
    if (ck_read_manifest(dir, &m)) return false;
    ck_manifest_free(&m);
    return true;
}

int ck_prune(const char *save_dir, int keep, bool dry_run, int64_t *removed, int max, int *nremoved) {
    return ck_prune_every(save_dir, keep, 0, dry_run, removed, max, nremoved);
}

int ck_prune_every(const char *save_dir, int keep, int every, bool dry_run, int64_t *removed, int max, int *nremoved) {
    *nremoved = 0;
    if (keep < 1) return co_err_set(CO_EINVAL, "retention must keep at least one checkpoint (got %d)", keep);
    if (every < 0) return co_err_set(CO_EINVAL, "retention: keep every %d-th iteration: give 0 (none) or more", every);
    int64_t tracked = -1;
    int rc = ck_read_tracker(save_dir, &tracked);
    if (rc && rc != CO_ENOENT) return rc;
    if (rc) tracked = -1;
    int64_t *its;
    int n;
    rc = ck_list_iterations(save_dir, &its, &n);
    if (rc) return rc;
    /* the newest `keep` complete checkpoints stay, with whatever lies between them (the
     * newest complete one is where a resume goes when the tracker's is damaged) */
    int cut = n, complete = 0;
    while (cut > 0 && complete < keep)
        if (is_complete(save_dir, its[--cut])) complete++;
    /* so do the tracker's, anything newer than the tracker (a save that crashed before
     * replacing the tracker is not retention's call) and every `every`-th iteration */
    for (int i = 0; i < cut && !rc; i++) {
        if (its[i] == tracked || (tracked >= 0 && its[i] > tracked)) continue;
        if (every > 0 && its[i] % every == 0) continue;
        if ((rc = check_interrupted(save_dir))) break;
        if (!dry_run) rc = ck_remove_checkpoint(save_dir, its[i]);
        if (!rc) {
            if (*nremoved < max) removed[*nremoved] = its[i];
            (*nremoved)++;
        }
    }
    free(its);
    return rc;
}

int ck_read_manifest(const char *ckpt_dir, ck_manifest **out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", ckpt_dir, CK_MANIFEST_NAME);
    char *data;
    size_t len;
    int rc = fs_read_all(path, &data, &len);
    if (rc) {
        if (rc == CO_ENOENT) return co_err_set(CO_ENOENT, "%s: missing (an incomplete checkpoint?)", path);
        return rc;
    }
    rc = ck_manifest_parse(data, len, path, out);
    free(data);
    return rc;
}
