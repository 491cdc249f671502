/* cpu_conv.c — convolution (im2col + SGEMM) and linear (a 1×1 convolution over N×1×1 images).
 *
 * f32 and bf16 convolutions run through oneDNN (cpu_dnnl.c) when it has primitives for the
 * descriptor; conv_ws then counts oneDNN's workspace for those ops. Everything below is the
 * path for f16, linear layers, and any descriptor oneDNN does not take (or TQ_CPU_DNNL=0).
 *
 * Shapes: x [N][H][W][C], w [K][R][S][C] (= [K][RSC]), y [N][P][Q][K].
 *   fwd:         Y[NPQ][K]   = cols[NPQ][RSC] · W[K][RSC]^T (+ bias)
 *   bwd_data:    stride 1 (pad <= R−1, S−1): the forward convolution of dY with the flipped,
 *                channel-transposed kernel W' (see use_tr), dX[NHW][C] = cols(dY)[NHW][RSK] ·
 *                W'[C][RSK]^T with beta through the GEMM. Otherwise dcols[NPQ][RSC] =
 *                dY[NPQ][K] · W[K][RSC], then col2im (gathered per input row, so images/rows
 *                are independent and the adds happen in a fixed order)
 *   bwd_filter:  dW[K][RSC] += dY^T · cols,  db[k] += Σ dy[.][k]
 * Images go in chunks of nb so that the scratch stays bounded (at least one image); f32 1×1
 * stride-1 pad-0 convolutions use x/dx directly (no im2col, no workspace). f16/bf16: w and dy
 * are staged in f32, im2col converts x, outputs are staged in f32 and rounded once on store.
 *
 * Threading. OpenBLAS runs single-threaded (cpu_backend.c pins it): GEMMs are split by our
 * OpenMP threads, so only one pool of threads exists (OpenBLAS's pthread pool next to a spinning
 * OpenMP team on the same cores was measured 25x slower). Two modes:
 *  - image-parallel (threads > 1, N > 1, not the direct path): each thread runs im2col, GEMM
 *    and col2im on whole chunks of images in its own workspace slice t, with no barrier: one
 *    join per op. On a shared machine every barrier waits for a descheduled peer; per-chunk
 *    barriers were measured up to 100x slower under load. fwd and bwd_data hand out the
 *    (fixed) chunks dynamically, so a running thread takes a stalled one's work; the result
 *    does not depend on who computed a chunk. bwd_filter partitions images statically (thread
 *    t: [N·t/T, N·(t+1)/T)): thread 0 accumulates into dw, thread t > 0 into its partial dW,
 *    added to dw in thread order at the end, so the sum is reproducible for a thread count.
 *  - team per chunk (N == 1, one thread, or the direct path): the team splits a chunk's rows
 *    (fwd, bwd_data GEMM), input rows (col2im) or dW columns (bwd_filter).
 *
 * Workspace (floats, every section rounded up to 16 floats = 64 bytes):
 *   [wf: f32 copy of w — 16-bit fwd/bwd_data]  T × slice{cols | yf/dyf (16-bit) | dxf (16-bit
 *   bwd_data)}  [T−1 partial dW — bwd_filter, image-parallel]
 *   stride-1 bwd_data instead: W' (f32, every dtype)  T × slice{cols of dY | dxf (16-bit)}
 * conv_ws returns the maximum over the three ops, computed by the same layout() the ops use;
 * it depends on be->threads.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <omp.h>

#include "cpu/cpu_internal.h"

#ifndef CHUNK_FLOATS
#define CHUNK_FLOATS ((size_t)1 << 19)   /* scratch per chunk of a team, floats (2 MiB) */
#endif
#ifndef THREAD_CHUNK_FLOATS
#define THREAD_CHUNK_FLOATS ((size_t)1 << 18)   /* scratch per chunk of one thread (1 MiB) */
#endif

enum { OP_FWD, OP_BWD_DATA, OP_BWD_FILTER };

typedef struct {
    int n, h, w, c, k, r, s, st, pad, p, q;
    int padh, padw;                 /* im2col padding (pad, except for the transposed geometry) */
    size_t rsc, pq, hwc;
    int direct;                     /* 1×1, stride 1, pad 0 */
} cgeom;

typedef struct {
    int T;                  /* workspace slices (threads, image-parallel mode), else 1 */
    int tr;                 /* bwd_data as a forward convolution of dy (stride 1) */
    int img_par;            /* image-parallel mode */
    int nb;                 /* images per chunk (per thread's chunk in image-parallel mode) */
    size_t wf;              /* 16-bit fwd/bwd_data: f32 copy of w */
    size_t slice0, slice;   /* slice t starts at slice0 + t·slice */
    size_t a, b, d;         /* within a slice: cols/dcols, yf/dyf, dxf */
    size_t pw;              /* bwd_filter, image-parallel: T−1 partial dW of up16(K·RSC) */
    size_t bytes;
} clayout;

static int geom(tq_backend *be, const char *op, const tq_conv_desc *d, tq_dtype dt, cgeom *g) {
    if (!d || !tq_cpu_dt_ok(dt)) {
        tq_backend_seterr(be, "%s: bad descriptor or dtype", op);
        return TQ_EINVAL;
    }
    g->n = d->x.n; g->h = d->x.h; g->w = d->x.w; g->c = d->x.c;
    g->k = d->k; g->r = d->r; g->s = d->s; g->st = d->stride; g->pad = d->pad;
    if (g->n <= 0 || g->h <= 0 || g->w <= 0 || g->c <= 0 || g->k <= 0 || g->r <= 0 || g->s <= 0 ||
        g->st <= 0 || g->pad < 0 || g->h + 2 * g->pad < g->r || g->w + 2 * g->pad < g->s) {
        tq_backend_seterr(be, "%s: bad conv x=(%d,%d,%d,%d) k=%d r=%d s=%d stride=%d pad=%d", op,
                          g->n, g->h, g->w, g->c, g->k, g->r, g->s, g->st, g->pad);
        return TQ_EINVAL;
    }
    g->p = tq_conv_out(g->h, g->r, g->st, g->pad);
    g->q = tq_conv_out(g->w, g->s, g->st, g->pad);
    g->rsc = (size_t)g->r * g->s * g->c;
    g->pq = (size_t)g->p * g->q;
    g->hwc = (size_t)g->h * g->w * g->c;
    g->padh = g->padw = g->pad;
    g->direct = g->r == 1 && g->s == 1 && g->st == 1 && g->pad == 0;
    if (g->rsc > INT_MAX || (size_t)g->n * g->pq > INT_MAX) {
        tq_backend_seterr(be, "%s: conv too large for 32-bit GEMM sizes", op);
        return TQ_EINVAL;
    }
    return TQ_OK;
}

