/* cuda_loss.cu — softmax cross-entropy (forward + backward in one) and its evaluation variant,
 * CUDA backend.
 *
 * Contract (same semantics as kernels/cpu/cpu_pool.c's softmax_common)
 * - One warp per row (grid-stride over rows). Per row, in f32: m = max, am = first index of the
 *   maximum (a NaN never wins, except that a NaN in column 0 gives am = 0, m = NaN, as the CPU's
 *   `v > m` scan from column 0 does), sum = Σ exp(v − m), loss = log(sum) − (v_label − m),
 *   dlogits = grad_scale/n · (p − onehot). The lanes' partial sums are combined by a fixed
 *   xor-butterfly, so a run is reproducible.
 * - out (device f32, may be NULL): out[0] += Σ loss, out[1] += hits. Per-row losses are added
 *   in double per block (warps in order) into tqc(be)->scratch, then one thread adds the block
 *   partials in block order and updates out: deterministic, no atomics.
 * - softmax_ce_dyn (the step on the device, backend.h): the same kernel with DYN = 1 computes
 *   gs from the tq_dstep_state in device memory as the host does: (float)(scale / accum), then
 *   / (float)n.
 * - Labels live on the device and are not checked on the host (that would need a sync): a row
 *   whose label is outside [0, classes) gets loss NaN, no hit and NaN gradients, so the error
 *   shows in the step's loss instead of reading out of bounds.
 * - Errors: TQ_EINVAL naming the op and argument; launch failures TQ_EDEVICE.
 */
#include "cuda/cuda_kern.cuh"

#define CE_WARPS 8
#define CE_MAX_BLOCKS 1024

template <int DT, int GRAD, int DYN>
__global__ void __launch_bounds__(CE_WARPS * 32)
k_softmax_ce(int n, int classes, void *dlogits, const void *logits, const int32_t *labels,
             float gs, const tq_dstep_state *st, int accum, double *part) {
    __shared__ double sl[CE_WARPS], sh[CE_WARPS];
    if (DYN) gs = tq_dstep_grad_scale(st->scale, accum) / (float)n;   /* the host's two roundings */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double wl = 0.0, wh = 0.0;
    for (int row = blockIdx.x * CE_WARPS + warp; row < n; row += gridDim.x * CE_WARPS) {
        const size_t o = (size_t)row * classes;
        const int lab = labels[row];
        const int lab_ok = lab >= 0 && lab < classes;
        /* max and first argmax over the non-NaN values */
        float m = 0.0f;
        int am = -1;
        for (int j = lane; j < classes; j += 32) {
            float v = ldx<DT>(logits, o + j);
            if (v == v && (am < 0 || v > m)) { m = v; am = j; }
        }
        for (int off = 16; off > 0; off >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, off);
            int a2 = __shfl_xor_sync(0xffffffffu, am, off);
            if (a2 >= 0 && (am < 0 || m2 > m || (m2 == m && a2 < am))) { m = m2; am = a2; }
        }
        float v0 = __shfl_sync(0xffffffffu, lane == 0 ? ldx<DT>(logits, o) : 0.0f, 0);
        if (v0 != v0) { m = v0; am = 0; }
        float s = 0.0f;
        for (int j = lane; j < classes; j += 32) s += expf(ldx<DT>(logits, o + j) - m);
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (GRAD) {
            float inv = 1.0f / s;
            for (int j = lane; j < classes; j += 32) {
                float p = expf(ldx<DT>(logits, o + j) - m) * inv;
                float g = lab_ok ? gs * (p - (j == lab ? 1.0f : 0.0f)) : __int_as_float(0x7fc00000);
                stx<DT>(dlogits, o + j, g);
            }
        }
        if (lane == 0) {
            if (lab_ok) {
                float lse = logf(s);
                wl += (double)(lse - (ldx<DT>(logits, o + lab) - m));
                wh += am == lab;
            } else {
                wl += (double)__int_as_float(0x7fc00000);
            }
        }
    }
    if (lane == 0) { sl[warp] = wl; sh[warp] = wh; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double a = 0.0, b = 0.0;
        for (int w = 0; w < CE_WARPS; w++) { a += sl[w]; b += sh[w]; }
        part[2 * blockIdx.x] = a;
        part[2 * blockIdx.x + 1] = b;
    }
}

