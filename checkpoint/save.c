/* save.c - checkpoint saving: the write plan, shard files, the manifest, the whole commit,
 * one rank's part of a multi-rank save and the coordinator's completion of its manifest,
 * and the (optionally asynchronous) saver (see ckpt.h). */
#include "checkpoint/ckpt.h"
#include "checkpoint/dio.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t p = 1;
    for (int d = 0; d < ndim; d++) p *= shape[d];
    return p;
}

static void file_name(char *out, size_t n, int kind, int w, int writers) {
    const char *base = kind == CK_KIND_MODEL ? "model" : "optim";
    if (writers == 1) snprintf(out, n, "%s.safetensors", base);
    else snprintf(out, n, "%s-%05d-of-%05d.safetensors", base, w + 1, writers);
}

/* A reference's region: offsets and shape in the global tensor. */
static void region_of(const ck_tensor_ref *r, int64_t *off, int64_t *shape) {
    for (int d = 0; d < CK_MAX_DIMS; d++) {
        off[d] = r->region && d < r->ndim ? r->offsets[d] : 0;
        shape[d] = d >= r->ndim ? 0 : r->region ? r->rshape[d] : r->shape[d];
    }
}

static int add_slice(ck_mtensor *t, int *cap, const ck_slice *s) {
    if (t->nslices == *cap) {
        int nc = *cap ? 2 * *cap : 4;
        ck_slice *p = realloc(t->slices, (size_t)nc * sizeof *p);
        if (!p) return CO_ENOMEM;
        t->slices = p;
        *cap = nc;
    }
    t->slices[t->nslices++] = *s;
    return 0;
}