static size_t up16(size_t f) { return (f + 15) / 16 * 16; }
static int wino_use(tq_backend *be, const tq_conv_desc *d, tq_dtype dt);
static int wino_few(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int op);
static int thin_use(tq_backend *be, const tq_conv_desc *d, int op);
static int cx_tile(tq_backend *be, int op);

/* bwd_data of a stride-1 convolution (pad <= R−1, S−1) is the forward convolution of dy with
 * the flipped, channel-transposed kernel W'[c][r][s][k] = W[k][R−1−r][S−1−s][c] and padding
 * (R−1−pad, S−1−pad): an im2col gather plus one GEMM instead of the col2im scatter. The f32
 * direct (1×1) path keeps writing dx straight from the GEMM. */
static int use_tr(const cgeom *g, tq_dtype dt) {
    return g->st == 1 && g->pad <= g->r - 1 && g->pad <= g->s - 1 &&
           !(dt == TQ_F32 && g->direct);
}

/* the geometry of that forward convolution: input dy [N][P][Q][K], output dx [N][H][W][C] */
static void tr_geom(const cgeom *g, cgeom *t) {
    *t = *g;
    t->h = g->p; t->w = g->q; t->c = g->k; t->k = g->c;
    t->st = 1; t->pad = -1; t->padh = g->r - 1 - g->pad; t->padw = g->s - 1 - g->pad;
    t->p = g->h; t->q = g->w;
    t->rsc = (size_t)g->r * g->s * g->k;
    t->pq = (size_t)g->h * g->w;
    t->hwc = (size_t)g->p * g->q * g->k;
    t->direct = 0;
}

static void layout(const cgeom *g, tq_dtype dt, int op, int nt, clayout *L) {
    int lo = dt != TQ_F32;
    memset(L, 0, sizeof *L);
    L->T = 1;
    L->nb = g->n;
    if (op == OP_BWD_DATA && use_tr(g, dt)) {
        /* W' (any dtype) | T × slice{cols of dy [HW][RSK] | dxf (16-bit)} */
        cgeom t;
        tr_geom(g, &t);
        L->tr = 1;
        size_t per = t.pq * t.rsc + (lo ? g->hwc : 0);
        L->img_par = nt > 1 && g->n > 1;
        if (L->img_par) L->T = nt < g->n ? nt : g->n;
        size_t cap = ((size_t)g->n + L->T - 1) / L->T;
        size_t nb = (L->img_par ? THREAD_CHUNK_FLOATS : CHUNK_FLOATS) / per;
        if (nb < 1) nb = 1;
        if (nb > cap) nb = cap;
        L->nb = (int)nb;
        size_t colsz = up16(nb * t.pq * t.rsc), dsz = lo ? up16(nb * g->hwc) : 0;
        L->wf = 0;
        L->slice0 = up16((size_t)g->k * g->rsc);
        L->a = 0; L->b = colsz; L->d = colsz;
        L->slice = colsz + dsz;
        L->bytes = (L->slice0 + (size_t)L->T * L->slice) * sizeof(float);
        return;
    }
    if (!lo && g->direct) return;
    size_t per = g->pq * g->rsc;                                   /* cols / dcols */
    if (lo) per += g->pq * (size_t)g->k;                           /* yf / dyf */
    if (lo && op == OP_BWD_DATA) per += g->hwc;                    /* dxf */
    L->img_par = nt > 1 && g->n > 1;
    if (L->img_par) L->T = nt < g->n ? nt : g->n;
    size_t cap = ((size_t)g->n + L->T - 1) / L->T;
    size_t nb = (L->img_par ? THREAD_CHUNK_FLOATS : CHUNK_FLOATS) / per;
    if (nb < 1) nb = 1;
    if (nb > cap) nb = cap;
    L->nb = (int)nb;
    size_t colsz = up16(nb * g->pq * g->rsc);
    size_t ysz = lo ? up16(nb * g->pq * (size_t)g->k) : 0;
    size_t dsz = lo && op == OP_BWD_DATA ? up16(nb * g->hwc) : 0;
    size_t wsz = up16((size_t)g->k * g->rsc), f = 0;
    if (lo && op != OP_BWD_FILTER) { L->wf = 0; f = wsz; }
    L->slice0 = f;
    L->a = 0; L->b = colsz; L->d = colsz + ysz;
    L->slice = colsz + ysz + dsz;
    f += (size_t)L->T * L->slice;
    if (op == OP_BWD_FILTER && L->T > 1) { L->pw = f; f += (size_t)(L->T - 1) * wsz; }
    L->bytes = f * sizeof(float);
}

/* the maximum over the three ops: oneDNN's requirement for each op it runs (lin: the linear
 * layer's inner products, else the convolution's), the im2col layout's for the others */
static size_t conv_ws_impl(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int lin) {
    cgeom g;
    if (geom(be, "conv_ws", d, dt, &g)) return 0;
    size_t m = 0;
    for (int op = OP_FWD; op <= OP_BWD_FILTER; op++) {
        size_t b;
        if (!lin && wino_use(be, d, dt)) {
            b = tq_cpu_wino_ws(d, op, tq_cpu_nt(be), cx_tile(be, op));
            if (b > m) m = b;
            if (!wino_few(be, d, dt, op)) continue;   /* else oneDNN's too: wino_few */
        }
        if (!lin && thin_use(be, d, op)) {
            b = tq_cpu_thin_ws(d, op, tq_cpu_nt(be));
            if (b > m) m = b;
            continue;
        }
        int dn = lin ? tq_dnnl_linear_need(be, d, dt, op, &b)
                     : tq_dnnl_conv_need(be, d, dt, op, &b);
        if (!dn) {
            clayout L;
            layout(&g, dt, op, tq_cpu_nt(be), &L);
            b = L.bytes;
        }
        if (b > m) m = b;
    }
    return m;
}

size_t tq_cpu_conv_ws(tq_backend *be, const tq_conv_desc *d, tq_dtype dt) {
    return conv_ws_impl(be, d, dt, 0);
}

static int get_layout(tq_backend *be, const char *opname, const tq_conv_desc *d, tq_dtype dt,
                      int op, size_t ws_bytes, const void *ws, cgeom *g, clayout *L) {
    int rc = geom(be, opname, d, dt, g);
    if (rc) return rc;
    layout(g, dt, op, tq_cpu_nt(be), L);
    if (ws_bytes < L->bytes || (L->bytes && !ws)) {
        tq_backend_seterr(be, "%s: workspace too small (%zu < %zu bytes)", opname, ws_bytes,
                          L->bytes);
        return TQ_EINVAL;
    }
    return TQ_OK;
}

