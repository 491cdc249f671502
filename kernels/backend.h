/* backend.h — the op interface every compute backend implements (cf. ggml's backend_i,
 * SQLite's sqlite3_io_methods).
 *
 * Contract
 * - Layout is NHWC for activations; conv weights are KRSC ([out][kh][kw][in]); linear weights
 *   are [out][in]. Activations, activation gradients and the working weight copy are stored in
 *   the op's dtype `dt` (f32, f16 or bf16); everything else (bias, batch-norm parameters and
 *   statistics, weight gradients, optimizer state, loss) is f32. Arithmetic is f32.
 * - Pointers are device pointers of this backend (host memory for the CPU backend). Ops are
 *   enqueued in order on the backend's one stream; `sync` waits for them.
 * - `beta` on a gradient output: 0 overwrites it, 1 adds to it (a tensor with several
 *   consumers receives several contributions). Weight/bias gradients are always added (they are
 *   zeroed once per optimizer step).
 * - Workspace: each op that needs scratch says how much through `*_ws`; the caller (the memory
 *   planner) passes at least that much. Ops never allocate.
 * - Errors: ops return 0 or a negative TQ_E* status with a message in be->err (tq_backend_seterr);
 *   they never exit(). One backend object is used by one thread.
 * - The CPU backend splits work over its own OpenMP threads and pins OpenBLAS to one thread
 *   (two spinning thread pools on the same cores are ~25x slower); its conv workspace depends
 *   on be->threads, so plan after creating the backend and do not change threads afterwards.
 * - NaN propagates through relu and max-pool (as in PyTorch), so an fp16 overflow anywhere
 *   reaches the inf check over the gradients.
 */
#ifndef TQ_BACKEND_H
#define TQ_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "common/tq_common.h"

enum { TQ_OK = 0, TQ_EINVAL = -1, TQ_ENOMEM = -2, TQ_EIO = -3, TQ_EDATA = -4, TQ_EDEVICE = -5,
       TQ_ECANCEL = -6, TQ_ENOSPC = -7 /* a write found its filesystem full (ENOSPC, EDQUOT) */ };

typedef struct { int n, h, w, c; } tq_shape;        /* NHWC */
static inline size_t tq_shape_numel(tq_shape s) { return (size_t)s.n * s.h * s.w * s.c; }

typedef struct {
    tq_shape x;          /* input shape */
    int k, r, s;         /* output channels, kernel height, kernel width */
    int stride, pad;     /* same in both spatial dims */
} tq_conv_desc;
static inline int tq_conv_out(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }
static inline tq_shape tq_conv_yshape(const tq_conv_desc *d) {
    tq_shape y = { d->x.n, tq_conv_out(d->x.h, d->r, d->stride, d->pad),
                   tq_conv_out(d->x.w, d->s, d->stride, d->pad), d->k };
    return y;
}

/* Augmentation of one sample: crop offset (dy,dx) into the zero-padded image, then flip. */
typedef struct { int16_t dy, dx; uint8_t flip; } tq_aug;

typedef struct tq_backend tq_backend;

