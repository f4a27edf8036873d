/* load.c - checkpoint loading and verification: each shard file is read once, front to
 * back, hashed as it is read, its header checked against the manifest, and every piece
 * read into place in the global tensors whatever the layout on disk (see ckpt.h); the
 * files' chunks are shared among a few threads (see "reading shard files" below). */
#include "checkpoint/ckpt.h"

#include "checkpoint/dio.h"
#include "checkpoint/store.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
/* XXH3 compiled here, for this build's CPU (AVX-512 or AVX2 with -march=native), rather than
 * the shared library's baseline SSE2 build */
#define XXH_INLINE_ALL
#include <xxhash.h>

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t p = 1;
    for (int d = 0; d < ndim; d++) p *= shape[d];
    return p;
}

static ck_bad bad_of(int rc) {
    return rc == CO_EFORMAT ? CK_BAD_FORMAT : rc == CO_ENOENT ? CK_BAD_INCOMPLETE : CK_BAD_IO;
}

/* ---- where a piece on disk goes ----------------------------------------------------------
 * A reference (ckpt.h) asks for a region of a global tensor (the whole tensor without one),
 * row-major in its dst. A piece on disk is a rectangle or a flat range of the tensor. Each
 * piece is read straight into the one region it lies in when it is a contiguous run of
 * that region's buffer (K_DIRECT), else staged and the part of it inside each region that
 * wants it copied there (K_SCATTER). */

/* r's region in t's coordinates */
static void region_of(const ck_mtensor *t, const ck_tensor_ref *r, int64_t *off, int64_t *sh) {
    for (int d = 0; d < CK_MAX_DIMS; d++) {
        off[d] = r->region && d < t->ndim ? r->offsets[d] : 0;
        sh[d] = d >= t->ndim ? 1 : r->region ? r->rshape[d] : t->shape[d];
    }
}

/* row-major strides of a shape */
static void strides_of(int nd, const int64_t *shape, int64_t *st) {
    int64_t p = 1;
    for (int d = nd - 1; d >= 0; d--) {
        st[d] = p;
        p *= shape[d];
    }
}

/* Could piece s put elements into r's region? (Exact for rectangles; for a flat range,
 * whether it meets the region's span of flat indices.) */
static bool meets(const ck_mtensor *t, const ck_slice *s, const ck_tensor_ref *r) {
    int nd = t->ndim;
    int64_t off[CK_MAX_DIMS], sh[CK_MAX_DIMS];
    region_of(t, r, off, sh);
    for (int d = 0; d < nd; d++)
        if (sh[d] == 0) return false;
    if (s->flat) {
        int64_t gs[CK_MAX_DIMS], lo = 0, hi = 0;
        strides_of(nd, t->shape, gs);
        for (int d = 0; d < nd; d++) {
            lo += off[d] * gs[d];
            hi += (off[d] + sh[d] - 1) * gs[d];
        }
        return s->flat_begin <= hi && s->flat_end > lo;
    }
    for (int d = 0; d < nd; d++)
        if (s->offsets[d] >= off[d] + sh[d] || s->offsets[d] + s->shape[d] <= off[d]) return false;
    return true;
}

/* Is piece s one contiguous run of r's buffer? Then the index of its first element there. */
static bool direct_into(const ck_mtensor *t, const ck_slice *s, const ck_tensor_ref *r, int64_t *first) {
    int nd = t->ndim;
    int64_t off[CK_MAX_DIMS], sh[CK_MAX_DIMS], st[CK_MAX_DIMS];
    region_of(t, r, off, sh);
    if (s->flat) {
        for (int d = 0; d < nd; d++)
            if (off[d] || sh[d] != t->shape[d]) return false;
        *first = s->flat_begin;
        return true;
    }
    for (int d = 0; d < nd; d++)
        if (s->offsets[d] < off[d] || s->offsets[d] + s->shape[d] > off[d] + sh[d]) return false;
    /* row-major contiguity: size 1 in the dimensions before some j, whole in those after */
    int j = 0;
    while (j < nd - 1 && s->shape[j] == 1) j++;
    for (int d = j + 1; d < nd; d++)
        if (s->shape[d] != sh[d]) return false;
    strides_of(nd, sh, st);
    *first = 0;
    for (int d = 0; d < nd; d++) *first += (s->offsets[d] - off[d]) * st[d];
    return true;
}

/* Copies what of piece s (src: its elements, row-major over the piece) lies in r's region
 * into r->dst. */
