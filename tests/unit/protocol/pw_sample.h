/* pw_sample.h - test helpers for protocol/: build any cohort.v1 message with every field set.
 *
 * pws_fill() walks a message descriptor and fills every field -- every optional one present,
 * every repeated one with nrep elements, nested messages likewise, enums with a valid
 * nonzero value -- from a seed, so a round trip can check that nothing is lost. Shared by
 * the unit tests and the fuzz seed generator. */
#ifndef COHORT_TESTS_PW_SAMPLE_H
#define COHORT_TESTS_PW_SAMPLE_H

#include "protocol/wire.h"

#include <stddef.h>

/* A malloc'd message of type d with every field set; NULL on allocation failure. */
ProtobufCMessage *pws_fill(const ProtobufCMessageDescriptor *d, unsigned seed, size_t nrep);
/* Frees a message from pws_fill (or any message built from malloc'd parts); *m = NULL. */
void pws_free(ProtobufCMessage **m);
/* The body types the envelope carries, in field-number order; returns how many (<= cap). */
size_t pws_bodies(const ProtobufCMessageDescriptor **out, size_t cap);

#endif
