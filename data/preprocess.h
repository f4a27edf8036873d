/* preprocess.h - `cohort data preprocess`: JSONL text to Megatron .bin/.idx, as Megatron's
 * tools/preprocess_data.py writes them.
 *
 * Each input line is a JSON object; for every --json-keys key its value (a string, or a
 * list of strings = sentences) is tokenized: each non-empty sentence is one sequence, and
 * with append_eod the document's last sequence gets the EOD token (documents with no
 * tokens get none). Every line is one document of PREFIX_{key}_document.{bin,idx} (an
 * empty document still ends one), in input order whatever the number of workers. The
 * token dtype is Megatron's rule (uint16 when the vocabulary has fewer than 65500 entries,
 * else int32).
 *
 * Streaming and parallel: a reader cuts the input into batches of whole lines, `workers`
 * threads parse and tokenize batches, a writer appends them in input order; memory is
 * bounded by a few batches per worker. A line that is not a JSON object, lacks a key, or
 * whose value is not a string or a list of strings is malformed: an error naming the file
 * and line (CO_EFORMAT; nothing is written), or, with skip_malformed, skipped (no
 * document) and counted. Output files are written crash-safely (temporary + rename). */
#ifndef COHORT_DATA_PREPROCESS_H
#define COHORT_DATA_PREPROCESS_H

#include "data/tokenizer.h"

#include <stdint.h>
#include <stdio.h>

#define PP_MAX_KEYS 16

typedef struct {
    const char *input;         /* JSONL file ("-": standard input) */
    const char *output_prefix; /* writes OUTPUT_PREFIX_{key}_document.{bin,idx} */
    const char *keys[PP_MAX_KEYS];
    int nkeys;                 /* 0: "text" */
    int append_eod;
    int workers;               /* >= 1 */
    int skip_malformed;
    const tok_tokenizer *tok;
    FILE *progress;            /* a terminal to draw a progress bar on, or NULL */
} pp_options;

typedef struct {
    int64_t lines, documents, sequences, tokens, skipped;
    int64_t bytes;  /* input bytes read */
    double seconds; /* wall time */
    double worker_cpu_seconds; /* CPU time of the worker threads together (parse + tokenize) */
} pp_stats;

/* Runs the conversion. stats may be NULL. */
int pp_run(const pp_options *o, pp_stats *stats);

#endif
