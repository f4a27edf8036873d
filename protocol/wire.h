/* wire.h - cohort's control messages on the wire: one envelope, encoded and decoded with limits.
 *
 * Every control message is a cohort.v1.Envelope (protocol/cohort.proto; the C types come from
 * protoc-c at build time as protocol/cohort.pb-c.h): a header -- schema version, job id,
 * generation, sender, sequence number -- and exactly one body (Register, Assign, Heartbeat,
 * ...). The caller fills a generated body struct and pw_encode()s it with a header; the body's
 * type selects the oneof case.
 *
 * pw_decode() never trusts its input: the size is checked before parsing, protobuf-c unpacks
 * through an allocator capped in total bytes, required fields are enforced by protobuf-c,
 * then the version, the job id, the generation (older than expected = stale), the presence
 * of a body, every string/bytes length, every repeated count and every enum value are
 * checked. A message that fails any check is dropped: it is freed, never returned, and
 * counted once in pw_stats under the first reason that applies.
 *
 * Generations: the supervisor bumps the generation at every restart; a receiver drops
 * anything older than its current generation (expect.min_generation). A newer generation
 * passes decode -- the caller decides (a Restart or Abort carries it). Sequence numbers are
 * per (sender, generation), start at 1 and increase by one per message sent; pw_seqtrack
 * drops replays/duplicates (seq not above the last accepted from that sender in that
 * generation) and counts gaps (messages lost in between). */
#ifndef COHORT_PROTOCOL_WIRE_H
#define COHORT_PROTOCOL_WIRE_H

#include "protocol/cohort.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* The envelope's version field; bumped only with a new package (cohort.v2). */
#define PW_VERSION 1u

/* Reserved sender ids; ranks use 0 .. world_size-1. */
#define PW_SENDER_SUPERVISOR 0xFFFFFFFFu /* the job's supervisor */
#define PW_SENDER_UNASSIGNED 0xFFFFFFFEu /* a worker before its Assign (Register carries pid, host) */

/* expect.job_id wildcard: accept any job (tools only; workers and the supervisor never use it). */
#define PW_JOB_ANY 0u

/* Why a message was dropped (PW_OK: it was not). */
typedef enum {
    PW_OK = 0,
    PW_DROP_OVERSIZED,  /* longer than limits.max_size (checked before parsing) */
    PW_DROP_MALFORMED,  /* not a valid Envelope: bad wire format, a required field missing,
                           an enum value the schema does not know, field number 0 */
    PW_DROP_LIMITS,     /* a string, bytes field or repeated count over its limit, or the
                           decoder's memory cap reached */
    PW_DROP_VERSION,    /* envelope version != PW_VERSION */
    PW_DROP_JOB,        /* job id != expect.job_id */
    PW_DROP_STALE,      /* generation < expect.min_generation */
    PW_DROP_NO_BODY,    /* no body set (or only a body this version does not know) */
    PW_DROP_REPLAY,     /* pw_seqtrack: seq not above the last accepted from this sender */
    PW_DROP__COUNT
} pw_drop;

/* "oversized", "malformed", ... ("ok" for PW_OK). */
const char *pw_drop_name(pw_drop why);

/* Counters; zero-initialise, pass to decode and seqtrack, read any time (not thread-safe:
 * one per receiving thread). */
typedef struct {
    uint64_t accepted;                 /* decoded and returned */
    uint64_t dropped[PW_DROP__COUNT];  /* per reason; dropped[PW_OK] stays 0 */
    uint64_t gaps;                     /* pw_seqtrack: messages missing between accepted ones */
} pw_stats;

/* Total of dropped[]. */
uint64_t pw_stats_dropped(const pw_stats *s);

/* Decoder limits. pw_limits_default(): max_size 8 MiB, max_string 4 KiB, max_bytes 4 MiB
 * (state chunks), max_repeated 65536, max_alloc 64 MiB. */
typedef struct {
    size_t max_size;     /* whole encoded envelope, checked before parsing */
    size_t max_string;   /* any string field, in bytes (strlen) */
    size_t max_bytes;    /* any bytes field */
    size_t max_repeated; /* any repeated field's element count */
    size_t max_alloc;    /* total bytes protobuf-c may allocate while unpacking one message */
} pw_limits;

