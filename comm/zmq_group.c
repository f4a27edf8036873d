/* zmq_group.c - a communicator is a group of world ranks over one transport: creation,
 * split (a collective over the parent, every member agreeing on the group's id), abort
 * (the whole transport: every group on it), destroy, and the ops table. */
#include "comm/zmq_internal.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "comm/shm_seg.h"
#include "comm/zmq_auth.h"
#include "common/error.h"

/* ---------------------------------------------------------------- groups */

cm__group *cm__group_new(cm__tp *t, uint64_t id, const int *world, int n, int rank) {
    cm__group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->world = malloc(sizeof(int) * (size_t)n);
    g->p2p_send = calloc((size_t)n, sizeof(uint32_t));
    g->p2p_recv = calloc((size_t)n, sizeof(uint32_t));
    if (!g->world || !g->p2p_send || !g->p2p_recv) {
        free(g->world);
        free(g->p2p_send);
        free(g->p2p_recv);
        free(g);
        return NULL;
    }
    memcpy(g->world, world, sizeof(int) * (size_t)n);
    g->pub.ops = &cm__zmq_ops;
    g->pub.rank = rank;
    g->pub.size = n;
    g->pub.impl = g;
    g->tp = t;
    g->id = id;
    /* the same answer on every member: pair[] is the same matrix everywhere */
    g->shm = t->shm_on && n > 1;
    for (int a = 0; g->shm && a < n; a++)
        for (int b = 0; b < n; b++)
            if (a != b && !t->pair[(size_t)world[a] * (size_t)t->size + (size_t)world[b]]) {
                g->shm = false;
                break;
            }
    return g;
}

static void cm__group_free(cm__group *g) {
    cm__tp *t = g->tp;
    free(g->world);
    free(g->p2p_send);
    free(g->p2p_recv);
    free(g->splits);
    free(g);
    if (--t->refs == 0) cm__tp_free(t);
}

/* The group id is a hash of the parent's id, the list and how many times this rank split
 * the same list off the same parent, so every member computes it without talking. A
 * barrier in the new group then checks that every member made the same call. */
static int cm__split(cm_comm *c, const int *ranks, int n, cm_comm **out) {
    cm__group *g = cm__g(c);
    *out = NULL;
    int me = -1;
    if (!ranks || n < 1 || n > c->size) return co_err_set(CO_EINVAL, "split: %d ranks of %d", n, c->size);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->size)
            return co_err_set(CO_EINVAL, "split: rank %d out of range", ranks[i]);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) return co_err_set(CO_EINVAL, "split: rank %d twice", ranks[i]);
        if (ranks[i] == c->rank) me = i;
    }
    if (me < 0) return co_err_set(CO_EINVAL, "split: rank %d is not in the list", c->rank);
    int rc = cm__check(g->tp);
    if (rc) return rc;
    uint64_t key = cm__fnv(14695981039346656037ull, &g->id, sizeof g->id);
    key = cm__fnv(key, &n, sizeof n);
    key = cm__fnv(key, ranks, sizeof(int) * (size_t)n);
    uint32_t occ = 0;
    int i;
    for (i = 0; i < g->nsplits; i++)
        if (g->splits[i].key == key) break;
    if (i == g->nsplits) {
        cm__split_rec *s = realloc(g->splits, sizeof *s * (size_t)(g->nsplits + 1));
        if (!s) return co_err_set(CO_ENOMEM, "split");
        g->splits = s;
        s[i].key = key;
        s[i].count = 0;
        g->nsplits++;
    }
    occ = g->splits[i].count++;
    uint64_t id = cm__fnv(key, &occ, sizeof occ);
    int *world = malloc(sizeof(int) * (size_t)n);
    if (!world) return co_err_set(CO_ENOMEM, "split");
    for (int k = 0; k < n; k++) world[k] = g->world[ranks[k]];
    cm__group *ng = cm__group_new(g->tp, id, world, n, me);
    free(world);
    if (!ng) return co_err_set(CO_ENOMEM, "split");
    g->tp->refs++;
    rc = cm__barrier_op(ng, CM__OP_SPLIT, cm__deadline(g->tp->opt.connect_timeout_ms));
    if (rc) {
        cm__group_free(ng);
        return rc;
    }
    *out = &ng->pub;
    return 0;
}

static void cm__abort(cm_comm *c) {
    cm__tp *t = cm__g(c)->tp;
    atomic_store_explicit(&t->aborted, 1, memory_order_release);
    uint64_t one = 1;
    ssize_t w = write(t->efd, &one, sizeof one); /* wakes a blocked zmq_poll */
    (void)w;
}

static void cm__destroy(cm_comm *c) {
    if (c) cm__group_free(cm__g(c));
}

const cm_ops cm__zmq_ops = {
    .allreduce_sum = cm__allreduce,
    .broadcast = cm__broadcast,
    .allgather = cm__allgather,
    .reduce_scatter_sum = cm__reduce_scatter,
    .alltoallv = cm__alltoallv,
    .barrier = cm__barrier,
    .send = cm__send,
    .recv = cm__recv_p2p,
    .split = cm__split,
    .abort = cm__abort,
    .destroy = cm__destroy,
};

bool cm_zmq_shared_memory(const cm_comm *c) {
    return c && c->ops == &cm__zmq_ops && c->size > 1 && cm__g((cm_comm *)c)->shm;
}

void cm_zmq_traffic(const cm_comm *c, uint64_t *zmq_bytes, uint64_t *shm_bytes) {
    const cm__group *g = c->impl;
    *zmq_bytes = g->tp->zmq_bytes;
    *shm_bytes = g->tp->shm_bytes;
}
