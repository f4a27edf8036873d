/* wire.c - encode and decode cohort.v1 envelopes; every decode under explicit limits.
 *
 * Decoding order (the first failing check names the drop reason):
 *   1. size <= max_size                                  oversized
 *   2. a scan of the top-level fields for `version`      version (a v2 sender is told
 *      apart from garbage even when v1 cannot parse it)
 *   3. protobuf-c unpack through a byte-capped allocator  malformed / limits (the cap)
 *      (it enforces required fields)
 *   4. version, job id, generation, body present         version / job / stale / no body
 *   5. a walk over every field, nested ones included:    malformed (unknown enum value),
 *      string/bytes lengths, repeated counts, enums       limits
 * Unknown fields (a newer minor schema) are tolerated and count against the memory cap; one
 * with field number 0 (which protobuf-c lets through in a multi-byte key) is malformed. */
#include "protocol/wire.h"

#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names and stats ---------------------------------------------------------------------- */

const char *pw_drop_name(pw_drop why) {
    switch (why) {
    case PW_OK: return "ok";
    case PW_DROP_OVERSIZED: return "oversized";
    case PW_DROP_MALFORMED: return "malformed";
    case PW_DROP_LIMITS: return "limits";
    case PW_DROP_VERSION: return "version";
    case PW_DROP_JOB: return "job";
    case PW_DROP_STALE: return "stale";
    case PW_DROP_NO_BODY: return "no body";
    case PW_DROP_REPLAY: return "replay";
    case PW_DROP__COUNT: break;
    }
    return "unknown";
}

uint64_t pw_stats_dropped(const pw_stats *s) {
    uint64_t n = 0;
    for (int i = 0; i < PW_DROP__COUNT; i++) n += s->dropped[i];
    return n;
}

void pw_limits_default(pw_limits *l) {
    l->max_size = 8u << 20;
    l->max_string = 4096;
    l->max_bytes = 4u << 20;
    l->max_repeated = 65536;
    l->max_alloc = 64u << 20;
}

/* ---- the body's oneof field --------------------------------------------------------------- */

static const ProtobufCFieldDescriptor *body_field_for(const ProtobufCMessageDescriptor *d) {
    const ProtobufCMessageDescriptor *env = &cohort__v1__envelope__descriptor;
    for (unsigned i = 0; i < env->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &env->fields[i];
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && f->type == PROTOBUF_C_TYPE_MESSAGE &&
            f->descriptor == d)
            return f;
    }
    return NULL;
}

const char *pw_body_name(const Cohort__V1__Envelope *env) {
    if (!env || env->body_case == COHORT__V1__ENVELOPE__BODY__NOT_SET) return "none";
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&cohort__v1__envelope__descriptor, env->body_case);
    if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE) return "none";
    return ((const ProtobufCMessageDescriptor *)f->descriptor)->short_name;
}

/* ---- encode ------------------------------------------------------------------------------- */

static int build_envelope(const pw_header *h, const ProtobufCMessage *body,
                          Cohort__V1__Envelope *env) {
    if (!h || !body || !body->descriptor)
        return co_err_set(CO_EINVAL, "pw_encode: no header or body");
    if (h->job_id == PW_JOB_ANY) return co_err_set(CO_EINVAL, "pw_encode: job id 0");
    const ProtobufCFieldDescriptor *f = body_field_for(body->descriptor);
    if (!f)
        return co_err_set(CO_EINVAL, "pw_encode: %s is not a body the envelope carries",
                          body->descriptor->name ? body->descriptor->name : "?");
    *env = (Cohort__V1__Envelope)COHORT__V1__ENVELOPE__INIT;
    env->version = PW_VERSION;
    env->job_id = h->job_id;
    env->generation = h->generation;
    env->sender = h->sender;
    env->seq = h->seq;
    if (h->sent_ns) {
        env->has_sent_unix_ns = 1;
        env->sent_unix_ns = h->sent_ns;
    }
    env->body_case = (Cohort__V1__Envelope__BodyCase)f->id;
    memcpy((char *)env + f->offset, &body, sizeof body); /* the union member for this case */
    if (!protobuf_c_message_check(&env->base))
        return co_err_set(CO_EINVAL, "pw_encode: %s: a required field is missing",
                          body->descriptor->short_name);
    return 0;
}

int64_t pw_encoded_size(const pw_header *h, const ProtobufCMessage *body) {
    Cohort__V1__Envelope env;
    int rc = build_envelope(h, body, &env);
    if (rc) return rc;
    return (int64_t)protobuf_c_message_get_packed_size(&env.base);
}

