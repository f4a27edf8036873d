/* trainer.h - the training loop of one process: data -> forward -> loss -> backward ->
 * clip -> AdamW, evaluation, Megatron's log line, metrics file, exit conditions.
 *
 * The trainer owns the backend, the model, the optimizer and the three data iterators.
 * It never exits the process and never installs signal handlers: the caller passes a flag
 * that a handler sets, and the trainer finishes the current iteration and returns. */
#ifndef COHORT_TRAIN_TRAINER_H
#define COHORT_TRAIN_TRAINER_H

#include "common/config.h"
#include "model/gpt.h"
#include "train/tr_groups.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct trainer trainer;

/* How long a rank waits for its peers in a step's collectives (and in the checkpoint load's
 * agreement, worker/ckpt.c) before giving up. */
#define TRAIN_COMM_TIMEOUT_MS (10 * 60 * 1000)

/* Why train() returned. */
typedef enum {
    TRAIN_DONE = 0,        /* reached --train-iters */
    TRAIN_EXIT_INTERVAL,   /* --exit-interval */
    TRAIN_EXIT_DURATION,   /* --exit-duration-in-mins */
    TRAIN_SIGNAL,          /* SIGTERM / SIGINT */
    TRAIN_NAN,             /* NaN or Inf loss or gradient norm */
    TRAIN_REJECTED,        /* the rerun state machine stopped the job (a reproducible fault) */
} train_end;

typedef struct trainer_data {
    const char *prefix;    /* .bin/.idx prefix, or NULL with cfg->mock_data */
    int vocab_size;        /* tokenizer vocabulary (before padding) */
    int eod;               /* end-of-document token id */
    /* where metrics records go instead of opening cfg->metrics_file (a worker forwards
     * them to its supervisor); NULL: the file itself. Not closed by the trainer. */
    FILE *metrics;
    /* a replacement joining a running job after an in-process restart: the data index
     * caches exist, the ranks already running are not in trainer_new (no barriers) */
    bool joining;
    /* with --device cuda: the GPU to use, the worker's local rank on its node (0 alone) */
    int cuda_device;
    /* the communicators (train/tr_groups.h): data parallel (NULL: one process), tensor
     * (the model split over it), pipeline (this rank's stage's chunks and Megatron's schedule),
     * context and expert groups, each NULL where its parallelism is off */
    tr_groups groups;
} trainer_data;

/* Builds everything from a finalized configuration. log: where log lines go (stdout; NULL
 * for a rank that does not print). With data->groups.dp this rank takes its share of every
 * global batch, gradients and loss reports are all-reduced each step, and rank 0 builds the
 * data index caches before the others. */
int trainer_new(trainer **out, const co_config *cfg, const trainer_data *data, FILE *log);
void trainer_destroy(trainer **t);

/* Trains until an exit condition; stop may be set asynchronously by a signal handler. */
int trainer_train(trainer *t, volatile sig_atomic_t *stop, train_end *why);
/* Evaluates eval_iters global batches of split (1 valid, 2 test) and prints Megatron's
 * "validation loss at ..." block. Returns the mean loss in *loss (NaN if the split is empty). */
int trainer_evaluate(trainer *t, int split, const char *label, double *loss);

/* Everything about the run's position a checkpoint must carry to resume it exactly
 * (besides the parameters and optimizer state). */
typedef struct trainer_progress {
    int64_t iteration;       /* completed iterations */
    int64_t consumed[3];     /* samples consumed of train, valid, test */
    int64_t skipped, nan_iters;
    /* log accumulators since the last log line, so a resumed run logs the same lines */
    double loss_sum, tok_sum;
    int iters_since_log;
    /* --fp16's loss scaler (optim/grad_scaler.h): the scale (1 without --fp16; 0 when set:
     * keep the configured one) and its trackers */
    float loss_scale;
    int64_t growth_tracker, hysteresis_tracker;
} trainer_progress;

void trainer_get_progress(const trainer *t, trainer_progress *p);
void trainer_set_progress(trainer *t, const trainer_progress *p);
struct opt_adamw *trainer_optimizer(trainer *t);
/* --use-distributed-optimizer (train/trainer_dopt.c): each rank keeps only its shard of the
 * moments, trainer_optimizer's m and v are NULL but between these two calls, which allocate
 * the full moments (zero, for a load to fill) and free them (scatter: each rank
 * takes its shard and its copy of its neighbour's from them, after a load). Checkpoint loads
 * use them (a save writes each rank's shard: trainer_dopt_shard); the moments keep the
 * replicated optimizer's names and layout. No-ops without. */
