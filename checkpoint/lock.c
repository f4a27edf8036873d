/* lock.c - the save directory's lock file and write probe (see lock.h). */
#include "checkpoint/lock.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ck_lock {
    int fd;
    char *dir, *path;
    int created; /* the directory did not exist before */
};

/* what the holder wrote: job, pid, host, started */
typedef struct {
    char job[64], host[256];
    long pid;
    long long started;
} holder;

static void parse_holder(const char *text, holder *h) {
    memset(h, 0, sizeof *h);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, "job=", 4)) sscanf(p + 4, "%63[^\n]", h->job);
        else if (!strncmp(p, "host=", 5)) sscanf(p + 5, "%255[^\n]", h->host);
        else if (!strncmp(p, "pid=", 4)) h->pid = strtol(p + 4, NULL, 10);
        else if (!strncmp(p, "started=", 8)) h->started = strtoll(p + 8, NULL, 10);
    }
}

static void read_holder(int fd, holder *h) {
    char buf[1024];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    parse_holder(buf, h);
}

static void describe(const holder *h, char *out, size_t n) {
    char when[64] = "an unknown time";
    time_t t = (time_t)h->started;
    struct tm tm;
    if (h->started > 0 && localtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(out, n, "job %s (pid %ld on %s, since %s)", h->job[0] ? h->job : "?", h->pid, h->host[0] ? h->host : "?",
             when);
}

/* The directory exists (made when missing), is a directory, and takes a new file. */
static int probe(const char *what, const char *dir, int *created) {
    struct stat st;
    *created = 0;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return co_err_set(CO_EINVAL, "%s %s: not a directory", what, dir);
    } else if (errno == ENOENT) {
        int rc = fs_mkdirs(dir);
        if (rc) return co_err_set(rc, "%s %s: cannot create the directory: %s", what, dir, co_err_detail());
        *created = 1;
    } else {
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s %s: cannot create the directory: %s", what, dir, strerror(e));
    }
    char path[4300];
    if ((size_t)snprintf(path, sizeof path, "%s/.cohort.probe-%ld", dir, (long)getpid()) >= sizeof path)
        return co_err_set(CO_EINVAL, "%s %s: path too long", what, dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        return co_err_set(e == EACCES || e == EPERM || e == EROFS ? CO_EDENIED : fs_errno_code(e),
                          "%s %s: cannot create a file there: %s", what, dir, strerror(e));
    }
    int e = 0;
    if (write(fd, "x", 1) != 1) e = errno ? errno : EIO;
    if (close(fd) && !e) e = errno;
    if (unlink(path) && !e) e = errno;
    if (e) return co_err_set(fs_errno_code(e), "%s %s: cannot write a file there: %s", what, dir, strerror(e));
    return 0;
}

int ck_savedir_lock(ck_lock **out, const char *dir, const char *job, char *note, size_t notelen) {
    return ck_savedir_lock_as(out, "--save", dir, job, note, notelen);
}

int ck_savedir_lock_as(ck_lock **out, const char *what, const char *dir, const char *job, char *note, size_t notelen) {
    *out = NULL;
    if (note && notelen) note[0] = '\0';
    int created = 0;
    int rc = probe(what, dir, &created);
    if (rc) return rc;
    ck_lock *l = calloc(1, sizeof *l);
    size_t pn = strlen(dir) + sizeof CK_LOCK_NAME + 2;
    if (l) l->path = malloc(pn), l->dir = strdup(dir);
    if (!l || !l->path || !l->dir) {
        if (l) free(l->path), free(l->dir);
        free(l);
        return co_err_set(CO_ENOMEM, "%s %s: out of memory", what, dir);
    }
    snprintf(l->path, pn, "%s/%s", dir, CK_LOCK_NAME);
    l->created = created;
    l->fd = -1;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "unknown");
    for (int attempt = 0; attempt < 8 && !rc; attempt++) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            int e = errno;
            rc = co_err_set(fs_errno_code(e), "%s %s: cannot open the lock file %s: %s", what, dir, l->path, strerror(e));
            break;
        }
        holder h;
        char who[512];
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            int e = errno;
            if (e == EWOULDBLOCK) {
                read_holder(fd, &h);
                describe(&h, who, sizeof who);
                rc = co_err_set(CO_EINVAL, "%s %s is in use: locked by %s; one job per save directory", what, dir, who);
            } else {
                rc = co_err_set(fs_errno_code(e), "%s %s: cannot lock %s: %s", what, dir, l->path, strerror(e));
            }
            close(fd);
            break;
        }
        /* the holder may have removed the file between our open and flock: lock the file
         * that is there now */
        struct stat a, b;
        if (fstat(fd, &a) || stat(l->path, &b) || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd);
            continue;
        }
        read_holder(fd, &h);
        if (h.pid > 0 || h.host[0]) {
            describe(&h, who, sizeof who);
            if (strcmp(h.host, host)) {
                rc = co_err_set(CO_EINVAL,
                                "%s %s: %s names %s, another host, whose job this host cannot see; if that job "
                                "is no longer running, remove %s", what, dir, l->path, who, l->path);
                close(fd);
                break;
            }
            bool alive = h.pid > 0 && (kill((pid_t)h.pid, 0) == 0 || errno == EPERM);
            if (note && notelen)
                snprintf(note, notelen, "%s %s: taking over the stale lock of %s: %s", what, dir, who,
                         alive ? "that pid now belongs to a process that does not hold the lock" : "that process is gone");
        }
        char text[512];
        int len = snprintf(text, sizeof text, "job=%s\npid=%ld\nhost=%s\nstarted=%lld\n", job ? job : "", (long)getpid(),
                           host, (long long)time(NULL));
        if (ftruncate(fd, 0) || pwrite(fd, text, (size_t)len, 0) != len || fsync(fd)) {
            int e = errno;
            rc = co_err_set(fs_errno_code(e), "%s %s: cannot write the lock file %s: %s", what, dir, l->path, strerror(e));
            unlink(l->path);
            close(fd);
            break;
        }
        l->fd = fd;
        break;
    }
    if (!rc && l->fd < 0) rc = co_err_set(CO_EIO, "%s %s: the lock file %s keeps being replaced", what, dir, l->path);
    if (rc) {
        if (l->created) rmdir(dir);
        free(l->path);
        free(l->dir);
        free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int ck_savedir_lock_held(const char *dir, char *who, size_t n) {
    if (n) who[0] = '\0';
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, CK_LOCK_NAME);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return 0;
        return co_err_set(fs_errno_code(e), "%s: cannot open the lock file: %s", path, strerror(e));
    }
    holder h;
    int held = 0;
    /* a shared lock taken and dropped at once: it fails only while a job holds its
     * exclusive one */
    if (flock(fd, LOCK_SH | LOCK_NB)) {
        int e = errno;
        if (e != EWOULDBLOCK) {
            close(fd);
            return co_err_set(fs_errno_code(e), "%s: cannot test the lock: %s", path, strerror(e));
        }
        held = 1;
    }
    read_holder(fd, &h);
    close(fd);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "unknown");
    if (!held && h.host[0] && strcmp(h.host, host)) held = 1; /* another host's: cannot tell */
    if (held && n) describe(&h, who, n);
    return held;
}

void ck_savedir_unlock(ck_lock **pl) {
    ck_lock *l = pl ? *pl : NULL;
    if (!l) return;
    unlink(l->path); /* while holding it: a waiting opener sees another inode and retries */
    close(l->fd);
    if (l->created) rmdir(l->dir); /* fails, as it should, unless still empty */
    free(l->path);
    free(l->dir);
    free(l);
    *pl = NULL;
}