static void scatter_into(const ck_mtensor *t, const ck_slice *s, const float *src, const ck_tensor_ref *r) {
    int nd = t->ndim;
    if (!r->dst) return;
    if (nd == 0) {
        r->dst[0] = src[0];
        return;
    }
    int64_t off[CK_MAX_DIMS], sh[CK_MAX_DIMS], rst[CK_MAX_DIMS], idx[CK_MAX_DIMS];
    region_of(t, r, off, sh);
    strides_of(nd, sh, rst);
    if (s->flat) {
        /* the region's runs along the last dimension, each a flat range of the tensor */
        int64_t gs[CK_MAX_DIMS];
        strides_of(nd, t->shape, gs);
        int64_t run = sh[nd - 1];
        for (int d = 0; d < nd; d++) idx[d] = 0;
        for (;;) {
            int64_t g = 0, l = 0;
            for (int d = 0; d < nd; d++) {
                g += (off[d] + idx[d]) * gs[d];
                l += idx[d] * rst[d];
            }
            int64_t a = g > s->flat_begin ? g : s->flat_begin, b = g + run < s->flat_end ? g + run : s->flat_end;
            if (a < b) memcpy(r->dst + l + (a - g), src + (a - s->flat_begin), (size_t)(b - a) * sizeof(float));
            int d = nd - 2;
            for (; d >= 0; d--) {
                if (++idx[d] < sh[d]) break;
                idx[d] = 0;
            }
            if (d < 0) break;
        }
        return;
    }
    int64_t lo[CK_MAX_DIMS], hi[CK_MAX_DIMS], sst[CK_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        lo[d] = s->offsets[d] > off[d] ? s->offsets[d] : off[d];
        hi[d] = s->offsets[d] + s->shape[d] < off[d] + sh[d] ? s->offsets[d] + s->shape[d] : off[d] + sh[d];
        if (lo[d] >= hi[d]) return;
        idx[d] = lo[d];
    }
    strides_of(nd, s->shape, sst);
    int64_t run = hi[nd - 1] - lo[nd - 1];
    for (;;) {
        int64_t from = 0, to = 0;
        for (int d = 0; d < nd; d++) {
            from += (idx[d] - s->offsets[d]) * sst[d];
            to += (idx[d] - off[d]) * rst[d];
        }
        memcpy(r->dst + to, src + from, (size_t)run * sizeof(float));
        int d = nd - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < hi[d]) break;
            idx[d] = lo[d];
        }
        if (d < 0) break;
    }
}

typedef struct piece {
    int tensor, slice;
} piece;

/* ---- reading shard files ----------------------------------------------------------------
 * A file is read with pread(2) in chunks of CHUNK bytes straight into the destination
 * tensors, and each chunk is hashed right after it lands, while it is still in this core's
 * cache: one pass, no intermediate buffer. Only pieces that are not one contiguous range of
 * their tensor (column slices) go through a staging buffer and are scattered, and bytes
 * with no destination (tensors not asked for, ck_verify) through a small scratch buffer.
 *
 * Several threads share the work (up to the online CPUs, at most MAX_THREADS): each file's
 * XXH3-128 is one sequential stream, so one thread (the file's hasher) hashes a file, in
 * order; but any thread may read chunks that land in a tensor ahead of the hasher (claimed
 * in file order, so the file is still read front to back), and the hasher then only hashes
 * them. A thread with no file of its own left helps the others that way. Nothing is used
 * before the whole file's hash matched the manifest: the caller gets an error otherwise.
 *
 * A warm file costs one kernel copy per byte (page cache to tensor) and one hash pass over
 * bytes still in cache; XXH3 is compiled inline for this CPU. A cold file (mostly not in
 * the page cache, by mincore) with a data section of two blocks or more is read past the
 * page cache: a ck_dr (dio.h) keeps large O_DIRECT reads in flight ahead of the chunks, and
 * each chunk is copied out of its block instead of read. Elsewhere (or where O_DIRECT is
 * refused) a read that would block (RWF_NOWAIT) asks the kernel for RA_WINDOW bytes ahead,
 * so the disk sees large requests however small the chunks are.
 *
 * Tuning and test knobs: COHORT_CKPT_LOAD_THREADS (1 = all on the calling thread),
 * COHORT_CKPT_LOAD_CHUNK (bytes; tiny values make the tests exercise the sharing). */

