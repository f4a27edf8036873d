/* config_check.c - the configuration's checks in order (see config_check.h). */
#include "train/config_check.h"

#include "common/error.h"
#include "model/gpt_check.h"
#include "resilience/resilience_check.h"
#include "scheduler/parallel_check.h"

/* The problems found as the detail of CO_EINVAL. */
static int refused(const co_problems *P) { return co_err_set(CO_EINVAL, "%s", P->text); }

int trainer_config_check(co_config *c, int dp, co_problems *P) {
    co_problems_init(P);
    /* (a size out of range skips every check of a combination with it: its message would
     * be noise) */
    bool sizes_ok = topo_check_sizes(c, P);
    topo_check_parallel(c, sizes_ok, P);
    co_config_check_refused(c, P);
    gpt_check_moe(c, sizes_ok, P);
    gpt_check_mtp(c, sizes_ok, P);
    rr_check_spares(c, P);
    int n_refused = P->n;
    /* the sizes every later check divides by */
    gpt_check_required(c, P);
    co_config_check_micro_batch(c, P);
    if (sizes_ok) topo_check_world(c, dp, P);
    if (P->n > n_refused || !sizes_ok) return refused(P);
    gpt_check_shapes(c, P);
    co_config_check_run(c, dp, P);
    rr_check_limits(c, P);
    if (P->n) return refused(P);
    int rc = pp_check_config(c, dp);
    if (rc) co_problem(P, "%s", co_err_detail());
    return rc;
}
