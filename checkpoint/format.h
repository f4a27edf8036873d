/* format.h - the on-disk formats of a checkpoint, parsed as hostile input: safetensors
 * shard headers and the versioned JSON manifest (docs/checkpoints.md).
 *
 * Nothing here touches the model, the trainer or the file system: parsers take bytes and
 * return a validated structure or CO_EFORMAT with a sentence naming what was wrong, so the
 * fuzz targets (tests/fuzz/) link this file alone. */
#ifndef COHORT_CHECKPOINT_FORMAT_H
#define COHORT_CHECKPOINT_FORMAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_FORMAT_NAME "cohort-checkpoint"
#define CK_FORMAT_VERSION 1
#define CK_MAX_DIMS 4
#define CK_NAME_MAX 128                   /* tensor and file names, NUL included */
#define CK_ST_MAX_HEADER (100u << 20)     /* safetensors' own limit on the JSON header */
#define CK_MANIFEST_MAX (256u << 20)      /* refuse larger manifests before parsing */
#define CK_MANIFEST_NAME "manifest.json"
#define CK_TRACKER_NAME "latest_checkpointed_iteration.txt"

/* safetensors dtypes */
typedef enum {
    CK_DT_F64, CK_DT_F32, CK_DT_F16, CK_DT_BF16, CK_DT_I64, CK_DT_I32, CK_DT_I16, CK_DT_I8,
    CK_DT_U8, CK_DT_BOOL, CK_DT_COUNT
} ck_dtype;
const char *ck_dtype_name(int dt);          /* "F32" */
int ck_dtype_parse(const char *s);          /* -1 if unknown */
size_t ck_dtype_size(int dt);

/* Tensor kinds: model weights (HF-readable shard) and optimizer state. */
typedef enum { CK_KIND_MODEL = 0, CK_KIND_OPTIM = 1 } ck_kind;

/* A tensor or file name is safe: 1..127 bytes of [A-Za-z0-9._-#:] (file names: no '#' ':'),
 * not "." or "..". */
bool ck_name_ok(const char *s, bool file);

/* ---- safetensors --------------------------------------------------------------------- */

typedef struct ck_st_entry {
    char name[CK_NAME_MAX];
    int dtype;
    int ndim;
    int64_t shape[CK_MAX_DIMS];
    uint64_t begin, end;       /* byte range in the data section */
} ck_st_entry;

typedef struct ck_st_header {
    uint64_t json_len;         /* header bytes after the 8-byte length */
    uint64_t data_start;       /* 8 + json_len */
    uint64_t data_len;
    int n;
    ck_st_entry *e;            /* sorted by begin */
    json_t *metadata;          /* "__metadata__" (string -> string) or NULL */
} ck_st_header;

/* Reads the 8-byte little-endian header length from buf (len >= 8) and checks it against
 * the file size. 0 or CO_EFORMAT. */
int ck_st_header_len(const void *buf, size_t len, uint64_t file_size, uint64_t *json_len);
/* Parses the header of a safetensors file of file_size bytes whose first len bytes are in
 * buf (len >= 8 + json_len). Checks: JSON object, known dtypes, shapes within limits,
 * data_offsets consistent with shape and dtype, no overlap, no hole, no trailing bytes
 * (the data section is exactly file_size - data_start), unique names. what names the
 * file in errors. */
int ck_st_parse(const void *buf, size_t len, uint64_t file_size, const char *what, ck_st_header **out);
void ck_st_header_free(ck_st_header **h);
const ck_st_entry *ck_st_find(const ck_st_header *h, const char *name);

/* Builds a safetensors header for n tensors laid out contiguously in the given order
 * (tensor i at the sum of the sizes before it). metadata may be NULL. Returns the whole
 * prefix (8-byte length + JSON padded with spaces to a multiple of 8) in a malloc'ed
 * buffer. */
int ck_st_build_header(const char *const *names, const int *dtypes, const int *ndims,
                       const int64_t (*shapes)[CK_MAX_DIMS], int n, json_t *metadata, char **out,
                       size_t *out_len);

/* ---- manifest ------------------------------------------------------------------------ */

/* Where part of a global tensor lives: a hyper-rectangle (offsets + shape in the global
 * tensor) or, with flat, a range of its row-major flattening (distributed optimizer
 * shards). Stored in file `file` under safetensors key `key`. */
