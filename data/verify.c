/* verify.c - structural checks of PREFIX.idx/.bin with a distinct result per check. */
#include "data/verify.h"

#include "data/indexed.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int say(char *msg, size_t n, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int say(char *msg, size_t n, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, n, fmt, ap);
    va_end(ap);
    return code;
}

static int64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return (int64_t)v;
}

int idxv_verify(const char *prefix, int64_t vocab, char *msg, size_t mn) {
    char ip[4096], bp[4096];
    snprintf(ip, sizeof ip, "%s.idx", prefix);
    snprintf(bp, sizeof bp, "%s.bin", prefix);
    FILE *f = fopen(ip, "rb");
    if (!f) return say(msg, mn, IDXV_IDX_OPEN, "%s: cannot open: %s", ip, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st)) {
        fclose(f);
        return say(msg, mn, IDXV_IDX_OPEN, "%s: cannot stat", ip);
    }
    size_t isz = (size_t)st.st_size;
    unsigned char *buf = malloc(isz ? isz : 1);
    if (!buf || fread(buf, 1, isz, f) != isz) {
        free(buf);
        fclose(f);
        return say(msg, mn, IDXV_IDX_OPEN, "%s: read error", ip);
    }
    fclose(f);
    int rc = IDXV_OK;
    unsigned char *bin = NULL;
    size_t bsz = 0;
    if (isz < 34) {
        rc = say(msg, mn, IDXV_HEADER, "%s: %zu bytes, shorter than the 34-byte header", ip, isz);
        goto out;
    }
    if (memcmp(buf, "MMIDIDX\0\0", 9)) {
        rc = say(msg, mn, IDXV_HEADER, "%s: bad magic (not a Megatron MMIDIDX index)", ip);
        goto out;
    }
    if (rd64(buf + 9) != 1) {
        rc = say(msg, mn, IDXV_HEADER, "%s: version %" PRId64 ", expected 1", ip, rd64(buf + 9));
        goto out;
    }
    int dtype = buf[17];
    size_t item = idx_dtype_size(dtype);
    if (!item) {
        rc = say(msg, mn, IDXV_HEADER, "%s: unknown dtype code %d", ip, dtype);
        goto out;
    }
    /* the counts are unsigned 64-bit: compared and printed as such (a huge count is no negative one) */
    uint64_t uns = (uint64_t)rd64(buf + 18), und = (uint64_t)rd64(buf + 26);
    if (uns > isz / 12 || und > isz / 8) {
        rc = say(msg, mn, IDXV_IDX_SIZE,
                 "%s: %zu bytes, but %" PRIu64 " sequences and %" PRIu64 " document entries need more than the file",
                 ip, isz, uns, und);
        goto out;
    }
    if (34 + 12 * uns + 8 * und != isz && 34 + 13 * uns + 8 * und != isz) {
        rc = say(msg, mn, IDXV_IDX_SIZE, "%s: %zu bytes, but %" PRIu64 " sequences and %" PRIu64 " document entries need %" PRIu64,
                 ip, isz, uns, und, (uint64_t)34 + 12 * uns + 8 * und);
        goto out;
    }
    int64_t ns = (int64_t)uns, nd = (int64_t)und; /* (each below the file's size) */
    const unsigned char *lens = buf + 34, *ptrs = lens + 4 * ns, *docs = ptrs + 8 * ns;
    int64_t total = 0;
    for (int64_t i = 0; i < ns; i++) {
        int32_t l;
        memcpy(&l, lens + 4 * i, 4);
        int64_t p = rd64(ptrs + 8 * i);
        if (l < 0) {
            rc = say(msg, mn, IDXV_SEQUENCES, "%s: sequence %" PRId64 " has negative length %d", ip, i, l);
            goto out;
        }
        if (p != total * (int64_t)item) {
            rc = say(msg, mn, IDXV_SEQUENCES, "%s: pointer of sequence %" PRId64 " is %" PRId64 ", expected %" PRId64,
                     ip, i, p, total * (int64_t)item);
            goto out;
        }
        total += l;
    }
    if (nd < 1 || rd64(docs) != 0 || rd64(docs + 8 * (nd - 1)) != ns) {
        rc = say(msg, mn, IDXV_DOCUMENTS, "%s: the document index must start at 0 and end at %" PRId64 " sequences", ip,
                 ns);
        goto out;
    }
    for (int64_t i = 1; i < nd; i++)
        if (rd64(docs + 8 * i) < rd64(docs + 8 * (i - 1))) {
            rc = say(msg, mn, IDXV_DOCUMENTS, "%s: document index decreases at entry %" PRId64, ip, i);
            goto out;
        }
    int fd = open(bp, O_RDONLY);
    if (fd < 0 || fstat(fd, &st)) {
        if (fd >= 0) close(fd);
        rc = say(msg, mn, IDXV_BIN_OPEN, "%s: cannot open: %s", bp, strerror(errno));
        goto out;
    }
    bsz = (size_t)st.st_size;
    if ((int64_t)bsz != total * (int64_t)item) {
        close(fd);
        rc = say(msg, mn, IDXV_BIN_SIZE, "%s: %zu bytes, the index describes %" PRId64 " tokens of %zu bytes", bp, bsz,
                 total, item);
        goto out;
    }
    if (bsz) {
        bin = mmap(NULL, bsz, PROT_READ, MAP_PRIVATE, fd, 0);
        if (bin == MAP_FAILED) {
            bin = NULL;
            close(fd);
            rc = say(msg, mn, IDXV_BIN_OPEN, "%s: cannot map", bp);
            goto out;
        }
    }
    close(fd);
    for (int64_t k = 0; k < total; k++) {
        const unsigned char *p = bin + (size_t)k * item;
        double v;
        switch (dtype) {
        case IDX_UINT8: v = p[0]; break;
        case IDX_INT8: v = (int8_t)p[0]; break;
        case IDX_INT16: { int16_t x; memcpy(&x, p, 2); v = x; } break;
        case IDX_UINT16: { uint16_t x; memcpy(&x, p, 2); v = x; } break;
        case IDX_INT32: { int32_t x; memcpy(&x, p, 4); v = x; } break;
        case IDX_INT64: v = (double)rd64(p); break;
        case IDX_FLOAT32: { float x; memcpy(&x, p, 4); v = x; } break;
        default: { double x; memcpy(&x, p, 8); v = x; } break;
        }
        if (v < 0 || (vocab > 0 && v >= (double)vocab) || v != (double)(int64_t)v) {
            /* the sequence and the document holding it (pointers are cumulative, checked above) */
            int64_t seq = 0, doc = 0;
            while (seq + 1 < ns && rd64(ptrs + 8 * (seq + 1)) <= k * (int64_t)item) seq++;
            while (doc + 2 < nd && rd64(docs + 8 * (doc + 1)) <= seq) doc++;
            rc = say(msg, mn, IDXV_TOKENS, "%s: token %" PRId64 " (document %" PRId64 ", sequence %" PRId64 ") is %g, outside 0..%" PRId64,
                     bp, k, doc, seq, v, vocab > 0 ? vocab - 1 : INT64_MAX);
            goto out;
        }
    }
    say(msg, mn, IDXV_OK, "%s: ok: %" PRId64 " documents, %" PRId64 " sequences, %" PRId64 " tokens, dtype code %d",
        prefix, nd - 1, ns, total, dtype);
out:
    if (bin) munmap(bin, bsz);
    free(buf);
    return rc;
}
