/* cuda_data.cu — the batch loader of the CUDA backend: gather, augment, normalise.
 *
 * Contract (same semantics as kernels/cpu/cpu_pool.c's tq_cpu_load_batch)
 * - x[i] = normalize(augment(images[idx[i]])) in dtype dt, labels[i] = lab[idx[i]] (int32).
 *   images, lab, idx, aug, x and labels are device pointers; mean and inv_std are HOST arrays
 *   of c <= 4 floats, copied into the kernel's arguments (no upload, no sync).
 * - Augmentation: output pixel (y, x) of sample i reads source pixel
 *   (y + dy − pad, x' + dx − pad), x' = flip ? w−1−x : x, a zero pixel outside the image; a
 *   zero pixel is normalised like any other. One thread per output element (coalesced writes).
 * - idx lives on the device and is not checked on the host (that would need a sync): a sample
 *   whose index is negative gets NaN pixels and label −1 (which softmax_ce turns into a NaN
 *   loss), never an out-of-bounds read below the images. Indices past the end of the dataset
 *   cannot be detected here: the caller (the trainer's permutation) guarantees them.
 * - Errors: TQ_EINVAL naming the op and argument; launch failures TQ_EDEVICE.
 */
#include "cuda/cuda_kern.cuh"

#define LB_MAXC 4

typedef struct { float mean[LB_MAXC], inv_std[LB_MAXC]; } lb_norm;

template <int DT>
__global__ void k_load_batch(int n, int h, int w, int c, void *x, int32_t *labels,
                             const uint8_t *images, const uint8_t *lab, const int32_t *idx,
                             const tq_aug *aug, int pad, lb_norm nm) {
    const size_t img_sz = (size_t)h * w * c, total = (size_t)n * img_sz;
    TQC_FOR(i, total) {
        size_t t = i / c;
        int ch = (int)(i - t * c);
        int xx = (int)(t % w);
        t /= w;
        int yy = (int)(t % h);
        int s = (int)(t / h);
        int id = idx[s];
        if (id < 0) {
            stx<DT>(x, i, __int_as_float(0x7fc00000));
            continue;
        }
        int sy = yy, sx = xx;
        if (aug) {
            tq_aug a = aug[s];
            sy = yy + a.dy - pad;
            sx = (a.flip ? w - 1 - xx : xx) + a.dx - pad;
        }
        int in = sy >= 0 && sy < h && sx >= 0 && sx < w;
        uint8_t px = in ? images[(size_t)id * img_sz + ((size_t)sy * w + sx) * c + ch] : 0;
        float mean = nm.mean[0], is = nm.inv_std[0];
        for (int k = 1; k < LB_MAXC; k++)       /* no dynamic indexing of the parameter arrays */
            if (ch == k) { mean = nm.mean[k]; is = nm.inv_std[k]; }
        stx<DT>(x, i, tq_normalize_px(px, mean, is));
    }
    if (labels && lab) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)n;
             i += (size_t)gridDim.x * blockDim.x) {
            int id = idx[i];
            labels[i] = id < 0 ? -1 : (int32_t)lab[id];
        }
    }
}

extern "C" int tqc_load_batch(tq_backend *be, int n, int h, int w, int c, tq_dtype dt, void *x,
                              int32_t *labels, const uint8_t *images, const uint8_t *lab,
                              const int32_t *idx, const tq_aug *aug, int pad, const float *mean,
                              const float *inv_std) {
    if (!tqc_dt_ok(dt) || n < 0 || h <= 0 || w <= 0 || c <= 0 || pad < 0 || !mean ||
        !inv_std || (n > 0 && (!x || !images || !idx))) {
        tq_backend_seterr(be, "load_batch: bad arguments (dt=%d n=%d h=%d w=%d c=%d pad=%d)",
                          (int)dt, n, h, w, c, pad);
        return TQ_EINVAL;
    }
    if (c > LB_MAXC) {
        tq_backend_seterr(be, "load_batch: c=%d channels, the CUDA loader takes at most %d", c,
                          LB_MAXC);
        return TQ_EINVAL;
    }
    if (n == 0) return TQ_OK;
    lb_norm nm;
    for (int k = 0; k < LB_MAXC; k++) {
        nm.mean[k] = k < c ? mean[k] : 0.0f;
        nm.inv_std[k] = k < c ? inv_std[k] : 1.0f;
    }
    size_t total = (size_t)n * h * w * c;
    unsigned nb = tqc_blocks(total, TQC_THREADS);
    TQC_DT_SWITCH(dt, DT, (k_load_batch<DT><<<nb, TQC_THREADS, 0, tqc(be)->stream>>>(
                              n, h, w, c, x, labels, images, lab, idx, aug, pad, nm)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}
