/* pw_sample.c - fill every field of a cohort.v1 message from a seed (see pw_sample.h). */
#include "tests/unit/protocol/pw_sample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t elem_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM: return 4;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    default: return 8;
    }
}

static int fill_value(const ProtobufCFieldDescriptor *f, void *p, unsigned seed, size_t nrep) {
    uint64_t v = (uint64_t)seed * 1000003u + f->id * 7919u + 1;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: *(int32_t *)p = -(int32_t)(v % 100000) - 1; break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: *(uint32_t *)p = (uint32_t)v; break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: *(int64_t *)p = -(int64_t)v * 1000; break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: *(uint64_t *)p = v * 0x9E3779B97F4A7C15ull; break;
    case PROTOBUF_C_TYPE_FLOAT: *(float *)p = (float)v + 0.25f; break;
    case PROTOBUF_C_TYPE_DOUBLE: *(double *)p = (double)v + 0.125; break;
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)p = 1; break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        *(int *)p = e->values[1 + v % (e->n_values - 1)].value;
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *s = malloc(48);
        if (!s) return -1;
        snprintf(s, 48, "%s-%u", f->name, seed);
        *(char **)p = s;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = p;
        b->len = 5 + f->id + seed % 7;
        b->data = malloc(b->len);
        if (!b->data) return -1;
        for (size_t i = 0; i < b->len; i++) b->data[i] = (uint8_t)(v + i * 37);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        ProtobufCMessage *m = pws_fill(f->descriptor, seed + f->id, nrep);
        if (!m) return -1;
        *(ProtobufCMessage **)p = m;
        break;
    }
    }
    return 0;
}

ProtobufCMessage *pws_fill(const ProtobufCMessageDescriptor *d, unsigned seed, size_t nrep) {
    ProtobufCMessage *m = calloc(1, d->sizeof_message);
    if (!m) return NULL;
    protobuf_c_message_init(d, m);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *base = (char *)m;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) continue; /* the caller picks the case */
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t es = elem_size(f->type);
            char *arr = calloc(nrep ? nrep : 1, es);
            if (!arr) goto fail;
            *(char **)(base + f->offset) = arr;
            *(size_t *)(base + f->quantifier_offset) = nrep;
            for (size_t k = 0; k < nrep; k++)
                if (fill_value(f, arr + k * es, seed + (unsigned)k * 13, nrep)) goto fail;
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
            f->type != PROTOBUF_C_TYPE_MESSAGE)
            *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
        if (fill_value(f, base + f->offset, seed, nrep)) goto fail;
    }
    return m;
fail:
    pws_free(&m);
    return NULL;
}

void pws_free(ProtobufCMessage **m) {
    if (!m || !*m) return;
    protobuf_c_message_free_unpacked(*m, NULL);
    *m = NULL;
}

size_t pws_bodies(const ProtobufCMessageDescriptor **out, size_t cap) {
    const ProtobufCMessageDescriptor *env = &cohort__v1__envelope__descriptor;
    size_t n = 0;
    for (unsigned i = 0; i < env->n_fields && n < cap; i++)
        if (env->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) out[n++] = env->fields[i].descriptor;
    return n;
}
