/* ckpt.c - a rank's checkpoints (see ckpt.h): what a checkpoint of
 * the trainer holds, loading with fallback, and the saving hook.
 *
 * Resuming is exact because everything random is keyed, not stateful: dropout masks hash
 * (seed, iteration, micro batch), the data order is a function of the seed and the
 * consumed-samples position, and the initialisation generator is not used after init. So
 * the generators' state is the seed plus the iteration, and the data iterators' state is
 * the consumed samples of each split (global, so it survives a change of data-parallel
 * size). The log accumulators travel too, so the first log line after a resume averages
 * the same iterations as an uninterrupted run. */
#include "worker/ckpt.h"
#include "worker/ckpt_parts.h"

#include "checkpoint/ckpt.h"
#include "common/error.h"
#include "optim/adamw.h"
#include "optim/lr.h"
#include "supervisor/ckpt_interval.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct wk_ckpt {
    trainer *t;
    FILE *log;
    co_config cfg;
    ck_saver *saver;
    int64_t last_saved;      /* iteration saved or loaded last (not saved again) */
    json_t *config_json;
    wk_parts save, load;     /* every shard's parts; this rank's (ckpt_parts.h) */
    int *writer_group, groups; /* each writer's model shard */
    int tp, tp_rank, pp, pp_rank;
    double stall_total;
    int saves;
    int world;               /* ranks (writers of a save): tensor x data-parallel size */
    /* the rerun state machine's state: saved with each checkpoint, handed back after load */
    int (*rerun_save)(void *ctx, char *buf, size_t n);
    void *rerun_ctx;
    char *loaded_rerun;      /* the loaded checkpoint's "rerun_state_machine" (JSON text) */
    int rank;                /* this rank (its writer index) */
    int64_t loaded_it;       /* the iteration the latest load() read (-1: none) */
    cm_comm *agree;          /* the world a load agrees over (NULL: one rank) */
    int agree_timeout_ms;
    ck_coord coord;          /* the supervisor's coordinator (have_coord) */
    bool have_coord, stop_told;
    /* --save-interval auto in one process (several take the supervisor's order, as a verdict) */
    ci_auto ci;
    double last_hook_s;      /* when the previous iteration's hook ran, and at which iteration */
    int64_t last_hook_it;
    double step_s;           /* the step time, smoothed */
};

/* ---- what the trainer's checkpoint holds ---------------------------------------------- */

static json_t *config_to_json(const co_config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    co_config_write_json(c, f);
    fclose(f);
    json_t *j = json_loadb(text, len, 0, NULL);
    free(text);
    return j;
}

static void lr_from_config(const co_config *c, lr_schedule *s) {
    /* as trainer_new builds it */
    s->max_lr = c->lr;
    s->min_lr = c->min_lr;
    s->init_lr = c->lr_warmup_init;
    s->decay_iters = c->lr_decay_iters;
    s->warmup_iters = c->lr_warmup_fraction >= 0 ? (int64_t)(c->lr_warmup_fraction * (double)c->lr_decay_iters)
                                                 : c->lr_warmup_iters;
    s->wsd_decay_iters = c->lr_wsd_decay_iters;
    s->style = (lr_style)lr_style_parse(c->lr_decay_style);
    s->wsd_style = (lr_wsd_style)lr_wsd_style_parse(c->lr_wsd_decay_style);
}

static json_t *lr_json(const co_config *c, int64_t it, int64_t consumed) {
    lr_schedule s;
    lr_from_config(c, &s);
    double lr = lr_at(&s, it);
    if (c->rampup_start > 0) { /* a batch ramp-up's schedule counts samples (the trainer's lr_samples) */
        lr_schedule q = s;
        q.decay_iters = c->lr_decay_samples > 0 ? c->lr_decay_samples : c->train_samples;
        q.warmup_iters = c->lr_warmup_fraction >= 0 ? (int64_t)(c->lr_warmup_fraction * (double)q.decay_iters)
                                                    : c->lr_warmup_samples;
        lr = lr_at(&q, consumed);
    }
    return json_pack("{sfsfsfsssIsIsIsssIsIsf}", "max_lr", s.max_lr, "min_lr", s.min_lr, "init_lr", s.init_lr,
                     "decay_style", c->lr_decay_style, "warmup_iters", (json_int_t)s.warmup_iters, "decay_iters",
                     (json_int_t)s.decay_iters, "wsd_decay_iters", (json_int_t)s.wsd_decay_iters, "wsd_decay_style",
                     c->lr_wsd_decay_style, "num_steps", (json_int_t)it, "num_samples", (json_int_t)consumed, "lr",
                     lr);
}

static json_t *rng_json(int64_t seed, int64_t it) {
    return json_pack("[{sssssIsI}{sssssIss}{sssssIss}]", "name", "dropout", "algorithm",
                     "splitmix64 hash of (seed, iteration, micro batch, site, element)", "seed", (json_int_t)seed,
                     "iteration", (json_int_t)it, "name", "init", "algorithm", "splitmix64 stream", "seed",
                     (json_int_t)seed, "state", "used only at initialisation", "name", "data", "algorithm",
                     "numpy RandomState (MT19937) / default_rng (PCG64) shuffles keyed by the seed", "seed",
                     (json_int_t)seed, "state", "position = consumed samples of each split");
}

static void model_info(const gpt_config *g, ck_model_info *mi) {
    mi->num_layers = g->num_layers;
    mi->hidden = g->hidden;
    mi->heads = g->heads;
    mi->kv_groups = g->kv_groups;
    mi->head_dim = g->head_dim;
    mi->ffn_hidden = g->ffn_hidden;
    mi->vocab = g->vocab;
    mi->padded_vocab = g->padded_vocab;
    mi->max_positions = g->max_positions;
    mi->rope = g->rope;
    mi->rmsnorm = g->rmsnorm;
    mi->norm_1p = g->norm_1p;
    mi->swiglu = g->swiglu;
    mi->tied = g->tied;
    mi->bias = g->bias;
    mi->norm_eps = g->norm_eps;
    mi->rotary_base = g->rotary_base;
}

/* The data-parallel size (Megatron's, the dense layout's): the world over tensor x pipeline x
 * context. (Not the world over the writer groups: with expert parallelism those are the expert
 * shards, whose groups fold the context ranks in.) */
static int data_size(const wk_ckpt *k) {
    int cp = k->cfg.context_parallel_size > 1 ? k->cfg.context_parallel_size : 1;
    int d = k->world / (k->tp * k->pp * cp);
    return d > 0 ? d : 1;
}

