/* test_devstep.c — the step on the device (spec cuda_graphs, issue 18) without a GPU.
 *
 * - The device-side arithmetic (kernels/common's tq_dstep_*: the loss scaler's update, the
 *   grad_scale / inv_scale roundings, the choice of AdamW's bias corrections) against the host
 *   loop's expressions in train/trainer.c, bit for bit, over random and edge sequences. The
 *   CUDA kernels call these very functions, so this covers what they compute.
 * - The spec's tf32 to the CUDA backend's flags (a pure function).
 * - The CPU backend's slots for it: the _dyn ops equal the plain ops bit for bit, step_end is
 *   tq_dstep_end, fetch_* round-trip, and graphs are refused (CUDA only).
 * - The trainer's device-step loop (TQ_DEVICE_STEP=1: what cuda_graphs runs, without the
 *   capture) against the plain loop on the CPU: every step record, every evaluation, the
 *   summary and the exported model and checkpoint identical, for fp16 with overflows, skips
 *   and growth under AdamW with accumulation, fp32 SGD with a warmup + cosine schedule, and
 *   bf16; a stop in flight takes effect one step later and the resumed run repeats the
 *   uninterrupted one; and `cuda_graphs: true` on the CPU trains exactly as false does.
 */
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
#include <fcntl.h>
#include "trainer.h"
#include "safetensors.h"
#include "spec.h"

