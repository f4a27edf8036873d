/* rank.c - the rank actor's life (see rank.h). */
#include "worker/rank.h"

#include "checkpoint/ckpt.h"
#include "comm/zmq_comm.h"
#include "common/error.h"
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

/* checkpoint (issue 5): a rank's part of a save is acknowledged to the supervisor, which
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

/* The communicators of a generation: the world and its groups (comms.h); the trainer
 * reduces over the data-parallel group. The link aborts them all (wk_comms_abort). */
static int open_comms(sv_link *link, const sv_assignment *a, int cuda_device, wk_comms **cs, cm_comm **dp) {
    cm_zmq_options zo;
    sv_link_data_options(link, &zo);
    /* NCCL where the supervisor gave a unique id (--device cuda in a build with NCCL), on
     * the GPU of this worker's local rank */
    int rc = wk_comms_new_nccl(cs, a, &zo, a->have_nccl_id ? cuda_device : -1);
    *dp = rc ? NULL : wk_comms_group(*cs, TOPO_G_DP);
    if (!rc) sv_link_attach_abort(link, wk_comms_abort, *cs);
    return rc;
}

static void close_comms(sv_link *link, wk_comms **cs, cm_comm **dp) {
    if (link) sv_link_attach_abort(link, NULL, NULL);
    wk_comms_destroy(cs);
    *dp = NULL;
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

/* A pipeline rank's groups (NULL without): its two point-to-point channels (ZeroMQ, also
 * under NCCL: the pipeline's sends and receives go through the host), the embedding group
 * and the model-parallel group. */
/* The expert groups (trainer_data.ep, edp, erep) where the layout has expert parallelism. */
static void set_experts(trainer_data *td, const wk_comms *cs) {
    bool experts = cs && wk_comms_layout(cs)->ep > 1;
    /* the layers' exchange group: the expert-tensor x expert group (the expert group at expert
     * tensor size 1) */
    td->ep = experts ? wk_comms_group(cs, TOPO_G_ETP_EP) : NULL;
    td->edp = experts ? wk_comms_group(cs, TOPO_G_EDP) : NULL;
    td->erep = experts ? wk_comms_group(cs, TOPO_G_ETP_EP_PP) : NULL;
}

static void set_pipeline(trainer_data *td, const wk_comms *cs) {
    td->pp = wk_comms_pipeline(cs, 0);
    td->pp_bwd = wk_comms_pipeline(cs, 1);
    td->emb = cs ? wk_comms_group(cs, TOPO_G_EMBEDDING) : NULL;
    td->mp = cs ? wk_comms_group(cs, TOPO_G_MP) : NULL;
}

/* Test stand-in of model parallelism (co_config.standin_model_parallel): every rank holds
 * the whole model, so the members of every group must hold identical weights. Checked at
 * each generation's start and at the end, over every group. */
static int check_standin_replicas(wk_comms *cs, trainer *t, int rank, const char *when) {
    const topo_layout *l = wk_comms_layout(cs);
    if (!trainer_config(t)->standin_model_parallel || l->tp * l->cp * l->pp == 1) return 0;
    char err[400];
    int rc = wk_comms_check_equal(cs, gpt_weights_checksum(trainer_model(t)), 10 * 60 * 1000, err, sizeof err);
    if (rc) fprintf(stderr, "cohort worker %d: the replicas differ %s: %s\n", rank, when, err[0] ? err : co_err_detail());
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

int wk_run(const wk_options *o) {
    co_config c = *o->config;
    const trainer_data *data = o->data;
    FILE *out = o->out;
    sv_link *link = o->link;
    const sv_assignment *asg = o->asg;
    wk_comms *cs = NULL;
    cm_comm *dp = NULL;
    int rc = 0;
    if (link && asg->world > 1) {
        rc = open_comms(link, asg, data->cuda_device, &cs, &dp);
        if (rc) {
            fprintf(stderr, "cohort worker %d: connecting to the other workers failed: %s (%s)\n", asg->rank,
                    co_err_detail(), co_strerror(rc));
            return WK_FAILURE;
        }
    }
    if (c.standin_model_parallel) {
        /* the test stand-in: the model is whole on every rank, the trainer sees its
         * data-parallel group only (the groups are built and checked all the same) */
        c.tensor_model_parallel_size = c.pipeline_model_parallel_size = c.context_parallel_size = 1;
    }
    trainer *t = NULL;
    int early_rc = 0; /* a replacement's first state transfer failed */
    bool handover_failed = false; /* the last failure was a state transfer between ranks */
    trainer_data td = *data;
    /* a replacement (any process started after generation 1): the data caches exist and the
     * survivors are not in trainer_new (no barriers), whether it takes its state from a
     * survivor's memory or, with every survivor, from the checkpoint */
    td.joining = link && asg->generation > 1;
    bool split_model = c.tensor_model_parallel_size > 1; /* (the stand-in set it to 1) */
    bool pipelined = c.pipeline_model_parallel_size > 1;
    td.tp = split_model && cs ? wk_comms_group(cs, TOPO_G_TP) : NULL;
    set_pipeline(&td, pipelined ? cs : NULL);
    set_experts(&td, c.standin_model_parallel ? NULL : cs);
    bool context = c.context_parallel_size > 1; /* (the stand-in set it to 1) */
    td.cp = context && cs ? wk_comms_group(cs, TOPO_G_CP) : NULL;
    td.dpcp = context && cs ? wk_comms_group(cs, TOPO_G_DP_CP) : NULL;
    td.tpcp = context && cs ? wk_comms_group(cs, TOPO_G_TP_CP) : NULL;
    if (td.joining && asg->state_source >= 0) c.load[0] = '\0'; /* a replacement takes its state from a replica */
    if (link && asg->generation > 1 && asg->state_source < 0 && asg->checkpoint_dir)
        snprintf(c.load, sizeof c.load, "%s", asg->checkpoint_dir); /* no replica survived: the checkpoint */
    rc = trainer_new(&t, &c, &td, out, dp);
    if (rc) {
        int status = failed(link, rc, rc == CO_EINVAL ? WK_USAGE : WK_FAILURE, "setup failed: %s (%s)",
                            co_err_detail(), co_strerror(rc));
        close_comms(link, &cs, &dp);
        return status;
    }
    if (link) trainer_set_hook(t, report_progress, link);
    wait_ctx wctx = {.link = link, .cs = cs};
    if (link && pipelined) trainer_set_wait_fn(t, report_waiting, &wctx);
    /* resilience: the rerun state machine's validator, --inject, --iterations-to-skip */
    wk_resil *resil = NULL;
    {
        char rerr[600];
        rc = wk_resil_new(&resil, &c, link, link ? asg->rank : 0, link ? asg->world : 1, rerr, sizeof rerr);
        if (rc) {
            int status = failed(link, rc, rc == CO_EINVAL ? WK_USAGE : WK_FAILURE, "%s", rerr);
            trainer_destroy(&t);
            close_comms(link, &cs, &dp);
            return status;
        }
        wk_resil_attach(resil, t, out);
    }
    /* --- checkpoint (issue 5): --load, then the --save hook (rank 0 writes) --- */
    wk_ckpt *ckpt = NULL;
    rc = wk_ckpt_attach(&ckpt, t, out, link ? asg->rank : 0, link ? asg->world : 1, cs ? wk_comms_world(cs) : NULL);
    if (!rc && link && asg->world > 1) { /* every rank writes its share; the supervisor commits */
        ck_coord co = {.ack = ckpt_ack, .wait = ckpt_wait, .ctx = link};
        snprintf(co.token, sizeof co.token, CK_JOB_TOKEN_FMT, sv_link_job_id(link));
        rc = wk_ckpt_set_coordinator(ckpt, &co);
    }
    if (rc) { /* a flag that does not fit the checkpoint: 2 */
        int status = failed(link, rc, rc == CO_EINVAL ? WK_USAGE : WK_FAILURE, "checkpoint: %s (%s)", co_err_detail(),
                            co_strerror(rc));
        trainer_destroy(&t);
        wk_resil_destroy(&resil);
        close_comms(link, &cs, &dp);
        return status;
    }
    /* --- end checkpoint --- */
    wk_resil_attach_ckpt(resil, ckpt);
    if (out) {
        fprintf(out, "cohort: model %zu parameters (%d layers, hidden %d, %d heads, vocab %d padded to %d), %s\n",
                gpt_num_params(trainer_model(t)), c.num_layers, c.hidden_size, c.num_attention_heads, data->vocab_size,
                gpt_get_config(trainer_model(t))->padded_vocab, kb_backend_describe(gpt_backend(trainer_model(t))));
        char stage[256];
        if (trainer_describe_stage(t, stage, sizeof stage) > 0) fprintf(out, "cohort: %s\n", stage);
        fprintf(out, "cohort: training %lld iterations of %d samples x %d tokens (%d micro batches of %d per rank, %d rank%s)\n",
                (long long)c.train_iters, c.global_batch_size, c.seq_length,
                c.global_batch_size / c.micro_batch_size / (dp ? dp->size : 1), c.micro_batch_size, dp ? dp->size : 1,
                dp && dp->size > 1 ? "s" : "");
        fflush(out);
    }
    if (link && dp) {
        /* in-process restart: an Abort unwinds the step instead of stopping the worker */
        sv_link_enable_restart(link, o->abort_flag);
        trainer_set_abort_flag(t, o->abort_flag);
        if (asg->generation > 1) wk_resil_mark_replayed(resil, asg->faults_through);
        if (asg->generation > 1 && asg->state_source >= 0) {
            /* a replacement: the state comes from a surviving replica's memory */
            int src;
            rc = source_in_group(cs, asg->rank, asg->state_source, &src);
            if (!rc) rc = trainer_sync_state(t, src);
            handover_failed = rc != 0;
            if (rc) {
                fprintf(stderr, "cohort worker %d: taking the state of rank %d failed: %s (%s)\n", asg->rank,
                        asg->state_source, co_err_detail(), co_strerror(rc));
                early_rc = rc;
            } else if (out) {
                fprintf(out, "cohort: rank %d replaced in process generation %llu: state of iteration %lld taken from "
                             "rank %d's memory\n", asg->rank, (unsigned long long)asg->generation,
                        (long long)trainer_iteration(t), asg->state_source);
            }
        }
    }

    if (!early_rc && (rc = trainer_open_timeline(t, link ? asg->rank : 0, link ? asg->world : 1))) {
        fprintf(stderr, "cohort train: --timeline-dir: %s (%s)\n", co_err_detail(), co_strerror(rc));
        early_rc = rc;
    }
    train_end why = TRAIN_DONE;
    int my_rank = link ? asg->rank : 0;
    int64_t first_it = trainer_iteration(t); /* where this run started (a stop before its first step saves nothing) */
    if (!early_rc && cs) early_rc = check_standin_replicas(cs, t, my_rank, "at the start");
    rc = early_rc ? early_rc : trainer_train(t, o->stop, &why);
    for (;;) {
        if (!rc || !link || asg->world < 2) break; /* (dp is NULL after a rebuild that failed) */
        if (!sv_link_restart_pending(link)) {
            /* a peer failed before the supervisor's Abort arrived: tell it, wait for it */
            if (rc != CO_EREMOTE && rc != CO_ETIMEOUT && rc != CO_EABORTED) break;
            char what[400];
            snprintf(what, sizeof what, "rank %d: %s (%s)", my_rank, co_err_detail(), co_strerror(rc));
            if (!sv_link_await_abort(link, rc, what, (int)(c.inprocess_hard_timeout * 1000))) break;
        }
        /* the supervisor aborted this generation: unwind to the restart barrier, keeping
         * the loaded state, and continue in the next generation */
        int64_t it = trainer_iteration(t);
        fprintf(stderr, "cohort worker %d: generation aborted during iteration %lld (%s); at the restart barrier\n",
                my_rank, (long long)it + 1, co_strerror(rc));
        close_comms(link, &cs, &dp);
        wctx.cs = NULL;
        trainer_set_comm(t, NULL);
        trainer_set_tensor_group(t, NULL);
        trainer_set_context_groups(t, NULL, NULL, NULL);
        trainer_set_pipeline_groups(t, NULL, NULL, NULL, NULL);
        trainer_set_expert_groups(t, NULL, NULL, NULL);
        sv_assignment na;
        rc = sv_link_await_restart(link, it, &na, (int)(c.rendezvous_timeout * 1000));
        if (rc) break;
        rc = open_comms(link, &na, data->cuda_device, &cs, &dp);
        wctx.cs = cs;
        int source = -1;
        if (!rc) rc = source_in_group(cs, na.rank, na.state_source, &source);
        /* no replica of some shard survived: every rank, survivors too, takes the checkpoint */
        char *reload = !rc && source < 0 && na.checkpoint_dir ? strdup(na.checkpoint_dir) : NULL;
        if (na.rank != my_rank) {
            /* --inprocess-rank-assignment shift: this process has another rank now; the
             * last rank prints */
            fprintf(stderr, "cohort worker: rank %d is rank %d from generation %llu\n", my_rank, na.rank,
                    (unsigned long long)na.generation);
            bool printer = na.rank == na.world - 1;
            trainer_set_output(t, printer ? sv_link_log_stream(link) : NULL,
                               printer ? sv_link_metrics_stream(link) : NULL);
            wk_ckpt_set_rank(ckpt, na.rank);
            wk_resil_set_rank(resil, na.rank);
            co_proctitle_role(CO_PROC_WORKER, na.rank, c.node_rank, sv_link_job_id(link)); /* (what ps shows) */
            wk_resil_mark_replayed(resil, na.faults_through); /* that rank's faults fired already */
            my_rank = na.rank;
        }
        sv_assignment_free(&na);
        if (rc) continue; /* another abort during the rebuild: back to the barrier (reload is NULL) */
        trainer_set_comm(t, dp);
        trainer_set_tensor_group(t, split_model ? wk_comms_group(cs, TOPO_G_TP) : NULL);
        if (context)
            trainer_set_context_groups(t, wk_comms_group(cs, TOPO_G_CP), wk_comms_group(cs, TOPO_G_DP_CP),
                                       wk_comms_group(cs, TOPO_G_TP_CP));
        if (pipelined) {
            trainer_data ptd;
            set_pipeline(&ptd, cs);
            trainer_set_pipeline_groups(t, ptd.pp, ptd.pp_bwd, ptd.emb, ptd.mp);
        }
        trainer_data etd;
        set_experts(&etd, c.standin_model_parallel ? NULL : cs);
        trainer_set_expert_groups(t, etd.ep, etd.edp, etd.erep);
        if (reload) {
            handover_failed = false;
            rc = wk_ckpt_reload(ckpt, reload, wk_comms_world(cs));
            free(reload);
        } else {
            rc = trainer_sync_state(t, source);
            handover_failed = rc != 0;
        }
        if (!rc) rc = check_standin_replicas(cs, t, my_rank, "after the restart");
        if (!rc) rc = trainer_train(t, o->stop, &why);
    }
    if (!rc && cs) rc = check_standin_replicas(cs, t, my_rank, "at the end");
    int status = WK_OK;
    if (rc) {
        /* (a failed state handover is the job's state, not this rank's: the supervisor's
         * restart decides, e.g. from the checkpoint) */
        status = failed(link, handover_failed ? 0 : rc, WK_FAILURE, "training failed at iteration %lld: %s (%s)",
                        (long long)trainer_iteration(t), co_err_detail(), co_strerror(rc));
    } else if (why == TRAIN_NAN || why == TRAIN_REJECTED) {
        status = WK_NAN;
    } else {
        long long it = (long long)trainer_iteration(t);
        if (out && why == TRAIN_SIGNAL)
            fprintf(out, "cohort: stopped by signal after iteration %lld%s\n", it,
                    it == first_it ? " (before this run's first step: nothing new to save)" : "");
        if (out && why == TRAIN_EXIT_INTERVAL) fprintf(out, "cohort: --exit-interval reached at iteration %lld\n", it);
        if (out && why == TRAIN_EXIT_DURATION) fprintf(out, "cohort: --exit-duration-in-mins reached at iteration %lld\n", it);
        char label[96];
        double vl = NAN, tl = NAN;
        if (why != TRAIN_SIGNAL) {
            snprintf(label, sizeof label, "iteration %lld on validation set", it);
            rc = trainer_evaluate(t, 1, label, &vl);
            snprintf(label, sizeof label, "iteration %lld on test set", it);
            if (!rc) rc = trainer_evaluate(t, 2, label, &tl);
            if (rc) {
                fprintf(stderr, "cohort train: evaluation failed: %s\n", co_err_detail());
                status = WK_FAILURE;
            }
        }
        if (o->on_done && status == WK_OK) o->on_done(o->ctx, t, vl);
    }
    if (out) fflush(out);
    if (getenv("COHORT_TEST_PEAK_RSS")) {
        /* a benchmark's aid (bench/pp_bench.sh): each rank's peak memory, with its place */
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        int tp, tpr, pp, ppr;
        trainer_model_parallel(t, &tp, &tpr, &pp, &ppr);
        fprintf(stderr, "cohort rank %d: peak resident memory %.0f MB (tensor rank %d, pipeline stage %d)\n", my_rank,
                (double)ru.ru_maxrss / 1024.0, tpr, ppr);
    }
    wk_ckpt_destroy(&ckpt); /* checkpoint (issue 5): waits for a background save */
    trainer_destroy(&t);
    wk_resil_destroy(&resil);
    close_comms(link, &cs, &dp);
    return status;
}

