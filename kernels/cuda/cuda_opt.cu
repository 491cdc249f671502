/* cuda_opt.cu — the flat f32 buffer passes of the CUDA backend: unscale + inf check, SGD and
 * AdamW steps (each writing AMP's 16-bit weight copy in the same pass when asked).
 *
 * Contract (same semantics as kernels/cpu/cpu_elem.c)
 * - One thread per parameter in grid-stride loops; the per-parameter arithmetic is
 *   tq_common.h's tq_sgd_1 / tq_adamw_1, the very functions the CPU loops call.
 * - unscale_check: one fused pass g *= inv_scale; a value counts as bad when g or g·inv_scale
 *   is inf/NaN. *found_inf (device f32) is written 1.0f only when something is bad (the
 *   caller zeroes it first, as for the CPU backend); several blocks may store that same 1.0f,
 *   which is deterministic without atomics. found_inf may be NULL (the scaling still happens).
 * - The _dyn variants (the step on the device, backend.h) are the same kernels instantiated
 *   with DYN = 1: they read inv_scale, lr and AdamW's bias corrections from the tq_dstep
 *   structs in device memory (kernels/common's tq_dstep_* arithmetic) instead of arguments,
 *   and then run the very same per-element code. step_end is one thread: tq_dstep_end.
 * - Errors: TQ_EINVAL naming the op and argument; launch failures TQ_EDEVICE.
 */
#include "cuda/cuda_kern.cuh"

#define GRID(n) tqc_blocks((n), TQC_THREADS), TQC_THREADS, 0, tqc(be)->stream

__device__ __forceinline__ int nonfinite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

template <int DYN>
__global__ void __launch_bounds__(TQC_THREADS)
k_unscale_check(size_t n, float *g, float inv_scale, const tq_dstep_state *st, float *found_inf) {
    if (DYN) inv_scale = tq_dstep_inv_scale(st->scale);
    int bad = 0;
    TQC_FOR(i, n) {
        float v = g[i], s = v * inv_scale;
        bad |= nonfinite(v) | nonfinite(s);
        g[i] = s;
    }
    /* every thread reaches this barrier: the loop above has no early exit */
    if (__syncthreads_or(bad) && threadIdx.x == 0 && found_inf) *found_inf = 1.0f;
}

