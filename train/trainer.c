/* trainer.c - one process's training loop (see trainer.h).
 *
 * An iteration: for each of M micro batches, read samples consumed + m*mbs ..., forward,
 * loss = sum(per-token loss * mask), backward with each token weighted
 * mask / (tokens in its micro batch) / M (Megatron's averaging; with --calculate-per-token-loss
 * mask / (the iteration's loss tokens on every rank)); then the global gradient
 * norm, clipping, AdamW at the scheduled rate. Everything is deterministic for a fixed
 * seed and thread count: dropout masks come from (seed, iteration, micro batch). */
#include "train/trainer_internal.h"

#include "common/error.h"
#include "common/log.h"
#include "common/rng.h"
#include "model/gpt_check.h"
#include "scheduler/placement.h"
#include "train/verdict.h"

#include <signal.h>
#include <xxhash.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *const trainer_phase_names[TR_NPHASES] = {"data", "forward", "backward", "allreduce", "optimizer"};

void trainer_set_validator(trainer *t, const trainer_validator *v) {
    t->val = *v;
    t->have_val = v && v->report && v->verdict;
}
void trainer_set_injector(trainer *t, fi_schedule *s, int rank) {
    t->inj = s;
    t->job_rank = rank;
}

/* The rank a fault spec names for the data-parallel rank r's micro batch: with model or
 * context parallelism, the world rank at this rank's tensor, context and pipeline coordinates
 * in replica r (the one whose share a check round recomputes here). */
static int fault_rank(const trainer *t, int r) {
    if (r == t->topo.dp_rank) return t->job_rank;
    if (!t->have_layout || (t->tp_size == 1 && t->pp_size == 1 && t->cpn <= 1)) return r;
    for (int w = 0; w < t->layout.world; w++) {
        topo_coord co;
        if (!topo_coords(&t->layout, w, &co) && co.dp == r && co.tp == t->tp_rank && co.pp == t->pp_rank &&
            co.cp == (t->cpn > 1 ? t->cpr : 0))
            return w;
    }
    return r;
}
void trainer_set_event_sink(trainer *t, trainer_event_fn fn, void *ctx) {
    t->ev_fn = fn;
    t->ev_ctx = ctx;
}
void trainer_set_skips(trainer *t, const int64_t *iters, int n) {
    free(t->skips);
    t->skips = NULL;
    t->nskips = 0;
    if (n <= 0 || !(t->skips = malloc(sizeof *t->skips * (size_t)n))) return;
    memcpy(t->skips, iters, sizeof *t->skips * (size_t)n);
    t->nskips = n;
}
void trainer_phase_ms(const trainer *t, double out[TR_NPHASES]) { memcpy(out, t->phase_ms, sizeof t->phase_ms); }

void trainer_get_progress(const trainer *t, trainer_progress *p) {
    p->iteration = t->iteration;
    for (int s = 0; s < 3; s++) p->consumed[s] = t->consumed[s];
    p->skipped = t->skipped;
    p->nan_iters = t->nan_iters;
    p->loss_sum = t->loss_sum;
    p->tok_sum = t->tok_sum;
    p->iters_since_log = t->iters_since_log;
    p->loss_scale = t->scaler.scale;
    p->growth_tracker = t->scaler.growth_tracker;
    p->hysteresis_tracker = t->scaler.hysteresis_tracker;
}

void trainer_set_progress(trainer *t, const trainer_progress *p) {
    t->iteration = p->iteration;
    for (int s = 0; s < 3; s++) t->consumed[s] = p->consumed[s];
    t->skipped = p->skipped;
    t->nan_iters = p->nan_iters;
    t->loss_sum = p->loss_sum;
    t->tok_sum = p->tok_sum;
    t->iters_since_log = p->iters_since_log;
    t->time_since_log = 0;
    if (p->loss_scale > 0) { /* (0: a checkpoint without the scaler's state keeps the configured one) */
        t->scaler.scale = p->loss_scale;
        t->scaler.growth_tracker = p->growth_tracker;
        t->scaler.hysteresis_tracker = p->hysteresis_tracker;
    }
}

struct opt_adamw *trainer_optimizer(trainer *t) { return &t->opt; }
const co_config *trainer_config(const trainer *t) { return &t->cfg; }

int trainer_params_sync(trainer *t) { return trainer__dopt_sync(t); }

int trainer_set_hook(trainer *t, trainer_hook fn, void *ctx) {
    if (t->nhooks >= TRAINER_MAX_HOOKS)
        return co_err_set(CO_ERANGE, "trainer: no room for another hook (it holds %d)", TRAINER_MAX_HOOKS);
    t->hook[t->nhooks] = fn;
    t->hook_ctx[t->nhooks++] = ctx;
    return 0;
}

int trainer_set_pre_step_hook(trainer *t, trainer_pre_step_hook fn, void *ctx) {
    if (t->npre_step >= TRAINER_MAX_HOOKS)
        return co_err_set(CO_ERANGE, "trainer: no room for another pre-step hook (it holds %d)", TRAINER_MAX_HOOKS);
    t->pre_step[t->npre_step] = fn;
    t->pre_step_ctx[t->npre_step++] = ctx;
    return 0;
}

static int run_hooks(trainer *t, bool final, train_end why) {
    for (int i = 0; i < t->nhooks; i++) {
        int rc = t->hook[i](t, t->hook_ctx[i], final, why);
        if (rc < 0) return rc;
    }
    return 0;
}


static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void timestamp(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
}

static uint64_t mix(uint64_t a, uint64_t b) {
    uint64_t x = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    return co_splitmix64(&x);
}


/* Pipeline rank r's chunk ci of the placement st (p ranks, v chunks each; st[r * v + ci]):
 * its layers, whether it holds the embedding, the loss, the MTP depths (the layout's m), or
 * comes after a stage with the MTP depths (then, in training, it receives their streams). */
gpt_chunk trainer__chunk_of(const pp_stage *st, int p, int v, int r, int ci, int slots) {
    const pp_stage *s = &st[r * v + ci];
    /* the MTP stage's place in the pipeline's order (chunk-major): its rank's last chunk */
    int mr = pp_mtp_rank(st, p, v), mtp_at = mr < 0 ? -1 : (v - 1) * p + mr;
    return (gpt_chunk){.layer0 = s->first_layer, .nlayers = s->num_layers, .embedding = s->embedding,
                       .head = s->loss, .slots = slots, .mtp = s->mtp_layers > 0,
                       .mtp_in = mtp_at >= 0 && ci * p + r > mtp_at};
}

/* Each chunk's activation slots into most[]: the most forwards of a chunk not yet matched by
 * their backward (a chunk takes its micro batches' backwards in the order of their forwards,
 * so slot = mb mod slots), in M_max's schedule, or under --elastic in any schedule of up to
 * M_max micro batches (a shrunk or grown data-parallel size changes a rank's share). */
static int schedule_slots(trainer *t, int v, int *most) {
    pp_sched_cfg sc = {.p = t->pp_size, .rank = t->pp_rank, .m = t->M_max, .v = v,
                       .group = t->cfg.microbatch_group_size_per_vp_stage};
    for (int M = t->cfg.elastic ? 1 : t->M_max; M <= t->M_max; M++) {
        sc.m = M;
        if (t->cfg.elastic && pp_sched_check(&sc)) continue; /* (no share of that many: pp_check_config) */
        int rc = pp_schedule(&sc, t->ops, 2 * t->M_max * v, &t->nops);
        if (rc) return rc;
        int inflight[GPT_MAX_CHUNKS] = {0};
        for (int i = 0; i < t->nops; i++) {
            int ci = t->ops[i].chunk;
            inflight[ci] += t->ops[i].kind == PP_FORWARD ? 1 : -1;
            if (inflight[ci] > most[ci]) most[ci] = inflight[ci];
        }
    }
    return 0;
}

/* A pipeline rank's part: its model chunks (Megatron's layer placement), its schedule
 * (1F1B or interleaved) and each chunk's activation slots (the most micro batches the
 * schedule keeps in it at once), the per micro batch buffers. */
static int pipeline_setup(trainer *t, gpt_config *m) {
    const co_config *c = &t->cfg;
    pp_place_cfg pc;
    pp_place_from_config(c, &pc);
    pc.p = t->pp_size;
    int v = pp_place_chunks(&pc);
    if (v < 1) return v < 0 ? v : CO_EINVAL;
    if (v > GPT_MAX_CHUNKS)
        return co_err_set(CO_EINVAL, "%d model chunks per pipeline rank (at most %d)", v, GPT_MAX_CHUNKS);
    pp_stage *st = calloc((size_t)t->pp_size * (size_t)v, sizeof *st);
    if (!st) return co_err_set(CO_ENOMEM, "pipeline placement: out of memory");
    int rc = pp_placement(&pc, st, t->pp_size * v, &v);
    if (rc) {
        free(st);
        return rc;
    }
    /* the room for the most micro batches a rank may take (M_max: the batch's micro batches
     * over the data-parallel size, or under --elastic the whole batch's) */
    t->vchunks = v;
    t->ops = malloc(sizeof *t->ops * 2 * (size_t)t->M_max * (size_t)v);
    if (!t->ops) rc = co_err_set(CO_ENOMEM, "pipeline schedule: out of memory");
    int most[GPT_MAX_CHUNKS] = {0};
    if (!rc) rc = schedule_slots(t, v, most);
    m->nchunks = v;
    for (int ci = 0; !rc && ci < v; ci++)
        m->chunks[ci] = trainer__chunk_of(st, t->pp_size, v, t->pp_rank, ci, most[ci] > 0 ? most[ci] : 1);
    t->stages = st;
    pp_sched_cfg sc = {.p = t->pp_size, .rank = t->pp_rank, .m = t->M, .v = v,
                       .group = c->microbatch_group_size_per_vp_stage};
    if (!rc) rc = pp_schedule(&sc, t->ops, 2 * t->M_max * v, &t->nops); /* (the schedule this rank runs first) */
    int M = t->M_max;
    size_t N = (size_t)c->micro_batch_size * c->seq_length;
    t->have_batch = calloc((size_t)M, 1);
    t->poison = calloc((size_t)M, sizeof *t->poison);
    t->mb_loss_local = calloc((size_t)M, sizeof *t->mb_loss_local);
    t->mb_tok_local = calloc((size_t)M, sizeof *t->mb_tok_local);
    t->lbuf = calloc(2 * (size_t)M, sizeof *t->lbuf);
    t->meta = calloc(3 * N + 1, sizeof *t->meta);
    if (!rc && (!t->have_batch || !t->poison || !t->mb_loss_local || !t->mb_tok_local || !t->lbuf || !t->meta))
        rc = co_err_set(CO_ENOMEM, "pipeline buffers: out of memory");
    return rc;
}

/* The trainer's groups from the caller's (only those its configuration uses, checked against
 * it), its data-parallel view and the job's layout. */
static int adopt_groups(trainer *t, const tr_groups *g) {
    const co_config *c = &t->cfg;
    cm_comm *dp = g->dp;
    t->g.dp = dp;
    t->g.grad_ovl = c->overlap_grad_reduce ? g->grad_ovl : NULL;
    /* the data-parallel view (micro batches per replica); the tensor group is t->g.tp */
    int rc = topo_init(&t->topo, dp ? dp->size : 1, 1, 1, 1, dp ? dp->rank : 0);
    if (rc) return rc;
    t->job_rank = t->topo.dp_rank; /* (the world rank, once trainer_set_injector says it) */
    t->g.tp = g->tp;
    t->tp_size = t->g.tp ? t->g.tp->size : 1;
    t->tp_rank = t->g.tp ? t->g.tp->rank : 0;
    if (t->g.tp && t->tp_size != c->tensor_model_parallel_size)
        return co_err_set(CO_EINVAL, "a tensor group of %d ranks for --tensor-model-parallel-size %d", t->tp_size,
                          c->tensor_model_parallel_size);
    t->g.pp = g->pp && g->pp->size > 1 ? g->pp : NULL;
    t->pp_size = t->g.pp ? t->g.pp->size : 1;
    t->pp_rank = t->g.pp ? t->g.pp->rank : 0;
    if (t->g.pp) {
        t->g.pp_bwd = g->pp_bwd;
        t->g.pp_dev = g->pp_dev;
        t->g.pp_dev_bwd = g->pp_dev_bwd;
        t->g.emb = g->emb;
        t->g.mp = g->mp;
        if (t->pp_size != c->pipeline_model_parallel_size || !t->g.pp_bwd || !t->g.mp)
            return co_err_set(CO_EINVAL, "a pipeline group of %d ranks (and its channels) for "
                                         "--pipeline-model-parallel-size %d", t->pp_size, c->pipeline_model_parallel_size);
    }
    char lerr[200];
    int cpn = c->context_parallel_size > 1 ? c->context_parallel_size : 1;
    int world = (dp ? dp->size : 1) * t->tp_size * t->pp_size * cpn;
    int epn = c->num_experts > 0 && c->expert_model_parallel_size > 1 ? c->expert_model_parallel_size : 1;
    t->have_layout = topo_layout_init(&t->layout, world, t->tp_size, t->pp_size, cpn, epn,
                                      c->expert_tensor_parallel_size, c->use_tp_pp_dp_mapping, lerr, sizeof lerr) == 0;
    t->M = t->M_max = topo_num_microbatches(&t->topo, c->global_batch_size, c->micro_batch_size);
    t->gbs = c->global_batch_size;
    if (c->elastic) { /* (any data-parallel size: a rank may take up to the whole batch) */
        t->M = trainer__share(t, t->gbs, t->topo.dp_rank);
        t->M_max = c->global_batch_size / c->micro_batch_size;
    }
    return 0;
}

