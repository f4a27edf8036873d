/* test_indexed.c - indexed .bin/.idx reader validation and writer round-trip, md5, npy,
 * tokenizers, corpus. */
#include "common/error.h"
#include "data/corpus.h"
#include "data/indexed.h"
#include "data/md5.h"
#include "data/npy.h"
#include "data/tokenizer.h"
#include "tests/test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

static int read_file(const char *path, unsigned char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc((size_t)n + 1);
    *len = fread(*data, 1, (size_t)n, f);
    fclose(f);
    return 0;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

/* writes the reference dataset: documents {[1,2,3]}, {[4,5],[6]}, {[7,8,9,10]} as uint16 */
static int make_ref(const char *prefix) {
    idx_writer *w;
    int rc = idx_writer_new(&w, prefix, IDX_UINT16);
    if (rc) return rc;
    int32_t a[] = {1, 2, 3}, b[] = {4, 5}, c[] = {6}, d[] = {7, 8, 9, 10};
    rc = idx_writer_add_sequence(w, a, 3);
    rc |= idx_writer_end_document(w);
    rc |= idx_writer_add_sequence(w, b, 2);
    rc |= idx_writer_add_sequence(w, c, 1);
    rc |= idx_writer_end_document(w);
    rc |= idx_writer_add_sequence(w, d, 4);
    rc |= idx_writer_end_document(w);
    if (rc) {
        idx_writer_abort(&w);
        return rc;
    }
    return idx_writer_finish(&w);
}

static void test_roundtrip(void) {
    char prefix[300], path[320];
    path_of(prefix, sizeof prefix, "ref");
    REQUIRE(make_ref(prefix) == 0);
    snprintf(path, sizeof path, "%s.bin.tmp", prefix);
    CHECK(access(path, F_OK) != 0);
    idx_reader *r;
    REQUIRE(idx_open(&r, prefix) == 0);
    CHECK(idx_num_sequences(r) == 4);
    CHECK(idx_num_documents(r) == 3);
    CHECK(idx_dtype(r) == IDX_UINT16);
    CHECK(idx_sequence_length(r, 0) == 3 && idx_sequence_length(r, 3) == 4);
    const int64_t *docs = idx_document_indices(r);
    CHECK(docs[0] == 0 && docs[1] == 1 && docs[2] == 3 && docs[3] == 4);
    int32_t out[4];
    CHECK(idx_read(r, 3, 1, 3, out) == 0);
    CHECK(out[0] == 8 && out[1] == 9 && out[2] == 10);
    CHECK(idx_read(r, 1, 0, 2, out) == 0 && out[0] == 4 && out[1] == 5);
    CHECK(idx_read(r, 3, 2, 3, out) == CO_ERANGE);
    CHECK(idx_read(r, 4, 0, 1, out) == CO_ERANGE);
    CHECK(idx_read(r, -1, 0, 1, out) == CO_ERANGE);
    idx_close(&r);
    CHECK(r == NULL);

    /* int32 with large values, and range errors */
    path_of(prefix, sizeof prefix, "wide");
    idx_writer *w;
    REQUIRE(idx_writer_new(&w, prefix, idx_dtype_for_vocab(100000)) == 0);
    int32_t big[] = {70000, -5, 2147483647};
    CHECK(idx_writer_add_sequence(w, big, 3) == 0);
    CHECK(idx_writer_end_document(w) == 0);
    CHECK(idx_writer_finish(&w) == 0 && w == NULL);
    REQUIRE(idx_open(&r, prefix) == 0);
    CHECK(idx_dtype(r) == IDX_INT32);
    CHECK(idx_read(r, 0, 0, 3, out) == 0 && out[0] == 70000 && out[1] == -5 && out[2] == 2147483647);
    idx_close(&r);
    REQUIRE(idx_writer_new(&w, prefix, IDX_UINT16) == 0);
    CHECK(idx_writer_add_sequence(w, big, 1) == CO_ERANGE);
    CHECK(strstr(co_err_detail(), "70000") != NULL);
    idx_writer_abort(&w);
    CHECK(idx_writer_new(&w, prefix, 6) == CO_EINVAL);
    CHECK(idx_writer_new(&w, prefix, 99) == CO_EINVAL);
    CHECK(idx_dtype_for_vocab(257) == IDX_UINT16 && idx_dtype_for_vocab(65499) == IDX_UINT16);
    CHECK(idx_dtype_for_vocab(65500) == IDX_INT32 && idx_dtype_for_vocab(50257) == IDX_UINT16);
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x", tmpdir);
    CHECK(idx_writer_new(&w, bad, IDX_UINT16) == CO_ENOENT);
}

/* Copies the reference files to "mal", applies a change to .idx (or .bin) and opens. */
static unsigned char *ref_idx, *ref_bin;
static size_t ref_idx_len, ref_bin_len;

static int open_mal(const unsigned char *idx, size_t idx_len, const unsigned char *bin, size_t bin_len) {
    char prefix[300], p[320];
    path_of(prefix, sizeof prefix, "mal");
    snprintf(p, sizeof p, "%s.idx", prefix);
    write_file(p, idx, idx_len);
    snprintf(p, sizeof p, "%s.bin", prefix);
    write_file(p, bin, bin_len);
    idx_reader *r = NULL;
    int rc = idx_open(&r, prefix);
    idx_close(&r);
    return rc;
}

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

#define EXPECT_ERR(rc, code, sub)                                                                  \
    do {                                                                                           \
        int e__ = (rc);                                                                            \
        CHECK_MSG(e__ == (code), "got %s, detail: %s", co_err_name(e__), co_err_detail());         \
        CHECK_MSG(strstr(co_err_detail(), sub) != NULL, "detail '%s' lacks '%s'", co_err_detail(), \
                  sub);                                                                            \
        CHECK_MSG(strstr(co_err_detail(), "mal.") != NULL, "detail '%s' names no file", co_err_detail()); \
    } while (0)

static void test_malformed(void) {
    char prefix[300], p[320];
    path_of(prefix, sizeof prefix, "ref");
    snprintf(p, sizeof p, "%s.idx", prefix);
    REQUIRE(read_file(p, &ref_idx, &ref_idx_len) == 0);
    snprintf(p, sizeof p, "%s.bin", prefix);
    REQUIRE(read_file(p, &ref_bin, &ref_bin_len) == 0);
    REQUIRE(ref_idx_len == 34 + 12 * 4 + 8 * 4 && ref_bin_len == 20);
    CHECK(open_mal(ref_idx, ref_idx_len, ref_bin, ref_bin_len) == 0);
    unsigned char *m = malloc(ref_idx_len + 64);
#define RESET() memcpy(m, ref_idx, ref_idx_len)
    RESET();
    m[0] = 'X';
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "bad magic");
    RESET();
    put64(m + 9, 2);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "version 2");
    RESET();
    m[17] = 9;
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "unknown dtype code 9");
    RESET();
    EXPECT_ERR(open_mal(m, 20, ref_bin, ref_bin_len), CO_EFORMAT, "truncated header");
    EXPECT_ERR(open_mal(m, 0, ref_bin, ref_bin_len), CO_EFORMAT, "truncated header");
    RESET();
    put64(m + 18, 1000);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "counts larger than the file");
    RESET();
    put64(m + 18, UINT64_MAX);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "counts larger than the file");
    RESET();
    put64(m + 26, UINT64_MAX / 4);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "counts larger than the file");
    RESET();
    EXPECT_ERR(open_mal(m, ref_idx_len - 8, ref_bin, ref_bin_len), CO_EFORMAT, "counts larger than the file");
    RESET();
    memset(m + ref_idx_len, 0, 3);
    EXPECT_ERR(open_mal(m, ref_idx_len + 3, ref_bin, ref_bin_len), CO_EFORMAT, "does not match the counts");
    /* pointers start at 34 + 4*4 = 50: make pointer[2] go backwards */
    RESET();
    put64(m + 50 + 16, 2);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "pointer of sequence 2");
    RESET();
    m[34 + 4] = 0xff, m[34 + 5] = 0xff, m[34 + 6] = 0xff, m[34 + 7] = 0xff; /* length[1] = -1 */
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "negative length");
    RESET();
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len - 1), CO_EFORMAT, "too short");
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, 0), CO_EFORMAT, "too short");
    unsigned char longer[32] = {0};
    EXPECT_ERR(open_mal(m, ref_idx_len, longer, 22), CO_EFORMAT, "longer");
    /* document index at 34 + 12*4 = 82, 4 entries */
    RESET();
    put64(m + 82 + 24, 3);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "not at sequence_count 4");
    RESET();
    put64(m + 82, 1);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "starts at 1");
    RESET();
    put64(m + 82 + 8, 3), put64(m + 82 + 16, 2);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "not monotone");
    RESET();
    put64(m + 82 + 16, 9);
    EXPECT_ERR(open_mal(m, ref_idx_len, ref_bin, ref_bin_len), CO_EFORMAT, "not monotone");
    /* missing files */
    CHECK(open_mal(ref_idx, ref_idx_len, ref_bin, ref_bin_len) == 0);
    idx_reader *r = NULL;
    path_of(prefix, sizeof prefix, "mal");
    snprintf(p, sizeof p, "%s.bin", prefix);
    unlink(p);
    CHECK(idx_open(&r, prefix) == CO_ENOENT);
    CHECK(strstr(co_err_detail(), "mal.bin") != NULL);
    snprintf(p, sizeof p, "%s.idx", prefix);
    unlink(p);
    CHECK(idx_open(&r, prefix) == CO_ENOENT);
    CHECK(strstr(co_err_detail(), "mal.idx") != NULL);
    CHECK(r == NULL);
    /* every truncation and every single-byte corruption: an error or a valid open, never a crash */
    for (size_t n = 0; n < ref_idx_len; n++) CHECK(open_mal(ref_idx, n, ref_bin, ref_bin_len) < 0);
    int opened = 0;
    for (size_t i = 0; i < ref_idx_len; i++) {
        RESET();
        m[i] ^= 0x80;
        if (open_mal(m, ref_idx_len, ref_bin, ref_bin_len) == 0) opened++;
    }
    CHECK(opened == 0);
    free(m);
    free(ref_idx);
    free(ref_bin);
