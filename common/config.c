/* config.c - the flag table of cohort's configuration: parsing, help, the JSON it is written
 * as and read back from, the problems list every check adds to, and the checks of the run's
 * own flags (batch, length, timeline, learning rate, optimizer, logging, data, launch; the
 * other modules check theirs: train/config_check.c runs them all).
 *
 * Flag names and defaults follow Megatron-LM (shared/reference/megatron-facts.md §8) so a
 * Megatron launch script's flags work unchanged; flags marked [cohort] are our own. */
#include "common/config.h"

#include "common/error.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { F_INT, F_I64, F_DBL, F_STR, F_BOOL, F_NOBOOL, F_LIST } flag_kind;
/* F_LIST flags store char *[CO_MAX_DATA_PATHS] at off and their count at off2. */

typedef struct flag {
    const char *group;
    const char *name;    /* without the leading dashes */
    flag_kind kind;
    size_t off;          /* offset in co_config */
    size_t off2;         /* F_LIST: offset of the count */
    size_t size;         /* for F_STR: buffer size */
    const char *def;     /* default as text; NULL: none (unset) */
    const char *choices; /* "a|b|c" or NULL */
    const char *help;
} flag;

#define OFF(f) offsetof(co_config, f)
#define SZ(f) sizeof(((co_config *)0)->f)
#define I(g, n, f, d, h) {g, n, F_INT, OFF(f), 0, 0, d, NULL, h}
#define L(g, n, f, d, h) {g, n, F_I64, OFF(f), 0, 0, d, NULL, h}
#define D(g, n, f, d, h) {g, n, F_DBL, OFF(f), 0, 0, d, NULL, h}
#define S(g, n, f, d, ch, h) {g, n, F_STR, OFF(f), 0, SZ(f), d, ch, h}
#define B(g, n, f, h) {g, n, F_BOOL, OFF(f), 0, 0, "false", NULL, h}
#define NB(g, n, f, h) {g, n, F_NOBOOL, OFF(f), 0, 0, "true", NULL, h}
#define LIST(g, n, f, h) {g, n, F_LIST, OFF(f), OFF(n_##f), 0, NULL, NULL, h}

