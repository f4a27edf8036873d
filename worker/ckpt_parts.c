/* ckpt_parts.c - the parts of a checkpoint a rank lists (see ckpt_parts.h).
 *
 * A model shard is a (tensor rank, pipeline rank) coordinate: every data-parallel replica
 * holds the same shards. Every rank lists the parts of every shard (each shard's tensor table
 * from gpt_tensor_table with that shard's tensor rank and pipeline chunks), so that all
 * compute one write plan (checkpoint/ckpt.h):
 *   - a tensor split over the tensor group: each tensor rank's pieces (query heads, key and
 *     value groups, gate and up halves, vocabulary rows; or its columns), a run several ranks
 *     hold (the key/value rows of a query group with fewer groups than ranks) once, by the
 *     first of them; group = that shard;
 *   - a tensor every tensor rank holds whole (norms, position embedding, row-parallel
 *     biases): once, by one tensor rank of its stage, chosen by the tensor's index so that
 *     the bytes spread;
 *   - the last stage's copy of the tied word embedding: not at all (the first stage's is
 *     the checkpoint's; loading fills both);
 *   - with expert parallelism (ep > 1) a shard is also an expert rank: each expert's tensors
 *     (global index in the name) by the expert rank that holds it (with the experts split over
 *     the tensor group, expert tensor size = tp: each tensor rank of it its own slice); the
 *     other tensors, held by every expert rank, once, by one chosen by the tensor's index. A load takes this rank's
 *     tensors by name, so a checkpoint resumes at any expert-parallel size.
 * Data is this rank's buffer where it holds the part (its own pieces, a run shared with it,
 * a whole tensor of its stage), NULL elsewhere. Rows are contiguous in the flat buffers and a
 * column slice is the rank's whole local tensor, so each part is one row-major buffer. The
 * moments are cut as their weights, under optimizer.exp_avg.<name> and exp_avg_sq.<name>.
 *
 * With the distributed optimizer the moments to save are instead, for every shard, every
 * rank of its gradient group's pieces (dopt_layout.pieces, the shard's layout rebuilt from
 * its table): flat ranges of the global tensors, written by that rank from its shard
 * storage, so no rank holds the full moments at a save (add_dopt). To load, the
 * parts stay the full moments' (trainer_dopt_moments_begin's buffers). */
#include "worker/ckpt_parts.h"

#include "common/error.h"
#include "optim/adamw.h"
#include "optim/dist_opt.h"
#include "scheduler/groups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prefix[] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};

/* Appends the part of tensor t (global shape; piece p of split along its rows or columns,
 * or the whole tensor without a region) of kind `part` to l. */
static int add(wk_parts *l, int part, const gpt_tensor *t, int group, bool region, int split, const gpt_piece *p,
               float *data) {
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 64;
        ck_tensor_ref *r = realloc(l->r, (size_t)nc * sizeof *r);
        if (r) l->r = r;
        char(*nm)[CK_NAME_MAX] = r ? realloc(l->names, (size_t)nc * sizeof *nm) : NULL;
        if (!nm) return co_err_set(CO_ENOMEM, "checkpoint: out of memory");
        l->names = nm;
        l->cap = nc;
    }
    int j = l->n++;
    ck_tensor_ref *r = &l->r[j];
    memset(r, 0, sizeof *r);
    snprintf(l->names[j], CK_NAME_MAX, "%s%s", prefix[part], t->name);
    r->kind = part ? CK_KIND_OPTIM : CK_KIND_MODEL;
    r->ndim = t->ndim;
    r->shape[0] = t->gshape[0];
    r->shape[1] = t->gshape[1];
    r->data = data;
    r->dst = data;
    r->group = group;
    r->region = region;
    if (region) {
        r->rshape[0] = t->gshape[0];
        r->rshape[1] = t->gshape[1];
        int d = split == GPT_TP_ROWS ? 0 : 1;
        r->offsets[d] = p->global;
        r->rshape[d] = p->len;
    }
    return 0;
}

static void name_them(wk_parts *l) {
    for (int j = 0; j < l->n; j++) l->r[j].name = l->names[j];
}

