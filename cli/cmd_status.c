/* cmd_status.c - `cohort status`: a running job's state from another terminal, asked of its
 * supervisor over its mailbox (cli/inject_client.h sv_status; the document is
 * supervisor/status.c's): ranks, progress, step-time spread, stragglers, faults and the
 * next checkpoint, as text, as JSON, or redrawn every few seconds. */
#include "cli/cli.h"

#include "common/error.h"
#include "cli/inject_client.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static void status_usage(FILE *f) {
    fputs("usage: cohort status [--json] [--watch [SECONDS]] [--timeout SECONDS] [JOB]\n"
          "\n"
          "Shows a running `cohort train --nproc-per-node N` job of this user on this machine, asked of\n"
          "its supervisor: every rank with its node, host and pid, the iteration, tokens/s, each rank's\n"
          "step time (last, min, median, max over its latest 32 iterations) and straggler score, the\n"
          "restarts and the latest faults with their diagnoses, and the time to the next checkpoint.\n"
          "\n"
          "  JOB              the job's supervisor pid, or its job id (a prefix will do); needed when\n"
          "                   several jobs run\n"
          "  --json           the supervisor's JSON document (docs/observability.md)\n"
          "  --watch [S]      redraw every S seconds (default 2) until the job ends; on a terminal in\n"
          "                   place, otherwise one report after another (--json: one document per line)\n"
          "  --timeout S      seconds to wait for the supervisor's answer (default 5)\n"
          "\n"
          "exit status: 0 shown (with --watch: until the job ended), 1 the supervisor did not answer,\n"
          "2 usage error, no running job, or several and no JOB to choose.\n",
          f);
}

static double num(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}
static const char *str(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : "";
}

