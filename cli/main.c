/* main.c - the `cohort` binary: dispatches to subcommands. */
#include "cli/cli.h"
#include "common/proctitle.h"

#include <stdio.h>
#include <string.h>

/* cmd_train.c: installs `cohort train`'s SIGINT/SIGTERM handlers (they only set flags). */
void cli_train_early_signals(void);

/* Runs before the constructors of every shared library (ELF .preinit_array: only an
 * executable has one), about 2 ms after exec instead of 0.1-0.2 s: a Ctrl-C or SIGTERM
 * that comes while oneDNN, libgomp and the CUDA libraries initialise is a clean stop, not
 * lost or fatal (docs/resilience.md, "Signals"). Only for `cohort train`; the other
 * commands keep the default actions. */
static void early_signals(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc >= 2 && argv && argv[1] && !strcmp(argv[1], "train")) cli_train_early_signals();
}
__attribute__((section(".preinit_array"), used)) static void (*const preinit_signals)(int, char **, char **) = early_signals;

static void usage(FILE *f) {
    fputs("usage: cohort <command> [flags]\n"
          "\n"
          "commands:\n"
          "  train        pretrain a GPT model (Megatron-LM flags; with no data flags, a small\n"
          "               embedded job on text every Debian machine has)\n"
          "  data         Megatron-format data: preprocess (JSONL -> .bin/.idx with GPT-2 BPE),\n"
          "               inspect, verify, order (a split's sample order), tokenize\n"
          "  generate     text from a trained model: a checkpoint of any layout, prompts from\n"
          "               --prompt or standard input (greedy, temperature, top-k, top-p)\n"
          "  ckpt         checkpoint tools: ls, inspect, verify, diff, convert, prune\n"
          "  inject       inject a fault into a running job (the syntax of train --inject)\n"
          "  plan         simulate a long run's failures: ETTR, steps lost and the best checkpoint\n"
          "               interval per recovery strategy (checkpoint-restart, in-process, spares,\n"
          "               elastic), costs from a run report or flags\n"
          "  status       a running job's ranks, progress, stragglers, faults, next checkpoint\n"
          "  keygen       write a job secret: keygen --output FILE\n"
          "  topology     every rank's coordinates and Megatron's parallel groups for a layout\n"
          "  schedule     each pipeline rank's layers and forward/backward operations (Megatron's\n"
          "               pipeline schedules and layer placement)\n"
          "  timeline     draw the records of --timeline-dir: a picture and a trace of one\n"
          "               iteration per rank, and the measured pipeline bubble\n"
          "  version      print the version\n"
          "  help         this text\n"
          "\n"
          "`cohort train --help` lists the training flags with their defaults.\n",
          f);
}

int main(int argc, char **argv) {
    co_proctitle_init(argc, argv); /* first: argv's and environ's memory may later hold a title */
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return cli_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "data")) return cli_data(argc - 2, argv + 2);
    if (!strcmp(cmd, "ckpt")) return cli_ckpt(argc - 2, argv + 2);
    if (!strcmp(cmd, "generate")) return cli_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "keygen")) return cli_keygen(argc - 2, argv + 2);
    if (!strcmp(cmd, "inject")) return cli_inject(argc - 2, argv + 2);
    if (!strcmp(cmd, "plan")) return cli_plan(argc - 2, argv + 2);
    if (!strcmp(cmd, "status")) return cli_status(argc - 2, argv + 2);
    if (!strcmp(cmd, "topology")) return cli_topology(argc - 2, argv + 2);
    if (!strcmp(cmd, "schedule")) return cli_schedule(argc - 2, argv + 2);
    if (!strcmp(cmd, "timeline")) return cli_timeline(argc - 2, argv + 2);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        puts("cohort " COHORT_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "cohort: unknown command '%s'\n", cmd);
    usage(stderr);
    return CLI_USAGE;
}
