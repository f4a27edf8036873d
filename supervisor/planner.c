/* planner.c - the supervisor's restart decisions as pure functions over its view of the
 * worker slots (planner.h): spares for dead ranks, each shard's source, the checkpoint
 * fallback, shift-ranks. */
#include "supervisor/planner.h"

#include <stddef.h>

/* The slot holding rank r, or NULL. */
static const svp_slot *slot_of(const svp_view *v, int r) {
    for (int i = 0; i < v->nslots && r >= 0; i++)
        if (v->slots[i].rank == r) return &v->slots[i];
    return NULL;
}

/* Whether slot k is an alive spare that no slot before `upto` took already. */
static bool free_spare(const svp_view *v, const int *take, int k, int upto) {
    const svp_slot *c = &v->slots[k];
    if (c->rank >= 0 || !svp_alive(c->state)) return false;
    for (int j = 0; j < upto; j++)
        if (take[j] == k) return false;
    return true;
}

/* Whether live rank slot w's model shard has a live replica (not a replacement) on another node. */
static bool replica_elsewhere(const svp_view *v, const svp_slot *w) {
    for (int k = 0; k < v->nslots; k++) {
        const svp_slot *c = &v->slots[k];
        if (c->node != w->node && c->rank >= 0 && c->rank < v->world && !c->replacing && svp_alive(c->state) &&
            topo_same_shard(&v->coord[c->rank], &v->coord[w->rank]))
            return true;
    }
    return false;
}

/* Whether the node whose slots are first..first+count-1 goes out whole: it lost a rank (dead,
 * not being replaced already), and each rank it still holds alive is a replica of a shard
 * that lives on on another node (its process is given up: its rank goes to the spare node). */
static bool node_out(const svp_view *v, int first, int count) {
    int dead = 0;
    for (int i = first; i < first + count; i++) {
        const svp_slot *w = &v->slots[i];
        if (w->rank < 0) continue;
        if (w->replacing) return false;
        if (svp_dead(w->state)) dead++;
        else if (w->rank >= v->world || !replica_elsewhere(v, w)) return false;
        else if (w->evict) dead++; /* a straggler evicted: its node goes as if it had lost it */
    }
    return dead > 0;
}

/* Node granularity (svp_take_spares): a node's slots are consecutive; each node that goes out
 * takes the last whole spare node not taken yet, slot for slot. */
static int take_spare_nodes(const svp_view *v, int *take) {
    int taken = 0;
    for (int i = 0; i < v->nslots;) {
        int n = 0;
        while (i + n < v->nslots && v->slots[i + n].node == v->slots[i].node) n++;
        if (node_out(v, i, n)) {
            int sp = -1;
            for (int k = 0; k + n <= v->nslots;) {
                int m = 0;
                bool whole = true;
                while (k + m < v->nslots && v->slots[k + m].node == v->slots[k].node) {
                    whole = whole && free_spare(v, take, k + m, v->nslots);
                    m++;
                }
                if (whole && m == n) sp = k;
                k += m;
            }
            for (int j = 0; j < n && sp >= 0; j++)
                if (v->slots[i + j].rank >= 0) {
                    take[i + j] = sp + j;
                    taken++;
                }
        }
        i += n;
    }
    return taken;
}

int svp_take_spares(const svp_view *v, int *take) {
    int taken = 0;
    for (int i = 0; i < v->nslots; i++) take[i] = -1;
    if (v->node_granularity) return take_spare_nodes(v, take);
    for (int i = 0; i < v->nslots; i++) {
        const svp_slot *w = &v->slots[i];
        if (w->rank < 0 || w->replacing || !(svp_dead(w->state) || (w->evict && svp_alive(w->state)))) continue;
        int sp = -1;
        for (int k = 0; k < v->nslots; k++)
            if (free_spare(v, take, k, i)) sp = k;
        if (sp >= 0) {
            take[i] = sp;
            taken++;
        }
    }
    return taken;
}

/* Whether a and b hold the same model shard apart from the context rank (the distributed
 * optimizer shards over data x context), and a rank's place in that gradient group (the
 * context rank varies fastest, as in the group's order). */
/* The distributed optimizer's rings: the dense shards' over the gradient group (same tensor
 * and pipeline coordinates: it spans the expert ranks), in the order data x context, the
 * context rank fastest; with expert parallelism the experts' over the expert-data-parallel
 * group (the same expert rank too), in the same order. */
static bool same_grad_group(const topo_coord *a, const topo_coord *b) { return a->tp == b->tp && a->pp == b->pp; }
static bool same_expert_group(const topo_coord *a, const topo_coord *b) {
    return same_grad_group(a, b) && a->ep == b->ep;
}
static int grad_place(const topo_coord *c, int ncp) { return c->cp + ncp * c->dp; }

/* Rank r's place in its ring (the gradient group or, experts, the expert-data-parallel
 * group) and the ring's size. */