bool trainer_dopt_on(const trainer *t);
int trainer_dopt_moments_begin(trainer *t);
int trainer_dopt_moments_end(trainer *t, bool scatter);
/* The layout and this rank's shard of the moments (dopt_layout's shard storage), and its
 * data-parallel rank: a save writes each rank's pieces of the moments (worker/ckpt_parts.c).
 * The layout's parameter u is the model's tensors unit_first[u] .. unit_first[u + 1] - 1 (a
 * MoE layer's packed run is one parameter). NULL without the distributed optimizer. */
struct dopt_layout;
const struct dopt_layout *trainer_dopt_shard(const trainer *t, const float **m, const float **v, int *rank,
                                             const int **unit_first);
/* The layout another model shard's ranks build from their tensor table (gpt_tensor_table's,
 * at that tensor rank and stage), with its unit_first (to free): what a save lists every
 * shard's pieces of the moments from. */
struct gpt_tensor;
int trainer_dopt_layout_of(const trainer *t, const struct gpt_tensor *tab, int nt, struct dopt_layout *L,
                           int **unit_first);
/* With expert parallelism (trainer_dopt_experts true): the dense (experts false) or the
 * experts' layout another shard's ranks build from their table, over the gradient or the
 * expert-data-parallel group; unit u is tensors list[first[u] .. first[u + 1] - 1] laid out
 * one after another (both to free). And this rank's shard of the experts' moments, its rank
 * in the expert-data-parallel group. */
bool trainer_dopt_experts(const trainer *t);
int trainer_dopt_kind_layout_of(const trainer *t, const struct gpt_tensor *tab, int nt, bool experts,
                                struct dopt_layout *L, int **list, int **first);
const struct dopt_layout *trainer_dopt_xshard(const trainer *t, const float **m, const float **v, int *rank);
const co_config *trainer_config(const trainer *t);

/* The parameters whole on this rank: with --overlap-param-gather a step's all-gather runs on
 * a thread until the next forward reads them; a hook that reads them (a save) or
 * communicates calls this first. 0 or the gather's error. */
int trainer_params_sync(trainer *t);

/* How many hooks of each kind a trainer holds. */
#define TRAINER_MAX_HOOKS 4

/* Adds a hook (run in the order added) called on the training thread after every completed
 * iteration, and once more with final = true when training stops for any reason but an
 * error. A negative return stops training with that error. Used for checkpoint saving and
 * for the worker's heartbeat progress. CO_ERANGE (nothing added) past TRAINER_MAX_HOOKS. */
typedef int (*trainer_hook)(trainer *t, void *ctx, bool final, train_end why);
int trainer_set_hook(trainer *t, trainer_hook fn, void *ctx);

/* Adds a hook called on the training thread just before each optimizer step, the one moment
 * parameters and optimizer state change. An async checkpoint uses it to wait until its
 * snapshot copy, made during forward and backward, is complete. CO_ERANGE (nothing added)
 * past TRAINER_MAX_HOOKS. */
typedef int (*trainer_pre_step_hook)(trainer *t, void *ctx);
int trainer_set_pre_step_hook(trainer *t, trainer_pre_step_hook fn, void *ctx);

/* ---- validation of every iteration (the rerun state machine, resilience/rerun.h) ----
 * With a validator, each iteration's results are reported before the gradient reduction
 * and the optimizer step waits for the verdict: ACCEPT steps, RERUN replays the step in
 * place (same micro batches, same dropout streams, gradients cleared), CHECK makes the
 * helper rank recompute the suspect's micro batches, REPAIR makes every rank take the
 * helper's parameters and optimizer state (a broadcast) and replay, SKIP drops the
 * iteration's update, STOP ends training with TRAIN_REJECTED. */
#include "resilience/inject.h"
#include "resilience/rerun.h"

enum { TR_PH_DATA, TR_PH_FORWARD, TR_PH_BACKWARD, TR_PH_ALLREDUCE, TR_PH_OPTIMIZER, TR_NPHASES };
extern const char *const trainer_phase_names[TR_NPHASES];

