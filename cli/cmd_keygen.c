/* cmd_keygen.c - `cohort keygen --output FILE`: writes a new job secret (the CURVE keypairs
 * of the control plane) with mode 0600, crash-safely. Every node of the job reads the same
 * file; a peer without it is refused. */
#include "cli/cli.h"

#include "actors/actor.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

static void keygen_usage(FILE *f) {
    fputs("usage: cohort keygen --output FILE [--force]\n"
          "\n"
          "Writes a new job secret (CURVE keypairs for the control and data planes, mode 0600).\n"
          "Copy the same file to every node of the job. Refuses to overwrite FILE\n"
          "unless --force is given.\n",
          f);
}

int cli_keygen(int argc, char **argv) {
    co_log_set_prefix("cohort keygen");
    const char *out = NULL;
    int force = 0;
    for (int i = 0; i < argc; i++) {
        if ((!strcmp(argv[i], "--output") || !strcmp(argv[i], "-o")) && i + 1 < argc) {
            out = argv[++i];
        } else if (!strncmp(argv[i], "--output=", 9)) {
            out = argv[i] + 9;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            keygen_usage(stdout);
            return CLI_OK;
        } else {
            co_log(CO_LOG_ERROR, "unknown argument '%s'", argv[i]);
            keygen_usage(stderr);
            return CLI_USAGE;
        }
    }
    if (!out || !*out) {
        keygen_usage(stderr);
        return CLI_USAGE;
    }
    if (!force) {
        FILE *f = fopen(out, "r");
        if (f) {
            fclose(f);
            co_log(CO_LOG_ERROR, "%s exists (use --force to replace it)", out);
            return CLI_FAILURE;
        }
    }
    ac_secret s;
    int rc = ac_secret_generate(&s);
    if (!rc) rc = ac_secret_write(out, &s);
    memset(&s, 0, sizeof s);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s: %s", co_strerror(rc), co_err_detail());
        return CLI_FAILURE;
    }
    co_log(CO_LOG_INFO, "wrote %s (mode 0600)", out);
    return CLI_OK;
}
