/* rank.h - the rank actor's life in one process (worker/): its communicators from the
 * supervisor's assignment, its trainer, the validator link and fault injection
 * (resilience.h), the checkpoint hooks (ckpt.h), and the generation loop of in-process
 * restart, until training ends; then the final evaluation.
 *
 *   assignment (generation 1) ── communicator ── trainer ── load/replica state ── train
 *        ▲                                                                         │
 *        │  Abort: the step unwinds to the last committed iteration, the communicator
 *        └── is destroyed, the rank waits at the restart barrier for the next
 *            generation's assignment (maybe another rank), rebuilds the communicator and
 *            takes the state of the rank the supervisor names; the trainer is kept
 *
 * cli/ parses the flags, opens the supervisor link and chooses single process, supervisor
 * or worker; everything from the assignment on happens here. */
#ifndef COHORT_WORKER_RANK_H
#define COHORT_WORKER_RANK_H

#include "common/config.h"
#include "worker/link.h"
#include "train/trainer.h"

#include <signal.h>
#include <stdio.h>

/* exit statuses, as `cohort train` documents them (cli/cli.h has the same values) */
enum { WK_OK = 0, WK_FAILURE = 1, WK_USAGE = 2, WK_NAN = 3 };

typedef struct wk_options {
    co_config *config;              /* finalized */
    const trainer_data *data;
    FILE *out;                      /* where this rank prints (NULL: it does not) */
    sv_link *link;                  /* the supervisor link (NULL: a single process) */
    const sv_assignment *asg;       /* the first assignment (with link) */
    volatile sig_atomic_t *stop;    /* raised by a signal or the supervisor's stop order */
    volatile sig_atomic_t *abort_flag; /* raised when the supervisor aborts the generation */
    /* after a run that ended well (its final evaluation done): the caller's epilogue with
     * the validation loss (the embedded job's samples); NULL: none */
    void (*on_done)(void *ctx, trainer *t, double valid_loss);
    void *ctx;
} wk_options;

/* A worker process joins the job (started by a supervisor: sv_link_wanted): connects to the
 * supervisor, registers with its flags (c: parsed, not yet finalized; the supervisor
 * refuses a node whose flags differ) and waits for its assignment (a warm spare,
 * COHORT_SPARE=1, until it is given a rank). stop and signalled as sv_link_open's: a
 * signal of this worker's own does not end the wait (the ranks stop together at the start
 * of training), the supervisor's stop order does. Returns sv_link_open's codes
 * (CO_EABORTED: the job stopped before it began, a clean end). */
int wk_join(const co_config *c, volatile sig_atomic_t *stop, volatile sig_atomic_t *signalled, sv_link **link,
            sv_assignment *asg);

/* Trains this rank to the end, through every in-process restart. Returns a WK_ status. */
int wk_run(const wk_options *o);

#endif
