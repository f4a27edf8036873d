/* launch_env.h - a node's place in a multi-node job (--nnodes, --node-rank, --master-addr,
 * --master-port, --nproc-per-node) read from the launcher's environment when the flags do
 * not give it: torchrun-style variables, Slurm's (a task started by srun) and a Kubernetes
 * Indexed Job's. Precedence, for each flag on its own: an explicit flag, then the
 * torchrun-style variable (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, NPROC_PER_NODE, or
 * torchrun's PET_ spelling), then Slurm (SLURM_STEP_NUM_NODES or SLURM_NNODES,
 * SLURM_NODEID, the first host of SLURM_STEP_NODELIST or SLURM_JOB_NODELIST; only inside an
 * srun step), then Kubernetes (JOB_COMPLETION_INDEX: the node rank). In an srun step
 * --node-addr (this node's address for its peers) is SLURMD_NODENAME where that name
 * resolves. docs/deploy.md. */
#ifndef COHORT_COMMON_LAUNCH_ENV_H
#define COHORT_COMMON_LAUNCH_ENV_H

#include "common/config.h"

#include <stddef.h>

/* The environment to read: getenv, or a test's table. */
typedef const char *(*co_env_get)(const char *name);

/* Fills the flags the command line left unset from the environment. note: what was taken
 * from where ("" when nothing), for the log. 0, or CO_EINVAL with the reason in
 * co_err_detail() (a variable that is not a number, or an srun step of several tasks per
 * node). */
int co_launch_env_apply(co_config *c, co_env_get get, char *note, size_t notelen);

/* The first host of a Slurm host list ("node[01-04,07],gpu3" -> "node01"; "127.0.0.[1-2]" ->
 * "127.0.0.1"). 0, or CO_EINVAL for a malformed list or one too long for out. */
int co_hostlist_first(const char *list, char *out, size_t n);

#endif