int ck_plan(const ck_meta *meta, const ck_tensor_ref *refs, int n, int writers, ck_manifest **out) {
    *out = NULL;
    int groups = meta->layout.groups > 0 ? meta->layout.groups : 1;
    if (writers < 1 || writers > 4096) return co_err_set(CO_EINVAL, "checkpoint plan: %d writers", writers);
    if (writers % groups)
        return co_err_set(CO_EINVAL, "checkpoint plan: %d writers do not split into %d groups", writers, groups);
    int per = writers / groups; /* writers per group */
    /* member[g * per + j]: the j-th writer of group g */
    int *member = malloc(sizeof *member * (size_t)writers), *filled = calloc((size_t)groups, sizeof *filled);
    if (!member || !filled) {
        free(member), free(filled);
        return co_err_set(CO_ENOMEM, "checkpoint plan: out of memory");
    }
    for (int w = 0; w < writers; w++) {
        int g = meta->writer_group ? meta->writer_group[w] : w % groups;
        if (g < 0 || g >= groups || filled[g] >= per) {
            free(member), free(filled);
            return co_err_set(CO_EINVAL, "checkpoint plan: writer %d in group %d of %d (%d writers each)", w, g, groups,
                              per);
        }
        member[g * per + filled[g]++] = w;
    }
    free(filled);
    ck_manifest *m = calloc(1, sizeof *m);
    if (!m) {
        free(member);
        return co_err_set(CO_ENOMEM, "checkpoint plan: out of memory");
    }
    m->version = CK_FORMAT_VERSION;
    m->iteration = meta->iteration;
    m->created_unix = (int64_t)time(NULL);
    m->progress = meta->progress;
    m->seed = meta->seed;
    m->layout = meta->layout;
    m->layout.writers = writers;
    m->layout.groups = groups;
    m->model = meta->model;
    m->optim = meta->optim;
    m->doc = json_object();
    if (meta->config) json_object_set_new(m->doc, "config", json_deep_copy(meta->config));
    if (meta->lr_scheduler) json_object_set_new(m->doc, "lr_scheduler", json_deep_copy(meta->lr_scheduler));
    json_object_set_new(m->doc, "rng", json_pack("{sIso}", "seed", (json_int_t)meta->seed, "generators",
                                                 meta->rng_generators ? json_deep_copy(meta->rng_generators) : json_array()));
    if (meta->rerun_state) json_object_set_new(m->doc, "rerun_state_machine", json_deep_copy(meta->rerun_state));

    int rc = 0;
    int *grp = calloc((size_t)(n ? n : 1), sizeof *grp), *tix = calloc((size_t)(n ? n : 1), sizeof *tix);
    int *cap = calloc((size_t)(n ? n : 1), sizeof *cap);
    int64_t *bytes = calloc((size_t)groups * 2, sizeof *bytes), *pos = calloc((size_t)groups * 2, sizeof *pos);
    m->tensors = calloc((size_t)(n ? n : 1), sizeof *m->tensors);
    if (!grp || !tix || !cap || !bytes || !pos || !m->tensors) goto nomem;
    /* the tensors, in the order of their first part, and each part's group */
    bool has[2] = {false, false};
    for (int i = 0; i < n && !rc; i++) {
        const ck_tensor_ref *r = &refs[i];
        if (strlen(r->name) + 8 >= CK_NAME_MAX || !ck_name_ok(r->name, false)) {
            rc = co_err_set(CO_EINVAL, "checkpoint plan: tensor name '%s' is not valid", r->name);
            break;
        }
        int ti = -1;
        for (int j = m->ntensors - 1; j >= 0 && ti < 0; j--)
            if (!strcmp(m->tensors[j].name, r->name)) ti = j;
        if (ti < 0) {
            ti = m->ntensors++;
            ck_mtensor *t = &m->tensors[ti];
            snprintf(t->name, sizeof t->name, "%s", r->name);
            t->kind = r->kind;
            t->dtype = CK_DT_F32;
            t->ndim = r->ndim;
            memcpy(t->shape, r->shape, sizeof t->shape);
        }
        const ck_mtensor *t = &m->tensors[ti];
        bool same = t->kind == r->kind && t->ndim == r->ndim;
        for (int d = 0; same && d < r->ndim; d++) same = t->shape[d] == r->shape[d];
        int64_t off[CK_MAX_DIMS], sh[CK_MAX_DIMS];
        region_of(r, off, sh);
        if (r->flat) same = same && r->flat_begin >= 0 && r->flat_end > r->flat_begin &&
                            r->flat_end <= numel_of(r->ndim, r->shape) && r->writer >= 0 && r->writer < writers;
        else
            for (int d = 0; same && d < r->ndim; d++) same = off[d] >= 0 && sh[d] >= 0 && off[d] + sh[d] <= r->shape[d];
        if (!same) {
            rc = co_err_set(CO_EINVAL, "checkpoint plan: the parts of %s differ in kind or shape, or one lies outside it",
                            r->name);
            break;
        }
        if (r->group != CK_ANY_GROUP && (r->group < 0 || r->group >= groups)) {
            rc = co_err_set(CO_EINVAL, "checkpoint plan: %s: group %d of %d", r->name, r->group, groups);
            break;
        }
        tix[i] = ti;
        int k = r->kind;
        has[k] = true;
        if (r->flat) continue; /* its writer is given: not part of the groups' shares */
        int64_t nb = numel_of(r->ndim, sh) * 4;
        int g = groups == 1 ? 0 : r->group;
        if (g == CK_ANY_GROUP) /* a tensor every group holds: the group with the fewest bytes */
            for (int h = g = 0; h < groups; h++)
                if (bytes[2 * h + k] < bytes[2 * g + k]) g = h;
        grp[i] = g;
        bytes[2 * g + k] += nb;
    }
    if (rc) goto fail;
    int nfiles = (has[0] ? writers : 0) + (has[1] ? writers : 0);
    m->files = calloc((size_t)(nfiles ? nfiles : 1), sizeof *m->files);
    if (!m->files) goto nomem;
    int first_file[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        if (!has[k]) continue;
        first_file[k] = m->nfiles;
        for (int w = 0; w < writers; w++) {
            ck_mfile *f = &m->files[m->nfiles++];
            file_name(f->name, sizeof f->name, k, w, writers);
            f->kind = k;
            f->writer = w;
            f->group = meta->writer_group ? meta->writer_group[w] : w % groups;
        }
    }
    /* the j-th writer of group g fills up to (j+1)/per of the group's bytes of the kind,
     * splitting a part's rows at boundaries */
    for (int i = 0; i < n; i++) {
        const ck_tensor_ref *r = &refs[i];
        ck_mtensor *t = &m->tensors[tix[i]];
        if (r->flat) { /* one 1-D piece, by the writer given */
            ck_slice s;
            memset(&s, 0, sizeof s);
            s.file = first_file[r->kind] + r->writer;
            s.flat = true;
            s.flat_begin = r->flat_begin;
            s.flat_end = r->flat_end;
            s.shape[0] = r->flat_end - r->flat_begin;
            s.ref = i;
            if (add_slice(t, &cap[tix[i]], &s)) goto nomem;
            continue;
        }
        int k = r->kind, g = grp[i];
        int64_t total = bytes[2 * g + k], *p = &pos[2 * g + k];
        int64_t off[CK_MAX_DIMS], sh[CK_MAX_DIMS];
        region_of(r, off, sh);
        int64_t rows = r->ndim ? sh[0] : 1;
        int64_t row_bytes = rows ? numel_of(r->ndim, sh) / rows * 4 : 0;
        int64_t row = 0;
        int pieces = 0;
        while (row < rows || (rows == 0 && pieces == 0)) {
            int j = (int)(total ? *p * per / total : 0);
            if (j >= per) j = per - 1;
            int64_t boundary = total * (j + 1) / per; /* end of writer j's share */
            int64_t take = rows - row;
            if (j < per - 1 && row_bytes > 0 && r->ndim > 0) {
                int64_t fit = (boundary - *p + row_bytes - 1) / row_bytes;
                if (fit < 1) fit = 1;
                if (fit < take) take = fit;
            }
            if (pieces == per - 1 && row + take < rows) take = rows - row; /* rounding: the rest to the last */
            ck_slice s;
            memset(&s, 0, sizeof s);
            s.file = first_file[k] + member[g * per + j];
            memcpy(s.offsets, off, sizeof s.offsets);
            memcpy(s.shape, sh, sizeof s.shape);
            if (r->ndim) {
                s.offsets[0] = off[0] + row;
                s.shape[0] = take;
            }
            s.ref = i;
            s.ref_row = row;
            if (add_slice(t, &cap[tix[i]], &s)) goto nomem;
            pieces++;
            *p += take * row_bytes;
            row += take;
            if (rows == 0 || r->ndim == 0) break;
        }
    }
    /* keys: the name for a tensor stored whole in one piece, name#k for its pieces (flat
     * pieces always: a tensor must not mix flat and rectangular slices) */
    for (int i = 0; i < m->ntensors && !rc; i++) {
        ck_mtensor *t = &m->tensors[i];
        for (int k = 1; k < t->nslices && !rc; k++)
            if (t->slices[k].flat != t->slices[0].flat)
                rc = co_err_set(CO_EINVAL, "checkpoint plan: %s mixes flat and rectangular parts", t->name);
        bool whole = t->nslices == 1 && !t->slices[0].flat;
        for (int d = 0; whole && d < t->ndim; d++) whole = t->slices[0].shape[d] == t->shape[d];
        for (int k = 0; k < t->nslices; k++) {
            char key[CK_NAME_MAX + 16]; /* fits: names are shorter than CK_NAME_MAX - 8 */
            if (whole) snprintf(key, sizeof key, "%s", t->name);
            else snprintf(key, sizeof key, "%s#%d", t->name, k);
            snprintf(t->slices[k].key, sizeof t->slices[k].key, "%.*s", CK_NAME_MAX - 1, key);
        }
    }
    if (rc) goto fail;
    free(grp), free(tix), free(cap), free(bytes), free(pos), free(member);
    *out = m;
    return 0;
nomem:
    rc = co_err_set(CO_ENOMEM, "checkpoint plan: out of memory");
fail:
    free(grp), free(tix), free(cap), free(bytes), free(pos), free(member);
    ck_manifest_free(&m);
    return rc;
}