/* ---- conversions and the im2col / col2im passes ---- */

TQ_ALWAYS_INLINE void cvt_to_f32(tq_dtype dt, float *dst, const void *src, size_t i0, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) dst[i] = tq_ld(src, dt, i0 + i);
}

/* cols rows [t0, t1) of the chunk starting at image n0 (row t = output pixel (i, p, q)). */
TQ_ALWAYS_INLINE void im2col_rows(tq_dtype dt, const cgeom *g, const void *x, int n0, size_t t0,
                                  size_t t1, float *cols) {
    const int C = g->c, S = g->s;
    for (size_t t = t0; t < t1; t++) {
        size_t i = t / g->pq, pq = t % g->pq;
        int p = (int)(pq / g->q), q = (int)(pq % g->q);
        float *dst = cols + t * g->rsc;
        int iw0 = q * g->st - g->padw;
        int s_lo = iw0 < 0 ? -iw0 : 0, s_hi = g->w - iw0 < S ? g->w - iw0 : S;
        for (int r = 0; r < g->r; r++, dst += (size_t)S * C) {
            int ih = p * g->st - g->padh + r;
            if (ih < 0 || ih >= g->h || s_hi <= s_lo) {
                memset(dst, 0, (size_t)S * C * sizeof(float));
                continue;
            }
            if (s_lo > 0) memset(dst, 0, (size_t)s_lo * C * sizeof(float));
            size_t src = ((size_t)n0 + i) * g->hwc + ((size_t)ih * g->w + iw0 + s_lo) * C;
            size_t len = (size_t)(s_hi - s_lo) * C;
            if (dt == TQ_F32) memcpy(dst + (size_t)s_lo * C, (const float *)x + src, len * 4);
            else cvt_to_f32(dt, dst + (size_t)s_lo * C, x, src, len);
            if (s_hi < S) memset(dst + (size_t)s_hi * C, 0, (size_t)(S - s_hi) * C * sizeof(float));
        }
    }
}

/* im2col of rows [t0, t1): f32 copies inline; the 16-bit conversions, most of a 16-bit
 * im2col's work (each input element is converted once per kernel tap), are built for AVX-512
 * and AVX2 too, the one that runs picked when the program loads (as cpu_bn.c's norm pass).
 * Conversions are integer arithmetic: the same bits on every machine. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void im2col_lo(tq_dtype dt, const cgeom *g, const void *x, int n0, size_t t0, size_t t1,
                      float *cols) {
    if (dt == TQ_F16) im2col_rows(TQ_F16, g, x, n0, t0, t1, cols);
    else im2col_rows(TQ_BF16, g, x, n0, t0, t1, cols);
}
static void im2col(tq_dtype dt, const cgeom *g, const void *x, int n0, size_t t0, size_t t1,
                   float *cols) {
    if (dt == TQ_F32) im2col_rows(TQ_F32, g, x, n0, t0, t1, cols);
    else im2col_lo(dt, g, x, n0, t0, t1, cols);
}

/* col2im for input row ih of chunk image i: acc (W·C floats, first prepared from beta) +=
 * every dcols entry that maps to it, in a fixed order. */
static void col2im_row(const cgeom *g, const float *dcols, int i, int ih, float *acc) {
    const int C = g->c, S = g->s;
    for (int r = 0; r < g->r; r++) {
        int t = ih + g->pad - r;
        if (t < 0 || t % g->st) continue;
        int p = t / g->st;
        if (p >= g->p) continue;
        for (int q = 0; q < g->q; q++) {
            int iw0 = q * g->st - g->pad;
            int s_lo = iw0 < 0 ? -iw0 : 0, s_hi = g->w - iw0 < S ? g->w - iw0 : S;
            if (s_hi <= s_lo) continue;
            const float *src = dcols + ((size_t)i * g->pq + (size_t)p * g->q + q) * g->rsc +
                               ((size_t)r * S + s_lo) * C;
            float *dst = acc + (size_t)(iw0 + s_lo) * C;
            size_t len = (size_t)(s_hi - s_lo) * C;
            for (size_t j = 0; j < len; j++) dst[j] += src[j];
        }
    }
}

TQ_ALWAYS_INLINE void mix_store(tq_dtype dt, void *dx, size_t i0, const float *acc, size_t n,
                                float beta) {
    if (beta == 0.0f) {
#pragma omp simd
        for (size_t j = 0; j < n; j++) tq_st(dx, dt, i0 + j, acc[j]);
    } else {
#pragma omp simd
        for (size_t j = 0; j < n; j++) tq_st(dx, dt, i0 + j, beta * tq_ld(dx, dt, i0 + j) + acc[j]);
    }
}

/* mix_store for a 16-bit dt (beta 0: a plain rounding store), its conversions built for
 * AVX-512 and AVX2 too (as im2col_lo) */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void mix_store_lo(tq_dtype dt, void *dx, size_t i0, const float *acc, size_t n,
                         float beta) {
    if (dt == TQ_F16) mix_store(TQ_F16, dx, i0, acc, n, beta);
    else mix_store(TQ_BF16, dx, i0, acc, n, beta);
}

/* Input rows [u0, u1) (u = i·H + ih) of the chunk at image n0: dx = beta·dx + col2im(dcols).
 * f32 accumulates in dx itself; 16-bit accumulates in stage (nb·HWC floats), rounds once. */
static void col2im_rows(tq_dtype dt, const cgeom *g, const float *dcols, int n0, size_t u0,
                        size_t u1, void *dx, float beta, float *stage) {
    size_t wc = (size_t)g->w * g->c;
    for (size_t u = u0; u < u1; u++) {
        int i = (int)(u / g->h), ih = (int)(u % g->h);
        size_t off = (size_t)n0 * g->hwc + u * wc;
        if (dt == TQ_F32) {
            float *acc = (float *)dx + off;
            if (beta == 0.0f) memset(acc, 0, wc * sizeof(float));
            else if (beta != 1.0f) for (size_t j = 0; j < wc; j++) acc[j] *= beta;
            col2im_row(g, dcols, i, ih, acc);
        } else {
            float *acc = stage + u * wc;
            memset(acc, 0, wc * sizeof(float));
            col2im_row(g, dcols, i, ih, acc);
            mix_store_lo(dt, dx, off, acc, wc, beta);
        }
    }
}

/* ---- threading: one OpenMP team per chunk; each thread runs single-threaded OpenBLAS on its
 * share (rows for fwd / bwd_data, columns of dW for bwd_filter). ---- */

