/* train_ckpt.h - checkpoints in `cohort train`: Megatron's --load/--save flags wired to the
 * trainer (progress, model, optimizer) through three calls.
 *
 *   ck_train_prepare(&cfg, log)   before co_config_finalize: with --load, takes the model
 *                                 flags from the checkpoint (--use-checkpoint-args) and its
 *                                 seed (the generators' state; not with --no-load-rng or
 *                                 --finetune)
 *   ck_train_attach(&ck,t,log,r,w) after trainer_new: loads --load (falling back to the
 *                                 previous good checkpoint, or refusing with
 *                                 --refuse-corrupt-checkpoint) and, with --save, installs
 *                                 the trainer hook that saves every --save-interval and at
 *                                 the end (done, exit interval or duration, SIGTERM)
 *   ck_train_set_coordinator(ck,co) several ranks: each writes its share, the supervisor
 *                                 commits (docs/checkpoints.md)
 *   ck_train_destroy(&ck)         before trainer_destroy: waits for a background save */
#ifndef COHORT_CHECKPOINT_TRAIN_CKPT_H
#define COHORT_CHECKPOINT_TRAIN_CKPT_H

#include "checkpoint/ckpt.h"
#include "common/config.h"
#include "train/trainer.h"

#include <stdio.h>

typedef struct ck_train ck_train;

int ck_train_prepare(co_config *c, FILE *log);
/* rank, world: this process's data-parallel rank and size; every rank loads. Saving: rank
 * 0 writes the whole checkpoint and commits it, unless ck_train_set_coordinator is called.
 * log may be NULL. */
int ck_train_attach(ck_train **out, trainer *t, FILE *log, int rank, int world);
/* With world > 1 and --save: every rank writes its share of the files (writers = world)
 * and coord (the supervisor, through the worker's link) commits; call it on every rank
 * after ck_train_attach and before training. No-op otherwise. */
int ck_train_set_coordinator(ck_train *k, const ck_coord *coord);
void ck_train_destroy(ck_train **p);
/* This process's data-parallel rank changed (an in-process restart with shifted ranks). */
void ck_train_set_rank(ck_train *k, int rank);
/* The rerun state machine's state travels in every checkpoint: save writes it (JSON object
 * text into buf; nonzero: none) at each save; after ck_train_attach loaded a checkpoint,
 * ck_train_loaded_rerun_state is its state (NULL: none). */
void ck_train_set_rerun_state(ck_train *k, int (*save)(void *ctx, char *buf, size_t n), void *ctx);
const char *ck_train_loaded_rerun_state(const ck_train *k);

#endif
