/* store.h - a save directory on disk: checkpoint directory names, the tracker file, the
 * commit protocol, listing and retention, and the file writer every shard goes through
 * (hashing as it writes, with test hooks that fail the Nth write or kill the process at a
 * named phase).
 *
 * Layout of a save directory SAVE:
 *   SAVE/latest_checkpointed_iteration.txt    the committed iteration ("100"), as Megatron
 *   SAVE/iter_0000100/manifest.json, *.safetensors
 *   SAVE/iter_0000100.tmp-PID/                being written (removed at the next start)
 *   SAVE/iter_0000050.del-PID/                being removed by retention
 * Commit: files written and fsync'ed in the temporary directory, the directory fsync'ed,
 * renamed to iter_N (atomically exchanged if iter_N exists), SAVE fsync'ed, then the tracker
 * replaced atomically. At every instant the tracker names a complete checkpoint. */
#ifndef COHORT_CHECKPOINT_STORE_H
#define COHORT_CHECKPOINT_STORE_H

#include "checkpoint/format.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

/* ---- test hooks ----------------------------------------------------------------------
 * COHORT_CKPT_CRASH_AT=PHASE[:N][@WHO]  raise SIGKILL the Nth time (default 1st) this
 *   process reaches PHASE: start, shard (half of the first shard written), shards,
 *   written (a rank's files and its writer record fsync'ed, not yet acknowledged), acked
 *   (acknowledged to the supervisor, no answer yet), manifest, renamed, committed (parent
 *   fsync'ed, tracker not yet replaced), tracker, prune.
 * COHORT_CKPT_FAIL_WRITE=N[:ERRNO][@WHO] the Nth checkpoint write(2) fails with ERRNO
 *   (default ENOSPC=28; 5 is EIO), SQLite-style.
 * COHORT_CKPT_STOP_AT=N[@WHO]         the process stops itself (SIGSTOP) at its Nth
 *   ck_file_write, its file half written: a test signals it there, then continues it.
 * @WHO limits a hook to one process of a supervised job: a worker's data-parallel rank
 *   ("@1") or the supervisor ("@sv"). Without it the hook applies in every process that
 *   sees the variable (the supervisor passes COHORT_CKPT_* on to its workers). */
void ck_crash_point(const char *phase);
/* This process's role for @WHO ("sv", or a rank); by default a supervised worker's rank
 * (COHORT_WORKER_ID). Re-reads the hooks. */
void ck_test_set_role(const char *who);
/* Programmatic equivalent of COHORT_CKPT_FAIL_WRITE (n = 0 disables); resets the count. */
void ck_test_fail_write(long n, int err);

/* Returns rc with the current error detail prefixed by the formatted context
 * ("context: detail"); safe where co_err_set(rc, "...: %s", co_err_detail()) is not (the
 * detail buffer would be both source and destination). */
