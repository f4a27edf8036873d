/* trainer_dopt.c - the trainer's distributed optimizer (--use-distributed-optimizer, ZeRO-1):
 * the model's flat parameter and gradient buffers laid out as optim/dist_opt.h's buckets
 * (gpt_relayout: no second full copy), the step as dopt_reduce (in the data-parallel
 * reduction, instead of the all-reduce) and dopt_update (after the validator's verdict),
 * the full moments materialised only while a checkpoint is loaded (a save writes each
 * rank's shard: worker/ckpt_parts.c), and an
 * in-process restart's handover of the optimizer shards between data-parallel ranks
 * (docs/distributed-optimizer.md). trainer.c calls in through trainer_internal.h. */
#include "train/trainer_internal.h"

#include "common/error.h"
#include "comm/zmq_comm.h"
#include "optim/dist_opt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tr_dopt {
    dopt_state s;
    /* the layout's parameters: one per tensor, except that a MoE layer's packed run (router,
     * experts, shared expert: moe.h's layout) is one parameter, laid out whole */
    int nunits;
    int *unit_first; /* [nunits + 1]: unit u is tensors unit_first[u] .. unit_first[u + 1] - 1 */
    bool *decay;  /* [nunits] weight decay applies */
    bool held;    /* this rank's shards (own and copy) hold the state of the trainer's iteration */
    bool reduced; /* the gradients of this round are reduce-scattered, norm computed */
    bool gather;  /* the shards are updated, the full parameter buffer is not yet (trainer__dopt_sync) */
    uint64_t *sum; /* where the gathered weights' checksum goes (the rerun state machine's), or NULL */
    double norm;
    /* COHORT_TEST_DOPT_REDUCE_SCATTER=1: reduce-scatter and all-gather on one host too (the
     * path between hosts, for tests and comparisons) */
    bool force_rs;
};

/* Appends [lo, hi) to the runs (merged with the last when adjacent). */
static void run_add(size_t *r, int *n, size_t lo, size_t hi) {
    if (lo >= hi) return;
    if (*n && r[2 * *n - 1] == lo) {
        r[2 * *n - 1] = hi;
        return;
    }
    r[2 * *n] = lo;
    r[2 * *n + 1] = hi;
    ++*n;
}

/* The parts of the laid-out buffer this rank counts in the gradient norm, as
 * gpt_tp_grad_sumsq does: not the last stage's copy of the tied embedding; a column slice
 * whole; of rows several tensor ranks hold (a replicated tensor, shared key/value rows) the
 * first holder's only. Needed with tensor or pipeline parallelism (the norm is summed over
 * the replica's ranks). */
