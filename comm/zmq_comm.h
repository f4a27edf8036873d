/* zmq_comm.h - the CPU implementation of the collective interface (comm.h) over ZeroMQ.
 *
 * Every rank binds one data endpoint (ipc:// or tcp://, handed out by the supervisor at
 * rendezvous) with a ROUTER socket and connects one DEALER to every peer's endpoint, so
 * ranks may start in any order: cm_zmq_new exchanges a HELLO with every peer and returns
 * once all are reachable, or CO_ETIMEOUT after connect_timeout_ms.
 *
 * Sub-groups made by split() share the parent's sockets (messages carry a group id), so
 * split costs no new connections. All communicators split from one cm_zmq_new form a
 * family: a failure or an abort on any of them (from any thread) fails the whole family;
 * every blocked and later call on any of them returns promptly. A failing rank tells its
 * peers why (they get CO_EREMOTE naming it), and a peer that dies is detected through its
 * disconnect (ipc, tcp) or missed ZMTP heartbeats (tcp), so a dead worker gives a
 * job-level error on every rank rather than a hang.
 *
 * Shared memory: ranks whose endpoints are both ipc:// (so on one host) also share memory.
 * At HELLO each such rank offers an anonymous memfd segment and an eventfd doorbell, handed
 * to its peers over a unix datagram socket next to its endpoint (removed once cm_zmq_new
 * returns; a memfd leaves nothing behind when a process is killed); every rank then tells
 * every other whose segments it mapped, so all agree which pairs share memory. A group
 * (the world or a split) whose members all share memory pairwise all-reduces through the
 * segments; everything else, and every other collective, goes over ZeroMQ. ZeroMQ still
 * carries failures (FAIL messages, disconnects), so abort, timeouts and dead peers behave
 * the same on both paths.
 *
 * Algorithms: all-reduce through shared memory works in blocks of shm_block_bytes: each
 * rank copies the pieces of a block that others own into its segment, the owner of each
 * piece sums the members' contributions in group rank order (x_0 + x_1 + ... + x_{n-1})
 * straight from their segments and publishes the sum, and every rank copies the sums in;
 * a few blocks are in flight at once. Over ZeroMQ all-reduce is a ring reduce-scatter then
 * all-gather, pipelined in chunks of chunk_bytes (a chunk is forwarded as soon as it is
 * reduced, so sends and receives overlap, and received buffers are forwarded without a
 * copy), segment j summed in ring order x_j + x_{j+1} + ... + x_{j-1}; buffers up to
 * small_bytes use a direct exchange (every rank sums all contributions in rank order).
 * Which algorithm a group uses depends only on its members' endpoints and options, so
 * every element's summation order is fixed for a job: results are bitwise identical from
 * run to run and on every rank. f32 sums in f32, f64 in f64, i64 in i64 (wrapping). The
 * library never keeps a pointer to a caller's buffer after a call returns, even after an
 * error (peers only ever read the segments).
 *
 * Threading: a communicator is used from one thread; only abort may be called from any
 * other thread (or a mailbox loop). Options must agree on all ranks (checked at HELLO). */
#ifndef COHORT_COMM_ZMQ_COMM_H
#define COHORT_COMM_ZMQ_COMM_H

#include "comm/comm.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct cm_zmq_options {
    int connect_timeout_ms;   /* cm_zmq_new waits this long for every peer (30000) */
    size_t chunk_bytes;       /* pipeline chunk and largest message (4 MiB); same on all ranks */
    size_t small_bytes;       /* all-reduce of at most this many bytes: direct exchange (32 KiB) */
    size_t shm_block_bytes;   /* shared-memory all-reduce block between ranks on one host (1 MiB);
                                 0 = ZeroMQ only; a multiple of 64 in [256, 1 GiB] */
    int io_threads;           /* ZeroMQ I/O threads (1) */
    int linger_ms;            /* destroy waits at most this long to flush last sends (2000) */
    int peer_grace_ms;        /* a disconnected peer's in-flight data is awaited this long before
                                 CO_EREMOTE (500) */
    int heartbeat_ivl_ms;     /* ZMTP heartbeats on every connection, 0 = off (1000) */
    int heartbeat_timeout_ms; /* no traffic for this long = peer dead (10000) */
    /* CURVE on tcp endpoints: the job secret's server keypair and client secret key (Z85,
     * 40 characters; all NULL = no encryption, for ipc in a private directory). Every rank's
     * ROUTER on tcp is a CURVE server with the server keypair and a ZAP handler; rank r's
     * DEALERs prove rank r's own key, derived from the client secret (zmq_auth.h), and a
     * message's sender is the rank its connection proved, never the routing id it chose.
     * A process without the secret cannot connect at all. */
    const char *curve_server_public, *curve_server_secret, *curve_client_secret;
    int rcvhwm_msgs;          /* messages ZeroMQ queues per peer before it stops reading the
                                 connection (0 = derived: 256 MiB of chunks, at least 16) */
    /* NULL, or a flag another thread raises to give up: once *cancel is nonzero, cm_zmq_new
     * (its wait for every peer), a split and every operation of the communicator fail with
     * CO_EABORTED within a poll slice (100 ms), as after cm_abort. A cm_abort needs the
     * communicator, which a rank still connecting does not have yet (a worker's generation
     * aborted while its communicators are built: worker/link.c) */
    const volatile sig_atomic_t *cancel;
} cm_zmq_options;

/* The defaults above. */
void cm_zmq_options_default(cm_zmq_options *opt);

/* What this process has sent on c's transport (shared by every communicator split from the
 * same cm_zmq_new) since it was made: payload bytes over ZeroMQ, and bytes it wrote into its
 * shared-memory segment for the other ranks to read. Call from the communicator's thread. */
void cm_zmq_traffic(const cm_comm *c, uint64_t *zmq_bytes, uint64_t *shm_bytes);

/* Whether c is a ZeroMQ communicator of two or more ranks whose all-reduce goes through
 * shared memory (every member on this host): then an all-reduce moves bytes by memcpy,
 * where the other collectives go through ZeroMQ's sockets (the distributed optimizer
 * chooses by it, optim/dist_opt.h). */
bool cm_zmq_shared_memory(const cm_comm *c);

/* A communicator of `size` ranks in which this process is `rank`; endpoints[r] is the
 * endpoint rank r binds (this process binds endpoints[rank]). opt NULL = defaults.
 * Errors: CO_EINVAL (arguments), CO_EIO (bind/connect), CO_ETIMEOUT (a peer never answered),
 * CO_EPROTOCOL (a peer with other options or another world size), CO_ENOMEM. */
int cm_zmq_new(cm_comm **out, int rank, int size, const char *const *endpoints,
               const cm_zmq_options *opt);

#endif
