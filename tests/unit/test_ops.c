/* test_ops.c — the CPU backend's ops against double-precision references.
 *
 * For every op: the f32 forward against a reference written here in double (norm-wise relative
 * error <= 1e-5); the backward against central finite differences of L = Σ r·y computed with
 * the double reference (<= 1e-3), with beta 0 (poisoned output) and beta 1 (accumulate); the
 * f16/bf16 variants against the f32 result (<= 1e-2 / 3e-2). Outputs and workspaces are
 * poisoned with NaN before each call, workspaces are allocated at exactly the size *_ws
 * reports (so an overrun shows under ASan/valgrind), and one byte less must give TQ_EINVAL.
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

#include <immintrin.h>

#include "backend.h"
#include "cpu/cpu_internal.h"

static tq_backend *be;

/* ---- scratch memory: freed after every test (also when a check fails) ---- */

#define MAXMEM 8192
static void *mem[MAXMEM];
static int nmem;

static void *tmem(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    assert_true(nmem < MAXMEM);
    mem[nmem++] = p;
    return p;
}
static int teardown_mem(void **state) {
    (void)state;
    for (int i = 0; i < nmem; i++) free(mem[i]);
    nmem = 0;
    return 0;
}

/* ---- random numbers (splitmix64) ---- */

static uint64_t rng_s = 0x853c49e6748fea9bull;
static double urand(void) {   /* [-1, 1) */
    uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static float *frand(size_t n, double scale) {
    float *a = tmem(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = (float)(urand() * scale);
    return a;
}
static float *fcopy(const float *a, size_t n) {
    float *b = tmem(n * sizeof(float));
    memcpy(b, a, n * sizeof(float));
    return b;
}
static double *dalloc(size_t n) { return tmem(n * sizeof(double)); }
static double *dup_d(const float *a, size_t n) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = a[i];
    return d;
}
static void poison(void *p, tq_dtype dt, size_t n) {
    if (dt == TQ_F32) {
        float nan = NAN;
        for (size_t i = 0; i < n; i++) ((float *)p)[i] = nan;
    } else {
        uint16_t v = dt == TQ_F16 ? 0x7e00 : 0x7fc0;
        for (size_t i = 0; i < n; i++) ((uint16_t *)p)[i] = v;
    }
}
static void *poisoned(tq_dtype dt, size_t n) {
    void *p = tmem(n * tq_dtype_size(dt));
    poison(p, dt, n);
    return p;
}
/* a workspace of exactly `bytes`, NaN-filled */
static void *ws_alloc(size_t bytes) {
    void *p = tmem(bytes);
    poison(p, TQ_F32, bytes / 4);
    return bytes ? p : NULL;
}
static void *to_dt(tq_dtype dt, const float *a, size_t n) {
    void *p = tmem(n * tq_dtype_size(dt));
    for (size_t i = 0; i < n; i++) tq_st(p, dt, i, a[i]);
    return p;
}
static float *from_dt(tq_dtype dt, const void *p, size_t n) {
    float *a = tmem(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = tq_ld(p, dt, i);
    return a;
}
static float *rnd(tq_dtype dt, const float *a, size_t n) { return from_dt(dt, to_dt(dt, a, n), n); }
static float *fdiff(const float *a, const float *b, size_t n) {   /* a − b */
    float *d = tmem(n * sizeof(float));
    for (size_t i = 0; i < n; i++) d[i] = a[i] - b[i];
    return d;
}
static double tol_dt(tq_dtype dt) { return dt == TQ_F16 ? 1e-2 : 3e-2; }
static const char *dt_name(tq_dtype dt) { return dt == TQ_F32 ? "f32" : dt == TQ_F16 ? "f16" : "bf16"; }

/* ||got − ref|| / ||ref|| (absolute when ref is 0); NaN anywhere gives NaN */
static double rel_fd(const float *got, const double *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        e += d * d;
        r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}
static double rel_ff(const float *got, const float *ref, size_t n) {
    double *r = dup_d(ref, n);
    return rel_fd(got, r, n);
}

#define CHECK_REL(err, tol, ...)                                                          \
    do {                                                                                  \
        double e_ = (err);                                                                \
        if (!(e_ <= (tol))) {                                                             \
            char m_[200];                                                                 \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                         \
            print_error("%s: relative error %.3g > %.3g\n", m_, e_, (double)(tol));       \
            fail();                                                                       \
        }                                                                                 \
    } while (0)

#define CHECK_OK(call)                                                                    \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        if (rc_ != TQ_OK) {                                                               \
            print_error("%s returned %d: %s\n", #call, rc_, be->err);                     \
            fail();                                                                       \
        }                                                                                 \
    } while (0)

#define CHECK_EINVAL(call)                                                                \
    do {                                                                                  \
        be->err[0] = 0;                                                                   \
        int rc_ = (call);                                                                 \
        if (rc_ != TQ_EINVAL || !be->err[0]) {                                            \
            print_error("%s returned %d (want TQ_EINVAL with a message)\n", #call, rc_);  \
            fail();                                                                       \
        }                                                                                 \
    } while (0)

/* ---- finite differences ---- */

typedef double (*loss_fn)(void *ctx);

/* Central differences of f w.r.t. p[] at up to ~256 evenly spread indices, compared with
 * got[i] (− base[i] when base != NULL). */
static void fd_check(const char *what, loss_fn f, void *ctx, double *p, size_t n,
                     const float *got, const float *base, double h) {
    size_t nsel = n <= 300 ? n : 256;
    float *g = tmem(nsel * sizeof(float));
    double *fd = dalloc(nsel);
    for (size_t k = 0; k < nsel; k++) {
        size_t i = nsel == n ? k : k * n / nsel;
        double v = p[i];
        p[i] = v + h;
        double lp = f(ctx);
        p[i] = v - h;
        double lm = f(ctx);
        p[i] = v;
        fd[k] = (lp - lm) / (2 * h);
        g[k] = base ? got[i] - base[i] : got[i];
    }
    CHECK_REL(rel_fd(g, fd, nsel), 1e-3, "%s vs finite differences", what);
}

static double ddot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- reference convolution (double) ---- */

static void ref_conv(const tq_conv_desc *d, const double *x, const double *w, const double *b,
                     double *y) {
    tq_shape ys = tq_conv_yshape(d);
    int H = d->x.h, W = d->x.w, C = d->x.c, R = d->r, S = d->s;
    for (int n = 0; n < ys.n; n++)
        for (int p = 0; p < ys.h; p++)
            for (int q = 0; q < ys.w; q++)
                for (int k = 0; k < ys.c; k++) {
                    double acc = b ? b[k] : 0;
                    for (int r = 0; r < R; r++)
                        for (int s = 0; s < S; s++) {
                            int ih = p * d->stride - d->pad + r, iw = q * d->stride - d->pad + s;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            const double *xp = x + (((size_t)n * H + ih) * W + iw) * C;
                            const double *wp = w + (((size_t)k * R + r) * S + s) * C;
                            for (int c = 0; c < C; c++) acc += xp[c] * wp[c];
                        }
                    y[(((size_t)n * ys.h + p) * ys.w + q) * ys.c + k] = acc;
                }
}

/* the exact adjoint, for shapes too large for finite differences */
static void ref_conv_bwd(const tq_conv_desc *d, const double *x, const double *w,
                         const double *dy, double *dx, double *dw, double *db) {
    tq_shape ys = tq_conv_yshape(d);
    int H = d->x.h, W = d->x.w, C = d->x.c, R = d->r, S = d->s, K = d->k;
    memset(dx, 0, tq_shape_numel(d->x) * sizeof(double));
    memset(dw, 0, (size_t)K * R * S * C * sizeof(double));
    memset(db, 0, (size_t)K * sizeof(double));
    for (int n = 0; n < ys.n; n++)
        for (int p = 0; p < ys.h; p++)
            for (int q = 0; q < ys.w; q++)
                for (int k = 0; k < K; k++) {
                    double g = dy[(((size_t)n * ys.h + p) * ys.w + q) * K + k];
                    db[k] += g;
                    for (int r = 0; r < R; r++)
                        for (int s = 0; s < S; s++) {
                            int ih = p * d->stride - d->pad + r, iw = q * d->stride - d->pad + s;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            size_t xo = (((size_t)n * H + ih) * W + iw) * C;
                            size_t wo = (((size_t)k * R + r) * S + s) * C;
                            for (int c = 0; c < C; c++) {
                                dx[xo + c] += g * w[wo + c];
                                dw[wo + c] += g * x[xo + c];
                            }
                        }
                }
}

typedef struct {
    tq_conv_desc d;
    double *x, *w, *b, *y, *r;
    size_t ny;
} conv_ctx;
static double conv_loss(void *p) {
    conv_ctx *c = p;
    ref_conv(&c->d, c->x, c->w, c->b, c->y);
    return ddot(c->r, c->y, c->ny);
}

/* One convolution (or linear, as a 1×1 conv of N×1×1 images) through fwd, bwd_data (beta 0
 * and 1), bwd_filter, too-small workspaces and the 16-bit variants. fd: finite differences,
 * else the exact double adjoint. */
typedef struct { int n, h, w, c, k, r, s, stride, pad, bias, fd, linear; } conv_case;

static size_t op_ws(const tq_conv_desc *d, tq_dtype dt, int lin) {
    return lin ? be->i->linear_ws(be, d->x.n, d->x.c, d->k, dt) : be->i->conv_ws(be, d, dt);
}
static int op_fwd(const tq_conv_desc *d, tq_dtype dt, void *y, const void *x, const void *w,
                  const float *b, void *ws, size_t wsb, int lin) {
    return lin ? be->i->linear_fwd(be, d->x.n, d->x.c, d->k, dt, y, x, w, b, ws, wsb)
               : be->i->conv_fwd(be, d, dt, y, x, w, b, ws, wsb);
}
static int op_bwd_data(const tq_conv_desc *d, tq_dtype dt, void *dx, float beta, const void *dy,
                       const void *w, void *ws, size_t wsb, int lin) {
    return lin ? be->i->linear_bwd_data(be, d->x.n, d->x.c, d->k, dt, dx, beta, dy, w, ws, wsb)
               : be->i->conv_bwd_data(be, d, dt, dx, beta, dy, w, ws, wsb);
}
static int op_bwd_filter(const tq_conv_desc *d, tq_dtype dt, float *dw, float *db, const void *x,
                         const void *dy, void *ws, size_t wsb, int lin) {
    return lin ? be->i->linear_bwd_filter(be, d->x.n, d->x.c, d->k, dt, dw, db, x, dy, ws, wsb)
               : be->i->conv_bwd_filter(be, d, dt, dw, db, x, dy, ws, wsb);
}

/* All three ops of one conv/linear in dtype dt on f32 inputs (converted to dt here): y, dx with
 * beta 0 (poisoned), dx1 = dx0 + dx with beta 1, dw = dw0 + Δ, db = db0 + Δ. Workspaces are
 * exactly *_ws bytes and NaN-filled. */
typedef struct { float *y, *dx, *dx1, *dw, *db; } conv_out;

static void conv_run(const tq_conv_desc *d, int lin, tq_dtype dt, const float *x, const float *w,
                     const float *b, const float *r, const float *dx0, const float *dw0,
                     const float *db0, conv_out *o) {
    size_t nx = tq_shape_numel(d->x), ny = tq_shape_numel(tq_conv_yshape(d)), K = (size_t)d->k;
    size_t nw = K * d->r * d->s * d->x.c;
    void *xh = to_dt(dt, x, nx), *wh = to_dt(dt, w, nw), *rh = to_dt(dt, r, ny);
    size_t wsb = op_ws(d, dt, lin);
    void *ws = ws_alloc(wsb);
    void *y = poisoned(dt, ny), *dx = poisoned(dt, nx), *dx1 = to_dt(dt, dx0, nx);
    CHECK_OK(op_fwd(d, dt, y, xh, wh, b, ws, wsb, lin));
    poison(ws, TQ_F32, wsb / 4);
    CHECK_OK(op_bwd_data(d, dt, dx, 0.0f, rh, wh, ws, wsb, lin));
    poison(ws, TQ_F32, wsb / 4);
    CHECK_OK(op_bwd_data(d, dt, dx1, 1.0f, rh, wh, ws, wsb, lin));
    o->dw = fcopy(dw0, nw);
    o->db = b ? fcopy(db0, K) : NULL;
    poison(ws, TQ_F32, wsb / 4);
    CHECK_OK(op_bwd_filter(d, dt, o->dw, o->db, xh, rh, ws, wsb, lin));
    o->y = from_dt(dt, y, ny);
    o->dx = from_dt(dt, dx, nx);
    o->dx1 = from_dt(dt, dx1, nx);
}

/* The smallest workspace each op accepts (bisection); their maximum must be exactly *_ws, and
 * one byte less than an op's minimum must be TQ_EINVAL with a message. */
typedef struct { const tq_conv_desc *d; int lin; tq_dtype dt; void *x, *w, *dy, *y, *dx, *ws; float *dw, *db; } ws_probe;
static int ws_try(const ws_probe *p, int op, size_t bytes) {
    be->err[0] = 0;
    int rc = op == 0   ? op_fwd(p->d, p->dt, p->y, p->x, p->w, NULL, p->ws, bytes, p->lin)
             : op == 1 || op == 3
                 ? op_bwd_data(p->d, p->dt, p->dx, op == 3 ? 1.0f : 0.0f, p->dy, p->w, p->ws, bytes, p->lin)
                       : op_bwd_filter(p->d, p->dt, p->dw, p->db, p->x, p->dy, p->ws, bytes, p->lin);
    if (rc != TQ_OK) {
        assert_int_equal(rc, TQ_EINVAL);
        assert_true(be->err[0] != 0);
    }
    return rc;
}
static void conv_ws_exact(const tq_conv_desc *d, int lin, tq_dtype dt, const char *name) {
    size_t nx = tq_shape_numel(d->x), ny = tq_shape_numel(tq_conv_yshape(d)), K = (size_t)d->k;
    size_t nw = K * d->r * d->s * d->x.c, wsb = op_ws(d, dt, lin), most = 0;
    ws_probe p = { d, lin, dt, poisoned(dt, nx), poisoned(dt, nw), poisoned(dt, ny),
                   tmem(ny * 4), tmem(nx * 4), tmem(wsb), tmem(nw * 4), tmem(K * 4) };
    /* fwd, bwd_data with beta 0, bwd_filter, bwd_data with beta 1 (routes may differ: wino_few) */
    for (int op = 0; op < 4; op++) {
        size_t lo = 0, hi = wsb;                 /* op(lo) fails, op(hi) succeeds */
        CHECK_OK(ws_try(&p, op, wsb));
        if (ws_try(&p, op, 0) == TQ_OK) hi = 0;
        else
            while (hi - lo > 1) {
                size_t mid = lo + (hi - lo) / 2;
                if (ws_try(&p, op, mid) == TQ_OK) hi = mid;
                else lo = mid;
            }
        if (hi > most) most = hi;
    }
    if (most != wsb) {
        print_error("%s %s: ops need at most %zu workspace bytes, *_ws says %zu\n", name,
                    dt_name(dt), most, wsb);
        fail();
    }
}


static void run_conv_case(const conv_case *cc) {
    tq_conv_desc d = { { cc->n, cc->h, cc->w, cc->c }, cc->k, cc->r, cc->s, cc->stride, cc->pad };
    tq_shape ys = tq_conv_yshape(&d);
    size_t nx = tq_shape_numel(d.x), ny = tq_shape_numel(ys), K = (size_t)cc->k;
    size_t nw = K * cc->r * cc->s * cc->c;
    int lin = cc->linear;
    char name[96];
    snprintf(name, sizeof name, "%s n%d %dx%dx%d->%d %dx%d s%d p%d%s", lin ? "linear" : "conv",
             cc->n, cc->h, cc->w, cc->c, cc->k, cc->r, cc->s, cc->stride, cc->pad,
             cc->bias ? " bias" : "");

    float *x = frand(nx, 1), *w = frand(nw, 1.0 / sqrt((double)cc->r * cc->s * cc->c));
    float *b = cc->bias ? frand(K, 0.5) : NULL, *r = frand(ny, 1);
    float *dx0 = frand(nx, 1), *dw0 = frand(nw, 1), *db0 = frand(K, 1);
    conv_ctx ctx = { d, dup_d(x, nx), dup_d(w, nw), b ? dup_d(b, K) : NULL, dalloc(ny),
                     dup_d(r, ny), ny };
    double *yref = dalloc(ny);
    ref_conv(&d, ctx.x, ctx.w, ctx.b, yref);

    conv_out o;
    conv_run(&d, lin, TQ_F32, x, w, b, r, dx0, dw0, db0, &o);
    CHECK_REL(rel_fd(o.y, yref, ny), 1e-5, "%s fwd", name);
    char what[160];
    if (cc->fd) {
        snprintf(what, sizeof what, "%s dx (beta 0)", name);
        fd_check(what, conv_loss, &ctx, ctx.x, nx, o.dx, NULL, 1e-4);
        snprintf(what, sizeof what, "%s dx (beta 1)", name);
        fd_check(what, conv_loss, &ctx, ctx.x, nx, o.dx1, dx0, 1e-4);
        snprintf(what, sizeof what, "%s dw", name);
        fd_check(what, conv_loss, &ctx, ctx.w, nw, o.dw, dw0, 1e-4);
        if (b) {
            snprintf(what, sizeof what, "%s db", name);
            fd_check(what, conv_loss, &ctx, ctx.b, K, o.db, db0, 1e-4);
        }
    } else {
        double *gx = dalloc(nx), *gw = dalloc(nw), *gb = dalloc(K);
        ref_conv_bwd(&d, ctx.x, ctx.w, ctx.r, gx, gw, gb);
        CHECK_REL(rel_fd(o.dx, gx, nx), 1e-5, "%s dx (beta 0)", name);
        CHECK_REL(rel_fd(fdiff(o.dx1, dx0, nx), gx, nx), 1e-5, "%s dx (beta 1)", name);
        CHECK_REL(rel_fd(fdiff(o.dw, dw0, nw), gw, nw), 1e-5, "%s dw", name);
        if (b) CHECK_REL(rel_fd(fdiff(o.db, db0, K), gb, K), 1e-5, "%s db", name);
    }
    conv_ws_exact(&d, lin, TQ_F32, name);

    /* 16-bit: against f32 on the same (rounded) inputs */
    for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
        conv_out l, f;
        conv_run(&d, lin, dt, x, w, b, r, dx0, dw0, db0, &l);
        conv_run(&d, lin, TQ_F32, rnd(dt, x, nx), rnd(dt, w, nw), b, rnd(dt, r, ny),
                 rnd(dt, dx0, nx), dw0, db0, &f);
        const char *dn = dt_name(dt);
        double tol = tol_dt(dt);
        CHECK_REL(rel_ff(l.y, f.y, ny), tol, "%s fwd %s", name, dn);
        CHECK_REL(rel_ff(l.dx, f.dx, nx), tol, "%s dx %s", name, dn);
        CHECK_REL(rel_ff(l.dx1, f.dx1, nx), tol, "%s dx beta1 %s", name, dn);
        CHECK_REL(rel_ff(fdiff(l.dw, dw0, nw), fdiff(f.dw, dw0, nw), nw), tol, "%s dw %s", name, dn);
        if (b) CHECK_REL(rel_ff(fdiff(l.db, db0, K), fdiff(f.db, db0, K), K), tol, "%s db %s", name, dn);
        /* and loosely against f32 on the original inputs */
        CHECK_REL(rel_ff(l.y, o.y, ny), 4 * tol, "%s fwd %s (unrounded inputs)", name, dn);
        conv_ws_exact(&d, lin, dt, name);
    }
}

static void test_conv(void **state) {
    (void)state;
    static const conv_case cases[] = {
        /* n  h  w  c  k  r  s  st pad bias fd */
        { 2, 5, 7, 3, 4, 3, 3, 1, 1, 1, 1, 0 },     /* 3×3 pad 1 stride 1, odd sizes */
        { 3, 6, 6, 5, 6, 3, 3, 2, 1, 0, 1, 0 },     /* 3×3 pad 1 stride 2 */
        { 2, 7, 5, 4, 5, 3, 3, 2, 1, 1, 1, 0 },     /* stride 2 on odd sizes */
        { 2, 4, 5, 8, 3, 1, 1, 1, 0, 1, 1, 0 },     /* 1×1 stride 1 (the direct path) */
        { 2, 7, 7, 4, 5, 1, 1, 2, 0, 0, 1, 0 },     /* 1×1 stride 2 (downsample) */
        { 1, 7, 5, 3, 2, 2, 3, 1, 0, 1, 1, 0 },     /* non-square kernel, no padding */
        { 2, 9, 9, 3, 4, 7, 7, 2, 3, 1, 1, 0 },     /* 7×7 stride 2 pad 3 (ResNet stem) */
        { 2, 5, 5, 2, 3, 3, 3, 3, 0, 0, 1, 0 },     /* stride 3: windows do not overlap */
        /* stride-1 bwd_data runs as a forward conv of dy with the flipped kernel, padding
         * (R−1−pad, S−1−pad); pad > R−1 keeps the col2im path */
        { 2, 4, 5, 3, 4, 3, 3, 1, 2, 1, 1, 0 },     /* pad R−1: transposed padding 0 */
        { 2, 5, 6, 3, 4, 3, 2, 1, 1, 1, 1, 0 },     /* 3×2 pad 1: transposed padding (1, 0) */
        { 2, 3, 4, 3, 2, 1, 1, 1, 1, 0, 1, 0 },     /* 1×1 pad 1: col2im */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_conv_case(&cases[i]);
}

/* enough work for several threads and several chunks per thread; Winograd off (it would take
 * the 3×3 stride-1 cases: on AVX2 CPUs, and in 16-bit types on Intel AVX-512 ones), so that
 * oneDNN's chunked f32 route and the im2col path are what runs */
static void test_conv_chunked(void **state) {
    (void)state;
    tq_backend *keep = be;
    setenv("TQ_CPU_WINOGRAD", "0", 1);
    be = tq_cpu_backend_new(2);
    assert_non_null(be);
    conv_case c1 = { 11, 32, 32, 16, 8, 3, 3, 1, 1, 1, 0, 0 };
    run_conv_case(&c1);
    conv_case c2 = { 3, 64, 64, 32, 4, 3, 3, 2, 1, 0, 0, 0 };
    run_conv_case(&c2);
    /* one image: the team splits each chunk's rows instead of owning images */
    conv_case c3 = { 1, 48, 48, 16, 16, 3, 3, 1, 1, 1, 0, 0 };
    run_conv_case(&c3);
    /* the direct 1×1 path with enough work for a team */
    conv_case c4 = { 4, 32, 32, 32, 32, 1, 1, 1, 0, 1, 0, 0 };
    run_conv_case(&c4);
    tq_backend_free(be);
    unsetenv("TQ_CPU_WINOGRAD");
    be = keep;
}

/* The 16-bit Winograd convolutions convert their inputs exactly and round each output once:
 * y, dx (beta 0 and 1) in f16/bf16 must be, bit for bit, the f32 op's result on the same
 * (rounded) inputs rounded by tq_st, and dw, db the f32 op's exactly (same sums, same order). */
static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}
static void wino_lo_exact(const tq_conv_desc *d, double xscale, int nan) {
    size_t nx = tq_shape_numel(d->x), ny = tq_shape_numel(tq_conv_yshape(d)), K = (size_t)d->k;
    size_t nw = K * 9 * d->x.c;
    float *x = frand(nx, xscale), *w = frand(nw, nan ? 1.0 : 1.0 / sqrt(9.0 * d->x.c));
    float *b = frand(K, 0.5);
    float *r = frand(ny, 1), *dx0 = frand(nx, 1), *dw0 = frand(nw, 1), *db0 = frand(K, 1);
    if (nan) x[nx / 3] = NAN;
    for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
        conv_out l, f;
        conv_run(d, 0, dt, x, w, b, r, dx0, dw0, db0, &l);
        conv_run(d, 0, TQ_F32, rnd(dt, x, nx), rnd(dt, w, nw), b, rnd(dt, r, ny),
                 rnd(dt, dx0, nx), dw0, db0, &f);
        const char *dn = dt_name(dt);
        if (!same_bits(l.y, rnd(dt, f.y, ny), ny)) fail_msg("winograd %s fwd: not the f32 result rounded", dn);
        if (!same_bits(l.dx, rnd(dt, f.dx, nx), nx)) fail_msg("winograd %s dx: not the f32 result rounded", dn);
        if (!same_bits(l.dx1, rnd(dt, f.dx1, nx), nx)) fail_msg("winograd %s dx beta 1: not the f32 result rounded", dn);
        if (!same_bits(l.dw, f.dw, nw)) fail_msg("winograd %s dw: not the f32 result", dn);
        if (!same_bits(l.db, f.db, K)) fail_msg("winograd %s db: not the f32 result", dn);
        if (nan) {   /* the case really reached inf (f16) and NaN */
            int inf = 0, nans = 0;
            for (size_t i = 0; i < ny; i++) {
                inf += isinf(l.y[i]) != 0;
                nans += isnan(l.y[i]) != 0;
            }
            assert_true(nans > 0);
            if (dt == TQ_F16) assert_true(inf > 0);
        }
    }
}