__global__ void k_ce_fin(int nb, const double *part, float *out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double a = 0.0, b = 0.0;
    for (int i = 0; i < nb; i++) { a += part[2 * i]; b += part[2 * i + 1]; }
    out[0] += (float)a;
    out[1] += (float)b;
}

static int softmax_common(tq_backend *be, const char *op, int n, int classes, tq_dtype dt,
                          void *dlogits, const void *logits, const int32_t *labels,
                          float grad_scale, const tq_dstep_state *st, int accum, float *out) {
    if (!tqc_dt_ok(dt) || n < 0 || classes <= 0 || (n > 0 && (!logits || !labels))) {
        tq_backend_seterr(be, "%s: bad arguments (dt=%d n=%d classes=%d logits=%p labels=%p)", op,
                          (int)dt, n, classes, logits, (const void *)labels);
        return TQ_EINVAL;
    }
    if (n == 0) return TQ_OK;
    int nb = (n + CE_WARPS - 1) / CE_WARPS;
    if (nb > CE_MAX_BLOCKS) nb = CE_MAX_BLOCKS;
    double *part = (double *)tqc(be)->scratch;
    float gs = grad_scale / (float)n;
    cudaStream_t strm = tqc(be)->stream;
    if (dlogits && st)
        TQC_DT_SWITCH(dt, DT, (k_softmax_ce<DT, 1, 1><<<nb, CE_WARPS * 32, 0, strm>>>(
                                  n, classes, dlogits, logits, labels, 0.0f, st, accum, part)));
    else if (dlogits)
        TQC_DT_SWITCH(dt, DT, (k_softmax_ce<DT, 1, 0><<<nb, CE_WARPS * 32, 0, strm>>>(
                                  n, classes, dlogits, logits, labels, gs, NULL, 1, part)));
    else
        TQC_DT_SWITCH(dt, DT, (k_softmax_ce<DT, 0, 0><<<nb, CE_WARPS * 32, 0, strm>>>(
                                  n, classes, NULL, logits, labels, 0.0f, NULL, 1, part)));
    TQC_LAUNCH_CHECK(be);
    if (out) {
        k_ce_fin<<<1, 32, 0, strm>>>(nb, part, out);
        TQC_LAUNCH_CHECK(be);
    }
    return TQ_OK;
}

extern "C" int tqc_softmax_ce(tq_backend *be, int n, int classes, tq_dtype dt, void *dlogits,
                              const void *logits, const int32_t *labels, float grad_scale,
                              float *out) {
    if (!dlogits && n > 0) {
        tq_backend_seterr(be, "softmax_ce: dlogits missing");
        return TQ_EINVAL;
    }
    return softmax_common(be, "softmax_ce", n, classes, dt, dlogits, logits, labels, grad_scale,
                          NULL, 1, out);
}

extern "C" int tqc_softmax_ce_dyn(tq_backend *be, int n, int classes, tq_dtype dt, void *dlogits,
                                  const void *logits, const int32_t *labels,
                                  const tq_dstep_state *st, int accum, float *out) {
    if ((!dlogits && n > 0) || !st || accum < 1) {
        tq_backend_seterr(be, "softmax_ce_dyn: %s", !st ? "no step state" : accum < 1 ? "accum < 1"
                                                                                       : "dlogits missing");
        return TQ_EINVAL;
    }
    return softmax_common(be, "softmax_ce_dyn", n, classes, dt, dlogits, logits, labels, 0.0f, st,
                          accum, out);
}

extern "C" int tqc_softmax_ce_eval(tq_backend *be, int n, int classes, tq_dtype dt,
                                   const void *logits, const int32_t *labels, float *out) {
    return softmax_common(be, "softmax_ce_eval", n, classes, dt, NULL, logits, labels, 0.0f, NULL, 1,
                          out);
}
