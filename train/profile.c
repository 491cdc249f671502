/* profile.c — per-op timing of a training run through a backend's op table (profile.h). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "profile.h"
#include "util.h"

struct tq_prof {
    tq_backend *be;
    const tq_backend_i *in;      /* the backend's own table */
    tq_backend_i tab;            /* in, with the timed ops in front */
    int on, attached, sorted;
    double floor_ms;             /* the cheapest op between syncs: taken off each call for the rates */
    tq_prof_entry *e;
    int n, cap;
    int32_t *slot;               /* open addressing over e[], -1 empty; nslot a power of two */
    int nslot;
    double *step_ms;
    long long steps, step_cap;
};

/* ---- the table of entries ---- */

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return (h ^ 0xff) * 1099511628211ULL;   /* a separator, so that "ab"+"c" != "a"+"bc" */
}

/* The slots rebuilt at ns or more (a power of two, over twice the entries); -1 when out of
 * memory. */
static int rehash(tq_prof *p, int ns) {
    while (ns < 2 * (p->n + 1)) ns *= 2;
    int32_t *s = malloc(sizeof *s * (size_t)ns);
    if (!s) return -1;
    for (int i = 0; i < ns; i++) s[i] = -1;
    for (int k = 0; k < p->n; k++) {
        uint64_t h = fnv(fnv(fnv(14695981039346656037ULL, p->e[k].op), p->e[k].dtype), p->e[k].shape);
        int i = (int)(h & (uint64_t)(ns - 1));
        while (s[i] >= 0) i = (i + 1) & (ns - 1);
        s[i] = k;
    }
    free(p->slot);
    p->slot = s;
    p->nslot = ns;
    return 0;
}

/* The entry of (op, dtype, shape), created on first sight; NULL when out of memory. */
static tq_prof_entry *entry(tq_prof *p, const char *op, const char *kind, const char *dt, const char *shape) {
    if ((p->n + 1) * 2 > p->nslot && rehash(p, p->nslot ? p->nslot * 2 : 256)) return NULL;
    uint64_t h = fnv(fnv(fnv(14695981039346656037ULL, op), dt), shape);
    int i = (int)(h & (uint64_t)(p->nslot - 1));
    for (; p->slot[i] >= 0; i = (i + 1) & (p->nslot - 1)) {
        tq_prof_entry *x = &p->e[p->slot[i]];
        if (!strcmp(x->op, op) && !strcmp(x->dtype, dt) && !strcmp(x->shape, shape)) return x;
    }
    if (p->n == p->cap) {
        int nc = p->cap ? p->cap * 2 : 128;
        tq_prof_entry *ne = realloc(p->e, sizeof *ne * (size_t)nc);
        if (!ne) return NULL;
        p->e = ne;
        p->cap = nc;
    }
    tq_prof_entry *x = &p->e[p->n];
    memset(x, 0, sizeof *x);
    snprintf(x->op, sizeof x->op, "%s", op);
    snprintf(x->dtype, sizeof x->dtype, "%s", dt);
    snprintf(x->shape, sizeof x->shape, "%s", shape);
    x->kind = kind;
    p->slot[i] = p->n++;
    return x;
}

/* ---- timing ---- */

/* The start of a timed call, or -1 when the profile is off. */
static double t_begin(tq_prof *p) {
    if (!p->on) return -1;
    p->in->sync(p->be);
    return tq_mono_ms();
}

static void t_end(tq_prof *p, double t0, const char *op, const char *kind, const char *dt, const char *shape,
                  double flops, double bytes) {
    if (t0 < 0) return;
    p->in->sync(p->be);
    double ms = tq_mono_ms() - t0;
    tq_prof_entry *x = entry(p, op, kind, dt, shape);
    if (!x) return;   /* out of memory: the call goes uncounted, the run goes on */
    x->calls++;
    x->ms += ms;
    p->sorted = 0;   /* new entry or new time: the order is stale */
    x->flops = flops;
    x->bytes = bytes;
}

static const char *dtn(tq_dtype dt) { return dt == TQ_F32 ? "f32" : dt == TQ_F16 ? "f16" : "bf16"; }
static double es(tq_dtype dt) { return (double)tq_dtype_size(dt); }
static double elems(tq_shape s) { return (double)s.n * s.h * s.w * s.c; }

/* ---- the timed ops: each calls the backend's own, then books the call ----
 * TIMED(CALL, BOOK): p and t for BOOK, which runs only when the call was timed (t >= 0). */
