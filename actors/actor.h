/* actor.h - cohort's actor runtime: libuv loops with ZeroMQ mailboxes, timers and a
 * READY/STOP lifecycle. The rest of the code talks to peers through this API only and never
 * touches ZeroMQ directly.
 *
 * Actors. An actor is a libuv loop plus everything attached to it (mailboxes, timers, the
 * caller's own libuv handles such as uv_spawn processes). It runs either on a thread of its
 * own (ac_actor_start: returns once the actor is READY, i.e. its on_start callback has
 * returned 0) or on the calling thread (ac_actor_new + ac_actor_run: run returns after STOP).
 * STOP is a message (ac_actor_request_stop, callable from any thread or from a callback):
 * the loop runs on_stop, closes every mailbox (outstanding requests end with CO_EABORTED)
 * and timer, closes any libuv handle still open on the loop, and ends.
 *
 * Threads. Every function here must be called on the actor's own thread (from a callback:
 * on_start, on_message, a timer, a posted function) -- except ac_post,
 * ac_actor_request_stop and ac_actor_stop, which any thread may call, and, for an actor made
 * with ac_actor_new, anything called on the creating thread before ac_actor_run.
 *
 * Mailboxes. A mailbox carries opaque byte messages (protocol/ encodes them). A server
 * mailbox binds (a ZeroMQ ROUTER) and names each peer by the identity string the peer
 * connected with; a client mailbox connects (a DEALER) with a given identity. Endpoints are
 * strings: "ipc://PATH" on one machine, "tcp://HOST:PORT" across machines ("tcp://IP:*" picks
 * a free port; ac_mailbox_endpoint says which). Messages between two mailboxes arrive in the
 * order they were sent. Sends never block: when ZeroMQ's queue to a peer is full the message
 * waits in the mailbox's own queue and goes out when the peer catches up.
 *
 * Security. On tcp, pass the job secret (ac_secret, from `cohort keygen`): a server mailbox
 * becomes a CURVE server whose ZAP handler admits only clients holding the job's client key
 * (domain enforced); a client mailbox becomes a CURVE client. A client with another key is
 * refused during the handshake and none of its messages reach on_message. ipc endpoints live
 * in a directory only this user can open (ac_ipc_dir_create).
 *
 * Errors: negative CO_E* codes with a detail (common/error.h). CO_ETIMEOUT a wait ran out,
 * CO_EABORTED the actor or mailbox closed first, CO_EREMOTE the peer is not connected,
 * CO_EDENIED a secret file others can read. */
#ifndef COHORT_ACTORS_ACTOR_H
#define COHORT_ACTORS_ACTOR_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct ac_actor ac_actor;     /* handle: one loop and what runs on it */
typedef struct ac_mailbox ac_mailbox; /* handle: one ZeroMQ socket on an actor's loop */
typedef struct ac_timer ac_timer;     /* handle: one timer on an actor's loop */

/* ---- actors ------------------------------------------------------------------------- */

typedef struct {
    const char *name;          /* for error details and the thread name ("actor" if NULL) */
    /* Runs on the loop before READY: create mailboxes and timers here. A negative return
     * fails the start with that code (the actor then closes what it opened and ends). */
    int (*on_start)(ac_actor *a, void *ctx);
    /* Runs on the loop when STOP arrives, before the runtime closes mailboxes and timers:
     * send goodbyes, close your own libuv handles. May be NULL. */
    void (*on_stop)(ac_actor *a, void *ctx);
    void *ctx;
    int start_timeout_ms; /* ac_actor_start's wait for READY; 0 means 10000 */
    int stop_timeout_ms;  /* ac_actor_stop's wait for the thread to end; 0 means 10000 */
} ac_actor_opts;

/* Starts an actor on a new thread and waits until it is READY (on_start returned 0).
 * CO_ETIMEOUT if READY did not come in time (the actor is told to stop and abandoned),
 * on_start's code if it failed. */
int ac_actor_start(const ac_actor_opts *opts, ac_actor **out);
/* Sends STOP and joins the thread (bounded by stop_timeout_ms; CO_ETIMEOUT if it did not
 * end, in which case the actor is abandoned, not freed). Frees the actor; *a becomes NULL.
 * For an actor made with ac_actor_new: call after ac_actor_run returned; frees it. NULL-safe. */
int ac_actor_stop(ac_actor **a);

