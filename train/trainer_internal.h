/* trainer_internal.h - what the trainer's files share (trainer.c: setup, the step, the loop,
 * logging, evaluation; pipeline.c: a pipeline stage's share of a step). Not for use outside
 * train/. */
#ifndef COHORT_TRAIN_TRAINER_INTERNAL_H
#define COHORT_TRAIN_TRAINER_INTERNAL_H

#include "train/trainer.h"

#include "comm/comm.h"
#include "data/loader.h"
#include "kernels/backend.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/lr.h"
#include "scheduler/groups.h"
#include "scheduler/placement.h"
#include "scheduler/schedule.h"
#include "scheduler/topology.h"
#include "train/timeline.h"
#include "train/tr_groups.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* One micro batch's arrays [B*T]. */
typedef struct tr_batch {
    int32_t *tokens, *targets, *positions, *seg;
    float *mask, *dscale;
    /* context parallelism with MTP: the whole micro batch's tokens, targets and positions
     * ([3][N]) and loss mask before the split (the depths roll across the chunks), or NULL */
    int32_t *full;
    float *full_mask;
    /* context parallelism with a pipeline: each local token's row in the whole micro batch
     * ([N], gpt_batch.rows), the local tokens per sequence (gpt_batch.T) and the loss tokens
     * of the whole sequences, kept per micro batch until its backward */
    int32_t *rows;
    int T;
    double ntok_all;
} tr_batch;

