/* topology.c - rank coordinates in the parallel grid. */
#include "scheduler/topology.h"

#include "common/error.h"

int topo_init(topo *t, int world, int tp, int pp, int cp, int rank) {
    if (world < 1 || tp < 1 || pp < 1 || cp < 1 || world % (tp * pp * cp) || rank < 0 || rank >= world)
        return co_err_set(CO_EINVAL, "topology: world %d is not a multiple of tp %d x pp %d x cp %d (rank %d)",
                          world, tp, pp, cp, rank);
    t->world = world;
    t->tp = tp;
    t->pp = pp;
    t->cp = cp;
    t->dp = world / (tp * pp * cp);
    t->rank = rank;
    t->tp_rank = rank % tp;
    t->cp_rank = (rank / tp) % cp;
    t->dp_rank = (rank / (tp * cp)) % t->dp;
    t->pp_rank = rank / (tp * cp * t->dp);
    return 0;
}

int topo_num_microbatches(const topo *t, int global_batch, int micro_batch) {
    return global_batch / (micro_batch * t->dp);
}

int topo_is_first_stage(const topo *t) { return t->pp_rank == 0; }
int topo_is_last_stage(const topo *t) { return t->pp_rank == t->pp - 1; }
