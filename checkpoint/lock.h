/* lock.h - one job per save directory: SAVE/.cohort.lock, and a save directory found
 * unusable before the first step rather than at the first save.
 *
 * ck_savedir_lock creates the directory when missing (mkdir -p), creates and removes a
 * probe file in it (a file that is not a directory, a read-only file system, no
 * permission or no space is an error naming the directory and the reason), then takes the
 * lock: SAVE/.cohort.lock opened O_CLOEXEC and held with flock(LOCK_EX|LOCK_NB) for the
 * life of the handle, and rewritten to hold "job=ID", "pid=PID", "host=HOST" and
 * "started=UNIX" lines. The kernel drops a flock when its holder dies, so:
 *  - a lock held by a live process: CO_EINVAL, "... is locked by job ID (pid PID on
 *    HOST, since ...)";
 *  - a lock file left by a dead process of this host (its pid gone, or reused by a process
 *    that does not hold the lock): taken over; *note says so;
 *  - a lock file of another host whose lock is free: refused too (CO_EINVAL), since this
 *    host cannot tell whether that process still runs (a shared file system may not carry
 *    flocks across hosts): the message says to remove the file if that job is gone.
 * The caller is the job's one process, or its supervisor (not each worker). The storage
 * layer knows nothing of the trainer: job is any short identifier the caller chooses. */
#ifndef COHORT_CHECKPOINT_LOCK_H
#define COHORT_CHECKPOINT_LOCK_H

#include <stddef.h>

#define CK_LOCK_NAME ".cohort.lock"

typedef struct ck_lock ck_lock;

/* 0 (with *out set; *note receives a line when a stale lock was taken over, else "") or
 * a negative CO_E* code with the detail naming the directory. */
int ck_savedir_lock(ck_lock **out, const char *dir, const char *job, char *note, size_t notelen);
/* As ck_savedir_lock, its messages naming the directory as what ("--output", "save
 * directory") instead of "--save". */
int ck_savedir_lock_as(ck_lock **out, const char *what, const char *dir, const char *job, char *note, size_t notelen);
/* Whether a job holds dir's lock, without taking it: 1 (who gets "job ID (pid PID on HOST,
 * since ...)") when a live process holds it or the lock file names another host (whose
 * process this host cannot see), 0 when there is no lock file or its holder is gone, or a
 * negative CO_E* code. */
int ck_savedir_lock_held(const char *dir, char *who, size_t n);
/* Removes the lock file and releases the lock; removes the directory too when this handle
 * created it and it is still empty. Safe on NULL. */
void ck_savedir_unlock(ck_lock **l);

#endif
