/* ckpt.h - saving and loading checkpoints of named global tensors (docs/checkpoints.md).
 *
 * Save: the caller lists its tensors (global names and shapes, fp32 data) and the run's
 * metadata; a plan assigns them to shard files, split by rows across `writers` data-parallel
 * ranks when there are several; each writer writes its files (hashing as it goes); the
 * manifest is written last and the directory committed (store.h). One process plays every
 * writer today; with several ranks each calls ck_write_shards for its own index and the
 * coordinator writes the manifest and commits.
 *
 * Load: whatever layout is on disk (whole tensors, row slices, flat ranges), the loader
 * assembles global tensors into the caller's buffers, verifying every file's size and
 * XXH3-128 as it reads. */
#ifndef COHORT_CHECKPOINT_CKPT_H
#define COHORT_CHECKPOINT_CKPT_H

#include "checkpoint/format.h"
#include "checkpoint/store.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* A global tensor, or a part of one (a region), that this process saves or loads (fp32,
 * row-major over the region).
 *
 * Saving with writer groups (meta->layout.groups > 1: model parallelism), every process
 * lists the parts of every group, so that all compute the same plan: its own group's with
 * data, the others' with data NULL; each part says which group holds it (group), or
 * CK_ANY_GROUP for a tensor every group holds whole (the plan then gives it to the group
 * with the fewest bytes so far). Parts of one tensor must not overlap and must cover it. */
#define CK_ANY_GROUP (-1)
typedef struct ck_tensor_ref {
    const char *name;
    int kind;                          /* CK_KIND_MODEL | CK_KIND_OPTIM */
    int ndim;
    int64_t shape[CK_MAX_DIMS];        /* the global tensor's shape */
    const float *data;                 /* save: source over the region (NULL: another group's) */
    float *dst;                        /* load: destination over the region */
    bool region;                       /* a part: offsets and rshape; false: the whole tensor */
    int64_t offsets[CK_MAX_DIMS];
    int64_t rshape[CK_MAX_DIMS];
    int group;                         /* save with groups: 0..groups-1 or CK_ANY_GROUP */
    /* save only: a flat range [flat_begin, flat_end) of the tensor's row-major flattening
     * (a distributed-optimizer shard's piece of a moment; region is ignored, data holds the
     * range), written whole by writer `writer` as one 1-D piece (a "flat" slice of the
     * manifest). Every part of a tensor with a flat part must be flat. */
    bool flat;
    int64_t flat_begin, flat_end;
    int writer;
} ck_tensor_ref;

/* Everything but the tensors. json members may be NULL; they are copied. */
typedef struct ck_meta {
    int64_t iteration;
    ck_progress progress;
    int64_t seed;
    ck_layout layout;
    ck_model_info model;
    ck_optim_info optim;
    json_t *config;                    /* the flags (co_config_write_json) */
    json_t *lr_scheduler;
    json_t *rng_generators;
    json_t *rerun_state;               /* the rerun state machine's (resilience/rerun.h) */
    /* [writers]: writer w's group (a model shard: tensor x pipeline coordinate); NULL:
     * w % layout.groups. Not copied: it must outlive the save (the async saver's too). */
    const int *writer_group;
} ck_meta;

/* ---- save ----------------------------------------------------------------------------- */

/* Builds the write plan: a manifest with files, tensors and slices (sizes and hashes not yet
 * known). Writer w writes the parts of its group (meta->writer_group[w], or w % G with G =
 * meta->layout.groups, 1 if 0); the writers of a group (its data-parallel replicas) share its
 * bytes of each kind evenly, in the order of their indices, a part split by rows where a
 * boundary falls. Tensors appear in the order of their first
 * part; each slice names its part (ck_slice.ref). */
int ck_plan(const ck_meta *meta, const ck_tensor_ref *refs, int n, int writers, ck_manifest **out);
/* Writes writer `writer`'s files of the plan into dir and records their sizes and hashes
 * in plan->files (refs as given to ck_plan; its slices' parts must have data). */
int ck_write_shards(const char *dir, ck_manifest *plan, const ck_tensor_ref *refs, int n, int writer);
/* As ck_write_shards; with xxh64 also fills plan->files[i].xxh64. */
int ck_write_shards_ex(const char *dir, ck_manifest *plan, const ck_tensor_ref *refs, int n, int writer, bool xxh64);
/* Writes dir/manifest.json crash-safely (the files' sizes and hashes must be filled in). */
int ck_write_manifest(const char *dir, const ck_manifest *plan);

