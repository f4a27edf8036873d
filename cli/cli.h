/* cli.h - the `cohort` command's subcommands. Each returns the process exit status:
 *   0 success (training reached --train-iters, an exit condition, or a clean stop on
 *     SIGTERM/SIGINT); 1 a runtime failure (I/O, memory, malformed data); 2 a usage or
 *     configuration error (nothing was run); 3 training stopped on a NaN/Inf loss or
 *     gradient norm; 75 (SV_EXIT_PREEMPTED) a clean stop for preemption (SIGUSR1, or
 *     SIGTERM with --requeue-on-sigterm): saved, requeue the job to resume. */
#ifndef COHORT_CLI_H
#define COHORT_CLI_H

#include "common/config.h"

#include <stdbool.h>

enum { CLI_OK = 0, CLI_FAILURE = 1, CLI_USAGE = 2, CLI_NAN = 3 };

int cli_train(int argc, char **argv);
/* What a test binary changes in `cohort train` (never a flag): tests/fault/standin_main.c. */
typedef struct cli_train_opts {
    bool standin_model_parallel; /* co_config.standin_model_parallel */
} cli_train_opts;
/* cli_train with opts (NULL: none). */
int cli_train_with(int argc, char **argv, const cli_train_opts *opts);
int cli_data(int argc, char **argv);
int cli_ckpt(int argc, char **argv);
int cli_keygen(int argc, char **argv);
int cli_inject(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_status(int argc, char **argv);
int cli_topology(int argc, char **argv);
int cli_schedule(int argc, char **argv);
int cli_timeline(int argc, char **argv);
int cli_generate(int argc, char **argv);

/* Resolves the tokenizer named in the configuration to (vocab size, EOD id). 0, or
 * CO_EINVAL with co_err_detail() naming the flag. */
int cli_tokenizer(const co_config *c, int *vocab, int *eod);
/* Resolves --data-path ("PREFIX" or "1.0 PREFIX") to one prefix; NULL when absent. */
const char *cli_data_prefix(const co_config *c);

#endif