static void share(size_t n, size_t align, size_t *a, size_t *b) {
    int T = omp_get_num_threads(), t = omp_get_thread_num();
    size_t units = (n + align - 1) / align;
    *a = units * t / T * align;
    *b = units * (t + 1) / T * align;
    if (*a > n) *a = n;
    if (*b > n) *b = n;
}

/* threads for `flops` of work, at most cap */
static int team(tq_backend *be, double flops, int cap) {
    int nt = tq_cpu_nt(be);
    if (flops < 2e6) return 1;
    return nt < cap ? nt : cap;
}

/* this thread's images in image-parallel mode */
static void my_images(int n, int *i0, int *i1) {
    int T = omp_get_num_threads(), t = omp_get_thread_num();
    *i0 = (int)((long long)n * t / T);
    *i1 = (int)((long long)n * (t + 1) / T);
}

/* ---- fwd ---- */

/* Rows [t0, t1) of the chunk at image n0. cols: the chunk's cols (x itself on the direct
 * path); Y: the chunk's f32 output rows (y itself for f32). */
static void fwd_part(const cgeom *g, tq_dtype dt, int direct, const void *x, const float *W,
                     const float *bias, void *y, float *cols, float *Y, int n0, size_t t0,
                     size_t t1) {
    const int K = g->k, RSC = (int)g->rsc;
    if (t1 <= t0) return;
    if (!direct) im2col(dt, g, x, n0, t0, t1, cols);
    if (bias)
        for (size_t t = t0; t < t1; t++) memcpy(Y + t * K, bias, (size_t)K * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(t1 - t0), K, RSC, 1.0f,
                cols + t0 * RSC, RSC, W, RSC, bias ? 1.0f : 0.0f, Y + t0 * K, K);
    if (dt != TQ_F32)
        mix_store_lo(dt, y, (size_t)n0 * g->pq * K + t0 * K, Y + t0 * K, (t1 - t0) * K, 0.0f);
}

static int conv_fwd_impl(tq_backend *be, const char *nm, const tq_conv_desc *d, tq_dtype dt,
                         void *y, const void *x, const void *w, const float *bias, void *ws,
                         size_t ws_bytes) {
    cgeom g; clayout L;
    int rc = get_layout(be, nm, d, dt, OP_FWD, ws_bytes, ws, &g, &L);
    if (rc) return rc;
    const int K = g.k, direct = dt == TQ_F32 && g.direct;
    float *wsf = ws;
    const float *W = dt == TQ_F32 ? (const float *)w : wsf + L.wf;
    if (dt != TQ_F32) tq_cpu_cast(be, (size_t)K * g.rsc, TQ_F32, wsf + L.wf, dt, w);
    double flops = 2.0 * g.n * g.pq * K * g.rsc;
    if (L.img_par) {
#pragma omp parallel num_threads(team(be, flops, L.T))
        {
            float *sl = wsf + L.slice0 + (size_t)omp_get_thread_num() * L.slice;
            int nch = (g.n + L.nb - 1) / L.nb;
#pragma omp for schedule(dynamic, 1)
            for (int ch = 0; ch < nch; ch++) {
                int n0 = ch * L.nb, nb = g.n - n0 < L.nb ? g.n - n0 : L.nb;
                float *Y = dt == TQ_F32 ? (float *)y + (size_t)n0 * g.pq * K : sl + L.b;
                fwd_part(&g, dt, 0, x, W, bias, y, sl + L.a, Y, n0, 0, (size_t)nb * g.pq);
            }
        }
        return TQ_OK;
    }
    for (int n0 = 0; n0 < g.n; n0 += L.nb) {
        int nb = g.n - n0 < L.nb ? g.n - n0 : L.nb;
        size_t rows = (size_t)nb * g.pq;
        float *cols = direct ? (float *)x + (size_t)n0 * g.hwc : wsf + L.slice0 + L.a;
        float *Y = dt == TQ_F32 ? (float *)y + (size_t)n0 * g.pq * K : wsf + L.slice0 + L.b;
#pragma omp parallel num_threads(team(be, flops * nb / g.n, INT_MAX))
        {
            size_t t0, t1;
            share(rows, 4, &t0, &t1);
            fwd_part(&g, dt, direct, x, W, bias, y, cols, Y, n0, t0, t1);
        }
    }
    return TQ_OK;
}

/* ---- bwd_data ---- */

/* Wt[c][r][s][k] = W[k][R−1−r][S−1−s][c] as f32 */
TQ_ALWAYS_INLINE void flip_w(tq_dtype dt, const cgeom *g, float *Wt, const void *w) {
    const int K = g->k, R = g->r, S = g->s, C = g->c;
    const size_t rsk = (size_t)R * S * K;
    for (int k = 0; k < K; k++)
        for (int r = 0; r < R; r++)
            for (int s = 0; s < S; s++) {
                size_t src = (((size_t)k * R + r) * S + s) * C;
                float *dst = Wt + ((size_t)(R - 1 - r) * S + (S - 1 - s)) * K + k;
                for (int c = 0; c < C; c++) dst[(size_t)c * rsk] = tq_ld(w, dt, src + c);
            }
}

/* Transposed path, dx rows [t0, t1) (t = input pixel of the chunk at n0): gather dy, one GEMM;
 * f32 accumulates into dx through the GEMM's beta, 16-bit goes through DX and rounds once.
 * kc: Wt is W itself as f32, [K][C] (a 1×1 kernel: the flip is only a transpose, which the
 * GEMM does instead). */
static void bwdd_tr_part(const cgeom *t, tq_dtype dt, const void *dy, const float *Wt, int kc,
                         void *dx, float beta, float *cols, float *DX, int n0, size_t t0, size_t t1) {
    const int C = t->k, RSK = (int)t->rsc;
    if (t1 <= t0) return;
    im2col(dt, t, dy, n0, t0, t1, cols);
    size_t o = (size_t)n0 * t->pq * C + t0 * C;
    CBLAS_TRANSPOSE tb = kc ? CblasNoTrans : CblasTrans;
    int ldb = kc ? C : RSK;
    if (dt == TQ_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, (int)(t1 - t0), C, RSK, 1.0f,
                    cols + t0 * RSK, RSK, Wt, ldb, beta, (float *)dx + o, C);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, (int)(t1 - t0), C, RSK, 1.0f,
                    cols + t0 * RSK, RSK, Wt, ldb, 0.0f, DX + t0 * C, C);
        mix_store_lo(dt, dx, o, DX + t0 * C, (t1 - t0) * C, beta);
    }
}

