/* block_attn_tool.c - runs the CPU block attention kernels (kb_ops.block_attention_*) on
 * inputs from a file, for the numpy reference tests/data/block_attn_ref.py.
 *
 * block_attn_tool IN OUT
 * IN:  int32 B, Tq, Tk, nh, nkv, hd, mask, has_doc; float32 q[B*Tq, nh*hd],
 *      k[B*Tk, nkv*hd], v[B*Tk, nkv*hd], dout[B*Tq, nh*hd]; with has_doc int32 qdoc[B*Tq],
 *      kdoc[B*Tk].
 * OUT: float32 out[B*Tq, nh*hd], lse[B*nh*Tq], dq, dk, dv (shaped as q, k, v). The gradient
 *      buffers start at 0.5 everywhere, so the reference checks that backward accumulates. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "kernels/backend.h"

static void *rd(FILE *f, size_t n, size_t sz) {
    void *p = malloc(n * sz + 1);
    if (!p || fread(p, sz, n, f) != n) {
        fprintf(stderr, "block_attn_tool: short input\n");
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: block_attn_tool IN OUT\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    int32_t *h = rd(f, 8, sizeof(int32_t));
    const int B = h[0], Tq = h[1], Tk = h[2], nh = h[3], nkv = h[4], hd = h[5];
    const size_t nq = (size_t)B * Tq * nh * hd, nk = (size_t)B * Tk * nkv * hd;
    float *q = rd(f, nq, 4), *k = rd(f, nk, 4), *v = rd(f, nk, 4), *dout = rd(f, nq, 4);
    int32_t *qdoc = NULL, *kdoc = NULL;
    if (h[7]) {
        qdoc = rd(f, (size_t)B * Tq, 4);
        kdoc = rd(f, (size_t)B * Tk, 4);
    }
    fclose(f);
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 2};
    kb_backend *b = NULL;
    if (kb_backend_new(&b, &o)) return 2;
    kb_block_attn a = {.B = B, .Tq = Tq, .Tk = Tk, .nh = nh, .nkv = nkv, .hd = hd,
                       .mask = (kb_block_mask)h[6], .q = q, .k = k, .v = v,
                       .q_stride = (size_t)nh * hd, .k_stride = (size_t)nkv * hd,
                       .v_stride = (size_t)nkv * hd, .qdoc = qdoc, .kdoc = kdoc};
    float *out = malloc(nq * 4 + 4), *lse = malloc((size_t)B * nh * Tq * 4 + 4);
    float *dq = malloc(nq * 4 + 4), *dk = malloc(nk * 4 + 4), *dv = malloc(nk * 4 + 4);
    for (size_t i = 0; i < nq; i++) dq[i] = 0.5f;
    for (size_t i = 0; i < nk; i++) dk[i] = dv[i] = 0.5f;
    b->ops->block_attention_forward(b, &a, out, lse);
    b->ops->block_attention_backward(b, &a, out, lse, dout, dq, a.q_stride, dk, a.k_stride, dv,
                                     a.v_stride);
    if (kb_backend_status(b)) {
        fprintf(stderr, "block_attn_tool: %s\n", co_err_detail());
        return 1;
    }
    f = fopen(argv[2], "wb");
    if (!f) return 2;
    fwrite(out, 4, nq, f);
    fwrite(lse, 4, (size_t)B * nh * Tq, f);
    fwrite(dq, 4, nq, f);
    fwrite(dk, 4, nk, f);
    fwrite(dv, 4, nk, f);
    fclose(f);
    kb_backend_destroy(&b);
    free(h), free(q), free(k), free(v), free(dout), free(qdoc), free(kdoc);
    free(out), free(lse), free(dq), free(dk), free(dv);
    return 0;
}
