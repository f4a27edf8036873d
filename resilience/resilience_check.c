/* resilience_check.c - resilience's checks of the configuration (see resilience_check.h). */
#include "resilience/resilience_check.h"

#include "common/error.h"
#include "resilience/fault_injector.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void rr_check_spares(const co_config *c, co_problems *P) {
    bool spares = co_config_was_set(c, "inprocess-active-world-size");
    if (spares && c->inprocess_active_world_size == 1 && c->nproc_per_node * c->nnodes > 1)
        co_problem(P, "--inprocess-active-world-size 1 is not supported yet (a single training rank runs without the "
                      "supervisor, so without spares)");
    int procs = c->nproc_per_node * c->nnodes;
    if (!strcmp(c->inprocess_granularity, "node") && spares && c->inprocess_active_world_size > 0 &&
        c->inprocess_active_world_size < procs && c->inprocess_active_world_size % c->nproc_per_node)
        co_problem(P, "--inprocess-granularity node: --inprocess-active-world-size %d is not a multiple of "
                      "--nproc-per-node %d (the warm spares are whole nodes): give a multiple such as %d",
                   c->inprocess_active_world_size, c->nproc_per_node,
                   (c->inprocess_active_world_size / c->nproc_per_node + 1) * c->nproc_per_node);
    if (c->run_report[0] && c->nproc_per_node == 1 && c->nnodes == 1)
        co_problem(P, "--run-report is not supported yet in a single-process job (the supervisor writes it: "
                      "--nproc-per-node 2 or more)");
}

/* Whether s is an iteration number (1, 2, ...). */
static bool is_iteration(const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    return !errno && end != s && !*end && v >= 1;
}

/* In-process restart's timeouts, heartbeats, spares and restart budget. */
static void check_restart_limits(const co_config *c, co_problems *P) {
    if (!(c->inprocess_soft_timeout > 0 && c->inprocess_soft_timeout < c->inprocess_hard_timeout &&
          c->inprocess_hard_timeout < c->inprocess_barrier_timeout && c->inprocess_barrier_timeout <= 1e6))
        co_problem(P, "in-process restart timeouts must satisfy 0 < soft < hard < barrier <= 1e6 seconds");
    if (!(c->inprocess_heartbeat_interval > 0 && c->inprocess_heartbeat_interval < c->inprocess_heartbeat_timeout &&
          c->inprocess_heartbeat_timeout <= 1e6))
        co_problem(P, "--inprocess-heartbeat-interval must be positive and below --inprocess-heartbeat-timeout "
                      "(at most 1e6 seconds)");
    if (c->inprocess_active_world_size != -1 &&
        (c->inprocess_active_world_size < 1 || c->inprocess_active_world_size > c->nproc_per_node * c->nnodes))
        co_problem(P, "--inprocess-active-world-size must be between 1 and the number of worker processes");
    if (!(c->node_replacement_timeout >= 0 && c->node_replacement_timeout <= 1e6))
        co_problem(P, "--node-replacement-timeout must be between 0 and 1e6 seconds");
    if (c->inprocess_restart_limit < 0 || !(c->inprocess_restart_window > 0 && c->inprocess_restart_window <= 1e6))
        co_problem(P, "--inprocess-restart-limit must be >= 0 and --inprocess-restart-window positive (at most 1e6 s)");
}

