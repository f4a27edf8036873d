/* data_tool.c - test helper: exposes the data layer to the python checks in tests/data.
 *
 *   data_tool mt-shuffle SEED N i32|u32|i64      arange(N) shuffled by RandomState(SEED), raw LE
 *   data_tool mt-interval SEED MAX K             K draws of random_interval(MAX) as int64, raw LE
 *   data_tool pcg-integers SEED LOW HIGH N       default_rng(SEED).integers(LOW, HIGH, N, int32), raw
 *   data_tool write PREFIX DTYPE                 stdin lines: one document per line, sequences
 *                                                separated by '|', tokens by spaces
 *   data_tool order PREFIX|mock SPLIT SPLIT_INDEX SEQ SEED NUM_SAMPLES CACHE_DIR|- OUTDIR K VOCAB EOD
 *       builds the dataset; writes OUTDIR/{doc,sample,shuffle}.bin (int32, int64, int64),
 *       OUTDIR/pairs.bin (K x 2 int64) and OUTDIR/items.bin (K x SEQ x 2 int32: tokens, labels);
 *       prints "epochs E separate S samples N loaded X cache PREFIX" or "empty". */
#include "common/error.h"
#include "data/gpt_dataset.h"
#include "data/indexed.h"
#include "data/nprng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(int rc) {
    fprintf(stderr, "data_tool: %s: %s\n", co_err_name(rc), co_err_detail());
    return 1;
}

static int dump(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    fclose(f);
    return w != n;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "mt-shuffle") && argc == 5) {
        np_mt19937 mt;
        np_mt_seed(&mt, (uint32_t)strtoull(argv[2], NULL, 10));
        size_t n = strtoull(argv[3], NULL, 10);
        if (!strcmp(argv[4], "i32")) {
            int32_t *a = malloc(n * 4 + 4);
            for (size_t i = 0; i < n; i++) a[i] = (int32_t)i;
            np_mt_shuffle_i32(&mt, a, n);
            fwrite(a, 4, n, stdout);
            free(a);
        } else if (!strcmp(argv[4], "u32")) {
            uint32_t *a = malloc(n * 4 + 4);
            for (size_t i = 0; i < n; i++) a[i] = (uint32_t)i;
            np_mt_shuffle_u32(&mt, a, n);
            fwrite(a, 4, n, stdout);
            free(a);
        } else {
            int64_t *a = malloc(n * 8 + 8);
            for (size_t i = 0; i < n; i++) a[i] = (int64_t)i;
            np_mt_shuffle_i64(&mt, a, n);
            fwrite(a, 8, n, stdout);
            free(a);
        }
        return 0;
    }
    if (!strcmp(cmd, "mt-interval") && argc == 5) {
        np_mt19937 mt;
        np_mt_seed(&mt, (uint32_t)strtoull(argv[2], NULL, 10));
        uint64_t max = strtoull(argv[3], NULL, 10);
        size_t k = strtoull(argv[4], NULL, 10);
        for (size_t i = 0; i < k; i++) {
            uint64_t v = np_mt_interval(&mt, max);
            fwrite(&v, 8, 1, stdout);
        }
        return 0;
    }
    if (!strcmp(cmd, "pcg-integers") && argc == 6) {
        np_pcg64 g;
        np_pcg64_seed(&g, strtoull(argv[2], NULL, 10));
        size_t n = strtoull(argv[5], NULL, 10);
        int32_t *a = malloc(n * 4 + 4);
        int rc = np_pcg64_integers_i32(&g, (int32_t)atoi(argv[3]), (int32_t)atoi(argv[4]), n, a);
        if (rc) return fail(rc);
        fwrite(a, 4, n, stdout);
        free(a);
        return 0;
    }
    if (!strcmp(cmd, "write") && argc == 4) {
        idx_writer *w;
        int rc = idx_writer_new(&w, argv[2], atoi(argv[3]));
        if (rc) return fail(rc);
        static char line[1 << 20];
        int32_t *tok = malloc(sizeof(int32_t) * (1 << 19));
        while (fgets(line, sizeof line, stdin)) {
            char *save = NULL;
            for (char *seq = strtok_r(line, "|\n", &save); seq; seq = strtok_r(NULL, "|\n", &save)) {
                size_t n = 0;
                char *s2 = NULL;
                for (char *t = strtok_r(seq, " ", &s2); t; t = strtok_r(NULL, " ", &s2)) tok[n++] = atoi(t);
                if (n == 1 && tok[0] == -999) n = 0; /* "-999" marks an empty sequence */
                rc = idx_writer_add_sequence(w, tok, n);
                if (rc) return fail(rc);
            }
            rc = idx_writer_end_document(w);
            if (rc) return fail(rc);
        }
        free(tok);
        rc = idx_writer_finish(&w);
        return rc ? fail(rc) : 0;
    }
    if (!strcmp(cmd, "order") && argc == 13) {
        gds_config c;
        memset(&c, 0, sizeof c);
        c.mock = !strcmp(argv[2], "mock");
        c.data_prefix = c.mock ? NULL : argv[2];
        c.split = argv[3];
        int split = atoi(argv[4]);
        c.seq_length = atoi(argv[5]);
        c.seed = (uint32_t)strtoull(argv[6], NULL, 10);
        int64_t want = strtoll(argv[7], NULL, 10);
        c.cache_dir = strcmp(argv[8], "-") ? argv[8] : NULL;
        const char *out = argv[9];
        int64_t k = strtoll(argv[10], NULL, 10);
        c.vocab_size = strtoll(argv[11], NULL, 10);
        c.eod = atoi(argv[12]);
        gds_dataset *ds;
        int rc = gds_build(&ds, &c, split, want);
        if (rc) return fail(rc);
        if (!ds) {
            printf("empty\n");
            return 0;
        }
        int64_t nd, rows, ns;
        const int32_t *doc = gds_document_index(ds, &nd);
        const int64_t *si = gds_sample_index(ds, &rows);
        const int64_t *sh = gds_shuffle_index(ds, &ns);
        int bad = dump(out, "doc.bin", doc, (size_t)nd * 4) || dump(out, "sample.bin", si, (size_t)rows * 16) ||
                  dump(out, "shuffle.bin", sh, (size_t)ns * 8);
        if (k > ns) k = ns;
        int64_t *pairs = malloc((size_t)(k ? k : 1) * 16);
        int32_t *items = malloc((size_t)(k ? k : 1) * (size_t)c.seq_length * 8);
        for (int64_t i = 0; i < k; i++) {
            rc = gds_sample_index_pair(ds, i, &pairs[2 * i], &pairs[2 * i + 1]);
            if (!rc)
                rc = gds_get(ds, i, items + (size_t)(2 * i) * (size_t)c.seq_length,
                             items + (size_t)(2 * i + 1) * (size_t)c.seq_length, NULL, NULL, NULL);
            if (rc) return fail(rc);
        }
        bad = bad || dump(out, "pairs.bin", pairs, (size_t)k * 16) ||
              dump(out, "items.bin", items, (size_t)k * (size_t)c.seq_length * 8);
        printf("epochs %lld separate %d samples %lld loaded %d cache %s\n", (long long)gds_num_epochs(ds),
               gds_separate_final_epoch(ds), (long long)ns, gds_loaded_from_cache(ds),
               gds_cache_prefix(ds) ? gds_cache_prefix(ds) : "-");
        free(pairs);
        free(items);
        gds_destroy(&ds);
        return bad;
    }
    fprintf(stderr, "data_tool: bad arguments\n");
    return 2;
}
