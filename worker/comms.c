/* comms.c - a rank's communicators for one generation (see comms.h). */
#include "worker/comms.h"

#include "common/error.h"
#ifdef COHORT_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wk_comms {
    topo_layout layout;
    int rank;
    cm_comm *world;
    cm_comm *group[TOPO_NGROUP_KINDS];
    int *members[TOPO_NGROUP_KINDS]; /* group rank -> world rank */
    int gindex[TOPO_NGROUP_KINDS];   /* the index of this rank's group of each kind (-1: none) */
    cm_comm *pp_bwd;                 /* the pipeline group again: the gradients' channel */
    cm_comm *grad;                   /* the gradient group on its own transport (wk_comms_open_grad) */
    topo_group_kind grad_kind;       /* which group it is */
    cm_comm *egrad;                  /* the expert-data-parallel group on its own (wk_comms_open_expert_grad) */
    cm_comm *nworld;                 /* NCCL (wk_comms_new_nccl), NULL without */
    cm_comm *ngroup[TOPO_NGROUP_KINDS];
    cm_comm *npp_bwd;                /* NCCL's pipeline group again: the gradients' channel */
    cm_comm *ngrad;                  /* NCCL's gradient group again (wk_comms_open_grad_nccl) */
    cm_comm *negrad;                 /* NCCL's expert-data-parallel group again (the same) */
};

/* The NCCL world from the generation's unique id, then every group split from it: every
 * rank calls ncclCommSplit for every kind (NCCL's rule), color = its group's index, key =
 * its place in it; a rank in no group of a kind (embedding) passes no color. */
static int open_nccl(wk_comms *cs, const sv_assignment *asg, int device) {
#ifdef COHORT_HAVE_NCCL
    if (!asg->have_nccl_id) return co_err_set(CO_EPROTOCOL, "the assignment carries no NCCL unique id");
    cm_nccl_options no;
    cm_nccl_options_default(&no);
    int rc = cm_nccl_new(&cs->nworld, asg->rank, asg->world, asg->nccl_id, device, &no);
    for (int k = 0; k < TOPO_NGROUP_KINDS && !rc; k++) {
        int key = -1;
        for (int i = 0; cs->members[k] && i < cs->group[k]->size; i++)
            if (cs->members[k][i] == asg->rank) key = i;
        rc = cm_nccl_split_color(cs->nworld, cs->gindex[k], key < 0 ? 0 : key, &cs->ngroup[k], no.init_timeout_ms);
        if (rc) {
            char keep[400];
            snprintf(keep, sizeof keep, "%s", co_err_detail());
            co_err_set(rc, "splitting the NCCL %s group: %s", topo_group_name((topo_group_kind)k), keep);
        }
    }
    /* the pipeline's gradients get a communicator of their own, as over ZeroMQ: sends between
     * two ranks match receives in posting order per communicator, and with interleaving both
     * directions carry activations and gradients (every rank calls the split: pp is global) */
    if (!rc && cs->group[TOPO_G_PP] && cs->group[TOPO_G_PP]->size > 1) {
        rc = cm_nccl_split_color(cs->nworld, cs->gindex[TOPO_G_PP], cs->group[TOPO_G_PP]->rank, &cs->npp_bwd,
                                 no.init_timeout_ms);
        if (rc) {
            char keep[400];
            snprintf(keep, sizeof keep, "%s", co_err_detail());
            co_err_set(rc, "splitting the NCCL pipeline's gradient channel: %s", keep);
        }
    }
    return rc;
#else
    (void)cs;
    (void)asg;
    (void)device;
    return co_err_set(CO_EUNSUPPORTED, "NCCL groups: this build has no NCCL");
#endif
}

int wk_comms_new(wk_comms **out, const sv_assignment *asg, const cm_zmq_options *zo) {
    return wk_comms_new_nccl(out, asg, zo, -1);
}

