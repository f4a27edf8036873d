/* cmd_train.c - `cohort train`: parse Megatron flags, set up the data (or the embedded
 * default corpus), train, evaluate, and (embedded job) show text sampled from the model. */
#include "cli/cli.h"

#include "scheduler/placement.h"
#include "worker/rank.h"
#include "worker/resilience.h"

#include "checkpoint/ckpt.h"
#include "checkpoint/lock.h"
#include "checkpoint/store.h"
#include "worker/ckpt.h"
#include "common/error.h"
#include "common/launch_env.h"
#include "common/log.h"
#include "common/proctitle.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"
#include "observe/tensorboard.h"
#include "train/sample.h"
#include "train/config_check.h"
#include "train/trainer.h"
#include "worker/link.h"
#include "worker/metrics_local.h"
#include "supervisor/supervisor.h"

#include <inttypes.h>
#include <math.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* Signals (docs/resilience.md, "Signals"): the first SIGINT or SIGTERM asks for a clean stop
 * (the current step finishes, --save saves, the run report is written, exit 0); SIGUSR1
 * (and SIGTERM with --requeue-on-sigterm) is the same stop for preemption, exit 75
 * (SV_EXIT_PREEMPTED: the scheduler requeues the job, deploy/slurm); a second
 * one stops at once (the default action of that signal: killed by it, exit 128 + N).
 * g_stop is what the training loop polls (the supervisor's stop order raises it too, from
 * the link thread); g_signal says that a signal did, and which.
 *
 * SIGINT, SIGTERM and SIGUSR1 are blocked in every thread, from main.c's .preinit_array on (before
 * the shared libraries' constructors and before any thread exists, so every thread
 * inherits the mask), and taken by one thread of their own with sigtimedwait. They must
 * never be delivered to a compute thread: oneDNN's JIT sgemm kernels run with the stack
 * pointer inside a heap buffer, and the kernel writes the signal frame (about 12 KB with
 * AMX state) below it, over malloc's chunk headers ("corrupted size vs. prev_size while
 * consolidating", or a hang in malloc: the training runs' sporadic aborts). The supervisor
 * process, which computes nothing, hands them back to handlers for libuv
 * (signals_to_handlers). A signal inherited as ignored (a non-interactive shell's
 * background job) is honoured all the same. */
static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_signal; /* the first signal's number, 0 before any */
static volatile sig_atomic_t g_abort;  /* the supervisor aborted this generation (in-process restart) */
static pthread_t g_sig_thread;
static bool g_sig_thread_on;
static atomic_bool g_sig_quit;

static void stop_signals_set(sigset_t *s) {
    sigemptyset(s);
    sigaddset(s, SIGINT);
    sigaddset(s, SIGTERM);
    sigaddset(s, SIGUSR1); /* a preemption warning (Slurm's --signal=USR1@T): the same stop, exit 75 */
}

/* One signal taken (the thread) or handled (the handler): only async-signal-safe calls. */
static void note_signal(int sig) {
    if (g_signal) {
        /* a second signal: stop now, by that signal's default action */
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, NULL); /* this thread (in a handler: once it returns) */
        raise(sig);
        return;
    }
    g_signal = sig;
    g_stop = 1;
}

static void on_signal(int sig) { note_signal(sig); }

static void *signal_thread(void *arg) {
    (void)arg;
    sigset_t set;
    stop_signals_set(&set);
    while (!atomic_load(&g_sig_quit)) {
        struct timespec ts = {0, 100 * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig > 0) note_signal(sig);
    }
    return NULL;
}

/* The disposition (a handler, so that a signal inherited as ignored is not discarded) and
 * the mask of the calling thread, which every thread created later inherits. */
static void block_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t set;
    stop_signals_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* Called from main.c's .preinit_array for `cohort train`: before any shared library's
 * constructors run (oneDNN's, libgomp's and the CUDA libraries' take 0.1-0.2 s on a loaded
 * machine, during which a signal would otherwise kill the process, or be lost). A signal
 * stays pending until the signal thread takes it. */
void cli_train_early_signals(void) { block_signals(); }

