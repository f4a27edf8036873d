/* config_check.h - every check of a training configuration, in order, before any work:
 * what each module checks (the parallel layout: scheduler/parallel_check.h; the model:
 * model/gpt_check.h; resilience: resilience/resilience_check.h; the run's own flags:
 * common/config.h) run one after the other into one list of problems. */
#ifndef COHORT_TRAIN_CONFIG_CHECK_H
#define COHORT_TRAIN_CONFIG_CHECK_H

#include "common/config.h"

/* Checks c for a job of dp data-parallel replicas and completes its derived values (kv
 * channels, query groups, ffn size, positions, global batch, iterations, the learning
 * rate's iterations, the timeline's range; sequence parallelism off at tensor size 1).
 * First what is refused for this build and the sizes later checks divide by; only when
 * those hold the shapes, the run and the resilience limits; only when those hold the
 * pipeline's placement and schedule. 0, or CO_EINVAL (CO_ENOMEM) with every problem found
 * in P, one per line. */
int trainer_config_check(co_config *c, int dp, co_problems *P);

#endif
