/* plan_sim.h - `cohort plan`'s discrete-event simulation of a long run: failures of a
 * cluster of N GPUs over D days, drawn per device and by kind, and what each recovery
 * strategy loses to them (checkpoints, restarts, rework), as pure, seeded arithmetic.
 *
 * Failures: a Poisson process of rate N x rate_per_gpu_h; each one's category drawn from a
 * mix (default: Llama 3's unexpected interruptions), each category a class:
 *   PL_HW   the rank's node is lost (GPU, memory, network, host): it needs another node
 *   PL_SW   the processes fail, the node is fine (software bug, NCCL timeout, dependency)
 *   PL_SDC  silent data corruption, detected by comparing replicas
 * Strategies (what a failure of each class costs; "rollback" loses the work since the last
 * checkpoint, the rest lose the step in progress):
 *   checkpoint-restart  any failure: rollback + restart_s (relaunch, load)
 *   in-process          PL_SW: inproc_s; PL_SDC: inproc_s + sdc_lost_s of work; PL_HW: node_s
 *                       (the survivors wait for a new node and take their state from peers)
 *   spares (k nodes)    as in-process, but PL_HW takes a warm spare node (inproc_s) while one
 *                       is free; the lost node comes back as a spare after repair_h
 *   elastic             as in-process, but PL_HW shrinks the job by a node (inproc_s) and it
 *                       trains at the reduced rate until the node is repaired and rejoins
 *                       (another inproc_s)
 * In the last three, a share of failures (fallback_share: every replica of a shard lost, a
 * failure the automation cannot cure; Llama 3 needed people 3 times in 419) falls back to
 * checkpoint-restart. Every strategy checkpoints every ckpt_interval_s of work, each save
 * blocking for save_s.
 * Failures during a recovery restart it (as in Daly's model). */
#ifndef COHORT_RESILIENCE_PLAN_SIM_H
#define COHORT_RESILIENCE_PLAN_SIM_H

#include <stdint.h>

typedef enum { PL_HW, PL_SW, PL_SDC, PL_NCLASSES } pl_class;
typedef enum { PL_CKPT_RESTART, PL_INPROCESS, PL_SPARES, PL_ELASTIC, PL_NSTRATEGIES } pl_strategy;

typedef struct pl_category {
    const char *name;
    int count;        /* interruptions of this category in the source */
    pl_class cls;
} pl_category;

/* Llama 3's interruptions that needed significant manual intervention (3 of 419) */
#define PL_LLAMA3_MANUAL 3
/* Llama 3's unexpected interruptions (The Llama 3 Herd of Models, table 5): 419 in 54 days
 * on 16,384 H100s, by root-cause category. */
extern const pl_category pl_llama3_mix[];
extern const int pl_llama3_ncategories;
#define PL_LLAMA3_INTERRUPTIONS 419
#define PL_LLAMA3_DAYS 54.0
#define PL_LLAMA3_GPUS 16384
/* 419 / (54 days x 24 h x 16,384 GPUs): failures per GPU-hour */
double pl_llama3_rate(void);
/* The mix's share of each class (shares[PL_NCLASSES], summing to 1). */
void pl_class_shares(const pl_category *mix, int n, double *shares);

typedef struct pl_costs {
    double step_s;       /* one iteration */
    double save_s;       /* a checkpoint save (blocking part) */
    double restart_s;    /* checkpoint-restart: relaunch the job and load the checkpoint */
    double inproc_s;     /* in-process restart: detect, abort, take the state from a peer */
    double node_s;       /* in-process restart waiting for a replacement node */
    double sdc_lost_s;   /* work redone after silent data corruption (checks' interval) */
    double repair_h;     /* a lost node comes back (spares, elastic) */
} pl_costs;

typedef struct pl_params {
    int gpus, gpus_per_node;
    double days;
    double rate_per_gpu_h;
    double shares[PL_NCLASSES];
    pl_costs c;
    pl_strategy strategy;
    int spares;              /* nodes (PL_SPARES) */
    double fallback_share;   /* failures the in-process strategies hand to checkpoint-restart */
    double ckpt_interval_s;  /* work between checkpoints (<= 0: none) */
    int runs;                /* independent runs averaged (>= 1) */
    uint64_t seed;
} pl_params;

typedef struct pl_result {
    double ettr;             /* useful work / wall time, averaged over runs */
    double gpu_ettr;         /* the same per GPU held (spare nodes count) */
    double lost_work_s;      /* work redone, per run */
    double down_s;           /* recovering, per run */
    double save_total_s;     /* saving checkpoints, per run */
    double steps_lost;       /* lost_work_s / step_s */
    double failures;         /* per run */
    double by_class[PL_NCLASSES];
} pl_result;

const char *pl_strategy_name(pl_strategy s);
const char *pl_class_name(pl_class c);

/* Simulates p->runs runs of p->days; CO_EINVAL (detail) on parameters out of range. */
int pl_simulate(const pl_params *p, pl_result *r);

/* The checkpoint interval with the highest ETTR for the strategy, every candidate with the
 * same seed: none, and 21 points from a tenth to ten times Young's interval for the failures
 * that roll back (at least a minute); *tau 0 means none. */
int pl_best_interval(const pl_params *p, double *tau, pl_result *r);

/* Daly's closed form (A higher order estimate of the optimum checkpoint interval, 2006) for
 * checkpoint-restart with exponential failures of mean m: the ETTR of interval tau, save
 * delta, restart r: tau / (m e^{r/m} (e^{(tau+delta)/m} - 1)). */
double pl_daly_ettr(double tau, double delta, double r, double m);
/* Young/Daly's first-order optimum interval sqrt(2 delta m). */
double pl_young_interval(double delta, double m);

#endif