/* The model's configuration from the flags (the MoE and MTP settings too). */
static void model_config(trainer *t, int vocab_size) {
    const co_config *c = &t->cfg;
    gpt_config *m = &t->mcfg;
    m->num_layers = c->num_layers;
    m->hidden = c->hidden_size;
    m->heads = c->num_attention_heads;
    m->kv_groups = c->num_query_groups;
    m->head_dim = c->kv_channels;
    m->ffn_hidden = c->ffn_hidden_size;
    m->vocab = vocab_size;
    m->padded_vocab = gpt_padded_vocab(vocab_size, c->make_vocab_size_divisible_by * t->tp_size);
    m->max_positions = c->max_position_embeddings;
    m->rope = strcmp(c->position_embedding_type, "rope") == 0;
    m->rotary_base = (float)c->rotary_base;
    m->rmsnorm = strcmp(c->normalization, "RMSNorm") == 0;
    m->norm_1p = c->apply_layernorm_1p;
    m->norm_eps = (float)c->norm_epsilon;
    m->swiglu = c->swiglu;
    m->tied = !c->untie_embeddings_and_output_weights;
    m->bias = !c->disable_bias_linear;
    m->init_std = (float)c->init_method_std;
    m->hidden_dropout = (float)c->hidden_dropout;
    m->attention_dropout = (float)c->attention_dropout;
    m->tp = t->tp_size;
    m->tp_rank = t->tp_rank;
    m->sequence_parallel = t->g.tp && c->sequence_parallel;
    (void)gpt_recompute_of(c, &m->recompute); /* (checked with the configuration) */
    trainer__moe_config(t, m);
    trainer__mtp_config(t, m);
}

/* The model (this rank's stage, context share and experts, over its groups), initialised,
 * and its optimizer. */
static int build_model(trainer *t, const trainer_data *data) {
    const co_config *c = &t->cfg;
    gpt_config *m = &t->mcfg;
    model_config(t, data->vocab_size);
    if (c->fp16 && c->loss_scale > 0) opt_grad_scaler_constant(&t->scaler, c->loss_scale);
    else if (c->fp16)
        opt_grad_scaler_dynamic(&t->scaler, c->initial_loss_scale, c->min_loss_scale, c->loss_scale_window,
                                c->hysteresis);
    else opt_grad_scaler_constant(&t->scaler, 1.0);
    int rc;
    if (t->g.pp && (rc = pipeline_setup(t, m))) return rc;
    if ((rc = trainer__cp_setup(t, data, m))) return rc;
    if ((rc = trainer__ep_setup(t, data, m))) return rc;
    if ((rc = gpt_new(&t->model, m, t->be, c->micro_batch_size, t->local_T))) return rc;
    if ((rc = trainer__moe_setup(t))) return rc;
    if (t->g.tp) gpt_set_tensor_group(t->model, t->g.tp, TRAIN_COMM_TIMEOUT_MS);
    if ((rc = trainer__ep_model_ready(t))) return rc;
    /* the distributed optimizer lays the model's buffers out before they are filled */
    if (c->use_distributed_optimizer && (rc = trainer__dopt_setup(t, data->joining))) return rc;
    if (t->g.cp) gpt_set_context_group(t->model, t->g.cp, TRAIN_COMM_TIMEOUT_MS);
    if (t->g.cp && c->num_experts > 0 && t->tp_size > 1)
        gpt_set_moe_token_group(t->model, t->g.tpcp, TRAIN_COMM_TIMEOUT_MS);
    gpt_init(t->model, (uint64_t)c->seed);
    rc = c->use_distributed_optimizer
             ? trainer__dopt_init_shards(t)
             : opt_adamw_init(&t->opt, t->model, (float)c->adam_beta1, (float)c->adam_beta2, (float)c->adam_eps,
                              (float)c->weight_decay, (float)c->clip_grad);
    if (rc) return rc;
    if ((rc = trainer__overlap_setup(t))) return rc;
    if ((rc = trainer__pgather_setup(t))) return rc;
    t->flops_per_sample = gpt_flops_per_sample(m, c->seq_length);
    return 0;
}

/* Megatron's learning-rate schedule from the flags. */
static void lr_setup(trainer *t) {
    const co_config *c = &t->cfg;
    t->lr.max_lr = c->lr;
    t->lr.min_lr = c->min_lr;
    t->lr.init_lr = c->lr_warmup_init;
    t->lr.decay_iters = c->lr_decay_iters;
    t->lr.warmup_iters = c->lr_warmup_fraction >= 0 ? (int64_t)(c->lr_warmup_fraction * (double)c->lr_decay_iters)
                                                    : c->lr_warmup_iters;
    t->lr.wsd_decay_iters = c->lr_wsd_decay_iters;
    t->lr.style = (lr_style)lr_style_parse(c->lr_decay_style);
    t->lr.wsd_style = (lr_wsd_style)lr_wsd_style_parse(c->lr_wsd_decay_style);
    /* Megatron's scheduler counts samples (each step adds the step's batch): with a batch
     * ramp-up the rate follows the samples consumed, decay over --lr-decay-samples (default
     * --train-samples), warm-up over --lr-warmup-samples or the fraction of the decay */
    t->lr_samples = t->lr;
    t->lr_samples.decay_iters = c->lr_decay_samples > 0 ? c->lr_decay_samples : c->train_samples;
    t->lr_samples.warmup_iters = c->lr_warmup_fraction >= 0
                                     ? (int64_t)(c->lr_warmup_fraction * (double)t->lr_samples.decay_iters)
                                     : c->lr_warmup_samples;
    /* --decoupled-lr (Megatron's param groups of the input embedding and the output layer):
     * the same warm-up and decay, from --decoupled-lr to --decoupled-min-lr (or --min-lr) */
    t->decoupled = co_config_was_set(c, "decoupled-lr");
    t->lr_dec = t->lr;
    t->lr_samples_dec = t->lr_samples;
    t->lr_dec.max_lr = t->lr_samples_dec.max_lr = c->decoupled_lr;
    if (co_config_was_set(c, "decoupled-min-lr")) t->lr_dec.min_lr = t->lr_samples_dec.min_lr = c->decoupled_min_lr;
}

/* The learning rate of the next step (the log line's: after the step, the next one's). */
static double next_lr(const trainer *t) {
    return t->cfg.rampup_start > 0 ? lr_at(&t->lr_samples, t->consumed[0]) : lr_at(&t->lr, t->iteration);
}

/* ... the input embedding's and the output layer's under --decoupled-lr; -1 without */
static double next_decoupled_lr(const trainer *t) {
    if (!t->decoupled) return -1;
    return t->cfg.rampup_start > 0 ? lr_at(&t->lr_samples_dec, t->consumed[0]) : lr_at(&t->lr_dec, t->iteration);
}

/* The micro batches data-parallel rank r takes of a global batch of gbs samples: Megatron's
 * sampler deals the batch's micro batches round the dp ranks (micro batch m goes to rank
 * m mod dp), so the counts are equal when dp divides them and differ by one otherwise (an
 * elastic job's shrunk data-parallel size). */
int trainer__share(const trainer *t, int gbs, int r) {
    int total = gbs / t->cfg.micro_batch_size, dp = t->topo.dp;
    return r < total ? (total - r + dp - 1) / dp : 0;
}

/* The weight of a micro batch with ntok loss tokens (all context ranks' together) in the
 * step: 1 / (ntok x M), or under --elastic dp / (ntok x the batch's micro batches), so that
 * the step's gradient, averaged over the dp ranks, is the mean over the batch's micro batches
 * whatever each rank's share (bit for bit the other when dp divides the batch). ntok 0: the
 * auxiliary losses' (MoE, MTP) weight, which has no tokens (1 / M or dp / micro batches). */
double trainer__mb_weight(const trainer *t, double ntok) {
    if (!t->cfg.elastic) return ntok > 0 ? 1.0 / (ntok * t->M) : (double)(1.0f / (float)t->M);
    double total = (double)(t->gbs / t->cfg.micro_batch_size);
    return ntok > 0 ? t->topo.dp / (ntok * total) : t->topo.dp / total;
}

/* The pipeline's operations over M micro batches of this rank (the buffers hold M_max). */
int trainer__use_m(trainer *t, int M) {
    if (M < 1 || M > t->M_max)
        return co_err_set(CO_EINVAL, "%d micro batches for this rank (1..%d)", M, t->M_max);
    if (M == t->M) return 0;
    t->M = M;
    if (t->pp_size <= 1 || !t->ops) return 0; /* (the pipeline's groups may be between generations) */
    pp_sched_cfg sc = {.p = t->pp_size, .rank = t->pp_rank, .m = M, .v = t->vchunks,
                       .group = t->cfg.microbatch_group_size_per_vp_stage};
    return pp_schedule(&sc, t->ops, 2 * t->M_max * t->vchunks, &t->nops);
}

/* The iteration's global batch gbs (a batch ramp-up's, or the full one): its micro batches
 * per rank, the pipeline's schedule over them, the auxiliary losses' weight (one micro
 * batch's, trainer__mb_weight). The buffers are sized for the full batch. */
int trainer__set_batch(trainer *t, int gbs) {
    const co_config *c = &t->cfg;
    int M = c->elastic ? trainer__share(t, gbs, t->topo.dp_rank)
                       : topo_num_microbatches(&t->topo, gbs, c->micro_batch_size);
    if (M < 1 || M > t->M_max) return co_err_set(CO_EINVAL, "global batch %d: %d micro batches per rank (1..%d)", gbs, M, t->M_max);
    t->gbs = gbs;
    int rc = trainer__use_m(t, M);
    /* the auxiliary losses weigh as the main loss, times --fp16's loss scale */
    gpt_set_aux_loss_scale(t->model, trainer__loss_scale(t) * (float)trainer__mb_weight(t, 0));
    return rc;
}

/* The micro batches' arrays: one set, or with a pipeline one per micro batch of the step
 * (each kept until its backward); an evaluation's zero weights; the tensor group's broadcast. */
static int alloc_batches(trainer *t) {
    const co_config *c = &t->cfg;
    size_t N = (size_t)c->micro_batch_size * c->seq_length;
    t->nmbuf = t->g.pp ? t->M_max : 1;
    t->mbuf = calloc((size_t)t->nmbuf, sizeof *t->mbuf);
    t->zeros = calloc(N, sizeof(float));
    t->bcast = t->g.tp ? malloc(5 * N * sizeof(int32_t)) : NULL;
    if (!t->mbuf || !t->zeros || (t->g.tp && !t->bcast)) return CO_ENOMEM;
    for (int k = 0; k < t->nmbuf; k++) {
        tr_batch *mb = &t->mbuf[k];
        mb->tokens = malloc(N * sizeof(int32_t));
        mb->targets = malloc(N * sizeof(int32_t));
        mb->positions = malloc(N * sizeof(int32_t));
        mb->seg = malloc(N * sizeof(int32_t));
        mb->mask = malloc(N * sizeof(float));
        mb->dscale = malloc(N * sizeof(float));
        if (t->cpn > 1 && c->mtp_num_layers > 0) {
            mb->full = malloc(3 * N * sizeof(int32_t));
            mb->full_mask = malloc(N * sizeof(float));
            if (!mb->full || !mb->full_mask) return CO_ENOMEM;
        }
        mb->T = c->seq_length;
        if (t->cpn > 1 && t->g.pp && !(mb->rows = malloc(N * sizeof(int32_t)))) return CO_ENOMEM;
        if (!mb->tokens || !mb->targets || !mb->positions || !mb->seg || !mb->mask || !mb->dscale) return CO_ENOMEM;
    }
    return 0;
}

