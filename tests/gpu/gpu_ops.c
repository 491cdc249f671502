/* gpu_ops.c — every computing op of a device backend checked against the CPU backend.
 *
 *   gpu_ops [--against cuda|cpu] [--inject OP] [--report FILE] [--seed N] [--verbose]
 *
 * A case is one op with one dtype, one shape and one set of parameters. Its inputs are random
 * f32 values (a seeded PRNG) converted on the host to the storage type (kernels/common's
 * helpers); the SAME bytes go to the reference backend (the CPU backend) and to the device
 * backend (CUDA ordinal 0; with --against cpu a second CPU backend, so that the harness runs in
 * CI without a GPU). Outputs are poisoned on the device side with 0xFF bytes (NaN; the
 * reference side gets zeros) unless the op accumulates into them (beta 1, weight/bias grads,
 * running statistics, optimizer state, the loss sums, found_inf): those get the same random
 * pre-fill on both sides. After the op both sides are synced and every output is downloaded:
 *
 *   err = max_i |dev_i − ref_i| / max(max_i |ref_i|, 1e-6)
 *
 * against 1e-4 when the case's dtype is f32 (TF32 is off in the CUDA backend) and 1e-2 for
 * f16/bf16 (also for the case's f32 outputs: weight grads of a 16-bit conv are computed in the
 * 16-bit type on the GPU). A NaN/Inf in dev where ref is finite fails, and so does a non-finite
 * ref value that dev does not reproduce (the NaN-propagation cases). Integer outputs (labels,
 * hit counts, found_inf) and casts (pure rounding) must match exactly.
 *
 * The step on the device (spec cuda_graphs) adds: each _dyn op against its plain op on both
 * sides ("same bits": exact), step_end's state against tq_dstep_end, fetch_*, and CUDA graphs
 * (an optimizer sequence replayed with new device values; cuDNN convolutions and a cuBLASLt
 * GEMM captured and replayed) against the same ops issued directly, bit for bit; the graph
 * cases are skipped with --against cpu.
 *
 * --inject OP corrupts one element of OP's device output after the op ran (to prove that the
 * checker fails). Exit status: 0 all checks pass, 1 a check failed, 2 usage error, 77 no device
 * (the one-line reason is printed).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"

/* ---- element kinds: the storage dtypes plus integer buffers ---- */
enum { K_F32 = TQ_F32, K_F16 = TQ_F16, K_BF16 = TQ_BF16, K_I32, K_U8 };
enum { REF = 0, DEV = 1 };

static size_t ksize(int k) { return k == K_F32 || k == K_I32 ? 4 : k == K_U8 ? 1 : 2; }
static const char *kname(int k) {
    static const char *n[] = { "f32", "f16", "bf16", "i32", "u8" };
    return n[k];
}
static double kload(int k, const void *p, size_t i) {
    if (k == K_I32) return ((const int32_t *)p)[i];
    if (k == K_U8) return ((const uint8_t *)p)[i];
    return tq_ld(p, (tq_dtype)k, i);
}
static void kstore(int k, void *p, size_t i, double v) {
    if (k == K_I32) ((int32_t *)p)[i] = (int32_t)v;
    else if (k == K_U8) ((uint8_t *)p)[i] = (uint8_t)v;
    else tq_st(p, (tq_dtype)k, i, (float)v);
}

/* ---- seeded PRNG (splitmix64) ---- */
static uint64_t rng_state;
static uint64_t rnext(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uni(double lo, double hi) { return lo + (hi - lo) * (double)(rnext() >> 11) * 0x1.0p-53; }
static int irand(int n) { return (int)(rnext() % (uint64_t)n); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "gpu_ops: out of host memory (%zu bytes)\n", n); exit(1); }
    return p;
}

/* ---- results ---- */
typedef struct {
    char op[24], dt[12], params[112], out[28], msg[300];
    double err, tol;
    int exact, pass;
} row;

static struct {
    tq_backend *be[2];            /* [REF] the CPU backend, [DEV] the backend under test */
    const char *inject;
    int verbose, ninjected, ncases, nfailcases;
    row *rows;
    size_t nrows, cap, nfail;
    double worst[3];              /* per case dtype, over the tolerance checks */
    char worst_at[3][160];
} G;

static double tol_of(tq_dtype dt) { return dt == TQ_F32 ? 1e-4 : 1e-2; }

/* ---- a case: its buffers live on both backends ---- */
typedef struct {
    const char *name;
    int kind;
    size_t n, bytes[2];           /* the workspace differs per backend */
    void *p[2];
} tbuf;

#define MAXBUF 16
typedef struct {
    const char *op;
    tq_dtype dt;
    char dtl[12], params[112];
    tbuf b[MAXBUF];
    int nb, bad, failed, injected;
} tcase;

__attribute__((format(printf, 7, 8)))
static void add_row(tcase *c, const char *out, double err, double tol, int exact, int pass,
                    const char *fmt, ...) {
    if (G.nrows == G.cap) {
        G.cap = G.cap ? 2 * G.cap : 256;
        G.rows = realloc(G.rows, G.cap * sizeof *G.rows);
        if (!G.rows) { fprintf(stderr, "gpu_ops: out of host memory\n"); exit(1); }
    }
    row *r = &G.rows[G.nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->op, sizeof r->op, "%s", c->op);
    snprintf(r->dt, sizeof r->dt, "%s", c->dtl);
    snprintf(r->params, sizeof r->params, "%s", c->params);
    snprintf(r->out, sizeof r->out, "%s", out);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->err = err; r->tol = tol; r->exact = exact; r->pass = pass;
    if (!pass) { G.nfail++; c->failed = 1; }
    if (!exact && isfinite(err) && err > G.worst[c->dt]) {
        G.worst[c->dt] = err;
        snprintf(G.worst_at[c->dt], sizeof G.worst_at[c->dt], "%s %s %s", c->op, c->params, out);
    }
    if (!pass || G.verbose)
        printf("%s %-16s %-9s %-44s %-12s err %-8.2e tol %s%s%s\n", pass ? "ok  " : "FAIL", r->op,
               r->dt, r->params, r->out, err, exact ? "exact" : (tol == 1e-4 ? "1e-4" : "1e-2"),
               r->msg[0] ? ": " : "", r->msg);
}

/* An op, an allocation or a transfer failed on one side: one FAIL row, the case stops. */
static void case_fail(tcase *c, int side, const char *what, const char *msg) {
    if (c->bad) return;
    c->bad = 1;
    add_row(c, what, INFINITY, tol_of(c->dt), 0, 0, "%s: %s", side == REF ? "reference (cpu)" : "device",
            msg && msg[0] ? msg : "(no message in be->err)");
}

static void case_begin(tcase *c, const char *op, tq_dtype dt, const char *fmt, ...) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->dt = dt;
    snprintf(c->dtl, sizeof c->dtl, "%s", kname(dt));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->params, sizeof c->params, fmt, ap);
    va_end(ap);
    G.be[REF]->err[0] = G.be[DEV]->err[0] = 0;   /* void slots leave their failure there */
}

static void case_end(tcase *c) {
    for (int i = 0; i < c->nb; i++)
        for (int s = 0; s < 2; s++)
            if (c->b[i].p[s]) G.be[s]->i->free(G.be[s], c->b[i].p[s]);
    G.ncases++;
    if (c->failed) G.nfailcases++;
}

static tbuf *tb_alloc(tcase *c, const char *name, int kind, size_t n, size_t bref, size_t bdev) {
    if (c->nb == MAXBUF) { fprintf(stderr, "gpu_ops: MAXBUF too small\n"); exit(1); }
    tbuf *b = &c->b[c->nb++];
    b->name = name; b->kind = kind; b->n = n;
    b->bytes[REF] = bref; b->bytes[DEV] = bdev;
    for (int s = 0; s < 2 && !c->bad; s++) {
        if (!b->bytes[s]) continue;                /* a workspace of 0 bytes: NULL */
        b->p[s] = G.be[s]->i->alloc(G.be[s], b->bytes[s]);
        if (!b->p[s]) case_fail(c, s, name, G.be[s]->err);
    }
    return b;
}
static tbuf *tb_new(tcase *c, const char *name, int kind, size_t n) {
    return tb_alloc(c, name, kind, n, n * ksize(kind), n * ksize(kind));
}
/* the same host bytes to both sides */
static void tb_put(tcase *c, tbuf *b, const void *host) {
    for (int s = 0; s < 2 && !c->bad; s++) G.be[s]->i->to_device(G.be[s], b->p[s], host, b->bytes[s]);
}
/* n random values in [lo, hi), stored as kind (malloc'd) */
static void *gen(int kind, size_t n, double lo, double hi) {
    void *h = xmalloc(n * ksize(kind));
    for (size_t i = 0; i < n; i++) kstore(kind, h, i, uni(lo, hi));
    return h;
}
/* an input (or an accumulated output's pre-fill): the same random values on both sides */
static tbuf *tb_in(tcase *c, const char *name, int kind, size_t n, double lo, double hi) {
    tbuf *b = tb_new(c, name, kind, n);
    void *h = gen(kind, n, lo, hi);
    tb_put(c, b, h);
    free(h);
    return b;
}
static tbuf *tb_host(tcase *c, const char *name, int kind, size_t n, const void *host) {
    tbuf *b = tb_new(c, name, kind, n);
    tb_put(c, b, host);
    return b;
}
/* an overwritten output: NaN bytes on the device, zeros on the reference */
static tbuf *tb_out(tcase *c, const char *name, int kind, size_t n) {
    tbuf *b = tb_new(c, name, kind, n);
    if (c->bad) return b;
    void *h = xmalloc(b->bytes[DEV]);
    memset(h, 0xff, b->bytes[DEV]);
    G.be[DEV]->i->to_device(G.be[DEV], b->p[DEV], h, b->bytes[DEV]);
    G.be[REF]->i->memset0(G.be[REF], b->p[REF], b->bytes[REF]);
    free(h);
    return b;
}
/* element i := v on both sides (planted NaN/Inf) */
static void tb_set(tcase *c, tbuf *b, size_t i, double v) {
    unsigned char e[8];
    kstore(b->kind, e, 0, v);
    for (int s = 0; s < 2 && !c->bad; s++)
        G.be[s]->i->to_device(G.be[s], (char *)b->p[s] + i * ksize(b->kind), e, ksize(b->kind));
}
/* workspace: each backend's own size */
static tbuf *tb_ws(tcase *c, const size_t bytes[2]) { return tb_alloc(c, "ws", K_U8, 0, bytes[REF], bytes[DEV]); }

/* Runs CALL on the reference, then on the device; inside it `be` is that backend, P(b) the
 * buffer's pointer there (NULL for a NULL tbuf) and WSB(b) its size there. */
