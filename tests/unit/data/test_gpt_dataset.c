/* test_gpt_dataset.c - split parsing, masks/positions/segments on a hand-built dataset,
 * mock source, API edge cases. (Exact sample order vs numpy: check_data.py order.) */
#include "common/error.h"
#include "data/gpt_dataset.h"
#include "data/indexed.h"
#include "tests/test.h"

#include <unistd.h>

static char tmpdir[256];

static void test_split(void) {
    double f[3], b[4];
    CHECK(gds_parse_split("98,1,1", f, b) == 0);
    CHECK(b[0] == 0 && b[1] == 0.98 && b[3] == 0.98 + 0.01 + 0.01);
    CHECK(gds_parse_split("1", f, b) == 0 && f[0] == 1 && f[1] == 0 && f[2] == 0);
    CHECK(gds_parse_split(" 949, 50, 1 ", f, b) == 0 && f[2] == 1.0 / 1000);
    CHECK(gds_parse_split("0.5,0.5", f, b) == 0 && f[0] == 0.5);
    const char *bad[] = {"", "1,2,3,4", "-1,2", "0,0,0", "a", "1,,2", "1,", "1;2", "inf"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(gds_parse_split(bad[i], f, b) == CO_EINVAL, "split '%s'", bad[i]);
        CHECK(strstr(co_err_detail(), "split") != NULL);
    }
    int64_t beg, end;
    /* Python round: 450.5 -> 450 (half to even), 1.5 -> 2 */
    CHECK(gds_split_range("1,1", 0, 901, &beg, &end) == 0 && beg == 0 && end == 450);
    CHECK(gds_split_range("1,1", 1, 901, &beg, &end) == 0 && beg == 450 && end == 901);
    CHECK(gds_split_range("1,1", 0, 3, &beg, &end) == 0 && end == 2);
    CHECK(gds_split_range("1,0,0", 1, 100, &beg, &end) == 1);
    CHECK(gds_split_range("98,1,1", 2, 1000, &beg, &end) == 0 && beg == 990 && end == 1000);
    CHECK(gds_split_range("949,50,1", 1, 1000, &beg, &end) == 0 && beg == 949 && end == 999);
}

static const int32_t E = 9;

static void check_ints(const int32_t *got, const int32_t *want, int n, const char *what) {
    for (int k = 0; k < n; k++) CHECK_MSG(got[k] == want[k], "%s[%d] = %d, want %d", what, k, got[k], want[k]);
}

static void test_masks(void) {
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/tiny", tmpdir);
    int32_t stream[] = {10, 11, E, 12, E, E, 13, 14, 15, E, 16, 17, 18, 19, 20, 21, 22, E};
    idx_writer *w;
    REQUIRE(idx_writer_new(&w, prefix, IDX_UINT16) == 0);
    REQUIRE(idx_writer_add_sequence(w, stream, 18) == 0);
    REQUIRE(idx_writer_end_document(w) == 0);
    REQUIRE(idx_writer_finish(&w) == 0);
    gds_config c;
    memset(&c, 0, sizeof c);
    c.data_prefix = prefix;
    c.split = "1";
    c.seq_length = 8;
    c.seed = 1;
    c.eod = E;
    c.vocab_size = 30;
    c.no_cache = 1;
    for (int flags = 0; flags < 2; flags++) {
        c.eod_mask_loss = c.reset_position_ids = c.reset_attention_mask = flags;
        gds_dataset *ds;
        REQUIRE(gds_build(&ds, &c, GDS_TRAIN, 2) == 0 && ds);
        CHECK(gds_num_samples(ds) == 2 && gds_num_epochs(ds) == 1);
        for (int64_t i = 0; i < 2; i++) {
            int64_t pos, off;
            REQUIRE(gds_sample_index_pair(ds, i, &pos, &off) == 0);
            CHECK(pos == 0 && (off == 0 || off == 8));
            int32_t tok[8], lab[8], pid[8], seg[8];
            float lm[8];
            REQUIRE(gds_get(ds, i, tok, lab, lm, pid, seg) == 0);
            check_ints(tok, stream + off, 8, "tokens");
            check_ints(lab, stream + off + 1, 8, "labels");
            int32_t lmi[8];
            for (int k = 0; k < 8; k++) lmi[k] = (int32_t)lm[k];
            if (!flags) {
                int32_t ones[8] = {1, 1, 1, 1, 1, 1, 1, 1}, ar[8] = {0, 1, 2, 3, 4, 5, 6, 7}, zero[8] = {0};
                check_ints(lmi, ones, 8, "loss_mask");
                check_ints(pid, ar, 8, "position_ids");
                check_ints(seg, zero, 8, "seg");
            } else if (off == 0) {
                int32_t m[8] = {1, 1, 0, 1, 0, 0, 1, 1}, p[8] = {0, 1, 2, 0, 1, 0, 0, 1}, s[8] = {0, 0, 0, 3, 3, 5, 6, 6};
                check_ints(lmi, m, 8, "loss_mask");
                check_ints(pid, p, 8, "position_ids");
                check_ints(seg, s, 8, "seg");
            } else {
                int32_t m[8] = {1, 0, 1, 1, 1, 1, 1, 1}, p[8] = {0, 1, 0, 1, 2, 3, 4, 5}, s[8] = {0, 0, 2, 2, 2, 2, 2, 2};
                check_ints(lmi, m, 8, "loss_mask");
                check_ints(pid, p, 8, "position_ids");
                check_ints(seg, s, 8, "seg");
            }
            CHECK(gds_get(ds, i, tok, lab, NULL, NULL, NULL) == 0);
        }
        int64_t a, b;
        int32_t t[8];
        CHECK(gds_sample_index_pair(ds, 2, &a, &b) == CO_ERANGE);
        CHECK(gds_get(ds, -1, t, t, NULL, NULL, NULL) == CO_ERANGE);
        gds_destroy(&ds);
        CHECK(ds == NULL);
    }
    /* zero-width split: no dataset; bad arguments are errors */
    gds_dataset *ds = (gds_dataset *)1;
    CHECK(gds_build(&ds, &c, GDS_VALID, 10) == 0 && ds == NULL);
    c.split = "1,1";
    CHECK(gds_build(&ds, &c, GDS_TRAIN, 10) == CO_EINVAL && ds == NULL); /* round(0.5) = 0: train empty */
    c.split = "1,0,0";
    c.seq_length = 0;
    CHECK(gds_build(&ds, &c, GDS_TRAIN, 10) == CO_EINVAL);
    c.seq_length = 8;
    c.split = "x";
    CHECK(gds_build(&ds, &c, GDS_TRAIN, 10) == CO_EINVAL);
    c.split = "1";
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing", tmpdir);
    c.data_prefix = missing;
    CHECK(gds_build(&ds, &c, GDS_TRAIN, 10) == CO_ENOENT && strstr(co_err_detail(), "missing.idx"));
    /* many epochs over a tiny dataset */
    c.data_prefix = prefix;
    REQUIRE(gds_build(&ds, &c, GDS_TRAIN, 100) == 0 && ds);
    CHECK(gds_num_epochs(ds) == 45 && gds_num_samples(ds) >= 100);
    gds_destroy(&ds);
}

