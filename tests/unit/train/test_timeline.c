/* test_timeline.c - the timeline recorder (train/timeline.h): events written and read back
 * unchanged, the bounded buffer and its drop count, what a killed process leaves (a torn
 * last line, a block without its end line, a torn line followed by a new process's header),
 * replays (discard, and the later block winning), malformed files, several threads
 * recording at once, and the cost of one event. */
#include "train/timeline.h"

#include "common/error.h"
#include "tests/test.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char dir[512];

static tl_meta meta_of(int rank) {
    /* tp 2 x pp 2 x dp 2, rank order tp-dp-pp */
    tl_meta m = {.rank = rank, .world = 8, .tp = 2, .pp = 2, .dp = 2, .tp_rank = rank % 2, .dp_rank = (rank / 2) % 2,
                 .pp_rank = rank / 4, .v = 1, .m = 4};
    return m;
}

static void file_of(int rank, char *out, size_t n) { snprintf(out, n, "%s/timeline-rank-%05d.jsonl", dir, rank); }

static void append(const char *path, const char *text) {
    FILE *f = fopen(path, "a");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_round_trip(void) {
    char sub[700], path[800];
    snprintf(sub, sizeof sub, "%s/a/b", dir); /* created with its parents */
    tl_meta m = meta_of(5);
    tl_rec *r;
    REQUIRE(tl_open(&r, sub, &m) == 0);
    double base = tl_now();
    CHECK(base > 1.5e9); /* CLOCK_REALTIME, not a monotonic clock */
    for (int k = 0; k < TL_NKINDS; k++)
        tl_event(r, (tl_kind)k, 3, k % 2 ? -1 : k, k == TL_FORWARD ? 1 : -1, base + k * 0.001, base + k * 0.001 + 0.0005);
    REQUIRE(tl_flush(r) == 0);
    CHECK(tl_flush(r) == 0); /* nothing buffered: nothing written */
    tl_event(r, TL_BACKWARD, 4, 2, 0, base + 1, base + 1.25);
    REQUIRE(tl_flush(r) == 0);
    CHECK(tl_dropped(r) == 0);
    tl_close(&r);
    CHECK(r == NULL);
    tl_close(&r);

    snprintf(path, sizeof path, "%s/timeline-rank-00005.jsonl", sub);
    tl_file f;
    REQUIRE(tl_read(path, &f) == 0);
    CHECK(f.headers == 1 && f.torn == 0 && f.uncommitted == 0 && f.dropped == 0);
    CHECK(!memcmp(&f.meta, &m, sizeof m));
    REQUIRE(f.n == TL_NKINDS + 1);
    for (int k = 0; k < TL_NKINDS; k++) {
        const tl_record *e = &f.ev[k];
        CHECK(e->kind == (tl_kind)k && e->iteration == 3);
        CHECK(e->mb == (k % 2 ? -1 : k) && e->chunk == (k == TL_FORWARD ? 1 : -1));
        CHECK(llabs(e->t0 - llround((base + k * 0.001) * 1e6)) <= 1); /* microseconds */
        CHECK(llabs(e->t1 - e->t0 - 500) <= 1);
    }
    CHECK(f.ev[TL_NKINDS].kind == TL_BACKWARD && f.ev[TL_NKINDS].iteration == 4);
    REQUIRE(f.niters == 2);
    CHECK(f.iters[0] == 3 && f.iters[1] == 4);
    tl_file_free(&f);

    for (int k = 0; k < TL_NKINDS; k++) CHECK(tl_kind_from_name(tl_kind_name((tl_kind)k)) == k);
    CHECK(tl_kind_from_name("lunch") == -1);
    /* a NULL recorder does nothing (recording off) */
    tl_event(NULL, TL_FORWARD, 1, 0, 0, 1, 2);
    CHECK(tl_flush(NULL) == 0);
    tl_discard(NULL);
    CHECK(tl_dropped(NULL) == 0);
}

static void test_buffer_bound(void) {
    tl_meta m = meta_of(1);
    tl_rec *r;
    REQUIRE(tl_open_capacity(&r, dir, &m, 4) == 0);
    for (int i = 0; i < 7; i++) tl_event(r, TL_FORWARD, 2, i, 0, 100.0 + i, 100.5 + i);
    tl_event(r, TL_FORWARD, 2, 9, 0, NAN, 1);          /* not finite */
    tl_event(r, TL_FORWARD, 2, 9, 0, 5, 4);            /* ends before it starts */
    tl_event(r, TL_FORWARD, 2, 9, 0, -1, 4);           /* before 1970 */
    tl_event(r, (tl_kind)99, 2, 9, 0, 200.0, 200.0); /* kind out of range: "other"; no room */
    CHECK(tl_dropped(r) == 7);
    REQUIRE(tl_flush(r) == 0);
    CHECK(tl_dropped(r) == 7);
    /* the buffer is empty again and holds 4 */
    for (int i = 0; i < 4; i++) tl_event(r, TL_BACKWARD, 3, i, 0, 300.0 + i, 300.5 + i);
    tl_event(r, (tl_kind)-3, 3, -1, -1, 310.0, 310.0); /* dropped: full */
    REQUIRE(tl_flush(r) == 0);
    CHECK(tl_dropped(r) == 8);
    tl_close(&r);

    char path[800];
    file_of(1, path, sizeof path);
    tl_file f;
    REQUIRE(tl_read(path, &f) == 0);
    REQUIRE(f.n == 8);
    CHECK(f.dropped == 8);
    for (int i = 0; i < 4; i++) /* the first ones are kept */
        CHECK(f.ev[i].mb == i && f.ev[i].iteration == 2 && f.ev[i].t0 == 100000000 + 1000000 * i);
    tl_file_free(&f);
    /* a kind out of range is "other" when there is room */
    REQUIRE(tl_open_capacity(&r, dir, &m, 4) == 0);
    tl_event(r, (tl_kind)99, 9, -1, -1, 400.0, 400.0);
    REQUIRE(tl_flush(r) == 0);
    tl_close(&r);
    REQUIRE(tl_read(path, &f) == 0);
    CHECK(f.headers == 2 && f.n == 9 && f.ev[8].kind == TL_OTHER);
    tl_file_free(&f);
    CHECK(tl_open_capacity(&r, dir, &m, 0) == CO_EINVAL && r == NULL);
    CHECK(tl_default_capacity(&m) == 4096);
    tl_meta big = m;
    big.m = 1000;
    big.v = 2;
    CHECK(tl_default_capacity(&big) == 16 * 2000 + 256);
}

static void test_torn_and_killed(void) {
    tl_meta m = meta_of(2);
    char path[800];
    file_of(2, path, sizeof path);
    tl_rec *r;
    REQUIRE(tl_open(&r, dir, &m) == 0);
    tl_event(r, TL_FORWARD, 7, 0, 0, 10.0, 11.0);
    tl_event(r, TL_BACKWARD, 7, 0, 0, 11.0, 13.0);
    REQUIRE(tl_flush(r) == 0);
    tl_close(&r);
    /* a process killed in the middle of its next flush: a complete event line, then half a line */
    append(path, "{\"k\":\"forward\",\"it\":8,\"mb\":0,\"c\":0,\"t0\":20000000,\"t1\":21000000}\n{\"k\":\"forw");
    tl_file f;
    REQUIRE(tl_read(path, &f) == 0);
    CHECK(f.torn == 1 && f.uncommitted == 1 && f.n == 2 && f.niters == 1 && f.iters[0] == 7);
    tl_file_free(&f);
    /* the replacement process appends: a fresh line, its header, its records */
    REQUIRE(tl_open(&r, dir, &m) == 0);
    tl_event(r, TL_FORWARD, 8, 0, 0, 30.0, 31.0);
    REQUIRE(tl_flush(r) == 0);
    tl_close(&r);
    REQUIRE(tl_read(path, &f) == 0);
    CHECK(f.headers == 2 && f.torn == 1 && f.uncommitted == 1);
    REQUIRE(f.n == 3 && f.niters == 2);
    CHECK(f.ev[2].iteration == 8 && f.ev[2].t0 == 30000000);
    tl_file_free(&f);
    /* a torn line in the middle that no header follows is malformed */
    append(path, "{\"k\":\"back\n{\"end\":8,\"events\":0,\"dropped\":0}\n");
    CHECK(tl_read(path, &f) == CO_EFORMAT);
    CHECK(strstr(co_err_detail(), "timeline-rank-00002.jsonl:") != NULL);
}

static void test_replay(void) {
    tl_meta m = meta_of(3);
    tl_rec *r;
    REQUIRE(tl_open(&r, dir, &m) == 0);
    tl_event(r, TL_FORWARD, 1, 0, 0, 1.0, 2.0);
    REQUIRE(tl_flush(r) == 0);
    /* an attempt abandoned before its flush: discarded */
    tl_event(r, TL_FORWARD, 2, 0, 0, 3.0, 4.0);
    tl_event(r, TL_FORWARD, 2, 1, 0, 4.0, 5.0);
    tl_discard(r);
    tl_event(r, TL_FORWARD, 2, 0, 0, 6.0, 7.0);
    REQUIRE(tl_flush(r) == 0);
    /* iteration 1 flushed again (replayed after a restart): the later block wins */
    tl_event(r, TL_FORWARD, 1, 0, 0, 8.0, 9.0);
    tl_event(r, TL_BACKWARD, 1, 0, 0, 9.0, 10.0);
    REQUIRE(tl_flush(r) == 0);
    tl_close(&r);
    char path[800];
    file_of(3, path, sizeof path);
    tl_file f;
    REQUIRE(tl_read(path, &f) == 0);
    REQUIRE(f.n == 3);
    CHECK(f.ev[0].iteration == 2 && f.ev[0].t0 == 6000000);
    CHECK(f.ev[1].iteration == 1 && f.ev[1].t0 == 8000000 && f.ev[2].kind == TL_BACKWARD);
    CHECK(f.niters == 2 && f.iters[0] == 1 && f.iters[1] == 2);
    tl_file_free(&f);
}

static void test_malformed(void) {
    char path[800];
    tl_file f;
    snprintf(path, sizeof path, "%s/noheader.jsonl", dir);
    append(path, "{\"k\":\"forward\",\"it\":1,\"mb\":0,\"c\":0,\"t0\":1,\"t1\":2}\n");
    CHECK(tl_read(path, &f) == CO_EFORMAT && strstr(co_err_detail(), "no header") != NULL);
    snprintf(path, sizeof path, "%s/badheader.jsonl", dir);
    append(path, "{\"timeline\":1,\"rank\":0,\"world\":4,\"tp\":1,\"pp\":2,\"dp\":1,\"tp_rank\":0,\"pp_rank\":0,"
                 "\"dp_rank\":0,\"v\":1,\"m\":4}\n");
    CHECK(tl_read(path, &f) == CO_EFORMAT && strstr(co_err_detail(), "malformed header") != NULL);
    snprintf(path, sizeof path, "%s/missing.jsonl", dir);
    append(path, "{\"timeline\":1,\"rank\":0,\"world\":1}\n");
    CHECK(tl_read(path, &f) == CO_EFORMAT && strstr(co_err_detail(), "malformed header") != NULL);
    snprintf(path, sizeof path, "%s/garbage.jsonl", dir);
    append(path, "{\"timeline\":1,\"rank\":0,\"world\":1,\"tp\":1,\"pp\":1,\"dp\":1,\"tp_rank\":0,\"pp_rank\":0,"
                 "\"dp_rank\":0,\"v\":1,\"m\":1}\nnot json\n{\"end\":1}\n");
    CHECK(tl_read(path, &f) == CO_EFORMAT && strstr(co_err_detail(), "garbage.jsonl:2") != NULL);
    snprintf(path, sizeof path, "%s/twolayouts.jsonl", dir);
    append(path, "{\"timeline\":1,\"rank\":0,\"world\":1,\"tp\":1,\"pp\":1,\"dp\":1,\"tp_rank\":0,\"pp_rank\":0,"
                 "\"dp_rank\":0,\"v\":1,\"m\":1}\n{\"timeline\":1,\"rank\":0,\"world\":2,\"tp\":1,\"pp\":2,\"dp\":1,"
                 "\"tp_rank\":0,\"pp_rank\":0,\"dp_rank\":0,\"v\":1,\"m\":1}\n");
    CHECK(tl_read(path, &f) == CO_EFORMAT && strstr(co_err_detail(), "two different runs") != NULL);
    snprintf(path, sizeof path, "%s/empty.jsonl", dir);
    append(path, "");
    CHECK(tl_read(path, &f) == 0 && f.headers == 0 && f.n == 0);
    tl_file_free(&f);
    snprintf(path, sizeof path, "%s/absent.jsonl", dir);
    CHECK(tl_read(path, &f) == CO_ENOENT);
    /* a layout that is not one */
    tl_rec *r;
    tl_meta m = meta_of(0);
    m.world = 6;
    CHECK(tl_open(&r, dir, &m) == CO_EINVAL && r == NULL && strstr(co_err_detail(), "world 6") != NULL);
    m = meta_of(0);
    m.pp_rank = 2;
    CHECK(tl_open(&r, dir, &m) == CO_EINVAL);
    m = meta_of(0);
    m.m = 0;
    CHECK(tl_open(&r, dir, &m) == CO_EINVAL);
    /* a directory that cannot be created */
    char blocked[800];
    snprintf(blocked, sizeof blocked, "%s/afile", dir);
    append(blocked, "x");
    strcat(blocked, "/sub");
    m = meta_of(0);
    CHECK(tl_open(&r, blocked, &m) < 0 && r == NULL && strstr(co_err_detail(), "timeline:") != NULL);
}

typedef struct worker_arg {
    tl_rec *r;
    int id;
} worker_arg;

static void *record_many(void *p) {
    worker_arg *a = p;
    for (int i = 0; i < 1000; i++) tl_event(a->r, TL_TP_COMM, 1, a->id, i, 1.0 + i, 1.5 + i);
    return NULL;
}

static void test_threads(void) {
    tl_meta m = meta_of(4);
    tl_rec *r;
    REQUIRE(tl_open_capacity(&r, dir, &m, 3000) == 0);
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){r, i};
        pthread_create(&th[i], NULL, record_many, &args[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    CHECK(tl_dropped(r) == 1000);
    REQUIRE(tl_flush(r) == 0);
    tl_close(&r);
    char path[800];
    file_of(4, path, sizeof path);
    tl_file f;
    REQUIRE(tl_read(path, &f) == 0);
    CHECK(f.n == 3000 && f.dropped == 1000);
    int seen[4] = {0};
    for (size_t i = 0; i < f.n; i++)
        if (f.ev[i].mb >= 0 && f.ev[i].mb < 4 && f.ev[i].t1 - f.ev[i].t0 == 500000) seen[f.ev[i].mb]++;
    CHECK(seen[0] + seen[1] + seen[2] + seen[3] == 3000);
    tl_file_free(&f);
}

static void test_cost(void) {
    tl_meta m = meta_of(6);
    tl_rec *r;
    REQUIRE(tl_open_capacity(&r, dir, &m, 1 << 16) == 0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 1 << 16; i++) tl_event(r, TL_FORWARD, 1, i, 0, 1.0, 2.0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (1 << 16);
    fprintf(stderr, "tl_event: %.1f ns per event\n", ns);
    CHECK(ns < 2000); /* a store into the buffer, nothing more (loose: shared CI machines) */
    clock_gettime(CLOCK_MONOTONIC, &a);
    REQUIRE(tl_flush(r) == 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    fprintf(stderr, "tl_flush: %.1f ms for 65536 events\n",
            ((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6));
    tl_close(&r);
}

int main(void) {
    if (t_scratch_dir(dir, sizeof dir, "cohort-timeline")) return 1;
    RUN(test_round_trip);
    RUN(test_buffer_bound);
    RUN(test_torn_and_killed);
    RUN(test_replay);
    RUN(test_malformed);
    RUN(test_threads);
    RUN(test_cost);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!t__failures && system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return TEST_EXIT();
}
