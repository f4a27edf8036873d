/* config.h - the training configuration and its command-line flags.
 *
 * One table (config.c) lists every flag cohort accepts, with Megatron-LM's name, its
 * default and its help line; the CLI, `--help`, the checkpoint manifest (the JSON writer and
 * its reader) all read that one table. Parsing never exits: it returns an error code with
 * the message in co_err_detail(). What the values mean is checked by the modules they
 * concern (the model's shapes in model/gpt_check.c, the parallel layout in
 * scheduler/parallel_check.c, the resilience limits in resilience/resilience_check.c, the
 * run's own flags here), in the order train/config_check.c runs them, each adding its
 * problems to one co_problems list. */
#ifndef COHORT_COMMON_CONFIG_H
#define COHORT_COMMON_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define CO_MAX_DATA_PATHS 64

/* Upper bounds the configuration's checks enforce (beyond them a configuration is refused as
 * absurd before anything is allocated: the kernels index with int dimensions, and the
 * sample counts are int64 products). */
#define CO_MAX_LAYERS 1024
#define CO_MAX_HIDDEN 131072
#define CO_MAX_FFN_HIDDEN 1048576
#define CO_MAX_KV_CHANNELS 65536
#define CO_MAX_SEQ_LENGTH 1048576            /* also --max-position-embeddings */
#define CO_MAX_MICRO_BATCH 65536
#define CO_MAX_GLOBAL_BATCH 16777216
#define CO_MAX_MICRO_BATCH_TOKENS 16777216    /* micro batch x seq length */
#define CO_MAX_LAYER_WIDTH 4194304            /* qkv, attention, fc1 widths (int kernel dimensions) */
#define CO_MAX_ACTIVATION ((int64_t)1 << 34)  /* elements of one [tokens, width] activation */
#define CO_MAX_MODEL_BYTES ((double)(1ull << 42)) /* 4 TiB: parameters, gradients, Adam state, activations */
#define CO_MAX_VOCAB 16777216
#define CO_MAX_VOCAB_DIVISOR 65536
#define CO_MAX_ITERS ((int64_t)1 << 40)       /* iterations and samples of a run */
#define CO_SAVE_INTERVAL_AUTO ((int64_t)-2)   /* --save-interval auto (-1: not given) */
#define CO_MAX_PROCS 65536                    /* --nproc-per-node, --nnodes */
#define CO_MAX_TP_GROUP 64                    /* --tensor-model-parallel-size, --expert-tensor-parallel-size */
#define CO_MAX_PP_STAGES CO_MAX_LAYERS        /* --pipeline-model-parallel-size: a layer per stage at most */
#define CO_MAX_VP_CHUNKS CO_MAX_LAYERS        /* --virtual-pipeline-model-parallel-size and its other names */
#define CO_MAX_CP_GROUP 1024                  /* --context-parallel-size */
#define CO_MAX_EP_GROUP 1024                  /* --expert-model-parallel-size */
#define CO_MAX_THREADS 4096