#define P(b) ((b) ? (b)->p[side] : NULL)
#define WSB(b) ((b)->bytes[side])
#define RUN(c, CALL)                                                                    \
    for (int side = 0; side < 2 && !(c)->bad; side++) {                                 \
        tq_backend *be = G.be[side];                                                    \
        int rc_ = (CALL);                                                               \
        if (rc_) {                                                                      \
            char m_[sizeof be->err + 32];                                               \
            snprintf(m_, sizeof m_, "returned %d: %s", rc_, be->err);                   \
            case_fail((c), side, "(op)", m_);                                           \
        }                                                                               \
    }

/* Syncs both sides and downloads buffer b, decoded to doubles (v[REF], v[DEV], malloc'd);
 * also where a void slot (sync, transfers) left an error. 0 on success. */
static int download(tcase *c, tbuf *b, double *v[2], void *raw[2]) {
    v[0] = v[1] = NULL; raw[0] = raw[1] = NULL;
    if (c->bad) return -1;
    for (int s = 0; s < 2; s++) {
        G.be[s]->i->sync(G.be[s]);
        raw[s] = xmalloc(b->bytes[s]);
        G.be[s]->i->to_host(G.be[s], raw[s], b->p[s], b->bytes[s]);
        if (G.be[s]->err[0]) {
            case_fail(c, s, b->name, G.be[s]->err);
            free(raw[0]); free(raw[1]);
            return -1;
        }
        v[s] = xmalloc(b->n * sizeof(double));
        for (size_t i = 0; i < b->n; i++) v[s][i] = kload(b->kind, raw[s], i);
    }
    return 0;
}

/* Compares elements [i0, i0+n) of output b; one result row labelled `label`. The error is
 * max |dev - ref| over max(max |ref|, scale): scale is the size of the terms an output is the
 * difference of, where that exceeds the output (0 elsewhere). */
static void check_range(tcase *c, tbuf *b, const char *label, size_t i0, size_t n, int exact,
                        double scale) {
    double *v[2];
    void *raw[2];
    if (download(c, b, v, raw)) return;
    const double *r = v[REF] + i0;
    double *d = v[DEV] + i0;
    if (G.inject && !c->injected && !strcmp(G.inject, c->op)) {   /* corrupt one element */
        size_t k = n / 2;
        double mx = 0;
        for (size_t i = 0; i < n; i++) if (isfinite(r[i]) && fabs(r[i]) > mx) mx = fabs(r[i]);
        double nv = b->kind == K_I32 ? d[k] + 1 : (isfinite(d[k]) ? d[k] : 0) + 1 + 2 * mx;
        kstore(b->kind, raw[DEV], i0 + k, nv);
        d[k] = kload(b->kind, raw[DEV], i0 + k);
        G.be[DEV]->i->to_device(G.be[DEV], (char *)b->p[DEV] + (i0 + k) * ksize(b->kind),
                                (char *)raw[DEV] + (i0 + k) * ksize(b->kind), ksize(b->kind));
        c->injected = 1;
        G.ninjected++;
    }
    double maxref = 0, maxdiff = 0;
    size_t nbad = 0, first = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(r[i])) {
            if (fabs(r[i]) > maxref) maxref = fabs(r[i]);
            if (!isfinite(d[i])) { if (!nbad++) first = i; continue; }
            if (fabs(d[i] - r[i]) > maxdiff) { maxdiff = fabs(d[i] - r[i]); at = i; }
        } else if (isnan(r[i]) ? !isnan(d[i]) : d[i] != r[i]) {
            if (!nbad++) first = i;
        }
    }
    double tol = exact ? 0.0 : tol_of(c->dt);
    double den = maxref > scale ? maxref : scale;
    double err = nbad ? INFINITY : maxdiff / (den > 1e-6 ? den : 1e-6);
    if (nbad)
        add_row(c, label, err, tol, exact, 0, "%zu of %zu values non-finite or unmatched (first [%zu]: dev %g, ref %g)",
                nbad, n, i0 + first, d[first], r[first]);
    else if (err > tol)
        add_row(c, label, err, tol, exact, 0, "worst [%zu]: dev %.9g, ref %.9g (max |ref| %.3g%s)", i0 + at,
                d[at], r[at], maxref, scale > maxref ? ", over the terms' scale" : "");
    else
        add_row(c, label, err, tol, exact, 1, "%s", "");
    for (int s = 0; s < 2; s++) { free(v[s]); free(raw[s]); }
}
static void check(tcase *c, tbuf *b) { check_range(c, b, b->name, 0, b->n, b->kind >= K_I32, 0); }

/* Element i of b must be `want` on both sides (found_inf). */
static void expect(tcase *c, tbuf *b, size_t i, double want) {
    double *v[2];
    void *raw[2];
    char label[28];
    snprintf(label, sizeof label, "%s == %g", b->name, want);
    if (download(c, b, v, raw)) return;
    int ok = v[REF][i] == want && v[DEV][i] == want;
    add_row(c, label, ok ? 0.0 : INFINITY, 0.0, 1, ok, "dev %g, ref %g", v[DEV][i], v[REF][i]);
    for (int s = 0; s < 2; s++) { free(v[s]); free(raw[s]); }
}

static const tq_dtype DTS[3] = { TQ_F32, TQ_F16, TQ_BF16 };

/* ---- convolution ---- */
typedef struct { int n, h, w, c, k, r, stride, pad, bias; const char *what; } conv_shape;
static const conv_shape CONVS[] = {
    { 8, 28, 28, 1, 32, 3, 1, 1, 1, "cnn conv1, 1 channel" },
    { 8, 14, 14, 32, 64, 3, 1, 1, 1, "cnn conv2" },
    { 8, 32, 32, 3, 16, 3, 1, 1, 0, "resnet stem" },
    { 8, 16, 16, 16, 32, 3, 2, 1, 0, "3x3 stride 2" },
    { 8, 16, 16, 16, 32, 1, 2, 0, 0, "downsample" },
    { 8, 8, 8, 64, 64, 3, 1, 1, 0, "resnet20 stage 3" },
    { 8, 8, 8, 64, 256, 1, 1, 0, 0, "bottleneck conv3" },
    { 8, 4, 4, 128, 128, 3, 1, 1, 0, "resnet50 4x4" },
    { 8, 15, 15, 65, 64, 3, 2, 1, 0, "odd" },
    { 8, 7, 7, 65, 65, 1, 1, 0, 0, "odd 1x1" },
    { 1, 15, 15, 65, 65, 1, 2, 0, 1, "odd 1x1 s2, batch 1" },
    { 1, 7, 7, 3, 16, 3, 1, 1, 1, "batch 1" },
    { 1, 15, 15, 3, 64, 7, 2, 3, 0, "7x7 stem" },
};

static void conv_case(const conv_shape *s, tq_dtype dt, int v) {
    static const char *const op[] = { "conv_fwd", "conv_fwd", "conv_bwd_data", "conv_bwd_data", "conv_bwd_filter" };
    tq_conv_desc d = { { s->n, s->h, s->w, s->c }, s->k, s->r, s->r, s->stride, s->pad };
    tq_shape ys = tq_conv_yshape(&d);
    size_t nx = tq_shape_numel(d.x), ny = tq_shape_numel(ys), nw = (size_t)s->k * s->r * s->r * s->c;
    double a = sqrt(3.0 / ((double)s->r * s->r * s->c));      /* unit-variance outputs */
    int db = v == 4 && s->bias;
    tcase c;
    case_begin(&c, op[v], dt, "x %dx%dx%dx%d k%d %dx%d s%d p%d%s (%s)", s->n, s->h, s->w, s->c,
               s->k, s->r, s->r, s->stride, s->pad,
               v == 1 ? " bias" : v == 2 ? " beta 0" : v == 3 ? " beta 1" : db ? " db" : "", s->what);
    size_t wsb[2];
    for (int side = 0; side < 2; side++) {
        wsb[side] = G.be[side]->i->conv_ws(G.be[side], &d, dt);
        if (!wsb[side] && G.be[side]->err[0]) case_fail(&c, side, "conv_ws", G.be[side]->err);
    }
    tbuf *ws = tb_ws(&c, wsb);
    if (v <= 3) {
        tbuf *w = tb_in(&c, "w", dt, nw, -a, a);
        if (v <= 1) {
            tbuf *x = tb_in(&c, "x", dt, nx, -1, 1);
            tbuf *bias = v == 1 ? tb_in(&c, "bias", K_F32, s->k, -1, 1) : NULL;
            tbuf *y = tb_out(&c, "y", dt, ny);
            RUN(&c, be->i->conv_fwd(be, &d, dt, P(y), P(x), P(w), P(bias), P(ws), WSB(ws)));
            check(&c, y);
        } else {
            tbuf *dy = tb_in(&c, "dy", dt, ny, -1, 1);
            tbuf *dx = v == 2 ? tb_out(&c, "dx", dt, nx) : tb_in(&c, "dx", dt, nx, -1, 1);
            RUN(&c, be->i->conv_bwd_data(be, &d, dt, P(dx), v == 3 ? 1.0f : 0.0f, P(dy), P(w), P(ws), WSB(ws)));
            check(&c, dx);
        }
    } else {
        tbuf *x = tb_in(&c, "x", dt, nx, -1, 1);
        tbuf *dy = tb_in(&c, "dy", dt, ny, -1, 1);
        tbuf *dw = tb_in(&c, "dw", K_F32, nw, -1, 1);
        tbuf *dbias = db ? tb_in(&c, "db", K_F32, s->k, -1, 1) : NULL;
        RUN(&c, be->i->conv_bwd_filter(be, &d, dt, P(dw), P(dbias), P(x), P(dy), P(ws), WSB(ws)));
        check(&c, dw);
        if (dbias) check(&c, dbias);
    }
    case_end(&c);
}

/* ---- linear ---- */
typedef struct { int n, in, out; const char *what; } lin_shape;
static const lin_shape LINS[] = {
    { 8, 784, 512, "mlp fc1" }, { 8, 512, 256, "mlp fc2" }, { 8, 256, 10, "mlp fc3" },
    { 8, 3136, 128, "cnn fc1" }, { 64, 128, 10, "cnn fc2, batch 64" }, { 8, 64, 10, "resnet20 fc" },
    { 8, 2048, 1000, "resnet50 fc" }, { 1, 65, 3, "odd, batch 1" },
};