static int ring_place(const svp_view *v, int r, bool experts, int ncp, int *n) {
    int below = 0;
    *n = 0;
    for (int q = 0; q < v->world; q++) {
        if (!(experts ? same_expert_group : same_grad_group)(&v->coord[q], &v->coord[r])) continue;
        ++*n;
        below += grad_place(&v->coord[q], ncp) < grad_place(&v->coord[r], ncp);
    }
    return below;
}

/* Whether rank r's optimizer shard in its ring has a holder (it or the next dopt_holders - 1
 * ranks of the ring) that survived and committed iteration M. */
static bool ring_held(const svp_view *v, int64_t M, int r, bool experts, int ncp) {
    int n, at = ring_place(v, r, experts, ncp, &n);
    for (int h = 0; h < v->dopt_holders && h < n; h++) {
        int want = (at + h) % n;
        for (int q = 0; q < v->world; q++) {
            int nq;
            if (!(experts ? same_expert_group : same_grad_group)(&v->coord[q], &v->coord[r]) ||
                ring_place(v, q, experts, ncp, &nq) != want)
                continue;
            const svp_slot *w = slot_of(v, q);
            if (w && !w->replacing && w->ready_iter == M) return true;
        }
    }
    return false;
}
/* Whether slot w leaves the active world when slot e is evicted (e itself; with node
 * granularity every slot of its node). */
static bool leaves(const svp_view *v, const svp_slot *w, const svp_slot *e) {
    return v->node_granularity ? w->node == e->node : w == e;
}

/* Whether a slot that stays holds a live replica of rank r's model shard (as itself or as a
 * data-parallel peer) when slot e is evicted. */
static bool shard_stays(const svp_view *v, int r, const svp_slot *e) {
    for (int k = 0; k < v->nslots; k++) {
        const svp_slot *c = &v->slots[k];
        if (c->rank >= 0 && c->rank < v->world && !c->replacing && svp_alive(c->state) && !leaves(v, c, e) &&
            topo_same_shard(&v->coord[c->rank], &v->coord[r]))
            return true;
    }
    return false;
}

/* Whether rank r's optimizer shard (on itself and the next dopt_holders - 1 data-parallel
 * ranks of its group) keeps a live holder that stays when slot e is evicted. */
static bool optimizer_stays(const svp_view *v, int r, const svp_slot *e) {
    if (v->dopt_holders < 1) return true; /* every replica holds the whole state */
    int dp = 0;
    for (int q = 0; q < v->world; q++) dp += topo_same_shard(&v->coord[q], &v->coord[r]);
    for (int h = 0; h < v->dopt_holders && h < dp; h++) {
        int want = (v->coord[r].dp + h) % dp;
        for (int q = 0; q < v->world; q++) {
            if (!topo_same_shard(&v->coord[q], &v->coord[r]) || v->coord[q].dp != want) continue;
            const svp_slot *w = slot_of(v, q);
            if (w && !w->replacing && svp_alive(w->state) && !leaves(v, w, e)) return true;
        }
    }
    return false;
}

svp_evict_verdict svp_plan_evict(const svp_view *v, int rank, int *take) {
    for (int i = 0; i < v->nslots; i++) take[i] = -1;
    const svp_slot *e = rank >= 0 && rank < v->world ? slot_of(v, rank) : NULL;
    if (!e || !e->evict || e->replacing || !svp_alive(e->state)) return SVP_EVICT_BUSY;
    for (int r = 0; r < v->world; r++) {
        const svp_slot *w = slot_of(v, r);
        if (!w || !leaves(v, w, e)) continue;
        if (!shard_stays(v, r, e)) return SVP_EVICT_LAST_REPLICA;
    }
    for (int r = 0; r < v->world; r++)
        if (!optimizer_stays(v, r, e)) return SVP_EVICT_OPTIMIZER;
    svp_take_spares(v, take);
    return take[e - v->slots] >= 0 ? SVP_EVICT_OK : SVP_EVICT_NO_SPARE;
}

int svp_optimizer_shard_lost(const svp_view *v, int64_t M) {
    if (v->dopt_holders < 1) return -1;
    int ncp = 1;
    bool ep = false;
    for (int q = 0; q < v->world; q++) {
        if (v->coord[q].cp + 1 > ncp) ncp = v->coord[q].cp + 1;
        ep |= v->coord[q].ep > 0;
    }
    for (int r = 0; r < v->world; r++)
        if (!ring_held(v, M, r, false, ncp) || (ep && !ring_held(v, M, r, true, ncp))) return r;
    return -1;
}

int svp_node_shard_lost(const svp_view *v, int node) {
    for (int i = 0; i < v->nslots; i++) {
        const svp_slot *w = &v->slots[i];
        if (w->node != node || w->rank < 0 || w->rank >= v->world) continue;
        bool elsewhere = false;
        for (int k = 0; k < v->nslots && !elsewhere; k++) {
            const svp_slot *c = &v->slots[k];
            elsewhere = c->node != node && c->rank >= 0 && c->rank < v->world && !c->replacing && svp_alive(c->state) &&
                        topo_same_shard(&v->coord[c->rank], &v->coord[w->rank]);
        }
        if (!elsewhere) return w->rank;
    }
    return -1;
}