/* Winograd F(4×4, 3×3) and F(2×2, 3×3) (cpu_wino.c): on by default below AVX-512 and for some of
 * them on Intel's AVX-512 (cpu_conv.c, wino_use), so forced here (TQ_CPU_WINOGRAD=1) on a backend
 * of its own, with the tiles of the default (1 thread), of TQ_CPU_WINO_TILE=4 (3 threads) and of
 * TQ_CPU_WINO_TILE=2 (2 threads). The same checks as every
 * convolution: all three ops against the double reference, beta 0 and 1, the workspace exactly
 * as conv_ws reports (one byte less: TQ_EINVAL), the 16-bit types against it, and (wino_lo_exact)
 * each 16-bit output bit for bit the f32 one rounded. Shapes: odd sizes (tiles over the
 * edge), pad 0/1/2 (bwd_data's padding 2/1/0), output channels 8 and 24 (the GEMM's 8-wide
 * tail), input channels 24 (bwd_filter's tail), ResNet-20's first stage with many blocks of
 * tiles; and f16 overflow and a NaN. */
static void test_conv_winograd(void **state) {
    (void)state;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c")) {
        print_message("no AVX2/FMA/F16C on this CPU: Winograd convolutions do not run here\n");
        return;
    }
    static const conv_case cases[] = {
        /* n  h   w   c   k  r  s st pad bias fd */
        { 2, 5,  7,  8, 16, 3, 3, 1, 1, 1, 0, 0 },
        { 3, 6,  6, 16,  8, 3, 3, 1, 1, 0, 0, 0 },
        { 2, 4,  5,  8, 24, 3, 3, 1, 2, 1, 0, 0 },
        { 2, 6,  5, 24,  8, 3, 3, 1, 0, 1, 0, 0 },
        { 1, 3,  3,  8,  8, 3, 3, 1, 0, 1, 1, 0 },   /* one output: the finite differences too */
        { 11, 28, 28, 16, 16, 3, 3, 1, 1, 1, 0, 0 },
        { 3, 7,  7, 64, 64, 3, 3, 1, 1, 0, 0, 0 },
    };
    /* F(4×4, 3×3) where it takes fewer products (its workspace is its own), F(2×2, 3×3) on a 2×2
     * map (36 products against 16) */
    tq_conv_desc r20 = { { 11, 28, 28, 16 }, 16, 3, 3, 1, 1 }, tiny = { { 2, 2, 2, 16 }, 16, 3, 3, 1, 1 };
    for (int kind = 0; kind < 3; kind++) {
        assert_true(tq_cpu_wino_ws(&r20, kind, 1, 4) != tq_cpu_wino_ws(&r20, kind, 1, 2));
        assert_true(tq_cpu_wino_ws(&tiny, kind, 1, 4) == tq_cpu_wino_ws(&tiny, kind, 1, 2));
    }
    tq_backend *keep = be;
    setenv("TQ_CPU_WINOGRAD", "1", 1);
    static const int threads[] = { 1, 3, 2 };
    for (int ti = 0; ti < 3; ti++) {
        /* 1 thread: the default, F(4×4, 3×3) for fwd and bwd_data where it takes fewer products,
         * F(2×2, 3×3) for bwd_filter; 3 threads: F(4×4, 3×3) for all three (TQ_CPU_WINO_TILE=4);
         * 2 threads: F(2×2, 3×3) for all three (=2) */
        const int tile = ti == 2 ? 2 : 4, tile_bwdf = ti == 1 ? 4 : 2;
        if (ti > 0) setenv("TQ_CPU_WINO_TILE", ti == 1 ? "4" : "2", 1);
        be = tq_cpu_backend_new(threads[ti]);
        assert_non_null(be);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            tq_conv_desc d = { { cases[i].n, cases[i].h, cases[i].w, cases[i].c }, cases[i].k,
                               3, 3, 1, cases[i].pad };
            /* the workspace is Winograd's: the path really runs */
            size_t want = 0;
            for (int kind = 0; kind < 3; kind++) {
                size_t b = tq_cpu_wino_ws(&d, kind, threads[ti], kind == 2 ? tile_bwdf : tile);
                if (b > want) want = b;
            }
            for (tq_dtype dt = TQ_F32; dt <= TQ_BF16; dt++)
                assert_int_equal(be->i->conv_ws(be, &d, dt), want);
            run_conv_case(&cases[i]);
            wino_lo_exact(&d, 1.0, 0);
        }
        /* f16 overflow to inf, a NaN spreading through its tiles */
        tq_conv_desc big = { { 2, 6, 7, 16 }, 8, 3, 3, 1, 1 };
        wino_lo_exact(&big, 6e4, 1);
        tq_backend_free(be);
        unsetenv("TQ_CPU_WINO_TILE");
    }
    unsetenv("TQ_CPU_WINOGRAD");
    be = keep;
}

/* Where Winograd takes 512-channel f32 convolutions by default (Intel's AVX-512, or oneDNN below
 * it; cpu_conv.c, wino_few), a forward or non-accumulating backward-data op with a transformed
 * kernel of 16 MiB or more and fewer than 1024 outputs per channel goes to oneDNN, and the other
 * ops of that convolution stay Winograd's; all of them right, in one workspace as conv_ws
 * reports. Under TQ_CPU_WINOGRAD=1 every op of them runs Winograd. */