#define CHUNK_DEFAULT (256u << 10)
#define MAX_THREADS 4

enum { K_DIRECT, K_SCATTER, K_SKIP };         /* where a chunk's bytes go */
enum { S_NEW, S_READING, S_DONE, S_FAILED };  /* a chunk's state */

typedef struct chunk {
    uint64_t off;        /* in the file */
    size_t len;
    char *dst;           /* K_DIRECT: into the tensor */
    int kind, entry;     /* K_SCATTER/K_SKIP: the header entry */
    uint64_t in_entry;   /* offset inside the entry */
} chunk;

typedef struct lfile {
    int fi;
    char path[4400];
    int fd;
    uint64_t size;
    ck_st_header *h;
    piece *pc;
    chunk *c;
    unsigned char *st;
    int nc;
    int next_claim;      /* chunks before it are claimed (being read or read) */
    int next_hash;       /* chunks before it are hashed */
    uint64_t ra_end;     /* readahead asked up to here (atomic) */
    ck_dr *dr;           /* a cold file's data section: direct reads (dio.h) */
    uint64_t dr_start;
    bool ready;          /* prepared: data to read */
    bool owned, finished;
    XXH3_state_t *hash;
    int rc;              /* the first failure, with its sentence */
    ck_bad bad;
    char detail[1024];
} lfile;

typedef struct loader {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;
    lfile *f;
    int nf, next_file;
    size_t chunk;
    const ck_manifest *m;
    /* the references to fill (NULL: verify only); first[tensor] is its first reference,
     * next[ref] the next one of the same tensor, -1 ending each list */
    const ck_tensor_ref *refs;
    const int *first, *next;
} loader;

/* Records a failure of f from this thread's co_err_detail() (the first one wins). */
static void record(lfile *f, int rc, ck_bad kind) {
    if (f->dr) ck_dr_abort(f->dr); /* the bytes of an abandoned chunk would hold up the rest */
    if (f->rc) return;
    f->rc = rc;
    f->bad = kind;
    snprintf(f->detail, sizeof f->detail, "%s", co_err_detail());
}

/* Bytes read ahead of a reader that found its data not in the page cache (a cold load):
 * small reads would leave the disk with requests of read_ahead_kb each. */
#define RA_WINDOW (32u << 20)

static int nowait_ok = 1; /* preadv2(RWF_NOWAIT) works here (atomic) */

/* pread, but a read that would wait for the disk first asks for RA_WINDOW bytes ahead of
 * it: a warm file is read at no extra cost, a cold one in large requests. */
static ssize_t pread_ra(lfile *f, void *buf, size_t len, uint64_t off) {
#ifdef RWF_NOWAIT
    if (__atomic_load_n(&nowait_ok, __ATOMIC_RELAXED)) {
        struct iovec iov = {buf, len};
        ssize_t r = preadv2(f->fd, &iov, 1, (off_t)off, RWF_NOWAIT);
        if (r > 0) return r;
        if (r < 0 && errno != EAGAIN) {
            if (errno != EINTR) __atomic_store_n(&nowait_ok, 0, __ATOMIC_RELAXED); /* EOPNOTSUPP, EINVAL: not here */
        } else if (r < 0) {
            uint64_t end = __atomic_load_n(&f->ra_end, __ATOMIC_RELAXED);
            if (off + len + RA_WINDOW / 2 > end) {
                uint64_t from = end > off ? end : off;
                readahead(f->fd, (off64_t)from, RA_WINDOW);
                __atomic_store_n(&f->ra_end, from + RA_WINDOW, __ATOMIC_RELAXED);
            }
        }
        /* r == 0: the end of the file, or nothing cached; the plain read tells */
    }
#endif
    return pread(f->fd, buf, len, (off_t)off);
}

static int pread_full(lfile *f, void *buf, size_t len, uint64_t off) {
    if (f->dr && off >= f->dr_start) return ck_dr_copy(f->dr, buf, len, off);
    char *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread_ra(f, p + done, len - done, off + done);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            return co_err_set(fs_errno_code(e), "reading %s at byte %" PRIu64 ": %s", f->path, off + done, strerror(e));
        }
        if (r == 0) return co_err_set(CO_EFORMAT, "%s: truncated: ends at byte %" PRIu64, f->path, off + done);
        done += (size_t)r;
    }
    return 0;
}

