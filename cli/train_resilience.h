/* train_resilience.h - `cohort train`'s resilience flags wired to the trainer (see
 * train_resilience.c). Private to cli/. */
#ifndef COHORT_CLI_TRAIN_RESILIENCE_H
#define COHORT_CLI_TRAIN_RESILIENCE_H

#include "checkpoint/train_ckpt.h"
#include "common/config.h"
#include "resilience/inject.h"
#include "resilience/rerun.h"
#include "supervisor/link.h"
#include "train/trainer.h"

#include <stdio.h>

typedef struct cli_resil cli_resil;

/* The rerun state machine's options from the flags. */
void cli_rr_options(const co_config *c, int world, rr_options *o);
/* The --inject schedule (flags checked: CO_EINVAL with the message in err). */
int cli_inject_parse(const co_config *c, int world, fi_schedule *s, char *err, size_t n);

/* link NULL: one process (the state machine runs here); else a supervised worker. */
int cli_resil_new(cli_resil **out, const co_config *c, sv_link *link, int rank, int world, char *err, size_t n);
void cli_resil_attach(cli_resil *x, trainer *t, FILE *log);
/* One process: the state machine's state is saved with checkpoints and restored from the
 * one ck_train loaded. */
void cli_resil_attach_ckpt(cli_resil *x, ck_train *k);
/* After a restart: this rank's faults at steps up to `step` (the furthest the job got)
 * count as fired: the process that held the rank before (a dead one, or another survivor
 * before a shift) fired them. Call after cli_resil_set_rank. */
void cli_resil_mark_replayed(cli_resil *x, int64_t step);
/* This process's rank changed (a restart with shifted ranks). */
void cli_resil_set_rank(cli_resil *x, int rank);
/* Prints what the in-process state machine handled; frees. NULL-safe. */
void cli_resil_destroy(cli_resil **x);

#endif
