/* cuda_pool.cu — max pooling (2×2, stride 2) and global average pooling of the CUDA backend.
 *
 * Contract (same semantics as kernels/cpu/cpu_pool.c)
 * - maxpool: y = (n, h/2, w/2, c), floor; an odd last row/column belongs to no window and gets
 *   a zero gradient. The argmax is the first maximum in row-major window order and a NaN counts
 *   as a maximum (PyTorch's `val > max || isnan(val)`), so NaNs propagate. Forward: one thread
 *   per output element. Backward: one thread per input element, which recomputes the argmax of
 *   its own window from x (no scatter, no atomics, every dx element written exactly once).
 *   relu: y = relu(max) (m <= 0 ? 0 : m) and the argmax gets dy only where m > 0 or is NaN —
 *   the unfused relu → maxpool pair bit for bit (kernels/backend.h).
 * - avgpool: y = (n, 1, 1, c). Forward: one block per (image, channel tile) of the shared
 *   TC × RL layout (cuda_kern.cuh), sums in double, row lanes added in a fixed tree order.
 *   Backward: one thread per input element, dx = dy·(1/(h·w)).
 * - beta == 0 overwrites dx without reading it; otherwise dx = v + beta·dx.
 * - Errors: TQ_EINVAL naming the op and argument; launch failures TQ_EDEVICE.
 */
#include "cuda/cuda_kern.cuh"

#define GRID(n) tqc_blocks((n), TQC_THREADS), TQC_THREADS, 0, tqc(be)->stream

__device__ __forceinline__ int argmax4(const float v[4]) {
    int am = 0;
    float m = v[0];
    for (int k = 1; k < 4; k++)
        if (v[k] > m || v[k] != v[k]) { m = v[k]; am = k; }
    return am;
}

static int pool_check(tq_backend *be, const char *op, tq_shape s, tq_dtype dt) {
    int rc = tqc_check_shape(be, op, s, dt);
    if (rc) return rc;
    if (s.h < 2 || s.w < 2) {
        tq_backend_seterr(be, "%s: input %dx%d is smaller than the 2x2 window", op, s.h, s.w);
        return TQ_EINVAL;
    }
    return TQ_OK;
}

template <int DT, int RELU>
__global__ void k_maxpool_fwd(size_t ny, int H, int W, int C, void *y, const void *x) {
    const int P = H / 2, Q = W / 2;
    const size_t rs = (size_t)W * C;
    TQC_FOR(i, ny) {
        size_t t = i / C;
        int c = (int)(i - t * C);
        int q = (int)(t % Q);
        t /= Q;
        int p = (int)(t % P);
        size_t img = t / P;
        size_t i00 = ((img * H + 2 * p) * W + 2 * q) * C + c;
        float v[4] = { ldx<DT>(x, i00), ldx<DT>(x, i00 + C), ldx<DT>(x, i00 + rs),
                       ldx<DT>(x, i00 + rs + C) };
        float m = v[argmax4(v)];
        stx<DT>(y, i, RELU && m <= 0.0f ? 0.0f : m);
    }
}