static void linear_case(const lin_shape *s, tq_dtype dt, int v) {
    static const char *const op[] = { "linear_fwd", "linear_fwd", "linear_bwd_data", "linear_bwd_data", "linear_bwd_filter" };
    size_t nx = (size_t)s->n * s->in, ny = (size_t)s->n * s->out, nw = (size_t)s->in * s->out;
    double a = sqrt(3.0 / s->in);
    tcase c;
    case_begin(&c, op[v], dt, "n%d in%d out%d%s (%s)", s->n, s->in, s->out,
               v == 1 ? " bias" : v == 2 ? " beta 0" : v == 3 ? " beta 1" : "", s->what);
    size_t wsb[2];
    for (int side = 0; side < 2; side++) {
        wsb[side] = G.be[side]->i->linear_ws(G.be[side], s->n, s->in, s->out, dt);
        if (!wsb[side] && G.be[side]->err[0]) case_fail(&c, side, "linear_ws", G.be[side]->err);
    }
    tbuf *ws = tb_ws(&c, wsb);
    if (v <= 3) {
        tbuf *w = tb_in(&c, "w", dt, nw, -a, a);
        if (v <= 1) {
            tbuf *x = tb_in(&c, "x", dt, nx, -1, 1);
            tbuf *bias = v == 1 ? tb_in(&c, "bias", K_F32, s->out, -1, 1) : NULL;
            tbuf *y = tb_out(&c, "y", dt, ny);
            RUN(&c, be->i->linear_fwd(be, s->n, s->in, s->out, dt, P(y), P(x), P(w), P(bias), P(ws), WSB(ws)));
            check(&c, y);
        } else {
            tbuf *dy = tb_in(&c, "dy", dt, ny, -1, 1);
            tbuf *dx = v == 2 ? tb_out(&c, "dx", dt, nx) : tb_in(&c, "dx", dt, nx, -1, 1);
            RUN(&c, be->i->linear_bwd_data(be, s->n, s->in, s->out, dt, P(dx), v == 3 ? 1.0f : 0.0f, P(dy),
                                           P(w), P(ws), WSB(ws)));
            check(&c, dx);
        }
    } else {
        tbuf *x = tb_in(&c, "x", dt, nx, -1, 1);
        tbuf *dy = tb_in(&c, "dy", dt, ny, -1, 1);
        tbuf *dw = tb_in(&c, "dw", K_F32, nw, -1, 1);
        tbuf *db = tb_in(&c, "db", K_F32, s->out, -1, 1);
        RUN(&c, be->i->linear_bwd_filter(be, s->n, s->in, s->out, dt, P(dw), P(db), P(x), P(dy), P(ws), WSB(ws)));
        check(&c, dw);
        check(&c, db);
    }
    case_end(&c);
}

/* ---- batch-norm ---- */
static const tq_shape BNS[] = {
    { 32, 16, 16, 64 }, { 64, 32, 32, 16 }, { 8, 4, 4, 2048 }, { 8, 28, 28, 1 }, { 1, 7, 7, 65 }, { 2, 1, 1, 3 },
};

static void bn_case(tq_shape s, tq_dtype dt, int v) {
    static const char *const op[] = { "bn_fwd_train", "bn_fwd_infer", "bn_bwd", "bn_bwd",
                                      "bn_norm", "bn_norm", "bn_norm", "bn_fwd_train", "bn_fwd_infer",
                                      "bn_bwd", "bn_bwd", "bn_bwd" };
    static const char *const par[] = { "", "", " beta_dx 0", " beta_dx 1", " relu", " +res relu", "",
                                       " +res relu", " relu", " behind relu (NaN in relu_y)",
                                       " behind relu, dres beta 0", " behind relu, dres beta 1, beta_dx 1" };
    const size_t n = tq_shape_numel(s), C = (size_t)s.c, m = n / C;
    const float momentum = 0.1f, eps = 1e-5f;
    tcase c;
    case_begin(&c, op[v], dt, "%dx%dx%dx%d (N*H*W %zu)%s", s.n, s.h, s.w, s.c, m, par[v]);
    tbuf *gamma = tb_in(&c, "gamma", K_F32, C, 0.5, 1.5);
    if (v >= 4 && v <= 6) {   /* the recomputation of relu(bn(x) [+ res]) with given statistics */
        tbuf *x = tb_in(&c, "x", dt, n, -1, 3);
        tbuf *beta = tb_in(&c, "beta", K_F32, C, -0.5, 0.5);
        tbuf *mean = tb_in(&c, "mean", K_F32, C, 0, 2);
        tbuf *invstd = tb_in(&c, "invstd", K_F32, C, 0.5, 2);
        tbuf *res = v == 5 ? tb_in(&c, "res", dt, n, -2, 2) : NULL;
        tbuf *y = tb_out(&c, "y", dt, n);
        RUN(&c, be->i->bn_norm(be, s, dt, P(y), P(x), P(res), P(gamma), P(beta), P(mean),
                               P(invstd), v != 6));
        check(&c, y);
    } else if (v == 0 || v == 7) {   /* 7: with the fused residual add and ReLU */
        tbuf *x = tb_in(&c, "x", dt, n, -1, 3);                 /* mean away from 0 */
        tbuf *res = v == 7 ? tb_in(&c, "res", dt, n, -2, 2) : NULL;
        tbuf *beta = tb_in(&c, "beta", K_F32, C, -0.5, 0.5);
        tbuf *y = tb_out(&c, "y", dt, n);
        tbuf *sm = tb_out(&c, "save_mean", K_F32, C);
        tbuf *si = tb_out(&c, "save_invstd", K_F32, C);
        tbuf *rm = tb_in(&c, "run_mean", K_F32, C, -1, 1);
        tbuf *rv = tb_in(&c, "run_var", K_F32, C, 0.5, 1.5);
        RUN(&c, be->i->bn_fwd_train(be, s, dt, P(y), P(x), P(gamma), P(beta), P(sm), P(si), P(rm), P(rv),
                                    momentum, eps, P(res), v == 7));
        check(&c, y); check(&c, sm); check(&c, si); check(&c, rm); check(&c, rv);
    } else if (v == 1 || v == 8) {   /* 8: with the fused ReLU */
        tbuf *x = tb_in(&c, "x", dt, n, -1, 3);
        tbuf *beta = tb_in(&c, "beta", K_F32, C, -0.5, 0.5);
        tbuf *rm = tb_in(&c, "run_mean", K_F32, C, 0, 2);
        tbuf *rv = tb_in(&c, "run_var", K_F32, C, 0.5, 2);
        tbuf *y = tb_out(&c, "y", dt, n);
        RUN(&c, be->i->bn_fwd_infer(be, s, dt, P(y), P(x), P(gamma), P(beta), P(rm), P(rv), eps, NULL, v == 8));
        check(&c, y);
    } else {
        /* the saved statistics of x itself (as bn_fwd_train would save them) */
        void *xh = gen(dt, n, -1, 3);
        float *mean = xmalloc(C * sizeof(float)), *invstd = xmalloc(C * sizeof(float));
        for (size_t j = 0; j < C; j++) {
            double s1 = 0, s2 = 0;
            for (size_t r = 0; r < m; r++) s1 += kload(dt, xh, r * C + j);
            for (size_t r = 0; r < m; r++) { double e = kload(dt, xh, r * C + j) - s1 / m; s2 += e * e; }
            mean[j] = (float)(s1 / m);
            invstd[j] = (float)(1.0 / sqrt(s2 / m + eps));
        }
        tbuf *x = tb_host(&c, "x", dt, n, xh);
        tbuf *sm = tb_host(&c, "save_mean", K_F32, C, mean);
        tbuf *si = tb_host(&c, "save_invstd", K_F32, C, invstd);
        free(xh); free(mean);
        void *dyh = gen(dt, n, -1, 1);
        tbuf *dy = tb_host(&c, "dy", dt, n, dyh);
        /* dx = γ·σ⁻¹·(dy − mean dy − x̂·mean(dy·x̂)) cancels to ~ε/σ² of its terms when N*H*W is
         * tiny (2 rows: x̂ = ±1): measure its error against the terms, γ·σ⁻¹·dy ≤ 1.5·σ⁻¹·|dy|,
         * since neither side's f32 can be closer than that */
        double dxscale = 0;
        for (size_t i = 0; i < n; i++) {
            double t = 1.5 * invstd[i % C] * fabs(kload(dt, dyh, i));
            if (t > dxscale) dxscale = t;
        }
        free(dyh); free(invstd);
        int acc = v == 3 || v == 11;
        tbuf *dx = acc ? tb_in(&c, "dx", dt, n, -1, 1) : tb_out(&c, "dx", dt, n);
        tbuf *dg = tb_in(&c, "dgamma", K_F32, C, -1, 1);
        tbuf *dbt = tb_in(&c, "dbeta", K_F32, C, -1, 1);
        tbuf *ry = NULL, *dres = NULL;
        if (v >= 9) {   /* behind a ReLU: its output, half of it 0 (masked), one NaN (passes) */
            ry = tb_in(&c, "relu_y", dt, n, -1, 1);
            tb_set(&c, ry, n / 2, NAN);
        }
        if (v == 10) dres = tb_out(&c, "dres", dt, n);
        if (v == 11) dres = tb_in(&c, "dres", dt, n, -1, 1);
        RUN(&c, be->i->bn_bwd(be, s, dt, P(dx), acc ? 1.0f : 0.0f, P(dg), P(dbt), P(dy), P(x), P(gamma),
                              P(sm), P(si), P(ry), P(dres), v == 11 ? 1.0f : 0.0f));
        check_range(&c, dx, dx->name, 0, dx->n, 0, dxscale);
        check(&c, dg); check(&c, dbt);
        if (dres) check(&c, dres);
    }
    case_end(&c);
}

/* ---- element-wise ---- */
static const size_t ELN[] = { 1, 4099, 1000003 };

static void elem_case(size_t n, tq_dtype dt, int v) {
    static const char *const op[] = { "relu_fwd", "relu_fwd", "relu_bwd", "relu_bwd", "relu_bwd",
                                      "add_fwd", "accumulate", "accumulate", "accumulate" };
    static const char *const par[] = { "", " NaN in x", " beta 0", " beta 1", " NaN in y",
                                       "", " beta 0", " beta 1", " beta 0.5" };
    tcase c;
    case_begin(&c, op[v], dt, "n %zu%s", n, par[v]);
    if (v <= 1) {
        tbuf *x = tb_in(&c, "x", dt, n, -1, 1);
        if (v == 1) tb_set(&c, x, n / 3, NAN);
        tbuf *y = tb_out(&c, "y", dt, n);
        RUN(&c, be->i->relu_fwd(be, n, dt, P(y), P(x)));
        check(&c, y);
    } else if (v <= 4) {
        tbuf *dy = tb_in(&c, "dy", dt, n, -1, 1);
        tbuf *y = tb_in(&c, "y", dt, n, -1, 1);
        if (v == 4) tb_set(&c, y, n / 3, NAN);                  /* dx = dy there */
        tbuf *dx = v == 3 ? tb_in(&c, "dx", dt, n, -1, 1) : tb_out(&c, "dx", dt, n);
        RUN(&c, be->i->relu_bwd(be, n, dt, P(dx), v == 3 ? 1.0f : 0.0f, P(dy), P(y)));
        check(&c, dx);
    } else if (v == 5) {
        tbuf *a = tb_in(&c, "a", dt, n, -1, 1), *b = tb_in(&c, "b", dt, n, -1, 1);
        tbuf *y = tb_out(&c, "y", dt, n);
        RUN(&c, be->i->add_fwd(be, n, dt, P(y), P(a), P(b)));
        check(&c, y);
    } else {
        float beta = v == 6 ? 0.0f : v == 7 ? 1.0f : 0.5f;
        tbuf *src = tb_in(&c, "src", dt, n, -1, 1);
        tbuf *dst = v == 6 ? tb_out(&c, "dst", dt, n) : tb_in(&c, "dst", dt, n, -1, 1);
        RUN(&c, be->i->accumulate(be, n, dt, P(dst), beta, P(src)));
        check(&c, dst);
    }
    case_end(&c);
}