/* The dataset layer's configuration from the flags (data->prefix: one .bin/.idx prefix). */
static void data_config(const co_config *c, const trainer_data *data, char **single, dl_config *dc) {
    memset(dc, 0, sizeof *dc);
    dc->base.mock = c->mock_data;
    dc->base.split = c->split;
    dc->base.seq_length = c->seq_length;
    dc->base.seed = (uint32_t)c->seed;
    dc->base.eod = data->eod;
    dc->base.vocab_size = data->vocab_size;
    dc->base.eod_mask_loss = c->eod_mask_loss;
    dc->base.reset_position_ids = c->reset_position_ids;
    dc->base.reset_attention_mask = c->reset_attention_mask;
    dc->base.cache_dir = c->data_cache_path[0] ? c->data_cache_path : NULL;
    single[0] = (char *)data->prefix;
    dc->data_path = data->prefix ? single : c->data_path;
    dc->n_data_path = data->prefix ? 1 : c->n_data_path;
    dc->split_path[0] = c->train_data_path, dc->n_split_path[0] = c->n_train_data_path;
    dc->split_path[1] = c->valid_data_path, dc->n_split_path[1] = c->n_valid_data_path;
    dc->split_path[2] = c->test_data_path, dc->n_split_path[2] = c->n_test_data_path;
    dc->sft = c->sft;
}

/* The datasets of the splits, on the ranks that read data (tensor rank 0; with a pipeline
 * the first and last stage and the MTP depths' stage). Rank 0 of the data-parallel ranks
 * builds (and caches) the indices first, the others then load them. */
static int open_data(trainer *t, const trainer_data *data) {
    const co_config *c = &t->cfg;
    cm_comm *bar = tr_groups_grad(&t->g); /* (with context ranks: every reader) */
    int rc;
    if (bar && !data->joining && bar->rank != 0 && (rc = bar->ops->barrier(bar, -1))) return rc;
    dl_config dc;
    char *single[1];
    data_config(c, data, single, &dc);
    if (c->sft) {
        if ((rc = tok_open_config(&t->sft_tok, c))) return rc;
        dc.tok = &t->sft_tok;
    }
    bool mtp_here = t->stages && pp_mtp_rank(t->stages, t->pp_size, t->vchunks) == t->pp_rank;
    bool reads = t->tp_rank == 0 && (!t->g.pp || t->pp_rank == 0 || t->pp_rank == t->pp_size - 1 || mtp_here);
    for (int s = 0; s < 3 && reads; s++) {
        int64_t want = co_config_split_samples(c, s);
        if (want <= 0) continue;
        if ((rc = dl_build(&t->ds[s], &dc, s, want))) return rc;
        t->has_split[s] = t->ds[s] != NULL;
    }
    if (bar && !data->joining && bar->rank == 0 && (rc = bar->ops->barrier(bar, -1))) return rc;
    if (reads && !t->ds[0]) return co_err_set(CO_EINVAL, "the train split of --split '%s' is empty", c->split);
    bool per_split = c->n_train_data_path || c->n_valid_data_path || c->n_test_data_path;
    if (reads && t->log && !data->joining && c->eval_iters > 0 && !t->ds[1])
        fprintf(t->log, "cohort: WARNING: evaluation is on (--eval-iters %lld) but the validation split is empty "
                "(%s%s): no validation loss will be computed\n", (long long)c->eval_iters,
                per_split ? "no --valid-data-path" : "--split ", per_split ? "" : c->split);
    return 0;
}

/* Where the logging rank's metrics records go: the caller's stream, or --metrics-file. */
static int open_metrics(trainer *t, const trainer_data *data) {
    const co_config *c = &t->cfg;
    if (!t->log) return 0;
    if (data->metrics) {
        t->metrics = data->metrics;
        t->metrics_borrowed = true;
    } else if (c->metrics_file[0] && !(t->metrics = fopen(c->metrics_file, "a"))) {
        return co_err_set(CO_EIO, "cannot open --metrics-file %s", c->metrics_file);
    }
    return 0;
}

int trainer_new(trainer **out, const co_config *cfg, const trainer_data *data, FILE *log) {
    *out = NULL;
    trainer *t = calloc(1, sizeof *t);
    if (!t) return CO_ENOMEM;
    t->cfg = *cfg; /* (the data paths stay owned by the caller's config) */
    t->log = log;
    const co_config *c = &t->cfg;
    int rc = adopt_groups(t, &data->groups);
    kb_options bo = {.device = strcmp(c->device, "cuda") == 0 ? KB_DEVICE_CUDA : KB_DEVICE_CPU,
                     .threads = c->threads,
                     .bf16 = c->bf16,
                     .fp16 = c->fp16,
                     .cuda_device = data->cuda_device};
    if (!rc) rc = kb_backend_new(&t->be, &bo);
    if (!rc) rc = build_model(t, data);
    if (!rc) lr_setup(t);
    if (!rc) rc = alloc_batches(t);
    if (!rc) rc = open_data(t, data);
    if (!rc) rc = open_metrics(t, data);
    if (rc) {
        trainer_destroy(&t);
        return rc;
    }
    t->start_time = now_s();
    *out = t;
    return 0;
}

void trainer_destroy(trainer **pt) {
    trainer *t = *pt;
    if (!t) return;
    trainer__overlap_free(t);
    trainer__pgather_free(t);
    for (int s = 0; s < 3; s++) dl_destroy(&t->ds[s]);
    tok_close(&t->sft_tok);
    trainer__moe_free(t);
    trainer__ep_free(t);
    if (t->model) {
        trainer__dopt_free(t);
        opt_adamw_free(&t->opt, t->model);
        gpt_destroy(&t->model);
    }
    if (t->pp_grecv && t->be) t->be->ops->free(t->be, t->pp_grecv); /* (pipeline.c's device staging) */
    for (int i = 0; i < t->pp_nq && t->be; i++) t->be->ops->free(t->be, t->pp_q[i].buf);
    free(t->pp_q);
    kb_backend_destroy(&t->be);
    if (t->metrics && !t->metrics_borrowed) fclose(t->metrics);
    else if (t->metrics) fflush(t->metrics);
    for (int k = 0; t->mbuf && k < t->nmbuf; k++) {
        tr_batch *mb = &t->mbuf[k];
        free(mb->tokens), free(mb->targets), free(mb->positions), free(mb->seg), free(mb->mask), free(mb->dscale);
        free(mb->full), free(mb->full_mask), free(mb->rows);
    }
    free(t->mbuf);
    free(t->zeros);
    free(t->bcast);
    free(t->skips);
    if (t->tl_open_rec) tl_flush(t->tl_open_rec);
    tl_close(&t->tl_open_rec);
    free(t->ops);
    free(t->stages);
    free(t->have_batch);
    free(t->poison);
    free(t->mb_loss_local);
    free(t->mb_tok_local);
    free(t->lbuf);
    free(t->meta);
    trainer__cp_free(t);
    free(t);
    *pt = NULL;
}

int64_t trainer_iteration(const trainer *t) { return t->iteration; }

bool trainer_save_ordered(const trainer *t) { return t->save_ordered; }

bool trainer_batch_changes(const trainer *t) {
    return t->cfg.rampup_start > 0 && co_config_batch_at(&t->cfg, t->consumed[0]) != t->gbs;
}
gpt_model *trainer_model(trainer *t) { return t->model; }
FILE *trainer_metrics_stream(trainer *t) { return t->metrics; }
double trainer_last_loss(const trainer *t) { return t->last_loss; }

/* The replica's rank 0 (tensor rank 0 of the first stage, context rank 0): it reads data
 * and speaks for the replica. */
static bool replica_lead(const trainer *t) {
    return t->tp_rank == 0 && (!t->g.pp || t->pp_rank == 0) && (t->cpn <= 1 || t->cpr == 0);
}

uint64_t trainer__dropout_seed(const trainer *t, int64_t gmb) {
    return mix(mix((uint64_t)t->cfg.seed, (uint64_t)t->iteration), (uint64_t)gmb);
}

/* The norm of the model's gradient: over the replica's ranks, each slice once and the tied
 * embedding's copy not counted (gpt_tp_grad_sumsq). */
int trainer__grad_norm(trainer *t, double *out) {
    if (t->epn > 1) return trainer__ep_grad_norm(t, out);
    cm_comm *rg = tr_groups_replica(&t->g);
    if (!rg) {
        *out = opt_grad_norm(t->model);
        return kb_backend_status(t->be);
    }
    double sq = gpt_tp_grad_sumsq(t->model);
    int rc = kb_backend_status(t->be);
    if (!rc) rc = rg->ops->allreduce_sum(rg, &sq, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    *out = sqrt(sq);
    return rc;
}

/* The micro batch from tensor-parallel rank 0 to the rest of its group: tokens, labels,
 * positions, document starts and loss mask in one broadcast (get_batch_on_this_tp_rank). */
static int broadcast_batch(trainer *t, tr_batch *x, size_t N) {
    int32_t *p = t->bcast;
    int32_t *parts[4] = {x->tokens, x->targets, x->positions, x->seg};
    if (t->tp_rank == 0) {
        for (int k = 0; k < 4; k++) memcpy(p + (size_t)k * N, parts[k], N * sizeof(int32_t));
        memcpy(p + 4 * N, x->mask, N * sizeof(float));
    }
    int rc = t->g.tp->ops->broadcast(t->g.tp, p, 5 * N * sizeof(int32_t), 0, TRAIN_COMM_TIMEOUT_MS);
    if (rc || t->tp_rank == 0) return rc;
    for (int k = 0; k < 4; k++) memcpy(parts[k], p + (size_t)k * N, N * sizeof(int32_t));
    memcpy(x->mask, p + 4 * N, N * sizeof(float));
    return 0;
}

int trainer__load_batch(trainer *t, int s, int64_t first, tr_batch *x, gpt_batch *b) {
    const co_config *c = &t->cfg;
    int B = c->micro_batch_size, T = c->seq_length;
    int64_t n = t->tp_rank == 0 ? dl_num_samples(t->ds[s]) : 0;
    for (int i = 0; i < B && t->tp_rank == 0; i++) {
        /* the valid iterator wraps around as Megatron's cyclic evaluation iterator does */
        int64_t idx = (first + i) % n;
        size_t o = (size_t)i * T;
        int rc = dl_get(t->ds[s], idx, x->tokens + o, x->targets + o, x->mask + o, x->positions + o, x->seg + o);
        if (rc) return rc;
    }
    if (t->g.tp) {
        int rc = broadcast_batch(t, x, (size_t)B * T);
        if (rc) return rc;
    }
    memset(b, 0, sizeof *b);
    b->B = B;
    b->T = T;
    b->tokens = x->tokens;
    b->targets = x->targets;
    b->positions = x->positions;
    b->seg = c->reset_attention_mask || c->sft ? x->seg : NULL; /* SFT: packed conversations */
    b->loss_mask = x->mask;
    b->rows = NULL;
    if (t->cpn > 1) return trainer__cp_localize(t, x, b, first); /* this context rank's tokens */
    return 0;
}

static void progress_clear(trainer *t) {
    if (t->progress_shown) {
        fputs("\r\033[K", stdout);
        t->progress_shown = 0;
    }
}

static void progress_draw(trainer *t, double loss, double tok_s) {
    const co_config *c = &t->cfg;
    int width = 30;
    double frac = (double)t->iteration / (double)c->train_iters;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    double eta = tok_s > 0 ? (double)(c->train_iters - t->iteration) * c->global_batch_size * c->seq_length / tok_s : 0;
    fprintf(stdout, "\r\033[K[%s] %lld/%lld  loss %.4f  %.0f tok/s  eta %dm%02ds", bar, (long long)t->iteration,
            (long long)c->train_iters, loss, tok_s, (int)eta / 60, (int)eta % 60);
    fflush(stdout);
    t->progress_shown = 1;
}

/* A number of a metrics record: JSON has no NaN or infinity, so those are written as the
 * strings "nan", "inf" and "-inf" (Python's float() and observe/tensorboard.c read them). */
static const char *json_num(char buf[40], const char *fmt, double v) {
    if (isnan(v)) return "\"nan\"";
    if (isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
    snprintf(buf, 40, fmt, v);
    return buf;
}

/* This process's resident memory now and at its peak (VmRSS, VmHWM of /proc/self/status,
 * in bytes; 0 where not readable): the metrics record's rss_bytes, max_rss_bytes */
static void resident_memory(long long *rss, long long *hwm) {
    *rss = *hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) *rss = kb * 1024;
        else if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) *hwm = kb * 1024;
    }
    fclose(f);
}

