/* resilience_check.h - resilience's part of the configuration's checks: warm spares and
 * the run report (what a job of this shape supports), and the limits of the rerun state
 * machine's injection, in-process restarts (timeouts, heartbeats, restart budget),
 * quarantine, replica checks, stragglers and iterations to skip. The checks add their
 * problems to a co_problems list (common/config.h); train/config_check.c runs them in
 * order. (--inject specs are parsed against the world: resilience/inject.h.) */
#ifndef COHORT_RESILIENCE_RESILIENCE_CHECK_H
#define COHORT_RESILIENCE_RESILIENCE_CHECK_H

#include "common/config.h"

/* --inprocess-active-world-size's spares and --run-report: what is not built for this job's
 * shape (several nodes, one training rank, one process). */
void rr_check_spares(const co_config *c, co_problems *P);

/* The resilience flags' ranges and orderings (soft < hard < barrier timeouts, heartbeat
 * interval below its timeout, at most 10^6 s: timeouts become int milliseconds). */
void rr_check_limits(const co_config *c, co_problems *P);

#endif