static void test_conv_wino_few(void **state) {
    (void)state;
    static const conv_case few = { 1, 4, 4, 512, 512, 3, 3, 1, 1, 1, 0, 0 };   /* U 36 MiB, 16 outputs */
    tq_conv_desc d = { { 1, 4, 4, 512 }, 512, 3, 3, 1, 1 }, batch64 = d, c256 = d;
    batch64.x.n = 64;                                /* 1024 outputs */
    c256.x.c = c256.k = 256;                         /* U 9 MiB */
    const int all = tq_cpu_conv_is_wino(be, &batch64, TQ_F32, 0, 0.0f);
    if (!all) {
        print_message("Winograd does not take 512-channel f32 convolutions here: nothing to check\n");
        return;
    }
    for (int op = 0; op < 3; op++) {
        assert_true(tq_cpu_conv_is_wino(be, &batch64, TQ_F32, op, 0.0f));
        assert_true(tq_cpu_conv_is_wino(be, &c256, TQ_F32, op, 0.0f));
        assert_int_equal(tq_cpu_conv_is_wino(be, &d, TQ_F32, op, 0.0f), op == 2);
        assert_int_equal(tq_cpu_conv_is_wino(be, &d, TQ_F32, op, 1.0f), op != 0);
    }
    run_conv_case(&few);
    if (!__builtin_cpu_supports("f16c")) return;
    tq_backend *keep = be;
    setenv("TQ_CPU_WINOGRAD", "1", 1);
    be = tq_cpu_backend_new(2);
    assert_non_null(be);
    for (int op = 0; op < 3; op++) assert_true(tq_cpu_conv_is_wino(be, &d, TQ_F32, op, 0.0f));
    tq_backend_free(be);
    unsetenv("TQ_CPU_WINOGRAD");
    be = keep;
}

/* The AVX-512 Winograd kernels (vec 16) against the AVX2 ones (vec 8), F(2×2, 3×3) and F(4×4, 3×3):
 * every lane does the same arithmetic in the same order, so all three ops give the same bits in
 * every type, beta 0 and 1,
 * with a NaN and (f16) overflow in the data. Channels 16 (only the one-register GEMM column),
 * 32 (only pairs), 48 (both); tile counts that leave a 6-row remainder after 12-row blocks;
 * 1 and 3 threads. */
static void test_conv_winograd_512(void **state) {
    (void)state;
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx2") ||
        !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) {
        print_message("no AVX-512F on this CPU: the 16-channel Winograd kernels do not run here\n");
        return;
    }
    static const int shapes[][6] = {   /* n h w c k pad */
        { 2, 7, 9, 16, 16, 1 }, { 3, 6, 5, 32, 32, 1 }, { 2, 5, 6, 48, 16, 0 }, { 1, 9, 7, 16, 48, 2 },
        { 4, 14, 14, 32, 64, 1 },
    };
    for (size_t si = 0; si < 2 * (sizeof shapes / sizeof shapes[0]); si++) {
        const int tile = si % 2 ? 4 : 2;   /* F(2×2, 3×3) and F(4×4, 3×3) */
        const int *q = shapes[si / 2];
        tq_conv_desc d = { { q[0], q[1], q[2], q[3] }, q[4], 3, 3, 1, q[5] };
        assert_true(tq_cpu_wino_fits512(&d));
        size_t nx = tq_shape_numel(d.x), ny = tq_shape_numel(tq_conv_yshape(&d)), K = (size_t)d.k;
        size_t nw = K * 9 * d.x.c;
        float *x = frand(nx, si / 2 == 1 ? 6e4 : 1.0), *w = frand(nw, 1.0), *b = frand(K, 0.5);
        float *dy = frand(ny, 1.0);
        x[nx / 2] = NAN;
        for (int nt = 1; nt <= 3; nt += 2) {
            size_t wsb = 0;
            for (int kind = 0; kind < 3; kind++) {
                size_t m = tq_cpu_wino_ws(&d, kind, nt, tile);
                if (m > wsb) wsb = m;
            }
            void *ws = tmem(wsb);
            for (tq_dtype dt = TQ_F32; dt <= TQ_BF16; dt++) {
                size_t es = tq_dtype_size(dt);
                void *xd = to_dt(dt, x, nx), *wd = to_dt(dt, w, nw), *dyd = to_dt(dt, dy, ny);
                void *y[2], *dx[2], *dx1[2];
                float *dw[2], *db[2];
                for (int v = 0; v < 2; v++) {
                    int vec = v ? 16 : 8;
                    y[v] = tmem(ny * es);
                    dx[v] = tmem(nx * es);
                    dx1[v] = to_dt(dt, x, nx);
                    dw[v] = fcopy(w, nw);
                    db[v] = fcopy(b, K);
                    assert_int_equal(tq_cpu_wino_fwd(nt, vec, tile, &d, dt, y[v], xd, wd, b, ws), TQ_OK);
                    assert_int_equal(tq_cpu_wino_bwd_data(nt, vec, tile, &d, dt, dx[v], 0.0f, dyd, wd, ws), TQ_OK);
                    assert_int_equal(tq_cpu_wino_bwd_data(nt, vec, tile, &d, dt, dx1[v], 1.0f, dyd, wd, ws), TQ_OK);
                    assert_int_equal(tq_cpu_wino_bwd_filter(nt, vec, tile, &d, dt, dw[v], db[v], xd, dyd, ws), TQ_OK);
                }
                const char *dn = dt_name(dt);
                if (memcmp(y[0], y[1], ny * es)) fail_msg("winograd 512 %s fwd (shape %zu tile %d, %d threads): not AVX2's bits", dn, si / 2, tile, nt);
                if (memcmp(dx[0], dx[1], nx * es)) fail_msg("winograd 512 %s dx (shape %zu tile %d): not AVX2's bits", dn, si / 2, tile);
                if (memcmp(dx1[0], dx1[1], nx * es)) fail_msg("winograd 512 %s dx beta 1 (shape %zu tile %d): not AVX2's bits", dn, si / 2, tile);
                if (memcmp(dw[0], dw[1], nw * 4)) fail_msg("winograd 512 %s dw (shape %zu tile %d): not AVX2's bits", dn, si / 2, tile);
                if (memcmp(db[0], db[1], K * 4)) fail_msg("winograd 512 %s db (shape %zu tile %d): not AVX2's bits", dn, si / 2, tile);
            }
        }
    }
}

/* The direct kernels of 1 to 4 input channels (cpu_thin_vec.h: a first layer's forward and filter
 * gradient). Called directly: y, dw, db against the double reference (f32); the AVX-512 kernels
 * (vec 16, where K is a multiple of 16) give the AVX2 ones' bits; f16/bf16 convert exactly on load
 * and round once on store, so y is the f32 kernel's result on the rounded inputs, rounded, and dw,
 * db are that result exactly; dw and db accumulate. Then through the backend (TQ_CPU_THIN=1, 1 and
 * 3 threads): every convolution check of run_conv_case, bwd_data on its own path. Shapes: 1, 2, 3
 * and 4 channels, odd sizes, pad 0/1/2, 8 outputs (AVX2 registers only), a 2×2 image (no interior
 * pixel), a 28×28 one (the cnn's conv1), a NaN. */
static void test_conv_thin(void **state) {
    (void)state;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c")) {
        print_message("no AVX2/FMA/F16C on this CPU: the thin convolution kernels do not run here\n");
        return;
    }
    static const int shapes[][7] = {   /* n h w c k pad bias */
        { 2, 5, 7, 1, 16, 1, 1 }, { 3, 6, 6, 3, 16, 1, 0 }, { 2, 4, 5, 1, 8, 2, 1 }, { 2, 6, 5, 4, 32, 0, 1 },
        { 1, 3, 3, 2, 16, 0, 1 }, { 2, 2, 2, 3, 16, 1, 0 }, { 5, 28, 28, 1, 32, 1, 1 },
    };
    const int avx512 = __builtin_cpu_supports("avx512f");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int *q = shapes[si];
        tq_conv_desc d = { { q[0], q[1], q[2], q[3] }, q[4], 3, 3, 1, q[5] };
        assert_true(tq_cpu_thin_fits(&d));
        size_t nx = tq_shape_numel(d.x), ny = tq_shape_numel(tq_conv_yshape(&d)), K = (size_t)d.k;
        size_t nw = K * 9 * d.x.c;
        float *x = frand(nx, 1.0), *w = frand(nw, 1.0), *b = q[6] ? frand(K, 0.5) : NULL, *dy = frand(ny, 1.0);
        float *dw0 = frand(nw, 1.0), *db0 = frand(K, 1.0);
        double *yref = dalloc(ny), *gx = dalloc(nx), *gw = dalloc(nw), *gb = dalloc(K);
        ref_conv(&d, dup_d(x, nx), dup_d(w, nw), b ? dup_d(b, K) : NULL, yref);
        ref_conv_bwd(&d, dup_d(x, nx), dup_d(w, nw), dup_d(dy, ny), gx, gw, gb);
        for (int nt = 1; nt <= 3; nt += 2) {
            size_t wsb = tq_cpu_thin_ws(&d, 0, nt), w2 = tq_cpu_thin_ws(&d, 2, nt);
            void *ws = tmem(wsb > w2 ? wsb : w2);
            float *yf[2] = { NULL, NULL }, *dwf[2] = { NULL, NULL }, *dbf[2] = { NULL, NULL };
            for (tq_dtype dt = TQ_F32; dt <= TQ_BF16; dt++) {
                size_t es = tq_dtype_size(dt);
                const float *xs = dt == TQ_F32 ? x : rnd(dt, x, nx), *wsrc = dt == TQ_F32 ? w : rnd(dt, w, nw);
                const float *dys = dt == TQ_F32 ? dy : rnd(dt, dy, ny);
                void *xd = to_dt(dt, x, nx), *wd = to_dt(dt, w, nw), *dyd = to_dt(dt, dy, ny);
                for (int v = 0; v < 1 + (avx512 && K % 16 == 0); v++) {
                    int vec = v ? 16 : 8;
                    void *y = tmem(ny * es);
                    float *dw = fcopy(dw0, nw), *db = fcopy(db0, K);
                    assert_int_equal(tq_cpu_thin_fwd(nt, vec, &d, dt, y, xd, wd, b, ws), TQ_OK);
                    assert_int_equal(tq_cpu_thin_bwd_filter(nt, vec, &d, dt, dw, db, xd, dyd, ws), TQ_OK);
                    float *yv = from_dt(dt, y, ny);
                    const char *dn = dt_name(dt);
                    if (dt == TQ_F32) {
                        CHECK_REL(rel_fd(yv, yref, ny), 1e-5, "thin shape %zu fwd (vec %d, %d threads)", si, vec, nt);
                        CHECK_REL(rel_fd(fdiff(dw, dw0, nw), gw, nw), 1e-5, "thin shape %zu dw", si);
                        CHECK_REL(rel_fd(fdiff(db, db0, K), gb, K), 1e-5, "thin shape %zu db", si);
                        if (v == 0) { yf[0] = yv; dwf[0] = dw; dbf[0] = db; }
                    } else {
                        /* against the f32 kernel on the same (rounded) inputs */
                        float *y32 = tmem(ny * 4), *dw32 = fcopy(dw0, nw), *db32 = fcopy(db0, K);
                        assert_int_equal(tq_cpu_thin_fwd(nt, vec, &d, TQ_F32, y32, xs, wsrc, b, ws), TQ_OK);
                        assert_int_equal(tq_cpu_thin_bwd_filter(nt, vec, &d, TQ_F32, dw32, db32, xs, dys, ws), TQ_OK);
                        if (!same_bits(yv, rnd(dt, y32, ny), ny)) fail_msg("thin %s fwd (shape %zu): not the f32 result rounded", dn, si);
                        if (!same_bits(dw, dw32, nw)) fail_msg("thin %s dw (shape %zu): not the f32 result", dn, si);
                        if (!same_bits(db, db32, K)) fail_msg("thin %s db (shape %zu): not the f32 result", dn, si);
                    }
                    if (dt == TQ_F32 && v == 1) {
                        if (!same_bits(yv, yf[0], ny)) fail_msg("thin 512 fwd (shape %zu, %d threads): not AVX2's bits", si, nt);
                        if (!same_bits(dw, dwf[0], nw)) fail_msg("thin 512 dw (shape %zu): not AVX2's bits", si);
                        if (!same_bits(db, dbf[0], K)) fail_msg("thin 512 db (shape %zu): not AVX2's bits", si);
                    }
                }
            }
        }
        /* a NaN in x reaches the outputs whose windows see it, and only those */
        float *xn = fcopy(x, nx);
        xn[0] = NAN;
        void *ws = tmem(tq_cpu_thin_ws(&d, 0, 2));
        float *yn = tmem(ny * 4);
        assert_int_equal(tq_cpu_thin_fwd(2, 8, &d, TQ_F32, yn, xn, w, b, ws), TQ_OK);
        size_t nans = 0;
        for (size_t i = 0; i < ny; i++) nans += isnan(yn[i]) != 0;
        assert_true(nans > 0 && (nans < ny || ny == K));   /* one output pixel sees it all */
    }
    /* through the backend */
    tq_backend *keep = be;
    setenv("TQ_CPU_THIN", "1", 1);
    static const conv_case cases[] = {
        /* n  h   w  c  k  r  s st pad bias fd */
        { 2, 5,  7, 1, 16, 3, 3, 1, 1, 1, 0, 0 },
        { 3, 6,  6, 3, 16, 3, 3, 1, 1, 0, 0, 0 },
        { 2, 4,  5, 2,  8, 3, 3, 1, 2, 1, 0, 0 },
        { 1, 3,  3, 1,  8, 3, 3, 1, 0, 1, 1, 0 },   /* one output: the finite differences too */
        { 4, 28, 28, 1, 32, 3, 3, 1, 1, 1, 0, 0 },
    };
    for (int nt = 1; nt <= 3; nt += 2) {
        be = tq_cpu_backend_new(nt);
        assert_non_null(be);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            tq_conv_desc d = { { cases[i].n, cases[i].h, cases[i].w, cases[i].c }, cases[i].k, 3, 3, 1, cases[i].pad };
            /* the path really runs: conv_ws holds at least the thin kernels' bytes */
            for (tq_dtype dt = TQ_F32; dt <= TQ_BF16; dt++)
                assert_true(be->i->conv_ws(be, &d, dt) >= tq_cpu_thin_ws(&d, 2, nt));
            run_conv_case(&cases[i]);
        }
        tq_backend_free(be);
    }
    unsetenv("TQ_CPU_THIN");
    be = keep;
}

/* bf16 through oneDNN's f32 primitives on f32 chunks (cpu_dnnl.c, bf16_via_f32: by default on
 * Intel CPUs whose oneDNN has AVX-512 but no AMX, and below AVX-512), forced here
 * (TQ_CPU_BF16_F32=1, Winograd off) on a backend of its own: the route really runs (bf16 asks for the
 * workspace of f16's, which always takes it), and every convolution check holds through it,
 * chunked (several chunks, a shorter last one) and whole, convolutions and linear layers. */
static void test_conv_bf16_via_f32(void **state) {
    (void)state;
    static const conv_case cases[] = {
        /* n  h   w   c   k  r  s st pad bias fd lin */
        { 2, 5,  7,  3,  4, 3, 3, 1, 1, 1, 1, 0 },
        { 3, 6,  6,  5,  6, 3, 3, 2, 1, 0, 1, 0 },
        { 2, 4,  5,  8,  3, 1, 1, 1, 0, 1, 1, 0 },
        { 11, 28, 28, 16, 16, 3, 3, 1, 1, 1, 0, 0 },   /* 50 KB images: several 1 MB chunks */
        { 5, 1,  1,  7,  3, 1, 1, 1, 0, 1, 1, 1 },     /* a linear layer */
    };
    tq_backend *keep = be;
    setenv("TQ_CPU_BF16_F32", "1", 1);
    setenv("TQ_CPU_WINOGRAD", "0", 1);   /* it would take the 3×3 stride-1 ones */
    be = tq_cpu_backend_new(2);
    assert_non_null(be);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const conv_case *c = &cases[i];
        tq_conv_desc d = { { c->n, c->h, c->w, c->c }, c->k, c->r, c->s, c->stride, c->pad };
        if (!c->linear && !getenv("TQ_CPU_DNNL"))
            assert_int_equal(be->i->conv_ws(be, &d, TQ_BF16), be->i->conv_ws(be, &d, TQ_F16));
        run_conv_case(c);
    }
    tq_backend_free(be);
    unsetenv("TQ_CPU_BF16_F32");
    unsetenv("TQ_CPU_WINOGRAD");
    be = keep;
}

