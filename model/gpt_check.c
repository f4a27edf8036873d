/* gpt_check.c - the model's checks of the configuration (see gpt_check.h). */
#include "model/gpt_check.h"

#include "common/error.h"
#include "model/gpt.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* One broken tensor-parallel rule: added to P, or without P the CO_EINVAL returned. */
static int tp_rule(co_problems *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int tp_rule(co_problems *P, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!P) return co_err_set(CO_EINVAL, "%s", msg);
    co_problem(P, "%s", msg);
    return 0;
}

int gpt_tp_rules(const gpt_config *c, int max_T, co_problems *P) {
    int tp = c->tp > 1 ? c->tp : 1, rc = 0;
    if (tp == 1) return 0;
    if (c->heads % tp &&
        (rc = tp_rule(P, "--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d", c->heads, tp)))
        return rc;
    if (c->kv_groups % tp && tp % c->kv_groups &&
        (rc = tp_rule(P, "--num-query-groups %d and --tensor-model-parallel-size %d: one must divide the other",
                      c->kv_groups, tp)))
        return rc;
    if (c->ffn_hidden % tp &&
        (rc = tp_rule(P, "--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d", c->ffn_hidden,
                      tp)))
        return rc;
    if (c->padded_vocab % tp &&
        (rc = tp_rule(P, "the padded vocabulary (%d) is not divisible by --tensor-model-parallel-size %d",
                      c->padded_vocab, tp)))
        return rc;
    if (c->sequence_parallel && max_T > 0 && max_T % tp &&
        (rc = tp_rule(P, "--sequence-parallel: --seq-length %d is not divisible by --tensor-model-parallel-size %d",
                      max_T, tp)))
        return rc;
    return 0;
}

/* MoE under tensor parallelism (Megatron's layouts: --expert-tensor-parallel-size 1, the
 * experts whole on every tensor rank over its sequence shard; or the tensor size, Megatron's
 * default when the flag is not given, each expert split over the tensor group; docs/moe.md). */
static void check_moe_tp(const co_config *c, co_problems *P) {
    int tp = c->tensor_model_parallel_size;
    int etp = c->expert_tensor_parallel_size ? c->expert_tensor_parallel_size : tp;
    int fm = c->moe_ffn_hidden_size > 0 ? c->moe_ffn_hidden_size : c->ffn_hidden_size;
    if (!c->sequence_parallel)
        co_problem(P, "--num-experts with --tensor-model-parallel-size %d needs --sequence-parallel (Megatron: "
                      "\"During training, performance may degrade if MoE and tensor parallelism are enabled "
                      "without also enabling sequence parallelism.\")", tp);
    if (etp == tp && fm > 0 && fm % etp)
        co_problem(P, "--num-experts with --expert-tensor-parallel-size %d: the experts' hidden size %d is not "
                      "divisible by it (each expert's fc1 rows and fc2 columns split over the tensor group)", etp, fm);
    /* (an expert capacity counts each tensor rank's sequence-parallel tokens, as Megatron's
     * apply_router_token_dropping over the rank's routing map: it drops other tokens than one
     * rank would, docs/moe.md) */
}

