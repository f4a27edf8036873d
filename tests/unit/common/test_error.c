/* test_error.c - error codes' names and messages, and the per-thread detail, including a
 * detail that wraps the previous one (co_err_set(rc, "context: %s", co_err_detail())). */
#include "common/error.h"
#include "tests/test.h"

#include <string.h>

static void test_names(void) {
    CHECK(!strcmp(co_err_name(CO_EFORMAT), "CO_EFORMAT"));
    CHECK(!strcmp(co_err_name(CO_OK), "CO_OK"));
    CHECK(!strcmp(co_strerror(CO_ENOSPC), "no space left on device"));
    CHECK(!strcmp(co_err_name(-999), "CO_EUNKNOWN"));
}

static void test_set_and_clear(void) {
    CHECK(co_err_set(CO_EIO, "%s: %d", "file", 7) == CO_EIO);
    CHECK(!strcmp(co_err_detail(), "file: 7"));
    co_err_clear();
    CHECK(!strcmp(co_err_detail(), ""));
}

/* the detail as an argument of the next co_err_set: source and destination were one buffer */
static void test_wrap_own_detail(void) {
    co_err_set(CO_ENOSPC, "writing model.safetensors at byte 42: No space left on device");
    CHECK(co_err_set(CO_ENOSPC, "saving iteration 100: %s", co_err_detail()) == CO_ENOSPC);
    CHECK_MSG(!strcmp(co_err_detail(), "saving iteration 100: writing model.safetensors at byte 42: No space left on device"),
              "got '%s'", co_err_detail());
    /* twice more, prefix and suffix */
    co_err_set(CO_EIO, "a: %s", co_err_detail());
    co_err_set(CO_EIO, "%s (b)", co_err_detail());
    CHECK_MSG(!strcmp(co_err_detail(),
                      "a: saving iteration 100: writing model.safetensors at byte 42: No space left on device (b)"),
              "got '%s'", co_err_detail());
    /* a detail near the buffer's size is cut, not overrun */
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    co_err_set(CO_EIO, "%s", big);
    co_err_set(CO_EIO, "ctx: %s", co_err_detail());
    const char *d = co_err_detail();
    size_t n = strlen(d);
    CHECK(n > 100 && n < sizeof big);
    CHECK(!strncmp(d, "ctx: xxxx", 9));
    CHECK(strspn(d + 5, "x") == n - 5);
}

int main(void) {
    RUN(test_names);
    RUN(test_set_and_clear);
    RUN(test_wrap_own_detail);
    return TEST_EXIT();
}
