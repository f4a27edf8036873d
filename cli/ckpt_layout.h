/* ckpt_layout.h - a checkpoint rewritten in another parallel layout (`cohort ckpt convert
 * --to cohort`, ckpt_layout.c). */
#ifndef COHORT_CLI_CKPT_LAYOUT_H
#define COHORT_CLI_CKPT_LAYOUT_H

#include "checkpoint/format.h"

#include <stddef.h>

/* Reads every tensor of the checkpoint in dir (manifest m) and saves it into the save
 * directory save_dir (iter_N and the tracker, created) as a job of tp tensor-parallel x dp
 * data-parallel ranks writes it: tp x dp shard files per kind, each tensor rank's slices
 * over its dp writers, the padded vocabulary of that tensor-parallel size. note gets a line
 * when the padded vocabulary changed ("" otherwise). CO_EINVAL (with the detail) when the
 * model does not split over tp ranks or save_dir already holds that iteration. */
int cli_ckpt_relayout(const char *dir, const ck_manifest *m, int tp, int dp, const char *save_dir, char *note,
                      size_t note_len);

#endif
