/* cuda_internal.h — what the CUDA backend's translation units share (not a public header).
 *
 * Contract
 * - The tqc_* op functions are the CUDA implementations of tq_backend_i's slots: same
 *   arguments, same semantics as backend.h (beta 0 overwrites / 1 adds, weight grads always
 *   added, f32 params/stats/grads, dt activations, arithmetic in f32 through kernels/common).
 *   cuda_backend.c puts them in the vtable.
 * - Every op is enqueued on ctx->stream and returns without synchronising; nothing allocates
 *   device memory inside an op (scratch comes from the caller's workspace). Host-side caches
 *   (cuDNN plans, cuBLASLt descriptors) are allocated with malloc on first use of a shape.
 * - Errors: a failed CUDA/cuDNN/cuBLAS call sets be->err naming the call, file and line and
 *   the op returns TQ_EDEVICE (TQ_ENOMEM for an allocation, TQ_EINVAL for a bad argument).
 *   Never exit(). Every kernel launch is followed by TQC_LAUNCH_CHECK.
 * - Files: cuda_backend.c (lifecycle, memory, timing, devices, vtable), cuda_conv.c (cuDNN
 *   graph-API convolutions), cuda_linear.c (cuBLASLt), cuda_*.cu (our kernels).
 * - Compiled by nvcc (.cu) and by cc (.c) with the CUDA include path; C linkage throughout.
 */
#ifndef TQ_CUDA_INTERNAL_H
#define TQ_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tqc_conv_cache tqc_conv_cache;   /* cuda_conv.c */
typedef struct tqc_lin_cache tqc_lin_cache;     /* cuda_linear.c */

typedef struct {
    int device;                 /* ordinal */
    int sm;                     /* major*10+minor */
    int benchmark;              /* cudnn_benchmark: time the best few plans per shape */
    int deterministic;          /* spec deterministic: no cuDNN engine noted nondeterministic */
    unsigned tf32;              /* TQ_TF32_CONV_OK | TQ_TF32_MATMUL_OK (backend.h): f32 data only */
    cudaStream_t stream;
    cudaEvent_t ev;             /* now_ms */
    void *cudnn;                /* cudnnHandle_t */
    void *lt;                   /* cublasLtHandle_t */
    tqc_conv_cache *convs;
    tqc_lin_cache *lins;
    size_t total_bytes;
    char name[96];
    /* fixed scratch for our kernels' partial reductions (batch-norm, softmax, inf check),
     * cudaMalloc'd once at creation, TQC_SCRATCH_BYTES long, 256-byte aligned; not counted in
     * be->bytes_live (a fixed overhead of the backend, like the cuDNN handle's). */
    void *scratch;
    /* a stream capture is open (graph_begin .. graph_end): the plan caches plan nothing then
     * (planning may allocate, which a capture refuses), and the calls a capture cannot hold
     * (transfers, syncs, allocations, fetches) are refused with an error naming them */
    int capturing;
} tqc_ctx;
#define TQC_SCRATCH_BYTES ((size_t)8 << 20)

static inline tqc_ctx *tqc(tq_backend *be) { return (tqc_ctx *)be->ctx; }

/* A plan-cache miss (cuDNN's get_plan, cuBLASLt's get_lplan) while a capture is open: an error,
 * and not remembered (planning may allocate, which a capture refuses; the same op uncaptured
 * may plan it). 0 when no capture is open. */
static inline int tqc_miss_while_capturing(tq_backend *be, const char *nm) {
    if (!tqc(be)->capturing) return 0;
    tq_backend_seterr(be, "%s: no plan for this shape before the capture (run the op once uncaptured first)", nm);
    return TQ_EDEVICE;
}

/* Sets be->err and returns nonzero when `e` is an error. */
int tqc_cuda_fail(tq_backend *be, cudaError_t e, const char *what, const char *file, int line);
#define TQC_CHECK(be, call)                                                                    \
    do {                                                                                       \
        cudaError_t tqc_e_ = (call);                                                           \
        if (tqc_e_ != cudaSuccess) {                                                           \
            tqc_cuda_fail((be), tqc_e_, #call, __FILE__, __LINE__);                            \
            return TQ_EDEVICE;                                                                 \
        }                                                                                      \
    } while (0)
#define TQC_LAUNCH_CHECK(be) TQC_CHECK(be, cudaGetLastError())

/* 1-D launch geometry for n elements (grid-stride loops inside the kernels). */
static inline unsigned tqc_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 32u) b = 65535u * 32u;
    return b ? (unsigned)b : 1u;
}

/* ---- convolution: cuda_conv.c ---- */
int tqc_conv_init(tq_backend *);               /* at backend creation; after cudnn handle */
void tqc_conv_destroy(tq_backend *);           /* frees every cached plan */
size_t tqc_conv_ws(tq_backend *, const tq_conv_desc *, tq_dtype dt);
int tqc_conv_fwd(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *y, const void *x,
                 const void *w, const float *bias, void *ws, size_t ws_bytes);
int tqc_conv_bwd_data(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *dx, float beta,
                      const void *dy, const void *w, void *ws, size_t ws_bytes);
int tqc_conv_bwd_filter(tq_backend *, const tq_conv_desc *, tq_dtype dt, float *dw, float *db,
                        const void *x, const void *dy, void *ws, size_t ws_bytes);

/* ---- linear: cuda_linear.c ---- */
int tqc_linear_init(tq_backend *);
void tqc_linear_destroy(tq_backend *);
size_t tqc_linear_ws(tq_backend *, int n, int in, int out, tq_dtype dt);
int tqc_linear_fwd(tq_backend *, int n, int in, int out, tq_dtype dt, void *y, const void *x,
                   const void *w, const float *bias, void *ws, size_t ws_bytes);