/* First thing in cli_train: the thread that takes the signals. */
static void install_signals(void) {
    block_signals(); /* (again: cli_train called without main's early call) */
    if (g_sig_thread_on) return;
    /* one that came during start-up counts now, not when the thread first runs */
    sigset_t set;
    stop_signals_set(&set);
    struct timespec zero = {0, 0};
    int sig = sigtimedwait(&set, NULL, &zero);
    if (sig > 0) note_signal(sig);
    atomic_store(&g_sig_quit, false);
    if (!pthread_create(&g_sig_thread, NULL, signal_thread, NULL)) {
        g_sig_thread_on = true;
        return;
    }
    /* no thread: handlers in any thread, as a last resort */
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* The supervisor process: no compute thread; libuv's handlers take over (sv_run), and
 * these record what comes before them (sv_options.signalled). Pending ones arrive now. */
static void signals_to_handlers(void) {
    if (g_sig_thread_on) {
        atomic_store(&g_sig_quit, true);
        pthread_join(g_sig_thread, NULL);
        g_sig_thread_on = false;
    }
    sigset_t set;
    stop_signals_set(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* The line every clean stop by signal prints (tests look for "stopped by signal"). */
static void say_stopped_early(FILE *out, const char *when) {
    if (!out) return;
    fprintf(out, "cohort: stopped by signal (%s) %s: nothing trained, nothing to save\n",
            g_signal ? strsignal(g_signal) : "signal", when);
    fflush(out);
}

int cli_tokenizer(const co_config *c, int *vocab, int *eod) {
    if (!strcmp(c->tokenizer_type, "GPT2BPETokenizer") && (c->vocab_file[0] || c->merge_file[0])) {
        /* as Megatron: the vocabulary's size and <|endoftext|> come from --vocab-file */
        tok_tokenizer tk;
        int rc = tok_open(&tk, c->tokenizer_type, 0, c->vocab_file, c->merge_file);
        if (rc) return co_err_set(CO_EINVAL, "--vocab-file/--merge-file: %s", co_err_detail());
        *vocab = (int)tok_vocab_size(&tk);
        *eod = tk.eod;
        tok_close(&tk);
    } else if (!strcmp(c->tokenizer_type, "GPT2BPETokenizer")) {
        /* GPT-2's vocabulary: 50257 entries, <|endoftext|> = 50256 */
        *vocab = 50257;
        *eod = 50256;
    } else if (!strcmp(c->tokenizer_type, "NullTokenizer")) {
        /* Megatron's _NullTokenizer: EOD is vocab_size and the vocabulary has one more entry */
        *vocab = c->vocab_size + 1;
        *eod = c->vocab_size;
    } else if (!strcmp(c->tokenizer_type, "ByteLevelTokenizer")) {
        *vocab = TOK_BYTE_VOCAB;
        *eod = TOK_BYTE_EOD;
    } else if (!strcmp(c->tokenizer_type, "TikTokenizer") ||
               strstr(c->tokenizer_type, "SentencePiece") || !strcmp(c->tokenizer_type, "Llama2Tokenizer")) {
        /* the vocabulary and eod of the model file, as Megatron's build_tokenizer */
        tok_tokenizer tk;
        int rc = tok_open_config(&tk, c);
        if (rc) return rc;
        *vocab = (int)tok_vocab_size(&tk);
        *eod = tk.eod;
        tok_close(&tk);
    } else {
        return co_err_set(CO_EINVAL, "unsupported --tokenizer-type %s", c->tokenizer_type);
    }
    return 0;
}

const char *cli_data_prefix(const co_config *c) {
    if (c->n_data_path == 1) return c->data_path[0];
    if (c->n_data_path == 2) {
        char *end;
        strtod(c->data_path[0], &end);
        if (end != c->data_path[0] && !*end) return c->data_path[1];
    }
    return NULL;
}

/* Defaults of the embedded job, applied to flags the user did not give. */
static void embedded_defaults(co_config *c) {
#define DEF(flag, field, val) if (!co_config_was_set(c, flag)) c->field = (val)
    /* sized for one to two minutes on any 2-core x86-64 machine with AVX2 (docs/benchmarks.md,
     * "The embedded default job"): 240 steps of 32 x 64 bytes learn well below the unigram
     * entropy; a longer context, a wider or a deeper model learns little more in that time */
    DEF("num-layers", num_layers, 3);
    DEF("hidden-size", hidden_size, 192);
    DEF("num-attention-heads", num_attention_heads, 4);
    DEF("seq-length", seq_length, 64);
    DEF("global-batch-size", global_batch_size, 32);
    /* the 32 samples of a step split over the data-parallel ranks (16 per micro batch alone) */
    int world = c->nproc_per_node * c->nnodes;
    int mbs = world > 1 && world <= 32 && 32 % world == 0 ? 32 / world : 16;
    DEF("micro-batch-size", micro_batch_size, mbs > 16 ? 16 : mbs);
    if (!co_config_was_set(c, "train-iters") && !co_config_was_set(c, "train-samples")) c->train_iters = 240;
    DEF("lr", lr, 2e-3);
    DEF("min-lr", min_lr, 1e-4);
    DEF("lr-warmup-iters", lr_warmup_iters, c->train_iters > 0 ? c->train_iters / 10 : 0);
    DEF("hidden-dropout", hidden_dropout, 0.0);
    DEF("attention-dropout", attention_dropout, 0.0);
    DEF("log-interval", log_interval, 25);
    DEF("eval-interval", eval_interval, 80);
    DEF("eval-iters", eval_iters, 4);
    DEF("weight-decay", weight_decay, 0.1);
    DEF("make-vocab-size-divisible-by", make_vocab_size_divisible_by, 64);
#undef DEF
    if (!co_config_was_set(c, "lr-decay-style")) strcpy(c->lr_decay_style, "cosine");
    if (!co_config_was_set(c, "split")) strcpy(c->split, "90,5,5");
    if (!co_config_was_set(c, "tokenizer-type")) strcpy(c->tokenizer_type, "ByteLevelTokenizer");
}

static void default_workdir(co_config *c) {
    if (c->workdir[0]) return;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(c->workdir, sizeof c->workdir, "%s/cohort", xdg);
    else if (home && *home) snprintf(c->workdir, sizeof c->workdir, "%s/.cache/cohort", home);
    else snprintf(c->workdir, sizeof c->workdir, "cohort-work");
}

static void print_samples(trainer *t, const co_config *c, int lines, FILE *out) {
    static const char *prompts[] = {"The ", "You may ", "Permission is ", "This License ", "THE SOFTWARE ",
                                    "Copyright ", "If you ", "Each "};
    gpt_model *m = trainer_model(t);
    int max_len = 160;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)max_len);
    if (!tok) return;
    fprintf(out, "\nsamples from the trained model (seed %lld, temperature 0.7):\n", (long long)c->seed);
    for (int i = 0; i < lines; i++) {
        const char *p = prompts[i % (int)(sizeof prompts / sizeof prompts[0])];
        tok_tokenizer bt;
        tok_byte_init(&bt);
        int n = (int)tok_encode(&bt, p, strlen(p), tok, (size_t)max_len);
        n = sample_extend(m, tok, n, max_len, 100, c->seq_length, 0.7f, '\n', (uint64_t)c->seed + (uint64_t)i);
        char text[256];
        int64_t dl = tok_decode(&bt, tok, (size_t)n, text, sizeof text);
        size_t len = dl < 0 ? 0 : (size_t)dl < sizeof text - 1 ? (size_t)dl : sizeof text - 1;
        text[len] = '\0';
        for (size_t k = 0; k < len; k++)
            if (text[k] == '\n' || (unsigned char)text[k] < 0x20) text[k] = ' ';
        fprintf(out, "  > %s\n", text);
    }
    free(tok);
}

/* This node's address as the other nodes reach it, as an IPv4 address where the name
 * resolves: the workers bind their data ports on it, and ZeroMQ binds no host names (a
 * --master-addr taken from Slurm's node list or a Kubernetes Service is one). */
static void numeric_address(const char *name, char *out, size_t n) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    snprintf(out, n, "%s", name);
    if (getaddrinfo(name, NULL, &hints, &res) == 0 && res) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)res->ai_addr)->sin_addr, out, (socklen_t)n);
        freeaddrinfo(res);
    }
}

