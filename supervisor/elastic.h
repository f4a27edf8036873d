/* elastic.h - --elastic's decisions as pure functions over the planner's view (planner.h):
 * which model replicas leave when capacity is lost for good (the shrink) and which slots form
 * new replicas when it returns (the grow), with every slot's rank in the new world. The
 * supervisor (supervisor.c) carries them out through the in-process restart's generations;
 * tests/unit/supervisor/test_elastic.c drives them without processes. */
#ifndef COHORT_SUPERVISOR_ELASTIC_H
#define COHORT_SUPERVISOR_ELASTIC_H

#include "scheduler/groups.h"
#include "supervisor/planner.h"

/* A new world's shape and every slot's rank in it. */
typedef struct sve_plan {
    topo_layout layout; /* the new world's (its dp changed; tp, cp, pp as the old one's) */
    int *new_rank;      /* [nslots] (the caller's room): each slot's rank, -1: holds none */
    int changed;        /* replicas that leave (shrink) or join (grow) */
} sve_plan;

/* The shrink: every model replica (data-parallel coordinate) with a rank on a slot in gone[]
 * (its process is gone and nothing replaces it) leaves whole; the others keep their order and
 * close up (replica k of those kept is data-parallel rank k), each rank keeping its tp, cp and
 * pp coordinates. A kept slot's new rank is the new layout's rank at its coordinates; a
 * leaving replica's live slots hold no rank afterwards. Returns the replicas that leave (0:
 * none), or -1 when fewer than min_replicas would remain (p->changed says how many would
 * leave) or the layout cannot be made (CO_EINVAL's detail). */
int sve_plan_shrink(const svp_view *v, const topo_layout *old, const bool *gone, int min_replicas, sve_plan *p);

/* With the distributed optimizer (holders: 1, or 2 with --dist-opt-redundancy: data-parallel
 * rank k's shard lives on k and k + 1): the first data-parallel rank whose optimizer shard
 * leaves with every holder when the replicas with a rank in gone[] leave, or -1 (then every
 * shard is re-partitioned from a holder that stays, elastic.h's caller's workers do it in
 * memory: train/trainer_dopt.c). */
int sve_optimizer_lost(const svp_view *v, const topo_layout *old, const bool *gone, int holders);

/* The grow: the slots in join[] (alive, holding no rank, in slot order) form whole new
 * replicas, tp x cp x pp slots each (each joins at the ranks of a new data-parallel
 * coordinate, tp fastest as a node-major layout places them), up to max_replicas replicas in
 * all; the ranks already there keep their coordinates (their rank numbers follow the new
 * layout). Returns the replicas that join (0: not enough slots for one), -1 on a layout error. */
int sve_plan_grow(const svp_view *v, const topo_layout *old, const bool *join, int max_replicas, sve_plan *p);

#endif
