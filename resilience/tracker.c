/* tracker.c - Megatron's result-rejected tracker file: the one file resilience/ reads and
 * writes. The rerun machine (rerun.c) stays pure; its callers hand the events it records to
 * rr_tracker_append and, at start, the iterations rr_tracker_skips reads back to the trainer. */
#include "resilience/rerun.h"

#include "common/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int rr_tracker_append(const char *path, const rr_event *e, const char *job) {
    FILE *f = fopen(path, "a");
    if (!f) return co_err_set(CO_EIO, "rerun tracker %s: %s", path, strerror(errno));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", e->message);
    for (char *p = msg; *p; p++)
        if (*p == '\'' || *p == '\n') *p = ' ';
    fprintf(f, "ts=%s.%06ld node=%s device=cpu jobID=%s rank=%d iteration=%lld status=%s result=%g message='%s: %s'\n",
            when, ts.tv_nsec / 1000, host, job && *job ? job : "N/A", e->rank, (long long)e->iteration,
            rr_diagnosis_name(e->diagnosis), e->value, e->check, msg);
    int rc = fclose(f) ? co_err_set(CO_EIO, "rerun tracker %s: %s", path, strerror(errno)) : 0;
    return rc;
}

int rr_tracker_skips(const char *path, int64_t *iters, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024];
    /* (rank, iteration) pairs seen, to apply "more than once on a rank" */
    int64_t seen_it[512];
    int seen_rank[512], nseen = 0, added = 0;
    while (fgets(line, sizeof line, f)) {
        const char *pr = strstr(line, " rank="), *pi = strstr(line, " iteration="), *ps = strstr(line, " status=");
        if (!pr || !pi || !ps) continue;
        int rank = atoi(pr + 6);
        long long it = atoll(pi + 11);
        bool reproducible = !strncmp(ps + 8, "correct_result", 14);
        bool twice = false;
        for (int k = 0; k < nseen; k++)
            if (seen_it[k] == it && seen_rank[k] == rank) twice = true;
        if (!twice && nseen < 512) {
            seen_it[nseen] = it;
            seen_rank[nseen++] = rank;
        }
        if (!reproducible && !twice) continue;
        bool dup = false;
        for (int k = 0; k < added; k++)
            if (iters[k] == it) dup = true;
        if (!dup && added < cap) iters[added++] = it;
    }
    fclose(f);
    return added;
}