static void node_address(const co_config *c, char *out, size_t n) {
    if (c->node_addr[0]) {
        numeric_address(c->node_addr, out, n);
        return;
    }
    if (c->node_rank == 0 || c->nnodes == 1) {
        numeric_address(c->master_addr, out, n);
        return;
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    numeric_address(host, out, n);
}

/* The embedded job's epilogue: how far below letter frequencies it learned, and samples. */
typedef struct embedded_end {
    const corpus_info *info;
    const co_config *c;
    FILE *out;
} embedded_end;

static void embedded_done(void *ctx, trainer *t, double vl) {
    embedded_end *e = ctx;
    if (!e->info || !e->out) return;
    fprintf(e->out, "\ncohort: validation loss %.3f nats/token against the corpus's unigram entropy %.3f: %s\n", vl,
            e->info->unigram_entropy,
            vl < e->info->unigram_entropy * 0.75 ? "the model learned structure beyond letter frequencies"
                                                 : "not much below letter frequencies yet (train longer)");
    if (e->c->sample_lines > 0 && (e->c->tensor_model_parallel_size > 1 || e->c->pipeline_model_parallel_size > 1 ||
                                   e->c->context_parallel_size > 1))
        fprintf(e->out, "cohort: no samples: sampling a tensor-, pipeline- or context-parallel model is not built yet\n");
    else if (e->c->sample_lines > 0) print_samples(t, e->c, e->c->sample_lines, e->out);
}

/* `cohort train --help`: the flags with their defaults, the exit statuses and signals. */
static void print_help(void) {
    printf("usage: cohort train [flags]\n\n"
           "Pretrains a GPT model. Flags are Megatron-LM's (pretrain_gpt.py) with its defaults;\n"
           "--flag=value and --flag value both work. With neither --data-path nor --mock-data,\n"
           "runs the embedded default job: a byte-level model trained for under two minutes on\n"
           "2 cores on the licence texts in /usr/share/common-licenses, then sampled.\n");
    co_config_help(stdout);
    printf("\nexit status: 0 done or stopped cleanly (signal, exit interval or duration), 1 runtime\n"
           "failure, 2 usage or configuration error (with --nnodes > 1 also: a node whose flags differ\n"
           "from the others'), 3 a NaN/Inf loss or gradient that the rerun state\n"
           "machine found reproducible (a data or model problem); with --nproc-per-node > 1 or\n"
           "--nnodes > 1 also 4 a worker failed and could not be replaced in process, 5 the rendezvous\n"
           "did not complete in time, 6 a worker went silent with --no-inprocess-restart; with\n"
           "--nnodes > 1 also 7 a node was lost (its agent silent for --inprocess-heartbeat-timeout),\n"
           "8 (a node agent) the supervisor's node was lost.\n"
           "SIGINT/SIGTERM (Ctrl-C, a scheduler; to the job, its process group or one worker): the\n"
           "current step finishes, --save saves, exit 0; a second one stops at once (128 + signal).\n"
           "SIGUSR1 (a preemption warning; SIGTERM too with --requeue-on-sigterm): the same stop, exit\n"
           "75, for a scheduler to requeue the job (deploy/slurm, docs/deploy.md).\n"
           "Faults, restarts and the run report: docs/resilience.md; inject into a running job with\n"
           "`cohort inject`.\n");
}

/* --device: auto = cuda where this build and machine have a GPU for each of the node's
 * `need` workers, else cpu (said once; the supervisor and every worker decide alike); then
 * --bf16 where the device runs it. 0, or CLI_USAGE with the reason logged. */
static int choose_device(co_config *c, bool worker, int need) {
    char why[512] = "";
    int ngpu = strcmp(c->device, "cpu") != 0 ? kb_cuda_available(why, sizeof why) : 0;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (ngpu > 0 && need > ngpu)
        snprintf(why, sizeof why, "each worker uses the GPU of its local rank, so %d workers on a node need %d GPUs, "
                 "but this process sees %d (CUDA_VISIBLE_DEVICES%s%s)", need, need, ngpu, vis ? "=" : " is not set",
                 vis ? vis : "");
    bool gpu = ngpu > 0 && need <= ngpu;
    if (!strcmp(c->device, "cuda") && !gpu) {
        co_log(CO_LOG_ERROR, "invalid configuration:\n  --device cuda: %s", why);
        return CLI_USAGE;
    }
    if (!strcmp(c->device, "auto")) {
        snprintf(c->device, sizeof c->device, "%s", gpu ? "cuda" : "cpu");
        if (!gpu && !worker) fprintf(stderr, "cohort: %s: training on the CPU (--device cpu says so quietly)\n", why);
    }
    /* --bf16 on the CPU: only where the matrix products have bf16 instructions (AVX512-BF16,
     * AMX); elsewhere it would be slower than fp32, so it is refused (kernels/cpu/isa.c) */
    if (c->bf16 && !strcmp(c->device, "cpu")) {
        char bf16_why[400];
        if (!kb_cpu_bf16_check(bf16_why, sizeof bf16_why)) {
            co_log(CO_LOG_ERROR, "invalid configuration:\n  %s", bf16_why);
            return CLI_USAGE;
        }
    }
    return 0;
}

/* The rerun state machine's state in the checkpoint the workers will load, as JSON (the
 * caller frees it), or NULL. */
static char *checkpoint_rerun_state(const co_config *c) {
    char *rerun_state = NULL;
    if (!c->load[0]) return NULL;
    int64_t it = c->ckpt_step;
    if (it < 0 && ck_read_tracker(c->load, &it)) it = -1;
    ck_manifest *m = NULL;
    char dir[1100];
    if (it >= 0) ck_iter_dir(dir, sizeof dir, c->load, it);
    if (it >= 0 && !ck_read_manifest(dir, &m)) {
        json_t *rs = json_object_get(m->doc, "rerun_state_machine");
        if (json_is_object(rs) && json_object_get(rs, "spiky_max")) rerun_state = json_dumps(rs, JSON_COMPACT);
        ck_manifest_free(&m);
    }
    return rerun_state;
}

/* The supervisor's view of the parallel layout: which ranks report one replica's results,
 * the groups' sizes and order. dp: the data-parallel size. */
static void supervisor_layout(sv_options *so, const co_config *c, int dp) {
    so->tp = c->tensor_model_parallel_size;
    /* a replica's ranks (tensor x pipeline) report its results (the stand-in replicates);
     * in Megatron's order the data coordinate comes after tp (tp-cp-dp-pp) or after tp
     * and pp (tp-cp-pp-dp) */
    /* with expert parallelism an expert group is one replica (train/trainer_ep.c): its
     * ranks' results depend on each other's tokens */
    int epn = c->num_experts > 0 && c->expert_model_parallel_size > 1 ? c->expert_model_parallel_size : 1;
    int etpn = c->expert_tensor_parallel_size > 0 ? c->expert_tensor_parallel_size : c->tensor_model_parallel_size;
    /* data-parallel ranks per expert group (whole tensor x context groups: Megatron's expert
     * layout folds the context ranks into the expert groups) */
    int per = epn > 1 ? epn * etpn / (c->tensor_model_parallel_size * c->context_parallel_size) : 1;
    so->replica_stride = c->standin_model_parallel ? 1
                         : c->tensor_model_parallel_size * c->context_parallel_size * per *
                               (c->use_tp_pp_dp_mapping ? c->pipeline_model_parallel_size : 1);
    so->replicas = c->standin_model_parallel ? 0 : dp / per;
    so->pp = c->pipeline_model_parallel_size;
    so->cp = c->context_parallel_size;
    so->ep = c->expert_model_parallel_size;
    so->etp = c->expert_tensor_parallel_size;
    so->tp_pp_dp = c->use_tp_pp_dp_mapping;
    so->emb_stages = pp_embedding_stages_of_config(c);
#ifdef COHORT_HAVE_NCCL
    so->nccl = !strcmp(c->device, "cuda"); /* the workers' groups over NCCL on their GPUs */
#endif
}

/* In-process restart: its switches, limits and timeouts (in milliseconds). */
static void supervisor_restart(sv_options *so, const co_config *c) {
    so->restart = c->inprocess_restart;
    so->active_world = c->inprocess_active_world_size > 0 ? c->inprocess_active_world_size : 0;
    so->shift_ranks = !strcmp(c->inprocess_rank_assignment, "shift-ranks");
    so->node_granularity = !strcmp(c->inprocess_granularity, "node");
    so->dopt_holders = c->use_distributed_optimizer ? (c->dist_opt_redundancy ? 2 : 1) : 0;
    so->quarantine_after = c->quarantine_after;
    so->quarantine_window = c->quarantine_window;
    so->restart_limit = c->inprocess_restart_limit;
    so->restart_window_ms = (int)(c->inprocess_restart_window * 1000);
    so->soft_timeout_ms = (int)(c->inprocess_soft_timeout * 1000);
    so->soft_timeout_set = co_config_was_set(c, "inprocess-soft-timeout");
    so->hard_timeout_ms = (int)(c->inprocess_hard_timeout * 1000);
    so->barrier_timeout_ms = (int)(c->inprocess_barrier_timeout * 1000);
    so->heartbeat_interval_ms = (int)(c->inprocess_heartbeat_interval * 1000);
    so->heartbeat_timeout_ms = (int)(c->inprocess_heartbeat_timeout * 1000);
    so->node_replacement_ms = (int)(c->node_replacement_timeout * 1000);
    so->elastic = c->elastic;
    so->elastic_min_replicas = c->elastic_min_replicas;
}

/* With several workers this process is the supervisor (or a node agent): it starts them
 * from this binary with the same flags and runs the job (supervisor/). corpus: the embedded
 * job's corpus, built once for every worker (NULL: data flags given). The exit status. */
static int run_supervisor(const co_config *c, int argc, char **argv, int dp, int world, const char *corpus,
                          const corpus_info *info, uint64_t job_id) {
    char ready[1100], stats[200];
    char *env[2] = {ready, stats};
    snprintf(ready, sizeof ready, "COHORT_CORPUS_READY=%s", corpus ? corpus : "");
    snprintf(stats, sizeof stats, "COHORT_CORPUS_STATS=%lld %lld %.6f", (long long)info->documents,
             (long long)info->tokens, info->unigram_entropy);
    if (c->nnodes > 1 && c->node_rank > 0)
        printf("cohort: node agent %d starting %d worker processes for the supervisor at %s:%d\n", c->node_rank,
               c->nproc_per_node, c->master_addr, c->master_port);
    else
        printf("cohort: supervisor starting %d worker processes (data-parallel size %d)\n", c->nproc_per_node, dp);
    fflush(stdout);
    char node_addr[256];
    node_address(c, node_addr, sizeof node_addr);
    sv_options so = {.nproc = c->nproc_per_node, .nnodes = c->nnodes, .node_rank = c->node_rank,
                     .master_addr = c->master_addr, .master_port = c->master_port, .node_addr = node_addr,
                     .secret_path = c->job_secret, .exe = "/proc/self/exe", .worker_args = argv,
                     .nworker_args = argc, .extra_env = env, .nextra_env = corpus ? 2 : 0,
                     .rendezvous_timeout_ms = (int)(c->rendezvous_timeout * 1000),
                     .metrics_file = c->metrics_file, .save_dir = c->save, .most_recent_k = c->most_recent_k,
                     .keep_every = c->keep_every, .save_space_margin = c->save_space_margin,
                     .metrics_port = c->metrics_port, .save_interval = c->save_interval, .expected_mtbf = c->expected_mtbf,
                     .train_iters = c->train_iters};
    ob_tb_options tbo;
    ob_tb_options_from_config(&tbo, c, world);
    if (c->tensorboard_dir[0] && !(c->nnodes > 1 && c->node_rank > 0)) so.tensorboard = &tbo;
    wk_rr_options(c, world, &so.rerun);
    so.tracker_file = c->result_rejected_tracker_filename;
    char report[1100];
    snprintf(report, sizeof report, "%s", c->run_report);
    if (!report[0] && c->save[0]) snprintf(report, sizeof report, "%s/run_report.json", c->save);
    so.report_file = report;
    so.straggler_threshold = c->straggler_threshold;
    so.straggler_evict_after = c->straggler_evict_after;
    fi_schedule inj;
    if (wk_inject_parse(c, world, &inj)) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return CLI_USAGE;
    }
    so.inject = &inj;
    fi_rand fir;
    if (fi_rand_wanted(c->fault_injector_ranks, c->fault_injector_num_ranks)) {
        if (fi_rand_init(&fir, c->fault_injector_ranks, c->fault_injector_num_ranks, c->fault_injector_fault_types,
                         c->fault_injector_fault_probabilities, c->fault_injector_fault_delay,
                         c->fault_injector_mtti_seconds, c->fault_injector_offset_seconds,
                         (uint64_t)c->fault_injector_seed, world)) {
            co_log(CO_LOG_ERROR, "%s", co_err_detail());
            fi_schedule_free(&inj);
            return CLI_USAGE;
        }
        so.fault_injector = &fir;
    }
    /* the state machine's state comes back from the checkpoint the workers load */
    char *rerun_state = checkpoint_rerun_state(c);
    so.rerun_state = rerun_state;
    supervisor_layout(&so, c, dp);
    supervisor_restart(&so, c);
    so.job_id = job_id;
    so.signalled = &g_signal; /* one that came before the supervisor's own handlers took over */
    so.requeue_on_sigterm = c->requeue_on_sigterm;
    signals_to_handlers(); /* the supervisor process computes nothing: libuv's handlers */
    int status = sv_run(&so);
    free(rerun_state);
    fi_schedule_free(&inj);
    return status;
}