/* ---- pooling ---- */
static const tq_shape MAXPS[] = { { 8, 28, 28, 32 }, { 8, 14, 14, 64 }, { 8, 15, 15, 65 }, { 1, 7, 7, 3 }, { 1, 2, 2, 1 } };
static const tq_shape AVGPS[] = { { 8, 8, 8, 64 }, { 8, 4, 4, 2048 }, { 64, 8, 8, 64 }, { 8, 15, 15, 3 }, { 1, 7, 7, 65 } };

static void maxpool_case(tq_shape s, tq_dtype dt, int v, int relu) {
    static const char *const par[] = { "", " NaN in x", " beta 0", " beta 1", " NaN in x" };
    tq_shape ys = { s.n, s.h / 2, s.w / 2, s.c };
    size_t nx = tq_shape_numel(s), ny = tq_shape_numel(ys);
    tcase c;
    case_begin(&c, v <= 1 ? "maxpool_fwd" : "maxpool_bwd", dt, "x %dx%dx%dx%d%s%s", s.n, s.h, s.w, s.c, par[v],
               relu ? " relu" : "");
    tbuf *x = tb_in(&c, "x", dt, nx, -1, 1);
    if (v == 1 || v == 4) tb_set(&c, x, nx / 2, NAN);
    if (v <= 1) {
        tbuf *y = tb_out(&c, "y", dt, ny);
        RUN(&c, be->i->maxpool_fwd(be, s, dt, P(y), P(x), relu));
        check(&c, y);
    } else {
        tbuf *dy = tb_in(&c, "dy", dt, ny, -1, 1);
        tbuf *dx = v == 3 ? tb_in(&c, "dx", dt, nx, -1, 1) : tb_out(&c, "dx", dt, nx);
        RUN(&c, be->i->maxpool_bwd(be, s, dt, P(dx), v == 3 ? 1.0f : 0.0f, P(dy), P(x), relu));
        check(&c, dx);
    }
    case_end(&c);
}

static void avgpool_case(tq_shape s, tq_dtype dt, int v) {
    size_t nx = tq_shape_numel(s), ny = (size_t)s.n * s.c;
    tcase c;
    case_begin(&c, v == 0 ? "avgpool_fwd" : "avgpool_bwd", dt, "x %dx%dx%dx%d%s", s.n, s.h, s.w, s.c,
               v == 1 ? " beta 0" : v == 2 ? " beta 1" : "");
    if (v == 0) {
        tbuf *x = tb_in(&c, "x", dt, nx, -1, 1);
        tbuf *y = tb_out(&c, "y", dt, ny);
        RUN(&c, be->i->avgpool_fwd(be, s, dt, P(y), P(x)));
        check(&c, y);
    } else {
        tbuf *dy = tb_in(&c, "dy", dt, ny, -1, 1);
        tbuf *dx = v == 2 ? tb_in(&c, "dx", dt, nx, -1, 1) : tb_out(&c, "dx", dt, nx);
        RUN(&c, be->i->avgpool_bwd(be, s, dt, P(dx), v == 2 ? 1.0f : 0.0f, P(dy)));
        check(&c, dx);
    }
    case_end(&c);
}

/* ---- softmax cross-entropy ---- */
static const int SMX[][2] = { { 1, 10 }, { 64, 10 }, { 4096, 10 }, { 256, 100 }, { 3, 1000 }, { 512, 1000 } };

static void softmax_case(int n, int classes, tq_dtype dt, int eval) {
    const float grad_scale = 8.0f;             /* loss scale 16, 2 accumulation steps */
    size_t nl = (size_t)n * classes;
    tcase c;
    case_begin(&c, eval ? "softmax_ce_eval" : "softmax_ce", dt, "n %d classes %d%s", n, classes,
               eval ? "" : " grad_scale 8");
    tbuf *logits = tb_in(&c, "logits", dt, nl, -3, 3);
    int32_t *lab = xmalloc((size_t)n * sizeof *lab);
    for (int i = 0; i < n; i++) lab[i] = irand(classes);
    tbuf *labels = tb_host(&c, "labels", K_I32, (size_t)n, lab);
    free(lab);
    float pre[2] = { (float)uni(0, 10), (float)irand(5) };  /* out accumulates */
    tbuf *out = tb_host(&c, "out", K_F32, 2, pre);
    if (!eval) {
        tbuf *dl = tb_out(&c, "dlogits", dt, nl);
        RUN(&c, be->i->softmax_ce(be, n, classes, dt, P(dl), P(logits), P(labels), grad_scale, P(out)));
        check(&c, dl);
    } else {
        RUN(&c, be->i->softmax_ce_eval(be, n, classes, dt, P(logits), P(labels), P(out)));
    }
    check_range(&c, out, "out[0] loss", 0, 1, 0, 0);
    check_range(&c, out, "out[1] hits", 1, 1, 1, 0);
    case_end(&c);
}

/* ---- casts: every pair, exact (pure rounding) ---- */
static void cast_case(size_t n, tq_dtype sdt, tq_dtype ddt) {
    tcase c;
    case_begin(&c, "cast", ddt, "n %zu, |v| in 2^-27..2^17 and specials", n);
    snprintf(c.dtl, sizeof c.dtl, "%s->%s", kname(sdt), kname(ddt));
    void *h = xmalloc(n * ksize(sdt));
    static const double special[] = { 0.0, -0.0, 65504, 65519, 65520, -1e6, 6.1e-5, 5.96e-8, 2.9e-8, 1.0 / 3 };
    for (size_t i = 0; i < n; i++) {
        double v = i < sizeof special / sizeof *special ? special[i]
                                                        : (irand(2) ? -1 : 1) * exp2(uni(-27, 17));
        kstore(sdt, h, i, v);
    }
    tbuf *src = tb_host(&c, "src", sdt, n, h);
    free(h);
    tbuf *dst = tb_out(&c, "dst", ddt, n);
    RUN(&c, be->i->cast(be, n, ddt, P(dst), sdt, P(src)));
    check_range(&c, dst, "dst", 0, n, 1, 0);
    case_end(&c);
}

/* ---- unscale + inf check ---- */
static void unscale_case(size_t n, int plant) {     /* plant: 0 none, 1 +inf, 2 NaN */
    static const char *const par[] = { "clean", "+inf planted", "NaN planted" };
    tcase c;
    case_begin(&c, "unscale_check", TQ_F32, "n %zu, inv_scale 1/1024, %s", n, par[plant]);
    tbuf *g = tb_in(&c, "g", K_F32, n, -1000, 1000);
    if (plant == 1) tb_set(&c, g, n - 1, INFINITY);
    if (plant == 2) tb_set(&c, g, n / 2 + 1, NAN);
    float zero = 0.0f;
    tbuf *fi = tb_host(&c, "found_inf", K_F32, 1, &zero);   /* the caller zeroes it */
    RUN(&c, be->i->unscale_check(be, n, P(g), 1.0f / 1024, P(fi)));
    check(&c, g);
    check_range(&c, fi, "found_inf", 0, 1, 1, 0);
    expect(&c, fi, 0, plant ? 1.0 : 0.0);
    case_end(&c);
}

/* ---- optimizers ---- */
static const char *const SKIPL[] = { "", " skip flag 0", " skip flag 1 (nothing moves)" };
/* skip -1: no flag; 0 / 1: a device flag with that value */
static tbuf *skip_flag(tcase *c, int skip) {
    const float v = (float)skip;
    return skip < 0 ? NULL : tb_host(c, "skip", K_F32, 1, &v);
}

/* the 16-bit weight copy an optimizer step writes in the same pass: wdt -1 none, else a buffer
 * of that dtype filled with other values first (a skipped step must leave them) */
static const char *wcopy_label(int wdt) {
    return wdt < 0 ? "" : wdt == TQ_F16 ? " + f16 weight copy" : " + bf16 weight copy";
}
static tbuf *wcopy_buf(tcase *c, const char *name, int wdt, size_t n) {
    return wdt < 0 ? NULL : tb_in(c, name, wdt, n, -1, 1);
}
#define WDT(wdt) ((wdt) < 0 ? TQ_F32 : (tq_dtype)(wdt))
/* the weight copies of a plain op and its _dyn twin, filled with the same values (none, wdt -1) */
static void wcopy_pair(tcase *c, int wdt, size_t n, tbuf **l1, tbuf **l2) {
    if (wdt < 0) return;
    void *hl = gen(wdt, n, -1, 1);
    *l1 = tb_host(c, "w copy plain", wdt, n, hl);
    *l2 = tb_host(c, "w copy", wdt, n, hl);
    free(hl);
}

/* The 16-bit weight copy wl an optimizer step wrote beside w: on each side exactly that side's
 * new w rounded to wl's type, or, with the skip flag set (skip 1), untouched: the same bytes on
 * both sides. Not the 16-bit copy of one side against the other's at f32's tolerance: the
 * GPU's update is contracted into FMAs by nvcc (the CPU's C is not), so its w may differ from
 * the CPU's in the last bit, and where that bit moves the rounding, the copies differ by a
 * 16-bit ulp (~1e-3 of the value). */
