/* elastic.c - --elastic's shrink and grow plans, pure (elastic.h). */
#include "supervisor/elastic.h"

#include "common/error.h"

#include <stdlib.h>

/* The new layout: old's model-parallel sizes over dp replicas. */
static int layout_with_dp(const topo_layout *old, int dp, topo_layout *nl) {
    char err[200];
    int per = old->tp * old->cp * old->pp;
    if (topo_layout_init(nl, dp * per, old->tp, old->pp, old->cp, 1, old->etp, old->tp_pp_dp, err, sizeof err))
        return co_err_set(CO_EINVAL, "elastic: no layout of %d replicas: %s", dp, err);
    nl->emb_stages = old->emb_stages;
    return 0;
}

/* The rank at coordinates (tp, cp, dp, pp) of layout l (coords: each of its ranks'), or -1. */
static int rank_at(const topo_coord *coords, int world, int tp, int cp, int dp, int pp) {
    for (int r = 0; r < world; r++)
        if (coords[r].tp == tp && coords[r].cp == cp && coords[r].dp == dp && coords[r].pp == pp) return r;
    return -1;
}

/* Every rank's coordinates in layout l (malloc'd; NULL: no memory or a bad layout). */
static topo_coord *coords_of(const topo_layout *l) {
    topo_coord *c = malloc(sizeof *c * (size_t)l->world);
    for (int r = 0; c && r < l->world; r++)
        if (topo_coords(l, r, &c[r])) {
            free(c);
            return NULL;
        }
    return c;
}

int sve_plan_shrink(const svp_view *v, const topo_layout *old, const bool *gone, int min_replicas, sve_plan *p) {
    int dp = old->dp;
    bool *leaves = calloc((size_t)dp, sizeof *leaves);
    int *to = malloc(sizeof *to * (size_t)dp);
    if (!leaves || !to) {
        free(leaves);
        free(to);
        return co_err_set(CO_ENOMEM, "elastic: out of memory");
    }
    for (int i = 0; i < v->nslots; i++) {
        int r = v->slots[i].rank;
        if (gone[i] && r >= 0 && r < v->world) leaves[v->coord[r].dp] = true;
    }
    int kept = 0;
    for (int d = 0; d < dp; d++) to[d] = leaves[d] ? -1 : kept++;
    p->changed = dp - kept;
    int rc = p->changed == 0 ? 0 : kept < min_replicas || kept < 1 ? -1 : layout_with_dp(old, kept, &p->layout);
    topo_coord *nc = rc == 0 && p->changed ? coords_of(&p->layout) : NULL;
    if (rc == 0 && p->changed && !nc) rc = co_err_set(CO_ENOMEM, "elastic: out of memory");
    for (int i = 0; rc == 0 && p->changed && i < v->nslots; i++) {
        int r = v->slots[i].rank;
        const topo_coord *c = r >= 0 && r < v->world ? &v->coord[r] : NULL;
        p->new_rank[i] = !c || to[c->dp] < 0 ? -1 : rank_at(nc, p->layout.world, c->tp, c->cp, to[c->dp], c->pp);
    }
    free(nc);
    free(leaves);
    free(to);
    return rc == 0 ? p->changed : -1;
}

int sve_optimizer_lost(const svp_view *v, const topo_layout *old, const bool *gone, int holders) {
    int dp = old->dp, lost = -1;
    bool *leaves = calloc((size_t)dp, sizeof *leaves);
    if (!leaves) return 0; /* (no memory: say shard 0, the caller stops) */
    for (int i = 0; i < v->nslots; i++) {
        int r = v->slots[i].rank;
        if (gone[i] && r >= 0 && r < v->world) leaves[v->coord[r].dp] = true;
    }
    for (int k = 0; k < dp && lost < 0 && holders > 0; k++)
        if (leaves[k] && (holders < 2 || dp < 2 || leaves[(k + 1) % dp])) lost = k;
    free(leaves);
    return lost;
}

int sve_plan_grow(const svp_view *v, const topo_layout *old, const bool *join, int max_replicas, sve_plan *p) {
    int per = old->tp * old->cp * old->pp, njoin = 0;
    for (int i = 0; i < v->nslots; i++) njoin += join[i] && v->slots[i].rank < 0 && svp_alive(v->slots[i].state);
    int add = njoin / per;
    if (old->dp + add > max_replicas) add = max_replicas - old->dp;
    p->changed = add > 0 ? add : 0;
    if (!p->changed) return 0;
    if (layout_with_dp(old, old->dp + add, &p->layout)) return -1;
    topo_coord *nc = coords_of(&p->layout);
    if (!nc) return co_err_set(CO_ENOMEM, "elastic: out of memory");
    /* the new replicas' ranks, in the new layout's rank order */
    int next = 0, nnew = add * per;
    int *fresh = malloc(sizeof *fresh * (size_t)(nnew > 0 ? nnew : 1));
    for (int r = 0; fresh && r < p->layout.world; r++)
        if (nc[r].dp >= old->dp) fresh[next++] = r;
    next = 0;
    for (int i = 0; fresh && i < v->nslots; i++) {
        int r = v->slots[i].rank;
        if (r >= 0 && r < v->world) {
            const topo_coord *c = &v->coord[r];
            p->new_rank[i] = rank_at(nc, p->layout.world, c->tp, c->cp, c->dp, c->pp);
        } else if (join[i] && svp_alive(v->slots[i].state) && next < nnew) {
            p->new_rank[i] = fresh[next++];
        } else {
            p->new_rank[i] = -1;
        }
    }
    int rc = fresh ? p->changed : co_err_set(CO_ENOMEM, "elastic: out of memory");
    free(fresh);
    free(nc);
    return rc;
}
