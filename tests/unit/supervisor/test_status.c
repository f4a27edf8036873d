/* test_status.c - supervisor/status.c: metrics records parsed (training, evaluation and
 * event lines), the Prometheus text (HELP and TYPE once per family before its samples, label
 * values escaped, counters), the status document (ranks, faults, the next checkpoint); and
 * supervisor/metrics_http.c: /metrics served while another thread publishes (run under
 * ThreadSanitizer too), 404 elsewhere. */
#include "common/error.h"
#include "supervisor/metrics_http.h"
#include "supervisor/status.h"

#include "tests/test.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int no_send(void *ctx, int rank, const ProtobufCMessage *body) {
    (void)ctx;
    (void)rank;
    (void)body;
    return 0;
}

static svv *validator(int world) {
    svv_options o;
    memset(&o, 0, sizeof o);
    rr_options_default(&o.rr, world);
    o.rr.world = world;
    o.straggler_threshold = 0.75;
    svv *v = NULL;
    CHECK(svv_new(&v, &o, no_send, NULL) == 0);
    return v;
}

static void job(svo_job *j, svo_rank *r) {
    memset(j, 0, sizeof *j);
    r[0] = (svo_rank){.rank = 0, .node = 0, .pid = 11, .host = "a", .iteration = 40, .alive = true};
    r[1] = (svo_rank){.rank = 1, .node = 0, .pid = 12, .host = "a", .iteration = 39, .alive = false};
    r[2] = (svo_rank){.rank = -1, .node = 0, .pid = 13, .host = "a", .alive = true}; /* a warm spare */
    *j = (svo_job){.pid = 10, .job_id = 0xabc, .generation = 2, .state = "training", .world = 2, .nnodes = 1,
                   .nslots = 3, .ranks = r, .save_interval = 25, .train_iters = 100, .save_dir = "/s",
                   .ckpt_commits = 1, .ckpt_last = 25, .uptime_s = 3};
}

static void prometheus_text(void) {
    svo *o = NULL;
    REQUIRE(svo_new(&o) == 0);
    svo_on_record(o, "{\"iteration\":40,\"train_iters\":100,\"consumed_samples\":320,\"elapsed_ms_per_iteration\":12.5,"
                     "\"tokens_per_second\":1000.0,\"learning_rate\":1e-3,\"lm_loss\":2.5,\"grad_norm\":0.5}\n"
                     "{\"evaluation\":\"valid\",\"iteration\":40,\"lm_loss\":9.0}\n"
                     "{\"event\":\"checkpoint_load\",\"iteration\":25,\"seconds\":0.25}\n"
                     "not json\n");
    svo_on_checkpoint(o, 25, 1.5);
    svv *v = validator(2);
    svv_note_fault(v, "we\"ird\\kind\n", 1, "text");
    svv_note_fault(v, "we\"ird\\kind\n", 1, "again");
    svv_restart_begin(v, "killed", 0, "rank 0 was killed", 10);
    svo_job j;
    svo_rank r[3];
    job(&j, r);
    char *t = svo_prometheus(o, &j, v);
    REQUIRE(t);
    CHECK_MSG(strstr(t, "\ncohort_iteration 40\n"), "%s", t);
    CHECK(strstr(t, "\ncohort_lm_loss 2.5\n")); /* the evaluation line did not replace it */
    CHECK(strstr(t, "\ncohort_iteration_seconds 0.0125\n"));
    CHECK(strstr(t, "\ncohort_consumed_samples 320\n"));
    CHECK(strstr(t, "cohort_job_info{job_id=\"0000000000000abc\",state=\"training\"} 1\n"));
    CHECK(strstr(t, "cohort_rank_up{rank=\"1\",node=\"0\"} 0\n"));
    CHECK(!strstr(t, "rank=\"-1\"")); /* spares are no rank */
    CHECK_MSG(strstr(t, "cohort_faults_total{kind=\"we\\\"ird\\\\kind\\n\",diagnosis=\"none\"} 2\n"), "%s", t);
    CHECK(strstr(t, "cohort_faults_total{kind=\"killed\",diagnosis=\"rank_failure\"} 1\n"));
    CHECK(strstr(t, "\ncohort_restarts_total 1\n"));
    CHECK(strstr(t, "\ncohort_checkpoint_save_seconds 1.5\n"));
    CHECK(strstr(t, "\ncohort_checkpoint_load_seconds 0.25\n") && strstr(t, "\ncohort_checkpoint_loads_total 1\n"));
    /* every family: HELP then TYPE, once, before its samples; counters and only they end in _total */
    char seen[64][80];
    int nseen = 0;
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        char name[80];
        if (!strncmp(line, "# HELP ", 7)) {
            sscanf(line + 7, "%79s", name);
            for (int k = 0; k < nseen; k++) CHECK_MSG(strcmp(seen[k], name), "%s twice", name);
            REQUIRE(nseen < 64);
            snprintf(seen[nseen++], sizeof seen[0], "%s", name);
            continue;
        }
        if (!strncmp(line, "# TYPE ", 7)) {
            char type[16];
            CHECK(sscanf(line + 7, "%79s %15s", name, type) == 2 && !strcmp(name, seen[nseen - 1]));
            size_t n = strlen(name);
            CHECK_MSG((!strcmp(type, "counter")) == (n > 6 && !strcmp(name + n - 6, "_total")), "%s", line);
            continue;
        }
        size_t n = strcspn(line, "{ ");
        CHECK_MSG(nseen && strlen(seen[nseen - 1]) == n && !strncmp(line, seen[nseen - 1], n), "%s", line);
    }
    free(t);
    svv_destroy(&v);
    svo_destroy(&o);
}

