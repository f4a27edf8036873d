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

#include <math.h>
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
    bool *decoupled; /* [nunits] --decoupled-lr's rate applies (the embedding, the output layer) */
    bool held;    /* this rank's shards (own and copy) hold the state of the trainer's iteration */
    bool reduced; /* the gradients of this round are reduce-scattered, norm computed */
    bool gather;  /* the shards are updated, the full parameter buffer is not yet (trainer__dopt_sync) */
    bool queued;  /* the all-gather is queued on the backend's stream (CUDA with NCCL), not yet waited
                   * for: trainer__dopt_sync waits before the host reads the parameters */
    uint64_t *sum; /* where the gathered weights' checksum goes (the rerun state machine's), or NULL */
    double norm;
    /* COHORT_TEST_DOPT_REDUCE_SCATTER=1: reduce-scatter and all-gather on one host too (the
     * path between hosts, for tests and comparisons) */
    bool force_rs;
    /* expert parallelism (Megatron's second optimizer instance): the experts' parameters
     * (each MoE layer's experts, a unit) laid out after the rest, in a layout and state of
     * their own over the expert-data-parallel group; the rest (s) over the gradient group */
    bool ex;
    dopt_state xs;
    bool *xdecay;
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

/* With expert parallelism: the units of one kind (expert or not), a MoE layer's packed run
 * giving one unit of its experts and one of the rest (router and shared expert); the tensors
 * of unit u are list[first[u] .. first[u + 1] - 1], laid out one after another. */
static int units_of_kind(const gpt_tensor *tab, int nt, bool expert, int *list, int *first, bool *decay,
                         size_t *numel, int *nunits) {
    int nu = 0, nl = 0;
    for (int i = 0; i < nt; i++) {
        if (tab[i].expert != expert) continue;
        /* (joins the unit before it: a packed tensor of the same run and kind) */
        bool join = tab[i].packed && nu > 0 && tab[list[nl - 1]].packed_run == tab[i].packed_run;
        if (join) {
            numel[nu - 1] += tab[i].numel;
            if (tab[i].decay != decay[nu - 1])
                return co_err_set(CO_EINTERNAL, "distributed optimizer: %s decays unlike its run", tab[i].name);
        } else {
            first[nu] = nl;
            numel[nu] = tab[i].numel;
            decay[nu++] = tab[i].decay;
        }
        list[nl++] = i;
    }
    first[nu] = nl;
    *nunits = nu;
    return 0;
}

/* Expert parallelism: two layouts, the experts' after the rest in the buffer (their offsets
 * into off[]), the dense one in d->s's place and the experts' in *xl. */
static int split_layouts(trainer *t, tr_dopt *d, int dp, int edp, size_t *off, dopt_layout *L, dopt_layout *xl) {
    gpt_model *m = t->model;
    int nt = gpt_num_tensors(m), rc = 0;
    const gpt_tensor *tab = gpt_tensors(m);
    int *list = malloc(sizeof *list * (size_t)nt), *first = malloc(sizeof *first * (size_t)(nt + 1));
    size_t *numel = malloc(sizeof *numel * (size_t)nt);
    bool *xdecay = malloc(sizeof *xdecay * (size_t)nt);
    if (!list || !first || !numel || !xdecay) rc = co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    size_t bs = (size_t)t->cfg.ddp_bucket_size, base = 0;
    for (int kind = 0; kind < 2 && !rc; kind++) {
        int nu = 0;
        bool *dec = kind ? xdecay : d->decay;
        dopt_layout *K = kind ? xl : L;
        rc = units_of_kind(tab, nt, kind == 1, list, first, dec, numel, &nu);
        if (!rc) rc = dopt_layout_build(K, numel, nu, kind ? edp : dp, bs);
        for (int u = 0; u < nu && !rc; u++) {
            size_t at = base + K->param_start[u];
            for (int q = first[u]; q < first[u + 1]; q++) {
                off[list[q]] = at;
                at += tab[list[q]].numel;
            }
        }
        if (!kind) d->nunits = nu;
        for (int u = 0; u < nu && !kind && !rc; u++) d->decoupled[u] = opt_decoupled_tensor(&tab[list[first[u]]]);
        if (!rc) base += K->total;
    }
    free(list);
    free(first);
    free(numel);
    if (rc) free(xdecay);
    else d->xdecay = xdecay;
    return rc;
}

bool trainer_dopt_experts(const trainer *t) { return t->dopt && t->dopt->ex; }

