/* groups.c - Megatron's parallel groups (see groups.h). */
#include "scheduler/groups.h"

#include "common/error.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

void topo_masked_groups(const int *sizes, const bool *mask, int ndim, int *out, int *ngroups, int *size) {
    int stride[8], world = 1, gsize = 1;
    for (int d = 0; d < ndim; d++) {
        stride[d] = world;
        world *= sizes[d];
        if (mask[d]) gsize *= sizes[d];
    }
    int ng = world / gsize;
    for (int g = 0; g < ng; g++) {
        /* the group's coordinates along the unmasked dimensions, the first fastest */
        int base = 0, rest = g;
        for (int d = 0; d < ndim; d++)
            if (!mask[d]) {
                base += (rest % sizes[d]) * stride[d];
                rest /= sizes[d];
            }
        for (int i = 0; i < gsize; i++) {
            int r = base, left = i;
            for (int d = 0; d < ndim; d++)
                if (mask[d]) {
                    r += (left % sizes[d]) * stride[d];
                    left /= sizes[d];
                }
            out[g * gsize + i] = r;
        }
    }
    *ngroups = ng;
    *size = gsize;
}

int topo_layout_init(topo_layout *l, int world, int tp, int pp, int cp, int ep, int etp, bool tp_pp_dp, char *err,
                     size_t n) {
    memset(l, 0, sizeof *l);
    if (etp < 1) etp = tp;
    if (world < 1 || tp < 1 || pp < 1 || cp < 1 || ep < 1 || world % (tp * cp * pp)) {
        snprintf(err, n, "world size %d is not a multiple of tensor %d x context %d x pipeline %d parallel sizes",
                 world, tp, cp, pp);
        return CO_EINVAL;
    }
    if (world % (etp * ep * pp)) {
        snprintf(err, n, "world size %d is not a multiple of expert tensor %d x expert %d x pipeline %d parallel sizes",
                 world, etp, ep, pp);
        return CO_EINVAL;
    }
    if (tp_pp_dp && pp > 1 && tp * cp != etp * ep) {
        /* Megatron asserts that both layouts have the same pipeline groups */
        snprintf(err, n, "with --use-tp-pp-dp-mapping the expert layout's pipeline groups differ from the dense "
                 "layout's unless tensor %d x context %d = expert tensor %d x expert %d parallel sizes", tp, cp, etp, ep);
        return CO_EINVAL;
    }
    *l = (topo_layout){.world = world, .tp = tp, .cp = cp, .pp = pp, .dp = world / (tp * cp * pp), .ep = ep,
                       .etp = etp, .edp = world / (etp * ep * pp), .tp_pp_dp = tp_pp_dp};
    return 0;
}

const char *topo_group_name(topo_group_kind k) {
    static const char *const names[TOPO_NGROUP_KINDS] = {
        "tp", "cp", "dp", "dp-cp", "pp", "tp-pp", "tp-cp", "tp-dp-cp", "tp-dp", "embedding", "position-embedding",
        "ep", "expert-tp", "expert-tp-ep", "expert-tp-ep-pp", "expert-dp"};
    return k >= 0 && k < TOPO_NGROUP_KINDS ? names[k] : "?";
}

/* dimensions of the order string: tp cp ep dp pp (or tp cp ep pp dp) */
enum { D_TP, D_CP, D_EP, D_DP, D_PP };

static void grid(const topo_layout *l, bool expert, int sizes[5], int dims[5]) {
    int order[5] = {D_TP, D_CP, D_EP, D_DP, D_PP};
    if (l->tp_pp_dp) order[3] = D_PP, order[4] = D_DP;
    for (int i = 0; i < 5; i++) {
        int d = order[i];
        dims[i] = d;
        sizes[i] = d == D_TP ? (expert ? l->etp : l->tp)
                   : d == D_CP ? (expert ? 1 : l->cp)
                   : d == D_EP ? (expert ? l->ep : 1)
                   : d == D_DP ? (expert ? l->edp : l->dp)
                               : l->pp;
    }
}