/* The forward and the weight gradient as GEMMs (cpu_dnnl.c, gemm_route: by default bf16 with AMX,
 * small maps, many channels), forced here for every f32/bf16 convolution on a backend of its own
 * (Winograd off: it would take the 3×3 stride-1 ones): the routes really run, and every
 * convolution check holds through them (y with and without a bias, dw and db added to what they
 * hold, exact workspaces), in one chunk of images and in several with a shorter last one; the
 * rule takes them where it should. */
static void test_conv_gemm(void **state) {
    (void)state;
    static const conv_case cases[] = {
        /* n   h  w  c   k  r  s st pad bias fd lin */
        { 2,  5, 7,  3,  4, 3, 3, 1, 1, 1, 1, 0 },
        { 3,  6, 6,  5,  6, 3, 3, 2, 1, 0, 1, 0 },
        { 2,  7, 5,  4,  5, 3, 3, 2, 1, 1, 1, 0 },
        { 2,  4, 5,  8,  3, 1, 1, 1, 0, 1, 1, 0 },
        { 2,  7, 7,  4,  5, 1, 1, 2, 0, 0, 1, 0 },
        { 1,  7, 5,  3,  2, 2, 3, 1, 0, 1, 1, 0 },
        { 2,  9, 9,  3,  4, 7, 7, 2, 3, 1, 1, 0 },
        { 37, 2, 3, 16, 24, 3, 3, 1, 1, 1, 0, 0 },   /* 32 images a chunk, then 5 */
        { 37, 2, 3, 16, 24, 1, 1, 1, 0, 1, 0, 0 },   /* 1×1: x's rows are the cols, chunked too */
    };
    tq_backend *keep = be;
    setenv("TQ_CPU_WINOGRAD", "0", 1);
    tq_cpu_conv_gemm_set(2);
    be = tq_cpu_backend_new(2);
    assert_non_null(be);
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const conv_case *c = &cases[i];
        tq_conv_desc d = { { c->n, c->h, c->w, c->c }, c->k, c->r, c->s, c->stride, c->pad };
        run_conv_case(c);
        ran += tq_dnnl_conv_is_gemm(be, &d, TQ_F32, 0) + tq_dnnl_conv_is_gemm(be, &d, TQ_F32, 2);
        /* backward-data as the forward of dy with the flipped kernel: stride 1, square, pad <= R−1 */
        int bwdd = c->stride == 1 && c->r == c->s && c->pad <= c->r - 1;
        if (!getenv("TQ_CPU_DNNL")) assert_int_equal(tq_dnnl_conv_is_gemm(be, &d, TQ_F32, 1), bwdd);
    }
    if (!getenv("TQ_CPU_DNNL")) assert_int_equal(ran, 2 * (int)(sizeof cases / sizeof cases[0]));
    tq_backend_free(be);
    /* the rule: bf16 where oneDNN has AMX, 256 channels out of the GEMM (backward-data: x's), the
     * weight gradient on at most 64 output positions, the forward and backward-data on at most 16 */
    tq_cpu_conv_gemm_set(1);
    be = tq_cpu_backend_new(2);
    tq_conv_desc small = { { 4, 4, 4, 256 }, 256, 3, 3, 1, 1 }, s2 = { { 4, 16, 16, 128 }, 256, 3, 3, 2, 1 };
    tq_conv_desc mid = { { 4, 8, 8, 256 }, 256, 3, 3, 1, 1 }, big = { { 4, 16, 16, 256 }, 256, 3, 3, 1, 1 };
    tq_conv_desc few = { { 4, 4, 4, 256 }, 128, 3, 3, 1, 1 };
    /* and the weight gradient of a 1×1 of C·K >= 65536 on at most 32×32 positions */
    tq_conv_desc one = { { 4, 16, 16, 512 }, 128, 1, 1, 1, 0 }, one_small = { { 4, 32, 32, 64 }, 256, 1, 1, 1, 0 };
    int amx = tq_dnnl_has_amx(be);
    for (int kind = 0; kind <= 2; kind++) {
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &small, TQ_BF16, kind), amx);
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &mid, TQ_BF16, kind), kind == 2 && amx);
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &s2, TQ_BF16, kind), kind == 2 && amx);
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &big, TQ_BF16, kind), 0);
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &few, TQ_BF16, kind), kind == 1 && amx);
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &small, TQ_F32, kind), 0);
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &one, TQ_BF16, kind), kind == 2 && amx);
        assert_int_equal(tq_dnnl_conv_is_gemm(be, &one_small, TQ_BF16, kind), 0);
    }
    tq_backend_free(be);
    tq_cpu_conv_gemm_set(-1);
    unsetenv("TQ_CPU_WINOGRAD");
    be = keep;
}

static void test_linear(void **state) {
    (void)state;
    conv_case c1 = { 5, 1, 1, 7, 3, 1, 1, 1, 0, 1, 1, 1 };
    conv_case c2 = { 4, 1, 1, 33, 10, 1, 1, 1, 0, 0, 1, 1 };
    conv_case c3 = { 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1 };
    run_conv_case(&c1);
    run_conv_case(&c2);
    run_conv_case(&c3);
}

/* every operation of kernels/backend.h is there */
static void test_iface_complete(void **state) {
    (void)state;
    int miss = tq_backend_i_missing(be->i);
    if (miss >= 0) print_error("the CPU backend lacks operation %d of tq_backend_i\n", miss);
    assert_int_equal(miss, -1);
}

static void test_conv_bad_desc(void **state) {
    (void)state;
    tq_conv_desc d = { { 2, 4, 4, 3 }, 0, 3, 3, 1, 1 };
    float buf[64];
    assert_int_equal(be->i->conv_ws(be, &d, TQ_F32), 0);
    CHECK_EINVAL(be->i->conv_fwd(be, &d, TQ_F32, buf, buf, buf, NULL, NULL, 0));
    d.k = 2; d.stride = 0;
    CHECK_EINVAL(be->i->conv_bwd_data(be, &d, TQ_F32, buf, 0.0f, buf, buf, NULL, 0));
    d.stride = 1; d.pad = 0; d.r = 5;
    CHECK_EINVAL(be->i->conv_bwd_filter(be, &d, TQ_F32, buf, NULL, buf, buf, NULL, 0));
}

/* ---- batch-norm ---- */

/* training-mode forward in double; mean/var (biased) out when non-NULL */
static void ref_bn_train(tq_shape s, const double *x, const double *g, const double *b,
                         double eps, double *y, double *mean, double *var) {
    size_t m = (size_t)s.n * s.h * s.w, C = (size_t)s.c;
    for (size_t c = 0; c < C; c++) {
        double mu = 0, v = 0;
        for (size_t i = 0; i < m; i++) mu += x[i * C + c];
        mu /= (double)m;
        for (size_t i = 0; i < m; i++) v += (x[i * C + c] - mu) * (x[i * C + c] - mu);
        v /= (double)m;
        double is = 1.0 / sqrt(v + eps);
        for (size_t i = 0; i < m; i++) y[i * C + c] = (x[i * C + c] - mu) * is * g[c] + b[c];
        if (mean) mean[c] = mu;
        if (var) var[c] = v;
    }
}
static void ref_bn_bwd(tq_shape s, const double *x, const double *g, double eps, const double *dy,
                       double *dx, double *dg, double *db) {
    size_t m = (size_t)s.n * s.h * s.w, C = (size_t)s.c;
    for (size_t c = 0; c < C; c++) {
        double mu = 0, v = 0;
        for (size_t i = 0; i < m; i++) mu += x[i * C + c];
        mu /= (double)m;
        for (size_t i = 0; i < m; i++) v += (x[i * C + c] - mu) * (x[i * C + c] - mu);
        v /= (double)m;
        double is = 1.0 / sqrt(v + eps), sb = 0, sg = 0;
        for (size_t i = 0; i < m; i++) {
            sb += dy[i * C + c];
            sg += dy[i * C + c] * (x[i * C + c] - mu) * is;
        }
        for (size_t i = 0; i < m; i++) {
            double xh = (x[i * C + c] - mu) * is;
            dx[i * C + c] = g[c] * is / (double)m * ((double)m * dy[i * C + c] - sb - xh * sg);
        }
        dg[c] = sg;
        db[c] = sb;
    }
}

typedef struct {
    tq_shape s;
    double *x, *g, *b, *y, *r, eps;
} bn_ctx;
static double bn_loss(void *p) {
    bn_ctx *c = p;
    ref_bn_train(c->s, c->x, c->g, c->b, c->eps, c->y, NULL, NULL);
    return ddot(c->r, c->y, tq_shape_numel(c->s));
}

/* bn_fwd_train, bn_fwd_infer (with the updated running stats) and bn_bwd (beta 0, then beta 1
 * from dx0 with the dgamma/dbeta buffers accumulating a second time) in dtype dt. */
typedef struct { float *y, *sm, *si, *rm, *rv, *yi, *dx, *dx1, *dg, *db, *dg2, *db2; } bn_out;

static void bn_run(tq_shape s, tq_dtype dt, const float *x, const float *g, const float *b,
                   const float *r, const float *dx0, const float *dg0, const float *db0,
                   const float *rm0, const float *rv0, bn_out *o) {
    size_t n = tq_shape_numel(s), C = (size_t)s.c;
    float eps = 1e-5f, mom = 0.1f;
    void *xh = to_dt(dt, x, n), *rh = to_dt(dt, r, n), *y = poisoned(dt, n);
    void *yi = poisoned(dt, n), *dx = poisoned(dt, n), *dx1 = to_dt(dt, dx0, n);
    o->sm = poisoned(TQ_F32, C);
    o->si = poisoned(TQ_F32, C);
    o->rm = fcopy(rm0, C);
    o->rv = fcopy(rv0, C);
    CHECK_OK(be->i->bn_fwd_train(be, s, dt, y, xh, g, b, o->sm, o->si, o->rm, o->rv, mom, eps, NULL, 0));
    CHECK_OK(be->i->bn_fwd_infer(be, s, dt, yi, xh, g, b, o->rm, o->rv, eps, NULL, 0));
    o->dg = fcopy(dg0, C);
    o->db = fcopy(db0, C);
    CHECK_OK(be->i->bn_bwd(be, s, dt, dx, 0.0f, o->dg, o->db, rh, xh, g, o->sm, o->si, NULL, NULL, 0.0f));
    o->dg2 = fcopy(o->dg, C);
    o->db2 = fcopy(o->db, C);
    CHECK_OK(be->i->bn_bwd(be, s, dt, dx1, 1.0f, o->dg2, o->db2, rh, xh, g, o->sm, o->si, NULL, NULL, 0.0f));
    o->y = from_dt(dt, y, n);
    o->yi = from_dt(dt, yi, n);
    o->dx = from_dt(dt, dx, n);
    o->dx1 = from_dt(dt, dx1, n);
}

static void run_bn_case(tq_shape s, double xoff, int fd) {
    size_t n = tq_shape_numel(s), C = (size_t)s.c, m = n / C;
    float eps = 1e-5f, mom = 0.1f;
    char name[80];
    snprintf(name, sizeof name, "bn (%d,%d,%d,%d)", s.n, s.h, s.w, s.c);
    float *x = frand(n, 1.5), *g = frand(C, 1), *b = frand(C, 1), *r = frand(n, 1);
    for (size_t i = 0; i < n; i++) x[i] += (float)(xoff + 0.3 * (double)(i % C));
    float *dx0 = frand(n, 1), *dg0 = frand(C, 1), *db0 = frand(C, 1);
    float *rm0 = frand(C, 1), *rv0 = frand(C, 1);
    for (size_t c = 0; c < C; c++) rv0[c] = fabsf(rv0[c]) + 0.5f;
    bn_ctx ctx = { s, dup_d(x, n), dup_d(g, C), dup_d(b, C), dalloc(n), dup_d(r, n), eps };
    double *yref = dalloc(n), *mean = dalloc(C), *var = dalloc(C);
    ref_bn_train(s, ctx.x, ctx.g, ctx.b, eps, yref, mean, var);

    bn_out o;
    bn_run(s, TQ_F32, x, g, b, r, dx0, dg0, db0, rm0, rv0, &o);
    CHECK_REL(rel_fd(o.y, yref, n), 1e-5, "%s fwd train", name);
    double *e_sm = dalloc(C), *e_si = dalloc(C), *e_rm = dalloc(C), *e_rv = dalloc(C);
    for (size_t c = 0; c < C; c++) {
        e_sm[c] = mean[c];
        e_si[c] = 1.0 / sqrt(var[c] + eps);
        e_rm[c] = (1 - mom) * rm0[c] + mom * mean[c];
        e_rv[c] = (1 - mom) * rv0[c] + mom * var[c] * (double)m / (double)(m - 1);
    }
    CHECK_REL(rel_fd(o.sm, e_sm, C), 1e-6, "%s save_mean", name);
    CHECK_REL(rel_fd(o.si, e_si, C), 1e-6, "%s save_invstd", name);
    CHECK_REL(rel_fd(o.rm, e_rm, C), 1e-6, "%s running_mean", name);
    CHECK_REL(rel_fd(o.rv, e_rv, C), 1e-6, "%s running_var", name);
    double *yiref = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        size_t c = i % C;
        yiref[i] = (x[i] - (double)o.rm[c]) / sqrt((double)o.rv[c] + eps) * g[c] + b[c];
    }
    CHECK_REL(rel_fd(o.yi, yiref, n), 1e-5, "%s fwd infer", name);

    char what[120];
    if (fd) {
        snprintf(what, sizeof what, "%s dx", name);
        fd_check(what, bn_loss, &ctx, ctx.x, n, o.dx, NULL, 1e-4);
        snprintf(what, sizeof what, "%s dx (beta 1)", name);
        fd_check(what, bn_loss, &ctx, ctx.x, n, o.dx1, dx0, 1e-4);
        snprintf(what, sizeof what, "%s dgamma", name);
        fd_check(what, bn_loss, &ctx, ctx.g, C, o.dg, dg0, 1e-4);
        snprintf(what, sizeof what, "%s dbeta", name);
        fd_check(what, bn_loss, &ctx, ctx.b, C, o.db, db0, 1e-4);
    } else {
        double *gx = dalloc(n), *gg = dalloc(C), *gb = dalloc(C);
        ref_bn_bwd(s, ctx.x, ctx.g, eps, ctx.r, gx, gg, gb);
        CHECK_REL(rel_fd(o.dx, gx, n), 1e-4, "%s dx", name);
        CHECK_REL(rel_fd(fdiff(o.dx1, dx0, n), gx, n), 1e-4, "%s dx (beta 1)", name);
        CHECK_REL(rel_fd(fdiff(o.dg, dg0, C), gg, C), 1e-4, "%s dgamma", name);
        CHECK_REL(rel_fd(fdiff(o.db, db0, C), gb, C), 1e-5, "%s dbeta", name);
    }
    /* the second call used its own sums, not the accumulated buffers: same increment */
    CHECK_REL(rel_ff(fdiff(o.dg2, o.dg, C), fdiff(o.dg, dg0, C), C), 1e-6, "%s dgamma again", name);
    CHECK_REL(rel_ff(fdiff(o.db2, o.db, C), fdiff(o.db, db0, C), C), 1e-6, "%s dbeta again", name);

    /* 16-bit: against f32 on the same (rounded) inputs */
    for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
        bn_out l, f;
        bn_run(s, dt, x, g, b, r, dx0, dg0, db0, rm0, rv0, &l);
        bn_run(s, TQ_F32, rnd(dt, x, n), g, b, rnd(dt, r, n), rnd(dt, dx0, n), dg0, db0, rm0, rv0, &f);
        const char *dn = dt_name(dt);
        double tol = tol_dt(dt);
        CHECK_REL(rel_ff(l.y, f.y, n), tol, "%s fwd %s", name, dn);
        CHECK_REL(rel_ff(l.sm, f.sm, C), 1e-6, "%s save_mean %s", name, dn);
        CHECK_REL(rel_ff(l.si, f.si, C), 1e-6, "%s save_invstd %s", name, dn);
        CHECK_REL(rel_ff(l.yi, f.yi, n), tol, "%s infer %s", name, dn);
        CHECK_REL(rel_ff(l.dx, f.dx, n), tol, "%s dx %s", name, dn);
        CHECK_REL(rel_ff(l.dx1, f.dx1, n), tol, "%s dx beta1 %s", name, dn);
        CHECK_REL(rel_ff(fdiff(l.dg, dg0, C), fdiff(f.dg, dg0, C), C), tol, "%s dgamma %s", name, dn);
        CHECK_REL(rel_ff(fdiff(l.db, db0, C), fdiff(f.db, db0, C), C), tol, "%s dbeta %s", name, dn);
    }
}