static const flag flags[] = {
    /* model */
    I("model", "num-layers", num_layers, NULL, "number of transformer layers"),
    I("model", "hidden-size", hidden_size, NULL, "transformer hidden size"),
    I("model", "ffn-hidden-size", ffn_hidden_size, NULL,
      "MLP hidden size (default 4*hidden, or 8/3*hidden rounded down to 64 with --swiglu)"),
    I("model", "num-attention-heads", num_attention_heads, NULL, "number of attention heads"),
    B("model", "group-query-attention", group_query_attention, "use grouped-query attention"),
    I("model", "num-query-groups", num_query_groups, "1", "key/value groups with --group-query-attention"),
    I("model", "kv-channels", kv_channels, NULL, "head dimension (default hidden/heads)"),
    I("model", "seq-length", seq_length, NULL, "sequence length of a sample"),
    I("model", "max-position-embeddings", max_position_embeddings, NULL,
      "positions the model supports (default --seq-length)"),
    S("model", "position-embedding-type", position_embedding_type, "learned_absolute",
      "learned_absolute|rope", "position embedding"),
    D("model", "rotary-base", rotary_base, "10000", "RoPE base"),
    S("model", "normalization", normalization, "LayerNorm", "LayerNorm|RMSNorm", "normalisation layer"),
    B("model", "apply-layernorm-1p", apply_layernorm_1p, "zero-centred norm weights: stored as w - 1 (initialised to 0), the norm's output is norm(x) * (1 + w)"),
    D("model", "norm-epsilon", norm_epsilon, "1e-5", "epsilon of the normalisation"),
    B("model", "swiglu", swiglu, "SwiGLU MLP instead of GELU"),
    B("model", "untie-embeddings-and-output-weights", untie_embeddings_and_output_weights,
      "separate output layer instead of the tied embedding"),
    B("model", "disable-bias-linear", disable_bias_linear, "no biases in linear layers"),
    D("model", "init-method-std", init_method_std, "0.02", "standard deviation of the initial weights"),
    I("model", "make-vocab-size-divisible-by", make_vocab_size_divisible_by, "128",
      "pad the vocabulary to a multiple of this"),
    D("model", "hidden-dropout", hidden_dropout, "0.1", "dropout on the residual branches and embeddings"),
    D("model", "attention-dropout", attention_dropout, "0.1", "dropout on attention probabilities"),
    /* activation recomputation */
    S("model", "recompute-granularity", recompute_granularity, NULL, "full|selective",
      "recompute activations in the backward instead of keeping them: full (whole layers, with "
      "--recompute-method and --recompute-num-layers) or selective (--recompute-modules; docs/memory.md)"),
    S("model", "recompute-method", recompute_method, NULL, "uniform|block",
      "full recomputation: uniform (groups of --recompute-num-layers layers, each group's input kept) or block "
      "(the first --recompute-num-layers layers of each model chunk recomputed, the rest kept)"),
    I("model", "recompute-num-layers", recompute_num_layers, NULL,
      "full recomputation: layers per group (uniform) or recomputed layers per model chunk (block)"),
    LIST("model", "recompute-modules", recompute_modules,
         "selective recomputation: core_attn (the default), layernorm, mlp, moe (moe_act, mla_up_proj and "
         "shared_experts are refused)"),
    B("model", "recompute-activations", recompute_activations, "the same as --recompute-granularity selective"),
    B("model", "distribute-saved-activations", distribute_saved_activations,
      "full recomputation with tensor parallelism: each layer input kept is split over the tensor group (not "
      "with --sequence-parallel, as Megatron)"),
    /* parallelism */
    I("parallel", "tensor-model-parallel-size", tensor_model_parallel_size, "1", "tensor-parallel ranks: every layer split over them as Megatron splits it (`cohort topology` prints the groups)"),
    I("parallel", "pipeline-model-parallel-size", pipeline_model_parallel_size, "1",
      "pipeline stages: each builds its layers, micro batches flow through them in Megatron's 1F1B or interleaved "
      "schedule (`cohort schedule` prints it)"),
    I("parallel", "context-parallel-size", context_parallel_size, "1",
      "context-parallel ranks: each keeps chunks r and 2cp-r-1 of every sequence (seq divisible by 2cp), attention "
      "is a ring over them (CPU backend; with tensor parallelism, not with pipeline parallelism; --attention-dropout 0)"),
    S("parallel", "cp-comm-type", cp_comm_type, "p2p", "p2p|a2a|allgather|a2a+p2p",
      "how context-parallel attention communicates: p2p (the ring) is built; the others are not supported yet"),
    B("parallel", "cp-packed-sequences", cp_packed_sequences,
      "[cohort] under --context-parallel-size > 1 split each document (--reset-attention-mask) by the 2cp rule "
      "instead of the whole sequence (THD: documents padded to multiples of 2cp, cu_seqlens_padded); always so with --sft"),
    D("parallel", "cp-packed-capacity", cp_packed_capacity, "1.5",
      "[cohort] THD under context parallelism: the padded tokens a sequence may take, as a multiple of --seq-length "
      "(the model's activations are sized for it; a micro batch whose documents need more is refused)"),
    I("parallel", "expert-model-parallel-size", expert_model_parallel_size, "1",
      "expert-parallel ranks: each MoE layer's experts split over groups of this many data-parallel ranks, tokens "
      "exchanged by --moe-token-dispatcher-type (docs/moe.md)"),

    I("parallel", "expert-tensor-parallel-size", expert_tensor_parallel_size, "0",
      "tensor-parallel ranks of each expert (0: the tensor-parallel size, as Megatron); with --num-experts and "
      "tensor parallelism (--sequence-parallel) 1 (each tensor rank holds every expert whole and computes its own "
      "token shard) or the tensor-parallel size (each expert's fc1 rows and fc2 columns split over the tensor "
      "group, which computes its tokens together); other sizes are refused"),
    I("parallel", "virtual-pipeline-model-parallel-size", virtual_pipeline_model_parallel_size, "0",
      "model chunks per pipeline rank: the interleaved schedule (0: one chunk)"),
    I("parallel", "num-virtual-stages-per-pipeline-rank", num_virtual_stages_per_pipeline_rank, "0",
      "the same as --virtual-pipeline-model-parallel-size (Megatron's newer name)"),
    I("parallel", "num-layers-per-virtual-pipeline-stage", num_layers_per_virtual_pipeline_stage, "0",
      "layers per model chunk: the interleaved schedule with layers / pipeline size / this chunks per rank"),
    I("parallel", "microbatch-group-size-per-virtual-pipeline-stage", microbatch_group_size_per_vp_stage, "0",
      "micro batches a chunk runs before the next chunk in the interleaved schedule (0: the pipeline size)"),
    I("parallel", "decoder-first-pipeline-num-layers", decoder_first_pipeline_num_layers, NULL,
      "layers of the first pipeline stage (the others share the rest evenly; default: an even split)"),
    I("parallel", "decoder-last-pipeline-num-layers", decoder_last_pipeline_num_layers, NULL,
      "layers of the last pipeline stage (default: an even split)"),
    B("parallel", "account-for-embedding-in-pipeline-split", account_for_embedding_in_pipeline_split,
      "the embedding counts as one layer of the first stage when layers are split"),
    B("parallel", "account-for-loss-in-pipeline-split", account_for_loss_in_pipeline_split,
      "the loss counts as one layer of the last stage when layers are split"),
    S("parallel", "pipeline-model-parallel-layout", pipeline_model_parallel_layout, "", NULL,
      "the stages' layers as a string: E embedding, t layer, L loss, '|' between stages, X*N repeats "
      "(e.g. \"Et*3|t*4|t*3L\"; default: as the flags above split them)"),
    B("parallel", "use-tp-pp-dp-mapping", use_tp_pp_dp_mapping,
      "rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp (`cohort topology` prints the groups)"),
    B("parallel", "sequence-parallel", sequence_parallel, "sequence parallelism: norms and dropout on token shards of the tensor group (off at tensor-parallel size 1, as Megatron)"),
    B("parallel", "use-distributed-optimizer", use_distributed_optimizer,
      "shard the optimizer state (fp32 moments) over the data-parallel ranks: gradients reduce-scattered in buckets, "
      "each rank updates its shard, parameters all-gathered (ZeRO-1; CPU backend, tensor and pipeline size 1; "
      "docs/distributed-optimizer.md)"),
    L("parallel", "ddp-bucket-size", ddp_bucket_size, "0",
      "elements per gradient bucket of the distributed optimizer and of --overlap-grad-reduce (0: Megatron's "
      "max(40M, 1M x data-parallel size))"),
    B("parallel", "overlap-grad-reduce", overlap_grad_reduce,
      "reduce gradient buckets on a communication thread during the backward, over a second transport of the "
      "gradient group (and of the expert-data-parallel group with expert parallelism)"),
    B("parallel", "overlap-param-gather", overlap_param_gather,
      "all-gather the distributed optimizer's updated parameters bucket by bucket during the next "
      "forward, over the overlapped reduction's own transports (needs --use-distributed-optimizer and "
      "--overlap-grad-reduce)"),
    NB("parallel", "dist-opt-redundancy", dist_opt_redundancy,
       "[cohort] with --use-distributed-optimizer: the next data-parallel rank keeps a copy of each rank's optimizer "
       "shard, so an in-process restart restores a dead rank's shard from memory (on by default; "
       "--no-dist-opt-redundancy saves its memory and time)"),
    /* mixture of experts */
    I("moe", "num-experts", num_experts, "0",
      "experts of each MoE layer (0: a dense model); the MLP of every --moe-layer-freq-th layer is a mixture of "
      "experts (docs/moe.md)"),
    I("moe", "moe-layer-freq", moe_layer_freq, "1",
      "every N-th layer (0, N, 2N, ...) is a MoE layer; or Megatron's list form, one 1 (MoE) or 0 (dense) per layer: "
      "\"([1]*3+[0]*1)*2\", \"[0]*3+[1]*5\", \"[0,1,1,1]\""),
    I("moe", "moe-ffn-hidden-size", moe_ffn_hidden_size, "0", "each expert's hidden size (0: --ffn-hidden-size)"),
    I("moe", "moe-shared-expert-intermediate-size", moe_shared_expert_intermediate_size, "0",
      "the shared expert's hidden size, run on every token (0: none)"),
    I("moe", "moe-router-topk", moe_router_topk, "2", "experts per token"),
    S("moe", "moe-router-score-function", moe_router_score_function, "softmax", "softmax|sigmoid",
      "the router's scores"),
    B("moe", "moe-router-pre-softmax", moe_router_pre_softmax, "softmax over every expert before the top-k"),
    B("moe", "moe-router-enable-expert-bias", moe_router_enable_expert_bias,
      "a per-expert bias on the sigmoid selection scores, moved each step toward the even load "
      "(DeepSeek-V3's aux-loss-free balancing)"),
    D("moe", "moe-router-bias-update-rate", moe_router_bias_update_rate, "0.001",
      "the expert bias's step: bias += rate * sign(mean load - the expert's load)"),
    I("moe", "moe-router-num-groups", moe_router_num_groups, "0", "expert groups of group-limited routing (0: none)"),
    I("moe", "moe-router-group-topk", moe_router_group_topk, "0", "groups each token may use (group-limited routing)"),
    D("moe", "moe-router-topk-scaling-factor", moe_router_topk_scaling_factor, "0",
      "multiplies the routing probabilities (0: none)"),
    S("moe", "moe-router-load-balancing-type", moe_router_load_balancing_type, "aux_loss",
      "aux_loss|seq_aux_loss|global_aux_loss|sinkhorn|none", "the load-balancing loss (sinkhorn: Megatron's "
      "sinkhorn routing, no aux loss)"),
    S("moe", "moe-router-dtype", moe_router_dtype, "fp32", "fp32|fp64",
      "the router's precision: its product and routing in fp32 also under --bf16 (fp64 is not supported yet)"),
    D("moe", "moe-aux-loss-coeff", moe_aux_loss_coeff, "0", "the load-balancing loss's weight"),
    D("moe", "moe-z-loss-coeff", moe_z_loss_coeff, "0", "the router z-loss's weight (0: none)"),
    D("moe", "moe-expert-capacity-factor", moe_expert_capacity_factor, "0",
      "each expert's capacity, as a multiple of its even share of tokens (0: dropless)"),
    S("moe", "moe-token-drop-policy", moe_token_drop_policy, "probs", "probs|position",
      "which tokens an expert over capacity keeps"),
    B("moe", "moe-pad-expert-input-to-capacity", moe_pad_expert_input_to_capacity,
      "every expert computes exactly its capacity of tokens"),
    B("moe", "moe-grouped-gemm", moe_grouped_gemm, "every expert's product in one grouped call"),
    S("moe", "moe-token-dispatcher-type", moe_token_dispatcher_type, "allgather", "allgather|alltoall|flex",
      "how tokens reach the experts of other expert-parallel ranks (flex is not supported)"),
    D("moe", "moe-router-collapse-share", moe_router_collapse_share, "0.9",
      "a training-health event when one expert gets more than this share of a MoE layer's tokens ..."),
    I("moe", "moe-router-collapse-iters", moe_router_collapse_iters, "20",
      "... for this many iterations in a row (0: no check)"),
    /* multi-token prediction */
    I("mtp", "mtp-num-layers", mtp_num_layers, "0",
      "multi-token prediction depths on the last stage: depth k also predicts the token k+1 places further "
      "(0: none; docs/mtp.md)"),
    D("mtp", "mtp-loss-scaling-factor", mtp_loss_scaling_factor, "0.1",
      "the MTP losses' weight: each depth's loss counts factor / depths"),
    /* batch */
    I("batch", "micro-batch-size", micro_batch_size, NULL, "samples per micro batch"),
    B("batch", "calculate-per-token-loss", calculate_per_token_loss,
      "each loss token weighs 1 / (the step's loss tokens over every micro batch and data-parallel rank) instead of "
      "1 / (its micro batch's tokens x micro batches); the MoE and MTP losses as Megatron scales them with it"),
    I("batch", "global-batch-size", global_batch_size, NULL,
      "samples per iteration (default micro batch x data-parallel size)"),
    L("batch", "train-iters", train_iters, NULL, "iterations to train"),
    L("batch", "train-samples", train_samples, NULL, "samples to train (instead of --train-iters)"),
    {"batch", "rampup-batch-size", F_LIST, OFF(rampup_batch_size), OFF(n_rampup_batch_size), 0, NULL, NULL,
     "(START INCREMENT SAMPLES) the global batch starts at START and grows by INCREMENT until --global-batch-size, "
     "over SAMPLES samples (Megatron's num-microbatches calculator: START and INCREMENT multiples of micro batch x "
     "data-parallel size; with --train-samples; the learning rate counts samples)"},
    /* optimizer */
    S("optimizer", "optimizer", optimizer, "adam", "adam", "optimizer (AdamW)"),
    D("optimizer", "lr", lr, NULL, "peak learning rate"),
    D("optimizer", "min-lr", min_lr, "0.0", "learning rate floor after decay"),
    D("optimizer", "decoupled-lr", decoupled_lr, NULL,
      "learning rate of the input embedding and the output layer, on the same schedule as --lr (not with "
      "--use-distributed-optimizer yet)"),
    D("optimizer", "decoupled-min-lr", decoupled_min_lr, NULL, "their minimum (default: --min-lr)"),
    S("optimizer", "lr-decay-style", lr_decay_style, "linear",
      "constant|linear|cosine|inverse-square-root|WSD", "learning-rate decay"),
    L("optimizer", "lr-decay-iters", lr_decay_iters, NULL, "iterations to decay over (default --train-iters)"),
    L("optimizer", "lr-decay-samples", lr_decay_samples, NULL, "samples to decay over (with --train-samples)"),
    L("optimizer", "lr-warmup-iters", lr_warmup_iters, "0", "linear warm-up iterations"),
    L("optimizer", "lr-warmup-samples", lr_warmup_samples, "0", "linear warm-up samples"),
    D("optimizer", "lr-warmup-fraction", lr_warmup_fraction, NULL, "warm-up as a fraction of the decay"),
    D("optimizer", "lr-warmup-init", lr_warmup_init, "0.0", "learning rate at the start of warm-up"),
    L("optimizer", "lr-wsd-decay-iters", lr_wsd_decay_iters, NULL, "iterations of the WSD anneal phase"),
    S("optimizer", "lr-wsd-decay-style", lr_wsd_decay_style, "exponential",
      "exponential|linear|cosine|minus_sqrt", "shape of the WSD anneal"),
    D("optimizer", "weight-decay", weight_decay, "0.01", "decoupled weight decay (weights and embeddings)"),
    D("optimizer", "adam-beta1", adam_beta1, "0.9", "Adam beta1"),
    D("optimizer", "adam-beta2", adam_beta2, "0.999", "Adam beta2"),
    D("optimizer", "adam-eps", adam_eps, "1e-08", "Adam epsilon"),
    D("optimizer", "clip-grad", clip_grad, "1.0", "clip gradients to this global norm (0: off)"),
    B("optimizer", "bf16", bf16, "bf16 matrix products, fp32 master weights and optimizer state"),
    B("optimizer", "fp16", fp16,
      "fp16 matrix products (fp32 accumulation), fp32 master weights and optimizer state, loss scaling"),
    D("optimizer", "loss-scale", loss_scale, NULL, "--fp16: a static loss scale (default: dynamic)"),
    D("optimizer", "initial-loss-scale", initial_loss_scale, "4294967296.0", "--fp16: the dynamic loss scale's start"),
    D("optimizer", "min-loss-scale", min_loss_scale, "1.0", "--fp16: the dynamic loss scale's floor"),
    L("optimizer", "loss-scale-window", loss_scale_window, "1000",
      "--fp16: steps without overflow before the dynamic loss scale doubles"),
    L("optimizer", "hysteresis", hysteresis, "2", "--fp16: overflows before the dynamic loss scale halves"),
    /* data */
    LIST("data", "data-path", data_path, "PREFIX of .bin/.idx files, or 'W1 P1 W2 P2 ...' to blend"),
    LIST("data", "train-data-path", train_data_path, "blend for the train split only ('W1 P1 ...')"),
    LIST("data", "valid-data-path", valid_data_path, "blend for the valid split only"),
    LIST("data", "test-data-path", test_data_path, "blend for the test split only"),
    B("data", "sft", sft, "supervised fine-tuning data (JSONL chat messages, prompt masked)"),
    S("data", "split", split, "969, 30, 1", NULL, "train,valid,test proportions"),
    S("data", "data-cache-path", data_cache_path, NULL, NULL, "where index caches go (default beside the data)"),
    B("data", "mock-data", mock_data, "Megatron's MockGPTDataset instead of files"),
    S("data", "tokenizer-type", tokenizer_type, "GPT2BPETokenizer",
      "GPT2BPETokenizer|NullTokenizer|ByteLevelTokenizer|SentencePieceTokenizer|GPTSentencePieceTokenizer|"
      "Llama2Tokenizer|TikTokenizer",
      "tokenizer (docs/data.md: the SentencePiece types and TikTokenizer need --tokenizer-model)"),
    I("data", "vocab-size", vocab_size, NULL,
      "vocabulary size: NullTokenizer's (required); TikTokenizer's (default: its ranks and special tokens, at most 131072)"),
    S("data", "vocab-file", vocab_file, NULL, NULL, "GPT-2 vocabulary (encoder.json; default: the copy deploy/setup.sh installs)"),
    S("data", "merge-file", merge_file, NULL, NULL, "GPT-2 merges (vocab.bpe; default: the copy deploy/setup.sh installs)"),
    S("data", "tokenizer-model", tokenizer_model, NULL, NULL,
      "SentencePiece model (SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer) or TikTokenizer's ranks file"),
    S("data", "tiktoken-pattern", tiktoken_pattern, NULL, "v1|v2", "TikTokenizer's pre-tokenisation pattern (required)"),
    I("data", "tiktoken-num-special-tokens", tiktoken_num_special_tokens, "1000",
      "TikTokenizer: ids below this are special tokens, ranks follow"),
    LIST("data", "tiktoken-special-tokens", tiktoken_special_tokens,
         "TikTokenizer's special tokens, ids 0, 1, ... (default <unk> <s> </s>; must include those)"),
    L("data", "seed", seed, "1234", "random seed (data order, initialisation, dropout)"),
    B("data", "eod-mask-loss", eod_mask_loss, "no loss on end-of-document tokens"),
    B("data", "reset-position-ids", reset_position_ids, "restart position ids after each end of document"),
    B("data", "reset-attention-mask", reset_attention_mask, "no attention across end of document"),
    /* logging and evaluation */
    I("logging", "log-interval", log_interval, "100", "iterations between log lines"),
    L("logging", "eval-interval", eval_interval, "1000", "iterations between evaluations"),
    L("logging", "eval-iters", eval_iters, "100", "iterations of each evaluation"),
    S("logging", "metrics-file", metrics_file, NULL, NULL, "[cohort] append one JSON object per logged iteration"),
    I("logging", "metrics-port", metrics_port, "0",
      "[cohort] serve Prometheus metrics (GET /metrics) on 127.0.0.1 (several nodes: --master-addr) at this port (0: off)"),
    NB("logging", "progress", progress, "[cohort] live progress bar when stdout is a terminal"),
    S("logging", "tensorboard-dir", tensorboard_dir, NULL, NULL,
      "write TensorBoard event files here (the single process, or the supervisor: the last rank's records)"),
    I("logging", "tensorboard-log-interval", tensorboard_log_interval, "1",
      "training scalars at logged iterations divisible by this"),
    I("logging", "tensorboard-queue-size", tensorboard_queue_size, "1000", "events buffered before they are written"),
    NB("logging", "log-learning-rate-to-tensorboard", log_learning_rate_to_tensorboard,
       "learning-rate in TensorBoard"),
    NB("logging", "log-loss-scale-to-tensorboard", log_loss_scale_to_tensorboard, "loss-scale in TensorBoard"),
    B("logging", "log-validation-ppl-to-tensorboard", log_validation_ppl_to_tensorboard,
      "validation perplexity in TensorBoard"),
    B("logging", "log-timers-to-tensorboard", log_timers_to_tensorboard,
      "iteration-time, throughput and cohort's timers (<timer>-time) in TensorBoard"),
    B("logging", "log-memory-to-tensorboard", log_memory_to_tensorboard,
      "the logging rank's resident memory in TensorBoard (mem-resident-bytes, mem-max-resident-bytes)"),
    B("logging", "log-world-size-to-tensorboard", log_world_size_to_tensorboard, "world-size in TensorBoard"),
    /* exit */
    L("exit", "exit-interval", exit_interval, NULL, "stop after an iteration divisible by this"),
    D("exit", "exit-duration-in-mins", exit_duration_in_mins, NULL, "stop after this many minutes"),
    B("exit", "exit-signal-handler", exit_signal_handler,
      "accepted for Megatron scripts: SIGTERM/SIGINT always finish the step and stop"),
    B("exit", "requeue-on-sigterm", requeue_on_sigterm,
      "[cohort] a clean stop by SIGTERM exits 75 (preempted: saved, requeue to resume), as one by SIGUSR1 always does"),
    /* checkpoints */
    S("checkpoint", "save", save, NULL, NULL, "directory to save checkpoints in"),
    S("checkpoint", "load", load, NULL, NULL, "directory to load a checkpoint from"),
    L("checkpoint", "save-interval", save_interval, NULL,
      "iterations between checkpoints, or auto: [cohort] Young's interval sqrt(2 x save cost x MTBF) from the measured "
      "blocking save time and the faults seen (or --expected-mtbf), re-estimated as the job runs"),
    D("checkpoint", "expected-mtbf", expected_mtbf, "0",
      "[cohort] with --save-interval auto: the mean time between failures, seconds (0: estimated from the faults this "
      "job sees, with a prior of one day worth one hour)"),
    I("checkpoint", "most-recent-k", most_recent_k, "-1", "keep only the k most recent checkpoints (-1: all)"),
    I("checkpoint", "keep-every", keep_every, "0",
      "[cohort; Megatron has none] with --most-recent-k, also keep every checkpoint whose iteration is a multiple of "
      "this (0: none)"),
    D("checkpoint", "save-space-margin", save_space_margin, "2",
      "[cohort] stop saving (and say so) once the save directory's free space is below the last checkpoint's size "
      "times this (0: never)"),
    B("checkpoint", "no-save-optim", no_save_optim, "do not save optimizer state"),
    B("checkpoint", "no-load-optim", no_load_optim, "do not load optimizer state"),
    B("checkpoint", "no-load-rng", no_load_rng, "do not load generator state"),
    B("checkpoint", "finetune", finetune, "load weights only; start at iteration 0"),
    B("checkpoint", "use-checkpoint-args", use_checkpoint_args, "take model arguments from the checkpoint"),
    B("checkpoint", "exit-on-missing-checkpoint", exit_on_missing_checkpoint, "fail if --load has no checkpoint"),
    B("checkpoint", "async-save", async_save, "snapshot to memory, write in the background"),
    L("checkpoint", "ckpt-step", ckpt_step, NULL, "load this iteration instead of the latest"),
    B("checkpoint", "refuse-corrupt-checkpoint", refuse_corrupt_checkpoint,
      "[cohort] fail on a corrupt checkpoint instead of falling back to the previous good one"),
    /* distributed launch */
    I("distributed", "nproc-per-node", nproc_per_node, "1", "worker processes on this node (torchrun's name)"),
    I("distributed", "nnodes", nnodes, "1", "nodes in the job"),
    I("distributed", "node-rank", node_rank, "0", "this node's rank"),
    S("distributed", "master-addr", master_addr, "127.0.0.1", NULL, "address of node 0's supervisor"),
    I("distributed", "master-port", master_port, "29500",
      "port of node 0's supervisor; workers' data ports follow it (port + 1 + rank)"),
    S("distributed", "node-addr", node_addr, NULL, NULL,
      "[cohort] this node's address for its peers (default: --master-addr on node 0, else the host's)"),
    D("distributed", "rendezvous-timeout", rendezvous_timeout, "120",
      "[cohort] seconds for every worker to register before the job fails"),
    S("distributed", "job-secret", job_secret, NULL, NULL, "[cohort] key file from `cohort keygen` (required on tcp)"),
    /* resilience */
    NB("resilience", "check-for-nan-in-loss-and-grad", check_for_nan_in_loss_and_grad,
       "reject a loss or gradient norm that is NaN or Inf (fatal unless a replay clears it)"),
    S("resilience", "rerun-mode", rerun_mode, "validate_results", "disabled|validate_results|report_determinism_stats",
      "validate every iteration's losses and gradient norms before its optimizer step"),
    B("resilience", "check-for-spiky-loss", check_for_spiky_loss,
      "reject a micro batch loss >= 10x the largest of the first 100 (non-fatal)"),
    B("resilience", "check-for-large-grads", check_for_large_grads,
      "reject a gradient norm >= 10x the largest of the first 100 (non-fatal)"),
    NB("resilience", "check-rank-outliers", check_rank_outliers,
       "[cohort] reject a rank whose gradient norm is > 1000x the median of the other ranks'"),
    S("resilience", "on-reproducible-error", on_reproducible_error, "stop", "stop|skip",
      "[cohort] a NaN/Inf that reproduces on a healthy peer too: stop the job (status 3) or skip the iteration"),
    I("resilience", "error-injection-rate", error_injection_rate, "0",
      "inject a validation error about once per N iterations (0: never)"),
    S("resilience", "error-injection-type", error_injection_type, "transient_error",
      "correct_result|transient_error|persistent_error", "kind of error --error-injection-rate injects"),
    S("resilience", "result-rejected-tracker-filename", result_rejected_tracker_filename, NULL, NULL,
      "append a line per rejected result; iterations it shows failing reproducibly are skipped at start"),
    LIST("resilience", "iterations-to-skip", iterations_to_skip, "iterations whose update is skipped"),
    L("resilience", "check-weight-hash-across-dp-replicas-interval", check_weight_hash_interval, "1",
      "every N iterations data-parallel replicas report a checksum of the weights each step used, compared "
      "before the step is applied; a replica that differs is repaired and the step replayed (0: never; needs "
      "the rerun state machine and more than one data-parallel rank)"),
    L("resilience", "check-replicas-interval", check_replicas_interval, "100",
      "[cohort] every N iterations data-parallel replicas compare checksums of their weights and optimizer "
      "moments (0: never)"),
    LIST("resilience", "inject", inject,
         "[cohort] inject a fault, repeatable: KIND@rank=R,step=S[,microbatch=M][,phase=forward|backward|"
         "allreduce|optimizer][,times=once|always][,bit=B][,ms=N]; KIND: kill stop hang slow nan inf spike "
         "bitflip-grad bitflip-param bitflip-act msg-delay msg-drop msg-dup kill-supervisor; R, S may be * or A-B"),
    L("resilience", "inject-seed", inject_seed, "0", "[cohort] seed of random --inject choices (*, A-B, bits)"),
    S("resilience", "fault-injector-ranks", fault_injector_ranks, NULL, NULL,
      "comma-separated ranks the random fault injector hits (or --fault-injector-num-ranks); needs a supervised job"),
    I("resilience", "fault-injector-num-ranks", fault_injector_num_ranks, "0",
      "ranks the random fault injector hits, drawn from 1..world-1 at each plan (0: use --fault-injector-ranks)"),
    S("resilience", "fault-injector-fault-types", fault_injector_fault_types, NULL, NULL,
      "comma-separated fault types, one drawn per plan: sigkill segfault os_abort sigstop gpu_sleep lock_gil, or "
      "cohort's kill stop hang slow nan inf spike bitflip-grad bitflip-param bitflip-act"),
    S("resilience", "fault-injector-fault-probabilities", fault_injector_fault_probabilities, NULL, NULL,
      "comma-separated weights of --fault-injector-fault-types (normalised; default equal)"),
    D("resilience", "fault-injector-fault-delay", fault_injector_fault_delay, "-1",
      "seconds from the start of training (and of each restart) to the fault (< 0: drawn from the MTTI)"),
    D("resilience", "fault-injector-mtti-seconds", fault_injector_mtti_seconds, "0",
      "mean time to injection: each delay is an exponential draw with this mean, from the start of training and "
      "of each restart"),
    D("resilience", "fault-injector-offset-seconds", fault_injector_offset_seconds, "0",
      "seconds added to each drawn delay"),
    L("resilience", "fault-injector-seed", fault_injector_seed, "0", "seed of the random fault injector's draws"),
    D("resilience", "straggler-threshold", straggler_threshold, "0.75",
      "[cohort] flag a rank whose speed score (median of others / its time) is below this"),
    I("resilience", "straggler-evict-after", straggler_evict_after, "0",
      "[cohort] a rank scored below --straggler-threshold this many iterations in a row is evicted: a warm spare "
      "takes its rank and state in an in-process restart and its process is stopped (0: never)"),
    NB("resilience", "inprocess-restart", inprocess_restart,
       "on a dead, hung or silent rank: abort the generation, replace the rank, take its state from a "
       "data-parallel replica's memory and train on inside the surviving processes"),
    D("resilience", "inprocess-soft-timeout", inprocess_soft_timeout, "60",
      "seconds a rank may make no progress before the generation is aborted and restarted (default: learned, "
      "5x the slowest step after 5 steps, at most this)"),
    D("resilience", "inprocess-hard-timeout", inprocess_hard_timeout, "90",
      "seconds without progress after which a rank that did not answer the abort is killed and replaced (sooner: "
      "a stopped process at once, on any node, any other 2 s after every other rank reached the restart barrier)"),
    D("resilience", "inprocess-barrier-timeout", inprocess_barrier_timeout, "120",
      "seconds for every rank to reach the restart barrier"),
    D("resilience", "inprocess-heartbeat-interval", inprocess_heartbeat_interval, "1",
      "seconds between heartbeats, both ways"),
    D("resilience", "inprocess-heartbeat-timeout", inprocess_heartbeat_timeout, "30",
      "seconds of silence after which a rank is lost (killed and replaced, or the job stops)"),
    D("resilience", "node-replacement-timeout", node_replacement_timeout, "0",
      "[cohort] several nodes: seconds the survivors wait at the restart barrier for a new node agent of a lost "
      "node's rank (same --node-rank, same job secret) to join; 0: a lost node stops the job (status 7)"),
    B("resilience", "elastic", elastic,
      "[cohort] elastic data parallelism: capacity lost for good (a node lost with no spare and no new agent "
      "within --node-replacement-timeout, a rank that cannot be restarted) makes the model replicas that lost a "
      "rank (each its tensor x context x pipeline ranks) leave, and the rest train on in the same processes with the same global batch; a returning node "
      "agent grows the job back at the next step (docs/resilience.md, Elastic)"),
    I("resilience", "elastic-min-replicas", elastic_min_replicas, "1",
      "[cohort] --elastic: the fewest model replicas (data-parallel size) the job shrinks to; below it the job "
      "stops as without --elastic"),
    I("resilience", "inprocess-restart-limit", inprocess_restart_limit, "5",
      "[cohort] at most this many restarts within --inprocess-restart-window; then the job stops (status 4)"),
    D("resilience", "inprocess-restart-window", inprocess_restart_window, "600",
      "[cohort] seconds over which --inprocess-restart-limit counts"),
    S("resilience", "inprocess-rank-assignment", inprocess_rank_assignment, "fill-gaps", "fill-gaps|shift-ranks",
      "after a restart: the replacement takes the dead rank's index (fill-gaps), or the survivors keep their "
      "order and close up and replacements take the last ranks (shift-ranks)"),
    S("resilience", "inprocess-granularity", inprocess_granularity, "rank", "rank|node",
      "what a warm spare is and what leaves the active world on a fault: one worker process (rank), or a whole "
      "node (node: spare nodes, whose workers take the ranks of a node that lost one; --inprocess-active-world-size "
      "a multiple of --nproc-per-node)"),
    I("resilience", "inprocess-active-world-size", inprocess_active_world_size, NULL,
      "ranks that train (default: every process); the other --nproc-per-node processes are warm spares "
      "that take a dead rank's place, on any node (the last processes: node-major; not supported yet with 1)"),
    I("resilience", "quarantine-after", quarantine_after, "2",
      "[cohort] a rank the rerun state machine finds faulty this many times within --quarantine-window "
      "iterations is killed and replaced (0: never)"),
    L("resilience", "quarantine-window", quarantine_window, "1000", "[cohort] see --quarantine-after"),
    S("resilience", "run-report", run_report, NULL, NULL,
      "[cohort] JSON run report path (default: run_report.json in --save, if given; the supervisor writes "
      "it, so not supported yet in a single-process job)"),
    /* the timeline of a training step */
    S("timeline", "timeline-dir", timeline_dir, NULL, NULL,
      "[cohort] each rank appends the start and end of its operations (forward, backward, waits, reductions, "
      "optimizer) to DIR/timeline-rank-NNNNN.jsonl; `cohort timeline DIR` draws them (docs/timeline.md)"),
    S("timeline", "timeline-iterations", timeline_iterations, "3", NULL,
      "[cohort] iterations --timeline-dir records: N = the N after the first iteration this run trains (the first "
      "has one-time costs), A:B = iterations A to B (1-based, as the log line counts)"),
    /* Megatron's flags that its example scripts (gpt3, llama, mixtral) pass: their meaning, or
     * no effect where cohort has no such choice, or refused (co_config_check_refused) */
    S("compat", "attention-backend", attention_backend, "auto", "auto|local|unfused|flash|fused",
      "attention implementation: auto, local and unfused run cohort's one attention kernel; flash and fused "
      "(Transformer Engine's FlashAttention and cuDNN kernels) are refused"),
    NB("compat", "position-embedding", add_position_embedding,
       "learned absolute positions; --no-position-embedding (deprecated in Megatron) is accepted with "
       "--position-embedding-type rope, which has none, and refused otherwise (as Megatron)"),
    D("compat", "rotary-percent", rotary_percent, "1.0",
      "share of each head's dimensions RoPE rotates (only 1.0: the others are not supported yet)"),
    B("compat", "use-mcore-models", use_mcore_models, "no effect: cohort's GPT is Megatron Core's (no legacy models)"),
    NB("compat", "masked-softmax-fusion", masked_softmax_fusion,
       "no effect: cohort's attention kernel scales, masks and softmaxes in one pass either way"),
    B("compat", "cross-entropy-loss-fusion", cross_entropy_loss_fusion,
      "no effect: cohort's softmax cross-entropy is always one fused pass"),
    B("compat", "grad-reduce-in-bf16", grad_reduce_in_bf16,
      "no effect: cohort reduces gradients in fp32 (more exact than bf16)"),
    S("compat", "fp8-format", fp8_format, NULL, "e4m3|hybrid", "fp8 training (not supported)"),
    I("compat", "fp8-amax-history-len", fp8_amax_history_len, "1", "fp8's scaling history (not supported: no fp8)"),
    S("compat", "fp8-amax-compute-algo", fp8_amax_compute_algo, "most_recent", "most_recent|max",
      "fp8's scaling rule (not supported: no fp8)"),
    B("compat", "fp8-param-gather", fp8_param_gather, "fp8 parameter all-gather (not supported: no fp8)"),
    B("compat", "manual-gc", manual_gc, "no effect: cohort has no garbage collector"),
    I("compat", "empty-unused-memory-level", empty_unused_memory_level, "0",
      "no effect: cohort has no caching allocator to empty"),
    I("compat", "num-workers", num_workers, "2", "no effect: cohort reads data on the training thread"),
    NB("compat", "mmap-bin-files", mmap_bin_files, "no effect: cohort always memory-maps .bin files"),
    NB("compat", "create-attention-mask-in-dataloader", create_attention_mask_in_dataloader,
       "no effect: cohort never builds attention masks (causal, with document starts)"),
    B("compat", "log-throughput", log_throughput, "no effect: cohort's log line always has the throughput"),
    B("compat", "profile", profile, "no effect: no profiler here; --timeline-dir records each step's operations"),
    I("compat", "profile-step-start", profile_step_start, "10", "no effect (see --profile)"),
    I("compat", "profile-step-end", profile_step_end, "12", "no effect (see --profile)"),
    S("compat", "ckpt-format", ckpt_format, "torch_dist", "torch|torch_dist|zarr|fsdp_dtensor",
      "no effect: cohort writes its own format (safetensors shards and a manifest; `cohort ckpt`)"),
    I("compat", "distributed-timeout-minutes", distributed_timeout_minutes, "10",
      "no effect: cohort's collectives time out on their own (--inprocess-soft-timeout and friends)"),
    S("compat", "wandb-project", wandb_project, NULL, NULL,
      "no effect: no Weights & Biases client (--tensorboard-dir, --metrics-file)"),
    S("compat", "wandb-exp-name", wandb_exp_name, NULL, NULL, "no effect (see --wandb-project)"),
    /* cohort */
    I("cohort", "threads", threads, NULL, "[cohort] CPU threads (default: all online cores)"),
    S("cohort", "device", device, "auto", "auto|cpu|cuda",
      "[cohort] where the model runs: auto = cuda where a GPU is present, else cpu"),
    S("cohort", "workdir", workdir, NULL, NULL,
      "[cohort] where the embedded default job keeps its corpus (default ~/.cache/cohort)"),
    I("cohort", "sample-lines", sample_lines, "4", "[cohort] lines to sample after the embedded job"),
};
#define NFLAGS (sizeof flags / sizeof flags[0])
_Static_assert(NFLAGS <= 256, "co_config.set is too small");

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_dbl(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static bool in_choices(const char *choices, const char *v) {
    size_t n = strlen(v);
    const char *p = choices;
    while (*p) {
        const char *q = strchr(p, '|');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return true;
        if (!q) break;
        p = q + 1;
    }
    return false;
}

/* --data-path and the per-split --train/valid/test-data-path. */
static bool is_data_path_flag(const flag *f) {
    size_t n = strlen(f->name);
    return n >= 9 && !strcmp(f->name + n - 9, "data-path");
}

/* Whether v's first space-separated word is a number (a blend's weight). */
static bool starts_with_number(const char *v) {
    while (*v == ' ' || *v == '\t') v++;
    char word[64];
    size_t n = strcspn(v, " \t");
    if (!n || n >= sizeof word) return false;
    memcpy(word, v, n);
    word[n] = '\0';
    double d;
    return parse_dbl(word, &d) == 0 && d - d == 0; /* finite: a path named "inf" or "nan" is a path */
}

/* --moe-layer-freq: an integer flag that also takes Megatron's list form (moe_layer_list) */
static bool is_moe_freq(const flag *f) { return !strcmp(f->name, "moe-layer-freq"); }

bool co_config_moe_layer(const co_config *c, int l) {
    if (c->moe_layer_list[0]) return l >= 0 && (size_t)l < strlen(c->moe_layer_list) && c->moe_layer_list[l] == '1';
    return c->moe_layer_freq > 0 && l % c->moe_layer_freq == 0;
}

/* The list form as Megatron's args hold it, "[1, 1, 0]", into buf. */
static void moe_list_text(const co_config *c, char *buf, size_t n) {
    size_t len = 0;
    for (const char *q = c->moe_layer_list; *q && len + 4 < n; q++)
        len += (size_t)snprintf(buf + len, n - len, "%s%c", q == c->moe_layer_list ? "[" : ", ", *q);
    snprintf(buf + len, n - len, "]");
}

/* Sets flag f from text v. */
static int apply(co_config *c, const flag *f, const char *v) {
    char *base = (char *)c + f->off;
    int64_t iv;
    double dv;
    switch (f->kind) {
    case F_INT:
        if (is_moe_freq(f)) {
            c->moe_layer_list[0] = '\0';
            if (strchr(v, '[')) { /* Megatron's list form */
                *(int *)base = 0;
                return co_moe_layer_list(v, c->moe_layer_list, sizeof c->moe_layer_list);
            }
        }
        if (parse_i64(v, &iv) || iv < INT_MIN || iv > INT_MAX)
            return co_err_set(CO_EINVAL, "--%s expects an integer, got '%s'", f->name, v);
        *(int *)base = (int)iv;
        break;
    case F_I64:
        if (!strcmp(f->name, "save-interval") && !strcmp(v, "auto")) {
            *(int64_t *)base = CO_SAVE_INTERVAL_AUTO;
            break;
        }
        if (parse_i64(v, &iv)) return co_err_set(CO_EINVAL, "--%s expects an integer, got '%s'", f->name, v);
        *(int64_t *)base = iv;
        break;
    case F_DBL:
        if (parse_dbl(v, &dv)) return co_err_set(CO_EINVAL, "--%s expects a number, got '%s'", f->name, v);
        *(double *)base = dv;
        break;
    case F_STR:
        if (f->choices && !in_choices(f->choices, v))
            return co_err_set(CO_EINVAL, "--%s must be one of %s, got '%s'", f->name, f->choices, v);
        if (strlen(v) >= f->size) return co_err_set(CO_EINVAL, "--%s: value too long", f->name);
        strcpy(base, v);
        break;
    case F_BOOL: *(bool *)base = true; break;
    case F_NOBOOL: *(bool *)base = true; break;
    case F_LIST: {
        /* "A" or "W1 A W2 B" (spaces or several argv words). A data path word is split at
         * spaces only when it is a weighted blend, its first word a number (Megatron's
         * --data-path is nargs='*': "0.3 A 0.7 B" in one word or four); any other word is one
         * path, spaces and all. */
        char **list = (char **)(void *)base;
        int *count = (int *)(void *)((char *)c + f->off2);
        if (is_data_path_flag(f) && !starts_with_number(v)) {
            if (!*v) return 0;
            if (*count >= CO_MAX_DATA_PATHS)
                return co_err_set(CO_EINVAL, "--%s: more than %d entries", f->name, CO_MAX_DATA_PATHS);
            if (!(list[*count] = strdup(v))) return co_err_set(CO_ENOMEM, "--%s: out of memory", f->name);
            (*count)++;
            break;
        }
        char *copy = strdup(v), *save = NULL;
        if (!copy) return co_err_set(CO_ENOMEM, "--%s: out of memory", f->name);
        for (char *tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
            if (*count >= CO_MAX_DATA_PATHS) {
                free(copy);
                return co_err_set(CO_EINVAL, "--%s: more than %d entries", f->name, CO_MAX_DATA_PATHS);
            }
            list[*count] = strdup(tok);
            if (!list[*count]) { free(copy); return co_err_set(CO_ENOMEM, "--%s: out of memory", f->name); }
            (*count)++;
        }
        free(copy);
        break;
    }
    }
    return 0;
}

void co_config_defaults(co_config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NFLAGS; i++) {
        const flag *f = &flags[i];
        char *base = (char *)c + f->off;
        if (f->kind == F_BOOL) { *(bool *)base = false; continue; }
        if (f->kind == F_NOBOOL) { *(bool *)base = true; continue; }
        if (f->kind == F_LIST) continue;
        if (!f->def) {
            /* unset: -1 for numbers, "" for strings */
            if (f->kind == F_INT) *(int *)base = -1;
            else if (f->kind == F_I64) *(int64_t *)base = -1;
            else if (f->kind == F_DBL) *(double *)base = -1.0;
            continue;
        }
        (void)apply(c, f, f->def); /* the table's defaults parse */
    }
}