int pw_encode(const pw_header *h, const ProtobufCMessage *body, uint8_t *buf, size_t cap,
              size_t *len) {
    Cohort__V1__Envelope env;
    int rc = build_envelope(h, body, &env);
    if (rc) return rc;
    size_t n = protobuf_c_message_get_packed_size(&env.base);
    if (len) *len = n;
    if (n > cap || !buf)
        return co_err_set(CO_ERANGE, "pw_encode: %s needs %zu bytes, buffer has %zu",
                          body->descriptor->short_name, n, cap);
    size_t w = protobuf_c_message_pack(&env.base, buf);
    if (w != n) return co_err_set(CO_EINTERNAL, "pw_encode: packed %zu of %zu bytes", w, n);
    return 0;
}

int pw_encode_alloc(const pw_header *h, const ProtobufCMessage *body, uint8_t **out,
                    size_t *len) {
    *out = NULL;
    Cohort__V1__Envelope env;
    int rc = build_envelope(h, body, &env);
    if (rc) return rc;
    size_t n = protobuf_c_message_get_packed_size(&env.base);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return co_err_set(CO_ENOMEM, "pw_encode: %zu bytes", n);
    size_t w = protobuf_c_message_pack(&env.base, b);
    if (w != n) {
        free(b);
        return co_err_set(CO_EINTERNAL, "pw_encode: packed %zu of %zu bytes", w, n);
    }
    *out = b;
    if (len) *len = n;
    return 0;
}

/* ---- the capped allocator ----------------------------------------------------------------- */

struct pw__alloc {
    ProtobufCAllocator a;
    size_t used, cap;
    int over_cap, oom;
};

static void *capped_alloc(void *data, size_t n) {
    struct pw__alloc *st = data;
    if (n > st->cap - st->used) {
        st->over_cap = 1;
        return NULL;
    }
    void *p = malloc(n ? n : 1);
    if (!p) {
        st->oom = 1;
        return NULL;
    }
    st->used += n;
    return p;
}

static void capped_free(void *data, void *p) {
    (void)data;
    free(p);
}

void pw_msg_free(pw_msg **m) {
    if (!m || !*m) return;
    if ((*m)->env) protobuf_c_message_free_unpacked(&(*m)->env->base, &(*m)->priv->a);
    free((*m)->priv);
    free(*m);
    *m = NULL;
}

/* ---- decode ------------------------------------------------------------------------------- */

/* Reads a varint at *p (< end); 0 when truncated or longer than 10 bytes. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

/* Finds the top-level field 1 (version, varint) without parsing the rest; 0 if absent or
 * the bytes stop making sense before it. */
static int scan_version(const uint8_t *p, size_t len, uint64_t *version) {
    const uint8_t *end = p + len;
    while (p < end) {
        uint64_t key, v;
        if (!read_varint(&p, end, &key)) return 0;
        unsigned wt = (unsigned)(key & 7);
        uint64_t field = key >> 3;
        switch (wt) {
        case 0:
            if (!read_varint(&p, end, &v)) return 0;
            if (field == 1) {
                *version = v;
                return 1;
            }
            break;
        case 1:
            if ((size_t)(end - p) < 8) return 0;
            p += 8;
            break;
        case 2:
            if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p)) return 0;
            p += v;
            break;
        case 5:
            if ((size_t)(end - p) < 4) return 0;
            p += 4;
            break;
        default: return 0;
        }
    }
    return 0;
}

typedef struct {
    const pw_limits *lim;
    pw_drop why;
    char what[192];
} walk;

static int walk_fail(walk *w, pw_drop why, const ProtobufCMessageDescriptor *d,
                     const ProtobufCFieldDescriptor *f, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int walk_fail(walk *w, pw_drop why, const ProtobufCMessageDescriptor *d,
                     const ProtobufCFieldDescriptor *f, const char *fmt, ...) {
    char tail[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    w->why = why;
    snprintf(w->what, sizeof w->what, "%s.%s: %s", d->short_name, f->name, tail);
    return -1;
}

static int walk_msg(walk *w, const ProtobufCMessage *m, int depth);

/* One value of field f at p (an element of a repeated field, or the field itself). */
static int walk_value(walk *w, const ProtobufCMessageDescriptor *d,
                      const ProtobufCFieldDescriptor *f, const void *p, int depth) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        size_t n = s ? strnlen(s, w->lim->max_string + 1) : 0;
        if (n > w->lim->max_string)
            return walk_fail(w, PW_DROP_LIMITS, d, f, "string longer than %zu bytes",
                             w->lim->max_string);
        return 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        if (b->len > w->lim->max_bytes)
            return walk_fail(w, PW_DROP_LIMITS, d, f, "%zu bytes, limit %zu", b->len,
                             w->lim->max_bytes);
        return 0;
    }
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        if (!protobuf_c_enum_descriptor_get_value(f->descriptor, v))
            return walk_fail(w, PW_DROP_MALFORMED, d, f, "unknown enum value %d", v);
        return 0;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        return sub ? walk_msg(w, sub, depth + 1) : 0;
    }
    default: return 0;
    }
}

