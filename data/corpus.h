/* corpus.h - the embedded default training corpus: the licence texts every Debian machine
 * carries in /usr/share/common-licenses.
 *
 * Every regular file under the directory (recursively; file names sorted bytewise; a
 * symlink is followed only when its target is not already one of the included files) is
 * split into paragraphs (runs of non-blank lines; a blank line holds only spaces, tabs or
 * CR). Each paragraph (its lines joined by '\n', no trailing newline) is one document: one
 * sequence of byte tokens followed by TOK_BYTE_EOD, written with the indexed writer as
 * OUT_DIR/NAME.bin + .idx (uint16, vocabulary 257). */
#ifndef COHORT_DATA_CORPUS_H
#define COHORT_DATA_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#define CORPUS_DEFAULT_DIR "/usr/share/common-licenses"

typedef struct {
    char source_dir[256];   /* the directory read */
    int64_t files;          /* files read */
    int64_t documents;      /* paragraphs written */
    int64_t tokens;         /* tokens written, EODs included */
    double unigram_entropy; /* unigram entropy of the token distribution, nats per token */
} corpus_info;

/* Builds the corpus from src_dir (NULL = CORPUS_DEFAULT_DIR) into out_dir/name.{bin,idx}
 * (out_dir must exist). info may be NULL. CO_ENOENT (detail names the directory) when
 * src_dir or out_dir is missing; CO_EFORMAT when it holds no text. */
int corpus_build(const char *src_dir, const char *out_dir, const char *name, corpus_info *info);

/* The embedded default: creates workdir (mkdir -p) and builds CORPUS_DEFAULT_DIR into
 * workdir/common-licenses.{bin,idx} (rebuilt each call; the write is atomic). The data
 * prefix "workdir/common-licenses" is copied into prefix[prefix_size]. */
int corpus_build_default(const char *workdir, char *prefix, size_t prefix_size, corpus_info *info);

/* Unigram entropy in nats/token of counts[0..n) (0 when empty). */
double corpus_entropy(const int64_t *counts, int n);

#endif