typedef struct tq_backend_i {
    const char *name;

    /* memory */
    void *(*alloc)(tq_backend *, size_t bytes);          /* NULL on failure */
    void (*free)(tq_backend *, void *p);
    void (*memset0)(tq_backend *, void *p, size_t bytes);
    void (*to_device)(tq_backend *, void *dst, const void *src, size_t bytes);
    void (*to_host)(tq_backend *, void *dst, const void *src, size_t bytes);
    void (*copy)(tq_backend *, void *dst, const void *src, size_t bytes);
    void (*sync)(tq_backend *);
    double (*now_ms)(tq_backend *);                      /* after sync: wall time */
    /* device memory as the driver sees it (cudaMemGetInfo); -1 where there is no such thing */
    int (*mem_info)(tq_backend *, size_t *free_bytes, size_t *total_bytes);
    void (*destroy)(tq_backend *);                       /* frees ctx; tq_backend_free calls it */

    /* convolution: y = conv(x, w) + bias (bias may be NULL) */
    size_t (*conv_ws)(tq_backend *, const tq_conv_desc *, tq_dtype dt);   /* max over fwd/bwd */
    int (*conv_fwd)(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *y, const void *x,
                    const void *w, const float *bias, void *ws, size_t ws_bytes);
    int (*conv_bwd_data)(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *dx, float beta,
                         const void *dy, const void *w, void *ws, size_t ws_bytes);
    int (*conv_bwd_filter)(tq_backend *, const tq_conv_desc *, tq_dtype dt, float *dw, float *db,
                           const void *x, const void *dy, void *ws, size_t ws_bytes);

    /* linear: y[n][out] = x[n][in] · w[out][in]^T + bias */
    size_t (*linear_ws)(tq_backend *, int n, int in, int out, tq_dtype dt);
    int (*linear_fwd)(tq_backend *, int n, int in, int out, tq_dtype dt, void *y, const void *x,
                      const void *w, const float *bias, void *ws, size_t ws_bytes);
    int (*linear_bwd_data)(tq_backend *, int n, int in, int out, tq_dtype dt, void *dx, float beta,
                           const void *dy, const void *w, void *ws, size_t ws_bytes);
    int (*linear_bwd_filter)(tq_backend *, int n, int in, int out, tq_dtype dt, float *dw,
                             float *db, const void *x, const void *dy, void *ws, size_t ws_bytes);

    /* batch-norm over N·H·W per channel. Training: batch statistics (biased variance for the
     * normalisation), saves mean and 1/sqrt(var+eps), updates running stats with `momentum`
     * and the unbiased variance. Inference: running statistics. Fused epilogue: with res,
     * y = round(bn(x)) + res (add_fwd's numbers); with relu, then max(y, 0) (relu_fwd's):
     * what the separate ops would store, bit for bit, in one pass. */
    int (*bn_fwd_train)(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x,
                        const float *gamma, const float *beta, float *save_mean,
                        float *save_invstd, float *run_mean, float *run_var, float momentum,
                        float eps, const void *res, int relu);
    int (*bn_fwd_infer)(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x,
                        const float *gamma, const float *beta, const float *run_mean,
                        const float *run_var, float eps, const void *res, int relu);
    /* y = (x − mean)·invstd·γ + β with given (saved) statistics, rounded to dt, plus res when
     * res is not NULL (then rounded again), then max(y, 0) when relu: bit for bit what the
     * training forward's bn (→ add) → relu chain stored, so that the backward can recompute
     * such an output instead of keeping it (train/graph.c). */
    int (*bn_norm)(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x, const void *res,
                   const float *gamma, const float *beta, const float *mean, const float *invstd,
                   int relu);
    /* The backward, with the forward epilogue's backward fused in front: with relu_y, dy is
     * the gradient of that ReLU's output relu_y and counts as 0 where relu_y <= 0 (relu_bwd's
     * rule: a NaN passes); with dres (needs relu_y and dx), the add's other input gets that
     * gradient too, dres = g + beta_dres·dres. Bit for bit relu_bwd → the add's two
     * accumulates → bn_bwd, with neither intermediate gradient stored. dx may be NULL (only
     * dγ, dβ). */
    int (*bn_bwd)(tq_backend *, tq_shape, tq_dtype dt, void *dx, float beta_dx, float *dgamma,
                  float *dbeta, const void *dy, const void *x, const float *gamma,
                  const float *save_mean, const float *save_invstd, const void *relu_y,
                  void *dres, float beta_dres);

    /* element-wise */
    int (*relu_fwd)(tq_backend *, size_t n, tq_dtype dt, void *y, const void *x);
    int (*relu_bwd)(tq_backend *, size_t n, tq_dtype dt, void *dx, float beta, const void *dy,
                    const void *y);
    int (*add_fwd)(tq_backend *, size_t n, tq_dtype dt, void *y, const void *a, const void *b);
    int (*accumulate)(tq_backend *, size_t n, tq_dtype dt, void *dst, float beta, const void *src);

    /* pooling: max 2×2 stride 2 (backward recomputes the argmax from x), global average.
     * relu: y = relu(maxpool(x)), which is maxpool(relu(x)) bit for bit (NaN included), and
     * the backward passes dy to the argmax only where that y > 0 or is NaN: relu_bwd ∘
     * maxpool_bwd of the unfused pair, without the ReLU's tensors (train/graph.c). */
    int (*maxpool_fwd)(tq_backend *, tq_shape x, tq_dtype dt, void *y, const void *xp, int relu);
    int (*maxpool_bwd)(tq_backend *, tq_shape x, tq_dtype dt, void *dx, float beta,
                       const void *dy, const void *xp, int relu);
    int (*avgpool_fwd)(tq_backend *, tq_shape x, tq_dtype dt, void *y, const void *xp);
    int (*avgpool_bwd)(tq_backend *, tq_shape x, tq_dtype dt, void *dx, float beta,
                       const void *dy);

    /* softmax cross-entropy, forward and backward in one: out[0] += Σ loss_i (f32, unscaled,
     * not divided by n), out[1] += number of argmax hits; dlogits = grad_scale·(p − onehot)/n
     * where grad_scale = loss_scale / accum_steps. */
    int (*softmax_ce)(tq_backend *, int n, int classes, tq_dtype dt, void *dlogits,
                      const void *logits, const int32_t *labels, float grad_scale, float *out);
    /* evaluation: out[0] += Σ loss_i, out[1] += hits */
    int (*softmax_ce_eval)(tq_backend *, int n, int classes, tq_dtype dt, const void *logits,
                           const int32_t *labels, float *out);

    /* casts and the flat-buffer passes */
    int (*cast)(tq_backend *, size_t n, tq_dtype dst_dt, void *dst, tq_dtype src_dt, const void *src);
    /* g *= inv_scale; *found_inf = 1 (f32 on the device) when any g is inf/NaN */
    int (*unscale_check)(tq_backend *, size_t n, float *g, float inv_scale, float *found_inf);
    /* One optimizer step over the flat buffers. skip: NULL, or a flag in the backend's memory
     * (unscale_check's found_inf): when it is nonzero the step leaves w and the state as they
     * are (a loss-scale overflow), decided where the data lives, without a host sync.
     * wlow: NULL, or the copy of w in wdt that AMP's forward reads: the same pass writes
     * wlow[i] = w[i] after the update, rounded as cast rounds, so that no second pass over the
     * weights is needed (a skipped step writes nothing: wlow already holds the kept weights). */
    int (*sgd_step)(tq_backend *, size_t n, float *w, const float *g, float *buf, float lr,
                    float momentum, float wd, int nesterov, const float *skip, void *wlow,
                    tq_dtype wdt);
    int (*adamw_step)(tq_backend *, size_t n, float *w, const float *g, float *m, float *v,
                      float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                      const float *skip, void *wlow, tq_dtype wdt);

    /* data: x[i] = normalize(augment(images[idx[i]])) as dt, labels[i] = lab[idx[i]].
     * images are uint8 HWC of shape (h,w,c); aug may be NULL (no augmentation); pad is the
     * crop padding (zero pixels). mean and inv_std are HOST arrays of c floats (c <= 4),
     * passed by value to the device. */
    int (*load_batch)(tq_backend *, int n, int h, int w, int c, tq_dtype dt, void *x,
                      int32_t *labels, const uint8_t *images, const uint8_t *lab,
                      const int32_t *idx, const tq_aug *aug, int pad, const float *mean,
                      const float *inv_std);

    /* ---- the step on the device (spec cuda_graphs: train/trainer.c, docs/engine.md) ----
     * softmax_ce, unscale_check, sgd_step and adamw_step with the loss scale, the learning rate
     * and AdamW's bias corrections read from the backend's memory (kernels/common's
     * tq_dstep_state / tq_dstep_in) when the op runs, not passed when it is issued, with the
     * arithmetic of the plain ops bit for bit: grad_scale = tq_dstep_grad_scale(st->scale,
     * accum), inv_scale = tq_dstep_inv_scale(st->scale), lr = in->lr, (bc1, bc2) =
     * tq_dstep_bc(in, st). A captured step then replays with each step's values. */
    int (*softmax_ce_dyn)(tq_backend *, int n, int classes, tq_dtype dt, void *dlogits,
                          const void *logits, const int32_t *labels, const tq_dstep_state *st,
                          int accum, float *out);
    int (*unscale_check_dyn)(tq_backend *, size_t n, float *g, const tq_dstep_state *st,
                             float *found_inf);
    int (*sgd_step_dyn)(tq_backend *, size_t n, float *w, const float *g, float *buf,
                        const tq_dstep_in *in, float momentum, float wd, int nesterov,
                        const float *skip, void *wlow, tq_dtype wdt);
    int (*adamw_step_dyn)(tq_backend *, size_t n, float *w, const float *g, float *m, float *v,
                          const tq_dstep_in *in, const tq_dstep_state *st, float b1, float b2,
                          float eps, float wd, const float *skip, void *wlow, tq_dtype wdt);
    /* after the optimizer: tq_dstep_end(st, fp16, found_inf && *found_inf != 0, ...) — the
     * used scale kept, a step not skipped counted, under fp16 the loss scale and its growth
     * tracker moved as tq_scaler_update says; found_inf: unscale_check's flag or NULL */
    int (*step_end)(tq_backend *, tq_dstep_state *st, const float *found_inf, int fp16,
                    float growth, float backoff, int interval);

    /* CUDA graphs. graph_begin puts the backend's stream into capture mode: the ops issued
     * until graph_end are recorded, not run (nothing else may touch the backend meanwhile:
     * no transfer, sync, alloc or free). graph_end(keep 1) ends the capture and instantiates
     * it into *graph; graph_end(keep 0) ends it and discards it (after an op failed while
     * capturing). graph_launch runs a graph on the stream, in order with the other ops;
     * graph_free frees one (NULL: nothing). The CPU backend has no graphs: graph_begin,
     * graph_end and graph_launch fail with TQ_EINVAL. */
    int (*graph_begin)(tq_backend *);
    int (*graph_end)(tq_backend *, int keep, void **graph);
    int (*graph_launch)(tq_backend *, void *graph);
    void (*graph_free)(tq_backend *, void *graph);

    /* Reading a few results without waiting for the stream: fetch_begin enqueues a copy of
     * `bytes` (<= TQ_FETCH_BYTES; 0: none) from the backend's memory into host slot `slot`
     * (< TQ_FETCH_SLOTS) and marks the time there; fetch_end waits for that, copies the bytes
     * into dst and gives the mark's time in ms on now_ms's clock. A slot is reused only after
     * its fetch_end. */
    int (*fetch_begin)(tq_backend *, int slot, const void *src, size_t bytes);
    int (*fetch_end)(tq_backend *, int slot, void *dst, size_t bytes, double *t_ms);
} tq_backend_i;