static void status_document(void) {
    svo *o = NULL;
    REQUIRE(svo_new(&o) == 0);
    svo_job j;
    svo_rank r[3];
    job(&j, r);
    /* before any record: nulls, no next-checkpoint time */
    char *s = svo_status_json(o, &j, NULL, 10);
    REQUIRE(s);
    json_t *d = json_loads(s, 0, NULL);
    free(s);
    REQUIRE(json_is_object(d));
    CHECK(json_is_null(json_object_get(d, "lm_loss")));
    CHECK(json_integer_value(json_object_get(json_object_get(d, "checkpoint"), "next_iteration")) == 25);
    CHECK(json_is_null(json_object_get(json_object_get(d, "checkpoint"), "next_in_seconds")));
    json_decref(d);
    svo_on_record(o, "{\"iteration\":90,\"elapsed_ms_per_iteration\":100,\"lm_loss\":2.0,\"tokens_per_second\":5}");
    svv *v = validator(2);
    for (int k = 0; k < 12; k++) {
        char kind[16];
        snprintf(kind, sizeof kind, "f%d", k);
        svv_note_fault(v, kind, k % 2, "x");
    }
    s = svo_status_json(o, &j, v, 3);
    REQUIRE(s);
    d = json_loads(s, 0, NULL);
    free(s);
    REQUIRE(json_is_object(d));
    CHECK(!strcmp(json_string_value(json_object_get(d, "job_id")), "0000000000000abc"));
    CHECK(json_integer_value(json_object_get(d, "iteration")) == 90);
    json_t *ck = json_object_get(d, "checkpoint");
    /* next multiple of 25 after 90 is 100 = --train-iters: 10 iterations of 0.1 s */
    CHECK(json_integer_value(json_object_get(ck, "next_iteration")) == 100);
    CHECK_CLOSE(json_real_value(json_object_get(ck, "next_in_seconds")), 1.0, 1e-9, 0);
    json_t *f = json_object_get(d, "faults");
    CHECK(json_array_size(f) == 3); /* the latest 3 */
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(f, 2), "kind")), "f11"));
    json_t *ranks = json_object_get(d, "ranks");
    CHECK(json_array_size(ranks) == 3);
    CHECK(json_is_null(json_object_get(json_array_get(ranks, 2), "rank")) &&
          json_is_true(json_object_get(json_array_get(ranks, 2), "spare")));
    CHECK(json_is_false(json_object_get(json_array_get(ranks, 1), "alive")));
    CHECK(json_integer_value(json_object_get(json_object_get(d, "counters"), "faults")) == 12);
    json_decref(d);
    /* a train_iters the save interval divides: the final save is the next multiple */
    j.save_dir = "";
    s = svo_status_json(o, &j, v, 3);
    d = json_loads(s, 0, NULL);
    free(s);
    CHECK(json_is_null(json_object_get(json_object_get(d, "checkpoint"), "next_iteration"))); /* no --save */
    json_decref(d);
    svv_destroy(&v);
    svo_destroy(&o);
}

