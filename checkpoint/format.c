/* format.c - safetensors headers and the checkpoint manifest: build and parse (see
 * format.h). Every parser treats its input as hostile: sizes are checked before use,
 * arithmetic cannot overflow, and errors say which file and which field. */
#include "checkpoint/format.h"

#include "common/error.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NUMEL (INT64_C(1) << 48)   /* elements of one tensor */
#define MAX_SLICES_PER_TENSOR 1024
#define MAX_TENSORS (1 << 20)
#define MAX_FILES (1 << 16)

static const struct {
    const char *name;
    size_t size;
} dtypes[CK_DT_COUNT] = {
    [CK_DT_F64] = {"F64", 8}, [CK_DT_F32] = {"F32", 4}, [CK_DT_F16] = {"F16", 2}, [CK_DT_BF16] = {"BF16", 2},
    [CK_DT_I64] = {"I64", 8}, [CK_DT_I32] = {"I32", 4}, [CK_DT_I16] = {"I16", 2}, [CK_DT_I8] = {"I8", 1},
    [CK_DT_U8] = {"U8", 1},   [CK_DT_BOOL] = {"BOOL", 1},
};

const char *ck_dtype_name(int dt) { return dt >= 0 && dt < CK_DT_COUNT ? dtypes[dt].name : "?"; }
size_t ck_dtype_size(int dt) { return dt >= 0 && dt < CK_DT_COUNT ? dtypes[dt].size : 0; }
int ck_dtype_parse(const char *s) {
    for (int i = 0; i < CK_DT_COUNT; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

bool ck_name_ok(const char *s, bool file) {
    size_t n = strlen(s);
    if (n == 0 || n >= CK_NAME_MAX || !strcmp(s, ".") || !strcmp(s, "..")) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (isalnum(ch) || ch == '.' || ch == '_' || ch == '-') continue;
        if (!file && (ch == '#' || ch == ':')) continue;
        return false;
    }
    return true;
}

void ck_hex128(const uint8_t h[16], char out[33]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[h[i] >> 4];
        out[2 * i + 1] = hx[h[i] & 15];
    }
    out[32] = '\0';
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int ck_unhex128(const char *s, uint8_t h[16]) {
    if (strlen(s) != 32) return -1;
    for (int i = 0; i < 16; i++) {
        int a = hexval(s[2 * i]), b = hexval(s[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        h[i] = (uint8_t)(a << 4 | b);
    }
    return 0;
}

/* Reads a JSON integer array of 0..CK_MAX_DIMS non-negative dims with a bounded product. */
static int parse_dims(json_t *a, int64_t *dims, int *ndim, int64_t *numel, const char *what, const char *field) {
    if (!json_is_array(a)) return co_err_set(CO_EFORMAT, "%s: %s is not an array", what, field);
    size_t n = json_array_size(a);
    if (n > CK_MAX_DIMS) return co_err_set(CO_EFORMAT, "%s: %s has %zu dimensions (at most %d)", what, field, n, CK_MAX_DIMS);
    int64_t p = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > MAX_NUMEL)
            return co_err_set(CO_EFORMAT, "%s: %s[%zu] is not a dimension", what, field, i);
        dims[i] = json_integer_value(v);
        if (dims[i] && p > MAX_NUMEL / dims[i])
            return co_err_set(CO_EFORMAT, "%s: %s has too many elements", what, field);
        p *= dims[i];
    }
    *ndim = (int)n;
    if (numel) *numel = p;
    return 0;
}

/* ---- safetensors --------------------------------------------------------------------- */

int ck_st_header_len(const void *buf, size_t len, uint64_t file_size, uint64_t *json_len) {
    if (len < 8 || file_size < 8) return co_err_set(CO_EFORMAT, "shorter than the 8-byte header length");
    const uint8_t *b = buf;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    if (n < 2 || n > CK_ST_MAX_HEADER)
        return co_err_set(CO_EFORMAT, "header length %" PRIu64 " out of range (2..%u)", n, CK_ST_MAX_HEADER);
    if (n > file_size - 8)
        return co_err_set(CO_EFORMAT, "header length %" PRIu64 " beyond the end of the %" PRIu64 "-byte file", n,
                          file_size);
    *json_len = n;
    return 0;
}

static int cmp_entry(const void *a, const void *b) {
    const ck_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

void ck_st_header_free(ck_st_header **ph) {
    ck_st_header *h = *ph;
    if (!h) return;
    free(h->e);
    if (h->metadata) json_decref(h->metadata);
    free(h);
    *ph = NULL;
}

int ck_st_parse(const void *buf, size_t len, uint64_t file_size, const char *what, ck_st_header **out) {
    *out = NULL;
    uint64_t jl;
    int rc = ck_st_header_len(buf, len, file_size, &jl);
    if (rc) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", co_err_detail()); /* (not both source and destination) */
        return co_err_set(rc, "%s: not a safetensors file: %s", what, detail);
    }
    if (len - 8 < jl) return co_err_set(CO_EFORMAT, "%s: header truncated", what);
    const char *js = (const char *)buf + 8;
    if (js[0] != '{') return co_err_set(CO_EFORMAT, "%s: safetensors header does not start with '{'", what);
    json_error_t je;
    json_t *root = json_loadb(js, (size_t)jl, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
    if (!root) return co_err_set(CO_EFORMAT, "%s: safetensors header is not JSON: %s (byte %d)", what, je.text, je.position);
    /* only spaces may follow the object (the writer pads to 8 bytes) */
    for (size_t i = je.position; i < jl; i++)
        if (js[i] != ' ') {
            json_decref(root);
            return co_err_set(CO_EFORMAT, "%s: bytes after the safetensors header object", what);
        }
    if (!json_is_object(root)) {
        json_decref(root);
        return co_err_set(CO_EFORMAT, "%s: safetensors header is not a JSON object", what);
    }
    ck_st_header *h = calloc(1, sizeof *h);
    size_t cap = json_object_size(root);
    if (!h || !(h->e = calloc(cap ? cap : 1, sizeof *h->e))) {
        free(h);
        json_decref(root);
        return co_err_set(CO_ENOMEM, "%s: out of memory", what);
    }
    h->json_len = jl;
    h->data_start = 8 + jl;
    h->data_len = file_size - h->data_start;
    const char *key;
    json_t *v;
    rc = 0;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                rc = co_err_set(CO_EFORMAT, "%s: __metadata__ is not an object", what);
                break;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) {
                rc = co_err_set(CO_EFORMAT, "%s: __metadata__[%s] is not a string", what, mk);
                break;
            }
            if (rc) break;
            h->metadata = json_incref(v);
            continue;
        }
        if (!ck_name_ok(key, false)) {
            rc = co_err_set(CO_EFORMAT, "%s: tensor name '%.64s' is empty, too long or has characters outside [A-Za-z0-9._-#:]",
                            what, key);
            break;
        }
        ck_st_entry *e = &h->e[h->n];
        snprintf(e->name, sizeof e->name, "%s", key);
        json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !json_is_string(dt) || !sh || !json_is_array(off) || json_array_size(off) != 2) {
            rc = co_err_set(CO_EFORMAT, "%s: tensor %s lacks dtype, shape or data_offsets [begin, end]", what, key);
            break;
        }
        e->dtype = ck_dtype_parse(json_string_value(dt));
        if (e->dtype < 0) {
            rc = co_err_set(CO_EFORMAT, "%s: tensor %s has unknown dtype '%.16s'", what, key, json_string_value(dt));
            break;
        }
        int64_t numel;
        char field[CK_NAME_MAX + 16];
        snprintf(field, sizeof field, "%s.shape", key);
        rc = parse_dims(sh, e->shape, &e->ndim, &numel, what, field);
        if (rc) break;
        json_t *b0 = json_array_get(off, 0), *b1 = json_array_get(off, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
            json_integer_value(b1) < json_integer_value(b0)) {
            rc = co_err_set(CO_EFORMAT, "%s: tensor %s has invalid data_offsets", what, key);
            break;
        }
        e->begin = (uint64_t)json_integer_value(b0);
        e->end = (uint64_t)json_integer_value(b1);
        if (e->end > h->data_len) {
            rc = co_err_set(CO_EFORMAT, "%s: tensor %s ends at byte %" PRIu64 " of a %" PRIu64 "-byte data section (truncated?)",
                            what, key, e->end, h->data_len);
            break;
        }
        if (e->end - e->begin != (uint64_t)numel * ck_dtype_size(e->dtype)) {
            rc = co_err_set(CO_EFORMAT, "%s: tensor %s: data_offsets span %" PRIu64 " bytes, shape and dtype need %" PRIu64,
                            what, key, e->end - e->begin, (uint64_t)numel * ck_dtype_size(e->dtype));
            break;
        }
        h->n++;
    }
    json_decref(root);
    if (!rc) {
        qsort(h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
        uint64_t pos = 0;
        for (int i = 0; i < h->n && !rc; i++) {
            if (h->e[i].begin != pos)
                rc = co_err_set(CO_EFORMAT, "%s: tensor %s starts at byte %" PRIu64 ", expected %" PRIu64 " (%s)", what,
                                h->e[i].name, h->e[i].begin, pos, h->e[i].begin < pos ? "overlap" : "hole");
            pos = h->e[i].end;
        }
        if (!rc && pos != h->data_len)
            rc = co_err_set(CO_EFORMAT, "%s: %" PRIu64 " bytes after the last tensor", what, h->data_len - pos);
    }
    if (rc) {
        ck_st_header_free(&h);
        return rc;
    }
    *out = h;
    return 0;
}