/* ---- a tiny PRNG ---- */
static uint64_t rng = 12345;
static uint64_t rnext(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uni(double lo, double hi) { return lo + (hi - lo) * (double)(rnext() >> 11) * 0x1.0p-53; }

static int same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }
static int same_float(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---- the arithmetic ---- */

/* the host loop (trainer.c) on its own variables, step after step */
typedef struct { double scale; int tracker; int64_t opt_t; } host_state;
static void host_step(host_state *h, int fp16, int found_inf, float growth, float backoff, int interval) {
    if (!found_inf) h->opt_t++;
    if (fp16) {
        float fs = (float)h->scale;
        tq_scaler_update(&fs, &h->tracker, found_inf, growth, backoff, interval);
        h->scale = fs;
    }
}

static void test_scaler_update_matches_host(void **state) {
    (void)state;
    const double inits[] = { 65536.0, 1000.1, 1e38, 3.4028234663852886e38, 1.2676506002282294e30,
                             1.0, 0x1p-20, 7.000000000000001, 2.0 };
    const float growths[] = { 2.0f, 1.5f, 3.0f, 1.0f };
    const float backoffs[] = { 0.5f, 0.25f, 0.1f, 0.999f };
    const int intervals[] = { 1, 2, 3, 2000 };
    long checks = 0;
    for (size_t i = 0; i < sizeof inits / sizeof *inits; i++)
        for (int g = 0; g < 4; g++)
            for (int k = 0; k < 4; k++)
                for (int fp16 = 0; fp16 < 2; fp16++) {
                    host_state h = { fp16 ? inits[i] : 1.0, 0, 0 };
                    tq_dstep_state d;
                    memset(&d, 0, sizeof d);
                    d.scale = d.used_scale = h.scale;
                    int pinf = (int)(rnext() % 5);   /* overflow rate: 0 .. 4 in 8 */
                    for (int step = 0; step < 300; step++) {
                        int fi = fp16 && (int)(rnext() % 8) < pinf;
                        double used = h.scale;
                        host_step(&h, fp16, fi, growths[g], backoffs[g], intervals[k]);
                        tq_dstep_end(&d, fp16, fi, growths[g], backoffs[g], intervals[k]);
                        assert_true(same_double(d.used_scale, used));
                        assert_true(same_double(d.scale, h.scale));
                        assert_int_equal(d.tracker, h.tracker);
                        assert_int_equal(d.opt_t, h.opt_t);
                        checks++;
                    }
                }
    /* never grows to inf: the largest float stays */
    tq_dstep_state d = { 3.4028234663852886e38, 0, 1, 0 };
    tq_dstep_end(&d, 1, 0, 2.0f, 0.5f, 2);
    assert_true(d.scale == 3.4028234663852886e38 && d.tracker == 0);
    /* a skipped step halves and resets, and does not count */
    d.scale = 1024; d.tracker = 5; d.opt_t = 7;
    tq_dstep_end(&d, 1, 1, 2.0f, 0.5f, 2000);
    assert_true(d.scale == 512 && d.tracker == 0 && d.opt_t == 7 && d.used_scale == 1024);
    printf("# %ld scaler steps: the device's update equals the host loop's bit for bit\n", checks);
}

static void test_scales_and_bias_corrections(void **state) {
    (void)state;
    for (int i = 0; i < 200000; i++) {
        double scale = i % 3 == 0 ? (double)(float)exp2(uni(-30, 127)) : exp2(uni(-30, 127));
        int accum = 1 + (int)(rnext() % 64);
        assert_true(same_float(tq_dstep_grad_scale(scale, accum), (float)(scale / accum)));   /* trainer.c */
        assert_true(same_float(tq_dstep_inv_scale(scale), (float)(1.0 / scale)));
    }
    /* the device picks t = its own count + 1 among t_a and t_a + 1 */
    tq_dstep_in in = { 0.1f, 8, 0.5f, 0.25f, 0.75f, 0.125f };
    tq_dstep_state st = { 1, 1, 0, 7 };
    float b1, b2;
    tq_dstep_bc(&in, &st, &b1, &b2);
    assert_true(b1 == 0.5f && b2 == 0.25f);
    st.opt_t = 8;
    tq_dstep_bc(&in, &st, &b1, &b2);
    assert_true(b1 == 0.75f && b2 == 0.125f);
}

static void test_tf32_flags(void **state) {
    (void)state;
    assert_int_equal(tq_tf32_backend_flags(TQ_TF32_OFF), 0);
    assert_int_equal(tq_tf32_backend_flags(TQ_TF32_CONV), TQ_TF32_CONV_OK);
    assert_int_equal(tq_tf32_backend_flags(TQ_TF32_ALL), TQ_TF32_CONV_OK | TQ_TF32_MATMUL_OK);
    /* the spec's default is PyTorch's: convolutions only */
    tq_spec sp;
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&sp, "{}", &e), 0);
    assert_int_equal(tq_tf32_backend_flags(sp.tf32), TQ_TF32_CONV_OK);
    assert_int_equal(sp.cuda_graphs, 0);
    assert_int_equal(tq_spec_parse(&sp, "{\"tf32\": false}", &e), 0);
    assert_int_equal(tq_tf32_backend_flags(sp.tf32), 0);
    assert_int_equal(tq_spec_parse(&sp, "{\"tf32\": true}", &e), 0);
    assert_int_equal(tq_tf32_backend_flags(sp.tf32), TQ_TF32_CONV_OK | TQ_TF32_MATMUL_OK);
}

/* ---- the CPU backend's slots ---- */

static float *rnd(size_t n, double lo, double hi) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (float)uni(lo, hi);
    return p;
}
static float *fdup(const float *a, size_t n) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    memcpy(p, a, n * sizeof *p);
    return p;
}

