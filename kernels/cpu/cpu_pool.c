/* cpu_pool.c — pooling, softmax cross-entropy and the batch loader.
 *
 * maxpool: 2×2 window, stride 2, y = (n, h/2, w/2, c) (floor; an odd last row/column belongs to
 *   no window and gets no gradient). The argmax is the first maximum in row-major window order;
 *   a NaN counts as a maximum (PyTorch's `val > max || isnan(val)`), so NaNs propagate. With
 *   relu, y = relu(max) (cpu_elem.c's relu: m <= 0 ? 0 : m) and the argmax gets dy only where
 *   m > 0 or m is NaN. That is the unfused relu → maxpool pair bit for bit: relu is monotone and
 *   keeps NaN, so where m > 0 the first maximum is the same element, and where m <= 0 both
 *   give every element of the window 0.
 * avgpool: global, y = (n, 1, 1, c), sums in double.
 * softmax_ce: per row, max-shifted log-softmax in f32, loss and hit counts summed in double
 *   (serial: reproducible), argmax = first maximum.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

/* ---- max pooling ---- */

#include "cpu/cpu_pool_rows.h"

static int pool_check(tq_backend *be, const char *op, tq_shape s, tq_dtype dt) {
    int rc = tq_cpu_check_shape(be, op, s, dt);
    if (rc) return rc;
    if (s.h < 2 || s.w < 2) {
        tq_backend_seterr(be, "%s: input %dx%d is smaller than the 2x2 window", op, s.h, s.w);
        return TQ_EINVAL;
    }
    return TQ_OK;
}

/* one output row (fwd) or one pair of input rows (bwd): the hot loops of a cnn step in 16 bits
 * (the conversions and selects), built for AVX-512 and AVX2 too, picked when the program loads
 * (as cpu_bn.c's norm pass); integer and compare arithmetic, the same bits everywhere */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void maxpool_row(tq_dtype dt, int f16n, tq_shape s, int img, int oh, void *y, const void *x,
                        int relu) {
    if (f16n && tq_cpu_maxpool_row_f16n(s, img, oh, y, x, relu)) return;   /* cpu_f16c.c */
    TQ_DT_CALL(dt, k_maxpool_row, s, img, oh, y, x, relu);
}

int tq_cpu_maxpool_fwd(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *xp, int relu) {
    int rc = pool_check(be, "maxpool_fwd", s, dt);
    if (rc) return rc;
    int P = s.h / 2, nrow = s.n * P, nt = tq_cpu_nt(be);
    int par = tq_shape_numel(s) > TQ_PAR_MIN;
    int f16n = dt == TQ_F16 && tq_cpu_f16_native();
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int t = 0; t < nrow; t++) maxpool_row(dt, f16n, s, t / P, t % P, y, xp, relu);
    return TQ_OK;
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void maxpool_bwd_rows(tq_dtype dt, int f16n, tq_shape s, int img, int oh, void *dx, float beta,
                             const void *dy, const void *x, int relu) {
    if (f16n && tq_cpu_maxpool_bwd_rows_f16n(s, img, oh, dx, beta, dy, x, relu)) return;
    TQ_DT_CALL(dt, k_maxpool_bwd_rows, s, img, oh, dx, beta, dy, x, relu);
}

int tq_cpu_maxpool_bwd(tq_backend *be, tq_shape s, tq_dtype dt, void *dx, float beta,
                       const void *dy, const void *xp, int relu) {
    int rc = pool_check(be, "maxpool_bwd", s, dt);
    if (rc) return rc;
    int P2 = (s.h + 1) / 2, nrow = s.n * P2, nt = tq_cpu_nt(be);
    int par = tq_shape_numel(s) > TQ_PAR_MIN;
    int f16n = dt == TQ_F16 && tq_cpu_f16_native();
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int t = 0; t < nrow; t++)   /* relu a run-time select: one loop body per dtype */
        maxpool_bwd_rows(dt, f16n, s, t / P2, t % P2, dx, beta, dy, xp, relu);
    return TQ_OK;
}

/* ---- global average pooling ---- */

TQ_ALWAYS_INLINE void k_avgpool_img(tq_dtype dt, tq_shape s, int img, void *y, const void *x) {
    size_t hw = (size_t)s.h * s.w, C = (size_t)s.c, base = (size_t)img * hw * C;
    for (size_t c0 = 0; c0 < C; c0 += TQ_CGROUP) {
        int cw = C - c0 < TQ_CGROUP ? (int)(C - c0) : TQ_CGROUP;
        double acc[TQ_CGROUP];
        for (int j = 0; j < cw; j++) acc[j] = 0;
        for (size_t r = 0; r < hw; r++)   /* each channel's sum in row order: vectorised over j */
            TQ_SIMD(dt, for (int j = 0; j < cw; j++) acc[j] += tq_ld(x, dt, base + r * C + c0 + j););
        for (int j = 0; j < cw; j++) tq_st(y, dt, (size_t)img * C + c0 + j, (float)(acc[j] / (double)hw));
    }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void avgpool_img(tq_dtype dt, tq_shape s, int img, void *y, const void *x) {
    TQ_DT_CALL(dt, k_avgpool_img, s, img, y, x);
}

int tq_cpu_avgpool_fwd(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *xp) {
    int rc = tq_cpu_check_shape(be, "avgpool_fwd", s, dt);
    if (rc) return rc;
    int nt = tq_cpu_nt(be), par = tq_shape_numel(s) > TQ_PAR_MIN && s.n > 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int i = 0; i < s.n; i++) avgpool_img(dt, s, i, y, xp);
    return TQ_OK;
}