#define TIMED(CALL, BOOK)                           \
    tq_prof *p = (tq_prof *)be->prof;               \
    double t = t_begin(p);                          \
    int rc = p->in->CALL;                           \
    if (t >= 0) BOOK;                               \
    return rc
#define TIMED_VOID(CALL, BOOK)                      \
    tq_prof *p = (tq_prof *)be->prof;               \
    double t = t_begin(p);                          \
    p->in->CALL;                                    \
    if (t >= 0) BOOK

static void book_conv(tq_prof *p, double t, const char *op, tq_dtype dt, const tq_conv_desc *d,
                      const char *extra, double bytes) {
    char s[80];
    snprintf(s, sizeof s, "x %dx%dx%dx%d k%d %dx%d s%d p%d%s", d->x.n, d->x.h, d->x.w, d->x.c, d->k, d->r, d->s,
             d->stride, d->pad, extra);
    tq_shape y = tq_conv_yshape(d);
    t_end(p, t, op, "conv", dtn(dt), s, 2.0 * y.n * y.h * y.w * y.c * d->x.c * d->r * d->s, bytes);
}
static void book_lin(tq_prof *p, double t, const char *op, tq_dtype dt, int n, int in, int out,
                     const char *extra, double bytes) {
    char s[80];
    snprintf(s, sizeof s, "n%d in%d out%d%s", n, in, out, extra);
    t_end(p, t, op, "linear", dtn(dt), s, 2.0 * n * in * out, bytes);
}
static void book_nhwc(tq_prof *p, double t, const char *op, const char *kind, tq_dtype dt, tq_shape x,
                      const char *extra, double bytes) {
    char s[80];
    snprintf(s, sizeof s, "%dx%dx%dx%d%s", x.n, x.h, x.w, x.c, extra);
    t_end(p, t, op, kind, dtn(dt), s, 0, bytes);
}
static void book_n(tq_prof *p, double t, const char *op, const char *kind, const char *dt, size_t n,
                   double bytes) {
    char s[80];
    snprintf(s, sizeof s, "n %zu", n);
    t_end(p, t, op, kind, dt, s, 0, bytes);
}
static void book_ce(tq_prof *p, double t, const char *op, tq_dtype dt, int n, int classes, int tensors) {
    char s[80];
    snprintf(s, sizeof s, "n%d classes%d", n, classes);
    t_end(p, t, op, "loss", dtn(dt), s, 0, tensors * es(dt) * n * classes + 4.0 * n);
}
static void book_bytes(tq_prof *p, double t, const char *op, const char *kind, size_t bytes, double traffic) {
    char s[80];
    snprintf(s, sizeof s, "%zu B", bytes);
    t_end(p, t, op, kind, "-", s, 0, traffic);
}

static double conv_w(const tq_conv_desc *d, double e) { return e * d->k * d->r * d->s * d->x.c; }
static double conv_y(const tq_conv_desc *d) { return elems(tq_conv_yshape(d)); }
static const char *acc_tag(float beta) { return beta != 0 ? " accumulate" : ""; }
static const char *epilogue(const void *res, int relu) {
    return res ? (relu ? " +res +relu" : " +res") : relu ? " +relu" : "";
}
static double pooled(tq_shape x) { return (double)x.n * (x.h / 2) * (x.w / 2) * x.c; }
/* w and the momentum buffer read and written, g read */
static double sgd_bytes(size_t n, const float *buf) { return (buf ? 20.0 : 12.0) * n; }
/* the 16-bit weight copy an optimizer step writes in the same pass */
static double wcopy_bytes(size_t n, const void *wlow, tq_dtype wdt) { return wlow ? es(wdt) * (double)n : 0.0; }

static int w_conv_fwd(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x, const void *w,
                      const float *bias, void *ws, size_t ws_bytes) {
    TIMED(conv_fwd(be, d, dt, y, x, w, bias, ws, ws_bytes),
          book_conv(p, t, "conv_fwd", dt, d, bias ? " bias" : "",
                    es(dt) * (elems(d->x) + conv_y(d)) + conv_w(d, es(dt)) + (bias ? 4.0 * d->k : 0)));
}
static int w_conv_bwd_data(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *dx, float beta, const void *dy,
                           const void *w, void *ws, size_t ws_bytes) {
    TIMED(conv_bwd_data(be, d, dt, dx, beta, dy, w, ws, ws_bytes),
          book_conv(p, t, "conv_bwd_data", dt, d, acc_tag(beta),
                    es(dt) * (conv_y(d) + elems(d->x) * (beta != 0 ? 2 : 1)) + conv_w(d, es(dt))));
}
static int w_conv_bwd_filter(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, float *dw, float *db, const void *x,
                             const void *dy, void *ws, size_t ws_bytes) {
    /* dw and db are f32 and accumulated: read and written */
    TIMED(conv_bwd_filter(be, d, dt, dw, db, x, dy, ws, ws_bytes),
          book_conv(p, t, "conv_bwd_filter", dt, d, db ? " bias" : "",
                    es(dt) * (elems(d->x) + conv_y(d)) + 2 * conv_w(d, 4) + (db ? 8.0 * d->k : 0)));
}