struct trainer {
    co_config cfg;
    FILE *log;              /* NULL on ranks that do not print */
    FILE *metrics;
    bool metrics_borrowed;  /* given by the caller (trainer_data.metrics), not ours to close */
    /* the communicators (train/tr_groups.h): only the groups the configuration uses are kept
     * (pp with a pipeline, cp, dpcp, tpcp with context parallelism, ep, edp, erep with expert
     * parallelism); all NULL between generations of an in-process restart */
    tr_groups g;
    int tp_size, tp_rank;
    topo_layout layout;     /* the job's layout: a world rank's replica (its data-parallel coordinate) */
    bool have_layout;
    bool has_split[3];      /* the split has samples (told by tensor-parallel rank 0, which alone builds them) */
    int32_t *bcast;         /* one micro batch packed for the tensor group's broadcast */
    kb_backend *be;
    gpt_model *model;
    gpt_config mcfg;
    opt_adamw opt;
    opt_grad_scaler scaler; /* --fp16's loss scale (without: a constant 1, which changes no bits) */
    lr_schedule lr;
    topo topo;
    int M;                   /* micro batches per iteration (this iteration's, under a batch ramp-up) */
    int M_max;               /* ... of the full --global-batch-size: what the buffers are sized for */
    int gbs;                 /* this iteration's global batch (co_config_batch_at) */
    /* --elastic: the training-order positions of the samples every data-parallel rank read,
     * as their count, sum and sum of squares (exact in a double): the step's, and since the
     * last log line (the metrics record's: the consumed samples checked exactly once) */
    double smp_step[3], smp_log[3];
    lr_schedule lr_samples;  /* under --rampup-batch-size: the schedule counted in samples, as Megatron's */
    /* --decoupled-lr: the same schedules from --decoupled-lr to --decoupled-min-lr, for the input
     * embedding and the output layer (decoupled false: none) */
    lr_schedule lr_dec, lr_samples_dec;
    bool decoupled;
    /* --calculate-per-token-loss: the weight of a loss token in step tok_w_step - 1 (0: none yet),
     * counted collectively in the step's training round; a check round recomputing a peer's
     * share of the same step (the helper's replica alone) takes it from here */
    int64_t tok_w_step;
    float tok_w;
    dl_dataset *ds[3];       /* train, valid, test (NULL: empty split) */
    tok_tokenizer sft_tok;   /* the tokenizer SFT data is tokenized with (--sft) */
    int64_t consumed[3];     /* samples consumed of each split */
    int64_t iteration;
    double flops_per_sample;
    /* the micro batches' arrays: one set without pipelining, one per micro batch of the
     * step with it (every micro batch in flight keeps its own until its backward) */
    tr_batch *mbuf;
    int nmbuf;
    float *zeros;           /* [N]: dscale of an evaluation */
    /* logging accumulators since the last log line */
    double loss_sum, tok_sum;
    int iters_since_log;
    double time_since_log;
    int64_t skipped, nan_iters;
    double last_loss;
    double start_time;
    int progress_shown;
    double ema_step_s;      /* smoothed step time for the progress bar's rate and ETA */
    trainer_hook hook[TRAINER_MAX_HOOKS];
    void *hook_ctx[TRAINER_MAX_HOOKS];
    int nhooks;
    trainer_pre_step_hook pre_step[TRAINER_MAX_HOOKS];
    void *pre_step_ctx[TRAINER_MAX_HOOKS];
    int npre_step;
    /* validation, injection, skips (resilience/) */
    trainer_validator val;
    bool have_val;
    bool save_ordered;        /* this iteration's ACCEPT verdict asked for a checkpoint (--save-interval auto) */
    fi_schedule *inj;
    int job_rank;       /* this rank in the job (the world rank; dp_rank by default): what fault specs and log lines name */
    int64_t *skips;
    int nskips;
    trainer_event_fn ev_fn;
    void *ev_ctx;
    volatile sig_atomic_t *stop; /* the caller's stop flag (a hang injected in compute polls it) */
    volatile sig_atomic_t *abort_flag;
    double phase_ms[TR_NPHASES];
    double gate_s;            /* time in the validator (report + verdict wait) since the last log line */
    rr_mbs mbs;               /* the round's micro batches folded for the report (any number) */
    /* --check-weight-hash-across-dp-replicas-interval: the weights as this rank last wrote them */
    uint64_t sum_written;
    bool have_written;
    double sum_wait_s, sum_hash_s; /* since the last log line: checksum time on the training
                                      thread (not hidden), and all hashing (also overlapped) */
    /* pipeline parallelism (pipeline.c; g.pp NULL without) */
    int pp_size, pp_rank, vchunks;
    pp_stage *stages;       /* [pp_size * vchunks]: every rank's chunks (Megatron's placement) */
    pp_op *ops;             /* this rank's schedule */
    int nops;
    unsigned char *have_batch; /* [M] micro batch mb's arrays: 0 not yet, 1 positions received, 2 read */
    int *poison;            /* [M] a corrupted loss's kind (trainer__inject_loss) */
    double *mb_loss_local, *mb_tok_local; /* [M] the head chunk's losses, the micro batches' tokens */
    double *lbuf;           /* [2M] the losses summed over the pipeline group */
    int32_t *meta;          /* [3N+1] positions, document starts (with context parallelism each
                             * local token's row and the local tokens per sequence) sent with
                             * the activations */
    double recv_s;          /* waiting for a peer stage since the last log line */
    cm_p2p pp_held[2];      /* on the device (g.pp_dev): the sends held for the next step of the
                             * exchange (train/pipeline.c) */
    float *pp_grecv;        /* on the device: backend memory the output's gradient is received
                             * into, apart from the backward's buffer that its send reads */
    int pp_nheld;
    struct tr_pp_queued {   /* on the device: what the interleaved schedule's wrap-around link
                             * received ahead of the operation that reads it (a micro batch
                             * group larger than the pipeline; Megatron's lists), by that
                             * operation */
        void *buf;
        pp_op op;
        bool busy;
    } *pp_q;
    int pp_nq;
    int pp_last_from;       /* the pipeline rank of the last receive posted on the device */
    bool pp_said;           /* which channels the pipeline uses was logged */
    int share_of;           /* the data-parallel replica whose micro batches the pipeline runs */
    void (*wait_fn)(void *ctx, int stage); /* trainer_set_wait_fn */
    void *wait_ctx;
    /* context parallelism (trainer_cp.c; cpn 1 without) */
    int cpn, cpr;           /* its size and this rank */
    bool thd, docs;         /* the per-document split (packed sequences); documents in the data */
    int cap_total, local_T; /* padded tokens a sequence may take; the model's local tokens */
    int thd_quantum;        /* THD: the padded length is a multiple of it (2cp, x tp under SP) */
    int32_t *cp_i32;        /* [4N] and [N]: the whole micro batch while it is split */
    int32_t *cp_rows;       /* [N]: each local token's row in the whole micro batch (gpt_batch.rows) */
    float *cp_f32;
    double cp_ntok;         /* the loss tokens of the last micro batch's whole sequences */
    /* the timeline (train/timeline.h; NULL: off, or an iteration not recorded) */
    tl_rec *tl_open_rec;    /* open for the run (--timeline-dir) */
    tl_rec *tl;             /* = tl_open_rec while the current iteration is recorded */
    int64_t tl_start;       /* iterations completed when this run started */
    /* mixture of experts (trainer_moe.c): the log interval's sums, tokens per expert of the
     * last step [L][E], each layer's router-collapse streak, health events so far */
    double moe_lb_sum, moe_z_sum, moe_forwards, moe_dropped;
    int64_t *moe_tpe;
    int *moe_streak;
    int32_t *moe_cnt; /* [E] one layer's counts for the expert bias update */
    int64_t moe_collapses;
    /* multi-token prediction (trainer_mtp.c): each depth's loss sums since the last log line */
    double mtp_sum[GPT_MAX_MTP], mtp_count;
    /* --use-distributed-optimizer (trainer_dopt.c; NULL without): opt.m and opt.v stay NULL */
    struct tr_dopt *dopt;
    struct tr_overlap *ovl; /* --overlap-grad-reduce (trainer_overlap.c), NULL: off */
    struct tr_pgather *pg;  /* --overlap-param-gather (trainer_pgather.c), NULL: off */
    bool ovl_reduce;        /* this round's share is reduced after (a training round, not a check round) */
    /* expert parallelism (trainer_ep.c; epn 1 without; its groups g.ep, g.edp, g.erep): the
     * flat buffers' runs of expert and other tensors (the gradients' reductions). g.ep is the
     * expert-tensor x expert group (the expert group itself at etpn 1); etpn: the
     * expert-tensor size (1, or the tensor size: the experts split over the tensor group) */
    int epn, epr, etpn;
    struct tr_ep_run *ep_runs;
    int nep_runs;
    uint64_t ep_bytes_logged; /* the exchange's counters at the last log line */
    double ep_secs_logged;
};