int ck_err_wrap(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- interruption (the `cohort ckpt` tools that write) ---------------------------------
 * ck_catch_signals makes SIGINT and SIGTERM set a flag instead of killing the process; from
 * then on ck_begin, ck_file_create, ck_file_write, ck_file_read and ck_prune fail with
 * CO_EINTERRUPTED ("interrupted by SIGINT"), so the caller's error path removes what it
 * had begun. A training process never calls it (its signal thread takes those signals). */
int ck_catch_signals(void);
/* The signal caught (SIGINT, SIGTERM) or 0. */
int ck_interrupted(void);
/* Restores the caught signal's default action and raises it (the process ends as killed
 * by it, exit status 128 + signal in a shell); returns when none was caught. */
void ck_reraise(void);

/* ---- hashing writer/reader ------------------------------------------------------------ */

typedef struct ck_dw ck_dw;

typedef struct ck_file {
    int fd;
    ck_dw *dw;                 /* writing: blocks written behind the caller (dio.h) */
    char path[4096];
    uint64_t bytes;
    XXH3_state_t *hash;
    XXH64_state_t *hash64;     /* with ck_file_want_xxh64 */
    uint64_t xxh64;            /* set by ck_file_finish when hash64 was wanted */
} ck_file;

/* Creates path (O_EXCL) for writing. */
int ck_file_create(ck_file *f, const char *path);
/* Also computes XXH64 (seed 0) of what is written (a rank's acknowledgement carries it). */
int ck_file_want_xxh64(ck_file *f);
/* Appends len bytes (hashing them). They go through blocks of CK_DIO_BLOCK bytes: a file
 * that ends within its first block is written with one buffered write at the end; a
 * larger one goes to disk with O_DIRECT, written behind the caller (dio.h). */
int ck_file_write(ck_file *f, const void *buf, size_t len);
/* fsync, close; the XXH3-128 of everything written into h. On error the file is closed. */
int ck_file_finish(ck_file *f, uint8_t h[16]);
/* Closes without syncing (error paths). */
void ck_file_abort(ck_file *f);

/* Opens path for reading with hashing. */
int ck_file_open(ck_file *f, const char *path, uint64_t *size);
/* Reads exactly len bytes (hashing them); CO_EFORMAT on a short file. */
int ck_file_read(ck_file *f, void *buf, size_t len);
/* Hash of everything read so far; closes. */
void ck_file_close(ck_file *f, uint8_t h[16]);

/* XXH3-128 of a whole file, and its size. */
int ck_hash_file(const char *path, uint8_t h[16], uint64_t *size);

/* ---- directory ------------------------------------------------------------------------ */

/* "SAVE/iter_0000100" */
void ck_iter_dir(char *out, size_t n, const char *save_dir, int64_t iteration);
/* Parses "iter_0000100" (exactly: 7+ digits, no suffix); -1 if not a checkpoint name. */
int64_t ck_parse_iter_name(const char *name);

/* The tracker's iteration: 0 and *it, CO_ENOENT when there is no tracker, CO_EFORMAT when it
 * does not hold a non-negative integer (the detail names the file and quotes what it
 * holds). */
int ck_read_tracker(const char *save_dir, int64_t *it);
/* Replaces the tracker atomically. */
int ck_write_tracker(const char *save_dir, int64_t it);

/* Iterations of the checkpoint directories in save_dir (names only; complete or not),
 * ascending. *out is malloc'ed. */
int ck_list_iterations(const char *save_dir, int64_t **out, int *n);

/* Removes leftovers of interrupted saves and removals (iter_*.tmp-*, iter_*.del-*): for the
 * holder of the save directory's lock at its start, when no other writer can be running. */
int ck_clean_stale(const char *save_dir);

/* Leftovers found by ck_clean_dead / ck_clean_dead_files: the first CK_STALE_MAX names of
 * those removed (or, dry_run, that would be) and of those kept because their owner may be
 * alive, with the counts. */
#define CK_STALE_MAX 32
typedef struct ck_stale {
    int nremoved, nkept;
    char removed[CK_STALE_MAX][256];
    char kept[CK_STALE_MAX][256], why_kept[CK_STALE_MAX][160];
} ck_stale;
/* Whether the process that a leftover's suffix names (".tmp-PID", ".del-PID") may be alive:
 * a PID alive on this host; false for a PID that is gone; -1 for a suffix that is no PID (a
 * supervised job's token, whose processes this host cannot tell). */
int ck_owner_alive(const char *suffix);
/* Removes the leftovers of dead processes from save_dir (the tool's side of ck_clean_stale,
 * safe beside a running job): an iter_*.tmp-X / iter_*.del-X is kept when locked_by is
 * not NULL (the save directory's lock is held by a live process, or by another host:
 * locked_by describes it, and every leftover may be that job's, a supervised job naming
 * its temporary directory by a token) or when X is a PID alive on this host; the others
 * are removed (dry_run: listed only). */
int ck_clean_dead(const char *save_dir, const char *locked_by, bool dry_run, ck_stale *st);
/* The same for plain files NAME.tmp-PID in dir, for each NAME in names (an export's
 * output): those of dead PIDs removed, those of live ones kept. */
int ck_clean_dead_files(const char *dir, const char *const *names, int nnames, ck_stale *st);

/* What a directory is to checkpoints. */
typedef enum {
    CK_DIR_OTHER = 0,      /* anything else, or absent */
    CK_DIR_SAVE,           /* holds the tracker or an iter_* directory */
    CK_DIR_CHECKPOINT,     /* holds a manifest.json */
} ck_dir_kind;
ck_dir_kind ck_classify_dir(const char *dir);
/* A tool's output directory checked before anything is written there: CO_EINVAL, naming
 * it (flag: "--output") and the directory it would damage, when it is or lies inside a
 * checkpoint directory (the source's included) or lies inside a save directory, or is a
 * save directory and !save_ok. Symbolic links in the part that exists are resolved. */
int ck_check_output(const char *output, bool save_ok, const char *flag);

/* Creates SAVE/iter_N.tmp-PID (removing a stale one) and writes its path into tmp. */
int ck_begin(const char *save_dir, int64_t iteration, char *tmp, size_t n);
/* The temporary directory shared by the writers of a multi-rank save:
 * SAVE/iter_N.tmp-TOKEN (TOKEN: the job's id, so every rank and the supervisor name it
 * alike). ck_begin_shared creates it (or finds it made by another rank). */
void ck_tmp_dir_shared(char *out, size_t n, const char *save_dir, int64_t iteration, const char *token);
int ck_begin_shared(const char *save_dir, int64_t iteration, const char *token, char *tmp, size_t n);
/* Removes every SAVE/iter_*.tmp-TOKEN (a job's unfinished saves). */
int ck_remove_tmp_dirs(const char *save_dir, const char *token);
/* Commits tmp as iteration N: fsync tmp, rename (exchange with an existing iter_N, which is
 * then removed), fsync SAVE, replace the tracker. */
int ck_commit(const char *save_dir, int64_t iteration, const char *tmp);
/* Removes a directory tree of plain files (one level: checkpoint directories). */
int ck_remove_dir(const char *dir);
/* Removes a checkpoint: renamed to iter_N.del-PID first, so it never looks complete while
 * half deleted. */
int ck_remove_checkpoint(const char *save_dir, int64_t iteration);
/* Retention: keeps the keep most recent complete checkpoints and the tracker's; removes the rest.
 * Writes the removed iterations into removed (up to max) and their count into *nremoved. */
int ck_prune(const char *save_dir, int keep, bool dry_run, int64_t *removed, int max, int *nremoved);
/* The same, also keeping every checkpoint whose iteration is a multiple of every (0: none;
 * --keep-every); keep counts complete checkpoints only (those whose manifest parses), so the
 * newest complete one always stays. */
int ck_prune_every(const char *save_dir, int keep, int every, bool dry_run, int64_t *removed, int max, int *nremoved);

/* Reads and parses SAVE/iter_N/manifest.json (or DIR/manifest.json with dir given). */
int ck_read_manifest(const char *ckpt_dir, ck_manifest **out);

#endif
