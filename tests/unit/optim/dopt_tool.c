/* dopt_tool.c - prints the distributed optimizer's layout (optim/dist_opt.h) for the cases
 * on stdin, for tests/data/dist_opt_ref.py to compare with its restatement of Megatron's
 * buffer code. Input: one case a line, "dp bucket_size n numel_0 .. numel_{n-1}"
 * (bucket_size 0 = the default). Output per case: "case total shard_total nbuckets
 * bucket_size", "B start end unpadded shard shard_base" per bucket, "P start bucket" per
 * parameter (table order), "R rank param lo hi shard_off buf_off" per piece, "end". */
#include "common/error.h"
#include "optim/dist_opt.h"

#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int dp, n;
    size_t bs;
    while (scanf("%d %zu %d", &dp, &bs, &n) == 3) {
        if (n < 1 || n > 1000000) return 2;
        size_t *numel = malloc((size_t)n * sizeof *numel);
        if (!numel) return 2;
        for (int i = 0; i < n; i++)
            if (scanf("%zu", &numel[i]) != 1) return 2;
        dopt_layout L;
        int rc = dopt_layout_build(&L, numel, n, dp, bs);
        free(numel);
        if (rc) {
            printf("error %s\n", co_err_name(rc));
            continue;
        }
        printf("case %zu %zu %d %zu\n", L.total, L.shard_total, L.nbuckets, L.bucket_size);
        for (int b = 0; b < L.nbuckets; b++)
            printf("B %zu %zu %zu %zu %zu\n", L.buckets[b].start, L.buckets[b].end, L.buckets[b].numel_unpadded,
                   L.buckets[b].shard, L.buckets[b].shard_base);
        for (int i = 0; i < n; i++) printf("P %zu %d\n", L.param_start[i], L.param_bucket[i]);
        for (int r = 0; r < dp; r++)
            for (int j = 0; j < L.npieces[r]; j++) {
                const dopt_piece *p = &L.pieces[r][j];
                printf("R %d %d %zu %zu %zu %zu\n", r, p->param, p->param_lo, p->param_hi, p->shard_off, p->buf_off);
            }
        printf("end\n");
        dopt_layout_free(&L);
    }
    return 0;
}
