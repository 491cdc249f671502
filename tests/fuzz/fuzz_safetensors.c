/* fuzz_safetensors.c — the safetensors reader (train/safetensors.c) on arbitrary files.
 * Properties: tq_st_open never crashes and either fails with a message or returns a file whose
 * every tensor lies inside the file (each byte of each tensor is read, so ASan checks it),
 * whose sizes agree with dtype × shape, that tq_st_find finds by name, and that writes back
 * (tq_st_write) to a file that opens to the same tensors and metadata. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "safetensors.h"
#include "fuzz_util.h"

static fuzz_file in;
static char out_path[512];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_memfile_open(&in, "st-in");
    snprintf(out_path, sizeof out_path, "%s/out.safetensors", fuzz_dir());
    fuzz_dir_put("out.safetensors", NULL, 0);
    fuzz_dir_put("out.safetensors.tmp", NULL, 0);
    return 0;
}

static const char *const KEYS[] = {"format", "step", "opt_t", "loss_scale", "", "__metadata__"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_memfile_set(&in, data, size, NULL, 0);
    char err[512];
    err[0] = 0;
    tq_st_file *f = tq_st_open(in.path, err, sizeof err);
    if (!f) { FUZZ_CHECK(err[0] != 0); return 0; }
    int n = tq_st_count(f);
    FUZZ_CHECK(n >= 0 && tq_st_at(f, n) == NULL && tq_st_at(f, -1) == NULL);
    volatile uint8_t sink = 0;
    tq_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    FUZZ_CHECK(ts);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const tq_st_tensor *t = tq_st_at(f, i);
        FUZZ_CHECK(t && t->ndim >= 0 && t->ndim <= 8);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) { FUZZ_CHECK(t->shape[d] >= 0); numel *= (size_t)t->shape[d]; }
        FUZZ_CHECK(numel * tq_st_dtype_size(t->dtype) == t->bytes);
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->bytes; k++) sink ^= p[k];
        FUZZ_CHECK(tq_st_find(f, t->name) == t);
        total += t->bytes;
        ts[i] = *t;
    }
    FUZZ_CHECK(total <= size);
    (void)sink;
    for (size_t k = 0; k < sizeof KEYS / sizeof KEYS[0]; k++) {
        const char *v = tq_st_meta(f, KEYS[k]);
        if (v) sink ^= (uint8_t)strlen(v);
    }
    /* round trip: what was read writes back (names < 160 bytes, unique, known dtypes, sizes that
     * agree: all checked above) and reads again to the same tensors */
    char werr[512];
    cJSON *meta = NULL;
    int wrc = tq_st_write(out_path, ts, n, meta, werr, sizeof werr);
    if (wrc == TQ_OK) {
        tq_st_file *g = tq_st_open(out_path, werr, sizeof werr);
        if (!g) fprintf(stderr, "fuzz_safetensors: the rewrite does not open: %s\n", werr);
        FUZZ_CHECK(g);
        FUZZ_CHECK(tq_st_count(g) == n);
        for (int i = 0; i < n; i++) {
            const tq_st_tensor *a = &ts[i], *b = tq_st_find(g, a->name);
            FUZZ_CHECK(b && !strcmp(a->dtype, b->dtype) && a->ndim == b->ndim && a->bytes == b->bytes);
            FUZZ_CHECK(!memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim));
            FUZZ_CHECK(a->bytes == 0 || !memcmp(a->data, b->data, a->bytes));
        }
        tq_st_close(g);
    } else {
        /* a name with an embedded "__metadata__" or the like: the writer refuses, with a message */
        FUZZ_CHECK(wrc == TQ_EINVAL && werr[0]);
    }
    free(ts);
    tq_st_close(f);
    return 0;
}
