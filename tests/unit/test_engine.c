/* test_engine.c — whole-engine properties on small synthetic data: the memory planner
 * (predicted == measured, fp16 activations ≤ 0.55× fp32), gradient accumulation equivalence,
 * the fp16 loss scaler (overflow skips and halves, growth after growth_interval), fp16/bf16
 * tracking fp32, and the failure paths of bad input. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "tmpdir.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "trainer.h"
#include "safetensors.h"
#include "spec.h"

#define MAXREC 256
typedef struct { tq_step_rec steps[MAXREC]; int n; tq_eval_rec evals[16]; int ne; } recs;

static int on_step(void *ctx, const tq_step_rec *r) { recs *c = ctx; if (c->n < MAXREC) c->steps[c->n++] = *r; return 0; }
static int on_eval(void *ctx, const tq_eval_rec *r) { recs *c = ctx; if (c->ne < 16) c->evals[c->ne++] = *r; return 0; }

static void spec_from(tq_spec *sp, const char *json) {
    tq_spec_err e;
    int rc = tq_spec_parse(sp, json, &e);
    if (rc) fprintf(stderr, "spec error: %s: %s\n", e.field, e.message);
    assert_int_equal(rc, 0);
}

static int run(const char *json, const char *out, recs *r, tq_summary *sum) {
    tq_spec sp;
    spec_from(&sp, json);
    memset(r, 0, sizeof *r);
    tq_run_opts o = {out, 0, {r, on_step, on_eval, NULL, NULL}, 0, NULL, 0, NULL, NULL};
    return tq_train(&sp, &o, sum);
}

static char *tmpdir(void) {
    char *t = tq_tmpdir("tq_engine");
    assert_non_null(t);
    return t;
}

#define SYN_DATA "\"dataset\":\"synthetic\",\"synthetic\":{\"train\":512,\"test\":64,\"height\":28,\"width\":28,\"channels\":1},\"threads\":2"
#define SYN SYN_DATA ",\"device\":\"cpu\""

static void test_planner_predicts_measured(void **st) {
    const char *models[] = {"mlp", "cnn", "resnet20", "resnet18", "resnet50"};
    const int batches[2] = {2, 4};
    for (int m = 0; m < 5; m++)
        for (int b = 0; b < 2; b++)
            for (int amp = 0; amp < 2; amp++) {
                char js[1024];
                snprintf(js, sizeof js, "{\"model\":\"%s\",\"batch_size\":%d,\"steps\":1,\"amp\":\"%s\",%s}",
                         models[m], batches[b], amp ? "fp16" : "off", SYN);
                recs *r = calloc(1, sizeof *r);
                tq_summary sum;
                assert_int_equal(run(js, NULL, r, &sum), 0);
                assert_string_equal(sum.state, "succeeded");
                assert_int_equal(r->n, 1);
                /* predicted == measured, and the step record says the same */
                assert_true(sum.predicted_peak_bytes > 0);
                assert_int_equal(sum.peak_memory_bytes, sum.predicted_peak_bytes);
                assert_int_equal(r->steps[0].mem_peak_bytes, sum.predicted_peak_bytes);
                assert_true(r->steps[0].mem_allocated_bytes < r->steps[0].mem_peak_bytes);
                assert_true(r->steps[0].mem_reserved_bytes >= r->steps[0].mem_peak_bytes);
                free(r);
            }
}

static void plan_of(const char *model, const char *amp, int batch, tq_plan_report *rep) {
    char js[1024], code[32], err[512];
    snprintf(js, sizeof js, "{\"model\":\"%s\",\"batch_size\":%d,\"amp\":\"%s\",%s}", model, batch, amp, SYN);
    tq_spec sp;
    spec_from(&sp, js);
    assert_int_equal(tq_plan_spec(&sp, rep, code, sizeof code, err, sizeof err), 0);
}