static int log_line(trainer *t, double lr, double grad_norm) {
    const co_config *c = &t->cfg;
    char moe_txt[480], moe_json[640], mtp_txt[320], mtp_json[320];
    int mrc = trainer__moe_log(t, moe_txt, sizeof moe_txt, moe_json, sizeof moe_json);
    if (!mrc) mrc = trainer__mtp_log(t, mtp_txt, sizeof mtp_txt, mtp_json, sizeof mtp_json);
    if (mrc) return mrc;
    strncat(moe_txt, mtp_txt, sizeof moe_txt - strlen(moe_txt) - 1);
    strncat(moe_json, mtp_json, sizeof moe_json - strlen(moe_json) - 1);
    double ms = 1000.0 * t->time_since_log / t->iters_since_log;
    double loss = t->tok_sum > 0 ? t->loss_sum / t->tok_sum : NAN;
    double tflops = t->flops_per_sample * t->gbs / (ms / 1000.0) / 1e12 /
                    (t->topo.world * t->tp_size * t->cpn * (t->g.pp ? t->pp_size : 1));
    double tok_s = (double)t->gbs * c->seq_length / (ms / 1000.0);
    char ts[32], dlr_txt[48] = "";
    timestamp(ts, sizeof ts);
    if (t->decoupled) snprintf(dlr_txt, sizeof dlr_txt, " decoupled learning rate: %.6E |", next_decoupled_lr(t));
    progress_clear(t);
    if (t->log) fprintf(t->log,
            " [%s] iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): %.1f | "
            "throughput per GPU (TFLOP/s/GPU): %.1f | learning rate: %.6E |%s global batch size: %5d | lm loss: %.6E |%s "
            "loss scale: %.1f | grad norm: %.3f | number of skipped iterations: %3lld | number of nan iterations: "
            "%3lld |\n",
            ts, (long long)t->iteration, (long long)c->train_iters, (long long)t->consumed[0], ms, tflops, lr,
            dlr_txt, t->gbs, loss, moe_txt, (double)t->scaler.scale, grad_norm, (long long)t->skipped,
            (long long)t->nan_iters);
    if (t->log) fflush(t->log);
    /* the tensor group's collectives inside the model since the last line (this rank's) */
    char tpx[400] = "";
    if (t->cfg.elastic) /* the data-parallel size and the samples read since the last record */
        snprintf(tpx, sizeof tpx, ",\"data_parallel_size\":%d,\"samples_read\":%.0f,\"sample_position_sum\":%.0f,"
                 "\"sample_position_sumsq\":%.0f", t->topo.dp, t->smp_log[0], t->smp_log[1], t->smp_log[2]);
    memset(t->smp_log, 0, sizeof t->smp_log);
    if (t->g.tp) {
        size_t used = strlen(tpx);
        gpt_tp_stats st;
        gpt_tp_stats_take(t->model, &st);
        snprintf(tpx + used, sizeof tpx - used, ",\"tensor_comm_ms_per_iteration\":%.3f,\"tensor_analytic_bytes_per_iteration\":%.0f",
                 1000.0 * st.comm_s / t->iters_since_log, (double)st.analytic_bytes / t->iters_since_log);
    }
    if (t->metrics) {
        long long rss, hwm;
        resident_memory(&rss, &hwm);
        char lb[40], gb[40];
        fprintf(t->metrics,
                "{\"iteration\":%lld,\"train_iters\":%lld,\"consumed_samples\":%lld,\"elapsed_ms_per_iteration\":%.3f,"
                "\"tokens_per_second\":%.1f,\"tflops_per_rank\":%.4f,\"learning_rate\":%.9e,\"global_batch_size\":%d,"
                "\"lm_loss\":%s,\"loss_scale\":%.1f,\"grad_norm\":%s,\"skipped_iterations\":%lld,"
                "\"nan_iterations\":%lld,\"validation_ms_per_iteration\":%.3f,\"weight_checksum_ms_per_iteration\":%.3f,"
                "\"weight_hash_ms_per_iteration\":%.3f%s%s,\"rss_bytes\":%lld,\"max_rss_bytes\":%lld,\"time\":\"%s\"}\n",
                (long long)t->iteration, (long long)c->train_iters, (long long)t->consumed[0], ms, tok_s, tflops, lr,
                t->gbs, json_num(lb, "%.9e", loss), (double)t->scaler.scale, json_num(gb, "%.6f", grad_norm), (long long)t->skipped, (long long)t->nan_iters,
                1000.0 * t->gate_s / t->iters_since_log, 1000.0 * t->sum_wait_s / t->iters_since_log,
                1000.0 * t->sum_hash_s / t->iters_since_log, tpx, moe_json, rss, hwm, ts);
        fflush(t->metrics);
    }
    t->last_loss = loss;
    t->gate_s = t->sum_wait_s = t->sum_hash_s = 0;
    t->loss_sum = t->tok_sum = 0;
    t->iters_since_log = 0;
    t->time_since_log = 0;
    return 0;
}

/* Data-parallel reduction of one step: gradients summed then averaged (one flat
 * all-reduce over the gradient buffer, chunked by the communicator), loss sums and token
 * counts summed, and the stop votes combined (a signal on any rank wins over a duration
 * limit). Every rank ends with identical bits. */
