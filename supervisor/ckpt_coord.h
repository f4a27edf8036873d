/* ckpt_coord.h - the supervisor's side of a multi-rank checkpoint (docs/checkpoints.md):
 * collects every rank's acknowledgement of its part of a save, then commits (manifest,
 * rename, parent fsync, tracker, retention) and answers COMMIT, or removes the temporary
 * directory and answers ABORT. Private to supervisor/; runs on the supervisor's loop. */
#ifndef COHORT_SUPERVISOR_CKPT_COORD_H
#define COHORT_SUPERVISOR_CKPT_COORD_H

#include "protocol/wire.h"

#include <stdint.h>
#include <stdio.h>

typedef struct svc svc;

/* Sends body to rank `rank` (the supervisor's mailbox). */
typedef int (*svc_send_fn)(void *ctx, int rank, const ProtobufCMessage *body);

/* save_dir: --save; keep: --most-recent-k (<= 0 keeps all); world: ranks that write;
 * job_id: names the shared temporary directory (as the workers name it). */
int svc_new(svc **out, const char *save_dir, int keep, int world, uint64_t job_id, svc_send_fn send, void *ctx);
/* Retention's --keep-every (0: none) beside keep, and --save-space-margin: after a commit,
 * free space in the save directory below that checkpoint's size times margin stops saves
 * (0: never). */
void svc_set_limits(svc *c, int keep_every, double space_margin);
/* Why saves were stopped ("": they were not). The answers to commits say so from then on
 * (CheckpointCommand.saves_stopped), and so does svc_resend_stopped after a restart. */
const char *svc_saves_stopped(const svc *c);
/* After an in-process restart's assignments: tells every rank again that saves are stopped
 * (a replacement process has not heard it). Nothing when they are not. */
void svc_resend_stopped(svc *c);
/* The rerun state machine's state (JSON object text) goes into each committed manifest. */
void svc_set_rerun_state(svc *c, int (*save)(void *ctx, char *buf, size_t n), void *ctx);
/* Where a commit is recorded ({"event":"checkpoint","iteration","commit_ms"}: from the first
 * rank's acknowledgement to the commit; the metrics stream, NULL: nowhere). */
void svc_set_metrics(svc *c, FILE *metrics);
/* A rank's CheckpointAck. */
void svc_on_ack(svc *c, int rank, const Cohort__V1__CheckpointAck *ack);
/* The job is failing (a rank died or failed, heartbeats lost): a save in progress is
 * aborted and its directory removed; later acknowledgements are answered with ABORT. */
void svc_abort(svc *c, const char *why);
/* An in-process restart: a save in progress is aborted and its directory removed, and
 * later saves proceed as usual (the old generation's acknowledgements never reach here). */
void svc_restart(svc *c, const char *why);
/* --elastic: the world shrank or grew (at most the world svc_new was given): a save in progress
 * is aborted, the next one waits for `world` ranks. */
int svc_set_world(svc *c, int world);
/* Removes the job's unfinished temporary directories (every local worker has exited). */
void svc_destroy(svc **c);
/* Checkpoints committed so far (0 with c NULL), the newest one's iteration in *iteration (-1: none). */
int64_t svc_committed(const svc *c, int64_t *iteration);

#endif
