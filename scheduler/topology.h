/* topology.h - where a rank sits in the tensor x pipeline x context x data parallel grid,
 * and how a global batch splits into micro batches. The rank order follows Megatron's
 * default "tp-cp-ep-dp-pp": tensor-parallel ranks are adjacent, pipeline stages farthest. */
#ifndef COHORT_SCHEDULER_TOPOLOGY_H
#define COHORT_SCHEDULER_TOPOLOGY_H

typedef struct topo {
    int world, tp, pp, cp, dp;
    int rank;
    int tp_rank, cp_rank, dp_rank, pp_rank;
} topo;

/* Fills t for `rank` of `world` ranks. CO_EINVAL if world is not tp*pp*cp*dp. */
int topo_init(topo *t, int world, int tp, int pp, int cp, int rank);
/* Micro batches each data-parallel rank runs per iteration: global / (micro * dp). */
int topo_num_microbatches(const topo *t, int global_batch, int micro_batch);
/* First pipeline stage / last pipeline stage (the ranks that read data). */
int topo_is_first_stage(const topo *t);
int topo_is_last_stage(const topo *t);

#endif