/* the rows of one image: dx[r][c] = dy[c]/HW (+ beta·dx), the channel loop vectorised (the
 * beta test hoisted out of it, beta 0 never reading dx) */
TQ_ALWAYS_INLINE void k_avgpool_bwd_img(tq_dtype dt, tq_shape s, int img, void *dx, float beta,
                                        const void *dy, float inv_hw) {
    size_t C = (size_t)s.c, hw = (size_t)s.h * s.w, base = (size_t)img * hw * C, yo = (size_t)img * C;
    for (size_t r = 0; r < hw; r++) {
        size_t o = base + r * C;
        if (beta == 0.0f)
            TQ_SIMD(dt, for (size_t c = 0; c < C; c++) tq_st(dx, dt, o + c, tq_ld(dy, dt, yo + c) * inv_hw););
        else
            TQ_SIMD(dt, for (size_t c = 0; c < C; c++)
                tq_st(dx, dt, o + c, tq_ld(dy, dt, yo + c) * inv_hw + beta * tq_ld(dx, dt, o + c)););
    }
}
/* built for AVX-512 and AVX2 too, picked at load (x86-64-v2's scalar loop took 0.52 ms of a
 * resnet20 bf16 step at batch 128 on 2 Xeon cores) */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void avgpool_bwd_img(tq_dtype dt, tq_shape s, int img, void *dx, float beta, const void *dy,
                            float inv_hw) {
    TQ_DT_CALL(dt, k_avgpool_bwd_img, s, img, dx, beta, dy, inv_hw);
}

int tq_cpu_avgpool_bwd(tq_backend *be, tq_shape s, tq_dtype dt, void *dx, float beta,
                       const void *dy) {
    int rc = tq_cpu_check_shape(be, "avgpool_bwd", s, dt);
    if (rc) return rc;
    float inv_hw = (float)(1.0 / ((double)s.h * s.w));
    int nt = tq_cpu_nt(be), par = tq_shape_numel(s) > TQ_PAR_MIN && s.n > 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int i = 0; i < s.n; i++) avgpool_bwd_img(dt, s, i, dx, beta, dy, inv_hw);
    return TQ_OK;
}

/* ---- softmax cross-entropy ---- */

static int softmax_common(tq_backend *be, const char *op, int n, int classes, tq_dtype dt,
                          void *dlogits, const void *logits, const int32_t *labels,
                          float grad_scale, float *out) {
    if (!tq_cpu_dt_ok(dt) || n < 0 || classes <= 0 || (n > 0 && (!logits || !labels))) {
        tq_backend_seterr(be, "%s: bad arguments (n=%d classes=%d)", op, n, classes);
        return TQ_EINVAL;
    }
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= classes) {
            tq_backend_seterr(be, "%s: label %d of sample %d is outside [0,%d)", op,
                              (int)labels[i], i, classes);
            return TQ_EINVAL;
        }
    double loss = 0, hits = 0;
    float gs = n > 0 ? grad_scale / (float)n : 0.0f;
    for (int i = 0; i < n; i++) {
        size_t o = (size_t)i * classes;
        int lab = labels[i], am = 0;
        float m = tq_ld(logits, dt, o);
        for (int j = 1; j < classes; j++) {
            float v = tq_ld(logits, dt, o + j);
            if (v > m) { m = v; am = j; }
        }
        float sum = 0.0f;
        for (int j = 0; j < classes; j++) sum += expf(tq_ld(logits, dt, o + j) - m);
        float lse = logf(sum);
        loss += (double)(lse - (tq_ld(logits, dt, o + lab) - m));
        hits += am == lab;
        if (dlogits) {
            float inv = 1.0f / sum;
            for (int j = 0; j < classes; j++) {
                float p = expf(tq_ld(logits, dt, o + j) - m) * inv;
                tq_st(dlogits, dt, o + j, gs * (p - (j == lab ? 1.0f : 0.0f)));
            }
        }
    }
    if (out) {
        out[0] += (float)loss;
        out[1] += (float)hits;
    }
    return TQ_OK;
}

int tq_cpu_softmax_ce(tq_backend *be, int n, int classes, tq_dtype dt, void *dlogits,
                      const void *logits, const int32_t *labels, float grad_scale, float *out) {
    if (!dlogits && n > 0) {
        tq_backend_seterr(be, "softmax_ce: dlogits missing");
        return TQ_EINVAL;
    }
    return softmax_common(be, "softmax_ce", n, classes, dt, dlogits, logits, labels, grad_scale,
                          out);
}