static int w_linear_fwd(tq_backend *be, int n, int in, int out, tq_dtype dt, void *y, const void *x, const void *w,
                        const float *bias, void *ws, size_t ws_bytes) {
    TIMED(linear_fwd(be, n, in, out, dt, y, x, w, bias, ws, ws_bytes),
          book_lin(p, t, "linear_fwd", dt, n, in, out, bias ? " bias" : "",
                   es(dt) * ((double)n * in + (double)n * out + (double)in * out) + (bias ? 4.0 * out : 0)));
}
static int w_linear_bwd_data(tq_backend *be, int n, int in, int out, tq_dtype dt, void *dx, float beta,
                             const void *dy, const void *w, void *ws, size_t ws_bytes) {
    TIMED(linear_bwd_data(be, n, in, out, dt, dx, beta, dy, w, ws, ws_bytes),
          book_lin(p, t, "linear_bwd_data", dt, n, in, out, acc_tag(beta),
                   es(dt) * ((double)n * out + (double)n * in * (beta != 0 ? 2 : 1) + (double)in * out)));
}
static int w_linear_bwd_filter(tq_backend *be, int n, int in, int out, tq_dtype dt, float *dw, float *db,
                               const void *x, const void *dy, void *ws, size_t ws_bytes) {
    TIMED(linear_bwd_filter(be, n, in, out, dt, dw, db, x, dy, ws, ws_bytes),
          book_lin(p, t, "linear_bwd_filter", dt, n, in, out, db ? " bias" : "",
                   es(dt) * ((double)n * in + (double)n * out) + 8.0 * in * out + (db ? 8.0 * out : 0)));
}

static int w_bn_fwd_train(tq_backend *be, tq_shape sh, tq_dtype dt, void *y, const void *x, const float *gamma,
                          const float *beta, float *save_mean, float *save_invstd, float *run_mean, float *run_var,
                          float momentum, float eps, const void *res, int relu) {
    TIMED(bn_fwd_train(be, sh, dt, y, x, gamma, beta, save_mean, save_invstd, run_mean, run_var, momentum, eps,
                       res, relu),
          book_nhwc(p, t, "bn_fwd_train", "batchnorm", dt, sh, epilogue(res, relu), es(dt) * elems(sh) * (res ? 3 : 2)));
}
static int w_bn_fwd_infer(tq_backend *be, tq_shape sh, tq_dtype dt, void *y, const void *x, const float *gamma,
                          const float *beta, const float *run_mean, const float *run_var, float eps, const void *res,
                          int relu) {
    TIMED(bn_fwd_infer(be, sh, dt, y, x, gamma, beta, run_mean, run_var, eps, res, relu),
          book_nhwc(p, t, "bn_fwd_infer", "batchnorm", dt, sh, epilogue(res, relu), es(dt) * elems(sh) * (res ? 3 : 2)));
}
static int w_bn_norm(tq_backend *be, tq_shape sh, tq_dtype dt, void *y, const void *x, const void *res,
                     const float *gamma, const float *beta, const float *mean, const float *invstd, int relu) {
    TIMED(bn_norm(be, sh, dt, y, x, res, gamma, beta, mean, invstd, relu),
          book_nhwc(p, t, "bn_norm", "batchnorm", dt, sh, epilogue(res, relu), es(dt) * elems(sh) * (res ? 3 : 2)));
}
static int w_bn_bwd(tq_backend *be, tq_shape sh, tq_dtype dt, void *dx, float beta_dx, float *dgamma, float *dbeta,
                    const void *dy, const void *x, const float *gamma, const float *save_mean,
                    const float *save_invstd, const void *relu_y, void *dres, float beta_dres) {
    /* dy and x read, relu_y read, dx and dres written (and read when accumulated) */
    double tensors = 2 + (relu_y != NULL) + (dx ? (beta_dx != 0 ? 2 : 1) : 0) + (dres ? (beta_dres != 0 ? 2 : 1) : 0);
    TIMED(bn_bwd(be, sh, dt, dx, beta_dx, dgamma, dbeta, dy, x, gamma, save_mean, save_invstd, relu_y, dres,
                 beta_dres),
          book_nhwc(p, t, "bn_bwd", "batchnorm", dt, sh, relu_y ? (dres ? " +relu +dres" : " +relu") : "",
                    es(dt) * elems(sh) * tensors));
}