void co_config_free(co_config *c) {
    for (size_t i = 0; i < NFLAGS; i++) {
        if (flags[i].kind != F_LIST) continue;
        char **list = (char **)(void *)((char *)c + flags[i].off);
        int *count = (int *)(void *)((char *)c + flags[i].off2);
        for (int k = 0; k < *count; k++) free(list[k]);
        *count = 0;
    }
}

int co_edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 128 || m > 128) return INT_MAX;
    int prev[129], cur[129];
    for (size_t j = 0; j <= m; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (m + 1));
    }
    return prev[m];
}

static const flag *find_flag(const char *name, size_t len, bool *negated) {
    *negated = false;
    for (size_t i = 0; i < NFLAGS; i++)
        if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0) return &flags[i];
    if (len > 3 && strncmp(name, "no-", 3) == 0) {
        for (size_t i = 0; i < NFLAGS; i++)
            if (flags[i].kind == F_NOBOOL && strlen(flags[i].name) == len - 3 &&
                strncmp(flags[i].name, name + 3, len - 3) == 0) {
                *negated = true;
                return &flags[i];
            }
    }
    return NULL;
}

static const char *closest_flag(const char *name) {
    const char *best = NULL;
    int bestd = INT_MAX;
    for (size_t i = 0; i < NFLAGS; i++) {
        int d = co_edit_distance(name, flags[i].name);
        /* a flag that contains what was typed (or the reverse) is a good guess too */
        if (strstr(flags[i].name, name) || strstr(name, flags[i].name)) d = d < 3 ? d : 3;
        if (d < bestd) { bestd = d; best = flags[i].name; }
    }
    return best;
}

