/* cuda_desc.h — the descriptor builders of the CUDA backend's convolutions (cuDNN graph API,
 * cuda_conv.c) and GEMMs (cuBLASLt, cuda_linear.c), exposed for tests/unit/test_cuda_desc.c.
 *
 * Contract
 * - Nothing here needs a GPU: cuDNN tensor, convolution, convolution-operation and (without a
 *   handle) operation-graph descriptors, and cuBLASLt matmul/layout descriptors, create and
 *   finalize on a machine without one. Heuristics, plans and execution need the device and stay
 *   inside cuda_conv.c / cuda_linear.c.
 * - Layout. cuDNN always takes DIMENSIONS in (N, C, H, W) order; the memory order is in the
 *   STRIDES. Activations are NHWC: x dims (N, C, H, W), strides (HWC, 1, WC, C); y likewise
 *   with (N, K, P, Q). Conv weights are KRSC ([k][r][s][c]): dims (K, C, R, S), strides
 *   (RSC, 1, SC, C). tqc_conv_geom_of computes exactly these.
 * - Builders return the library status (cudnnStatus_t / cublasStatus_t as int: 0 = success).
 *   On failure they write one line into err[errlen] — op, dtype, the shapes (NHWC / KRSC order,
 *   as the rest of trainq prints them), the status name, the failing call's text, file:line and
 *   cuDNN's own last-error detail — and free whatever they created (the out struct is zeroed).
 * - Ownership: a successful build owns its descriptors until tqc_conv_descs_free /
 *   tqc_lin_descs_free (both accept a zeroed or partially built struct). Any thread; no globals.
 */
#ifndef TQ_CUDA_DESC_H
#define TQ_CUDA_DESC_H

#include <stddef.h>
#include <stdint.h>
#include <cudnn.h>
#include <cublasLt.h>
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuda_lt_load.c: cuBLASLt is loaded on its first use, not linked (see there). 0, or -1 with a
 * reason that names the library in why[n]. */
int tqc_lt_load(char *why, size_t n);

/* ---- convolution (cuda_conv.c) ---- */

enum { TQC_CONV_FWD = 0, TQC_CONV_BWD_DATA = 1, TQC_CONV_BWD_FILTER = 2 };

/* Variant-pack unique ids of the three tensors of every convolution op. */
enum { TQC_UID_X = 1,    /* x (fwd, bwd_filter) or dx (bwd_data) */
       TQC_UID_W = 2,    /* w (fwd, bwd_data) or dw (bwd_filter) */
       TQC_UID_Y = 3 };  /* y (fwd) or dy (bwd_data, bwd_filter) */

/* Byte alignment promised to cuDNN for every data pointer (checked before each execution). */
#define TQC_CONV_ALIGN 16

typedef struct {
    int64_t xdim[4], xstr[4];      /* (N, C, H, W), NHWC strides */
    int64_t wdim[4], wstr[4];      /* (K, C, R, S), KRSC strides */
    int64_t ydim[4], ystr[4];      /* (N, K, P, Q), NHWC strides */
    int64_t pad[2], stride[2], dil[2];
} tqc_conv_geom;

/* 0, or -1 when the descriptor is not a valid convolution (the CPU backend's checks). */
int tqc_conv_geom_of(const tq_conv_desc *d, tqc_conv_geom *g);

typedef struct {
    cudnnBackendDescriptor_t t[3];     /* tensors, indexed by uid − 1 (x, w, y) */
    cudnnBackendDescriptor_t conv;     /* CONVOLUTION descriptor */
    cudnnBackendDescriptor_t op;       /* OPERATION_CONVOLUTION_{FORWARD,BACKWARD_DATA,BACKWARD_FILTER} */
    cudnnBackendDescriptor_t graph;    /* OPERATIONGRAPH (tqc_conv_build_graph) */
} tqc_conv_descs;