static void test_fp16_activation_memory(void **st) {
    const char *models[] = {"mlp", "cnn", "resnet20", "resnet18", "resnet50"};
    for (int m = 0; m < 5; m++) {
        tq_plan_report f32, f16, bf16;
        plan_of(models[m], "off", 64, &f32);
        plan_of(models[m], "fp16", 64, &f16);
        plan_of(models[m], "bf16", 64, &bf16);
        double ratio = (double)f16.plan.activations / (double)f32.plan.activations;
        printf("# %s batch 64: activations fp32 %zu, fp16 %zu (%.3f), bf16 %zu\n", models[m],
               f32.plan.activations, f16.plan.activations, ratio, bf16.plan.activations);
        assert_true(ratio <= 0.55);
        assert_int_equal(f16.plan.activations, bf16.plan.activations);
        assert_int_equal(f32.plan.total, f32.plan.params + f32.plan.grads + f32.plan.optimizer +
                                         f32.plan.activations + f32.plan.workspace);
    }
}

static double rel_diff_files(const char *a, const char *b) {
    char err[256];
    tq_st_file *fa = tq_st_open(a, err, sizeof err), *fb = tq_st_open(b, err, sizeof err);
    assert_non_null(fa); assert_non_null(fb);
    assert_int_equal(tq_st_count(fa), tq_st_count(fb));
    double num = 0, den = 0, worst = 0;
    for (int i = 0; i < tq_st_count(fa); i++) {
        const tq_st_tensor *x = tq_st_at(fa, i), *y = tq_st_find(fb, x->name);
        assert_non_null(y);
        if (strcmp(x->dtype, "F32")) continue;
        num = den = 0;
        for (size_t k = 0; k < x->bytes / 4; k++) {
            double u = ((const float *)x->data)[k], v = ((const float *)y->data)[k];
            num += (u - v) * (u - v); den += u * u;
        }
        double r = sqrt(num / (den > 0 ? den : 1));
        if (r > worst) worst = r;
    }
    tq_st_close(fa); tq_st_close(fb);
    return worst;
}

static void test_accumulation_equivalence(void **st) {
    char *d1 = tmpdir(), *d2 = tmpdir();
    const char *models[] = {"mlp", "cnn"};
    for (int m = 0; m < 2; m++) {
        char js[1024];
        recs *r = calloc(1, sizeof *r);
        tq_summary s1, s2;
        snprintf(js, sizeof js, "{\"model\":\"%s\",\"batch_size\":64,\"accum_steps\":1,\"steps\":20,%s}", models[m], SYN);
        assert_int_equal(run(js, d1, r, &s1), 0);
        snprintf(js, sizeof js, "{\"model\":\"%s\",\"batch_size\":16,\"accum_steps\":4,\"steps\":20,%s}", models[m], SYN);
        assert_int_equal(run(js, d2, r, &s2), 0);
        assert_int_equal(s2.effective_batch, 64);
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/model.safetensors", d1);
        snprintf(b, sizeof b, "%s/model.safetensors", d2);
        double rd = rel_diff_files(a, b);
        printf("# %s: 4x16 vs 1x64 after 20 steps: max relative weight difference %.3g\n", models[m], rd);
        assert_true(rd <= 1e-5);
        assert_true(fabs(s1.final_loss - s2.final_loss) <= 1e-5 * fabs(s1.final_loss) + 1e-6);
        free(r);
    }
    free(d1); free(d2);
}

/* Recomputing ReLU outputs in the backward, fusing BN with the add and ReLU that follow it,
 * and folding a ReLU into the max-pool after it (cnn) change no bit: against separate passes that keep everything (recompute off, TQ_FUSE=0), the
 * same losses every step and the same weights, in fp32, fp16 and bf16; and recomputation does
 * save memory, which the allocator measures as planned either way. */
