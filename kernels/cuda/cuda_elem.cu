/* cuda_elem.cu — element-wise ops of the CUDA backend: relu forward/backward, add, accumulate,
 * cast, and the conv/linear helpers add_to_f32 and bias_add.
 *
 * Contract (same semantics as kernels/cpu/cpu_elem.c)
 * - One thread per element in grid-stride loops of TQC_THREADS-thread blocks; the dtype is a
 *   template parameter (one instantiation per dtype, no per-element dispatch).
 * - beta == 0 never reads the destination (a NaN there must not leak through 0·NaN):
 *   accumulate with beta 0 is a device-to-device copy, the others are separate instantiations.
 * - relu(NaN) = NaN; its backward passes dy where y is NaN (dx = y <= 0 ? 0 : dy), as PyTorch.
 * - Casts between equal dtypes are a copy; others load as f32 and round once on store.
 * - Errors: TQ_EINVAL naming the op and argument; launch failures TQ_EDEVICE.
 */
#include "cuda/cuda_kern.cuh"

#define GRID(n) tqc_blocks((n), TQC_THREADS), TQC_THREADS, 0, tqc(be)->stream

template <int DT> __global__ void k_relu(size_t n, void *y, const void *x) {
    TQC_FOR(i, n) {
        float v = ldx<DT>(x, i);
        stx<DT>(y, i, v <= 0.0f ? 0.0f : v);
    }
}

