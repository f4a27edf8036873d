/* comms.c - a rank's communicators for one generation (see comms.h). */
#include "worker/comms.h"

#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wk_comms {
    topo_layout layout;
    int rank;
    cm_comm *world;
    cm_comm *group[TOPO_NGROUP_KINDS];
    int *members[TOPO_NGROUP_KINDS]; /* group rank -> world rank */
};

int wk_comms_new(wk_comms **out, const sv_assignment *asg, const cm_zmq_options *zo) {
    *out = NULL;
    wk_comms *cs = calloc(1, sizeof *cs);
    if (!cs) return co_err_set(CO_ENOMEM, "communicators: out of memory");
    cs->rank = asg->rank;
    char err[300];
    int rc = topo_layout_init(&cs->layout, asg->world, asg->tp, asg->pp, asg->cp, asg->ep > 0 ? asg->ep : 1, asg->etp,
                              asg->tp_pp_dp, err, sizeof err);
    if (rc) {
        free(cs);
        return co_err_set(CO_EPROTOCOL, "the assignment's layout: %s", err);
    }
    rc = cm_zmq_new(&cs->world, asg->rank, asg->world, (const char *const *)asg->endpoints, zo);
    /* every member splits its groups in the order of the kinds, so two kinds with the same
     * ranks (tp and tp-cp when cp is 1) get distinct groups all the same */
    for (int k = 0; k < TOPO_NGROUP_KINDS && !rc; k++) {
        int *m = malloc(sizeof *m * (size_t)asg->world), n = 0;
        if (!m) {
            rc = co_err_set(CO_ENOMEM, "communicators: out of memory");
            break;
        }
        if (topo_group_of(&cs->layout, (topo_group_kind)k, asg->rank, m, &n) < 0) {
            free(m);
            continue;
        }
        cs->members[k] = m;
        rc = cs->world->ops->split(cs->world, m, n, &cs->group[k]);
        if (rc) {
            char keep[400];
            snprintf(keep, sizeof keep, "%s", co_err_detail());
            co_err_set(rc, "splitting the %s group (%d ranks): %s", topo_group_name((topo_group_kind)k), n, keep);
        }
    }
    if (rc) {
        wk_comms_destroy(&cs);
        return rc;
    }
    *out = cs;
    return 0;
}

void wk_comms_destroy(wk_comms **pcs) {
    wk_comms *cs = *pcs;
    if (!cs) return;
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
        cm_destroy(&cs->group[k]);
        free(cs->members[k]);
    }
    cm_destroy(&cs->world);
    free(cs);
    *pcs = NULL;
}

cm_comm *wk_comms_world(const wk_comms *cs) { return cs ? cs->world : NULL; }

cm_comm *wk_comms_group(const wk_comms *cs, topo_group_kind k) {
    return cs && k >= 0 && k < TOPO_NGROUP_KINDS ? cs->group[k] : NULL;
}

int wk_comms_rank_in(const wk_comms *cs, topo_group_kind k, int w) {
    cm_comm *g = wk_comms_group(cs, k);
    for (int i = 0; g && i < g->size; i++)
        if (cs->members[k][i] == w) return i;
    return -1;
}

const topo_layout *wk_comms_layout(const wk_comms *cs) { return &cs->layout; }

int wk_comms_check_equal(wk_comms *cs, uint64_t value, int timeout_ms, char *err, size_t errlen) {
    if (errlen) err[0] = '\0';
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
        cm_comm *g = cs->group[k];
        if (!g || g->size < 2) continue;
        uint64_t *all = malloc(sizeof *all * (size_t)g->size);
        if (!all) return co_err_set(CO_ENOMEM, "communicators: out of memory");
        int rc = g->ops->allgather(g, &value, all, sizeof value, timeout_ms);
        for (int i = 1; !rc && i < g->size; i++)
            if (all[i] != all[0]) {
                snprintf(err, errlen, "the %s group: world ranks %d and %d hold different values (%016llx, %016llx)",
                         topo_group_name((topo_group_kind)k), cs->members[k][0], cs->members[k][i],
                         (unsigned long long)all[0], (unsigned long long)all[i]);
                rc = co_err_set(CO_EPROTOCOL, "%s", err);
            }
        free(all);
        if (rc) return rc;
    }
    return 0;
}
