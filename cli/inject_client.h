/* inject_client.h - `cohort inject` and `cohort status`: a running job's supervisor, found and
 * asked for its state or to inject a
 * fault (the same KIND@rank=R,step=S,... syntax as --inject; resilience/inject.h). */
#ifndef COHORT_CLI_INJECT_CLIENT_H
#define COHORT_CLI_INJECT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct sv_job {
    int pid;            /* the supervisor's */
    uint64_t start;     /* its start (co_proc_start_ticks; 0: not recorded) */
    char endpoint[400]; /* its control endpoint */
    uint64_t job_id;
} sv_job;

/* This user's running jobs on this machine (up to cap). */
int sv_find_jobs(sv_job *jobs, int cap, int *n);
/* Sends spec; answer gets the supervisor's line ("ok: ..." or "error: ..."). CO_ETIMEOUT
 * when it did not answer within timeout_ms. */
int sv_inject(const sv_job *job, const char *spec, int timeout_ms, char *answer, size_t n);
/* `cohort status`: asks for the job's state; *json gets the supervisor's document
 * (malloc'd; docs/observability.md). CO_ETIMEOUT when it did not answer within timeout_ms. */
int sv_status(const sv_job *job, int timeout_ms, char **json);

#endif
