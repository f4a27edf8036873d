/* zmq_auth.h - CURVE on the data plane (internal to the ZeroMQ collectives): every rank's key derived
 * from the job secret, and the ZAP handler of a communicator's ZeroMQ context, which admits
 * a connection only if its key is one of the job's rank keys and names the peer by it. */
#ifndef COHORT_COMM_ZMQ_AUTH_H
#define COHORT_COMM_ZMQ_AUTH_H

#include <stdint.h>

#define CM__ZAP_DOMAIN "cohort-data"

/* Rank r's CURVE keypair (Z85, 40 characters + NUL): its secret key is BLAKE2b-256 of
 * "cohort data plane rank" and r, keyed with the job's client secret key (Z85). Whoever
 * holds the job secret can derive every rank's key; nobody else can derive any.
 * CO_EINVAL for a malformed job key, CO_EUNSUPPORTED without libsodium or CURVE. */
int cm__rank_keypair(const char *client_secret_z85, int rank, char pub[41], char sec[41]);

typedef struct cm__zap cm__zap;

/* Starts the ZAP handler in ctx (binds inproc://zeromq.zap.01): it admits CURVE clients on
 * CM__ZAP_DOMAIN whose public key is rank r's key for some r in [0, size) other than
 * self, with User-Id "r"; everything else, malformed requests included, is refused. */
int cm__zap_start(void *ctx, const char *client_secret_z85, int size, int self, cm__zap **out);

/* Stops the handler and closes its socket (before zmq_ctx_term). NULL-safe. */
void cm__zap_stop(cm__zap **z);

/* The rank a User-Id names ("0" .. "size-1"), or -1. */
int cm__zap_rank(const char *user_id, int size);

#endif