static size_t type_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM: return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    }
    return 0;
}

static int walk_msg(walk *w, const ProtobufCMessage *m, int depth) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    if (depth > 16) { /* the schema is not recursive; this cannot happen with cohort.v1 */
        w->why = PW_DROP_LIMITS;
        snprintf(w->what, sizeof w->what, "%s: nested too deep", d->short_name);
        return -1;
    }
    /* protobuf-c keeps unknown fields, and takes field number 0 (invalid) when its key is
     * spelled in more than one byte; a re-encoding of such a message would not decode. */
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        uint32_t tag = m->unknown_fields[i].tag;
        if (tag == 0 || tag > 536870911u) {
            w->why = PW_DROP_MALFORMED;
            snprintf(w->what, sizeof w->what, "%s: invalid field number %u", d->short_name, tag);
            return -1;
        }
    }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m;
        const void *q = base + f->quantifier_offset;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)q != f->id) continue; /* another case is set */
        } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)q;
            if (n > w->lim->max_repeated)
                return walk_fail(w, PW_DROP_LIMITS, d, f, "%zu elements, limit %zu", n,
                                 w->lim->max_repeated);
            const char *arr = *(char *const *)(base + f->offset);
            size_t es = type_size(f->type);
            if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES ||
                f->type == PROTOBUF_C_TYPE_ENUM || f->type == PROTOBUF_C_TYPE_MESSAGE)
                for (size_t k = 0; k < n; k++)
                    if (walk_value(w, d, f, arr + k * es, depth)) return -1;
            continue;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
                   (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)) {
            if (!*(const protobuf_c_boolean *)q) continue; /* has_x = 0 */
        }
        if (walk_value(w, d, f, base + f->offset, depth)) return -1;
    }
    return 0;
}

static int drop(pw_stats *st, pw_drop *why_out, pw_drop why, int code, const char *detail) {
    if (st) st->dropped[why]++;
    if (why_out) *why_out = why;
    return co_err_set(code, "pw_decode: dropped (%s): %s", pw_drop_name(why), detail);
}