void topo_groups(const topo_layout *l, topo_group_kind k, int *ranks, int *ngroups, int *size) {
    if (k == TOPO_G_EMBEDDING || k == TOPO_G_POS_EMBEDDING) {
        /* from each pipeline group: its first and last stage (the first alone for positions,
         * or with one stage) */
        int ng, sz;
        topo_groups(l, TOPO_G_PP, ranks, &ng, &sz);
        int per = k == TOPO_G_EMBEDDING && sz > 1 ? 2 : 1;
        unsigned long long mask = k == TOPO_G_EMBEDDING && sz > 1 && sz <= 64 ? l->emb_stages : 0;
        if (mask) {
            /* the stages named (in pipeline order) */
            per = 0;
            for (int s = 0; s < sz; s++) per += (int)(mask >> s & 1);
            for (int g = 0; g < ng; g++)
                for (int s = 0, i = 0; s < sz; s++)
                    if (mask >> s & 1) ranks[g * per + i++] = ranks[g * sz + s];
            *ngroups = ng;
            *size = per;
            return;
        }
        for (int g = 0; g < ng; g++) {
            int first = ranks[g * sz], last = ranks[g * sz + sz - 1];
            ranks[g * per] = first;
            if (per == 2) ranks[g * per + 1] = last;
        }
        *ngroups = ng;
        *size = per;
        return;
    }
    bool expert = k >= TOPO_G_EP;
    int want[5] = {0}; /* by dimension */
    switch (k) {
    case TOPO_G_TP: want[D_TP] = 1; break;
    case TOPO_G_CP: want[D_CP] = 1; break;
    case TOPO_G_DP: want[D_DP] = 1; break;
    case TOPO_G_DP_CP: want[D_DP] = want[D_CP] = 1; break;
    case TOPO_G_PP: want[D_PP] = 1; break;
    case TOPO_G_MP: want[D_TP] = want[D_PP] = 1; break;
    case TOPO_G_TP_CP: want[D_TP] = want[D_CP] = 1; break;
    case TOPO_G_TP_DP_CP: want[D_TP] = want[D_DP] = want[D_CP] = 1; break;
    case TOPO_G_TP_DP: want[D_TP] = want[D_DP] = 1; break;
    case TOPO_G_EP: want[D_EP] = 1; break;
    case TOPO_G_ETP: want[D_TP] = 1; break;
    case TOPO_G_ETP_EP: want[D_TP] = want[D_EP] = 1; break;
    case TOPO_G_ETP_EP_PP: want[D_TP] = want[D_EP] = want[D_PP] = 1; break;
    case TOPO_G_EDP: want[D_DP] = 1; break;
    default: break;
    }
    int sizes[5], dims[5];
    bool mask[5];
    grid(l, expert, sizes, dims);
    for (int i = 0; i < 5; i++) mask[i] = want[dims[i]];
    topo_masked_groups(sizes, mask, 5, ranks, ngroups, size);
}

int topo_group_of(const topo_layout *l, topo_group_kind k, int rank, int *members, int *size) {
    int ng, sz;
    topo_groups(l, k, members, &ng, &sz);
    for (int g = 0; g < ng; g++)
        for (int i = 0; i < sz; i++)
            if (members[g * sz + i] == rank) {
                memmove(members, members + g * sz, sizeof *members * (size_t)sz);
                *size = sz;
                return g;
            }
    *size = 0;
    return -1;
}

int topo_coords(const topo_layout *l, int rank, topo_coord *c) {
    int *m = malloc(sizeof *m * (size_t)(l->world > 0 ? l->world : 1));
    if (!m) return -1;
    const topo_group_kind kinds[5] = {TOPO_G_TP, TOPO_G_CP, TOPO_G_DP, TOPO_G_PP, TOPO_G_EP};
    int *out[5] = {&c->tp, &c->cp, &c->dp, &c->pp, &c->ep};
    int rc = 0;
    for (int d = 0; d < 5 && !rc; d++) {
        int sz = 0;
        *out[d] = -1;
        if (topo_group_of(l, kinds[d], rank, m, &sz) < 0) rc = -1;
        for (int i = 0; i < sz; i++)
            if (m[i] == rank) *out[d] = i; /* a rank's coordinate: its place in that group */
    }
    free(m);
    return rc;
}

bool topo_same_shard(const topo_coord *a, const topo_coord *b) {
    return a->tp == b->tp && a->cp == b->cp && a->pp == b->pp && a->ep == b->ep;
}