/* The router's flags: score function, bias, balancing, dispatcher, groups, coefficients. */
static void check_moe_router(const co_config *c, co_problems *P) {
    int E = c->num_experts;
    if (c->moe_router_enable_expert_bias && strcmp(c->moe_router_score_function, "sigmoid"))
        co_problem(P, "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (as Megatron)");
    if (!(c->moe_router_bias_update_rate >= 0))
        co_problem(P, "--moe-router-bias-update-rate %g must not be negative", c->moe_router_bias_update_rate);
    if (c->moe_router_pre_softmax && strcmp(c->moe_router_score_function, "softmax"))
        co_problem(P, "--moe-router-pre-softmax needs --moe-router-score-function softmax");
    if (!strcmp(c->moe_router_dtype, "fp64"))
        co_problem(P, "--moe-router-dtype fp64 is not supported yet (the router runs in fp32, also under --bf16)");
    if (!strcmp(c->moe_router_load_balancing_type, "sinkhorn")) {
        /* Megatron's assertion; the rest Megatron's sinkhorn routing would ignore */
        if (c->moe_aux_loss_coeff > 0)
            co_problem(P, "Sinkhorn routing does not support aux loss: --moe-router-load-balancing-type sinkhorn "
                          "needs --moe-aux-loss-coeff 0 (it is %g)", c->moe_aux_loss_coeff);
        if (c->moe_router_pre_softmax || c->moe_router_num_groups > 0 || c->moe_router_topk_scaling_factor > 0 ||
            c->moe_router_enable_expert_bias)
            co_problem(P, "--moe-router-load-balancing-type sinkhorn does not use --moe-router-pre-softmax, "
                          "--moe-router-num-groups, --moe-router-topk-scaling-factor or "
                          "--moe-router-enable-expert-bias (its routing has its own activation): drop them");
    }
    if (!strcmp(c->moe_token_dispatcher_type, "flex"))
        co_problem(P, "--moe-token-dispatcher-type flex (DeepEP) is not supported (allgather or alltoall)");
    if (c->moe_router_num_groups < 0 || c->moe_router_group_topk < 0 ||
        (c->moe_router_num_groups > 0 && (E % c->moe_router_num_groups || c->moe_router_group_topk < 1 ||
                                          c->moe_router_group_topk > c->moe_router_num_groups)) ||
        (c->moe_router_num_groups == 0 && c->moe_router_group_topk > 0))
        co_problem(P, "--moe-router-num-groups %d must divide --num-experts %d and --moe-router-group-topk %d be "
                      "between 1 and it", c->moe_router_num_groups, E, c->moe_router_group_topk);
    if (c->moe_aux_loss_coeff < 0 || c->moe_z_loss_coeff < 0 || c->moe_router_topk_scaling_factor < 0)
        co_problem(P, "the MoE loss coefficients and --moe-router-topk-scaling-factor must not be negative");
    if (c->moe_pad_expert_input_to_capacity && !(c->moe_expert_capacity_factor > 0))
        co_problem(P, "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
    if (!(c->moe_router_collapse_share > 0 && c->moe_router_collapse_share <= 1) || c->moe_router_collapse_iters < 0)
        co_problem(P, "--moe-router-collapse-share must be in (0, 1] and --moe-router-collapse-iters >= 0");
}

void gpt_check_moe(const co_config *c, bool sizes_ok, co_problems *P) {
    if (c->num_experts < 0) co_problem(P, "--num-experts %d is negative", c->num_experts);
    if (c->num_experts <= 0) return;
    int E = c->num_experts;
    bool standin = c->standin_model_parallel;
    if (c->moe_router_topk < 1 || c->moe_router_topk > E)
        co_problem(P, "--moe-router-topk %d must be between 1 and --num-experts %d", c->moe_router_topk, E);
    size_t nl = strlen(c->moe_layer_list);
    if (!nl && c->moe_layer_freq < 1)
        co_problem(P, "--moe-layer-freq %d must be a positive integer", c->moe_layer_freq);
    if (nl && (int)nl != c->num_layers) /* (Megatron's assertion in its layer specs) */
        co_problem(P, "--moe-layer-freq: Invalid length of moe_layer_pattern: %zu, expected %d (--num-layers), current "
                      "moe layer pattern: %s", nl, c->num_layers, c->moe_layer_list);
    if (c->moe_ffn_hidden_size < 0 || c->moe_shared_expert_intermediate_size < 0)
        co_problem(P, "--moe-ffn-hidden-size and --moe-shared-expert-intermediate-size must not be negative");
    if (!c->disable_bias_linear)
        co_problem(P, "--num-experts: the experts have no biases; add --disable-bias-linear (as Megatron's grouped "
                      "experts)");
    if (sizes_ok && c->tensor_model_parallel_size > 1 && !standin) check_moe_tp(c, P);
    /* (under context parallelism each rank routes its tokens, the aux counts summed over the
     * context group (Megatron's tp_cp group); a capacity counts the rank's tokens, as tp's;
     * with packed sequences (THD) the split's padding rows route to no expert and count in no
     * statistic: moe_set_padding; docs/moe.md "Context parallelism") */
    check_moe_router(c, P);
}

void gpt_check_mtp(const co_config *c, bool sizes_ok, co_problems *P) {
    bool real_pp = sizes_ok && c->pipeline_model_parallel_size > 1 && !c->standin_model_parallel;
    if (c->mtp_num_layers < 0 || c->mtp_num_layers > 8)
        co_problem(P, "--mtp-num-layers %d is out of range (0 to 8)", c->mtp_num_layers);
    if (c->mtp_num_layers <= 0) return;
    if (real_pp && strcmp(c->position_embedding_type, "rope"))
        co_problem(P, "--mtp-num-layers with --pipeline-model-parallel-size %d needs --position-embedding-type rope "
                      "(the MTP stage holds a copy of the word embedding, the position table stays on the first "
                      "stage; Megatron does not support MTP with learned absolute positions)",
                   c->pipeline_model_parallel_size);
    if (c->reset_attention_mask)
        co_problem(P, "--mtp-num-layers with --reset-attention-mask is not supported yet (as Megatron's MTP: causal "
                      "masks only)");
    if (!(c->mtp_loss_scaling_factor >= 0))
        co_problem(P, "--mtp-loss-scaling-factor %g must not be negative", c->mtp_loss_scaling_factor);
}

/* A size the model divides by: given (-1 is "not given" unless the flag was) and in range. */
static void required(const co_config *c, co_problems *P, const char *name, int v, int64_t hi) {
    if (v == -1 && !co_config_was_set(c, name)) co_problem(P, "--%s must be given and positive", name);
    else co_problem_range(P, name, v, 1, hi);
}

void gpt_check_required(const co_config *c, co_problems *P) {
    required(c, P, "num-layers", c->num_layers, CO_MAX_LAYERS);
    required(c, P, "hidden-size", c->hidden_size, CO_MAX_HIDDEN);
    required(c, P, "num-attention-heads", c->num_attention_heads, CO_MAX_HIDDEN);
    required(c, P, "seq-length", c->seq_length, CO_MAX_SEQ_LENGTH);
}

/* Heads, query groups, kv channels, ffn size, rope and positions, norm epsilon; derives the
 * values not given (Megatron's defaults). */
static void check_attention_mlp(co_config *c, co_problems *P) {
    if (c->hidden_size % c->num_attention_heads)
        co_problem(P, "--hidden-size %d is not divisible by --num-attention-heads %d", c->hidden_size,
                   c->num_attention_heads);
    if (co_config_was_set(c, "kv-channels")) co_problem_range(P, "kv-channels", c->kv_channels, 1, CO_MAX_KV_CHANNELS);
    if (c->kv_channels < 1) c->kv_channels = c->hidden_size / c->num_attention_heads;
    if (!c->group_query_attention) c->num_query_groups = c->num_attention_heads;
    if (c->num_query_groups < 1 || c->num_query_groups > c->num_attention_heads)
        co_problem(P, "--num-query-groups %d is out of range (1 to --num-attention-heads %d)", c->num_query_groups,
                   c->num_attention_heads);
    else if (c->num_attention_heads % c->num_query_groups)
        co_problem(P, "--num-attention-heads %d is not divisible by --num-query-groups %d", c->num_attention_heads,
                   c->num_query_groups);
    if (co_config_was_set(c, "ffn-hidden-size"))
        co_problem_range(P, "ffn-hidden-size", c->ffn_hidden_size, 1, CO_MAX_FFN_HIDDEN);
    if (c->ffn_hidden_size < 1)
        c->ffn_hidden_size = c->swiglu ? (int)((4 * (int64_t)c->hidden_size * 2 / 3) / 64 * 64) : 4 * c->hidden_size;
    if (c->ffn_hidden_size < 1) co_problem(P, "--ffn-hidden-size must be positive");
    bool rope = strcmp(c->position_embedding_type, "rope") == 0;
    if (rope && c->kv_channels % 2) co_problem(P, "rope needs an even head dimension, got %d", c->kv_channels);
    if (rope) co_problem_dbl_range(P, "rotary-base", c->rotary_base, 0, 1e12, true);
    if (co_config_was_set(c, "max-position-embeddings"))
        co_problem_range(P, "max-position-embeddings", c->max_position_embeddings, 1, CO_MAX_SEQ_LENGTH);
    if (c->max_position_embeddings < 1) c->max_position_embeddings = c->seq_length;
    if (!rope && c->seq_length > c->max_position_embeddings)
        co_problem(P, "--seq-length %d is longer than --max-position-embeddings %d", c->seq_length,
                   c->max_position_embeddings);
    co_problem_dbl_range(P, "norm-epsilon", c->norm_epsilon, 0, 1, true);
}

/* The vocabulary (the tokenizer's size before padding; GPT-2's 50257 unless NullTokenizer):
 * the padded size, or 0 when the flags are invalid. */
static int64_t check_vocab(const co_config *c, co_problems *P) {
    bool null_tok = strcmp(c->tokenizer_type, "NullTokenizer") == 0;
    if (null_tok && c->vocab_size == -1 && !co_config_was_set(c, "vocab-size"))
        co_problem(P, "--tokenizer-type NullTokenizer needs --vocab-size");
    else if (co_config_was_set(c, "vocab-size"))
        co_problem_range(P, "vocab-size", c->vocab_size, 1, CO_MAX_VOCAB);
    bool bad = co_problem_range(P, "make-vocab-size-divisible-by", c->make_vocab_size_divisible_by, 1,
                                CO_MAX_VOCAB_DIVISOR);
    int64_t vocab = null_tok ? (int64_t)c->vocab_size + 1
                    : strcmp(c->tokenizer_type, "ByteLevelTokenizer") == 0 ? 257 : 50257;
    int64_t div = c->make_vocab_size_divisible_by;
    return bad || vocab < 1 ? 0 : (vocab + div - 1) / div * div;
}

/* Products: the kernels' int dimensions, and memory that no machine has. padded: the
 * padded vocabulary. */
static void check_products(const co_config *c, int64_t padded, co_problems *P) {
    int64_t C = c->hidden_size, F = c->ffn_hidden_size, KV = c->kv_channels, L = c->num_layers;
    int64_t Q = ((int64_t)c->num_attention_heads + 2 * (int64_t)c->num_query_groups) * KV;
    int64_t AH = (int64_t)c->num_attention_heads * KV, F1 = c->swiglu ? 2 * F : F;
    int64_t N = (int64_t)c->micro_batch_size * c->seq_length;
    int n0 = P->n;
    if (Q > CO_MAX_LAYER_WIDTH || F1 > CO_MAX_LAYER_WIDTH)
        co_problem(P, "layer widths (qkv %lld, MLP %lld) above %d: --num-attention-heads x --kv-channels or "
                      "--ffn-hidden-size is absurd", (long long)Q, (long long)F1, CO_MAX_LAYER_WIDTH);
    if (N > CO_MAX_MICRO_BATCH_TOKENS)
        co_problem(P, "--micro-batch-size %d x --seq-length %d = %lld tokens per micro batch: more than %d",
                   c->micro_batch_size, c->seq_length, (long long)N, CO_MAX_MICRO_BATCH_TOKENS);
    if (P->n != n0) return;
    int64_t W = C;
    if (Q > W) W = Q;
    if (F1 > W) W = F1;
    if (padded > W) W = padded;
    if (N * W > CO_MAX_ACTIVATION)
        co_problem(P, "--micro-batch-size x --seq-length (%lld tokens) x the widest layer (%lld) = %lld "
                      "activations: more than %lld",
                   (long long)N, (long long)W, (long long)(N * W), (long long)CO_MAX_ACTIVATION);
    /* parameters (x4: weights, gradients, Adam's two moments) and one micro batch's
     * activations, in bytes */
    bool rope = strcmp(c->position_embedding_type, "rope") == 0;
    double params = (double)padded * C * (c->untie_embeddings_and_output_weights ? 2 : 1) +
                    (rope ? 0 : (double)c->max_position_embeddings * C) +
                    (double)L * ((double)Q * C + (double)AH * C + (double)F1 * C + (double)F * C + 8.0 * C);
    double acts = (double)L * N * (5.0 * C + 2.0 * Q + 2.0 * AH + 2.0 * F1 + 2.0 * F) + (double)N * padded;
    double bytes = 16.0 * params + 4.0 * acts;
    if (bytes > CO_MAX_MODEL_BYTES)
        co_problem(P, "the model needs about %.0f GiB (%.3g parameters): more than %.0f GiB, refused as absurd",
                   bytes / (1 << 30), params, CO_MAX_MODEL_BYTES / (1 << 30));
}

/* The selective modules named by --recompute-modules (words, or comma-separated), as
 * GPT_RC_* bits; a name outside Megatron's list, or one cohort does not build, is a problem. */
static unsigned recompute_modules(const co_config *c, co_problems *P) {
    static const struct {
        const char *name;
        unsigned bit;
        const char *refused; /* why cohort refuses it, or NULL */
    } mods[] = {
        {"core_attn", GPT_RC_CORE_ATTN, NULL},
        {"layernorm", GPT_RC_LAYERNORM, NULL},
        {"mlp", GPT_RC_MLP, NULL},
        {"moe", GPT_RC_MOE, NULL},
        {"moe_act", 0, "recomputing only the experts' activation function is not supported yet (use moe: the "
                       "whole MoE layer)"},
        {"shared_experts", 0, "recomputing only the shared expert is not supported yet (use moe: the whole MoE "
                              "layer)"},
        {"mla_up_proj", 0, "it is for multi-latent attention, which cohort's model does not have (Megatron: "
                           "\"mla_up_proj in recompute_modules is only supported with MLA\")"},
    };
    if (c->n_recompute_modules == 0) return GPT_RC_CORE_ATTN; /* Megatron's default */
    unsigned bits = 0;
    for (int i = 0; i < c->n_recompute_modules; i++) {
        char word[128];
        snprintf(word, sizeof word, "%s", c->recompute_modules[i]);
        char *save = NULL;
        for (char *w = strtok_r(word, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
            size_t k = 0, n = sizeof mods / sizeof mods[0];
            while (k < n && strcmp(mods[k].name, w)) k++;
            if (k == n)
                co_problem(P, "--recompute-modules: '%s' is not a module (Megatron's are core_attn, moe_act, "
                              "layernorm, mla_up_proj, mlp, moe, shared_experts)", w);
            else if (mods[k].refused)
                co_problem(P, "--recompute-modules %s: %s", w, mods[k].refused);
            else if (mods[k].bit == GPT_RC_MOE && c->num_experts <= 0)
                co_problem(P, "--recompute-modules moe: the model has no MoE layer (--num-experts is 0)");
            else
                bits |= mods[k].bit;
        }
    }
    return bits;
}

/* Megatron's checks of the recomputation flags (arguments.py, transformer_config.py). */
static void check_recompute(const co_config *c, co_problems *P) {
    const char *g = c->recompute_granularity;
    bool full = !strcmp(g, "full"), sel = !strcmp(g, "selective");
    if (c->recompute_activations && full)
        co_problem(P, "--recompute-activations is --recompute-granularity selective; it contradicts "
                      "--recompute-granularity full: give one of them");
    if (c->recompute_activations) sel = true;
    int L = c->num_layers, pp = c->pipeline_model_parallel_size > 1 ? c->pipeline_model_parallel_size : 1;
    int per_rank = L / pp > 0 ? L / pp : 1;
    if (full) {
        if (!c->recompute_method[0])
            co_problem(P, "--recompute-granularity full needs --recompute-method uniform or block (Megatron: "
                          "\"requires recompute method to be specified\")");
        if (c->recompute_num_layers < 1 || c->recompute_num_layers > per_rank)
            co_problem(P, "--recompute-granularity full needs --recompute-num-layers between 1 and the layers per "
                          "pipeline rank (%d), got %d", per_rank, c->recompute_num_layers);
    } else if (sel) {
        if (c->recompute_method[0])
            co_problem(P, "--recompute-method %s: a recompute method is not supported for selective "
                          "recomputation (as Megatron); drop it or use --recompute-granularity full", c->recompute_method);
        if (c->recompute_num_layers >= 0)
            co_problem(P, "--recompute-num-layers %d: selective recomputation takes no layer count (as Megatron)",
                       c->recompute_num_layers);
    } else {
        if (c->recompute_method[0] || c->recompute_num_layers >= 0)
            co_problem(P, "--recompute-method and --recompute-num-layers need --recompute-granularity full");
    }
    if (!sel && c->n_recompute_modules > 0)
        co_problem(P, "--recompute-modules applies to selective recomputation: add --recompute-granularity "
                      "selective");
    if (sel) (void)recompute_modules(c, P);
    if (c->distribute_saved_activations) {
        int tp = c->tensor_model_parallel_size;
        if (tp <= 1)
            co_problem(P, "--distribute-saved-activations needs --tensor-model-parallel-size > 1 (the saved "
                          "inputs are split over the tensor group)");
        else if (c->sequence_parallel)
            co_problem(P, "--distribute-saved-activations with --sequence-parallel: the saved inputs already are "
                          "token shards (Megatron refuses the two together)");
        else if ((int64_t)c->micro_batch_size * c->seq_length % tp)
            co_problem(P, "--distribute-saved-activations: --micro-batch-size x --seq-length (%lld) is not "
                          "divisible by --tensor-model-parallel-size %d",
                       (long long)c->micro_batch_size * c->seq_length, tp);
        if (!full)
            co_problem(P, "--distribute-saved-activations applies to --recompute-granularity full only (as "
                          "Megatron)");
    }
}

int gpt_recompute_of(const co_config *c, gpt_recompute *r) {
    memset(r, 0, sizeof *r);
    co_problems P;
    co_problems_init(&P);
    check_recompute(c, &P);
    if (P.n) return co_err_set(CO_EINVAL, "%s", P.text);
    if (!strcmp(c->recompute_granularity, "full")) {
        r->full = !strcmp(c->recompute_method, "block") ? GPT_RC_BLOCK : GPT_RC_UNIFORM;
        r->num_layers = c->recompute_num_layers;
        r->distribute = c->distribute_saved_activations;
    } else if (!strcmp(c->recompute_granularity, "selective") || c->recompute_activations) {
        r->modules = recompute_modules(c, &P);
    }
    return 0;
}

void gpt_check_shapes(co_config *c, co_problems *P) {
    check_recompute(c, P);
    int n0 = P->n;
    check_attention_mlp(c, P);
    int tp = c->tensor_model_parallel_size;
    if (tp > 1 && tp <= CO_MAX_TP_GROUP && !c->standin_model_parallel && P->n == n0) {
        /* the layouts the tensor-parallel layers split (the padded vocabulary is padded to
         * a multiple of tp by the trainer) */
        gpt_config g = {.tp = tp, .heads = c->num_attention_heads, .kv_groups = c->num_query_groups,
                        .ffn_hidden = c->ffn_hidden_size, .sequence_parallel = c->sequence_parallel};
        gpt_tp_rules(&g, c->seq_length, P);
    }
    int64_t padded = check_vocab(c, P);
    if (P->n == n0) check_products(c, padded, P);
}

void gpt_moe_layers_of(const co_config *c, gpt_config *m) {
    m->moe_layer_freq = c->moe_layer_freq;
    m->moe_listed = c->moe_layer_list[0] != '\0';
    memset(m->moe_list, 0, sizeof m->moe_list);
    for (int l = 0; m->moe_listed && l < GPT_MOE_LIST_MAX && c->moe_layer_list[l]; l++)
        if (c->moe_layer_list[l] == '1') m->moe_list[l / 64] |= (uint64_t)1 << (l % 64);
}

void gpt_moe_of(const co_config *c, int dense_ffn, moe_config *mc) {
    memset(mc, 0, sizeof *mc);
    if (c->num_experts <= 0) return;
    const char *lb = c->moe_router_load_balancing_type;
    mc->num_experts = c->num_experts;
    mc->ffn_hidden = c->moe_ffn_hidden_size > 0 ? c->moe_ffn_hidden_size : dense_ffn;
    mc->topk = c->moe_router_topk;
    mc->score = strcmp(c->moe_router_score_function, "sigmoid") ? MOE_SCORE_SOFTMAX : MOE_SCORE_SIGMOID;
    mc->pre_softmax = c->moe_router_pre_softmax;
    mc->num_groups = c->moe_router_num_groups;
    mc->group_topk = c->moe_router_group_topk;
    mc->scaling_factor = (float)c->moe_router_topk_scaling_factor;
    mc->expert_bias = c->moe_router_enable_expert_bias;
    mc->lb = !strcmp(lb, "none")              ? MOE_LB_NONE
             : !strcmp(lb, "seq_aux_loss")    ? MOE_LB_SEQ_AUX
             : !strcmp(lb, "global_aux_loss") ? MOE_LB_GLOBAL_AUX
             : !strcmp(lb, "sinkhorn")        ? MOE_LB_SINKHORN
                                              : MOE_LB_AUX;
    mc->aux_coeff = (float)c->moe_aux_loss_coeff;
    mc->z_coeff = (float)c->moe_z_loss_coeff;
    mc->capacity_factor = c->moe_expert_capacity_factor;
    mc->drop = strcmp(c->moe_token_drop_policy, "position") ? MOE_DROP_PROBS : MOE_DROP_POSITION;
    mc->pad_to_capacity = c->moe_pad_expert_input_to_capacity;
    mc->grouped_gemm = c->moe_grouped_gemm;
    mc->shared_ffn = c->moe_shared_expert_intermediate_size;
    mc->ep_size = c->expert_model_parallel_size;
    mc->etp_size = c->expert_tensor_parallel_size > 0 ? c->expert_tensor_parallel_size : 0;
}