void wk_parts_free(wk_parts *l) {
    free(l->r);
    free(l->names);
    memset(l, 0, sizeof *l);
}

/* Writer groups of shard (tensor rank r, stage s, expert rank e) = r + tp (s + pp e):
 * held: expert rank e's group at stage s (the first of its tensor ranks that exists);
 * held_by_r: a group holding tensor rank r's slices at stage s, spread over the expert ranks
 * by the tensor's index i. Every rank lists the same, so the plans agree. */
static int held(const bool *h, int tp, int pp, int i, int s, int e) {
    for (int k = 0; k < tp; k++) {
        int r = (i + k) % tp, g = r + tp * (s + pp * e);
        if (h[g]) return g;
    }
    return tp * (s + pp * e);
}
static int held_by_r(const bool *h, int tp, int pp, int ep, int r, int s, int i) {
    for (int k = 0; k < ep; k++) {
        int e = (i + k) % ep, g = r + tp * (s + pp * e);
        if (h[g]) return g;
    }
    return r + tp * s;
}

/* What the listing of one rank's parts works from: the replica's sizes and this rank's
 * place, every shard's tensor table, which shards some rank holds. Shard (tensor rank r,
 * stage s, expert rank e) is r + tp (s + pp e). */
typedef struct parts_ctx {
    int tp, tpr, pp, ppr, ep, epr, shards, nt;
    const gpt_tensor *mine; /* this rank's tensors */
    gpt_tensor **tab;       /* [shards] each shard's table */
    int *ntab;
    bool *held_by;          /* [shards] some rank holds the shard */
    /* with the distributed optimizer: [shards][dpn] the world rank of each rank of a shard's
     * gradient group (data parallel, or data x context), in the group's order; with expert
     * parallelism (dx) the dense layout's per (tensor rank, stage) (at shard (r, s, 0)) and
     * the experts' [shards][xdpn] of each shard's expert-data-parallel group */
    int *gw, dpn;
    bool dx;
    int *xgw, xdpn;
    bool xwhole; /* (dx) the experts whole on each tensor rank (expert tensor size 1) */
} parts_ctx;

static int shard_of(const parts_ctx *x, int r, int s, int e) { return r + x->tp * (s + x->pp * e); }

/* With the distributed optimizer: world rank w's place in its shard sh's gradient group. */
static int group_place(int *gw, int dpn, const topo_layout *lay, int kind, int w, int sh) {
    int *members = malloc(sizeof *members * (size_t)lay->world), sz = 0, rc = 0;
    if (!members) return co_err_set(CO_ENOMEM, "checkpoint: out of memory");
    if (topo_group_of(lay, kind, w, members, &sz) < 0 || sz != dpn)
        rc = co_err_set(CO_EINTERNAL, "checkpoint: rank %d's gradient group has %d ranks, not %d", w, sz, dpn);
    for (int k = 0; k < sz && !rc; k++)
        if (members[k] == w) gw[sh * dpn + k] = w;
    free(members);
    return rc;
}

/* Each world rank's shard into wg (and which shards are held), from the job's layout; this
 * rank's coordinates must be the trainer's. */
static int map_writers(parts_ctx *x, trainer *t, int world, int rank, int *wg) {
    const co_config *c = trainer_config(t);
    topo_layout lay;
    char err[200];
    int cpn = c->context_parallel_size > 1 && !c->standin_model_parallel ? c->context_parallel_size : 1, rc;
    if (world % (x->tp * x->pp * cpn) ||
        topo_layout_init(&lay, world, x->tp, x->pp, cpn, x->ep, c->expert_tensor_parallel_size,
                         c->use_tp_pp_dp_mapping, err, sizeof err))
        return co_err_set(CO_EINTERNAL, "checkpoint: %d ranks in shards of tensor %d x pipeline %d x expert %d", world,
                          x->tp, x->pp, x->ep);
    for (int w = 0; w < world; w++) {
        topo_coord co;
        if (topo_coords(&lay, w, &co)) return co_err_set(CO_EINTERNAL, "checkpoint: no coordinates for rank %d", w);
        wg[w] = shard_of(x, co.tp, co.pp, x->ep > 1 ? co.ep : 0);
        x->held_by[wg[w]] = true;
        int gk = cpn > 1 ? TOPO_G_DP_CP : TOPO_G_DP;
        if (x->gw && (rc = group_place(x->gw, x->dpn, &lay, gk, w, x->dx ? shard_of(x, co.tp, co.pp, 0) : wg[w])))
            return rc;
        if (x->xgw && (rc = group_place(x->xgw, x->xdpn, &lay, TOPO_G_EDP, w, wg[w]))) return rc;
        if (w == rank && (co.tp != x->tpr || co.pp != x->ppr || (x->ep > 1 && co.ep != x->epr)))
            return co_err_set(CO_EINTERNAL, "checkpoint: rank %d is at tensor %d, pipeline %d, expert %d, its layout says "
                                            "%d, %d, %d", w, x->tpr, x->ppr, x->epr, co.tp, co.pp, co.ep);
    }
    return 0;
}

