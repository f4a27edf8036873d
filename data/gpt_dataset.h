/* gpt_dataset.h - Megatron's GPTDataset: sample order, index cache and items.
 *
 * Reproduces megatron/core/datasets/gpt_dataset.py + helpers.cpp exactly (see
 * shared/reference/megatron-facts.md §2):
 *  - the split string ("98,1,1", "949,50,1", "1,0,0"; 1-3 non-negative numbers with a
 *    positive sum, padded with zeros) is normalised into book-ends; split s covers sequence
 *    indices round(b_s*N) .. round(b_{s+1}*N) (Python round, half to even), N = number of
 *    sequences of the low-level dataset (Megatron's numel_low_level_dataset);
 *  - num_epochs E = smallest E with E*T >= num_samples*L + 1 (T = tokens of the split);
 *  - separate_final_epoch (E > 1 and the last epoch's samples < int(0.80*samples_per_epoch));
 *  - ONE numpy RandomState(seed) shuffles, in order, the document index (int32, the split's
 *    documents tiled E times; first E-1 epochs and the last separately when separate), then
 *    the shuffle index (uint32, int64 when large; [0, sans_final) and the rest separately);
 *  - the sample index ((E*T-1)//L + 1 rows of (document index position, token offset);
 *    int32 unless the document index is longer than INT32_MAX, then int64).
 *
 * Index cache (Megatron's layout): DIR/{md5 of a JSON description}-GPTDataset-{train|valid|
 * test}-{document_index|sample_index|shuffle_index}.npy and ...-description.txt, where DIR
 * is cfg.cache_dir when set, else PREFIX/cache/GPTDataset_indices (a directory named like
 * the prefix, as Megatron does). Mock data without cache_dir is not cached (as Megatron).
 * Files are written crash-safely (tmp + fsync + rename + directory fsync) as real .npy files;
 * when present they are loaded and validated (a bad or inconsistent cache is rebuilt and
 * rewritten, never trusted).
 *
 * Items (Megatron __getitem__ with add_extra_token_to_sequence): sample j = shuffle[i]
 * spans sample_index[j] .. sample_index[j+1] inclusive (L+1 tokens, padded with -1 when
 * short); tokens = text[:-1], labels = text[1:]; loss_mask 0 where the label is padding and,
 * with eod_mask_loss, where the token (input) is EOD; position_ids restart at 0 after each
 * EOD with reset_position_ids; seg[p] = index of the first position of token p's document
 * within the sample (previous EOD position + 1) with reset_attention_mask, else 0: position
 * q may attend to k iff seg[q] <= k <= q. Padding tokens/labels are returned as 0. */
#ifndef COHORT_DATA_GPT_DATASET_H
#define COHORT_DATA_GPT_DATASET_H

#include <stddef.h>
#include <stdint.h>

/* ---- low-level source: an indexed file or MockGPTDataset's synthetic documents ---- */

typedef struct gds_source gds_source;

/* Opens PREFIX.idx/.bin (see indexed.h). */
int gds_source_open_indexed(gds_source **out, const char *prefix);
/* MockGPTLowLevelDataset: 100,000 documents with lengths
 * numpy.random.default_rng(0).integers(1, 4096, dtype=int32); document k of length n is
 * (arange(n-1)+1) % vocab_size followed by eod. vocab_size must be > 0. */
int gds_source_open_mock(gds_source **out, int64_t vocab_size, int32_t eod);
/* Every token of an indexed source in [0, vocab_size) (idx_check_vocab: CO_EFORMAT naming
 * the file, the document and the id); a mock source is in range by construction. */
int gds_source_check_vocab(const gds_source *s, int64_t vocab_size);
void gds_source_close(gds_source **s);
int64_t gds_source_num_sequences(const gds_source *s);
const int32_t *gds_source_lengths(const gds_source *s);
/* Copies n tokens of sequence seq from offset into out. */
int gds_source_read(const gds_source *s, int64_t seq, int64_t offset, int64_t n, int32_t *out);

/* ---- split strings ---- */

