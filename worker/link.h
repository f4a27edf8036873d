/* link.h - a worker's side of the supervisor: registration, rank assignment, heartbeats
 * both ways, log forwarding, and stop/abort orders. It runs on its own actor thread (the
 * worker's mailbox thread), next to the training thread.
 *
 * The supervisor starts each worker with these environment variables:
 *   COHORT_SUPERVISOR   control endpoint of the supervisor
 *   COHORT_JOB_ID       the job id (hex)
 *   COHORT_LOCAL_RANK   this worker's index on its node
 *   COHORT_IPC_DIR      private directory for this node's ipc endpoints
 *   COHORT_NODE_RANK, COHORT_WORKER_ID (its global rank), COHORT_DATA_ENDPOINT (where it
 *   binds for its peers), COHORT_JOB_SECRET (the job secret file, several nodes only)
 * A worker that hears nothing from its supervisor for the heartbeat timeout stops (it
 * never trains headless): the stop flag is raised and the collectives are aborted. */
#ifndef COHORT_WORKER_LINK_H
#define COHORT_WORKER_LINK_H

#include "comm/comm.h"
#include "comm/zmq_comm.h"
#include "scheduler/groups.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct sv_link sv_link;

typedef struct sv_assignment {
    int rank, world;
    int tp, pp, cp, dp;
    int ep, etp;             /* the expert layout (1 and tp where unused) */
    bool tp_pp_dp;           /* --use-tp-pp-dp-mapping's rank order */
    unsigned long long emb_stages; /* the embedding group's pipeline stages (topo_layout's) */
    topo_coord coords;       /* this rank's place (have_coords): its shard is (tp, cp, pp) */
    bool have_coords;
    uint8_t nccl_id[128];    /* the generation's NCCL unique id (have_nccl_id: --device cuda) */
    bool have_nccl_id;
    uint64_t job_id, generation;
    char **endpoints; /* [world] data endpoints by rank */
    /* after an in-process restart (generation > 1): the iteration to resume at and the
     * rank whose parameters, optimizer state and progress this rank takes (-1: none) */
    int64_t start_iteration;
    int state_source;        /* a world rank: the data-parallel peer that holds this rank's shard */
    int64_t faults_through;  /* injected faults up to this step fired in processes now gone */
    char *checkpoint_dir;    /* state_source -1: load this checkpoint (NULL: none) */
} sv_assignment;

/* True when this process was started by a supervisor. */
bool sv_link_wanted(void);

/* Connects to the supervisor, registers and waits for the assignment (timeout_ms; < 0: a
 * warm spare, which waits until it is given a rank or the supervisor is gone).
 * stop: the flag the training loop polls; the link raises it on a stop order or when
 * the supervisor goes silent. signalled: the number of the first SIGINT/SIGTERM this
 * process got (0: none yet; NULL: not watched): the link tells the supervisor within 50 ms,
 * which stops the whole job cleanly; such a signal does not end the wait for the
 * assignment. Returns CO_EABORTED when the supervisor stopped the job before assigning
 * ranks (a clean stop, or a warm spare not needed), CO_EREMOTE when it failed or went
 * silent, CO_ETIMEOUT. config_json: this worker's flags (co_config_write_json), sent with
 * its registration so that the supervisor can refuse a node whose flags differ (NULL: none). */
int sv_link_open(sv_link **out, volatile sig_atomic_t *stop, volatile sig_atomic_t *signalled, int timeout_ms,
                 const char *config_json, sv_assignment *a);
/* What aborts the rank's collectives when the job is aborted or the supervisor is lost:
 * abort(ctx), called on the link's thread under its lock (it must not block); NULL
 * detaches. Detach before freeing what ctx points to. */
void sv_link_attach_abort(sv_link *l, void (*abort)(void *ctx), void *ctx);

/* The data plane's options for this job: defaults, CURVE with the job secret where the job
 * has one (several nodes: the workers' tcp endpoints; comm/zmq_comm.h), and, once restart is
 * enabled, its abort flag as the communicators' cancel flag (an Abort that comes while they
 * are being built). The key strings point into the link and live as long as it. */
void sv_link_data_options(sv_link *l, cm_zmq_options *o);
/* Progress for heartbeats (any thread). */
void sv_link_progress(sv_link *l, int64_t iteration);
/* The world rank whose pipeline message this worker waits for now (-1: none): carried by
 * the heartbeats, so that the supervisor names the stage a hung pipeline is stuck at. Any
 * thread. */