/* Every shard's tensor table (gpt_tensor_table with its tensor rank, chunks and expert rank). */
static int shard_tables(parts_ctx *x, trainer *t) {
    for (int sh = 0; sh < x->shards; sh++) {
        gpt_config cfg = trainer_model_config_of(t, sh % x->tp, sh / x->tp % x->pp);
        cfg.ep_rank = sh / (x->tp * x->pp);
        int rc = gpt_tensor_table(&cfg, &x->tab[sh], &x->ntab[sh], NULL);
        if (rc) return rc;
        if (sh / x->tp % x->pp == x->ppr && x->ntab[sh] != x->nt)
            return co_err_set(CO_EINTERNAL, "checkpoint: shard %d has %d tensors, this rank %d", sh, x->ntab[sh], x->nt);
    }
    return 0;
}

/* Where this rank's piece q of tensor i starts in base (a row slice at its local rows). */
static float *piece_data(const parts_ctx *x, float *base, int i, const gpt_tensor *tr, int q) {
    size_t cols = (size_t)(tr->shape[1] ? tr->shape[1] : 1);
    return base + x->mine[i].offset + (tr->split == GPT_TP_ROWS ? (size_t)x->mine[i].piece[q].local * cols : 0);
}

/* An expert tensor's parts at stage s: each expert rank's own experts, whole on its tensor
 * ranks, or with the experts split over the tensor group too (expert tensor size = tp) each
 * (tensor rank, expert rank)'s own slice, written by its shard. */
static int add_expert_parts(wk_parts *l, int part, const parts_ctx *x, int s, int i, float *base) {
    bool my_stage = s == x->ppr;
    const gpt_tensor *t0 = &x->tab[shard_of(x, 0, s, 0)][i];
    int rc = 0;
    if (x->tp == 1 || t0->split == GPT_TP_REPLICATED) {
        for (int e = 0; e < x->ep && !rc; e++)
            rc = add(l, part, &x->tab[shard_of(x, 0, s, e)][i], held(x->held_by, x->tp, x->pp, i, s, e), false, 0,
                     NULL, my_stage && e == x->epr ? base + x->mine[i].offset : NULL);
        return rc;
    }
    for (int e = 0; e < x->ep && !rc; e++)
        for (int r = 0; r < x->tp && !rc; r++) {
            const gpt_tensor *tr = &x->tab[shard_of(x, r, s, e)][i];
            bool mine_here = my_stage && e == x->epr && r == x->tpr;
            for (int q = 0; q < tr->npieces && !rc; q++)
                rc = add(l, part, tr, shard_of(x, r, s, e), true, tr->split, &tr->piece[q],
                         mine_here ? piece_data(x, base, i, tr, q) : NULL);
        }
    return rc;
}

/* A dense tensor's parts at stage s: once, by one tensor rank, where every tensor rank holds
 * it whole; else each tensor rank's pieces (a run several ranks share, by the first of them). */