static void bwdd_tr(tq_backend *be, const cgeom *g, const clayout *L, tq_dtype dt, void *dx,
                    float beta, const void *dy, const void *w, float *wsf) {
    cgeom t;
    tr_geom(g, &t);
    float *Wt = wsf + L->wf;
    int kc = g->r == 1 && g->s == 1;
    if (kc) tq_cpu_cast(be, (size_t)g->k * g->c, TQ_F32, Wt, dt, w);
    else TQ_DT_CALL(dt, flip_w, g, Wt, w);
    double flops = 2.0 * g->n * g->pq * g->k * g->rsc;
    if (L->img_par) {
#pragma omp parallel num_threads(team(be, flops, L->T))
        {
            float *sl = wsf + L->slice0 + (size_t)omp_get_thread_num() * L->slice;
            int nch = (g->n + L->nb - 1) / L->nb;
#pragma omp for schedule(dynamic, 1)
            for (int ch = 0; ch < nch; ch++) {
                int n0 = ch * L->nb, nb = g->n - n0 < L->nb ? g->n - n0 : L->nb;
                bwdd_tr_part(&t, dt, dy, Wt, kc, dx, beta, sl + L->a, sl + L->d, n0, 0,
                             (size_t)nb * t.pq);
            }
        }
        return;
    }
    for (int n0 = 0; n0 < g->n; n0 += L->nb) {
        int nb = g->n - n0 < L->nb ? g->n - n0 : L->nb;
        float *sl = wsf + L->slice0;
#pragma omp parallel num_threads(team(be, flops * nb / g->n, INT_MAX))
        {
            size_t t0, t1;
            share((size_t)nb * t.pq, 4, &t0, &t1);
            bwdd_tr_part(&t, dt, dy, Wt, kc, dx, beta, sl + L->a, sl + L->d, n0, t0, t1);
        }
    }
}

/* dcols rows [t0, t1) of the chunk at n0 = dY·W (16-bit dy converted into DY first). The
 * direct path writes dx itself, with beta. */
static void bwdd_gemm(const cgeom *g, tq_dtype dt, int direct, const void *dy, const float *W,
                      float *DY, float *dcols, float beta, int n0, size_t t0, size_t t1) {
    const int K = g->k, RSC = (int)g->rsc;
    if (t1 <= t0) return;
    if (dt != TQ_F32)
        TQ_DT_CALL(dt, cvt_to_f32, DY + t0 * K, dy, (size_t)n0 * g->pq * K + t0 * K,
                   (t1 - t0) * K);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(t1 - t0), RSC, K, 1.0f,
                DY + t0 * K, K, W, RSC, direct ? beta : 0.0f, dcols + t0 * RSC, RSC);
}

static int conv_bwd_data_impl(tq_backend *be, const char *nm, const tq_conv_desc *d,
                              tq_dtype dt, void *dx, float beta, const void *dy, const void *w,
                              void *ws, size_t ws_bytes) {
    cgeom g; clayout L;
    int rc = get_layout(be, nm, d, dt, OP_BWD_DATA, ws_bytes, ws, &g, &L);
    if (rc) return rc;
    if (L.tr) {
        bwdd_tr(be, &g, &L, dt, dx, beta, dy, w, ws);
        return TQ_OK;
    }
    const int K = g.k, direct = dt == TQ_F32 && g.direct;
    float *wsf = ws;
    const float *W = dt == TQ_F32 ? (const float *)w : wsf + L.wf;
    if (dt != TQ_F32) tq_cpu_cast(be, (size_t)K * g.rsc, TQ_F32, wsf + L.wf, dt, w);
    double flops = 2.0 * g.n * g.pq * K * g.rsc;
    if (L.img_par) {
#pragma omp parallel num_threads(team(be, flops, L.T))
        {
            float *sl = wsf + L.slice0 + (size_t)omp_get_thread_num() * L.slice;
            int nch = (g.n + L.nb - 1) / L.nb;
#pragma omp for schedule(dynamic, 1)
            for (int ch = 0; ch < nch; ch++) {
                int n0 = ch * L.nb, nb = g.n - n0 < L.nb ? g.n - n0 : L.nb;
                float *DY = dt == TQ_F32 ? (float *)dy + (size_t)n0 * g.pq * K : sl + L.b;
                bwdd_gemm(&g, dt, 0, dy, W, DY, sl + L.a, beta, n0, 0, (size_t)nb * g.pq);
                col2im_rows(dt, &g, sl + L.a, n0, 0, (size_t)nb * g.h, dx, beta, sl + L.d);
            }
        }
        return TQ_OK;
    }
    for (int n0 = 0; n0 < g.n; n0 += L.nb) {
        int nb = g.n - n0 < L.nb ? g.n - n0 : L.nb;
        size_t rows = (size_t)nb * g.pq;
        float *dcols = direct ? (float *)dx + (size_t)n0 * g.hwc : wsf + L.slice0 + L.a;
        float *DY = dt == TQ_F32 ? (float *)dy + (size_t)n0 * g.pq * K : wsf + L.slice0 + L.b;
#pragma omp parallel num_threads(team(be, flops * nb / g.n, INT_MAX))
        {
            size_t t0, t1;
            share(rows, 4, &t0, &t1);
            bwdd_gemm(&g, dt, direct, dy, W, DY, dcols, beta, n0, t0, t1);
            if (!direct) {
#pragma omp barrier
                share((size_t)nb * g.h, 1, &t0, &t1);
                col2im_rows(dt, &g, dcols, n0, t0, t1, dx, beta, wsf + L.slice0 + L.d);
            }
        }
    }
    return TQ_OK;
}

/* ---- bwd_filter ---- */

/* cols and (16-bit) DY rows [t0, t1) of the chunk at n0 */
static void bwdf_prep(const cgeom *g, tq_dtype dt, const void *x, const void *dy, float *cols,
                      float *DY, int n0, size_t t0, size_t t1) {
    const int K = g->k;
    if (t1 <= t0) return;
    im2col(dt, g, x, n0, t0, t1, cols);
    if (dt != TQ_F32)
        TQ_DT_CALL(dt, cvt_to_f32, DY + t0 * K, dy, (size_t)n0 * g->pq * K + t0 * K,
                   (t1 - t0) * K);
}

/* target[:, j0:j1] = beta·target + DY^T · cols[:, j0:j1] over `rows` rows */
static void bwdf_gemm(const cgeom *g, size_t rows, const float *DY, const float *cols,
                      float *target, size_t j0, size_t j1, float beta) {
    const int K = g->k, RSC = (int)g->rsc;
    if (j1 <= j0 || rows == 0) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, (int)(j1 - j0), (int)rows, 1.0f, DY,
                K, cols + j0, RSC, beta, target + j0, RSC);
}