static void test_cpu_backend_slots(void **state) {
    (void)state;
    tq_backend *be = tq_cpu_backend_new(2);
    assert_non_null(be);
    assert_int_equal(tq_backend_i_missing(be->i), -1);
    const tq_backend_i *I = be->i;
    /* graphs: CUDA only */
    void *gr = (void *)1;
    assert_int_equal(I->graph_begin(be), TQ_EINVAL);
    assert_non_null(strstr(be->err, "CUDA"));
    assert_int_equal(I->graph_end(be, 0, &gr), TQ_OK);
    assert_null(gr);
    assert_int_equal(I->graph_end(be, 1, &gr), TQ_EINVAL);
    assert_int_equal(I->graph_launch(be, NULL), TQ_EINVAL);
    I->graph_free(be, NULL);
    /* fetch: bytes and a time mark */
    unsigned char src[TQ_FETCH_BYTES], dst[TQ_FETCH_BYTES];
    for (int i = 0; i < TQ_FETCH_BYTES; i++) src[i] = (unsigned char)(i * 7 + 1);
    double t0 = I->now_ms(be), t1 = -1;
    assert_int_equal(I->fetch_begin(be, 1, src, sizeof src), TQ_OK);
    memset(src, 0, sizeof src);                      /* the slot holds its own copy */
    assert_int_equal(I->fetch_begin(be, 3, NULL, 0), TQ_OK);
    assert_int_equal(I->fetch_end(be, 1, dst, sizeof dst, &t1), TQ_OK);
    for (int i = 0; i < TQ_FETCH_BYTES; i++) assert_int_equal(dst[i], (unsigned char)(i * 7 + 1));
    assert_true(t1 >= t0 && t1 <= I->now_ms(be));
    assert_int_equal(I->fetch_end(be, 3, NULL, 0, &t1), TQ_OK);
    assert_int_equal(I->fetch_begin(be, TQ_FETCH_SLOTS, src, 4), TQ_EINVAL);
    assert_int_equal(I->fetch_begin(be, 0, src, TQ_FETCH_BYTES + 1), TQ_EINVAL);

    /* the _dyn ops are the plain ops with the values from the structs */
    const size_t n = 100003;
    tq_dstep_state st = { 1000.1, 0, 3, 6 };
    tq_dstep_in in = { 0.0375f, 7, 0.25f, 0.5f, 0.125f, 0.0625f };
    float *g = rnd(n, -1000, 1000), *g2 = fdup(g, n);
    g[n / 2] = INFINITY; g2[n / 2] = INFINITY;
    float fi = 0, fi2 = 0;
    assert_int_equal(I->unscale_check(be, n, g, tq_dstep_inv_scale(st.scale), &fi), 0);
    assert_int_equal(I->unscale_check_dyn(be, n, g2, &st, &fi2), 0);
    assert_memory_equal(g, g2, n * sizeof *g);
    assert_true(fi == 1.0f && fi2 == 1.0f);
    for (int mom = 0; mom < 2; mom++) {
        float *w = rnd(n, -1, 1), *w2 = fdup(w, n), *gg = rnd(n, -1, 1), *b = rnd(n, -1, 1), *b2 = fdup(b, n);
        uint16_t *l = calloc(n, 2), *l2 = calloc(n, 2);
        tq_dtype wdt = mom ? TQ_BF16 : TQ_F16;
        assert_int_equal(I->sgd_step(be, n, w, gg, b, in.lr, mom ? 0.9f : 0.0f, 5e-4f, 1, NULL, l, wdt), 0);
        assert_int_equal(I->sgd_step_dyn(be, n, w2, gg, b2, &in, mom ? 0.9f : 0.0f, 5e-4f, 1, NULL, l2, wdt), 0);
        assert_memory_equal(w, w2, n * sizeof *w);
        assert_memory_equal(b, b2, n * sizeof *b);
        assert_memory_equal(l, l2, n * 2);
        free(w); free(w2); free(gg); free(b); free(b2); free(l); free(l2);
    }
    for (int pick = 0; pick < 2; pick++) {
        st.opt_t = pick ? 7 : 6;                     /* t = 7 = t_a, or 8 */
        float *w = rnd(n, -1, 1), *w2 = fdup(w, n), *gg = rnd(n, -1, 1);
        float *m = rnd(n, -0.1, 0.1), *m2 = fdup(m, n), *v = rnd(n, 0, 0.01), *v2 = fdup(v, n);
        float bc1 = pick ? in.bc1_b : in.bc1_a, bc2 = pick ? in.bc2_b : in.bc2_a, skip = 0;
        uint16_t *l = calloc(n, 2), *l2 = calloc(n, 2);
        assert_int_equal(I->adamw_step(be, n, w, gg, m, v, in.lr, 0.9f, 0.999f, 1e-8f, 0.01f, bc1, bc2, &skip,
                                       l, TQ_BF16), 0);
        assert_int_equal(I->adamw_step_dyn(be, n, w2, gg, m2, v2, &in, &st, 0.9f, 0.999f, 1e-8f, 0.01f, &skip,
                                           l2, TQ_BF16), 0);
        assert_memory_equal(l, l2, n * 2);
        free(l); free(l2);
        assert_memory_equal(w, w2, n * sizeof *w);
        assert_memory_equal(m, m2, n * sizeof *m);
        assert_memory_equal(v, v2, n * sizeof *v);
        skip = 1;                                    /* a skipped step moves nothing */
        assert_int_equal(I->adamw_step_dyn(be, n, w2, gg, m2, v2, &in, &st, 0.9f, 0.999f, 1e-8f, 0.01f, &skip,
                                           NULL, TQ_F32), 0);
        assert_memory_equal(w, w2, n * sizeof *w);
        free(w); free(w2); free(gg); free(m); free(m2); free(v); free(v2);
    }
    for (int dt = 0; dt < 3; dt++) {                 /* softmax: the logits' dtype */
        const int rows = 37, classes = 10;
        size_t nl = (size_t)rows * classes, es = tq_dtype_size((tq_dtype)dt);
        unsigned char *lg = malloc(nl * es), *d1 = malloc(nl * es), *d2 = malloc(nl * es);
        int32_t lab[37];
        assert_non_null(lg); assert_non_null(d1); assert_non_null(d2);
        for (size_t i = 0; i < nl; i++) tq_st(lg, (tq_dtype)dt, i, (float)uni(-3, 3));
        for (int i = 0; i < rows; i++) lab[i] = (int32_t)(rnext() % classes);
        float o1[2] = { 1.5f, 2 }, o2[2] = { 1.5f, 2 };
        for (int accum = 1; accum <= 3; accum++) {
            assert_int_equal(I->softmax_ce(be, rows, classes, (tq_dtype)dt, d1, lg, lab,
                                           tq_dstep_grad_scale(st.scale, accum), o1), 0);
            assert_int_equal(I->softmax_ce_dyn(be, rows, classes, (tq_dtype)dt, d2, lg, lab, &st, accum, o2), 0);
            assert_memory_equal(d1, d2, nl * es);
            assert_memory_equal(o1, o2, sizeof o1);
        }
        free(lg); free(d1); free(d2);
    }
    /* step_end: found_inf read where it lives */
    tq_dstep_state a = { 2048, 0, 1, 4 }, b = a;
    float flag = 1.0f;
    assert_int_equal(I->step_end(be, &a, &flag, 1, 2.0f, 0.5f, 2), 0);
    tq_dstep_end(&b, 1, 1, 2.0f, 0.5f, 2);
    assert_memory_equal(&a, &b, sizeof a);
    assert_true(a.scale == 1024 && a.opt_t == 4);
    assert_int_equal(I->step_end(be, &a, NULL, 0, 2.0f, 0.5f, 2), 0);   /* not fp16: counts only */
    assert_true(a.scale == 1024 && a.opt_t == 5 && a.used_scale == 1024);
    free(g); free(g2);
    tq_backend_free(be);
}