static void test_bn(void **state) {
    (void)state;
    run_bn_case((tq_shape){ 2, 3, 4, 5 }, 0.0, 1);
    run_bn_case((tq_shape){ 3, 1, 1, 7 }, 2.0, 1);            /* after a linear layer */
    run_bn_case((tq_shape){ 2, 2, 2, 300 }, 0.5, 1);          /* more than one channel group */
    /* few channels: rows folded 4 and 1 at a time into 64-element rows, 3 rows left over */
    run_bn_case((tq_shape){ 3, 3, 3, 16 }, 1.0, 1);
    run_bn_case((tq_shape){ 2, 3, 3, 64 }, 0.0, 1);
}

/* M ~ 10^5 with a large mean: the statistics must not lose precision */
static void test_bn_large(void **state) {
    (void)state;
    run_bn_case((tq_shape){ 16, 80, 80, 3 }, 50.0, 0);
    run_bn_case((tq_shape){ 8, 32, 32, 24 }, 0.0, 0);
}

/* bn_bwd with relu_y (and dres) is relu_bwd → the add's accumulates → bn_bwd bit for bit:
 * every dtype, beta 0/1 on dx and on dres, channel counts off the vector width, a NaN and ±0
 * among the ReLU outputs, the serial and the parallel path. */
static void test_bn_bwd_fused_is_the_chain(void **state) {
    (void)state;
    const tq_shape shapes[] = { { 2, 3, 5, 70 }, { 8, 16, 16, 16 }, { 4, 7, 9, 33 } };
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (tq_dtype dt = TQ_F32; dt <= TQ_BF16; dt++)
            for (int v = 0; v < 8; v++) {   /* bits: beta_dx, with dres, beta_dres */
                tq_shape s = shapes[si];
                size_t n = tq_shape_numel(s), C = (size_t)s.c, es = tq_dtype_size(dt);
                float bdx = (float)(v & 1), bres = (float)((v >> 2) & 1);
                int with_res = (v >> 1) & 1;
                float *xf = frand(n, 2), *g = frand(C, 1), *b = frand(C, 1);
                float *sm = poisoned(TQ_F32, C), *sd = poisoned(TQ_F32, C);
                void *x = to_dt(dt, xf, n), *y = poisoned(dt, n), *dy = to_dt(dt, frand(n, 1), n);
                CHECK_OK(be->i->bn_fwd_train(be, s, dt, y, x, g, b, sm, sd, NULL, NULL, 0.1f, 1e-5f, NULL, 1));
                tq_st(y, dt, n / 3, NAN);          /* a NaN output passes its gradient */
                tq_st(y, dt, n / 2, -0.0f);
                float *d0 = frand(n, 1), *r0 = frand(n, 1);
                /* the chain */
                void *dyb = poisoned(dt, n), *dbn = poisoned(dt, n);
                void *dxa = bdx != 0.0f ? to_dt(dt, d0, n) : poisoned(dt, n);
                void *dra = bres != 0.0f ? to_dt(dt, r0, n) : poisoned(dt, n);
                float *dga = tmem(C * 4), *dba = tmem(C * 4), *dgb = tmem(C * 4), *dbb = tmem(C * 4);
                memset(dga, 0, C * 4); memset(dba, 0, C * 4); memset(dgb, 0, C * 4); memset(dbb, 0, C * 4);
                CHECK_OK(be->i->relu_bwd(be, n, dt, dyb, 0.0f, dy, y));
                CHECK_OK(be->i->accumulate(be, n, dt, dbn, 0.0f, dyb));
                if (with_res) CHECK_OK(be->i->accumulate(be, n, dt, dra, bres, dyb));
                CHECK_OK(be->i->bn_bwd(be, s, dt, dxa, bdx, dga, dba, dbn, x, g, sm, sd, NULL, NULL, 0.0f));
                /* fused */
                void *dxb = bdx != 0.0f ? to_dt(dt, d0, n) : poisoned(dt, n);
                void *drb = bres != 0.0f ? to_dt(dt, r0, n) : poisoned(dt, n);
                CHECK_OK(be->i->bn_bwd(be, s, dt, dxb, bdx, dgb, dbb, dy, x, g, sm, sd, y,
                                       with_res ? drb : NULL, bres));
                assert_memory_equal(dxa, dxb, n * es);
                if (with_res) assert_memory_equal(dra, drb, n * es);
                assert_memory_equal(dga, dgb, C * 4);
                assert_memory_equal(dba, dbb, C * 4);
            }
    /* dres without the ReLU it sits behind is refused */
    tq_shape s = { 1, 2, 2, 1 };
    float x[4] = { 1, 2, 3, 4 }, dy[4] = { 0 }, dx[4], dr[4], sm = 2.5f, sd = 1.0f, g = 1, dg = 0, db = 0;
    CHECK_EINVAL(be->i->bn_bwd(be, s, TQ_F32, dx, 0.0f, &dg, &db, dy, x, &g, &sm, &sd, NULL, dr, 0.0f));
}

/* batch-norm's 16-bit passes with the CPU's own conversions give the emulated passes' bits:
 * bf16 with AVX512_BF16's vcvtne2ps2bf16 (cpu_bn_bf16.c), f16 through F16C (cpu_f16c.c, its
 * reductions too). norm (plain, ReLU, residual + ReLU), fwd_train, fwd_infer and bn_bwd (ReLU
 * mask, dres, beta 0/1), channel counts that take the whole vectors, the tails and the folded
 * rows, with NaN, ±inf, values that round to inf and channels whose outputs are subnormal
 * (which vcvtne2ps2bf16 alone would flush to zero). Skipped where the CPU lacks the instructions. */
static void bn_native_case(tq_dtype dt, void (*set)(int)) {
    const tq_shape shapes[] = { { 2, 3, 5, 70 }, { 8, 16, 16, 16 }, { 4, 7, 9, 33 }, { 2, 4, 4, 64 },
                                { 3, 5, 7, 300 } };
    int denormals = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        tq_shape s = shapes[si];
        size_t n = tq_shape_numel(s), C = (size_t)s.c;
        float *xf = frand(n, 3), *g = frand(C, 1), *b = frand(C, 0.5), *mu = frand(C, 0.2);
        float *is = frand(C, 1), *rv = frand(C, 1);
        for (size_t c = 0; c < C; c++) { is[c] = 0.5f + fabsf(is[c]); rv[c] = 0.1f + fabsf(rv[c]); }
        if (dt == TQ_BF16) {
            g[0] = 1e-39f; b[0] = 0.0f;                     /* channel 0: subnormal outputs */
            if (C > 3) { g[3] = -2e-39f; b[3] = 1e-40f; }   /* and some negative ones */
            g[1] = 3e38f;                                    /* channel 1: some round up to inf */
        } else {
            g[0] = 1e-5f; b[0] = 0.0f;                      /* f16's subnormals are below 6.1e-5 */
            if (C > 3) { g[3] = -2e-5f; b[3] = 1e-6f; }
            g[1] = 3e4f;                                     /* past 65504: inf */
        }
        xf[7] = NAN; xf[C + 2] = INFINITY; xf[2 * C + 5] = -INFINITY;
        void *x = to_dt(dt, xf, n), *res = to_dt(dt, frand(n, 2), n), *dy = to_dt(dt, frand(n, 1), n);
        for (int v = 0; v <= 12; v++) {   /* v < 3: norm variants; 3: infer; 4: fwd_train; 5..12: bwd */
            void *out[2], *out2[2];
            float *dg[2], *db[2];
            for (int nat = 0; nat < 2; nat++) {
                set(nat);
                out[nat] = poisoned(dt, n); out2[nat] = poisoned(dt, n);
                dg[nat] = tmem(C * 4); db[nat] = tmem(C * 4);
                memset(dg[nat], 0, C * 4); memset(db[nat], 0, C * 4);
                if (v < 3)
                    CHECK_OK(be->i->bn_norm(be, s, dt, out[nat], x, v == 2 ? res : NULL, g, b, mu, is, v > 0));
                else if (v == 3)
                    CHECK_OK(be->i->bn_fwd_infer(be, s, dt, out[nat], x, g, b, mu, rv, 1e-5f, res, 1));
                else if (v == 4) {
                    /* the statistics (f32) through the reductions: dg, db hold them */
                    CHECK_OK(be->i->bn_fwd_train(be, s, dt, out[nat], x, g, b, dg[nat], db[nat], NULL, NULL, 0.1f, 1e-5f, res, 1));
                } else {   /* bits of v - 5: beta_dx, with dres, beta_dres */
                    int w = v - 5, with_res = (w >> 1) & 1;
                    float bdx = (float)(w & 1), bres = (float)((w >> 2) & 1);
                    void *ry = tmem(n * 2);
                    CHECK_OK(be->i->bn_norm(be, s, dt, ry, x, NULL, g, b, mu, is, 1));
                    if (bdx != 0.0f) memcpy(out[nat], res, n * 2);
                    if (bres != 0.0f) memcpy(out2[nat], dy, n * 2);
                    CHECK_OK(be->i->bn_bwd(be, s, dt, out[nat], bdx, dg[nat], db[nat], dy, x, g, mu, is, ry,
                                           with_res ? out2[nat] : NULL, bres));
                }
            }
            set(-1);
            if (memcmp(out[0], out[1], n * 2) || memcmp(out2[0], out2[1], n * 2) ||
                memcmp(dg[0], dg[1], C * 4) || memcmp(db[0], db[1], C * 4)) {
                for (size_t i = 0; i < n; i++)
                    if (((uint16_t *)out[0])[i] != ((uint16_t *)out[1])[i])
                        fail_msg("dtype %d shape %zu variant %d: element %zu is 0x%04x emulated, 0x%04x native", (int)dt,
                                 si, v, i, ((uint16_t *)out[0])[i], ((uint16_t *)out[1])[i]);
                fail_msg("dtype %d shape %zu variant %d: dres, the statistics or the parameter gradients differ",
                         (int)dt, si, v);
            }
            for (size_t i = 0; i < n; i++) {
                uint16_t h = ((uint16_t *)out[0])[i];
                denormals += dt == TQ_BF16 ? (h & 0x7f80) == 0 && (h & 0x7f) != 0 : (h & 0x7c00) == 0 && (h & 0x3ff) != 0;
            }
        }
    }
    assert_true(denormals > 0);   /* the subnormal outputs were exercised */
}

static void test_bn_native(void **state) {
    (void)state;
    if (tq_cpu_bf16_cpu()) bn_native_case(TQ_BF16, tq_cpu_bf16_native_set);
    else print_message("bf16 skipped: this CPU has no AVX512_BF16\n");
    if (tq_cpu_avx2_f16c()) bn_native_case(TQ_F16, tq_cpu_f16_native_set);
    else print_message("f16 skipped: this CPU has no F16C\n");
}

/* f16 max pooling through F16C (cpu_f16c.c) gives the emulated rows' bits: forward and backward
 * (beta 0 and 1, with and without the fused ReLU), odd heights and widths (the uncovered row and
 * column), channel counts that take the vectors, the tails, several column chunks and none (more
 * channels than a chunk holds: the emulated rows), with ties, NaN and ±inf in the windows */
static void test_maxpool_f16_native(void **state) {
    (void)state;
    if (!tq_cpu_avx2_f16c()) { print_message("skipped: this CPU has no F16C\n"); return; }
    const tq_shape shapes[] = { { 2, 7, 9, 3 }, { 3, 8, 8, 16 }, { 2, 5, 70, 33 }, { 1, 4, 6, 1100 } };
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        tq_shape s = shapes[si], so = { s.n, s.h / 2, s.w / 2, s.c };
        size_t n = tq_shape_numel(s), no = tq_shape_numel(so);
        float *xf = frand(n, 2);
        for (size_t i = 0; i < n; i += 7) xf[i] = xf[i + 1 < n ? i + 1 : i];   /* ties */
        xf[3] = NAN; xf[n / 2] = INFINITY; xf[n / 3] = -INFINITY; xf[n - 1] = -NAN;
        void *x = to_dt(TQ_F16, xf, n), *dy = to_dt(TQ_F16, frand(no, 1), no);
        void *d0 = to_dt(TQ_F16, frand(n, 1), n);
        for (int v = 0; v < 6; v++) {   /* relu: v & 1; v < 2: fwd; 2, 3: bwd, beta 0; 4, 5: beta 1 */
            int relu = v & 1;
            float beta = v >= 4 ? 1.0f : 0.0f;
            void *out[2];
            for (int nat = 0; nat < 2; nat++) {
                tq_cpu_f16_native_set(nat);
                if (v < 2) {
                    out[nat] = poisoned(TQ_F16, no);
                    CHECK_OK(be->i->maxpool_fwd(be, s, TQ_F16, out[nat], x, relu));
                } else {
                    out[nat] = poisoned(TQ_F16, n);
                    if (beta != 0.0f) memcpy(out[nat], d0, n * 2);
                    CHECK_OK(be->i->maxpool_bwd(be, s, TQ_F16, out[nat], beta, dy, x, relu));
                }
            }
            tq_cpu_f16_native_set(-1);
            size_t len = v < 2 ? no : n;
            for (size_t i = 0; i < len; i++)
                if (((uint16_t *)out[0])[i] != ((uint16_t *)out[1])[i])
                    fail_msg("shape %zu variant %d: element %zu is 0x%04x emulated, 0x%04x native", si, v, i,
                             ((uint16_t *)out[0])[i], ((uint16_t *)out[1])[i]);
        }
    }
}

/* casts between f16 and f32 through F16C (cpu_f16c.c) give the emulated casts' bits: every f16
 * pattern but the signalling NaNs (which vcvtph2ps quiets) to f32, and f32 patterns through all
 * of f16's rounding cases (subnormal, ties, overflow, NaN) back, at lengths that take the
 * 8-value vectors and the tails; the optimizers' fused weight copy too */
