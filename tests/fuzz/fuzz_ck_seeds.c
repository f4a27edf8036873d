/* fuzz_ck_seeds.c - writes seed inputs for the checkpoint fuzz targets: a valid manifest
 * (several writers, so slices appear) and a valid safetensors file.
 *   fuzz_ck_seeds manifest|safetensors DIR */
#include "checkpoint/format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) exit(1);
    fclose(f);
}

static const char manifest[] =
    "{\"format\":\"cohort-checkpoint\",\"version\":1,\"iteration\":1,\"created_unix\":0,\"config\":{\"seed\":1},"
    "\"progress\":{\"iteration\":1,\"consumed_samples\":{\"train\":4,\"valid\":0,\"test\":0},\"skipped_iterations\":0,"
    "\"nan_iterations\":0,\"log_accumulators\":{\"loss_sum_bits\":\"3ff0000000000000\",\"tok_sum_bits\":"
    "\"0000000000000000\",\"iters_since_log\":1}},\"rng\":{\"seed\":1,\"generators\":[]},\"data_iterators\":{},"
    "\"rerun_state_machine\":{},\"lr_scheduler\":{},\"parallel\":{\"world_size\":2,\"tensor\":2,\"pipeline\":1,"
    "\"context\":1,\"data\":1,\"distributed_optimizer\":true,\"writers\":2},\"model\":{\"num_layers\":1,\"hidden\":4,"
    "\"heads\":1,\"kv_groups\":1,\"head_dim\":4,\"ffn_hidden\":16,\"vocab\":8,\"padded_vocab\":8,\"max_positions\":4,"
    "\"rope\":false,\"rmsnorm\":false,\"swiglu\":false,\"tied\":true,\"bias\":true,\"norm_eps\":1e-5,\"rotary_base\":1e4},"
    "\"optimizer\":{\"type\":\"adamw\",\"step\":1,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8,\"weight_decay\":0.1,"
    "\"clip_grad\":1},\"files\":[{\"name\":\"model-00001-of-00002.safetensors\",\"kind\":\"model\",\"size\":100,"
    "\"writer\":0,\"xxh3_128\":\"0123456789abcdef0123456789abcdef\"},{\"name\":\"optim.safetensors\",\"kind\":\"optim\","
    "\"size\":72,\"writer\":1,\"xxh3_128\":\"0123456789abcdef0123456789abcdef\"}],\"tensors\":[{\"name\":\"w\","
    "\"kind\":\"model\",\"dtype\":\"F32\",\"shape\":[4,4],\"slices\":[{\"file\":0,\"key\":\"w#0\",\"offsets\":[0,0],"
    "\"shape\":[4,2]},{\"file\":0,\"key\":\"w#1\",\"offsets\":[0,2],\"shape\":[4,2]}]},{\"name\":\"optimizer.exp_avg.w\","
    "\"kind\":\"optim\",\"dtype\":\"F32\",\"shape\":[4,4],\"slices\":[{\"file\":1,\"key\":\"o#0\",\"flat\":[0,6]},"
    "{\"file\":1,\"key\":\"o#1\",\"flat\":[6,16]}]}]}";

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    if (!strcmp(argv[1], "manifest")) {
        put(argv[2], "seed-manifest.json", manifest, strlen(manifest));
        ck_manifest *m = NULL;
        if (ck_manifest_parse(manifest, strlen(manifest), "seed", &m)) {
            fprintf(stderr, "seed manifest invalid\n");
            return 1;
        }
        char *text;
        size_t len;
        if (ck_manifest_dump(m, &text, &len)) return 1;
        put(argv[2], "seed-manifest-dumped.json", text, len);
        free(text);
        ck_manifest_free(&m);
        return 0;
    }
    const char *names[3] = {"a", "b.c#1", "d"};
    int dts[3] = {CK_DT_F32, CK_DT_BF16, CK_DT_I64}, nds[3] = {2, 1, 0};
    int64_t shapes[3][CK_MAX_DIMS] = {{2, 3}, {5}, {0}};
    json_t *meta = json_pack("{ssss}", "format", "pt", "cohort.slice.b.c#1", "{\"tensor\":\"b.c\",\"offsets\":[5]}");
    char *hdr;
    size_t hl;
    if (ck_st_build_header(names, dts, nds, (const int64_t(*)[CK_MAX_DIMS])shapes, 3, meta, &hdr, &hl)) return 1;
    json_decref(meta);
    size_t n = hl + 24 + 10 + 8;
    char *f = calloc(1, n);
    memcpy(f, hdr, hl);
    put(argv[2], "seed.safetensors", f, n);
    free(f);
    free(hdr);
    return 0;
}
