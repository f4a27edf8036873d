/* indexed.c - reader and writer of Megatron's .idx/.bin indexed dataset files. */
#include "data/indexed.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char IDX_MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
#define IDX_HEADER 34

size_t idx_dtype_size(int dtype) {
    switch (dtype) {
    case IDX_UINT8:
    case IDX_INT8: return 1;
    case IDX_INT16:
    case IDX_UINT16: return 2;
    case IDX_INT32:
    case IDX_FLOAT32: return 4;
    case IDX_INT64:
    case IDX_FLOAT64: return 8;
    default: return 0;
    }
}

int idx_dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? IDX_UINT16 : IDX_INT32; }

struct idx_reader {
    char *bin_path;
    int dtype;
    size_t itemsize;
    int64_t nseq, ndoc_entries;
    int32_t *sizes;
    int64_t *pointers;
    int64_t *docs;
    const uint8_t *bin; /* mmap of .bin (NULL when empty) */
    size_t bin_size;
};

static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static char *cat2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

static int read_at(int fd, void *buf, size_t n, off_t off) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) return -EIO;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static int parse_idx(idx_reader *r, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s: cannot open index file: %s", path, strerror(e));
    }
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "%s: cannot stat: %s", path, strerror(e));
        goto out;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    uint8_t h[IDX_HEADER];
    if (fsize < IDX_HEADER) {
        rc = co_err_set(CO_EFORMAT, "%s: truncated header (%" PRIu64 " bytes, need %d)", path, fsize,
                        IDX_HEADER);
        goto out;
    }
    if (read_at(fd, h, IDX_HEADER, 0) != 0) {
        rc = co_err_set(CO_EIO, "%s: cannot read header", path);
        goto out;
    }
    if (memcmp(h, IDX_MAGIC, 9) != 0) {
        rc = co_err_set(CO_EFORMAT, "%s: bad magic (not a Megatron MMIDIDX index file)", path);
        goto out;
    }
    uint64_t version = rd_u64(h + 9);
    if (version != 1) {
        rc = co_err_set(CO_EFORMAT, "%s: unsupported version %" PRIu64 " (expected 1)", path, version);
        goto out;
    }
    r->dtype = h[17];
    r->itemsize = idx_dtype_size(r->dtype);
    if (r->itemsize == 0) {
        rc = co_err_set(CO_EFORMAT, "%s: unknown dtype code %d", path, r->dtype);
        goto out;
    }
    uint64_t nseq = rd_u64(h + 18), ndoc = rd_u64(h + 26);
    uint64_t avail = fsize - IDX_HEADER;
    /* 12 bytes per sequence + 8 per document entry must fit; compare without overflow */
    if (nseq > avail / 12 || ndoc > (avail - 12 * nseq) / 8) {
        rc = co_err_set(CO_EFORMAT,
                        "%s: counts larger than the file (sequence_count %" PRIu64
                        ", document_count %" PRIu64 ", file %" PRIu64 " bytes)",
                        path, nseq, ndoc, fsize);
        goto out;
    }
    uint64_t expect = IDX_HEADER + 12 * nseq + 8 * ndoc;
    if (fsize != expect && fsize != expect + nseq) {
        rc = co_err_set(CO_EFORMAT,
                        "%s: file size %" PRIu64 " does not match the counts (expected %" PRIu64 ")",
                        path, fsize, expect);
        goto out;
    }
    if (ndoc < 1) {
        rc = co_err_set(CO_EFORMAT, "%s: document index is empty (must start with 0)", path);
        goto out;
    }
    r->nseq = (int64_t)nseq;
    r->ndoc_entries = (int64_t)ndoc;
    r->sizes = malloc(nseq ? nseq * 4 : 1);
    r->pointers = malloc(nseq ? nseq * 8 : 1);
    r->docs = malloc(ndoc * 8);
    if (!r->sizes || !r->pointers || !r->docs) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory for %" PRIu64 " sequences", path, nseq);
        goto out;
    }
    if (read_at(fd, r->sizes, nseq * 4, IDX_HEADER) != 0 ||
        read_at(fd, r->pointers, nseq * 8, (off_t)(IDX_HEADER + 4 * nseq)) != 0 ||
        read_at(fd, r->docs, ndoc * 8, (off_t)(IDX_HEADER + 12 * nseq)) != 0) {
        rc = co_err_set(CO_EIO, "%s: read failed", path);
        goto out;
    }
    int64_t cum = 0;
    for (uint64_t i = 0; i < nseq; i++) {
        if (r->sizes[i] < 0) {
            rc = co_err_set(CO_EFORMAT, "%s: sequence %" PRIu64 " has negative length %d", path, i,
                            (int)r->sizes[i]);
            goto out;
        }
        if (r->pointers[i] != cum) {
            rc = co_err_set(CO_EFORMAT,
                            "%s: pointer of sequence %" PRIu64 " is %" PRId64 ", expected %" PRId64
                            " (pointers must be the cumulative byte offsets)",
                            path, i, r->pointers[i], cum);
            goto out;
        }
        cum += (int64_t)r->sizes[i] * (int64_t)r->itemsize;
    }
    if (r->docs[0] != 0) {
        rc = co_err_set(CO_EFORMAT, "%s: document index starts at %" PRId64 ", not 0", path, r->docs[0]);
        goto out;
    }
    for (uint64_t i = 1; i < ndoc; i++) {
        if (r->docs[i] < r->docs[i - 1] || r->docs[i] > (int64_t)nseq) {
            rc = co_err_set(CO_EFORMAT,
                            "%s: document index entry %" PRIu64 " = %" PRId64
                            " is not monotone or exceeds sequence_count %" PRIu64,
                            path, i, r->docs[i], nseq);
            goto out;
        }
    }
    if (r->docs[ndoc - 1] != (int64_t)nseq) {
        rc = co_err_set(CO_EFORMAT,
                        "%s: document index ends at %" PRId64 ", not at sequence_count %" PRIu64, path,
                        r->docs[ndoc - 1], nseq);
        goto out;
    }
    r->bin_size = (size_t)cum; /* expected .bin size, checked by the caller */