/* The loss scale of this step (--fp16; 1 without): the loss's backward and the auxiliary
 * losses' are weighted by it (trainer.c, pipeline.c). */
static inline float trainer__loss_scale(const trainer *t) { return t->scaler.scale; }

/* trainer_dopt.c: the distributed optimizer's share of trainer_new (before gpt_init: the
 * model's buffers take its layout; joining: a replacement, its shards hold nothing yet; after
 * it: the copy of the neighbour's initial parameters), the
 * reduce-scatter and norm (in the data-parallel reduction), the norm, the shards' update,
 * the pending all-gather of the parameters (after the iteration is committed), a restart's
 * handover of the shards (trainer_sync_state), and the teardown. */
typedef struct tr_dopt tr_dopt;
int trainer__dopt_setup(trainer *t, bool joining);
int trainer__dopt_init_shards(trainer *t);
void trainer__dopt_free(trainer *t);
int trainer__dopt_reduce(trainer *t);
int trainer__dopt_norm(trainer *t, double *out);
int trainer__dopt_step(trainer *t, double lr, double grad_norm, uint64_t *sum);
int trainer__dopt_sync(trainer *t);
int trainer__dopt_handover(trainer *t, bool held);
/* The overlapped reduction's view of the layout (trainer_overlap.c): the buckets (with
 * expert parallelism the dense layout's, then the experts', over the expert-data-parallel
 * group: bucket_expert), one bucket's collective (from the communication thread), the rest
 * of dopt_reduce after them, the group (choosing the all-reduce path for this generation). */
