/* parallel_check.c - the parallel layout's checks of the configuration (see parallel_check.h). */
#include "scheduler/parallel_check.h"

#include "common/error.h"
#include "scheduler/placement.h"
#include "scheduler/schedule.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

bool topo_check_sizes(const co_config *c, co_problems *P) {
    bool bad = co_problem_range(P, "tensor-model-parallel-size", c->tensor_model_parallel_size, 1, CO_MAX_TP_GROUP);
    bad |= co_problem_range(P, "pipeline-model-parallel-size", c->pipeline_model_parallel_size, 1, CO_MAX_PP_STAGES);
    bad |= co_problem_range(P, "context-parallel-size", c->context_parallel_size, 1, CO_MAX_CP_GROUP);
    bad |= co_problem_range(P, "expert-model-parallel-size", c->expert_model_parallel_size, 1, CO_MAX_EP_GROUP);
    /* 0: as the tensor size */
    bad |= co_problem_range(P, "expert-tensor-parallel-size", c->expert_tensor_parallel_size, 0, CO_MAX_TP_GROUP);
    /* 0: no virtual pipeline (one chunk per rank) */
    bad |= co_problem_range(P, "virtual-pipeline-model-parallel-size", c->virtual_pipeline_model_parallel_size, 0,
                            CO_MAX_VP_CHUNKS);
    bad |= co_problem_range(P, "num-virtual-stages-per-pipeline-rank", c->num_virtual_stages_per_pipeline_rank, 0,
                            CO_MAX_VP_CHUNKS);
    bad |= co_problem_range(P, "num-layers-per-virtual-pipeline-stage", c->num_layers_per_virtual_pipeline_stage, 0,
                            CO_MAX_LAYERS);
    bad |= co_problem_range(P, "microbatch-group-size-per-virtual-pipeline-stage",
                            c->microbatch_group_size_per_vp_stage, 0, CO_MAX_GLOBAL_BATCH);
    bad |= co_problem_range(P, "nproc-per-node", c->nproc_per_node, 1, CO_MAX_PROCS);
    bad |= co_problem_range(P, "nnodes", c->nnodes, 1, CO_MAX_PROCS);
    return !bad;
}

/* The gradient and parameter overlaps and the distributed optimizer's
 * combinations (it shards over the gradient group of every tensor x pipeline shard: data
 * parallel, or data x context). */
static void check_dist_opt(const co_config *c, co_problems *P) {
    /* the overlaps' threads use the gradient group's (and with expert parallelism the
     * expert-data-parallel group's) own transports: any layout. Megatron's two requirements
     * (arguments.py): */
    if (c->overlap_param_gather && !c->use_distributed_optimizer)
        co_problem(P, "--overlap-param-gather only supported with distributed optimizer: add "
                      "--use-distributed-optimizer");
    if (c->overlap_param_gather && !c->overlap_grad_reduce)
        co_problem(P, "Must use --overlap-param-gather with --overlap-grad-reduce: add --overlap-grad-reduce");
    if (c->ddp_bucket_size < 0) co_problem(P, "--ddp-bucket-size must not be negative");
}

/* Context parallelism: the ring's split of the sequence, what it does not combine with, and
 * the packed (THD) split's flags. real_cp: a size above 1 that is computed split (not the
 * stand-in). With pipeline parallelism each pipeline carries its context rank's tokens
 * (train/pipeline.c), as Megatron's. */
static void check_context(const co_config *c, bool real_cp, co_problems *P) {
    int cp = c->context_parallel_size;
    if (real_cp && c->seq_length > 0 && c->seq_length % (2 * cp))
        co_problem(P, "--seq-length %d is not divisible by 2 * --context-parallel-size = %d (each rank keeps two of "
                      "2 * cp chunks of every sequence)", c->seq_length, 2 * cp);
    if (real_cp && c->attention_dropout > 0)
        co_problem(P, "--attention-dropout %g with --context-parallel-size %d is not supported yet (the ring attention "
                      "has no dropout): pass --attention-dropout 0", c->attention_dropout, cp);
    if (real_cp && c->mtp_num_layers > 0 && (c->sft || c->cp_packed_sequences))
        co_problem(P, "multi-token prediction with context parallelism and packed sequences (THD) is not supported yet");
    if (c->cp_packed_capacity < 1.0 || c->cp_packed_capacity > 64.0)
        co_problem(P, "--cp-packed-capacity %g must be in [1, 64]", c->cp_packed_capacity);
    else if (real_cp && c->cp_packed_capacity > cp)
        co_problem(P, "--cp-packed-capacity %g is more than --context-parallel-size %d (a rank would hold more than a "
                      "whole sequence)", c->cp_packed_capacity, cp);
    if (real_cp && c->timeline_dir[0])
        co_problem(P, "--timeline-dir with --context-parallel-size %d is not supported yet (the timeline's header has "
                      "no context-parallel coordinate)", cp);
    if (strcmp(c->cp_comm_type, "p2p"))
        co_problem(P, "--cp-comm-type %s is not supported yet (only p2p: the ring)", c->cp_comm_type);
    if (c->cp_packed_sequences && cp > 1 && !c->reset_attention_mask && !c->sft)
        co_problem(P, "--cp-packed-sequences splits documents: it needs --reset-attention-mask (or --sft)");
}