static void test_recompute_fusion_bit_identical(void **st) {
    char *d0 = tmpdir(), *d1 = tmpdir();
    const char *models[] = {"cnn", "resnet20", "resnet18", "resnet50"};
    const char *amps[] = {"off", "fp16", "bf16"};
    for (int m = 0; m < 4; m++)
        for (int a = 0; a < 3; a++) {
            if (m > 1 && a > 0) continue;   /* the big ones once, in fp32 */
            const char *fmt = "{\"model\":\"%s\",\"batch_size\":%d,\"steps\":%d,\"amp\":\"%s\","
                              "\"recompute\":%s,%s}";
            int b = m <= 1 ? 16 : 4, n = m <= 1 ? 6 : 2;
            char js[1024], pa[512], pb[512];
            recs *r0 = calloc(1, sizeof *r0), *r1 = calloc(1, sizeof *r1);
            tq_summary s0, s1;
            setenv("TQ_FUSE", "0", 1);                       /* the reference: separate, keep all */
            snprintf(js, sizeof js, fmt, models[m], b, n, amps[a], "false", SYN);
            assert_int_equal(run(js, d0, r0, &s0), 0);
            unsetenv("TQ_FUSE");
            assert_string_equal(s0.state, "succeeded");
            assert_int_equal(s0.peak_memory_bytes, s0.predicted_peak_bytes);
            snprintf(pa, sizeof pa, "%s/model.safetensors", d0);
            snprintf(pb, sizeof pb, "%s/model.safetensors", d1);
            for (int rc = 0; rc < 2; rc++) {                  /* fused, keeping all / recomputing */
                snprintf(js, sizeof js, fmt, models[m], b, n, amps[a], rc ? "true" : "false", SYN);
                assert_int_equal(run(js, d1, r1, &s1), 0);
                assert_string_equal(s1.state, "succeeded");
                assert_int_equal(r1->n, n);
                for (int k = 0; k < n; k++) assert_true(r1->steps[k].loss == r0->steps[k].loss);
                assert_true(rel_diff_files(pa, pb) == 0.0);
                assert_int_equal(s1.peak_memory_bytes, s1.predicted_peak_bytes);
                if (rc) assert_true(s1.predicted_peak_bytes < s0.predicted_peak_bytes);
                printf("# %s %s, fused%s: losses and weights identical to separate passes; peak %lld bytes vs %lld (%.3f)\n",
                       models[m], amps[a], rc ? " + recompute" : "", (long long)s1.predicted_peak_bytes,
                       (long long)s0.predicted_peak_bytes, (double)s1.predicted_peak_bytes / (double)s0.predicted_peak_bytes);
            }
            free(r0); free(r1);
        }
    free(d0); free(d1);
}

static void test_fp16_overflow_skips_and_halves(void **st) {
    /* a loss scale of 2^100 overflows fp16 activation gradients at once: every step skips
     * and halves the scale until it fits */
    recs *r = calloc(1, sizeof *r);
    tq_summary sum;
    char js[1024];
    snprintf(js, sizeof js, "{\"model\":\"cnn\",\"batch_size\":16,\"steps\":3,\"amp\":\"fp16\",\"loss_scale\":{\"init\":1.2676506002282294e30},%s}", SYN);
    assert_int_equal(run(js, NULL, r, &sum), 0);
    assert_int_equal(r->n, 3);
    for (int i = 0; i < 3; i++) {
        assert_true(r->steps[i].skipped);
        assert_true(fabs(r->steps[i].loss_scale - 1.2676506002282294e30 / pow(2, i)) < 1e20);
    }
    assert_int_equal(sum.skipped_steps, 3);
    assert_true(fabs(sum.final_loss_scale - 1.2676506002282294e30 / 8) < 1e20);
    free(r);
}

static void test_fp16_skip_leaves_weights(void **st) {
    /* the skipped step must not touch the weights: init_from a model, one overflowing step,
     * the export equals the init */
    char *d = tmpdir(), *d2 = tmpdir();
    recs *r = calloc(1, sizeof *r);
    tq_summary sum;
    char js[2048];
    snprintf(js, sizeof js, "{\"model\":\"mlp\",\"batch_size\":16,\"steps\":1,%s,\"optimizer\":{\"type\":\"sgd\",\"lr\":1e-9,\"momentum\":0,\"nesterov\":false,\"weight_decay\":0}}", SYN);
    assert_int_equal(run(js, d, r, &sum), 0);
    char init[512], out[512];
    snprintf(init, sizeof init, "%s/model.safetensors", d);
    snprintf(js, sizeof js, "{\"model\":\"mlp\",\"batch_size\":16,\"steps\":1,\"amp\":\"fp16\",\"init_from\":\"%s\",\"loss_scale\":{\"init\":1e38},%s}", init, SYN);
    assert_int_equal(run(js, d2, r, &sum), 0);
    assert_true(r->steps[0].skipped);
    snprintf(out, sizeof out, "%s/model.safetensors", d2);
    assert_true(rel_diff_files(init, out) == 0.0);
    free(r); free(d); free(d2);
}