static int conv_bwd_filter_impl(tq_backend *be, const char *nm, const tq_conv_desc *d,
                                tq_dtype dt, float *dw, float *db, const void *x, const void *dy,
                                void *ws, size_t ws_bytes) {
    cgeom g; clayout L;
    int rc = get_layout(be, nm, d, dt, OP_BWD_FILTER, ws_bytes, ws, &g, &L);
    if (rc) return rc;
    const int K = g.k, direct = dt == TQ_F32 && g.direct;
    float *wsf = ws;
    if (db) tq_cpu_bias_grad(be, (size_t)g.n * g.pq, K, dt, dy, db);
    if (!dw) return TQ_OK;
    double flops = 2.0 * g.n * g.pq * K * g.rsc;
    size_t nwk = (size_t)K * g.rsc, wsz = up16(nwk);
    if (L.img_par) {
#pragma omp parallel num_threads(team(be, flops, L.T))
        {
            int i0, i1, t = omp_get_thread_num(), T = omp_get_num_threads();
            my_images(g.n, &i0, &i1);
            float *sl = wsf + L.slice0 + (size_t)t * L.slice;
            float *target = t == 0 ? dw : wsf + L.pw + (size_t)(t - 1) * wsz;
            float beta = t == 0 ? 1.0f : 0.0f;
            for (int n0 = i0; n0 < i1; n0 += L.nb) {
                int nb = i1 - n0 < L.nb ? i1 - n0 : L.nb;
                size_t rows = (size_t)nb * g.pq;
                float *DY = dt == TQ_F32 ? (float *)dy + (size_t)n0 * g.pq * K : sl + L.b;
                bwdf_prep(&g, dt, x, dy, sl + L.a, DY, n0, 0, rows);
                bwdf_gemm(&g, rows, DY, sl + L.a, target, 0, g.rsc, beta);
                beta = 1.0f;
            }
            if (i1 <= i0 && t > 0) memset(target, 0, nwk * sizeof(float));
#pragma omp barrier
#pragma omp for schedule(static)
            for (size_t j = 0; j < nwk; j++) {
                float acc = dw[j];
                for (int u = 1; u < T; u++) acc += wsf[L.pw + (size_t)(u - 1) * wsz + j];
                dw[j] = acc;
            }
        }
        return TQ_OK;
    }
    for (int n0 = 0; n0 < g.n; n0 += L.nb) {
        int nb = g.n - n0 < L.nb ? g.n - n0 : L.nb;
        size_t rows = (size_t)nb * g.pq;
        float *cols = direct ? (float *)x + (size_t)n0 * g.hwc : wsf + L.slice0 + L.a;
        float *DY = dt == TQ_F32 ? (float *)dy + (size_t)n0 * g.pq * K : wsf + L.slice0 + L.b;
#pragma omp parallel num_threads(team(be, flops * nb / g.n, INT_MAX))
        {
            size_t t0, t1;
            if (!direct) {
                share(rows, 4, &t0, &t1);
                bwdf_prep(&g, dt, x, dy, cols, DY, n0, t0, t1);
#pragma omp barrier
            }
            share(g.rsc, 16, &t0, &t1);
            bwdf_gemm(&g, rows, DY, cols, dw, t0, t1, 1.0f);
        }
    }
    return TQ_OK;
}

/* the CPU's vector kernels (Winograd, thin), decided once per backend */
static void vec_kernels_init(tq_backend *be, tq_cpu_ctx *cx) {
    const char *env = getenv("TQ_CPU_WINOGRAD");
    int ok = tq_cpu_avx2_f16c();
    int below = tq_dnnl_below_avx512(be);
    int wide = ok && !below && __builtin_cpu_supports("avx512f");
    cx->wino_vec = wide ? 16 : 8;
    cx->wino_amx = tq_dnnl_has_amx(be);
    /* F(4×4, 3×3) for fwd and bwd_data, F(2×2, 3×3) for bwd_filter (wino_use); TQ_CPU_WINO_TILE=2:
     * F(2×2, 3×3) everywhere, =4: F(4×4, 3×3) everywhere */
    const char *te = getenv("TQ_CPU_WINO_TILE");
    cx->wino_tile = te && !strcmp(te, "2") ? 2 : 4;
    cx->wino_tile_bwdf = te && !strcmp(te, "4") ? 4 : 2;
    if (env && env[0] == '0' && env[1] == 0) cx->wino = WINO_OFF;
    else if (env && env[0] == '1' && env[1] == 0) {
        cx->wino = ok ? WINO_ALL : WINO_OFF;
        cx->wino_forced = 1;
    } else if (cx->dnnl_off) cx->wino = WINO_OFF;   /* TQ_CPU_DNNL=0: everything on im2col */
    else cx->wino = ok && below ? WINO_ALL : wide && tq_cpu_is_intel() ? WINO_WIDE : WINO_OFF;
    const char *th = getenv("TQ_CPU_THIN");
    cx->thin = !ok ? 0 : th && !strcmp(th, "0") ? 0 : th && !strcmp(th, "1") ? 2 : cx->dnnl_off ? 0 : 1;
}

/* Winograd (cpu_wino.c: F(4×4, 3×3) for fwd and bwd_data, F(2×2, 3×3) on maps where that takes no
 * more products and for bwd_filter, whose F(4×4, 3×3) error is larger: docs/engine.md) for
 * the 3×3 stride-1 convolutions it fits, where it beats oneDNN's direct kernels (and its f32
 * copies of 16-bit data). TQ_CPU_WINOGRAD=1 turns it on for all of them wherever the CPU has
 * AVX2, FMA and F16C, =0 off; TQ_CPU_WINO_TILE=2 keeps F(2×2, 3×3) everywhere (and the rule it
 * had), =4 takes F(4×4, 3×3) for bwd_filter too. Unset:
 * - where oneDNN runs and its best ISA is below AVX-512 (an AVX2 CPU, or ONEDNN_MAX_CPU_ISA=AVX2):
 *   all of them, on AVX2 registers;
 * - on Intel CPUs where oneDNN has AVX-512, on AVX-512 registers, all of them whose channels
 *   are multiples of 16, in f32, f16 and bf16 (but bf16 where oneDNN has AMX). On 2 Emerald
 *   Rapids cores (resnet20 batch 128 on 28×28 images, `trainq run --profile`, medians of 4
 *   interleaved runs) F(4×4, 3×3) ran the f32 convolutions 1.32-1.40x as fast as oneDNN's
 *   avx512_core kernels at 16 channels, 1.43-1.82x at 32 and 1.60-2.23x at 64. With F(2×2, 3×3)
 *   the 16-channel ones had been a tie (0.95-1.02x) and stayed with oneDNN in f32: so they do
 *   under TQ_CPU_WINO_TILE=2. In 16-bit types the alternative is oneDNN's f32 kernels on f32
 *   copies (cpu_dnnl.c). Whole steps: docs/engine.md. AMD's Zen 4 keeps oneDNN there (not
 *   measured), AMX its tile kernels for bf16.
 * Decided once per backend (vec_kernels_init). */
