/* test_tokenize.c - GPT-2's and TikTokenizer's pre-tokeniser rules, Unicode classes,
 * tiktoken's merge order on a tiny ranks file, blending arithmetic and the blend over-request
 * error, which need no vocabulary files (the id-for-id comparisons with the reference encoders
 * are the integration tests data_bpe_node and tok_*). */
#include "common/error.h"
#include "data/bpe.h"
#include "data/loader.h"
#include "data/tiktoken.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "tests/test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Splits s into pieces joined by '|'. */
static void pieces(const char *s, char *out, size_t cap) {
    size_t n = strlen(s), p = 0, w = 0;
    while (p < n) {
        size_t k = bpe_next_piece(s + p, n - p);
        if (w && w + 1 < cap) out[w++] = '|';
        for (size_t i = 0; i < k && w + 1 < cap; i++) out[w++] = s[p + i];
        p += k;
    }
    out[w] = '\0';
}

#define PIECES(in, want)                                                     \
    do {                                                                     \
        char got[256];                                                       \
        pieces(in, got, sizeof got);                                         \
        CHECK_MSG(!strcmp(got, want), "\"%s\": got \"%s\" want \"%s\"", in, got, want); \
    } while (0)

static void test_pieces(void) {
    PIECES("Hello world", "Hello| world");
    PIECES("it's we're I'll they'd 'x", "it|'s| we|'re| I|'ll| they|'d| '|x");
    PIECES("a  b", "a| | b");         /* the run keeps its last space for the word */
    PIECES("a   \n b", "a|   \n| b");
    PIECES("x \n\ny", "x| \n|\n|y");
    PIECES("end   ", "end|   ");      /* a run at the end is one piece */
    PIECES("abc123 456", "abc|123| 456");
    PIECES("foo(); bar", "foo|();| bar");
    PIECES(" !!", " !!");
    PIECES("''s", "''|s");
    PIECES("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87", "caf\xc3\xa9| \xe4\xb8\xad\xe6\x96\x87");
    PIECES("\xc2\xa0x", "\xc2\xa0|x");                      /* NBSP is \s; not " ?" */
    PIECES("a\xe2\x80\x8b" "b", "a|\xe2\x80\x8b|b");        /* U+200B is not \s */
    PIECES("\xf0\x9f\x98\x80\xf0\x9f\x98\x80 x", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80| x");
    PIECES("\xff\xfe" "a", "\xff\xfe|a");                   /* invalid UTF-8: "other" bytes */
}

/* TikTokenizer's pattern pat: s split into pieces joined by '|'. */
static void tt_pieces(int pat, const char *s, char *out, size_t cap) {
    size_t n = strlen(s), p = 0, w = 0;
    while (p < n) {
        size_t k = tt_next_piece(pat, s + p, n - p);
        if (w && w + 1 < cap) out[w++] = '|';
        for (size_t i = 0; i < k && w + 1 < cap; i++) out[w++] = s[p + i];
        p += k;
    }
    out[w] = '\0';
}

#define TT_PIECES(pat, in, want)                                             \
    do {                                                                     \
        char got[256];                                                       \
        tt_pieces(pat, in, got, sizeof got);                                 \
        CHECK_MSG(!strcmp(got, want), "v%d \"%s\": got \"%s\" want \"%s\"", pat, in, got, want); \
    } while (0)

/* the splits of Python's regex module with Megatron's patterns (tests/data/tiktoken_ref.py) */
static void test_tiktoken_pieces(void) {
    for (int v = TT_PATTERN_V1; v <= TT_PATTERN_V2; v++) {
        TT_PIECES(v, "Hello world", "Hello| world");
        TT_PIECES(v, "a  b", "a| | b");
        TT_PIECES(v, "x \n\ny", "x| \n\n|y");              /* \s*[\r\n]: up to the last newline */
        TT_PIECES(v, "(hello) 123", "(hello|)| |1|2|3");    /* any non-letter prefixes a word; one digit each */
        TT_PIECES(v, "don't", "don|'t");
        TT_PIECES(v, "a/b//\nc", "a|/b|//\n|c");
        TT_PIECES(v, "  \t\r\n  x", "  \t\r\n| | x");
        TT_PIECES(v, "end   ", "end|   ");
        TT_PIECES(v, "\xcc\x81" "abc", "\xcc\x81" "abc"); /* a combining mark prefixes the word */
    }
    TT_PIECES(TT_PATTERN_V1, "HTTPServer iPhone", "HTTPServer| iPhone");
    TT_PIECES(TT_PATTERN_V2, "HTTPServer iPhone", "HTTPServer| i|Phone"); /* v2 splits at case */
    TT_PIECES(TT_PATTERN_V1, "e\xcc\x81" "cole", "e|\xcc\x81" "cole");
    TT_PIECES(TT_PATTERN_V2, "e\xcc\x81" "cole", "e\xcc\x81" "cole");   /* marks are letters' parts in v2 */
    TT_PIECES(TT_PATTERN_V1, "Ab\xcc\x81" "C", "Ab|\xcc\x81" "C");
    TT_PIECES(TT_PATTERN_V2, "Ab\xcc\x81" "C", "Ab\xcc\x81|C");       /* U* W+ backtracks to the mark */
    CHECK(tt_class(0x0301) == TT_M && tt_class(0x01c5) == TT_LT && tt_class(0x0085) == TT_S);
    CHECK(tt_class(0xfeff) == TT_OTHER); /* White_Space, not JavaScript's \s */
}

/* tiktoken's merge order on ranks 0..255 = bytes, "ab" 256, "bc" 257, "abc" 258, and
 * Megatron's ids: 3 special tokens first (ids as tiktoken_ref.py gives them). */
static void test_tiktoken_merge(void) {
    char path[] = "/tmp/cohort-tt-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; b++) fprintf(f, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    fprintf(f, "YWI= 256\nYmM= 257\nYWJj 258\n"); /* ab, bc, abc */
    fclose(f);
    const char *sp[] = {"<unk>", "<s>", "</s>"};
    tok_options o = {.type = "TikTokenizer", .tokenizer_model = path, .tiktoken_pattern = "v1",
                     .tiktoken_num_special_tokens = 3, .tiktoken_special_tokens = sp, .n_tiktoken_special_tokens = 3};
    tok_tokenizer t;
    CHECK(tok_open_options(&t, &o) == 0);
    CHECK(tok_vocab_size(&t) == 262 && tok_eod(&t) == 2);
    int32_t ids[16];
    static const int32_t want[] = {123, 261, 260, 35, 261}; /* x abc bc " " abc */
    CHECK(tok_encode(&t, "xabcbc abc", 10, ids, 16) == 5);
    for (int i = 0; i < 5; i++) CHECK_MSG(ids[i] == want[i], "id %d: %d, want %d", i, ids[i], want[i]);
    char text[64];
    int32_t back[] = {1, 123, 261, 2};
    CHECK(tok_decode(&t, back, 4, text, sizeof text) == 11 && !strcmp(text, "<s>xabc</s>"));
    tok_close(&t);
    o.vocab_size = 263; /* a rank the file lacks */
    CHECK(tok_open_options(&t, &o) == CO_EFORMAT && strstr(co_err_detail(), "no rank 259"));
    unlink(path);
}

static void test_classes(void) {
    CHECK(uni_class('a') == UNI_LETTER && uni_class('7') == UNI_NUMBER && uni_class('\t') == UNI_SPACE);
    CHECK(uni_class(0x4e2d) == UNI_LETTER);   /* 中 */
    CHECK(uni_class(0x0663) == UNI_NUMBER);   /* Arabic-Indic three */
    CHECK(uni_class(0x2165) == UNI_NUMBER);   /* Roman numeral six (Nl) */
    CHECK(uni_class(0x00bd) == UNI_NUMBER);   /* one half (No) */
    CHECK(uni_class(0x3000) == UNI_SPACE && uni_class(0xfeff) == UNI_SPACE);
    CHECK(uni_class(0x0085) == UNI_OTHER);    /* NEL is not JavaScript \s */
    CHECK(uni_class(0x0301) == UNI_OTHER);    /* combining mark */
    CHECK(uni_class(0x1f600) == UNI_OTHER);
    uint32_t cp;
    CHECK(uni_decode((const unsigned char *)"\xed\xa0\x80", 3, &cp) == 1 && cp == 0xfffd); /* surrogate */
    CHECK(uni_decode((const unsigned char *)"\xc0\xaf", 2, &cp) == 1);                    /* overlong */
    CHECK(uni_decode((const unsigned char *)"\xf0\x9f\x98\x80", 4, &cp) == 4 && cp == 0x1f600);
}

static void test_blend(void) {
    double w[3] = {0.3, 0.5, 0.2};
    double s = dl_numpy_sum(w, 3);
    for (int i = 0; i < 3; i++) w[i] /= s;
    int16_t di[12];
    int64_t dsi[12], counts[3];
    dl_blend_indices(w, 3, 12, di, dsi, counts);
    /* numpy/helpers.cpp: 0.3*10 rounds to 3.0, so sample 10 is a three-way tie won by 0 */
    static const int16_t want[12] = {1, 0, 2, 1, 0, 1, 2, 1, 0, 1, 0, 1};
    for (int i = 0; i < 12; i++) CHECK_MSG(di[i] == want[i], "sample %d: dataset %d, want %d", i, di[i], want[i]);
    CHECK(counts[0] + counts[1] + counts[2] == 12 && dsi[11] == counts[1] - 1);
    CHECK(dl_check_request("x", 10, 10) == 0);
    CHECK(dl_check_request("--data-path (train split, dataset 1: B)", 11, 10) == CO_EINVAL);
    CHECK(strstr(co_err_detail(), "asks for 11 samples but the dataset has only 10") != NULL);
}

int main(void) {
    RUN(test_pieces);
    RUN(test_classes);
    RUN(test_tiktoken_pieces);
    RUN(test_tiktoken_merge);
    RUN(test_blend);
    return TEST_EXIT();
}
