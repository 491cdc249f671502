/* tq_common.h — element-wise math shared by the CPU loops and the CUDA kernels.
 *
 * Contract: everything here is `static inline TQ_HD`, pure arithmetic on scalars, no memory
 * allocation, no globals, callable from any thread. The CPU backend (kernels/cpu) and the CUDA
 * backend (kernels/cuda) both compile these functions, so the CPU tests test the arithmetic the
 * GPU runs. Storage types: activations and the reduced weight copy are f32, f16 or bf16 (raw
 * 16-bit patterns here, so no compiler half type is needed); everything computes in f32.
 */
#ifndef TQ_COMMON_H
#define TQ_COMMON_H

#include <stdint.h>
#include <stddef.h>
#include <math.h>

#if defined(__CUDACC__)
#define TQ_HD __host__ __device__
#elif defined(__GNUC__)
/* always inlined on the host: these are a few operations each, and a loop that calls one
 * out of line (GCC stops inlining into large, multi-versioned loop nests) does not vectorise */
#define TQ_HD __attribute__((always_inline))
#else
#define TQ_HD
#endif

typedef enum { TQ_F32 = 0, TQ_F16 = 1, TQ_BF16 = 2 } tq_dtype;

static inline TQ_HD size_t tq_dtype_size(tq_dtype dt) { return dt == TQ_F32 ? 4 : 2; }

static inline TQ_HD uint32_t tq_f32_bits(float f) { union { float f; uint32_t u; } v; v.f = f; return v.u; }
static inline TQ_HD float tq_bits_f32(uint32_t u) { union { float f; uint32_t u; } v; v.u = u; return v.f; }

/* a when c (0 or 1), else b: a mask, so that compilers neither branch nor refuse to vectorise */
static inline TQ_HD uint32_t tq_sel(uint32_t c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - c;
    return (a & m) | (b & ~m);
}

/* bf16: the top 16 bits of an f32, rounded to nearest even; NaN stays NaN (quiet). Written as
 * a select, not a branch, so that loops over it vectorise. */
static inline TQ_HD uint16_t tq_f32_to_bf16(float f) {
    uint32_t u = tq_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    return (uint16_t)tq_sel((u & 0x7fffffffu) > 0x7f800000u, q, r);
}
static inline TQ_HD float tq_bf16_to_f32(uint16_t h) { return tq_bits_f32((uint32_t)h << 16); }

/* IEEE binary16, round to nearest even, overflow to inf, gradual underflow (what a GPU's
 * __float2half_rn does); NaN becomes the quiet NaN 0x7e00 with the sign kept. Branch-free
 * (every case computed, then selected) so that loops over it vectorise. Subnormal results:
 * their unit is 2^-24, so the result is |f|·2^24 rounded to an integer, and adding 2^23 to a
 * float below 2^23 rounds it to an integer (nearest even) in its low mantissa bits; 1024
 * there is the smallest normal, 0x0400, as it should be. Checked against the previous
 * branchy version on all 2^32 inputs, and against F16C in test_ops. */
static inline TQ_HD uint16_t tq_f32_to_f16(float f) {
    uint32_t u = tq_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t n = a - 0x38000000u;                                    /* rebias 127 -> 15 */
    n = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;
    uint32_t s = tq_f32_bits(tq_bits_f32(a) * 0x1p24f + 0x1p23f) - 0x4b000000u;
    uint32_t o = tq_sel(a < 0x38800000u, s, n);                      /* below 2^-14: subnormal */
    o = tq_sel(a >= 0x477ff000u, 0x7c00u, o);                        /* rounds to >= 65520: inf */
    o = tq_sel(a > 0x7f800000u, 0x7e00u, o);                         /* NaN */
    return (uint16_t)(sign | o);
}
static inline TQ_HD float tq_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t n = sign | ((e + 112u) << 23) | (m << 13);
    uint32_t i = sign | 0x7f800000u | (m << 13);                     /* inf / NaN */
    uint32_t s = sign | tq_f32_bits((float)m * 0x1p-24f);            /* subnormal or zero */
    return tq_bits_f32(tq_sel(e == 0x1fu, i, tq_sel(e == 0, s, n)));
}

/* Load/store one element of a storage dtype as f32. */
static inline TQ_HD float tq_ld(const void *p, tq_dtype dt, size_t i) {
    if (dt == TQ_F32) return ((const float *)p)[i];
    if (dt == TQ_F16) return tq_f16_to_f32(((const uint16_t *)p)[i]);
    return tq_bf16_to_f32(((const uint16_t *)p)[i]);
}
static inline TQ_HD void tq_st(void *p, tq_dtype dt, size_t i, float v) {
    if (dt == TQ_F32) ((float *)p)[i] = v;
    else if (dt == TQ_F16) ((uint16_t *)p)[i] = tq_f32_to_f16(v);
    else ((uint16_t *)p)[i] = tq_f32_to_bf16(v);
}
/* The value f32 `v` has once stored in `dt` (rounding emulation). */
static inline TQ_HD float tq_round_to(tq_dtype dt, float v) {
    if (dt == TQ_F32) return v;
    if (dt == TQ_F16) return tq_f16_to_f32(tq_f32_to_f16(v));
    return tq_bf16_to_f32(tq_f32_to_bf16(v));
}

static inline TQ_HD int tq_isfinite(float v) { return (tq_f32_bits(v) & 0x7f800000u) != 0x7f800000u; }

/* ---- optimizers, one parameter at a time (torch.optim semantics) ---- */

/* torch.optim.SGD (dampening 0): g += wd*w; buf = mom*buf + g; g = nesterov ? g + mom*buf : buf;
 * w -= lr*g. With momentum 0 the buffer is untouched. */