const ck_st_entry *ck_st_find(const ck_st_header *h, const char *name) {
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->e[i].name, name)) return &h->e[i];
    return NULL;
}

int ck_st_build_header(const char *const *names, const int *dts, const int *ndims,
                       const int64_t (*shapes)[CK_MAX_DIMS], int n, json_t *metadata, char **out, size_t *out_len) {
    *out = NULL;
    json_t *root = json_object();
    if (!root) return co_err_set(CO_ENOMEM, "safetensors header: out of memory");
    if (metadata) json_object_set(root, "__metadata__", metadata);
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        json_t *t = json_object(), *sh = json_array();
        uint64_t numel = 1;
        for (int d = 0; d < ndims[i]; d++) {
            json_array_append_new(sh, json_integer(shapes[i][d]));
            numel *= (uint64_t)shapes[i][d];
        }
        uint64_t end = pos + numel * ck_dtype_size(dts[i]);
        json_object_set_new(t, "dtype", json_string(ck_dtype_name(dts[i])));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "data_offsets", json_pack("[II]", (json_int_t)pos, (json_int_t)end));
        json_object_set_new(root, names[i], t);
        pos = end;
    }
    char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!js) return co_err_set(CO_ENOMEM, "safetensors header: out of memory");
    size_t jl = strlen(js), padded = (jl + 7) / 8 * 8;
    char *buf = malloc(8 + padded);
    if (!buf) {
        free(js);
        return co_err_set(CO_ENOMEM, "safetensors header: out of memory");
    }
    for (int i = 0; i < 8; i++) buf[i] = (char)(uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, js, jl);
    memset(buf + 8 + jl, ' ', padded - jl);
    free(js);
    *out = buf;
    *out_len = 8 + padded;
    return 0;
}

/* ---- manifest ------------------------------------------------------------------------ */

void ck_manifest_free(ck_manifest **pm) {
    ck_manifest *m = *pm;
    if (!m) return;
    for (int i = 0; i < m->ntensors; i++) free(m->tensors[i].slices);
    free(m->tensors);
    free(m->files);
    if (m->doc) json_decref(m->doc);
    free(m);
    *pm = NULL;
}