static int w_relu_fwd(tq_backend *be, size_t n, tq_dtype dt, void *y, const void *x) {
    TIMED(relu_fwd(be, n, dt, y, x), book_n(p, t, "relu_fwd", "elementwise", dtn(dt), n, 2 * es(dt) * (double)n));
}
static int w_relu_bwd(tq_backend *be, size_t n, tq_dtype dt, void *dx, float beta, const void *dy, const void *y) {
    TIMED(relu_bwd(be, n, dt, dx, beta, dy, y),
          book_n(p, t, "relu_bwd", "elementwise", dtn(dt), n, es(dt) * (double)n * (beta != 0 ? 4 : 3)));
}
static int w_add_fwd(tq_backend *be, size_t n, tq_dtype dt, void *y, const void *a, const void *b) {
    TIMED(add_fwd(be, n, dt, y, a, b), book_n(p, t, "add_fwd", "elementwise", dtn(dt), n, 3 * es(dt) * (double)n));
}
static int w_accumulate(tq_backend *be, size_t n, tq_dtype dt, void *dst, float beta, const void *src) {
    TIMED(accumulate(be, n, dt, dst, beta, src),
          book_n(p, t, "accumulate", "elementwise", dtn(dt), n, es(dt) * (double)n * (beta != 0 ? 3 : 2)));
}
static int w_cast(tq_backend *be, size_t n, tq_dtype dst_dt, void *dst, tq_dtype src_dt, const void *src) {
    char d[12];
    snprintf(d, sizeof d, "%s>%s", dtn(src_dt), dtn(dst_dt));
    TIMED(cast(be, n, dst_dt, dst, src_dt, src),
          book_n(p, t, "cast", "elementwise", d, n, (es(src_dt) + es(dst_dt)) * (double)n));
}

static int w_maxpool_fwd(tq_backend *be, tq_shape x, tq_dtype dt, void *y, const void *xp, int relu) {
    TIMED(maxpool_fwd(be, x, dt, y, xp, relu),
          book_nhwc(p, t, "maxpool_fwd", "pooling", dt, x, relu ? " +relu" : "", es(dt) * (elems(x) + pooled(x))));
}
static int w_maxpool_bwd(tq_backend *be, tq_shape x, tq_dtype dt, void *dx, float beta, const void *dy,
                         const void *xp, int relu) {
    TIMED(maxpool_bwd(be, x, dt, dx, beta, dy, xp, relu),
          book_nhwc(p, t, "maxpool_bwd", "pooling", dt, x, relu ? " +relu" : "",
                    es(dt) * (pooled(x) + elems(x) * (beta != 0 ? 3 : 2))));
}
static int w_avgpool_fwd(tq_backend *be, tq_shape x, tq_dtype dt, void *y, const void *xp) {
    TIMED(avgpool_fwd(be, x, dt, y, xp),
          book_nhwc(p, t, "avgpool_fwd", "pooling", dt, x, "", es(dt) * (elems(x) + (double)x.n * x.c)));
}
static int w_avgpool_bwd(tq_backend *be, tq_shape x, tq_dtype dt, void *dx, float beta, const void *dy) {
    TIMED(avgpool_bwd(be, x, dt, dx, beta, dy),
          book_nhwc(p, t, "avgpool_bwd", "pooling", dt, x, "",
                    es(dt) * ((double)x.n * x.c + elems(x) * (beta != 0 ? 2 : 1))));
}