/* Parses "98,1,1" into normalised fractions frac[3] and book-ends bookends[4]
 * (bookends[0] = 0, bookends[i+1] = bookends[i] + frac[i], as Megatron computes them).
 * CO_EINVAL unless 1-3 non-negative numbers with a positive sum. */
int gds_parse_split(const char *split, double frac[3], double bookends[4]);
/* Sequence range [*beg, *end) of split s (0 train, 1 valid, 2 test) over n sequences;
 * returns 1 when the split has zero width (no dataset), 0 otherwise, <0 on error. */
int gds_split_range(const char *split, int s, int64_t n, int64_t *beg, int64_t *end);

/* ---- dataset ---- */

enum { GDS_TRAIN = 0, GDS_VALID = 1, GDS_TEST = 2 };

typedef struct {
    union {                     /* PREFIX of PREFIX.idx/.bin (ignored when mock); */
        const char *data_prefix; /* both names refer to the same field */
        const char *prefix;
    };
    int mock;                /* 1: MockGPTDataset source instead of data_prefix */
    const char *split;       /* "98,1,1"; NULL means "1,0,0" */
    int32_t seq_length;      /* L > 0 */
    uint32_t seed;           /* RandomState seed (--seed) */
    int32_t eod;             /* EOD token id */
    int64_t vocab_size;      /* mock token modulus; recorded in the description; gds_build
                                refuses an indexed file with a token outside [0, vocab_size)
                                (checked when it opens the file; <= 0: not checked) */
    int eod_mask_loss;
    int reset_position_ids;
    int reset_attention_mask;
    const char *cache_dir; /* --data-cache-path; NULL: PREFIX/cache/GPTDataset_indices */
    int no_cache;          /* 1: neither read nor write the index cache */
} gds_config;

typedef struct gds_dataset gds_dataset;

/* Builds (or loads from the cache) split split_index's dataset for num_samples requested
 * samples (the caller computes train_iters*global_batch etc.). A zero-width split builds no
 * dataset: returns 0 with *out = NULL. A split whose range holds no sequences or no tokens
 * is CO_EINVAL. Cache write failures are returned as errors (set no_cache to avoid). */
int gds_build(gds_dataset **out, const gds_config *cfg, int split_index, int64_t num_samples);
/* As gds_build over a source the caller opened (not owned; must outlive the dataset).
 * dataset_path names the data in the description (NULL for mock). */
int gds_build_from_source(gds_dataset **out, const gds_config *cfg, gds_source *src,
                          const char *dataset_path, int split_index, int64_t num_samples);
void gds_destroy(gds_dataset **ds);

/* Number of samples available: len(shuffle_index) = (E*T-1)//L (>= requested). */
int64_t gds_num_samples(const gds_dataset *ds);
int64_t gds_num_epochs(const gds_dataset *ds);
int gds_separate_final_epoch(const gds_dataset *ds);
int32_t gds_seq_length(const gds_dataset *ds);
/* 1 when the indices were loaded from the cache, 0 when built. */
int gds_loaded_from_cache(const gds_dataset *ds);
/* Path prefix of the cache files (".../{hash}-GPTDataset-{split}-"), or NULL if uncached. */
const char *gds_cache_prefix(const gds_dataset *ds);

/* (document index position, token offset) of the i-th sample after shuffling:
 * sample_index[shuffle[i]]. CO_ERANGE when i is out of range. */
int gds_sample_index_pair(const gds_dataset *ds, int64_t i, int64_t *doc_pos, int64_t *offset);

/* Raw indices (read-only views, valid until gds_destroy). */
const int32_t *gds_document_index(const gds_dataset *ds, int64_t *n);
/* num_samples+1 rows of 2 entries, row-major. */
const int64_t *gds_sample_index(const gds_dataset *ds, int64_t *rows);
const int64_t *gds_shuffle_index(const gds_dataset *ds, int64_t *n);

/* Item i (0 <= i < gds_num_samples), each output of seq_length entries. tokens and labels
 * are required; loss_mask, position_ids and seg may be NULL. Thread-safe (reads only). */
int gds_get(const gds_dataset *ds, int64_t i, int32_t *tokens, int32_t *labels, float *loss_mask,
            int32_t *position_ids, int32_t *seg);

#endif