/* The data-parallel size dp and the ranks that train (world): a worker is told by its
 * supervisor (asg); otherwise the processes over tensor x context x pipeline, warm spares
 * not counted. A worker shares its node's cores with the others. 0, or CLI_USAGE (logged)
 * for a world the model-parallel sizes do not divide. */
static int job_sizes(co_config *c, const sv_assignment *asg, int *dp_out, int *world_out) {
    bool worker = asg != NULL;
    int dp = worker ? asg->dp : c->nproc_per_node * c->nnodes;
    if (!worker && c->inprocess_active_world_size > 0 && c->inprocess_active_world_size < dp)
        dp = c->inprocess_active_world_size; /* the others are warm spares */
    *world_out = worker ? asg->world : dp; /* the ranks that train */
    /* the data-parallel size: the world over tensor x context x pipeline (a worker is told) */
    long mp = (long)c->tensor_model_parallel_size * c->context_parallel_size * c->pipeline_model_parallel_size;
    if (!co_config_model_parallel_sizes_ok(c)) mp = 1; /* the checks refuse them with their ranges */
    if (!worker && mp > 1 && dp % mp == 0) dp = (int)(dp / mp);
    else if (!worker && mp > 1) {
        /* (sizes that are not built are refused by the checks with their own line) */
        co_log(CO_LOG_ERROR, "invalid configuration:\n  the world of %d ranks is not a multiple of tensor x context "
                             "x pipeline = %ld", dp, mp);
        return CLI_USAGE;
    }
    *dp_out = dp;
    if (worker && !co_config_was_set(c, "threads")) {
        /* the node's cores are shared by its workers */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int active = c->inprocess_active_world_size > 0 && c->inprocess_active_world_size < c->nproc_per_node
                         ? c->inprocess_active_world_size : c->nproc_per_node; /* spares sleep */
        c->threads = (int)(cores / active > 0 ? cores / active : 1);
    }
    return 0;
}