int co_config_parse(co_config *c, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2])
            return co_err_set(CO_EINVAL, "unexpected argument '%s' (flags start with --)", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        /* accept underscores as Megatron's argparse does not, but users type them */
        char norm[128];
        if (len >= sizeof norm) return co_err_set(CO_EINVAL, "unknown flag '%s'", a);
        for (size_t k = 0; k < len; k++) norm[k] = name[k] == '_' ? '-' : name[k];
        norm[len] = '\0';
        bool neg;
        const flag *f = find_flag(norm, len, &neg);
        if (!f) {
            const char *guess = closest_flag(norm);
            return co_err_set(CO_EINVAL, "unknown flag '--%s'; did you mean '--%s'?", norm, guess);
        }
        c->set[f - flags] = 1;
        if (f->kind == F_BOOL || f->kind == F_NOBOOL) {
            if (eq) return co_err_set(CO_EINVAL, "--%s takes no value", f->name);
            *(bool *)((char *)c + f->off) = !neg;
            continue;
        }
        const char *v;
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else return co_err_set(CO_EINVAL, "--%s needs a value", f->name);
        if (f->kind == F_LIST) {
            /* every following word that is not a flag belongs to the list */
            int rc = apply(c, f, v);
            if (rc) return rc;
            while (!eq && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                rc = apply(c, f, argv[++i]);
                if (rc) return rc;
            }
            continue;
        }
        int rc = apply(c, f, v);
        if (rc) return rc;
    }
    return 0;
}