void pw_limits_default(pw_limits *l);

/* The envelope header. */
typedef struct {
    uint64_t job_id;     /* nonzero */
    uint64_t generation; /* 0 before the first assignment; the supervisor bumps it on restart */
    uint32_t sender;     /* rank, PW_SENDER_SUPERVISOR or PW_SENDER_UNASSIGNED */
    uint64_t seq;        /* per (sender, generation): 1, 2, 3, ... */
    uint64_t sent_ns;    /* sender's CLOCK_REALTIME in ns, 0 = not given (informational) */
} pw_header;

/* What a receiver accepts. */
typedef struct {
    uint64_t job_id;         /* PW_JOB_ANY or the job's id */
    uint64_t min_generation; /* drop generation < this */
} pw_expect;

/* A decoded message. env is the protobuf-c envelope: env->body_case says which body
 * (COHORT__V1__ENVELOPE__BODY_HEARTBEAT, ...) and env->heartbeat etc. point at it. */
typedef struct pw_msg {
    pw_header hdr;
    Cohort__V1__Envelope *env;
    struct pw__alloc *priv; /* the allocator env was unpacked with; internal */
} pw_msg;

/* Frees m and its envelope and sets *m = NULL. NULL or *m == NULL is fine. */
void pw_msg_free(pw_msg **m);

/* Bytes pw_encode needs for this header and body, or a negative CO_E* (CO_EINVAL: body is
 * not a type the envelope carries). */
int64_t pw_encoded_size(const pw_header *h, const ProtobufCMessage *body);

/* Encodes header + body into buf[0..cap). body is a generated body struct's base
 * (&hb.base for a Cohort__V1__Heartbeat hb); its type picks the oneof case. Returns 0 and
 * *len, or CO_EINVAL (body type not carried, required field missing, job id 0),
 * CO_ERANGE (cap too small; *len still says the size needed). */
int pw_encode(const pw_header *h, const ProtobufCMessage *body, uint8_t *buf, size_t cap,
              size_t *len);

/* Same into malloc'd bytes the caller free()s. CO_EINVAL, CO_ENOMEM. */
int pw_encode_alloc(const pw_header *h, const ProtobufCMessage *body, uint8_t **out, size_t *len);

/* Decodes buf[0..len) under lim (NULL = defaults) and exp. On success returns 0 and *out
 * (free with pw_msg_free), counts stats->accepted. Otherwise *out = NULL, the reason goes to
 * *why (optional) and is counted in stats (optional), and returns CO_EPROTOCOL (with a
 * detail sentence) -- or CO_ENOMEM if malloc itself failed (counted as PW_DROP_LIMITS).
 * Never crashes, whatever the bytes. */
int pw_decode(const void *buf, size_t len, const pw_limits *lim, const pw_expect *exp,
              pw_stats *stats, pw_msg **out, pw_drop *why);

/* The body's message type name ("Heartbeat"), or "none". */
const char *pw_body_name(const Cohort__V1__Envelope *env);

/* Per-sender sequence tracking for one receiver. */
typedef struct pw_seqtrack pw_seqtrack;

/* max_senders: how many distinct senders to remember (world size + a few); more are refused
 * by pw_seqtrack_check with PW_DROP_LIMITS. NULL on allocation failure. */
pw_seqtrack *pw_seqtrack_new(uint32_t max_senders);
void pw_seqtrack_destroy(pw_seqtrack **t);

/* Accepts h if its (generation, seq) is after the last accepted from h->sender: a higher
 * generation always is (the sender's count restarts); in the same generation seq must be
 * larger. Returns PW_OK (and adds seq - last - 1 to stats->gaps when messages were skipped),
 * PW_DROP_REPLAY for an old, duplicate or seq-0 message, PW_DROP_STALE for an older
 * generation than already seen from that sender, PW_DROP_LIMITS when the table is full. Drops
 * are counted in stats (optional); an accepted message was already counted by pw_decode. */
pw_drop pw_seqtrack_check(pw_seqtrack *t, const pw_header *h, pw_stats *stats);

/* Forgets every sender (after a restart, when the whole job moves to a new generation). */
void pw_seqtrack_reset(pw_seqtrack *t);

#endif