typedef struct co_config {
    /* model */
    int num_layers, hidden_size, ffn_hidden_size, num_attention_heads;
    int num_query_groups;
    bool group_query_attention;
    int kv_channels;
    int seq_length, max_position_embeddings;
    char position_embedding_type[32]; /* learned_absolute | rope */
    double rotary_base;
    char normalization[16]; /* LayerNorm | RMSNorm */
    double norm_epsilon;
    bool swiglu, untie_embeddings_and_output_weights, disable_bias_linear;
    double init_method_std;
    int make_vocab_size_divisible_by;
    double hidden_dropout, attention_dropout;
    /* activation recomputation (Megatron's; model/gpt_check.c checks them, docs/memory.md) */
    char recompute_granularity[16];   /* "": none, full, selective */
    char recompute_method[16];        /* "": none, uniform, block (full only) */
    int recompute_num_layers;         /* -1: not given */
    char *recompute_modules[CO_MAX_DATA_PATHS]; /* selective: none given means core_attn */
    int n_recompute_modules;
    bool recompute_activations, distribute_saved_activations;
    /* parallelism */
    int tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size;
    int expert_model_parallel_size, expert_tensor_parallel_size; /* 0: as the tensor size */
    int num_experts, mtp_num_layers;                   /* 0: a dense model; no MTP (refused otherwise) */
    /* mixture of experts (Megatron's --moe-* flags; model/moe.h) */
    int moe_layer_freq, moe_ffn_hidden_size, moe_shared_expert_intermediate_size; /* 0: ffn size; 0: none */
    /* --moe-layer-freq's list form (Megatron's "([1]*3+[0]*1)*2"): one '0' (dense) or '1' (MoE)
     * per layer, moe_layer_freq then 0; "" for the integer form */
    char moe_layer_list[CO_MAX_LAYERS + 1];
    int moe_router_topk, moe_router_num_groups, moe_router_group_topk;
    char moe_router_score_function[16], moe_router_load_balancing_type[24], moe_token_drop_policy[16];
    char moe_token_dispatcher_type[16], moe_router_dtype[8];
    bool moe_router_pre_softmax, moe_router_enable_expert_bias, moe_pad_expert_input_to_capacity, moe_grouped_gemm;
    double moe_router_topk_scaling_factor, moe_aux_loss_coeff, moe_z_loss_coeff; /* 0: none */
    double moe_router_bias_update_rate;
    double moe_expert_capacity_factor;                 /* <= 0: dropless (Megatron's None) */
    double moe_router_collapse_share;                  /* cohort: a router collapse is one expert over this share */
    int moe_router_collapse_iters;                     /*   of a layer's tokens for this many iterations (0: off) */
    double mtp_loss_scaling_factor;                    /* multi-token prediction's loss weight */
    int virtual_pipeline_model_parallel_size, num_layers_per_virtual_pipeline_stage; /* 0: none */
    int num_virtual_stages_per_pipeline_rank;          /* 0: none (Megatron's newer name of the above) */
    int microbatch_group_size_per_vp_stage;            /* 0: the pipeline size */
    int decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers; /* -1: not given */
    bool account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split;
    char pipeline_model_parallel_layout[1024];         /* "": not given */
    bool use_tp_pp_dp_mapping;
    bool sequence_parallel, use_distributed_optimizer;
    int64_t ddp_bucket_size;      /* elements per gradient bucket of the distributed optimizer (0: max(40M, 1M x dp)) */
    bool overlap_grad_reduce, overlap_param_gather;
    bool dist_opt_redundancy;     /* [cohort] a second copy of every optimizer shard on the next data-parallel rank */
    /* batch */
    int micro_batch_size, global_batch_size;
    int64_t train_iters, train_samples;
    /* --rampup-batch-size START INCREMENT SAMPLES (Megatron's num-microbatches calculator); the
     * words as given, and parsed by the checks into rampup_start/increment/samples (0: none) */
    char *rampup_batch_size[CO_MAX_DATA_PATHS];
    int n_rampup_batch_size;
    int64_t rampup_start, rampup_increment, rampup_samples;
    /* optimizer */
    char optimizer[16];
    double lr, min_lr;
    char lr_decay_style[32];
    int64_t lr_decay_iters, lr_decay_samples, lr_warmup_iters, lr_warmup_samples;
    double lr_warmup_fraction, lr_warmup_init;
    int64_t lr_wsd_decay_iters;
    char lr_wsd_decay_style[16];
    double weight_decay, adam_beta1, adam_beta2, adam_eps, clip_grad;
    bool bf16, fp16;
    /* --fp16's loss scale: static (loss_scale > 0, given) or dynamic (optim/grad_scaler.h) */
    double loss_scale, initial_loss_scale, min_loss_scale;
    int64_t loss_scale_window, hysteresis;
    /* Megatron flags its example launch scripts pass, with their meaning where cohort has one,
     * accepted as no-ops where it is not a choice here, refused where not supported (config.c,
     * the "compat" group; co_config_check_refused) */
    char attention_backend[16];   /* auto|local|unfused: cohort's attention; flash|fused refused */
    bool add_position_embedding;  /* false: --no-position-embedding (only with rope, as Megatron) */
    bool use_mcore_models, masked_softmax_fusion, cross_entropy_loss_fusion, grad_reduce_in_bf16;
    bool apply_layernorm_1p, calculate_per_token_loss, manual_gc, log_throughput, profile;
    bool create_attention_mask_in_dataloader, mmap_bin_files;
    double rotary_percent, decoupled_lr, decoupled_min_lr;
    int empty_unused_memory_level, num_workers, profile_step_start, profile_step_end;
    int distributed_timeout_minutes;
    char ckpt_format[16], fp8_format[16], fp8_amax_compute_algo[16];
    int fp8_amax_history_len;
    bool fp8_param_gather;
    char wandb_project[128], wandb_exp_name[128];
    /* data */
    char *data_path[CO_MAX_DATA_PATHS];
    int n_data_path;
    char *train_data_path[CO_MAX_DATA_PATHS];
    int n_train_data_path;
    char *valid_data_path[CO_MAX_DATA_PATHS];
    int n_valid_data_path;
    char *test_data_path[CO_MAX_DATA_PATHS];
    int n_test_data_path;
    bool sft;
    char split[64];
    char data_cache_path[512];
    bool mock_data;
    char tokenizer_type[32];
    int vocab_size;
    char vocab_file[512], merge_file[512];
    char tokenizer_model[512];     /* SentencePiece .model or TikTokenizer ranks file */
    char tiktoken_pattern[8];      /* v1 | v2 */
    int tiktoken_num_special_tokens;
    char *tiktoken_special_tokens[CO_MAX_DATA_PATHS];
    int n_tiktoken_special_tokens;
    int64_t seed;
    bool eod_mask_loss, reset_position_ids, reset_attention_mask;
    bool cp_packed_sequences; /* [cohort] THD split of documents under context parallelism */
    char cp_comm_type[16];      /* --cp-comm-type: p2p (a2a, allgather, a2a+p2p refused) */
    double cp_packed_capacity;  /* [cohort] THD: padded tokens per sequence, x seq_length */
    /* logging / evaluation */
    int log_interval;
    int64_t eval_interval, eval_iters;
    char metrics_file[512];
    int metrics_port; /* Prometheus /metrics on the supervisor (0: off; docs/observability.md) */
    bool progress; /* live progress bar when stdout is a terminal */
    /* TensorBoard (observe/tensorboard.h) */
    char tensorboard_dir[512];
    int tensorboard_log_interval, tensorboard_queue_size;
    bool log_learning_rate_to_tensorboard, log_loss_scale_to_tensorboard, log_validation_ppl_to_tensorboard;
    bool log_timers_to_tensorboard, log_memory_to_tensorboard, log_world_size_to_tensorboard;
    /* exit */
    int64_t exit_interval;
    double exit_duration_in_mins;
    bool exit_signal_handler;
    bool requeue_on_sigterm; /* a SIGTERM stop is a preemption (exit 75), as a SIGUSR1 one */
    /* checkpoints */
    char save[512], load[512];
    int64_t save_interval;      /* CO_SAVE_INTERVAL_AUTO: --save-interval auto */
    double expected_mtbf;       /* --save-interval auto's MTBF, seconds (0: estimated) */
    int most_recent_k;
    int keep_every;             /* with most_recent_k: every checkpoint at a multiple of this is kept too */
    double save_space_margin;   /* saves stop below the last checkpoint's size times this much free space */
    bool no_save_optim, no_load_optim, no_load_rng, finetune, use_checkpoint_args;
    bool exit_on_missing_checkpoint, async_save;
    int64_t ckpt_step;
    bool refuse_corrupt_checkpoint;
    /* distributed launch (torchrun's names) */
    int nproc_per_node, nnodes, node_rank;
    char master_addr[256];
    int master_port;
    char node_addr[256];
    double rendezvous_timeout;
    char job_secret[512];
    /* resilience (the rerun state machine, fault injection; resilience/) */
    bool check_for_nan_in_loss_and_grad;
    char rerun_mode[32];
    bool check_for_spiky_loss, check_for_large_grads, check_rank_outliers;
    char on_reproducible_error[8];
    int error_injection_rate;
    char error_injection_type[24];
    char result_rejected_tracker_filename[512];
    char *iterations_to_skip[CO_MAX_DATA_PATHS];
    int n_iterations_to_skip;
    int64_t check_replicas_interval;
    int64_t check_weight_hash_interval; /* --check-weight-hash-across-dp-replicas-interval */
    char *inject[CO_MAX_DATA_PATHS];
    int n_inject;
    int64_t inject_seed;
    /* Megatron's random fault injector (resilience/fault_injector.h) */
    char fault_injector_ranks[256], fault_injector_fault_types[256], fault_injector_fault_probabilities[256];
    int fault_injector_num_ranks;
    double fault_injector_fault_delay, fault_injector_mtti_seconds, fault_injector_offset_seconds;
    int64_t fault_injector_seed;
    double straggler_threshold;
    int straggler_evict_after;
    bool inprocess_restart;
    double inprocess_soft_timeout, inprocess_hard_timeout, inprocess_barrier_timeout;
    double inprocess_heartbeat_interval, inprocess_heartbeat_timeout;
    double node_replacement_timeout;
    bool elastic;                   /* --elastic: lost capacity shrinks the data-parallel size */
    int elastic_min_replicas;       /* ... not below this many model replicas */
    int inprocess_restart_limit;
    double inprocess_restart_window;
    int inprocess_active_world_size;
    char inprocess_rank_assignment[16];
    char inprocess_granularity[8];
    int quarantine_after;
    int64_t quarantine_window;
    char run_report[512];
    /* the timeline of a training step (train/timeline.h, docs/timeline.md) */
    char timeline_dir[512];         /* "": off */
    char timeline_iterations[64];   /* "N" or "A:B" */
    /* --timeline-iterations parsed by co_config_check_run: iterations A..B, or with
     * timeline_relative the N after the run's first, from = 2 and to = N + 1 counted from
     * the iterations completed at the start (co_config_timeline_records) */
    int64_t timeline_from, timeline_to;
    bool timeline_relative;
    /* cohort */
    int threads;
    char device[16];
    char workdir[512];
    int sample_lines;

    /* Tests only, never a flag nor written to a checkpoint: the model-parallel stand-in
     * (tests/fault/standin_main.c sets it in every process it starts, workers included, as
     * they run the same binary): --tensor-model-parallel-size, --pipeline-model-parallel-size
     * and --context-parallel-size above 1 accepted with the model computed whole on every
     * rank, so that the parallel groups, their communicators and restarts across them are
     * tested before the split compute exists. The ranks of a model-parallel group then train
     * identical replicas. */
    bool standin_model_parallel;

    /* which flags the user set (index into the flag table) */
    uint8_t set[256];
} co_config;