/* --elastic: what the shrink and the grow are built for; the rest is refused by name. */
static void check_elastic(const co_config *c, co_problems *P) {
    int procs = c->nproc_per_node * c->nnodes;
    int per = c->tensor_model_parallel_size * c->pipeline_model_parallel_size *
              (c->context_parallel_size > 1 ? c->context_parallel_size : 1);
    int dp = per > 0 ? procs / per : 0;
    if (co_config_was_set(c, "elastic-min-replicas") && !c->elastic)
        co_problem(P, "--elastic-min-replicas %d needs --elastic", c->elastic_min_replicas);
    if (!c->elastic) return;
    if (procs < 2 || !c->inprocess_restart)
        co_problem(P, "--elastic needs a supervised job with in-process restart (--nproc-per-node 2 or more, "
                      "without --no-inprocess-restart)");
    /* (pipeline and context parallelism are built: a replica's tp x cp x pp ranks leave and
     * join whole; the interleaved schedule's shares are checked by pp_check_config) */
    if (c->num_experts > 0 && c->expert_model_parallel_size > 1)
        co_problem(P, "--elastic with --expert-model-parallel-size %d is not supported yet (an expert group spans "
                      "replicas, so one leaving takes part of the others' experts, and its ranks must run the same "
                      "micro batches, which uneven shares break): give 1", c->expert_model_parallel_size);
    if (c->use_distributed_optimizer && c->context_parallel_size > 1)
        co_problem(P, "--elastic with --use-distributed-optimizer and --context-parallel-size %d is not supported yet "
                      "(the optimizer's shards are over the data x context ranks, a shard's copy on the next context "
                      "rank: a replica that leaves takes a shard with its copy)", c->context_parallel_size);
    if (c->num_experts > 0 && !strcmp(c->moe_router_load_balancing_type, "global_aux_loss"))
        co_problem(P, "--elastic with --moe-router-load-balancing-type global_aux_loss is not supported yet (its "
                      "token counts are summed over the data-parallel ranks in every micro batch, which uneven "
                      "shares cannot pair up): use aux_loss or seq_aux_loss");
    if (co_config_was_set(c, "rampup-batch-size"))
        co_problem(P, "--elastic with --rampup-batch-size is not supported yet");
    if (c->inprocess_active_world_size > 0 && c->inprocess_active_world_size < procs)
        co_problem(P, "--elastic with warm spares (--inprocess-active-world-size) is not supported yet");
    if (!strcmp(c->inprocess_rank_assignment, "shift-ranks"))
        co_problem(P, "--elastic renumbers the ranks itself: leave --inprocess-rank-assignment at fill-gaps");
    if (c->elastic_min_replicas < 1 || (dp > 0 && c->elastic_min_replicas > dp))
        co_problem(P, "--elastic-min-replicas %d is out of range: give 1 to the data-parallel size %d",
                   c->elastic_min_replicas, dp);
}

/* Megatron's random fault injector: its flags, in a supervised job only. */
static void check_fault_injector(const co_config *c, co_problems *P) {
    co_problem_range(P, "fault-injector-seed", c->fault_injector_seed, 0, INT64_MAX);
    co_problem_range(P, "fault-injector-num-ranks", c->fault_injector_num_ranks, 0, INT_MAX);
    if (!fi_rand_wanted(c->fault_injector_ranks, c->fault_injector_num_ranks)) return;
    int world = c->nproc_per_node * c->nnodes;
    if (world < 2) {
        co_problem(P, "--fault-injector-ranks/--fault-injector-num-ranks need a supervised job that survives the "
                      "faults: --nproc-per-node 2 or more");
        return;
    }
    fi_rand r;
    if (fi_rand_init(&r, c->fault_injector_ranks, c->fault_injector_num_ranks, c->fault_injector_fault_types,
                     c->fault_injector_fault_probabilities, c->fault_injector_fault_delay,
                     c->fault_injector_mtti_seconds, c->fault_injector_offset_seconds,
                     (uint64_t)c->fault_injector_seed, world))
        co_problem(P, "%s", co_err_detail());
}

void rr_check_limits(const co_config *c, co_problems *P) {
    check_fault_injector(c, P);
    co_problem_range(P, "error-injection-rate", c->error_injection_rate, 0, INT_MAX);
    co_problem_range(P, "inject-seed", c->inject_seed, 0, INT64_MAX);
    check_restart_limits(c, P);
    check_elastic(c, P);
    co_problem_range(P, "quarantine-after", c->quarantine_after, 0, INT_MAX);
    co_problem_range(P, "straggler-evict-after", c->straggler_evict_after, 0, INT_MAX);
    co_problem_range(P, "quarantine-window", c->quarantine_window, 1, CO_MAX_ITERS);
    if (c->check_replicas_interval < 0) co_problem(P, "--check-replicas-interval must be >= 0");
    if (c->check_weight_hash_interval < 0)
        co_problem(P, "--check-weight-hash-across-dp-replicas-interval must be >= 0");
    if (!(c->straggler_threshold > 0 && c->straggler_threshold <= 1))
        co_problem(P, "--straggler-threshold must be in (0, 1]");
    for (int i = 0; i < c->n_iterations_to_skip; i++)
        if (!is_iteration(c->iterations_to_skip[i]))
            co_problem(P, "--iterations-to-skip: '%s' is not an iteration number (1, 2, ...)",
                       c->iterations_to_skip[i]);
}