int trainer__norm_runs(trainer *t, size_t **runs, int *nruns) {
    gpt_model *m = t->model;
    int nt = gpt_num_tensors(m);
    const gpt_tensor *tab = gpt_tensors(m);
    int *order = malloc(sizeof *order * (size_t)(nt ? nt : 1));
    size_t *r = malloc(sizeof *r * 2 * 3 * (size_t)(nt ? nt : 1));
    if (!order || !r) {
        free(order);
        free(r);
        return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    }
    /* tensors by their offset in the buffer (the layout reverses the table) */
    for (int i = 0; i < nt; i++) order[i] = i;
    for (int i = 1; i < nt; i++)
        for (int j = i; j > 0 && tab[order[j - 1]].offset > tab[order[j]].offset; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    int n = 0;
    for (int k = 0; k < nt; k++) {
        const gpt_tensor *x = &tab[order[k]];
        if (x->emb_copy) continue;
        if (x->split == GPT_TP_COLS || t->tp_size <= 1) {
            run_add(r, &n, x->offset, x->offset + x->numel);
            continue;
        }
        size_t cols = (size_t)(x->shape[1] ? x->shape[1] : 1);
        for (int q = 0; q < x->npieces; q++)
            if (t->tp_rank % x->piece[q].share == 0)
                run_add(r, &n, x->offset + (size_t)x->piece[q].local * cols,
                        x->offset + (size_t)(x->piece[q].local + x->piece[q].len) * cols);
    }
    free(order);
    *runs = r;
    *nruns = n;
    return 0;
}

static int set_norm_runs(trainer *t, dopt_state *s) {
    size_t *r = NULL;
    int n = 0, rc = trainer__norm_runs(t, &r, &n);
    if (!rc) rc = dopt_set_norm_runs(s, r, n);
    free(r);
    return rc;
}

/* The layout's parameters from a tensor table: one per tensor, except that a MoE layer's
 * packed run is one, laid out whole; unit u is tensors unit_first[u] .. unit_first[u + 1] - 1
 * (unit_first[nt + 1], decay and numel [nt]). */
static int units_of(const gpt_tensor *tab, int nt, int *unit_first, bool *decay, size_t *numel, int *nunits) {
    int nu = 0;
    for (int i = 0; i < nt; i++) {
        if (tab[i].packed && nu > 0) { /* the rest of a packed run joins its first tensor's unit */
            numel[nu - 1] += tab[i].numel;
            if (tab[i].decay != decay[nu - 1])
                return co_err_set(CO_EINTERNAL, "distributed optimizer: %s decays unlike its run", tab[i].name);
            continue;
        }
        unit_first[nu] = i;
        numel[nu] = tab[i].numel;
        decay[nu++] = tab[i].decay;
    }
    unit_first[nu] = nt;
    *nunits = nu;
    return 0;
}

int trainer_dopt_layout_of(const trainer *t, const gpt_tensor *tab, int nt, dopt_layout *L, int **unit_first) {
    *unit_first = malloc(sizeof **unit_first * (size_t)(nt + 1));
    size_t *numel = malloc(sizeof *numel * (size_t)(nt ? nt : 1));
    bool *decay = malloc(sizeof *decay * (size_t)(nt ? nt : 1));
    int nu = 0, rc = *unit_first && numel && decay ? 0 : co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    if (!rc && !t->dopt) rc = co_err_set(CO_EINTERNAL, "distributed optimizer: not on");
    if (!rc) rc = units_of(tab, nt, *unit_first, decay, numel, &nu);
    if (!rc) rc = dopt_layout_build(L, numel, nu, t->dopt->s.L.dp, (size_t)t->cfg.ddp_bucket_size);
    free(numel);
    free(decay);
    if (rc) {
        free(*unit_first);
        *unit_first = NULL;
    }
    return rc;
}

int trainer__dopt_setup(trainer *t, bool joining) {
    const co_config *c = &t->cfg;
    cm_comm *g = tr_groups_grad(&t->g);
    int dp = g ? g->size : 1, rank = g ? g->rank : 0;
    gpt_model *m = t->model;
    int nt = gpt_num_tensors(m);
    const gpt_tensor *tab = gpt_tensors(m);
    tr_dopt *d = calloc(1, sizeof *d);
    size_t *numel = malloc(sizeof *numel * (size_t)nt);
    if (d) d->decay = malloc(sizeof *d->decay * (size_t)nt);
    if (d) {
        const char *force = getenv("COHORT_TEST_DOPT_REDUCE_SCATTER");
        d->force_rs = force && *force && strcmp(force, "0");
    }
    if (!d || !numel || !d->decay) {
        if (d) free(d->decay);
        free(d);
        free(numel);
        return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    }
    d->unit_first = malloc(sizeof *d->unit_first * (size_t)(nt + 1));
    size_t *off = malloc(sizeof *off * (size_t)nt);
    int rc = d->unit_first && off ? 0 : co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    int nu = 0;
    if (!rc) rc = units_of(tab, nt, d->unit_first, d->decay, numel, &nu);
    d->nunits = nu;
    dopt_layout L = {0};
    if (!rc) rc = dopt_layout_build(&L, numel, nu, dp, (size_t)c->ddp_bucket_size);
    free(numel);
    /* every tensor at its unit's start plus its place in the run */
    for (int u = 0; u < nu && !rc; u++)
        for (int i = d->unit_first[u]; i < d->unit_first[u + 1]; i++)
            off[i] = L.param_start[u] + (tab[i].offset - tab[d->unit_first[u]].offset);
    if (!rc) rc = gpt_relayout(m, off, L.total);
    free(off);
    dopt_options o = {.beta1 = (float)c->adam_beta1, .beta2 = (float)c->adam_beta2, .eps = (float)c->adam_eps,
                      .weight_decay = (float)c->weight_decay, .clip_grad = (float)c->clip_grad,
                      .redundant = c->dist_opt_redundancy, .timeout_ms = TRAIN_COMM_TIMEOUT_MS,
                      .average_over = t->g.dp ? t->g.dp->size : 1};
    if (!rc) rc = dopt_init_borrowed(&d->s, &L, rank, &o, t->be, gpt_params(m), gpt_grads(m));
    dopt_layout_free(&L);
    if (!rc && tr_groups_replica(&t->g) && (rc = set_norm_runs(t, &d->s))) dopt_free(&d->s);
    if (rc) {
        free(d->decay);
        free(d->unit_first);
        free(d);
        return rc;
    }
    d->held = !joining;
    /* the replicated optimizer's fields that checkpoints record; its moments stay NULL */
    t->opt = (opt_adamw){.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
                         .clip_grad = o.clip_grad, .n = gpt_num_params(m)};
    t->dopt = d;
    if (t->log) {
        size_t n = 0;
        for (int i = 0; i < nt; i++) n += tab[i].numel;
        fprintf(t->log, "cohort: distributed optimizer over %d %s rank%s: %d bucket%s, shard of %zu of %zu "
                        "elements, %.2f bytes per parameter on this rank for parameters, gradients and moments%s "
                        "(replicated: 16)\n", dp, t->g.cp ? "data x context-parallel" : "data-parallel",
                dp > 1 ? "s" : "", d->s.L.nbuckets, d->s.L.nbuckets > 1 ? "s" : "",
                d->s.L.shard_total, d->s.L.total, dopt_bytes_per_param(&d->s.L, n, d->s.opt.redundant),
                d->s.opt.redundant ? " (with the copy of the previous rank's shard)" : "");
        fflush(t->log);
    }
    return 0;
}

int trainer__dopt_init_shards(trainer *t) {
    dopt_init_shards(&t->dopt->s); /* (the weights as gpt_init drew them, the same on every rank) */
    return 0;
}

void trainer__dopt_free(trainer *t) {
    if (!t->dopt) return;
    dopt_free(&t->dopt->s);
    free(t->dopt->decay);
    free(t->dopt->unit_first);
    free(t->dopt);
    t->dopt = NULL;
    kb_backend *be = t->be;
    if (t->opt.m) be->ops->free(be, t->opt.m);
    if (t->opt.v) be->ops->free(be, t->opt.v);
    t->opt.m = t->opt.v = NULL;
}

/* The group, and how to reduce and gather over it this generation: with all-reduces where
 * its all-reduce goes through shared memory (one host) and its other collectives through
 * sockets (dist_opt.h, opt.allreduce). */
static cm_comm *step_group(trainer *t) {
    cm_comm *g = tr_groups_grad(&t->g);
    t->dopt->s.opt.allreduce = cm_zmq_shared_memory(g) && !t->dopt->force_rs;
    return g;
}

int trainer__dopt_reduce(trainer *t) {
    tr_dopt *d = t->dopt;
    int rc = dopt_reduce_mp(&d->s, step_group(t), tr_groups_replica(&t->g), &d->norm);
    d->reduced = !rc;
    return rc;
}

int trainer__dopt_nbuckets(const trainer *t) { return t->dopt->s.L.nbuckets; }

void trainer__dopt_bucket(const trainer *t, int b, size_t *lo, size_t *hi) {
    *lo = t->dopt->s.L.buckets[b].start;
    *hi = t->dopt->s.L.buckets[b].end;
}

int trainer__dopt_reduce_bucket(trainer *t, cm_comm *g, int b) { return dopt_reduce_bucket(&t->dopt->s, g, b); }

int trainer__dopt_reduce_finish(trainer *t) {
    tr_dopt *d = t->dopt;
    int rc = dopt_reduce_finish(&d->s, step_group(t), tr_groups_replica(&t->g), &d->norm);
    d->reduced = !rc;
    return rc;
}

cm_comm *trainer__dopt_group(trainer *t) { return step_group(t); }

int trainer__dopt_norm(trainer *t, double *out) {
    tr_dopt *d = t->dopt;
    /* one process: no reduction ran (dopt_reduce over no group is the norm alone) */
    if (!d->reduced && !tr_groups_grad(&t->g)) {
        int rc = trainer__dopt_reduce(t);
        if (rc) return rc;
    }
    if (!d->reduced) return co_err_set(CO_EINTERNAL, "distributed optimizer: the step before the reduction");
    *out = d->norm;
    return 0;
}

int trainer__dopt_step(trainer *t, double lr, double grad_norm, uint64_t *sum) {
    tr_dopt *d = t->dopt;
    d->s.step = t->opt.step; /* the trainer's count is the truth (restored by loads and restarts) */
    int rc = dopt_update_shards(&d->s, d->decay, lr, grad_norm);
    d->reduced = false;
    if (rc) return rc;
    t->opt.step = d->s.step;
    d->gather = true;
    d->sum = sum;
    return 0;
}

int trainer__dopt_sync(trainer *t) {
    tr_dopt *d = t->dopt;
    if (!d || !d->gather) return 0;
    int rc = dopt_gather(&d->s, step_group(t));
    if (rc) return rc;
    d->gather = false;
    gpt_sync_bf16(t->model);
    if (d->sum) *d->sum = gpt_weights_checksum(t->model);
    d->sum = NULL;
    return 0;
}

/* ---- checkpoints: the shard to save, the full moments only while loaded ---- */

bool trainer_dopt_on(const trainer *t) { return t->dopt != NULL; }

void trainer__dopt_params_moved(trainer *t, const float *at, size_t n) {
    if (!t->dopt) return;
    size_t lo = (size_t)(at - gpt_params(t->model));
    dopt_copy_refresh(&t->dopt->s, lo, lo + n);
}

const dopt_layout *trainer_dopt_shard(const trainer *t, const float **m, const float **v, int *rank,
                                      const int **unit_first) {
    if (!t->dopt) return NULL;
    *m = t->dopt->s.m;
    *v = t->dopt->s.v;
    *rank = t->dopt->s.rank;
    *unit_first = t->dopt->unit_first;
    return &t->dopt->s.L;
}

int trainer_dopt_moments_begin(trainer *t) {
    tr_dopt *d = t->dopt;
    if (!d) return 0;
    const dopt_layout *L = &d->s.L;
    kb_backend *be = t->be;
    size_t n = L->total;
    if (!t->opt.m) t->opt.m = be->ops->alloc(be, n * sizeof(float));
    if (!t->opt.v) t->opt.v = be->ops->alloc(be, n * sizeof(float));
    if (!t->opt.m || !t->opt.v) {
        trainer_dopt_moments_end(t, false);
        return co_err_set(CO_ENOMEM, "distributed optimizer: cannot allocate the full moments (%zu elements) to "
                                     "load the checkpoint", n);
    }
    be->ops->zero(be, t->opt.m, n);
    be->ops->zero(be, t->opt.v, n);
    be->ops->sync(be); /* the checkpoint's reader writes them from the host */
    return 0;
}

int trainer_dopt_moments_end(trainer *t, bool scatter) {
    tr_dopt *d = t->dopt;
    if (!d) return 0;
    kb_backend *be = t->be;
    int rc = 0;
    if (scatter && t->opt.m && t->opt.v) {
        /* every rank read the whole moments: its own shard and its copy of the neighbour's */
        dopt_state *s = &d->s;
        const dopt_layout *L = &s->L;
        int n = L->dp;
        float *pm = malloc(3 * L->shard_total * sizeof(float) + sizeof(float));
        if (!pm) return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
        float *pv = pm + L->shard_total, *pp = pv + L->shard_total;
        be->ops->sync(be); /* (the host reads the loaded moments and parameters) */
        int shards[2] = {s->rank, (s->rank + n - 1) % n};
        for (int j = 0; j < (s->opt.redundant ? 2 : 1) && !rc; j++) {
            for (int b = 0; b < L->nbuckets; b++) {
                const dopt_bucket *B = &L->buckets[b];
                size_t at = B->start + (size_t)shards[j] * B->shard;
                memcpy(pm + B->shard_base, t->opt.m + at, B->shard * sizeof(float));
                memcpy(pv + B->shard_base, t->opt.v + at, B->shard * sizeof(float));
                memcpy(pp + B->shard_base, gpt_params(t->model) + at, B->shard * sizeof(float));
            }
            dopt_shard_view v = {.shard = shards[j], .n = L->shard_total, .m = pm, .v = pv, .step = t->opt.step};
            rc = dopt_shard_restore(s, &v, pp);
        }
        free(pm);
        d->held = !rc;
    }
    if (t->opt.m) be->ops->free(be, t->opt.m);
    if (t->opt.v) be->ops->free(be, t->opt.v);
    t->opt.m = t->opt.v = NULL;
    return rc;
}

/* ---- an in-process restart's handover ----
 * Every rank says which shards it holds for the iteration all resume from (its own and its
 * copy of the previous generation; none for a replacement); every shard goes to the ranks
 * that need it now (its owner and, with redundancy, the next rank), from the lowest rank
 * holding it, in one order all ranks follow (so the blocking sends and receives cannot wait
 * on each other); then each rank installs what it received. A shard nobody holds fails
 * (the supervisor falls back to the checkpoint before this happens). */
int trainer__dopt_handover(trainer *t, bool held) {
    tr_dopt *d = t->dopt;
    cm_comm *g = tr_groups_grad(&t->g);
    if (!d || !g) return 0;
    dopt_state *s = &d->s;
    const dopt_layout *L = &s->L;
    int n = L->dp, me = g->rank, nslots = s->opt.redundant ? 2 : 1;
    if (g->size != n)
        return co_err_set(CO_EINVAL, "distributed optimizer: shards for %d data-parallel ranks, the new group has %d "
                                     "(load the checkpoint instead)", n, g->size);
    d->held = d->held && held; /* (a survivor behind the iteration all resume from holds nothing) */
    int32_t mine[2] = {d->held ? s->rank : -1, d->held && s->opt.redundant ? (s->rank + n - 1) % n : -1};
    size_t S = L->shard_total;
    int32_t *all = malloc(sizeof *all * 2 * (size_t)n);
    float *buf = malloc(sizeof(float) * (7 * S + 1)); /* 2 slots x (params, m, v) + a send buffer */
    int rc = !all || !buf ? co_err_set(CO_ENOMEM, "distributed optimizer handover: out of memory") : 0;
    if (!rc) rc = g->ops->allgather(g, mine, all, sizeof mine, TRAIN_COMM_TIMEOUT_MS);
    for (int slot = 0; slot < nslots && !rc; slot++) {
        for (int k = 0; k < n && !rc; k++) {
            int dst = slot == 0 ? k : (k + 1) % n, src = -1;
            if (all[2 * dst] == k || all[2 * dst + 1] == k) src = dst;
            for (int r = 0; r < n && src < 0; r++)
                if (all[2 * r] == k || all[2 * r + 1] == k) src = r;
            if (src < 0) {
                rc = co_err_set(CO_ENOENT, "distributed optimizer handover: no rank holds optimizer shard %d (its "
                                           "owner and its copy's holder both died)", k);
                break;
            }
            if (me != src && me != dst) continue;
            float *rp = buf + (size_t)slot * 3 * S, *rm = rp + S, *rv = rm + S;
            if (me == src) {
                dopt_shard_view v;
                float *sp = me == dst ? rp : buf + 6 * S;
                if ((rc = dopt_shard_view_get(s, k, &v, sp))) break;
                if (me == dst) {
                    memcpy(rm, v.m, S * sizeof(float));
                    memcpy(rv, v.v, S * sizeof(float));
                    continue;
                }
                const void *part[3] = {sp, v.m, v.v};
                for (int q = 0; q < 3 && !rc; q++)
                    rc = g->ops->send(g, part[q], S * sizeof(float), dst, TRAIN_COMM_TIMEOUT_MS);
            } else {
                float *part[3] = {rp, rm, rv};
                for (int q = 0; q < 3 && !rc; q++)
                    rc = g->ops->recv(g, part[q], S * sizeof(float), src, TRAIN_COMM_TIMEOUT_MS);
            }
            if (rc) rc = co_err_set(rc, "distributed optimizer handover: shard %d from rank %d to rank %d: %s", k, src,
                                    dst, co_err_detail());
        }
    }
    if (!rc) {
        s->rank = me; /* (--inprocess-rank-assignment shift-ranks: another data-parallel rank now) */
        for (int slot = 0; slot < nslots && !rc; slot++) {
            float *rp = buf + (size_t)slot * 3 * S;
            dopt_shard_view v = {.shard = slot == 0 ? me : (me + n - 1) % n, .n = S, .m = rp + S, .v = rp + 2 * S,
                                 .step = t->opt.step};
            rc = dopt_shard_restore(s, &v, rp);
        }
    }
    d->held = !rc;
    free(all);
    free(buf);
    if (!rc) {
        /* the rest of the parameters from the shards' owners (the root's full buffer may be
         * stale where an abort interrupted its last all-gather) */
        d->gather = true;
        d->sum = NULL;
        rc = trainer__dopt_sync(t);
    }
    return rc;
}