static int wino_use(tq_backend *be, const tq_conv_desc *d, tq_dtype dt) {
    tq_cpu_ctx *cx = be->ctx;
    if (!cx || !tq_cpu_wino_fits(d)) return 0;   /* dt: checked by geom, as every caller does first */
    if (!cx->wino) vec_kernels_init(be, cx);
    if (cx->wino == WINO_ALL) return 1;
    if (cx->wino != WINO_WIDE || (dt == TQ_BF16 && cx->wino_amx)) return 0;
    if (dt == TQ_F32)   /* F(2×2, 3×3) (TQ_CPU_WINO_TILE=2) only from 32 channels */
        return tq_cpu_wino_fits512(d) && (cx->wino_tile == 4 || (d->x.c >= 32 && d->k >= 32));
    return 1;   /* f16, bf16 without AMX: against oneDNN's f32 kernels on f32 copies, all of them */
}

/* Of the convolutions wino_use gives Winograd, the forward and backward-data ops (the latter
 * without accumulation: oneDNN's accumulates through a workspace and an add) that go to oneDNN
 * after all: in f32 by default (not under TQ_CPU_WINOGRAD=1), with F(4×4, 3×3), when the transformed
 * kernel U takes 16 MiB or more and the op has fewer than 1024 outputs per channel (N·P·Q). U
 * is made again every call, and with few tiles to reuse it its making and streaming cost more
 * than oneDNN's whole direct convolution. On 2 Sapphire-Rapids-class cores (ms, Winograd vs
 * oneDNN, forward): 4×4×512 at batch 16 7.1 vs 5.4, batch 32 12.6 vs 10.0, batch 64 16.2 vs
 * 19.4; 7×7×512 at batch 16 15.9 vs 11.4; 256 channels (U 9 MiB) won from 512 outputs (4×4 at
 * batch 32: 2.0 vs 2.2) and 2×2 maps (F(2×2, 3×3), U 16 MiB at 512 channels) at batch 32-64
 * 5.1-6.5 vs 6.4-11.6. With oneDNN capped at AVX2 (Winograd on AVX2 registers, oneDNN's jit:avx2),
 * resnet18 at batch 32, 4×4×512: forward 18.5 vs 13.4, backward-data 14.4 vs 13.9; 7×7×512 at
 * batch 16 21.1 vs 19.5; batch 64 19.6 vs 26.1 (kept). Whole steps: docs/engine.md. */
static int wino_few(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int op) {
    const tq_cpu_ctx *cx = be->ctx;
    if (!cx || cx->wino_forced || dt != TQ_F32 || op == OP_BWD_FILTER) return 0;
    size_t outputs;
    const int E = tq_cpu_wino_products(d, op == OP_BWD_DATA, cx->wino_tile, &outputs);
    const size_t u = (size_t)E * d->x.c * d->k * sizeof(float);   /* U's bytes */
    return E == 36 && u >= ((size_t)16 << 20) && outputs < 1024;
}

/* op (kind 0 fwd, 1 bwd_data with this beta, 2 bwd_filter) runs Winograd: the dispatch below */
int tq_cpu_conv_is_wino(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int op, float beta) {
    if (!wino_use(be, d, dt)) return 0;
    return !wino_few(be, d, dt, op) || (op == OP_BWD_DATA && beta != 0.0f);   /* wino_few: never bwd_filter */
}

static int cx_vec(tq_backend *be) { return ((tq_cpu_ctx *)be->ctx)->wino_vec; }
/* the op's Winograd tile: fwd and bwd_data wino_tile, bwd_filter wino_tile_bwdf */
static int cx_tile(tq_backend *be, int op) {
    const tq_cpu_ctx *cx = be->ctx;
    return op == OP_BWD_FILTER ? cx->wino_tile_bwdf : cx->wino_tile;
}

/* The direct kernels of 1 to 4 input channels (cpu_thin_vec.h) for the forward and
 * filter-gradient ops of a 3×3 stride-1 convolution they fit (TQ_CPU_THIN=1: all of them, where
 * the CPU has AVX2, FMA and F16C; =0 none). Unset, where they beat oneDNN: a 1-channel input
 * (Fashion-MNIST's first layers), its filter gradient everywhere and its forward on AVX-512
 * registers (oneDNN on AVX-512 or capped at AVX2 and trainq against itself, `bench/ab TQ_CPU_THIN=0
 * - --ops`, per call at batch 64/128: the cnn's 1 → 32-channel conv1 on AVX-512 forward
 * 1.16-1.44×, filter gradient 1.79-2.07×; under the AVX2 cap the filter gradient 1.71-2.04× but
 * the forward 0.69-0.82×, its 8-wide registers broadcasting each input value once per register
 * of output channels). Three channels (CIFAR's first layer, 16 outputs) tied or lost in bf16
 * (AVX-512: forward 0.94-1.13×, filter gradient f32 1.21-1.32× but bf16 0.83-0.91×), so they stay
 * with oneDNN. With TQ_CPU_DNNL=0 everything stays on im2col unless TQ_CPU_THIN=1. bwd_data (a
 * first layer needs none) stays with oneDNN or im2col. */
static int thin_use(tq_backend *be, const tq_conv_desc *d, int op) {
    tq_cpu_ctx *cx = be->ctx;
    if (!cx || op == OP_BWD_DATA || !tq_cpu_thin_fits(d)) return 0;
    if (!cx->wino) vec_kernels_init(be, cx);
    if (cx->thin != 1) return cx->thin == 2;
    return d->x.c == 1 && (op == OP_BWD_FILTER || (cx->wino_vec == 16 && d->k % 16 == 0));
}

/* the caller's workspace holds the need bytes of the Winograd or thin kernels (else the error) */
static int ws_ok(tq_backend *be, const char *op, size_t need, size_t ws_bytes, const void *ws) {
    if (ws_bytes < need || !ws) {
        tq_backend_seterr(be, "%s: workspace too small (%zu < %zu bytes)", op, ws_bytes, need);
        return 0;
    }
    return 1;
}
static int wino_ws_ok(tq_backend *be, const char *op, const tq_conv_desc *d, int kind,
                      size_t ws_bytes, const void *ws) {
    return ws_ok(be, op, tq_cpu_wino_ws(d, kind, tq_cpu_nt(be), cx_tile(be, kind)), ws_bytes, ws);
}
static int thin_ws_ok(tq_backend *be, const char *op, const tq_conv_desc *d, int kind,
                      size_t ws_bytes, const void *ws) {
    return ws_ok(be, op, tq_cpu_thin_ws(d, kind, tq_cpu_nt(be)), ws_bytes, ws);
}

