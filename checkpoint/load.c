/* load.c - checkpoint loading and verification: each shard file is read once, front to
 * back, hashed as it is read, its header checked against the manifest, and every piece
 * copied into place in the global tensors whatever the layout on disk (see ckpt.h). */
#include "checkpoint/ckpt.h"

#include "common/error.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SCRATCH (8u << 20)

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t p = 1;
    for (int d = 0; d < ndim; d++) p *= shape[d];
    return p;
}

static int fail(ck_bad *bad, ck_bad kind, int rc) {
    if (bad) *bad = kind;
    return rc;
}

static ck_bad bad_of(int rc) {
    return rc == CO_EFORMAT ? CK_BAD_FORMAT : rc == CO_ENOENT ? CK_BAD_INCOMPLETE : CK_BAD_IO;
}

/* Copies a rectangular piece (shape s at offsets off) into the global tensor t (row-major). */
static void scatter(float *dst, const ck_mtensor *t, const ck_slice *s, const float *src) {
    int nd = t->ndim;
    if (nd == 0) {
        dst[0] = src[0];
        return;
    }
    int64_t run = s->shape[nd - 1];
    int64_t idx[CK_MAX_DIMS] = {0};
    int64_t outer = numel_of(nd - 1, s->shape);
    for (int64_t o = 0; o < outer; o++) {
        int64_t g = 0;
        for (int d = 0; d < nd; d++) g = g * t->shape[d] + (s->offsets[d] + (d < nd - 1 ? idx[d] : 0));
        memcpy(dst + g, src + o * run, (size_t)run * sizeof(float));
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < s->shape[d]) break;
            idx[d] = 0;
        }
    }
}

/* Is the piece one contiguous range of the global tensor? Then its first element's index. */
static bool contiguous(const ck_mtensor *t, const ck_slice *s, int64_t *first) {
    if (s->flat) {
        *first = s->flat_begin;
        return true;
    }
    for (int d = 1; d < t->ndim; d++)
        if (s->offsets[d] || s->shape[d] != t->shape[d]) return false;
    *first = t->ndim ? s->offsets[0] * numel_of(t->ndim - 1, t->shape + 1) : 0;
    return true;
}

typedef struct piece {
    int tensor, slice;
} piece;