static int reduce_step(trainer *t, double *loss, double *tok, int *stop_reason) {
    /* over the data x context group with context parallelism: each context rank's gradient
     * is its tokens' part of its replica's (summed), the replicas are averaged */
    cm_comm *dp = t->g.dp, *gg = tr_groups_grad(&t->g);
    int rc;
    if (t->ovl) { /* the buckets started during the backward: what is still in flight, then the average */
        if ((rc = trainer__overlap_wait(t))) return rc;
        if (t->dopt) {
            if ((rc = trainer__dopt_reduce_finish(t))) return rc;
        } else {
            t->be->ops->scale(t->be, gpt_grads(t->model), 1.0f / (float)dp->size, gpt_num_params(t->model));
        }
    } else if (t->dopt) { /* the distributed optimizer: reduce-scatter, averaged, the norm */
        if ((rc = trainer__dopt_reduce(t))) return rc;
    } else if (t->epn > 1) { /* the experts' over the expert-data-parallel group only */
        if ((rc = trainer__ep_reduce_grads(t))) return rc;
    } else {
        rc = gg->ops->allreduce_sum(gg, gpt_grads(t->model), gpt_num_params(t->model), CM_F32, TRAIN_COMM_TIMEOUT_MS);
        if (rc) return rc;
        kb_backend *be = t->be;
        be->ops->scale(be, gpt_grads(t->model), 1.0f / (float)dp->size, gpt_num_params(t->model));
    }
    /* the loss sums and token counts of the whole sequences (every context rank's part) */
    double rep[4] = {*loss, *tok, *stop_reason == 1, *stop_reason == 2};
    rc = gg->ops->allreduce_sum(gg, rep, 4, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    if (rc) return rc;
    cm_comm *rg = tr_groups_replica(&t->g);
    if (rg && (rc = rg->ops->allreduce_sum(rg, rep + 2, 2, CM_F64, TRAIN_COMM_TIMEOUT_MS))) return rc;
    *loss = rep[0];
    *tok = rep[1];
    *stop_reason = rep[2] > 0 ? 1 : rep[3] > 0 ? 2 : 0;
    /* --elastic: the samples read, summed over the data-parallel ranks (integers: exact) */
    if (t->cfg.elastic) rc = gg->ops->allreduce_sum(gg, t->smp_step, 3, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    return rc;
}

/* A fault-related line on stderr; to_sink: also an event for the run report (a fault
 * injected or repaired here; the supervisor records its own verdicts itself). */
static void emit_line(trainer *t, const char *line, bool to_sink) {
    progress_clear(t);
    co_log(CO_LOG_WARN, "%s", line);
    if (to_sink && t->ev_fn) t->ev_fn(t->ev_ctx, line);
}
static void emit(trainer *t, const char *line) { emit_line(t, line, true); }
void trainer__emit(trainer *t, const char *line) { emit(t, line); }

/* kill, stop, hang and slow faults of this rank at (step, micro batch, phase) */
static void fire_process_faults(trainer *t, int64_t step, int mb, fi_phase ph) {
    if (!t->inj) return;
    int r = t->job_rank;
    static const fi_kind kinds[] = {FI_SLOW, FI_KILL, FI_STOP, FI_HANG};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        fi_fault *f = fi_take(t->inj, kinds[k], r, r, step, mb, ph);
        if (!f) continue;
        char line[400];
        fi_describe(f, r, step, mb, line, sizeof line);
        if (f->kind != FI_SLOW || f->fired == 1) emit(t, line);
        switch (f->kind) {
        case FI_SLOW: {
            /* the whole delay, even when a signal (a stop request) interrupts the sleep */
            struct timespec ts = {.tv_sec = f->ms / 1000, .tv_nsec = (long)(f->ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) && errno == EINTR) {}
            break;
        }
        case FI_KILL: raise(SIGKILL); break;
        case FI_STOP: raise(SIGSTOP); break;
        case FI_HANG: {
            /* a busy loop inside compute: only a stop order or an abort ends it */
            volatile uint64_t spin = 0;
            while (!(t->stop && *t->stop) && !(t->abort_flag && *t->abort_flag)) spin++;
            break;
        }
        default: break;
        }
    }
}

void trainer__inject_forward(trainer *t, int64_t step, int mb, int N) {
    fire_process_faults(t, step, mb, FI_PH_FORWARD);
    fi_fault *f;
    char line[400];
    if (t->inj && (f = fi_take(t->inj, FI_BITFLIP_PARAM, t->job_rank, t->job_rank, step, mb, FI_PH_FORWARD))) {
        int bit;
        size_t idx = fi_flip(f, gpt_params(t->model), gpt_num_params(t->model), &bit);
        gpt_sync_bf16(t->model);
        fi_describe(f, t->job_rank, step, mb, line, sizeof line);
        emit(t, line);
        co_log(CO_LOG_WARN, "inject: flipped bit %d of parameter %zu", bit, idx);
    }
    if (t->inj && (f = fi_take(t->inj, FI_BITFLIP_ACT, t->job_rank, t->job_rank, step, mb, FI_PH_FORWARD))) {
        int bit = f->bit >= 0 ? f->bit : 30;
        gpt_inject_act_flip(t->model, (size_t)(f->salt % ((uint64_t)N * (uint64_t)t->cfg.hidden_size)), bit);
        fi_describe(f, t->job_rank, step, mb, line, sizeof line);
        emit(t, line);
    }
}

int trainer__inject_loss(trainer *t, int64_t step, int mb, int data_rank, double *loss) {
    /* a corrupted loss (nan, inf, spike): the value reported, and for nan/inf the
     * gradients too, as a real one would poison them */
    static const fi_kind lk[] = {FI_NAN, FI_INF, FI_SPIKE};
    int poison = -1;
    fi_fault *f;
    char line[400];
    for (int k = 0; t->inj && k < 3 && poison < 0; k++)
        if ((f = fi_take(t->inj, lk[k], t->job_rank, fault_rank(t, data_rank), step, mb, FI_PH_FORWARD))) {
            poison = (int)lk[k];
            *loss = lk[k] == FI_NAN ? NAN : lk[k] == FI_INF ? INFINITY : *loss * 1000.0;
            fi_describe(f, t->job_rank, step, mb, line, sizeof line);
            emit_line(t, line, f->fired == 1); /* times=always: one event, many firings */
        }
    return poison;
}

/* COHORT_TEST_FP16_OVERFLOW=RANK:ITERATION (tests only): an Inf in that rank's gradients at
 * that iteration, as an fp16 overflow there leaves them, the loss finite
 * (tests/integration/fp16_test.sh). */
static bool test_overflow(const trainer *t, int64_t step, int mb) {
    const char *e = getenv("COHORT_TEST_FP16_OVERFLOW");
    long long r, it;
    return e && mb == 0 && sscanf(e, "%lld:%lld", &r, &it) == 2 && r == t->job_rank && it == step;
}

void trainer__inject_grads(trainer *t, int64_t step, int mb, int poison) {
    if (poison == FI_NAN || poison == FI_INF) gpt_grads(t->model)[0] = poison == FI_NAN ? NAN : INFINITY;
    if (t->cfg.fp16 && test_overflow(t, step, mb)) {
        t->be->ops->sync(t->be);
        gpt_grads(t->model)[0] = INFINITY;
    }
    fi_fault *f;
    if (t->inj && (f = fi_take(t->inj, FI_BITFLIP_GRAD, t->job_rank, t->job_rank, step, mb, FI_PH_BACKWARD))) {
        int bit;
        char line[400];
        size_t idx = fi_flip(f, gpt_grads(t->model), gpt_num_params(t->model), &bit);
        fi_describe(f, t->job_rank, step, mb, line, sizeof line);
        emit(t, line);
        co_log(CO_LOG_WARN, "inject: flipped bit %d of gradient %zu", bit, idx);
    }
}

void trainer__fire_process_faults(trainer *t, int64_t step, int mb, fi_phase ph) { fire_process_faults(t, step, mb, ph); }

/* --calculate-per-token-loss (Megatron's): every loss token of the iteration weighs the same,
 * 1 / (the loss tokens of every micro batch on every data-parallel rank), where without it a
 * token weighs 1 / (its micro batch's tokens) / M. The count is summed over the gradient's
 * group (data x context) before the first forward; the gradients are then averaged over the
 * data-parallel ranks, hence *w = dp / count. The weight is the step's, whichever share: a
 * check round (only the helper's replica runs it, so no collective may) takes the one its
 * training round counted. The auxiliary losses take it too (per_token_aux). With a pipeline
 * every stage counts the same tokens (Megatron's last stage counts and broadcasts them). */
static void per_token_aux(trainer *t, float w) {
    /* Megatron's router pre-multiplies the aux and z losses by the micro batch's tokens (its
     * rank's times the tensor x context size), so that the division by the step's tokens
     * leaves them 1 / (micro batches x dp) when no token is masked */
    float ls = trainer__loss_scale(t);
    double mbt = (double)t->cfg.micro_batch_size * (double)t->cfg.seq_length;
    gpt_set_aux_loss_scale(t->model, (float)(w * mbt) * ls);
    gpt_set_mtp_token_weight(t->model, w * ls);
}

int trainer__per_token_weight(trainer *t, int data_rank, int64_t step, float *w) {
    if (t->tok_w_step == step + 1) {
        *w = t->tok_w;
        per_token_aux(t, *w);
        return 0;
    }
    double n = 0;
    int M = t->cfg.elastic ? trainer__share(t, t->gbs, data_rank) : t->M; /* (--elastic: uneven shares) */
    for (int mb = 0; mb < M; mb++) {
        gpt_batch b;
        tr_batch *x = &t->mbuf[0];
        int64_t first = t->consumed[0] + ((int64_t)mb * t->topo.dp + data_rank) * t->cfg.micro_batch_size;
        int rc = trainer__load_batch(t, 0, first, x, &b);
        if (rc) return rc;
        for (int i = 0; i < b.B * b.T; i++) n += x->mask[i];
    }
    cm_comm *gg = tr_groups_grad(&t->g);
    if (gg) {
        int rc = gg->ops->allreduce_sum(gg, &n, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS);
        if (rc) return rc;
    }
    int dp = t->g.dp ? t->g.dp->size : 1;
    *w = t->tok_w = n > 0 ? (float)(dp / n) : 0.0f;
    t->tok_w_step = step + 1;
    per_token_aux(t, *w);
    return 0;
}

void trainer__count_samples(trainer *t, int64_t first) {
    if (t->cpn > 1 && t->cpr != 0) return; /* (the context ranks read parts of the same samples) */
    for (int i = 0; i < t->cfg.micro_batch_size; i++) {
        double p = (double)(first + i);
        t->smp_step[0] += 1, t->smp_step[1] += p, t->smp_step[2] += p * p;
    }
}

/* Forward and backward of data_rank's share of the step (micro batches mb*dp + data_rank),
 * gradients cleared first. Per micro batch loss sums and token counts are folded into t->mbs;
 * *grad_norm is the norm of this rank's gradients before any reduction. */
static int compute_share(trainer *t, int data_rank, int64_t step, double *loss_out, double *tok_out,
                         double *grad_norm) {
    const co_config *c = &t->cfg;
    int B = c->micro_batch_size, N = B * c->seq_length;
    trainer__overlap_arm(t); /* (first: a thread an error left behind may still write the gradients) */
    gpt_zero_grad(t->model);
    rr_mbs_reset(&t->mbs);
    double it_loss = 0, it_tok = 0;
    float wtok = 0;
    if (c->calculate_per_token_loss) {
        int rc = trainer__per_token_weight(t, data_rank, step, &wtok);
        if (rc) return rc;
    }
    /* data_rank's micro batches (a check round's may be another rank's share), and the batch's:
     * each micro batch's loss is its tokens' mean over the batch's micro batches, whichever
     * rank computes it (dp / (tokens x total) is 1 / (tokens x M) bit for bit when dp divides) */
    int M = t->cfg.elastic ? trainer__share(t, t->gbs, data_rank) : t->M;
    memset(t->smp_step, 0, sizeof t->smp_step);
    for (int mb = 0; mb < M; mb++) {
        double t0 = now_s();
        gpt_batch b;
        /* Megatron's sampler: each group of micro x dp samples is one micro batch per
         * rank; gmb is the micro batch's index in a one-rank run of the same batch */
        int64_t gmb = (int64_t)mb * t->topo.dp + data_rank;
        tr_batch *x = &t->mbuf[0];
        double tl0 = tl_now();
        int rc = trainer__load_batch(t, 0, t->consumed[0] + gmb * B, x, &b);
        if (rc) return rc;
        trainer__tl(t, TL_DATA, mb, -1, tl0);
        N = b.B * b.T; /* this rank's tokens (its share under context parallelism) */
        double ntok = 0;
        for (int i = 0; i < N; i++) ntok += x->mask[i];
        /* normalised by the whole sequences' loss tokens (all context ranks' together) */
        double nall = t->cpn > 1 ? t->cp_ntok : ntok;
        float w = c->calculate_per_token_loss ? wtok * trainer__loss_scale(t)
                  : nall > 0 ? (float)trainer__mb_weight(t, nall) * trainer__loss_scale(t)
                             : 0.0f;
        trainer__count_samples(t, t->consumed[0] + gmb * B);
        for (int i = 0; i < N; i++) x->dscale[i] = x->mask[i] * w;
        uint64_t seed = trainer__dropout_seed(t, gmb);
        double t1 = now_s();
        t->phase_ms[TR_PH_DATA] += 1000 * (t1 - t0);
        trainer__inject_forward(t, step, mb, N);
        tl0 = tl_now();
        double loss = gpt_forward(t->model, &b, true, seed, x->dscale, NULL);
        /* a failed forward ends the share: its layers' state is not this micro batch's (an
         * exchange that failed left it half written), so no backward may go through it.
         * (--overlap-param-gather: the forward waited for every bucket, the thread joins; a
         * failed wait ends the share before the backward's own collectives) */
        if ((rc = kb_backend_status(t->be)) || (t->pg && (rc = trainer__dopt_sync(t)))) return rc;
        trainer__tl(t, TL_FORWARD, mb, 0, tl0);
        int poison = trainer__inject_loss(t, step, mb, data_rank, &loss);
        double t2 = now_s();
        t->phase_ms[TR_PH_FORWARD] += 1000 * (t2 - t1);
        fire_process_faults(t, step, mb, FI_PH_BACKWARD);
        tl0 = tl_now();
        trainer__overlap_last(t, mb == M - 1, !poison);
        gpt_backward(t->model, &b, seed);
        trainer__tl(t, TL_BACKWARD, mb, 0, tl0);
        trainer__inject_grads(t, step, mb, poison);
        t->phase_ms[TR_PH_BACKWARD] += 1000 * (now_s() - t2);
        rr_mbs_add(&t->mbs, mb, loss, ntok);
        it_loss += loss;
        it_tok += ntok;
        if (kb_backend_status(t->be)) return kb_backend_status(t->be);
    }
    *loss_out = it_loss;
    *tok_out = it_tok;
    if (t->g.tp) {
        /* the parts of replicated parameters' gradients summed over the tensor group */
        int rc = gpt_tp_finalize_grads(t->model);
        if (rc) return rc;
    }
    *grad_norm = 0;
    if (t->ovl) return trainer__overlap_flush(t, grad_norm); /* (the rest starts; the norm as it was) */
    if (t->have_val) {
        /* this replica's norm (the tensor group's, the same on each of its ranks) */
        int rc = trainer__grad_norm(t, grad_norm);
        if (rc) return rc;
    }
    return 0;
}

static bool skip_listed(const trainer *t, int64_t step) {
    for (int i = 0; i < t->nskips; i++)
        if (t->skips[i] == step) return true;
    return false;
}

/* The data-parallel coordinate (replica) of a world rank the supervisor names (a verdict's
 * suspect or helper): the world rank itself without model or context parallelism. */
static int replica_of(const trainer *t, int world_rank) {
    if (t->epn > 1) return trainer__ep_replica_of(t, world_rank); /* (its place in the state group) */
    topo_coord co;
    if ((tr_groups_replica(&t->g) || t->cpn > 1) && t->have_layout && world_rank >= 0 &&
        topo_coords(&t->layout, world_rank, &co) == 0)
        return co.dp;
    return world_rank;
}

/* ---- the weights' checksum (silent data corruption, resilience/rerun.h) ----
 * gpt_weights_checksum: the fp32 master weights and, in bf16 mode, the bf16 working copy
 * the forward and backward read; data-parallel replicas hold both bitwise equal. */

/* Are the weights checksummed at all (a validator that compares replicas, an interval)? */
static bool sums_on(const trainer *t) {
    return t->g.dp && t->g.dp->size > 1 && t->have_val && t->val.checksum && t->cfg.check_weight_hash_interval > 0 &&
           !strcmp(t->cfg.rerun_mode, "validate_results");
}

/* The checksum of what this rank just wrote into its weights (an optimizer step, a repair,
 * a load): a later change in memory then shows as a used checksum that differs. */
static void note_written(trainer *t) {
    t->have_written = sums_on(t);
    if (!t->have_written) return;
    double t0 = now_s();
    t->sum_written = gpt_weights_checksum(t->model);
    double dt = now_s() - t0;
    t->sum_wait_s += dt;
    t->sum_hash_s += dt;
}

typedef struct sum_job {
    trainer *t;
    uint64_t sum;
    double s; /* how long it took */
} sum_job;

static void *sum_main(void *arg) {
    sum_job *j = arg;
    double t0 = now_s();
    j->sum = gpt_weights_checksum(j->t->model);
    j->s = now_s() - t0;
    return NULL;
}

/* Under model parallelism each rank hashes its part: the replica's checksums are the hashes
 * of its ranks' (all-gathered over the replica's ranks), the same on each of them, so the
 * supervisor compares replicas as it does without model parallelism. */
static int combine_sums(trainer *t, rr_report *r) {
    cm_comm *rg = tr_groups_validation(&t->g);
    int n = rg->size;
    uint64_t mine[3] = {r->sum_used, r->sum_written, r->has_written};
    uint64_t *all = malloc(sizeof *all * 5 * (size_t)n);
    if (!all) return co_err_set(CO_ENOMEM, "checksums of %d ranks: out of memory", n);
    int rc = rg->ops->allgather(rg, mine, all, sizeof mine, TRAIN_COMM_TIMEOUT_MS);
    if (!rc) {
        uint64_t *used = all + 3 * (size_t)n, *written = used + n;
        bool have = true;
        for (int k = 0; k < n; k++) {
            used[k] = all[3 * k];
            written[k] = all[3 * k + 1];
            have = have && all[3 * k + 2];
        }
        r->sum_used = XXH3_64bits(used, sizeof(uint64_t) * (size_t)n);
        r->sum_written = XXH3_64bits(written, sizeof(uint64_t) * (size_t)n);
        r->has_written = have;
    }
    free(all);
    return rc;
}

/* Every rank takes rank `root`'s parameters and optimizer state (REPAIR, replica repair). */
static int take_state(trainer *t, int root) {
    cm_comm *dp = tr_groups_state(&t->g);
    size_t n = gpt_num_params(t->model);
    int rc = dp->ops->broadcast(dp, gpt_params(t->model), n * sizeof(float), root, TRAIN_COMM_TIMEOUT_MS);
    if (!rc && t->opt.m) rc = dp->ops->broadcast(dp, t->opt.m, n * sizeof(float), root, TRAIN_COMM_TIMEOUT_MS);
    if (!rc && t->opt.v) rc = dp->ops->broadcast(dp, t->opt.v, n * sizeof(float), root, TRAIN_COMM_TIMEOUT_MS);
    if (!rc) gpt_sync_bf16(t->model);
    if (!rc) note_written(t);
    return rc;
}

/* Replica consistency: every rank hashes its parameters and optimizer state; a rank that
 * differs from the majority (the lowest rank's hash when there is no majority of two or
 * more... with two ranks a mismatch cannot be attributed: both are reported) takes the
 * majority's state. */
static int check_replicas(trainer *t) {
    cm_comm *dp = tr_groups_state(&t->g);
    size_t n = gpt_num_params(t->model);
    XXH64_state_t *h = XXH64_createState();
    if (!h) return CO_ENOMEM;
    XXH64_reset(h, 0);
    XXH64_update(h, gpt_params(t->model), n * sizeof(float));
    if (t->opt.m) XXH64_update(h, t->opt.m, n * sizeof(float));
    if (t->opt.v) XXH64_update(h, t->opt.v, n * sizeof(float));
    uint64_t mine = XXH64_digest(h);
    XXH64_freeState(h);
    uint64_t *all = calloc((size_t)dp->size, sizeof *all);
    if (!all) return CO_ENOMEM;
    int rc = dp->ops->allgather(dp, &mine, all, sizeof mine, TRAIN_COMM_TIMEOUT_MS);
    if (rc) {
        free(all);
        return rc;
    }
    /* the majority hash; ties go to the lowest rank's */
    int best = 0, best_count = 0;
    for (int r = 0; r < dp->size; r++) {
        int cnt = 0;
        for (int q = 0; q < dp->size; q++) cnt += all[q] == all[r];
        if (cnt > best_count) {
            best = r;
            best_count = cnt;
        }
    }
    int bad = 0;
    for (int r = 0; r < dp->size; r++) bad += all[r] != all[best];
    if (bad) {
        char line[300];
        int len = snprintf(line, sizeof line, "replica check at iteration %lld: rank(s)", (long long)t->iteration);
        for (int r = 0; r < dp->size && len < (int)sizeof line - 40; r++)
            if (all[r] != all[best]) len += snprintf(line + len, sizeof line - (size_t)len, " %d", r);
        snprintf(line + len, sizeof line - (size_t)len, " differ from rank %d (%d of %d agree); repaired from rank %d",
                 best, best_count, dp->size, best);
        if (dp->rank == best || all[dp->rank] != all[best]) emit(t, line);
        rc = take_state(t, best);
    }
    free(all);
    return rc;
}

void trainer_set_abort_flag(trainer *t, volatile sig_atomic_t *flag) { t->abort_flag = flag; }

void trainer_set_output(trainer *t, FILE *log, FILE *metrics) {
    if (t->metrics && !t->metrics_borrowed) fclose(t->metrics);
    else if (t->metrics) fflush(t->metrics);
    t->log = log;
    t->metrics = log ? metrics : NULL;
    t->metrics_borrowed = true;
}

void trainer_model_parallel(const trainer *t, int *tp, int *tp_rank, int *pp, int *pp_rank) {
    *tp = t->tp_size;
    *tp_rank = t->tp_rank;
    *pp = t->pp_size;
    *pp_rank = t->pp_rank;
}

void trainer_expert_parallel(const trainer *t, int *ep, int *ep_rank) {
    *ep = t->epn;
    *ep_rank = t->epr;
}

gpt_config trainer_model_config_of(const trainer *t, int tp_rank, int pp_rank) {
    gpt_config c = *gpt_get_config(t->model);
    c.tp_rank = tp_rank;
    if (!t->stages) return c;
    c.nchunks = t->vchunks;
    for (int ci = 0; ci < t->vchunks; ci++) c.chunks[ci] = trainer__chunk_of(t->stages, t->pp_size, t->vchunks, pp_rank, ci, 1);
    return c;
}

int trainer_open_timeline(trainer *t, int world_rank, int world) {
    const co_config *c = &t->cfg;
    if (!c->timeline_dir[0] || t->tl_open_rec) return 0;
    tl_meta m = {.rank = world_rank, .world = world, .tp = t->tp_size, .pp = t->pp_size,
                 .dp = t->g.dp ? t->g.dp->size : 1, .tp_rank = t->tp_rank, .pp_rank = t->pp_rank,
                 .dp_rank = t->topo.dp_rank, .v = t->g.pp ? t->vchunks : 1, .m = t->M};
    t->tl_start = t->iteration;
    return tl_open(&t->tl_open_rec, c->timeline_dir, &m);
}

void trainer_set_wait_fn(trainer *t, void (*fn)(void *ctx, int stage), void *ctx) {
    t->wait_fn = fn;
    t->wait_ctx = ctx;
}

int trainer_describe_stage(const trainer *t, char *buf, size_t n) {
    if (!t->stages || !n) return 0;
    int v = t->vchunks, len = snprintf(buf, n, "pipeline stage %d of %d: ", t->pp_rank, t->pp_size);
    if (v > 1) len += snprintf(buf + len, n - (size_t)len, "%d model chunks: layers ", v);
    else len += snprintf(buf + len, n - (size_t)len, "layers ");
    for (int ci = 0; ci < v && len > 0 && (size_t)len < n; ci++) {
        const pp_stage *s = &t->stages[t->pp_rank * v + ci];
        const char *sep = ci ? ", " : "";
        if (!s->num_layers) len += snprintf(buf + len, n - (size_t)len, "%snone", sep);
        else if (s->num_layers == 1) len += snprintf(buf + len, n - (size_t)len, "%s%d", sep, s->first_layer);
        else len += snprintf(buf + len, n - (size_t)len, "%s%d-%d", sep, s->first_layer, s->first_layer + s->num_layers - 1);
        if (s->embedding && (size_t)len < n) len += snprintf(buf + len, n - (size_t)len, " (and the embedding)");
        if (s->loss && (size_t)len < n) len += snprintf(buf + len, n - (size_t)len, " (and the head and loss)");
    }
    return len;
}

/* The tensor group of a new generation (NULL between generations): the model's collectives
 * and the experts split over it follow. */
static void set_tensor_group(trainer *t, cm_comm *tp) {
    if (!t->g.tp && !tp) return;
    t->g.tp = tp;
    gpt_set_tensor_group(t->model, tp, TRAIN_COMM_TIMEOUT_MS);
    kb_backend_clear_status(t->be); /* a collective the last generation's abort failed */
    trainer__etp_tensor_group(t);   /* (experts split over it without expert parallelism) */
}

void trainer_set_groups(trainer *t, const tr_groups *g) {
    static const tr_groups none;
    if (!g) g = &none;
    trainer__overlap_drain(t); /* (a thread an error left behind uses the old groups) */
    t->tok_w_step = 0; /* (a new generation counts the step's tokens over its own groups) */
    trainer__pgather_cancel(t); /* (the handover gathers the parameters again) */
    t->g.dp = g->dp;
    t->g.grad_ovl = t->cfg.overlap_grad_reduce ? g->grad_ovl : NULL;
    if (g->dp) topo_init(&t->topo, g->dp->size, 1, 1, 1, g->dp->rank);
    /* --elastic: the data-parallel size may have changed (a shrink, a grow): this rank's share,
     * and the job's layout over the new world (a verdict's world ranks name replicas by it) */
    if (g->dp && t->cfg.elastic) {
        (void)trainer__use_m(t, trainer__share(t, t->gbs, t->topo.dp_rank)); /* (1..M_max: no error) */
        topo_layout *l = &t->layout;
        char lerr[200];
        if (t->have_layout)
            t->have_layout = topo_layout_init(l, g->dp->size * l->tp * l->cp * l->pp, l->tp, l->pp, l->cp, l->ep, l->etp,
                                              l->tp_pp_dp, lerr, sizeof lerr) == 0;
    }
    set_tensor_group(t, g->tp);
    trainer__cp_set_groups(t, g);
    if (t->pp_size > 1) {
        t->g.pp = g->pp;
        t->g.pp_bwd = g->pp_bwd;
        t->g.pp_dev = g->pp_dev;
        t->g.pp_dev_bwd = g->pp_dev_bwd;
        t->g.emb = g->emb;
        t->g.mp = g->mp;
    }
    trainer__ep_set_groups(t, g);
}

void trainer_state_replaced(trainer *t) { t->have_written = false; }

int trainer_sync_state(trainer *t, int root) {
    if (!t->g.dp) return 0;
    int64_t mine = t->iteration;
    /* (the distributed optimizer: the parameters come from the shards' holders below) */
    int rc = t->dopt ? 0 : take_state(t, root);
    if (rc) return rc;
    /* progress: iteration, samples consumed, counters, log accumulators, optimizer steps */
    /* and --fp16's loss scaler (scale, trackers) */
    double p[14] = {(double)t->iteration, (double)t->consumed[0], (double)t->consumed[1], (double)t->consumed[2],
                    (double)t->skipped,   (double)t->nan_iters,   t->loss_sum,            t->tok_sum,
                    (double)t->iters_since_log, (double)t->opt.step, t->time_since_log, (double)t->scaler.scale,
                    (double)t->scaler.growth_tracker, (double)t->scaler.hysteresis_tracker};
    cm_comm *sg = tr_groups_state(&t->g);
    rc = sg->ops->broadcast(sg, p, sizeof p, root, TRAIN_COMM_TIMEOUT_MS);
    if (rc) return rc;
    t->iteration = (int64_t)p[0];
    for (int s = 0; s < 3; s++) t->consumed[s] = (int64_t)p[1 + s];
    t->skipped = (int64_t)p[4];
    t->nan_iters = (int64_t)p[5];
    t->loss_sum = p[6];
    t->tok_sum = p[7];
    t->iters_since_log = (int)p[8];
    t->opt.step = (int64_t)p[9];
    t->time_since_log = p[10];
    t->scaler.scale = (float)p[11];
    t->scaler.growth_tracker = (int64_t)p[12];
    t->scaler.hysteresis_tracker = (int64_t)p[13];
    if (t->dopt) {
        rc = trainer__dopt_handover(t, mine == t->iteration);
        if (!rc) note_written(t);
    }
    return rc;
}

/* ---- the iteration as named phases ----
 * trainer_train is a loop over them, one tr_iter per iteration: attempt the step (forward
 * and backward over the schedule, the report, the reduction), await the verdict (an action:
 * train/verdict.h; rerun, check and repair run another attempt), apply the update, and after
 * the step (commit, logging, checks, evaluation, hooks, the exit rules). */

/* One iteration's state through its phases. */
typedef struct tr_iter {
    int64_t step;        /* the iteration trained (1-based, as logged) */
    double t0;           /* when it started */
    double loss, tok;    /* its loss sum and loss tokens (reduced over the data-parallel ranks) */
    double local_norm;   /* this rank's gradient norm before the reduction (its report's) */
    double grad_norm;    /* the reduced gradient's norm (the update's, the log line's) */
    int stop_reason;     /* the ranks' vote: 0 go on, 1 a signal, 2 --exit-duration-in-mins */
    int attempt;         /* the round (the verdict's attempt number) */
    bool checking;       /* the next round is a check round */
    int check_for;       /* in a check round: the data-parallel share this rank recomputes (-1: none) */
    int check_suspect;   /* the world rank whose share it is */
    bool check_reports;  /* this rank reports the recomputation (its replica's helper) */
} tr_iter;

/* The validator's report of a round: its micro batches' losses and tokens folded, this rank's gradient
 * norm, the MoE and MTP losses (a check round's names the share it recomputed). */
static void build_report(trainer *t, const tr_iter *it, int check_for, rr_report *r) {
    *r = (rr_report){.iteration = it->step, .attempt = it->attempt, .rank = t->topo.dp_rank,
                     .check_for = check_for, .nmb = t->mbs.n, .mb = t->mbs, .grad_norm = it->local_norm};
    trainer__aux_report(t, r);
}

/* Forward and backward of data_rank's share of the step: the pipeline's schedule, or the
 * micro batches one after another. */
static int run_share(trainer *t, int data_rank, tr_iter *it, double *loss, double *tok) {
    int rc = t->g.pp ? trainer__pipeline_share(t, data_rank, it->step, loss, tok, &it->local_norm)
                     : compute_share(t, data_rank, it->step, loss, tok, &it->local_norm);
    /* the validator judges the true gradients' norm (--fp16: unscaled; a power-of-two scale
     * divides exactly); an overflow stays non-finite */
    if (t->cfg.fp16) it->local_norm *= (double)opt_grad_scaler_inv(&t->scaler);
    return rc;
}

/* The reduction of a round (reduce_step) with, when the round is checksummed, the weights it
 * used hashed on a thread meanwhile (neither touches the other's memory); then the checksums
 * to the validator. On CUDA the hash is a kernel on the backend's stream, which only the
 * training thread drives: it hashes after the reduction there. */
static int reduce_and_hash(trainer *t, tr_iter *it, rr_report *r) {
    sum_job job = {.t = t};
    pthread_t th;
    bool threaded = r->has_sum && gpt_backend(t->model)->opt.device == KB_DEVICE_CPU &&
                    !pthread_create(&th, NULL, sum_main, &job);
    double tl0 = tl_now();
    int rc = t->g.dp ? reduce_step(t, &it->loss, &it->tok, &it->stop_reason) : 0;
    if (t->g.dp && !rc) trainer__tl(t, TL_DP_REDUCE, -1, -1, tl0);
    double tj = now_s();
    if (threaded) pthread_join(th, NULL);
    else if (r->has_sum && !rc) sum_main(&job);
    t->sum_wait_s += now_s() - tj;
    t->sum_hash_s += job.s;
    if (rc || !r->has_sum) return rc;
    r->sum_used = job.sum;
    r->has_written = t->have_written;
    r->sum_written = t->sum_written;
    cm_comm *vg = tr_groups_validation(&t->g);
    if (vg && (rc = combine_sums(t, r))) return rc;
    return t->val.checksum(t->val.ctx, r);
}

/* A round of the step: this rank's share computed and reported, the stop vote, the reduction. */
static int train_round(trainer *t, tr_iter *it, volatile sig_atomic_t *stop) {
    const co_config *c = &t->cfg;
    t->ovl_reduce = true;
    int rc = run_share(t, t->topo.dp_rank, it, &it->loss, &it->tok);
    if (rc) return rc;
    rr_report r = {0};
    if (t->have_val) {
        build_report(t, it, -1, &r);
        r.has_sum = sums_on(t) && it->step % c->check_weight_hash_interval == 0;
        double tr = now_s();
        if ((rc = t->val.report(t->val.ctx, &r, t->phase_ms))) return rc;
        t->gate_s += now_s() - tr;
    }
    fire_process_faults(t, it->step, -1, FI_PH_ALLREDUCE);
    /* one vote per rank on stopping, so that every rank stops after the same iteration */
    bool want_stop = (stop && *stop) ||
                     (c->exit_duration_in_mins > 0 && (now_s() - t->start_time) / 60.0 > c->exit_duration_in_mins);
    it->stop_reason = stop && *stop ? 1 : want_stop ? 2 : 0;
    double ta = now_s();
    if ((rc = reduce_and_hash(t, it, &r))) return rc;
    t->phase_ms[TR_PH_ALLREDUCE] += 1000 * (now_s() - ta);
    return 0;
}

/* A check round: the helper's replica recomputes the suspect's share; the helper reports it. */
static int check_round(trainer *t, tr_iter *it) {
    if (it->check_for < 0) return 0;
    double l, k;
    t->ovl_reduce = false;
    int rc = run_share(t, it->check_for, it, &l, &k);
    if (rc) return rc;
    rr_report r;
    build_report(t, it, tr_groups_validation(&t->g) ? it->check_suspect : it->check_for, &r);
    return it->check_reports ? t->val.report(t->val.ctx, &r, t->phase_ms) : 0;
}

/* Phase 1, attempt the step: a training round or a check round. */
static int attempt_step(trainer *t, tr_iter *it, volatile sig_atomic_t *stop) {
    trainer__aux_attempt(t); /* an earlier attempt's MoE and MTP statistics do not count */
    return it->checking ? check_round(t, it) : train_round(t, it, stop);
}

/* The verdict's line on stderr: an accepted round's diagnosis (one process), or the decision
 * (on the suspect replica's lead rank). */
static void log_verdict(trainer *t, const tr_iter *it, const rr_verdict *v) {
    char line[600];
    if (v->decision == RR_ACCEPT) {
        if (v->diagnosis == RR_DIAG_NONE) return;
        snprintf(line, sizeof line, "iteration %lld: %s: %s", (long long)it->step, rr_diagnosis_name(v->diagnosis),
                 v->reason);
        if (t->topo.dp_rank == 0 && !t->g.dp) emit_line(t, line, false);
        return;
    }
    snprintf(line, sizeof line, "iteration %lld: %s: %s", (long long)it->step, rr_decision_name(v->decision),
             v->reason);
    if (!t->g.dp ||
        (replica_of(t, v->suspect) == tr_groups_state(&t->g)->rank && replica_lead(t) && t->epr == 0))
        emit_line(t, line, false);
}

/* The next round of the iteration as the verdict orders it (rerun, check, repair). */
static int prepare_round(trainer *t, tr_iter *it, const rr_verdict *v, tr_action a) {
    it->attempt = v->attempt;
    it->checking = a == TR_ACT_CHECK;
    if (a == TR_ACT_CHECK) {
        /* the helper's replica recomputes (all of its tensor group); the helper reports */
        int me = t->topo.dp_rank;
        it->check_for = t->epn > 1                          ? trainer__ep_check_share(t, v->helper, v->suspect)
                        : replica_of(t, v->helper) == me ? replica_of(t, v->suspect)
                                                         : -1;
        it->check_suspect = v->suspect;
        it->check_reports = v->helper == t->job_rank || !tr_groups_validation(&t->g);
    } else if (a == TR_ACT_REPAIR) {
        int src = replica_of(t, v->helper);
        if (!t->g.dp || src < 0 || src >= tr_groups_state(&t->g)->size)
            return co_err_set(CO_EPROTOCOL, "verdict REPAIR from rank %d", v->helper);
        return take_state(t, src);
    }
    return 0;
}

/* Phase 2, await the verdict on the round just run: its action in *a; a replaying action has
 * set up the next round. */
static int await_verdict(trainer *t, tr_iter *it, tr_action *a) {
    if (!t->have_val) {
        *a = tr_verdict_action(NULL, it->checking);
        return 0;
    }
    double tv = now_s();
    rr_verdict v;
    int rc = t->val.verdict(t->val.ctx, it->step, it->attempt, &v);
    if (rc) return rc;
    t->phase_ms[TR_PH_ALLREDUCE] += 1000 * (now_s() - tv);
    t->gate_s += now_s() - tv;
    if (v.decision != RR_ACCEPT) tl_discard(t->tl); /* the timeline keeps the attempt that counts */
    else t->save_ordered = v.save;
    *a = tr_verdict_action(&v, it->checking);
    if (*a == TR_ACT_PROTOCOL) return co_err_set(CO_EPROTOCOL, "verdict ACCEPT after a check round");
    log_verdict(t, it, &v);
    return tr_action_replays(*a) ? prepare_round(t, it, &v, *a) : 0;
}

/* A fault injected after the optimizer step: a flipped parameter bit. */
static void inject_after_update(trainer *t, int64_t step) {
    fi_fault *f;
    if (!t->inj || !(f = fi_take(t->inj, FI_BITFLIP_PARAM, t->job_rank, t->job_rank, step, -1, FI_PH_OPTIMIZER)))
        return;
    int bit;
    char line[400];
    size_t idx = fi_flip(f, gpt_params(t->model), gpt_num_params(t->model), &bit);
    gpt_sync_bf16(t->model);
    fi_describe(f, t->job_rank, step, -1, line, sizeof line);
    emit(t, line);
    co_log(CO_LOG_WARN, "inject: flipped bit %d of parameter %zu", bit, idx);
}

/* The optimizer step proper: the pre-step hooks, the expert biases, AdamW (or the
 * distributed optimizer's shard update), its checksum where the next step compares it. */
static int optimizer_step(trainer *t, tr_iter *it) {
    const co_config *c = &t->cfg;
    for (int i = 0; i < t->npre_step; i++) {
        int rc = t->pre_step[i](t, t->pre_step_ctx[i]);
        if (rc < 0) return rc;
    }
    fire_process_faults(t, it->step, -1, FI_PH_OPTIMIZER);
    int rc = trainer__moe_pre_step(t); /* the expert biases move before the weights do */
    if (rc) return rc;
    double lr = next_lr(t);
    /* the next step's checksum compares with what this step writes (hashed as AdamW writes
     * it, where the backend can) */
    bool written = sums_on(t) && (it->step + 1) % c->check_weight_hash_interval == 0;
    t->opt.lr_decoupled = next_decoupled_lr(t);
    if (t->dopt) {
        if ((rc = trainer__dopt_step(t, lr, it->grad_norm, written ? &t->sum_written : NULL))) return rc;
    } else {
        opt_adamw_step_checksum(&t->opt, t->model, lr, it->grad_norm, written ? &t->sum_written : NULL);
    }
    if (written) t->have_written = true;
    return kb_backend_status(t->be);
}

/* --fp16: the gradients overflowed at this loss scale (the norm, reduced over every rank of
 * the replica and computed from gradients reduced over the data-parallel ranks, is the
 * found-inf flag: non-finite exactly when some gradient is). As Megatron: no update, the
 * iteration counts as skipped (and as a NaN iteration if its loss is not finite), its loss
 * stays out of the log's average, and the scaler learns of the overflow. */
static int skip_overflow(trainer *t, tr_iter *it, double loss) {
    t->skipped++;
    if (!isfinite(loss)) t->nan_iters++;
    it->loss = it->tok = 0;
    float before = t->scaler.scale;
    opt_grad_scaler_update(&t->scaler, true);
    co_log(CO_LOG_DEBUG, "iteration %lld: fp16 gradients overflowed at loss scale %g: step skipped, loss scale %g",
           (long long)it->step, (double)before, (double)t->scaler.scale);
    return 0;
}

/* Phase 3, apply the update of an accepted step: the norm, the NaN policy, the optimizer. A
 * skipped step drops its update; a step that may not be applied sets *why (TRAIN_NAN). */
static int apply_update(trainer *t, tr_iter *it, tr_action a, train_end *why) {
    if (a == TR_ACT_SKIP) {
        t->skipped++;
        it->loss = it->tok = 0;
        return 0;
    }
    double tlo = tl_now(), to = now_s();
    int rc = t->dopt ? trainer__dopt_norm(t, &it->grad_norm) : trainer__grad_norm(t, &it->grad_norm);
    if (rc) return rc;
    bool fp16 = t->cfg.fp16;
    float inv = opt_grad_scaler_inv(&t->scaler);
    if (fp16) it->grad_norm *= (double)inv; /* the true gradients' norm */
    double loss = it->tok > 0 ? it->loss / it->tok : 0, gnorm = it->grad_norm;
    bool check_nan = t->cfg.check_for_nan_in_loss_and_grad;
    tr_action u = fp16 ? tr_update_action_fp16(t->have_val, check_nan, loss, gnorm)
                       : tr_update_action(t->have_val, check_nan, loss, gnorm);
    if (u == TR_ACT_SKIP) return skip_overflow(t, it, loss);
    if (u != TR_ACT_STEP) {
        t->nan_iters++;
        progress_clear(t);
        if (u == TR_ACT_STOP_NAN_REDUCED)
            co_log(CO_LOG_ERROR, "iteration %lld: NaN/Inf in the reduced gradients; stopping", (long long)it->step);
        else
            co_log(CO_LOG_ERROR, "iteration %lld: %s (lm loss %g, grad norm %g); stopping", (long long)it->step,
                    u == TR_ACT_STOP_NAN_LOSS ? "NaN/Inf in the loss" : "NaN/Inf in the gradients", loss, gnorm);
        *why = TRAIN_NAN;
        return 0;
    }
    t->opt.inv_loss_scale = fp16 ? inv : 0.0f;
    if ((rc = optimizer_step(t, it))) return rc;
    opt_grad_scaler_update(&t->scaler, false);
    inject_after_update(t, it->step);
    t->phase_ms[TR_PH_OPTIMIZER] += 1000 * (now_s() - to);
    trainer__tl(t, TL_OPTIMIZER, -1, -1, tlo);
    return 0;
}

/* The iteration counts from here: the position moves on, the step's statistics taken, its
 * timeline written. Nothing here communicates, so nothing here can be cut off by an abort:
 * an iteration committed is one reported (after_step). */
static void commit_iteration(trainer *t) {
    t->iteration++;
    t->consumed[0] += t->gbs;
    for (int k = 0; k < 3; k++) t->smp_log[k] += t->smp_step[k];
    trainer__moe_step(t);
    trainer__mtp_step(t);
    if (t->tl && tl_flush(t->tl)) {
        co_log(CO_LOG_WARN, "the timeline: %s; not recorded further", co_err_detail());
        tl_close(&t->tl_open_rec);
    }
    t->tl = NULL;
}

/* The log line (every --log-interval) or the progress bar (a terminal, between lines). */
static int report_iteration(trainer *t, const tr_iter *it) {
    const co_config *c = &t->cfg;
    double dt = now_s() - it->t0;
    t->loss_sum += it->loss;
    t->tok_sum += it->tok;
    t->iters_since_log++;
    t->time_since_log += dt;
    if (t->iteration % c->log_interval == 0) {
        int rc = log_line(t, next_lr(t), it->grad_norm);
        if (rc) return rc;
    }
    t->ema_step_s = t->ema_step_s > 0 ? 0.9 * t->ema_step_s + 0.1 * dt : dt;
    bool tty = c->progress && t->log == stdout && isatty(STDOUT_FILENO);
    if (t->iteration % c->log_interval && tty)
        progress_draw(t, it->tok > 0 ? it->loss / it->tok : 0,
                      (double)c->global_batch_size * c->seq_length / t->ema_step_s);
    return 0;
}

/* Phase 4, after the step: commit, report, the replica check, evaluation, the hooks, then the
 * exit rules (*why set and *done true when training ends here). */
static int after_step(trainer *t, tr_iter *it, train_end *why, bool *done) {
    const co_config *c = &t->cfg;
    commit_iteration(t);
    int rc = report_iteration(t, it);
    /* the distributed optimizer's shards are updated; the parameters' all-gather follows the
     * iteration's report (with --overlap-param-gather on a thread, waited for by the next
     * forward), redone by a restart's handover if an abort interrupts it: a peer's death in
     * its update cuts the gather off, not the committed iteration's log line and record */
    if (!rc && t->dopt) rc = trainer__dopt_gather_start(t);
    bool check = t->g.dp && c->check_replicas_interval > 0 && t->iteration % c->check_replicas_interval == 0;
    bool eval = c->eval_iters > 0 && t->iteration % c->eval_interval == 0 && t->has_split[1] &&
                t->iteration < c->train_iters;
    /* (both read the parameters whole and communicate: a gather in flight ends first) */
    if (!rc && (check || eval)) rc = trainer__dopt_sync(t);
    if (!rc && check) rc = check_replicas(t);
    if (!rc && eval) {
        char label[64];
        snprintf(label, sizeof label, "iteration %lld", (long long)t->iteration);
        double vl;
        rc = trainer_evaluate(t, 1, label, &vl);
    }
    if (rc) return rc;
    if ((rc = run_hooks(t, false, TRAIN_DONE)) < 0) return rc;
    *done = true;
    if (it->stop_reason == 1) *why = TRAIN_SIGNAL;
    else if (c->exit_interval > 0 && t->iteration % c->exit_interval == 0) *why = TRAIN_EXIT_INTERVAL;
    else if (it->stop_reason == 2) *why = TRAIN_EXIT_DURATION;
    else *done = false;
    return *done ? trainer__dopt_sync(t) : 0;
}

/* --iterations-to-skip: the batch is consumed, nothing is computed. */
static int skip_iteration(trainer *t, int64_t step) {
    progress_clear(t);
    if (t->log) fprintf(t->log, "cohort: skipping iteration %lld (--iterations-to-skip)\n", (long long)step);
    t->iteration++;
    t->consumed[0] += t->gbs; /* the batch of the iteration skipped (Megatron's) */
    t->skipped++;
    int rc = run_hooks(t, false, TRAIN_DONE);
    return rc < 0 ? rc : 0;
}

/* Before the first step: which splits have samples (the replica's rank 0 built them), the
 * weights as built or loaded noted, and a stop asked for before the first step (a signal
 * during setup, the supervisor's order) agreed on in one vote: then nothing is trained and
 * *why is TRAIN_SIGNAL. */
static int train_prologue(trainer *t, volatile sig_atomic_t *stop, train_end *why) {
    /* (a repair or a peer's state noted it already; an optimizer step keeps it) */
    if (!t->have_written) note_written(t);
    cm_comm *rg = tr_groups_replica(&t->g);
    int rc = rg ? rg->ops->broadcast(rg, t->has_split, sizeof t->has_split, 0, TRAIN_COMM_TIMEOUT_MS) : 0;
    if (rc || t->iteration >= t->cfg.train_iters) return rc;
    double vote = stop && *stop ? 1 : 0;
    cm_comm *g = tr_groups_grad(&t->g);
    if (t->g.dp && (rc = g->ops->allreduce_sum(g, &vote, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS))) return rc;
    if (rg && (rc = rg->ops->allreduce_sum(rg, &vote, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS))) return rc;
    if (vote > 0) *why = TRAIN_SIGNAL;
    return 0;
}

/* A new iteration's state; its phase times cleared, the timeline recording it or not. */
static void begin_iteration(trainer *t, tr_iter *it) {
    *it = (tr_iter){.step = t->iteration + 1, .t0 = now_s(), .check_for = -1, .check_suspect = -1,
                    .check_reports = true};
    memset(t->phase_ms, 0, sizeof t->phase_ms);
    t->save_ordered = false;
    t->tl = co_config_timeline_records(&t->cfg, t->tl_start, it->step) ? t->tl_open_rec : NULL;
}

/* One iteration through its phases; *done when training ends with it (*why says why). */
static int train_iteration(trainer *t, volatile sig_atomic_t *stop, train_end *why, bool *done) {
    tr_iter it;
    begin_iteration(t, &it);
    /* the batch of this iteration: Megatron's calculator at the samples consumed so far */
    int rc = trainer__set_batch(t, co_config_batch_at(&t->cfg, t->consumed[0]));
    if (rc) return rc;
    if (skip_listed(t, it.step)) return skip_iteration(t, it.step);
    tr_action a;
    do {
        if ((rc = attempt_step(t, &it, stop)) || (rc = await_verdict(t, &it, &a))) return rc;
    } while (tr_action_replays(a));
    if (a == TR_ACT_REJECT) {
        *why = TRAIN_REJECTED;
        progress_clear(t);
        *done = true;
        return 0;
    }
    if ((rc = apply_update(t, &it, a, why))) return rc;
    if (*why == TRAIN_NAN) {
        *done = true;
        return 0;
    }
    return after_step(t, &it, why, done);
}

int trainer_train(trainer *t, volatile sig_atomic_t *stop, train_end *why) {
    *why = TRAIN_DONE;
    t->stop = stop;
    int rc = train_prologue(t, stop, why);
    if (rc) return rc;
    if (*why == TRAIN_SIGNAL) { /* (a stop before the first step) */
        rc = run_hooks(t, true, *why);
        return rc < 0 ? rc : 0;
    }
    tl_discard(t->tl_open_rec); /* an iteration an in-process restart abandoned */
    bool done = false;
    while (!done && t->iteration < t->cfg.train_iters)
        if ((rc = train_iteration(t, stop, why, &done))) {
            /* (a gather in flight ends before the caller closes the communicators) */
            trainer__pgather_cancel(t);
            return rc;
        }
    if (*why == TRAIN_NAN || *why == TRAIN_REJECTED) return 0;
    progress_clear(t);
    if ((rc = trainer__dopt_sync(t))) return rc; /* (the last step's gather in flight) */
    rc = run_hooks(t, true, *why);
    return rc < 0 ? rc : 0;
}

/* An evaluation's batches are the full --global-batch-size, ramp-up or not (Megatron's
 * evaluate); the training iteration's batch is restored after it. */
static int evaluate_split(trainer *t, int split, const char *label, double *out_loss);

int trainer_evaluate(trainer *t, int split, const char *label, double *out_loss) {
    int gbs = t->gbs;
    int rc = trainer__set_batch(t, t->cfg.global_batch_size);
    if (!rc) rc = evaluate_split(t, split, label, out_loss);
    int rc2 = trainer__set_batch(t, gbs);
    return rc ? rc : rc2;
}

static int evaluate_split(trainer *t, int split, const char *label, double *out_loss) {
    const co_config *c = &t->cfg;
    *out_loss = NAN;
    if (!t->has_split[split] || c->eval_iters <= 0) return 0;
    int B = c->micro_batch_size, N = B * c->seq_length;
    double loss = 0, tok = 0;
    if (t->g.pp) {
        int rc = trainer__pipeline_evaluate(t, split, &loss, &tok);
        if (rc) return rc;
    }
    for (int64_t it = 0; !t->g.pp && it < c->eval_iters; it++) {
        for (int mb = 0; mb < t->M; mb++) {
            gpt_batch b;
            int64_t gmb = (int64_t)mb * t->topo.dp + t->topo.dp_rank;
            tr_batch *x = &t->mbuf[0];
            int rc = trainer__load_batch(t, split, t->consumed[split] + gmb * B, x, &b);
            if (rc) return rc;
            loss += gpt_forward(t->model, &b, false, 0, t->zeros, NULL);
            if (kb_backend_status(t->be)) return kb_backend_status(t->be);
            N = b.B * b.T; /* this rank's tokens */
            for (int i = 0; i < N; i++) tok += x->mask[i];
        }
        t->consumed[split] += c->global_batch_size;
    }
    if (t->g.dp) {
        double rep[2] = {loss, tok};
        cm_comm *g = tr_groups_grad(&t->g); /* (the context ranks' parts too) */
        int rc = g->ops->allreduce_sum(g, rep, 2, CM_F64, TRAIN_COMM_TIMEOUT_MS);
        if (rc) return rc;
        loss = rep[0];
        tok = rep[1];
    }
    double mean = tok > 0 ? loss / tok : NAN;
    *out_loss = mean;
    char line[512];
    int n = snprintf(line, sizeof line, " validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", label,
                     mean, exp(fmin(20.0, mean)));
    progress_clear(t);
    char dashes[512];
    int len = n + 1 < (int)sizeof dashes ? n + 1 : (int)sizeof dashes - 1;
    memset(dashes, '-', (size_t)len);
    dashes[len] = '\0';
    if (t->log) {
        fprintf(t->log, "%s\n%s\n%s\n", dashes, line, dashes);
        fflush(t->log);
    }
    if (t->metrics) {
        char lb[40], pb[40];
        fprintf(t->metrics,
                "{\"evaluation\":\"%s\",\"iteration\":%lld,\"consumed_samples\":%lld,\"lm_loss\":%s,"
                "\"lm_loss_ppl\":%s}\n",
                split == 1 ? "valid" : "test", (long long)t->iteration, (long long)t->consumed[0],
                json_num(lb, "%.9e", mean), json_num(pb, "%.9e", exp(fmin(20.0, mean))));
        fflush(t->metrics);
    }
    return 0;
}