/* convolutions go to Winograd where wino_use says so, then to oneDNN (TQ_DNNL_NA: it does not
 * run this descriptor and type), then to the im2col path */
int tq_cpu_conv_fwd(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x,
                    const void *w, const float *bias, void *ws, size_t ws_bytes) {
    cgeom g;
    if (!geom(be, "conv_fwd", d, dt, &g)) {
        if (tq_cpu_conv_is_wino(be, d, dt, OP_FWD, 0.0f))
            return wino_ws_ok(be, "conv_fwd", d, OP_FWD, ws_bytes, ws)
                       ? tq_cpu_wino_fwd(tq_cpu_nt(be), cx_vec(be), cx_tile(be, OP_FWD), d, dt, y, x, w, bias, ws) : TQ_EINVAL;
        if (thin_use(be, d, OP_FWD))
            return thin_ws_ok(be, "conv_fwd", d, OP_FWD, ws_bytes, ws)
                       ? tq_cpu_thin_fwd(tq_cpu_nt(be), cx_vec(be), d, dt, y, x, w, bias, ws) : TQ_EINVAL;
        int rc = tq_dnnl_conv_fwd(be, d, dt, y, x, w, bias, ws, ws_bytes);
        if (rc != TQ_DNNL_NA) return rc;
    }
    return conv_fwd_impl(be, "conv_fwd", d, dt, y, x, w, bias, ws, ws_bytes);
}
int tq_cpu_conv_bwd_data(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *dx,
                         float beta, const void *dy, const void *w, void *ws, size_t ws_bytes) {
    cgeom g;
    if (!geom(be, "conv_bwd_data", d, dt, &g)) {
        if (tq_cpu_conv_is_wino(be, d, dt, OP_BWD_DATA, beta))
            return wino_ws_ok(be, "conv_bwd_data", d, OP_BWD_DATA, ws_bytes, ws)
                       ? tq_cpu_wino_bwd_data(tq_cpu_nt(be), cx_vec(be), cx_tile(be, OP_BWD_DATA), d, dt, dx, beta, dy, w, ws) : TQ_EINVAL;
        int rc = tq_dnnl_conv_bwd_data(be, d, dt, dx, beta, dy, w, ws, ws_bytes);
        if (rc != TQ_DNNL_NA) return rc;
    }
    return conv_bwd_data_impl(be, "conv_bwd_data", d, dt, dx, beta, dy, w, ws, ws_bytes);
}
int tq_cpu_conv_bwd_filter(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, float *dw,
                           float *db, const void *x, const void *dy, void *ws, size_t ws_bytes) {
    cgeom g;
    if (!geom(be, "conv_bwd_filter", d, dt, &g)) {
        if (tq_cpu_conv_is_wino(be, d, dt, OP_BWD_FILTER, 0.0f))
            return wino_ws_ok(be, "conv_bwd_filter", d, OP_BWD_FILTER, ws_bytes, ws)
                       ? tq_cpu_wino_bwd_filter(tq_cpu_nt(be), cx_vec(be), cx_tile(be, OP_BWD_FILTER), d, dt, dw, db, x, dy, ws) : TQ_EINVAL;
        if (thin_use(be, d, OP_BWD_FILTER))
            return thin_ws_ok(be, "conv_bwd_filter", d, OP_BWD_FILTER, ws_bytes, ws)
                       ? tq_cpu_thin_bwd_filter(tq_cpu_nt(be), cx_vec(be), d, dt, dw, db, x, dy, ws) : TQ_EINVAL;
        int rc = tq_dnnl_conv_bwd_filter(be, d, dt, dw, db, x, dy, ws, ws_bytes);
        if (rc != TQ_DNNL_NA) return rc;
    }
    return conv_bwd_filter_impl(be, "conv_bwd_filter", d, dt, dw, db, x, dy, ws, ws_bytes);
}

/* ---- linear = 1×1 convolution over n images of 1×1×in ---- */

static tq_conv_desc lin_desc(int n, int in, int out) {
    tq_conv_desc d = { { n, 1, 1, in }, out, 1, 1, 1, 0 };
    return d;
}

size_t tq_cpu_linear_ws(tq_backend *be, int n, int in, int out, tq_dtype dt) {
    tq_conv_desc d = lin_desc(n, in, out);
    return conv_ws_impl(be, &d, dt, 1);
}
int tq_cpu_linear_fwd(tq_backend *be, int n, int in, int out, tq_dtype dt, void *y, const void *x,
                      const void *w, const float *bias, void *ws, size_t ws_bytes) {
    tq_conv_desc d = lin_desc(n, in, out);
    cgeom g;
    if (!geom(be, "linear_fwd", &d, dt, &g)) {
        int rc = tq_dnnl_linear_fwd(be, &d, dt, y, x, w, bias, ws, ws_bytes);
        if (rc != TQ_DNNL_NA) return rc;
    }
    return conv_fwd_impl(be, "linear_fwd", &d, dt, y, x, w, bias, ws, ws_bytes);
}
int tq_cpu_linear_bwd_data(tq_backend *be, int n, int in, int out, tq_dtype dt, void *dx,
                           float beta, const void *dy, const void *w, void *ws, size_t ws_bytes) {
    tq_conv_desc d = lin_desc(n, in, out);
    cgeom g;
    if (!geom(be, "linear_bwd_data", &d, dt, &g)) {
        int rc = tq_dnnl_linear_bwd_data(be, &d, dt, dx, beta, dy, w, ws, ws_bytes);
        if (rc != TQ_DNNL_NA) return rc;
    }
    return conv_bwd_data_impl(be, "linear_bwd_data", &d, dt, dx, beta, dy, w, ws, ws_bytes);
}
int tq_cpu_linear_bwd_filter(tq_backend *be, int n, int in, int out, tq_dtype dt, float *dw,
                             float *db, const void *x, const void *dy, void *ws, size_t ws_bytes) {
    tq_conv_desc d = lin_desc(n, in, out);
    cgeom g;
    if (!geom(be, "linear_bwd_filter", &d, dt, &g)) {
        int rc = tq_dnnl_linear_bwd_filter(be, &d, dt, dw, db, x, dy, ws, ws_bytes);
        if (rc != TQ_DNNL_NA) return rc;
    }
    return conv_bwd_filter_impl(be, "linear_bwd_filter", &d, dt, dw, db, x, dy, ws, ws_bytes);
}