int trainer_dopt_kind_layout_of(const trainer *t, const gpt_tensor *tab, int nt, bool experts, dopt_layout *L,
                                int **list, int **first) {
    *list = malloc(sizeof **list * (size_t)(nt ? nt : 1));
    *first = malloc(sizeof **first * (size_t)(nt + 1));
    size_t *numel = malloc(sizeof *numel * (size_t)(nt ? nt : 1));
    bool *decay = malloc(sizeof *decay * (size_t)(nt ? nt : 1));
    int nu = 0, rc = *list && *first && numel && decay ? 0 : co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    if (!rc && !trainer_dopt_experts(t)) rc = co_err_set(CO_EINTERNAL, "distributed optimizer: no experts' layout");
    if (!rc) rc = units_of_kind(tab, nt, experts, *list, *first, decay, numel, &nu);
    if (!rc)
        rc = dopt_layout_build(L, numel, nu, experts ? t->dopt->xs.L.dp : t->dopt->s.L.dp,
                               (size_t)t->cfg.ddp_bucket_size);
    free(numel);
    free(decay);
    if (rc) {
        free(*list);
        free(*first);
        *list = *first = NULL;
    }
    return rc;
}

const dopt_layout *trainer_dopt_xshard(const trainer *t, const float **m, const float **v, int *rank) {
    if (!trainer_dopt_experts(t)) return NULL;
    *m = t->dopt->xs.m;
    *v = t->dopt->xs.v;
    *rank = t->dopt->xs.rank;
    return &t->dopt->xs.L;
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
    if (d) d->decoupled = malloc(sizeof *d->decoupled * (size_t)nt);
    if (d) {
        const char *force = getenv("COHORT_TEST_DOPT_REDUCE_SCATTER");
        d->force_rs = force && *force && strcmp(force, "0");
    }
    if (!d || !numel || !d->decay || !d->decoupled) {
        if (d) {
            free(d->decay);
            free(d->decoupled);
        }
        free(d);
        free(numel);
        return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    }
    d->unit_first = malloc(sizeof *d->unit_first * (size_t)(nt + 1));
    size_t *off = malloc(sizeof *off * (size_t)nt);
    int rc = d->unit_first && off ? 0 : co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    int nu = 0;
    dopt_layout L = {0}, xl = {0};
    d->ex = t->epn > 1;
    cm_comm *eg = d->ex ? t->g.edp : NULL;
    if (!rc && d->ex) {
        rc = split_layouts(t, d, dp, eg ? eg->size : 1, off, &L, &xl);
    } else if (!rc) {
        rc = units_of(tab, nt, d->unit_first, d->decay, numel, &nu);
        d->nunits = nu;
        for (int u = 0; u < nu && !rc; u++) d->decoupled[u] = opt_decoupled_tensor(&tab[d->unit_first[u]]);
        if (!rc) rc = dopt_layout_build(&L, numel, nu, dp, (size_t)c->ddp_bucket_size);
        /* every tensor at its unit's start plus its place in the run */
        for (int u = 0; u < nu && !rc; u++)
            for (int i = d->unit_first[u]; i < d->unit_first[u + 1]; i++)
                off[i] = L.param_start[u] + (tab[i].offset - tab[d->unit_first[u]].offset);
    }
    free(numel);
    if (!rc) rc = gpt_relayout(m, off, L.total + xl.total);
    free(off);
    dopt_options o = {.beta1 = (float)c->adam_beta1, .beta2 = (float)c->adam_beta2, .eps = (float)c->adam_eps,
                      .weight_decay = (float)c->weight_decay, .clip_grad = (float)c->clip_grad,
                      .redundant = c->dist_opt_redundancy, .timeout_ms = TRAIN_COMM_TIMEOUT_MS,
                      .average_over = t->g.dp ? t->g.dp->size : 1};
    if (!rc) rc = dopt_init_borrowed(&d->s, &L, rank, &o, t->be, gpt_params(m), gpt_grads(m));
    /* the experts' over their expert-data-parallel group (every element counted in the norm,
     * which sums over the expert x pipeline ranks: each holds other experts or slices) */
    if (!rc && d->ex &&
        (rc = dopt_init_borrowed(&d->xs, &xl, eg ? eg->rank : 0, &o, t->be, gpt_params(m) + L.total,
                                 gpt_grads(m) + L.total)))
        dopt_free(&d->s);
    dopt_layout_free(&L);
    dopt_layout_free(&xl);
    if (!rc && tr_groups_replica(&t->g) && (rc = set_norm_runs(t, &d->s))) {
        dopt_free(&d->s);
        if (d->ex) dopt_free(&d->xs);
    }
    if (rc) {
        free(d->xdecay);
        free(d->decay);
        free(d->decoupled);
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
        if (d->ex)
            fprintf(t->log, "cohort: the experts' distributed optimizer over %d expert-data-parallel rank%s: %d "
                            "bucket%s, shard of %zu of %zu elements%s\n", d->xs.L.dp, d->xs.L.dp > 1 ? "s" : "",
                    d->xs.L.nbuckets, d->xs.L.nbuckets > 1 ? "s" : "", d->xs.L.shard_total, d->xs.L.total,
                    d->xs.opt.redundant ? " (with the copy of the previous rank's shard)" : "");
        fflush(t->log);
    }
    return 0;
}