/* The parts again (the distributed optimizer's full moments live only around a save or a
 * load: their parts point into the buffers of that moment). */
static int parts_rebuild(wk_ckpt *k) {
    wk_parts_free(&k->save);
    wk_parts_free(&k->load);
    free(k->writer_group);
    k->writer_group = NULL;
    return wk_parts_build(k->t, k->world, k->rank, &k->save, &k->load, &k->writer_group, &k->groups);
}

static int save_parts(wk_ckpt *k);

/* --use-distributed-optimizer: each rank holds its shard of the moments and writes only its
 * pieces of them (flat ranges of the global moment tensors, under the replicated optimizer's
 * names: every data-parallel size, with or without the flag, loads them); no full moments
 * and no collective at a save. The parts are rebuilt first (a reload's rebuild pointed the
 * moments at buffers since freed), once the previous save no longer reads them. */
static int save_now(wk_ckpt *k) {
    if (!trainer_dopt_on(k->t) || k->cfg.no_save_optim) return save_parts(k);
    int rc = k->saver ? ck_saver_wait(k->saver) : 0;
    if (!rc) rc = parts_rebuild(k);
    if (!rc) rc = save_parts(k);
    return rc;
}

static int save_parts(wk_ckpt *k) {
    trainer_progress tp;
    trainer_get_progress(k->t, &tp);
    const co_config *c = &k->cfg;
    opt_adamw *o = trainer_optimizer(k->t);
    ck_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.iteration = tp.iteration;
    meta.progress = (ck_progress){tp.iteration, {tp.consumed[0], tp.consumed[1], tp.consumed[2]}, tp.skipped,
                                  tp.nan_iters, tp.loss_sum, tp.tok_sum, tp.iters_since_log,
                                  /* --fp16's loss scaler, to resume bitwise (0: none) */
                                  c->fp16 ? tp.loss_scale : 0, tp.growth_tracker, tp.hysteresis_tracker};
    meta.seed = c->seed;
    /* every rank writes (ck_plan's writers); the writer groups are the model shards */
    meta.layout = (ck_layout){k->world, k->tp, k->pp, c->context_parallel_size, data_size(k),
                              c->use_distributed_optimizer, 1, k->groups};
    meta.writer_group = k->writer_group;
    model_info(gpt_get_config(trainer_model(k->t)), &meta.model);
    if (!c->no_save_optim) {
        meta.optim.present = true;
        snprintf(meta.optim.type, sizeof meta.optim.type, "adamw");
        meta.optim.step = o->step;
        meta.optim.beta1 = o->beta1;
        meta.optim.beta2 = o->beta2;
        meta.optim.eps = o->eps;
        meta.optim.weight_decay = o->weight_decay;
        meta.optim.clip_grad = o->clip_grad;
    }
    meta.config = k->config_json;
    meta.lr_scheduler = lr_json(c, tp.iteration, tp.consumed[0]);
    meta.rng_generators = rng_json(c->seed, tp.iteration);
    if (k->rerun_save) {
        char buf[4096];
        if (!k->rerun_save(k->rerun_ctx, buf, sizeof buf)) meta.rerun_state = json_loads(buf, 0, NULL);
    }
    int n = c->no_save_optim ? k->save.nmodel : k->save.n;
    int rc = ck_saver_save(k->saver, &meta, k->save.r, n);
    json_decref(meta.lr_scheduler);
    json_decref(meta.rng_generators);
    if (meta.rerun_state) json_decref(meta.rerun_state);
    if (!rc) {
        k->last_saved = tp.iteration;
        k->stall_total += ck_saver_last_stall(k->saver);
        k->saves++;
    }
    return rc;
}

/* Before the optimizer step: an async snapshot started after the previous iteration must
 * have finished copying; the wait (usually none) counts as stall. */
static int pre_step(trainer *t, void *ctx) {
    (void)t;
    wk_ckpt *k = ctx;
    k->stall_total += ck_saver_wait_snapshot(k->saver);
    return 0;
}

/* A save that training waits for, timed: the logging rank adds a metrics record of the time
 * it blocked training ({"event":"checkpoint_save",...}: the supervisor's goodput accounting). */
static int save_timed(wk_ckpt *k, int64_t it) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = save_now(k);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    FILE *ms = trainer_metrics_stream(k->t);
    double blocking = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!rc) ci_save(&k->ci.est, blocking);
    if (!rc && ms) {
        fprintf(ms, "{\"event\":\"checkpoint_save\",\"iteration\":%" PRId64 ",\"blocking_seconds\":%.6f}\n", it,
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        fflush(ms);
    }
    return rc;
}

/* Whether the supervisor stopped saves (its answer to a commit said the save directory is
 * running out of space). The previous save's answer carries it: with --async-save that save
 * is waited for first, so that every rank decides alike. */