static void check_copy(tcase *c, tbuf *wl, tbuf *w, int skip) {
    if (skip == 1) {
        check_range(c, wl, "w copy untouched", 0, wl->n, 1, 0);
        return;
    }
    double *vl[2], *vw[2];
    void *rl[2], *rw[2];
    if (download(c, wl, vl, rl)) return;
    if (download(c, w, vw, rw)) { for (int s = 0; s < 2; s++) { free(vl[s]); free(rl[s]); } return; }
    size_t nbad[2] = { 0, 0 }, first[2] = { 0, 0 };
    unsigned char one[4];
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < wl->n; i++) {
            kstore(wl->kind, one, 0, vw[s][i]);
            double want = kload(wl->kind, one, 0);
            if (isnan(want) ? !isnan(vl[s][i]) : vl[s][i] != want)
                if (!nbad[s]++) first[s] = i;
        }
    int side = nbad[DEV] ? DEV : REF;
    if (nbad[0] + nbad[1]) {
        size_t i = first[side];
        add_row(c, "w copy == w rounded", INFINITY, 0.0, 1, 0, "%s: %zu of %zu differ (first [%zu]: copy %.9g, w %.9g)",
                side == DEV ? "dev" : "ref", nbad[side], wl->n, i, vl[side][i], vw[side][i]);
    } else {
        add_row(c, "w copy == w rounded", 0.0, 0.0, 1, 1, "%s", "");
    }
    for (int s = 0; s < 2; s++) { free(vl[s]); free(rl[s]); free(vw[s]); free(rw[s]); }
}

static void sgd_case(size_t n, float mom, float wd, int nesterov, int skip, int wdt) {
    tcase c;
    case_begin(&c, "sgd_step", TQ_F32, "n %zu lr 0.05 momentum %g wd %g%s%s%s%s", n, mom, wd,
               nesterov ? " nesterov" : "", mom == 0 ? " buf NULL" : "", SKIPL[skip + 1], wcopy_label(wdt));
    tbuf *w = tb_in(&c, "w", K_F32, n, -1, 1), *g = tb_in(&c, "g", K_F32, n, -1, 1);
    tbuf *buf = mom != 0 ? tb_in(&c, "buf", K_F32, n, -1, 1) : NULL;
    tbuf *sk = skip_flag(&c, skip), *wl = wcopy_buf(&c, "w copy", wdt, n);
    RUN(&c, be->i->sgd_step(be, n, P(w), P(g), P(buf), 0.05f, mom, wd, nesterov, P(sk), P(wl), WDT(wdt)));
    check(&c, w);
    if (buf) check(&c, buf);
    if (wl) check_copy(&c, wl, w, skip);
    case_end(&c);
}

static void adamw_case(size_t n, int t, float wd, int skip, int wdt) {
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    tcase c;
    case_begin(&c, "adamw_step", TQ_F32, "n %zu lr 1e-3 betas 0.9/0.999 eps 1e-8 wd %g step %d%s%s", n, wd, t,
               SKIPL[skip + 1], wcopy_label(wdt));
    tbuf *w = tb_in(&c, "w", K_F32, n, -1, 1), *g = tb_in(&c, "g", K_F32, n, -1, 1);
    tbuf *m = tb_in(&c, "m", K_F32, n, -0.1, 0.1), *v = tb_in(&c, "v", K_F32, n, 0, 0.01);
    tbuf *sk = skip_flag(&c, skip), *wl = wcopy_buf(&c, "w copy", wdt, n);
    RUN(&c, be->i->adamw_step(be, n, P(w), P(g), P(m), P(v), lr, b1, b2, eps, wd, bc1, bc2, P(sk), P(wl), WDT(wdt)));
    check(&c, w); check(&c, m); check(&c, v);
    if (wl) check_copy(&c, wl, w, skip);
    case_end(&c);
}

/* ---- the step on the device (cuda_graphs): the _dyn ops, step_end, fetch, graphs ----
 * Each _dyn op runs next to its plain op on the same inputs (the plain op given the values the
 * _dyn one reads from the tq_dstep structs): the _dyn output must equal the plain one bit for
 * bit on each side ("same bits"), and match the reference like the plain op does. */

/* b1 and b2 hold the same bytes, on the reference and on the device */
static void same_bits(tcase *c, tbuf *b1, tbuf *b2, const char *label) {
    if (c->bad) return;
    char where[96] = "";
    int ok = 1;
    for (int s = 0; s < 2; s++) {
        G.be[s]->i->sync(G.be[s]);
        void *x = xmalloc(b1->bytes[s]), *y = xmalloc(b2->bytes[s]);
        G.be[s]->i->to_host(G.be[s], x, b1->p[s], b1->bytes[s]);
        G.be[s]->i->to_host(G.be[s], y, b2->p[s], b2->bytes[s]);
        if (b1->bytes[s] != b2->bytes[s] || memcmp(x, y, b1->bytes[s])) {
            ok = 0;
            snprintf(where, sizeof where, "%s and %s differ on the %s", b1->name, b2->name,
                     s == REF ? "reference" : "device");
        }
        free(x); free(y);
    }
    add_row(c, label, ok ? 0.0 : INFINITY, 0.0, 1, ok, "%s", where);
}

#define STATE(b) ((tq_dstep_state *)P(b))
#define DIN(b) ((const tq_dstep_in *)P(b))

static void softmax_dyn_case(int n, int classes, tq_dtype dt, int accum) {
    const tq_dstep_state st = { 1000.1, 0, 0, 0 };   /* a double no float equals */
    size_t nl = (size_t)n * classes;
    tcase c;
    case_begin(&c, "softmax_ce_dyn", dt, "n %d classes %d scale 1000.1 accum %d", n, classes, accum);
    tbuf *logits = tb_in(&c, "logits", dt, nl, -3, 3);
    int32_t *lab = xmalloc((size_t)n * sizeof *lab);
    for (int i = 0; i < n; i++) lab[i] = irand(classes);
    tbuf *labels = tb_host(&c, "labels", K_I32, (size_t)n, lab);
    free(lab);
    float pre[2] = { 2.5f, 3 };
    tbuf *out1 = tb_host(&c, "out plain", K_F32, 2, pre), *out2 = tb_host(&c, "out", K_F32, 2, pre);
    tbuf *dl1 = tb_out(&c, "dlogits plain", dt, nl), *dl2 = tb_out(&c, "dlogits", dt, nl);
    tbuf *stb = tb_host(&c, "state", K_U8, sizeof st, &st);
    RUN(&c, be->i->softmax_ce(be, n, classes, dt, P(dl1), P(logits), P(labels),
                              tq_dstep_grad_scale(st.scale, accum), P(out1)));
    RUN(&c, be->i->softmax_ce_dyn(be, n, classes, dt, P(dl2), P(logits), P(labels), STATE(stb), accum, P(out2)));
    check(&c, dl2);
    check_range(&c, out2, "out[0] loss", 0, 1, 0, 0);
    same_bits(&c, dl1, dl2, "same bits: dlogits");
    same_bits(&c, out1, out2, "same bits: out");
    case_end(&c);
}

static void unscale_dyn_case(size_t n, int plant) {
    const tq_dstep_state st = { 65536.0, 0, 0, 0 };
    tcase c;
    case_begin(&c, "unscale_check_dyn", TQ_F32, "n %zu, scale 65536%s", n, plant ? ", +inf planted" : "");
    void *h = gen(K_F32, n, -1000, 1000);
    if (plant) ((float *)h)[n - 1] = INFINITY;
    tbuf *g1 = tb_host(&c, "g plain", K_F32, n, h), *g2 = tb_host(&c, "g", K_F32, n, h);
    free(h);
    float zero = 0.0f;
    tbuf *f1 = tb_host(&c, "found_inf plain", K_F32, 1, &zero), *f2 = tb_host(&c, "found_inf", K_F32, 1, &zero);
    tbuf *stb = tb_host(&c, "state", K_U8, sizeof st, &st);
    RUN(&c, be->i->unscale_check(be, n, P(g1), tq_dstep_inv_scale(st.scale), P(f1)));
    RUN(&c, be->i->unscale_check_dyn(be, n, P(g2), STATE(stb), P(f2)));
    check(&c, g2);
    expect(&c, f2, 0, plant ? 1.0 : 0.0);
    same_bits(&c, g1, g2, "same bits: g");
    case_end(&c);
}

static void sgd_dyn_case(size_t n, float mom, int skip, int wdt) {
    const tq_dstep_in in = { 0.0375f, 1, 0, 0, 0, 0 };
    tcase c;
    case_begin(&c, "sgd_step_dyn", TQ_F32, "n %zu lr 0.0375 momentum %g wd 5e-4 nesterov%s%s", n, mom,
               SKIPL[skip + 1], wcopy_label(wdt));
    void *hw = gen(K_F32, n, -1, 1), *hb = gen(K_F32, n, -1, 1);
    tbuf *w1 = tb_host(&c, "w plain", K_F32, n, hw), *w2 = tb_host(&c, "w", K_F32, n, hw);
    tbuf *b1 = mom != 0 ? tb_host(&c, "buf plain", K_F32, n, hb) : NULL;
    tbuf *b2 = mom != 0 ? tb_host(&c, "buf", K_F32, n, hb) : NULL;
    free(hw); free(hb);
    tbuf *g = tb_in(&c, "g", K_F32, n, -1, 1);
    tbuf *inb = tb_host(&c, "in", K_U8, sizeof in, &in);
    tbuf *sk = skip_flag(&c, skip);
    tbuf *l1 = NULL, *l2 = NULL;
    wcopy_pair(&c, wdt, n, &l1, &l2);
    RUN(&c, be->i->sgd_step(be, n, P(w1), P(g), P(b1), in.lr, mom, 5e-4f, 1, P(sk), P(l1), WDT(wdt)));
    RUN(&c, be->i->sgd_step_dyn(be, n, P(w2), P(g), P(b2), DIN(inb), mom, 5e-4f, 1, P(sk), P(l2), WDT(wdt)));
    check(&c, w2);
    if (l2) check_copy(&c, l2, w2, skip);
    same_bits(&c, w1, w2, "same bits: w");
    if (b1) same_bits(&c, b1, b2, "same bits: buf");
    if (l1) same_bits(&c, l1, l2, "same bits: w copy");
    case_end(&c);
}

