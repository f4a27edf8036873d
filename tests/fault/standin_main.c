/* standin_main.c - the `cohort` binary with the test stand-in of model parallelism
 * (co_config.standin_model_parallel, common/config.h): --tensor-model-parallel-size,
 * --pipeline-model-parallel-size and --context-parallel-size above 1 are accepted and the
 * model is computed whole on every rank, so that the parallel groups, their communicators
 * and in-process restarts across them are tested (mp_test.sh) before the split compute
 * exists. The supervisor starts its workers from /proc/self/exe: they are this binary too,
 * so every process's configuration has the field set. Never installed; `cohort` itself
 * refuses those sizes. */
#include "cli/cli.h"
#include "common/proctitle.h"

#include <string.h>

#define main cohort_main
#include "cli/main.c"
#undef main

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "train")) return cohort_main(argc, argv);
    co_proctitle_init(argc, argv); /* as cohort_main: first */
    const cli_train_opts opts = {.standin_model_parallel = true};
    return cli_train_with(argc - 2, argv + 2, &opts);
}
