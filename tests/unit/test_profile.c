/* test_profile.c — the per-op profile (train/profile.c, `trainq run --profile`) on the CPU.
 *
 * - Ops through the timing table give the same bits as the backend's own, timed only while
 *   the profile is on; each (op, dtype, shape) is one entry with its calls, its FLOPs
 *   (convolutions, linear layers) and its least memory traffic, computed here by hand.
 * - Detaching gives the backend its own table back; later ops are not counted.
 * - Hundreds of shapes: every entry found again after the report sorted them.
 * - The JSON report: its totals and every entry; an unwritable path is an error naming it.
 * - A profiled training run records the same steps and evaluations, bit for bit, as an
 *   unprofiled one, profiles the steps after the warm-up, and runs the step from the host
 *   even where the step on the device was asked for.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "tmpdir.h"
#include "backend.h"
#include "profile.h"
#include "spec.h"
#include "trainer.h"

static uint64_t rng = 777;
static float frand(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) & 0xffff) / 32768.0f - 1.0f;
}

static const tq_prof_entry *find(tq_prof *p, const char *op, const char *dt, const char *shape) {
    int n;
    const tq_prof_entry *e = tq_prof_entries(p, &n);
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].op, op) && !strcmp(e[i].dtype, dt) && !strcmp(e[i].shape, shape)) return &e[i];
    return NULL;
}

static void test_ops_timed_and_unchanged(void **state) {
    (void)state;
    tq_backend *be = tq_cpu_backend_new(2);
    assert_non_null(be);
    const tq_backend_i *own = be->i;
    tq_conv_desc d = { { 2, 6, 6, 8 }, 8, 3, 3, 1, 1 };
    size_t nx = 2 * 6 * 6 * 8, nw = 8 * 3 * 3 * 8, ws_bytes = own->conv_ws(be, &d, TQ_F32);
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *y1 = malloc(nx * 4), *y2 = malloc(nx * 4), *y3 = malloc(nx * 4);
    float *g = malloc(nx * 4), *buf = calloc(nx, 4), *wt = malloc(nx * 4);
    uint16_t *h = malloc(nx * 2);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    assert_true(x && w && y1 && y2 && y3 && g && buf && wt && h && ws);
    for (size_t i = 0; i < nx; i++) { x[i] = frand(); g[i] = frand(); wt[i] = frand(); }
    for (size_t i = 0; i < nw; i++) w[i] = frand();
    assert_int_equal(own->conv_fwd(be, &d, TQ_F32, y1, x, w, NULL, ws, ws_bytes), 0);

    float scratch = 7.0f;
    tq_prof *p = tq_prof_attach(be, &scratch);   /* calibrates on it, untimed: no entry */
    assert_non_null(p);
    assert_true(scratch == 0.0f);
    assert_ptr_not_equal(be->i, own);
    assert_ptr_equal(be->prof, p);
    assert_int_equal(be->i->conv_fwd(be, &d, TQ_F32, y2, x, w, NULL, ws, ws_bytes), 0);   /* off: passes through */
    int n;
    tq_prof_entries(p, &n);
    assert_int_equal(n, 0);
    assert_memory_equal(y1, y2, nx * 4);

    tq_prof_set(p, 1);
    for (int k = 0; k < 2; k++) assert_int_equal(be->i->conv_fwd(be, &d, TQ_F32, y3, x, w, NULL, ws, ws_bytes), 0);
    assert_memory_equal(y1, y3, nx * 4);
    assert_int_equal(be->i->relu_fwd(be, nx, TQ_F32, y3, y3), 0);
    assert_int_equal(be->i->cast(be, nx, TQ_F16, h, TQ_F32, x), 0);
    assert_int_equal(be->i->sgd_step(be, nx, wt, g, buf, 0.1f, 0.9f, 1e-4f, 1, NULL, NULL, TQ_F32), 0);
    be->i->memset0(be, g, nx * 4);
    tq_prof_set(p, 0);
    assert_int_equal(be->i->relu_fwd(be, nx, TQ_F32, y3, y3), 0);   /* off again: not counted */

    const tq_prof_entry *c = find(p, "conv_fwd", "f32", "x 2x6x6x8 k8 3x3 s1 p1");
    assert_non_null(c);
    assert_string_equal(c->kind, "conv");
    assert_int_equal(c->calls, 2);
    assert_true(c->ms >= 0);
    assert_true(c->flops == 2.0 * 2 * 6 * 6 * 8 * 8 * 3 * 3);
    assert_true(c->bytes == 4.0 * (nx + nx + nw));
    const tq_prof_entry *r = find(p, "relu_fwd", "f32", "n 576");
    assert_non_null(r);
    assert_int_equal(r->calls, 1);
    assert_true(r->bytes == 2.0 * 4 * nx && r->flops == 0);
    const tq_prof_entry *cs = find(p, "cast", "f32>f16", "n 576");
    assert_non_null(cs);
    assert_true(cs->bytes == 6.0 * nx);
    const tq_prof_entry *s = find(p, "sgd_step", "f32", "n 576");
    assert_non_null(s);
    assert_string_equal(s->kind, "optimizer");
    assert_true(s->bytes == 20.0 * nx);
    assert_non_null(find(p, "memset0", "-", "2304 B"));
    tq_prof_entries(p, &n);
    assert_int_equal(n, 5);

    tq_prof_detach(p);
    assert_ptr_equal(be->i, own);
    assert_null(be->prof);
    tq_prof_set(p, 1);
    assert_int_equal(be->i->relu_fwd(be, nx, TQ_F32, y3, y3), 0);
    assert_int_equal(find(p, "relu_fwd", "f32", "n 576")->calls, 1);
    tq_prof_free(p);
    free(x); free(w); free(y1); free(y2); free(y3); free(g); free(buf); free(wt); free(h); free(ws);
    tq_backend_free(be);
}