/* The embedded default job's corpus: built (or, in a worker, the one its supervisor built)
 * at prefix, its metrics file under --workdir; what it is said on `out` (NULL: nothing).
 * 0, or the error (logged). */
static int embedded_corpus(co_config *c, bool worker, FILE *out, char *prefix, size_t n, corpus_info *info) {
    default_workdir(c);
    const char *ready = getenv("COHORT_CORPUS_READY");
    if (worker && ready) {
        /* the supervisor built it once for every worker */
        snprintf(prefix, n, "%s", ready);
        const char *st = getenv("COHORT_CORPUS_STATS");
        if (st) sscanf(st, "%lld %lld %lf", (long long *)&info->documents, (long long *)&info->tokens, &info->unigram_entropy);
        snprintf(info->source_dir, sizeof info->source_dir, "%s", CORPUS_DEFAULT_DIR);
    } else {
        int rc = corpus_build_default(c->workdir, prefix, n, info);
        if (rc) {
            co_log(CO_LOG_ERROR, "building the embedded corpus failed: %s", co_err_detail());
            return rc;
        }
    }
    if (!c->metrics_file[0]) {
        /* each embedded run starts its own metrics file */
        if (snprintf(c->metrics_file, sizeof c->metrics_file, "%s/metrics.jsonl", c->workdir) >=
            (int)sizeof c->metrics_file)
            c->metrics_file[0] = '\0'; /* workdir path too long: no metrics file */
        else if (!worker)
            unlink(c->metrics_file);
    }
    if (out) {
        fprintf(out,
                "cohort: no --data-path given: running the embedded default job\n"
                "  corpus: %s (%lld documents, %lld tokens, unigram entropy %.3f nats/token)\n"
                "  written as Megatron .bin/.idx at %s\n",
                info->source_dir, (long long)info->documents, (long long)info->tokens, info->unigram_entropy, prefix);
        fprintf(out, "  metrics: %s\n", c->metrics_file);
    }
    return 0;
}

