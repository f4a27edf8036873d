/* sft.h - supervised fine-tuning data (--sft): JSONL chat conversations, tokenized with
 * the prompt masked out of the loss and packed to the sequence length.
 *
 * Input: one JSON object per line, {"messages": [{"role": "system"|"user"|"assistant",
 * "content": "..."}, ...]}. A conversation's token stream is, per message,
 *   encode("<|" role "|>\n") encode(content) encode("\n")
 * and an EOD at the end. Only the tokens of assistant contents count in the loss (and the
 * closing EOD when the last message is the assistant's, so the model learns to stop); the
 * headers, separators, system and user text are masked. Conversations longer than
 * seq_length+1 tokens are truncated (counted); those shorter than 2 tokens are dropped.
 *
 * The split string selects conversations as Megatron selects documents (round(b_s*N)).
 * Packing: a conversation of n tokens supplies n-1 (input, label) positions; conversations
 * fill sequences of seq_length positions in file order (next-fit: a conversation that does
 * not fit starts a new sequence; the rest is padding, masked, with label 0). Inside a
 * sequence each conversation's positions restart at 0 and seg[] holds the index of its first
 * position, so attention never crosses conversations.
 *
 * Order: with S packed sequences and R requested samples, E = ceil(R/S) epochs; epoch e is
 * arange(S) shuffled by numpy.random.RandomState(seed), one generator drawn through the
 * epochs in order; sample i is sequence order[i]. num_samples = E*S. A malformed line is
 * CO_EFORMAT naming the file and line. A zero-width split builds nothing (*out = NULL). */
#ifndef COHORT_DATA_SFT_H
#define COHORT_DATA_SFT_H

#include "data/tokenizer.h"

#include <stdint.h>

typedef struct sft_dataset sft_dataset;

typedef struct {
    int64_t conversations; /* in the split */
    int64_t truncated, dropped;
    int64_t sequences;     /* packed sequences S */
    int64_t tokens, loss_tokens;
} sft_info;

int sft_build(sft_dataset **out, const char *path, const tok_tokenizer *tok, const char *split, int split_index,
              int32_t seq_length, uint32_t seed, int64_t num_samples);
void sft_destroy(sft_dataset **d);
int64_t sft_num_samples(const sft_dataset *d);
void sft_get_info(const sft_dataset *d, sft_info *info);
/* Packed sequence order[i] (as gds_get; loss_mask, position_ids and seg may be NULL). */
int sft_get(const sft_dataset *d, int64_t i, int32_t *tokens, int32_t *labels, float *loss_mask,
            int32_t *position_ids, int32_t *seg);
/* The packed sequence sample i reads. */
int64_t sft_sequence_of(const sft_dataset *d, int64_t i);

#endif