static void lfile_free(lfile *f) {
    ck_dr_destroy(&f->dr);
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->hash) XXH3_freeState(f->hash);
    f->hash = NULL;
    ck_st_header_free(&f->h);
    free(f->pc);
    free(f->c);
    free(f->st);
    f->pc = NULL;
    f->c = NULL;
    f->st = NULL;
}

/* Opens file fi, checks its size, reads, hashes and checks its header against the manifest
 * and cuts its data into chunks. Returns 0, or the failure (recorded in f). */
static int prepare(loader *L, lfile *f, const char *dir, int fi) {
    const ck_manifest *m = L->m;
    const ck_mfile *mf = &m->files[fi];
    f->fi = fi;
    f->fd = -1;
    snprintf(f->path, sizeof f->path, "%s/%s", dir, mf->name);
    const char *path = f->path;
    int rc;
    /* (non-blocking: a FIFO or a device in the checkpoint's place must not block the open;
     * it is refused below as not a regular file) */
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f->fd < 0) {
        int e = errno;
        if (e == ENOENT) rc = co_err_set(CO_ENOENT, "%s: missing (the manifest lists it)", path);
        else rc = co_err_set(fs_errno_code(e), "opening %s: %s", path, strerror(e));
        record(f, rc, e == ENOENT ? CK_BAD_INCOMPLETE : CK_BAD_IO);
        return rc;
    }
    struct stat sb;
    if (fstat(f->fd, &sb)) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "stat of %s: %s", path, strerror(e));
        record(f, rc, CK_BAD_IO);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = co_err_set(CO_EIO, "%s: not a regular file (%s)", path, S_ISDIR(sb.st_mode) ? "a directory" : "a FIFO, "
                        "socket or device");
        record(f, rc, CK_BAD_IO);
        return rc;
    }
    f->size = (uint64_t)sb.st_size;
    if (f->size != mf->size) {
        rc = co_err_set(CO_EFORMAT, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (%s)", path, f->size, mf->size,
                        f->size < mf->size ? "truncated" : "grown");
        record(f, rc, CK_BAD_INCOMPLETE);
        return rc;
    }
    posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    f->hash = XXH3_createState();
    if (!f->hash) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
        record(f, rc, CK_BAD_IO);
        return rc;
    }
    XXH3_128bits_reset(f->hash);
    uint8_t lenbuf[8];
    uint64_t jl = 0;
    rc = pread_full(f, lenbuf, 8, 0);
    if (!rc) rc = ck_st_header_len(lenbuf, 8, f->size, &jl);
    if (rc) {
        rc = ck_err_wrap(CO_EFORMAT, "%s", path);
        record(f, rc, CK_BAD_FORMAT);
        return rc;
    }
    char *hbuf = malloc(8 + jl);
    if (!hbuf) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
        record(f, rc, CK_BAD_IO);
        return rc;
    }
    memcpy(hbuf, lenbuf, 8);
    rc = pread_full(f, hbuf + 8, jl, 8);
    if (!rc) rc = ck_st_parse(hbuf, 8 + jl, f->size, path, &f->h);
    if (!rc) XXH3_128bits_update(f->hash, hbuf, 8 + jl);
    free(hbuf);
    if (rc) {
        record(f, rc, CK_BAD_FORMAT);
        return rc;
    }
    ck_st_header *h = f->h;
    /* every header entry is a piece the manifest places in this file, and vice versa */
    f->pc = calloc((size_t)(h->n ? h->n : 1), sizeof *f->pc);
    if (!f->pc) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
        record(f, rc, CK_BAD_IO);
        return rc;
    }
    int listed = 0;
    for (int e = 0; e < h->n; e++) f->pc[e].tensor = -1;
    for (int i = 0; i < m->ntensors && !rc; i++) {
        const ck_mtensor *t = &m->tensors[i];
        for (int k = 0; k < t->nslices && !rc; k++) {
            const ck_slice *s = &t->slices[k];
            if (s->file != fi) continue;
            listed++;
            const ck_st_entry *en = ck_st_find(h, s->key);
            if (!en) {
                rc = co_err_set(CO_EFORMAT, "%s: lacks tensor %s (manifest: piece of %s)", path, s->key, t->name);
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
                rc = co_err_set(CO_EFORMAT, "%s: tensor %s has a dtype or shape other than the manifest's", path, s->key);
                break;
            }
            f->pc[en - h->e] = (piece){i, k};
        }
    }
    if (!rc && listed != h->n)
        rc = co_err_set(CO_EFORMAT, "%s: holds %d tensors, the manifest places %d in it", path, h->n, listed);
    if (rc) {
        record(f, rc, CK_BAD_FORMAT);
        return rc;
    }
    /* the data section, entry by entry (the parser checked they tile it), in chunks */
    size_t cs = L->chunk;
    size_t cap = 0;
    for (int e = 0; e < h->n; e++) cap += (size_t)((h->e[e].end - h->e[e].begin + cs - 1) / cs);
    f->c = calloc(cap ? cap : 1, sizeof *f->c);
    f->st = calloc(cap ? cap : 1, 1);
    if (!f->c || !f->st) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
        record(f, rc, CK_BAD_IO);
        return rc;
    }
    uint64_t pos = 8 + jl;
    for (int e = 0; e < h->n; e++) {
        const ck_st_entry *en = &h->e[e];
        const ck_mtensor *t = &m->tensors[f->pc[e].tensor];
        const ck_slice *s = &t->slices[f->pc[e].slice];
        int ntarget = 0;
        const ck_tensor_ref *only = NULL;
        for (int j = L->refs && t->dtype == CK_DT_F32 ? L->first[f->pc[e].tensor] : -1; j >= 0; j = L->next[j])
            if (L->refs[j].dst && meets(t, s, &L->refs[j])) {
                ntarget++;
                only = &L->refs[j];
            }
        int64_t first = 0;
        int kind = !ntarget ? K_SKIP : ntarget == 1 && direct_into(t, s, only, &first) ? K_DIRECT : K_SCATTER;
        float *d = kind == K_DIRECT ? only->dst : NULL;
        uint64_t nbytes = en->end - en->begin;
        for (uint64_t o = 0; o < nbytes; o += cs) {
            chunk *c = &f->c[f->nc++];
            c->off = pos + o;
            c->len = (size_t)(nbytes - o < cs ? nbytes - o : cs);
            c->kind = kind;
            c->entry = e;
            c->in_entry = o;
            c->dst = kind == K_DIRECT ? (char *)(d + first) + o : NULL;
        }
        pos += nbytes;
    }
    if (pos != f->size) {
        rc = co_err_set(CO_EFORMAT, "%s: %" PRIu64 " unread bytes", path, f->size - pos);
        record(f, rc, CK_BAD_FORMAT);
        return rc;
    }
    /* a cold file with a large data section: read it past the page cache, in large blocks
     * kept in flight ahead of the readers (falls back to pread where refused) */
    uint64_t data = 8 + jl;
    if (ck__dio_enabled() && f->size - data >= 2 * (uint64_t)CK_DIO_BLOCK && ck_dr_file_is_cold(f->fd, f->size) &&
        !ck_dr_new(&f->dr, path, data, f->size))
        f->dr_start = data;
    f->ready = true;
    return 0;
}