extern "C" int tqc_unscale_check(tq_backend *be, size_t n, float *g, float inv_scale,
                                 float *found_inf) {
    if (!n) return TQ_OK;
    TQC_NEED(be, "unscale_check", g);
    k_unscale_check<0><<<GRID(n)>>>(n, g, inv_scale, NULL, found_inf);
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

extern "C" int tqc_unscale_check_dyn(tq_backend *be, size_t n, float *g, const tq_dstep_state *st,
                                     float *found_inf) {
    TQC_NEED(be, "unscale_check_dyn", st);
    if (!n) return TQ_OK;
    TQC_NEED(be, "unscale_check_dyn", g);
    k_unscale_check<1><<<GRID(n)>>>(n, g, 0.0f, st, found_inf);
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

/* WDT: the dtype of the weight copy the step also writes (wl[i] = w[i] after the update,
 * stx's rounding, as k_cast's), or -1 for none */
template <int WDT>
__device__ __forceinline__ void wcopy(void *wl, size_t i, float v) {
    if (WDT >= 0) stx<(WDT >= 0 ? WDT : TQ_F32)>(wl, i, v);
}

/* the weight copy's dtype as a template argument: WDT -1 when wl is NULL */
#define WDT_SWITCH(wl, wdt, NAME, ...)                                             \
    do {                                                                           \
        if (!(wl)) { const int NAME = -1; __VA_ARGS__; }                           \
        else if ((wdt) == TQ_F16) { const int NAME = TQ_F16; __VA_ARGS__; }        \
        else { const int NAME = TQ_BF16; __VA_ARGS__; }                            \
    } while (0)

static int wcopy_check(tq_backend *be, const char *op, const void *wl, tq_dtype wdt) {
    if (wl && wdt != TQ_F16 && wdt != TQ_BF16) {
        tq_backend_seterr(be, "%s: the weight copy's dtype %d is not f16 or bf16", op, (int)wdt);
        return TQ_EINVAL;
    }
    return TQ_OK;
}

/* skip: an overflow flag in device memory (unscale_check's), NULL none: set, nothing moves */
template <int MOM, int DYN, int WDT>
__global__ void k_sgd(size_t n, float *w, const float *g, float *buf, float lr,
                      const tq_dstep_in *in, float momentum, float wd, int nesterov,
                      const float *skip, void *wl) {
    if (skip && *skip != 0.0f) return;
    if (DYN) lr = in->lr;
    TQC_FOR(i, n) {
        if (MOM) {
            tq_sgd_1(&w[i], g[i], &buf[i], lr, momentum, wd, nesterov);
        } else {
            float unused = 0.0f;
            tq_sgd_1(&w[i], g[i], &unused, lr, 0.0f, wd, nesterov);
        }
        wcopy<WDT>(wl, i, w[i]);
    }
}

template <int DYN>
static int sgd_launch(tq_backend *be, const char *op, size_t n, float *w, const float *g,
                      float *buf, float lr, const tq_dstep_in *in, float momentum, float wd,
                      int nesterov, const float *skip, void *wl, tq_dtype wdt) {
    if (momentum != 0.0f && !buf) {
        tq_backend_seterr(be, "%s: momentum %g needs a buffer", op, (double)momentum);
        return TQ_EINVAL;
    }
    if (wcopy_check(be, op, wl, wdt)) return TQ_EINVAL;
    if (DYN) TQC_NEED(be, op, in);
    if (!n) return TQ_OK;
    TQC_NEED(be, op, w);
    TQC_NEED(be, op, g);
    WDT_SWITCH(wl, wdt, WDT, {
        if (momentum == 0.0f)
            k_sgd<0, DYN, WDT><<<GRID(n)>>>(n, w, g, NULL, lr, in, 0.0f, wd, nesterov, skip, wl);
        else
            k_sgd<1, DYN, WDT><<<GRID(n)>>>(n, w, g, buf, lr, in, momentum, wd, nesterov, skip, wl);
    });
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

extern "C" int tqc_sgd_step(tq_backend *be, size_t n, float *w, const float *g, float *buf,
                            float lr, float momentum, float wd, int nesterov, const float *skip,
                            void *wlow, tq_dtype wdt) {
    return sgd_launch<0>(be, "sgd_step", n, w, g, buf, lr, NULL, momentum, wd, nesterov, skip,
                         wlow, wdt);
}

extern "C" int tqc_sgd_step_dyn(tq_backend *be, size_t n, float *w, const float *g, float *buf,
                                const tq_dstep_in *in, float momentum, float wd, int nesterov,
                                const float *skip, void *wlow, tq_dtype wdt) {
    return sgd_launch<1>(be, "sgd_step_dyn", n, w, g, buf, 0.0f, in, momentum, wd, nesterov, skip,
                         wlow, wdt);
}

template <int DYN, int WDT>
__global__ void k_adamw(size_t n, float *w, const float *g, float *m, float *v, float lr,
                        float b1, float b2, float eps, float wd, float bc1, float bc2,
                        const tq_dstep_in *in, const tq_dstep_state *st, const float *skip,
                        void *wl) {
    if (skip && *skip != 0.0f) return;
    float l = lr, c1 = bc1, c2 = bc2;
    if (DYN) {
        l = in->lr;
        tq_dstep_bc(in, st, &c1, &c2);
    }
    TQC_FOR(i, n) {
        tq_adamw_1(&w[i], g[i], &m[i], &v[i], l, b1, b2, eps, wd, c1, c2);
        wcopy<WDT>(wl, i, w[i]);
    }
}

extern "C" int tqc_adamw_step(tq_backend *be, size_t n, float *w, const float *g, float *m,
                              float *v, float lr, float b1, float b2, float eps, float wd,
                              float bc1, float bc2, const float *skip, void *wlow, tq_dtype wdt) {
    if (!m || !v) {
        tq_backend_seterr(be, "adamw_step: moment buffers missing");
        return TQ_EINVAL;
    }
    if (wcopy_check(be, "adamw_step", wlow, wdt)) return TQ_EINVAL;
    if (!n) return TQ_OK;
    TQC_NEED(be, "adamw_step", w);
    TQC_NEED(be, "adamw_step", g);
    WDT_SWITCH(wlow, wdt, WDT,
               (k_adamw<0, WDT><<<GRID(n)>>>(n, w, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, NULL,
                                              NULL, skip, wlow)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

extern "C" int tqc_adamw_step_dyn(tq_backend *be, size_t n, float *w, const float *g, float *m,
                                  float *v, const tq_dstep_in *in, const tq_dstep_state *st,
                                  float b1, float b2, float eps, float wd, const float *skip,
                                  void *wlow, tq_dtype wdt) {
    if (!m || !v) {
        tq_backend_seterr(be, "adamw_step_dyn: moment buffers missing");
        return TQ_EINVAL;
    }
    if (wcopy_check(be, "adamw_step_dyn", wlow, wdt)) return TQ_EINVAL;
    TQC_NEED(be, "adamw_step_dyn", in);
    TQC_NEED(be, "adamw_step_dyn", st);
    if (!n) return TQ_OK;
    TQC_NEED(be, "adamw_step_dyn", w);
    TQC_NEED(be, "adamw_step_dyn", g);
    WDT_SWITCH(wlow, wdt, WDT,
               (k_adamw<1, WDT><<<GRID(n)>>>(n, w, g, m, v, 0.0f, b1, b2, eps, wd, 0.0f, 0.0f, in,
                                              st, skip, wlow)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

__global__ void k_step_end(tq_dstep_state *st, const float *found_inf, int fp16, float growth,
                           float backoff, int interval) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    tq_dstep_end(st, fp16, found_inf && *found_inf != 0.0f, growth, backoff, interval);
}

extern "C" int tqc_step_end(tq_backend *be, tq_dstep_state *st, const float *found_inf, int fp16,
                            float growth, float backoff, int interval) {
    TQC_NEED(be, "step_end", st);
    k_step_end<<<1, 32, 0, tqc(be)->stream>>>(st, found_inf, fp16, growth, backoff, interval);
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}
