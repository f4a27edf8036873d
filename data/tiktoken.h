/* tiktoken.h - Megatron's TikTokenizer (CustomTikTokenizer, the Llama 3 style tokenizer):
 * tiktoken's byte-pair encoding over a ranks file, in C.
 *
 * The ranks file (--tokenizer-model) is either tiktoken's own format (one "BASE64 RANK" line
 * per token, as Llama 3's tokenizer.model) or Megatron's JSON (a list of {"rank",
 * "token_bytes", "token_str"} objects, rank i at index i, the first 256 the single bytes).
 * Ids: the num_special special tokens first (--tiktoken-special-tokens, default "<unk>",
 * "<s>", "</s>", then "<SPECIAL_k>" fillers up to --tiktoken-num-special-tokens), then rank r
 * as id num_special + r; the vocabulary is --vocab-size (Megatron's default 131072) and only
 * the ranks below vocab_size - num_special are kept. eod = eos = the id of "</s>".
 *
 * Encoding is tiktoken's encode_ordinary (special tokens' text is ordinary text, no bos):
 * the text is split by Megatron's pattern v1 or v2 (PATTERN_TIKTOKEN, PATTERN_TIKTOKEN_V2),
 * matched by hand over the Unicode classes of tiktoken_tables.c; a piece that is a token is
 * that token, any other piece is merged from its bytes, lowest-ranked adjacent pair first
 * (leftmost on ties), as tiktoken's _byte_pair_merge. Bytes that are not UTF-8 are pieces of
 * class "other" (tiktoken never sees them: it takes text). */
#ifndef COHORT_DATA_TIKTOKEN_H
#define COHORT_DATA_TIKTOKEN_H

#include <stddef.h>
#include <stdint.h>

/* code-point classes of the patterns (tiktoken_tables.c, generated) */
enum { TT_OTHER = 0, TT_LU, TT_LL, TT_LT, TT_LM, TT_LO, TT_M, TT_N, TT_S };
typedef struct {
    uint32_t lo, hi; /* inclusive */
    uint8_t cls;
} tt_range;
extern const tt_range tt_ranges[];
extern const int tt_range_count;
extern const char tt_tables_source[];
int tt_class(uint32_t cp);

enum { TT_PATTERN_V1 = 1, TT_PATTERN_V2 = 2 };
#define TT_DEFAULT_VOCAB 131072 /* Megatron's fallback: 2**17 */

typedef struct {
    const char *path;
    int pattern;                 /* TT_PATTERN_V1 or _V2 */
    int64_t vocab_size;          /* <= 0: min(131072, num_special + the file's ranks) */
    int num_special;             /* --tiktoken-num-special-tokens */
    const char *const *special;  /* --tiktoken-special-tokens (NULL: <unk> <s> </s>) */
    int n_special;
} tt_options;

typedef struct tt_model tt_model;

/* Loads the ranks file and builds the vocabulary. CO_ENOENT/CO_EIO/CO_EFORMAT for the file,
 * CO_EINVAL for options Megatron refuses, each with one line naming the flag or file. */
int tt_load(tt_model **out, const tt_options *o);
void tt_free(tt_model **m);
int64_t tt_vocab_size(const tt_model *m);
int32_t tt_bos(const tt_model *m);
int32_t tt_eos(const tt_model *m);
/* encode_ordinary into at most cap ids; returns the full count or a negative CO_E* code. */
int64_t tt_encode(const tt_model *m, const char *text, size_t len, int32_t *out, size_t cap);
/* Decodes ids to bytes (special tokens to their text): at most cap bytes, NUL-terminated
 * when cap > 0; returns the full length or CO_EINVAL for an id out of range. */
int64_t tt_decode(const tt_model *m, const int32_t *ids, size_t n, char *out, size_t cap);
/* The pre-tokeniser alone: length in bytes of the pattern's match at text[0..len) (len > 0).
 * Exposed for tests. */
size_t tt_next_piece(int pattern, const char *text, size_t len);

#endif