/* ---- the trainer's device-step loop against the plain loop, on the CPU ---- */

#define MAXREC 64
typedef struct { tq_step_rec steps[MAXREC]; int n; tq_eval_rec evals[16]; int ne; } recs;
static int on_step(void *ctx, const tq_step_rec *r) { recs *c = ctx; if (c->n < MAXREC) c->steps[c->n++] = *r; return 0; }
static int on_eval(void *ctx, const tq_eval_rec *r) { recs *c = ctx; if (c->ne < 16) c->evals[c->ne++] = *r; return 0; }
static int g_calls, g_stop_after;
static int stop_fn(void *c) { (void)c; return ++g_calls >= g_stop_after ? 1 : 0; }

static void spec_from(tq_spec *sp, const char *json) {
    tq_spec_err e;
    int rc = tq_spec_parse(sp, json, &e);
    if (rc) fprintf(stderr, "spec error: %s: %s\n", e.field, e.message);
    assert_int_equal(rc, 0);
}

static int run(const char *json, const char *out, recs *r, tq_summary *sum, int devstep) {
    tq_spec sp;
    spec_from(&sp, json);
    memset(r, 0, sizeof *r);
    tq_run_opts o = {out, 0, {r, on_step, on_eval, NULL, NULL}, 0, NULL, 0, NULL, NULL};
    /* 1: the device-step loop, uncaptured; 2: its capture attempted (which fails on the CPU) */
    if (devstep) setenv("TQ_DEVICE_STEP", devstep == 2 ? "capture" : "1", 1);
    int rc = tq_train(&sp, &o, sum);
    unsetenv("TQ_DEVICE_STEP");
    return rc;
}

