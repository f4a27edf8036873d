/* test_observe.c - observe/: CRC32C against published vectors and a bitwise reference,
 * TensorFlow's mask, the record framing, the event file writer (name, first event, queue,
 * records decoded back with protobuf-c) and the metrics record -> tags mapping. */
#include "observe/crc32c.h"
#include "observe/tbevent.pb-c.h"
#include "observe/tensorboard.h"
#include "observe/tfevents.h"

#include "common/error.h"
#include "tests/test.h"

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t crc_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc32c_vectors(void) {
    CHECK(ob_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(ob_crc32c(0, "", 0) == 0);
    uint8_t b[32];
    memset(b, 0, sizeof b); /* RFC 3720 B.4 */
    CHECK(ob_crc32c(0, b, 32) == 0x8A9136AAu);
    memset(b, 0xff, sizeof b);
    CHECK(ob_crc32c(0, b, 32) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    CHECK(ob_crc32c(0, b, 32) == 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
    CHECK(ob_crc32c(0, b, 32) == 0x113FDB5Cu);
}

static void test_crc32c_slices(void) {
    /* every alignment and length against the bitwise reference, and extension in pieces */
    uint8_t buf[300];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)((x = x * 1103515245u + 12345u) >> 16);
    int bad = 0;
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; off + n <= sizeof buf; n += 7) {
            uint32_t whole = ob_crc32c(0, buf + off, n);
            if (whole != crc_bitwise(buf + off, n)) bad++;
            size_t h = n / 3;
            if (ob_crc32c(ob_crc32c(0, buf + off, h), buf + off + h, n - h) != whole) bad++;
        }
    CHECK_MSG(bad == 0, "%d mismatches", bad);
}

static void test_mask(void) {
    CHECK(ob_crc32c_mask(0) == 0xa282ead8u);
    CHECK(ob_crc32c_mask(0xE3069283u) == 0xc78ab0e5u);
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static void test_frame(void) {
    uint8_t out[3 + OB_TFEVENTS_FRAME];
    CHECK(ob_tfevents_frame(out, "abc", 3) == 19);
    CHECK(le64(out) == 3);
    CHECK(le32(out + 8) == ob_crc32c_mask(crc_bitwise(out, 8)));
    CHECK(!memcmp(out + 12, "abc", 3));
    CHECK(le32(out + 15) == ob_crc32c_mask(crc_bitwise((const uint8_t *)"abc", 3)));
}

/* The one event file in dir: its path into path, its bytes (malloc'ed) and size. */
static uint8_t *read_events(const char *dir, char *path, size_t np, size_t *len) {
    DIR *d = opendir(dir);
    if (!d) return NULL;
    struct dirent *e;
    int n = 0;
    path[0] = '\0';
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            snprintf(path, np, "%s/%s", dir, e->d_name);
            n++;
        }
    closedir(d);
    if (n != 1) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    *len = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

/* Splits buf into records (CRCs checked): up to max payload events decoded; -1 if torn. */
static int decode(const uint8_t *buf, size_t len, Tensorboard__Event **ev, int max) {
    size_t off = 0;
    int n = 0;
    while (off < len) {
        if (len - off < 12) return -1;
        uint64_t m = le64(buf + off);
        if (le32(buf + off + 8) != ob_crc32c_mask(crc_bitwise(buf + off, 8))) return -1;
        if (off + 16 + m > len) return -1;
        if (le32(buf + off + 12 + m) != ob_crc32c_mask(crc_bitwise(buf + off + 12, m))) return -1;
        if (n < max) ev[n] = tensorboard__event__unpack(NULL, m, buf + off + 12);
        if (n < max && !ev[n]) return -1;
        n++;
        off += 16 + m;
    }
    return n;
}

static void test_writer(void) {
    char dir[300], sub[400], path[700];
    REQUIRE(t_scratch_dir(dir, sizeof dir, "cohort-observe") == 0);
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    ob_tfevents *w = NULL;
    REQUIRE(ob_tfevents_open(&w, sub, 3, 1e9) == 0);
    size_t len = 0;
    uint8_t *b = read_events(sub, path, sizeof path, &len);
    REQUIRE(b);
    CHECK(!strcmp(path, ob_tfevents_path(w)));
    /* events.out.tfevents.<%010d>.<host>.<pid>.<counter> */
    char host[256];
    gethostname(host, sizeof host);
    char tail[400];
    snprintf(tail, sizeof tail, ".%s.%d.", host, (int)getpid());
    const char *base = strrchr(path, '/') + 1;
    CHECK(strlen(base) > 31 && base[30] == '.' && strstr(base + 30, tail) == base + 30);
    Tensorboard__Event *ev[8] = {0};
    CHECK(decode(b, len, ev, 8) == 1);
    REQUIRE(ev[0]);
    CHECK(ev[0]->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION && !strcmp(ev[0]->file_version, "brain.Event:2"));
    CHECK(ev[0]->wall_time > 1.7e9);
    tensorboard__event__free_unpacked(ev[0], NULL);
    free(b);
    /* queue of 3: two scalars stay in memory, the third writes all three */
    CHECK(ob_tfevents_scalar(w, "lm loss", 1, 6.25f, 1.8e9) == 0);
    CHECK(ob_tfevents_scalar(w, "lm loss vs samples", 8, 0.0f, 1.8e9) == 0);
    b = read_events(sub, path, sizeof path, &len);
    CHECK(b && decode(b, len, ev, 0) == 1);
    free(b);
    CHECK(ob_tfevents_scalar(w, "grad-norm", 2, -1.5f, 1.8e9 + 1) == 0);
    b = read_events(sub, path, sizeof path, &len);
    REQUIRE(b);
    CHECK(decode(b, len, ev, 8) == 4);
    const char *tags[] = {"lm loss", "lm loss vs samples", "grad-norm"};
    const int64_t steps[] = {1, 8, 2};
    const float vals[] = {6.25f, 0.0f, -1.5f};
    for (int k = 1; k < 4; k++) {
        REQUIRE(ev[k] && ev[k]->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY && ev[k]->summary->n_value == 1);
        Tensorboard__Summary__Value *v = ev[k]->summary->value[0];
        CHECK(!strcmp(v->tag, tags[k - 1]) && ev[k]->step == steps[k - 1]);
        /* a 0.0 is still there (the oneof keeps its presence) */
        CHECK(v->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE && v->simple_value == vals[k - 1]);
        tensorboard__event__free_unpacked(ev[k], NULL);
        ev[k] = NULL;
    }
    tensorboard__event__free_unpacked(ev[0], NULL);
    free(b);
    CHECK(ob_tfevents_scalar(w, "x", 3, 1, 1.8e9) == 0);
    CHECK(ob_tfevents_close(&w) == 0 && !w);
    b = read_events(sub, path, sizeof path, &len);
    CHECK(b && decode(b, len, ev, 0) == 5);
    free(b);
    /* a directory that cannot exist: the error names it */
    char bad[800];
    snprintf(bad, sizeof bad, "%s/x", path); /* below a regular file */
    CHECK(ob_tfevents_open(&w, bad, 1, 0) != 0 && !w);
    CHECK(strstr(co_err_detail(), "TensorBoard directory") != NULL);
    t_remove_dir(dir);
}

static void test_tags(void) {
    char dir[300], path[700];
    REQUIRE(t_scratch_dir(dir, sizeof dir, "cohort-observe") == 0);
    ob_tb_options o = {.dir = dir, .log_interval = 2, .queue_size = 1000, .learning_rate = true, .loss_scale = false,
                       .validation_ppl = true, .world_size = true, .world = 4};
    ob_tb *tb = NULL;
    REQUIRE(ob_tb_open(&tb, &o) == 0);
    const char *recs[] = {
        "{\"iteration\":1,\"consumed_samples\":8,\"learning_rate\":1e-3,\"global_batch_size\":8,\"lm_loss\":6.5,"
        "\"loss_scale\":1.0,\"grad_norm\":0.5,\"skipped_iterations\":0,\"nan_iterations\":0}",
        "{\"iteration\":2,\"consumed_samples\":16,\"learning_rate\":2e-3,\"global_batch_size\":8,\"lm_loss\":6.25,"
        "\"loss_scale\":1.0,\"grad_norm\":0.25,\"skipped_iterations\":1,\"nan_iterations\":0}",
        "{\"evaluation\":\"valid\",\"iteration\":2,\"lm_loss\":6.0,\"lm_loss_ppl\":403.4}",
        "{\"evaluation\":\"test\",\"iteration\":2,\"lm_loss\":6.0,\"lm_loss_ppl\":403.4}",
        "{\"event\":\"straggler\",\"iteration\":2,\"rank\":3,\"score\":0.5}",
        "not json", "[1,2]", "{\"iteration\":3,\"lm_loss\":nan}",
        /* the trainer writes a non-finite number as a string (JSON has none) */
        "{\"iteration\":4,\"consumed_samples\":32,\"lm_loss\":\"nan\",\"grad_norm\":\"inf\"}",
    };
    for (size_t k = 0; k < sizeof recs / sizeof *recs; k++) CHECK(ob_tb_record(tb, recs[k], strlen(recs[k])) == 0);
    CHECK(ob_tb_close(&tb) == 0);
    size_t len;
    uint8_t *b = read_events(dir, path, sizeof path, &len);
    REQUIRE(b);
    Tensorboard__Event *ev[64] = {0};
    int n = decode(b, len, ev, 64);
    /* iteration 2 only (interval 2): learning-rate, skipped-train-samples, batch-size, lm loss,
     * world-size, grad-norm (each + vs samples) = 12, cohort/skipped-iterations and
     * cohort/nan-iterations 2 (no tokens_per_second in these records); validation 2 + 2 vs samples;
     * the straggler 1; loss-scale off; the test split not written; iteration 4: lm loss and
     * grad-norm and world-size, each + vs samples */
    CHECK_MSG(n == 1 + 14 + 4 + 1 + 6, "%d events", n);
    int found = 0;
    for (int k = 1; k < n && k < 64; k++) {
        Tensorboard__Summary__Value *v = ev[k]->summary->value[0];
        if (!strcmp(v->tag, "skipped-train-samples")) found += ev[k]->step == 2 && v->simple_value == 8.0f;
        if (!strcmp(v->tag, "lm loss vs samples")) found += ev[k]->step == 16 && v->simple_value == 6.25f;
        if (!strcmp(v->tag, "lm loss validation vs samples")) found += ev[k]->step == 16 && v->simple_value == 6.0f;
        if (!strcmp(v->tag, "lm loss validation ppl")) found += ev[k]->step == 2 && v->simple_value == 403.4f;
        if (!strcmp(v->tag, "world-size")) found += v->simple_value == 4.0f;
        if (!strcmp(v->tag, "cohort/straggler-score/rank-3")) found += v->simple_value == 0.5f;
        if (!strcmp(v->tag, "lm loss") && ev[k]->step == 4) found += isnan(v->simple_value);
        if (!strcmp(v->tag, "grad-norm") && ev[k]->step == 4) found += isinf(v->simple_value) && v->simple_value > 0;
        if (!strcmp(v->tag, "loss-scale")) found += 100;
    }
    CHECK_MSG(found == 9, "found %d", found); /* world-size twice */
    for (int k = 0; k < n && k < 64; k++) tensorboard__event__free_unpacked(ev[k], NULL);
    free(b);
    t_remove_dir(dir);
}

static void test_tee(void) {
    /* records written in pieces through the stream: the metrics file gets every byte, the
     * event file every complete line's tags (the last line without its newline too) */
    char dir[300], path[700], mpath[400];
    REQUIRE(t_scratch_dir(dir, sizeof dir, "cohort-observe") == 0);
    snprintf(mpath, sizeof mpath, "%s/m.jsonl", dir);
    ob_tb_options o = {.dir = dir, .log_interval = 1, .queue_size = 1};
    ob_tb *tb = NULL;
    REQUIRE(ob_tb_open(&tb, &o) == 0);
    FILE *mf = fopen(mpath, "w");
    REQUIRE(mf);
    FILE *t = ob_tee_open(mf, tb);
    REQUIRE(t);
    const char *a = "{\"iteration\":1,\"consumed_samples\":4,\"lm_loss\":2.5}\n{\"itera";
    const char *b = "tion\":2,\"consumed_samples\":8,\"lm_loss\":2.25}\n{\"event\":\"replay\",\"iteration\":2,\"replays\":1}";
    fputs(a, t);
    fflush(t);
    fputs(b, t);
    CHECK(fclose(t) == 0);
    size_t len;
    FILE *f = fopen(mpath, "r");
    REQUIRE(f);
    char buf[512] = {0};
    len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    CHECK(len == strlen(a) + strlen(b) && !strncmp(buf, a, strlen(a)) && !strcmp(buf + strlen(a), b));
    uint8_t *ev = read_events(dir, path, sizeof path, &len);
    REQUIRE(ev);
    Tensorboard__Event *e[16] = {0};
    /* 2 x (lm loss + vs samples) + cohort/replays */
    int n = decode(ev, len, e, 16);
    CHECK_MSG(n == 1 + 4 + 1, "%d events", n);
    if (n == 6) {
        CHECK(!strcmp(e[3]->summary->value[0]->tag, "lm loss") && e[3]->step == 2);
        CHECK(!strcmp(e[4]->summary->value[0]->tag, "lm loss vs samples") && e[4]->step == 8);
        CHECK(!strcmp(e[5]->summary->value[0]->tag, "cohort/replays") && e[5]->summary->value[0]->simple_value == 1);
    }
    for (int k = 0; k < n && k < 16; k++) tensorboard__event__free_unpacked(e[k], NULL);
    free(ev);
    t_remove_dir(dir);
}

int main(void) {
    RUN(test_crc32c_vectors);
    RUN(test_crc32c_slices);
    RUN(test_mask);
    RUN(test_frame);
    RUN(test_writer);
    RUN(test_tags);
    RUN(test_tee);
    return TEST_EXIT();
}