int pw_decode(const void *buf, size_t len, const pw_limits *lim, const pw_expect *exp,
              pw_stats *stats, pw_msg **out, pw_drop *why) {
    pw_limits dl;
    char detail[256];
    *out = NULL;
    if (why) *why = PW_OK;
    if (!lim) {
        pw_limits_default(&dl);
        lim = &dl;
    }
    if (len > lim->max_size) {
        snprintf(detail, sizeof detail, "%zu bytes, limit %zu", len, lim->max_size);
        return drop(stats, why, PW_DROP_OVERSIZED, CO_EPROTOCOL, detail);
    }
    if (!buf && len) return drop(stats, why, PW_DROP_MALFORMED, CO_EPROTOCOL, "no buffer");
    uint64_t version;
    if (len && scan_version(buf, len, &version) && version != PW_VERSION) {
        snprintf(detail, sizeof detail, "version %llu, this build speaks %u",
                 (unsigned long long)version, PW_VERSION);
        return drop(stats, why, PW_DROP_VERSION, CO_EPROTOCOL, detail);
    }

    pw_msg *m = calloc(1, sizeof *m);
    struct pw__alloc *al = calloc(1, sizeof *al);
    if (!m || !al) {
        free(m);
        free(al);
        return drop(stats, why, PW_DROP_LIMITS, CO_ENOMEM, "out of memory");
    }
    al->a.alloc = capped_alloc;
    al->a.free = capped_free;
    al->a.allocator_data = al;
    al->cap = lim->max_alloc;
    m->priv = al;
    static const uint8_t empty[1];
    m->env = cohort__v1__envelope__unpack(&al->a, len, len ? buf : empty);
    if (!m->env) {
        int oom = al->oom, cap = al->over_cap;
        pw_msg_free(&m);
        if (oom) return drop(stats, why, PW_DROP_LIMITS, CO_ENOMEM, "out of memory");
        if (cap) {
            snprintf(detail, sizeof detail, "decoding needs more than %zu bytes",
                     lim->max_alloc);
            return drop(stats, why, PW_DROP_LIMITS, CO_EPROTOCOL, detail);
        }
        return drop(stats, why, PW_DROP_MALFORMED, CO_EPROTOCOL,
                    "not a valid envelope (wire format or a required field)");
    }
    Cohort__V1__Envelope *e = m->env;
    pw_drop r = PW_OK;
    if (e->version != PW_VERSION) {
        r = PW_DROP_VERSION;
        snprintf(detail, sizeof detail, "version %u, this build speaks %u", e->version,
                 PW_VERSION);
    } else if (exp && exp->job_id != PW_JOB_ANY && e->job_id != exp->job_id) {
        r = PW_DROP_JOB;
        snprintf(detail, sizeof detail, "job %016llx, expected %016llx",
                 (unsigned long long)e->job_id, (unsigned long long)exp->job_id);
    } else if (exp && e->generation < exp->min_generation) {
        r = PW_DROP_STALE;
        snprintf(detail, sizeof detail, "generation %llu < %llu from sender %u",
                 (unsigned long long)e->generation, (unsigned long long)exp->min_generation,
                 e->sender);
    } else if (e->body_case == COHORT__V1__ENVELOPE__BODY__NOT_SET) {
        r = PW_DROP_NO_BODY;
        snprintf(detail, sizeof detail, "no body (sender %u, seq %llu)", e->sender,
                 (unsigned long long)e->seq);
    } else {
        walk w = {.lim = lim, .why = PW_OK};
        if (walk_msg(&w, &e->base, 0)) {
            r = w.why;
            snprintf(detail, sizeof detail, "%s", w.what);
        }
    }
    if (r != PW_OK) {
        pw_msg_free(&m);
        return drop(stats, why, r, CO_EPROTOCOL, detail);
    }
    m->hdr.job_id = e->job_id;
    m->hdr.generation = e->generation;
    m->hdr.sender = e->sender;
    m->hdr.seq = e->seq;
    m->hdr.sent_ns = e->has_sent_unix_ns ? e->sent_unix_ns : 0;
    if (stats) stats->accepted++;
    *out = m;
    return 0;
}

/* ---- sequence tracking -------------------------------------------------------------------- */

typedef struct {
    uint32_t sender;
    uint8_t used;
    uint64_t generation, seq;
} seq_slot;

struct pw_seqtrack {
    seq_slot *slots;
    uint32_t cap;   /* power of two */
    uint32_t count, max;
};

pw_seqtrack *pw_seqtrack_new(uint32_t max_senders) {
    if (max_senders == 0 || max_senders > (1u << 24)) return NULL;
    pw_seqtrack *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    uint32_t cap = 8;
    while (cap < 2 * max_senders) cap *= 2;
    t->slots = calloc(cap, sizeof *t->slots);
    if (!t->slots) {
        free(t);
        return NULL;
    }
    t->cap = cap;
    t->max = max_senders;
    return t;
}

void pw_seqtrack_destroy(pw_seqtrack **t) {
    if (!t || !*t) return;
    free((*t)->slots);
    free(*t);
    *t = NULL;
}

void pw_seqtrack_reset(pw_seqtrack *t) {
    memset(t->slots, 0, (size_t)t->cap * sizeof *t->slots);
    t->count = 0;
}

pw_drop pw_seqtrack_check(pw_seqtrack *t, const pw_header *h, pw_stats *stats) {
    pw_drop r = PW_OK;
    if (h->sender == PW_SENDER_UNASSIGNED) return PW_OK; /* many processes share this id */
    if (h->seq == 0) {
        r = PW_DROP_REPLAY;
        goto out;
    }
    uint32_t i = (h->sender * 2654435761u) & (t->cap - 1);
    while (t->slots[i].used && t->slots[i].sender != h->sender) i = (i + 1) & (t->cap - 1);
    seq_slot *s = &t->slots[i];
    if (!s->used) {
        if (t->count >= t->max) {
            r = PW_DROP_LIMITS;
            goto out;
        }
        t->count++;
        *s = (seq_slot){.sender = h->sender, .used = 1, .generation = h->generation, .seq = h->seq};
        return PW_OK;
    }
    if (h->generation < s->generation) {
        r = PW_DROP_STALE;
        goto out;
    }
    if (h->generation == s->generation) {
        if (h->seq <= s->seq) {
            r = PW_DROP_REPLAY;
            goto out;
        }
        if (stats) stats->gaps += h->seq - s->seq - 1;
    }
    s->generation = h->generation;
    s->seq = h->seq;
    return PW_OK;
out:
    if (stats) stats->dropped[r]++;
    return r;
}