static int add_dense_parts(wk_parts *l, int part, const parts_ctx *x, int s, int i, float *base) {
    bool my_stage = s == x->ppr;
    const gpt_tensor *t0 = &x->tab[shard_of(x, 0, s, 0)][i];
    if (x->tp == 1 || t0->split == GPT_TP_REPLICATED)
        return add(l, part, t0, held_by_r(x->held_by, x->tp, x->pp, x->ep, i % x->tp, s, i), false, 0, NULL,
                   my_stage ? base + x->mine[i].offset : NULL);
    int rc = 0;
    for (int r = 0; r < x->tp && !rc; r++) {
        const gpt_tensor *tr = &x->tab[shard_of(x, r, s, 0)][i];
        for (int q = 0; q < tr->npieces && !rc; q++) {
            const gpt_piece *p = &tr->piece[q];
            if (r % p->share) continue; /* the first of the ranks sharing it lists it */
            bool here = my_stage && x->tpr / p->share == r / p->share;
            rc = add(l, part, tr, held_by_r(x->held_by, x->tp, x->pp, x->ep, r, s, i), true, tr->split, p,
                     here ? piece_data(x, base, i, tr, q) : NULL);
        }
    }
    return rc;
}

/* Every shard's parts of kind `part` to save (the last stage's copy of a tied embedding
 * not at all). */
static int add_save_parts(wk_parts *save, int part, const parts_ctx *x, float *base) {
    int rc = 0;
    for (int s = 0; s < x->pp && !rc; s++)
        for (int i = 0; i < x->ntab[shard_of(x, 0, s, 0)] && !rc; i++) {
            const gpt_tensor *t0 = &x->tab[shard_of(x, 0, s, 0)][i];
            if (t0->emb_copy) continue;
            rc = t0->expert && x->ep > 1 ? add_expert_parts(save, part, x, s, i, base)
                                         : add_dense_parts(save, part, x, s, i, base);
        }
    return rc;
}

/* This rank's own parts of kind `part` to load (its copy of the tied embedding too). */
static int add_load_parts(wk_parts *load, int part, const parts_ctx *x, float *base) {
    int rc = 0;
    for (int i = 0; i < x->nt && !rc; i++) {
        const gpt_tensor *t1 = &x->mine[i];
        if (x->tp == 1 || t1->split == GPT_TP_REPLICATED) {
            rc = add(load, part, t1, 0, false, 0, NULL, base + t1->offset);
            continue;
        }
        for (int q = 0; q < t1->npieces && !rc; q++)
            rc = add(load, part, t1, 0, true, t1->split, &t1->piece[q], piece_data(x, base, i, t1, q));
    }
    return rc;
}

/* ---- the distributed optimizer's shards of the moments ----
 * Every shard's layout is rebuilt from its tensor table (trainer_dopt_layout_of: the
 * trainer's own rules), and every gradient-group rank's pieces become flat ranges of the
 * global tensors, written by that rank from its shard storage: a row slice's run maps to one
 * global range, a column slice's to one range per row; what several tensor ranks hold (a
 * replicated tensor, shared rows) is written by the ranks listing it in add_dense_parts, the
 * last stage's copy of a tied embedding not at all. */
typedef struct dopt_ctx {
    wk_parts *l;
    int part;
    const gpt_tensor *t; /* the tensor (its shard's table) */
    int writer;          /* world rank */
    float *data;         /* the range's moment data on this rank, NULL: another's */
} dopt_ctx;

static int add_flat(const dopt_ctx *c, size_t glo, size_t ghi, float *data) {
    if (glo >= ghi) return 0;
    int rc = add(c->l, c->part, c->t, 0, false, 0, NULL, data);
    if (rc) return rc;
    ck_tensor_ref *ref = &c->l->r[c->l->n - 1];
    ref->dst = NULL;
    ref->flat = true;
    ref->flat_begin = (int64_t)glo;
    ref->flat_end = (int64_t)ghi;
    ref->writer = c->writer;
    return 0;
}