bool co_config_was_set(const co_config *c, const char *name) {
    for (size_t i = 0; i < NFLAGS; i++)
        if (strcmp(flags[i].name, name) == 0) return c->set[i] != 0;
    return false;
}

void co_problems_init(co_problems *P) {
    P->text[0] = '\0';
    P->len = 0;
    P->n = 0;
}

void co_problem(co_problems *P, const char *fmt, ...) {
    size_t cap = sizeof P->text;
    if (P->len + 2 >= cap) { P->n++; return; }
    va_list ap;
    va_start(ap, fmt);
    if (P->n) P->text[P->len++] = '\n';
    int w = vsnprintf(P->text + P->len, cap - P->len, fmt, ap);
    va_end(ap);
    if (w > 0) P->len += (size_t)w < cap - P->len ? (size_t)w : cap - P->len - 1;
    P->n++;
}

bool co_problem_range(co_problems *P, const char *name, int64_t v, int64_t lo, int64_t hi) {
    if (v >= lo && v <= hi) return false;
    co_problem(P, "--%s %lld is out of range (%lld to %lld)", name, (long long)v, (long long)lo, (long long)hi);
    return true;
}

bool co_problem_dbl_range(co_problems *P, const char *name, double v, double lo, double hi, bool strict) {
    bool ok = (strict ? v > lo : v >= lo) && v <= hi; /* false for NaN */
    if (ok) return false;
    co_problem(P, "--%s %g is out of range (%s%g to %g)", name, v, strict ? "above " : "", lo, hi);
    return true;
}

int64_t co_config_split_samples(const co_config *c, int split) {
    int64_t gbs = c->global_batch_size;
    /* Megatron's: --train-samples when given (with a batch ramp-up the iterations' batches
     * differ), else iterations x batch */
    if (split == 0) return c->train_samples > 0 ? c->train_samples : c->train_iters * gbs;
    if (split == 1) return (c->train_iters / c->eval_interval + 1) * c->eval_iters * gbs;
    return c->eval_iters * gbs;
}

int co_config_parse_split(const char *s, double out[3]) {
    double v[3] = {0, 0, 0};
    int n = 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '/') p++;
        if (!*p) break;
        if (n == 3) return -1;
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || x < 0 || x != x) return -1;
        v[n++] = x;
        p = end;
        while (*p == ' ') p++;
        if (*p && *p != ',' && *p != '/') return -1;
    }
    double sum = v[0] + v[1] + v[2];
    if (n == 0 || !(sum > 0)) return -1;
    for (int i = 0; i < 3; i++) out[i] = v[i] / sum;
    return 0;
}