static void test_cast_f16_native(void **state) {
    (void)state;
    if (!tq_cpu_avx2_f16c()) { print_message("skipped: this CPU has no F16C\n"); return; }
    const size_t n = 65536 + 13;
    uint16_t *h = tmem(n * 2);
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)i;
        int snan = (v & 0x7c00) == 0x7c00 && (v & 0x3ff) && !(v & 0x200);
        h[i] = snan ? (uint16_t)(v | 0x200) : v;
    }
    float *f = tmem(n * 4);
    for (size_t i = 0; i < n; i++) {   /* around every f16 value: ±quarter, half and three quarters of its unit */
        uint32_t u = tq_f32_bits(tq_f16_to_f32(h[i] & 0x7fff ? h[i] : (uint16_t)(i >> 4)));
        f[i] = tq_bits_f32(u + (uint32_t)((i * 2654435761u) & 0x1fff) - 0x1000u);
    }
    f[5] = NAN; f[6] = -NAN; f[7] = 65520.0f; f[8] = 65519.996f; f[9] = 1e-40f; f[10] = -3e-8f;
    float *a[2] = { tmem(n * 4), tmem(n * 4) };
    uint16_t *o[2] = { tmem(n * 2), tmem(n * 2) };
    for (size_t len = 1; len <= n; len = len < 40 ? len + 1 : len == n ? n + 1 : n) {
        for (int nat = 0; nat < 2; nat++) {
            tq_cpu_f16_native_set(nat);
            memset(a[nat], 0xff, n * 4);   /* NaN */
            memset(o[nat], 0xff, n * 2);
            CHECK_OK(be->i->cast(be, len, TQ_F32, a[nat], TQ_F16, h));
            CHECK_OK(be->i->cast(be, len, TQ_F16, o[nat], TQ_F32, f));
        }
        tq_cpu_f16_native_set(-1);
        assert_memory_equal(a[0], a[1], n * 4);   /* nothing past len written either */
        assert_memory_equal(o[0], o[1], n * 2);
    }
    /* the weight copy the optimizers write: SGD and AdamW */
    const size_t p = 4099;
    float *g = frand(p, 1), *w0 = frand(p, 2);
    for (int opt = 0; opt < 2; opt++) {
        uint16_t *wl[2];
        for (int nat = 0; nat < 2; nat++) {
            tq_cpu_f16_native_set(nat);
            float *w = tmem(p * 4), *m = tmem(p * 4), *v = tmem(p * 4);
            memcpy(w, w0, p * 4);
            memset(m, 0, p * 4); memset(v, 0, p * 4);
            wl[nat] = poisoned(TQ_F16, p);
            if (opt == 0) CHECK_OK(be->i->sgd_step(be, p, w, g, m, 0.1f, 0.9f, 1e-4f, 1, NULL, wl[nat], TQ_F16));
            else CHECK_OK(be->i->adamw_step(be, p, w, g, m, v, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 0.1f, 0.001f, NULL, wl[nat], TQ_F16));
        }
        tq_cpu_f16_native_set(-1);
        assert_memory_equal(wl[0], wl[1], p * 2);
    }
}

/* results do not depend on the thread count: 1, 2 and 3 threads give the same bits, on shapes
 * whose reductions take 12 row segments (16×32×32×12, folded to 60 lanes), 4 of them
 * (resnet20's 14×14×32 at batch 8), and one segment with its lanes split per thread
 * (5×10×10×160: 2 blocks of lanes at 2 threads, 3 at 3); f32, and bf16 behind a ReLU with the
 * residual gradient */
static void test_bn_deterministic(void **state) {
    (void)state;
    static const tq_shape shapes[] = { { 16, 32, 32, 12 }, { 8, 14, 14, 32 }, { 5, 10, 10, 160 } };
    int saved = be->threads;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 2; di++) {
            tq_shape s = shapes[si];
            tq_dtype dt = di ? TQ_BF16 : TQ_F32;
            size_t n = tq_shape_numel(s), C = (size_t)s.c, es = tq_dtype_size(dt);
            void *x = to_dt(dt, frand(n, 2), n), *dy = to_dt(dt, frand(n, 1), n);
            float *g = frand(C, 1), *b = frand(C, 1);
            void *y[3], *dx[3], *dr[3];
            float *sm[3], *si_[3], *dg[3], *db[3];
            for (int t = 0; t < 3; t++) {
                be->threads = t + 1;
                y[t] = poisoned(dt, n); dx[t] = poisoned(dt, n); dr[t] = poisoned(dt, n);
                sm[t] = poisoned(TQ_F32, C); si_[t] = poisoned(TQ_F32, C);
                dg[t] = tmem(C * 4); db[t] = tmem(C * 4);
                memset(dg[t], 0, C * 4); memset(db[t], 0, C * 4);
                CHECK_OK(be->i->bn_fwd_train(be, s, dt, y[t], x, g, b, sm[t], si_[t], NULL, NULL, 0.1f,
                                             1e-5f, NULL, di));
                CHECK_OK(be->i->bn_bwd(be, s, dt, dx[t], 0.0f, dg[t], db[t], dy, x, g, sm[t], si_[t],
                                       di ? y[t] : NULL, di ? dr[t] : NULL, 0.0f));
            }
            for (int t = 1; t < 3; t++) {
                if (memcmp(y[0], y[t], n * es) || memcmp(sm[0], sm[t], C * 4) || memcmp(si_[0], si_[t], C * 4) ||
                    memcmp(dx[0], dx[t], n * es) || memcmp(dg[0], dg[t], C * 4) || memcmp(db[0], db[t], C * 4) ||
                    (di && memcmp(dr[0], dr[t], n * es)))
                    fail_msg("bn %dx%dx%dx%d %s: %d threads' bits are not 1 thread's", s.n, s.h, s.w, s.c,
                             di ? "bf16" : "f32", t + 1);
            }
        }
    be->threads = saved;
}

static void test_bn_bad(void **state) {
    (void)state;
    float v[4] = { 1, 2, 3, 4 }, o[4];
    CHECK_EINVAL(be->i->bn_fwd_train(be, (tq_shape){ 1, 1, 1, 4 }, TQ_F32, o, v, v, v, o, o, NULL,
                                     NULL, 0.1f, 1e-5f, NULL, 0));
    CHECK_EINVAL(be->i->bn_fwd_infer(be, (tq_shape){ 1, 0, 1, 4 }, TQ_F32, o, v, v, v, v, v, 1e-5f, NULL, 0));
}

/* ---- element-wise ---- */

typedef struct { size_t n; double *x, *r; } relu_ctx;
static double relu_loss(void *p) {
    relu_ctx *c = p;
    double s = 0;
    for (size_t i = 0; i < c->n; i++) s += c->r[i] * (c->x[i] > 0 ? c->x[i] : 0);
    return s;
}

static void test_relu(void **state) {
    (void)state;
    size_t sizes[2] = { 1001, 100003 };
    for (int t = 0; t < 2; t++) {
        size_t n = sizes[t];
        float *x = frand(n, 1), *r = frand(n, 1);
        for (size_t i = 0; i < n; i++) if (fabsf(x[i]) < 1e-3f) x[i] = 0.5f;
        float *y = poisoned(TQ_F32, n);
        CHECK_OK(be->i->relu_fwd(be, n, TQ_F32, y, x));
        for (size_t i = 0; i < n; i++) assert_true(y[i] == (x[i] > 0 ? x[i] : 0.0f));
        float *dx = poisoned(TQ_F32, n), *dx0 = frand(n, 1), *dx1 = fcopy(dx0, n);
        CHECK_OK(be->i->relu_bwd(be, n, TQ_F32, dx, 0.0f, r, y));
        CHECK_OK(be->i->relu_bwd(be, n, TQ_F32, dx1, 1.0f, r, y));
        relu_ctx ctx = { n, dup_d(x, n), dup_d(r, n) };
        if (t == 0) {
            fd_check("relu dx", relu_loss, &ctx, ctx.x, n, dx, NULL, 1e-6);
            fd_check("relu dx (beta 1)", relu_loss, &ctx, ctx.x, n, dx1, dx0, 1e-6);
        }
        for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
            void *xh = to_dt(dt, x, n), *rh = to_dt(dt, r, n), *yh = poisoned(dt, n);
            CHECK_OK(be->i->relu_fwd(be, n, dt, yh, xh));
            CHECK_REL(rel_ff(from_dt(dt, yh, n), y, n), tol_dt(dt), "relu fwd %s", dt_name(dt));
            void *dxh = poisoned(dt, n), *dxh1 = to_dt(dt, dx0, n);
            CHECK_OK(be->i->relu_bwd(be, n, dt, dxh, 0.0f, rh, yh));
            CHECK_REL(rel_ff(from_dt(dt, dxh, n), dx, n), tol_dt(dt), "relu bwd %s", dt_name(dt));
            CHECK_OK(be->i->relu_bwd(be, n, dt, dxh1, 1.0f, rh, yh));
            CHECK_REL(rel_ff(from_dt(dt, dxh1, n), dx1, n), tol_dt(dt), "relu bwd beta1 %s",
                      dt_name(dt));
        }
    }
    /* NaN propagates (as torch.relu) */
    float xn[2] = { NAN, -1.0f }, yn[2];
    CHECK_OK(be->i->relu_fwd(be, 2, TQ_F32, yn, xn));
    assert_true(isnan(yn[0]) && yn[1] == 0.0f);
}

typedef struct { size_t n; double *a, *b, *r; } add_ctx;
static double add_loss(void *p) {
    add_ctx *c = p;
    double s = 0;
    for (size_t i = 0; i < c->n; i++) s += c->r[i] * (c->a[i] + c->b[i]);
    return s;
}

static void test_add_accumulate(void **state) {
    (void)state;
    size_t sizes[2] = { 999, 70001 };
    for (int t = 0; t < 2; t++) {
        size_t n = sizes[t];
        float *a = frand(n, 1), *b = frand(n, 1), *r = frand(n, 1);
        float *y = poisoned(TQ_F32, n);
        CHECK_OK(be->i->add_fwd(be, n, TQ_F32, y, a, b));
        double *yref = dalloc(n);
        for (size_t i = 0; i < n; i++) yref[i] = (double)a[i] + b[i];
        CHECK_REL(rel_fd(y, yref, n), 1e-7, "add fwd");
        /* residual add backward: both inputs receive dy, the second through beta 1 */
        float *da = poisoned(TQ_F32, n), *db0 = frand(n, 1), *db = fcopy(db0, n);
        CHECK_OK(be->i->accumulate(be, n, TQ_F32, da, 0.0f, r));
        CHECK_OK(be->i->accumulate(be, n, TQ_F32, db, 1.0f, r));
        add_ctx ctx = { n, dup_d(a, n), dup_d(b, n), dup_d(r, n) };
        fd_check("add da (beta 0)", add_loss, &ctx, ctx.a, n, da, NULL, 1e-4);
        fd_check("add db (beta 1)", add_loss, &ctx, ctx.b, n, db, db0, 1e-4);
        float *d2 = fcopy(db0, n);
        CHECK_OK(be->i->accumulate(be, n, TQ_F32, d2, 0.5f, r));
        for (size_t i = 0; i < n; i++) assert_true(d2[i] == 0.5f * db0[i] + r[i]);
        for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
            void *ah = to_dt(dt, a, n), *bh = to_dt(dt, b, n), *yh = poisoned(dt, n);
            CHECK_OK(be->i->add_fwd(be, n, dt, yh, ah, bh));
            CHECK_REL(rel_ff(from_dt(dt, yh, n), y, n), tol_dt(dt), "add %s", dt_name(dt));
            void *rh = to_dt(dt, r, n), *dah = poisoned(dt, n), *dbh = to_dt(dt, db0, n);
            CHECK_OK(be->i->accumulate(be, n, dt, dah, 0.0f, rh));
            assert_memory_equal(dah, rh, n * 2);
            CHECK_OK(be->i->accumulate(be, n, dt, dbh, 1.0f, rh));
            CHECK_REL(rel_ff(from_dt(dt, dbh, n), db, n), tol_dt(dt), "accumulate %s", dt_name(dt));
        }
    }
}

/* ---- pooling ---- */

static void ref_maxpool(tq_shape s, const double *x, double *y) {
    int P = s.h / 2, Q = s.w / 2, C = s.c;
    for (int n = 0; n < s.n; n++)
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++)
                for (int c = 0; c < C; c++) {
                    double m = -INFINITY;
                    for (int a = 0; a < 2; a++)
                        for (int b = 0; b < 2; b++) {
                            double v = x[(((size_t)n * s.h + 2 * p + a) * s.w + 2 * q + b) * C + c];
                            if (v > m) m = v;
                        }
                    y[(((size_t)n * P + p) * Q + q) * C + c] = m;
                }
}
typedef struct { tq_shape s; double *x, *y, *r; size_t ny; int avg, relu; } pool_ctx;
static double pool_loss(void *p) {
    pool_ctx *c = p;
    if (c->avg) {
        size_t hw = (size_t)c->s.h * c->s.w, C = (size_t)c->s.c;
        for (int n = 0; n < c->s.n; n++)
            for (size_t ch = 0; ch < C; ch++) {
                double a = 0;
                for (size_t i = 0; i < hw; i++) a += c->x[((size_t)n * hw + i) * C + ch];
                c->y[(size_t)n * C + ch] = a / (double)hw;
            }
    } else {
        ref_maxpool(c->s, c->x, c->y);
        if (c->relu)
            for (size_t i = 0; i < c->ny; i++) c->y[i] = c->y[i] > 0 ? c->y[i] : 0;
    }
    return ddot(c->r, c->y, c->ny);
}

static void pool_run(tq_shape s, int avg, int relu, tq_dtype dt, const float *x, const float *r,
                     const float *dx0, float **yo, float **dxo, float **dx1o) {
    size_t nx = tq_shape_numel(s), ny = avg ? (size_t)s.n * s.c : (size_t)s.n * (s.h / 2) * (s.w / 2) * s.c;
    void *xh = to_dt(dt, x, nx), *rh = to_dt(dt, r, ny), *y = poisoned(dt, ny);
    void *dx = poisoned(dt, nx), *dx1 = to_dt(dt, dx0, nx);
    if (avg) {
        CHECK_OK(be->i->avgpool_fwd(be, s, dt, y, xh));
        CHECK_OK(be->i->avgpool_bwd(be, s, dt, dx, 0.0f, rh));
        CHECK_OK(be->i->avgpool_bwd(be, s, dt, dx1, 1.0f, rh));
    } else {
        CHECK_OK(be->i->maxpool_fwd(be, s, dt, y, xh, relu));
        CHECK_OK(be->i->maxpool_bwd(be, s, dt, dx, 0.0f, rh, xh, relu));
        CHECK_OK(be->i->maxpool_bwd(be, s, dt, dx1, 1.0f, rh, xh, relu));
    }
    *yo = from_dt(dt, y, ny);
    *dxo = from_dt(dt, dx, nx);
    *dx1o = from_dt(dt, dx1, nx);
}

static void run_pool_case(tq_shape s, int avg, int relu) {
    tq_shape ys = avg ? (tq_shape){ s.n, 1, 1, s.c } : (tq_shape){ s.n, s.h / 2, s.w / 2, s.c };
    size_t nx = tq_shape_numel(s), ny = tq_shape_numel(ys);
    const char *name = avg ? "avgpool" : relu ? "maxpool+relu" : "maxpool";
    float *x = frand(nx, 1), *r = frand(ny, 1), *dx0 = frand(nx, 1);
    pool_ctx ctx = { s, dup_d(x, nx), dalloc(ny), dup_d(r, ny), ny, avg, relu };
    pool_loss(&ctx);
    float *y, *dx, *dx1;
    pool_run(s, avg, relu, TQ_F32, x, r, dx0, &y, &dx, &dx1);
    CHECK_REL(rel_fd(y, ctx.y, ny), 1e-6, "%s fwd", name);
    char what[64];
    snprintf(what, sizeof what, "%s dx", name);
    fd_check(what, pool_loss, &ctx, ctx.x, nx, dx, NULL, 1e-6);
    snprintf(what, sizeof what, "%s dx (beta 1)", name);
    fd_check(what, pool_loss, &ctx, ctx.x, nx, dx1, dx0, 1e-6);
    for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
        float *yl, *dxl, *dx1l, *yf, *dxf, *dx1f;
        pool_run(s, avg, relu, dt, x, r, dx0, &yl, &dxl, &dx1l);
        pool_run(s, avg, relu, TQ_F32, rnd(dt, x, nx), rnd(dt, r, ny), rnd(dt, dx0, nx), &yf, &dxf, &dx1f);
        CHECK_REL(rel_ff(yl, yf, ny), tol_dt(dt), "%s fwd %s", name, dt_name(dt));
        CHECK_REL(rel_ff(dxl, dxf, nx), tol_dt(dt), "%s bwd %s", name, dt_name(dt));
        CHECK_REL(rel_ff(dx1l, dx1f, nx), tol_dt(dt), "%s bwd beta1 %s", name, dt_name(dt));
    }
}