static char *tmpdir(void) {
    char *t = tq_tmpdir("tq_devstep");
    assert_non_null(t);
    return t;
}

/* every tensor of two safetensors files equal bit for bit */
static void same_file_tensors(const char *dir_a, const char *dir_b, const char *name) {
    char a[512], b[512], err[256];
    snprintf(a, sizeof a, "%s/%s", dir_a, name);
    snprintf(b, sizeof b, "%s/%s", dir_b, name);
    tq_st_file *fa = tq_st_open(a, err, sizeof err), *fb = tq_st_open(b, err, sizeof err);
    assert_non_null(fa); assert_non_null(fb);
    assert_int_equal(tq_st_count(fa), tq_st_count(fb));
    for (int i = 0; i < tq_st_count(fa); i++) {
        const tq_st_tensor *x = tq_st_at(fa, i), *y = tq_st_find(fb, x->name);
        assert_non_null(y);
        assert_int_equal(x->bytes, y->bytes);
        if (memcmp(x->data, y->data, x->bytes)) fail_msg("%s: tensor %s differs", name, x->name);
    }
    tq_st_close(fa); tq_st_close(fb);
}

static void same_records(const recs *a, const recs *b) {
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        const tq_step_rec *x = &a->steps[i], *y = &b->steps[i];
        assert_int_equal(x->step, y->step);
        assert_int_equal(x->epoch, y->epoch);
        if (!same_double(x->loss, y->loss)) fail_msg("step %d: loss %.17g vs %.17g", i + 1, x->loss, y->loss);
        assert_true(same_double(x->lr, y->lr));
        if (!same_double(x->loss_scale, y->loss_scale))
            fail_msg("step %d: loss_scale %.17g vs %.17g", i + 1, x->loss_scale, y->loss_scale);
        assert_int_equal(x->skipped, y->skipped);
        assert_int_equal(x->mem_peak_bytes, y->mem_peak_bytes);
        assert_int_equal(x->mem_allocated_bytes, y->mem_allocated_bytes);
        assert_true(y->step_ms >= 0);
    }
    assert_int_equal(a->ne, b->ne);
    for (int i = 0; i < a->ne; i++) {
        assert_int_equal(a->evals[i].step, b->evals[i].step);
        assert_true(same_double(a->evals[i].loss, b->evals[i].loss));
        assert_true(same_double(a->evals[i].accuracy, b->evals[i].accuracy));
    }
}

#define SYN "\"dataset\":\"synthetic\",\"synthetic\":{\"train\":128,\"test\":32,\"height\":12,\"width\":12,\"channels\":1},\"threads\":2,\"device\":\"cpu\""