int trainer__dopt_init_shards(trainer *t) {
    dopt_init_shards(&t->dopt->s); /* (the weights as gpt_init drew them, the same on every rank) */
    if (t->dopt->ex) dopt_init_shards(&t->dopt->xs);
    return 0;
}

void trainer__dopt_free(trainer *t) {
    if (!t->dopt) return;
    dopt_free(&t->dopt->s);
    if (t->dopt->ex) dopt_free(&t->dopt->xs);
    free(t->dopt->xdecay);
    free(t->dopt->decay);
    free(t->dopt->decoupled);
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
    if (t->dopt->ex) t->dopt->xs.opt.allreduce = cm_zmq_shared_memory(t->g.edp) && !t->dopt->force_rs;
    return g;
}

/* With expert parallelism: the experts' reduction over the expert-data-parallel group (the
 * norm's squares summed over the expert x pipeline ranks; finish: its buckets already
 * reduced, trainer__dopt_reduce_bucket), then the norm of both. */
static int reduce_experts(trainer *t, bool finish) {
    tr_dopt *d = t->dopt;
    if (!d->ex) return 0;
    int rc = finish ? dopt_reduce_finish(&d->xs, t->g.edp, t->g.erep, NULL)
                    : dopt_reduce_mp(&d->xs, t->g.edp, t->g.erep, NULL);
    if (!rc) d->norm = sqrt(d->s.norm_sq + d->xs.norm_sq);
    return rc;
}

int trainer__dopt_reduce(trainer *t) {
    tr_dopt *d = t->dopt;
    int rc = dopt_reduce_mp(&d->s, step_group(t), tr_groups_replica(&t->g), &d->norm);
    if (!rc) rc = reduce_experts(t, false);
    d->reduced = !rc;
    return rc;
}

/* (the buckets of both layouts: the dense one's, then with expert parallelism the experts',
 * which lie after the dense layout's end) */
int trainer__dopt_nbuckets(const trainer *t) {
    return t->dopt->s.L.nbuckets + (t->dopt->ex ? t->dopt->xs.L.nbuckets : 0);
}

int trainer__dopt_buckets_match(const trainer *t, int nb, const size_t *lo, const size_t *hi, const char *who) {
    int n = trainer__dopt_nbuckets(t);
    for (int b = 0; b < n && b < nb; b++) {
        size_t l, h;
        trainer__dopt_bucket(t, b, &l, &h);
        if (l != lo[b] || h != hi[b])
            return co_err_set(CO_EINTERNAL, "%s: bucket %d is [%zu, %zu), the distributed optimizer's layout has it at "
                                            "[%zu, %zu)", who, b, lo[b], hi[b], l, h);
    }
    if (n != nb) return co_err_set(CO_EINTERNAL, "%s: %d buckets, the distributed optimizer's layout has %d", who, nb, n);
    return 0;
}

bool trainer__dopt_bucket_expert(const trainer *t, int b) { return b >= t->dopt->s.L.nbuckets; }

/* The state bucket b belongs to, b made its index there. */
static dopt_state *bucket_state(trainer *t, int *b) {
    if (*b < t->dopt->s.L.nbuckets) return &t->dopt->s;
    *b -= t->dopt->s.L.nbuckets;
    return &t->dopt->xs;
}

void trainer__dopt_bucket(const trainer *t, int b, size_t *lo, size_t *hi) {
    const tr_dopt *d = t->dopt;
    size_t base = b < d->s.L.nbuckets ? 0 : d->s.L.total;
    const dopt_bucket *B = b < d->s.L.nbuckets ? &d->s.L.buckets[b] : &d->xs.L.buckets[b - d->s.L.nbuckets];
    *lo = base + B->start;
    *hi = base + B->end;
}