#undef RESET
}

static void test_md5(void) {
    char hex[33];
    md5_hex("", 0, hex);
    CHECK(!strcmp(hex, "d41d8cd98f00b204e9800998ecf8427e"));
    md5_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "900150983cd24fb0d6963f7d28e17f72"));
    const char *fox = "The quick brown fox jumps over the lazy dog";
    md5_hex(fox, strlen(fox), hex);
    CHECK(!strcmp(hex, "9e107d9d372bb6826bd81d3542a419d6"));
    const char *digits = "12345678901234567890123456789012345678901234567890123456789012345678901234567890";
    md5_hex(digits, strlen(digits), hex);
    CHECK(!strcmp(hex, "57edf4a22be3c955ac49da2e2107b67a"));
    /* incremental == one-shot */
    md5_ctx c;
    uint8_t d[16];
    md5_init(&c);
    for (size_t i = 0; i < strlen(digits); i += 7) md5_update(&c, digits + i, strlen(digits) - i < 7 ? strlen(digits) - i : 7);
    md5_final(&c, d);
    char hex2[33];
    for (int i = 0; i < 16; i++) snprintf(hex2 + 2 * i, 3, "%02x", d[i]);
    CHECK(!strcmp(hex2, "57edf4a22be3c955ac49da2e2107b67a"));
}

