/* cuda_opt.cu — the flat f32 buffer passes of the CUDA backend: unscale + inf check, SGD and
 * AdamW steps.
 *
 * Contract (same semantics as kernels/cpu/cpu_elem.c)
 * - One thread per parameter in grid-stride loops; the per-parameter arithmetic is
 *   tq_common.h's tq_sgd_1 / tq_adamw_1, the very functions the CPU loops call.
 * - unscale_check: one fused pass g *= inv_scale; a value counts as bad when g or g·inv_scale
 *   is inf/NaN. *found_inf (device f32) is written 1.0f only when something is bad (the
 *   caller zeroes it first, as for the CPU backend); several blocks may store that same 1.0f,
 *   which is deterministic without atomics. found_inf may be NULL (the scaling still happens).
 * - Errors: TQ_EINVAL naming the op and argument; launch failures TQ_EDEVICE.
 */
#include "cuda/cuda_kern.cuh"

#define GRID(n) tqc_blocks((n), TQC_THREADS), TQC_THREADS, 0, tqc(be)->stream

__device__ __forceinline__ int nonfinite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

__global__ void __launch_bounds__(TQC_THREADS)
k_unscale_check(size_t n, float *g, float inv_scale, float *found_inf) {
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
    k_unscale_check<<<GRID(n)>>>(n, g, inv_scale, found_inf);
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

/* skip: an overflow flag in device memory (unscale_check's), NULL none: set, nothing moves */
template <int MOM>
__global__ void k_sgd(size_t n, float *w, const float *g, float *buf, float lr, float momentum,
                      float wd, int nesterov, const float *skip) {
    if (skip && *skip != 0.0f) return;
    TQC_FOR(i, n) {
        if (MOM) {
            tq_sgd_1(&w[i], g[i], &buf[i], lr, momentum, wd, nesterov);
        } else {
            float unused = 0.0f;
            tq_sgd_1(&w[i], g[i], &unused, lr, 0.0f, wd, nesterov);
        }
    }
}

extern "C" int tqc_sgd_step(tq_backend *be, size_t n, float *w, const float *g, float *buf,
                            float lr, float momentum, float wd, int nesterov, const float *skip) {
    if (momentum != 0.0f && !buf) {
        tq_backend_seterr(be, "sgd_step: momentum %g needs a buffer", (double)momentum);
        return TQ_EINVAL;
    }
    if (!n) return TQ_OK;
    TQC_NEED(be, "sgd_step", w);
    TQC_NEED(be, "sgd_step", g);
    if (momentum == 0.0f) k_sgd<0><<<GRID(n)>>>(n, w, g, NULL, lr, 0.0f, wd, nesterov, skip);
    else k_sgd<1><<<GRID(n)>>>(n, w, g, buf, lr, momentum, wd, nesterov, skip);
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

__global__ void k_adamw(size_t n, float *w, const float *g, float *m, float *v, float lr,
                        float b1, float b2, float eps, float wd, float bc1, float bc2,
                        const float *skip) {
    if (skip && *skip != 0.0f) return;
    TQC_FOR(i, n) tq_adamw_1(&w[i], g[i], &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
}

extern "C" int tqc_adamw_step(tq_backend *be, size_t n, float *w, const float *g, float *m,
                              float *v, float lr, float b1, float b2, float eps, float wd,
                              float bc1, float bc2, const float *skip) {
    if (!m || !v) {
        tq_backend_seterr(be, "adamw_step: moment buffers missing");
        return TQ_EINVAL;
    }
    if (!n) return TQ_OK;
    TQC_NEED(be, "adamw_step", w);
    TQC_NEED(be, "adamw_step", g);
    k_adamw<<<GRID(n)>>>(n, w, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, skip);
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}