/* Local flat range [f0, f1) of tensor c->t held by tensor rank r: its global ranges. */
static int add_local_range(const dopt_ctx *c, int tp, int r, int i, size_t f0, size_t f1) {
    const gpt_tensor *t = c->t;
    float *d = c->data;
    if (tp == 1 || t->split == GPT_TP_REPLICATED)
        return r == i % tp ? add_flat(c, f0, f1, d) : 0;
    size_t lc = (size_t)(t->shape[1] ? t->shape[1] : 1), gc = (size_t)(t->gshape[1] ? t->gshape[1] : 1);
    int rc = 0;
    for (int q = 0; q < t->npieces && !rc; q++) {
        const gpt_piece *p = &t->piece[q];
        if (r % p->share) continue; /* the first of the ranks sharing it writes it */
        size_t loc = (size_t)p->local, glob = (size_t)p->global, len = (size_t)p->len;
        if (t->split == GPT_TP_ROWS) {
            size_t a = loc * lc, e = (loc + len) * lc, lo = f0 > a ? f0 : a, hi = f1 < e ? f1 : e;
            if (lo < hi) rc = add_flat(c, lo - a + glob * lc, hi - a + glob * lc, d ? d + (lo - f0) : NULL);
            continue;
        }
        /* columns: each row's run of this piece */
        for (size_t row = f0 / lc; row * lc < f1 && !rc; row++) {
            size_t a = row * lc + loc, e = a + len, lo = f0 > a ? f0 : a, hi = f1 < e ? f1 : e;
            if (lo < hi)
                rc = add_flat(c, row * gc + glob + (lo - a), row * gc + glob + (hi - a), d ? d + (lo - f0) : NULL);
        }
    }
    return rc;
}

/* A layout's moment `part` of one shard's table (tensor rank r of tp: a tensor several
 * tensor ranks hold is written by one): every group rank k's pieces (written by writers[k]),
 * unit u being tensors list[first[u] ..] one after another; this rank's data (mine, its
 * shard storage) where it is rank me_k (-1: another shard). */
static int add_dopt_pieces(wk_parts *l, int part, int tp, const gpt_tensor *tab, const dopt_layout *L,
                           const int *list, const int *first, const int *writers, int r, int me_k,
                           const float *mine) {
    int rc = 0;
    for (int k = 0; k < L->dp && !rc; k++)
        for (int q = 0; q < L->npieces[k] && !rc; q++) {
            const dopt_piece *p = &L->pieces[k][q];
            /* the piece [param_lo, param_hi) of the layout's parameter, cut at its tensors (a
             * MoE layer's run holds several, one after another) */
            size_t a = 0;
            for (int j = first[p->param]; j < first[p->param + 1] && !rc; a += tab[list[j]].numel, j++) {
                int i = list[j];
                if (tab[i].emb_copy) continue;
                size_t e = a + tab[i].numel;
                size_t lo = p->param_lo > a ? p->param_lo : a, hi = p->param_hi < e ? p->param_hi : e;
                if (lo >= hi) continue;
                float *d = k == me_k ? (float *)mine + p->shard_off + (lo - p->param_lo) : NULL;
                dopt_ctx c = {.l = l, .part = part, .t = &tab[i], .writer = writers[k], .data = d};
                rc = add_local_range(&c, tp, r, i, lo - a, hi - a);
            }
        }
    return rc;
}

/* Shard sh's (tensor rank r, stage s) moment `part`: every gradient-group rank's pieces. */
static int add_dopt_shard(wk_parts *l, int part, const parts_ctx *x, trainer *t, int sh, int me_k,
                          const float *mine) {
    int r = sh % x->tp, s = sh / x->tp % x->pp, nt = x->ntab[sh];
    const gpt_tensor *tab = x->tab[sh];
    dopt_layout L = {0};
    int *ufirst = NULL, *list = malloc(sizeof *list * (size_t)(nt ? nt : 1));
    int rc = list ? trainer_dopt_layout_of(t, tab, nt, &L, &ufirst) : co_err_set(CO_ENOMEM, "checkpoint: out of memory");
    for (int i = 0; i < nt && list; i++) list[i] = i;
    bool here = r == x->tpr && s == x->ppr;
    if (!rc)
        rc = add_dopt_pieces(l, part, x->tp, tab, &L, list, ufirst, x->gw + (size_t)sh * x->dpn, r, here ? me_k : -1,
                             mine);
    dopt_layout_free(&L);
    free(ufirst);
    free(list);
    return rc;
}