int ck_write_shards(const char *dir, ck_manifest *plan, const ck_tensor_ref *refs, int n, int writer) {
    return ck_write_shards_ex(dir, plan, refs, n, writer, false);
}

int ck_write_shards_ex(const char *dir, ck_manifest *plan, const ck_tensor_ref *refs, int n, int writer, bool xxh64) {
    for (int fi = 0; fi < plan->nfiles; fi++) {
        ck_mfile *f = &plan->files[fi];
        if (f->writer != writer) continue;
        /* the file's pieces, in tensor order */
        int cnt = 0;
        for (int i = 0; i < plan->ntensors; i++)
            for (int k = 0; k < plan->tensors[i].nslices; k++) cnt += plan->tensors[i].slices[k].file == fi;
        const char **names = calloc((size_t)cnt + 1, sizeof *names);
        int *dts = calloc((size_t)cnt + 1, sizeof *dts), *nds = calloc((size_t)cnt + 1, sizeof *nds);
        int64_t(*shapes)[CK_MAX_DIMS] = calloc((size_t)cnt + 1, sizeof *shapes);
        const float **src = calloc((size_t)cnt + 1, sizeof *src);
        size_t *len = calloc((size_t)cnt + 1, sizeof *len);
        json_t *meta = json_pack("{ssss}", "format", "pt", "cohort.iteration", "");
        if (!names || !dts || !nds || !shapes || !src || !len || !meta) {
            free(names), free(dts), free(nds), free(shapes), free(src), free(len);
            if (meta) json_decref(meta);
            return co_err_set(CO_ENOMEM, "checkpoint shards: out of memory");
        }
        char itbuf[32];
        snprintf(itbuf, sizeof itbuf, "%" PRId64, plan->iteration);
        json_object_set_new(meta, "cohort.iteration", json_string(itbuf));
        int c = 0, rc = 0;
        for (int i = 0; i < plan->ntensors && !rc; i++) {
            const ck_mtensor *t = &plan->tensors[i];
            for (int k = 0; k < t->nslices && !rc; k++) {
                const ck_slice *s = &t->slices[k];
                if (s->file != fi) continue;
                const ck_tensor_ref *r = s->ref >= 0 && s->ref < n ? &refs[s->ref] : NULL;
                if (!r || strcmp(t->name, r->name)) {
                    rc = co_err_set(CO_EINVAL, "checkpoint shards: piece %s names tensor reference %d, which is not %s",
                                    s->key, s->ref, t->name);
                    break;
                }
                if (!r->data) {
                    rc = co_err_set(CO_EINVAL, "checkpoint shards: writer %d has no data for %s (group %d's part)",
                                    writer, s->key, r->group);
                    break;
                }
                /* the planner cuts a part's rows only, so every piece is contiguous in its source */
                /* (a flat piece is its part whole: one 1-D tensor) */
                int64_t rows = t->ndim ? s->shape[0] : 1;
                int64_t row_elems = t->ndim && rows ? numel_of(t->ndim, s->shape) / rows : 1;
                names[c] = s->key;
                dts[c] = CK_DT_F32;
                nds[c] = s->flat ? 1 : t->ndim;
                memcpy(shapes[c], s->shape, sizeof shapes[c]);
                src[c] = r->data + (t->ndim && !s->flat ? s->ref_row * row_elems : 0);
                len[c] = (size_t)(s->flat ? s->flat_end - s->flat_begin : numel_of(t->ndim, s->shape)) * 4;
                if (s->flat) {
                    char mk[CK_NAME_MAX + 16], mv[256];
                    snprintf(mk, sizeof mk, "cohort.slice.%s", s->key);
                    snprintf(mv, sizeof mv, "{\"tensor\":\"%s\",\"flat\":[%" PRId64 ",%" PRId64 "]}", t->name,
                             s->flat_begin, s->flat_end);
                    json_object_set_new(meta, mk, json_string(mv));
                } else if (strcmp(s->key, t->name)) {
                    char mk[CK_NAME_MAX + 16], mv[256];
                    snprintf(mk, sizeof mk, "cohort.slice.%s", s->key);
                    int o = snprintf(mv, sizeof mv, "{\"tensor\":\"%s\",\"offsets\":[", t->name);
                    for (int d = 0; d < t->ndim && o < (int)sizeof mv; d++)
                        o += snprintf(mv + o, sizeof mv - (size_t)o, "%s%" PRId64, d ? "," : "", s->offsets[d]);
                    if (o < (int)sizeof mv) snprintf(mv + o, sizeof mv - (size_t)o, "]}");
                    json_object_set_new(meta, mk, json_string(mv));
                }
                c++;
            }
        }
        char *hdr = NULL;
        size_t hlen = 0;
        if (!rc) rc = ck_st_build_header(names, dts, nds, (const int64_t(*)[CK_MAX_DIMS])shapes, c, meta, &hdr, &hlen);
        json_decref(meta);
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, f->name);
        ck_file cf;
        if (!rc) rc = ck_file_create(&cf, path);
        if (!rc && xxh64 && (rc = ck_file_want_xxh64(&cf))) ck_file_abort(&cf);
        else if (!rc) {
            rc = ck_file_write(&cf, hdr, hlen);
            for (int j = 0; j < c && !rc; j++) {
                rc = ck_file_write(&cf, src[j], len[j]);
                if (!rc && j == 0) ck_crash_point("shard"); /* a shard half written */
            }
            if (!rc) rc = ck_file_finish(&cf, f->xxh128);
            else ck_file_abort(&cf);
            f->size = cf.bytes;
            f->xxh64 = cf.xxh64;
        }
        free(hdr);
        free(names), free(dts), free(nds), free(shapes), free(src), free(len);
        if (rc) return rc;
    }
    return 0;
}