int tqc_linear_bwd_data(tq_backend *, int n, int in, int out, tq_dtype dt, void *dx, float beta,
                        const void *dy, const void *w, void *ws, size_t ws_bytes);
int tqc_linear_bwd_filter(tq_backend *, int n, int in, int out, tq_dtype dt, float *dw,
                          float *db, const void *x, const void *dy, void *ws, size_t ws_bytes);

/* ---- our kernels: cuda_*.cu ---- */
int tqc_bn_fwd_train(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x,
                     const float *gamma, const float *beta, float *save_mean, float *save_invstd,
                     float *run_mean, float *run_var, float momentum, float eps, const void *res,
                     int relu);
int tqc_bn_norm(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x, const void *res,
                const float *gamma, const float *beta, const float *mean, const float *invstd,
                int relu);
int tqc_bn_fwd_infer(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x,
                     const float *gamma, const float *beta, const float *run_mean,
                     const float *run_var, float eps, const void *res, int relu);
int tqc_bn_bwd(tq_backend *, tq_shape, tq_dtype dt, void *dx, float beta_dx, float *dgamma,
               float *dbeta, const void *dy, const void *x, const float *gamma,
               const float *save_mean, const float *save_invstd, const void *relu_y,
               void *dres, float beta_dres);
int tqc_relu_fwd(tq_backend *, size_t n, tq_dtype dt, void *y, const void *x);
int tqc_relu_bwd(tq_backend *, size_t n, tq_dtype dt, void *dx, float beta, const void *dy,
                 const void *y);
int tqc_add_fwd(tq_backend *, size_t n, tq_dtype dt, void *y, const void *a, const void *b);
int tqc_accumulate(tq_backend *, size_t n, tq_dtype dt, void *dst, float beta, const void *src);
int tqc_maxpool_fwd(tq_backend *, tq_shape x, tq_dtype dt, void *y, const void *xp, int relu);
int tqc_maxpool_bwd(tq_backend *, tq_shape x, tq_dtype dt, void *dx, float beta, const void *dy,
                    const void *xp, int relu);
int tqc_avgpool_fwd(tq_backend *, tq_shape x, tq_dtype dt, void *y, const void *xp);
int tqc_avgpool_bwd(tq_backend *, tq_shape x, tq_dtype dt, void *dx, float beta, const void *dy);
int tqc_softmax_ce(tq_backend *, int n, int classes, tq_dtype dt, void *dlogits,
                   const void *logits, const int32_t *labels, float grad_scale, float *out);
int tqc_softmax_ce_eval(tq_backend *, int n, int classes, tq_dtype dt, const void *logits,
                        const int32_t *labels, float *out);
int tqc_cast(tq_backend *, size_t n, tq_dtype dst_dt, void *dst, tq_dtype src_dt, const void *src);
int tqc_unscale_check(tq_backend *, size_t n, float *g, float inv_scale, float *found_inf);
int tqc_sgd_step(tq_backend *, size_t n, float *w, const float *g, float *buf, float lr,
                 float momentum, float wd, int nesterov, const float *skip, void *wlow,
                 tq_dtype wdt);
int tqc_adamw_step(tq_backend *, size_t n, float *w, const float *g, float *m, float *v, float lr,
                   float b1, float b2, float eps, float wd, float bc1, float bc2, const float *skip,
                   void *wlow, tq_dtype wdt);
/* the step on the device (backend.h): cuda_loss.cu, cuda_opt.cu */
int tqc_softmax_ce_dyn(tq_backend *, int n, int classes, tq_dtype dt, void *dlogits,
                       const void *logits, const int32_t *labels, const tq_dstep_state *st,
                       int accum, float *out);
int tqc_unscale_check_dyn(tq_backend *, size_t n, float *g, const tq_dstep_state *st,
                          float *found_inf);
int tqc_sgd_step_dyn(tq_backend *, size_t n, float *w, const float *g, float *buf,
                     const tq_dstep_in *in, float momentum, float wd, int nesterov,
                     const float *skip, void *wlow, tq_dtype wdt);
int tqc_adamw_step_dyn(tq_backend *, size_t n, float *w, const float *g, float *m, float *v,
                       const tq_dstep_in *in, const tq_dstep_state *st, float b1, float b2,
                       float eps, float wd, const float *skip, void *wlow, tq_dtype wdt);
int tqc_step_end(tq_backend *, tq_dstep_state *st, const float *found_inf, int fp16, float growth,
                 float backoff, int interval);
int tqc_load_batch(tq_backend *, int n, int h, int w, int c, tq_dtype dt, void *x,
                   int32_t *labels, const uint8_t *images, const uint8_t *lab, const int32_t *idx,
                   const tq_aug *aug, int pad, const float *mean, const float *inv_std);
/* bias gradient helper for conv/linear: db[k] += Σ_rows dy[row][k] (dy of dtype dt, rows×k) */
int tqc_bias_grad(tq_backend *, size_t rows, int k, tq_dtype dt, float *db, const void *dy);
/* dst (f32) += src (dtype src_dt), n elements: conv/linear weight gradients computed in dt */
int tqc_add_to_f32(tq_backend *, size_t n, float *dst, tq_dtype src_dt, const void *src);
/* y[row][k] += bias[k] in dtype dt (conv forward's bias when cuDNN's plan does not fuse it) */
int tqc_bias_add(tq_backend *, size_t rows, int k, tq_dtype dt, void *y, const float *bias);

#ifdef __cplusplus
}
#endif
#endif