int tq_cpu_softmax_ce_eval(tq_backend *be, int n, int classes, tq_dtype dt, const void *logits,
                           const int32_t *labels, float *out) {
    return softmax_common(be, "softmax_ce_eval", n, classes, dt, NULL, logits, labels, 0.0f, out);
}

/* ---- batch loader ----
 * Augmentation, exactly: output pixel (y, x) of sample i reads source pixel
 *     (y + dy − pad,  x' + dx − pad),   x' = flip ? w−1−x : x,
 * and a zero pixel where that lies outside the image. That is: crop an h×w window at offset
 * (dy, dx) out of the image zero-padded by `pad` on every side, then flip it horizontally —
 * torchvision's RandomCrop(padding=pad) followed by RandomHorizontalFlip. A zero pixel is
 * normalised like any other: (0 − mean)·inv_std. */
/* Sample i a row at a time, LOAD_ROW_MAX values of a row at a time (a row of Fashion-MNIST or
 * CIFAR-10 in one piece): the piece's source bytes gathered through a table of offsets (the
 * crop's shift and the flip; zero outside the image), then normalised and stored in one
 * vectorised loop against the per-channel constants repeated along the piece. Built for
 * AVX-512 and AVX2 too, picked at load (a loop over pixels took 0.6 ms of a cnn bf16 step at
 * batch 128 of 32×32×3 images on 2 Xeon cores, 7% of it). */
#define LOAD_ROW_MAX 3072
TQ_ALWAYS_INLINE void k_load_rows(tq_dtype dt, int i, int h, int w, int c, void *x,
                                  const uint8_t *img, const tq_aug *a, int pad, const float *mean,
                                  const float *inv_std) {
    int wc = w * c, so[LOAD_ROW_MAX];
    float mrow[LOAD_ROW_MAX], irow[LOAD_ROW_MAX];
    uint8_t row[LOAD_ROW_MAX];
    for (int k0 = 0; k0 < wc; k0 += LOAD_ROW_MAX) {
        int n = wc - k0 < LOAD_ROW_MAX ? wc - k0 : LOAD_ROW_MAX;
        for (int k = 0; k < n; k++) {
            int xx = (k0 + k) / c, ch = (k0 + k) % c;
            int sx = a ? (a->flip ? w - 1 - xx : xx) + a->dx - pad : xx;
            so[k] = sx >= 0 && sx < w ? sx * c + ch : -1;
            mrow[k] = mean[ch];
            irow[k] = inv_std[ch];
        }
        size_t o = (size_t)i * h * wc + (size_t)k0;
        for (int yy = 0; yy < h; yy++, o += (size_t)wc) {
            int sy = a ? yy + a->dy - pad : yy;
            const uint8_t *src = sy >= 0 && sy < h ? img + (size_t)sy * wc : NULL;
            for (int k = 0; k < n; k++) row[k] = src && so[k] >= 0 ? src[so[k]] : 0;
            TQ_SIMD(dt, for (int k = 0; k < n; k++)
                tq_st(x, dt, o + k, tq_normalize_px(row[k], mrow[k], irow[k])););
        }
    }
}
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void load_rows(tq_dtype dt, int i, int h, int w, int c, void *x, const uint8_t *img,
                      const tq_aug *a, int pad, const float *mean, const float *inv_std) {
    TQ_DT_CALL(dt, k_load_rows, i, h, w, c, x, img, a, pad, mean, inv_std);
}

int tq_cpu_load_batch(tq_backend *be, int n, int h, int w, int c, tq_dtype dt, void *x,
                      int32_t *labels, const uint8_t *images, const uint8_t *lab,
                      const int32_t *idx, const tq_aug *aug, int pad, const float *mean,
                      const float *inv_std) {
    if (!tq_cpu_dt_ok(dt) || n < 0 || h <= 0 || w <= 0 || c <= 0 || pad < 0 || !mean ||
        !inv_std || (n > 0 && (!x || !images || !idx))) {
        tq_backend_seterr(be, "load_batch: bad arguments (n=%d h=%d w=%d c=%d pad=%d)", n, h, w,
                          c, pad);
        return TQ_EINVAL;
    }
    for (int i = 0; i < n; i++)
        if (idx[i] < 0) {
            tq_backend_seterr(be, "load_batch: negative index %d", (int)idx[i]);
            return TQ_EINVAL;
        }
    size_t img_sz = (size_t)h * w * c;
    int nt = tq_cpu_nt(be), par = (size_t)n * img_sz > TQ_PAR_MIN && n > 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int i = 0; i < n; i++) {
        const uint8_t *img = images + (size_t)idx[i] * img_sz;
        const tq_aug *a = aug ? &aug[i] : NULL;
        load_rows(dt, i, h, w, c, x, img, a, pad, mean, inv_std);
        if (labels && lab) labels[i] = lab[idx[i]];
    }
    return TQ_OK;
}
