/* rank.c - the rank actor's life (see rank.h). */
#include "worker/rank.h"

#include "checkpoint/ckpt.h"
#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/log.h"
#include "common/proctitle.h"
#include "kernels/backend.h"
#include "supervisor/supervisor.h"
#include "worker/ckpt.h"
#include "worker/comms.h"
#include "worker/resilience.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* This rank's own failure, at its setup or in training (rc: its CO_E* code, 0 for one that
 * is not its own, such as a state handover between ranks; status: the exit status it leads
 * to). Under a supervisor one that no restart cures (sv_incurable_status)
 * goes to the supervisor, which prints the first rank's and stops the job at once; anything
 * else is printed here and the supervisor decides from the exit. Returns status. */
static int failed(sv_link *link, int rc, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int failed(sv_link *link, int rc, int status, const char *fmt, ...) {
    char what[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!link || !sv_incurable_status(rc, status) || sv_link_fatal(link, rc, status, what))
        fprintf(stderr, "cohort train: %s\n", what);
    return status;
}

static int report_progress(trainer *t, void *ctx, bool final, train_end why) {
    (void)final;
    (void)why;
    sv_link_progress(ctx, trainer_iteration(t));
    return 0;
}

/* checkpoint: a rank's part of a save is acknowledged to the supervisor, which
 * commits it (checkpoint/ckpt.h ck_coord, supervisor/ckpt_coord.c) */
static int ckpt_ack(void *ctx, int64_t it, int status, const char *error, const ck_mfile *files, int n) {
    sv_file_info *fi = calloc((size_t)(n > 0 ? n : 1), sizeof *fi);
    if (!fi) return co_err_set(CO_ENOMEM, "checkpoint acknowledgement: out of memory");
    for (int i = 0; i < n; i++) fi[i] = (sv_file_info){files[i].name, files[i].size, files[i].xxh64};
    int rc = sv_link_checkpoint_ack(ctx, it, status, error, fi, n);
    free(fi);
    return rc;
}
static int ckpt_wait(void *ctx, int64_t it, int timeout_ms) { return sv_link_checkpoint_wait(ctx, it, timeout_ms); }
static bool ckpt_stopped(void *ctx) { return sv_link_saves_stopped(ctx); }

/* The communicators of a generation: the world and its groups (comms.h), and with
 * --overlap-grad-reduce the gradient group's own transport. The link aborts them all
 * (wk_comms_abort); until attached, the options' cancel flag ends their connection waits. */
static int open_comms(sv_link *link, const co_config *c, const sv_assignment *a, int cuda_device, wk_comms **cs) {
    cm_zmq_options zo;
    sv_link_data_options(link, &zo);
    /* NCCL where the supervisor gave a unique id (--device cuda in a build with NCCL), on
     * the GPU of this worker's local rank */
    int rc = wk_comms_new_nccl(cs, a, &zo, a->have_nccl_id ? cuda_device : -1);
    /* (COHORT_TEST_NO_GRAD_TRANSPORT=1: none, for the test of the trainer's fallback) */
    const char *none = getenv("COHORT_TEST_NO_GRAD_TRANSPORT");
    if (!rc && c->overlap_grad_reduce && !(none && !strcmp(none, "1"))) {
        /* the group the trainer reduces gradients over (the stand-in's is data parallel) */
        bool cp = c->context_parallel_size > 1 && !c->standin_model_parallel;
        /* a tcp endpoint's port moves past every worker slot's (master port + 1 + slot); with
         * NCCL the groups are NCCL's, and so is the gradient group's own */
        if (a->have_nccl_id)
            rc = wk_comms_open_grad_nccl(*cs, cp ? TOPO_G_DP_CP : TOPO_G_DP);
        else
            rc = wk_comms_open_grad(*cs, a, &zo, cp ? TOPO_G_DP_CP : TOPO_G_DP, c->nnodes * c->nproc_per_node);
        /* with expert parallelism the experts' group too */
        if (!rc && c->num_experts > 0 && c->expert_model_parallel_size > 1 && !c->standin_model_parallel)
            rc = a->have_nccl_id ? wk_comms_open_grad_nccl(*cs, TOPO_G_EDP)
                                 : wk_comms_open_expert_grad(*cs, a, &zo, c->nnodes * c->nproc_per_node);
        if (rc) wk_comms_destroy(cs);
    }
    if (!rc) sv_link_attach_abort(link, wk_comms_abort, *cs);
    return rc;
}

static void close_comms(sv_link *link, wk_comms **cs) {
    if (link) sv_link_attach_abort(link, NULL, NULL);
    wk_comms_destroy(cs);
}

/* *out: the rank of the generation's state source (a world rank; -1: none) in the group of
 * ranks holding the same state (data parallel, or expert data parallel): the supervisor names
 * a peer holding this rank's shard. */
static int source_in_group(const wk_comms *cs, int rank, int source, int *out) {
    /* with expert parallelism the ranks holding the same state are an expert-data-parallel group */
    bool experts = wk_comms_layout(cs)->ep > 1;
    *out = source < 0 ? -1 : wk_comms_rank_in(cs, experts ? TOPO_G_EDP : TOPO_G_DP, source);
    if (source >= 0 && *out < 0)
        return co_err_set(CO_EPROTOCOL, "rank %d: the state source, rank %d, is not in its %s group", rank, source,
                          experts ? "expert-data-parallel" : "data-parallel");
    return 0;
}

/* Which pipeline peer (its world rank) this rank waits for: the supervisor's heartbeats
 * carry it (sv_link_waiting). cs is the generation's set (rank.c keeps it current). */
typedef struct wait_ctx {
    sv_link *link;
    wk_comms *cs;
} wait_ctx;
static void report_waiting(void *ctx, int stage) {
    wait_ctx *w = ctx;
    int world = stage < 0 || !w->cs ? -1 : wk_comms_member(w->cs, TOPO_G_PP, stage);
    sv_link_waiting(w->link, world);
}

/* Test stand-in of model parallelism (co_config.standin_model_parallel): every rank holds
 * the whole model, so the members of every group must hold identical weights. Checked at
 * each generation's start and at the end, over every group. */
static int check_standin_replicas(wk_comms *cs, trainer *t, const char *when) {
    const topo_layout *l = wk_comms_layout(cs);
    if (!trainer_config(t)->standin_model_parallel || l->tp * l->cp * l->pp == 1) return 0;
    int rc = wk_comms_check_equal(cs, gpt_weights_checksum(trainer_model(t)), 10 * 60 * 1000);
    if (rc) co_log(CO_LOG_ERROR, "the replicas differ %s: %s", when, co_err_detail());
    return rc;
}

/* This worker's flags as JSON for its registration, kept for the process's life: the link
 * holds it. NULL if it cannot be built. */
static const char *flags_json(const co_config *c) {
    static char *json;
    size_t len = 0;
    FILE *f = json ? NULL : open_memstream(&json, &len);
    if (f) {
        co_config_write_json(c, f);
        if (fclose(f)) {
            free(json);
            json = NULL;
        }
    }
    return json;
}

int wk_join(const co_config *c, volatile sig_atomic_t *stop, volatile sig_atomic_t *signalled, sv_link **link,
            sv_assignment *asg) {
    const char *spare = getenv("COHORT_SPARE");
    int timeout_ms = spare && !strcmp(spare, "1") ? -1 : (int)(c->rendezvous_timeout * 1000);
    return sv_link_open(link, stop, signalled, timeout_ms, flags_json(c), asg);
}

/* A rank's life in wk_run: what its phases share. */
typedef struct rank_run {
    const wk_options *o;
    co_config c;          /* the flags (the stand-in's sizes, a replacement's --load) */
    sv_link *link;        /* NULL: one process */
    const sv_assignment *asg; /* the first assignment */
    wk_comms *cs;         /* this generation's communicators (NULL: one process, between generations) */
    trainer *t;
    wk_resil *resil;
    wk_ckpt *ckpt;
    wait_ctx wctx;
    int rank;             /* this process's rank now (a restart with shifted ranks changes it) */
    int world;            /* the job's ranks now (--elastic: a shrink or a grow changes it) */
    int64_t first_it;     /* where this run started (a stop before its first step saves nothing) */
    bool handover_failed; /* the last failure was a state transfer between ranks */
    train_end why;
} rank_run;

/* The data-parallel group of this generation (NULL: one process, or between generations). */
static cm_comm *run_dp(const rank_run *r) { return wk_comms_group(r->cs, TOPO_G_DP); }

/* A setup failure's exit status (the flags: 2), with its message. */
static int setup_failed(rank_run *r, int rc, const char *what) {
    return failed(r->link, rc, rc == CO_EINVAL ? WK_USAGE : WK_FAILURE, "%s%s (%s)", what, co_err_detail(),
                  co_strerror(rc));
}

/* The trainer from the flags over this generation's groups: a replacement (any process
 * started after generation 1) finds the data caches built and the survivors out of
 * trainer_new (no barriers), and takes its state from a replica's memory or, with every
 * survivor, from the checkpoint the supervisor names. */
static int make_trainer(rank_run *r) {
    co_config *c = &r->c;
    const sv_assignment *asg = r->asg;
    if (c->standin_model_parallel) {
        /* the test stand-in: the model is whole on every rank, the trainer sees its
         * data-parallel group only (the groups are built and checked all the same) */
        c->tensor_model_parallel_size = c->pipeline_model_parallel_size = c->context_parallel_size = 1;
    }
    trainer_data td = *r->o->data;
    td.joining = r->link && asg->generation > 1;
    wk_comms_trainer_groups(r->cs, c, &td.groups);
    if (td.joining && asg->state_source >= 0) c->load[0] = '\0'; /* a replacement takes its state from a replica */
    if (r->link && asg->generation > 1 && asg->state_source < 0 && asg->checkpoint_dir)
        snprintf(c->load, sizeof c->load, "%s", asg->checkpoint_dir); /* no replica survived: the checkpoint */
    int rc = trainer_new(&r->t, c, &td, r->o->out);
    return rc ? setup_failed(r, rc, "setup failed: ") : WK_OK;
}

/* The trainer's company: the heartbeat's progress, the pipeline's waits, resilience (the
 * rerun state machine's validator, --inject, --iterations-to-skip) and the checkpoint
 * hooks (--load, then --save; several ranks each write their share, the supervisor commits). */
static int attach_hooks(rank_run *r) {
    sv_link *link = r->link;
    int rc = link ? trainer_set_hook(r->t, report_progress, link) : 0;
    if (rc) return setup_failed(r, rc, "setup failed: ");
    if (link && r->c.pipeline_model_parallel_size > 1) trainer_set_wait_fn(r->t, report_waiting, &r->wctx);
    int world = link ? r->asg->world : 1;
    rc = wk_resil_new(&r->resil, &r->c, link, link ? r->asg->rank : 0, world);
    if (!rc) rc = wk_resil_attach(r->resil, r->t, r->o->out);
    if (rc) return failed(link, rc, rc == CO_EINVAL ? WK_USAGE : WK_FAILURE, "%s", co_err_detail());
    rc = wk_ckpt_attach(&r->ckpt, r->t, r->o->out, r->rank, world, wk_comms_world(r->cs));
    if (!rc && link && world > 1) {
        ck_coord co = {.ack = ckpt_ack, .wait = ckpt_wait, .stopped = ckpt_stopped, .ctx = link};
        snprintf(co.token, sizeof co.token, CK_JOB_TOKEN_FMT, sv_link_job_id(link));
        rc = wk_ckpt_set_coordinator(r->ckpt, &co);
    }
    if (rc) return setup_failed(r, rc, "checkpoint: "); /* a flag that does not fit the checkpoint: 2 */
    wk_resil_attach_ckpt(r->resil, r->ckpt);
    return WK_OK;
}

/* The run's first lines: the model, the pipeline stage, the training's shape. */
static void announce(const rank_run *r) {
    FILE *out = r->o->out;
    const co_config *c = &r->c;
    if (!out) return;
    gpt_model *m = trainer_model(r->t);
    fprintf(out, "cohort: model %zu parameters (%d layers, hidden %d, %d heads, vocab %d padded to %d), %s\n",
            gpt_num_params(m), c->num_layers, c->hidden_size, c->num_attention_heads, r->o->data->vocab_size,
            gpt_get_config(m)->padded_vocab, kb_backend_describe(gpt_backend(m)));
    char stage[256];
    if (trainer_describe_stage(r->t, stage, sizeof stage) > 0) fprintf(out, "cohort: %s\n", stage);
    cm_comm *dp = run_dp(r);
    fprintf(out, "cohort: training %lld iterations of %d samples x %d tokens (%d micro batches of %d per rank, %d rank%s)\n",
            (long long)c->train_iters, c->global_batch_size, c->seq_length,
            c->global_batch_size / c->micro_batch_size / (dp ? dp->size : 1), c->micro_batch_size, dp ? dp->size : 1,
            dp && dp->size > 1 ? "s" : "");
    if (c->rampup_start > 0)
        fprintf(out, "cohort: batch ramp-up: from %lld samples by %lld over %lld samples (Megatron's "
                     "--rampup-batch-size)\n", (long long)c->rampup_start, (long long)c->rampup_increment,
                (long long)c->rampup_samples);
    fflush(out);
}

/* Under a supervisor with peers: an Abort unwinds the step instead of stopping the worker,
 * and a replacement takes its state from a surviving replica's memory. */
static int join_job(rank_run *r) {
    const sv_assignment *asg = r->asg;
    if (!r->link || !run_dp(r)) return 0;
    sv_link_enable_restart(r->link, r->o->abort_flag);
    trainer_set_abort_flag(r->t, r->o->abort_flag);
    if (asg->generation > 1) wk_resil_mark_replayed(r->resil, asg->faults_through);
    if (asg->generation <= 1 || asg->state_source < 0) return 0;
    int src;
    int rc = source_in_group(r->cs, asg->rank, asg->state_source, &src);
    if (!rc) rc = trainer_sync_state(r->t, src);
    r->handover_failed = rc != 0;
    if (rc)
        co_log(CO_LOG_ERROR, "taking the state of rank %d failed: %s (%s)", asg->state_source, co_err_detail(),
               co_strerror(rc));
    else if (r->o->out)
        fprintf(r->o->out, "cohort: rank %d replaced in process generation %llu: state of iteration %lld taken from "
                           "rank %d's memory\n", asg->rank, (unsigned long long)asg->generation,
                (long long)trainer_iteration(r->t), asg->state_source);
    return rc;
}

/* Training's first generation: the timeline opened, the stand-in's replicas checked, train. */
static int first_generation(rank_run *r, int early_rc) {
    int rc = early_rc;
    if (!rc && (rc = trainer_open_timeline(r->t, r->rank, r->link ? r->asg->world : 1)))
        fprintf(stderr, "cohort train: --timeline-dir: %s (%s)\n", co_err_detail(), co_strerror(rc));
    r->first_it = trainer_iteration(r->t);
    if (!rc && r->cs) rc = check_standin_replicas(r->cs, r->t, "at the start");
    return rc ? rc : trainer_train(r->t, r->o->stop, &r->why);
}

/* After this generation failed with rc: whether the supervisor aborted it, so that the rank
 * goes to the restart barrier (a peer's failure noticed before the Abort arrived is told to
 * the supervisor, and its Abort awaited). */
static bool generation_aborted(rank_run *r, int rc) {
    if (!rc || !r->link || r->world < 2) return false;
    if (sv_link_restart_pending(r->link)) return true;
    if (rc != CO_EREMOTE && rc != CO_ETIMEOUT && rc != CO_EABORTED) return false;
    char what[400];
    snprintf(what, sizeof what, "rank %d: %s (%s)", r->rank, co_err_detail(), co_strerror(rc));
    return sv_link_await_abort(r->link, rc, what, (int)(r->c.inprocess_hard_timeout * 1000));
}

/* --inprocess-rank-assignment shift: this process has rank `rank` from the next generation
 * on; the last rank prints. */
static void take_rank(rank_run *r, const sv_assignment *na) {
    co_log(CO_LOG_INFO, "rank %d is rank %d from generation %llu", r->rank, na->rank,
           (unsigned long long)na->generation);
    co_log_set_prefix("cohort rank %d", na->rank);
    bool printer = na->rank == na->world - 1;
    trainer_set_output(r->t, printer ? sv_link_log_stream(r->link) : NULL,
                       printer ? sv_link_metrics_stream(r->link) : NULL);
    wk_ckpt_set_rank(r->ckpt, na->rank);
    wk_resil_set_rank(r->resil, na->rank);
    co_proctitle_role(CO_PROC_WORKER, na->rank, r->c.node_rank, sv_link_job_id(r->link)); /* (what ps shows) */
    wk_resil_mark_replayed(r->resil, na->faults_through); /* that rank's faults fired already */
    r->rank = na->rank;
}

/* The next generation's groups and state: the state of the survivor the supervisor names
 * for this rank's shard, or, where a shard lost every replica, the checkpoint (every rank). */
static int take_generation_state(rank_run *r, char *reload, int source) {
    tr_groups g;
    wk_comms_trainer_groups(r->cs, &r->c, &g);
    trainer_set_groups(r->t, &g);
    /* --elastic: the world shrank or grew; a save's writers are the new world's ranks (after
     * the handover, which may lay the distributed optimizer's shards out anew; before a reload,
     * which reads the new world's parts) */
    int rc = 0;
    if (reload) {
        r->handover_failed = false;
        rc = wk_ckpt_set_world(r->ckpt, r->world, r->rank);
        if (!rc) rc = wk_ckpt_reload(r->ckpt, reload, wk_comms_world(r->cs));
    } else {
        rc = trainer_sync_state(r->t, source);
        r->handover_failed = rc != 0;
        if (!rc) rc = wk_ckpt_set_world(r->ckpt, r->world, r->rank);
    }
    if (!rc) rc = check_standin_replicas(r->cs, r->t, "after the restart");
    return rc;
}

/* One in-process restart after this generation failed with rc: unwind to the restart
 * barrier keeping the trainer's state, the next generation's assignment, its communicators
 * and state, train again. Returns that generation's outcome; *stop: no restart follows. */
static int next_generation(rank_run *r, int rc, bool *stop) {
    int64_t it = trainer_iteration(r->t);
    co_log(CO_LOG_INFO, "generation aborted during iteration %lld (%s); at the restart barrier", (long long)it + 1,
           co_strerror(rc));
    /* the trainer's communication threads (the overlapped reduction, the parameter gather)
     * end before the communicators they use go: aborted first, so that none waits on a peer */
    if (r->cs) wk_comms_abort(r->cs);
    trainer_set_groups(r->t, NULL);
    close_comms(r->link, &r->cs);
    r->wctx.cs = NULL;
    sv_assignment na;
    rc = sv_link_await_restart(r->link, it, &na, (int)(r->c.rendezvous_timeout * 1000));
    if (rc) {
        *stop = true;
        return rc;
    }
    rc = open_comms(r->link, &r->c, &na, r->o->data->cuda_device, &r->cs);
    r->wctx.cs = r->cs;
    int source = -1;
    if (!rc) rc = source_in_group(r->cs, na.rank, na.state_source, &source);
    /* no replica of some shard survived: every rank, survivors too, takes the checkpoint */
    char *reload = !rc && source < 0 && na.checkpoint_dir ? strdup(na.checkpoint_dir) : NULL;
    if (na.world != r->world) {
        co_log(CO_LOG_INFO, "the job has %d ranks from generation %llu (it had %d: --elastic)", na.world,
               (unsigned long long)na.generation, r->world);
        r->world = na.world;
        take_rank(r, &na); /* (the last rank prints: maybe another one now) */
    } else if (na.rank != r->rank) {
        take_rank(r, &na);
    }
    sv_assignment_free(&na);
    if (rc) return rc; /* another abort during the rebuild: back to the barrier (reload is NULL) */
    rc = take_generation_state(r, reload, source);
    free(reload);
    return rc ? rc : trainer_train(r->t, r->o->stop, &r->why);
}

/* The exit status of a run that trained to its end: its last lines, the final evaluation
 * (not after a signal), the caller's epilogue. */
static int finish_training(rank_run *r) {
    FILE *out = r->o->out;
    long long it = (long long)trainer_iteration(r->t);
    if (out && r->why == TRAIN_SIGNAL)
        fprintf(out, "cohort: stopped by signal after iteration %lld%s\n", it,
                it == r->first_it ? " (before this run's first step: nothing new to save)" : "");
    if (out && r->why == TRAIN_EXIT_INTERVAL) fprintf(out, "cohort: --exit-interval reached at iteration %lld\n", it);
    if (out && r->why == TRAIN_EXIT_DURATION)
        fprintf(out, "cohort: --exit-duration-in-mins reached at iteration %lld\n", it);
    int status = WK_OK;
    char label[96];
    double vl = NAN, tl = NAN;
    if (r->why != TRAIN_SIGNAL) {
        snprintf(label, sizeof label, "iteration %lld on validation set", it);
        int rc = trainer_evaluate(r->t, 1, label, &vl);
        snprintf(label, sizeof label, "iteration %lld on test set", it);
        if (!rc) rc = trainer_evaluate(r->t, 2, label, &tl);
        if (rc) {
            fprintf(stderr, "cohort train: evaluation failed: %s\n", co_err_detail());
            status = WK_FAILURE;
        }
    }
    if (r->o->on_done && status == WK_OK) r->o->on_done(r->o->ctx, r->t, vl);
    return status;
}

/* The exit status of the run that ended with rc. */
static int run_status(rank_run *r, int rc) {
    if (!rc && r->cs) rc = check_standin_replicas(r->cs, r->t, "at the end");
    int status;
    if (rc) {
        /* (a failed state handover is the job's state, not this rank's: the supervisor's
         * restart decides, e.g. from the checkpoint) */
        status = failed(r->link, r->handover_failed ? 0 : rc, WK_FAILURE, "training failed at iteration %lld: %s (%s)",
                        (long long)trainer_iteration(r->t), co_err_detail(), co_strerror(rc));
    } else if (r->why == TRAIN_NAN || r->why == TRAIN_REJECTED) {
        status = WK_NAN;
    } else {
        status = finish_training(r);
    }
    if (r->o->out) fflush(r->o->out);
    if (getenv("COHORT_TEST_PEAK_RSS")) {
        /* a benchmark's aid (bench/pp_bench.sh): each rank's peak memory, with its place */
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        int tp, tpr, pp, ppr;
        trainer_model_parallel(r->t, &tp, &tpr, &pp, &ppr);
        fprintf(stderr, "cohort rank %d: peak resident memory %.0f MB (tensor rank %d, pipeline stage %d)\n", r->rank,
                (double)ru.ru_maxrss / 1024.0, tpr, ppr);
    }
    return status;
}

int wk_run(const wk_options *o) {
    rank_run r = {.o = o, .c = *o->config, .link = o->link, .asg = o->asg, .rank = o->link ? o->asg->rank : 0,
                  .world = o->link ? o->asg->world : 1};
    r.wctx.link = o->link;
    if (r.link) co_log_set_prefix("cohort rank %d", r.rank); /* (a worker's lines name its rank) */
    if (r.link && r.asg->world > 1) {
        int rc = open_comms(r.link, &r.c, r.asg, o->data->cuda_device, &r.cs);
        if (rc) {
            co_log(CO_LOG_ERROR, "connecting to the other workers failed: %s (%s)", co_err_detail(), co_strerror(rc));
            return WK_FAILURE;
        }
    }
    r.wctx.cs = r.cs;
    int status = make_trainer(&r);
    if (status == WK_OK) status = attach_hooks(&r);
    if (status == WK_OK) {
        announce(&r);
        int rc = first_generation(&r, join_job(&r));
        bool stop = false;
        while (!stop && generation_aborted(&r, rc)) rc = next_generation(&r, rc, &stop);
        status = run_status(&r, rc);
    }
    wk_ckpt_destroy(&r.ckpt); /* waits for a background save */
    if (r.cs && status != WK_OK) wk_comms_abort(r.cs); /* (a communication thread may wait on a peer) */
    trainer_destroy(&r.t);
    wk_resil_destroy(&r.resil);
    close_comms(r.link, &r.cs);
    return status;
}