/* GET path from 127.0.0.1:port (HTTP/1.0, the whole answer until the server closes) into
 * buf; its length, or -1. Every wait bounded by a 5 s socket timeout. */
static int http_get(int port, const char *path, char *buf, size_t n) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    char req[200];
    int len = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
    size_t got = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) || write(fd, req, (size_t)len) != len) {
        close(fd);
        return -1;
    }
    for (ssize_t k; got < n - 1 && (k = read(fd, buf + got, n - 1 - got)) > 0;) got += (size_t)k;
    buf[got] = '\0';
    close(fd);
    return (int)got;
}

typedef struct pub {
    svm *m;
    int rounds;
} pub;

static void *publisher(void *arg) {
    pub *p = arg;
    for (int k = 0; k < p->rounds; k++) {
        char *t = malloc(64);
        if (!t) break;
        snprintf(t, 64, "# TYPE cohort_x gauge\ncohort_x %d\n", k);
        svm_publish(p->m, t);
        usleep(500);
    }
    return NULL;
}

static void http_endpoint(void) {
    svm *m = NULL;
    REQUIRE_MSG(svm_start(&m, "127.0.0.1", 0) == 0, "%s", co_err_detail());
    int port = svm_port(m);
    REQUIRE(port > 0);
    char buf[4096];
    /* before any snapshot: an empty body */
    CHECK(http_get(port, "/metrics", buf, sizeof buf) > 0 && (strstr(buf, "HTTP/1.0 200") || strstr(buf, "HTTP/1.1 200")));
    pub p = {.m = m, .rounds = 400};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, publisher, &p) == 0);
    int ok = 0;
    for (int k = 0; k < 20; k++) {
        if (http_get(port, "/metrics", buf, sizeof buf) <= 0) continue;
        char *body = strstr(buf, "\r\n\r\n");
        int v = -1;
        if (strstr(buf, " 200 ") && strstr(buf, "text/plain; version=0.0.4") && body &&
            (!body[4] || sscanf(body + 4, "# TYPE cohort_x gauge\ncohort_x %d\n", &v) == 1))
            ok++;
    }
    pthread_join(th, NULL);
    CHECK_MSG(ok == 20, "%d of 20 scrapes whole", ok);
    CHECK(http_get(port, "/metrics", buf, sizeof buf) > 0 && strstr(buf, "cohort_x 399\n"));
    CHECK(http_get(port, "/other", buf, sizeof buf) > 0 && strstr(buf, " 404 "));
    CHECK(svm_requests(m) >= 22);
    /* the same port twice: refused, saying so */
    svm *m2 = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "port %d", port);
    CHECK(svm_start(&m2, "127.0.0.1", port) == CO_EIO && !m2);
    CHECK_MSG(strstr(co_err_detail(), ps), "%s", co_err_detail());
    svm_stop(&m);
    CHECK(m == NULL);
    CHECK(http_get(port, "/metrics", buf, sizeof buf) < 0); /* nobody listens any more */
}

int main(void) {
    RUN(http_endpoint);
    RUN(prometheus_text);
    RUN(status_document);
    return TEST_EXIT();
}