/* The single process's metrics stream with --tensorboard-dir: the records pass on to the
 * metrics file (or, served, to --metrics-port's stream prom_metrics, which writes that file) and to
 * the event file (observe/tensorboard.h). NULL (logged) when it cannot be made. */
static FILE *tensorboard_stream(const co_config *c, int world, bool served, FILE *prom_metrics) {
    ob_tb_options tbo;
    ob_tb_options_from_config(&tbo, c, world);
    ob_tb *tb = NULL;
    FILE *mf = served ? prom_metrics : NULL, *tee = NULL;
    if (ob_tb_open(&tb, &tbo)) {
        co_log(CO_LOG_ERROR, "--tensorboard-dir: %s", co_err_detail());
    } else if (!served && c->metrics_file[0] && !(mf = fopen(c->metrics_file, "a"))) {
        co_log(CO_LOG_ERROR, "cannot open --metrics-file %s", c->metrics_file);
    } else if (!(tee = ob_tee_open(mf, tb))) {
        co_log(CO_LOG_ERROR, "--tensorboard-dir: cannot make the metrics stream");
    }
    if (!tee) {
        if (mf && !served) fclose(mf);
        ob_tb_close(&tb);
    }
    return tee;
}

/* Locks --save for this job (a new job id) after checking the directory takes files. 0, or
 * the error (logged). */