/* Reads file fi whole, verifying it, and places the pieces of tensors with dst[tensor]. */
static int process_file(const char *dir, const ck_manifest *m, int fi, float *const *dst, ck_bad *bad) {
    const ck_mfile *f = &m->files[fi];
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, f->name);
    ck_file cf;
    uint64_t size;
    int rc = ck_file_open(&cf, path, &size);
    if (rc) return fail(bad, rc == CO_ENOENT ? CK_BAD_INCOMPLETE : CK_BAD_IO,
                        rc == CO_ENOENT ? co_err_set(CO_ENOENT, "%s: missing (the manifest lists it)", path) : rc);
    if (size != f->size) {
        ck_file_close(&cf, NULL);
        return fail(bad, CK_BAD_INCOMPLETE,
                    co_err_set(CO_EFORMAT, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (%s)", path, size, f->size,
                               size < f->size ? "truncated" : "grown"));
    }
    uint8_t lenbuf[8];
    uint64_t jl = 0;
    rc = ck_file_read(&cf, lenbuf, 8);
    if (!rc) rc = ck_st_header_len(lenbuf, 8, size, &jl);
    if (rc) {
        ck_file_close(&cf, NULL);
        return fail(bad, CK_BAD_FORMAT, ck_err_wrap(CO_EFORMAT, "%s", path));
    }
    char *hbuf = malloc(8 + jl);
    if (!hbuf) {
        ck_file_close(&cf, NULL);
        return fail(bad, CK_BAD_IO, co_err_set(CO_ENOMEM, "%s: out of memory", path));
    }
    memcpy(hbuf, lenbuf, 8);
    rc = ck_file_read(&cf, hbuf + 8, jl);
    ck_st_header *h = NULL;
    if (!rc) rc = ck_st_parse(hbuf, 8 + jl, size, path, &h);
    free(hbuf);
    if (rc) {
        ck_file_close(&cf, NULL);
        return fail(bad, CK_BAD_FORMAT, rc);
    }
    /* every header entry is a piece the manifest places in this file, and vice versa */
    piece *pc = calloc((size_t)(h->n ? h->n : 1), sizeof *pc);
    if (!pc) rc = fail(bad, CK_BAD_IO, co_err_set(CO_ENOMEM, "%s: out of memory", path));
    int listed = 0;
    for (int e = 0; e < h->n && !rc; e++) pc[e].tensor = -1;
    for (int i = 0; i < m->ntensors && !rc; i++) {
        const ck_mtensor *t = &m->tensors[i];
        for (int k = 0; k < t->nslices && !rc; k++) {
            const ck_slice *s = &t->slices[k];
            if (s->file != fi) continue;
            listed++;
            const ck_st_entry *en = ck_st_find(h, s->key);
            if (!en) {
                rc = fail(bad, CK_BAD_FORMAT, co_err_set(CO_EFORMAT, "%s: lacks tensor %s (manifest: piece of %s)", path, s->key, t->name));
                break;
            }
            int64_t want_shape[CK_MAX_DIMS];
            int want_nd = t->ndim;
            if (s->flat) {
                want_nd = 1;
                want_shape[0] = s->flat_end - s->flat_begin;
            } else {
                memcpy(want_shape, s->shape, sizeof want_shape);
            }
            bool same = en->dtype == t->dtype && en->ndim == want_nd;
            for (int d = 0; same && d < want_nd; d++) same = en->shape[d] == want_shape[d];
            if (!same) {
                rc = fail(bad, CK_BAD_FORMAT,
                          co_err_set(CO_EFORMAT, "%s: tensor %s has a dtype or shape other than the manifest's", path, s->key));
                break;
            }
            pc[en - h->e] = (piece){i, k};
        }
    }
    if (!rc && listed != h->n)
        rc = fail(bad, CK_BAD_FORMAT,
                  co_err_set(CO_EFORMAT, "%s: holds %d tensors, the manifest places %d in it", path, h->n, listed));
    float *scratch = NULL;
    size_t scratch_cap = 0;
    for (int e = 0; e < h->n && !rc; e++) {
        const ck_st_entry *en = &h->e[e];
        uint64_t nbytes = en->end - en->begin;
        const ck_mtensor *t = &m->tensors[pc[e].tensor];
        const ck_slice *s = &t->slices[pc[e].slice];
        float *d = dst ? dst[pc[e].tensor] : NULL;
        int64_t first;
        if (d && t->dtype == CK_DT_F32 && contiguous(t, s, &first)) {
            rc = ck_file_read(&cf, d + first, (size_t)nbytes);
        } else if (d && t->dtype == CK_DT_F32) {
            if (nbytes > scratch_cap) {
                free(scratch);
                scratch_cap = (size_t)nbytes;
                scratch = malloc(scratch_cap);
                if (!scratch) {
                    rc = fail(bad, CK_BAD_IO, co_err_set(CO_ENOMEM, "%s: out of memory", path));
                    break;
                }
            }
            rc = ck_file_read(&cf, scratch, (size_t)nbytes);
            if (!rc) scatter(d, t, s, scratch);
        } else {
            if (scratch_cap < SCRATCH) {
                free(scratch);
                scratch_cap = SCRATCH;
                scratch = malloc(scratch_cap);
                if (!scratch) {
                    rc = fail(bad, CK_BAD_IO, co_err_set(CO_ENOMEM, "%s: out of memory", path));
                    break;
                }
            }
            while (nbytes && !rc) {
                size_t n = nbytes < scratch_cap ? (size_t)nbytes : scratch_cap;
                rc = ck_file_read(&cf, scratch, n);
                nbytes -= n;
            }
        }
        if (rc && bad && !*bad) *bad = rc == CO_EFORMAT ? CK_BAD_INCOMPLETE : CK_BAD_IO;
    }
    free(scratch);
    free(pc);
    ck_st_header_free(&h);
    uint8_t hash[16];
    uint64_t read_bytes = cf.bytes;
    ck_file_close(&cf, hash);
    if (rc) return rc;
    if (read_bytes != size)
        return fail(bad, CK_BAD_FORMAT, co_err_set(CO_EFORMAT, "%s: %" PRIu64 " unread bytes", path, size - read_bytes));
    if (memcmp(hash, f->xxh128, 16)) {
        char a[33], b[33];
        ck_hex128(hash, a);
        ck_hex128(f->xxh128, b);
        return fail(bad, CK_BAD_CHECKSUM,
                    co_err_set(CO_EFORMAT, "%s: checksum mismatch: XXH3-128 %s, the manifest says %s (corrupt)", path, a, b));
    }
    return 0;
}