extern "C" int tqc_relu_fwd(tq_backend *be, size_t n, tq_dtype dt, void *y, const void *x) {
    if (tqc_check_dt(be, "relu_fwd", "dt", dt)) return TQ_EINVAL;
    if (!n) return TQ_OK;
    TQC_NEED(be, "relu_fwd", y);
    TQC_NEED(be, "relu_fwd", x);
    TQC_DT_SWITCH(dt, DT, (k_relu<DT><<<GRID(n)>>>(n, y, x)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

template <int DT, int ACC>
__global__ void k_relu_bwd(size_t n, void *dx, float beta, const void *dy, const void *y) {
    TQC_FOR(i, n) {
        float yv = ldx<DT>(y, i), g = ldx<DT>(dy, i);
        float v = yv <= 0.0f ? 0.0f : g;
        if (ACC) v = v + beta * ldx<DT>(dx, i);
        stx<DT>(dx, i, v);
    }
}

extern "C" int tqc_relu_bwd(tq_backend *be, size_t n, tq_dtype dt, void *dx, float beta,
                            const void *dy, const void *y) {
    if (tqc_check_dt(be, "relu_bwd", "dt", dt)) return TQ_EINVAL;
    if (!n) return TQ_OK;
    TQC_NEED(be, "relu_bwd", dx);
    TQC_NEED(be, "relu_bwd", dy);
    TQC_NEED(be, "relu_bwd", y);
    if (beta == 0.0f) TQC_DT_SWITCH(dt, DT, (k_relu_bwd<DT, 0><<<GRID(n)>>>(n, dx, 0.0f, dy, y)));
    else TQC_DT_SWITCH(dt, DT, (k_relu_bwd<DT, 1><<<GRID(n)>>>(n, dx, beta, dy, y)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

template <int DT> __global__ void k_add(size_t n, void *y, const void *a, const void *b) {
    TQC_FOR(i, n) stx<DT>(y, i, ldx<DT>(a, i) + ldx<DT>(b, i));
}

extern "C" int tqc_add_fwd(tq_backend *be, size_t n, tq_dtype dt, void *y, const void *a,
                           const void *b) {
    if (tqc_check_dt(be, "add_fwd", "dt", dt)) return TQ_EINVAL;
    if (!n) return TQ_OK;
    TQC_NEED(be, "add_fwd", y);
    TQC_NEED(be, "add_fwd", a);
    TQC_NEED(be, "add_fwd", b);
    TQC_DT_SWITCH(dt, DT, (k_add<DT><<<GRID(n)>>>(n, y, a, b)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

/* MODE 1: dst + src; MODE 2: beta·dst + src */
template <int DT, int MODE>
__global__ void k_acc(size_t n, void *dst, float beta, const void *src) {
    TQC_FOR(i, n) {
        float d = ldx<DT>(dst, i), s = ldx<DT>(src, i);
        stx<DT>(dst, i, MODE == 1 ? d + s : beta * d + s);
    }
}

extern "C" int tqc_accumulate(tq_backend *be, size_t n, tq_dtype dt, void *dst, float beta,
                              const void *src) {
    if (tqc_check_dt(be, "accumulate", "dt", dt)) return TQ_EINVAL;
    if (!n) return TQ_OK;
    TQC_NEED(be, "accumulate", dst);
    TQC_NEED(be, "accumulate", src);
    if (beta == 0.0f) {
        if (dst != src)
            TQC_CHECK(be, cudaMemcpyAsync(dst, src, n * tq_dtype_size(dt), cudaMemcpyDeviceToDevice,
                                          tqc(be)->stream));
        return TQ_OK;
    }
    if (beta == 1.0f) TQC_DT_SWITCH(dt, DT, (k_acc<DT, 1><<<GRID(n)>>>(n, dst, 1.0f, src)));
    else TQC_DT_SWITCH(dt, DT, (k_acc<DT, 2><<<GRID(n)>>>(n, dst, beta, src)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

template <int SDT, int DDT> __global__ void k_cast(size_t n, void *dst, const void *src) {
    TQC_FOR(i, n) stx<DDT>(dst, i, ldx<SDT>(src, i));
}

extern "C" int tqc_cast(tq_backend *be, size_t n, tq_dtype dst_dt, void *dst, tq_dtype src_dt,
                        const void *src) {
    if (tqc_check_dt(be, "cast", "dst_dt", dst_dt) || tqc_check_dt(be, "cast", "src_dt", src_dt))
        return TQ_EINVAL;
    if (!n) return TQ_OK;
    TQC_NEED(be, "cast", dst);
    TQC_NEED(be, "cast", src);
    if (dst_dt == src_dt) {
        if (dst != src)
            TQC_CHECK(be, cudaMemcpyAsync(dst, src, n * tq_dtype_size(dst_dt),
                                          cudaMemcpyDeviceToDevice, tqc(be)->stream));
        return TQ_OK;
    }
    TQC_DT_SWITCH(src_dt, SDT,
                  TQC_DT_SWITCH(dst_dt, DDT, (k_cast<SDT, DDT><<<GRID(n)>>>(n, dst, src))));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

template <int DT> __global__ void k_add_to_f32(size_t n, float *dst, const void *src) {
    TQC_FOR(i, n) dst[i] += ldx<DT>(src, i);
}

extern "C" int tqc_add_to_f32(tq_backend *be, size_t n, float *dst, tq_dtype src_dt,
                              const void *src) {
    if (tqc_check_dt(be, "add_to_f32", "src_dt", src_dt)) return TQ_EINVAL;
    if (!n) return TQ_OK;
    TQC_NEED(be, "add_to_f32", dst);
    TQC_NEED(be, "add_to_f32", src);
    TQC_DT_SWITCH(src_dt, DT, (k_add_to_f32<DT><<<GRID(n)>>>(n, dst, src)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

/* y[row][j] += bias[j]: block (32 × 8) = 32 columns of k × 8 rows; grid y strides the rows */
template <int DT>
__global__ void k_bias_add(size_t rows, int k, void *y, const float *bias) {
    int j = blockIdx.x * 32 + threadIdx.x;
    if (j >= k) return;
    float b = bias[j];
    size_t step = (size_t)gridDim.y * blockDim.y;
    for (size_t r = (size_t)blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += step) {
        size_t i = r * k + j;
        stx<DT>(y, i, ldx<DT>(y, i) + b);
    }
}

extern "C" int tqc_bias_add(tq_backend *be, size_t rows, int k, tq_dtype dt, void *y,
                            const float *bias) {
    if (tqc_check_dt(be, "bias_add", "dt", dt)) return TQ_EINVAL;
    if (k <= 0) {
        tq_backend_seterr(be, "bias_add: bad channel count k=%d", k);
        return TQ_EINVAL;
    }
    if (!rows) return TQ_OK;
    TQC_NEED(be, "bias_add", y);
    TQC_NEED(be, "bias_add", bias);
    unsigned gx = (unsigned)((k + 31) / 32);
    size_t gy = (rows + 7) / 8, cap = 4096 / gx ? 4096 / gx : 1;
    if (gy > cap) gy = cap;
    if (gy > 65535) gy = 65535;
    dim3 grid(gx, (unsigned)gy), block(32, 8);
    TQC_DT_SWITCH(dt, DT, (k_bias_add<DT><<<grid, block, 0, tqc(be)->stream>>>(rows, k, y, bias)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}