cudnnDataType_t tqc_dnn_dtype(tq_dtype dt);
/* Whether an engine config with numerical notes `num` and behavior notes `beh` (bit masks,
 * 1 << note) may run a `dt` convolution: never a down-converting one, nor a tensor-core one in
 * f32 (that is TF32) unless `tf32`; in the strict pass (`strict`) no reduced-precision
 * reduction and no runtime compilation; with `deterministic`, in either pass, no engine cuDNN
 * notes as nondeterministic (atomics: the same inputs would not give the same bits). */
int tqc_conv_cfg_allowed(unsigned num, unsigned beh, tq_dtype dt, int strict, int deterministic,
                         int tf32);
const char *tqc_conv_kind_name(int kind);          /* "conv_fwd", "conv_bwd_data", ... */
/* the backend's operation table (cuda_backend.c), for checks that need no device */
const tq_backend_i *tqc_backend_iface(void);

/* Tensors (all three in dtype dt), the convolution descriptor (f32 compute, cross-correlation)
 * and the operation of `kind` with the given alpha/beta. */
int tqc_conv_build_op(int kind, const tqc_conv_geom *g, tq_dtype dt, float alpha, float beta,
                      tqc_conv_descs *o, char *err, size_t errlen);
/* The one-op graph on o->op. handle may be NULL (tests): the graph then finalizes without it;
 * the backend passes its handle so that heuristics and plans know the device. */
int tqc_conv_build_graph(tqc_conv_descs *o, cudnnHandle_t handle, int kind,
                         const tqc_conv_geom *g, tq_dtype dt, char *err, size_t errlen);
void tqc_conv_descs_free(tqc_conv_descs *o);

/* One line "<what>: <STATUS> from <call> at <file>:<line> [<cuDNN detail>]" into buf. */
void tqc_dnn_msg(char *buf, size_t n, int status, const char *call, const char *file, int line,
                 const char *what);

/* ---- linear (cuda_linear.c) ---- */

enum { TQC_LIN_FWD = 0, TQC_LIN_BWD_DATA = 1, TQC_LIN_BWD_FILTER = 2 };

/* Row-major data through column-major cuBLASLt (a row-major M[r][c] is the column-major
 * M^T, c × r, ld c), no ORDER_ROW layouts:
 *   fwd         y^T[out×n]  = op_T(w: in×out, ld in) · x^T[in×n]           m=out k=in
 *   bwd_data    dx^T[in×n]  = (w: in×out, ld in) · dy^T[out×n]             m=in  k=out
 *   bwd_filter  dw^T[in×out]= x^T[in×n] · op_T(dy^T: out×n, ld out)        m=in  k=n
 * A, B and (except bwd_filter in f32) C = D are in dt; bwd_filter's D is f32 for dt = f32 (dw
 * accumulated in place with beta 1) and dt otherwise (a temporary in the workspace). */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;    /* C and D share one layout */
    uint64_t m, n, k;
    int transa, transb;                /* cublasOperation_t */
    int epi_bias;                      /* fwd: bias through CUBLASLT_EPILOGUE_BIAS (in dt) */
    cublasComputeType_t compute;       /* tqc_lin_compute_type(dt, tf32) */
    cudaDataType_t ab_type, cd_type;
} tqc_lin_descs;

cudaDataType_t tqc_lt_dtype(tq_dtype dt);
/* The GEMMs' compute type: CUBLAS_COMPUTE_32F_FAST_TF32 for f32 data when `tf32` (spec tf32
 * true: PyTorch's torch.backends.cuda.matmul.allow_tf32), CUBLAS_COMPUTE_32F otherwise (f32
 * exact; f16/bf16 accumulate in f32 either way). */
cublasComputeType_t tqc_lin_compute_type(tq_dtype dt, int tf32);
const char *tqc_lin_kind_name(int kind);           /* "linear_fwd", ... */
int tqc_lin_build_desc(int kind, int n, int in, int out, tq_dtype dt, int epi_bias, int tf32,
                       tqc_lin_descs *o, char *err, size_t errlen);
void tqc_lin_descs_free(tqc_lin_descs *o);

#ifdef __cplusplus
}
#endif
#endif