out:
    close(fd);
    return rc;
}

int idx_open(idx_reader **out, const char *prefix) {
    *out = NULL;
    idx_reader *r = calloc(1, sizeof *r);
    char *ipath = cat2(prefix, ".idx");
    if (!r || !ipath) {
        free(r);
        free(ipath);
        return co_err_set(CO_ENOMEM, "%s: out of memory", prefix);
    }
    r->bin_path = cat2(prefix, ".bin");
    int rc = r->bin_path ? parse_idx(r, ipath) : co_err_set(CO_ENOMEM, "%s: out of memory", prefix);
    if (rc == 0) {
        int fd = open(r->bin_path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0) {
            int e = errno;
            rc = co_err_set(fs_errno_code(e), "%s: cannot open data file: %s", r->bin_path, strerror(e));
        } else if (fstat(fd, &st) != 0) {
            int e = errno;
            rc = co_err_set(fs_errno_code(e), "%s: cannot stat: %s", r->bin_path, strerror(e));
        } else if ((uint64_t)st.st_size < (uint64_t)r->bin_size) {
            rc = co_err_set(CO_EFORMAT, "%s: data file too short (%lld bytes, the index needs %zu)",
                            r->bin_path, (long long)st.st_size, r->bin_size);
        } else if ((uint64_t)st.st_size > (uint64_t)r->bin_size) {
            rc = co_err_set(CO_EFORMAT,
                            "%s: data file longer than the index says (%lld bytes, the index needs %zu)",
                            r->bin_path, (long long)st.st_size, r->bin_size);
        } else if (r->bin_size > 0) {
            void *m = mmap(NULL, r->bin_size, PROT_READ, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED) {
                int e = errno;
                rc = co_err_set(fs_errno_code(e), "%s: mmap failed: %s", r->bin_path, strerror(e));
            } else {
                r->bin = m;
            }
        }
        if (fd >= 0) close(fd);
    }
    free(ipath);
    if (rc != 0) {
        idx_close(&r);
        return rc;
    }
    *out = r;
    return 0;
}

void idx_close(idx_reader **rp) {
    if (!rp || !*rp) return;
    idx_reader *r = *rp;
    if (r->bin) munmap((void *)r->bin, r->bin_size);
    free(r->sizes);
    free(r->pointers);
    free(r->docs);
    free(r->bin_path);
    free(r);
    *rp = NULL;
}

int idx_dtype(const idx_reader *r) { return r->dtype; }
int64_t idx_num_sequences(const idx_reader *r) { return r->nseq; }
int64_t idx_num_documents(const idx_reader *r) { return r->ndoc_entries - 1; }
int32_t idx_sequence_length(const idx_reader *r, int64_t i) { return r->sizes[i]; }
const int32_t *idx_sequence_lengths(const idx_reader *r) { return r->sizes; }
const int64_t *idx_document_indices(const idx_reader *r) { return r->docs; }

