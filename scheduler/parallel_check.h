/* parallel_check.h - the configuration's parallel layout checked before any work: every
 * parallel size in its range, the combinations of tensor, context, expert, pipeline
 * parallelism and the distributed optimizer that are built, the world the sizes divide, and
 * the pipeline's layer placement and schedule. The checks add their problems to a
 * co_problems list (common/config.h); train/config_check.c runs them in order. */
#ifndef COHORT_SCHEDULER_PARALLEL_CHECK_H
#define COHORT_SCHEDULER_PARALLEL_CHECK_H

#include "common/config.h"

#include <stdbool.h>

/* Every parallel size (and --nproc-per-node, --nnodes) in its range (CO_MAX_* in
 * common/config.h), each refusal naming the range. Returns false when one is out of range:
 * the combinations' checks assume them. */
bool topo_check_sizes(const co_config *c, co_problems *P);

/* The combinations that are built (sizes_ok: topo_check_sizes passed): the distributed
 * optimizer's, context parallelism's, expert parallelism's and the virtual pipeline's.
 * Turns --sequence-parallel off at tensor-parallel size 1, as Megatron. */
void topo_check_parallel(co_config *c, bool sizes_ok, co_problems *P);

/* The world: --nproc-per-node x --nnodes at most CO_MAX_PROCS, --node-rank in it, and the
 * data-parallel size dp the launcher derived in range. */
void topo_check_world(const co_config *c, int dp, co_problems *P);

/* With a pipeline, Megatron's layer placement and schedule for these flags (the trainer
 * builds them alike), checked once the rest passed. 0, CO_EINVAL with the reason in
 * co_err_detail(), or CO_ENOMEM. */
int pp_check_config(const co_config *c, int dp);

#endif
