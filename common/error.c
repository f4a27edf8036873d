/* error.c - names, messages and per-thread detail for cohort's error codes. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char co__detail[1024];

const char *co_err_name(int code) {
    switch (code) {
    case CO_OK: return "CO_OK";
#define CO__ERR_NAME(name, val, msg) case val: return "CO_E" #name;
        CO_ERRNO_MAP(CO__ERR_NAME)
#undef CO__ERR_NAME
    default: return "CO_EUNKNOWN";
    }
}

const char *co_strerror(int code) {
    switch (code) {
    case CO_OK: return "success";
#define CO__ERR_MSG(name, val, msg) case val: return msg;
        CO_ERRNO_MAP(CO__ERR_MSG)
#undef CO__ERR_MSG
    default: return "unknown error";
    }
}

/* Formats into a temporary first: an argument may be co_err_detail() itself
 * (co_err_set(rc, "context: %s", co_err_detail())), which vsnprintf straight into the
 * detail buffer would overwrite while reading it. */
int co_err_set(int code, const char *fmt, ...) {
    char tmp[sizeof co__detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(co__detail, tmp, sizeof tmp);
    return code;
}

const char *co_err_detail(void) { return co__detail; }

void co_err_clear(void) { co__detail[0] = '\0'; }
