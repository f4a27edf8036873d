/* comm.h - the collective interface every backend implements: the CPU one over ZeroMQ
 * (comm/zmq_*.c) and, later, NCCL. A communicator is a group of `size` ranks; this
 * process is `rank` in it. Sub-groups (tensor-, pipeline-, data-parallel) are split off.
 *
 * Every call (but the optional stream-ordered operations at the end of cm_ops) blocks
 * until done, until timeout_ms passes (CO_ETIMEOUT; timeout_ms < 0 waits without limit,
 * still abortable), or until cm_abort is called from any thread (CO_EABORTED). A peer that disconnects or fails gives CO_EREMOTE. After an error the
 * communicator is unusable: destroy it and build a new one (the restart path does this).
 * Reductions use a fixed order, so results are bitwise identical from run to run. */
#ifndef COHORT_COMM_COMM_H
#define COHORT_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef enum { CM_F32 = 0, CM_F64 = 1, CM_I64 = 2 } cm_dtype;

typedef struct cm_comm cm_comm;

/* One send or receive of a batch posted together (cm_ops.p2p_q). */
typedef struct cm_p2p {
    cm_comm *c; /* its communicator (every entry's of the same implementation) */
    void *buf;
    size_t bytes;
    int peer;
    int send; /* 1: send buf, 0: receive into it */
} cm_p2p;

typedef struct cm_ops {
    /* buf[count] = sum over ranks of buf[count], in place */
    int (*allreduce_sum)(cm_comm *c, void *buf, size_t count, cm_dtype dt, int timeout_ms);
    /* buf[bytes] from root to everyone */
    int (*broadcast)(cm_comm *c, void *buf, size_t bytes, int root, int timeout_ms);
    /* recv[size * bytes] = concatenation of every rank's send[bytes], in rank order */
    int (*allgather)(cm_comm *c, const void *send, void *recv, size_t bytes, int timeout_ms);
    /* recv[count] = sum over ranks of send[rank * count .. (rank+1) * count) */
    int (*reduce_scatter_sum)(cm_comm *c, const void *send, void *recv, size_t count, cm_dtype dt,
                              int timeout_ms);
    /* All-to-all with uneven blocks: this rank sends send_bytes[j] bytes to rank j, block j
     * of send at send_bytes[0] + ... + send_bytes[j-1], and receives recv_bytes[j] bytes
     * from rank j into recv, laid out the same way (its own block is copied). recv_bytes[j]
     * must be what rank j sends to this one: a mismatch fails the call on both sides
     * (CO_EPROTOCOL, naming both sizes). A caller that does not know the sizes first sends
     * the counts (every block 8 bytes), as the MoE token dispatcher does. send and recv must
     * not overlap. */
    int (*alltoallv)(cm_comm *c, const void *send, const size_t *send_bytes, void *recv,
                     const size_t *recv_bytes, int timeout_ms);
    int (*barrier)(cm_comm *c, int timeout_ms);
    int (*send)(cm_comm *c, const void *buf, size_t bytes, int peer, int timeout_ms);
    int (*recv)(cm_comm *c, void *buf, size_t bytes, int peer, int timeout_ms);
    /* A communicator over ranks[0..n) of this one (this rank must be among them; its new
     * rank is its index in ranks). Every listed rank calls it with the same list. */
    int (*split)(cm_comm *c, const int *ranks, int n, cm_comm **out);
    /* Thread-safe, async-signal-unsafe: makes every blocked and future call return
     * CO_EABORTED promptly. */
    void (*abort)(cm_comm *c);
    void (*destroy)(cm_comm *c);

    /* ---- stream-ordered operations: optional, NULL where an implementation has none
     * (ZeroMQ); NCCL has them. Each queues its operation on `stream`, the caller's CUDA
     * stream, behind the work queued there before, and returns once it is queued (no wait
     * for the device): its result is in the buffers for the work queued after it and for the
     * host after the caller's next sync of that stream. Buffers are device or managed memory
     * that the host leaves alone until then. A failed operation (a peer gone, an abort)
     * leaves its buffers unspecified; the failure shows at queued_error and at every later
     * call. No deadline: an operation whose peer never comes ends with the communicator's
     * abort (the supervisor's hang detection sends it). ---- */
    int (*allreduce_sum_q)(cm_comm *c, void *buf, size_t count, cm_dtype dt, void *stream);
    int (*allgather_q)(cm_comm *c, const void *send, void *recv, size_t bytes, void *stream);
    int (*reduce_scatter_sum_q)(cm_comm *c, const void *send, void *recv, size_t count, cm_dtype dt, void *stream);
    /* ops[0..n) as one group (ncclGroupStart/End, Megatron's batch_isend_irecv): none waits
     * for another to finish, so two ranks that each send to and receive from the other in
     * one batch cannot deadlock; messages between two ranks on one communicator match in
     * the order they were posted. The entries' communicators may differ. */
    int (*p2p_q)(const cm_p2p *ops, int n, void *stream);
    /* The first failure of this communicator's queued operations so far (0: none yet),
     * without waiting. */
    int (*queued_error)(cm_comm *c);
} cm_ops;

struct cm_comm {
    const cm_ops *ops;
    int rank, size;
    void *impl;
};

static inline void cm_destroy(cm_comm **c) {
    if (*c) (*c)->ops->destroy(*c);
    *c = NULL;
}

#endif