int trainer__dopt_nbuckets(const trainer *t);
bool trainer__dopt_bucket_expert(const trainer *t, int b);
void trainer__dopt_bucket(const trainer *t, int b, size_t *lo, size_t *hi);
/* Whether a copy of the buckets' bounds (the overlap's, the gather's: who) is the layout's
 * (CO_EINTERNAL with a detail where not: a re-partition left it stale). */
int trainer__dopt_buckets_match(const trainer *t, int nb, const size_t *lo, const size_t *hi, const char *who);
int trainer__dopt_reduce_bucket(trainer *t, struct cm_comm *g, int b);
int trainer__dopt_reduce_finish(trainer *t);
struct cm_comm *trainer__dopt_group(trainer *t);
/* The runs [lo, hi) of the gradient buffer this rank counts in the model's norm (as
 * gpt_tp_grad_sumsq: the tied embedding's copy not, rows several tensor ranks hold on the
 * first only); *runs malloc'ed, n pairs. */
int trainer__norm_runs(trainer *t, size_t **runs, int *nruns);
/* --overlap-grad-reduce (trainer_overlap.c): set up after the layout; arm before a share's
 * backwards (clears what was posted); last: the next backward is its chunk's last micro
 * batch's (its layers' buckets start as their gradients are final); flush after the
 * gradients are final (tensor-group sums, tied embedding): the remaining buckets start, and
 * *local_norm (when the validator wants it) is this replica's norm of the gradients as they
 * were before the reduction; wait: every bucket's collective is done (the step's average
 * and norm follow). drain: a thread left running after an error is stopped. */
typedef struct tr_overlap tr_overlap;
int trainer__overlap_setup(trainer *t);
void trainer__overlap_free(trainer *t);
void trainer__overlap_arm(trainer *t);
void trainer__overlap_last(trainer *t, bool last, bool early);
int trainer__overlap_flush(trainer *t, double *local_norm);
int trainer__overlap_wait(trainer *t);
void trainer__overlap_drain(trainer *t);
/* The gradient group's own transport (tr_groups.grad_ovl) where it matches the gradient group
 * (its size, this rank's place, the shared-memory path), else NULL; whether the training
 * thread communicates in the forward and backward (tensor, pipeline, context or expert
 * parallelism), so that a communication thread needs a transport of its own. */
struct cm_comm *trainer__grad_own(const trainer *t);
/* The same for the expert-data-parallel group (tr_groups.edp_ovl against t->g.edp). */
struct cm_comm *trainer__edp_own(const trainer *t);
bool trainer__forward_communicates(const trainer *t);
/* --overlap-param-gather (trainer_pgather.c): set up after the distributed optimizer;
 * start: the committed step's buckets are gathered on a thread, the forward hook waits for
 * each before its first use; finish: every bucket waited for, the thread joined (what
 * trainer__dopt_sync does while one is pending); cancel: a thread in flight stopped and
 * joined (a restart: the handover gathers again). The distributed optimizer's side:
 * trainer__dopt_gather_start (after the commit: the thread, or the gather at once without
 * the flag) and one bucket's all-gather from the thread. */
typedef struct tr_pgather tr_pgather;
int trainer__pgather_setup(trainer *t);
void trainer__pgather_free(trainer *t);
int trainer__pgather_start(trainer *t);
bool trainer__pgather_pending(const trainer *t);
int trainer__pgather_finish(trainer *t);
void trainer__pgather_cancel(trainer *t);
/* The pipeline's chunk whose forward runs next (the hook after its layers waits only where
 * it holds the final norm, head or MTP); -1: not known (every bucket waited for there). */