typedef struct ck_slice {
    int file;                          /* index into manifest files */
    char key[CK_NAME_MAX];
    bool flat;
    int64_t offsets[CK_MAX_DIMS];
    int64_t shape[CK_MAX_DIMS];        /* slice shape (ndim of the tensor) */
    int64_t flat_begin, flat_end;      /* elements, with flat */
    /* in a write plan only (not in the manifest): the tensor reference (ckpt.h) holding the
     * data and the slice's first row within that reference's region */
    int ref;
    int64_t ref_row;
} ck_slice;

typedef struct ck_mtensor {
    char name[CK_NAME_MAX];            /* global name ("layers.0.attention.qkv.weight",
                                          "optimizer.exp_avg.<name>") */
    int kind;
    int dtype;
    int ndim;
    int64_t shape[CK_MAX_DIMS];        /* global shape */
    int nslices;
    ck_slice *slices;
} ck_mtensor;

typedef struct ck_mfile {
    char name[CK_NAME_MAX];            /* relative to the checkpoint directory */
    int kind;
    int writer;                        /* the rank that wrote it */
    int group;                         /* the writer's group (model shard: tensor rank + tensor
                                          size x pipeline rank); 0 when the manifest has one */
    uint64_t size;
    uint8_t xxh128[16];                /* XXH3-128 of the whole file, canonical (big-endian) */
    uint64_t xxh64;                    /* XXH64 of the file when its writer computed it (a
                                          rank's acknowledgement to the supervisor); not in
                                          the manifest */
} ck_mfile;

/* The run's position (trainer_progress, without the train/ dependency). */
typedef struct ck_progress {
    int64_t iteration;
    int64_t consumed[3];
    int64_t skipped, nan_iters;
    double loss_sum, tok_sum;          /* stored bit-exactly */
    int iters_since_log;
    /* --fp16's loss scaler: its scale (stored bit-exactly; 0: none, not an fp16 run, or a
     * checkpoint written before fp16 existed) and trackers ("progress.grad_scaler") */
    double loss_scale;
    int64_t growth_tracker, hysteresis_tracker;
} ck_progress;

typedef struct ck_layout {
    int world, tensor, pipeline, context, data;
    bool distributed_optimizer;
    int writers;                       /* ranks that wrote shard files */
    int groups;                        /* writer groups (model shards): writer w held the tensor
                                          slices of group w % groups; replicas of a group share
                                          its bytes. 1 (or absent) without model parallelism */
} ck_layout;

/* The model's shape, as the trainer built it (the config holds the flags). */
typedef struct ck_model_info {
    int num_layers, hidden, heads, kv_groups, head_dim, ffn_hidden, vocab, padded_vocab, max_positions;
    bool rope, rmsnorm, swiglu, tied, bias;
    bool norm_1p; /* --apply-layernorm-1p: the norms' weights stored as w - 1 ("layernorm_1p", absent: false) */
    double norm_eps, rotary_base;
} ck_model_info;

typedef struct ck_optim_info {
    bool present;
    char type[16];
    int64_t step;
    double beta1, beta2, eps, weight_decay, clip_grad;
} ck_optim_info;

typedef struct ck_manifest {
    int version;
    int64_t iteration;
    int64_t created_unix;
    ck_progress progress;
    int64_t seed;
    ck_layout layout;
    ck_model_info model;
    ck_optim_info optim;
    int nfiles;
    ck_mfile *files;
    int ntensors;
    ck_mtensor *tensors;
    json_t *doc;       /* the whole document: "config", "lr_scheduler", "rng", ... */
} ck_manifest;

/* Parses and validates a manifest (len bytes, not necessarily NUL-terminated). what names
 * the file in errors. Checks every field's type and range, file names, slices in bounds
 * and covering each tensor exactly once. */
int ck_manifest_parse(const char *buf, size_t len, const char *what, ck_manifest **out);
void ck_manifest_free(ck_manifest **m);
const ck_mtensor *ck_manifest_find(const ck_manifest *m, const char *name);
/* The manifest's model description against the tensors it lists: the shapes of the
 * tensors it names (embeddings, norms, attention, dense MLP, multi-token prediction; their
 * optimizer moments too) and the number of layers. 0, or CO_EFORMAT with the detail naming
 * the model field and the tensor that disagree. */
int ck_model_check(const ck_manifest *m);
/* Serialises m->doc with the structured fields written over it. Malloc'ed text. */
int ck_manifest_dump(const ck_manifest *m, char **out, size_t *len);
/* Builds m->doc's structured part from the fields (used by dump; exposed for tests). */
json_t *ck_manifest_to_json(const ck_manifest *m);

/* 32 lowercase hex digits <-> 16 bytes. */
void ck_hex128(const uint8_t h[16], char out[33]);
int ck_unhex128(const char *s, uint8_t h[16]);

#endif
