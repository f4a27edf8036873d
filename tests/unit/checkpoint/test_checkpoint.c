/* test_checkpoint.c - unit tests of checkpoint/: safetensors and manifest parsing (valid
 * and hostile), save/load round trips in every layout the loader accepts (whole tensors,
 * row slices over several writers, column and flat slices), the commit protocol under
 * failing writes (every write in turn, ENOSPC and EIO), corruption detection, retention,
 * candidates, the asynchronous saver, and a multi-rank save (each writer its part, a fake
 * coordinator completing and committing it). */
#include "checkpoint/ckpt.h"
#include "common/error.h"
#include "tests/test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void scratch(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", root, name);
    ck_remove_dir(out);
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* ---- a small tensor set ---- */
#define NT 4
static float data_a[6 * 5], data_b[7], data_c[3 * 4], data_d[9];
static ck_tensor_ref refs[NT];

static void fill(float seed) {
    for (int i = 0; i < 30; i++) data_a[i] = seed + (float)i * 0.25f;
    for (int i = 0; i < 7; i++) data_b[i] = -seed - (float)i;
    for (int i = 0; i < 12; i++) data_c[i] = seed * 3 + (float)i;
    for (int i = 0; i < 9; i++) data_d[i] = seed * 0.5f + (float)i / 7.0f;
    refs[0] = (ck_tensor_ref){.name = "layers.0.w", .kind = CK_KIND_MODEL, .ndim = 2, .shape = {6, 5}, .data = data_a, .dst = NULL};
    refs[1] = (ck_tensor_ref){.name = "layers.0.b", .kind = CK_KIND_MODEL, .ndim = 1, .shape = {7}, .data = data_b, .dst = NULL};
    refs[2] = (ck_tensor_ref){.name = "emb", .kind = CK_KIND_MODEL, .ndim = 2, .shape = {3, 4}, .data = data_c, .dst = NULL};
    refs[3] = (ck_tensor_ref){.name = "optimizer.exp_avg.emb", .kind = CK_KIND_OPTIM, .ndim = 1, .shape = {9}, .data = data_d, .dst = NULL};
}

static void meta_for(ck_meta *m, int64_t it) {
    memset(m, 0, sizeof *m);
    m->iteration = it;
    /* (with --fp16's loss scaler: a scale, a growth tracker, a hysteresis tracker below 0) */
    m->progress = (ck_progress){it, {it * 4, 8, 0}, 0, 0, 12.5, 1e300, 2, 65536.0, 3, -1};
    m->seed = 1234;
    m->layout = (ck_layout){1, 1, 1, 1, 1, false, 1, 1};
    m->model = (ck_model_info){2, 32, 4, 4, 8, 128, 501, 512, 32, false, false, false, true, true, false, 1e-5, 10000};
    m->optim = (ck_optim_info){true, "adamw", it, 0.9, 0.999, 1e-8, 0.01, 1.0};
}

static int load_into(const char *dir, float *a, float *b, float *c, float *d, ck_bad *bad) {
    ck_manifest *m = NULL;
    int rc = ck_read_manifest(dir, &m);
    if (rc) return rc;
    ck_tensor_ref r[NT];
    memcpy(r, refs, sizeof r);
    r[0].dst = a, r[1].dst = b, r[2].dst = c, r[3].dst = d;
    rc = ck_load_tensors(dir, m, r, NT, bad);
    ck_manifest_free(&m);
    return rc;
}

static bool loads_equal(const char *dir, float seed) {
    float a[30], b[7], c[12], d[9];
    ck_bad bad;
    if (load_into(dir, a, b, c, d, &bad)) {
        fprintf(stderr, "load %s: %s\n", dir, co_err_detail());
        return false;
    }
    fill(seed);
    return !memcmp(a, data_a, sizeof a) && !memcmp(b, data_b, sizeof b) && !memcmp(c, data_c, sizeof c) &&
           !memcmp(d, data_d, sizeof d);
}

/* ---- safetensors ---- */

