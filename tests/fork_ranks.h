/* fork_ranks.h - a test's ranks as forked processes (tests that need real processes for
 * cohort's comm: the collectives, the distributed optimizer). Include after tests/test.h. */
#ifndef COHORT_TESTS_FORK_RANKS_H
#define COHORT_TESTS_FORK_RANKS_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void (*t_rank_fn)(int rank, int n, const char *dir, const void *arg);

/* Runs fn(rank, n, dir, arg) on n (<= 8) forked ranks sharing a new scratch directory dir
 * (/tmp/PREFIX-XXXXXX, removed after); a rank fails by its failed checks. expect_kill: the
 * rank expected to die by SIGKILL (-1: none). Ranks still running after limit_ms are a hang:
 * killed and counted. Returns the number of problems (0: every rank ended as expected), or
 * -1 when the directory cannot be made. */
static inline int t_fork_ranks(const char *name, const char *prefix, int n, t_rank_fn fn, const void *arg,
                               int expect_kill, int limit_ms) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/%s-XXXXXX", prefix);
    if (n > 8 || !mkdtemp(dir)) return -1;
    pid_t pid[8];
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm((unsigned)(limit_ms / 1000 + 5)); /* last resort if the parent dies */
            t__failures = 0;                        /* this rank's own count */
            fn(r, n, dir, arg);
            fflush(stderr);
            _exit(t__failures ? 1 : 0);
        }
    }
    int bad = 0, left = n, st[8];
    bool done[8] = {0};
    int64_t dl = t_now_ms() + limit_ms;
    while (left > 0) {
        for (int r = 0; r < n; r++)
            if (!done[r] && waitpid(pid[r], &st[r], WNOHANG) == pid[r]) {
                done[r] = true;
                left--;
            }
        if (left && t_now_ms() > dl) {
            fprintf(stderr, "%s: ranks still running after %d ms: killing them (a hang)\n", name, limit_ms);
            for (int r = 0; r < n; r++)
                if (!done[r]) kill(pid[r], SIGKILL);
            bad++;
            dl = INT64_MAX;
        }
        if (left) t_sleep_ms(5);
    }
    for (int r = 0; r < n; r++) {
        bool ok = r == expect_kill ? (WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL)
                                   : (WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0);
        if (!ok) {
            fprintf(stderr, "%s: rank %d ended with status %#x\n", name, r, st[r]);
            bad++;
        }
    }
    t_remove_dir(dir);
    return bad;
}

#endif