/* The global batch once `consumed` training samples are trained: Megatron's batch-size ramp-up
 * (--rampup-batch-size, checked by co_config_check_run), or --global-batch-size. */
int co_config_batch_at(const co_config *c, int64_t consumed);
/* The iterations of a ramped-up run of --train-samples (Megatron's update_train_iters). */
int64_t co_config_rampup_iters(const co_config *c);

/* --moe-layer-freq's list form (Megatron's moe_freq_type: a Python list expression of 0s and
 * 1s such as "([1]*3+[0]*1)*2" or "[0,1,1,1]"; common/moe_freq.c): the layers' pattern into
 * out as '0'/'1' characters, NUL-terminated, fewer than cap. 0, or CO_EINVAL saying why. */
int co_moe_layer_list(const char *text, char *out, size_t cap);
/* Whether --moe-layer-freq makes layer l (0-based) a MoE layer: its list's entry, or l % N == 0. */
bool co_config_moe_layer(const co_config *c, int l);

/* Fills the Megatron defaults. */
void co_config_defaults(co_config *c);
/* Frees what parse allocated (data paths). */
void co_config_free(co_config *c);

/* Parses argv (after the subcommand). On error returns CO_EINVAL with one message in
 * co_err_detail() (naming the flag, and the closest known flag for an unknown one). */
