/* npy.c - .npy writer/reader (format 1.0). */
#include "data/npy.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t descr_size(const char *d) {
    if (!strcmp(d, "<i2") || !strcmp(d, "<u2")) return 2;
    if (!strcmp(d, "<i4") || !strcmp(d, "<u4")) return 4;
    if (!strcmp(d, "<i8") || !strcmp(d, "<u8")) return 8;
    return 0;
}

int npy_write(const char *path, const char *descr, int ndim, const int64_t shape[2], const void *data) {
    size_t isz = descr_size(descr);
    if (!isz || ndim < 1 || ndim > 2) return co_err_set(CO_EINVAL, "%s: unsupported npy layout", path);
    char hdr[256];
    int n;
    if (ndim == 1)
        n = snprintf(hdr + 10, sizeof hdr - 10, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRId64 ",), }",
                     descr, shape[0]);
    else
        n = snprintf(hdr + 10, sizeof hdr - 10,
                     "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRId64 ", %" PRId64 "), }", descr,
                     shape[0], shape[1]);
    size_t total = 10 + (size_t)n + 1; /* + '\n' */
    size_t padded = (total + 63) / 64 * 64;
    memset(hdr + 10 + n, ' ', padded - total);
    hdr[padded - 1] = '\n';
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    size_t hl = padded - 10;
    hdr[8] = (char)(hl & 0xff);
    hdr[9] = (char)(hl >> 8);
    size_t count = (size_t)shape[0] * (ndim == 2 ? (size_t)shape[1] : 1);
    const void *bufs[2] = {hdr, data};
    size_t lens[2] = {padded, count * isz};
    return fs_write_atomic_unique(path, bufs, lens, 2);
}

int npy_read(const char *path, const char *want_descr, int want_ndim, int64_t shape[2], void **data) {
    *data = NULL;
    char *buf;
    size_t len;
    int rc = fs_read_all(path, &buf, &len);
    if (rc) return rc;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0 || buf[6] != 1) {
        free(buf);
        return co_err_set(CO_EFORMAT, "%s: not a version 1 .npy file", path);
    }
    size_t hl = (size_t)(uint8_t)buf[8] | ((size_t)(uint8_t)buf[9] << 8);
    if (10 + hl > len) {
        free(buf);
        return co_err_set(CO_EFORMAT, "%s: truncated .npy header", path);
    }
    char hdr[512];
    if (hl >= sizeof hdr) {
        free(buf);
        return co_err_set(CO_EFORMAT, "%s: .npy header too long", path);
    }
    memcpy(hdr, buf + 10, hl);
    hdr[hl] = '\0';
    char want[64];
    snprintf(want, sizeof want, "'descr': '%s'", want_descr);
    const char *sp = strstr(hdr, "'shape': (");
    if (!strstr(hdr, want) || !strstr(hdr, "'fortran_order': False") || !sp) {
        free(buf);
        return co_err_set(CO_EFORMAT, "%s: unexpected .npy dtype or order (want %s): %s", path, want_descr, hdr);
    }
    sp += strlen("'shape': (");
    int64_t sh[2] = {0, 1};
    int nd = 0;
    while (nd < 2) {
        char *end;
        long long v = strtoll(sp, &end, 10);
        if (end == sp) break;
        if (v < 0) break;
        sh[nd++] = v;
        sp = end;
        while (*sp == ',' || *sp == ' ') sp++;
    }
    if (nd != want_ndim || *sp != ')') {
        free(buf);
        return co_err_set(CO_EFORMAT, "%s: unexpected .npy shape (want %d dimensions): %s", path, want_ndim, hdr);
    }
    size_t isz = descr_size(want_descr);
    uint64_t bytes = (uint64_t)sh[0] * (uint64_t)sh[1] * isz;
    if (len - 10 - hl != bytes) {
        free(buf);
        return co_err_set(CO_EFORMAT, "%s: .npy data is %zu bytes, shape needs %" PRIu64, path, len - 10 - hl,
                          bytes);
    }
    void *out = malloc(bytes ? bytes : 1);
    if (!out) {
        free(buf);
        return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    }
    memcpy(out, buf + 10 + hl, bytes);
    free(buf);
    shape[0] = sh[0];
    shape[1] = want_ndim == 2 ? sh[1] : 0;
    *data = out;
    return 0;
}