/* ---- multi-rank save, committed by a coordinator (the supervisor) ----------------------
 * Every data-parallel rank computes the same plan (ck_plan with writers = world) and writes
 * its own files into the shared temporary directory (ck_begin_shared), then a writer record
 * CK_WRITER_FMT (its files' names, sizes, XXH3-128 and XXH64), fsync'ed; rank 0 also writes
 * the plan (CK_PLAN_NAME: the manifest with the hashes still zero). Each rank then
 * acknowledges (ck_coord.ack: its files with size and XXH64, or the error) and waits for
 * the coordinator's answer. The coordinator, once every rank has acknowledged success,
 * completes the manifest from the plan and the writer records (ck_complete_shared),
 * commits (ck_commit), applies retention and answers COMMIT; on any failure it removes the
 * temporary directory and answers ABORT. */
#define CK_PLAN_NAME "plan.json"
#define CK_WRITER_FMT "writer-%05d.json"
typedef struct ck_coord {
    char token[64];                    /* names the shared temporary directory (the job id) */
    /* the rank's files (name, writer, size, xxh64) or status != 0 with error */
    int (*ack)(void *ctx, int64_t iteration, int status, const char *error, const ck_mfile *files, int nfiles);
    /* 0 when the coordinator committed the iteration; an error (with its detail) when it
     * aborted, went away or did not answer within timeout_ms */
    int (*wait)(void *ctx, int64_t iteration, int timeout_ms);
    /* whether the coordinator said to save no more (the save directory is running out of
     * space; NULL: it never does) */
    bool (*stopped)(void *ctx);
    void *ctx;
    int timeout_ms;                    /* for wait (0: CK_COORD_TIMEOUT_MS) */
} ck_coord;
#define CK_COORD_TIMEOUT_MS (15 * 60 * 1000)
/* The token of a supervised job (its 64-bit id), as the workers and the supervisor write it. */
#define CK_JOB_TOKEN_FMT "job%016" PRIx64

/* One rank's part of a multi-rank save: begin_shared, plan, its shards, its writer record
 * (and the plan on rank 0), ack, wait for the answer. Returns 0 once the coordinator has
 * committed. A failure is acknowledged (the coordinator removes the directory). */
int ck_save_part(const char *save_dir, const ck_meta *meta, const ck_tensor_ref *refs, int n, int writers, int writer,
                 const ck_coord *co);
/* The coordinator's step: checks that the plan in tmp lists exactly the acknowledged files
 * (acked[i]: name, writer, size, xxh64 as the ranks reported them) and that each writer
 * record agrees, writes tmp/manifest.json with every file's XXH3-128, and removes the plan
 * and the writer records. The caller then commits with ck_commit. */
int ck_complete_shared(const char *tmp, int64_t iteration, int writers, const ck_mfile *acked, int nacked);
/* As ck_complete_shared; rerun_state (may be NULL) replaces the manifest's
 * "rerun_state_machine" (the coordinator holds that state). */
int ck_complete_shared_ex(const char *tmp, int64_t iteration, int writers, const ck_mfile *acked, int nacked,
                          const json_t *rerun_state);

/* One whole save in this process: begin, plan, shards, manifest, commit, retention
 * (keep > 0: the most recent keep). On failure the temporary directory is removed and the
 * previous checkpoint and tracker are untouched. */
int ck_save(const char *save_dir, const ck_meta *meta, const ck_tensor_ref *refs, int n, int writers, int keep);

/* Saves in order, synchronously or on a background thread (async). With async,
 * ck_saver_save returns at once: the background thread first copies the tensors into host
 * memory (reused between saves), then writes them. The caller must not change the tensors
 * until ck_saver_wait_snapshot (or ck_saver_wait) has returned -- the trainer calls it just
 * before its next optimizer step, so the copy overlaps forward and backward. The previous
 * background save is waited for first. */
typedef struct ck_saver ck_saver;
typedef struct ck_saver_opts {
    const char *save_dir;
    bool async;
    int keep;                          /* --most-recent-k (<= 0: keep all) */
    int writers;                       /* shard files per kind (1) */
    FILE *log;                         /* progress lines, or NULL */
    /* several ranks: this process writes writer `writer`'s files and coord commits
     * (ck_save_part); NULL: this process writes every file and commits itself (ck_save) */
    const ck_coord *coord;             /* copied */
    int writer;
} ck_saver_opts;
int ck_saver_new(ck_saver **out, const ck_saver_opts *o);
void ck_saver_destroy(ck_saver **s);   /* waits for a background save */
/* Allocates and touches the snapshot buffer for nfloats floats (async), so the first save
 * does not pay for page faults. */
int ck_saver_reserve(ck_saver *s, size_t nfloats);
int ck_saver_save(ck_saver *s, const ck_meta *meta, const ck_tensor_ref *refs, int n);
/* Waits until the background save has copied the tensors (they may change after it);
 * returns the seconds it waited. */
double ck_saver_wait_snapshot(ck_saver *s);
/* Waits for the background save; its result (0, or the error with its detail restored on
 * this thread). */