static int w_softmax_ce(tq_backend *be, int n, int classes, tq_dtype dt, void *dlogits, const void *logits,
                        const int32_t *labels, float grad_scale, float *out) {
    TIMED(softmax_ce(be, n, classes, dt, dlogits, logits, labels, grad_scale, out),
          book_ce(p, t, "softmax_ce", dt, n, classes, 2));
}
static int w_softmax_ce_eval(tq_backend *be, int n, int classes, tq_dtype dt, const void *logits,
                             const int32_t *labels, float *out) {
    TIMED(softmax_ce_eval(be, n, classes, dt, logits, labels, out), book_ce(p, t, "softmax_ce_eval", dt, n, classes, 1));
}
static int w_softmax_ce_dyn(tq_backend *be, int n, int classes, tq_dtype dt, void *dlogits, const void *logits,
                            const int32_t *labels, const tq_dstep_state *st, int accum, float *out) {
    TIMED(softmax_ce_dyn(be, n, classes, dt, dlogits, logits, labels, st, accum, out),
          book_ce(p, t, "softmax_ce_dyn", dt, n, classes, 2));
}

static int w_unscale_check(tq_backend *be, size_t n, float *g, float inv_scale, float *found_inf) {
    TIMED(unscale_check(be, n, g, inv_scale, found_inf), book_n(p, t, "unscale_check", "optimizer", "f32", n, 8.0 * n));
}
static int w_unscale_check_dyn(tq_backend *be, size_t n, float *g, const tq_dstep_state *st, float *found_inf) {
    TIMED(unscale_check_dyn(be, n, g, st, found_inf),
          book_n(p, t, "unscale_check_dyn", "optimizer", "f32", n, 8.0 * n));
}
static int w_sgd_step(tq_backend *be, size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                      float wd, int nesterov, const float *skip, void *wlow, tq_dtype wdt) {
    TIMED(sgd_step(be, n, w, g, buf, lr, momentum, wd, nesterov, skip, wlow, wdt),
          book_n(p, t, "sgd_step", "optimizer", "f32", n, sgd_bytes(n, buf) + wcopy_bytes(n, wlow, wdt)));
}
static int w_sgd_step_dyn(tq_backend *be, size_t n, float *w, const float *g, float *buf, const tq_dstep_in *in,
                          float momentum, float wd, int nesterov, const float *skip, void *wlow, tq_dtype wdt) {
    TIMED(sgd_step_dyn(be, n, w, g, buf, in, momentum, wd, nesterov, skip, wlow, wdt),
          book_n(p, t, "sgd_step_dyn", "optimizer", "f32", n, sgd_bytes(n, buf) + wcopy_bytes(n, wlow, wdt)));
}
static int w_adamw_step(tq_backend *be, size_t n, float *w, const float *g, float *m, float *v, float lr, float b1,
                        float b2, float eps, float wd, float bc1, float bc2, const float *skip, void *wlow,
                        tq_dtype wdt) {
    /* w, m and v read and written, g read */
    TIMED(adamw_step(be, n, w, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, skip, wlow, wdt),
          book_n(p, t, "adamw_step", "optimizer", "f32", n, 28.0 * n + wcopy_bytes(n, wlow, wdt)));
}
static int w_adamw_step_dyn(tq_backend *be, size_t n, float *w, const float *g, float *m, float *v,
                            const tq_dstep_in *in, const tq_dstep_state *st, float b1, float b2, float eps, float wd,
                            const float *skip, void *wlow, tq_dtype wdt) {
    TIMED(adamw_step_dyn(be, n, w, g, m, v, in, st, b1, b2, eps, wd, skip, wlow, wdt),
          book_n(p, t, "adamw_step_dyn", "optimizer", "f32", n, 28.0 * n + wcopy_bytes(n, wlow, wdt)));
}
static int w_step_end(tq_backend *be, tq_dstep_state *st, const float *found_inf, int fp16, float growth,
                      float backoff, int interval) {
    TIMED(step_end(be, st, found_inf, fp16, growth, backoff, interval),
          t_end(p, t, "step_end", "optimizer", "f32", "", 0, 0));
}

static int w_load_batch(tq_backend *be, int n, int h, int w, int c, tq_dtype dt, void *x, int32_t *labels,
                        const uint8_t *images, const uint8_t *lab, const int32_t *idx, const tq_aug *aug, int pad,
                        const float *mean, const float *inv_std) {
    tq_shape sh = { n, h, w, c };
    /* the images read (u8), the batch written in dt, the labels and indices */
    TIMED(load_batch(be, n, h, w, c, dt, x, labels, images, lab, idx, aug, pad, mean, inv_std),
          book_nhwc(p, t, "load_batch", "data", dt, sh, aug ? " augmented" : "", elems(sh) * (1 + es(dt)) + 9.0 * n));
}

