/* metrics_local.h - --metrics-port for a single-process job (no supervisor): the trainer's
 * metrics records pass through a stream that appends them to --metrics-file (if any) and
 * feeds supervisor/status.c's registry, whose Prometheus rendering supervisor/metrics_http.c
 * serves after each record. Only the series a single process has: no ranks' reports,
 * restarts or faults (docs/observability.md, "Prometheus"). */
#ifndef COHORT_WORKER_METRICS_LOCAL_H
#define COHORT_WORKER_METRICS_LOCAL_H

#include <stdint.h>
#include <stdio.h>

typedef struct svl svl;

/* Serves on 127.0.0.1:port; *stream: where the trainer writes its records instead of
 * opening metrics_file itself ("" or NULL: no file). Fails with the step named (the port,
 * the file). */
int svl_start(svl **out, int port, const char *metrics_file, int64_t save_interval, int64_t train_iters,
              const char *save_dir, FILE **stream);
/* Closes the stream (unless its user did) and the file, stops serving; *l = NULL. */
void svl_stop(svl **l);

#endif