const ck_mtensor *ck_manifest_find(const ck_manifest *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

/* Field readers: each sets a detailed error naming the manifest and the field. */
typedef struct rd {
    const char *what;
    int rc;
} rd;

static json_t *need(rd *r, json_t *obj, const char *path, const char *key, int type) {
    if (r->rc) return NULL;
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    static const char *tn[] = {"an object", "an array", "a string", "an integer", "a number", "a boolean", "a boolean", "null"};
    bool ok = v && (json_typeof(v) == (json_type)type || (type == JSON_REAL && json_is_number(v)) ||
                    (type == JSON_TRUE && json_is_boolean(v)));
    if (!ok) {
        r->rc = co_err_set(CO_EFORMAT, "%s: %s%s%s is missing or not %s", r->what, path, *path ? "." : "", key,
                           type >= 0 && type <= 7 ? tn[type] : "valid");
        return NULL;
    }
    return v;
}

static int64_t get_int(rd *r, json_t *obj, const char *path, const char *key, int64_t lo, int64_t hi) {
    json_t *v = need(r, obj, path, key, JSON_INTEGER);
    if (!v) return 0;
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        r->rc = co_err_set(CO_EFORMAT, "%s: %s.%s = %" PRId64 " out of range [%" PRId64 ", %" PRId64 "]", r->what, path,
                           key, x, lo, hi);
        return 0;
    }
    return x;
}

static double get_num(rd *r, json_t *obj, const char *path, const char *key) {
    json_t *v = need(r, obj, path, key, JSON_REAL);
    return v ? json_number_value(v) : 0;
}

static bool get_bool(rd *r, json_t *obj, const char *path, const char *key) {
    json_t *v = need(r, obj, path, key, JSON_TRUE);
    return v ? json_is_true(v) : false;
}

static const char *get_str(rd *r, json_t *obj, const char *path, const char *key) {
    json_t *v = need(r, obj, path, key, JSON_STRING);
    return v ? json_string_value(v) : "";
}

/* doubles travel as 16 hex digits of their bits so they round-trip exactly (NaN included) */
static double get_bits(rd *r, json_t *obj, const char *path, const char *key) {
    const char *s = get_str(r, obj, path, key);
    if (r->rc) return 0;
    uint64_t u = 0;
    int n = 0;
    for (; s[n]; n++) {
        int h = hexval(s[n]);
        if (h < 0 || n >= 16) {
            r->rc = co_err_set(CO_EFORMAT, "%s: %s.%s is not 16 hex digits", r->what, path, key);
            return 0;
        }
        u = u << 4 | (uint64_t)h;
    }
    if (n != 16) {
        r->rc = co_err_set(CO_EFORMAT, "%s: %s.%s is not 16 hex digits", r->what, path, key);
        return 0;
    }
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static json_t *bits_json(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    char s[17];
    snprintf(s, sizeof s, "%016" PRIx64, u);
    return json_string(s);
}

static bool rects_overlap(const ck_slice *a, const ck_slice *b, int ndim) {
    for (int d = 0; d < ndim; d++)
        if (a->offsets[d] + a->shape[d] <= b->offsets[d] || b->offsets[d] + b->shape[d] <= a->offsets[d]) return false;
    return true;
}

static int cmp_flat(const void *a, const void *b) {
    const ck_slice *x = *(ck_slice *const *)a, *y = *(ck_slice *const *)b;
    return x->flat_begin < y->flat_begin ? -1 : x->flat_begin > y->flat_begin;
}

static int parse_tensor(rd *r, json_t *jt, ck_manifest *m, ck_mtensor *t, size_t idx) {
    char path[64];
    snprintf(path, sizeof path, "tensors[%zu]", idx);
    const char *name = get_str(r, jt, path, "name");
    const char *kind = get_str(r, jt, path, "kind");
    const char *dt = get_str(r, jt, path, "dtype");
    json_t *shape = need(r, jt, path, "shape", JSON_ARRAY);
    json_t *slices = need(r, jt, path, "slices", JSON_ARRAY);
    if (r->rc) return r->rc;
    if (!ck_name_ok(name, false))
        return r->rc = co_err_set(CO_EFORMAT, "%s: %s.name '%.64s' is not a valid tensor name", r->what, path, name);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!strcmp(kind, "model")) t->kind = CK_KIND_MODEL;
    else if (!strcmp(kind, "optim")) t->kind = CK_KIND_OPTIM;
    else return r->rc = co_err_set(CO_EFORMAT, "%s: tensor %s has kind '%.16s' (model|optim)", r->what, name, kind);
    t->dtype = ck_dtype_parse(dt);
    if (t->dtype < 0) return r->rc = co_err_set(CO_EFORMAT, "%s: tensor %s has unknown dtype '%.16s'", r->what, name, dt);
    int64_t numel;
    if ((r->rc = parse_dims(shape, t->shape, &t->ndim, &numel, r->what, name))) return r->rc;
    size_t ns = json_array_size(slices);
    if (ns < 1 || ns > MAX_SLICES_PER_TENSOR)
        return r->rc = co_err_set(CO_EFORMAT, "%s: tensor %s has %zu slices (1..%d)", r->what, name, ns, MAX_SLICES_PER_TENSOR);
    t->slices = calloc(ns, sizeof *t->slices);
    if (!t->slices) return r->rc = co_err_set(CO_ENOMEM, "%s: out of memory", r->what);
    t->nslices = (int)ns;
    int64_t covered = 0;
    for (size_t k = 0; k < ns; k++) {
        ck_slice *s = &t->slices[k];
        json_t *js = json_array_get(slices, k);
        char sp[CK_NAME_MAX + 32];
        snprintf(sp, sizeof sp, "%s.slices[%zu]", name, k);
        s->file = (int)get_int(r, js, sp, "file", 0, m->nfiles - 1);
        const char *key = get_str(r, js, sp, "key");
        if (r->rc) return r->rc;
        if (!ck_name_ok(key, false)) return r->rc = co_err_set(CO_EFORMAT, "%s: %s.key is not a valid tensor name", r->what, sp);
        snprintf(s->key, sizeof s->key, "%s", key);
        if (m->files[s->file].kind != t->kind)
            return r->rc = co_err_set(CO_EFORMAT, "%s: %s is stored in a file of another kind", r->what, sp);
        json_t *flat = json_object_get(js, "flat");
        if (flat) {
            if (!json_is_array(flat) || json_array_size(flat) != 2 || !json_is_integer(json_array_get(flat, 0)) ||
                !json_is_integer(json_array_get(flat, 1)))
                return r->rc = co_err_set(CO_EFORMAT, "%s: %s.flat is not [begin, end]", r->what, sp);
            s->flat = true;
            s->flat_begin = json_integer_value(json_array_get(flat, 0));
            s->flat_end = json_integer_value(json_array_get(flat, 1));
            if (s->flat_begin < 0 || s->flat_end <= s->flat_begin || s->flat_end > numel)
                return r->rc = co_err_set(CO_EFORMAT, "%s: %s.flat is outside the tensor's %" PRId64 " elements", r->what, sp, numel);
            covered += s->flat_end - s->flat_begin;
        } else {
            json_t *off = need(r, js, sp, "offsets", JSON_ARRAY), *ssh = need(r, js, sp, "shape", JSON_ARRAY);
            if (r->rc) return r->rc;
            int nd1, nd2;
            int64_t sn;
            if ((r->rc = parse_dims(off, s->offsets, &nd1, NULL, r->what, sp))) return r->rc;
            if ((r->rc = parse_dims(ssh, s->shape, &nd2, &sn, r->what, sp))) return r->rc;
            if (nd1 != t->ndim || nd2 != t->ndim)
                return r->rc = co_err_set(CO_EFORMAT, "%s: %s has %d/%d dimensions, the tensor %d", r->what, sp, nd1, nd2, t->ndim);
            for (int d = 0; d < t->ndim; d++)
                if (s->shape[d] == 0 || s->offsets[d] + s->shape[d] > t->shape[d])
                    return r->rc = co_err_set(CO_EFORMAT, "%s: %s lies outside the tensor in dimension %d", r->what, sp, d);
            covered += sn;
        }
        if (k && s->flat != t->slices[0].flat)
            return r->rc = co_err_set(CO_EFORMAT, "%s: tensor %s mixes flat and rectangular slices", r->what, name);
    }
    /* exact cover: pieces pairwise disjoint and their sizes add up to the tensor */
    if (t->slices[0].flat) {
        ck_slice **order = malloc(ns * sizeof *order);
        if (!order) return r->rc = co_err_set(CO_ENOMEM, "%s: out of memory", r->what);
        for (size_t k = 0; k < ns; k++) order[k] = &t->slices[k];
        qsort(order, ns, sizeof *order, cmp_flat);
        for (size_t k = 1; k < ns && !r->rc; k++)
            if (order[k]->flat_begin < order[k - 1]->flat_end)
                r->rc = co_err_set(CO_EFORMAT, "%s: tensor %s has overlapping slices", r->what, name);
        free(order);
        if (r->rc) return r->rc;
    } else {
        for (size_t a = 0; a < ns; a++)
            for (size_t b = a + 1; b < ns; b++)
                if (rects_overlap(&t->slices[a], &t->slices[b], t->ndim))
                    return r->rc = co_err_set(CO_EFORMAT, "%s: tensor %s has overlapping slices", r->what, name);
    }
    if (covered != numel)
        return r->rc = co_err_set(CO_EFORMAT, "%s: the slices of tensor %s cover %" PRId64 " of its %" PRId64 " elements",
                                  r->what, name, covered, numel);
    return 0;
}