int trainer__dopt_reduce_bucket(trainer *t, cm_comm *g, int b) {
    dopt_state *s = bucket_state(t, &b);
    return dopt_reduce_bucket(s, g, b);
}

int trainer__dopt_reduce_finish(trainer *t) {
    tr_dopt *d = t->dopt;
    int rc = dopt_reduce_finish(&d->s, step_group(t), tr_groups_replica(&t->g), &d->norm);
    if (!rc) rc = reduce_experts(t, true);
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
    d->s.opt.inv_loss_scale = t->opt.inv_loss_scale; /* --fp16's, this step's */
    d->s.decoupled = d->decoupled; /* (the experts are neither the embedding nor the output layer) */
    d->s.lr_decoupled = t->opt.lr_decoupled;
    int rc = dopt_update_shards(&d->s, d->decay, lr, grad_norm);
    if (!rc && d->ex) {
        d->xs.step = t->opt.step;
        rc = dopt_update_shards(&d->xs, d->xdecay, lr, grad_norm);
    }
    d->reduced = false;
    if (rc) return rc;
    t->opt.step = d->s.step;
    d->gather = true;
    d->sum = sum;
    return 0;
}

int trainer__dopt_gather_bucket(trainer *t, cm_comm *g, int b) {
    dopt_state *s = bucket_state(t, &b);
    return dopt_gather_bucket(s, g, b);
}

/* The all-gather of the updated shards, when one is due; host: then wait for it where it is
 * queued on the backend's stream, so that the host may read the parameters. */
static int gather(trainer *t, bool host) {
    tr_dopt *d = t->dopt;
    if (!d) return 0;
    int rc = 0;
    if (d->gather) {
        if (trainer__pgather_pending(t)) { /* (the thread gathers both layouts' buckets) */
            rc = trainer__pgather_finish(t);
        } else {
            rc = dopt_gather(&d->s, step_group(t));
            if (!rc && d->ex) rc = dopt_gather(&d->xs, t->g.edp);
            d->queued = !rc; /* (dopt_gather queues it on CUDA with NCCL; elsewhere it has ended) */
        }
        if (rc) return rc;
        d->gather = false;
        gpt_sync_bf16(t->model);
        if (d->sum) *d->sum = gpt_weights_checksum(t->model);
        d->sum = NULL;
    }
    if (host && d->queued) {
        t->be->ops->sync(t->be);
        d->queued = false;
        rc = kb_backend_status(t->be);
    }
    return rc;
}

int trainer__dopt_gather_start(trainer *t) {
    tr_dopt *d = t->dopt;
    /* (--overlap-param-gather: on a thread, waited for by the next forward) */
    if (d && d->gather && t->pg && tr_groups_grad(&t->g)) return trainer__pgather_start(t);
    /* (queued on the stream ahead of the next forward's kernels: no wait of the host) */
    return gather(t, false);
}

int trainer__dopt_sync(trainer *t) { return gather(t, true); }

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
    kb_backend *be = t->be;
    size_t n = d->s.L.total + (d->ex ? d->xs.L.total : 0);
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

/* The rank's own shard and its copy of the neighbour's from the full moments (the state's
 * part of the buffer starting at base). */
static int scatter_state(trainer *t, dopt_state *s, size_t base) {
    const dopt_layout *L = &s->L;
    int n = L->dp, rc = 0;
    float *pm = malloc(3 * L->shard_total * sizeof(float) + sizeof(float));
    if (!pm) return co_err_set(CO_ENOMEM, "distributed optimizer: out of memory");
    float *pv = pm + L->shard_total, *pp = pv + L->shard_total;
    t->be->ops->sync(t->be); /* (the host reads the loaded moments and parameters) */
    int shards[2] = {s->rank, (s->rank + n - 1) % n};
    for (int j = 0; j < (s->opt.redundant ? 2 : 1) && !rc; j++) {
        for (int b = 0; b < L->nbuckets; b++) {
            const dopt_bucket *B = &L->buckets[b];
            size_t at = base + B->start + (size_t)shards[j] * B->shard;
            memcpy(pm + B->shard_base, t->opt.m + at, B->shard * sizeof(float));
            memcpy(pv + B->shard_base, t->opt.v + at, B->shard * sizeof(float));
            memcpy(pp + B->shard_base, gpt_params(t->model) + at, B->shard * sizeof(float));
        }
        dopt_shard_view v = {.shard = shards[j], .n = L->shard_total, .m = pm, .v = pv, .step = t->opt.step};
        rc = dopt_shard_restore(s, &v, pp);
    }
    free(pm);
    return rc;
}