static void adamw_dyn_case(size_t n, int pick_b, int skip, int wdt) {
    const float b1 = 0.9f, b2 = 0.999f;
    tq_dstep_in in = { 1e-3f, 7, 0, 0, 0, 0 };
    in.bc1_a = (float)(1.0 - pow(b1, 7.0)); in.bc2_a = (float)(1.0 - pow(b2, 7.0));
    in.bc1_b = (float)(1.0 - pow(b1, 8.0)); in.bc2_b = (float)(1.0 - pow(b2, 8.0));
    const tq_dstep_state st = { 1, 1, 0, pick_b ? 7 : 6 };   /* t = opt_t + 1: 7 = t_a, or 8 */
    tcase c;
    case_begin(&c, "adamw_step_dyn", TQ_F32, "n %zu lr 1e-3 wd 0.01, the device at t %d of {7, 8}%s%s", n,
               pick_b ? 8 : 7, SKIPL[skip + 1], wcopy_label(wdt));
    void *hw = gen(K_F32, n, -1, 1), *hm = gen(K_F32, n, -0.1, 0.1), *hv = gen(K_F32, n, 0, 0.01);
    tbuf *w1 = tb_host(&c, "w plain", K_F32, n, hw), *w2 = tb_host(&c, "w", K_F32, n, hw);
    tbuf *m1 = tb_host(&c, "m plain", K_F32, n, hm), *m2 = tb_host(&c, "m", K_F32, n, hm);
    tbuf *v1 = tb_host(&c, "v plain", K_F32, n, hv), *v2 = tb_host(&c, "v", K_F32, n, hv);
    free(hw); free(hm); free(hv);
    tbuf *g = tb_in(&c, "g", K_F32, n, -1, 1);
    tbuf *inb = tb_host(&c, "in", K_U8, sizeof in, &in), *stb = tb_host(&c, "state", K_U8, sizeof st, &st);
    tbuf *sk = skip_flag(&c, skip);
    float bc1 = pick_b ? in.bc1_b : in.bc1_a, bc2 = pick_b ? in.bc2_b : in.bc2_a;
    tbuf *l1 = NULL, *l2 = NULL;
    wcopy_pair(&c, wdt, n, &l1, &l2);
    RUN(&c, be->i->adamw_step(be, n, P(w1), P(g), P(m1), P(v1), in.lr, b1, b2, 1e-8f, 0.01f, bc1, bc2, P(sk),
                              P(l1), WDT(wdt)));
    RUN(&c, be->i->adamw_step_dyn(be, n, P(w2), P(g), P(m2), P(v2), DIN(inb), STATE(stb), b1, b2, 1e-8f, 0.01f,
                                  P(sk), P(l2), WDT(wdt)));
    check(&c, w2);
    if (l2) check_copy(&c, l2, w2, skip);
    same_bits(&c, w1, w2, "same bits: w");
    same_bits(&c, m1, m2, "same bits: m");
    same_bits(&c, v1, v2, "same bits: v");
    if (l1) same_bits(&c, l1, l2, "same bits: w copy");
    case_end(&c);
}

/* step_end: the state after it, bit for bit the reference's (kernels/common's tq_dstep_end) */
static void step_end_case(int fp16, int flag, double scale, int tracker) {
    tq_dstep_state st = { scale, 0, tracker, 41 };
    tcase c;
    case_begin(&c, "step_end", TQ_F32, "%s, found_inf %d, scale %.9g, tracker %d of 3", fp16 ? "fp16" : "no scaler",
               flag, scale, tracker);
    tbuf *stb = tb_host(&c, "state", K_U8, sizeof st, &st);
    const float f = (float)flag;
    tbuf *fb = tb_host(&c, "found_inf", K_F32, 1, &f);
    RUN(&c, be->i->step_end(be, STATE(stb), P(fb), fp16, 2.0f, 0.5f, 3));
    check(&c, stb);
    tq_dstep_end(&st, fp16, flag, 2.0f, 0.5f, 3);
    double *v[2];
    void *raw[2];
    if (!download(&c, stb, v, raw)) {
        int ok = !memcmp(raw[DEV], &st, sizeof st);
        add_row(&c, "state == tq_dstep_end", ok ? 0.0 : INFINITY, 0.0, 1, ok, "%s", ok ? "" : "device state differs");
        for (int s = 0; s < 2; s++) { free(v[s]); free(raw[s]); }
    }
    case_end(&c);
}

/* fetch_begin / fetch_end: the bytes as they were when the stream reached the fetch */
static void fetch_case(void) {
    tcase c;
    case_begin(&c, "fetch", TQ_F32, "%d bytes into slot 3, then the source overwritten", TQ_FETCH_BYTES);
    unsigned char h[TQ_FETCH_BYTES], got[TQ_FETCH_BYTES];
    for (int i = 0; i < TQ_FETCH_BYTES; i++) h[i] = (unsigned char)(31 * i + 7);
    tbuf *src = tb_host(&c, "src", K_U8, sizeof h, h);
    for (int side = 0; side < 2 && !c.bad; side++) {
        tq_backend *be = G.be[side];
        double t = -1, t0 = be->i->now_ms(be);
        int rc = be->i->fetch_begin(be, 3, src->p[side], sizeof h);
        be->i->memset0(be, src->p[side], sizeof h);   /* after the fetch, in stream order */
        if (!rc) rc = be->i->fetch_end(be, 3, got, sizeof got, &t);
        if (rc) { case_fail(&c, side, "fetch", be->err); break; }
        int ok = !memcmp(got, h, sizeof h) && t >= t0 - 1e-3 && isfinite(t);
        add_row(&c, side == REF ? "reference" : "device", ok ? 0.0 : INFINITY, 0.0, 1, ok,
                "t %.3f ms (now_ms before: %.3f)", t, t0);
    }
    case_end(&c);
}

/* A GPU whose memory is taken (here by this process: every block cudaMalloc still gives, down
 * to 1 MiB): opening another backend there must fail as busy (tq_cuda_open_busy), the daemon's
 * cue to put a job back in the queue rather than fail it; once the memory is back, the open
 * works and is not busy. On a CPU device (--against cpu) the case says it is skipped. */
static void busy_case(void) {
    tcase c;
    case_begin(&c, "open_busy", TQ_F32, "a second backend on cuda:0 with its memory taken, then given back");
    tq_backend *dv = G.be[DEV];
    if (!strcmp(dv->i->name, "cpu")) {
        add_row(&c, "skipped", 0.0, 0.0, 1, 1, "a busy GPU needs a CUDA device");
        case_end(&c);
        return;
    }
    enum { MAXHOG = 8192 };
    void **hog = xmalloc(MAXHOG * sizeof *hog);
    int nh = 0;
    size_t taken = 0;
    for (size_t chunk = (size_t)1 << 30; chunk >= ((size_t)1 << 20) && nh < MAXHOG;) {
        void *p = dv->i->alloc(dv, chunk);
        if (p) { hog[nh++] = p; taken += chunk; }
        else chunk /= 2;
    }
    dv->err[0] = 0;
    char why[256] = "";
    tq_backend *b2 = tq_cuda_backend_new(0, 0, 1, why, sizeof why);
    int busy = tq_cuda_open_busy();
    add_row(&c, "full", !b2 && busy ? 0.0 : INFINITY, 0.0, 1, !b2 && busy, "%.1f GiB taken in %d blocks: %s%s",
            taken / 1073741824.0, nh, b2 ? "opened anyway" : why, !b2 && !busy ? " (failed, but not as busy)" : "");
    if (b2) tq_backend_free(b2);
    for (int i = 0; i < nh; i++) dv->i->free(dv, hog[i]);
    free(hog);
    why[0] = 0;
    b2 = tq_cuda_backend_new(0, 0, 1, why, sizeof why);
    int ok = b2 && !tq_cuda_open_busy();
    add_row(&c, "given back", ok ? 0.0 : INFINITY, 0.0, 1, ok, "%s", b2 ? "opened" : why);
    if (b2) tq_backend_free(b2);
    case_end(&c);
}

/* the graph cases on a CPU device (--against cpu): the case says it is skipped and ends; 1 then */
static int graphs_skipped(tcase *c, tq_backend *dv) {
    if (strcmp(dv->i->name, "cpu")) return 0;
    add_row(c, "skipped", 0.0, 0.0, 1, 1, "CUDA graphs need a CUDA device");
    case_end(c);
    return 1;
}

/* CUDA graphs: a captured sequence replayed three times with new values in device memory
 * between the replays (the learning rate, the overflow flag) gives exactly what the same ops
 * issued directly give; on a CPU device (--against cpu) the case says it is skipped. */
static void graph_opt_case(void) {
    const size_t n = 100003;
    tcase c;
    case_begin(&c, "graph", TQ_F32, "capture sgd_step_dyn with its bf16 weight copy + step_end, replay 3x (lr 0.1/0.05/0.025, overflow at the 2nd)");
    tq_backend *dv = G.be[DEV];
    if (graphs_skipped(&c, dv)) return;
    const tq_dstep_state st0 = { 1024, 1024, 0, 0 };
    tq_dstep_in in = { 0.1f, 1, 0, 0, 0, 0 };
    void *hw = gen(K_F32, n, -1, 1), *hb = gen(K_F32, n, -1, 1);
    tbuf *w1 = tb_host(&c, "w direct", K_F32, n, hw), *w2 = tb_host(&c, "w", K_F32, n, hw);
    tbuf *b1 = tb_host(&c, "buf direct", K_F32, n, hb), *b2 = tb_host(&c, "buf", K_F32, n, hb);
    free(hw); free(hb);
    void *hl = gen(K_BF16, n, -1, 1);
    tbuf *l1 = tb_host(&c, "w copy direct", K_BF16, n, hl), *l2 = tb_host(&c, "w copy", K_BF16, n, hl);
    free(hl);
    tbuf *g = tb_in(&c, "g", K_F32, n, -1, 1);
    tbuf *s1 = tb_host(&c, "state direct", K_U8, sizeof st0, &st0), *s2 = tb_host(&c, "state", K_U8, sizeof st0, &st0);
    tbuf *in1 = tb_host(&c, "in direct", K_U8, sizeof in, &in), *in2 = tb_host(&c, "in", K_U8, sizeof in, &in);
    float zero = 0;
    tbuf *f1 = tb_host(&c, "flag direct", K_F32, 1, &zero), *f2 = tb_host(&c, "flag", K_F32, 1, &zero);
    void *gr = NULL;
    if (!c.bad) {
        int rc = dv->i->graph_begin(dv), orc = 0;
        if (!rc) {
            orc = dv->i->sgd_step_dyn(dv, n, w2->p[DEV], g->p[DEV], b2->p[DEV], (const tq_dstep_in *)in2->p[DEV],
                                      0.9f, 5e-4f, 1, f2->p[DEV], l2->p[DEV], TQ_BF16);
            if (!orc) orc = dv->i->step_end(dv, (tq_dstep_state *)s2->p[DEV], f2->p[DEV], 1, 2.0f, 0.5f, 2);
            rc = dv->i->graph_end(dv, orc == 0, &gr);
            if (orc) rc = orc;
        }
        if (rc) case_fail(&c, DEV, "capture", dv->err);
    }
    for (int k = 0; k < 3 && !c.bad; k++) {
        in.lr = 0.1f / (float)(1 << k);
        float flag = k == 1 ? 1.0f : 0.0f;
        for (int side = 0; side < 2; side++) {   /* new values, in stream order */
            tq_backend *be = G.be[side];
            be->i->to_device(be, in1->p[side], &in, sizeof in);
            be->i->to_device(be, in2->p[side], &in, sizeof in);
            be->i->to_device(be, f1->p[side], &flag, sizeof flag);
            be->i->to_device(be, f2->p[side], &flag, sizeof flag);
        }
        /* direct on both sides into the "direct" buffers; the replay on the device, direct on
         * the reference, into the others */
        RUN(&c, be->i->sgd_step_dyn(be, n, P(w1), P(g), P(b1), DIN(in1), 0.9f, 5e-4f, 1, P(f1), P(l1), TQ_BF16));
        RUN(&c, be->i->step_end(be, STATE(s1), P(f1), 1, 2.0f, 0.5f, 2));
        int rc = dv->i->graph_launch(dv, gr);
        if (rc) { case_fail(&c, DEV, "graph_launch", dv->err); break; }
        if (!c.bad && (rc = G.be[REF]->i->sgd_step_dyn(G.be[REF], n, w2->p[REF], g->p[REF], b2->p[REF],
                                                      (const tq_dstep_in *)in2->p[REF], 0.9f, 5e-4f, 1, f2->p[REF],
                                                      l2->p[REF], TQ_BF16)) == 0)
            rc = G.be[REF]->i->step_end(G.be[REF], (tq_dstep_state *)s2->p[REF], f2->p[REF], 1, 2.0f, 0.5f, 2);
        if (rc) case_fail(&c, REF, "(op)", G.be[REF]->err);
    }
    check(&c, w2);
    check_copy(&c, l2, w2, 0);   /* the last replay's step was not skipped */
    check(&c, s2);
    same_bits(&c, w1, w2, "replayed == direct: w");
    same_bits(&c, b1, b2, "replayed == direct: buf");
    same_bits(&c, l1, l2, "replayed == direct: w copy");
    same_bits(&c, s1, s2, "replayed == direct: state");
    dv->i->graph_free(dv, gr);
    case_end(&c);
}

