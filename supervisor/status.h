/* status.h - what the supervisor tells about its running job: the Prometheus text exposition
 * (served by metrics_http.c on --metrics-port) and the JSON document of `cohort status`
 * (answered over the supervisor's mailbox). The registry keeps what only the metrics
 * records say (loss, learning rate, throughput) and the checkpoints' timings; the rest is
 * read when rendering from the supervisor's tables (svo_job) and the validator (validate.h).
 * Runs on the supervisor's loop only (the HTTP thread sees the rendered text, never this). */
#ifndef COHORT_SUPERVISOR_STATUS_H
#define COHORT_SUPERVISOR_STATUS_H

#include "supervisor/validate.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct svo svo;

/* One rank as the supervisor knows it. */
typedef struct svo_rank {
    int rank;            /* -1: a warm spare */
    int node;
    uint32_t pid;
    const char *host;    /* as the worker registered ("" before) */
    int64_t iteration;   /* from its heartbeats */
    bool alive;          /* registered and not exited */
    double seen_ago_s;   /* since its last message */
} svo_rank;

/* The job as the supervisor's loop sees it at the time of rendering. */
typedef struct svo_job {
    int pid;
    uint64_t job_id;
    uint64_t generation;
    const char *state;   /* "rendezvous", "training", "restarting", "stopping" */
    int world, nnodes, nslots;
    const svo_rank *ranks; /* [nslots] */
    int64_t save_interval; /* --save-interval (0: none) */
    int64_t train_iters;   /* --train-iters (0: unknown) */
    const char *save_dir;  /* --save ("" : none) */
    int64_t ckpt_commits, ckpt_last; /* checkpoints committed, the newest (-1: none) */
    double uptime_s;
} svo_job;

int svo_new(svo **out);
void svo_destroy(svo **o);
/* A metrics record the last rank forwarded (one JSON object per line; several lines are
 * fine; an "evaluation" or "event" record is skipped). */
void svo_on_record(svo *o, const char *record);
/* A checkpoint of iteration it was committed, seconds after its iteration was accepted. */
void svo_on_checkpoint(svo *o, int64_t it, double seconds);
/* The Prometheus text exposition format (0.0.4), malloc'd (NULL: out of memory); v may be NULL. */
char *svo_prometheus(const svo *o, const svo_job *j, const svv *v);
/* `cohort status`'s document (docs/observability.md), malloc'd; the latest nfaults faults. */
char *svo_status_json(const svo *o, const svo_job *j, const svv *v, int nfaults);

#endif