static void test_fp16_scale_grows(void **st) {
    recs *r = calloc(1, sizeof *r);
    tq_summary sum;
    char js[1024];
    snprintf(js, sizeof js, "{\"model\":\"cnn\",\"batch_size\":16,\"steps\":7,\"amp\":\"fp16\",\"loss_scale\":{\"init\":1024,\"growth_interval\":3},%s}", SYN);
    assert_int_equal(run(js, NULL, r, &sum), 0);
    const double expect[7] = {1024, 1024, 1024, 2048, 2048, 2048, 4096};
    for (int i = 0; i < 7; i++) {
        assert_false(r->steps[i].skipped);
        assert_true(r->steps[i].loss_scale == expect[i]);
    }
    assert_true(sum.final_loss_scale == 4096);
    free(r);
}

static void test_reduced_precision_tracks_fp32(void **st) {
    const char *amps[3] = {"off", "fp16", "bf16"};
    /* per-step relative tolerance: 16-bit storage perturbs a chaotic trajectory a little;
     * fp16 has 11 significant bits, bf16 8. Plain SGD at lr 0.01: with the default (0.05,
     * Nesterov momentum 0.9) fp32 alone moves 3.5% by step 9 between two summation orders
     * (oneDNN vs im2col), which would hide what this test is for. */
    const double tol[3] = {0, 0.03, 0.08};
    recs *r[3];
    for (int a = 0; a < 3; a++) {
        r[a] = calloc(1, sizeof *r[a]);
        tq_summary sum;
        char js[1024];
        snprintf(js, sizeof js, "{\"model\":\"resnet20\",\"batch_size\":32,\"steps\":10,\"optimizer\":{\"type\":\"sgd\",\"lr\":0.01,\"momentum\":0},\"amp\":\"%s\",\"shuffle\":false,%s}", amps[a], SYN);
        assert_int_equal(run(js, NULL, r[a], &sum), 0);
        assert_int_equal(sum.skipped_steps, 0);
    }
    for (int a = 1; a < 3; a++)
        for (int i = 0; i < 10; i++) {
            double l32 = r[0]->steps[i].loss, l = r[a]->steps[i].loss;
            if (i == 9) printf("# %s step 10 loss %.5f vs fp32 %.5f\n", amps[a], l, l32);
            assert_true(fabs(l - l32) <= tol[a] * fabs(l32) + 1e-3);
        }
    for (int a = 0; a < 3; a++) free(r[a]);
}

static int g_calls, g_stop_after;
static int stop_fn(void *c) { (void)c; return ++g_calls >= g_stop_after ? 1 : 0; }

static void test_resume_same_numbers(void **st) {
    /* a run stopped after step 4 (checkpoint written on the stop) and resumed gives the same
     * per-step losses and the same final evaluation as an uninterrupted run */
    char *d1 = tmpdir(), *d2 = tmpdir();
    char js[1024];
    snprintf(js, sizeof js, "{\"model\":\"resnet20\",\"batch_size\":16,\"steps\":8,\"checkpoint_every\":3,\"augment\":true,%s}", SYN);
    recs *full = calloc(1, sizeof *full), *part = calloc(1, sizeof *part);
    tq_summary s, ps, rs;
    assert_int_equal(run(js, d1, full, &s), 0);
    tq_spec sp;
    spec_from(&sp, js);
    tq_run_opts o = {d2, 0, {part, on_step, on_eval, stop_fn, NULL}, 0, NULL, 0, NULL, NULL};
    g_calls = 0; g_stop_after = 4;
    assert_int_equal(tq_train(&sp, &o, &ps), 0);
    assert_string_equal(ps.state, "cancelled");
    assert_int_equal(ps.steps, 4);
    o.cb.should_stop = NULL;
    o.resume = 1;
    assert_int_equal(tq_train(&sp, &o, &rs), 0);
    assert_string_equal(rs.state, "succeeded");
    assert_int_equal(part->n, 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(part->steps[i].step, i + 1);
        assert_true(part->steps[i].loss == full->steps[i].loss);
    }
    assert_true(rs.val_accuracy == s.val_accuracy);
    assert_true(rs.val_loss == s.val_loss);
    free(full); free(part); free(d1); free(d2);
}