int wk_comms_new_nccl(wk_comms **out, const sv_assignment *asg, const cm_zmq_options *zo, int nccl_device) {
    *out = NULL;
    wk_comms *cs = calloc(1, sizeof *cs);
    if (!cs) return co_err_set(CO_ENOMEM, "communicators: out of memory");
    cs->rank = asg->rank;
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++) cs->gindex[k] = -1;
    char err[300];
    int rc = topo_layout_init(&cs->layout, asg->world, asg->tp, asg->pp, asg->cp, asg->ep > 0 ? asg->ep : 1, asg->etp,
                              asg->tp_pp_dp, err, sizeof err);
    if (rc) {
        free(cs);
        return co_err_set(CO_EPROTOCOL, "the assignment's layout: %s", err);
    }
    cs->layout.emb_stages = asg->emb_stages;
    rc = cm_zmq_new(&cs->world, asg->rank, asg->world, (const char *const *)asg->endpoints, zo);
    /* every member splits its groups in the order of the kinds, so two kinds with the same
     * ranks (tp and tp-cp when cp is 1) get distinct groups all the same */
    for (int k = 0; k < TOPO_NGROUP_KINDS && !rc; k++) {
        int *m = malloc(sizeof *m * (size_t)asg->world), n = 0;
        if (!m) {
            rc = co_err_set(CO_ENOMEM, "communicators: out of memory");
            break;
        }
        cs->gindex[k] = topo_group_of(&cs->layout, (topo_group_kind)k, asg->rank, m, &n);
        if (cs->gindex[k] < 0) {
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
    /* the pipeline's second channel (wk_comms_pipeline): the same ranks, another group, so
     * that activations and their gradients each arrive in the order they were sent */
    if (!rc && cs->group[TOPO_G_PP] && cs->group[TOPO_G_PP]->size > 1) {
        rc = cs->world->ops->split(cs->world, cs->members[TOPO_G_PP], cs->group[TOPO_G_PP]->size, &cs->pp_bwd);
        if (rc) {
            char keep[400];
            snprintf(keep, sizeof keep, "%s", co_err_detail());
            co_err_set(rc, "splitting the pipeline's gradient channel: %s", keep);
        }
    }
    if (!rc && nccl_device >= 0) rc = open_nccl(cs, asg, nccl_device);
    if (rc) {
        wk_comms_destroy(&cs);
        return rc;
    }
    *out = cs;
    return 0;
}

/* The endpoint of a transport of its own beside a rank's data endpoint ep: "<path>.<suffix>"
 * for ipc, the port shifted by port_shift for tcp. */
static int own_endpoint(const char *ep, const char *suffix, int port_shift, char *out, size_t cap) {
    int n = -1;
    if (!strncmp(ep, "ipc://", 6)) {
        n = snprintf(out, cap, "%s.%s", ep, suffix);
        /* (the unix socket's path limit, less what the shared memory's socket adds) */
        if (n > 0 && (size_t)n - 6 + 5 > 107)
            return co_err_set(CO_ERANGE, "the %s transport's endpoint %s: path too long (limit 102)", suffix, out);
    } else if (!strncmp(ep, "tcp://", 6)) {
        const char *colon = strrchr(ep, ':');
        long port = colon ? strtol(colon + 1, NULL, 10) : 0;
        if (port <= 0 || port + port_shift > 65535)
            return co_err_set(CO_ERANGE, "the %s transport beside %s: no port %ld + %d (lower --master-port)", suffix,
                              ep, port, port_shift);
        n = snprintf(out, cap, "%.*s:%ld", (int)(colon - ep), ep, port + port_shift);
    }
    if (n < 0 || (size_t)n >= cap) return co_err_set(CO_EINVAL, "the %s transport beside %s: unknown endpoint", suffix, ep);
    return 0;
}

/* Group k again over a transport of its own (*out), its members' endpoints from own_endpoint. */
static int open_own(wk_comms *cs, const sv_assignment *asg, const cm_zmq_options *zo, topo_group_kind k,
                    const char *suffix, int port_shift, cm_comm **out) {
    int n = cs->group[k]->size, me = -1, rc = 0;
    char **eps = calloc((size_t)n, sizeof *eps);
    if (!eps) return co_err_set(CO_ENOMEM, "communicators: out of memory");
    for (int i = 0; i < n && !rc; i++) {
        int w = cs->members[k][i];
        if (w == asg->rank) me = i;
        if (!(eps[i] = malloc(512))) rc = co_err_set(CO_ENOMEM, "communicators: out of memory");
        else rc = own_endpoint(asg->endpoints[w], suffix, port_shift, eps[i], 512);
    }
    if (!rc) rc = cm_zmq_new(out, me, n, (const char *const *)eps, zo);
    if (rc) {
        char keep[400];
        snprintf(keep, sizeof keep, "%s", co_err_detail());
        co_err_set(rc, "the %s group's own transport (--overlap-grad-reduce): %s", topo_group_name(k), keep);
    }
    for (int i = 0; i < n; i++) free(eps[i]);
    free(eps);
    return rc;
}

int wk_comms_open_grad(wk_comms *cs, const sv_assignment *asg, const cm_zmq_options *zo, topo_group_kind k,
                       int port_shift) {
    if (!cs || !cs->group[k] || cs->group[k]->size < 2 || cs->grad) return 0;
    int rc = open_own(cs, asg, zo, k, "grad", port_shift, &cs->grad);
    if (!rc) cs->grad_kind = k;
    return rc;
}

int wk_comms_open_grad_nccl(wk_comms *cs, topo_group_kind k) {
#ifdef COHORT_HAVE_NCCL
    if (!cs || !cs->nworld) return 0;
    bool experts = k == TOPO_G_EDP;
    cm_comm **out = experts ? &cs->negrad : &cs->ngrad;
    if (*out) return 0;
    int key = -1;
    for (int i = 0; cs->members[k] && i < cs->group[k]->size; i++)
        if (cs->members[k][i] == cs->rank) key = i;
    cm_nccl_options no;
    cm_nccl_options_default(&no);
    /* (every rank calls the split: NCCL's rule) */
    int rc = cm_nccl_split_color(cs->nworld, cs->gindex[k], key < 0 ? 0 : key, out, no.init_timeout_ms);
    if (rc) {
        char keep[400];
        snprintf(keep, sizeof keep, "%s", co_err_detail());
        return co_err_set(rc, "the NCCL %s group's own communicator (--overlap-grad-reduce): %s", topo_group_name(k),
                          keep);
    }
    if (!experts) cs->grad_kind = k;
    return 0;
#else
    (void)cs;
    (void)k;
    return 0;
#endif
}

int wk_comms_open_expert_grad(wk_comms *cs, const sv_assignment *asg, const cm_zmq_options *zo, int port_shift) {
    topo_group_kind k = TOPO_G_EDP;
    if (!cs || !cs->group[k] || cs->group[k]->size < 2 || cs->egrad) return 0;
    return open_own(cs, asg, zo, k, "egrad", 2 * port_shift, &cs->egrad);
}

void wk_comms_abort(void *ctx) {
    wk_comms *cs = ctx;
    if (!cs) return;
    if (cs->grad) cs->grad->ops->abort(cs->grad);
    if (cs->egrad) cs->egrad->ops->abort(cs->egrad);
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++)
        if (cs->ngroup[k]) cs->ngroup[k]->ops->abort(cs->ngroup[k]);
    if (cs->npp_bwd) cs->npp_bwd->ops->abort(cs->npp_bwd);
    if (cs->ngrad) cs->ngrad->ops->abort(cs->ngrad);
    if (cs->negrad) cs->negrad->ops->abort(cs->negrad);
    if (cs->nworld) cs->nworld->ops->abort(cs->nworld);
    if (cs->world) cs->world->ops->abort(cs->world);
}

