/* tokenizer.h - cohort's tokenizers behind one interface (--tokenizer-type):
 *
 *  - GPT2BPETokenizer (the default): GPT-2's byte-level BPE (bpe.h) from --vocab-file and
 *    --merge-file (encoder.json, vocab.bpe), found by bpe_default_files when not given;
 *    vocabulary 50257, eod = id of "<|endoftext|>" (50256).
 *  - byte: ids 0..255 are the bytes, TOK_BYTE_EOD = 256 is the end-of-document token,
 *    vocabulary size 257.
 *  - null: Megatron's _NullTokenizer (--tokenizer-type NullTokenizer --vocab-size V): text is
 *    space-separated integer ids; eod = V and the reported vocab_size is V + 1 (Megatron's
 *    _NullTokenizer sets _eod_id = vocab_size and returns vocab_size + 1 from its property),
 *    so ids 0..V-1 are ordinary tokens and V is EOD.
 *  - SentencePiece (spm.h, --tokenizer-model FILE.model), Megatron's three wrappers:
 *    SentencePieceTokenizer: the model's pieces, then the special tokens <CLS> <SEP> <EOD>
 *    <MASK> and the pad, bos and eos pieces (<PAD> <BOS> <EOS> where the model has none),
 *    each added at the next id unless it is a piece already; eod = <EOD>; a special token's
 *    text in the input encodes to its id (the earliest match first), the text between
 *    through SentencePiece; decode puts " TOKEN " for a special id.
 *    GPTSentencePieceTokenizer: the pieces only, eod = the model's eos.
 *    Llama2Tokenizer: the pieces only, eod = eos, and encode starts every text with bos
 *    (Megatron's tokenize(bos=True), so preprocessing gives each document a bos).
 *  - TikTokenizer (tiktoken.h): special tokens, then the ranks; eod = "</s>".
 * Every vocabulary is padded as Megatron pads (trainer: to a multiple of
 * --make-vocab-size-divisible-by x tensor-parallel size). */
#ifndef COHORT_DATA_TOKENIZER_H
#define COHORT_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define TOK_BYTE_EOD 256
#define TOK_BYTE_VOCAB 257

enum { TOK_BYTE = 1, TOK_NULL = 2, TOK_GPT2 = 3, TOK_SPM = 4, TOK_TIKTOKEN = 5 };
/* the SentencePiece wrappers (tok_tokenizer.spm_kind) */
enum { TOK_SPM_PLAIN = 1, TOK_SPM_GPT = 2, TOK_SPM_LLAMA2 = 3 };
#define TOK_SPM_SPECIALS 7

struct bpe_model;
struct spm_model;
struct tt_model;
struct co_config;

typedef struct {
    int kind;
    int64_t vocab_size; /* ids are 0 .. vocab_size-1, EOD included */
    int32_t eod;
    struct bpe_model *bpe; /* TOK_GPT2 only (owned) */
    int32_t bos;           /* -1: none */
    int add_bos;           /* encode starts with bos (Llama2Tokenizer) */
    int spm_kind;
    struct spm_model *spm; /* TOK_SPM (owned) */
    struct tt_model *tt;   /* TOK_TIKTOKEN (owned) */
    /* SentencePieceTokenizer's special tokens in Megatron's order (text, id) */
    int n_special;
    char *special_text[TOK_SPM_SPECIALS];
    int32_t special_id[TOK_SPM_SPECIALS];
} tok_tokenizer;

/* Everything a tokenizer may be opened with (the flags of the same names). */
typedef struct {
    const char *type;            /* --tokenizer-type */
    int64_t vocab_size;          /* --vocab-size (NullTokenizer; TikTokenizer: <= 0 for its default) */
    const char *vocab_file;      /* GPT-2's (NULL or "": the defaults) */
    const char *merge_file;
    const char *tokenizer_model; /* --tokenizer-model */
    const char *tiktoken_pattern;             /* "v1" | "v2" */
    int tiktoken_num_special_tokens;          /* < 0: Megatron's 1000 */
    const char *const *tiktoken_special_tokens; /* NULL: <unk> <s> </s> */
    int n_tiktoken_special_tokens;
} tok_options;

/* Opens any tokenizer type; CO_EINVAL with one line for a missing or wrong flag. */
int tok_open_options(tok_tokenizer *t, const tok_options *o);
/* The same from a configuration's flags (--tokenizer-type, --vocab-size, --vocab-file,
 * --merge-file, --tokenizer-model, --tiktoken-*). */
int tok_open_config(tok_tokenizer *t, const struct co_config *c);

/* Opens the tokenizer named by type ("GPT2BPETokenizer", "ByteLevelTokenizer",
 * "NullTokenizer"; the types that need --tokenizer-model take tok_open_options);
 * vocab_size_arg is NullTokenizer's --vocab-size; vocab_file/merge_file
 * (NULL or "" for the defaults) are GPT-2's. CO_EINVAL for an unknown type, file errors
 * from bpe_load. Release with tok_close. */
int tok_open(tok_tokenizer *t, const char *type, int64_t vocab_size_arg, const char *vocab_file,
             const char *merge_file);
void tok_close(tok_tokenizer *t);

/* A per-thread encoding context (GPT-2: a piece cache; other kinds: nothing). */
typedef struct tok_session tok_session;
int tok_session_new(tok_session **out, const tok_tokenizer *t);
void tok_session_free(tok_session **s);
/* As tok_encode, through the session's cache. */
int64_t tok_session_encode(tok_session *s, const char *text, size_t len, int32_t *out, size_t cap);

/* Byte-level tokenizer (never fails, needs no tok_close). */
void tok_byte_init(tok_tokenizer *t);
/* NullTokenizer with --vocab-size V (V >= 1): vocab_size = V + 1, eod = V. */
int tok_null_init(tok_tokenizer *t, int64_t vocab_size_arg);
static inline int64_t tok_vocab_size(const tok_tokenizer *t) { return t->vocab_size; }
static inline int32_t tok_eod(const tok_tokenizer *t) { return t->eod; }

/* Encodes len bytes of text into at most cap ids (EOD is not appended; Llama2Tokenizer's
 * bos is prepended, as Megatron's tokenize does). Returns the number
 * of ids the full encoding has (may exceed cap: then only cap were written), or a negative
 * CO_E* code (null tokenizer: CO_EINVAL for a word that is not an id in range). */
int64_t tok_encode(const tok_tokenizer *t, const char *text, size_t len, int32_t *out, size_t cap);
/* Decodes n ids into at most cap bytes (NUL-terminated when cap > 0). GPT-2: EOD decodes to
 * "<|endoftext|>" (as the reference encoder). SentencePiece: as Megatron's detokenize
 * (SentencePiece's decode; control pieces such as bos and eos decode to nothing).
 * TikTokenizer: special tokens decode to their text. byte: EOD decodes to
 * nothing; null: ids joined by single spaces. Returns the full decoded length (excluding
 * the NUL) or CO_EINVAL for an id out of range. */
int64_t tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap);

/* Byte tokenizer shortcuts: encode writes min(len, cap) ids and returns that count;
 * decode writes at most cap bytes (no NUL), skipping EOD and ids above 255, and returns
 * the number of bytes written. */
int tok_byte_encode(const char *text, size_t len, int32_t *out, int cap);
size_t tok_byte_decode(const int32_t *ids, int n, char *out, size_t cap);

#endif
