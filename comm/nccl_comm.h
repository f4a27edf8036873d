/* nccl_comm.h - the GPU implementation of the collective interface (comm.h) over NCCL.
 *
 * Communicators are NCCL's non-blocking kind (ncclConfig_t.blocking = 0): every call
 * enqueues its operation on the communicator's own CUDA stream and then polls
 * ncclCommGetAsyncError and the stream until the operation is done, the deadline passes
 * (CO_ETIMEOUT), a peer fails (CO_EREMOTE) or cm_abort is called from any thread
 * (CO_EABORTED: the aborting thread calls ncclCommAbort, which also stops a kernel that
 * waits for a peer that never comes). After any error the communicator is unusable:
 * destroy it and build a new one from a fresh unique id (the restart path).
 *
 * Buffers: device or managed memory go to NCCL directly; host memory (the trainer's small
 * loss/stop-vote arrays) is staged through pinned and device buffers. Calls return when
 * the result is in the caller's buffer. The caller orders compute before a collective
 * (the backend's sync) -- the communicator's stream does not wait on other streams.
 * The stream-ordered operations (comm.h's *_q: collectives, batches of sends and receives
 * over one or more communicators in one NCCL group) are queued on the caller's stream
 * instead and return once NCCL has enqueued them; they take device or managed memory only,
 * and their failures show at queued_error (ncclCommGetAsyncError, no wait).
 *
 * All-to-all: NCCL cannot tell a short send from a slow one, so the ranks first all-gather
 * their size lists (one small collective per call); sizes that disagree fail the call on
 * every rank with CO_EPROTOCOL, naming the pair and both sizes, before any data moves.
 *
 * Determinism: NCCL's reductions are repeatable for a fixed world size, topology, NCCL
 * version and environment (NCCL_ALGO / NCCL_PROTO unset or fixed); unlike the ZeroMQ
 * communicator this is NCCL's property, not one this file enforces.
 *
 * Threading: a communicator is used from one thread; only abort may be called from another
 * (a mailbox thread). */
#ifndef COHORT_COMM_NCCL_COMM_H
#define COHORT_COMM_NCCL_COMM_H

#include "comm/comm.h"

#include <stdatomic.h>
#include <stdint.h>

typedef struct cm_nccl_options {
    int init_timeout_ms;      /* cm_nccl_new and split wait this long for every rank (60000; < 0: no limit) */
    const atomic_int *cancel; /* optional: cm_nccl_new gives up with CO_EABORTED once *cancel != 0 */
    int poll_us;              /* pause between two polls of a pending operation (50) */
} cm_nccl_options;

void cm_nccl_options_default(cm_nccl_options *opt);

/* An ncclUniqueId (128 bytes) for a new communicator: made by one rank (rank 0) and handed
 * to every other rank out of band (the supervisor's protocol). CO_EUNSUPPORTED without a
 * usable GPU/NCCL. */
int cm_nccl_get_unique_id(uint8_t out[128]);

/* A communicator of `size` ranks in which this process is `rank`, on CUDA device `device`,
 * from the unique id every rank was given. Returns once every rank has joined, or
 * CO_ETIMEOUT / CO_EABORTED (opt->cancel) / CO_EREMOTE / CO_EUNSUPPORTED. opt NULL = defaults. */
int cm_nccl_new(cm_comm **out, int rank, int size, const uint8_t id[128], int device, const cm_nccl_options *opt);

/* ncclCommSplit: EVERY rank of c calls it (NCCL's rule, unlike comm.h's split, which only
 * the listed ranks call); ranks with the same color form a communicator ordered by key;
 * color < 0 gives *out = NULL. */
int cm_nccl_split_color(cm_comm *c, int color, int key, cm_comm **out, int timeout_ms);

/* The cudaStream_t the communicator runs on (for tests and for ordering with compute). */
void *cm_nccl_stream(cm_comm *c);

#endif