void wk_comms_destroy(wk_comms **pcs) {
    wk_comms *cs = *pcs;
    if (!cs) return;
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
        cm_destroy(&cs->ngroup[k]);
        cm_destroy(&cs->group[k]);
        free(cs->members[k]);
    }
    cm_destroy(&cs->pp_bwd);
    cm_destroy(&cs->grad);
    cm_destroy(&cs->egrad);
    cm_destroy(&cs->npp_bwd);
    cm_destroy(&cs->ngrad);
    cm_destroy(&cs->negrad);
    cm_destroy(&cs->nworld);
    cm_destroy(&cs->world);
    free(cs);
    *pcs = NULL;
}

cm_comm *wk_comms_world(const wk_comms *cs) { return cs ? cs->world : NULL; }

cm_comm *wk_comms_group(const wk_comms *cs, topo_group_kind k) {
    if (!cs || k < 0 || k >= TOPO_NGROUP_KINDS) return NULL;
    return cs->nworld ? cs->ngroup[k] : cs->group[k];
}

int wk_comms_member(const wk_comms *cs, topo_group_kind k, int i) {
    if (!cs || k < 0 || k >= TOPO_NGROUP_KINDS || !cs->group[k] || i < 0 || i >= cs->group[k]->size) return -1;
    return cs->members[k][i];
}

