/* test_log.c - co_log's line: the prefix, the message, one newline; lines below the level
 * dropped; a message too long for the line cut, still ending in a newline. */
#include "common/log.h"
#include "tests/test.h"

#include <unistd.h>

static char out[8192];

/* Runs f with stderr sent into a pipe; what was written ends up in `out`. */
static size_t capture(void (*f)(void)) {
    int p[2];
    if (pipe(p) != 0) { out[0] = 0; return 0; }
    int saved = dup(STDERR_FILENO);
    dup2(p[1], STDERR_FILENO);
    close(p[1]);
    f();
    dup2(saved, STDERR_FILENO);
    close(saved);
    size_t n = 0;
    ssize_t r;
    while ((r = read(p[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)r;
    close(p[0]);
    out[n] = 0;
    return n;
}

static void say_levels(void) {
    co_log(CO_LOG_DEBUG, "hidden %d", 1);
    co_log(CO_LOG_INFO, "shown %d", 2);
    co_log(CO_LOG_ERROR, "failed: %s", "disk");
}

static void test_prefix_and_levels(void) {
    co_log_set_prefix("cohort rank %d", 3);
    CHECK(!strcmp(co_log_prefix(), "cohort rank 3"));
    co_log_set_level(CO_LOG_INFO);
    capture(say_levels);
    CHECK_MSG(!strcmp(out, "cohort rank 3: shown 2\ncohort rank 3: failed: disk\n"), "got '%s'", out);
    co_log_set_level(CO_LOG_ERROR);
    CHECK(!co_log_enabled(CO_LOG_WARN) && co_log_enabled(CO_LOG_ERROR));
    capture(say_levels);
    CHECK_MSG(!strcmp(out, "cohort rank 3: failed: disk\n"), "got '%s'", out);
}

static void say_long(void) {
    static char big[6000];
    memset(big, 'x', sizeof big - 1);
    co_log(CO_LOG_WARN, "%s", big);
}

static void test_long_line_cut(void) {
    co_log_set_level(CO_LOG_DEBUG);
    size_t n = capture(say_long);
    CHECK(n > 4000 && n <= 4096);
    CHECK(out[n - 1] == '\n' && !strchr(out, '\n')[1]);
}

int main(void) {
    RUN(test_prefix_and_levels);
    RUN(test_long_line_cut);
    return TEST_EXIT();
}
