/* dio.h - large checkpoint files past the page cache: O_DIRECT writes and reads in aligned
 * blocks, kept in flight by a few I/O threads while the caller copies and hashes (dio.c).
 *
 * Why: a buffered save copies 1.5 GB into the page cache and then waits for writeback
 * (dirty-page throttling on top), and a cold buffered load goes through readahead and the
 * cache's page allocation; on the disks measured (docs/benchmarks.md) direct I/O with two
 * 8 MiB requests in flight was 1.5-5x faster than either. The caller's bytes still go
 * through one copy (into or out of an aligned block) so that any layout and any alignment
 * of the tensors work, and that copy is where the hash is computed, in cache.
 *
 * Both fall back to buffered I/O where the file system refuses O_DIRECT (tmpfs, some
 * network file systems), and COHORT_CKPT_DIRECT_IO=0 turns direct I/O off altogether.
 * COHORT_CKPT_DIO_HUGEPAGES=0 keeps the blocks in 4 KiB pages (to measure what huge pages
 * bring; see block_new). */
#ifndef COHORT_CHECKPOINT_DIO_H
#define COHORT_CHECKPOINT_DIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define CK_DIO_BLOCK (8u << 20) /* bytes per request */
#define CK_DIO_SLOTS 4          /* blocks per file: two in flight, one filling, one spare */
#define CK_DIO_THREADS 2        /* requests in flight per file */
#define CK_DIO_ALIGN 4096

/* Direct I/O allowed (COHORT_CKPT_DIRECT_IO is not "0")? */
bool ck__dio_enabled(void);

/* Bytes this process has written / read with direct I/O so far (logs and tests). */
uint64_t ck_dio_bytes_written(void);
uint64_t ck_dio_bytes_read(void);

/* COHORT_CKPT_IO_TIMEOUT (seconds, default 300): how long a writer's or reader's caller
 * waits with no request finishing (and, reading, no bytes taken) before CO_ETIMEOUT. */
double ck__io_timeout_s(void);
/* CLOCK_MONOTONIC now + secs: a deadline for pthread_cond_timedwait on a monotonic condition. */
struct timespec ck__mono_after(double secs);
/* Tests: the I/O threads' (and the buffered path's) pwrite / pread go to these (NULL: the
 * real calls) - e.g. one that blocks, to see a stuck disk end in a timeout. */
void ck__dio_set_io_hooks(ssize_t (*pw)(int, const void *, size_t, off_t), ssize_t (*pr)(int, void *, size_t, off_t));

/* write(2) with the checkpoint failing-write test hook (store.c). */
ssize_t ck__hooked_pwrite(int fd, const void *buf, size_t len, off_t off);

/* ---- writer: blocks filled by the caller, written behind it --------------------------- *
 * The first block is written buffered when the file ends before it fills (small files:
 * manifests, records); from the first full block on, the descriptor is switched to
 * O_DIRECT and full blocks go to the I/O threads. The tail (under one block) is written
 * buffered after the direct writes drained, so the file never holds padding. */
typedef struct ck_dw ck_dw;

/* For fd (not owned; opened for writing at offset 0); path names it in errors. */
int ck_dw_new(ck_dw **out, int fd, const char *path);
/* Room in the current block: where the next bytes go, and how many fit (at least 1). */
char *ck_dw_space(ck_dw *w, size_t *room);
/* n bytes were put at ck_dw_space(): a full block is handed to the I/O threads (waiting
 * for a free one). Returns the first write failure, also one from an earlier block. */
int ck_dw_commit(ck_dw *w, size_t n);
/* Writes the rest and waits for every write (the file is not fsync'ed). */
int ck_dw_flush(ck_dw *w);
/* Stops the threads (queued blocks are dropped), frees, nulls *w. fd stays open. */
void ck_dw_destroy(ck_dw **w);

/* ---- reader: blocks read ahead of the consumers ---------------------------------------- *
 * Reads bytes [start, size) of a file with O_DIRECT, in file order, into CK_DIO_SLOTS
 * blocks, ahead of ck_dr_copy. Every byte of the range must be copied out exactly once
 * (a block is reused when all its bytes were taken), in roughly increasing order by any
 * number of threads. */
typedef struct ck_dr ck_dr;

/* Mostly not in the page cache (direct reads would be the faster way)? */
bool ck_dr_file_is_cold(int fd, uint64_t size);
/* Opens path with O_DIRECT; CO_EUNSUPPORTED when the file system refuses it. */
int ck_dr_new(ck_dr **out, const char *path, uint64_t start, uint64_t size);
/* Copies [off, off+len) to dst once read; a read error or a file shorter than size (also
 * one seen by another thread) fails every later copy. */
int ck_dr_copy(ck_dr *r, void *dst, size_t len, uint64_t off);
/* Fails every copy now waiting or to come (a consumer gave up: its bytes will never be
 * taken, so later blocks might never get a slot). */
void ck_dr_abort(ck_dr *r);
void ck_dr_destroy(ck_dr **r);

#endif
