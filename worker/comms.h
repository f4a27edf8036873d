/* comms.h - a rank's communicators for one generation: the world over the assignment's
 * endpoints, and every Megatron group of the layout (scheduler/groups.h) the rank belongs
 * to, each split from the world (tensor, context, data, data x context, pipeline, model,
 * tensor x context, tensor x data x context, tensor x data, embedding, position embedding
 * and the expert groups).
 *
 * Over ZeroMQ the groups share the world's transport: aborting the world (the supervisor
 * link does, on an Abort) fails every wait of every group at once, and destroying the set
 * closes them all; a new generation builds a new set from its assignment.
 *
 * With an NCCL device (--device cuda, in a build with NCCL) the rank also builds an NCCL
 * world on the GPU of its local rank from the generation's unique id (the supervisor puts
 * it in every assignment, a new one per generation) and splits every group from it
 * (ncclCommSplit); wk_comms_group then returns the NCCL group, and wk_comms_abort aborts
 * every NCCL communicator (ncclCommAbort) besides the ZeroMQ world. */
#ifndef COHORT_WORKER_COMMS_H
#define COHORT_WORKER_COMMS_H

#include "comm/comm.h"
#include "comm/zmq_comm.h"
#include "common/config.h"
#include "scheduler/groups.h"
#include "train/tr_groups.h"
#include "worker/link.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wk_comms wk_comms;

/* Connects to every rank of asg (cm_zmq_new with zo) and splits the groups. Errors name the
 * group whose split failed. */
int wk_comms_new(wk_comms **out, const sv_assignment *asg, const cm_zmq_options *zo);
/* ... and the NCCL groups on CUDA device nccl_device (< 0: none). CO_EUNSUPPORTED when the
 * build has no NCCL; CO_EPROTOCOL when the assignment carries no unique id. */
int wk_comms_new_nccl(wk_comms **out, const sv_assignment *asg, const cm_zmq_options *zo, int nccl_device);
/* --overlap-grad-reduce: group k (the data-parallel group, or data x context) again, over a
 * transport of its own (cm_zmq_new among its members, not split from the world), which only
 * the trainer's communication thread uses while the training thread's collectives go over
 * the world's (a ZeroMQ transport is used by one thread at a time). Each member binds a
 * second endpoint beside its data endpoint: "<path>.grad" for ipc, the tcp port plus
 * port_shift (the job's worker slots, so that it meets no other slot's port). zo's cancel
 * flag ends its connection wait; wk_comms_abort aborts it with the rest. 0 and nothing
 * opened where this rank's group k has one member. */
int wk_comms_open_grad(wk_comms *cs, const sv_assignment *asg, const cm_zmq_options *zo, topo_group_kind k,
                       int port_shift);
/* With NCCL (a set from wk_comms_new_nccl): group k again as an NCCL communicator of its own
 * (ncclCommSplit: every rank of the world calls it), its own stream, for the communication
 * threads of --overlap-grad-reduce and --overlap-param-gather, whose collectives then run
 * beside the training thread's on the device; wk_comms_trainer_groups hands it out as the
 * gradient group's own (k TOPO_G_EDP: as the expert-data-parallel group's). 0 and nothing
 * opened without NCCL. */
int wk_comms_open_grad_nccl(wk_comms *cs, topo_group_kind k);
/* The same for the expert-data-parallel group (the experts' gradients and parameters under
 * expert parallelism): "<path>.egrad" for ipc, the tcp port plus 2 x port_shift. */
int wk_comms_open_expert_grad(wk_comms *cs, const sv_assignment *asg, const cm_zmq_options *zo, int port_shift);
/* Aborts every communicator of the set: any thread (the link's). */
void wk_comms_abort(void *cs);
/* Frees every group and the world (NULL-safe; *pcs = NULL). */
void wk_comms_destroy(wk_comms **pcs);

cm_comm *wk_comms_world(const wk_comms *cs);
/* The group of kind k this rank is in (NULL: in none, as outside the embedding groups):
 * the NCCL one where the set has NCCL. */
cm_comm *wk_comms_group(const wk_comms *cs, topo_group_kind k);
/* The pipeline's point-to-point channels over ZeroMQ (NULL without a pipeline): dir 0 the
 * pipeline group, for activations (forward); dir 1 another group of the same ranks, for
 * their gradients (backward). Each channel delivers a peer's messages in the order sent, so
 * the two directions of one pair of ranks never wait on each other's order. */
cm_comm *wk_comms_pipeline(const wk_comms *cs, int dir);
/* The same two channels over NCCL (NULL without NCCL or without a pipeline): the pipeline's
 * NCCL group and a second NCCL communicator of its ranks, for activations and gradients on
 * the device in stream order (train/pipeline.c); wk_comms_abort aborts both. */
cm_comm *wk_comms_pipeline_device(const wk_comms *cs, int dir);
/* The world rank of member i of this rank's group k (-1: none). */
int wk_comms_member(const wk_comms *cs, topo_group_kind k, int i);
/* The rank within group k of world rank w (-1: w is not in this rank's group k). */
int wk_comms_rank_in(const wk_comms *cs, topo_group_kind k, int w);
const topo_layout *wk_comms_layout(const wk_comms *cs);

/* The trainer's groups (train/tr_groups.h) from this set, at setup and at every restart alike:
 * data parallel always; tensor, pipeline (its two channels, the embedding and model-parallel
 * groups) and context groups where c's sizes (the test stand-in's are 1) split the model;
 * the expert groups where the layout has expert parallelism (none under the stand-in);
 * the gradient group's own transport where wk_comms_open_grad opened it, the
 * expert-data-parallel group's where wk_comms_open_expert_grad did. cs NULL (one
 * process): every group NULL. */
void wk_comms_trainer_groups(const wk_comms *cs, const co_config *c, tr_groups *g);

/* Every member of every group holds the same value (one all-gather per group): 0, or
 * CO_EPROTOCOL naming the first group and ranks that differ (co_err_detail). For ranks that
 * must hold identical state, as the replicas of the test stand-in of model parallelism. */
int wk_comms_check_equal(wk_comms *cs, uint64_t value, int timeout_ms);

#endif