int ck_load_tensors(const char *dir, const ck_manifest *m, const ck_tensor_ref *refs, int n, ck_bad *bad) {
    if (bad) *bad = CK_OK;
    float **dst = calloc((size_t)(m->ntensors ? m->ntensors : 1), sizeof *dst);
    bool *need = calloc((size_t)(m->nfiles ? m->nfiles : 1), sizeof *need);
    int rc = 0;
    if (!dst || !need) rc = co_err_set(CO_ENOMEM, "loading %s: out of memory", dir);
    for (int i = 0; i < n && !rc; i++) {
        const ck_mtensor *t = ck_manifest_find(m, refs[i].name);
        if (!t) {
            rc = co_err_set(CO_EINVAL, "%s: the checkpoint has no tensor %s (a different model? --use-checkpoint-args "
                                       "takes the checkpoint's model flags)", dir, refs[i].name);
            break;
        }
        bool same = t->ndim == refs[i].ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == refs[i].shape[d];
        if (!same) {
            char a[64] = "", b[64] = "";
            for (int d = 0; d < t->ndim; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%" PRId64, d ? "," : "", t->shape[d]);
            for (int d = 0; d < refs[i].ndim; d++)
                snprintf(b + strlen(b), sizeof b - strlen(b), "%s%" PRId64, d ? "," : "", refs[i].shape[d]);
            rc = co_err_set(CO_EINVAL, "%s: tensor %s is [%s] in the checkpoint but [%s] in the model "
                                       "(--use-checkpoint-args takes the checkpoint's model flags)", dir, t->name, a, b);
            break;
        }
        if (t->dtype != CK_DT_F32) {
            rc = co_err_set(CO_EUNSUPPORTED, "%s: tensor %s is %s; only F32 loads", dir, t->name, ck_dtype_name(t->dtype));
            break;
        }
        dst[t - m->tensors] = refs[i].dst;
        for (int k = 0; k < t->nslices; k++) need[t->slices[k].file] = true;
    }
    for (int fi = 0; fi < m->nfiles && !rc; fi++)
        if (need[fi]) rc = process_file(dir, m, fi, dst, bad);
    if (rc && bad && !*bad) *bad = bad_of(rc);
    free(dst);
    free(need);
    return rc;
}

int ck_verify(const char *dir, ck_bad *bad, ck_verify_cb report, void *ctx) {
    *bad = CK_OK;
    ck_manifest *m = NULL;
    int rc = ck_read_manifest(dir, &m);
    if (rc) {
        *bad = rc == CO_ENOENT ? CK_BAD_INCOMPLETE : rc == CO_EFORMAT ? CK_BAD_FORMAT : CK_BAD_IO;
        if (report) report(ctx, CK_MANIFEST_NAME, *bad, co_err_detail());
        return rc;
    }
    if (report) report(ctx, CK_MANIFEST_NAME, CK_OK, "");
    int first = 0;
    for (int fi = 0; fi < m->nfiles; fi++) {
        ck_bad b = CK_OK;
        int r = process_file(dir, m, fi, NULL, &b);
        if (r && b == CK_OK) b = bad_of(r);
        if (report) report(ctx, m->files[fi].name, b, r ? co_err_detail() : "");
        /* the worst problem decides: malformed, then incomplete, then checksum, then I/O */
        if (r) {
            static const int rank[] = {[CK_OK] = 0, [CK_BAD_IO] = 1, [CK_BAD_CHECKSUM] = 2, [CK_BAD_INCOMPLETE] = 3,
                                       [CK_BAD_FORMAT] = 4};
            if (!first || rank[b] > rank[*bad]) *bad = b;
            if (!first) first = r;
        }
    }
    ck_manifest_free(&m);
    return first;
}

int ck_read_all(const char *dir, const ck_manifest *m, int kinds, float ***out, ck_bad *bad) {
    *out = NULL;
    float **bufs = calloc((size_t)(m->ntensors ? m->ntensors : 1), sizeof *bufs);
    ck_tensor_ref *refs = calloc((size_t)(m->ntensors ? m->ntensors : 1), sizeof *refs);
    int n = 0, rc = 0;
    if (!bufs || !refs) rc = co_err_set(CO_ENOMEM, "reading %s: out of memory", dir);
    for (int i = 0; i < m->ntensors && !rc; i++) {
        const ck_mtensor *t = &m->tensors[i];
        if (!(kinds & (1 << t->kind)) || t->dtype != CK_DT_F32) continue;
        int64_t ne = numel_of(t->ndim, t->shape);
        bufs[i] = malloc((size_t)(ne ? ne : 1) * sizeof(float));
        if (!bufs[i]) {
            rc = co_err_set(CO_ENOMEM, "reading %s: out of memory for %s", dir, t->name);
            break;
        }
        refs[n].name = t->name;
        refs[n].kind = t->kind;
        refs[n].ndim = t->ndim;
        memcpy(refs[n].shape, t->shape, sizeof refs[n].shape);
        refs[n].dst = bufs[i];
        n++;
    }
    if (!rc) rc = ck_load_tensors(dir, m, refs, n, bad);
    free(refs);
    if (rc) {
        if (bufs)
            for (int i = 0; i < m->ntensors; i++) free(bufs[i]);
        free(bufs);
        return rc;
    }
    *out = bufs;
    return 0;
}

void ck_free_all(const ck_manifest *m, float ***bufs) {
    if (!*bufs) return;
    for (int i = 0; i < m->ntensors; i++) free((*bufs)[i]);
    free(*bufs);
    *bufs = NULL;
}

int ck_candidates(const char *load_dir, int64_t want, int64_t **out, int *nout) {
    *out = NULL;
    *nout = 0;
    struct stat st;
    if (stat(load_dir, &st) || !S_ISDIR(st.st_mode))
        return co_err_set(CO_ENOENT, "--load %s: no such directory", load_dir);
    int64_t *its;
    int n;
    int rc = ck_list_iterations(load_dir, &its, &n);
    if (rc) return rc;
    int64_t first = want;
    if (first < 0) {
        int64_t tr;
        if (!ck_read_tracker(load_dir, &tr)) first = tr;
        else if (n) first = its[n - 1];
    }
    if (first < 0) {
        free(its);
        return co_err_set(CO_ENOENT, "%s: no checkpoint (no %s and no iter_* directory)", load_dir, CK_TRACKER_NAME);
    }
    int64_t *c = malloc((size_t)(n + 1) * sizeof *c);
    if (!c) {
        free(its);
        return co_err_set(CO_ENOMEM, "%s: out of memory", load_dir);
    }
    int k = 0;
    c[k++] = first;
    for (int i = n - 1; i >= 0; i--)
        if (its[i] < first) c[k++] = its[i];
    free(its);
    *out = c;
    *nout = k;
    return 0;
}
