/* groups.h - Megatron's parallel groups: which ranks share a tensor, context, data,
 * pipeline, model-parallel, embedding or expert group, for a world of
 * tp x cp x dp x pp ranks (and the expert layout etp x ep x edp x pp over the same ranks).
 *
 * As Megatron's RankGenerator (parallelism-facts.md section 1): ranks map to coordinates
 * along an order string whose first dimension varies fastest, "tp-cp-ep-dp-pp" by default
 * ("tp-cp-ep-pp-dp" with --use-tp-pp-dp-mapping); the group of a set of dimensions holds
 * the ranks that differ only along them, groups numbered by the other dimensions, members
 * by the group's own (generate_masked_orthogonal_rank_groups). The dense layout has ep = 1;
 * the expert layout replaces tp by the expert tensor size, has cp = 1 and its own data
 * size. Pure arithmetic: the communicators built over these groups live in comm/. */
#ifndef COHORT_SCHEDULER_GROUPS_H
#define COHORT_SCHEDULER_GROUPS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    TOPO_G_TP,            /* tensor model parallel ("tp") */
    TOPO_G_CP,            /* context parallel ("cp") */
    TOPO_G_DP,            /* data parallel ("dp") */
    TOPO_G_DP_CP,         /* data parallel with context parallel ("dp-cp": the gradient reduction) */
    TOPO_G_PP,            /* pipeline ("pp") */
    TOPO_G_MP,            /* model parallel ("tp-pp") */
    TOPO_G_TP_CP,         /* tensor and context ("tp-cp") */
    TOPO_G_TP_DP_CP,      /* tensor, data and context ("tp-dp-cp") */
    TOPO_G_TP_DP,         /* tensor and data ("tp-dp") */
    TOPO_G_EMBEDDING,     /* first and last pipeline stage of each pipeline (the tied embedding;
                           * the MTP stage too: topo_layout.emb_stages) */
    TOPO_G_POS_EMBEDDING, /* first pipeline stage of each pipeline */
    TOPO_G_EP,            /* expert model parallel (expert layout "ep") */
    TOPO_G_ETP,           /* expert tensor parallel (expert layout "tp") */
    TOPO_G_ETP_EP,        /* expert tensor and model parallel ("tp-ep") */
    TOPO_G_ETP_EP_PP,     /* expert tensor, model and pipeline ("tp-ep-pp") */
    TOPO_G_EDP,           /* expert data parallel (expert layout "dp") */
    TOPO_NGROUP_KINDS
} topo_group_kind;

typedef struct topo_layout {
    int world, tp, cp, dp, pp;  /* dense: world = tp * cp * dp * pp */
    int ep, etp, edp;           /* expert: world = etp * ep * edp * pp */
    bool tp_pp_dp;              /* --use-tp-pp-dp-mapping: order tp-cp-ep-pp-dp */
    /* the pipeline stages in each pipeline's embedding group, bit s for stage s; 0: the
     * first and the last (the tied embedding). With MTP depths on a stage before the last,
     * Megatron's get_embedding_ranks: the first, the MTP stage, and the last when tied. Set
     * after topo_layout_init. */
    unsigned long long emb_stages;
} topo_layout;

/* Validates and fills l: world must be a multiple of tp*cp*pp and of etp*ep*pp, and under
 * tp_pp_dp with pp > 1 tp*cp = etp*ep (else the two layouts' pipeline groups differ, which Megatron
 * asserts against). etp < 1 means "as tp" (Megatron's default). CO_EINVAL with err naming the sizes otherwise. */
int topo_layout_init(topo_layout *l, int world, int tp, int pp, int cp, int ep, int etp, bool tp_pp_dp, char *err,
                     size_t n);

/* Every group of a kind: *ngroups groups of *size ranks each, ranks[g * size + i] the i-th
 * member of group g (ranks holds at least world ints; the embedding groups may be smaller
 * than the world in total). */
void topo_groups(const topo_layout *l, topo_group_kind k, int *ranks, int *ngroups, int *size);
/* The group of a kind that rank belongs to: its index, its members (at least world ints)
 * and *size; -1 when rank is in none (an embedding group holds only some ranks). */
int topo_group_of(const topo_layout *l, topo_group_kind k, int rank, int *members, int *size);

/* A rank's coordinates: its place along tp, cp, dp and pp, and in its expert group (ep; 0
 * without expert parallelism). The ranks that differ only in dp hold the same shard of the
 * model, the same (tp, cp, pp), unless the layout has expert parallelism: then only those of
 * one expert-data-parallel group, the same (tp, cp, pp, ep), hold the same experts. */
typedef struct topo_coord {
    int tp, cp, dp, pp;
    int ep;
} topo_coord;

/* Fills c for rank (0 <= rank < world); -1 on a bad rank or no memory. */
int topo_coords(const topo_layout *l, int rank, topo_coord *c);
/* Do a and b hold the same model shard (tp, cp, pp and expert rank)? */
bool topo_same_shard(const topo_coord *a, const topo_coord *b);

/* Megatron's name of a group kind ("tp", "dp-cp", "embedding", "ep", ...). */
const char *topo_group_name(topo_group_kind k);

/* The groups of the masked dimensions over a grid of sizes[0..ndim) (sizes[0] fastest,
 * ndim <= 8):
 * generate_masked_orthogonal_rank_groups. out holds prod(sizes) ints. */
void topo_masked_groups(const int *sizes, const bool *mask, int ndim, int *out, int *ngroups, int *size);

#endif