/* Reads chunk k of f into its tensor (a thread that is not f's hasher; lock not held). */
static void help_read(loader *L, lfile *f, int k) {
    chunk *c = &f->c[k];
    int rc = pread_full(f, c->dst, c->len, c->off);
    pthread_mutex_lock(&L->mu);
    if (rc) record(f, rc, rc == CO_EFORMAT ? CK_BAD_INCOMPLETE : CK_BAD_IO);
    f->st[k] = rc ? S_FAILED : S_DONE;
    if (L->waiting) pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

typedef struct worker {
    loader *L;
    char *stage;          /* a K_SCATTER entry's bytes */
    size_t stage_cap;
    char *scratch;        /* K_SKIP bytes */
} worker;

/* Hashes file f from next_hash to the end, reading what nobody has read yet (lock held on
 * entry and exit). */
static void hash_file(worker *w, lfile *f) {
    loader *L = w->L;
    const ck_manifest *m = L->m;
    while (f->next_hash < f->nc && !f->rc) {
        int k = f->next_hash;
        chunk *c = &f->c[k];
        if (f->st[k] == S_FAILED) break;
        if (f->st[k] == S_READING) {
            /* a helper is reading it: read ahead of it meanwhile, or wait */
            int j = f->next_claim;
            if (j < f->nc && f->c[j].kind == K_DIRECT) {
                f->next_claim++;
                f->st[j] = S_READING;
                pthread_mutex_unlock(&L->mu);
                help_read(L, f, j); /* takes the lock for the state change */
                pthread_mutex_lock(&L->mu);
            } else {
                L->waiting++;
                pthread_cond_wait(&L->cv, &L->mu);
                L->waiting--;
            }
            continue;
        }
        bool mine = f->st[k] == S_NEW; /* then k == next_claim */
        const ck_st_entry *en = &f->h->e[c->entry];
        uint64_t nbytes = en->end - en->begin;
        if (mine) {
            f->st[k] = S_READING;
            f->next_claim = k + 1;
            if (c->kind != K_DIRECT && L->waiting) pthread_cond_broadcast(&L->cv); /* helpers may go past it */
        }
        pthread_mutex_unlock(&L->mu);
        char *p = c->dst;
        int rc = 0;
        if (c->kind == K_SCATTER) {
            if (c->in_entry == 0 && nbytes > w->stage_cap) {
                free(w->stage);
                w->stage_cap = 0;
                w->stage = malloc((size_t)nbytes);
                if (w->stage) w->stage_cap = (size_t)nbytes;
                else rc = co_err_set(CO_ENOMEM, "%s: out of memory", f->path);
            }
            if (!rc) p = w->stage + c->in_entry;
        } else if (c->kind == K_SKIP) {
            p = w->scratch;
        }
        if (!rc && mine) rc = pread_full(f, p, c->len, c->off);
        if (!rc) {
            XXH3_128bits_update(f->hash, p, c->len);
            if (c->kind == K_SCATTER && c->in_entry + c->len == nbytes) {
                int ti = f->pc[c->entry].tensor;
                const ck_mtensor *t = &m->tensors[ti];
                for (int j = L->first[ti]; j >= 0; j = L->next[j])
                    scatter_into(t, &t->slices[f->pc[c->entry].slice], (const float *)w->stage, &L->refs[j]);
            }
        }
        pthread_mutex_lock(&L->mu);
        if (rc) {
            record(f, rc, rc == CO_EFORMAT ? CK_BAD_INCOMPLETE : CK_BAD_IO);
            f->st[k] = S_FAILED;
            break;
        }
        f->st[k] = S_DONE;
        f->next_hash++;
    }
    f->finished = true;
    f->next_claim = f->nc; /* nothing more for helpers */
    if (L->waiting) pthread_cond_broadcast(&L->cv);
}

/* A worker: hashes files nobody hashes yet; then reads ahead for the others. */
static void *work(void *arg) {
    worker *w = arg;
    loader *L = w->L;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (L->next_file < L->nf && !L->f[L->next_file].ready) L->next_file++;
        if (L->next_file < L->nf) {
            lfile *f = &L->f[L->next_file++];
            f->owned = true;
            hash_file(w, f);
            continue;
        }
        lfile *hf = NULL;
        bool pending = false;
        for (int i = 0; i < L->nf && !hf; i++) {
            lfile *f = &L->f[i];
            if (!f->ready || f->finished) continue;
            pending = true;
            if (f->next_claim < f->nc && f->c[f->next_claim].kind == K_DIRECT) hf = f;
        }
        if (hf) {
            int k = hf->next_claim++;
            hf->st[k] = S_READING;
            pthread_mutex_unlock(&L->mu);
            help_read(L, hf, k);
            pthread_mutex_lock(&L->mu);
            continue;
        }
        if (!pending) break;
        L->waiting++;
        pthread_cond_wait(&L->cv, &L->mu);
        L->waiting--;
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

static size_t env_size(const char *name, size_t dflt, size_t lo, size_t hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x < lo) return dflt;
    return x > hi ? hi : (size_t)x;
}

/* Reads and verifies files fis[0..nf) (placing pieces into the references' regions) on up
 * to MAX_THREADS threads. Each file's outcome is left in f[i] (rc, bad, detail). With
 * stop_at_first, files after the first one whose header fails are not read. */
static void load_files(const char *dir, const ck_manifest *m, const int *fis, int nf, const ck_tensor_ref *refs,
                       const int *first, const int *next, lfile *f, bool stop_at_first) {
    loader L = {.f = f, .nf = nf, .m = m, .refs = refs, .first = first, .next = next};
    L.chunk = env_size("COHORT_CKPT_LOAD_CHUNK", CHUNK_DEFAULT, 4, 1u << 30);
    L.chunk &= ~(size_t)3; /* whole floats: a scattered piece is read into place in order anyway */
    for (int i = 0; i < nf; i++) {
        if (prepare(&L, &f[i], dir, fis[i]) && stop_at_first) {
            L.nf = i + 1; /* file i is not ready: nobody reads it */
            break;
        }
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nthreads = env_size("COHORT_CKPT_LOAD_THREADS", ncpu > 1 ? (size_t)ncpu : 1, 1, 64);
    if (!getenv("COHORT_CKPT_LOAD_THREADS") && nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    int nchunks = 0;
    for (int i = 0; i < L.nf; i++)
        if (f[i].ready) nchunks += f[i].nc;
    if ((size_t)nchunks < 2 * nthreads) nthreads = 1; /* not worth a thread */
    pthread_mutex_init(&L.mu, NULL);
    pthread_cond_init(&L.cv, NULL);
    worker *w = calloc(nthreads, sizeof *w);
    pthread_t *th = calloc(nthreads, sizeof *th);
    size_t started = 0;
    bool ok = w && th;
    for (size_t t = 0; ok && t < nthreads; t++) {
        w[t].L = &L;
        w[t].scratch = malloc(L.chunk);
        if (!w[t].scratch) ok = false;
    }
    if (ok) {
        for (size_t t = 1; t < nthreads; t++) {
            if (pthread_create(&th[t], NULL, work, &w[t])) break;
            started = t;
        }
        work(&w[0]);
        for (size_t t = 1; t <= started; t++) pthread_join(th[t], NULL);
    } else {
        int rc = co_err_set(CO_ENOMEM, "loading %s: out of memory", dir);
        for (int i = 0; i < L.nf; i++)
            if (f[i].ready) record(&f[i], rc, CK_BAD_IO);
    }
    for (size_t t = 0; w && t < nthreads; t++) {
        free(w[t].scratch);
        free(w[t].stage);
    }
    free(w);
    free(th);
    pthread_cond_destroy(&L.cv);
    pthread_mutex_destroy(&L.mu);
    for (int i = 0; i < L.nf; i++) {
        lfile *fl = &f[i];
        if (fl->ready && !fl->rc) {
            uint8_t hash[16];
            XXH128_canonical_t cn;
            XXH128_canonicalFromHash(&cn, XXH3_128bits_digest(fl->hash));
            memcpy(hash, cn.digest, 16);
            const ck_mfile *mf = &m->files[fl->fi];
            if (memcmp(hash, mf->xxh128, 16)) {
                char a[33], b[33];
                ck_hex128(hash, a);
                ck_hex128(mf->xxh128, b);
                int rc = co_err_set(CO_EFORMAT, "%s: checksum mismatch: XXH3-128 %s, the manifest says %s (corrupt)",
                                    fl->path, a, b);
                record(fl, rc, CK_BAD_CHECKSUM);
            }
        }
        lfile_free(fl);
    }
}

static void shape_text(char *out, size_t n, int nd, const int64_t *shape) {
    out[0] = '\0';
    for (int d = 0; d < nd; d++) snprintf(out + strlen(out), n - strlen(out), "%s%" PRId64, d ? "," : "", shape[d]);
}

int ck_load_tensors(const char *dir, const ck_manifest *m, const ck_tensor_ref *refs, int n, ck_bad *bad) {
    if (bad) *bad = CK_OK;
    int nt = m->ntensors ? m->ntensors : 1;
    int *first = malloc((size_t)nt * sizeof *first), *next = calloc((size_t)(n ? n : 1), sizeof *next);
    bool *need = calloc((size_t)(m->nfiles ? m->nfiles : 1), sizeof *need);
    int *fis = calloc((size_t)(m->nfiles ? m->nfiles : 1), sizeof *fis);
    lfile *f = calloc((size_t)(m->nfiles ? m->nfiles : 1), sizeof *f);
    int rc = 0;
    if (!first || !next || !need || !fis || !f) rc = co_err_set(CO_ENOMEM, "loading %s: out of memory", dir);
    for (int i = 0; !rc && i < nt; i++) first[i] = -1;
    for (int i = n - 1; i >= 0 && !rc; i--) { /* (backwards: each list in the references' order) */
        const ck_tensor_ref *r = &refs[i];
        const ck_mtensor *t = ck_manifest_find(m, r->name);
        if (!t) {
            rc = co_err_set(CO_EINVAL, "%s: the checkpoint has no tensor %s (a different model? --use-checkpoint-args "
                                       "takes the checkpoint's model flags)", dir, r->name);
            break;
        }
        bool same = t->ndim == r->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == r->shape[d];
        if (!same) {
            char a[64], b[64];
            shape_text(a, sizeof a, t->ndim, t->shape);
            shape_text(b, sizeof b, r->ndim, r->shape);
            rc = co_err_set(CO_EINVAL, "%s: tensor %s is [%s] in the checkpoint but [%s] in the model "
                                       "(--use-checkpoint-args takes the checkpoint's model flags)", dir, t->name, a, b);
            break;
        }
        if (t->dtype != CK_DT_F32) {
            rc = co_err_set(CO_EUNSUPPORTED, "%s: tensor %s is %s; only F32 loads", dir, t->name, ck_dtype_name(t->dtype));
            break;
        }
        int64_t off[CK_MAX_DIMS], sh[CK_MAX_DIMS];
        region_of(t, r, off, sh);
        for (int d = 0; d < t->ndim && !rc; d++)
            if (off[d] < 0 || sh[d] < 0 || off[d] + sh[d] > t->shape[d]) {
                char a[64], b[64];
                shape_text(a, sizeof a, t->ndim, off);
                shape_text(b, sizeof b, t->ndim, sh);
                rc = co_err_set(CO_EINVAL, "%s: the region [%s] at [%s] lies outside tensor %s", dir, b, a, t->name);
            }
        int ti = (int)(t - m->tensors);
        next[i] = first[ti];
        first[ti] = i;
        for (int k = 0; k < t->nslices && !rc; k++)
            if (r->dst && meets(t, &t->slices[k], r)) need[t->slices[k].file] = true;
    }
    if (!rc) {
        int nf = 0;
        for (int fi = 0; fi < m->nfiles; fi++)
            if (need[fi]) fis[nf++] = fi;
        load_files(dir, m, fis, nf, refs, first, next, f, true);
        /* the first file in order that failed decides, as when they were read one by one */
        for (int i = 0; i < nf && !rc; i++)
            if (f[i].rc) {
                rc = co_err_set(f[i].rc, "%s", f[i].detail);
                if (bad) *bad = f[i].bad;
            }
    }
    if (rc && bad && !*bad) *bad = bad_of(rc);
    free(first);
    free(next);
    free(need);
    free(fis);
    free(f);
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
    /* the model description against the tensors' shapes: a manifest that parses may still
     * describe another model than the one it holds */
    char model_err[1024] = "";
    if (ck_model_check(m)) snprintf(model_err, sizeof model_err, "%s", co_err_detail());
    if (report) report(ctx, CK_MANIFEST_NAME, model_err[0] ? CK_BAD_FORMAT : CK_OK, model_err);
    int first = 0;
    int nf = m->nfiles;
    int *fis = calloc((size_t)(nf ? nf : 1), sizeof *fis);
    lfile *f = calloc((size_t)(nf ? nf : 1), sizeof *f);
    if (!fis || !f) {
        free(fis);
        free(f);
        ck_manifest_free(&m);
        *bad = CK_BAD_IO;
        return co_err_set(CO_ENOMEM, "verifying %s: out of memory", dir);
    }
    for (int fi = 0; fi < nf; fi++) fis[fi] = fi;
    load_files(dir, m, fis, nf, NULL, NULL, NULL, f, false);
    for (int fi = 0; fi < nf; fi++) {
        int r = f[fi].rc;
        ck_bad b = f[fi].bad;
        if (r && b == CK_OK) b = bad_of(r);
        if (r) co_err_set(r, "%s", f[fi].detail);
        if (report) report(ctx, m->files[fi].name, b, r ? f[fi].detail : "");
        /* the worst problem decides: malformed, then incomplete, then checksum, then I/O */
        if (r) {
            static const int rank[] = {[CK_OK] = 0, [CK_BAD_IO] = 1, [CK_BAD_CHECKSUM] = 2, [CK_BAD_INCOMPLETE] = 3,
                                       [CK_BAD_FORMAT] = 4};
            if (!first || rank[b] > rank[*bad]) *bad = b;
            if (!first) first = r;
        }
    }
    /* the detail names the first failing file, the one whose code is returned; a model
     * description that does not match (malformed) comes first */
    for (int fi = 0; fi < nf; fi++)
        if (f[fi].rc) {
            co_err_set(f[fi].rc, "%s", f[fi].detail);
            break;
        }
    if (model_err[0]) {
        *bad = CK_BAD_FORMAT;
        first = co_err_set(CO_EFORMAT, "%s/%s: %s", dir, CK_MANIFEST_NAME, model_err);
    }
    free(fis);
    free(f);
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
