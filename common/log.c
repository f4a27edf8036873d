/* log.c - the process's log lines: one prefix, one level filter, one write per line. */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static char log__prefix[128] = "cohort";
static int log__level = -1; /* -1: not yet read from the environment */

void co_log_set_prefix(const char *fmt, ...) {
    char tmp[sizeof log__prefix];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(log__prefix, tmp, sizeof tmp);
}

const char *co_log_prefix(void) { return log__prefix; }

void co_log_set_level(co_log_level level) { log__level = (int)level; }

static int log__threshold(void) {
    if (log__level >= 0) return log__level;
    const char *e = getenv("COHORT_LOG_LEVEL");
    int l = CO_LOG_INFO;
    if (e && !strcasecmp(e, "debug")) l = CO_LOG_DEBUG;
    else if (e && !strcasecmp(e, "warn")) l = CO_LOG_WARN;
    else if (e && !strcasecmp(e, "error")) l = CO_LOG_ERROR;
    log__level = l;
    return l;
}

int co_log_enabled(co_log_level level) { return (int)level >= log__threshold(); }

void co_log(co_log_level level, const char *fmt, ...) {
    if (!co_log_enabled(level)) return;
    char line[4096];
    int n = snprintf(line, sizeof line, "%s: ", log__prefix);
    if (n < 0 || (size_t)n >= sizeof line) n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    for (size_t off = 0; off < len;) {
        ssize_t w = write(STDERR_FILENO, line + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        off += (size_t)w;
    }
}