/* With expert parallelism: every (tensor rank, stage)'s dense layout over its gradient group
 * (from the table of the first shard holding it: every expert rank has the same dense
 * tensors), every held (tensor rank, stage, expert rank)'s experts' layout over its
 * expert-data-parallel group. With the experts whole on each tensor rank (expert tensor size
 * 1, the expert group spanning the tensor ranks) an expert rank is one tensor rank, which
 * writes its experts whole; split over the tensor group, each tensor rank its slices. */
static int add_dopt_experts(wk_parts *l, int part, const parts_ctx *x, trainer *t, int me_k, const float *mine,
                            int me_xk, const float *xmine) {
    int rc = 0;
    for (int sh = 0; sh < x->shards && !rc; sh++) {
        int r = sh % x->tp, s = sh / x->tp % x->pp, e = sh / (x->tp * x->pp);
        if (!x->held_by[sh]) continue;
        bool dense = true;
        for (int f = 0; f < e && dense; f++) dense = !x->held_by[shard_of(x, r, s, f)];
        for (int kind = dense ? 0 : 1; kind < 2 && !rc; kind++) {
            dopt_layout L = {0};
            int *list = NULL, *first = NULL;
            rc = trainer_dopt_kind_layout_of(t, x->tab[sh], x->ntab[sh], kind == 1, &L, &list, &first);
            bool here = s == x->ppr && r == x->tpr && (kind == 0 || e == x->epr);
            const int *w = kind ? x->xgw + (size_t)sh * x->xdpn : x->gw + (size_t)shard_of(x, r, s, 0) * x->dpn;
            bool whole = kind && x->xwhole;
            if (!rc)
                rc = add_dopt_pieces(l, part, whole ? 1 : x->tp, x->tab[sh], &L, list, first, w, whole ? 0 : r,
                                     here ? (kind ? me_xk : me_k) : -1, kind ? xmine : mine);
            dopt_layout_free(&L);
            free(list);
            free(first);
        }
    }
    return rc;
}

static int add_dopt(wk_parts *l, int part, const parts_ctx *x, trainer *t, int me_k, const float *shard) {
    int rc = 0;
    for (int sh = 0; sh < x->shards && !rc; sh++) rc = add_dopt_shard(l, part, x, t, sh, me_k, shard);
    return rc;
}

/* The parameters' and both moments' parts, to save and to load; with the distributed
 * optimizer the moments to save are every data-parallel rank's pieces of its shard. */
static int list_parts(trainer *t, const parts_ctx *x, int world, int rank, wk_parts *save, wk_parts *load) {
    opt_adamw *o = trainer_optimizer(t);
    const float *dm = NULL, *dv = NULL;
    const int *ufirst = NULL;
    int drank = 0;
    const dopt_layout *L = trainer_dopt_shard(t, &dm, &dv, &drank, &ufirst);
    if (L && (L->dp != x->dpn || x->gw[shard_of(x, x->tpr, x->ppr, 0) * x->dpn + drank] != rank))
        return co_err_set(CO_EINTERNAL, "checkpoint: the distributed optimizer's rank %d of %d is world rank %d of %d "
                                        "in %d model shards", drank, L->dp, rank, world, x->shards);
    const float *xm = NULL, *xv = NULL;
    int xrank = 0;
    const dopt_layout *XL = x->dx ? trainer_dopt_xshard(t, &xm, &xv, &xrank) : NULL;
    if (x->dx && (!XL || XL->dp != x->xdpn || x->xgw[shard_of(x, x->tpr, x->ppr, x->epr) * x->xdpn + xrank] != rank))
        return co_err_set(CO_EINTERNAL, "checkpoint: the experts' distributed optimizer's rank %d of %d is not world "
                                        "rank %d", xrank, XL ? XL->dp : 0, rank);
    save->n = load->n = 0;
    int rc = 0;
    for (int part = 0; part < 3 && !rc; part++) {
        float *base = part == 0 ? gpt_params(trainer_model(t)) : part == 1 ? o->m : o->v;
        if (part == 1) save->nmodel = save->n, load->nmodel = load->n;
        rc = part && x->dx  ? add_dopt_experts(save, part, x, t, drank, part == 1 ? dm : dv, xrank, part == 1 ? xm : xv)
             : part && L ? add_dopt(save, part, x, t, drank, part == 1 ? dm : dv)
                         : add_save_parts(save, part, x, base);
        if (!rc) rc = add_load_parts(load, part, x, base);
    }
    return rc;
}