/* Expert parallelism (sizes in range, not the stand-in): the experts it splits, and the
 * expert groups' alignment with the tensor and context groups. */
static void check_expert_groups(const co_config *c, co_problems *P) {
    int ep = c->expert_model_parallel_size;
    if (c->num_experts <= 0)
        co_problem(P, "--expert-model-parallel-size %d needs --num-experts (the expert group splits a MoE layer's "
                      "experts)", ep);
    else if (c->num_experts % ep)
        co_problem(P, "--num-experts %d is not divisible by --expert-model-parallel-size %d (each expert rank holds "
                      "num-experts / ep experts)", c->num_experts, ep);
    int tp = c->tensor_model_parallel_size, cp = c->context_parallel_size;
    /* (at expert tensor size 1 the expert group holds whole tensor groups; at expert tensor
     * size = tp it is tp x ep ranks, ep whole data-parallel replicas; with context
     * parallelism Megatron's expert layout folds the context ranks into the expert groups,
     * which then hold whole tensor x context groups) */
    int etp = c->expert_tensor_parallel_size > 0 ? c->expert_tensor_parallel_size : tp;
    if (cp > 1 && (ep * etp) % (tp * cp))
        co_problem(P, "--expert-model-parallel-size %d x expert tensor size %d is not a multiple of tensor %d x "
                      "context %d parallel sizes (an expert group must hold whole tensor x context groups, so that "
                      "the ranks with the same experts hold the same slices of the other tensors)", ep, etp, tp, cp);
    else if (tp > 1 && c->expert_tensor_parallel_size == 1 && ep % tp)
        co_problem(P, "--expert-model-parallel-size %d is not a multiple of --tensor-model-parallel-size %d (an "
                      "expert group must hold whole tensor groups, so that the ranks with the same experts hold the "
                      "same tensor slices)", ep, tp);
}

/* The virtual pipeline's two names and the first and last stages' layer counts. (The
 * placement and schedule themselves: pp_check_config.) */
static void check_virtual_pipeline(const co_config *c, bool sizes_ok, co_problems *P) {
    if (sizes_ok && c->virtual_pipeline_model_parallel_size && c->num_virtual_stages_per_pipeline_rank &&
        c->virtual_pipeline_model_parallel_size != c->num_virtual_stages_per_pipeline_rank)
        co_problem(P, "--virtual-pipeline-model-parallel-size %d and --num-virtual-stages-per-pipeline-rank %d differ",
                   c->virtual_pipeline_model_parallel_size, c->num_virtual_stages_per_pipeline_rank);
    if (co_config_was_set(c, "decoder-first-pipeline-num-layers") && c->decoder_first_pipeline_num_layers < 0)
        co_problem(P, "--decoder-first-pipeline-num-layers must not be negative");
    if (co_config_was_set(c, "decoder-last-pipeline-num-layers") && c->decoder_last_pipeline_num_layers < 0)
        co_problem(P, "--decoder-last-pipeline-num-layers must not be negative");
}

void topo_check_parallel(co_config *c, bool sizes_ok, co_problems *P) {
    bool standin = c->standin_model_parallel;
    check_dist_opt(c, P);
    if (c->sequence_parallel && c->tensor_model_parallel_size == 1)
        c->sequence_parallel = false; /* as Megatron: sequence parallelism needs a tensor group */
    if (c->sequence_parallel && standin) co_problem(P, "--sequence-parallel is not part of the model-parallel stand-in");
    bool real_cp = sizes_ok && c->context_parallel_size > 1 && !standin;
    check_context(c, real_cp, P);
    if (sizes_ok && c->expert_model_parallel_size > 1 && !standin) check_expert_groups(c, P);
    if (sizes_ok && c->expert_tensor_parallel_size != 0 &&
        c->expert_tensor_parallel_size != c->tensor_model_parallel_size &&
        !(c->expert_tensor_parallel_size == 1 && c->num_experts > 0))
        co_problem(P, "--expert-tensor-parallel-size %d is not supported yet (only 1 with --num-experts, or the "
                      "tensor-parallel size %d)", c->expert_tensor_parallel_size, c->tensor_model_parallel_size);
    check_virtual_pipeline(c, sizes_ok, P);
}