int ck_saver_wait(ck_saver *s);
/* This rank's writer index changed (an in-process restart renumbered the ranks). */
void ck_saver_set_writer(ck_saver *s, int writer);
/* The writers of a save and this rank's index changed (--elastic: the world shrank or grew). */
void ck_saver_set_writers(ck_saver *s, int writers, int writer);
/* Seconds the caller was blocked by the last ck_saver_save (waiting for the previous save,
 * starting the thread); add ck_saver_wait_snapshot's wait for the whole stall. */
double ck_saver_last_stall(const ck_saver *s);
int64_t ck_saver_last_iteration(const ck_saver *s);

/* ---- load ----------------------------------------------------------------------------- */

/* Failure categories of a load or verify (the tools' exit codes follow them). */
typedef enum {
    CK_OK = 0,
    CK_BAD_IO = 1,          /* could not read (permissions, I/O error) */
    CK_BAD_FORMAT = 3,      /* manifest or shard header malformed or inconsistent */
    CK_BAD_INCOMPLETE = 4,  /* a file missing, truncated or of the wrong size */
    CK_BAD_CHECKSUM = 5,    /* a file's XXH3-128 differs from the manifest */
} ck_bad;

/* Loads the tensors or regions in refs (by name; dst buffers over each region) from the
 * checkpoint in ckpt_dir described by m, whatever its slices on disk. Every file holding a
 * wanted piece is read whole and verified. Global shapes must match and regions lie inside.
 * *bad (may be NULL) gets the category of a failure. */
int ck_load_tensors(const char *ckpt_dir, const ck_manifest *m, const ck_tensor_ref *refs, int n, ck_bad *bad);

/* Verifies a checkpoint directory: manifest, every file's presence, size, checksum and
 * safetensors header against the manifest. Returns 0 or an error; *bad says which kind,
 * and report (may be NULL) is called once per file. */
typedef void (*ck_verify_cb)(void *ctx, const char *file, ck_bad bad, const char *detail);
int ck_verify(const char *ckpt_dir, ck_bad *bad, ck_verify_cb report, void *ctx);

/* Reads every tensor of the given kinds (bit mask: 1 << CK_KIND_MODEL | 1 << CK_KIND_OPTIM)
 * into malloc'ed fp32 buffers indexed like m->tensors (NULL for tensors not read), verifying
 * the files read. Free with ck_free_all. */
int ck_read_all(const char *ckpt_dir, const ck_manifest *m, int kinds, float ***bufs, ck_bad *bad);
void ck_free_all(const ck_manifest *m, float ***bufs);

/* Chooses the checkpoint to load from load_dir: want >= 0 that iteration (--ckpt-step),
 * else the tracker's (or, without a tracker, the newest directory). Writes the candidates in
 * the order to try -- the chosen one, then older ones newest first -- into *its (malloc'ed).
 * CO_ENOENT when there is none. */
int ck_candidates(const char *load_dir, int64_t want, int64_t **its, int *n);

/* ---- export --------------------------------------------------------------------------- */

/* Writes a Hugging Face GPT-2 model (model.safetensors + config.json) into out_dir from the
 * checkpoint, with all padded_vocab rows of the embedding (vocab_size = padded_vocab, so its
 * softmax is cohort's), or only the tokenizer's vocab rows with trim_vocab (another softmax,
 * another loss). CO_EUNSUPPORTED (with the reason) for models without GPT-2's options. */
int ck_export_hf_gpt2(const char *ckpt_dir, const ck_manifest *m, const char *out_dir, bool trim_vocab);
/* The same in the Hugging Face Llama layout (LlamaForCausalLM: q/k/v and gate/up split out of
 * qkv and fc1, lm_head unless tied, config.json with rope_theta, rms_norm_eps, ...).
 * CO_EUNSUPPORTED (with the reason) for models Llama cannot express: learned positions,
 * LayerNorm, GELU, biases, experts, MTP layers, any other tensor. Both exports add a "cohort"
 * object to config.json (tokenizer flags, real vocabulary) for ck_import_hf. */
int ck_export_hf_llama(const char *ckpt_dir, const ck_manifest *m, const char *out_dir, bool trim_vocab);

/* ---- import --------------------------------------------------------------------------- */

/* Writes save_dir/iter_0000000 (and the tracker): a checkpoint of the Hugging Face GPT-2
 * (gpt2) or Llama model in hf_dir (config.json; model.safetensors, or the shards
 * model.safetensors.index.json names), tensor-parallel size 1, no optimizer state, its
 * config holding the model and tokenizer flags (--use-checkpoint-args). F16/BF16/F64 become
 * fp32. CO_EFORMAT naming the file, key or tensor for malformed input (missing tensor, wrong
 * shape, truncated file, config disagreeing with the tensors); CO_EUNSUPPORTED for models
 * cohort cannot express (rope scaling, biases in Llama, other activations, extra tensors). */
int ck_import_hf(const char *hf_dir, bool gpt2, const char *save_dir);

#endif
