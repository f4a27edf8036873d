/* metrics_http.h - the supervisor's Prometheus endpoint (--metrics-port): GET (or HEAD)
 * /metrics answers with the latest snapshot of the text exposition format (version 0.0.4)
 * that the supervisor's loop publishes; another method on it is 405 (Allow: GET, HEAD), any
 * other path (the percent-decoded path must be exactly "/metrics") is 404; a request body is
 * read and dropped. A request has 5 s from its connection's start (or the previous answer)
 * to arrive, however slowly it trickles: then its connection is cut, so slow clients cannot
 * hold the 64 connection slots (32 per client address). libmicrohttpd's internal polling
 * thread serves it; the snapshot is swapped and copied under a mutex, so the HTTP thread
 * never touches the supervisor's state (docs/observability.md, "Prometheus"). */
#ifndef COHORT_SUPERVISOR_METRICS_HTTP_H
#define COHORT_SUPERVISOR_METRICS_HTTP_H

typedef struct svm svm;

/* Listens on addr (a name or a numeric IPv4/IPv6 address) and port. Fails (CO_EIO with the
 * step that failed) when the address does not resolve or the port cannot be bound. */
int svm_start(svm **out, const char *addr, int port);
/* Replaces the snapshot served with text (taken over: freed by svm; NULL keeps the old one). */
void svm_publish(svm *m, char *text);
/* The port it listens on (the one the system chose for port 0). */
int svm_port(svm *m);
/* Requests served so far (for tests and the log). */
unsigned long svm_requests(svm *m);
/* Stops the HTTP thread (open connections are closed) and frees everything; *m = NULL. */
void svm_stop(svm **m);

#endif