static void test_maxpool(void **state) {
    (void)state;
    for (int relu = 0; relu < 2; relu++) {
        run_pool_case((tq_shape){ 2, 6, 4, 3 }, 0, relu);
        run_pool_case((tq_shape){ 2, 5, 6, 3 }, 0, relu);    /* odd height: last row in no window */
        run_pool_case((tq_shape){ 1, 4, 7, 2 }, 0, relu);    /* odd width */
        run_pool_case((tq_shape){ 8, 32, 32, 16 }, 0, relu); /* the parallel path */
    }
    /* ties: the first maximum in row-major window order gets the gradient */
    float x[4] = { 1, 3, 3, 3 }, y, dy = 2, dx[4];
    tq_shape s = { 1, 2, 2, 1 };
    CHECK_OK(be->i->maxpool_fwd(be, s, TQ_F32, &y, x, 0));
    assert_true(y == 3.0f);
    CHECK_OK(be->i->maxpool_bwd(be, s, TQ_F32, dx, 0.0f, &dy, x, 0));
    assert_true(dx[0] == 0 && dx[1] == 2 && dx[2] == 0 && dx[3] == 0);
    CHECK_EINVAL(be->i->maxpool_fwd(be, (tq_shape){ 1, 1, 4, 1 }, TQ_F32, &y, x, 0));
}

/* maxpool's relu is the relu_fwd → maxpool pair bit for bit, forward and backward, on the
 * cases where they could part: windows all negative, ±0 and ties at 0, NaN among negatives,
 * ±inf, odd edges, with beta 0 and 1, in every dtype. */
static void test_maxpool_relu_is_the_pair(void **state) {
    (void)state;
    const tq_shape shapes[] = { { 3, 6, 8, 5 }, { 2, 5, 7, 3 }, { 4, 32, 32, 16 } };
    const float special[] = { -1.0f, -0.0f, 0.0f, NAN, -NAN, INFINITY, -INFINITY, 0.5f, -3.0f };
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (tq_dtype dt = TQ_F32; dt <= TQ_BF16; dt++) {
            tq_shape s = shapes[si];
            size_t nx = tq_shape_numel(s), ny = (size_t)s.n * (s.h / 2) * (s.w / 2) * s.c;
            size_t es = tq_dtype_size(dt);
            float *xf = frand(nx, 1);
            for (size_t i = 0; i < nx; i++) {   /* a third special values, a third negative */
                if (i % 3 == 0) xf[i] = special[(i / 3) % (sizeof special / sizeof *special)];
                else if (i % 3 == 1) xf[i] = -fabsf(xf[i]);
            }
            float *gf = frand(ny, 1), *d0f = frand(nx, 1);
            void *x = to_dt(dt, xf, nx), *dy = to_dt(dt, gf, ny);
            void *r = poisoned(dt, nx), *ya = poisoned(dt, ny), *yb = poisoned(dt, ny);
            CHECK_OK(be->i->relu_fwd(be, nx, dt, r, x));
            CHECK_OK(be->i->maxpool_fwd(be, s, dt, ya, r, 0));
            CHECK_OK(be->i->maxpool_fwd(be, s, dt, yb, x, 1));
            assert_memory_equal(ya, yb, ny * es);
            for (int acc = 0; acc < 2; acc++) {
                void *dr = poisoned(dt, nx);
                void *da = acc ? to_dt(dt, d0f, nx) : poisoned(dt, nx);
                void *db = acc ? to_dt(dt, d0f, nx) : poisoned(dt, nx);
                CHECK_OK(be->i->maxpool_bwd(be, s, dt, dr, 0.0f, dy, r, 0));
                CHECK_OK(be->i->relu_bwd(be, nx, dt, da, (float)acc, dr, r));
                CHECK_OK(be->i->maxpool_bwd(be, s, dt, db, (float)acc, dy, x, 1));
                assert_memory_equal(da, db, nx * es);
            }
        }
}

/* Max pooling in 16 bits stores values it loaded (or 0): bit for bit the f32 op on the same
 * values with its outputs stored through tq_st, forward and backward with beta 0, with and
 * without relu, on NaNs, ±0, ±inf and ties, in both 16-bit types. */
static void test_maxpool_16bit_is_f32_rounded(void **state) {
    (void)state;
    const tq_shape shapes[] = { { 3, 6, 8, 5 }, { 2, 5, 7, 3 }, { 4, 32, 32, 16 } };
    const float special[] = { -1.0f, -0.0f, 0.0f, NAN, -NAN, INFINITY, -INFINITY, 0.5f, 2.0f };
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++)
            for (int relu = 0; relu < 2; relu++) {
                tq_shape s = shapes[si];
                size_t nx = tq_shape_numel(s), ny = (size_t)s.n * (s.h / 2) * (s.w / 2) * s.c;
                size_t es = tq_dtype_size(dt);
                float *xf = frand(nx, 1), *gf = frand(ny, 1);
                for (size_t i = 0; i < nx; i += 3) xf[i] = special[(i / 3) % (sizeof special / sizeof *special)];
                for (size_t i = 0; i < ny; i += 5) gf[i] = special[(i / 5) % (sizeof special / sizeof *special)];
                void *x = to_dt(dt, xf, nx), *dy = to_dt(dt, gf, ny);
                float *x32 = from_dt(dt, x, nx), *dy32 = from_dt(dt, dy, ny);   /* the same values */
                void *y = poisoned(dt, ny), *dx = poisoned(dt, nx);
                float *y32 = tmem(ny * 4), *dx32 = tmem(nx * 4);
                CHECK_OK(be->i->maxpool_fwd(be, s, dt, y, x, relu));
                CHECK_OK(be->i->maxpool_bwd(be, s, dt, dx, 0.0f, dy, x, relu));
                CHECK_OK(be->i->maxpool_fwd(be, s, TQ_F32, y32, x32, relu));
                CHECK_OK(be->i->maxpool_bwd(be, s, TQ_F32, dx32, 0.0f, dy32, x32, relu));
                void *ye = tmem(ny * es), *dxe = tmem(nx * es);
                for (size_t i = 0; i < ny; i++) tq_st(ye, dt, i, y32[i]);
                for (size_t i = 0; i < nx; i++) tq_st(dxe, dt, i, dx32[i]);
                assert_memory_equal(y, ye, ny * es);
                assert_memory_equal(dx, dxe, nx * es);
            }
}

static void test_avgpool(void **state) {
    (void)state;
    run_pool_case((tq_shape){ 3, 4, 5, 6 }, 1, 0);
    run_pool_case((tq_shape){ 4, 8, 8, 300 }, 1, 0);
}

/* ---- softmax cross-entropy ---- */

typedef struct { int n, k; double *z; const int32_t *lab; double scale; } ce_ctx;
static double ce_loss_sum(int n, int k, const double *z, const int32_t *lab) {
    double L = 0;
    for (int i = 0; i < n; i++) {
        double m = z[(size_t)i * k];
        for (int j = 1; j < k; j++) if (z[(size_t)i * k + j] > m) m = z[(size_t)i * k + j];
        double s = 0;
        for (int j = 0; j < k; j++) s += exp(z[(size_t)i * k + j] - m);
        L += m + log(s) - z[(size_t)i * k + lab[i]];
    }
    return L;
}
static double ce_loss(void *p) {
    ce_ctx *c = p;
    return c->scale * ce_loss_sum(c->n, c->k, c->z, c->lab) / c->n;
}

static void test_softmax_ce(void **state) {
    (void)state;
    int n = 9, k = 10;
    size_t nz = (size_t)n * k;
    float *z = frand(nz, 4);
    int32_t lab[9];
    for (int i = 0; i < n; i++) lab[i] = (int32_t)((i * 7 + 3) % k);
    /* make a few predictions right */
    for (int i = 0; i < 3; i++) z[(size_t)i * k + lab[i]] = 9.0f;
    double *zd = dup_d(z, nz);
    int hits = 0;
    for (int i = 0; i < n; i++) {
        int am = 0;
        for (int j = 1; j < k; j++) if (z[(size_t)i * k + j] > z[(size_t)i * k + am]) am = j;
        hits += am == lab[i];
    }
    assert_true(hits >= 3);
    double Lsum = ce_loss_sum(n, k, zd, lab);
    float gscale = 256.0f / 4.0f;
    float out[2] = { 0.25f, 1.0f };
    float *dz = poisoned(TQ_F32, nz);
    CHECK_OK(be->i->softmax_ce(be, n, k, TQ_F32, dz, z, lab, gscale, out));
    CHECK_REL(fabs(out[0] - 0.25 - Lsum) / Lsum, 1e-5, "softmax_ce loss");
    assert_true(out[1] == 1.0f + (float)hits);
    ce_ctx ctx = { n, k, zd, lab, gscale };
    fd_check("softmax_ce dlogits", ce_loss, &ctx, zd, nz, dz, NULL, 1e-5);
    float ev[2] = { 0, 0 };
    CHECK_OK(be->i->softmax_ce_eval(be, n, k, TQ_F32, z, lab, ev));
    CHECK_REL(fabs(ev[0] - Lsum) / Lsum, 1e-5, "softmax_ce_eval loss");
    assert_true(ev[1] == (float)hits);
    for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
        void *zh = to_dt(dt, z, nz), *dzh = poisoned(dt, nz);
        float o2[2] = { 0, 0 };
        CHECK_OK(be->i->softmax_ce(be, n, k, dt, dzh, zh, lab, gscale, o2));
        CHECK_REL(rel_ff(from_dt(dt, dzh, nz), dz, nz), tol_dt(dt), "softmax_ce dlogits %s",
                  dt_name(dt));
        CHECK_REL(fabs(o2[0] - Lsum) / Lsum, tol_dt(dt), "softmax_ce loss %s", dt_name(dt));
    }
    /* ties: the first maximum is the prediction */
    float tie[6] = { 1, 1, 1, 1, 1, 1 };
    int32_t tl[2] = { 0, 1 };
    float o3[2] = { 0, 0 };
    CHECK_OK(be->i->softmax_ce_eval(be, 2, 3, TQ_F32, tie, tl, o3));
    assert_true(o3[1] == 1.0f);
    CHECK_REL(fabs(o3[0] - 2 * log(3.0)) / (2 * log(3.0)), 1e-6, "softmax_ce uniform loss");
    /* a bad label is an error, not a wild read */
    int32_t bad[2] = { 0, 3 };
    CHECK_EINVAL(be->i->softmax_ce_eval(be, 2, 3, TQ_F32, tie, bad, o3));
    bad[1] = -1;
    CHECK_EINVAL(be->i->softmax_ce(be, 2, 3, TQ_F32, dz, tie, bad, 1.0f, o3));
}

/* ---- casts and flat-buffer passes ---- */

static void test_cast(void **state) {
    (void)state;
    size_t n = 50000;
    float *a = frand(n, 1);
    for (size_t i = 0; i < n; i++) a[i] = ldexpf(a[i], (int)(i % 60) - 40);  /* wide range */
    float sp[8] = { INFINITY, -INFINITY, NAN, 65504.0f, 70000.0f, 1e-8f, -0.0f, 3.0e38f };
    memcpy(a, sp, sizeof sp);
    for (tq_dtype dt = TQ_F16; dt <= TQ_BF16; dt++) {
        void *h = poisoned(dt, n);
        float *back = poisoned(TQ_F32, n);
        CHECK_OK(be->i->cast(be, n, dt, h, TQ_F32, a));
        CHECK_OK(be->i->cast(be, n, TQ_F32, back, dt, h));
        for (size_t i = 0; i < n; i++) {
            float e = tq_round_to(dt, a[i]);
            if (isnan(e)) assert_true(isnan(back[i]));
            else assert_memory_equal(&e, &back[i], 4);
        }
        /* 16 → other 16 */
        tq_dtype o = dt == TQ_F16 ? TQ_BF16 : TQ_F16;
        void *h2 = poisoned(o, n);
        CHECK_OK(be->i->cast(be, n, o, h2, dt, h));
        for (size_t i = 0; i < n; i++) {
            float e = tq_round_to(o, tq_ld(h, dt, i)), g = tq_ld(h2, o, i);
            if (isnan(e)) assert_true(isnan(g));
            else assert_memory_equal(&e, &g, 4);
        }
    }
    float *c = poisoned(TQ_F32, n);
    CHECK_OK(be->i->cast(be, n, TQ_F32, c, TQ_F32, a));
    assert_memory_equal(c, a, n * 4);
}

/* The scalar conversions of kernels/common against independent references: F16C (the CPU's own
 * binary16 rounding) for f16 both ways, and a nearest-candidate search in double for bf16. A
 * stride through all 2^32 f32 patterns plus every pattern near the f16 rounding edges
 * (zero/subnormal, subnormal/normal, overflow). NaN only has to stay NaN. */
__attribute__((target("f16c"))) static uint16_t hw_f16(float f) {
    return (uint16_t)_cvtss_sh(f, 0);   /* 0: round to nearest even */
}
__attribute__((target("f16c"))) static float hw_f32(uint16_t h) { return _cvtsh_ss(h); }

static uint16_t ref_bf16(float f) {
    uint32_t u = tq_f32_bits(f), lo = u & 0xffff0000u, hi = lo + 0x10000u;
    if (isinf(f)) return (uint16_t)(u >> 16);
    /* the two bf16 neighbours as doubles; above the largest bf16 the next one is 2^128 (inf) */
    double vl = tq_bits_f32(lo);
    double vh = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(0x1p128, f) : tq_bits_f32(hi);
    double dl = fabs((double)f - vl), dh = fabs(vh - (double)f);
    if (dl < dh || (dl == dh && !((lo >> 16) & 1u))) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

static void check_one(float f, int f16c) {
    if (isnan(f)) {
        assert_true(isnan(tq_f16_to_f32(tq_f32_to_f16(f))));
        assert_true(isnan(tq_bf16_to_f32(tq_f32_to_bf16(f))));
        return;
    }
    if (f16c && tq_f32_to_f16(f) != hw_f16(f)) {
        print_error("f16 of %a (0x%08x): ours 0x%04x, F16C 0x%04x\n", (double)f,
                    tq_f32_bits(f), tq_f32_to_f16(f), hw_f16(f));
        fail();
    }
    if (tq_f32_to_bf16(f) != ref_bf16(f)) {
        print_error("bf16 of %a (0x%08x): ours 0x%04x, reference 0x%04x\n", (double)f,
                    tq_f32_bits(f), tq_f32_to_bf16(f), ref_bf16(f));
        fail();
    }
}

static void test_conversions_reference(void **state) {
    (void)state;
    int f16c = __builtin_cpu_supports("f16c");
    if (!f16c) printf("# no F16C on this CPU: f16 checked by the bf16/cast tests only\n");
    for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) check_one(tq_bits_f32((uint32_t)u), f16c);
    const uint32_t edges[] = { 0x33000000u, 0x38800000u, 0x477ff000u, 0x7f7f8000u, 0x00800000u };
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (uint32_t d = 0; d < 8192; d++) {
            uint32_t u = edges[e] - 4096 + d;
            check_one(tq_bits_f32(u), f16c);
            check_one(tq_bits_f32(u | 0x80000000u), f16c);
        }
    for (uint32_t h = 0; h < 65536; h++) {
        float ours = tq_f16_to_f32((uint16_t)h), bf = tq_bf16_to_f32((uint16_t)h);
        if (f16c) {
            float hw = hw_f32((uint16_t)h);
            if (isnan(hw)) assert_true(isnan(ours));
            else assert_memory_equal(&ours, &hw, 4);
        }
        uint32_t want = h << 16;                    /* bf16 → f32 is exact: the top half */
        assert_memory_equal(&bf, &want, 4);
    }
}