/* cuDNN and cuBLASLt under capture: conv_fwd, conv_bwd_data (beta 1), conv_bwd_filter (dw
 * accumulates) and linear_fwd with bias, captured once and replayed twice, against the same
 * ops issued directly twice: bit for bit (deterministic engines, the same plans). */
static void graph_conv_case(tq_dtype dt) {
    const tq_conv_desc d = { { 8, 16, 16, 16 }, 32, 3, 3, 1, 1 };
    const int ln = 8, lin = 16 * 16 * 32, lout = 10;
    tcase c;
    case_begin(&c, "graph", dt, "capture conv fwd/bwd_data beta 1/bwd_filter x 8x16x16x16 k32 3x3 + linear_fwd bias, replay 2x");
    tq_backend *dv = G.be[DEV];
    if (graphs_skipped(&c, dv)) return;
    tq_shape ys = tq_conv_yshape(&d);
    size_t nx = tq_shape_numel(d.x), ny = tq_shape_numel(ys), nw = (size_t)d.k * d.r * d.s * d.x.c;
    size_t wsb[2];
    for (int side = 0; side < 2; side++) {
        size_t a = G.be[side]->i->conv_ws(G.be[side], &d, dt), b = G.be[side]->i->linear_ws(G.be[side], ln, lin, lout, dt);
        wsb[side] = a > b ? a : b;
    }
    tbuf *ws = tb_ws(&c, wsb);
    tbuf *x = tb_in(&c, "x", dt, nx, -1, 1), *w = tb_in(&c, "w", dt, nw, -0.2, 0.2), *dy = tb_in(&c, "dy", dt, ny, -1, 1);
    tbuf *lw = tb_in(&c, "lw", dt, (size_t)lin * lout, -0.01, 0.01), *lb = tb_in(&c, "lb", K_F32, lout, -1, 1);
    void *hdx = gen(dt, nx, -1, 1), *hdw = gen(K_F32, nw, -1, 1);
    tbuf *y1 = tb_out(&c, "y direct", dt, ny), *y2 = tb_out(&c, "y", dt, ny);
    tbuf *dx1 = tb_host(&c, "dx direct", dt, nx, hdx), *dx2 = tb_host(&c, "dx", dt, nx, hdx);
    tbuf *dw1 = tb_host(&c, "dw direct", K_F32, nw, hdw), *dw2 = tb_host(&c, "dw", K_F32, nw, hdw);
    tbuf *ly1 = tb_out(&c, "ly direct", dt, (size_t)ln * lout), *ly2 = tb_out(&c, "ly", dt, (size_t)ln * lout);
    free(hdx); free(hdw);
#define SEQ(be, Y, DX, DW, LY)                                                                              \
    ((be)->i->conv_fwd((be), &d, dt, Y, x->p[side], w->p[side], NULL, ws->p[side], ws->bytes[side]) ||     \
     (be)->i->conv_bwd_data((be), &d, dt, DX, 1.0f, dy->p[side], w->p[side], ws->p[side], ws->bytes[side]) || \
     (be)->i->conv_bwd_filter((be), &d, dt, DW, NULL, x->p[side], dy->p[side], ws->p[side], ws->bytes[side]) || \
     (be)->i->linear_fwd((be), ln, lin, lout, dt, LY, Y, lw->p[side], lb->p[side], ws->p[side], ws->bytes[side]))
    void *gr = NULL;
    for (int rep = 0; rep < 2 && !c.bad; rep++)
        for (int side = 0; side < 2 && !c.bad; side++) {
            tq_backend *be = G.be[side];
            if (SEQ(be, y1->p[side], dx1->p[side], dw1->p[side], ly1->p[side])) case_fail(&c, side, "(direct)", be->err);
        }
    if (!c.bad) {
        int side = DEV, rc = dv->i->graph_begin(dv), orc = 0;
        if (!rc) {
            orc = SEQ(dv, y2->p[DEV], dx2->p[DEV], dw2->p[DEV], ly2->p[DEV]);
            rc = dv->i->graph_end(dv, orc == 0, &gr);
            if (orc) rc = orc;
        }
        if (rc) case_fail(&c, DEV, "capture", dv->err);
        for (int rep = 0; rep < 2 && !c.bad; rep++)
            if (dv->i->graph_launch(dv, gr)) case_fail(&c, DEV, "graph_launch", dv->err);
        for (int rep = 0; rep < 2 && !c.bad; rep++) {   /* the reference: direct */
            side = REF;
            if (SEQ(G.be[REF], y2->p[REF], dx2->p[REF], dw2->p[REF], ly2->p[REF])) case_fail(&c, REF, "(direct)", G.be[REF]->err);
        }
    }
#undef SEQ
    same_bits(&c, y1, y2, "replayed == direct: y");
    same_bits(&c, dx1, dx2, "replayed == direct: dx");
    same_bits(&c, dw1, dw2, "replayed == direct: dw");
    same_bits(&c, ly1, ly2, "replayed == direct: linear y");
    check(&c, dw2);
    dv->i->graph_free(dv, gr);
    case_end(&c);
}

/* ---- the batch loader ---- */
typedef struct { int n, h, w, c, pad; } lb_shape;
static const lb_shape LBS[] = { { 64, 28, 28, 1, 4 }, { 64, 32, 32, 3, 4 }, { 7, 15, 15, 3, 2 } };

static void load_case(const lb_shape *s, tq_dtype dt, int augment) {
    const int nimg = 100;
    const size_t px = (size_t)s->h * s->w * s->c, nx = (size_t)s->n * px;
    tcase c;
    case_begin(&c, "load_batch", dt, "n %d %dx%dx%d of %d images%s", s->n, s->h, s->w, s->c, nimg,
               augment ? ", crop pad+flip" : ", no augmentation");
    if (augment) snprintf(c.params + strlen(c.params), sizeof c.params - strlen(c.params), " %d", s->pad);
    void *h = xmalloc((size_t)nimg * px);
    for (size_t i = 0; i < (size_t)nimg * px; i++) ((uint8_t *)h)[i] = (uint8_t)irand(256);
    tbuf *images = tb_host(&c, "images", K_U8, (size_t)nimg * px, h);
    for (int i = 0; i < nimg; i++) ((uint8_t *)h)[i] = (uint8_t)irand(10);
    tbuf *lab = tb_host(&c, "lab", K_U8, (size_t)nimg, h);
    free(h);
    int32_t *idx = xmalloc((size_t)s->n * sizeof *idx);
    for (int i = 0; i < s->n; i++) idx[i] = i == 0 ? nimg - 1 : irand(nimg);
    tbuf *idxb = tb_host(&c, "idx", K_I32, (size_t)s->n, idx);
    free(idx);
    tbuf *aug = NULL;
    if (augment) {
        tq_aug *a = xmalloc((size_t)s->n * sizeof *a);
        memset(a, 0, (size_t)s->n * sizeof *a);
        for (int i = 0; i < s->n; i++) {
            a[i].dy = (int16_t)irand(2 * s->pad + 1);
            a[i].dx = (int16_t)irand(2 * s->pad + 1);
            a[i].flip = (uint8_t)irand(2);
        }
        aug = tb_host(&c, "aug", K_U8, (size_t)s->n * sizeof *a, a);
        free(a);
    }
    float mean[4], inv_std[4];                      /* host arrays, passed by value */
    for (int j = 0; j < s->c; j++) { mean[j] = (float)uni(0.2, 0.6); inv_std[j] = (float)uni(2, 5); }
    tbuf *x = tb_out(&c, "x", dt, nx);
    tbuf *labels = tb_out(&c, "labels", K_I32, (size_t)s->n);
    RUN(&c, be->i->load_batch(be, s->n, s->h, s->w, s->c, dt, P(x), P(labels), P(images), P(lab), P(idxb),
                              P(aug), s->pad, mean, inv_std));
    check(&c, x);
    check(&c, labels);
    case_end(&c);
}

/* ---- driver ---- */
static const char *const OPS[] = {
    "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "linear_fwd", "linear_bwd_data",
    "linear_bwd_filter", "bn_fwd_train", "bn_fwd_infer", "bn_norm", "bn_bwd", "relu_fwd", "relu_bwd",
    "add_fwd", "accumulate", "maxpool_fwd", "maxpool_bwd", "avgpool_fwd", "avgpool_bwd",
    "softmax_ce", "softmax_ce_eval", "cast", "unscale_check", "sgd_step", "adamw_step", "load_batch",
    "softmax_ce_dyn", "unscale_check_dyn", "sgd_step_dyn", "adamw_step_dyn", "step_end",
};
#define NELEM(a) (sizeof(a) / sizeof *(a))