void trainer__pgather_chunk(trainer *t, int chunk);
int trainer__dopt_gather_start(trainer *t);
int trainer__dopt_gather_bucket(trainer *t, struct cm_comm *g, int b);
/* The trainer changed n parameters at `at` (in the model's buffer) on every rank alike: the
 * redundant shard copy follows (dopt_copy_refresh). */
void trainer__dopt_params_moved(trainer *t, const float *at, size_t n);


/* Reads micro batch samples [first, first+B) of split s into buffer `into` and describes it
 * in *b (tensor rank 0 reads, the group receives them). */
int trainer__load_batch(trainer *t, int s, int64_t first, tr_batch *into, gpt_batch *b);

/* trainer_moe.c: the model's MoE settings from the flags (before gpt_new), the aux losses'
 * weight and the statistics' buffers (after), each step's statistics and router-collapse
 * check, and the log line's and the metrics record's MoE items (a collective over the
 * data-parallel and model-parallel groups: every rank calls it at every log line). */
void trainer__moe_config(trainer *t, gpt_config *m);
int trainer__moe_setup(trainer *t);
void trainer__moe_free(trainer *t);
void trainer__moe_step(trainer *t);
/* Before an attempt of a step: the MoE and MTP statistics of an earlier attempt discarded. */
void trainer__aux_attempt(trainer *t);
/* Before the optimizer step: the step's MoE statistics taken, the expert biases moved (a
 * collective over the data-parallel group with the expert bias). */
int trainer__moe_pre_step(trainer *t);
/* The attempt's MoE and MTP losses so far into a report to the validator (reported, not
 * validated). */
void trainer__aux_report(trainer *t, rr_report *r);
int trainer__moe_log(trainer *t, char *text, size_t tn, char *json, size_t jn);
/* trainer_mtp.c: the MTP settings (before gpt_new), each step's depth losses, and the log
 * line's and metrics record's MTP items (a collective, as trainer__moe_log). */
void trainer__mtp_config(trainer *t, gpt_config *m);
void trainer__mtp_step(trainer *t);
int trainer__mtp_log(trainer *t, char *text, size_t tn, char *json, size_t jn);
/* A line for the event sink (the run report) and the log, as faults and repairs are. */
void trainer__emit(trainer *t, const char *line);
/* trainer_cp.c: context parallelism. cp_setup (in trainer_new, before the model) checks
 * the groups, fills the model configuration's cp fields and t->local_T (the model's tokens
 * per sequence); cp_localize cuts the micro batch just read (whole sequences, b->T = seq) to
 * this rank's tokens (b->T = local, b->seg the local document ids) and counts the loss tokens
 * of the whole sequences in t->cp_ntok; cp_set_groups: a new generation's context, data x
 * context and tensor x context groups (nothing at cp 1). */
int trainer__cp_setup(trainer *t, const trainer_data *data, gpt_config *m);
void trainer__cp_set_groups(trainer *t, const tr_groups *g);
void trainer__cp_free(trainer *t);
int trainer__cp_localize(trainer *t, tr_batch *x, gpt_batch *b, int64_t first);
/* trainer_ep.c: expert parallelism. ep_setup (before gpt_new) checks the groups and sets the
 * model's expert rank; ep_model_ready (after) hands the layers their group and lists the
 * buffers' runs; ep_reduce_grads sums the experts' gradients over the expert-data-parallel
 * group and the rest over the data-parallel group, scaled by 1/dp; ep_grad_norm: the dense
 * tensors' over the replica, the experts' over the expert group x pipeline;
 * ep_replica_of: a world rank's expert-data-parallel replica (its place in t->edp);
 * ep_check_share: the data-parallel share this rank recomputes in a check round (-1: none). */
