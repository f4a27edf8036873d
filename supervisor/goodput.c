/* goodput.c - the job's goodput accounting (see goodput.h): pure arithmetic over the events
 * the supervisor feeds it, no clock and no I/O of its own. */
#include "supervisor/goodput.h"

#include <stdlib.h>
#include <string.h>

static const char *const cause_names[GP_NCAUSES] = {
    "startup", "detection", "restart", "state_transfer", "replay", "recompute", "checkpoint_save", "straggler",
    "shrunk_capacity",
};

const char *gp_cause_name(gp_cause c) { return c >= 0 && c < GP_NCAUSES ? cause_names[c] : "?"; }

void gp_init(gp *g, double t0) {
    memset(g, 0, sizeof *g);
    g->t0 = t0;
    g->last = -1;
    g->high_water = -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the window's clean step times (0: none yet). */
static double median(const gp *g) {
    int n = g->nwin < GP_WINDOW ? g->nwin : GP_WINDOW;
    if (n == 0) return 0;
    double w[GP_WINDOW];
    memcpy(w, g->win, sizeof w[0] * (size_t)n);
    qsort(w, (size_t)n, sizeof w[0], cmp_double);
    return n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

void gp_step(gp *g, double now, int64_t it, double rejected) {
    if (g->in_restart) gp_restart_done(g, now);
    g->steps++;
    if (!g->started) { /* everything up to the first step, the step included, is startup */
        g->started = true;
        g->lost[GP_STARTUP] += now > g->t0 ? now - g->t0 : 0;
        g->last = now;
        g->high_water = it;
        g->save_pending = 0;
        return;
    }
    double interval = now > g->last ? now - g->last : 0;
    /* the blocking save made after the previous step is counted already (gp_save) */
    double take = g->save_pending < interval ? g->save_pending : interval;
    interval -= take;
    g->save_pending -= take;
    /* the rejected attempts: from the previous step to the verdict that replays this one */
    bool replayed = rejected >= 0;
    double rep = replayed && rejected > g->last ? rejected - g->last : 0;
    if (rep > interval) rep = interval;
    g->lost[GP_REPLAY] += rep;
    interval -= rep;
    double med = median(g);
    double base = med > 0 && med < interval ? med : interval, excess = interval - base;
    if (it <= g->high_water) {
        g->lost[GP_RECOMPUTE] += base;
        g->recomputed_steps++;
    } else {
        /* --elastic: a shrunk world's step is productive at its share of the full world's
         * capacity, the rest is capacity lost */
        double cap = g->capacity > 0 && g->capacity < 1 ? g->capacity : 1;
        g->productive += base * cap;
        g->lost[GP_SHRUNK_CAPACITY] += base * (1 - cap);
    }
    g->lost[g->after_restart ? GP_STATE_TRANSFER : GP_STRAGGLER] += excess;
    if (!g->after_restart && !replayed) g->win[g->nwin++ % GP_WINDOW] = interval;
    if (g->nwin >= 2 * GP_WINDOW) g->nwin -= GP_WINDOW; /* (the ring's index, kept small) */
    g->after_restart = false;
    g->last = now;
    if (it > g->high_water) g->high_water = it;
}

void gp_restart_begin(gp *g, double now, double detect_s) {
    if (g->in_restart) return; /* a second fault within the same restart: its time is the restart's */
    double base = g->started ? g->last : g->t0, span = now > base ? now - base : 0;
    double det = detect_s > 0 ? (detect_s < span ? detect_s : span) : 0;
    g->lost[GP_DETECTION] += det;
    /* the rest: the aborted step's work before the fault (a handover that failed again after a
     * restart, or the setup before the first step) */
    g->lost[!g->started ? GP_STARTUP : g->after_restart ? GP_STATE_TRANSFER : GP_RECOMPUTE] += span - det;
    g->in_restart = true;
    g->restart_t0 = now;
    g->save_pending = 0;
}

void gp_restart_done(gp *g, double now) {
    if (!g->in_restart) return;
    g->lost[GP_RESTART] += now > g->restart_t0 ? now - g->restart_t0 : 0;
    g->in_restart = false;
    g->after_restart = true;
    g->last = now;
    if (!g->started) { /* the next step's interval is measured from here, not from the job's start */
        g->started = true;
        g->high_water = -1;
    }
}

void gp_save(gp *g, double seconds) {
    if (!(seconds > 0)) return;
    g->lost[GP_CHECKPOINT_SAVE] += seconds;
    g->save_pending += seconds;
}

void gp_shrunk(gp *g, double seconds) {
    if (seconds > 0) g->lost[GP_SHRUNK_CAPACITY] += seconds;
}

void gp_set_capacity(gp *g, double fraction) { g->capacity = fraction; }

void gp_get(const gp *g, double now, gp_summary *s) {
    memset(s, 0, sizeof *s);
    s->wall = now > g->t0 ? now - g->t0 : 0;
    s->productive = g->productive;
    memcpy(s->lost, g->lost, sizeof s->lost);
    if (g->in_restart && now > g->restart_t0) s->lost[GP_RESTART] += now - g->restart_t0;
    double sum = s->productive;
    for (int c = 0; c < GP_NCAUSES; c++) sum += s->lost[c];
    s->other = s->wall > sum ? s->wall - sum : 0;
    s->ettr = s->wall > 0 ? s->productive / s->wall : 0;
    s->median_step = median(g);
    s->steps = g->steps;
}