static void w_memset0(tq_backend *be, void *ptr, size_t bytes) {
    TIMED_VOID(memset0(be, ptr, bytes), book_bytes(p, t, "memset0", "memory", bytes, (double)bytes));
}
static void w_copy(tq_backend *be, void *dst, const void *src, size_t bytes) {
    TIMED_VOID(copy(be, dst, src, bytes), book_bytes(p, t, "copy", "memory", bytes, 2.0 * bytes));
}
static void w_to_device(tq_backend *be, void *dst, const void *src, size_t bytes) {
    TIMED_VOID(to_device(be, dst, src, bytes), book_bytes(p, t, "to_device", "data", bytes, (double)bytes));
}
static void w_to_host(tq_backend *be, void *dst, const void *src, size_t bytes) {
    TIMED_VOID(to_host(be, dst, src, bytes), book_bytes(p, t, "to_host", "data", bytes, (double)bytes));
}
#undef TIMED
#undef TIMED_VOID

/* ---- attach, detach ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* What the cheapest op costs between syncs on this backend, the median of 31: a 4-byte memset0
 * of scratch (its launch, the sync, the clock reads), or without scratch a sync alone. */
static double measure_floor(tq_backend *be, const tq_backend_i *in, void *scratch4) {
    double v[31];
    in->sync(be);
    for (int k = 0; k < 31; k++) {
        double t = tq_mono_ms();
        if (scratch4) in->memset0(be, scratch4, 4);
        in->sync(be);
        v[k] = tq_mono_ms() - t;
    }
    qsort(v, 31, sizeof v[0], cmp_double);
    return v[15];
}

tq_prof *tq_prof_attach(tq_backend *be, void *scratch4) {
    tq_prof *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->be = be;
    p->in = be->i;
    p->tab = *be->i;
    tq_backend_i *t = &p->tab;
    t->memset0 = w_memset0; t->to_device = w_to_device; t->to_host = w_to_host; t->copy = w_copy;
    t->conv_fwd = w_conv_fwd; t->conv_bwd_data = w_conv_bwd_data; t->conv_bwd_filter = w_conv_bwd_filter;
    t->linear_fwd = w_linear_fwd; t->linear_bwd_data = w_linear_bwd_data; t->linear_bwd_filter = w_linear_bwd_filter;
    t->bn_fwd_train = w_bn_fwd_train; t->bn_fwd_infer = w_bn_fwd_infer; t->bn_norm = w_bn_norm; t->bn_bwd = w_bn_bwd;
    t->relu_fwd = w_relu_fwd; t->relu_bwd = w_relu_bwd; t->add_fwd = w_add_fwd; t->accumulate = w_accumulate;
    t->maxpool_fwd = w_maxpool_fwd; t->maxpool_bwd = w_maxpool_bwd;
    t->avgpool_fwd = w_avgpool_fwd; t->avgpool_bwd = w_avgpool_bwd;
    t->softmax_ce = w_softmax_ce; t->softmax_ce_eval = w_softmax_ce_eval; t->softmax_ce_dyn = w_softmax_ce_dyn;
    t->cast = w_cast; t->unscale_check = w_unscale_check; t->unscale_check_dyn = w_unscale_check_dyn;
    t->sgd_step = w_sgd_step; t->sgd_step_dyn = w_sgd_step_dyn;
    t->adamw_step = w_adamw_step; t->adamw_step_dyn = w_adamw_step_dyn; t->step_end = w_step_end;
    t->load_batch = w_load_batch;
    p->floor_ms = measure_floor(be, p->in, scratch4);
    be->prof = p;
    be->i = &p->tab;
    p->attached = 1;
    return p;
}

void tq_prof_set(tq_prof *p, int on) { if (p) p->on = on; }

void tq_prof_step(tq_prof *p, double step_ms) {
    if (!p) return;
    if (p->steps == p->step_cap) {
        long long nc = p->step_cap ? p->step_cap * 2 : 64;
        double *ns = realloc(p->step_ms, sizeof *ns * (size_t)nc);
        if (!ns) return;
        p->step_ms = ns;
        p->step_cap = nc;
    }
    p->step_ms[p->steps++] = step_ms;
}

void tq_prof_detach(tq_prof *p) {
    if (!p || !p->attached) return;
    p->be->i = p->in;
    p->be->prof = NULL;
    p->attached = 0;
    p->on = 0;
}

void tq_prof_free(tq_prof *p) {
    if (!p) return;
    tq_prof_detach(p);
    free(p->e);
    free(p->slot);
    free(p->step_ms);
    free(p);
}

long long tq_prof_steps(const tq_prof *p) { return p ? p->steps : 0; }

