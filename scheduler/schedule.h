/* schedule.h - Megatron's pipeline schedules as data: the ordered list of forward and
 * backward operations one pipeline rank runs in one iteration, and where each operation's
 * input comes from and its output goes. Pure logic (no I/O, no model): the worker executes
 * these lists (docs/pipeline.md).
 *
 * As megatron/core/pipeline_parallel/schedules.py:
 *  - p = 1: forward_backward_no_pipelining: F0 B0 F1 B1 ... (no warm-up).
 *  - v = 1: forward_backward_pipelining_without_interleaving (1F1B): warm-up
 *    min(p - r - 1, m) forwards, then m - warm-up pairs of one forward and one backward,
 *    then warm-up backwards.
 *  - v > 1: forward_backward_pipelining_with_interleaving: the same three phases over
 *    m·v virtual micro batches, warm-up min(2(p - r - 1) + (v - 1)·g, m·v)
 *    (get_pp_rank_microbatches); virtual micro batch k is (micro batch, chunk) of
 *    get_schedule_table (groups of g micro batches, each group run through chunk 0, then 1,
 *    ..., the last group holding the rest), its backward runs the chunks in reverse
 *    (chunk v - 1 - c).
 * In the steady phase each step runs its forward before its backward, as Megatron does. */
#ifndef COHORT_SCHEDULER_SCHEDULE_H
#define COHORT_SCHEDULER_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>

/* Bounds of what pp_sched_check accepts (the lists are 2·m·v operations per rank). */
#define PP_MAX_RANKS 65536
#define PP_MAX_CHUNKS 1024
#define PP_MAX_MICROBATCHES (1 << 20)
#define PP_MAX_VIRTUAL_MICROBATCHES (1 << 22) /* m·v */

typedef enum { PP_FORWARD = 0, PP_BACKWARD = 1 } pp_kind;

/* One operation: a forward or backward of micro batch mb (0..m-1) through model chunk
 * (virtual stage) chunk (0..v-1) of this rank. */
typedef struct pp_op {
    pp_kind kind;
    int mb;
    int chunk;
} pp_op;

/* p: pipeline ranks (--pipeline-model-parallel-size); rank: this one (0..p-1); m: micro
 * batches per iteration; v: model chunks per rank (1 = no interleaving); group:
 * --microbatch-group-size-per-virtual-pipeline-stage, 0 = p (Megatron's default; only
 * used when v > 1, as in Megatron). */
typedef struct pp_sched_cfg {
    int p, rank, m, v, group;
} pp_sched_cfg;

/* Checks c as Megatron does (m >= 1; v > 1 needs p > 1; with v > 1: p <= group <= m and
 * m mod group is 0 or >= p) and against the bounds above. 0, or CO_EINVAL with
 * co_err_detail() a sentence naming the flag and the values. */
int pp_sched_check(const pp_sched_cfg *c);

/* The group size in effect: group, or p when group is 0. */
int pp_sched_group(const pp_sched_cfg *c);

/* Fills ops[0..2·m·v) with rank c->rank's operations in order; *n = 2·m·v. CO_EINVAL (a
 * bad configuration, co_err_detail() says why) or CO_ERANGE (cap < 2·m·v) otherwise. */
int pp_schedule(const pp_sched_cfg *c, pp_op *ops, int cap, int *n);

/* Megatron's num_warmup_microbatches for c->rank: the forwards of the warm-up phase (the
 * steady phase then starts with one more forward before the first backward, so the
 * forwards before the first backward are min(warm-up + 1, m·v)). 0 for p = 1. -1 when
 * pp_sched_check refuses c. */
int pp_warmup(const pp_sched_cfg *c);

/* The virtual micro batch table (get_schedule_table): virtual micro batch k (0..m·v-1)
 * of the forward order is micro batch *mb of chunk *chunk. c must pass pp_sched_check. */
void pp_table(const pp_sched_cfg *c, int k, int *mb, int *chunk);

/* Megatron's steps of the pipeline's point-to-point exchange, for a transport where a send
 * waits for its receive and each batch of sends and receives is one group that ends as a
 * whole (NCCL groups on a stream; Megatron's batch_isend_irecv): whether operation i
 * (0..2·m·v-1) of rank c->rank's list begins a step. A step's group is posted before its
 * first operation runs and holds the sends of the previous step's operations and the
 * receives of this step's. 1F1B (v = 1): every operation is a step (Megatron's
 * send_forward_recv_backward and send_backward_recv_forward); interleaved: each warm-up
 * forward, each steady pair of a forward and a backward (one
 * send_forward_backward_recv_forward_backward after the pair), each cool-down backward.
 * Then every rank's k-th group pairs with its neighbours' (one step apart), so no group
 * waits for one its peer posts after a group that waits for this rank's next; pairing each
 * backward's receive with the forward's send before it instead deadlocks the interleaved
 * schedule. c must pass pp_sched_check. */
bool pp_exchange_step(const pp_sched_cfg *c, int i);
/* The receives posted in the group of the step that begins at operation i of rank
 * c->rank's training list ops[0..n) (pp_schedule's), as the operations whose inputs they
 * are, into r[0..cap): the number, or CO_ERANGE. Each operation's input is received with
 * its own step, except on the interleaved schedule's wrap-around link (the last rank's
 * outputs into rank 0's next chunk; rank 0's input gradients into the last rank's previous
 * chunk), where the receive is aligned with its sender as Megatron's
 * recv_tensor_from_previous_stage does: the step after the leading rank's k-th forward
 * (backward) takes what the sender's virtual micro batch k + 1 - p sent. With the micro
 * batch group the pipeline size that is the consuming operation's own step; with a larger
 * group the first stage takes the last stage's first-chunk outputs several steps before
 * the forwards that read them, and the receiver keeps them in a queue (Megatron's lists)
 * until then. Receiving each with its consumer deadlocks there. */
int pp_exchange_recvs(const pp_sched_cfg *c, const pp_op *ops, int n, int i, pp_op *r, int cap);

/* A peer stage: pipeline rank and model chunk; rank -1 = none. */
typedef struct pp_peer {
    int rank, chunk;
} pp_peer;

/* Where an operation's input comes from and where its output goes.
 * Forward of chunk c on rank r: from (r-1, c), or on rank 0 with c > 0 from (p-1, c-1);
 * to (r+1, c), or on rank p-1 with c < v-1 to (0, c+1). A backward runs the other way:
 * its input (the output's gradient) comes from where the forward sent its output, and its
 * output (the input's gradient) goes where the forward's input came from. */
typedef struct pp_link {
    pp_peer from, to;
    bool first_stage; /* chunk 0 on rank 0: its forward reads the data, its backward sends nothing */
    bool last_stage;  /* chunk v-1 on rank p-1: its forward computes the loss, its backward starts from it */
} pp_link;

/* The link of op on rank c->rank (uses c->p, c->rank, c->v). */
void pp_op_link(const pp_sched_cfg *c, const pp_op *op, pp_link *l);

/* Writes "F3.1" (forward of micro batch 3 through chunk 1) or "B3.1" into buf; returns
 * snprintf's count. */
int pp_op_str(const pp_op *op, char *buf, size_t n);

#endif