static void test_device_step_loop_identical(void **state) {
    (void)state;
    const char *cases[] = {
        /* fp16: 2^20 overflows at first (skips, halving), growth every 2 steps overflows again;
         * AdamW (the bias corrections follow the skips), accumulation, augmentation, evals and
         * checkpoints in between */
        "{\"model\":\"cnn\",\"batch_size\":16,\"accum_steps\":2,\"steps\":14,\"amp\":\"fp16\",\"augment\":true,"
        "\"loss_scale\":{\"init\":1048576,\"growth_interval\":2},\"optimizer\":{\"type\":\"adamw\",\"lr\":0.002},"
        "\"eval_every\":5,\"checkpoint_every\":4," SYN "}",
        /* fp32 SGD, warmup then cosine: the rate changes every step */
        "{\"model\":\"resnet20\",\"batch_size\":16,\"steps\":6,\"shuffle\":true,"
        "\"lr_schedule\":{\"type\":\"cosine\",\"warmup_steps\":2}," SYN "}",
        /* bf16 AdamW, the default eval (epoch end) */
        "{\"model\":\"mlp\",\"batch_size\":32,\"accum_steps\":3,\"steps\":7,\"amp\":\"bf16\","
        "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.001}," SYN "}",
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char *d0 = tmpdir(), *d1 = tmpdir(), *d2 = tmpdir();
        recs *r0 = calloc(1, sizeof *r0), *r1 = calloc(1, sizeof *r1), *r2 = calloc(1, sizeof *r2);
        tq_summary s0, s1, s2;
        assert_int_equal(run(cases[c], d0, r0, &s0, 0), 0);
        assert_int_equal(run(cases[c], d1, r1, &s1, 1), 0);
        assert_int_equal(run(cases[c], d2, r2, &s2, 2), 0);
        assert_string_equal(s0.state, "succeeded");
        assert_string_equal(s1.state, "succeeded");
        assert_string_equal(s0.cuda_graphs, "off");
        assert_string_equal(s1.cuda_graphs, "uncaptured");
        assert_string_equal(s1.tf32, "");              /* the CPU has no TF32 */
        same_records(r0, r1);
        /* a failed capture (the CPU's graph_begin refuses): the job trains on, uncaptured, the
         * same numbers, and says so */
        assert_string_equal(s2.state, "succeeded");
        assert_string_equal(s2.cuda_graphs, "capture_failed");
        same_records(r0, r2);
        same_file_tensors(d0, d2, "model.safetensors");
        same_file_tensors(d0, d2, "checkpoint.safetensors");
        assert_int_equal(s0.steps, s1.steps);
        assert_int_equal(s0.skipped_steps, s1.skipped_steps);
        assert_true(same_double(s0.final_loss, s1.final_loss));
        assert_true(same_double(s0.final_loss_scale, s1.final_loss_scale));
        assert_true(same_double(s0.val_loss, s1.val_loss));
        assert_int_equal(s0.peak_memory_bytes, s1.peak_memory_bytes);
        assert_int_equal(s1.peak_memory_bytes, s1.predicted_peak_bytes);
        same_file_tensors(d0, d1, "model.safetensors");
        same_file_tensors(d0, d1, "checkpoint.safetensors");
        int skipped = 0, grew = 0;
        for (int i = 0; i < r1->n; i++) {
            skipped += r1->steps[i].skipped;
            if (i && r1->steps[i].loss_scale > r1->steps[i - 1].loss_scale) grew++;
        }
        if (c == 0) assert_true(skipped >= 2 && grew >= 1);   /* the case does what it is for */
        printf("# case %zu: %d steps, %d skipped, scale grew %d times, %d evals: identical, final loss %.6f\n",
               c, r1->n, skipped, grew, r1->ne, s1.final_loss);
        free(r0); free(r1); free(r2); free(d0); free(d1); free(d2);
    }
}

