/* test_checkpoint.c — checkpoints are validated input (train/checkpoint.h): a real checkpoint
 * written by tq_train, tampered (metadata numbers out of range or not numbers at all, tensors of
 * the wrong shape or dtype, a negative num_batches_tracked) and resumed through tq_train, must
 * fail the job with invalid_checkpoint and a message naming the field, never crash or train;
 * an untampered checkpoint still resumes. Also the regression inputs the fuzzers found
 * (tests/fuzz/). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "tmpdir.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <zlib.h>
#include "dataset.h"
#include "checkpoint.h"
#include "safetensors.h"
#include "spec.h"
#include "trainer.h"

#define SYN "\"dataset\":\"synthetic\",\"synthetic\":{\"train\":64,\"test\":16,\"height\":8,\"width\":8," \
            "\"channels\":1},\"threads\":2,\"device\":\"cpu\",\"batch_size\":4"
#define TOTAL 40

typedef struct { int n; int64_t first; } recs;
static int on_step(void *ctx, const tq_step_rec *r) {
    recs *c = ctx;
    if (c->n++ == 0) c->first = r->step;
    return 0;
}

static void spec_from(tq_spec *sp, const char *json) {
    tq_spec_err e;
    int rc = tq_spec_parse(sp, json, &e);
    if (rc) fprintf(stderr, "spec error: %s: %s\n", e.field, e.message);
    assert_int_equal(rc, 0);
}

/* the job spec: model, amp/optimizer extras, steps */
static void job(char *buf, size_t n, const char *model, const char *extra, int steps) {
    snprintf(buf, n, "{\"model\":\"%s\",\"steps\":%d%s%s,%s}", model, steps, extra[0] ? "," : "", extra, SYN);
}

static int train(const char *json, const char *dir, int resume, tq_summary *sum, recs *r) {
    tq_spec sp;
    spec_from(&sp, json);
    memset(r, 0, sizeof *r);
    tq_run_opts o = {.out_dir = dir, .resume = resume, .cb = {r, on_step, NULL, NULL, NULL}};
    return tq_train(&sp, &o, sum);
}

static char *tmpdir(void) {
    char *t = tq_tmpdir("tq_ckpt");
    assert_non_null(t);
    return t;
}

static void rm_dir(char *d) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

/* A real checkpoint: `steps` steps of the job into a new directory. */
static char *make_ckpt(const char *model, const char *extra, int steps) {
    char js[1024];
    job(js, sizeof js, model, extra, steps);
    char *d = tmpdir();
    tq_summary sum;
    recs r;
    assert_int_equal(train(js, d, 0, &sum, &r), 0);
    assert_string_equal(sum.state, "succeeded");
    assert_int_equal(sum.steps, steps);
    return d;
}

static const char *const META[] = {"format", "step", "opt_t", "loss_scale", "growth_tracker", "skipped_steps"};

/* A tampering: metadata key := value (value NULL: removed), and/or one tensor's dtype/shape/size. */
typedef struct {
    const char *key, *value;
    const char *tensor;      /* NULL: no tensor change */
    const char *dtype;       /* NULL: unchanged */
    int ndim;                /* -1: unchanged */
    int64_t shape[8];
    int64_t bytes_div;       /* > 1: keep only bytes / bytes_div of the data */
    int64_t i64;             /* tensor "I64" value when bytes_div == -1 */
} tamper;

