/* cmd_inject.c - `cohort inject`: injects faults into a running job through its supervisor,
 * with the syntax of `cohort train --inject` (resilience/inject.h). */
#include "cli/cli.h"

#include "common/error.h"
#include "common/log.h"
#include "resilience/inject.h"
#include "cli/inject_client.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
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
          "msg-drop msg-dup kill-supervisor. S must be at least two iterations ahead of the job and\n"
          "at most its --train-iters; at most 64 SPECs per call, no key twice in one SPEC.\n"
          "\n"
          "  --pid PID        the job whose supervisor has this pid (needed when several run; a\n"
          "                   positive number that is a running job's supervisor)\n"
          "  --timeout S      seconds to wait for the supervisor's answer (default 10)\n"
          "  --json           one JSON object per spec: {\"spec\":..., \"ok\":..., \"answer\":...}\n"
          "\n"
          "exit status: 0 every fault accepted, 1 a spec refused or no answer, 2 usage error or no\n"
          "running job found.\n",
          f);
}

/* A positive int from the whole of s, or -1. */
static int positive_int(const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 1 || v > INT_MAX) return -1;
    return (int)v;
}

/* The job's ranks and the iterations it has still to run, from its status document:
 * *world, *first (two after the newest iteration), *last (--train-iters). CO_E* when the
 * supervisor does not say (the specs then go with the syntax checked only). */
static int job_range(const sv_job *job, int timeout_ms, int *world, int64_t *first, int64_t *last) {
    char *doc = NULL;
    int rc = sv_status(job, timeout_ms, &doc);
    if (rc) return rc;
    json_t *d = json_loads(doc, 0, NULL);
    free(doc);
    json_t *w = json_object_get(d, "world_size"), *ti = json_object_get(d, "train_iters");
    if (!json_is_integer(w) || json_integer_value(w) < 1 || !json_is_integer(ti)) {
        json_decref(d);
        return CO_ENOENT;
    }
    int64_t cur = 0;
    static const char *const its[] = {"iteration", "reported_iteration"};
    for (int k = 0; k < 2; k++) {
        json_t *x = json_object_get(d, its[k]);
        if (json_is_integer(x) && json_integer_value(x) > cur) cur = json_integer_value(x);
    }
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(d, "ranks"), i, r) {
        json_t *x = json_object_get(r, "iteration");
        if (json_is_integer(x) && json_integer_value(x) > cur) cur = json_integer_value(x);
    }
    *world = (int)json_integer_value(w);
    *first = cur + 2;
    *last = json_integer_value(ti);
    json_decref(d);
    return 0;
}

/* Parses the command line into *pid, *timeout, *json and specs. CLI_OK, or the status to
 * exit with (a message printed). */
static int parse_args(int argc, char **argv, int *pid, int *timeout, bool *json, char **specs, int *nspecs) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            inject_usage(stdout);
            return -1;
        } else if (!strcmp(argv[i], "--pid") || !strcmp(argv[i], "--timeout")) {
            bool is_pid = argv[i][2] == 'p';
            int v = i + 1 < argc ? positive_int(argv[i + 1]) : -1;
            if (v < 0) {
                co_log(CO_LOG_ERROR, "%s needs a positive whole number (%s), got '%s'", argv[i],
                        is_pid ? "the pid of a running job's supervisor" : "seconds",
                        i + 1 < argc ? argv[i + 1] : "nothing");
                return CLI_USAGE;
            }
            *(is_pid ? pid : timeout) = v;
            i++;
        } else if (!strcmp(argv[i], "--json")) {
            *json = true;
        } else if (argv[i][0] == '-') {
            co_log(CO_LOG_ERROR, "unknown flag %s (see cohort inject --help)", argv[i]);
            return CLI_USAGE;
        } else {
            specs[(*nspecs)++] = argv[i];
        }
    }
    if (!*nspecs) {
        inject_usage(stderr);
        return CLI_USAGE;
    }
    if (*nspecs > FI_MAX_SPECS) {
        co_log(CO_LOG_ERROR, "%d fault specs: at most %d per call (as cohort train --inject)", *nspecs,
                FI_MAX_SPECS);
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* The job --pid names (0: the only one running). NULL with a message printed. */
static const sv_job *find_job(sv_job *jobs, int cap, int pid) {
    int n = 0;
    sv_find_jobs(jobs, cap, &n);
    const sv_job *job = NULL;
    for (int i = 0; i < n; i++)
        if (!pid || jobs[i].pid == pid) {
            if (job && !pid) {
                co_log(CO_LOG_ERROR, "several jobs are running (supervisor pids %d, %d, ...): give --pid",
                        job->pid, jobs[i].pid);
                return NULL;
            }
            job = &jobs[i];
        }
    if (!job && pid)
        co_log(CO_LOG_ERROR, "no running cohort job with supervisor pid %d (`cohort status` lists them)",
                pid);
    else if (!job)
        co_log(CO_LOG_ERROR, "no running cohort job of this user found");
    return job;
}

static void print_answer(bool json, const char *spec, const sv_job *job, bool ok, const char *answer) {
    if (json) {
        printf("{\"spec\":");
        co_json_str(stdout, spec);
        printf(",\"ok\":%s,\"pid\":%d,\"answer\":", ok ? "true" : "false", job->pid);
        co_json_str(stdout, answer);
        printf("}\n");
    } else {
        fprintf(ok ? stdout : stderr, "cohort inject: job %d: %s\n", job->pid, answer);
    }
}

int cli_inject(int argc, char **argv) {
    co_log_set_prefix("cohort inject");
    int pid = 0, timeout = 10, nspecs = 0;
    bool json = false;
    char **specs = calloc((size_t)(argc > 0 ? argc : 1), sizeof *specs);
    if (!specs) return CLI_FAILURE;
    int status = parse_args(argc, argv, &pid, &timeout, &json, specs, &nspecs);
    if (status) {
        free(specs);
        return status < 0 ? CLI_OK : status;
    }
    /* the syntax is checked here first (the supervisor checks ranks and steps) */
    fi_schedule s;
    if (fi_schedule_parse(&s, specs, nspecs, 0, 1 << 20, 0)) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        free(specs);
        return CLI_USAGE;
    }
    fi_schedule_free(&s);
    sv_job jobs[32];
    const sv_job *job = find_job(jobs, 32, pid);
    if (!job) {
        free(specs);
        return CLI_USAGE;
    }
    /* ranks and steps against the job itself, so that a refusal names its real ranges */
    int world = 0;
    int64_t first = 0, last = 0;
    bool ranged = !job_range(job, timeout * 1000, &world, &first, &last);
    for (int i = 0; i < nspecs; i++) {
        char answer[1000];
        int rc = 0;
        if (ranged && first > last) {
            snprintf(answer, sizeof answer, "error: the job is at iteration %lld of %lld: no iteration is left to "
                     "inject into (at least two ahead)", (long long)first - 2, (long long)last);
        } else if (ranged && fi_schedule_parse_live(&s, &specs[i], 1, world, first, last)) {
            snprintf(answer, sizeof answer, "error: %s", co_err_detail());
        } else {
            if (ranged) fi_schedule_free(&s);
            rc = sv_inject(job, specs[i], timeout * 1000, answer, sizeof answer);
        }
        if (rc) snprintf(answer, sizeof answer, "error: %s (%s)", co_err_detail(), co_strerror(rc));
        bool ok = !strncmp(answer, "ok:", 3);
        if (!ok) status = CLI_FAILURE;
        print_answer(json, specs[i], job, ok, answer);
    }
    free(specs);
    return status;
}
