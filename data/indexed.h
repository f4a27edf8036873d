/* indexed.h - Megatron's indexed dataset files, PREFIX.idx + PREFIX.bin (little-endian).
 *
 * .idx: 9-byte magic "MMIDIDX\0\0", u64 version = 1, u8 dtype code, u64 sequence_count,
 * u64 document_count (entries of the document array = documents + 1), then
 * int32[sequence_count] sequence lengths (tokens), int64[sequence_count] byte offsets of
 * each sequence in .bin, int64[document_count] document boundaries as sequence indices
 * (starting at 0, ending at sequence_count). (Multimodal files append int8 modes, which
 * are accepted and ignored.) .bin: the raw concatenated tokens.
 *
 * The reader validates everything before use (magic, version, dtype, counts against the
 * file size, monotone and cumulative pointers, document boundaries, .bin size); every
 * failure is CO_EFORMAT (or CO_ENOENT/CO_EIO for missing/unreadable files) with a detail
 * naming the file and the problem. The writer streams tokens and produces files
 * byte-identical to Megatron's IndexedDatasetBuilder for the same tokens. */
#ifndef COHORT_DATA_INDEXED_H
#define COHORT_DATA_INDEXED_H

#include <stddef.h>
#include <stdint.h>

enum {
    IDX_UINT8 = 1,
    IDX_INT8 = 2,
    IDX_INT16 = 3,
    IDX_INT32 = 4,
    IDX_INT64 = 5,
    IDX_FLOAT64 = 6,
    IDX_FLOAT32 = 7,
    IDX_UINT16 = 8,
};

/* Bytes per element of a dtype code, 0 for an unknown code. */
size_t idx_dtype_size(int dtype);
/* Megatron's writer rule: IDX_UINT16 when vocab_size < 65500, else IDX_INT32. */
int idx_dtype_for_vocab(int64_t vocab_size);

/* ---- reader ---- */

typedef struct idx_reader idx_reader;

/* Opens PREFIX.idx and PREFIX.bin (memory-mapped .bin). 0 or a negative CO_E* code. */
int idx_open(idx_reader **out, const char *prefix);
/* Unmaps and frees; sets *r = NULL. Safe on NULL. */
void idx_close(idx_reader **r);

int idx_dtype(const idx_reader *r);
int64_t idx_num_sequences(const idx_reader *r);
/* Number of documents (document_count - 1). */
int64_t idx_num_documents(const idx_reader *r);
/* Length in tokens of sequence i (0 <= i < idx_num_sequences). */
int32_t idx_sequence_length(const idx_reader *r, int64_t i);
/* All sequence lengths (idx_num_sequences entries, aligned copy owned by the reader). */
const int32_t *idx_sequence_lengths(const idx_reader *r);
/* The document boundaries (idx_num_documents + 1 entries). */
const int64_t *idx_document_indices(const idx_reader *r);
/* Copies n tokens of sequence i starting at token offset into out (converted to int32).
 * CO_ERANGE when [offset, offset+n) is outside the sequence or a value does not fit int32;
 * CO_EUNSUPPORTED for float dtypes. */
int idx_read(const idx_reader *r, int64_t i, int64_t offset, int64_t n, int32_t *out);

/* Checks that every token of the .bin lies in [0, vocab_size): one vectorised min/max scan
 * over the mapped file (blocks of 1M tokens), then, only when a block is out of range, a
 * search for the first bad token. CO_EFORMAT naming the .bin file, the document index, the
 * sequence and the id; CO_EUNSUPPORTED for float dtypes. vocab_size <= 0 checks nothing.
 * Cost: the file is read once (about a second per few GB from the page cache). */
int idx_check_vocab(const idx_reader *r, int64_t vocab_size);

/* ---- writer ---- */

typedef struct idx_writer idx_writer;

/* Starts writing PREFIX.bin.tmp (streamed) for the given dtype (integer codes only). */
int idx_writer_new(idx_writer **out, const char *prefix, int dtype);
/* Appends one sequence of n tokens (Megatron's add_item). CO_ERANGE when a token does not
 * fit the dtype. */
int idx_writer_add_sequence(idx_writer *w, const int32_t *tokens, size_t n);
/* Closes the current document (Megatron's end_document: appends the sequence count). */
int idx_writer_end_document(idx_writer *w);
/* Writes PREFIX.idx.tmp, fsyncs both, renames them to PREFIX.bin / PREFIX.idx, fsyncs the
 * directory, and frees the writer (*w = NULL) whatever the outcome. */
int idx_writer_finish(idx_writer **w);
/* Abandons the writer: removes the temporary files and frees it. Safe on NULL. */
void idx_writer_abort(idx_writer **w);

#endif