static void run_all(void) {
    for (size_t i = 0; i < NELEM(CONVS); i++)
        for (int d = 0; d < 3; d++)
            for (int v = 0; v < 5; v++) conv_case(&CONVS[i], DTS[d], v);
    for (size_t i = 0; i < NELEM(LINS); i++)
        for (int d = 0; d < 3; d++)
            for (int v = 0; v < 5; v++) linear_case(&LINS[i], DTS[d], v);
    for (size_t i = 0; i < NELEM(BNS); i++)
        for (int d = 0; d < 3; d++)
            for (int v = 0; v < 12; v++) bn_case(BNS[i], DTS[d], v);
    for (size_t i = 0; i < NELEM(ELN); i++)
        for (int d = 0; d < 3; d++)
            for (int v = 0; v < 9; v++)
                if (ELN[i] > 1 || (v != 1 && v != 4)) elem_case(ELN[i], DTS[d], v);
    for (size_t i = 0; i < NELEM(MAXPS); i++)
        for (int d = 0; d < 3; d++)
            for (int v = 0; v < 10; v++) maxpool_case(MAXPS[i], DTS[d], v % 5, v / 5);
    for (size_t i = 0; i < NELEM(AVGPS); i++)
        for (int d = 0; d < 3; d++)
            for (int v = 0; v < 3; v++) avgpool_case(AVGPS[i], DTS[d], v);
    for (size_t i = 0; i < NELEM(SMX); i++)
        for (int d = 0; d < 3; d++)
            for (int e = 0; e < 2; e++) softmax_case(SMX[i][0], SMX[i][1], DTS[d], e);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) { cast_case(10, DTS[a], DTS[b]); cast_case(1000003, DTS[a], DTS[b]); }
    for (int p = 0; p < 3; p++) unscale_case(1000003, p);
    unscale_case(1, 0);
    unscale_case(1, 1);
    static const struct { float mom, wd; int nest; } SGD[] = {
        { 0, 0, 0 }, { 0, 5e-4f, 0 }, { 0.9f, 0, 0 }, { 0.9f, 5e-4f, 0 }, { 0.9f, 5e-4f, 1 },
    };
    for (size_t i = 0; i < NELEM(SGD); i++) {
        sgd_case(1000003, SGD[i].mom, SGD[i].wd, SGD[i].nest, -1, -1);
        sgd_case(3, SGD[i].mom, SGD[i].wd, SGD[i].nest, -1, -1);
    }
    for (int sk = 0; sk < 2; sk++) sgd_case(1000003, 0.9f, 5e-4f, 1, sk, -1);
    adamw_case(1000003, 1, 0.01f, -1, -1);
    adamw_case(1000003, 7, 0.0f, -1, -1);
    adamw_case(3, 100, 0.01f, -1, -1);
    for (int sk = 0; sk < 2; sk++) adamw_case(1000003, 7, 0.01f, sk, -1);
    /* with AMP's 16-bit weight copy written in the same pass, a skipped step included */
    for (int d = 1; d < 3; d++)
        for (int sk = -1; sk < 2; sk += 2) {
            sgd_case(1000003, 0.9f, 5e-4f, 1, sk, DTS[d]);
            sgd_case(1000003, 0.0f, 5e-4f, 0, sk, DTS[d]);
            adamw_case(1000003, 7, 0.01f, sk, DTS[d]);
        }
    for (size_t i = 0; i < NELEM(LBS); i++)
        for (int d = 0; d < 3; d++)
            for (int a = 0; a < 2; a++) load_case(&LBS[i], DTS[d], a);
    /* the step on the device (cuda_graphs) */
    for (int d = 0; d < 3; d++) { softmax_dyn_case(64, 10, DTS[d], 2); softmax_dyn_case(3, 1000, DTS[d], 3); }
    for (int p = 0; p < 2; p++) unscale_dyn_case(1000003, p);
    sgd_dyn_case(1000003, 0.0f, -1, -1);
    sgd_dyn_case(1000003, 0.9f, -1, -1);
    sgd_dyn_case(1000003, 0.9f, 1, -1);
    for (int pick = 0; pick < 2; pick++) adamw_dyn_case(1000003, pick, -1, -1);
    adamw_dyn_case(1000003, 1, 1, -1);
    for (int d = 1; d < 3; d++) {
        sgd_dyn_case(1000003, 0.9f, 0, DTS[d]);
        sgd_dyn_case(1000003, 0.9f, 1, DTS[d]);
        adamw_dyn_case(1000003, 1, 0, DTS[d]);
        adamw_dyn_case(1000003, 1, 1, DTS[d]);
    }
    for (int fp16 = 0; fp16 < 2; fp16++)
        for (int flag = 0; flag < 2; flag++) step_end_case(fp16, flag, 1000.1, 2);
    step_end_case(1, 0, 3.4028234663852886e38, 2);   /* growth would pass the largest float */
    fetch_case();
    graph_opt_case();
    for (int d = 0; d < 3; d++) graph_conv_case(DTS[d]);
    busy_case();
}

/* '|' would end a markdown table cell */
static void md_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

static int write_report(const char *path, const char *devname, unsigned long long seed, const char *skip,
                        double secs) {
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "gpu_ops: cannot write %s\n", path); return -1; }
    fprintf(f, "# gpu_ops: %s against the CPU backend\n\n", devname);
    if (skip) {
        fprintf(f, "Skipped: %s\n", skip);
        fclose(f);
        return 0;
    }
    fprintf(f, "seed %llu; %d cases, %zu checks: %zu passed, %zu failed (%.1f s). "
               "err = max|dev − ref| / max(max|ref|, 1e-6); tolerance 1e-4 for f32 cases, 1e-2 for "
               "f16/bf16; NaN/Inf where the reference is finite fails; \"exact\" must match bit for "
               "value. Device outputs poisoned with NaN before each op, accumulated outputs "
               "pre-filled alike on both sides.\n\n",
            seed, G.ncases, G.nrows, G.nrows - G.nfail, G.nfail, secs);
    fprintf(f, "| op | dtype | shape / params | output | max rel. error | tolerance | result |\n");
    fprintf(f, "|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < G.nrows; i++) {
        const row *r = &G.rows[i];
        fprintf(f, "| %s | %s | ", r->op, r->dt);
        md_cell(f, r->params);
        fprintf(f, " | %s | %.2e | %s | %s", r->out, r->err, r->exact ? "exact" : r->tol == 1e-4 ? "1e-4" : "1e-2",
                r->pass ? "PASS" : "**FAIL**");
        if (r->msg[0]) { fputs(": ", f); md_cell(f, r->msg); }
        fputs(" |\n", f);
    }
    if (fclose(f)) { fprintf(stderr, "gpu_ops: cannot write %s\n", path); return -1; }
    return 0;
}

static int usage(FILE *f, int rc) {
    fprintf(f, "usage: gpu_ops [--against cuda|cpu] [--inject OP] [--report FILE] [--seed N] [--verbose]\n"
               "  checks every op of the device backend (CUDA ordinal 0, or a second CPU backend with\n"
               "  --against cpu) against the CPU backend on random inputs; exit 0 all pass, 1 a check\n"
               "  failed, 2 usage, 77 no device. --inject OP corrupts one element of OP's device output.\n");
    return rc;
}

int main(int argc, char **argv) {
    const char *against = "cuda", *report = NULL;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
        if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) { G.verbose = 1; continue; }
        if (strcmp(a, "--against") && strcmp(a, "--inject") && strcmp(a, "--report") && strcmp(a, "--seed")) {
            fprintf(stderr, "gpu_ops: unknown argument %s\n", a);
            return usage(stderr, 2);
        }
        if (!val) { fprintf(stderr, "gpu_ops: %s needs a value\n", a); return usage(stderr, 2); }
        i++;
        if (!strcmp(a, "--against")) {
            if (strcmp(val, "cuda") && strcmp(val, "cpu")) {
                fprintf(stderr, "gpu_ops: --against takes cuda or cpu, not %s\n", val);
                return usage(stderr, 2);
            }
            against = val;
        } else if (!strcmp(a, "--inject")) {
            size_t k = 0;
            while (k < NELEM(OPS) && strcmp(OPS[k], val)) k++;
            if (k == NELEM(OPS)) {
                fprintf(stderr, "gpu_ops: --inject: no op %s (one of:", val);
                for (k = 0; k < NELEM(OPS); k++) fprintf(stderr, " %s", OPS[k]);
                fprintf(stderr, ")\n");
                return 2;
            }
            G.inject = val;
        } else if (!strcmp(a, "--report")) {
            report = val;
        } else {
            char *end;
            seed = strtoull(val, &end, 10);
            if (!*val || *end) { fprintf(stderr, "gpu_ops: --seed takes a number, not %s\n", val); return usage(stderr, 2); }
        }
    }
    rng_state = seed;

    G.be[REF] = tq_cpu_backend_new(0);
    if (!G.be[REF]) { fprintf(stderr, "gpu_ops: cannot create the CPU backend\n"); return 1; }
    char why[256] = "", devname[160];
    if (!strcmp(against, "cpu")) {
        G.be[DEV] = tq_cpu_backend_new(0);
        snprintf(devname, sizeof devname, "cpu (a second CPU backend, %d threads)", G.be[REF]->threads);
    } else {
        G.be[DEV] = tq_cuda_backend_new(0, 0, 1, why, sizeof why);
        const char *gpu = G.be[DEV] ? tq_cuda_backend_name(G.be[DEV]) : NULL;
        snprintf(devname, sizeof devname, "cuda:0 (%s)", gpu ? gpu : "?");
    }
    if (!G.be[DEV]) {
        printf("gpu_ops: skipped, no device: %s\n", why[0] ? why : "the device backend could not be created");
        if (report) write_report(report, "cuda:0", seed, why, 0);
        tq_backend_free(G.be[REF]);
        return 77;
    }

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_all();
    for (int s = 0; s < 2; s++) {             /* every alloc was matched by a free */
        tcase c;
        case_begin(&c, "alloc/free", TQ_F32, "bytes_live after all cases");
        size_t live = G.be[s]->bytes_live;
        add_row(&c, s == REF ? "reference" : "device", live ? INFINITY : 0.0, 0.0, 1, live == 0,
                "%zu bytes live", live);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);

    int rc = G.nfail ? 1 : 0;
    if (report && write_report(report, devname, seed, NULL, secs)) rc = 1;
    printf("gpu_ops: device %s against the CPU backend, seed %llu%s%s\n", devname, seed,
           G.inject ? ", injecting into " : "", G.inject ? G.inject : "");
    printf("gpu_ops: worst error f32 %.1e (tol 1e-4), f16 %.1e (tol 1e-2), bf16 %.1e (tol 1e-2)\n",
           G.worst[TQ_F32], G.worst[TQ_F16], G.worst[TQ_BF16]);
    printf("gpu_ops: worst f32 case: %s\n", G.worst_at[TQ_F32][0] ? G.worst_at[TQ_F32] : "none (every f32 check exact)");
    if (report) printf("gpu_ops: report: %s\n", report);
    printf("gpu_ops: %s: %d cases, %zu checks, %zu failed (%d cases), %.1f s\n", rc ? "FAIL" : "PASS",
           G.ncases, G.nrows, G.nfail, G.nfailcases, secs);
    free(G.rows);
    tq_backend_free(G.be[DEV]);
    tq_backend_free(G.be[REF]);
    return rc;
}