extern "C" int tqc_maxpool_fwd(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *xp,
                               int relu) {
    int rc = pool_check(be, "maxpool_fwd", s, dt);
    if (rc) return rc;
    TQC_NEED(be, "maxpool_fwd", y);
    TQC_NEED(be, "maxpool_fwd", xp);
    size_t ny = (size_t)s.n * (s.h / 2) * (s.w / 2) * s.c;
    if (relu) TQC_DT_SWITCH(dt, DT, (k_maxpool_fwd<DT, 1><<<GRID(ny)>>>(ny, s.h, s.w, s.c, y, xp)));
    else TQC_DT_SWITCH(dt, DT, (k_maxpool_fwd<DT, 0><<<GRID(ny)>>>(ny, s.h, s.w, s.c, y, xp)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

template <int DT, int ACC, int RELU>
__global__ void k_maxpool_bwd(size_t nx, int H, int W, int C, void *dx, float beta,
                              const void *dy, const void *x) {
    const int P = H / 2, Q = W / 2;
    const size_t rs = (size_t)W * C;
    TQC_FOR(i, nx) {
        size_t t = i / C;
        int c = (int)(i - t * C);
        int xx = (int)(t % W);
        t /= W;
        int yy = (int)(t % H);
        size_t img = t / H;
        int oh = yy >> 1, ow = xx >> 1;
        float v = 0.0f;
        if (oh < P && ow < Q) {
            size_t i00 = ((img * H + 2 * oh) * W + 2 * ow) * C + c;
            float w4[4] = { ldx<DT>(x, i00), ldx<DT>(x, i00 + C), ldx<DT>(x, i00 + rs),
                            ldx<DT>(x, i00 + rs + C) };
            int k = (yy & 1) * 2 + (xx & 1), am = argmax4(w4);
            if (am == k && !(RELU && w4[am] <= 0.0f))
                v = ldx<DT>(dy, ((img * P + oh) * Q + ow) * C + c);
        }
        if (ACC) v += beta * ldx<DT>(dx, i);
        stx<DT>(dx, i, v);
    }
}

extern "C" int tqc_maxpool_bwd(tq_backend *be, tq_shape s, tq_dtype dt, void *dx, float beta,
                               const void *dy, const void *xp, int relu) {
    int rc = pool_check(be, "maxpool_bwd", s, dt);
    if (rc) return rc;
    TQC_NEED(be, "maxpool_bwd", dx);
    TQC_NEED(be, "maxpool_bwd", dy);
    TQC_NEED(be, "maxpool_bwd", xp);
    size_t nx = tq_shape_numel(s);
#define MAXPOOL_BWD(ACC, RELU, B) \
    TQC_DT_SWITCH(dt, DT, (k_maxpool_bwd<DT, ACC, RELU><<<GRID(nx)>>>(nx, s.h, s.w, s.c, dx, B, dy, xp)))
    if (beta == 0.0f) {
        if (relu) MAXPOOL_BWD(0, 1, 0.0f); else MAXPOOL_BWD(0, 0, 0.0f);
    } else {
        if (relu) MAXPOOL_BWD(1, 1, beta); else MAXPOOL_BWD(1, 0, beta);
    }
#undef MAXPOOL_BWD
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

/* ---- global average pooling ---- */

template <int DT>
__global__ void __launch_bounds__(TQC_RED_THREADS)
k_avgpool_fwd(int n, size_t hw, int C, int tc, void *y, const void *x) {
    __shared__ double sm[TQC_RED_THREADS];
    const int tid = threadIdx.x, lane = tid & (tc - 1), rl = tid / tc, RL = TQC_RED_THREADS / tc;
    const int c = blockIdx.x * tc + lane;
    for (int img = blockIdx.y; img < n; img += gridDim.y) {   /* uniform per block */
        double acc = 0.0;
        if (c < C) {
            size_t base = (size_t)img * hw * C + c;
            for (size_t r = rl; r < hw; r += RL) acc += (double)ldx<DT>(x, base + r * C);
        }
        sm[tid] = acc;
        __syncthreads();
        for (int st = RL / 2; st > 0; st >>= 1) {
            if (rl < st) sm[tid] += sm[tid + st * tc];
            __syncthreads();
        }
        if (rl == 0 && c < C) stx<DT>(y, (size_t)img * C + c, (float)(sm[tid] / (double)hw));
        __syncthreads();                                       /* sm reused by the next image */
    }
}

extern "C" int tqc_avgpool_fwd(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *xp) {
    int rc = tqc_check_shape(be, "avgpool_fwd", s, dt);
    if (rc) return rc;
    TQC_NEED(be, "avgpool_fwd", y);
    TQC_NEED(be, "avgpool_fwd", xp);
    tqc_ctile t = tqc_ctile_of(s.c);
    dim3 grid(t.gx, (unsigned)(s.n < 65535 ? s.n : 65535));
    size_t hw = (size_t)s.h * s.w;
    TQC_DT_SWITCH(dt, DT, (k_avgpool_fwd<DT><<<grid, TQC_RED_THREADS, 0, tqc(be)->stream>>>(
                              s.n, hw, s.c, t.tc, y, xp)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

template <int DT, int ACC>
__global__ void k_avgpool_bwd(size_t nx, size_t hw, int C, void *dx, float beta, const void *dy,
                              float inv_hw) {
    TQC_FOR(i, nx) {
        size_t t = i / C;
        int c = (int)(i - t * C);
        size_t img = t / hw;
        float v = ldx<DT>(dy, img * C + c) * inv_hw;
        if (ACC) v += beta * ldx<DT>(dx, i);
        stx<DT>(dx, i, v);
    }
}

extern "C" int tqc_avgpool_bwd(tq_backend *be, tq_shape s, tq_dtype dt, void *dx, float beta,
                               const void *dy) {
    int rc = tqc_check_shape(be, "avgpool_bwd", s, dt);
    if (rc) return rc;
    TQC_NEED(be, "avgpool_bwd", dx);
    TQC_NEED(be, "avgpool_bwd", dy);
    size_t nx = tq_shape_numel(s), hw = (size_t)s.h * s.w;
    float inv_hw = (float)(1.0 / ((double)s.h * s.w));
    if (beta == 0.0f)
        TQC_DT_SWITCH(dt, DT, (k_avgpool_bwd<DT, 0><<<GRID(nx)>>>(nx, hw, s.c, dx, 0.0f, dy, inv_hw)));
    else
        TQC_DT_SWITCH(dt, DT, (k_avgpool_bwd<DT, 1><<<GRID(nx)>>>(nx, hw, s.c, dx, beta, dy, inv_hw)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}
