/* test.h - a minimal assertion and case runner for cohort's C tests.
 *
 * Each test executable is one meson test (meson isolates it in its own process with a
 * timeout). Inside, TEST_CASE functions run in order; CHECK records a failure with file and
 * line and carries on, REQUIRE stops the case. main() returns 1 if anything failed, 77 if
 * the test asked to be skipped (tests needing a GPU). */
#ifndef COHORT_TESTS_TEST_H
#define COHORT_TESTS_TEST_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int t__failures;
static int t__checks;
static int t__skipped; /* cases skipped with TEST_SKIP_CASE */

#define CHECK(cond)                                                                    \
    do {                                                                               \
        t__checks++;                                                                   \
        if (!(cond)) {                                                                 \
            t__failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                              \
    } while (0)

#define CHECK_MSG(cond, ...)                                                           \
    do {                                                                               \
        t__checks++;                                                                   \
        if (!(cond)) {                                                                 \
            t__failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

#define REQUIRE(cond)                                                                  \
    do {                                                                               \
        t__checks++;                                                                   \
        if (!(cond)) {                                                                 \
            t__failures++;                                                             \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            return;                                                                    \
        }                                                                              \
    } while (0)

#define REQUIRE_MSG(cond, ...)                                                         \
    do {                                                                               \
        t__checks++;                                                                   \
        if (!(cond)) {                                                                 \
            t__failures++;                                                             \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            return;                                                                    \
        }                                                                              \
    } while (0)

/* |a-b| <= atol + rtol*|b| */
#define CHECK_CLOSE(a, b, atol, rtol)                                                  \
    do {                                                                               \
        double t__a = (a), t__b = (b);                                                 \
        t__checks++;                                                                   \
        if (!(fabs(t__a - t__b) <= (atol) + (rtol)*fabs(t__b))) {                      \
            t__failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.9g vs %s = %.9g\n",     \
                    __FILE__, __LINE__, #a, t__a, #b, t__b);                           \
        }                                                                              \
    } while (0)

#define RUN(fn)                                                                        \
    do {                                                                               \
        int t__before = t__failures, t__skip_before = t__skipped;                      \
        fn();                                                                          \
        fprintf(stderr, "%s %s\n", t__failures != t__before        ? "FAIL"            \
                                   : t__skipped != t__skip_before ? "skip"            \
                                                                  : "ok  ", #fn);     \
    } while (0)

#define TEST_EXIT() \
    (fprintf(stderr, "%d checks, %d failed, %d cases skipped\n", t__checks, t__failures, t__skipped), \
     t__failures ? 1 : 0)

/* A new directory $TMPDIR/PREFIX.XXXXXX (or under /tmp) into out; 0, or -1. */
static inline int t_scratch_dir(char *out, size_t n, const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    snprintf(out, n, "%s/%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
    return mkdtemp(out) ? 0 : -1;
}

/* Milliseconds of the monotonic clock. */
static inline int64_t t_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sleeps ms milliseconds, through interruptions. */
static inline void t_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* splitmix64's finaliser: a well-mixed 64-bit value from any x (test data). */
static inline uint64_t t_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Removes dir and everything below it (best effort, said on stderr when it fails). */
static inline void t_remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}

/* Skips the whole executable (exit 77: meson reports SKIP). Only before any check ran, e.g.
 * a GPU test on a machine without one; a case that needs something absent uses
 * TEST_SKIP_CASE, so the checks that did run still count. */
#define TEST_SKIP(why) do { fprintf(stderr, "skip: %s\n", why); exit(77); } while (0)
/* Ends the current case as skipped, saying why (a CPU feature it needs is absent, ...). */
#define TEST_SKIP_CASE(why) \
    do { fprintf(stderr, "skip: %s: %s\n", __func__, why); t__skipped++; return; } while (0)

#endif
