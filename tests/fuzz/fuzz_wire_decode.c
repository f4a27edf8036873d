/* fuzz_wire_decode.c - libFuzzer target for protocol/wire's decoder (pw_decode, pw_seqtrack).
 *
 * Each input is decoded three ways (tight limits, default limits, any job / no generation
 * floor). Besides "never crashes" (ASan, UBSan), it traps on broken invariants: a drop
 * that returns a message or no reason, an accepted message without a body, stats that do
 * not add up, and an accepted message that does not re-encode and decode to the same bytes.
 * Built and run by tests/fuzz/run_fuzz.sh; seeds from fuzz_wire_decode_seeds.c. */
#include "common/error.h"
#include "protocol/wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_JOB 0x1234567890abcdefull

static void check_reencode(const pw_msg *m) {
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
        &cohort__v1__envelope__descriptor, m->env->body_case);
    if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE) __builtin_trap();
    const ProtobufCMessage *body = *(ProtobufCMessage *const *)((const char *)m->env + f->offset);
    if (!body) __builtin_trap();
    uint8_t *enc = NULL;
    size_t len = 0;
    int rc = pw_encode_alloc(&m->hdr, body, &enc, &len);
    if (m->hdr.job_id == PW_JOB_ANY) { /* only reachable with an any-job expectation */
        if (rc != CO_EINVAL) __builtin_trap();
        return;
    }
    if (rc) __builtin_trap();
    pw_expect any = {.job_id = PW_JOB_ANY, .min_generation = 0};
    pw_msg *m2 = NULL;
    if (pw_decode(enc, len, NULL, &any, NULL, &m2, NULL) != 0) __builtin_trap();
    if (m2->hdr.job_id != m->hdr.job_id || m2->hdr.generation != m->hdr.generation ||
        m2->hdr.sender != m->hdr.sender || m2->hdr.seq != m->hdr.seq ||
        m2->hdr.sent_ns != m->hdr.sent_ns || m2->env->body_case != m->env->body_case)
        __builtin_trap();
    const ProtobufCMessage *body2 =
        *(ProtobufCMessage *const *)((const char *)m2->env + f->offset);
    uint8_t *enc2 = NULL;
    size_t len2 = 0;
    if (pw_encode_alloc(&m2->hdr, body2, &enc2, &len2) != 0) __builtin_trap();
    if (len2 != len || memcmp(enc, enc2, len)) __builtin_trap();
    free(enc2);
    free(enc);
    pw_msg_free(&m2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pw_seqtrack *track = pw_seqtrack_new(64); /* per input: runs stay independent */
    if (!track) return 0;
    pw_limits tight = {.max_size = 4096, .max_string = 64, .max_bytes = 256,
                       .max_repeated = 8, .max_alloc = 16384};
    const pw_limits *lims[3] = {&tight, NULL, NULL};
    const pw_expect exps[3] = {{.job_id = FUZZ_JOB, .min_generation = 2},
                               {.job_id = FUZZ_JOB, .min_generation = 0},
                               {.job_id = PW_JOB_ANY, .min_generation = 0}};
    pw_stats st = {0};
    for (int i = 0; i < 3; i++) {
        pw_msg *m = (pw_msg *)&st; /* not NULL: decode must set it */
        pw_drop why = PW_DROP__COUNT;
        int rc = pw_decode(data, size, lims[i], &exps[i], &st, &m, &why);
        if (rc == 0) {
            if (why != PW_OK || !m || !m->env ||
                m->env->body_case == COHORT__V1__ENVELOPE__BODY__NOT_SET)
                __builtin_trap();
            if (!strcmp(pw_body_name(m->env), "none")) __builtin_trap();
            pw_seqtrack_check(track, &m->hdr, NULL);
            check_reencode(m);
            pw_msg_free(&m);
            if (m) __builtin_trap();
        } else {
            if (m || why == PW_OK || why >= PW_DROP__COUNT) __builtin_trap();
            if (rc != CO_EPROTOCOL && rc != CO_ENOMEM) __builtin_trap();
        }
    }
    if (st.accepted + pw_stats_dropped(&st) != 3) __builtin_trap();
    pw_seqtrack_destroy(&track);
    return 0;
}
