/* test_gpu_nccl_groups.c - a rank's NCCL groups on one GPU (worker/comms.c):
 * a 1-rank world over ZeroMQ and NCCL from a unique id as the supervisor's assignment
 * carries it, every Megatron group split from it by ncclCommSplit, an all-reduce of device
 * memory on each, wk_comms_abort failing the next call on every NCCL group, and a set built
 * again from a new id (the next generation) that works. Exits 77 without a GPU. */
#include "tests/gpu/gpu_util.h"

#include "comm/nccl_comm.h"
#include "worker/comms.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <unistd.h>

static int assignment(sv_assignment *a, char *ep, size_t n) {
    memset(a, 0, sizeof *a);
    a->rank = 0;
    a->world = a->tp = a->pp = a->cp = a->dp = a->ep = a->etp = 1;
    snprintf(ep, n, "ipc:///tmp/cohort-nccl-groups-%d", (int)getpid());
    static char *eps[1];
    eps[0] = ep;
    a->endpoints = eps;
    if (cm_nccl_get_unique_id(a->nccl_id)) return -1;
    a->have_nccl_id = true;
    return 0;
}

static void groups(void) {
    for (int gen = 1; gen <= 2; gen++) {
        sv_assignment a;
        char ep[128];
        REQUIRE(assignment(&a, ep, sizeof ep) == 0);
        cm_zmq_options zo;
        cm_zmq_options_default(&zo);
        wk_comms *cs = NULL;
        int rc = wk_comms_new_nccl(&cs, &a, &zo, 0);
        CHECK_MSG(rc == 0, "generation %d: %s (%s)", gen, co_err_detail(), co_err_name(rc));
        REQUIRE(cs);
        float *d = NULL;
        REQUIRE(cudaMalloc((void **)&d, 256 * sizeof(float)) == cudaSuccess);
        float h[256];
        for (int i = 0; i < 256; i++) h[i] = gu_uniform();
        cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
        int groups = 0;
        for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
            cm_comm *g = wk_comms_group(cs, (topo_group_kind)k);
            if (!g) continue;
            groups++;
            CHECK(g->size == 1 && g->rank == 0 && g != wk_comms_world(cs)); /* NCCL's, not the ZeroMQ one */
            CHECK(g->ops->allreduce_sum(g, d, 256, CM_F32, 10000) == 0);
        }
        CHECK(groups == TOPO_NGROUP_KINDS); /* a world of one is in every group */
        float back[256];
        cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
        CHECK(memcmp(back, h, sizeof h) == 0); /* the sum over one rank */
        wk_comms_abort(cs);
        for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
            cm_comm *g = wk_comms_group(cs, (topo_group_kind)k);
            CHECK(g && g->ops->allreduce_sum(g, d, 256, CM_F32, 10000) != 0);
        }
        cudaFree(d);
        wk_comms_destroy(&cs);
        CHECK(cs == NULL);
    }
}

int main(void) {
    gu_require_gpu();
    RUN(groups);
    return TEST_EXIT();
}