int co_config_parse(co_config *c, int argc, char **argv);
/* Was flag `name` (without dashes, e.g. "num-layers") given on the command line? */
bool co_config_was_set(const co_config *c, const char *name);

/* Whether the tensor, context and pipeline sizes are each within their bounds (1 to
 * CO_MAX_*): the launcher divides the world by their product only then, and otherwise
 * leaves the refusal, with the ranges, to the parallel layout's check. */
bool co_config_model_parallel_sizes_ok(const co_config *c);

/* ---- the checks' problems --------------------------------------------------------------- */

/* What the checks found wrong, one sentence per problem in the order found (the CLI prints
 * them all, one per line): every check adds to one list, so a bad command line hears of all
 * its problems at once. */
typedef struct co_problems {
    char text[4096]; /* the problems, '\n' between them */
    size_t len;
    int n;           /* problems found (also those that no longer fit in text) */
} co_problems;

/* An empty list. */
void co_problems_init(co_problems *P);
/* Adds one problem. */
void co_problem(co_problems *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* v out of [lo, hi]: one problem naming --name and the range. Returns true then. */
bool co_problem_range(co_problems *P, const char *name, int64_t v, int64_t lo, int64_t hi);
/* v not a finite number in (lo, hi] (strict) or [lo, hi]: one problem with the range; true then. */
bool co_problem_dbl_range(co_problems *P, const char *name, double v, double lo, double hi, bool strict);

/* ---- the configuration's own checks (the run, the optimizer, data, logging, launch) ---- */

/* Flags accepted for Megatron's scripts whose meaning is not built (precision). */
void co_config_check_refused(const co_config *c, co_problems *P);
/* --micro-batch-size given and in range (a size later checks divide by). */
void co_config_check_micro_batch(const co_config *c, co_problems *P);
/* The run: global batch (derived as micro x dp when not given), iterations or samples
 * (iterations derived from samples), evaluation, --timeline-iterations (parsed into
 * timeline_from/to), the learning-rate schedule (decay and warm-up iterations derived),
 * the optimizer, logging, exit and checkpoint intervals, data paths and the launch's ports,
 * timeouts and threads. dp: the data-parallel size. */
void co_config_check_run(co_config *c, int dp, co_problems *P);

/* s as a JSON string (quoted, escaped) on f. */
void co_json_str(FILE *f, const char *s);

/* Whether a run that began with `start` iterations completed (0, or the loaded
 * checkpoint's) records iteration `it` (1-based, as the log line counts) in its timeline:
 * --timeline-dir given and `it` in --timeline-iterations (checked configuration). */
bool co_config_timeline_records(const co_config *c, int64_t start, int64_t it);

/* Prints the flags, grouped, with defaults. */
void co_config_help(FILE *f);
/* Writes the configuration as one JSON object (for metrics files and manifests): every
 * flag of the table under its name. */
void co_config_write_json(const co_config *c, FILE *f);

struct json_t;
/* Told of each value co_config_read_json changed: the flag's name and the new value as
 * text ("on"/"off" for a switch, the words of a list between spaces). */
typedef void (*co_config_changed_fn)(void *ctx, const char *name, const char *value);
/* Reads back an object co_config_write_json wrote (a checkpoint's "config"), through the
 * same flag table: each flag in `only` (names without dashes, NULL-terminated; NULL: every
 * flag) found in obj with a value of its kind and different from c's is set, and `changed`
 * (may be NULL) told. A missing key, or a value of another kind (another version's), leaves
 * the flag as it was. Which flags the user set is not changed. 0, or CO_ENOMEM (CO_EINVAL
 * for a name in `only` that is no flag). */
int co_config_read_json(co_config *c, const struct json_t *obj, const char *const *only, co_config_changed_fn changed,
                        void *ctx);

/* Parses a --split string ("98,1,1") into fractions summing to 1. 0 or -1. */
int co_config_parse_split(const char *s, double out[3]);

/* Samples requested from split 0 (train), 1 (valid) or 2 (test) over the whole run, as
 * Megatron computes them (train_iters x global batch; valid (train_iters / eval_interval
 * + 1) x eval_iters x global batch; test eval_iters x global batch). */
int64_t co_config_split_samples(const co_config *c, int split);

/* Edit distance (for "did you mean"). */
int co_edit_distance(const char *a, const char *b);

#endif
