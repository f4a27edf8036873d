/* verify.h - every structural check of a Megatron indexed dataset (PREFIX.idx + .bin),
 * reporting which failed. The checks run in this order and the first failure is returned:
 *
 *   IDXV_OK         0  all checks passed
 *   IDXV_IDX_OPEN  10  PREFIX.idx missing or unreadable
 *   IDXV_HEADER    11  header shorter than 34 bytes, bad magic, version != 1, unknown dtype
 *   IDXV_IDX_SIZE  12  .idx size differs from what the counts imply (34 + 12*sequences +
 *                      8*document entries [+ sequences mode bytes])
 *   IDXV_SEQUENCES 13  a negative sequence length, or pointers not 0 and cumulative
 *                      (pointer[i+1] = pointer[i] + length[i]*itemsize)
 *   IDXV_DOCUMENTS 14  document index not starting at 0, decreasing, or not ending at the
 *                      sequence count (or no entries)
 *   IDXV_BIN_OPEN  15  PREFIX.bin missing or unreadable
 *   IDXV_BIN_SIZE  16  .bin size differs from the sum of lengths * itemsize
 *   IDXV_TOKENS    17  a token is negative or >= vocab_size (when vocab_size > 0), or a
 *                      float dtype holds a non-integer value
 *
 * These are also the exit statuses of `cohort data verify`. */
#ifndef COHORT_DATA_VERIFY_H
#define COHORT_DATA_VERIFY_H

#include <stddef.h>
#include <stdint.h>

enum {
    IDXV_OK = 0,
    IDXV_IDX_OPEN = 10,
    IDXV_HEADER = 11,
    IDXV_IDX_SIZE = 12,
    IDXV_SEQUENCES = 13,
    IDXV_DOCUMENTS = 14,
    IDXV_BIN_OPEN = 15,
    IDXV_BIN_SIZE = 16,
    IDXV_TOKENS = 17,
};

/* Runs the checks; msg receives a sentence naming the file and the problem (or a summary
 * on success). vocab_size <= 0 skips the upper bound of the token check. */
int idxv_verify(const char *prefix, int64_t vocab_size, char *msg, size_t msglen);

#endif