static void test_many_shapes_found_after_sorting(void **state) {
    (void)state;
    tq_backend *be = tq_cpu_backend_new(1);
    assert_non_null(be);
    float *v = calloc(700, 4);
    assert_non_null(v);
    tq_prof *p = tq_prof_attach(be, NULL);
    assert_non_null(p);
    tq_prof_set(p, 1);
    for (int round = 0; round < 3; round++) {
        for (size_t k = 1; k <= 600; k++) assert_int_equal(be->i->relu_fwd(be, k, TQ_F32, v, v), 0);
        int n;
        const tq_prof_entry *e = tq_prof_entries(p, &n);   /* sorts: the lookups must still find them */
        assert_int_equal(n, 600);
        for (int i = 0; i < n; i++) {
            assert_int_equal(e[i].calls, round + 1);
            if (i) assert_true(e[i - 1].ms >= e[i].ms);
        }
    }
    char shape[32];
    for (size_t k = 1; k <= 600; k += 97) {
        snprintf(shape, sizeof shape, "n %zu", k);
        assert_non_null(find(p, "relu_fwd", "f32", shape));
    }
    tq_prof_free(p);
    free(v);
    tq_backend_free(be);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* the JSON in path, parsed (the test fails when it is not there or not JSON) */
static cJSON *load_json(const char *path) {
    char *text = slurp(path);
    assert_non_null(text);
    cJSON *o = cJSON_Parse(text);
    free(text);
    assert_non_null(o);
    return o;
}
static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsNumber(v)) fail_msg("%s: not a number", key);
    return v->valuedouble;
}

