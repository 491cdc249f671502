/* fuzz_checkpoint.c — the checkpoint loader (train/checkpoint.c: tq_load_checkpoint, the resume
 * path, and tq_load_model, the init_from path) against a real engine: a tiny conv → bn → relu →
 * linear model (every layout the loader converts: conv KRSC, linear HWC flatten, batch-norm
 * buffers and the I64 num_batches_tracked) with AdamW state (both optimizer buffers).
 *
 * Input: byte 0 selects the form. Even: the safetensors header JSON, one NUL byte, then the
 * data section (the harness writes the 8-byte header length, so a mutation inside the JSON keeps
 * the file well-formed and reaches the metadata and tensor checks). Odd: the rest is the raw
 * file. Seeds: TQ_FUZZ_WRITE_SEEDS=DIR ./fuzz_checkpoint -runs=0 writes real checkpoints of this
 * model in that form (tests/fuzz/make_corpus does it).
 * Properties: never crashes; a failure has a message; an accepted checkpoint's state is within
 * the limits checkpoint.h promises (0 <= step <= 40, opt_t + skipped_steps == step, growth
 * tracker < growth_interval, loss scale finite and > 0). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "checkpoint.h"
#include "graph.h"
#include "fuzz_util.h"

#define TOTAL 40
#define INTERVAL 3

static tq_backend *be;
static tq_graph *g;
static tq_engine e;
static fuzz_file in;

static tq_graph *tiny_graph(void) {
    tq_graph *gr = tq_graph_new(2, 4, 4, 2, TQ_F16);
    int x = tq_conv(gr, gr->input, 3, 3, 1, 1, 1, "conv1");
    x = tq_relu(gr, tq_bn(gr, x, "bn1"));
    x = tq_linear(gr, x, 3, "fc");
    tq_graph_loss(gr, x, 3);
    return gr;
}

/* path's safetensors file → DIR/name in the harness's split form */
static void write_seed(const char *dir, const char *name, const char *path) {
    FILE *fp = fopen(path, "rb");
    FUZZ_CHECK(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    FUZZ_CHECK(buf && fread(buf, 1, (size_t)n, fp) == (size_t)n);
    fclose(fp);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
    char out[512];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    FUZZ_CHECK((fp = fopen(out, "wb")));
    uint8_t zero = 0;
    size_t hlen = (size_t)hl;
    while (hlen > 0 && buf[8 + hlen - 1] == ' ') hlen--;   /* the writer's alignment padding */
    fwrite(&zero, 1, 1, fp);
    fwrite(buf + 8, 1, hlen, fp);
    fwrite(&zero, 1, 1, fp);
    fwrite(buf + 8 + hl, 1, (size_t)n - 8 - hl, fp);
    FUZZ_CHECK(fclose(fp) == 0);
    free(buf);
}

static void write_seeds(const char *dir) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/seed.safetensors", fuzz_dir());
    fuzz_dir_put("seed.safetensors", NULL, 0);
    fuzz_dir_put("seed.safetensors.tmp", NULL, 0);
    FUZZ_CHECK(tq_engine_init_weights(&e, 7) == 0);
    e.counts[0] = 5;
    const tq_ckpt_state states[] = {
        {5, 4, 1024, 2, 1},         /* mid-job, one fp16 skip */
        {0, 0, 65536, 0, 0},        /* step 0 */
        {TOTAL, TOTAL, 1, 0, 0},    /* the job's end */
    };
    for (size_t k = 0; k < sizeof states / sizeof states[0]; k++) {
        FUZZ_CHECK(tq_save_checkpoint(&e, path, &states[k], err, sizeof err) == 0);
        char name[64];
        snprintf(name, sizeof name, "checkpoint-%zu", k);
        write_seed(dir, name, path);
    }
    FUZZ_CHECK(tq_export_model(&e, path, err, sizeof err) == 0);
    write_seed(dir, "model", path);
    fuzz_dir_put("seed.safetensors", NULL, 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char err[512];
    be = tq_cpu_backend_new(1);
    FUZZ_CHECK(be);
    g = tiny_graph();
    FUZZ_CHECK(g && tq_graph_plan(g, be) == 0);
    FUZZ_CHECK(tq_engine_new(&e, be, g, TQ_OPT_ADAMW, 0, err, sizeof err) == 0);
    fuzz_memfile_open(&in, "ckpt-in");
    const char *seeds = getenv("TQ_FUZZ_WRITE_SEEDS");
    if (seeds && *seeds) write_seeds(seeds);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) {
        fuzz_memfile_set(&in, data + 1, size - 1, NULL, 0);
    } else {
        const uint8_t *body = data + 1, *nul = memchr(body, 0, size - 1);
        size_t hl = nul ? (size_t)(nul - body) : size - 1;
        size_t padded = (hl + 7) / 8 * 8;
        uint8_t *file = malloc(8 + padded);
        FUZZ_CHECK(file);
        for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        memcpy(file + 8, body, hl);
        memset(file + 8 + hl, ' ', padded - hl);
        const uint8_t *rest = nul ? nul + 1 : NULL;
        size_t nrest = nul ? size - 1 - hl - 1 : 0;
        fuzz_memfile_set(&in, file, 8 + padded, rest, nrest);
        free(file);
    }
    char err[512] = "";
    tq_ckpt_state st;
    memset(&st, 0x5a, sizeof st);
    const tq_ckpt_limits lim = {TOTAL, INTERVAL};
    int rc = tq_load_checkpoint(&e, in.path, &lim, &st, err, sizeof err);
    if (rc) {
        FUZZ_CHECK(err[0] != 0);
    } else {
        FUZZ_CHECK(st.step >= 0 && st.step <= TOTAL);
        FUZZ_CHECK(st.opt_t >= 0 && st.skipped_steps >= 0 && st.opt_t + st.skipped_steps == st.step);
        FUZZ_CHECK(st.growth_tracker >= 0 && st.growth_tracker < INTERVAL && st.growth_tracker <= st.step);
        FUZZ_CHECK(isfinite(st.loss_scale) && st.loss_scale > 0 && isfinite((float)st.loss_scale));
        for (int i = 0; i < g->nbn; i++) FUZZ_CHECK(e.counts[i] >= 0);
    }
    err[0] = 0;
    rc = tq_load_model(&e, in.path, err, sizeof err);
    if (rc) FUZZ_CHECK(err[0] != 0);
    /* NULL limits: only the metadata's own consistency */
    rc = tq_load_checkpoint(&e, in.path, NULL, &st, err, sizeof err);
    if (!rc) FUZZ_CHECK(st.step >= 0 && st.opt_t + st.skipped_steps == st.step);
    return 0;
}
