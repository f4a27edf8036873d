/* resilience.h - a rank's resilience flags wired to its trainer (see resilience.c). */
#ifndef COHORT_WORKER_RESILIENCE_H
#define COHORT_WORKER_RESILIENCE_H

#include "worker/ckpt.h"
#include "common/config.h"
#include "resilience/inject.h"
#include "resilience/rerun.h"
#include "worker/link.h"
#include "train/trainer.h"

#include <stdio.h>

typedef struct wk_resil wk_resil;

/* The rerun state machine's options from the flags. */
void wk_rr_options(const co_config *c, int world, rr_options *o);
/* The --inject schedule (flags checked: CO_EINVAL, the message in co_err_detail). */
int wk_inject_parse(const co_config *c, int world, fi_schedule *s);

/* link NULL: one process (the state machine runs here); else a supervised worker. Errors: the
 * CO_E code, the message in co_err_detail. */
int wk_resil_new(wk_resil **out, const co_config *c, sv_link *link, int rank, int world);
/* Wires x to t (its hooks, validator, injector, skips): 0, or the trainer's refusal of a hook. */
int wk_resil_attach(wk_resil *x, trainer *t, FILE *log);
/* One process: the state machine's state is saved with checkpoints and restored from the
 * one wk_ckpt loaded. */
void wk_resil_attach_ckpt(wk_resil *x, wk_ckpt *k);
/* After a restart: this rank's faults at steps up to `step` (the furthest the job got)
 * count as fired: the process that held the rank before (a dead one, or another survivor
 * before a shift) fired them. Call after wk_resil_set_rank. */
void wk_resil_mark_replayed(wk_resil *x, int64_t step);
/* This process's rank changed (a restart with shifted ranks). */
void wk_resil_set_rank(wk_resil *x, int rank);
/* Prints what the in-process state machine handled; frees. NULL-safe. */
void wk_resil_destroy(wk_resil **x);

#endif