static int lock_save_dir(const co_config *c, ck_lock **lock, uint64_t *job_id) {
    if (getrandom(job_id, sizeof *job_id, 0) != (ssize_t)sizeof *job_id)
        *job_id = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull;
    *job_id |= 1;
    char job[32], note[1400];
    snprintf(job, sizeof job, "%016" PRIx64, *job_id);
    int rc = ck_savedir_lock(lock, c->save, job, note, sizeof note);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return rc;
    }
    if (note[0]) fprintf(stderr, "cohort: %s\n", note);
    return 0;
}

/* "cohort train: invalid configuration:" and the problems, one indented line each. */
static void say_invalid(const co_problems *P) {
    char text[sizeof P->text + 512];
    size_t len = 0;
    for (const char *line = P->text; *line && len + 1 < sizeof text;) {
        size_t n = strcspn(line, "\n");
        if (n) {
            int w = snprintf(text + len, sizeof text - len, "\n  %.*s", (int)n, line);
            if (w > 0) len += (size_t)w < sizeof text - len ? (size_t)w : sizeof text - len - 1;
        }
        line += n + (line[n] == '\n');
    }
    text[len] = '\0';
    co_log(CO_LOG_ERROR, "invalid configuration:%s", text);
}

/* The configuration: Megatron's defaults, the flags, the node's place from a launcher's
 * environment (Slurm's srun, a Kubernetes Indexed Job, torchrun-style variables) where the
 * flags do not give it (a worker reads the same environment, inherited from its
 * supervisor), the embedded job's defaults when no data flag is given (*embedded), and
 * with --load the checkpoint's model flags (--use-checkpoint-args) and seed. 0, or
 * CO_EINVAL (logged). */
static int read_config(co_config *c, int argc, char **argv, const cli_train_opts *opts, bool *embedded) {
    co_config_defaults(c);
    c->standin_model_parallel = opts && opts->standin_model_parallel;
    int rc = co_config_parse(c, argc, argv);
    char env_note[600] = "";
    if (!rc) rc = co_launch_env_apply(c, NULL, env_note, sizeof env_note);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return rc;
    }
    if (env_note[0] && !sv_link_wanted()) printf("cohort: from the environment: %s\n", env_note);
    *embedded = c->n_data_path == 0 && !c->mock_data && !c->n_train_data_path; /* no data flags at all */
    if (*embedded) embedded_defaults(c);
    wk_ckpt_prepare(c, sv_link_wanted() ? NULL : stdout);
    return 0;
}

/* Every check of the configuration for dp data-parallel replicas (train/config_check.h),
 * then the tokenizer's vocabulary size and end-of-document id. 0, or CO_EINVAL with every
 * problem logged under "invalid configuration:". */
static int check_config(co_config *c, int dp, int *vocab, int *eod) {
    co_problems problems;
    int rc = trainer_config_check(c, dp, &problems);
    if (!rc && (rc = cli_tokenizer(c, vocab, eod))) co_problem(&problems, "%s", co_err_detail());
    if (rc) say_invalid(&problems);
    return rc;
}

int cli_train(int argc, char **argv) { return cli_train_with(argc, argv, NULL); }