static void expect_failure(const char *json, const char *code, const char *needle) {
    recs *r = calloc(1, sizeof *r);
    tq_summary sum;
    assert_int_not_equal(run(json, NULL, r, &sum), 0);
    assert_string_equal(sum.state, "failed");
    if (strcmp(sum.error_code, code)) fprintf(stderr, "got %s: %s\n", sum.error_code, sum.error_message);
    assert_string_equal(sum.error_code, code);
    if (!strstr(sum.error_message, needle)) fprintf(stderr, "message: %s\n", sum.error_message);
    assert_non_null(strstr(sum.error_message, needle));
    free(r);
}

static void count_ready(void *ctx) { ++*(int *)ctx; }

/* the CPU backend's mem_info as a GPU's (backend.h): -1 none, else these bytes free */
static long long g_device_free = -1;
long long tq_cpu_device_free(void) { return g_device_free; }

static void test_bad_input(void **st) {
    char *d = tmpdir();
    char js[2048], path[512];
    /* missing dataset */
    expect_failure("{\"model\":\"cnn\",\"data_dir\":\"/nonexistent/fmnist\",\"steps\":1}", "data_not_found", "/nonexistent/fmnist");
    /* corrupt dataset: a truncated gzip */
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", d);
    FILE *f = fopen(path, "wb"); fputs("garbage", f); fclose(f);
    const char *names[] = {"train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 3; i++) { snprintf(path, sizeof path, "%s/%s", d, names[i]); f = fopen(path, "wb"); fputs("garbage", f); fclose(f); }
    snprintf(js, sizeof js, "{\"model\":\"cnn\",\"data_dir\":\"%s\",\"steps\":1}", d);
    expect_failure(js, "invalid_data", "train-images-idx3-ubyte");
    /* corrupt init_from */
    snprintf(path, sizeof path, "%s/bad.safetensors", d);
    f = fopen(path, "wb"); fputs("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":", f); fclose(f);
    snprintf(js, sizeof js, "{\"model\":\"cnn\",\"steps\":1,\"init_from\":\"%s\",%s}", path, SYN);
    expect_failure(js, "invalid_init_from", "bad.safetensors");
    /* init_from of another model */
    char *d2 = tmpdir();
    recs *r = calloc(1, sizeof *r);
    tq_summary sum;
    snprintf(js, sizeof js, "{\"model\":\"mlp\",\"batch_size\":16,\"steps\":1,%s}", SYN);
    assert_int_equal(run(js, d2, r, &sum), 0);
    snprintf(js, sizeof js, "{\"model\":\"cnn\",\"steps\":1,\"init_from\":\"%s/model.safetensors\",%s}", d2, SYN);
    expect_failure(js, "invalid_init_from", "missing tensor \"conv1.weight\"");
    /* a batch over max_memory_mb */
    snprintf(js, sizeof js, "{\"model\":\"resnet50\",\"batch_size\":256,\"steps\":1,\"max_memory_mb\":64,%s}", SYN);
    expect_failure(js, "memory_limit", "max_memory_mb 64");
    /* cuda in a CPU-only build */
    expect_failure("{\"model\":\"cnn\",\"steps\":1,\"device\":\"cuda\"," SYN_DATA "}", "device_unavailable", "device \"cuda\" requested, but ");
    /* a GPU the daemon placed the job on that cannot be opened (here: none): the placement's
     * failure, with the requeue that retries it, not advice to change the spec's device */
    {
        tq_spec sp;
        spec_from(&sp, "{\"model\":\"cnn\",\"steps\":1,\"device\":\"cuda:0\"," SYN_DATA "}");
        tq_run_opts o = {NULL, 0, {r, on_step, on_eval, NULL, NULL}, 0, NULL, 1, NULL, NULL};
        assert_int_not_equal(tq_train(&sp, &o, &sum), 0);
        assert_string_equal(sum.error_code, "device_unavailable");
        if (strncmp(sum.error_message, "placed on cuda:0, but ", 22) || !strstr(sum.error_message, "/requeue"))
            fail_msg("message: %s", sum.error_message);
        assert_int_equal(sum.device_busy, 0);   /* missing, not busy: the job's failure */
        /* a placed device found busy (TQ_TEST_DEVICE_BUSY stands in for another process): the
         * summary says so, for the worker to hand the job back; unplaced, the hook is ignored */
        char busy[600];
        snprintf(busy, sizeof busy, "%s/busy", d);
        FILE *bf = fopen(busy, "w");
        assert_non_null(bf);
        fclose(bf);
        setenv("TQ_TEST_DEVICE_BUSY", busy, 1);
        spec_from(&sp, "{\"model\":\"cnn\",\"steps\":1,\"device\":\"cpu\"," SYN_DATA "}");
        assert_int_not_equal(tq_train(&sp, &o, &sum), 0);
        assert_int_equal(sum.device_busy, 1);
        assert_string_equal(sum.error_code, "device_unavailable");
        if (!strstr(sum.error_message, "placed on cpu, but the device is busy")) fail_msg("message: %s", sum.error_message);
        o.placed = 0;
        assert_int_equal(tq_train(&sp, &o, &sum), 0);
        assert_int_equal(sum.device_busy, 0);
        assert_string_equal(sum.state, "succeeded");
        o.placed = 1;
        remove(busy);   /* gone: the placed job trains */
        assert_int_equal(tq_train(&sp, &o, &sum), 0);
        assert_string_equal(sum.state, "succeeded");
        unsetenv("TQ_TEST_DEVICE_BUSY");
        /* its device has less free than its plan: placed there where the daemon saw the driver's
         * free memory hold the plan (placed 2), another process took memory since — busy, back
         * to the queue; placed by the budget alone (1) or unplaced, the job's failure */
        g_device_free = 1024;
        o.placed = 2;
        int ready = 0;
        o.on_ready = count_ready;
        o.ready_ctx = &ready;
        assert_int_not_equal(tq_train(&sp, &o, &sum), 0);
        assert_int_equal(ready, 0);   /* never held: not ready */
        assert_string_equal(sum.error_code, "out_of_memory");
        assert_int_equal(sum.device_busy, 1);
        if (!strstr(sum.error_message, "another process took memory since the placement"))
            fail_msg("message: %s", sum.error_message);
        for (int pl = 1; pl >= 0; pl--) {
            o.placed = pl;
            assert_int_not_equal(tq_train(&sp, &o, &sum), 0);
            assert_string_equal(sum.error_code, "out_of_memory");
            assert_int_equal(sum.device_busy, 0);
        }
        g_device_free = 1LL << 40;   /* room: it trains, and says so once, before its first step */
        o.placed = 2;
        assert_int_equal(tq_train(&sp, &o, &sum), 0);
        assert_string_equal(sum.state, "succeeded");
        assert_int_equal(ready, 1);
        g_device_free = -1;
    }
    free(r); free(d); free(d2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planner_predicts_measured),
        cmocka_unit_test(test_fp16_activation_memory),
        cmocka_unit_test(test_accumulation_equivalence),
        cmocka_unit_test(test_recompute_fusion_bit_identical),
        cmocka_unit_test(test_fp16_overflow_skips_and_halves),
        cmocka_unit_test(test_fp16_skip_leaves_weights),
        cmocka_unit_test(test_fp16_scale_grows),
        cmocka_unit_test(test_reduced_precision_tracks_fp32),
        cmocka_unit_test(test_resume_same_numbers),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