int trainer_dopt_moments_end(trainer *t, bool scatter) {
    tr_dopt *d = t->dopt;
    if (!d) return 0;
    kb_backend *be = t->be;
    int rc = 0;
    if (scatter && t->opt.m && t->opt.v) {
        /* every rank read the whole moments: its own shard and its copy of the neighbour's
         * (with expert parallelism of both states) */
        rc = scatter_state(t, &d->s, 0);
        if (!rc && d->ex) rc = scatter_state(t, &d->xs, d->s.L.total);
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
static int repartition_if_resized(trainer *t, bool held, bool *done);

static int handover_state(trainer *t, dopt_state *s, cm_comm *g, bool held) {
    const dopt_layout *L = &s->L;
    int n = L->dp, me = g->rank, nslots = s->opt.redundant ? 2 : 1;
    if (g->size != n)
        return co_err_set(CO_EINVAL, "distributed optimizer: shards for %d data-parallel ranks, the new group has %d "
                                     "(load the checkpoint instead)", n, g->size);
    int32_t mine[2] = {held ? s->rank : -1, held && s->opt.redundant ? (s->rank + n - 1) % n : -1};
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
    free(all);
    free(buf);
    return rc;
}

int trainer__dopt_handover(trainer *t, bool held) {
    tr_dopt *d = t->dopt;
    cm_comm *g = tr_groups_grad(&t->g);
    if (!d || !g) return 0;
    bool done = false; /* (--elastic: a new data-parallel size re-partitions the shards instead) */
    int rc = repartition_if_resized(t, held, &done);
    if (rc || done) return rc;
    d = t->dopt;
    d->held = d->held && held; /* (a survivor behind the iteration all resume from holds nothing) */
    rc = handover_state(t, &d->s, g, d->held);
    /* the experts' shards over their expert-data-parallel group */
    if (!rc && d->ex && t->g.edp) rc = handover_state(t, &d->xs, t->g.edp, d->held);
    d->held = !rc;
    if (!rc) {
        /* the rest of the parameters from the shards' owners (the root's full buffer may be
         * stale where an abort interrupted its last all-gather) */
        d->gather = true;
        d->sum = NULL;
        rc = trainer__dopt_sync(t);
    }
    return rc;
}

/* ---- --elastic: the shards re-partitioned in memory over a new data-parallel size ----
 * A shrink or a grow changes the group's size, so the layout (buckets padded to lcm(dp, 128),
 * split into dp shards) changes with it. Every old shard's parameters and moments go, from the
 * lowest rank holding it (its owner or, with redundancy, the next rank's copy), into one
 * canonical order (each tensor's elements in table order, the same in every layout), summed
 * over the new group (each element from one rank, zeros from the others: exact); the ranks
 * still in the old layout lay the model out anew, and every rank takes its new shard and copy
 * from the canonical state. A shard nobody holds fails (as a handover's does). */

/* Each tensor's elements in table order from full (the model's layout) into c, or back (to_full). */
static void canonical(const gpt_model *m, float *full, float *c, bool to_full) {
    const gpt_tensor *tab = gpt_tensors((gpt_model *)m);
    size_t at = 0;
    for (int i = 0; i < gpt_num_tensors((gpt_model *)m); i++) {
        if (to_full) memcpy(full + tab[i].offset, c + at, tab[i].numel * sizeof(float));
        else memcpy(c + at, full + tab[i].offset, tab[i].numel * sizeof(float));
        at += tab[i].numel;
    }
}

/* This rank's old shards (k, the ones it is the lowest holder of) into the canonical state c
 * ([3N]: parameters, m, v). all: every rank's {own shard, copy, its layout's dp}. */
static int contribute(trainer *t, const int32_t *all, int nranks, int nold, float *c, size_t N) {
    dopt_state *s = &t->dopt->s;
    const dopt_layout *L = &s->L;
    size_t S = L->shard_total;
    float *full = calloc(3 * L->total + 1, sizeof(float)), *sp = malloc((S + 1) * sizeof(float));
    int rc = full && sp ? 0 : co_err_set(CO_ENOMEM, "distributed optimizer: re-partitioning: out of memory");
    for (int k = 0; k < nold && !rc; k++) {
        int src = -1;
        for (int r = 0; r < nranks && src < 0; r++)
            if (all[3 * r + 2] == nold && (all[3 * r] == k || all[3 * r + 1] == k)) src = r;
        if (src < 0) {
            rc = co_err_set(CO_ENOENT, "distributed optimizer: re-partitioning over %d ranks: no rank holds optimizer "
                                       "shard %d of %d (its owner and its copy's holder both left)", nranks, k, nold);
            break;
        }
        if (src != tr_groups_grad(&t->g)->rank) continue;
        dopt_shard_view v;
        if ((rc = dopt_shard_view_get(s, k, &v, sp))) break;
        for (int b = 0; b < L->nbuckets; b++) {
            const dopt_bucket *B = &L->buckets[b];
            size_t at = B->start + (size_t)k * B->shard, n = B->shard * sizeof(float);
            memcpy(full + at, sp + B->shard_base, n);
            memcpy(full + L->total + at, v.m + B->shard_base, n);
            memcpy(full + 2 * L->total + at, v.v + B->shard_base, n);
        }
    }
    for (int q = 0; q < 3 && !rc && all[3 * tr_groups_grad(&t->g)->rank + 2] == nold; q++)
        canonical(t->model, full + (size_t)q * L->total, c + (size_t)q * N, false);
    free(full);
    free(sp);
    return rc;
}

static int repartition_if_resized(trainer *t, bool held, bool *done) {
    tr_dopt *d = t->dopt;
    cm_comm *g = tr_groups_grad(&t->g);
    *done = false;
    if (!t->cfg.elastic) return 0;
    /* (every rank takes the same path: one whose layout is not the group's makes all re-partition) */
    double resized = d->s.L.dp != g->size;
    int rc = g->ops->allreduce_sum(g, &resized, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    if (rc || resized == 0) return rc;
    *done = true;
    dopt_state *s = &d->s;
    bool have = d->held && held && s->L.dp != g->size; /* (a joining rank holds nothing) */
    int32_t mine[3] = {have ? s->rank : -1, have && s->opt.redundant ? (s->rank + s->L.dp - 1) % s->L.dp : -1,
                       have ? s->L.dp : 0};
    int32_t *all = malloc(sizeof *all * 3 * (size_t)g->size);
    size_t N = 0;
    for (int i = 0; i < gpt_num_tensors(t->model); i++) N += gpt_tensors(t->model)[i].numel;
    float *c = calloc(3 * N + 1, sizeof(float));
    rc = all && c ? 0 : co_err_set(CO_ENOMEM, "distributed optimizer: re-partitioning: out of memory");
    if (!rc) rc = g->ops->allgather(g, mine, all, sizeof mine, TRAIN_COMM_TIMEOUT_MS);
    int nold = 0;
    for (int r = 0; !rc && r < g->size; r++) nold = all[3 * r + 2] > nold ? all[3 * r + 2] : nold;
    if (!rc && !nold) rc = co_err_set(CO_ENOENT, "distributed optimizer: re-partitioning: no rank holds the state");
    if (!rc) rc = contribute(t, all, g->size, nold, c, N);
    if (!rc) rc = g->ops->allreduce_sum(g, c, 3 * N, CM_F32, TRAIN_COMM_TIMEOUT_MS);
    if (!rc && d->s.L.dp != g->size) { /* the model laid out anew for the group's size */
        int64_t step = t->opt.step; /* (the setup starts the optimizer's fields afresh) */
        trainer__dopt_free(t);
        rc = trainer__dopt_setup(t, false);
        t->opt.step = step;
        /* the overlapped reduction's and gather's buckets are the new layout's (no thread of
         * theirs runs between generations) */
        if (!rc && t->ovl) {
            trainer__overlap_free(t);
            rc = trainer__overlap_setup(t);
        }
        if (!rc && t->pg) {
            trainer__pgather_free(t);
            rc = trainer__pgather_setup(t);
        }
    }
    if (!rc) {
        canonical(t->model, gpt_params(t->model), c, true);
        gpt_sync_bf16(t->model);
        rc = trainer_dopt_moments_begin(t);
    }
    if (!rc) {
        canonical(t->model, t->opt.m, c + N, true);
        canonical(t->model, t->opt.v, c + 2 * N, true);
        rc = trainer_dopt_moments_end(t, true); /* (this rank's shard and its copy of the neighbour's) */
    } else {
        trainer_dopt_moments_end(t, false);
    }
    if (!rc && t->log) {
        fprintf(t->log, "cohort: distributed optimizer: %d shards re-partitioned in memory over %d data-parallel "
                        "ranks\n", nold, g->size);
        fflush(t->log);
    }
    free(all);
    free(c);
    return rc;
}