int cli_train_with(int argc, char **argv, const cli_train_opts *opts) {
    install_signals(); /* before anything else: a signal during setup is a stop, never lost or fatal */
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            return CLI_OK;
        }
    co_log_set_prefix("cohort train"); /* a supervisor or a rank names itself later */
    co_config c;
    bool embedded;
    int rc = read_config(&c, argc, argv, opts, &embedded);
    if (rc) {
        co_config_free(&c);
        return CLI_USAGE;
    }

    /* A worker learns its place from the supervisor before validating (the data-parallel
     * size decides what a valid global batch is). */
    sv_link *link = NULL;
    sv_assignment asg;
    memset(&asg, 0, sizeof asg);
    bool worker = sv_link_wanted();
    if (worker) {
        rc = wk_join(&c, &g_stop, &g_signal, &link, &asg);
        if (rc == CO_EABORTED) {
            /* the supervisor stopped the job before it began (a signal), or a warm spare the job
             * did not need: a clean end */
            co_config_free(&c);
            return CLI_OK;
        }
        if (rc) {
            fprintf(stderr, "cohort worker: %s (%s)\n", co_err_detail(), co_strerror(rc));
            co_config_free(&c);
            return CLI_FAILURE;
        }
        co_proctitle_role(CO_PROC_WORKER, asg.rank, c.node_rank, asg.job_id); /* (ps showed "exe") */
    }
    int dp, world;
    if (job_sizes(&c, worker ? &asg : NULL, &dp, &world)) {
        co_config_free(&c);
        return CLI_USAGE;
    }
    int vocab = 0, eod = 0;
    if (check_config(&c, dp, &vocab, &eod)) {
        sv_link_close(&link);
        sv_assignment_free(&asg);
        co_config_free(&c);
        return CLI_USAGE;
    }
    /* --device: auto = cuda where this build and machine have a GPU for each worker of the
     * node, else cpu (said once; the supervisor and every worker decide alike). A worker
     * uses the GPU of its local rank (docs/gpu.md). */
    const char *lr = worker ? getenv("COHORT_LOCAL_RANK") : NULL;
    int gpu_index = lr ? atoi(lr) : 0, need = worker || world > 1 ? c.nproc_per_node : 1;
    if (choose_device(&c, worker, need)) {
        sv_link_close(&link);
        sv_assignment_free(&asg);
        co_config_free(&c);
        return CLI_USAGE;
    }
    bool supervisor = !worker && world > 1;
    if (g_stop && !worker) {
        /* a signal during parsing and validation: stop before any work */
        say_stopped_early(stdout, "during setup");
        sv_link_close(&link);
        sv_assignment_free(&asg);
        int st = sv_preempting_signal(g_signal, c.requeue_on_sigterm) ? SV_EXIT_PREEMPTED : CLI_OK;
        co_config_free(&c);
        return st;
    }

    /* Only the logging rank (the last, as in Megatron) prints; a worker's lines travel to
     * the supervisor, which prints them. */
    bool printer = !worker || asg.rank == asg.world - 1;
    FILE *out = !worker ? stdout : printer ? sv_link_log_stream(link) : NULL;
    if (printer && !out) out = stdout;

    trainer_data data = {.prefix = cli_data_prefix(&c), .vocab_size = vocab, .eod = eod,
                         .metrics = worker && printer ? sv_link_metrics_stream(link) : NULL, .cuda_device = gpu_index};
    corpus_info info;
    memset(&info, 0, sizeof info);
    char prefix[1024];
    if (embedded && embedded_corpus(&c, worker, out && !supervisor ? out : NULL, prefix, sizeof prefix, &info)) {
        sv_link_close(&link);
        sv_assignment_free(&asg);
        co_config_free(&c);
        return CLI_FAILURE;
    }
    if (embedded) data.prefix = prefix;

    if (g_stop && !worker) {
        /* a signal while the corpus was built: stop before training */
        say_stopped_early(stdout, "during setup");
        int st = sv_preempting_signal(g_signal, c.requeue_on_sigterm) ? SV_EXIT_PREEMPTED : CLI_OK;
        co_config_free(&c);
        return st;
    }
    /* one job per save directory: the single process or the supervisor locks --save (its
     * workers share the lock), after checking the directory takes files (checkpoint/lock.h) */
    ck_lock *save_lock = NULL;
    uint64_t job_id = 0;
    if (!worker && c.save[0] && !(c.nnodes > 1 && c.node_rank > 0) && lock_save_dir(&c, &save_lock, &job_id)) {
        sv_link_close(&link);
        sv_assignment_free(&asg);
        co_config_free(&c);
        return CLI_USAGE;
    }

    if (supervisor) {
        int status = run_supervisor(&c, argc, argv, dp, world, embedded ? prefix : NULL, &info, job_id);
        ck_savedir_unlock(&save_lock);
        co_config_free(&c);
        return status;
    }
    /* a single process serves --metrics-port itself (the supervisor does for workers) */
    svl *prom = NULL;
    if (!worker && c.metrics_port > 0) {
        rc = svl_start(&prom, c.metrics_port, c.metrics_file, c.save_interval, c.train_iters, c.save, &data.metrics);
        if (rc) {
            co_log(CO_LOG_ERROR, "%s", co_err_detail());
            ck_savedir_unlock(&save_lock);
            sv_link_close(&link);
            sv_assignment_free(&asg);
            co_config_free(&c);
            return CLI_FAILURE;
        }
        fprintf(stderr, "cohort: Prometheus metrics at http://127.0.0.1:%d/metrics\n", c.metrics_port);
    }
    /* the single process writes the TensorBoard events (a worker never does: its supervisor
     * writes the last rank's) */
    FILE *tb_metrics = NULL;
    if (!worker && c.tensorboard_dir[0] && !(tb_metrics = tensorboard_stream(&c, world, prom != NULL, data.metrics))) {
        svl_stop(&prom);
        ck_savedir_unlock(&save_lock);
        sv_link_close(&link);
        sv_assignment_free(&asg);
        co_config_free(&c);
        return CLI_FAILURE;
    }
    if (tb_metrics) data.metrics = tb_metrics;
    embedded_end ee = {.info = embedded ? &info : NULL, .c = &c, .out = out};
    wk_options wo = {.config = &c, .data = &data, .out = out, .link = link, .asg = &asg, .stop = &g_stop,
                     .abort_flag = &g_abort, .on_done = embedded_done, .ctx = &ee};
    int status = wk_run(&wo);
    if (tb_metrics) fclose(tb_metrics); /* the metrics file, and the events: flushed, fsync'ed */
    svl_stop(&prom);
    if (!worker && status == CLI_OK && g_signal && sv_preempting_signal(g_signal, c.requeue_on_sigterm)) {
        /* one process alone: a clean stop for preemption (a worker exits 0; its supervisor says it) */
        fprintf(stderr, "cohort: stopped for preemption (%s): exit %d, requeue the job to resume from --load\n",
                strsignal(g_signal), SV_EXIT_PREEMPTED);
        status = SV_EXIT_PREEMPTED;
    }
    ck_savedir_unlock(&save_lock);
    sv_link_close(&link);
    sv_assignment_free(&asg);
    co_config_free(&c);
    return status;
}