#define TQ_FETCH_SLOTS 4
#define TQ_FETCH_BYTES 256

struct tq_backend {
    const tq_backend_i *i;
    void *ctx;                   /* backend-private */
    size_t bytes_live, bytes_peak; /* what alloc/free have handed out */
    size_t bytes_limit;          /* 0: none; else alloc refuses to hand out more than this in all
                                  * (a job's planned share of a device shared with other jobs) */
    int threads;
    void *prof;                  /* train/profile.c's state while it times this backend's ops */
    char err[256];
    unsigned nerr;               /* times err was set: memset0 and to_device return nothing, so
                                  * their callers compare it before and after to see a failure */
};

/* The index of the first NULL operation in i (counting the function pointers after `name`), or
 * -1 when every operation is there: a backend must implement them all. */
static inline int tq_backend_i_missing(const tq_backend_i *i) {
    typedef void (*fn)(void);
    const size_t first = offsetof(tq_backend_i, alloc), n = (sizeof *i - first) / sizeof(fn);
    for (size_t k = 0; k < n; k++) {
        fn f;
        memcpy(&f, (const char *)i + first + k * sizeof(fn), sizeof f);
        if (!f) return (int)k;
    }
    return -1;
}

/* 1 when handing out `bytes` more would pass be->bytes_limit; sets be->err saying so. The
 * backends' alloc calls it first: a job that outgrows its planned share fails alone with an
 * allocation error instead of taking memory its neighbours were promised. */