static void test_npy(void) {
    char p[300];
    path_of(p, sizeof p, "a.npy");
    int64_t data[6] = {1, -2, 3, 4, 5, 1LL << 40}, shape[2] = {3, 2};
    REQUIRE(npy_write(p, "<i8", 2, shape, data) == 0);
    unsigned char *raw;
    size_t len;
    REQUIRE(read_file(p, &raw, &len) == 0);
    CHECK(len == 128 + 48 && raw[127] == '\n' && !memcmp(raw, "\x93NUMPY\x01\x00", 8));
    free(raw);
    void *back;
    int64_t sh[2];
    REQUIRE(npy_read(p, "<i8", 2, sh, &back) == 0);
    CHECK(sh[0] == 3 && sh[1] == 2 && !memcmp(back, data, sizeof data));
    free(back);
    CHECK(npy_read(p, "<i4", 2, sh, &back) == CO_EFORMAT);
    CHECK(npy_read(p, "<i8", 1, sh, &back) == CO_EFORMAT);
    path_of(p, sizeof p, "missing.npy");
    CHECK(npy_read(p, "<i8", 1, sh, &back) == CO_ENOENT);
}

static void test_tokenizer(void) {
    tok_tokenizer t;
    tok_byte_init(&t);
    CHECK(tok_vocab_size(&t) == 257 && tok_eod(&t) == 256);
    const char *s = "h\xc3\xa9llo\n";
    int32_t ids[16];
    CHECK(tok_encode(&t, s, strlen(s), ids, 16) == 7);
    CHECK(ids[1] == 0xc3 && ids[6] == '\n');
    ids[7] = TOK_BYTE_EOD;
    char out[16];
    CHECK(tok_decode(&t, ids, 8, out, sizeof out) == 7 && !strcmp(out, s));
    ids[0] = 257;
    CHECK(tok_decode(&t, ids, 1, out, sizeof out) == CO_EINVAL);
    CHECK(tok_byte_encode("abc", 3, ids, 2) == 2 && ids[1] == 'b');
    ids[0] = 'x', ids[1] = 256, ids[2] = 'y';
    CHECK(tok_byte_decode(ids, 3, out, sizeof out) == 2 && out[0] == 'x' && out[1] == 'y');
    CHECK(tok_null_init(&t, 1000) == 0);
    CHECK(tok_vocab_size(&t) == 1001 && tok_eod(&t) == 1000);
    CHECK(tok_encode(&t, "5 17 999 1000", 13, ids, 16) == 4 && ids[3] == 1000);
    CHECK(tok_encode(&t, "5 1001", 6, ids, 16) == CO_EINVAL);
    CHECK(tok_encode(&t, "5 x", 3, ids, 16) == CO_EINVAL);
    ids[0] = 5, ids[1] = 17;
    CHECK(tok_decode(&t, ids, 2, out, sizeof out) == 4 && !strcmp(out, "5 17"));
    CHECK(tok_null_init(&t, 0) == CO_EINVAL);
}