int idx_read(const idx_reader *r, int64_t i, int64_t offset, int64_t n, int32_t *out) {
    if (i < 0 || i >= r->nseq || offset < 0 || n < 0 || offset + n > r->sizes[i])
        return co_err_set(CO_ERANGE,
                          "%s: read of sequence %" PRId64 " [%" PRId64 ", +%" PRId64 ") out of range",
                          r->bin_path, i, offset, n);
    const uint8_t *p = r->bin + r->pointers[i] + offset * (int64_t)r->itemsize;
    switch (r->dtype) {
    case IDX_UINT8:
        for (int64_t k = 0; k < n; k++) out[k] = p[k];
        break;
    case IDX_INT8:
        for (int64_t k = 0; k < n; k++) out[k] = (int8_t)p[k];
        break;
    case IDX_UINT16:
        for (int64_t k = 0; k < n; k++) out[k] = (int32_t)((uint16_t)p[2 * k] | ((uint16_t)p[2 * k + 1] << 8));
        break;
    case IDX_INT16:
        for (int64_t k = 0; k < n; k++)
            out[k] = (int16_t)(uint16_t)((uint16_t)p[2 * k] | ((uint16_t)p[2 * k + 1] << 8));
        break;
    case IDX_INT32:
        for (int64_t k = 0; k < n; k++) {
            uint32_t v;
            memcpy(&v, p + 4 * k, 4);
            out[k] = (int32_t)v;
        }
        break;
    case IDX_INT64:
        for (int64_t k = 0; k < n; k++) {
            int64_t v;
            memcpy(&v, p + 8 * k, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return co_err_set(CO_ERANGE, "%s: token %" PRId64 " of sequence %" PRId64 " does not fit int32",
                                  r->bin_path, v, i);
            out[k] = (int32_t)v;
        }
        break;
    default:
        return co_err_set(CO_EUNSUPPORTED, "%s: float dtype %d cannot be read as tokens", r->bin_path,
                          r->dtype);
    }
    return 0;
}

/* ---- the vocabulary check ---- */

#define SCAN_BLOCK ((int64_t)1 << 20)

/* min and max of tokens [b, e) of the mapped file (little-endian host: typed loads the
 * compiler vectorises) */
static void scan_minmax(const idx_reader *r, int64_t b, int64_t e, int64_t *mn, int64_t *mx) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
#define SCAN(T)                                                     \
    do {                                                            \
        const T *p = (const T *)(const void *)r->bin;               \
        T l = p[b], h = p[b];                                       \
        for (int64_t k = b; k < e; k++) {                           \
            l = p[k] < l ? p[k] : l;                                \
            h = p[k] > h ? p[k] : h;                                \
        }                                                           \
        lo = (int64_t)l;                                            \
        hi = (int64_t)h;                                            \
    } while (0)
    switch (r->dtype) {
    case IDX_UINT8: SCAN(uint8_t); break;
    case IDX_INT8: SCAN(int8_t); break;
    case IDX_UINT16: SCAN(uint16_t); break;
    case IDX_INT16: SCAN(int16_t); break;
    case IDX_INT32: SCAN(int32_t); break;
    case IDX_INT64: SCAN(int64_t); break;
    default: break;
    }
#undef SCAN
    *mn = lo;
    *mx = hi;
}

static int64_t token_at(const idx_reader *r, int64_t k) {
    int64_t v;
    scan_minmax(r, k, k + 1, &v, &v);
    return v;
}