static void test_cuda_graphs_on_cpu_is_ignored(void **state) {
    (void)state;
    const char *fmt = "{\"model\":\"cnn\",\"batch_size\":16,\"steps\":4,\"amp\":\"fp16\",\"cuda_graphs\":%s," SYN "}";
    char js[1024];
    char *d0 = tmpdir(), *d1 = tmpdir();
    recs *r0 = calloc(1, sizeof *r0), *r1 = calloc(1, sizeof *r1);
    tq_summary s0, s1;
    snprintf(js, sizeof js, fmt, "false");
    assert_int_equal(run(js, d0, r0, &s0, 0), 0);
    snprintf(js, sizeof js, fmt, "true");
    assert_int_equal(run(js, d1, r1, &s1, 0), 0);
    assert_string_equal(s1.cuda_graphs, "not_cuda");
    assert_string_equal(s0.cuda_graphs, "off");
    same_records(r0, r1);
    same_file_tensors(d0, d1, "model.safetensors");
    free(r0); free(r1); free(d0); free(d1);
}

static void test_stop_in_flight_and_resume(void **state) {
    (void)state;
    char *d1 = tmpdir(), *d2 = tmpdir();
    const char *js = "{\"model\":\"resnet20\",\"batch_size\":8,\"steps\":9,\"checkpoint_every\":3,\"augment\":true,"
                     "\"amp\":\"fp16\",\"loss_scale\":{\"init\":1048576,\"growth_interval\":2}," SYN "}";
    recs *full = calloc(1, sizeof *full), *part = calloc(1, sizeof *part);
    tq_summary s, ps, rs;
    assert_int_equal(run(js, d1, full, &s, 0), 0);
    tq_spec sp;
    spec_from(&sp, js);
    tq_run_opts o = {d2, 0, {part, on_step, on_eval, stop_fn, NULL}, 0, NULL, 0, NULL, NULL};
    setenv("TQ_DEVICE_STEP", "1", 1);
    g_calls = 0; g_stop_after = 4;   /* asked while step 4 is recorded, step 5 in flight */
    assert_int_equal(tq_train(&sp, &o, &ps), 0);
    assert_string_equal(ps.state, "cancelled");
    assert_int_equal(ps.steps, 5);
    o.cb.should_stop = NULL;
    o.resume = 1;
    assert_int_equal(tq_train(&sp, &o, &rs), 0);
    unsetenv("TQ_DEVICE_STEP");
    assert_string_equal(rs.state, "succeeded");
    assert_int_equal(part->n, 9);
    for (int i = 0; i < 9; i++) {
        assert_int_equal(part->steps[i].step, i + 1);
        assert_true(same_double(part->steps[i].loss, full->steps[i].loss));
        assert_true(same_double(part->steps[i].loss_scale, full->steps[i].loss_scale));
    }
    assert_true(same_double(rs.val_loss, s.val_loss));
    same_file_tensors(d1, d2, "model.safetensors");
    free(full); free(part); free(d1); free(d2);
}

/* The CPU backend's to_device, to_host and memset0 count their calls here and fail the
 * fail_at-th (0: none); a GPU's can fail, and they return nothing (backend.h nerr). */
static int g_td_calls, g_td_fail_at, g_th_calls, g_th_fail_at, g_ms_calls, g_ms_fail_at;
int tq_cpu_to_device_fails(void) { return ++g_td_calls == g_td_fail_at; }
int tq_cpu_to_host_fails(void) { return ++g_th_calls == g_th_fail_at; }
int tq_cpu_memset0_fails(void) { return ++g_ms_calls == g_ms_fail_at; }