/* Copies src/checkpoint.safetensors to dst/checkpoint.safetensors with t applied. */
static void tamper_copy(const char *src, const char *dst, const tamper *t) {
    char in[512], out[512], err[512];
    snprintf(in, sizeof in, "%s/checkpoint.safetensors", src);
    snprintf(out, sizeof out, "%s/checkpoint.safetensors", dst);
    tq_st_file *f = tq_st_open(in, err, sizeof err);
    if (!f) fprintf(stderr, "%s\n", err);
    assert_non_null(f);
    int n = tq_st_count(f);
    tq_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    int64_t val = t->i64;
    int hit = t->tensor == NULL;
    for (int i = 0; i < n; i++) {
        ts[i] = *tq_st_at(f, i);
        if (!t->tensor || strcmp(ts[i].name, t->tensor)) continue;
        hit = 1;
        if (t->dtype) snprintf(ts[i].dtype, sizeof ts[i].dtype, "%s", t->dtype);
        if (t->ndim >= 0) { ts[i].ndim = t->ndim; memcpy(ts[i].shape, t->shape, sizeof t->shape); }
        if (t->bytes_div > 1) ts[i].bytes /= (size_t)t->bytes_div;
        if (t->bytes_div == -1) ts[i].data = &val;
    }
    assert_true(hit);
    cJSON *meta = cJSON_CreateObject();
    for (size_t k = 0; k < sizeof META / sizeof META[0]; k++) {
        const char *v = tq_st_meta(f, META[k]);
        assert_non_null(v);
        if (t->key && !strcmp(t->key, META[k])) v = t->value;
        if (v) cJSON_AddStringToObject(meta, META[k], v);
    }
    int rc = tq_st_write(out, ts, n, meta, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    cJSON_Delete(meta);
    free(ts);
    tq_st_close(f);
}

/* Resumes the job from src's checkpoint tampered with t: must fail with invalid_checkpoint and
 * a message holding `needle`, having trained nothing. */
static void expect_bad(const char *src, const char *json, const tamper *t, const char *needle) {
    char *d = tmpdir();
    tamper_copy(src, d, t);
    tq_summary sum;
    recs r;
    int rc = train(json, d, 1, &sum, &r);
    if (strcmp(sum.error_code, "invalid_checkpoint") || !strstr(sum.error_message, needle))
        fprintf(stderr, "tamper %s=%s %s: state %s, code \"%s\", message: %s\n  expected: %s\n",
                t->key ? t->key : "-", t->value ? t->value : "(removed)", t->tensor ? t->tensor : "",
                sum.state, sum.error_code, sum.error_message, needle);
    assert_int_not_equal(rc, 0);
    assert_string_equal(sum.state, "failed");
    assert_string_equal(sum.error_code, "invalid_checkpoint");
    assert_non_null(strstr(sum.error_message, needle));
    assert_int_equal(r.n, 0);   /* not one step trained */
    rm_dir(d);
}

#define META_T(k, v) (&(tamper){ .key = (k), .value = (v), .ndim = -1 })

static void test_metadata_numbers(void **state) {
    char *src = make_ckpt("cnn", "", 2);   /* step 2, opt_t 2, loss_scale 1, tracker 0, skipped 0 */
    char js[1024];
    job(js, sizeof js, "cnn", "", TOTAL);
    static const struct { const char *key, *value, *needle; } cases[] = {
        /* the step: the crashes of issue 20 (heap overflow, use-after-free, overflow, a 40-step
         * job "succeeded" with 99,999,999,999 steps), then text that is not a number */
        {"step", "-5", "checkpoint metadata \"step\" is -5: must be 0..40"},
        {"step", "-9223372036854775808", "checkpoint metadata \"step\" is -9223372036854775808: must be 0..40"},
        {"step", "9223372036854775807", "checkpoint metadata \"step\" is 9223372036854775807: must be 0..40"},
        {"step", "99999999999", "checkpoint metadata \"step\" is 99999999999: must be 0..40"},
        {"step", "41", "checkpoint metadata \"step\" is 41: must be 0..40"},
        {"step", "99999999999999999999", "checkpoint metadata \"step\" is \"99999999999999999999\": not a decimal integer"},
        {"step", "12abc", "checkpoint metadata \"step\" is \"12abc\": not a decimal integer"},
        {"step", "", "checkpoint metadata \"step\" is \"\": not a decimal integer"},
        {"step", " 2", "checkpoint metadata \"step\" is \" 2\": not a decimal integer"},
        {"step", "2 ", "checkpoint metadata \"step\" is \"2 \": not a decimal integer"},
        {"step", "+2", "checkpoint metadata \"step\" is \"+2\": not a decimal integer"},
        {"step", "0x2", "checkpoint metadata \"step\" is \"0x2\": not a decimal integer"},
        {"step", "2.0", "checkpoint metadata \"step\" is \"2.0\": not a decimal integer"},
        {"step", "-", "checkpoint metadata \"step\" is \"-\": not a decimal integer"},
        {"step", "\xff\x01\"x", "checkpoint metadata \"step\" is \"???x\": not a decimal integer"},
        {"step", NULL, "checkpoint metadata \"step\" is missing"},
        /* the optimizer's step count: in 0..step, and with skipped_steps it adds up to step */
        {"opt_t", "-1", "checkpoint metadata \"opt_t\" is -1: must be 0..2"},
        {"opt_t", "3", "checkpoint metadata \"opt_t\" is 3: must be 0..2"},
        {"opt_t", "1", "checkpoint metadata \"opt_t\" is 1: with skipped_steps 0 it must add up to step 2"},
        {"opt_t", "-9223372036854775808", "checkpoint metadata \"opt_t\" is -9223372036854775808: must be 0..2"},
        {"opt_t", "1e3", "checkpoint metadata \"opt_t\" is \"1e3\": not a decimal integer"},
        {"opt_t", NULL, "checkpoint metadata \"opt_t\" is missing"},
        /* the loss scale: a finite number > 0 that a float holds */
        {"loss_scale", "nan", "checkpoint metadata \"loss_scale\" is \"nan\": not a finite decimal number"},
        {"loss_scale", "NaN", "checkpoint metadata \"loss_scale\" is \"NaN\": not a finite decimal number"},
        {"loss_scale", "inf", "checkpoint metadata \"loss_scale\" is \"inf\": not a finite decimal number"},
        {"loss_scale", "-inf", "checkpoint metadata \"loss_scale\" is \"-inf\": not a finite decimal number"},
        {"loss_scale", "1e999", "checkpoint metadata \"loss_scale\" is \"1e999\": not a finite decimal number"},
        {"loss_scale", "0", "checkpoint metadata \"loss_scale\" is 0: must be a finite number > 0"},
        {"loss_scale", "-0", "checkpoint metadata \"loss_scale\" is -0: must be a finite number > 0"},
        {"loss_scale", "-1", "checkpoint metadata \"loss_scale\" is -1: must be a finite number > 0"},
        {"loss_scale", "1e39", "checkpoint metadata \"loss_scale\" is 1e39: must be a finite number > 0 (as a float)"},
        {"loss_scale", "1e-50", "checkpoint metadata \"loss_scale\" is 1e-50: must be a finite number > 0 (as a float)"},
        {"loss_scale", "0x1p4", "checkpoint metadata \"loss_scale\" is \"0x1p4\": not a finite decimal number"},
        {"loss_scale", " 1", "checkpoint metadata \"loss_scale\" is \" 1\": not a finite decimal number"},
        {"loss_scale", "1.5x", "checkpoint metadata \"loss_scale\" is \"1.5x\": not a finite decimal number"},
        {"loss_scale", "", "checkpoint metadata \"loss_scale\" is \"\": not a finite decimal number"},
        {"loss_scale", "e", "checkpoint metadata \"loss_scale\" is \"e\": not a finite decimal number"},
        /* the scaler's growth tracker and the skipped steps: in 0..step */
        {"growth_tracker", "-1", "checkpoint metadata \"growth_tracker\" is -1: must be 0..2"},
        {"growth_tracker", "3", "checkpoint metadata \"growth_tracker\" is 3: must be 0..2"},
        {"growth_tracker", "9223372036854775807", "checkpoint metadata \"growth_tracker\" is 9223372036854775807: must be 0..2"},
        {"skipped_steps", "-1", "checkpoint metadata \"skipped_steps\" is -1: must be 0..2"},
        {"skipped_steps", "3", "checkpoint metadata \"skipped_steps\" is 3: must be 0..2"},
        {"skipped_steps", "1", "checkpoint metadata \"opt_t\" is 2: with skipped_steps 1 it must add up to step 2"},
        {"skipped_steps", "x", "checkpoint metadata \"skipped_steps\" is \"x\": not a decimal integer"},
        {"format", "trainq-checkpoint-2", "checkpoint metadata \"format\" is \"trainq-checkpoint-2\": must be \"trainq-checkpoint-1\""},
        {"format", NULL, "checkpoint metadata \"format\" is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_bad(src, js, META_T(cases[i].key, cases[i].value), cases[i].needle);
    rm_dir(src);
}

static void test_tensors(void **state) {
    char *src = make_ckpt("cnn", "", 2);
    char js[1024];
    job(js, sizeof js, "cnn", "", TOTAL);
    /* fc2.weight is [10,128]: transposed (same bytes), a dimension short, another dtype */
    expect_bad(src, js, &(tamper){ .tensor = "fc2.weight", .ndim = 2, .shape = {128, 10} },
               "tensor \"fc2.weight\" has shape [128,10], the model needs [10,128]");
    expect_bad(src, js, &(tamper){ .tensor = "fc2.weight", .ndim = 1, .shape = {1280} },
               "tensor \"fc2.weight\" has shape [1280], the model needs [10,128]");
    expect_bad(src, js, &(tamper){ .tensor = "fc2.weight", .ndim = 2, .shape = {5, 128}, .bytes_div = 2 },
               "tensor \"fc2.weight\" has shape [5,128], the model needs [10,128]");
    expect_bad(src, js, &(tamper){ .tensor = "fc2.weight", .dtype = "I32", .ndim = -1 },
               "tensor \"fc2.weight\" must be F32, got I32");
    expect_bad(src, js, &(tamper){ .tensor = "conv1.weight", .dtype = "F16", .ndim = -1, .bytes_div = 2 },
               "tensor \"conv1.weight\" must be F32, got F16");
    expect_bad(src, js, &(tamper){ .tensor = "conv1.bias", .dtype = "U8", .ndim = 2, .shape = {32, 4} },
               "tensor \"conv1.bias\" has shape [32,4], the model needs [32]");
    /* the optimizer state: F32 [nparam_elems] */
    tq_st_file *f;
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", src);
    assert_non_null(f = tq_st_open(path, err, sizeof err));
    const tq_st_tensor *opt = tq_st_find(f, "trainq.optimizer.state_a");
    assert_non_null(opt);
    assert_int_equal(opt->ndim, 1);
    int64_t P = opt->shape[0];
    tq_st_close(f);
    expect_bad(src, js, &(tamper){ .tensor = "trainq.optimizer.state_a", .ndim = 2, .shape = {1, P} },
               "optimizer state \"trainq.optimizer.state_a\" missing or of the wrong dtype/shape (F32 [1,");
    expect_bad(src, js, &(tamper){ .tensor = "trainq.optimizer.state_a", .dtype = "I32", .ndim = -1 },
               "optimizer state \"trainq.optimizer.state_a\" missing or of the wrong dtype/shape (I32 [");
    if (P % 2 == 0)
        expect_bad(src, js, &(tamper){ .tensor = "trainq.optimizer.state_a", .ndim = 1, .shape = {P / 2}, .bytes_div = 2 },
                   "optimizer state \"trainq.optimizer.state_a\" missing or of the wrong dtype/shape");
    /* a checkpoint of another optimizer: adamw's resumed as sgd and sgd's as adamw */
    char *adam = make_ckpt("cnn", "\"optimizer\":{\"type\":\"adamw\"}", 2);
    char ja[1024];
    job(ja, sizeof ja, "cnn", "\"optimizer\":{\"type\":\"adamw\"}", TOTAL);
    expect_bad(src, ja, META_T(NULL, NULL), "optimizer state \"trainq.optimizer.state_b\" missing");
    expect_bad(adam, js, META_T(NULL, NULL), "optimizer state \"trainq.optimizer.state_b\" is not used by this job's optimizer");
    rm_dir(adam);
    rm_dir(src);
}

static void test_bn_counts_and_fp16(void **state) {
    /* resnet20 has batch norms (num_batches_tracked, I64); fp16 with growth_interval 3 bounds
     * the growth tracker below 3 */
    const char *extra = "\"amp\":\"fp16\",\"loss_scale\":{\"growth_interval\":3}";
    char *src = make_ckpt("resnet20", extra, 5);
    char js[1024];
    job(js, sizeof js, "resnet20", extra, TOTAL);
    expect_bad(src, js, &(tamper){ .tensor = "bn1.num_batches_tracked", .ndim = -1, .bytes_div = -1, .i64 = -3 },
               "tensor \"bn1.num_batches_tracked\" is -3: must be 0..4611686018427387904");
    expect_bad(src, js, &(tamper){ .tensor = "bn1.num_batches_tracked", .ndim = -1, .bytes_div = -1, .i64 = INT64_MAX },
               "tensor \"bn1.num_batches_tracked\" is 9223372036854775807: must be 0..");
    expect_bad(src, js, &(tamper){ .tensor = "bn1.num_batches_tracked", .dtype = "F64", .ndim = -1 },
               "tensor \"bn1.num_batches_tracked\" must be I64, got F64");
    expect_bad(src, js, &(tamper){ .tensor = "bn1.num_batches_tracked", .ndim = 1, .shape = {1} },
               "tensor \"bn1.num_batches_tracked\" has shape [1], the model needs []");
    expect_bad(src, js, META_T("growth_tracker", "3"),
               "checkpoint metadata \"growth_tracker\" is 3: must be 0..2 (at most step, below growth_interval)");
    expect_bad(src, js, META_T("loss_scale", "0"), "checkpoint metadata \"loss_scale\" is 0: must be");
    expect_bad(src, js, META_T("loss_scale", "nan"), "checkpoint metadata \"loss_scale\" is \"nan\"");
    expect_bad(src, js, META_T("step", "-5"), "checkpoint metadata \"step\" is -5: must be 0..40");
    /* untampered, it resumes: steps 6..40 */
    char *d = tmpdir();
    tamper_copy(src, d, META_T(NULL, NULL));
    tq_summary sum;
    recs r;
    assert_int_equal(train(js, d, 1, &sum, &r), 0);
    assert_string_equal(sum.state, "succeeded");
    assert_int_equal(sum.steps, TOTAL);
    assert_int_equal(r.n, TOTAL - 5);
    assert_int_equal(r.first, 6);
    rm_dir(d);
    rm_dir(src);
}

static void test_valid_resumes(void **state) {
    char *src = make_ckpt("cnn", "", 2);
    char js[1024];
    job(js, sizeof js, "cnn", "", TOTAL);
    tq_summary sum;
    recs r;
    /* as written, and rewritten with every metadata value kept: resumes at step 3 */
    for (int k = 0; k < 2; k++) {
        char *d = tmpdir();
        tamper_copy(src, d, META_T(NULL, NULL));
        assert_int_equal(train(js, d, 1, &sum, &r), 0);
        assert_string_equal(sum.state, "succeeded");
        assert_int_equal(sum.steps, TOTAL);
        assert_int_equal(r.n, TOTAL - 2);
        assert_int_equal(r.first, 3);
        rm_dir(d);
    }
    /* a checkpoint at the job's last step (step == total): nothing left to train, succeeded */
    job(js, sizeof js, "cnn", "", 2);
    char *d = tmpdir();
    tamper_copy(src, d, META_T(NULL, NULL));
    assert_int_equal(train(js, d, 1, &sum, &r), 0);
    assert_string_equal(sum.state, "succeeded");
    assert_int_equal(sum.steps, 2);
    assert_int_equal(r.n, 0);
    rm_dir(d);
    /* step 0 (with opt_t 0, tracker 0): the whole job */
    job(js, sizeof js, "cnn", "", 3);
    d = tmpdir();
    char dd[512];
    snprintf(dd, sizeof dd, "%s/x", d);
    assert_int_equal(mkdir(dd, 0755), 0);
    tamper_copy(src, dd, META_T("step", "0"));
    tamper_copy(dd, d, META_T("opt_t", "0"));
    assert_int_equal(train(js, d, 1, &sum, &r), 0);
    assert_string_equal(sum.state, "succeeded");
    assert_int_equal(r.n, 3);
    assert_int_equal(r.first, 1);
    rm_dir(d);
    rm_dir(src);
}

/* The bound is the resuming job's total: a step-2 checkpoint does not fit a 1-step job. */
static void test_total_bound(void **state) {
    char *src = make_ckpt("cnn", "", 2);
    char js[1024];
    char *d = tmpdir();
    tamper_copy(src, d, META_T(NULL, NULL));
    tq_summary sum;
    recs r;
    job(js, sizeof js, "cnn", "", 1);
    assert_int_not_equal(train(js, d, 1, &sum, &r), 0);
    assert_string_equal(sum.error_code, "invalid_checkpoint");
    assert_non_null(strstr(sum.error_message, "checkpoint metadata \"step\" is 2: must be 0..1"));
    assert_non_null(strstr(sum.error_message, d));   /* names the file */
    rm_dir(d);
    rm_dir(src);
}

/* ---------------------------------------------------------------- fuzz regressions */

static void put_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static size_t be_header(uint8_t *p, const uint32_t *v, int k) {
    for (int i = 0; i < k; i++)
        for (int b = 0; b < 4; b++) p[4 * i + b] = (uint8_t)(v[i] >> (8 * (3 - b)));
    return 4 * (size_t)k;
}

/* fuzz_idx: a 16-byte IDX header promising 3000 images of 1024×1024 (labels agreeing) made the
 * loader allocate 3 GB before reading a byte of them (2^51 bytes for INT32_MAX images: an
 * out-of-memory instead of invalid data). Now the promise is checked against what the file can
 * hold first (plain: its size; gzip: 1032 × its size). */
static void test_fuzz_idx_header_promises_too_much(void **state) {
    char *d = tmpdir();
    uint8_t buf[64];
    const uint32_t tr_img[4] = {2051, 3000, 1024, 1024}, tr_lab[2] = {2049, 3000};
    const uint32_t te_img[4] = {2051, 1, 4, 4}, te_lab[2] = {2049, 1};
    put_file(d, "train-images-idx3-ubyte", buf, be_header(buf, tr_img, 4));
    memset(buf, 0, sizeof buf);
    size_t k = be_header(buf, tr_lab, 2);
    put_file(d, "train-labels-idx1-ubyte", buf, k + 3000 > sizeof buf ? sizeof buf : k + 3000);
    k = be_header(buf, te_img, 4);
    memset(buf + k, 7, 16);
    put_file(d, "t10k-images-idx3-ubyte", buf, k + 16);
    k = be_header(buf, te_lab, 2);
    buf[k] = 1;
    put_file(d, "t10k-labels-idx1-ubyte", buf, k + 1);
    tq_dataset ds;
    char err[512];
    int rc = tq_dataset_load(&ds, "fashion-mnist", d, NULL, 0, 0, 1, err, sizeof err);
    assert_int_equal(rc, TQ_EDATA);
    if (!strstr(err, "more than the file")) fprintf(stderr, "%s\n", err);
    assert_non_null(strstr(err, "train-labels-idx1-ubyte: truncated: the header says 3000 samples of 1 bytes, more than the file (64 bytes) can hold"));
    /* the labels whole, the images still a bare header */
    uint8_t *lab = calloc(1, 8 + 3000);
    be_header(lab, tr_lab, 2);
    put_file(d, "train-labels-idx1-ubyte", lab, 8 + 3000);
    free(lab);
    rc = tq_dataset_load(&ds, "fashion-mnist", d, NULL, 0, 0, 1, err, sizeof err);
    assert_int_equal(rc, TQ_EDATA);
    assert_non_null(strstr(err, "train-images-idx3-ubyte: truncated: the header says 3000 samples of 1048576 bytes"));
    /* the same promise gzip'd: 1032 × a 36-byte file is still far short of 3 GB */
    char path[512];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", d);
    gzFile gz = gzopen(path, "wb");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, buf, (unsigned)be_header(buf, tr_img, 4)), 16);
    assert_int_equal(gzclose(gz), Z_OK);
    rc = tq_dataset_load(&ds, "fashion-mnist", d, NULL, 0, 0, 1, err, sizeof err);
    assert_int_equal(rc, TQ_EDATA);
    assert_non_null(strstr(err, "train-images-idx3-ubyte.gz: truncated: the header says 3000 samples"));
    assert_non_null(strstr(err, "bytes of gzip) can hold"));
    rm_dir(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metadata_numbers),
        cmocka_unit_test(test_tensors),
        cmocka_unit_test(test_bn_counts_and_fp16),
        cmocka_unit_test(test_valid_resumes),
        cmocka_unit_test(test_total_bound),
        cmocka_unit_test(test_fuzz_idx_header_promises_too_much),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