int ck_manifest_parse(const char *buf, size_t len, const char *what, ck_manifest **out) {
    *out = NULL;
    if (len > CK_MANIFEST_MAX) return co_err_set(CO_EFORMAT, "%s: %zu bytes is too large for a manifest", what, len);
    json_error_t je;
    json_t *doc = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!doc) return co_err_set(CO_EFORMAT, "%s: not JSON: %s (line %d, column %d)", what, je.text, je.line, je.column);
    ck_manifest *m = calloc(1, sizeof *m);
    if (!m) {
        json_decref(doc);
        return co_err_set(CO_ENOMEM, "%s: out of memory", what);
    }
    m->doc = doc;
    rd r = {what, 0};
    if (!json_is_object(doc)) r.rc = co_err_set(CO_EFORMAT, "%s: not a JSON object", what);
    const char *fmt = get_str(&r, doc, "", "format");
    if (!r.rc && strcmp(fmt, CK_FORMAT_NAME))
        r.rc = co_err_set(CO_EFORMAT, "%s: format is '%.32s', not '%s'", what, fmt, CK_FORMAT_NAME);
    m->version = (int)get_int(&r, doc, "", "version", 1, 1000000);
    if (!r.rc && m->version > CK_FORMAT_VERSION)
        r.rc = co_err_set(CO_EFORMAT, "%s: format version %d is newer than this cohort reads (%d)", what, m->version,
                          CK_FORMAT_VERSION);
    m->iteration = get_int(&r, doc, "", "iteration", 0, INT64_MAX);
    m->created_unix = get_int(&r, doc, "", "created_unix", 0, INT64_MAX);
    need(&r, doc, "", "config", JSON_OBJECT);

    json_t *p = need(&r, doc, "", "progress", JSON_OBJECT);
    m->progress.iteration = get_int(&r, p, "progress", "iteration", 0, INT64_MAX);
    json_t *cs = need(&r, p, "progress", "consumed_samples", JSON_OBJECT);
    m->progress.consumed[0] = get_int(&r, cs, "progress.consumed_samples", "train", 0, INT64_MAX);
    m->progress.consumed[1] = get_int(&r, cs, "progress.consumed_samples", "valid", 0, INT64_MAX);
    m->progress.consumed[2] = get_int(&r, cs, "progress.consumed_samples", "test", 0, INT64_MAX);
    m->progress.skipped = get_int(&r, p, "progress", "skipped_iterations", 0, INT64_MAX);
    m->progress.nan_iters = get_int(&r, p, "progress", "nan_iterations", 0, INT64_MAX);
    json_t *la = need(&r, p, "progress", "log_accumulators", JSON_OBJECT);
    m->progress.loss_sum = get_bits(&r, la, "progress.log_accumulators", "loss_sum_bits");
    m->progress.tok_sum = get_bits(&r, la, "progress.log_accumulators", "tok_sum_bits");
    m->progress.iters_since_log = (int)get_int(&r, la, "progress.log_accumulators", "iters_since_log", 0, INT32_MAX);
    json_t *gs = json_object_get(p, "grad_scaler"); /* (--fp16 only) */
    if (gs) {
        if (!json_is_object(gs)) gs = need(&r, p, "progress", "grad_scaler", JSON_OBJECT);
        m->progress.loss_scale = get_bits(&r, gs, "progress.grad_scaler", "scale_bits");
        m->progress.growth_tracker = get_int(&r, gs, "progress.grad_scaler", "growth_tracker", 0, INT64_MAX);
        m->progress.hysteresis_tracker =
            get_int(&r, gs, "progress.grad_scaler", "hysteresis_tracker", -INT64_MAX, INT64_MAX);
        if (!r.rc && !(m->progress.loss_scale > 0 && m->progress.loss_scale < 1e39))
            r.rc = co_err_set(CO_EFORMAT, "%s: progress.grad_scaler.scale_bits is not a positive loss scale", what);
    }
    if (!r.rc && m->progress.iteration != m->iteration)
        r.rc = co_err_set(CO_EFORMAT, "%s: progress.iteration %" PRId64 " differs from iteration %" PRId64, what,
                          m->progress.iteration, m->iteration);

    json_t *rng = need(&r, doc, "", "rng", JSON_OBJECT);
    json_t *seed = need(&r, rng, "rng", "seed", JSON_INTEGER);
    if (seed) m->seed = json_integer_value(seed);
    need(&r, rng, "rng", "generators", JSON_ARRAY);
    need(&r, doc, "", "data_iterators", JSON_OBJECT);
    need(&r, doc, "", "rerun_state_machine", JSON_OBJECT);
    need(&r, doc, "", "lr_scheduler", JSON_OBJECT);

    json_t *pl = need(&r, doc, "", "parallel", JSON_OBJECT);
    m->layout.world = (int)get_int(&r, pl, "parallel", "world_size", 1, 1 << 24);
    m->layout.tensor = (int)get_int(&r, pl, "parallel", "tensor", 1, 1 << 24);
    m->layout.pipeline = (int)get_int(&r, pl, "parallel", "pipeline", 1, 1 << 24);
    m->layout.context = (int)get_int(&r, pl, "parallel", "context", 1, 1 << 24);
    m->layout.data = (int)get_int(&r, pl, "parallel", "data", 1, 1 << 24);
    m->layout.distributed_optimizer = get_bool(&r, pl, "parallel", "distributed_optimizer");
    m->layout.writers = (int)get_int(&r, pl, "parallel", "writers", 1, 1 << 24);
    m->layout.groups = 1; /* absent before tensor parallelism */
    if (pl && json_object_get(pl, "writer_groups"))
        m->layout.groups = (int)get_int(&r, pl, "parallel", "writer_groups", 1, 1 << 24);
    if (!r.rc && m->layout.writers % m->layout.groups)
        r.rc = co_err_set(CO_EFORMAT, "%s: parallel.writers %d is not a multiple of parallel.writer_groups %d", what,
                          m->layout.writers, m->layout.groups);

    json_t *mo = need(&r, doc, "", "model", JSON_OBJECT);
    ck_model_info *mi = &m->model;
    mi->num_layers = (int)get_int(&r, mo, "model", "num_layers", 1, 1 << 20);
    mi->hidden = (int)get_int(&r, mo, "model", "hidden", 1, 1 << 24);
    mi->heads = (int)get_int(&r, mo, "model", "heads", 1, 1 << 20);
    mi->kv_groups = (int)get_int(&r, mo, "model", "kv_groups", 1, 1 << 20);
    mi->head_dim = (int)get_int(&r, mo, "model", "head_dim", 1, 1 << 20);
    mi->ffn_hidden = (int)get_int(&r, mo, "model", "ffn_hidden", 1, 1 << 26);
    mi->vocab = (int)get_int(&r, mo, "model", "vocab", 1, 1 << 28);
    mi->padded_vocab = (int)get_int(&r, mo, "model", "padded_vocab", 1, 1 << 28);
    mi->max_positions = (int)get_int(&r, mo, "model", "max_positions", 0, 1 << 28);
    mi->rope = get_bool(&r, mo, "model", "rope");
    mi->rmsnorm = get_bool(&r, mo, "model", "rmsnorm");
    mi->swiglu = get_bool(&r, mo, "model", "swiglu");
    mi->tied = get_bool(&r, mo, "model", "tied");
    mi->bias = get_bool(&r, mo, "model", "bias");
    mi->norm_eps = get_num(&r, mo, "model", "norm_eps");
    mi->rotary_base = get_num(&r, mo, "model", "rotary_base");
    mi->norm_1p = mo && json_object_get(mo, "layernorm_1p") && get_bool(&r, mo, "model", "layernorm_1p");

    json_t *op = r.rc ? NULL : json_object_get(doc, "optimizer");
    if (!r.rc && !op) r.rc = co_err_set(CO_EFORMAT, "%s: optimizer is missing (null when not saved)", what);
    if (!r.rc && !json_is_null(op)) {
        m->optim.present = true;
        const char *ty = get_str(&r, op, "optimizer", "type");
        snprintf(m->optim.type, sizeof m->optim.type, "%s", ty);
        m->optim.step = get_int(&r, op, "optimizer", "step", 0, INT64_MAX);
        m->optim.beta1 = get_num(&r, op, "optimizer", "beta1");
        m->optim.beta2 = get_num(&r, op, "optimizer", "beta2");
        m->optim.eps = get_num(&r, op, "optimizer", "eps");
        m->optim.weight_decay = get_num(&r, op, "optimizer", "weight_decay");
        m->optim.clip_grad = get_num(&r, op, "optimizer", "clip_grad");
    }

    json_t *files = need(&r, doc, "", "files", JSON_ARRAY);
    json_t *tensors = need(&r, doc, "", "tensors", JSON_ARRAY);
    if (!r.rc) {
        size_t nf = json_array_size(files), nt = json_array_size(tensors);
        if (nf > MAX_FILES || nt > MAX_TENSORS)
            r.rc = co_err_set(CO_EFORMAT, "%s: %zu files / %zu tensors is more than allowed", what, nf, nt);
        else if (!(m->files = calloc(nf ? nf : 1, sizeof *m->files)) ||
                 !(m->tensors = calloc(nt ? nt : 1, sizeof *m->tensors)))
            r.rc = co_err_set(CO_ENOMEM, "%s: out of memory", what);
        for (size_t i = 0; i < nf && !r.rc; i++) {
            json_t *jf = json_array_get(files, i);
            char path[32];
            snprintf(path, sizeof path, "files[%zu]", i);
            ck_mfile *f = &m->files[i];
            const char *nm = get_str(&r, jf, path, "name");
            const char *kind = get_str(&r, jf, path, "kind");
            const char *hx = get_str(&r, jf, path, "xxh3_128");
            f->size = (uint64_t)get_int(&r, jf, path, "size", 0, INT64_MAX);
            f->writer = (int)get_int(&r, jf, path, "writer", 0, 1 << 24);
            f->group = 0; /* absent before writer groups */
            if (jf && json_object_get(jf, "group")) f->group = (int)get_int(&r, jf, path, "group", 0, 1 << 24);
            if (r.rc) break;
            if (!ck_name_ok(nm, true) || !strcmp(nm, CK_MANIFEST_NAME))
                r.rc = co_err_set(CO_EFORMAT, "%s: %s.name '%.64s' is not a plain file name", what, path, nm);
            else if (strcmp(kind, "model") && strcmp(kind, "optim"))
                r.rc = co_err_set(CO_EFORMAT, "%s: %s.kind '%.16s' is not model|optim", what, path, kind);
            else if (ck_unhex128(hx, f->xxh128))
                r.rc = co_err_set(CO_EFORMAT, "%s: %s.xxh3_128 is not 32 hex digits", what, path);
            if (r.rc) break;
            snprintf(f->name, sizeof f->name, "%s", nm);
            f->kind = strcmp(kind, "model") ? CK_KIND_OPTIM : CK_KIND_MODEL;
            for (size_t k = 0; k < i && !r.rc; k++)
                if (!strcmp(m->files[k].name, f->name))
                    r.rc = co_err_set(CO_EFORMAT, "%s: file %s listed twice", what, f->name);
            m->nfiles++;
        }
        for (size_t i = 0; i < nt && !r.rc; i++) {
            if (parse_tensor(&r, json_array_get(tensors, i), m, &m->tensors[i], i)) {
                m->ntensors++; /* its slices are freed with the manifest */
                break;
            }
            m->ntensors++;
        }
        /* names unique; keys unique within a file */
        if (!r.rc) {
            json_t *seen = json_object();
            for (int i = 0; i < m->ntensors && !r.rc; i++) {
                const ck_mtensor *t = &m->tensors[i];
                if (json_object_get(seen, t->name))
                    r.rc = co_err_set(CO_EFORMAT, "%s: tensor %s listed twice", what, t->name);
                json_object_set_new(seen, t->name, json_true());
                for (int k = 0; k < t->nslices && !r.rc; k++) {
                    char fk[2 * CK_NAME_MAX + 16];
                    snprintf(fk, sizeof fk, "%d/%s", t->slices[k].file, t->slices[k].key);
                    if (json_object_get(seen, fk))
                        r.rc = co_err_set(CO_EFORMAT, "%s: key %s used twice in file %s", what, t->slices[k].key,
                                          m->files[t->slices[k].file].name);
                    json_object_set_new(seen, fk, json_true());
                }
            }
            json_decref(seen);
        }
    }
    if (r.rc) {
        ck_manifest_free(&m);
        return r.rc;
    }
    *out = m;
    return 0;
}