static void test_mock(void) {
    gds_source *s;
    unsetenv("COHORT_TEST_MOCK_SEQUENCES"); /* Megatron's set (test_mock_sequences: the seam) */
    REQUIRE(gds_source_open_mock(&s, 1000, 999) == 0);
    CHECK(gds_source_num_sequences(s) == 100000);
    const int32_t *len = gds_source_lengths(s);
    /* numpy.random.default_rng(0).integers(1, 4096, size=5, dtype=numpy.int32) */
    CHECK(len[0] == 3484 && len[1] == 2609 && len[2] == 2094 && len[3] == 1105 && len[4] == 1261);
    int32_t t[4];
    CHECK(gds_source_read(s, 0, 998, 4, t) == 0 && t[0] == 999 && t[1] == 0 && t[2] == 1 && t[3] == 2);
    CHECK(gds_source_read(s, 3, 1103, 2, t) == 0 && t[0] == 1104 % 1000 && t[1] == 999);
    CHECK(gds_source_read(s, 3, 1104, 2, t) == CO_ERANGE);
    gds_source_close(&s);
    CHECK(s == NULL);
    CHECK(gds_source_open_mock(&s, 0, 0) == CO_EINVAL);
}

/* The test seam COHORT_TEST_MOCK_SEQUENCES=N: the first N of the same documents; a count
 * outside 1..100000 is refused naming the variable; empty means Megatron's 100,000. */
static void test_mock_sequences(void) {
    gds_source *full, *s;
    unsetenv("COHORT_TEST_MOCK_SEQUENCES");
    REQUIRE(gds_source_open_mock(&full, 1000, 999) == 0);
    setenv("COHORT_TEST_MOCK_SEQUENCES", "1000", 1);
    REQUIRE(gds_source_open_mock(&s, 1000, 999) == 0);
    CHECK(gds_source_num_sequences(s) == 1000);
    CHECK(!memcmp(gds_source_lengths(s), gds_source_lengths(full), 1000 * sizeof(int32_t)));
    int32_t a[4], b[4];
    int64_t last = gds_source_lengths(s)[999] - 1; /* its EOD */
    CHECK(gds_source_read(s, 999, last, 1, a) == 0 && gds_source_read(full, 999, last, 1, b) == 0 && a[0] == b[0]);
    CHECK(gds_source_read(s, 1000, 0, 1, a) != 0);
    gds_source_close(&s);
    const char *bad[] = {"0", "100001", "-3", "12x"};
    for (int i = 0; i < 4; i++) {
        setenv("COHORT_TEST_MOCK_SEQUENCES", bad[i], 1);
        CHECK_MSG(gds_source_open_mock(&s, 1000, 999) == CO_EINVAL && !s, "%s", bad[i]);
        CHECK_MSG(strstr(co_err_detail(), "COHORT_TEST_MOCK_SEQUENCES"), "%s", co_err_detail());
    }
    setenv("COHORT_TEST_MOCK_SEQUENCES", "", 1);
    REQUIRE(gds_source_open_mock(&s, 1000, 999) == 0);
    CHECK(gds_source_num_sequences(s) == 100000);
    gds_source_close(&s);
    unsetenv("COHORT_TEST_MOCK_SEQUENCES");
    gds_source_close(&full);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cohort-test-gds-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_split);
    RUN(test_masks);
    RUN(test_mock);
    RUN(test_mock_sequences);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return TEST_EXIT();
}