static inline TQ_HD void tq_sgd_mom_1(float *w, float g, float *buf, float lr, float mom, float wd,
                                      int nesterov) {   /* mom != 0: without the test, for loops */
    g += wd * *w;
    float b = mom * *buf + g;
    *buf = b;
    g = nesterov ? g + mom * b : b;
    *w -= lr * g;
}
static inline TQ_HD void tq_sgd_1(float *w, float g, float *buf, float lr, float mom, float wd,
                                  int nesterov) {
    if (mom != 0.0f) {
        tq_sgd_mom_1(w, g, buf, lr, mom, wd, nesterov);
        return;
    }
    g += wd * *w;
    *w -= lr * g;
}

/* torch.optim.AdamW: w *= 1 - lr*wd; m,v moments; step t (1-based) bias corrections
 * bc1 = 1 - b1^t, bc2 = 1 - b2^t given by the caller. */
static inline TQ_HD void tq_adamw_1(float *w, float g, float *m, float *v, float lr, float b1,
                                    float b2, float eps, float wd, float bc1, float bc2) {
    *w *= 1.0f - lr * wd;
    float mm = b1 * *m + (1.0f - b1) * g;
    float vv = b2 * *v + (1.0f - b2) * g * g;
    *m = mm; *v = vv;
    float denom = sqrtf(vv) / sqrtf(bc2) + eps;
    *w -= (lr / bc1) * mm / denom;
}

/* ---- batch-norm pieces ---- */
static inline TQ_HD float tq_bn_norm(float x, float mean, float invstd, float g, float b) {
    return (x - mean) * invstd * g + b;
}
/* dx for one element given the per-channel sums dbeta = Σdy, dgamma = Σdy·x̂ over m elements. */
static inline TQ_HD float tq_bn_dx(float dy, float xhat, float g, float invstd, float dbeta,
                                   float dgamma, float inv_m) {
    return g * invstd * (dy - inv_m * dbeta - xhat * inv_m * dgamma);
}

/* ---- input normalisation and augmentation ---- */
static inline TQ_HD float tq_normalize_px(uint8_t px, float mean, float inv_std) {
    return ((float)px * (1.0f / 255.0f) - mean) * inv_std;
}

/* ---- GradScaler update (torch._amp_update_scale_) ----
 * found_inf: scale *= backoff, tracker = 0. Otherwise tracker+1; at growth_interval the scale
 * grows, but only to a finite value, and the tracker resets. */
static inline TQ_HD void tq_scaler_update(float *scale, int *tracker, int found_inf, float growth,
                                          float backoff, int interval) {
    if (found_inf) { *scale *= backoff; *tracker = 0; return; }
    int t = *tracker + 1;
    if (t >= interval) {
        float s = *scale * growth;
        if (tq_isfinite(s)) *scale = s;
        t = 0;
    }
    *tracker = t;
}

/* ---- the step on the device (spec cuda_graphs; train/trainer.c, docs/engine.md) ----
 * A captured step cannot take the loss scale, the learning rate or AdamW's bias corrections as
 * kernel arguments: they would be frozen at capture. They live in device memory instead: the
 * host writes a tq_dstep_in before each step, and the device owns a tq_dstep_state, which the
 * backend's step_end moves after the optimizer. The arithmetic below is the host loop's, bit
 * for bit (tests/unit/test_devstep.c holds them together):
 *   grad_scale = (float)(scale / accum)        softmax_ce's argument in the trainer
 *   inv_scale  = (float)(1.0 / scale)          unscale_check's argument
 *   bc1, bc2   = (float)(1 − beta^t)           AdamW's, t the optimizer steps taken + 1
 *   after the step: a step not skipped counts; fp16: tq_scaler_update on (float)scale.
 * The scale is a double, as the host loop's is: its first value is the spec's (or the
 * checkpoint's) double, every later one a float. The host cannot know t when steps are still
 * in flight (a skipped step does not count), so it sends the corrections for the two counts
 * the device can be at, t_a and t_a + 1, and the device picks by its own count. */
typedef struct {
    float lr;
    int32_t t_a;                      /* AdamW: bc1_a, bc2_a are for t = t_a, bc1_b, bc2_b for t_a + 1 */
    float bc1_a, bc2_a, bc1_b, bc2_b;
} tq_dstep_in;

typedef struct {
    double scale;                     /* the loss scale the next step uses (1 without fp16) */
    double used_scale;                /* the one the last step used */
    int32_t tracker;                  /* GradScaler's growth tracker */
    int32_t opt_t;                    /* optimizer steps taken (skipped ones do not count) */
} tq_dstep_state;

static inline TQ_HD float tq_dstep_grad_scale(double scale, int accum) { return (float)(scale / accum); }
static inline TQ_HD float tq_dstep_inv_scale(double scale) { return (float)(1.0 / scale); }

/* AdamW's bias corrections for the device's step count */
static inline TQ_HD void tq_dstep_bc(const tq_dstep_in *in, const tq_dstep_state *st, float *bc1,
                                     float *bc2) {
    int a = st->opt_t + 1 == in->t_a;
    *bc1 = a ? in->bc1_a : in->bc1_b;
    *bc2 = a ? in->bc2_a : in->bc2_b;
}

/* After the optimizer: what the host loop does with the step's found_inf (0 without fp16). */
static inline TQ_HD void tq_dstep_end(tq_dstep_state *st, int fp16, int found_inf, float growth,
                                      float backoff, int interval) {
    st->used_scale = st->scale;
    if (!found_inf) st->opt_t++;
    if (fp16) {
        float fs = (float)st->scale;
        int tr = st->tracker;
        tq_scaler_update(&fs, &tr, found_inf, growth, backoff, interval);
        st->scale = fs;
        st->tracker = tr;
    }
}

#endif