/* Every copy of a run, each in its turn, fails once: the dataset's upload, the initial weights,
 * the device loop's initial step state, each micro-batch's indices and draws (to_device); each
 * step's results in the plain loop, the evaluations' sums, the weights for a checkpoint, the
 * model's export and the pruned / int8 evaluations (to_host); the optimizer state's, each
 * step's gradients' and loss sums' and each evaluation's zeroing (memset0). Each time the job fails as a
 * backend_error naming the copy, and the model file on disk stays the one a whole run wrote:
 * nothing is trained on, or written from, bytes that did not arrive. */
static void test_failed_transfer_fails_the_job(void **state) {
    (void)state;
    const char *js = "{\"model\":\"cnn\",\"batch_size\":16,\"accum_steps\":2,\"steps\":6,\"augment\":true,"
                     "\"eval_every\":3,\"checkpoint_every\":2,\"prune\":{\"amount\":0.5},\"quantize\":\"int8\"," SYN "}";
    char *d = tmpdir(), *dok = tmpdir();
    recs *r = calloc(1, sizeof *r);
    tq_summary s;
    int total[3][3];
    static const char *const loops[] = { "plain", "device-step", "device-step, capture attempted" };
    static const char *const dirs[] = { "to_device", "to_host", "memset0" };
    int *const counters[3][2] = { { &g_td_calls, &g_td_fail_at }, { &g_th_calls, &g_th_fail_at },
                                  { &g_ms_calls, &g_ms_fail_at } };
    /* each capture attempt says on stderr that it failed (the CPU has no graphs): ~100 lines
     * that say nothing here; the test's own messages go to stdout */
    fflush(stderr);
    int saved_err = dup(2), devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2);
    for (int dir = 0; dir < 3; dir++)
        for (int dev = 0; dev < 3; dev++) {
            int *calls = counters[dir][0], *fail_at = counters[dir][1];
            g_td_calls = g_th_calls = g_ms_calls = 0; g_td_fail_at = g_th_fail_at = g_ms_fail_at = 0;
            assert_int_equal(run(js, dok, r, &s, dev), 0);
            assert_string_equal(s.state, "succeeded");
            total[dir][dev] = *calls;
            for (int at = 1; at <= total[dir][dev]; at++) {
                g_td_calls = g_th_calls = g_ms_calls = 0; *fail_at = at;
                int rc = run(js, d, r, &s, dev);
                *fail_at = 0;
                if (rc == 0 || strcmp(s.state, "failed") || strcmp(s.error_code, "backend_error") ||
                    !strstr(s.error_message, dir == 2 ? "not zeroed" : "not copied")) {
                    if (saved_err >= 0) dup2(saved_err, 2);   /* the failure's words are seen */
                    fail_msg("%s loop, %s %d of %d failed: rc %d, state %s, %s: %s", loops[dev], dirs[dir], at,
                             total[dir][dev], rc, s.state, s.error_code, s.error_message);
                }
                char m[512];
                snprintf(m, sizeof m, "%s/model.safetensors", d);
                if (access(m, F_OK) == 0) same_file_tensors(d, dok, "model.safetensors");
            }
        }
    fflush(stderr);
    if (saved_err >= 0) { dup2(saved_err, 2); close(saved_err); }
    if (devnull >= 0) close(devnull);
    printf("# calls in a run (plain, device step, capture attempted): to_device %d, %d, %d; to_host %d, %d, %d; "
           "memset0 %d, %d, %d; each one's failure failed the job\n", total[0][0], total[0][1], total[0][2],
           total[1][0], total[1][1], total[1][2], total[2][0], total[2][1], total[2][2]);
    free(r); free(d); free(dok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scaler_update_matches_host),
        cmocka_unit_test(test_scales_and_bias_corrections),
        cmocka_unit_test(test_tf32_flags),
        cmocka_unit_test(test_cpu_backend_slots),
        cmocka_unit_test(test_device_step_loop_identical),
        cmocka_unit_test(test_cuda_graphs_on_cpu_is_ignored),
        cmocka_unit_test(test_stop_in_flight_and_resume),
        cmocka_unit_test(test_failed_transfer_fails_the_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
