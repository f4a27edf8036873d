/* fsutil.h - crash-safe file helpers shared by every module that writes files: atomic
 * writes, mkdir -p, whole-file reads.
 *
 * Crash-safe write: the data goes to PATH.tmp, which is fsync'ed, renamed over PATH, and
 * the directory is fsync'ed; a reader sees the old file or the complete new one. */
#ifndef COHORT_COMMON_FSUTIL_H
#define COHORT_COMMON_FSUTIL_H

#include <stddef.h>

/* Writes the concatenation of nbufs buffers to path crash-safely. 0 or CO_EIO/CO_ENOSPC/... */
int fs_write_atomic(const char *path, const void *const *bufs, const size_t *lens, int nbufs);
/* As fs_write_atomic with a temporary name unique to this process and thread
 * (PATH.tmp.PID.TID), for files several processes may write at once (the index cache). */
int fs_write_atomic_unique(const char *path, const void *const *bufs, const size_t *lens, int nbufs);
/* fsync the directory that contains path. */
int fs_fsync_parent(const char *path);
/* mkdir -p (mode 0777 & umask). */
int fs_mkdirs(const char *dir);
/* Maps errno to a CO_E* code. */
int fs_errno_code(int err);
/* Reads a whole file into a malloc'ed buffer (NUL-terminated; *len excludes the NUL). */
int fs_read_all(const char *path, char **data, size_t *len);

#endif
