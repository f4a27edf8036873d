/* loader.h - the datasets a training run reads, behind one interface: a single GPTDataset
 * (or MockGPTDataset), a weighted blend of them (Megatron's BlendedDataset), per-split
 * blends (--train-data-path/--valid-data-path/--test-data-path) and SFT conversations.
 *
 * Blending (megatron-facts.md §3, blended_dataset.py + helpers.cpp): "W1 P1 W2 P2 ..." with
 * weights normalised as numpy does (w / numpy.sum(w)); dataset i is built for
 * ceil(ceil(R*w_i)*1.005) samples of the split (R requested); output sample s picks
 * i = argmax_i (w_i*max(s,1) - count_i) (first index wins ties), records (i, count_i) and
 * increments count_i. A dataset asked for more samples than it has is CO_EINVAL. With
 * --data-cache-path the two indices are cached as
 * DIR/BlendedDataset_indices/{md5 of the description}-BlendedDataset-{split}-
 * {dataset_index (int16)|dataset_sample_index (int64)}.npy + -description.txt, validated
 * when loaded. A single prefix ("P" or "W P") is a plain GPTDataset without blending.
 *
 * Per-split paths: split s reads only its own list (missing list: no dataset for s), and
 * every dataset of that list is used whole for s (Megatron's split spoof (0,1)).
 *
 * SFT (sft.h): each prefix is a JSONL file of conversations; blends work as above. */
#ifndef COHORT_DATA_LOADER_H
#define COHORT_DATA_LOADER_H

#include "data/gpt_dataset.h"
#include "data/tokenizer.h"

#include <stdint.h>

typedef struct {
    gds_config base;               /* split, seq_length, seed, eod, vocab, masks, cache, mock */
    char *const *data_path;        /* --data-path list ("P" or "W1 P1 W2 P2 ...") */
    int n_data_path;
    char *const *split_path[3];    /* --train/valid/test-data-path lists */
    int n_split_path[3];
    int sft;                       /* data files are SFT JSONL */
    const tok_tokenizer *tok;      /* the tokenizer (SFT only) */
} dl_config;

typedef struct dl_dataset dl_dataset;

/* Builds split s's dataset for num_samples requested samples. *out = NULL (returns 0) when
 * the split has no data (zero-width split or no per-split list). */
int dl_build(dl_dataset **out, const dl_config *cfg, int split, int64_t num_samples);
void dl_destroy(dl_dataset **d);
int64_t dl_num_samples(const dl_dataset *d);
/* Number of datasets in the blend (1 when not blended) and the prefix of dataset i. */
int dl_num_datasets(const dl_dataset *d);
const char *dl_dataset_path(const dl_dataset *d, int i);
/* Where sample i comes from: the dataset, the sample of that dataset, and for GPTDatasets
 * the (document index position, offset) of its start (-1, -1 for SFT). */
int dl_origin(const dl_dataset *d, int64_t i, int *dataset, int64_t *sample, int64_t *doc_pos, int64_t *offset);
/* 1 when the blend indices were loaded from the cache. */
int dl_loaded_from_cache(const dl_dataset *d);
/* Item i, as gds_get (seg is always filled for SFT). Thread-safe. */
int dl_get(const dl_dataset *d, int64_t i, int32_t *tokens, int32_t *labels, float *loss_mask, int32_t *position_ids,
           int32_t *seg);

/* The greedy blending of §3 alone: fills dataset_index[size], dataset_sample_index[size]
 * for n normalised weights; counts[n] receives the per-dataset totals. */
void dl_blend_indices(const double *weights, int n, int64_t size, int16_t *dataset_index,
                      int64_t *dataset_sample_index, int64_t *counts);
/* The over-request check of a blend: CO_EINVAL (detail starts with what) when a dataset
 * is asked for more samples than it has. */
int dl_check_request(const char *what, int64_t asked, int64_t available);
/* numpy's float64 sum (pairwise for n >= 8), used to normalise weights as Megatron does. */
double dl_numpy_sum(const double *a, int n);

#endif
