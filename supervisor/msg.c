/* msg.c - envelope headers and decoding for the supervisor and the worker's link. */
#include "supervisor/msg.h"

#include "common/error.h"

#include <stdlib.h>
#include <time.h>

uint64_t sv__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Encodes body under the next header of s; the sequence number is used only if sending works. */
static int encode(const sv__sender *s, const ProtobufCMessage *body, uint8_t **buf, size_t *len) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pw_header h = {.job_id = s->job_id,
                   .generation = s->generation,
                   .sender = s->sender,
                   .seq = s->seq + 1,
                   .sent_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec};
    return pw_encode_alloc(&h, body, buf, len);
}

int sv__encode(const sv__sender *s, const ProtobufCMessage *body, uint8_t **buf, size_t *len) {
    return encode(s, body, buf, len);
}

int sv__send(ac_mailbox *mb, const char *peer, sv__sender *s, const ProtobufCMessage *body) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = encode(s, body, &buf, &len);
    if (rc) return rc;
    rc = ac_send(mb, peer, buf, len);
    free(buf);
    if (!rc) s->seq++;
    return rc;
}

int sv__request(ac_mailbox *mb, const char *peer, sv__sender *s, const ProtobufCMessage *body, int timeout_ms,
                ac_reply_fn cb, void *ctx) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = encode(s, body, &buf, &len);
    if (rc) return rc;
    rc = ac_request(mb, peer, buf, len, timeout_ms, cb, ctx);
    free(buf);
    if (!rc) s->seq++;
    return rc;
}

pw_msg *sv__decode(const ac_msg *m, uint64_t job_id, uint64_t min_generation, pw_stats *stats) {
    pw_expect exp = {.job_id = job_id, .min_generation = min_generation};
    pw_msg *out = NULL;
    if (pw_decode(m->data, m->len, NULL, &exp, stats, &out, NULL)) return NULL;
    return out;
}