static void test_safetensors(void) {
    const char *names[2] = {"x", "y.z"};
    int dts[2] = {CK_DT_F32, CK_DT_F32}, nds[2] = {2, 1};
    int64_t shapes[2][CK_MAX_DIMS] = {{2, 3}, {4}};
    char *hdr;
    size_t hl;
    REQUIRE(!ck_st_build_header(names, dts, nds, (const int64_t(*)[CK_MAX_DIMS])shapes, 2, NULL, &hdr, &hl));
    CHECK(hl % 8 == 0);
    size_t total = hl + 40;
    char *file = calloc(1, total + 16);
    memcpy(file, hdr, hl);
    ck_st_header *h = NULL;
    CHECK(!ck_st_parse(file, total, total, "t", &h));
    REQUIRE(h);
    CHECK(h->n == 2 && !strcmp(h->e[0].name, "x") && h->e[0].end == 24 && h->e[1].begin == 24 && h->e[1].end == 40);
    CHECK(ck_st_find(h, "y.z") && !ck_st_find(h, "nope"));
    ck_st_header_free(&h);
    /* truncated data, trailing bytes */
    CHECK(ck_st_parse(file, total - 4, total - 4, "t", &h) == CO_EFORMAT);
    CHECK(ck_st_parse(file, total + 8, total + 8, "t", &h) == CO_EFORMAT);
    CHECK(strstr(co_err_detail(), "after the last tensor"));
    free(hdr);

    /* hand-written hostile headers */
    static const char *bad[] = {
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
        "{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        "{\"../a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        "{\"__metadata__\":{\"k\":3}}",
        "[1,2]",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x",
        "{\"a\":",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t jl = strlen(bad[i]);
        size_t n = 8 + jl + 8;
        uint8_t *f = calloc(1, n);
        for (int k = 0; k < 8; k++) f[k] = (uint8_t)((uint64_t)jl >> (8 * k));
        memcpy(f + 8, bad[i], jl);
        int rc = ck_st_parse(f, n, n, "bad", &h);
        CHECK_MSG(rc == CO_EFORMAT, "hostile header %zu accepted", i);
        if (!rc) ck_st_header_free(&h);
        free(f);
    }
    /* header length beyond the file */
    uint8_t f[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    CHECK(ck_st_parse(f, 16, 16, "len", &h) == CO_EFORMAT);
    CHECK(ck_st_parse(f, 4, 4, "short", &h) == CO_EFORMAT);
    free(file);
}

/* ---- manifest ---- */

static void test_manifest_roundtrip_and_hostile(void) {
    fill(1);
    ck_meta meta;
    meta_for(&meta, 7);
    ck_manifest *plan = NULL;
    REQUIRE(!ck_plan(&meta, refs, NT, 3, &plan));
    CHECK(plan->nfiles == 6);
    CHECK(!strcmp(plan->files[0].name, "model-00001-of-00003.safetensors"));
    char *text;
    size_t len;
    REQUIRE(!ck_manifest_dump(plan, &text, &len));
    ck_manifest *m = NULL;
    CHECK(!ck_manifest_parse(text, len, "rt", &m));
    REQUIRE(m);
    CHECK(m->iteration == 7 && m->progress.consumed[0] == 28 && m->progress.iters_since_log == 2);
    CHECK(m->progress.loss_sum == 12.5 && m->progress.tok_sum == 1e300);
    CHECK(m->progress.loss_scale == 65536.0 && m->progress.growth_tracker == 3 && m->progress.hysteresis_tracker == -1);
    CHECK(m->ntensors == NT && m->layout.writers == 3 && m->optim.present && m->optim.step == 7);
    CHECK(m->model.padded_vocab == 512 && m->model.tied && !m->model.rope);
    const ck_mtensor *t = ck_manifest_find(m, "layers.0.w");
    REQUIRE(t);
    CHECK(t->nslices >= 1 && t->shape[0] == 6 && t->shape[1] == 5);
    ck_manifest_free(&m);

    /* mutations: each must be refused with CO_EFORMAT */
    static const struct {
        const char *from, *to;
    } mut[] = {
        {"\"format\": \"cohort-checkpoint\"", "\"format\": \"other\""},
        {"\"version\": 1", "\"version\": 99"},
        {"\"name\": \"model-00001-of-00003.safetensors\"", "\"name\": \"../evil\""},
        {"\"name\": \"model-00001-of-00003.safetensors\"", "\"name\": \"manifest.json\""},
        {"\"kind\": \"model\"", "\"kind\": \"weird\""},
        {"\"iteration\": 7", "\"iteration\": -7"},
        {"\"xxh3_128\": \"", "\"xxh3_128\": \"zz"},
        {"\"shape\": [\n    6,\n    5\n   ]", "\"shape\": [\n    6,\n    6\n   ]"},
        {"\"dtype\": \"F32\"", "\"dtype\": \"F31\""},
        {"\"loss_sum_bits\": \"", "\"loss_sum_bits\": \"x"},
        {"\"writers\": 3", "\"writers\": 0"},
        {"\"file\": 0", "\"file\": 77"},
        {"\"tensors\": [", "\"tensors\": 5, \"x\": ["},
    };
    for (size_t i = 0; i < sizeof mut / sizeof mut[0]; i++) {
        char *p = strstr(text, mut[i].from);
        if (!p) {
            CHECK_MSG(p, "mutation %zu: '%s' not in the manifest", i, mut[i].from);
            continue;
        }
        size_t fl = strlen(mut[i].from), tl = strlen(mut[i].to);
        char *b = malloc(len + tl + 1);
        memcpy(b, text, (size_t)(p - text));
        memcpy(b + (p - text), mut[i].to, tl);
        memcpy(b + (p - text) + tl, p + fl, len - (size_t)(p - text) - fl);
        size_t bl = len - fl + tl;
        int rc = ck_manifest_parse(b, bl, "mut", &m);
        CHECK_MSG(rc == CO_EFORMAT, "mutation %zu accepted (rc %d)", i, rc);
        if (!rc) ck_manifest_free(&m);
        free(b);
    }
    /* truncations never crash and never pass */
    for (size_t cut = 0; cut < len; cut += len / 37 + 1) {
        int rc = ck_manifest_parse(text, cut, "cut", &m);
        CHECK(rc == CO_EFORMAT);
        if (!rc) ck_manifest_free(&m);
    }
    free(text);
    ck_manifest_free(&plan);
}

/* slices that overlap or leave a gap */
static void test_manifest_cover(void) {
    const char *base =
        "{\"format\":\"cohort-checkpoint\",\"version\":1,\"iteration\":1,\"created_unix\":0,\"config\":{},"
        "\"progress\":{\"iteration\":1,\"consumed_samples\":{\"train\":0,\"valid\":0,\"test\":0},\"skipped_iterations\":0,"
        "\"nan_iterations\":0,\"log_accumulators\":{\"loss_sum_bits\":\"0000000000000000\",\"tok_sum_bits\":"
        "\"0000000000000000\",\"iters_since_log\":0}},\"rng\":{\"seed\":1,\"generators\":[]},\"data_iterators\":{},"
        "\"rerun_state_machine\":{},\"lr_scheduler\":{},\"parallel\":{\"world_size\":1,\"tensor\":1,\"pipeline\":1,"
        "\"context\":1,\"data\":1,\"distributed_optimizer\":false,\"writers\":1},\"model\":{\"num_layers\":1,\"hidden\":4,"
        "\"heads\":1,\"kv_groups\":1,\"head_dim\":4,\"ffn_hidden\":16,\"vocab\":8,\"padded_vocab\":8,\"max_positions\":4,"
        "\"rope\":false,\"rmsnorm\":false,\"swiglu\":false,\"tied\":true,\"bias\":true,\"norm_eps\":1e-5,\"rotary_base\":1e4},"
        "\"optimizer\":null,\"files\":[{\"name\":\"m.safetensors\",\"kind\":\"model\",\"size\":0,\"writer\":0,"
        "\"xxh3_128\":\"00000000000000000000000000000000\"}],\"tensors\":[{\"name\":\"w\",\"kind\":\"model\",\"dtype\":\"F32\","
        "\"shape\":[4,4],\"slices\":%s}]}";
    static const struct {
        const char *slices;
        bool ok;
    } cases[] = {
        {"[{\"file\":0,\"key\":\"w\",\"offsets\":[0,0],\"shape\":[4,4]}]", true},
        {"[{\"file\":0,\"key\":\"a\",\"offsets\":[0,0],\"shape\":[4,2]},{\"file\":0,\"key\":\"b\",\"offsets\":[0,2],\"shape\":[4,2]}]", true},
        {"[{\"file\":0,\"key\":\"a\",\"flat\":[0,10]},{\"file\":0,\"key\":\"b\",\"flat\":[10,16]}]", true},
        {"[{\"file\":0,\"key\":\"a\",\"offsets\":[0,0],\"shape\":[4,3]},{\"file\":0,\"key\":\"b\",\"offsets\":[0,2],\"shape\":[4,2]}]", false},
        {"[{\"file\":0,\"key\":\"a\",\"offsets\":[0,0],\"shape\":[4,2]}]", false},
        {"[{\"file\":0,\"key\":\"a\",\"offsets\":[0,0],\"shape\":[4,2]},{\"file\":0,\"key\":\"a\",\"offsets\":[0,2],\"shape\":[4,2]}]", false},
        {"[{\"file\":0,\"key\":\"a\",\"offsets\":[0,3],\"shape\":[4,2]}]", false},
        {"[{\"file\":0,\"key\":\"a\",\"flat\":[0,10]},{\"file\":0,\"key\":\"b\",\"flat\":[9,16]}]", false},
        {"[{\"file\":0,\"key\":\"a\",\"flat\":[0,10]},{\"file\":0,\"key\":\"b\",\"offsets\":[2,0],\"shape\":[2,4]}]", false},
        {"[]", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[4096];
        snprintf(buf, sizeof buf, base, cases[i].slices);
        ck_manifest *m = NULL;
        int rc = ck_manifest_parse(buf, strlen(buf), "cover", &m);
        CHECK_MSG((rc == 0) == cases[i].ok, "case %zu: rc %d (%s)", i, rc, co_err_detail());
        ck_manifest_free(&m);
    }
}

/* ---- save and load ---- */

static void test_save_load_layouts(void) {
    char save[512], dir[600];
    for (int writers = 1; writers <= 3; writers++) {
        scratch(save, sizeof save, "layouts");
        fill(2.5f);
        ck_meta meta;
        meta_for(&meta, 10);
        CHECK(!ck_save(save, &meta, refs, NT, writers, 0));
        int64_t it = -1;
        CHECK(!ck_read_tracker(save, &it) && it == 10);
        ck_iter_dir(dir, sizeof dir, save, 10);
        ck_bad bad;
        CHECK(!ck_verify(dir, &bad, NULL, NULL) && bad == CK_OK);
        CHECK_MSG(loads_equal(dir, 2.5f), "writers %d", writers);
        ck_manifest *m = NULL;
        REQUIRE(!ck_read_manifest(dir, &m));
        CHECK(m->layout.writers == writers && m->nfiles == 2 * writers);
        if (writers == 3) {
            int pieces = 0;
            for (int i = 0; i < m->ntensors; i++) pieces += m->tensors[i].nslices;
            CHECK(pieces > m->ntensors); /* some tensors were split by rows */
        }
        ck_manifest_free(&m);
    }
}

/* A layout no writer of ours produces yet (tensor-parallel style column slices and a
 * distributed-optimizer flat split): written by hand, assembled by the loader. */
static void write_st(const char *path, const char *const *names, const int64_t (*shapes)[CK_MAX_DIMS], const int *nds,
                     int n, const float *const *data, ck_mfile *f) {
    int dts[8];
    for (int i = 0; i < n; i++) dts[i] = CK_DT_F32;
    char *hdr;
    size_t hl;
    ck_st_build_header(names, dts, nds, shapes, n, NULL, &hdr, &hl);
    ck_file cf;
    ck_file_create(&cf, path);
    ck_file_write(&cf, hdr, hl);
    for (int i = 0; i < n; i++) {
        int64_t ne = 1;
        for (int d = 0; d < nds[i]; d++) ne *= shapes[i][d];
        ck_file_write(&cf, data[i], (size_t)ne * 4);
    }
    f->size = cf.bytes;
    ck_file_finish(&cf, f->xxh128);
    free(hdr);
}

static void test_load_foreign_layout(void) {
    char save[512], dir[600], path[800];
    scratch(save, sizeof save, "foreign");
    ck_iter_dir(dir, sizeof dir, save, 3);
    mkdir(save, 0777);
    mkdir(dir, 0777);
    fill(4);
    /* tensor 0 [6,5]: columns 0..1 in file 0, columns 2..4 in file 1 */
    float left[12], right[18];
    for (int r = 0; r < 6; r++) {
        for (int c = 0; c < 2; c++) left[r * 2 + c] = data_a[r * 5 + c];
        for (int c = 0; c < 3; c++) right[r * 3 + c] = data_a[r * 5 + 2 + c];
    }
    ck_meta meta;
    meta_for(&meta, 3);
    ck_manifest *m = NULL;
    REQUIRE(!ck_plan(&meta, refs, NT, 1, &m));
    /* rebuild files and slices by hand: file 0 = model-a, 1 = model-b, 2 = optim */
    m->nfiles = 3;
    m->files = realloc(m->files, 3 * sizeof *m->files);
    memset(m->files, 0, 3 * sizeof *m->files);
    snprintf(m->files[0].name, CK_NAME_MAX, "model-a.safetensors");
    snprintf(m->files[1].name, CK_NAME_MAX, "model-b.safetensors");
    snprintf(m->files[2].name, CK_NAME_MAX, "optim.safetensors");
    m->files[2].kind = CK_KIND_OPTIM;
    m->files[1].writer = 1;
    ck_mtensor *t0 = &m->tensors[0];
    t0->slices = realloc(t0->slices, 2 * sizeof *t0->slices);
    t0->nslices = 2;
    t0->slices[0] = (ck_slice){.file = 0, .key = "w#left", .offsets = {0, 0}, .shape = {6, 2}};
    t0->slices[1] = (ck_slice){.file = 1, .key = "w#right", .offsets = {0, 2}, .shape = {6, 3}};
    m->tensors[1].slices[0].file = 0;
    m->tensors[2].slices[0].file = 1;
    ck_mtensor *t3 = &m->tensors[3]; /* optimizer state [9]: flat halves */
    free(t3->slices);
    t3->slices = calloc(2, sizeof *t3->slices);
    t3->nslices = 2;
    t3->slices[0] = (ck_slice){.file = 2, .key = "o#0", .flat = true, .flat_begin = 0, .flat_end = 4};
    t3->slices[1] = (ck_slice){.file = 2, .key = "o#1", .flat = true, .flat_begin = 4, .flat_end = 9};
    {
        const char *nm[2] = {"w#left", "layers.0.b"};
        int64_t sh[2][CK_MAX_DIMS] = {{6, 2}, {7}};
        int nd[2] = {2, 1};
        const float *d[2] = {left, data_b};
        snprintf(path, sizeof path, "%s/%s", dir, m->files[0].name);
        write_st(path, nm, (const int64_t(*)[CK_MAX_DIMS])sh, nd, 2, d, &m->files[0]);
    }
    {
        const char *nm[2] = {"emb", "w#right"};
        int64_t sh[2][CK_MAX_DIMS] = {{3, 4}, {6, 3}};
        int nd[2] = {2, 2};
        const float *d[2] = {data_c, right};
        snprintf(path, sizeof path, "%s/%s", dir, m->files[1].name);
        write_st(path, nm, (const int64_t(*)[CK_MAX_DIMS])sh, nd, 2, d, &m->files[1]);
    }
    {
        const char *nm[2] = {"o#1", "o#0"};
        int64_t sh[2][CK_MAX_DIMS] = {{5}, {4}};
        int nd[2] = {1, 1};
        const float *d[2] = {data_d + 4, data_d};
        snprintf(path, sizeof path, "%s/%s", dir, m->files[2].name);
        write_st(path, nm, (const int64_t(*)[CK_MAX_DIMS])sh, nd, 2, d, &m->files[2]);
    }
    m->layout.tensor = 2;
    m->layout.writers = 2;
    CHECK(!ck_write_manifest(dir, m));
    ck_manifest_free(&m);
    ck_bad bad;
    CHECK_MSG(!ck_verify(dir, &bad, NULL, NULL), "%s", co_err_detail());
    CHECK(loads_equal(dir, 4));
    /* regions: rows 2..4 x columns 1..3 of w cross the column slices; elements 3..6 of the
     * optimizer tensor cross its flat halves */
    ck_manifest *mm = NULL;
    REQUIRE(!ck_read_manifest(dir, &mm));
    float rw[9] = {0}, ro[4] = {0};
    ck_tensor_ref rr[2] = {refs[0], refs[3]};
    rr[0].region = rr[1].region = true;
    rr[0].dst = rw, rr[1].dst = ro;
    memcpy(rr[0].offsets, (int64_t[]){2, 1}, 2 * sizeof(int64_t));
    memcpy(rr[0].rshape, (int64_t[]){3, 3}, 2 * sizeof(int64_t));
    rr[1].offsets[0] = 3, rr[1].rshape[0] = 4;
    CHECK_MSG(!ck_load_tensors(dir, mm, rr, 2, &bad), "%s", co_err_detail());
    for (int i = 0; i < 9; i++) CHECK(rw[i] == data_a[(2 + i / 3) * 5 + 1 + i % 3]);
    for (int i = 0; i < 4; i++) CHECK(ro[i] == data_d[3 + i]);
    rr[1].rshape[0] = 7; /* 3 + 7 > 9 */
    CHECK(ck_load_tensors(dir, mm, rr, 2, &bad) == CO_EINVAL);
    CHECK_MSG(strstr(co_err_detail(), "lies outside tensor optimizer.exp_avg.emb"), "%s", co_err_detail());
    ck_manifest_free(&mm);
}

/* Flat parts (the distributed optimizer's shards): the moment of w [3,5] as flat ranges
 * [0,4) and [11,15) by writer 0 and [4,11) by writer 1, each written from that writer's
 * buffer only; verified, read whole, loaded as rows 1..2, a plan mixing flat and
 * rectangular parts of one tensor refused. */
static void test_flat_parts(void) {
    char save[512], dir[600];
    scratch(save, sizeof save, "flat");
    ck_iter_dir(dir, sizeof dir, save, 9);
    mkdir(save, 0777);
    float w[15], e[15];
    for (int i = 0; i < 15; i++) w[i] = (float)i + 0.5f, e[i] = -(float)i * 0.25f;
    ck_tensor_ref all[4] = {
        {.name = "w", .kind = CK_KIND_MODEL, .ndim = 2, .shape = {3, 5}, .data = w},
        {.name = "optimizer.exp_avg.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {3, 5}, .data = e, .flat = true,
         .flat_begin = 0, .flat_end = 4, .writer = 0},
        {.name = "optimizer.exp_avg.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {3, 5}, .data = e + 4, .flat = true,
         .flat_begin = 4, .flat_end = 11, .writer = 1},
        {.name = "optimizer.exp_avg.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {3, 5}, .data = e + 11, .flat = true,
         .flat_begin = 11, .flat_end = 15, .writer = 0},
    };
    ck_meta meta;
    meta_for(&meta, 9);
    meta.layout = (ck_layout){2, 1, 1, 1, 2, true, 2, 1};
    ck_manifest *plan = NULL;
    REQUIRE(!ck_plan(&meta, all, 4, 2, &plan));
    const ck_mtensor *mt = ck_manifest_find(plan, "optimizer.exp_avg.w");
    REQUIRE(mt && mt->nslices == 3);
    for (int k = 0; k < 3; k++) {
        CHECK(mt->slices[k].flat && plan->files[mt->slices[k].file].writer == all[1 + k].writer);
        CHECK(mt->slices[k].flat_begin == all[1 + k].flat_begin && mt->slices[k].flat_end == all[1 + k].flat_end);
    }
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s/iter_0000009", save);
    mkdir(tmp, 0777);
    for (int wr = 0; wr < 2; wr++) {
        ck_tensor_ref mine[4];
        memcpy(mine, all, sizeof mine);
        for (int i = 1; i < 4; i++)
            if (mine[i].writer != wr) mine[i].data = NULL;
        CHECK_MSG(!ck_write_shards(tmp, plan, mine, 4, wr), "%s", co_err_detail());
    }
    REQUIRE(!ck_write_manifest(tmp, plan));
    ck_manifest_free(&plan);
    ck_bad bad;
    CHECK_MSG(!ck_verify(dir, &bad, NULL, NULL), "%s", co_err_detail());
    ck_manifest *m = NULL;
    REQUIRE(!ck_read_manifest(dir, &m));
    float **bufs = NULL;
    REQUIRE(!ck_read_all(dir, m, 3, &bufs, &bad));
    for (int i = 0; i < m->ntensors; i++)
        CHECK_MSG(!memcmp(bufs[i], strcmp(m->tensors[i].name, "w") ? e : w, sizeof w), "%s", m->tensors[i].name);
    ck_free_all(m, &bufs);
    float rows[10];
    ck_tensor_ref want = {.name = "optimizer.exp_avg.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {3, 5},
                          .dst = rows, .region = true, .offsets = {1, 0}, .rshape = {2, 5}};
    CHECK_MSG(!ck_load_tensors(dir, m, &want, 1, &bad), "%s", co_err_detail());
    CHECK(!memcmp(rows, e + 5, sizeof rows));
    ck_manifest_free(&m);
    ck_tensor_ref mixed[2] = {all[1], {.name = "optimizer.exp_avg.w", .kind = CK_KIND_OPTIM, .ndim = 2, .shape = {3, 5},
                                       .data = e, .region = true, .offsets = {1, 0}, .rshape = {2, 5}}};
    CHECK(ck_plan(&meta, mixed, 2, 2, &plan) == CO_EINVAL);
    CHECK_MSG(strstr(co_err_detail(), "mixes flat and rectangular"), "%s", co_err_detail());
    all[2].writer = 2; /* no such writer */
    CHECK(ck_plan(&meta, all, 4, 2, &plan) == CO_EINVAL);
}

/* Writer groups (tensor parallelism): each group's parts, spread over its writers, loaded
 * whole and as regions of another split. Two groups of two writers; tensor w [8,6] by rows
 * as qkv is split (group 0 rows 0-1 and 4, group 1 rows 2-3 and 5-7), p [5,6] by columns,
 * b [7] held by every group, the moment of w split as w. */
static void test_writer_groups(void) {
    char save[512], dir[600];
    scratch(save, sizeof save, "groups");
    ck_iter_dir(dir, sizeof dir, save, 7);
    mkdir(save, 0777);
    float w[48], pm[30], b[7], e[48], pl[2][15];
    for (int i = 0; i < 48; i++) w[i] = (float)i + 0.5f, e[i] = -(float)i * 0.25f;
    for (int i = 0; i < 30; i++) pm[i] = 100.0f + (float)i;
    for (int i = 0; i < 7; i++) b[i] = 7.0f - (float)i;
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < 5; r++)
            for (int c = 0; c < 3; c++) pl[g][r * 3 + c] = pm[r * 6 + 3 * g + c];
    struct { int64_t row, rows; int g; } wp[4] = {{0, 2, 0}, {4, 1, 0}, {2, 2, 1}, {5, 3, 1}};
    ck_tensor_ref all[11];
    int n = 0;
    for (int k = 0; k < 2; k++) /* w, then its moment */
        for (int i = 0; i < 4; i++)
            all[n++] = (ck_tensor_ref){.name = k ? "optimizer.exp_avg.w" : "w", .kind = k ? CK_KIND_OPTIM : CK_KIND_MODEL,
                                       .ndim = 2, .shape = {8, 6}, .data = (k ? e : w) + wp[i].row * 6, .region = true,
                                       .offsets = {wp[i].row, 0}, .rshape = {wp[i].rows, 6}, .group = wp[i].g};
    for (int g = 0; g < 2; g++)
        all[n++] = (ck_tensor_ref){.name = "p", .kind = CK_KIND_MODEL, .ndim = 2, .shape = {5, 6}, .data = pl[g],
                                   .region = true, .offsets = {0, 3 * g}, .rshape = {5, 3}, .group = g};
    all[n++] = (ck_tensor_ref){.name = "b", .kind = CK_KIND_MODEL, .ndim = 1, .shape = {7}, .data = b, .group = CK_ANY_GROUP};
    ck_meta meta;
    meta_for(&meta, 7);
    meta.layout = (ck_layout){4, 2, 1, 1, 2, false, 4, 2};
    ck_manifest *plan = NULL;
    REQUIRE(!ck_plan(&meta, all, n, 4, &plan));
    CHECK(plan->ntensors == 4 && plan->nfiles == 8 && plan->layout.groups == 2);
    /* each part lies in a file of its group's writers; the writers of a group share its bytes */
    int64_t wbytes[4] = {0};
    for (int i = 0; i < plan->ntensors; i++)
        for (int k = 0; k < plan->tensors[i].nslices; k++) {
            const ck_slice *sl = &plan->tensors[i].slices[k];
            const ck_tensor_ref *r = &all[sl->ref];
            int wr = plan->files[sl->file].writer;
            if (r->group != CK_ANY_GROUP) CHECK(wr % 2 == r->group);
            if (plan->files[sl->file].kind == CK_KIND_MODEL) wbytes[wr] += sl->shape[0] * (plan->tensors[i].ndim > 1 ? sl->shape[1] : 1) * 4;
        }
    CHECK_MSG(llabs(wbytes[0] - wbytes[2]) <= 6 * 4 && llabs(wbytes[1] - wbytes[3]) <= 6 * 4, "%lld %lld %lld %lld",
              (long long)wbytes[0], (long long)wbytes[1], (long long)wbytes[2], (long long)wbytes[3]);
    /* every writer writes from its own group's data only */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s/iter_0000007", save);
    mkdir(tmp, 0777);
    for (int wr = 0; wr < 4; wr++) {
        ck_tensor_ref mine[11];
        memcpy(mine, all, sizeof mine);
        for (int i = 0; i < n; i++)
            if (mine[i].group != CK_ANY_GROUP && mine[i].group != wr % 2) mine[i].data = NULL;
        if (wr == 0) { /* without its data a writer refuses */
            ck_tensor_ref none[11];
            memcpy(none, mine, sizeof none);
            for (int i = 0; i < n; i++) none[i].data = NULL;
            CHECK(ck_write_shards(tmp, plan, none, n, wr) == CO_EINVAL);
            CHECK_MSG(strstr(co_err_detail(), "has no data for"), "%s", co_err_detail());
        }
        CHECK_MSG(!ck_write_shards(tmp, plan, mine, n, wr), "%s", co_err_detail());
    }
    REQUIRE(!ck_write_manifest(tmp, plan));
    ck_manifest_free(&plan);
    ck_bad bad;
    CHECK_MSG(!ck_verify(dir, &bad, NULL, NULL), "%s", co_err_detail());
    ck_manifest *m = NULL;
    REQUIRE(!ck_read_manifest(dir, &m));
    CHECK(m->layout.groups == 2 && m->layout.writers == 4);
    float **bufs = NULL;
    REQUIRE(!ck_read_all(dir, m, 3, &bufs, &bad));
    for (int i = 0; i < m->ntensors; i++) {
        const char *nm = m->tensors[i].name;
        const float *want = !strcmp(nm, "w") ? w : !strcmp(nm, "p") ? pm : !strcmp(nm, "b") ? b : e;
        size_t len = !strcmp(nm, "p") ? 30 : !strcmp(nm, "b") ? 7 : 48;
        CHECK_MSG(!memcmp(bufs[i], want, len * sizeof(float)), "%s", nm);
    }
    ck_free_all(m, &bufs);
    /* another split: rows 1..6 of w, columns 2..4 of p (across both groups), p's rows 1..2 */
    float rw[36], rp[15], rq[12];
    ck_tensor_ref want[3] = {all[0], all[8], all[8]};
    want[0].offsets[0] = 1, want[0].rshape[0] = 6, want[0].dst = rw;
    want[1].offsets[1] = 2, want[1].rshape[1] = 3, want[1].dst = rp;
    want[2].offsets[0] = 1, want[2].offsets[1] = 0, want[2].rshape[0] = 2, want[2].rshape[1] = 6, want[2].dst = rq;
    CHECK_MSG(!ck_load_tensors(dir, m, want, 3, &bad), "%s", co_err_detail());
    CHECK(!memcmp(rw, w + 6, sizeof rw) && !memcmp(rq, pm + 6, sizeof rq));
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 3; c++) CHECK(rp[r * 3 + c] == pm[r * 6 + 2 + c]);
    ck_manifest_free(&m);
}

static void test_failing_writes(void) {
    char save[512], dir[600], tmp[700];
    scratch(save, sizeof save, "failing");
    fill(1);
    ck_meta meta;
    meta_for(&meta, 5);
    REQUIRE(!ck_save(save, &meta, refs, NT, 2, 0));
    /* count the writes of one save, then fail each of them in turn */
    int total = 0;
    for (int n = 1; n < 200; n++) {
        fill(9);
        meta_for(&meta, 6);
        ck_test_fail_write(n, n % 2 ? ENOSPC : EIO);
        int rc = ck_save(save, &meta, refs, NT, 2, 0);
        ck_test_fail_write(0, 0);
        if (!rc) {
            total = n - 1;
            break;
        }
        CHECK_MSG(rc == (n % 2 ? CO_ENOSPC : CO_EIO), "write %d: rc %d", n, rc);
        int64_t it = -1;
        CHECK(!ck_read_tracker(save, &it) && it == 5);
        ck_iter_dir(dir, sizeof dir, save, 6);
        CHECK_MSG(!exists(dir), "write %d: a failed save left %s", n, dir);
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld", dir, (long)getpid());
        CHECK_MSG(!exists(tmp), "write %d: %s left behind", n, tmp);
        ck_iter_dir(dir, sizeof dir, save, 5);
        CHECK(loads_equal(dir, 1));
    }
    CHECK(total >= 5); /* 2 model + 2 optim files (header + data) + manifest */
    int64_t it = -1;
    CHECK(!ck_read_tracker(save, &it) && it == 6);
    ck_iter_dir(dir, sizeof dir, save, 6);
    CHECK(loads_equal(dir, 9));
}

static void corrupt_byte(const char *path, long off) {
    int fd = open(path, O_RDWR);
    unsigned char c;
    off_t o = off >= 0 ? off : lseek(fd, 0, SEEK_END) + off;
    pread(fd, &c, 1, o);
    c ^= 0x5a;
    pwrite(fd, &c, 1, o);
    close(fd);
}

static void test_corruption(void) {
    char save[512], dir[600], path[700];
    scratch(save, sizeof save, "corrupt");
    fill(3);
    ck_meta meta;
    meta_for(&meta, 2);
    REQUIRE(!ck_save(save, &meta, refs, NT, 1, 0));
    ck_iter_dir(dir, sizeof dir, save, 2);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_bad bad;
    corrupt_byte(path, -3); /* data */
    CHECK(ck_verify(dir, &bad, NULL, NULL) && bad == CK_BAD_CHECKSUM);
    float a[30], b[7], c[12], d[9];
    CHECK(load_into(dir, a, b, c, d, &bad) && bad == CK_BAD_CHECKSUM);
    CHECK(strstr(co_err_detail(), "checksum mismatch"));
    corrupt_byte(path, -3);
    CHECK(!ck_verify(dir, &bad, NULL, NULL));
    corrupt_byte(path, 20); /* header JSON */
    CHECK(ck_verify(dir, &bad, NULL, NULL) && (bad == CK_BAD_FORMAT || bad == CK_BAD_CHECKSUM));
    corrupt_byte(path, 20);
    CHECK(truncate(path, 100) == 0);
    CHECK(ck_verify(dir, &bad, NULL, NULL) && bad == CK_BAD_INCOMPLETE);
    CHECK(load_into(dir, a, b, c, d, &bad) && bad == CK_BAD_INCOMPLETE);
    CHECK(strstr(co_err_detail(), "truncated"));
    unlink(path);
    CHECK(ck_verify(dir, &bad, NULL, NULL) && bad == CK_BAD_INCOMPLETE);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"cohort-checkpoint\", ", f);
    fclose(f);
    CHECK(ck_verify(dir, &bad, NULL, NULL) == CO_EFORMAT && bad == CK_BAD_FORMAT);
    unlink(path);
    CHECK(ck_verify(dir, &bad, NULL, NULL) == CO_ENOENT && bad == CK_BAD_INCOMPLETE);
}

/* --keep-every beside --most-recent-k: the newest complete ones, every K-th, the tracker's;
 * a directory without a manifest (an incomplete save) does not count among the newest. */
static void test_retention_every(void) {
    char save[512], dir[600];
    scratch(save, sizeof save, "every");
    fill(1);
    for (int it = 2; it <= 20; it += 2) {
        ck_meta meta;
        meta_for(&meta, it);
        CHECK(!ck_save(save, &meta, refs, NT, 1, 0));
    }
    int64_t removed[16];
    int nr;
    CHECK(!ck_write_tracker(save, 20));
    CHECK(!ck_prune_every(save, 2, 8, true, removed, 16, &nr));
    /* kept: 20, 18 (newest), 16, 8 (every 8th); removed 2, 4, 6, 10, 12, 14 */
    CHECK(nr == 6 && removed[0] == 2 && removed[1] == 4 && removed[2] == 6 && removed[3] == 10 && removed[5] == 14);
    /* 20's manifest gone (a damaged newest one, still the tracker's): 18 and 16 are the two
     * newest complete ones; 20 stays as the tracker's */
    snprintf(dir, sizeof dir, "%s/iter_0000020/%s", save, CK_MANIFEST_NAME);
    CHECK(!unlink(dir));
    CHECK(!ck_prune_every(save, 2, 8, false, removed, 16, &nr) && nr == 6);
    int64_t *its;
    int n;
    CHECK(!ck_list_iterations(save, &its, &n) && n == 4 && its[0] == 8 && its[1] == 16 && its[2] == 18 &&
          its[3] == 20);
    free(its);
    /* keep one, no K: the newest complete one (18) stays beside the tracker's incomplete 20 */
    CHECK(!ck_prune_every(save, 1, 0, false, removed, 16, &nr) && nr == 2 && removed[0] == 8 && removed[1] == 16);
    CHECK(!ck_list_iterations(save, &its, &n) && n == 2 && its[0] == 18 && its[1] == 20);
    free(its);
    CHECK(ck_prune_every(save, 2, -1, true, removed, 16, &nr) == CO_EINVAL);
}

static void test_retention_and_candidates(void) {
    char save[512], dir[600];
    scratch(save, sizeof save, "retention");
    fill(1);
    for (int it = 1; it <= 5; it++) {
        ck_meta meta;
        meta_for(&meta, it * 10);
        CHECK(!ck_save(save, &meta, refs, NT, 1, 0));
    }
    int64_t *its, removed[8];
    int n, nr;
    CHECK(!ck_candidates(save, -1, &its, &n) && n == 5 && its[0] == 50 && its[1] == 40 && its[4] == 10);
    free(its);
    CHECK(!ck_candidates(save, 30, &its, &n) && n == 3 && its[0] == 30 && its[2] == 10);
    free(its);
    /* the tracker names 20: kept besides the two most recent */
    CHECK(!ck_write_tracker(save, 20));
    CHECK(!ck_prune(save, 2, true, removed, 8, &nr) && nr == 1 && removed[0] == 10); /* 20 tracked, 30 newer */
    CHECK(!ck_write_tracker(save, 50));
    CHECK(!ck_prune(save, 2, true, removed, 8, &nr) && nr == 3);
    CHECK(!ck_write_tracker(save, 20));
    ck_meta meta;
    meta_for(&meta, 60);
    CHECK(!ck_save(save, &meta, refs, NT, 1, 2)); /* tracker now 60: keeps 50, 60 */
    CHECK(!ck_list_iterations(save, &its, &n) && n == 2 && its[0] == 50 && its[1] == 60);
    free(its);
    /* stale leftovers are cleaned, never listed */
    snprintf(dir, sizeof dir, "%s/iter_0000070.tmp-999", save);
    mkdir(dir, 0777);
    CHECK(!ck_list_iterations(save, &its, &n) && n == 2);
    free(its);
    CHECK(!ck_clean_stale(save) && !exists(dir));
    /* no checkpoint at all */
    scratch(save, sizeof save, "empty");
    mkdir(save, 0777);
    CHECK(ck_candidates(save, -1, &its, &n) == CO_ENOENT);
    /* a garbled tracker */
    char tp[700];
    snprintf(tp, sizeof tp, "%s/%s", save, CK_TRACKER_NAME);
    FILE *f = fopen(tp, "w");
    fputs("12abc", f);
    fclose(f);
    int64_t it;
    CHECK(ck_read_tracker(save, &it) == CO_EFORMAT);
}

static void test_async_saver(void) {
    char save[512], dir[600];
    scratch(save, sizeof save, "async");
    ck_saver *s = NULL;
    ck_saver_opts o = {.save_dir = save, .async = true, .keep = 2, .writers = 1, .log = NULL};
    REQUIRE(!ck_saver_new(&s, &o));
    for (int it = 1; it <= 3; it++) {
        fill((float)it);
        ck_meta meta;
        meta_for(&meta, it);
        CHECK(!ck_saver_save(s, &meta, refs, NT));
        /* the copy runs in the background; once it is done (the trainer waits here before
         * its optimizer step) changing the source must not matter */
        CHECK(ck_saver_wait_snapshot(s) >= 0.0);
        fill(100);
    }
    CHECK(!ck_saver_wait(s));
    ck_iter_dir(dir, sizeof dir, save, 3);
    CHECK(loads_equal(dir, 3));
    ck_iter_dir(dir, sizeof dir, save, 2);
    CHECK(loads_equal(dir, 2));
    ck_iter_dir(dir, sizeof dir, save, 1);
    CHECK(!exists(dir)); /* keep 2 */
    /* a background failure surfaces at the wait, with its detail */
    ck_test_fail_write(2, ENOSPC);
    fill(4);
    ck_meta meta;
    meta_for(&meta, 4);
    CHECK(!ck_saver_save(s, &meta, refs, NT));
    CHECK(ck_saver_wait(s) == CO_ENOSPC);
    CHECK(strstr(co_err_detail(), "No space left"));
    ck_test_fail_write(0, 0);
    int64_t it;
    CHECK(!ck_read_tracker(save, &it) && it == 3);
    ck_saver_destroy(&s);
    CHECK(s == NULL);
}


/* ---- multi-rank save: ranks' parts, the coordinator's completion ---- */

static ck_mfile acked[32];
static int nacked, ack_fail_status;
static char ack_error[1200];

static int fake_ack(void *ctx, int64_t it, int status, const char *error, const ck_mfile *files, int n) {
    (void)ctx;
    (void)it;
    if (status) {
        ack_fail_status = status;
        snprintf(ack_error, sizeof ack_error, "%s", error ? error : "");
        return 0;
    }
    for (int i = 0; i < n && nacked < 32; i++) acked[nacked++] = files[i];
    return 0;
}
static int fake_wait(void *ctx, int64_t it, int timeout_ms) {
    (void)ctx;
    (void)it;
    (void)timeout_ms;
    return 0; /* the test commits after every part is written */
}

static void test_save_parts(void) {
    char save[512], tmp[700], dir[600], ref[512], rdir[600], p[800];
    ck_coord co = {.token = "job00000000000000ab", .ack = fake_ack, .wait = fake_wait};
    for (int writers = 2; writers <= 3; writers++) {
        scratch(save, sizeof save, "parts");
        scratch(ref, sizeof ref, "parts-ref");
        fill(4.5f);
        ck_meta meta;
        meta_for(&meta, 12);
        nacked = 0;
        for (int w = writers - 1; w >= 0; w--) CHECK(!ck_save_part(save, &meta, refs, NT, writers, w, &co));
        CHECK(nacked == 2 * writers);
        for (int i = 0; i < nacked; i++) CHECK(acked[i].xxh64 != 0 && acked[i].size > 8);
        ck_tmp_dir_shared(tmp, sizeof tmp, save, 12, co.token);
        snprintf(p, sizeof p, "%s/%s", tmp, CK_PLAN_NAME);
        CHECK(exists(p));
        /* an acknowledgement that does not match what was written is refused */
        acked[1].size++;
        CHECK(ck_complete_shared(tmp, 12, writers, acked, nacked) == CO_EPROTOCOL);
        acked[1].size--;
        CHECK(ck_complete_shared(tmp, 12, writers, acked, nacked - 1) == CO_EPROTOCOL);
        CHECK(ck_complete_shared(tmp, 12, writers + 1, acked, nacked) == CO_EPROTOCOL);
        REQUIRE(!ck_complete_shared(tmp, 12, writers, acked, nacked));
        CHECK(!exists(p)); /* the plan and the writer records are not part of the checkpoint */
        REQUIRE(!ck_commit(save, 12, tmp));
        ck_iter_dir(dir, sizeof dir, save, 12);
        ck_bad bad;
        CHECK(!ck_verify(dir, &bad, NULL, NULL) && bad == CK_OK);
        CHECK(loads_equal(dir, 4.5f));
        /* the same files as one process writing every part */
        fill(4.5f);
        REQUIRE(!ck_save(ref, &meta, refs, NT, writers, 0));
        ck_iter_dir(rdir, sizeof rdir, ref, 12);
        ck_manifest *a = NULL, *b = NULL;
        REQUIRE(!ck_read_manifest(dir, &a) && !ck_read_manifest(rdir, &b));
        CHECK(a->nfiles == b->nfiles && a->layout.writers == writers);
        for (int i = 0; i < a->nfiles && i < b->nfiles; i++) {
            CHECK(!strcmp(a->files[i].name, b->files[i].name) && a->files[i].writer == b->files[i].writer);
            CHECK(a->files[i].size == b->files[i].size && !memcmp(a->files[i].xxh128, b->files[i].xxh128, 16));
        }
        ck_manifest_free(&a);
        ck_manifest_free(&b);
    }
    /* a writer whose write fails acknowledges the failure with the detail */
    fill(5.5f);
    ck_meta meta;
    meta_for(&meta, 14);
    ack_fail_status = 0;
    ck_test_fail_write(2, ENOSPC);
    int rc = ck_save_part(save, &meta, refs, NT, 2, 1, &co);
    ck_test_fail_write(0, 0);
    CHECK(rc == CO_ENOSPC && ack_fail_status == CO_ENOSPC);
    CHECK_MSG(strstr(ack_error, "No space left on device") && strstr(ack_error, "safetensors"), "%s", ack_error);
    CHECK(!ck_remove_tmp_dirs(save, co.token));
    ck_tmp_dir_shared(tmp, sizeof tmp, save, 14, co.token);
    CHECK(!exists(tmp));
    int64_t it = -1;
    CHECK(!ck_read_tracker(save, &it) && it == 12);
}

int main(void) {
    if (t_scratch_dir(root, sizeof root, "cohort-ckpt-unit")) return 1;
    RUN(test_safetensors);
    RUN(test_manifest_roundtrip_and_hostile);
    RUN(test_manifest_cover);
    RUN(test_save_load_layouts);
    RUN(test_load_foreign_layout);
    RUN(test_writer_groups);
    RUN(test_flat_parts);
    RUN(test_failing_writes);
    RUN(test_corruption);
    RUN(test_retention_and_candidates);
    RUN(test_retention_every);
    RUN(test_async_saver);
    RUN(test_save_parts);
    t_remove_dir(root);
    return TEST_EXIT();
}