static int saves_stopped(wk_ckpt *k, int64_t it, bool *stop) {
    *stop = false;
    if (!k->have_coord || !k->coord.stopped) return 0;
    int rc = k->cfg.async_save && k->saver ? ck_saver_wait(k->saver) : 0;
    if (rc) return rc;
    *stop = k->coord.stopped(k->coord.ctx);
    if (*stop && !k->stop_told && k->log) {
        fprintf(k->log, "cohort: checkpoint at iteration %" PRId64 " not saved: the supervisor stopped saving (the "
                        "save directory %s is running out of space); training goes on\n", it, k->cfg.save);
        fflush(k->log);
    }
    if (*stop) k->stop_told = true;
    return 0;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --save-interval auto: whether iteration it is followed by a checkpoint. Under a supervisor
 * its verdict says (every rank gets the same one); one process decides from its own save
 * costs and step time (supervisor/ckpt_interval.h). */
static bool auto_due(wk_ckpt *k, trainer *t, int64_t it) {
    if (k->have_coord) return trainer_save_ordered(t);
    double now = mono_s();
    if (k->last_hook_s > 0 && it > k->last_hook_it) {
        double s = (now - k->last_hook_s) / (double)(it - k->last_hook_it);
        k->step_s = k->step_s > 0 ? 0.9 * k->step_s + 0.1 * s : s;
    }
    k->last_hook_s = now, k->last_hook_it = it;
    bool changed = false, due = ci_auto_due(&k->ci, it, now, k->step_s, &changed);
    if (changed && k->log) {
        char why[400];
        ci_auto_describe(&k->ci, k->step_s, why, sizeof why);
        fprintf(k->log, "cohort: --save-interval auto: a checkpoint every %s\n", why);
        fflush(k->log);
    }
    return due;
}

static int hook(trainer *t, void *ctx, bool final, train_end why) {
    wk_ckpt *k = ctx;
    int64_t it = trainer_iteration(t);
    int rc = 0;
    bool stop = false;
    if (!final) {
        /* at --save-interval, and, as Megatron, before a batch ramp-up's next step changes the
         * number of micro batches */
        bool ramp = trainer_batch_changes(t) && it > 0;
        bool due = k->cfg.save_interval == CO_SAVE_INTERVAL_AUTO ? auto_due(k, t, it)
                   : k->cfg.save_interval > 0                     ? it % k->cfg.save_interval == 0
                                                                  : false;
        if ((due || ramp) && it != k->last_saved && !(rc = saves_stopped(k, it, &stop)) && !stop &&
            !(rc = trainer_params_sync(t)))
            rc = save_timed(k, it);
    } else {
        if (why != TRAIN_NAN && it > 0 && it != k->last_saved && !(rc = saves_stopped(k, it, &stop)) && !stop &&
            !(rc = trainer_params_sync(t))) /* (a save reads the parameters whole: a gather in flight ends first) */
            rc = save_now(k);
        int w = ck_saver_wait(k->saver);
        if (!rc) rc = w;
        if (!rc && k->cfg.async_save && k->saves && k->log) {
            fprintf(k->log, "cohort: --async-save blocked training %.3f s per checkpoint on average (%d saves)\n",
                    k->stall_total / k->saves, k->saves);
            fflush(k->log);
        }
    }
    if (rc) ck_err_wrap(rc, "checkpoint save");
    return rc;
}

/* ---- --use-checkpoint-args and the seed ----------------------------------------------- */

/* The flags --use-checkpoint-args takes from the checkpoint: those that shape the model's
 * tensors (the mixture of experts' and multi-token prediction's too), in the order the
 * log lists them. */
static const char *const checkpoint_args[] = {
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention",
    "num-query-groups", "kv-channels", "seq-length", "max-position-embeddings", "position-embedding-type",
    "rotary-base", "normalization", "norm-epsilon", "swiglu", "untie-embeddings-and-output-weights",
    "disable-bias-linear", "make-vocab-size-divisible-by", "tokenizer-type", "vocab-size",
    "num-experts", "moe-layer-freq", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size", "moe-router-topk",
    "moe-router-score-function", "moe-router-pre-softmax", "moe-router-enable-expert-bias", "moe-router-num-groups",
    "moe-router-group-topk", "moe-router-topk-scaling-factor", "mtp-num-layers", NULL};

/* One flag taken from the checkpoint, for the log. */
static void took_arg(void *ctx, const char *name, const char *value) {
    FILE *log = ctx;
    if (log) fprintf(log, "  --%s %s from the checkpoint\n", name, value);
}

static int check_step(const char *load_dir, int64_t want);

int wk_ckpt_prepare(co_config *c, FILE *log) {
    if (!c->load[0]) return 0;
    bool want_args = c->use_checkpoint_args, want_seed = !c->no_load_rng && !c->finetune;
    if (!want_args && !want_seed) return 0;
    int64_t *its = NULL;
    int n = 0;
    int64_t want = c->ckpt_step >= 0 && co_config_was_set(c, "ckpt-step") ? c->ckpt_step : -1;
    int rc = ck_candidates(c->load, want, &its, &n);
    if (!rc && want >= 0 && check_step(c->load, want)) rc = CO_EINVAL;
    if (rc) {
        free(its);
        return 0; /* attach reports a missing checkpoint */
    }
    ck_manifest *m = NULL;
    for (int i = 0; i < n && !m; i++) {
        char dir[4200];
        ck_iter_dir(dir, sizeof dir, c->load, its[i]);
        if (ck_read_manifest(dir, &m)) m = NULL;
        if (c->refuse_corrupt_checkpoint) break;
    }
    free(its);
    if (!m) return 0;
    if (want_args) {
        if (log) fprintf(log, "cohort: --use-checkpoint-args: model flags from %s iteration %" PRId64 "\n", c->load, m->iteration);
        if (co_config_read_json(c, json_object_get(m->doc, "config"), checkpoint_args, took_arg, log) && log)
            fprintf(log, "cohort: --use-checkpoint-args: %s\n", co_err_detail());
    }
    if (want_seed && m->seed != c->seed) {
        if (log)
            fprintf(log, "cohort: --seed %" PRId64 " replaced by the checkpoint's seed %" PRId64
                         " (the generators' state; --no-load-rng keeps --seed)\n", c->seed, m->seed);
        c->seed = m->seed;
    }
    if (log) fflush(log);
    ck_manifest_free(&m);
    return 0;
}

/* ---- load ----------------------------------------------------------------------------- */

/* --ckpt-step N names one iteration: its directory must exist (no silent fallback to the
 * newest). CO_EINVAL naming the iterations that are there. */
static int check_step(const char *load_dir, int64_t want) {
    char dir[4200];
    struct stat st;
    ck_iter_dir(dir, sizeof dir, load_dir, want);
    if (!stat(dir, &st) && S_ISDIR(st.st_mode)) return 0;
    int64_t *its = NULL;
    int n = 0;
    char have[512] = "";
    if (!ck_list_iterations(load_dir, &its, &n))
        for (int i = 0; i < n && strlen(have) < sizeof have - 32; i++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%" PRId64, i ? ", " : "", its[i]);
    free(its);
    return co_err_set(CO_EINVAL, "--ckpt-step %" PRId64 ": %s has no checkpoint at iteration %" PRId64 " (%s%s)", want,
                      load_dir, want, n ? "it has " : "it has none", have);
}

/* Layers [0, n) as '0'/'1' characters (MoE: 1), the first 64 and "..." past them. */
static void moe_layers_text(const co_config *c, int n, char *buf) {
    int k = 0;
    for (; k < n && k < 64; k++) buf[k] = co_config_moe_layer(c, k) ? '1' : '0';
    strcpy(buf + k, n > 64 ? "..." : "");
}

/* --moe-layer-freq against the checkpoint's (the integer or Megatron's list form), layer by
 * layer; not where either side has no MoE layers (the expert count says it). */
static void check_moe_layers(json_t *conf, const co_config *c, char *msg, size_t len) {
    static const char *const only[] = {"moe-layer-freq", NULL};
    json_t *ne = json_object_get(conf, "num-experts");
    if (!c->num_experts || !json_is_integer(ne) || !json_integer_value(ne) || !json_object_get(conf, "moe-layer-freq"))
        return;
    co_config *k = malloc(sizeof *k);
    if (!k) return;
    co_config_defaults(k);
    bool differ = false;
    if (!co_config_read_json(k, conf, only, NULL, NULL))
        for (int l = 0; l < c->num_layers && !differ; l++)
            differ = co_config_moe_layer(k, l) != co_config_moe_layer(c, l);
    if (differ) {
        char a[72], b[72];
        moe_layers_text(k, c->num_layers, a);
        moe_layers_text(c, c->num_layers, b);
        size_t at = strlen(msg);
        snprintf(msg + at, len - at, "%scheckpoint has MoE layers %s (1: MoE), --moe-layer-freq gives %s",
                 at ? "; " : "", a, b);
    }
    co_config_free(k);
    free(k);
}

/* The mixture of experts and MTP: the flags that shape the model's tensors, from the
 * checkpoint's flags (its "config"; the manifest's "model" has no MoE fields), each
 * difference appended to msg. */
static void check_moe(json_t *conf, const co_config *c, char *msg, size_t len) {
    static const struct { const char *key, *what; size_t off; } ints[] = {
        {"num-experts", "%lld experts", offsetof(co_config, num_experts)},
        {"moe-ffn-hidden-size", "expert hidden size %lld", offsetof(co_config, moe_ffn_hidden_size)},
        {"moe-shared-expert-intermediate-size", "shared expert size %lld",
         offsetof(co_config, moe_shared_expert_intermediate_size)},
        {"mtp-num-layers", "%lld MTP layers", offsetof(co_config, mtp_num_layers)},
    };
    if (!json_is_object(conf)) return;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = json_object_get(conf, ints[i].key);
        int want = *(const int *)((const char *)c + ints[i].off);
        if (!json_is_integer(v) || json_integer_value(v) == want) continue;
        char h[96];
        snprintf(h, sizeof h, ints[i].what, (long long)json_integer_value(v));
        size_t at = strlen(msg);
        snprintf(msg + at, len - at, "%scheckpoint has %s, --%s is %d", at ? "; " : "", h, ints[i].key, want);
    }
    check_moe_layers(conf, c, msg, len);
    json_t *b = json_object_get(conf, "moe-router-enable-expert-bias");
    if (json_is_boolean(b) && json_is_true(b) != c->moe_router_enable_expert_bias && c->num_experts > 0) {
        size_t at = strlen(msg);
        snprintf(msg + at, len - at, "%scheckpoint has %s expert bias, the flags %s one (--moe-router-enable-expert-bias)",
                 at ? "; " : "", json_is_true(b) ? "an" : "no", c->moe_router_enable_expert_bias ? "add" : "drop");
    }
}

/* The checkpoint's model (its manifest's "model") against the one the flags built: every
 * difference named, CO_EINVAL. */
static int check_model(const ck_manifest *m, const co_config *c, const gpt_config *g, const char *dir) {
    ck_model_info want;
    model_info(g, &want);
    const ck_model_info *have = &m->model;
    char msg[1500] = "";
#define DIFF_INT(field, what, flag)                                                                          \
    if (have->field != want.field) {                                                                        \
        char h_[64];                                                                                         \
        snprintf(h_, sizeof h_, what, have->field);                                                          \
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%scheckpoint has %s, %s is %d",               \
                 msg[0] ? "; " : "", h_, flag, want.field);                                                  \
    }
#define DIFF_BOOL(field, yes, no, flag)                                                                      \
    if (have->field != want.field)                                                                          \
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%scheckpoint has %s, the flags (%s) give %s", \
                 msg[0] ? "; " : "", have->field ? yes : no, flag, want.field ? yes : no)
    DIFF_INT(num_layers, "%d layers", "--num-layers");
    DIFF_INT(hidden, "hidden size %d", "--hidden-size");
    DIFF_INT(heads, "%d attention heads", "--num-attention-heads");
    DIFF_INT(kv_groups, "%d query groups", "--num-query-groups");
    DIFF_INT(head_dim, "head size %d", "--kv-channels");
    DIFF_INT(ffn_hidden, "FFN hidden size %d", "--ffn-hidden-size");
    DIFF_INT(vocab, "a vocabulary of %d", "the tokenizer's (--tokenizer-type/--vocab-size/--vocab-file)");
    /* (the padded vocabulary may differ: another tensor-parallel size; load_refs) */
    DIFF_INT(max_positions, "%d positions", "--max-position-embeddings");
    DIFF_BOOL(rope, "rotary positions", "learned positions", "--position-embedding-type");
    DIFF_BOOL(rmsnorm, "RMSNorm", "LayerNorm", "--normalization");
    DIFF_BOOL(norm_1p, "norm weights stored as w - 1", "norm weights stored as w", "--apply-layernorm-1p");
    DIFF_BOOL(swiglu, "SwiGLU", "GeLU", "--swiglu");
    DIFF_BOOL(tied, "tied embeddings", "untied embeddings", "--untie-embeddings-and-output-weights");
    DIFF_BOOL(bias, "linear biases", "no linear biases", "--disable-bias-linear");
#undef DIFF_INT
#undef DIFF_BOOL
    check_moe(json_object_get(m->doc, "config"), c, msg, sizeof msg);
    if (!msg[0]) return 0;
    return co_err_set(CO_EINVAL, "%s: the checkpoint's model differs from the flags: %s (--use-checkpoint-args takes "
                                 "the checkpoint's model flags)", dir, msg);
}

/* Every tensor of the kinds being loaded must be one the model has (ck_load_tensors checks
 * the other direction, shapes and dtypes). */
static int check_extra(const ck_manifest *m, const ck_tensor_ref *refs, int n, bool optim, const char *dir) {
    for (int i = 0; i < m->ntensors; i++) {
        const ck_mtensor *t = &m->tensors[i];
        if (t->kind == CK_KIND_OPTIM && !optim) continue;
        bool found = false;
        for (int j = 0; j < n && !found; j++) found = !strcmp(refs[j].name, t->name);
        if (!found)
            return co_err_set(CO_EINVAL, "%s: the checkpoint has tensor %s, which the model does not have (a different "
                                         "model? --use-checkpoint-args takes the checkpoint's model flags)", dir, t->name);
    }
    return 0;
}

static void warn_schedule(wk_ckpt *k, const ck_manifest *m) {
    json_t *rs = json_object_get(m->doc, "rerun_state_machine");
    free(k->loaded_rerun);
    k->loaded_rerun = json_is_object(rs) ? json_dumps(rs, JSON_COMPACT) : NULL;
    json_t *ls = json_object_get(m->doc, "lr_scheduler");
    if (!json_is_object(ls) || !k->log) return;
    lr_schedule s;
    lr_from_config(&k->cfg, &s);
    json_t *mx = json_object_get(ls, "max_lr"), *mn = json_object_get(ls, "min_lr"), *st = json_object_get(ls, "decay_style"),
           *wu = json_object_get(ls, "warmup_iters"), *di = json_object_get(ls, "decay_iters");
    bool same = json_is_number(mx) && json_number_value(mx) == s.max_lr && json_is_number(mn) &&
                json_number_value(mn) == s.min_lr && json_is_string(st) &&
                !strcmp(json_string_value(st), k->cfg.lr_decay_style) && json_is_integer(wu) &&
                json_integer_value(wu) == s.warmup_iters && json_is_integer(di) && json_integer_value(di) == s.decay_iters;
    if (!same)
        fprintf(k->log, "cohort: note: the learning-rate schedule differs from the checkpoint's; using the command line's\n");
}

/* Loads the first n references from the checkpoint m in dir. Where the checkpoint's padded
 * vocabulary (Vc rows) differs from the model's (Vp: another tensor-parallel size or
 * --make-vocab-size-divisible-by), the vocabulary tensors and their moments take the
 * checkpoint's rows below both, rows the model has beyond Vc become copies of the
 * checkpoint's last row (Megatron's checkpoint converter pads so: a padded row stays one, its
 * logit pushed down like the others), and the checkpoint's rows beyond Vp are dropped. The
 * tokenizer's rows are never among them (check_model: the vocabularies are equal). */
static int load_refs(wk_ckpt *k, const ck_manifest *m, const char *dir, bool optim, ck_bad *bad) {
    const ck_tensor_ref *refs = k->load.r;
    int n = optim ? k->load.n : k->load.nmodel;
    int Vc = m->model.padded_vocab, Vp = gpt_get_config(trainer_model(k->t))->padded_vocab;
    ck_tensor_ref *lr = calloc((size_t)(2 * n + 1), sizeof *lr);
    int *fill_of = calloc((size_t)(n + 1), sizeof *fill_of);
    float *last = NULL;
    int64_t cols = 0;
    for (int i = 0; i < n; i++)
        if (gpt_tensor_is_vocab(refs[i].name)) cols = refs[i].shape[1];
    if (cols > 0 && Vc != Vp) last = calloc((size_t)n * (size_t)cols, sizeof *last);
    if (!lr || !fill_of || (cols > 0 && Vc != Vp && !last)) {
        free(lr), free(fill_of), free(last);
        return co_err_set(CO_ENOMEM, "loading %s: out of memory", dir);
    }
    /* this rank's parts only (the others' are listed for saving) */
    int nl = 0, *of = calloc((size_t)(n + 1), sizeof *of);
    if (!of) {
        free(lr), free(fill_of), free(last);
        return co_err_set(CO_ENOMEM, "loading %s: out of memory", dir);
    }
    for (int i = 0; i < n; i++)
        if (refs[i].dst) of[nl++] = i;
    int nmine = nl;
    for (int j = 0; j < nmine; j++) {
        int i = of[j];
        lr[j] = refs[i];
        fill_of[j] = -1;
        ck_tensor_ref *r = &lr[j];
        if (Vc == Vp || !gpt_tensor_is_vocab(r->name) || r->ndim != 2) continue;
        if (!r->region) {
            r->region = true;
            r->offsets[0] = r->offsets[1] = 0;
            r->rshape[0] = r->shape[0];
            r->rshape[1] = r->shape[1];
        }
        int64_t a = r->offsets[0], len = r->rshape[0];
        r->shape[0] = Vc;
        if (a >= Vc) { /* all of it past the checkpoint's rows: nothing to read */
            r->dst = NULL;
            r->offsets[0] = r->rshape[0] = 0;
        } else if (a + len > Vc) {
            r->rshape[0] = Vc - a;
        }
        if (a + len > Vc) { /* rows to fill: the checkpoint's last row first */
            ck_tensor_ref *e = &lr[nl];
            *e = *r;
            e->offsets[0] = Vc - 1;
            e->offsets[1] = 0;
            e->rshape[0] = 1;
            e->rshape[1] = cols;
            e->dst = last + (size_t)j * (size_t)cols;
            fill_of[j] = nl++;
        }
    }
    int rc = ck_load_tensors(dir, m, lr, nl, bad);
    for (int j = 0; j < nmine && !rc; j++) {
        if (fill_of[j] < 0) continue;
        const ck_tensor_ref *r = &refs[of[j]];
        int64_t a = r->region ? r->offsets[0] : 0, len = r->region ? r->rshape[0] : r->shape[0];
        for (int64_t row = a > Vc ? a : Vc; row < a + len; row++)
            memcpy(r->dst + (row - a) * cols, last + (size_t)j * (size_t)cols, (size_t)cols * sizeof(float));
    }
    if (!rc && Vc != Vp && k->log) {
        fprintf(k->log, "cohort: note: the checkpoint's padded vocabulary has %d rows, this run's %d (%d x tensor-parallel "
                        "size %d): %s; the padded rows' share of the softmax changes the loss\n", Vc, Vp,
                k->cfg.make_vocab_size_divisible_by, k->tp,
                Vc < Vp ? "the new rows are copies of the checkpoint's last row" : "its rows past the new size are dropped");
        fflush(k->log);
    }
    free(lr), free(fill_of), free(last), free(of);
    return rc;
}

static int load_newest(wk_ckpt *k);

/* Loads --load's newest usable checkpoint; the logging rank adds a metrics record with the
 * time it took ({"event":"checkpoint_load",...}: the supervisor's Prometheus endpoint and
 * `cohort status` read it). */
static int load(wk_ckpt *k) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    k->loaded_it = -1;
    int rc = load_newest(k);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    FILE *ms = trainer_metrics_stream(k->t);
    if (!rc && k->loaded_it >= 0 && ms) {
        fprintf(ms, "{\"event\":\"checkpoint_load\",\"iteration\":%" PRId64 ",\"seconds\":%.6f}\n", k->loaded_it,
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        fflush(ms);
    }
    return rc;
}

/* How long a rank that has read its part waits for the slowest one: the restart barrier's
 * bound (--inprocess-barrier-timeout, how long ranks wait for each other to re-enter
 * training), since a replacement rank starts its process, builds its model and reads its
 * part while the survivors wait; the training collectives' bound without in-process
 * restart. (The soft timeout, which finds a hung step, is too short for a replacement's
 * start: seconds in tests.) */
static int agree_timeout_ms(const co_config *c) {
    if (c->inprocess_restart && c->inprocess_barrier_timeout > 0 &&
        c->inprocess_barrier_timeout * 1000 < TRAIN_COMM_TIMEOUT_MS)
        return (int)(c->inprocess_barrier_timeout * 1000);
    return TRAIN_COMM_TIMEOUT_MS;
}

/* ---- one iteration for the whole job ------------------------------------------------
 * Each rank reads only its own parts of a checkpoint, so one rank may find its files corrupt
 * while the others read theirs. Before any rank keeps what it read, the ranks agree in one
 * all-gather over the world: the candidate each tried and how it went. Every rank read it:
 * done. Some rank could not read its part: every rank moves to the previous candidate
 * together. Some rank hit an error that no older checkpoint cures (the model differs from
 * the flags, --refuse-corrupt-checkpoint, no optimizer state, ranks that see different
 * checkpoints): every rank stops with that rank's code and message. Without a world (one
 * rank) the rank's own outcome is the decision. */
enum { VOTE_OK = 0, VOTE_NONE = 1, VOTE_BAD = 2, VOTE_FATAL = 3 };
typedef struct vote {
    int64_t it, n;   /* the candidate tried; round 0: the first candidate and their count */
    int32_t status;  /* VOTE_* */
    int32_t code;    /* the CO_E* code behind BAD or FATAL */
    char msg[480];   /* its detail */
} vote;

/* The job's decision from every rank's vote (mine alone without a world): the worst status,
 * with the code and message of the first rank that has it (*who). Ranks that tried different
 * candidates make it FATAL. A wait that fails (a peer died, the supervisor aborted) is
 * returned as an error. */
static int agree(wk_ckpt *k, const vote *mine, vote *out, int *who) {
    *out = *mine;
    *who = k->rank;
    if (!k->agree || k->agree->size < 2) return 0;
    int n = k->agree->size;
    vote *all = calloc((size_t)n, sizeof *all);
    if (!all) return co_err_set(CO_ENOMEM, "checkpoint: out of memory");
    int rc = k->agree->ops->allgather(k->agree, mine, all, sizeof *mine, k->agree_timeout_ms);
    if (rc) {
        char d[600];
        snprintf(d, sizeof d, "%s", co_err_detail());
        free(all);
        return co_err_set(rc, "checkpoint: waiting for the other ranks to load: %s", d);
    }
    int worst = 0;
    for (int r = 1; r < n; r++)
        if (all[r].status > all[worst].status) worst = r;
    *out = all[worst];
    *who = worst;
    for (int r = 1; r < n && out->status != VOTE_FATAL; r++) {
        if (all[r].it == all[0].it && all[r].n == all[0].n) continue;
        out->status = VOTE_FATAL;
        out->code = CO_EINVAL;
        snprintf(out->msg, sizeof out->msg, "the ranks see different checkpoints in %.200s: rank 0 tries iteration %" PRId64
                 " (of %" PRId64 "), rank %d iteration %" PRId64 " (of %" PRId64 "); is --load one shared directory?",
                 k->cfg.load, all[0].it, all[0].n, r, all[r].it, all[r].n);
        *who = r;
    }
    free(all);
    return 0;
}

static void vote_set(vote *v, int64_t it, int64_t n, int status, int code) {
    memset(v, 0, sizeof *v);
    v->it = it;
    v->n = n;
    v->status = status;
    v->code = code;
    if (status >= VOTE_BAD) snprintf(v->msg, sizeof v->msg, "%s", co_err_detail());
}

/* Reads this rank's parts of the checkpoint at iteration `it` into the trainer's buffers and
 * says in *v how it went; *m is its manifest when v is VOTE_OK. */
static void try_load(wk_ckpt *k, int64_t it, int64_t n, bool load_optim, ck_manifest **m, vote *v) {
    const co_config *c = &k->cfg;
    char dir[4200];
    ck_iter_dir(dir, sizeof dir, c->load, it);
    ck_bad bad = CK_OK;
    int rc = ck_read_manifest(dir, m);
    if (rc) bad = rc == CO_EFORMAT ? CK_BAD_FORMAT : rc == CO_ENOENT ? CK_BAD_INCOMPLETE : CK_BAD_IO;
    if (!rc && load_optim && !(*m)->optim.present) {
        rc = co_err_set(CO_EINVAL, "%s holds no optimizer state (saved with --no-save-optim); pass --no-load-optim "
                                   "or --finetune", dir);
    } else if (!rc) {
        rc = check_model(*m, &k->cfg, gpt_get_config(trainer_model(k->t)), dir);
        /* (every tensor of the checkpoint must be one of the whole model's) */
        if (!rc) rc = check_extra(*m, k->save.r, load_optim ? k->save.n : k->save.nmodel, load_optim, dir);
        if (!rc) rc = load_refs(k, *m, dir, load_optim, &bad);
    }
    if (!rc) {
        vote_set(v, it, n, VOTE_OK, 0);
        return;
    }
    ck_manifest_free(m);
    if (rc == CO_EINVAL || rc == CO_EUNSUPPORTED) { /* the model does not match: no fallback helps */
        vote_set(v, it, n, VOTE_FATAL, rc);
        return;
    }
    char detail[1200];
    snprintf(detail, sizeof detail, "%s", co_err_detail());
    const char *kind = bad == CK_BAD_CHECKSUM ? "corrupt" : bad == CK_BAD_INCOMPLETE ? "incomplete or truncated"
                       : bad == CK_BAD_FORMAT ? "malformed" : "unreadable";
    char on[32] = ""; /* (which rank read it, where there are several) */
    if (k->agree && k->agree->size > 1) snprintf(on, sizeof on, " on rank %d", k->rank);
    co_err_set(rc, "checkpoint at iteration %" PRId64 " is %s%s: %s", it, kind, on, detail);
    if (c->refuse_corrupt_checkpoint) {
        rc = co_err_set(CO_ECORRUPT, "checkpoint at iteration %" PRId64 " is %s%s: %s (refused: "
                        "--refuse-corrupt-checkpoint)", it, kind, on, detail);
        vote_set(v, it, n, VOTE_FATAL, rc);
        return;
    }
    vote_set(v, it, n, VOTE_BAD, rc);
}

/* The loaded checkpoint's position in the run, and what the log says of it. */
static void loaded(wk_ckpt *k, const ck_manifest *m, bool load_optim) {
    const co_config *c = &k->cfg;
    opt_adamw *o = trainer_optimizer(k->t);
    if (load_optim) o->step = m->optim.step;
    trainer_progress tp;
    trainer_get_progress(k->t, &tp);
    if (!c->finetune) {
        tp.iteration = m->progress.iteration;
        for (int s = 0; s < 3; s++) tp.consumed[s] = m->progress.consumed[s];
        tp.skipped = m->progress.skipped;
        tp.nan_iters = m->progress.nan_iters;
        tp.loss_sum = m->progress.loss_sum;
        tp.tok_sum = m->progress.tok_sum;
        tp.iters_since_log = m->progress.iters_since_log;
        if (c->fp16 && load_optim && m->progress.loss_scale > 0) { /* (as Megatron: part of the optimizer's state) */
            tp.loss_scale = (float)m->progress.loss_scale;
            tp.growth_tracker = m->progress.growth_tracker;
            tp.hysteresis_tracker = m->progress.hysteresis_tracker;
        }
        trainer_set_progress(k->t, &tp);
        k->last_saved = m->iteration;
        warn_schedule(k, m);
    }
    if (c->bf16 || c->fp16) gpt_sync_bf16(trainer_model(k->t));
    if (k->log) {
        if (m->layout.data != data_size(k))
            fprintf(k->log, "cohort: checkpoint written at data-parallel size %d, loaded at %d: consumed samples are "
                            "global and kept\n", m->layout.data, data_size(k));
        if (m->layout.tensor != k->tp || m->layout.pipeline != k->pp)
            fprintf(k->log, "cohort: checkpoint written at tensor x pipeline size %d x %d, loaded at %d x %d: every "
                            "rank reads its part of the global tensors\n", m->layout.tensor, m->layout.pipeline,
                    k->tp, k->pp);
        fprintf(k->log, "  successfully loaded checkpoint from %s [ t %d/%d, p %d/%d ] at iteration %" PRId64 "%s\n",
                c->load, k->tp_rank + 1, k->tp, k->pp_rank + 1, k->pp,
                c->finetune ? 0 : m->iteration, c->finetune ? " (--finetune: weights only)" : "");
        fflush(k->log);
    }
    k->loaded_it = c->finetune ? 0 : m->iteration;
}

/* The job's candidates (round 0 of the agreement): 0 with its and n (n 0: none anywhere). */
static int agree_candidates(wk_ckpt *k, int64_t **its, int *n) {
    const co_config *c = &k->cfg;
    int64_t want = co_config_was_set(c, "ckpt-step") && c->ckpt_step >= 0 ? c->ckpt_step : -1;
    *its = NULL;
    *n = 0;
    vote mine, job;
    int rc = ck_candidates(c->load, want, its, n);
    if (!rc && want >= 0 && (rc = check_step(c->load, want))) vote_set(&mine, want, 0, VOTE_FATAL, rc);
    else if (rc) vote_set(&mine, -1, 0, VOTE_NONE, rc);
    else vote_set(&mine, (*its)[0], *n, VOTE_OK, 0);
    char none[1200];
    snprintf(none, sizeof none, "%s", co_err_detail());
    int who;
    if (!(rc = agree(k, &mine, &job, &who)) && job.status == VOTE_FATAL)
        rc = co_err_set(job.code, "%s%s", job.msg, who == k->rank ? "" : " (another rank's)");
    if (!rc && job.status == VOTE_NONE) {
        free(*its);
        *its = NULL;
        *n = 0;
        if (c->exit_on_missing_checkpoint) return ck_err_wrap(CO_ENOENT, "--exit-on-missing-checkpoint");
        if (k->log) fprintf(k->log, "cohort: WARNING: %s; starting from random initialisation\n", none);
        return 0;
    }
    if (rc) {
        free(*its);
        *its = NULL;
        *n = 0;
        return rc;
    }
    int64_t tracked;
    if (want < 0 && ck_read_tracker(c->load, &tracked) && k->log)
        fprintf(k->log, "cohort: WARNING: %s; trying the newest checkpoint directory\n", co_err_detail());
    return 0;
}

static int load_newest(wk_ckpt *k) {
    const co_config *c = &k->cfg;
    int64_t *its = NULL;
    int n = 0;
    int rc = agree_candidates(k, &its, &n);
    if (rc || !n) return rc;
    bool load_optim = !c->no_load_optim && !c->finetune;
    for (int i = 0; i < n; i++) {
        if (k->log) {
            fprintf(k->log, " loading checkpoint from %s at iteration %" PRId64 "\n", c->load, its[i]);
            fflush(k->log);
        }
        ck_manifest *m = NULL;
        vote mine, job;
        int who;
        try_load(k, its[i], n, load_optim, &m, &mine);
        if ((rc = agree(k, &mine, &job, &who))) {
            ck_manifest_free(&m);
            break;
        }
        if (job.status == VOTE_OK) {
            loaded(k, m, load_optim);
            ck_manifest_free(&m);
            break;
        }
        ck_manifest_free(&m); /* some rank could not: what this one read is not used */
        rc = co_err_set(job.code, "%s", job.msg);
        if (job.status == VOTE_FATAL) break;
        if (k->log) {
            fprintf(k->log, "cohort: WARNING: %s\n", job.msg);
            fprintf(k->log, i + 1 < n ? "cohort: every rank falls back to the previous checkpoint\n"
                                      : "cohort: no older checkpoint to fall back to\n");
            fflush(k->log);
        }
        /* (none left: loading again finds the same files, so no restart cures it) */
        if (i + 1 == n) rc = co_err_set(CO_ECORRUPT, "%s; no older checkpoint to fall back to", job.msg);
    }
    free(its);
    return rc;
}

/* --async-save: room for a snapshot of the parts this rank holds. */
static int reserve_snapshot(wk_ckpt *k) {
    const co_config *c = &k->cfg;
    if (!c->async_save) return 0;
    size_t total = 0;
    int n = c->no_save_optim ? k->save.nmodel : k->save.n;
    for (int i = 0; i < n; i++) {
        const ck_tensor_ref *r = &k->save.r[i];
        const int64_t *sh = r->region ? r->rshape : r->shape;
        if (r->data && r->flat) total += (size_t)(r->flat_end - r->flat_begin); /* a shard's piece */
        else if (r->data) total += (size_t)sh[0] * (size_t)(r->ndim > 1 ? sh[1] : 1);
    }
    return ck_saver_reserve(k->saver, total);
}

/* The saver and the trainer hooks. coord NULL: this process writes every file and commits
 * (one process, or rank 0 without a coordinator); else it writes writer `rank`'s files of a
 * world-writer plan and coord commits. */
static int setup_saver(wk_ckpt *k, int rank, const ck_coord *coord) {
    const co_config *c = &k->cfg;
    ck_saver_destroy(&k->saver);
    int rc = 0;
    if (!k->config_json) {
        k->config_json = config_to_json(c);
        if (!k->config_json) return co_err_set(CO_ENOMEM, "checkpoint: cannot serialise the configuration");
    }
    ck_saver_opts so = {.save_dir = c->save, .async = c->async_save, .keep = coord ? 0 : c->most_recent_k,
                        .writers = coord ? k->world : 1, .log = k->log, .coord = coord, .writer = coord ? rank : 0};
    rc = ck_saver_new(&k->saver, &so);
    if (!rc) rc = reserve_snapshot(k);
    if (!rc) rc = trainer_set_hook(k->t, hook, k);
    if (!rc && c->async_save) rc = trainer_set_pre_step_hook(k->t, pre_step, k);
    return rc;
}

int wk_ckpt_attach(wk_ckpt **out, trainer *t, FILE *log, int rank, int world, cm_comm *agree) {
    *out = NULL;
    const co_config *c = trainer_config(t);
    if (!c->load[0] && !c->save[0]) return 0;
    wk_ckpt *k = calloc(1, sizeof *k);
    if (!k) return co_err_set(CO_ENOMEM, "checkpoint: out of memory");
    k->t = t;
    k->log = log;
    k->cfg = *c;
    k->last_saved = -1;
    ci_auto_init(&k->ci, c->expected_mtbf, c->train_iters, mono_s());
    k->world = world;
    k->rank = rank;
    k->agree = agree;
    k->agree_timeout_ms = agree_timeout_ms(c);
    trainer_model_parallel(t, &k->tp, &k->tp_rank, &k->pp, &k->pp_rank);
    /* (the distributed optimizer: the moments' parts to load point into full buffers while
     * loading, allocated only for a --load; a save writes each rank's shard) */
    bool dopt = trainer_dopt_on(t) && c->load[0];
    int rc = dopt ? trainer_dopt_moments_begin(t) : 0;
    if (!rc) rc = wk_parts_build(t, world, rank, &k->save, &k->load, &k->writer_group, &k->groups);
    if (!rc && c->load[0]) rc = load(k);
    if (dopt) {
        int rc2 = trainer_dopt_moments_end(t, !rc && c->load[0]);
        if (!rc) rc = rc2;
    }
    if (!rc && c->save[0] && rank == 0) {
        rc = ck_clean_stale(c->save);
        if (!rc) rc = setup_saver(k, rank, NULL);
    }
    if (rc) {
        char detail[1200];
        snprintf(detail, sizeof detail, "%s", co_err_detail());
        wk_ckpt_destroy(&k);
        co_err_set(rc, "%s", detail);
        return rc;
    }
    *out = k;
    return 0;
}

int wk_ckpt_reload(wk_ckpt *k, const char *dir, cm_comm *agree) {
    if (!k) return co_err_set(CO_EINVAL, "reloading %s: this rank has no checkpoint state (--save/--load)", dir);
    k->agree = agree;
    snprintf(k->cfg.load, sizeof k->cfg.load, "%s", dir);
    bool dopt = trainer_dopt_on(k->t);
    /* (an async save still writing reads the parts rebuilt below: it finishes first) */
    int rc = dopt && k->saver ? ck_saver_wait(k->saver) : 0;
    if (!rc && dopt) rc = trainer_dopt_moments_begin(k->t);
    if (!rc && dopt) rc = parts_rebuild(k);
    if (!rc) rc = load(k);
    if (dopt) {
        int rc2 = trainer_dopt_moments_end(k->t, !rc);
        if (!rc) rc = rc2;
    }
    if (!rc) trainer_state_replaced(k->t);
    return rc;
}

void wk_ckpt_set_rank(wk_ckpt *k, int rank) {
    if (!k) return;
    k->rank = rank;
    ck_saver_set_writer(k->saver, rank);
}

int wk_ckpt_set_world(wk_ckpt *k, int world, int rank) {
    if (!k || world == k->world) return 0; /* (a rank alone changes with wk_ckpt_set_rank) */
    /* (a save still writing reads the parts rebuilt below: it finishes first) */
    int rc = k->saver ? ck_saver_wait(k->saver) : 0;
    if (rc) return rc;
    k->world = world;
    k->rank = rank;
    if ((rc = parts_rebuild(k)) || !k->saver) return rc;
    ck_saver_set_writers(k->saver, k->have_coord ? world : 1, k->have_coord ? rank : 0);
    return reserve_snapshot(k);
}

int wk_ckpt_set_coordinator(wk_ckpt *k, const ck_coord *coord) {
    if (!k || !k->cfg.save[0] || k->world < 2) return 0;
    k->coord = *coord;
    k->have_coord = true;
    return setup_saver(k, k->rank, coord);
}

void wk_ckpt_destroy(wk_ckpt **p) {
    wk_ckpt *k = *p;
    if (!k) return;
    ck_saver_destroy(&k->saver);
    if (k->config_json) json_decref(k->config_json);
    wk_parts_free(&k->save);
    wk_parts_free(&k->load);
    free(k->writer_group);
    free(k->loaded_rerun);
    free(k);
    *p = NULL;
}

void wk_ckpt_set_rerun_state(wk_ckpt *k, int (*save)(void *ctx, char *buf, size_t n), void *ctx) {
    k->rerun_save = save;
    k->rerun_ctx = ctx;
}

const char *wk_ckpt_loaded_rerun_state(const wk_ckpt *k) { return k ? k->loaded_rerun : NULL; }