int trainer__ep_setup(trainer *t, const trainer_data *data, gpt_config *m);
/* A new generation's expert groups (nothing without expert parallelism). */
void trainer__ep_set_groups(trainer *t, const tr_groups *g);
int trainer__ep_model_ready(trainer *t);
void trainer__etp_tensor_group(trainer *t);
void trainer__ep_free(trainer *t);
int trainer__ep_reduce_grads(trainer *t);
int trainer__ep_grad_norm(trainer *t, double *out);
/* The runs of one kind trainer__ep_reduce_grads reduces: how many; the kind of the element at
 * offset `at` (true: an expert's) and where its run starts. */
int trainer__ep_nruns(const trainer *t);
bool trainer__ep_run_at(const trainer *t, size_t at, size_t *start);
int trainer__ep_replica_of(const trainer *t, int world_rank);
int trainer__ep_check_share(const trainer *t, int helper, int suspect);

/* One timeline record of the current iteration (nothing when it is not recorded). */
static inline void trainer__tl(trainer *t, tl_kind k, int mb, int chunk, double t0) {
    if (t->tl) tl_event(t->tl, k, t->iteration + 1, mb, chunk, t0, tl_now());
}

/* The dropout seed of the micro batch at place gmb of the global batch (the iteration's). */
uint64_t trainer__dropout_seed(const trainer *t, int64_t gmb);
/* The model's gradient norm: this rank's slices over the model-parallel group (each tensor
 * slice and the tied embedding counted once; gpt_tp_grad_sumsq). */
int trainer__grad_norm(trainer *t, double *out);
/* pipeline.c: data_rank's share of a step as trainer_train's compute_share (pp > 1), and an
 * evaluation's loss and token sums over this replica's micro batches */
/* Pipeline rank r's chunk ci of a placement (p ranks, v chunks each), as gpt.h's chunk. */
gpt_chunk trainer__chunk_of(const pp_stage *st, int p, int v, int r, int ci, int slots);
int trainer__pipeline_share(trainer *t, int data_rank, int64_t step, double *loss_out, double *tok_out,
                            double *grad_norm);
int trainer__pipeline_evaluate(trainer *t, int split, double *loss_out, double *tok_out);
/* The iteration's global batch: its micro batches, the pipeline schedule over them (trainer.c). */
int trainer__set_batch(trainer *t, int gbs);
/* The micro batches data-parallel rank r takes of a global batch of gbs samples. */
int trainer__share(const trainer *t, int gbs, int r);
/* --calculate-per-token-loss: the weight of a loss token in step `step` (the step's tokens
 * over the gradient group, counted once per step), set as the auxiliary losses' too. */
int trainer__per_token_weight(trainer *t, int data_rank, int64_t step, float *w);
/* This rank's micro batches M and the pipeline's schedule over them (1..M_max). */
int trainer__use_m(trainer *t, int M);
/* --elastic's sample check: a training micro batch's samples from position first (in
 * training order) into the step's count, sum and sum of squares (context rank 0's only). */
void trainer__count_samples(trainer *t, int64_t first);
/* A micro batch's weight in the step for its ntok loss tokens (0: the auxiliary losses'). */
double trainer__mb_weight(const trainer *t, double ntok);

/* Faults injected into this rank (resilience/inject.h) around a micro batch: before its
 * forward (kill, stop, hang, slow; a flipped weight or activation); its loss (nan, inf, a
 * spike: *loss replaced; returns FI_NAN or FI_INF when the gradients must be poisoned too,
 * else -1); after its backward (the poison, a flipped gradient); any phase's process faults. */
void trainer__inject_forward(trainer *t, int64_t step, int mb, int N);
int trainer__inject_loss(trainer *t, int64_t step, int mb, int data_rank, double *loss);
void trainer__inject_grads(trainer *t, int64_t step, int mb, int poison);
void trainer__fire_process_faults(trainer *t, int64_t step, int mb, fi_phase ph);

#endif