cm_comm *wk_comms_pipeline(const wk_comms *cs, int dir) {
    if (!cs || !cs->group[TOPO_G_PP] || cs->group[TOPO_G_PP]->size < 2) return NULL;
    return dir ? cs->pp_bwd : cs->group[TOPO_G_PP];
}

int wk_comms_rank_in(const wk_comms *cs, topo_group_kind k, int w) {
    cm_comm *g = wk_comms_group(cs, k);
    for (int i = 0; g && i < g->size; i++)
        if (cs->members[k][i] == w) return i;
    return -1;
}

cm_comm *wk_comms_pipeline_device(const wk_comms *cs, int dir) {
    if (!cs || !cs->nworld || !cs->npp_bwd) return NULL;
    return dir ? cs->npp_bwd : cs->ngroup[TOPO_G_PP];
}

const topo_layout *wk_comms_layout(const wk_comms *cs) { return &cs->layout; }

void wk_comms_trainer_groups(const wk_comms *cs, const co_config *c, tr_groups *g) {
    memset(g, 0, sizeof *g);
    if (!cs) return;
    g->dp = wk_comms_group(cs, TOPO_G_DP);
    if (c->tensor_model_parallel_size > 1) g->tp = wk_comms_group(cs, TOPO_G_TP);
    if (c->pipeline_model_parallel_size > 1) {
        g->pp = wk_comms_pipeline(cs, 0);
        g->pp_bwd = wk_comms_pipeline(cs, 1);
        g->pp_dev = wk_comms_pipeline_device(cs, 0);
        g->pp_dev_bwd = wk_comms_pipeline_device(cs, 1);
        g->emb = wk_comms_group(cs, TOPO_G_EMBEDDING);
        g->mp = wk_comms_group(cs, TOPO_G_MP);
    }
    if (c->context_parallel_size > 1) {
        g->cp = wk_comms_group(cs, TOPO_G_CP);
        g->dpcp = wk_comms_group(cs, TOPO_G_DP_CP);
        g->tpcp = wk_comms_group(cs, TOPO_G_TP_CP);
    }
    if (!c->standin_model_parallel && cs->layout.ep > 1) {
        /* the layers' exchange group: the expert-tensor x expert group (the expert group at
         * expert tensor size 1) */
        g->ep = wk_comms_group(cs, TOPO_G_ETP_EP);
        g->edp = wk_comms_group(cs, TOPO_G_EDP);
        g->erep = wk_comms_group(cs, TOPO_G_ETP_EP_PP);
        /* (its own transport, where wk_comms_open_expert_grad or with NCCL wk_comms_open_grad_nccl
         * opened it) */
        g->edp_ovl = cs->nworld ? cs->negrad : cs->egrad;
    }
    /* the gradient group's own transport, where it is the group gradients are reduced over */
    cm_comm *own = cs->nworld ? cs->ngrad : cs->grad; /* (on NCCL the NCCL group's own) */
    if (own && cs->grad_kind == (g->cp ? TOPO_G_DP_CP : TOPO_G_DP)) g->grad_ovl = own;
}

int wk_comms_check_equal(wk_comms *cs, uint64_t value, int timeout_ms) {
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
        cm_comm *g = cs->group[k];
        if (!g || g->size < 2) continue;
        uint64_t *all = malloc(sizeof *all * (size_t)g->size);
        if (!all) return co_err_set(CO_ENOMEM, "communicators: out of memory");
        int rc = g->ops->allgather(g, &value, all, sizeof value, timeout_ms);
        for (int i = 1; !rc && i < g->size; i++)
            if (all[i] != all[0])
                rc = co_err_set(CO_EPROTOCOL, "the %s group: world ranks %d and %d hold different values (%016llx, %016llx)",
                                topo_group_name((topo_group_kind)k), cs->members[k][0], cs->members[k][i],
                                (unsigned long long)all[0], (unsigned long long)all[i]);
        free(all);
        if (rc) return rc;
    }
    return 0;
}
