/* test_goodput.c - supervisor/goodput.c: events in, seconds by cause out. */
#include "supervisor/goodput.h"

#include "tests/test.h"

#include <math.h>

/* 1 s of startup, then 10 clean 1 s steps: everything productive but the startup. */
static void clean_run(void) {
    gp g;
    gp_init(&g, 100);
    gp_step(&g, 101, 1, -1);
    for (int i = 2; i <= 11; i++) gp_step(&g, 100 + i, i, -1);
    gp_summary s;
    gp_get(&g, 111, &s);
    CHECK_CLOSE(s.wall, 11, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_STARTUP], 1, 1e-9, 0);
    CHECK_CLOSE(s.productive, 10, 1e-9, 0);
    CHECK_CLOSE(s.ettr, 10.0 / 11, 1e-9, 0);
    CHECK_CLOSE(s.other, 0, 1e-9, 0);
    CHECK_CLOSE(s.median_step, 1, 1e-9, 0);
    CHECK(s.steps == 11);
    for (int c = GP_DETECTION; c < GP_NCAUSES; c++) CHECK(s.lost[c] == 0);
}

/* A slow step counts its time above the median as straggler, a replayed one as replay, and a
 * save's blocking time comes out of the step it was made in. */
static void straggler_replay_save(void) {
    gp g;
    gp_init(&g, 0);
    double t = 1;
    gp_step(&g, t, 1, -1);
    for (int i = 2; i <= 6; i++) gp_step(&g, t += 1, i, -1);
    gp_step(&g, t += 3, 7, -1);      /* 2 s above the median */
    gp_step(&g, t + 2.5, 8, t + 1.5);   /* rejected after 1.5 s, replayed in 1 s */
    t += 2.5;
    gp_save(&g, 0.5);
    gp_step(&g, t += 1.5, 9, -1);    /* 0.5 s of it the save */
    gp_summary s;
    gp_get(&g, t, &s);
    CHECK_CLOSE(s.lost[GP_STRAGGLER], 2, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_REPLAY], 1.5, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_CHECKPOINT_SAVE], 0.5, 1e-9, 0);
    CHECK_CLOSE(s.productive, 8, 1e-9, 0);
    CHECK_CLOSE(s.other, 0, 1e-9, 0);
    CHECK(s.ettr < 1);
}

/* A killed rank: 0.3 s to notice, 0.2 s of the aborted step before it, 2 s of restart, 1.5 s
 * of handover before the next step's 1 s; then a checkpoint fallback redoes two steps. */
static void restarts(void) {
    gp g;
    gp_init(&g, 0);
    double t = 1;
    gp_step(&g, t, 1, -1);
    for (int i = 2; i <= 5; i++) gp_step(&g, t += 1, i, -1);
    gp_restart_begin(&g, t += 0.5, 0.3);
    gp_summary s;
    gp_get(&g, t + 1, &s); /* mid-restart: the restart so far */
    CHECK_CLOSE(s.lost[GP_RESTART], 1, 1e-9, 0);
    gp_restart_done(&g, t += 2);
    gp_step(&g, t += 2.5, 6, -1);
    gp_get(&g, t, &s);
    CHECK_CLOSE(s.lost[GP_DETECTION], 0.3, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_RECOMPUTE], 0.2, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_RESTART], 2, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_STATE_TRANSFER], 1.5, 1e-9, 0);
    CHECK_CLOSE(s.productive, 5, 1e-9, 0);
    /* back to a checkpoint of iteration 4: steps 5 and 6 are done again */
    gp_restart_begin(&g, t += 0.1, 0.1);
    gp_restart_done(&g, t += 1);
    gp_step(&g, t += 1, 5, -1);
    gp_step(&g, t += 1, 6, -1);
    gp_step(&g, t += 1, 7, -1);
    gp_get(&g, t, &s);
    CHECK_CLOSE(s.lost[GP_RECOMPUTE], 0.2 + 2, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_DETECTION], 0.4, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_RESTART], 3, 1e-9, 0);
    CHECK_CLOSE(s.productive, 6, 1e-9, 0);
    CHECK_CLOSE(s.other, 0, 1e-9, 0);
    CHECK_CLOSE(s.wall, t, 1e-9, 0);
    CHECK(s.lost[GP_SHRUNK_CAPACITY] == 0);
    gp_shrunk(&g, 4);
    gp_get(&g, t, &s);
    CHECK_CLOSE(s.lost[GP_SHRUNK_CAPACITY], 4, 1e-9, 0);
}

/* A fault before the first step: its time is startup, its detection detection. */
static void fault_in_startup(void) {
    gp g;
    gp_init(&g, 0);
    gp_restart_begin(&g, 3, 0.5);
    gp_restart_done(&g, 4);
    gp_step(&g, 5, 1, -1);
    gp_summary s;
    gp_get(&g, 5, &s);
    CHECK_CLOSE(s.lost[GP_STARTUP], 2.5, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_DETECTION], 0.5, 1e-9, 0);
    CHECK_CLOSE(s.lost[GP_RESTART], 1, 1e-9, 0);
    CHECK_CLOSE(s.productive, 1, 1e-9, 0);
    CHECK(!strcmp(gp_cause_name(GP_CHECKPOINT_SAVE), "checkpoint_save"));
}

/* --elastic: steps on half the world are half productive, half shrunk capacity; whole again after. */
static void shrunk_capacity(void) {
    gp g;
    gp_init(&g, 0);
    gp_step(&g, 1, 1, -1);
    gp_set_capacity(&g, 0.5);
    gp_step(&g, 2, 2, -1);
    gp_step(&g, 3, 3, -1);
    gp_set_capacity(&g, 1);
    gp_step(&g, 4, 4, -1);
    gp_summary s;
    gp_get(&g, 4, &s);
    CHECK_CLOSE(s.lost[GP_SHRUNK_CAPACITY], 1, 1e-9, 0);
    CHECK_CLOSE(s.productive, 2, 1e-9, 0);
    CHECK(!strcmp(gp_cause_name(GP_SHRUNK_CAPACITY), "shrunk_capacity"));
}

int main(void) {
    RUN(shrunk_capacity);
    RUN(clean_run);
    RUN(straggler_replay_save);
    RUN(restarts);
    RUN(fault_in_startup);
    return TEST_EXIT();
}
