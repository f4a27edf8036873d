/* ckpt_parts.h - the parts of a checkpoint a rank lists (ckpt_parts.c): to save, every model
 * shard's parts (one plan for all ranks), with data where this rank holds it; to load, this
 * rank's own parts. */
#ifndef COHORT_WORKER_CKPT_PARTS_H
#define COHORT_WORKER_CKPT_PARTS_H

#include "checkpoint/ckpt.h"
#include "train/trainer.h"

/* A list of parts: the model's first (nmodel of them), then the Adam moments. */
typedef struct wk_parts {
    ck_tensor_ref *r;
    char (*names)[CK_NAME_MAX];
    int n, cap, nmodel;
} wk_parts;

/* Fills save and load for rank `rank` of `world` ranks training t, and *writer_group
 * (malloc'ed, [world]: each writer's shard, tensor rank + tensor size x pipeline rank) with
 * *groups shards. CO_EINTERNAL when the rank's coordinates disagree with the layout. */
int wk_parts_build(trainer *t, int world, int rank, wk_parts *save, wk_parts *load, int **writer_group, int *groups);
void wk_parts_free(wk_parts *l);

#endif