/* Whether every survivor reached the barrier and every replacement registered; counts the
 * replacements and finds the newest committed iteration and the first survivor that has it. */
static bool restart_ready(const svp_view *v, int *replaced, int64_t *M, int *src) {
    *replaced = 0;
    *M = -1;
    *src = -1;
    for (int i = 0; i < v->nslots; i++) {
        const svp_slot *w = &v->slots[i];
        if (w->rank < 0) continue; /* spares */
        if (w->replacing) {
            if (!svp_alive(w->state)) return false;
            (*replaced)++;
            continue;
        }
        if (!w->ready) return false;
        if (w->ready_iter > *M) {
            *M = w->ready_iter;
            *src = w->rank;
        }
    }
    return true;
}

/* Per shard, the survivor that committed the most becomes the source of its ranks; then the
 * first rank of a shard without one (*lost) or whose source is behind M (*behind). */
static void pick_sources(const svp_view *v, svp_plan *p, int64_t M, int *lost, int *behind) {
    *lost = *behind = -1;
    p->nsources = 0;
    for (int r = 0; r < v->world; r++) p->source[r] = -1;
    for (int r = 0; r < v->world; r++) {
        const svp_slot *w = slot_of(v, r);
        if (!w || w->replacing) continue;
        for (int q = 0; q < v->world; q++)
            if (topo_same_shard(&v->coord[q], &v->coord[r]) &&
                (p->source[q] < 0 || slot_of(v, p->source[q])->ready_iter < w->ready_iter))
                p->source[q] = r;
    }
    for (int r = 0; r < v->world; r++) {
        if (p->source[r] < 0) *lost = r;
        else if (slot_of(v, p->source[r])->ready_iter != M) *behind = r;
        else if (p->source[r] == r) p->nsources++;
    }
}

/* ShiftRanks: the survivors keep their order and close up, the replacements come last; every
 * rank's source is the one survivor src (one shard: refused with model parallelism). */
static void shift_ranks(const svp_view *v, svp_plan *p) {
    int next = 0, src_new = p->src;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < v->world; r++) {
            const svp_slot *w = slot_of(v, r);
            if (w && w->replacing == (pass == 1)) p->new_rank[w - v->slots] = next++;
        }
    for (int i = 0; i < v->nslots; i++)
        if (v->slots[i].rank == p->src && p->src >= 0) src_new = p->new_rank[i];
    p->src = src_new;
    for (int r = 0; r < v->world; r++) p->source[r] = p->src;
}

void svp_plan_restart(const svp_view *v, svp_plan *p) {
    int replaced, src;
    int64_t M;
    p->verdict = SVP_WAIT;
    if (!restart_ready(v, &replaced, &M, &src)) return;
    p->reason = SVP_OK;
    p->why_rank = -1;
    p->committed = M;
    p->nreplaced = replaced;
    int lost = -1, behind = -1;
    if (src >= 0) pick_sources(v, p, M, &lost, &behind);
    else {
        p->nsources = 0;
        for (int r = 0; r < v->world; r++) p->source[r] = -1;
    }
    int opt_lost = src >= 0 ? svp_optimizer_shard_lost(v, M) : -1;
    if (src < 0) p->reason = SVP_NO_SURVIVOR;
    else if (lost >= 0 || behind >= 0) {
        /* the shards must resume from one iteration: the checkpoint's */
        p->reason = lost >= 0 ? SVP_SHARD_LOST : SVP_SHARD_BEHIND;
        p->why_rank = lost >= 0 ? lost : behind;
    } else if (opt_lost >= 0) {
        p->reason = SVP_OPTIMIZER_LOST;
        p->why_rank = opt_lost;
    }
    /* injected faults up to the step in progress at the fault fired already: the survivors
     * committed M, so every rank was in step M + 1 (with no survivor: the newest reported) */
    p->faults_through = M >= 0 ? M + 1 : v->current_iter + 1;
    p->src = p->reason == SVP_OK ? src : -1;
    p->resume_iter = M;
    if (p->reason != SVP_OK) {
        if (v->checkpoint_iter < 0) {
            p->verdict = SVP_CANNOT_CONTINUE;
            return;
        }
        p->resume_iter = v->checkpoint_iter;
        for (int r = 0; r < v->world; r++) p->source[r] = -1;
    }
    for (int i = 0; i < v->nslots; i++) p->new_rank[i] = v->slots[i].rank;
    if (v->shift_ranks) shift_ranks(v, p);
    p->verdict = p->src >= 0 ? SVP_FROM_PEERS : SVP_FROM_CHECKPOINT;
}