static void test_unscale_check(void **state) {
    (void)state;
    size_t n = 100000;
    float *g0 = frand(n, 1000), *g = fcopy(g0, n), inv = 1.0f / 1024.0f, found = 0.0f;
    CHECK_OK(be->i->unscale_check(be, n, g, inv, &found));
    assert_true(found == 0.0f);
    for (size_t i = 0; i < n; i++) assert_true(g[i] == g0[i] * inv);
    size_t pos[3] = { n - 1, 5, 77777 };
    float bad[3] = { INFINITY, NAN, -INFINITY };
    for (int t = 0; t < 3; t++) {
        float *h = fcopy(g0, n);
        h[pos[t]] = bad[t];
        found = 0.0f;
        CHECK_OK(be->i->unscale_check(be, n, h, inv, &found));
        assert_true(found == 1.0f);
    }
    /* small buffer (serial path), overflow caused by the scaling itself */
    float s[3] = { 1.0f, 3e38f, 2.0f };
    found = 0.0f;
    CHECK_OK(be->i->unscale_check(be, 3, s, 10.0f, &found));
    assert_true(found == 1.0f);
    float s2[3] = { 1.0f, NAN, 2.0f };
    found = 0.0f;
    CHECK_OK(be->i->unscale_check(be, 3, s2, 0.5f, &found));
    assert_true(found == 1.0f && s2[0] == 0.5f && s2[2] == 1.0f);
}

/* the weight copy an optimizer step writes in the same pass equals a separate cast of the new
 * weights, bit for bit (and a skipped step leaves it, as it leaves the weights) */
static void check_wcopy(const float *w, const void *wl, tq_dtype wdt, size_t n, const char *what) {
    size_t es = tq_dtype_size(wdt);
    void *ref = tmem(n * es);
    CHECK_OK(be->i->cast(be, n, wdt, ref, TQ_F32, w));
    if (memcmp(ref, wl, n * es)) fail_msg("%s: the fused %s weight copy differs from the cast", what,
                                          wdt == TQ_F16 ? "f16" : "bf16");
}

static void test_sgd(void **state) {
    (void)state;
    size_t n = 40000;
    struct { float mom, wd; int nest; } cfg[4] = { { 0.9f, 5e-4f, 0 }, { 0.9f, 5e-4f, 1 },
                                                   { 0.0f, 1e-2f, 0 }, { 0.5f, 0.0f, 0 } };
    for (int c = 0; c < 4; c++) {
        float *w = frand(n, 1), *buf = tmem(n * 4), lr = 0.05f;
        memset(buf, 0, n * 4);
        double *wr = dup_d(w, n), *br = dalloc(n);
        memset(br, 0, n * 8);
        const float clear = 0.0f, overflow = 1.0f;
        tq_dtype wdt = c % 2 ? TQ_BF16 : TQ_F16;   /* configs 0 and 2 without the copy */
        void *wl = tmem(n * 2);
        for (int step = 0; step < 3; step++) {
            float *g = frand(n, 1), *bad = frand(n, 1);
            CHECK_OK(be->i->sgd_step(be, n, w, g, cfg[c].mom == 0 ? NULL : buf, lr, cfg[c].mom,
                                     cfg[c].wd, cfg[c].nest, step % 2 ? &clear : NULL,
                                     c % 2 ? wl : NULL, wdt));
            if (c % 2) check_wcopy(w, wl, wdt, n, "sgd_step");
            bad[n / 2] = NAN;   /* an overflowed step: the flag set, nothing may move */
            CHECK_OK(be->i->sgd_step(be, n, w, bad, cfg[c].mom == 0 ? NULL : buf, lr, cfg[c].mom,
                                     cfg[c].wd, cfg[c].nest, &overflow, c % 2 ? wl : NULL, wdt));
            if (c % 2) check_wcopy(w, wl, wdt, n, "sgd_step skipped");
            for (size_t i = 0; i < n; i++) {       /* torch.optim.SGD, dampening 0 */
                double d = g[i] + (double)cfg[c].wd * wr[i];
                if (cfg[c].mom != 0) {
                    br[i] = step == 0 ? d : cfg[c].mom * br[i] + d;
                    d = cfg[c].nest ? d + cfg[c].mom * br[i] : br[i];
                }
                wr[i] -= lr * d;
            }
        }
        CHECK_REL(rel_fd(w, wr, n), 1e-6, "sgd w (config %d)", c);
        if (cfg[c].mom != 0) CHECK_REL(rel_fd(buf, br, n), 1e-6, "sgd buf (config %d)", c);
    }
    float w1 = 1, g1 = 1, b1 = 0;
    uint16_t l1 = 0;
    CHECK_EINVAL(be->i->sgd_step(be, 1, &w1, &g1, NULL, 0.1f, 0.9f, 0.0f, 0, NULL, NULL, TQ_F32));
    /* a weight copy must be 16-bit: f32 would be the weights themselves */
    CHECK_EINVAL(be->i->sgd_step(be, 1, &w1, &g1, &b1, 0.1f, 0.9f, 0.0f, 0, NULL, &l1, TQ_F32));
    assert_true(w1 == 1 && l1 == 0);
}

static void test_adamw(void **state) {
    (void)state;
    size_t n = 40000;
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 1e-2f;
    float *w = frand(n, 1), *m = tmem(n * 4), *v = tmem(n * 4);
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    double *wr = dup_d(w, n), *mr = dalloc(n), *vr = dalloc(n);
    memset(mr, 0, n * 8);
    memset(vr, 0, n * 8);
    for (int t = 1; t <= 4; t++) {
        float *g = frand(n, 0.1);
        float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
        const float clear = 0.0f, overflow = 1.0f;
        tq_dtype wdt = t % 2 ? TQ_F16 : TQ_BF16;
        void *wl = t == 1 ? NULL : tmem(n * 2);   /* step 1 without the copy */
        CHECK_OK(be->i->adamw_step(be, n, w, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, t % 2 ? &clear : NULL,
                                   wl, wdt));
        if (wl) check_wcopy(w, wl, wdt, n, "adamw_step");
        float *bad = frand(n, 0.1);
        bad[0] = INFINITY;   /* an overflowed step in between: nothing may move */
        CHECK_OK(be->i->adamw_step(be, n, w, bad, m, v, lr, b1, b2, eps, wd, bc1, bc2, &overflow, wl, wdt));
        if (wl) check_wcopy(w, wl, wdt, n, "adamw_step skipped");
        for (size_t i = 0; i < n; i++) {       /* torch.optim.AdamW */
            wr[i] *= 1.0 - (double)lr * wd;
            mr[i] = b1 * mr[i] + (1.0 - b1) * g[i];
            vr[i] = b2 * vr[i] + (1.0 - b2) * (double)g[i] * g[i];
            double denom = sqrt(vr[i]) / sqrt((double)bc2) + eps;
            wr[i] -= (double)lr / bc1 * mr[i] / denom;
        }
    }
    CHECK_REL(rel_fd(w, wr, n), 1e-6, "adamw w");
    CHECK_REL(rel_fd(m, mr, n), 1e-5, "adamw m");
    CHECK_REL(rel_fd(v, vr, n), 1e-5, "adamw v");
}

/* ---- data ---- */

/* one image shape; a row of W·C above 3072 values is loaded in more than one piece */
static void load_batch_shape(int H, int W) {
    int N = 5, C = 3, pad = 2, n = 4;
    size_t isz = (size_t)H * W * C;
    uint8_t *img = tmem((size_t)N * isz), lab[5] = { 3, 1, 4, 1, 5 };
    for (size_t i = 0; i < (size_t)N * isz; i++) img[i] = (uint8_t)(urand() * 127.5 + 128);
    int32_t idx[4] = { 4, 0, 2, 4 };
    tq_aug aug[4] = { { 2, 2, 0 }, { 0, 0, 1 }, { 4, 1, 1 }, { 3, 4, 0 } };
    float mean[3] = { 0.49f, 0.48f, 0.45f }, inv_std[3] = { 1 / 0.25f, 1 / 0.24f, 1 / 0.26f };
    int32_t labels[4];
    for (int use_aug = 0; use_aug < 2; use_aug++) {
        /* reference: zero-pad, crop at (dy, dx), then flip the crop */
        float *ref = tmem((size_t)n * isz * 4);
        int PH = H + 2 * pad, PW = W + 2 * pad;
        uint8_t *padded = tmem((size_t)PH * PW * C);
        for (int i = 0; i < n; i++) {
            const uint8_t *src = img + (size_t)idx[i] * isz;
            memset(padded, 0, (size_t)PH * PW * C);
            for (int y = 0; y < H; y++)
                memcpy(padded + ((size_t)(y + pad) * PW + pad) * C, src + (size_t)y * W * C,
                       (size_t)W * C);
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    for (int c = 0; c < C; c++) {
                        uint8_t px;
                        if (use_aug) {
                            int cx = aug[i].flip ? W - 1 - x : x;    /* flip of the crop */
                            px = padded[((size_t)(y + aug[i].dy) * PW + cx + aug[i].dx) * C + c];
                        } else {
                            px = src[((size_t)y * W + x) * C + c];
                        }
                        ref[(size_t)i * isz + ((size_t)y * W + x) * C + c] =
                            tq_normalize_px(px, mean[c], inv_std[c]);
                    }
        }
        for (tq_dtype dt = TQ_F32; dt <= TQ_BF16; dt++) {
            void *x = poisoned(dt, (size_t)n * isz);
            memset(labels, 0xff, sizeof labels);
            CHECK_OK(be->i->load_batch(be, n, H, W, C, dt, x, labels, img, lab, idx,
                                       use_aug ? aug : NULL, pad, mean, inv_std));
            for (size_t j = 0; j < (size_t)n * isz; j++) {
                float e = tq_round_to(dt, ref[j]), g = tq_ld(x, dt, j);
                assert_memory_equal(&e, &g, 4);
            }
            for (int i = 0; i < n; i++) assert_int_equal(labels[i], lab[idx[i]]);
        }
    }
}

static void test_load_batch(void **state) {
    (void)state;
    load_batch_shape(5, 6);
    load_batch_shape(3, 1025);   /* 3075 values a row */
    int H = 5, W = 6, C = 3, pad = 2;
    uint8_t img[5 * 6 * 3] = { 0 }, lab[1] = { 0 };
    int32_t idx[1] = { 0 }, labels[1];
    float mean[3] = { 0.49f, 0.48f, 0.45f }, inv_std[3] = { 1 / 0.25f, 1 / 0.24f, 1 / 0.26f };
    /* a zero pixel is normalised too */
    tq_aug far = { 0, 0, 0 };
    float x1[3 * 5 * 6];
    CHECK_OK(be->i->load_batch(be, 1, H, W, C, TQ_F32, x1, labels, img, lab, idx, &far, pad, mean,
                               inv_std));
    assert_true(x1[0] == tq_normalize_px(0, mean[0], inv_std[0]));
    CHECK_EINVAL(be->i->load_batch(be, 1, 0, W, C, TQ_F32, x1, labels, img, lab, idx, NULL, 0,
                                   mean, inv_std));
}

/* ---- memory ---- */

static void test_alloc_accounting(void **state) {
    (void)state;
    tq_backend *b2 = tq_cpu_backend_new(0);
    assert_non_null(b2);
    assert_string_equal(b2->i->name, "cpu");
    assert_true(b2->bytes_live == 0 && b2->bytes_peak == 0);
    unsigned char *a = b2->i->alloc(b2, 100);
    assert_non_null(a);
    assert_true(((uintptr_t)a & 63) == 0);
    memset(a, 1, 100);
    assert_true(b2->bytes_live == 100 && b2->bytes_peak == 100);
    unsigned char *b = b2->i->alloc(b2, 1000);
    assert_true(((uintptr_t)b & 63) == 0);
    b2->i->memset0(b2, b, 1000);
    for (int i = 0; i < 1000; i++) assert_int_equal(b[i], 0);
    assert_true(b2->bytes_live == 1100 && b2->bytes_peak == 1100);
    b2->i->free(b2, a);
    assert_true(b2->bytes_live == 1000 && b2->bytes_peak == 1100);
    unsigned char *c = b2->i->alloc(b2, 63);
    assert_true(b2->bytes_live == 1063 && b2->bytes_peak == 1100);
    unsigned char *z = b2->i->alloc(b2, 0);
    assert_non_null(z);
    assert_true(b2->bytes_live == 1063);
    unsigned char host[63];
    for (int i = 0; i < 63; i++) host[i] = (unsigned char)i;
    b2->i->to_device(b2, c, host, 63);
    b2->i->copy(b2, b, c, 63);
    memset(host, 0, 63);
    b2->i->to_host(b2, host, b, 63);
    for (int i = 0; i < 63; i++) assert_int_equal(host[i], i);
    unsigned char *big = b2->i->alloc(b2, 5000);
    assert_true(b2->bytes_live == 6063 && b2->bytes_peak == 6063);
    b2->i->free(b2, NULL);
    b2->i->free(b2, big);
    b2->i->free(b2, z);
    b2->i->free(b2, b);
    b2->i->free(b2, c);
    assert_true(b2->bytes_live == 0 && b2->bytes_peak == 6063);
    assert_null(b2->i->alloc(b2, SIZE_MAX - 8));
    assert_true(b2->err[0] != 0);
    assert_true(b2->bytes_live == 0);
    b2->i->sync(b2);
    double t0 = b2->i->now_ms(b2), t1 = b2->i->now_ms(b2);
    assert_true(t1 >= t0 && t0 > 0);
    tq_backend_seterr(b2, "x=%d", 42);
    assert_string_equal(b2->err, "x=42");
    tq_backend_free(b2);
    tq_backend_free(NULL);
}

static void test_vtable_complete(void **state) {
    (void)state;
    const void *const *slots = (const void *const *)be->i;
    size_t nslots = sizeof(tq_backend_i) / sizeof(void *);
    for (size_t i = 0; i < nslots; i++) assert_non_null(slots[i]);
}

/* TQ_TEST_THREADS=k runs every op with k threads (default 2) */
static int setup(void **state) {
    (void)state;
    const char *t = getenv("TQ_TEST_THREADS");
    be = tq_cpu_backend_new(t ? atoi(t) : 2);
    return be ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    tq_backend_free(be);
    return 0;
}

#define T(f) cmocka_unit_test_teardown(f, teardown_mem)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_vtable_complete), T(test_alloc_accounting), T(test_conv), T(test_conv_chunked), T(test_conv_winograd), T(test_conv_winograd_512), T(test_conv_wino_few), T(test_conv_thin), T(test_conv_bf16_via_f32), T(test_conv_gemm),
        T(test_linear), T(test_iface_complete), T(test_conv_bad_desc), T(test_bn), T(test_bn_large),
        T(test_bn_bwd_fused_is_the_chain), T(test_bn_native), T(test_cast_f16_native), T(test_maxpool_f16_native), T(test_bn_deterministic), T(test_bn_bad), T(test_relu), T(test_add_accumulate),
        T(test_maxpool), T(test_maxpool_relu_is_the_pair), T(test_maxpool_16bit_is_f32_rounded), T(test_avgpool), T(test_softmax_ce), T(test_cast), T(test_conversions_reference),
        T(test_unscale_check), T(test_sgd), T(test_adamw), T(test_load_batch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
