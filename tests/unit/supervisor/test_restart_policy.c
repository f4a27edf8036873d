/* test_restart_policy.c - supervisor/supervisor.c's sv_incurable_status: which of a rank's
 * own failures a restart may cure (a peer's death, a timeout, an abort, I/O) and which stop
 * the job at once with the status one process would exit with (a configuration or
 * checkpoint that does not fit: 2; a full disk, permission denied, a missing file: 1); and
 * common/fsutil.c's errno mapping those rest on. */
#include "common/error.h"
#include "common/fsutil.h"
#include "supervisor/supervisor.h"

#include "tests/test.h"

#include <errno.h>

enum { WORKER_FAILURE = 1, WORKER_USAGE = 2 }; /* worker/rank.h's WK_FAILURE, WK_USAGE */

static void curable(void) {
    /* a peer died or went silent, a wait timed out, the generation was aborted: the rank
     * that reports it is not at fault, and a restart replaces the one that is */
    const int codes[] = {CO_EREMOTE, CO_ETIMEOUT, CO_EABORTED, CO_EPROTOCOL, CO_EINTERRUPTED,
                         CO_EIO,     CO_ENOMEM,   CO_EFORMAT,  CO_EINTERNAL, CO_ERANGE};
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
        CHECK_MSG(sv_incurable_status(codes[i], WORKER_FAILURE) == 0, "%s", co_err_name(codes[i]));
        CHECK_MSG(sv_incurable_status(codes[i], WORKER_USAGE) == 0, "%s", co_err_name(codes[i]));
    }
    CHECK(sv_incurable_status(0, WORKER_FAILURE) == 0);
}

static void incurable(void) {
    /* the flags or a --load that do not fit the model: as one process, 2 at setup */
    CHECK(sv_incurable_status(CO_EINVAL, WORKER_USAGE) == SV_EXIT_USAGE);
    CHECK(sv_incurable_status(CO_EUNSUPPORTED, WORKER_USAGE) == SV_EXIT_USAGE);
    CHECK(sv_incurable_status(CO_EINVAL, WORKER_FAILURE) == SV_EXIT_FAILURE);
    /* the disk, the permissions, a missing file: 1, as one process */
    CHECK(sv_incurable_status(CO_ENOSPC, WORKER_FAILURE) == SV_EXIT_FAILURE);
    CHECK(sv_incurable_status(CO_EDENIED, WORKER_FAILURE) == SV_EXIT_FAILURE);
    CHECK(sv_incurable_status(CO_ECORRUPT, WORKER_FAILURE) == SV_EXIT_FAILURE); /* no usable checkpoint left */
    CHECK(sv_incurable_status(CO_ENOENT, WORKER_FAILURE) == SV_EXIT_FAILURE);
    CHECK(sv_incurable_status(CO_ENOSPC, WORKER_USAGE) == SV_EXIT_FAILURE);
}

static void errno_codes(void) {
    /* what a failed write or open reports: ENOSPC and EDQUOT are a full disk, EACCES, EPERM
     * and EROFS permission denied, ENOENT a missing file; EIO stays curable */
    CHECK(fs_errno_code(ENOSPC) == CO_ENOSPC);
    CHECK(fs_errno_code(EDQUOT) == CO_ENOSPC);
    CHECK(fs_errno_code(EACCES) == CO_EDENIED);
    CHECK(fs_errno_code(EPERM) == CO_EDENIED);
    CHECK(fs_errno_code(EROFS) == CO_EDENIED);
    CHECK(fs_errno_code(ENOENT) == CO_ENOENT);
    CHECK(fs_errno_code(EIO) == CO_EIO);
    CHECK(sv_incurable_status(fs_errno_code(EACCES), WORKER_FAILURE) == SV_EXIT_FAILURE);
    CHECK(sv_incurable_status(fs_errno_code(EIO), WORKER_FAILURE) == 0);
}

int main(void) {
    RUN(curable);
    RUN(incurable);
    RUN(errno_codes);
    return TEST_EXIT();
}