/* dir/name := text (created, written, fsync'ed). */
static int write_text(const char *dir, const char *name, const char *text, size_t len) {
    char path[4600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_file f;
    int rc = ck_file_create(&f, path);
    if (!rc) {
        rc = ck_file_write(&f, text, len);
        if (!rc) rc = ck_file_write(&f, "\n", 1);
        uint8_t h[16];
        if (!rc) rc = ck_file_finish(&f, h);
        else ck_file_abort(&f);
    }
    return rc;
}

static int write_manifest_as(const char *dir, const char *name, const ck_manifest *plan) {
    char *text;
    size_t len;
    int rc = ck_manifest_dump(plan, &text, &len);
    if (rc) return rc;
    rc = write_text(dir, name, text, len);
    free(text);
    return rc;
}

int ck_write_manifest(const char *dir, const ck_manifest *plan) { return write_manifest_as(dir, CK_MANIFEST_NAME, plan); }

int ck_save(const char *save_dir, const ck_meta *meta, const ck_tensor_ref *refs, int n, int writers, int keep) {
    char tmp[4400];
    int rc = ck_begin(save_dir, meta->iteration, tmp, sizeof tmp);
    if (rc) return rc;
    ck_manifest *plan = NULL;
    rc = ck_plan(meta, refs, n, writers, &plan);
    for (int w = 0; w < writers && !rc; w++) rc = ck_write_shards(tmp, plan, refs, n, w);
    if (!rc) ck_crash_point("shards");
    if (!rc) rc = ck_write_manifest(tmp, plan);
    if (!rc) ck_crash_point("manifest");
    ck_manifest_free(&plan);
    if (!rc) rc = ck_commit(save_dir, meta->iteration, tmp);
    if (rc) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", co_err_detail());
        ck_remove_dir(tmp);
        co_err_set(rc, "%s", detail);
        return rc;
    }
    if (keep > 0) {
        int64_t removed[64];
        int nr;
        rc = ck_prune(save_dir, keep, false, removed, 64, &nr);
        if (rc) return ck_err_wrap(rc, "retention (--most-recent-k %d) after saving", keep);
    }
    return 0;
}

/* ---- multi-rank save ------------------------------------------------------------------ */

/* writer-NNNNN.json: what writer w wrote (names, sizes, XXH3-128, XXH64). */
static int write_writer_record(const char *dir, const ck_manifest *plan, int w) {
    json_t *files = json_array();
    for (int i = 0; i < plan->nfiles; i++) {
        const ck_mfile *f = &plan->files[i];
        if (f->writer != w) continue;
        char h[33], h64[17];
        ck_hex128(f->xxh128, h);
        snprintf(h64, sizeof h64, "%016" PRIx64, f->xxh64);
        json_array_append_new(files, json_pack("{sssIssss}", "name", f->name, "size", (json_int_t)f->size, "xxh3_128", h,
                                               "xxh64", h64));
    }
    json_t *rec = json_pack("{sIsiso}", "iteration", (json_int_t)plan->iteration, "writer", w, "files", files);
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    if (rec) json_decref(rec);
    if (!text) return co_err_set(CO_ENOMEM, "checkpoint writer record: out of memory");
    char name[64];
    snprintf(name, sizeof name, CK_WRITER_FMT, w);
    int rc = write_text(dir, name, text, strlen(text));
    free(text);
    return rc;
}

