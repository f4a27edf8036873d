/* spm_none.c - spm.h where the build found no SentencePiece library: every model is refused
 * with one line saying how to get it. */
#include "data/spm.h"

#include "common/error.h"

struct spm_model {
    int unused;
};

int spm_available(void) { return 0; }

int spm_load(spm_model **out, const char *path) {
    *out = NULL;
    return co_err_set(CO_EUNSUPPORTED,
                      "--tokenizer-model %s: this cohort was built without SentencePiece: install "
                      "libsentencepiece-dev (deploy/setup.sh deps) and rebuild",
                      path);
}

void spm_free(spm_model **m) { *m = NULL; }
int32_t spm_piece_count(const spm_model *m) { (void)m; return 0; }
int32_t spm_bos_id(const spm_model *m) { (void)m; return -1; }
int32_t spm_eos_id(const spm_model *m) { (void)m; return -1; }
int32_t spm_pad_id(const spm_model *m) { (void)m; return -1; }

int32_t spm_piece_id(const spm_model *m, const char *piece, size_t n) {
    (void)m, (void)piece, (void)n;
    return -1;
}

int64_t spm_id_to_piece(const spm_model *m, int32_t id, char *out, size_t cap) {
    (void)m, (void)id, (void)out, (void)cap;
    return -1;
}

int64_t spm_encode(const spm_model *m, const char *text, size_t len, int32_t *out, size_t cap) {
    (void)m, (void)text, (void)len, (void)out, (void)cap;
    return co_err_set(CO_EUNSUPPORTED, "this cohort was built without SentencePiece");
}

int64_t spm_decode(const spm_model *m, const int32_t *ids, size_t n, char *out, size_t cap) {
    (void)m, (void)ids, (void)n, (void)out, (void)cap;
    return co_err_set(CO_EUNSUPPORTED, "this cohort was built without SentencePiece");
}