/* --timeline-iterations: "N" (1 <= N: from = 2, to = N + 1, relative to the run's start)
 * or "A:B" (1 <= A <= B, absolute); at most CO_MAX_ITERS. 0 or -1. */
static int parse_timeline_iterations(const char *s, int64_t *from, int64_t *to, bool *relative) {
    const char *colon = strchr(s, ':');
    int64_t a, b;
    if (!colon) {
        if (parse_i64(s, &a) || a < 1 || a > CO_MAX_ITERS) return -1;
        *from = 2;
        *to = a + 1;
        *relative = true;
        return 0;
    }
    char left[32];
    size_t n = (size_t)(colon - s);
    if (n == 0 || n >= sizeof left) return -1;
    memcpy(left, s, n);
    left[n] = '\0';
    if (parse_i64(left, &a) || parse_i64(colon + 1, &b) || a < 1 || b < a || b > CO_MAX_ITERS) return -1;
    *from = a;
    *to = b;
    *relative = false;
    return 0;
}

bool co_config_timeline_records(const co_config *c, int64_t start, int64_t it) {
    if (!c->timeline_dir[0] || c->timeline_to < 1) return false;
    int64_t base = c->timeline_relative ? start : 0;
    return it >= base + c->timeline_from && it <= base + c->timeline_to;
}

#define GIVEN(name) co_config_was_set(c, name)

bool co_config_model_parallel_sizes_ok(const co_config *c) {
    return c->tensor_model_parallel_size >= 1 && c->tensor_model_parallel_size <= CO_MAX_TP_GROUP &&
           c->context_parallel_size >= 1 && c->context_parallel_size <= CO_MAX_CP_GROUP &&
           c->pipeline_model_parallel_size >= 1 && c->pipeline_model_parallel_size <= CO_MAX_PP_STAGES;
}

void co_config_check_refused(const co_config *c, co_problems *P) {
    if (!strcmp(c->attention_backend, "flash") || !strcmp(c->attention_backend, "fused"))
        co_problem(P, "--attention-backend %s selects Transformer Engine's %s attention, which cohort does not have: "
                      "use auto (local and unfused are the same: cohort's one attention kernel)", c->attention_backend,
                   !strcmp(c->attention_backend, "flash") ? "FlashAttention" : "cuDNN fused");
    if (!c->add_position_embedding && strcmp(c->position_embedding_type, "rope"))
        co_problem(P, "--no-position-embedding with --position-embedding-type %s: Megatron refuses it too (the flag is "
                      "deprecated); give --position-embedding-type rope, which has no learned positions",
                   c->position_embedding_type);
    if (c->rotary_percent != 1.0)
        co_problem(P, "--rotary-percent %g is not supported yet: RoPE rotates every dimension of a head (1.0)",
                   c->rotary_percent);
    if (GIVEN("decoupled-lr") && c->decoupled_lr < 0)
        co_problem(P, "--decoupled-lr %g must be at least 0", c->decoupled_lr);
    if (GIVEN("decoupled-min-lr") && !GIVEN("decoupled-lr"))
        co_problem(P, "--decoupled-min-lr needs --decoupled-lr (the input and output layers' rate it ends at)");
    else if (GIVEN("decoupled-min-lr") && (c->decoupled_min_lr < 0 || c->decoupled_min_lr > c->decoupled_lr))
        co_problem(P, "--decoupled-min-lr %g must be between 0 and --decoupled-lr %g", c->decoupled_min_lr,
                   c->decoupled_lr);
    if (c->fp8_format[0] || GIVEN("fp8-amax-history-len") || GIVEN("fp8-amax-compute-algo") || c->fp8_param_gather)
        co_problem(P, "--fp8-format and the other --fp8-* flags: fp8 is not supported; use --bf16");
}

void co_config_check_micro_batch(const co_config *c, co_problems *P) {
    if (c->micro_batch_size == -1 && !GIVEN("micro-batch-size"))
        co_problem(P, "--micro-batch-size must be given and positive");
    else co_problem_range(P, "micro-batch-size", c->micro_batch_size, 1, CO_MAX_MICRO_BATCH);
}

/* The global batch (micro x dp when not given), a whole number of micro batches per rank,
 * at most what the rerun state machine validates. Returns whether it is valid. */
static bool check_batch(co_config *c, int dp, co_problems *P) {
    /* -1: not given (derived below); a given value, -1 included, must be in range */
    if (GIVEN("global-batch-size") || c->global_batch_size != -1)
        co_problem_range(P, "global-batch-size", c->global_batch_size, 1, CO_MAX_GLOBAL_BATCH);
    int64_t per_step = (int64_t)c->micro_batch_size * dp;
    if (c->global_batch_size == -1) {
        if (per_step > CO_MAX_GLOBAL_BATCH)
            co_problem(P, "--micro-batch-size %d x data-parallel size %d is more than %d samples per iteration",
                       c->micro_batch_size, dp, CO_MAX_GLOBAL_BATCH);
        else
            c->global_batch_size = (int)per_step;
    }
    bool batch_ok = c->global_batch_size >= 1 && c->global_batch_size <= CO_MAX_GLOBAL_BATCH;
    if (batch_ok && c->global_batch_size % per_step) {
        co_problem(P, "--global-batch-size %d is not a multiple of --micro-batch-size %d x data-parallel size %d",
                   c->global_batch_size, c->micro_batch_size, dp);
        batch_ok = false;
    }
    return batch_ok;
}

/* The run's length (iterations, or samples turned into iterations) and its evaluation.
 * batch_ok: the global batch is valid. Returns whether the batch and length are. */
static bool check_length(co_config *c, bool batch_ok, co_problems *P) {
    bool iters_bad = false, samples_bad = false;
    if (GIVEN("train-iters") || c->train_iters != -1)
        iters_bad = co_problem_range(P, "train-iters", c->train_iters, 1, CO_MAX_ITERS);
    if (GIVEN("train-samples") || c->train_samples != -1)
        samples_bad = co_problem_range(P, "train-samples", c->train_samples, 1, CO_MAX_ITERS);
    if (iters_bad || samples_bad) batch_ok = false;
    else if ((c->train_iters > 0) == (c->train_samples > 0))
        co_problem(P, "give exactly one of --train-iters and --train-samples (positive)");
    else if (batch_ok && c->train_samples > 0 && c->rampup_start > 0) {
        c->train_iters = co_config_rampup_iters(c);
    } else if (batch_ok && c->train_samples > 0) {
        if (c->train_samples % c->global_batch_size)
            co_problem(P, "--train-samples %lld is not a multiple of --global-batch-size %d",
                       (long long)c->train_samples, c->global_batch_size);
        c->train_iters = c->train_samples / c->global_batch_size;
    }
    if (GIVEN("eval-interval") || c->eval_interval < 1)
        co_problem_range(P, "eval-interval", c->eval_interval, 1, CO_MAX_ITERS);
    if (GIVEN("eval-iters") || c->eval_iters < 0) co_problem_range(P, "eval-iters", c->eval_iters, 0, CO_MAX_ITERS);
    if (batch_ok && c->train_iters > 0 && c->eval_interval >= 1 && c->eval_iters >= 0 &&
        c->eval_iters <= CO_MAX_ITERS) {
        /* the samples each split must provide (co_config_split_samples) fit int64 */
        double gbs = c->global_batch_size, train = (double)c->train_iters * gbs,
               valid = ((double)(c->train_iters / c->eval_interval) + 1) * (double)c->eval_iters * gbs;
        if (train > (double)CO_MAX_ITERS || valid > (double)CO_MAX_ITERS)
            co_problem(P, "the run asks for %.3g training and %.3g validation samples: more than %lld", train, valid,
                       (long long)CO_MAX_ITERS);
    }
    return batch_ok;
}

/* The timeline's iterations ("N" or "A:B"), parsed into timeline_from/to/relative. */
static void check_timeline(co_config *c, bool batch_ok, co_problems *P) {
    int64_t a = 0, b = 0;
    bool rel = false;
    if (parse_timeline_iterations(c->timeline_iterations, &a, &b, &rel))
        co_problem(P, "--timeline-iterations '%s' is not N (the N iterations after the first, 1 to %lld) or A:B "
                      "(iterations A to B, 1 <= A <= B)", c->timeline_iterations, (long long)CO_MAX_ITERS);
    else if (GIVEN("timeline-iterations") && !c->timeline_dir[0])
        co_problem(P, "--timeline-iterations needs --timeline-dir (where each rank writes its timeline)");
    else if (!rel && batch_ok && c->train_iters > 0 && a > c->train_iters)
        co_problem(P, "--timeline-iterations %s records nothing: the run ends at iteration %lld",
                   c->timeline_iterations, (long long)c->train_iters);
    c->timeline_from = a;
    c->timeline_to = b;
    c->timeline_relative = rel;
}

/* The learning-rate schedule; derives the decay iterations (--train-iters when not given)
 * and turns a sample-based schedule into iterations. */
static void check_lr(co_config *c, bool batch_ok, co_problems *P) {
    if (!(c->lr > 0 && c->lr <= 1e6)) co_problem(P, "--lr must be given and positive (at most 1e6)");
    if (c->min_lr < 0 || c->min_lr > c->lr) co_problem(P, "--min-lr must be between 0 and --lr");
    if (c->lr_warmup_init < 0 || c->lr_warmup_init > 1e6) co_problem(P, "--lr-warmup-init must be between 0 and 1e6");
    if (GIVEN("lr-warmup-fraction")) co_problem_dbl_range(P, "lr-warmup-fraction", c->lr_warmup_fraction, 0, 1, false);
    else if (c->lr_warmup_fraction > 1) co_problem(P, "--lr-warmup-fraction must be at most 1");
    if (c->lr_warmup_fraction >= 0 && (c->lr_warmup_iters > 0 || c->lr_warmup_samples > 0))
        co_problem(P, "give only one of --lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples");
    if (GIVEN("lr-decay-iters")) co_problem_range(P, "lr-decay-iters", c->lr_decay_iters, 1, CO_MAX_ITERS);
    if (GIVEN("lr-decay-samples")) co_problem_range(P, "lr-decay-samples", c->lr_decay_samples, 1, CO_MAX_ITERS);
    co_problem_range(P, "lr-warmup-iters", c->lr_warmup_iters, 0, CO_MAX_ITERS);
    co_problem_range(P, "lr-warmup-samples", c->lr_warmup_samples, 0, CO_MAX_ITERS);
    if (GIVEN("lr-wsd-decay-iters"))
        co_problem_range(P, "lr-wsd-decay-iters", c->lr_wsd_decay_iters, 0, CO_MAX_ITERS);
    if (c->lr_decay_iters < 1) c->lr_decay_iters = c->train_iters;
    if (batch_ok && (c->lr_warmup_samples > 0 || c->lr_decay_samples > 0)) {
        /* sample-based schedule: convert to iterations */
        if (c->lr_warmup_samples > 0) c->lr_warmup_iters = c->lr_warmup_samples / c->global_batch_size;
        if (c->lr_decay_samples > 0) c->lr_decay_iters = c->lr_decay_samples / c->global_batch_size;
    }
    if (strcmp(c->lr_decay_style, "WSD") == 0 && c->lr_wsd_decay_iters < 0)
        co_problem(P, "--lr-decay-style WSD needs --lr-wsd-decay-iters");
    if (c->lr_decay_iters >= 1 && c->lr_warmup_iters > c->lr_decay_iters &&
        strcmp(c->lr_decay_style, "constant") != 0 && c->lr_warmup_fraction < 0)
        co_problem(P, "--lr-warmup-iters %lld exceeds the decay iterations %lld", (long long)c->lr_warmup_iters,
                   (long long)c->lr_decay_iters);
}