int ck_save_part(const char *save_dir, const ck_meta *meta, const ck_tensor_ref *refs, int n, int writers, int writer,
                 const ck_coord *co) {
    char tmp[4400];
    ck_manifest *plan = NULL;
    int rc = ck_begin_shared(save_dir, meta->iteration, co->token, tmp, sizeof tmp);
    if (!rc) rc = ck_plan(meta, refs, n, writers, &plan);
    if (!rc) rc = ck_write_shards_ex(tmp, plan, refs, n, writer, true);
    if (!rc) ck_crash_point("shards");
    if (!rc && writer == 0) rc = write_manifest_as(tmp, CK_PLAN_NAME, plan);
    if (!rc) rc = write_writer_record(tmp, plan, writer);
    if (!rc) ck_crash_point("written");
    char detail[1200] = "";
    if (rc) snprintf(detail, sizeof detail, "%s", co_err_detail());
    /* acknowledge: this rank's files, or the failure (the coordinator removes the directory) */
    ck_mfile *mine = calloc((size_t)(plan && plan->nfiles ? plan->nfiles : 1), sizeof *mine);
    int nmine = 0;
    for (int i = 0; !rc && plan && i < plan->nfiles; i++)
        if (plan->files[i].writer == writer) mine[nmine++] = plan->files[i];
    int arc = mine ? co->ack(co->ctx, meta->iteration, rc, rc ? detail : NULL, mine, nmine)
                   : co_err_set(CO_ENOMEM, "out of memory");
    free(mine);
    ck_manifest_free(&plan);
    if (rc) return co_err_set(rc, "%s", detail);
    if (arc) return ck_err_wrap(arc, "acknowledging checkpoint iteration %" PRId64 " to the supervisor", meta->iteration);
    ck_crash_point("acked");
    rc = co->wait(co->ctx, meta->iteration, co->timeout_ms > 0 ? co->timeout_ms : CK_COORD_TIMEOUT_MS);
    if (rc) return ck_err_wrap(rc, "checkpoint at iteration %" PRId64 " not committed", meta->iteration);
    return 0;
}