void sv_link_waiting(sv_link *l, int world_rank);
/* Checkpoint commit (docs/checkpoints.md): a rank acknowledges its part of a save (phase
 * WRITE: its files with size and XXH64, or status < 0 and the error), posted on the link
 * thread; then waits (timeout_ms) for the supervisor's CheckpointCommand: 0 on COMMIT,
 * CO_EABORTED on ABORT or when the job is aborted, CO_EREMOTE when the supervisor (this
 * process's parent) is gone, CO_ETIMEOUT. */
typedef struct sv_file_info {
    const char *path;
    uint64_t size, checksum;
} sv_file_info;
int sv_link_checkpoint_ack(sv_link *l, int64_t iteration, int status, const char *error, const sv_file_info *files, int n);
int sv_link_checkpoint_wait(sv_link *l, int64_t iteration, int timeout_ms);
/* Whether a commit's answer said to save no more (the save directory is running out of
 * space: supervisor/ckpt_coord.c); every rank has it before its next save. */
bool sv_link_saves_stopped(sv_link *l);
/* The job id (names the checkpoint's shared temporary directory). */
uint64_t sv_link_job_id(const sv_link *l);
/* A stream whose lines go to the supervisor's log (NULL on failure). */
FILE *sv_link_log_stream(sv_link *l);
/* A stream whose lines (metrics records) go to the supervisor's --metrics-file. */
FILE *sv_link_metrics_stream(sv_link *l);
/* This worker's own failure (code: CO_E*; status: its exit status) that no restart cures
 * (sv_incurable_status): the supervisor prints what ("rank N: what (stopping: ...)") for the
 * first rank that reports one and stops the job with the status one process would exit with.
 * Posted on the link thread, before the goodbye of sv_link_close; 0, or an error when the
 * link cannot carry it (then the worker prints what itself). */
int sv_link_fatal(sv_link *l, int code, int status, const char *what);
/* Flushes the log and metrics streams, waits (at most 3 s) until the supervisor has
 * everything sent before, and closes the link. The supervisor learns the worker's exit
 * status from the process itself. NULL-safe. */
void sv_link_close(sv_link **l);
void sv_assignment_free(sv_assignment *a);

/* ---- in-process restart ----
 * With restart enabled, an Abort from the supervisor no longer stops the worker: it aborts
 * the collectives, raises *abort_flag (a hang injected in compute polls it) and makes
 * sv_link_verdict and checkpoint waits return CO_EABORTED, so the training loop unwinds to
 * the last committed step. The worker then calls sv_link_await_restart: it reports its
 * iteration at the restart barrier (a Ready of the new generation) and waits for the
 * supervisor's Restart, whose assignment names the new generation's endpoints and the
 * rank to take state from. */
void sv_link_enable_restart(sv_link *l, volatile sig_atomic_t *abort_flag);
bool sv_link_restart_pending(sv_link *l);
int sv_link_await_restart(sv_link *l, int64_t iteration, sv_assignment *a, int timeout_ms);
/* A collective failed here (code, what): tells the supervisor (which restarts the job if it
 * has not begun already) and waits up to timeout_ms for its Abort. True if one came. */
bool sv_link_await_abort(sv_link *l, int code, const char *what, int timeout_ms);

/* ---- the rerun state machine (resilience/rerun.h) ----
 * Sends one round's results as LossReport messages (one per micro batch; the last carries
 * the gradient norm and the phase times). copies 2 sends them twice and delay_ms > 0 sends
 * them late (injected message faults). Any thread. */
struct rr_report;
struct rr_verdict;
int sv_link_report(sv_link *l, const struct rr_report *r, const double *phase_ms, const char *const *phase_names,
                   int nphases, int copies, int delay_ms);
/* Sends the parameter checksums (r's sums) of the round r, reported before with has_sum
 * set; resent with the round's reports. Any thread. */
int sv_link_checksum(sv_link *l, const struct rr_report *r);
/* Waits for the supervisor's verdict on the round (iteration, attempt) just reported,
 * resending the round every second until it comes (a lost report or verdict costs a
 * second, never the job). CO_EABORTED when the job is aborted, or when the supervisor has
 * ordered a stop for another reason than a signal (it no longer validates) and no verdict
 * comes within 3 s; CO_ETIMEOUT after timeout_ms (< 0: none). A stop by signal is
 * validated to its end. */
int sv_link_verdict(sv_link *l, int64_t iteration, int attempt, struct rr_verdict *v, int timeout_ms);
/* Faults `cohort inject` sent since the last call (specs, malloc'd: the caller frees). */
int sv_link_take_injections(sv_link *l, char **specs, int cap);
/* One line for the supervisor's run report and log (a fault injected or repaired here). */
void sv_link_event(sv_link *l, const char *line);

#endif
