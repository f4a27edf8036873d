/* msg.h - sending and receiving control messages over a mailbox: the envelope header
 * (job id, generation, sender, per-sender sequence number) is filled here, so the
 * supervisor and the worker's link never build one by hand. Shared by supervisor/, the
 * worker's link (worker/link.c) and the clients in cli/ and worker/metrics_local.c. */
#ifndef COHORT_SUPERVISOR_MSG_H
#define COHORT_SUPERVISOR_MSG_H

#include "actors/actor.h"
#include "protocol/wire.h"

typedef struct sv__sender {
    uint64_t job_id;
    uint64_t generation;
    uint32_t sender;
    uint64_t seq; /* last sequence number used */
} sv__sender;

/* Encodes body under the next header of s (s unchanged) into *buf (malloc'd): for a reply. */
int sv__encode(const sv__sender *s, const ProtobufCMessage *body, uint8_t **buf, size_t *len);

/* Encodes body under the next header of s and sends it to peer (NULL on a client mailbox). */
int sv__send(ac_mailbox *mb, const char *peer, sv__sender *s, const ProtobufCMessage *body);

/* The same as a request (ac_request): cb gets the reply or CO_ETIMEOUT after timeout_ms. */
int sv__request(ac_mailbox *mb, const char *peer, sv__sender *s, const ProtobufCMessage *body, int timeout_ms,
                ac_reply_fn cb, void *ctx);

/* Decodes a received message for this job; NULL (and counted in stats) if it is dropped. */
pw_msg *sv__decode(const ac_msg *m, uint64_t job_id, uint64_t min_generation, pw_stats *stats);

/* Monotonic milliseconds. */
uint64_t sv__now_ms(void);

#endif