json_t *ck_manifest_to_json(const ck_manifest *m) {
    json_t *doc = m->doc ? json_deep_copy(m->doc) : json_object();
    if (!doc) return NULL;
    json_object_set_new(doc, "format", json_string(CK_FORMAT_NAME));
    json_object_set_new(doc, "version", json_integer(CK_FORMAT_VERSION));
    json_object_set_new(doc, "iteration", json_integer(m->iteration));
    json_object_set_new(doc, "created_unix", json_integer(m->created_unix));
    if (!json_object_get(doc, "config")) json_object_set_new(doc, "config", json_object());
    const ck_progress *p = &m->progress;
    json_object_set_new(
        doc, "progress",
        json_pack("{sI s{sIsIsI} sI sI s{soso si}}", "iteration", (json_int_t)p->iteration, "consumed_samples", "train",
                  (json_int_t)p->consumed[0], "valid", (json_int_t)p->consumed[1], "test", (json_int_t)p->consumed[2],
                  "skipped_iterations", (json_int_t)p->skipped, "nan_iterations", (json_int_t)p->nan_iters,
                  "log_accumulators", "loss_sum_bits", bits_json(p->loss_sum), "tok_sum_bits", bits_json(p->tok_sum),
                  "iters_since_log", p->iters_since_log));
    if (p->loss_scale > 0)
        json_object_set_new(json_object_get(doc, "progress"), "grad_scaler",
                            json_pack("{sosIsI}", "scale_bits", bits_json(p->loss_scale), "growth_tracker",
                                      (json_int_t)p->growth_tracker, "hysteresis_tracker",
                                      (json_int_t)p->hysteresis_tracker));
    json_t *rng = json_object_get(doc, "rng");
    if (!json_is_object(rng)) {
        rng = json_object();
        json_object_set_new(doc, "rng", rng);
    }
    json_object_set_new(rng, "seed", json_integer(m->seed));
    if (!json_is_array(json_object_get(rng, "generators"))) json_object_set_new(rng, "generators", json_array());
    if (!json_object_get(doc, "data_iterators"))
        json_object_set_new(doc, "data_iterators",
                            json_pack("{s{sI}s{sI}s{sI}}", "train", "consumed_samples", (json_int_t)p->consumed[0], "valid",
                                      "consumed_samples", (json_int_t)p->consumed[1], "test", "consumed_samples",
                                      (json_int_t)p->consumed[2]));
    if (!json_object_get(doc, "rerun_state_machine"))
        json_object_set_new(doc, "rerun_state_machine", json_pack("{ss}", "mode", "disabled"));
    if (!json_object_get(doc, "lr_scheduler")) json_object_set_new(doc, "lr_scheduler", json_object());
    const ck_layout *l = &m->layout;
    json_object_set_new(doc, "parallel",
                        json_pack("{sisisisisisbsisi}", "world_size", l->world, "tensor", l->tensor, "pipeline",
                                  l->pipeline, "context", l->context, "data", l->data, "distributed_optimizer",
                                  (int)l->distributed_optimizer, "writers", l->writers, "writer_groups",
                                  l->groups > 0 ? l->groups : 1));
    const ck_model_info *mi = &m->model;
    json_object_set_new(doc, "model",
                        json_pack("{sisisisisisisisisisbsbsbsbsbsfsf}", "num_layers", mi->num_layers, "hidden", mi->hidden,
                                  "heads", mi->heads, "kv_groups", mi->kv_groups, "head_dim", mi->head_dim, "ffn_hidden",
                                  mi->ffn_hidden, "vocab", mi->vocab, "padded_vocab", mi->padded_vocab, "max_positions",
                                  mi->max_positions, "rope", (int)mi->rope, "rmsnorm", (int)mi->rmsnorm, "swiglu",
                                  (int)mi->swiglu, "tied", (int)mi->tied, "bias", (int)mi->bias, "norm_eps", mi->norm_eps,
                                  "rotary_base", mi->rotary_base));
    /* written only when set: a manifest without it reads as before */
    if (mi->norm_1p) json_object_set_new(json_object_get(doc, "model"), "layernorm_1p", json_true());
    const ck_optim_info *o = &m->optim;
    json_object_set_new(doc, "optimizer",
                        o->present ? json_pack("{sssIsfsfsfsfsf}", "type", o->type, "step", (json_int_t)o->step, "beta1",
                                               o->beta1, "beta2", o->beta2, "eps", o->eps, "weight_decay",
                                               o->weight_decay, "clip_grad", o->clip_grad)
                                   : json_null());
    json_t *files = json_array();
    for (int i = 0; i < m->nfiles; i++) {
        const ck_mfile *f = &m->files[i];
        char hx[33];
        ck_hex128(f->xxh128, hx);
        json_t *jf = json_pack("{sssssIsiss}", "name", f->name, "kind", f->kind == CK_KIND_MODEL ? "model" : "optim",
                               "size", (json_int_t)f->size, "writer", f->writer, "xxh3_128", hx);
        if (jf && m->layout.groups > 1) json_object_set_new(jf, "group", json_integer(f->group));
        json_array_append_new(files, jf);
    }
    json_object_set_new(doc, "files", files);
    json_t *tensors = json_array();
    for (int i = 0; i < m->ntensors; i++) {
        const ck_mtensor *t = &m->tensors[i];
        json_t *sh = json_array(), *sl = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        for (int k = 0; k < t->nslices; k++) {
            const ck_slice *s = &t->slices[k];
            json_t *js = json_pack("{siss}", "file", s->file, "key", s->key);
            if (s->flat) {
                json_object_set_new(js, "flat", json_pack("[II]", (json_int_t)s->flat_begin, (json_int_t)s->flat_end));
            } else {
                json_t *off = json_array(), *ss = json_array();
                for (int d = 0; d < t->ndim; d++) {
                    json_array_append_new(off, json_integer(s->offsets[d]));
                    json_array_append_new(ss, json_integer(s->shape[d]));
                }
                json_object_set_new(js, "offsets", off);
                json_object_set_new(js, "shape", ss);
            }
            json_array_append_new(sl, js);
        }
        json_array_append_new(tensors, json_pack("{sssssssoso}", "name", t->name, "kind",
                                                 t->kind == CK_KIND_MODEL ? "model" : "optim", "dtype",
                                                 ck_dtype_name(t->dtype), "shape", sh, "slices", sl));
    }
    json_object_set_new(doc, "tensors", tensors);
    return doc;
}

