/* placement.h - which decoder layers each pipeline stage builds: Megatron's layer placement
 * as data. Pure logic (no I/O, no model).
 *
 * A stage is (pipeline rank r, model chunk c); with v chunks per rank the p·v stages run in
 * the order (c = 0: ranks 0..p-1), (c = 1: ranks 0..p-1), ...: stage i is chunk i / p of
 * rank i % p. As Megatron:
 *  - even split (get_num_layers_to_build, get_transformer_layer_offset in
 *    megatron/core/transformer/transformer_block.py and transformer_layer.py): L' = L (+1
 *    with --account-for-embedding-in-pipeline-split, +1 with
 *    --account-for-loss-in-pipeline-split) layers, L'/(p·v) per stage, first layer
 *    c·(L'/v) + r·(L'/(p·v)); the embedding (the loss) counts as the first (last) layer of
 *    the first (last) stage, which builds one decoder layer fewer.
 *  - --decoder-first-pipeline-num-layers F / --decoder-last-pipeline-num-layers T: rank 0
 *    (rank p-1) holds F (T) layers, the ranks between share the rest evenly; with v chunks
 *    every rank's count is divided by v.
 *  - --pipeline-model-parallel-layout: stages listed in stage order, '|' between them; E
 *    embedding, t decoder layer, m multi-token prediction layer, L loss; "X*N" and "(...)*N"
 *    repeat; commas are ignored (PipelineParallelLayerLayout,
 *    megatron/core/transformer/pipeline_parallel_layer_layout.py). The number of stages
 *    over p gives v.
 * Whatever the split, the embedding is built on chunk 0 of rank 0 and the final norm,
 * output layer and loss on chunk v-1 of rank p-1 (Megatron's pre_process/post_process). */
#ifndef COHORT_SCHEDULER_PLACEMENT_H
#define COHORT_SCHEDULER_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>

#define PP_MAX_LAYERS 1048576     /* --num-layers, and the layers of an expanded layout */
#define PP_MAX_LAYOUT (1 << 22)   /* characters of a layout once its repetitions are expanded */

/* The flags that place layers, with Megatron's names. */
typedef struct pp_place_cfg {
    int p;                   /* --pipeline-model-parallel-size */
    int num_layers;          /* --num-layers (decoder layers) */
    int v;                   /* --num-virtual-stages-per-pipeline-rank (cohort also takes
                              * --virtual-pipeline-model-parallel-size): 0 = not given */
    int layers_per_vstage;   /* --num-layers-per-virtual-pipeline-stage: 0 = not given */
    bool has_first, has_last;
    int first, last;         /* --decoder-first/last-pipeline-num-layers (when has_*) */
    bool account_embedding;  /* --account-for-embedding-in-pipeline-split */
    bool account_loss;       /* --account-for-loss-in-pipeline-split */
    const char *layout;      /* --pipeline-model-parallel-layout, NULL = not given */
    int mtp_num_layers;      /* --mtp-num-layers: 0 = none */
} pp_place_cfg;

struct co_config;
/* The placement flags of a checked configuration (cohort train's; NULL layout when empty). */
void pp_place_from_config(const struct co_config *c, pp_place_cfg *out);

/* What one stage (rank, chunk) holds. */
typedef struct pp_stage {
    int first_layer; /* global index (0-based) of its first decoder layer (Megatron's offset) */
    int num_layers;  /* decoder layers it builds: first_layer .. first_layer + num_layers - 1 */
    int mtp_layers;  /* multi-token prediction layers it builds */
    bool embedding;  /* the word and position embeddings: chunk 0 of rank 0 */
    bool loss;       /* the final norm, output layer and loss: chunk v-1 of rank p-1 */
} pp_stage;

/* The model chunks per rank the flags give (v; 1 = no interleaving), after checking every
 * rule Megatron applies to them (megatron/training/arguments.py, TransformerConfig,
 * get_num_layers_to_build, PipelineParallelLayerLayout); >= 1, or CO_EINVAL with
 * co_err_detail() a sentence naming the flags and values (CO_ENOMEM). */
int pp_place_chunks(const pp_place_cfg *c);

/* Fills st[r * v + c] for every rank r and chunk c (v = pp_place_chunks; cap >= p·v) and
 * sets *v. 0, or CO_EINVAL (co_err_detail() says why), CO_ERANGE (cap too small) or
 * CO_ENOMEM. */
int pp_placement(const pp_place_cfg *c, pp_stage *st, int cap, int *v);

/* The pipeline rank whose chunks hold the MTP layers of a placement (p ranks, v chunks
 * each), or -1 without them (Megatron's get_mtp_ranks). */
int pp_mtp_rank(const pp_stage *st, int p, int v);
/* The pipeline stages of each pipeline's embedding group as groups.h's topo_layout.emb_stages
 * (bit s for stage s): with MTP layers on a rank before the last, that rank, the first, and
 * the last when the embedding is tied (Megatron's get_embedding_ranks); 0 otherwise (the
 * first and the last) or when p > 64. */
unsigned long long pp_embedding_stages(const pp_stage *st, int p, int v, bool tied);
/* The same from a checked configuration's flags (0 when its placement is invalid). */
unsigned long long pp_embedding_stages_of_config(const struct co_config *c);

/* Expands a layout string as Megatron's parse_str_to_list does (commas dropped, then every
 * "(...)*N", then every "X*N", each pass once from left to right) into *out, a new string
 * of E, t, m, L and '|' (the caller frees it); *nstages = the '|' count + 1. 0, or
 * CO_EINVAL (an unknown character, a repetition too large; co_err_detail() says which) or
 * CO_ENOMEM, *out NULL. */
int pp_layout_expand(const char *layout, char **out, int *nstages);

#endif