typedef struct trainer_validator {
    /* this rank's results of one round; called before the reduction, must not block */
    int (*report)(void *ctx, const rr_report *r, const double phase_ms[TR_NPHASES]);
    /* blocks until the verdict for (iteration, the round just reported) */
    int (*verdict)(void *ctx, int64_t iteration, int attempt, rr_verdict *v);
    /* the parameter checksums of a round reported with has_sum (NULL: the validator
     * compares none; a one-rank job has no replica to compare with); must not block */
    int (*checksum)(void *ctx, const rr_report *r);
    void *ctx;
} trainer_validator;
void trainer_set_validator(trainer *t, const trainer_validator *v);

/* Faults to inject on this rank, which the specs name as rank (its world rank; tests and
 * drills; the schedule stays the caller's). */
void trainer_set_injector(trainer *t, fi_schedule *s, int rank);
/* Iterations (1-based, as logged) whose update is skipped without computing them. */
void trainer_set_skips(trainer *t, const int64_t *iters, int n);
/* Called with one line for every fault injected or repaired on this rank (log, report). */
typedef void (*trainer_event_fn)(void *ctx, const char *line);
void trainer_set_event_sink(trainer *t, trainer_event_fn fn, void *ctx);

/* The parameters and optimizer state were replaced from outside (a checkpoint loaded into
 * a running trainer): what was noted as written no longer holds. */
void trainer_state_replaced(trainer *t);

/* ---- in-process restart ----
 * After an abort, trainer_train returns at the last step this rank committed (its state is
 * always that of a completed iteration: an abort only interrupts collectives and waits that
 * come before the optimizer step or after it completed). The caller drops the old
 * generation's groups (trainer_set_groups(t, NULL)), builds the new generation's, gives them
 * here, and every rank takes rank `root`'s parameters, optimizer state and progress
 * (trainer_sync_state); then trainer_train continues. The trainer keeps only the groups its
 * configuration uses (as trainer_new does). */
void trainer_set_groups(trainer *t, const tr_groups *g);
/* The model's configuration on another rank of this replica: tensor rank tp_rank, pipeline
 * rank pp_rank (its chunks; one slot each): what gpt_tensor_table needs to list that rank's
 * tensors (checkpoints). */
gpt_config trainer_model_config_of(const trainer *t, int tp_rank, int pp_rank);
/* The sizes of this rank's replica: tensor and pipeline ranks. */
void trainer_model_parallel(const trainer *t, int *tp, int *tp_rank, int *pp, int *pp_rank);
/* The expert-parallel size (1 without) and this rank's place in its expert group; a shard's
 * configuration (trainer_model_config_of) holds expert rank e's experts with ep_rank = e. */
void trainer_expert_parallel(const trainer *t, int *ep, int *ep_rank);
/* With --timeline-dir: opens this rank's timeline file (world rank of world ranks), which
 * records the iterations --timeline-iterations names after the current one (docs/timeline.md).
 * 0 or the error (the directory or file cannot be made). */
int trainer_open_timeline(trainer *t, int world_rank, int world);
/* Called with the pipeline rank this rank waits for a message from, and with -1 when it no
 * longer waits (any thread may read what the callee stores). */
void trainer_set_wait_fn(trainer *t, void (*fn)(void *ctx, int stage), void *ctx);
/* "pipeline stage 1 of 2: layers 2-3 (and the head and loss)" into buf (0 without a pipeline). */
int trainer_describe_stage(const trainer *t, char *buf, size_t n);
int trainer_sync_state(trainer *t, int root);
/* Where log lines and metrics records go from now on (the logging rank changed after a
 * restart with shifted ranks; NULL: this rank does not print). Neither is closed here. */
void trainer_set_output(trainer *t, FILE *log, FILE *metrics);
/* A flag raised when the job is aborted (a hang injected in compute polls it). */
void trainer_set_abort_flag(trainer *t, volatile sig_atomic_t *flag);

/* Time spent per phase in the last iteration (ms). */
void trainer_phase_ms(const trainer *t, double out[TR_NPHASES]);

int64_t trainer_iteration(const trainer *t);
/* Whether the validator's verdict on the iteration just applied ordered a checkpoint after it
 * (--save-interval auto under a supervisor: every rank gets the same verdict). */
bool trainer_save_ordered(const trainer *t);
/* Whether the next iteration's global batch differs from the last one's (a batch ramp-up
 * steps; Megatron saves a checkpoint then). */
bool trainer_batch_changes(const trainer *t);
gpt_model *trainer_model(trainer *t);
/* Where this trainer's metrics records go (NULL: none; only the logging rank has one). */
FILE *trainer_metrics_stream(trainer *t);
/* Mean lm loss of the most recent logged interval. */
double trainer_last_loss(const trainer *t);

#endif