int ck_manifest_dump(const ck_manifest *m, char **out, size_t *len) {
    json_t *doc = ck_manifest_to_json(m);
    if (!doc) return co_err_set(CO_ENOMEM, "manifest: out of memory");
    char *s = json_dumps(doc, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(doc);
    if (!s) return co_err_set(CO_ENOMEM, "manifest: out of memory");
    *out = s;
    *len = strlen(s);
    return 0;
}

/* ---- the model description against the tensors ------------------------------------------ */

/* A tensor's expected shape: each dimension's size and the model fields it comes from
 * (for the message); size -1: not checked. */
typedef struct dim_rule {
    int64_t size;
    const char *field;
} dim_rule;

/* The expected shape of a tensor named name (a model tensor's name, without an optimizer
 * prefix) or false when no rule covers it. */
static bool model_rule(const ck_model_info *mi, const char *name, int *nd, dim_rule d[2]) {
    const int64_t H = mi->hidden, qkv = (int64_t)(mi->heads + 2 * mi->kv_groups) * mi->head_dim,
                  att = (int64_t)mi->heads * mi->head_dim, f1 = (int64_t)mi->ffn_hidden * (mi->swiglu ? 2 : 1);
    const dim_rule hid = {H, "hidden"}, vocab = {mi->padded_vocab, "padded_vocab"};
    const char *qkvf = "(heads + 2 x kv_groups) x head_dim", *f1f = mi->swiglu ? "2 x ffn_hidden (SwiGLU)" : "ffn_hidden";
    /* a layer's tensor: the part after "layers.N." or "mtp.layers.K.transformer_layer." */
    const char *sfx = NULL;
    int pos = 0;
    if (sscanf(name, "layers.%*d.%n", &pos) == 0 && pos) sfx = name + pos;
    pos = 0;
    if (!sfx && sscanf(name, "mtp.layers.%*d.transformer_layer.%n", &pos) == 0 && pos) sfx = name + pos;
    static const char *const norms[] = {"input_norm.weight", "input_norm.bias", "mlp_norm.weight", "mlp_norm.bias"};
    *nd = 1;
    d[0] = hid;
    d[1] = (dim_rule){-1, NULL};
    if (sfx) {
        for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++)
            if (!strcmp(sfx, norms[i])) return true;
        if (!strcmp(sfx, "attention.proj.bias") || !strcmp(sfx, "mlp.fc2.bias")) return true;
        if (!strcmp(sfx, "attention.qkv.bias")) d[0] = (dim_rule){qkv, qkvf};
        else if (!strcmp(sfx, "mlp.fc1.bias")) d[0] = (dim_rule){f1, f1f};
        else *nd = 2;
        if (*nd == 1) return true;
        if (!strcmp(sfx, "attention.qkv.weight")) d[0] = (dim_rule){qkv, qkvf}, d[1] = hid;
        else if (!strcmp(sfx, "attention.proj.weight")) d[1] = (dim_rule){att, "heads x head_dim"};
        else if (!strcmp(sfx, "mlp.fc1.weight")) d[0] = (dim_rule){f1, f1f}, d[1] = hid;
        else if (!strcmp(sfx, "mlp.fc2.weight")) d[1] = (dim_rule){mi->ffn_hidden, "ffn_hidden"};
        else if (!strcmp(sfx, "mlp.router.weight")) d[0] = (dim_rule){-1, NULL}, d[1] = hid;
        else return false;
        return true;
    }
    if (!strcmp(name, "final_norm.weight") || !strcmp(name, "final_norm.bias")) return true;
    pos = 0;
    if (sscanf(name, "mtp.layers.%*d.%n", &pos) == 0 && pos) {
        const char *m = name + pos;
        if (!strncmp(m, "enorm.", 6) || !strncmp(m, "hnorm.", 6) || !strncmp(m, "final_layernorm.", 16)) return true;
        if (strcmp(m, "eh_proj.weight")) return false;
        *nd = 2;
        d[1] = (dim_rule){2 * H, "2 x hidden"};
        return true;
    }
    *nd = 2;
    d[1] = hid;
    if (!strcmp(name, "embedding.word_embeddings.weight") || !strcmp(name, "output_layer.weight")) d[0] = vocab;
    else if (!strcmp(name, "embedding.position_embeddings.weight")) d[0] = (dim_rule){mi->max_positions, "max_positions"};
    else return false;
    return true;
}