static void test_corpus(void) {
    char src[300], p[400], out[300];
    path_of(src, sizeof src, "lic");
    path_of(out, sizeof out, "corpus_out");
    mkdir(src, 0777);
    mkdir(out, 0777);
    snprintf(p, sizeof p, "%s/B", src);
    write_file(p, "ab\ncd\n\n  \nef\n", 13);
    snprintf(p, sizeof p, "%s/A", src);
    write_file(p, "x\n\n\ny", 5);
    snprintf(p, sizeof p, "%s/C-link", src);
    CHECK(symlink("B", p) == 0);
    corpus_info info;
    REQUIRE(corpus_build(src, out, "c", &info) == 0);
    CHECK(info.files == 2 && info.documents == 4);
    /* A: "x" "y"; B: "ab\ncd" "ef"  -> tokens 2 + 2 + 6 + 3 = 13 */
    CHECK(info.tokens == 13);
    idx_reader *r;
    snprintf(p, sizeof p, "%s/c", out);
    REQUIRE(idx_open(&r, p) == 0);
    CHECK(idx_num_sequences(r) == 4 && idx_num_documents(r) == 4);
    int32_t tok[8];
    CHECK(idx_sequence_length(r, 2) == 6 && idx_read(r, 2, 0, 6, tok) == 0);
    CHECK(tok[0] == 'a' && tok[2] == '\n' && tok[4] == 'd' && tok[5] == TOK_BYTE_EOD);
    CHECK(idx_read(r, 0, 0, 2, tok) == 0 && tok[0] == 'x' && tok[1] == TOK_BYTE_EOD);
    idx_close(&r);
    /* entropy: counts over the 13 tokens */
    int64_t counts[257] = {0};
    const char *all = "xyab\ncdef";
    for (const char *c = all; *c; c++) counts[(unsigned char)*c]++;
    counts[256] = 4;
    CHECK_CLOSE(info.unigram_entropy, corpus_entropy(counts, 257), 1e-12, 0);
    CHECK(info.unigram_entropy > 2.0 && info.unigram_entropy < log(13.0));
    /* missing directories */
    snprintf(p, sizeof p, "%s/nope", tmpdir);
    CHECK(corpus_build(p, out, "c", &info) == CO_ENOENT && strstr(co_err_detail(), "nope") != NULL);
    CHECK(corpus_build(src, p, "c", &info) == CO_ENOENT && strstr(co_err_detail(), "nope") != NULL);
    /* the real default corpus, when this machine has it */
    struct stat st;
    if (stat(CORPUS_DEFAULT_DIR, &st) == 0) {
        char pfx[400];
        snprintf(p, sizeof p, "%s/work/sub", tmpdir);
        REQUIRE(corpus_build_default(p, pfx, sizeof pfx, &info) == 0);
        CHECK(info.documents > 100 && info.tokens > 10000);
        CHECK(info.unigram_entropy > 2.0 && info.unigram_entropy < 5.0);
        CHECK(idx_open(&r, pfx) == 0 && idx_num_documents(r) == info.documents);
        idx_close(&r);
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cohort-test-indexed-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_roundtrip);
    RUN(test_malformed);
    RUN(test_md5);
    RUN(test_npy);
    RUN(test_tokenizer);
    RUN(test_corpus);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return TEST_EXIT();
}