/* --fp16 and its loss scale (Megatron's asserts: one precision, positive scales, the floor
 * not above the start). The scales stay within fp32, which holds them. */
static void check_loss_scale(const co_config *c, co_problems *P) {
    if (c->fp16 && c->bf16) co_problem(P, "--fp16 and --bf16 together: give one of them");
    if (GIVEN("loss-scale") && !(c->loss_scale > 0 && c->loss_scale <= 1e38))
        co_problem(P, "--loss-scale %g must be positive (at most 1e38)", c->loss_scale);
    if (!(c->initial_loss_scale > 0 && c->initial_loss_scale <= 1e38))
        co_problem(P, "--initial-loss-scale %g must be positive (at most 1e38)", c->initial_loss_scale);
    else if (!(c->min_loss_scale > 0 && c->min_loss_scale <= c->initial_loss_scale))
        co_problem(P, "--min-loss-scale %g must be positive and at most --initial-loss-scale %g", c->min_loss_scale,
                   c->initial_loss_scale);
    co_problem_range(P, "loss-scale-window", c->loss_scale_window, 1, CO_MAX_ITERS);
    co_problem_range(P, "hysteresis", c->hysteresis, 1, CO_MAX_ITERS);
}

/* Dropout, initialisation and AdamW's hyperparameters. */
static void check_optimizer(const co_config *c, co_problems *P) {
    if (c->hidden_dropout < 0 || c->hidden_dropout >= 1) co_problem(P, "--hidden-dropout must be in [0, 1)");
    if (c->attention_dropout < 0 || c->attention_dropout >= 1) co_problem(P, "--attention-dropout must be in [0, 1)");
    if (!(c->init_method_std > 0 && c->init_method_std <= 1e3)) co_problem(P, "--init-method-std must be positive");
    if (!(c->adam_beta1 >= 0 && c->adam_beta1 < 1 && c->adam_beta2 >= 0 && c->adam_beta2 < 1))
        co_problem(P, "--adam-beta1 and --adam-beta2 must be in [0, 1)");
    if (!(c->adam_eps > 0 && c->adam_eps < 1)) co_problem(P, "--adam-eps must be positive (below 1)");
    if (!(c->clip_grad >= 0 && c->clip_grad <= 1e12)) co_problem(P, "--clip-grad must be >= 0");
    if (!(c->weight_decay >= 0 && c->weight_decay <= 1e3)) co_problem(P, "--weight-decay must be >= 0");
    check_loss_scale(c, P);
}

/* Logging, exit conditions and checkpoints' intervals. */
static void check_logging(const co_config *c, co_problems *P) {
    co_problem_range(P, "log-interval", c->log_interval, 1, INT_MAX);
    co_problem_range(P, "tensorboard-log-interval", c->tensorboard_log_interval, 1, INT_MAX);
    co_problem_range(P, "tensorboard-queue-size", c->tensorboard_queue_size, 1, 1000000);
    if (GIVEN("exit-interval")) co_problem_range(P, "exit-interval", c->exit_interval, 1, CO_MAX_ITERS);
    if (GIVEN("exit-duration-in-mins"))
        co_problem_dbl_range(P, "exit-duration-in-mins", c->exit_duration_in_mins, 0, 1e9, true);
    if (GIVEN("save-interval") && c->save_interval != CO_SAVE_INTERVAL_AUTO)
        co_problem_range(P, "save-interval", c->save_interval, 1, CO_MAX_ITERS);
    if (c->save_interval == CO_SAVE_INTERVAL_AUTO && !c->save[0])
        co_problem(P, "--save-interval auto needs --save (the directory the checkpoints go to)");
    if (c->save_interval == CO_SAVE_INTERVAL_AUTO && !strcmp(c->rerun_mode, "disabled") &&
        c->nproc_per_node * (c->nnodes > 0 ? c->nnodes : 1) > 1)
        co_problem(P, "--save-interval auto with several processes needs --rerun-mode validate_results (or "
                      "report_determinism_stats): each step's verdict is what tells every rank the same iteration to save");
    if (GIVEN("expected-mtbf")) co_problem_dbl_range(P, "expected-mtbf", c->expected_mtbf, 0, 1e12, true);
    co_problem_range(P, "metrics-port", c->metrics_port, 0, 65535);
    if (c->most_recent_k != -1) co_problem_range(P, "most-recent-k", c->most_recent_k, 1, INT_MAX);
    if (c->keep_every) co_problem_range(P, "keep-every", c->keep_every, 1, INT_MAX);
    co_problem_dbl_range(P, "save-space-margin", c->save_space_margin, 0, 1000, false);
    if (GIVEN("ckpt-step")) co_problem_range(P, "ckpt-step", c->ckpt_step, 0, CO_MAX_ITERS);
    co_problem_range(P, "sample-lines", c->sample_lines, 0, 1000);
}