static void shape_str(char *out, size_t n, int nd, const int64_t *v) {
    int o = snprintf(out, n, "[");
    for (int i = 0; i < nd && o > 0 && (size_t)o < n; i++) o += snprintf(out + o, n - (size_t)o, "%s%" PRId64, i ? ", " : "", v[i]);
    if (o > 0 && (size_t)o < n) snprintf(out + o, n - (size_t)o, "]");
}

int ck_model_check(const ck_manifest *m) {
    const ck_model_info *mi = &m->model;
    if (mi->vocab > mi->padded_vocab)
        return co_err_set(CO_EFORMAT, "the model's vocab %d is larger than its padded_vocab %d", mi->vocab, mi->padded_vocab);
    if (mi->heads % mi->kv_groups)
        return co_err_set(CO_EFORMAT, "the model's heads %d are not a multiple of its kv_groups %d", mi->heads, mi->kv_groups);
    int max_layer = -1, nlayers = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const ck_mtensor *t = &m->tensors[i];
        const char *name = t->name;
        static const char *const moments[] = {"optimizer.exp_avg_sq.", "optimizer.exp_avg."};
        for (size_t k = 0; k < 2; k++)
            if (!strncmp(name, moments[k], strlen(moments[k]))) name += strlen(moments[k]);
        /* every GPT layer has an input norm: the layers are counted by theirs, each once
         * (not its moments'); a checkpoint of other tensors is not held to the count */
        int layer = -1, end = 0;
        if (name == t->name && sscanf(name, "layers.%d.input_norm.weight%n", &layer, &end) == 1 && end && !name[end]) {
            nlayers++;
            if (layer > max_layer) max_layer = layer;
        }
        int nd;
        dim_rule d[2];
        if (!model_rule(mi, name, &nd, d)) continue;
        char have[96], want[96];
        shape_str(have, sizeof have, t->ndim, t->shape);
        if (t->ndim != nd)
            return co_err_set(CO_EFORMAT, "tensor %s has shape %s, %d dimension%s where the model makes %d", t->name, have,
                              t->ndim, t->ndim == 1 ? "" : "s", nd);
        for (int k = 0; k < nd; k++) {
            if (d[k].size < 0 || t->shape[k] == d[k].size) continue;
            int64_t w[2] = {t->shape[0], nd > 1 ? t->shape[1] : 0};
            w[k] = d[k].size;
            shape_str(want, sizeof want, nd, w);
            return co_err_set(CO_EFORMAT,
                              "the model description says %s = %" PRId64 " but tensor %s has shape %s (the model makes "
                              "it %s): the manifest's model does not match its tensors",
                              d[k].field, d[k].size, t->name, have, want);
        }
    }
    if (nlayers && (max_layer + 1 != mi->num_layers || nlayers != max_layer + 1))
        return co_err_set(CO_EFORMAT, "the model description says num_layers = %d but the tensors hold %d layer%s "
                                      "(layers.0 to layers.%d)", mi->num_layers, nlayers,
                          nlayers == 1 ? "" : "s", max_layer);
    return 0;
}
