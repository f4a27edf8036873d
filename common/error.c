/* error.c - names, messages and per-thread detail for cohort's error codes. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>

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

int co_err_set(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(co__detail, sizeof co__detail, fmt, ap);
    va_end(ap);
    return code;
}

const char *co_err_detail(void) { return co__detail; }

void co_err_clear(void) { co__detail[0] = '\0'; }
