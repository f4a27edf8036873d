/* ckpt.h - a rank's checkpoints (worker/): Megatron's --load/--save flags wired to the
 * trainer (progress, model, optimizer) through three calls.
 *
 *   wk_ckpt_prepare(&cfg, log)   before the checks (trainer_config_check): with --load, takes the model
 *                                 flags from the checkpoint (--use-checkpoint-args) and its
 *                                 seed (the generators' state; not with --no-load-rng or
 *                                 --finetune)
 *   wk_ckpt_attach(&ck,t,log,r,w,c) after trainer_new: loads --load (every rank the same
 *                                 iteration, agreed over c; falling back together to the
 *                                 previous good checkpoint, or refusing with
 *                                 --refuse-corrupt-checkpoint) and, with --save, installs
 *                                 the trainer hook that saves every --save-interval and at
 *                                 the end (done, exit interval or duration, SIGTERM)
 *   wk_ckpt_set_coordinator(ck,co) several ranks: each writes its share, the supervisor
 *                                 commits (docs/checkpoints.md)
 *   wk_ckpt_destroy(&ck)         before trainer_destroy: waits for a background save */
#ifndef COHORT_WORKER_CKPT_H
#define COHORT_WORKER_CKPT_H

#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "common/config.h"
#include "train/trainer.h"

#include <stdio.h>

typedef struct wk_ckpt wk_ckpt;

int wk_ckpt_prepare(co_config *c, FILE *log);
/* rank, world: this process's rank and the world's size; every rank loads its parts, and
 * with agree (the world's communicator; NULL for one rank) the ranks agree on the iteration
 * first: all load the same one, fall back together, or stop together (never a mix).
 * Saving: rank 0 writes the whole checkpoint and commits it, unless wk_ckpt_set_coordinator
 * is called. log may be NULL. */
int wk_ckpt_attach(wk_ckpt **out, trainer *t, FILE *log, int rank, int world, cm_comm *agree);
/* With world > 1 and --save: every rank writes its share of the files (writers = world)
 * and coord (the supervisor, through the worker's link) commits; call it on every rank
 * after wk_ckpt_attach and before training. No-op otherwise. */
int wk_ckpt_set_coordinator(wk_ckpt *k, const ck_coord *coord);
void wk_ckpt_destroy(wk_ckpt **p);
/* This process's data-parallel rank changed (an in-process restart with shifted ranks). */
void wk_ckpt_set_rank(wk_ckpt *k, int rank);
/* --elastic: the job's world changed size (a shrink or a grow of the data-parallel size): this
 * rank writes writer `rank`'s share of a world-writer save from now on. Call with the trainer's
 * groups of the new generation set. */
int wk_ckpt_set_world(wk_ckpt *k, int world, int rank);
/* Loads the newest checkpoint of dir into the trainer in this process (a survivor of a
 * restart whose shard lost every replica: every rank resumes from the checkpoint). */
int wk_ckpt_reload(wk_ckpt *k, const char *dir, cm_comm *agree);
/* The rerun state machine's state travels in every checkpoint: save writes it (JSON object
 * text into buf; nonzero: none) at each save; after wk_ckpt_attach loaded a checkpoint,
 * wk_ckpt_loaded_rerun_state is its state (NULL: none). */
void wk_ckpt_set_rerun_state(wk_ckpt *k, int (*save)(void *ctx, char *buf, size_t n), void *ctx);
const char *wk_ckpt_loaded_rerun_state(const wk_ckpt *k);

#endif