/* The split and the data paths: blends in pairs, one source of data. */
static void check_data(const co_config *c, co_problems *P) {
    double sp[3];
    if (co_config_parse_split(c->split, sp))
        co_problem(P, "--split '%s' is not 1 to 3 non-negative numbers with a positive sum", c->split);
    if (c->n_data_path > 1 && c->n_data_path % 2)
        co_problem(P, "--data-path with weights needs 'W1 PREFIX1 W2 PREFIX2 ...'");
    static const char *names[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
    const int ns[3] = {c->n_train_data_path, c->n_valid_data_path, c->n_test_data_path};
    for (int s = 0; s < 3; s++)
        if (ns[s] > 1 && ns[s] % 2) co_problem(P, "%s with weights needs 'W1 PREFIX1 W2 PREFIX2 ...'", names[s]);
    if ((ns[0] || ns[1] || ns[2]) && (c->n_data_path || c->mock_data))
        co_problem(P, "give --data-path (or --mock-data) or the per-split --train/valid/test-data-path, not both");
    if ((ns[1] || ns[2]) && !ns[0] && !c->n_data_path && !c->mock_data)
        co_problem(P, "--valid-data-path/--test-data-path need --train-data-path");
    if (c->sft && c->mock_data) co_problem(P, "--sft reads JSONL conversations: give --data-path, not --mock-data");
    if (c->n_data_path && c->mock_data) co_problem(P, "give --data-path or --mock-data, not both");
}

/* The launch: the supervisor's and workers' ports, the rendezvous timeout, threads. */
static void check_launch(const co_config *c, co_problems *P) {
    int64_t procs = (int64_t)c->nproc_per_node * c->nnodes;
    if (c->master_port < 1 || c->master_port > 65535) co_problem(P, "--master-port must be in 1..65535");
    else if (procs > 1 && (int64_t)c->master_port + procs > 65535)
        co_problem(P, "--master-port %d: the workers' data ports (port + 1 + rank, up to %lld) pass 65535",
                   c->master_port, (long long)c->master_port + procs);
    /* timeouts become int milliseconds: at most 10^6 s */
    co_problem_dbl_range(P, "rendezvous-timeout", c->rendezvous_timeout, 0, 1e6, true);
    if (GIVEN("threads") || c->threads == 0 || c->threads < -1)
        co_problem_range(P, "threads", c->threads, 1, CO_MAX_THREADS);
}

int co_config_batch_at(const co_config *c, int64_t consumed) {
    int64_t gbs = c->global_batch_size;
    if (c->rampup_start <= 0 || consumed > c->rampup_samples) return (int)gbs;
    /* Megatron's RampupBatchsizeNumMicroBatchesCalculator.update, in its floating point */
    double per_increment = (double)c->rampup_samples / (double)((gbs - c->rampup_start) / c->rampup_increment);
    int64_t steps = (int64_t)((double)consumed / per_increment);
    int64_t b = c->rampup_start + steps * c->rampup_increment;
    return (int)(b < gbs ? b : gbs);
}

int64_t co_config_rampup_iters(const co_config *c) {
    /* Megatron's update_train_iters: the ramp's iterations one by one, then whole batches
     * (a partial last batch is dropped) */
    int64_t iters = 0, consumed = 0;
    while (consumed <= c->rampup_samples && consumed <= c->train_samples && iters < CO_MAX_ITERS) {
        consumed += co_config_batch_at(c, consumed);
        iters++;
    }
    if (c->train_samples > consumed) iters += (c->train_samples - consumed) / c->global_batch_size;
    return iters;
}

/* --rampup-batch-size START INCREMENT SAMPLES: Megatron's calculator's checks, and the
 * schedule it needs (sample-based). The batch must be valid (batch_ok). */
static void check_rampup(co_config *c, int dp, bool batch_ok, co_problems *P) {
    c->rampup_start = c->rampup_increment = c->rampup_samples = 0;
    if (!c->n_rampup_batch_size) return;
    int64_t v[3];
    if (c->n_rampup_batch_size != 3 || parse_i64(c->rampup_batch_size[0], &v[0]) ||
        parse_i64(c->rampup_batch_size[1], &v[1]) || parse_i64(c->rampup_batch_size[2], &v[2])) {
        co_problem(P, "--rampup-batch-size takes three integers: START INCREMENT SAMPLES (e.g. 16 16 5859375)");
        return;
    }
    int64_t per_step = (int64_t)c->micro_batch_size * dp, gbs = c->global_batch_size;
    if (v[0] < 1 || v[1] < 1 || v[2] < 1 || v[2] > CO_MAX_ITERS) {
        co_problem(P, "--rampup-batch-size %lld %lld %lld: START and INCREMENT must be positive and SAMPLES in 1..%lld",
                   (long long)v[0], (long long)v[1], (long long)v[2], (long long)CO_MAX_ITERS);
        return;
    }
    if (!batch_ok) return;
    bool ok = true;
    if (v[0] >= gbs || (gbs - v[0]) % v[1]) {
        co_problem(P, "--rampup-batch-size START %lld must be below --global-batch-size %d and the difference a "
                      "multiple of INCREMENT %lld", (long long)v[0], c->global_batch_size, (long long)v[1]);
        ok = false;
    }
    if (v[0] % per_step || v[1] % per_step) {
        co_problem(P, "--rampup-batch-size START %lld and INCREMENT %lld must be multiples of --micro-batch-size %d x "
                      "data-parallel size %d", (long long)v[0], (long long)v[1], c->micro_batch_size, dp);
        ok = false;
    }
    if (c->train_samples <= 0) {
        co_problem(P, "--rampup-batch-size needs --train-samples: Megatron expects no batch-size ramp-up for "
                      "iteration-based training (--train-iters)");
        ok = false;
    }
    if (GIVEN("lr-decay-iters") || GIVEN("lr-warmup-iters") || GIVEN("lr-wsd-decay-iters"))
        co_problem(P, "--rampup-batch-size counts the learning rate's schedule in samples: give --lr-decay-samples "
                      "and --lr-warmup-samples (or --lr-warmup-fraction), not --lr-decay-iters/--lr-warmup-iters");
    if (!strcmp(c->lr_decay_style, "WSD"))
        co_problem(P, "--lr-decay-style WSD with --rampup-batch-size is not supported yet");
    if (!ok) return;
    c->rampup_start = v[0];
    c->rampup_increment = v[1];
    c->rampup_samples = v[2];
}

void co_config_check_run(co_config *c, int dp, co_problems *P) {
    bool batch_ok = check_batch(c, dp, P);
    check_rampup(c, dp, batch_ok, P);
    batch_ok = check_length(c, batch_ok, P);
    check_timeline(c, batch_ok, P);
    check_lr(c, batch_ok, P);
    check_optimizer(c, P);
    check_logging(c, P);
    check_data(c, P);
    check_launch(c, P);
}
#undef GIVEN

static void default_text(const co_config *c, const flag *f, char *buf, size_t n) {
    (void)c;
    if (f->kind == F_BOOL) snprintf(buf, n, "off");
    else if (f->kind == F_NOBOOL) snprintf(buf, n, "on; --no-%s turns it off", f->name);
    else if (f->def) snprintf(buf, n, "%s", f->def);
    else buf[0] = '\0';
}

void co_config_help(FILE *out) {
    const char *group = "";
    for (size_t i = 0; i < NFLAGS; i++) {
        const flag *f = &flags[i];
        if (strcmp(group, f->group)) {
            group = f->group;
            fprintf(out, "\n%s:\n", group);
        }
        char name[80], def[128];
        const char *meta = f->kind == F_BOOL || f->kind == F_NOBOOL ? ""
                           : f->kind == F_STR && f->choices     ? " {...}"
                           : f->kind == F_LIST && is_data_path_flag(f) ? " PREFIX"
                           : f->kind == F_LIST                  ? " VALUE..."
                           : f->kind == F_DBL                   ? " X"
                           : f->kind == F_STR                   ? " TEXT"
                                                                : " N";
        snprintf(name, sizeof name, "--%s%s", f->name, meta);
        default_text(NULL, f, def, sizeof def);
        fprintf(out, "  %-44s %s", name, f->help);
        if (f->choices) fprintf(out, " {%s}", f->choices);
        if (def[0]) fprintf(out, " (default: %s)", def);
        fputc('\n', out);
    }
}

void co_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

void co_config_write_json(const co_config *c, FILE *out) {
    fputc('{', out);
    for (size_t i = 0; i < NFLAGS; i++) {
        const flag *f = &flags[i];
        const char *base = (const char *)c + f->off;
        if (i) fputc(',', out);
        co_json_str(out, f->name);
        fputc(':', out);
        switch (f->kind) {
        case F_INT:
            if (is_moe_freq(f) && c->moe_layer_list[0]) {
                char text[4 * CO_MAX_LAYERS + 4];
                moe_list_text(c, text, sizeof text);
                co_json_str(out, text);
                break;
            }
            fprintf(out, "%d", *(const int *)base);
            break;
        case F_I64: fprintf(out, "%lld", (long long)*(const int64_t *)base); break;
        case F_DBL: fprintf(out, "%.17g", *(const double *)base); break;
        case F_STR: co_json_str(out, base); break;
        case F_BOOL:
        case F_NOBOOL: fputs(*(const bool *)base ? "true" : "false", out); break;
        case F_LIST: {
            char *const *list = (char *const *)(const void *)base;
            int count = *(const int *)(const void *)((const char *)c + f->off2);
            fputc('[', out);
            for (int k = 0; k < count; k++) {
                if (k) fputc(',', out);
                co_json_str(out, list[k]);
            }
            fputc(']', out);
            break;
        }
        }
    }
    fputc('}', out);
}

/* ---- reading the JSON back ------------------------------------------------------------ */

/* Flag f's value in c as text: "on"/"off" for a switch, a list's words between spaces. */
static void value_text(const co_config *c, const flag *f, char *buf, size_t n) {
    const char *base = (const char *)c + f->off;
    switch (f->kind) {
    case F_INT:
        if (is_moe_freq(f) && c->moe_layer_list[0]) moe_list_text(c, buf, n);
        else snprintf(buf, n, "%d", *(const int *)base);
        break;
    case F_I64: snprintf(buf, n, "%lld", (long long)*(const int64_t *)base); break;
    case F_DBL: snprintf(buf, n, "%g", *(const double *)base); break;
    case F_STR: snprintf(buf, n, "%s", base); break;
    case F_BOOL:
    case F_NOBOOL: snprintf(buf, n, "%s", *(const bool *)base ? "on" : "off"); break;
    case F_LIST: {
        char *const *list = (char *const *)(const void *)base;
        int count = *(const int *)(const void *)((const char *)c + f->off2);
        size_t len = 0;
        buf[0] = '\0';
        for (int k = 0; k < count && len + 1 < n; k++) {
            int w = snprintf(buf + len, n - len, "%s%s", k ? " " : "", list[k]);
            if (w > 0) len += (size_t)w < n - len ? (size_t)w : n - len - 1;
        }
        break;
    }
    }
}

/* A list flag from a JSON array of strings: 1 when it changed, 0 when v is not such an array
 * or holds the same words, CO_ENOMEM. */
static int read_list(co_config *c, const flag *f, const json_t *v) {
    char **list = (char **)(void *)((char *)c + f->off);
    int *count = (int *)(void *)((char *)c + f->off2);
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n > CO_MAX_DATA_PATHS) return 0;
    bool same = (int)n == *count;
    for (size_t k = 0; k < n; k++) {
        const json_t *w = json_array_get(v, k);
        if (!json_is_string(w)) return 0;
        if (same && strcmp(list[k], json_string_value(w))) same = false;
    }
    if (same) return 0;
    char *words[CO_MAX_DATA_PATHS];
    for (size_t k = 0; k < n; k++)
        if (!(words[k] = strdup(json_string_value(json_array_get(v, k))))) {
            while (k--) free(words[k]);
            return co_err_set(CO_ENOMEM, "--%s: out of memory", f->name);
        }
    for (int k = 0; k < *count; k++) free(list[k]);
    memcpy(list, words, n * sizeof *words);
    *count = (int)n;
    return 1;
}

/* Flag f from JSON value v when v is of f's kind: 1 when the value changed, 0 when it did
 * not (same value, or v of another kind), CO_ENOMEM. */
static int read_value(co_config *c, const flag *f, const json_t *v) {
    char *base = (char *)c + f->off;
    switch (f->kind) {
    case F_INT: {
        json_int_t x = json_integer_value(v);
        if (is_moe_freq(f) && json_is_string(v)) { /* the list form (a checkpoint's flags) */
            char list[sizeof c->moe_layer_list], *spaced = strdup(json_string_value(v));
            if (!spaced) return CO_ENOMEM;
            size_t k = 0; /* (the text as written, "[1, 0]": Megatron's form has no spaces) */
            for (const char *q = spaced; *q; q++)
                if (*q != ' ') spaced[k++] = *q;
            spaced[k] = '\0';
            int rc = co_moe_layer_list(spaced, list, sizeof list);
            free(spaced);
            if (rc || (*(int *)base == 0 && !strcmp(list, c->moe_layer_list))) return 0;
            strcpy(c->moe_layer_list, list);
            *(int *)base = 0;
            return 1;
        }
        if (is_moe_freq(f) && json_is_integer(v) && c->moe_layer_list[0] && x >= INT_MIN && x <= INT_MAX) {
            c->moe_layer_list[0] = '\0'; /* (the integer form replaces the list) */
            *(int *)base = (int)x;
            return 1;
        }
        if (!json_is_integer(v) || x < INT_MIN || x > INT_MAX || *(int *)base == (int)x) return 0;
        *(int *)base = (int)x;
        return 1;
    }
    case F_I64:
        if (!json_is_integer(v) || *(int64_t *)base == (int64_t)json_integer_value(v)) return 0;
        *(int64_t *)base = (int64_t)json_integer_value(v);
        return 1;
    case F_DBL:
        if (!json_is_number(v) || *(double *)base == json_number_value(v)) return 0;
        *(double *)base = json_number_value(v);
        return 1;
    case F_STR:
        if (!json_is_string(v) || strlen(json_string_value(v)) >= f->size || !strcmp(base, json_string_value(v)))
            return 0;
        strcpy(base, json_string_value(v));
        return 1;
    case F_BOOL:
    case F_NOBOOL:
        if (!json_is_boolean(v) || *(bool *)base == json_is_true(v)) return 0;
        *(bool *)base = json_is_true(v);
        return 1;
    case F_LIST: return read_list(c, f, v);
    }
    return 0;
}

/* Reads flag f from obj; tells `changed`. 0 or CO_ENOMEM. */
static int read_flag(co_config *c, const flag *f, const json_t *obj, co_config_changed_fn changed, void *ctx) {
    const json_t *v = json_object_get(obj, f->name);
    int rc = v ? read_value(c, f, v) : 0;
    if (rc <= 0) return rc;
    if (changed) {
        char text[1024];
        value_text(c, f, text, sizeof text);
        changed(ctx, f->name, text);
    }
    return 0;
}

int co_config_read_json(co_config *c, const json_t *obj, const char *const *only, co_config_changed_fn changed,
                        void *ctx) {
    if (!json_is_object(obj)) return 0;
    if (!only) {
        for (size_t i = 0; i < NFLAGS; i++) {
            int rc = read_flag(c, &flags[i], obj, changed, ctx);
            if (rc) return rc;
        }
        return 0;
    }
    for (const char *const *name = only; *name; name++) {
        bool negated;
        const flag *f = find_flag(*name, strlen(*name), &negated);
        if (!f || negated) return co_err_set(CO_EINVAL, "co_config_read_json: no flag --%s", *name);
        int rc = read_flag(c, f, obj, changed, ctx);
        if (rc) return rc;
    }
    return 0;
}