static int by_time(const void *a, const void *b) {
    const tq_prof_entry *x = a, *y = b;
    if (x->ms != y->ms) return x->ms < y->ms ? 1 : -1;
    int c = strcmp(x->op, y->op);
    return c ? c : strcmp(x->shape, y->shape);
}

const tq_prof_entry *tq_prof_entries(tq_prof *p, int *n) {
    if (!p->sorted) {
        if (p->n) qsort(p->e, (size_t)p->n, sizeof *p->e, by_time);
        /* the slots index the old order: rebuilt for the new one (or dropped, when out of
         * memory, and rebuilt by the next entry()) */
        if (p->nslot && rehash(p, p->nslot)) {
            free(p->slot);
            p->slot = NULL;
            p->nslot = 0;
        }
        p->sorted = 1;
    }
    *n = p->n;
    return p->e;
}

/* ---- the report ---- */

static const char *KINDS[] = { "conv", "linear", "batchnorm", "elementwise", "pooling", "loss", "optimizer", "data",
                               "memory" };
#define NKINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

typedef struct {
    double steps, step_mean, step_med, op_ms, kind_ms[NKINDS];
} totals;

static totals sum_up(tq_prof *p) {
    totals t;
    memset(&t, 0, sizeof t);
    t.steps = (double)p->steps;
    if (p->steps) {
        double *v = malloc(sizeof *v * (size_t)p->steps);
        if (v) {
            memcpy(v, p->step_ms, sizeof *v * (size_t)p->steps);
            qsort(v, (size_t)p->steps, sizeof *v, cmp_double);
            t.step_med = p->steps % 2 ? v[p->steps / 2] : 0.5 * (v[p->steps / 2 - 1] + v[p->steps / 2]);
            free(v);
        }
        for (long long k = 0; k < p->steps; k++) t.step_mean += p->step_ms[k] / (double)p->steps;
    }
    for (int i = 0; i < p->n; i++) {
        t.op_ms += p->e[i].ms;
        for (int k = 0; k < NKINDS; k++)
            if (!strcmp(p->e[i].kind, KINDS[k])) t.kind_ms[k] += p->e[i].ms;
    }
    return t;
}

/* The time of one call without the sync around it, for the rates; 0 when the sync was all. */
static double net_ms(const tq_prof *p, const tq_prof_entry *x) {
    double ms = x->ms / (double)x->calls - p->floor_ms;
    return ms > 0 ? ms : 0;
}