static void test_json_report(void **state) {
    (void)state;
    tq_backend *be = tq_cpu_backend_new(1);
    float *v = calloc(64, 4);
    assert_true(be && v);
    tq_prof *p = tq_prof_attach(be, NULL);
    assert_non_null(p);
    for (int s = 0; s < 2; s++) {
        tq_prof_set(p, 1);
        assert_int_equal(be->i->relu_fwd(be, 64, TQ_F32, v, v), 0);
        assert_int_equal(be->i->add_fwd(be, 64, TQ_F32, v, v, v), 0);
        tq_prof_set(p, 0);
        tq_prof_step(p, s ? 3.0 : 5.0);
    }
    tq_prof_detach(p);
    char *dir = tq_tmpdir("tq_profile"), path[600], err[256];
    assert_non_null(dir);
    snprintf(path, sizeof path, "%s/p.json", dir);
    tq_prof_meta m = { "cpu", "cnn", "off", 16, 2, 1, 3 };
    assert_int_equal(tq_prof_write(p, &m, path, err, sizeof err), 0);
    cJSON *o = load_json(path);
    assert_true(num(o, "steps_profiled") == 2 && num(o, "step_ms_median") == 4.0 && num(o, "step_ms_mean") == 4.0);
    assert_true(num(o, "warmup_steps") == 3);
    assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "cnn");
    assert_true(num(cJSON_GetObjectItem(o, "ms_per_step_by_kind"), "elementwise") >= 0);
    cJSON *ops = cJSON_GetObjectItem(o, "ops");
    assert_int_equal(cJSON_GetArraySize(ops), 2);
    cJSON *it;
    cJSON_ArrayForEach(it, ops) {
        assert_true(num(it, "calls_per_step") == 1);
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(it, "gflop_per_s")));
        const char *op = cJSON_GetObjectItem(it, "op")->valuestring;
        double bytes = num(it, "bytes_per_call");
        assert_true(!strcmp(op, "relu_fwd") ? bytes == 512 : !strcmp(op, "add_fwd") && bytes == 768);
        assert_string_equal(cJSON_GetObjectItem(it, "shape")->valuestring, "n 64");
    }
    cJSON_Delete(o);
    assert_int_equal(tq_prof_write(p, &m, "/nonexistent-dir/p.json", err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent-dir/p.json"));
    tq_prof_free(p);
    free(v);
    free(dir);
    tq_backend_free(be);
}

/* ---- a profiled training run ---- */

#define MAXREC 32
typedef struct { tq_step_rec steps[MAXREC]; int n; tq_eval_rec evals[8]; int ne; } recs;
static int on_step(void *ctx, const tq_step_rec *r) { recs *c = ctx; if (c->n < MAXREC) c->steps[c->n++] = *r; return 0; }
static int on_eval(void *ctx, const tq_eval_rec *r) { recs *c = ctx; if (c->ne < 8) c->evals[c->ne++] = *r; return 0; }

static void run(const char *json, const char *profile, recs *r, tq_summary *sum) {
    tq_spec sp;
    tq_spec_err e;
    int rc = tq_spec_parse(&sp, json, &e);
    if (rc) fail_msg("spec: %s: %s", e.field, e.message);
    memset(r, 0, sizeof *r);
    tq_run_opts o = { NULL, 0, { r, on_step, on_eval, NULL, NULL }, 0, profile, 0, NULL, NULL };
    assert_int_equal(tq_train(&sp, &o, sum), 0);
}

static void test_profiled_run_same_bits(void **state) {
    (void)state;
    const char *spec =
        "{\"model\":\"cnn\",\"batch_size\":16,\"accum_steps\":2,\"steps\":8,\"amp\":\"fp16\",\"augment\":true,"
        "\"eval_every\":3,\"optimizer\":{\"type\":\"adamw\",\"lr\":0.002},\"dataset\":\"synthetic\","
        "\"synthetic\":{\"train\":256,\"test\":32,\"height\":12,\"width\":12,\"channels\":1},\"threads\":2,"
        "\"device\":\"cpu\"}";
    char *dir = tq_tmpdir("tq_profile_run"), path[600];
    assert_non_null(dir);
    snprintf(path, sizeof path, "%s/profile.json", dir);
    static recs a, b, c;
    tq_summary sa, sb, sc;
    run(spec, NULL, &a, &sa);
    run(spec, path, &b, &sb);
    assert_int_equal(a.n, 8);
    assert_int_equal(b.n, 8);
    for (int i = 0; i < a.n; i++) {
        if (memcmp(&a.steps[i].loss, &b.steps[i].loss, sizeof(double)))
            fail_msg("step %d: loss %.17g without the profile, %.17g with it", i + 1, a.steps[i].loss, b.steps[i].loss);
        assert_memory_equal(&a.steps[i].loss_scale, &b.steps[i].loss_scale, sizeof(double));
    }
    assert_int_equal(a.ne, b.ne);
    for (int i = 0; i < a.ne; i++) assert_memory_equal(&a.evals[i].loss, &b.evals[i].loss, sizeof(double));
    cJSON *o = load_json(path);
    assert_true(num(o, "steps_profiled") == 5 && num(o, "warmup_steps") == 3 && num(o, "accum_steps") == 2);
    /* per step: each of cnn's two convolutions runs forward and backward-filter once per micro-batch */
    double fwd = 0, bwdf = 0, evals = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "ops")) {
        const char *op = cJSON_GetObjectItem(it, "op")->valuestring;
        double k = num(it, "calls_per_step");
        if (!strcmp(op, "conv_fwd")) fwd += k;
        if (!strcmp(op, "conv_bwd_filter")) bwdf += k;
        if (!strcmp(op, "softmax_ce_eval") || !strcmp(op, "bn_fwd_infer")) evals += k;
        const char *dt = cJSON_GetObjectItem(it, "dtype")->valuestring;
        if (strcmp(dt, "f16") && strcmp(dt, "f32") && strcmp(dt, "-") && strcmp(dt, "f32>f16"))
            fail_msg("%s: dtype %s in an fp16 run", op, dt);
    }
    assert_true(fwd == 4 && bwdf == 4);
    assert_true(evals == 0);   /* the evaluations stay out of the profile */
    cJSON_Delete(o);

    /* the step on the device asked for: the profile issues it from the host, same bits */
    setenv("TQ_DEVICE_STEP", "1", 1);
    run(spec, path, &c, &sc);
    unsetenv("TQ_DEVICE_STEP");
    assert_string_equal(sc.cuda_graphs, "off");
    for (int i = 0; i < a.n; i++) assert_memory_equal(&a.steps[i].loss, &c.steps[i].loss, sizeof(double));
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_timed_and_unchanged),
        cmocka_unit_test(test_many_shapes_found_after_sorting),
        cmocka_unit_test(test_json_report),
        cmocka_unit_test(test_profiled_run_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