/* the last i in [0, n) with a[i] <= x (a sorted, a[0] <= x) */
static int64_t last_le(const int64_t *a, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (a[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int idx_check_vocab(const idx_reader *r, int64_t vocab) {
    if (vocab <= 0 || !r->bin || !r->bin_size) return 0;
    if (r->dtype == IDX_FLOAT32 || r->dtype == IDX_FLOAT64)
        return co_err_set(CO_EUNSUPPORTED, "%s: float dtype %d cannot be read as tokens", r->bin_path, r->dtype);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "idx_check_vocab reads the little-endian .bin with typed loads"
#endif
    const int64_t n = (int64_t)(r->bin_size / r->itemsize);
    /* one pass front to back: read ahead and map in large steps, then back to the default
     * for training's random reads */
    madvise((void *)r->bin, r->bin_size, MADV_SEQUENTIAL);
    int rc = 0;
    for (int64_t b = 0; b < n && !rc; b += SCAN_BLOCK) {
        int64_t e = b + SCAN_BLOCK < n ? b + SCAN_BLOCK : n, mn, mx;
        scan_minmax(r, b, e, &mn, &mx);
        if (mn >= 0 && mx < vocab) continue;
        int64_t k = b;
        for (; k < e; k++) {
            int64_t v = token_at(r, k);
            if (v < 0 || v >= vocab) break;
        }
        int64_t v = token_at(r, k);
        /* the sequence holding byte offset k*itemsize (the last of equal pointers: empty
         * sequences come before it), then its document */
        int64_t seq = last_le(r->pointers, r->nseq, k * (int64_t)r->itemsize);
        int64_t doc = last_le(r->docs, r->ndoc_entries - 1, seq);
        int64_t pos = k - r->pointers[seq] / (int64_t)r->itemsize;
        rc = co_err_set(CO_EFORMAT,
                        "%s: document %" PRId64 " (sequence %" PRId64 ", token %" PRId64
                        ") holds token id %" PRId64 ", outside the vocabulary 0..%" PRId64
                        " (--tokenizer-type/--vocab-size/--vocab-file give the vocabulary)",
                        r->bin_path, doc, seq, pos, v, vocab - 1);
    }
    madvise((void *)r->bin, r->bin_size, MADV_NORMAL);
    return rc;
}

/* ---- writer ---- */

struct idx_writer {
    char *prefix, *bin_tmp, *idx_tmp;
    int dtype;
    size_t itemsize;
    int fd;
    int32_t *sizes;
    size_t nseq, cap_seq;
    int64_t *docs;
    size_t ndoc, cap_doc;
    uint8_t *buf;
    size_t buf_used, buf_cap;
};

void idx_writer_abort(idx_writer **wp) {
    if (!wp || !*wp) return;
    idx_writer *w = *wp;
    if (w->fd >= 0) close(w->fd);
    if (w->bin_tmp) unlink(w->bin_tmp);
    if (w->idx_tmp) unlink(w->idx_tmp);
    free(w->prefix);
    free(w->bin_tmp);
    free(w->idx_tmp);
    free(w->sizes);
    free(w->docs);
    free(w->buf);
    free(w);
    *wp = NULL;
}

int idx_writer_new(idx_writer **out, const char *prefix, int dtype) {
    *out = NULL;
    if (dtype == IDX_FLOAT32 || dtype == IDX_FLOAT64 || idx_dtype_size(dtype) == 0)
        return co_err_set(CO_EINVAL, "%s: writer dtype %d is not an integer dtype code", prefix, dtype);
    idx_writer *w = calloc(1, sizeof *w);
    if (!w) return co_err_set(CO_ENOMEM, "%s: out of memory", prefix);
    w->fd = -1;
    w->dtype = dtype;
    w->itemsize = idx_dtype_size(dtype);
    w->prefix = strdup(prefix);
    w->bin_tmp = cat2(prefix, ".bin.tmp");
    w->idx_tmp = cat2(prefix, ".idx.tmp");
    w->cap_doc = 16;
    w->docs = malloc(w->cap_doc * sizeof *w->docs);
    w->buf_cap = 1 << 20;
    w->buf = malloc(w->buf_cap);
    if (!w->prefix || !w->bin_tmp || !w->idx_tmp || !w->docs || !w->buf) {
        idx_writer_abort(&w);
        return co_err_set(CO_ENOMEM, "%s: out of memory", prefix);
    }
    w->docs[w->ndoc++] = 0;
    w->fd = open(w->bin_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        int rc = co_err_set(fs_errno_code(e), "%s: cannot create: %s", w->bin_tmp, strerror(e));
        free(w->bin_tmp);
        w->bin_tmp = NULL; /* nothing to unlink */
        idx_writer_abort(&w);
        return rc;
    }
    *out = w;
    return 0;
}

static int wr_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int flush_buf(idx_writer *w) {
    if (w->buf_used && wr_all(w->fd, w->buf, w->buf_used) != 0) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s: write failed: %s", w->bin_tmp, strerror(e));
    }
    w->buf_used = 0;
    return 0;
}

int idx_writer_add_sequence(idx_writer *w, const int32_t *tokens, size_t n) {
    if (n > INT32_MAX) return co_err_set(CO_ERANGE, "%s: sequence of %zu tokens is too long", w->prefix, n);
    int64_t lo, hi;
    switch (w->dtype) {
    case IDX_UINT8: lo = 0, hi = 255; break;
    case IDX_INT8: lo = -128, hi = 127; break;
    case IDX_UINT16: lo = 0, hi = 65535; break;
    case IDX_INT16: lo = -32768, hi = 32767; break;
    default: lo = INT32_MIN, hi = INT32_MAX; break;
    }
    for (size_t k = 0; k < n; k++)
        if (tokens[k] < lo || tokens[k] > hi)
            return co_err_set(CO_ERANGE, "%s: token %d does not fit dtype code %d", w->prefix,
                              (int)tokens[k], w->dtype);
    if (w->nseq == w->cap_seq) {
        size_t nc = w->cap_seq ? w->cap_seq * 2 : 1024;
        int32_t *ns = realloc(w->sizes, nc * sizeof *ns);
        if (!ns) return co_err_set(CO_ENOMEM, "%s: out of memory", w->prefix);
        w->sizes = ns;
        w->cap_seq = nc;
    }
    for (size_t k = 0; k < n; k++) {
        if (w->buf_used + w->itemsize > w->buf_cap) {
            int rc = flush_buf(w);
            if (rc) return rc;
        }
        uint8_t *p = w->buf + w->buf_used;
        uint64_t v = (uint64_t)(int64_t)tokens[k];
        for (size_t b = 0; b < w->itemsize; b++) p[b] = (uint8_t)(v >> (8 * b));
        w->buf_used += w->itemsize;
    }
    w->sizes[w->nseq++] = (int32_t)n;
    return 0;
}

int idx_writer_end_document(idx_writer *w) {
    if (w->ndoc == w->cap_doc) {
        size_t nc = w->cap_doc * 2;
        int64_t *nd = realloc(w->docs, nc * sizeof *nd);
        if (!nd) return co_err_set(CO_ENOMEM, "%s: out of memory", w->prefix);
        w->docs = nd;
        w->cap_doc = nc;
    }
    w->docs[w->ndoc++] = (int64_t)w->nseq;
    return 0;
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int idx_writer_finish(idx_writer **wp) {
    idx_writer *w = *wp;
    int rc = flush_buf(w);
    if (rc) goto fail;
    if (fsync(w->fd) != 0 || close(w->fd) != 0) {
        int e = errno;
        w->fd = -1;
        rc = co_err_set(fs_errno_code(e), "%s: fsync failed: %s", w->bin_tmp, strerror(e));
        goto fail;
    }
    w->fd = -1;
    /* .idx: header, sizes (int32), pointers (int64), document indices (int64) */
    size_t total = IDX_HEADER + 12 * w->nseq + 8 * w->ndoc;
    uint8_t *idx = malloc(total);
    if (!idx) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", w->prefix);
        goto fail;
    }
    memcpy(idx, IDX_MAGIC, 9);
    put_u64(idx + 9, 1);
    idx[17] = (uint8_t)w->dtype;
    put_u64(idx + 18, w->nseq);
    put_u64(idx + 26, w->ndoc);
    uint8_t *p = idx + IDX_HEADER;
    for (size_t i = 0; i < w->nseq; i++, p += 4) {
        uint32_t v = (uint32_t)w->sizes[i];
        for (int b = 0; b < 4; b++) p[b] = (uint8_t)(v >> (8 * b));
    }
    uint64_t cum = 0;
    for (size_t i = 0; i < w->nseq; i++, p += 8) {
        put_u64(p, cum);
        cum += (uint64_t)w->sizes[i] * w->itemsize;
    }
    for (size_t i = 0; i < w->ndoc; i++, p += 8) put_u64(p, (uint64_t)w->docs[i]);
    char *idx_path = cat2(w->prefix, ".idx"), *bin_path = cat2(w->prefix, ".bin");
    if (!idx_path || !bin_path) {
        free(idx);
        free(idx_path);
        free(bin_path);
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", w->prefix);
        goto fail;
    }
    const void *bufs[1] = {idx};
    size_t lens[1] = {total};
    /* .bin first, then .idx (written via .idx.tmp, fsynced, renamed, directory fsynced) */
    if (rename(w->bin_tmp, bin_path) != 0) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "%s: rename failed: %s", w->bin_tmp, strerror(e));
    } else {
        rc = fs_write_atomic(idx_path, bufs, lens, 1);
    }
    free(idx);
    free(idx_path);
    free(bin_path);
    if (rc) goto fail;
    free(w->bin_tmp);
    w->bin_tmp = NULL; /* renamed: do not unlink */
    idx_writer_abort(wp);
    return 0;
fail:
    idx_writer_abort(wp);
    return rc;
}