/* The writer groups some rank holds, numbered densely (each has world / groups writers):
 * the writers' and the saved parts' groups renumbered; their count. */
static int number_groups(const parts_ctx *x, int world, int *wg, wk_parts *save) {
    int *num = malloc(sizeof *num * (size_t)x->shards);
    if (!num) return co_err_set(CO_ENOMEM, "checkpoint: out of memory");
    int ng = 0;
    for (int sh = 0; sh < x->shards; sh++) num[sh] = x->held_by[sh] ? ng++ : -1;
    for (int w = 0; w < world; w++) wg[w] = num[wg[w]];
    for (int j = 0; j < save->n; j++)
        if (!save->r[j].flat) save->r[j].group = num[save->r[j].group];
    free(num);
    return ng;
}

int wk_parts_build(trainer *t, int world, int rank, wk_parts *save, wk_parts *load, int **writer_group, int *groups) {
    *writer_group = NULL;
    parts_ctx x = {.nt = gpt_num_tensors(trainer_model(t)), .mine = gpt_tensors(trainer_model(t))};
    trainer_model_parallel(t, &x.tp, &x.tpr, &x.pp, &x.ppr);
    trainer_expert_parallel(t, &x.ep, &x.epr);
    x.shards = x.tp * x.pp * x.ep;
    int rc0 = 0;
    /* writer w (a world rank) holds the shard of its coordinates; with the expert group
     * spanning the tensor ranks not every (tensor rank, expert rank) pair exists, and a
     * writer group must have members */
    int *wg = malloc(sizeof *wg * (size_t)world);
    x.dx = trainer_dopt_experts(t);
    if (trainer_dopt_on(t)) {
        /* every world rank is in one shard's gradient group; with expert parallelism the
         * dense layout's spans the expert ranks (world / (tensor x stages) ranks), the
         * experts' the expert-data-parallel group (world / (expert tensor x expert x stages)) */
        const co_config *c = trainer_config(t);
        int etp = c->expert_tensor_parallel_size > 0 ? c->expert_tensor_parallel_size : x.tp;
        x.xwhole = etp == 1;
        x.dpn = world / (x.dx ? x.tp * x.pp : x.shards);
        x.gw = calloc((size_t)world * (x.dx ? (size_t)x.ep : 1), sizeof *x.gw);
        if (x.dx) {
            x.xdpn = world / (etp * x.ep * x.pp);
            x.xgw = calloc((size_t)x.shards * (size_t)x.xdpn, sizeof *x.xgw);
        }
        if (!x.gw || (x.dx && !x.xgw)) rc0 = co_err_set(CO_ENOMEM, "checkpoint: out of memory");
    }
    x.held_by = calloc((size_t)x.shards, sizeof *x.held_by);
    x.tab = calloc((size_t)x.shards, sizeof *x.tab);
    x.ntab = calloc((size_t)x.shards, sizeof *x.ntab);
    int rc = rc0 ? rc0 : !wg || !x.tab || !x.ntab || !x.held_by ? co_err_set(CO_ENOMEM, "checkpoint: out of memory") : 0;
    if (!rc) rc = map_writers(&x, t, world, rank, wg);
    if (!rc) rc = shard_tables(&x, t);
    if (!rc) rc = list_parts(t, &x, world, rank, save, load);
    int ng = rc ? 0 : number_groups(&x, world, wg, save);
    if (ng < 0) rc = ng;
    for (int sh = 0; x.tab && sh < x.shards; sh++) free(x.tab[sh]);
    free(x.tab);
    free(x.ntab);
    free(x.held_by);
    free(x.gw);
    free(x.xgw);
    if (rc) {
        free(wg);
        return rc;
    }
    name_them(save);
    name_them(load);
    *writer_group = wg;
    *groups = ng;
    return 0;
}