/* Makes an actor that will run on the calling thread (the supervisor's main thread). */
int ac_actor_new(const ac_actor_opts *opts, ac_actor **out);
/* Runs on_start, then the loop until STOP. Returns on_start's code if it failed, else 0. */
int ac_actor_run(ac_actor *a);
/* Frees an actor made with ac_actor_new that is not running. NULL-safe; *a becomes NULL. */
void ac_actor_destroy(ac_actor **a);

/* Sends STOP; returns at once. Any thread. Idempotent. */
void ac_actor_request_stop(ac_actor *a);
/* Runs fn(a, ctx) on the actor's loop, in posting order. Any thread. CO_EABORTED once STOP
 * has been requested (fn will not run; ctx stays the caller's), CO_ENOMEM. Functions posted
 * before STOP run before the loop ends. */
int ac_post(ac_actor *a, void (*fn)(ac_actor *a, void *ctx), void *ctx);

/* The actor's libuv loop, for the caller's own handles (uv_spawn, signals, ...). Handles
 * still open when the loop ends are closed by the runtime; close yours in on_stop. */
uv_loop_t *ac_actor_loop(ac_actor *a);
const char *ac_actor_name(const ac_actor *a);
/* Nonzero once STOP has been requested. Any thread. */
int ac_actor_stopping(const ac_actor *a);

/* ---- timers ------------------------------------------------------------------------- */

typedef void (*ac_timer_fn)(ac_timer *t, void *ctx);

/* Calls cb after ms milliseconds (0 counts as 1, so a timer re-armed from its own callback
 * cannot starve the loop; use ac_post to run something on the next iteration), then every
 * repeat_ms if repeat_ms > 0. With out == NULL a
 * one-shot timer frees itself after firing; otherwise *out is the caller's until
 * ac_timer_stop (or the actor's end). */
int ac_timer_start(ac_actor *a, uint64_t ms, uint64_t repeat_ms, ac_timer_fn cb, void *ctx,
                   ac_timer **out);
/* Stops and frees the timer (also from inside its own callback). NULL-safe; *t becomes NULL. */
void ac_timer_stop(ac_timer **t);

/* ---- secrets and endpoints ---------------------------------------------------------- */

#define AC_KEY_Z85_LEN 40

/* The job secret: the server's and the (shared) client's CURVE keypairs, Z85 text. */
typedef struct {
    char server_public[AC_KEY_Z85_LEN + 1];
    char server_secret[AC_KEY_Z85_LEN + 1];
    char client_public[AC_KEY_Z85_LEN + 1];
    char client_secret[AC_KEY_Z85_LEN + 1];
} ac_secret;

/* Fresh keypairs (zmq_curve_keypair). CO_EUNSUPPORTED if libzmq lacks CURVE. */
int ac_secret_generate(ac_secret *s);
/* Writes the secret file crash-safely with mode 0600 (the temp file is 0600 from the start). */
int ac_secret_write(const char *path, const ac_secret *s);
/* Reads a secret file. CO_EDENIED if the file is readable or writable by group or others
 * (or not owned by this user), CO_EFORMAT if malformed, CO_ENOENT/CO_EIO. */
int ac_secret_load(const char *path, ac_secret *s);

/* Creates a private directory for ipc endpoints (mode 0700, $XDG_RUNTIME_DIR/cohort-XXXXXX,
 * else /tmp/cohort-UID-XXXXXX) and writes its path to dir. */
int ac_ipc_dir_create(char *dir, size_t cap);
/* "ipc://DIR/NAME" into out; CO_ERANGE if the socket path is too long for the OS. */
int ac_ipc_endpoint(const char *dir, const char *name, char *out, size_t cap);
/* Removes the directory and the sockets in it (best effort). */
int ac_ipc_dir_remove(const char *dir);

/* ---- mailboxes ---------------------------------------------------------------------- */

/* One received message. Valid only during the callback (copy what you keep). */
typedef struct {
    const char *peer;    /* server mailbox: the sender's identity; client mailbox: NULL */
    const void *data;
    size_t len;
    uint64_t request_id; /* nonzero: the sender used ac_request and waits for ac_reply */
} ac_msg;

typedef void (*ac_msg_fn)(ac_mailbox *mb, const ac_msg *m, void *ctx);

/* Connection events (only when on_event is set; from zmq_socket_monitor). A server sees
 * them per connection, not per peer identity: use heartbeats for per-peer liveness. */