int tq_backend_over_limit(tq_backend *be, size_t bytes);

/* The CPU backend (always built). threads <= 0: OpenMP's default. */
tq_backend *tq_cpu_backend_new(int threads);
void tq_backend_free(tq_backend *);             /* any backend: calls i->destroy, then frees */
void tq_backend_seterr(tq_backend *, const char *fmt, ...);
/* tests only: a definition returning 1 makes the CPU backend's next to_device fail */
int tq_cpu_to_device_fails(void);
/* tests only: a definition returning ≥ 0 makes the CPU backend's mem_info report that many
 * bytes free, as a GPU's does */
long long tq_cpu_device_free(void);

/* The CUDA backend (kernels/cuda; kernels/nocuda.c in a build without nvcc).
 * tq_cuda_backend_new: device ordinal `device`; `benchmark` = cudnn_benchmark (time the best
 * few cuDNN plans once per shape); `deterministic` = spec deterministic (only cuDNN engines
 * that give the same bits every run: no atomics). NULL on failure with a one-line reason in why[]
 * (no driver, no device, ordinal out of range, out of memory, built without CUDA). */
typedef struct {
    int ordinal;
    char name[96];
    int sm;                       /* compute capability major*10 + minor */
    size_t total_bytes, free_bytes;
    char pci_bus_id[32];          /* "00000000:3b:00.0": how NVML names the same GPU */
    int compute_mode;             /* cudaComputeMode (0 default, 2 prohibited, 3 exclusive process), -1 unknown */
} tq_cuda_devinfo;
int tq_cuda_built(void);                        /* 1 when this binary has the CUDA backend */
/* Fills up to `max` entries; returns the device count (0 when none) or -1 with why[] set. */
int tq_cuda_devices(tq_cuda_devinfo *out, int max, char *why, size_t why_len);
tq_backend *tq_cuda_backend_new(int device, int benchmark, int deterministic, char *why, size_t why_len);
/* TF32 for f32 data (as PyTorch's torch.backends.cudnn.allow_tf32 / cuda.matmul.allow_tf32):
 * TQ_TF32_CONV_OK lets cuDNN run f32 convolutions on tensor-core (TF32) engines,
 * TQ_TF32_MATMUL_OK runs f32 cuBLASLt GEMMs with CUBLAS_COMPUTE_32F_FAST_TF32. 16-bit data is
 * not affected. tq_cuda_backend_new is tq_cuda_backend_open with tf32 0: exact f32. */
enum { TQ_TF32_CONV_OK = 1, TQ_TF32_MATMUL_OK = 2 };
typedef struct { int device, benchmark, deterministic; unsigned tf32; } tq_cuda_opts;
tq_backend *tq_cuda_backend_open(const tq_cuda_opts *opts, char *why, size_t why_len);
/* 1 when this thread's last tq_cuda_backend_open failed because the GPU is busy now (out of
 * memory creating the context or the backend's buffers, or another process holds a GPU in an
 * exclusive compute mode): a failure that may pass. 0 otherwise (no driver, no such device). */
int tq_cuda_open_busy(void);
const char *tq_cuda_backend_name(tq_backend *);  /* the GPU's name; NULL for other backends */

#endif
