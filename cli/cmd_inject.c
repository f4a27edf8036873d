/* cmd_inject.c - `cohort inject`: injects faults into a running job through its supervisor,
 * with the syntax of `cohort train --inject` (resilience/inject.h). */
#include "cli/cli.h"

#include "common/error.h"
#include "resilience/inject.h"
#include "supervisor/inject_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void inject_usage(FILE *f) {
    fputs("usage: cohort inject [--pid PID] [--timeout SECONDS] [--json] SPEC...\n"
          "\n"
          "Injects faults into a running `cohort train --nproc-per-node N` job on this machine, through\n"
          "its supervisor. SPEC is what --inject takes:\n"
          "  KIND@rank=R,step=S[,microbatch=M][,phase=forward|backward|allreduce|optimizer]\n"
          "      [,times=once|always][,bit=B][,ms=N]\n"
          "KIND: kill stop hang slow nan inf spike bitflip-grad bitflip-param bitflip-act msg-delay\n"
          "msg-drop msg-dup kill-supervisor. S must be at least two iterations ahead of the job.\n"
          "\n"
          "  --pid PID        the job whose supervisor has this pid (needed when several run)\n"
          "  --timeout S      seconds to wait for the supervisor's answer (default 10)\n"
          "  --json           one JSON object per spec: {\"spec\":..., \"ok\":..., \"answer\":...}\n"
          "\n"
          "exit status: 0 every fault accepted, 1 a spec refused or no answer, 2 usage error or no\n"
          "running job found.\n",
          f);
}

int cli_inject(int argc, char **argv) {
    int pid = 0, timeout = 10, nspecs = 0;
    bool json = false;
    char **specs = calloc((size_t)(argc > 0 ? argc : 1), sizeof *specs);
    if (!specs) return CLI_FAILURE;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            inject_usage(stdout);
            free(specs);
            return CLI_OK;
        } else if (!strcmp(argv[i], "--pid") && i + 1 < argc) {
            pid = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            timeout = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "cohort inject: unknown flag %s (see cohort inject --help)\n", argv[i]);
            free(specs);
            return CLI_USAGE;
        } else {
            specs[nspecs++] = argv[i];
        }
    }
    if (!nspecs || timeout <= 0) {
        inject_usage(stderr);
        free(specs);
        return CLI_USAGE;
    }
    /* the syntax is checked here first (the supervisor checks ranks and steps) */
    fi_schedule s;
    char err[600];
    if (fi_schedule_parse(&s, specs, nspecs, 0, 1 << 20, 0, err, sizeof err)) {
        fprintf(stderr, "cohort inject: %s\n", err);
        free(specs);
        return CLI_USAGE;
    }
    fi_schedule_free(&s);
    sv_job jobs[32];
    int n = 0;
    sv_find_jobs(jobs, 32, &n);
    const sv_job *job = NULL;
    for (int i = 0; i < n; i++)
        if (!pid || jobs[i].pid == pid) {
            if (job && !pid) {
                fprintf(stderr, "cohort inject: several jobs are running (supervisor pids %d, %d, ...): give --pid\n",
                        job->pid, jobs[i].pid);
                free(specs);
                return CLI_USAGE;
            }
            job = &jobs[i];
        }
    if (!job) {
        fprintf(stderr, pid ? "cohort inject: no running cohort job with supervisor pid %d\n"
                            : "cohort inject: no running cohort job of this user found%.0d\n",
                pid);
        free(specs);
        return CLI_USAGE;
    }
    int status = CLI_OK;
    for (int i = 0; i < nspecs; i++) {
        char answer[1000];
        int rc = sv_inject(job, specs[i], timeout * 1000, answer, sizeof answer);
        if (rc) snprintf(answer, sizeof answer, "error: %s (%s)", co_err_detail(), co_strerror(rc));
        bool ok = !strncmp(answer, "ok:", 3);
        if (!ok) status = CLI_FAILURE;
        if (json) {
            printf("{\"spec\":");
            co_json_str(stdout, specs[i]);
            printf(",\"ok\":%s,\"pid\":%d,\"answer\":", ok ? "true" : "false", job->pid);
            co_json_str(stdout, answer);
            printf("}\n");
        } else {
            fprintf(ok ? stdout : stderr, "cohort inject: job %d: %s\n", job->pid, answer);
        }
    }
    free(specs);
    return status;
}