enum {
    AC_EV_CONNECTED = 1,   /* a connection completed its handshake */
    AC_EV_DISCONNECTED = 2,/* a connection closed */
    AC_EV_AUTH_FAILED = 3, /* a handshake was refused (wrong key, ZAP denial) */
};
typedef void (*ac_event_fn)(ac_mailbox *mb, int event, const char *endpoint, void *ctx);

typedef struct {
    ac_msg_fn on_message;     /* may be NULL (messages are then dropped) */
    ac_event_fn on_event;     /* may be NULL */
    /* Called when the messages that had to wait in the mailbox's own queue have all gone to
     * ZeroMQ: a sender producing a stream sends until ac_mailbox_queued() > 0, then resumes
     * here. May be NULL. */
    void (*on_drained)(ac_mailbox *mb, void *ctx);
    void *ctx;                /* passed to all three */
    const ac_secret *secret;  /* NULL: no encryption (ipc); else CURVE (copied) */
    const char *zap_domain;   /* server: the ZAP domain (default "cohort") */
    int hwm;                  /* ZeroMQ send/receive high-water mark; 0 means 1000 */
    size_t max_queued;        /* messages waiting in the mailbox's own queue before ac_send
                                 fails with CO_ENOSPC; 0 means 1000000 */
    int64_t max_msg_size;     /* ZMQ_MAXMSGSIZE: a peer sending a bigger frame is disconnected
                                 by ZeroMQ (the frame never reaches on_message; the mailbox
                                 serves the others). 0 means AC_MAX_MSG_DEFAULT; -1 no limit */
} ac_mailbox_opts;

/* The largest frame a mailbox takes by default: the protocol decoder's limit on a whole
 * envelope (8 MiB, pw_limits_default in protocol/wire.c: anything larger would be dropped
 * unparsed anyway) plus the mailbox's own header (kind byte and request id) and slack. The
 * control plane's messages are far smaller (metrics, log lines, checkpoint acks: kilobytes);
 * bulk state (parameters, moments) goes through the communicator (comm/), never a mailbox. */
#define AC_MAX_MSG_DEFAULT ((int64_t)(8 << 20) + 64)

/* Binds a server mailbox (ROUTER, ROUTER_MANDATORY, LINGER 0) on endpoint. opts may be NULL. */
int ac_mailbox_bind(ac_actor *a, const char *endpoint, const ac_mailbox_opts *opts,
                    ac_mailbox **out);
/* Connects a client mailbox (DEALER, LINGER 0) with the given identity (1..255 bytes, not
 * starting with a NUL byte). Connecting succeeds before the server exists; messages wait. */
int ac_mailbox_connect(ac_actor *a, const char *endpoint, const char *identity,
                       const ac_mailbox_opts *opts, ac_mailbox **out);
/* Closes the mailbox now: queued messages are dropped, outstanding requests end with
 * CO_EABORTED. Allowed inside its own callbacks. NULL-safe; *mb becomes NULL. */
void ac_mailbox_close(ac_mailbox **mb);

/* The endpoint as bound or connected (a tcp "*" port resolved). */
const char *ac_mailbox_endpoint(const ac_mailbox *mb);
ac_actor *ac_mailbox_actor(const ac_mailbox *mb);
/* Messages waiting in the mailbox's own queue (ZeroMQ's queue was full). */
size_t ac_mailbox_queued(const ac_mailbox *mb);

/* Sends one message. peer: the identity on a server mailbox, NULL on a client. 0,
 * CO_EREMOTE (server: no such peer connected), CO_ENOSPC (own queue full), CO_EINVAL. */
int ac_send(ac_mailbox *mb, const char *peer, const void *data, size_t len);

/* Reply callback of a request: status 0 with the reply, or CO_ETIMEOUT / CO_EABORTED with
 * reply NULL. Called exactly once unless ac_request itself failed. */
typedef void (*ac_reply_fn)(ac_mailbox *mb, int status, const ac_msg *reply, void *ctx);

/* Sends a request and calls cb with the peer's ac_reply, or with CO_ETIMEOUT after
 * timeout_ms (a late reply is then dropped). Returns as ac_send (cb is not called then). */
int ac_request(ac_mailbox *mb, const char *peer, const void *data, size_t len, int timeout_ms,
               ac_reply_fn cb, void *ctx);
/* Answers request m (from on_message) with data. */
int ac_reply(ac_mailbox *mb, const ac_msg *m, const void *data, size_t len);
/* The same, later: keep a copy of m->peer and m->request_id. */
int ac_reply_to(ac_mailbox *mb, const char *peer, uint64_t request_id, const void *data,
                size_t len);

#endif