void topo_check_world(const co_config *c, int dp, co_problems *P) {
    int64_t world = (int64_t)c->nproc_per_node * c->nnodes;
    if (world > CO_MAX_PROCS)
        co_problem(P, "--nproc-per-node %d x --nnodes %d = %lld worker processes: more than %d", c->nproc_per_node,
                   c->nnodes, (long long)world, CO_MAX_PROCS);
    else if (c->node_rank < 0 || c->node_rank >= c->nnodes)
        co_problem(P, "--node-rank %d is out of range (0 to --nnodes - 1 = %d)", c->node_rank, c->nnodes - 1);
    else if (dp < 1 || dp > CO_MAX_PROCS)
        co_problem(P, "data-parallel size %d (the world over tensor x context x pipeline) is out of range (1 to %d)",
                   dp, CO_MAX_PROCS);
}

/* MTP layers on a stage before the loss's run there and send their hidden states on with
 * the main ones (docs/mtp.md); as Megatron, not on the first pipeline rank, and with rope
 * off the first stage (the position table stays there). v: chunks per rank. */
static int check_mtp_placement(const co_config *c, const pp_place_cfg *pc, int v) {
    int p = c->pipeline_model_parallel_size;
    pp_stage *st = calloc((size_t)p * (size_t)v, sizeof *st);
    int vv = 0;
    if (!st) return co_err_set(CO_ENOMEM, "the pipeline's placement: out of memory");
    int rc = pp_placement(pc, st, p * v, &vv) ? CO_EINVAL : 0;
    int r = rc ? -1 : pp_mtp_rank(st, p, vv);
    bool loss_too = r >= 0 && st[r * vv + vv - 1].loss;
    if (r == 0 && p > 1)
        rc = co_err_set(CO_EINVAL, "--pipeline-model-parallel-layout '%s' places the MTP layers m on pipeline rank 0: "
                                   "they must be on a later rank (as Megatron)", c->pipeline_model_parallel_layout);
    else if (r > 0 && strcmp(c->position_embedding_type, "rope"))
        rc = co_err_set(CO_EINVAL, "--mtp-num-layers on a pipeline rank without the embedding needs "
                                   "--position-embedding-type rope (the position table stays on the first stage; "
                                   "Megatron does not support MTP with learned absolute positions)");
    else if (r > 0 && !loss_too && p > 64)
        rc = co_err_set(CO_EINVAL, "MTP layers before the loss's stage with more than 64 pipeline ranks are not "
                                   "supported");
    free(st);
    return rc;
}

int pp_check_config(const co_config *c, int dp) {
    int p = c->pipeline_model_parallel_size;
    bool placed = c->virtual_pipeline_model_parallel_size || c->num_virtual_stages_per_pipeline_rank ||
                  c->num_layers_per_virtual_pipeline_stage || co_config_was_set(c, "decoder-first-pipeline-num-layers") ||
                  co_config_was_set(c, "decoder-last-pipeline-num-layers") || c->account_for_embedding_in_pipeline_split ||
                  c->account_for_loss_in_pipeline_split || c->pipeline_model_parallel_layout[0];
    if ((p < 2 && !placed) || c->standin_model_parallel) return 0;
    pp_place_cfg pc;
    pp_place_from_config(c, &pc);
    int v = pp_place_chunks(&pc);
    if (v < 1) return CO_EINVAL;
    if (c->mtp_num_layers > 0) {
        int rc = check_mtp_placement(c, &pc, v);
        if (rc) return rc;
    }
    pp_sched_cfg sc = {.p = p, .rank = 0, .m = c->global_batch_size / (c->micro_batch_size * dp), .v = v,
                       .group = c->microbatch_group_size_per_vp_stage};
    if (pp_sched_check(&sc)) return CO_EINVAL;
    /* --elastic: every share a data-parallel size from --elastic-min-replicas to dp deals a
     * rank (the batch's micro batches dealt round the ranks, counts differing by one) */
    int total = c->global_batch_size / c->micro_batch_size;
    for (int d = c->elastic && c->elastic_min_replicas >= 1 ? c->elastic_min_replicas : dp + 1; d <= dp; d++)
        for (int k = 0; k < 2; k++) {
            sc.m = total / d + k * (total % d != 0);
            if (sc.m >= 1 && pp_sched_check(&sc)) {
                char why[300];
                snprintf(why, sizeof why, "%s", co_err_detail());
                return co_err_set(CO_EINVAL, "--elastic: at a data-parallel size of %d a rank takes %d micro "
                                             "batches: %s", d, sc.m, why);
            }
        }
    /* a batch ramp-up's smaller batches each run the schedule over their micro batches */
    for (int64_t b = c->rampup_start; c->rampup_start > 0 && b < c->global_batch_size; b += c->rampup_increment) {
        sc.m = (int)(b / (c->micro_batch_size * dp));
        if (pp_sched_check(&sc)) {
            char why[300];
            snprintf(why, sizeof why, "%s", co_err_detail());
            return co_err_set(CO_EINVAL, "--rampup-batch-size: the ramp's global batch %lld: %s", (long long)b, why);
        }
    }
    return 0;
}
