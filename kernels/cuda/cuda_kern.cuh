/* cuda_kern.cuh — device helpers shared by the CUDA backend's kernels (cuda_*.cu only).
 *
 * Contract
 * - Include this first in every cuda_*.cu: it pulls in backend.h with C linkage (backend.h has
 *   no extern "C" guard of its own, and tq_backend_seterr is defined in C), then
 *   cuda_internal.h. Nothing here allocates or owns memory; everything is inline or a template.
 * - Storage dtypes: ldx<DT>/stx<DT> load/store one element as f32. f16 uses the hardware
 *   conversions (__half2float is exact; __float2half_rn is IEEE round-to-nearest-even with
 *   overflow to inf and gradual underflow, bit-identical to tq_f32_to_f16 for every non-NaN
 *   input); bf16 uses tq_common.h's integer rounding, so nothing needs sm_80. A NaN stays a NaN
 *   (its payload may differ from the CPU's).
 * - TQC_DT_SWITCH(dt, DT, stmt) runs stmt with `DT` a compile-time dtype; host-side only.
 * - Reduction geometry (tqc_ctile): a block of TQC_RED_THREADS threads is a TC × RL grid,
 *   TC channel lanes (a power of two ≤ 32, ≥ min(C, 32)) × RL = 256/TC row lanes; consecutive
 *   threads read consecutive channels of one row, so loads are coalesced along C. Geometry
 *   depends only on the shape, never on the device, so results are reproducible everywhere.
 */
#ifndef TQ_CUDA_KERN_CUH
#define TQ_CUDA_KERN_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
}
#include "cuda/cuda_internal.h"

#define TQC_THREADS 256          /* element-wise kernels */
#define TQC_RED_THREADS 256      /* channel reductions and per-channel element passes */

static inline int tqc_dt_ok(tq_dtype dt) { return dt == TQ_F32 || dt == TQ_F16 || dt == TQ_BF16; }

/* Sets the error "<op>: bad dtype" and returns TQ_EINVAL when dt is not a storage dtype. */
static inline int tqc_check_dt(tq_backend *be, const char *op, const char *arg, tq_dtype dt) {
    if (tqc_dt_ok(dt)) return TQ_OK;
    tq_backend_seterr(be, "%s: bad dtype %d for %s", op, (int)dt, arg);
    return TQ_EINVAL;
}
static inline int tqc_check_shape(tq_backend *be, const char *op, tq_shape s, tq_dtype dt) {
    if (tqc_check_dt(be, op, "dt", dt)) return TQ_EINVAL;
    if (s.n <= 0 || s.h <= 0 || s.w <= 0 || s.c <= 0) {
        tq_backend_seterr(be, "%s: bad shape (%d,%d,%d,%d)", op, s.n, s.h, s.w, s.c);
        return TQ_EINVAL;
    }
    return TQ_OK;
}
#define TQC_NEED(be, op, ptr)                                                  \
    do {                                                                       \
        if (!(ptr)) {                                                          \
            tq_backend_seterr((be), "%s: %s is NULL", (op), #ptr);             \
            return TQ_EINVAL;                                                  \
        }                                                                      \
    } while (0)

#define TQC_DT_SWITCH(dt, DTNAME, ...)                                         \
    do {                                                                       \
        if ((dt) == TQ_F32) { const int DTNAME = TQ_F32; __VA_ARGS__; }        \
        else if ((dt) == TQ_F16) { const int DTNAME = TQ_F16; __VA_ARGS__; }   \
        else { const int DTNAME = TQ_BF16; __VA_ARGS__; }                      \
    } while (0)

template <int DT> __device__ __forceinline__ float ldx(const void *p, size_t i) {
    if (DT == TQ_F32) return ((const float *)p)[i];
    if (DT == TQ_F16) return __half2float(((const __half *)p)[i]);
    return tq_bf16_to_f32(((const uint16_t *)p)[i]);
}
template <int DT> __device__ __forceinline__ void stx(void *p, size_t i, float v) {
    if (DT == TQ_F32) ((float *)p)[i] = v;
    else if (DT == TQ_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((uint16_t *)p)[i] = tq_f32_to_bf16(v);
}

/* grid-stride loop over [0, n) */
#define TQC_FOR(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- per-channel geometry ---- */
typedef struct {
    int tc, rl;          /* channel lanes (power of two ≤ 32), row lanes: tc·rl = 256 */
    unsigned gx;         /* channel tiles: ceil(C / tc) */
} tqc_ctile;
static inline tqc_ctile tqc_ctile_of(int C) {
    tqc_ctile t;
    t.tc = 1;
    while (t.tc < C && t.tc < 32) t.tc *= 2;
    t.rl = TQC_RED_THREADS / t.tc;
    t.gx = (unsigned)((C + t.tc - 1) / t.tc);
    return t;
}
/* Row-chunk count for the element passes over m rows: about 2048 blocks in all. */
static inline unsigned tqc_rows_grid(size_t m, tqc_ctile t) {
    size_t want = (m + t.rl - 1) / t.rl;
    size_t cap = 2048 / t.gx;
    if (cap < 1) cap = 1;
    if (want > cap) want = cap;
    if (want > 65535) want = 65535;
    return want ? (unsigned)want : 1u;
}

#endif