int tq_prof_write(tq_prof *p, const tq_prof_meta *m, const char *path, char *err, size_t errlen) {
    int n;
    const tq_prof_entry *e = tq_prof_entries(p, &n);
    totals t = sum_up(p);
    double per = t.steps > 0 ? 1.0 / t.steps : 0;
    cJSON *o = cJSON_CreateObject(), *kinds = cJSON_CreateObject(), *ops = cJSON_CreateArray();
    if (!o || !kinds || !ops) goto oom;
    cJSON_AddStringToObject(o, "device", m->device ? m->device : "");
    cJSON_AddStringToObject(o, "model", m->model ? m->model : "");
    cJSON_AddStringToObject(o, "amp", m->amp ? m->amp : "");
    cJSON_AddNumberToObject(o, "batch_size", m->batch_size);
    cJSON_AddNumberToObject(o, "accum_steps", m->accum_steps);
    cJSON_AddNumberToObject(o, "threads", m->threads);
    cJSON_AddNumberToObject(o, "warmup_steps", m->warmup_steps);
    cJSON_AddNumberToObject(o, "steps_profiled", t.steps);
    cJSON_AddNumberToObject(o, "step_ms_mean", t.step_mean);
    cJSON_AddNumberToObject(o, "step_ms_median", t.step_med);
    cJSON_AddNumberToObject(o, "op_ms_per_step", t.op_ms * per);
    cJSON_AddNumberToObject(o, "floor_ms", p->floor_ms);
    cJSON_AddStringToObject(o, "method", "each op timed on the host clock with the backend synchronized before and "
                                         "after it (its launch included); rates use the time less floor_ms per call (the "
                                         "cheapest op, a 4-byte memset, between syncs); "
                                         "bytes: the least traffic the op needs (inputs read once, outputs written "
                                         "once); flops: 2 per multiply-add");
    for (int k = 0; k < NKINDS; k++) cJSON_AddNumberToObject(kinds, KINDS[k], t.kind_ms[k] * per);
    cJSON_AddItemToObject(o, "ms_per_step_by_kind", kinds);
    kinds = NULL;
    for (int i = 0; i < n; i++) {
        const tq_prof_entry *x = &e[i];
        cJSON *r = cJSON_CreateObject();
        if (!r) goto oom;
        cJSON_AddItemToArray(ops, r);
        double nm = net_ms(p, x);
        cJSON_AddStringToObject(r, "op", x->op);
        cJSON_AddStringToObject(r, "kind", x->kind);
        cJSON_AddStringToObject(r, "dtype", x->dtype);
        cJSON_AddStringToObject(r, "shape", x->shape);
        cJSON_AddNumberToObject(r, "calls_per_step", (double)x->calls * per);
        cJSON_AddNumberToObject(r, "ms_per_step", x->ms * per);
        cJSON_AddNumberToObject(r, "ms_per_call", x->ms / (double)x->calls);
        cJSON_AddNumberToObject(r, "flops_per_call", x->flops);
        cJSON_AddNumberToObject(r, "bytes_per_call", x->bytes);
        if (x->flops > 0 && nm > 0) cJSON_AddNumberToObject(r, "gflop_per_s", x->flops / nm * 1e-6);
        else cJSON_AddNullToObject(r, "gflop_per_s");
        if (x->bytes > 0 && nm > 0) cJSON_AddNumberToObject(r, "gb_per_s", x->bytes / nm * 1e-6);
        else cJSON_AddNullToObject(r, "gb_per_s");
    }
    cJSON_AddItemToObject(o, "ops", ops);
    ops = NULL;
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    o = NULL;
    if (!s) goto oom;
    size_t tl = strlen(path) + 5;
    char *tmp = malloc(tl);
    if (!tmp) { cJSON_free(s); goto oom; }
    snprintf(tmp, tl, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    int e2 = errno;
    if (f && fclose(f)) { ok = 0; e2 = errno; }
    cJSON_free(s);
    if (!ok || rename(tmp, path)) {
        if (ok) e2 = errno;
        snprintf(err, errlen, "cannot write the profile %s: %s", path, strerror(e2));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
oom:
    cJSON_Delete(o);
    cJSON_Delete(kinds);
    cJSON_Delete(ops);
    snprintf(err, errlen, "out of memory writing the profile %s", path);
    return -1;
}

void tq_prof_print(tq_prof *p, const tq_prof_meta *m, FILE *f, int top) {
    int n;
    const tq_prof_entry *e = tq_prof_entries(p, &n);
    totals t = sum_up(p);
    if (!p->steps) {
        fprintf(f, "trainq: profile: no step was profiled\n");
        return;
    }
    double per = 1.0 / t.steps;
    fprintf(f, "trainq: profile of %lld steps after %d warm-up (%s, %s, %s, batch %d x %d, %d threads): every op "
               "timed between syncs, floor %.4f ms\n", p->steps, m->warmup_steps, m->device, m->model, m->amp,
            m->batch_size, m->accum_steps, m->threads, p->floor_ms);
    fprintf(f, "  step %.3f ms (mean; median %.3f), ops %.3f ms/step, outside the ops %.3f ms/step\n  by kind:",
            t.step_mean, t.step_med, t.op_ms * per, t.step_mean - t.op_ms * per);
    for (int k = 0; k < NKINDS; k++)
        if (t.kind_ms[k] > 0)
            fprintf(f, " %s %.1f%%", KINDS[k], t.op_ms > 0 ? 100 * t.kind_ms[k] / t.op_ms : 0);
    fprintf(f, "\n  %9s %6s %6s  %-17s %-9s %-40s %s\n", "ms/step", "share", "calls", "op", "dtype", "shape", "rate");
    for (int i = 0; i < n && i < top; i++) {
        const tq_prof_entry *x = &e[i];
        double nm = net_ms(p, x);
        char rate[32] = "";
        if (x->flops > 0 && nm > 0) snprintf(rate, sizeof rate, "%.1f GFLOP/s", x->flops / nm * 1e-6);
        else if (x->bytes > 0 && nm > 0) snprintf(rate, sizeof rate, "%.1f GB/s", x->bytes / nm * 1e-6);
        fprintf(f, "  %9.3f %5.1f%% %6.3g  %-17s %-9s %-40s %s\n", x->ms * per,
                t.op_ms > 0 ? 100 * x->ms / t.op_ms : 0, (double)x->calls * per, x->op, x->dtype, x->shape, rate);
    }
    if (n > top) fprintf(f, "  ... %d more in the profile's JSON\n", n - top);
}
