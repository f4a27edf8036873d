/* fsutil.c - crash-safe file helpers. */
#include "common/fsutil.h"

#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_errno_code(int err) {
    switch (err) {
    case ENOENT:
    case ENOTDIR: return CO_ENOENT;
    case ENOSPC:
    case EDQUOT: return CO_ENOSPC;
    case EACCES:
    case EPERM:
    case EROFS: return CO_EDENIED;
    case ENOMEM: return CO_ENOMEM;
    case EINTR: return CO_EINTERRUPTED;
    default: return CO_EIO;
    }
}

int fs_fsync_parent(const char *path) {
    char *dir = strdup(path);
    if (!dir) return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        int rc = co_err_set(fs_errno_code(e), "%s: cannot open directory: %s", dir, strerror(e));
        free(dir);
        return rc;
    }
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "%s: fsync of directory failed: %s", dir, strerror(e));
    }
    close(fd);
    free(dir);
    return rc;
}

static int write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int write_atomic(const char *path, int unique, const void *const *bufs, const size_t *lens, int nbufs) {
    size_t pl = strlen(path) + 64;
    char *tmp = malloc(pl);
    if (!tmp) return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    if (unique)
        snprintf(tmp, pl, "%s.tmp.%ld.%lx", path, (long)getpid(), (unsigned long)pthread_self());
    else
        snprintf(tmp, pl, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        int rc = co_err_set(fs_errno_code(e), "%s: cannot create: %s", tmp, strerror(e));
        free(tmp);
        return rc;
    }
    for (int i = 0; i < nbufs; i++) {
        if (write_full(fd, bufs[i], lens[i]) != 0) goto fail;
    }
    if (fsync(fd) != 0) goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) goto fail;
    free(tmp);
    return fs_fsync_parent(path);
fail: {
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    int rc = co_err_set(fs_errno_code(e), "%s: write failed: %s", path, strerror(e));
    free(tmp);
    return rc;
}
}

int fs_write_atomic(const char *path, const void *const *bufs, const size_t *lens, int nbufs) {
    return write_atomic(path, 0, bufs, lens, nbufs);
}

int fs_write_atomic_unique(const char *path, const void *const *bufs, const size_t *lens, int nbufs) {
    return write_atomic(path, 1, bufs, lens, nbufs);
}

int fs_mkdirs(const char *dir) {
    char *p = strdup(dir);
    if (!p) return co_err_set(CO_ENOMEM, "%s: out of memory", dir);
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] == '/' || p[i] == '\0') {
            char c = p[i];
            p[i] = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                int rc = co_err_set(fs_errno_code(e), "%s: cannot create directory: %s", p, strerror(e));
                free(p);
                return rc;
            }
            p[i] = c;
        }
    }
    free(p);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return co_err_set(CO_EIO, "%s: not a directory", dir);
    return 0;
}

int fs_read_all(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s: cannot open: %s", path, strerror(e));
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return co_err_set(CO_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            close(fd);
            return co_err_set(fs_errno_code(e), "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}