static int read_json(const char *dir, const char *name, json_t **out) {
    char path[4600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *data;
    size_t len;
    int rc = fs_read_all(path, &data, &len);
    if (rc) return ck_err_wrap(rc, "%s", path);
    json_error_t je;
    *out = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
    free(data);
    if (!*out || !json_is_object(*out)) {
        if (*out) json_decref(*out);
        return co_err_set(CO_EFORMAT, "%s: not a JSON object (%s)", path, je.text);
    }
    return 0;
}

int ck_complete_shared(const char *tmp, int64_t iteration, int writers, const ck_mfile *acked, int nacked) {
    return ck_complete_shared_ex(tmp, iteration, writers, acked, nacked, NULL);
}

int ck_complete_shared_ex(const char *tmp, int64_t iteration, int writers, const ck_mfile *acked, int nacked,
                          const json_t *rerun_state) {
    char path[4600];
    snprintf(path, sizeof path, "%s/%s", tmp, CK_PLAN_NAME);
    char *data;
    size_t len;
    int rc = fs_read_all(path, &data, &len);
    if (rc) return ck_err_wrap(rc, "reading the plan %s (rank 0 writes it)", path);
    ck_manifest *plan = NULL;
    rc = ck_manifest_parse(data, len, path, &plan);
    free(data);
    if (rc) return rc;
    bool *seen = calloc((size_t)(plan->nfiles ? plan->nfiles : 1), sizeof *seen);
    if (!seen) rc = co_err_set(CO_ENOMEM, "out of memory");
    if (!rc && (plan->iteration != iteration || plan->layout.writers != writers))
        rc = co_err_set(CO_EPROTOCOL, "%s: iteration %" PRId64 " with %d writers, expected %" PRId64 " with %d", path,
                        plan->iteration, plan->layout.writers, iteration, writers);
    /* the writers' records give each file's size and hashes */
    for (int w = 0; w < writers && !rc; w++) {
        char name[64];
        snprintf(name, sizeof name, CK_WRITER_FMT, w);
        json_t *rec = NULL;
        rc = read_json(tmp, name, &rec);
        if (rc) break;
        json_t *files = json_object_get(rec, "files"), *jw = json_object_get(rec, "writer"), *ji = json_object_get(rec, "iteration");
        if (!json_is_array(files) || !json_is_integer(jw) || json_integer_value(jw) != w || !json_is_integer(ji) ||
            json_integer_value(ji) != iteration)
            rc = co_err_set(CO_EFORMAT, "%s/%s: not writer %d's record of iteration %" PRId64, tmp, name, w, iteration);
        size_t k;
        json_t *e;
        json_array_foreach(files, k, e) {
            if (rc) break;
            const char *fn = json_string_value(json_object_get(e, "name"));
            const char *h = json_string_value(json_object_get(e, "xxh3_128"));
            const char *h64 = json_string_value(json_object_get(e, "xxh64"));
            json_t *sz = json_object_get(e, "size");
            int fi = -1;
            for (int i = 0; fn && i < plan->nfiles; i++)
                if (!strcmp(plan->files[i].name, fn)) fi = i;
            ck_mfile *f = fi >= 0 ? &plan->files[fi] : NULL;
            char *end = NULL;
            uint64_t v64 = h64 ? strtoull(h64, &end, 16) : 0;
            if (!f || f->writer != w || seen[fi] || !h || ck_unhex128(h, f->xxh128) || !h64 || strlen(h64) != 16 ||
                *end || !json_is_integer(sz) || json_integer_value(sz) < 0) {
                rc = co_err_set(CO_EFORMAT, "%s/%s: file entry %zu (%s) is not one of writer %d's files in the plan", tmp,
                                name, k, fn ? fn : "?", w);
                break;
            }
            seen[fi] = true;
            f->size = (uint64_t)json_integer_value(sz);
            f->xxh64 = v64;
        }
        json_decref(rec);
    }
    for (int i = 0; i < plan->nfiles && !rc; i++)
        if (!seen[i]) rc = co_err_set(CO_EFORMAT, "%s: writer %d did not record %s", tmp, plan->files[i].writer, plan->files[i].name);
    /* and agree with what the ranks acknowledged */
    if (!rc && nacked != plan->nfiles)
        rc = co_err_set(CO_EPROTOCOL, "%s: the ranks acknowledged %d files, the plan has %d", tmp, nacked, plan->nfiles);
    for (int a = 0; a < nacked && !rc; a++) {
        const ck_mfile *f = NULL;
        for (int i = 0; i < plan->nfiles; i++)
            if (!strcmp(plan->files[i].name, acked[a].name)) f = &plan->files[i];
        if (!f || f->writer != acked[a].writer || f->size != acked[a].size || f->xxh64 != acked[a].xxh64)
            rc = co_err_set(CO_EPROTOCOL, "%s: rank %d acknowledged %s (%" PRIu64 " bytes) but %s", tmp, acked[a].writer,
                            acked[a].name, acked[a].size,
                            !f ? "the plan does not list it" : f->writer != acked[a].writer ? "the plan gives it to another rank"
                                                                                             : "its writer record differs");
    }
    free(seen);
    if (!rc && rerun_state && plan->doc)
        json_object_set_new(plan->doc, "rerun_state_machine", json_deep_copy(rerun_state));
    if (!rc) rc = ck_write_manifest(tmp, plan);
    ck_manifest_free(&plan);
    if (rc) return rc;
    /* the plan and the records are not part of the checkpoint */
    unlink(path);
    for (int w = 0; w < writers; w++) {
        char name[64], p2[4600];
        snprintf(name, sizeof name, CK_WRITER_FMT, w);
        snprintf(p2, sizeof p2, "%s/%s", tmp, name);
        unlink(p2);
    }
    return 0;
}

/* ---- saver ---------------------------------------------------------------------------- */

typedef struct snap_tensor {
    char name[CK_NAME_MAX];
    ck_tensor_ref ref;  /* name and data are set when the snapshot is saved */
    bool held;          /* this process holds its data: copied into the arena */
    size_t offset;      /* floats into the arena */
} snap_tensor;

/* Floats of a reference's data: its region's (the whole tensor's without one). */
static int64_t ref_numel(const ck_tensor_ref *r) {
    return r->flat ? r->flat_end - r->flat_begin : numel_of(r->ndim, r->region ? r->rshape : r->shape);
}

struct ck_saver {
    ck_saver_opts o;
    ck_coord coord;          /* with o.coord */
    char save_dir[4096];
    /* background job */
    pthread_t thread;
    bool running;
    int result;
    char detail[1024];
    /* snapshot */
    float *arena;
    size_t arena_cap;
    snap_tensor *st;
    int nst, st_cap;
    ck_meta meta;
    double last_stall;
    int64_t last_it;
    double job_start;
    uint64_t dio_mark;       /* ck_dio_bytes_written() when this save started */
    /* deferred snapshot: the background thread copies from the live tensors (src[i]) first;
     * the trainer waits for `copied` before its next optimizer step changes them */
    const float **src;
    int src_cap;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* CLOCK_MONOTONIC: copied or finished changed */
    bool copied;
    /* deadlines (see ck_saver_wait_snapshot, ck_saver_wait) */
    size_t snap_bytes;       /* of the background save under way */
    bool finished;           /* bg_main is done with s */
    bool snap_late;          /* the copy outlived its deadline: the snapshot is not saved */
    bool abandoned;          /* a wait gave up on the thread: s is never freed */
};

/* How long a background save may take: the copy out of the live tensors at 100 MB/s (a
 * memcpy runs at gigabytes per second) and 30 s; the whole save the I/O stall limit
 * (COHORT_CKPT_IO_TIMEOUT, dio.c) plus the bytes at 10 MB/s (a very slow disk; each of its
 * I/O waits is bounded by the stall limit on its own) and 60 s for the supervisor's commit
 * (whose wait has its own limit and is aborted by an Abort, supervisor/link.c). */
static double snapshot_limit_s(size_t bytes) { return 30.0 + (double)bytes / 100e6; }
static double save_limit_s(size_t bytes) { return ck__io_timeout_s() + 60.0 + (double)bytes / 10e6; }


int ck_saver_new(ck_saver **out, const ck_saver_opts *o) {
    *out = NULL;
    ck_saver *s = calloc(1, sizeof *s);
    if (!s) return co_err_set(CO_ENOMEM, "checkpoint saver: out of memory");
    s->o = *o;
    snprintf(s->save_dir, sizeof s->save_dir, "%s", o->save_dir);
    s->o.save_dir = s->save_dir;
    if (s->o.writers < 1) s->o.writers = 1;
    if (o->coord) {
        s->coord = *o->coord;
        s->o.coord = &s->coord;
    }
    s->last_it = -1;
    s->copied = true;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = s;
    return 0;
}

static void meta_release(ck_meta *m) {
    if (m->config) json_decref(m->config);
    if (m->lr_scheduler) json_decref(m->lr_scheduler);
    if (m->rng_generators) json_decref(m->rng_generators);
    if (m->rerun_state) json_decref(m->rerun_state);
    m->config = m->lr_scheduler = m->rng_generators = m->rerun_state = NULL;
}

void ck_saver_destroy(ck_saver **ps) {
    ck_saver *s = *ps;
    if (!s) return;
    ck_saver_wait(s);
    if (s->abandoned) { /* its thread may still use it: leaked on purpose (the job is failing) */
        *ps = NULL;
        return;
    }
    meta_release(&s->meta);
    free(s->arena);
    free(s->st);
    free(s->src);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    *ps = NULL;
}

int ck_saver_reserve(ck_saver *s, size_t nfloats) {
    if (nfloats <= s->arena_cap) return 0;
    float *a = realloc(s->arena, nfloats * sizeof(float));
    if (!a) return co_err_set(CO_ENOMEM, "checkpoint snapshot: cannot allocate %zu MB of host memory", nfloats * 4 >> 20);
    /* touch every page now rather than during the first snapshot */
    memset(a + s->arena_cap, 0, (nfloats - s->arena_cap) * sizeof(float));
    s->arena = a;
    s->arena_cap = nfloats;
    return 0;
}

static void log_saved(ck_saver *s, int64_t it, double secs, int rc) {
    if (!s->o.log) return;
    if (rc) fprintf(s->o.log, "cohort: saving checkpoint at iteration %" PRId64 " to %s FAILED: %s\n", it, s->save_dir,
                    co_err_detail());
    else
        fprintf(s->o.log, "  successfully saved checkpoint from iteration %8" PRId64 " to %s (%.2f s%s)\n", it, s->save_dir,
                secs, ck_dio_bytes_written() > s->dio_mark ? ", direct I/O" : "");
    fflush(s->o.log);
}

static int save_snapshot(ck_saver *s) {
    ck_tensor_ref *refs = calloc((size_t)(s->nst ? s->nst : 1), sizeof *refs);
    if (!refs) return co_err_set(CO_ENOMEM, "checkpoint save: out of memory");
    for (int i = 0; i < s->nst; i++) {
        refs[i] = s->st[i].ref;
        refs[i].name = s->st[i].name;
        refs[i].data = s->st[i].held ? s->arena + s->st[i].offset : NULL;
        refs[i].dst = NULL;
    }
    int rc = s->o.coord ? ck_save_part(s->save_dir, &s->meta, refs, s->nst, s->o.writers, s->o.writer, s->o.coord)
                        : ck_save(s->save_dir, &s->meta, refs, s->nst, s->o.writers, s->o.keep);
    free(refs);
    return rc;
}

static void *bg_main(void *arg) {
    ck_saver *s = arg;
    /* first the copy out of the live tensors, then the trainer may change them again */
    for (int i = 0; i < s->nst; i++)
        if (s->st[i].held) memcpy(s->arena + s->st[i].offset, s->src[i], (size_t)ref_numel(&s->st[i].ref) * sizeof(float));
    pthread_mutex_lock(&s->mu);
    s->copied = true;
    bool late = s->snap_late;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    /* a copy the trainer stopped waiting for may be torn: never saved */
    int rc = late ? co_err_set(CO_ETIMEOUT, "checkpoint snapshot of iteration %" PRId64 ": copying %zu MB out of the "
                                            "tensors took longer than %.0f s; not saved",
                               s->meta.iteration, s->snap_bytes >> 20, snapshot_limit_s(s->snap_bytes))
                  : save_snapshot(s);
    pthread_mutex_lock(&s->mu);
    s->result = rc;
    snprintf(s->detail, sizeof s->detail, "%s", rc ? co_err_detail() : "");
    pthread_mutex_unlock(&s->mu);
    log_saved(s, s->meta.iteration, now_s() - s->job_start, rc);
    pthread_mutex_lock(&s->mu);
    s->finished = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void ck_saver_set_writers(ck_saver *s, int writers, int writer) {
    if (!s) return;
    ck_saver_wait(s); /* the background job reads them */
    s->o.writers = writers > 0 ? writers : 1;
    s->o.writer = writer;
}

double ck_saver_wait_snapshot(ck_saver *s) {
    if (!s->running) return 0.0;
    double t0 = now_s();
    struct timespec dl = ck__mono_after(snapshot_limit_s(s->snap_bytes));
    pthread_mutex_lock(&s->mu);
    while (!s->copied)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT && !s->copied) {
            /* the trainer goes on (its tensors change); the save fails, reported by ck_saver_wait */
            s->snap_late = true;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return now_s() - t0;
}

void ck_saver_set_writer(ck_saver *s, int writer) {
    if (!s) return;
    ck_saver_wait(s); /* the background job reads it */
    s->o.writer = writer;
}

int ck_saver_wait(ck_saver *s) {
    if (!s->running) return 0;
    double limit = save_limit_s(s->snap_bytes);
    struct timespec dl = ck__mono_after(limit);
    pthread_mutex_lock(&s->mu);
    while (!s->finished && pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT) {}
    bool done = s->finished;
    if (!done) {
        s->snap_late = true; /* (if it had not even copied yet) */
        s->abandoned = true;
    }
    pthread_mutex_unlock(&s->mu);
    if (!done) {
        pthread_detach(s->thread);
        s->running = false;
        return co_err_set(CO_ETIMEOUT,
                          "checkpoint save of iteration %" PRId64 " to %s: the background save did not finish within "
                          "%.0f s (%zu MB; the disk or file system stopped answering?)",
                          s->meta.iteration, s->save_dir, limit, s->snap_bytes >> 20);
    }
    pthread_join(s->thread, NULL);
    s->running = false;
    int rc = s->result;
    s->result = 0;
    if (rc) co_err_set(rc, "%s", s->detail);
    return rc;
}

double ck_saver_last_stall(const ck_saver *s) { return s->last_stall; }
int64_t ck_saver_last_iteration(const ck_saver *s) { return s->last_it; }

int ck_saver_save(ck_saver *s, const ck_meta *meta, const ck_tensor_ref *refs, int n) {
    double t0 = now_s();
    if (s->abandoned)
        return co_err_set(CO_ETIMEOUT, "checkpoint save of iteration %" PRId64 ": an earlier background save to %s "
                                       "never finished", meta->iteration, s->save_dir);
    /* a background save still running is waited for (its failure is reported now) */
    int rc = ck_saver_wait(s);
    if (rc) {
        s->last_stall = now_s() - t0;
        return rc;
    }
    if (s->o.log) {
        fprintf(s->o.log, "cohort: saving checkpoint at iteration %8" PRId64 " to %s%s\n", meta->iteration, s->save_dir,
                s->o.async ? " (async)" : "");
        fflush(s->o.log);
    }
    s->dio_mark = ck_dio_bytes_written();
    if (!s->o.async) {
        rc = s->o.coord ? ck_save_part(s->save_dir, meta, refs, n, s->o.writers, s->o.writer, s->o.coord)
                        : ck_save(s->save_dir, meta, refs, n, s->o.writers, s->o.keep);
        s->last_stall = now_s() - t0;
        if (!rc) s->last_it = meta->iteration;
        log_saved(s, meta->iteration, s->last_stall, rc);
        return rc;
    }
    /* snapshot: one arena, the parts this process holds at their running offsets */
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (refs[i].data) total += (size_t)ref_numel(&refs[i]);
    rc = ck_saver_reserve(s, total);
    if (rc) return rc;
    if (n > s->st_cap) {
        snap_tensor *p = realloc(s->st, (size_t)n * sizeof *p);
        if (!p) return co_err_set(CO_ENOMEM, "checkpoint snapshot: out of memory");
        s->st = p;
        s->st_cap = n;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        snap_tensor *t = &s->st[i];
        snprintf(t->name, sizeof t->name, "%s", refs[i].name);
        t->ref = refs[i];
        t->ref.name = NULL;
        t->held = refs[i].data != NULL;
        t->offset = off;
        if (t->held) off += (size_t)ref_numel(&refs[i]);
    }
    s->nst = n;
    /* the copy itself runs on the background thread (bg_main), overlapping the next
     * forward and backward; ck_saver_wait_snapshot holds the optimizer step until it is done */
    if (n > s->src_cap) {
        const float **p = realloc(s->src, (size_t)n * sizeof *p);
        if (!p) return co_err_set(CO_ENOMEM, "checkpoint snapshot: out of memory");
        s->src = p;
        s->src_cap = n;
    }
    for (int i = 0; i < n; i++) s->src[i] = refs[i].data;
    s->copied = false;
    s->finished = false;
    s->snap_late = false;
    s->snap_bytes = total * sizeof(float);
    meta_release(&s->meta);
    s->meta = *meta;
    s->meta.config = meta->config ? json_deep_copy(meta->config) : NULL;
    s->meta.lr_scheduler = meta->lr_scheduler ? json_deep_copy(meta->lr_scheduler) : NULL;
    s->meta.rng_generators = meta->rng_generators ? json_deep_copy(meta->rng_generators) : NULL;
    s->meta.rerun_state = meta->rerun_state ? json_deep_copy(meta->rerun_state) : NULL;
    s->job_start = now_s();
    if (pthread_create(&s->thread, NULL, bg_main, s)) {
        s->copied = true;
        s->last_stall = now_s() - t0;
        return co_err_set(CO_ENOMEM, "checkpoint save: cannot start the background thread");
    }
    s->running = true;
    s->last_it = meta->iteration;
    s->last_stall = now_s() - t0;
    return 0;
}
