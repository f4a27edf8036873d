/* spm.h - a C face for SentencePiece models (Debian's libsentencepiece, C++), what the
 * SentencePiece tokenizers of tokenizer.h stand on. Where the build found no
 * libsentencepiece, spm_available() is 0 and spm_load refuses with CO_EUNSUPPORTED.
 *
 * A loaded model is immutable and may be used by several threads at once. */
#ifndef COHORT_DATA_SPM_H
#define COHORT_DATA_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spm_model spm_model;

/* 1 when this build has SentencePiece. */
int spm_available(void);
/* Loads a .model file (SentencePiece's ModelProto). CO_ENOENT, CO_EFORMAT, CO_EUNSUPPORTED,
 * with a detail naming the file. */
int spm_load(spm_model **out, const char *path);
void spm_free(spm_model **m);
/* Number of pieces (ids 0 .. n-1). */
int32_t spm_piece_count(const spm_model *m);
/* The model's special ids (-1 when the model has none). */
int32_t spm_bos_id(const spm_model *m);
int32_t spm_eos_id(const spm_model *m);
int32_t spm_pad_id(const spm_model *m);
/* Id of the piece given as bytes, or -1 when no piece is exactly that. */
int32_t spm_piece_id(const spm_model *m, const char *piece, size_t n);
/* Writes piece id's text (at most cap bytes, NUL-terminated when cap > 0); returns its
 * length, or -1 for an id out of range. */
int64_t spm_id_to_piece(const spm_model *m, int32_t id, char *out, size_t cap);
/* SentencePiece's Encode (as Python's encode_as_ids: no bos or eos): at most cap ids written;
 * returns the number of ids of the full encoding, or a negative CO_E* code. */
int64_t spm_encode(const spm_model *m, const char *text, size_t len, int32_t *out, size_t cap);
/* SentencePiece's Decode (as decode_ids: control pieces decode to nothing): at most cap bytes
 * (NUL-terminated when cap > 0); returns the full length, or CO_EINVAL for an id out of range. */
int64_t spm_decode(const spm_model *m, const int32_t *ids, size_t n, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
