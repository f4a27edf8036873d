/* standin_main.c - the `cohort` binary with the test stand-in of model parallelism
 * (co_config_standin_model_parallel, common/config.h): --tensor-model-parallel-size,
 * --pipeline-model-parallel-size and --context-parallel-size above 1 are accepted and the
 * model is computed whole on every rank, so that the parallel groups, their communicators
 * and in-process restarts across them are tested (mp_test.sh) before the split compute
 * exists. The supervisor starts its workers from /proc/self/exe: they are this binary too.
 * Never installed; `cohort` itself refuses those sizes. */
#include "common/config.h"

#define main cohort_main
#include "cli/main.c"
#undef main

int main(int argc, char **argv) {
    co_config_standin_model_parallel = true;
    return cohort_main(argc, argv);
}