/* "12.3 s", "4 min 5 s", "2 h 3 min" */
static void duration(char *b, size_t n, double s) {
    if (!isfinite(s) || s < 0) snprintf(b, n, "?");
    else if (s < 60) snprintf(b, n, "%.1f s", s);
    else if (s < 3600) snprintf(b, n, "%d min %d s", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(b, n, "%d h %d min", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static void print_human(FILE *f, json_t *d) {
    char up[64];
    duration(up, sizeof up, num(d, "uptime_seconds"));
    fprintf(f, "cohort job %s (supervisor pid %.0f): %s, generation %.0f, %.0f rank(s) on %.0f node(s), up %s\n",
            str(d, "job_id"), num(d, "supervisor_pid"), str(d, "state"), num(d, "generation"), num(d, "world_size"),
            num(d, "nodes"), up);
    double it = num(d, "iteration"), ti = num(d, "train_iters");
    fprintf(f, "iteration %.0f", it);
    if (isfinite(ti)) fprintf(f, "/%.0f", ti);
    if (isfinite(num(d, "lm_loss"))) fprintf(f, "  loss %.6g", num(d, "lm_loss"));
    if (isfinite(num(d, "grad_norm"))) fprintf(f, "  grad norm %.4g", num(d, "grad_norm"));
    if (isfinite(num(d, "learning_rate"))) fprintf(f, "  lr %.3e", num(d, "learning_rate"));
    if (isfinite(num(d, "tokens_per_second"))) fprintf(f, "  %.0f tokens/s", num(d, "tokens_per_second"));
    if (isfinite(num(d, "iteration_ms"))) fprintf(f, "  %.1f ms/iteration", num(d, "iteration_ms"));
    fputc('\n', f);
    fprintf(f, "\n%5s %4s %-20s %8s %8s  %-33s %9s\n", "rank", "node", "host", "pid", "iter",
            "step ms: last    min median    max", "straggler");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(d, "ranks"), i, r) {
        json_t *rank = json_object_get(r, "rank");
        char rk[16];
        if (json_is_integer(rank)) snprintf(rk, sizeof rk, "%lld", (long long)json_integer_value(rank));
        else snprintf(rk, sizeof rk, "spare");
        fprintf(f, "%5s %4.0f %-20.20s %8.0f %8.0f  ", rk, num(r, "node"), str(r, "host"), num(r, "pid"),
                num(r, "iteration"));
        json_t *st = json_object_get(r, "step_ms");
        if (json_is_object(st))
            fprintf(f, "%13.1f %6.1f %6.1f %6.1f", num(st, "last"), num(st, "min"), num(st, "median"), num(st, "max"));
        else
            fprintf(f, "%13s %6s %6s %6s", "-", "-", "-", "-");
        double sc = num(r, "straggler_score");
        if (isfinite(sc)) fprintf(f, " %9.2f%s", sc, json_is_true(json_object_get(r, "straggler")) ? " straggler" : "");
        else fprintf(f, " %9s", "-");
        if (!json_is_true(json_object_get(r, "alive"))) fputs("  (not running)", f);
        fputc('\n', f);
    }
    json_t *c = json_object_get(d, "counters");
    if (json_is_object(c))
        fprintf(f, "\nrestarts %.0f, replays %.0f, peer checks %.0f, repairs %.0f, skipped %.0f, steps lost %.0f, "
                   "faults %.0f, stragglers %.0f\n",
                num(c, "restarts"), num(c, "replays"), num(c, "peer_checks"), num(c, "repairs"),
                num(c, "iterations_skipped"), num(c, "steps_lost"), num(c, "faults"), num(c, "stragglers"));
    json_t *fs = json_object_get(d, "faults");
    if (json_array_size(fs)) {
        fprintf(f, "latest faults:\n");
        json_array_foreach(fs, i, r) {
            const char *dg = str(r, "diagnosis");
            fprintf(f, "  iteration %.0f, rank %.0f: %s%s%s%s: %s\n", num(r, "iteration"), num(r, "rank"),
                    str(r, "kind"), *dg ? " (" : "", dg, *dg ? ")" : "", str(r, "text"));
        }
    }
    json_t *ck = json_object_get(d, "checkpoint");
    if (!json_is_string(json_object_get(ck, "save_dir"))) {
        fprintf(f, "checkpoints: none (no --save)\n");
    } else {
        fprintf(f, "checkpoints: %.0f committed", num(ck, "committed"));
        if (isfinite(num(ck, "last_iteration"))) fprintf(f, ", the newest of iteration %.0f", num(ck, "last_iteration"));
        if (isfinite(num(ck, "last_save_seconds"))) fprintf(f, " (saved in %.2f s)", num(ck, "last_save_seconds"));
        if (isfinite(num(ck, "next_iteration"))) {
            char in[64];
            duration(in, sizeof in, num(ck, "next_in_seconds"));
            fprintf(f, "; next at iteration %.0f, in about %s", num(ck, "next_iteration"), in);
        }
        if (isfinite(num(ck, "save_interval"))) fprintf(f, " (--save-interval %.0f)", num(ck, "save_interval"));
        fputc('\n', f);
    }
}

/* The job JOB names (a pid or a job id prefix; NULL: the only one). Returns 0, or a CLI status
 * with the message printed. */
static int pick_job(const char *arg, sv_job *out) {
    sv_job jobs[32];
    int n = 0;
    sv_find_jobs(jobs, 32, &n);
    int found = -1, matches = 0;
    for (int i = 0; i < n; i++) {
        bool match = !arg;
        if (arg) {
            char id[32];
            snprintf(id, sizeof id, "%016" PRIx64, jobs[i].job_id);
            char *end;
            long pid = strtol(arg, &end, 10);
            match = (!*end && pid == jobs[i].pid) || (strlen(arg) >= 4 && !strncasecmp(id, arg, strlen(arg)));
        }
        if (match) {
            if (found < 0) found = i;
            matches++;
        }
    }
    if (matches == 1) {
        *out = jobs[found];
        return 0;
    }
    if (!matches) {
        if (arg) co_log(CO_LOG_ERROR, "no running cohort job with supervisor pid or job id %s", arg);
        else fprintf(stderr, "cohort status: no running cohort job of this user found on this machine (a job with "
                             "--nproc-per-node 2 or more; its supervisor answers)\n");
        return CLI_USAGE;
    }
    co_log(CO_LOG_ERROR, "%d jobs are running; name one (its supervisor pid or job id):", matches);
    for (int i = 0; i < n; i++) fprintf(stderr, "  pid %d  job %016" PRIx64 "\n", jobs[i].pid, jobs[i].job_id);
    return CLI_USAGE;
}

int cli_status(int argc, char **argv) {
    co_log_set_prefix("cohort status");
    bool json = false, watch = false;
    double every = 2, timeout = 5;
    const char *arg = NULL;
    for (int i = 0; i < argc; i++) {
        char *end;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            status_usage(stdout);
            return CLI_OK;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--watch")) {
            watch = true;
            if (i + 1 < argc && (strtod(argv[i + 1], &end), !*end && end != argv[i + 1])) {
                every = strtod(argv[++i], NULL);
                if (!(every >= 0.1 && every <= 3600)) {
                    co_log(CO_LOG_ERROR, "--watch %s is out of range (0.1 to 3600 seconds)", argv[i]);
                    return CLI_USAGE;
                }
            }
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            timeout = strtod(argv[++i], &end);
            if (*end || !(timeout > 0 && timeout <= 600)) {
                co_log(CO_LOG_ERROR, "--timeout %s is out of range (0 to 600 seconds)", argv[i]);
                return CLI_USAGE;
            }
        } else if (argv[i][0] == '-') {
            co_log(CO_LOG_ERROR, "unknown flag %s (see cohort status --help)", argv[i]);
            return CLI_USAGE;
        } else if (!arg) {
            arg = argv[i];
        } else {
            co_log(CO_LOG_ERROR, "one JOB only (got %s and %s)", arg, argv[i]);
            return CLI_USAGE;
        }
    }
    sv_job job;
    int st = pick_job(arg, &job);
    if (st) return st;
    bool tty = isatty(STDOUT_FILENO);
    for (int round = 0;; round++) {
        char *doc = NULL;
        int rc = sv_status(&job, (int)(timeout * 1000), &doc);
        if (rc && watch && round > 0 && kill(job.pid, 0) && errno == ESRCH) {
            printf("cohort status: the job (supervisor pid %d) ended\n", job.pid);
            return CLI_OK;
        }
        if (rc) {
            co_log(CO_LOG_ERROR, "%s (%s)%s", co_err_detail(), co_strerror(rc),
                    rc == CO_ETIMEOUT ? "; the supervisor may be busy or stopped (--timeout)" : "");
            return CLI_FAILURE;
        }
        json_error_t je;
        json_t *d = json_loads(doc, 0, &je);
        if (!json_is_object(d)) {
            co_log(CO_LOG_ERROR, "the supervisor's answer is not a JSON object: %s", je.text);
            free(doc);
            json_decref(d);
            return CLI_FAILURE;
        }
        if (json_is_string(json_object_get(d, "error"))) {
            co_log(CO_LOG_ERROR, "the supervisor says: %s", str(d, "error"));
            free(doc);
            json_decref(d);
            return CLI_FAILURE;
        }
        if (json && watch) {
            char *one = json_dumps(d, JSON_COMPACT | JSON_PRESERVE_ORDER);
            printf("%s\n", one ? one : doc);
            free(one);
        } else if (json) {
            printf("%s\n", doc);
        } else {
            if (watch && tty) fputs("\033[H\033[2J", stdout); /* home, clear: redraw in place */
            else if (round) fputc('\n', stdout);
            print_human(stdout, d);
        }
        fflush(stdout);
        free(doc);
        json_decref(d);
        if (!watch) return CLI_OK;
        struct timespec ts = {.tv_sec = (time_t)every, .tv_nsec = (long)(fmod(every, 1) * 1e9)};
        nanosleep(&ts, NULL);
    }
}
